"""Projected cost model: a kernel's time from the features of its scheduled loop AST.

The middle level of PAI's three (SOL < projected < profiling): it knows how a kernel
was scheduled, not just how much work it does. Codegen extracts a
:class:`ScheduleFeatures` record from a scheduled kernel
(:mod:`geode.codegen.features`; plain data: this package imports nothing else of
geode), and the model predicts seconds as a weighted sum of terms, each already in
seconds on the calibrated :class:`DeviceSpec` for the threads the kernel runs on:

==========  ======================================================================
term        meaning (seconds)
==========  ======================================================================
launch      the fixed cost of calling a kernel
fork        fork/join of each parallel region
dram        compulsory bytes of a working set larger than the last-level cache, at
            the bandwidth of the threads used
cache       compulsory bytes of a working set the L2/L3 hold, at the same rate
            (the fit finds how much faster the caches are)
reuse       bytes read again (a row re-read by a later pass, temporaries), L1-level
strided     bytes read or written with a stride along the innermost loop
arith       simple arithmetic (add, mul, min, compare, select, cast) at the vector peak
divide      divisions and square roots (a slow pipe), at the vector peak
trans       transcendental functions (exp, tanh, erf, ...) at the calibrated rate
scalar      any of the above done in non-vectorized loops: lanes times slower
loops       loop iterations (the compare-and-branch of every trip), 1 ns nominal
entries     loop entries (set-up, vector remainder), 10 ns nominal
roofline    max(memory, arithmetic): how far the two overlap
==========  ======================================================================

Work is divided over ``threads / balance`` cores: ``threads`` is the smaller of the
run's thread count and the parallel loop's extent, ``balance`` the load imbalance of
cutting the extent into equal chunks. ``predicted = sum(coefficient[t] * term[t])``.
The default coefficients are priors; :func:`fit` re-estimates them from profiled
samples by ridge regression on relative error, non-negative, shrunk toward the prior.
A fitted model saves to and loads from JSON (:meth:`ProjectedModel.to_dict`).
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
TERMS: tuple[str, ...] = (
    "launch",
    "fork",
    "dram",
    "cache",
    "reuse",
    "strided",
    "arith",
    "divide",
    "trans",
    "scalar",
    "loops",
    "entries",
    "roofline",
)

#: Prior coefficients (used until :func:`fit` replaces them): a memory-bound kernel
#: takes its DRAM time, cache-resident data moves about three times faster, the rest
#: add small corrections.
DEFAULT_COEFFICIENTS: dict[str, float] = {
    "launch": 1.0,
    "fork": 1.0,
    "dram": 1.0,
    "cache": 0.35,
    "reuse": 0.1,
    "strided": 1.0,
    "arith": 1.0,
    "divide": 4.0,
    "trans": 1.0,
    "scalar": 1.0,
    "loops": 1.0,
    "entries": 1.0,
    "roofline": 0.0,
}

#: fp32 SIMD lanes a vectorized loop gains over a scalar one when the features do not
#: say (AVX2 width).
VECTOR_LANES = 8

#: nominal seconds of one loop trip and of one loop entry (the fit scales them)
LOOP_TRIP_S = 1e-9
LOOP_ENTRY_S = 1e-8

#: the format of a saved model (bumped when the meaning of a field changes)
FORMAT_VERSION = 2


@dataclass(frozen=True)
class ScheduleFeatures:
    """What the projected model needs to know about one scheduled kernel.

    Bytes: ``bytes_read``/``bytes_written`` are the compulsory traffic (each argument's
    footprint once), split by where the working set lives into ``dram_bytes`` and
    ``cache_bytes``; ``reuse_bytes`` is traffic beyond it (re-reads, local
    temporaries), ``strided_bytes`` accesses that stride along the innermost loop and
    ``nontemporal_bytes`` outputs written with streaming stores. Operations count
    evaluations: ``vec_*`` in vectorized loops, ``scalar_*`` elsewhere (``flops``
    simple ops, ``div`` divisions and square roots, ``trans`` transcendental
    functions). ``lanes`` is the vector width in elements; ``parallel_extent`` the
    trip count of the parallel loop (1: serial), ``parallel_regions`` how many times
    one starts, ``threads`` the run's thread count (0: every core); ``loop_iters``
    and ``loop_entries`` count trips and starts of every loop (a vectorized loop's
    trips are vectors), ``prefetches`` software prefetches.
    """

    bytes_read: float
    bytes_written: float
    flops: float = 0.0
    transcendentals: float = 0.0
    dram_bytes: float = 0.0
    cache_bytes: float = 0.0
    reuse_bytes: float = 0.0
    strided_bytes: float = 0.0
    nontemporal_bytes: float = 0.0
    vec_flops: float = 0.0
    scalar_flops: float = 0.0
    vec_div: float = 0.0
    scalar_div: float = 0.0
    vec_trans: float = 0.0
    scalar_trans: float = 0.0
    lanes: int = VECTOR_LANES
    parallel_extent: int = 1
    parallel_regions: int = 0
    threads: int = 0
    loop_iters: float = 0.0
    loop_entries: float = 0.0
    prefetches: float = 0.0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.type == "int":
                if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 0:
                    raise ValueError(f"feature {f.name} must be an int >= 0, got {v!r}")
            elif isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < math.inf:
                raise ValueError(f"feature {f.name} must be a finite number >= 0, got {v!r}")
        if self.lanes < 1:
            raise ValueError(f"feature lanes must be >= 1, got {self.lanes}")

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

    @classmethod
    def simple(
        cls,
        bytes_read: float,
        bytes_written: float,
        flops: float,
        transcendentals: float = 0.0,
        parallel_extent: int = 1,
        spec: DeviceSpec | None = None,
    ) -> ScheduleFeatures:
        """Features of a plain vectorized streaming kernel (no AST at hand): compulsory
        traffic at the level its size says (``spec``'s last-level cache, else DRAM),
        every operation vectorized, one pass."""
        total = bytes_read + bytes_written
        in_cache = spec is not None and total <= spec.l3_bytes
        return cls(
            bytes_read=bytes_read,
            bytes_written=bytes_written,
            flops=flops,
            transcendentals=transcendentals,
            dram_bytes=0.0 if in_cache else total,
            cache_bytes=total if in_cache else 0.0,
            vec_flops=flops,
            vec_trans=transcendentals,
            parallel_extent=parallel_extent,
            parallel_regions=1 if parallel_extent > 1 else 0,
            loop_iters=(bytes_read + bytes_written) / 4 / VECTOR_LANES,
            loop_entries=1.0,
        )


def as_features(f: ScheduleFeatures | Mapping[str, Any]) -> ScheduleFeatures:
    """A :class:`ScheduleFeatures` from itself or a plain dict."""
    return f if isinstance(f, ScheduleFeatures) else ScheduleFeatures.from_mapping(f)


def threads_used(f: ScheduleFeatures, spec: DeviceSpec) -> tuple[int, float]:
    """``(threads, speedup)``: the threads the kernel's parallel loop keeps busy and the
    speedup they give after load imbalance (``extent / (ceil(extent / threads))``)."""
    run = spec.cores if f.threads <= 0 else min(f.threads, spec.cores)
    if f.parallel_extent <= 1:
        return 1, 1.0
    t = max(1, min(run, f.parallel_extent))
    return t, f.parallel_extent / math.ceil(f.parallel_extent / t)


def bandwidth(spec: DeviceSpec, threads: int) -> float:
    """Bytes/s of ``threads`` threads: interpolated between one thread and every core."""
    bw_1t = spec.bandwidth_bytes_per_s(False)
    bw_all = spec.bandwidth_bytes_per_s(True)
    if spec.cores <= 1 or threads <= 1:
        return bw_1t
    return bw_1t + (bw_all - bw_1t) * (min(threads, spec.cores) - 1) / (spec.cores - 1)


def feature_terms(
    features: ScheduleFeatures | Mapping[str, Any], spec: DeviceSpec
) -> dict[str, float]:
    """The model's terms (see the module docstring) for one kernel, in seconds."""
    f = as_features(features)
    threads, speedup = threads_used(f, spec)
    bw = bandwidth(spec, threads)
    per_core = spec.flops_per_s(False)
    lanes = max(1, f.lanes)
    # the peak counts an FMA as two flops over VECTOR_LANES fp32 lanes: one simple
    # element operation per lane-cycle is half of it
    vec_rate = per_core / 2 * lanes / VECTOR_LANES * speedup
    trans_rate = spec.transcendentals_per_s(False) * speedup
    arith = f.vec_flops / vec_rate
    divide = f.vec_div / vec_rate
    trans = f.vec_trans / trans_rate
    scalar = (f.scalar_flops + f.scalar_div) * lanes / vec_rate + f.scalar_trans * lanes / (
        trans_rate
    )
    memory = (f.dram_bytes + 0.35 * f.cache_bytes + f.strided_bytes) / bw
    compute = arith + divide + trans + scalar
    return {
        "launch": spec.launch_overhead_us * 1e-6,
        "fork": f.parallel_regions * spec.parallel_overhead_us * 1e-6,
        "dram": f.dram_bytes / bw,
        "cache": f.cache_bytes / bw,
        "reuse": f.reuse_bytes / (spec.bandwidth_bytes_per_s(False) * 4 * speedup),
        "strided": f.strided_bytes / bw,
        "arith": arith,
        "divide": divide,
        "trans": trans,
        "scalar": scalar,
        "loops": f.loop_iters * LOOP_TRIP_S / speedup,
        "entries": f.loop_entries * LOOP_ENTRY_S / speedup,
        "roofline": max(memory, compute),
    }


def term_vector(features: ScheduleFeatures | Mapping[str, Any], spec: DeviceSpec) -> np.ndarray:
    """The terms of :func:`feature_terms` in :data:`TERMS` order."""
    t = feature_terms(features, spec)
    return np.array([t[name] for name in TERMS], dtype=np.float64)


@dataclass(frozen=True)
class ProjectedModel:
    """Coefficients of the projected model; ``predict`` applies them.

    ``fit_error`` is the median relative error on the samples it was fitted to
    (``nan`` for the prior), ``n_samples`` how many there were, ``device`` the key of
    the device spec it was fitted on (empty for the prior).
    """

    coefficients: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_COEFFICIENTS))
    fit_error: float = math.nan
    n_samples: int = 0
    device: str = ""

    def __post_init__(self) -> None:
        missing = [t for t in TERMS if t not in self.coefficients]
        if missing:
            raise ValueError(f"coefficients missing for terms {missing}")
        extra = set(self.coefficients) - set(TERMS)
        if extra:
            raise ValueError(f"coefficients for unknown terms {sorted(extra)}")
        for t, c in self.coefficients.items():
            if isinstance(c, bool) or not isinstance(c, int | float) or not math.isfinite(c):
                raise ValueError(f"coefficient {t} must be a finite number, got {c!r}")
            if c < 0:
                raise ValueError(f"coefficient {t} must be >= 0, got {c!r}")

    def vector(self) -> np.ndarray:
        """The coefficients in :data:`TERMS` order."""
        return np.array([self.coefficients[t] for t in TERMS], dtype=np.float64)

    def predict(self, features: ScheduleFeatures | Mapping[str, Any], spec: DeviceSpec) -> float:
        """Predicted seconds for a kernel with these schedule features."""
        return float(term_vector(features, spec) @ self.vector())

    def explain(self, features: ScheduleFeatures | Mapping[str, Any], spec: DeviceSpec) -> str:
        """The prediction term by term, largest first, as one line."""
        t = feature_terms(features, spec)
        parts = sorted(((self.coefficients[k] * v, k) for k, v in t.items()), reverse=True)
        total = sum(p for p, _ in parts)
        body = ", ".join(f"{k} {p * 1e6:.2f} us" for p, k in parts if p > 0)
        return f"{total * 1e6:.2f} us = {body or '0'}"

    def to_dict(self) -> dict[str, Any]:
        """The model as JSON-ready data (format, device key, coefficients, fit)."""
        return {
            "format": FORMAT_VERSION,
            "device": self.device,
            "coefficients": {t: float(self.coefficients[t]) for t in TERMS},
            "fit_error": None if math.isnan(self.fit_error) else float(self.fit_error),
            "n_samples": int(self.n_samples),
        }

    @classmethod
    def from_dict(cls, d: Any) -> ProjectedModel:
        """A model from :meth:`to_dict` data; ``ValueError`` naming the defect otherwise."""
        if not isinstance(d, Mapping):
            raise ValueError(f"projected model must be a JSON object, got {type(d).__name__}")
        if d.get("format") != FORMAT_VERSION:
            raise ValueError(
                f"projected model format {d.get('format')!r}, expected {FORMAT_VERSION}"
            )
        unknown = set(d) - {"format", "device", "coefficients", "fit_error", "n_samples"}
        if unknown:
            raise ValueError(f"projected model has unknown fields {sorted(unknown)}")
        coef = d.get("coefficients")
        if not isinstance(coef, Mapping):
            raise ValueError("projected model: coefficients must be an object")
        device, n, err = d.get("device", ""), d.get("n_samples", 0), d.get("fit_error")
        if not isinstance(device, str):
            raise ValueError(f"projected model: device must be a string, got {device!r}")
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"projected model: n_samples must be an int >= 0, got {n!r}")
        if err is not None and (isinstance(err, bool) or not isinstance(err, int | float)):
            raise ValueError(f"projected model: fit_error must be a number, got {err!r}")
        return cls(dict(coef), math.nan if err is None else float(err), n, device)


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
    ridge: float = 1e-3,
    loss: str = "relative",
    device: str | None = None,
) -> ProjectedModel:
    """Fit the coefficients to ``(features, measured seconds)`` samples.

    ``loss="relative"`` (default): ridge regression on relative error, each row divided
    by its measured time (a 10 us kernel counts as much as a 10 ms one), the columns
    scaled to unit norm, the deviation from ``prior`` penalized by ``ridge`` (a term the
    samples never exercise keeps its prior coefficient), coefficients kept
    non-negative. A kernel slowed down by other load (the usual disturbance on a shared
    machine) can miss by at most 100% of its measured time, so it pulls little.
    ``loss="log"`` then refines that solution on the log of the ratio predicted /
    measured (Huber weights) by Levenberg-Marquardt over the logs of the coefficients:
    fewer large misses either way, but pulled further by slowed-down samples.
    ``device`` (default: ``spec.key()``) is recorded in the model.
    """
    prior = prior or DEFAULT_MODEL
    if not samples:
        raise ValueError("fit needs at least one sample")
    if not (math.isfinite(ridge) and ridge >= 0):
        raise ValueError(f"ridge must be a finite number >= 0, got {ridge!r}")
    if loss not in ("log", "relative"):
        raise ValueError(f"loss must be 'log' or 'relative', got {loss!r}")
    rows, y = [], []
    for i, (feat, seconds) in enumerate(samples):
        if not (isinstance(seconds, int | float) and math.isfinite(seconds) and seconds > 0):
            raise ValueError(f"sample {i}: measured time must be > 0 seconds, got {seconds!r}")
        rows.append(term_vector(feat, spec))
        y.append(float(seconds))
    X, yv = np.array(rows), np.array(y)
    coef = _ridge_nonnegative(X / yv[:, None], np.ones(len(yv)), prior.vector(), ridge)
    if loss == "log":
        coef = _refine_log(X, yv, coef, prior.vector(), ridge)
    pred = X @ coef
    err = float(np.median(np.abs(pred - yv) / yv))
    return ProjectedModel(
        coefficients={t: float(c) for t, c in zip(TERMS, coef)},
        fit_error=err,
        n_samples=len(samples),
        device=spec.key() if device is None else device,
    )


