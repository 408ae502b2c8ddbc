"""A GEMM with a fused epilogue (and optionally a second GEMM) as one native entry.

The product ``Y = A @ B`` is computed a panel of rows at a time by the BLAS (or, for a
float32 weight packed once, ``DenseSpec.packed_n``, by the packed-weight GEMM; likewise
``V`` with ``packed_d``:
:mod:`~geode.codegen.backends.llvm.packed`) into a scratch panel, the epilogue kernel (a fused group compiled over ``[rows, N]``) runs on the panel
while it is in cache, and with a second GEMM (attention's ``softmax(Q K^T) V``) the
epilogue's output panel is multiplied by ``V`` straight into the output ``O``: neither
the product nor the epilogue's result goes to memory.

Entry (the kernels' ABI, :mod:`~geode.codegen.backends.llvm.emit`)::

    i32 @D(ptrs, recs, ints)   ; ptrs: A, B, [Bu | B2, A2], [V], [R], [bias], the epilogue's
                               ;       inputs, its outputs, [O]
                               ; ints: the thread count (0: the pool's)

Shapes. Unbatched (``B`` a matrix): ``A`` has rank ``>= 2``, its leading dims flattened
into the rows ``M``; ``B`` is ``[K, N]``. Batched (``B`` of rank > 2): ``A[..., M, K]``,
``B[..., K, N]`` with numpy's broadcasting of the batch dims into ``Y``'s ``T`` matrices.
``V`` is ``[..., N, D]`` (its batch dims broadcast to ``Y``'s), ``O`` is ``Y``'s batch dims
then ``[M, D]``. Every epilogue argument has a role (:mod:`geode.compiler.fusion.epilogue`)
that says what a panel reads of it: ``full`` (``Y``'s shape), ``col`` (a value per row),
``row`` (``N`` values for all rows), ``brow`` (a row per batch, broadcast over the batch
dims where it has 1), ``bfull`` (a matrix per batch, broadcast likewise), ``scalar``.

The entry checks every record (status ``i + 1`` for a bad argument ``i``), then runs the
``T x P`` panels (``P`` per matrix, ``mb`` rows each: ``max(min_rows, panel_bytes / (N x
itemsize))``) through ``@D.chunk``: on the native pool, one panel per chunk, when the
GEMMs are small (single-threaded in the BLAS), when there are :data:`PAR_PANELS` panels
per thread or more (a batch of attention heads), or when a few rows (up to
:data:`SPLIT_ROWS` per thread) meet packed weights, which cost nothing to read per panel:
then one panel per thread (:func:`_split_rows`), the op one pool launch with no wait between
its GEMMs; or when many rows (:data:`BIG_PANELS` panels of :data:`BIG_ROWS` per thread or
more) meet packed weights: then panels of :data:`BIG_ROWS` rows, taken by the pool's
threads as they come (each panel's products stay in its thread's cache, and a thread
that falls behind leaves its panels to the others); else one after another, the BLAS
and the epilogue threading each. Each panel::

    c = 1 / sqrt(mean(A[p0:p0+rows]^2) + eps)   (with an RMSNorm prologue: scratch slot 2,
                                        a value per row, an epilogue input)
    S = A_t[p0:p0+rows] @ B_t          (scratch; zeros when K or N is 0)
    U = A[p0:p0+rows] @ Bu              (with a sibling GEMM: scratch, an epilogue input)
    U = A2[p0:p0+rows] @ B2             (with a partner GEMM instead: likewise)
    epilogue(S, its inputs' panels)     (writes its outputs' panels; with V: into scratch P)
    O_t[p0:p0+rows] = P @ V_t           (with V; with a bias: + bias; with a residual R:
                                         then + R's panel)

A sibling GEMM (``DenseSpec.sibling``: a gated MLP's up beside its gate, ``Bu`` packed
once like ``B``), a partner GEMM (``DenseSpec.partner``: an LSTM cell's ``x Wx`` beside
``h Wh``, ``B2`` packed once, ``A2`` of ``A``'s rows and its own depth ``K2``), a residual (``DenseSpec.residual``: O's panel starts as R's, the
packed GEMM adds its sums with beta 1, the bits of adding after) and a bias
(``DenseSpec.bias_rank``: ``D`` floats the packed GEMM adds to each sum before R, the bits
of a Linear layer's bias ``Add`` after the product) need the packed-weight GEMM.

The panels live in the thread's scratch buffers (``geode_scratch``, kept between calls: a
fresh allocation per call would fault its pages in every time). A panel that cannot get
its scratch reports :data:`NO_MEMORY`; an epilogue status ``s``, :data:`EPILOGUE_STATUS`
``+ s``.
"""

from __future__ import annotations

import ctypes
import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from geode.codegen.backends.llvm import jit
from geode.codegen.backends.llvm.attention_tiled import (
    Hooks,
    OnlinePanels,
    online_declares,
    online_panel,
    online_rows,
)
from geode.codegen.backends.llvm.compiled import TILED_CELL
from geode.codegen.backends.llvm.irtext import float_literal
from geode.codegen.backends.llvm.kernel import build_module
from geode.codegen.backends.llvm.library import GEMM_DECL, TYPES, gemm_call
from geode.codegen.backends.llvm.objcache import CacheDir
from geode.codegen.backends.llvm.packed import (
    PACKED_AT_DECL,
    PACKED_BIAS_DECL,
    PACKED_DECL,
    packed_at_call,
    packed_call,
    packed_check,
)
from geode.codegen.backends.llvm.ssa import SsaWriter
from geode.codegen.backends.llvm.target import host
from geode.errors import CodegenError

__all__ = [
    "CausalPanels",
    "EPILOGUE_STATUS",
    "NO_MEMORY",
    "DenseSpec",
    "HeadLayout",
    "InnerArg",
    "OnlinePanels",
    "OuterArg",
    "dense_ir",
    "tiled_cell",
    "tiled_ir",
]

#: status of an entry that could not allocate a scratch panel
NO_MEMORY = 1 << 20
#: added to the status an epilogue kernel returned
EPILOGUE_STATUS = 1 << 21
#: GEMMs with at most this many multiply-adds run single-threaded in OpenBLAS: their
#: panels go to the pool
SMALL_GEMM = 4 * 65536
#: with at least this many panels per thread (attention's heads of a batch), the panels
#: go to the pool whatever their size, each GEMM single-threaded: one launch for the op
#: instead of one per GEMM and epilogue of every panel
PAR_PANELS = 4
#: against packed weights, up to this many rows per thread run as one panel per thread
#: (:func:`_split_rows`), panels a whole number of this many rows (the AVX-512 tile's)
SPLIT_ROWS = 64
SPLIT_TILE = 8
#: against packed weights, at least this many panels per thread of :data:`BIG_ROWS` rows
#: each run as panels on the pool (:func:`_split_rows`), each panel's GEMM, epilogue and
#: second GEMM on one thread: the products never leave the thread's cache, and the op is
#: one launch whose panels a thread that falls behind leaves to the others
BIG_PANELS = 4
BIG_ROWS = 64

#: causal panels (:class:`CausalPanels`) compute a whole number of this many key columns
#: (or all ``N``): the epilogue's row sums (vectorized, 16 lanes by 4 accumulators for
#: float32) then add each column in the lane it takes over all ``N`` columns, the masked
#: ones adding exact zeros, so the results have the bits of the full path's
CAUSAL_ALIGN = 64

# ctx words (i64): pointers as ints, sizes, then per batch dim (Y's, A's, B's, V's), then
# the leading dims of A, B, V, O, then per batch dim the element strides of A, B, V, O,
# then the ext pointers, then per brow argument its batch dims
_A, _B, _V, _O, _M, _N, _K, _D, _T, _MB, _P, _THREADS, _STATUS, _U, _R, _BIAS = range(16)
_AROWS = 16  # A read transposed: the rows of each of its matrices (X's last dim)
_FIXED = 17


@dataclass(frozen=True)
class HeadLayout:
    """An operand (``A``, ``B``, ``V``) read, or the result ``O`` written, in place as the
    heads of a wider array: the array passed is the *root* ``[*lead, S, W]``, and the
    operand ``[*lead, H, S, D]`` is ``root[..., s, offset + h * D + d]`` (the attention
    layout ``[batch, heads, seq, depth]`` of a ``[batch, seq, W]`` projection, no transpose
    copy). ``transposed``: the operand is ``[*lead, H, D, S]`` (``K^T``), multiplied through
    the GEMM's ``transB`` (``B`` only)."""

    heads: int
    depth: int
    offset: int = 0
    transposed: bool = False

    def describe(self) -> str:
        """``4 heads of 64 at column 256, transposed``."""
        at = f" at column {self.offset}" if self.offset else ""
        return f"{self.heads} heads of {self.depth}{at}" + (
            ", transposed" if self.transposed else ""
        )


