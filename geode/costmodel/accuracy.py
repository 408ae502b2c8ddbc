"""How well each cost model predicts held-out kernels: the report's computation.

:func:`evaluate` splits profiled samples into a fitting set and a held-out set
(seeded), fits what needs fitting on the first (the projected model; the baseline)
and scores every model on the second: Spearman rank correlation and median relative
error (:mod:`.stats`). The models:

=================  ==============================================================
sol                speed of light on the calibrated device (nothing fitted)
projected-prior    the projected model with its prior coefficients
projected          the projected model fitted on the fitting set
bytes-baseline     seconds = a + b * compulsory bytes, fitted (relative error)
=================  ==============================================================

Pure computation on plain samples: no kernel is compiled or timed here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from . import projected, sol, stats
from .device import DeviceSpec
from .profiling import Sample
from .projected import ProjectedModel, as_features


@dataclass(frozen=True)
class ModelAccuracy:
    """One model's accuracy on the held-out samples."""

    name: str
    n: int
    spearman: float
    median_rel_error: float
    mean_log2_error: float

    def row(self) -> str:
        """One line of the report's table."""
        return (
            f"{self.name:<16} {self.n:>5} {self.spearman:>9.3f} {self.median_rel_error:>10.1%} "
            f"{self.mean_log2_error:>10.2f}"
        )


@dataclass(frozen=True)
class Evaluation:
    """The report: every model's held-out accuracy, the fitted projected model and the
    sizes of the two sets."""

    models: dict[str, ModelAccuracy]
    fitted: ProjectedModel
    n_fit: int
    n_held_out: int

    def table(self) -> str:
        """The accuracy table, one model per line."""
        head = f"{'model':<16} {'n':>5} {'spearman':>9} {'median err':>10} {'|log2| err':>10}"
        return "\n".join([head, *(m.row() for m in self.models.values())])


def _bytes_of(s: Sample) -> float:
    f = as_features(s.features)
    return f.bytes_read + f.bytes_written


def fit_bytes_baseline(samples: Sequence[Sample]) -> Callable[[Sample], float]:
    """``seconds = a + b * bytes`` (a, b >= 0) fitted by least squares on relative error."""
    x = np.array([_bytes_of(s) for s in samples])
    y = np.array([s.measured_s for s in samples])
    A = np.stack([np.ones_like(x), x], axis=1) / y[:, None]
    coef, *_ = np.linalg.lstsq(A, np.ones_like(y), rcond=None)
    a, b = (max(0.0, float(c)) for c in coef)
    if b == 0.0 or a == 0.0:  # refit the other alone
        if b == 0.0:
            a = float(np.sum(1 / y) / np.sum(1 / y**2))
        else:
            b = float(np.sum(x / y) / np.sum((x / y) ** 2))
    return lambda s: a + b * _bytes_of(s)


def score(name: str, predict: Callable[[Sample], float], held: Sequence[Sample]) -> ModelAccuracy:
    """``predict``'s accuracy on ``held``."""
    pred = [float(predict(s)) for s in held]
    meas = [s.measured_s for s in held]
    logs = [abs(math.log2(p / m)) if p > 0 else math.inf for p, m in zip(pred, meas)]
    return ModelAccuracy(
        name=name,
        n=len(held),
        spearman=stats.spearman(pred, meas),
        median_rel_error=stats.median_rel_error(pred, meas),
        mean_log2_error=float(np.mean(logs)) if logs else math.nan,
    )


def evaluate(
    samples: Sequence[Sample],
    spec: DeviceSpec,
    *,
    holdout: float = 0.3,
    seed: int = 0,
    prior: ProjectedModel | None = None,
) -> Evaluation:
    """Fit on a ``1 - holdout`` share of ``samples`` (drawn by ``seed``), score every
    model on the rest. Samples without features are dropped."""
    usable = [s for s in samples if s.features is not None and s.measured_s > 0]
    fit_idx, held_idx = stats.split(len(usable), holdout, seed)
    fit_set = [usable[i] for i in fit_idx]
    held = [usable[i] for i in held_idx]
    fitted = projected.fit([(s.features, s.measured_s) for s in fit_set], spec, prior)
    base = prior or projected.DEFAULT_MODEL
    models = {
        "sol": score("sol", lambda s: sol.estimate(_work(s), spec), held),
        "projected-prior": score("projected-prior", lambda s: base.predict(s.features, spec), held),
        "projected": score("projected", lambda s: fitted.predict(s.features, spec), held),
        "bytes-baseline": score("bytes-baseline", fit_bytes_baseline(fit_set), held),
    }
    return Evaluation(models, fitted, len(fit_set), len(held))


def _work(s: Sample) -> sol.KernelWork:
    if s.work is not None:
        return s.work
    f = as_features(s.features)
    return sol.KernelWork(
        f.bytes_read, f.bytes_written, f.flops, f.transcendentals, f.parallel_extent > 1
    )
