"""Bad inputs to a compiled model raise GeodeError subclasses naming what and where."""

import re

import numpy as np
import pytest

import geode
import geode.compiler.shapes
from geode import ops
from geode.errors import (
    ExecutionError,
    GeodeError,
    GraphError,
    InputDTypeError,
    InputError,
    InputShapeError,
    MissingInputError,
    ShapeError,
    UnexpectedInputError,
    UnknownOpError,
)


@pytest.fixture(scope="module")
def model():
    g = geode.Graph("two_inputs")
    x = g.input("x", ["N", 4], "float32")
    y = g.input("y", ["N", 4], "float32")
    z = g.input("z", [2, "K"], "int64")
    g.output(x + y, ops.cast(z, to=1), names=["s", "zc"])
    return geode.compile(g)


def feeds(n=3, m=None, k=5):
    return {
        "x": np.zeros((n, 4), np.float32),
        "y": np.zeros((n if m is None else m, 4), np.float32),
        "z": np.zeros((2, k), np.int64),
    }


def test_good_inputs_run(model):
    out = model(**feeds())
    assert out["s"].shape == (3, 4) and out["zc"].dtype == np.float32


def test_missing_input(model):
    f = feeds()
    del f["y"]
    with pytest.raises(MissingInputError, match=r"missing input\(s\) y: float32\[N, 4\]"):
        model(**f)


def test_extra_input(model):
    with pytest.raises(UnexpectedInputError, match=r"unexpected input\(s\) \['w'\]"):
        model(**feeds(), w=np.zeros(1))


def test_wrong_dtype(model):
    f = feeds()
    f["x"] = f["x"].astype(np.float64)
    with pytest.raises(InputDTypeError, match=r"input 'x': dtype float64, expected float32"):
        model(**f)


def test_wrong_rank(model):
    f = feeds()
    f["z"] = np.zeros((2, 5, 1), np.int64)
    with pytest.raises(InputShapeError, match=r"input 'z': rank 3 .* expected rank 2"):
        model(**f)


def test_static_dim_contradicts(model):
    f = feeds()
    f["x"] = np.zeros((3, 5), np.float32)
    with pytest.raises(InputShapeError, match=r"input 'x': dim 1 is 5, expected 4"):
        model(**f)


def test_symbol_uses_disagree(model):
    with pytest.raises(
        InputShapeError,
        match=r"input 'y': dim 0 is 7, but symbol N is already 3 from input 'x' dim 0",
    ):
        model(**feeds(n=3, m=7))


def test_not_an_array(model):
    f = feeds()
    f["x"] = "hello"
    with pytest.raises(InputError, match=r"input 'x': expected a numpy array, got str"):
        model(**f)


def test_errors_are_geode_errors(model):
    for bad in (dict(feeds(), w=1), {"x": 1}):
        with pytest.raises(GeodeError):
            model(**bad)


def test_expression_dim_checked():
    n = geode.compiler.shapes.sym("N")
    g = geode.Graph("expr_dim")
    a = g.input("a", ["N"])
    b = g.input("b", [2 * n])
    g.output(ops.concat(a, a, axis=0) + b, names=["y"])
    model = geode.compile(g)
    out = model(a=np.ones(3, np.float32), b=np.ones(6, np.float32))["y"]
    assert out.shape == (6,)
    with pytest.raises(InputShapeError, match=r"input 'b': dim 0 is 5, expected 2\*N = 6"):
        model(a=np.ones(3, np.float32), b=np.ones(5, np.float32))


HOSTILE_DIMS = [
    "N+1",
    "a b",
    "for",
    "math.__dict__[__import__('os').system('touch {marker}')]",
    "N\nimport os; os.system('touch {marker}')\n#",
    "N'); __import__('os').system('touch {marker}'); ('",
]


@pytest.mark.parametrize("dim", HOSTILE_DIMS)
def test_dim_names_never_become_code(tmp_path, dim):
    """A dim name is text from the model: any text is a valid symbol name, and none is run
    (the runtime's shape functions and the kernel source name symbols by position)."""
    marker = tmp_path / "ran"
    dim = dim.format(marker=marker)
    g = geode.Graph("g")
    x = g.input("x", [dim, 3])
    flat = ops.reshape(ops.relu(x) * 2.0, g.constant(np.array([-1], np.int64)))
    g.output(flat, x + 1.0, names=["y", "z"])
    model = geode.compile(g)
    a = np.arange(-3, 3, dtype=np.float32).reshape(2, 3)
    out = model(x=a)
    np.testing.assert_array_equal(out["y"], (np.maximum(a, 0) * 2).ravel())
    np.testing.assert_array_equal(out["z"], a + 1)
    assert not marker.exists()


