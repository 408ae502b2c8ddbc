"""Conv (1-D and 2-D, NCHW) as native kernels with the kernels' ABI, compiled from IR
written here: the whole convolution, batch and groups included, is one call into
machine code (no Python between images or groups).

A :class:`ConvSpec` holds what is fixed when a model is compiled (dtype, channels,
the weights' static shape, group, strides, dilations, pads or ``auto_pad``, bias or
not); the batch and the spatial sizes are read from the arrays at run time (SAME pads
are computed from them). :func:`conv_kernel` compiles one entry per spec
(``int32 entry(ptrs, recs, ints)``, arrays ``X, W, [B], Y``, ints the thread count):

- the entry checks every record (status ``i + 1`` for a bad argument ``i``: rank,
  item size, X's channels, W's exact shape, B's length, Y's shape against the output
  size the geometry gives) before touching memory, then calls the method's body;
- the body is chosen by shape when the spec is made (:attr:`ConvSpec.method`):
  ``pointwise`` (1x1, stride 1, no padding: each image's group of channels already is
  the GEMM's right operand), ``direct`` (windows of 2 to 64 taps at horizontal stride
  1 or 2, :mod:`~.conv_direct`: a register-blocked loop nest, no GEMM), ``im2col`` (the
  rest, or any non-depthwise conv with ``choice="im2col"``, :mod:`~.conv_gemm`) or
  ``depthwise`` (one input channel per group, :mod:`~.conv_depthwise`: a direct loop
  nest, no GEMM) or ``winograd`` (float32 3x3 stride-1 convs by shape or by
  ``choice="winograd"``, :mod:`~.conv_winograd`: the native runtime's F(2x2, 3x3) or
  F(4x4, 3x3) kernel; its ``W`` is the weight's transform, ``(16 or 36, M, C)``). A 1-D conv is the 2-D
  one with ``H = 1``.
- the epilogue (a FusedConv's residual ``Z`` and Relu) is applied by the direct and
  Winograd kernels to each output tile in registers; after the other bodies, by one pass over Y
  (:func:`epilogue_function`). A MaxPool (``ConvSpec.pool``) is the direct kernel's only:
  Y is then the pooled output, its shape checked against the pooled sizes.
- status ``n_arrays + 1`` says the body could not allocate its scratch buffer,
  ``n_arrays + 2`` that the input leaves no output position (an output dim below 1);
  :class:`ConvKernel` raises :class:`~geode.errors.ExecutionError` and
  :class:`~geode.errors.ShapeError` for them.

Results match the reference kernel (:func:`geode.compiler.ops.nn.conv_nd`) to rounding:
both sum the same products, in another order.
"""

from __future__ import annotations

import hashlib
import time

from geode.codegen.backends.llvm import conv_depthwise, conv_direct, conv_gemm, conv_winograd
from geode.codegen.backends.llvm.compiled import ArgSpec, Emitted, LLVMKernel
from geode.codegen.backends.llvm.conv_spec import TYPES, ConvSpec, Geometry
from geode.codegen.backends.llvm.irloops import Builder
from geode.codegen.backends.llvm.irtext import FunctionWriter, ModuleWriter
from geode.codegen.backends.llvm.kernel import build_module, while_alive
from geode.codegen.backends.llvm.objcache import CacheDir
from geode.errors import ExecutionError, ShapeError

__all__ = [
    "ConvKernel",
    "ConvSpec",
    "conv_ir",
    "conv_kernel",
    "out_size",
]


def out_size(b: Builder, spec: ConvSpec, axis: int, size: str) -> tuple[str, str]:
    """``(output size, begin pad)`` of spatial ``axis`` for an input of ``size`` (the
    conv formula; ``spec``: any window spec with ``kernel``, ``strides``, ``dilations``,
    ``auto_pad`` and ``explicit_pads``)."""
    k, s, d = spec.kernel[axis], spec.strides[axis], spec.dilations[axis]
    span = d * (k - 1) + 1
    if spec.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = b.ceildiv(size, s, "out")
        need = b.sub(b.add(b.mul(b.sub(out, "1"), str(s)), str(span)), size)
        total = b.max(need, "0", "padtot")
        small = b.op("sdiv", total, "2", "padhalf")
        begin = small if spec.auto_pad == "SAME_UPPER" else b.sub(total, small, "padbeg")
        return out, begin
    pads = spec.explicit_pads
    pb, pe = pads[axis], pads[axis + 2]
    num = b.add(size, str(pb + pe - span))
    return b.add(b.floordiv(num, s), "1", "out"), str(pb)