@dataclass(frozen=True)
class CausalPanels:
    """Causal attention (a proven causal mask, :mod:`geode.compiler.fusion.causal`): a
    panel of query rows ``[p0, p0 + rows)`` computes the scores, the epilogue and ``P @ V``
    over the key columns its last row sees only, ``[0, p0 + rows - 1 + offset)`` rounded up
    to :data:`CAUSAL_ALIGN`, at most ``N`` (column ``j`` of row ``i`` is masked when ``j >=
    i + offset``; :func:`_visible`). When that is fewer than ``N``, the epilogue's mask
    argument ``arg`` (an index in ``inner``, role ``bfull``) is built for the panel in
    scratch slot 2 (``masked`` where masked, ``kept`` elsewhere: the mask's own values;
    :func:`_causal_mask`), so the rows of a panel that see fewer columns keep theirs masked.
    Panels of ``rows`` rows (or all ``M``)."""

    offset: int
    arg: int
    masked: float
    kept: float
    rows: int


@dataclass(frozen=True)
class OuterArg:
    """An epilogue argument of the entry (after ``A``, ``B``, ``V``): role, rank, item size."""

    role: str  # full | col | row | brow | bfull | scalar | part
    rank: int
    itemsize: int
    #: a ``part`` argument's columns (a narrow epilogue's: ``Y``'s rows, this many columns)
    width: int = 0


@dataclass(frozen=True)
class InnerArg:
    """An argument of the epilogue kernel: where its data comes from (``-1``: the product
    panel, ``-2``: the panel the second GEMM reads, ``-3``: the sibling product's panel,
    ``-4``: the RMSNorm scale of the panel's rows, else the index of an :class:`OuterArg`), its role, item size, and the dims of its 2-D
    shape that the kernel merges (None: its own shape)."""

    source: int
    role: str  # acc | full | col | row | brow | scalar | part
    itemsize: int
    view: tuple[int, ...] | None = None
    #: a ``part`` argument's columns
    width: int = 0


@dataclass(frozen=True)
class DenseSpec:
    """Everything the entry is generated from (see the module docstring)."""

    name: str
    dtype: str
    a_rank: int
    b_rank: int
    outer: tuple[OuterArg, ...]
    inner: tuple[InnerArg, ...]
    #: the epilogue's dim arguments: ``"rows"``, ``"cols"`` or a constant
    inner_dims: tuple[str | int, ...]
    epilogue: str  # the epilogue kernel's entry symbol
    panel_bytes: int
    min_rows: int
    v_rank: int = 0  # 0: no second GEMM
    #: > 0: ``B`` is a float32 weight of this many columns packed once
    #: (:mod:`~geode.codegen.backends.llvm.packed`), multiplied by the packed-weight GEMM
    packed_n: int = 0
    #: > 0: ``V`` (a matrix) is a float32 weight of this many columns packed once
    packed_d: int = 0
    #: a sibling GEMM: ``U = A @ Bu`` per panel beside the product, ``Bu`` (after ``B``) a
    #: float32 weight of ``packed_n`` columns packed once; its panel is an epilogue input
    sibling: bool = False
    #: a residual ``R`` (after ``V``, ``O``'s shape): the second GEMM writes ``P @ V + R``
    residual: bool = False
    #: > 0: a bias of this rank (after ``R``, ``D`` values): the second GEMM writes
    #: ``(P @ V + bias) [+ R]``
    bias_rank: int = 0
    #: ``A`` is passed as ``X [..., K, R]``, the input of a Transpose of its last two axes,
    #: and read in place (``A``'s rows are ``X``'s columns; ``B`` packed, unbatched)
    a_trans: bool = False
    #: an RMSNorm prologue (unbatched): the kernel computes ``1 / sqrt(mean(A_r^2) + eps)``
    #: for each row ``r`` of the panel (:func:`_rms_rows`), the epilogue's ``-4`` input
    rms_eps: float | None = None
    #: how ``A``, ``B``, ``V`` and ``O`` are laid out: None C-contiguous, else read (written)
    #: in place as heads of their root array (batched products only)
    layouts: tuple[HeadLayout | None, ...] = (None, None, None, None)
    #: >= 0: the index in ``outer`` of the epilogue's one output (``full``, the product's
    #: item size) of an elementwise epilogue: the GEMM writes each panel straight into it
    #: and the epilogue rewrites it in place (no scratch panel; the output's lines are
    #: fetched while the GEMM computes, not in the epilogue's pass), unless the output
    #: overlaps ``A`` (then the scratch panel). One GEMM, unbatched (:func:`_in_place_ok`).
    in_place: int = -1
    #: causal attention: only the key columns a panel's rows see (:class:`CausalPanels`)
    causal: CausalPanels | None = None
    #: a partner GEMM: ``U = A2 @ B2`` per panel beside the product, ``B2`` (after ``B``)
    #: a float32 weight of ``packed_n`` columns packed once, then ``A2`` (``A``'s rank and
    #: rows, its own depth ``K2``); its panel is an epilogue input (unbatched)
    partner: bool = False
    #: attention with a key-tiled (online) softmax: the epilogue computes the softmax's
    #: input per block of key columns (:mod:`~geode.codegen.backends.llvm.attention_tiled`)
    online: OnlinePanels | None = None
    #: a symbolic key length: the key-tiled body's entry (named ``{name}_tiled``, the same
    #: arguments), called when a row panel's scores (``mb x N x item``) pass ``tiled_limit``
    #: bytes; else this entry's row panels run
    tiled: DenseSpec | None = None
    tiled_limit: int = 0

    @property
    def batch(self) -> int:
        """Batch dims of ``Y`` (0 when ``B`` is a matrix)."""
        return max(self.a_rank, self.b_rank, self.v_rank) - 2 if self.b_rank > 2 else 0

    @property
    def y_rank(self) -> int:
        return self.batch + 2 if self.b_rank > 2 else self.a_rank

    @property
    def u_at(self) -> int:
        """Index of ``Bu`` in ``ptrs`` (with a sibling GEMM)."""
        return 2

    @property
    def a2_at(self) -> int:
        """Index of a partner GEMM's ``A2`` in ``ptrs`` (with one)."""
        return 3

    @property
    def v_at(self) -> int:
        """Index of ``V`` in ``ptrs`` (with a second GEMM)."""
        return 2 + int(self.sibling) + 2 * int(self.partner)

    @property
    def partner_at(self) -> int:
        """Index in the ctx of a partner's ``A2`` pointer, then its ``K2`` (after the
        epilogue's pointers; unbatched: no brow dims)."""
        return self.ext_at + len(self.outer)

    @property
    def r_at(self) -> int:
        """Index of the residual ``R`` in ``ptrs`` (with one)."""
        return self.v_at + 1

    @property
    def bias_at(self) -> int:
        """Index of the bias in ``ptrs`` (with one)."""
        return self.r_at + int(self.residual)

    @property
    def ext_at(self) -> int:
        """Index in the ctx of the first epilogue argument's pointer."""
        return _FIXED + 8 * self.batch + 4

    def record_rank(self, which: int, rank: int) -> int:
        """The rank of the array passed for operand ``which`` (0 A, 1 B, 2 V, 3 O) whose
        own rank is ``rank``: its root's when it is laid out as heads."""
        return rank - 1 if self.layouts[which] is not None else rank

    @property
    def first_ext(self) -> int:
        """Index of the first epilogue argument in ``ptrs``."""
        base = 2 + int(self.sibling) + 2 * int(self.partner) + (1 if self.v_rank else 0)
        return base + int(self.residual) + int(self.bias_rank > 0)


def _records(w: SsaWriter, ranks: list[int]) -> list[tuple[str, str, list[str]]]:
    """Load every record: ``(ndim, itemsize, dims)`` per array. Each array's ndim is checked
    (status: its index + 1) before anything after it is read: a record of another rank
    would shift the later ones, and reading on could run past the records."""
    out, pos = [], 0
    for i, rank in enumerate(ranks):
        nd = w.word("%recs", pos)
        w.check(w.eq(nd, rank), i + 1)
        words = [w.word("%recs", pos + 1 + j) for j in range(1 + rank)]
        pos += 2 + rank
        out.append((nd, words[0], words[1:]))
    return out


def _ranks(sp: DenseSpec) -> list[int]:
    b_rank = 3 if sp.packed_n else sp.record_rank(1, sp.b_rank)
    v_rank = 3 if sp.packed_d else sp.record_rank(2, sp.v_rank)
    a_rank = sp.record_rank(0, sp.a_rank)
    ranks = [a_rank, b_rank] + ([3] if sp.sibling else []) + ([3, a_rank] if sp.partner else [])
    ranks += [v_rank] if sp.v_rank else []
    ranks += [sp.y_rank] if sp.residual else []
    ranks += [sp.bias_rank] if sp.bias_rank else []
    ranks += [o.rank for o in sp.outer]
    return ranks + ([sp.record_rank(3, sp.y_rank)] if sp.v_rank else [])


