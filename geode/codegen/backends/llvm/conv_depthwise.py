"""The ``depthwise`` body of a native conv (:mod:`~.conv`): one input channel per group
(``C/g = 1``, any ``M/g``), computed directly, no GEMM: im2col would copy every input
element ``kh * kw`` times for a GEMM whose inner dimension is only ``kh * kw``.

Output plane ``(n, m)`` reads input plane ``(n, m // (M/g))`` and the ``kh * kw``
weights of channel ``m``. Each output row starts as the bias (or zero); then every tap
``(i, j)`` whose input row ``ih = oh*sh - pt + i*dh`` lies inside the image adds
``w[m, 0, i, j] * x[ih, ow*sw - pl + j*dw]`` over the output columns whose input column
lies inside (the padding adds nothing): a unit-stride loop over the row, which LLVM
vectorizes, on a row that stays in L1 across the taps.

The planes are shared among the native pool's threads (:mod:`~.parallel`'s launcher,
``threads`` from the entry's ints; no BLAS runs here). Below
:data:`~.parallel.MIN_PARALLEL_ELEMENTS` multiply-adds the calling thread does all.
"""

from __future__ import annotations

from geode.codegen.backends.llvm.conv_spec import BODY_PARAMS, TYPES, ConvSpec, body_geometry
from geode.codegen.backends.llvm.irloops import Builder
from geode.codegen.backends.llvm.irtext import FunctionWriter, ModuleWriter, float_literal
from geode.codegen.backends.llvm.parallel import LAUNCH, MIN_PARALLEL_ELEMENTS

__all__ = ["write_body"]

#: the chunk function's context: pointers then sizes, one i64 slot each
_CTX = ("X", "W", "B", "Y", "planes", "H", "Wd", "OH", "OW", "pt", "pl")


def write_body(module: ModuleWriter, name: str, spec: ConvSpec, attrs: str) -> None:
    """Add ``i32 @name(geometry)`` (see :data:`~.conv_spec.BODY_PARAMS`) computing
    ``spec``'s depthwise conv on the native pool; ``attrs``: the target's function
    attributes."""
    plane, chunk = f"{name}.plane", f"{name}.chunk"
    module.add_function(_plane_function(module, plane, spec, attrs))
    module.add_function(_chunk_function(module, chunk, plane, spec, attrs))
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
    for i, v in enumerate(values):
        slot = b.gep("i64", ctx, str(i), "slot")
        fn.add(f"store {'ptr' if i < 4 else 'i64'} {v}, ptr {slot}")
    taps = spec.kernel[0] * spec.kernel[1]
    work = b.mul(b.mul(planes, b.mul(geo.oh, geo.ow)), str(taps), "work")
    small = b.cmp("slt", work, str(MIN_PARALLEL_ELEMENTS), "small")
    fn.add(
        f"call void @geode.launch(ptr @{chunk}, ptr {ctx}, i64 {planes}, i64 {geo.threads}, "
        f"i1 {small})"
    )
    fn.terminate("ret i32 0")
    module.add_function(fn)


def _chunk_function(
    module: ModuleWriter, name: str, plane: str, spec: ConvSpec, attrs: str
) -> FunctionWriter:
    """``void @name(ptr ctx, i64 chunk, i64 nchunks)``: this chunk's share of the planes."""
    ty, _ = TYPES[spec.dtype]
    fn = FunctionWriter(name, "void", [("ptr", "ctx"), ("i64", "chunk"), ("i64", "nchunks")])
    fn.linkage = "internal"
    fn.attrs = " " + module.attr_group("nounwind " + attrs)
    b = Builder(fn)
    ctx, chunk, nchunks = fn.param(0), fn.param(1), fn.param(2)
    v = {
        k: b.load("ptr" if i < 4 else "i64", b.gep("i64", ctx, str(i)), k)
        for i, k in enumerate(_CTX)
    }
    lo = b.op("udiv", b.mul(v["planes"], chunk), nchunks, "lo")
    hi = b.op("udiv", b.mul(v["planes"], b.add(chunk, "1")), nchunks, "hi")
    hw, p = b.mul(v["H"], v["Wd"], "HW"), b.mul(v["OH"], v["OW"], "P")
    m_all, taps = str(spec.out_channels), spec.kernel[0] * spec.kernel[1]

    def one(q: str) -> None:
        n, m = b.op("udiv", q, m_all, "n"), b.op("urem", q, m_all, "m")
        xplane = b.add(b.mul(n, str(spec.channels)), b.op("udiv", m, str(spec.mg)), "xplane")
        x = b.gep(ty, v["X"], b.mul(xplane, hw), "x")
        y = b.gep(ty, v["Y"], b.mul(q, p), "y")
        w = b.gep(ty, v["W"], b.mul(m, str(taps)), "w")
        bias = b.load(ty, b.gep(ty, v["B"], m), "bias") if spec.bias else float_literal(0.0, ty)
        sizes = ", ".join(f"i64 {v[k]}" for k in ("H", "Wd", "OH", "OW", "pt", "pl"))
        fn.add(f"call void @{plane}(ptr {x}, ptr {w}, ptr {y}, {ty} {bias}, {sizes})")

    b.loop(lo, hi, one, "q")
    fn.terminate("ret void")
    return fn


