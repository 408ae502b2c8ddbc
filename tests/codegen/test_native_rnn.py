"""LSTM as a native AI Core op (backends/llvm/lstm.py, codegen/native_rnn.py): the
compiled kernel against the reference kernel and onnx's ReferenceEvaluator, its argument
checks, and which LSTMs models run natively (and why the others do not)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import geode
from geode.codegen.backends.llvm.lstm import LstmKernel, LstmSpec, lstm_kernel
from geode.codegen.backends.llvm.lstm_panels import panel_rows
from geode.codegen.backends.llvm.target import host
from geode.compiler.ops.rnn import recurrent
from geode.errors import ShapeError

TOL = {"float32": 2e-5, "float64": 1e-12}
DIRS = {"forward": 1, "reverse": 1, "bidirectional": 2}


def lstm_inputs(rng, dtype, hidden, size, direction, layout, seq, batch, opt):
    """Random LSTM inputs in ONNX order (None for an omitted one); ``opt``: the set of
    optional inputs to give (B, sequence_lens, initial_h, initial_c, P)."""
    d = DIRS[direction]
    state = (batch, d, hidden) if layout else (d, batch, hidden)

    def arr(shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(dtype)

    return [
        arr((batch, seq, size) if layout else (seq, batch, size)),
        arr((d, 4 * hidden, size), 0.4),
        arr((d, 4 * hidden, hidden), 0.4),
        arr((d, 8 * hidden)) if "B" in opt else None,
        rng.integers(0, seq + 1, batch).astype(np.int32) if "sequence_lens" in opt else None,
        arr(state) if "initial_h" in opt else None,
        arr(state) if "initial_c" in opt else None,
        arr((d, 3 * hidden)) if "P" in opt else None,
    ]


def run_kernel(dtype, hidden, size, direction, layout, seq, batch, opt, n_out=3, seed=0):
    """(native outputs, reference outputs) of one LSTM on random data."""
    ins = lstm_inputs(
        np.random.default_rng(seed), dtype, hidden, size, direction, layout, seq, batch, opt
    )
    spec = LstmSpec(
        dtype, hidden, size, DIRS[direction], direction == "reverse", layout,
        "B" in opt, "initial_h" in opt, "initial_c" in opt, "P" in opt, n_out,
        lens="sequence_lens" in opt,
    )  # fmt: skip
    want = recurrent("LSTM", ins, {"direction": direction, "layout": layout, "hidden_size": hidden})
    outs = [np.full(w.shape, np.nan, dtype) for w in want[:n_out]]
    lstm_kernel(spec)(*[a for a in ins if a is not None], *outs)
    return outs, want[:n_out]


ALL = {"B", "sequence_lens", "initial_h", "initial_c", "P"}


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_native_lstm_matches_the_reference_kernel(direction, layout, dtype) -> None:
    """Every direction and layout, with every optional input and without any."""
    for opt in (ALL, set()):
        got, want = run_kernel(dtype, 6, 5, direction, layout, 4, 3, opt)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype
            np.testing.assert_allclose(g, w, rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("batch", [4, 5, 6, 7, 9])
def test_products_in_row_blocks_and_their_tail(batch) -> None:
    """Batches that fill blocks of ``ROWS`` rows of ``h`` exactly and with 1-3 rows left
    (the projection's rows, ``seq * batch``, too) match the reference kernel."""
    from geode.codegen.backends.llvm.lstm import ROWS

    assert ROWS == 4  # the batches above: whole blocks, and each tail length
    for layout in (0, 1):
        got, want = run_kernel("float32", 8, 6, "bidirectional", layout, 3, batch, ALL)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=TOL["float32"], atol=TOL["float32"])


