"""Symbol unification (issue 37): elementwise ops between different symbolic dims.

``x[N, 16] + y[M, 16]`` is legal when N == M or one of them is 1 (ONNX broadcasting).
The compiled model records that constraint and checks it when the inputs bind N and M,
and runs the chain as one native kernel that reads a side whose dim is 1 at index 0
(kernel counts through ``model.kernels``). Results are compared with the reference
path (numpy kernels) and, for an ONNX model, with ``onnx.reference.ReferenceEvaluator``.
"""

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import geode
from geode import ops
from geode.compiler.interpret import run_reference
from geode.errors import GeodeError, InputShapeError

#: (N, M) pairs that broadcast: equal, either side 1, both 1, and 0 sizes
GOOD_PAIRS = [(4, 4), (1, 4), (4, 1), (1, 1), (0, 0), (0, 1), (1, 0), (33, 33)]


def native(model):
    return [k for k in model.kernels if k.engine == "aicore"]


def check_against_reference(model, graph, feeds, rtol=1e-5):
    got = model(**feeds)
    want = run_reference(graph, feeds, check=True)
    for name, w in want.items():
        assert got[name].shape == w.shape, f"{name}: {got[name].shape} != {w.shape}"
        np.testing.assert_allclose(got[name], w, rtol=rtol, atol=1e-6, err_msg=name)
    return got


def add_exp_mul(x_dims=("N", 16), y_dims=("M", 16)):
    g = geode.Graph("add_exp_mul")
    x = g.input("x", list(x_dims))
    y = g.input("y", list(y_dims))
    s = x + y
    g.output(ops.exp(s) * s, names=["z"])
    return g


@pytest.fixture(scope="module")
def chain():
    g = add_exp_mul()
    return g, geode.compile(g)


def test_add_exp_mul_is_one_native_kernel(chain):
    _, model = chain
    assert len(model.kernels) == 1
    (k,) = model.kernels
    assert k.engine == "aicore"
    assert sorted(n.op_type for n in k.ops) == ["Add", "Exp", "Mul"]
    text = model.explain()
    assert "outputs: z: float32[bcast(M, N), 16]" in text
    assert "broadcasts (checked at run time: equal or 1): M, N (node 'add' (Add))" in text


@pytest.mark.parametrize(("n", "m"), GOOD_PAIRS)
def test_add_exp_mul_matches_reference(chain, n, m):
    g, model = chain
    rng = np.random.default_rng(n * 100 + m)
    x = rng.standard_normal((n, 16), dtype=np.float32)
    y = rng.standard_normal((m, 16), dtype=np.float32)
    got = check_against_reference(model, g, {"x": x, "y": y})["z"]
    s = x + y
    np.testing.assert_allclose(got, np.exp(s) * s, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("n", "m"), [(5, 6), (6, 5), (0, 2), (3, 0)])
def test_sizes_that_cannot_broadcast_raise(chain, n, m):
    _, model = chain
    feeds = {"x": np.ones((n, 16), np.float32), "y": np.ones((m, 16), np.float32)}
    with pytest.raises(InputShapeError, match="cannot broadcast") as info:
        model(**feeds)
    assert isinstance(info.value, GeodeError)
    text = str(info.value)
    assert f"N = {n}" in text and f"M = {m}" in text and "'add'" in text
    # a good call after a refused one still runs
    ok = {"x": np.ones((n, 16), np.float32), "y": np.ones((1, 16), np.float32)}
    assert model(**ok)["z"].shape == (n, 16)


def test_broadcast_along_the_inner_axis():
    """The broadcast axis is the innermost, vectorized loop: its stride is 0 or 1."""
    g = add_exp_mul(("K", "N"), ("K", "M"))
    model = geode.compile(g)
    assert len(model.kernels) == 1 and model.kernels[0].engine == "aicore"
    rng = np.random.default_rng(1)
    for n, m in [(37, 37), (1, 37), (37, 1), (1, 1), (0, 1)]:
        feeds = {
            "x": rng.standard_normal((3, n), dtype=np.float32),
            "y": rng.standard_normal((3, m), dtype=np.float32),
        }
        check_against_reference(model, g, feeds)


