"""The ``depthwise`` body of a native conv (:mod:`~.conv`): one input channel per group
(``C/g = 1``, any ``M/g``), computed directly, no GEMM: im2col would copy every input
element ``kh * kw`` times for a GEMM whose inner dimension is only ``kh * kw``.

Output plane ``(n, m)`` reads input plane ``(n, m // (M/g))`` and the ``kh * kw``
weights of channel ``m``. With padding, the input plane is first copied into a
zero-bordered scratch plane of exactly the rows and columns the windows reach
(``(OH-1)*sh + (kh-1)*dh + 1`` by ``(OW-1)*sw + (kw-1)*dw + 1``; planes sharing an
input plane, ``M/g > 1``, copy it once); without, the windows read the input in place.
Then every output element is ``bias + sum_ij w[m, 0, i, j] * p[oh*sh + i*dh, ow*sw +
j*dw]`` with no bounds to check: up to :data:`MAX_UNROLLED_TAPS` taps are summed
unrolled in registers, one loop over the row's columns that LLVM vectorizes; larger
windows accumulate tap by tap into the output row (each tap one vectorized loop).

The planes are shared among the native pool's threads (:mod:`~.parallel`'s launcher,
``threads`` from the entry's ints; no BLAS runs here); below
:data:`~.parallel.MIN_PARALLEL_ELEMENTS` multiply-adds the calling thread does all.
Each chunk of planes ``malloc``-s its own scratch plane; a NULL sets the context's
failure flag and the body returns status ``n_arrays + 1`` once the launch is over.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from geode.codegen.backends.llvm.conv_spec import BODY_PARAMS, TYPES, ConvSpec, body_geometry
from geode.codegen.backends.llvm.irloops import Builder
from geode.codegen.backends.llvm.irtext import FunctionWriter, ModuleWriter, float_literal
from geode.codegen.backends.llvm.parallel import LAUNCH, MIN_PARALLEL_ELEMENTS

__all__ = [
    "MAX_UNROLLED_TAPS",
    "PREFETCH_ROWS",
    "Chunk",
    "chunk_start",
    "pad_function",
    "padded_size",
    "prefetch_row",
    "scratch_plane",
    "scratch_row",
    "span_writer",
    "vector_lanes",
    "write_body",
]

#: windows of at most this many taps are summed unrolled, in registers
MAX_UNROLLED_TAPS = 64
#: the chunk function's context: pointers, sizes, the failure flag; one i64 slot each
_CTX = ("X", "W", "B", "Y", "planes", "H", "Wd", "OH", "OW", "pt", "pl", "failed")


def write_body(module: ModuleWriter, name: str, spec: ConvSpec, attrs: str) -> None:
    """Add ``i32 @name(geometry)`` (see :data:`~.conv_spec.BODY_PARAMS`) computing
    ``spec``'s depthwise conv on the native pool; ``attrs``: the target's function
    attributes."""
    plane, pad, chunk = f"{name}.plane", f"{name}.pad", f"{name}.chunk"
    module.add_function(_plane_function(module, plane, spec, attrs))
    module.add_function(pad_function(module, pad, spec.dtype, attrs))
    module.add_function(_chunk_function(module, chunk, plane, pad, spec, attrs))
    module.declare("geode_num_threads", "declare i64 @geode_num_threads() nounwind")
    module.declare(
        "geode_parallel_for", "declare void @geode_parallel_for(ptr, ptr, i64, i64) nounwind"
    )
    module.add_global("geode.launch", LAUNCH)
    fn = FunctionWriter(name, "i32", BODY_PARAMS)
    fn.linkage = "internal"
    fn.attrs = " " + module.attr_group("nounwind " + attrs)
    b = Builder(fn)
    geo = body_geometry(fn)
    planes = b.mul(geo.n, str(spec.out_channels), "planes")
    values = [geo.x, geo.w, geo.b, geo.y, planes, geo.h, geo.wd, geo.oh, geo.ow, geo.pt, geo.pl]
    ctx = fn.alloca(f"[{len(_CTX)} x i64]", "ctx", align=8)
    for i, v in enumerate([*values, "0"]):
        slot = b.gep("i64", ctx, str(i), "slot")
        fn.add(f"store {'ptr' if i < 4 else 'i64'} {v}, ptr {slot}")
    taps = spec.kernel[0] * spec.kernel[1]
    work = b.mul(b.mul(planes, b.mul(geo.oh, geo.ow)), str(taps), "work")
    small = b.cmp("slt", work, str(MIN_PARALLEL_ELEMENTS), "small")
    launch_and_return(b, chunk, ctx, len(_CTX), planes, geo.threads, small, spec)
    module.add_function(fn)


def launch_and_return(
    b: Builder,
    chunk: str,
    ctx: str,
    slots: int,
    items: str,
    threads: str,
    small: str,
    spec: ConvSpec,
) -> None:
    """The entry's tail: ``items`` chunks of ``@chunk`` launched on the pool (on the
    calling thread when ``small``), then ``ret`` 0, or the out-of-memory status
    (``n_arrays + 1``) when a chunk set the context's last slot (``failed``)."""
    fn = b.fn
    fn.add(
        f"call void @geode.launch(ptr @{chunk}, ptr {ctx}, i64 {items}, i64 {threads}, i1 {small})"
    )
    failed = b.load("i64", b.gep("i64", ctx, str(slots - 1)), "failed")
    status = fn.value(f"select i1 {b.cmp('ne', failed, '0')}, i32 {len(spec.arrays) + 1}, i32 0")
    fn.terminate(f"ret i32 {status}")


