"""Fuzz runs through the whole pipeline (geode/fuzz/runner.py, driver.py, reproducer.py):
a small run passes, a planted lowering bug is caught, shrunk and written as a
reproducer that reloads, and each kind of outcome is recognised."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

import geode
from geode.codegen import lower
from geode.fuzz import (
    Case,
    Checker,
    DimSpec,
    FuzzConfig,
    InputSpec,
    NodeSpec,
    load_case,
    noise,
    run_fuzz,
)
from geode.fuzz.reproducer import write_reproducer


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One kernel cache for the module (the device spec is calibrated once)."""
    return str(tmp_path_factory.mktemp("fuzz_cache"))


@pytest.fixture(scope="module")
def checker(cache_dir: str) -> Checker:
    with geode.Session(cache_dir=cache_dir, progress="0") as session:
        yield Checker(session)


def _config(tmp_path: Path, cache_dir: str, **kw) -> FuzzConfig:
    return FuzzConfig(isolate=False, cache_dir=cache_dir, out=str(tmp_path / "out"), **kw)


def test_a_small_run_passes(tmp_path, cache_dir):
    report = run_fuzz(_config(tmp_path, cache_dir, n=16, seed=3), log=lambda _: None)
    assert report.checked == 16 and report.failed == 0, report.summary()
    assert report.counts["pass"] >= 12, report.summary()
    assert report.graphs_per_second > 0
    text = report.summary()
    assert "seed 3: 16 graphs" in text and "graphs/s" in text and "passed" in text
    assert not (tmp_path / "out").exists()  # no failure, no reproducer


def test_a_planted_lowering_bug_is_caught_and_shrunk(tmp_path, cache_dir, monkeypatch, checker):
    monkeypatch.setitem(lower._BINARY, "Sub", "+")  # compiled Sub adds
    config = _config(tmp_path, cache_dir, n=8, seed=7, max_shrink=2)
    report = run_fuzz(config, log=lambda _: None)
    assert report.failed >= 1, report.summary()
    shrunk = [f for f in report.failures if f.shrunk is not None]
    assert shrunk and min(f.nodes for f in shrunk) <= 3, report.summary()
    best = min(shrunk, key=lambda f: f.nodes)
    assert any(n.op == "Sub" for n in best.shrunk.nodes), best.shrunk.describe()
    folder = best.path
    for name in ("REPORT.txt", "case.json", "model.onnx"):
        assert (folder / name).is_file(), name
    assert list((folder / "inputs" / "run0").glob("*.npy"))
    assert "Sub(" in (folder / "REPORT.txt").read_text(encoding="utf-8")
    # the reproducer reloads: as a case that fails the same way, and as an ONNX model
    case = load_case(folder)
    assert checker.check(case).kind == best.outcome.kind
    model = onnx.load(str(folder / "model.onnx"))
    onnx.checker.check_model(model)
    feeds = {p.stem: np.load(p) for p in (folder / "inputs" / "run0").glob("*.npy")}
    got = geode.load(str(folder / "model.onnx"), cache_dir=cache_dir).run(feeds)
    assert set(got) == set(case.outputs)
    # without the planted bug every reproducer passes
    monkeypatch.undo()
    for f in report.failures:
        assert checker.check(load_case(f.path)).status == "pass", f.path


def _one_node(op: str, params: dict, dtype: str = "float32", size: int = 3) -> Case:
    x = np.linspace(-2, 2, size).astype(dtype)
    node = NodeSpec(op, ["x"], params, "y")
    return Case(
        0,
        0,
        [DimSpec("N", True, [size])],
        [InputSpec("x", ["N"], dtype)],
        [node],
        ["y"],
        [{"x": x}],
    )


