"""The Winograd method of a native conv (:mod:`~.conv`): the body calls the native
runtime's ``geode_conv_winograd`` (``runtime/native/winograd.c``: F(2x2, 3x3) or
F(4x4, 3x3) by ``ConvSpec.tile_side``, the bias, the residual and Relu applied to
each output tile before its one store, items over the native pool).

Its ``W`` argument is not the conv's weight but the weight's Winograd transform
``U = G g G^T``, computed once when the model is compiled or loaded
(:func:`geode.codegen.winograd_weights.winograd_value`): float32 of shape
``(P, M, C)`` (:func:`u_shape`), checked by the entry like any weight.
"""

from __future__ import annotations

from geode.codegen.backends.llvm.conv_spec import BODY_PARAMS, ConvSpec, body_geometry
from geode.codegen.backends.llvm.irtext import FunctionWriter, ModuleWriter

__all__ = ["WINOGRAD_DECL", "u_shape", "write_body"]

#: the native runtime's Winograd conv, as JIT code declares it
WINOGRAD_DECL = (
    "declare i32 @geode_conv_winograd(ptr, ptr, ptr, ptr, ptr, i64, i64, i64, i64, i64, "
    "i64, i64, i64, i64, i64, i64, i64) nounwind"
)


def u_shape(spec: ConvSpec) -> tuple[int, int, int]:
    """The shape of the transformed weight the entry takes as ``W``: ``(P, M, C)``, ``P``
    the positions of a transformed tile (16 for F(2x2, 3x3), 36 for F(4x4, 3x3))."""
    return ((spec.tile_side + 2) ** 2, spec.out_channels, spec.channels)


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
    tile = spec.tile_side
    ints = ", ".join(f"i64 {v}" for v in (*sizes, geo.pt, geo.pl, relu, tile, geo.threads))
    ptrs = f"ptr {geo.x}, ptr {geo.w}, ptr {geo.b}, ptr %Z, ptr {geo.y}"
    got = fn.value(f"call i32 @geode_conv_winograd({ptrs}, {ints})", "got")
    failed = fn.value(f"icmp ne i32 {got}, 0", "failed")
    status = fn.value(f"select i1 {failed}, i32 {len(spec.arrays) + 1}, i32 0", "status")
    fn.terminate(f"ret i32 {status}")
    module.add_function(fn)