def padded_size(b: Builder, spec: ConvSpec, v: dict[str, str]) -> tuple[str, str]:
    """Rows and columns of the scratch plane: what the windows reach (``spec``: any
    window spec with ``kernel``, ``strides`` and ``dilations``; ``v``: ``OH``, ``OW``)."""
    (kh, kw), (sh, sw), (dh, dw) = spec.kernel, spec.strides, spec.dilations
    hp = b.add(b.mul(b.sub(v["OH"], "1"), str(sh)), str((kh - 1) * dh + 1), "Hp")
    wp = b.add(b.mul(b.sub(v["OW"], "1"), str(sw)), str((kw - 1) * dw + 1), "Wp")
    return hp, wp


@dataclass
class Chunk:
    """A chunk function's start (:func:`chunk_start`): its writer, the context's values
    by name, this chunk's planes ``[lo, hi)``; with :func:`scratch_plane`, whether the
    planes are padded, the scratch plane's rows and columns and its buffer."""

    fn: FunctionWriter
    b: Builder
    v: dict[str, str]
    lo: str
    hi: str
    padded: str = "false"
    hp: str = ""
    wp: str = ""
    buf: str = "null"


def chunk_start(
    module: ModuleWriter, name: str, attrs: str, ctx_names: tuple[str, ...], n_ptrs: int
) -> Chunk:
    """Begin ``void @name(ptr ctx, i64 chunk, i64 nchunks)``: the context's slots named
    ``ctx_names`` (the first ``n_ptrs`` pointers, then i64s; the last one, the failure
    flag, not loaded) and this chunk's share of ``planes`` (one of them)."""
    fn = FunctionWriter(name, "void", [("ptr", "ctx"), ("i64", "chunk"), ("i64", "nchunks")])
    fn.linkage = "internal"
    fn.attrs = " " + module.attr_group("nounwind " + attrs)
    b = Builder(fn)
    ctx, chunk, nchunks = fn.param(0), fn.param(1), fn.param(2)
    v = {
        k: b.load("ptr" if i < n_ptrs else "i64", b.gep("i64", ctx, str(i)), k)
        for i, k in enumerate(ctx_names[:-1])
    }
    v["failed"] = b.gep("i64", ctx, str(len(ctx_names) - 1), "failed")
    lo = b.op("udiv", b.mul(v["planes"], chunk), nchunks, "lo")
    hi = b.op("udiv", b.mul(v["planes"], b.add(chunk, "1")), nchunks, "hi")
    return Chunk(fn, b, v, lo, hi)


