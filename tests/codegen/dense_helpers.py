"""Helpers shared by the dense-step tests (GEMMs with fused epilogues, operands in place)."""

from __future__ import annotations

import numpy as np
import pytest

import geode
from geode.runtime import native

#: skips a module whose dense steps use the packed-weight GEMM where this CPU lacks it
needs_packed = pytest.mark.skipif(
    native.pool_info()["gemm_packed_isa"] < 1, reason="the packed kernel needs AVX2 + FMA"
)


def close(got: np.ndarray, want: np.ndarray, rtol: float = 1e-4) -> None:
    """``got`` within ``rtol`` of ``want``, and within 1e-5 of its largest magnitude."""
    scale = float(np.abs(want).max()) if want.size else 1.0
    np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-5 * (scale or 1.0))


def dense_kernels(model: geode.Model) -> list:
    """The model's dense steps (GEMMs with their fused epilogues)."""
    return [k for k in model.kernels if k.kind == "dense"]


def compile_fresh(g: geode.Graph, threads: int = 2, **opts: object) -> geode.Model:
    """``g`` compiled in a session of its own, without the model cache."""
    return geode.compile(g, session=geode.Session(), model_cache=False, num_threads=threads, **opts)


def rand(rng: np.random.Generator, *shape: int) -> np.ndarray:
    """Standard normal float32 values of ``shape`` from ``rng``."""
    return rng.standard_normal(shape).astype(np.float32)
