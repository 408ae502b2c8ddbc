"""Conformance of the reduce ops (geode/compiler/ops/reduce.py) against ONNX's reference."""

from __future__ import annotations

import numpy as np
import pytest
import sympy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opcheck import assert_close, check_op, geode_node, onnx_reference

import geode
from geode.compiler.ops import registry
from geode.compiler.ops.registry import OpKind
from geode.compiler.shapes import evaluate, sym
from geode.errors import DTypeError, ShapeError, VerifyError

rng = np.random.default_rng(1234)

FLOATS = [np.float32, np.float64, np.float16]
INTS = [np.int32, np.int64]
REDUCE_OPS = [
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceSumSquare",
]
FLOAT_ONLY = {"ReduceLogSum", "ReduceLogSumExp"}


def data(shape: tuple[int, ...], dtype: object, positive: bool = False) -> np.ndarray:
    """Random test data: small ints, or normal floats (positive when asked)."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) > 0.5
    if np.issubdtype(dtype, np.integer):
        lo = 1 if positive or np.issubdtype(dtype, np.unsignedinteger) else -4
        return rng.integers(lo, 5, size=shape).astype(dtype)
    x = rng.standard_normal(shape)
    if positive:
        x = np.abs(x) + 0.5
    return x.astype(dtype)


def reduce_input(op: str, shape: tuple[int, ...], dtype: object) -> np.ndarray:
    """Data a reduction is well defined on (LogSum needs positive values)."""
    return data(shape, dtype, positive=op == "ReduceLogSum")


def explicit_sumsquare(x: np.ndarray, axes: tuple[int, ...] | None, keepdims: int) -> np.ndarray:
    """ReduceSumSquare by hand, in the input's dtype as the ONNX schema says."""
    ax = tuple(range(x.ndim)) if axes is None else axes
    return np.sum(x * x, axis=ax, keepdims=bool(keepdims), dtype=x.dtype)


def reduce_check(
    op: str,
    x: np.ndarray,
    axes: list[int] | None,
    keepdims: int = 1,
    noop: int = 0,
    const_axes: bool = True,
    symbolic: bool = True,
) -> None:
    """check_op for a Reduce op, with an explicit expectation where ONNX's reference is off."""
    attrs = {"keepdims": keepdims}
    if noop:
        attrs["noop_with_empty_axes"] = noop
    inputs = [x] if axes is None else [x, np.array(axes, dtype=np.int64)]
    const = (1,) if const_axes and axes is not None else ()
    if op == "ReduceSumSquare" and np.issubdtype(x.dtype, np.integer):
        # ONNX's reference sums int32 squares with numpy's default accumulator and returns
        # int64; the schema says the output has the input's type. Compare by hand.
        g, node, _ = geode_node(op, inputs, attrs, 1, const, symbolic)
        got = registry.get(op).run(inputs, attrs)[0]
        if axes == [] and noop:
            want = x * x
        else:
            ax = None if not axes else tuple(a % x.ndim for a in axes)
            want = explicit_sumsquare(x, ax, keepdims)
        assert_close(got, want, op)
        assert node.outputs[0].dtype == x.dtype
        return
    check_op(op, inputs, attrs, const_inputs=const, symbolic=symbolic)


AXES_CASES = [
    (None, 1, 0),
    (None, 0, 0),
    ([1], 1, 0),
    ([1], 0, 0),
    ([-1, 0], 0, 0),
    ([0, 2], 1, 0),
    ([], 0, 1),
    ([], 1, 0),
    ([-3, -2, -1], 0, 0),
]


