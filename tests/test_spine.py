"""The spine (geode/spine.py): the compile stages in order, run by Session.compile."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import geode
from geode import config, examples, spine
from geode.codegen import driver
from geode.compiler.ir import Graph
from geode.debug import Dumper
from geode.runtime.var_manager import VarManagerPool


def test_the_stages_in_order() -> None:
    assert [name for name, _ in spine.STAGES] == [
        "verify",
        "infer_shapes",
        "graph_passes",
        "place",
        "partition",
        "fuse",
        "lower",
        "schedule",
        "emit",
        "bind",
        "engines",
        "plan",
    ]
    for name, fn in spine.STAGES:
        assert fn.__name__ == name and fn.__doc__, name


def _compilation(g: Graph, **options: object) -> spine.Compilation:
    opts = config.current(**options)
    vm = VarManagerPool.instance().get(10_000 + id(g) % 1000)
    return spine.Compilation(g.copy(), opts, Dumper(g.name, 0, None), vm, f"spine:{g.name}")


def test_compile_graph_runs_every_stage_and_times_it() -> None:
    g = examples.rmsnorm().graph
    c = spine.compile_graph(_compilation(g))
    for name, _ in spine.STAGES:
        assert c.timings[name] >= 0.0, name
    assert c.timings["total"] >= c.timings["codegen"] + c.timings["passes"]
    assert c.placement is not None and c.placement.partitions
    assert c.fusion is not None and c.fusion.groups
    (job,) = [j for j in c.work if isinstance(j, driver.KernelJob)]
    assert job.lowered is not None and job.schedule is not None and job.native is not None
    assert job.interface is not None and job.interface.n_inputs == len(job.lowered.inputs)
    assert [u.engine for u in c.units].count("aicore") == 1
    assert all(u.step is not None for u in c.units)
    assert c.plan is not None and len(c.plan.steps) == len(c.units)


def test_fusion_off_runs_every_node_on_its_own() -> None:
    g = examples.rmsnorm().graph
    c = spine.compile_graph(_compilation(g, fusion=False))
    assert c.fusion is None and c.fusion_text.startswith("fusion: off")
    assert not c.jobs
    assert {u.engine for u in c.units} <= {"aicpu", "host"}
    assert len(c.units) == len(c.graph.nodes)


def test_a_failing_codegen_stage_falls_back_to_aicpu(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(job: driver.KernelJob, *_: object) -> None:
        raise RuntimeError("planted schedule failure")

    monkeypatch.setattr(driver, "schedule_job", broken)
    ex = examples.rmsnorm()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", driver.CodegenWarning)
        model = geode.compile(ex.graph)
    msgs = [str(w.message) for w in caught if issubclass(w.category, driver.CodegenWarning)]
    assert len(msgs) == 1 and "planted schedule failure" in msgs[0]
    assert {k.engine for k in model.kernels} <= {"aicpu", "host"}
    inputs = ex.make_inputs(np.random.default_rng(0), 3)
    out = model(**inputs)
    for name, want in ex.numpy(**inputs).items():
        np.testing.assert_allclose(out[name], want, rtol=1e-5, atol=1e-5)


def test_a_graph_without_outputs_fails_in_verify() -> None:
    g = Graph("empty")
    g.input("x", [2])
    with pytest.raises(geode.GeodeError, match="has no outputs"):
        spine.compile_graph(_compilation(g))


def test_gemm_epilogues_are_emitted_first_and_the_kernels_keep_their_order(
    tmp_path, monkeypatch
) -> None:
    """The emit stage links the GEMM epilogues first (their entries compile on the
    calling thread while the background threads compile the other kernels); the steps
    stay in the fusion plan's order and the results are the reference's."""
    rng = np.random.default_rng(0)
    g = Graph("pre_dense_post")
    x = g.input("x", ["B", 16], np.float32)
    w = g.constant(rng.standard_normal((16, 24)).astype(np.float32), "w")
    h = g.op("Relu", g.op("Add", g.op("MatMul", g.op("Tanh", x), w), g.constant(np.float32(1))))
    axes = g.constant(np.array([1], np.int64))
    g.output(g.op("Exp", g.op("ReduceSum", h, axes, keepdims=1)), names=["y"])
    emitted, real = [], driver.emit_job

    def emit_job(job, graph, opts, dump):
        emitted.append(job.panel is not None)
        real(job, graph, opts, dump)

    monkeypatch.setattr(driver, "emit_job", emit_job)
    model = geode.compile(g, cache_dir=str(tmp_path), model_cache=False)
    assert emitted == sorted(emitted, reverse=True) and emitted[0] and not emitted[-1]
    kinds = [k.kind for k in model.kernels]
    assert kinds.index("dense") > 0, model.explain()  # the Tanh's kernel still runs first
    feeds = {"x": rng.standard_normal((5, 16)).astype(np.float32)}
    want = geode.compile(g, codegen=False).run(feeds)["y"]
    np.testing.assert_allclose(model.run(feeds)["y"], want, rtol=1e-4, atol=1e-4)


def test_a_compile_leaves_no_expression_memos() -> None:
    """The per-expression memos of ``codegen.ast`` hold the expressions they were asked
    about: a whole compile drops them at its end, so compiling model after model keeps
    none (the slow RSS test in tests/e2e/test_memory_growth.py measures the process)."""
    from geode.codegen import ast as cast

    memos = (cast._preorder_of, cast._vars_of, cast._loads_of)
    cast.free_vars(cast.Bin("+", cast.Var("a"), cast.Var("b")))  # something memoized
    assert cast._vars_of.cache_info().currsize > 0
    ex = examples.layernorm(hidden=48)
    model = geode.compile(ex.graph, model_cache=False)
    assert [m.cache_info().currsize for m in memos] == [0, 0, 0]
    feeds = ex.make_inputs(np.random.default_rng(0), 3)
    for name, want in ex.numpy(**feeds).items():
        np.testing.assert_allclose(model(**feeds)[name], want, rtol=1e-5, atol=1e-5)
