"""Codegen: a fused group in, a native kernel out (lower, schedule, emit).

Importing the package installs its backend target's fingerprint in the kernel cache's
keys (:func:`geode.codegen.cache.set_target_fingerprint`): the cache is used by the
backends, so it does not import them. It also installs the LLVM backend's kernels as
the ones the device calibration measures with
(:func:`geode.costmodel.device.set_kernel_provider`), so calibrating needs no numba.
"""

from geode.codegen import cache as _cache
from geode.costmodel import device as _device


def _target_fingerprint() -> dict[str, str]:
    from geode.codegen.backends.target import codegen_fingerprint

    return codegen_fingerprint()


_cache.set_target_fingerprint(_target_fingerprint)


def _calibration_kernels() -> dict:
    from geode.codegen.backends.llvm.calibration import kernels

    return kernels()


_device.set_kernel_provider(_calibration_kernels)