def _logical(
    w: SsaWriter, rec: tuple[str, str, list[str]], lay: HeadLayout | None
) -> tuple[str, str, list[str], list[str]]:
    """A record as its operand's ``(ndim, itemsize, dims, conditions)``: a root laid out as
    heads (:class:`HeadLayout`) gives the operand's dims, on condition that its rows are
    wide enough for the heads."""
    nd, it, dims = rec
    if lay is None:
        return nd, it, dims, []
    lead, seq, width = dims[:-2], dims[-2], dims[-1]
    inner = [str(lay.depth), seq] if lay.transposed else [seq, str(lay.depth)]
    need = lay.offset + lay.heads * lay.depth
    return nd, it, [*lead, str(lay.heads), *inner], [w.op("icmp uge", width, need)]


def _aligned(dims: list[str], nb: int) -> list[str]:
    """An operand's batch dims right-aligned to ``nb`` (``"1"`` where it has none)."""
    batch = dims[:-2]
    return ["1"] * (nb - len(batch)) + batch


def _broadcast_ok(w: SsaWriter, dims: list[str], yb: list[str]) -> list[str]:
    """Each batch dim equals ``Y``'s or is 1."""
    out = []
    for d, y in zip(dims, yb):
        if d != "1":
            out.append(w.tmp(f"or i1 {w.eq(d, y)}, {w.eq(d, 1)}"))
    return out


def _shape(w: SsaWriter, sp: DenseSpec, recs: list, item: int) -> dict:
    """Check A, B (and V) and derive ``M, K, N, T``, ``D`` and ``Y``'s batch dims."""
    a_nd, a_it, ad, a_ok = _logical(w, recs[0], sp.layouts[0])
    b_nd, b_it, bd, b_ok = _logical(w, recs[1], None if sp.packed_n else sp.layouts[1])
    nb = sp.batch
    w.check(w.all_of([w.eq(a_nd, sp.record_rank(0, sp.a_rank)), w.eq(a_it, item), *a_ok]), 1)
    k = ad[-2] if sp.a_trans else ad[-1]
    if sp.packed_n:
        w.check(packed_check(w, recs[1], k, sp.packed_n), 2)
        if sp.sibling:
            w.check(packed_check(w, recs[sp.u_at], k, sp.packed_n), sp.u_at + 1)
        s = {"K": k, "N": str(sp.packed_n), "D": "0"}
        if sp.partner:
            s["K2"] = _partner_shape(w, sp, recs, ad, item)
    else:
        b_rank = sp.record_rank(1, sp.b_rank)
        w.check(w.all_of([w.eq(b_nd, b_rank), w.eq(b_it, item), w.eq(bd[-2], k), *b_ok]), 2)
        s = {"K": k, "N": bd[-1], "D": "0"}
    s["AR"] = ad[-1] if sp.a_trans else "0"
    if nb == 0:
        m = w.product([*ad[:-2], ad[-1]]) if sp.a_trans else w.product(ad[:-1])
        s["M"], s["yb"], s["ab"], s["bb"] = m, [], [], []
    else:
        s["M"], s["ab"], s["bb"] = ad[-2], _aligned(ad, nb), _aligned(bd, nb)
        s["yb"] = [
            w.tmp(f"select i1 {w.eq(a, 1)}, i64 {b}, i64 {a}") for a, b in zip(s["ab"], s["bb"])
        ]
        w.check(w.all_of(_broadcast_ok(w, s["ab"], s["yb"]) or ["true"]), 1)
        w.check(w.all_of(_broadcast_ok(w, s["bb"], s["yb"]) or ["true"]), 2)
    s["T"] = w.product(s["yb"])
    s["vb"] = []
    s["ad"], s["bd"], s["vd"] = ad, bd, []
    if sp.packed_d:  # unbatched (B and V are matrices)
        s["D"] = str(sp.packed_d)
        w.check(packed_check(w, recs[sp.v_at], s["N"], sp.packed_d), sp.v_at + 1)
    elif sp.v_rank:
        v_nd, v_it, vd, v_ok = _logical(w, recs[sp.v_at], sp.layouts[2])
        s["D"], s["vb"], s["vd"] = vd[-1], _aligned(vd, nb), vd
        v_rank = sp.record_rank(2, sp.v_rank)
        conds = [w.eq(v_nd, v_rank), w.eq(v_it, item), w.eq(vd[-2], s["N"]), *v_ok]
        w.check(w.all_of(conds + _broadcast_ok(w, s["vb"], s["yb"])), sp.v_at + 1)
    return s


def _partner_shape(w: SsaWriter, sp: DenseSpec, recs: list, ad: list[str], item: int) -> str:
    """Check a partner GEMM's ``A2`` (``A``'s rank and rows) and packed ``B2`` (``K2`` rows,
    ``N`` columns); returns ``K2``."""
    nd, it, dims = recs[sp.a2_at]
    conds = [w.eq(nd, sp.a_rank), w.eq(it, item)]
    conds += [w.eq(x, y) for x, y in zip(dims[:-1], ad[:-1])]
    w.check(w.all_of(conds), sp.a2_at + 1)
    w.check(packed_check(w, recs[sp.u_at], dims[-1], sp.packed_n), sp.u_at + 1)
    return dims[-1]


def _check_ext(w: SsaWriter, sp: DenseSpec, recs: list, s: dict, item: int) -> list[list[str]]:
    """Check every epilogue argument (and O, and R) against its role; returns each brow
    argument's batch dims."""
    mn = w.tmp(f"mul i64 {s['M']}, {s['N']}")
    sizes = {
        "full": w.tmp(f"mul i64 {s['T']}, {mn}"),
        "col": w.tmp(f"mul i64 {s['T']}, {s['M']}"),
        "row": s["N"],
        "brow": None,
        "scalar": "1",
    }
    brows = []
    base = sp.first_ext
    for i, (arg, (nd, its, dims)) in enumerate(zip(sp.outer, recs[base:])):
        conds = [w.eq(nd, arg.rank), w.eq(its, arg.itemsize)]
        if arg.role == "part":  # Y's rows, arg.width columns
            conds += [w.eq(w.product(dims), w.op("mul", sizes["col"], arg.width))]
            conds.append(w.eq(dims[-1], arg.width))
        elif arg.role in ("brow", "bfull"):
            second_last = 1 if arg.role == "brow" else s["M"]
            conds += [w.eq(dims[-1], s["N"]), w.eq(dims[-2], second_last)]
            bdims = _aligned(dims, sp.batch)
            conds += _broadcast_ok(w, bdims, s["yb"])
            brows.append(bdims)
        else:
            conds.append(w.eq(w.product(dims), sizes[arg.role]))
            if arg.role in ("full", "row") and arg.rank:
                conds.append(w.eq(dims[-1], s["N"]))
            if arg.role == "col" and arg.rank:
                conds.append(w.eq(dims[-1], 1))
        w.check(w.all_of(conds), base + i + 1)
    if sp.v_rank:
        md = w.tmp(f"mul i64 {s['M']}, {s['D']}")
        numel = w.tmp(f"mul i64 {s['T']}, {md}")
        for at in [len(recs) - 1] + ([sp.r_at] if sp.residual else []):
            lay = sp.layouts[3] if at == len(recs) - 1 else None
            nd, its, dims, ok = _logical(w, recs[at], lay)
            if lay is not None:
                s["od"] = dims
                want = [*s["yb"], s["M"], s["D"]]
                conds = [w.eq(nd, sp.y_rank - 1), *ok]
                conds += [w.eq(a, b) for a, b in zip(dims, want)]
            else:
                conds = [w.eq(nd, sp.y_rank), w.eq(w.product(dims), numel)]
                conds.append(w.eq(dims[-1], s["D"]))
            w.check(w.all_of([*conds, w.eq(its, item)]), at + 1)
        if sp.bias_rank:
            nd, its, dims = recs[sp.bias_at]
            conds = [w.eq(nd, sp.bias_rank), w.eq(its, item), w.eq(w.product(dims), s["D"])]
            w.check(w.all_of(conds), sp.bias_at + 1)
    return brows


def _layout_words(
    w: SsaWriter, sp: DenseSpec, s: dict, recs: list
) -> tuple[list[str], list[list[str]]]:
    """The leading dims of ``A``, ``B``, ``V``, ``O`` and, per batch dim of ``Y``, their
    element strides (``0`` where an operand has no such dim): C-contiguous operands'
    from their own dims, those laid out as heads from their roots' (see
    :class:`HeadLayout`)."""
    nb = sp.batch
    o_dims = [*s["yb"], s["M"], s["D"]]
    dims = [s["ad"], s["bd"], s["vd"], o_dims]
    roots = [recs[0][2], recs[1][2], recs[sp.v_at][2] if sp.v_rank else [], recs[-1][2]]
    lds, strides = [], []
    for x in range(4):
        lay = sp.layouts[x] if nb else None
        if x == 1 and sp.packed_n or x == 2 and (sp.packed_d or not sp.v_rank):
            lay = None
        d = dims[x]
        if x == 2 and not d:  # no V: unused
            lds.append(s["D"])
            strides.append(["0"] * nb)
            continue
        if lay is None:
            lds.append(d[-1])
            xb = _aligned(d, nb)
            strides.append([w.product([*xb[i + 1 :], d[-2], d[-1]]) for i in range(nb)])
            continue
        rd = roots[x]
        lds.append(rd[-1])
        own = [w.product(rd[j + 1 :]) for j in range(len(rd) - 2)] + [str(lay.depth)]
        strides.append(["0"] * (nb - len(own)) + own)
    return lds, strides


