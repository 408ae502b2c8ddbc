"""The numba backend: hand-built loop ASTs compiled and compared with numpy.

Every kernel is compiled once per module (numba compiles take ~1 s) and called with
several values of its symbolic dims. Float results use the project's tolerance
policy (``opcheck.assert_close``) where the operation is not exactly rounded
(transcendental functions); everything else must match numpy bit for bit.
"""

from __future__ import annotations

import pytest

# the numba backend's own tests: numba is an optional extra (CI installs it)
pytest.importorskip("numba", reason='needs numba, an optional extra: pip install "geode[numba]"')

import re
import warnings
from unittest import mock

import llvmlite.binding as llvm
import numba
import numpy as np
from opcheck import assert_close
from test_fused_kernels import runs_parallel

from geode.codegen import ast as A
from geode.codegen.ast import (
    BIN_OPS,
    UN_OPS,
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
    Un,
    Var,
)
from geode.codegen.backends import chunks
from geode.codegen.backends import numba as nb
from geode.codegen.backends.numba import kernel as nb_kernel
from geode.codegen.backends.numba import pysource as nb_pysource
from geode.config import ACCURACY_POLICY, OptionError
from geode.errors import CodegenError

N, M, K = Var("N"), Var("M"), Var("K")


def c(v: float | int | bool, dtype: str) -> Const:
    return Const(v, dtype)


def ld(buf: str, *idx: A.Expr) -> Load:
    return Load(buf, tuple(idx))


def block(
    name: str,
    binds: dict[str, A.Expr],
    body: list,
    predicate: A.Expr | None = None,
    reduce: tuple[str, ...] = (),
) -> Block:
    ivs = [IterVar(v, Const(0), "reduce" if v in reduce else "spatial") for v in binds]
    return Block(name, ivs, list(binds.values()), body, predicate=predicate)


def elementwise_1d(
    name: str,
    inputs: list[Buffer],
    outputs: list[Buffer],
    stores: list,
    kind: ForKind = ForKind.SERIAL,
) -> Kernel:
    """``for i in N: block(vi = i) { stores }`` over 1-d buffers of length N."""
    return Kernel(
        name, inputs, outputs, ["N"], [For("i", N, [block(name, {"vi": Var("i")}, stores)], kind)]
    )


def run(kernel: nb.NumbaKernel, inputs: list[np.ndarray], out_specs: list[tuple], dims: list[int]):
    fill = {"f": np.nan, "b": True}
    outs = [np.full(shape, fill.get(np.dtype(dt).kind, 77), dtype=dt) for shape, dt in out_specs]
    kernel(*inputs, *outs, *dims)
    return outs


def exact(got: np.ndarray, want: np.ndarray, what: str = "") -> None:
    assert got.dtype == want.dtype, f"{what}: {got.dtype} != {want.dtype}"
    np.testing.assert_array_equal(got, want, err_msg=what)


# ---------------------------------------------------------------------------------
# elementwise chain with broadcasting loads (parallel x vectorized)
# ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ew_chain() -> nb.NumbaKernel:
    i, j = Var("vi"), Var("vj")
    x = ld("X", i, j)
    val = Bin(
        "-",
        Bin("*", Un("tanh", Bin("+", Bin("*", x, ld("B", j)), ld("C", i, Const(0)))), ld("S")),
        Bin("max", x, c(0.0, "float64")),
    )
    body = [
        For(
            "i0",
            N,
            [
                For(
                    "i1",
                    M,
                    [block("chain", {"vi": Var("i0"), "vj": Var("i1")}, [Store("Y", (i, j), val)])],
                    ForKind.VECTORIZED,
                )
            ],
            ForKind.PARALLEL,
        )
    ]
    k = Kernel(
        "ew_chain",
        [
            Buffer("X", "float32", (N, M)),
            Buffer("B", "float32", (M,)),
            Buffer("C", "float32", (N, Const(1))),
            Buffer("S", "float32", ()),
        ],
        [Buffer("Y", "float32", (N, M))],
        ["N", "M"],
        body,
    )
    return nb.compile_kernel(k)


@pytest.mark.parametrize("n,m", [(3, 5), (17, 33), (1, 1), (0, 4), (64, 256)])
def test_elementwise_chain_broadcast(ew_chain: nb.NumbaKernel, n: int, m: int) -> None:
    rng = np.random.default_rng(n * 100 + m)
    X = rng.standard_normal((n, m), dtype=np.float32)
    B = rng.standard_normal(m, dtype=np.float32)
    C = rng.standard_normal((n, 1), dtype=np.float32)
    S = np.array(1.5, np.float32)
    (Y,) = run(ew_chain, [X, B, C, S], [((n, m), np.float32)], [n, m])
    want = np.tanh(X * B + C) * S - np.maximum(X, np.float32(0))
    assert_close(Y, want.astype(np.float32))
    assert ew_chain.parallel and ew_chain.chunked and runs_parallel(ew_chain.source)


def test_zero_d_buffer_accepts_one_element_array(ew_chain: nb.NumbaKernel) -> None:
    # native convention: 1-element 1-d; __call__ also takes 0-d arrays (see above)
    X = np.ones((2, 3), np.float32)
    Y = np.empty((2, 3), np.float32)
    ew_chain(
        X,
        np.ones(3, np.float32),
        np.zeros((2, 1), np.float32),
        np.array([2.0], np.float32),
        Y,
        2,
        3,
    )
    assert_close(Y, (np.tanh(np.ones((2, 3), np.float32)) * 2 - 1).astype(np.float32))


def test_wrong_shape_or_dtype_is_rejected(ew_chain: nb.NumbaKernel) -> None:
    X = np.ones((2, 3), np.float32)
    args = [np.ones(3, np.float32), np.zeros((2, 1), np.float32), np.array(1.0, np.float32)]
    with pytest.raises(ValueError, match="argument X must have shape"):
        ew_chain(X, *args, np.empty((2, 3), np.float32), 2, 4)
    with pytest.raises(TypeError, match="argument X must be a float32 array"):
        ew_chain(X.astype(np.float64), *args, np.empty((2, 3), np.float32), 2, 3)
    with pytest.raises(TypeError, match="output Y must be C-contiguous"):
        ew_chain(X, *args, np.empty((3, 2), np.float32).T, 2, 3)
    with pytest.raises(TypeError, match="expected 5 arrays"):
        ew_chain(X, 2, 3)


def test_non_contiguous_inputs_are_copied(ew_chain: nb.NumbaKernel) -> None:
    X = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]  # strided view
    Y = np.empty((3, 2), np.float32)
    ew_chain(
        X, np.ones(2, np.float32), np.zeros((3, 1), np.float32), np.array(1.0, np.float32), Y, 3, 2
    )
    assert_close(Y, (np.tanh(X) - np.maximum(X, 0)).astype(np.float32))


def test_non_contiguous_float16_input_is_copied() -> None:
    """A float16 kernel (uint16 views natively) given a strided float16 input: copied to C
    order from the caller's array, not from its uint16 view (which was refused as 'not
    a float16 array')."""
    ext = (A.Var("N"), A.Const(8))
    v = (A.Var("vi"), A.Var("vj"))
    ivs = [IterVar("vi", ext[0]), IterVar("vj", ext[1])]
    val = A.Bin("+", A.Load("X", v), A.Const(1.0, "float16"))
    blk = A.Block("e", ivs, [A.Var("i"), A.Var("j")], [A.Store("Y", v, val)])
    body = [A.For("i", ext[0], [A.For("j", ext[1], [blk])])]
    kern = A.Kernel(
        "h16", [A.Buffer("X", "float16", ext)], [A.Buffer("Y", "float16", ext)], ["N"], body
    )
    native = nb.compile_kernel(kern)
    x = np.arange(48, dtype=np.float16).reshape(3, 16)[:, ::2]
    y = np.empty((3, 8), np.float16)
    native(x, y, 3)
    np.testing.assert_array_equal(y, x + np.float16(1))


def test_read_only_inputs(ew_chain: nb.NumbaKernel) -> None:
    X = np.ones((2, 3), np.float32)
    X.flags.writeable = False
    Y = np.empty((2, 3), np.float32)
    B, C, S = np.ones(3, np.float32), np.zeros((2, 1), np.float32), np.zeros(1, np.float32)
    ew_chain.fn(X, B, C, S, Y, 2, 3, *ew_chain.launch_args)
    assert_close(Y, np.full((2, 3), -1.0, np.float32))


# ---------------------------------------------------------------------------------
# row reduction with an init block
# ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def row_reduce() -> nb.NumbaKernel:
    vi, vk = Var("vi"), Var("vk")
    body = [
        For(
            "i",
            N,
            [
                Block(
                    "sum_init",
                    [IterVar("vi", N)],
                    [Var("i")],
                    [Store("Y", (vi,), c(0.0, "float32"))],
                    reduce_of="sum",
                ),
                For(
                    "k",
                    K,
                    [
                        Block(
                            "sum",
                            [IterVar("vi", N), IterVar("vk", K, "reduce")],
                            [Var("i"), Var("k")],
                            [Store("Y", (vi,), Bin("+", ld("Y", vi), ld("X", vi, vk)))],
                        ),
                        Block(
                            "amax",
                            [IterVar("vi", N), IterVar("vk", K, "reduce")],
                            [Var("i"), Var("k")],
                            [
                                Store(
                                    "Z",
                                    (vi,),
                                    Select(
                                        Bin("==", Var("vk"), Const(0)),
                                        ld("X", vi, vk),
                                        Bin("max", ld("Z", vi), ld("X", vi, vk)),
                                    ),
                                )
                            ],
                        ),
                    ],
                ),
            ],
        )
    ]
    k = Kernel(
        "row_reduce",
        [Buffer("X", "float64", (N, K))],
        [Buffer("Y", "float64", (N,)), Buffer("Z", "float64", (N,))],
        ["N", "K"],
        body,
    )
    return nb.compile_kernel(k)


@pytest.mark.parametrize("n,k", [(4, 7), (9, 1), (3, 100)])
def test_row_reduction_with_init(row_reduce: nb.NumbaKernel, n: int, k: int) -> None:
    X = np.random.default_rng(k).standard_normal((n, k))
    Y, Z = run(row_reduce, [X], [((n,), np.float64), ((n,), np.float64)], [n, k])
    assert_close(Y, X.sum(axis=1))
    exact(Z, X.max(axis=1))
    assert not row_reduce.parallel and "prange" not in row_reduce.source


# ---------------------------------------------------------------------------------
# LayerNorm-like: two reductions and an epilogue under one parallel loop
# ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def layernorm() -> nb.NumbaKernel:
    i, k = Var("vi"), Var("vk")
    kf = Cast("float32", K)
    mean = Bin("/", ld("s"), kf)
    d = Bin("-", ld("X", i, k), ld("mean"))
    body = [
        For(
            "i",
            N,
            [
                block("s_init", {"vi": Var("i")}, [Store("s", (), c(0.0, "float32"))]),
                For(
                    "k",
                    K,
                    [
                        block(
                            "s",
                            {"vi": Var("i"), "vk": Var("k")},
                            [Store("s", (), Bin("+", ld("s"), ld("X", i, k)))],
                            reduce=("vk",),
                        )
                    ],
                ),
                block("mean", {"vi": Var("i")}, [Store("mean", (), mean)]),
                block("v_init", {"vi": Var("i")}, [Store("v", (), c(0.0, "float32"))]),
                For(
                    "k",
                    K,
                    [
                        block(
                            "v",
                            {"vi": Var("i"), "vk": Var("k")},
                            [Store("v", (), Bin("+", ld("v"), Bin("*", d, d)))],
                            reduce=("vk",),
                        )
                    ],
                ),
                block(
                    "rstd",
                    {"vi": Var("i")},
                    [
                        Store(
                            "rstd",
                            (),
                            Bin(
                                "/",
                                c(1.0, "float64"),
                                Un("sqrt", Bin("+", Bin("/", ld("v"), kf), c(1e-5, "float64"))),
                            ),
                        )
                    ],
                ),
                For(
                    "k",
                    K,
                    [
                        block(
                            "out",
                            {"vi": Var("i"), "vk": Var("k")},
                            [
                                Store(
                                    "Y",
                                    (i, k),
                                    Bin(
                                        "+",
                                        Bin("*", Bin("*", d, ld("rstd")), ld("G", k)),
                                        ld("Bt", k),
                                    ),
                                )
                            ],
                        )
                    ],
                    ForKind.VECTORIZED,
                ),
            ],
            ForKind.PARALLEL,
        )
    ]
    regs = [Buffer(n, "float32", (), "register") for n in ("s", "v", "mean", "rstd")]
    kern = Kernel(
        "layernorm",
        [
            Buffer("X", "float32", (N, K)),
            Buffer("G", "float32", (K,)),
            Buffer("Bt", "float32", (K,)),
        ],
        [Buffer("Y", "float32", (N, K))],
        ["N", "K"],
        body,
        temps=regs,
    )
    return nb.compile_kernel(kern)


@pytest.mark.parametrize("n,k", [(5, 16), (33, 77), (1, 3)])
def test_layernorm_two_reductions_parallel(layernorm: nb.NumbaKernel, n: int, k: int) -> None:
    rng = np.random.default_rng(n + k)
    X = (rng.standard_normal((n, k)) * 3 + 1).astype(np.float32)
    G = rng.standard_normal(k).astype(np.float32)
    Bt = rng.standard_normal(k).astype(np.float32)
    (Y,) = run(layernorm, [X, G, Bt], [((n, k), np.float32)], [n, k])
    x = X.astype(np.float64)
    mu = x.mean(1, keepdims=True)
    want = (x - mu) / np.sqrt(((x - mu) ** 2).mean(1, keepdims=True) + 1e-5) * G + Bt
    np.testing.assert_allclose(Y, want, rtol=1e-4, atol=1e-4)
    src = layernorm.source
    assert layernorm.chunked and "for i in range(i_lo, i_hi):" in src
    assert re.search(r"^\s+s = s \+ X\[i, k\]$", src, re.M), src  # register scalar accumulator
    assert "np.empty" not in _rows_function(src)  # registers are scalars, not arrays


