"""Fusion planning: legality rules, profitability decisions and the groups they give."""

import numpy as np
import pytest

import geode
from geode import examples, ops
from geode.codegen.lower import make_can_lower
from geode.compiler.fusion.planner import always_profitable, plan_fusion, schedule_units
from geode.compiler.fusion.profit import make_profit
from geode.compiler.partition.placement import place
from geode.compiler.pipeline import run_pipeline
from geode.costmodel.device import default_spec


def planned(graph, profit=None):
    g = graph.copy()
    g.infer_shapes()
    run_pipeline(g)
    g.sort()
    p = place(g)
    plan = plan_fusion(g, p, make_can_lower(g), profit or make_profit(default_spec()))
    return g, plan


def op_types(group):
    return sorted(n.op_type for n in group.nodes)


def test_rmsnorm_is_one_group():
    g, plan = planned(examples.rmsnorm(hidden=64).graph)
    assert len(plan.groups) == 1
    assert len(plan.groups[0].nodes) == len(g.nodes)
    assert plan.groups[0].pattern_name() == "reduce_broadcast"


def test_layernorm_op_decomposed_is_one_group():
    gr = geode.Graph("ln")
    x = gr.input("x", ["N", 32])
    s = gr.constant(np.ones(32, np.float32))
    b = gr.constant(np.zeros(32, np.float32))
    gr.output(ops.layer_normalization(x, s, b, axis=-1), names=["y"])
    g, plan = planned(gr)
    assert len(plan.groups) == 1
    assert len(plan.groups[0].nodes) == len(g.nodes) >= 8
    assert plan.unfused == {}


@pytest.mark.parametrize("name", ["softmax", "layernorm", "silu", "gelu", "bias_gelu_tanh"])
def test_single_group_examples(name):
    g, plan = planned(examples.ALL[name]().graph)
    assert len(plan.groups) == 1, plan.describe()
    assert not plan.unfused, plan.describe()


def test_lstm_gate_math_is_one_group():
    g, plan = planned(examples.lstm_cell(input_size=8, hidden=16).graph)
    assert len(plan.groups) == 1, plan.describe()
    assert sorted(plan.unfused) == sorted(n.name for n in g.nodes if n.op_type == "MatMul")
    assert "Split" in op_types(plan.groups[0])


def test_reduce_domains_must_match_for_r_plus_r():
    gr = geode.Graph("rr")
    x = gr.input("x", ["N", 16])
    a = ops.reduce_sum(x, axes=[1], keepdims=1)
    b = ops.reduce_sum(x * a, axes=[0], keepdims=1)
    gr.output(b, names=["y"])
    _, plan = planned(gr, always_profitable)
    assert len(plan.groups) == 2
    assert any("reduce domains differ" in d.reason and not d.taken for d in plan.decisions)


def test_no_cycle_through_an_unfused_node():
    # a -> MatMul (not fused) -> c and a -> c: fusing a with c would need MatMul inside
    gr = geode.Graph("cycle")
    x = gr.input("x", [8, 8])
    w = gr.constant(np.eye(8, dtype=np.float32))
    a = ops.exp(x)
    m = ops.matmul(a, w)
    gr.output(m + a, names=["y"])
    _, plan = planned(gr, always_profitable)
    assert len(plan.groups) == 2
    assert any("cycle" in d.reason and not d.taken for d in plan.decisions)
    order = schedule_units(*planned(gr, always_profitable))
    assert [type(u).__name__ for u in order] == ["Group", "Node", "Group"]


def test_remap_of_reduced_value_is_refused():
    gr = geode.Graph("remap")
    x = gr.input("x", [4, 6])
    s = ops.reduce_sum(x, axes=[1], keepdims=1)  # [4, 1]
    t = ops.transpose(s, perm=[1, 0])  # [1, 4]: reads rows other than its own
    gr.output(t * 2.0, names=["y"])
    _, plan = planned(gr, always_profitable)
    assert any(
        "depends on a reduction" in d.reason or "does not fit" in d.reason for d in plan.decisions
    )
    assert len(plan.groups) >= 2


def test_every_decision_has_a_reason_and_shows_in_describe():
    _, plan = planned(examples.attention().graph)
    assert plan.decisions
    text = plan.describe()
    for d in plan.decisions:
        assert d.reason
        assert d.reason in text
    assert "not fused:" in text and "MatMul" not in [n for n in plan.unfused]


def test_profit_refuses_a_costly_recompute():
    # an expensive [K] computation broadcast into an [N, K] group is recomputed N times
    gr = geode.Graph("partial")
    x = gr.input("x", [4096, 64])
    p = gr.input("p", [64])
    w = ops.tanh(ops.exp(ops.sigmoid(p)))
    gr.output(x * w, names=["y"])
    _, plan = planned(gr)
    refused = [d for d in plan.decisions if not d.taken]
    assert refused and any("recompute" in d.reason for d in refused), plan.describe()


def test_work_with_known_evaluations_is_the_work():
    """``kernel_work`` given a group's evaluations (the profit callback computes them
    once for both uses) is what it computes on its own, for every group of a plan."""
    from geode.compiler.fusion.profit import evaluations, kernel_work

    for name in ("attention", "layernorm", "lstm_cell"):
        g, plan = planned(getattr(examples, name)().graph)
        assert plan.groups
        for group in plan.groups:
            known = kernel_work(group, g, evaluations(group, g))
            assert known == kernel_work(group, g)


def test_symbolic_broadcast_is_legal_and_fuses_across():
    """``exp(x[N, 16]) + y[M, 16]``: the Add broadcasts N and M (legal under the recorded
    constraint, not "ambiguous"), and the producer on ``[N, 16]`` fuses into the group
    on ``[bcast(M, N), 16]`` as a partial value (N is that dim or 1)."""
    from geode.compiler.fusion.patterns import placement_on
    from geode.compiler.shapes import sym

    gr = geode.Graph("sym_bcast")
    x, y = gr.input("x", ["N", 16]), gr.input("y", ["M", 16])
    gr.output(ops.tanh(ops.exp(x) + y), names=["z"])
    g, plan = planned(gr)
    assert len(plan.groups) == 1 and not plan.unfused, plan.describe()
    (group,) = plan.groups
    assert str(group.domain) == "(bcast(M, N), 16)"
    assert placement_on(x.shape, group.domain, group.axes) == "partial"
    assert placement_on((sym("K"), 16), group.domain, group.axes) is None


def test_numel_counts_every_symbolic_dim_at_the_nominal_size() -> None:
    """A lone symbol (any object, equal or not to one seen before), an expression of
    symbols and an int each count as at the nominal size: the same figure the memoised
    substitution gives."""
    import sympy

    from geode.compiler.fusion.profit import NOMINAL_DIM, _nominal, numel

    gr = geode.Graph("numel")
    n, s = sympy.Symbol("N"), sympy.Symbol("S")
    cases = {
        "a": ([n, 16], NOMINAL_DIM * 16.0),
        "b": ([sympy.Symbol("N"), s, 3], NOMINAL_DIM * NOMINAL_DIM * 3.0),
        "c": ([n + 1, 2 * s], (NOMINAL_DIM + 1.0) * 2.0 * NOMINAL_DIM),
        "d": ([], 1.0),
    }
    for name, (shape, want) in cases.items():
        v = gr.input(name, shape)
        assert numel(v) == want
        expect = 1.0
        for d in shape:
            expect *= d if isinstance(d, int) else _nominal(d)
        assert numel(v) == expect
