"""Schedule primitives: each is applied to hand-built kernels in the lowering
convention and checked against the AST interpreter, plus requirement violations,
trace replay and a property test over random loop transformations."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from geode.codegen.ast import (
    Bin,
    Block,
    Buffer,
    Cast,
    Const,
    Expr,
    For,
    ForKind,
    If,
    IterVar,
    Kernel,
    Load,
    Prefetch,
    Stmt,
    Store,
    StreamStore,
    Un,
    Var,
    expr_str,
    format_kernel,
    format_stmts,
    stmt_exprs,
    transform,
    walk,
    walk_stmts,
)
from geode.codegen.ast import blocks as ast_blocks
from geode.codegen.ast_eval import KernelEvalError, eval_shape, run_kernel
from geode.codegen.schedule import Schedule, Trace, TraceStep, alloc_loop
from geode.codegen.schedule.trace_json import replay_checked
from geode.errors import ScheduleError

F32 = "float32"


def f32(x: float) -> Const:
    return Const(float(x), F32)


# ---------------------------------------------------------------------------------
# hand-built kernels in the lowering convention
# ---------------------------------------------------------------------------------


def _dim(d: int | str) -> Expr:
    return Const(d) if isinstance(d, int) else Var(d)


def ew(
    name: str, out: str, shape: Sequence[int | str], value: Callable[[list[Expr]], Expr]
) -> Stmt:
    """``for name_i0 .. for name_i{r-1}: out[v] = value(v)`` with iter vars vi0.."""
    ext = [_dim(d) for d in shape]
    ivs = [IterVar(f"vi{k}", e) for k, e in enumerate(ext)]
    loops = [f"{name}_i{k}" for k in range(len(ext))]
    v = [Var(iv.name) for iv in ivs]
    blk = Block(name, ivs, [Var(lp) for lp in loops], [Store(out, tuple(v), value(v))])
    body: Stmt = blk
    for lp, e in reversed(list(zip(loops, ext))):
        body = For(lp, e, [body])
    return body


def reduce_(
    name: str,
    out: str,
    in_shape: Sequence[int | str],
    axes: Sequence[int],
    value: Callable[[list[Expr]], Expr],
    op: str = "+",
    identity: float = 0.0,
    keepdims: bool = False,
) -> list[Stmt]:
    """Init block ``name__init`` over the output shape, then the reduce block whose
    spatial iter vars are the kept axes and reduce iter vars the reduced ones."""
    ext = [_dim(d) for d in in_shape]
    kept = [k for k in range(len(ext)) if k not in axes]
    out_ext = (
        [ext[k] if k in kept else Const(1) for k in range(len(ext))]
        if keepdims
        else [ext[k] for k in kept]
    )
    # init
    iivs = [IterVar(f"vi{k}", e) for k, e in enumerate(out_ext)]
    iloops = [f"{name}__init_i{k}" for k in range(len(out_ext))]
    init: Stmt = Block(
        f"{name}__init",
        iivs,
        [Var(lp) for lp in iloops],
        [Store(out, tuple(Var(iv.name) for iv in iivs), f32(identity))],
        reduce_of=name,
    )
    for lp, e in reversed(list(zip(iloops, out_ext))):
        init = For(lp, e, [init])
    # reduce: spatial loops (kept axes) outside, reduce loops inside
    sp = [IterVar(f"vi{j}", ext[k]) for j, k in enumerate(kept)]
    rd = [IterVar(f"vk{j}", ext[k], "reduce") for j, k in enumerate(axes)]
    in_idx: list[Expr] = [Const(0)] * len(ext)
    for iv, k in zip(sp, kept):
        in_idx[k] = Var(iv.name)
    for iv, k in zip(rd, axes):
        in_idx[k] = Var(iv.name)
    if keepdims:
        out_idx = tuple(in_idx[k] if k in kept else Const(0) for k in range(len(ext)))
    else:
        out_idx = tuple(Var(iv.name) for iv in sp)
    loops = [f"{name}_i{j}" for j in range(len(sp))] + [f"{name}_k{j}" for j in range(len(rd))]
    acc = Load(out, out_idx)
    blk: Stmt = Block(
        name,
        sp + rd,
        [Var(lp) for lp in loops],
        [Store(out, out_idx, Bin(op, acc, value(in_idx)))],
    )
    for lp, iv in reversed(list(zip(loops, sp + rd))):
        blk = For(lp, iv.extent, [blk])
    return [init, blk]


def buf(name: str, shape: Sequence[int | str], scope: str = "global", dtype: str = F32) -> Buffer:
    return Buffer(name, dtype, tuple(_dim(d) for d in shape), scope)


def ld(b: str, idx: Sequence[Expr]) -> Load:
    return Load(b, tuple(idx))


def k_eltwise(n: int | str = "N", m: int | str = 6) -> Kernel:
    """T+T chain: A = X * 2; B = A + Y; O = B * X (A, B local temps)."""
    dims = [d for d in (n, m) if isinstance(d, str)]
    sh = [n, m]
    body = [
        ew("mul_0", "A", sh, lambda v: Bin("*", ld("X", v), f32(2))),
        ew("add_1", "B", sh, lambda v: Bin("+", ld("A", v), ld("Y", v))),
        ew("mul_2", "O", sh, lambda v: Bin("*", ld("B", v), ld("X", v))),
    ]
    return Kernel(
        "eltwise",
        [buf("X", sh), buf("Y", sh)],
        [buf("O", sh)],
        dims,
        body,
        [buf("A", sh, "local"), buf("B", sh, "local")],
    )


def k_reduce(n: int | str = "N", m: int | str = 10, op: str = "+") -> Kernel:
    """S[i] = reduce_j X[i, j] (op + or max)."""
    dims = [d for d in (n, m) if isinstance(d, str)]
    ident = 0.0 if op == "+" else float("-inf")
    body = reduce_("sum_0", "S", [n, m], [1], lambda i: ld("X", i), op, ident)
    return Kernel("reduce", [buf("X", [n, m])], [buf("S", [n])], dims, body)


def k_chain(s1: int | str = "S1", s2: int | str = "S2", k: int = 8) -> Kernel:
    """CINN's example: X*2 -> +1 -> ReduceSum(last) -> *2 -> broadcast -> +1."""
    dims = [d for d in (s1, s2) if isinstance(d, str)]
    sh3, sh2 = [s1, s2, k], [s1, s2]
    body = [
        ew("A", "A", sh3, lambda v: Bin("*", ld("X", v), f32(2))),
        ew("B", "B", sh3, lambda v: Bin("+", ld("A", v), f32(1))),
        *reduce_("C", "C", sh3, [2], lambda i: ld("B", i)),
        ew("D", "D", sh2, lambda v: Bin("*", ld("C", v), f32(2))),
        ew("E", "E", sh3, lambda v: ld("D", v[:2])),
        ew("F", "F", sh3, lambda v: Bin("+", ld("E", v), f32(1))),
    ]
    temps = [
        buf("A", sh3, "local"),
        buf("B", sh3, "local"),
        buf("C", sh2, "local"),
        buf("D", sh2, "local"),
        buf("E", sh3, "local"),
    ]
    return Kernel("chain", [buf("X", sh3)], [buf("F", sh3)], dims, body, temps)


def k_layernorm(n: int | str = "N", d: int | str = "D") -> Kernel:
    """Two reductions: mean, centred, variance, normalised output."""
    dims = [x for x in (n, d) if isinstance(x, str)]
    fd = Cast(F32, _dim(d))
    body = [
        *reduce_("sum_0", "S1", [n, d], [1], lambda i: ld("X", i)),
        ew("mean_1", "M", [n], lambda v: Bin("/", ld("S1", v), fd)),
        ew("sub_2", "XC", [n, d], lambda v: Bin("-", ld("X", v), ld("M", v[:1]))),
        ew("sq_3", "SQ", [n, d], lambda v: Bin("*", ld("XC", v), ld("XC", v))),
        *reduce_("sum_4", "S2", [n, d], [1], lambda i: ld("SQ", i)),
        ew("var_5", "V", [n], lambda v: Bin("+", Bin("/", ld("S2", v), fd), f32(1e-5))),
        ew("norm_6", "Y", [n, d], lambda v: Bin("/", ld("XC", v), Un("sqrt", ld("V", v[:1])))),
    ]
    temps = [
        buf("S1", [n], "local"),
        buf("M", [n], "local"),
        buf("XC", [n, d], "local"),
        buf("SQ", [n, d], "local"),
        buf("S2", [n], "local"),
        buf("V", [n], "local"),
    ]
    return Kernel("layernorm", [buf("X", [n, d])], [buf("Y", [n, d])], dims, body, temps)


def k_keepdims_max(n: int | str = "N", m: int | str = 5) -> Kernel:
    """Max over axis 0 with keepdims, then subtract (softmax-like epilogue)."""
    dims = [d for d in (n, m) if isinstance(d, str)]
    body = [
        *reduce_("max_0", "MX", [n, m], [0], lambda i: ld("X", i), "max", float("-inf"), True),
        ew("sub_1", "O", [n, m], lambda v: Bin("-", ld("X", v), ld("MX", [Const(0), v[1]]))),
    ]
    return Kernel(
        "kmax", [buf("X", [n, m])], [buf("O", [n, m])], dims, body, [buf("MX", [1, m], "local")]
    )


def k_transpose(n: int = 4) -> Kernel:
    """A = X * 2; O = transpose(A) + shift: O[i, j] = A[j, i] + A[(j + 1) % n, i]."""
    sh = [n, n]
    body = [
        ew("mul_0", "A", sh, lambda v: Bin("*", ld("X", v), f32(2))),
        ew(
            "tr_1",
            "O",
            sh,
            lambda v: Bin(
                "+",
                ld("A", [v[1], v[0]]),
                ld("A", [Bin("%", Bin("+", v[1], Const(1)), Const(n)), v[0]]),
            ),
        ),
    ]
    return Kernel("transpose", [buf("X", sh)], [buf("O", sh)], [], body, [buf("A", sh, "local")])


# ---------------------------------------------------------------------------------
# checking helpers
# ---------------------------------------------------------------------------------


def _inputs(k: Kernel, dims: dict[str, int], seed: int = 0) -> dict[str, np.ndarray]:
    from geode.codegen.ast_eval import eval_shape

    rng = np.random.default_rng(seed)
    return {
        b.name: rng.standard_normal(eval_shape(b.shape, dims)).astype(b.dtype) for b in k.inputs
    }


def check_same(
    before: Kernel, after: Kernel, dims_list: Sequence[dict[str, int]], rtol: float = 1e-5
) -> None:
    """Both kernels give the same outputs on random inputs for every dims binding."""
    for i, dims in enumerate(dims_list):
        arrays = _inputs(before, dims, i)
        want = run_kernel(before, arrays, dims)
        got = run_kernel(after, arrays, dims)
        for name, w in want.items():
            assert not np.isnan(w).any(), f"reference {name} reads uninitialised data"
            np.testing.assert_allclose(got[name], w, rtol=rtol, atol=1e-5, err_msg=f"{name} {dims}")


def check_replay(k: Kernel, sch: Schedule) -> None:
    """The trace replays to the same AST, also after a round trip through its JSON form."""
    assert format_kernel(sch.trace.replay(k).kernel) == format_kernel(sch.kernel)
    back = Trace.from_json(sch.trace.to_json())
    assert format_kernel(replay_checked(back, k).kernel) == format_kernel(sch.kernel)


def raises(prim: str, block: str | None = None) -> pytest.RaisesContext:
    pat = f"schedule primitive '{prim}' on block '{block}'" if block else f"'{prim}'"
    return pytest.raises(ScheduleError, match=pat.replace("(", r"\(").replace(")", r"\)"))


DIMS_N = [{"N": 1}, {"N": 3}, {"N": 5}]
DIMS_CH = [{"S1": 1, "S2": 3}, {"S1": 2, "S2": 2}]
DIMS_LN = [{"N": 2, "D": 5}, {"N": 3, "D": 8}]


# ---------------------------------------------------------------------------------
# interpreter sanity on the sample kernels
# ---------------------------------------------------------------------------------


