"""MatMul/Gemm with fused epilogues: one native step (BLAS per panel of rows, then the
compiled epilogue on the panel), checked against the reference path (numpy kernels that
follow ONNX semantics) and onnx.reference.ReferenceEvaluator."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import geode
from geode.codegen.dense import DenseKernel
from geode.compiler.fusion import profit
from geode.compiler.fusion.epilogue import value_role
from geode.errors import ExecutionError

RNG = np.random.default_rng(7)


def _rand(*shape, dtype=np.float32):
    return (RNG.standard_normal(shape)).astype(dtype)


def _run_both(g, feeds, **opts):
    fused = geode.compile(g, **opts)
    ref = geode.compile(g, codegen=False)
    return fused, fused.run(feeds), ref.run(feeds)


def _dense_kernels(model):
    return [k for k in model.kernels if k.kind == "dense"]


def _close(a, b, dtype=np.float32):
    tol = 1e-5 if np.dtype(dtype) == np.float32 else 1e-12
    for k in b:
        np.testing.assert_allclose(a[k], b[k], rtol=tol * 10, atol=tol * 10, err_msg=k)


def _mlp(dtype=np.float32, k=16, n=24, act="Relu"):
    g = geode.Graph("mlp")
    x = g.input("x", ["B", "S", k], dtype)
    r = g.input("r", ["B", "S", n], dtype)
    w = g.constant(_rand(k, n, dtype=dtype), "w")
    bias = g.constant(_rand(n, dtype=dtype), "bias")
    y = g.op(act, g.op("Add", g.op("Add", g.op("MatMul", x, w), bias), r))
    g.output(y, names=["y"])
    return g


def test_bias_residual_activation_is_one_dense_step():
    g = _mlp()
    feeds = {"x": _rand(2, 5, 16), "r": _rand(2, 5, 24)}
    model, got, want = _run_both(g, feeds)
    assert len(model.kernels) == 1 and len(_dense_kernels(model)) == 1, model.explain()
    assert [n.op_type for n in model.kernels[0].ops] == ["MatMul", "Add", "Add", "Relu"]
    assert "dense epilogues:" in model.explain() and "panels of" in model.explain()
    _close(got, want)


def test_the_entry_module_compiles_in_the_background_from_the_schedule_stage(tmp_path, llvm_runs):
    """The GEMM entry's module is started when its epilogue is scheduled and claimed at
    emit: the same IR, compiled once, nothing left pending."""
    from geode.codegen.backends.llvm import background

    started, compiled = llvm_runs
    before = background.pending()
    g = _mlp()
    feeds = {"x": _rand(2, 5, 16), "r": _rand(2, 5, 24)}
    model, got, want = _run_both(g, feeds, cache_dir=str(tmp_path), model_cache=False)
    (dense,) = _dense_kernels(model)
    entry_ir = [ir for ir in started if "@geode_dense_" in ir and "define" in ir]
    assert len(entry_ir) == 1 and compiled.count(entry_ir[0]) == 1
    assert entry_ir[0] in dense.source
    assert background.pending() == before
    _close(got, want)


def test_an_entry_linked_before_is_not_compiled_again(tmp_path, monkeypatch):
    """A second compile of the same model while the first is alive queues no GEMM entry
    (it is linked in this process, though no longer in the disk cache) and leaves
    nothing pending."""
    import shutil

    from geode.codegen.backends.llvm import background

    g = _mlp()
    first = geode.compile(g, cache_dir=str(tmp_path), model_cache=False)
    shutil.rmtree(tmp_path)
    tmp_path.mkdir()
    started, real_submit = [], background.submit

    def submit(key, ir, target, level):
        started.append(ir)
        real_submit(key, ir, target, level)

    monkeypatch.setattr(background, "submit", submit)
    before = background.pending()
    second = geode.compile(g, cache_dir=str(tmp_path), model_cache=False)
    assert not [ir for ir in started if "@geode_dense_" in ir and "define" in ir]
    assert background.pending() == before
    feeds = {"x": _rand(2, 5, 16), "r": _rand(2, 5, 24)}
    _close(second.run(feeds), first.run(feeds))


def test_gemm_bias_gelu_is_one_kernel():
    """Gemm + bias + GELU (erf form, as PyTorch exports it) is one kernel."""
    m, k, n = 7, 12, 10
    w = _rand(n, k)  # transB: PyTorch's Linear weight layout
    b = _rand(n)
    nodes = [
        helper.make_node("Gemm", ["x", "w", "b"], ["h"], transB=1),
        helper.make_node("Div", ["h", "sqrt2"], ["hs"]),
        helper.make_node("Erf", ["hs"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["e1"]),
        helper.make_node("Mul", ["h", "e1"], ["he"]),
        helper.make_node("Mul", ["he", "half"], ["y"]),
    ]
    inits = [
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(b, "b"),
        numpy_helper.from_array(np.array(np.sqrt(2.0), np.float32), "sqrt2"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
        numpy_helper.from_array(np.array(0.5, np.float32), "half"),
    ]
    graph = helper.make_graph(
        nodes,
        "gemm_gelu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", n])],
        inits,
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model = geode.compile(proto)
    assert len(model.kernels) == 1 and model.kernels[0].kind == "dense", model.explain()
    x = _rand(m, k)
    (want,) = ReferenceEvaluator(proto).run(None, {"x": x})
    np.testing.assert_allclose(model.run({"x": x})["y"], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("trans_a", [0, 1])
@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("c_shape", [None, (), (1,), (5,), (1, 5), (4, 5), (4, 1)])
def test_gemm_matches_reference_evaluator(trans_a, trans_b, c_shape):
    m, k, n = 4, 3, 5
    a = _rand(*((k, m) if trans_a else (m, k)))
    b = _rand(*((n, k) if trans_b else (k, n)))
    inputs = ["a", "b"] + ([] if c_shape is None else ["c"])
    node = helper.make_node(
        "Gemm", inputs, ["y"], alpha=0.75, beta=1.5, transA=trans_a, transB=trans_b
    )
    inits = [numpy_helper.from_array(b, "b")]
    if c_shape is not None:
        inits.append(numpy_helper.from_array(_rand(*c_shape), "c"))
    graph = helper.make_graph(
        [node],
        "gemm",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, list(a.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
        inits,
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(proto)
    (want,) = ReferenceEvaluator(proto).run(None, {"a": a})
    model = geode.compile(proto)
    np.testing.assert_allclose(model.run({"a": a})["y"], want, rtol=1e-5, atol=1e-5)


def test_layer_norm_epilogue_reduces_each_row_of_the_panel():
    """MatMul + bias + residual + LayerNorm (a row reduction) is one dense kernel."""
    g = geode.Graph("ln")
    x = g.input("x", ["B", "S", 16])
    r = g.input("r", ["B", "S", 32])
    w = g.constant(_rand(16, 32), "w")
    h = g.op("Add", g.op("Add", g.op("MatMul", x, w), g.constant(_rand(32), "b")), r)
    y = g.op("LayerNormalization", h, g.constant(_rand(32), "gamma"), g.constant(_rand(32), "beta"))
    g.output(y, names=["y"])
    feeds = {"x": _rand(3, 70, 16), "r": _rand(3, 70, 32)}
    model, got, want = _run_both(g, feeds)
    dense = _dense_kernels(model)
    assert len(dense) == 1 and len(model.kernels) == 1, model.explain()
    _close(got, want)


def test_many_panels_with_a_remainder(monkeypatch):
    """Tiny panels (3 rows): every panel, and the short last one, lands in its place."""
    monkeypatch.setattr(profit, "DENSE_MIN_ROWS", 3)
    monkeypatch.setattr(profit, "panel_bytes", lambda spec: 16)
    g = geode.Graph("panels")
    x = g.input("x", ["M", 8])
    col = g.input("c", ["M", 1])
    w = g.constant(_rand(8, 6), "w")
    y = g.op("Sub", g.op("MatMul", x, w), col)
    s = g.op("ReduceSum", y, g.constant(np.array([-1], np.int64)), keepdims=1)
    g.output(g.op("Tanh", y), s, names=["y", "s"])
    feeds = {"x": _rand(17, 8), "c": _rand(17, 1)}
    model, got, want = _run_both(g, feeds)
    assert len(_dense_kernels(model)) == 1, model.explain()
    _close(got, want)


@pytest.mark.parametrize("dims", [(0, 4, 5), (3, 0, 5), (3, 4, 0), (1, 1, 1)])
def test_degenerate_dims(dims):
    m, k, n = dims
    g = geode.Graph("degenerate")
    x = g.input("x", ["M", k])
    w = g.constant(_rand(k, n), "w")
    y = g.op("Sigmoid", g.op("Add", g.op("MatMul", x, w), g.constant(_rand(n), "b")))
    total = g.op("ReduceMax", y, g.constant(np.array([1], np.int64)), keepdims=1)
    g.output(y, total, names=["y", "t"])
    feeds = {"x": _rand(m, k)}
    model, got, want = _run_both(g, feeds)
    assert len(_dense_kernels(model)) == 1, model.explain()
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6, err_msg=key)


def test_float64_and_a_float16_cast_output():
    g = geode.Graph("dtypes")
    x = g.input("x", ["M", 9], np.float64)
    w = g.constant(_rand(9, 11, dtype=np.float64), "w")
    y = g.op("Mul", g.op("MatMul", x, w), g.constant(np.array(0.5), "s", dtype=np.float64))
    g.output(y, g.op("Cast", y, to=10), names=["y", "h"])
    model, got, want = _run_both(g, {"x": _rand(13, 9, dtype=np.float64)})
    assert len(_dense_kernels(model)) == 1, model.explain()
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-12)
    assert got["h"].dtype == np.float16
    np.testing.assert_array_equal(got["h"], want["h"])


def test_the_option_turns_it_off():
    g = _mlp()
    model = geode.compile(g, dense_epilogues=False)
    assert not _dense_kernels(model)
    assert {k.kind for k in model.kernels} == {"library", "fused"}, model.explain()


def test_kept_apart_when_the_product_is_a_graph_output():
    g = geode.Graph("out")
    x = g.input("x", ["M", 4])
    y = g.op("MatMul", x, g.constant(_rand(4, 4), "w"))
    g.output(y, g.op("Relu", y), names=["y", "r"])
    model, got, want = _run_both(g, {"x": _rand(5, 4)})
    assert not _dense_kernels(model)
    assert "keep apart from group" in model.explain()
    assert "the product is a graph output" in model.explain()
    _close(got, want)


def test_kept_apart_when_the_group_reduces_another_axis():
    g = geode.Graph("colsum")
    x = g.input("x", ["M", 4])
    y = g.op("Exp", g.op("MatMul", x, g.constant(_rand(4, 6), "w")))
    g.output(g.op("ReduceSum", y, g.constant(np.array([0], np.int64)), keepdims=1), names=["s"])
    model, got, want = _run_both(g, {"x": _rand(5, 4)})
    assert not _dense_kernels(model), model.explain()
    _close(got, want)


def test_a_refusing_status_is_a_clear_error():
    """The entry's statuses: no memory for the panel, an epilogue refusing its panel
    arguments, and a bad argument (the entry kernel's own message)."""
    from geode.codegen.backends.llvm.dense import EPILOGUE_STATUS, NO_MEMORY

    class Entry:
        address = 0

        def _bad_argument(self, i):
            raise ValueError(f"kernel k: argument {i} must have shape (M, K)")

    class Epilogue:
        source = ""

    dense = DenseKernel("mm", Entry(), Epilogue(), "")
    with pytest.raises(ExecutionError, match="out of memory"):
        dense._bad_argument(NO_MEMORY - 1)
    with pytest.raises(ExecutionError, match="epilogue refused argument 2"):
        dense._bad_argument(EPILOGUE_STATUS + 2)
    with pytest.raises(ValueError, match="argument 1 must have shape"):
        dense._bad_argument(1)


_EPILOGUE_OPS = ["Relu", "Sigmoid", "Tanh", "Exp", "Neg", "Abs"]
_BINARY = ["Add", "Sub", "Mul", "Max", "Min"]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lead=st.lists(st.integers(0, 5), min_size=1, max_size=2),
    k=st.integers(1, 9),
    n=st.integers(1, 12),
    steps=st.lists(
        st.tuples(
            st.sampled_from(_EPILOGUE_OPS + _BINARY), st.sampled_from(["full", "row", "col"])
        ),
        min_size=1,
        max_size=4,
    ),
    dtype=st.sampled_from([np.float32, np.float64]),
)
def test_random_epilogues_match_the_reference(lead, k, n, steps, dtype):
    g = geode.Graph("rand")
    names = [f"d{i}" for i in range(len(lead))]
    x = g.input("x", [*names, k], dtype)
    w = g.constant(_rand(k, n, dtype=dtype), "w")
    h = g.op("MatMul", x, w)
    feeds = {"x": _rand(*lead, k, dtype=dtype)}
    for i, (op, role) in enumerate(steps):
        if op in _EPILOGUE_OPS:
            h = g.op(op, h if op != "Exp" else g.op("Tanh", h))
            continue
        shape = {"full": [*names, n], "row": [n], "col": [*names, 1]}[role]
        data_shape = {"full": [*lead, n], "row": [n], "col": [*lead, 1]}[role]
        other = g.input(f"o{i}", shape, dtype)
        feeds[f"o{i}"] = _rand(*data_shape, dtype=dtype)
        h = g.op(op, h, other)
    g.output(h, names=["y"])
    model, got, want = _run_both(g, feeds)
    (kernel,) = model.kernels  # one step; a plain MatMul when the passes removed the rest
    assert kernel.kind == "dense" or [n.op_type for n in kernel.ops] == ["MatMul"], model.explain()
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got["y"], want["y"], rtol=tol, atol=tol)