def test_onnx_dim_param_never_becomes_code(tmp_path):
    """The same through an ONNX file's dim_param, the way a hostile model arrives."""
    from onnx import TensorProto, helper, save

    marker = tmp_path / "ran"
    dim = f"math.__dict__[__import__('os').system('touch {marker}')]"
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [dim, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "r"], ["y"])]
    graph = helper.make_graph(nodes, "g", [x], [y])
    path = tmp_path / "evil.onnx"
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    a = np.arange(-3, 3, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(geode.compile(str(path))(x=a)["y"], 2 * np.maximum(a, 0))
    assert not marker.exists()


def test_reshape_minus_one_needs_a_divisible_symbolic_count():
    """Reshape [N, 3] -> [-1, 4] is only whole when 4 divides 3*N: a run where it does not
    raises InputShapeError naming the Reshape (it returned a truncated [1, 4])."""
    g = geode.Graph("r")
    x = g.input("x", ["N", 3])
    g.output(ops.reshape(x, g.constant(np.array([-1, 4], np.int64))) * 2.0, names=["y"])
    model = geode.compile(g)
    a = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.testing.assert_array_equal(model(x=a)["y"], a.reshape(-1, 4) * 2)
    with pytest.raises(InputShapeError, match=r"Reshape.*divisible by 4.*\(2 != 0\)"):
        model(x=a[:2])


def test_expand_to_run_time_shape_values_that_do_not_broadcast():
    """Expand's target known only at run time: values that do not broadcast with the input
    raise (the Expand was dropped as a no-op and the values ignored); valid ones work."""
    g = geode.Graph("e")
    x = g.input("x", [2, 5])
    s = g.input("s", [2], "int64")
    g.output(ops.expand(x, s) + 1.0, names=["y"])
    model = geode.compile(g)
    a = np.arange(10, dtype=np.float32).reshape(2, 5)
    for ok in ([2, 5], [1, 5], [2, 1], [1, 1]):
        np.testing.assert_array_equal(model(x=a, s=np.array(ok))["y"], a + 1)
    for bad in ([3, 5], [2, 4], [0, 5]):
        with pytest.raises(GeodeError, match="Expand.*cannot be broadcast"):
            model(x=a, s=np.array(bad))


@pytest.mark.parametrize("bad", [None, [np.zeros((3, 4), np.float32)], "x"], ids=repr)
def test_feeds_that_are_not_a_mapping(model, bad):
    with pytest.raises(InputError, match="feeds must map input names to arrays, got"):
        model.run(bad)


def test_unexpected_feed_names_of_mixed_types_are_listed(model):
    f = feeds()
    f.update({0: f["x"], "w": f["x"], b"v": f["x"]})
    with pytest.raises(UnexpectedInputError, match=r"unexpected input\(s\) \['w', 0, b'v'\]"):
        model.run(f)


def test_masked_array_feed_is_refused(model):
    f = feeds()
    f["x"] = np.ma.masked_array(f["x"], mask=np.zeros_like(f["x"], bool))
    with pytest.raises(InputError, match="input 'x': a masked array"):
        model.run(f)


def test_byte_swapped_feeds_give_the_same_results(model):
    """A big-endian array (e.g. read from a file written elsewhere) holds the same values:
    it is converted, not refused (the reference path already accepted it); a strided
    one too. Another type of the same width is still an InputDTypeError."""
    rng = np.random.default_rng(0)
    native = {
        "x": rng.standard_normal((3, 4), dtype=np.float32),
        "y": rng.standard_normal((3, 4), dtype=np.float32),
        "z": rng.integers(-9, 9, (2, 5)),
    }
    swapped = {k: v.astype(v.dtype.newbyteorder(">")) for k, v in native.items()}
    swapped["y"] = np.asfortranarray(swapped["y"])
    want, got = model.run(native), model.run(swapped)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
    assert swapped["x"].dtype.byteorder == ">"  # the caller's arrays are untouched
    bad = dict(native, x=native["x"].view(">i4"))
    with pytest.raises(InputDTypeError, match="input 'x': dtype"):
        model.run(bad)


def test_broadcast_view_too_large_to_copy(model):
    """A zero-stride view is legal numpy but its contiguous copy would need 2**40 * 16
    bytes: InputError naming the input and the size, refused before copying."""
    f = feeds()
    f["x"] = np.lib.stride_tricks.as_strided(np.zeros(4, np.float32), (2**40, 4), (0, 4))
    f["y"] = np.lib.stride_tricks.as_strided(np.zeros(4, np.float32), (2**40, 4), (0, 4))
    with pytest.raises(
        InputError,
        match=r"input 'x': float32\[1099511627776, 4\] is a strided view; its "
        r"contiguous copy needs 16.0 TiB \(17592186044416 bytes\), more than",
    ):
        model.run(f)


# -- bad graph declarations through the Python API ----------------------------------------


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        (3, "shape must be a sequence of dims, got int"),
        ("N", "shape must be a sequence of dims, got str"),
        ([-2, 3], "dim -2 is negative"),
        ([1.5, 3], "dim 1.5 is not an int, a name or None"),
        ([True, 3], "dim True is not an int, a name or None"),
    ],
)
def test_bad_input_declaration(shape, message):
    g = geode.Graph("g")
    with pytest.raises(GraphError, match=f"input 'x': {re.escape(message)}"):
        g.input("x", shape)


