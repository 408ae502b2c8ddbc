"""Helpers shared by the dense-step tests (GEMMs with fused epilogues, operands in place)."""

from __future__ import annotations

import numpy as np

import geode


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
