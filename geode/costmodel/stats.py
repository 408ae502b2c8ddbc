"""Accuracy of a cost model against measurements: rank correlation and relative error.

A model that decides between candidates (fusion plans, schedules) must first of all
*order* them like the machine does: :func:`spearman` is the rank correlation of
predicted and measured times (1: the same order). :func:`median_rel_error` says how
far the predicted seconds are, ``|predicted - measured| / measured``, at the median.
:func:`split` draws a held-out set for an honest measure of both.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def ranks(x: Sequence[float]) -> np.ndarray:
    """Ranks from 1, ties sharing the mean of their ranks (``[3, 1, 3] -> [2.5, 1, 2.5]``)."""
    a = np.asarray(x, dtype=np.float64)
    order = np.argsort(a, kind="mergesort")
    r = np.empty(len(a), dtype=np.float64)
    sorted_a = a[order]
    i = 0
    while i < len(a):
        j = i
        while j + 1 < len(a) and sorted_a[j + 1] == sorted_a[i]:
            j += 1
        r[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return r


def spearman(predicted: Sequence[float], measured: Sequence[float]) -> float:
    """Spearman's rank correlation of two equally long sequences (Pearson's on the
    ranks, ties averaged); ``nan`` with fewer than two points or a constant side."""
    if len(predicted) != len(measured):
        raise ValueError(f"spearman: {len(predicted)} predictions for {len(measured)} measurements")
    if len(predicted) < 2:
        return math.nan
    rp, rm = ranks(predicted), ranks(measured)
    rp -= rp.mean()
    rm -= rm.mean()
    denom = math.sqrt(float(rp @ rp) * float(rm @ rm))
    return math.nan if denom == 0 else float(rp @ rm) / denom


def relative_errors(predicted: Sequence[float], measured: Sequence[float]) -> np.ndarray:
    """``|predicted - measured| / measured`` per point (measured times must be > 0)."""
    p = np.asarray(predicted, dtype=np.float64)
    m = np.asarray(measured, dtype=np.float64)
    if p.shape != m.shape:
        raise ValueError(f"relative_errors: shapes {p.shape} and {m.shape} differ")
    if (m <= 0).any() or not np.isfinite(m).all():
        raise ValueError("relative_errors: measured times must be finite and > 0")
    return np.abs(p - m) / m


def median_rel_error(predicted: Sequence[float], measured: Sequence[float]) -> float:
    """The median of :func:`relative_errors` (``nan`` for no points)."""
    e = relative_errors(predicted, measured)
    return float(np.median(e)) if e.size else math.nan


def split(n: int, holdout: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices ``(fit, held_out)`` of ``n`` samples, a ``holdout`` fraction held out at
    random (seeded); each side gets at least one sample when ``n >= 2``."""
    if not 0 < holdout < 1:
        raise ValueError(f"holdout must be between 0 and 1, got {holdout!r}")
    if n < 2:
        raise ValueError(f"need at least 2 samples to hold some out, got {n}")
    perm = np.random.default_rng(seed).permutation(n)
    k = min(n - 1, max(1, round(n * holdout)))
    return np.sort(perm[k:]), np.sort(perm[:k])