@pytest.mark.parametrize("vbytes", [16, 32, 64])
def test_products_at_each_vector_width(vbytes, monkeypatch) -> None:
    """The products' vectors of 16, 32 and 64 bytes (what hosts without AVX, with AVX
    and with AVX-512 get): sums over ``K`` shorter than a vector, and longer with a
    masked part left; hidden sizes that leave units after the blocks of ``UNITS``."""
    from geode.codegen.backends.llvm import lstm

    monkeypatch.setattr(lstm, "vector_bytes", lambda target: vbytes)
    hidden, size = 5 + vbytes // 8, 3 + vbytes // 4  # distinct specs: a kernel per width
    for dtype in ("float32", "float64"):
        got, want = run_kernel(dtype, hidden, size, "bidirectional", 1, 3, 5, ALL)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize(
    "direction, dtype, case",
    [
        ("forward", "float32", "blocks"),
        ("forward", "float64", "blocks"),
        ("bidirectional", "float32", "blocks"),
        ("bidirectional", "float64", "blocks"),
        ("forward", "float32", "batch1"),
        ("bidirectional", "float64", "batch1"),
    ],
)
def test_products_shared_among_threads_give_the_same_bits(direction, dtype, case) -> None:
    """Products big enough for the pool (``MIN_PARALLEL_FMAS``; the projection's column
    chunks are not a power of two) give bit for bit what one thread gives, and match the
    reference kernel, with sequence lengths and every optional input. The steps' items:
    "blocks", two row blocks, the second short, by two runs of units, the second short
    and not a multiple of ``UNITS``; "batch1", one batch row by five runs of units (more
    items than chunks on two threads), the last of three units."""
    from geode.codegen.backends.llvm.lstm import GATE_UNITS, MIN_PARALLEL_FMAS, ROW_BLOCK, UNITS

    if case == "blocks":
        hidden, size, seq, batch = GATE_UNITS + 6, 40, 5, ROW_BLOCK + 4
    else:
        hidden, size, seq, batch = 4 * GATE_UNITS + 3, 40, 5, 1
    assert batch * hidden * 4 * hidden >= MIN_PARALLEL_FMAS  # the steps' products too
    assert hidden % GATE_UNITS % UNITS
    ins = lstm_inputs(np.random.default_rng(7), dtype, hidden, size, direction, 0, seq, batch, ALL)
    spec = LstmSpec(
        dtype, hidden, size, DIRS[direction], False, 0, True, True, True, True, 3, lens=True
    )
    kernel = lstm_kernel(spec)
    attrs = {"direction": direction, "layout": 0, "hidden_size": hidden}
    want = recurrent("LSTM", ins, attrs)
    # one thread: no launch; more: the projection, and all the steps (a step's product
    # and gates, a barrier between steps) in one stepped launch, of each direction
    _same_bits_on_threads(kernel, ins, want, dtype, DIRS[direction])


