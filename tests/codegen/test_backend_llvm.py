"""The LLVM backend: loop ASTs compiled to machine code, checked against numpy and the
AST's reference interpreter (:mod:`geode.codegen.ast_eval`), plus what the generated
code must contain (vector code, the thread pool, non-temporal stores, NaN guards)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geode.codegen import ast as A
from geode.codegen.ast import (
    Bin,
    Block,
    Buffer,
    Cast,
    Const,
    For,
    ForKind,
    IterVar,
    Kernel,
    Load,
    Select,
    Store,
    StreamStore,
    Un,
    Var,
)
from geode.codegen.ast_eval import run_kernel
from geode.codegen.backends.llvm import objcache
from geode.codegen.backends.llvm.kernel import LLVMKernel, compile_kernel
from geode.errors import CodegenError

N, M = Var("N"), Var("M")


def ld(buf: str, *idx: A.Expr) -> Load:
    return Load(buf, tuple(idx))


def eltwise(value_of, dtypes: dict[str, str], out_dtype: str, kind=ForKind.PARALLEL) -> Kernel:
    """``Y[i, j] = value(X..)`` over ``[N, M]`` (inner loop vectorized)."""
    ins = [Buffer(n, dt, (N, M)) for n, dt in dtypes.items()]
    loads = {n: ld(n, Var("vi"), Var("vj")) for n in dtypes}
    blk = Block(
        "b",
        [IterVar("vi", N), IterVar("vj", M)],
        [Var("i"), Var("j")],
        [Store("Y", (Var("vi"), Var("vj")), value_of(**loads))],
    )
    body = [For("i", N, [For("j", M, [blk], ForKind.VECTORIZED)], kind)]
    return Kernel("ew", ins, [Buffer("Y", out_dtype, (N, M))], ["N", "M"], body)


def run(
    k: LLVMKernel, kern: Kernel, arrays: dict[str, np.ndarray], dims: dict[str, int], threads=0
):
    outs = [np.empty(tuple(A_eval_shape(b.shape, dims)), b.dtype) for b in kern.outputs]
    k(*[arrays[b.name] for b in kern.inputs], *outs, *[dims[d] for d in kern.dims], threads=threads)
    return outs


def A_eval_shape(shape, dims):
    from geode.codegen.ast_eval import eval_shape

    return eval_shape(shape, dims)


def check_against_reference(kern: Kernel, arrays, dims, exact=True, threads=0, atol=1e-30):
    native = compile_kernel(kern)
    got = run(native, kern, arrays, dims, threads)
    want = run_kernel(kern, arrays, dims)
    for b, g in zip(kern.outputs, got):
        w = want[b.name]
        if exact or not np.issubdtype(g.dtype, np.floating):
            np.testing.assert_array_equal(g, w, err_msg=b.name)
        else:
            np.testing.assert_allclose(
                g, w, rtol=2e-6 if g.dtype == np.float32 else 1e-13, atol=atol
            )
    return native


# ---------------------------------------------------------------------------------
# elementwise, dtypes and operators
# ---------------------------------------------------------------------------------
@pytest.mark.parametrize("n,m", [(3, 5), (17, 33), (1, 1), (0, 4), (64, 256)])
@pytest.mark.parametrize("threads", [0, 1, 2])
def test_elementwise_matches_numpy(n: int, m: int, threads: int) -> None:
    kern = eltwise(
        lambda X, B: X * B + Const(1.5, "float64"), {"X": "float32", "B": "float32"}, "float32"
    )
    rng = np.random.default_rng(n + m)
    X, B = (rng.standard_normal((n, m), dtype=np.float32) for _ in range(2))
    native = compile_kernel(kern)
    (Y,) = run(native, kern, {"X": X, "B": B}, {"N": n, "M": m}, threads)
    # the default policy contracts ``X * B + 1.5`` into one fused multiply-add
    np.testing.assert_allclose(Y, X * B + np.float32(1.5), rtol=2e-7, atol=1e-7)
    assert native.parallel


FLOAT_BIN = ["+", "-", "*", "/", "//", "%", "fmod", "min", "max", "pow", "<", "==", "!="]
INT_BIN = [
    "+",
    "-",
    "*",
    "/",
    "//",
    "%",
    "fmod",
    "min",
    "max",
    "pow",
    "bitand",
    "bitor",
    "bitxor",
    "shl",
    "shr",
    "<",
    ">=",
    "==",
]
SPECIAL = [0.0, -0.0, 1.0, -1.0, 2.5, -3.0, np.inf, -np.inf, np.nan, 1e-40, 7.0, -7.5]


def _special_pairs(dtype: str, m: int):
    vals = np.array(SPECIAL, dtype)
    a, b = np.meshgrid(vals, vals)
    return a.reshape(-1, m), b.reshape(-1, m)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("op", FLOAT_BIN)
def test_float_binary_ops_match_the_interpreter(dtype: str, op: str) -> None:
    a, b = _special_pairs(dtype, 12)
    kern = eltwise(
        lambda X, W: Bin(op, X, W),
        {"X": dtype, "W": dtype},
        "bool" if op in ("<", "==", "!=") else dtype,
    )
    # pow calls the C library's (within an ulp of numpy's); the rest is exactly rounded
    check_against_reference(kern, {"X": a, "W": b}, {"N": a.shape[0], "M": 12}, exact=op != "pow")


@pytest.mark.parametrize("dtype", ["int32", "int8", "uint8", "int64", "uint64"])
@pytest.mark.parametrize("op", INT_BIN)
def test_integer_binary_ops_match_the_interpreter(dtype: str, op: str) -> None:
    info = np.iinfo(dtype)
    vals = np.array(
        sorted(
            {0, 1, 2, 3, 7, info.max, info.min, info.max // 3, info.min + 1}
            | ({-1, -2, -7} if info.min < 0 else set())
        ),
        dtype,
    )
    a, b = np.meshgrid(vals, vals)
    if op in ("shl", "shr"):
        b = (b.astype(np.int64) % 80 - (8 if info.min < 0 else 0)).astype(dtype)
    if op == "pow":  # numpy refuses negative integer exponents (geode gives 0, tested below)
        b = (np.abs(b.astype(np.int64)) % 9).astype(dtype)
    kern = eltwise(
        lambda X, W: Bin(op, X, W),
        {"X": dtype, "W": dtype},
        "bool" if op in ("<", ">=", "==") else dtype,
    )
    check_against_reference(kern, {"X": a, "W": b}, {"N": a.shape[0], "M": a.shape[1]})


UNARY = [
    "neg",
    "abs",
    "exp",
    "log",
    "log1p",
    "sqrt",
    "sin",
    "cos",
    "tan",
    "tanh",
    "erf",
    "sigmoid",
    "floor",
    "ceil",
    "round",
    "sign",
    "isnan",
    "isinf",
    "isposinf",
    "asinh",
    "atan",
]


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("op", UNARY)
def test_float_unary_ops_match_the_interpreter(dtype: str, op: str) -> None:
    rng = np.random.default_rng(1)
    x = np.concatenate([np.array(SPECIAL * 2, dtype), (rng.standard_normal(232) * 4).astype(dtype)])
    x = x.reshape(16, 16)
    out = "bool" if op.startswith("is") else dtype
    kern = eltwise(lambda X: Un(op, X), {"X": dtype}, out)
    exact = op in ("neg", "abs", "floor", "ceil", "round", "sign", "isnan", "isinf", "isposinf")
    native = compile_kernel(kern)
    (got,) = run(native, kern, {"X": x}, {"N": 16, "M": 16})
    want = run_kernel(kern, {"X": x}, {"N": 16, "M": 16})["Y"]
    if exact:
        np.testing.assert_array_equal(got, want)
    else:  # transcendental functions: within a few ulp of the reference
        tol = {"float16": 1e-3, "float32": 4e-6, "float64": 1e-14}[dtype]
        np.testing.assert_allclose(
            got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol
        )


def test_integer_pow_with_negative_exponents() -> None:
    kern = eltwise(lambda X, W: Bin("pow", X, W), {"X": "int32", "W": "int32"}, "int32")
    a = np.array([[1, -1, -1, 2, 0, 5]], np.int32)
    b = np.array([[-3, -3, -2, -1, -1, 2]], np.int32)
    k = compile_kernel(kern)
    (y,) = run(k, kern, {"X": a, "W": b}, {"N": 1, "M": 6})
    np.testing.assert_array_equal(y, [[1, -1, 1, 0, 0, 25]])


def test_casts_and_selects_follow_numpy() -> None:
    kern = eltwise(
        lambda X, W: Select(
            Bin("<", X, W), Cast("int16", X), Cast("int16", Bin("*", W, Const(2.0, "float64")))
        ),
        {"X": "float32", "W": "float64"},
        "int16",
    )
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((8, 8)) * 100).astype(np.float32)
    w = rng.standard_normal((8, 8)) * 100
    check_against_reference(kern, {"X": x, "W": w}, {"N": 8, "M": 8})


def test_float16_storage_rounds_once_from_double() -> None:
    kern = eltwise(lambda X: Bin("*", X, Const(1.0 / 3.0, "float64")), {"X": "float64"}, "float16")
    x = np.linspace(-70000, 70000, 64).reshape(8, 8)
    check_against_reference(kern, {"X": x}, {"N": 8, "M": 8})


# ---------------------------------------------------------------------------------
# random expression trees (hypothesis) against the interpreter
# ---------------------------------------------------------------------------------
_LEAVES = ["X", "W"]


def _exprs(depth: int):
    leaf = st.sampled_from(
        [ld(n, Var("vi"), Var("vj")) for n in _LEAVES]
        + [Const(0.5, "float64"), Const(-2.0, "float64"), Const(3.0, "float32")]
    )
    if depth == 0:
        return leaf
    sub = _exprs(depth - 1)
    return st.one_of(
        leaf,
        st.builds(
            lambda op, a, b: Bin(op, a, b), st.sampled_from(["+", "-", "*", "min", "max"]), sub, sub
        ),
        st.builds(lambda op, a: Un(op, a), st.sampled_from(["neg", "abs", "floor", "sqrt"]), sub),
        st.builds(lambda c, a, b: Select(Bin("<", c, Const(0.0, "float64")), a, b), sub, sub, sub),
    )


@settings(max_examples=25, deadline=None, derandomize=True)
@given(expr=_exprs(3), n=st.integers(0, 9), m=st.integers(1, 40))
def test_random_expressions_match_the_interpreter(expr, n: int, m: int) -> None:
    """The policy lets LLVM reassociate, so a sum that cancels (``0.5 + (x + (x - 2))``)
    may differ from the interpreter's order by a few ulp of its terms, not of its result:
    the tolerance has an absolute part on the scale of the leaves (standard normal).
    Derandomized: the same examples every run (a floor of a cancelling sum could flip)."""
    kern = eltwise(lambda X, W: expr, {"X": "float32", "W": "float32"}, "float32")
    rng = np.random.default_rng(n * 41 + m)
    arrays = {k: rng.standard_normal((n, m)).astype(np.float32) for k in _LEAVES}
    check_against_reference(kern, arrays, {"N": n, "M": m}, exact=False, atol=1e-5)


# ---------------------------------------------------------------------------------
# reductions, registers, NaN guards, temporaries
# ---------------------------------------------------------------------------------
def row_reduce(
    op: str, dtype: str = "float32", nan_insensitive: bool = False, masked: bool = False
) -> Kernel:
    """``R[i] = op over j of X[i, j]`` with a scalar register accumulator; ``masked``:
    of ``where(K[i, j], identity, X[i, j])`` (a causal softmax's max pass)."""
    init = {"max": -np.inf, "min": np.inf, "+": 0.0}[op]
    acc = Buffer("acc", dtype, (), "register", nan_insensitive)
    x = ld("X", Var("vi"), Var("vj"))
    if masked:
        x = Select(ld("K", Var("vi"), Var("vj")), Const(init, dtype), x)
    upd = Bin(op, ld("acc"), x)
    body = [
        For(
            "i",
            N,
            [
                Block(
                    "init", [IterVar("vi", N)], [Var("i")], [Store("acc", (), Const(init, dtype))]
                ),
                For(
                    "j",
                    M,
                    [
                        Block(
                            "upd",
                            [IterVar("vi", N), IterVar("vj", M, "reduce")],
                            [Var("i"), Var("j")],
                            [Store("acc", (), upd)],
                        )
                    ],
                    ForKind.VECTORIZED,
                ),
                Block("out", [IterVar("vi", N)], [Var("i")], [Store("R", (Var("vi"),), ld("acc"))]),
            ],
            ForKind.PARALLEL,
        )
    ]
    inputs = [Buffer("X", dtype, (N, M))] + ([Buffer("K", "bool", (N, M))] if masked else [])
    return Kernel("rowred", inputs, [Buffer("R", dtype, (N,))], ["N", "M"], body, [acc])


@pytest.mark.parametrize("op", ["max", "min", "+"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_row_reductions_are_exact_with_nan(op: str, dtype: str) -> None:
    rng = np.random.default_rng(5)
    x = rng.standard_normal((9, 203)).astype(dtype)
    x[2, 17] = np.nan
    x[5, 0] = np.nan
    x[7, 202] = np.inf
    native = compile_kernel(row_reduce(op, dtype))
    (r,) = run(native, row_reduce(op, dtype), {"X": x}, {"N": 9, "M": 203})
    want = {"max": np.max, "min": np.min, "+": np.sum}[op](x, axis=1)
    if op == "+":
        np.testing.assert_allclose(r, want, rtol=1e-5)
    else:
        np.testing.assert_array_equal(r, want)
        assert "maxnum" in native.source or "minnum" in native.source  # the guarded fast path


def test_nan_insensitive_max_freezes_instead_of_guarding() -> None:
    native = compile_kernel(row_reduce("max", nan_insensitive=True))
    x = np.random.default_rng(2).standard_normal((4, 64)).astype(np.float32)
    (r,) = run(native, row_reduce("max", nan_insensitive=True), {"X": x}, {"N": 4, "M": 64})
    np.testing.assert_array_equal(r, x.max(axis=1))
    assert 'asm ""' in native.source or "freeze" in native.source


@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("nan_insensitive", [False, True])
def test_masked_minmax_reduction_vectorizes(op: str, nan_insensitive: bool) -> None:
    """``R = max(R, where(K, -inf, x))``: the select's value is frozen before the
    ``maxnum`` so LLVM cannot fold it into a conditional reduction it leaves scalar; the
    result is np.max's over the unmasked elements, NaN included."""
    kern = row_reduce(op, nan_insensitive=nan_insensitive, masked=True)
    native = compile_kernel(kern)
    assert "freeze float" in native.source
    assert f"<16 x float> @llvm.{op}num.v16f32" in native.llvm  # vector maxnum: vectorized
    rng = np.random.default_rng(11)
    x = rng.standard_normal((9, 203)).astype(np.float32)
    k = rng.random((9, 203)) < 0.5
    k[3] = True  # a row masked in full: the identity
    if not nan_insensitive:
        x[2, 17], k[2, 17] = np.nan, False
        x[5, 0], k[5, 0] = np.nan, True  # a masked NaN does not count
    (r,) = run(native, kern, {"X": x, "K": k}, {"N": 9, "M": 203})
    ident = -np.inf if op == "max" else np.inf
    want = {"max": np.max, "min": np.min}[op](np.where(k, ident, x), axis=1)
    np.testing.assert_array_equal(r, want)


@settings(max_examples=20, deadline=None)
@given(n=st.integers(0, 6), m=st.integers(1, 70), seed=st.integers(0, 2**16))
def test_masked_max_reduction_matches_numpy(n: int, m: int, seed: int) -> None:
    kern = row_reduce("max", masked=True)
    native = compile_kernel(kern)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, m)).astype(np.float32)
    k = rng.random((n, m)) < rng.random()
    (r,) = run(native, kern, {"X": x, "K": k}, {"N": n, "M": m})
    np.testing.assert_array_equal(r, np.where(k, -np.inf, x).max(axis=1, initial=-np.inf))


def test_local_temp_private_to_parallel_iteration_and_large_temps() -> None:
    # T[j] = X[i, j] * 2 in a per-row temp, then Y[i, j] = T[M - 1 - j]
    T = Buffer("T", "float32", (M,), "local")
    body = [
        For(
            "i",
            N,
            [
                For(
                    "j",
                    M,
                    [
                        Block(
                            "s",
                            [IterVar("vi", N), IterVar("vj", M)],
                            [Var("i"), Var("j")],
                            [
                                Store(
                                    "T",
                                    (Var("vj"),),
                                    Bin("*", ld("X", Var("vi"), Var("vj")), Const(2.0, "float64")),
                                )
                            ],
                        )
                    ],
                ),
                For(
                    "j",
                    M,
                    [
                        Block(
                            "o",
                            [IterVar("vi", N), IterVar("vj", M)],
                            [Var("i"), Var("j")],
                            [
                                Store(
                                    "Y",
                                    (Var("vi"), Var("vj")),
                                    ld("T", Bin("-", Bin("-", M, Const(1)), Var("vj"))),
                                )
                            ],
                        )
                    ],
                ),
            ],
            ForKind.PARALLEL,
        )
    ]
    kern = Kernel(
        "tmp",
        [Buffer("X", "float32", (N, M))],
        [Buffer("Y", "float32", (N, M))],
        ["N", "M"],
        body,
        [T],
    )
    x = (
        np.random.default_rng(0).standard_normal((5, 40000)).astype(np.float32)
    )  # 160 KB temp: malloc'd; 5 rows: every thread has rows of its own and shares none
    for threads in (1, 2):
        check_against_reference(kern, {"X": x}, {"N": 5, "M": 40000}, threads=threads)


def test_register_array_loops_are_unrolled_to_scalars() -> None:
    acc = Buffer("p", "float32", (Const(8),), "register")
    body = [
        For(
            "i",
            N,
            [
                For(
                    "k",
                    Const(8),
                    [
                        Block(
                            "z",
                            [IterVar("vk", Const(8))],
                            [Var("k")],
                            [Store("p", (Var("vk"),), Const(0.0, "float32"))],
                        )
                    ],
                ),
                For(
                    "j",
                    Bin("//", M, Const(8)),
                    [
                        For(
                            "k",
                            Const(8),
                            [
                                Block(
                                    "a",
                                    [IterVar("vi", N), IterVar("vj", M), IterVar("vk", Const(8))],
                                    [Var("i"), Var("j"), Var("k")],
                                    [
                                        Store(
                                            "p",
                                            (Var("vk"),),
                                            Bin(
                                                "+",
                                                ld("p", Var("vk")),
                                                ld(
                                                    "X",
                                                    Var("vi"),
                                                    Bin(
                                                        "+",
                                                        Bin("*", Var("vj"), Const(8)),
                                                        Var("vk"),
                                                    ),
                                                ),
                                            ),
                                        )
                                    ],
                                )
                            ],
                        )
                    ],
                ),
                Block(
                    "o",
                    [IterVar("vi", N)],
                    [Var("i")],
                    [
                        Store(
                            "R",
                            (Var("vi"),),
                            ld("p", Const(0))
                            + ld("p", Const(1))
                            + ld("p", Const(2))
                            + ld("p", Const(3))
                            + ld("p", Const(4))
                            + ld("p", Const(5))
                            + ld("p", Const(6))
                            + ld("p", Const(7)),
                        )
                    ],
                ),
            ],
            ForKind.PARALLEL,
        )
    ]
    kern = Kernel(
        "psum",
        [Buffer("X", "float32", (N, M))],
        [Buffer("R", "float32", (N,))],
        ["N", "M"],
        body,
        [acc],
    )
    x = np.random.default_rng(0).standard_normal((5, 64)).astype(np.float32)
    native = check_against_reference(kern, {"X": x}, {"N": 5, "M": 64}, exact=False)
    # a stack array in the emitted IR, scalars (no stack array left) once LLVM's SROA ran
    assert "alloca [8 x float]" in native.source
    assert "alloca [8 x float]" not in native.llvm


# ---------------------------------------------------------------------------------
# calling convention and errors
# ---------------------------------------------------------------------------------
def test_wrong_arguments_are_rejected_with_names() -> None:
    kern = eltwise(lambda X: X, {"X": "float32"}, "float32")
    k = compile_kernel(kern)
    x = np.zeros((3, 4), np.float32)
    with pytest.raises(ValueError, match="argument X must have shape"):
        k(x, np.zeros((3, 4), np.float32), 3, 5)
    with pytest.raises(ValueError, match="argument Y must have shape"):
        k(x, np.zeros((3, 5), np.float32), 3, 4)
    with pytest.raises(TypeError, match="argument X must be a float32 array"):
        k(x.astype(np.float64), np.zeros((3, 4), np.float32), 3, 4)
    with pytest.raises(TypeError, match="expected 2 arrays"):
        k(x, 3, 4)
    with pytest.raises(TypeError, match="output Y must be C-contiguous"):
        k(x, np.zeros((4, 3), np.float32).T, 3, 4)
    with pytest.raises(TypeError, match="dim N must be an int"):
        k(x, np.zeros((3, 4), np.float32), 3.0, 4)
    y = np.zeros((3, 4), np.float32)
    k(np.arange(24, dtype=np.float32).reshape(3, 8)[:, ::2], y, 3, 4)  # strided input copied
    np.testing.assert_array_equal(y, np.arange(24, dtype=np.float32).reshape(3, 8)[:, ::2])


def test_zero_d_buffers_take_one_element_arrays() -> None:
    body = [
        For(
            "i",
            N,
            [
                Block(
                    "b",
                    [IterVar("vi", N)],
                    [Var("i")],
                    [Store("Y", (Var("vi"),), Bin("*", ld("X", Var("vi")), ld("S")))],
                )
            ],
        )
    ]
    kern = Kernel(
        "zd",
        [Buffer("X", "float32", (N,)), Buffer("S", "float32", ())],
        [Buffer("Y", "float32", (N,))],
        ["N"],
        body,
    )
    k = compile_kernel(kern)
    x, y = np.arange(5, dtype=np.float32), np.zeros(5, np.float32)
    for s in (np.array(2.0, np.float32), np.array([2.0], np.float32)):
        k(x, s, y, 5)
        np.testing.assert_array_equal(y, x * 2)
    with pytest.raises(ValueError, match="argument S must hold exactly one element"):
        k(x, np.array([2.0, 3.0], np.float32), y, 5)


def test_emit_errors_name_the_kernel() -> None:
    bad = Kernel(
        "bad",
        [Buffer("X", "float32", (N,))],
        [Buffer("Y", "float32", (N,))],
        ["N"],
        [For("i", N, [Store("Y", (Var("i"),), ld("Z", Var("i")))])],
    )
    with pytest.raises(CodegenError, match="kernel 'bad'.*unknown buffer 'Z'"):
        compile_kernel(bad)
    neg = eltwise(lambda X: Un("neg", X), {"X": "bool"}, "bool")
    with pytest.raises(CodegenError, match="neg of a bool"):
        compile_kernel(neg)


def test_same_kernel_compiles_once_while_alive() -> None:
    a = compile_kernel(eltwise(lambda X: X + Const(7.0, "float64"), {"X": "float32"}, "float32"))
    b = compile_kernel(eltwise(lambda X: X + Const(7.0, "float64"), {"X": "float32"}, "float32"))
    assert a is b


# ---------------------------------------------------------------------------------
# machine code: vectors, thread pool, streaming stores
# ---------------------------------------------------------------------------------
def test_elementwise_loop_vectorizes_and_uses_the_pool() -> None:
    k = compile_kernel(
        eltwise(
            lambda X, B: X * B + Const(1.0, "float64"), {"X": "float32", "B": "float32"}, "float32"
        )
    )
    assert "geode_parallel_for" in k.source
    assert "x float>" in k.llvm  # vector IR after the loop vectorizer


def streamed(min_bytes: int = 0) -> Kernel:
    """``Y = X * 2`` over [N, M] staged in a per-row local buffer and streamed out."""
    S = Buffer("S", "float32", (M,), "local")
    nt = Bin(">=", Bin("*", Bin("*", N, M), Const(4)), Const(min_bytes))
    body = [
        For(
            "i",
            N,
            [
                For(
                    "j",
                    M,
                    [
                        Block(
                            "s",
                            [IterVar("vi", N), IterVar("vj", M)],
                            [Var("i"), Var("j")],
                            [
                                Store(
                                    "S",
                                    (Var("vj"),),
                                    Bin("*", ld("X", Var("vi"), Var("vj")), Const(2.0, "float64")),
                                )
                            ],
                        )
                    ],
                    ForKind.VECTORIZED,
                ),
                StreamStore("Y", Bin("*", Var("i"), M), "S", Const(0), M, nt),
            ],
            ForKind.PARALLEL,
        )
    ]
    return Kernel(
        "streamed",
        [Buffer("X", "float32", (N, M))],
        [Buffer("Y", "float32", (N, M))],
        ["N", "M"],
        body,
        [S],
    )


@pytest.mark.parametrize("n,m", [(3, 1), (5, 16), (7, 48), (4, 515)])
@pytest.mark.parametrize("min_bytes", [0, 1 << 40])
def test_streamed_kernel_matches_numpy(n: int, m: int, min_bytes: int) -> None:
    k = compile_kernel(streamed(min_bytes))
    x = np.random.default_rng(n).standard_normal((n, m)).astype(np.float32)
    y = np.zeros_like(x)
    k(x, y, n, m)
    np.testing.assert_array_equal(y, x * 2)
    assert "!nontemporal" in k.source and "sfence" in k.source


def test_kernel_runs_without_the_gil() -> None:
    import threading

    k = compile_kernel(eltwise(lambda X: Un("exp", X), {"X": "float64"}, "float64", ForKind.SERIAL))
    x = np.random.default_rng(0).standard_normal((400, 10000))
    y = np.empty_like(x)
    ticks = []
    stop = threading.Event()

    def ticker() -> None:
        while not stop.is_set():
            ticks.append(1)

    t = threading.Thread(target=ticker)
    t.start()
    try:
        k(x, y, 400, 10000)
    finally:
        stop.set()
        t.join()
    assert len(ticks) > 10
    np.testing.assert_allclose(y, np.exp(x), rtol=1e-14)


# ---------------------------------------------------------------------------------
# the object-code cache
# ---------------------------------------------------------------------------------
_CHILD = """
import sys, numpy as np
from geode.codegen import ast as A
sys.path.insert(0, {tests!r})
from test_backend_llvm import eltwise
from geode.codegen.backends.llvm.kernel import compile_kernel
k = compile_kernel(eltwise(lambda X: X * A.Const(3.0, "float64"), {{"X": "float32"}}, "float32"), cache_dir={cache!r})
x = np.arange(12, dtype=np.float32).reshape(3, 4); y = np.zeros_like(x)
k(x, y, 3, 4)
assert (y == x * 3).all()
print("HIT" if k.from_cache else "MISS", "numba" in sys.modules)
"""


def _child(cache: str) -> str:
    code = _CHILD.format(tests=os.path.dirname(__file__), cache=cache)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_warm_start_loads_object_code_without_numba(tmp_path) -> None:
    cache = str(tmp_path / "c")
    assert _child(cache) == "MISS False"
    assert _child(cache) == "HIT False"
    entries = list((tmp_path / "c" / "kernels").iterdir())
    assert len(entries) == 1 and {p.name for p in entries[0].iterdir()} == {
        "kernel.o",
        "manifest.json",
    }
    # a corrupted object is a miss, rebuilt
    obj = entries[0] / "kernel.o"
    obj.write_bytes(obj.read_bytes()[:-7] + b"garbage")
    assert _child(cache) == "MISS False"
    assert _child(cache) == "HIT False"


def test_cache_not_private_to_the_user_is_not_read(tmp_path, caplog) -> None:
    cache = tmp_path / "shared"
    (cache / "kernels").mkdir(parents=True)
    os.chmod(cache, 0o777)
    assert not objcache.trusted_folder(cache)
    assert objcache.load(cache, "0" * 64, "x") is None
    assert "not private" in caplog.text
    os.chmod(cache, 0o755)
    fifo = cache / "kernels" / ("1" * 32)
    fifo.mkdir()
    os.mkfifo(fifo / "manifest.json")
    assert objcache.load(cache, "1" * 64, "x") is None  # a FIFO is not read (no hang)


def test_kernels_and_their_machine_code_are_freed_with_their_model() -> None:
    """A model's kernels (and the JIT library each keeps mapped) die with the model once
    the memo stops holding the most recent ones: a process compiling model after model
    does not keep them all (see test_only_the_most_recent_dead_kernels_are_held)."""
    import gc
    import weakref

    import geode
    from geode import examples
    from geode.codegen.backends.llvm import kernel as kernel_mod

    gc.collect()
    before = set(kernel_mod._memo.keys())
    ex = examples.layernorm(hidden=88)
    model = geode.compile(ex.graph)
    model(**ex.make_inputs(np.random.default_rng(0), 3))
    mine = [k for key, k in list(kernel_mod._memo.items()) if key not in before]
    assert mine, "the model compiled no LLVM kernel"
    refs = [weakref.ref(k) for k in mine] + [weakref.ref(k._loaded) for k in mine]
    del model, mine
    kernel_mod.drop_recent_kernels()
    gc.collect()
    assert all(r() is None for r in refs)


def test_only_the_most_recent_dead_kernels_are_held() -> None:
    """A recompile of the same model finds its kernels (LLVM keeps ~10 KB per JIT library
    ever linked, so linking them anew each time would grow without bound), and a memo
    holds no more than ``keep`` kernels that no model uses."""
    import gc

    from geode.codegen.backends.llvm import kernel as kernel_mod

    memo = kernel_mod.KernelMemo(keep=3)

    class K:
        pass

    for i in range(10):
        memo.put(i, K())
    gc.collect()
    assert sorted(memo.keys()) == [7, 8, 9]
    kept = memo.get(7)  # asked for again: the most recent
    memo.put(10, K())
    gc.collect()
    assert sorted(memo.keys()) == [7, 9, 10]
    memo.drop_recent()
    gc.collect()
    assert memo.keys() == [7] and memo.get(7) is kept

    kern = eltwise(lambda X: X * A.Const(5.0, "float64"), {"X": "float32"}, "float32")
    first = compile_kernel(kern)
    address = first.address
    del first
    gc.collect()
    again = compile_kernel(kern)
    assert again.address == address, "a recompile linked the kernel anew"


# ---------------------------------------------------------------------------------
# library routines: MatMul through numpy's BLAS, by C symbol
# ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("a_shape", [(5, 7), (2, 5, 7), (2, 3, 1, 7), (0, 7), (5, 0)])
def test_native_matmul_is_numpys_result(dtype: str, a_shape: tuple) -> None:
    from geode.codegen.backends.llvm.library import blas, matmul_kernel

    if blas() is None:
        pytest.skip("no BLAS found in numpy's wheel or the process")
    k = matmul_kernel(dtype, len(a_shape))
    rng = np.random.default_rng(len(a_shape))
    a = rng.standard_normal(a_shape).astype(dtype)
    b = rng.standard_normal((a_shape[-1], 3)).astype(dtype)
    y = np.full((*a_shape[:-1], 3), 9, dtype)
    tol = 1e-6 if dtype == "float32" else 1e-14  # numpy may take another BLAS path
    k(a, b, y)
    np.testing.assert_allclose(y, a @ b, rtol=tol, atol=tol)
    k(np.asfortranarray(a) if a.ndim == 2 else a, b, y)  # a strided input is copied
    np.testing.assert_allclose(y, a @ b, rtol=tol, atol=tol)
    with pytest.raises(ValueError, match="argument B must have shape"):
        k(a, np.zeros((a_shape[-1] + 1, 3), dtype), y)
    with pytest.raises(ValueError, match="argument Y must have shape"):
        k(a, b, np.zeros((*a_shape[:-1], 4), dtype))


def test_models_call_blas_natively_where_it_applies() -> None:
    import geode
    from geode import ops
    from geode.codegen.backends.llvm.library import blas

    if blas() is None:
        pytest.skip("no BLAS found in numpy's wheel or the process")
    g = geode.Graph("mm")
    x = g.input("x", ["N", "S", 16])
    w = g.constant(np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32))
    h = g.input("h", ["N", 16, 4], "float16")
    wh = g.constant(np.ones((4, 2), np.float16))
    q = g.input("q", ["N", 16, 4])
    g.output(
        ops.relu(ops.matmul(x, w)), ops.matmul(h, wh), ops.matmul(x, q), names=["y", "yh", "yb"]
    )
    model = geode.compile(g)
    kinds = {tuple(n.op_type for n in k.ops): k.kind for k in model.kernels if len(k.ops) == 1}
    # the Relu fuses into the MatMul as its epilogue (kind "dense"); the batched (rank-3 B)
    # MatMul is a library kernel of its own, and so is the float16 one (in float32,
    # between casts)
    dense = [k for k in model.kernels if k.kind == "dense"]
    assert len(dense) == 1 and dense[0].ops[0].inputs[1].shape == (16, 8), kinds
    assert [n.op_type for n in dense[0].ops] == ["MatMul", "Relu"]
    lib = sorted(
        (k for k in model.kernels if k.kind == "library"),
        key=lambda k: len(k.ops[0].inputs[1].shape),
    )
    assert [len(k.ops[0].inputs[1].shape) for k in lib] == [2, 3], kinds
    assert lib[0].ops[0].inputs[1].dtype == np.float32  # the float16 weights, cast
    rng = np.random.default_rng(1)
    feeds = {
        "x": rng.standard_normal((2, 3, 16)).astype(np.float32),
        "h": rng.standard_normal((2, 16, 4)).astype(np.float16),
        "q": rng.standard_normal((2, 16, 4)).astype(np.float32),
    }
    out = model(**feeds)
    want_y = np.maximum(feeds["x"] @ g.values[w.name].data, 0)
    np.testing.assert_allclose(out["y"], want_y, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out["yb"], feeds["x"] @ feeds["q"], rtol=1e-5, atol=1e-5)
    want_h = (feeds["h"].astype(np.float32) @ np.ones((4, 2), np.float32)).astype(np.float16)
    np.testing.assert_allclose(out["yh"].astype(np.float32), want_h.astype(np.float32), rtol=1e-3)


