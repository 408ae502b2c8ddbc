"""Attention with a key-tiled (online) softmax: a dense entry's panel body
(:class:`OnlinePanels`, legality :mod:`geode.compiler.fusion.online`) that never holds a
whole row of scores.

Per panel of ``rows`` query rows (``O`` its rows of the output, ``m`` and ``l`` a value
per row in scratch slot 3)::

    m = -inf, l = 0
    for each block of ``keys`` key columns [c0, c0 + bk):
        S = A_panel @ B[:, c0:c0+bk]              (scratch slot 0; zeros when K is 0)
        [the mask argument's block copied to slot 2, rows of bk]
        X = epilogue(S, its inputs' blocks)       (the per-element ops: slot 1)
        per row: m' = maximum(m, max_j X)         (NaN propagates)
                 s  = m' unless it is -inf, then 0 (a row masked so far adds zeros)
                 E  = exp(minimum(X - s, 0)), in place; a = exp(m - s)
                 l  = a l + sum_j E;  O_row *= a when a != 1 (not on the first block); m = m'
        O = E @ V[c0:c0+bk] (first block), O += E @ V[c0:c0+bk] (the others)
    O /= l per row (when N is 0: O zeros)

A row all ``-inf`` keeps ``m = -inf``, ``l = 0``, ``E = 0``, ``O = 0`` and ends ``0 / 0``: NaN, as the
row-panel path's softmax gives; a NaN or ``+inf`` score makes its row NaN likewise. The
sums are regrouped (per block, rescaled): the results are the row-panel path's within the
float sums' bounds, not its bits.

The body is written into the dense entry's chunk (:func:`online_panel`); the entry's own
helpers it needs (the epilogue's record dims, the failure exit) are passed in, so this
module imports nothing of :mod:`~geode.codegen.backends.llvm.dense`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from geode.codegen.backends.llvm import vmath
from geode.codegen.backends.llvm.library import TYPES, gemm_call
from geode.codegen.backends.llvm.ssa import SsaWriter

__all__ = ["OnlinePanels", "online_declares", "online_panel", "online_rows"]

#: key-tiled panels always run on the pool, each on one thread: at least this many panels
#: per thread (fewer rows per panel, a multiple of :data:`ROW_TILE`, at least that) so the
#: threads share the work evenly when there are few heads and rows
PANELS_PER_THREAD = 2
ROW_TILE = 8


@dataclass(frozen=True)
class OnlinePanels:
    """The key-tiled form of a dense entry: panels of ``rows`` query rows, blocks of
    ``keys`` key columns; ``mask``: the index in the entry's ``inner`` arguments of the one
    ``full`` or ``bfull`` epilogue input (its block copied per block), or -1."""

    rows: int
    keys: int
    mask: int = -1


@dataclass(frozen=True)
class Hooks:
    """The dense entry's helpers the body calls: an argument's record dims
    (``inner_dims(w, arg, rows, cols)``), the failure exit (``fail(w, v, status)``), the
    out-of-memory status, the ctx index of the epilogue arguments' pointers."""

    inner_dims: Callable[..., list[str]]
    fail: Callable[..., None]
    no_memory: int
    epilogue_status: int


def online_rows(w: SsaWriter, rows: int, m: str, t: str, nt: str) -> str:
    """Rows per panel: ``rows``, or fewer when ``T`` matrices of ``M`` rows would make
    fewer than :data:`PANELS_PER_THREAD` panels per thread (``nt`` threads):
    ``ceil(M T / (PANELS_PER_THREAD nt))`` rounded up to :data:`ROW_TILE`; in ``[1, M]``."""
    want = w.op("mul", nt, PANELS_PER_THREAD)
    per = w.op("udiv", w.op("add", w.op("mul", m, t), w.op("sub", want, 1)), want)
    per = w.op("mul", w.op("udiv", w.op("add", per, ROW_TILE - 1), ROW_TILE), ROW_TILE)
    mb = w.tmp(f"select i1 {w.op('icmp ult', per, rows)}, i64 {per}, i64 {rows}")
    mb = w.tmp(f"select i1 {w.op('icmp ult', m, mb)}, i64 {m}, i64 {mb}")
    return w.tmp(f"select i1 {w.op('icmp ult', mb, 1)}, i64 1, i64 {mb}")


