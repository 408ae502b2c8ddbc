"""Bucketed clones and the padding analysis (``compiler/partition/multi_batch.py``)."""

import numpy as np
import pytest

import geode
from geode import config, ops
from geode.compiler.partition.multi_batch import (
    dim_sites,
    input_dim_names,
    output_axes,
    padding_blockers,
    specialize,
)
from geode.compiler.pipeline import run_pipeline
from geode.errors import GeodeError, ShapeError


def after_passes(g):
    g = g.copy()
    g.infer_shapes()
    run_pipeline(g)
    g.sort()
    return g


def blockers(g, name="batch"):
    return padding_blockers(after_passes(g), name)


def graph_of(body, dims=("batch", 16)):
    g = geode.Graph("g")
    x = g.input("x", list(dims))
    g.output(body(g, x), names=["y"])
    return g


W = np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32)


def test_specialize_fixes_the_dim_in_inputs_and_constraints():
    g = geode.Graph("two")
    g.input("x", ["batch", 16])
    y = g.input("y", ["batch", "seq"])
    g.output(ops.exp(y), names=["z"])
    s = specialize(g, {"batch": 4})
    assert s.name == "two@batch=4"
    assert [v.shape for v in s.inputs][0] == (4, 16)
    assert s.inputs[1].shape[0] == 4 and str(s.inputs[1].shape[1]) == "seq"
    assert g.inputs[0].shape[0] != 4  # the original is unchanged
    assert input_dim_names(g) == ["batch", "seq"]


def test_specialize_refuses_a_size_a_constraint_forbids():
    g = geode.Graph("c")
    g.input("x", ["batch", 16])
    g.symbols.constraints.append((g.symbols.named_dim("batch"), 3, "node 'r' (Reshape)"))
    with pytest.raises(ShapeError, match=r"bucket batch=4 of graph 'c': .*is 4 == 3"):
        specialize(g, {"batch": 4})


def test_dim_sites_and_unknown_names():
    g = geode.Graph("s")
    g.input("a", ["batch", 16])
    g.input("b", [3, "batch"])
    assert dim_sites(g, "batch") == [("a", 0), ("b", 1)]
    with pytest.raises(GeodeError, match=r"'bach' is not a dim of graph 's'.*: batch\)"):
        dim_sites(g, "bach")


def test_row_wise_mlp_and_softmax_over_features_pad():
    g = graph_of(lambda g, x: ops.softmax(ops.relu(ops.matmul(x, g.constant(W))), axis=-1))
    assert blockers(g) == []
    assert output_axes(after_passes(g), "batch") == {"y": 0}


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (lambda g, x: x - ops.reduce_mean(x, axes=[0], keepdims=1), "reduces over batch"),
        (lambda g, x: ops.softmax(x, axis=0), "reduces over batch"),
        (lambda g, x: ops.matmul(ops.transpose(x, perm=[1, 0]), x), "contracts over batch"),
        (lambda g, x: ops.reshape(x, [-1]), "merges it with other dims"),
        (lambda g, x: ops.concat(x, x, axis=0), "merges it with other dims"),
        (lambda g, x: ops.cum_sum(x, g.constant(np.array(0))), "CumSum is not known"),
        (
            lambda g, x: x / ops.cast(ops.shape(x), to=1)[0],
            "uses the size of batch as a value",
        ),
    ],
)
def test_ops_that_mix_rows_refuse_padding(body, why):
    problems = blockers(graph_of(body))
    assert problems and any(why in p for p in problems), problems


def test_gather_along_the_dim_refuses_and_across_it_pads():
    idx = np.array([0, 2], np.int64)
    along = graph_of(lambda g, x: ops.gather(x, g.constant(idx), axis=0))
    assert any("gathers along batch" in p for p in blockers(along))
    across = graph_of(lambda g, x: ops.gather(x, g.constant(idx), axis=1))
    assert blockers(across) == []


def test_reshape_keeping_the_dim_pads_through_a_shape_chain():
    def body(g, x):
        s = ops.shape(x)  # [batch, 16] -> [batch, 4, 4] through Shape values
        target = ops.concat(ops.unsqueeze(s[0], axes=[0]), g.constant(np.array([4, 4])), axis=0)
        return ops.reduce_sum(ops.reshape(x, target), axes=[2], keepdims=0)

    g = graph_of(body)
    assert blockers(g) == []
    assert output_axes(after_passes(g), "batch") == {"y": 0}


def test_pytorch_transformer_block_pads():
    from geode.api import to_graph

    g = to_graph("tests/data/torch_block.onnx")
    assert blockers(g) == []
    assert output_axes(after_passes(g), "batch") == {"y": 0, "pooled": 0}
    assert any("reduces over seq" in p for p in blockers(g, "seq"))


def test_dynamic_dims_option_is_checked():
    assert config.current(dynamic_dims={"batch": [1, 4]}).dynamic_dims == (("batch", (1, 4)),)
    assert config.current(dynamic_dims="b=1,2;s=3").dynamic_dims == (("b", (1, 2)), ("s", (3,)))
    bad = [
        ({"batch": [4, 1]}, "positive and increasing, got \\[4, 1\\]"),
        ({"batch": [0, 2]}, "positive and increasing"),
        ({"batch": [2, 2]}, "positive and increasing"),
        ({"batch": []}, "dim 'batch' has no sizes"),
        ({"batch": [1.5]}, "must be ints"),
        ("batch", "expected name=size"),
        ("batch=1,x", "must be ints"),
        ({"a": list(range(1, 9)), "b": list(range(1, 10))}, "72 bucketed variants"),
    ]
    for value, msg in bad:
        with pytest.raises(config.OptionError, match=msg):
            config.current(dynamic_dims=value)