def test_sample_kernels_match_numpy() -> None:
    dims = {"N": 3, "D": 7}
    x = _inputs(k_layernorm(), dims)["X"]
    y = run_kernel(k_layernorm(), {"X": x}, dims)["Y"]
    mu = x.mean(1, keepdims=True)
    ref = (x - mu) / np.sqrt(((x - mu) ** 2).mean(1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5)
    dims = {"S1": 2, "S2": 3}
    x = _inputs(k_chain(), dims)["X"]
    f = run_kernel(k_chain(), {"X": x}, dims)["F"]
    ref = np.broadcast_to(((x * 2 + 1).sum(-1, keepdims=True) * 2), x.shape) + 1
    np.testing.assert_allclose(f, ref, rtol=1e-5, atol=1e-5)
    x = _inputs(k_keepdims_max(), {"N": 4})["X"]
    o = run_kernel(k_keepdims_max(), {"X": x}, {"N": 4})["O"]
    np.testing.assert_allclose(o, x - x.max(0, keepdims=True))


# ---------------------------------------------------------------------------------
# queries
# ---------------------------------------------------------------------------------


def test_queries() -> None:
    sch = Schedule(k_chain())
    assert sch.blocks() == ["A", "B", "C__init", "C", "D", "E", "F"]
    assert sch.get_loops("C") == ["C_i0", "C_i1", "C_k0"]
    assert sch.get_block("D").name == "D"
    assert sch.producers("C") == ["B"]
    assert sch.consumers("C") == ["D"]
    assert sch.consumers("C__init") == ["D"]
    assert sch.writers("C") == ["C__init", "C"]
    assert sch.readers("D") == ["E"]
    with raises("get_block", "nope"):
        sch.get_block("nope")
    assert len(sch.trace) == 0


# ---------------------------------------------------------------------------------
# split
# ---------------------------------------------------------------------------------


@pytest.mark.parametrize("factors", [[-1, 4], [None, 2, 2], [2, -1], [3, 4], [1, -1, 1]])
def test_split_eltwise(factors: list[int | None]) -> None:
    k = k_eltwise()
    sch = Schedule(k)
    names = sch.split("mul_0_i1", factors)  # m = 6: some divide, some do not
    assert names == [f"mul_0_i1_{i}" for i in range(len(factors))]
    assert sch.get_loops("mul_0") == ["mul_0_i0", *names]
    names = sch.split("add_1_i0", [-1, 2])  # symbolic N
    assert sch.get_block("add_1").predicate is not None
    check_same(k, sch.kernel, DIMS_N)
    check_replay(k, sch)


def test_split_divisible_has_no_predicate() -> None:
    sch = Schedule(k_eltwise(m=6))
    sch.split("mul_0_i1", [-1, 3])
    assert sch.get_block("mul_0").predicate is None
    text = str(sch)
    assert "mul_0_i1_0 * 3 + mul_0_i1_1" in text


def test_split_reduce_loop_non_divisible() -> None:
    k = k_reduce(m=10)
    sch = Schedule(k)
    sch.split("sum_0_k0", [-1, 4])
    sch.split("sum_0_i0", [2, -1])
    check_same(k, sch.kernel, DIMS_N)
    k = k_reduce(m="M")
    sch = Schedule(k)
    sch.split("sum_0_k0", [-1, 3])
    check_same(k, sch.kernel, [{"N": 2, "M": 1}, {"N": 2, "M": 7}, {"N": 1, "M": 9}])


def test_split_errors() -> None:
    sch = Schedule(k_eltwise())
    with raises("split", "mul_0"):
        sch.split("mul_0_i1", [-1, None])
    with raises("split", "mul_0"):
        sch.split("mul_0_i1", [0, -1])
    with raises("split", "mul_0"):
        sch.split("mul_0_i0", [2, 2])  # symbolic extent, nothing inferred
    with raises("split", "mul_0"):
        sch.split("mul_0_i1", [2, 2])  # covers 4 < 6
    with raises("split", "mul_0"):
        sch.split("mul_0_i1", [6])
    with raises("split"):
        sch.split("nope", [-1, 2])
    assert len(sch.trace) == 0
    assert format_kernel(sch.kernel) == format_kernel(k_eltwise())


# ---------------------------------------------------------------------------------
# fuse / reorder
# ---------------------------------------------------------------------------------


def test_fuse_and_reorder() -> None:
    k = k_eltwise()
    sch = Schedule(k)
    f = sch.fuse(["mul_0_i0", "mul_0_i1"])
    assert f == "mul_0_i0_mul_0_i1_fused"
    assert "mul_0_i0_mul_0_i1_fused // 6" in str(sch)
    sch.reorder(["add_1_i1", "add_1_i0"])
    assert sch.get_loops("add_1") == ["add_1_i1", "add_1_i0"]
    a, b = sch.split("mul_2_i1", [-1, 4])
    sch.reorder([b, "mul_2_i0", a])
    assert sch.get_loops("mul_2") == [b, "mul_2_i0", a]
    sch.fuse([b, "mul_2_i0"])
    check_same(k, sch.kernel, DIMS_N)
    check_replay(k, sch)


def test_fuse_reorder_reduce() -> None:
    k = k_reduce()
    sch = Schedule(k)
    sch.reorder(["sum_0_k0", "sum_0_i0"])  # reduce loop outermost
    check_same(k, sch.kernel, DIMS_N)
    k = k_chain()
    sch = Schedule(k)
    sch.fuse(["C_i0", "C_i1", "C_k0"])  # spatial and reduce loops in one
    sch.fuse(["A_i0", "A_i1", "A_i2"])
    sch.split("A_i0_A_i1_A_i2_fused", [-1, 5])
    check_same(k, sch.kernel, DIMS_CH)
    check_replay(k, sch)


def test_fuse_reorder_errors() -> None:
    sch = Schedule(k_chain())
    with raises("fuse", "C"):
        sch.fuse(["C_i0", "C_k0"])  # not adjacent
    with raises("fuse", "C"):
        sch.fuse(["C_i1", "C_i0"])  # wrong order
    with raises("fuse"):
        sch.fuse(["C_i0"])
    with raises("reorder", "C"):
        sch.reorder(["C_i0", "D_i0"])  # different nests
    with raises("reorder"):
        sch.reorder(["C_i0", "C_i0"])
    sch.align_all()
    with raises("compute_at", "D"):
        sch.compute_at("D", "F_sp")  # E reads D and would then run before it
    sch.compute_at("E", "F_rb")
    sch.compute_at("D", "F_sp")
    with raises("reorder", "D"):
        sch.reorder(["F_rb", "F_sp"])  # F_sp holds D and F_rb
    n = len(sch.trace)
    with raises("fuse", "D"):
        sch.fuse(["F_sp", "F_rb"])
    assert len(sch.trace) == n


# ---------------------------------------------------------------------------------
# align
# ---------------------------------------------------------------------------------


def test_align_all_chain() -> None:
    k = k_chain()
    sch = Schedule(k)
    loops = sch.align_all()
    assert loops["C"] == ["C_sp", "C_rb"]
    assert loops["A"] == ["A_sp", "A_rb"]  # impure spatial axis inferred
    assert loops["F"] == ["F_sp", "F_rb"]
    assert loops["D"] == ["D_sp"]
    assert loops["C__init"] == ["C__init_sp"]
    c = sch.get_loop("C_sp")
    assert format_kernel(sch.kernel).count("(C_sp, 0, S1 * S2)") == 1
    assert c.extent == sch.get_loop("F_sp").extent == sch.get_loop("D_sp").extent
    assert "C_sp // S2, C_sp % S2, C_rb" in str(sch)
    # idempotent
    assert sch.align("C") == ["C_sp", "C_rb"]
    check_same(k, sch.kernel, DIMS_CH)
    check_replay(k, sch)


def test_align_keepdims_and_explicit_axes() -> None:
    k = k_keepdims_max()
    sch = Schedule(k)
    assert sch.align("max_0") == ["max_0_sp", "max_0_rb"]
    assert sch.align("max_0__init") == ["max_0__init_sp"]
    assert sch.align("sub_1", reduce_axes=[0]) == ["sub_1_sp", "sub_1_rb"]
    check_same(k, sch.kernel, DIMS_N)
    k = k_layernorm()
    sch = Schedule(k)
    sch.align_all()
    assert sch.get_loops("sub_2") == ["sub_2_sp", "sub_2_rb"]
    assert sch.get_loops("mean_1") == ["mean_1_sp"]
    check_same(k, sch.kernel, DIMS_LN)


def _run_viewed(k: Kernel, arrays: dict[str, np.ndarray], dims: dict[str, int]) -> dict:
    """Run ``k`` on ``arrays`` reshaped to its argument shapes (merge_dims views)."""
    views = {
        b.name: np.asarray(arrays[b.name]).reshape(eval_shape(b.shape, dims)) for b in k.inputs
    }
    return run_kernel(k, views, dims)


def _loads_of(k: Kernel, name: str) -> list[Load]:
    out: list[Load] = []
    for s_ in walk_stmts(k.body):
        for e in stmt_exprs(s_):
            out += [x for x in walk(e) if isinstance(x, Load) and x.buffer == name]
    return out


@pytest.mark.parametrize("w", [6, "W"])
def test_merge_dims_folds_digit_pairs(w: int | str) -> None:
    """A reduction over the two trailing axes of ``X[N, C, H, W]`` aligned to one loop
    reads ``X[.., rb // W, rb % W]``; merging those dims reads ``X[.., rb]``, and the
    outer pair ``(sp // C, sp % C)`` folds the same way. Values are unchanged."""
    dims_w = [] if isinstance(w, int) else [w]
    body = reduce_("r", "S", ["N", 3, 4, w], [2, 3], lambda i: ld("X", i))
    k = Kernel("r", [buf("X", ["N", 3, 4, w])], [buf("S", ["N", 3])], ["N", *dims_w], body)
    sch = Schedule(k)
    sch.align("r")
    assert sch.digit_dims("X") == [0, 2]
    sch.merge_dims("X", 2)
    sch.merge_dims("X", 0)
    assert sch.digit_dims("X") == []
    (load,) = _loads_of(sch.kernel, "X")
    assert load.indices == (Var("r_sp"), Var("r_rb"))
    assert len(sch.kernel.inputs[0].shape) == 2
    check_replay(k, sch)
    for n, wv in ((1, 6), (3, 6)):
        dims = {"N": n, **({} if isinstance(w, int) else {w: wv})}
        arrays = _inputs(k, dims)
        want = run_kernel(k, arrays, dims)["S"]
        np.testing.assert_allclose(_run_viewed(sch.kernel, arrays, dims)["S"], want, rtol=1e-5)


def test_merge_dims_of_plain_indices_and_outputs() -> None:
    """Indices that are not digits of one index become ``hi * d + lo`` (the row-major
    offset the backend computes anyway); an output and a nested digit pair
    ``(e // d % m, e % d)`` fold to ``e % (m * d)``."""
    body = [ew("A", "O", ["N", 4, 5], lambda v: Bin("*", ld("X", v), f32(2.0)))]
    k = Kernel("e", [buf("X", ["N", 4, 5])], [buf("O", ["N", 4, 5])], ["N"], body)
    sch = Schedule(k)
    fused = sch.fuse(["A_i0", "A_i1", "A_i2"])
    assert sch.digit_dims("O") == [0, 1]
    sch.merge_dims("O", 1)  # (f // 5 % 4, f % 5) -> f % 20
    sch.merge_dims("O", 0)
    sch.merge_dims("X", 1)
    store = next(x for x in walk_stmts(sch.kernel.body) if isinstance(x, Store))
    assert store.indices == (Var(fused),)
    assert len(sch.kernel.outputs[0].shape) == 1
    sch2 = Schedule(k)
    sch2.merge_dims("X", 1)  # plain loop indices: i1 * 5 + i2
    (load,) = _loads_of(sch2.kernel, "X")
    assert load.indices[1] == Bin("+", Bin("*", Var("vi1"), Const(5)), Var("vi2"))
    for dims in DIMS_N:
        arrays = _inputs(k, dims)
        want = run_kernel(k, arrays, dims)["O"]
        for s_ in (sch, sch2):
            got = _run_viewed(s_.kernel, arrays, dims)["O"]
            np.testing.assert_allclose(got.reshape(want.shape), want)
    with raises("merge_dims", "X"):
        sch2.merge_dims("X", 1)  # rank 2 now: dim 1 has no next dim
    with raises("merge_dims", "nope"):
        sch2.merge_dims("nope", 0)


def test_align_all_is_atomic() -> None:
    sch = Schedule(k_eltwise())
    sch.split("mul_2_i1", [-1, 4])
    before = format_kernel(sch.kernel)
    with raises("align_all", "mul_2"):
        sch.align_all()  # mul_0 and add_1 align first, then mul_2 fails: all undone
    assert format_kernel(sch.kernel) == before
    assert [s.primitive for s in sch.trace] == ["split"]
    assert alloc_loop(sch.kernel, "A") is None  # used by two nests: kernel level


def test_align_errors() -> None:
    sch = Schedule(k_eltwise())
    sch.split("mul_0_i1", [-1, 4])
    with raises("align", "mul_0"):
        sch.align("mul_0")  # split: not bound 1:1 and predicated
    sch.reorder(["add_1_i1", "add_1_i0"])
    assert sch.align("add_1") == ["add_1_sp"]  # reordered 1:1 loops are fine
    with raises("align", "mul_2"):
        sch.align("mul_2", reduce_axes=[3])
    sch2 = Schedule(k_chain())
    sch2.align_all()
    sch2.compute_at("E", "F_rb")
    assert sch2.align("E", [2]) == ["F_sp", "F_rb"]  # canonical inside F's nest
    sch2.split("F_rb", [-1, 2])
    with raises("align", "E"):
        sch2.align("E", [2])  # shares F's nest, and split


# ---------------------------------------------------------------------------------
# compute_inline / reverse_compute_inline
# ---------------------------------------------------------------------------------


def test_compute_inline_chain() -> None:
    k = k_chain()
    sch = Schedule(k)
    sch.compute_inline("A")
    sch.compute_inline("B")
    assert sch.blocks() == ["C__init", "C", "D", "E", "F"]
    assert [t.name for t in sch.kernel.temps] == ["C", "D", "E"]
    assert "X[vi0, vi1, vk0] * 2.0f + 1.0f" in str(sch)
    sch.compute_inline("E")  # broadcast into its consumer
    sch.compute_inline("D")
    assert "C[vi0, vi1] * 2.0f + 1.0f" in str(sch)
    check_same(k, sch.kernel, DIMS_CH)
    check_replay(k, sch)


def test_compute_inline_after_align_and_split() -> None:
    k = k_layernorm()
    sch = Schedule(k)
    sch.align_all()
    sch.split("sub_2_rb", [-1, 3])
    sch.compute_inline("sq_3")
    sch.compute_inline("mean_1")
    sch.compute_inline("sub_2")  # read twice by sum_4 and by norm_6
    check_same(k, sch.kernel, DIMS_LN)
    check_replay(k, sch)


def test_compute_inline_fences_a_value_it_recomputes() -> None:
    """A float ``+ - * /`` inlined at several sites is wrapped in ``fence``: each copy then
    rounds alike (no copy contracted or reassociated with its users); a value inlined
    once, and one that is not such an operation, are inlined as they are."""
    k = k_layernorm()
    sch = Schedule(k)
    sch.compute_inline("mean_1")  # read once, by sub_2
    assert "fence" not in str(sch)
    sch.compute_inline("sub_2")  # read twice by sq_3 and once by norm_6
    text = str(sch)
    assert text.count("fence(X[") == 3, text
    sch.compute_inline("sq_3")  # a fenced product of fences, read once
    assert str(sch).count("fence(") == 3
    check_same(k, sch.kernel, DIMS_LN)
    check_replay(k, sch)
    ints = Kernel(
        "ints",
        [buf("X", [4], dtype="int32")],
        [buf("Y", [4], dtype="int32")],
        [],
        [
            ew("a", "A", [4], lambda v: Bin("*", ld("X", v), Const(3, "int32"))),
            ew("b", "Y", [4], lambda v: Bin("+", ld("A", v), ld("A", v))),
        ],
        [buf("A", [4], "local", dtype="int32")],
    )
    sch = Schedule(ints)
    sch.compute_inline("a")
    assert "fence" not in str(sch)


def test_compute_inline_errors() -> None:
    sch = Schedule(k_chain())
    with raises("compute_inline", "F"):
        sch.compute_inline("F")  # group output
    with raises("compute_inline", "C"):
        sch.compute_inline("C")  # reduction
    with raises("compute_inline", "C__init"):
        sch.compute_inline("C__init")
    with raises("compute_inline", "zz"):
        sch.compute_inline("zz")
    sch.align_all()
    sch.compute_at("E", "F_rb")  # E shrinks to a register: index no longer its iter vars
    with raises("compute_inline", "E"):
        sch.compute_inline("E")


def test_reverse_compute_inline() -> None:
    k = k_chain()
    sch = Schedule(k)
    sch.reverse_compute_inline("F")  # F folded into E
    assert "F" not in sch.blocks()
    assert "F[vi0, vi1, vi2] = D[vi0, vi1] + 1.0f" in str(sch)
    assert "E" not in [t.name for t in sch.kernel.temps]
    sch.reverse_compute_inline("B")
    check_same(k, sch.kernel, DIMS_CH)
    check_replay(k, sch)
    k = k_eltwise()
    sch = Schedule(k)
    sch.reorder(["add_1_i1", "add_1_i0"])
    sch.reverse_compute_inline("add_1")  # consumer reads X as well as A
    check_same(k, sch.kernel, DIMS_N)


def test_reverse_compute_inline_errors() -> None:
    sch = Schedule(k_layernorm())
    with raises("reverse_compute_inline", "norm_6"):
        sch.reverse_compute_inline("norm_6")  # two produced inputs (XC, V)
    with raises("reverse_compute_inline", "sq_3"):
        sch.reverse_compute_inline("sq_3")  # XC also read by norm_6
    with raises("reverse_compute_inline", "mean_1"):
        sch.reverse_compute_inline("mean_1")  # producer is a reduction
    with raises("reverse_compute_inline", "sum_4"):
        sch.reverse_compute_inline("sum_4")
    sch2 = Schedule(k_chain())
    with raises("reverse_compute_inline", "E"):
        sch2.reverse_compute_inline("E")  # E's load D[vi0, vi1] misses vi2


# ---------------------------------------------------------------------------------
# rfactor
# ---------------------------------------------------------------------------------


@pytest.mark.parametrize("m,factor", [(10, 4), (8, 4), ("M", 3), (7, 1)])
def test_rfactor_reduce(m: int | str, factor: int) -> None:
    k = k_reduce(m=m)
    sch = Schedule(k)
    loops = sch.rfactor("sum_0", "sum_0_k0", factor)
    assert loops == ["sum_0_k0_0", "sum_0_k0_1"]
    assert sch.blocks() == ["sum_0__init", "sum_0_rf__init", "sum_0_rf", "sum_0"]
    rf = sch.kernel.buffer("S_rf")
    assert rf.scope == "local" and rf.shape[-1] == Const(factor)
    dims = [{"N": 2, "M": 1}, {"N": 3, "M": 7}] if m == "M" else DIMS_N
    check_same(k, sch.kernel, dims)
    sch.vectorize("sum_0_k0_1")  # the partials' axis is spatial for the rf block
    sch.parallel("sum_0_i0")
    check_same(k, sch.kernel, dims)
    check_replay(k, sch)


@pytest.mark.parametrize("m,factor", [(12, 4), (10, 4), ("M", 3), (7, 1), (5, 8)])
def test_rfactor_outer_partials(m: int | str, factor: int) -> None:
    """Partials over contiguous runs: the outer loop carries them (parallel), the inner
    reduces a run (vectorized); a non-dividing extent is guarded."""
    k = k_reduce(m=m)
    sch = Schedule(k)
    p, r = sch.rfactor("sum_0", "sum_0_k0", factor, partials="outer")
    assert (p, r) == ("sum_0_k0_0", "sum_0_k0_1")
    assert sch.get_loop(p).extent == Const(factor)
    rf = sch.get_block("sum_0_rf")
    assert [iv.kind for iv in rf.iter_vars] == ["spatial", "spatial", "reduce"]
    dims = [{"N": 2, "M": 1}, {"N": 3, "M": 7}, {"N": 1, "M": 12}] if m == "M" else DIMS_N
    check_same(k, sch.kernel, dims)
    sch.parallel(p)
    sch.vectorize(r, allow_reassoc=True)
    check_same(k, sch.kernel, dims)
    check_replay(k, sch)
    with raises("rfactor", "sum_0"):
        Schedule(k).rfactor("sum_0", "sum_0_k0", 2, partials="middle")


@pytest.mark.parametrize("m,factor", [(12, 4), ("M", 3), (5, 8)])
def test_rfactor_partials_axis_first(m: int | str, factor: int) -> None:
    """``partials_axis="first"``: the partials are rows of the output's shape (each one
    contiguous), the same values as with the axis last."""
    k = k_reduce(m=m)
    sch = Schedule(k)
    p, r = sch.rfactor("sum_0", "sum_0_k0", factor, partials="outer", partials_axis="first")
    rf = sch.kernel.buffer("S_rf")
    assert rf.shape[0] == Const(factor) and len(rf.shape) == 2
    assert "S[vi0] = S[vi0] + S_rf[vk0_i, vi0]" in str(sch)
    dims = [{"N": 2, "M": 1}, {"N": 3, "M": 7}, {"N": 1, "M": 12}] if m == "M" else DIMS_N
    check_same(k, sch.kernel, dims)
    sch.parallel(p)
    check_same(k, sch.kernel, dims)
    check_replay(k, sch)
    with raises("rfactor", "sum_0"):
        Schedule(k).rfactor("sum_0", "sum_0_k0", 2, partials_axis="middle")


def test_rfactor_max_and_aligned_chain() -> None:
    k = k_reduce(op="max")
    sch = Schedule(k)
    sch.rfactor("sum_0", "sum_0_k0", 3)
    check_same(k, sch.kernel, DIMS_N)
    k = k_chain()
    sch = Schedule(k)
    sch.align_all()
    r0, r1 = sch.rfactor("C", "C_rb", 4)
    sch.compute_inline("A")
    sch.compute_inline("B")
    check_same(k, sch.kernel, DIMS_CH)
    check_replay(k, sch)


def test_rfactor_errors() -> None:
    sch = Schedule(k_reduce())
    with raises("rfactor", "sum_0__init"):
        sch.rfactor("sum_0__init", "sum_0__init_i0", 2)
    with raises("rfactor", "sum_0"):
        sch.rfactor("sum_0", "sum_0_i0", 2)  # spatial loop
    with raises("rfactor", "sum_0"):
        sch.rfactor("sum_0", "sum_0_k0", 0)
    with raises("rfactor", "sum_0"):
        sch.rfactor("sum_0", "sum_0__init_i0", 2)  # not the block's loop
    sch.reorder(["sum_0_k0", "sum_0_i0"])
    with raises("rfactor", "sum_0"):
        sch.rfactor("sum_0", "sum_0_k0", 2)  # reduce loop outside spatial
    sch2 = Schedule(k_eltwise())
    with raises("rfactor", "mul_0"):
        sch2.rfactor("mul_0", "mul_0_i1", 2)


# ---------------------------------------------------------------------------------
# compute_at
# ---------------------------------------------------------------------------------


def test_compute_at_cinn_flow() -> None:
    """CINN's walk-through: align, inline, compute everything at F's loops."""
    k = k_chain()
    sch = Schedule(k)
    sch.align_all()
    sch.compute_inline("A")
    sch.compute_inline("B")
    assert sch.compute_at("E", "F_rb") == ["F_sp", "F_rb"]
    assert sch.compute_at("D", "F_sp") == ["F_sp"]
    assert sch.compute_at("C", "F_sp") == ["F_sp", "C_rb"]
    assert sch.get_loops("C__init") == ["F_sp"]
    assert sch.blocks() == ["C__init", "C", "D", "E", "F"]
    for t in ("C", "D", "E"):
        b = sch.kernel.buffer(t)
        assert b.scope == "register" and b.shape == ()
        assert alloc_loop(sch.kernel, t) in ("F_sp", "F_rb")
    check_same(k, sch.kernel, DIMS_CH)
    sch.parallel("F_sp")
    sch.vectorize("F_rb")
    sch.unroll("C_rb")
    check_same(k, sch.kernel, DIMS_CH)
    check_replay(k, sch)


def test_compute_at_tiled_nests() -> None:
    """Tile every nest identically (non-dividing), then compute at the tile loop."""
    k = k_chain()
    sch = Schedule(k)
    sch.align_all()
    for b in ("C__init", "C", "D", "F"):
        sch.split(f"{b}_sp", [-1, 4])
    sch.compute_inline("E")
    sch.compute_inline("A")
    sch.compute_inline("B")
    sch.compute_at("D", "F_sp_1")
    sch.compute_at("C", "F_sp_1")
    assert sch.kernel.buffer("C").scope == "register"
    sch.parallel("F_sp_0")
    check_same(k, sch.kernel, DIMS_CH + [{"S1": 3, "S2": 3}])
    check_replay(k, sch)


def test_compute_at_unaligned_product_match() -> None:
    """Lowered (unaligned) producer nests matched by extent product."""
    k = k_chain()
    sch = Schedule(k)
    sch.align("F", [2])
    sch.compute_at("E", "F_rb")  # E's (S1, S2, 8) loops recomputed from (F_sp, F_rb)
    sch.compute_at("D", "F_sp")  # D's (S1, S2) loops recomputed from F_sp
    assert "F_sp // S2" in str(sch)
    check_same(k, sch.kernel, DIMS_CH)
    check_replay(k, sch)


def test_compute_at_partial_shrink_and_consumer() -> None:
    k = k_layernorm()
    sch = Schedule(k)
    sch.align_all()
    # XC is read by sq_3 and norm_6: compute it, the square and the variance per row
    sch.compute_at("sq_3", "sum_4_sp")  # sq_3 before sum_4 in its sp loop
    assert sch.kernel.buffer("SQ").shape == (Const(1), Var("D"))
    sch.compute_at("var_5", "sum_4_sp")  # consumer: goes last
    assert sch.blocks().index("var_5") == sch.blocks().index("sum_4") + 1
    check_same(k, sch.kernel, DIMS_LN)
    sch.parallel("sum_4_sp")
    check_same(k, sch.kernel, DIMS_LN)
    check_replay(k, sch)


def test_compute_at_layernorm_full() -> None:
    k = k_layernorm()
    sch = Schedule(k)
    sch.align_all()
    sch.compute_inline("sq_3")
    sch.compute_inline("mean_1")
    sch.compute_inline("sub_2")
    sch.compute_at("var_5", "norm_6_sp")
    sch.compute_at("sum_4", "norm_6_sp")
    sch.compute_at("sum_0", "norm_6_sp")
    for t in ("S1", "S2", "V"):
        assert sch.kernel.buffer(t).scope == "register"
    sch.rfactor("sum_4", "sum_4_rb", 4)
    sch.vectorize("sum_4_rb_1")
    sch.parallel("norm_6_sp")
    check_same(k, sch.kernel, DIMS_LN)
    check_replay(k, sch)


def test_compute_at_errors() -> None:
    sch = Schedule(k_chain())
    sch.align_all()
    with raises("compute_at", "C__init"):
        sch.compute_at("C__init", "F_sp")
    with raises("compute_at", "C"):
        sch.compute_at("C", "F_rb")  # C's reduce loop would be identified with F_rb
    with raises("compute_at", "C"):
        sch.compute_at("C", "C_rb")  # own nest
    with raises("compute_at", "D"):
        sch.compute_at("D", "A_rb")  # D spans S1*S2 points, A_sp x A_rb S1*S2*8
    sch.compute_at("E", "F_sp")  # E keeps its rb loop, covering what F reads
    assert sch.kernel.buffer("E").shape == (Const(1), Const(1), Const(8))
    check_same(k_chain(), sch.kernel, DIMS_CH)
    with raises("compute_at", "D"):
        sch.compute_at("D", "E_rb")  # D spans S1*S2 points, E_sp x E_rb spans S1*S2*8
    # cross-iteration read: a consumer reading a shifted element of the producer
    k = k_eltwise(n=4, m=6)
    k.body[1] = ew(
        "add_1",
        "B",
        [4, 6],
        lambda v: Bin(
            "+", ld("A", [Bin("%", Bin("+", v[0], Const(1)), Const(4)), v[1]]), ld("Y", v)
        ),
    )
    sch3 = Schedule(k)
    with raises("compute_at", "mul_0"):
        sch3.compute_at("mul_0", "add_1_i0")
    assert format_kernel(sch3.kernel) == format_kernel(k)
    # a transposed read: A's rows are O's columns
    k = k_transpose()
    sch4 = Schedule(k)
    for lp in ("tr_1_i0", "tr_1_i1"):
        with raises("compute_at", "mul_0"):
            sch4.compute_at("mul_0", lp)
    with raises("reverse_compute_inline", "tr_1"):
        sch4.reverse_compute_inline("tr_1")
    # with A's loops swapped, one iteration of tr_1_i0 computes a whole column of A,
    # which covers everything O reads in it (the shifted read included)
    sch4.reorder(["mul_0_i1", "mul_0_i0"])
    sch4.compute_at("mul_0", "tr_1_i0")
    assert sch4.kernel.buffer("A").shape == (Const(4), Const(1))
    check_same(k, sch4.kernel, [{}])


# ---------------------------------------------------------------------------------
# parallel / vectorize / unroll
# ---------------------------------------------------------------------------------


def test_parallel_vectorize_unroll() -> None:
    k = k_eltwise(m=8)
    sch = Schedule(k)
    f = sch.fuse(["mul_0_i0", "mul_0_i1"])
    o, i = sch.split(f, [-1, 4])
    sch.parallel(o)
    sch.vectorize(i)
    sch.unroll("add_1_i1")
    sch.parallel("add_1_i0")
    assert sch.get_loop(o).kind == ForKind.PARALLEL
    assert sch.get_loop(i).kind == ForKind.VECTORIZED
    assert sch.get_loop("add_1_i1").kind == ForKind.UNROLLED
    assert "parallel for (mul_0_i0_mul_0_i1_fused_0" in str(sch)
    check_same(k, sch.kernel, DIMS_N)
    check_replay(k, sch)


def test_reduce_annotations() -> None:
    k = k_reduce(m=8)
    sch = Schedule(k)
    sch.parallel("sum_0_i0")
    with raises("vectorize", "sum_0"):
        sch.vectorize("sum_0_k0")  # float + without reassociation
    sch.vectorize("sum_0_k0", allow_reassoc=True)
    check_same(k, sch.kernel, DIMS_N)
    sch = Schedule(k_reduce(op="max"))
    sch.vectorize("sum_0_k0")  # max reassociates exactly


def test_interleave() -> None:
    """``interleave`` marks a vectorized loop (shown by the printer), replays, leaves the
    results alone, and ``factor=1`` clears it."""
    k = k_eltwise(m=8)
    sch = Schedule(k)
    sch.vectorize("mul_0_i1")
    sch.interleave("mul_0_i1", 4)
    assert sch.get_loop("mul_0_i1").interleave == 4
    assert "vectorized for (mul_0_i1, 0, 8) interleave(4)" in str(sch)
    assert "interleave(loop='mul_0_i1', factor=4)" in str(sch.trace)
    check_same(k, sch.kernel, DIMS_N)
    check_replay(k, sch)
    sch.interleave("mul_0_i1", 1)
    assert sch.get_loop("mul_0_i1").interleave == 1 and "interleave(" not in str(sch.kernel)


@pytest.mark.parametrize("factor", [0, 3, 32, -4, True, 2.0])
def test_interleave_errors(factor: object) -> None:
    sch = Schedule(k_eltwise(m=8))
    with raises("interleave", "mul_0"):
        sch.interleave("mul_0_i1", 4)  # not vectorized
    sch.vectorize("mul_0_i1")
    before = str(sch)
    with raises("interleave", "mul_0"):
        sch.interleave("mul_0_i1", factor)
    assert str(sch) == before and sch.get_loop("mul_0_i1").interleave == 1


def test_annotation_errors() -> None:
    sch = Schedule(k_reduce(m=100))
    with raises("parallel", "sum_0"):
        sch.parallel("sum_0_k0")  # carries the reduction
    with raises("vectorize", "sum_0"):
        sch.vectorize("sum_0_i0")  # not innermost
    with raises("unroll", "sum_0"):
        sch.unroll("sum_0_i0")  # symbolic extent
    with raises("unroll", "sum_0"):
        sch.unroll("sum_0_k0")  # 100 > 64
    sch.parallel("sum_0_i0")
    with raises("vectorize", "sum_0"):
        sch.vectorize("sum_0_i0")
    sch2 = Schedule(k_eltwise())
    sch2.parallel("mul_0_i0")
    with raises("parallel", "mul_0"):
        sch2.parallel("mul_0_i1")  # nested parallel
    # a store whose location does not determine the loop: two iterations collide
    k = Kernel(
        "bad", [buf("X", [4])], [buf("O", [2])], [], [ew("half", "O", [4], lambda v: ld("X", v))]
    )
    k.body[0].body[0].body[0] = Store(
        "O", (Bin("//", Var("vi0"), Const(2)),), ld("X", [Var("vi0")])
    )
    with raises("parallel", "half"):
        Schedule(k).parallel("half_i0")
    with raises("vectorize", "half"):
        Schedule(k).vectorize("half_i0")


# ---------------------------------------------------------------------------------
# trace
# ---------------------------------------------------------------------------------


def test_trace_text_and_replay() -> None:
    k = k_chain()
    sch = Schedule(k)
    sch.align_all()
    sch.split("F_rb", [-1, 4])
    sch.compute_inline("A")
    text = str(sch.trace)
    assert text.splitlines()[1] == "split(loop='F_rb', factors=[-1, 4]) -> ['F_rb_0', 'F_rb_1']"
    assert [s.primitive for s in sch.trace] == ["align_all", "split", "compute_inline"]
    replayed = sch.trace.replay(k)
    assert format_kernel(replayed.kernel) == format_kernel(sch.kernel)
    assert str(replayed.trace) == text
    assert isinstance(Trace().replay(k), Schedule)
    # the lowered kernel passed in is untouched
    assert format_kernel(k) == format_kernel(k_chain())


def test_lookups_agree_with_the_full_walks() -> None:
    """Blocks are listed in pre-order, and the located statement, its list and its loops
    are the first the walk over loops yields (also after the nests are reshaped)."""
    from geode.codegen.ast import walk_stmts
    from geode.codegen.schedule.blocks import find_in_loops, walk_loops

    sch = Schedule(k_layernorm())
    for step in (sch.align_all, lambda: sch.split(sch.get_loops(sch.blocks()[-1])[-1], [-1, 4])):
        step()
        body = sch.kernel.body
        assert ast_blocks(body) == [s for s in walk_stmts(body) if isinstance(s, Block)]
        walked = list(walk_loops(body))
        for s, cont, loops in walked:
            found = find_in_loops(body, lambda x, s=s: x is s)
            assert found is not None and found[0] is s and found[1] is cont
            assert found[2] == loops
        assert find_in_loops(body, lambda x: False) is None


def test_trace_records_arguments_by_name_whatever_the_call_shape() -> None:
    # positional, keyword and defaulted arguments are recorded alike, in parameter order
    shapes = [
        lambda s: s.split("F_rb", [-1, 4]),
        lambda s: s.split("F_rb", factors=[-1, 4]),
        lambda s: s.split(loop="F_rb", factors=[-1, 4]),
        lambda s: s.split(factors=[-1, 4], loop="F_rb"),
    ]
    for call in shapes:
        sch = Schedule(k_chain())
        sch.align_all()
        call(sch)
        assert list(sch.trace[1].args.items()) == [("loop", "F_rb"), ("factors", [-1, 4])]
    sch = Schedule(k_chain())
    block = sch.blocks()[0]
    sch.align(block)
    assert sch.trace[0].args == {"block": block, "reduce_axes": None}  # the default, applied
    sch = Schedule(k_chain())
    sch.align_all()
    with pytest.raises(TypeError):
        sch.split("F_rb", [-1, 4], loop="F_rb")  # bound twice
    with pytest.raises(TypeError):
        sch.split("F_rb")  # a missing argument
    with pytest.raises(TypeError):
        sch.split("F_rb", [-1, 4], size=2)  # no such parameter
    assert len(sch.trace) == 1


# ---------------------------------------------------------------------------------
# property: random split/fuse/reorder/parallel sequences preserve results
# ---------------------------------------------------------------------------------


def _random_kernel(shape: list[int | str], depth: int) -> Kernel:
    dims = sorted({d for d in shape if isinstance(d, str)})
    body: list[Stmt] = []
    temps: list[Buffer] = []
    src = "X"
    for i in range(depth):
        out = "O" if i == depth - 1 else f"T{i}"
        s = src
        body.append(
            ew(
                f"op{i}",
                out,
                shape,
                lambda v, s=s, i=i: Bin(
                    "+" if i % 2 else "*", ld(s, v), Bin("*", ld("X", v), f32(i + 1))
                ),
            )
        )
        if out != "O":
            temps.append(buf(out, shape, "local"))
        src = out
    return Kernel("rand", [buf("X", shape)], [buf("O", shape)], dims, body, temps)


@st.composite
def _programs(draw: st.DrawFn) -> tuple[list[int | str], int, list[tuple]]:
    rank = draw(st.integers(2, 3))
    shape: list[int | str] = [draw(st.sampled_from([1, 2, 3, 4, "N"])) for _ in range(rank)]
    depth = draw(st.integers(1, 3))
    ops = draw(
        st.lists(
            st.tuples(
                st.sampled_from(["split", "fuse", "reorder", "parallel", "inline"]),
                st.integers(0, 1000),
                st.integers(0, 1000),
                st.sampled_from([1, 2, 3]),
            ),
            max_size=8,
        )
    )
    return shape, depth, ops


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_programs())
def test_random_loop_transformations(prog: tuple[list[int | str], int, list[tuple]]) -> None:
    shape, depth, ops = prog
    k = _random_kernel(shape, depth)
    sch = Schedule(k)
    for op, a, b, fac in ops:
        blocks = sch.blocks()
        blk = blocks[a % len(blocks)]
        loops = sch.get_loops(blk)
        before = format_kernel(sch.kernel)
        try:
            if op == "split":
                sch.split(loops[a % len(loops)], [fac, -1] if b % 2 else [-1, fac])
            elif op == "fuse" and len(loops) >= 2:
                i = b % (len(loops) - 1)
                sch.fuse(loops[i : i + 2])
            elif op == "reorder" and len(loops) >= 2:
                perm = list(np.random.default_rng(b).permutation(len(loops)))
                sch.reorder([loops[p] for p in perm])
            elif op == "parallel":
                sch.parallel(loops[b % len(loops)])
            elif op == "inline":
                sch.compute_inline(blk)
        except ScheduleError:
            assert format_kernel(sch.kernel) == before  # failed primitives change nothing
    dims = [{"N": 1}, {"N": 5}]
    check_same(k, sch.kernel, dims)
    check_replay(k, sch)


