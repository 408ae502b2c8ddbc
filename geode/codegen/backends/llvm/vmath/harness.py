"""A small llvmlite harness running one vmath function over numpy arrays: a loop
``y[i] = f(x0[i], ...)`` compiled at O3 (new pass manager) for the host with MCJIT.

For tests and measurements of the vmath functions outside geode's backend: it shows the
optimized IR and assembly (to check that the loop vectorizes) and can wrap the call in
caller instructions with fast-math flags (to check that the inlined vmath code keeps
IEEE semantics under them).
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from geode.errors import CodegenError

from . import DTYPES, VmathTarget, arity, definitions, function_name

__all__ = ["CompiledLoop", "compile_loop", "loop_ir"]


@functools.lru_cache(maxsize=1)
def _host() -> tuple[str, str, str]:
    """(triple, CPU name, features) of the host."""
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    try:
        features = llvm.get_host_cpu_features().flatten()
    except RuntimeError:
        features = ""
    return llvm.get_process_triple(), llvm.get_host_cpu_name(), features


def _host_machine(features: str | None = None) -> Any:
    """A new target machine for the host (an MCJIT engine takes ownership of its
    machine, so each compile gets its own), with the host's features or ``features``."""
    import llvmlite.binding as llvm

    triple, cpu, host_features = _host()
    return llvm.Target.from_triple(triple).create_target_machine(
        cpu=cpu, features=host_features if features is None else features, opt=3, jit=True
    )


def loop_ir(
    op: str,
    dtype: str,
    *,
    ieee: bool = False,
    target: VmathTarget | None = None,
    caller_flags: str | None = None,
    vector_width: int = 512,
    name: str | None = None,
    features: str | None = None,
) -> str:
    """IR text of a module defining ``void @apply(ptr y, ptr x0, [ptr x1,] i64 n, T s)``:
    ``y[i] = f(x0[i], ...)`` for vmath function ``op``. With ``caller_flags`` (a string of
    fast-math flags, possibly empty) the loop computes ``f(x0[i] * s, ...) * s`` with
    those flags on both multiplies (pass ``s = 1``): caller code with flags around the
    inlined function. ``vector_width`` is the ``prefer-vector-width`` attribute.
    ``name`` calls that vmath function instead of ``op``'s (same signature, e.g.
    ``geode.vm.erf_legacy.f32`` for A/B measurements); ``features`` replaces the host's
    CPU feature string (e.g. the host's without AVX-512, to check an AVX2 target) and,
    without ``target``, gives the vmath target."""
    triple, cpu, host_features = _host()
    if target is None:
        target = (
            VmathTarget.host() if features is None else VmathTarget.from_features(triple, features)
        )
    features = host_features if features is None else features
    ty = {"float32": "float", "float64": "double"}[dtype]
    size = 4 if dtype == "float32" else 8
    fn = name or function_name(op, dtype, ieee)
    nargs = arity(op)
    lines = [
        "entry:",
        "  %c = icmp sgt i64 %n, 0",
        "  br i1 %c, label %loop, label %exit",
        "loop:",
        "  %i = phi i64 [ 0, %entry ], [ %i.next, %loop ]",
    ]
    args = []
    for j in range(nargs):
        lines.append(f"  %p{j} = getelementptr inbounds {ty}, ptr %x{j}, i64 %i")
        lines.append(f"  %a{j} = load {ty}, ptr %p{j}, align {size}")
        arg = f"%a{j}"
        if caller_flags is not None:
            lines.append(f"  %b{j} = fmul {caller_flags} {ty} {arg}, %s")
            arg = f"%b{j}"
        args.append(f"{ty} {arg}")
    lines.append(f"  %r = call {ty} @{fn}({', '.join(args)})")
    res = "%r"
    if caller_flags is not None:
        lines.append(f"  %r2 = fmul {caller_flags} {ty} %r, %s")
        res = "%r2"
    lines += [
        f"  %py = getelementptr inbounds {ty}, ptr %y, i64 %i",
        f"  store {ty} {res}, ptr %py, align {size}",
        "  %i.next = add nuw nsw i64 %i, 1",
        "  %done = icmp eq i64 %i.next, %n",
        "  br i1 %done, label %exit, label %loop",
        "exit:",
        "  ret void",
    ]
    params = ["ptr noalias nocapture %y"]
    params += [f"ptr noalias nocapture readonly %x{j}" for j in range(nargs)]
    params += ["i64 %n", f"{ty} %s"]
    attrs = f'nounwind "target-cpu"="{cpu}" "target-features"="{features}"'
    if vector_width:
        attrs += f' "prefer-vector-width"="{vector_width}"'
    apply_fn = "\n".join([f"define void @apply({', '.join(params)}) #0 {{", *lines, "}"])
    return "\n".join(
        [
            definitions([fn], target).text,
            apply_fn,
            f"attributes #0 = {{ {attrs} }}",
            "",
        ]
    )


