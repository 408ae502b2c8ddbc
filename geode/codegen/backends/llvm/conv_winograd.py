"""The Winograd method of a native conv (:mod:`~.conv`): the body calls the native
runtime's ``geode_conv_winograd`` (``runtime/native/winograd.c``: F(2x2, 3x3) or
F(4x4, 3x3) by ``ConvSpec.tile_side``, the bias, the residual and Relu applied to
each output tile before its one store, items over the native pool).

Its ``W`` argument is not the conv's weight but the weight's Winograd transform
``U = G g G^T``, computed once when the model is compiled or loaded
(:func:`geode.codegen.winograd_weights.winograd_value`): float32 of shape
``(P, M, C)`` (:func:`u_shape`), checked by the entry like any weight. When the output
width is known only at run time the kernel takes both transforms, one after the other,
and the body picks the tile by the width (``ConvSpec.tile_side`` 0).
"""

from __future__ import annotations

from geode.codegen.backends.llvm.conv_spec import (
    BODY_PARAMS,
    WINOGRAD_F4_MIN_WIDTH,
    WINOGRAD_F4_NARROW,
    ConvSpec,
    body_geometry,
)
from geode.codegen.backends.llvm.irtext import FunctionWriter, ModuleWriter

__all__ = ["WINOGRAD_DECL", "u_shape", "write_body"]

#: the native runtime's Winograd conv, as JIT code declares it
WINOGRAD_DECL = (
    "declare i32 @geode_conv_winograd(ptr, ptr, ptr, ptr, ptr, i64, i64, i64, i64, i64, "
    "i64, i64, i64, i64, i64, i64, i64) nounwind"
)


def u_shape(spec: ConvSpec) -> tuple[int, int, int]:
    """The shape of the transformed weight the entry takes as ``W``: ``(P, M, C)``, ``P``
    the positions of a transformed tile (16 for F(2x2, 3x3), 36 for F(4x4, 3x3)), summed
    over the spec's tiles (52: both, F(2x2)'s first)."""
    positions = sum((t + 2) ** 2 for t in spec.winograd_tiles)
    return (positions, spec.out_channels, spec.channels)


def write_body(module: ModuleWriter, name: str, spec: ConvSpec, attrs: str) -> None:
    """``i32 @name(X, U, B, Y, N, H, Wd, OH, OW, pt, pl, threads, Z)``: the conv through
    ``geode_conv_winograd``, its epilogue included; status 0, or the entry's
    out-of-memory status (``len(spec.arrays) + 1``) when a thread's scratch buffer could
    not be allocated."""
    module.declare("geode_conv_winograd", WINOGRAD_DECL)
    fn = FunctionWriter(name, "i32", [*BODY_PARAMS, ("ptr noalias", "Z")])
    fn.linkage = "internal"
    fn.attrs = " " + module.attr_group("nounwind " + attrs)
    geo = body_geometry(fn)
    relu = int(spec.activation == "relu")
    sizes = (geo.n, spec.channels, spec.out_channels, geo.h, geo.wd, geo.oh, geo.ow)
    tile, u = str(spec.tile_side), geo.w
    if not spec.tile_side:  # both transforms: the tile by the output width, at run time
        narrow = _narrow(fn, geo.ow)
        tile = fn.value(f"select i1 {narrow}, i64 2, i64 4", "tile")
        skip = 16 * spec.out_channels * spec.channels  # F(2x2)'s positions come first
        u4 = fn.value(f"getelementptr float, ptr {geo.w}, i64 {skip}", "u4")
        u = fn.value(f"select i1 {narrow}, ptr {geo.w}, ptr {u4}", "u")
    ints = ", ".join(f"i64 {v}" for v in (*sizes, geo.pt, geo.pl, relu, tile, geo.threads))
    ptrs = f"ptr {geo.x}, ptr {u}, ptr {geo.b}, ptr %Z, ptr {geo.y}"
    got = fn.value(f"call i32 @geode_conv_winograd({ptrs}, {ints})", "got")
    failed = fn.value(f"icmp ne i32 {got}, 0", "failed")
    status = fn.value(f"select i1 {failed}, i32 {len(spec.arrays) + 1}, i32 0", "status")
    fn.terminate(f"ret i32 {status}")
    module.add_function(fn)


def _narrow(fn: FunctionWriter, ow: str) -> str:
    """``i1``: whether the output width ``ow`` takes F(2x2, 3x3) (``conv_spec.f4_width``
    false: below :data:`WINOGRAD_F4_MIN_WIDTH` columns and outside
    :data:`WINOGRAD_F4_NARROW`)."""
    lo, hi = WINOGRAD_F4_NARROW
    below = fn.value(f"icmp slt i64 {ow}, {WINOGRAD_F4_MIN_WIDTH}", "below")
    under = fn.value(f"icmp slt i64 {ow}, {lo}", "under")
    over = fn.value(f"icmp sgt i64 {ow}, {hi}", "over")
    outside = fn.value(f"or i1 {under}, {over}", "outside")
    return fn.value(f"and i1 {below}, {outside}", "narrow")
