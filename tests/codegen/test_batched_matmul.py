"""Batched MatMul as a native kernel (one BLAS GEMM per matrix, numpy's broadcasting of
the batch dims), against numpy and onnx.reference.ReferenceEvaluator."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import geode
from geode.codegen.backends.llvm.batched import SMALL_GEMM, batched_matmul_kernel
from geode.codegen.backends.llvm.library import blas
from geode.runtime import native

pytestmark = pytest.mark.skipif(blas() is None, reason="no BLAS found in numpy's wheel")
RNG = np.random.default_rng(3)


def _model(sa, sb, dtype=np.float32):
    g = geode.Graph("bmm")
    a = g.input("a", list(sa), dtype)
    b = g.input("b", list(sb), dtype)
    g.output(g.op("MatMul", a, b), names=["y"])
    return geode.compile(g)


def _check(sa, sb, dtype=np.float32):
    model = _model(sa, sb, dtype)
    assert [k.kind for k in model.kernels] == ["library"], model.explain()
    a = RNG.standard_normal(sa).astype(dtype)
    b = RNG.standard_normal(sb).astype(dtype)
    got = model.run({"a": a, "b": b})["y"]
    want = a @ b
    assert got.shape == want.shape
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize(
    "sa,sb",
    [
        ((2, 3, 4, 5), (2, 3, 5, 6)),
        ((4, 5), (3, 5, 6)),  # a matrix times a batch
        ((2, 1, 4, 5), (3, 5, 6)),  # broadcast both ways
        ((1, 4, 5), (2, 3, 5, 6)),
        ((2, 3, 0, 5), (2, 3, 5, 6)),  # M = 0
        ((2, 3, 4, 0), (2, 3, 0, 6)),  # K = 0: zeros
        ((0, 4, 5), (1, 5, 6)),  # no matrices
        ((3, 200, 150), (3, 150, 90)),  # large enough for the BLAS's own threads
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_batched_matmul_fixed_cases(sa, sb, dtype):
    _check(sa, sb, dtype)


def test_attention_matmuls_match_the_reference_evaluator():
    """Q @ K^T and P @ V of attention, as an ONNX graph."""
    b, h, s, d = 2, 4, 9, 8
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Softmax", ["s"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["o"]),
    ]
    shape = [b, h, s, d]
    graph = helper.make_graph(
        nodes,
        "attn",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in "qkv"],
        [helper.make_tensor_value_info("o", TensorProto.FLOAT, shape)],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {n: RNG.standard_normal(shape).astype(np.float32) for n in "qkv"}
    (want,) = ReferenceEvaluator(proto).run(None, feeds)
    model = geode.compile(proto, dense_epilogues=False)  # as two batched library kernels
    assert sum(k.kind == "library" for k in model.kernels) == 2, model.explain()
    np.testing.assert_allclose(model.run(feeds)["o"], want, rtol=1e-5, atol=1e-6)


def test_small_matrices_run_on_the_pool_large_ones_in_turn():
    """Small GEMMs are spread over the pool, one matrix per chunk; large ones run in turn,
    each split into blocks over the same pool (``geode_gemm``)."""
    if native.get_num_threads() < 2:
        pytest.skip("the pool has one thread: nothing runs in parallel")
    k = batched_matmul_kernel("float32", 3, 3)
    a = RNG.standard_normal((6, 8, 8)).astype(np.float32)
    y = np.empty_like(a)
    before = native.pool_info()
    k.call((a, a, y), (0,))
    after = native.pool_info()
    assert after["launches"] > before["launches"]
    assert after["blas_pool_runs"] == before["blas_pool_runs"]
    np.testing.assert_allclose(y, a @ a, rtol=1e-5, atol=1e-5)
    side = 256  # 16M multiply-adds: past SMALL_GEMM, and enough for geode_gemm to split
    assert side**3 > SMALL_GEMM
    b = RNG.standard_normal((2, side, side)).astype(np.float32)
    y = np.empty_like(b)
    before = native.pool_info()
    k.call((b, b, y), (0,))
    after = native.pool_info()
    # each GEMM split into independent blocks over the pool: single-threaded BLAS calls,
    # or, where its tiles are AVX-512, the packed kernel's (runtime/native/gemm.c)
    split = after["gemm_split_calls"] - before["gemm_split_calls"]
    assert split + after["gemm_wide_calls"] - before["gemm_wide_calls"] >= 2
    assert after["blas_pool_runs"] == before["blas_pool_runs"]
    np.testing.assert_allclose(y, b @ b, rtol=1e-4, atol=1e-3)


def test_bad_operands_are_refused_by_the_entry():
    k = batched_matmul_kernel("float32", 3, 3)
    a = np.zeros((2, 3, 4), np.float32)
    with pytest.raises(ValueError, match="argument B"):
        k.call((a, np.zeros((2, 5, 6), np.float32), np.zeros((2, 3, 6), np.float32)), (0,))
    with pytest.raises(ValueError, match="argument Y"):
        k.call((a, np.zeros((2, 4, 6), np.float32), np.zeros((2, 3, 7), np.float32)), (0,))
    with pytest.raises(ValueError, match="argument A"):
        k.call((a, np.zeros((3, 4, 6), np.float32), np.zeros((3, 3, 6), np.float32)), (0,))


_dims = st.integers(0, 4)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batch=st.lists(st.tuples(_dims, st.booleans(), st.booleans()), min_size=0, max_size=3),
    mkn=st.tuples(st.integers(0, 7), st.integers(0, 7), st.integers(0, 7)),
    drop_a=st.integers(0, 3),
    dtype=st.sampled_from([np.float32, np.float64]),
)
def test_random_batched_matmuls_match_numpy(batch, mkn, drop_a, dtype):
    """Random batch dims, each broadcast (1) on either side or not, and an A with fewer
    batch dims than B."""
    m, k, n = mkn
    ba = [1 if one_a else d for d, one_a, _ in batch]
    bb = [1 if one_b and not one_a else d for d, one_a, one_b in batch]
    ba = ba[min(drop_a, len(ba)) :]
    sa, sb = (*ba, m, k), (*bb, k, n)
    if max(len(sa), len(sb)) < 3:
        sb = (1, *sb)
    _check(sa, sb, dtype)


def test_an_operand_of_another_rank_is_refused_before_the_records_after_it_are_read():
    """A's record is shorter than the entry expects: the entry checks its ndim first (the
    later records would be read at shifted places, past the end of the record array)."""
    from geode.codegen.backends.llvm.library import matmul_kernel

    k = batched_matmul_kernel("float32", 3, 3)
    y = np.zeros((2, 3, 6), np.float32)
    with pytest.raises(ValueError, match="argument A"):
        k.call((np.zeros((3, 4), np.float32), np.zeros((2, 4, 6), np.float32), y), (0,))
    with pytest.raises(ValueError, match="argument Y"):
        k.call((np.zeros((2, 3, 4), np.float32), np.zeros((2, 4, 6), np.float32), y[0]), (0,))
    flat = matmul_kernel("float32", 3)
    with pytest.raises(ValueError, match="argument A"):
        flat.call((np.zeros((3, 4), np.float32), np.zeros((4, 6), np.float32), y), (0,))
