"""geode.benchmark: interleaved rounds, paired ratios, accuracy, tables and the step profile.

Timing is tested with a stand-in clock (``benchmark._seconds`` patched to return set
durations), so the ratios are exact and the tests do not depend on the machine's load.
"""

from __future__ import annotations

import importlib.util
import math
import os

import numpy as np
import pytest
from onnx import TensorProto, helper

import geode
from geode import benchmark, ops

HAVE_ORT = importlib.util.find_spec("onnxruntime") is not None


def fake_clock(monkeypatch: pytest.MonkeyPatch, durations: dict) -> list:
    """Make every timed call of ``fn`` take ``durations[fn]`` seconds (a number, or a list
    consumed call by call); returns the log of the functions called, in order."""
    log: list = []

    def seconds(fn):  # noqa: ANN001, ANN202
        fn()
        log.append(fn)
        d = durations[fn]
        return d.pop(0) if isinstance(d, list) else d

    monkeypatch.setattr(benchmark, "_seconds", seconds)
    monkeypatch.setattr(benchmark.time, "sleep", lambda s: None)
    return log


def g() -> dict:
    return {"y": np.ones(3)}


def o() -> dict:
    return {"y": np.ones(3)}


# -- accuracy ---------------------------------------------------------------------------------
def test_max_rel_error_is_relative_to_the_reference_scale():
    want = {"a": np.array([100.0, -200.0, 0.0]), "b": np.array([1.0, 2.0])}
    got = {"a": np.array([100.0, -199.0, 0.5]), "b": np.array([1.0, 2.0])}
    assert benchmark.max_rel_error(got, want) == pytest.approx(1.0 / 200.0)
    assert benchmark.max_rel_error(want, want) == 0.0


def test_max_rel_error_edge_cases():
    z = np.zeros(4, np.float32)
    assert benchmark.max_rel_error({"y": z + 1e-3}, {"y": z}) == pytest.approx(1e-3)  # absolute
    assert benchmark.max_rel_error({"y": np.zeros(3)}, {"y": np.zeros(4)}) == math.inf
    nan = np.array([np.nan, 1.0])
    assert benchmark.max_rel_error({"y": nan}, {"y": nan}) == 0.0  # NaN where ORT has NaN
    assert benchmark.max_rel_error({"y": np.array([0.0, 1.0])}, {"y": nan}) == math.inf
    assert benchmark.max_rel_error({"y": np.array([1, 5])}, {"y": np.array([1, 4])}) == 0.25
    assert benchmark.max_rel_error({}, {"y": np.ones(2)}) == 0.0  # only outputs both have
    assert benchmark.max_rel_error({"y": np.ones(0)}, {"y": np.ones(0)}) == 0.0


def test_quartiles_and_geomean():
    assert benchmark.quartiles([1.0, 2.0, 3.0, 4.0, 5.0]) == (2.0, 3.0, 4.0)
    assert benchmark.geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert math.isnan(benchmark.geomean([]))


# -- timing -----------------------------------------------------------------------------------
def test_interleave_alternates_blocks_sized_by_the_warm_up(monkeypatch):
    """Warm-up calls set each block's size (about block_s seconds); then each round runs a
    block of geode's calls, then onnxruntime's, and records each block's median."""
    log = fake_clock(monkeypatch, {g: 0.01, o: [0.05, 0.05] + [0.04, 0.06] * 3})
    ticks = []
    out = benchmark.interleave(
        {"geode": g, "ort": o}, rounds=3, warmup=2, block_s=0.1, on_round=lambda: ticks.append(1)
    )
    # blocks: geode 0.1 / 0.01 = 10 calls, ort 0.1 / 0.05 = 2 calls (median of 0.04, 0.06)
    assert out == {"geode": [0.01] * 3, "ort": [0.05] * 3}
    names = ["g" if f is g else "o" for f in log]
    assert names == ["g", "g", "o", "o"] + (["g"] * 10 + ["o"] * 2) * 3
    assert len(ticks) == 3


def test_interleave_makes_at_least_one_call_per_block_and_warm_up(monkeypatch):
    log = fake_clock(monkeypatch, {g: 5.0})
    assert benchmark.interleave({"geode": g}, rounds=2, warmup=0) == {"geode": [5.0, 5.0]}
    assert len(log) == 3  # one warm-up call (its time sizes the block), one call per round
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        benchmark.interleave({"geode": g}, rounds=0)


