"""Lowering: each fused group's unscheduled loop AST computes what the reference does."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lowering_check import check_groups

import geode
from geode import examples, ops
from geode.codegen import ast as A
from geode.codegen.lower import lower_group

rng = np.random.default_rng(3)


@pytest.mark.parametrize("name", sorted(examples.ALL))
def test_examples_lower_correctly(name):
    ex = examples.ALL[name]()
    feeds = ex.make_inputs(rng, 2)
    if name == "reduce_chain":
        feeds = {"x": rng.standard_normal((2, 3, 1024), dtype=np.float32)}
    assert check_groups(ex.graph, feeds) >= 1


def _graph(build, shapes, dtype="float32"):
    g = geode.Graph("t")
    xs = [g.input(f"x{i}", s, dtype) for i, s in enumerate(shapes)]
    outs = build(*xs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    g.output(*outs, names=[f"y{i}" for i in range(len(outs))])
    return g


CASES = {
    "broadcast": (lambda a, b: ops.relu(a - b) * 3.0, [["N", 5], [5]]),
    "where_cmp": (lambda a, b: ops.where(a > b, a, ops.exp(b)), [[4, "M"], [4, "M"]]),
    "transpose": (lambda a: ops.transpose(ops.sigmoid(a), perm=[1, 0]), [[3, "M"]]),
    "reshape": (lambda a: ops.reshape(a * 2.0, [2, -1]), [[4, 6]]),
    "concat": (lambda a, b: ops.concat(a, ops.tanh(b), axis=1), [["N", 2], ["N", 3]]),
    "split": (lambda a: tuple(x * 1.5 for x in ops.split(a, axis=1, num_outputs=3)), [["N", 6]]),
    "slice": (lambda a: a[:, 1:5:2] + 1.0, [[3, 7]]),
    # a negative-step start before the first element clamps to 0 (ONNX), not to -1 (Python
    # slicing, which read one element before the buffer)
    "slice_negative_step_start_before_begin": (
        lambda a: ops.slice(ops.exp(a), [-100, -1], [-7, -(2**63)], [1, 0], [-2, -2]),
        [[3, 5]],
    ),
    "gather": (lambda a: ops.gather(a, np.array([2, -1, 0], np.int64), axis=1), [[3, 4]]),
    "reduce_max_min": (
        lambda a: (
            ops.reduce_max(a, axes=[1], keepdims=0),
            ops.reduce_min(a, axes=[0], keepdims=1),
        ),
        [[5, 6]],
    ),
    "reduce_prod_mean": (
        lambda a: (
            ops.reduce_prod(a, axes=[0, 2], keepdims=0)
            + ops.reduce_mean(a, axes=[0, 2], keepdims=0)
        ),
        [[2, 3, 4]],
    ),
    "cast_clip": (lambda a: ops.clip(ops.cast(a, to=7), np.int64(-2), np.int64(3)), [[4, 5]]),
    "unsqueeze": (
        lambda a: ops.unsqueeze(ops.reduce_sum(a, axes=[1], keepdims=0), axes=[1]) * a,
        [["N", 8]],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_op_lowering(case):
    build, shapes = CASES[case]
    g = _graph(build, shapes)
    feeds = {
        f"x{i}": rng.standard_normal([3 if isinstance(d, str) else d for d in s]).astype(np.float32)
        for i, s in enumerate(shapes)
    }
    assert check_groups(g, feeds) >= 1


def test_lowered_kernel_text():
    ex = examples.rmsnorm(hidden=16)
    from lowering_check import prepare

    g, plan = prepare(ex.graph)
    text = A.format_kernel(lower_group(plan.groups[0], g, "k").kernel)
    assert text.startswith(
        "kernel k(x: float32[N, 16], weight: float32[16], y: float32[N, 16]; dims N)"
    )
    assert "ScheduleBlock(reducemean__init)" in text
    assert "r:reducemean_v1" in text


UNARY = ["exp", "tanh", "sigmoid", "relu", "abs", "neg", "sqrt_abs", "erf", "floor", "sin"]


@settings(max_examples=25, deadline=None)
@given(
    chain=st.lists(st.sampled_from(UNARY), min_size=1, max_size=5),
    rows=st.integers(1, 4),
    cols=st.integers(1, 6),
    reduce=st.sampled_from([None, 0, 1]),
    keep=st.booleans(),
)
def test_random_chains(chain, rows, cols, reduce, keep):
    def build(a, b):
        y = a
        for name in chain:
            y = ops.sqrt(ops.abs(y)) if name == "sqrt_abs" else getattr(ops, name)(y)
            y = y + b
        if reduce is not None:
            y = ops.reduce_sum(y, axes=[reduce], keepdims=int(keep)) * 0.5
        return y

    g = _graph(build, [["N", cols], [cols]])
    feeds = {
        "x0": rng.standard_normal((rows, cols)).astype(np.float32),
        "x1": rng.standard_normal(cols).astype(np.float32),
    }
    check_groups(g, feeds)


# -- reshape index groups -------------------------------------------------------------------------


def test_reshape_groups() -> None:
    from geode.codegen.lower import reshape_groups
    from geode.compiler.shapes import sym

    b, s = sym("B"), sym("S")
    assert reshape_groups([b, s, 768], [b, s, 12, 64]) == [([0], [0]), ([1], [1]), ([2], [2, 3])]
    assert reshape_groups([b, 12, s, 64], [b, 12 * s * 64]) == [([0], [0]), ([1, 2, 3], [1])]
    assert reshape_groups([b * s, 16], [b, s, 2, 8]) == [([0], [0, 1]), ([1], [2, 3])]
    assert reshape_groups([1, b, 1, 6], [b, 2, 1, 3]) == [([1], [0]), ([3], [1, 3])]
    assert reshape_groups([6, 4], [4, 6]) == [([0, 1], [0, 1])]  # one group, no shortcut
    assert reshape_groups([b, s], [s, b]) is None  # equal products, no provable split
    assert reshape_groups([b, 4], [4, b]) is None
    assert reshape_groups([0, 4], [4, 0]) is None


RESHAPES = [
    (["B", "S", 48], [0, 0, 4, 12], None),  # split the last axis (attention heads)
    (["B", 4, "S", 12], None, [0, 0, 48]),  # transpose then merge (heads back)
    (["B", "S", 2, 8], [0, -1], None),  # merge with a symbolic leading dim
    ([1, "B", 1, 6], [-1, 2, 1, 3], None),  # unit axes on both sides
    ([6, 4], [4, 6], None),  # sizes that only match as a whole
    (["B", 3, 5], [-1, 5, 3], None),  # a real reshuffle of the last two axes
]


@pytest.mark.parametrize("shape,to,after", RESHAPES, ids=[str(r[0]) for r in RESHAPES])
def test_reshape_index_groups_match_numpy(shape, to, after) -> None:
    """Reshapes whose axes split into groups index each group on its own (no division
    by symbolic dims per element); the results equal numpy's for several sizes, 1 included."""
    g = geode.Graph("r")
    x = g.input("x", shape)
    y = ops.exp(x)
    if after is not None:
        y = ops.reshape(ops.transpose(y, perm=[0, 2, 1, 3]), np.array(after, np.int64))
    else:
        y = ops.reshape(y, np.array(to, np.int64))
    g.output(y + 1.0, names=["y"])
    model = geode.compile(g)
    assert all(k.engine == "aicore" for k in model.kernels)
    for n in (1, 2, 5):
        a = rng.standard_normal([n if isinstance(d, str) else d for d in shape]).astype(np.float32)
        e = np.exp(a)
        if after is not None:
            e = e.transpose(0, 2, 1, 3)
            want = e.reshape(e.shape[0], e.shape[1], -1) + 1.0
        else:
            want = e.reshape([a.shape[i] if v == 0 else v for i, v in enumerate(to)]) + 1.0
        np.testing.assert_allclose(model(x=a)["y"], want, rtol=1e-6)
    if shape[0] == "B" and len(shape) == 3 and to == [0, 0, 4, 12]:
        source = model.kernels[0].source
        assert "// S" not in source.split("# block")[-1].split("\n")[1], source