def _same_bits_on_threads(  # noqa: ANN001
    kernel, ins, want, dtype, directions: int, blocks: bool = False
) -> None:
    """The kernel on 1, 2 and 3 threads (outputs NaN-filled first): no pool launch on one
    thread and on more two per direction (its start, then its steps as one stepped
    launch, or, ``blocks``, as one launch of a chunk per row block), the same bits on all,
    the reference's results."""
    from geode.runtime import native

    results, launched = {}, {}
    for threads in (1, 2, 3):
        outs = [np.full(w.shape, np.nan, dtype) for w in want]
        info = native.pool_info()
        kernel(*[a for a in ins if a is not None], *outs, threads=threads)
        after = native.pool_info()
        launched[threads] = tuple(
            after[key] - info[key] for key in ("launches", "stepped_launches")
        )
        results[threads] = outs
    want_launches = (2 * directions, 0 if blocks else directions)
    assert launched == {1: (0, 0), 2: want_launches, 3: want_launches}
    for threads in (2, 3):
        for a, b in zip(results[1], results[threads]):
            np.testing.assert_array_equal(a, b)
    for g, w in zip(results[1], want):
        np.testing.assert_allclose(g, w, rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_panel_form_gives_the_same_bits_on_any_thread_count(dtype, direction) -> None:
    """The outer-product form (batch at least ``PANEL_MIN_BATCH``): an odd batch (blocks of
    8, 4 and 1 rows), a hidden size leaving a part-filled last panel at every vector width,
    sequence lengths and every optional input, batch-first; the same bits on 1, 2 and 3
    threads (the start, packing and projecting, and every step launched on more than one),
    and the reference kernel's results. Batch 13 on 2 and 3 threads is split by rows (7
    and 5 rows a thread): each row block runs its steps in its own chunk."""
    from geode.codegen.backends.llvm.lstm import MIN_PARALLEL_FMAS
    from geode.codegen.backends.llvm.lstm_panels import PANEL_MIN_BATCH

    hidden, size, seq, batch = 37, 19, 4, 13
    assert batch >= PANEL_MIN_BATCH and batch * hidden * 4 * hidden >= MIN_PARALLEL_FMAS
    assert hidden % 2 and hidden % 16
    ins = lstm_inputs(np.random.default_rng(3), dtype, hidden, size, direction, 1, seq, batch, ALL)
    spec = LstmSpec(
        dtype, hidden, size, DIRS[direction], False, 1, True, True, True, True, 3, lens=True
    )
    kernel = lstm_kernel(spec)
    want = recurrent("LSTM", ins, {"direction": direction, "layout": 1, "hidden_size": hidden})
    _same_bits_on_threads(kernel, ins, want, dtype, DIRS[direction], blocks=True)


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_first_step_without_initial_h_skips_its_product(direction, dtype) -> None:
    """Without initial_h the first step's product (h = +0) is not computed, its sums
    stored as +0: the same bits as the kernel given initial_h of zeros (+0 and -0), which
    computes it, at batch 1 (dot products) and 5 (panels), with and without
    sequence_lens (a row of length 0 among them), on 1 and 2 threads."""
    hidden, size, seq = 21, 6, 5
    for batch in (1, 5):
        for opt in ({"B", "initial_c"}, {"B", "sequence_lens"}):
            ins = lstm_inputs(
                np.random.default_rng(batch), dtype, hidden, size, direction, 0, seq, batch, opt
            )
            if ins[4] is not None:
                ins[4][0] = 0
            spec = LstmSpec(
                dtype, hidden, size, DIRS[direction], direction == "reverse", 0,
                True, False, "initial_c" in opt, False, 3, lens="sequence_lens" in opt,
            )  # fmt: skip
            given = LstmSpec(
                dtype, hidden, size, DIRS[direction], direction == "reverse", 0,
                True, True, "initial_c" in opt, False, 3, lens="sequence_lens" in opt,
            )  # fmt: skip
            state = (DIRS[direction], batch, hidden)
            for zero in (0.0, -0.0):
                with_h = list(ins)
                with_h[5] = np.full(state, zero, dtype)
                for threads in (1, 2):
                    want = recurrent("LSTM", ins, {"direction": direction, "hidden_size": hidden})
                    got = [np.full(w.shape, np.nan, dtype) for w in want]
                    ref = [np.full(w.shape, np.nan, dtype) for w in want]
                    lstm_kernel(spec)(*[a for a in ins if a is not None], *got, threads=threads)
                    lstm_kernel(given)(*[a for a in with_h if a is not None], *ref, threads=threads)
                    for g, r, w in zip(got, ref, want):
                        np.testing.assert_array_equal(g, r)
                        np.testing.assert_allclose(g, w, rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("batch", [1, 2, 3])
def test_the_forms_either_side_of_the_panel_threshold(batch) -> None:
    """Batch 1 (dot products), 2 (the outer-product form's first batch: one block of 2
    rows) and 3 (blocks of 2 and 1), no input features (only ``R``'s panels packed), and
    a projection with them, both layouts."""
    from geode.codegen.backends.llvm.lstm_panels import PANEL_MIN_BATCH

    assert PANEL_MIN_BATCH == 2
    for size in (0, 9):
        got, want = run_kernel("float32", 21, size, "reverse", batch % 2, 3, batch, {"B"})
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=TOL["float32"], atol=TOL["float32"])


def test_panel_form_with_16_vector_registers(monkeypatch) -> None:
    """Blocks of 4 rows (a target with 16 vector registers: ``panel_rows``), a batch of
    7 (blocks of 4, 2 and 1 rows), float32 and float64."""
    from geode.codegen.backends.llvm import lstm
    from geode.codegen.backends.llvm.lstm_panels import panel_rows

    assert panel_rows(16) == 4 and panel_rows(32) == 8
    monkeypatch.setattr(lstm, "panel_rows", lambda registers: 4)
    spec = LstmSpec("float32", 23, 11, 2, False, 0, True, True, True, True, 3, lens=True)
    ir = lstm.lstm_ir(spec, "", 64, 32)[1]
    assert "%acc3_1" in ir and "%acc4_1" not in ir  # 4 rows by 2 vectors of accumulators
    for dtype in ("float32", "float64"):
        # a spec no other test compiles: the kernel cache holds one per spec
        got, want = run_kernel(dtype, 23, 11, "bidirectional", 0, 3, 7, ALL)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=TOL[dtype], atol=TOL[dtype])