def _exp(dtype: str) -> str:
    return vmath.function_name("exp", dtype)


def online_declares(dtype: str, have: list[str]) -> list[str]:
    """The module lines the body needs beyond the entry's (``have``): vmath's exp with its
    intrinsics, ``llvm.maximum`` / ``llvm.minimum``, ``llvm.memcpy``."""
    ty, sfx = TYPES[dtype][0], "f32" if dtype == "float32" else "f64"
    lib = vmath.definitions([_exp(dtype)], vmath.VmathTarget.host())
    own = {
        f"llvm.maximum.{sfx}": f"declare {ty} @llvm.maximum.{sfx}({ty}, {ty})",
        f"llvm.minimum.{sfx}": f"declare {ty} @llvm.minimum.{sfx}({ty}, {ty})",
        "llvm.memcpy.p0.p0.i64": "declare void @llvm.memcpy.p0.p0.i64(ptr, ptr, i64, i1)",
        **dict(lib.declares),
    }
    text = "\n".join(have)
    lines = [d for name, d in own.items() if f"@{name}(" not in text]
    return [*lib.globals.values(), *lines, lib.functions]


def _scratch(w: SsaWriter, slot: int, nbytes: str) -> str:
    size = w.tmp(f"select i1 {w.op('icmp ult', nbytes, 64)}, i64 64, i64 {nbytes}")
    return w.tmp(f"call ptr @geode_scratch(i64 {slot}, i64 {size})")


def _loop(w: SsaWriter, tag: str, count: str, entry: str) -> str:
    """Open ``for i in [0, count)`` (``count`` > 0 checked by the caller); its index."""
    w.emit(f"  br label %{tag}")
    w.label(tag)
    w.emit(f"  %{tag}_i = phi i64 [ 0, %{entry} ], [ %{tag}_n, %{tag}_latch ]")
    return f"%{tag}_i"


def _end(w: SsaWriter, tag: str, count: str, after: str) -> None:
    w.emit(f"  br label %{tag}_latch")
    w.label(f"{tag}_latch")
    w.emit(f"  %{tag}_n = add i64 %{tag}_i, 1")
    w.emit(f"  %{tag}_more = icmp ult i64 %{tag}_n, {count}")
    w.emit(f"  br i1 %{tag}_more, label %{tag}, label %{after}")


def _outer_pos(sp: Any, source: int) -> int:
    """The index among the brow / bfull outer arguments of outer argument ``source``."""
    return sum(1 for o in sp.outer[:source] if o.role in ("brow", "bfull"))


def _mask_rows(w: SsaWriter, sp: Any, v: dict, off: dict, c0: str, bk: str) -> None:
    """The mask argument's block (``rows x bk`` from column ``c0``) copied to ``s4``."""
    arg = sp.inner[sp.online.mask]
    outer = sp.outer[arg.source]
    base = w.tmp(f"inttoptr i64 {w.word('%ctx', sp.ext_at + arg.source)} to ptr")
    if outer.role == "bfull":
        first = w.op("add", w.op("mul", off[f"r{_outer_pos(sp, arg.source)}"], v["M"]), v["p0"])
    else:
        first = v["r0"]
    it = arg.itemsize
    r = _loop(w, "mk", v["rows"], "mk_pre")
    src = w.op("add", w.op("mul", w.op("add", first, r), v["N"]), c0)
    ps = w.tmp(f"getelementptr inbounds i8, ptr {base}, i64 {w.op('mul', src, it)}")
    pd = w.tmp(
        f"getelementptr inbounds i8, ptr {v['s4']}, i64 {w.op('mul', w.op('mul', r, bk), it)}"
    )
    n = w.op("mul", bk, it)
    w.emit(f"  call void @llvm.memcpy.p0.p0.i64(ptr {pd}, ptr {ps}, i64 {n}, i1 false)")
    _end(w, "mk", v["rows"], "mk_done")
    w.label("mk_done")


