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


def attention_spec(**kw: object) -> object:
    """A batched attention entry's ``DenseSpec`` (``[B, H, S, D]`` operands, a ``[S, S]``
    mask as a ``bfull`` input, the product and one output as the epilogue's) with ``kw``
    replacing its fields: the base the entry's refusal tests vary."""
    from geode.codegen.backends.llvm.dense import DenseSpec, InnerArg, OuterArg

    base = dict(
        name="d",
        dtype="float32",
        a_rank=4,
        b_rank=4,
        outer=(OuterArg("bfull", 2, 1),),
        inner=(InnerArg(-1, "acc", 4), InnerArg(0, "bfull", 1), InnerArg(-2, "full", 4)),
        inner_dims=("rows", "cols"),
        epilogue="ep",
        panel_bytes=1 << 19,
        min_rows=16,
        v_rank=4,
    )
    base.update(kw)
    return DenseSpec(**base)  # type: ignore[arg-type]
