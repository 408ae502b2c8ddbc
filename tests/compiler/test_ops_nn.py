"""Conformance tests of the nn ops (geode/compiler/ops/nn.py) against ONNX.

Every case goes through ``opcheck.check_op``: geode's reference kernel against
``onnx.reference.ReferenceEvaluator`` and the inferred (symbolic or static) shape
against the kernel's output. Where the evaluator itself is wrong for a case (listed at
each use) the values are compared with an explicit numpy expectation written here from
the ONNX operator spec instead; dtypes and inferred shapes are still checked.
"""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pytest
import sympy
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from opcheck import assert_close, check_op, onnx_node_cases, run_onnx_node_case

import geode
from geode.compiler.ops import registry
from geode.compiler.ops.registry import OpKind
from geode.compiler.shapes import sym
from geode.errors import DTypeError, ShapeError, VerifyError

RNG = np.random.default_rng(1234)
FLOATS = [np.float16, np.float32, np.float64]


def rand(shape, dtype=np.float32, lo: int = -4, hi: int = 5) -> np.ndarray:
    """Random data: standard normal for floats, small integers for ints."""
    shape = tuple(shape)
    if np.issubdtype(np.dtype(dtype), np.floating):
        return RNG.standard_normal(shape).astype(dtype)
    if np.issubdtype(np.dtype(dtype), np.unsignedinteger):
        lo = max(lo, 0)
    return RNG.integers(lo, hi, shape).astype(dtype)


def check_expect(op, inputs, attrs, expected, n_outputs=1, **kw):
    """check_op without the evaluator (its answer is wrong here), then an explicit expectation."""
    got = check_op(op, inputs, attrs, n_outputs=n_outputs, compare=False, **kw)
    for i, want in enumerate(expected[:n_outputs]):
        assert_close(got[i], np.asarray(want), f"{op} output {i} vs numpy expectation")
    return got


# -- independent numpy expectations written from the ONNX spec --------------------------------


