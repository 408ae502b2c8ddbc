"""The ``direct`` body of a native conv (:mod:`~.conv`): a register-blocked loop nest,
no im2col and no GEMM, for windows of 2 to 64 taps at horizontal stride 1 or 2 (any
vertical stride, dilation, padding and groups; depthwise convs have their own kernel).

An output *tile* is ``CB`` output channels by ``U`` vectors of ``V`` output columns of
one output row (``V``: the lanes of the host's widest vector, 16 floats with AVX-512;
``CB * U`` accumulators stay in registers, :func:`blocking`). For every input channel
and tap ``(i, j)`` of the window, the tile loads ``U`` vectors of the (scratch) input row
and multiplies each by the ``CB`` weights, broadcast: ``CB * U`` fused multiply-adds per
``U`` vector loads. The epilogue runs on the tile in registers before its one store:
the bias, then the residual ``Z`` (same shape as Y) added, then the activation (Relu).
The last vector of a row's last tile stores through a lane mask (its extra lanes read
zeros of the scratch row and are never stored); a whole tile stores plain vectors. Before its taps a tile prefetches the ``Z`` it will
read and the ``Y`` it will write (:func:`_prefetch_tile`).

Work is split into *items*, one band of output rows of one image and group
(:func:`band_rows`), shared among the native pool's threads (:mod:`~.parallel`'s
launcher). An item first copies the input rows its band reads into a zero-bordered
scratch of ``C/g`` planes (``conv_depthwise.pad_function``), with rows as wide as the
last tile reaches (``ceil(OW / V) * V * sw + (kw - 1) * dw``), so the tiles check no
bounds. At stride 2 each scratch row is stored as its even columns, then its odd ones
(:func:`_split_pad_function`): a tap's ``V`` inputs are then consecutive, one plain
vector load as at stride 1. Each chunk ``malloc``-s one scratch for its items; a NULL
sets the failure flag and the body returns status ``n_arrays + 1``.

With a MaxPool (``ConvSpec.pool``) an item is a band of *pooled* rows: its conv rows
(the pooled windows' rows within the output) go to a scratch of ``M/g`` planes, and
:func:`_pool_function` reduces them (:func:`nan_max`: NaN propagates) into Y, so the
conv's output never goes to memory.

The weights are read in place (the ``CB`` broadcasts of a tap are ``C/g * kh * kw``
apart, each cache line reused by the next 16 taps): nothing is packed at compile time.
"""

from __future__ import annotations

from collections.abc import Callable

from geode.codegen.backends.llvm.conv_depthwise import (
    PREFETCH_ROWS,
    chunk_start,
    launch_and_return,
    pad_function,
    pad_writer,
    scratch_row,
    span_writer,
    vector_lanes,
)
from geode.codegen.backends.llvm.conv_spec import BODY_PARAMS, TYPES, ConvSpec, body_geometry
from geode.codegen.backends.llvm.irloops import Builder
from geode.codegen.backends.llvm.irtext import FunctionWriter, ModuleWriter, float_literal
from geode.codegen.backends.llvm.parallel import LAUNCH
from geode.compiler.fusion.conv_bands import BAND_BUDGET_BYTES, ITEMS_PER_THREAD, ITEMS_WANTED

__all__ = [
    "BAND_BUDGET_BYTES",
    "ITEMS_PER_THREAD",
    "ITEMS_WANTED",
    "NARROW_ROWS",
    "blocking",
    "blockings",
    "lanes",
    "write_body",
]

#: the chunk function's context: pointers, sizes, the failure flag; one i64 slot each
_CTX = ("X", "W", "B", "Z", "Y", "planes", "H", "Wd", "OH", "OW", "pt", "pl", "band")
_CTX = (*_CTX, "bands", "Wp", "POH", "POW", "failed")


#: independent FMA chains a tile needs to keep two FMA pipes of 4 cycles' latency busy
FMA_CHAINS = 8
#: output rows a tile of a narrow row's blocking takes (:func:`blockings`)
NARROW_ROWS = 2


def lanes(spec: ConvSpec, attrs: str) -> int:
    """``V``: elements per vector (64-byte vectors on AVX-512 hosts, else 32 bytes)."""
    return vector_lanes(TYPES[spec.dtype][1], attrs)


def blocking(spec: ConvSpec, attrs: str) -> tuple[int, int]:
    """``(CB, U)``: output channels and column vectors per tile of a wide row (``CB * U``
    accumulators: 16 of the 32 AVX-512 registers, 8 of AVX2's 16). 4 x 4 on AVX-512: as
    fast as 8 x 2 on 112-wide rows and 16% faster on 56-wide ones (one tile of 16 + 16 +
    16 + 8 columns per row instead of two), measured one thread, 64 -> 64 channels at
    56 x 56: 107 against 92 GFLOP/s (Zen 4). Narrow rows take :func:`blockings`'s others."""
    u = 4 if "+avx512f" in attrs else 2
    return min(4, max(1, spec.mg)), u