@st.composite
def _reshape_case(draw: st.DrawFn) -> tuple:
    """A shape (optionally with a symbolic leading dim kept by a 0) and a random
    refactorisation of the rest of it."""
    dims = draw(st.lists(st.integers(1, 6), min_size=1, max_size=4))
    total = int(np.prod(dims))
    target: list[int] = []
    rest = total
    while rest > 1 and len(target) < 4:
        f = draw(st.sampled_from([d for d in range(1, rest + 1) if rest % d == 0]))
        target.append(f)
        rest //= f
    target.append(rest)
    target += [1] * draw(st.integers(0, 1))
    symbolic = draw(st.booleans())
    return dims, draw(st.permutations(target)), symbolic


@settings(max_examples=40, deadline=None)
@given(_reshape_case())
def test_random_reshapes_match_numpy(case) -> None:
    dims, target, symbolic = case
    shape = (["N"] if symbolic else []) + dims
    to = ([0] if symbolic else []) + list(target)
    g = geode.Graph("r")
    x = g.input("x", shape)
    g.output(ops.reshape(ops.exp(x), np.array(to, np.int64)) * 2.0, names=["y"])
    model = geode.compile(g)
    for n in (1, 3) if symbolic else (None,):
        a = rng.standard_normal(([n] if symbolic else []) + dims).astype(np.float32)
        want = np.exp(a).reshape(([n] if symbolic else []) + list(target)) * 2.0
        np.testing.assert_allclose(model(x=a)["y"], want, rtol=1e-6)