def test_unknown_dims_and_numpy_ints_are_accepted():
    g = geode.Graph("g")
    x = g.input("x", [None, -1, np.int64(3), "N"])
    assert x.shape[2] == 3 and len(x.shape) == 4


def test_ragged_constant_and_variable_are_graph_errors():
    g = geode.Graph("g")
    with pytest.raises(GraphError, match="constant 'c': cannot make an array of list"):
        g.constant([[1, 2], [3]], name="c")
    with pytest.raises(GraphError, match="variable 'v': cannot make an array of list"):
        g.variable([[1.0], [2.0, 3.0]], "v")


def test_unknown_op_in_geode_ops():
    """geode.ops.<no such op> is an UnknownOpError, and still an AttributeError so that
    hasattr and getattr with a default work."""
    with pytest.raises(UnknownOpError, match="unknown op 'frobnicate'.*at geode.ops"):
        ops.frobnicate  # noqa: B018
    assert not hasattr(ops, "frobnicate") and getattr(ops, "frobnicate", None) is None
    assert hasattr(ops, "relu")


def test_input_too_small_for_a_convolution_window():
    """A symbolic H smaller than the kernel gives an output dim H - 2 < 0: ExecutionError
    naming the step and the shape (a bare ValueError came from the arena)."""
    g = geode.Graph("conv_small")
    x = g.input("x", [1, 1, "H", "W"])
    g.output(ops.relu(ops.conv(x, g.constant(np.ones((1, 1, 3, 3), np.float32)))), names=["y"])
    model = geode.compile(g)
    np.testing.assert_array_equal(model(x=np.ones((1, 1, 3, 4), np.float32))["y"], [[[[9, 9]]]])
    too_small = r"step '(chain:)?conv(_fused)?'.*shape \[1, 1, -1, -1\].*too small"
    with pytest.raises(ExecutionError, match=too_small):
        model(x=np.ones((1, 1, 1, 1), np.float32))
    with pytest.raises(ShapeError, match="too small for the window"):  # an output dim of 0
        model(x=np.ones((1, 1, 2, 4), np.float32))


def test_remembered_input_shapes_still_check_every_call():
    """The executor remembers the binding of input shapes that passed (the checks depend
    on the shapes alone); every feed that differs in what those checks see still takes
    the full checks, and shapes that failed are never remembered."""
    g = geode.Graph("remembered")
    x = g.input("x", ["N", 4], "float32")
    y = g.input("y", ["N", 4], "float32")
    g.output(x * y + 1.0, names=["s"])
    model = geode.compile(g)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 3, 4), dtype=np.float32)
    for _ in range(3):  # the first call checks, the next ones are remembered
        np.testing.assert_allclose(model(x=a, y=b)["s"], a * b + 1, rtol=1e-6)
    c, d = rng.standard_normal((2, 5, 4), dtype=np.float32)  # new shapes: checked, run
    np.testing.assert_allclose(model(x=c, y=d)["s"], c * d + 1, rtol=1e-6)
    # the remembered shapes with other dtypes, kinds of array and names still fail
    with pytest.raises(InputDTypeError, match="'x'"):
        model(x=a.astype(np.float64), y=b)
    with pytest.raises(InputError, match="masked"):
        model(x=np.ma.masked_array(a), y=b)
    with pytest.raises(UnexpectedInputError):
        model(x=a, y=b, z=b)
    with pytest.raises(MissingInputError):
        model(x=a)
    for _ in range(2):  # a failed binding is not remembered
        with pytest.raises(InputShapeError, match="symbol N"):
            model(x=a, y=d)
    # other layouts of the remembered shapes take the full path and give the same results
    fa = np.asfortranarray(a)
    np.testing.assert_allclose(model(x=fa, y=b)["s"], a * b + 1, rtol=1e-6)
    sw = a.astype(a.dtype.newbyteorder())
    np.testing.assert_allclose(model(x=sw, y=b)["s"], a * b + 1, rtol=1e-6)


def test_remembered_shapes_do_not_fix_data_dependent_output_shapes():
    """A binding remembered for input shapes holds only the symbols the inputs bind;
    symbols a step binds at run time (NonZero's count) are bound afresh every call."""
    g = geode.Graph("nz")
    g.output(g.op("NonZero", g.input("x", ["N", 4])), names=["idx"])
    model = geode.compile(g)
    for k in (3, 7, 0, 5):
        x = np.zeros((2, 4), np.float32)
        x.flat[:k] = 1
        got = model(x=x)["idx"]
        assert got.shape == (2, k)
        np.testing.assert_array_equal(got, np.array(np.nonzero(x)))