def test_matmul_of_a_data_dependent_shape_runs_natively() -> None:
    """A MatMul whose output has a dim known only once a value is computed (rows picked by
    NonZero) runs natively: its step sizes the output from the symbol the NonZero's result
    bound (issue 37); right for any count, 0 included."""
    import geode
    from geode import ops

    g = geode.Graph("nz")
    x = g.input("x", ["N", 2])
    picked = ops.cast(ops.transpose(ops.non_zero(x)), to=1)  # [K, 2], K data-dependent
    w = g.constant(np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], np.float32))
    g.output(ops.matmul(picked, w), names=["y"])
    model = geode.compile(g)
    assert [k.ops[0].op_type for k in model.kernels if k.kind == "library"] == ["MatMul"]
    for xv in (np.array([[1, 0], [0, 2], [3, 4]], np.float32), np.zeros((2, 2), np.float32)):
        want = np.transpose(np.nonzero(xv)).astype(np.float32) @ g.values[w.name].data
        np.testing.assert_array_equal(model(x=xv)["y"], want)


def test_temporaries_are_allocated_in_an_order_that_does_not_depend_on_hashing() -> None:
    """The IR text is the cache key: temporaries allocated in a set's order (which
    changes from process to process with string hashing) gave one kernel different keys
    in different processes, so warm starts missed the cache at random."""
    from geode.codegen.backends.llvm.analysis import allocation_sites

    names = {f"t{i}_sum" for i in range(12)}
    for order in (sorted(names), sorted(names, reverse=True)):
        sites = allocation_sites([], set(order), lambda loop: False)
        assert list(sites) == sorted(names)