def _pool_geometry(size, k, s, d, pad_b, pad_e, auto_pad, ceil_mode):
    """Output size and (begin, end) pads of one spatial dim, per the ONNX pooling spec."""
    dk = d * (k - 1) + 1
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = math.ceil(size / s)
        total = max(0, (out - 1) * s + dk - size)
        b = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
        return out, b, total - b
    if auto_pad == "VALID":
        return (size - dk) // s + 1, 0, 0
    a = size + pad_b + pad_e - dk
    out = (math.ceil(a / s) if ceil_mode else a // s) + 1
    if ceil_mode and (out - 1) * s >= size + pad_b:
        out -= 1  # the last window would start in the end padding
    return out, pad_b, pad_e


def naive_pool(
    x,
    kind,
    kernel_shape,
    strides=None,
    dilations=None,
    pads=None,
    auto_pad="NOTSET",
    ceil_mode=0,
    count_include_pad=0,
    p=2,
    storage_order=0,
):
    """Pooling by loops over every output element and window tap."""
    n = len(kernel_shape)
    sp = x.shape[2:]
    strides = strides or [1] * n
    dilations = dilations or [1] * n
    pads = pads or [0] * (2 * n)
    geo = [
        _pool_geometry(
            sp[i],
            kernel_shape[i],
            strides[i],
            dilations[i],
            pads[i],
            pads[n + i],
            auto_pad,
            ceil_mode,
        )
        for i in range(n)
    ]
    out = [g[0] for g in geo]
    begin = [g[1] for g in geo]
    end = [g[2] for g in geo]
    y = np.zeros(x.shape[:2] + tuple(out), dtype=np.float64)
    ind = np.zeros(y.shape, dtype=np.int64)
    for b, c in itertools.product(range(x.shape[0]), range(x.shape[1])):
        for o in itertools.product(*(range(v) for v in out)):
            vals, where, in_padded = [], [], 0
            for kk in itertools.product(*(range(v) for v in kernel_shape)):
                pos = [o[i] * strides[i] + kk[i] * dilations[i] - begin[i] for i in range(n)]
                if all(-begin[i] <= pos[i] < sp[i] + end[i] for i in range(n)):
                    in_padded += 1
                if all(0 <= pos[i] < sp[i] for i in range(n)):
                    vals.append(x[(b, c, *pos)])
                    where.append(pos)
            if kind == "max":
                j = int(np.argmax(vals))
                y[(b, c, *o)] = vals[j]
                flat = np.ravel_multi_index(
                    tuple(where[j]), sp, order="F" if storage_order else "C"
                )
                ind[(b, c, *o)] = (b * x.shape[1] + c) * math.prod(sp) + flat
            elif kind == "avg":
                vv = np.asarray(vals, dtype=np.float64)
                y[(b, c, *o)] = vv.sum() / (in_padded if count_include_pad else len(vals))
            else:
                vv = np.abs(np.asarray(vals, dtype=np.float64))
                y[(b, c, *o)] = (vv**p).sum() ** (1.0 / p)
    return y.astype(x.dtype), ind


def naive_conv_transpose(
    x,
    w,
    b,
    strides=None,
    dilations=None,
    pads=None,
    auto_pad="NOTSET",
    group=1,
    output_padding=None,
    output_shape=None,
):
    """ConvTranspose by its definition: every input element scatters ``x * W`` into the output."""
    n = x.ndim - 2
    sp, ks = x.shape[2:], w.shape[2:]
    strides = strides or [1] * n
    dilations = dilations or [1] * n
    pads = list(pads or [0] * (2 * n))
    op = output_padding or [0] * n
    out, begin = [], []
    for i in range(n):
        full = strides[i] * (sp[i] - 1) + op[i] + (ks[i] - 1) * dilations[i] + 1
        if output_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            o = output_shape[i] if output_shape is not None else sp[i] * strides[i]
            total = max(0, full - o)
            begin.append(total // 2 if auto_pad == "SAME_UPPER" else total - total // 2)
        else:
            if auto_pad == "VALID":
                pads = [0] * (2 * n)
            o = full - pads[i] - pads[n + i]
            begin.append(pads[i])
        out.append(o)
    cg, mg = x.shape[1] // group, w.shape[1]
    y = np.zeros((x.shape[0], mg * group, *out), dtype=np.float64)
    for bb, ci in itertools.product(range(x.shape[0]), range(x.shape[1])):
        g = ci // cg
        for i in itertools.product(*(range(v) for v in sp)):
            for kk in itertools.product(*(range(v) for v in ks)):
                pos = [i[d] * strides[d] + kk[d] * dilations[d] - begin[d] for d in range(n)]
                if all(0 <= pos[d] < out[d] for d in range(n)):
                    y[(bb, slice(g * mg, (g + 1) * mg), *pos)] += (
                        x[(bb, ci, *i)] * w[(ci, slice(None), *kk)]
                    )
    if b is not None:
        y += b.reshape((1, -1) + (1,) * n)
    return y.astype(x.dtype)


def naive_lrn(x, size, alpha=1e-4, beta=0.75, bias=1.0):
    """LRN per the spec: sum of squares over channels [c - floor((size-1)/2), c + ceil((size-1)/2)].

    alpha, beta and bias are rounded to float32, as ONNX float attributes are.
    """
    alpha, beta, bias = (float(np.float32(v)) for v in (alpha, beta, bias))
    xd = x.astype(np.float64)
    c_total = x.shape[1]
    sq = np.zeros_like(xd)
    for c in range(c_total):
        lo = max(0, c - (size - 1) // 2)
        hi = min(c_total - 1, c + math.ceil((size - 1) / 2))
        sq[:, c] = (xd[:, lo : hi + 1] ** 2).sum(axis=1)
    coef = float(np.float32(alpha) / np.float32(size))  # ONNX runtimes divide in float32
    return (xd / (bias + coef * sq) ** beta).astype(x.dtype)


# == kinds and registration ===================================================================


def test_kinds():
    library = [
        "MatMul",
        "Gemm",
        "Conv",
        "ConvTranspose",
        "MaxPool",
        "AveragePool",
        "LpPool",
        "GlobalAveragePool",
        "GlobalMaxPool",
        "Einsum",
    ]
    for op in library:
        assert registry.get(op).kind is OpKind.LIBRARY, op
    for op in ["BatchNormalization", "InstanceNormalization", "LRN", "Dropout"]:
        assert registry.get(op).kind is OpKind.OPAQUE, op
    for od in (registry.get(op) for op in library):
        assert od.doc and od.kernel is not None


# == MatMul ===================================================================================

MATMUL_SHAPES = [
    ((3, 4), (4, 5)),
    ((4,), (4, 5)),
    ((3, 4), (4,)),
    ((4,), (4,)),
    ((2, 3, 4), (4, 5)),
    ((4,), (2, 4, 5)),
    ((2, 3, 4), (4,)),
    ((2, 1, 3, 4), (5, 4, 6)),
    ((1, 3, 4), (2, 1, 4, 6)),
    ((2, 3, 0), (0, 4)),
]


@pytest.mark.parametrize("shapes", MATMUL_SHAPES, ids=str)
@pytest.mark.parametrize("symbolic", [True, False])
def test_matmul_shapes(shapes, symbolic):
    check_op("MatMul", [rand(shapes[0]), rand(shapes[1])], symbolic=symbolic)


@pytest.mark.parametrize("dtype", [*FLOATS, np.int32, np.int64, np.uint32, np.uint64])
def test_matmul_dtypes(dtype):
    check_op("MatMul", [rand((2, 3, 7), dtype), rand((7, 5), dtype)])
    check_op("MatMul", [rand((6,), dtype), rand((6,), dtype)], symbolic=False)


@st.composite
def _batched_matmul_shapes(draw):
    """Two matmul operands with broadcast-compatible (possibly different rank) batch dims."""
    m, k, n = (draw(st.integers(1, 4)) for _ in range(3))
    batch = draw(st.lists(st.integers(1, 3), min_size=0, max_size=3))
    ba = [d if draw(st.booleans()) else 1 for d in batch]
    bb = [d if draw(st.booleans()) else 1 for d in batch]
    ba = ba[draw(st.integers(0, len(ba))) :]
    bb = bb[draw(st.integers(0, len(bb))) :]
    a = (*ba, m, k) if ba or draw(st.booleans()) else (k,)
    b = (*bb, k, n) if bb or draw(st.booleans()) else (k,)
    return a, b


@settings(max_examples=20, deadline=None)
@given(_batched_matmul_shapes(), st.booleans())
def test_matmul_random_batches(shapes, symbolic):
    check_op("MatMul", [rand(shapes[0]), rand(shapes[1])], symbolic=symbolic)


def test_matmul_symbolic_infer():
    g = geode.Graph("mm")
    a = g.input("a", ["B", 1, "M", "K"])
    b = g.input("b", ["H", "K2", "N"])
    y = g.op("MatMul", a, b)
    assert y.shape == (sym("B"), sym("H"), sym("M"), sym("N"))
    assert (sym("K"), sym("K2")) in [(x, z) for x, z, _ in g.symbols.constraints]
    v = g.op("MatMul", g.input("v", ["K"]), g.input("w", ["K", 7]))
    assert v.shape == (7,)


def test_matmul_bad_k():
    g = geode.Graph("mm")
    a, b = g.input("a", [2, 3]), g.input("b", [4, 5])
    with pytest.raises(ShapeError, match=r"'bad_mm'.*MatMul.*3 != 4"):
        g.op("MatMul", a, b, name="bad_mm")


def test_matmul_bad_dtype():
    g = geode.Graph("mm")
    with pytest.raises(DTypeError, match="MatMul"):
        g.op("MatMul", g.input("a", [2, 3], "int8"), g.input("b", [3, 4], "int8"))
    with pytest.raises(DTypeError, match="already float32"):
        g.op("MatMul", g.input("c", [2, 3]), g.input("d", [3, 4], "float64"))


# == Gemm =====================================================================================


@pytest.mark.parametrize("trans", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("ab", [(1.0, 1.0), (0.5, 2.0), (2.0, 0.0)])
@pytest.mark.parametrize("c_shape", [None, (), (5,), (1, 5), (3, 1), (3, 5)], ids=str)
def test_gemm(trans, ab, c_shape):
    m, k, n = 3, 4, 5
    a = rand((k, m) if trans[0] else (m, k))
    b = rand((n, k) if trans[1] else (k, n))
    ins = [a, b] if c_shape is None else [a, b, rand(c_shape)]
    attrs = {"transA": trans[0], "transB": trans[1], "alpha": ab[0], "beta": ab[1]}
    check_op("Gemm", ins, attrs)
    check_op("Gemm", ins, attrs, symbolic=False)


@pytest.mark.parametrize("dtype", [*FLOATS, np.int32, np.int64, np.uint32, np.uint64])
def test_gemm_dtypes(dtype):
    a, b, c = rand((3, 6), dtype), rand((5, 6), dtype), rand((5,), dtype)
    check_op("Gemm", [a, b, c], {"transB": 1, "alpha": 2.0, "beta": 3.0})
    check_op("Gemm", [a, b, c], {"transB": 1, "alpha": 0.5, "beta": 0.25})


def test_gemm_errors():
    g = geode.Graph("gemm")
    with pytest.raises(ShapeError, match="'gemm_k'"):
        g.op("Gemm", g.input("a", [2, 3]), g.input("b", [4, 5]), name="gemm_k")
    with pytest.raises(ShapeError, match="must be 2-D"):
        g.op("Gemm", g.input("c", [2, 3, 1]), g.input("d", [3, 5]))
    with pytest.raises(ShapeError, match="does not broadcast"):
        g.op("Gemm", g.input("e", [2, 3]), g.input("f", [3, 5]), g.input("h", [4]))


# == Conv =====================================================================================

CONV_CASES = [
    # (x shape, w shape, attrs)
    ((1, 3, 7, 7), (4, 3, 3, 3), {}),
    ((2, 3, 7, 8), (4, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 3, 9, 8), (5, 3, 3, 2), {"strides": [2, 3], "pads": [1, 0, 2, 1]}),
    ((1, 2, 9, 9), (4, 2, 3, 3), {"dilations": [2, 2]}),
    ((1, 2, 11, 10), (4, 2, 3, 2), {"dilations": [3, 2], "strides": [2, 1], "pads": [2, 1, 0, 1]}),
    ((2, 4, 6, 6), (6, 2, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}),
    ((1, 4, 6, 6), (4, 1, 3, 3), {"group": 4, "pads": [1, 1, 1, 1]}),  # depthwise
    ((1, 4, 6, 6), (8, 1, 3, 3), {"group": 4, "strides": [2, 2]}),  # depthwise, multiplier 2
    ((1, 3, 5, 5), (2, 3, 1, 1), {}),
    ((1, 3, 5, 5), (2, 3, 5, 5), {}),
    ((1, 3, 6, 7), (4, 3, 3, 3), {"kernel_shape": [3, 3], "strides": [2, 2]}),
    ((2, 3, 9), (4, 3, 3), {"strides": [2], "pads": [1, 2]}),  # 1-D
    ((1, 2, 10), (4, 1, 4), {"group": 2, "dilations": [2]}),  # 1-D grouped
    ((1, 2, 5, 6, 4), (3, 2, 3, 2, 3), {"pads": [1, 0, 1, 1, 1, 0]}),  # 3-D
    ((1, 4, 5, 6, 7), (4, 2, 2, 3, 3), {"group": 2, "strides": [2, 1, 2], "dilations": [1, 2, 1]}),
]


@pytest.mark.parametrize("case", CONV_CASES, ids=str)
@pytest.mark.parametrize("bias", [False, True])
def test_conv(case, bias):
    xs, ws, attrs = case
    ins = [rand(xs), rand(ws)] + ([rand(ws[:1])] if bias else [])
    check_op("Conv", ins, attrs)
    check_op("Conv", ins, attrs, symbolic=False)


@pytest.mark.parametrize("auto_pad", ["NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"])
@pytest.mark.parametrize("sd", [(1, 1), (2, 1), (3, 1), (1, 2), (2, 2)])
@pytest.mark.parametrize("nd", [1, 2, 3])
def test_conv_auto_pad(auto_pad, sd, nd):
    s, d = sd
    xs = (1, 2, *(7, 8, 6)[:nd])
    ws = (3, 2, *(3, 2, 3)[:nd])
    attrs = {"auto_pad": auto_pad, "strides": [s] * nd, "dilations": [d] * nd}
    check_op("Conv", [rand(xs), rand(ws), rand((3,))], attrs)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_conv_dtypes(dtype):
    attrs = {"pads": [1, 1, 1, 1], "strides": [2, 1], "group": 2}
    check_op(
        "Conv", [rand((1, 4, 7, 6), dtype), rand((6, 2, 3, 3), dtype), rand((6,), dtype)], attrs
    )


def test_conv_resnet_size():
    # the ResNet stem-after-pool shape; the kernel is im2col + one matmul, so this is fast
    x, w, b = rand((1, 64, 56, 56)), rand((64, 64, 3, 3)), rand((64,))
    check_op("Conv", [x, w, b], {"pads": [1, 1, 1, 1]}, symbolic=False)


@st.composite
def _conv_config(draw):
    nd = draw(st.integers(1, 2))
    group = draw(st.sampled_from([1, 1, 2, 3]))
    cg, mg = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    ks = [draw(st.integers(1, 3)) for _ in range(nd)]
    strides = [draw(st.integers(1, 3)) for _ in range(nd)]
    dil = [draw(st.integers(1, 2)) for _ in range(nd)]
    pads = [draw(st.integers(0, 2)) for _ in range(2 * nd)]
    sizes = [draw(st.integers(1, 9)) for _ in range(nd)]
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    attrs = {"group": group, "strides": strides, "dilations": dil, "auto_pad": auto_pad}
    if auto_pad == "NOTSET":
        attrs["pads"] = pads
    x = (draw(st.integers(1, 2)), cg * group, *sizes)
    w = (mg * group, cg, *ks)
    return x, w, attrs, draw(st.booleans()), draw(st.booleans())


@settings(max_examples=20, deadline=None)
@given(_conv_config())
def test_conv_random(cfg):
    xs, ws, attrs, bias, symbolic = cfg
    nd = len(xs) - 2
    for i in range(nd):
        dk = attrs["dilations"][i] * (ws[2 + i] - 1) + 1
        pad = sum(attrs["pads"][i::nd]) if "pads" in attrs else 0
        if attrs["auto_pad"] in ("NOTSET", "VALID"):
            assume(xs[2 + i] + pad >= dk)
    ins = [rand(xs), rand(ws)] + ([rand(ws[:1])] if bias else [])
    check_op("Conv", ins, attrs, symbolic=symbolic)


def test_conv_symbolic_dims():
    g = geode.Graph("conv")
    x = g.input("x", ["N", 3, "H", "W"])
    w = g.constant(rand((8, 3, 3, 3)))
    h, wd = sym("H"), sym("W")
    y = g.op("Conv", x, w, pads=[1, 1, 1, 1])  # stride 1: affine, simplified
    assert y.shape == (sym("N"), 8, h, wd)
    y2 = g.op("Conv", x, w, strides=[2, 2], pads=[1, 1, 1, 1])
    assert sympy.simplify(y2.shape[2] - (sympy.floor((h - 1) / 2) + 1)) == 0
    assert [y2.shape[2].subs(h, v) for v in (1, 2, 7, 8)] == [1, 1, 4, 4]
    y3 = g.op("Conv", x, w, strides=[2, 3], auto_pad="SAME_UPPER")
    assert y3.shape[2:] == (sympy.ceiling(h / 2), sympy.ceiling(wd / 3))
    y4 = g.op("Conv", x, w, auto_pad="VALID")
    assert y4.shape[2:] == (h - 2, wd - 2)


def test_conv_channel_mismatch():
    g = geode.Graph("conv")
    x = g.input("x", [1, 3, 8, 8])
    w = g.constant(rand((4, 2, 3, 3)))
    with pytest.raises(ShapeError, match=r"'conv_bad'.*Conv.*channels"):
        g.op("Conv", x, w, name="conv_bad")
    with pytest.raises(ShapeError, match=r"'conv_grp'.*3 != 4"):
        g.op("Conv", x, w, group=2, name="conv_grp")


def test_conv_errors():
    g = geode.Graph("conv")
    x = g.input("x", [1, 3, 4, 4])
    w = g.constant(rand((4, 3, 3, 3)))
    with pytest.raises(ShapeError, match="output size"):
        g.op("Conv", x, g.constant(rand((4, 3, 5, 5))))
    with pytest.raises(VerifyError, match="auto_pad"):
        g.op("Conv", x, w, auto_pad="SAME")
    with pytest.raises(VerifyError, match="strides"):
        g.op("Conv", x, w, strides=[1])
    with pytest.raises(ShapeError, match="bias"):
        g.op("Conv", x, w, g.constant(rand((5,))))
    with pytest.raises(ShapeError, match="same rank"):
        g.op("Conv", x, g.constant(rand((4, 3, 3))))
    with pytest.raises(DTypeError, match="Conv"):
        g.op("Conv", g.input("xi", [1, 3, 4, 4], "int32"), g.constant(rand((4, 3, 3, 3), np.int32)))


# == ConvTranspose ============================================================================

CONVT_CASES = [
    # (x shape, w shape, attrs, trust the evaluator)
    ((1, 3, 4, 5), (3, 2, 3, 3), {}, True),
    ((2, 3, 4, 5), (3, 2, 3, 3), {"strides": [2, 2]}, True),
    ((1, 3, 4, 5), (3, 2, 3, 3), {"strides": [2, 3], "pads": [1, 0, 1, 2]}, True),
    ((1, 3, 4, 5), (3, 2, 3, 2), {"strides": [2, 2], "output_padding": [1, 1]}, True),
    ((1, 2, 4, 4), (2, 3, 3, 3), {"dilations": [2, 2], "strides": [2, 1]}, True),
    ((1, 3, 4, 5), (3, 2, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}, True),
    ((1, 3, 4, 5), (3, 2, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_LOWER"}, True),
    ((1, 3, 4, 5), (3, 2, 3, 3), {"strides": [2, 2], "auto_pad": "VALID"}, True),
    ((1, 3, 6), (3, 2, 3), {"strides": [3], "pads": [1, 2]}, True),  # 1-D
    ((1, 2, 3, 4, 3), (2, 2, 2, 3, 2), {"strides": [2, 1, 2], "pads": [0, 1, 0, 1, 0, 1]}, True),
    # The evaluator's group > 1 path slices W and the output by the wrong channel counts
    # (it raises "cannot reshape" or mixes groups): compare with the explicit scatter.
    ((1, 4, 4, 5), (4, 3, 3, 3), {"group": 2, "strides": [2, 2]}, False),
    ((1, 4, 5), (4, 1, 3), {"group": 4, "pads": [1, 1]}, False),  # depthwise 1-D
    ((2, 6, 3, 3, 2), (6, 1, 2, 2, 2), {"group": 3, "strides": [2, 2, 1]}, False),
    # With output_shape and NOTSET the evaluator ignores the spec's pad rule (pads are
    # derived from output_shape, the larger half at the start) and fails in col2im.
    ((1, 3, 7), (3, 2, 3), {"strides": [2], "output_shape": [12]}, False),
    ((1, 3, 4, 4), (3, 2, 3, 3), {"strides": [2, 2], "output_shape": [8, 10]}, False),
    # SAME with output_shape: the evaluator sizes col2im with the unpadded kernel.
    (
        (1, 3, 4, 4),
        (3, 2, 3, 3),
        {"strides": [3, 3], "auto_pad": "SAME_UPPER", "output_shape": [10, 11]},
        False,
    ),
    # SAME with a negative total padding (stride > kernel): the evaluator pads -1 at the
    # start for SAME_UPPER; geode clamps the total at 0 like onnxruntime, keeping the
    # spec's output size in * stride (the last position is zero).
    ((1, 2, 5), (2, 2, 2), {"strides": [3], "auto_pad": "SAME_UPPER"}, False),
]


@pytest.mark.parametrize("case", CONVT_CASES, ids=str)
@pytest.mark.parametrize("bias", [False, True])
def test_conv_transpose(case, bias):
    xs, ws, attrs, trust = case
    m = ws[1] * attrs.get("group", 1)
    ins = [rand(xs), rand(ws)] + ([rand((m,))] if bias else [])
    if trust:
        check_op("ConvTranspose", ins, attrs)
        check_op("ConvTranspose", ins, attrs, symbolic=False)
    else:
        want = naive_conv_transpose(ins[0], ins[1], ins[2] if bias else None, **attrs)
        check_expect("ConvTranspose", ins, attrs, [want])
        check_expect("ConvTranspose", ins, attrs, [want], symbolic=False)


@pytest.mark.parametrize("case", [c for c in CONVT_CASES if c[3]], ids=str)
def test_conv_transpose_matches_naive(case):
    # the explicit scatter is itself checked where the evaluator is right
    xs, ws, attrs, _ = case
    x, w = rand(xs, np.float64), rand(ws, np.float64)
    want = naive_conv_transpose(x, w, None, **attrs)
    assert_close(registry.get("ConvTranspose").run([x, w], attrs)[0], want)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_conv_transpose_dtypes(dtype):
    ins = [rand((1, 4, 4, 4), dtype), rand((4, 3, 3, 3), dtype), rand((3,), dtype)]
    check_op("ConvTranspose", ins, {"strides": [2, 2], "pads": [1, 1, 0, 0]})


def test_conv_transpose_symbolic():
    g = geode.Graph("ct")
    x = g.input("x", ["N", 4, "H", "W"])
    y = g.op("ConvTranspose", x, g.constant(rand((4, 2, 3, 3))), strides=[2, 2], pads=[1, 1, 1, 1])
    h, w = sym("H"), sym("W")
    assert y.shape == (sym("N"), 2, 2 * h - 1, 2 * w - 1)
    with pytest.raises(ShapeError, match="'ct_bad'"):
        g.op("ConvTranspose", x, g.constant(rand((3, 2, 3, 3))), name="ct_bad")


# == pooling ==================================================================================


def _trust_pool_evaluator(op, attrs, nd):
    """Whether onnx's ReferenceEvaluator gets this pooling case right (see test_pool)."""
    s = attrs.get("strides", [1] * nd)
    d = attrs.get("dilations", [1] * nd)
    ap = attrs.get("auto_pad", "NOTSET")
    ceil = attrs.get("ceil_mode", 0)
    if ap in ("SAME_UPPER", "SAME_LOWER", "VALID") and max(d) > 1:
        return False  # auto_pad output size / pads computed without the dilation
    if op == "MaxPool":
        # all-ones strides and dilations take an older code path with wrong indices
        # (and 1-D/3-D padding); SAME_LOWER uses floor(in / stride) for the output size
        return ap != "SAME_LOWER" and (max(s) > 1 or max(d) > 1)
    # with ceil_mode the extra end padding is split over both ends (shifting windows once
    # it is 2 or more), and LpPool rescales an average that skipped it
    return not (ceil and (max(s) > 2 or op == "LpPool"))


POOL_CASES = [
    {"kernel_shape": [3, 3]},
    {"kernel_shape": [2, 3], "strides": [2, 2]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3, 2], "strides": [2, 3], "pads": [1, 0, 2, 1]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1},
    {"kernel_shape": [2, 2], "strides": [3, 3], "ceil_mode": 1},
    {"kernel_shape": [3, 3], "dilations": [2, 2]},
    {
        "kernel_shape": [2, 3],
        "dilations": [2, 1],
        "strides": [2, 2],
        "pads": [1, 1, 1, 1],
        "ceil_mode": 1,
    },
    {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER"},
    {"kernel_shape": [3, 3], "auto_pad": "SAME_LOWER"},
    {"kernel_shape": [2, 2], "auto_pad": "SAME_UPPER", "strides": [2, 2]},
    {"kernel_shape": [4, 4], "auto_pad": "SAME_LOWER", "strides": [2, 3]},
    {"kernel_shape": [3, 3], "auto_pad": "VALID", "strides": [2, 2]},
    {"kernel_shape": [3, 2], "auto_pad": "SAME_UPPER", "dilations": [2, 2]},
    {"kernel_shape": [3, 3], "auto_pad": "VALID", "dilations": [2, 1]},
    {"kernel_shape": [3], "strides": [2], "pads": [1, 2]},  # 1-D
    {"kernel_shape": [2], "strides": [2], "ceil_mode": 1},
    {"kernel_shape": [3], "auto_pad": "SAME_LOWER", "strides": [2]},
    {"kernel_shape": [2, 2, 2], "strides": [2, 1, 2], "pads": [1, 0, 0, 0, 1, 1]},  # 3-D
    {"kernel_shape": [2, 3, 2], "auto_pad": "SAME_UPPER", "strides": [2, 2, 1]},
]


def _pool_input(attrs, dtype=np.float32):
    nd = len(attrs["kernel_shape"])
    return rand((2, 3, *(7, 8, 5)[:nd]), dtype)


def _check_pool(op, x, attrs, n_outputs=1):
    """Check against the explicit loops always, and against the evaluator where it is right."""
    nd = x.ndim - 2
    kind = {"MaxPool": "max", "AveragePool": "avg", "LpPool": "lp"}[op]
    y, ind = naive_pool(x, kind, **attrs)
    check_expect(op, [x], attrs, [y, ind], n_outputs=n_outputs)
    if _trust_pool_evaluator(op, attrs, nd):
        check_op(op, [x], attrs, n_outputs=n_outputs, symbolic=False)


@pytest.mark.parametrize("attrs", POOL_CASES, ids=str)
@pytest.mark.parametrize("storage_order", [0, 1])
def test_max_pool(attrs, storage_order):
    attrs = dict(attrs, storage_order=storage_order)
    _check_pool("MaxPool", _pool_input(attrs), attrs, n_outputs=2)
    if storage_order == 0:
        check_op("MaxPool", [_pool_input(attrs)], attrs, compare=False, symbolic=False)


@pytest.mark.parametrize("attrs", POOL_CASES, ids=str)
@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_average_pool(attrs, count_include_pad):
    attrs = dict(attrs, count_include_pad=count_include_pad)
    _check_pool("AveragePool", _pool_input(attrs), attrs)


@pytest.mark.parametrize("attrs", POOL_CASES[:9] + POOL_CASES[16:], ids=str)
@pytest.mark.parametrize("p", [1, 2, 3])
def test_lp_pool(attrs, p):
    attrs = dict(attrs, p=p)
    _check_pool("LpPool", _pool_input(attrs), attrs)


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int8, np.uint8])
def test_max_pool_dtypes(dtype):
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    x = rand((1, 2, 6, 7), dtype, lo=-100, hi=100)
    check_op("MaxPool", [x], attrs, n_outputs=2)
    _check_pool("MaxPool", x, attrs, n_outputs=2)


def test_max_pool_ties_and_lowest():
    # ties keep the first tap; int8 -128 inside the input beats the padding
    x = np.full((1, 1, 4, 4), -128, dtype=np.int8)
    x[0, 0, 2, 2] = -127
    attrs = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    y, ind = naive_pool(x, "max", **attrs)
    check_expect("MaxPool", [x], attrs, [y, ind], n_outputs=2)
    got = registry.get("MaxPool").run([x], attrs)
    assert got[1][0, 0, 0, 0] == 0


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_average_pool_dtypes(dtype):
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}
    check_op("AveragePool", [rand((1, 2, 6, 7), dtype)], attrs)
    check_op("LpPool", [rand((1, 2, 6, 7), dtype)], {"kernel_shape": [2, 2], "strides": [2, 2]})


def test_pool_symbolic_dims():
    g = geode.Graph("pool")
    x = g.input("x", ["N", "C", "H", "W"])
    h = sym("H")
    y = g.op("MaxPool", x, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    assert sympy.simplify(y.shape[2] - (sympy.floor((h - 1) / 2) + 1)) == 0
    yc = g.op("AveragePool", x, kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)
    for v in range(3, 20):  # symbolic ceil_mode size matches the static rule
        want = registry.get("AveragePool").run(
            [np.zeros((1, 1, v, 3), np.float32)],
            {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
        )[0]
        assert int(yc.shape[2].subs(h, v)) == want.shape[2]
    ys = g.op("MaxPool", x, kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_LOWER")
    assert ys.shape[2] == sympy.ceiling(h / 2)
    yi = g.op("MaxPool", x, kernel_shape=[3, 3], n_outputs=2)
    assert yi[1].dtype == np.int64 and yi[1].shape == (sym("N"), sym("C"), h - 2, sym("W") - 2)


def test_pool_errors():
    g = geode.Graph("pool")
    x = g.input("x", [1, 2, 5, 5])
    with pytest.raises(VerifyError, match="kernel_shape"):
        g.op("MaxPool", x)
    with pytest.raises(ShapeError, match="rank"):
        g.op("MaxPool", x, kernel_shape=[2])
    with pytest.raises(ShapeError, match="output size"):
        g.op("AveragePool", x, kernel_shape=[6, 6])
    with pytest.raises(ShapeError, match="pads"):
        g.op("AveragePool", x, kernel_shape=[2, 2], pads=[2, 2, 2, 2])
    with pytest.raises(DTypeError, match="AveragePool"):
        g.op("AveragePool", g.input("xi", [1, 2, 5, 5], "int8"), kernel_shape=[2, 2])


@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 3, 4, 5), (1, 2, 3, 4, 5), (2, 3)], ids=str)
@pytest.mark.parametrize("dtype", FLOATS)
def test_global_pools(shape, dtype):
    x = rand(shape, dtype)
    axes = tuple(range(2, x.ndim))
    check_op("GlobalAveragePool", [x])
    check_op("GlobalAveragePool", [x], symbolic=False)
    if x.ndim == 4:
        check_op("GlobalMaxPool", [x])
    else:
        # the evaluator's GlobalMaxPool reduces axes (ndim-2, ndim-1): right only for 4-D
        check_expect("GlobalMaxPool", [x], {}, [x.max(axis=axes, keepdims=True)])


# == normalization ============================================================================


@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 5), (2, 3, 4, 5), (1, 3, 2, 3, 4)], ids=str)
@pytest.mark.parametrize("dtype", FLOATS)
def test_batch_norm(shape, dtype):
    c = shape[1]
    ins = [
        rand(shape, dtype),
        rand((c,), dtype),
        rand((c,), dtype),
        rand((c,), dtype),
        np.abs(rand((c,), dtype)) + 0.1,
    ]
    check_op("BatchNormalization", ins)
    check_op("BatchNormalization", ins, {"epsilon": 1e-3, "momentum": 0.5}, symbolic=False)