# ---------------------------------------------------------------------------------
# predicate, unrolled loop, partial accumulators, private local temp
# ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def predicated() -> nb.NumbaKernel:
    vi = Var("vi")
    body = [
        For(
            "io",
            Bin("//", Bin("+", N, Const(3)), Const(4)),
            [
                For(
                    "ii",
                    Const(4),
                    [
                        Block(
                            "add",
                            [IterVar("vi", N)],
                            [Bin("+", Bin("*", Var("io"), Const(4)), Var("ii"))],
                            [
                                Store("Y", (vi,), Bin("+", ld("X", vi), c(1, "int64"))),
                                A.If(
                                    Bin("==", Bin("%", vi, Const(3)), Const(0)),
                                    [Store("Z", (vi,), ld("X", vi))],
                                ),
                            ],
                            predicate=Bin("<", vi, N),
                        )
                    ],
                )
            ],
        )
    ]
    outs = [Buffer("Y", "int32", (N,)), Buffer("Z", "int32", (N,))]
    k = Kernel("predicated", [Buffer("X", "int32", (N,))], outs, ["N"], body)
    return nb.compile_kernel(k)


@pytest.mark.parametrize("n", [1, 4, 5, 11, 0])
def test_predicate_guards_tail(predicated: nb.NumbaKernel, n: int) -> None:
    X = np.arange(n, dtype=np.int32) * 3 - 7
    Y = np.full(n + 3, -99, np.int32)  # guard elements after the end
    Z = np.full(n, -5, np.int32)
    predicated(X, Y[:n], Z, n)
    exact(Y[:n], X + np.int32(1))
    assert (Y[n:] == -99).all()
    exact(Z, np.where(np.arange(n) % 3 == 0, X, -5).astype(np.int32))
    assert "if vi < N:" in predicated.source and "if vi % 3 == 0:" in predicated.source


@pytest.fixture(scope="module")
def unrolled() -> nb.NumbaKernel:
    vi, vj = Var("vi"), Var("vj")
    body = [
        For(
            "i",
            N,
            [
                For(
                    "j",
                    Const(4),
                    [
                        block(
                            "scale",
                            {"vi": Var("i"), "vj": Var("j")},
                            [
                                Store(
                                    "Y",
                                    (vi, vj),
                                    Bin(
                                        "*",
                                        ld("X", vi, vj),
                                        Cast("float32", Bin("+", vj, Const(1))),
                                    ),
                                )
                            ],
                        )
                    ],
                    ForKind.UNROLLED,
                )
            ],
        )
    ]
    k = Kernel(
        "unrolled",
        [Buffer("X", "float32", (N, Const(4)))],
        [Buffer("Y", "float32", (N, Const(4)))],
        ["N"],
        body,
    )
    return nb.compile_kernel(k)


def test_unrolled_loop_is_straight_line(unrolled: nb.NumbaKernel) -> None:
    for n in (1, 6):
        X = np.random.default_rng(n).standard_normal((n, 4), dtype=np.float32)
        (Y,) = run(unrolled, [X], [((n, 4), np.float32)], [n])
        exact(Y, X * np.arange(1, 5, dtype=np.float32))
    src = unrolled.source
    assert "for j" not in src
    for j in range(4):
        assert f"Y[i, {j}] = X[i, {j}] * np.float32({j + 1}.0)" in src, src


def partial_sum_kernel(lanes: int = 8) -> Kernel:
    """Row sums with ``lanes`` independent partial accumulators in a register buffer."""
    i = Var("i")
    vl = Var("vl")
    acc = lambda e: ld("acc", e)  # noqa: E731
    tree: A.Expr = acc(Const(0))
    for l in range(1, lanes):
        tree = Bin("+", tree, acc(Const(l)))
    body = [
        For(
            "i",
            N,
            [
                For(
                    "l",
                    Const(lanes),
                    [block("init", {"vl": Var("l")}, [Store("acc", (vl,), c(0.0, "float32"))])],
                    ForKind.UNROLLED,
                ),
                For(
                    "k",
                    Bin("//", K, Const(lanes)),
                    [
                        For(
                            "l",
                            Const(lanes),
                            [
                                block(
                                    "part",
                                    {
                                        "vl": Var("l"),
                                        "vk": Bin("+", Bin("*", Var("k"), Const(lanes)), Var("l")),
                                    },
                                    [Store("acc", (vl,), Bin("+", acc(vl), ld("X", i, Var("vk"))))],
                                    reduce=("vk",),
                                )
                            ],
                            ForKind.VECTORIZED,
                        )
                    ],
                ),
                block("fin", {"vi": i}, [Store("Y", (Var("vi"),), tree)]),
            ],
            ForKind.PARALLEL,
        )
    ]
    return Kernel(
        "partial_sum",
        [Buffer("X", "float32", (N, K))],
        [Buffer("Y", "float32", (N,))],
        ["N", "K"],
        body,
        temps=[Buffer("acc", "float32", (Const(lanes),), "register")],
    )


@pytest.fixture(scope="module")
def partial_sum() -> nb.NumbaKernel:
    return nb.compile_kernel(partial_sum_kernel())


def test_partial_accumulators_stay_scalars(partial_sum: nb.NumbaKernel) -> None:
    for n, k in ((3, 64), (10, 8), (2, 0)):
        X = np.random.default_rng(k).random((n, k), dtype=np.float32)
        (Y,) = run(partial_sum, [X], [((n,), np.float32)], [n, k])
        assert_close(Y, X.sum(1))
    src = partial_sum.source
    assert "acc_7 = acc_7 + X[i," in src and "np.empty" not in _rows_function(src)


def _rows_function(src: str) -> str:
    """The function of a kernel module that does the work: a chunked kernel's body
    (its entry and chunk function only pass the arguments on), else the kernel function."""
    return re.split(r"def \w+_body\(", src)[-1]


def _packed(asm: str, op: str) -> int:
    return len(re.findall(rf"\b{op}\s+[^\n]*%[xyz]mm", asm))


def test_vectorizes_elementwise(ew_chain: nb.NumbaKernel, unrolled: nb.NumbaKernel) -> None:
    # evidence for the indexing choice: native X[i, j] indexing gives packed SIMD
    src = """
import numpy as np, numba
from numba import types as t
A2 = t.Array(t.float32, 2, "C")
@numba.njit((A2, A2, t.Array(t.float32, 1, "C"), A2, t.int64), error_model="numpy", boundscheck=False)
def ew(X, Y, B, Z, N):
    for i in range(N):
        for j in range(256):
            Z[i, j] = X[i, j] * Y[i, j] + B[j]
"""
    ns: dict = {}
    exec(src, ns)
    asm = ns["ew"].inspect_asm(ns["ew"].signatures[0])
    assert _packed(asm, "vmulps") > 0 and _packed(asm, "vaddps") > 0


def test_vectorizes_partial_sum_reduction(partial_sum: nb.NumbaKernel) -> None:
    # SLP vectorization packs the 8 scalar accumulators (numba's default leaves it off)
    assert _packed(partial_sum.asm, "vaddps") > 0, "partial accumulators were not vectorized"


@pytest.fixture(scope="module")
def private_temp() -> nb.NumbaKernel:
    vi, vk = Var("vi"), Var("vk")
    body = [
        For(
            "i",
            N,
            [
                For(
                    "k",
                    K,
                    [
                        block(
                            "fill",
                            {"vi": Var("i"), "vk": Var("k")},
                            [Store("T", (vk,), Bin("*", ld("X", vi, vk), c(2.0, "float32")))],
                        )
                    ],
                ),
                For(
                    "k",
                    K,
                    [
                        block(
                            "rev",
                            {"vi": Var("i"), "vk": Var("k")},
                            [
                                Store(
                                    "Y",
                                    (vi, vk),
                                    Bin(
                                        "+",
                                        ld("T", Bin("-", Bin("-", K, Const(1)), vk)),
                                        ld("T", vk),
                                    ),
                                )
                            ],
                        )
                    ],
                ),
            ],
            ForKind.PARALLEL,
        )
    ]
    k = Kernel(
        "private_temp",
        [Buffer("X", "float32", (N, K))],
        [Buffer("Y", "float32", (N, K))],
        ["N", "K"],
        body,
        temps=[Buffer("T", "float32", (K,), "local")],
    )
    return nb.compile_kernel(k)


def test_local_temp_private_to_parallel_iteration(private_temp: nb.NumbaKernel) -> None:
    src = private_temp.source
    lines = src.splitlines()
    # a chunked kernel: allocated once per non-empty chunk, before the chunk's loop
    loop = lines.index("    for i in range(i_lo, i_hi):")
    assert lines[loop - 3 : loop] == [
        "    if i_lo >= i_hi:",
        "        return",
        "    T = np.empty((K,), dtype=np.float32)",
    ], src
    before = nb.get_num_threads()
    try:
        nb.set_num_threads(0)
        for n, k in ((2000, 64), (7, 3)):
            X = np.random.default_rng(n).random((n, k), dtype=np.float32)
            (Y,) = run(private_temp, [X], [((n, k), np.float32)], [n, k])
            exact(Y, X[:, ::-1] * np.float32(2) + X * np.float32(2))
    finally:
        nb.set_num_threads(before)


def test_temp_shared_across_loops_is_hoisted() -> None:
    vi = Var("vi")
    body = [
        For(
            "i",
            N,
            [
                block(
                    "w", {"vi": Var("i")}, [Store("T", (vi,), Bin("+", ld("X", vi), c(1, "int64")))]
                )
            ],
            ForKind.PARALLEL,
        ),
        For(
            "i",
            N,
            [
                block(
                    "r",
                    {"vi": Var("i")},
                    [
                        Store(
                            "Y",
                            (vi,),
                            Bin("*", ld("T", Bin("-", Bin("-", N, Const(1)), vi)), c(2, "int64")),
                        )
                    ],
                )
            ],
            ForKind.PARALLEL,
        ),
    ]
    k = Kernel(
        "hoisted",
        [Buffer("X", "int64", (N,))],
        [Buffer("Y", "int64", (N,))],
        ["N"],
        body,
        temps=[Buffer("T", "int64", (N,), "local")],
    )
    src = nb.emit_source(k)
    body_lines = src.split("def hoisted")[1].splitlines()
    alloc = next(n for n, ln in enumerate(body_lines) if "np.empty" in ln)
    first_loop = next(n for n, ln in enumerate(body_lines) if "prange" in ln)
    assert alloc < first_loop and body_lines[alloc].startswith("    T = ")
    # two parallel loops: not chunked, numba's prange runs both
    kern = nb.compile_kernel(k)
    assert kern.parallel and not kern.chunked and not kern.launch_args
    for n in (0, 1, 5, 300):
        X = np.arange(n, dtype=np.int64) * 3
        (Y,) = run(kern, [X], [((n,), np.int64)], [n])
        exact(Y, (X[::-1] + 1) * 2)


# ---------------------------------------------------------------------------------
# chunked kernels (one top-level parallel loop, launched through chunks.py)
# ---------------------------------------------------------------------------------


def _row_index_kernel(init_outside: bool = False) -> Kernel:
    """``Y[i, j] = X[i, j] + i`` over a parallel ``i``; with ``init_outside`` a store
    before the loop (``Z[0] = 7``), which keeps the kernel on numba's prange."""
    vi, vj = Var("vi"), Var("vj")
    val = Bin("+", ld("X", vi, vj), A.Cast("float32", vi))
    body: list = [
        For(
            "i",
            N,
            [
                For(
                    "j",
                    M,
                    [block("b", {"vi": Var("i"), "vj": Var("j")}, [Store("Y", (vi, vj), val)])],
                    ForKind.VECTORIZED,
                )
            ],
            ForKind.PARALLEL,
        )
    ]
    outs = [Buffer("Y", "float32", (N, M))]
    if init_outside:
        body.insert(0, block("z", {}, [Store("Z", (Const(0),), c(7, "int64"))]))
        outs.append(Buffer("Z", "int64", (Const(1),)))
    name = "rowidx_init" if init_outside else "rowidx"
    return Kernel(name, [Buffer("X", "float32", (N, M))], outs, ["N", "M"], body)


def test_chunk_function_runs_exactly_its_share_of_the_rows() -> None:
    import ctypes

    k = nb.compile_kernel(_row_index_kernel())
    assert k.chunked and k.rows is not None
    assert k.launch_args == (k.rows.address, chunks.launch_chunks(), 0)
    for n, m, parts in ((7, 5, 3), (2, 4, 5), (16, 1, 16), (0, 3, 2)):
        X = np.random.default_rng(n).random((n, m), dtype=np.float32)
        Y = np.full((n, m), np.nan, np.float32)
        argv = np.array([X.ctypes.data, Y.ctypes.data, n, m], dtype=np.int64)
        done = np.zeros(n, bool)
        for part in range(parts):
            lo, hi = n * part // parts, n * (part + 1) // parts
            k.rows.ctypes(argv.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)), part, parts)
            written = ~np.isnan(Y).any(axis=1)
            assert (written == (done | (np.arange(n) >= lo) & (np.arange(n) < hi))).all()
            done = written
        exact(Y, X + np.arange(n, dtype=np.float32)[:, None])


@pytest.mark.parametrize("threads", [1, 2])
def test_chunked_kernel_matches_on_any_thread_count(threads: int) -> None:
    k = nb.compile_kernel(_row_index_kernel())
    before = nb.get_num_threads()
    try:
        nb.set_num_threads(threads)
        for n in (0, 1, 2, 3, 15, 16, 17, 100):
            X = np.random.default_rng(n).random((n, 9), dtype=np.float32)
            (Y,) = run(k, [X], [((n, 9), np.float32)], [n, 9])
            exact(Y, X + np.arange(n, dtype=np.float32)[:, None])
    finally:
        nb.set_num_threads(before)


