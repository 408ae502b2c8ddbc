"""Conformance tests of the host ops (geode/compiler/ops/host.py) against ONNX.

Every case goes through ``opcheck.check_op``; ops whose output shape depends on an
input's value run both with that input constant (``const_inputs``: shape inference
reads the value and gives exact dims) and as a graph input (a fresh symbol, or fresh
symbols of known rank, checked by rank). Where onnx's ReferenceEvaluator is wrong for
a case, an explicit numpy expectation replaces it (the reason is given at each use).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from opcheck import assert_close, check_op, onnx_node_cases, run_onnx_node_case

import geode
from geode.compiler.interpret import run_reference
from geode.compiler.ops import registry
from geode.compiler.ops.registry import OpKind
from geode.compiler.shapes import sym
from geode.errors import DTypeError, ShapeError, VerifyError

RNG = np.random.default_rng(99)
HOST_OPS = [
    "Shape",
    "Size",
    "ConstantOfShape",
    "Range",
    "NonZero",
    "EyeLike",
    "OneHot",
    "TopK",
    "Unique",
]


def rand(shape, dtype=np.float32, lo: int = -3, hi: int = 4) -> np.ndarray:
    """Random data: standard normal for floats, small integers for ints, coin flips for bool."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return RNG.integers(0, 2, shape).astype(bool)
    if np.issubdtype(dtype, np.floating):
        return RNG.standard_normal(shape).astype(dtype)
    if np.issubdtype(dtype, np.unsignedinteger):
        lo = max(lo, 0)
    return RNG.integers(lo, hi, shape).astype(dtype)


def check_expect(op, inputs, attrs, expected, n_outputs=1, **kw):
    """check_op without the evaluator (its answer is wrong here), then an explicit expectation."""
    got = check_op(op, inputs, attrs, n_outputs=n_outputs, compare=False, **kw)
    for i, want in enumerate(expected[:n_outputs]):
        assert_close(got[i], np.asarray(want), f"{op} output {i} vs numpy expectation")
    return got


def test_kinds_and_value_inputs():
    for op in HOST_OPS:
        assert registry.get(op).kind is OpKind.HOST, op
    vi = {op: registry.get(op).value_inputs for op in HOST_OPS}
    assert vi == {
        "Shape": (),
        "Size": (),
        "ConstantOfShape": (0,),
        "Range": (0, 1, 2),
        "NonZero": (0,),
        "EyeLike": (),
        "OneHot": (1,),
        "TopK": (1,),
        "Unique": (0,),
    }


# == Shape / Size =============================================================================

SHAPE_ATTRS = [
    {},
    {"start": 1},
    {"end": -1},
    {"start": -2},
    {"start": 1, "end": 3},
    {"start": -10, "end": 10},
    {"start": 3, "end": 1},
    {"end": 0},
]


@pytest.mark.parametrize("shape", [(), (4,), (2, 3), (2, 1, 4, 5)], ids=str)
@pytest.mark.parametrize("attrs", SHAPE_ATTRS, ids=str)
def test_shape(shape, attrs):
    check_op("Shape", [rand(shape)], attrs)
    check_op("Shape", [rand(shape)], attrs, symbolic=False)


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int8, np.int64, np.uint16, np.bool_])
def test_shape_size_dtypes(dtype):
    x = rand((2, 0, 3), dtype)
    check_op("Shape", [x])
    check_op("Size", [x])
    check_op("Size", [rand((3, 4), dtype)], symbolic=False)
    check_op("Size", [rand((), dtype)])


def test_shape_infer():
    g = geode.Graph("s")
    x = g.input("x", ["N", 3, None])
    assert g.op("Shape", x).shape == (3,)
    assert g.op("Shape", x, start=1).shape == (2,)
    assert g.op("Shape", x).dtype == np.int64
    assert g.op("Size", x).shape == ()
    u = g.input("u", None)
    assert len(g.op("Shape", u).shape) == 1


def test_shape_size_symbolic_values():
    g = geode.Graph("sv")
    x = g.input("x", ["N", 3, "W"])
    assert g.op("Shape", x).sym_value == (sym("N"), 3, sym("W"))
    assert g.op("Shape", x, start=1, end=2).sym_value == (3,)
    assert g.op("Size", x).sym_value == (3 * sym("N") * sym("W"),)
    assert g.op("Shape", g.input("u", None)).sym_value is None


