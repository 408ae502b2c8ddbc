"""ONNX LSTM (default activations: Sigmoid, Tanh, Tanh; no clip) as one native entry
compiled from IR written here: the whole layer, every direction and step, is one call
into machine code.

An :class:`LstmSpec` holds what is fixed when a model is compiled (dtype, hidden and
input sizes, directions, layout, which optional inputs and outputs there are); the
sequence length and the batch are read from X's record at run time. The entry
(``int32 entry(ptrs, recs, ints)``, arrays ``X, W, R, [B], [sequence_lens],
[initial_h], [initial_c], [P], Y, [Y_h], [Y_c]`` (``W_packed, R_panels`` in the places of
``W, R`` when they are given packed), ints the thread count, 0 for the native pool's
size) checks every record (status ``i + 1`` for a bad argument ``i``:
rank, item size, exact dims) before touching memory, then per direction ``d`` (forward,
or reverse: the steps in the other order):

1. every step's input is projected at once, ``GX[T*B, 4H] = X[T*B, I] @ W[d]^T`` (rows
   in X's own order, so layout 1 needs no copy);
2. per step ``t``: ``G[B, 4H] = h @ R^T``, then a vectorized loop per batch row
   computes the gates (``GX + Wb + G + Rb``, peepholes when P is given), the new cell
   and hidden states, and writes the row of ``Y[t]``; both in one pass over items of
   up to :data:`ROW_BLOCK` batch rows (on the pool ``ceil(N / threads)``: each thread
   its own rows, :func:`_row_block`) by :data:`GATE_UNITS` hidden units (a unit's gates
   need only its own four columns of ``G``), ``h`` read from one buffer and written to
   the other;
3. the last states go to ``Y_h``/``Y_c``.

With ``sequence_lens`` (int32, one per batch entry, each checked to lie in ``[0, T]``:
status ``n_arrays + 2``, raised as :class:`~geode.errors.ShapeError`), Y starts as zeros
and a batch row takes only its own steps: the reverse direction starts at its own last
step, and past its length its states stay as they are (the reference's semantics).

The steps are sequential. The projection is shared among the pool's threads by columns
of its result (up to :data:`CHUNKS_PER_THREAD` chunks of gate units per thread) when it
has at least :data:`MIN_PARALLEL_FMAS` multiply-adds; the steps, by their items
(:func:`_step_function`; one chunk per thread when an item is small,
:data:`MIN_SPLIT_ITEM_FMAS`) when a step's product has that many: all the steps of a
direction are ONE launch of the native pool (``geode_parallel_steps``: the threads run
step ``t``'s items, meet at a barrier, then run step ``t + 1``'s; no wake and join per
step), a thread takes the same items at every step before it steals another, so from
step to step it mostly reads the same rows of ``R``, in its core's cache. Batch-first
with the items splitting the batch by rows (:func:`_row_block`: each thread its own
rows, up to :data:`ROW_BLOCK` of them), a direction is instead one plain launch of a chunk per row block, each running
its rows' projection and all their steps with no barrier (:func:`_row_block_function`:
batch rows are independent recurrences). Every column and every unit is computed by
the same code whatever the thread count, so the results are the same bits.
Both products are written here, not BLAS GEMMs (every threaded GEMM call is a barrier
of the BLAS's threads, and a GEMM packs its right operand at every call: per step, for
an LSTM; on a shared 2-core machine the BLAS path measured 5-10x slower than these
loops), in one of two forms chosen by the batch ``N`` at run time (so the same bits on
any thread count):

* below :data:`~.lstm_panels.PANEL_MIN_BATCH` (batch 1), dot products
  (:func:`_product_function`): a step streams the rows of ``R`` once, no packing;
* from it, the outer-product form of :mod:`~.lstm_panels`: each direction starts with
  one launch over panels of a vector's width of hidden units which packs ``W``'s panel,
  computes its columns of the projection and packs ``R``'s panel (``R^T`` laid out per
  panel and gate group ``[k][units]``, in the scratch: once per call, about 1 MiB each
  at hidden 256); a step's item then computes its rows' gate columns panel by panel with
  accumulators along the units (``h[b, k]`` broadcast, no horizontal sums).

Packed once (:attr:`LstmSpec.panel_lanes`, float32; a model's constant ``W`` and ``R``,
:mod:`geode.codegen.packed_weights`): the entry takes, instead, ``W_packed`` (per direction
``W^T`` in the packed-weight GEMM's panels of 16 columns, ``(D, ceil(4H / 16), I, 16)``)
and ``R_panels`` (per direction ``R`` in the panels above, ``(D, ceil(H / lanes) * 4 *
lanes * H)``), so a call packs nothing: the projection is the native runtime's
``geode_sgemm_packed`` (every element one chain of fused multiply-adds along ``I`` as in
the panels: the same bits however split), on the pool as step 0 of the steps' stepped
launch, a chunk per range of its 16-column panels, or batch-first with the steps split
by rows a row block's rows of X in its chunk (:func:`_row_block_function`), or one
call split by the runtime when the steps run on the calling thread; and the steps
multiply by ``R_panels`` at every batch, 1 included (measured: at batch 1 the dot
products beside the GEMM's projection were slower).

The states ``h`` (twice) and ``c``, the projection, the gates and the packed panels
live in one ``malloc``-ed buffer freed before the entry returns; status ``n_arrays + 1`` says it
could not be allocated (:class:`LstmKernel` raises :class:`~geode.errors.ExecutionError`).
Sigmoid and tanh are the LLVM backend's vmath functions (IEEE variants, inlined and
vectorized). Results match the reference kernel
(:func:`geode.compiler.ops.rnn.recurrent`) to rounding: the same sums in the same order,
the products' inner sums in another (the dot products: vectors along ``K`` of
:func:`vector_bytes`, folded together by :func:`_reduce`; the outer-product form: one
chain of fused multiply-adds along ``K`` per element).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from geode.codegen.backends.llvm import vmath
from geode.codegen.backends.llvm.compiled import ArgSpec, Emitted, LLVMKernel
from geode.codegen.backends.llvm.irloops import Builder
from geode.codegen.backends.llvm.irtext import FunctionWriter, ModuleWriter
from geode.codegen.backends.llvm.kernel import build_module, while_alive
from geode.codegen.backends.llvm.lstm_panels import (
    GROUP_VECTORS,
    PANEL_MIN_BATCH,
    PROJECTION_SLOTS,
    chunk_writer,
    declare_vector_ops,
    pack_function,
    panel_chunk_function,
    panel_items,
    panel_product_function,
    panel_rows,
)
from geode.codegen.backends.llvm.objcache import CacheDir
from geode.codegen.backends.llvm.packed import PACKED_DECL, PANEL, packed_call
from geode.codegen.backends.llvm.target import Target
from geode.errors import ExecutionError, ShapeError

__all__ = [
    "LstmKernel",
    "LstmSpec",
    "item_panels_together",
    "lstm_ir",
    "lstm_kernel",
    "panel_lanes",
    "vector_bytes",
]

#: dtype -> (IR type, item size)
TYPES = {"float32": ("float", 4), "float64": ("double", 8)}

#: gate units (rows of W or R) the products compute together, sharing the loads of ``h``
#: (``4H`` is a multiple)
UNITS = 4

#: rows of ``h`` the products compute together, sharing the loads of ``R``: with
#: :data:`UNITS`, a block of ``ROWS x UNITS`` sums loads ``ROWS + UNITS`` vectors per
#: ``ROWS * UNITS`` multiply-adds (one row at a time: ``1 + UNITS`` per ``UNITS``)
ROWS = 4

_MEMSET = "declare void @llvm.memset.p0.i64(ptr, i8, i64, i1)"
_MEMCPY = "declare void @llvm.memcpy.p0.p0.i64(ptr, ptr, i64, i1)"


@dataclass(frozen=True)
class LstmSpec:
    """What one native LSTM fixes at compile time (see the module docstring)."""

    dtype: str
    hidden: int
    input_size: int
    directions: int
    reverse: bool  # one direction, run backwards (direction="reverse")
    layout: int
    bias: bool
    initial_h: bool
    initial_c: bool
    peephole: bool
    n_outputs: int
    lens: bool = False  # a sequence_lens input (int32, one length per batch entry)
    #: 0: ``W`` and ``R`` packed per call; else, instead of them, both given packed once
    #: (float32): ``W_packed`` for the packed-weight GEMM, ``R_panels`` in panels of this
    #: many lanes (the target's vector, :func:`panel_lanes`)
    panel_lanes: int = 0

    def __post_init__(self) -> None:
        if self.dtype not in TYPES:
            raise ValueError(f"dtype {self.dtype} (native: float32, float64)")
        if self.panel_lanes and (self.dtype != "float32" or GATE_UNITS % self.panel_lanes):
            raise ValueError(
                f"W and R packed once: float32 and panels of lanes dividing {GATE_UNITS} "
                f"(not {self.dtype}, {self.panel_lanes} lanes)"
            )
        if self.hidden < 1 or self.input_size < 0:
            raise ValueError(f"hidden size {self.hidden} (native: at least 1)")
        if self.directions not in (1, 2) or (self.reverse and self.directions != 1):
            raise ValueError("directions must be 1 (forward or reverse) or 2")
        if self.layout not in (0, 1) or not 1 <= self.n_outputs <= 3:
            raise ValueError(f"layout {self.layout} or {self.n_outputs} outputs")

    @property
    def arrays(self) -> tuple[str, ...]:
        """The entry's array names, inputs then outputs."""
        opt = [("B", self.bias), ("sequence_lens", self.lens), ("initial_h", self.initial_h)]
        opt.append(("initial_c", self.initial_c))
        opt.append(("P", self.peephole))
        weights = ["W_packed", "R_panels"] if self.panel_lanes else ["W", "R"]
        ins = ["X", *weights] + [n for n, on in opt if on]
        return (*ins, *["Y", "Y_h", "Y_c"][: self.n_outputs])

    @property
    def n_inputs(self) -> int:
        """How many of :attr:`arrays` are inputs."""
        return len(self.arrays) - self.n_outputs

    def describe(self) -> str:
        """One line for traces and the IR's header."""
        dirs = (
            "bidirectional" if self.directions == 2 else ("reverse" if self.reverse else "forward")
        )
        return (
            f"LSTM {self.dtype} hidden={self.hidden} input={self.input_size} {dirs} "
            f"layout={self.layout} inputs={','.join(self.arrays[: self.n_inputs])} "
            f"outputs={','.join(self.arrays[self.n_inputs :])}"
        )


