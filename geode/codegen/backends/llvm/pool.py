"""MaxPool, AveragePool and the global pools (1-D and 2-D, NCHW) as native kernels with
the kernels' ABI, compiled from IR written here: the whole pool, every image and channel,
is one call into machine code.

A :class:`~.pool_spec.PoolSpec` holds what is fixed when a model is compiled (dtype, the
reduction, the window, strides, dilations, pads or ``auto_pad``, ``ceil_mode``,
``count_include_pad``); the batch, the channels and the spatial sizes are read from the
arrays at run time (SAME pads and ceil_mode's sizes are computed from them).
:func:`pool_kernel` compiles one entry per spec (``int32 entry(ptrs, recs, ints)``,
arrays ``X, Y``, ints the thread count):

- the entry checks both records (status ``1`` for X: rank and item size; ``2`` for Y:
  rank, item size, and the shape the geometry gives) before touching memory, then calls
  the body (:mod:`~.pool_body`);
- status ``3`` says the body could not allocate a scratch plane, ``4`` that the input
  leaves no output position (an output dim below 1; a global max of an empty plane);
  :class:`PoolKernel` raises :class:`~geode.errors.ExecutionError` and
  :class:`~geode.errors.ShapeError` for them.

Results are the reference kernels' (:func:`geode.compiler.ops.nn.max_pool_nd`,
:func:`~geode.compiler.ops.nn.avg_pool_nd`, the global pools): max exactly, averages to
rounding (the same taps, summed in another order for the global mean).
"""

from __future__ import annotations

import hashlib
import time

from geode.codegen.backends.llvm import pool_body
from geode.codegen.backends.llvm.compiled import ArgSpec, Emitted, LLVMKernel
from geode.codegen.backends.llvm.conv import out_size
from geode.codegen.backends.llvm.conv_spec import TYPES
from geode.codegen.backends.llvm.irloops import Builder
from geode.codegen.backends.llvm.irtext import FunctionWriter, ModuleWriter
from geode.codegen.backends.llvm.kernel import build_module, while_alive
from geode.codegen.backends.llvm.objcache import CacheDir
from geode.codegen.backends.llvm.pool_spec import PoolSpec
from geode.errors import ExecutionError, ShapeError

__all__ = ["PoolKernel", "PoolSpec", "pool_ir", "pool_kernel"]


def _axis(b: Builder, spec: PoolSpec, axis: int, size: str) -> tuple[str, str, str, str]:
    """``(output size, begin pad, lo, hi)`` of spatial ``axis`` for an input of ``size``:
    the conv formula, rounded up under ``ceil_mode`` (less a last window that would start
    in the end padding, as ONNX says); ``[lo, hi)``: the padded coordinates an average
    counts."""
    out, begin = out_size(b, spec, axis, size)
    k, s, d = spec.kernel[axis], spec.strides[axis], spec.dilations[axis]
    span = d * (k - 1) + 1
    if spec.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        need = b.sub(b.add(b.mul(b.sub(out, "1"), str(s)), str(span)), size)
        end = b.sub(b.max(need, "0"), begin, "padend")
    else:
        end = str(spec.explicit_pads[axis + 2])
        if spec.ceil_mode and spec.auto_pad == "NOTSET":
            c = b.add(b.ceildiv(b.add(size, str(int(begin) + int(end) - span)), s), "1")
            last = b.mul(b.sub(c, "1"), str(s))
            drop = b.cmp("sge", last, b.add(size, begin))
            out = b.select(drop, b.sub(c, "1"), c, "outc")
    if spec.count_include_pad:
        return out, begin, "0", b.add(b.add(size, begin), end, "hi")
    return out, begin, begin, b.add(size, begin, "hi")


