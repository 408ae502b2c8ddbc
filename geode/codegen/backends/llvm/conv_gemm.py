"""The GEMM bodies of a native conv (:mod:`~.conv`): ``pointwise`` and ``im2col``.

For image ``n`` and group ``g`` the weights ``W[g*M/g:(g+1)*M/g]`` are a row-major
``[M/g, K]`` matrix (``K = C/g * kh * kw``) and ``Y[n, g*M/g:(g+1)*M/g]`` a row-major
``[M/g, OH*OW]`` one, so one CBLAS ``?gemm`` per image and group writes Y in place:

- ``pointwise`` (1x1, stride 1, no padding): the right operand is the input itself,
  ``X[n, g*C/g:(g+1)*C/g]`` as ``[C/g, H*W]``; nothing is copied;
- ``im2col``: the right operand is a column matrix built from the input, row
  ``(c*kh + i)*kw + j`` holding ``x[c, oh*sh - pt + i*dh, ow*sw - pl + j*dw]`` (zero
  in the padding) for every output position. It is built a band of output rows at a
  time (as many rows as fit :data:`COL_BUDGET_BYTES`, at least one), each band
  followed by its GEMM into those rows of Y (``ldc = OH*OW``): the band is still in
  cache when the GEMM packs it, and the buffer stays small whatever the image size.
  The buffer is ``malloc``-ed per call and freed before the body returns; glibc keeps
  a freed block of that size for the next call, so a steady stream of calls maps no new
  pages. A NULL from ``malloc`` returns status ``n_arrays + 1``.

A bias fills Y's rows first and the GEMMs accumulate onto it (``beta = 1``): one
write pass over Y instead of a read-modify-write pass after. With ``K = 0`` (no input
channels) Y is the bias, or zeros. The im2col copy runs on the calling thread: the
GEMMs run on OpenBLAS's own threads, and geode's pool spinning beside them would take
their cores.
A product of fewer than :data:`SPLIT_MIN_MACS` multiply-adds runs on the calling thread
(``geode_gemm`` told one thread); a larger one is split over the pool.
"""

from __future__ import annotations

from collections.abc import Callable

from geode.codegen.backends.llvm.conv_spec import (
    BODY_PARAMS,
    TYPES,
    ConvSpec,
    Geometry,
    body_geometry,
)
from geode.codegen.backends.llvm.irloops import Builder
from geode.codegen.backends.llvm.irtext import FunctionWriter, ModuleWriter, float_literal
from geode.codegen.backends.llvm.library import GEMM_DECL, gemm_call

__all__ = ["COL_BUDGET_BYTES", "SPLIT_MIN_MACS", "write_body"]

#: bytes of the im2col column band (one band of output rows at a time, at least one
#: row). Every GEMM call is a barrier of OpenBLAS's threads, which costs a scheduler
#: slice whenever another process holds a core; 8 MB makes ResNet's 3x3 convs at 224x224
#: input (up to 64 channels at 56x56) one band per image. One thread runs a 64->64
#: 56x56 conv at the same speed in bands of 256 kB to 8 MB.
COL_BUDGET_BYTES = 8 << 20

#: multiply-adds below which a conv's GEMM runs on the calling thread alone: splitting a
#: product this small over the pool saves at most half of a few microseconds of compute
#: and pays the pool's wake-up and hand-off (the cnn's 1x1 stride-2 shortcut at 1x3x64x64,
#: 64 x 256 x 32, took longer on two threads than on one). See docs/performance.md.
SPLIT_MIN_MACS = 1 << 20

_MEMSET = "declare void @llvm.memset.p0.i64(ptr, i8, i64, i1)"
_MEMCPY = "declare void @llvm.memcpy.p0.p0.i64(ptr, ptr, i64, i1)"


