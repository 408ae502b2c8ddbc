"""The ONNX backend test suite over ``geode.onnx_backend`` (the full pipeline).

``onnx.backend.test.BackendTest`` generates one unittest case per ONNX test: the node
tests (built in memory by onnx 1.23), the simple, pytorch-converted and
pytorch-operator model tests, and the nine bundled light zoo models (the ``real``
category whose models ship with onnx; downloadable real models are excluded). Every
case compiles its model with geode's default options: fusion and AI Core kernels on.

Exclusions and tolerance overrides live in one place, ``geode/onnx_conformance.py``
(``EXCLUSIONS``, ``TOLERANCES``), each with its reason; the conformance report
(``docs/onnx_conformance.md``, ``python -m geode.onnx_conformance``) reads the same lists.

The module is marked slow (a few minutes with a warm kernel cache, much longer cold).
Two guards keep it honest: enough node cases must be loaded and not excluded, and when
the whole module runs, enough of them must actually have been compiled and run.
"""

from __future__ import annotations

import tempfile
import threading
import warnings

import numpy as np
import onnx.backend.test
import pytest
from onnx.backend.test.loader import load_model_tests

from geode import onnx_conformance as conformance
from geode.onnx_backend import GeodeBackend

pytestmark = pytest.mark.slow

_prepared: dict[str, int] = {}
_lock = threading.Lock()


class CountingBackend(GeodeBackend):
    """geode's backend, counting the models it prepares."""

    @classmethod
    def prepare(cls, model, device="CPU", **kwargs):  # type: ignore[override]
        rep = super().prepare(model, device, **kwargs)
        with _lock:
            _prepared["total"] = _prepared.get("total", 0) + 1
        return rep


def _downloadable_real_models() -> list[str]:
    """Names of the real-model tests that would download their model."""
    return [t.name for t in load_model_tests(kind="real") if not conformance.is_light(t)]


_test_kwargs = {
    name: {"rtol": rtol, "atol": atol} for name, (rtol, atol, _) in conformance.TOLERANCES.items()
}
with warnings.catch_warnings(), np.errstate(all="ignore"):
    warnings.simplefilter("ignore")  # onnx's node-case generators warn about their own casts
    backend_test = onnx.backend.test.BackendTest(
        CountingBackend, __name__, test_kwargs=_test_kwargs
    )
for _pattern, _reason in conformance.EXCLUSIONS:
    backend_test.exclude(_pattern)
for _name in _downloadable_real_models():
    backend_test.exclude(rf"^{_name}_")

_CASES = backend_test.test_cases
globals().update(_CASES)


def _runnable(category: str) -> list[str]:
    """Names of the cases of one category that are neither excluded nor for another device."""
    case = _CASES[f"OnnxBackend{category}Test"]
    names = [n for n in dir(case) if n.startswith("test_")]
    return [n for n in names if not getattr(getattr(case, n), "__unittest_skip__", False)]


@pytest.fixture(scope="module", autouse=True)
def _private_onnx_home():
    """The light-model tests write their inputs under ONNX_HOME: keep that out of $HOME."""
    with tempfile.TemporaryDirectory() as home, pytest.MonkeyPatch.context() as mp:
        mp.setenv("ONNX_HOME", home)
        mp.delenv("ONNX_MODELS", raising=False)
        yield


def test_enough_node_cases_are_loaded() -> None:
    """onnx builds node tests in memory: a broken loader must not pass by running nothing."""
    runnable = _runnable("NodeModel")
    assert len(runnable) >= conformance.MIN_NODE_CASES_RUN, (
        f"only {len(runnable)} node cases would run (minimum {conformance.MIN_NODE_CASES_RUN})"
    )


def test_light_models_are_all_loaded() -> None:
    """The nine bundled light models all run (none excluded)."""
    names = {n.removesuffix("_cpu") for n in _runnable("RealModel")}
    assert names == set(conformance.LIGHT_MODELS), names


def test_zz_cases_were_executed(request: pytest.FixtureRequest) -> None:
    """After a full run of this module, at least the minimum number of models went
    through prepare() (defined last, so it runs after the generated cases)."""
    node_case = _CASES["OnnxBackendNodeModelTest"]
    all_node = {n for n in dir(node_case) if n.startswith("test_")}
    selected = {i.name for i in request.session.items if "OnnxBackendNodeModelTest" in i.nodeid}
    if not all_node <= selected:
        pytest.skip("only part of the node suite was selected")
    done = _prepared.get("total", 0)
    assert done >= conformance.MIN_NODE_CASES_RUN, (
        f"only {done} models were compiled (minimum {conformance.MIN_NODE_CASES_RUN})"
    )


def test_backend_devices() -> None:
    """Only the CPU is a geode device."""
    assert GeodeBackend.supports_device("CPU")
    assert not GeodeBackend.supports_device("CUDA")