_HASH_CHILD = """
import hashlib, sys
sys.path.insert(0, {tests!r})
from test_concurrency import graph
import geode
m = geode.compile(graph())
print(hashlib.sha256("".join(k.source for k in m.kernels).encode()).hexdigest())
"""


def test_kernel_ir_is_the_same_in_every_process() -> None:
    code = _HASH_CHILD.format(tests=os.path.join(os.path.dirname(os.path.dirname(__file__)), "e2e"))
    children = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONHASHSEED": seed, "GEODE_PROGRESS": "0"},
        )
        for seed in ("1", "2")
    ]
    digests = set()
    for p in children:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        digests.add(out.strip().splitlines()[-1])
    assert len(digests) == 1


# ---------------------------------------------------------------------------------
# a predicate that does not depend on the innermost loop is tested once before it
# ---------------------------------------------------------------------------------


def _guarded_rows() -> Kernel:
    """``Y[i, j] = X[i, j] * 2`` with the row loop split 4 ways (a non-dividing split:
    the block's guard uses the two row loops, not the element loop)."""
    from geode.codegen.schedule import Schedule

    blk = Block(
        "b",
        [IterVar("vi", N), IterVar("vj", M)],
        [Var("i"), Var("j")],
        [Store("Y", (Var("vi"), Var("vj")), ld("X", Var("vi"), Var("vj")) * Const(2.0, "float32"))],
    )
    kern = Kernel(
        "rows",
        [Buffer("X", "float32", (N, M))],
        [Buffer("Y", "float32", (N, M))],
        ["N", "M"],
        [For("i", N, [For("j", M, [blk])])],
    )
    sch = Schedule(kern)
    sch.split("i", [4, None])
    sch.vectorize("j")
    return sch.kernel


