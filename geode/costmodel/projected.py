"""Projected cost model: a per-kernel model over schedule features.

The middle level of PAI's three (SOL < projected < profiling): it knows how a
kernel was scheduled, not just how much work it does. Codegen extracts a
:class:`ScheduleFeatures` record (plain data: this package imports nothing else of
geode) and the model predicts seconds as a weighted sum of physically meaningful
terms, each already in seconds on the given :class:`DeviceSpec`:

============  ==================================================================
term          meaning (seconds)
============  ==================================================================
launch        call overhead, plus the fork/join of a parallel region
roofline      max(memory, arithmetic) at the bandwidth/peak the schedule can use
overlap       min(memory, arithmetic): how imperfectly the two overlap
strided       memory time again when the innermost loop is not contiguous
reread        extra passes over the reduce axis, re-reading the input
temp          traffic of temporaries (two-step reduce partials, stitch buffers)
blocks        per extra loop nest: another fork/join (or loop overhead) each
============  ==================================================================

``predicted = sum(coefficient[t] * term[t])``. The default coefficients are
reasonable priors; :func:`fit` re-estimates them by (relative) least squares from
measured samples, which is how the profiling model calibrates this one.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .device import DeviceSpec

#: The model's terms, in the order of coefficient vectors.
TERMS: tuple[str, ...] = ("launch", "roofline", "overlap", "strided", "reread", "temp", "blocks")

#: Prior coefficients (used until :func:`fit` replaces them).
DEFAULT_COEFFICIENTS: dict[str, float] = {
    "launch": 1.0,
    "roofline": 1.0,
    "overlap": 0.2,
    "strided": 2.0,
    "reread": 0.5,
    "temp": 1.0,
    "blocks": 1.0,
}

#: fp32 SIMD lanes a vectorized loop gains over a scalar one (AVX2 width, which
#: LLVM prefers even on AVX-512 parts).
VECTOR_LANES = 8


@dataclass(frozen=True)
class ScheduleFeatures:
    """What the projected model needs to know about one scheduled kernel.

    Traffic and arithmetic as in :class:`~geode.costmodel.sol.KernelWork`, plus:
    ``contiguous`` (innermost loop walks memory with unit stride), ``vectorized``
    (innermost loop is SIMD), ``parallel_extent`` (iterations of the ``prange``
    loop; 1 means serial), ``reduce_passes`` (passes over the reduce axis: 1 for a
    one-pass reduction, 2 for e.g. mean-then-variance, 0 without reduction),
    ``temp_bytes`` (traffic of temporary buffers) and ``n_blocks`` (loop nests in
    the kernel).
    """

    bytes_read: float
    bytes_written: float
    flops: float
    transcendentals: float = 0.0
    contiguous: bool = True
    vectorized: bool = True
    parallel_extent: int = 1
    reduce_passes: int = 0
    temp_bytes: float = 0.0
    n_blocks: int = 1

    def __post_init__(self) -> None:
        for name in ("bytes_read", "bytes_written", "flops", "transcendentals", "temp_bytes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < math.inf:
                raise ValueError(f"feature {name} must be a finite number >= 0, got {v!r}")
        for name in ("parallel_extent", "reduce_passes", "n_blocks"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"feature {name} must be an int >= 0, got {v!r}")
        for name in ("contiguous", "vectorized"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"feature {name} must be a bool, got {getattr(self, name)!r}")

    @classmethod
    def from_mapping(cls, m: Mapping[str, Any]) -> ScheduleFeatures:
        """Build from a plain dict; unknown keys are an error (they are likely typos)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(m) - names
        if unknown:
            raise ValueError(f"unknown schedule features {sorted(unknown)}; known: {sorted(names)}")
        return cls(**m)

    def to_dict(self) -> dict[str, Any]:
        """The features as a plain dict."""
        return dataclasses.asdict(self)


def as_features(f: ScheduleFeatures | Mapping[str, Any]) -> ScheduleFeatures:
    """Accept either a :class:`ScheduleFeatures` or a plain mapping of its fields."""
    return f if isinstance(f, ScheduleFeatures) else ScheduleFeatures.from_mapping(f)


def feature_terms(
    features: ScheduleFeatures | Mapping[str, Any], spec: DeviceSpec
) -> dict[str, float]:
    """The model's terms (see the module docstring) for one kernel, in seconds.

    The schedule uses ``min(parallel_extent, cores)`` threads; bandwidth is
    interpolated between the one-thread and all-core figures, peak flops scale
    with threads, and a non-vectorized loop runs at ``1 / VECTOR_LANES`` of peak.
    """
    f = as_features(features)
    threads = max(1, min(f.parallel_extent, spec.cores))
    parallel = f.parallel_extent > 1
    bw_1t = spec.bandwidth_bytes_per_s(False)
    bw_all = spec.bandwidth_bytes_per_s(True)
    if spec.cores > 1:
        bw = bw_1t + (bw_all - bw_1t) * (threads - 1) / (spec.cores - 1)
    else:
        bw = bw_1t
    peak = spec.flops_per_s(False) * threads
    if not f.vectorized:
        peak /= VECTOR_LANES
    trans_rate = spec.transcendentals_per_s(False) * threads

    memory = (f.bytes_read + f.bytes_written) / bw
    arith = f.flops / peak + f.transcendentals / trans_rate
    per_block = spec.parallel_overhead_us if parallel else 0.1 * spec.launch_overhead_us
    return {
        "launch": spec.kernel_overhead_s(parallel),
        "roofline": max(memory, arith),
        "overlap": min(memory, arith),
        "strided": 0.0 if f.contiguous else memory,
        "reread": max(0, f.reduce_passes - 1) * f.bytes_read / bw,
        "temp": f.temp_bytes / bw,
        "blocks": max(0, f.n_blocks - 1) * per_block * 1e-6,
    }