def _records(b: Builder, spec: LstmSpec) -> dict[str, list[str]]:
    """Check every record (status ``i + 1`` for array ``i``; each record's rank before
    its other words are read); returns each array's dims."""
    item = TYPES[spec.dtype][1]
    h, d, i = str(spec.hidden), str(spec.directions), str(spec.input_size)
    dims: dict[str, list[str]] = {}
    at = 0

    def word(j: int) -> str:
        return b.load("i64", b.gep("i64", "%recs", str(j)), "r")

    def check(status: int, name: str, want: list[str | None]) -> list[str]:
        nonlocal at
        b.fail_unless(b.cmp("eq", word(at), str(len(want))), status)
        got = [word(at + 2 + j) for j in range(len(want))]
        conds = [b.cmp("eq", word(at + 1), "4" if name == "sequence_lens" else str(item))]
        conds += [b.cmp("eq", g, w) for g, w in zip(got, want) if w is not None]
        b.fail_unless(b.all_of(conds), status)
        at += 2 + len(want)
        dims[name] = got
        return got

    x = check(1, "X", [None, None, i])
    seq, batch = (x[1], x[0]) if spec.layout else (x[0], x[1])
    dims["T"], dims["N"] = [seq], [batch]
    state = [batch, d, h] if spec.layout else [d, batch, h]
    y = [batch, seq, d, h] if spec.layout else [seq, d, batch, h]
    want = {
        "W": [d, str(4 * spec.hidden), i],
        "R": [d, str(4 * spec.hidden), h],
        "B": [d, str(8 * spec.hidden)],
        "sequence_lens": [batch],
        "initial_h": state,
        "initial_c": state,
        "P": [d, str(3 * spec.hidden)],
        "W_packed": [d, str(-(-4 * spec.hidden // PANEL)), i, str(PANEL)],
        "R_panels": [d, str(panel_items(spec.hidden, spec.panel_lanes, spec.hidden))],
        "Y": y,
        "Y_h": state,
        "Y_c": state,
    }
    for status, name in enumerate(spec.arrays[1:], start=2):
        check(status, name, want[name])
    return dims


def _cell_function(module: ModuleWriter, name: str, spec: LstmSpec, attrs: str) -> FunctionWriter:
    """``void @name(ptr G, ptr GX, ptr B, ptr P, ptr c, ptr h, ptr y, i64 j0, i64 j1)``:
    the hidden units ``[j0, j1)`` of one batch row's step (``G``: the row's ``h @ R^T``,
    ``GX``: its input projection, ``B``/``P`` the direction's biases and peepholes, ``c``
    and ``h`` its states, updated, ``y`` its row of Y), a loop the vectorizer widens."""
    ty, _ = TYPES[spec.dtype]
    names = ["G", "GX", "B", "P", "c", "h", "y"]
    params = [("ptr noalias", n) for n in names] + [("i64", "j0"), ("i64", "j1")]
    fn = FunctionWriter(name, "void", params)
    fn.linkage = "internal"
    fn.attrs = " " + module.attr_group("nounwind noinline " + attrs)
    b = Builder(fn)
    g, gx, bias, peep, c, h, y, j0, j1 = (fn.param(j) for j in range(len(params)))
    hid = spec.hidden
    sig = vmath.function_name("sigmoid", spec.dtype, ieee=True)
    tanh = vmath.function_name("tanh", spec.dtype, ieee=True)

    def f(op: str, a: str, bb: str, hint: str) -> str:
        return fn.value(f"{op} {ty} {a}, {bb}", hint)

    def call(func: str, a: str, hint: str) -> str:
        return fn.value(f"call {ty} @{func}({ty} {a})", hint)

    def body(j: str) -> None:
        pre = []
        for k, gate in enumerate("iofc"):
            at = b.add(j, str(k * hid), f"at{gate}")
            v = b.load(ty, b.gep(ty, gx, at), f"x{gate}")
            if spec.bias:
                v = f("fadd", v, b.load(ty, b.gep(ty, bias, at), f"wb{gate}"), f"x{gate}")
            v = f("fadd", v, b.load(ty, b.gep(ty, g, at), f"r{gate}"), f"s{gate}")
            if spec.bias:
                rb = b.load(ty, b.gep(ty, bias, b.add(at, str(4 * hid))), f"rb{gate}")
                v = f("fadd", v, rb, f"s{gate}")
            pre.append(v)
        gi, go, gf, gc = pre
        c_ptr = b.gep(ty, c, j, "cp")
        c_old = b.load(ty, c_ptr, "c")

        def peephole(v: str, k: int, state: str, hint: str) -> str:
            if not spec.peephole:
                return v
            pk = b.load(ty, b.gep(ty, peep, b.add(j, str(k * hid))), f"p{hint}")
            return f("fadd", v, f("fmul", pk, state, f"pc{hint}"), hint)

        i = call(sig, peephole(gi, 0, c_old, "i"), "i")
        fg = call(sig, peephole(gf, 2, c_old, "f"), "f")
        cand = call(tanh, gc, "g")
        c_new = f("fadd", f("fmul", fg, c_old, "fc"), f("fmul", i, cand, "ig"), "cn")
        o = call(sig, peephole(go, 1, c_new, "o"), "o")
        h_new = f("fmul", o, call(tanh, c_new, "tc"), "hn")
        fn.add(f"store {ty} {c_new}, ptr {c_ptr}")
        fn.add(f"store {ty} {h_new}, ptr {b.gep(ty, h, j)}")
        fn.add(f"store {ty} {h_new}, ptr {b.gep(ty, y, j)}")

    b.loop(j0, j1, body, "j")
    fn.terminate("ret void")
    return fn


def _reduce(fn: FunctionWriter, ty: str, lanes: int, vecs: list[str]) -> tuple[list[str], int]:
    """Sum the lanes of each of ``vecs`` (``<lanes x ty>``, a power of two of them):
    pairs of vectors are folded into one by adding their halves (a lane of the result
    holds a partial sum of one source, the partial-major order keeping each source's
    lanes together), then each vector is halved until one lane per source is left.
    Returns the sums as vectors of ``S`` lanes each (``S`` sources: the first vector
    holds the sums of ``vecs[0:S]`` in order, the next of ``vecs[S:2S]`` ...) and ``S``:
    fewer shuffles than a horizontal sum per vector."""
    if len(vecs) & (len(vecs) - 1):
        raise ValueError(f"{len(vecs)} sums to fold (a power of two: ROWS and UNITS are)")
    sources, parts = 1, lanes
    while len(vecs) > 1 and parts > 1:
        width, half = sources * parts, parts // 2
        pick = [
            [
                (p * sources + s) if s < sources else width + p * sources + s - sources
                for p in range(first, first + half)
                for s in range(2 * sources)
            ]
            for first in (0, half)
        ]
        nxt = []
        for a, c in zip(vecs[0::2], vecs[1::2]):
            lo, hi = (
                fn.value(
                    f"shufflevector <{width} x {ty}> {a}, <{width} x {ty}> {c}, "
                    f"<{width} x i32> <{', '.join(f'i32 {m}' for m in mask)}>",
                    "fold",
                )
                for mask in pick
            )
            nxt.append(fn.value(f"fadd <{width} x {ty}> {lo}, {hi}", "folded"))
        vecs, sources, parts = nxt, 2 * sources, half
    while parts > 1:
        width, half = sources * parts, sources * parts // 2
        out = []
        for v in vecs:
            lo, hi = (
                fn.value(
                    f"shufflevector <{width} x {ty}> {v}, <{width} x {ty}> poison, "
                    f"<{half} x i32> <{', '.join(f'i32 {m}' for m in range(first, first + half))}>",
                    "half",
                )
                for first in (0, half)
            )
            out.append(fn.value(f"fadd <{half} x {ty}> {lo}, {hi}", "halved"))
        vecs, parts = out, parts // 2
    return vecs, sources


def _store_sums(
    fn: FunctionWriter, ty: str, item: int, sums: list[str], per: int, first: int, n: int, out: str
) -> None:
    """Store the sums ``[first, first + n)`` (:func:`_reduce`'s vectors of ``per``) to
    ``out`` and on: a whole vector at once, a part of one through a shuffle."""
    u = 0
    while u < n:
        vec, at = sums[(first + u) // per], (first + u) % per
        take = min(per - at, n - u)
        dst = fn.value(f"getelementptr inbounds {ty}, ptr {out}, i64 {u}", "dst")
        if take == 1:
            one = fn.value(f"extractelement <{per} x {ty}> {vec}, i64 {at}", "one")
            fn.add(f"store {ty} {one}, ptr {dst}")
        else:
            if take != per:
                picks = ", ".join(f"i32 {at + k}" for k in range(take))
                vec = fn.value(
                    f"shufflevector <{per} x {ty}> {vec}, <{per} x {ty}> poison, "
                    f"<{take} x i32> <{picks}>",
                    "part",
                )
            fn.add(f"store <{take} x {ty}> {vec}, ptr {dst}, align {item}")
        u += take


def _product_function(
    module: ModuleWriter, name: str, spec: LstmSpec, attrs: str, lanes: int
) -> FunctionWriter:
    """``void @name(ptr R, ptr h, ptr G, i64 N, i64 K, i64 j0, i64 j1)``: columns
    ``[j0, j1)`` of ``G[N, 4H] = h[N, K] @ R^T`` (``R``: ``[4H, K]``) as dot products,
    each row of ``R`` (one gate unit) used for every row of ``h`` while it is in cache:
    blocks of :data:`ROWS` rows of ``h`` by :data:`UNITS` units, then the rows left one
    at a time; the units left after the last whole block of :data:`UNITS` one at a time
    too. A block's sums are vectors of ``lanes`` items along ``K`` (fused multiply-adds;
    the last part of ``K`` through masked loads), folded together at the end
    (:func:`_reduce`). Which code sums a column depends only on ``j0``, ``j1`` and
    ``N``."""
    ty, item = TYPES[spec.dtype]
    vt = f"<{lanes} x {ty}>"
    fma, masked, _ = declare_vector_ops(module, ty, lanes, item)
    fn = FunctionWriter(
        name,
        "void",
        [
            ("ptr noalias", "R"),
            ("ptr noalias", "h"),
            ("ptr noalias", "G"),
            ("i64", "N"),
            ("i64", "K"),
            ("i64", "j0"),
            ("i64", "j1"),
        ],
    )
    fn.linkage = "internal"
    fn.attrs = " " + module.attr_group("nounwind noinline " + attrs)
    b = Builder(fn)
    r, h, g, n, hid, j0, j1 = (fn.param(j) for j in range(7))
    g4 = str(4 * spec.hidden)
    accs = [[fn.alloca(vt, f"acc{i}_{u}") for u in range(UNITS)] for i in range(ROWS)]
    full = b.mul(b.op("sdiv", hid, str(lanes), "kvecs"), str(lanes), "kfull")
    rest = b.sub(hid, full, "krest")
    spread = fn.value(f"insertelement <{lanes} x i64> poison, i64 {rest}, i64 0", "rest")
    spread = fn.value(
        f"shufflevector <{lanes} x i64> {spread}, <{lanes} x i64> poison, "
        f"<{lanes} x i32> zeroinitializer",
        "rests",
    )
    steps = ", ".join(f"i64 {k}" for k in range(lanes))
    mask = fn.value(f"icmp slt <{lanes} x i64> <{steps}>, {spread}", "kmask")

    def units(j: str, width: int) -> None:
        rrows = [b.gep(ty, r, b.mul(b.add(j, str(u)), hid), f"rrow{u}") for u in range(width)]

        def rows(i0: str, count: int) -> None:
            hrows = [b.gep(ty, h, b.mul(b.add(i0, str(i)), hid), "hrow") for i in range(count)]
            lines = [line[:width] for line in accs[:count]]
            for acc in (a for line in lines for a in line):
                fn.add(f"store {vt} zeroinitializer, ptr {acc}")

            def load(row: str, k: str, tail: bool) -> str:
                at = b.gep(ty, row, k, "at")
                if tail:
                    args = f"ptr {at}, i32 {item}, <{lanes} x i1> {mask}, {vt} zeroinitializer"
                    return fn.value(f"call {vt} {masked}({args})", "tv")
                return fn.value(f"load {vt}, ptr {at}, align {item}", "v")

            def term(k: str, tail: bool = False) -> None:
                hvs = [load(hrow, k, tail) for hrow in hrows]
                rvs = [load(rrow, k, tail) for rrow in rrows]
                for hv, line in zip(hvs, lines):
                    for acc, rv in zip(line, rvs):
                        old = fn.value(f"load {vt}, ptr {acc}", "a")
                        total = fn.value(f"call {vt} {fma}({vt} {rv}, {vt} {hv}, {vt} {old})")
                        fn.add(f"store {vt} {total}, ptr {acc}")

            b.loop("0", full, term, "k", step=str(lanes))
            b.when(b.cmp("sgt", rest, "0"), lambda: term(full, tail=True), "ktail")
            flat = [fn.value(f"load {vt}, ptr {a}", "sum") for line in lines for a in line]
            sums, per = _reduce(fn, ty, lanes, flat)
            for i in range(count):
                out = b.gep(ty, g, b.add(b.mul(b.add(i0, str(i)), g4), j), "gout")
                _store_sums(fn, ty, item, sums, per, i * width, width, out)

        blocked = b.mul(b.op("sdiv", n, str(ROWS), "blocks"), str(ROWS), "blocked")
        b.loop("0", blocked, lambda i: rows(i, ROWS), "b", step=str(ROWS))
        b.loop(blocked, n, lambda i: rows(i, 1), "bt")

    whole = b.add(j0, b.mul(b.op("sdiv", b.sub(j1, j0), str(UNITS)), str(UNITS)), "whole")
    b.loop(j0, whole, lambda j: units(j, UNITS), "j", step=str(UNITS))
    b.loop(whole, j1, lambda j: units(j, 1), "jt")
    fn.terminate("ret void")
    return fn


#: the context of a parallel product: R, h, G, N, K (one 8-byte slot each)
_CTX_SLOTS = 5


def _chunk_function(module: ModuleWriter, name: str, rec: str, spec: LstmSpec) -> FunctionWriter:
    """``void @name(ptr ctx, i64 chunk, i64 nchunks)``: the native pool's share of a
    product (:func:`_product_function`): chunk ``c`` of ``n`` computes the columns
    ``[UNITS * (4H / UNITS) * c / n, UNITS * (4H / UNITS) * (c + 1) / n)`` of ``G``
    (the context holds ``R, h, G, N, K``)."""
    fn, b, (ctx, chunk, nchunks) = chunk_writer(name)
    slots = [b.load("i64", b.gep("i64", ctx, str(j)), "slot") for j in range(_CTX_SLOTS)]
    r, h, g = (fn.value(f"inttoptr i64 {v} to ptr", "p") for v in slots[:3])
    n, k = slots[3], slots[4]
    groups = str(4 * spec.hidden // UNITS)

    def bound(c: str) -> str:
        part = fn.value(f"udiv i64 {b.mul(groups, c)}, {nchunks}", "part")
        return b.mul(part, str(UNITS), "col")

    lo, hi = bound(chunk), bound(b.add(chunk, "1"))
    fn.add(f"call void @{rec}(ptr {r}, ptr {h}, ptr {g}, i64 {n}, i64 {k}, i64 {lo}, i64 {hi})")
    fn.terminate("ret void")
    return fn


#: the context of a direction's steps: R, the states h (read at even steps, written at odd
#: ones) and h' (the other way round), G, GX, B, P, c, Y, sequence_lens, R's packed panels
#: (null: the dot products) (pointers), then T, N, the direction d, whether it runs
#: backwards, the batch rows of an item (:func:`_row_block`) (one 8-byte slot each)
_STEP_SLOTS = 16

#: hidden units of one item of a step's work (the unit runs are fixed: the same bits on
#: any thread count; a multiple of a vector's lanes, so an item's units are whole panels
#: of the outer-product form)
GATE_UNITS = 32

#: the most batch rows of one item of a step's work
ROW_BLOCK = 16

#: a step's items (and an item's panels of ``R``) in the other order on odd steps: the
#: part of ``R`` a step read last, still in the core's L2, is read first by the next
#: (``R`` is 1 MiB at hidden 256, the size of a Zen 5 core's L2: read in one order every
#: step, it misses throughout; the same bits in either order)
ALTERNATE_ITEMS = True
#: a step item of few rows computes all its panels of ``R`` (:data:`GATE_UNITS` units) in
#: one pass over ``k``, not one panel at a time (:func:`_item_panels`): at batch 1 a panel
#: alone is 4 chains of fused multiply-adds, 8 for two panels; the same bits (each element
#: one chain along ``k`` either way). Zen 5, hidden 256, 32 steps, against one panel at a
#: time: batch 1 0.92 of the time on two threads, 0.96 on one (R from the L3), 0.80 on one
#: at hidden 192 (R in the L2, as each thread's half at 256); batch 2 0.93 and 0.97
ITEM_PANELS_TOGETHER = True

#: the fewest batch rows per thread for which a step's items split the batch by rows
#: (:func:`_row_block`)
MIN_SPLIT_ROWS = 4


def _row_block(b: Builder, n: str, threads: str) -> str:
    """Batch rows of one item of a step's work on ``threads`` threads: ``ceil(N /
    threads)`` when that is at least :data:`MIN_SPLIT_ROWS` (at most :data:`ROW_BLOCK`),
    else :data:`ROW_BLOCK`. Batch rows are independent recurrences, so when each thread's
    share of the items is whole row blocks (the chunks are contiguous runs of items, row
    block by row block), a thread reads only the states ``h`` it wrote itself: nothing
    crosses to another core between steps but the barrier (measured at batch 8 on two
    threads, rows 4 by 4 against all 8 rows split by units: 0.86-0.87 of the time). Each
    thread then streams all of ``R`` for its rows, which fewer rows than
    :data:`MIN_SPLIT_ROWS` do not pay for (batch 2 and 4 on two threads: 1.50 and 1.09 of
    the time): they keep one block split by units. Any row split gives the same bits (each
    sum is one chain along ``K``)."""
    share = _ceil_div(b, n, threads)
    rows = b.min(share, str(ROW_BLOCK), "rbk")
    return b.select(b.cmp("sge", share, str(MIN_SPLIT_ROWS)), rows, str(ROW_BLOCK), "rbk")


def _ceil_div(b: Builder, a: str, d: str) -> str:
    """``ceil(a / d)`` of positive i64s (``d`` a value, not a constant)."""
    return b.fn.value(f"udiv i64 {b.sub(b.add(a, d), '1')}, {d}", "cdiv")


def _step_items(b: Builder, spec: LstmSpec, n: str, rb: str) -> str:
    """How many items a step's work has: ``ceil(N / rb) * ceil(H / GATE_UNITS)`` (``rb``:
    the rows of an item, :func:`_row_block`)."""
    rblocks = _ceil_div(b, n, rb)
    return b.mul(rblocks, str(-(-spec.hidden // GATE_UNITS)), "items")


def _step_function(
    module: ModuleWriter,
    name: str,
    rec: str,
    panel: str,
    cell: str,
    spec: LstmSpec,
    lanes: int,
    item_panels: tuple[str, int] | None = None,
) -> FunctionWriter:
    """``void @name(ptr ctx, i64 s, i64 chunk, i64 nchunks)``: share ``chunk`` of
    ``nchunks`` of step ``s`` (the context: :data:`_STEP_SLOTS`; the native pool's
    ``geode_parallel_steps`` runs a direction's steps as one launch, a barrier between
    them). The work is items of
    :data:`ROW_BLOCK` batch rows by :data:`GATE_UNITS` hidden units; an item computes
    its rows' four gate columns of its units of ``G = h @ R^T`` (``rec``,
    :func:`_product_function`; or, when the context holds ``R``'s packed panels,
    ``panel``, :func:`~.lstm_panels.panel_product_function`, one panel of ``lanes``
    units at a time, or, an item of few rows, all its panels in one pass,
    ``item_panels``: :func:`_item_panels`), then their gates (``cell``): a unit's gates need only
    its own four columns, so one launch does a step's product and gates, the states read
    from ``h`` and written to ``h'`` (other items still read ``h``). Each row takes its
    own input step (with ``sequence_lens``, a row past its length copies its units of
    ``h`` to ``h'`` and keeps ``c``). Without ``initial_h`` the first step's product is
    not computed: ``h`` is +0, so each of its sums is +0 (a chain of multiply-adds of
    zeros from +0), stored as such (the same bits; 1 / T of the products saved). Odd
    steps take the chunk's items and their panels last to first
    (:data:`ALTERNATE_ITEMS`). Every unit is computed by the same code whatever the split
    or order, so the results are the same bits on any thread count."""
    ty, _ = TYPES[spec.dtype]
    fn, b, (ctx, s, chunk, nchunks) = chunk_writer(name, stepped=True)
    slots = [b.load("i64", b.gep("i64", ctx, str(j)), "slot") for j in range(_STEP_SLOTS)]
    r_d, h_even, h_odd, gates, gx, bias, peep, c, y, lens, packed = (
        fn.value(f"inttoptr i64 {v} to ptr", "p") for v in slots[:11]
    )
    seq, n, d, rev, rb = slots[11:]
    even = b.cmp("eq", b.op("and", s, "1"), "0")
    h = _select_ptr(b, even, h_even, h_odd, "hin")
    h_new = _select_ptr(b, even, h_odd, h_even, "hout")
    hid, g4 = spec.hidden, 4 * spec.hidden
    per_row = str(-(-hid // GATE_UNITS))
    items = _step_items(b, spec, n, rb)
    first = fn.value(f"udiv i64 {b.mul(items, chunk)}, {nchunks}", "first")
    last = fn.value(f"udiv i64 {b.mul(items, b.add(chunk, '1'))}, {nchunks}", "last")
    dd = str(spec.directions)

    def backwards(v: str) -> str:
        return b.select(b.cmp("ne", rev, "0"), b.sub(b.sub(v, "1"), s), s, "t")

    def item(i: str) -> None:
        r0 = b.mul(fn.value(f"udiv i64 {i}, {per_row}", "rblock"), rb, "r0")
        r1 = b.min(b.add(r0, rb), n, "r1")
        j0 = b.mul(fn.value(f"urem i64 {i}, {per_row}", "jb"), str(GATE_UNITS), "j0")
        j1 = b.min(b.add(j0, str(GATE_UNITS)), str(hid), "j1")
        h_rows = b.gep(ty, h, b.mul(r0, str(hid)), "hrows")
        g_rows = b.gep(ty, gates, b.mul(r0, str(g4)), "grows")
        rows = b.sub(r1, r0, "nrows")

        def dots() -> None:
            for q in range(4):
                lo, hi = b.add(j0, str(q * hid), "lo"), b.add(j1, str(q * hid), "hi")
                args = f"ptr {r_d}, ptr {h_rows}, ptr {g_rows}, i64 {rows}, i64 {hid}"
                fn.add(f"call void @{rec}({args}, i64 {lo}, i64 {hi})")

        def panels() -> None:
            operands = (packed, h_rows, g_rows, rows)
            _panel_products(b, s, spec, lanes, (panel, item_panels), operands, (j0, j1))

        def products() -> None:
            b.branch(fn.value(f"icmp ne ptr {packed}, null", "packed"), panels, dots, "form")

        if spec.initial_h:
            products()
        else:

            def zeros() -> None:
                _zero_sums(fn, b, spec, gates, (r0, r1), (j0, j1))

            b.branch(b.cmp("eq", s, "0"), zeros, products, "first")

        def row(r: str) -> None:
            def row_step(t: str) -> None:
                xrow = b.add(b.mul(r, seq), t) if spec.layout else b.add(b.mul(t, n), r)
                yrow = (
                    b.add(b.mul(b.add(b.mul(r, seq), t), dd), d)
                    if spec.layout
                    else b.add(b.mul(b.add(b.mul(t, dd), d), n), r)
                )
                args = [
                    b.gep(ty, gates, b.mul(r, str(g4))),
                    b.gep(ty, gx, b.mul(xrow, str(g4))),
                    bias,
                    peep,
                    b.gep(ty, c, b.mul(r, str(hid))),
                    b.gep(ty, h_new, b.mul(r, str(hid))),
                    b.gep(ty, y, b.mul(yrow, str(hid))),
                ]
                ptrs = ", ".join("ptr " + a for a in args)
                fn.add(f"call void @{cell}({ptrs}, i64 {j0}, i64 {j1})")

            if not spec.lens:
                return row_step(backwards(seq))
            length = fn.value(f"sext i32 {b.load('i32', b.gep('i32', lens, r))} to i64", "len")

            def keep() -> None:
                at = b.add(b.mul(r, str(hid)), j0, "at")
                nbytes = b.mul(b.sub(j1, j0), str(TYPES[spec.dtype][1]), "kbytes")
                src, dst = b.gep(ty, h, at, "hsrc"), b.gep(ty, h_new, at, "hdst")
                fn.add(
                    f"call void @llvm.memcpy.p0.p0.i64(ptr {dst}, ptr {src}, i64 {nbytes}, i1 false)"
                )

            b.branch(b.cmp("slt", s, length), lambda: row_step(backwards(length)), keep, "valid")

        b.loop(r0, r1, row, "row")

    _item_loop(b, s, first, last, item)
    fn.terminate("ret void")
    return fn


def _panel_products(
    b: Builder,
    s: str,
    spec: LstmSpec,
    lanes: int,
    functions: tuple[str, tuple[str, int] | None],
    operands: tuple[str, str, str, str],
    units: tuple[str, str],
) -> None:
    """A step item's products from ``R``'s panels (``operands``: the panels, the item's
    rows of ``h`` and of ``G``, its row count; ``units``: its ``[j0, j1)``): its whole
    run of panels in one pass when it has at most the rows of ``functions[1]``
    (:func:`_item_panels`: the function and the rows, or None), else one panel at a time
    (``functions[0]``, in :func:`_item_loop`'s order)."""
    fn, ty, hid = b.fn, TYPES[spec.dtype][0], spec.hidden
    panel, item_panels = functions
    packed, h_rows, g_rows, rows = operands
    j0, j1 = units
    lead = f"ptr {h_rows}, i64 {hid}"
    tail = f"ptr {g_rows}, i64 {4 * hid}, i64 {rows}, i64 {hid}"

    def one(p: str) -> None:
        pan = b.gep(ty, packed, b.mul(p, str(4 * lanes * hid)), "rpan")
        fn.add(f"call void @{panel}({lead}, ptr {pan}, {tail}, i64 {p})")

    plo = fn.value(f"udiv i64 {j0}, {lanes}", "plo")
    phi = b.ceildiv(j1, lanes, "phi")

    def apart() -> None:
        _item_loop(b, s, plo, phi, one, "pan")

    if not item_panels:
        return apart()
    together_fn, together_rows = item_panels

    def together() -> None:
        pan = b.gep(ty, packed, b.mul(plo, str(4 * lanes * hid)), "rpans")
        fn.add(f"call void @{together_fn}({lead}, ptr {pan}, {tail}, i64 {plo})")

    whole = b.cmp("eq", b.sub(phi, plo), str(GATE_UNITS // lanes), "wholeitem")
    few = b.cmp("sle", rows, str(together_rows), "fewrows")
    b.branch(b.all_of([whole, few]), together, apart, "pantog")


def _item_loop(
    b: Builder, s: str, first: str, last: str, item: Callable[[str], None], hint: str = "item"
) -> None:
    """``item(i)`` for the items (or an item's panels) ``[first, last)`` of step ``s``: on
    odd steps last to first when :data:`ALTERNATE_ITEMS` (they are independent: the same
    bits in any order)."""
    if not ALTERNATE_ITEMS:
        b.loop(first, last, item, hint)
        return
    odd = b.cmp("ne", b.op("and", s, "1"), "0")

    def ordered(i: str) -> None:
        item(b.select(odd, b.sub(b.add(first, last), b.add(i, "1")), i, "iord"))

    b.loop(first, last, ordered, hint)


def _zero_sums(
    fn: FunctionWriter,
    b: Builder,
    spec: LstmSpec,
    gates: str,
    rows: tuple[str, str],
    units: tuple[str, str],
) -> None:
    """Store the first step's product for ``rows`` x ``units`` without computing it: ``h``
    is +0 before the first step, so every sum is +0 (each one a chain of multiply-adds of
    zeros from +0); the four gate columns of each row are zeroed."""
    ty, size = TYPES[spec.dtype]
    (r0, r1), (j0, j1) = rows, units
    hid, g4 = spec.hidden, 4 * spec.hidden
    nbytes = b.mul(b.sub(j1, j0), str(size), "zbytes")

    def row(r: str) -> None:
        for q in range(4):
            at = b.gep(ty, gates, b.add(b.mul(r, str(g4)), b.add(j0, str(q * hid))))
            fn.add(f"call void @llvm.memset.p0.i64(ptr {at}, i8 0, i64 {nbytes}, i1 false)")

    b.loop(r0, r1, row, "zrow")


#: the context slots after :data:`_STEP_SLOTS` of a direction's stepped launch: X and
#: the direction's ``W_packed`` (pointers), the rows of X, and 1 when the launch's step 0
#: is the input projection (the steps then 1 to T), else 0
_FUSED_SLOTS = 4


def _stepped_function(module: ModuleWriter, name: str, step: str, spec: LstmSpec) -> FunctionWriter:
    """``void @name(ptr ctx, i64 s, i64 chunk, i64 nchunks)``: what a direction's stepped
    launch runs (the context: :data:`_STEP_SLOTS`, then :data:`_FUSED_SLOTS`). When the
    projection comes first (``W`` given packed), step 0 is the projection, chunk ``c`` of
    ``n`` computing the packed-weight GEMM's panels ``[P * c / n, P * (c + 1) / n)`` of
    ``GX`` (``P = ceil(4H / 16)``) on its own thread (every element one chain along ``I``
    whatever the split: the same bits as one call), and step ``s`` is the recurrence's
    step ``s - 1`` (``step``, :func:`_step_function`): no launch of its own for the
    projection. Else step ``s`` is the recurrence's. (Batch-first with the steps' items
    splitting the batch by rows, a direction runs :func:`_row_block_function` instead.)"""
    fn, b, (ctx, s, chunk, nchunks) = chunk_writer(name, stepped=True)
    slot = [
        b.load("i64", b.gep("i64", ctx, str(_STEP_SLOTS + j)), "fslot") for j in range(_FUSED_SLOTS)
    ]
    x, wp = (fn.value(f"inttoptr i64 {v} to ptr", "p") for v in slot[:2])
    rows, first = slot[2], slot[3]
    gx = fn.value(f"inttoptr i64 {b.load('i64', b.gep('i64', ctx, '4'), 'gxa')} to ptr", "gx")
    g4, size = 4 * spec.hidden, spec.input_size

    def projection() -> None:
        panels = str(-(-g4 // PANEL))
        p0 = fn.value(f"udiv i64 {b.mul(panels, chunk)}, {nchunks}", "p0")
        p1 = fn.value(f"udiv i64 {b.mul(panels, b.add(chunk, '1'))}, {nchunks}", "p1")
        c0 = b.mul(p0, str(PANEL), "c0")
        cols = b.sub(b.min(b.mul(p1, str(PANEL)), str(g4)), c0, "cols")
        wpan = b.gep("float", wp, b.mul(p0, str(size * PANEL)), "wpan")
        ops = [(x, str(size)), (wpan, "0"), (b.gep("float", gx, c0, "gxc"), str(g4))]

        def call() -> None:
            fn.add(packed_call(rows, cols, str(size), ops, "1"))

        b.when(b.cmp("sgt", cols, "0"), call, "pcols")

    def recurrence() -> None:
        t = b.sub(s, first, "step")
        fn.add(f"call void @{step}(ptr {ctx}, i64 {t}, i64 {chunk}, i64 {nchunks})")

    if spec.panel_lanes and spec.input_size:
        is_projection = b.all_of([b.cmp("ne", first, "0"), b.cmp("eq", s, "0")])
        b.branch(is_projection, projection, recurrence, "fused")
    else:
        recurrence()
    fn.terminate("ret void")
    return fn


def _row_block_function(
    module: ModuleWriter, name: str, step: str, spec: LstmSpec
) -> FunctionWriter:
    """``void @name(ptr ctx, i64 chunk, i64 nchunks)``: row block ``chunk`` of
    ``nchunks`` (the context of :func:`_stepped_function`, ``nchunks`` the row blocks of
    :func:`_row_block`) through the whole sequence: batch-first, its rows' projection (X's
    rows ``[r0 T, r1 T)``, the packed-weight GEMM on this thread) when ``W`` is given
    packed, then every step's items of its rows (``step``, :func:`_step_function`). Batch
    rows are independent recurrences, so row blocks need no barrier between steps: each
    thread runs its own rows' sequence at its own pace (measured at batch 8 on two threads
    against the stepped launch, the same bits: 0.964-0.984 of the time), every element
    computed by the same code as in the stepped launch (the projection's rows one chain
    along ``I`` each)."""
    fn, b, (ctx, chunk, nchunks) = chunk_writer(name)
    n = b.load("i64", b.gep("i64", ctx, "12"), "n")
    seq = b.load("i64", b.gep("i64", ctx, "11"), "seq")
    rb = b.load("i64", b.gep("i64", ctx, "15"), "rb")
    if spec.panel_lanes and spec.input_size:
        slot = [b.load("i64", b.gep("i64", ctx, str(_STEP_SLOTS + j)), "fs") for j in range(2)]
        x, wp = (fn.value(f"inttoptr i64 {v} to ptr", "p") for v in slot)
        gx = fn.value(f"inttoptr i64 {b.load('i64', b.gep('i64', ctx, '4'), 'gxa')} to ptr", "gx")
        g4, size = 4 * spec.hidden, spec.input_size
        r0 = b.mul(b.mul(chunk, rb), seq, "xr0")
        r1 = b.mul(b.min(b.mul(b.add(chunk, "1"), rb), n), seq, "xr1")
        xa = b.gep("float", x, b.mul(r0, str(size)), "xr")
        ops = [(xa, str(size)), (wp, "0"), (b.gep("float", gx, b.mul(r0, str(g4)), "gxr"), str(g4))]

        def call() -> None:
            fn.add(packed_call(b.sub(r1, r0, "nr"), g4, str(size), ops, "1"))

        b.when(b.cmp("sgt", r1, r0), call, "prows")

    def one(t: str) -> None:
        fn.add(f"call void @{step}(ptr {ctx}, i64 {t}, i64 {chunk}, i64 {nchunks})")

    b.loop("0", seq, one, "s")
    fn.terminate("ret void")
    return fn


#: multiply-adds of a product below which it runs on the calling thread (waking the
#: pool's workers costs more than they save)
MIN_PARALLEL_FMAS = 1 << 16


#: chunks per thread a launch is split into: the pool's threads take them one at a
#: time, so a thread the machine's other work delays holds back only one small chunk
#: (the others take the rest) and the step's barrier waits less
CHUNKS_PER_THREAD = 4

#: multiply-adds of a step's item (its rows by :data:`GATE_UNITS` units by the four gates'
#: ``H`` products) below which a stepped launch takes one chunk per thread, not
#: :data:`CHUNKS_PER_THREAD`: at batch 1 an item is about half a microsecond of work, and
#: claiming and counting more chunks than threads cost more than the balance they buy
#: (measured at hidden 256: 0.93-0.96 of the time)
MIN_SPLIT_ITEM_FMAS = 1 << 17


def _launch(
    b: Builder,
    func: str,
    ctx: str,
    values: list[str],
    threads: str,
    work: str,
    least: int,
    items: str,
    hint: str,
) -> None:
    """Store ``values`` (i64s) in ``ctx`` and run the chunk function ``func`` (``void
    (ptr ctx, i64 chunk, i64 nchunks)``): as ``min(CHUNKS_PER_THREAD * threads, items)``
    chunks on the native pool when there is more than one thread and ``work`` is at
    least ``least``, else as one chunk on the calling thread."""
    fn = b.fn
    for j, v in enumerate(values):
        fn.add(f"store i64 {v}, ptr {b.gep('i64', ctx, str(j))}")
    many = b.all_of([b.cmp("sgt", threads, "1"), b.cmp("sge", work, str(least))])

    def pool() -> None:
        parts = b.min(b.mul(threads, str(CHUNKS_PER_THREAD)), items, "parts")
        fn.add(f"call void @geode_parallel_for(ptr @{func}, ptr {ctx}, i64 {parts}, i64 {threads})")

    b.branch(many, pool, lambda: fn.add(f"call void @{func}(ptr {ctx}, i64 0, i64 1)"), hint)


def _addresses(b: Builder, pointers: list[str]) -> list[str]:
    """The pointers as i64s (a chunk function's context holds them so)."""
    return [b.fn.value(f"ptrtoint ptr {v} to i64", "addr") for v in pointers]


class _Products:
    """Emits the input projection ``GX = X @ W^T`` (:func:`_chunk_function`): on the
    calling thread, or shared among the native pool's threads (the ``threads`` argument,
    0: the pool's size) by columns of ``G`` when there is enough work
    (:data:`MIN_PARALLEL_FMAS`). Its thread count is the steps' too."""

    def __init__(self, b: Builder, chunk: str, spec: LstmSpec) -> None:
        self.b, self.chunk, self.spec = b, chunk, spec
        given = b.load("i64", "%ints", "threads")
        self.ctx = b.fn.alloca("i64", "ctx", str(_CTX_SLOTS))
        pool = b.fn.value("call i64 @geode_num_threads()", "pool")
        self.threads = b.select(b.cmp("sgt", given, "0"), given, pool, "nthreads")

    def __call__(self, r: str, h: str, g: str, n: str, k: str) -> None:
        b = self.b
        work = b.mul(b.mul(n, k, "nk"), str(4 * self.spec.hidden), "fmas")
        groups = str(4 * self.spec.hidden // UNITS)
        values = [*_addresses(b, [r, h, g]), n, k]
        _launch(
            b, self.chunk, self.ctx, values, self.threads, work, MIN_PARALLEL_FMAS, groups, "par"
        )


class _Steps:
    """Emits a direction's steps (:func:`_step_function`) when there is more than one
    thread and a step's product has at least :data:`MIN_PARALLEL_FMAS` multiply-adds:
    batch-first with the items splitting the batch by rows into at most a block per
    thread, ONE launch of a chunk per row block (``blocks``, :func:`_row_block_function`:
    no barrier between steps; more blocks than threads, past ``threads *`` :data:`ROW_BLOCK`
    rows, would leave a thread two blocks to the other's one), else ONE
    stepped launch of the native pool (``func``, :func:`_stepped_function`;
    ``geode_parallel_steps``: the threads meet at a barrier between steps, no launch per
    step); otherwise a loop over the steps on the calling thread (one chunk each)."""

    def __init__(self, b: Builder, func: str, blocks: str, threads: str, spec: LstmSpec) -> None:
        self.b, self.func, self.blocks, self.threads, self.spec = b, func, blocks, threads, spec
        self.ctx = b.fn.alloca("i64", "sctx", str(_STEP_SLOTS + _FUSED_SLOTS))

    def __call__(
        self, pointers: list[str], ints: list[str], projection: tuple[str, str, str] | None
    ) -> None:
        """Emit the steps of one direction (``pointers`` and ``ints``: the context of
        :data:`_STEP_SLOTS`); ``projection``, ``(X, W_packed of the direction, rows)``:
        the packed-weight projection, too, before the steps (step 0 of the stepped
        launch, :func:`_stepped_function`; a call of its own on the calling thread's
        path)."""
        b, fn, seq, n, hid = self.b, self.b.fn, ints[0], ints[1], self.spec.hidden
        ctx, threads = self.ctx, self.threads
        x, wp, rows = projection or ("null", "null", "0")
        work = b.mul(n, str(4 * hid * hid), "sfmas")
        many = b.all_of([b.cmp("sgt", threads, "1"), b.cmp("sge", work, str(MIN_PARALLEL_FMAS))])
        rb = b.select(many, _row_block(b, n, threads), str(ROW_BLOCK), "rows")
        values = _addresses(b, pointers) + ints + [rb] + _addresses(b, [x, wp]) + [rows]
        for j, v in enumerate(values):
            fn.add(f"store i64 {v}, ptr {b.gep('i64', ctx, str(j))}")
        first = b.gep("i64", ctx, str(_STEP_SLOTS + 3), "firstp")

        def by_blocks() -> None:
            fn.add(f"store i64 {'1' if projection else '0'}, ptr {first}")
            blocks = _ceil_div(b, n, rb)
            args = f"ptr @{self.blocks}, ptr {ctx}, i64 {blocks}, i64 {threads}"
            fn.add(f"call void @geode_parallel_for({args})")

        def pool() -> None:
            if self.spec.layout:
                # each thread one row block: N split by rows, into at most `threads` blocks
                few = b.cmp("sle", _ceil_div(b, n, rb), threads, "fewblocks")
                split = b.all_of([b.cmp("slt", rb, n), few])
                b.branch(split, by_blocks, stepped, "byblocks")
            else:
                stepped()

        def stepped() -> None:
            fused = "1" if projection else "0"
            fn.add(f"store i64 {fused}, ptr {first}")
            items = _step_items(b, self.spec, n, rb)
            item_rows = b.min(n, rb, "irows")
            item_fmas = b.mul(item_rows, str(GATE_UNITS * 4 * hid), "ifmas")
            split = b.cmp("sge", item_fmas, str(MIN_SPLIT_ITEM_FMAS), "split")
            per = b.select(split, str(CHUNKS_PER_THREAD), "1", "cpt")
            parts = b.min(b.mul(threads, per), items, "parts")
            steps = b.add(seq, fused, "nsteps")
            args = f"ptr @{self.func}, ptr {ctx}, i64 {steps}, i64 {parts}, i64 {threads}"
            fn.add(f"call void @geode_parallel_steps({args})")

        def alone() -> None:
            fn.add(f"store i64 0, ptr {first}")
            if projection:
                size = str(self.spec.input_size)
                ops = [(x, size), (wp, "0"), (pointers[4], str(4 * hid))]
                fn.add(packed_call(rows, 4 * hid, size, ops, threads))

            def one(s: str) -> None:
                fn.add(f"call void @{self.func}(ptr {ctx}, i64 {s}, i64 0, i64 1)")

            b.loop("0", seq, one, "s")

        b.branch(many, pool, alone, "spar")


def _check_lens(b: Builder, lens: str, seq: str, n: str, status: int, buf: str) -> None:
    """Return ``status`` (``buf`` freed) unless every length is in ``[0, T]``."""
    fn = b.fn
    bad = fn.alloca("i1", "badlen")
    fn.add(f"store i1 false, ptr {bad}")

    def entry(r: str) -> None:
        length = fn.value(f"sext i32 {b.load('i32', b.gep('i32', lens, r))} to i64", "len")
        out = b.any_of([b.cmp("slt", length, "0"), b.cmp("sgt", length, seq)])
        seen = b.load("i1", bad, "seen")
        fn.add(f"store i1 {fn.value(f'or i1 {seen}, {out}', 'bad')}, ptr {bad}")

    b.loop("0", n, entry, "l")
    ok, fail = fn.label("lens_ok"), fn.label("lens_bad")
    fn.cond_br(b.load("i1", bad, "anybad"), fail, ok)
    fn.start_block(fail)
    fn.add(f"call void @free(ptr {buf})")
    fn.terminate(f"ret i32 {status}")
    fn.start_block(ok)


def _state_rows(b: Builder, spec: LstmSpec, base: str, d: int, n: str, row: str) -> str:
    """Pointer to ``row`` of direction ``d`` in a state array (initial_h, Y_h ...)."""
    ty, _ = TYPES[spec.dtype]
    dd, hid = str(spec.directions), str(spec.hidden)
    at = b.add(b.mul(row, dd), str(d)) if spec.layout else b.add(b.mul(str(d), n), row)
    return b.gep(ty, base, b.mul(at, hid), "srow")


def _copy_state(
    b: Builder, spec: LstmSpec, src: str | None, dst: str, d: int, n: str, out: bool
) -> None:
    """Copy direction ``d``'s rows between a state array and the scratch rows ``dst``
    (``out``: scratch to array; ``src`` None: zero the scratch)."""
    ty, item = TYPES[spec.dtype]
    fn = b.fn
    row_bytes = str(spec.hidden * item)
    if src is None:
        nbytes = b.mul(n, row_bytes, "zbytes")
        fn.add(f"call void @llvm.memset.p0.i64(ptr {dst}, i8 0, i64 {nbytes}, i1 false)")
        return

    def row(r: str) -> None:
        state = _state_rows(b, spec, src, d, n, r)
        mine = b.gep(ty, dst, b.mul(r, str(spec.hidden)), "mrow")
        to, frm = (state, mine) if out else (mine, state)
        fn.add(f"call void @llvm.memcpy.p0.p0.i64(ptr {to}, ptr {frm}, i64 {row_bytes}, i1 false)")

    b.loop("0", n, row, "row")


def _select_ptr(b: Builder, cond: str, a: str, other: str, hint: str) -> str:
    """``cond ? a : other`` for pointers."""
    return b.fn.value(f"select i1 {cond}, ptr {a}, ptr {other}", hint)


def entry_function(
    name: str, step_fn: str, chunk: str, start: str, spec: LstmSpec, lanes: int
) -> FunctionWriter:
    """The entry ``i32 @name(ptrs, recs, ints)`` (see the module docstring)."""
    ty, item = TYPES[spec.dtype]
    fn = FunctionWriter(name, "i32", [("ptr", "ptrs"), ("ptr", "recs"), ("ptr", "ints")])
    fn.attrs = " nounwind"
    b = Builder(fn)
    dims = _records(b, spec)
    seq, n = dims["T"][0], dims["N"][0]
    product = _Products(b, chunk, spec)
    run_step = _Steps(b, step_fn, f"{name}.blocks", product.threads, spec)
    ptr = {
        a: b.load("ptr", b.gep("ptr", "%ptrs", str(j)), a.lower())
        for j, a in enumerate(spec.arrays)
    }
    hid, g4 = spec.hidden, 4 * spec.hidden
    rows = b.mul(seq, n, "rows")
    # scratch: GX [T*N, 4H], G [N, 4H], h [N, H] twice (the steps read one and write the
    # other), c [N, H], W's and R's packed panels (the outer-product form, when they are
    # not given packed) (+ one item: never 0 bytes)
    panel_words = -(-hid // lanes) * 4 * lanes
    words = b.add(b.mul(b.add(rows, n), str(g4)), b.mul(n, str(3 * hid)), "words")
    least = 1 if spec.panel_lanes else PANEL_MIN_BATCH
    in_panels = b.cmp("sge", n, str(least), "inpanels")
    per_call = 0 if spec.panel_lanes else panel_words * (hid + spec.input_size)
    packed = b.select(in_panels, str(per_call), "0", "pwords")
    words = b.add(words, packed, "words")
    start_ctx = fn.alloca("i64", "pctx", str(PROJECTION_SLOTS))
    nbytes = b.mul(b.add(words, "1"), str(item), "bytes")
    buf = fn.value(f"call noalias ptr @malloc(i64 {nbytes})", "buf")
    b.fail_unless(fn.value(f"icmp ne ptr {buf}, null", "allocated"), len(spec.arrays) + 1)
    gx = buf
    if spec.lens:
        _check_lens(b, ptr["sequence_lens"], seq, n, len(spec.arrays) + 2, buf)
        ybytes = b.mul(b.mul(rows, str(spec.directions * hid)), str(item), "ybytes")
        fn.add(f"call void @llvm.memset.p0.i64(ptr {ptr['Y']}, i8 0, i64 {ybytes}, i1 false)")
    gates = b.gep(ty, gx, b.mul(rows, str(g4)), "gates")
    h = b.gep(ty, gates, b.mul(n, str(g4)), "h")
    h_odd = b.gep(ty, h, b.mul(n, str(hid)), "hodd")
    c = b.gep(ty, h_odd, b.mul(n, str(hid)), "c")
    w_packed = b.gep(ty, c, b.mul(n, str(hid)), "wpacked")
    r_packed = b.gep(ty, w_packed, str(panel_words * spec.input_size), "rpacked")
    # after the steps, the last states are in h when T is even, else in h_odd
    h_last = _select_ptr(b, b.cmp("eq", b.op("and", seq, "1"), "0"), h, h_odd, "hlast")
    for d in range(spec.directions):
        _copy_state(b, spec, ptr.get("initial_h"), h, d, n, out=False)
        _copy_state(b, spec, ptr.get("initial_c"), c, d, n, out=False)
        # W and R themselves (the per-call packing and the dot products) or, given
        # packed, not at all
        w_d = (
            "null" if spec.panel_lanes else b.gep(ty, ptr["W"], str(d * g4 * spec.input_size), "wd")
        )
        r_d = "null" if spec.panel_lanes else b.gep(ty, ptr["R"], str(d * g4 * hid), "rd")
        b_d = b.gep(ty, ptr["B"], str(d * 8 * hid), "bd") if spec.bias else "null"
        p_d = b.gep(ty, ptr["P"], str(d * 3 * hid), "pd") if spec.peephole else "null"
        if spec.panel_lanes:
            r_items = panel_items(hid, lanes, hid)
            r_panels = b.gep(ty, ptr["R_panels"], str(d * r_items), "rpanels")
        steps_packed = _select_ptr(
            b, in_panels, r_panels if spec.panel_lanes else r_packed, "null", "spacked"
        )

        def project(w_d: str = w_d, r_d: str = r_d, d: int = d) -> None:
            if spec.input_size == 0:
                zb = b.mul(rows, str(g4 * item), "gxbytes")
                fn.add(f"call void @llvm.memset.p0.i64(ptr {gx}, i8 0, i64 {zb}, i1 false)")
            if spec.panel_lanes:
                return  # W given packed: the packed-weight GEMM, with the steps (below)

            def dots() -> None:
                if spec.input_size:
                    product(w_d, ptr["X"], gx, rows, str(spec.input_size))

            def panels() -> None:
                pointers = [w_d, w_packed, r_d, r_packed, ptr["X"], gx]
                values = [*_addresses(b, pointers), rows]
                size = spec.input_size + hid
                work = b.mul(rows, str(size * g4), "pfmas")
                items = str(-(-hid // lanes))
                threads = product.threads
                _launch(b, start, start_ctx, values, threads, work, MIN_PARALLEL_FMAS, items, "pp")

            b.branch(in_panels, panels, dots, "pform")

        b.when(b.cmp("sgt", rows, "0"), project, "proj")

        def steps(
            r_d: str = r_d, b_d: str = b_d, p_d: str = p_d, d: int = d, sp: str = steps_packed
        ) -> None:
            arrays = [r_d, h, h_odd, gates, gx, b_d, p_d, c, ptr["Y"]]
            arrays.append(ptr.get("sequence_lens", "null"))
            arrays.append(sp)
            backwards = "1" if spec.reverse or d == 1 else "0"
            projection = None
            if spec.panel_lanes and spec.input_size:
                # W given packed: the packed-weight GEMM, at any batch (R's panels given)
                wp_d = str(d * -(-g4 // PANEL) * spec.input_size * PANEL)
                wp_d = b.gep(ty, ptr["W_packed"], wp_d, "wpd")
                projection = (ptr["X"], wp_d, rows)
            run_step(arrays, [seq, n, str(d), backwards], projection)

        b.when(b.cmp("sgt", n, "0"), steps, "some")
        if spec.n_outputs >= 2:
            _copy_state(b, spec, ptr["Y_h"], h_last, d, n, out=True)
        if spec.n_outputs >= 3:
            _copy_state(b, spec, ptr["Y_c"], c, d, n, out=True)
    fn.add(f"call void @free(ptr {buf})")
    fn.terminate("ret i32 0")
    return fn


def item_panels_together(lanes: int, block: int, packed_once: bool = True) -> tuple[int, int]:
    """``(panels, rows)``: a step item's panels of ``R`` (:data:`GATE_UNITS` units in
    panels of ``lanes``) and the most rows of an item that computes them in one pass
    over ``k`` (``block``: the panel form's full block, :func:`~.lstm_panels.panel_rows`;
    its ``block * GROUP_VECTORS`` accumulators bound the pass's); rows 0: never
    (:data:`ITEM_PANELS_TOGETHER` off, one panel per item, too few registers, or, ``R``
    not ``packed_once``, fewer rows than :data:`~.lstm_panels.PANEL_MIN_BATCH`, from which
    ``R`` is in panels at all)."""
    panels = GATE_UNITS // lanes
    rows = block * GROUP_VECTORS // (4 * panels)
    least = 1 if packed_once else PANEL_MIN_BATCH
    if not ITEM_PANELS_TOGETHER or panels < 2 or rows < least:
        return panels, 0
    return panels, rows


def _item_panels(
    module: ModuleWriter,
    name: str,
    ty: str,
    item: int,
    spec: LstmSpec,
    lanes: int,
    block: int,
    attrs: str,
) -> tuple[str, int] | None:
    """``(function, rows)``: the panel product of a step item's whole run of panels
    (:data:`GATE_UNITS` units) in one pass over ``k``, which items of at most ``rows``
    rows take (:data:`ITEM_PANELS_TOGETHER`: all their accumulators fit in a full block's,
    :func:`~.lstm_panels.panel_product_function`); None when no item can (one panel per
    item, or too few registers: the panels one at a time)."""
    panels, rows = item_panels_together(lanes, block, bool(spec.panel_lanes))
    if not rows:
        return None
    module.add_function(
        panel_product_function(module, name, ty, item, spec.hidden, lanes, block, attrs, panels)
    )
    return name, rows


def lstm_ir(
    spec: LstmSpec, attrs: str = "", vector_bytes: int = 32, vector_registers: int = 16
) -> tuple[str, str]:
    """``(entry name, module IR)`` of the native LSTM of ``spec`` (``attrs``: the target's
    function attributes, :attr:`~.target.Target.function_attrs`; ``vector_bytes``: the
    width of the products' vectors, :func:`vector_bytes`; ``vector_registers``: the
    target's, :attr:`~.target.Target.vector_registers`, which size the panel form's
    blocks, :func:`~.lstm_panels.panel_rows`)."""
    key = f"{spec!r} {vector_bytes} {vector_registers}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    name = f"geode_lstm_{digest}"
    module = ModuleWriter(name)
    module.declare("llvm.memset.p0.i64", _MEMSET)
    module.declare("llvm.memcpy.p0.p0.i64", _MEMCPY)
    module.declare("malloc", "declare noalias ptr @malloc(i64) nounwind")
    module.declare("free", "declare void @free(ptr) nounwind")
    used = [vmath.function_name(op, spec.dtype, ieee=True) for op in ("sigmoid", "tanh")]
    lib = vmath.definitions(used, vmath.VmathTarget.host())
    for gname, text in lib.globals.items():
        module.add_global(gname, text)
    for dname, text in lib.declares.items():
        module.declare(dname, text)
    module.add_function(lib.functions)
    cell = f"{name}.cell"
    module.add_function(_cell_function(module, cell, spec, attrs))
    rec = f"{name}.product"
    lanes = max(1, vector_bytes // TYPES[spec.dtype][1])  # as panel_lanes
    if GATE_UNITS % lanes:
        raise ValueError(f"{lanes} lanes per vector (GATE_UNITS must be a multiple)")
    if spec.panel_lanes not in (0, lanes):
        raise ValueError(
            f"R's panels packed for {spec.panel_lanes} lanes, but this target's vectors "
            f"hold {lanes}"
        )
    module.add_function(_product_function(module, rec, spec, attrs, lanes))
    chunk = f"{name}.chunk"
    module.add_function(_chunk_function(module, chunk, rec, spec))
    ty, item = TYPES[spec.dtype]
    pack, panel, start = f"{name}.pack", f"{name}.panel", f"{name}.start"
    module.add_function(pack_function(module, pack, ty, item, spec.hidden, lanes, attrs))
    block = panel_rows(vector_registers)
    module.add_function(
        panel_product_function(module, panel, ty, item, spec.hidden, lanes, block, attrs)
    )
    module.add_function(
        panel_chunk_function(module, start, pack, panel, ty, spec.hidden, spec.input_size, lanes)
    )
    step, stepped = f"{name}.step", f"{name}.stepped"
    item_panels = _item_panels(module, f"{name}.panels", ty, item, spec, lanes, block, attrs)
    module.add_function(_step_function(module, step, rec, panel, cell, spec, lanes, item_panels))
    module.add_function(_stepped_function(module, stepped, step, spec))
    module.add_function(_row_block_function(module, f"{name}.blocks", step, spec))
    module.declare("geode_num_threads", "declare i64 @geode_num_threads() nounwind")
    if spec.panel_lanes:
        module.declare("geode_sgemm_packed", PACKED_DECL)
    module.declare(
        "geode_parallel_for", "declare void @geode_parallel_for(ptr, ptr, i64, i64) nounwind"
    )
    module.declare(
        "geode_parallel_steps",
        "declare void @geode_parallel_steps(ptr, ptr, i64, i64, i64) nounwind",
    )
    module.add_function(entry_function(name, stepped, chunk, start, spec, lanes))
    return name, f"; {spec.describe()}\n" + module.text()


class LstmKernel(LLVMKernel):
    """A compiled native LSTM of ``spec``: an :class:`LLVMKernel` whose entry may also say
    that its scratch buffer could not be allocated (raised as :class:`ExecutionError`) or
    that a sequence length is outside ``[0, T]`` (:class:`ShapeError`)."""

    image_kind = "lstm"
    spec: LstmSpec

    @property
    def packed_inputs(self) -> tuple[tuple[int, str], ...]:
        """The weights it takes packed once, in their own places: ``(input index, packed
        form)`` (:func:`geode.codegen.packed_weights.packed_value`)."""
        lanes = self.spec.panel_lanes
        return ((1, "lstm_w"), (2, f"lstm_r{lanes}")) if lanes else ()

    def _bad_argument(self, i: int) -> None:
        if i == len(self._args):
            raise ExecutionError(f"kernel {self.name}: out of memory allocating its scratch buffer")
        if i == len(self._args) + 1:
            raise ShapeError(
                f"kernel {self.name}: every sequence_lens value must be between 0 and the "
                "sequence length T"
            )
        super()._bad_argument(i)


def _arg_specs(spec: LstmSpec) -> tuple[ArgSpec, ...]:
    """The entry's arrays, with the shapes its errors quote."""
    h, d, i = spec.hidden, spec.directions, spec.input_size
    state = f"(N, {d}, {h})" if spec.layout else f"({d}, N, {h})"
    shapes = {
        "X": "(N, T, {i})" if spec.layout else "(T, N, {i})",
        "W": f"({d}, {4 * h}, {i})",
        "R": f"({d}, {4 * h}, {h})",
        "B": f"({d}, {8 * h})",
        "sequence_lens": "(N,)",
        "initial_h": state,
        "initial_c": state,
        "P": f"({d}, {3 * h})",
        "W_packed": f"({d}, {-(-4 * h // PANEL)}, {i}, {PANEL})",
        "R_panels": f"({d}, {panel_items(h, spec.panel_lanes, h)})",
        "Y": f"(N, T, {d}, {h})" if spec.layout else f"(T, {d}, N, {h})",
        "Y_h": state,
        "Y_c": state,
    }
    shapes["X"] = shapes["X"].format(i=i)
    args = []
    for j, a in enumerate(spec.arrays):
        role = "input" if j < spec.n_inputs else "output"
        rank = len([t for t in shapes[a].strip("()").split(",") if t.strip()])
        dtype = "int32" if a == "sequence_lens" else spec.dtype
        args.append(ArgSpec(a, role, dtype, rank, shapes[a]))
    return tuple(args)


def vector_bytes(target: Target) -> int:
    """Bytes of the products' vectors on ``target``: 64 where 512-bit vectors are
    preferred, else 32 with AVX, else 16."""
    if target.prefer_vector_width == "512":
        return 64
    return 32 if target.has("avx") else 16


def panel_lanes(dtype: str, target: Target) -> int:
    """Lanes of the products' vectors for ``dtype`` on ``target``: the hidden units of one
    of R's panels (:attr:`LstmSpec.panel_lanes`)."""
    return max(1, vector_bytes(target) // TYPES[dtype][1])


@while_alive
def lstm_kernel(spec: LstmSpec, cache_dir: CacheDir | None = None) -> LstmKernel:
    """The compiled native LSTM of ``spec`` (object code through the disk cache in
    ``cache_dir`` when given)."""
    from geode.codegen.backends.llvm.target import host

    t0 = time.perf_counter()
    target = host()
    name, ir = lstm_ir(spec, target.function_attrs, vector_bytes(target), target.vector_registers)
    loaded, from_cache = build_module(name, ir, target, cache_dir)
    emitted = Emitted(ir, name, _arg_specs(spec), (), False, ())
    seconds = time.perf_counter() - t0
    kernel = LstmKernel("lstm", emitted, loaded, target, seconds, from_cache, fastmath=False)
    kernel.spec = spec
    return kernel
