"""Pipeline stages (``compiler/partition/stages.py``), the subgraphs they cut
(``compiler/partition/subgraph.py``) and the incremental cut
(``compiler/partition/binary.py``)."""

import numpy as np
import pytest

import geode
from geode import ops
from geode.compiler.partition.binary import binary_cut
from geode.compiler.partition.stages import assign_stages, has_stages, split_stages
from geode.compiler.partition.subgraph import with_input_shapes
from geode.errors import GraphError

W = np.ones((8, 8), np.float32)


def staged():
    g = geode.Graph("s")
    x = g.input("x", ["N", 8])
    pre = ops.exp(x)  # no stage: the stage of its first reader (0)
    with g.stage(0):
        h = ops.relu(ops.matmul(pre, g.constant(W)))
    with g.stage(1):
        y = ops.tanh(h)
    g.output(y, ops.sigmoid(h), names=["y", "z"])  # sigmoid: no reader, the last stage
    return g


def test_stages_propagate_upstream_and_to_the_tail():
    g = staged()
    assert has_stages(g) and not has_stages(geode.Graph("empty"))
    st = assign_stages(g)
    by_op = {n.op_type: st[n.name] for n in g.nodes}
    assert by_op == {"Exp": 0, "MatMul": 0, "Relu": 0, "Tanh": 1, "Sigmoid": 1}


def test_split_stages_inputs_and_outputs():
    stages = split_stages(staged())
    assert [s.index for s in stages] == [0, 1]
    first, second = stages
    assert first.inputs == ["x"] and first.outputs == ["relu_2"]
    assert second.inputs == ["relu_2"] and second.outputs == ["y", "z"]
    assert [v.name for v in second.graph.inputs] == ["relu_2"]
    assert str(second.graph.inputs[0].desc) == "float32[N, 8]"
    assert [n.op_type for n in first.graph.nodes] == ["Exp", "MatMul", "Relu"]
    assert first.graph.nodes[1].inputs[1].is_constant  # constants stay constants


def test_a_stage_may_not_read_a_later_one():
    g = geode.Graph("back")
    x = g.input("x", [4])
    with g.stage(1):
        a = ops.exp(x)
    with g.stage(0):
        b = ops.tanh(a)
    g.output(b, names=["y"])
    with pytest.raises(
        GraphError, match=r"node 'tanh' \(Tanh\) in stage 0 reads 'exp_0' of stage 1"
    ):
        assign_stages(g)


def test_bad_stage_ids():
    g = geode.Graph("bad")
    for bad in (-1, 1.5, True, "0"):
        with pytest.raises(GraphError, match="a stage is an int >= 0"), g.stage(bad):
            pass


def test_binary_cut_after_the_data_dependent_op():
    g = geode.Graph("b")
    x = g.input("x", ["N", 8])
    a = ops.exp(x)
    c = ops.cast(ops.non_zero(a > 1.0), to=1)
    g.output(ops.sigmoid(c) * ops.reduce_sum(a, axes=[0, 1], keepdims=1), a, names=["y", "a"])
    cut = binary_cut(g)
    assert cut.origins == ["nonzero"]
    head_ops = sorted(n.op_type for n in cut.head.nodes)
    assert head_ops == ["Exp", "Greater", "NonZero", "ReduceSum"]
    assert sorted(n.op_type for n in cut.tail.nodes) == ["Cast", "Mul", "Sigmoid"]
    assert cut.crossing == ["nonzero_2", "reducesum_6"]
    assert [v.name for v in cut.head.outputs] == ["nonzero_2", "reducesum_6", "a"]
    assert [v.name for v in cut.tail.outputs] == ["y"]
    fixed = with_input_shapes(cut.tail, {"nonzero_2": (2, 5), "reducesum_6": (1, 1)})
    assert [v.shape for v in fixed.inputs] == [(2, 5), (1, 1)]
    assert str(cut.tail.inputs[0].desc) == "int64[2, _nnz0]"


def test_no_cut_without_data_dependent_ops():
    g = geode.Graph("static")
    x = g.input("x", ["N", 8])
    g.output(ops.exp(x), names=["y"])
    assert binary_cut(g) is None