def scratch_plane(module: ModuleWriter, c: Chunk, spec: ConvSpec, item: int) -> None:
    """The chunk's scratch plane (sets ``c.padded``, ``c.hp``, ``c.wp``, ``c.buf``): what
    the windows of ``spec`` reach, ``malloc``-ed when they reach past the input (the
    context's ``pt``, ``pl``, ``H``, ``Wd``, ``OH``, ``OW``); a NULL sets the failure flag
    and returns."""
    fn, b, v = c.fn, c.b, c.v
    c.hp, c.wp = hp, wp = padded_size(b, spec, v)
    pads = [b.cmp("sgt", v["pt"], "0"), b.cmp("sgt", v["pl"], "0")]
    pads += [b.cmp("sgt", hp, v["H"]), b.cmp("sgt", wp, v["Wd"])]
    c.padded = padded = b.any_of(pads)
    module.declare("malloc", "declare noalias ptr @malloc(i64) nounwind")
    module.declare("free", "declare void @free(ptr) nounwind")
    nbytes = b.mul(b.mul(hp, wp), str(item), "padbytes")
    scratch = fn.value(f"select i1 {padded}, i64 {nbytes}, i64 0", "scratch")
    c.buf = buf = fn.value(f"call noalias ptr @malloc(i64 {scratch})", "buf")  # 0: a token
    nomem = b.all_of([b.cmp("slt", c.lo, c.hi), fn.value(f"icmp eq ptr {buf}, null"), padded])

    def fail() -> None:
        fn.add(f"store atomic i64 1, ptr {v['failed']} monotonic, align 8")
        fn.terminate("ret void")
        fn.start_block(fn.label("unreachable"))

    b.when(nomem, fail, "nomem")


def _chunk_function(
    module: ModuleWriter, name: str, plane: str, pad: str, spec: ConvSpec, attrs: str
) -> FunctionWriter:
    """``void @name(ptr ctx, i64 chunk, i64 nchunks)``: this chunk's share of the planes
    (padded into its own scratch plane when the conv pads)."""
    ty, item = TYPES[spec.dtype]
    c = chunk_start(module, name, attrs, _CTX, 4)
    scratch_plane(module, c, spec, item)
    fn, b, v, lo, hi = c.fn, c.b, c.v, c.lo, c.hi
    hw, p = b.mul(v["H"], v["Wd"], "HW"), b.mul(v["OH"], v["OW"], "P")
    padded, hp, wp, buf = c.padded, c.hp, c.wp, c.buf
    last = fn.alloca("i64", "last")
    fn.add(f"store i64 -1, ptr {last}")
    m_all, taps = str(spec.out_channels), spec.kernel[0] * spec.kernel[1]
    sizes = ", ".join(f"i64 {x}" for x in (v["OH"], v["OW"]))

    def one(q: str) -> None:
        n, m = b.op("udiv", q, m_all, "n"), b.op("urem", q, m_all, "m")
        xplane = b.add(b.mul(n, str(spec.channels)), b.op("udiv", m, str(spec.mg)), "xplane")
        x = b.gep(ty, v["X"], b.mul(xplane, hw), "x")
        fresh = b.all_of([padded, b.cmp("ne", b.load("i64", last, "prev"), xplane)])

        def copy() -> None:
            fn.add(
                f"call void @{pad}(ptr {x}, ptr {buf}, i64 {v['H']}, i64 {v['Wd']}, i64 {hp}, "
                f"i64 {wp}, i64 {v['pt']}, i64 {v['pl']})"
            )
            fn.add(f"store i64 {xplane}, ptr {last}")

        b.when(fresh, copy, "copy")
        src = fn.value(f"select i1 {padded}, ptr {buf}, ptr {x}", "src")
        pitch = b.select(padded, wp, v["Wd"], "pitch")
        y = b.gep(ty, v["Y"], b.mul(q, p), "y")
        w = b.gep(ty, v["W"], b.mul(m, str(taps)), "w")
        bias = b.load(ty, b.gep(ty, v["B"], m), "bias") if spec.bias else float_literal(0.0, ty)
        fn.add(
            f"call void @{plane}(ptr {src}, i64 {pitch}, ptr {w}, ptr {y}, {ty} {bias}, {sizes})"
        )

    b.loop(lo, hi, one, "q")
    fn.add(f"call void @free(ptr {buf})")
    fn.terminate("ret void")
    return fn