# -- batched products, hoisted mask preparation, a second GEMM (attention, MLP) ---------------


def _attention_proto(h=3, s=70, d=8, causal=True, causal_rank=4):
    """BERT/GPT-style attention: scale, a padding mask prepared from int64 ids (Unsqueeze,
    Cast, Sub, Mul: hoisted, it does not read the scores), a causal mask (``[s, s]`` with
    leading 1s up to ``causal_rank``), softmax, @ V."""
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["sc"]),
        helper.make_node("Div", ["sc", "scale"], ["sd"]),
        helper.make_node("Unsqueeze", ["mask", "ax"], ["m4"]),
        helper.make_node("Cast", ["m4"], ["mf"], to=1),
        helper.make_node("Sub", ["one", "mf"], ["inv"]),
        helper.make_node("Mul", ["inv", "big"], ["bias"]),
        helper.make_node("Add", ["sd", "bias"], ["sm"]),
    ]
    last = "sm"
    if causal:
        nodes.append(helper.make_node("Where", ["causal", "sm", "ninf"], ["sw"]))
        last = "sw"
    nodes += [
        helper.make_node("Softmax", [last], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["o"]),
    ]
    inits = [
        numpy_helper.from_array(np.array(np.sqrt(d), np.float32), "scale"),
        numpy_helper.from_array(np.array([1, 2], np.int64), "ax"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
        numpy_helper.from_array(np.array(-10000.0, np.float32), "big"),
        numpy_helper.from_array(
            np.tril(np.ones((s, s), bool)).reshape((1,) * (causal_rank - 2) + (s, s)), "causal"
        ),
        numpy_helper.from_array(np.array(-1e9, np.float32), "ninf"),
    ]
    qkv = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["B", h, s, d]) for n in "qkv"]
    graph = helper.make_graph(
        nodes,
        "attn",
        [*qkv, helper.make_tensor_value_info("mask", TensorProto.INT64, ["B", s])],
        [helper.make_tensor_value_info("o", TensorProto.FLOAT, ["B", h, s, d])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("batch", [1, 2])
def test_attention_is_one_fused_kernel(causal, batch):
    """QK^T -> scale -> masks -> softmax -> @V: one kernel; the scores never go to memory."""
    h, s, d = 3, 70, 8
    proto = _attention_proto(h, s, d, causal)
    feeds = {n: _rand(batch, h, s, d) for n in "qkv"}
    feeds["mask"] = (RNG.random((batch, s)) > 0.2).astype(np.int64)
    (want,) = ReferenceEvaluator(proto).run(None, feeds)
    model = geode.compile(proto)
    dense = _dense_kernels(model)
    assert len(dense) == 1, model.explain()
    ops = [n.op_type for n in dense[0].ops]
    assert ops[0] == "MatMul" and ops[-1] == "MatMul" and "ReduceMax" in ops, ops
    assert "Unsqueeze" not in ops  # the mask's preparation runs before, on its own
    np.testing.assert_allclose(model.run(feeds)["o"], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("causal_rank", [2, 3])
@pytest.mark.parametrize("threads", [1, 2])
def test_attention_with_a_lower_rank_causal_mask_is_one_fused_kernel(causal_rank, threads):
    """A causal mask of fewer dims than the scores (``[s, s]``, as GPT-2's export makes it
    from Trilu) broadcasts like numpy's leading 1s: a ``bfull`` input, the attention still
    one kernel, its heads split over the pool."""
    h, s, d = 4, 33, 8
    proto = _attention_proto(h, s, d, True, causal_rank)
    feeds = {n: _rand(2, h, s, d) for n in "qkv"}
    feeds["mask"] = (RNG.random((2, s)) > 0.2).astype(np.int64)
    (want,) = ReferenceEvaluator(proto).run(None, feeds)
    model = geode.compile(proto, num_threads=threads)
    dense = _dense_kernels(model)
    assert len(dense) == 1 and [n.op_type for n in dense[0].ops].count("MatMul") == 2, (
        model.explain()
    )
    np.testing.assert_allclose(model.run(feeds)["o"], want, rtol=1e-5, atol=1e-6)


def test_batched_epilogue_with_lower_rank_rows_and_matrices():
    """A row per head ``[3, 1, 6]`` and one matrix for all ``[5, 6]``, both of fewer dims
    than the product ``[2, 3, 5, 6]``: one dense kernel, right."""
    g = geode.Graph("bat_low")
    a = g.input("a", [2, 3, 5, 4])
    b = g.input("b", [2, 3, 4, 6])
    rows = g.input("rows", [3, 1, 6])
    mats = g.input("mats", [5, 6])
    y = g.op("Mul", g.op("Add", g.op("MatMul", a, b), rows), mats)
    g.output(g.op("Softmax", y, axis=-1), names=["y"])
    feeds = {
        "a": _rand(2, 3, 5, 4),
        "b": _rand(2, 3, 4, 6),
        "rows": _rand(3, 1, 6),
        "mats": _rand(5, 6),
    }
    model, got, want = _run_both(g, feeds)
    assert len(_dense_kernels(model)) == 1, model.explain()
    _close(got, want)


def test_lower_rank_batch_broadcast_roles():
    """The roles of values of fewer dims than a batched product ``[2, 3, 5, 6]``."""
    g = geode.Graph("roles")
    y = g.input("y", [2, 3, 5, 6])
    for shape, role in [
        ([5, 6], "bfull"),
        ([3, 5, 6], "bfull"),
        ([1, 5, 6], "bfull"),
        ([3, 1, 6], "brow"),
        ([4, 5, 6], None),  # a batch dim neither Y's nor 1
        ([5, 1], None),  # a value per row, but of fewer dims: no role
        ([6, 6], None),  # rows other than Y's
    ]:
        v = g.input("v" + "_".join(map(str, shape)), shape)
        assert value_role(v, y, batched=True) == role, shape
        assert value_role(v, y, batched=False) in (None, "row"), shape


def test_mlp_second_layer_runs_per_panel():
    """x @ W1 -> GELU -> @ W2: the hidden activation never goes to memory."""
    g = geode.Graph("mlp2")
    x = g.input("x", ["B", "S", 16])
    h = g.op("MatMul", x, g.constant(_rand(16, 64), "w1"))
    h = g.op("Gelu", g.op("Add", h, g.constant(_rand(64), "b1")))
    g.output(g.op("MatMul", h, g.constant(_rand(64, 12), "w2")), names=["y"])
    model, got, want = _run_both(g, {"x": _rand(2, 33, 16)})
    dense = _dense_kernels(model)
    assert len(dense) == 1 and [n.op_type for n in dense[0].ops].count("MatMul") == 2, (
        model.explain()
    )
    _close(got, want)


def test_one_panel_when_the_weights_are_too_large_to_repack_per_panel(monkeypatch):
    """Weights larger than a panel would be re-packed by the BLAS for every panel: one
    panel of all rows instead (the plan says so), right at every size."""
    monkeypatch.setattr(profit, "DENSE_MIN_ROWS", 1)
    monkeypatch.setattr(profit, "panel_bytes", lambda spec: 64)
    g = geode.Graph("mlp3")
    x = g.input("x", ["M", 64])
    h = g.op("Relu", g.op("MatMul", x, g.constant(_rand(64, 64), "w1")))
    g.output(g.op("MatMul", h, g.constant(_rand(64, 48), "w2")), names=["y"])
    model, got, want = _run_both(g, {"x": _rand(300, 64)})
    assert "one panel through the BLAS (weights too large" in model.explain(), model.explain()
    assert len(_dense_kernels(model)) == 1
    _close(got, want)
    ref = geode.compile(g, codegen=False)
    for rows in (1, 2, 5):  # few rows: panels pay again, and are right too
        feeds = {"x": _rand(rows, 64)}
        _close(model.run(feeds), ref.run(feeds))


def test_batched_epilogue_with_broadcast_rows_and_matrices():
    """A batched product whose epilogue reads a row per batch ([B, 1, 1, N]) and a matrix
    per head ([1, H, M, N]), both broadcast."""
    g = geode.Graph("bat")
    a = g.input("a", [2, 3, 5, 4])
    b = g.input("b", [2, 3, 4, 6])
    rows = g.input("rows", [2, 1, 1, 6])
    mats = g.input("mats", [1, 3, 5, 6])
    y = g.op("Mul", g.op("Add", g.op("MatMul", a, b), rows), mats)
    g.output(g.op("Softmax", y, axis=-1), names=["y"])
    feeds = {
        "a": _rand(2, 3, 5, 4),
        "b": _rand(2, 3, 4, 6),
        "rows": _rand(2, 1, 1, 6),
        "mats": _rand(1, 3, 5, 6),
    }
    model, got, want = _run_both(g, feeds)
    assert len(_dense_kernels(model)) == 1, model.explain()
    _close(got, want)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batch=st.lists(st.tuples(st.integers(1, 3), st.booleans(), st.booleans()), max_size=2),
    mkn=st.tuples(st.integers(1, 6), st.integers(1, 5), st.integers(1, 7)),
    d=st.integers(1, 5),
    second=st.booleans(),
)
def test_random_batched_epilogues_match_the_reference(batch, mkn, d, second):
    """Batched products with broadcast batch dims, a brow input, a row reduction, and
    sometimes a second (broadcast) MatMul."""
    m, k, n = mkn
    yb = [x for x, _, _ in batch]
    ab = [1 if one_a else x for x, one_a, _ in batch]
    bb = [1 if one_b and not one_a else x for x, one_a, one_b in batch]
    rb = [1 if one_a or one_b else x for x, one_a, one_b in batch]
    g = geode.Graph("rbat")
    a = g.input("a", [*ab, m, k])
    b = g.input("b", [1, *bb, k, n] if not batch else [*bb, k, n])
    r = g.input("r", [*rb, 1, n] if batch else [1, 1, n])
    y = g.op("Exp", g.op("Sub", g.op("MatMul", a, b), r))
    s = g.op("ReduceSum", y, g.constant(np.array([-1], np.int64)), keepdims=1)
    y = g.op("Div", y, s)
    feeds = {
        "a": _rand(*ab, m, k),
        "b": _rand(*([1, *bb] if not batch else bb), k, n),
        "r": _rand(*(rb if batch else [1]), 1, n),
    }
    if second:
        v = g.input("v", [*rb, n, d] if batch else [n, d])
        feeds["v"] = _rand(*(rb if batch else []), n, d)
        y = g.op("MatMul", y, v)
    g.output(y, names=["y"])
    model, got, want = _run_both(g, feeds)
    assert len(_dense_kernels(model)) == 1, model.explain()
    _close(got, want)
    del yb


@pytest.mark.parametrize("trans_b", [0, 1])
def test_float16_gemm_and_matmul_compute_natively_in_float32(trans_b):
    """float16 storage: the MatMul runs natively in float32 between casts, as the reference
    kernel computes it (float32, rounded back to float16)."""
    wv = _rand(*((24, 16) if trans_b else (16, 24))).astype(np.float16)
    node = helper.make_node("Gemm", ["x", "w", "c"], ["y"], transB=trans_b, alpha=0.5, beta=2.0)
    graph = helper.make_graph(
        [node, helper.make_node("MatMul", ["y", "w2"], ["z"])],
        "g16",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["M", 16])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT16, ["M", 8])],
        [
            numpy_helper.from_array(wv, "w"),
            numpy_helper.from_array(_rand(24).astype(np.float16), "c"),
            numpy_helper.from_array(_rand(24, 8).astype(np.float16), "w2"),
        ],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    x = _rand(5, 16).astype(np.float16)
    (want,) = ReferenceEvaluator(proto).run(None, {"x": x})
    model = geode.compile(proto)
    native = [k for k in model.kernels if k.kind in ("library", "dense")]
    assert len(native) == 2, model.explain()
    got = model.run({"x": x})["z"]
    assert got.dtype == np.float16
    ref = geode.compile(proto, codegen=False).run({"x": x})["z"]
    scale = float(np.abs(want.astype(np.float32)).max())
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), atol=4e-3 * scale)
    np.testing.assert_allclose(got.astype(np.float32), ref.astype(np.float32), atol=4e-3 * scale)


