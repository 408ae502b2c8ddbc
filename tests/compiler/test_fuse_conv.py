"""The fuse_conv pass (compiler/passes/fuse_conv.py) and the FusedConv op: Conv (+
BatchNorm folded) + Add + Relu, and a MaxPool after it, as one native kernel; results
against the unfused graph on the reference engine; what is left alone."""

from __future__ import annotations

import numpy as np
import pytest

import geode
from geode.compiler.fusion.conv_profit import pool_recompute
from geode.compiler.ops.nn import conv_nd, fused_conv, max_pool_nd
from geode.compiler.pipeline import run_pipeline

RNG = np.random.default_rng(0)


def rand(*shape, dtype=np.float32, positive=False):
    v = RNG.random(shape) + 0.5 if positive else RNG.standard_normal(shape)
    return v.astype(dtype)


def conv(g, x, cin, cout, dtype=np.float32, bn=True, k=3, **attrs):
    """Conv (pads 1 for a 3x3) [-> BatchNormalization with constant statistics]."""
    w = g.constant(rand(cout, cin, k, k, dtype=dtype) * 0.3)
    pads = [k // 2] * 4
    y = g.op("Conv", x, w, pads=pads, **attrs)
    if bn:
        params = [rand(cout, dtype=dtype), rand(cout, dtype=dtype), rand(cout, dtype=dtype)]
        params.append(rand(cout, dtype=dtype, positive=True))
        y = g.op("BatchNormalization", y, *map(g.constant, params))
    return y


def resnet_block(dtype=np.float32) -> geode.Graph:
    """stem conv+BN+Relu+MaxPool, then relu(x + conv(relu(conv(x))))."""
    g = geode.Graph("block")
    x = g.input("x", ["N", 3, "H", "W"], dtype)
    s = g.op("Relu", conv(g, x, 3, 8, dtype))
    p = g.op("MaxPool", s, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    a = g.op("Relu", conv(g, p, 8, 8, dtype))
    out = g.op("Relu", g.op("Add", p, conv(g, a, 8, 8, dtype)))
    g.output(out, names=["out"])
    return g


def ops_after(g: geode.Graph, **kw) -> list[str]:
    h = g.copy()
    run_pipeline(h, **kw)
    return [n.op_type for n in h.nodes]


@pytest.mark.parametrize("dtype, tol", [(np.float32, 1e-4), (np.float64, 1e-10)])
def test_resnet_block_is_three_conv_kernels(dtype, tol) -> None:
    """Conv+BN+Relu+MaxPool, Conv+BN+Relu and Conv+BN+Add+Relu: one kernel each, all
    on the direct kernel, the same results as the reference engine."""
    g = resnet_block(dtype)
    assert ops_after(g) == ["FusedConv", "FusedConv", "FusedConv"]
    m = geode.compile(g)
    assert [[n.op_type for n in k.ops] for k in m.kernels] == [["FusedConv"]] * 3
    text = m.explain()
    assert "direct register-blocked kernel + relu + max pool, native" in text
    assert "direct register-blocked kernel + residual add + relu, native" in text
    ref = geode.compile(g, codegen=False, disabled_passes=["fuse_conv", "fold_bn"])
    for shape in ((2, 3, 13, 17), (1, 3, 8, 8), (0, 3, 9, 9)):
        x = rand(*shape, dtype=dtype)
        got, want = m(x=x)["out"], ref(x=x)["out"]
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def test_im2col_option_keeps_the_epilogue_fused() -> None:
    """conv_method="im2col": the same kernels (the epilogue a pass after the GEMMs;
    the pooled stem stays direct), the same results."""
    g = resnet_block()
    m = geode.compile(g, conv_method="im2col")
    assert len(m.kernels) == 3
    assert "im2col + BLAS GEMM + residual add + relu, native" in m.explain()
    x = rand(2, 3, 12, 10)
    np.testing.assert_allclose(m(x=x)["out"], geode.compile(g)(x=x)["out"], rtol=1e-4, atol=1e-4)


def test_fused_conv_reference_kernel() -> None:
    """The op's reference: maxpool(relu(conv + z))."""
    x, w, b = rand(2, 4, 9, 9), rand(6, 4, 3, 3), rand(6)
    attrs = {"pads": [1, 1, 1, 1]}
    z = rand(2, 6, 9, 9)
    want = np.maximum(conv_nd(x, w, b, attrs) + z, 0)
    np.testing.assert_allclose(fused_conv(x, w, b, z, {**attrs, "activation": "Relu"}), want)
    pooled = {**attrs, "pool_kernel": [2, 2], "pool_strides": [2, 2], "pool_pads": [0, 0, 0, 0]}
    want = max_pool_nd(conv_nd(x, w, b, attrs), {"kernel_shape": [2, 2], "strides": [2, 2]})[0]
    np.testing.assert_allclose(fused_conv(x, w, b, None, pooled), want)


def _graph(build) -> geode.Graph:
    g = geode.Graph("g")
    x = g.input("x", [1, 4, 8, 8], np.float32)
    outs = build(g, x)
    g.output(*outs, names=[f"o{i}" for i in range(len(outs))])
    return g


@pytest.mark.parametrize(
    "build, ops",
    [
        # the conv's output read twice: nothing fused
        (lambda g, x: [g.op("Relu", y := conv(g, x, 4, 4, bn=False)), y], ["Conv", "Relu"]),
        # a broadcast residual is not Z
        (
            lambda g, x: [g.op("Relu", g.op("Add", conv(g, x, 4, 4), g.constant(rand(4, 8, 8))))],
            ["Conv", "Add", "Relu"],
        ),
        # a residual without Relu still fuses
        (lambda g, x: [g.op("Add", conv(g, x, 4, 4), x)], ["FusedConv"]),
        # a MaxPool with ceil_mode stays apart
        (
            lambda g, x: [
                g.op("MaxPool", g.op("Relu", conv(g, x, 4, 4)), kernel_shape=[2, 2], ceil_mode=1)
            ],
            ["FusedConv", "MaxPool"],
        ),
        # a depthwise conv takes its Relu but not the pool
        (
            lambda g, x: [
                g.op(
                    "MaxPool",
                    g.op("Relu", g.op("Conv", x, g.constant(rand(4, 1, 3, 3)), group=4)),
                    kernel_shape=[2, 2],
                )
            ],
            ["FusedConv", "MaxPool"],
        ),
    ],
)
def test_what_is_left_alone(build, ops) -> None:
    g = _graph(build)
    assert ops_after(g) == ops
    m, ref = geode.compile(g), geode.compile(g, codegen=False, disabled_passes=["fuse_conv"])
    x = rand(1, 4, 8, 8)
    for k, v in ref(x=x).items():
        np.testing.assert_allclose(m(x=x)[k], v, rtol=1e-4, atol=1e-4)


def test_pass_can_be_disabled() -> None:
    g = resnet_block()
    assert "FusedConv" not in ops_after(g, disabled=["fuse_conv"])
    assert "fuse_conv: changed" in geode.compile(g).explain()


def test_fused_convs_survive_a_model_file(tmp_path) -> None:
    """A saved model's FusedConv kernels (their specs with the epilogue) load and give
    the same results."""
    g = resnet_block()
    m = geode.compile(g)
    m.save(tmp_path / "block.geode")
    loaded = geode.load(tmp_path / "block.geode")
    x = rand(2, 3, 13, 17)
    np.testing.assert_array_equal(loaded(x=x)["out"], m(x=x)["out"])
    assert len(loaded.kernels) == 3


def test_explain_shows_each_decision_and_its_reason() -> None:
    """Every conv fusion decision is in the fusion plan's text: taken ones with the cost
    model's reason, refused ones with the legality rule that refused them."""
    g = resnet_block()
    text = geode.compile(g).explain()
    assert "+ Relu (conv_epilogue) -> FusedConv: fuse: saves" in text
    assert "+ residual Add + Relu (conv_epilogue) -> FusedConv: fuse: saves" in text
    assert "(conv_pool) -> FusedConv: fuse: saves" in text
    g = _graph(
        lambda g, x: [
            g.op("MaxPool", g.op("Relu", conv(g, x, 4, 4)), kernel_shape=[2, 2], ceil_mode=1)
        ]
    )
    text = geode.compile(g).explain()
    assert "keep apart: illegal: the MaxPool has ceil_mode or a storage order" in text


def _pooled_after_conv(batch: int) -> geode.Graph:
    """Relu(Conv 64->64 3x3) over 16x16 maps, then a stride-1 3x3 MaxPool."""
    g = geode.Graph("pooled")
    x = g.input("x", [batch, 64, 16, 16], np.float32)
    y = g.op("Relu", conv(g, x, 64, 64, bn=False))
    g.output(g.op("MaxPool", y, kernel_shape=[3, 3], pads=[1, 1, 1, 1]), names=["out"])
    return g


def test_cost_model_refuses_a_pool_that_recomputes_the_conv() -> None:
    """A stride-1 pool over a small map cut into bands of 2 rows would compute most conv
    rows twice: the cost model keeps it apart (and says why); 16 images give bands of
    the whole map and no recompute: fused. Both as the reference engine computes."""
    small, large = _pooled_after_conv(1), _pooled_after_conv(16)
    assert pool_recompute(*_conv_and_pool(small)) == pytest.approx(30 / 16)
    assert pool_recompute(*_conv_and_pool(large)) == 1.0
    assert ops_after(small) == ["FusedConv", "MaxPool"]
    assert ops_after(large) == ["FusedConv"]
    for g in (small, large):
        m = geode.compile(g)
        ref = geode.compile(g, codegen=False, disabled_passes=["fuse_conv"])
        x = rand(*g.inputs[0].shape)
        np.testing.assert_allclose(m(x=x)["out"], ref(x=x)["out"], rtol=1e-4, atol=1e-4)
    text = geode.compile(small).explain()
    assert "(conv_pool): keep apart: recompute of 1.88x expands flops" in text


def _conv_and_pool(g: geode.Graph):
    h = g.copy()
    run_pipeline(h, disabled=["fuse_conv"])
    conv_node = next(n for n in h.nodes if n.op_type == "Conv")
    return conv_node, next(n for n in h.nodes if n.op_type == "MaxPool")


def test_decisions_are_recorded_by_the_pipeline() -> None:
    """run_pipeline hands the fuse_conv pass a mapping it fills: one line per node."""
    decisions: dict[str, str] = {}
    run_pipeline(resnet_block().copy(), decisions=decisions)
    assert len(decisions) == 4  # stem Relu, its MaxPool, the middle Relu, the Add's Relu
    assert all(": fuse: " in line for line in decisions.values())


def test_a_symbolic_shape_says_its_figures_are_nominal() -> None:
    """With a symbolic batch the cost model's figures are at a nominal size, and the
    reason says so; with every size known it does not."""
    for batch, nominal in (("N", True), (2, False)):
        g = geode.Graph("sym")
        x = g.input("x", [batch, 4, 8, 8], np.float32)
        g.output(g.op("Relu", conv(g, x, 4, 4)), names=["out"])
        text = geode.compile(g).explain()
        assert "(conv_epilogue) -> FusedConv: fuse: saves" in text
        assert ("(symbolic dims taken as 512)" in text) is nominal, text