#: smallest coefficient (relative to the prior's scale) the log refinement keeps
_FLOOR = 1e-6
#: Huber threshold on |log(predicted / measured)|
_HUBER = 0.4


def _refine_log(
    X: np.ndarray, y: np.ndarray, start: np.ndarray, c0: np.ndarray, ridge: float
) -> np.ndarray:
    """Levenberg-Marquardt on ``sum huber(log(X c) - log y)`` over ``theta = log c``,
    shrunk toward ``log c0`` by ``ridge``; terms no sample exercises stay."""
    used = (X > 0).any(axis=0)
    if not used.any():
        return start
    theta = np.log(np.maximum(start, _FLOOR))
    theta0 = np.log(np.maximum(c0, _FLOOR))
    logy = np.log(y)
    lam_r = ridge

    def objective(th: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        pred = X @ np.exp(th)
        r = np.log(np.maximum(pred, 1e-30)) - logy
        a = np.abs(r)
        rho = np.where(a <= _HUBER, 0.5 * r * r, _HUBER * (a - 0.5 * _HUBER))
        pen = 0.5 * lam_r * float(np.sum((th - theta0)[used] ** 2))
        return float(rho.sum()) + pen, r, pred

    f, r, pred = objective(theta)
    mu = 1e-2
    for _ in range(100):
        w = np.where(np.abs(r) <= _HUBER, 1.0, _HUBER / np.maximum(np.abs(r), 1e-12))
        J = (X * np.exp(theta)[None, :]) / np.maximum(pred, 1e-30)[:, None]
        J = J[:, used]
        g = J.T @ (w * r) + lam_r * (theta - theta0)[used]
        H = J.T @ (J * w[:, None]) + lam_r * np.eye(J.shape[1])
        improved = False
        while mu < 1e8:
            step = np.linalg.solve(H + mu * np.diag(np.diag(H) + 1e-12), -g)
            trial = theta.copy()
            trial[used] += step
            f2, r2, pred2 = objective(trial)
            if f2 < f:
                theta, f, r, pred = trial, f2, r2, pred2
                mu = max(mu / 3, 1e-6)
                improved = True
                break
            mu *= 4
        if not improved or float(np.max(np.abs(step))) < 1e-6:
            break
    coef = np.exp(theta)
    coef[~used] = c0[~used]
    return coef


def _ridge_nonnegative(A: np.ndarray, b: np.ndarray, c0: np.ndarray, ridge: float) -> np.ndarray:
    """``argmin |A c - b|^2 + ridge * |D (c - c0)|^2`` over ``c >= 0`` (``D``: the
    column norms, so the penalty does not depend on a term's units), by pinning the
    most negative coefficient at zero until none is left."""
    norms = np.linalg.norm(A, axis=0)
    used = norms > 0
    coef = c0.copy()
    free = used.copy()
    for _ in range(len(c0)):
        if not free.any():
            break
        fixed = ~free
        rhs = b - A[:, fixed] @ coef[fixed] - A[:, free] @ c0[free]
        S = A[:, free] / norms[free]
        k = S.shape[1]
        lhs = np.vstack([S, math.sqrt(ridge) * np.eye(k)]) if ridge > 0 else S
        rhs2 = np.concatenate([rhs, np.zeros(k)]) if ridge > 0 else rhs
        sol, *_ = np.linalg.lstsq(lhs, rhs2, rcond=None)
        coef[free] = c0[free] + sol / norms[free]
        negative = free & (coef < 0)
        if not negative.any():
            break
        worst = int(np.argmin(np.where(negative, coef, np.inf)))
        coef[worst] = 0.0
        free[worst] = False
    return np.maximum(coef, 0.0)
