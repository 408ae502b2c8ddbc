"""Weights packed once at compile time (codegen/packed_weights.py, llvm/packed.py): a
float32 MatMul with a constant matrix B, plain or with a fused epilogue, multiplies by B's
packed copy (a constant in the VarManager) through the packed-weight GEMM; the choice is in
explain(); results match the reference engine; a model file re-packs at load."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import geode
from geode import ops
from geode.codegen.packed_weights import PACKED_SUFFIX, choose_packing, packed_value
from geode.config import Options
from geode.errors import CodegenError
from geode.runtime import native

RNG = np.random.default_rng(11)
pytestmark = pytest.mark.skipif(
    native.pool_info()["gemm_packed_isa"] < 1, reason="the packed kernel needs AVX2 + FMA"
)


def _rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


W1, BIAS, W2 = _rand(64, 40), _rand(40), _rand(40, 33)


def _mlp() -> geode.Graph:
    """relu(x @ W1 + b) (a dense epilogue), then @ W2 (a plain MatMul)."""
    g = geode.Graph("packed_mlp")
    x = g.input("x", ["N", 64], np.float32)
    h = ops.relu(ops.add(ops.matmul(x, g.constant(W1, name="w1")), g.constant(BIAS, name="b")))
    g.output(ops.matmul(h, g.constant(W2, name="w2")), names=["y"])
    return g


def _want(x):
    return np.maximum(x @ W1 + BIAS, 0) @ W2


def _weights_lines(model) -> list[str]:
    return [line for line in model.explain().splitlines() if "weights:" in line]


def _var_names(model) -> set[str]:
    return {k.name.rsplit("/", 1)[-1] for k in model.var_manager}


def _plain() -> geode.Graph:
    """x @ W2 alone: a MatMul with no epilogue (a library step)."""
    g = geode.Graph("packed_plain")
    x = g.input("x", ["B", "N", 40], np.float32)
    g.output(ops.matmul(x, g.constant(W2, name="w2")), names=["y"])
    return g


def test_compiled_matmuls_use_packed_weights():
    """The dense step's B and its second GEMM's V are both packed."""
    model = geode.compile(_mlp(), session=geode.Session(), model_cache=False)
    (line,) = _weights_lines(model)
    assert line.count("packed once") == 2
    assert "'w1' 64x40" in line and "V: B 'w2' 40x33" in line
    assert {"w1" + PACKED_SUFFIX, "w2" + PACKED_SUFFIX} <= _var_names(model)
    assert not {"w1", "w2"} & _var_names(model)  # only the packed copies are kept
    assert (
        model.explain().count("library op: geode's packed-weight GEMM with a fused epilogue") == 2
    )
    x = _rand(37, 64)
    calls = native.pool_info()["gemm_packed_calls"]
    got = model(x=x)["y"]
    assert native.pool_info()["gemm_packed_calls"] >= calls + 2
    np.testing.assert_allclose(got, _want(x), rtol=1e-4, atol=1e-4)
    ref = geode.compile(_mlp(), codegen=False, model_cache=False)(x=x)["y"]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [0, 1, 2, 65])
def test_row_counts(rows):
    model = geode.compile(_mlp(), session=geode.Session(), model_cache=False)
    x = _rand(rows, 64)
    got = model(x=x)["y"]
    assert got.shape == (rows, 33)
    np.testing.assert_allclose(got, _want(x), rtol=1e-4, atol=1e-4)


def test_plain_matmul_uses_packed_weight():
    model = geode.compile(_plain(), session=geode.Session(), model_cache=False)
    (line,) = _weights_lines(model)
    assert "'w2' 40x33 float32 packed once into 3 panels" in line
    assert "geode's packed-weight GEMM, called natively" in model.explain()
    x = _rand(2, 9, 40)
    calls = native.pool_info()["gemm_packed_calls"]
    np.testing.assert_allclose(model(x=x)["y"], x @ W2, rtol=1e-4, atol=1e-4)
    assert native.pool_info()["gemm_packed_calls"] == calls + 1


def test_option_off_keeps_the_blas():
    model = geode.compile(_mlp(), session=geode.Session(), model_cache=False, packed_weights=False)
    (line,) = _weights_lines(model)
    assert line.count("through the BLAS") == 2 and "option packed_weights is off" in line
    assert not any(n.endswith(PACKED_SUFFIX) for n in _var_names(model))
    x = _rand(5, 64)
    calls = native.pool_info()["gemm_packed_calls"]
    np.testing.assert_allclose(model(x=x)["y"], _want(x), rtol=1e-4, atol=1e-4)
    assert native.pool_info()["gemm_packed_calls"] == calls


def _gemm_onnx(trans_b: int) -> bytes:
    """Y = relu(Gemm(X, B, C, transB)) with B and C initializers."""
    b = W1.T.copy() if trans_b else W1
    graph = helper.make_graph(
        [
            helper.make_node("Gemm", ["X", "B", "C"], ["G"], transB=trans_b, alpha=0.5),
            helper.make_node("Relu", ["G"], ["Y"]),
        ],
        "gemm",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["n", 64])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["n", 40])],
        [numpy_helper.from_array(b, "B"), numpy_helper.from_array(BIAS, "C")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model.SerializeToString()


@pytest.mark.parametrize("trans_b", [0, 1])
def test_onnx_gemm_weights_packed(trans_b):
    model = geode.compile(_gemm_onnx(trans_b), session=geode.Session(), model_cache=False)
    assert any("packed once" in line for line in _weights_lines(model))
    x = _rand(9, 64)
    want = np.maximum(0.5 * (x @ W1) + BIAS, 0)
    np.testing.assert_allclose(model(X=x)["Y"], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("build,shape", [(_mlp, (21, 64)), (_plain, (2, 3, 40))])
def test_model_file_repacks_at_load(tmp_path, build, shape):
    model = geode.compile(build(), session=geode.Session(), model_cache=False)
    x = _rand(*shape)
    want = model(x=x)["y"]
    path = tmp_path / "mlp.geode"
    model.save(path)
    loaded = geode.load(path, session=geode.Session())
    assert _weights_lines(loaded) == _weights_lines(model)
    assert "w2" + PACKED_SUFFIX in _var_names(loaded)
    np.testing.assert_array_equal(loaded(x=x)["y"], want)


def test_choice_reasons():
    g = geode.Graph("choices")
    x = g.input("x", ["N", 8], np.float32)
    w = g.constant(_rand(8, 4), name="w")
    on, off = Options(), Options(packed_weights=False)
    assert choose_packing(x, w, on).packed and choose_packing(x, w, on).n == 4
    assert not choose_packing(x, w, off).packed
    y = g.input("y", [8, 4], np.float32)
    assert "not a constant" in choose_packing(x, y, on).text
    x64 = g.input("x64", ["N", 8], np.float64)
    w64 = g.constant(RNG.standard_normal((8, 4)), name="w64")
    assert "float64 operands" in choose_packing(x64, w64, on).text
    with pytest.raises(CodegenError, match="cannot be packed"):
        packed_value(w64)
    packed = packed_value(w)
    assert packed.name == "w" + PACKED_SUFFIX and packed.shape == (1, 8, 16)
    np.testing.assert_array_equal(packed.data[0, :, :4], w.data)


def test_a_weight_read_by_two_matmuls_is_packed_once(monkeypatch) -> None:
    """Two MatMuls of one constant weight share its packed copy: one packing at compile
    time, and both products right."""
    packs = []
    real = native.pack_weight

    def counting(b, *args, **kwargs):  # noqa: ANN001, ANN202
        packs.append(b.shape)
        return real(b, *args, **kwargs)

    monkeypatch.setattr(native, "pack_weight", counting)
    g = geode.Graph("tied")
    x = g.input("x", [4, 64], np.float32)
    y = g.input("y", [4, 64], np.float32)
    w = _rand(64, 32)
    wv = g.constant(w, "W")
    g.output(g.op("MatMul", x, wv), names=["a"])
    g.output(g.op("MatMul", y, wv), names=["b"])
    model = geode.compile(g)
    assert packs == [(64, 32)]
    assert packed_value(wv) is packed_value(wv)
    xs, ys = _rand(4, 64), _rand(4, 64)
    out = model(x=xs, y=ys)
    np.testing.assert_allclose(out["a"], xs @ w, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["b"], ys @ w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [9, 16, 17, 33, 128, 129, 511, 512, 700])
def test_few_rows_run_one_panel_per_thread(rows):
    """Up to SPLIT_ROWS rows per thread against packed weights: one panel per thread (a
    whole number of 8-row tiles), each panel's GEMM, epilogue and second GEMM on one
    thread, the op in one pool launch; from BIG_PANELS panels of BIG_ROWS rows per thread,
    panels of BIG_ROWS rows, also one launch; the same bits as on one thread; between
    them one panel of all rows, each GEMM split over the pool."""
    from geode.codegen.backends.llvm.dense import BIG_PANELS, BIG_ROWS, SPLIT_ROWS

    x = _rand(rows, 64)
    one = geode.compile(_mlp(), session=geode.Session(), model_cache=False, num_threads=1)
    want = one(x=x)["y"]
    model = geode.compile(_mlp(), session=geode.Session(), model_cache=False, num_threads=2)
    before = native.pool_info()
    got = model(x=x)["y"]
    after = native.pool_info()
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got, _want(x), rtol=1e-4, atol=1e-4)
    assert f"up to {SPLIT_ROWS} rows per thread: a panel per thread" in model.explain()
    big = rows >= 2 * BIG_PANELS * BIG_ROWS
    split = rows <= 2 * SPLIT_ROWS or big
    calls = after["gemm_packed_calls"] - before["gemm_packed_calls"]
    panels = -(-rows // BIG_ROWS) if big else 2 if split else 1
    assert calls == 2 * panels, (rows, calls)
    if native.get_num_threads() >= 2:
        launches = after["launches"] - before["launches"]
        assert (launches == 1) if split else (launches >= 1), (rows, launches)


def _record_background(monkeypatch) -> tuple[list, list]:
    """The IR of every module submitted to the background threads, and every claim's
    (key, whether it found one), from here on."""
    from geode.codegen.backends.llvm import background

    started, claimed = [], []
    real_submit, real_claim = background.submit, background.claim

    def submit(key, ir, target, level):
        started.append(ir)
        real_submit(key, ir, target, level)

    def claim(key):
        obj = real_claim(key)
        claimed.append((key, obj is not None))
        return obj

    monkeypatch.setattr(background, "submit", submit)
    monkeypatch.setattr(background, "claim", claim)
    return started, claimed


@pytest.mark.parametrize("packed", [True, False])
def test_a_library_matmul_module_compiles_in_the_background(tmp_path, monkeypatch, packed):
    """The schedule stage starts the module bind links for a plain MatMul (the packed-weight
    kernel, or the BLAS call) on the background threads; bind claims it: nothing is left
    pending, and the result is right."""
    from geode.codegen.backends.llvm import background

    started, claimed = _record_background(monkeypatch)
    before = background.pending()
    model = geode.compile(
        _plain(), cache_dir=str(tmp_path), packed_weights=packed, model_cache=False
    )
    name = "geode_packed_matmul_r3_n33" if packed else "geode_matmul_s_r3"
    assert [ir for ir in started if f"@{name}(" in ir] == started and len(started) == 1
    assert [found for _, found in claimed] == [True]
    assert background.pending() == before
    x = _rand(2, 5, 40)
    np.testing.assert_allclose(model(x=x)["y"], x @ W2, rtol=1e-4, atol=1e-4)


def test_a_library_module_never_bound_is_cancelled(tmp_path, monkeypatch):
    """A compile that fails after the schedule stage started a library module leaves
    nothing of it pending (its LLVM run is cancelled, nothing claims it)."""
    from geode import spine
    from geode.codegen.backends.llvm import background
    from geode.errors import GraphError

    started, _ = _record_background(monkeypatch)

    def failing_bind(c):
        raise GraphError("test: bind refused")

    stages = [(n, failing_bind if n == "bind" else f) for n, f in spine.STAGES]
    monkeypatch.setattr(spine, "STAGES", stages)
    before = background.pending()
    with pytest.raises(GraphError, match="bind refused"):
        geode.compile(_plain(), cache_dir=str(tmp_path), model_cache=False)
    assert len(started) == 1 and background.pending() == before
