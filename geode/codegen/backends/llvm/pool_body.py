"""The body of a native pool (:mod:`~.pool`): every ``(n, c)`` plane reduced window by
window, directly (the structure of :mod:`~.conv_depthwise`, with a max or a sum in place
of the weighted sum).

With padding, a plane is first copied into a scratch plane of exactly the rows and
columns the windows reach (:func:`~.conv_depthwise.padded_size`, ceil_mode's extra end
included), bordered with ``-inf`` for a max (a pad never wins unless the whole window is
padding, then the result is ``-inf``, as the reference kernel's) and ``0`` for an
average; without, the windows read the input in place. Then each output element is the
reduction of its ``kh * kw`` taps: up to :data:`~.conv_depthwise.MAX_UNROLLED_TAPS`
taps in registers, one loop over the row's columns that LLVM vectorizes; larger windows
reduce tap by tap into the output row. Max is ``llvm.maximum`` (a NaN tap gives NaN, as
numpy's ``max``); an average divides the sum by its count of taps inside ``[lo, hi)`` per
axis (the input, or with ``count_include_pad`` the explicitly padded input), computed in
closed form per row and column (a window of no counted tap gives ``0 / 0 = NaN``, as the
reference's).

A global pool reduces each contiguous plane in one vectorized loop (the sum reassociated
into lanes, then divided by ``H * W``).

Planes are shared among the native pool's threads (:mod:`~.parallel`'s launcher); below
:data:`~.parallel.MIN_PARALLEL_ELEMENTS` taps the calling thread does all. A chunk's
scratch plane that ``malloc`` cannot give sets the failure flag: status ``3``.
"""

from __future__ import annotations

from geode.codegen.backends.llvm.conv_depthwise import (
    MAX_UNROLLED_TAPS,
    chunk_start,
    pad_function,
    scratch_plane,
)
from geode.codegen.backends.llvm.conv_spec import TYPES
from geode.codegen.backends.llvm.irloops import Builder
from geode.codegen.backends.llvm.irtext import FunctionWriter, ModuleWriter, float_literal
from geode.codegen.backends.llvm.parallel import LAUNCH, MIN_PARALLEL_ELEMENTS
from geode.codegen.backends.llvm.pool_spec import BODY_PARAMS, PoolSpec

__all__ = ["write_body"]

_NAMES = [n for _, n in BODY_PARAMS]
#: the chunk function's context: the body's parameters (but threads), the failure flag
_CTX = (*_NAMES[:-1], "failed")


class _Reduce:
    """The max or sum of ``spec`` as IR: identity, one step, the average's division."""

    def __init__(self, module: ModuleWriter, fn: FunctionWriter, spec: PoolSpec):
        self.fn, self.spec = fn, spec
        self.ty = ty = TYPES[spec.dtype][0]
        self.max = spec.op == "max"
        self.identity = float_literal(float("-inf") if self.max else 0.0, ty)
        if self.max:
            sfx = "f32" if ty == "float" else "f64"
            self.intrinsic = f"llvm.maximum.{sfx}"
            module.declare(self.intrinsic, f"declare {ty} @{self.intrinsic}({ty}, {ty})")

    def step(self, acc: str, v: str, flags: str = "") -> str:
        """``max(acc, v)`` or ``acc + v`` (``flags``: the add's fast-math flags)."""
        ty = self.ty
        if self.max:
            return self.fn.value(f"call {ty} @{self.intrinsic}({ty} {acc}, {ty} {v})", "mx")
        return self.fn.value(f"fadd {flags + ' ' if flags else ''}{ty} {acc}, {v}", "sum")

    def divide(self, acc: str, count: str) -> str:
        """``acc / count`` (``count`` an i64)."""
        c = self.fn.value(f"sitofp i64 {count} to {self.ty}", "cnt")
        return self.fn.value(f"fdiv {self.ty} {acc}, {c}", "avg")


