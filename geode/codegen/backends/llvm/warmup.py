"""LLVM warmed up before a cold compile needs it: a tiny module compiled and thrown away.

The first module a process compiles costs far more than its size: ``llvmlite.binding``
is imported, LLVM's native target initialized, the thread's target machine made, and
LLVM's own code is paged in and its lazily built tables made on the way (the parser,
the O3 pipeline's passes, the vectorizers, the x86 instruction selector for the host's
features). :func:`warm` pays all of that on the calling thread by compiling
:func:`warm_module`, a small kernel of the shape geode emits (a chunk of a parallel loop
with the vectorizable exp, a NaN guard, a clamp, a division and a sum, carrying the
target's function attributes), and drops the object code: nothing is linked, cached or
claimable. The background threads run it first when a compile starts
(:func:`~geode.codegen.backends.llvm.background.warm_up`), while the calling thread is
still reading the model, so the first real module compiles at its normal speed.
"""

from __future__ import annotations

from geode.codegen.backends.llvm import jit
from geode.codegen.backends.llvm.target import Target

__all__ = ["warm", "warm_module"]

#: the optimization level the module is compiled at (O3: the larger pipeline)
LEVEL = 3

_MODULE = """\
; ModuleID = 'geode.warmup'
declare float @llvm.fmuladd.f32(float, float, float)
declare float @llvm.ldexp.f32.i32(float, i32)
declare float @llvm.maxnum.f32(float, float)

define internal float @geode.warmup.exp(float %x) alwaysinline nounwind willreturn {{
entry:
  %t0 = fcmp ogt float %x, 0x4056400000000000
  %t1 = select i1 %t0, float 0x4056400000000000, float %x
  %t2 = fcmp olt float %t1, 0xC05A000000000000
  %t3 = select i1 %t2, float 0xC05A000000000000, float %t1
  %t4 = call float @llvm.fmuladd.f32(float %t3, float 0x3FF7154760000000, float 0x4168000000000000)
  %t5 = fsub float %t4, 0x4168000000000000
  %t6 = call float @llvm.fmuladd.f32(float %t5, float 0xBFE6300000000000, float %t3)
  %t7 = call float @llvm.fmuladd.f32(float %t5, float 0x3F2BD01060000000, float %t6)
  %t8 = fmul float %t7, %t7
  %t9 = call float @llvm.fmuladd.f32(float 0x3F56D113C0000000, float %t7, float 0x3F8120BA20000000)
  %t10 = call float @llvm.fmuladd.f32(float %t9, float %t7, float 0x3FA55551A0000000)
  %t11 = call float @llvm.fmuladd.f32(float %t10, float %t7, float 0x3FC5554DC0000000)
  %t12 = call float @llvm.fmuladd.f32(float %t11, float %t7, float 0x3FE0000000000000)
  %t13 = call float @llvm.fmuladd.f32(float %t8, float %t12, float %t7)
  %t14 = fadd float %t13, 0x3FF0000000000000
  %t15 = bitcast float %t4 to i32
  %t16 = sub i32 %t15, 1262485504
  %t17 = call float @llvm.ldexp.f32.i32(float %t14, i32 %t16)
  ret float %t17
}}

define void @geode.warmup(ptr noalias %y, ptr noalias %x, i64 %n, i64 %chunk, i64 %nchunks) #0 {{
entry:
  %t0 = mul i64 %n, %chunk
  %lo = udiv i64 %t0, %nchunks
  %t1 = add i64 %t0, %n
  %hi = udiv i64 %t1, %nchunks
  %any = icmp slt i64 %lo, %hi
  br i1 %any, label %loop, label %done
loop:
  %i = phi i64 [ %lo, %entry ], [ %i.next, %loop ]
  %s = phi float [ 0.0, %entry ], [ %s.next, %loop ]
  %px = getelementptr inbounds float, ptr %x, i64 %i
  %v = load float, ptr %px
  %e = call float @geode.warmup.exp(float %v)
  %nan = fcmp uno float %v, 0.0
  %r = select i1 %nan, float %v, float %e
  %m = call float @llvm.maxnum.f32(float %r, float 0.0)
  %d = fdiv reassoc contract float %m, %v
  %py = getelementptr inbounds float, ptr %y, i64 %i
  store float %d, ptr %py
  %s.next = fadd reassoc contract float %s, %d
  %i.next = add nsw i64 %i, 1
  %more = icmp slt i64 %i.next, %hi
  br i1 %more, label %loop, label %sum, !llvm.loop !1
sum:
  %total = phi float [ %s.next, %loop ]
  %pn = getelementptr inbounds float, ptr %y, i64 %n
  store float %total, ptr %pn
  br label %done
done:
  ret void
}}

attributes #0 = {{ nounwind {attrs} }}
!0 = !{{!"llvm.loop.mustprogress"}}
!1 = distinct !{{!1, !0}}
"""


def warm_module(target: Target) -> str:
    """The warm-up module's IR text for ``target`` (its function attributes: the CPU,
    features and vector width every emitted function carries)."""
    return _MODULE.format(attrs=target.function_attrs)


def warm(target: Target) -> None:
    """Compile :func:`warm_module` for ``target`` on the calling thread, with the O3
    pipeline, and drop the object code (LLVM's first-use costs paid; nothing linked
    or cached). Raises what :func:`~geode.codegen.backends.llvm.jit.compile_ir` raises."""
    jit.compile_ir(warm_module(target), target, LEVEL)
