"""The shared chunk launcher of chunked kernels (``geode.codegen.backends.chunks``).

The launcher is driven here with small chunk functions written for the tests (numba
``cfunc`` with the chunk signature) that record which chunks ran and on which thread,
so each property is checked directly: every chunk runs exactly once on any thread
count, a worker that stalls has the rest of its run taken by the others (work
stealing), and the launch's thread count reaches numba.
"""

from __future__ import annotations

import pytest

# the numba backend's own tests: numba is an optional extra (CI installs it)
pytest.importorskip("numba", reason='needs numba, an optional extra: pip install "geode[numba]"')

import numba
import numpy as np
from numba import types as nbt
from numba.extending import intrinsic

from geode.codegen.backends import chunks
from geode.codegen.backends import numba as nb


def _element(context, builder, arr_type, arr, idx):
    a = context.make_array(arr_type)(context, builder, value=arr)
    return builder.gep(a.data, [idx])


@intrinsic
def _cas(typingctx, arr, idx, expected, new):
    """Atomically ``arr[idx] = new`` if it holds ``expected``; True when it did."""

    def codegen(context, builder, signature, args):
        ptr = _element(context, builder, signature.args[0], args[0], args[1])
        res = builder.cmpxchg(ptr, args[2], args[3], "acq_rel", "acquire")
        return builder.extract_value(res, 1)

    return nbt.boolean(arr, nbt.int64, nbt.int64, nbt.int64), codegen


@intrinsic
def _load_acquire(typingctx, arr, idx):
    """``arr[idx]`` read atomically (a spinning reader sees other threads' stores)."""

    def codegen(context, builder, signature, args):
        ptr = _element(context, builder, signature.args[0], args[0], args[1])
        return builder.load_atomic(ptr, "acquire", 8)

    return nbt.int64(arr, nbt.int64), codegen


#: rounds of the stalled chunk's wait before it gives up: each reads every chunk's flag,
#: so several seconds here (a success waits microseconds)
SPIN_LIMIT = 500_000_000


@numba.cfunc(chunks.CHUNK_SIGNATURE)
def _record(argv, chunk, n):  # pragma: no cover - compiled
    """Count each run of ``chunk`` and note the thread that ran it."""
    counts = numba.carray(chunks._g_ptr(argv[0], np.int64), (n,))
    threads = numba.carray(chunks._g_ptr(argv[1], np.int64), (n,))
    counts[chunk] += 1
    threads[chunk] = numba.get_thread_id()


@numba.cfunc(chunks.CHUNK_SIGNATURE)
def _stall_first(argv, chunk, n):  # pragma: no cover - compiled
    """Chunk 0 waits until every other chunk has run (or the spin limit passes, noted in
    ``argv[2]``'s array); the others mark themselves done."""
    done = numba.carray(chunks._g_ptr(argv[0], np.int64), (n,))
    threads = numba.carray(chunks._g_ptr(argv[1], np.int64), (n,))
    gave_up = numba.carray(chunks._g_ptr(argv[2], np.int64), (1,))
    threads[chunk] = numba.get_thread_id()
    if chunk == 0:
        for _ in range(SPIN_LIMIT):
            left = 0
            for k in range(1, n):
                left += 1 - _load_acquire(done, k)
            if left == 0:
                break
        else:
            gave_up[0] = 1
    while not _cas(done, chunk, 0, 1):
        pass


def _launch(fn, arrays: list[np.ndarray], n: int, threads: int) -> None:
    argv = np.array([a.ctypes.data for a in arrays], dtype=np.int64)
    chunks._g_launch(fn.address, argv, n, threads)


def _two_threads() -> None:
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("work stealing needs two threads; numba started one on this machine")


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n", [0, 1, 2, 3, 7, 64, 1001])
def test_every_chunk_runs_exactly_once(n: int, threads: int) -> None:
    threads = min(threads, numba.config.NUMBA_NUM_THREADS)
    counts = np.zeros(max(n, 1), np.int64)
    ran_on = np.full(max(n, 1), -1, np.int64)
    _launch(_record, [counts, ran_on], n, threads)
    np.testing.assert_array_equal(counts[:n], 1)
    assert set(ran_on[:n].tolist()) <= set(range(threads))


def test_one_thread_runs_every_chunk_on_the_calling_thread() -> None:
    counts, ran_on = np.zeros(40, np.int64), np.full(40, -1, np.int64)
    _launch(_record, [counts, ran_on], 40, 1)
    np.testing.assert_array_equal(counts, 1)
    np.testing.assert_array_equal(ran_on, 0)