def test_compare_pairs_the_ratios_per_round(monkeypatch):
    """The ratio is the median of per-round ratios, not the ratio of medians."""
    fake_clock(
        monkeypatch,
        {g: [1.0, 2.0, 2.0, 3.0, 10.0], o: [1.0, 1.0, 1.0, 3.0, 2.0]},
    )
    res = benchmark.compare("m", "small", g, o, rounds=4, warmup=1, block_s=0.0)
    # rounds: geode 2, 2, 3, 10 / ort 1, 1, 3, 2 -> ratios 2, 2, 1, 5
    assert res.geode_s == 2.5 and res.ort_s == 1.5
    assert (res.ratio_q1, res.ratio, res.ratio_q3) == (1.75, 2.0, 2.75)
    assert res.rel_err == 0.0 and res.accurate and res.rounds == 4


def test_compare_without_onnxruntime(monkeypatch):
    fake_clock(monkeypatch, {g: 0.5})
    res = benchmark.compare("m", "small", g, None, rounds=2, warmup=1)
    assert res.geode_s == 0.5
    assert (res.ort_s, res.ratio, res.rel_err) == (None, None, None)
    assert res.accurate


# -- tables -----------------------------------------------------------------------------------
def test_results_table_and_summary():
    rows = [
        benchmark.Result("bert", "small 1x32", 0.002, 0.001, 2.0, 1.5, 2.5, 1e-6, 5),
        benchmark.Result("cnn", "large 8x3", 0.5, 1.0, 0.5, 0.4, 0.6, 2e-3, 5),
        benchmark.Result("lstm", "small", 0.02),
    ]
    table = benchmark.results_table(rows).splitlines()
    assert table[0] == "| model | size | geode ms | ORT ms | geode/ORT (IQR) | max rel err |"
    assert table[2] == "| bert | small 1x32 | 2.000 | 1.000 | 2.00 (1.50-2.50) | 1.0e-06 |"
    assert table[3] == "| cnn | large 8x3 | 500.0 | 1000.0 | 0.50 (0.40-0.60) | 2.0e-03 FAIL |"
    assert table[4] == "| lstm | small | 20.0 | - | - | - |"
    text = benchmark.summary(rows)
    assert "geometric mean (of 2 rows) speedup of geode over onnxruntime" in text
    assert "1.00x (onnxruntime faster)" in text  # sqrt(0.5 * 2)
    assert "accuracy FAIL (max rel err above 0.001): cnn large 8x3" in text
    assert benchmark.summary(rows[2:]) == "no onnxruntime comparison"
    assert benchmark.summary(rows[:1]).startswith("speedup of geode over onnxruntime")
    assert rows[1].as_dict()["rel_err"] == 2e-3


def test_compile_table():
    both = benchmark.CompileTime("bert", 1.0, 0.5, 0.1, 0.05)
    alone = benchmark.CompileTime("cnn", 2.0, 0.01)
    assert both.ratio == pytest.approx(10.0) and alone.ratio is None
    table = benchmark.compile_table([both, alone]).splitlines()
    assert table[2] == "| bert | 1000.0 | 500.0 | 100.0 | 50.0 | 10.0 |"
    assert table[3] == "| cnn | 2000.0 | 10.0 | - | - | - |"
    assert both.as_dict()["ratio"] == pytest.approx(10.0)


# -- the step profile -------------------------------------------------------------------------
def _model():  # noqa: ANN202
    gr = geode.Graph("two")
    x = gr.input("x", ["N", 64])
    h = ops.relu(x * 2.0 + 1.0)
    gr.output(ops.reduce_sum(h, axes=[-1], keepdims=0), ops.sigmoid(h), names=["s", "y"])
    return geode.compile(gr, progress=0)


def test_step_profile_times_every_step_and_leaves_the_model_alone():
    model = _model()
    fns = [s.fn for s in model.plan.steps]
    feeds = {"x": np.random.default_rng(0).standard_normal((256, 64)).astype(np.float32)}
    steps = benchmark.step_profile(model, feeds, runs=3)
    assert sorted(s.name for s in steps) == sorted(s.name for s in model.plan.steps)
    assert [s.seconds for s in steps] == sorted((s.seconds for s in steps), reverse=True)
    assert all(s.seconds >= 0 for s in steps) and steps[0].seconds > 0
    assert [s.fn for s in model.plan.steps] == fns  # the model's own plan is untouched
    table = benchmark.profile_table(steps, top=1, run_s=0.001)
    lines = table.splitlines()
    assert lines[0] == "| step | engine | ms | share | ops |"
    assert lines[2].startswith(f"| {steps[0].name} | {steps[0].engine} | ")
    assert lines[-1].startswith(f"{len(steps)} steps, ") and lines[-1].endswith("of a 1.000 ms run")


