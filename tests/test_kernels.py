"""Issue 3's kernel counts, asserted through ``model.kernels``, and the fused kernels'
results against numpy for several sizes with one compile."""

import numpy as np
import pytest

import geode
from geode import examples, ops


def aicore(model):
    return [k for k in model.kernels if k.engine == "aicore"]


def run_sizes(model, ex, sizes=(1, 5, 33)):
    rng = np.random.default_rng(0)
    for n in sizes:
        feeds = ex.make_inputs(rng, n)
        got, want = model(**feeds), ex.numpy(**feeds)
        for k in want:
            np.testing.assert_allclose(
                got[k], want[k], rtol=1e-4, atol=1e-5, err_msg=f"{ex.name} n={n} {k}"
            )


def test_rmsnorm_from_primitives_is_one_kernel():
    ex = examples.rmsnorm(hidden=96)
    types = sorted(n.op_type for n in ex.graph.nodes)
    assert types == ["Add", "Div", "Mul", "Pow", "ReduceMean", "Sqrt"]
    model = geode.compile(ex.graph)
    assert len(model.kernels) == 1 and model.kernels[0].engine == "aicore"
    assert len(model.kernels[0].ops) >= 6
    run_sizes(model, ex)


def layernorm_24_ops(hidden=64):
    g = geode.Graph("layernorm_primitives")
    x = g.input("x", ["B", "S", hidden])
    gamma = g.constant(np.linspace(0.5, 1.5, hidden, dtype=np.float32), name="gamma")
    beta = g.constant(np.linspace(-1, 1, hidden, dtype=np.float32), name="beta")
    xf = ops.cast(x, to=1)
    shape = ops.shape(xf)
    k = ops.cast(ops.gather(shape, np.array(-1, np.int64), axis=0), to=1)
    mean = ops.reduce_sum(xf, axes=[-1], keepdims=1) / k
    d = xf - ops.expand(mean, shape)
    var = ops.reduce_sum(d * d, axes=[-1], keepdims=1) / k
    rstd = ops.reciprocal(ops.sqrt(var + 1e-5))
    n = d * ops.expand(rstd, shape)
    y = n * ops.expand(ops.reshape(gamma, [1, 1, hidden]), shape)
    y = y + ops.expand(ops.reshape(beta, [1, 1, hidden]), shape)
    g.output(ops.cast(y, to=1), names=["y"])

    def ref(x):
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        return {
            "y": (x - m) / np.sqrt(v + np.float32(1e-5)) * g.values["gamma"].data
            + g.values["beta"].data
        }

    def make(rng, n):
        return {"x": rng.standard_normal((n, 3, hidden), dtype=np.float32)}

    return examples.Example("layernorm_primitives", g, ref, make)


def test_layernorm_from_20_plus_primitives_is_one_kernel():
    ex = layernorm_24_ops()
    assert len(ex.graph.nodes) >= 20
    model = geode.compile(ex.graph)
    assert len(model.kernels) == 1, model.explain()
    assert model.kernels[0].engine == "aicore"
    run_sizes(model, ex)


def test_layernorm_op_is_one_kernel():
    g = geode.Graph("ln_op")
    x = g.input("x", ["N", 48])
    g.output(
        ops.layer_normalization(
            x, g.constant(np.ones(48, np.float32)), g.constant(np.zeros(48, np.float32))
        ),
        names=["y"],
    )
    model = geode.compile(g)
    assert len(model.kernels) == 1 and model.kernels[0].engine == "aicore"


def test_softmax_is_one_kernel():
    ex = examples.softmax(hidden=70)
    model = geode.compile(ex.graph)
    assert len(model.kernels) == 1 and model.kernels[0].engine == "aicore"
    run_sizes(model, ex)