def test_batch_norm_mixed_types_and_training():
    x = rand((2, 3, 4), np.float16)
    stats = [rand((3,)), rand((3,)), rand((3,), np.float64), np.abs(rand((3,), np.float64)) + 0.5]
    check_op("BatchNormalization", [x, *stats])
    x32 = rand((4, 3, 5))
    ins = [x32, rand((3,)), rand((3,)), rand((3,)), np.abs(rand((3,))) + 0.5]
    check_op("BatchNormalization", ins, {"training_mode": 1, "momentum": 0.8}, n_outputs=3)


def test_batch_norm_errors():
    g = geode.Graph("bn")
    x = g.input("x", ["N", 3, 4])
    p3 = [g.constant(rand((3,))) for _ in range(4)]
    with pytest.raises(ShapeError, match=r"'bn_bad'.*scale"):
        g.op("BatchNormalization", x, g.constant(rand((4,))), *p3[1:], name="bn_bad")
    with pytest.raises(VerifyError, match="training_mode"):
        g.op("BatchNormalization", x, *p3, n_outputs=3)


@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 3, 4, 5), (1, 2, 3, 2, 4)], ids=str)
@pytest.mark.parametrize("dtype", FLOATS)
def test_instance_norm(shape, dtype):
    c = shape[1]
    ins = [rand(shape, dtype), rand((c,), dtype), rand((c,), dtype)]
    check_op("InstanceNormalization", ins)
    check_op("InstanceNormalization", ins, {"epsilon": 1e-2}, symbolic=False)


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("dtype", FLOATS)
def test_lrn(size, dtype):
    attrs = {"size": size, "alpha": 0.01, "beta": 0.6, "bias": 1.5}
    # The evaluator loops over range(N) where it means range(C), so it is right only when
    # N >= C: check N == C against it and every other shape against the spec loop.
    x = rand((4, 4, 3, 2), dtype)
    check_op("LRN", [x], attrs)
    x = rand((2, 7, 3, 3), dtype)
    check_expect("LRN", [x], attrs, [naive_lrn(x, **attrs)])
    x = rand((1, 6, 5), dtype)
    check_expect("LRN", [x], {"size": size}, [naive_lrn(x, size)], symbolic=False)


