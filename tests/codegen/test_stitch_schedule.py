"""The stitch schedule (``codegen/stitch_schedule.py``): one pass over the input, row
blocks in parallel with private column partials, the column loop fused and vectorized
for both reductions; the same values as the kernel as lowered, a replayable trace."""

from __future__ import annotations

import numpy as np
import pytest
from test_schedule import check_replay, check_same

import geode
from geode.codegen import ast as A
from geode.codegen.ast_eval import eval_shape, run_kernel
from geode.codegen.autoschedule import override_choices, schedule_group
from geode.codegen.lower import lower_group, make_can_lower
from geode.codegen.schedule import Schedule
from geode.codegen.stitch_schedule import row_and_column_blocks, schedule_stitch
from geode.compiler.fusion.planner import plan_fusion
from geode.compiler.fusion.profit import make_profit
from geode.compiler.partition.placement import place
from geode.compiler.pipeline import run_pipeline
from geode.costmodel.device import default_spec
from geode.errors import ScheduleError


def stitched(shape, split=1, ops=("ReduceSum", "ReduceSum"), keep=0, square=False, out=False):
    gr = geode.Graph("rowcol")
    x = gr.input("x", list(shape))
    v = gr.op("Mul", x, x) if square else x
    rank = len(shape)
    axes = [list(range(split, rank)), list(range(split))]
    outs = [
        gr.op(op, v, gr.constant(np.array(a, np.int64)), keepdims=keep) for op, a in zip(ops, axes)
    ]
    if out:  # the square is an output too
        gr.output(*outs, v, names=["r", "c", "sq"])
    else:
        gr.output(*outs, names=["r", "c"])
    g = gr.copy()
    g.infer_shapes()
    run_pipeline(g)
    g.sort()
    plan = plan_fusion(g, place(g), make_can_lower(g), make_profit(default_spec()))
    (group,) = plan.groups
    assert group.pattern_name() == "stitch_reduce"
    return g, group, lower_group(group, g, "stitch")


def same_values(before: A.Kernel, after: A.Kernel, dims_list: list[dict[str, int]]) -> None:
    """Both kernels give the same outputs (reshaped: the schedule may merge an array's
    dims, ``merge_dims``) on random inputs for every dims binding."""
    for i, dims in enumerate(dims_list):
        rng = np.random.default_rng(i)
        arrays = {
            b.name: rng.standard_normal(eval_shape(b.shape, dims)).astype(b.dtype)
            for b in before.inputs
        }
        views = {b.name: arrays[b.name].reshape(eval_shape(b.shape, dims)) for b in after.inputs}
        want = run_kernel(before, arrays, dims)
        got = run_kernel(after, views, dims)
        for name, w in want.items():
            np.testing.assert_allclose(
                got[name].reshape(w.shape), w, rtol=1e-5, atol=1e-5, err_msg=f"{name} {dims}"
            )


def loops_of(kernel: A.Kernel) -> list[A.For]:
    return [s for s in A.walk_stmts(kernel.body) if isinstance(s, A.For)]


@pytest.mark.parametrize(
    "shape,split,ops,keep,square",
    [
        (("N", 24), 1, ("ReduceSum", "ReduceSum"), 0, False),
        (("N", 24), 1, ("ReduceMean", "ReduceMax"), 1, True),
        (("N", 5, 6), 1, ("ReduceSum", "ReduceMin"), 0, False),
        ((4, "N", 6), 2, ("ReduceMean", "ReduceMean"), 1, True),
    ],
)
def test_default_schedule_is_one_pass(shape, split, ops, keep, square):
    _, group, low = stitched(shape, split, ops, keep, square)
    sch = schedule_group(low, group)
    assert sch.level == "full" and not sch.notes, sch.notes
    loops = loops_of(sch.kernel)
    (par,) = [f for f in loops if f.kind is A.ForKind.PARALLEL]
    blocks = 16 if isinstance(shape[0], str) else min(16, shape[0])
    assert par.extent == A.Const(blocks)  # row blocks (Choices.stitch_partials) cut axis 0
    # one vectorized loop holds both reductions' updates: the input is read once
    both = [
        f
        for f in loops
        if f.kind is A.ForKind.VECTORIZED and sum(isinstance(s, A.Block) for s in f.body) == 2
    ]
    assert len(both) == 1
    rf = [b for b in sch.kernel.temps if b.name.endswith("_rf")]
    assert len(rf) == 1 and rf[0].shape[0] == A.Const(blocks)  # partials by rows
    dims = [{"N": 0}, {"N": 1}, {"N": 3}, {"N": 37}]
    same_values(low.kernel, sch.kernel, dims)
    check_replay(low.kernel, sch)