def _plane_function(module: ModuleWriter, name: str, spec: ConvSpec, attrs: str) -> FunctionWriter:
    """``void @name(ptr x, ptr w, ptr y, T bias, i64 H, i64 Wd, i64 OH, i64 OW, i64 pt,
    i64 pl)``: one output plane (see the module docstring)."""
    ty, _ = TYPES[spec.dtype]
    params = [("ptr noalias", n) for n in ("x", "w", "y")] + [(ty, "bias")]
    params += [("i64", n) for n in ("H", "Wd", "OH", "OW", "pt", "pl")]
    fn = FunctionWriter(name, "void", params)
    fn.linkage = "internal"
    fn.attrs = " " + module.attr_group("nounwind noinline " + attrs)
    b = Builder(fn)
    x, w, y, bias, h, wd, oh_n, ow, pt, pl = (fn.param(i) for i in range(len(params)))
    (kh, kw), (sh, sw), (dh, dw) = spec.kernel, spec.strides, spec.dilations

    def tap(yrow: str, xrow: str, i: str, j: str) -> None:
        wv = b.load(ty, b.gep(ty, w, b.add(b.mul(i, str(kw)), j)), "wv")
        off = b.sub(b.mul(j, str(dw)), pl, "off")  # iw = ow * sw + off
        lo = b.min(b.max(b.ceildiv(b.sub("0", off), sw), "0"), ow, "lo")
        last = b.add(b.floordiv(b.sub(b.sub(wd, "1"), off), sw), "1")
        hi = b.max(lo, b.min(last, ow), "hi")

        def column(o: str) -> None:
            src = b.gep(ty, xrow, b.add(b.mul(o, str(sw)), off), "src")
            dst = b.gep(ty, yrow, o, "dst")
            prod = fn.value(f"fmul contract {ty} {wv}, {b.load(ty, src, 'xv')}", "prod")
            acc = fn.value(f"fadd contract {ty} {b.load(ty, dst, 'acc')}, {prod}", "sum")
            fn.add(f"store {ty} {acc}, ptr {dst}")

        b.loop(lo, hi, column, "ow")

    def out_row(oh: str) -> None:
        yrow = b.gep(ty, y, b.mul(oh, ow), "yrow")
        b.loop("0", ow, lambda o: fn.add(f"store {ty} {bias}, ptr {b.gep(ty, yrow, o)}"), "fill")

        def kernel_row(i: str) -> None:
            ih = b.add(b.sub(b.mul(oh, str(sh)), pt), b.mul(i, str(dh)), "ih")
            inside = b.all_of([b.cmp("sge", ih, "0"), b.cmp("slt", ih, h)])

            def taps() -> None:
                xrow = b.gep(ty, x, b.mul(ih, wd), "xrow")
                b.loop(
                    "0",
                    str(kw),
                    lambda j: tap(yrow, xrow, i, j),
                    "kj",
                    meta=Builder.no_unroll(module),
                )

            b.when(inside, taps, "inside")

        b.loop("0", str(kh), kernel_row, "ki", meta=Builder.no_unroll(module))

    b.loop("0", oh_n, out_row, "oh")
    fn.terminate("ret void")
    return fn
