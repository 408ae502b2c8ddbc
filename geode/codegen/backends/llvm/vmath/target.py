"""What the vmath code depends on in the target CPU."""

from __future__ import annotations

import functools
from dataclasses import dataclass

__all__ = ["VmathTarget"]

_X86_PREFIXES = ("x86_64", "i386", "i486", "i586", "i686", "amd64")


@dataclass(frozen=True)
class VmathTarget:
    """The target properties that change the emitted vmath IR.

    ``has_scalef``: exp's final ``p * 2**n`` is ``llvm.ldexp``, which LLVM lowers to one
    ``vscalefps``/``vscalefpd`` on x86 with AVX-512F and AVX-512VL (the ymm/xmm forms
    need VL); elsewhere vector ``ldexp`` would become libm calls, so it is a product of
    two exact powers of two instead. Both give bit-identical results.

    ``has_fma``: every ``llvm.fmuladd`` becomes one fused multiply-add (x86 with FMA;
    other targets are taken to have it). float32 erf's own form needs it for its bound
    (0.973 ulp; with separate roundings 1.22): without, it is the numba library's form.
    """

    #: the target is x86 (32 or 64 bit)
    is_x86: bool
    #: AVX-512F and AVX-512VL: use ``llvm.ldexp`` (``vscalef``) for exp's scaling
    has_scalef: bool
    #: fused multiply-adds (``+fma`` on x86): float32 erf's own form
    has_fma: bool = True

    @classmethod
    def from_features(cls, triple: str, features: str) -> VmathTarget:
        """The target of an LLVM triple and feature string (``+avx2,+avx512f,...``)."""
        is_x86 = triple.startswith(_X86_PREFIXES)
        feats = set(features.split(","))
        return cls(
            is_x86=is_x86,
            has_scalef=is_x86 and {"+avx512f", "+avx512vl"} <= feats,
            has_fma=not is_x86 or "+fma" in feats,
        )

    @staticmethod
    def host() -> VmathTarget:
        """The host CPU (``llvm.get_host_cpu_features``), computed once per process."""
        return _host()


@functools.lru_cache(maxsize=1)
def _host() -> VmathTarget:
    import llvmlite.binding as llvm

    try:
        features = llvm.get_host_cpu_features().flatten()
    except RuntimeError:  # some hosts cannot report their features
        features = ""
    return VmathTarget.from_features(llvm.get_process_triple(), features)