def test_a_stalled_worker_has_the_rest_of_its_run_taken() -> None:
    """Chunk 0 (the front of worker 0's run) finishes only after all other chunks ran:
    without stealing, worker 0's chunks 1 .. n/2 - 1 could never run."""
    _two_threads()
    n = 2 * chunks.CHUNKS_PER_THREAD
    done, ran_on, gave_up = np.zeros(n, np.int64), np.full(n, -1, np.int64), np.zeros(1, np.int64)
    _launch(_stall_first, [done, ran_on, gave_up], n, 2)
    assert gave_up[0] == 0, "chunk 0 waited in vain: its run was not taken over"
    np.testing.assert_array_equal(done, 1)
    # Which thread stalled depends on which one took chunk 0 first (on a busy machine the
    # other thread may reach worker 0's run before worker 0 starts): either way the thread
    # that stalled ran nothing while it waited, so the other one ran the rest of the run
    # that chunk 0 heads; that chunk 0 finished at all proves it.
    assert set(ran_on.tolist()) <= {0, 1}, ran_on


@pytest.mark.parametrize("threads", [1, 2])
def test_the_launch_sets_numba_thread_count_for_the_calling_thread(threads: int) -> None:
    threads = min(threads, numba.config.NUMBA_NUM_THREADS)
    before = numba.get_num_threads()
    try:
        other = 1 if threads != 1 else numba.config.NUMBA_NUM_THREADS
        numba.set_num_threads(other)
        counts, ran_on = np.zeros(16, np.int64), np.full(16, -1, np.int64)
        _launch(_record, [counts, ran_on], 16, threads)
        assert numba.get_num_threads() == threads
        assert set(ran_on.tolist()) <= set(range(threads))
        _launch(_record, [counts, ran_on], 16, 0)  # 0 keeps the setting
        assert numba.get_num_threads() == threads
        np.testing.assert_array_equal(counts, 2)
    finally:
        numba.set_num_threads(before)


def test_a_model_runs_on_its_own_thread_count_whatever_numba_was_set_to() -> None:
    import geode
    from geode import examples

    ex = examples.rmsnorm(hidden=256)
    before = numba.get_num_threads()
    try:
        for want in {1, numba.config.NUMBA_NUM_THREADS}:
            model = geode.compile(ex.graph, num_threads=want, backend="numba")
            assert any(getattr(k, "engine", "") == "aicore" for k in model.kernels)
            numba.set_num_threads(1 if want != 1 else numba.config.NUMBA_NUM_THREADS)
            inputs = ex.make_inputs(np.random.default_rng(want), 300)
            out = model(**inputs)
            assert numba.get_num_threads() == want
            for name, ref in ex.numpy(**inputs).items():
                np.testing.assert_allclose(out[name], ref, rtol=1e-5, atol=1e-6)
    finally:
        numba.set_num_threads(before)


def test_chunked_entry_passes_the_thread_count_to_the_launcher() -> None:
    kernel = _tiny_chunked_kernel()
    src = nb.emit_source(kernel)
    assert "def fused(X, Y, N, rows, chunks, threads):" in src
    assert "_g_launch(rows, argv, chunks, threads)" in src
    assert "# threads: the thread count, 0 for numba's (geode passes it)" in src
    k = nb.compile_kernel(kernel)
    assert k.chunked
    x = np.arange(1000, dtype=np.float32)
    before = numba.get_num_threads()
    try:
        for threads in sorted({1, numba.config.NUMBA_NUM_THREADS}):
            y = np.zeros_like(x)
            k(x, y, 1000, threads=threads)
            np.testing.assert_array_equal(y, x)
            assert numba.get_num_threads() == threads
    finally:
        numba.set_num_threads(before)


def _tiny_chunked_kernel():
    from geode.codegen.ast import Block, Buffer, For, ForKind, IterVar, Kernel, Load, Store, Var

    n, vi = Var("N"), Var("vi")
    blk = Block("b", [IterVar("vi", n)], [Var("i")], [Store("Y", (vi,), Load("X", (vi,)))])
    return Kernel(
        "fused",
        [Buffer("X", "float32", (n,))],
        [Buffer("Y", "float32", (n,))],
        ["N"],
        [For("i", n, [blk], ForKind.PARALLEL)],
    )