def _panel_rows(w: SsaWriter, sp: DenseSpec, s: dict, item: int) -> str:
    """Rows per panel, in ``[1, max(M, 1)]``: ``panel_bytes / (N * item)`` rows (at least
    ``min_rows``), a panel the caches hold, when the weights are small enough to re-pack
    for every panel (``(K + D) x N x item <= panel_bytes``); else all rows in one panel
    (the BLAS re-packs large weights for every call, and slows down several-fold on panels
    of a few hundred rows: ``docs/performance.md``; a weight packed once keeps the same
    rule: cache-sized panels measured no better for it, and cost more pool launches). All
    rows when N is 0."""
    m, n = s["M"], s["N"]
    nz = w.eq(n, 0)
    row_bytes = w.op("mul", n, item)
    fit = w.op("udiv", sp.panel_bytes, w.tmp(f"select i1 {nz}, i64 1, i64 {row_bytes}"))
    mb = w.tmp(f"select i1 {w.op('icmp ugt', fit, sp.min_rows)}, i64 {fit}, i64 {sp.min_rows}")
    weights = w.op("mul", w.op("mul", w.op("add", s["K"], s["D"]), n), item)
    large = w.op("icmp ugt", weights, sp.panel_bytes)
    mb = w.tmp(f"select i1 {w.op('or', nz, large, 'i1')}, i64 {m}, i64 {mb}")
    if sp.causal is not None:  # the rows of a panel see as many key columns as its last
        mb = str(sp.causal.rows)
    if sp.online is not None:  # panels of query rows, their keys a block at a time
        mb = str(sp.online.rows)
    mb = w.tmp(f"select i1 {w.op('icmp ult', m, mb)}, i64 {m}, i64 {mb}")
    return w.tmp(f"select i1 {w.op('icmp ult', mb, 1)}, i64 1, i64 {mb}")


def _split_rows(w: SsaWriter, sp: DenseSpec, s: dict, mb: str, nt: str) -> tuple[str, str]:
    """A few rows against packed weights (no re-pack per panel): ``(rows per panel, split)``
    with one panel per thread (``ceil(M / threads)`` rounded up to :data:`SPLIT_TILE` rows)
    when ``mb`` is all ``M`` rows, there are 2 threads or more and ``M`` is at most
    :data:`SPLIT_ROWS` per thread; or panels of :data:`BIG_ROWS` rows when ``mb`` is all
    ``M`` rows and there are :data:`BIG_PANELS` of them per thread or more (any thread
    count). ``split`` then says the panels run on the pool, each GEMM, epilogue and second
    GEMM on one thread: one launch for the whole op instead of one per GEMM plus the
    epilogue's, no wait between them, and the products never in memory (measured on the
    Llama MLP at 2048 rows: ``docs/performance.md``)."""
    if not sp.packed_n or (sp.v_rank and not sp.packed_d) or sp.batch:
        return mb, "false"
    m = s["M"]
    per = w.op("udiv", w.op("add", m, w.op("sub", nt, 1)), nt)
    tile = w.op("mul", w.op("udiv", w.op("add", per, SPLIT_TILE - 1), SPLIT_TILE), SPLIT_TILE)
    conds = [
        w.op("icmp uge", mb, m),
        w.op("icmp ugt", nt, 1),
        w.op("icmp ult", tile, m),
        w.op("icmp ule", m, w.op("mul", nt, SPLIT_ROWS)),
    ]
    few = w.all_of(conds)
    big = w.all_of(
        [
            w.op("icmp uge", mb, m),
            w.op("icmp uge", m, w.op("mul", nt, BIG_PANELS * BIG_ROWS)),
        ]
    )
    rows = w.tmp(f"select i1 {big}, i64 {BIG_ROWS}, i64 {mb}")
    split = w.op("or", few, big, "i1")
    return w.tmp(f"select i1 {few}, i64 {tile}, i64 {rows}"), split


def _entry(sp: DenseSpec, item: int) -> list[str]:
    """The entry: checks, the ctx, and the panels' launch."""
    w = SsaWriter()
    recs = _records(w, _ranks(sp))
    s = _shape(w, sp, recs, item)
    brows = _check_ext(w, sp, recs, s, item)
    if sp.tiled is not None:
        _to_tiled(w, sp, s, item)
    n_ptr = sp.first_ext + len(sp.outer) + (1 if sp.v_rank else 0)
    ptrs = [w.word("%ptrs", i, "ptr") for i in range(n_ptr)]
    nb = sp.batch
    n_ctx = sp.ext_at + len(sp.outer) + nb * len(brows) + (2 if sp.partner else 0)
    ctx = w.tmp(f"alloca [{n_ctx} x i64]")
    as_int = [w.tmp(f"ptrtoint ptr {p} to i64") for p in ptrs]
    v = as_int[sp.v_at] if sp.v_rank else "0"
    o = as_int[-1] if sp.v_rank else "0"
    threads = w.word("%ints", 0)
    pool = w.tmp("call i64 @geode_num_threads()")
    nt = w.tmp(f"select i1 {w.eq(threads, 0)}, i64 {pool}, i64 {threads}")
    mb, split = _split_rows(w, sp, s, _panel_rows(w, sp, s, item), nt)
    if sp.online is not None:
        mb = online_rows(w, sp.online.rows, s["M"], s["T"], nt)
    left = w.tmp(f"add i64 {s['M']}, {w.tmp(f'sub i64 {mb}, 1')}")
    panels = w.tmp(f"udiv i64 {left}, {mb}")
    total = w.tmp(f"mul i64 {s['T']}, {panels}")
    mbn = w.tmp(f"mul i64 {mb}, {s['N']}")
    mnk = w.tmp(f"mul i64 {mbn}, {s['K']}")
    many = w.op("icmp uge", total, w.op("mul", nt, PAR_PANELS))
    small = w.op("or", w.tmp(f"icmp ule i64 {mnk}, {SMALL_GEMM}"), split, "i1")
    small = w.op("or", small, many, "i1")
    if sp.online is not None:  # every panel on one thread, its GEMMs single-threaded
        small = "true"
    par = w.tmp(f"and i1 {small}, {w.tmp(f'icmp ugt i64 {total}, 1')}")
    inner_threads = w.tmp(f"select i1 {par}, i64 1, i64 {threads}")
    fixed = [as_int[0], as_int[1], v, o, s["M"], s["N"], s["K"], s["D"], s["T"], mb, panels]
    fixed += [inner_threads, "0"]
    u = as_int[sp.u_at] if sp.sibling or sp.partner else "0"
    fixed += [u, as_int[sp.r_at] if sp.residual else "0"]
    fixed += [as_int[sp.bias_at] if sp.bias_rank else "0", s["AR"]]
    for i in range(nb):
        fixed += [s["yb"][i], s["ab"][i], s["bb"][i], s["vb"][i] if s["vb"] else "1"]
    lds, strides = _layout_words(w, sp, s, recs)
    fixed += lds
    for i in range(nb):
        fixed += [strides[x][i] for x in range(4)]
    words = fixed
    words += as_int[sp.first_ext : sp.first_ext + len(sp.outer)]
    words += [d for dims in brows for d in dims]
    words += [as_int[sp.a2_at], s["K2"]] if sp.partner else []
    for i, x in enumerate(words):
        w.put(ctx, i, x)
    w.emit(f"  br i1 {par}, label %par, label %serial")
    w.label("par")
    w.emit(
        f"  call void @geode_parallel_for(ptr @{sp.name}.chunk, ptr {ctx}, i64 {total}, "
        f"i64 {threads})"
    )
    w.emit("  br label %done")
    w.label("serial")
    w.emit(f"  %go = icmp ugt i64 {total}, 0")
    w.emit("  br i1 %go, label %loop, label %done")
    w.label("loop")
    w.emit("  %c = phi i64 [ 0, %serial ], [ %c1, %loop ]")
    w.emit(f"  call void @{sp.name}.chunk(ptr {ctx}, i64 %c, i64 {total})")
    w.emit("  %c1 = add i64 %c, 1")
    w.emit(f"  %more = icmp ult i64 %c1, {total}")
    w.emit("  br i1 %more, label %loop, label %done")
    w.label("done")
    st = w.word(ctx, _STATUS)
    w.emit(f"  %st = trunc i64 {st} to i32")
    w.emit("  ret i32 %st")
    head = [f"define i32 @{sp.name}(ptr %ptrs, ptr %recs, ptr %ints) {{", "entry:"]
    return head + w.lines + ["}"]


