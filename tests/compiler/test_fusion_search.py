"""The fusion plan search: a beam over plans scored by a cost model, against greedy."""

from __future__ import annotations

import numpy as np
import pytest

import geode
from geode import config, examples, ops
from geode.codegen.lower import make_can_lower
from geode.compiler.fusion.planner import plan_fusion
from geode.compiler.fusion.profit import group_work, make_profit
from geode.compiler.fusion.search import search_fusion
from geode.compiler.partition.placement import place
from geode.compiler.pipeline import run_pipeline
from geode.costmodel.device import default_spec
from geode.costmodel.sol import estimate

SPEC = default_spec()


def prepared(graph):
    g = graph.copy()
    g.infer_shapes()
    run_pipeline(g)
    g.sort()
    return g, place(g)


def sol_cost(graph, calls=None):
    def cost(group):
        if calls is not None:
            calls.append(frozenset(group.names))
        return estimate(group_work(group, graph), SPEC)

    return cost


def plans(graph, cost_of=sol_cost, **kw):
    g, p = prepared(graph)
    trees = kw.get("trees", True)
    greedy = plan_fusion(g, p, make_can_lower(g), make_profit(SPEC), trees=trees)
    cost = cost_of(g)
    found = search_fusion(g, p, make_can_lower(g), cost, greedy, **kw)
    return g, greedy, found, cost


def total(plan, cost):
    return sum(cost(gr) for gr in plan.groups)


@pytest.mark.parametrize("name", ["softmax", "layernorm", "rmsnorm", "gelu", "reduce_chain"])
def test_single_kernel_examples_stay_one_kernel(name):
    g, greedy, found, cost = plans(examples.ALL[name]().graph)
    assert len(found.groups) == 1, found.describe()
    assert total(found, cost) <= total(greedy, cost) * (1 + 1e-9)
    text = found.describe()
    assert "plan search" in text and "chosen:" in text and "runner-up:" in text


@pytest.mark.parametrize("name", ["attention", "lstm_cell", "lstm_gates"])
def test_the_chosen_plan_is_never_worse_than_greedy_by_the_model(name):
    g, greedy, found, cost = plans(examples.ALL[name]().graph)
    assert total(found, cost) <= total(greedy, cost) * (1 + 1e-9)
    chosen, runner = found.search[0], found.search[1]
    assert chosen.startswith("chosen: ") and runner.startswith("runner-up: ")
    if "predicted" in runner:
        assert predicted(chosen) <= predicted(runner)
    if "greedy" in chosen:
        assert found is greedy


def predicted(line):
    return float(line.split("predicted ")[1].split(" us")[0])


def test_merges_and_refusals_are_recorded_with_their_reasons():
    gr = geode.Graph("t")
    x = gr.input("x", [64, 256])
    a = ops.exp(ops.mul(x, 2.0))
    gr.output(ops.reduce_sum(a, axes=[1], keepdims=0), ops.reduce_sum(a, axes=[0], keepdims=0))
    g, greedy, found, cost = plans(gr, trees=False)
    taken = [d for d in found.decisions if d.taken]
    refused = [d for d in found.decisions if not d.taken]
    assert any("sure:" in d.reason for d in taken)  # exp into... the mul's only reader
    assert any("projected: saves" in d.reason for d in taken)
    assert any("stitch fusion is off" in d.reason for d in refused), found.describe()
    # with stitch fusion off the row and the column reduction of one input stay apart
    # (legality, not cost); on, both plans make them one stitch kernel
    kinds = sorted(gr_.pattern_name() for gr_ in found.groups)
    assert "column_reduce" in kinds and "row_reduce" in kinds
    g, greedy, found, cost = plans(gr)
    assert [gr_.pattern_name() for gr_ in found.groups] == ["stitch_reduce"]
    assert any(d.rule == "Stitch" and d.taken for d in found.decisions)


def reductions(group):
    return sum(1 for n in group.nodes if n.op_type.startswith("Reduce"))


def test_a_cost_that_punishes_fused_reductions_keeps_them_apart():
    def apart(graph):
        def cost(group):
            base = estimate(group_work(group, graph), SPEC)
            return base + (1.0 if reductions(group) > 1 else 0.0)

        return cost

    g, greedy, found, cost = plans(examples.layernorm(hidden=64).graph, apart)
    assert len(greedy.groups) == 1  # the SOL greedy fuses both reductions
    assert all(reductions(gr) <= 1 for gr in found.groups)
    assert total(found, cost) < total(greedy, cost)
    assert "beam search" in found.search[0]
    assert predicted(found.search[0]) == pytest.approx(total(found, cost) * 1e6, abs=0.1)
    assert any("projected: loses" in d.reason for d in found.decisions if not d.taken)


def test_the_budget_bounds_the_groups_priced():
    calls: list = []
    plans(examples.attention().graph, lambda g: sol_cost(g, calls), max_evaluations=5)
    few = len(set(calls))
    calls.clear()
    plans(examples.attention().graph, lambda g: sol_cost(g, calls))
    assert few < len(set(calls))


def test_bad_search_parameters_are_refused():
    g, p = prepared(examples.softmax().graph)
    with pytest.raises(ValueError, match="beam"):
        search_fusion(g, p, make_can_lower(g), sol_cost(g), beam=0)


def test_compile_with_the_search_matches_the_reference():
    ex = examples.lstm_cell(input_size=16, hidden=32)
    model = geode.compile(ex.graph, fusion_search="beam", model_cache=False, progress="0")
    feeds = ex.make_inputs(np.random.default_rng(0), 8)
    got = model(**feeds)
    want = ex.numpy(**feeds)
    for k, v in want.items():
        np.testing.assert_allclose(got[k], v, rtol=1e-4, atol=1e-5)
    assert "plan search (projected cost model)" in model.explain()


def test_the_option_and_its_environment_variable(monkeypatch):
    assert config.Options().fusion_search == "greedy"
    monkeypatch.setenv("GEODE_FUSION_SEARCH", "Beam")
    assert config.current().fusion_search == "beam"
    monkeypatch.setenv("GEODE_FUSION_SEARCH", "exhaustive")
    with pytest.raises(config.OptionError, match="GEODE_FUSION_SEARCH"):
        config.current()
    with pytest.raises(config.OptionError, match="fusion_search"):
        config.Options().replace(fusion_search="best")
