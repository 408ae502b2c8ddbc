"""The native LSTM's products in outer-product form (:mod:`~.lstm` at a batch of at least
:data:`PANEL_MIN_BATCH`): a weight matrix ``M[4H, K]`` (``W`` or ``R`` of one direction)
is packed once per call (or once for all: a model's constant ``R``,
:func:`geode.codegen.packed_weights.lstm_panels` lays it out alike) into panels of ``U``
hidden units (``U``: one vector's lanes),
and ``out[rows, 4H] = A[rows, K] @ M^T`` is computed panel by panel with accumulators
along the panel's columns, broadcasting ``A[r, k]`` and multiplying ``M^T``'s row ``k``
in: no horizontal sums, and the packed panel streamed contiguously.

Panel ``p`` holds the units ``[p * U, p * U + U)`` of the four gates (units past ``H``
are zero columns), as :data:`GROUPS` groups of :data:`GROUP_VECTORS` gate vectors each,
a group laid out ``[k][GROUP_VECTORS * U]`` (``4 * U * K`` items per panel): a block of
rows of ``A`` by one group is one pass of fused multiply-adds over ``k``.

Every element of ``out`` is one chain of fused multiply-adds over ``k`` in order from
zero, whatever the row block or panel split, so the results are the same bits on any
thread count. A block of few rows takes several groups, or several panels' groups, in
one pass (:func:`_passes`): more independent chains. No software prefetch: the hardware
streams the panels (on Zen 5, batch 1 and 2 on two threads, prefetching one line of each
group's row ``k`` 8 rows ahead, which the eighth session kept from Zen 4, took 1.06-1.07x
the time of none one panel at a time, 1.18-1.22x with an item's panels in one pass; both
lines, 4-16 rows ahead: 0.98-1.02x).
"""

from __future__ import annotations

from geode.codegen.backends.llvm.irloops import Builder
from geode.codegen.backends.llvm.irtext import FunctionWriter, ModuleWriter

__all__ = [
    "GROUPS",
    "GROUP_VECTORS",
    "PANEL_MIN_BATCH",
    "PROJECTION_SLOTS",
    "declare_vector_ops",
    "pack_function",
    "panel_chunk_function",
    "panel_items",
    "panel_product_function",
    "panel_rows",
]

#: batch from which the LSTM's products run in this form (below it, the dot products of
#: :mod:`~.lstm`, which need no packing: at batch 1 a step streams ``R`` once either way)
PANEL_MIN_BATCH = 2

#: gate vectors a block of rows computes together (its accumulators: rows x this)
GROUP_VECTORS = 2

#: groups of a panel (the four gates, :data:`GROUP_VECTORS` at a time)
GROUPS = 4 // GROUP_VECTORS


def chunk_writer(
    name: str, stepped: bool = False
) -> tuple[FunctionWriter, Builder, tuple[str, ...]]:
    """An internal ``void @name(ptr ctx, i64 chunk, i64 nchunks)``, the shape of a pool
    launch's chunk (``geode_parallel_for``; ``stepped``: ``void @name(ptr ctx, i64 s, i64
    chunk, i64 nchunks)``, a stepped launch's, ``geode_parallel_steps``), its builder and
    its parameters."""
    params = [("ptr", "ctx")] + ([("i64", "s")] if stepped else [])
    params += [("i64", "chunk"), ("i64", "nchunks")]
    fn = FunctionWriter(name, "void", params)
    fn.linkage = "internal"
    fn.attrs = " nounwind"
    return fn, Builder(fn), tuple(fn.param(j) for j in range(len(params)))