@pytest.mark.parametrize(
    "op,dtype",
    [
        (op, dt)
        for op in REDUCE_OPS
        for dt in FLOATS + INTS
        if not (op in FLOAT_ONLY and dt in INTS)
    ],
)
@pytest.mark.parametrize("axes,keepdims,noop", AXES_CASES)
def test_reduce_const_axes(
    op: str, dtype: type, axes: list[int] | None, keepdims: int, noop: int
) -> None:
    x = reduce_input(op, (2, 3, 4), dtype)
    reduce_check(op, x, axes, keepdims, noop)


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("symbolic", [True, False])
@pytest.mark.parametrize("axes,keepdims,noop", AXES_CASES[2:])
def test_reduce_dynamic_axes(
    op: str, symbolic: bool, axes: list[int], keepdims: int, noop: int
) -> None:
    x = reduce_input(op, (3, 2, 4), np.float32)
    reduce_check(op, x, axes, keepdims, noop, const_axes=False, symbolic=symbolic)


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_static_shapes(op: str) -> None:
    for shape, axes in (((5,), [0]), ((2, 1, 3), [1]), ((1, 4, 1, 2), [0, 3]), ((6, 2), None)):
        x = reduce_input(op, shape, np.float32)
        reduce_check(op, x, axes, keepdims=0, symbolic=False)
        reduce_check(op, x, axes, keepdims=1, symbolic=False)


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("dtype", [np.bool_, np.int8, np.uint8])
def test_reduce_minmax_small_types(op: str, dtype: type) -> None:
    # ReduceMax/ReduceMin accept bool and 8-bit ints since opset 20
    x = data((3, 4), dtype)
    for axes, keep in (([0], 1), ([1], 0), (None, 0)):
        reduce_check(op, x, axes, keep)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceProd", "ReduceMean"])
def test_reduce_unsigned(op: str) -> None:
    x = data((3, 4), np.uint32)
    reduce_check(op, x, [1], 0)
    reduce_check(op, x.astype(np.uint64), [0], 1, symbolic=False)


@pytest.mark.parametrize(
    "op", ["ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceLogSum", "ReduceLogSumExp"]
)
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_empty(op: str, keepdims: int) -> None:
    # reducing an empty set gives the op's identity (opset 18): 0, -inf, +inf, 1, -inf, -inf
    x = np.zeros((0, 3), np.float32)
    reduce_check(op, x, [0], keepdims, symbolic=False)
    if op in ("ReduceMax", "ReduceMin"):
        reduce_check(op, np.zeros((2, 0), np.int32), [1], keepdims, symbolic=False)


@pytest.mark.filterwarnings("ignore:Mean of empty slice", "ignore:invalid value encountered")
def test_reduce_mean_empty_is_nan() -> None:
    got = check_op(
        "ReduceMean",
        [np.zeros((0, 3), np.float32), np.array([0])],
        {},
        const_inputs=(1,),
        symbolic=False,
    )
    assert got[0].shape == (1, 3) and np.isnan(got[0]).all()


def test_reduce_int_mean_truncates() -> None:
    x = np.array([[1, 2], [-3, -4]], dtype=np.int32)
    got = check_op("ReduceMean", [x, np.array([1])], {"keepdims": 0}, const_inputs=(1,))
    np.testing.assert_array_equal(got[0], np.array([1, -3], np.int32))


def test_reduce_noop_applies_elementwise_part() -> None:
    # noop_with_empty_axes with empty axes reduces over no axis: L1 gives |x|, SumSquare x^2
    x = data((2, 3), np.float32)
    empty = np.array([], dtype=np.int64)
    for op, want in (("ReduceL1", np.abs(x)), ("ReduceSumSquare", x * x), ("ReduceSum", x)):
        got = check_op(op, [x, empty], {"noop_with_empty_axes": 1}, const_inputs=(1,))
        assert_close(got[0], want, op)


def test_reduce_logsumexp_is_stable() -> None:
    x = np.array([[1000.0, 1000.0], [-np.inf, -np.inf]], dtype=np.float32)
    got = registry.get("ReduceLogSumExp").run([x, np.array([1])], {"keepdims": 0})[0]
    np.testing.assert_allclose(got[0], 1000 + np.log(2), rtol=1e-6)
    assert got[1] == -np.inf


# -- symbolic shape inference --------------------------------------------------------------------
def infer(
    op: str, inputs: list, attrs: dict | None = None, const: tuple = (), n_outputs: int = 1, **kw
):
    """Build one node (symbolic dims d{i}_{j}) and return its output shapes."""
    _, node, _ = geode_node(
        op, inputs, dict(attrs or {}), n_outputs, const, kw.get("symbolic", True)
    )
    return [o.shape for o in node.outputs]


