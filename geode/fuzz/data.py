"""Input arrays for fuzz graphs: value distributions per dtype, NaN/Inf and friends.

A *fill* names a distribution. Float fills: ``normal`` (N(0, 2)), ``positive``
(0.05..4, the domain of Log/Sqrt), ``unit`` (-0.95..0.95, the domain of Asin/Atanh),
``halves`` (multiples of 0.5 in [-6, 6]: exact ties for Round, Floor and comparisons),
``wide`` (magnitudes 1e-6..1e6, both signs) and ``special`` (normal values with NaN,
+-Inf, -0.0, huge and subnormal values mixed in). Integer fills: ``small`` (-9..9,
or 0..19 unsigned) and ``full`` (the whole range, extremes included). ``bool`` is
a fair coin.
"""

from __future__ import annotations

import numpy as np

FLOAT_FILLS = ("normal", "positive", "unit", "halves", "wide", "special")
INT_FILLS = ("small", "full")

_SPECIALS = (np.nan, np.inf, -np.inf, -0.0, 0.0, 1e30, -1e30, 1e-40, 65504.0, -1.0, 1.0)


def _floats(rng: np.random.Generator, shape: tuple[int, ...], fill: str) -> np.ndarray:
    if fill == "positive":
        return rng.uniform(0.05, 4.0, shape)
    if fill == "unit":
        return rng.uniform(-0.95, 0.95, shape)
    if fill == "halves":
        return rng.integers(-12, 13, shape) / 2.0
    if fill == "wide":
        mag = 10.0 ** rng.uniform(-6, 6, shape)
        return np.where(rng.random(shape) < 0.5, -mag, mag)
    x = rng.normal(0.0, 2.0, shape)
    if fill == "special":
        pick = rng.random(shape) < 0.2
        x = np.where(pick, rng.choice(np.asarray(_SPECIALS), shape), x)
    return x


def _ints(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype, fill: str):
    info = np.iinfo(dtype)
    if fill == "full":
        x = rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
        edges = np.asarray([info.min, info.max, 0, 1], dtype=dtype)
        if dtype.kind == "i":
            edges = np.append(edges, np.asarray(-1, dtype=dtype))
        pick = rng.random(shape) < 0.2
        return np.where(pick, rng.choice(edges, shape), x).astype(dtype)
    lo, hi = (0, 19) if dtype.kind == "u" else (-9, 9)
    return rng.integers(lo, hi, shape, endpoint=True).astype(dtype)


def make_array(
    rng: np.random.Generator, shape: tuple[int, ...], dtype: str, fill: str
) -> np.ndarray:
    """An array of ``shape`` and ``dtype`` drawn from ``fill`` (see the module docstring);
    floats are rounded to their dtype (float16 overflow gives Inf, like a cast would)."""
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return rng.random(shape) < 0.5
    if dt.kind in "iu":
        return _ints(rng, shape, dt, fill)
    with np.errstate(over="ignore"):
        return np.asarray(_floats(rng, shape, fill)).astype(dt)


def fill_for(rng: np.random.Generator, dtype: str) -> str:
    """A random fill fitting ``dtype``."""
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return "bool"
    if dt.kind in "iu":
        return "full" if rng.random() < 0.2 else "small"
    weights = np.asarray([0.35, 0.15, 0.1, 0.15, 0.1, 0.15])
    return str(rng.choice(FLOAT_FILLS, p=weights / weights.sum()))