def pad_writer(
    module: ModuleWriter, name: str, attrs: str
) -> tuple[FunctionWriter, Builder, tuple[str, ...]]:
    """A scratch-plane copy's function ``void @name(ptr x, ptr buf, i64 H, i64 Wd, i64 Hp,
    i64 Wp, i64 pt, i64 pl)`` (internal, never inlined, no library calls), its builder
    and its eight parameters in that order."""
    names = ("x", "buf", "H", "Wd", "Hp", "Wp", "pt", "pl")
    params = [("ptr noalias", n) for n in names[:2]] + [("i64", n) for n in names[2:]]
    fn = FunctionWriter(name, "void", params)
    fn.linkage = "internal"
    fn.attrs = " " + module.attr_group('nounwind noinline "no-builtins" ' + attrs)
    return fn, Builder(fn), tuple(fn.param(i) for i in range(len(names)))


def pad_function(
    module: ModuleWriter, name: str, dtype: str, attrs: str, fill: float = 0.0
) -> FunctionWriter:
    """``void @name(ptr x, ptr buf, i64 H, i64 Wd, i64 Hp, i64 Wp, i64 pt, i64 pl)``: the
    ``dtype`` input plane ``x`` into the ``Hp x Wp`` scratch plane, ``pt`` rows and ``pl``
    columns in, ``fill`` around it (nothing past what the windows reach). A row is three
    spans (the fill left of the input, the input's columns, the fill right of it), each
    in vectors of the host's width, the last one of a span masked: no per-element index
    arithmetic, and a short row is a few vector operations (LLVM's own loops over such
    spans leave short rows to scalar remainders). Each input row copied prefetches the row
    :data:`PREFETCH_ROWS` below it."""
    ty, size = TYPES[dtype]
    fn, b, (x, buf, h, wd, hp, wp, pt, pl) = pad_writer(module, name, attrs)
    lo = b.min(pl, wp, "lo")  # columns [lo, hi) of a row come from the input
    hi = b.max(lo, b.min(b.add(pl, wd), wp), "hi")
    span = span_writer(module, fn, b, ty, vector_lanes(size, attrs), fill)
    ahead = PREFETCH_ROWS
    module.declare("llvm.prefetch.p0", "declare void @llvm.prefetch.p0(ptr, i32, i32, i32)")

    def row(r: str) -> None:
        ih, dst, inside = scratch_row(b, ty, buf, r, (pt, wp, h))

        def copy() -> None:
            xrow = b.gep(ty, x, b.mul(ih, wd), "xrow")
            if ahead:
                prefetch_row(b, xrow, b.mul(wd, str(ahead)), wd, size)
            span(dst, None, lo)
            span(b.gep(ty, dst, lo, "mid"), b.gep(ty, xrow, b.sub(lo, pl), "from"), b.sub(hi, lo))
            span(b.gep(ty, dst, hi, "right"), None, b.sub(wp, hi))

        b.branch(inside, copy, lambda: span(dst, None, wp), "inside")

    b.loop("0", hp, row, "r")
    fn.terminate("ret void")
    return fn


