"""Stitch fusion planning: a row and a column reduction of one input as one group, why
(legality) and whether it pays (the SOL model), and the cases refused."""

import dataclasses

import numpy as np
import pytest
from test_reduce_tree import planned

import geode
from geode.compiler.fusion.groups import Group
from geode.compiler.fusion.planner import always_profitable
from geode.compiler.fusion.profit import (
    group_work,
    make_profit,
    stitch_parallelism_lost,
    stitch_work,
)
from geode.compiler.fusion.stitch import (
    STITCH_PARTIALS,
    StitchMerge,
    is_stitch,
    lowering_order,
    stitch_merge,
)
from geode.costmodel.device import default_spec


def ints(g: geode.Graph, v: list[int]) -> geode.Value:
    return g.constant(np.array(v, np.int64))


def rowcol(
    shape=("N", 64),
    split: int = 1,
    ops=("ReduceSum", "ReduceSum"),
    keep: int = 0,
    prologue: str | None = None,
) -> geode.Graph:
    """Row reduction over the axes from ``split`` on, column reduction over those before."""
    gr = geode.Graph("rowcol")
    x = gr.input("x", list(shape))
    v = x
    if prologue == "square":
        v = gr.op("Mul", x, x)
    elif prologue == "diff":
        v = gr.op("Sub", x, gr.input("y", list(shape)))
    rank = len(shape)
    r = gr.op(ops[0], v, ints(gr, list(range(split, rank))), keepdims=keep)
    c = gr.op(ops[1], v, ints(gr, list(range(split))), keepdims=keep)
    gr.output(r, c, names=["r", "c"])
    return gr


def stitch_decision(plan):
    (d,) = [d for d in plan.decisions if d.rule == "Stitch"]
    return d


@pytest.mark.parametrize("prologue", [None, "square", "diff"])
@pytest.mark.parametrize("keep", [0, 1])
def test_row_and_column_sum_are_one_stitch_group(prologue, keep):
    _, plan = planned(rowcol(prologue=prologue, keep=keep))
    assert len(plan.groups) == 1, plan.describe()
    (g,) = plan.groups
    assert is_stitch(g) and g.pattern_name() == "stitch_reduce"
    assert g.branches == (frozenset({1}), frozenset({0}))
    assert g.axes == frozenset({0, 1})
    d = stitch_decision(plan)
    assert d.taken
    assert "stitch over [N, 64]: rows reduced over [1] and columns over [0]" in d.reason
    assert "saves" in d.reason and "->" in d.reason  # the SOL verdict and predicted costs
    assert "side by side [1] and [0]" in plan.describe()


def test_option_off_keeps_two_kernels_with_the_reason():
    _, plan = planned(rowcol(), trees=False)
    assert len(plan.groups) == 2
    d = stitch_decision(plan)
    assert not d.taken and "stitch fusion is off (option stitch_fusion)" in d.reason


def test_leading_and_trailing_axes_of_higher_rank():
    _, plan = planned(rowcol(shape=("B", "T", 32), split=2, ops=("ReduceMean", "ReduceSum")))
    (g,) = plan.groups
    assert g.branches == (frozenset({2}), frozenset({0, 1}))


def test_axes_that_do_not_split_the_domain_are_refused():
    # row over [2], column over [0] of [A, B, C]: axis 1 is in neither
    gr = geode.Graph("gap")
    x = gr.input("x", ["A", 8, 16])
    gr.output(
        gr.op("ReduceSum", x, ints(gr, [2]), keepdims=0),
        gr.op("ReduceSum", x, ints(gr, [0]), keepdims=0),
        names=["r", "c"],
    )
    _, plan = planned(gr, always_profitable)
    assert len(plan.groups) == 2
    assert any(
        "do not split it into leading (column) and trailing (row)" in d.reason
        for d in plan.decisions
    )


def test_broadcast_epilogue_is_refused():
    # y = x - rowmean(x) keeps the row group a reduce_broadcast kernel
    gr = geode.Graph("bcast")
    x = gr.input("x", ["N", 64])
    m = gr.op("ReduceMean", x, ints(gr, [1]), keepdims=1)
    y = gr.op("Sub", x, m)
    c = gr.op("ReduceSum", x, ints(gr, [0]), keepdims=0)
    gr.output(y, c, names=["y", "c"])
    _, plan = planned(gr, always_profitable)
    assert len(plan.groups) == 2
    assert any(
        "writes values over its full domain after reducing" in d.reason for d in plan.decisions
    )


def test_a_path_between_them_is_refused():
    # c sums x + (rowsum(x) @ w): a MatMul outside both groups leads from r to c
    gr = geode.Graph("path")
    x = gr.input("x", ["N", 64])
    w = gr.input("w", [1, 64])
    r = gr.op("ReduceSum", x, ints(gr, [1]), keepdims=1)
    z = gr.op("MatMul", r, w)
    c = gr.op("ReduceSum", gr.op("Add", x, z), ints(gr, [0]), keepdims=0)
    gr.output(r, c, names=["r", "c"])
    _, plan = planned(gr, always_profitable)
    assert not any(is_stitch(g) for g in plan.groups), plan.describe()
    assert any("a path leads from one reduction to the other" in d.reason for d in plan.decisions)