def blockings(spec: ConvSpec, attrs: str) -> list[tuple[int, int, int, int]]:
    """``(most vectors a row may need, CB, U, RB)`` per blocking the body emits, narrowest
    first (0: any row): tiles of ``CB`` channels by ``U`` vectors by ``RB`` output rows.
    Rows of 1 or 2 vectors take tiles of 2 output rows (:data:`NARROW_ROWS`) with the wide
    4 x 4 tile's 16 accumulators (8 channels x 1 vector, 4 x 2; AVX2: 4 x 1 for 4 x 2): a
    tile of 4 channels by 1 vector had 4 chains of FMAs, too few for two FMA pipes, and a
    tap's weights broadcast once serve both rows. Zen 5, one thread: the small cnn's
    32->64 stride-2 conv on 16-column rows 0.074 ms with 4 x 1 tiles, 0.049 with 16 x 1
    (17 loads per 16 FMAs), 0.041 with 8 x 1 x 2 rows (10 loads), 0.042 with 4 x 1 x 4;
    on 32-column rows 4 x 2 x 2 took 0.86-0.90 of 4 x 2's time. An odd last row of an
    item takes the same channels on one row. Picked per conv at run time by the output
    width (at compile time when it is known: only that one is emitted)."""
    cb, u = blocking(spec, attrs)
    vl = lanes(spec, attrs)
    rb, acc = NARROW_ROWS, 4 * u  # the wide tile's accumulators (before M clamps CB)
    found = [  # the wide tile's accumulators, rb rows of k vectors
        (k, min(acc // (k * rb), spec.mg), k, rb) for k in range(1, u) if acc % (k * rb) == 0
    ]
    found.append((0, cb, u, 1))
    if spec.out_width:  # one function: the first that holds the known width
        need = -(-spec.out_width // vl)
        found = [next((0, c, q, r) for k, c, q, r in found if not k or need <= k)]
    return found


def write_body(module: ModuleWriter, name: str, spec: ConvSpec, attrs: str) -> None:
    """Add ``i32 @name(geometry, ptr Z)`` (see :data:`~.conv_spec.BODY_PARAMS`) computing
    ``spec``'s conv directly on the native pool; ``attrs``: the target's function
    attributes."""
    v_lanes = lanes(spec, attrs)
    variants, tiles, narrower = [], _Tiles(module, name, spec, attrs), 0
    for most, cb, u, rb in blockings(spec, attrs):
        rows = []  # per rows a tile (rb, then 1): the full channel block, the remainder
        # the columns a tail takes (a row of one tile or less: its narrowest is above the
        # narrower blocking's widest) or any
        rests = (narrower * v_lanes, most * v_lanes - 1) if most == u else (0, None)
        for r in (rb, 1) if rb > 1 else (1,):
            for c in (cb, spec.mg % cb) if spec.mg % cb else (cb,):
                rows.append(f"{name}.row{c}x{u}x{r}")
                module.add_function(_row_function(rows[-1], tiles, (c, u, r), v_lanes, rests))
        variants.append((most * v_lanes, cb, rb, rows))
        narrower = most
    pad, chunk = f"{name}.pad", f"{name}.chunk"
    if spec.strides[1] == 2:
        odd = spec.kernel[1] > 1 and spec.dilations[1] % 2 == 1  # a tap reads odd columns
        module.add_function(_split_pad_function(module, pad, spec.dtype, attrs, odd))
    else:
        module.add_function(pad_function(module, pad, spec.dtype, attrs))
    module.add_function(_chunk_function(module, chunk, variants, pad, spec, attrs))
    module.declare("geode_num_threads", "declare i64 @geode_num_threads() nounwind")
    module.declare(
        "geode_parallel_for", "declare void @geode_parallel_for(ptr, ptr, i64, i64) nounwind"
    )
    module.add_global("geode.launch", LAUNCH)
    extra = [("ptr noalias", "Z"), ("i64", "POH"), ("i64", "POW")]
    fn = FunctionWriter(name, "i32", [*BODY_PARAMS, *extra])
    fn.linkage = "internal"
    fn.attrs = " " + module.attr_group("nounwind " + attrs)
    b = Builder(fn)
    geo = body_geometry(fn)
    z, poh, pow_ = (fn.param(len(BODY_PARAMS) + i) for i in range(3))
    kw, dw = spec.kernel[1], spec.dilations[1]
    sw = spec.strides[1]
    reach = b.mul(b.ceildiv(geo.ow, v_lanes), str(v_lanes * sw))
    wp = b.add(reach, str((kw - 1) * dw), "Wp")
    if sw == 2:  # two halves (even, odd columns) of equal length
        wp = b.mul(b.ceildiv(wp, 2), "2", "Wp")
    # rows of Y per item (pooled rows when pooling)
    band = band_rows(b, spec, geo.n, poh, wp, geo.ow, geo.threads)
    bands = b.op("sdiv", b.add(poh, b.sub(band, "1")), band, "bands")
    items = b.mul(b.mul(geo.n, str(spec.group)), bands, "items")
    values = [geo.x, geo.w, geo.b, z, geo.y, items, geo.h, geo.wd, geo.oh, geo.ow, geo.pt]
    values += [geo.pl, band, bands, wp, poh, pow_]
    ctx = fn.alloca(f"[{len(_CTX)} x i64]", "ctx", align=8)
    for i, val in enumerate([*values, "0"]):
        slot = b.gep("i64", ctx, str(i), "slot")
        fn.add(f"store {'ptr' if i < 5 else 'i64'} {val}, ptr {slot}")
    macs = b.mul(b.mul(items, b.mul(band, geo.ow)), str(spec.mg * spec.depth), "work")
    if spec.pool:
        module.add_function(_pool_function(module, f"{name}.maxpool", spec, attrs, v_lanes))
    small = b.cmp("slt", macs, str(1 << 17), "small")
    launch_and_return(b, chunk, ctx, len(_CTX), items, geo.threads, small, spec)
    module.add_function(fn)


def _launch_threads(b: Builder, threads: str) -> str:
    """The threads a launch runs on: ``threads``, or the native pool's size when 0."""
    pool = b.fn.value("call i64 @geode_num_threads()", "pool")
    return b.select(b.cmp("sgt", threads, "0"), threads, pool, "threads")


def row_step(spec: ConvSpec) -> int:
    """Scratch rows from one output row's window to the next: the vertical stride, or
    the window's height when the stride is larger (a 1x1 stride-2 conv never reads the
    odd input rows: each output row's window rows are copied alone, without those
    between)."""
    sh, span = spec.strides[0], (spec.kernel[0] - 1) * spec.dilations[0] + 1
    return min(sh, span)


def band_rows(b: Builder, spec: ConvSpec, n: str, oh: str, wp: str, ow: str, threads: str) -> str:
    """Output rows per item: as many as keep at least :data:`ITEMS_PER_THREAD` items per
    thread in all (when the output has that many rows; on one thread, ``threads`` 1 or the
    pool's size when 0, one band per image and group) and the band's input rows (and,
    pooling, its conv rows: ``ow`` wide) within :data:`BAND_BUDGET_BYTES` (at least one
    row). On one thread fewer bands copy fewer shared input rows (and pooling, recompute
    fewer conv rows): the 1x3x64x64 cnn ran 2.5-3% faster than with 8 items."""
    item = TYPES[spec.dtype][1]
    images = b.max(b.mul(n, str(spec.group)), "1", "images")
    pool = _launch_threads(b, threads)
    wanted = b.select(b.cmp("sgt", pool, "1"), b.mul(pool, str(ITEMS_PER_THREAD)), "1", "wanted")
    want = b.max(b.op("sdiv", b.add(b.sub(wanted, "1"), images), images), "1", "want")
    band = b.op("sdiv", b.add(oh, b.sub(want, "1")), want, "band")
    conv_rows = spec.pool[2] if spec.pool else 1  # conv rows per row of Y
    row_bytes = b.mul(wp, str(spec.cg * item * row_step(spec) * conv_rows), "rowbytes")
    if spec.pool:
        row_bytes = b.add(row_bytes, b.mul(ow, str(spec.mg * item * conv_rows)), "rowbytes")
    fit = b.max(b.op("sdiv", str(BAND_BUDGET_BYTES), row_bytes), "1", "fit")
    return b.max(b.min(band, fit), "1", "band")


def _chunk_function(
    module: ModuleWriter,
    name: str,
    variants: list[tuple[int, int, int, list[str]]],
    pad: str,
    spec: ConvSpec,
    attrs: str,
) -> FunctionWriter:
    """``void @name(ptr ctx, i64 chunk, i64 nchunks)``: this chunk's items (see the
    module docstring; ``variants``: per blocking of :func:`blockings`, the widest output
    row it takes (0: any), its channels per tile and its row functions)."""
    ty, item = TYPES[spec.dtype]
    (kh, _), (sh, _), (dh, _) = spec.kernel, spec.strides, spec.dilations
    c = chunk_start(module, name, attrs, _CTX, 5)
    fn, b, v = c.fn, c.b, c.v
    module.declare("malloc", "declare noalias ptr @malloc(i64) nounwind")
    module.declare("free", "declare void @free(ptr) nounwind")
    pkh, psh = (spec.pool[0], spec.pool[2]) if spec.pool else (1, 1)
    crows_max = b.add(b.mul(b.sub(v["band"], "1"), str(psh)), str(pkh), "crows")  # conv rows
    step, span = row_step(spec), (kh - 1) * dh + 1
    rin_max = b.add(b.mul(b.sub(crows_max, "1"), str(step)), str(span), "rin")
    plane = b.mul(rin_max, v["Wp"], "plane")
    in_elems = b.mul(plane, str(spec.cg), "in_elems")
    cplane = b.mul(crows_max, v["OW"], "cplane") if spec.pool else "0"
    slack = (
        sum(spec.pool[4:]) + spec.pool[1] + spec.pool[3] * lanes(spec, attrs) if spec.pool else 0
    )
    tw = b.add(v["OW"], str(slack), "tw") if spec.pool else "0"
    tmp_elems = b.mul(tw, v["band"], "tmp_elems")  # a row-reduced row per pooled row
    elems = b.add(b.add(in_elems, b.mul(cplane, str(spec.mg))), tmp_elems, "elems")
    buf = fn.value(f"call noalias ptr @malloc(i64 {b.mul(elems, str(item))})", "buf")
    conv_buf = b.gep(ty, buf, in_elems, "convbuf")
    tmp = b.gep(ty, conv_buf, b.mul(cplane, str(spec.mg)), "tmp")
    nomem = b.all_of([b.cmp("slt", c.lo, c.hi), fn.value(f"icmp eq ptr {buf}, null")])

    def fail() -> None:
        fn.add(f"store atomic i64 1, ptr {v['failed']} monotonic, align 8")
        fn.terminate("ret void")
        fn.start_block(fn.label("unreachable"))

    b.when(nomem, fail, "nomem")
    hw = b.mul(v["H"], v["Wd"], "HW")
    pp = b.mul(v["POH"], v["POW"], "PP")

    def one(q: str) -> None:
        img = b.op("udiv", q, v["bands"], "img")  # n * group + g
        r0 = b.mul(b.op("urem", q, v["bands"]), v["band"], "r0")  # first row of Y
        yrows = b.min(v["band"], b.sub(v["POH"], r0), "yrows")
        if spec.pool:  # the conv rows the pooled rows' windows reach, within the output
            ppt = spec.pool[4]
            first = b.max(b.sub(b.mul(r0, str(psh)), str(ppt)), "0", "cfirst")
            last = b.add(b.mul(b.add(r0, b.sub(yrows, "1")), str(psh)), str(pkh - ppt))
            oh0 = b.min(first, v["OH"], "oh0")
            nrows = b.max(b.sub(b.min(last, v["OH"]), oh0), "0", "nrows")
        else:
            oh0, nrows = r0, yrows
        rin = b.add(b.mul(b.sub(nrows, "1"), str(step)), str(span), "rin")
        g = b.op("urem", img, str(spec.group), "g")
        n = b.op("udiv", img, str(spec.group), "n")
        top = b.sub(v["pt"], b.mul(oh0, str(sh)), "top")  # the band's first input row: -top
        x0 = b.gep(ty, v["X"], b.mul(b.mul(img, str(spec.cg)), hw), "x0")

        def copy(ci: str) -> None:
            xc = b.gep(ty, x0, b.mul(ci, hw), "xc")
            dst = b.gep(ty, buf, b.mul(ci, plane), "dst")
            if step == sh:  # the band's rows, all read
                fn.add(
                    f"call void @{pad}(ptr {xc}, ptr {dst}, i64 {v['H']}, i64 {v['Wd']}, "
                    f"i64 {rin}, i64 {v['Wp']}, i64 {top}, i64 {v['pl']})"
                )
                return

            def window(r: str) -> None:  # only the rows output row r's windows read
                into = b.gep(ty, dst, b.mul(b.mul(r, str(step)), v["Wp"]), "wrows")
                fn.add(
                    f"call void @{pad}(ptr {xc}, ptr {into}, i64 {v['H']}, i64 {v['Wd']}, "
                    f"i64 {span}, i64 {v['Wp']}, i64 {b.sub(top, b.mul(r, str(sh)))}, "
                    f"i64 {v['pl']})"
                )

            b.loop("0", nrows, window, "wr")

        b.when(b.cmp("sgt", nrows, "0"), lambda: b.loop("0", str(spec.cg), copy, "ci"), "any")
        m0 = b.mul(g, str(spec.mg), "m0")
        _conv_rows(b, spec, v, variants, (buf, plane, conv_buf, cplane), (n, m0, oh0, nrows))
        if spec.pool:

            def pool_channel(m: str) -> None:
                src = b.gep(ty, conv_buf, b.mul(m, cplane), "csrc")
                yc = b.add(b.mul(n, str(spec.out_channels)), b.add(m0, m), "yc")
                y = b.gep(ty, v["Y"], b.add(b.mul(yc, pp), b.mul(r0, v["POW"])), "ypool")
                fn.add(
                    f"call void @{name[: -len('.chunk')]}.maxpool(ptr {src}, i64 {nrows}, "
                    f"i64 {oh0}, i64 {v['OW']}, ptr {y}, i64 {v['POW']}, i64 {r0}, "
                    f"i64 {yrows}, ptr {tmp}, i64 {tw}, i64 {m})"
                )

            b.loop("0", str(spec.mg), pool_channel, "pm")

    b.loop(c.lo, c.hi, one, "q")
    fn.add(f"call void @free(ptr {buf})")
    fn.terminate("ret void")
    return fn


def _conv_rows(
    b: Builder,
    spec: ConvSpec,
    v: dict[str, str],
    variants: list[tuple[int, int, int, list[str]]],
    bufs: tuple[str, str, str, str],
    at: tuple[str, str, str, str],
) -> None:
    """The conv rows ``[oh0, oh0 + nrows)`` of image ``n``, channels ``m0 ...`` of the
    group, from the padded band (``bufs``: band, its plane size, the conv scratch and
    its plane size): into Y, or into the conv scratch when pooling; by the first of
    ``variants`` whose widest row holds ``OW``."""
    ty, _ = TYPES[spec.dtype]
    fn = b.fn
    buf, plane, conv_buf, cplane = bufs
    n, m0, oh0, nrows = at
    step, khw = row_step(spec), spec.kernel[0] * spec.kernel[1]
    p = b.mul(v["OH"], v["OW"], "P")

    def block(r: str, m: str, row_fn: str) -> None:
        src = b.gep(ty, buf, b.mul(b.mul(r, str(step)), v["Wp"]), "src")
        ch = b.add(m0, m, "ch")
        if spec.pool:
            y = b.gep(ty, conv_buf, b.add(b.mul(m, cplane), b.mul(r, v["OW"])), "y")
            z, stride = "null", cplane
        else:
            yoff = b.add(
                b.mul(b.add(b.mul(n, str(spec.out_channels)), ch), p),
                b.mul(b.add(oh0, r, "orow"), v["OW"]),
                "yoff",
            )
            y = b.gep(ty, v["Y"], yoff, "y")
            z = b.gep(ty, v["Z"], yoff, "z") if spec.residual else "null"
            stride = p
        w = b.gep(ty, v["W"], b.mul(ch, str(spec.cg * khw)), "w")
        bias = b.gep(ty, v["B"], ch, "bias") if spec.bias else "null"
        fn.add(
            f"call void @{row_fn}(ptr {src}, i64 {v['Wp']}, i64 {plane}, ptr {w}, "
            f"ptr {bias}, ptr {z}, ptr {y}, i64 {v['OW']}, i64 {stride})"
        )

    def blocks(cb: int, rb: int, rows: list[str]) -> None:
        full = spec.mg - spec.mg % cb
        fns = len(rows) // (2 if rb > 1 else 1)  # row functions per rows a tile

        def out_rows(r: str, fns_at: int) -> None:
            if full:
                b.loop("0", str(full), lambda m: block(r, m, rows[fns_at]), "mb", step=str(cb))
            if spec.mg % cb:
                block(r, str(full), rows[fns_at + 1])

        paired = b.mul(b.op("sdiv", nrows, str(rb)), str(rb), "paired") if rb > 1 else "0"
        if rb > 1:  # rb rows a tile, then the rest one by one
            b.loop("0", paired, lambda r: out_rows(r, 0), "rr", step=str(rb))
        b.loop(paired, nrows, lambda r: out_rows(r, fns if rb > 1 else 0), "r")

    def pick(k: int) -> None:
        most, cb, rb, rows = variants[k]
        if not most:
            return blocks(cb, rb, rows)
        narrow = b.cmp("sle", v["OW"], str(most), "narrow")
        b.branch(narrow, lambda: blocks(cb, rb, rows), lambda: pick(k + 1), "width")

    pick(0)


def _split_pad_function(
    module: ModuleWriter, name: str, dtype: str, attrs: str, odd: bool = True
) -> FunctionWriter:
    """``void @name(ptr x, ptr buf, i64 H, i64 Wd, i64 Hp, i64 Wp, i64 pt, i64 pl)``: as
    ``conv_depthwise.pad_function`` (the plane ``x`` into the zero-bordered ``Hp x Wp``
    scratch, ``pt`` rows and ``pl`` columns in), each scratch row stored as its even
    columns, then its odd ones (``Wp`` even): a stride-2 conv's tap reads ``V``
    consecutive elements of one half. ``V`` columns of each half at a time: one masked
    load of the ``2V`` input columns they come from (zeros outside the row), its even and
    its odd lanes stored, masked to the half's length, and the same input columns
    :data:`~.conv_depthwise.PREFETCH_ROWS` rows down prefetched. Without ``odd`` (no tap reads an odd
    column: a 1x1 window) the odd half is left unwritten."""
    ty, size = TYPES[dtype]
    fn, b, (x, buf, h, wd, hp, wp, pt, pl) = pad_writer(module, name, attrs)
    vl = vector_lanes(size, attrs)
    span = span_writer(module, fn, b, ty, vl, 0.0)
    wide, vty, bits = f"<{2 * vl} x {ty}>", f"<{vl} x {ty}>", 8 * size
    for lanes in (vl, 2 * vl):
        t = f"<{lanes} x {ty}>"
        sfx = f"v{lanes}f{bits}"
        module.declare(
            f"llvm.masked.load.{sfx}.p0",
            f"declare {t} @llvm.masked.load.{sfx}.p0(ptr, i32, <{lanes} x i1>, {t})",
        )
        module.declare(
            f"llvm.masked.store.{sfx}.p0",
            f"declare void @llvm.masked.store.{sfx}.p0({t}, ptr, i32, <{lanes} x i1>)",
        )
    half = b.op("sdiv", wp, "2", "half")
    ahead = PREFETCH_ROWS
    module.declare("llvm.prefetch.p0", "declare void @llvm.prefetch.p0(ptr, i32, i32, i32)")

    def ids(n: int) -> str:
        return "<" + ", ".join(f"i32 {q}" for q in range(n)) + ">"

    def splat32(v: str, n: int, hint: str) -> str:
        """The i64 ``v`` (within i32) in every one of ``n`` i32 lanes."""
        v32 = fn.value(f"trunc i64 {v} to i32", hint)
        one = fn.value(f"insertelement <{n} x i32> poison, i32 {v32}, i64 0", hint)
        return fn.value(
            f"shufflevector <{n} x i32> {one}, <{n} x i32> poison, <{n} x i32> zeroinitializer",
            hint,
        )

    def clamp(v: str) -> str:
        return b.min(b.max(v, "0"), str(2 * vl))

    def row(r: str) -> None:
        ih, dst, inside = scratch_row(b, ty, buf, r, (pt, wp, h))

        def copy() -> None:
            xrow = b.gep(ty, x, b.mul(ih, wd), "xrow")

            def chunk(c: str) -> None:
                start = b.sub(b.mul(c, "2"), pl, "start")  # the chunk's first input column
                lo = splat32(clamp(b.sub("0", start)), 2 * vl, "lo")
                hi = splat32(clamp(b.sub(wd, start)), 2 * vl, "hi")
                mask = fn.value(
                    f"and <{2 * vl} x i1> "
                    f"{fn.value(f'icmp sge <{2 * vl} x i32> {ids(2 * vl)}, {lo}', 'ge')}, "
                    f"{fn.value(f'icmp slt <{2 * vl} x i32> {ids(2 * vl)}, {hi}', 'lt')}",
                    "inmask",
                )
                # not inbounds: the chunk may start before the row (those lanes are masked)
                src = fn.value(f"getelementptr {ty}, ptr {xrow}, i64 {start}", "src")
                if ahead:  # the same columns PREFETCH_ROWS rows down (it never faults)
                    for off in (0, vl):
                        at = b.add(b.mul(wd, str(ahead)), str(off))
                        pf = fn.value(
                            f"getelementptr i8, ptr {src}, i64 {b.mul(at, str(size))}", "pf"
                        )
                        fn.add(f"call void @llvm.prefetch.p0(ptr {pf}, i32 0, i32 3, i32 1)")
                both = fn.value(
                    f"call {wide} @llvm.masked.load.v{2 * vl}f{bits}.p0(ptr {src}, i32 {size}, "
                    f"<{2 * vl} x i1> {mask}, {wide} zeroinitializer)",
                    "both",
                )
                left = splat32(b.min(b.sub(half, c), str(vl)), vl, "left")
                out = fn.value(f"icmp slt <{vl} x i32> {ids(vl)}, {left}", "outmask")
                for half_at in (0, 1) if odd else (0,):
                    pick = ", ".join(f"i32 {2 * q + half_at}" for q in range(vl))
                    val = fn.value(
                        f"shufflevector {wide} {both}, {wide} poison, <{vl} x i32> <{pick}>"
                    )
                    at = b.gep(ty, dst, b.add(b.mul(str(half_at), half), c), "into")
                    fn.add(
                        f"call void @llvm.masked.store.v{vl}f{bits}.p0({vty} {val}, ptr {at}, "
                        f"i32 {size}, <{vl} x i1> {out})"
                    )

            b.loop("0", half, chunk, "c2", step=str(vl))

        b.branch(inside, copy, lambda: span(dst, None, wp), "inside")

    b.loop("0", hp, row, "r")
    fn.terminate("ret void")
    return fn


def _pool_function(
    module: ModuleWriter, name: str, spec: ConvSpec, attrs: str, vl: int
) -> FunctionWriter:
    """``void @name(ptr src, i64 crows, i64 c0, i64 OW, ptr y, i64 POW, i64 r0, i64 yrows,
    ptr tmp, i64 tw, i64 m)``: pooled rows ``[r0, r0 + yrows)`` of one channel from its conv
    rows ``[c0, c0 + crows)`` at ``src``: first, per pooled row, the window's rows reduced
    in one pass into its ``-inf``-bordered row of ``tmp`` (``yrows`` rows of ``tw``: ``pool
    stride * vl`` elements past the last window), then per pooled row the window's columns
    (:func:`nan_max`: NaN propagates, as MaxPool's), ``vl`` pooled columns at a time
    (:func:`_window_columns`) and the rest one by one; ``tmp``'s borders are written for
    the item's first channel (``m`` 0) and kept for the others. Two passes, not one per row: the
    column pass's loads straddle the row pass's vector stores, and read right after them
    they waited for the stores to retire (store forwarding fails): 31% of the small stem's
    samples, the conv's tiles 48% (Zen 5)."""
    ty, _ = TYPES[spec.dtype]
    pkh, pkw, psh, psw, ppt, ppl = spec.pool[:6]
    names = ("src", "crows", "c0", "OW", "y", "POW", "r0", "yrows", "tmp", "tw", "m")
    kinds = ("ptr noalias", "i64", "i64", "i64", "ptr noalias", "i64", "i64", "i64")
    params = list(zip((*kinds, "ptr noalias", "i64", "i64"), names))
    fn = FunctionWriter(name, "void", params)
    fn.linkage = "internal"
    fn.attrs = " " + module.attr_group("nounwind noinline " + attrs)
    b = Builder(fn)
    src, crows, c0, ow, y, pow_, r0, yrows, tmp, tw, m = (fn.param(i) for i in range(len(names)))
    ninf = float_literal(float("-inf"), ty)

    def fill(row: str, lo: str, hi: str) -> None:
        b.loop(lo, hi, lambda i: fn.add(f"store {ty} {ninf}, ptr {b.gep(ty, row, i)}"), "fill")

    def borders(pr: str) -> None:
        trow = b.gep(ty, tmp, b.mul(pr, tw), "trow")
        fill(trow, "0", str(ppl))
        fill(trow, b.add(ow, str(ppl)), tw)

    # the borders, the same for every channel of the item, are written for its first
    b.when(b.cmp("eq", m, "0"), lambda: b.loop("0", yrows, borders, "br"), "first")

    def reduced_row(pr: str) -> None:
        trow = b.gep(ty, tmp, b.mul(pr, tw), "trow")
        mid = b.gep(ty, trow, str(ppl), "mid")
        wl = b.sub(b.mul(b.add(r0, pr), str(psh)), str(ppt), "wl")
        lo = b.max(wl, c0, "lo")
        hi = b.min(b.add(wl, str(pkh)), b.add(c0, crows), "hi")
        # the window's rows within the conv rows, each read once per column (rows past
        # the edge repeat an inside one: the max is the same); none inside: -inf
        rows = [b.max(lo, b.min(b.add(wl, str(i)), b.sub(hi, "1")), "ri") for i in range(pkh)]
        ptrs = [b.gep(ty, src, b.mul(b.sub(r, c0), ow), "prow") for r in rows]

        def col(i: str) -> None:
            acc = nan_max(fn, ty, 1, [b.load(ty, b.gep(ty, q, i), "c") for q in ptrs])
            fn.add(f"store {ty} {acc}, ptr {b.gep(ty, mid, i)}")

        def empty() -> None:
            b.loop("0", ow, lambda i: fn.add(f"store {ty} {ninf}, ptr {b.gep(ty, mid, i)}"), "e")

        b.branch(b.cmp("slt", lo, hi), lambda: b.loop("0", ow, col, "vc"), empty, "rows")

    def pooled_row(pr: str) -> None:
        trow = b.gep(ty, tmp, b.mul(pr, tw), "trow")
        yrow = b.gep(ty, y, b.mul(pr, pow_), "yrow")

        def out(pw: str) -> None:
            base = b.gep(ty, trow, b.mul(pw, str(psw)), "win")
            acc = nan_max(fn, ty, 1, [b.load(ty, b.gep(ty, base, str(j)), "t") for j in range(pkw)])
            fn.add(f"store {ty} {acc}, ptr {b.gep(ty, yrow, pw)}")

        nvec = b.mul(b.op("sdiv", pow_, str(vl)), str(vl), "nvec")
        if psw <= 2:
            columns = _window_columns(fn, ty, (pkw, psw), vl)
            b.loop("0", nvec, lambda pw: columns(trow, yrow, pw), "pv", step=str(vl))
        else:
            nvec = "0"
        b.loop(nvec, pow_, out, "pw")

    b.loop("0", yrows, reduced_row, "rr")
    b.loop("0", yrows, pooled_row, "pr")
    fn.terminate("ret void")
    return fn


def _window_columns(
    fn: FunctionWriter, ty: str, window: tuple[int, int], vl: int
) -> Callable[[str, str, str], None]:
    """``columns(tmp, yrow, pw)``: pooled columns ``[pw, pw + vl)`` of a row from the
    row-reduced ``tmp`` as vectors (``window``: the pool's columns and stride, at most 2):
    per window column ``j`` one load of ``stride * vl`` elements from ``stride * pw + j``,
    its every ``stride``-th lane kept, reduced with :func:`nan_max`."""
    pkw, psw = window
    wide = f"<{psw * vl} x {ty}>"
    lanes = ", ".join(f"i32 {psw * q}" for q in range(vl))

    def columns(tmp: str, yrow: str, pw: str) -> None:
        b = Builder(fn)
        start = b.mul(pw, str(psw), "wstart")
        vals = []
        for j in range(pkw):
            at = b.gep(ty, tmp, b.add(start, str(j)), "wcol")
            val = fn.value(f"load {wide}, ptr {at}, align 4", "wide")
            if psw > 1:
                val = fn.value(f"shufflevector {wide} {val}, {wide} poison, <{vl} x i32> <{lanes}>")
            vals.append(val)
        acc = nan_max(fn, ty, vl, vals)
        fn.add(f"store <{vl} x {ty}> {acc}, ptr {b.gep(ty, yrow, pw, 'ydst')}, align 4")

    return columns


def nan_max(fn: FunctionWriter, ty: str, lanes: int, vals: list[str]) -> str:
    """The largest of ``vals`` (of ``ty``, or vectors of ``lanes`` of it), NaN when any is
    NaN, as ``llvm.maximum`` (the sign of a zero aside) in fewer instructions: a chain of
    compare-and-selects (one ``vmaxps`` each), one unordered compare per pair of values,
    one select of NaN at the end."""
    vty = ty if lanes == 1 else f"<{lanes} x {ty}>"
    mty = "i1" if lanes == 1 else f"<{lanes} x i1>"
    acc = vals[0]
    for v in vals[1:]:
        gt = fn.value(f"fcmp ogt {vty} {acc}, {v}", "gt")
        acc = fn.value(f"select {mty} {gt}, {vty} {acc}, {vty} {v}", "mx")
    pairs = [(vals[i], vals[min(i + 1, len(vals) - 1)]) for i in range(0, len(vals), 2)]
    flags = [fn.value(f"fcmp uno {vty} {a}, {c}", "isnan") for a, c in pairs]
    anynan = flags[0]
    for f in flags[1:]:
        anynan = fn.value(f"or {mty} {anynan}, {f}", "anynan")
    nan = float_literal(float("nan"), ty)
    if lanes > 1:
        nan = "<" + ", ".join([f"{ty} {nan}"] * lanes) + ">"
    return fn.value(f"select {mty} {anynan}, {vty} {nan}, {vty} {acc}", "nanmax")


class _Tiles:
    """The tile functions of one body (:func:`_tile_function`), each written once however
    many row functions call it: ``tiles(cb, rb, widths)`` is its name."""

    def __init__(self, module: ModuleWriter, name: str, spec: ConvSpec, attrs: str):
        self.module, self.name, self.spec, self.attrs = module, name, spec, attrs
        self.made: set[str] = set()

    def __call__(self, cb: int, rb: int, widths: tuple[int, ...]) -> str:
        tile = f"{self.name}.tile{cb}x{rb}.{'_'.join(map(str, widths))}"
        if tile not in self.made:
            self.made.add(tile)
            fn = _tile_function(self.module, tile, self.spec, self.attrs, (cb, rb), widths)
            self.module.add_function(fn)
        return tile


def _row_function(
    name: str,
    tile_fns: _Tiles,
    shape: tuple[int, int, int],
    vl: int,
    rests: tuple[int, int | None],
) -> FunctionWriter:
    """``void @name(ptr src, i64 Wp, i64 plane, ptr w, ptr bias, ptr z, ptr y, i64 OW,
    i64 P)``: one output row of ``cb`` channels (``P`` apart in Y and Z) from the scratch
    rows at ``src`` (planes ``plane`` apart, rows ``Wp`` apart), tile by tile: full tiles
    of ``u`` vectors, then a tail tile of as many whole vectors as the rest needs, the last
    one's store masked (a half-wide last vector was as fast on Zen 5, where a half-wide
    FMA takes a whole pipe, and doubled the tail functions and LLVM's time).
    ``shape``: the tiles' channels, vectors and output rows (``rb`` rows ``OW`` apart in Y
    and Z, ``row_step`` scratch rows apart). ``rests``: the columns left after the full
    tiles that reach a tail, above the first and at most the second (None: any); tails
    no row in that range takes are not written (a row of 17 to 32 columns on 2-vector
    tiles never takes a 1-vector tail)."""
    cb, u, rb = shape
    module = tile_fns.module
    lo_rest, hi_rest = rests
    shapes = [(vl,) * k for k in range(1, u + 1)]
    bounds = [(sum(shapes[i - 1]) if i else 0, sum(w)) for i, w in enumerate(shapes)]
    reached = [
        (w, lo) for w, (lo, hi) in zip(shapes, bounds)
        if hi > lo_rest and (hi_rest is None or lo < hi_rest)
    ]  # fmt: skip
    tiles = {w: tile_fns(cb, rb, w) for w, _ in reached}
    tiles[(vl,) * u] = tile_fns(cb, rb, (vl,) * u)
    attrs = tile_fns.attrs
    names = ("src", "Wp", "plane", "w", "bias", "z", "y", "OW", "P")
    kinds = ("ptr noalias", "i64", "i64", "ptr noalias", "ptr noalias", "ptr noalias")
    params = list(zip((*kinds, "ptr noalias", "i64", "i64"), names))
    fn = FunctionWriter(name, "void", params)
    fn.linkage = "internal"
    fn.attrs = " " + module.attr_group("nounwind noinline " + attrs)
    b = Builder(fn)
    src, wp, plane, w, bias, z, y, ow, p = (fn.param(i) for i in range(len(names)))
    width = u * vl
    nfull = b.mul(b.op("sdiv", ow, str(width)), str(width), "nfull")
    args = f"ptr {src}, i64 {wp}, i64 {plane}, ptr {w}, ptr {bias}, ptr {z}, ptr {y}, i64 {p}"
    args += f", i64 {ow}"
    full = tiles[(vl,) * u]

    def tile(t: str) -> None:
        fn.add(f"call void @{full}({args}, i64 {t}, i64 {width})")

    b.loop("0", nfull, tile, "t", step=str(width), meta=Builder.no_unroll(module))
    rest = b.sub(ow, nfull, "rest")
    for widths, lo in reached:  # the tail: the narrowest tile that holds the rest
        hi = sum(widths)
        cond = b.all_of([b.cmp("sgt", rest, str(lo)), b.cmp("sle", rest, str(hi))])
        call = f"call void @{tiles[widths]}({args}, i64 {nfull}, i64 {rest})"
        b.when(cond, lambda call=call: fn.add(call), "tail")
    fn.terminate("ret void")
    return fn


def _vector_ops(module: ModuleWriter, ty: str, lanes: int) -> tuple[str, str]:
    """``(vector type, intrinsic suffix)`` of ``lanes`` x ``ty``, its FMA and masked
    load and store declared."""
    vty, suffix = f"<{lanes} x {ty}>", f"v{lanes}f{32 if ty == 'float' else 64}"
    module.declare(f"llvm.fma.{suffix}", f"declare {vty} @llvm.fma.{suffix}({vty}, {vty}, {vty})")
    module.declare(
        f"llvm.masked.store.{suffix}.p0",
        f"declare void @llvm.masked.store.{suffix}.p0({vty}, ptr, i32, <{lanes} x i1>)",
    )
    module.declare(
        f"llvm.masked.load.{suffix}.p0",
        f"declare {vty} @llvm.masked.load.{suffix}.p0(ptr, i32, <{lanes} x i1>, {vty})",
    )
    return vty, suffix


def _tile_function(
    module: ModuleWriter,
    name: str,
    spec: ConvSpec,
    attrs: str,
    block: tuple[int, int],
    widths: tuple[int, ...],
) -> FunctionWriter:
    """``void @name(row args, i64 OW, i64 t, i64 valid)``: the tile of ``cb`` channels by
    ``rb`` output rows (``block``; ``OW`` apart in Y and Z, :func:`row_step` scratch rows
    apart) by vectors of ``widths`` lanes at column ``t`` of the row, ``valid`` of its
    columns stored. A tap's ``cb`` weights are broadcast once for its ``rb`` rows."""
    cb, rb = block
    ty, _ = TYPES[spec.dtype]
    ops = [_vector_ops(module, ty, lanes) for lanes in widths]
    offs = [sum(widths[:k]) for k in range(len(widths))]
    names = ("src", "Wp", "plane", "w", "bias", "z", "y", "P", "OW", "t", "valid")
    kinds = ("ptr noalias", "i64", "i64", "ptr noalias", "ptr noalias", "ptr noalias")
    params = list(zip((*kinds, "ptr noalias", "i64", "i64", "i64", "i64"), names))
    fn = FunctionWriter(name, "void", params)
    fn.linkage = "internal"
    fn.attrs = " " + module.attr_group("nounwind " + attrs)
    b = Builder(fn)
    src, wp, plane, w, bias, z, y, p, ow, t, valid = (fn.param(i) for i in range(len(names)))
    (kh, kw), (dh, dw) = spec.kernel, spec.dilations
    khw, slots, step = kh * kw, range(len(widths)), row_step(spec)
    accs = [
        [[fn.alloca(ops[k][0], f"acc{q}_{m}_{k}") for k in slots] for m in range(cb)]
        for q in range(rb)
    ]
    for k, a in ((k, a) for rows in accs for row in rows for k, a in zip(slots, row)):
        fn.add(f"store {ops[k][0]} zeroinitializer, ptr {a}")
    base = b.gep(ty, src, t, "base")
    half = b.op("sdiv", wp, "2", "half")  # stride 2: where a row's odd columns start

    def column(j: int) -> str:
        """Where tap column ``j``'s input starts in a scratch row, from the tile's first
        column: ``j * dw`` (stride 1), or that column's half and place (stride 2)."""
        if spec.strides[1] == 1:
            return str(j * dw)
        odd, at = (j * dw) % 2, (j * dw) // 2
        return b.add(b.mul(str(odd), half), str(at), "col") if odd else str(at)

    def taps(xc: str, wc: str, i: str) -> None:
        """The ``kw`` taps of window row ``i`` (a constant or a loop's counter)."""
        xi = b.gep(ty, xc, b.mul(b.mul(i, str(dh)), wp), "xi")
        wi = b.gep(ty, wc, b.mul(i, str(kw)), "wi")
        vals = [[[fn.value(f"load {ops[k][0]}, ptr {a}", "a") for k, a in zip(slots, r)]
                 for r in rows] for rows in accs]  # fmt: skip
        for j in range(kw):
            xs = []
            for q in range(rb):
                xr = b.gep(ty, xi, b.mul(str(q * step), wp), "xr")
                col = b.gep(ty, xr, column(j), "xcol")
                xs.append(
                    [
                        fn.value(
                            f"load {ops[k][0]}, ptr {b.gep(ty, col, str(offs[k]))}, align 4", "x"
                        )
                        for k in slots
                    ]
                )
            for m in range(cb):
                wv = b.load(ty, b.gep(ty, wi, str(m * spec.cg * khw + j)), "wt")
                splats = {n: _splat(fn, ty, wv, n) for n in sorted(set(widths))}
                for q, k in ((q, k) for q in range(rb) for k in slots):
                    vty, suffix = ops[k]
                    vals[q][m][k] = fn.value(
                        f"call {vty} @llvm.fma.{suffix}({vty} {splats[widths[k]]}, "
                        f"{vty} {xs[q][k]}, {vty} {vals[q][m][k]})",
                        "acc",
                    )
        for rows, vrows in zip(accs, vals):
            for row, vrow in zip(rows, vrows):
                for k, a, val in zip(slots, row, vrow):
                    fn.add(f"store {ops[k][0]} {val}, ptr {a}")

    def channel(ci: str) -> None:
        xc = b.gep(ty, base, b.mul(ci, plane), "xc")
        wc = b.gep(ty, w, b.mul(ci, str(khw)), "wc")
        if kh > 1:  # the window's rows a loop, not unrolled: one row's taps written once
            # (a third of a 3x3 body's IR; as fast on Zen 5)
            b.loop("0", str(kh), lambda i: taps(xc, wc, i), "ki", meta=Builder.no_unroll(module))
        else:
            for i in range(kh):
                taps(xc, wc, str(i))

    def row_at(q: int) -> tuple[str, str]:
        """Y and Z (null without a residual) moved down to the tile's row ``q``."""
        if not q:
            return y, z
        at = b.mul(ow, str(q), "rowoff")
        return b.gep(ty, y, at, "yq"), b.gep(ty, z, at, "zq") if spec.residual else z

    for q in range(rb):
        _prefetch_tile(module, b, spec, cb, offs, (row_at(q)[1], row_at(q)[0], p, t))
    b.loop("0", str(spec.cg), channel, "ci", meta=Builder.no_unroll(module))

    def epilogue(which: list[int], masked: bool) -> None:
        for q, k in ((q, k) for q in range(rb) for k in which):
            yq, zq = row_at(q)
            at = (bias, zq, yq, p, t, valid)
            _store_slot(b, spec, (widths[k], offs[k]), [r[k] for r in accs[q]], at, masked)

    # ``valid`` is above the columns of all vectors but the last (a tail tile takes more
    # than the next narrower tile holds: :func:`_row_function`): they store plain; the
    # last stores without lane masks when whole (masked 512-bit stores were 20% of the
    # small stem's tile samples)
    epilogue(list(slots)[:-1], False)
    whole = b.cmp("sge", valid, str(sum(widths)), "whole")
    last = [len(widths) - 1]
    b.branch(whole, lambda: epilogue(last, False), lambda: epilogue(last, True), "store")
    fn.terminate("ret void")
    return fn


def _prefetch_tile(
    module: ModuleWriter,
    b: Builder,
    spec: ConvSpec,
    cb: int,
    offs: list[int],
    at: tuple[str, str, str, str],
) -> None:
    """Prefetch the lines the tile's epilogue reads (``Z``, with a residual) and writes
    (``Y``, for writing) before its taps run (``at``: ``z, y, P, t``; ``offs``: its
    vectors' first columns): the tile's ``cb`` channels are ``cb`` rows of planes apart,
    more streams than the hardware prefetcher follows, and the taps' FMAs take far longer
    than the memory. 8x32x112x112, one thread: the residual 32->32 conv 19.4 -> 18.4 ms,
    the cnn 75.9 -> 73.3-74.1 ms (``docs/performance.md``)."""
    fn = b.fn
    ty, _ = TYPES[spec.dtype]
    z, y, p, t = at
    module.declare("llvm.prefetch.p0", "declare void @llvm.prefetch.p0(ptr, i32, i32, i32)")
    for m in range(cb):
        for off0 in offs:
            off = b.add(b.mul(str(m), p), b.add(t, str(off0)), "pfo")
            if spec.residual:
                pz = b.gep(ty, z, off, "pz")
                fn.add(f"call void @llvm.prefetch.p0(ptr {pz}, i32 0, i32 3, i32 1)")
            py = b.gep(ty, y, off, "py")
            fn.add(f"call void @llvm.prefetch.p0(ptr {py}, i32 1, i32 3, i32 1)")


def _splat(fn: FunctionWriter, ty: str, s: str, lanes: int) -> str:
    """``s`` in every one of ``lanes`` lanes."""
    one = fn.value(f"insertelement <1 x {ty}> poison, {ty} {s}, i64 0", "one")
    return fn.value(
        f"shufflevector <1 x {ty}> {one}, <1 x {ty}> poison, <{lanes} x i32> zeroinitializer",
        "splat",
    )


def _store_slot(
    b: Builder,
    spec: ConvSpec,
    slot: tuple[int, int],
    accs: list[str],
    at: tuple[str, ...],
    masked: bool = True,
) -> None:
    """The epilogue of one vector slot (``slot``: its lanes and first column in the tile)
    of a tile's ``cb`` channels (``accs``: their accumulators): bias, residual,
    activation, the store of the columns below ``valid`` (``masked``; else all of them,
    plain loads and stores)."""
    fn = b.fn
    ty, _ = TYPES[spec.dtype]
    lanes, off0 = slot
    bias, z, y, p, t, valid = at
    vty, suffix = f"<{lanes} x {ty}>", f"v{lanes}f{32 if ty == 'float' else 64}"
    ids = ", ".join(f"i64 {off0 + q}" for q in range(lanes))
    mask = ""
    if masked:
        limit = _splat_i64(fn, valid, lanes)
        mask = fn.value(f"icmp slt <{lanes} x i64> <{ids}>, {limit}", "mask")
    for m, acc in enumerate(accs):
        val = fn.value(f"load {vty}, ptr {acc}", "r")
        if spec.bias:
            bv = b.load(ty, b.gep(ty, bias, str(m)), "bv")
            val = fn.value(f"fadd {vty} {val}, {_splat(fn, ty, bv, lanes)}", "biased")
        off = b.add(b.mul(str(m), p), b.add(t, str(off0)), "off")
        dst = b.gep(ty, y, off, "dst")
        if spec.residual:
            zs = b.gep(ty, z, off, "zs")
            zv = fn.value(
                f"call {vty} @llvm.masked.load.{suffix}.p0(ptr {zs}, i32 4, "
                f"<{lanes} x i1> {mask}, {vty} zeroinitializer)"
                if masked
                else f"load {vty}, ptr {zs}, align 4",
                "zv",
            )
            val = fn.value(f"fadd {vty} {val}, {zv}", "summed")
        if spec.activation == "relu":
            neg = fn.value(f"fcmp olt {vty} {val}, zeroinitializer", "neg")
            val = fn.value(f"select <{lanes} x i1> {neg}, {vty} zeroinitializer, {vty} {val}")
        if not masked:
            fn.add(f"store {vty} {val}, ptr {dst}, align 4")
            continue
        fn.add(
            f"call void @llvm.masked.store.{suffix}.p0({vty} {val}, ptr {dst}, i32 4, "
            f"<{lanes} x i1> {mask})"
        )


def _splat_i64(fn: FunctionWriter, v: str, lanes: int) -> str:
    """The i64 ``v`` in every one of ``lanes`` lanes."""
    one = fn.value(f"insertelement <1 x i64> poison, i64 {v}, i64 0", "vv")
    return fn.value(
        f"shufflevector <1 x i64> {one}, <1 x i64> poison, <{lanes} x i32> zeroinitializer",
        "limit",
    )
