"""Issue 3's kernel counts, asserted through ``model.kernels``, and the fused kernels'
results against numpy for several sizes with one compile."""

import re

import numpy as np
import pytest

import geode
from geode import examples, ops
from geode.compiler.interpret import run_reference
from geode.errors import ExecutionError

#: the parallel loop of a chunked kernel's chunk function: this chunk's share of it
CHUNK_LOOP = re.compile(r"^\s+for (\w+) in range\(\1_lo, \1_hi\):$", re.M)


def runs_parallel(source: str) -> bool:
    """Does a kernel's source run its parallel loop on threads: a numba prange, or a
    chunked kernel's share of the loop launched through ``_g_launch``?"""
    return "numba.prange(" in source or bool(CHUNK_LOOP.search(source) and "_g_launch(" in source)


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


def test_lstm_cell_is_one_dense_step():
    """Both GEMMs and the gates in one dense step (the gates on column pieces of one
    product's panels, the other product computed beside it: tests/codegen/
    test_summed_gemms.py); without dense epilogues, the MatMuls plus one kernel."""
    ex = examples.lstm_cell(input_size=16, hidden=32)
    model = geode.compile(ex.graph)
    assert [k.kind for k in model.kernels] == ["dense"], model.explain()
    assert [n.op_type for n in model.kernels[0].ops][:2] == ["MatMul", "MatMul"]
    run_sizes(model, ex)


def test_lstm_cell_is_matmuls_plus_one_kernel():
    ex = examples.lstm_cell(input_size=16, hidden=32)
    model = geode.compile(ex.graph, dense_epilogues=False)
    kinds = sorted((k.kind, tuple(sorted({n.op_type for n in k.ops}))) for k in model.kernels)
    native = [k for k in model.kernels if k.kind == "fused"]
    assert len(native) == 1, model.explain()
    others = [k for k in model.kernels if k.kind != "fused"]
    assert all(n.op_type == "MatMul" for k in others for n in k.ops), kinds
    # the MatMuls call BLAS from native code (the LLVM backend's library routines)
    assert [k.kind for k in others] == ["library", "library"], kinds
    assert {"Sigmoid", "Tanh", "Split", "Add", "Mul"} <= {n.op_type for n in native[0].ops}
    run_sizes(model, ex)


@pytest.mark.parametrize("name", ["bias_gelu_tanh", "gelu", "silu", "lstm_gates", "layernorm"])
def test_single_kernel_examples(name):
    ex = examples.ALL[name]()
    model = geode.compile(ex.graph)
    assert len(model.kernels) == 1 and model.kernels[0].engine == "aicore", model.explain()
    run_sizes(model, ex)


@pytest.mark.parametrize("lazy", [True, False])
@pytest.mark.numba
def test_lazy_compile_option_leaves_or_compiles_the_plain_chunk_function(lazy, monkeypatch):
    """The LSTM gates' kernel streams ``h`` (``streaming=0``: at any size): by default
    geode.compile leaves its plain chunk function for the first call that needs it;
    with ``lazy_compile=False`` (or ``GEODE_LAZY_COMPILE=0``) geode.compile compiles it
    too. Either way small and large batches match numpy."""
    from geode.codegen.backends.numba import kernel as nb_kernel

    nb_kernel._memo.clear()
    monkeypatch.setenv("GEODE_LAZY_COMPILE", "1" if lazy else "0")
    ex = examples.lstm_gates(hidden=64)
    model = geode.compile(ex.graph, streaming="0", backend="numba")
    (native,) = [k for k in nb_kernel._memo.values() if len(k._chunk_fns) == 2]
    plain, nt = native._chunk_fns
    assert native._chunk_fns[nt] is not None
    assert (native._chunk_fns[plain] is None) == lazy
    run_sizes(model, ex, sizes=(1, 3, 64))
    nb_kernel._memo.clear()


@pytest.mark.parametrize("how", ["primitives", "Gelu op"])
@pytest.mark.numba
def test_tanh_gelu_computes_its_gate_in_one_division(how):
    """The tanh GELU, written out in primitives or as Gelu(approximate='tanh'), computes
    ``0.5 * x * (1 + tanh(z))`` as one ``div_one_plus_exp(x, -2z)`` (``x / (1 +
    exp(-2z))``), ``-2z`` folded to ``x * (-2c + (-2ck) * (x * x))``, in its one kernel,
    and matches float64 numpy of the formula."""
    if how == "primitives":
        graph = examples.gelu(hidden=200, approximate="tanh", with_bias=True).graph
        bias = np.linspace(-0.5, 0.5, 200, dtype=np.float32)
    else:
        graph = geode.Graph("gelu_op")
        x = graph.input("x", ["N", 200])
        graph.output(ops.gelu(x, approximate="tanh"), names=["y"])
        bias = np.zeros(200, np.float32)
    model = geode.compile(graph, backend="numba")
    (k,) = model.kernels
    assert k.engine == "aicore" and "div_one_plus_exp_f32(" in k.source, model.explain()
    assert "one_plus_tanh" not in k.source and "0.044715" not in k.source
    x = np.random.default_rng(1).standard_normal((37, 200)).astype(np.float32) * 4
    h = x.astype(np.float64) + bias
    want = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h**3)))
    np.testing.assert_allclose(model(x=x)["y"], want, rtol=2e-6, atol=1e-6)