def test_many_large_panels_run_on_the_pool_in_one_launch():
    """A batch of attention heads whose GEMMs are each too large for the small-GEMM rule:
    with PAR_PANELS panels per thread or more, the panels go to the pool (one launch for
    the op, each GEMM single-threaded), the same bits as on one thread."""
    from geode.codegen.backends.llvm.dense import PAR_PANELS
    from geode.runtime import native

    b, h, s, d = 2, 4, 128, 64
    g = geode.Graph("heads")
    q = g.input("q", [b, h, s, d])
    kt = g.input("kt", [b, h, d, s])
    v = g.input("v", [b, h, s, d])
    p = g.op("Softmax", g.op("Mul", g.op("MatMul", q, kt), g.constant(np.float32(0.125))), axis=-1)
    g.output(g.op("MatMul", p, v), names=["o"])
    feeds = {"q": _rand(b, h, s, d), "kt": _rand(b, h, d, s), "v": _rand(b, h, s, d)}
    one = geode.compile(g, num_threads=1).run(feeds)
    model = geode.compile(g, num_threads=2)
    assert len(_dense_kernels(model)) == 1 and len(model.kernels) == 1, model.explain()
    before = native.pool_info()["launches"]
    got = model.run(feeds)
    launches = native.pool_info()["launches"] - before
    np.testing.assert_array_equal(got["o"], one["o"])
    _close(got, geode.compile(g, codegen=False).run(feeds))
    assert b * h >= PAR_PANELS * 2
    if native.get_num_threads() >= 2:
        assert launches == 1, launches