# == Einsum ===================================================================================

EINSUM_CASES = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("ij->ji", [(3, 4)]),
    ("ii->i", [(4, 4)]),
    ("ii", [(4, 4)]),
    ("ij", [(3, 4)]),
    ("ji", [(3, 4)]),
    ("i,j->ij", [(3,), (4,)]),
    ("i,i", [(5,), (5,)]),
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 2)]),
    ("...j,jk", [(2, 3, 4), (4, 5)]),
    ("b...->...b", [(2, 3, 4)]),
    ("ab,bc,cd->ad", [(2, 3), (3, 4), (4, 5)]),
    ("Bij, ij -> B", [(5, 2, 3), (2, 3)]),
    ("ijk->", [(2, 3, 4)]),
]


@pytest.mark.parametrize("case", EINSUM_CASES, ids=str)
def test_einsum(case):
    eq, shapes = case
    ins = [rand(s) for s in shapes]
    check_op("Einsum", ins, {"equation": eq})
    check_op("Einsum", ins, {"equation": eq}, symbolic=False)


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int32, np.int64])
def test_einsum_dtypes(dtype):
    check_op(
        "Einsum", [rand((2, 3, 4), dtype), rand((2, 4, 5), dtype)], {"equation": "bij,bjk->bik"}
    )