def _term_vector(features: ScheduleFeatures | Mapping[str, Any], spec: DeviceSpec) -> np.ndarray:
    t = feature_terms(features, spec)
    return np.array([t[name] for name in TERMS], dtype=np.float64)


@dataclass(frozen=True)
class ProjectedModel:
    """Coefficients of the projected model; ``predict`` applies them.

    ``fit_error`` is the mean relative error on the samples it was fitted to
    (``nan`` for the prior), ``n_samples`` how many there were.
    """

    coefficients: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_COEFFICIENTS))
    fit_error: float = math.nan
    n_samples: int = 0

    def __post_init__(self) -> None:
        missing = [t for t in TERMS if t not in self.coefficients]
        if missing:
            raise ValueError(f"coefficients missing for terms {missing}")
        extra = set(self.coefficients) - set(TERMS)
        if extra:
            raise ValueError(f"coefficients for unknown terms {sorted(extra)}")

    def vector(self) -> np.ndarray:
        """The coefficients in :data:`TERMS` order."""
        return np.array([self.coefficients[t] for t in TERMS], dtype=np.float64)

    def predict(self, features: ScheduleFeatures | Mapping[str, Any], spec: DeviceSpec) -> float:
        """Predicted seconds for a kernel with these schedule features."""
        return float(_term_vector(features, spec) @ self.vector())

    def explain(self, features: ScheduleFeatures | Mapping[str, Any], spec: DeviceSpec) -> str:
        """The prediction term by term, largest first, as one line."""
        t = feature_terms(features, spec)
        parts = sorted(((self.coefficients[k] * v, k) for k, v in t.items()), reverse=True)
        total = sum(p for p, _ in parts)
        body = ", ".join(f"{k} {p * 1e6:.2f} us" for p, k in parts if p > 0)
        return f"{total * 1e6:.2f} us = {body or '0'}"


#: The model with the prior coefficients.
DEFAULT_MODEL = ProjectedModel()


def predict(
    features: ScheduleFeatures | Mapping[str, Any],
    spec: DeviceSpec,
    model: ProjectedModel | None = None,
) -> float:
    """Predicted seconds for one kernel, with ``model`` (default: the prior)."""
    return (model or DEFAULT_MODEL).predict(features, spec)


def fit(
    samples: Sequence[tuple[ScheduleFeatures | Mapping[str, Any], float]],
    spec: DeviceSpec,
    prior: ProjectedModel | None = None,
    *,
    nonnegative: bool = True,
) -> ProjectedModel:
    """Fit the coefficients to ``(features, measured seconds)`` samples.

    Least squares on relative error (each row is divided by its measured time, so
    a 10 us kernel counts as much as a 10 ms one), solved for the deviation from
    ``prior`` with the minimum-norm solution: a term the samples never exercise
    keeps its prior coefficient. With ``nonnegative`` (default), a coefficient
    that comes out negative is pinned to zero and the rest re-fitted.
    """
    prior = prior or DEFAULT_MODEL
    if not samples:
        raise ValueError("fit needs at least one sample")
    rows = []
    y = []
    for i, (feat, seconds) in enumerate(samples):
        if not (isinstance(seconds, int | float) and math.isfinite(seconds) and seconds > 0):
            raise ValueError(f"sample {i}: measured time must be > 0 seconds, got {seconds!r}")
        rows.append(_term_vector(feat, spec))
        y.append(float(seconds))
    X = np.array(rows)
    yv = np.array(y)
    w = 1.0 / yv
    Xw = X * w[:, None]
    yw = yv * w  # all ones
    c0 = prior.vector()
    coef = c0.copy()
    free = np.ones(len(TERMS), dtype=bool)
    for _ in range(len(TERMS)):
        fixed = ~free
        rhs = yw - Xw[:, fixed] @ coef[fixed] - Xw[:, free] @ c0[free]
        if free.any():
            # Scale columns so the min-norm solution does not favour large terms.
            A = Xw[:, free]
            norms = np.linalg.norm(A, axis=0)
            used = norms > 0
            d = np.zeros(A.shape[1])
            if used.any():
                sol, *_ = np.linalg.lstsq(A[:, used] / norms[used], rhs, rcond=None)
                d[used] = sol / norms[used]
            coef[free] = c0[free] + d
        if not nonnegative:
            break
        negative = free & (coef < 0)
        if not negative.any():
            break
        worst = np.argmin(np.where(negative, coef, np.inf))
        coef[worst] = 0.0
        free[worst] = False
        c0 = np.where(free, c0, coef)
    pred = X @ coef
    err = float(np.mean(np.abs(pred - yv) / yv))
    return ProjectedModel(
        coefficients={t: float(c) for t, c in zip(TERMS, coef)},
        fit_error=err,
        n_samples=len(samples),
    )