def test_static_rows_fewer_than_partials_and_serial():
    _, group, low = stitched((5, 8))
    sch = Schedule(low.kernel)
    with override_choices(stitch_partials=16):
        schedule_stitch(sch, group, par=False, partials=16)
    assert not any(f.kind is A.ForKind.PARALLEL for f in loops_of(sch.kernel))
    rf = [b for b in sch.kernel.temps if b.name.endswith("_rf")]
    assert rf[0].shape[0] == A.Const(5)  # one block per row at most
    check_same(low.kernel, sch.kernel, [{}])


def test_several_row_reductions_share_the_column_loop():
    gr = geode.Graph("rows")
    x = gr.input("x", ["N", 24])
    ax = lambda v: gr.constant(np.array(v, np.int64))  # noqa: E731
    gr.output(
        gr.op("ReduceSum", x, ax([1]), keepdims=0),
        gr.op("ReduceMax", x, ax([1]), keepdims=1),
        gr.op("ReduceMean", x, ax([0]), keepdims=0),
        names=["r", "m", "c"],
    )
    g = gr.copy()
    g.infer_shapes()
    run_pipeline(g)
    g.sort()
    plan = plan_fusion(g, place(g), make_can_lower(g), make_profit(default_spec()))
    (group,) = plan.groups
    low = lower_group(group, g, "rows")
    sch = schedule_group(low, group)
    assert sch.level == "full" and not sch.notes, sch.notes
    rows, col = row_and_column_blocks(Schedule(low.kernel), group)
    assert len(rows) == 2
    three = [
        f
        for f in loops_of(sch.kernel)
        if f.kind is A.ForKind.VECTORIZED and sum(isinstance(s, A.Block) for s in f.body) == 3
    ]
    assert len(three) == 1
    same_values(low.kernel, sch.kernel, [{"N": 0}, {"N": 1}, {"N": 40}])
    check_replay(low.kernel, sch)


def test_row_and_column_blocks_and_requirements():
    _, group, low = stitched(("N", 8), ops=("ReduceSum", "ReduceMax"))
    sch = Schedule(low.kernel)
    (row,), col = row_and_column_blocks(sch, group)
    assert sch.get_block(row).body[0].buffer == "r"
    assert "c" in sch.get_block(col).body[0].buffer
    lone = Schedule(A.Kernel("k", [], [], [], [], []))
    with pytest.raises(ScheduleError, match="fewer than two reductions"):
        row_and_column_blocks(lone, group)


@pytest.mark.parametrize(
    "shape,split,joined", [(("N", 24), 1, True), (("B", "N", 5), 2, True), (("N", 4, 6), 1, False)]
)
def test_a_stored_prologue_joins_the_row_blocks(shape, split, joined):
    """``x * x`` also an output: its pass moves into the row blocks, its column loop
    fused with the reductions' (three blocks in one vectorized loop); with several
    column axes ``compute_at`` refuses the fused column index and the pass stays a nest
    of its own (same values, the rest of the schedule unchanged)."""
    _, group, low = stitched(shape, split, square=True, out=True)
    sch = schedule_group(low, group)
    assert sch.level == "full" and not sch.notes, sch.notes
    loops = loops_of(sch.kernel)
    three = [
        f
        for f in loops
        if f.kind is A.ForKind.VECTORIZED and sum(isinstance(s, A.Block) for s in f.body) == 3
    ]
    assert len(three) == (1 if joined else 0)
    assert any(f.kind is A.ForKind.PARALLEL for f in loops)
    same_values(low.kernel, sch.kernel, [{"N": 0, "B": 2}, {"N": 1, "B": 1}, {"N": 19, "B": 3}])
    check_replay(low.kernel, sch)