def test_einsum_symbolic_and_errors():
    g = geode.Graph("es")
    a, b = g.input("a", ["B", "M", "K"]), g.input("b", ["B", "K2", "N"])
    y = g.op("Einsum", a, b, equation="bmk,bkn->bnm")
    assert y.shape == (sym("B"), sym("N"), sym("M"))
    assert (sym("K"), sym("K2")) in [(x, z) for x, z, _ in g.symbols.constraints]
    with pytest.raises(ShapeError, match=r"'es_bad'.*label 'j'"):
        g.op(
            "Einsum",
            g.input("c", [2, 3]),
            g.input("d", [4, 5]),
            equation="ij,jk->ik",
            name="es_bad",
        )
    with pytest.raises(VerifyError, match="operands"):
        g.op("Einsum", a, equation="ij,jk->ik")
    with pytest.raises(ShapeError, match="term"):
        g.op("Einsum", a, equation="ij->i")


# == Dropout ==================================================================================


@pytest.mark.parametrize("dtype", FLOATS)
def test_dropout_inference(dtype):
    x = rand((3, 4), dtype)
    check_op("Dropout", [x])
    check_op("Dropout", [x], n_outputs=2)
    ratio, train = np.array(0.3, dtype=dtype), np.array(False)
    check_op("Dropout", [x, ratio, train], n_outputs=2, const_inputs=[1, 2])
    check_op("Dropout", [x, ratio], {"seed": 3}, n_outputs=2, symbolic=False)