@dataclass
class CompiledLoop:
    """A compiled ``apply`` loop (see :func:`loop_ir`) callable on numpy arrays."""

    dtype: str
    nargs: int
    #: the module's IR after the O3 pipeline
    optimized_ir: str
    #: the machine code, as assembly text
    asm: str
    #: the compiled loop, a ctypes function ``(y, x0, [x1,] n, s)`` taking addresses
    cfunc: Any = field(repr=False)
    _engine: Any = field(repr=False)

    def __call__(self, *xs: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """``f`` elementwise over the contiguous 1-d arrays ``xs`` of the loop's dtype."""
        if len(xs) != self.nargs:
            raise CodegenError(f"vmath harness: {self.nargs} input arrays expected, got {len(xs)}")
        dt = np.dtype(self.dtype)
        n = xs[0].size
        for x in xs:
            if x.dtype != dt or x.ndim != 1 or not x.flags.c_contiguous or x.size != n:
                raise CodegenError(
                    f"vmath harness: inputs must be contiguous 1-d {self.dtype} arrays of one "
                    f"size, got {x.dtype} shape {x.shape}"
                )
        y = np.empty(n, dt) if out is None else out
        if y.dtype != dt or y.shape != (n,) or not y.flags.c_contiguous:
            raise CodegenError(f"vmath harness: out must be a contiguous {self.dtype}[{n}]")
        ptrs = [y.ctypes.data, *(x.ctypes.data for x in xs)]
        self.cfunc(*ptrs, n, 1.0)
        return y


def compile_loop(
    op: str,
    dtype: str,
    *,
    ieee: bool = False,
    target: VmathTarget | None = None,
    caller_flags: str | None = None,
    vector_width: int = 512,
    name: str | None = None,
    features: str | None = None,
) -> CompiledLoop:
    """Compile :func:`loop_ir` at O3 for the host (MCJIT); see there for the options."""
    import llvmlite.binding as llvm

    if dtype not in DTYPES:
        raise CodegenError(f"vmath harness: dtype {dtype!r} is not float32/float64")
    text = loop_ir(
        op,
        dtype,
        ieee=ieee,
        target=target,
        caller_flags=caller_flags,
        vector_width=vector_width,
        name=name,
        features=features,
    )
    tm = _host_machine(features)
    mod = llvm.parse_assembly(text)
    mod.verify()
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    optimized = str(mod)
    asm = tm.emit_assembly(mod)
    engine = llvm.create_mcjit_compiler(mod, tm)
    engine.finalize_object()
    addr = engine.get_function_address("apply")
    scalar = ctypes.c_float if dtype == "float32" else ctypes.c_double
    nargs = arity(op)
    proto = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * (nargs + 1)), ctypes.c_int64, scalar)
    return CompiledLoop(dtype, nargs, optimized, asm, proto(addr), engine)