def _records(b: Builder, spec: ConvSpec) -> tuple[dict[str, list[str]], int]:
    """Check the X, W and B records (statuses 1, 2, 3, each record's rank before its
    other words are read); returns their dims and the index of Y's record."""
    item = TYPES[spec.dtype][1]
    rank = spec.spatial + 2
    kh, kw = spec.kernel
    w_dims = [spec.out_channels, spec.cg] + ([kh, kw] if spec.spatial == 2 else [kw])
    if spec.method == "winograd":  # W is the weight's transform
        w_dims = list(conv_winograd.u_shape(spec))
    want = {"X": (rank, {1: spec.channels}), "W": (len(w_dims), dict(enumerate(w_dims)))}
    if spec.bias:
        want["B"] = (1, {0: spec.out_channels})
    if spec.residual:
        want["Z"] = (rank, {1: spec.out_channels})  # all of Y's dims: checked with Y's
    dims: dict[str, list[str]] = {}
    at = 0

    def word(j: int) -> str:
        return b.load("i64", b.gep("i64", "%recs", str(j)), "r")

    for status, name in enumerate(spec.arrays[:-1], start=1):
        nd, fixed = want[name]
        b.fail_unless(b.cmp("eq", word(at), str(nd)), status)
        got = [word(at + 2 + j) for j in range(nd)]
        conds = [b.cmp("eq", word(at + 1), str(item))]
        conds += [b.cmp("eq", got[j], str(v)) for j, v in fixed.items()]
        b.fail_unless(b.all_of(conds), status)
        dims[name] = got
        at += 2 + nd
    return dims, at


def pooled_size(b: Builder, spec: ConvSpec, size: str, axis: str) -> str:
    """The pooled size of a conv output dim ``size`` (``axis`` "0": H, "1": W); the
    size itself without pooling (or on a 1-D conv's H)."""
    if not spec.pool:
        return size
    k, s = spec.pool[int(axis)], spec.pool[2 + int(axis)]
    begin, end = spec.pool[4 + int(axis)], spec.pool[6 + int(axis)]
    return b.add(b.floordiv(b.add(size, str(begin + end - k)), s), "1", "pooled")