def _block_args(w: SsaWriter, sp: Any, v: dict, off: dict, c0: str, bk: str, hk: Hooks) -> None:
    """The epilogue's pointers, records and dims for the block ``[c0, c0 + bk)``."""
    pos = 0
    for j, arg in enumerate(sp.inner):
        if arg.source < 0:
            data = v["s1"] if arg.source == -1 else v["s2"]
        elif j == sp.online.mask:
            data = v["s4"]
        else:
            base = w.tmp(f"inttoptr i64 {w.word('%ctx', sp.ext_at + arg.source)} to ptr")
            role = sp.outer[arg.source].role
            if role == "brow":
                first = off[f"r{_outer_pos(sp, arg.source)}"]
                elems = w.op("add", w.op("mul", first, v["N"]), c0)
            else:
                elems = {"row": c0, "col": v["r0"]}.get(role, "0")
            byte = w.op("mul", elems, arg.itemsize)
            data = w.tmp(f"getelementptr inbounds i8, ptr {base}, i64 {byte}")
        w.put(v["iptrs"], j, data, "ptr")
        dims = hk.inner_dims(w, arg, v["rows"], bk)
        for word in [str(len(dims)), str(arg.itemsize), *dims]:
            w.put(v["irecs"], pos, word)
            pos += 1
    named = {"rows": v["rows"], "cols": bk, "threads": v["threads"]}
    for j, d in enumerate([*sp.inner_dims, "threads"]):
        w.put(v["iints"], j, named[d] if isinstance(d, str) else str(int(d)))


