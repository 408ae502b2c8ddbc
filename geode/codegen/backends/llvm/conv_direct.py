"""The ``direct`` body of a native conv (:mod:`~.conv`): a register-blocked loop nest,
no im2col and no GEMM, for convs whose output columns are contiguous input columns
(horizontal stride 1; any vertical stride, dilation, padding and groups).

An output *tile* is ``CB`` output channels by ``U`` vectors of ``V`` output columns of
one output row (``V``: the lanes of the host's widest vector, 16 floats with AVX-512;
``CB * U`` accumulators stay in registers, :func:`blocking`). For every input channel
and tap ``(i, j)`` of the window, the tile loads ``U`` vectors of the (scratch) input row
and multiplies each by the ``CB`` weights, broadcast: ``CB * U`` fused multiply-adds per
``U`` vector loads. The epilogue runs on the tile in registers before its one store:
the bias, then the residual ``Z`` (same shape as Y) added, then the activation (Relu).
The last tile of a row stores through a lane mask (its extra lanes read zeros of the
scratch row and are never stored).

Work is split into *items*, one band of output rows of one image and group
(:func:`band_rows`), shared among the native pool's threads (:mod:`~.parallel`'s
launcher). An item first copies the input rows its band reads into a zero-bordered
scratch of ``C/g`` planes (``conv_depthwise.pad_function``), with rows as wide as the
last tile reaches (``ceil(OW / V) * V + (kw - 1) * dw``), so the tiles check no bounds.
Each chunk ``malloc``-s one scratch for its items; a NULL sets the failure flag and
the body returns status ``n_arrays + 1``.

The weights are read in place (the ``CB`` broadcasts of a tap are ``C/g * kh * kw``
apart, each cache line reused by the next 16 taps): nothing is packed at compile time.
"""

from __future__ import annotations

from geode.codegen.backends.llvm.conv_depthwise import chunk_start, pad_function
from geode.codegen.backends.llvm.conv_spec import BODY_PARAMS, TYPES, ConvSpec, body_geometry
from geode.codegen.backends.llvm.irloops import Builder
from geode.codegen.backends.llvm.irtext import FunctionWriter, ModuleWriter
from geode.codegen.backends.llvm.parallel import LAUNCH

__all__ = ["BAND_BUDGET_BYTES", "ITEMS_WANTED", "blocking", "lanes", "write_body"]

#: bytes of an item's scratch (its band's input rows): bands are cut to fit
BAND_BUDGET_BYTES = 512 << 10
#: items a launch aims for (bands are cut so a small batch still feeds every thread)
ITEMS_WANTED = 8
#: the chunk function's context: pointers, sizes, the failure flag; one i64 slot each
_CTX = ("X", "W", "B", "Z", "Y", "planes", "H", "Wd", "OH", "OW", "pt", "pl", "band")
_CTX = (*_CTX, "bands", "Wp", "failed")


def lanes(spec: ConvSpec, attrs: str) -> int:
    """``V``: elements per vector (64-byte vectors on AVX-512 hosts, else 32 bytes)."""
    wide = "+avx512f" in attrs and '"prefer-vector-width"="256"' not in attrs
    return (64 if wide else 32) // TYPES[spec.dtype][1]