#: a scratch copy prefetches the input this many rows below the row it copies: the rows of
#: a plane are one stream, but a band's copy is short and the next plane's starts cold, and
#: the copies waited on the loads (8x32x112x112 stride-2 conv, one thread, Zen 5: the copy
#: 23% of its samples; the conv 0.86x, the 1x1 stride-2 shortcut 0.61x, the stem 0.96x
#: its time without; 8 rows ran as 4)
PREFETCH_ROWS = 4


def prefetch_row(b: Builder, row: str, ahead: str, n: str, size: int) -> None:
    """Prefetch (for reading) the ``n`` elements of ``size`` bytes ``ahead`` elements past
    ``row``, a cache line at a time (a prefetch never faults: past the end is harmless)."""
    fn = b.fn
    start = fn.value(f"getelementptr i8, ptr {row}, i64 {b.mul(ahead, str(size))}", "pfrow")

    def line(i: str) -> None:
        at = fn.value(f"getelementptr i8, ptr {start}, i64 {i}", "pfline")
        fn.add(f"call void @llvm.prefetch.p0(ptr {at}, i32 0, i32 3, i32 1)")

    b.loop("0", b.mul(n, str(size)), line, "pf", step="64")


def scratch_row(
    b: Builder, ty: str, buf: str, r: str, geo: tuple[str, str, str]
) -> tuple[str, str, str]:
    """Scratch row ``r`` of a padded plane, ``geo`` = (top pad, padded width, input
    height): its input row ``ih``, its first element, and whether ``ih`` is inside the
    input (else the row is all padding)."""
    pt, wp, h = geo
    ih = b.sub(r, pt, "ih")
    dst = b.gep(ty, buf, b.mul(r, wp), "dst")
    return ih, dst, b.all_of([b.cmp("sge", ih, "0"), b.cmp("slt", ih, h)])


def vector_lanes(size: int, attrs: str) -> int:
    """Elements of ``size`` bytes per vector: 64-byte vectors on AVX-512 hosts (unless the
    target prefers 256-bit ones), else 32 bytes."""
    wide = "+avx512f" in attrs and '"prefer-vector-width"="256"' not in attrs
    return (64 if wide else 32) // size


def span_writer(
    module: ModuleWriter, fn: FunctionWriter, b: Builder, ty: str, vl: int, fill: float
) -> Callable[[str, str | None, str], None]:
    """``span(dst, src, n)``: ``n`` elements from ``src`` (None: ``fill``) to ``dst``, in
    vectors of ``vl`` lanes, each store (and load) masked to the lanes below ``n``."""
    vty, bits = f"<{vl} x {ty}>", 32 if ty == "float" else 64
    suffix = f"v{vl}f{bits}"
    module.declare(
        f"llvm.masked.store.{suffix}.p0",
        f"declare void @llvm.masked.store.{suffix}.p0({vty}, ptr, i32, <{vl} x i1>)",
    )
    module.declare(
        f"llvm.masked.load.{suffix}.p0",
        f"declare {vty} @llvm.masked.load.{suffix}.p0(ptr, i32, <{vl} x i1>, {vty})",
    )
    lanes = "<" + ", ".join(f"i32 {q}" for q in range(vl)) + ">"
    filled = "<" + ", ".join([f"{ty} {float_literal(fill, ty)}"] * vl) + ">"

    def span(dst: str, src: str | None, n: str) -> None:
        def chunk(c: str) -> None:
            left = fn.value(f"trunc i64 {b.min(b.sub(n, c), str(vl))} to i32", "left")
            one = fn.value(f"insertelement <{vl} x i32> poison, i32 {left}, i64 0", "one")
            limit = fn.value(
                f"shufflevector <{vl} x i32> {one}, <{vl} x i32> poison, "
                f"<{vl} x i32> zeroinitializer",
                "limit",
            )
            mask = fn.value(f"icmp slt <{vl} x i32> {lanes}, {limit}", "mask")
            val = filled
            if src is not None:
                val = fn.value(
                    f"call {vty} @llvm.masked.load.{suffix}.p0(ptr {b.gep(ty, src, c)}, "
                    f"i32 {bits // 8}, <{vl} x i1> {mask}, {vty} {filled})",
                    "v",
                )
            fn.add(
                f"call void @llvm.masked.store.{suffix}.p0({vty} {val}, ptr {b.gep(ty, dst, c)}, "
                f"i32 {bits // 8}, <{vl} x i1> {mask})"
            )

        b.loop("0", n, chunk, "pc", step=str(vl))

    return span