def _row_update(w: SsaWriter, sp: Any, v: dict, bk: str, po: str) -> None:
    """The online softmax's step for every row of the block (see the module docstring)."""
    ty = TYPES[sp.dtype][0]
    sfx = "f32" if ty == "float" else "f64"
    ninf = "0xFFF0000000000000"
    exp = _exp(sp.dtype)
    r = _loop(w, "ou", v["rows"], "ou_pre")
    xr = w.tmp(f"getelementptr inbounds {ty}, ptr {v['s2']}, i64 {w.op('mul', r, bk)}")
    w.emit("  br label %mx")
    w.label("mx")
    w.emit("  %mx_j = phi i64 [ 0, %ou ], [ %mx_j1, %mx ]")
    w.emit(f"  %mx_m = phi {ty} [ {ninf}, %ou ], [ %mx_m1, %mx ]")
    w.emit(f"  %mx_p = getelementptr inbounds {ty}, ptr {xr}, i64 %mx_j")
    w.emit(f"  %mx_x = load {ty}, ptr %mx_p")
    w.emit(f"  %mx_m1 = call {ty} @llvm.maximum.{sfx}({ty} %mx_m, {ty} %mx_x)")
    w.emit("  %mx_j1 = add i64 %mx_j, 1")
    w.emit(f"  %mx_more = icmp ult i64 %mx_j1, {bk}")
    w.emit("  br i1 %mx_more, label %mx, label %mx_done")
    w.label("mx_done")
    pm = w.tmp(f"getelementptr inbounds {ty}, ptr {v['s3']}, i64 {r}")
    pl = w.tmp(f"getelementptr inbounds {ty}, ptr {v['s3']}, i64 {w.op('add', r, v['rows'])}")
    mo = w.tmp(f"load {ty}, ptr {pm}")
    mn = w.tmp(f"call {ty} @llvm.maximum.{sfx}({ty} {mo}, {ty} %mx_m1)")
    sh = w.tmp(f"select i1 {w.tmp(f'fcmp oeq {ty} {mn}, {ninf}')}, {ty} 0.0, {ty} {mn}")
    w.emit("  br label %ex")
    w.label("ex")
    w.emit("  %ex_j = phi i64 [ 0, %mx_done ], [ %ex_j1, %ex ]")
    w.emit(f"  %ex_s = phi {ty} [ 0.0, %mx_done ], [ %ex_s1, %ex ]")
    w.emit(f"  %ex_p = getelementptr inbounds {ty}, ptr {xr}, i64 %ex_j")
    w.emit(f"  %ex_x = load {ty}, ptr %ex_p")
    w.emit(f"  %ex_d = fsub {ty} %ex_x, {sh}")
    w.emit(f"  %ex_c = call {ty} @llvm.minimum.{sfx}({ty} %ex_d, {ty} 0.0)")
    w.emit(f"  %ex_e = call {ty} @{exp}({ty} %ex_c)")
    w.emit(f"  store {ty} %ex_e, ptr %ex_p")
    w.emit(f"  %ex_s1 = fadd reassoc {ty} %ex_s, %ex_e")
    w.emit("  %ex_j1 = add i64 %ex_j, 1")
    w.emit(f"  %ex_more = icmp ult i64 %ex_j1, {bk}")
    w.emit("  br i1 %ex_more, label %ex, label %ex_done")
    w.label("ex_done")
    alpha = w.tmp(f"call {ty} @{exp}({ty} {w.tmp(f'fsub {ty} {mo}, {sh}')})")
    lo = w.tmp(f"load {ty}, ptr {pl}")
    ln = w.tmp(f"fadd {ty} {w.tmp(f'fmul {ty} {alpha}, {lo}')}, %ex_s1")
    w.emit(f"  store {ty} {ln}, ptr {pl}")
    w.emit(f"  store {ty} {mn}, ptr {pm}")
    grow = w.tmp(f"fcmp une {ty} {alpha}, 1.0")  # O is the first block's product: not yet
    go = w.all_of([grow, w.op("icmp ugt", v["D"], 0), w.op("icmp ugt", "%bl_c", 0)])
    w.emit(f"  br i1 {go}, label %sc_pre, label %ou_latch")
    w.label("sc_pre")
    orow = w.tmp(f"getelementptr inbounds {ty}, ptr {po}, i64 {w.op('mul', r, v['ldo'])}")
    j = _loop(w, "sc", v["D"], "sc_pre")
    p = w.tmp(f"getelementptr inbounds {ty}, ptr {orow}, i64 {j}")
    x = w.tmp(f"load {ty}, ptr {p}")
    w.emit(f"  store {ty} {w.tmp(f'fmul {ty} {x}, {alpha}')}, ptr {p}")
    _end(w, "sc", v["D"], "ou_latch")
    w.label("ou_latch")
    w.emit("  %ou_n = add i64 %ou_i, 1")
    w.emit(f"  %ou_more = icmp ult i64 %ou_n, {v['rows']}")
    w.emit("  br i1 %ou_more, label %ou, label %ou_done")
    w.label("ou_done")


def _init(w: SsaWriter, sp: Any, v: dict, po: str, item: int) -> None:
    """``m = -inf``, ``l = 0``; the panel's rows of ``O`` zero when there are no key
    columns (else the first block's ``P @ V`` writes them)."""
    ty = TYPES[sp.dtype][0]
    r = _loop(w, "in", v["rows"], "in_pre")
    w.put(v["s3"], r, "0xFFF0000000000000", ty)
    w.put(v["s3"], w.op("add", r, v["rows"]), "0.0", ty)
    w.emit(f"  br i1 {w.eq(v['N'], 0)}, label %in_zero, label %in_latch")
    w.label("in_zero")
    orow = w.tmp(f"getelementptr inbounds {ty}, ptr {po}, i64 {w.op('mul', r, v['ldo'])}")
    n = w.op("mul", v["D"], item)
    w.emit(f"  call void @llvm.memset.p0.i64(ptr {orow}, i8 0, i64 {n}, i1 false)")
    _end(w, "in", v["rows"], "in_done")
    w.label("in_done")