def test_dropout_training():
    x = rand((40, 50)) + 10.0
    ins = [x, np.array(0.25, np.float32), np.array(True)]
    y, mask = check_op("Dropout", ins, {"seed": 7}, n_outputs=2, compare=False)
    assert mask.dtype == np.bool_ and 0.6 < mask.mean() < 0.9
    np.testing.assert_allclose(y, np.where(mask, x / 0.75, 0), rtol=1e-6)


# == ONNX's own node test cases ================================================================
# The onnx package generates its backend node tests (inputs and spec-computed outputs)
# when their modules are imported; run geode's kernels and InferShape on every case for
# these ops. Tolerances are the ONNX backend runner's (some expected values are written
# with four digits). A module is imported only by its test, so `-k` stays fast.

ONNX_CASE_MODULES = {
    "matmul": "MatMul",
    "gemm": "Gemm",
    "conv": "Conv",
    "convtranspose": "ConvTranspose",
    "maxpool": "MaxPool",
    "averagepool": "AveragePool",
    "lppool": "LpPool",
    "globalaveragepool": "GlobalAveragePool",
    "globalmaxpool": "GlobalMaxPool",
    "batch_normalization": "BatchNormalization",
    "instance_normalization": "InstanceNormalization",
    "lrn": "LRN",
    "einsum": "Einsum",
    "dropout": "Dropout",
}


