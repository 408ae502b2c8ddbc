"""The fold_bn pass (compiler/passes/fold_bn.py): BatchNormalization, and per-channel
constant Mul/Add, folded into the Conv before them; what is left alone."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import geode
from geode.compiler.passes.fold_bn import fold_batch_norm
from geode.compiler.pipeline import run_pipeline

RNG = np.random.default_rng(0)


def rand(*shape, dtype=np.float32, positive=False):
    v = RNG.random(shape) + 0.5 if positive else RNG.standard_normal(shape)
    return v.astype(dtype)


def bn_params(m: int, dtype=np.float32) -> list[np.ndarray]:
    """scale, shift, mean, variance."""
    return [
        rand(m, dtype=dtype),
        rand(m, dtype=dtype),
        rand(m, dtype=dtype),
        rand(m, dtype=dtype, positive=True),
    ]


def conv_bn_graph(
    dtype=np.float32, bias=True, eps=1e-5, relu=True, spatial=2, conv_attrs=None
) -> geode.Graph:
    """x -> Conv -> BatchNormalization [-> Relu]."""
    g = geode.Graph("cbn")
    sp = ["H", "W"][:spatial] if spatial == 2 else ["L"]
    x = g.input("x", ["N", 4, *sp], dtype)
    ws = (6, 4, *([3] * spatial))
    conv_in = [x, g.constant(rand(*ws, dtype=dtype))]
    if bias:
        conv_in.append(g.constant(rand(6, dtype=dtype)))
    y = g.op("Conv", *conv_in, pads=[1] * (2 * spatial), **(conv_attrs or {}), name="conv")
    z = g.op("BatchNormalization", y, *map(g.constant, bn_params(6, dtype)), epsilon=eps, name="bn")
    g.output(geode.ops.relu(z) if relu else z, names=["out"])
    return g


#: the conv's epilogue left as its own nodes (fuse_conv's tests: tests/compiler/test_fuse_conv.py)
APART = ["fuse_conv"]


def ops_after(g: geode.Graph, **kw) -> list[str]:
    h = g.copy()
    run_pipeline(h, disabled=APART, **kw)
    return [n.op_type for n in h.nodes]


def compare(
    g: geode.Graph, feeds: dict, tol: float
) -> tuple[geode.CompiledModel, geode.CompiledModel]:
    """Folded and unfolded compiles of ``g`` agree; returns both."""
    folded = geode.compile(g, disabled_passes=APART)
    plain = geode.compile(g, disabled_passes=["fold_bn", *APART])
    a, b = folded(**feeds)["out"], plain(**feeds)["out"]
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol)
    return folded, plain


@pytest.mark.parametrize("dtype, tol", [(np.float32, 1e-5), (np.float64, 1e-12)])
@pytest.mark.parametrize("bias", [True, False])
def test_batch_norm_folds_into_the_conv(dtype, tol, bias) -> None:
    g = conv_bn_graph(dtype, bias, eps=1e-3)
    assert ops_after(g) == ["Conv", "Relu"]
    feeds = {"x": rand(2, 4, 7, 9, dtype=dtype)}
    folded, plain = compare(g, feeds, tol)
    ops = lambda m: [[n.op_type for n in k.ops] for k in m.kernels]  # noqa: E731
    assert ops(folded) == [["Conv"], ["Relu"]]  # BN gone: no Mul/Add kernel work
    assert ops(plain) == [["Conv"], ["Mul", "Add", "Relu"]]
    assert "fold_bn: changed (3 -> 2 nodes)" in folded.explain()
    assert "conv_bn" in [n.name for k in folded.kernels for n in k.ops]


def test_batch_norm_alone_after_a_conv_is_one_kernel_fewer() -> None:
    g = conv_bn_graph(relu=False)
    feeds = {"x": rand(1, 4, 5, 6)}
    folded, plain = compare(g, feeds, 1e-5)
    assert [k.kind for k in folded.kernels] == ["library"]
    assert [k.kind for k in plain.kernels] == ["library", "fused"]
    # unfolded, the native conv and the Mul+Add kernel run as one chain of native calls
    assert plain.plan.steps[0].info.get("chain") == ["conv", "fused_1"]


def test_folded_conv_matches_onnx_reference_with_a_large_epsilon() -> None:
    """epsilon is read at float32 precision, as ONNX's attributes are: a large epsilon
    and tiny variances make it count."""
    w, b = rand(5, 3, 3, 3), rand(5)
    s, sh, mean = rand(5), rand(5), rand(5)
    var = (RNG.random(5) * 1e-3).astype(np.float32)
    inits = [numpy_helper.from_array(a, n) for a, n in zip((w, b, s, sh, mean, var), "wbsomv")]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[2, 1]),
        helper.make_node("BatchNormalization", ["c", "s", "o", "m", "v"], ["y"], epsilon=0.1),
    ]
    graph = helper.make_graph(
        nodes,
        "cbn",
        [helper.make_tensor_value_info("x", 1, ["N", 3, 8, 7])],
        [helper.make_tensor_value_info("y", 1, None)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    compiled = geode.compile(model)
    assert [n.op_type for k in compiled.kernels for n in k.ops] == ["Conv"]
    x = rand(2, 3, 8, 7)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    np.testing.assert_allclose(compiled(x=x)["y"], want, rtol=1e-5, atol=1e-5)


def test_one_dimensional_and_grouped_convs_fold() -> None:
    g1 = conv_bn_graph(spatial=1)
    assert ops_after(g1) == ["Conv", "Relu"]
    compare(g1, {"x": rand(2, 4, 11)}, 1e-5)
    g2 = geode.Graph("grouped")
    x = g2.input("x", ["N", 4, "H", "W"])
    y = g2.op("Conv", x, g2.constant(rand(6, 2, 3, 3)), pads=[1, 1, 1, 1], group=2, strides=[2, 2])
    z = g2.op("BatchNormalization", y, *map(g2.constant, bn_params(6)))
    g2.output(geode.ops.relu(z), names=["out"])
    assert ops_after(g2) == ["Conv", "Relu"]
    compare(g2, {"x": rand(1, 4, 6, 6)}, 1e-5)


def test_per_channel_mul_and_add_fold() -> None:
    """Conv * c + d with per-channel constants (the decomposed BN's form) folds too."""
    g = geode.Graph("affine")
    x = g.input("x", ["N", 4, "H", "W"])
    y = g.op("Conv", x, g.constant(rand(6, 4, 3, 3)), pads=[1, 1, 1, 1])
    y = g.constant(rand(6, 1, 1)) * y
    y = y + g.constant(rand(1, 6, 1, 1))
    g.output(y + g.constant(np.float32(0.5)), names=["out"])  # a scalar is per-channel too
    assert ops_after(g) == ["Conv"]
    compare(g, {"x": rand(2, 4, 5, 5)}, 1e-5)


def test_weights_shared_with_another_conv_stay_unchanged_there() -> None:
    g = geode.Graph("shared")
    x = g.input("x", ["N", 4, "H", "W"])
    w = g.constant(rand(6, 4, 3, 3))
    a = g.op("Conv", x, w, pads=[1, 1, 1, 1])
    bn = g.op("BatchNormalization", a, *map(g.constant, bn_params(6)))
    b = g.op("Conv", x, w, strides=[2, 2])
    g.output(bn, b, names=["out", "other"])
    assert sorted(ops_after(g)) == ["Conv", "Conv"]
    feeds = {"x": rand(1, 4, 6, 6)}
    folded, plain = compare(g, feeds, 1e-5)
    np.testing.assert_allclose(folded(**feeds)["other"], plain(**feeds)["other"], rtol=1e-6)


def _left_alone(g: geode.Graph) -> None:
    h = g.copy()
    assert not fold_batch_norm(h)
    assert [n.op_type for n in h.nodes] == [n.op_type for n in g.nodes]


def test_conv_output_read_elsewhere_is_not_folded() -> None:
    g = geode.Graph("used")
    x = g.input("x", ["N", 4, 5, 5])
    y = g.op("Conv", x, g.constant(rand(6, 4, 3, 3)))
    z = g.op("BatchNormalization", y, *map(g.constant, bn_params(6)))
    g.output(z, geode.ops.relu(y), names=["out", "pre"])
    _left_alone(g)
    g2 = geode.Graph("output")
    x2 = g2.input("x", ["N", 4, 5, 5])
    y2 = g2.op("Conv", x2, g2.constant(rand(6, 4, 3, 3)))
    z2 = g2.op("BatchNormalization", y2, *map(g2.constant, bn_params(6)))
    g2.output(z2, y2, names=["out", "conv"])
    _left_alone(g2)
    compare(g, {"x": rand(2, 4, 5, 5)}, 1e-5)


def test_non_constant_parts_are_not_folded() -> None:
    g = geode.Graph("stats")  # statistics given at run time
    x = g.input("x", ["N", 4, 5, 5])
    y = g.op("Conv", x, g.constant(rand(6, 4, 3, 3)))
    p = bn_params(6)
    mean = g.input("mean", [6])
    g.output(
        g.op("BatchNormalization", y, g.constant(p[0]), g.constant(p[1]), mean, g.constant(p[3])),
        names=["out"],
    )
    _left_alone(g)
    g2 = geode.Graph("weights")  # weights given at run time
    x2 = g2.input("x", ["N", 4, 5, 5])
    y2 = g2.op("Conv", x2, g2.input("w", [6, 4, 3, 3]))
    g2.output(g2.op("BatchNormalization", y2, *map(g2.constant, p)), names=["out"])
    _left_alone(g2)
    g3 = geode.Graph("variable")  # trainable weights: a variable, not a constant
    x3 = g3.input("x", ["N", 4, 5, 5])
    y3 = g3.op("Conv", x3, g3.variable(rand(6, 4, 3, 3), "w"))
    g3.output(g3.op("BatchNormalization", y3, *map(g3.constant, p)), names=["out"])
    _left_alone(g3)
    g4 = geode.Graph("spatial")  # a constant varying along W is not per channel
    x4 = g4.input("x", ["N", 4, 5, 5])
    y4 = g4.op("Conv", x4, g4.constant(rand(6, 4, 3, 3)))
    g4.output(y4 * g4.constant(rand(1, 1, 1, 3)), names=["out"])
    _left_alone(g4)


def test_float16_is_not_folded() -> None:
    """Rounding folded weights to float16 would lose what the float32 arithmetic of
    the unfolded graph keeps."""
    _left_alone(conv_bn_graph(np.float16))
