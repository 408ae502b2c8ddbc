"""Comparing a compiled output with the reference engine's: the tolerance policy.

* Integers and bools: equal, bit for bit.
* Floats whose every ancestor op is exact (layout, selection, casts: rounding class
  ``exact``, :func:`geode.fuzz.oplib.rounding_class`): equal, NaN where NaN (+0 and
  -0 count as equal).
* Other floats: ``|got - want| <= rtol * (|want| + scale)`` elementwise, with ``rtol``
  from :data:`RTOL` by class (``arith``: plain arithmetic; ``trans``: transcendentals,
  float reductions, softmax, Pow) and by the least precise float dtype the output's
  computation went through (a float32 result cast to float64 keeps float32's error),
  and ``scale`` the largest finite float magnitude among the output's ancestors in
  the reference run (cancellation leaves an error of the size of the values that
  cancelled); NaN where NaN; an infinity only where the same infinity is.

A float mismatch may still be rounding amplified by an ill-conditioned function;
:mod:`geode.fuzz.noise` tells such noise from bugs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: relative tolerance by dtype and rounding class
RTOL: dict[str, dict[str, float]] = {
    "float64": {"arith": 1e-12, "trans": 1e-9},
    "float32": {"arith": 1e-5, "trans": 1e-4},
    "float16": {"arith": 4e-3, "trans": 1e-2},
}


@dataclass
class Mismatch:
    """How an output differs: ``kind`` (``dtype``, ``shape`` or the dtype of differing
    values), a readable description and the differing elements' mask."""

    kind: str
    message: str
    mask: np.ndarray | None = None


def finite_scale(arrays: Sequence[np.ndarray]) -> float:
    """The largest finite magnitude among the float ``arrays`` (0 when there is none;
    integers do not count: an integer exponent of 2**31 says nothing about the size of
    the floats that may cancel)."""
    best = 0.0
    for a in arrays:
        a = np.asarray(a)
        if a.size == 0 or a.dtype.kind != "f":
            continue
        w = np.abs(a.astype(np.float64))
        w = w[np.isfinite(w)]
        if w.size:
            best = max(best, float(w.max()))
    return best


def _describe(got: np.ndarray, want: np.ndarray, bad: np.ndarray, what: str) -> str:
    idx = np.argwhere(bad)
    shown = ", ".join(
        f"{tuple(int(i) for i in ix)}: got {got[tuple(ix)]!r} want {want[tuple(ix)]!r}"
        for ix in idx[:4]
    )
    return f"{what}: {len(idx)} of {want.size} elements differ ({shown})"


def least_precise(arrays: Sequence[np.ndarray]) -> str | None:
    """The float dtype of least precision among ``arrays`` (None when none is float)."""
    floats = [np.asarray(a).dtype for a in arrays if np.asarray(a).dtype.kind == "f"]
    if not floats:
        return None
    return str(max(floats, key=lambda d: float(np.finfo(d).eps)))


def compare_output(
    name: str,
    got: np.ndarray,
    want: np.ndarray,
    cls: str,
    scale: float,
    precision: str | None = None,
) -> Mismatch | None:
    """None when ``got`` matches ``want`` under the policy, else the mismatch.
    ``precision``: the float dtype whose tolerance applies (the least precise one the
    output's computation went through; default the output's)."""
    got, want = np.asarray(got), np.asarray(want)
    if got.dtype != want.dtype:
        return Mismatch("dtype", f"output {name!r}: dtype {got.dtype}, reference {want.dtype}")
    if got.shape != want.shape:
        return Mismatch("shape", f"output {name!r}: shape {got.shape}, reference {want.shape}")
    if want.dtype.kind not in "f":
        bad = got != want
        if bad.any():
            return Mismatch(
                str(want.dtype), _describe(got, want, bad, f"output {name!r} ({want.dtype})"), bad
            )
        return None
    g64, w64 = got.astype(np.float64), want.astype(np.float64)
    gn, wn = np.isnan(g64), np.isnan(w64)
    bad = gn != wn
    both = ~gn & ~wn
    if cls == "exact":
        bad |= both & (g64 != w64)
    else:
        rtol = RTOL[precision or str(want.dtype)][cls]
        winf = np.isinf(w64)
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.abs(g64 - w64)
            tol = rtol * (np.abs(w64) + scale)
            bad |= both & winf & (g64 != w64)
            bad |= both & ~winf & ~(diff <= tol)
    if bad.any():
        what = f"output {name!r} ({want.dtype}, {cls} tolerance, scale {scale:.3g})"
        return Mismatch(str(want.dtype), _describe(got, want, bad, what), bad)
    return None
