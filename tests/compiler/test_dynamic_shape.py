"""The known/unknown-shape split (``compiler/partition/dynamic_shape.py``): why each node
is unknown-shape, path absorption, and partitions merged without cycles."""

import geode
from geode import ops
from geode.compiler.partition.dynamic_shape import KNOWN, UNKNOWN, cluster
from geode.compiler.partition.placement import place
from geode.compiler.pipeline import run_pipeline


def placed(graph):
    g = graph.copy()
    g.infer_shapes()
    run_pipeline(g)
    g.sort()
    return g, place(g)


def by_op(g, op_type):
    return [n.name for n in g.nodes if n.op_type == op_type]


def test_reasons_name_the_node_that_binds_the_size():
    gr = geode.Graph("nz")
    x = gr.input("x", ["N", 8])
    c = ops.cast(ops.transpose(ops.non_zero(x), perm=[1, 0]), to=1)
    gr.output(ops.exp(c), names=["y"])
    g, p = placed(gr)
    (nz,) = by_op(g, "NonZero")
    assert p.unknown_reason[nz].startswith("its output's size depends on its input values")
    (exp,) = by_op(g, "Exp")
    assert p.unknown_reason[exp].endswith("bound at run time by node 'nonzero' (NonZero)")
    assert [kind for kind, _ in p.partitions] == [UNKNOWN]
    text = p.describe()
    assert "unknown shape: its output's size depends on its input values" in text


def test_known_shape_graph_has_one_known_partition_and_no_reasons():
    gr = geode.Graph("static")
    x = gr.input("x", ["N", 8])
    gr.output(ops.tanh(ops.exp(x) * 2.0), names=["y"])
    g, p = placed(gr)
    assert p.unknown_reason == {}
    assert p.partitions == [(KNOWN, [n.name for n in g.nodes])]


def test_a_static_island_between_dynamic_nodes_is_absorbed():
    gr = geode.Graph("island")
    x = gr.input("x", ["N", 8])
    c = ops.cast(ops.non_zero(x), to=1)  # [2, K]
    s = ops.reduce_sum(c, axes=[1], keepdims=1)  # [2, 1]: reads K
    t = ops.sigmoid(s) + 1.0  # [2, 1]: known, between two unknown nodes
    gr.output(ops.cast(ops.non_zero(t), to=1), names=["z"])
    g, p = placed(gr)
    (sig,) = by_op(g, "Sigmoid")
    assert p.unknown_reason[sig].startswith("on a path between unknown-shape nodes")
    assert "'reducesum'" in p.unknown_reason[sig]
    assert [kind for kind, _ in p.partitions] == [UNKNOWN]


def test_partitions_never_merge_around_a_cycle():
    # a -> (dynamic region) -> b and a -> b: a and b are both known-shape, but one
    # partition holding both would depend on the dynamic one and feed it
    gr = geode.Graph("cycle")
    x = gr.input("x", ["N", 8])
    a = ops.exp(x)
    u = ops.reduce_sum(ops.cast(ops.non_zero(a), to=1), axes=[0, 1], keepdims=1)  # [1, 1]
    gr.output(a * u, names=["b"])
    g, p = placed(gr)
    kinds = [kind for kind, _ in p.partitions]
    assert kinds == [KNOWN, UNKNOWN, KNOWN]
    first, dynamic, last = (names for _, names in p.partitions)
    assert first == by_op(g, "Exp") and last == by_op(g, "Mul")
    assert set(dynamic) == {n.name for n in g.nodes} - set(first) - set(last)
    assert p.partition_of()[last[0]] == 2


def test_cluster_order_is_topological_and_covers_every_node():
    gr = geode.Graph("two")
    x = gr.input("x", ["N", 8])
    y = gr.input("y", [4])
    k = ops.cast(ops.non_zero(y), to=1)
    gr.output(ops.exp(x), ops.exp(k), names=["a", "b"])
    g, p = placed(gr)
    parts = cluster(g, p.unknown_shape)
    seen = [n for _, names in parts for n in names]
    assert sorted(seen) == sorted(n.name for n in g.nodes)
    pos = {n: i for i, (_, names) in enumerate(parts) for n in names}
    for node in g.nodes:
        for v in node.inputs:
            if v is not None and v.producer is not None:
                assert pos[v.producer.name] <= pos[node.name]