# ---------------------------------------------------------------------------------
# property: any schedule the primitives accept preserves results
# ---------------------------------------------------------------------------------

_PRIMS = [
    "split",
    "fuse",
    "reorder",
    "align",
    "align_all",
    "inline",
    "rinline",
    "rfactor",
    "compute_at",
    "parallel",
    "vectorize",
    "unroll",
]


def _apply_random(sch: Schedule, op: str, a: int, b: int, c: int) -> None:
    """Apply ``op`` with arguments picked from the current schedule state by a, b, c
    (preferring arguments that can succeed, e.g. compute_at into a neighbour's nest)."""
    blocks = sch.blocks()
    blk = blocks[a % len(blocks)]
    loops = sch.get_loops(blk)
    lp = loops[b % len(loops)] if loops else "none"
    if op == "split":
        sch.split(lp, [-1, 1 + c % 4] if c % 2 else [1 + c % 3, -1])
    elif op == "fuse" and len(loops) >= 2:
        i = b % (len(loops) - 1)
        sch.fuse(loops[i : i + 2])
    elif op == "reorder" and len(loops) >= 2:
        perm = list(np.random.default_rng(c).permutation(len(loops)))
        sch.reorder([loops[p] for p in perm])
    elif op == "align":
        sch.align(blk, [len(sch.get_block(blk).iter_vars) - 1] if c % 2 else None)
    elif op == "align_all":
        sch.align_all()
    elif op == "inline":
        sch.compute_inline(blk)
    elif op == "rinline":
        sch.reverse_compute_inline(blk)
    elif op == "rfactor":
        reds = [n for n in blocks if any(iv.kind == "reduce" for iv in sch.get_block(n).iter_vars)]
        if reds:
            r = sch.get_block(reds[a % len(reds)])
            cands = [
                x.name
                for iv, x in zip(r.iter_vars, r.bindings)
                if iv.kind == "reduce" and isinstance(x, Var)
            ] or ["none"]
            sch.rfactor(r.name, cands[b % len(cands)], 1 + c % 4)
    elif op == "compute_at":
        near = sch.consumers(blk) + sch.producers(blk)
        if near:
            tl = sch.get_loops(near[b % len(near)])
            if tl:
                sch.compute_at(blk, tl[c % len(tl)])
    elif op == "parallel":
        sch.parallel(lp)
    elif op == "vectorize":
        sch.vectorize(loops[-1] if c % 3 and loops else lp, allow_reassoc=bool(c % 2))
    elif op == "unroll":
        sch.unroll(lp)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(["chain", "layernorm", "kmax", "reduce", "transpose", "eltwise"]),
    st.lists(
        st.tuples(
            st.sampled_from(_PRIMS), st.integers(0, 99), st.integers(0, 99), st.integers(0, 99)
        ),
        max_size=12,
    ),
)
def test_random_schedules_preserve_results(which: str, ops: list[tuple]) -> None:
    k, dims = {
        "chain": (k_chain(), DIMS_CH),
        "layernorm": (k_layernorm(), DIMS_LN),
        "kmax": (k_keepdims_max(), [{"N": 3}]),
        "reduce": (k_reduce(m=7), [{"N": 2}]),
        "transpose": (k_transpose(), [{}]),
        "eltwise": (k_eltwise(), [{"N": 3}]),
    }[which]
    sch = Schedule(k)
    for op, a, b, c in ops:
        before = format_kernel(sch.kernel)
        try:
            _apply_random(sch, op, a, b, c)
        except ScheduleError:
            assert format_kernel(sch.kernel) == before
    check_same(k, sch.kernel, dims, rtol=1e-4)
    check_replay(k, sch)


