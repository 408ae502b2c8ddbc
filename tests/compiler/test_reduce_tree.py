"""ReduceTree fusion planning: which chained reductions form one group, and why not."""

import numpy as np
import pytest

import geode
from geode.codegen.lower import make_can_lower
from geode.compiler.fusion.groups import Group
from geode.compiler.fusion.planner import always_profitable, plan_fusion
from geode.compiler.fusion.profit import make_profit, tree_parallelism_lost
from geode.compiler.fusion.reduce_tree import levels_of, row_axes, tree_merge
from geode.compiler.partition.placement import place
from geode.compiler.pipeline import run_pipeline
from geode.costmodel.device import default_spec


def planned(gr, profit=None, trees=True):
    g = gr.copy()
    g.infer_shapes()
    run_pipeline(g)
    g.sort()
    plan = plan_fusion(
        g, place(g), make_can_lower(g), profit or make_profit(default_spec()), trees=trees
    )
    return g, plan


def chain(shape, first, second, op="ReduceSum", keep=1, dtype="float32"):
    gr = geode.Graph("chain")
    x = gr.input("x", shape, dtype)
    ints = lambda v: gr.constant(np.array(v, np.int64))  # noqa: E731
    s1 = gr.op(op, x, ints(first), keepdims=keep)
    s2 = gr.op(op, s1, ints(second), keepdims=keep)
    gr.output(s2, names=["y"])
    return gr


@pytest.mark.parametrize("keep", [0, 1])
@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax"])
def test_two_level_chain_is_one_tree_group(keep, op):
    _, plan = planned(chain(["N", 64, 49], [2], [1], op, keep))
    assert len(plan.groups) == 1, plan.describe()
    g = plan.groups[0]
    assert g.pattern_name() == "reduce_tree"
    assert g.levels == (frozenset({2}), frozenset({1}))
    assert g.axes == frozenset({1, 2})
    (d,) = [d for d in plan.decisions if d.taken]
    assert d.rule == "ReduceTree"
    assert "reduce tree over [N, 64, 49]: axes [2] then [1]" in d.reason
    assert "saves" in d.reason  # the SOL model's verdict is recorded with the legality
    assert "in turn [2] then [1]" in plan.describe()


def test_squeezed_axes_map_to_domain_coordinates():
    # sum over C first (axis 1) leaves [N, HW]; its axis 1 is the domain's axis 2
    _, plan = planned(chain(["N", 8, 49], [1], [1], keep=0))
    (g,) = plan.groups
    assert g.levels == (frozenset({1}), frozenset({2}))


def test_three_levels_with_elementwise_prologue_and_epilogue():
    gr = geode.Graph("deep")
    x = gr.input("x", ["N", 4, 6, 8])
    ints = lambda v: gr.constant(np.array(v, np.int64))  # noqa: E731
    sq = gr.op("Mul", x, x)
    a = gr.op("ReduceSum", sq, ints([3]), keepdims=0)
    b = gr.op("ReduceSum", a, ints([2]), keepdims=0)
    c = gr.op("ReduceSum", b, ints([1]), keepdims=0)
    gr.output(gr.op("Sqrt", c), names=["y"])
    _, plan = planned(gr)
    assert len(plan.groups) == 1, plan.describe()
    assert plan.groups[0].levels == (frozenset({3}), frozenset({2}), frozenset({1}))
    assert sum(d.rule == "ReduceTree" and d.taken for d in plan.decisions) == 2


def test_rows_that_do_not_lead_are_refused():
    # sum over N first: the axes left ([1], C) are not the leading ones
    _, plan = planned(chain(["N", 8, 49], [0], [1], keep=1), always_profitable)
    assert len(plan.groups) == 2
    assert any("do not lead" in d.reason and not d.taken for d in plan.decisions)


def test_a_chain_reducing_every_axis_is_refused():
    _, plan = planned(chain(["N", 8, 49], [2], [0, 1], keep=1), always_profitable)
    assert len(plan.groups) == 2
    assert any("reduces every axis" in d.reason and not d.taken for d in plan.decisions)


def test_too_few_rows_lose_parallelism():
    _, plan = planned(chain([1, 512, 256], [2], [1], keep=1))
    assert len(plan.groups) == 2, plan.describe()
    (d,) = [d for d in plan.decisions if d.rule == "ReduceTree"]
    assert not d.taken and "parallelism lost" in d.reason


def test_option_off_keeps_chains_apart():
    _, plan = planned(chain(["N", 64, 49], [2], [1]), trees=False)
    assert len(plan.groups) == 2
    assert any("reduce trees are off" in d.reason for d in plan.decisions)


def test_broadcast_epilogue_producer_is_refused():
    # m = mean_HW(x); y = x - m (full domain) is a reduce_broadcast group: not a tree level
    gr = geode.Graph("bcast")
    x = gr.input("x", ["N", 8, 49])
    ints = lambda v: gr.constant(np.array(v, np.int64))  # noqa: E731
    m = gr.op("ReduceMean", x, ints([2]), keepdims=1)
    y = gr.op("Sub", x, m)
    s = gr.op("ReduceSum", m, ints([1]), keepdims=1)
    gr.output(y, s, names=["y", "s"])
    _, plan = planned(gr, always_profitable)
    assert len(plan.groups) == 2, plan.describe()
    assert any("full domain after reducing" in d.reason for d in plan.decisions)


def test_unrelated_reductions_of_one_input_are_no_tree():
    # a row sum and a column sum of x: neither reads the other, so no reduce tree; with
    # reduce trees and stitches off they keep apart (a stitch: tests/compiler/test_stitch.py)
    gr = geode.Graph("rowcol")
    x = gr.input("x", ["N", 16])
    ints = lambda v: gr.constant(np.array(v, np.int64))  # noqa: E731
    gr.output(
        gr.op("ReduceSum", x, ints([1]), keepdims=0),
        gr.op("ReduceSum", x, ints([0]), keepdims=0),
        names=["r", "c"],
    )
    _, plan = planned(gr, always_profitable, trees=False)
    assert len(plan.groups) == 2
    a, b = plan.groups
    assert tree_merge(a, b) is None
    assert any("stitch fusion is off" in d.reason for d in plan.decisions)


def test_tree_merge_helpers():
    g, plan = planned(chain(["N", 8, 49], [2], [1]), trees=False)
    a, b = plan.groups
    t = tree_merge(a, b)
    assert t is not None and not isinstance(t, str)
    assert t.levels == (frozenset({2}), frozenset({1})) and t.domain == a.domain
    assert tree_merge(b, a) == t  # orientation comes from the data edge, not the order
    assert levels_of(a) == (frozenset({2}),) and row_axes(a.domain, t.axes) == [0]
    elem = Group(9, [], a.domain)
    assert tree_merge(a, elem) is None
    merged = Group(0, a.nodes + b.nodes, t.domain, t.axes, t.levels)
    assert tree_parallelism_lost(a, b, merged, default_spec()) is None
    assert tree_parallelism_lost(merged, elem, merged, default_spec()) is None