def test_a_loop_invariant_predicate_is_hoisted_out_of_the_loop() -> None:
    from geode.codegen.backends.llvm.stmts import hoist_predicate

    kern = _guarded_rows()
    inner = kern.body[0].body[0].body[0]
    assert isinstance(inner, For) and inner.var == "j"
    hoisted = hoist_predicate(inner)
    assert hoisted is not None
    pred, loop = hoisted
    assert A.expr_str(pred) == "i_0 * ((N + 3) // 4) + i_1 < N"
    assert loop.body[0].predicate is None and loop.kind is ForKind.VECTORIZED
    assert inner.body[0].predicate is not None  # the kernel itself is left as it was
    # a loop holding a loop, or a predicate using the loop's own variable: not hoisted
    assert hoist_predicate(kern.body[0].body[0]) is None
    own = Block("c", [], [], [], A.Bin("<", Var("j"), M))
    assert hoist_predicate(For("j", M, [own])) is None
    rng = np.random.default_rng(3)
    for n, m in ((7, 33), (1, 5), (8, 64), (0, 3)):
        X = rng.standard_normal((n, m), dtype=np.float32)
        check_against_reference(kern, {"X": X}, {"N": n, "M": m})


# ---------------------------------------------------------------------------------
# a tile's guard on the innermost loop becomes the loop's bound
# ---------------------------------------------------------------------------------