def test_panel_passes_and_no_prefetch() -> None:
    """A block's passes over K (``_passes``): all the (panel, group) streams in one pass
    when their accumulators fit in a full block's, else each panel's groups together, else
    one group per pass; every stream in exactly one pass. The panel products prefetch
    nothing (the hardware streams the panels)."""
    from geode.codegen.backends.llvm import lstm_panels as lp
    from geode.codegen.backends.llvm.irtext import ModuleWriter

    every = [(q, g) for q in range(2) for g in range(lp.GROUPS)]
    assert lp._passes(1, 8, 2) == [every]  # batch 1, two panels: 8 accumulators
    assert lp._passes(2, 8, 2) == [every]  # 16
    assert lp._passes(4, 8, 2) == [every[:2], every[2:]]  # a panel's groups: 16
    assert lp._passes(8, 8, 2) == [[s] for s in every]
    assert lp._passes(1, 4, 2) == [every] and lp._passes(2, 4, 2) == [every[:2], every[2:]]
    assert lp._passes(2, 8, 1) == [every[:2]] and lp._passes(8, 8, 1) == [[s] for s in every[:2]]
    for block_rows in (2, 4, 8):
        for count in range(1, block_rows + 1):
            for panels in (1, 2, 4):
                passes = lp._passes(count, block_rows, panels)
                streams = sorted(s for one in passes for s in one)
                assert streams == sorted((q, g) for q in range(panels) for g in range(lp.GROUPS))
    module = ModuleWriter("m")
    for panels in (1, 2):
        fn = lp.panel_product_function(module, "p", "float", 4, 32, 16, 8, "", panels)
        assert "@llvm.prefetch" not in fn.text()
    # two panels: a 1-row block's 8 accumulators, a full block's 16 (8 rows by 2 vectors)
    text = fn.text()
    assert "%acc7_1" in text and "%acc0_7" in text and "%acc8_0" not in text


@pytest.mark.parametrize(
    "seq, batch, size, opt",
    [
        (1, 1, 3, {"B"}),  # one step
        (3, 0, 3, ALL),  # no batch: empty outputs
        (0, 2, 3, {"initial_h", "initial_c"}),  # no steps: the states are the initial ones
        (0, 2, 3, set()),  # ... or zeros
        (4, 2, 0, {"B", "initial_h"}),  # no input features: only the biases and R
        (5, 3, 4, {"initial_c"}),
        (2, 2, 4, {"P"}),
    ],
)
def test_native_lstm_edge_sizes(seq, batch, size, opt) -> None:
    """Bidirectional, batch-first when the case gives an odd number of optional inputs."""
    layout = len(opt) % 2
    got, want = run_kernel("float32", 7, size, "bidirectional", layout, seq, batch, opt)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("n_out", [1, 2])
def test_native_lstm_writes_only_the_outputs_it_has(n_out) -> None:
    got, want = run_kernel("float64", 5, 3, "reverse", 0, 3, 2, {"B"}, n_out=n_out)
    assert len(got) == n_out
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)


def test_native_lstm_checks_its_arguments() -> None:
    spec = LstmSpec("float32", 4, 3, 1, False, 0, True, False, False, False, 3)
    k = lstm_kernel(spec)
    x, w = np.ones((5, 2, 3), np.float32), np.ones((1, 16, 3), np.float32)
    r, b = np.ones((1, 16, 4), np.float32), np.ones((1, 32), np.float32)
    y, yh, yc = (np.zeros(s, np.float32) for s in ((5, 1, 2, 4), (1, 2, 4), (1, 2, 4)))
    with pytest.raises(ValueError, match=r"argument X must have shape \(T, N, 3\)"):
        k(np.ones((5, 2, 4), np.float32), w, r, b, y, yh, yc)
    with pytest.raises(ValueError, match=r"argument W must have shape \(1, 16, 3\)"):
        k(x, np.ones((1, 12, 3), np.float32), r, b, y, yh, yc)
    with pytest.raises(ValueError, match="argument R must have shape"):
        k(x, w, np.ones((2, 16, 4), np.float32), b, y, yh, yc)
    with pytest.raises(ValueError, match="argument B must have shape"):
        k(x, w, r, np.ones((1, 16), np.float32), y, yh, yc)
    with pytest.raises(ValueError, match=r"argument Y must have shape \(T, 1, N, 4\)"):
        k(x, w, r, b, np.zeros((5, 1, 3, 4), np.float32), yh, yc)
    with pytest.raises(ValueError, match="argument Y_c must have shape"):
        k(x, w, r, b, y, yh, np.zeros((1, 2, 4, 1), np.float32))
    with pytest.raises(TypeError, match="must be a float32 array of rank 3"):
        k(x.astype(np.float64), w, r, b, y, yh, yc)
    k(np.asfortranarray(x), w, r, b, y, yh, yc)  # a strided input is copied
    want = recurrent("LSTM", [x, w, r, b], {"hidden_size": 4})
    np.testing.assert_allclose(y, want[0], rtol=1e-5)
    assert isinstance(k, LstmKernel) and "geode_lstm_" in k.source and "sigmoid" in k.source


