"""A float32 LSTM's constant W and R packed once (codegen/packed_weights.py: the
``lstm_w`` and ``lstm_r<lanes>`` forms; backends/llvm/lstm.py: ``LstmSpec.panel_lanes``):
the kernel given them against the reference kernel and against the kernel that packs per
call (the same bits from batch 2), on 1, 2 and 3 threads; compiled models' explain()
line, their derived constants, a model file's re-packing at load; and the LSTMs that keep
packing per call."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from test_native_rnn import ALL, DIRS, TOL, lstm_inputs, lstm_model

import geode
from geode.codegen.backends.llvm import lstm as lstm_mod
from geode.codegen.backends.llvm.lstm import (
    MIN_PARALLEL_FMAS,
    MIN_SPLIT_ROWS,
    ROW_BLOCK,
    LstmSpec,
    lstm_kernel,
    panel_lanes,
)
from geode.codegen.backends.llvm.lstm_panels import PANEL_MIN_BATCH
from geode.codegen.backends.llvm.target import host
from geode.codegen.packed_weights import choose_lstm_packing, lstm_panels, packed_value
from geode.compiler.ops.rnn import recurrent
from geode.config import Options
from geode.errors import CodegenError
from geode.runtime import native

pytestmark = pytest.mark.skipif(
    native.pool_info()["gemm_packed_isa"] < 1, reason="the packed kernel needs AVX2 + FMA"
)

LANES = panel_lanes("float32", host())


def _spec(hidden, size, direction, layout, opt, lanes):  # noqa: ANN001, ANN202
    return LstmSpec(
        "float32", hidden, size, DIRS[direction], direction == "reverse", layout,
        "B" in opt, "initial_h" in opt, "initial_c" in opt, "P" in opt, 3,
        lens="sequence_lens" in opt, panel_lanes=lanes,
    )  # fmt: skip


def _packed(ins):  # noqa: ANN001, ANN202
    """W and R packed as a compiled model's constants are."""
    w = np.stack([native.pack_weight(m, transposed=True) for m in ins[1]])
    return w, lstm_panels(ins[2], LANES)


def _given(ins):  # noqa: ANN001, ANN202
    """The packed kernel's inputs: W and R packed, in their places."""
    return [ins[0], *_packed(ins), *[a for a in ins[3:] if a is not None]]


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("layout", [0, 1])
def test_kernel_given_packed_weights_matches_reference_and_per_call(direction, layout) -> None:
    """Batches 1, 2 and 8, with every optional input, with B alone or with none (each
    direction and layout gets two of these: a kernel per spec is compiled): the reference
    kernel's results; from batch 2 (both products in panels: the projection by the
    packed-weight GEMM sums like the panels, one fused multiply-add chain along K) the
    same bits as the kernel that packs per call. Hidden 37: a part-filled last panel of R
    and of the GEMM's 16 columns."""
    hidden, size, seq = 37, 19, 4
    first = (list(DIRS).index(direction) + layout) % 3
    for opt in [(ALL, {"B"}, set())[(first + j) % 3] for j in (0, 1)]:
        given = lstm_kernel(_spec(hidden, size, direction, layout, opt, LANES))
        per_call = lstm_kernel(_spec(hidden, size, direction, layout, opt, 0))
        for batch in (1, PANEL_MIN_BATCH, 8):
            rng = np.random.default_rng(batch)
            ins = lstm_inputs(rng, "float32", hidden, size, direction, layout, seq, batch, opt)
            attrs = {"direction": direction, "layout": layout, "hidden_size": hidden}
            want = recurrent("LSTM", ins, attrs)
            got = [np.full(w.shape, np.nan, np.float32) for w in want]
            ref = [np.full(w.shape, np.nan, np.float32) for w in want]
            arrays = [a for a in ins if a is not None]
            given(*_given(ins), *got)
            per_call(*arrays, *ref)
            for g, w, r in zip(got, want, ref):
                np.testing.assert_allclose(g, w, rtol=TOL["float32"], atol=TOL["float32"])
                if batch >= PANEL_MIN_BATCH:
                    np.testing.assert_array_equal(g, r)