def tiled_cell(name: str) -> str:
    """The symbol of the entry ``name``'s pointer to its key-tiled body (an imported
    8-byte cell: null until the body is linked, :class:`~.compiled.DenseKernel`)."""
    return name + TILED_CELL


def _to_tiled(w: SsaWriter, sp: DenseSpec, s: dict, item: int) -> None:
    """Branch to the key-tiled body's entry when a row panel's scores pass
    ``sp.tiled_limit`` bytes (``profit.online_limit``'s rule on this call's shapes) and the
    body is linked: its address is read from the cell :func:`tiled_cell` (null: the row
    panels run). Its temporaries are named apart (``%kt..``): the row panels' code keeps
    its text."""
    assert sp.tiled is not None
    sub = SsaWriter()
    sub.n = base = w.n
    mb = _panel_rows(sub, sp, s, item)
    scores = sub.op("mul", sub.op("mul", mb, s["N"]), item)
    long = sub.op("icmp ugt", scores, sp.tiled_limit)
    fn = sub.tmp(f"load atomic ptr, ptr @{tiled_cell(sp.name)} acquire, align 8")
    linked = sub.tmp(f"icmp ne ptr {fn}, null")
    sub.emit(f"  br i1 {sub.op('and', long, linked, 'i1')}, label %key_tiled, label %row_panels")
    sub.label("key_tiled")
    sub.emit(f"  %tiled_st = call i32 {fn}(ptr %ptrs, ptr %recs, ptr %ints)")
    sub.emit("  ret i32 %tiled_st")
    sub.label("row_panels")

    def own(m: re.Match) -> str:
        return f"%kt{m.group(1)}" if int(m.group(1)) > base else m.group(0)

    w.lines += [re.sub(r"%t(\d+)\b", own, line) for line in sub.lines]


def _gemm(
    w: SsaWriter, dtype: str, mnk: list[str], ops: list[tuple[str, str]], threads: str
) -> None:
    """``C = A @ B`` (row-major): ``mnk`` the sizes, ``ops`` ``(pointer, leading dim)`` of
    A, B, C; through ``geode_gemm`` (inside a pool job, one serial call: the BLAS, or
    geode's own kernel for a float32 row)."""
    m, n, k = mnk
    w.emit(gemm_call(dtype, m, n, k, ops, threads))


def _offsets(w: SsaWriter, sp: DenseSpec, t: str, n_brow: int) -> dict[str, str]:
    """Offsets of batch ``t``: in elements in A, B, V and O (from their strides, a head
    layout's column offset included), in matrices in each brow argument (broadcast dims
    index 0)."""
    nb, n_ext = sp.batch, len(sp.outer)
    names = ["a", "b", "v", "o"] + [f"r{j}" for j in range(n_brow)]
    off = {x: "0" for x in names}
    for x, lay in zip("abvo", sp.layouts):
        if lay is not None and nb:
            off[x] = str(lay.offset)
    stride = {x: "1" for x in names}
    rest = t
    for i in reversed(range(nb)):
        y = w.word("%ctx", _FIXED + 4 * i)
        q = w.tmp(f"udiv i64 {rest}, {y}")
        idx = w.tmp(f"sub i64 {rest}, {w.tmp(f'mul i64 {q}, {y}')}")
        for x in names:
            if x[0] == "r":
                d = w.word("%ctx", sp.ext_at + n_ext + int(x[1:]) * nb + i)
                use = w.tmp(f"select i1 {w.eq(d, 1)}, i64 0, i64 {idx}")
                off[x] = w.tmp(f"add i64 {off[x]}, {w.tmp(f'mul i64 {use}, {stride[x]}')}")
                stride[x] = w.tmp(f"mul i64 {stride[x]}, {d}")
                continue
            if x == "o":
                use = idx
            else:
                d = w.word("%ctx", _FIXED + 4 * i + 1 + "abv".index(x))
                use = w.tmp(f"select i1 {w.eq(d, 1)}, i64 0, i64 {idx}")
            step = w.word("%ctx", _FIXED + 4 * nb + 4 + 4 * i + "abvo".index(x))
            off[x] = w.tmp(f"add i64 {off[x]}, {w.tmp(f'mul i64 {use}, {step}')}")
        rest = q
    return off


def _inner_dims(w: SsaWriter, arg: InnerArg, rows: str, n: str) -> list[str]:
    """The epilogue argument's record dims for a panel: its 2-D shape by role, with the
    dims its view merges multiplied."""
    two = {"col": [rows, "1"], "row": [n], "brow": [n], "scalar": []}.get(arg.role, [rows, n])
    if arg.role == "part":
        two = [rows, str(arg.width)]
    if arg.view is None:
        return two
    bounds = [*arg.view, len(two)]
    return [w.product(two[bounds[k] : bounds[k + 1]]) for k in range(len(arg.view))]


def _inner_rank(arg: InnerArg) -> int:
    if arg.view is not None:
        return len(arg.view)
    return {"row": 1, "brow": 1, "scalar": 0}.get(arg.role, 2)


def _epilogue_args(w: SsaWriter, sp: DenseSpec, v: dict[str, str], off: dict[str, str]) -> None:
    """Fill the epilogue's pointers, records and dims for this panel."""
    pos, brow = 0, 0
    n_ext = len(sp.outer)
    for j, arg in enumerate(sp.inner):
        if arg.source < 0:
            data = {-1: v["s1"], -2: v["s2"], -3: v["s3"], -4: v["s4"]}[arg.source]
        else:
            base = w.tmp(f"inttoptr i64 {w.word('%ctx', sp.ext_at + arg.source)} to ptr")
            outer = sp.outer[arg.source]
            if outer.role == "brow":
                elems = w.op("mul", off[f"r{brow}"], v["N"])
                brow += 1
            elif outer.role == "bfull":
                row = w.op("add", w.op("mul", off[f"r{brow}"], v["M"]), v["p0"])
                elems = w.op("mul", row, v["N"])
                brow += 1
            elif outer.role == "part":  # a narrow epilogue's columns: r0 rows of width
                elems = w.op("mul", v["r0"], outer.width)
            else:
                elems = {"full": v["r0n"], "col": v["r0"]}.get(outer.role, "0")
            byte = w.tmp(f"mul i64 {elems}, {arg.itemsize}")
            data = w.tmp(f"getelementptr inbounds i8, ptr {base}, i64 {byte}")
        if sp.causal is not None and j == sp.causal.arg:  # the mask _causal_mask built
            data = w.tmp(f"select i1 {v['narrow']}, ptr {v['s4']}, ptr {data}")
        w.put(v["iptrs"], j, data, "ptr")
        dims = _inner_dims(w, arg, v["rows"], v["NV"])
        for word in [str(len(dims)), str(arg.itemsize), *dims]:
            w.put(v["irecs"], pos, word)
            pos += 1
    named = {"rows": v["rows"], "cols": v["NV"], "threads": v["threads"]}
    for j, d in enumerate([*sp.inner_dims, "threads"]):
        w.put(v["iints"], j, named[d] if isinstance(d, str) else str(int(d)))
    del n_ext


def _fail(w: SsaWriter, v: dict[str, str], status: str) -> None:
    w.put("%ctx", _STATUS, status)
    w.emit("  ret void")