@pytest.mark.parametrize(("n", "m"), [(3, 3), (1, 3), (3, 1), (1, 1), (0, 1)])
def test_symbolic_broadcast_reads_a_size_1_side_at_index_0(n, m):
    """``x[N, 4] + y[M, 4]``: one group over ``[bcast(M, N), 4]`` whose loads index the
    broadcast axis times a stride argument, 0 when that side's dim is 1."""
    g = _graph(lambda a, b: ops.tanh(a + b) * a, [["N", 4], ["M", 4]])
    from lowering_check import prepare

    pg, plan = prepare(g)
    assert len(plan.groups) == 1
    lk = lower_group(plan.groups[0], pg, "k")
    strides = {
        name for name, d in lk.dim_exprs.items() if str(d) in ("Min(1, N - 1)", "Min(1, M - 1)")
    }
    assert len(strides) == 2
    text = A.format_kernel(lk.kernel)
    assert all(f"* {s}, " in text for s in strides), text
    feeds = {
        "x0": rng.standard_normal((n, 4)).astype(np.float32),
        "x1": rng.standard_normal((m, 4)).astype(np.float32),
    }
    assert check_groups(g, feeds) == 1


def test_can_lower_refuses_a_broadcast_no_constraint_covers():
    """A dim that is neither 1, nor the output's, nor recorded as broadcast to it stays
    ambiguous (a graph whose output shape was given, not inferred by broadcasting)."""
    from geode.codegen.lower import make_can_lower

    g = _graph(lambda a, b: a + b, [["N", 4], ["M", 4]])
    g.infer_shapes()
    add = g.nodes[0]
    assert make_can_lower(g)(add) is None
    g.symbols.broadcasts.clear()
    add.outputs[0].desc = type(add.outputs[0].desc)(add.outputs[0].dtype, (7, 4))
    assert "ambiguous" in make_can_lower(g)(add)


def test_float_attributes_are_float32_on_float64_tensors() -> None:
    """ONNX float attributes are 32-bit: alpha=0.2 means float32(0.2) for float64 data
    too, as the reference kernels read it (found by geode.fuzz: LeakyRelu, Elu, Selu
    and HardSigmoid used the double 0.2 and differed in the 9th digit)."""
    from geode.compiler.interpret import run_reference

    g = geode.Graph("attrs64")
    x = g.input("x", ["N"], "float64")
    outs = (
        ops.leaky_relu(x, alpha=0.2),
        ops.elu(x, alpha=0.3),
        ops.selu(x, alpha=1.7, gamma=1.1),
        ops.hard_sigmoid(x, alpha=0.3, beta=0.4),
    )
    g.output(*outs, names=["leaky", "elu", "selu", "hard"])
    model = geode.compile(g)
    feeds = {"x": np.linspace(-3.0, 3.0, 41)}
    want = run_reference(g, feeds)
    got = model.run(feeds)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-14, atol=1e-15, err_msg=name)


def test_bool_max_and_min_reductions_compile() -> None:
    """ReduceMax/ReduceMin of bool (the registry allows it) start from False/True; the
    lowering asked numpy for bool's integer limits and the group fell back to AICPU
    (found by geode.fuzz). Empty reductions give the identities, like the reference."""
    import warnings

    from geode.codegen.driver import CodegenWarning
    from geode.compiler.interpret import run_reference

    g = geode.Graph("bool_reduce")
    x = g.input("x", ["N", 3], "bool")
    g.output(
        ops.reduce_max(x, axes=[0], keepdims=0),
        ops.reduce_min(x, axes=[1], keepdims=1),
        ops.reduce_max(x, keepdims=0),
        names=["a", "b", "c"],
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", CodegenWarning)
        model = geode.compile(g)
    assert all(k.engine == "aicore" for k in model.kernels)
    for n in (0, 1, 5):
        feeds = {"x": rng.random((n, 3)) < 0.5}
        got, want = model.run(feeds), run_reference(g, feeds)
        for name in want:
            assert got[name].dtype == want[name].dtype
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"{name} n={n}")


@pytest.mark.parametrize(
    ("base", "exponent"),
    [("float32", "int32"), ("float32", "uint64"), ("float32", "float64"), ("int32", "uint32")],
)
def test_pow_with_an_exponent_of_another_dtype_keeps_its_value(base, exponent) -> None:
    """The exponent is no longer cast to the base's dtype: float32 rounded the odd
    exponent 300279179 to an even one (a negative base then gave +inf, not -inf), int32
    read the uint32 4294967295 as -1 (found by geode.fuzz). The power is computed as the
    reference computes it: float32 ** int32 in float64, integers in int64."""
    from geode.compiler.interpret import run_reference

    g = geode.Graph("pow_mixed")
    x = g.input("x", ["N"], base)
    y = g.input("y", ["N"], exponent)
    g.output(ops.pow(x, y), names=["z"])
    model = geode.compile(g)
    big = 4294967295 if exponent == "uint32" else 300279179
    xs = np.array([-3.0, -2.0, 1.5, -1.0, 2.0, -5.0]).astype(base)
    ys = np.array([big, 3, 2, big, 0, 1]).astype(exponent)
    feeds = {"x": xs, "y": ys}
    want = run_reference(g, feeds)["z"]
    got = model.run(feeds)["z"]
    np.testing.assert_array_equal(got, want)
    if base == "float32":
        assert got[0] == -np.inf