def test_different_inputs_are_not_stitched():
    gr = geode.Graph("two")
    x, y = gr.input("x", ["N", 64]), gr.input("y", ["N", 64])
    gr.output(
        gr.op("ReduceSum", x, ints(gr, [1]), keepdims=0),
        gr.op("ReduceSum", y, ints(gr, [0]), keepdims=0),
        names=["r", "c"],
    )
    _, plan = planned(gr, always_profitable)
    assert len(plan.groups) == 2


def test_stitch_merge_helpers_and_lowering_order():
    g, plan = planned(rowcol(ops=("ReduceMean", "ReduceSum")), trees=False)
    a, b = plan.groups
    st = stitch_merge(a, b)
    assert isinstance(st, StitchMerge) and stitch_merge(b, a) == st
    assert st.rows == frozenset({1}) and st.columns == frozenset({0}) and st.shared == "x"
    assert stitch_merge(a, a) is None  # same axes: the plain R+R rules
    merged = Group(0, a.nodes + b.nodes, st.domain, st.rows | st.columns, branches=st.branches)
    assert (
        stitch_merge(merged, b)
        == "a stitch group merges only with another row reduction of its input"
    )
    order = [n.op_type for n in lowering_order(merged)]
    assert order.index("ReduceSum") < order.index("ReduceMean")  # the column part first
    assert lowering_order(a) == a.nodes


def test_profit_counts_the_partials_and_refuses_few_rows():
    spec = default_spec()
    # many rows: the input read once pays for the partials
    g, plan = planned(rowcol(shape=(4096, 256)), trees=False)
    a, b = plan.groups
    st = stitch_merge(a, b)
    merged = Group(0, a.nodes + b.nodes, st.domain, st.rows | st.columns, branches=st.branches)
    w, plain = stitch_work(merged, g), group_work(merged, g)
    assert w.bytes_read - plain.bytes_read == STITCH_PARTIALS * 256 * 4
    assert make_profit(spec)(a, b, merged, g)[0]
    # two rows of a million columns: the partials are as large as the input
    _, plan = planned(rowcol(shape=(2, 1 << 20)))
    assert len(plan.groups) == 2, plan.describe()
    d = stitch_decision(plan)
    assert not d.taken and "stitch over [2, 1048576]" in d.reason


def test_too_few_row_blocks_lose_parallelism():
    # [1, T, 64]: the row blocks cut the first axis, a batch of one: one block
    spec = dataclasses.replace(default_spec(), cores=4)
    assert stitch_parallelism_lost(Group(0, [], (1, 512, 64), branches=((2,),)), spec)
    assert stitch_parallelism_lost(Group(0, [], ("B", 512, 64), branches=((2,),)), spec) is None
    g = rowcol(shape=(1, 512, 64), split=2)
    _, plan = planned(g, make_profit(spec))
    assert len(plan.groups) == 2
    d = stitch_decision(plan)
    assert not d.taken and "1 row blocks (the first axis) on 4 cores: parallelism lost" in d.reason


def test_two_row_reductions_merge_then_stitch():
    # the row sum and the row max merge (R+R), then stitch with the column sum
    gr = geode.Graph("two_rows")
    x = gr.input("x", ["N", 64])
    gr.output(
        gr.op("ReduceSum", x, ints(gr, [1]), keepdims=0),
        gr.op("ReduceMax", x, ints(gr, [1]), keepdims=0),
        gr.op("ReduceSum", x, ints(gr, [0]), keepdims=0),
        names=["r", "m", "c"],
    )
    _, plan = planned(gr)
    assert len(plan.groups) == 1 and is_stitch(plan.groups[0]), plan.describe()


def test_a_row_reduction_joins_a_stitch():
    # x * x summed over columns, then over rows (vertical: the stitch forms first), then
    # the row max of x joins the stitch group (horizontal, x read by both)
    gr = geode.Graph("join")
    x = gr.input("x", ["N", 64])
    sq = gr.op("Mul", x, x)
    c = gr.op("ReduceSum", sq, ints(gr, [0]), keepdims=0)
    r = gr.op("ReduceSum", sq, ints(gr, [1]), keepdims=0)
    m = gr.op("ReduceMax", x, ints(gr, [1]), keepdims=0)
    gr.output(c, r, m, names=["c", "r", "m"])
    _, plan = planned(gr)
    assert len(plan.groups) == 1 and is_stitch(plan.groups[0]), plan.describe()
    joins = [d for d in plan.decisions if "another row reduction over [1] joins" in d.reason]
    assert len(joins) == 1 and joins[0].taken and joins[0].rule == "Stitch"


def test_two_column_reductions_are_not_one_stitch():
    gr = geode.Graph("two_cols")
    x = gr.input("x", ["N", 64])
    gr.output(
        gr.op("ReduceSum", x, ints(gr, [1]), keepdims=0),
        gr.op("ReduceSum", x, ints(gr, [0]), keepdims=0),
        gr.op("ReduceMax", x, ints(gr, [0]), keepdims=0),
        names=["r", "c", "m"],
    )
    _, plan = planned(gr, always_profitable)
    assert len(plan.groups) == 2, plan.describe()
    assert any(
        "holds 2 column reductions" in d.reason
        or "merges only with another row reduction" in d.reason
        for d in plan.decisions
    )