def test_compute_at_refuses_a_reduction_whose_init_loops_were_reordered() -> None:
    """Found by the property above: ``C``'s init with its loops swapped, then C (after an
    rfactor) computed at its partials' second loop. The init's loops would be identified
    position by position (flattened), so an iteration would zero another element than
    the one C accumulates into there: refused, the kernel unchanged; the same move with
    the init's loops in order is accepted and keeps the results."""
    for swapped in (True, False):
        k = k_chain()
        sch = Schedule(k)
        if swapped:
            sch.reorder(list(reversed(sch.get_loops("C__init"))))
        sch.rfactor("C", sch.get_block("C").bindings[2].name, 1)
        inner = sch.get_loops("C_rf")[1]
        before = format_kernel(sch.kernel)
        if swapped:
            with pytest.raises(ScheduleError, match="init C__init would not write"):
                sch.compute_at("C", inner)
            assert format_kernel(sch.kernel) == before
        else:
            sch.compute_at("C", inner)
            assert "C__init" in {x.name for x in ast_blocks(sch.get_loop(inner).body)}
        check_same(k, sch.kernel, DIMS_CH, rtol=1e-4)


# ---------------------------------------------------------------------------------
# reuse_output
# ---------------------------------------------------------------------------------


def _rb(name: str, loop: str, store: Store, predicate: Expr | None = None) -> Block:
    """A block of row ``i`` and column loop ``loop``: ``vi, vk = axis.bind(i, loop)``."""
    ivs = [IterVar("vi", Var("N")), IterVar("vk", Const(6))]
    return Block(name, ivs, [Var("i"), Var(loop)], [store], predicate=predicate)


VI, VK = Var("vi"), Var("vk")


def E() -> Block:
    """Writes the row buffer: T[0, vk] = exp(X[vi, vk])."""
    return _rb("E", "k0", Store("T", (Const(0), VK), Un("exp", ld("X", [VI, VK]))))


def D(loop: str = "k1") -> Block:
    """Scales the row buffer into the output: O[vi, vk] = T[0, vk] * 2."""
    return _rb("D", loop, Store("O", (VI, VK), Bin("*", ld("T", [Const(0), VK]), f32(2))))


def k_rowbuf(
    passes: list[list[Block]], temp: Buffer | None = None, outputs: Sequence[str] = ("O",)
) -> Kernel:
    """``for i in N``, then one loop ``k<p>`` over the 6 columns per pass (its blocks);
    T: local float32[1, 6] row buffer."""
    body = [For("i", Var("N"), [For(f"k{p}", Const(6), blocks) for p, blocks in enumerate(passes)])]
    return Kernel(
        "rowbuf",
        [buf("X", ["N", 6])],
        [buf(o, ["N", 6]) for o in outputs],
        ["N"],
        body,
        [temp or buf("T", [1, 6], "local")],
    )


def _accessed(k: Kernel) -> set[str]:
    out = set()
    for s in walk_stmts(k.body):
        if isinstance(s, Store):
            out.add(s.buffer)
        for e in stmt_exprs(s):
            out |= {x.buffer for x in walk(e) if isinstance(x, Load)}
    return out


def test_reuse_output_row_buffer() -> None:
    k = k_rowbuf([[E()], [D()]])
    sch = Schedule(k)
    assert sch.reuse_output("T", "D") is None
    assert [t.name for t in sch.kernel.temps] == [] and "T" not in _accessed(sch.kernel)
    assert sch.writers("O") == ["E", "D"] and sch.readers("O") == ["D"]
    text = str(sch)
    assert "O[vi, vk] = exp(X[vi, vk])" in text and "O[vi, vk] = O[vi, vk] * 2.0f" in text
    check_same(k, sch.kernel, DIMS_N)
    check_replay(k, sch)


def test_reuse_output_transposed_row_buffer() -> None:
    """T[vk, 0] (a column buffer): temp axis 0 becomes the output's column axis."""
    e = _rb("E", "k0", Store("T", (VK, Const(0)), Un("exp", ld("X", [VI, VK]))))
    d = _rb("D", "k1", Store("O", (VI, VK), Bin("*", ld("T", [VK, Const(0)]), f32(2))))
    k = k_rowbuf([[e], [d]], buf("T", [6, 1], "local"))
    sch = Schedule(k)
    sch.reuse_output("T", "D")
    assert "O[vi, vk] = exp(X[vi, vk])" in str(sch) and not sch.kernel.temps
    check_same(k, sch.kernel, DIMS_N)
    check_replay(k, sch)


def _reader(name: str, loop: str, src: str = "T") -> Block:
    """P[vi, vk] = src[...] + 1 (T read at the row buffer's index, O at the output's)."""
    idx = [Const(0), VK] if src == "T" else [VI, VK]
    return _rb(name, loop, Store("P", (VI, VK), Bin("+", ld(src, idx), f32(1))))


REUSE_ERRORS = {
    # ("what", kernel, temp, block, message fragment)
    "temp is an input": (lambda: k_rowbuf([[E()], [D()]]), "X", "D", "not a local temp"),
    "no such temp": (lambda: k_rowbuf([[E()], [D()]]), "nope", "D", "not a local temp"),
    "temp is a register": (
        lambda: k_rowbuf([[E()], [D()]], buf("T", [1, 6], "register")),
        "T",
        "D",
        "not a local temp",
    ),
    "no such block": (lambda: k_rowbuf([[E()], [D()]]), "T", "Z", "no such block"),
    "block stores the temp": (lambda: k_rowbuf([[E()], [D()]]), "T", "E", "exactly one kernel"),
    "block stores another temp": (
        lambda: k_rowbuf(
            [[E()], [_rb("D", "k1", Store("U", (Const(0), VK), ld("T", [Const(0), VK])))]]
        ),
        "T",
        "D",
        "exactly one kernel output",
    ),
    "dtypes differ": (
        lambda: k_rowbuf([[E()], [D()]], buf("T", [1, 6], "local", "float64")),
        "T",
        "D",
        "different dtypes",
    ),
    "output read by another block": (
        lambda: k_rowbuf([[E()], [D()], [_reader("G", "k2", "O")]], outputs=("O", "P")),
        "T",
        "D",
        "another block accesses O",
    ),
    "output written by another block": (
        lambda: k_rowbuf([[_rb("W", "k0", Store("O", (VI, VK), ld("X", [VI, VK]))), E()], [D()]]),
        "T",
        "D",
        "another block accesses O",
    ),
    "temp read after the block": (
        lambda: k_rowbuf([[E()], [D()], [_reader("F", "k2")]], outputs=("O", "P")),
        "T",
        "D",
        "F accesses T after it",
    ),
    "temp read at two indices": (
        lambda: k_rowbuf(
            [
                [E()],
                [
                    _rb(
                        "D",
                        "k1",
                        Store(
                            "O",
                            (VI, VK),
                            Bin(
                                "+",
                                ld("T", [Const(0), VK]),
                                ld("T", [Const(0), Bin("-", Const(5), VK)]),
                            ),
                        ),
                    )
                ],
            ]
        ),
        "T",
        "D",
        "exactly one index",
    ),
    "another accessor in the block's loop": (
        lambda: k_rowbuf([[E()], [_reader("F", "k1"), D()]], outputs=("O", "P")),
        "T",
        "D",
        "F shares a loop with it",
    ),
    "broadcast read of the temp": (
        lambda: k_rowbuf(
            [[E()], [_rb("D", "k1", Store("O", (VI, VK), ld("T", [Const(0), Const(0)])))]]
        ),
        "T",
        "D",
        "has no match",
    ),
    "extents differ": (
        lambda: k_rowbuf(
            [
                [_rb("E", "k0", Store("T", (Const(0), VK), ld("X", [VI, VK])))],
                [_rb("D", "k1", Store("O", (VI, VK), ld("T", [Const(0), VK])))],
            ],
            buf("T", [1, 8], "local"),
        ),
        "T",
        "D",
        "differ",
    ),
}


def refused(call: Callable[[], object], prim: str, block: str, msg: str) -> None:
    """``call()`` raises ScheduleError naming the primitive, the block and ``msg``."""
    with pytest.raises(ScheduleError) as info:
        call()
    text = str(info.value)
    assert f"schedule primitive '{prim}' on block '{block}'" in text and msg in text, text


@pytest.mark.parametrize("what", sorted(REUSE_ERRORS))
def test_reuse_output_errors_leave_the_kernel(what: str) -> None:
    make, temp, block, msg = REUSE_ERRORS[what]
    sch = Schedule(make())
    before = format_kernel(sch.kernel)
    refused(lambda: sch.reuse_output(temp, block), "reuse_output", block, msg)
    assert format_kernel(sch.kernel) == before and len(sch.trace) == 0


def test_reuse_output_shared_loop_with_a_shifted_read() -> None:
    """E: T[0, k] = exp(X[i, k]); F: P[i, k] = T[0, k - 1] (k >= 1); D: O[i, k] = T[0, k] * 2,
    all in one loop: reuse_output must refuse, or keep P (F would read O[i, k - 1], which
    D has already scaled)."""
    f = _rb("F", "k0", Store("P", (VI, VK), ld("T", [Const(0), Bin("-", VK, Const(1))])))
    f.predicate = Bin(">=", VK, Const(1))
    k = k_rowbuf([[E(), f, D("k0")]], outputs=("O", "P"))
    sch = Schedule(k)
    try:
        sch.reuse_output("T", "D")
    except ScheduleError:
        return
    dims = {"N": 2}
    arrays = _inputs(k, dims)
    want, got = run_kernel(k, arrays, dims), run_kernel(sch.kernel, arrays, dims)
    np.testing.assert_allclose(got["P"][:, 1:], want["P"][:, 1:], rtol=1e-6)


def test_reuse_output_in_one_shared_loop() -> None:
    """Writer and block in the same loop, same element: legal, results kept."""
    k = k_rowbuf([[E(), D("k0")]])
    sch = Schedule(k)
    sch.reuse_output("T", "D")
    assert not sch.kernel.temps
    check_same(k, sch.kernel, DIMS_N)


# the default softmax schedule (reuse_output is its last step for small rows)


def _lowered(example: str, **kw: int) -> tuple:
    from lowering_check import prepare

    from geode import examples
    from geode.codegen.lower import lower_group

    g, plan = prepare(examples.ALL[example](**kw).graph)
    (group,) = plan.groups
    return lower_group(group, g, example), group


def _pipelining_schedule(lk, group) -> Schedule:
    """The default schedule with every host pass cheap enough to pipeline (softmax's exp
    pass is not, by default: see autoschedule.Choices.pipeline_max_host_ops)."""
    from geode.codegen import autoschedule

    tuning = autoschedule.Choices(pipeline_max_host_ops=1000)
    return autoschedule.schedule_group(lk, group, tuning=tuning)


def _until(lk, group, primitive: str) -> tuple[Schedule, TraceStep]:
    """The default schedule (pipelining every long row loop) replayed up to (not
    including) its ``primitive`` step."""
    steps = list(_pipelining_schedule(lk, group).trace)
    i = next(i for i, s in enumerate(steps) if s.primitive == primitive)
    return Trace(steps[:i]).replay(lk.kernel), steps[i]


def _softmax_ref(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.numba
def test_reuse_output_on_the_default_softmax_schedule() -> None:
    from geode.codegen.autoschedule import schedule_group
    from geode.codegen.backends import numba as nb

    lk, group = _lowered("softmax", hidden=64)
    sch, step = _until(lk, group, "reuse_output")
    temp, block = step.args["temp"], step.args["block"]
    assert step.args["block"] == "softmax_div" and temp.startswith("softmax_exp_")
    assert sch.kernel.buffer(temp).scope == "local" and temp in _accessed(sch.kernel)
    ref_kernel = sch.kernel
    sch.reuse_output(temp, block)
    assert temp not in {t.name for t in sch.kernel.temps} and temp not in _accessed(sch.kernel)
    assert {t.scope for t in sch.kernel.temps} == {"register"}
    assert sch.writers("y") == ["softmax_exp", "softmax_div"]
    assert format_kernel(sch.kernel) == format_kernel(schedule_group(lk, group).kernel)
    check_replay(lk.kernel, sch)
    rng = np.random.default_rng(3)
    native = nb.compile_kernel(sch.kernel)
    for n in (1, 3):
        x = (rng.standard_normal((n, 64)) * 4).astype(np.float32)
        want = _softmax_ref(x.astype(np.float64))
        got = run_kernel(sch.kernel, {"x": x}, {"N": n})["y"]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(got, run_kernel(ref_kernel, {"x": x}, {"N": n})["y"], rtol=1e-6)
        y = np.full((n, 64), np.nan, np.float32)
        native(x, y, n)
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-7)


def test_reuse_output_refusals_on_softmax() -> None:
    lk, group = _lowered("softmax", hidden=64)
    sch, step = _until(lk, group, "reuse_output")
    temp = step.args["temp"]
    before, steps = format_kernel(sch.kernel), len(sch.trace)
    for t, b, msg in [
        ("softmax_reducesum_5", "softmax_div", "not a local temp"),  # a register
        (temp, "softmax_reducesum", "exactly one kernel output"),  # stores a register
        (temp, "softmax_exp", "exactly one kernel output"),  # stores the temp itself
        (temp, "softmax_reducemax", "exactly one kernel output"),
    ]:
        refused(lambda t=t, b=b: sch.reuse_output(t, b), "reuse_output", b, msg)
        assert format_kernel(sch.kernel) == before
    assert len(sch.trace) == steps


# ---------------------------------------------------------------------------------
# Prefetch and prefetch_next
# ---------------------------------------------------------------------------------


def test_prefetch_statement_prints_and_lists_its_offset() -> None:
    off = Bin("+", Bin("*", Bin("+", Var("i"), Const(1)), Var("M")), Var("p"))
    pf = Prefetch("X", off)
    assert format_stmts([pf]) == "prefetch(X, (i + 1) * M + p)"
    assert format_stmts([pf], "  ") == "  prefetch(X, (i + 1) * M + p)"
    assert stmt_exprs(pf) == [off]
    loop = For("p", Const(4), [pf])
    assert list(walk_stmts([loop]))[-1] is pf
    assert "prefetch(X, (i + 1) * M + p)" in format_stmts([loop])


def _with_prefetch(k: Kernel, buffer: str, offset: Expr) -> Kernel:
    """``k`` with ``prefetch(buffer, offset)`` at the top of its first loop's body."""
    k2 = copy.deepcopy(k)
    k2.body[0].body.insert(0, Prefetch(buffer, offset))
    return k2


