"""Test layout: tests/<package>/ mirrors geode/<package>/ (compiler, codegen, runtime,
costmodel), tests/e2e/ holds whole-pipeline tests, and tests/ itself the tests of
geode's top-level modules plus the shared helpers (opcheck.py, lowering_check.py).

Those helpers, and helpers other test modules import from a test module, are found by
module name: this directory and every test directory are on ``sys.path``.

The model cache (a second compile of a graph loads the first one's model file) is off
for the suite (``GEODE_MODEL_CACHE=0``): tests of the pipeline, which plant failures in
its stages or count what they do, need it to run every time. ``tests/modelfile/``
tests the cache with the option on; every example and PyTorch model there also goes
through a model file and back.

numba is an optional extra (the numba backend's): tests that need it are marked
``@pytest.mark.numba`` (or, where the whole module needs it at import, call
``pytest.importorskip("numba", reason=NEEDS_NUMBA)``) and skip, saying why, without it.
``GEODE_TESTS_HIDE_NUMBA=1`` runs the suite as if numba were not installed;
``GEODE_TESTS_NEED_NUMBA=1`` (set by ``.ci/run``) makes a missing numba an error, so CI
skips none of them.
"""

import importlib.util
import os
import sys

import pytest

os.environ.setdefault("GEODE_MODEL_CACHE", "0")

#: why a test that needs numba skips without it
NEEDS_NUMBA = 'needs numba, an optional extra: pip install "geode[numba]"'
if os.environ.get("GEODE_TESTS_HIDE_NUMBA") == "1":
    sys.modules["numba"] = None  # what `import numba` sees when it is not installed


def _has_numba() -> bool:
    try:
        return importlib.util.find_spec("numba") is not None
    except (ImportError, ValueError):  # hidden: None in sys.modules
        return False


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("GEODE_TESTS_NEED_NUMBA") == "1" and not _has_numba():
        raise pytest.UsageError(
            "GEODE_TESTS_NEED_NUMBA=1 but numba is not installed: the numba tests would "
            'skip (pip install -e ".[dev]" installs it)'
        )


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("numba") is not None and not _has_numba():
        pytest.skip(NEEDS_NUMBA)


_HERE = os.path.dirname(os.path.abspath(__file__))
for _sub in ("", "compiler", "codegen", "runtime", "costmodel", "e2e"):
    _path = os.path.join(_HERE, _sub) if _sub else _HERE
    if _path not in sys.path:
        sys.path.insert(0, _path)
