"""A row and a column reduction of one input as one stitch kernel, end to end: kernel
counts (one stitched, two with ``stitch_fusion=False``) and results against the
reference interpreter over fixed and random shapes (0 and 1 dims, odd sizes), symbolic
dims, keepdims, means, NaN-propagating max and min, float32 and float64."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import geode
from geode.compiler.interpret import run_reference

OPS = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"]


def rowcol(
    shape: tuple,
    split: int = 1,
    ops: tuple[str, str] = ("ReduceSum", "ReduceSum"),
    keep: int = 0,
    prologue: str | None = None,
    dtype: str = "float32",
) -> geode.Graph:
    """r = ops[0] over the axes from ``split`` on, c = ops[1] over those before it."""
    gr = geode.Graph("rowcol")
    x = gr.input("x", list(shape), dtype)
    v = x
    if prologue == "square":
        v = gr.op("Mul", x, x)
    elif prologue == "diff":
        v = gr.op("Sub", x, gr.input("y", list(shape), dtype))
    elif prologue == "stored":  # x * x, also an output
        v = gr.op("Mul", x, x)
    rank = len(shape)
    axes = [list(range(split, rank)), list(range(split))]
    r, c = (
        gr.op(op, v, gr.constant(np.array(a, np.int64)), keepdims=keep) for op, a in zip(ops, axes)
    )
    if prologue == "stored":
        gr.output(r, c, v, names=["r", "c", "sq"])
    else:
        gr.output(r, c, names=["r", "c"])
    return gr


@functools.cache
def compiled(shape: tuple, split: int, ops: tuple, keep: int, prologue, dtype: str, on: bool):
    gr = rowcol(shape, split, ops, keep, prologue, dtype)
    return gr, geode.compile(gr, stitch_fusion=on, model_cache=False)


def feeds(gr: geode.Graph, sizes: dict[str, int], seed: int, nans: bool) -> dict:
    rng = np.random.default_rng(seed)
    out = {}
    for v in gr.inputs:
        shape = [d if isinstance(d, int) else sizes[str(d)] for d in v.shape]
        a = rng.standard_normal(shape).astype(v.dtype)
        if nans and a.size > 2:
            a.flat[rng.integers(a.size)] = np.nan
        out[v.name] = a
    return out


def check(gr: geode.Graph, model, f: dict) -> None:
    got, want = model.run(f), run_reference(gr, f)
    x = f["x"]
    scale = max(1.0, float(np.nanmax(np.abs(x), initial=0.0))) * max(x.shape, default=1)
    tol = 1e-6 if x.dtype == np.float64 else 2e-5
    for k in want:
        assert got[k].shape == want[k].shape and got[k].dtype == want[k].dtype
        np.testing.assert_allclose(got[k], want[k], rtol=tol, atol=tol * scale, err_msg=k)


CASES = [
    ((37, 64), 1, ("ReduceSum", "ReduceSum"), 0, None, "float32"),
    (("N", 33), 1, ("ReduceMean", "ReduceSum"), 1, "square", "float32"),
    (("N", "M"), 1, ("ReduceMax", "ReduceMin"), 0, "diff", "float64"),
    (("B", 5, 7), 1, ("ReduceSum", "ReduceMean"), 1, None, "float64"),
    (("B", "T", 17), 2, ("ReduceMean", "ReduceMax"), 0, "square", "float32"),
    (("N", 29), 1, ("ReduceSum", "ReduceMean"), 0, "stored", "float64"),
]


@pytest.mark.parametrize("case", CASES)
def test_stitched_is_one_kernel_and_matches_the_reference(case):
    gr, model = compiled(*case, True)
    _, apart = compiled(*case, False)
    assert len(model.kernels) == 1, model.explain()
    assert len(apart.kernels) == 2
    text = model.explain()
    assert "stitch_reduce" in text and "(Stitch): stitch over" in text
    nans = case[2][0] in ("ReduceMax", "ReduceMin")
    for sizes in ({"N": 41, "M": 19, "B": 6, "T": 9}, {"N": 1, "M": 1, "B": 1, "T": 1}):
        f = feeds(gr, sizes, 0, nans)
        check(gr, model, f)
        check(gr, apart, f)


def test_stitched_and_apart_agree_bit_for_bit_on_max():
    case = (("N", 64), 1, ("ReduceMax", "ReduceMax"), 0, None, "float32")
    gr, model = compiled(*case, True)
    _, apart = compiled(*case, False)
    f = feeds(gr, {"N": 300}, 1, True)
    got, want = model.run(f), apart.run(f)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    assert np.isnan(got["c"]).sum() == 1 and np.isnan(got["r"]).sum() == 1


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
@given(
    case=st.sampled_from(
        [
            (("N", "M"), 1, ("ReduceSum", "ReduceSum"), 0, None, "float32"),
            (("N", "M"), 1, ("ReduceMean", "ReduceMax"), 1, "square", "float32"),
            (("N", "M"), 1, ("ReduceMin", "ReduceMean"), 0, "diff", "float64"),
            (("N", "T", "M"), 2, ("ReduceSum", "ReduceMean"), 1, None, "float32"),
        ]
    ),
    n=st.integers(0, 70),
    m=st.integers(0, 40),
    t=st.integers(0, 5),
    seed=st.integers(0, 2**16),
)
def test_random_shapes_match_the_reference(case, n, m, t, seed):
    gr, model = compiled(*case, True)
    assert len(model.kernels) == 1
    f = feeds(gr, {"N": n, "M": m, "T": t}, seed, nans=seed % 3 == 0)
    check(gr, model, f)


@pytest.mark.parametrize("keep", [0, 1])
def test_several_row_reductions_and_a_column_one(keep):
    """A row sum, a row max and a row mean (of x * x, which the column mean reads too)
    next to a column mean: one kernel, the reference's values, NaNs propagated."""
    gr = geode.Graph("rows")
    x = gr.input("x", ["N", "M"])
    ax = lambda v: gr.constant(np.array(v, np.int64))  # noqa: E731
    sq = gr.op("Mul", x, x)
    outs = [
        gr.op("ReduceMean", sq, ax([0]), keepdims=keep),
        gr.op("ReduceMean", sq, ax([1]), keepdims=keep),
        gr.op("ReduceSum", x, ax([1]), keepdims=keep),
        gr.op("ReduceMax", x, ax([1]), keepdims=keep),
    ]
    gr.output(*outs, names=["c", "r2", "r", "m"])
    model = geode.compile(gr, model_cache=False)
    assert len(model.kernels) == 1, model.explain()
    for n, m, seed in [(53, 31, 0), (0, 5, 1), (7, 0, 2), (1, 1, 3), (300, 17, 4)]:
        check(gr, model, feeds(gr, {"N": n, "M": m}, seed, nans=seed % 2 == 0))


def test_a_transposed_input_is_stitched_too():
    """x = Transpose(y): both reductions read y through the remapped index."""
    gr = geode.Graph("t")
    y = gr.input("x", [48, "N"])
    x = gr.op("Transpose", y, perm=[1, 0])
    ax = lambda v: gr.constant(np.array(v, np.int64))  # noqa: E731
    gr.output(
        gr.op("ReduceSum", x, ax([1]), keepdims=0),
        gr.op("ReduceMax", x, ax([0]), keepdims=1),
        names=["r", "c"],
    )
    model = geode.compile(gr, model_cache=False)
    assert len(model.kernels) == 1, model.explain()
    for n, seed in [(0, 0), (1, 1), (77, 2)]:
        check(gr, model, feeds(gr, {"N": n}, seed, nans=True))