def _chunk(sp: DenseSpec, item: int) -> list[str]:
    """``void @D.chunk(ctx, c, n)``: panel ``c`` (matrix ``c / P``, rows from
    ``(c mod P) x mb``): GEMM, epilogue, second GEMM (see the module docstring)."""
    ty = TYPES[sp.dtype][0]
    w = SsaWriter()
    n_rec = sum(2 + _inner_rank(a) for a in sp.inner)
    v = {
        "iptrs": w.tmp(f"alloca [{max(len(sp.inner), 1)} x ptr]"),
        "irecs": w.tmp(f"alloca [{max(n_rec, 1)} x i64]"),
        "iints": w.tmp(f"alloca [{len(sp.inner_dims) + 1} x i64]"),
    }
    for key, at in (("M", _M), ("N", _N), ("K", _K), ("D", _D), ("mb", _MB), ("P", _P)):
        v[key] = w.word("%ctx", at)
    v["threads"] = w.word("%ctx", _THREADS)
    t = w.tmp(f"udiv i64 %c, {v['P']}")
    p0 = w.op("mul", w.op("sub", "%c", w.op("mul", t, v["P"])), v["mb"])
    left = w.tmp(f"sub i64 {v['M']}, {p0}")
    short = w.op("icmp ult", left, v["mb"])
    v["rows"] = w.tmp(f"select i1 {short}, i64 {left}, i64 {v['mb']}")
    v["p0"] = p0
    v["NV"] = _visible(w, sp, v)
    if sp.causal is not None:
        v["narrow"] = w.op("icmp ult", v["NV"], v["N"])
    n_brow = sum(1 for o in sp.outer if o.role in ("brow", "bfull"))
    off = _offsets(w, sp, t, n_brow)
    v["r0"] = w.op("add", w.op("mul", t, v["M"]), p0)
    v["r0n"] = w.tmp(f"mul i64 {v['r0']}, {v['N']}")
    ptr = {
        x: w.tmp(f"inttoptr i64 {w.word('%ctx', at)} to ptr")
        for x, at in (
            ("A", _A),
            ("B", _B),
            ("V", _V),
            ("O", _O),
            ("U", _U),
            ("R", _R),
            ("bias", _BIAS),
        )
    }
    for x, at in (("lda", 0), ("ldb", 1), ("ldv", 2), ("ldo", 3)):
        v[x] = w.word("%ctx", _FIXED + 4 * sp.batch + at)
    a_el = w.op("add", off["a"], w.op("mul", p0, v["lda"]))
    pa = w.tmp(f"getelementptr inbounds {ty}, ptr {ptr['A']}, i64 {a_el}")
    pb = w.tmp(f"getelementptr inbounds {ty}, ptr {ptr['B']}, i64 {off['b']}")
    if sp.online is not None:
        hooks = Hooks(_inner_dims, _fail, NO_MEMORY, EPILOGUE_STATUS)
        online_panel(w, sp, v, ptr, off, pa, pb, hooks)
        head = [f"define internal void @{sp.name}.chunk(ptr %ctx, i64 %c, i64 %n) {{", "entry:"]
        return head + w.lines + ["}"]
    panel = w.op("mul", w.op("mul", v["rows"], v["N"]), item)
    size = w.tmp(f"select i1 {w.tmp(f'icmp ult i64 {panel}, 64')}, i64 64, i64 {panel}")
    v["s1"] = w.tmp(f"call ptr @geode_scratch(i64 0, i64 {size})")
    if sp.in_place >= 0:
        v["s1"] = _in_place_panel(w, sp, v, ptr["A"], item)
    v["s2"] = w.tmp(f"call ptr @geode_scratch(i64 1, i64 {size})") if sp.v_rank else "null"
    beside = sp.sibling or sp.partner
    v["s3"] = w.tmp(f"call ptr @geode_scratch(i64 3, i64 {size})") if beside else "null"
    rms = sp.rms_eps is not None
    v["s4"] = "null"
    if sp.causal is not None:  # the panel's mask, in slot 2 (no RMSNorm prologue here)
        rms = True
        col = w.op("mul", w.op("mul", v["rows"], v["NV"]), sp.inner[sp.causal.arg].itemsize)
        col = w.tmp(f"select i1 {w.tmp(f'icmp ult i64 {col}, 64')}, i64 64, i64 {col}")
        v["s4"] = w.tmp(f"call ptr @geode_scratch(i64 2, i64 {col})")
    elif rms:  # slot 2 (the Winograd conv's) is free while a dense panel runs on the thread
        col = w.op("mul", v["rows"], item)
        col = w.tmp(f"select i1 {w.tmp(f'icmp ult i64 {col}, 64')}, i64 64, i64 {col}")
        v["s4"] = w.tmp(f"call ptr @geode_scratch(i64 2, i64 {col})")
    ok = w.tmp(f"icmp ne ptr {v['s1']}, null")
    for x, there in (("s2", sp.v_rank), ("s3", beside), ("s4", rms)):
        if there:
            ok = w.op("and", ok, w.op("icmp ne", v[x], "null", "ptr"), "i1")
    w.emit(f"  br i1 {ok}, label %mem, label %nomem")
    w.label("nomem")
    _fail(w, v, str(NO_MEMORY))
    w.label("mem")
    if sp.causal is not None:
        _causal_mask(w, sp, v)
    elif rms:
        _rms_rows(w, sp, v, pa)
    skip = w.tmp(f"or i1 {w.eq(v['K'], 0)}, {w.eq(v['N'], 0)}")
    w.emit(f"  br i1 {skip}, label %zero, label %gemm")
    w.label("zero")
    for x in ("s1", "s3") if sp.sibling else ("s1",):
        w.emit(f"  call void @llvm.memset.p0.i64(ptr {v[x]}, i8 0, i64 {panel}, i1 false)")
    w.emit(f"  br label %{'part' if sp.partner else 'epi'}")
    w.label("gemm")
    ops = [(pa, v["lda"]), (pb, v["ldb"]), (v["s1"], v["NV"])]
    if sp.a_trans:  # A's rows are X's columns: X's matrix K x R, from row p0 (unbatched)
        ar = w.word("%ctx", _AROWS)
        at = (ptr["A"], "1", ar, ar, w.op("mul", v["K"], ar), p0)
        w.emit(packed_at_call(v["rows"], v["N"], v["K"], at, pb, (v["s1"], v["N"]), v["threads"]))
    elif sp.packed_n:
        w.emit(packed_call(v["rows"], v["N"], v["K"], ops, v["threads"]))
        if sp.sibling:  # U's panel from the same rows of A, while they are in cache
            uops = [(pa, v["K"]), (ptr["U"], "0"), (v["s3"], v["N"])]
            w.emit(packed_call(v["rows"], v["N"], v["K"], uops, v["threads"]))
    else:
        trans_b = sp.layouts[1] is not None and sp.layouts[1].transposed
        cols = v["NV"]
        w.emit(gemm_call(sp.dtype, v["rows"], cols, v["K"], ops, v["threads"], "0.0", trans_b))
    w.emit(f"  br label %{'part' if sp.partner else 'epi'}")
    if sp.partner:
        _partner_panel(w, sp, v, ptr, panel)
    w.label("epi")
    _epilogue_args(w, sp, v, off)
    st = w.tmp(f"call i32 @{sp.epilogue}(ptr {v['iptrs']}, ptr {v['irecs']}, ptr {v['iints']})")
    w.emit(f"  br i1 {w.tmp(f'icmp ne i32 {st}, 0')}, label %bad, label %good")
    w.label("bad")
    _fail(w, v, w.tmp(f"zext i32 {w.tmp(f'add i32 {st}, {EPILOGUE_STATUS}')} to i64"))
    w.label("good")
    if sp.v_rank:
        _second_gemm(w, sp, v, ptr, off, item)
    w.emit("  ret void")
    head = [f"define internal void @{sp.name}.chunk(ptr %ctx, i64 %c, i64 %n) {{", "entry:"]
    return head + w.lines + ["}"]


def _partner_panel(w: SsaWriter, sp: DenseSpec, v: dict, ptr: dict, panel: str) -> None:
    """A partner GEMM's panel ``A2[p0:p0+rows] @ B2`` into scratch slot 3 (zeros when
    ``K2`` or ``N`` is 0), then on to the epilogue."""
    w.label("part")
    a2 = w.tmp(f"inttoptr i64 {w.word('%ctx', sp.partner_at)} to ptr")
    k2 = w.word("%ctx", sp.partner_at + 1)
    skip = w.tmp(f"or i1 {w.eq(k2, 0)}, {w.eq(v['N'], 0)}")
    w.emit(f"  br i1 {skip}, label %pzero, label %pgemm")
    w.label("pzero")
    w.emit(f"  call void @llvm.memset.p0.i64(ptr {v['s3']}, i8 0, i64 {panel}, i1 false)")
    w.emit("  br label %epi")
    w.label("pgemm")
    pa2 = w.tmp(f"getelementptr inbounds float, ptr {a2}, i64 {w.op('mul', v['p0'], k2)}")
    ops = [(pa2, k2), (ptr["U"], "0"), (v["s3"], v["N"])]
    w.emit(packed_call(v["rows"], v["N"], k2, ops, v["threads"]))
    w.emit("  br label %epi")


def _visible(w: SsaWriter, sp: DenseSpec, v: dict) -> str:
    """The key columns the panel computes: ``N``, or with causal panels the columns its
    last row sees, ``p0 + rows - 1 + offset``, rounded up to :data:`CAUSAL_ALIGN`, at most
    ``N`` (:class:`CausalPanels`)."""
    if sp.causal is None:
        return v["N"]
    last = w.op("add", w.op("add", v["p0"], v["rows"]), sp.causal.offset - 1 + CAUSAL_ALIGN - 1)
    last = w.op("mul", w.op("udiv", last, CAUSAL_ALIGN), CAUSAL_ALIGN)
    return w.tmp(f"select i1 {w.op('icmp ult', v['N'], last)}, i64 {v['N']}, i64 {last}")


