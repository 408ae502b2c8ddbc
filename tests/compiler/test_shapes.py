"""Symbolic broadcasting in ``geode.compiler.shapes``: ``bcast(M, N)``, the recorded
broadcast constraints, the stride of a broadcast operand, and their run-time values."""

import numpy as np
import pytest
import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

import geode
from geode.compiler.shapes import (
    BroadcastDim,
    SymbolTable,
    broadcast_dim,
    broadcast_shapes,
    broadcast_stride,
    broadcast_value,
    broadcasts_to,
    compile_dim_fn,
    compile_shape_fn,
    evaluate_dim,
    sym,
)
from geode.errors import ShapeError

N, M, K = sym("N"), sym("M"), sym("K")


def test_two_symbols_broadcast_to_bcast_not_max():
    d = broadcast_dim(N, M)
    assert isinstance(d, BroadcastDim) and not d.has(sympy.Max)
    assert str(d) == "bcast(M, N)"
    assert d == broadcast_dim(M, N)  # canonical: operands sorted
    assert d.is_integer and d.is_positive


def test_bcast_is_canonical():
    b = BroadcastDim(N, M)
    assert BroadcastDim(b, K) == BroadcastDim(K, M, N)  # nested broadcasts flatten
    assert BroadcastDim(N, N) == N and BroadcastDim(N, 1) == N and BroadcastDim(1, 1) == 1
    assert BroadcastDim(N, 16) == 16 and BroadcastDim(b, 0) == 0  # a static side wins
    with pytest.raises(ShapeError, match="cannot broadcast dims 5 and 6"):
        BroadcastDim(N, 5, 6)
    # a broadcast of N again is the same broadcast (N is 1 or the result)
    assert broadcast_dim(b, N) == b and broadcast_dim(N, b) == b


@pytest.mark.parametrize(
    ("n", "m", "want"),
    [(3, 3, 3), (1, 7, 7), (7, 1, 7), (1, 1, 1), (0, 0, 0), (0, 1, 0), (1, 0, 0)],
)
def test_bcast_values_follow_onnx_including_zero(n, m, want):
    d = broadcast_dim(N, M)
    assert evaluate_dim(d, {N: n, M: m}) == want == broadcast_value(n, m)
    assert compile_dim_fn(d)({"N": n, "M": m}) == want
    assert compile_shape_fn((d, 2 * d))({"N": n, "M": m}) == (want, 2 * want)


@pytest.mark.parametrize(("n", "m"), [(5, 6), (0, 2), (2, 0)])
def test_bcast_of_sizes_that_do_not_broadcast_raises(n, m):
    with pytest.raises(ShapeError, match=f"cannot broadcast dims {min(n, m)} and {max(n, m)}"):
        evaluate_dim(broadcast_dim(N, M), {N: n, M: m})
    with pytest.raises(ShapeError, match="cannot broadcast"):
        broadcast_value(n, m)


def test_broadcast_records_constraints():
    t = SymbolTable()
    out = broadcast_shapes((N, 16), (M, 16), (K, 1), where="node 'add'", symbols=t)
    assert out == (BroadcastDim(K, M, N), 16)
    groups = [set(dims) for dims, _ in t.broadcasts]
    assert {M, N} in groups and {K, M, N} in groups
    assert all(where == "node 'add'" for _, where in t.broadcasts)
    broadcast_shapes((N, 16), (M, 16), symbols=t)  # recorded already: not repeated
    assert len(t.broadcasts) == 2
    # a symbol against a static dim keeps the static dim, and records the pair
    assert broadcast_dim(N, 16, symbols=t) == 16
    assert t.broadcast_recorded([N, 16]) and not t.broadcast_recorded([M, 16])
    # equal dims and 1s record nothing
    before = len(t.broadcasts)
    broadcast_shapes((N, 1), (N, 16), (1, 16), symbols=t)
    assert len(t.broadcasts) == before


def test_broadcasts_to():
    b = broadcast_dim(N, M)
    assert broadcasts_to(N, b) and broadcasts_to(M, b) and broadcasts_to(1, b)
    assert broadcasts_to(b, BroadcastDim(K, M, N))
    assert not broadcasts_to(K, b) and not broadcasts_to(N, M)
    t = SymbolTable()
    broadcast_dim(N, 16, symbols=t)
    assert not broadcasts_to(N, 16) and broadcasts_to(N, 16, t)
    assert not broadcasts_to(M, 16, t)


def test_broadcast_stride():
    s = broadcast_stride(N)
    assert [evaluate_dim(s, {N: n}) for n in (1, 2, 9)] == [0, 1, 1]
    assert broadcast_stride(5) == 1 and broadcast_stride(1) == 0


def test_graph_copy_and_text_keep_broadcasts():
    g = geode.Graph("g")
    x, y = g.input("x", ["N", 4]), g.input("y", ["M", 4])
    g.output(x + y, names=["z"])
    assert g.symbols.broadcasts == [((M, N), "node 'add' (Add)")]
    assert g.copy().symbols.broadcasts == g.symbols.broadcasts
    assert "broadcast (equal or 1): M, N" in str(g)


dims = st.integers(0, 4)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(dims, dims, dims), min_size=2, max_size=4))
def test_symbolic_broadcast_agrees_with_numpy(sizes):
    """Shapes of three axes, each axis a fresh symbol per operand: the symbolic
    broadcast, once bound, is numpy's broadcast shape, and raises where numpy does."""
    syms = [[sym(f"d{i}_{j}") for j in range(3)] for i in range(len(sizes))]
    env = {s: v for row, vals in zip(syms, sizes) for s, v in zip(row, vals)}
    t = SymbolTable()
    shape = broadcast_shapes(*map(tuple, syms), symbols=t)
    try:
        want = np.broadcast_shapes(*sizes)
    except ValueError:
        want = None
    broken = False
    for group, _ in t.broadcasts:
        try:
            broadcast_value(*(evaluate_dim(d, env) for d in group))
        except ShapeError:
            broken = True
    assert broken == (want is None)
    if want is not None:
        assert tuple(evaluate_dim(d, env) for d in shape) == want


def test_dims_equal_on_one_object_equal_objects_and_different_dims():
    from geode.compiler.shapes import dims_equal

    e = N * 2 + 1
    assert dims_equal(e, e) is True
    assert dims_equal(e, sym("N") * 2 + 1) is True
    assert dims_equal(N, sym("N")) is True
    assert dims_equal(4, 4) is True and dims_equal(4, 5) is False
    assert dims_equal(N + 1, N + 2) is False
    assert dims_equal(N, M) is None