def test_reduce_infer_symbolic_const_axes() -> None:
    x = np.zeros((2, 3, 4), np.float32)
    d0, d1, d2 = sym("d0_0"), sym("d0_1"), sym("d0_2")
    assert infer("ReduceSum", [x, np.array([1])], {}, (1,)) == [(d0, 1, d2)]
    assert infer("ReduceSum", [x, np.array([-1, 0])], {"keepdims": 0}, (1,)) == [(d1,)]
    assert infer("ReduceMax", [x], {"keepdims": 0}) == [()]
    assert infer("ReduceMax", [x], {}) == [(1, 1, 1)]
    assert infer("ReduceMean", [x, np.array([], np.int64)], {"noop_with_empty_axes": 1}, (1,)) == [
        (d0, d1, d2)
    ]


def test_reduce_infer_dynamic_axes() -> None:
    x = np.zeros((2, 1, 4), np.float32)
    axes = np.array([0, 2])
    # keepdims=1: each dim is kept or becomes 1; a dim that is already 1 stays 1
    g = geode.Graph("t")
    xv = g.input("x", ["N", 1, 4])
    av = g.input("axes", [2], "int64")
    out = g.op("ReduceSum", xv, av)
    assert len(out.shape) == 3 and out.shape[1] == 1
    assert all(isinstance(d, sympy.Symbol) for d in (out.shape[0], out.shape[2]))
    # keepdims=0 with a static number of axes: the rank is known
    out = g.op("ReduceSum", xv, av, keepdims=0)
    assert out.rank == 1
    # ... a dim equal across the window is known: (N, N, N) minus two axes is (N,)
    y = g.input("y", ["N", "N", "N"])
    assert g.op("ReduceMax", y, av, keepdims=0).shape == (sym("N"),)
    # as many axes as dims: everything is reduced
    a3 = g.input("a3", [3], "int64")
    assert g.op("ReduceMax", y, a3, keepdims=0).shape == ()
    # unknown number of axes and keepdims=0: unknown rank
    ak = g.input("ak", ["K"], "int64")
    assert g.op("ReduceMin", xv, ak, keepdims=0).shape is None
    assert g.op("ReduceMin", xv, ak, keepdims=1).rank == 3
    assert infer("ReduceSum", [x, axes], {"keepdims": 0}, ()) == [None]


def test_reduce_infer_unknown_rank() -> None:
    g = geode.Graph("t")
    x = g.input("x", None)
    assert g.op("ReduceSum", x, keepdims=0).shape == ()
    assert g.op("ReduceSum", x).shape is None
    assert g.op("ArgMax", x).shape is None


def test_reduce_kinds() -> None:
    for op in REDUCE_OPS + ["ArgMax", "ArgMin"]:
        assert registry.get(op).kind is OpKind.REDUCE, op
        if op.startswith("Reduce"):
            assert registry.get(op).value_inputs == (1,)
    for op in (
        "Softmax",
        "LogSoftmax",
        "LayerNormalization",
        "CumSum",
        "MeanVarianceNormalization",
    ):
        assert registry.get(op).kind is OpKind.OPAQUE, op


# -- hypothesis: random shapes, axes and keepdims ---------------------------------------------------
@st.composite
def reduce_cases(draw: st.DrawFn) -> tuple:
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=4)))
    rank = len(shape)
    chosen = draw(st.lists(st.integers(0, rank - 1), unique=True, max_size=rank))
    axes = [a - rank if draw(st.booleans()) else a for a in chosen]
    op = draw(st.sampled_from(REDUCE_OPS))
    dtype = draw(
        st.sampled_from([np.float32, np.float64] if op in FLOAT_ONLY else [np.float32, np.int64])
    )
    keepdims = draw(st.integers(0, 1))
    noop = draw(st.integers(0, 1))
    const = draw(st.booleans())
    symbolic = draw(st.booleans())
    return op, shape, axes, dtype, keepdims, noop, const, symbolic


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reduce_cases())
def test_reduce_random(case: tuple) -> None:
    op, shape, axes, dtype, keepdims, noop, const, symbolic = case
    x = reduce_input(op, shape, dtype)
    reduce_check(op, x, axes, keepdims, noop, const_axes=const, symbolic=symbolic)