def three_symbols():
    g = geode.Graph("three_symbols")
    x = g.input("x", ["N", 16])
    y = g.input("y", ["M", 16])
    w = g.input("w", ["K", 16])
    s = ops.tanh(x + y) * w
    g.output(ops.exp(s) - x, names=["z"])
    return g


def test_three_inputs_three_symbols():
    g = three_symbols()
    model = geode.compile(g)
    assert len(model.kernels) == 1 and model.kernels[0].engine == "aicore"
    assert len(model.kernels[0].ops) == 5
    rng = np.random.default_rng(2)
    sizes = [(n, m, k) for n, m, k in itertools.product((1, 3), repeat=3)]
    sizes += [(0, 1, 0), (1, 0, 1), (0, 0, 0), (1, 1, 0)]
    for n, m, k in sizes:
        feeds = {
            "x": rng.standard_normal((n, 16), dtype=np.float32),
            "y": rng.standard_normal((m, 16), dtype=np.float32),
            "w": rng.standard_normal((k, 16), dtype=np.float32),
        }
        got = check_against_reference(model, g, feeds)["z"]
        assert got.shape == (max(n, m, k) if 0 not in (n, m, k) else 0, 16)
    bad = {
        "x": np.ones((3, 16), np.float32),
        "y": np.ones((1, 16), np.float32),
        "w": np.ones((2, 16), np.float32),
    }
    with pytest.raises(InputShapeError, match=r"K = 2 and N = 3 cannot broadcast"):
        model(**bad)


def test_symbol_against_a_static_dim():
    """``x[N, 16] + y[5, 16]`` is ``[5, 16]``: legal for N in (1, 5), checked, one kernel."""
    g = add_exp_mul(("N", 16), (5, 16))
    model = geode.compile(g)
    assert len(model.kernels) == 1 and model.kernels[0].engine == "aicore"
    rng = np.random.default_rng(3)
    for n in (1, 5):
        feeds = {
            "x": rng.standard_normal((n, 16), dtype=np.float32),
            "y": rng.standard_normal((5, 16), dtype=np.float32),
        }
        check_against_reference(model, g, feeds)
    feeds = {"x": np.ones((3, 16), np.float32), "y": np.ones((5, 16), np.float32)}
    with pytest.raises(InputShapeError, match=r"dims 5 and N = 3 cannot broadcast"):
        model(**feeds)


def test_fusion_reaches_across_a_symbolic_broadcast():
    """A producer on ``[N, 16]`` fuses into the group on ``[bcast(M, N), 16]``."""
    g = geode.Graph("producer")
    x = g.input("x", ["N", 16])
    y = g.input("y", ["M", 16])
    g.output(ops.sigmoid(ops.exp(x) + y) * x, names=["z"])
    model = geode.compile(g)
    assert len(model.kernels) == 1 and model.kernels[0].engine == "aicore"
    rng = np.random.default_rng(4)
    for n, m in [(6, 6), (1, 6), (6, 1), (0, 1)]:
        feeds = {
            "x": rng.standard_normal((n, 16), dtype=np.float32),
            "y": rng.standard_normal((m, 16), dtype=np.float32),
        }
        check_against_reference(model, g, feeds)