def test_reduce_chain_is_one_kernel():
    ex = examples.reduce_chain(inner=1024)
    model = geode.compile(ex.graph)
    assert len(aicore(model)) == 1, model.explain()
    # the Shape feeding Expand is host work, not a kernel: everything else is fused
    assert all(k.engine == "host" for k in model.kernels if k.engine != "aicore")
    rng = np.random.default_rng(0)
    for s1, s2 in ((1, 1), (2, 3), (4, 5)):
        x = rng.standard_normal((s1, s2, 1024), dtype=np.float32)
        np.testing.assert_allclose(model(x=x)["y"], ex.numpy(x=x)["y"], rtol=1e-4, atol=1e-3)


def test_lstm_cell_is_matmuls_plus_one_kernel():
    ex = examples.lstm_cell(input_size=16, hidden=32)
    model = geode.compile(ex.graph)
    kinds = sorted((k.engine, tuple(sorted({n.op_type for n in k.ops}))) for k in model.kernels)
    native = [k for k in model.kernels if k.engine == "aicore"]
    assert len(native) == 1, model.explain()
    others = [k for k in model.kernels if k.engine != "aicore"]
    assert all(n.op_type == "MatMul" for k in others for n in k.ops), kinds
    assert {"Sigmoid", "Tanh", "Split", "Add", "Mul"} <= {n.op_type for n in native[0].ops}
    run_sizes(model, ex)


@pytest.mark.parametrize("name", ["bias_gelu_tanh", "gelu", "silu", "lstm_gates", "layernorm"])
def test_single_kernel_examples(name):
    ex = examples.ALL[name]()
    model = geode.compile(ex.graph)
    assert len(model.kernels) == 1 and model.kernels[0].engine == "aicore", model.explain()
    run_sizes(model, ex)


def test_one_native_signature_serves_every_shape():
    ex = examples.layernorm(hidden=40)
    model = geode.compile(ex.graph)
    run_sizes(model, ex, sizes=(1, 2, 7, 64))
    assert model.kernels[0].source.count("def ") >= 1
    assert "N" in model.kernels[0].source  # the batch dim is a kernel argument


def test_kernel_exposes_source_llvm_asm_trace():
    model = geode.compile(examples.rmsnorm(hidden=32).graph)
    k = model.kernels[0]
    assert "def " in k.source and "prange" in k.source
    assert "define" in k.llvm
    assert k.asm.strip()
    assert "compute_inline" in k.trace and "parallel" in k.trace


def test_explain_shows_fusion_reasons_and_costs():
    model = geode.compile(examples.softmax(hidden=16).graph)
    text = model.explain()
    assert "fusion plan:" in text and "merge group" in text and "saves" in text
    assert "sol_us=" in text


def test_horizontal_fusion_of_siblings():
    g = geode.Graph("siblings")
    x = g.input("x", ["N", 64])
    z = g.input("z", ["N", 64])
    a = ops.tanh(x) * 2.0  # reads x
    b = ops.sigmoid(x) + 1.0  # reads x too: no edge between a and b
    c = ops.exp(z) - 1.0  # same loop space, no shared input
    g.output(a, b, c, names=["a", "b", "c"])
    model = geode.compile(g)
    assert len(model.kernels) == 1, model.explain()
    assert "horizontal" in model.explain()
    rng = np.random.default_rng(0)
    xv, zv = rng.standard_normal((2, 5, 64)).astype(np.float32)
    out = model(x=xv, z=zv)
    np.testing.assert_allclose(out["a"], np.tanh(xv) * 2, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["b"], 1 / (1 + np.exp(-xv)) + 1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["c"], np.exp(zv) - 1, rtol=1e-5, atol=1e-6)


def test_castlike_reads_only_its_data_input():
    import warnings

    from geode.codegen.driver import CodegenWarning

    g = geode.Graph("castlike_rank")
    a = g.input("a", [], "int64")
    t = g.input("t", [2, 3], "float32")
    g.output(ops.cast_like(a, t) * 2.0, names=["x"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", CodegenWarning)
        model = geode.compile(g)
    out = model(a=np.array(3, np.int64), t=np.zeros((2, 3), np.float32))["x"]
    assert out.dtype == np.float32 and out.shape == () and float(out) == 6.0