# == ConstantOfShape ==========================================================================


@pytest.mark.parametrize("dims", [[2, 3], [4], [], [2, 0, 3], [1, 1, 1, 2]], ids=str)
@pytest.mark.parametrize(
    "value",
    [
        None,
        np.array([7], np.int64),
        np.array([1.5], np.float64),
        np.array([2], np.int32),
        np.array([True]),
        np.array([0.25], np.float16),
        np.array(3.0, np.float32),
    ],
    ids=lambda v: "default" if v is None else f"{v.dtype}",
)
def test_constant_of_shape(dims, value):
    shape = np.array(dims, dtype=np.int64)
    attrs = {} if value is None else {"value": value}
    got = check_op("ConstantOfShape", [shape], attrs, const_inputs=[0])
    check_op("ConstantOfShape", [shape], attrs, symbolic=False)
    check_op("ConstantOfShape", [shape], attrs)
    assert got[0].dtype == (np.float32 if value is None else value.dtype)


def test_constant_of_shape_infer():
    g = geode.Graph("cos")
    x = g.input("x", ["N", 3, "W"])
    y = g.op("ConstantOfShape", g.op("Shape", x))  # dims come through the Shape node
    assert y.shape == (sym("N"), 3, sym("W")) and y.dtype == np.float32
    y2 = g.op("ConstantOfShape", g.op("Shape", x, start=1), value=np.array([1], np.int64))
    assert y2.shape == (3, sym("W")) and y2.dtype == np.int64
    y3 = g.op("ConstantOfShape", g.input("s", [2], "int64"))
    assert len(y3.shape) == 2 and all(not isinstance(d, int) for d in y3.shape)
    assert y3.shape[0] != y3.shape[1]
    assert g.op("ConstantOfShape", g.input("t", ["L"], "int64")).shape is None


def test_constant_of_shape_errors():
    g = geode.Graph("cos")
    with pytest.raises(ShapeError, match="'cos_neg'.*negative"):
        g.op("ConstantOfShape", g.constant(np.array([2, -1], np.int64)), name="cos_neg")
    with pytest.raises(VerifyError, match="one element"):
        g.op("ConstantOfShape", g.constant(np.array([2], np.int64)), value=np.array([1.0, 2.0]))
    with pytest.raises(DTypeError, match="ConstantOfShape"):
        g.op("ConstantOfShape", g.constant(np.array([2], np.int32)))


# == Range ====================================================================================

RANGE_CASES = [(0, 10, 1), (1, 10, 3), (10, -3, -4), (5, 5, 1), (5, 1, 2), (-2, 7, 2)]