def test_outcomes_pass_rejected_undefined_and_crash(checker, monkeypatch):
    assert checker.check(_one_node("Exp", {})).status == "pass"
    # a Gather index out of range: geode refuses it cleanly, at run time for a symbolic
    # dim (both engines), while building for a static one
    gather = _one_node("Gather", {"axis": 0, "indices": [5]}, size=3)
    assert (checker.check(gather).status, checker.check(gather).stage) == ("rejected", "run")
    gather.dims[0].symbolic = False
    assert (checker.check(gather).status, checker.check(gather).stage) == ("rejected", "build")
    case = _one_node("Cast", {"to": "uint8"})  # negative floats into uint8
    assert checker.check(case).status == "undefined"
    # a crash while compiling is a failure named by its exception
    monkeypatch.setattr(checker.session, "compile", _boom)
    out = checker.check(_one_node("Exp", {}))
    assert out.failed and out.kind == "crash:compile:ZeroDivisionError", out
    assert "ZeroDivisionError" in out.message


def _boom(*args, **kwargs):
    return 1 // 0


def test_a_run_one_engine_refuses_is_a_failure(checker, monkeypatch):
    case = _one_node("Exp", {})
    model_run = geode.runtime.model.CompiledModel.run

    def refuse(self, feeds):
        raise geode.errors.ExecutionError("refused on purpose")

    monkeypatch.setattr(geode.runtime.model.CompiledModel, "run", refuse)
    out = checker.check(case)
    assert out.failed and out.kind == "error-mismatch:compiled-raised:ExecutionError"
    monkeypatch.setattr(geode.runtime.model.CompiledModel, "run", model_run)
    assert checker.check(case).status == "pass"


def test_a_reproducer_of_a_build_crash_still_writes(tmp_path, checker):
    case = _one_node("Exp", {})
    case.outputs = ["nope"]  # a case that cannot build
    out = checker.check(case)
    assert out.status == "invalid"
    folder = write_reproducer(tmp_path, case, out)
    assert (folder / "REPORT.txt").read_text(encoding="utf-8").startswith("geode fuzz failure")
    assert not (folder / "model.onnx").exists()


def test_a_run_refused_by_a_stated_input_constraint_is_counted_not_failed(checker):
    """Geode assumes a sliced symbolic axis is non-empty and says so (an InputError
    naming the constraint) where the reference slices an empty axis: a clean refusal."""
    node = NodeSpec("Slice", ["x"], {"starts": [-2], "ends": [-1], "axes": [1], "steps": [1]}, "y")
    feeds = [{"x": np.zeros((0, 0), np.float32)}, {"x": np.ones((3, 3), np.float32)}]
    case = Case(0, 0, [DimSpec("N", True, [0, 3])], [InputSpec("x", ["N", "N"], "float32")],
                [node], ["y"], feeds)  # fmt: skip
    out = checker.check(case)
    assert (out.status, out.constrained) == ("pass", 1), out
    case.feeds, case.dims[0].sizes = feeds[:1], [0]
    out = checker.check(case)
    assert out.status == "rejected" and "input constraints" in out.message, out


def _product_case(x: np.ndarray) -> Case:
    node = NodeSpec("ReduceProd", ["x"], {"axes": None, "keepdims": 0}, "p")
    inputs = [InputSpec("x", list(x.shape), "float32")]
    return Case(0, 0, [], inputs, [node], ["p"], [{"x": x}])


def test_a_product_whose_order_decides_overflow_is_noise_not_a_failure(checker):
    """6 everywhere but a leading 0: numpy multiplies in order and keeps 0; geode's
    vector lanes overflow to inf except the one holding the 0, and inf * 0 is NaN. ONNX
    leaves the order open (geode.fuzz seed 2024 cases 3993, 6205); a product whose
    partial products stay normal in every order is still compared."""
    x = np.full((128, 128), 6.0, np.float32)
    x[0, 0] = 0.0
    case = _product_case(x)
    values = {"x": x, "p": np.prod(x)}
    assert noise.order_dependent(case, values, "p")
    out = checker.check(case)
    assert (out.status, out.noisy) == ("pass", 1), out  # NaN against 0: not compared
    tame = np.random.default_rng(1).uniform(0.9, 1.1, (16, 16)).astype(np.float32)
    assert not noise.order_dependent(_product_case(tame), {"x": tame}, "p")
    tiny = np.full((64,), 0.01, np.float32)  # 1e-128: below float32's smallest normal
    assert noise.order_dependent(_product_case(tiny), {"x": tiny}, "p")
    assert checker.check(_product_case(tame)).status == "pass"