def entry_function(name: str, body: str, spec: PoolSpec) -> FunctionWriter:
    """The entry ``i32 @name(ptrs, recs, ints)``: records checked, geometry computed,
    ``@body`` called (see the module docstring)."""
    fn = FunctionWriter(name, "i32", [("ptr", "ptrs"), ("ptr", "recs"), ("ptr", "ints")])
    fn.attrs = " nounwind"
    b = Builder(fn)
    rank, item = spec.spatial + 2, str(TYPES[spec.dtype][1])

    def word(j: int) -> str:
        return b.load("i64", b.gep("i64", "%recs", str(j)), "r")

    b.fail_unless(b.cmp("eq", word(0), str(rank)), 1)
    b.fail_unless(b.cmp("eq", word(1), item), 1)
    x = [word(2 + j) for j in range(rank)]
    n, c, wd = x[0], x[1], x[-1]
    h = x[2] if spec.spatial == 2 else "1"
    if spec.is_global:
        oh = ow = "1"
        pt = pl = hlo = wlo = "0"
        hhi, whi = h, wd
        fits = b.cmp("sgt", b.mul(h, wd), "0") if spec.op == "max" else "true"
    else:
        oh, pt, hlo, hhi = _axis(b, spec, 0, h) if spec.spatial == 2 else ("1", "0", "0", "1")
        ow, pl, wlo, whi = _axis(b, spec, 1, wd)
        fits = b.all_of([b.cmp("sgt", oh, "0"), b.cmp("sgt", ow, "0")])
    at = 2 + rank
    b.fail_unless(b.cmp("eq", word(at), str(rank)), 2)
    want = [n, c] + ([oh] if spec.spatial == 2 else []) + [ow]
    conds = [b.cmp("eq", word(at + 1), item)]
    conds += [b.cmp("eq", word(at + 2 + j), w) for j, w in enumerate(want)]
    b.fail_unless(b.all_of(conds), 2)
    b.fail_unless(fits, 4, "fits")
    xp, yp = (b.load("ptr", b.gep("ptr", "%ptrs", str(i)), a) for i, a in enumerate("XY"))
    threads = b.load("i64", "%ints", "threads")
    ints = [b.mul(n, c, "planes"), h, wd, oh, ow, pt, pl, hlo, hhi, wlo, whi, threads]
    args = ", ".join([f"ptr {xp}", f"ptr {yp}", *(f"i64 {v}" for v in ints)])
    status = fn.value(f"call i32 @{body}({args})", "status")
    fn.terminate(f"ret i32 {status}")
    return fn


def pool_ir(spec: PoolSpec, attrs: str = "") -> tuple[str, str]:
    """``(entry name, module IR)`` of the native pool of ``spec`` (``attrs``: the target's
    function attributes, :attr:`~.target.Target.function_attrs`)."""
    digest = hashlib.sha256(repr(spec).encode()).hexdigest()[:12]
    name = f"geode_{spec.op}pool_{digest}"
    module = ModuleWriter(name)
    body = f"{name}.run"
    pool_body.write_body(module, body, spec, attrs)
    module.add_function(entry_function(name, body, spec))
    return name, f"; {spec.describe()}\n" + module.text()


class PoolKernel(LLVMKernel):
    """A compiled native pool of ``spec``: an :class:`LLVMKernel` whose entry may also
    say that a scratch plane could not be allocated (raised as :class:`ExecutionError`)
    or that the input leaves no output position (:class:`ShapeError`, as the reference
    kernel raises)."""

    image_kind = "pool"
    spec: PoolSpec

    def _bad_argument(self, i: int) -> None:
        if i == 2:
            raise ExecutionError(f"kernel {self.name}: out of memory allocating its padded plane")
        if i == 3:
            raise ShapeError(
                f"kernel {self.name}: the input is too small for the window, no output "
                f"position is left ({self.spec.describe()})"
            )
        super()._bad_argument(i)


def _arg_specs(spec: PoolSpec) -> tuple[ArgSpec, ...]:
    """The entry's arrays, with the shapes its errors quote."""
    two = spec.spatial == 2
    rank = spec.spatial + 2
    out = ("1, " * two + "1") if spec.is_global else ("OH, " * two + "OW")
    return (
        ArgSpec("X", "input", spec.dtype, rank, f"(N, C, {'H, ' * two}W)"),
        ArgSpec("Y", "output", spec.dtype, rank, f"(N, C, {out})"),
    )


@while_alive
def pool_kernel(spec: PoolSpec, cache_dir: CacheDir | None = None) -> PoolKernel:
    """The compiled native pool of ``spec`` (object code through the disk cache in
    ``cache_dir`` when given)."""
    from geode.codegen.backends.llvm.target import host

    t0 = time.perf_counter()
    target = host()
    name, ir = pool_ir(spec, target.function_attrs)
    loaded, from_cache = build_module(name, ir, target, cache_dir)
    emitted = Emitted(ir, name, _arg_specs(spec), (), True, ())
    seconds = time.perf_counter() - t0
    kind = "global_" * spec.is_global + f"{spec.op}pool"
    kernel = PoolKernel(kind, emitted, loaded, target, seconds, from_cache, fastmath=False)
    kernel.spec = spec
    return kernel
