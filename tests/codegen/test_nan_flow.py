"""NaN-insensitive max/min reductions (geode.codegen.nan_flow): which ones are found, and
that kernels reducing them without a NaN guard still give numpy's results, NaN rows
included."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lowering_check import prepare

import geode
from geode import examples, ops
from geode.codegen.nan_flow import nan_insensitive_reductions


def _found(g) -> list[str]:
    """Names of the ReduceMax/Min nodes whose outputs nan_flow marks, over all groups."""
    gg, plan = prepare(g)
    out = []
    for group in plan.groups:
        ids = nan_insensitive_reductions(group, gg)
        out += [n.op_type for n in group.nodes if n.outputs and id(n.outputs[0]) in ids]
    return out


def _row_graph(build) -> geode.Graph:
    g = geode.Graph("rows")
    x = g.input("x", ["N", 16])
    outs = build(x)
    g.output(*outs, names=[f"y{i}" for i in range(len(outs))])
    return g


def _softmax(x):
    e = ops.exp(x - ops.reduce_max(x, axes=[-1], keepdims=1))
    return e / ops.reduce_sum(e, axes=[-1], keepdims=1)


def _log_softmax(x):
    d = x - ops.reduce_max(x, axes=[-1], keepdims=1)
    return d - ops.log(ops.reduce_sum(ops.exp(d), axes=[-1], keepdims=1))


def test_softmax_and_log_softmax_maxima_are_nan_insensitive():
    assert _found(examples.softmax(hidden=64).graph) == ["ReduceMax"]
    assert _found(_row_graph(lambda x: [_softmax(x)])) == ["ReduceMax"]
    assert _found(_row_graph(lambda x: [_log_softmax(x)])) == ["ReduceMax"]

    # the min version of the same shape
    def softmin(x):
        e = ops.exp(ops.neg(x - ops.reduce_min(x, axes=[-1], keepdims=1)))
        return [e / ops.reduce_sum(e, axes=[-1], keepdims=1)]

    assert _found(_row_graph(softmin)) == ["ReduceMin"]


NOT_FOUND = {
    "the max is an output": lambda x: [_softmax(x), ops.reduce_max(x, axes=[-1], keepdims=1)],
    "no sum after it": lambda x: [ops.exp(x - ops.reduce_max(x, axes=[-1], keepdims=1))],
    "an output without the sum": lambda x: [
        _softmax(x),
        ops.exp(x - ops.reduce_max(x, axes=[-1], keepdims=1)) * 2.0,
    ],
    "the max used elsewhere": lambda x: [
        _softmax(x) + ops.reduce_max(x, axes=[-1], keepdims=1),
    ],
    "sum over other axes": lambda x: [
        ops.exp(x - ops.reduce_max(x, axes=[-1], keepdims=1))
        / ops.reduce_sum(
            ops.exp(x - ops.reduce_max(x, axes=[-1], keepdims=1)), axes=[0], keepdims=1
        )
    ],
    "a NaN-swallowing op": lambda x: [
        (lambda e, s: e / ops.where(s > 0.0, s, s * 0.0 + 1.0))(
            ops.exp(x - ops.reduce_max(x, axes=[-1], keepdims=1)),
            ops.reduce_sum(
                ops.exp(x - ops.reduce_max(x, axes=[-1], keepdims=1)), axes=[-1], keepdims=1
            ),
        )
    ],
}


@pytest.mark.parametrize("what", sorted(NOT_FOUND))
def test_other_shapes_keep_their_nan_guard(what):
    g = _row_graph(NOT_FOUND[what])
    assert _found(g) == []
    model = geode.compile(g)
    for k in model.kernels:
        if k.engine == "aicore" and "_g_maxnum_nn" in k.source:
            assert "_g_nanguard" in k.source and "_g_freeze" not in k.source


@pytest.mark.numba
def test_softmax_kernel_reduces_without_a_guard():
    model = geode.compile(examples.softmax(hidden=64).graph, backend="numba")
    (k,) = [k for k in model.kernels if k.engine == "aicore"]
    assert "_g_maxnum_nn" in k.source and "_g_freeze(" in k.source
    assert "_g_nanguard" not in k.source
    # the reduction keeps its fast form: every maxnum is nnan (a plain vmaxps); an LLVM
    # freeze of the result would be pushed into the loop and strip the flag
    maxnums = [ln for ln in k.llvm.splitlines() if "@llvm.maxnum" in ln and "call" in ln]
    assert maxnums and all("nnan" in ln for ln in maxnums), maxnums[:3]


def _rows_with_specials(rng, n, k, p_nan, p_inf):
    x = rng.standard_normal((n, k)).astype(np.float32) * 5
    u = rng.random((n, k))
    x[u < p_nan] = np.nan
    x[(u >= p_nan) & (u < p_nan + p_inf)] = np.inf
    x[(u >= p_nan + p_inf) & (u < p_nan + 2 * p_inf)] = -np.inf
    return x


@pytest.mark.parametrize("which", ["softmax", "log_softmax"])
@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 40),
    seed=st.integers(0, 10_000),
    p_nan=st.sampled_from([0.0, 0.01, 0.2]),
    p_inf=st.sampled_from([0.0, 0.02]),
)
@pytest.mark.numba
def test_unguarded_rows_match_numpy_with_nan_and_inf(which, n, seed, p_nan, p_inf):
    """Rows with NaN, +inf and -inf anywhere give numpy's results (NaN rows stay NaN,
    exactly where numpy's are) through the unguarded max, one compile for every size."""
    model = _MODELS.setdefault(which, _model(which))
    x = _rows_with_specials(np.random.default_rng(seed), n, 1030, p_nan, p_inf)
    got = model(x=x)["y"]
    with np.errstate(all="ignore"):
        d = x - x.max(-1, keepdims=True)
        e = np.exp(d)
        want = (
            e / e.sum(-1, keepdims=True)
            if which == "softmax"
            else d - np.log(e.sum(-1, keepdims=True))
        )
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_allclose(got[ok], want[ok], rtol=2e-5, atol=1e-6)


_MODELS: dict = {}


def _model(which):
    g = geode.Graph(which)
    x = g.input("x", ["N", 1030])
    g.output(_softmax(x) if which == "softmax" else _log_softmax(x), names=["y"])
    model = geode.compile(g, backend="numba")
    (k,) = [k for k in model.kernels if k.engine == "aicore"]
    assert "_g_freeze(" in k.source and "_g_nanguard" not in k.source
    return model