def test_lstm_spec_rejects_what_it_cannot_compile() -> None:
    with pytest.raises(ValueError, match="hidden size 0"):
        LstmSpec("float32", 0, 3, 1, False, 0, False, False, False, False, 1)
    with pytest.raises(ValueError, match="float16"):
        LstmSpec("float16", 4, 3, 1, False, 0, False, False, False, False, 1)


def test_native_lstm_out_of_memory_is_a_geode_error() -> None:
    """A scratch buffer malloc cannot give (the address space capped) returns the
    out-of-memory status, raised as ExecutionError: 300M steps of one unit with no input
    features need 4.8 GB of gates (Y itself, 1.2 GB, is never touched)."""
    script = textwrap.dedent(
        """
        import resource, numpy as np
        from geode.codegen.backends.llvm.lstm import LstmSpec, lstm_kernel
        from geode.errors import ExecutionError
        k = lstm_kernel(LstmSpec("float32", 1, 0, 1, False, 0, False, False, False, False, 1))
        t = 300_000_000
        x, w, r = np.ones((t, 1, 0), np.float32), np.ones((1, 4, 0), np.float32), np.ones((1, 4, 1), np.float32)
        y = np.zeros((t, 1, 1, 1), np.float32)
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, hard))
        try:
            k(x, w, r, y, threads=1)
        except ExecutionError as exc:
            print("raised:", exc)
        """
    )
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "raised: kernel lstm: out of memory allocating its scratch buffer"


# -- models -------------------------------------------------------------------------
def ort_run(model, feeds: dict) -> list:
    """onnxruntime's outputs of ``model``."""
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString()).run(None, feeds)