def entry_function(name: str, body: str, spec: ConvSpec) -> FunctionWriter:
    """The entry ``i32 @name(ptrs, recs, ints)``: records checked, geometry computed,
    ``@body`` called (see the module docstring)."""
    fn = FunctionWriter(name, "i32", [("ptr", "ptrs"), ("ptr", "recs"), ("ptr", "ints")])
    fn.attrs = " nounwind"
    b = Builder(fn)
    dims, at = _records(b, spec)
    y_status = len(spec.arrays)
    x = dims["X"]
    n, wd = x[0], x[-1]
    h = x[2] if spec.spatial == 2 else "1"
    oh, pt = out_size(b, spec, 0, h) if spec.spatial == 2 else ("1", "0")
    ow, pl = out_size(b, spec, 1, wd)
    rank = spec.spatial + 2
    poh, pow_ = pooled_size(b, spec, oh, "0"), pooled_size(b, spec, ow, "1")
    y = [b.load("i64", b.gep("i64", "%recs", str(at + j)), "ry") for j in range(2)]
    b.fail_unless(b.cmp("eq", y[0], str(rank)), y_status)
    ydims = [b.load("i64", b.gep("i64", "%recs", str(at + 2 + j)), "ry") for j in range(rank)]
    want = [n, str(spec.out_channels)] + ([poh] if spec.spatial == 2 else []) + [pow_]
    conds = [b.cmp("eq", y[1], str(TYPES[spec.dtype][1]))]
    conds += [b.cmp("eq", g, w) for g, w in zip(ydims, want)]
    b.fail_unless(b.all_of(conds), y_status)
    if spec.residual:
        z_conds = [b.cmp("eq", g, w) for g, w in zip(dims["Z"], want)]
        b.fail_unless(b.all_of(z_conds), spec.arrays.index("Z") + 1, "zshape")
    fits = b.all_of([b.cmp("sgt", v, "0") for v in (oh, ow, poh, pow_)])
    b.fail_unless(fits, len(spec.arrays) + 2, "fits")
    ptrs = [b.load("ptr", b.gep("ptr", "%ptrs", str(i)), a) for i, a in enumerate(spec.arrays)]
    named = dict(zip(spec.arrays, ptrs))
    bias, z = named.get("B", "null"), named.get("Z", "null")
    threads = b.load("i64", "%ints", "threads")
    geo = Geometry(ptrs[0], ptrs[1], bias, ptrs[-1], n, h, wd, oh, ow, pt, pl, threads)
    if spec.method == "winograd":  # the epilogue is in the kernel's tiles
        status = fn.value(f"call i32 @{body}({geo.args()}, ptr {z})", "status")
        fn.terminate(f"ret i32 {status}")
        return fn
    if spec.method == "direct":  # the epilogue is in the kernel's tiles
        pooled = f"i64 {poh}, i64 {pow_}"
        status = fn.value(f"call i32 @{body}({geo.args()}, ptr {z}, {pooled})", "status")
        fn.terminate(f"ret i32 {status}")
        return fn
    status = fn.value(f"call i32 @{body}({geo.args()})", "status")
    if spec.residual or spec.activation:
        ok, bad = fn.label("epi"), fn.label("failed")
        fn.cond_br(fn.value(f"icmp eq i32 {status}, 0", "done"), ok, bad)
        fn.start_block(bad)
        fn.terminate(f"ret i32 {status}")
        fn.start_block(ok)
        count = b.mul(b.mul(n, str(spec.out_channels)), b.mul(oh, ow), "count")
        fn.add(f"call void @{body}.epilogue(ptr {ptrs[-1]}, ptr {z}, i64 {count})")
        fn.terminate("ret i32 0")
        return fn
    fn.terminate(f"ret i32 {status}")
    return fn


def epilogue_function(
    module: ModuleWriter, name: str, spec: ConvSpec, attrs: str
) -> FunctionWriter:
    """``void @name(ptr Y, ptr Z, i64 count)``: the epilogue of a GEMM or depthwise conv,
    a pass over Y after the body: ``Y = act(Y + Z)`` (Z when ``spec.residual``, the
    activation when ``spec.activation``)."""
    ty, _ = TYPES[spec.dtype]
    fn = FunctionWriter(name, "void", [("ptr noalias", "Y"), ("ptr noalias", "Z"), ("i64", "n")])
    fn.linkage = "internal"
    fn.attrs = " " + module.attr_group("nounwind " + attrs)
    b = Builder(fn)

    def one(i: str) -> None:
        at = b.gep(ty, "%Y", i, "at")
        val = b.load(ty, at, "y")
        if spec.residual:
            val = fn.value(f"fadd {ty} {val}, {b.load(ty, b.gep(ty, '%Z', i), 'z')}", "sum")
        if spec.activation == "relu":
            neg = fn.value(f"fcmp olt {ty} {val}, 0.0", "neg")
            val = fn.value(f"select i1 {neg}, {ty} 0.0, {ty} {val}", "relu")
        fn.add(f"store {ty} {val}, ptr {at}")

    b.loop("0", "%n", one, "i")
    fn.terminate("ret void")
    return fn