# -- ArgMax / ArgMin ---------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("dtype", FLOATS + INTS + [np.uint8, np.int8])
@pytest.mark.parametrize("axis,keepdims,last", [(0, 1, 0), (1, 0, 0), (-1, 1, 1), (-2, 0, 1)])
@pytest.mark.parametrize("symbolic", [True, False])
def test_argmax(op: str, dtype: type, axis: int, keepdims: int, last: int, symbolic: bool) -> None:
    # small ints make ties, so select_last_index matters
    x = rng.integers(0, 3, size=(3, 4, 2)).astype(dtype)
    attrs = {"axis": axis, "keepdims": keepdims, "select_last_index": last}
    got = check_op(op, [x], attrs, symbolic=symbolic)
    assert got[0].dtype == np.int64


def test_argmax_defaults() -> None:
    check_op("ArgMax", [data((4, 3), np.float32)])
    check_op("ArgMin", [data((5,), np.float64)], {"keepdims": 0})


# -- Softmax / LogSoftmax / Hardmax -----------------------------------------------------------------
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("axis", [-1, 0, 1])
@pytest.mark.parametrize("symbolic", [True, False])
def test_softmax_family(op: str, dtype: type, axis: int, symbolic: bool) -> None:
    x = (data((2, 3, 5), np.float32) * 3).astype(dtype)
    if op == "LogSoftmax" and dtype == np.float16:
        # ONNX's reference takes log(softmax(x)) in float16: small probabilities underflow
        # (errors of 0.1 to inf against the exact value). Compare with float64 math instead.
        _, node, env = geode_node(op, [x], {"axis": axis}, 1, (), symbolic)
        got = registry.get(op).run([x], {"axis": axis})[0]
        xd = x.astype(np.float64)
        shifted = xd - xd.max(axis=axis, keepdims=True)
        want = shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))
        assert_close(got, want.astype(np.float16), op)
        assert (
            node.outputs[0].dtype == got.dtype and evaluate(node.outputs[0].shape, env) == got.shape
        )
        return
    check_op(op, [x], {"axis": axis}, symbolic=symbolic)


def test_softmax_default_axis_and_large_values() -> None:
    x = np.array([[1000.0, 1001.0, 1002.0], [-5.0, 0.0, 5.0]], np.float32)
    check_op("Softmax", [x])
    check_op("LogSoftmax", [x])


def test_hardmax_ties_pick_first() -> None:
    x = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]], np.float32)
    got = check_op("Hardmax", [x])
    np.testing.assert_array_equal(got[0], [[0, 1, 0], [1, 0, 0]])


# -- LayerNormalization ------------------------------------------------------------------------------
def layer_norm_expect(
    x: np.ndarray, scale: np.ndarray, bias: np.ndarray | None, axis: int, eps: float
):
    """ONNX's function body: statistics in float32 (stash_type=1), Y cast back to X's type."""
    axes = tuple(range(axis % x.ndim, x.ndim))
    xs = x.astype(np.float32)
    mean = xs.mean(axis=axes, keepdims=True)
    var = ((xs - mean) ** 2).mean(axis=axes, keepdims=True)
    inv = (1 / np.sqrt(var + np.float32(eps))).astype(np.float32)
    y = ((xs - mean) * inv).astype(x.dtype) * scale
    if bias is not None:
        y = y + bias
    return [y.astype(x.dtype), mean, inv]


@pytest.mark.parametrize("axis", [-1, 1, 0, -2])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("n_outputs", [1, 3])
@pytest.mark.parametrize("symbolic", [True, False])
def test_layer_norm_float32(axis: int, with_bias: bool, n_outputs: int, symbolic: bool) -> None:
    x = data((2, 3, 4), np.float32)
    norm_shape = x.shape[axis % 3 :]
    scale = data(norm_shape, np.float32)
    bias = data(norm_shape, np.float32) if with_bias else None
    inputs = [x, scale] + ([bias] if with_bias else [])
    check_op(
        "LayerNormalization",
        inputs,
        {"axis": axis, "epsilon": 1e-3},
        n_outputs=n_outputs,
        symbolic=symbolic,
    )


