"""The one percentile every figure we print uses (status, report, benchmarks).

Linear interpolation between the closest ranks ("type 7", as numpy's and
spreadsheets' default): the median is the usual median, and P never
falls below a lower percentile of the same samples.  The Emacs side
computes it the same way (`magent-store-status--percentile`); a test compares the
two on the same samples.
"""

from __future__ import annotations

from collections.abc import Iterable


def percentile(samples: Iterable[float], p: int) -> float:
    """The P-th percentile (P an integer from 0 to 100) of non-empty SAMPLES."""
    if not isinstance(p, int) or not 0 <= p <= 100:
        raise ValueError(f"a percentile is an integer from 0 to 100, got {p!r}")
    ordered = sorted(samples)
    if not ordered:
        raise ValueError("no samples")
    # Integer arithmetic for the rank: (n - 1) * p / 100 without rounding error.
    low, rest = divmod((len(ordered) - 1) * p, 100)
    if rest == 0:
        return ordered[low]
    return ordered[low] + (ordered[low + 1] - ordered[low]) * rest / 100


def median(samples: Iterable[float]) -> float:
    """The median of non-empty SAMPLES: the 50th percentile."""
    return percentile(samples, 50)