def panel_items(hidden: int, lanes: int, k: int) -> int:
    """Items of a weight ``M[4H, K]`` packed in panels of ``lanes`` units (``H``:
    ``hidden``): ``ceil(H / lanes)`` panels of ``4 * lanes * K``."""
    return -(-hidden // lanes) * 4 * lanes * k if lanes else 0


def panel_rows(vector_registers: int) -> int:
    """Rows of ``A`` a block computes at once: 8 (16 accumulators) with 32 vector
    registers, else 4 (8 accumulators, the group's loads and a broadcast beside them)."""
    return 8 if vector_registers >= 32 else 4


def declare_vector_ops(
    module: ModuleWriter, ty: str, lanes: int, item: int
) -> tuple[str, str, str]:
    """The fma, masked load and masked store intrinsics of ``<lanes x ty>``."""
    vt = f"<{lanes} x {ty}>"
    sfx = f"v{lanes}f{8 * item}"
    fma = module.declare(f"llvm.fma.{sfx}", f"declare {vt} @llvm.fma.{sfx}({vt}, {vt}, {vt})")
    mload = module.declare(
        f"llvm.masked.load.{sfx}.p0",
        f"declare {vt} @llvm.masked.load.{sfx}.p0(ptr, i32 immarg, <{lanes} x i1>, {vt})",
    )
    mstore = module.declare(
        f"llvm.masked.store.{sfx}.p0",
        f"declare void @llvm.masked.store.{sfx}.p0({vt}, ptr, i32 immarg, <{lanes} x i1>)",
    )
    return fma, mload, mstore


def _lanes_below(fn: FunctionWriter, lanes: int, bound: str, hint: str) -> str:
    """``<lanes x i1>``: lane ``l`` is ``l < bound``."""
    one = fn.value(f"insertelement <{lanes} x i64> poison, i64 {bound}, i64 0", hint)
    splat = fn.value(
        f"shufflevector <{lanes} x i64> {one}, <{lanes} x i64> poison, "
        f"<{lanes} x i32> zeroinitializer",
        hint,
    )
    steps = ", ".join(f"i64 {k}" for k in range(lanes))
    return fn.value(f"icmp slt <{lanes} x i64> <{steps}>, {splat}", hint)


def _transpose(fn: FunctionWriter, ty: str, lanes: int, rows: list[str]) -> list[str]:
    """The ``lanes x lanes`` tile ``rows`` transposed (vector ``k`` of the result: lane
    ``l`` is ``rows[l][k]``): at each width ``w`` (half the tile, then halving), the
    off-diagonal ``w x w`` blocks of every ``2w x 2w`` block swapped by two-source
    shuffles."""
    vt = f"<{lanes} x {ty}>"
    v = list(rows)
    w = lanes // 2
    while w >= 1:
        lo = [j if j & w == 0 else lanes + j - w for j in range(lanes)]
        hi = [j + w if j & w == 0 else lanes + j for j in range(lanes)]
        for i in range(lanes):
            if i & w:
                continue
            a, c = v[i], v[i + w]
            for dst, mask in ((i, lo), (i + w, hi)):
                picks = ", ".join(f"i32 {m}" for m in mask)
                v[dst] = fn.value(
                    f"shufflevector {vt} {a}, {vt} {c}, <{lanes} x i32> <{picks}>", "tr"
                )
        w //= 2
    return v


def pack_function(
    module: ModuleWriter, name: str, ty: str, item: int, hidden: int, lanes: int, attrs: str
) -> FunctionWriter:
    """``void @name(ptr M, ptr P, i64 K, i64 p)``: pack panel ``p`` of ``M[4H, K]``
    (row-major) into ``P`` (the panel's own start; see the module docstring), tiles of
    ``lanes x lanes`` transposed in registers."""
    _, mload, _ = declare_vector_ops(module, ty, lanes, item)
    vt = f"<{lanes} x {ty}>"
    params = [("ptr noalias", "M"), ("ptr noalias", "P"), ("i64", "K"), ("i64", "p")]
    fn = FunctionWriter(name, "void", params)
    fn.linkage = "internal"
    fn.attrs = " " + module.attr_group("nounwind noinline " + attrs)
    b = Builder(fn)
    m, dst, k_len, p = (fn.param(j) for j in range(4))
    unit0 = b.mul(p, str(lanes), "unit0")
    valid = b.min(b.sub(str(hidden), unit0), str(lanes), "valid")
    rowok = [b.cmp("slt", str(r), valid, "rowok") for r in range(lanes)]
    full = b.mul(b.op("sdiv", k_len, str(lanes)), str(lanes), "kfull")
    rest = b.sub(k_len, full, "krest")
    all_k = _lanes_below(fn, lanes, str(lanes), "kall")
    tail_k = _lanes_below(fn, lanes, rest, "ktail")
    zero = f"{vt} zeroinitializer"
    group_items = b.mul(k_len, str(GROUP_VECTORS * lanes), "gitems")

    def tile(k0: str, tail: bool) -> None:
        kmask = tail_k if tail else all_k
        for q in range(4):
            g, s = divmod(q, GROUP_VECTORS)
            loads = []
            for r in range(lanes):
                row = b.add(unit0, str(q * hidden + r), "mrow")
                at = fn.value(
                    f"getelementptr {ty}, ptr {m}, i64 {b.add(b.mul(row, k_len), k0)}", "src"
                )
                mask = fn.value(
                    f"select i1 {rowok[r]}, <{lanes} x i1> {kmask}, <{lanes} x i1> zeroinitializer",
                    "mask",
                )
                args = f"ptr {at}, i32 {item}, <{lanes} x i1> {mask}, {zero}"
                loads.append(fn.value(f"call {vt} {mload}({args})", "row"))
            cols = _transpose(fn, ty, lanes, loads)
            base = b.add(b.mul(str(g), group_items), str(s * lanes), "gbase")
            for kk, vec in enumerate(cols):
                k = b.add(k0, str(kk), "k")

                def put(k: str = k, vec: str = vec, base: str = base) -> None:
                    at = b.add(base, b.mul(k, str(GROUP_VECTORS * lanes)), "dsti")
                    fn.add(f"store {vt} {vec}, ptr {b.gep(ty, dst, at, 'dst')}, align {item}")

                if tail:
                    b.when(b.cmp("slt", k, k_len), put, "kin")
                else:
                    put()

    b.loop("0", full, lambda k0: tile(k0, False), "kt", step=str(lanes))
    b.when(b.cmp("sgt", rest, "0"), lambda: tile(full, True), "ktl")
    fn.terminate("ret void")
    return fn


def panel_product_function(
    module: ModuleWriter,
    name: str,
    ty: str,
    item: int,
    hidden: int,
    lanes: int,
    block_rows: int,
    attrs: str,
    panels: int = 1,
) -> FunctionWriter:
    """``void @name(ptr A, i64 lda, ptr P, ptr out, i64 ldo, i64 rows, i64 K, i64 p)``:
    the columns of the ``panels`` panels from ``p`` (packed at ``P`` and on, one after
    the other) of ``out[rows, 4H] = A[rows, K] @ M^T`` (``A`` and ``out`` row-major with
    row strides ``lda`` and ``ldo``): blocks of ``block_rows`` rows of ``A``, then one
    block each of half, a quarter ... of that for the rows left; per block and group,
    ``block_rows x GROUP_VECTORS`` accumulators along the units, ``A[r, k]`` broadcast (a
    block of fewer rows takes all the groups, and of all the panels, in one pass when
    their accumulators fit in as many: more independent chains, :func:`_passes`); the
    columns past ``H`` not stored."""
    fma, _, mstore = declare_vector_ops(module, ty, lanes, item)
    vt = f"<{lanes} x {ty}>"
    names = ["A", "lda", "P", "out", "ldo", "rows", "K", "p"]
    kinds = ["ptr noalias", "i64", "ptr noalias", "ptr noalias", "i64", "i64", "i64", "i64"]
    fn = FunctionWriter(name, "void", list(zip(kinds, names)))
    fn.linkage = "internal"
    fn.attrs = " " + module.attr_group("nounwind noinline " + attrs)
    b = Builder(fn)
    a, lda, panel, out, ldo, rows, k_len, p = (fn.param(j) for j in range(8))
    unit0s = [b.mul(b.add(p, str(q)), str(lanes), "unit0") for q in range(panels)]
    smasks = [
        _lanes_below(fn, lanes, b.min(b.sub(str(hidden), u0), str(lanes), "valid"), "smask")
        for u0 in unit0s
    ]
    gates = GROUPS * GROUP_VECTORS
    width = max(gates * panels, block_rows * GROUP_VECTORS)
    accs = [[fn.alloca(vt, f"acc{r}_{q}") for q in range(width)] for r in range(block_rows)]
    group_items = b.mul(k_len, str(GROUP_VECTORS * lanes), "gitems")
    panel_items = b.mul(k_len, str(4 * lanes), "pitems")

    def one_pass(arows: list[str], r0: str, streams: list[tuple[int, int]]) -> None:
        """One pass over ``k`` for the (panel, group) ``streams`` of the block's rows."""
        count = len(arows)
        gbases = [
            b.gep(ty, panel, b.add(b.mul(str(q), panel_items), b.mul(str(g), group_items)), "gb")
            for q, g in streams
        ]
        mine = [line[: len(streams) * GROUP_VECTORS] for line in accs[:count]]
        for acc in (x for line in mine for x in line):
            fn.add(f"store {vt} zeroinitializer, ptr {acc}")

        def term(k: str) -> None:
            mv = []
            for gbase in gbases:
                krow = b.gep(ty, gbase, b.mul(k, str(GROUP_VECTORS * lanes)), "krow")
                mv += [
                    fn.value(f"load {vt}, ptr {b.gep(ty, krow, str(s * lanes))}, align {item}", "m")
                    for s in range(GROUP_VECTORS)
                ]
            for arow, line in zip(arows, mine):
                x = b.load(ty, b.gep(ty, arow, k), "x")
                one = fn.value(f"insertelement {vt} poison, {ty} {x}, i64 0", "x1")
                xs = fn.value(
                    f"shufflevector {vt} {one}, {vt} poison, <{lanes} x i32> zeroinitializer",
                    "xs",
                )
                for acc, mvec in zip(line, mv):
                    old = fn.value(f"load {vt}, ptr {acc}", "a")
                    new = fn.value(f"call {vt} {fma}({vt} {mvec}, {vt} {xs}, {vt} {old})")
                    fn.add(f"store {vt} {new}, ptr {acc}")

        b.loop("0", k_len, term, "k")
        for r, line in enumerate(mine):
            orow = b.gep(ty, out, b.mul(b.add(r0, str(r)), ldo), "orow")
            for j, acc in enumerate(line):
                (q, g), s = streams[j // GROUP_VECTORS], j % GROUP_VECTORS
                gate = g * GROUP_VECTORS + s
                dst = b.gep(ty, orow, b.add(unit0s[q], str(gate * hidden)), "dst")
                val = fn.value(f"load {vt}, ptr {acc}", "sum")
                args = f"{vt} {val}, ptr {dst}, i32 {item}, <{lanes} x i1> {smasks[q]}"
                fn.add(f"call void {mstore}({args})")

    def block(r0: str, count: int) -> None:
        arows = [b.gep(ty, a, b.mul(b.add(r0, str(r)), lda), "arow") for r in range(count)]
        for streams in _passes(count, block_rows, panels):
            one_pass(arows, r0, streams)

    full = b.mul(b.op("sdiv", rows, str(block_rows)), str(block_rows), "rfull")
    b.loop("0", full, lambda r0: block(r0, block_rows), "rb", step=str(block_rows))
    rem = b.sub(rows, full, "rrem")
    count = block_rows // 2
    while count >= 1:
        start = b.add(full, b.op("and", rem, str(-2 * count)), "rstart")
        has = b.cmp("ne", b.op("and", rem, str(count)), "0")
        b.when(has, lambda start=start, count=count: block(start, count), f"rt{count}")
        count //= 2
    fn.terminate("ret void")
    return fn


def _passes(count: int, block_rows: int, panels: int) -> list[list[tuple[int, int]]]:
    """The passes over ``k`` of a block of ``count`` rows (of a function of ``block_rows``
    rows' blocks) over ``panels`` panels: each pass a list of (panel, group) streams.
    All of them in one pass when their accumulators fit in a full block's (a block of few
    rows then runs more chains per row: the chains' latency, not the FMA rate, bounds a
    row alone, batch 1 at 4 chains), else every panel's groups in one pass when they fit,
    else one group per pass. Every element is one chain along ``k`` either way."""
    budget = block_rows * GROUP_VECTORS
    every = [(q, g) for q in range(panels) for g in range(GROUPS)]
    if count * GROUP_VECTORS * len(every) <= budget:
        return [every]
    if count * GROUP_VECTORS * GROUPS <= budget:
        return [[(q, g) for g in range(GROUPS)] for q in range(panels)]
    return [[s] for s in every]


#: the context of the panel form's projection launch: W, its panels, R, its panels, X,
#: GX (pointers), then the rows of X (one 8-byte slot each)
PROJECTION_SLOTS = 7


def panel_chunk_function(
    module: ModuleWriter,
    name: str,
    pack: str,
    product: str,
    ty: str,
    hidden: int,
    input_size: int,
    lanes: int,
) -> FunctionWriter:
    """``void @name(ptr ctx, i64 chunk, i64 nchunks)``: chunk ``c`` of ``n`` of a
    direction's start (the context: :data:`PROJECTION_SLOTS`): for each panel ``p`` in
    ``[P * c / n, P * (c + 1) / n)`` (``P`` panels of ``lanes`` units), pack ``W``'s
    panel, compute its columns of ``GX = X @ W^T`` (``pack``, ``product``: the functions
    of :func:`pack_function` and :func:`panel_product_function`), then pack ``R``'s
    panel for the steps."""
    fn, b, (ctx, chunk, nchunks) = chunk_writer(name)
    slots = [b.load("i64", b.gep("i64", ctx, str(j)), "slot") for j in range(PROJECTION_SLOTS)]
    w, wp, r, rp, x, gx = (fn.value(f"inttoptr i64 {v} to ptr", "p") for v in slots[:6])
    rows = slots[6]
    panels = str(-(-hidden // lanes))
    lo = fn.value(f"udiv i64 {b.mul(panels, chunk)}, {nchunks}", "plo")
    hi = fn.value(f"udiv i64 {b.mul(panels, b.add(chunk, '1'))}, {nchunks}", "phi")
    size, hid, g4 = str(input_size), str(hidden), str(4 * hidden)

    def panel(p: str) -> None:
        if input_size:
            wpan = b.gep(ty, wp, b.mul(p, str(4 * lanes * input_size)), "wpan")
            fn.add(f"call void @{pack}(ptr {w}, ptr {wpan}, i64 {size}, i64 {p})")
            args = f"ptr {x}, i64 {size}, ptr {wpan}, ptr {gx}, i64 {g4}, i64 {rows}, i64 {size}"
            fn.add(f"call void @{product}({args}, i64 {p})")
        rpan = b.gep(ty, rp, b.mul(p, str(4 * lanes * hidden)), "rpan")
        fn.add(f"call void @{pack}(ptr {r}, ptr {rpan}, i64 {hid}, i64 {p})")

    b.loop(lo, hi, panel, "pan")
    fn.terminate("ret void")
    return fn