@pytest.mark.numba
def test_one_native_signature_serves_every_shape():
    ex = examples.layernorm(hidden=40)
    model = geode.compile(ex.graph, backend="numba")
    run_sizes(model, ex, sizes=(1, 2, 7, 64))
    assert model.kernels[0].source.count("def ") >= 1
    assert "N" in model.kernels[0].source  # the batch dim is a kernel argument


@pytest.mark.numba
def test_kernel_exposes_source_llvm_asm_trace():
    model = geode.compile(examples.rmsnorm(hidden=32).graph, backend="numba")
    k = model.kernels[0]
    assert "def " in k.source and runs_parallel(k.source)
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


def test_heads_split_of_two_inputs_compiles_natively():
    """Attention's head split of Q and V (Reshape -> Transpose, one scaled) is one kernel
    whose two blocks share a loop nest and bind the same index expressions, with a
    size-1 leading axis (a constant 0 binding). Binding the second block to the first
    one's hoisted names folded ``0 * 2 + v2`` to an already substituted name that was
    then looked up again ("unbound variable 'Mul_58_v2'"), and the group fell back to
    AICPU (ONNX attention_3d_transpose_verification, linear_attention_decode_step)."""
    import warnings

    from geode.codegen.driver import CodegenWarning

    g = geode.Graph("heads")
    q = g.input("q", [1, 2, 12])
    v = g.input("v", [1, 2, 12])
    qh = ops.transpose(ops.reshape(q, [1, 2, 3, 4]), perm=[0, 2, 1, 3])
    vh = ops.transpose(ops.reshape(v, [1, 2, 3, 4]), perm=[0, 2, 1, 3])
    g.output(qh * 0.5, vh, names=["qs", "vh"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", CodegenWarning)
        model = geode.compile(g)
    assert [k.engine for k in model.kernels] == ["aicore"]
    rng = np.random.default_rng(3)
    qa, va = (rng.standard_normal((1, 2, 12), dtype=np.float32) for _ in range(2))
    out = model(q=qa, v=va)
    np.testing.assert_array_equal(out["qs"], qa.reshape(1, 2, 3, 4).transpose(0, 2, 1, 3) * 0.5)
    np.testing.assert_array_equal(out["vh"], va.reshape(1, 2, 3, 4).transpose(0, 2, 1, 3))


# ---------------------------------------------------------------------------------
# max/min reductions: fast maxnum/minnum with an integer NaN guard, exact np.max/np.min
# ---------------------------------------------------------------------------------

#: bit patterns of NaNs the guard must see: quiet/signalling, both signs, smallest payload
_NAN_BITS = {
    "float32": (np.uint32, [0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FFFFFFF]),
    "float64": (
        np.uint64,
        [
            0x7FF8000000000000,
            0xFFF8000000000000,
            0x7FF0000000000001,
            0xFFF0000000000001,
            0x7FFFFFFFFFFFFFFF,
        ],
    ),
}


def minmax_rows(m, dtype, rng):
    """Rows of length m probing a max/min reduction: NaN first/middle/last, all NaN,
    negative and signalling NaNs, +-inf, all -inf/+inf, extremes and subnormals (no
    zeros: the sign of a +0/-0 tie is unspecified)."""
    dt = np.dtype(dtype)
    utype, nan_bits = _NAN_BITS[dtype]
    fi = np.finfo(dt)

    def row(**at):
        r = (rng.standard_normal(m) + np.where(rng.random(m) < 0.5, 3.0, -3.0)).astype(dt)
        for pos, v in at.items():
            r[{"first": 0, "mid": m // 2, "last": m - 1}[pos]] = v
        return r

    nans = np.array(nan_bits, dtype=utype).view(dt)
    rows = [row(), row(), row(first=np.nan), row(mid=np.nan), row(last=np.nan)]
    rows += [row(mid=v) for v in nans] + [row(last=v) for v in nans]
    rows += [np.full(m, np.nan, dt), np.full(m, -np.nan, dt), np.full(m, nans[2], dt)]
    rows += [row(mid=np.inf), row(last=-np.inf), row(first=np.inf, last=-np.inf)]
    rows += [np.full(m, -np.inf, dt), np.full(m, np.inf, dt), np.full(m, 3.5, dt)]
    rows += [row(first=-np.inf, mid=np.nan), row(mid=np.inf, last=-np.nan)]
    rows += [row(first=fi.max / 4, last=-fi.max / 4), row(mid=fi.smallest_subnormal)]
    pos = (np.abs(rng.standard_normal(m)) * fi.smallest_subnormal * 64).astype(dt)
    rows += [pos + fi.smallest_subnormal, -(pos + fi.smallest_subnormal)]
    return np.stack(rows).astype(dt)


@pytest.fixture(scope="module", params=["float32", "float64"])
def minmax_model(request):
    g = geode.Graph(f"minmax_{request.param}")
    x = g.input("x", ["N", "M"], request.param)
    g.output(
        ops.reduce_max(x, axes=[-1], keepdims=0) * 2.0,
        ops.reduce_min(x, axes=[-1], keepdims=0) * 2.0,
        names=["mx", "mn"],
    )
    return request.param, geode.compile(g, backend="numba")


@pytest.mark.numba
def test_max_min_reductions_use_the_guarded_fast_path(minmax_model):
    dtype, model = minmax_model
    (k,) = aicore(model)
    src = k.source
    gty, inf_bits = {"float32": ("int32", 0x7F800000), "float64": ("int64", 0x7FF0000000000000)}[
        dtype
    ]
    assert "_g_maxnum_nn(" in src and "_g_minnum_nn(" in src
    assert src.count("_g_nanguard(") == 2
    assert src.count(f"> np.{gty}({inf_bits}):") == 2
    assert src.count(f"= np.{dtype}(np.nan)") == 2
    assert "_g_maximum" not in src and "_g_minimum" not in src


@pytest.mark.parametrize("m", [1, 2, 3, 7, 15, 16, 17, 31, 32, 33, 63, 100, 257, 1000])
@pytest.mark.numba
def test_max_min_reductions_match_numpy(minmax_model, m):
    dtype, model = minmax_model
    x = minmax_rows(m, dtype, np.random.default_rng(m))
    out = model(x=x)
    two = np.dtype(dtype).type(2)
    with np.errstate(invalid="ignore"):  # signalling NaNs
        refs = {"mx": np.max(x, axis=1) * two, "mn": np.min(x, axis=1) * two}
    for name, ref in refs.items():
        assert out[name].dtype == np.dtype(dtype)
        np.testing.assert_array_equal(out[name], ref, err_msg=f"{name} {dtype} m={m}")
        assert np.array_equal(np.isnan(out[name]), np.isnan(ref))


@pytest.mark.numba
def test_max_min_over_several_axes_match_numpy():
    g = geode.Graph("minmax_axes")
    x = g.input("x", ["N", "A", "B"], "float64")
    y = g.input("y", ["N", "A", "B"], "float32")
    g.output(
        ops.reduce_min(x, axes=[1, 2], keepdims=0) * 2.0,
        ops.reduce_max(y, axes=[1, 2], keepdims=0) * 2.0,
        names=["mn", "mx"],
    )
    model = geode.compile(g, backend="numba")
    src = "\n".join(k.source for k in aicore(model))
    assert "_g_minnum_nn(" in src and "_g_maxnum_nn(" in src and "_g_nanguard(" in src
    rng = np.random.default_rng(1)
    for a, b in ((1, 1), (3, 5), (4, 16), (7, 9), (2, 33)):
        xs = minmax_rows(a * b, "float64", rng).reshape(-1, a, b)
        ys = minmax_rows(a * b, "float32", rng).reshape(-1, a, b)
        out = model(x=xs, y=ys)
        with np.errstate(invalid="ignore"):  # signalling NaNs
            mn, mx = xs.min(axis=(1, 2)) * 2, ys.max(axis=(1, 2)) * np.float32(2)
        np.testing.assert_array_equal(out["mn"], mn, err_msg=f"{a}x{b}")
        np.testing.assert_array_equal(out["mx"], mx, err_msg=f"{a}x{b}")


def test_softmax_row_with_nan_is_nan():
    """The row max feeds exp(x - max): a NaN anywhere in a row makes that row NaN, and the
    other rows stay exact softmax values."""
    ex = examples.softmax(hidden=40)
    model = geode.compile(ex.graph)
    x = np.random.default_rng(2).standard_normal((5, 40)).astype(np.float32)
    x[1, 0], x[2, 39], x[3, 17] = np.nan, np.nan, -np.nan
    y = model(x=x)["y"]
    assert np.isnan(y[1:4]).all()
    np.testing.assert_allclose(y[[0, 4]], ex.numpy(x=x[[0, 4]])["y"], rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------
# prefetching the next row (row-reduce schedules with rows of >= PREFETCH_MIN_ROW)
# ---------------------------------------------------------------------------------


@pytest.mark.parametrize("streaming", ["auto", "off"])
@pytest.mark.numba
def test_softmax_prefetches_the_next_row_over_its_exp_chunks(streaming):
    """Softmax's exp pass is compute-bound: it is not pipelined
    (autoschedule.Choices.pipeline_max_host_ops) but cut into chunks that each prefetch a share of
    the next row into the L2. Streamed, the exp row stays in a row buffer and the scaled
    row streams; unstreamed, the row is scaled in place in the output."""
    ex = examples.softmax(hidden=1024)
    model = geode.compile(ex.graph, streaming=streaming, backend="numba")
    (k,) = aicore(model)
    # rows of 4 KiB: 8 rows ahead (PREFETCH_MAX_ROWS caps the 16 of PREFETCH_AHEAD_BYTES)
    assert "software_pipeline" not in k.trace and "level=2, distance=8)" in k.trace
    assert k.source.count("_g_prefetch_l2(x, ") == 1 and "_g_prefetch(" not in k.source
    assert ("reuse_output(" in k.trace) == (streaming == "off")
    # streamed, e / sum goes from the exp row buffer to y in one dividing copy (no stage)
    assert ("_g_stream_divided(y, " in k.source) == (streaming != "off")
    assert "_g_stream(" not in k.source
    # streamed, the scale pass of each row runs inside the next row's exp pass
    assert ("defer_last_pass(" in k.trace) == (streaming != "off")
    deferred = re.search(r"softmax_reducesum_\d+_prev = ", k.source) is not None
    assert deferred == (streaming != "off")
    run_sizes(model, ex, sizes=(1, 2, 7, 16, 17, 130))


@pytest.mark.numba
def test_deferred_output_pass_reads_the_previous_rows_registers_and_input():
    """log-softmax from primitives: the streamed output pass ``x - max - log(sum)`` reads
    the input row and two registers; deferred into the next row's exp pass, it reads
    copies of both registers taken at the end of its own row. Row counts cover chunks
    of 1, 2 and 16 rows and a short last chunk."""
    g = geode.Graph("logsoftmax")
    x = g.input("x", ["N", 1024])
    z = x - ops.reduce_max(x, axes=[-1], keepdims=1)
    g.output(z - ops.log(ops.reduce_sum(ops.exp(z), axes=[-1], keepdims=1)), names=["y"])
    model = geode.compile(g, backend="numba")
    (k,) = aicore(model)
    assert "defer_last_pass(" in k.trace
    assert k.source.count("_prev = ") == 4  # two registers: zeroed per chunk, copied per row
    # its output is no product of a row buffer: staged, then copied
    assert "_g_stream(y, " in k.source and "_g_stream_scaled" not in k.source
    assert "_g_stream_divided" not in k.source
    rng = np.random.default_rng(8)
    for n in (1, 2, 3, 15, 16, 17, 33, 130):
        xv = (rng.standard_normal((n, 1024)) * 4).astype(np.float32)
        zv = xv.astype(np.float64) - xv.max(-1, keepdims=True)
        want = zv - np.log(np.exp(zv).sum(-1, keepdims=True))
        np.testing.assert_allclose(model(x=xv)["y"], want, rtol=2e-6, atol=2e-6, err_msg=f"{n=}")


@pytest.mark.numba
def test_softmax_times_a_reciprocal_streams_its_exp_row_scaled():
    """``e * reciprocal(sum(e))`` stages ``e_row[j] * (1 / sum)``: streamed from the exp row
    buffer as one scaled copy, like ``e / sum``, with numpy's results (rows of one chunk
    of rows, several, and a short last chunk)."""
    g = geode.Graph("softmax_reciprocal")
    x = g.input("x", ["N", 1024])
    e = ops.exp(x - ops.reduce_max(x, axes=[-1], keepdims=1))
    g.output(e * ops.reciprocal(ops.reduce_sum(e, axes=[-1], keepdims=1)), names=["y"])
    model = geode.compile(g, streaming="0", backend="numba")
    (k,) = aicore(model)
    assert "_g_stream_scaled(y, " in k.source and "_g_stream(" not in k.source, k.source
    rng = np.random.default_rng(3)
    for n in (1, 2, 17, 130):
        xv = (rng.standard_normal((n, 1024)) * 4).astype(np.float32)
        z = np.exp(xv.astype(np.float64) - xv.max(-1, keepdims=True))
        want = z / z.sum(-1, keepdims=True)
        np.testing.assert_allclose(model(x=xv)["y"], want, rtol=2e-6, atol=1e-9, err_msg=f"{n=}")


@pytest.mark.parametrize("name", ["rmsnorm", "layernorm"])
@pytest.mark.numba
def test_cheap_row_passes_are_not_deferred(name):
    """Only a costly pass (softmax's exp) hosts the next row's deferred output pass."""
    model = geode.compile(examples.ALL[name](hidden=1024).graph, backend="numba")
    (k,) = aicore(model)
    assert "_g_stream(y, " in k.source and "defer_last_pass" not in k.trace


@pytest.mark.parametrize("name", ["rmsnorm", "layernorm"])
@pytest.mark.numba
def test_row_kernels_pipeline_the_next_row(name):
    ex = examples.ALL[name](hidden=1024)
    model = geode.compile(
        ex.graph, streaming="off", backend="numba"
    )  # streamed row kernels prefetch instead
    (k,) = aicore(model)
    assert "software_pipeline(loop=" in k.trace and "prefetch_next" not in k.trace
    assert runs_parallel(k.source) and "_cur = " in k.source
    # chunks of max(1, min(64, N // 8)) rows: 1 (N < 16), 2 and 16 (a short last chunk)
    run_sizes(model, ex, sizes=(1, 2, 7, 16, 17, 130))


def test_row_kernel_that_cannot_pipeline_prefetches_instead():
    """exp(x) / sum(exp(x)): the first pass writes the output (its exp values), so the
    next row's first pass cannot run inside this row's passes; the next row is
    prefetched instead."""
    g = geode.Graph("expnorm")
    x = g.input("x", ["N", 2048])
    e = ops.exp(x)
    g.output(e / ops.reduce_sum(e, axes=[-1], keepdims=1), names=["y"])
    model = geode.compile(g)
    (k,) = aicore(model)
    assert "software_pipeline" not in k.trace and "prefetch_next(loop=" in k.trace
    rng = np.random.default_rng(3)
    for n in (1, 3):
        xv = rng.standard_normal((n, 2048)).astype(np.float32)
        want = np.exp(xv) / np.exp(xv).sum(-1, keepdims=True)
        np.testing.assert_allclose(model(x=xv)["y"], want, rtol=1e-5, atol=1e-9)


# ---------------------------------------------------------------------------------
# streaming (non-temporal) stores of large outputs
# ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,kw",
    [
        ("rmsnorm", {"hidden": 1040}),
        ("layernorm", {"hidden": 1024}),
        # softmax streams only rows it prefetches over: multiples of PREFETCH_CHUNK
        ("softmax", {"hidden": 1152}),
        ("reduce_chain", {}),
        ("bias_gelu_tanh", {}),
        ("lstm_gates", {}),
    ],
)
@pytest.mark.numba
def test_streamed_outputs_match_numpy(name, kw):
    """``streaming=0`` streams every cheap output at any size (the same code that runs for
    outputs beyond the last-level cache); results equal numpy's for short and long rows
    (that the chunks do not divide, where the schedule streams such rows), with one
    compile."""
    ex = examples.ALL[name](**kw)
    model = geode.compile(ex.graph, streaming="0", backend="numba")
    streams = ["stream_output(" in k.trace for k in aicore(model)]
    direct = ["store_nontemporal(" in k.trace for k in aicore(model)]
    # the LSTM gates are compute-bound: only h, which no pass reads, is streamed, from
    # the registers; the GELU streams from the registers with its loop interleaved where
    # the target interleaves (AVX-512)
    from geode.codegen.autoschedule import stream_interleave
    from geode.codegen.backends.target import vector_registers

    gelu = stream_interleave(vector_registers()) > 1
    want = {"bias_gelu_tanh": False, "lstm_gates": False}.get(name, True)
    assert any(streams) == want, streams
    assert any(direct) == {"bias_gelu_tanh": gelu, "lstm_gates": True}.get(name, False), direct
    run_sizes(model, ex, sizes=(1, 5, 33, 130))
    for k in aicore(model):
        assert ("_g_ntstore(" in k.source) == ("store_nontemporal(" in k.trace), k.source
    if any(direct):  # outputs of 1 MiB and more start on a cache line: the streaming body
        row = min(o.nbytes for o in model(**ex.make_inputs(np.random.default_rng(1), 1)).values())
        rows = -(-(1 << 20) // row)
        run_sizes(model, ex, sizes=(rows,))
        outs = model(**ex.make_inputs(np.random.default_rng(1), rows))
        assert all(o.ctypes.data % 64 == 0 and o.nbytes >= 1 << 20 for o in outs.values())
    if any(streams):
        assert all("_g_sfence()" in k.source for k in aicore(model) if "_g_stream" in k.source)
        # rows of whole cache lines: non-temporal at run time (reduce_chain's row offset
        # goes through // and % of its fused row loop, still a multiple of the row);
        # softmax's staged e / sum streams as a dividing copy of its exp row
        lines = [ln for k in aicore(model) for ln in k.source.splitlines()]
        calls = [ln for ln in lines if "_g_stream(" in ln]
        scaled = [ln for ln in lines if "_g_stream_divided(" in ln]
        assert bool(scaled) == (name == "softmax") and (calls or scaled), lines
        assert not any(ln.endswith(", False)") for ln in calls), calls
        assert not any(", False, " in ln for ln in scaled), scaled


@pytest.mark.parametrize("rows,cols", [(["N"], 1040), (["N"], 4096), (["N", 3], 1024)])
@pytest.mark.numba
def test_streamed_elementwise_rows_with_prefetch_match_numpy(rows, cols):
    """A streamed elementwise row that prefetches the next row over its chunks gives
    numpy's results for one row (nothing to prefetch), a few and many rows, with rows
    the chunks divide and rows they do not, and rows of fused outer loops; the
    broadcast row is not prefetched."""
    g = geode.Graph("ew")
    x, b = g.input("x", [*rows, cols]), g.input("b", [cols])
    g.output(ops.exp(x) * 2.0 + b, names=["y"])
    model = geode.compile(g, streaming="0", backend="numba")
    (k,) = aicore(model)
    assert "stream_output(" in k.trace and "_g_prefetch_l2(x," in k.source
    assert "_g_prefetch_l2(b," not in k.source
    rng = np.random.default_rng(3)
    bias = rng.standard_normal(cols, dtype=np.float32)
    for n in (1, 2, 7, 64):
        xs = rng.standard_normal((n, *[3] * (len(rows) - 1), cols), dtype=np.float32)
        got = model(x=xs, b=bias)["y"]
        np.testing.assert_allclose(got, np.exp(xs) * 2.0 + bias, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["rmsnorm", "softmax"])
def test_rows_off_the_cache_line_or_too_short_are_not_streamed(name):
    """Streamed chunks must start on cache lines: rows of 1000 float32 (4000 bytes) would
    split a line between two chunks' scalar stores at every chunk (1.3-1.6x the time of
    plain stores); rows of 64 floats are too short to pay for the staging
    (autoschedule.Choices.stream_min_run_bytes). Both keep plain stores, with numpy's results."""
    for hidden in (1000, 64):
        ex = examples.ALL[name](hidden=hidden)
        model = geode.compile(ex.graph, streaming="0")
        (k,) = aicore(model)
        assert "stream_output(" not in k.trace and "_g_stream(" not in k.source
        run_sizes(model, ex, sizes=(1, 5, 33))
    # rmsnorm: 65 lines a row, 8 chunks of 128 and one of 16; softmax streams only rows
    # its exp chunks divide (it prefetches over them): 9 chunks of 128
    ex = examples.ALL[name](hidden=1040 if name == "rmsnorm" else 1152)
    (k,) = aicore(geode.compile(ex.graph, streaming="0"))
    assert "stream_output(" in k.trace


@pytest.mark.numba
def test_streamed_row_kernel_fences_once_per_chunk_of_rows():
    """The streaming stores of a thread's share of the rows are fenced once, after its
    row loop, not after every row (a fence per row cost softmax over rows of 128 floats
    half its time); results hold for one row, a few and many."""
    ex = examples.rmsnorm(hidden=1024)
    model = geode.compile(ex.graph, streaming="0", backend="numba")
    (k,) = aicore(model)
    body = k.source[k.source.index("_body(x, weight, y, N, chunk, chunks):") :].splitlines()
    (fence,) = [ln for ln in body if "_g_sfence()" in ln]
    (rows,) = [ln for ln in body if re.match(r"\s*for mul_sp in range\(mul_sp_lo, mul_sp_hi\)", ln)]
    indent = len(fence) - len(fence.lstrip())
    assert indent == len(rows) - len(rows.lstrip()) and body.index(fence) > body.index(rows)
    run_sizes(model, ex, sizes=(1, 3, 130))


@pytest.mark.numba
def test_symbolic_rows_stream_non_temporally_only_when_chunks_start_on_lines():
    """With a symbolic row length the line test is part of the run-time streaming test:
    rows of 1000 float32 take the plain copy, rows of 1024 the non-temporal one; both
    give numpy's results."""
    g = geode.Graph("ew")
    x = g.input("x", ["N", "K"])
    g.output(ops.exp(x) * 2.0, names=["y"])
    model = geode.compile(g, streaming="0", backend="numba")
    (k,) = aicore(model)
    (call,) = [ln for ln in k.source.splitlines() if "_g_stream(" in ln]
    assert " == 0)" in call  # (K * 4) % 64 == 0, computed once per kernel
    rng = np.random.default_rng(6)
    for n, cols in ((3, 1000), (5, 1024), (2, 24)):
        xs = rng.standard_normal((n, cols), dtype=np.float32)
        np.testing.assert_allclose(model(x=xs)["y"], np.exp(xs) * 2.0, rtol=2e-6, atol=1e-6)


# -- Gather indices are checked before a kernel reads with them ---------------------------


def _gather_model(x_shape, i_shape, idx_dtype="int64", axis=0, epilogue=True):
    g = geode.Graph("gather_check")
    x = g.input("x", x_shape)
    i = g.input("i", i_shape, idx_dtype)
    y = ops.gather(x, i, axis=axis)
    g.output(ops.relu(y) + 1.0 if epilogue else y, names=["y"])
    return geode.compile(g)


@pytest.mark.parametrize("idx_dtype", ["int64", "int32"])
@pytest.mark.parametrize("symbolic", [False, True])
def test_gather_out_of_range_index_raises(idx_dtype, symbolic):
    """An index outside [-size, size) raises ExecutionError naming the node, the index, the
    axis and its size, instead of reading outside the input (a far index crashed the
    process); in-range indices, negative ones included, give numpy's result."""
    x_shape = ["R", "C"] if symbolic else [4, 5]
    model = _gather_model(x_shape, ["B", "S"], idx_dtype)
    assert [k.engine for k in model.kernels] == ["aicore"]
    x = np.arange(20, dtype=np.float32).reshape(4, 5) - 7
    ok = np.array([[0, 3, -1], [-4, 2, 1]], dtype=idx_dtype)
    np.testing.assert_array_equal(model(x=x, i=ok)["y"], np.maximum(x[ok], 0) + 1)
    for bad in (4, -5, 10**9 if idx_dtype == "int64" else 2**31 - 1, -(2**31)):
        idx = ok.copy()
        idx[1, 2] = bad
        with pytest.raises(ExecutionError) as err:
            model(x=x, i=idx)
        msg = str(err.value)
        assert "Gather" in msg and f"index {bad} " in msg and "axis 0 of size 4" in msg


def test_gather_index_checked_on_inner_axis_and_empty_indices():
    model = _gather_model(["N", "C"], ["K"], axis=1, epilogue=False)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(model(x=x, i=np.array([3, -4]))["y"], x[:, [3, -4]])
    assert model(x=x, i=np.zeros(0, np.int64))["y"].shape == (3, 0)
    with pytest.raises(ExecutionError, match="index 4 is out of range for axis 1 of size 4"):
        model(x=x, i=np.array([0, 4]))


def test_gather_constant_index_checked_against_a_symbolic_dim():
    """A constant index folded into the kernel as a literal is checked against the run's
    size of a symbolic axis."""
    g = geode.Graph("gather_const")
    x = g.input("x", ["N", 5])
    g.output(ops.relu(ops.gather(x, g.constant(np.array(3, np.int64)), axis=0)), names=["y"])
    model = geode.compile(g)
    x = np.arange(-10, 10, dtype=np.float32).reshape(4, 5)
    np.testing.assert_array_equal(model(x=x)["y"], np.maximum(x[3], 0))
    with pytest.raises(ExecutionError, match="index 3 is out of range for axis 0 of size 2"):
        model(x=x[:2])


def test_gather_of_indices_computed_in_the_group_is_not_fused():
    """Indices computed from another input (a Cast) cannot be checked before a kernel
    that computes them: fusion keeps the Gather apart (the reason is recorded), and the
    indices are still checked."""
    g = geode.Graph("gather_computed")
    x = g.input("x", ["N", 4])
    f = g.input("f", ["K"])
    i = ops.cast(ops.abs(f) * 2.0, to=7)
    g.output(ops.relu(ops.gather(x, i, axis=1)), names=["y"])
    model = geode.compile(g)
    assert "computed in the group" in model.explain()
    x = np.arange(-6, 6, dtype=np.float32).reshape(3, 4)
    f = np.array([0.5, -1.0, 1.5], np.float32)
    np.testing.assert_array_equal(model(x=x, f=f)["y"], np.maximum(x[:, [1, 2, 3]], 0))
    with pytest.raises(ExecutionError, match="index 4 is out of range for axis 1 of size 4"):
        model(x=x, f=np.array([2.0], np.float32))


# -- found by differential fuzzing against the reference path ----------------------------


def test_pow_of_an_integer_base_to_a_float_exponent():
    """ONNX Pow(int, float): the power of the values, then cast to the base's type (the
    exponent was cast to int first: 4 ** 0.5 gave 1)."""
    g = geode.Graph("pow")
    x = g.input("x", ["N"], "int32")
    y = g.input("y", ["N"], "float32")
    g.output(ops.pow(x, y) + 1, names=["z"])
    model = geode.compile(g)
    assert [k.engine for k in model.kernels] == ["aicore"]
    a = np.array([2, 4, 9, 3, 10, 7], np.int32)
    b = np.array([0.5, 0.5, 0.5, 2.5, -1.0, 1.9], np.float32)
    want = np.power(a, b).astype(np.int32) + 1
    np.testing.assert_array_equal(model(x=a, y=b)["z"], want)
    np.testing.assert_array_equal(model(x=a, y=b)["z"], run_reference(g, {"x": a, "y": b})["z"])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_softplus_is_stable_at_both_ends(dtype):
    """log(exp(x) + 1) overflowed to inf from x = 89 (float32) and lost the tiny values of
    very negative x; the compiled form matches log1p(exp(x)) over the whole range."""
    g = geode.Graph("softplus")
    x = g.input("x", ["N"], dtype)
    g.output(ops.softplus(x), names=["y"])
    model = geode.compile(g)
    assert [k.engine for k in model.kernels] == ["aicore"]
    a = np.array(
        [-1000, -100, -20, -1, -0.0, 0, 1e-8, 1, 20, 88, 100, 1000, np.inf, -np.inf, np.nan]
    )
    a = a.astype(dtype)
    with np.errstate(invalid="ignore"):
        want = np.logaddexp(np.zeros_like(a), a)
    got = model(x=a)["y"]
    assert np.all(np.isfinite(got[:-3])) and got[-3] == np.inf and got[-2] == 0
    assert np.isnan(got[-1])
    tiny = np.finfo(dtype).tiny
    np.testing.assert_allclose(got[:-3], want[:-3], rtol=8 * np.finfo(dtype).eps, atol=tiny)


@pytest.mark.numba
def test_thread_count_is_set_by_each_model_not_inherited():
    """numba's thread count belongs to the calling thread and outlives a call: a model
    compiled for all cores ran on one after a ``num_threads=1`` model (or user code) had
    set it, at half speed with no sign of it."""
    import numba

    every_core = numba.config.NUMBA_NUM_THREADS
    if every_core < 2:
        pytest.skip("one numba thread: all cores and one core are the same here")
    ex = examples.softmax(hidden=64)
    one = geode.compile(ex.graph, num_threads=1, backend="numba")
    every = geode.compile(ex.graph, backend="numba")
    assert all(k.engine == "aicore" for k in every.kernels)
    x = np.random.default_rng(0).standard_normal((64, 64), dtype=np.float32)
    before = numba.get_num_threads()
    try:
        one(x=x)
        assert numba.get_num_threads() == 1
        every(x=x)
        assert numba.get_num_threads() == every_core
        numba.set_num_threads(1)  # the user's own setting
        np.testing.assert_allclose(every(x=x)["y"], one(x=x)["y"], rtol=1e-6)
        every(x=x)
        assert numba.get_num_threads() == every_core
    finally:
        numba.set_num_threads(before)


def test_merged_argument_views_with_zero_and_unit_dims():
    """A kernel that merges dims (merge_dims) views its arguments by runs of dims whose
    products are the merged dims; zero and unit dims make a greedy match ambiguous
    (found by geode.fuzz: a Cast of float32[0, 0, 1, 0] refused its own input)."""
    from geode.codegen import ast as A
    from geode.codegen.driver import view_starts

    c = A.Const
    assert view_starts([c(0), c(0), c(1), c(0)], [c(0), c(1), c(0)]) == (0, 2, 3)
    assert view_starts([c(4), c(1)], [c(4)]) == (0,)
    assert view_starts([c(2), c(3), c(4)], [c(6), c(4)]) == (0, 2)
    assert view_starts([c(2), c(3)], [c(5)]) is None
    for shape in ([0, 0, 1, 0], [0, 3, 0], [3, 1, 0, 2]):
        g = geode.Graph("zeros")
        x = g.input("x", shape)
        g.output(ops.cast(x, to="int32"), ops.exp(x) * 2.0, names=["i", "e"])
        model = geode.compile(g)
        feeds = {"x": np.zeros(shape, np.float32)}
        got, want = model.run(feeds), run_reference(g, feeds)
        for name in want:
            assert got[name].shape == want[name].shape and got[name].dtype == want[name].dtype