def conv_ir(spec: ConvSpec, attrs: str = "") -> tuple[str, str]:
    """``(entry name, module IR)`` of the native conv of ``spec`` (the GEMM methods call
    the native runtime's ``geode_gemm``; ``attrs``: the target's function attributes,
    :attr:`~.target.Target.function_attrs`)."""
    digest = hashlib.sha256(repr(spec).encode()).hexdigest()[:12]
    name = f"geode_conv_{spec.method}_{digest}"
    module = ModuleWriter(name)
    body = f"{name}.run"
    if spec.method == "depthwise":
        conv_depthwise.write_body(module, body, spec, attrs)
    elif spec.method == "direct":
        conv_direct.write_body(module, body, spec, attrs)
    elif spec.method == "winograd":
        conv_winograd.write_body(module, body, spec, attrs)
    else:
        conv_gemm.write_body(module, body, spec, attrs)
    tiles = spec.method in ("direct", "winograd")  # the epilogue in the kernel's tiles
    if not tiles and (spec.residual or spec.activation):
        module.add_function(epilogue_function(module, f"{body}.epilogue", spec, attrs))
    module.add_function(entry_function(name, body, spec))
    return name, f"; {spec.describe()}\n" + module.text()


class ConvKernel(LLVMKernel):
    """A compiled native conv of ``spec``: an :class:`LLVMKernel` whose entry may also
    say that its column buffer could not be allocated (raised as
    :class:`ExecutionError`) or that the input leaves no output position for the window
    (:class:`ShapeError`, as the reference kernel raises)."""

    image_kind = "conv"
    spec: ConvSpec

    def _bad_argument(self, i: int) -> None:
        if i == len(self._args):
            what = {
                "depthwise": "padded plane",
                "direct": "padded band",
                "winograd": "Winograd transform",
            }.get(self.spec.method, "im2col column")
            raise ExecutionError(f"kernel {self.name}: out of memory allocating its {what} buffer")
        if i == len(self._args) + 1:
            raise ShapeError(
                f"kernel {self.name}: the input is too small for the window, no output "
                f"position is left ({self.spec.describe()})"
            )
        super()._bad_argument(i)


def _arg_specs(spec: ConvSpec) -> tuple[ArgSpec, ...]:
    """The entry's arrays, with the shapes its errors quote."""
    two = spec.spatial == 2
    kh, kw = spec.kernel
    m, rank = spec.out_channels, spec.spatial + 2
    w_arg = ArgSpec("W", "input", spec.dtype, rank, f"({m}, {spec.cg}, {f'{kh}, ' * two}{kw})")
    if spec.method == "winograd":
        w_arg = ArgSpec("U", "input", spec.dtype, 3, str(conv_winograd.u_shape(spec)))
    args = [
        ArgSpec("X", "input", spec.dtype, rank, f"(N, {spec.channels}, {'H, ' * two}W)"),
        w_arg,
    ]
    if spec.bias:
        args.append(ArgSpec("B", "input", spec.dtype, 1, f"({m},)"))
    if spec.residual:
        args.append(ArgSpec("Z", "input", spec.dtype, rank, f"(N, {m}, {'OH, ' * two}OW)"))
    args.append(ArgSpec("Y", "output", spec.dtype, rank, f"(N, {m}, {'OH, ' * two}OW)"))
    return tuple(args)


@while_alive
def conv_kernel(spec: ConvSpec, cache_dir: CacheDir | None = None) -> ConvKernel | None:
    """The compiled native conv of ``spec`` (object code through the disk cache in
    ``cache_dir`` when given), or None when its method needs a BLAS and none is found."""
    from geode.codegen.backends.llvm.library import blas, share_pool
    from geode.codegen.backends.llvm.target import host

    t0 = time.perf_counter()
    lib = blas()
    needs_blas = spec.method in ("im2col", "pointwise")
    if needs_blas and lib is None:
        return None
    if needs_blas:
        share_pool(lib)  # its GEMMs' threads on the native pool, like MatMul's
    target = host()
    name, ir = conv_ir(spec, target.function_attrs)
    # the runtime: geode_gemm, the pool
    loaded, from_cache = build_module(name, ir, target, cache_dir)
    parallel = spec.method in ("depthwise", "direct", "winograd")
    emitted = Emitted(ir, name, _arg_specs(spec), (), parallel, ())
    seconds = time.perf_counter() - t0
    kernel = ConvKernel(
        f"conv_{spec.method}", emitted, loaded, target, seconds, from_cache, fastmath=False
    )
    kernel.spec = spec
    #: its W argument is the weight's Winograd transform (``driver.library_inputs``)
    kernel.winograd_weight = spec.winograd_tiles if spec.method == "winograd" else ()
    return kernel