def test_prefetch_is_a_no_op_for_ast_eval() -> None:
    k = k_rowbuf([[E()], [D()]])
    far = Bin("+", Bin("*", Var("i"), Const(10**9)), Const(7))  # far out of bounds: harmless
    for off in (Bin("*", Var("i"), Const(6)), far):
        k2 = _with_prefetch(k, "X", off)
        assert "prefetch(X, " in format_kernel(k2)
        check_same(k, k2, DIMS_N)
    with pytest.raises(KernelEvalError, match="unknown buffer 'nope'"):
        run_kernel(_with_prefetch(k, "nope", Const(0)), _inputs(k, {"N": 2}), {"N": 2})


def _prefetches(k: Kernel) -> list[Prefetch]:
    return [s for s in walk_stmts(k.body) if isinstance(s, Prefetch)]


def _prefetched_lines(k: Kernel, loop: str, dims: dict[str, int], n: int) -> dict[int, list[int]]:
    """Per iteration of ``loop``: the offsets its prefetch loop touches (evaluated)."""
    (f,) = [s for s in walk_stmts(k.body) if isinstance(s, For) and s.var == loop]
    (guard,) = [s for s in f.body if isinstance(s, If)]
    (pl,) = guard.body
    (pf,) = pl.body
    out = {}
    for i in range(n):
        env = {**dims, loop: i}
        if not eval_shape((guard.cond,), env)[0]:
            out[i] = []
            continue
        (trips,) = eval_shape((pl.extent,), env)
        out[i] = [eval_shape((pf.offset,), {**env, pl.var: p})[0] for p in range(trips)]
    return out


@pytest.mark.parametrize("distance", [1, 2, 3])
@pytest.mark.parametrize(
    "shape,dtype,line",
    [(["N", 6], F32, 16), (["N", "M"], F32, 16), (["N", 3, "M"], "float64", 8)],
)
def test_prefetch_next_touches_every_line_of_the_next_row(shape, dtype, line, distance) -> None:
    """Each row i prefetches every line of row i + distance, and nothing past the last."""
    n = 5
    dims = {"N": n, "M": 37}
    sizes = [dims.get(d, d) if isinstance(d, str) else d for d in shape]
    row = int(np.prod(sizes[1:]))
    dim_names = [d for d in shape if isinstance(d, str)]
    rest = [_dim(d) for d in shape[1:]]
    ivs = [IterVar("vi", Var("N"))] + [IterVar(f"vj{j}", e) for j, e in enumerate(rest)]
    idx = [Var(iv.name) for iv in ivs]

    def nest(name: str, store: Store) -> Stmt:
        """One walk over row i: loops name0.. over the trailing axes."""
        binds = [Var("i")] + [Var(f"{name}{j}") for j in range(len(rest))]
        body: Stmt = Block(name, ivs, binds, [store])
        for j in reversed(range(len(rest))):
            body = For(f"{name}{j}", rest[j], [body])
        return body

    # pass a: O = X * 2, pass b: O = O + X (two walks over each row of X)
    p1 = nest("a", Store("O", tuple(idx), Bin("*", ld("X", idx), Const(2.0, dtype))))
    p2 = nest("b", Store("O", tuple(idx), Bin("+", ld("O", idx), ld("X", idx))))
    k = Kernel(
        "rows",
        [Buffer("X", dtype, tuple(_dim(d) for d in shape), "global")],
        [Buffer("O", dtype, tuple(_dim(d) for d in shape), "global")],
        dim_names,
        [For("i", Var("N"), [p1, p2], ForKind.PARALLEL)],
    )
    sch = Schedule(k)
    var = sch.prefetch_next("i", "X", distance=distance)
    assert var == "i_pf"
    body = sch.get_loop("i").body
    assert [type(s).__name__ for s in body] == ["For", "If", "For"]  # after the first pass
    (pf,) = _prefetches(sch.kernel)
    assert pf.buffer == "X"
    assert sch.get_loop(var).kind == ForKind.SERIAL
    lines = _prefetched_lines(sch.kernel, "i", dims, n)
    for i in range(n):
        ahead = i + distance
        want = list(range(ahead * row, (ahead + 1) * row, line)) if ahead < n else []
        assert lines[i] == want, i  # [] where no row is that far ahead
    assert "prefetch(X, " in str(sch)
    check_same(k, sch.kernel, [{"N": 1, "M": 3}, {"N": 3, "M": 37}])
    check_replay(k, sch)


def _two_pass(n: int | str = "N", m: int = 6) -> Kernel:
    """for i: [for k0: O = X * 2] [for k1: O = O + Y]  (X, Y: float32[N, m])."""
    a = _rb("A", "k0", Store("O", (VI, VK), Bin("*", ld("X", [VI, VK]), f32(2))))
    b = _rb("B", "k1", Store("O", (VI, VK), Bin("+", ld("O", [VI, VK]), ld("Y", [VI, VK]))))
    for blk in (a, b):
        blk.iter_vars[1] = IterVar("vk", Const(m))
    body = [For("i", _dim(n), [For("k0", Const(m), [a]), For("k1", Const(m), [b])])]
    return Kernel("two_pass", [buf("X", [n, m]), buf("Y", [n, m])], [buf("O", [n, m])], ["N"], body)


def _one_loop_kernel(value: Callable[[list[Expr]], Expr], shape=("N", 6)) -> Kernel:
    return Kernel("ew", [buf("X", shape)], [buf("O", shape)], ["N"], [ew("m", "O", shape, value)])


PREFETCH_ERRORS = {
    "output": (_two_pass, "i", "O", "not a kernel input"),
    "temp": (lambda: k_rowbuf([[E()], [D()]]), "i", "T", "not a kernel input"),
    "unknown": (_two_pass, "i", "nope", "not a kernel input"),
    "not read in the loop": (
        lambda: k_eltwise(),
        "mul_0_i0",
        "Y",
        "not read inside loop mul_0_i0",
    ),
    "first index not the loop": (lambda: k_eltwise(), "mul_0_i1", "X", "first index does not"),
    "no inner loop": (
        lambda: _one_loop_kernel(lambda v: ld("X", v), ("N",)),
        "m_i0",
        "X",
        "holds no pass",
    ),
    "different rows": (
        lambda: _one_loop_kernel(
            lambda v: Bin(
                "+", ld("X", v), ld("X", [Bin("%", Bin("+", v[0], Const(1)), Var("N")), v[1]])
            )
        ),
        "m_i0",
        "X",
        "different rows",
    ),
    "trailing index on the loop": (
        lambda: _one_loop_kernel(
            lambda v: Bin(
                "+", ld("X", v), ld("X", [v[0], Bin("%", Bin("+", v[0], v[1]), Const(6))])
            )
        ),
        "m_i0",
        "X",
        "trailing indices depend",
    ),
    "no such loop": (_two_pass, "zz", "X", "no loop with variable 'zz'"),
}


@pytest.mark.parametrize("what", sorted(PREFETCH_ERRORS))
def test_prefetch_next_errors_leave_the_kernel(what: str) -> None:
    make, loop, buffer, msg = PREFETCH_ERRORS[what]
    sch = Schedule(make())
    before = format_kernel(sch.kernel)
    if "no loop with variable" in msg:
        with pytest.raises(ScheduleError, match="'reads_rows'"):
            sch.reads_rows(loop, buffer)
    elif "holds no pass" not in msg:  # a buffer prefetch_next refuses is not read by rows
        assert not sch.reads_rows(loop, buffer)
    with pytest.raises(ScheduleError, match="'prefetch_next'") as info:
        sch.prefetch_next(loop, buffer)
    assert msg in str(info.value)
    assert format_kernel(sch.kernel) == before and len(sch.trace) == 0


@pytest.mark.numba
def test_prefetch_next_two_inputs_and_numba() -> None:
    from geode.codegen.backends import numba as nb

    k = _two_pass()
    sch = Schedule(k)
    sch.parallel("i")
    steps, before = len(sch.trace), format_kernel(sch.kernel)
    assert sch.reads_rows("i", "X") and sch.reads_rows("i", "Y")
    assert not sch.reads_rows("i", "O")  # an output
    assert len(sch.trace) == steps and format_kernel(sch.kernel) == before  # a query only
    assert sch.prefetch_next("i", "X") == "i_pf"
    assert sch.prefetch_next("i", "Y") == "i_pf_1"
    assert [p.buffer for p in _prefetches(sch.kernel)] == ["Y", "X"]  # each right after k0
    check_same(k, sch.kernel, DIMS_N)
    check_replay(k, sch)
    src = nb.emit_source(sch.kernel)
    assert src.count("_g_prefetch(") == 2
    assert "_g_prefetch(X, " in src and "_g_prefetch(Y, " in src
    assert "if i + 1 < N:" in src
    native = nb.compile_kernel(sch.kernel)
    for n in (1, 2, 5):
        x, y = _inputs(k, {"N": n}, n).values()
        o = np.empty((n, 6), np.float32)
        native(x, y, o, n)
        np.testing.assert_array_equal(o, x * np.float32(2) + y)


@pytest.mark.numba
def test_numba_prefetch_past_the_end_and_errors() -> None:
    """A prefetch never faults (no guard: the last row prefetches beyond the array);
    prefetching a temporary is a codegen error."""
    from geode.codegen.backends import numba as nb
    from geode.errors import CodegenError

    k = _two_pass()
    off = Bin("*", Bin("+", Var("i"), Const(1)), Const(6 * 1024))
    k2 = _with_prefetch(k, "X", off)
    native = nb.compile_kernel(k2)
    assert "_g_prefetch(X, (i + 1) * 6144)" in native.source
    x, y = _inputs(k, {"N": 3}).values()
    o = np.empty((3, 6), np.float32)
    native(x, y, o, 3)
    np.testing.assert_array_equal(o, x * np.float32(2) + y)
    with pytest.raises(CodegenError, match="prefetch of non-argument 'T'"):
        nb.emit_source(_with_prefetch(k_rowbuf([[E()], [D()]]), "T", Const(0)))


def test_prefetch_prints_its_cache_level() -> None:
    pf = Prefetch("X", Bin("*", Var("i"), Const(8)), level=2)
    assert format_stmts([pf]) == "prefetch(X, i * 8, L2)"
    assert format_stmts([Prefetch("X", Const(0))]) == "prefetch(X, 0)"  # level 1


