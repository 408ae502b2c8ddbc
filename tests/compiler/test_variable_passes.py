"""The variable passes: variable_prepare, var_is_initialized, variable_format (and how
the other passes treat writes)."""

import numpy as np
import pytest

import geode
from geode import ops
from geode.compiler.interpret import run_reference
from geode.compiler.ir import ValueKind
from geode.compiler.ops import state
from geode.compiler.passes.variable_format import accelerate_variable_formats
from geode.compiler.passes.variable_prepare import prepare_variables
from geode.compiler.passes.variables import (
    SessionVariable,
    fold_var_is_initialized,
    freeze_read_only_variables,
    is_read_only,
    mark_read_only_variables,
)
from geode.compiler.pipeline import run_pipeline
from geode.errors import GraphError
from geode.runtime import var_format


def optypes(g):
    return [n.op_type for n in g.nodes]


def _order_graph():
    g = geode.Graph("order")
    x = g.input("x", [3])
    w = g.variable(np.full(3, 10.0, np.float32), "w")
    v = g.variable(np.ones(3, np.float32), "v")
    before = w * 2.0
    g.assign(w, x)
    after = w + v
    g.assign_add(w, 1.0)
    g.assign_sub(v, x)
    g.output(before, after, w * 1.0, names=["before", "after", "last"])
    return g


def test_prepare_rewires_reads_in_graph_order_and_leaves_one_ref_per_variable():
    g = _order_graph()
    feeds = {"x": np.array([1.0, 2.0, 3.0], np.float32)}
    want = run_reference(g, feeds)
    np.testing.assert_array_equal(want["before"], [20.0, 20.0, 20.0])
    np.testing.assert_array_equal(want["after"], [2.0, 3.0, 4.0])
    np.testing.assert_array_equal(want["last"], [2.0, 3.0, 4.0])
    assert prepare_variables(g)
    g.sort()
    g.verify()
    assert not any(state.is_write(n) for n in g.nodes)
    refs = {n.inputs[0].name: n for n in g.nodes if state.is_var_ref(n)}
    assert sorted(refs) == ["v", "w"]
    w = g.values["w"]
    # the read built before the write reads w itself, the one after reads the write
    readers = sorted(n.op_type for n in w.consumers)
    assert readers == ["Mul", "VarRef"]
    final_w = refs["w"].inputs[1]
    assert final_w.producer.op_type == "Add"  # AssignAdd(w', 1) on the Assign's value
    assert final_w.producer.inputs[0] is g.values["x"]
    got = run_reference(g, feeds, check=True)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    assert not prepare_variables(g)  # nothing left to prepare


def test_a_written_variable_as_an_unnamed_output_is_refused():
    g = geode.Graph("ambiguous")
    x = g.input("x", [2])
    w = g.variable(np.zeros(2, np.float32), "w")
    g.assign(w, x)
    g.output(w)
    with pytest.raises(
        GraphError, match="'w' is written by the graph and is itself a graph output"
    ):
        prepare_variables(g)
    named = geode.Graph("named")
    x = named.input("x", [2])
    w = named.variable(np.zeros(2, np.float32), "w")
    named.assign(w, x)
    named.output(w, names=["w_now"])  # an Identity built after the write: the new value
    feeds = {"x": np.array([5.0, 6.0], np.float32)}
    np.testing.assert_array_equal(run_reference(named, feeds)["w_now"], [5.0, 6.0])
    prepare_variables(named)
    named.sort()
    np.testing.assert_array_equal(run_reference(named, feeds)["w_now"], [5.0, 6.0])


def test_other_passes_never_drop_fold_or_merge_a_write():
    g = geode.Graph("keep")
    x = g.input("x", [2])
    a = g.variable(np.zeros(2, np.float32), "a")
    b = g.variable(np.zeros(2, np.float32), "b")
    g.assign(a, np.ones(2, np.float32) * 3)  # a constant value: folds, the write stays
    g.assign(b, np.ones(2, np.float32) * 3)  # the same value: one constant, two writes
    g.output(x * a, names=["y"])  # reads a's old value
    run_pipeline(g)
    refs = [n for n in g.nodes if state.is_var_ref(n)]
    assert sorted(r.inputs[0].name for r in refs) == ["a", "b"]
    assert all(r.inputs[1].kind is ValueKind.CONSTANT for r in refs)
    assert "Mul" in optypes(g)  # x * a is not folded: a is a variable, not a constant
    assert g.values["a"].kind is ValueKind.VARIABLE


def test_written_variables_are_not_frozen():
    g = geode.Graph("freeze")
    x = g.input("x", [2])
    w = g.variable(np.ones(2, np.float32), "w")
    c = g.variable(np.ones(2, np.float32), "c")
    g.assign_add(w, x)
    g.output(x * c + w, names=["y"])
    prepare_variables(g)
    mark_read_only_variables(g)
    assert is_read_only(g.values["c"]) and not is_read_only(g.values["w"])
    freeze_read_only_variables(g)
    assert g.values["w"].kind is ValueKind.VARIABLE and g.values["c"].kind is ValueKind.CONSTANT


