"""A value a kernel recomputes at several sites rounds alike at each (``fence``).

geode.fuzz, seed 1 case 7331, shrunk: ``Softmax(a * b, axis=0)``. The kernel recomputed
``a * b`` for the column max (rounded) and again in ``a * b - max``, where the default
policy's ``contract`` fused it into one multiply-add: at the max element the exact
product minus its rounded value came out as -5e21, so every exp of the column was 0 and
the softmax 0 / 0 = NaN. ``compute_inline`` now fences a value it recomputes at several
sites, and the LLVM backend emits a fence's operation without fast-math flags.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import geode
from geode import ops


def _column_case() -> tuple[np.ndarray, np.ndarray]:
    """6x6 inputs whose column 5 has one product near 8e29 (whose multiply-add with its
    own rounded negation is -5e21, not 0) and small ones."""
    rng = np.random.default_rng(7331)
    a = rng.standard_normal((6, 6)).astype(np.float32)
    b = rng.standard_normal((6, 6)).astype(np.float32)
    a[5, 5], b[5, 5] = np.float32(-1e30), np.float32(-0.80667704)
    p = np.float64(a[5, 5]) * np.float64(b[5, 5])
    assert p - np.float64(a[5, 5] * b[5, 5]) < -1e21  # the residue a contraction keeps
    return a, b


def _by_hand(x: geode.Value) -> geode.Value:
    e = ops.exp(x - ops.reduce_max(x, axes=[0], keepdims=1))
    return e / ops.reduce_sum(e, axes=[0], keepdims=1)


@pytest.mark.parametrize(
    "softmax", [lambda x: ops.softmax(x, axis=0), _by_hand], ids=["op", "by_hand"]
)
def test_a_product_recomputed_for_its_max_and_its_exp_rounds_alike(softmax):
    a, b = _column_case()
    g = geode.Graph("softmax_of_product")
    x, y = g.input("a", [6, 6]), g.input("b", [6, 6])
    g.output(softmax(x * y), names=["s"])
    model = geode.compile(g, model_cache=False)
    got = model(a=a, b=b)["s"]
    p = a * b
    e = np.exp(p - p.max(0, keepdims=True))
    want = e / e.sum(0, keepdims=True)
    assert np.isfinite(got).all(), got[:, 5]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    assert got[5, 5] == 1.0
    # the product is computed at several sites, each without fast-math flags
    (k,) = [k for k in model.kernels if k.engine == "aicore"]
    assert re.search(r"= fmul float %", k.source), k.source
