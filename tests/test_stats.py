"""One percentile for every figure we print: the backend's status, the
report, the benchmarks and the Emacs status buffer compute it alike."""

from __future__ import annotations

import random
import shutil
import statistics
import subprocess
from pathlib import Path

import orjson
import pytest

from magent_store import report
from magent_store.stats import median, percentile

REPO = Path(__file__).resolve().parent.parent
EMACS = shutil.which("emacs") or "emacs"


def test_percentiles_over_many_samples_land_on_the_right_rank() -> None:
    # 1..101 shuffled: the P-th percentile is exactly P + 1 (rank P of 0..100).
    samples = list(range(1, 102))
    random.Random(7).shuffle(samples)
    assert [percentile(samples, p) for p in (0, 1, 50, 89, 90, 91, 99, 100)] == [1, 2, 51, 90, 91, 92, 100, 101]
    # 1..1000: between two ranks, interpolated.
    thousand = list(range(1, 1001))
    assert percentile(thousand, 90) == pytest.approx(900.1)
    assert percentile(thousand, 99) == pytest.approx(990.01)
    assert median(thousand) == 500.5


def test_median_is_the_usual_median_and_no_higher_percentile_is_below_it() -> None:
    rng = random.Random(11)
    for n in (1, 2, 3, 4, 5, 10, 99, 100, 257):
        samples = [rng.expovariate(1 / 5) for _ in range(n)]
        assert median(samples) == pytest.approx(statistics.median(samples))
        values = [percentile(samples, p) for p in range(101)]
        assert values == sorted(values)
        assert (values[0], values[100]) == (min(samples), max(samples))
    assert (median([4.9, 6.2]), percentile([4.9, 6.2], 99)) == (pytest.approx(5.55), pytest.approx(6.187))


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="no samples"):
        percentile([], 50)
    with pytest.raises(ValueError, match="integer from 0 to 100"):
        percentile([1.0], 0.9)  # type: ignore[arg-type]


def test_the_reports_p90_over_a_hundred_turns() -> None:
    # Turn i lasts i + 1 ms: totals 1..100 ms, so p90 is 90.1 ms and the median 50.5 ms.
    records = []
    for i in range(100):
        records += [{"type": "turn-start", "turn": f"t{i}", "mono": i * 10.0, "t": i * 10.0},
                    {"type": "turn-end", "turn": f"t{i}", "mono": i * 10.0 + (i + 1) / 1000,
                     "t": i * 10.0 + (i + 1) / 1000}]  # fmt: skip
    total = report.summarize(report.build(records))["ordinary"]["phases"]["total"]
    assert total == {"n": 100, "median": pytest.approx(50.5), "p90": pytest.approx(90.1), "max": pytest.approx(100.0)}


def test_emacs_computes_the_same_percentiles() -> None:
    rng = random.Random(3)
    cases = [[rng.uniform(0, 50) for _ in range(n)] for n in (1, 2, 3, 7, 100, 128)]
    ps = (50, 90, 99)
    def call(case: list[float], p: int) -> str:
        numbers = " ".join(repr(x) for x in case)
        return f"(magent-store-status--percentile '({numbers}) {p})"

    forms = " ".join('(princ (format "%S\\n" (list ' + " ".join(call(case, p) for p in ps) + ")))"
                     for case in cases)  # fmt: skip
    out = subprocess.run([EMACS, "--batch", "-Q", "-L", str(REPO / "elisp"), "-l", "magent-store-status",
                          "--eval", f"(progn {forms})"], check=True, capture_output=True, text=True).stdout  # fmt: skip
    lines = [line for line in out.splitlines() if line.startswith("(")]
    assert len(lines) == len(cases)
    for case, line in zip(cases, lines, strict=True):
        emacs = orjson.loads("[" + line.strip("()").replace(" ", ",") + "]")
        assert emacs == [pytest.approx(percentile(case, p), rel=1e-12) for p in ps]