def write_body(module: ModuleWriter, name: str, spec: ConvSpec, attrs: str) -> None:
    """Add ``i32 @name(geometry)`` (see :data:`~.conv_spec.BODY_PARAMS`) computing
    ``spec``'s conv by ``pointwise`` or ``im2col`` GEMMs through ``geode_gemm``;
    ``attrs``: the target's function attributes."""
    ty, item = TYPES[spec.dtype]
    module.declare("geode_gemm", GEMM_DECL)  # the BLAS split over the pool (no barriers)
    module.declare("llvm.memset.p0.i64", _MEMSET)
    fill = f"{name}.fill"
    module.add_function(_fill_function(module, fill, spec, attrs))
    im2col = f"{name}.im2col"
    if spec.method == "im2col":
        module.declare("llvm.memcpy.p0.p0.i64", _MEMCPY)
        module.declare("malloc", "declare noalias ptr @malloc(i64) nounwind")
        module.declare("free", "declare void @free(ptr) nounwind")
        module.add_function(_im2col_function(module, im2col, spec, attrs))
    fn = FunctionWriter(name, "i32", BODY_PARAMS)
    fn.linkage = "internal"
    fn.attrs = " " + module.attr_group("nounwind " + attrs)
    b = Builder(fn)
    geo = body_geometry(fn)
    p = b.mul(geo.oh, geo.ow, "P")
    k = spec.depth
    if spec.bias or k == 0:
        fn.add(f"call void @{fill}(ptr {geo.y}, ptr {geo.b}, i64 {geo.n}, i64 {p})")
    if k == 0 or spec.out_channels == 0:
        fn.terminate("ret i32 0")
        return module.add_function(fn)
    b.fail_unless(b.cmp("sgt", geo.n, "0"), 0, "some")
    gemm = _Gemm(b, spec.dtype, geo.threads, beta=1.0 if spec.bias else 0.0)
    if spec.method == "pointwise":
        hw = b.mul(geo.h, geo.wd, "HW")
        _per_image_group(
            b,
            spec,
            geo,
            hw,
            p,
            lambda xg, wg, yg: gemm(spec.mg, p, spec.cg, wg, str(spec.cg), xg, p, yg, p),
        )
        fn.terminate("ret i32 0")
        return module.add_function(fn)
    band = max(1, COL_BUDGET_BYTES // (k * item))  # output positions per band
    rows = b.max(b.op("sdiv", str(band), geo.ow), "1", "rows")
    rows = b.min(rows, geo.oh, "rows")
    nbytes = b.mul(b.mul(rows, geo.ow), str(k * item), "colbytes")
    col = fn.value(f"call noalias ptr @malloc(i64 {nbytes})", "col")
    status = len(spec.arrays) + 1
    b.fail_unless(fn.value(f"icmp ne ptr {col}, null", "allocated"), status, "have_col")

    def image_group(xg: str, wg: str, yg: str) -> None:
        def band_at(oh0: str) -> None:
            r = b.min(rows, b.sub(geo.oh, oh0), "r")
            width = b.mul(r, geo.ow, "cols")
            fn.add(
                f"call void @{im2col}(ptr {xg}, ptr {col}, i64 {geo.h}, i64 {geo.wd}, "
                f"i64 {geo.ow}, i64 {oh0}, i64 {r}, i64 {geo.pt}, i64 {geo.pl})"
            )
            yb = b.gep(ty, yg, b.mul(oh0, geo.ow), "yband")
            gemm(spec.mg, width, k, wg, str(k), col, width, yb, p)

        b.loop("0", geo.oh, band_at, "oh0", step=rows)

    hw = b.mul(geo.h, geo.wd, "HW")
    _per_image_group(b, spec, geo, hw, p, image_group)
    fn.add(f"call void @free(ptr {col})")
    fn.terminate("ret i32 0")
    module.add_function(fn)


class _Gemm:
    """Writes ``Y[M x N] (+)= A[M x K] @ B[K x N]`` calls of ``geode_gemm`` (row-major;
    :func:`~geode.codegen.backends.llvm.library.gemm_call`); a product of fewer than
    :data:`SPLIT_MIN_MACS` multiply-adds on one thread."""

    def __init__(self, b: Builder, dtype: str, threads: str, beta: float):
        self.b, self.dtype, self.threads = b, dtype, threads
        self.beta = "1.0" if beta else "0.0"

    def __call__(
        self, m: object, n: object, k: object, a: str, lda: str, bm: str, ldb: str, c: str, ldc: str
    ) -> None:
        ops = [(a, str(lda)), (bm, str(ldb)), (c, str(ldc))]
        b = self.b
        macs = b.mul(b.mul(str(m), str(n)), str(k), "macs")
        alone = b.cmp("slt", macs, str(SPLIT_MIN_MACS), "alone")
        threads = b.select(alone, "1", self.threads, "gemm_threads")
        b.fn.add(gemm_call(self.dtype, str(m), str(n), str(k), ops, threads, self.beta).strip())


def _per_image_group(
    b: Builder,
    spec: ConvSpec,
    geo: Geometry,
    hw: str,
    p: str,
    body: Callable[[str, str, str], None],
) -> None:
    """``body(x_g, w_g, y_g)`` for every image and group: pointers to the group's input
    channels of the image, its weight rows and its output channels of the image."""
    ty, _ = TYPES[spec.dtype]

    def image(n: str) -> None:
        def group(g: str) -> None:
            xc = b.add(b.mul(n, str(spec.channels)), b.mul(g, str(spec.cg)), "xc")
            ym = b.add(b.mul(n, str(spec.out_channels)), b.mul(g, str(spec.mg)), "ym")
            xg = b.gep(ty, geo.x, b.mul(xc, hw), "xg")
            yg = b.gep(ty, geo.y, b.mul(ym, p), "yg")
            wg = b.gep(ty, geo.w, b.mul(g, str(spec.mg * spec.depth)), "wg")
            body(xg, wg, yg)

        b.loop("0", str(spec.group), group, "g")

    b.loop("0", geo.n, image, "n")


def _fill_function(module: ModuleWriter, name: str, spec: ConvSpec, attrs: str) -> FunctionWriter:
    """``void @name(ptr Y, ptr B, i64 N, i64 P)``: each of Y's ``N * M`` rows of ``P``
    set to its channel's bias (zeros without one)."""
    ty, _ = TYPES[spec.dtype]
    fn = FunctionWriter(
        name, "void", [("ptr noalias", "Y"), ("ptr noalias", "B"), ("i64", "N"), ("i64", "P")]
    )
    fn.linkage = "internal"
    fn.attrs = " " + module.attr_group("nounwind noinline " + attrs)
    b = Builder(fn)
    y, bias, n, p = (fn.param(i) for i in range(4))
    m = str(spec.out_channels)

    def row(r: str) -> None:
        if spec.bias:
            ch = b.op("srem", r, m, "ch")
            v = b.load(ty, b.gep(ty, bias, ch), "bias")
        else:
            v = float_literal(0.0, ty)
        yrow = b.gep(ty, y, b.mul(r, p), "yrow")
        b.loop("0", p, lambda j: fn.add(f"store {ty} {v}, ptr {b.gep(ty, yrow, j)}"), "j")

    b.loop("0", b.mul(n, m, "rows"), row, "r")
    fn.terminate("ret void")
    return fn


def _im2col_function(module: ModuleWriter, name: str, spec: ConvSpec, attrs: str) -> FunctionWriter:
    """``void @name(ptr x, ptr col, i64 H, i64 Wd, i64 OW, i64 oh0, i64 rows, i64 pt,
    i64 pl)``: the column band of output rows ``[oh0, oh0 + rows)`` of one group (``x``
    its first input channel), ``K`` rows of ``rows * OW`` (see the module docstring)."""
    ty, item = TYPES[spec.dtype]
    names = ["x", "col", "H", "Wd", "OW", "oh0", "rows", "pt", "pl"]
    params = [("ptr noalias", n) for n in names[:2]] + [("i64", n) for n in names[2:]]
    fn = FunctionWriter(name, "void", params)
    fn.linkage = "internal"
    fn.attrs = " " + module.attr_group("nounwind noinline " + attrs)
    b = Builder(fn)
    x, col, h, wd, ow, oh0, rows, pt, pl = (fn.param(i) for i in range(len(names)))
    (kh, kw), (sh, sw), (dh, dw) = spec.kernel, spec.strides, spec.dilations
    width = b.mul(rows, ow, "width")
    plane = b.mul(h, wd, "plane")

    def zero(dst: str, count: str) -> None:
        nbytes = b.mul(count, str(item), "zbytes")
        fn.add(f"call void @llvm.memset.p0.i64(ptr {dst}, i8 0, i64 {nbytes}, i1 false)")

    def tap(xc: str, c: str, i: str, j: str) -> None:
        row = b.add(b.mul(b.add(b.mul(c, str(kh)), i), str(kw)), j, "crow")
        dst_row = b.gep(ty, col, b.mul(row, width), "dst_row")
        off = b.sub(b.mul(j, str(dw)), pl, "off")  # iw = ow * sw + off
        lo = b.min(b.max(b.ceildiv(b.sub("0", off), sw), "0"), ow, "lo")
        last = b.add(b.floordiv(b.sub(b.sub(wd, "1"), off), sw), "1")
        hi = b.max(lo, b.min(last, ow), "hi")

        def out_row(r: str) -> None:
            ih = b.add(b.sub(b.mul(b.add(oh0, r), str(sh)), pt), b.mul(i, str(dh)), "ih")
            dst = b.gep(ty, dst_row, b.mul(r, ow), "dst")
            inside = b.all_of([b.cmp("sge", ih, "0"), b.cmp("slt", ih, h)])

            def copy() -> None:
                zero(dst, lo)
                start = b.add(b.add(b.mul(ih, wd), b.mul(lo, str(sw))), off, "start")
                src = b.gep(ty, xc, start, "src")
                dlo = b.gep(ty, dst, lo, "dlo")
                count = b.sub(hi, lo, "count")
                if sw == 1:
                    nbytes = b.mul(count, str(item), "cbytes")
                    fn.add(
                        f"call void @llvm.memcpy.p0.p0.i64(ptr {dlo}, ptr {src}, "
                        f"i64 {nbytes}, i1 false)"
                    )
                else:
                    b.loop(
                        "0",
                        count,
                        lambda t: fn.add(
                            f"store {ty} {b.load(ty, b.gep(ty, src, b.mul(t, str(sw))))}, "
                            f"ptr {b.gep(ty, dlo, t)}"
                        ),
                        "t",
                    )
                zero(b.gep(ty, dst, hi, "dhi"), b.sub(ow, hi))

            b.branch(inside, copy, lambda: zero(dst, ow), "inside")

        b.loop("0", rows, out_row, "r")

    def channel(c: str) -> None:
        xc = b.gep(ty, x, b.mul(c, plane), "xc")
        b.loop(
            "0",
            str(kh),
            lambda i: b.loop(
                "0", str(kw), lambda j: tap(xc, c, i, j), "kj", meta=Builder.no_unroll(module)
            ),
            "ki",
            meta=Builder.no_unroll(module),
        )

    b.loop("0", str(spec.cg), channel, "c")
    fn.terminate("ret void")
    return fn