def _finish(w: SsaWriter, sp: Any, v: dict, po: str) -> None:
    """``O /= l`` per row (only when there were key columns and ``D > 0``)."""
    ty = TYPES[sp.dtype][0]
    go = w.op("and", w.op("icmp ugt", v["N"], 0), w.op("icmp ugt", v["D"], 0), "i1")
    w.emit(f"  br i1 {go}, label %fi_pre, label %fi_done")
    w.label("fi_pre")
    r = _loop(w, "fi", v["rows"], "fi_pre")
    at = w.op("add", r, v["rows"])
    s3 = v["s3"]
    lr = w.tmp(f"load {ty}, ptr {w.tmp(f'getelementptr inbounds {ty}, ptr {s3}, i64 {at}')}")
    orow = w.tmp(f"getelementptr inbounds {ty}, ptr {po}, i64 {w.op('mul', r, v['ldo'])}")
    w.emit("  br label %fd")
    w.label("fd")
    w.emit("  %fd_j = phi i64 [ 0, %fi ], [ %fd_j1, %fd ]")
    w.emit(f"  %fd_p = getelementptr inbounds {ty}, ptr {orow}, i64 %fd_j")
    w.emit(f"  %fd_x = load {ty}, ptr %fd_p")
    w.emit(f"  %fd_y = fdiv {ty} %fd_x, {lr}")
    w.emit(f"  store {ty} %fd_y, ptr %fd_p")
    w.emit("  %fd_j1 = add i64 %fd_j, 1")
    w.emit(f"  %fd_more = icmp ult i64 %fd_j1, {v['D']}")
    w.emit("  br i1 %fd_more, label %fd, label %fi_latch")
    w.label("fi_latch")
    w.emit("  %fi_n = add i64 %fi_i, 1")
    w.emit(f"  %fi_more = icmp ult i64 %fi_n, {v['rows']}")
    w.emit("  br i1 %fi_more, label %fi, label %fi_done")
    w.label("fi_done")


def _alloc(w: SsaWriter, sp: Any, v: dict, item: int, hk: Hooks) -> None:
    """The block's scratch: scores (slot 0), the epilogue's result (1), ``m`` and ``l``
    (3), the mask's block (2); out of memory: the entry's status."""
    op = sp.online
    blk = w.op("mul", w.op("mul", v["rows"], op.keys), item)
    v["s1"], v["s2"] = _scratch(w, 0, blk), _scratch(w, 1, blk)
    v["s3"] = _scratch(w, 3, w.op("mul", w.op("mul", v["rows"], 2), item))
    ok = w.all_of([w.op("icmp ne", v[x], "null", "ptr") for x in ("s1", "s2", "s3")])
    v["s4"] = "null"
    if op.mask >= 0:
        mit = sp.inner[op.mask].itemsize
        v["s4"] = _scratch(w, 2, w.op("mul", w.op("mul", v["rows"], op.keys), mit))
        ok = w.op("and", ok, w.op("icmp ne", v["s4"], "null", "ptr"), "i1")
    w.emit(f"  br i1 {ok}, label %mem, label %nomem")
    w.label("nomem")
    hk.fail(w, v, str(hk.no_memory))
    w.label("mem")