def _tiled_transpose() -> Kernel:
    """``Y[j, i] = X[i, j]`` with the inner loop split into tiles of 8 (``M`` need not
    divide: the block's guard is ``j_0 * 8 + j_1 < M``), the tile loop vectorized."""
    from geode.codegen.schedule import Schedule

    blk = Block(
        "t",
        [IterVar("vi", N), IterVar("vj", M)],
        [Var("i"), Var("j")],
        [Store("Y", (Var("vj"), Var("vi")), ld("X", Var("vi"), Var("vj")))],
    )
    kern = Kernel(
        "transpose",
        [Buffer("X", "float32", (N, M))],
        [Buffer("Y", "float32", (M, N))],
        ["N", "M"],
        [For("i", N, [For("j", M, [blk])])],
    )
    sch = Schedule(kern)
    sch.split("j", [None, 8])
    sch.vectorize("j_1")
    return sch.kernel


def test_a_tile_guard_becomes_the_loop_bound() -> None:
    from geode.codegen.backends.llvm.stmts import narrow_to_predicate

    kern = _tiled_transpose()
    tile = kern.body[0].body[0].body[0]
    assert isinstance(tile, For) and tile.var == "j_1"
    assert A.expr_str(tile.body[0].predicate) == "j_0 * 8 + j_1 < M"
    narrowed = narrow_to_predicate(tile)
    assert narrowed is not None and narrowed.body[0].predicate is None
    assert A.expr_str(narrowed.extent) == "max(0, min(8, M - j_0 * 8))"
    assert narrowed.kind is ForKind.VECTORIZED
    assert tile.body[0].predicate is not None  # the kernel itself is left as it was
    # a guard that is not var + c < e in the loop's variable: left alone
    for cond in (
        A.Bin("<", Var("j_1") * Const(2), M),
        A.Bin("<", M, Var("j_1")),
        A.Bin("<", Var("j_1"), Var("j_1") + M),
        A.Bin("==", Var("j_1"), M),
    ):
        assert narrow_to_predicate(For("j_1", Const(8), [Block("c", [], [], [], cond)])) is None
    # an invariant conjunct stays as the block's guard (hoisted before the loop)
    both = A.Bin("and", A.Bin("<", Var("i"), N), A.Bin("<=", Var("j_1") + Const(3), M))
    kept = narrow_to_predicate(For("j_1", Const(8), [Block("c", [], [], [], both)]))
    assert kept is not None and A.expr_str(kept.body[0].predicate) == "i < N"
    assert A.expr_str(kept.extent) == "max(0, min(8, M - 3 + 1))"
    rng = np.random.default_rng(5)
    for n, m in ((3, 19), (2, 8), (5, 1), (4, 0), (1, 33)):
        X = rng.standard_normal((n, m), dtype=np.float32)
        check_against_reference(kern, {"X": X}, {"N": n, "M": m})
