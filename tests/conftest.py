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
"""

import os
import sys

os.environ.setdefault("GEODE_MODEL_CACHE", "0")

_HERE = os.path.dirname(os.path.abspath(__file__))
for _sub in ("", "compiler", "codegen", "runtime", "costmodel", "e2e"):
    _path = os.path.join(_HERE, _sub) if _sub else _HERE
    if _path not in sys.path:
        sys.path.insert(0, _path)