def blocking(spec: ConvSpec, attrs: str) -> tuple[int, int]:
    """``(CB, U)``: output channels and column vectors per tile (``CB * U`` accumulators:
    16 of the 32 AVX-512 registers, 8 of AVX2's 16)."""
    regs = 16 if "+avx512f" in attrs else 8
    u = 2
    return min(regs // u, max(1, spec.mg)), u


def write_body(module: ModuleWriter, name: str, spec: ConvSpec, attrs: str) -> None:
    """Add ``i32 @name(geometry, ptr Z)`` (see :data:`~.conv_spec.BODY_PARAMS`) computing
    ``spec``'s conv directly on the native pool; ``attrs``: the target's function
    attributes."""
    v_lanes = lanes(spec, attrs)
    cb, u = blocking(spec, attrs)
    rows = [f"{name}.row{cb}"]
    module.add_function(_row_function(module, rows[0], spec, attrs, cb, u, v_lanes))
    if spec.mg % cb:
        rows.append(f"{name}.row{spec.mg % cb}")
        module.add_function(_row_function(module, rows[1], spec, attrs, spec.mg % cb, u, v_lanes))
    pad, chunk = f"{name}.pad", f"{name}.chunk"
    module.add_function(pad_function(module, pad, spec.dtype, attrs))
    module.add_function(_chunk_function(module, chunk, rows, pad, spec, attrs, cb))
    module.declare("geode_num_threads", "declare i64 @geode_num_threads() nounwind")
    module.declare(
        "geode_parallel_for", "declare void @geode_parallel_for(ptr, ptr, i64, i64) nounwind"
    )
    module.add_global("geode.launch", LAUNCH)
    fn = FunctionWriter(name, "i32", [*BODY_PARAMS, ("ptr noalias", "Z")])
    fn.linkage = "internal"
    fn.attrs = " " + module.attr_group("nounwind " + attrs)
    b = Builder(fn)
    geo = body_geometry(fn)
    z = fn.param(len(BODY_PARAMS))
    kw, dw = spec.kernel[1], spec.dilations[1]
    sw = spec.strides[1]
    reach = b.mul(b.ceildiv(geo.ow, v_lanes), str(v_lanes * sw))
    wp = b.add(reach, str((kw - 1) * dw), "Wp")
    band = band_rows(b, spec, geo.n, geo.oh, wp)
    bands = b.op("sdiv", b.add(geo.oh, b.sub(band, "1")), band, "bands")
    items = b.mul(b.mul(geo.n, str(spec.group)), bands, "items")
    values = [geo.x, geo.w, geo.b, z, geo.y, items, geo.h, geo.wd, geo.oh, geo.ow, geo.pt]
    values += [geo.pl, band, bands, wp]
    ctx = fn.alloca(f"[{len(_CTX)} x i64]", "ctx", align=8)
    for i, val in enumerate([*values, "0"]):
        slot = b.gep("i64", ctx, str(i), "slot")
        fn.add(f"store {'ptr' if i < 5 else 'i64'} {val}, ptr {slot}")
    macs = b.mul(b.mul(items, b.mul(band, geo.ow)), str(spec.mg * spec.depth), "work")
    small = b.cmp("slt", macs, str(1 << 17), "small")
    fn.add(
        f"call void @geode.launch(ptr @{chunk}, ptr {ctx}, i64 {items}, i64 {geo.threads}, "
        f"i1 {small})"
    )
    failed = b.load("i64", b.gep("i64", ctx, str(len(_CTX) - 1)), "failed")
    status = fn.value(f"select i1 {b.cmp('ne', failed, '0')}, i32 {len(spec.arrays) + 1}, i32 0")
    fn.terminate(f"ret i32 {status}")
    module.add_function(fn)


def band_rows(b: Builder, spec: ConvSpec, n: str, oh: str, wp: str) -> str:
    """Output rows per item: as many as keep at least :data:`ITEMS_WANTED` items in all
    (when the output has that many rows) and the band's input rows within
    :data:`BAND_BUDGET_BYTES` (at least one row)."""
    item = TYPES[spec.dtype][1]
    images = b.max(b.mul(n, str(spec.group)), "1", "images")
    want = b.max(b.op("sdiv", b.add(str(ITEMS_WANTED - 1), images), images), "1", "want")
    band = b.op("sdiv", b.add(oh, b.sub(want, "1")), want, "band")
    row_bytes = b.mul(wp, str(spec.cg * item * max(1, spec.strides[0])), "rowbytes")
    fit = b.max(b.op("sdiv", str(BAND_BUDGET_BYTES), row_bytes), "1", "fit")
    return b.max(b.min(band, fit), "1", "band")


def _chunk_function(
    module: ModuleWriter,
    name: str,
    rows: list[str],
    pad: str,
    spec: ConvSpec,
    attrs: str,
    cb: int,
) -> FunctionWriter:
    """``void @name(ptr ctx, i64 chunk, i64 nchunks)``: this chunk's items (see the
    module docstring)."""
    ty, item = TYPES[spec.dtype]
    (kh, kw), (sh, _), (dh, _) = spec.kernel, spec.strides, spec.dilations
    c = chunk_start(module, name, attrs, _CTX, 5)
    fn, b, v = c.fn, c.b, c.v
    module.declare("malloc", "declare noalias ptr @malloc(i64) nounwind")
    module.declare("free", "declare void @free(ptr) nounwind")
    rin_max = b.add(b.mul(b.sub(v["band"], "1"), str(sh)), str((kh - 1) * dh + 1), "rin")
    plane = b.mul(rin_max, v["Wp"], "plane")
    nbytes = b.mul(b.mul(plane, str(spec.cg)), str(item), "bytes")
    buf = fn.value(f"call noalias ptr @malloc(i64 {nbytes})", "buf")
    nomem = b.all_of([b.cmp("slt", c.lo, c.hi), fn.value(f"icmp eq ptr {buf}, null")])

    def fail() -> None:
        fn.add(f"store atomic i64 1, ptr {v['failed']} monotonic, align 8")
        fn.terminate("ret void")
        fn.start_block(fn.label("unreachable"))

    b.when(nomem, fail, "nomem")
    hw, p = b.mul(v["H"], v["Wd"], "HW"), b.mul(v["OH"], v["OW"], "P")
    khw = kh * kw

    def one(q: str) -> None:
        img = b.op("udiv", q, v["bands"], "img")  # n * group + g
        oh0 = b.mul(b.op("urem", q, v["bands"]), v["band"], "oh0")
        nrows = b.min(v["band"], b.sub(v["OH"], oh0), "nrows")
        rin = b.add(b.mul(b.sub(nrows, "1"), str(sh)), str((kh - 1) * dh + 1), "rin")
        g = b.op("urem", img, str(spec.group), "g")
        n = b.op("udiv", img, str(spec.group), "n")
        top = b.sub(v["pt"], b.mul(oh0, str(sh)), "top")  # the band's first input row: -top
        x0 = b.gep(ty, v["X"], b.mul(b.mul(img, str(spec.cg)), hw), "x0")

        def copy(ci: str) -> None:
            xc = b.gep(ty, x0, b.mul(ci, hw), "xc")
            dst = b.gep(ty, buf, b.mul(ci, plane), "dst")
            fn.add(
                f"call void @{pad}(ptr {xc}, ptr {dst}, i64 {v['H']}, i64 {v['Wd']}, "
                f"i64 {rin}, i64 {v['Wp']}, i64 {top}, i64 {v['pl']})"
            )

        b.loop("0", str(spec.cg), copy, "ci")
        m0 = b.mul(g, str(spec.mg), "m0")

        def out_row(r: str) -> None:
            src = b.gep(ty, buf, b.mul(b.mul(r, str(sh)), v["Wp"]), "src")
            orow = b.add(oh0, r, "orow")

            def block(m: str, row_fn: str) -> None:
                ch = b.add(m0, m, "ch")
                yoff = b.add(
                    b.mul(b.add(b.mul(n, str(spec.out_channels)), ch), p),
                    b.mul(orow, v["OW"]),
                    "yoff",
                )
                y = b.gep(ty, v["Y"], yoff, "y")
                z = b.gep(ty, v["Z"], yoff, "z") if spec.residual else "null"
                w = b.gep(ty, v["W"], b.mul(ch, str(spec.cg * khw)), "w")
                bias = b.gep(ty, v["B"], ch, "bias") if spec.bias else "null"
                fn.add(
                    f"call void @{row_fn}(ptr {src}, i64 {v['Wp']}, i64 {plane}, ptr {w}, "
                    f"ptr {bias}, ptr {z}, ptr {y}, i64 {v['OW']}, i64 {p})"
                )

            full = spec.mg - spec.mg % cb
            if full:
                b.loop("0", str(full), lambda m: block(m, rows[0]), "mb", step=str(cb))
            if spec.mg % cb:
                block(str(full), rows[1])

        b.loop("0", nrows, out_row, "r")

    b.loop(c.lo, c.hi, one, "q")
    fn.add(f"call void @free(ptr {buf})")
    fn.terminate("ret void")
    return fn


def _row_function(
    module: ModuleWriter, name: str, spec: ConvSpec, attrs: str, cb: int, u: int, vl: int
) -> FunctionWriter:
    """``void @name(ptr src, i64 Wp, i64 plane, ptr w, ptr bias, ptr z, ptr y, i64 OW,
    i64 P)``: one output row of ``cb`` channels (``P`` apart in Y and Z) from the scratch
    rows at ``src`` (planes ``plane`` apart, rows ``Wp`` apart), tile by tile."""
    tiles = [f"{name}.tile{k}" for k in range(1, u + 1)]
    for k in range(1, u + 1):
        module.add_function(_tile_function(module, tiles[k - 1], spec, attrs, cb, k, vl))
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

    def tile(t: str) -> None:
        fn.add(f"call void @{tiles[-1]}({args}, i64 {t}, i64 {width})")

    b.loop("0", nfull, tile, "t", step=str(width), meta=Builder.no_unroll(module))
    rest = b.sub(ow, nfull, "rest")
    for k in range(1, u + 1):  # the tail: k vectors, the last one masked
        lo, hi = (k - 1) * vl, k * vl
        cond = b.all_of([b.cmp("sgt", rest, str(lo)), b.cmp("sle", rest, str(hi))])
        b.when(
            cond,
            lambda k=k: fn.add(f"call void @{tiles[k - 1]}({args}, i64 {nfull}, i64 {rest})"),
            f"tail{k}",
        )
    fn.terminate("ret void")
    return fn


def _tile_function(
    module: ModuleWriter, name: str, spec: ConvSpec, attrs: str, cb: int, u: int, vl: int
) -> FunctionWriter:
    """``void @name(row args, i64 t, i64 valid)``: the tile of ``cb`` channels by ``u``
    vectors at column ``t`` of the row, ``valid`` of its ``u * vl`` columns stored."""
    ty, _ = TYPES[spec.dtype]
    vty = f"<{vl} x {ty}>"
    suffix = f"v{vl}f{32 if ty == 'float' else 64}"
    module.declare(f"llvm.fma.{suffix}", f"declare {vty} @llvm.fma.{suffix}({vty}, {vty}, {vty})")
    module.declare(
        f"llvm.masked.store.{suffix}.p0",
        f"declare void @llvm.masked.store.{suffix}.p0({vty}, ptr, i32, <{vl} x i1>)",
    )
    module.declare(
        f"llvm.masked.load.{suffix}.p0",
        f"declare {vty} @llvm.masked.load.{suffix}.p0(ptr, i32, <{vl} x i1>, {vty})",
    )
    names = ("src", "Wp", "plane", "w", "bias", "z", "y", "P", "t", "valid")
    kinds = ("ptr noalias", "i64", "i64", "ptr noalias", "ptr noalias", "ptr noalias")
    params = list(zip((*kinds, "ptr noalias", "i64", "i64", "i64"), names))
    fn = FunctionWriter(name, "void", params)
    fn.linkage = "internal"
    fn.attrs = " " + module.attr_group("nounwind " + attrs)
    b = Builder(fn)
    src, wp, plane, w, bias, z, y, p, t, valid = (fn.param(i) for i in range(len(names)))
    (kh, kw), (dh, dw) = spec.kernel, spec.dilations
    khw = kh * kw
    zero = f"{vty} zeroinitializer"
    accs = [[fn.alloca(vty, f"acc{m}_{k}") for k in range(u)] for m in range(cb)]
    for row in accs:
        for a in row:
            fn.add(f"store {zero}, ptr {a}")
    sw = spec.strides[1]
    base = b.gep(ty, src, b.mul(t, str(sw)), "base")
    wide = f"<{vl * sw} x {ty}>"
    picks = ", ".join(f"i32 {q * sw}" for q in range(vl))

    def load_x(at: str) -> str:
        """``V`` input columns ``sw`` apart from ``at``: one load, or (stride 2) one
        load of ``2V`` and its even lanes."""
        if sw == 1:
            return fn.value(f"load {vty}, ptr {at}, align 4", "x")
        both = fn.value(f"load {wide}, ptr {at}, align 4", "xx")
        return fn.value(f"shufflevector {wide} {both}, {wide} poison, <{vl} x i32> <{picks}>", "x")

    def splat(s: str) -> str:
        one = fn.value(f"insertelement <1 x {ty}> poison, {ty} {s}, i64 0", "one")
        return fn.value(
            f"shufflevector <1 x {ty}> {one}, <1 x {ty}> poison, <{vl} x i32> zeroinitializer",
            "splat",
        )

    def channel(ci: str) -> None:
        xc = b.gep(ty, base, b.mul(ci, plane), "xc")
        wc = b.gep(ty, w, b.mul(ci, str(khw)), "wc")
        vals = [[fn.value(f"load {vty}, ptr {a}", "a") for a in row] for row in accs]
        for i in range(kh):
            xr = b.gep(ty, xc, b.mul(str(i * dh), wp), "xr")
            for j in range(kw):
                xs = [load_x(b.gep(ty, xr, str(j * dw + k * vl * sw))) for k in range(u)]
                for m in range(cb):
                    wv = b.load(ty, b.gep(ty, wc, str(m * spec.cg * khw + i * kw + j)), "wt")
                    ws = splat(wv)
                    for k in range(u):
                        vals[m][k] = fn.value(
                            f"call {vty} @llvm.fma.{suffix}({vty} {ws}, {vty} {xs[k]}, "
                            f"{vty} {vals[m][k]})",
                            "acc",
                        )
        for row, vrow in zip(accs, vals):
            for a, val in zip(row, vrow):
                fn.add(f"store {vty} {val}, ptr {a}")

    b.loop("0", str(spec.cg), channel, "ci", meta=Builder.no_unroll(module))
    lane_ids = ", ".join(f"i64 {k}" for k in range(vl))
    step = fn.value(f"insertelement <1 x i64> poison, i64 {valid}, i64 0", "vv")
    limit = fn.value(
        f"shufflevector <1 x i64> {step}, <1 x i64> poison, <{vl} x i32> zeroinitializer", "limit"
    )
    masks = []
    for k in range(u):
        ids = fn.value(f"add <{vl} x i64> <{lane_ids}>, splat (i64 {k * vl})", "ids")
        masks.append(fn.value(f"icmp slt <{vl} x i64> {ids}, {limit}", "mask"))
    for m in range(cb):
        for k in range(u):
            val = fn.value(f"load {vty}, ptr {accs[m][k]}", "r")
            if spec.bias:
                bv = b.load(ty, b.gep(ty, bias, str(m)), "bv")
                val = fn.value(f"fadd {vty} {val}, {splat(bv)}", "biased")
            off = b.add(b.mul(str(m), p), b.add(t, str(k * vl)), "off")
            dst = b.gep(ty, y, off, "dst")
            if spec.residual:
                zs = b.gep(ty, z, off, "zs")
                zv = fn.value(
                    f"call {vty} @llvm.masked.load.{suffix}.p0(ptr {zs}, i32 4, "
                    f"<{vl} x i1> {masks[k]}, {vty} zeroinitializer)",
                    "zv",
                )
                val = fn.value(f"fadd {vty} {val}, {zv}", "summed")
            if spec.activation == "relu":
                neg = fn.value(f"fcmp olt {vty} {val}, zeroinitializer", "neg")
                val = fn.value(
                    f"select <{vl} x i1> {neg}, {vty} zeroinitializer, {vty} {val}", "relu"
                )
            fn.add(
                f"call void @llvm.masked.store.{suffix}.p0({vty} {val}, ptr {dst}, i32 4, "
                f"<{vl} x i1> {masks[k]})"
            )
    fn.terminate("ret void")
    return fn