def write_body(module: ModuleWriter, name: str, spec: PoolSpec, attrs: str) -> None:
    """Add ``i32 @name(...)`` (see :data:`~.pool_spec.BODY_PARAMS`) computing ``spec``'s
    pool on the native pool; ``attrs``: the target's function attributes."""
    chunk = f"{name}.chunk"
    module.add_function(_chunk_function(module, chunk, spec, attrs))
    module.declare("geode_num_threads", "declare i64 @geode_num_threads() nounwind")
    module.declare(
        "geode_parallel_for", "declare void @geode_parallel_for(ptr, ptr, i64, i64) nounwind"
    )
    module.add_global("geode.launch", LAUNCH)
    fn = FunctionWriter(name, "i32", BODY_PARAMS)
    fn.linkage = "internal"
    fn.attrs = " " + module.attr_group("nounwind " + attrs)
    b = Builder(fn)
    v = {n: fn.param(i) for i, n in enumerate(_NAMES)}
    ctx = fn.alloca(f"[{len(_CTX)} x i64]", "ctx", align=8)
    for i, value in enumerate([*(v[n] for n in _CTX[:-1]), "0"]):
        slot = b.gep("i64", ctx, str(i), "slot")
        fn.add(f"store {'ptr' if i < 2 else 'i64'} {value}, ptr {slot}")
    per_plane = b.mul(v["H"], v["Wd"]) if spec.is_global else b.mul(v["OH"], v["OW"])
    work = b.mul(b.mul(v["planes"], per_plane), str(spec.taps), "work")
    small = b.cmp("slt", work, str(MIN_PARALLEL_ELEMENTS), "small")
    fn.add(
        f"call void @geode.launch(ptr @{chunk}, ptr {ctx}, i64 {v['planes']}, "
        f"i64 {v['threads']}, i1 {small})"
    )
    failed = b.load("i64", b.gep("i64", ctx, str(len(_CTX) - 1)), "failed")
    status = fn.value(f"select i1 {b.cmp('ne', failed, '0')}, i32 {len(spec.arrays) + 1}, i32 0")
    fn.terminate(f"ret i32 {status}")
    module.add_function(fn)


def _chunk_function(module: ModuleWriter, name: str, spec: PoolSpec, attrs: str) -> FunctionWriter:
    """``void @name(ptr ctx, i64 chunk, i64 nchunks)``: this chunk's share of the planes
    (padded into its own scratch plane when the windows reach past the input)."""
    ty, item = TYPES[spec.dtype]
    c = chunk_start(module, name, attrs, _CTX, 2)
    fn, b, v, lo, hi = c.fn, c.b, c.v, c.lo, c.hi
    hw, p = b.mul(v["H"], v["Wd"], "HW"), b.mul(v["OH"], v["OW"], "P")
    if spec.is_global:
        plane = module.unique(f"{name}.global")
        module.add_function(_global_function(module, plane, spec, attrs))

        def one_global(q: str) -> None:
            x = b.gep(ty, v["X"], b.mul(q, hw), "x")
            fn.add(f"call void @{plane}(ptr {x}, ptr {b.gep(ty, v['Y'], q, 'y')}, i64 {hw})")

        b.loop(lo, hi, one_global, "q")
        fn.terminate("ret void")
        return fn
    plane, pad = f"{name}.plane", f"{name}.pad"
    module.add_function(_plane_function(module, plane, spec, attrs))
    fill = float("-inf") if spec.op == "max" else 0.0
    module.add_function(pad_function(module, pad, spec.dtype, attrs, fill))
    scratch_plane(module, c, spec, item)
    padded, hp, wp, buf = c.padded, c.hp, c.wp, c.buf
    ranges = ", ".join(f"i64 {v[k]}" for k in ("OH", "OW", "hlo", "hhi", "wlo", "whi"))

    def one(q: str) -> None:
        x = b.gep(ty, v["X"], b.mul(q, hw), "x")

        def copy() -> None:
            fn.add(
                f"call void @{pad}(ptr {x}, ptr {buf}, i64 {v['H']}, i64 {v['Wd']}, i64 {hp}, "
                f"i64 {wp}, i64 {v['pt']}, i64 {v['pl']})"
            )

        b.when(padded, copy, "copy")
        src = fn.value(f"select i1 {padded}, ptr {buf}, ptr {x}", "src")
        pitch = b.select(padded, wp, v["Wd"], "pitch")
        y = b.gep(ty, v["Y"], b.mul(q, p), "y")
        fn.add(f"call void @{plane}(ptr {src}, i64 {pitch}, ptr {y}, {ranges})")

    b.loop(lo, hi, one, "q")
    fn.add(f"call void @free(ptr {buf})")
    fn.terminate("ret void")
    return fn


def _count(b: Builder, start: str, k: int, d: int, lo: str, hi: str) -> str:
    """How many of the taps ``start + i * d`` (``0 <= i < k``) lie in ``[lo, hi)``."""
    first = b.max(b.ceildiv(b.sub(lo, start), d), "0")
    last = b.min(b.ceildiv(b.sub(hi, start), d), str(k))
    return b.max(b.sub(last, first), "0", "taps")