def _plane_function(module: ModuleWriter, name: str, spec: ConvSpec, attrs: str) -> FunctionWriter:
    """``void @name(ptr p, i64 pitch, ptr w, ptr y, T bias, i64 OH, i64 OW)``: one output
    plane from the (scratch) input plane ``p`` of row pitch ``pitch`` (see the module
    docstring)."""
    ty, _ = TYPES[spec.dtype]
    (kh, kw), (sh, sw), (dh, dw) = spec.kernel, spec.strides, spec.dilations
    params = [("ptr noalias", "p"), ("i64", "pitch"), ("ptr noalias", "w"), ("ptr noalias", "y")]
    params += [(ty, "bias"), ("i64", "OH"), ("i64", "OW")]
    fn = FunctionWriter(name, "void", params)
    fn.linkage = "internal"
    fn.attrs = " " + module.attr_group("nounwind noinline " + attrs)
    b = Builder(fn)
    p, pitch, w, y, bias, oh_n, ow_n = (fn.param(i) for i in range(len(params)))
    unrolled = kh * kw <= MAX_UNROLLED_TAPS
    weights = [b.load(ty, b.gep(ty, w, str(t)), "w") for t in range(kh * kw)] if unrolled else []

    def madd(acc: str, wv: str, src: str) -> str:
        prod = fn.value(f"fmul contract {ty} {wv}, {b.load(ty, src, 'xv')}", "prod")
        return fn.value(f"fadd contract {ty} {acc}, {prod}", "sum")

    def out_row(oh: str) -> None:
        yrow = b.gep(ty, y, b.mul(oh, ow_n), "yrow")
        top = b.mul(oh, str(sh), "top")
        if unrolled:
            rows = [b.gep(ty, p, b.mul(b.add(top, str(i * dh)), pitch), "prow") for i in range(kh)]

            def column(o: str) -> None:
                base, acc = b.mul(o, str(sw), "iw"), bias
                for t in range(kh * kw):
                    i, j = divmod(t, kw)
                    acc = madd(acc, weights[t], b.gep(ty, rows[i], b.add(base, str(j * dw))))
                fn.add(f"store {ty} {acc}, ptr {b.gep(ty, yrow, o)}")

            # masked tail: unit stride only (strided masked loads become slow gathers)
            meta = Builder.tail_folded(module) if sw == 1 else ""
            b.loop("0", ow_n, column, "ow", meta=meta)
            return
        fill = lambda o: fn.add(f"store {ty} {bias}, ptr {b.gep(ty, yrow, o)}")  # noqa: E731
        b.loop("0", ow_n, fill, "fill")

        def tap(t: str) -> None:
            i, j = b.op("udiv", t, str(kw), "ti"), b.op("urem", t, str(kw), "tj")
            wv = b.load(ty, b.gep(ty, w, t), "wv")
            at = b.add(b.mul(b.add(top, b.mul(i, str(dh))), pitch), b.mul(j, str(dw)))
            prow = b.gep(ty, p, at, "prow")

            def column(o: str) -> None:
                dst = b.gep(ty, yrow, o, "dst")
                src = b.gep(ty, prow, b.mul(o, str(sw)), "src")
                fn.add(f"store {ty} {madd(b.load(ty, dst, 'acc'), wv, src)}, ptr {dst}")

            b.loop("0", ow_n, column, "ow")

        b.loop("0", str(kh * kw), tap, "tap", meta=Builder.no_unroll(module))

    b.loop("0", oh_n, out_row, "oh")
    fn.terminate("ret void")
    return fn