def test_store_outside_the_parallel_loop_keeps_numba_prange() -> None:
    k = nb.compile_kernel(_row_index_kernel(init_outside=True))
    assert k.parallel and not k.chunked and "numba.prange(N)" in k.source
    X = np.ones((4, 3), np.float32)
    Y, Z = run(k, [X], [((4, 3), np.float32), ((1,), np.int64)], [4, 3])
    exact(Y, X + np.arange(4, dtype=np.float32)[:, None])
    exact(Z, np.array([7], np.int64))


def test_chunked_kernel_rejects_wrong_shapes_and_dtypes() -> None:
    k = nb.compile_kernel(_row_index_kernel())
    X = np.ones((4, 3), np.float32)
    with pytest.raises(ValueError, match="argument Y must have shape"):
        k(X, np.empty((5, 3), np.float32), 4, 3)
    with pytest.raises(TypeError, match="argument X must be a float32 array"):
        k(X.astype(np.float64), np.empty((4, 3), np.float32), 4, 3)
    with pytest.raises(TypeError, match="output Y must be C-contiguous"):
        k(X, np.empty((3, 4), np.float32).T, 4, 3)


# ---------------------------------------------------------------------------------
# every operator, on float32 and int32
# ---------------------------------------------------------------------------------

FLOAT_BIN = ["+", "-", "*", "/", "//", "%", "fmod", "min", "max", "pow"]
CMP = ["<", "<=", ">", ">=", "==", "!="]
LOGIC = ["and", "or", "xor"]
FLOAT_UN = [
    "neg",
    "abs",
    "exp",
    "log",
    "log1p",
    "sqrt",
    "sin",
    "cos",
    "tan",
    "asin",
    "acos",
    "atan",
    "sinh",
    "cosh",
    "tanh",
    "asinh",
    "acosh",
    "atanh",
    "erf",
    "sigmoid",
    "floor",
    "ceil",
    "round",
    "sign",
    "fence",
]
BOOL_UN = ["not", "isnan", "isinf", "isposinf", "isneginf"]
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
]
INT_UN = ["neg", "abs", "sign", "bitnot", "floor", "ceil", "round"]
EXACT_FLOAT = {
    "+",
    "-",
    "*",
    "/",
    "//",
    "%",
    "fmod",
    "min",
    "max",
    "neg",
    "abs",
    "sqrt",
    "floor",
    "ceil",
    "round",
    "sign",
    "fence",
}


def test_op_lists_cover_ast() -> None:
    assert nb_pysource._implemented_ops() == (set(BIN_OPS), set(UN_OPS))
    assert (
        set(FLOAT_BIN) | set(CMP) | set(LOGIC) | {"bitand", "bitor", "bitxor", "shl", "shr"}
        == BIN_OPS
    )
    assert set(FLOAT_UN) | set(BOOL_UN) | {"bitnot"} == UN_OPS


def ops_kernel(dtype: str, bin_ops: list[str], un_ops: list[str]) -> Kernel:
    vi = Var("vi")
    a, b = ld("A", vi), ld("B", vi)
    stores = []
    for r, op in enumerate(bin_ops):
        stores.append(Store("V", (Const(r), vi), Bin(op, a, b)))
    for r, op in enumerate(un_ops):
        stores.append(Store("V", (Const(len(bin_ops) + r), vi), Un(op, a)))
    for r, op in enumerate(CMP + LOGIC):
        stores.append(Store("P", (Const(r), vi), Bin(op, a, b)))
    for r, op in enumerate(BOOL_UN):
        stores.append(Store("P", (Const(len(CMP) + len(LOGIC) + r), vi), Un(op, a)))
    nv, npred = len(bin_ops) + len(un_ops), len(CMP) + len(LOGIC) + len(BOOL_UN)
    return elementwise_1d(
        f"ops_{dtype}",
        [Buffer("A", dtype, (N,)), Buffer("B", dtype, (N,))],
        [Buffer("V", dtype, (Const(nv), N)), Buffer("P", "bool", (Const(npred), N))],
        stores,
    )