@pytest.mark.parametrize("module", sorted(ONNX_CASE_MODULES))
def test_onnx_node_cases(module):
    cases = onnx_node_cases(module, ONNX_CASE_MODULES[module])
    assert cases, f"no ONNX node test cases found for {module}"
    skipped = {c.name: why for c in cases if (why := run_onnx_node_case(c))}
    assert len(skipped) < len(cases), skipped
    if skipped:  # said out loud, in pytest's warnings summary
        warnings.warn(f"ONNX node cases not run: {skipped}", stacklevel=1)


@pytest.mark.parametrize("op", ["MatMul", "Gemm"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64])
def test_matmul_results_are_new_arrays_of_the_input_dtype(op, dtype):
    """The reference MatMul and Gemm return their product without a second copy; it is a
    new array (never a view of an input or constant) of the inputs' dtype."""
    rng = np.random.default_rng(2)
    a = rng.integers(-3, 4, (3, 4)).astype(dtype)
    b = rng.integers(-3, 4, (4, 5)).astype(dtype)
    attrs = {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0} if op == "Gemm" else {}
    (y,) = registry.get(op).run([a, b], attrs)
    assert y.dtype == dtype and y.shape == (3, 5)
    assert not np.shares_memory(y, a) and not np.shares_memory(y, b)
    np.testing.assert_array_equal(y, (a.astype(np.float64) @ b.astype(np.float64)).astype(dtype))
