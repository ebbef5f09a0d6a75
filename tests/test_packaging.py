"""The distributions a user installs: the wheel carries the Emacs Lisp files,
the sdist is a whole project whose tests pass on their own, the metadata is
what PyPI and MELPA expect, and every place that states the version agrees.

The build is real (`python -m build`, sdist then a wheel built from that
sdist), so this needs the package registry for build isolation."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import magent_store

REPO = Path(__file__).resolve().parent.parent
ELISP = sorted(p.name for p in (REPO / "elisp").glob("*.el"))
IN_SDIST = "MAGENT_STORE_TESTING_SDIST"


def test_every_place_that_states_the_version_agrees() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    main = (REPO / "elisp" / "magent-store.el").read_text()
    header = re.search(r"^;; Version: (\S+)$", main, re.M)
    defconst = re.search(r'^\(defconst magent-store-version "([^"]+)"', main, re.M)
    assert header and defconst
    assert {pyproject, magent_store.__version__, header[1], defconst[1]} == {pyproject}


def test_elisp_dir_prints_the_checkouts_elisp_directory() -> None:
    out = subprocess.run([sys.executable, "-m", "magent_store", "elisp-dir"],
                         check=True, capture_output=True, text=True).stdout  # fmt: skip
    assert Path(out.strip()) == REPO / "elisp"


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    if os.environ.get(IN_SDIST):
        pytest.skip("building distributions from inside an unpacked sdist's test run")
    tmp = tmp_path_factory.mktemp("dists")
    # A copy of the tree as it is, so the build leaves nothing in the checkout.
    src = tmp / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis",
        "bench-results", "*.elc"))  # fmt: skip
    out = tmp / "dist"
    subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(src)],
                   check=True, capture_output=True)  # fmt: skip
    (sdist,) = out.glob("magent_store-*.tar.gz")
    (wheel,) = out.glob("magent_store-*.whl")
    yield sdist, wheel


def test_the_wheel_carries_the_elisp_files_the_license_and_the_metadata(
    dists: tuple[Path, Path], tmp_path: Path
) -> None:
    _, wheel = dists
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        (metadata_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = zf.read(metadata_name).decode()
    assert {f"magent_store/elisp/{name}" for name in ELISP} <= names
    assert "magent_store/py.typed" in names
    assert "magent_store/redaction/secret-rules.toml" in names  # redaction's patterns
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "License-Expression: GPL-3.0-or-later" in metadata
    assert "Classifier: License ::" not in metadata  # deprecated next to an SPDX expression
    for line in ("Classifier: Operating System :: POSIX", "Classifier: Programming Language :: Python :: 3",
                 "Author: The magent-store authors", "Project-URL: magent, https://"):  # fmt: skip
        assert line in metadata

    # Installed, `magent-store elisp-dir' names the installed copy of the files.
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site),
                    str(wheel)], check=True)  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(site))
    out = subprocess.run([sys.executable, "-m", "magent_store", "elisp-dir"], env=env,
                         check=True, capture_output=True, text=True).stdout.strip()  # fmt: skip
    assert Path(out) == site / "magent_store" / "elisp"
    assert sorted(p.name for p in Path(out).glob("*.el")) == ELISP


def test_the_sdist_is_the_whole_project_and_its_tests_pass_on_their_own(
    dists: tuple[Path, Path], tmp_path: Path
) -> None:
    sdist, _ = dists
    with tarfile.open(sdist) as tf:
        # Extraction filters came with Python 3.11.4 (Debian 12 has 3.11.2): the
        # sdist is the one just built, so without them it is extracted as is.
        if hasattr(tarfile, "data_filter"):
            tf.extractall(tmp_path, filter="data")
        else:
            tf.extractall(tmp_path)
    (root,) = tmp_path.glob("magent_store-*")
    for needed in ["LICENSE", "README.md", "Makefile", "pyproject.toml", "recipes/magent-store",
                   "tests/conftest.py", "tests/schema6.py", "tests/live/smoke.py", "tests/live/emacs_daemon.py",
                   "bench/demo.py",
                   "tests/elisp/magent-store-tests.el", "tests/elisp/stubs/gptel.el",
                   *(f"elisp/{name}" for name in ELISP),
                   *(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md"))]:  # fmt: skip
        assert (root / needed).is_file(), needed
    assert not list(root.rglob("*.elc")) and not list(root.rglob("__pycache__"))

    # The sdist's own code and tests: the backend the tests start imports
    # the unpacked copy too (PYTHONPATH is inherited).
    # The pinned copies of upstream magent stay where the checkout has them: the
    # sdist's tests against magent's own code run too, never skipped under CI.
    env = dict(os.environ, PYTHONPATH=str(root / "backend"), **{IN_SDIST: "1"})
    env.setdefault("MAGENT_STORE_UPSTREAM", str(REPO.parent / "shared" / "upstream"))
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider"],
                         cwd=root, env=env, capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert re.search(r"\d+ passed", run.stdout)
    probe = subprocess.run([sys.executable, "-c", "import magent_store; print(magent_store.__file__)"],
                           cwd=root, env=env, capture_output=True, text=True, check=True)  # fmt: skip
    assert Path(probe.stdout.strip()).is_relative_to(root)