def np_bin(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    isint = a.dtype.kind in "iu"
    if op == "/" and isint:
        q = np.trunc(a.astype(np.float64) / np.where(b == 0, 1, b))
        return np.where(b == 0, 0, q).astype(a.dtype)
    if op == "pow" and isint:
        return np.power(a, np.abs(b) % 5)
    table = {
        "+": np.add,
        "-": np.subtract,
        "*": np.multiply,
        "/": np.divide,
        "//": np.floor_divide,
        "%": np.mod,
        "fmod": np.fmod,
        "min": np.minimum,
        "max": np.maximum,
        "pow": np.power,
        "<": np.less,
        "<=": np.less_equal,
        ">": np.greater,
        ">=": np.greater_equal,
        "==": np.equal,
        "!=": np.not_equal,
        "bitand": np.bitwise_and,
        "bitor": np.bitwise_or,
        "bitxor": np.bitwise_xor,
        "shl": np.left_shift,
        "shr": np.right_shift,
    }
    if op in ("and", "or", "xor"):
        return {"and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor}[op](
            a != 0, b != 0
        )
    return table[op](a, b)


def np_un(op: str, a: np.ndarray) -> np.ndarray:
    if op == "neg":
        return np.negative(a)
    if op == "fence":
        return a
    if op == "not":
        return a == 0
    if op == "bitnot":
        return np.invert(a)
    if op == "round":
        return np.rint(a) if a.dtype.kind == "f" else a
    if op == "sigmoid":
        with np.errstate(over="ignore"):
            return (1 / (1 + np.exp(-a.astype(np.float64)))).astype(a.dtype)
    if op == "erf":
        import math

        return np.array([math.erf(float(x)) for x in a], dtype=np.float64).astype(a.dtype)
    if op in ("floor", "ceil") and a.dtype.kind != "f":
        return a
    fn = {
        "asin": np.arcsin,
        "acos": np.arccos,
        "atan": np.arctan,
        "asinh": np.arcsinh,
        "acosh": np.arccosh,
        "atanh": np.arctanh,
    }.get(op) or getattr(np, op)
    return fn(a)


@pytest.fixture(scope="module")
def ops_f32() -> nb.NumbaKernel:
    return nb.compile_kernel(ops_kernel("float32", FLOAT_BIN, FLOAT_UN))


@pytest.fixture(scope="module")
def ops_i32() -> nb.NumbaKernel:
    k = ops_kernel("int32", INT_BIN, INT_UN)
    # the pow row uses |b| % 5 as its exponent (negative exponents are tested separately)
    row = INT_BIN.index("pow")
    store = k.body[0].body[0].body[row]
    store.value = Bin(
        "pow", ld("A", Var("vi")), Bin("%", Un("abs", ld("B", Var("vi"))), c(5, "int32"))
    )
    return nb.compile_kernel(k)


F32_A = np.array(
    [
        0.0,
        -0.0,
        1.0,
        -1.0,
        2.5,
        -2.5,
        0.5,
        1.5,
        -7.25,
        3.0,
        1e-3,
        0.75,
        -0.3,
        np.nan,
        np.inf,
        -np.inf,
        1e30,
        -1e-30,
        100.0,
        7.0,
    ],
    np.float32,
)
F32_B = np.array(
    [
        1.0,
        2.0,
        0.0,
        -0.0,
        2.0,
        2.0,
        -3.0,
        0.5,
        2.0,
        -4.0,
        0.7,
        np.nan,
        0.3,
        1.0,
        2.0,
        np.inf,
        1e-30,
        3.0,
        -0.5,
        -2.5,
    ],
    np.float32,
)


def test_float32_ops_match_numpy(ops_f32: nb.NumbaKernel) -> None:
    n = len(F32_A)
    V, P = run(
        ops_f32,
        [F32_A, F32_B],
        [
            ((len(FLOAT_BIN) + len(FLOAT_UN), n), np.float32),
            ((len(CMP) + len(LOGIC) + len(BOOL_UN), n), np.bool_),
        ],
        [n],
    )
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for r, op in enumerate(FLOAT_BIN):
            want = np_bin(op, F32_A, F32_B)
            (exact if op in EXACT_FLOAT else assert_close)(V[r], want, f"float32 {op}")
        for r, op in enumerate(FLOAT_UN):
            want = np_un(op, F32_A)
            got = V[len(FLOAT_BIN) + r]
            (exact if op in EXACT_FLOAT else assert_close)(got, want, f"float32 {op}")
        for r, op in enumerate(CMP + LOGIC):
            exact(P[r], np_bin(op, F32_A, F32_B), f"float32 {op}")
        for r, op in enumerate(BOOL_UN):
            exact(P[len(CMP) + len(LOGIC) + r], np_un(op, F32_A), f"float32 {op}")


def test_float32_math_stays_float32(ops_f32: nb.NumbaKernel) -> None:
    src = ops_f32.source
    assert "np.float64" not in src and "exp_f32(A[i])" in src
    # a chain float64 intermediates would get wrong: (x + 1e-8) - x == 0 in float32
    vi = Var("vi")
    k = elementwise_1d(
        "f32_chain",
        [Buffer("X", "float32", (N,))],
        [Buffer("Y", "float32", (N,))],
        [Store("Y", (vi,), Bin("-", Bin("+", ld("X", vi), c(1e-8, "float64")), ld("X", vi)))],
    )
    assert "np.float32(1e-08)" in nb.emit_source(k)


I32_A = np.array(
    [7, -7, 7, -7, 0, 5, -(2**31), 2**31 - 1, 13, -13, 1, 100, 3, -1, 6, 255], np.int32
)
I32_B = np.array([2, 2, -2, -2, 3, 0, -1, 1, 40, 31, -1, 7, 0, 5, 33, -3], np.int32)


def test_int32_ops_match_numpy(ops_i32: nb.NumbaKernel) -> None:
    n = len(I32_A)
    V, P = run(
        ops_i32,
        [I32_A, I32_B],
        [
            ((len(INT_BIN) + len(INT_UN), n), np.int32),
            ((len(CMP) + len(LOGIC) + len(BOOL_UN), n), np.bool_),
        ],
        [n],
    )
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for r, op in enumerate(INT_BIN):
            exact(V[r], np_bin(op, I32_A, I32_B), f"int32 {op}")
        for r, op in enumerate(INT_UN):
            exact(V[len(INT_BIN) + r], np_un(op, I32_A), f"int32 {op}")
        for r, op in enumerate(CMP + LOGIC):
            exact(P[r], np_bin(op, I32_A, I32_B), f"int32 {op}")
        for r, op in enumerate(BOOL_UN):
            exact(P[len(CMP) + len(LOGIC) + r], np_un(op, I32_A), f"int32 {op}")


# ---------------------------------------------------------------------------------
# integer/unsigned/bool/float16/float64 buffers and casts
# ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mixed_dtypes() -> nb.NumbaKernel:
    vi = Var("vi")
    h1, h2 = ld("H1", vi), ld("H2", vi)
    d = ld("D", vi)
    q = ld("Q", vi)
    u = ld("U", vi)
    stores = [
        # float16: every op rounds to float16, like numpy
        Store("HO", (Const(0), vi), Bin("/", Bin("+", Bin("*", h1, h2), h1), h2)),
        Store("HO", (Const(1), vi), Un("sqrt", Un("abs", h1))),
        Store("HO", (Const(2), vi), Un("exp", Bin("*", h2, c(0.5, "float64")))),
        Store("HO", (Const(3), vi), Cast("float16", d)),
        Store("HO", (Const(4), vi), Bin("-", h1, c(2.5, "float16"))),
        # float64 stays float64; int64 wraps; casts truncate toward zero
        Store("DO", (vi,), Bin("+", Bin("/", d, c(3, "int64")), Cast("float64", h1))),
        Store("QO", (Const(0), vi), Bin("-", Bin("*", q, c(3, "int64")), c(1, "int64"))),
        Store("QO", (Const(1), vi), Cast("int64", d)),
        Store("QO", (Const(2), vi), Bin("/", q, c(-4, "int64"))),
        Store("QO", (Const(3), vi), Cast("int64", Bin(">", d, c(0.0, "float64")))),
        # uint8 wraps and shifts logically
        Store("UO", (Const(0), vi), Bin("+", u, c(200, "uint8"))),
        Store("UO", (Const(1), vi), Bin("-", u, c(1, "uint8"))),
        Store("UO", (Const(2), vi), Bin("shr", u, c(1, "uint8"))),
        Store("UO", (Const(3), vi), Bin("//", u, c(7, "uint8"))),
        Store("UO", (Const(4), vi), Cast("uint8", Cast("int32", h1))),
        # bool buffers
        Store("BO", (Const(0), vi), Bin("and", Bin(">", d, c(0.0, "float64")), ld("BI", vi))),
        Store("BO", (Const(1), vi), Bin("xor", ld("BI", vi), Un("isnan", h1))),
        Store("BO", (Const(2), vi), Cast("bool", q)),
        Store("BO", (Const(3), vi), Bin("max", ld("BI", vi), Bin("<", q, c(0, "int64")))),
    ]
    k = elementwise_1d(
        "mixed",
        [
            Buffer("H1", "float16", (N,)),
            Buffer("H2", "float16", (N,)),
            Buffer("D", "float64", (N,)),
            Buffer("Q", "int64", (N,)),
            Buffer("U", "uint8", (N,)),
            Buffer("BI", "bool", (N,)),
        ],
        [
            Buffer("HO", "float16", (Const(5), N)),
            Buffer("DO", "float64", (N,)),
            Buffer("QO", "int64", (Const(4), N)),
            Buffer("UO", "uint8", (Const(5), N)),
            Buffer("BO", "bool", (Const(4), N)),
        ],
        stores,
        ForKind.PARALLEL,
    )
    return nb.compile_kernel(k)


@pytest.mark.parametrize("n", [9, 1000])
def test_mixed_dtype_buffers(mixed_dtypes: nb.NumbaKernel, n: int) -> None:
    rng = np.random.default_rng(n)
    H1 = (rng.standard_normal(n) * 10).astype(np.float16)
    H2 = (rng.standard_normal(n) * 3 + 0.1).astype(np.float16)
    H1[0] = np.nan
    D = rng.standard_normal(n) * 1e3
    Q = rng.integers(-(2**62), 2**62, n, dtype=np.int64)
    U = rng.integers(0, 256, n, dtype=np.uint8)
    BI = rng.random(n) > 0.5
    HO, DO, QO, UO, BO = run(
        mixed_dtypes,
        [H1, H2, D, Q, U, BI],
        [
            ((5, n), np.float16),
            ((n,), np.float64),
            ((4, n), np.int64),
            ((5, n), np.uint8),
            ((4, n), np.bool_),
        ],
        [n],
    )
    with np.errstate(all="ignore"):
        # the default policy contracts a*b+c into one FMA, so the float16 chain may
        # round once less than numpy does: within one float16 ulp
        h1, h2 = H1.astype(np.float64), H2.astype(np.float64)
        scale = (np.abs(h1 * h2) + np.abs(h1)) / np.abs(h2) + np.abs((h1 * h2 + h1) / h2)
        err = np.abs(HO[0].astype(np.float64) - (h1 * h2 + h1) / h2)
        ok = (err <= 4 * 2.0**-10 * scale) | (np.isnan(HO[0]) & np.isnan((H1 * H2 + H1) / H2))
        assert ok.all(), (
            f"float16 chain off by more than 4 ulp of its terms at {np.flatnonzero(~ok)[:5]}"
        )
        exact(HO[1], np.sqrt(np.abs(H1)), "float16 sqrt")
        np.testing.assert_allclose(
            HO[2].astype(np.float32), np.exp(H2 * np.float16(0.5)).astype(np.float32), rtol=1e-3
        )
        exact(HO[3], D.astype(np.float16), "float64 -> float16")
        exact(HO[4], H1 - np.float16(2.5), "float16 const")
        # D / 3 + h, the add contracted (and D * (1/3) under fastmath): within an ulp
        h64 = H1.astype(np.float64)
        want64 = D / 3 + h64
        close = np.abs(DO - want64) <= 4e-16 * (np.abs(D / 3) + np.abs(h64))
        assert (close | (np.isnan(DO) & np.isnan(want64))).all()
        exact(QO[0], Q * 3 - 1, "int64 wrap")
        exact(QO[1], D.astype(np.int64), "float64 -> int64")
        exact(QO[2], -(np.abs(Q) // 4) * np.sign(Q), "int64 division truncates")
        exact(QO[3], (D > 0).astype(np.int64), "bool -> int64")
        exact(UO[0], U + np.uint8(200), "uint8 wrap")
        exact(UO[1], U - np.uint8(1), "uint8 wrap")
        exact(UO[2], U >> np.uint8(1), "uint8 shr")
        exact(UO[3], U // np.uint8(7), "uint8 //")
        fin = np.isfinite(H1)
        exact(UO[4][fin], H1[fin].astype(np.int32).astype(np.uint8), "float16 -> int32 -> uint8")
        exact(BO[0], (D > 0) & BI)
        exact(BO[1], BI ^ np.isnan(H1))
        exact(BO[2], Q != 0)
        exact(BO[3], BI | (Q < 0))
    src = mixed_dtypes.source
    assert "_g_h2f(H1[i])" in src and "_g_f2h(" in src


# ---------------------------------------------------------------------------------
# emitter details and errors
# ---------------------------------------------------------------------------------


def test_promotion_rules() -> None:
    vi = Var("vi")
    k = elementwise_1d(
        "promo",
        [Buffer("A", "int32", (N,)), Buffer("F", "float32", (N,))],
        [Buffer("O1", "int32", (N,)), Buffer("O2", "float64", (N,)), Buffer("O3", "float32", (N,))],
        [
            Store("O1", (vi,), Bin("+", ld("A", vi), c(1, "int64"))),
            Store("O2", (vi,), Bin("*", ld("A", vi), c(0.5, "float64"))),
            Store("O3", (vi,), Bin("*", ld("F", vi), c(2, "int64"))),
        ],
    )
    src = nb.emit_source(k)
    assert "O1[i] = np.int32(A[i] + np.int32(1))" in src
    assert "O2[i] = np.float64(A[i]) * 0.5" in src
    assert "O3[i] = F[i] * np.float32(2.0)" in src


def test_parallel_loops_nested_or_disabled() -> None:
    vi, vj = Var("vi"), Var("vj")
    inner = [block("b", {"vi": Var("i"), "vj": Var("j")}, [Store("Y", (vi, vj), ld("X", vi, vj))])]
    body = [For("i", N, [For("j", M, inner, ForKind.PARALLEL)], ForKind.PARALLEL)]
    k = Kernel(
        "nested",
        [Buffer("X", "float32", (N, M))],
        [Buffer("Y", "float32", (N, M))],
        ["N", "M"],
        body,
    )
    src = nb.emit_source(k)
    # chunked: the outer loop is split among the chunks, the inner one is serial
    assert "for i in range(i_lo, i_hi):" in src and "for j in range(M):" in src
    assert "_g_launch(rows, argv, chunks, threads)" in src and '"parallel": False' in src
    serial = nb.emit_source(k, parallel=False)
    assert not runs_parallel(serial) and "_g_launch" not in serial
    assert "for i in range(N):" in serial and '"parallel": False' in serial


def test_names_are_sanitised() -> None:
    vi = Var("vi")
    k = Kernel(
        "fused-0.add",
        [Buffer("in", "float32", (Var("n.0"),))],
        [Buffer("np", "float32", (Var("n.0"),))],
        ["n.0"],
        [
            For(
                "range",
                Var("n.0"),
                [
                    block(
                        "b",
                        {"vi": Var("range")},
                        [Store("np", (vi,), Bin("+", ld("in", vi), c(1.0, "float32")))],
                    )
                ],
            )
        ],
    )
    src = nb.emit_source(k)
    compile(src, "<test>", "exec")
    assert "def fused_0_add(in_, np_, n_0):" in src


def test_register_indexed_by_variable_becomes_array() -> None:
    vi, vl = Var("vi"), Var("vl")
    body = [
        For(
            "i",
            N,
            [
                For(
                    "l",
                    K,
                    [
                        block(
                            "w", {"vi": Var("i"), "vl": Var("l")}, [Store("r", (vl,), ld("X", vi))]
                        )
                    ],
                ),
                block("o", {"vi": Var("i")}, [Store("Y", (vi,), ld("r", Bin("-", K, Const(1))))]),
            ],
        )
    ]
    k = Kernel(
        "regarr",
        [Buffer("X", "float32", (N,))],
        [Buffer("Y", "float32", (N,))],
        ["N", "K"],
        body,
        temps=[Buffer("r", "float32", (K,), "register")],
    )
    src = nb.emit_source(k)
    assert "r = np.empty((K,), dtype=np.float32)" in src


def test_emit_errors_name_the_kernel() -> None:
    vi = Var("vi")
    bad_op = elementwise_1d(
        "bad_op",
        [Buffer("X", "float32", (N,))],
        [Buffer("Y", "float32", (N,))],
        [Store("Y", (vi,), Un("frobnicate", ld("X", vi)))],
    )
    with pytest.raises(CodegenError, match="bad_op.*frobnicate"):
        nb.emit_source(bad_op)
    unbound = elementwise_1d(
        "unbound",
        [Buffer("X", "float32", (N,))],
        [Buffer("Y", "float32", (N,))],
        [Store("Y", (vi,), ld("X", Var("zz")))],
    )
    with pytest.raises(CodegenError, match="unbound.*'zz'"):
        nb.emit_source(unbound)
    neg_bool = elementwise_1d(
        "neg_bool",
        [Buffer("X", "bool", (N,))],
        [Buffer("Y", "bool", (N,))],
        [Store("Y", (vi,), Un("neg", ld("X", vi)))],
    )
    with pytest.raises(CodegenError, match="neg_bool"):
        nb.emit_source(neg_bool)


def test_numba_failure_reports_generated_line() -> None:
    vi = Var("vi")
    k = elementwise_1d(
        "undefined_reg",
        [Buffer("X", "float32", (N,))],
        [Buffer("Y", "float32", (N,))],
        [Store("Y", (vi,), Bin("+", ld("X", vi), ld("acc")))],
    )
    k.temps.append(Buffer("acc", "float32", (), "register"))
    with pytest.raises(CodegenError) as info:
        nb.compile_kernel(k)
    msg = str(info.value)
    assert "undefined_reg" in msg and "generated source line" in msg and "acc" in msg


def test_same_kernel_compiles_once(unrolled: nb.NumbaKernel) -> None:
    again = nb.compile_kernel(unrolled_kernel_copy(unrolled))
    assert again is unrolled


def unrolled_kernel_copy(k: nb.NumbaKernel) -> Kernel:
    vi, vj = Var("vi"), Var("vj")
    body = [
        For(
            "i",
            N,
            [
                For(
                    "j",
                    Const(4),
                    [
                        block(
                            "scale",
                            {"vi": Var("i"), "vj": Var("j")},
                            [
                                Store(
                                    "Y",
                                    (vi, vj),
                                    Bin(
                                        "*",
                                        ld("X", vi, vj),
                                        Cast("float32", Bin("+", vj, Const(1))),
                                    ),
                                )
                            ],
                        )
                    ],
                    ForKind.UNROLLED,
                )
            ],
        )
    ]
    return Kernel(
        "unrolled",
        [Buffer("X", "float32", (N, Const(4)))],
        [Buffer("Y", "float32", (N, Const(4)))],
        ["N"],
        body,
    )


def test_fastmath_flags_follow_policy() -> None:
    k = unrolled_kernel_copy(None)  # type: ignore[arg-type]
    fast = nb.emit_source(k, fastmath=True)
    for flag in nb.FASTMATH_FLAGS:
        assert repr(flag) in fast and f"'{flag}'" in ACCURACY_POLICY
    default = nb.emit_source(k)
    assert "'reassoc'" in default and "'contract'" in default and "'nnan'" not in default


def test_set_num_threads() -> None:
    before = nb.get_num_threads()
    try:
        assert nb.set_num_threads(1) == 1
        assert nb.set_num_threads(0) == numba.config.NUMBA_NUM_THREADS
        assert nb.set_num_threads(10_000) == numba.config.NUMBA_NUM_THREADS
        with pytest.raises(OptionError):
            nb.set_num_threads(-1)
    finally:
        nb.set_num_threads(before)


# ---------------------------------------------------------------------------------
# max/min reductions into a register: maxnum/minnum + integer NaN guard
# ---------------------------------------------------------------------------------

_GUARD = {"float32": ("int32", 0x7F800000), "float64": ("int64", 0x7FF0000000000000)}


def register_reduce(
    dtype: str,
    update: A.Expr | None = None,
    op: str = "max",
    extra: list | None = None,
    reg_shape: tuple[int, ...] = (),
) -> Kernel:
    """``for i: R = -inf/+inf; for k: R = update (default op(R, X[i, k])) [+ extra];
    Y[i] = R`` with a register R (0-d, or element 0 of ``reg_shape``)."""
    vi, vk = Var("vi"), Var("vk")
    ridx = tuple(Const(0) for _ in reg_shape)
    R = ld("R", *ridx)
    if update is None:
        update = Bin(op, R, ld("X", vi, vk))
    big = float("inf") if dtype.startswith("float") else 2**31 - 1
    init = c(-big if op == "max" else big, dtype)
    binds = {"vi": Var("i"), "vk": Var("k")}
    upd = block("upd", binds, [Store("R", ridx, update)], reduce=("vk",))
    body = [
        For(
            "i",
            N,
            [
                block("init", {"vi": Var("i")}, [Store("R", ridx, init)]),
                For("k", K, [upd, *(extra or [])]),
                block("out", {"vi": Var("i")}, [Store("Y", (vi,), R)]),
            ],
        )
    ]
    return Kernel(
        "regred",
        [Buffer("X", dtype, (N, K))],
        [Buffer("Y", dtype, (N,))],
        ["N", "K"],
        body,
        temps=[Buffer("R", dtype, tuple(Const(d) for d in reg_shape), "register")],
    )


def _lines(src: str) -> list[tuple[int, str]]:
    body = src.split("\ndef ", 1)[1].splitlines()
    return [(len(s) - len(s.lstrip()), s.strip()) for s in body if s.strip()]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("op", ["max", "min"])
def test_register_max_min_is_guarded(dtype: str, op: str) -> None:
    src = nb.emit_source(register_reduce(dtype, op=op))
    gty, inf_bits = _GUARD[dtype]
    fn = "_g_maxnum_nn" if op == "max" else "_g_minnum_nn"
    lines = _lines(src)
    text = [s for _, s in lines]
    at = {s: i for i, s in enumerate(text)}
    assert f"R_nan = np.{gty}(0)" in at  # the initialisation starts the guard
    assert "R_v = X[i, k]" in at
    assert f"R = {fn}(R, R_v)" in at
    assert "R_nan = _g_nanguard(R_nan, R_v)" in at
    check = at[f"if R_nan > np.{gty}({inf_bits}):"]
    assert text[check + 1] == f"R = np.{dtype}(np.nan)"
    # the check follows the k loop (same indentation), before the register is read
    (k_loop,) = [i for i, s in enumerate(text) if s.startswith("for k in range")]
    assert lines[check][0] == lines[k_loop][0] and k_loop < check < at["Y[i] = R"]
    assert at[f"R_nan = np.{gty}(0)"] < k_loop
    assert "_g_maximum" not in src and "_g_minimum" not in src


def test_register_max_update_with_register_second() -> None:
    """``R = max(X, R)`` is the same update with the operands swapped."""
    vi, vk = Var("vi"), Var("vk")
    src = nb.emit_source(register_reduce("float32", Bin("max", ld("X", vi, vk), ld("R"))))
    assert "R = _g_maxnum_nn(R, R_v)" in src and "_g_nanguard" in src


@pytest.mark.parametrize(
    "update",
    [
        # the first element initialises: the store reads R only on one branch
        lambda R, x: Select(Bin("==", Var("vk"), Const(0)), x, Bin("max", R, x)),
        lambda R, x: Bin("max", R, Bin("*", R, x)),  # the other operand reads R
        lambda R, x: Bin("+", Bin("max", R, x), c(0.0, "float32")),  # max is not the top
    ],
    ids=["select", "reads-twice", "max-inside"],
)
def test_other_register_updates_fall_back(update) -> None:
    vi, vk = Var("vi"), Var("vk")
    src = nb.emit_source(register_reduce("float32", update(ld("R"), ld("X", vi, vk))))
    assert "_g_maximum(" in src
    assert "_g_maxnum_nn" not in src and "_g_nanguard" not in src


def test_register_with_max_and_min_updates_falls_back() -> None:
    vi, vk = Var("vi"), Var("vk")
    binds = {"vi": Var("i"), "vk": Var("k")}
    also_min = block(
        "upd2", binds, [Store("R", (), Bin("min", ld("R"), ld("X", vi, vk)))], reduce=("vk",)
    )
    src = nb.emit_source(register_reduce("float32", extra=[also_min]))
    assert "_g_maximum(" in src and "_g_minimum(" in src
    assert "_nn" not in src and "_g_nanguard" not in src


def test_non_float_or_multi_element_registers_are_not_guarded() -> None:
    k = register_reduce("int32")
    src = nb.emit_source(k)
    assert "_nn" not in src and "_g_nanguard" not in src
    src = nb.emit_source(register_reduce("float32", reg_shape=(2,)))
    assert "R_0 = _g_maximum(R_0, X[i, k])" in src
    assert "_nn" not in src and "_g_nanguard" not in src
    src = nb.emit_source(register_reduce("float32", reg_shape=(1,)))  # one element: a scalar
    assert "_g_maxnum_nn" in src and "_g_nanguard" in src


@pytest.fixture(scope="module")
def select_max() -> nb.NumbaKernel:
    vi, vk = Var("vi"), Var("vk")
    x = ld("X", vi, vk)
    return nb.compile_kernel(
        register_reduce("float32", Select(Bin("==", vk, Const(0)), x, Bin("max", ld("R"), x)))
    )


@pytest.mark.parametrize("m", [1, 5, 16, 33])
def test_fallback_max_is_exact(select_max: nb.NumbaKernel, m: int) -> None:
    from test_fused_kernels import minmax_rows

    assert "_g_maximum(" in select_max.source
    x = minmax_rows(m, "float32", np.random.default_rng(m))
    (y,) = run(select_max, [x], [((len(x),), np.float32)], [len(x), m])
    exact(y, x.max(axis=1), f"m={m}")


def _tiled_max_kernel(dtype: str, op: str, factor: int, unroll: bool) -> nb.NumbaKernel:
    """``reduce_max(x, -1) * 2`` lowered, its reduce loop split into (outer, inner) under a
    parallel row loop: the register update sits in the inner loop of an outer reduce loop."""
    from lowering_check import prepare

    import geode
    from geode import ops
    from geode.codegen.lower import lower_group
    from geode.codegen.schedule import Schedule

    g = geode.Graph(f"tiled_{op}")
    x = g.input("x", ["N", "M"], dtype)
    red = ops.reduce_max if op == "max" else ops.reduce_min
    g.output(red(x, axes=[-1], keepdims=0) * 2.0, names=["y"])
    gg, plan = prepare(g)
    (group,) = plan.groups
    lk = lower_group(group, gg, f"tiled_{op}_{dtype}_{factor}_{unroll}")
    sch = Schedule(lk.kernel)
    loops = sch.align_all()
    r = f"reduce{op}"
    (sp,) = loops["mul"]
    sch.compute_at(r, sp)
    outer, inner = sch.split(f"{r}_rb", [-1, factor])
    if unroll:
        sch.unroll(inner)
    else:
        sch.vectorize(inner)
    sch.parallel(sp)
    assert sch.get_loops(r) == [sp, outer, inner]
    assert sch.kernel.buffer(f"{r}_0").scope == "register"
    return nb.compile_kernel(sch.kernel)


@pytest.mark.parametrize(
    "dtype,op,factor,unroll",
    [("float32", "max", 16, False), ("float64", "min", 4, True), ("float32", "min", 8, True)],
)
def test_tiled_reduce_loop_is_guarded_and_exact(
    dtype: str, op: str, factor: int, unroll: bool
) -> None:
    from test_fused_kernels import minmax_rows

    k = _tiled_max_kernel(dtype, op, factor, unroll)
    fn = "_g_maxnum_nn" if op == "max" else "_g_minnum_nn"
    src = k.source
    assert f"{fn}(" in src and "_g_nanguard(" in src and runs_parallel(src)
    gty, inf_bits = _GUARD[dtype]
    lines = _lines(src)
    check = [
        i for i, (_, s) in enumerate(lines) if s == f"if reduce{op}_0_nan > np.{gty}({inf_bits}):"
    ]
    outer = [i for i, (_, s) in enumerate(lines) if s.startswith(f"for reduce{op}_rb_0 in range")]
    assert len(outer) == 1 and check, src
    # one check per inner pass, inside the outer reduce loop (the guard accumulates)
    assert all(lines[i][0] > lines[outer[0]][0] for i in check)
    if unroll:
        assert src.count(f"{fn}(") == factor
    two = np.dtype(dtype).type(2)
    for m in (1, 3, factor, factor + 1, 4 * factor - 1, 100):
        x = minmax_rows(m, dtype, np.random.default_rng(m))
        (y,) = run(k, [x], [((len(x),), dtype)], [len(x), m])
        with np.errstate(invalid="ignore"):
            want = (x.max(axis=1) if op == "max" else x.min(axis=1)) * two
        exact(y, want, f"{dtype} {op} m={m}")


def test_register_read_inside_the_updating_loop_sees_nan() -> None:
    """A running max: C[i, k] = R right after R = max(R, X[i, k]) (np.maximum.accumulate)."""
    vi, vk = Var("vi"), Var("vk")
    binds = {"vi": Var("i"), "vk": Var("k")}
    k = register_reduce("float32", extra=[block("cum", binds, [Store("C", (vi, vk), ld("R"))])])
    k.outputs.append(Buffer("C", "float32", (N, K)))
    kern = nb.compile_kernel(k)
    x = np.array([[1, np.nan, 3, 2], [4, 1, 5, -np.nan]], np.float32)
    y, cum = run(kern, [x], [((2,), np.float32), ((2, 4), np.float32)], [2, 4])
    exact(y, x.max(axis=1), "Y")
    exact(cum, np.maximum.accumulate(x, axis=1), "C")


def test_straight_line_max_updates_in_the_row_loop() -> None:
    """``for i: R = -inf; R = max(R, X[i, 0]); R = max(R, X[i, 1]); R = max(R, X[i, 2]);
    Y[i] = R`` (an unrolled reduction written out): must be np.max."""
    vi = Var("vi")
    upd = [
        block(
            f"upd{j}",
            {"vi": Var("i")},
            [Store("R", (), Bin("max", ld("R"), ld("X", vi, c(j, "int64"))))],
        )
        for j in range(3)
    ]
    k = Kernel(
        "straight",
        [Buffer("X", "float32", (N, Const(3)))],
        [Buffer("Y", "float32", (N,))],
        ["N"],
        [
            For(
                "i",
                N,
                [
                    block("init", {"vi": Var("i")}, [Store("R", (), c(float("-inf"), "float32"))]),
                    *upd,
                    block("out", {"vi": Var("i")}, [Store("Y", (vi,), ld("R"))]),
                ],
            )
        ],
        temps=[Buffer("R", "float32", (), "register")],
    )
    kern = nb.compile_kernel(k)
    x = np.array([[np.nan, 1, 2], [1, np.nan, 2], [1, 2, np.nan], [1, 5, 2]], np.float32)
    (y,) = run(kern, [x], [((4,), np.float32)], [4])
    exact(y, x.max(axis=1))


def test_loop_invariant_bindings_are_hoisted_out_of_inner_loops() -> None:
    """Row indices of a pipelined row loop are computed once per row, not per element,
    and a predicated block left with no statement in place still gets a body."""
    from geode.codegen.ast import (
        Bin,
        Block,
        Const,
        For,
        If,
        IterVar,
        Kernel,
        Load,
        Store,
        Var,
    )
    from geode.codegen.ast import Buffer as Buf

    vi, vk = IterVar("vi", Var("N")), IterVar("vk", Const(8))
    row = Bin("//", Bin("*", Var("i"), Const(3)), Const(2))
    blk = Block(
        "B",
        [vi, vk],
        [row, Var("k")],
        [Store("Y", (Var("vi"), Var("vk")), Load("X", (Var("vi"), Var("vk"))))],
    )
    empty = Block("E", [vi], [Bin("*", Var("N"), Const(2))], [])
    body = [
        For("i", Var("N"), [For("k", Const(8), [blk, If(Bin("<", Var("k"), Const(3)), [empty])])])
    ]
    k = Kernel(
        "hoist",
        [Buf("X", "float32", (Bin("*", Var("N"), Const(2)), Const(8)))],
        [Buf("Y", "float32", (Bin("*", Var("N"), Const(2)), Const(8)))],
        ["N"],
        body,
    )
    src = nb.emit_source(k)
    lines = src.splitlines()
    inner = next(i for i, ln in enumerate(lines) if "in range(8)" in ln)
    hoisted = [ln for ln in lines[:inner] if "_g_fdiv(" in ln or "//" in ln]
    assert hoisted, src
    assert not any("_g_fdiv(" in ln or " // " in ln for ln in lines[inner:]), src
    compile(src, "hoist", "exec")  # the `if` whose block moved out keeps a body
    fn = nb.compile_kernel(k)
    x = np.arange(6 * 8, dtype=np.float32).reshape(6, 8)
    y = np.zeros_like(x)
    fn(x, y, 3)
    want = np.zeros_like(x)
    for i in range(3):
        want[i * 3 // 2] = x[i * 3 // 2]
    np.testing.assert_array_equal(y, want)


def _one_plus_tanh_kernel(dtype: str, expr_of) -> A.Kernel:
    n, vi = A.Var("N"), A.Var("vi")
    x = A.Load("X", (vi,))
    blk = A.Block("B", [A.IterVar("vi", n)], [A.Var("i")], [A.Store("Y", (vi,), expr_of(x))])
    return A.Kernel(
        f"opt_{dtype}",
        [A.Buffer("X", dtype, (n,))],
        [A.Buffer("Y", "float64" if dtype == "float16" else dtype, (n,))],
        ["N"],
        [A.For("i", n, [blk], A.ForKind.VECTORIZED)],
    )


@pytest.mark.parametrize(
    "form",
    [
        lambda x: A.Bin("+", A.Const(1.0, "float64"), A.Un("tanh", x)),
        lambda x: A.Bin("+", A.Un("tanh", x), A.Const(1, "int64")),
        lambda x: A.Bin("+", A.Un("tanh", x), A.Const(1.0, "float32")),
    ],
    ids=["1+tanh", "tanh+1", "tanh+1f"],
)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_one_plus_tanh_is_fused_and_keeps_the_digits(form, dtype: str) -> None:
    """``1 + tanh(x)`` compiles to ``one_plus_tanh`` (2 / (1 + exp(-2x))): where adding 1
    to tanh cancels (x < 0) it keeps the digits; elsewhere it matches numpy closely."""
    k = _one_plus_tanh_kernel(dtype, form)
    src = nb.emit_source(k)
    assert f"one_plus_tanh_{'f32' if dtype == 'float32' else 'f64'}(" in src
    assert "tanh_f" not in src.replace("one_plus_tanh_f", "")
    x = np.concatenate([np.linspace(-30, 30, 6001), [np.nan, np.inf, -np.inf]]).astype(dtype)
    y = np.empty_like(x)
    nb.compile_kernel(k)(x, y, x.size)
    wide = np.float64 if dtype == "float32" else np.longdouble
    with np.errstate(over="ignore"):
        exact = (2 / (1 + np.exp(-2 * x.astype(wide)))).astype(dtype)
    np.testing.assert_allclose(y[:-3], exact[:-3], rtol=4 * np.finfo(dtype).eps, atol=0)
    with np.errstate(invalid="ignore"):
        np.testing.assert_allclose(y, 1 + np.tanh(x), rtol=1e-6, atol=1e-6)
    assert np.isnan(y[-3]) and y[-2] == 2 and y[-1] == 0


@pytest.mark.parametrize(
    "dtype,form",
    [
        ("float32", lambda x: A.Bin("+", A.Const(2.0, "float64"), A.Un("tanh", x))),
        ("float32", lambda x: A.Bin("-", A.Const(1.0, "float64"), A.Un("tanh", x))),
        ("float32", lambda x: A.Bin("+", A.Load("X", x.indices), A.Un("tanh", x))),
        ("float16", lambda x: A.Bin("+", A.Const(1.0, "float64"), A.Un("tanh", x))),
    ],
    ids=["2+tanh", "1-tanh", "x+tanh", "float16"],
)
def test_one_plus_tanh_only_for_exactly_that_sum(dtype: str, form) -> None:
    k = _one_plus_tanh_kernel(dtype, form)
    if dtype == "float16":
        k.outputs[0].dtype = "float16"
    src = nb.emit_source(k)
    assert "one_plus_tanh" not in src
    x = np.linspace(-3, 3, 61).astype(dtype)
    y = np.empty_like(x)
    nb.compile_kernel(k)(x, y, x.size)
    from geode.codegen.ast_eval import run_kernel

    want = run_kernel(k, {"X": x}, {"N": x.size})["Y"]
    np.testing.assert_allclose(y, want, rtol=2e-3 if dtype == "float16" else 1e-6, atol=1e-6)


def _gate_kernel(dtype: str, expr_of, ints: bool = False) -> A.Kernel:
    """``Y = expr_of(X, W)`` over float arrays X, W (and an int32 array I when ``ints``)."""
    n, vi = A.Var("N"), A.Var("vi")
    x, w = A.Load("X", (vi,)), A.Load("W", (vi,))
    blk = A.Block("B", [A.IterVar("vi", n)], [A.Var("i")], [A.Store("Y", (vi,), expr_of(x, w))])
    ins = [A.Buffer("X", dtype, (n,)), A.Buffer("W", dtype, (n,))]
    return A.Kernel(
        f"gate_{dtype}",
        ins + ([A.Buffer("I", "int32", (n,))] if ints else []),
        [A.Buffer("Y", dtype, (n,))],
        ["N"],
        [A.For("i", n, [blk], A.ForKind.VECTORIZED)],
    )


def _half(v: float = 0.5) -> A.Const:
    return A.Const(v, "float64")


def _opt(z: A.Expr, first: bool = True) -> A.Bin:
    one, t = A.Const(1.0, "float64"), A.Un("tanh", z)
    return A.Bin("+", one, t) if first else A.Bin("+", t, one)


def _mul(*fs: A.Expr) -> A.Expr:
    out = fs[0]
    for f in fs[1:]:
        out = A.Bin("*", out, f)
    return out


def _gelu_z(x: A.Expr) -> A.Expr:
    cube = _mul(A.Const(0.044715, "float64"), x, x, x)
    return A.Bin("*", A.Const(0.7978845608028654, "float64"), A.Bin("+", x, cube))


def _gelu_z_np(x: np.ndarray) -> np.ndarray:
    return 0.7978845608028654 * (x + 0.044715 * x * x * x)


@pytest.mark.parametrize(
    "form,parts,cubic",
    [
        # 0.5 * x * (1 + tanh(z))
        (lambda x, w: _mul(_half(), x, _opt(_gelu_z(x))), lambda x, w: (x, _gelu_z_np(x)), True),
        # x * 0.5 * (tanh(z) + 1)
        (
            lambda x, w: _mul(x, _half(), _opt(_gelu_z(x), False)),
            lambda x, w: (x, _gelu_z_np(x)),
            True,
        ),
        # 0.5 * (x * (1 + tanh(w)))
        (lambda x, w: A.Bin("*", _half(), A.Bin("*", x, _opt(w))), lambda x, w: (x, w), False),
        # (1 + tanh(w)) * x * 0.5f
        (lambda x, w: _mul(_opt(w), x, A.Const(0.5, "float32")), lambda x, w: (x, w), False),
        # 0.5 * x * w * (1 + tanh(w))
        (lambda x, w: _mul(_half(), x, w, _opt(w)), lambda x, w: (x * w, w), False),
    ],
    ids=["gelu", "x*half*gate", "nested", "gate-first", "two-factors"],
)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_tanh_gate_is_fused_in_any_grouping(form, parts, cubic: bool, dtype: str) -> None:
    """``0.5 * a * (1 + tanh(z))`` (the tanh GELU) compiles to one ``div_one_plus_exp(a,
    -2z)`` call (``a / (1 + exp(-2z))``) whatever the order and grouping of the product;
    the GELU's cubic ``z`` is folded into ``h * (-2c + (-2ck) * (h * h))``. Results are
    within a few ulp of the exact value (computed in a wider type from ``a`` and ``z``
    rounded to the dtype), allowing for the rounding of ``z``, which the result's
    relative error amplifies by up to ``2|z|``, and for the flush to zero where
    ``exp(-2z)`` overflows; the plain formula, which cancels where ``1 + tanh(z)`` is
    tiny, is not the reference."""
    k = _gate_kernel(dtype, form)
    src = nb.emit_source(k)
    sfx = "f32" if dtype == "float32" else "f64"
    assert f"div_one_plus_exp_{sfx}(" in src, src
    assert "one_plus_tanh" not in src and "tanh_f" not in src
    # the cubic's constants are folded: -2c (-1.5957692) and -2ck, no 0.044715 left
    assert "0.044715" not in src and ("-1.59576" in src) == cubic, src
    rng = np.random.default_rng(5)
    x = np.concatenate([rng.standard_normal(4000) * 6, [0.0, -0.0, 40.0, -40.0]]).astype(dtype)
    w = np.concatenate([rng.standard_normal(4000) * 6, [1.0, -2.0, -30.0, 60.0]]).astype(dtype)
    y = np.empty_like(x)
    nb.compile_kernel(k)(x, w, y, x.size)
    a, z = (v.astype(dtype) for v in parts(x, w))
    wide = np.float64 if dtype == "float32" else np.longdouble
    with np.errstate(over="ignore"):
        exact = a.astype(wide) / (1 + np.exp(-2 * z.astype(wide)))
    eps = np.finfo(dtype).eps
    tol = 8 * eps * (1 + 2 * np.abs(z.astype(wide))) * np.abs(exact) + np.finfo(dtype).tiny
    # flushed where exp(-2z) overflows (see vmath.div_one_plus_exp_f32): a zero of a's sign
    flush = 2.0 ** (-127.4 if dtype == "float32" else -1023.4)
    flushed = (y == 0) & (np.abs(exact) <= np.abs(a).astype(wide) * flush)
    bad = (np.abs(y - exact) > tol) & ~flushed
    assert not bad.any(), (x[bad][:5], y[bad][:5], exact[bad][:5])
    assert np.array_equal(np.signbit(y), np.signbit(a))


@pytest.mark.parametrize(
    "dtype,form,fused",
    [
        ("float32", lambda x, w: _mul(_half(0.25), x, _opt(w)), "one_plus_tanh"),
        ("float32", lambda x, w: _mul(x, _opt(w)), "one_plus_tanh"),
        ("float32", lambda x, w: _mul(_half(), _opt(w)), "one_plus_tanh"),
        ("float32", lambda x, w: _mul(_half(), x, A.Bin("-", _half(1.0), A.Un("tanh", w))), None),
        ("float32", lambda x, w: _mul(_half(), A.Load("I", x.indices), _opt(w)), "one_plus_tanh"),
        ("float16", lambda x, w: _mul(_half(), x, _opt(w)), None),
    ],
    ids=["quarter", "no-half", "half-only", "1-tanh", "int-factor", "float16"],
)
def test_tanh_gate_only_for_that_product(dtype: str, form, fused: str | None) -> None:
    """Other products are left to the plain code (and ``one_plus_tanh`` where it applies):
    a constant other than 0.5, no 0.5, nothing else to multiply, ``1 - tanh``, a factor of
    another dtype, float16; each matches the reference evaluator."""
    k = _gate_kernel(dtype, form, ints=True)
    src = nb.emit_source(k)
    assert "div_one_plus_exp" not in src
    if fused:
        assert fused in src
    rng = np.random.default_rng(6)
    feeds = {
        "X": rng.standard_normal(64).astype(dtype),
        "W": rng.standard_normal(64).astype(dtype),
        "I": rng.integers(-5, 5, 64).astype(np.int32),
    }
    y = np.empty(64, dtype)
    nb.compile_kernel(k)(*feeds.values(), y, 64)
    from geode.codegen.ast_eval import run_kernel

    want = run_kernel(k, feeds, {"N": 64})["Y"]
    np.testing.assert_allclose(y, want, rtol=2e-3 if dtype == "float16" else 1e-6, atol=1e-6)


def test_dims_only_terms_are_computed_once_at_the_top() -> None:
    """A pipelined row kernel's chunk size max(1, min(64, N // 8)) is computed once at the
    top of the kernel and its uses refer to it; row indices are hoisted out of the passes."""
    import geode
    from geode import examples

    ex = examples.rmsnorm(hidden=1024)
    model = geode.compile(
        ex.graph, streaming="off", backend="numba"
    )  # streamed rows are not pipelined
    (k,) = [k for k in model.kernels if k.engine == "aicore"]
    src = k.source
    assert src.count("N // 8") == 1 and src.count("min(64, ") == 1, src
    lines = src.splitlines()
    top = next(i for i, ln in enumerate(lines) if "min(64, " in ln)
    first_loop = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("for "))
    assert top < first_loop and lines[top].startswith("    ") and not lines[top].startswith("     ")
    rng = np.random.default_rng(2)
    for n in (1, 9, 130):
        feeds = ex.make_inputs(rng, n)
        np.testing.assert_allclose(
            model(**feeds)["y"], ex.numpy(**feeds)["y"], rtol=1e-5, atol=1e-6
        )


# ---------------------------------------------------------------------------------
# streaming stores
# ---------------------------------------------------------------------------------


@numba.njit
def _stream_copy(dst, doff, src, soff, n, nt):
    nb._g_stream(dst, doff, src, soff, n, nt)
    nb._g_sfence()


@pytest.mark.parametrize("nt", [True, False])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64", "uint8", "bool"])
def test_g_stream_copies_any_range(dtype: str, nt: bool) -> None:
    """Every offset (aligned or not to the vector size) and length (shorter than a vector,
    several vectors plus a tail, zero) copies exactly the range and nothing else."""
    rng = np.random.default_rng(5)
    src = (rng.standard_normal(300) * 100).astype(dtype)
    for doff in (0, 1, 3, 15, 16, 17, 31):
        for soff in (0, 5):
            for n in (0, 1, 7, 16, 33, 64, 100, 250):
                dst = np.zeros(300, dtype)
                sentinel = np.ones(300, dtype)
                dst[:] = sentinel
                _stream_copy(dst, doff, src, soff, n, nt)
                want = sentinel.copy()
                want[doff : doff + n] = src[soff : soff + n]
                np.testing.assert_array_equal(dst, want, err_msg=f"{doff=} {soff=} {n=}")


@numba.njit
def _stream_scaled(dst, doff, src, soff, n, nt, factor):
    nb._g_stream_scaled(dst, doff, src, soff, n, nt, factor)
    nb._g_sfence()


@pytest.mark.parametrize("nt", [True, False])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_g_stream_scaled_writes_the_products_of_any_range(dtype: str, nt: bool) -> None:
    """Every offset and length writes exactly ``src[soff:soff+n] * factor`` (one rounding,
    as numpy's product) into ``dst[doff:doff+n]`` and nothing else; NaN and inf factors
    propagate as products do."""
    rng = np.random.default_rng(9)
    src = (rng.standard_normal(300) * 100).astype(dtype)
    factor = np.dtype(dtype).type(0.3)
    for doff in (0, 1, 3, 15, 16, 17, 31):
        for soff in (0, 5):
            for n in (0, 1, 7, 16, 33, 64, 100, 250):
                dst = np.ones(300, dtype)
                _stream_scaled(dst, doff, src, soff, n, nt, factor)
                want = np.ones(300, dtype)
                want[doff : doff + n] = src[soff : soff + n] * factor
                np.testing.assert_array_equal(dst, want, err_msg=f"{doff=} {soff=} {n=}")
    for special in (np.nan, np.inf, 0.0):
        dst = np.ones(40, dtype)
        _stream_scaled(dst, 0, src, 0, 40, nt, np.dtype(dtype).type(special))
        with np.errstate(invalid="ignore"):
            np.testing.assert_array_equal(dst, src[:40] * np.dtype(dtype).type(special))


@numba.njit
def _stream_divided(dst, doff, src, soff, n, nt, divisor):
    nb._g_stream_divided(dst, doff, src, soff, n, nt, divisor)
    nb._g_sfence()


@pytest.mark.parametrize("nt", [True, False])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_g_stream_divided_writes_the_quotients_of_any_range(dtype: str, nt: bool) -> None:
    """Every offset and length writes exactly numpy's ``src[soff:soff+n] / divisor`` into
    ``dst[doff:doff+n]`` and nothing else, for a subnormal divisor (whose reciprocal is
    inf) too, and for zero, NaN and inf."""
    rng = np.random.default_rng(9)
    src = (rng.standard_normal(300) * 1e-30).astype(dtype)
    src[::7] = 0.0
    for divisor in (0.3, 3 * np.finfo(dtype).smallest_subnormal):
        div = np.dtype(dtype).type(divisor)
        for doff in (0, 1, 15, 16, 17):
            for soff in (0, 5):
                for n in (0, 1, 7, 33, 250):
                    dst = np.ones(300, dtype)
                    _stream_divided(dst, doff, src, soff, n, nt, div)
                    want = np.ones(300, dtype)
                    want[doff : doff + n] = src[soff : soff + n] / div
                    np.testing.assert_array_equal(dst, want, err_msg=f"{divisor=} {doff=} {n=}")
    for special in (np.nan, np.inf, 0.0):
        dst = np.ones(40, dtype)
        _stream_divided(dst, 0, src, 0, 40, nt, np.dtype(dtype).type(special))
        with np.errstate(all="ignore"):
            np.testing.assert_array_equal(dst, src[:40] / np.dtype(dtype).type(special))


def test_g_stream_scaled_uses_non_temporal_stores() -> None:
    from geode.codegen.backends.target import is_x86, stream_vector_bytes

    if not is_x86():
        pytest.skip("non-temporal vector stores are checked on x86 only")
    x = np.ones(64, np.float32)
    _stream_scaled(x, 0, x.copy(), 0, 64, True, np.float32(2))
    asm = _stream_scaled.inspect_asm(_stream_scaled.signatures[0])
    reg = {64: "zmm", 32: "ymm", 16: "xmm"}[stream_vector_bytes()]
    assert re.search(rf"vmovnt\w+\s+%{reg}", asm), "no non-temporal vector store"
    assert re.search(rf"vmulps\s+[^\n]*%{reg}", asm), "no vector multiply"


def _stage_loop(value_of) -> tuple[A.For, A.StreamStore]:
    """``for j: stage[vj] = value_of(vj)`` (vj bound to j) and a stream from ``stage``."""
    vj = A.Var("vj")
    blk = A.Block(
        "s", [IterVar("vj", A.Const(128))], [A.Var("j")], [A.Store("T", (vj,), value_of(vj))]
    )
    loop = A.For("j", A.Const(128), [blk], A.ForKind.VECTORIZED)
    ss = A.StreamStore("Y", A.Var("o"), "T", A.Const(0), A.Const(128), A.Const(True, "bool"))
    return loop, ss


@pytest.mark.parametrize(
    "value_of,want",
    [
        (lambda vj: A.Bin("*", A.Load("B", (A.Var("r"), vj)), A.Var("s")), ("B", False)),
        (
            lambda vj: A.Bin(
                "*", A.Var("s"), A.Load("B", (A.Var("r"), A.Bin("+", vj, A.Var("c"))))
            ),
            ("B", False),
        ),
        (
            lambda vj: A.Bin("/", A.Load("B", (A.Bin("+", A.Var("c"), vj),)), A.Load("R", ())),
            ("B", True),
        ),
        (lambda vj: A.Bin("/", A.Var("s"), A.Load("B", (vj,))), None),  # s / buf
        (
            lambda vj: A.Bin("*", A.Load("B", (A.Bin("*", vj, A.Const(2)),)), A.Var("s")),
            None,
        ),  # stride 2
        (lambda vj: A.Bin("*", A.Load("B", (vj, A.Const(0))), A.Var("s")), None),  # j not last
        (lambda vj: A.Bin("*", A.Load("B", (vj,)), A.Load("S", (vj,))), None),  # s varies with j
        (lambda vj: A.Bin("+", A.Load("B", (vj,)), A.Var("s")), None),  # not a product
    ],
    ids=["buf*s", "s*buf", "buf/s", "s/buf", "stride2", "j-outer", "s-varies", "sum"],
)
def test_scaled_stage_recognises_unit_stride_products_only(value_of, want) -> None:
    from geode.codegen.backends.patterns import scaled_stage

    """The emitter streams a stage straight from ``buf`` only when the staged value is a
    unit-stride load of it times (or over) something fixed for the chunk."""
    loop, ss = _stage_loop(value_of)
    got = scaled_stage(loop, ss)
    if want is None:
        assert got is None
    else:
        assert got is not None and (got[0].buffer, got[2]) == want
    other = A.StreamStore("Y", A.Var("o"), "U", A.Const(0), A.Const(128), A.Const(True, "bool"))
    assert scaled_stage(loop, other) is None  # a stream of another stage


def test_g_stream_writes_2d_outputs_through_flat_offsets() -> None:
    src = np.arange(12, dtype=np.float32)
    dst = np.zeros((3, 8), np.float32)
    _stream_copy(dst, 10, src, 2, 9, True)
    np.testing.assert_array_equal(dst.reshape(-1)[10:19], src[2:11])
    assert dst.reshape(-1)[:10].sum() == 0 and dst.reshape(-1)[19:].sum() == 0


def test_g_stream_uses_non_temporal_stores_and_sfence() -> None:
    from geode.codegen.backends.target import is_x86, stream_vector_bytes

    if not is_x86():
        pytest.skip("non-temporal vector stores are checked on x86 only")
    asm = _stream_copy.inspect_asm(_stream_copy.signatures[0])
    reg = {64: "zmm", 32: "ymm", 16: "xmm"}[stream_vector_bytes()]
    assert re.search(rf"vmovnt\w+\s+%{reg}", asm) or re.search(rf"movnt\w+\s+%{reg}", asm), (
        "no non-temporal vector store"
    )
    assert "sfence" in asm


def test_g_stream_plain_copy_fetches_the_next_chunk_for_writing() -> None:
    """Without streaming stores the copy prefetches the lines of the next chunk for
    writing (``prefetchw`` where the target has it), so a chunk's stores into lines not
    yet in the cache do not stall the next chunk's arithmetic behind the fetches."""
    from geode.codegen.backends.target import codegen_fingerprint, is_x86

    feats = codegen_fingerprint()["cpu_features"].split(",")
    if not is_x86() or "+prfchw" not in feats:
        pytest.skip("write prefetches are checked on x86 with PRFCHW only")
    _stream_copy(np.zeros(40, np.float32), 0, np.ones(40, np.float32), 0, 33, False)
    asm = _stream_copy.inspect_asm(_stream_copy.signatures[0])
    assert re.search(r"prefetchw\s", asm), "no write prefetch in the plain copy"


def _exp_plus_one(n: str | int, m: str | int, name: str, dtype: str = "float32") -> A.Kernel:
    """``Y = exp(X) + 1`` over ``[n, m]`` (block ``e`` in loops ``i``, ``j``)."""
    dims = [d for d in (n, m) if isinstance(d, str)]
    ext = [A.Const(d) if isinstance(d, int) else A.Var(d) for d in (n, m)]
    ivs = [IterVar("vi", ext[0]), IterVar("vj", ext[1])]
    v = (A.Var("vi"), A.Var("vj"))
    val = A.Bin("+", A.Un("exp", A.Load("X", v)), A.Const(1.0, dtype))
    blk = A.Block("e", ivs, [A.Var("i"), A.Var("j")], [A.Store("Y", v, val)])
    return A.Kernel(
        name,
        [A.Buffer("X", dtype, tuple(ext))],
        [A.Buffer("Y", dtype, tuple(ext))],
        dims,
        [A.For("i", ext[0], [A.For("j", ext[1], [blk])])],
    )


def _streamed_eltwise(
    n: str | int, m: str | int, chunk: int, min_bytes: int = 0, interleave: int = 1
):
    from geode.codegen.schedule import Schedule

    sch = Schedule(_exp_plus_one(n, m, "streamed"))
    sch.parallel("i")
    sch.vectorize("j")
    _, inner = sch.stream_output("e", chunk, min_bytes)
    sch.interleave(inner, interleave)
    return sch.kernel


@pytest.mark.parametrize("chunk", [1, 16, 48, 512])
@pytest.mark.parametrize("min_bytes", [0, 1 << 40])
def test_streamed_kernel_matches_numpy(chunk: int, min_bytes: int) -> None:
    """A streamed elementwise kernel (non-temporal at every size, or never) equals numpy for
    rows that the chunk divides or not, zero rows, and outputs that start off a vector
    boundary."""
    native = nb.compile_kernel(_streamed_eltwise("N", "M", chunk, min_bytes))
    rng = np.random.default_rng(0)
    for n, m in [(0, 5), (1, 1), (3, 47), (5, 48), (2, 1000), (7, 4096)]:
        x = rng.standard_normal((n, m)).astype(np.float32)
        want = np.exp(x.astype(np.float64)).astype(np.float32) + np.float32(1)
        for shift in (0, 1, 3):
            raw = np.full(n * m + 8, np.nan, np.float32)
            y = raw[shift : shift + n * m].reshape(n, m)
            native(x, y, n, m)
            assert_close(y, want, "float32")
            assert np.isnan(raw[:shift]).all() and np.isnan(raw[shift + n * m :]).all()
    src = native.source
    assert "_g_stream(" in src and "_g_sfence()" in src
    (call,) = [ln for ln in src.splitlines() if "_g_stream(" in ln]
    if chunk * 4 % 64:  # chunks under a cache line never store non-temporally
        assert call.endswith(", False)")
    else:  # the size test (unless it always holds) and the line test of the row
        assert (f"N * M * 4 >= {min_bytes}" in call) == (min_bytes > 0)
        assert call.endswith(" == 0))") or call.endswith(" == 0)")


@pytest.mark.parametrize("chunk", [48, 128])
def test_interleaved_streamed_kernel_matches_numpy(chunk: int) -> None:
    """An interleaved streamed loop states its factor in the source (so the cache keys on
    it), forces LLVM's interleave count only while it compiles, and equals numpy."""
    calls: list[str] = []
    real = llvm.set_option

    def record(name: str, option: str) -> None:
        calls.append(option)
        real(name, option)

    with mock.patch.object(llvm, "set_option", record):
        native = nb.compile_kernel(_streamed_eltwise("N", "M", chunk, 0, interleave=4))
    assert "INTERLEAVE = 4" in native.source
    assert calls == ["-force-vector-interleave=4", "-force-vector-interleave=0"]
    plain = nb.compile_kernel(_streamed_eltwise("N", "M", chunk, 0))
    assert "INTERLEAVE" not in plain.source
    rng = np.random.default_rng(2)
    for n, m in [(1, 1), (3, 47), (5, 128), (7, 4096), (2, 1000)]:
        x = rng.standard_normal((n, m)).astype(np.float32)
        y = np.empty_like(x)
        native(x, y, n, m)
        assert_close(y, np.exp(x.astype(np.float64)).astype(np.float32) + 1, "float32")


def test_compile_settings_interleave_reach_llvm() -> None:
    """LLVM honours the interleave count set while geode compiles, and it is reset after:
    a division loop has as many vector divisions as the count."""
    from geode.codegen.backends.target import is_x86, stream_vector_bytes

    if not is_x86():
        pytest.skip("counted in x86 assembly")
    reg = {64: "zmm", 32: "ymm", 16: "xmm"}[stream_vector_bytes()]

    def divisions(interleave: int) -> int:
        @numba.njit(error_model="numpy")
        def f(x, y):
            for i in range(x.shape[0]):
                y[i] = x[i] / (x[i] + np.float32(1.0))

        with nb_kernel._numba_compile_settings(interleave):
            f.compile((numba.float32[::1], numba.float32[::1]))
        return len(re.findall(rf"vdivps\s+%{reg}", f.inspect_asm(f.signatures[0])))

    assert divisions(8) == 8
    assert divisions(2) == 2
    divisions(8)
    # no factor leaves the option alone: back to LLVM's choice after the compile above
    assert divisions(1) < 8


def test_streamed_static_kernel_streams_unconditionally() -> None:
    native = nb.compile_kernel(_streamed_eltwise(6, 64, 32))
    assert ", True)" in native.source  # the static output is big enough: no run-time test
    x = np.random.default_rng(1).standard_normal((6, 64)).astype(np.float32)
    y = np.empty_like(x)
    native(x, y)
    assert_close(y, np.exp(x.astype(np.float64)).astype(np.float32) + 1, "float32")


def _nt_eltwise(
    n: str | int,
    m: str | int,
    min_bytes: int = 0,
    split: int | None = None,
    parallel: bool = True,
    after=None,
    dtype: str = "float32",
):
    """``Y = exp(X) + 1`` with ``Y``'s store marked non-temporal (``store_nontemporal``) in
    its vectorized row loop (or, with ``split``, in the inner loop of the row cut in runs
    of ``split``); ``after`` may change the schedule afterwards."""
    from geode.codegen.schedule import Schedule

    sch = Schedule(_exp_plus_one(n, m, "nt", dtype))
    if parallel:
        sch.parallel("i")
    loop = "j"
    if split is not None:
        _, loop = sch.split("j", [None, split])
    sch.vectorize(loop)
    sch.store_nontemporal("e", min_bytes)
    if after is not None:
        after(sch)
    return sch.kernel


def _run_nt(
    native, n: int, m: int, dims: tuple[int, ...] | None = None, dtype: str = "float32"
) -> None:
    """Run ``native`` (a ``_nt_eltwise`` kernel; ``dims``: its dim arguments, default
    ``(n, m)``) on outputs starting 0, 1 and 3 elements past a 64-byte boundary: numpy's
    values, and nothing written outside the output."""
    dt = np.dtype(dtype)
    x = np.random.default_rng(n * 7 + m).standard_normal((n, m)).astype(dt)
    want = (np.exp(x.astype(np.longdouble)) + 1).astype(dt)
    for shift in (0, 1, 3):
        raw = np.full(n * m + 16, np.nan, dt)
        start = (-raw.ctypes.data % 64) // dt.itemsize + shift
        y = raw[start : start + n * m].reshape(n, m)
        native(x, y, *((n, m) if dims is None else dims))
        assert_close(y, want, dtype)
        assert np.isnan(raw[:start]).all() and np.isnan(raw[start + n * m :]).all()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("min_bytes", [0, 1 << 40])
def test_nontemporal_store_kernel_matches_numpy(min_bytes: int, dtype: str) -> None:
    """Through the streaming body (aligned outputs of whole-line rows, big enough) and the
    plain one (misaligned outputs, rows off the lines, too small): the same values."""
    native = nb.compile_kernel(_nt_eltwise("N", "M", min_bytes, dtype=dtype))
    for n, m in [(0, 16), (1, 1), (3, 47), (5, 48), (2, 1000), (7, 4096), (3, 4112)]:
        _run_nt(native, n, m, dtype=dtype)
    src = native.source
    head, _, nt_body = src.partition("def nt_body_nt(")
    plain_body = head.partition("def nt_body(")[2]
    dispatch = [ln.strip() for ln in head.splitlines() if "_g_vector_start(" in ln]
    item = np.dtype(dtype).itemsize
    size = "" if min_bytes == 0 else f"N * M * {item} >= {min_bytes} and "
    assert dispatch == [f"if {size}{item} * M % 64 == 0 and _g_vector_start(Y, 0):"]
    assert "_g_ntstore(Y, " in nt_body and "_g_sfence()" in nt_body
    assert "_g_ntstore" not in plain_body and "_g_sfence" not in plain_body
    assert "Y[" in plain_body and "Y[" not in nt_body


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_nontemporal_store_kernel_stores_whole_aligned_vectors(dtype: str) -> None:
    from geode.codegen.backends.target import is_x86, stream_vector_bytes

    if not is_x86():
        pytest.skip("non-temporal vector stores are checked on x86 only")
    reg = {64: "zmm", 32: "ymm", 16: "xmm"}[stream_vector_bytes()]
    store = rf"vmovnt(?:p{'s' if dtype == 'float32' else 'd'}|dq)\s+%{reg}\d+, "
    native = nb.compile_kernel(_nt_eltwise("N", 4096, dtype=dtype))
    assert re.search(store, native.asm), "no non-temporal vector store"
    assert "sfence" in native.asm
    split = nb.compile_kernel(_nt_eltwise("N", 256, split=64, dtype=dtype))
    assert re.search(store, split.asm), "no non-temporal vector store"
    _run_nt(split, 9, 256, (9,), dtype)


@pytest.mark.parametrize(
    "what",
    ["serial kernel", "runs off the lines", "predicated", "flag false"],
)
def test_nontemporal_stores_print_plain_where_they_cannot_stream(what: str) -> None:
    """A kernel without a chunked parallel loop, a store whose runs no longer start a line
    (the loop split again after marking it), a predicated block, a flag that never
    holds: ordinary stores only, and the right values."""
    from geode.codegen.ast import Const

    def unflag(sch) -> None:
        (st,) = [x for x in A.walk_stmts(sch.kernel.body) if isinstance(x, A.Store)]
        st.nontemporal = Const(False, "bool")

    def resplit(inner: int):
        def apply(sch) -> None:  # the store's loop cut again, its inner part vectorized
            sch.vectorize(sch.split(sch.get_loops("e")[-1], [None, inner])[-1])

        return apply

    kernel, m = {
        "serial kernel": (lambda: _nt_eltwise("N", 128, parallel=False), 128),
        "runs off the lines": (lambda: _nt_eltwise("N", 128, split=64, after=resplit(8)), 128),
        "predicated": (lambda: _nt_eltwise("N", 64, after=resplit(48)), 64),
        "flag false": (lambda: _nt_eltwise("N", 128, after=unflag), 128),
    }[what]
    native = nb.compile_kernel(kernel())
    assert "_g_ntstore" not in native.source and "_body_nt" not in native.source
    for n in (1, 3, 8):
        _run_nt(native, n, m, (n,))


@pytest.fixture
def fresh_memo():
    """An empty kernel memo, so the test's kernel is compiled afresh (its chunk functions
    in the state compile_kernel leaves them)."""
    nb_kernel._memo.clear()
    yield
    nb_kernel._memo.clear()


def _aligned_and_not(n: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Two float32 [n, m] outputs: one starting on a 64-byte boundary, one 4 bytes past."""
    raw = np.zeros(2 * n * m + 64, np.float32)
    start = (-raw.ctypes.data % 64) // 4
    aligned = raw[start : start + n * m].reshape(n, m)
    off = raw[start + n * m + 17 : start + 2 * n * m + 17].reshape(n, m)
    return aligned, off


def test_plain_chunk_function_is_compiled_on_first_need(fresh_memo) -> None:
    """A kernel with a streaming body compiles only its streaming chunk function (what
    geode's large, aligned outputs run); the plain one is compiled by the first call
    whose output is misaligned, once, and serves every later such call."""
    native = nb.compile_kernel(_nt_eltwise("N", "M"))
    plain, nt = native._chunk_fns
    assert plain.endswith("_rows") and nt.endswith("_rows_nt")
    assert native._chunk_fns == {plain: None, nt: native.rows}
    assert native.launch_args[:2] == (0, native.rows.address)
    seconds = native.compile_seconds
    x = np.random.default_rng(3).standard_normal((5, 256)).astype(np.float32)
    want = (np.exp(x.astype(np.float64)) + 1).astype(np.float32)
    aligned, off = _aligned_and_not(5, 256)
    native(x, aligned, 5, 256)
    assert_close(aligned, want, "float32")
    assert native._chunk_fns[plain] is None  # the streaming body ran
    native(x, off, 5, 256)
    assert_close(off, want, "float32")
    compiled = native._chunk_fns[plain]
    assert compiled is not None and native.launch_args[:2] == (
        compiled.address,
        native.rows.address,
    )
    assert native.compile_seconds > seconds
    off[:] = 0
    native(x, off, 5, 256)
    assert native._chunk_fns[plain] is compiled
    assert_close(off, want, "float32")


def test_plain_chunk_function_compiles_once_for_concurrent_callers(fresh_memo) -> None:
    """Callers that all find the plain chunk function missing at once wait for one
    compile (its compiler made slow, so all of them ask while it runs)."""
    import threading
    import time

    if numba.threading_layer() == "workqueue":  # pragma: no cover - not geode's layer
        pytest.skip("numba's workqueue layer aborts on concurrent parallel launches")
    native = nb.compile_kernel(_nt_eltwise("N", "M"))
    calls = []
    real = native._compile_rows

    def slow(name: str):
        calls.append(name)
        time.sleep(0.3)
        return real(name)

    native._compile_rows = slow
    x = np.random.default_rng(4).standard_normal((4, 64)).astype(np.float32)
    outs = [_aligned_and_not(4, 64)[1] for _ in range(4)]
    start = threading.Barrier(len(outs))

    def call(y: np.ndarray) -> None:
        start.wait()
        native(x, y, 4, 64)

    threads = [threading.Thread(target=call, args=(y,)) for y in outs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [next(iter(native._chunk_fns))]
    want = (np.exp(x.astype(np.float64)) + 1).astype(np.float32)
    for y in outs:
        assert_close(y, want, "float32")


def test_compile_chunk_functions_compiles_ahead_of_the_first_call(fresh_memo) -> None:
    """The warm-up: every chunk function compiled, so no call compiles; the bare entry
    (``fn`` with ``launch_args``) then runs either body. Without it the bare entry
    reports the missing chunk function (1) and writes nothing."""
    native = nb.compile_kernel(_nt_eltwise("N", "M"))
    x = np.random.default_rng(6).standard_normal((2, 128)).astype(np.float32)
    _, off = _aligned_and_not(2, 128)
    off[:] = 7.0
    assert native.fn(x, off, 2, 128, *native.launch_args) == 1
    assert (off == 7.0).all()
    native.compile_chunk_functions()
    assert all(f is not None for f in native._chunk_fns.values())
    assert 0 not in native.launch_args[:2]
    aligned, off = _aligned_and_not(2, 128)
    want = (np.exp(x.astype(np.float64)) + 1).astype(np.float32)
    for y in (aligned, off):
        assert native.fn(x, y, 2, 128, *native.launch_args) == 0
        assert_close(y, want, "float32")
    nb.compile_kernel(_exp_plus_one("N", "M", "plain")).compile_chunk_functions()  # no-op


def test_a_failed_chunk_function_compile_is_raised_at_every_need(fresh_memo) -> None:
    """A chunk function that fails to compile on first need raises CodegenError there
    and at every later need, without compiling again; the streaming body still runs."""
    native = nb.compile_kernel(_nt_eltwise("N", "M"))
    calls = []

    def broken(name: str):
        calls.append(name)
        raise CodegenError(f"numba failed to compile {name}")

    native._compile_rows = broken
    x = np.random.default_rng(7).standard_normal((2, 64)).astype(np.float32)
    for _ in range(2):
        with pytest.raises(CodegenError, match="failed to compile nt_rows"):
            native(x, _aligned_and_not(2, 64)[1], 2, 64)
    assert len(calls) == 1
    aligned, _ = _aligned_and_not(2, 64)
    native(x, aligned, 2, 64)
    assert_close(aligned, (np.exp(x.astype(np.float64)) + 1).astype(np.float32), "float32")


def test_first_need_after_coercing_a_non_contiguous_input(fresh_memo) -> None:
    """A non-contiguous input (copied to C order) with a misaligned output on the first
    call: the plain chunk function is compiled and runs on the copied input."""
    native = nb.compile_kernel(_nt_eltwise("N", "M"))
    wide = np.random.default_rng(8).standard_normal((3, 128)).astype(np.float32)
    x = wide[:, ::2]
    _, off = _aligned_and_not(3, 64)
    native(x, off, 3, 64)
    assert_close(off, (np.exp(x.astype(np.float64)) + 1).astype(np.float32), "float32")
    assert native._chunk_fns[next(iter(native._chunk_fns))] is not None


def test_plain_chunk_function_gets_a_cache_entry_of_its_own(tmp_path, fresh_memo) -> None:
    """Compiled on first need, the plain chunk function goes into a new cache entry (the
    kernel's committed entry is left as it was); a later process (here: a cleared memo)
    loads the kernel and, on first need, that chunk function from the disk cache."""
    from geode.codegen.cache import KERNEL_AREA

    kern = _nt_eltwise("N", "M")
    native = nb.compile_kernel(kern, cache_dir=tmp_path)
    area = tmp_path / KERNEL_AREA
    entries = {d.name: (d / "manifest.json").read_bytes() for d in area.iterdir()}
    assert len(entries) == 1
    x = np.random.default_rng(5).standard_normal((3, 128)).astype(np.float32)
    native(x, _aligned_and_not(3, 128)[1], 3, 128)
    after = {d.name: d for d in area.iterdir()}
    assert len(after) == 2 and set(entries) < set(after)
    assert all((after[n] / "manifest.json").read_bytes() == m for n, m in entries.items())
    nb_kernel._memo.clear()
    again = nb.compile_kernel(kern, cache_dir=tmp_path)
    assert again.from_cache
    y = _aligned_and_not(3, 128)[1]
    again(x, y, 3, 128)
    plain, nt = again._chunk_fns
    assert again._chunk_fns[plain].cache_hits > 0
    assert_close(y, (np.exp(x.astype(np.float64)) + 1).astype(np.float32), "float32")
    for name in (plain, nt):  # both loaded from the cache, recompiled for inspection
        assert re.search(rf"{len(name)}{name}B", again.asm), name


def test_corrupt_cache_entry_of_the_plain_chunk_function_is_rebuilt(tmp_path, fresh_memo) -> None:
    from geode.codegen.cache import KERNEL_AREA

    kern = _nt_eltwise("N", "M")
    native = nb.compile_kernel(kern, cache_dir=tmp_path)
    area = tmp_path / KERNEL_AREA
    (own,) = [d.name for d in area.iterdir()]
    x = np.random.default_rng(9).standard_normal((3, 64)).astype(np.float32)
    want = (np.exp(x.astype(np.float64)) + 1).astype(np.float32)
    native(x, _aligned_and_not(3, 64)[1], 3, 64)
    (plain_dir,) = [d for d in area.iterdir() if d.name != own]
    data = sorted(plain_dir.glob("*.nbc"))[-1]
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    nb_kernel._memo.clear()
    again = nb.compile_kernel(kern, cache_dir=tmp_path)
    y = _aligned_and_not(3, 64)[1]
    again(x, y, 3, 64)
    assert_close(y, want, "float32")
    plain = next(iter(again._chunk_fns))
    assert again._chunk_fns[plain].cache_hits == 0, "a corrupt entry was trusted"
    nb_kernel._memo.clear()
    third = nb.compile_kernel(kern, cache_dir=tmp_path)
    third(x, y, 3, 64)
    assert third._chunk_fns[plain].cache_hits > 0, "the rebuilt entry was not reused"


def test_inspecting_a_streaming_kernel_shows_both_chunk_functions(fresh_memo) -> None:
    native = nb.compile_kernel(_nt_eltwise("N", "M"))
    plain, nt = native._chunk_fns
    for text in (native.llvm, native.asm):  # numba's symbols: each name's length, the name
        for name in (plain, nt, "nt_body", "nt_body_nt"):
            assert re.search(rf"{len(name)}{name}B", text), name
    assert native._chunk_fns[plain] is None  # inspection compiled a copy of its own


def test_nontemporal_store_to_an_integer_output_is_a_codegen_error() -> None:
    k = _nt_eltwise("N", 64)
    k.outputs[0].dtype = "int32"
    with pytest.raises(CodegenError, match="non-temporal store to 'Y', which is not a float32"):
        nb.emit_source(k)


@numba.njit
def _vector_start(a, off):
    return nb._g_vector_start(a, off)


def test_g_vector_start_tests_the_address_against_the_vector_size() -> None:
    from geode.codegen.backends.target import stream_vector_bytes

    lanes = stream_vector_bytes() // 4
    raw = np.zeros(4 * lanes + 32, np.float32)
    base = (-raw.ctypes.data % 64) // 4
    a = raw[base:]
    for off in range(2 * lanes + 1):
        assert _vector_start(a, off) == (off % lanes == 0)
        assert not _vector_start(raw[base + 1 :], off * lanes)
    with pytest.raises(numba.TypingError):
        _vector_start(np.zeros(4, np.int32), 0)


def test_stream_statement_checks_its_buffers() -> None:
    k = _streamed_eltwise("N", "M", 16)
    (st,) = [s for s in A.walk_stmts(k.body) if isinstance(s, A.StreamStore)]
    st.src = "X"
    with pytest.raises(CodegenError, match="stream needs a local buffer, 'X' is not"):
        nb.emit_source(k)
    k = _streamed_eltwise("N", "M", 16)
    k.outputs[0].dtype = "float16"
    k.temps[0].dtype = "float16"
    with pytest.raises(CodegenError, match="other than float16"):
        nb.emit_source(k)


@numba.njit
def _f64_to_half_bits(x, out):
    for i in range(x.size):
        out[i] = nb._g_f2h(x[i])


def test_float64_to_float16_rounds_once() -> None:
    """float64 -> float16 (through float rounded to odd, no compiler-rt call) equals
    numpy's direct rounding, including doubles a hair off a half-way point, where rounding
    to float first would round twice; and overflow, subnormals, zeros, inf and NaN."""
    rng = np.random.default_rng(11)
    halves = rng.integers(0, 0x7BFF, 20000, dtype=np.uint16).view(np.float16).astype(np.float64)
    nxt = np.nextafter(halves.astype(np.float16), np.float16(np.inf)).astype(np.float64)
    mid = (halves + nxt) / 2
    tiny = np.abs(mid) * 2.0**-40
    x = np.concatenate(
        [
            mid,
            mid + tiny,
            mid - tiny,
            rng.standard_normal(20000) * 1000,
            np.exp(rng.uniform(-40, 12, 20000)),
            [65504.0, 65519.99, 65520.0, 1e300, 2.0**-24, 2.0**-25, 2.0**-25 * 1.0000001],
            [0.0, -0.0, np.inf, -np.inf, 5e-324],
        ]
    )
    x = np.concatenate([x, -x])
    got = np.empty(x.size, np.uint16)
    _f64_to_half_bits(x, got)
    want = x.astype(np.float16).view(np.uint16)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"x={x[bad[0]]!r}: got {got[bad[0]]:#06x}, numpy {want[bad[0]]:#06x}"
    nan = np.empty(1, np.uint16)
    _f64_to_half_bits(np.array([np.nan]), nan)
    assert np.isnan(nan.view(np.float16)[0])
    assert "truncdfhf2" not in _f64_to_half_bits.inspect_asm(_f64_to_half_bits.signatures[0])