def test_layer_norm_broadcast_scale() -> None:
    x = data((2, 3, 4), np.float32)
    check_op("LayerNormalization", [x, data((4,), np.float32)], {"axis": 1}, n_outputs=3)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_layer_norm_other_floats(dtype: type) -> None:
    # ONNX's reference computes in X's dtype and returns Mean/InvStdDev in X's dtype; the
    # schema (and onnx.shape_inference) make them stash_type (float32) and the function
    # body computes the statistics in float32. Compare with that explicitly.
    x = data((3, 5), dtype)
    scale, bias = data((5,), dtype), data((5,), dtype)
    g, node, _ = geode_node("LayerNormalization", [x, scale, bias], {}, 3)
    got = registry.get("LayerNormalization").run([x, scale, bias], {})
    want = layer_norm_expect(x, scale, bias, -1, 1e-5)
    for i in range(3):
        assert_close(got[i], want[i], f"output {i}")
        assert node.outputs[i].dtype == got[i].dtype
    assert node.outputs[1].shape == (sym("d0_0"), 1)
    # the one-output form agrees with the reference within float16's tolerance
    if dtype == np.float16:
        check_op("LayerNormalization", [x, scale, bias], {})


def test_layer_norm_infer() -> None:
    g = geode.Graph("t")
    x = g.input("x", ["B", "S", 64])
    s = g.input("s", [64])
    y, mean, inv = g.op("LayerNormalization", x, s, n_outputs=3)
    assert y.shape == x.shape
    assert mean.shape == (sym("B"), sym("S"), 1) and mean.dtype == np.float32
    _, mean, _ = g.op("LayerNormalization", x, g.input("s2", ["S", 64]), axis=1, n_outputs=3)
    assert mean.shape == (sym("B"), 1, 1)
    with pytest.raises(ShapeError, match="Scale"):
        g.op("LayerNormalization", x, g.input("s3", [32]))
    with pytest.raises(VerifyError, match="stash_type"):
        g.op("LayerNormalization", x, s, stash_type=11)


# -- CumSum ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS + INTS + [np.uint32])
@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("axis", [0, -1, 1])
def test_cumsum(dtype: type, exclusive: int, reverse: int, axis: int) -> None:
    x = data((3, 4), dtype)
    axis_dtype = np.int32 if axis == 1 else np.int64
    attrs = {"exclusive": exclusive, "reverse": reverse}
    check_op("CumSum", [x, np.array(axis, axis_dtype)], attrs, const_inputs=(1,))
    check_op("CumSum", [x, np.array(axis, axis_dtype)], attrs, symbolic=False)


def test_cumsum_bad_axis() -> None:
    g = geode.Graph("t")
    x = g.input("x", [3, 4])
    with pytest.raises(ShapeError, match="cumsum"):
        g.op("CumSum", x, g.constant(np.array(2, np.int64)), name="cumsum")


# -- LpNormalization / MeanVarianceNormalization -------------------------------------------------------
@pytest.mark.filterwarnings("ignore:invalid value encountered in divide")  # ONNX's reference, 0/0
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("axis", [-1, 0, 1])
@pytest.mark.parametrize("symbolic", [True, False])
def test_lp_normalization_l2(dtype: type, axis: int, symbolic: bool) -> None:
    x = data((3, 4), dtype)
    x[0] = 0  # a zero row: 0, not NaN
    check_op("LpNormalization", [x], {"axis": axis, "p": 2}, symbolic=symbolic)


@pytest.mark.filterwarnings("ignore:invalid value encountered in divide")  # ONNX's reference, 0/0
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_lp_normalization_l1(dtype: type) -> None:
    # ONNX's reference computes the L1 norm as sum(x ** 1), dropping the absolute value,
    # so it is wrong for negative inputs; the L1 norm is sum(|x|). Compare explicitly.
    x = data((3, 4), dtype)
    x[1] = 0
    got = registry.get("LpNormalization").run([x], {"axis": 1, "p": 1})[0]
    norm = np.abs(x).sum(axis=1, keepdims=True)
    want = np.where(norm == 0, 0, x / np.where(norm == 0, 1, norm)).astype(dtype)
    assert_close(got, want, "LpNormalization p=1")
    # on non-negative input the reference agrees
    check_op("LpNormalization", [np.abs(x)], {"axis": 1, "p": 1})