def lstm_model(ins, direction, layout, outputs=("y", "y_h", "y_c"), dims=None, **attrs):
    """An ONNX model of one LSTM: X a graph input, the other given inputs initializers;
    ``outputs``: the names of Y, Y_h, Y_c ("" for one not asked for)."""
    names = ["x", "w", "r", "b", "lens", "h0", "c0", "p"]
    et = helper.np_dtype_to_tensor_dtype(ins[0].dtype)
    inits = [numpy_helper.from_array(a, n) for a, n in zip(ins[1:], names[1:]) if a is not None]
    used = [n if i == 0 or ins[i] is not None else "" for i, n in enumerate(names)]
    while used[-1] == "":
        used.pop()
    hidden = ins[2].shape[-1]
    node = helper.make_node(
        "LSTM", used, list(outputs), hidden_size=hidden, direction=direction, layout=layout, **attrs
    )
    g = helper.make_graph(
        [node],
        "lstm",
        [helper.make_tensor_value_info("x", et, list(dims or ins[0].shape))],
        [helper.make_tensor_value_info(o, et, None) for o in outputs if o],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


@st.composite
def lstm_configs(draw):
    direction = draw(st.sampled_from(list(DIRS)))
    layout = draw(st.sampled_from([0, 1]))
    sizes = (draw(st.integers(1, 9)), draw(st.integers(1, 6)), draw(st.integers(1, 4)))
    seq = draw(st.integers(1, 5))
    opt = {n for n in ALL if draw(st.booleans())}
    dtype = draw(st.sampled_from(["float32", "float32", "float64"]))
    outputs = draw(st.sampled_from([("y", "y_h", "y_c"), ("y",), ("", "y_h"), ("y", "", "y_c")]))
    return direction, layout, sizes, seq, opt, dtype, outputs, draw(st.booleans())


@settings(max_examples=10, deadline=None)
@given(lstm_configs())
def test_native_lstm_models_match_onnx_reference(cfg) -> None:
    """Random LSTMs compiled to native steps (static or symbolic sequence and batch)
    against onnx's ReferenceEvaluator and geode's AICPU path."""
    direction, layout, (hidden, size, batch), seq, opt, dtype, outputs, symbolic = cfg
    ins = lstm_inputs(
        np.random.default_rng(2), dtype, hidden, size, direction, layout, seq, batch, opt
    )
    dims = (["N", "T", size] if layout else ["T", "N", size]) if symbolic else None
    model = lstm_model(ins, direction, layout, outputs, dims)
    native = geode.compile(model)
    assert [(k.kind, k.engine) for k in native.kernels] == [("library", "aicore")]
    got = native(x=ins[0])
    if ins[4] is None:
        want = ReferenceEvaluator(model).run(None, {"x": ins[0]})
    else:  # onnx's ReferenceEvaluator ignores sequence_lens; onnxruntime does not (but
        # has no float64 or batch-first LSTM): the others are checked against the AICPU path
        ort_ok = dtype == "float32" and layout == 0
        want = ort_run(model, {"x": ins[0]}) if ort_ok else []
    aicpu = geode.compile(model, codegen=False)(x=ins[0])
    tol = 1e-5 if dtype == "float32" else 1e-10
    # a batch entry of length 0: onnxruntime zeroes its Y_h/Y_c, geode's reference keeps
    # the initial states (ONNX leaves it open); Y agrees
    empty = ins[4] is not None and bool((np.asarray(ins[4]) == 0).any())
    for name, w in zip([o for o in outputs if o], want):
        if empty and name != "y":
            continue
        np.testing.assert_allclose(got[name], w, rtol=tol, atol=tol)
    for name in [o for o in outputs if o]:
        np.testing.assert_allclose(got[name], aicpu[name], rtol=tol, atol=tol)


def test_explain_says_when_an_items_panels_go_in_one_pass(monkeypatch) -> None:
    """The LSTM's reason in ``explain()`` names the rows up to which a step's item takes
    all its panels of R in one pass (``item_panels_together``: 2 rows and 2 panels with
    16 lanes and 32 registers; none with 8 lanes and 16 registers, or when switched off);
    nothing where R is never in panels at that batch (float64 packed per call: its panels
    from batch 2, its one-pass items of 1 row)."""
    from geode.codegen.backends.llvm import lstm
    from geode.codegen.native_rnn import _together_note

    assert lstm.item_panels_together(16, 8) == (2, 2)
    assert lstm.item_panels_together(16, 8, packed_once=False) == (2, 2)  # batch 2
    assert lstm.item_panels_together(8, 8) == (4, 1)
    assert lstm.item_panels_together(8, 8, packed_once=False) == (4, 0)  # 1 row < 2
    assert lstm.item_panels_together(8, 4) == (4, 0)
    assert lstm.item_panels_together(32, 8) == (1, 0)
    f32 = LstmSpec("float32", 8, 5, 1, False, 1, True, False, False, False, 1, panel_lanes=16)
    f64 = LstmSpec("float64", 8, 5, 1, False, 1, True, False, False, False, 1)
    block = panel_rows(host().vector_registers)
    panels, rows = lstm.item_panels_together(lstm.panel_lanes("float32", host()), block)
    note = f"at most {rows} batch rows: their {panels} panels of R in one pass"
    assert (note in _together_note(f32)) == (rows >= 1)
    f64_rows = lstm.item_panels_together(lstm.panel_lanes("float64", host()), block, False)[1]
    assert (_together_note(f64) == "") == (f64_rows == 0)
    # AVX-512: float32 packed once has the one-pass function, float64 (8 lanes, 4 panels,
    # 1 row, its panels from batch 2) none
    assert ".panels(" in lstm.lstm_ir(f32, "", 64, 32)[1]
    assert ".panels(" not in lstm.lstm_ir(f64, "", 64, 32)[1]
    monkeypatch.setattr(lstm, "ITEM_PANELS_TOGETHER", False)
    assert _together_note(f32) == ""


def test_lstms_are_placed_on_aicore_as_library_ops() -> None:
    rng = np.random.default_rng(4)
    ins = lstm_inputs(rng, "float32", 8, 5, "bidirectional", 1, 6, 2, {"B", "P"})
    model = geode.compile(lstm_model(ins, "bidirectional", 1, dims=["N", "T", 5]))
    info = {k.name: k for k in model.kernels}
    (name,) = info
    assert (info[name].kind, info[name].engine) == ("library", "aicore")
    reason = "library op: LSTM, native products and gate loop"
    assert f"{name}: aicore ({reason}" in model.explain()
    assert info[name].trace.startswith("LSTM float32 hidden=8 input=5 bidirectional layout=1")
    assert "define" in info[name].source
    attrs = {"hidden_size": 8, "direction": "bidirectional", "layout": 1}
    for batch, seq in ((2, 6), (5, 3), (1, 1)):  # one compiled model, several input sizes
        x = rng.standard_normal((batch, seq, 5)).astype(np.float32)
        want = recurrent("LSTM", [x, *ins[1:]], attrs)
        got = model(x=x)
        for n, w in zip(("y", "y_h", "y_c"), want):
            np.testing.assert_allclose(got[n], w, rtol=1e-5, atol=1e-5)


def _stay(**changes):
    """An LSTM model (float32, forward, B given) with ``changes`` to its attributes, its
    X's dtype (``dtype``) or its inputs (``lens``: a sequence_lens input)."""
    dtype = changes.pop("dtype", "float32")
    ins = lstm_inputs(np.random.default_rng(5), dtype, 4, 3, "forward", 0, 3, 2, {"B"})
    model = lstm_model(ins, "forward", 0, **changes.pop("attrs", {}))
    if changes.pop("lens", False):
        model.graph.node[0].input.append("lens")  # X, W, R, B, sequence_lens
        model.graph.input.append(helper.make_tensor_value_info("lens", TensorProto.INT32, [2]))
    return model, ins[0]


@pytest.mark.parametrize(
    "model, reason",
    [
        (_stay(attrs={"clip": 2.0}), "clip (native: none)"),
        (_stay(attrs={"input_forget": 1}), "input_forget (native: 0)"),
        (_stay(attrs={"activations": ["Tanh", "Tanh", "Tanh"]}), "activations ['tanh', 'tanh'"),
        (_stay(dtype="float16"), "float16"),
    ],
    ids=["clip", "input_forget", "activations", "float16"],
)
def test_lstms_that_stay_on_aicpu_say_why(model, reason) -> None:
    compiled = geode.compile(model[0])
    (k,) = compiled.kernels
    assert k.engine == "aicpu"
    assert f": aicpu (library op: reference kernel (LSTM: {reason}" in compiled.explain()
    feeds = {"x": model[1]}
    got = compiled(**feeds)
    # onnx's ReferenceEvaluator ignores clip, input_forget and activations; onnxruntime
    # does not (but has no float16 LSTM)
    if model[1].dtype != np.float16:
        want = ort_run(model[0], feeds)
    else:
        want = ReferenceEvaluator(model[0]).run(None, feeds)
    tol = 5e-3 if model[1].dtype == np.float16 else 1e-5
    for w, g in zip(want, got.values()):
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol)
    off = geode.compile(model[0], codegen=False)
    assert "LSTM: " not in off.explain() and [k.engine for k in off.kernels] == ["aicpu"]


def test_sequence_lens_given_at_run_time_go_native() -> None:
    """sequence_lens as a graph input: native, each batch entry's own steps (onnxruntime
    agrees); a length outside [0, T] is a ShapeError."""
    model, x = _stay(lens=True)
    compiled = geode.compile(model)
    (k,) = compiled.kernels
    assert (k.engine, k.kind) == ("aicore", "library")
    for lens in ([3, 1], [0, 2], [3, 3]):
        feeds = {"x": x, "lens": np.array(lens, np.int32)}
        got = compiled(**feeds)
        for w, g in zip(ort_run(model, feeds), got.values()):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    with pytest.raises(ShapeError, match="sequence_lens value must be between 0 and"):
        compiled(x=x, lens=np.array([4, 1], np.int32))
    with pytest.raises(ShapeError, match="sequence_lens"):
        compiled(x=x, lens=np.array([-1, 1], np.int32))