def test_var_is_initialized_folds_what_cannot_change():
    g = geode.Graph("init")
    x = g.input("x", [2])
    w = g.variable(np.ones(2, np.float32), "w")
    d = g.variable(name="d", shape=[2], dtype="float32")
    e = g.variable(name="e", shape=[2], dtype="float32")
    f = g.variable(name="f", shape=[2], dtype="float32")
    qs = [g.var_is_initialized(v) for v in (w, d, e)]
    g.assign(f, x)
    qs.append(g.var_is_initialized(f))  # after a write in graph order
    g.output(*qs, names=["qw", "qd", "qe", "qf"])
    prepare_variables(g)
    session = {"e": SessionVariable("ND", True), "d": SessionVariable("ND", False)}
    assert fold_var_is_initialized(g, session)
    left = [n for n in g.nodes if state.is_var_query(n)]
    assert [n.inputs[0].name for n in left] == ["d"]  # asked at run time
    consts = {o.name: o for o in g.outputs if o.kind is ValueKind.CONSTANT}
    assert sorted(consts) == ["qe", "qf", "qw"] and all(bool(o.data) for o in consts.values())
    assert not fold_var_is_initialized(g, session)


# -- format acceleration ------------------------------------------------------------------
def _linear(w0, *, plain_reader=False, gemm=False):
    g = geode.Graph("linear")
    x = g.input("x", ["N", w0.shape[1]])
    w = g.variable(w0, "W")
    y = ops.gemm(x, w, transB=1) if gemm else ops.matmul(x, ops.transpose(w, perm=[1, 0]))
    if plain_reader:
        y = y + ops.reduce_sum(w, axes=[1], keepdims=0)
    g.output(y, names=["y"])
    return g


W0 = np.arange(15, dtype=np.float32).reshape(5, 3) / 7


@pytest.mark.parametrize("gemm", [False, True], ids=["transpose", "gemm_transB"])
def test_a_weight_read_transposed_is_stored_transposed(gemm):
    g = _linear(W0, gemm=gemm)
    feeds = {"x": np.ones((2, 3), np.float32)}
    want = run_reference(g, feeds)["y"]
    before = var_format.conversions()
    run_pipeline(g)
    assert var_format.conversions() == before + 1  # the initial value, once
    w = g.values["W"]
    assert w.desc.format == "TRANSPOSED(1,0)" and w.shape == (3, 5)
    np.testing.assert_array_equal(w.data, W0.T)
    assert "Transpose" not in optypes(g)
    np.testing.assert_allclose(run_reference(g, feeds, check=True)["y"], want, rtol=1e-6)
    assert not accelerate_variable_formats(g)  # done: not again


def test_mixed_readers_keep_the_users_layout():
    g = _linear(W0, plain_reader=True)
    run_pipeline(g)
    assert g.values["W"].desc.format == "ND" and "Transpose" in optypes(g)


def test_the_sessions_format_is_adopted_with_a_conversion_back():
    g = _linear(W0, plain_reader=True)
    feeds = {"x": np.ones((2, 3), np.float32)}
    want = run_reference(g, feeds)["y"]
    run_pipeline(g, session_variables={"W": SessionVariable("TRANSPOSED(1,0)", True)})
    w = g.values["W"]
    assert w.desc.format == "TRANSPOSED(1,0)"
    back = [n for n in w.consumers if n.op_type == "Transpose"]
    assert len(back) == 1  # the plain reader reads W converted back; the MatMul reads W
    np.testing.assert_allclose(run_reference(g, feeds, check=True)["y"], want, rtol=1e-6)
    plain = _linear(W0)
    run_pipeline(plain, session_variables={"W": SessionVariable("ND", True)})
    assert plain.values["W"].desc.format == "ND"  # the session's ND wins over the readers


def test_a_variable_output_is_not_converted():
    g = geode.Graph("out")
    x = g.input("x", ["N", 3])
    w = g.variable(W0, "W")
    g.output(ops.matmul(x, ops.transpose(w, perm=[1, 0])), w, names=["y", "W"])
    run_pipeline(g)
    assert g.values["W"].desc.format == "ND"
    h = geode.Graph("out2")
    w = h.variable(W0, "W")
    h.output(w)
    with pytest.raises(GraphError, match="graph output, but the session stores it"):
        run_pipeline(h, session_variables={"W": SessionVariable("TRANSPOSED(1,0)", True)})


def test_a_write_of_a_converted_variable_commits_the_users_layout():
    g = geode.Graph("update")
    x = g.input("x", ["N", 3])
    nw = g.input("nw", [5, 3])
    w = g.variable(W0, "W")
    y = ops.matmul(x, ops.transpose(w, perm=[1, 0]))
    g.assign(w, nw)
    g.output(y, names=["y"])
    run_pipeline(g)
    assert g.values["W"].desc.format == "TRANSPOSED(1,0)"
    (ref,) = [n for n in g.nodes if state.is_var_ref(n)]
    assert ref.inputs[1] is g.values["nw"]  # the VarManager converts it on commit