@pytest.mark.parametrize("m,chunk", [(1024, 256), (1000, 256), (96, 64), (48, 16)])
@pytest.mark.numba
def test_prefetch_next_spread_over_a_chunked_pass(m: int, chunk: int) -> None:
    """Spread over the chunks of the second pass, the prefetch touches every line of the
    next row once, each chunk a consecutive share, and at most one share past the row."""
    from geode.codegen.backends import numba as nb

    k = _two_pass(m=m)
    sch = Schedule(k)
    sch.parallel("i")
    outer, inner = sch.split("k1", [None, chunk])
    sch.vectorize(inner, allow_reassoc=False)
    var = sch.prefetch_next("i", "X", spread=outer, level=2)
    (pf,) = _prefetches(sch.kernel)
    assert pf.level == 2 and "prefetch(X, " in str(sch) and ", L2)" in str(sch)
    host = sch.get_loop(outer)
    guard = host.body[-1]
    assert isinstance(guard, If) and guard.body[0].var == var
    chunks = -(-m // chunk)
    lines = -(-m // 16)
    share = -(-lines // chunks)
    n = 3
    for i in range(n):
        touched = []
        for c in range(chunks):
            env = {"N": n, "i": i, outer: c}
            if not eval_shape((guard.cond,), env)[0]:
                continue
            (trips,) = eval_shape((guard.body[0].extent,), env)
            got = [eval_shape((pf.offset,), {**env, var: p})[0] for p in range(trips)]
            assert got == list(range(((i + 1) * m) + c * share * 16, got[-1] + 1, 16))
            touched += got
        if i == n - 1:
            assert touched == []  # no next row
            continue
        row = list(range((i + 1) * m, (i + 2) * m, 16))
        assert touched[: len(row)] == row and len(touched) == len(set(touched))
        assert len(touched) - len(row) < share
    check_same(k, sch.kernel, DIMS_N)
    check_replay(k, sch)
    native = nb.compile_kernel(sch.kernel)
    assert native.source.count("_g_prefetch_l2(X, ") == 1 and "_g_prefetch(" not in native.source
    x, y = _inputs(k, {"N": 4}).values()
    o = np.empty((4, m), np.float32)
    native(x, y, o, 4)
    np.testing.assert_array_equal(o, x * np.float32(2) + y)


def _spread_case(what: str) -> tuple[Schedule, dict]:
    """A chunked two-pass schedule and prefetch_next arguments that fail ``what``."""
    sch = Schedule(_two_pass(m=64))
    outer, inner = sch.split("k1", [None, 16])
    kw: dict = {"spread": outer, "level": 2}
    if what == "level":
        kw["level"] = 3
    elif what == "at_start":
        kw["at_start"] = True
    elif what == "nested":
        kw["spread"] = inner
    elif what == "vectorized":
        sch.vectorize("k0")
        kw["spread"] = "k0"
    elif what == "extent":
        sch.get_loop(outer).extent = Bin("+", Var("i"), Const(1))
    elif what == "distance":
        kw["distance"] = 0
    elif what == "bool distance":
        kw["distance"] = True
    return sch, kw


SPREAD_ERRORS = {
    "level": "cache level 3 is not 1 or 2",
    "at_start": "spread and at_start exclude each other",
    "nested": "k1_1 is not a loop directly in i's body",
    "vectorized": "loop k0 is vectorized, not serial",
    "extent": "loop k1_0's extent is not over dims only",
    "distance": "distance 0 is not an int >= 1",
    "bool distance": "distance True is not an int >= 1",
}


@pytest.mark.parametrize("what", sorted(SPREAD_ERRORS))
def test_prefetch_next_spread_and_level_errors(what: str) -> None:
    sch, kw = _spread_case(what)
    before = format_kernel(sch.kernel)
    steps = len(sch.trace)
    with pytest.raises(ScheduleError, match="'prefetch_next'") as info:
        sch.prefetch_next("i", "X", **kw)
    assert SPREAD_ERRORS[what] in str(info.value)
    assert format_kernel(sch.kernel) == before and len(sch.trace) == steps


@pytest.mark.numba
def test_numba_prefetch_level_must_be_known() -> None:
    from geode.codegen.backends import numba as nb
    from geode.errors import CodegenError

    k2 = _with_prefetch(_two_pass(), "X", Const(0))
    k2.body[0].body[0].level = 3
    with pytest.raises(CodegenError, match="prefetch to cache level 3"):
        nb.emit_source(k2)


@pytest.mark.parametrize("hidden,piped", [(64, False), (1023, False), (1024, True), (4096, True)])
def test_default_row_reduce_schedule_pipelines_long_rows(hidden: int, piped: bool) -> None:
    """Rows of 1024+ elements are pipelined when the host pass is cheap enough; softmax's
    exp pass is not by default (it is cut into chunks carrying the next row's prefetch),
    so the threshold is lifted here to check the structure pipelining gives it."""
    from geode.codegen.autoschedule import choices, schedule_group

    assert choices().prefetch_min_row == 1024
    lk, group = _lowered("softmax", hidden=hidden)
    plain = [s.primitive for s in schedule_group(lk, group).trace]
    assert "software_pipeline" not in plain
    assert plain.count("prefetch_next") == int(piped)  # rows of 1024 and 4096: 512k
    sch = _pipelining_schedule(lk, group)
    assert sch.level == "full"
    prims = [s.primitive for s in sch.trace]
    assert prims.count("software_pipeline") == int(piped)
    assert "prefetch_next" not in prims and not _prefetches(sch.kernel)
    if piped:
        (chunks,) = [s for s in sch.kernel.body if isinstance(s, For)]
        assert chunks.kind == ForKind.PARALLEL
        # prologue: the first row's max; then the row loop
        kinds = [type(s).__name__ for s in chunks.body]
        assert kinds == ["Block", "For", "For"]
        rows = chunks.body[-1]
        # the next row's max runs inside the exp pass (the first pass writing y)
        host = [s for s in rows.body if isinstance(s, For)][0]
        names = [b.name for b in host.body]
        assert names == ["softmax_exp", "softmax_reducesum", "softmax_reducemax"]
        check_replay(lk.kernel, sch)
        rng = np.random.default_rng(5)
        for n in (1, 9, 17) if hidden <= 1024 else (3,):
            x = rng.standard_normal((n, hidden)).astype(np.float32)
            got = run_kernel(sch.kernel, {"x": x}, {"N": n})["y"]
            np.testing.assert_allclose(
                got, _softmax_ref(x.astype(np.float64)), rtol=1e-5, atol=1e-8
            )


def _before_pipeline(example: str, hidden: int = 1024) -> tuple[Schedule, TraceStep]:
    lk, group = _lowered(example, hidden=hidden)
    return _until(lk, group, "software_pipeline")


def _rows_equal(a: Kernel, b: Kernel, hidden: int, sizes: Sequence[int]) -> None:
    rng = np.random.default_rng(11)
    for n in sizes:
        feeds = {"x": rng.standard_normal((n, hidden)).astype(np.float32)}
        for buf in a.inputs[1:]:
            feeds[buf.name] = rng.standard_normal(hidden).astype(np.float32)
        got = run_kernel(a, feeds, {"N": n})
        want = run_kernel(b, feeds, {"N": n})
        for k in want:
            np.testing.assert_array_equal(got[k], want[k], err_msg=f"N={n} {k}")


@pytest.mark.parametrize("example", ["rmsnorm", "softmax", "layernorm"])
@pytest.mark.parametrize("chunk,min_chunks", [(64, 8), (3, 1), (1, 1), (5, 2)])
def test_software_pipeline_keeps_results(example: str, chunk: int, min_chunks: int) -> None:
    sch, step = _before_pipeline_any(example, 16)
    before = copy.deepcopy(sch.kernel)
    outer, inner = sch.software_pipeline(step.args["loop"], chunk, min_chunks, step.args["into"])
    assert [outer, inner] == [f"{step.args['loop']}_o", f"{step.args['loop']}_i"]
    assert sch.get_loop(outer).kind == ForKind.PARALLEL
    assert sch.get_loop(inner).kind == ForKind.SERIAL
    # the first pass runs once per chunk as a prologue, then inside the host pass
    assert sum(b.endswith("_pro") for b in sch.blocks()) >= 2
    _rows_equal(sch.kernel, before, 16, (0, 1, 2, 3, 7, 8, 13))
    replayed = Trace([sch.trace[-1]]).replay(before)
    assert format_kernel(replayed.kernel) == format_kernel(sch.kernel)


def test_software_pipeline_chunk_folds_for_static_rows_and_is_symbolic_otherwise() -> None:
    sch, step = _before_pipeline("rmsnorm", 1024)
    static = copy.deepcopy(sch)
    outer, _ = sch.software_pipeline(step.args["loop"], 64, 8)
    text = format_kernel(sch.kernel)
    c = "max(1, min(64, N // 8))"
    assert f"parallel for ({outer}, 0, (N + ({c} - 1)) // {c})" in text
    assert f"serial for (mul_sp_i, 0, min({c}, N - mul_sp_o * {c}))" in text
    # 100 static rows: chunks of 100 // 8 = 12 rows, 9 chunks (the last of 4 rows)
    static.get_loop(step.args["loop"]).extent = Const(100)
    static.software_pipeline(step.args["loop"], 64, 8)
    text = format_kernel(static.kernel)
    assert "parallel for (mul_sp_o, 0, 9)" in text
    assert "serial for (mul_sp_i, 0, min(12, 100 - mul_sp_o * 12))" in text
    # a copy of the sum of squares at the top of each row, read by the last pass
    assert "reducemean_2_sum_cur[] = reducemean_2_sum[]" in text
    reg = sch.kernel.buffer("reducemean_2_sum_cur")
    assert reg.scope == "register" and reg.shape == ()


@given(
    n=st.integers(0, 40),
    hidden=st.sampled_from([3, 16, 33]),
    chunk=st.integers(1, 70),
    min_chunks=st.integers(1, 9),
    example=st.sampled_from(["rmsnorm", "softmax", "layernorm"]),
)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_software_pipeline_random_rows_and_chunks(n, hidden, chunk, min_chunks, example) -> None:
    if (example, hidden) not in _PIPE_CACHE:
        _PIPE_CACHE[example, hidden] = _before_pipeline_any(example, hidden)
    sch, step = _PIPE_CACHE[example, hidden]
    sch = copy.deepcopy(sch)
    before = copy.deepcopy(sch.kernel)
    sch.software_pipeline(step.args["loop"], chunk, min_chunks, step.args["into"])
    _rows_equal(sch.kernel, before, hidden, (n,))


_PIPE_CACHE: dict = {}


def _before_pipeline_any(example: str, hidden: int) -> tuple[Schedule, TraceStep]:
    """The default schedule up to its row loop's pipelining; for rows too short to be
    pipelined by default, the same step is made up (the primitive does not care)."""
    from geode.codegen.autoschedule import pipeline_host

    lk, group = _lowered(example, hidden=hidden)
    steps = list(_pipelining_schedule(lk, group).trace)
    pre = [s for s in steps if s.primitive not in ("software_pipeline", "prefetch_next")]
    sch = Trace(pre).replay(lk.kernel)
    (row,) = [s for s in sch.kernel.body if isinstance(s, For)]
    host = pipeline_host(sch, row.var)
    return sch, TraceStep("software_pipeline", {"loop": row.var, "into": host})


def test_software_pipeline_refuses_and_leaves_the_kernel_alone() -> None:
    sch, step = _before_pipeline("softmax")
    loop = step.args["loop"]
    before = format_kernel(sch.kernel)
    (row,) = [s for s in sch.kernel.body if isinstance(s, For)]
    passes = [s for s in row.body if isinstance(s, For)]
    with pytest.raises(ScheduleError, match="no pass 'nope' follows the first pass"):
        sch.software_pipeline(loop, into="nope")
    with pytest.raises(ScheduleError, match="no pass .* follows the first pass"):
        sch.software_pipeline(loop, into=passes[0].var)  # the first pass cannot host itself
    with pytest.raises(ScheduleError, match="is vectorized"):
        sch.software_pipeline(passes[0].var)
    with pytest.raises(ScheduleError, match="chunk and min_chunks must be positive"):
        sch.software_pipeline(loop, chunk=0)
    assert format_kernel(sch.kernel) == before
    assert not [t for t in sch.trace if t.primitive == "software_pipeline"]


def _edited(example: str, edit: Callable[[For, list[For]], None]) -> Schedule:
    sch, _ = _before_pipeline(example)
    (row,) = [s for s in sch.kernel.body if isinstance(s, For)]
    edit(row, [s for s in row.body if isinstance(s, For)])
    return sch


def test_software_pipeline_requires_a_first_pass_over_inputs_into_registers() -> None:
    def read_output(row: For, passes: list[For]) -> None:
        (b,) = passes[0].body
        (st_,) = b.body
        st_.value = transform(
            st_.value,
            lambda e: Load("y", e.indices) if isinstance(e, Load) and e.buffer == "x" else None,
        )

    sch = _edited("rmsnorm", read_output)
    with pytest.raises(ScheduleError, match=r"the first pass reads \['y'\], not inputs"):
        sch.software_pipeline(sch.kernel.body[0].var)

    def write_register_later(row: For, passes: list[For]) -> None:
        (b,) = passes[-1].body
        b.body.append(Store("reducemean_2_sum", (), Const(0.0, "float32")))

    sch = _edited("rmsnorm", write_register_later)
    with pytest.raises(ScheduleError, match=r"a later pass writes \['reducemean_2_sum'\]"):
        sch.software_pipeline(sch.kernel.body[0].var)

    def one_pass(row: For, passes: list[For]) -> None:
        row.body[:] = [s for s in row.body if s is not passes[-1]]

    sch = _edited("rmsnorm", one_pass)
    with pytest.raises(ScheduleError, match="does not end with a pass"):
        sch.software_pipeline(sch.kernel.body[0].var)


def test_software_pipeline_refuses_a_first_pass_writing_a_row_buffer() -> None:
    k = k_rowbuf([[E()], [D()]])
    sch = Schedule(k)
    (row,) = [s for s in sch.kernel.body if isinstance(s, For)]
    with pytest.raises(ScheduleError, match="not registers"):
        sch.software_pipeline(row.var)


# ---------------------------------------------------------------------------------
# defer_last_pass: softmax's streamed scale pass runs inside the next row's exp pass
# ---------------------------------------------------------------------------------


def _before_defer(hidden: int = 1024) -> tuple[Schedule, TraceStep]:
    """Softmax's default schedule, streamed, replayed up to its ``defer_last_pass``."""
    from geode.codegen.autoschedule import schedule_group

    lk, group = _lowered("softmax", hidden=hidden)
    steps = list(schedule_group(lk, group, stream_min_bytes=0).trace)
    i = next(i for i, s in enumerate(steps) if s.primitive == "defer_last_pass")
    return Trace(steps[:i]).replay(lk.kernel), steps[i]


_DEFER_CACHE: dict = {}


def _deferrable() -> tuple[Schedule, TraceStep]:
    if not _DEFER_CACHE:
        _DEFER_CACHE["softmax"] = _before_defer()
    sch, step = _DEFER_CACHE["softmax"]
    return copy.deepcopy(sch), step


@pytest.mark.parametrize("chunk,min_chunks", [(64, 8), (3, 1), (1, 1), (5, 2), (2, 3)])
def test_defer_last_pass_keeps_results(chunk: int, min_chunks: int) -> None:
    sch, step = _deferrable()
    loop, into = step.args["loop"], step.args["into"]
    before = copy.deepcopy(sch.kernel)
    outer, inner = sch.defer_last_pass(loop, into, chunk, min_chunks)
    assert [outer, inner] == [f"{loop}_o", f"{loop}_i"]
    assert sch.get_loop(outer).kind == ForKind.PARALLEL
    assert sch.get_loop(inner).kind == ForKind.SERIAL
    # the scale pass runs in the exp pass (from the second row of a chunk) and after
    # the chunk's last row; the exp row buffer alternates between two rows
    host = sch.get_loop(into)
    (deferred,) = [s for s in host.body if isinstance(s, If) and ast_blocks(s.body)]
    assert expr_str(deferred.cond) == f"0 < {inner}"
    assert [b.name for b in ast_blocks(deferred.body)] == ["softmax_div"]
    assert "softmax_div_epi" in sch.blocks()
    row_buf = sch.kernel.buffer("softmax_exp_4")
    assert [expr_str(d) for d in row_buf.shape] == ["2", "1", "1024"]
    prev = sch.kernel.buffer("softmax_reducesum_5_prev")
    assert prev.scope == "register" and prev.shape == ()
    text = format_kernel(sch.kernel)
    assert "softmax_reducesum_5_prev[] = softmax_reducesum_5[]" in text
    assert "y_stage[softmax_div_v1_s] = softmax_exp_4[softmax_div_par, 0, softmax_div_v1]" in text
    assert "/ softmax_reducesum_5_prev[]" in text
    _rows_equal(sch.kernel, before, 1024, (0, 1, 2, 3, 7))
    replayed = Trace([sch.trace[-1]]).replay(before)
    assert format_kernel(replayed.kernel) == format_kernel(sch.kernel)


@pytest.mark.slow  # ten interpreted kernels of up to 12 x 1024: about 5 s
@given(n=st.integers(0, 12), chunk=st.integers(1, 14), min_chunks=st.integers(1, 9))
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_defer_last_pass_random_rows_and_chunks(n: int, chunk: int, min_chunks: int) -> None:
    sch, step = _deferrable()
    before = copy.deepcopy(sch.kernel)
    sch.defer_last_pass(step.args["loop"], step.args["into"], chunk, min_chunks)
    _rows_equal(sch.kernel, before, 1024, (n,))


def test_defer_last_pass_on_static_rows_and_a_serial_row_loop() -> None:
    sch, step = _deferrable()
    loop, into = step.args["loop"], step.args["into"]
    row = sch.get_loop(loop)
    row.extent, row.kind = Const(29), ForKind.SERIAL
    before = copy.deepcopy(sch.kernel)
    outer, inner = sch.defer_last_pass(loop, into, 64, 8)
    text = format_kernel(sch.kernel)
    # 29 rows: chunks of 29 // 8 = 3 rows, 10 chunks (the last of 2 rows)
    assert f"serial for ({outer}, 0, 10)" in text
    assert f"serial for ({inner}, 0, min(3, 29 - {outer} * 3))" in text
    rng = np.random.default_rng(4)
    x = rng.standard_normal((29, 1024)).astype(np.float32)
    got = run_kernel(sch.kernel, {"x": x}, {"N": 29})["y"]
    np.testing.assert_array_equal(got, run_kernel(before, {"x": x}, {"N": 29})["y"])


def _defer_edited(edit: Callable[[Schedule, For, list[For]], None]) -> Schedule:
    sch, _ = _deferrable()
    (row,) = [s for s in sch.kernel.body if isinstance(s, For)]
    edit(sch, row, [s for s in row.body if isinstance(s, For)])
    return sch


def _defer_refuses(sch: Schedule, match: str, **kw) -> None:
    (row,) = [s for s in sch.kernel.body if isinstance(s, For)]
    passes = [s for s in row.body if isinstance(s, For)]
    args = {"loop": row.var, "into": passes[-2].var, **kw}
    before = format_kernel(sch.kernel)
    with pytest.raises(ScheduleError, match=match):
        sch.defer_last_pass(**args)
    assert format_kernel(sch.kernel) == before
    assert not [t for t in sch.trace if t.primitive == "defer_last_pass"]


def test_defer_last_pass_refuses_and_leaves_the_kernel_alone() -> None:
    sch, step = _deferrable()
    (row,) = [s for s in sch.kernel.body if isinstance(s, For)]
    passes = [s for s in row.body if isinstance(s, For)]
    _defer_refuses(sch, "the pass before the last of loop .* is not 'nope'", into="nope")
    _defer_refuses(sch, "is not '" + passes[0].var, into=passes[0].var)
    _defer_refuses(sch, "chunk and min_chunks must be positive ints", chunk=0)
    _defer_refuses(sch, "chunk and min_chunks must be positive ints", min_chunks=True)
    _defer_refuses(sch, "is vectorized", loop=passes[0].var)
    with pytest.raises(ScheduleError, match="no loop with variable 'nope'"):
        sch.defer_last_pass("nope", step.args["into"])

    def vector_host(sch: Schedule, row: For, passes: list[For]) -> None:
        passes[-2].kind = ForKind.VECTORIZED

    _defer_refuses(_defer_edited(vector_host), "pass softmax_exp_rb_0 is vectorized, not serial")

    def other_extent(sch: Schedule, row: For, passes: list[For]) -> None:
        passes[-1].extent = Const(4)

    _defer_refuses(_defer_edited(other_extent), "differ in extent or depend on the row")

    def no_last_pass(sch: Schedule, row: For, passes: list[For]) -> None:
        row.body.append(Block("late", [], [], [Store("softmax_reducesum_5", (), f32(0))]))

    _defer_refuses(_defer_edited(no_last_pass), "does not end with a pass")


def test_defer_last_pass_requires_a_last_pass_that_writes_only_its_own_buffers() -> None:
    def writes_register(sch: Schedule, row: For, passes: list[For]) -> None:
        b = ast_blocks([passes[-1]])[0]
        b.body.append(Store("softmax_reducemax_0", (), f32(0)))

    _defer_refuses(
        _defer_edited(writes_register), "writes 'softmax_reducemax_0', not an output or local"
    )

    def head_reads_output(sch: Schedule, row: For, passes: list[For]) -> None:
        head = row.body[0]
        assert isinstance(head, Block)
        head.body.append(Store("softmax_reducemax_0", (), Load("y", (Const(0), Const(0)))))

    _defer_refuses(_defer_edited(head_reads_output), r"\['y'\] written by the last pass are used")

    def row_buffer_outside(sch: Schedule, row: For, passes: list[For]) -> None:
        fill = Block("fill", [], [], [Store("softmax_exp_4", (Const(0), Const(0)), f32(1))])
        sch.kernel.body.insert(0, fill)

    _defer_refuses(
        _defer_edited(row_buffer_outside), "row buffer 'softmax_exp_4' is used outside loop"
    )

    def streams_row_buffer(sch: Schedule, row: For, passes: list[For]) -> None:
        (st_,) = [s for s in walk_stmts(passes[-1].body) if isinstance(s, StreamStore)]
        st_.src = "softmax_exp_4"

    _defer_refuses(_defer_edited(streams_row_buffer), "row buffer 'softmax_exp_4' is streamed from")


# hand-built row kernels: X: float32[N, K] in, one register per first pass, passes k, k2


def _pl_reg(name: str) -> Buffer:
    return buf(name, [], "register")


def _pl_x() -> Load:
    return ld("X", [VI, VK])


def _pl_acc(reg: str, value: Expr, op: str = "+") -> Store:
    """``reg[] = reg[] <op> value``."""
    return Store(reg, (), Bin(op, ld(reg, []), value))


def _pl_block(
    name: str, loop: str, store: Store, reduce: bool = False, row: Expr | None = None
) -> Block:
    """A block of row ``i`` and column loop ``loop``: ``vi, vk = axis.bind(i, loop)``."""
    ivs = [IterVar("vi", Var("N")), IterVar("vk", Var("K"), "reduce" if reduce else "spatial")]
    return Block(name, ivs, [row or Var("i"), Var(loop)], [store])


def _pl_init(name: str, reg: str, value: Const, reduce_of: str) -> Block:
    """``reg[] = value``, bound to row ``i``."""
    return Block(
        name, [IterVar("vi", Var("N"))], [Var("i")], [Store(reg, (), value)], reduce_of=reduce_of
    )


def _pl_kernel(
    name: str, body: list[Stmt], regs: Sequence[str], outputs=(("Y", ["N", "K"]),)
) -> Kernel:
    return Kernel(
        name,
        [buf("X", ["N", "K"])],
        [buf(o, shape) for o, shape in outputs],
        ["N", "K"],
        body,
        [_pl_reg(r) for r in regs],
    )


def _pl_sum_scale(
    extent: Expr | None = None,
    s_body: list[Stmt] | None = None,
    kind: ForKind = ForKind.SERIAL,
) -> list[Stmt]:
    """``for i: s = 0; for k: s += X[i, k]; for k2: Y[i, k2] = X[i, k2] * s``, both passes
    over ``extent`` (default K); ``s_body`` replaces the sum block's body."""
    s = _pl_block("S", "k", _pl_acc("s", _pl_x()), reduce=True)
    if s_body is not None:
        s.body = s_body
    y = _pl_block("Y", "k2", Store("Y", (VI, VK), Bin("*", _pl_x(), ld("s", []))))
    init = _pl_init("S_init", "s", f32(0), "S")
    ext = Var("K") if extent is None else extent
    passes = [For("k", ext, [s]), For("k2", copy.deepcopy(ext), [y])]
    return [For("i", Var("N"), [init, *passes], kind)]


def _pl_carry(init_inside: bool) -> Kernel:
    """``acc`` summed over every row (initialised before the row loop, carried across rows)
    and read by every row's second pass and after the loop; ``init_inside`` moves the
    initialisation to the top of each row (a per-row sum: legal)."""
    init = Block("acc_init", [], [], [Store("acc", (), f32(0))], reduce_of="S")
    s = _pl_block("S", "k", _pl_acc("acc", _pl_x()), reduce=True)
    y = _pl_block("Y", "k2", Store("Y", (VI, VK), Bin("+", _pl_x(), ld("acc", []))))
    out = Block("O", [], [], [Store("O", (), ld("acc", []))])
    row = [For("k", Var("K"), [s]), For("k2", Var("K"), [y])]
    if init_inside:
        body: list[Stmt] = [For("i", Var("N"), [init, *row]), out]
    else:
        body = [init, For("i", Var("N"), row), out]
    return _pl_kernel("carry", body, ["acc"], (("Y", ["N", "K"]), ("O", [])))


def _pl_carried() -> Schedule:
    return Schedule(_pl_carry(init_inside=False))


def _pl_row_extent() -> Schedule:
    """A triangular row: both passes run over ``k < i + 1``."""
    return Schedule(_pl_kernel("tri", _pl_sum_scale(Bin("+", Var("i"), Const(1))), ["s"]))


def _pl_parallel_host() -> Schedule:
    """Host pass parallel: the next row's max and sum would be reductions carried by it."""
    m = _pl_block("M", "k", _pl_acc("m", _pl_x(), "max"), reduce=True)
    s = _pl_block("S", "k", _pl_acc("s", _pl_x()), reduce=True)
    value = Bin("+", Bin("-", _pl_x(), ld("m", [])), ld("s", []))
    y = _pl_block("Y", "k2", Store("Y", (VI, VK), value))
    head = [_pl_init("M_init", "m", f32(-np.inf), "M"), _pl_init("S_init", "s", f32(0), "S")]
    row = [*head, For("k", Var("K"), [m, s]), For("k2", Var("K"), [y], ForKind.PARALLEL)]
    return Schedule(_pl_kernel("phost", [For("i", Var("N"), row)], ["m", "s"]))


def _pl_vectorized_host() -> Schedule:
    """Host pass vectorized without reassociation, first pass a serial float32 sum."""
    sch = Schedule(_pl_kernel("vh", _pl_sum_scale(), ["s"]))
    sch.vectorize("k2", allow_reassoc=False)
    with pytest.raises(ScheduleError):  # as `vectorize` refuses for the sum loop itself
        sch.vectorize("k", allow_reassoc=False)
    return sch


def _pl_first_pass_loop() -> Schedule:
    """A first-pass block holding a loop (copying it would duplicate loop variable w)."""
    s_body: list[Stmt] = [For("w", Const(2), [_pl_acc("s", _pl_x())])]
    return Schedule(_pl_kernel("lp", _pl_sum_scale(s_body=s_body, kind=ForKind.PARALLEL), ["s"]))


def _pl_nested_block() -> Schedule:
    """A first-pass block holding a nested block (used to escape as a KeyError)."""
    nested = Block("S2", [], [], [_pl_acc("s", _pl_x())])
    return Schedule(_pl_kernel("nb", _pl_sum_scale(s_body=[nested]), ["s"]))


@pytest.mark.parametrize(
    "make,message",
    [
        (_pl_carried, r"it reads \['acc'\] before this row sets them"),
        (_pl_row_extent, "passes k and k2 differ in extent or depend on the row"),
        (_pl_parallel_host, r"pass k \(serial\) cannot run inside k2 \(parallel\)"),
        (_pl_vectorized_host, r"pass k \(serial\) cannot run inside k2 \(vectorized\)"),
        (_pl_first_pass_loop, "pass k must hold only loop-free blocks"),
        (_pl_nested_block, "pass k must hold only loop-free blocks"),
    ],
    ids=["carried", "row_extent", "parallel_host", "vectorized_host", "loop", "nested_block"],
)
def test_software_pipeline_refuses_unsafe_row_kernels(
    make: Callable[[], Schedule], message: str
) -> None:
    """Review regressions: each of these used to be pipelined into wrong results or an
    invalid kernel (or to fail with a KeyError)."""
    sch = make()
    before = format_kernel(sch.kernel)
    trace = len(sch.trace)
    with pytest.raises(ScheduleError, match=message):
        sch.software_pipeline("i", chunk=2, min_chunks=1)
    assert format_kernel(sch.kernel) == before
    assert len(sch.trace) == trace


def test_software_pipeline_accepts_a_register_initialised_in_each_row() -> None:
    """The positive control of the carried register: initialised at the top of each row,
    the same kernel pipelines and keeps its results."""
    k = _pl_carry(init_inside=True)
    sch = Schedule(copy.deepcopy(k))
    sch.software_pipeline("i", chunk=2, min_chunks=1)
    assert sum(b.endswith("_pro") for b in sch.blocks()) >= 2
    for n in (1, 2, 5):
        dims = {"N": n, "K": 8}
        feeds = _inputs(k, dims, n)
        want = run_kernel(k, feeds, dims)
        got = run_kernel(sch.kernel, feeds, dims)
        assert set(got) == set(want) == {"Y", "O"}
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"N={n} {name}")


def test_fuse_siblings_refuses_reading_a_buffer_still_being_reduced() -> None:
    """Regression: a loop reducing into a global output (``y2[vi, 0]``, not a register)
    used to be fused with the loop reading it, which then read partial sums."""
    y2 = (VI, Const(0))
    init = Block(
        "S_init", [IterVar("vi", Var("N"))], [Var("i")], [Store("y2", y2, f32(0))], reduce_of="S"
    )
    s = _pl_block("S", "k", Store("y2", y2, Bin("+", Load("y2", y2), _pl_x())), reduce=True)
    y = _pl_block("Y", "k2", Store("Y", (VI, VK), Bin("+", _pl_x(), Load("y2", y2))))
    row = [init, For("k", Var("K"), [s]), For("k2", Var("K"), [y])]
    outputs = (("Y", ["N", "K"]), ("y2", ["N", 1]))
    sch = Schedule(_pl_kernel("rsum", [For("i", Var("N"), row)], [], outputs))
    before = format_kernel(sch.kernel)
    with pytest.raises(ScheduleError, match=r"k2 reads \['y2'\], which k is still reducing"):
        sch.fuse_siblings("k", "k2")
    assert format_kernel(sch.kernel) == before
    assert not sch.trace


def test_prefetch_next_on_softmax_keeps_results() -> None:
    lk, group = _lowered("softmax", hidden=1024)
    sch, step = _until(lk, group, "software_pipeline")
    before = copy.deepcopy(sch.kernel)
    sch.prefetch_next(step.args["loop"], "x")
    rng = np.random.default_rng(4)
    for n in (1, 2):
        x = rng.standard_normal((n, 1024)).astype(np.float32)
        got = run_kernel(sch.kernel, {"x": x}, {"N": n})["y"]
        np.testing.assert_array_equal(got, run_kernel(before, {"x": x}, {"N": n})["y"])
        np.testing.assert_allclose(got, _softmax_ref(x.astype(np.float64)), rtol=1e-5, atol=1e-8)


# ---------------------------------------------------------------------------------
# stream_output
# ---------------------------------------------------------------------------------


def _streams(k: Kernel) -> list:
    from geode.codegen.ast import StreamStore

    return [s for s in walk_stmts(k.body) if isinstance(s, StreamStore)]


def _eltwise_inlined(k: Kernel | None = None) -> Schedule:
    """``k_eltwise`` (default ``[N, M]``) with its temps inlined: one nest writing O."""
    sch = Schedule(k if k is not None else k_eltwise("N", "M"))
    sch.compute_inline("mul_0")
    sch.compute_inline("add_1")
    return sch


def _eltwise_scheduled(
    n: int | str = "N", m: int | str = "M", k: Kernel | None = None
) -> tuple[Kernel, Schedule]:
    k = k if k is not None else k_eltwise(n, m)
    sch = _eltwise_inlined(k)
    sch.parallel("mul_2_i0")
    sch.vectorize("mul_2_i1")
    return k, sch


@pytest.mark.parametrize("chunk", [1, 3, 4, 8, 64])
def test_stream_output_elementwise(chunk: int) -> None:
    k, sch = _eltwise_scheduled()
    names = sch.stream_output("mul_2", chunk=chunk, min_bytes=1000)
    assert names == ["mul_2_i1_0", "mul_2_i1_1"]
    assert sch.get_loop("mul_2_i1_1").kind == ForKind.VECTORIZED  # the element loop keeps it
    assert sch.get_loop("mul_2_i0").kind == ForKind.PARALLEL
    (st_,) = _streams(sch.kernel)
    assert st_.buffer == "O" and st_.src == "O_stage"
    # the run-time test: the output's bytes against min_bytes, and every chunk starting on
    # a cache line (a row of M floats must be whole lines; chunks under a line never are)
    want = "N * M * 4 >= 1000 and 4 * M % 64 == 0" if chunk * 4 % 64 == 0 else "false"
    assert format_stmts([st_]).endswith(f"nontemporal={want})")
    stage = sch.kernel.buffer("O_stage")
    assert stage.scope == "local" and stage.shape == (Const(chunk),)
    assert sch.writers("O") == [] and sch.writers("O_stage") == ["mul_2"]
    # the stage is private to each chunk (so to each parallel iteration)
    assert alloc_loop(sch.kernel, "O_stage") == "mul_2_i1_0"
    dims = [{"N": 1, "M": 1}, {"N": 3, "M": 7}, {"N": 2, "M": 64}, {"N": 4, "M": 65}]
    check_same(k, sch.kernel, dims)
    check_replay(k, sch)


def test_stream_output_dividing_extent_needs_no_predicate() -> None:
    k, sch = _eltwise_scheduled(5, 64)
    sch.stream_output("mul_2", chunk=16)
    text = format_kernel(sch.kernel)
    assert "predicate" not in text
    want = "stream(O[mul_2_i0 * 64 + mul_2_i1_0 * 16 +: 16] = O_stage[0 +: 16], nontemporal=true)"
    assert want in text
    check_same(k, sch.kernel, [{}])


_I, _J, _S = Var("i"), Var("j"), Var("S")


@pytest.mark.parametrize(
    "offset,want",
    [
        # a floor division is an integer factor
        (Bin("+", Bin("*", Bin("//", _I, _S), Const(1024)), Bin("*", _J, Const(128))), "true"),
        (Bin("+", Bin("*", _I, _S), Bin("*", _J, Const(128))), "4 * S % 64 == 0"),
        (Bin("+", Bin("*", Bin("%", _I, _S), _S), Const(16)), "4 * S % 64 == 0"),
        # one test per distinct term: (i + 1) * S * S is i * S * S + S * S
        (Bin("*", Bin("+", _I, Const(1)), Bin("*", _S, _S)), "4 * S * S % 64 == 0"),
        # rows of 4000 bytes: every other row starts mid-line
        (Bin("+", Bin("*", _I, Const(1000)), Bin("*", _J, Const(128))), "false"),
        (Bin("+", Bin("*", _I, _S), Const(3)), "false"),
        (Bin("+", Bin("*", _J, Const(16)), Const(8)), "false"),
    ],
)
def test_chunk_offsets_start_cache_lines_when_every_term_is_whole_lines(offset, want) -> None:
    from geode.codegen.schedule import line_aligned

    assert expr_str(line_aligned(offset, 4, {"S"})) == want


@pytest.mark.parametrize(
    "m,chunk,want",
    [(32, 8, "false"), (40, 16, "false"), (48, 16, "true"), ("M", 16, "4 * M % 64 == 0")],
)
def test_stream_output_is_non_temporal_only_where_every_chunk_starts_a_cache_line(m, chunk, want):
    """A non-temporal chunk that starts mid-line shares that line with the previous
    chunk's plain stores (each then fetches it): such chunks take the plain copy, decided
    statically or, with a symbolic row, at run time; the values are the same."""
    k, sch = _eltwise_scheduled(3, m)
    sch.stream_output("mul_2", chunk=chunk)
    (st_,) = _streams(sch.kernel)
    assert format_stmts([st_]).endswith(f"nontemporal={want})")
    check_same(k, sch.kernel, [{"M": 40}, {"M": 64}] if m == "M" else [{}])


def test_stream_output_static_output_smaller_than_min_bytes_is_refused() -> None:
    k, sch = _eltwise_scheduled(5, 32)
    before = format_kernel(sch.kernel)
    with raises("stream_output", "mul_2") as info:
        sch.stream_output("mul_2", chunk=8, min_bytes=5 * 32 * 4 + 1)
    assert "holds 640 bytes < min_bytes 641" in str(info.value)
    assert format_kernel(sch.kernel) == before
    assert sch.stream_output("mul_2", chunk=8, min_bytes=640)  # exactly enough


def _writers_of(sch: Schedule, buffer: str) -> list[str]:
    return [
        b
        for b in sch.blocks()
        if buffer in {s.buffer for s in walk_stmts(sch.get_block(b).body) if isinstance(s, Store)}
    ]


@pytest.mark.parametrize("example", ["rmsnorm", "layernorm"])
def test_stream_output_after_software_pipeline(example: str) -> None:
    """The default row schedules pipelined, then their output pass streamed in chunks that
    do not divide the row: same values for every row count, chunk and first row."""
    sch, step = _before_pipeline_any(example, 33)
    before = copy.deepcopy(sch.kernel)
    sch.software_pipeline(step.args["loop"], 3, 2, step.args["into"])
    (writer,) = _writers_of(sch, sch.kernel.outputs[0].name)
    sch.stream_output(writer, chunk=8)
    assert len(_streams(sch.kernel)) == 1
    _rows_equal(sch.kernel, before, 33, (0, 1, 2, 5, 9))


def test_stream_output_softmax_row_buffer_without_reuse() -> None:
    """Softmax whose exp row stays a local buffer (the default schedule without
    ``reuse_output``, rows software-pipelined): the last pass reads it and streams the
    output; the row buffer and the stage are separate locals."""
    from geode.codegen.autoschedule import pipeline_host, schedule_group

    lk, group = _lowered("softmax", hidden=20)
    steps = [
        s
        for s in schedule_group(lk, group).trace
        if s.primitive not in ("reuse_output", "software_pipeline", "prefetch_next")
    ]
    sch = Trace(steps).replay(lk.kernel)
    (row,) = [s for s in sch.kernel.body if isinstance(s, For)]
    sch.software_pipeline(row.var, 2, 1, pipeline_host(sch, row.var))
    sch.stream_output("softmax_div", chunk=8)
    locals_ = sorted(t.name for t in sch.kernel.temps if t.scope == "local")
    assert len(locals_) == 2 and any(n.endswith("_stage") for n in locals_)
    check_replay(lk.kernel, sch)
    rng = np.random.default_rng(3)
    for n in (1, 4, 9):
        x = rng.standard_normal((n, 20)).astype(np.float32)
        got = run_kernel(sch.kernel, {"x": x}, {"N": n})["y"]
        e = np.exp(x - x.max(1, keepdims=True))
        np.testing.assert_allclose(got, e / e.sum(1, keepdims=True), rtol=2e-6, atol=1e-7)


STREAM_ERRORS = {
    "no block": (lambda s: s.stream_output("nope"), "no such block"),
    "chunk 0": (lambda s: s.stream_output("mul_2", chunk=0), "chunk 0 is not a positive int"),
    "chunk bool": (lambda s: s.stream_output("mul_2", chunk=True), "is not a positive int"),
    "parallel loop": (
        lambda s: (s.fuse(["mul_2_i0", "mul_2_i1"]), s.stream_output("mul_2")),
        "is parallel",
    ),
}


@pytest.mark.parametrize("what", sorted(STREAM_ERRORS))
def test_stream_output_errors_leave_the_kernel(what: str) -> None:
    _, sch = _eltwise_scheduled()
    if what == "parallel loop":
        sch = Schedule(k_eltwise("N", "M"))
        sch.compute_inline("mul_0")
        sch.compute_inline("add_1")
        loop = sch.fuse(["mul_2_i0", "mul_2_i1"])
        sch.parallel(loop)
        run, msg = (lambda s: s.stream_output("mul_2"), "is parallel")
    else:
        run, msg = STREAM_ERRORS[what]
    before, n = format_kernel(sch.kernel), len(sch.trace)
    with pytest.raises(ScheduleError, match="'stream_output'") as info:
        run(sch)
    assert msg in str(info.value)
    assert format_kernel(sch.kernel) == before and len(sch.trace) == n


def test_stream_output_requirements() -> None:
    # an output another block reads back (the row buffer reused in the output)
    k = k_rowbuf([[E()], [D()]])
    sch = Schedule(k)
    sch.reuse_output("T", "D")
    with raises("stream_output", "D") as info:
        sch.stream_output("D")
    assert "another block accesses O" in str(info.value)
    # a block writing a temp, not an output
    sch = Schedule(k_rowbuf([[E()], [D()]]))
    with raises("stream_output", "E") as info:
        sch.stream_output("E")
    assert "T is not a kernel output" in str(info.value)
    # column-major writes: consecutive iterations of the inner loop are a row apart
    sch = Schedule(k_eltwise(5, 10))
    sch.compute_inline("mul_0")
    sch.compute_inline("add_1")
    sch.reorder(["mul_2_i1", "mul_2_i0"])
    with raises("stream_output", "mul_2") as info:
        sch.stream_output("mul_2")
    assert "not written at consecutive elements along mul_2_i0" in str(info.value)
    # a reduction's init block (not directly in a loop over the output's last axis)
    sch = Schedule(k_reduce("N", 10))
    init = next(b for b in sch.blocks() if sch.get_block(b).reduce_of)
    with pytest.raises(ScheduleError, match="'stream_output'"):
        sch.stream_output(init)
    # a block with a predicate (a split that does not divide)
    k, sch = _eltwise_scheduled(5, 10)
    sch.split("mul_2_i1", [None, 4])
    with raises("stream_output", "mul_2") as info:
        sch.stream_output("mul_2")
    assert "no predicate" in str(info.value)


# ---------------------------------------------------------------------------------
# stream_row
# ---------------------------------------------------------------------------------


def k_two_pass(n: int | str = "N", m: int | str = 16, h_row: Callable | None = None) -> Kernel:
    """C = X * 2 + 1 and H = C * Y, two outputs; H reads C at ``h_row(i)`` (default i)."""
    dims = [d for d in (n, m) if isinstance(d, str)]
    sh = [n, m]
    row = h_row or (lambda v: v)
    body = [
        ew("c", "C", sh, lambda v: Bin("+", Bin("*", ld("X", v), f32(2)), f32(1))),
        ew("h", "H", sh, lambda v: Bin("*", ld("C", [row(v[0]), v[1]]), ld("Y", v))),
    ]
    return Kernel(
        "two_pass", [buf("X", sh), buf("Y", sh)], [buf("C", sh), buf("H", sh)], dims, body
    )


def _two_pass_rows(n: int | str = "N", m: int | str = 16, **kw) -> tuple[Kernel, Schedule]:
    """``k_two_pass`` with c's loop moved into h's row loop: two passes per row."""
    k = k_two_pass(n, m, **kw)
    sch = Schedule(k)
    sch.compute_at("c", "h_i0")
    sch.parallel("h_i0")
    sch.vectorize("c_i1")
    sch.vectorize("h_i1")
    return k, sch


TWO_PASS_DIMS = [{"N": 1, "M": 16}, {"N": 5, "M": 16}, {"N": 3, "M": 7}, {"N": 4, "M": 48}]


@pytest.mark.parametrize("m", [16, "M"])
def test_stream_row_stages_the_row_and_streams_it_after_its_pass(m) -> None:
    k, sch = _two_pass_rows("N", m)
    assert sch.stream_row("c", "h_i0", min_bytes=100) == "C_row"
    row = sch.kernel.buffer("C_row")
    assert row.scope == "local" and row.shape == (_dim(m),)
    assert sch.writers("C") == [] and sch.writers("C_row") == ["c"]
    assert sch.readers("C") == [] and sch.readers("C_row") == ["h"]
    (loop,) = [s for s in sch.kernel.body if isinstance(s, For)]
    assert [type(s).__name__ for s in loop.body] == ["For", "StreamStore", "For"]
    (st_,) = _streams(sch.kernel)
    want = "N * 16 * 4 >= 100" if m == 16 else "N * M * 4 >= 100 and 4 * M % 64 == 0"
    assert format_stmts([st_]).strip() == (
        f"stream(C[h_i0 * {m} +: {m}] = C_row[0 +: {m}], nontemporal={want})"
    )
    assert alloc_loop(sch.kernel, "C_row") == "h_i0"  # one row buffer per parallel row
    check_same(k, sch.kernel, TWO_PASS_DIMS if m == "M" else [{"N": n} for n in (1, 2, 9)])
    check_replay(k, sch)


@pytest.mark.parametrize("m,parts", [(16, 4), (16, 1), (48, 3), (48, 12)])
def test_stream_row_spread_over_the_next_pass(m: int, parts: int) -> None:
    k, sch = _two_pass_rows("N", m)
    outer, inner = sch.split("h_i1", [parts, None])
    sch.vectorize(inner)
    sch.stream_row("c", "h_i0", spread=outer)
    host = sch.get_loop(outer)
    assert isinstance(host.body[-1], StreamStore)
    part = m // parts
    flag = "true" if part * 4 % 64 == 0 and m * 4 % 64 == 0 else "false"
    assert format_stmts([host.body[-1]]).strip() == (
        f"stream(C[h_i0 * {m} + {outer} * {part} +: {part}] = C_row[{outer} * {part} +: "
        f"{part}], nontemporal={flag})"
    )
    check_same(k, sch.kernel, [{"N": n} for n in (1, 4, 7)])
    check_replay(k, sch)


def _aligned(shape: tuple[int, ...], offset: int) -> np.ndarray:
    """A float32 array starting ``offset`` bytes past a 64-byte boundary."""
    n = int(np.prod(shape))
    raw = np.zeros(n + 32, np.float32)
    start = ((offset - raw.ctypes.data) % 64) // 4
    return raw[start : start + n].reshape(shape)


@pytest.mark.parametrize("offset", [0, 4, 36])
@pytest.mark.numba
def test_stream_row_numba_matches_the_interpreter(offset: int) -> None:
    """Through the numba backend (non-temporal copies from aligned rows, plain ones
    around a misaligned start): the interpreter's values exactly."""
    from geode.codegen.backends.numba import compile_kernel

    k, sch = _two_pass_rows("N", 32)
    outer, inner = sch.split("h_i1", [None, 16])
    sch.vectorize(inner)
    sch.stream_row("c", "h_i0", spread=outer)
    fn = compile_kernel(sch.kernel)
    assert "_g_stream(C, " in fn.source
    for n in (1, 3, 64):
        feeds = _inputs(k, {"N": n}, n)
        want = run_kernel(k, feeds, {"N": n})
        c, h = _aligned((n, 32), offset), _aligned((n, 32), offset)
        fn(feeds["X"], feeds["Y"], c, h, n)
        np.testing.assert_array_equal(c, want["C"])
        np.testing.assert_array_equal(h, want["H"])


STREAM_ROW_ERRORS = {
    "no block": (lambda s: s.stream_row("nope", "h_i0"), "no such block"),
    "not enclosing": (lambda s: s.stream_row("c", "c_i1"), "is vectorized"),
    "no row loop": (lambda s: s.stream_row("c", "zz"), "does not enclose"),
    "small": (lambda s: s.stream_row("c", "h_i0", min_bytes=10**9), "< min_bytes"),
    "spread missing": (lambda s: s.stream_row("c", "h_i0", spread="zz"), "not a loop of h_i0"),
    "spread vector": (lambda s: s.stream_row("c", "h_i0", spread="h_i1"), "not serial"),
    "spread before": (lambda s: s.stream_row("c", "h_i0", spread="c_i1"), "not a loop of h_i0"),
    "spread uneven": (
        lambda s: (s.split("h_i1", [3, None]), s.stream_row("c", "h_i0", spread="h_i1_0")),
        "does not divide",
    ),
}


@pytest.mark.parametrize("what", sorted(STREAM_ROW_ERRORS))
def test_stream_row_errors_leave_the_kernel(what: str) -> None:
    _, sch = _two_pass_rows(5, 16)
    run, msg = STREAM_ROW_ERRORS[what]
    before, n = format_kernel(sch.kernel), len(sch.trace)
    with pytest.raises(ScheduleError, match="'stream_row'") as info:
        run(sch)
    assert msg in str(info.value)
    if what != "spread uneven":
        assert format_kernel(sch.kernel) == before and len(sch.trace) == n


def _off_row_reader() -> Schedule:
    """Two passes whose reader reads C at another row (made by hand: compute_at refuses it)."""
    _, sch = _two_pass_rows(5, 16)
    other = k_two_pass(5, 16, h_row=lambda v: Bin("-", Const(4), v))
    sch.get_block("h").body = copy.deepcopy(other.body[1].body[0].body[0].body)
    return sch


def _one_pass() -> Schedule:
    """``k_two_pass`` unscheduled: each block in its own loop nest."""
    return Schedule(k_two_pass(5, 16))


def _reader_pass_first() -> Schedule:
    sch = _one_pass()
    sch.compute_at("c", "h_i0")
    sch.get_loop("h_i0").body.reverse()
    return sch


def _row_loop_inner() -> Schedule:
    sch = _one_pass()
    sch.reorder(["h_i1", "h_i0"])
    return sch


def _predicated() -> Schedule:
    _, sch = _two_pass_rows(5, 10)
    sch.split("c_i1", [None, 4])
    return sch


def _already_streamed() -> Schedule:
    _, sch = _two_pass_rows(5, 16)
    sch.stream_row("c", "h_i0")
    sch.get_block("h").body[0].buffer = "C"
    return sch


STREAM_ROW_REQUIREMENTS = {
    "reader off the row": (_off_row_reader, "c", "h_i0", "h reads C off the row"),
    "reader outside the loop": (_one_pass, "c", "c_i0", "h reads C outside loop c_i0"),
    "reader first": (_reader_pass_first, "c", "h_i0", "h reads C before the row is written"),
    "no pass of its own": (_one_pass, "h", "h_i1", "not in a loop of h_i1's body"),
    "no element part": (_row_loop_inner, "h", "h_i1", "does not split into a row"),
    "a temp": (lambda: Schedule(k_rowbuf([[E()], [D()]])), "E", None, "T is not a kernel output"),
    "predicated": (_predicated, "c", "h_i0", "without predicate"),
    "already streamed": (_already_streamed, "h", "h_i0", "another statement writes C"),
}


@pytest.mark.parametrize("what", sorted(STREAM_ROW_REQUIREMENTS))
def test_stream_row_requirements(what: str) -> None:
    make, block, loop, msg = STREAM_ROW_REQUIREMENTS[what]
    sch = make()
    before = format_kernel(sch.kernel)
    with raises("stream_row", block) as info:
        sch.stream_row(block, loop or sch.get_loops(block)[0])
    assert msg in str(info.value)
    assert format_kernel(sch.kernel) == before


# ---------------------------------------------------------------------------------
# store_nontemporal
# ---------------------------------------------------------------------------------


def _nt_store(sch: Schedule, block: str) -> Store:
    (st_,) = [s for s in walk_stmts([sch.get_block(block)]) if isinstance(s, Store)]
    return st_


@pytest.mark.parametrize(
    "m,want",
    [
        (64, "N * 64 * 4 >= 1000"),
        ("M", "N * M * 4 >= 1000 and 4 * M % 64 == 0"),
    ],
)
def test_store_nontemporal_marks_the_store_with_its_flag(m, want) -> None:
    k, sch = _eltwise_scheduled("N", m)
    assert sch.store_nontemporal("mul_2", min_bytes=1000) == "mul_2_i1"
    st_ = _nt_store(sch, "mul_2")
    assert st_.buffer == "O" and expr_str(st_.nontemporal) == want
    # printed with the store; the loops, the writers and the values are unchanged
    want_line = (
        f"O[vi0, vi1] = (X[vi0, vi1] * 2.0f + Y[vi0, vi1]) * X[vi0, vi1], nontemporal={want}"
    )
    assert want_line in format_kernel(sch.kernel)
    assert sch.writers("O") == ["mul_2"] and sch.get_loop("mul_2_i1").kind == ForKind.VECTORIZED
    dims = [{"N": 1, "M": 16}, {"N": 3, "M": 7}, {"N": 4, "M": 64}] if m == "M" else DIMS_N
    check_same(k, sch.kernel, dims)
    check_replay(k, sch)
    assert (
        str(sch.trace.steps[-1]) == "store_nontemporal(block='mul_2', min_bytes=1000) -> 'mul_2_i1'"
    )


def test_store_nontemporal_of_a_static_output_holds_unconditionally() -> None:
    k, sch = _eltwise_scheduled(5, 64)
    sch.store_nontemporal("mul_2")
    assert _nt_store(sch, "mul_2").nontemporal == Const(True, "bool")
    check_same(k, sch.kernel, [{}])


def test_store_nontemporal_inner_runs_of_a_split_loop() -> None:
    """Runs of the inner loop of a split start at multiples of its extent: whole lines
    for 16 floats and more, never for 8."""
    k, sch = _eltwise_scheduled(3, 64)
    outer, inner = sch.split("mul_2_i1", [None, 16])
    sch.vectorize(inner)
    assert sch.store_nontemporal("mul_2") == inner
    check_same(k, sch.kernel, [{}])
    _, sch = _eltwise_scheduled(3, 64)
    outer, inner = sch.split("mul_2_i1", [None, 8])
    sch.vectorize(inner)
    with raises("store_nontemporal", "mul_2") as info:
        sch.store_nontemporal("mul_2")
    assert f"the runs of {inner} never start a line of O" in str(info.value)


def _nt_marked() -> Schedule:
    _, sch = _eltwise_scheduled()
    sch.store_nontemporal("mul_2")
    return sch


def _read_back() -> Schedule:
    sch = Schedule(k_rowbuf([[E()], [D()]]))
    sch.reuse_output("T", "D")
    sch.vectorize(sch.get_loops("D")[-1])
    return sch


def _column_major() -> Schedule:
    sch = _eltwise_inlined()
    sch.reorder(["mul_2_i1", "mul_2_i0"])
    sch.vectorize("mul_2_i0")
    return sch


def _staged() -> Schedule:
    _, sch = _eltwise_scheduled("N", 64)
    sch.stream_output("mul_2", chunk=16)
    return sch


STORE_NT_REQUIREMENTS = {
    "already non-temporal": (_nt_marked, "mul_2", {}, "is already non-temporal"),
    "not vectorized": (_eltwise_inlined, "mul_2", {}, "loop mul_2_i1 is serial, not vectorized"),
    "a temp": (lambda: Schedule(k_eltwise("N", "M")), "mul_0", {}, "A is not a kernel output"),
    "read back": (_read_back, "E", {}, "another statement accesses O"),
    "column-major": (_column_major, "mul_2", {}, "not written at consecutive elements"),
    "staged": (_staged, "mul_2", {}, "O_stage is not a kernel output"),
    "small": (lambda: _eltwise_scheduled(5, 64)[1], "mul_2", {"min_bytes": 10**6}, "< min_bytes"),
    "off the lines": (lambda: _eltwise_scheduled("N", 40)[1], "mul_2", {}, "never start a line"),
    "no block": (_nt_marked, "nope", {}, "no such block"),
}


@pytest.mark.parametrize("what", sorted(STORE_NT_REQUIREMENTS))
def test_store_nontemporal_requirements(what: str) -> None:
    make, block, kw, msg = STORE_NT_REQUIREMENTS[what]
    sch = make()
    before, n = format_kernel(sch.kernel), len(sch.trace)
    with pytest.raises(ScheduleError, match="'store_nontemporal'") as info:
        sch.store_nontemporal(block, **kw)
    assert msg in str(info.value)
    assert format_kernel(sch.kernel) == before and len(sch.trace) == n


def test_store_nontemporal_refuses_integer_outputs() -> None:
    k = k_eltwise("N", "M")
    k.outputs[0] = Buffer("O", "int32", k.outputs[0].shape)
    _, sch = _eltwise_scheduled(k=k)
    with raises("store_nontemporal", "mul_2") as info:
        sch.store_nontemporal("mul_2")
    assert "O is int32, not float32 or float64" in str(info.value)


@pytest.mark.parametrize("prim", ["stream_output", "stream_row"])
def test_streaming_primitives_refuse_a_non_temporal_store(prim: str) -> None:
    if prim == "stream_output":
        sch = _nt_marked()
        run = lambda: sch.stream_output("mul_2")  # noqa: E731
        block = "mul_2"
    else:
        _, sch = _two_pass_rows("N", 16)
        sch.store_nontemporal("h")
        run = lambda: sch.stream_row("h", "h_i0")  # noqa: E731
        block = "h"
    with raises(prim, block) as info:
        run()
    assert "is already non-temporal" in str(info.value)


def test_substitute_applies_once_when_a_node_folds_to_a_child():
    """``0 * 2 + a`` rebuilt over substituted children folds to the substituted ``a``;
    that child is not substituted a second time (``a -> b``, ``b -> c`` must give ``b``;
    a swap ``i <-> j`` must give ``j``)."""
    from geode.codegen.ast import Bin, Const, Var, substitute

    e = Bin("+", Bin("*", Var("k"), Const(2)), Var("a"))
    assert substitute(e, {"k": Const(0), "a": Var("b"), "b": Var("c")}) == Var("b")
    assert substitute(e, {"k": Const(0), "a": Var("j"), "j": Var("a")}) == Var("j")
    # without folding, every node is still rewritten once
    assert substitute(e, {"k": Var("m"), "a": Var("b"), "b": Var("c")}) == Bin(
        "+", Bin("*", Var("m"), Const(2)), Var("b")
    )


def test_index_differences_are_remembered_and_still_exact() -> None:
    from geode.codegen import ast as A
    from geode.codegen import indexing

    n = A.Var("N")
    a = A.Bin("+", A.Bin("*", n, A.Const(4)), A.Const(3))
    b = A.Bin("*", A.Bin("+", n, A.Const(1)), A.Const(4))
    first = indexing.expr_difference(b, a)
    assert first == 1 and indexing.expr_difference(b, a) is first  # the same object
    assert indexing.provably_le(a, b) and not indexing.provably_le(b, a)
    assert indexing.exprs_equal(A.Bin("+", n, n), A.Bin("*", n, A.Const(2)))