def onnx_two_dim_params():
    f = TensorProto.FLOAT
    nodes = [
        helper.make_node("Add", ["x", "y"], ["s"]),
        helper.make_node("Exp", ["s"], ["e"]),
        helper.make_node("Mul", ["e", "s"], ["z"]),
    ]
    graph = helper.make_graph(
        nodes,
        "two_dim_params",
        [
            helper.make_tensor_value_info("x", f, ["batch", 8]),
            helper.make_tensor_value_info("y", f, ["rows", 8]),
        ],
        [helper.make_tensor_value_info("z", f, None)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_onnx_model_with_two_dim_params():
    proto = onnx_two_dim_params()
    model = geode.compile(proto)
    assert len(model.kernels) == 1 and model.kernels[0].engine == "aicore"
    graph = geode.api.to_graph(proto)
    ref = ReferenceEvaluator(proto)
    rng = np.random.default_rng(5)
    for b, r in GOOD_PAIRS:
        feeds = {
            "x": rng.standard_normal((b, 8), dtype=np.float32),
            "y": rng.standard_normal((r, 8), dtype=np.float32),
        }
        got = check_against_reference(model, graph, feeds)["z"]
        (want,) = ref.run(None, feeds)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(InputShapeError, match=r"batch = 5 and rows = 6|rows = 6 and batch = 5"):
        model(x=np.ones((5, 8), np.float32), y=np.ones((6, 8), np.float32))


# -- random symbolic broadcast pairs ---------------------------------------------------------

#: per axis of an operand: a symbol of its own, a symbol shared by both operands, or static
AXIS_KINDS = ["own", "shared", "one", "static"]


@st.composite
def broadcast_pairs(draw):
    """Two operand shapes of the same rank (1 to 3), each axis a symbol of that operand,
    a symbol both share, or a static 1 or 4; bindings of the symbols that mostly
    broadcast (per axis a common size, 0 included, and each symbol that size or 1), and
    one of arbitrary sizes (mostly not); and the binary op."""
    rank = draw(st.integers(1, 3))
    shapes: tuple[list, list] = ([], [])
    for axis in range(rank):
        for side in (0, 1):
            kind = draw(st.sampled_from(AXIS_KINDS))
            own = f"{'ab'[side]}{axis}"
            shapes[side].append({"own": own, "shared": f"s{axis}", "one": 1, "static": 4}[kind])
    bindings = []
    for _ in range(3):
        env = {}
        for axis in range(rank):
            common = 4 if 4 in (shapes[0][axis], shapes[1][axis]) else None
            common = common or draw(st.sampled_from([0, 2, 3, 5]))
            for d in (shapes[0][axis], shapes[1][axis]):
                if isinstance(d, str):
                    env[d] = draw(st.sampled_from([common, 1]))
        bindings.append(env)
    names = sorted({d for s in shapes for d in s if isinstance(d, str)})
    bindings.append({n: draw(st.integers(0, 4)) for n in names})
    op = draw(st.sampled_from(["add", "sub", "mul", "max"]))
    return shapes, bindings, op


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
@given(broadcast_pairs())
def test_random_symbolic_broadcast_pairs(case):
    """Random symbolic broadcast pairs: one native kernel; each binding runs like numpy
    (and the reference path) or, where numpy cannot broadcast, raises a GeodeError."""
    (sa, sb), bindings, op = case
    g = geode.Graph("pair")
    a, b = g.input("a", sa), g.input("b", sb)
    r = {"add": ops.add, "sub": ops.sub, "mul": ops.mul, "max": ops.max}[op](a, b)
    g.output(ops.tanh(r) * a, names=["z"])
    model = geode.compile(g)
    assert len(model.kernels) == 1 and model.kernels[0].engine == "aicore", model.explain()
    rng = np.random.default_rng(6)
    fn = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "max": np.maximum}[op]
    for env in bindings:
        xa = rng.standard_normal([env.get(d, d) for d in sa]).astype(np.float32)
        xb = rng.standard_normal([env.get(d, d) for d in sb]).astype(np.float32)
        try:
            want = np.tanh(fn(xa, xb)) * xa
        except ValueError:
            want = None
        if want is None:
            with pytest.raises(GeodeError):
                model(a=xa, b=xb)
            continue
        got = check_against_reference(model, g, {"a": xa, "b": xb})["z"]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