def _causal_mask(w: SsaWriter, sp: DenseSpec, v: dict) -> None:
    """The panel's mask ``[rows, NV]`` into ``s4`` when the panel computes fewer than all
    ``N`` columns (``v["narrow"]``; else the epilogue reads the mask's own rows): element
    ``(r, j)`` is ``masked`` when ``j >= p0 + r + offset``, else ``kept`` (the mask's values
    there; a bool as a byte)."""
    cp = sp.causal
    assert cp is not None
    item = sp.inner[cp.arg].itemsize
    ty = {1: "i8", 4: "float", 8: "double"}[item]
    lit = (lambda x: str(int(x != 0))) if item == 1 else (lambda x: float_literal(x, ty))
    start = w.op("add", v["p0"], cp.offset)
    w.emit(f"  br i1 {v['narrow']}, label %cm_start, label %cm_done")
    w.label("cm_start")
    w.emit("  br label %cm_row")
    w.label("cm_row")
    w.emit("  %cm_r = phi i64 [ 0, %cm_start ], [ %cm_r1, %cm_rend ]")
    w.emit(f"  %cm_cut = add i64 {start}, %cm_r")
    w.emit(f"  %cm_base = mul i64 %cm_r, {v['NV']}")
    w.emit("  br label %cm_col")
    w.label("cm_col")
    w.emit("  %cm_j = phi i64 [ 0, %cm_row ], [ %cm_j1, %cm_col ]")
    w.emit("  %cm_m = icmp uge i64 %cm_j, %cm_cut")
    w.emit(f"  %cm_x = select i1 %cm_m, {ty} {lit(cp.masked)}, {ty} {lit(cp.kept)}")
    w.emit("  %cm_i = add i64 %cm_base, %cm_j")
    w.emit(f"  %cm_p = getelementptr inbounds {ty}, ptr {v['s4']}, i64 %cm_i")
    w.emit(f"  store {ty} %cm_x, ptr %cm_p")
    w.emit("  %cm_j1 = add i64 %cm_j, 1")
    w.emit(f"  %cm_more = icmp ult i64 %cm_j1, {v['NV']}")
    w.emit("  br i1 %cm_more, label %cm_col, label %cm_rend")
    w.label("cm_rend")
    w.emit("  %cm_r1 = add i64 %cm_r, 1")
    w.emit(f"  %cm_rmore = icmp ult i64 %cm_r1, {v['rows']}")
    w.emit("  br i1 %cm_rmore, label %cm_row, label %cm_done")
    w.label("cm_done")


def _in_place_panel(w: SsaWriter, sp: DenseSpec, v: dict, pa: str, item: int) -> str:
    """The panel the GEMM writes and the epilogue reads (``DenseSpec.in_place``): rows
    ``r0 ..`` of the epilogue's output, or the scratch panel (``v["s1"]``: NULL when out
    of memory) when the output's ``M x N`` overlaps ``A``'s ``M x K`` (the GEMM of a panel
    re-reads its rows of ``A`` after it has stored some of its sums)."""
    word = w.word("%ctx", sp.ext_at + sp.in_place)
    out = w.tmp(f"inttoptr i64 {word} to ptr")
    a0 = w.tmp(f"ptrtoint ptr {pa} to i64")
    a1 = w.op("add", a0, w.op("mul", w.op("mul", v["M"], v["K"]), item))
    o1 = w.op("add", word, w.op("mul", w.op("mul", v["M"], v["N"]), item))
    apart = w.op("or", w.op("icmp ule", a1, word), w.op("icmp ule", o1, a0), "i1")
    byte = w.op("mul", v["r0n"], item)
    panel = w.tmp(f"getelementptr inbounds i8, ptr {out}, i64 {byte}")
    return w.tmp(f"select i1 {apart}, ptr {panel}, ptr {v['s1']}")


def _rms_rows(w: SsaWriter, sp: DenseSpec, v: dict, pa: str) -> None:
    """``s4[r] = 1 / sqrt(sum_k A[r, k]^2 / K + eps)`` for the panel's rows (``rows >= 1``)
    from ``pa`` (the panel's first row of ``A``, rows of ``K``): each row's sum in one
    loop whose adds may be reordered (``reassoc``: LLVM sums in vector lanes), then the
    mean, the square root and the division as the norm's kernel does them (IEEE)."""
    ty = TYPES[sp.dtype][0]
    suffix = "f32" if ty == "float" else "f64"
    eps = float_literal(float(sp.rms_eps), ty)
    kf = w.tmp(f"uitofp i64 {v['K']} to {ty}")
    kgo = w.tmp(f"icmp ugt i64 {v['K']}, 0")
    w.emit("  br label %rms_start")
    w.label("rms_start")
    w.emit("  br label %rms_row")
    w.label("rms_row")
    w.emit("  %rms_r = phi i64 [ 0, %rms_start ], [ %rms_r1, %rms_end ]")
    w.emit(f"  %rms_base = mul i64 %rms_r, {v['K']}")
    w.emit(f"  br i1 {kgo}, label %rms_k, label %rms_end")
    w.label("rms_k")
    w.emit("  %rms_j = phi i64 [ 0, %rms_row ], [ %rms_j1, %rms_k ]")
    w.emit(f"  %rms_s = phi {ty} [ 0.0, %rms_row ], [ %rms_s1, %rms_k ]")
    w.emit("  %rms_i = add i64 %rms_base, %rms_j")
    w.emit(f"  %rms_p = getelementptr inbounds {ty}, ptr {pa}, i64 %rms_i")
    w.emit(f"  %rms_x = load {ty}, ptr %rms_p")
    w.emit(f"  %rms_xx = fmul {ty} %rms_x, %rms_x")
    w.emit(f"  %rms_s1 = fadd reassoc {ty} %rms_s, %rms_xx")
    w.emit("  %rms_j1 = add i64 %rms_j, 1")
    w.emit(f"  %rms_more = icmp ult i64 %rms_j1, {v['K']}")
    w.emit("  br i1 %rms_more, label %rms_k, label %rms_end")
    w.label("rms_end")
    w.emit(f"  %rms_sum = phi {ty} [ 0.0, %rms_row ], [ %rms_s1, %rms_k ]")
    w.emit(f"  %rms_m = fdiv {ty} %rms_sum, {kf}")
    w.emit(f"  %rms_me = fadd {ty} %rms_m, {eps}")
    w.emit(f"  %rms_sq = call {ty} @llvm.sqrt.{suffix}({ty} %rms_me)")
    w.emit(f"  %rms_c = fdiv {ty} 1.0, %rms_sq")
    w.emit(f"  %rms_o = getelementptr inbounds {ty}, ptr {v['s4']}, i64 %rms_r")
    w.emit(f"  store {ty} %rms_c, ptr %rms_o")
    w.emit("  %rms_r1 = add i64 %rms_r, 1")
    w.emit(f"  %rms_rmore = icmp ult i64 %rms_r1, {v['rows']}")
    w.emit("  br i1 %rms_rmore, label %rms_row, label %rms_done")
    w.label("rms_done")


def _second_gemm(w: SsaWriter, sp: DenseSpec, v: dict, ptr: dict, off: dict, item: int) -> None:
    """``O[r0:r0+rows] = P @ V_t`` (zeros when N is 0; nothing when D is 0); with a
    bias, the GEMM adds it to each sum; with a residual ``R``, O's panel is first a copy of
    R's and the GEMM adds its sums (and the bias) to it (``beta`` 1: each element its sum
    from zero, plus the bias, plus R's value: the bits of the ``Add`` nodes)."""
    ty = TYPES[sp.dtype][0]
    pv = w.tmp(f"getelementptr inbounds {ty}, ptr {ptr['V']}, i64 {off['v']}")
    o_el = w.op("add", off["o"], w.op("mul", v["p0"], v["ldo"]))
    po = w.tmp(f"getelementptr inbounds {ty}, ptr {ptr['O']}, i64 {o_el}")
    nbytes = w.op("mul", w.op("mul", v["rows"], v["D"]), item)
    w.emit(f"  br i1 {w.eq(v['D'], 0)}, label %out, label %some")
    w.label("some")
    if sp.residual:  # K = N = 0 in the packed GEMM leaves C as it is: R (plus the bias)
        pr = w.tmp(f"getelementptr inbounds {ty}, ptr {ptr['R']}, i64 {o_el}")
        w.emit(f"  call void @llvm.memcpy.p0.p0.i64(ptr {po}, ptr {pr}, i64 {nbytes}, i1 false)")
        w.emit("  br label %gemm2")
    elif sp.bias_rank:  # K = N = 0 in the packed GEMM with a bias writes the bias
        w.emit("  br label %gemm2")
    elif sp.packed_d:  # O is contiguous (V a matrix); the packed GEMM leaves C as it is
        w.emit(f"  br i1 {w.eq(v['N'], 0)}, label %zero2, label %gemm2")
        w.label("zero2")
        w.emit(f"  call void @llvm.memset.p0.i64(ptr {po}, i8 0, i64 {nbytes}, i1 false)")
        w.emit("  br label %out")
    else:  # geode_gemm writes zero rows (at O's leading dim) when N is 0
        w.emit("  br label %gemm2")
    w.label("gemm2")
    ops = [(v["s2"], v["NV"]), (pv, v["ldv"]), (po, v["ldo"])]
    if sp.packed_d:
        beta = 1.0 if sp.residual else 0.0
        bias = ptr["bias"] if sp.bias_rank else None
        w.emit(packed_call(v["rows"], v["D"], v["N"], ops, v["threads"], beta, bias))
    else:
        _gemm(w, sp.dtype, [v["rows"], v["D"], v["NV"]], ops, v["threads"])
    w.emit("  br label %out")
    w.label("out")