@pytest.mark.parametrize("args", RANGE_CASES, ids=str)
@pytest.mark.parametrize("dtype", [np.int16, np.int32, np.int64, np.float32, np.float64])
def test_range(args, dtype):
    ins = [np.array(a, dtype=dtype) for a in args]
    got = check_op("Range", ins, const_inputs=[0, 1, 2])
    check_op("Range", ins)
    check_op("Range", ins, symbolic=False)
    assert got[0].shape == (max(0, -(-(args[1] - args[0]) // args[2])),)


@pytest.mark.parametrize(
    "args", [(1.5, 7.0, 0.7), (0.0, 1.0, 0.1), (3.0, -1.2, -0.45), (0.5, 0.5, 0.1)], ids=str
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_range_float_steps(args, dtype):
    ins = [np.array(a, dtype=dtype) for a in args]
    check_op("Range", ins, const_inputs=[0, 1, 2])
    check_op("Range", ins, const_inputs=[0, 2])


def test_range_symbolic_length():
    g = geode.Graph("rs")
    x = g.input("x", ["N", 4])
    c = lambda v: g.constant(np.array(v, np.int64))  # noqa: E731
    size = g.op("Size", x)
    assert g.op("Range", c(0), size, c(1)).shape == (4 * sym("N"),)
    n = sym("N")
    down = g.op("Range", size, c(0), c(-3)).shape[0]
    assert [int(down.subs(n, v)) for v in (1, 2, 3)] == [2, 3, 4]
    r = g.op("Range", c(2), c(9), c(3))
    assert r.shape == (3,) and r.sym_value == (2, 5, 8)


def test_range_length_through_casts():
    """torch's ``arange(seq)`` exports ``Range(0, Cast(Gather(Shape(x), 1)), 1)`` (an int64
    -> int64 Cast) and ``arange(seq, dtype=float32)`` a Cast to float: both lengths stay
    symbolic, so everything downstream keeps the input's dims."""
    g = geode.Graph("rc")
    x = g.input("x", ["N", 4])
    n4 = 4 * sym("N")
    size = g.op("Size", x)
    i64 = lambda v: g.constant(np.array(v, np.int64))  # noqa: E731
    f32 = lambda v: g.constant(np.array(v, np.float32))  # noqa: E731
    as_i64 = g.op("Cast", size, to=7)
    assert as_i64.sym_value == (n4,)
    assert g.op("Range", i64(0), as_i64, i64(1)).shape == (n4,)
    one_i32 = g.op("Cast", i64(1), to=6)
    assert g.op("Range", one_i32, g.op("Cast", size, to=6), one_i32).shape == (n4 - 1,)
    as_f32 = g.op("Cast", size, to=1)
    assert as_f32.sym_value is None  # only int tensors carry symbolic values
    up = g.op("Range", f32(0.0), as_f32, f32(1.0))
    assert up.shape == (n4,)
    assert g.op("Range", f32(1.0), as_f32, f32(2.0)).shape[0].subs(sym("N"), 3) == 6
    # a fractional bound or step, or a float16 bound, gives a fresh symbol
    for bad in (
        g.op("Range", f32(0.5), as_f32, f32(1.0)),
        g.op("Range", f32(0.0), as_f32, f32(0.5)),
        g.op(
            "Range",
            g.op("Cast", f32(0.0), to=10),
            g.op("Cast", size, to=10),
            g.op("Cast", f32(1.0), to=10),
        ),
    ):
        assert str(bad.shape[0]).startswith("_")
    g.output(up, names=["up"])
    got = run_reference(g, {"x": np.zeros((3, 4), np.float32)}, check=True)["up"]
    np.testing.assert_array_equal(got, np.arange(12, dtype=np.float32))


def test_range_infer_and_errors():
    g = geode.Graph("r")
    c = lambda v: g.constant(np.array(v, np.int64))  # noqa: E731
    assert g.op("Range", c(2), c(11), c(3)).shape == (3,)
    n = g.op("Range", c(0), g.input("lim", [], "int64"), c(1)).shape
    assert len(n) == 1 and not isinstance(n[0], int)
    with pytest.raises(ShapeError, match="'r_zero'.*delta"):
        g.op("Range", c(0), c(5), c(0), name="r_zero")
    with pytest.raises(ShapeError, match="scalar"):
        g.op("Range", g.input("v", [3], "int64"), c(5), c(1))
    with pytest.raises(DTypeError, match="Range"):
        g.op(
            "Range",
            g.input("u8", [], "uint8"),
            g.input("u8b", [], "uint8"),
            g.input("u8c", [], "uint8"),
        )
    with pytest.raises(DTypeError, match="already int64"):
        g.op("Range", c(0), g.input("f", [], "float32"), c(1))
    with pytest.raises(ShapeError, match="delta"):
        registry.get("Range").run([np.array(0), np.array(3), np.array(0)], {})


# == NonZero ==================================================================================


@pytest.mark.parametrize("shape", [(7,), (3, 4), (2, 3, 4), (0, 3), ()], ids=str)
@pytest.mark.parametrize("dtype", [np.bool_, np.float32, np.int32, np.uint8, np.float16])
def test_nonzero(shape, dtype):
    x = rand(shape, dtype, lo=-1, hi=2)
    got = check_op("NonZero", [x], const_inputs=[0])
    check_op("NonZero", [x])
    check_op("NonZero", [x], symbolic=False)
    assert got[0].shape == (x.ndim, np.count_nonzero(x))


def test_nonzero_infer():
    g = geode.Graph("nz")
    y = g.op("NonZero", g.input("x", ["N", 4]))
    assert y.shape[0] == 2 and not isinstance(y.shape[1], int)
    assert g.op("NonZero", g.constant(np.array([[1, 0], [2, 3]], np.int64))).shape == (2, 3)


# == EyeLike ==================================================================================


@pytest.mark.parametrize("shape", [(4, 4), (3, 5), (5, 2), (1, 1), (0, 3)], ids=str)
@pytest.mark.parametrize("k", [0, 1, -2, 7])
def test_eye_like(shape, k):
    x = rand(shape)
    check_op("EyeLike", [x], {"k": k})
    check_op("EyeLike", [x], {"k": k}, symbolic=False)


@pytest.mark.parametrize("in_dtype", [np.float32, np.int32, np.bool_, np.float16])
@pytest.mark.parametrize("to", [None, 1, 6, 7, 9, 11])  # float, int32, int64, bool, double
def test_eye_like_dtypes(in_dtype, to):
    attrs = {} if to is None else {"dtype": to}
    check_op("EyeLike", [rand((3, 4), in_dtype)], attrs)


def test_eye_like_errors():
    g = geode.Graph("e")
    with pytest.raises(ShapeError, match="'e_bad'.*2-D"):
        g.op("EyeLike", g.input("x", [2, 3, 4]), name="e_bad")


# == OneHot ===================================================================================

IDX = np.array([[0, 3, -1], [5, 2, -4], [1, -5, 4]], dtype=np.int64)


@pytest.mark.parametrize("axis", [-1, 0, 1, 2, -3])
@pytest.mark.parametrize("const_depth", [True, False])
def test_one_hot(axis, const_depth):
    ins = [IDX, np.array(4, np.int64), np.array([0.5, 2.0], np.float32)]
    kw = {"const_inputs": [1]} if const_depth else {}
    check_op("OneHot", ins, {"axis": axis}, **kw)
    check_op("OneHot", ins, {"axis": axis}, symbolic=False, **kw)


@pytest.mark.parametrize(
    "dtypes",
    [
        (np.int32, np.int32, np.int64),
        (np.float32, np.float32, np.float32),
        (np.int64, np.float64, np.int32),
        (np.uint8, np.int64, np.float16),
    ],
    ids=str,
)
def test_one_hot_dtypes(dtypes):
    it, dt, vt = dtypes
    idx = np.array([0, 2, 1, 3], dtype=it)
    values = np.array([1, 5], dtype=vt)
    ins = [idx, np.array(3, dtype=dt), values]
    check_op("OneHot", ins, const_inputs=[1])
    check_op("OneHot", ins)
    # a rank-1 depth of one element is valid ONNX, but the evaluator's np.arange(depth)
    # rejects it under numpy 2: compare with the explicit one-hot table
    want = np.where(idx[:, None] == np.arange(3)[None, :], values[1], values[0]).astype(vt)
    ins[1] = np.array([3], dtype=dt)
    check_expect("OneHot", ins, {}, [want], const_inputs=[1])
    check_expect("OneHot", ins, {}, [want], symbolic=False)


def test_one_hot_bool_values():
    # the evaluator computes (on - off) * hot + off, which numpy rejects for bool values
    idx = np.array([[1, 0], [2, -1]], np.int64)
    values = np.array([False, True])
    want = np.zeros((2, 2, 3), bool)
    want[0, 0, 1] = want[0, 1, 0] = want[1, 0, 2] = want[1, 1, 2] = True
    check_expect("OneHot", [idx, np.array(3, np.int64), values], {}, [want], const_inputs=[1])


def test_one_hot_infer():
    g = geode.Graph("oh")
    idx = g.input("i", ["N", "T"], "int64")
    vals = g.constant(np.array([0, 1], np.float32))
    y = g.op("OneHot", idx, g.constant(np.array(10, np.int64)), vals, axis=1)
    assert y.shape == (sym("N"), 10, sym("T"))
    y2 = g.op("OneHot", idx, g.input("d", [], "int64"), vals)
    assert y2.shape[:2] == (sym("N"), sym("T")) and not isinstance(y2.shape[2], int)
    y3 = g.op("OneHot", idx, g.op("Shape", g.input("c", ["C"]), start=0), vals)
    assert y3.shape == (sym("N"), sym("T"), sym("C"))
    with pytest.raises(ShapeError, match="'oh_bad'.*axis"):
        g.op("OneHot", idx, g.constant(np.array(3)), vals, axis=3, name="oh_bad")
    with pytest.raises(ShapeError, match="values"):
        g.op("OneHot", idx, g.constant(np.array(3)), g.constant(np.zeros(3, np.float32)))


# == TopK =====================================================================================

TIES = np.array([[1, 3, 3, 2, 3], [5, 5, 5, 1, 0], [2, 2, 2, 2, 2]], dtype=np.float32)


@pytest.mark.parametrize("largest", [1, 0])
@pytest.mark.parametrize("axis_k", [(-1, 3), (1, 5), (0, 2), (-2, 0), (1, 1)], ids=str)
@pytest.mark.parametrize("const_k", [True, False])
def test_topk_ties(largest, axis_k, const_k):
    axis, k = axis_k
    attrs = {"axis": axis, "largest": largest}
    kw = {"const_inputs": [1]} if const_k else {}
    check_op("TopK", [TIES, np.array([k], np.int64)], attrs, n_outputs=2, **kw)
    check_op("TopK", [TIES, np.array([k], np.int64)], attrs, n_outputs=2, symbolic=False, **kw)


@pytest.mark.parametrize(
    "dtype", [np.float16, np.float32, np.float64, np.int32, np.int64, np.uint8, np.int8]
)
@pytest.mark.parametrize("shape_axis", [((10,), 0), ((3, 6, 4), 1), ((2, 3, 5), -1)], ids=str)
def test_topk_dtypes(dtype, shape_axis):
    shape, axis = shape_axis
    x = rand(shape, dtype, lo=-50, hi=50)
    for largest in (0, 1):
        attrs = {"axis": axis, "largest": largest, "sorted": 1}
        check_op("TopK", [x, np.array([2], np.int64)], attrs, n_outputs=2, const_inputs=[1])


def test_topk_unsorted_and_infer():
    x = rand((4, 7))
    # sorted=0 leaves the order unspecified; geode returns it sorted, which conforms
    check_op("TopK", [x, np.array([3], np.int64)], {"sorted": 0}, n_outputs=2, const_inputs=[1])
    g = geode.Graph("tk")
    xv = g.input("x", ["N", 7])
    v, i = g.op("TopK", xv, g.constant(np.array([3], np.int64)), n_outputs=2)
    assert v.shape == (sym("N"), 3) and i.shape == (sym("N"), 3) and i.dtype == np.int64
    v2, _ = g.op("TopK", xv, g.input("k", [1], "int64"), axis=0, n_outputs=2)
    assert v2.shape[1] == 7 and not isinstance(v2.shape[0], int)
    k_from_shape = g.op("Shape", g.input("y", [2, "K"]), start=1)
    v3, _ = g.op("TopK", g.input("z", ["M", 40]), k_from_shape, n_outputs=2)
    assert v3.shape == (sym("M"), sym("K"))
    with pytest.raises(ShapeError, match="'tk_big'.*K=9"):
        g.op("TopK", xv, g.constant(np.array([9], np.int64)), n_outputs=2, name="tk_big")
    with pytest.raises(DTypeError, match="TopK"):
        g.op("TopK", xv, g.constant(np.array([2], np.int32)), n_outputs=2)
    with pytest.raises(DTypeError, match="TopK"):
        g.op("TopK", g.input("b", [4], "bool"), g.constant(np.array([2], np.int64)), n_outputs=2)


# == Unique ===================================================================================

U1 = np.array([2, 1, 1, 3, 4, 3, 0, 2], dtype=np.int64)
U2 = np.array([[1, 0, 0], [1, 0, 0], [2, 3, 4], [1, 0, 0]], dtype=np.float32)


def _unique_expect(x, axis, sorted_):
    """Unique per the spec, by a first-occurrence scan (sorted: then ordered by value)."""
    xs = x.reshape(-1) if axis is None else np.moveaxis(x, axis, 0)
    keys, first, counts, inverse = [], [], [], []
    for i, item in enumerate(xs):
        key = np.asarray(item).tobytes()
        if key not in keys:
            keys.append(key)
            first.append(i)
            counts.append(0)
        j = keys.index(key)
        counts[j] += 1
        inverse.append(j)
    order = list(range(len(keys)))
    if sorted_:
        order = sorted(order, key=lambda j: tuple(np.asarray(xs[first[j]]).reshape(-1).tolist()))
    rank = {j: r for r, j in enumerate(order)}
    ys = np.stack([xs[first[j]] for j in order])
    y = ys if axis is None else np.moveaxis(ys, 0, axis)
    as64 = lambda v: np.asarray(v, dtype=np.int64)  # noqa: E731
    return [
        y,
        as64([first[j] for j in order]),
        as64([rank[j] for j in inverse]),
        as64([counts[j] for j in order]),
    ]


@pytest.mark.parametrize("const", [True, False])
def test_unique_sorted(const):
    kw = {"const_inputs": [0]} if const else {}
    check_op("Unique", [U1], n_outputs=4, **kw)
    check_op("Unique", [U2], {"axis": 0}, n_outputs=4, **kw)
    check_op("Unique", [U1.astype(np.float64)], n_outputs=2, symbolic=False, **kw)
    check_op("Unique", [U2], n_outputs=4, **kw)


@pytest.mark.parametrize("case", [(U1, None), (U2, None), (U2, 0), (U2, 1), (U2, -1)], ids=str)
@pytest.mark.parametrize("sorted_", [0, 1])
def test_unique_expectation(case, sorted_):
    # With sorted=0 the evaluator gathers the values along axis 0 of the unflattened
    # input (wrong for axis=None on N-D data and for axis != 0), and with one output
    # it returns them sorted: compare every case with the explicit scan as well.
    x, axis = case
    attrs = {"sorted": sorted_} if axis is None else {"sorted": sorted_, "axis": axis}
    want = _unique_expect(x, axis, sorted_)
    check_expect("Unique", [x], attrs, want, n_outputs=4)
    check_expect("Unique", [x], attrs, want, n_outputs=4, const_inputs=[0])


def test_unique_infer():
    g = geode.Graph("u")
    y, idx, inv, cnt = g.op("Unique", g.input("x", ["N", 3]), n_outputs=4)
    assert inv.shape == (3 * sym("N"),) and y.shape == idx.shape == cnt.shape
    y, idx, inv, cnt = g.op("Unique", g.input("z", ["N", 3]), axis=0, n_outputs=4)
    assert y.shape[1] == 3 and inv.shape == (sym("N"),)
    yc = g.op("Unique", g.constant(U1))
    assert yc.shape == (5,)


# == NonMaxSuppression ========================================================================

NMS_BOXES = np.array(
    [
        [
            [0, 0, 1, 1],
            [0, 0.1, 1, 1.1],
            [0, -0.1, 1, 0.9],
            [0, 10, 1, 11],
            [0, 10.1, 1, 11.1],
            [0, 100, 1, 101],
        ]
    ],
    dtype=np.float32,
)
NMS_SCORES = np.array([[[0.9, 0.75, 0.6, 0.95, 0.5, 0.3]]], dtype=np.float32)


def _nms_inputs(boxes, scores, max_out=3, iou=0.5, score=None):
    ins = [boxes, scores, np.array([max_out], np.int64), np.array([iou], np.float32)]
    return ins if score is None else [*ins, np.array([score], np.float32)]


@pytest.mark.parametrize(
    "case",
    [
        {},
        {"score": 0.4},
        {"max_out": 2},
        {"max_out": 0},
        {"iou": 0.0},
        {"iou": 0.9, "max_out": 10},
    ],
    ids=str,
)
@pytest.mark.parametrize("const", [True, False])
def test_nms(case, const):
    ins = _nms_inputs(NMS_BOXES, NMS_SCORES, **case)
    kw = {"const_inputs": list(range(len(ins)))} if const else {}
    got = check_op("NonMaxSuppression", ins, **kw)
    if case == {}:
        np.testing.assert_array_equal(got[0], [[0, 0, 3], [0, 0, 0], [0, 0, 5]])


def test_nms_center_flipped_batches_classes():
    # corners given in either order, centre-point boxes, two batches and two classes
    flipped = NMS_BOXES[:, :, [2, 3, 0, 1]].copy()
    check_op("NonMaxSuppression", _nms_inputs(flipped, NMS_SCORES))
    centers = np.array(
        [
            [
                [0.5, 0.5, 1, 1],
                [0.5, 0.6, 1, 1],
                [0.5, 0.4, 1, 1],
                [0.5, 10.5, 1, 1],
                [0.5, 10.6, 1, 1],
                [0.5, 100.5, 1, 1],
            ]
        ],
        np.float32,
    )
    check_op("NonMaxSuppression", _nms_inputs(centers, NMS_SCORES), {"center_point_box": 1})
    boxes = np.concatenate([NMS_BOXES, NMS_BOXES[:, ::-1]], axis=0)
    scores = np.concatenate([NMS_SCORES, NMS_SCORES[:, :, ::-1]], axis=1)
    scores = np.concatenate([scores, scores[:, ::-1]], axis=0)
    check_op("NonMaxSuppression", _nms_inputs(boxes, scores, max_out=2, score=0.35), symbolic=False)


@pytest.mark.parametrize("seed", range(6))
def test_nms_random(seed):
    r = np.random.default_rng(seed)
    corners = r.uniform(0, 10, (2, 30, 2, 2)).astype(np.float32)
    boxes = np.concatenate(
        [corners[:, :, 0], corners[:, :, 0] + r.uniform(0.5, 4, (2, 30, 2))], axis=-1
    )
    scores = np.round(r.uniform(0, 1, (2, 3, 30)), 1).astype(np.float32)  # many ties
    check_op(
        "NonMaxSuppression",
        _nms_inputs(boxes.astype(np.float32), scores, max_out=7, iou=0.3, score=0.2),
    )
    check_op(
        "NonMaxSuppression", _nms_inputs(boxes.astype(np.float32), scores, max_out=40, iou=0.6)
    )


def test_nms_optional_inputs_and_errors():
    # The evaluator reads .size of every optional input, so it fails when one is omitted:
    # explicit expectations. Without max_output_boxes_per_class nothing is selected (its
    # default is 0); without iou_threshold (default 0) any overlap suppresses.
    check_expect("NonMaxSuppression", [NMS_BOXES, NMS_SCORES], {}, [np.zeros((0, 3), np.int64)])
    want = np.array([[0, 0, 3], [0, 0, 0], [0, 0, 5]], np.int64)
    ins = [NMS_BOXES, NMS_SCORES, np.array([5], np.int64)]
    check_expect("NonMaxSuppression", ins, {}, [want])
    check_expect("NonMaxSuppression", ins, {}, [want], const_inputs=[0, 1, 2])
    g = geode.Graph("nms")
    with pytest.raises(ShapeError, match="'nms_bad'.*boxes"):
        g.op("NonMaxSuppression", g.input("b", [1, 6, 4]), g.input("s", [1, 2, 5]), name="nms_bad")
    y = g.op("NonMaxSuppression", g.input("b2", ["B", "K", 4]), g.input("s2", ["B", 2, "K"]))
    assert y.shape[1] == 3 and not isinstance(y.shape[0], int) and y.dtype == np.int64


# == ONNX's own node test cases ================================================================
# As in test_ops_nn: onnx generates its backend node tests (inputs and spec-computed
# outputs) when their modules are imported; every case runs through geode's kernel and
# InferShape, with the shape-giving inputs both as graph inputs and as constants.

ONNX_CASE_MODULES = {
    "shape": "Shape",
    "size": "Size",
    "constantofshape": "ConstantOfShape",
    "rangeop": "Range",
    "nonzero": "NonZero",
    "eyelike": "EyeLike",
    "onehot": "OneHot",
    "topk": "TopK",
    "unique": "Unique",
    "nonmaxsuppression": "NonMaxSuppression",
}


@pytest.mark.parametrize("const", [False, True])
@pytest.mark.parametrize("module", sorted(ONNX_CASE_MODULES))
def test_onnx_node_cases(module, const):
    cases = onnx_node_cases(module, ONNX_CASE_MODULES[module])
    assert cases, f"no ONNX node test cases found for {module}"
    skipped = {c.name: why for c in cases if (why := run_onnx_node_case(c, const))}
    assert len(skipped) < len(cases), skipped
    if skipped:  # said out loud, in pytest's warnings summary
        warnings.warn(f"ONNX node cases not run: {skipped}", stacklevel=1)