def online_panel(
    w: SsaWriter, sp: Any, v: dict, ptr: dict, off: dict, pa: str, pb: str, hk: Hooks
) -> None:
    """The panel's body in the chunk (see the module docstring): ``v`` the chunk's values
    (``rows``, ``p0``, ``r0``, ``M``, ``N``, ``K``, ``D``, leading dims, ``threads``, the
    epilogue's argument arrays), ``ptr`` the operands, ``off`` batch ``t``'s offsets,
    ``pa``/``pb`` A's panel and B's matrix."""
    ty, _, item = TYPES[sp.dtype]
    op = sp.online
    _alloc(w, sp, v, item, hk)
    o_el = w.op("add", off["o"], w.op("mul", v["p0"], v["ldo"]))
    po = w.tmp(f"getelementptr inbounds {ty}, ptr {ptr['O']}, i64 {o_el}")
    pv = w.tmp(f"getelementptr inbounds {ty}, ptr {ptr['V']}, i64 {off['v']}")
    w.emit("  br label %in_pre")
    w.label("in_pre")
    _init(w, sp, v, po, item)
    trans_b = sp.layouts[1] is not None and sp.layouts[1].transposed
    w.emit(f"  br i1 {w.op('icmp ugt', v['N'], 0)}, label %bl, label %bl_done")
    w.label("bl")
    w.emit("  %bl_c = phi i64 [ 0, %in_done ], [ %bl_c1, %bl_latch ]")
    c0 = "%bl_c"
    left = w.op("sub", v["N"], c0)
    bk = w.tmp(f"select i1 {w.op('icmp ult', left, op.keys)}, i64 {left}, i64 {op.keys}")
    w.emit(f"  br i1 {w.eq(v['K'], 0)}, label %bz, label %bg")
    w.label("bz")
    nbytes = w.op("mul", w.op("mul", v["rows"], bk), item)
    w.emit(f"  call void @llvm.memset.p0.i64(ptr {v['s1']}, i8 0, i64 {nbytes}, i1 false)")
    w.emit("  br label %bs")
    w.label("bg")
    col = w.op("mul", c0, v["ldb"]) if trans_b else c0  # B^T's rows, or B's columns
    pbc = w.tmp(f"getelementptr inbounds {ty}, ptr {pb}, i64 {col}")
    ops = [(pa, v["lda"]), (pbc, v["ldb"]), (v["s1"], bk)]
    w.emit(gemm_call(sp.dtype, v["rows"], bk, v["K"], ops, v["threads"], "0.0", trans_b))
    w.emit("  br label %bs")
    w.label("bs")
    if op.mask >= 0:
        w.emit("  br label %mk_pre")
        w.label("mk_pre")
        _mask_rows(w, sp, v, off, c0, bk)
    _block_args(w, sp, v, off, c0, bk, hk)
    st = w.tmp(f"call i32 @{sp.epilogue}(ptr {v['iptrs']}, ptr {v['irecs']}, ptr {v['iints']})")
    w.emit(f"  br i1 {w.tmp(f'icmp ne i32 {st}, 0')}, label %bad, label %ou_pre")
    w.label("bad")
    hk.fail(w, v, w.tmp(f"zext i32 {w.tmp(f'add i32 {st}, {hk.epilogue_status}')} to i64"))
    w.label("ou_pre")
    _row_update(w, sp, v, bk, po)
    w.emit(f"  br i1 {w.op('icmp ugt', v['D'], 0)}, label %bv, label %bl_latch")
    w.label("bv")
    pvc = w.tmp(f"getelementptr inbounds {ty}, ptr {pv}, i64 {w.op('mul', c0, v['ldv'])}")
    ops = [(v["s2"], bk), (pvc, v["ldv"]), (po, v["ldo"])]
    beta = w.tmp(f"select i1 {w.eq(c0, 0)}, double 0.0, double 1.0")  # the first block sets O
    w.emit(gemm_call(sp.dtype, v["rows"], v["D"], bk, ops, v["threads"], beta))
    w.emit("  br label %bl_latch")
    w.label("bl_latch")
    w.emit(f"  %bl_c1 = add i64 %bl_c, {op.keys}")
    w.emit(f"  br i1 {w.op('icmp ult', '%bl_c1', v['N'])}, label %bl, label %bl_done")
    w.label("bl_done")
    _finish(w, sp, v, po)
    w.emit("  ret void")