_SQRT = (("float", "f32"), ("double", "f64"))


def _check_layouts(sp: DenseSpec) -> None:
    """CodegenError unless the head layouts are ones the entry runs: batched products
    only, on operands there are (a packed or absent ``V``, a packed ``B``, a residual's
    ``O`` have none), transposed on ``B`` only."""
    if len(sp.layouts) != 4:
        raise CodegenError(f"{sp.name}: layouts of A, B, V and O expected")
    if all(lay is None for lay in sp.layouts):
        return
    absent = [
        sp.batch == 0,
        sp.packed_n > 0 and sp.layouts[1] is not None,
        (sp.packed_d > 0 or not sp.v_rank) and sp.layouts[2] is not None,
        (sp.residual or sp.bias_rank or not sp.v_rank) and sp.layouts[3] is not None,
    ]
    if any(absent):
        raise CodegenError(f"{sp.name}: a head layout on an operand that cannot have one")
    for x, lay in enumerate(sp.layouts):
        if lay is None:
            continue
        if lay.heads < 1 or lay.depth < 1 or lay.offset < 0 or (lay.transposed and x != 1):
            raise CodegenError(f"{sp.name}: bad head layout {lay} of operand {'ABVO'[x]}")


def _check_causal(sp: DenseSpec) -> None:
    """CodegenError unless causal panels (:class:`CausalPanels`) fit the entry: a batched
    product with a second GEMM, neither weight packed, no sibling, no RMSNorm prologue, the
    mask argument a ``bfull`` bool, float32 or float64, offset and rows at least 1."""
    cp = sp.causal
    if cp is None:
        return
    bad = [
        sp.batch == 0 or not sp.v_rank or sp.packed_n > 0 or sp.packed_d > 0,
        sp.sibling or sp.rms_eps is not None or sp.a_trans,
        cp.offset < 1 or cp.rows < 1 or not 0 <= cp.arg < len(sp.inner),
    ]
    if not any(bad):
        arg = sp.inner[cp.arg]
        bad.append(arg.role != "bfull" or arg.source < 0 or arg.itemsize not in (1, 4, 8))
    if any(bad):
        raise CodegenError(f"{sp.name}: no causal panels here (see CausalPanels)")


def _check_online(sp: DenseSpec) -> None:
    """CodegenError unless key-tiled panels (:class:`OnlinePanels`) fit the entry: a batched
    product with a second GEMM, neither weight packed, no sibling, residual, bias, RMSNorm
    prologue or causal panels; float32 or float64; the epilogue's arguments the product,
    the softmax's input (its output) and inputs whose block is at a column offset (``row``,
    ``brow``, ``col``, ``scalar``) but for the one ``full`` / ``bfull`` mask copied per
    block."""
    op = sp.online
    if op is None:
        return
    bad = [
        sp.batch == 0 or not sp.v_rank or sp.packed_n > 0 or sp.packed_d > 0,
        sp.sibling or sp.residual or sp.bias_rank > 0 or sp.rms_eps is not None,
        sp.a_trans or sp.causal is not None or sp.in_place >= 0,
        op.rows < 1 or op.keys < 1 or not -1 <= op.mask < len(sp.inner),
        sp.dtype not in ("float32", "float64"),
    ]
    for j, arg in enumerate(sp.inner):
        if arg.source in (-3, -4) or (arg.source >= 0 and arg.role in ("full", "bfull")) != (
            j == op.mask
        ):
            bad.append(True)
    if op.mask >= 0 and sp.inner[op.mask].source < 0:
        bad.append(True)
    if any(bad):
        raise CodegenError(f"{sp.name}: no key-tiled panels here (see OnlinePanels)")


def _in_place_ok(sp: DenseSpec) -> bool:
    """``in_place`` names a ``full`` argument of the product's item size that the epilogue
    only writes, with one GEMM, unbatched, ``A`` in place."""
    if sp.in_place >= len(sp.outer) or sp.v_rank or sp.sibling or sp.batch or sp.a_trans:
        return False
    if sp.partner:
        return False
    out = sp.outer[sp.in_place]
    reads = [a for a in sp.inner if a.source == sp.in_place]
    return out.role == "full" and out.itemsize == TYPES[sp.dtype][2] and len(reads) == 1


def dense_ir(sp: DenseSpec) -> str:
    """The entry's module (see the module docstring)."""
    item = TYPES[sp.dtype][2]
    if sp.partner and (not sp.packed_n or sp.sibling or sp.batch or sp.v_rank or sp.a_trans):
        raise CodegenError(f"{sp.name}: a partner GEMM needs B packed once, one GEMM, unbatched")
    if sp.a_trans and (not sp.packed_n or sp.sibling or sp.batch):
        raise CodegenError(f"{sp.name}: A read transposed needs B packed once, unbatched")
    if sp.rms_eps is not None and (sp.a_trans or sp.batch):
        raise CodegenError(f"{sp.name}: an RMSNorm prologue needs A's rows in place, unbatched")
    if (sp.sibling and not sp.packed_n) or ((sp.residual or sp.bias_rank) and not sp.packed_d):
        raise CodegenError(
            f"{sp.name}: a sibling GEMM needs B, a residual or a bias V, packed once"
        )
    _check_layouts(sp)
    _check_causal(sp)
    _check_online(sp)
    if sp.in_place >= 0 and not _in_place_ok(sp):
        raise CodegenError(f"{sp.name}: no in-place panel here (see DenseSpec.in_place)")
    head = [
        GEMM_DECL,
        *([PACKED_DECL] if sp.packed_n or sp.packed_d else []),
        *([PACKED_BIAS_DECL] if sp.bias_rank else []),
        *([PACKED_AT_DECL] if sp.a_trans else []),
        f"declare i32 @{sp.epilogue}(ptr, ptr, ptr)",
        "declare void @geode_parallel_for(ptr, ptr, i64, i64)",
        "declare i64 @geode_num_threads()",
        "declare ptr @geode_scratch(i64, i64)",
        "declare void @llvm.memset.p0.i64(ptr, i8, i64, i1)",
        *(["declare void @llvm.memcpy.p0.p0.i64(ptr, ptr, i64, i1)"] if sp.residual else []),
        *([f"declare {t} @llvm.sqrt.{x}({t})" for t, x in _SQRT] if sp.rms_eps is not None else []),
    ]
    if sp.tiled is not None:  # the key-tiled body: its own module (:func:`tiled_ir`)
        _check_tiled(sp)
        head.append(f"@{tiled_cell(sp.name)} = external global ptr, align 8")
    if sp.online is not None:
        head += online_declares(sp.dtype, head)
    body = _chunk(sp, item) + _entry(sp, item)
    return "\n".join(head + body) + "\n"


def tiled_ir(sp: DenseSpec) -> str:
    """The module of the key-tiled body of the entry ``sp`` that chooses per call
    (``sp.tiled``, exporting ``{sp.name}_tiled``): compiled apart, when a call first
    needs it, and its address stored in the entry's cell (:func:`tiled_cell`)."""
    if sp.tiled is None:
        raise CodegenError(f"{sp.name}: no key-tiled body")
    _check_tiled(sp)
    return dense_ir(sp.tiled)


def _check_tiled(sp: DenseSpec) -> None:
    """CodegenError unless ``sp.tiled`` is a key-tiled body taking ``sp``'s arguments."""
    t = sp.tiled
    assert t is not None
    same = dataclasses.replace(t, name=sp.name, inner=sp.inner, inner_dims=sp.inner_dims)
    same = dataclasses.replace(same, epilogue=sp.epilogue, online=None, tiled=sp.tiled)
    same = dataclasses.replace(same, tiled_limit=sp.tiled_limit)
    if sp.online is not None or t.online is None or t.tiled is not None or same != sp:
        raise CodegenError(f"{sp.name}: the key-tiled body does not take the entry's arguments")
    if t.name != f"{sp.name}_tiled" or t.epilogue == sp.epilogue:
        raise CodegenError(f"{sp.name}: the key-tiled body needs its own names")
    _check_online(t)


def link_dense(
    name: str, ir: str, cache_dir: CacheDir | None, epilogue: Any, cell: Any = None
) -> tuple[jit.Loaded, bool]:
    """The machine code of the dense entry ``name`` (module ``ir``, through the disk cache
    in ``cache_dir``) linked to the compiled ``epilogue`` kernel it calls, which it keeps
    alive (its address is in the code), and whether it came from the cache. ``cell``: an
    entry choosing per call reads its key-tiled body's address from this ctypes pointer
    (:func:`tiled_cell`; kept alive with the code)."""
    imports = {epilogue.entry: epilogue.address}
    if cell is not None:
        imports[tiled_cell(name)] = ctypes.addressof(cell)
    return build_module(
        name,
        ir,
        host(),
        cache_dir,
        imports=imports,
        keep=epilogue if cell is None else (epilogue, cell),
    )
