"""The loop-AST interpreter: operator semantics against numpy, control flow, strictness."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from geode.codegen.ast import (
    BIN_OPS,
    UN_OPS,
    Bin,
    Block,
    Buffer,
    Cast,
    Const,
    Expr,
    For,
    If,
    IterVar,
    Kernel,
    Load,
    Select,
    Store,
    Un,
    Var,
    format_kernel,
    free_vars,
    loads,
    preorder,
    walk,
    walk_stmts,
)
from geode.codegen.ast_eval import KernelEvalError, eval_shape, run_kernel


def unary_kernel(
    value: Callable[[Expr], Expr], in_dtype: str, out_dtype: str, n: Expr | None = None
) -> Kernel:
    """O[i] = value(X[i]) over one loop of extent n (default: symbolic N)."""
    n = Var("N") if n is None else n
    vi = Var("vi")
    blk = Block("b", [IterVar("vi", n)], [Var("i")], [Store("O", (vi,), value(Load("X", (vi,))))])
    dims = ["N"] if isinstance(n, Var) else []
    return Kernel(
        "k",
        [Buffer("X", in_dtype, (n,))],
        [Buffer("O", out_dtype, (n,))],
        dims,
        [For("i", n, [blk])],
    )


def binary_kernel(op: str, in_dtype: str, out_dtype: str) -> Kernel:
    vi = Var("vi")
    val = Bin(op, Load("X", (vi,)), Load("Y", (vi,)))
    blk = Block("b", [IterVar("vi", Var("N"))], [Var("i")], [Store("O", (vi,), val)])
    return Kernel(
        "k",
        [Buffer("X", in_dtype, (Var("N"),)), Buffer("Y", in_dtype, (Var("N"),))],
        [Buffer("O", out_dtype, (Var("N"),))],
        ["N"],
        [For("i", Var("N"), [blk])],
    )


def _trunc_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    q = np.abs(a) // np.abs(b)
    return np.where((a < 0) != (b < 0), -q, q)


FLOAT_BIN = {
    "+": np.add,
    "-": np.subtract,
    "*": np.multiply,
    "/": np.true_divide,
    "//": np.floor_divide,
    "%": np.mod,
    "fmod": np.fmod,
    "min": np.minimum,
    "max": np.maximum,
    "pow": np.power,
}
INT_BIN = {
    "+": np.add,
    "-": np.subtract,
    "*": np.multiply,
    "/": _trunc_div,
    "//": np.floor_divide,
    "%": np.mod,
    "fmod": np.fmod,
    "min": np.minimum,
    "max": np.maximum,
    "bitand": np.bitwise_and,
    "bitor": np.bitwise_or,
    "bitxor": np.bitwise_xor,
}
CMP = {
    "<": np.less,
    "<=": np.less_equal,
    ">": np.greater,
    ">=": np.greater_equal,
    "==": np.equal,
    "!=": np.not_equal,
}
LOGIC = {"and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor}


def test_every_operator_is_covered() -> None:
    assert set(FLOAT_BIN) | set(INT_BIN) | set(CMP) | set(LOGIC) | {"shl", "shr"} == BIN_OPS


@pytest.mark.parametrize("op", sorted(FLOAT_BIN))
def test_float_binary(op: str) -> None:
    rng = np.random.default_rng(0)
    x = rng.uniform(-3, 3, 9).astype(np.float32)
    y = rng.uniform(0.5, 2, 9).astype(np.float32) * np.sign(rng.standard_normal(9)).astype(
        np.float32
    )
    if op == "pow":
        x = np.abs(x)
    got = run_kernel(binary_kernel(op, "float32", "float32"), {"X": x, "Y": y}, {"N": 9})["O"]
    np.testing.assert_allclose(got, FLOAT_BIN[op](x, y).astype(np.float32), rtol=1e-6)


@pytest.mark.parametrize("op", sorted(INT_BIN))
def test_int_binary(op: str) -> None:
    x = np.array([7, -7, 7, -7, 0, 5, -9], dtype=np.int32)
    y = np.array([2, 2, -2, -2, 3, 5, 4], dtype=np.int32)
    got = run_kernel(binary_kernel(op, "int32", "int32"), {"X": x, "Y": y}, {"N": 7})["O"]
    np.testing.assert_array_equal(got, INT_BIN[op](x, y))


def test_int_division_truncates_and_mod_follows_divisor() -> None:
    x = np.array([7, -7, 7, -7], dtype=np.int64)
    y = np.array([2, 2, -2, -2], dtype=np.int64)

    def run(op: str) -> dict[str, np.ndarray]:
        return run_kernel(binary_kernel(op, "int64", "int64"), {"X": x, "Y": y}, {"N": 4})

    np.testing.assert_array_equal(run("/")["O"], [3, -3, -3, 3])
    np.testing.assert_array_equal(run("//")["O"], [3, -4, -4, 3])
    np.testing.assert_array_equal(run("%")["O"], [1, 1, -1, -1])
    np.testing.assert_array_equal(run("fmod")["O"], [1, -1, 1, -1])


@pytest.mark.parametrize("op", sorted(CMP))
def test_comparisons(op: str) -> None:
    x = np.array([1.0, 2.0, 3.0, np.nan], dtype=np.float32)
    y = np.array([2.0, 2.0, 2.0, 1.0], dtype=np.float32)
    got = run_kernel(binary_kernel(op, "float32", "bool"), {"X": x, "Y": y}, {"N": 4})["O"]
    np.testing.assert_array_equal(got, CMP[op](x, y))


@pytest.mark.parametrize("op", sorted(LOGIC))
def test_logical(op: str) -> None:
    x = np.array([True, True, False, False])
    y = np.array([True, False, True, False])
    got = run_kernel(binary_kernel(op, "bool", "bool"), {"X": x, "Y": y}, {"N": 4})["O"]
    np.testing.assert_array_equal(got, LOGIC[op](x, y))


def test_shifts_and_bitnot() -> None:
    x = np.array([1, 5, 12], dtype=np.int32)
    y = np.array([1, 2, 3], dtype=np.int32)
    got = run_kernel(binary_kernel("shl", "int32", "int32"), {"X": x, "Y": y}, {"N": 3})["O"]
    np.testing.assert_array_equal(got, x << y)
    got = run_kernel(binary_kernel("shr", "int32", "int32"), {"X": x, "Y": y}, {"N": 3})["O"]
    np.testing.assert_array_equal(got, x >> y)
    got = run_kernel(unary_kernel(lambda a: Un("bitnot", a), "int32", "int32"), {"X": x}, {"N": 3})[
        "O"
    ]
    np.testing.assert_array_equal(got, ~x)


UNARY_REF = {
    "neg": np.negative,
    "abs": np.abs,
    "exp": np.exp,
    "sigmoid": lambda a: 1 / (1 + np.exp(-a)),
    "sin": np.sin,
    "cos": np.cos,
    "tan": np.tan,
    "atan": np.arctan,
    "sinh": np.sinh,
    "cosh": np.cosh,
    "tanh": np.tanh,
    "asinh": np.arcsinh,
    "floor": np.floor,
    "ceil": np.ceil,
    "round": np.rint,
    "sign": np.sign,
    "isnan": np.isnan,
    "isinf": np.isinf,
    "isposinf": np.isposinf,
    "isneginf": np.isneginf,
    "fence": lambda a: a,
}
POSITIVE_REF = {"log": np.log, "log1p": np.log1p, "sqrt": np.sqrt, "acosh": np.arccosh}
UNIT_REF = {"asin": np.arcsin, "acos": np.arccos, "atanh": np.arctanh}


def test_every_unary_is_covered() -> None:
    assert set(UNARY_REF) | set(POSITIVE_REF) | set(UNIT_REF) | {"erf", "not", "bitnot"} == UN_OPS


@pytest.mark.parametrize("op", sorted(UNARY_REF) + sorted(POSITIVE_REF) + sorted(UNIT_REF))
def test_unary(op: str) -> None:
    if op in POSITIVE_REF:
        x, ref = np.array([1.0, 1.5, 2.5, 10.0], np.float32), POSITIVE_REF[op]
    elif op in UNIT_REF:
        x, ref = np.array([-0.5, 0.0, 0.25, 0.9], np.float32), UNIT_REF[op]
    else:
        x = np.array([-2.5, -0.5, 0.0, 0.5, 1.5, 2.5, np.inf, -np.inf, np.nan], np.float32)
        ref = UNARY_REF[op]
    out = "bool" if op.startswith("is") else "float32"
    with np.errstate(invalid="ignore", over="ignore"):
        want = ref(x).astype(out)
    got = run_kernel(unary_kernel(lambda a: Un(op, a), "float32", out), {"X": x}, {"N": len(x)})[
        "O"
    ]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert got.dtype == np.dtype(out)


def test_erf_not_cast_select() -> None:
    import math

    x = np.array([-1.0, 0.0, 0.5, 2.0], np.float32)
    got = run_kernel(
        unary_kernel(lambda a: Un("erf", a), "float32", "float32"), {"X": x}, {"N": 4}
    )["O"]
    np.testing.assert_allclose(got, [math.erf(v) for v in x], rtol=1e-6)
    b = np.array([True, False])
    got = run_kernel(unary_kernel(lambda a: Un("not", a), "bool", "bool"), {"X": b}, {"N": 2})
    np.testing.assert_array_equal(got["O"], [False, True])
    got = run_kernel(
        unary_kernel(lambda a: Cast("int32", a), "float32", "int32"), {"X": x}, {"N": 4}
    )["O"]
    np.testing.assert_array_equal(got, x.astype(np.int32))

    def relu(a: Expr) -> Expr:
        return Select(Bin(">", a, Const(0.0, "float32")), a, Const(0.0, "float32"))

    got = run_kernel(unary_kernel(relu, "float32", "float32"), {"X": x}, {"N": 4})["O"]
    np.testing.assert_array_equal(got, np.maximum(x, 0))


def test_select_is_lazy() -> None:
    """The untaken branch may read out of bounds (a guarded shifted read)."""
    vi = Var("vi")
    n = Var("N")
    nxt = Load("X", (Bin("+", vi, Const(1)),))
    val = Select(Bin("<", Bin("+", vi, Const(1)), n), nxt, Const(0.0, "float32"))
    blk = Block("b", [IterVar("vi", n)], [Var("i")], [Store("O", (vi,), val)])
    k = Kernel(
        "k",
        [Buffer("X", "float32", (n,))],
        [Buffer("O", "float32", (n,))],
        ["N"],
        [For("i", n, [blk])],
    )
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(run_kernel(k, {"X": x}, {"N": 4})["O"], [1, 2, 3, 0])


def test_predicate_register_and_if() -> None:
    """A split loop with an overrun guard, a register accumulator and an If."""
    n = Var("N")
    i0, i1 = Var("i0"), Var("i1")
    flat = Bin("+", Bin("*", i0, Const(4)), i1)
    init = Block("acc__init", [], [], [Store("acc", (), Const(0.0, "float32"))], reduce_of="acc")
    red = Block(
        "acc",
        [IterVar("vk", n, "reduce")],
        [flat],
        [
            If(
                Bin(">", Load("X", (Var("vk"),)), Const(0.0, "float32")),
                [Store("acc", (), Bin("+", Load("acc", ()), Load("X", (Var("vk"),))))],
            )
        ],
        predicate=Bin("<", flat, n),
    )
    out = Block("out", [], [], [Store("O", (Const(0),), Load("acc", ()))])
    ceil = Bin("//", Bin("+", n, Const(3)), Const(4))
    k = Kernel(
        "k",
        [Buffer("X", "float32", (n,))],
        [Buffer("O", "float32", (Const(1),))],
        ["N"],
        [init, For("i0", ceil, [For("i1", Const(4), [red])]), out],
        [Buffer("acc", "float32", (), "register")],
    )
    x = np.array([1.0, -2.0, 3.0, 4.0, -5.0, 6.0, 0.5], np.float32)
    got = run_kernel(k, {"X": x}, {"N": 7})["O"]
    np.testing.assert_allclose(got, [x[x > 0].sum()])
    # a copy (a schedule's backup: clone_stmts) has new statements, the same expressions
    backup = k.copy()
    assert format_kernel(backup) == format_kernel(k)
    copies = list(zip(walk_stmts(backup.body), walk_stmts(k.body), strict=True))
    assert all(a is not b and type(a) is type(b) for a, b in copies)
    assert backup.body[1].body[0].body[0].predicate is red.predicate
    # without the predicate the overrun binds vk outside its extent
    red.predicate = None
    np.testing.assert_allclose(run_kernel(backup, {"X": x}, {"N": 7})["O"], got)
    with pytest.raises(KernelEvalError, match="iter var vk = 7 outside"):
        run_kernel(k, {"X": x}, {"N": 7})


def test_strictness() -> None:
    k = unary_kernel(lambda a: a, "float32", "float32")
    with pytest.raises(ValueError, match="no value for dims"):
        run_kernel(k, {"X": np.zeros(3, np.float32)}, {})
    with pytest.raises(ValueError, match="missing input 'X'"):
        run_kernel(k, {}, {"N": 3})
    with pytest.raises(ValueError, match="shape"):
        run_kernel(k, {"X": np.zeros(4, np.float32)}, {"N": 3})
    # out-of-bounds load
    bad = unary_kernel(lambda a: Load("X", (Bin("+", Var("vi"), Const(1)),)), "float32", "float32")
    with pytest.raises(KernelEvalError, match=r"X\[3\]: index 3 out of bounds"):
        run_kernel(bad, {"X": np.zeros(3, np.float32)}, {"N": 3})
    # negative indices do not wrap
    neg = unary_kernel(lambda a: Load("X", (Bin("-", Var("vi"), Const(1)),)), "float32", "float32")
    with pytest.raises(KernelEvalError, match="out of bounds"):
        run_kernel(neg, {"X": np.zeros(3, np.float32)}, {"N": 3})
    unknown = unary_kernel(lambda a: Var("zz"), "float32", "float32")
    with pytest.raises(KernelEvalError, match="unbound variable 'zz'"):
        run_kernel(unknown, {"X": np.zeros(3, np.float32)}, {"N": 3})


def test_unwritten_outputs_are_nan_and_inputs_untouched() -> None:
    n = Const(4)
    vi = Var("vi")
    blk = Block("b", [IterVar("vi", Const(2))], [Var("i")], [Store("O", (vi,), Load("X", (vi,)))])
    k = Kernel(
        "k",
        [Buffer("X", "float64", (n,))],
        [Buffer("O", "float64", (n,))],
        [],
        [For("i", Const(2), [blk])],
    )
    x = np.arange(4.0)
    got = run_kernel(k, {"X": x}, {})["O"]
    np.testing.assert_array_equal(got[:2], [0, 1])
    assert np.isnan(got[2:]).all()
    assert eval_shape((Bin("*", Var("N"), Const(2)), Const(3)), {"N": 5}) == (10, 3)


def test_symbolic_2d_with_local_temp() -> None:
    n, m = Var("N"), Var("M")
    v0, v1 = Var("v0"), Var("v1")
    ivs = [IterVar("v0", n), IterVar("v1", m)]

    def nest(name: str, store: Store) -> For:
        blk = Block(
            name,
            [IterVar(iv.name, iv.extent) for iv in ivs],
            [Var(f"{name}_i"), Var(f"{name}_j")],
            [store],
        )
        return For(f"{name}_i", n, [For(f"{name}_j", m, [blk])])

    k = Kernel(
        "k",
        [Buffer("X", "float32", (n, m))],
        [Buffer("O", "float32", (m, n))],
        ["N", "M"],
        [
            nest("t", Store("T", (v0, v1), Bin("*", Load("X", (v0, v1)), Const(3.0, "float32")))),
            nest("o", Store("O", (v1, v0), Load("T", (v0, v1)))),
        ],
        [Buffer("T", "float32", (n, m), "local")],
    )
    x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    got = run_kernel(k, {"X": x}, {"N": 3, "M": 5})["O"]
    np.testing.assert_allclose(got, (x * 3).T)
    assert got.dtype == np.float32


def test_a_deep_copy_of_a_kernel_shares_expressions_but_not_statements_or_buffers() -> None:
    import copy

    from geode.codegen import ast as A

    n = A.Var("N")
    x = A.Buffer("x", "float32", (n,))
    y = A.Buffer("y", "float32", (n,))
    tmp = A.Buffer("t", "float32", (A.Const(4),), scope="local")
    store = A.Store("y", (A.Var("vi"),), A.Load("x", (A.Var("vi"),)))
    blk = A.Block("b", [A.IterVar("vi", n)], [A.Var("i")], [store])
    body = [A.For("i", n, [blk, A.Prefetch("x", A.Var("i"))]), A.If(A.Const(1), [])]
    k = A.Kernel("k", [x], [y], ["N"], body, [tmp])
    c = copy.deepcopy(k)
    assert A.format_kernel(c) == A.format_kernel(k)
    assert c.inputs[0] is not x and c.temps[0] is not tmp and c.body[0] is not body[0]
    assert c.body[0].body[0].body[0].value is store.value  # expressions are shared
    c.temps[0].scope = "register"
    c.body[0].body.pop()
    c.dims.append("M")
    assert tmp.scope == "local" and len(body[0].body) == 2 and k.dims == ["N"]


def test_preorder_lists_what_walk_yields() -> None:
    from geode.codegen import ast as A

    e = A.Bin(
        "+",
        A.Load("x", (A.Var("i"), A.Bin("*", A.Var("j"), A.Const(2)))),
        A.Select(
            A.Var("c"), A.Un("exp", A.Load("y", (A.Var("k"),))), A.Cast("float32", A.Var("j"))
        ),
    )
    assert A.preorder(e) == list(A.walk(e))
    assert A.free_vars(e) == {"i", "j", "k", "c"}
    assert [ld.buffer for ld in A.loads(e)] == ["x", "y"]


def test_walks_are_remembered_by_identity() -> None:
    """``walk`` keeps the pre-order list of the expressions it walked, by identity: the
    same sub-expressions every time, and an equal expression built anew walked alike."""
    e = Bin("+", Bin("*", Var("i"), Const(4)), Load("X", (Var("j"),)))
    first = list(walk(e))
    assert first == preorder(e) and list(walk(e)) == first
    again = Bin("+", Bin("*", Var("i"), Const(4)), Load("X", (Var("j"),)))
    assert again is not e and list(walk(again)) == first
    assert free_vars(e) == {"i", "j"} and loads(e) == [Load("X", (Var("j"),))]


def test_kept_loads_and_free_vars_come_as_new_containers() -> None:
    """``loads``/``free_vars`` are kept per expression, but each call hands out its own
    list or set: a caller changing one changes nothing the next call sees."""
    e = Bin("+", Load("X", (Var("i"),)), Var("n"))
    first, names = loads(e), free_vars(e)
    first.clear()
    names.add("z")
    assert loads(e) == [Load("X", (Var("i"),))] and free_vars(e) == {"i", "n"}
    assert free_vars(Var("i")) == {"i"} and free_vars(Const(3)) == set()
    assert loads(Var("i")) == [] and loads(Const(3)) == []


def test_rewrites_of_one_buffer_skip_what_does_not_read_it() -> None:
    from geode.codegen import ast as A

    e = Bin("*", Load("X", (Var("i"),)), Bin("+", Load("Y", (Var("i"),)), Const(1)))

    def repl(x: A.Expr) -> A.Expr | None:
        return Var("y") if isinstance(x, Load) and x.buffer == "Y" else None

    assert A.reads_buffer(e, "Y") and not A.reads_buffer(e, "Z")
    assert not A.reads_buffer(Var("Y"), "Y")
    assert A.transform_loads_of(e, "Y", repl) == A.transform(e, repl)
    assert A.transform_loads_of(e, "Y", repl) == Bin(
        "*", Load("X", (Var("i"),)), Bin("+", Var("y"), Const(1))
    )
    assert A.transform_loads_of(e, "Z", repl) is e  # unwalked, the same object


def test_transform_folds_every_expression_kind_alike() -> None:
    """The rewrite rebuilds each kind of node over its rewritten children (folding index
    arithmetic) and leaves untouched nodes as they are (the same objects)."""
    from geode.codegen import ast as A

    e = A.Select(
        A.Bin("<", A.Var("i"), A.Var("n")),
        A.Un("exp", A.Cast("float32", A.Load("X", (A.Bin("*", A.Var("i"), A.Var("k")),)))),
        A.Const(0.0, "float32"),
    )
    out = A.substitute(e, {"k": A.Const(1)})
    assert out == A.Select(
        A.Bin("<", A.Var("i"), A.Var("n")),
        A.Un("exp", A.Cast("float32", A.Load("X", (A.Var("i"),)))),
        A.Const(0.0, "float32"),
    )
    assert out.cond is e.cond and out.f is e.f  # not rebuilt
    assert A.substitute(e, {"m": A.Var("q")}) is e
    # a node folding to a rewritten child is not offered again (x -> y, y -> z gives y)
    assert A.substitute(
        A.Bin("+", A.Var("x"), A.Const(0)), {"x": A.Var("y"), "y": A.Var("z")}
    ) == A.Var("y")


def test_uses_var_is_free_vars_membership() -> None:
    from geode.codegen import ast as A

    e = Bin("+", Load("X", (Bin("*", Var("i"), Var("k")),)), Var("n"))
    for name in ("i", "k", "n", "X", "z"):
        assert A.uses_var(e, name) == (name in free_vars(e))
    assert A.uses_var(Var("i"), "i") and not A.uses_var(Var("i"), "j")
    assert not A.uses_var(Const(1), "i")
