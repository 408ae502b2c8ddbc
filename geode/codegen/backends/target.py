"""The native target numba compiles geode kernels for: CPU name, features, vector width.

LLVM tunes AVX-512 CPUs (Skylake-SP and later) to prefer 256-bit vectors, so the loop
vectorizer emits ymm code even where zmm code is faster: on the compute-heavier kernels
(exp, tanh, erf in a loop) zmm code measured 1.3-1.5x faster here, and it is never slower
on the memory-bound ones. geode therefore asks numba for the host's features plus
``-prefer-256-bit`` when the host has AVX-512F.

numba reads its feature string once, when its CPU target is first used, for the whole
process. :func:`configure` must run before that: the numba backend calls it on import,
which comes before geode compiles anything. If the process compiled numba code before
(the target is already built), or the user set ``NUMBA_CPU_FEATURES``, geode leaves
numba's choice alone. ``GEODE_VECTOR_WIDTH=256`` keeps LLVM's default; ``512`` or
``auto`` (the default) prefers 512-bit vectors on AVX-512 hosts.

:func:`codegen_fingerprint` is what numba's codegen actually uses (triple, CPU name,
features): the kernel cache keys on it, so kernels compiled for one vector width are
never loaded for another.
"""

from __future__ import annotations

import functools
import logging
import os

from geode.config import OptionError

__all__ = [
    "ENV_VAR",
    "codegen_fingerprint",
    "configure",
    "is_x86",
    "stream_vector_bytes",
    "vector_registers",
    "wanted_features",
]

log = logging.getLogger(__name__)

#: Environment variable choosing the preferred vector width (auto, 256, 512).
ENV_VAR = "GEODE_VECTOR_WIDTH"


def wanted_features(host_features: str, setting: str) -> str | None:
    """The feature string to give numba for ``setting``, or None to keep numba's default.

    >>> wanted_features("+avx2,+avx512f,+fma", "auto")
    '+avx2,+avx512f,+fma,-prefer-256-bit'
    >>> wanted_features("+avx2,-avx512f", "auto") is None
    True
    """
    setting = setting.strip().lower() or "auto"
    if setting not in ("auto", "256", "512"):
        raise OptionError(f"{ENV_VAR}={setting!r}: expected auto, 256 or 512")
    if setting == "256":
        return None
    feats = [f for f in host_features.split(",") if f]
    if "+avx512f" not in feats:
        return None
    feats = [f for f in feats if not f.endswith("prefer-256-bit")]
    return ",".join([*feats, "-prefer-256-bit"])


def _target_built() -> bool:
    from numba.core.registry import cpu_target

    return "_toplevel_target_context" in vars(cpu_target)


def configure() -> bool:
    """Prefer 512-bit vectors for numba's CPU target if it is not built yet (see the module
    docstring). Returns True if the feature string was set by this call."""
    import llvmlite.binding as llvm
    from numba.core import config

    if os.environ.get("NUMBA_CPU_FEATURES") or config.CPU_FEATURES is not None:
        return False
    try:
        host = llvm.get_host_cpu_features().flatten()
    except RuntimeError:  # some hosts cannot report features
        return False
    feats = wanted_features(host, os.environ.get(ENV_VAR, "auto"))
    if feats is None:
        return False
    if _target_built():
        log.debug("numba's CPU target was built before geode: keeping its vector width")
        return False
    config.CPU_FEATURES = feats
    return True


def codegen_fingerprint() -> dict[str, str]:
    """Target triple, CPU name and feature string of numba's CPU codegen (builds it)."""
    from numba.core.registry import cpu_target

    triple, cpu, features = cpu_target.target_context.codegen().magic_tuple()
    return {"triple": str(triple), "cpu_name": str(cpu), "cpu_features": str(features)}


@functools.lru_cache(maxsize=1)
def stream_vector_bytes() -> int:
    """Bytes per non-temporal vector store on numba's target: 64 (AVX-512), 32 (AVX) or 16.
    A streaming store of a whole vector needs an address aligned to this size."""
    feats = set(codegen_fingerprint()["cpu_features"].split(","))
    if "+avx512f" in feats:
        return 64
    return 32 if "+avx" in feats else 16


@functools.lru_cache(maxsize=1)
def vector_registers() -> int:
    """Vector registers of numba's target: 32 with AVX-512, 16 on other x86 (and, not
    measured, elsewhere)."""
    feats = set(codegen_fingerprint()["cpu_features"].split(","))
    return 32 if is_x86() and "+avx512f" in feats else 16


@functools.lru_cache(maxsize=1)
def is_x86() -> bool:
    """Whether numba's target is x86 (``sfence`` orders its non-temporal stores)."""
    triple = codegen_fingerprint()["triple"]
    return triple.startswith(("x86_64", "i386", "i686", "amd64"))
