"""Features of scheduled kernels (codegen/features.py) and the predictor, group cost and
kernel timer built on them (codegen/costs.py)."""

from __future__ import annotations

import numpy as np
import pytest

import geode
from geode import config, ops
from geode.codegen import ast as A
from geode.codegen.costs import (
    KernelPredictor,
    group_cost,
    kernel_env,
    kernel_timer,
    sol_work,
    vector_bits,
)
from geode.codegen.driver import default_schedule
from geode.codegen.features import FeatureError, kernel_features
from geode.costmodel.device import default_spec
from geode.debug import Dumper
from geode.runtime.var_manager import VarManager
from geode.spine import STAGES, Compilation

SPEC = default_spec()  # L3 8 MiB


def compiled(graph, stop="bind", **options):
    opts = config.current(progress="0", model_cache=False, **options)
    c = Compilation(graph, opts, Dumper(graph.name, 0, None), VarManager("t"), "t")
    for name, stage in STAGES:
        if name == stop:
            break
        stage(c)
    return c


def add_graph(rows, cols, dtype="float32"):
    g = geode.Graph("add")
    x = g.input("x", [rows, cols], dtype)
    y = g.input("y", [rows, cols], dtype)
    g.output(ops.add(x, y), names=["z"])
    return g


def test_elementwise_add_bytes_ops_and_parallel_loop():
    c = compiled(add_graph(1024, 256), stop="emit")
    (job,) = c.jobs
    f = kernel_features(job.schedule.kernel, {}, spec=SPEC, vector_bits=256)
    n = 1024 * 256
    assert f.bytes_read == 2 * n * 4 and f.bytes_written == n * 4
    assert f.cache_bytes == 3 * n * 4 and f.dram_bytes == 0  # 3 MiB fits the 8 MiB L3
    assert f.vec_flops == n and f.scalar_flops == 0 and f.transcendentals == 0
    assert f.lanes == 8 and f.reuse_bytes == 0 and f.strided_bytes == 0
    assert f.parallel_extent > 1 and f.parallel_regions == 1
    big = kernel_features(job.schedule.kernel, {}, spec=default_spec(), vector_bits=512)
    assert big.lanes == 16
    small_l3 = default_spec()
    small_l3.l3_bytes = 1 << 20
    f2 = kernel_features(job.schedule.kernel, {}, spec=small_l3)
    assert f2.dram_bytes == 3 * n * 4 and f2.cache_bytes == 0


def test_transcendentals_and_divisions_counted_once_per_element():
    g = geode.Graph("t")
    x = g.input("x", [64, 512])
    g.output(ops.div(ops.exp(x), ops.add(ops.tanh(x), 2.0)), names=["y"])
    (job,) = compiled(g, stop="emit").jobs
    f = kernel_features(job.schedule.kernel, {}, spec=SPEC)
    n = 64 * 512
    assert f.vec_trans == 2 * n  # exp and tanh
    assert f.vec_div == n and f.vec_flops == n  # the division; the add


def test_row_reduce_rereads_its_row_and_symbolic_dims_need_values():
    g = geode.Graph("softmax")
    x = g.input("x", ["N", 1024])
    g.output(ops.softmax(x, axis=-1), names=["y"])
    (job,) = compiled(g, stop="emit").jobs
    kernel = job.schedule.kernel
    env = kernel_env(job.lowered, {"N": 256})
    assert list(env.values()) == [256]
    f = kernel_features(kernel, env, spec=SPEC)
    assert f.bytes_read == 256 * 1024 * 4 and f.bytes_written == 256 * 1024 * 4
    assert f.reuse_bytes > 0  # later passes read the row again
    assert f.vec_trans == 256 * 1024
    with pytest.raises(FeatureError, match="no value for dims"):
        kernel_features(kernel, {}, spec=SPEC)
    assert list(kernel_env(job.lowered).values()) == [512]  # the nominal size


def test_serial_column_walk_is_strided_and_its_arithmetic_scalar():
    buf_x = A.Buffer("x", "float32", (A.Const(100), A.Const(64)))
    buf_y = A.Buffer("y", "float32", (A.Const(64),))
    i, j = A.Var("i"), A.Var("j")
    body = A.Store("y", (j,), A.Load("y", (j,)) + A.Load("x", (i, j)) * 2.0)
    inner = A.For("i", A.Const(100), [body], A.ForKind.VECTORIZED)
    kernel = A.Kernel("col", [buf_x], [buf_y], [], [A.For("j", A.Const(64), [inner])])
    f = kernel_features(kernel, {}, spec=SPEC)
    assert f.strided_bytes == 100 * 64 * 64  # a cache line per element of x
    assert f.vec_flops == 0 and f.scalar_flops == 2 * 100 * 64  # a gather: scalar
    # y[j] does not move with i: hoisted, read and written once per entry
    assert f.bytes_read == 100 * 64 * 4 and f.bytes_written == 64 * 4
    assert f.loop_entries == 1 + 64 and f.loop_iters == 64 + 64 * 13
    assert f.parallel_extent == 1 and f.parallel_regions == 0


def test_predictor_orders_sizes_and_explains():
    small = compiled(add_graph(64, 64), stop="emit").jobs[0].schedule.kernel
    large = compiled(add_graph(4096, 1024), stop="emit").jobs[0].schedule.kernel
    predict = KernelPredictor(SPEC, bits=256)
    assert 0 < predict(small) < predict(large)
    assert "us =" in predict.explain(large)
    assert predict.features(large).threads == 0
    assert KernelPredictor(SPEC, threads=1, bits=256).features(large).threads == 1
    assert vector_bits() in (128, 256, 512)
    w = sol_work(predict.features(large))
    assert w.bytes_moved == 3 * 4096 * 1024 * 4 and w.parallel


def test_group_cost_scores_groups_and_refuses_what_cannot_lower():
    c = compiled(add_graph(256, 256), stop="lower")
    opts = c.opts
    cost = group_cost(
        c.graph, KernelPredictor(SPEC), lambda lowered, g: default_schedule(lowered, g, opts)
    )
    (group,) = c.fusion.groups
    assert 0 < cost(group) < 1

    def fail(lowered, g):
        raise geode.errors.ScheduleError("split", "add", "no schedule")

    assert group_cost(c.graph, KernelPredictor(SPEC), fail)(group) == float("inf")


def test_kernel_timer_runs_the_step_on_fresh_arrays():
    g = geode.Graph("t")
    x = g.input("x", ["N", 32])
    g.output(ops.sqrt(x), names=["y"])
    c = compiled(g, stop="bind")
    (job,) = c.jobs
    run = kernel_timer(job.lowered, job.interface, {"N": 8})
    (out,) = run()
    assert out.shape == (8, 32) and np.all(out >= np.sqrt(0.5)) and np.all(out < np.sqrt(1.5))