def test_profile_table_escapes_chain_labels():
    step = benchmark.StepTime("chain:k", "aicore", "MatMul | Add+Relu", 0.001)
    assert "| MatMul \\| Add+Relu |" in benchmark.profile_table([step], top=5)


# -- onnxruntime ------------------------------------------------------------------------------
@pytest.mark.skipif(not HAVE_ORT, reason="onnxruntime is not installed")
def _relu_model() -> bytes:
    """A one-Relu ONNX model over a float32 [2], serialized."""
    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph(
        [node],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_ort_session_uses_the_thread_count_and_takes_its_own_inputs():
    sess = benchmark.ort_session(_relu_model(), threads=1)
    opts = sess.get_session_options()
    assert (opts.intra_op_num_threads, opts.inter_op_num_threads) == (1, 1)
    run = benchmark.ort_runner(sess, {"x": np.array([-1.0, 2.0], np.float32), "extra": 0})
    np.testing.assert_array_equal(run()["y"], [0.0, 2.0])


def _relu_file(tmp_path) -> str:
    path = tmp_path / "relu.onnx"
    path.write_bytes(_relu_model())
    return str(path)


@pytest.mark.skipif(not HAVE_ORT, reason="onnxruntime is not installed")
def test_onnxruntime_in_its_own_process_answers_and_times_its_blocks(tmp_path):
    """The worker's session gives the outputs a session here gives, times its first call
    and its blocks, and interleave asks it for its blocks; a request it cannot serve is a
    geode error and the worker goes on; close stops it."""
    from geode.bench_isolated import IsolatedOrt
    from geode.errors import GeodeError

    with IsolatedOrt(_relu_file(tmp_path), threads=1) as ort:
        assert ort.session_s > 0
        run = ort.runner({"x": np.array([-1.0, 2.0], np.float32), "extra": 0})
        assert run.first_s > 0
        np.testing.assert_array_equal(run()["y"], [0.0, 2.0])
        assert 0 < run.block(5) < 1
        times = benchmark.interleave({"ort": run}, rounds=2, warmup=1, block_s=0.001)
        assert len(times["ort"]) == 2 and all(t > 0 for t in times["ort"])
        with pytest.raises(GeodeError, match="onnxruntime's worker process: .*x"):
            ort.runner({"x": np.zeros(3, np.float64)})  # wrong shape and dtype
        np.testing.assert_array_equal(run()["y"], [0.0, 2.0])
        proc = ort._proc
    assert not proc.is_alive()


@pytest.mark.skipif(not HAVE_ORT, reason="onnxruntime is not installed")
def test_onnxruntime_in_its_own_process_reports_a_bad_model(tmp_path):
    from geode.bench_isolated import IsolatedOrt
    from geode.errors import GeodeError

    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(GeodeError, match="onnxruntime's worker process"):
        IsolatedOrt(str(bad), threads=1)


class _FakeProcess:
    """A clock and a process's CPU time: the process uses ``busy`` of a core until
    ``until`` seconds, then nothing."""

    def __init__(self, busy: float, until: float):
        self.now, self.busy, self.until = 0.0, busy, until

    def sleep(self, s: float) -> None:
        self.now += s

    def clock(self) -> float:
        return self.now

    def cpu(self) -> float:
        return self.busy * min(self.now, self.until)


@pytest.mark.parametrize(
    ("busy", "until", "low", "high"),
    [
        (0.0, 0.0, 0.02, 0.0201),  # quiet from the start: the windows in a row, no more
        (1.0, 0.1, 0.12, 0.1201),  # a spinning thread: until it stops, then the windows
        (0.5, 0.3, 0.32, 0.3201),  # half a core (other processes' share) is not quiet
        (0.05, 1.0, 0.02, 0.0201),  # a twentieth of a core is
        (1.0, 9.0, 0.5, 0.5051),  # never quiet: the longest wait
    ],
)
def test_wait_quiet_waits_for_a_spinning_worker(busy, until, low, high):
    from geode.bench_isolated import QUIET_MAX_S, wait_quiet

    p = _FakeProcess(busy, until)
    waited = wait_quiet(p.cpu, p.clock, p.sleep, window_s=0.005, share=0.1, windows=4)
    assert low - 1e-9 <= waited <= high, waited
    assert QUIET_MAX_S == 0.5


def test_wait_quiet_gives_up_where_cpu_time_cannot_be_read():
    from geode.bench_isolated import process_cpu_s, wait_quiet

    p = _FakeProcess(1.0, 9.0)
    assert wait_quiet(lambda: None, p.clock, p.sleep) == 0.0
    assert process_cpu_s(-1) is None
    own = process_cpu_s(os.getpid())
    if own is not None:  # Linux
        assert own > 0