@pytest.mark.parametrize("axes", [None, [1], [0, 2, 3], [-1]])
@pytest.mark.parametrize("symbolic", [True, False])
def test_mvn_float32(axes: list[int] | None, symbolic: bool) -> None:
    x = data((2, 3, 4, 5), np.float32)
    attrs = {} if axes is None else {"axes": axes}
    check_op("MeanVarianceNormalization", [x], attrs, symbolic=symbolic)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_mvn_other_floats(dtype: type) -> None:
    # ONNX's reference runs the function body, whose epsilon constant is float32; adding it
    # to a float16/float64 tensor fails there ("Input type mismatch"). Compare with the
    # body's formula computed by hand.
    x = data((2, 3, 4, 2), dtype)
    got = registry.get("MeanVarianceNormalization").run([x], {})[0]
    xf = x.astype(np.float64)
    mean = xf.mean(axis=(0, 2, 3), keepdims=True)
    std = np.sqrt((xf * xf).mean(axis=(0, 2, 3), keepdims=True) - mean**2)
    want = ((xf - mean) / (std + 1e-9)).astype(dtype)
    assert_close(got, want, "MVN")


# -- errors ------------------------------------------------------------------------------------------
def test_reduce_bad_axis_names_node() -> None:
    g = geode.Graph("t")
    x = g.input("x", ["N", 4])
    with pytest.raises(ShapeError, match="my_reduce"):
        g.op("ReduceSum", x, g.constant(np.array([2], np.int64)), name="my_reduce")
    with pytest.raises(ShapeError, match="repeat"):
        g.op("ReduceMax", x, g.constant(np.array([1, -1], np.int64)), name="dup")
    with pytest.raises(ShapeError, match="argmax_node"):
        g.op("ArgMax", x, axis=-3, name="argmax_node")
    with pytest.raises(ShapeError, match="sm"):
        g.op("Softmax", x, axis=2, name="sm")
    with pytest.raises(ShapeError, match="entries"):
        g.op("ReduceSum", x, g.input("axes", [3], "int64"), keepdims=0)


def test_reduce_bad_dtypes() -> None:
    g = geode.Graph("t")
    xi = g.input("xi", [3], "int32")
    with pytest.raises(DTypeError):
        g.op("ReduceLogSum", xi)
    with pytest.raises(DTypeError):
        g.op("Softmax", xi)
    xf = g.input("xf", [3])
    with pytest.raises(DTypeError):
        g.op("ReduceSum", xf, g.constant(np.array([0], np.int32)))
    with pytest.raises(DTypeError):
        g.op("ReduceSum", g.input("xb", [3], "bool"))


def test_reduce_builder_api() -> None:
    g = geode.Graph("rms")
    x = g.input("x", ["N", 768])
    from geode import ops

    ms = ops.reduce_mean(x * x, axes=[-1], keepdims=1)
    assert ms.shape == (sym("N"), 1)
    assert ops.argmax(x, axis=1, keepdims=0).shape == (sym("N"),)


def test_reference_dtype_for_sumsquare_int_is_int64() -> None:
    # documents why reduce_check compares ReduceSumSquare on ints by hand
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    assert onnx_reference("ReduceSumSquare", [x, np.array([1])], {}, 1)[0].dtype == np.int64


def test_integer_means_are_exact_and_truncate_toward_zero():
    """Integer ReduceMean: the sum in the input's type divided by the count, truncated
    toward zero, without numpy's float64 division (which dropped the low bits of int64
    sums beyond 2**53 and made the mean of the int64 maximum the minimum; found by
    geode.fuzz against the compiled kernel, which was exact). A mean of nothing is 0."""
    from geode.compiler.interpret import run_reference

    mean = registry.get("ReduceMean")
    big = np.iinfo(np.int64).max
    x = np.array([[big], [2**62 + 1]], np.int64)
    assert mean.run([x, np.array([1])], {"keepdims": 0})[0].tolist() == [big, 2**62 + 1]
    neg = np.array([[-3, -4], [3, 4]], np.int32)
    assert mean.run([neg, np.array([1])], {"keepdims": 0})[0].tolist() == [-3, 3]
    empty = np.zeros((2, 0), np.uint64)
    out = mean.run([empty, np.array([1])], {"keepdims": 1})[0]
    assert out.dtype == np.uint64 and out.tolist() == [[0], [0]]
    g = geode.Graph("int_mean")
    v = g.input("x", ["N", "M"], "int64")
    g.output(geode.ops.reduce_mean(v, axes=[1], keepdims=0), names=["y"])
    model = geode.compile(g)
    for feeds in ({"x": x}, {"x": neg.astype(np.int64)}, {"x": np.zeros((2, 0), np.int64)}):
        np.testing.assert_array_equal(model.run(feeds)["y"], run_reference(g, feeds)["y"])
