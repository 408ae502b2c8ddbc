"""View ops (compiler/fusion/views.py): which nodes can be aliases, the planner's rule
that no kernel copies a view whose input is in memory anyway, and view-only groups
dissolved into aliases."""

import numpy as np
import pytest

import geode
from geode import ops
from geode.codegen.lower import make_can_lower
from geode.compiler.fusion.planner import always_profitable, plan_fusion
from geode.compiler.fusion.views import ViewSpec, alias_view
from geode.compiler.partition.placement import input_symbols, place
from geode.compiler.pipeline import run_pipeline


def node_of(graph, value):
    g = graph.copy()
    g.infer_shapes()
    g.sort()
    (node,) = [n for n in g.nodes if n.outputs[0].name == value.name]
    return node, input_symbols(g)


def planned(graph, **pipeline):
    g = graph.copy()
    g.infer_shapes()
    run_pipeline(g, **pipeline)
    g.sort()
    return g, plan_fusion(g, place(g), make_can_lower(g), always_profitable)


@pytest.mark.parametrize(
    "make",
    [
        lambda x: ops.reshape(x, [0, 4, 16]),
        lambda x: ops.flatten(x, axis=0),
        lambda x: ops.unsqueeze(x, axes=[1]),
        lambda x: ops.squeeze(ops.unsqueeze(x, axes=[0]), axes=[0]),
        lambda x: ops.identity(x),
    ],
    ids=["reshape", "flatten", "unsqueeze", "squeeze", "identity"],
)
def test_shape_only_ops_are_reshape_views(make):
    g = geode.Graph("v")
    x = g.input("x", ["N", 64])
    y = make(x)
    g.output(y)
    node, bound = node_of(g, y)
    assert alias_view(node, bound) == ViewSpec("reshape")


@pytest.mark.parametrize(
    ("shape", "starts", "ends", "axes", "steps", "want"),
    [
        (["N", 64], [1], [3], [0], None, ViewSpec("slice", 0, 1, 3)),
        ([1, "N", 64], [0, 2], [1, 5], [0, 1], None, ViewSpec("slice", 1, 2, 5)),
        (["N", 64], [0, -3], [2**62, 2**62], [1, 0], [1, 1], ViewSpec("slice", 0, -3, 2**62)),
        (["N", 64], [0], [8], [1], None, None),  # a strided part of every row
        (["N", 64], [0], [8], [0], [2], None),  # every other row
        (["N", 2, 64], [0], [1], [1], None, None),  # the sliced axis is not the leading one
    ],
    ids=["leading", "after-unit-dims", "whole-and-cut", "inner-axis", "step-2", "symbolic-lead"],
)
def test_a_slice_is_a_view_only_when_contiguous(shape, starts, ends, axes, steps, want):
    g = geode.Graph("s")
    x = g.input("x", shape)
    y = ops.slice(x, starts, ends, axes, steps) if steps else ops.slice(x, starts, ends, axes)
    g.output(y)
    node, bound = node_of(g, y)
    assert alias_view(node, bound) == want


def test_no_view_of_a_variable_or_of_a_shape_known_only_at_run_time():
    g = geode.Graph("no")
    x = g.input("x", ["N", 8])
    v = g.variable(np.zeros((2, 4), np.float32), "v")
    rv = ops.reshape(v, [8])
    nz = ops.non_zero(x)  # [2, K]: K known only at run time
    rn = ops.reshape(nz, [-1])
    g.output(rv, rn)
    for value in (rv, rn):
        node, bound = node_of(g, value)
        assert alias_view(node, bound) is None, node.name


def test_a_lone_view_between_matmuls_is_dissolved_not_a_group():
    g0 = geode.Graph("lone")
    x = g0.input("x", ["N", 64])
    h = ops.matmul(x, g0.constant(np.ones((64, 64), np.float32)))
    r = ops.reshape(h, [0, 8, 8])
    g0.output(ops.matmul(r, g0.constant(np.ones((8, 8), np.float32))))
    g, plan = planned(g0)
    assert plan.groups == []
    (name,) = [n.name for n in g.nodes if n.op_type == "Reshape"]
    assert plan.unfused[name] == f"view of {h.name!r}: an alias in the memory plan (no kernel)"


def test_merges_that_would_copy_a_view_are_refused_with_the_reason():
    """Reshape of a value the group writes anyway (vertical) would be a copy; Exp ->
    Reshape -> Tanh still fuses (the view is read through its index map)."""
    g0 = geode.Graph("copies")
    x = g0.input("x", ["N", 64])
    e = ops.exp(x)
    g0.output(e, ops.reshape(e, [0, 8, 8]), ops.tanh(ops.reshape(e, [0, 4, 16])))
    g, plan = planned(g0, disabled=("simplify",))
    groups = [sorted(n.op_type for n in grp.nodes) for grp in plan.groups]
    assert groups == [["Exp", "Reshape", "Tanh"]], plan.describe()
    refused = [d.reason for d in plan.decisions if not d.taken]
    assert any("would copy view Reshape 'reshape' of 'exp_0'" in r for r in refused), refused
    (view,) = [n for n, why in plan.unfused.items() if "alias in the memory plan" in why]
    assert view == "reshape"


def test_a_view_is_not_merged_horizontally_into_a_kernel():
    g0 = geode.Graph("horizontal")
    x = g0.input("x", ["N", 64])
    g0.output(ops.exp(x), ops.identity(x))
    g, plan = planned(g0)
    assert [[n.op_type for n in grp.nodes] for grp in plan.groups] == [["Exp"]]
    (d,) = plan.decisions
    assert d.rule == "horizontal" and not d.taken
    assert "the kernel would copy view Identity 'identity' of 'x'" in d.reason