def _by_row_blocks(batch: int, threads: int) -> bool:
    """Whether a batch-first direction's steps on ``threads`` threads run as one launch of
    a chunk per row block (``lstm._Steps``): the items split the batch by rows (at least
    ``MIN_SPLIT_ROWS`` a thread) into at most a block per thread."""
    share = -(-batch // threads)
    rows = min(share, ROW_BLOCK)
    return share >= MIN_SPLIT_ROWS and rows < batch and -(-batch // rows) <= threads


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
@pytest.mark.parametrize("batch, hidden", [(1, 37), (4, 64), (13, 37), (40, 37)])
def test_kernel_given_packed_weights_same_bits_on_any_thread_count(
    direction, batch, hidden
) -> None:
    """The same bits on 1, 2 and 3 threads (the projection's packed-weight GEMM split over
    the pool by panels of its columns, in the steps' stepped launch or on its own, or by
    row blocks in their own chunks), and the reference's results."""
    size = 40
    seq = 24 if batch == 1 else 4  # the projection's GEMM big enough to split either way
    ins = lstm_inputs(
        np.random.default_rng(5), "float32", hidden, size, direction, 1, seq, batch, ALL
    )
    kernel = lstm_kernel(_spec(hidden, size, direction, 1, ALL, LANES))
    want = recurrent("LSTM", ins, {"direction": direction, "layout": 1, "hidden_size": hidden})
    arrays = _given(ins)
    results, launched, stepped = {}, {}, {}
    for threads in (1, 2, 3):
        outs = [np.full(w.shape, np.nan, np.float32) for w in want]
        before = native.pool_info()
        kernel(*arrays, *outs, threads=threads)
        launched[threads] = native.pool_info()["launches"] - before["launches"]
        stepped[threads] = native.pool_info()["stepped_launches"] - before["stepped_launches"]
        results[threads] = outs
    # one thread: no launch; more, one launch per direction: with enough multiply-adds
    # a launch of a chunk per row block (each its rows' projection and steps, no barrier)
    # or one stepped launch (the projection its step 0, the steps after it); at batch 1
    # the projection's packed GEMM's launch, the steps on the calling thread
    pooled = batch * hidden * 4 * hidden >= MIN_PARALLEL_FMAS
    assert pooled == (batch > 1)
    assert launched[1] == 0 and launched[2] == launched[3] == DIRS[direction]
    want_stepped = {
        threads: DIRS[direction] if pooled and not _by_row_blocks(batch, threads) else 0
        for threads in (2, 3)
    }
    assert stepped == {1: 0, **want_stepped}
    # the rule's cases: batch 4 stepped (2 rows a thread), 13 by blocks (7 and 5 rows a
    # thread), 40 stepped on 2 threads (3 blocks of 16 rows), by blocks on 3
    modes = {1: (False, False), 4: (False, False), 13: (True, True), 40: (False, True)}
    assert modes[batch] == (_by_row_blocks(batch, 2), _by_row_blocks(batch, 3))
    for threads in (2, 3):
        for a, b in zip(results[1], results[threads]):
            np.testing.assert_array_equal(a, b)
    for g, w in zip(results[1], want):
        np.testing.assert_allclose(g, w, rtol=TOL["float32"], atol=TOL["float32"])


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_odd_steps_items_in_the_other_order_give_the_same_bits(direction, monkeypatch) -> None:
    """A step's items and their panels last to first on odd steps (``ALTERNATE_ITEMS``)
    against first to last: the same bits at batch 1 (dot products unpacked, panels
    packed), 5 (stepped) and 8 (by row blocks on 2 threads, stepped on 3), with
    sequence_lens (a row of length 0), on 1 to 3 threads, W and R given packed and packed
    per call; the two kernels' IR differs."""
    hidden, size, seq = 40, 12, 7
    old = native.get_num_threads()
    native.set_num_threads(3)
    try:
        for batch in (1, 5, 8):
            ins = lstm_inputs(
                np.random.default_rng(batch), "float32", hidden, size, direction, 1, seq,
                batch, ALL,
            )  # fmt: skip
            ins[4][0] = 0
            want = recurrent(
                "LSTM", ins, {"direction": direction, "layout": 1, "hidden_size": hidden}
            )
            plain = [a for a in ins if a is not None]
            for lanes, arrays in ((LANES, _given(ins)), (0, plain)):
                spec = _spec(hidden, size, direction, 1, ALL, lanes)
                kernels, texts = {}, {}
                for alternate in (True, False):
                    monkeypatch.setattr(lstm_mod, "ALTERNATE_ITEMS", alternate)
                    texts[alternate] = lstm_mod.lstm_ir(spec, "", 4 * LANES, 32)[1]
                    kernels[alternate] = lstm_kernel.__wrapped__(spec)  # not the memo's
                assert texts[True] != texts[False]
                for threads in (1, 2, 3):
                    _assert_same_bits_and_close(kernels, arrays, want, threads)
    finally:
        native.set_num_threads(old)


@functools.cache
def _together_kernels(hidden: int, lanes: int):  # noqa: ANN202
    """Kernels of one spec (every optional input, batch-first, 3 outputs; W and R given
    packed when ``lanes``, else packed per call) with a step item's panels in one pass
    (``ITEM_PANELS_TOGETHER``) and one panel at a time, built beside each other (not the
    memo's), and their IR."""
    spec = _spec(hidden, 9, "bidirectional", 1, ALL, lanes)
    kernels, texts = {}, {}
    saved = lstm_mod.ITEM_PANELS_TOGETHER
    try:
        for together in (True, False):
            lstm_mod.ITEM_PANELS_TOGETHER = together
            texts[together] = lstm_mod.lstm_ir(spec, "", 4 * LANES, 32)[1]
            kernels[together] = lstm_kernel.__wrapped__(spec)
    finally:
        lstm_mod.ITEM_PANELS_TOGETHER = saved
    return kernels, texts


@settings(max_examples=25, deadline=None)
@given(
    hidden=st.sampled_from([60, 37]),
    batch=st.integers(1, 3),
    seq=st.integers(1, 6),
    threads=st.integers(1, 3),
    packed=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_item_panels_in_one_pass_give_the_same_bits(hidden, batch, seq, threads, packed, seed):
    """A step item of at most 2 rows (batch 1 and 2) computes its two panels of R in one
    pass over K (8 chains at batch 1, not 4): the same bits as one panel at a time, and
    the reference's results; hidden 60 (the second item's second panel part-filled) and
    37 (a last item of one panel, which takes the single-panel path), W and R given packed
    or packed per call (from batch 2), sequence lengths drawn (0 included), 1-3 threads,
    bidirectional. Batch 3 (items of 3 rows) takes one panel at a time in both."""
    lanes = LANES if packed else 0
    kernels, texts = _together_kernels(hidden, lanes)
    if LANES == 16:  # AVX-512: two panels per item, 8 rows a block
        assert ".panels(" in texts[True] and ".panels(" not in texts[False]
    ins = lstm_inputs(
        np.random.default_rng(seed), "float32", hidden, 9, "bidirectional", 1, seq, batch, ALL
    )
    want = recurrent(
        "LSTM", ins, {"direction": "bidirectional", "layout": 1, "hidden_size": hidden}
    )
    arrays = _given(ins) if packed else [a for a in ins if a is not None]
    _assert_same_bits_and_close(kernels, arrays, want, threads)


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_items_of_each_threads_rows_give_the_same_bits(direction) -> None:
    """On the pool a step's items take ``ceil(N / threads)`` batch rows when that is at
    least MIN_SPLIT_ROWS (at most ROW_BLOCK: each thread's chunks its own rows), else one
    block split by units: batch 8 on 1 to 4 threads (4 rows per item on 2, one block on 3
    and 4) and batch 19 (10, 7 and 5 rows: short last blocks); the same bits on every
    thread count, and the reference's results."""
    hidden, size, seq = 48, 20, 6
    old = native.get_num_threads()
    native.set_num_threads(4)
    try:
        for batch in (8, 19):
            assert batch * hidden * 4 * hidden >= MIN_PARALLEL_FMAS
            ins = lstm_inputs(
                np.random.default_rng(batch), "float32", hidden, size, direction, 1, seq,
                batch, {"B", "initial_h"},
            )  # fmt: skip
            kernel = lstm_kernel(_spec(hidden, size, direction, 1, {"B", "initial_h"}, LANES))
            want = recurrent(
                "LSTM", ins, {"direction": direction, "layout": 1, "hidden_size": hidden}
            )
            results = {}
            for threads in (1, 2, 3, 4):
                outs = [np.full(w.shape, np.nan, np.float32) for w in want]
                kernel(*_given(ins), *outs, threads=threads)
                results[threads] = outs
            for threads in (2, 3, 4):
                for a, b in zip(results[1], results[threads]):
                    np.testing.assert_array_equal(a, b)
            for g, w in zip(results[1], want):
                np.testing.assert_allclose(g, w, rtol=TOL["float32"], atol=TOL["float32"])
    finally:
        native.set_num_threads(old)


def test_stepped_lstm_leaves_the_pool_idle_between_calls() -> None:
    """Calls of the packed kernel on 2 threads (batch 8: a launch per call, each thread's
    chunk its row block's projection and steps): the same bits at every call, and between
    calls the pool's threads sleep (no CPU burned: other libraries of the process keep the
    cores)."""
    import time

    hidden, size, seq, batch = 64, 32, 16, 8
    assert batch * hidden * 4 * hidden >= MIN_PARALLEL_FMAS
    ins = lstm_inputs(
        np.random.default_rng(9), "float32", hidden, size, "forward", 1, seq, batch, ALL
    )
    kernel = lstm_kernel(_spec(hidden, size, "forward", 1, ALL, LANES))
    want = recurrent("LSTM", ins, {"direction": "forward", "layout": 1, "hidden_size": hidden})
    arrays = _given(ins)
    first = [np.empty(w.shape, np.float32) for w in want]
    old = native.get_num_threads()
    native.set_num_threads(2)  # a pool of 2 threads, whatever the machine
    try:
        kernel(*arrays, *first, threads=2)
        before = native.pool_info()
        for _ in range(200):
            outs = [np.full(w.shape, np.nan, np.float32) for w in want]
            kernel(*arrays, *outs, threads=2)
            for a, b in zip(first, outs):
                np.testing.assert_array_equal(a, b)
        after = native.pool_info()
        assert _by_row_blocks(batch, 2)
        assert after["launches"] - before["launches"] == 200
        assert after["stepped_launches"] == before["stepped_launches"]
    finally:
        native.set_num_threads(old)
    time.sleep(0.01)
    t0, c0 = time.monotonic(), time.process_time()
    time.sleep(0.3)
    cpu, wall = time.process_time() - c0, time.monotonic() - t0
    assert cpu < 0.05 * wall, f"idle process used {cpu:.3f} s CPU in {wall:.3f} s"
    for g, w in zip(first, want):
        np.testing.assert_allclose(g, w, rtol=TOL["float32"], atol=TOL["float32"])


def test_kernel_checks_the_packed_weights() -> None:
    """A packed W or R of the wrong shape is a bad argument (its index and shape named)."""
    ins = lstm_inputs(np.random.default_rng(1), "float32", 8, 5, "forward", 0, 3, 2, set())
    kernel = lstm_kernel(_spec(8, 5, "forward", 0, set(), LANES))
    w_packed, r_panels = _packed(ins)
    outs = [np.empty(s, np.float32) for s in ((3, 1, 2, 8), (1, 2, 8), (1, 2, 8))]
    with pytest.raises(ValueError, match=r"argument W_packed must have shape \(1, 2, 5, 16\)"):
        kernel(ins[0], w_packed[:, :1], r_panels, *outs)
    with pytest.raises(
        ValueError, match=rf"argument R_panels must have shape \(1, {4 * LANES * 8}\)"
    ):
        kernel(ins[0], w_packed, r_panels[:, 1:], *outs)
    with pytest.raises(ValueError, match="argument W_packed must have shape"):
        kernel(*ins[:3], *outs)  # W and R themselves


def test_spec_and_target_must_agree_on_the_panels() -> None:
    from geode.codegen.backends.llvm.lstm import lstm_ir

    with pytest.raises(ValueError, match="float32"):
        LstmSpec("float64", 4, 3, 1, False, 0, False, False, False, False, 1, panel_lanes=8)
    spec = LstmSpec("float32", 4, 3, 1, False, 0, False, False, False, False, 1, panel_lanes=8)
    with pytest.raises(ValueError, match="packed for 8 lanes"):
        lstm_ir(spec, "", 64)


def test_packed_forms_of_lstm_weights() -> None:
    """The forms' copies: names, shapes, one per weight and form; R's panels hold R's
    entries where the layout says; bad data is a CodegenError."""
    g = geode.Graph("forms")
    hid, size = 5, 3
    w_data = np.random.default_rng(0).standard_normal((2, 4 * hid, size)).astype(np.float32)
    r_data = np.random.default_rng(1).standard_normal((2, 4 * hid, hid)).astype(np.float32)
    w, r = g.constant(w_data, name="W"), g.constant(r_data, name="R")
    wp, rp = packed_value(w, "lstm_w"), packed_value(r, "lstm_r8")
    assert (wp.name, rp.name) == ("W#lstm_w16", "R#lstm_r8")
    assert wp.shape == (2, 2, size, 16) and rp.shape == (2, 4 * 8 * hid)
    assert packed_value(w, "lstm_w") is wp and packed_value(r, "lstm_r8") is rp
    columns = wp.data[1].transpose(1, 0, 2).reshape(size, 32)  # [k][panel's 16 columns]
    np.testing.assert_array_equal(columns[:, : 4 * hid], w_data[1].T)
    assert not columns[:, 4 * hid :].any()
    panel = rp.data[1].reshape(2, hid, 2, 8)  # [group][k][gate in group][unit]
    for q in range(4):  # gates i, o, f, c: units 0..4 of each, then zeros
        np.testing.assert_array_equal(
            panel[q // 2, :, q % 2, :hid], r_data[1, q * hid : (q + 1) * hid].T
        )
        assert not panel[q // 2, :, q % 2, hid:].any()
    with pytest.raises(CodegenError, match="cannot be packed"):
        packed_value(w, "lstm_r8")  # W is not 4H x H
    with pytest.raises(CodegenError, match="cannot be packed"):
        packed_value(w, "gemm")  # not a matrix


def _model(direction="forward", dynamic_w=False, dtype="float32"):  # noqa: ANN001, ANN202
    ins = lstm_inputs(
        np.random.default_rng(9), dtype, 20, 7, direction, 1, 5, 3, {"B", "initial_h"}
    )
    model = lstm_model(ins, direction, 1, dims=["N", "T", 7])
    if dynamic_w:  # W a graph input: not a constant
        g = model.graph
        (init,) = [i for i in g.initializer if i.name == "w"]
        g.initializer.remove(init)
        et = TensorProto.FLOAT if dtype == "float32" else TensorProto.DOUBLE
        g.input.append(helper.make_tensor_value_info("w", et, list(ins[1].shape)))
    return model, ins


def _weights_lines(model) -> list[str]:  # noqa: ANN001
    return [line.strip() for line in model.explain().splitlines() if "weights:" in line]


def _var_names(model) -> set[str]:  # noqa: ANN001
    return {k.name.rsplit("/", 1)[-1] for k in model.var_manager}


def _reference(model, x, w=None):  # noqa: ANN001, ANN202
    feeds = {"x": x} if w is None else {"x": x, "w": w}
    return geode.compile(model, codegen=False)(**feeds)


def test_compiled_lstm_takes_its_weights_packed_once(tmp_path) -> None:
    """explain()'s weights line, the derived constants in the VarManager, the results;
    the model file names the packed inputs by weight and form and re-packs them at load:
    the same lines, constants and bits."""
    onnx_model, ins = _model("bidirectional")
    model = geode.compile(onnx_model, session=geode.Session(), model_cache=False)
    (line,) = _weights_lines(model)
    assert line.startswith(
        "weights: W 'w' and R 'r' float32 packed once, into constants 'w#lstm_w16' (the "
        "input projection, by geode's packed-weight kernel ("
    )
    assert line.endswith(
        f"and 'r#lstm_r{LANES}' (the steps' panels of {LANES} units); no packing per call"
    )
    # the packed copies registered instead of W and R (no step reads those)
    assert {"w#lstm_w16", f"r#lstm_r{LANES}"} <= _var_names(model)
    assert not {"w", "r"} & _var_names(model)
    want = _reference(onnx_model, ins[0])
    x = ins[0]
    got = model(x=x)
    for name in ("y", "y_h", "y_c"):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5)
    path = tmp_path / "lstm.geode"
    model.save(path)
    loaded = geode.load(path, session=geode.Session())
    assert _weights_lines(loaded) == [line]
    assert {"w#lstm_w16", f"r#lstm_r{LANES}"} <= _var_names(loaded)
    again = loaded(x=x)
    for name in ("y", "y_h", "y_c"):
        np.testing.assert_array_equal(again[name], got[name])


def test_lstms_that_pack_per_call_say_why() -> None:
    """W a graph input, the option off, float64: packed per call, explain() says why, and
    the results are right."""
    onnx_model, ins = _model(dynamic_w=True)
    model = geode.compile(onnx_model, session=geode.Session())
    (line,) = _weights_lines(model)
    assert (
        line == "weights: W and R packed on every call: 'w' is not a constant known at compile time"
    )
    assert not any("#lstm" in n for n in _var_names(model))
    got, want = model(x=ins[0], w=ins[1]), _reference(onnx_model, ins[0], ins[1])
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-5, atol=1e-5)
    onnx_model, ins = _model()
    off = geode.compile(onnx_model, packed_weights=False)
    assert _weights_lines(off) == [
        "weights: W and R packed on every call: option packed_weights is off"
    ]
    np.testing.assert_allclose(
        off(x=ins[0])["y"], _reference(onnx_model, ins[0])["y"], rtol=1e-5, atol=1e-5
    )
    onnx_model, ins = _model(dtype="float64")
    wide = geode.compile(onnx_model)
    assert _weights_lines(wide) == [
        "weights: W and R packed on every call: float64 weights (packed once: float32)"
    ]


def test_choice_needs_both_weights_constant() -> None:
    g = geode.Graph("choice")
    w = g.constant(np.zeros((1, 8, 3), np.float32), name="W")
    r_in = g.input("R", [1, 8, 2], np.float32)
    r = g.constant(np.zeros((1, 8, 2), np.float32), name="R2")
    assert choose_lstm_packing(w, r, Options(), 16).packed
    assert "'R' is not a constant" in choose_lstm_packing(w, r_in, Options(), 16).text


def _assert_same_bits_and_close(kernels: dict, arrays: list, want: list, threads: int) -> None:
    """Both kernels of ``kernels`` (keys True / False: a switch on and off) run on
    ``arrays`` into NaN-filled outputs: the same bits, and within float32's tolerance of
    the reference ``want``."""
    got = {}
    for key, kernel in kernels.items():
        got[key] = [np.full(w.shape, np.nan, np.float32) for w in want]
        kernel(*arrays, *got[key], threads=threads)
    for a, b, w in zip(got[True], got[False], want):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(a, w, rtol=TOL["float32"], atol=TOL["float32"])