def _plane_function(module: ModuleWriter, name: str, spec: PoolSpec, attrs: str) -> FunctionWriter:
    """``void @name(ptr p, i64 pitch, ptr y, i64 OH, i64 OW, i64 hlo, i64 hhi, i64 wlo,
    i64 whi)``: one output plane from the (scratch) plane ``p`` of row pitch ``pitch``
    (see the module docstring)."""
    ty, _ = TYPES[spec.dtype]
    (kh, kw), (sh, sw), (dh, dw) = spec.kernel, spec.strides, spec.dilations
    params = [("ptr noalias", "p"), ("i64", "pitch"), ("ptr noalias", "y")]
    params += [("i64", n) for n in ("OH", "OW", "hlo", "hhi", "wlo", "whi")]
    fn = FunctionWriter(name, "void", params)
    fn.linkage = "internal"
    fn.attrs = " " + module.attr_group("nounwind noinline " + attrs)
    b = Builder(fn)
    p, pitch, y, oh_n, ow_n, hlo, hhi, wlo, whi = (fn.param(i) for i in range(len(params)))
    red = _Reduce(module, fn, spec)
    avg = spec.op == "avg"

    def finish(acc: str, rows: str, o: str) -> str:
        """The output value of column ``o`` from its reduction ``acc``."""
        if not avg:
            return acc
        cols = _count(b, b.mul(o, str(sw)), kw, dw, wlo, whi)
        return red.divide(acc, b.mul(rows, cols, "count"))

    def out_row(oh: str) -> None:
        yrow = b.gep(ty, y, b.mul(oh, ow_n), "yrow")
        top = b.mul(oh, str(sh), "top")
        rows = _count(b, top, kh, dh, hlo, hhi) if avg else "0"
        if spec.taps <= MAX_UNROLLED_TAPS:
            prow = [b.gep(ty, p, b.mul(b.add(top, str(i * dh)), pitch), "prow") for i in range(kh)]

            def column(o: str) -> None:
                base, acc = b.mul(o, str(sw), "iw"), ""
                for t in range(spec.taps):
                    i, j = divmod(t, kw)
                    xv = b.load(ty, b.gep(ty, prow[i], b.add(base, str(j * dw))), "xv")
                    acc = xv if not acc else red.step(acc, xv)
                fn.add(f"store {ty} {finish(acc, rows, o)}, ptr {b.gep(ty, yrow, o)}")

            meta = Builder.tail_folded(module) if sw == 1 else ""
            b.loop("0", ow_n, column, "ow", meta=meta)
            return
        init = lambda o: fn.add(f"store {ty} {red.identity}, ptr {b.gep(ty, yrow, o)}")  # noqa: E731
        b.loop("0", ow_n, init, "init")

        def tap(t: str) -> None:
            i, j = b.op("udiv", t, str(kw), "ti"), b.op("urem", t, str(kw), "tj")
            at = b.add(b.mul(b.add(top, b.mul(i, str(dh))), pitch), b.mul(j, str(dw)))
            src_row = b.gep(ty, p, at, "prow")

            def column(o: str) -> None:
                dst = b.gep(ty, yrow, o, "dst")
                xv = b.load(ty, b.gep(ty, src_row, b.mul(o, str(sw))), "xv")
                fn.add(f"store {ty} {red.step(b.load(ty, dst, 'acc'), xv)}, ptr {dst}")

            b.loop("0", ow_n, column, "ow")

        b.loop("0", str(spec.taps), tap, "tap", meta=Builder.no_unroll(module))
        if avg:

            def divide(o: str) -> None:
                dst = b.gep(ty, yrow, o, "dst")
                fn.add(f"store {ty} {finish(b.load(ty, dst, 'acc'), rows, o)}, ptr {dst}")

            b.loop("0", ow_n, divide, "div")

    b.loop("0", oh_n, out_row, "oh")
    fn.terminate("ret void")
    return fn


def _global_function(module: ModuleWriter, name: str, spec: PoolSpec, attrs: str) -> FunctionWriter:
    """``void @name(ptr x, ptr y, i64 n)``: ``*y`` = the max or mean of ``x[0:n]``."""
    ty, _ = TYPES[spec.dtype]
    params = [("ptr noalias", "x"), ("ptr noalias", "y"), ("i64", "n")]
    fn = FunctionWriter(name, "void", params)
    fn.linkage = "internal"
    fn.attrs = " " + module.attr_group("nounwind noinline " + attrs)
    b = Builder(fn)
    x, y, n = fn.param(0), fn.param(1), fn.param(2)
    red = _Reduce(module, fn, spec)
    acc = fn.alloca(ty, "acc")  # promoted to a register (a reduction phi) by LLVM
    fn.add(f"store {ty} {red.identity}, ptr {acc}")

    def step(i: str) -> None:
        xv = b.load(ty, b.gep(ty, x, i), "xv")
        fn.add(f"store {ty} {red.step(b.load(ty, acc, 'cur'), xv, 'reassoc')}, ptr {acc}")

    b.loop("0", n, step, "i")
    out = b.load(ty, acc, "total")
    fn.add(f"store {ty} {red.divide(out, n) if spec.op == 'avg' else out}, ptr {y}")
    fn.terminate("ret void")
    return fn
