"""geode's native runtime (geode.runtime.native): thread pool and kernel call trampoline.

Kernels are JIT-compiled with llvmlite (tests/native_kernels.py) and call the pool through
the addresses of ``symbols()``, as the LLVM backend's kernels do.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from native_kernels import IS_X86, kernels, mxcsr_kernels

from geode.errors import GeodeError
from geode.runtime import native as nt

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def k():
    return kernels()


@pytest.fixture
def pool3():
    """A pool of 3 threads (oversubscribed on small machines), restored afterwards."""
    old = nt.get_num_threads()
    nt.set_num_threads(3)
    yield 3
    nt.set_num_threads(old)


def run_count(k, nchunks: int, nthreads: int = 0) -> np.ndarray:
    counts = np.zeros(nchunks + 1, np.int64)
    assert nt.call(k.addr("count_entry"), 0, (counts,), (nchunks, nthreads)) == 0
    return counts


def assert_each_once(counts: np.ndarray, nchunks: int) -> None:
    assert (counts[:nchunks] == 1).all(), np.flatnonzero(counts[:nchunks] != 1)[:10]
    assert counts[nchunks] == nchunks  # fn received nchunks as its third argument


def join_all(threads: list[threading.Thread], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
        assert not t.is_alive(), "deadlock: a thread did not finish"


def run_python(code: str, **env: str) -> str:
    """Run ``code`` in a fresh interpreter with this tree on the path; return its stdout."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("GEODE_")}
    full_env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(Path(__file__).resolve().parent)])
    full_env.update(env)
    proc = subprocess.run(
        [sys.executable, "-c", code], env=full_env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


# ---- the pool -------------------------------------------------------------------------------


@pytest.mark.parametrize("threads", [1, 2, 3, 5])
def test_every_chunk_runs_exactly_once(k, threads):
    old = nt.get_num_threads()
    nt.set_num_threads(threads)
    try:
        for nchunks in [1, 2, 3, 4, 7, 64, 1000, 12345]:
            for nthreads in [0, -1, 1, 2, 3, 100]:
                assert_each_once(run_count(k, nchunks, nthreads), nchunks)
        assert nt.pool_info()["workers_running"] == threads - 1
    finally:
        nt.set_num_threads(old)


def test_zero_and_negative_chunks_run_nothing(k):
    for nchunks in (0, -5):
        counts = np.zeros(1, np.int64)
        nt.call(k.addr("count_entry"), 0, (counts,), (nchunks, 0))
        assert counts[0] == 0


def test_jobs_run_in_rounds_past_the_slot_limit(k, pool3):
    old = nt._ext._set_max_slot_chunks(3)  # 3 threads x 3 chunks per round
    try:
        launches = nt.pool_info()["launches"]
        for nchunks in (9, 10, 100, 1001):
            assert_each_once(run_count(k, nchunks), nchunks)
        assert nt.pool_info()["launches"] == launches + 4
    finally:
        nt._ext._set_max_slot_chunks(old)


def test_workers_and_caller_share_the_work(k, pool3):
    out = np.zeros(12, np.int64)
    for _ in range(5):  # a loaded machine may delay a worker's wake-up: retry
        nt.call(k.addr("tid_entry"), 0, (out,), (12, 0, 3000))
        if len(set(out.tolist())) == 3:
            break
    assert threading.get_ident() in set(out.tolist())  # the caller participates
    assert len(set(out.tolist())) == 3


def test_nthreads_limits_the_participants(k, pool3):
    out = np.zeros(8, np.int64)
    for _ in range(3):
        nt.call(k.addr("tid_entry"), 0, (out,), (8, 2, 2000))
        assert len(set(out.tolist())) <= 2
    nt.call(k.addr("tid_entry"), 0, (out,), (8, 1, 0))
    assert set(out.tolist()) == {threading.get_ident()}


def test_nested_calls_run_inline(k, pool3):
    n, m = 9, 50
    before = nt.pool_info()["inline_runs"]
    counts = np.zeros(n * m, np.int64)
    nt.call(k.addr("nested_entry"), 0, (counts,), (n, m, 0))
    assert (counts == 1).all()
    assert nt.pool_info()["inline_runs"] - before == n  # every inner launch ran inline


def test_concurrent_callers_do_not_deadlock(k, pool3):
    errors: list[BaseException] = []
    before = nt.pool_info()["inline_runs"]
    stop = threading.Event()

    def slow_jobs():
        out = np.zeros(6, np.int64)
        try:
            while not stop.is_set():
                nt.call(k.addr("tid_entry"), 0, (out,), (6, 0, 2000))
        except BaseException as exc:
            errors.append(exc)

    def counting(seed: int):
        rng = np.random.default_rng(seed)
        try:
            for _ in range(300):
                nchunks = int(rng.integers(1, 200))
                assert_each_once(run_count(k, nchunks, int(rng.integers(0, 4))), nchunks)
        except BaseException as exc:
            errors.append(exc)

    slow = threading.Thread(target=slow_jobs)
    slow.start()
    counters = [threading.Thread(target=counting, args=(s,)) for s in range(3)]
    for t in counters:
        t.start()
    join_all(counters)
    stop.set()
    join_all([slow])
    assert not errors, errors
    assert nt.pool_info()["inline_runs"] > before  # some ran while another job held the pool


def test_set_num_threads(k):
    old = nt.get_num_threads()
    try:
        for n in (4, 1, 2):
            nt.set_num_threads(n)
            assert nt.get_num_threads() == n
            assert nt.pool_info()["threads"] == n
            assert nt.pool_info()["workers_running"] == 0  # restarted lazily
            out = np.zeros(1, np.int64)
            nt.call(k.addr("num_threads_entry"), 0, (out,), ())
            assert out[0] == n  # the C symbol agrees
            assert_each_once(run_count(k, 50), 50)
            assert nt.pool_info()["workers_running"] == n - 1
        for bad in (0, -1, nt.MAX_THREADS + 1):
            with pytest.raises(ValueError, match="outside"):
                nt.set_num_threads(bad)
        with pytest.raises(TypeError):
            nt.set_num_threads(2.5)
    finally:
        nt.set_num_threads(old)


def test_set_num_threads_waits_for_a_running_job(k, pool3):
    out = np.zeros(6, np.int64)
    job = threading.Thread(target=nt.call, args=(k.addr("tid_entry"), 0, (out,), (6, 0, 50000)))
    job.start()
    time.sleep(0.02)
    nt.set_num_threads(2)  # waits until the job releases the pool
    join_all([job])
    assert (out != 0).all()
    assert nt.get_num_threads() == 2


def test_idle_pool_uses_no_cpu(k, pool3):
    for _ in range(3000):  # a burst of launches: workers spin, then must go to sleep
        run_count(k, 6)
    assert nt.pool_info()["workers_running"] == 2
    time.sleep(0.01)
    t0, c0 = time.monotonic(), time.process_time()
    time.sleep(0.3)
    cpu, wall = time.process_time() - c0, time.monotonic() - t0
    assert cpu < 0.05 * wall, f"idle process used {cpu:.3f} s CPU in {wall:.3f} s"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux)")
def test_workers_block_signals(k, pool3):
    run_count(k, 10)
    masks = []
    for task in Path("/proc/self/task").iterdir():
        try:
            if (task / "comm").read_text(encoding="utf-8").strip() != "geode-worker":
                continue
            status = (task / "status").read_text(encoding="utf-8")
        except FileNotFoundError:
            continue
        masks.append(
            int(next(ln for ln in status.splitlines() if ln.startswith("SigBlk:"))[7:], 16)
        )
    assert len(masks) == 2
    for mask in masks:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGCHLD, signal.SIGALRM):
            assert mask & (1 << (sig - 1)), (sig, hex(mask))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_fork_resets_the_pool(k, pool3):
    assert_each_once(run_count(k, 100), 100)
    assert nt.pool_info()["workers_running"] == 2
    pid = os.fork()
    if pid == 0:  # child: only this thread exists; the pool must restart lazily
        code = 1
        try:
            fresh = nt.pool_info()["workers_running"] == 0
            counts = run_count(k, 1000)
            ok = (counts[:1000] == 1).all() and counts[1000] == 1000
            info = nt.pool_info()
            code = 0 if fresh and ok and info["workers_running"] == 2 else 3
        finally:
            os._exit(code)
    deadline = time.monotonic() + 60
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child deadlocked")
        time.sleep(0.01)
    assert os.waitstatus_to_exitcode(status) == 0
    assert_each_once(run_count(k, 100), 100)  # the parent's pool still works


@pytest.mark.skipif(not IS_X86, reason="MXCSR exists on x86 only")
def test_mxcsr_is_propagated_to_workers(pool3):
    csr = mxcsr_kernels().addr("csr_entry")
    status_bits = 0x3F
    ftz_daz = 0x1F80 | 0x8000 | 0x0040  # all exceptions masked, flush-to-zero, denormals-are-zero
    out = np.zeros(2 * 12, np.int64)
    for want in (ftz_daz, 0x1F80 | 0x6000, 0x1F80):  # FTZ+DAZ, round toward zero, default
        for _ in range(5):  # retry until a worker ran a chunk
            nt.call(csr, 0, (out,), (12, want))
            if len(set(out[1::2].tolist())) > 1:
                break
        assert len(set(out[1::2].tolist())) > 1, "no worker ran a chunk"
        seen = {int(v) & ~status_bits for v in out[0::2]}
        assert seen == {want}, [hex(v) for v in seen]


def test_environment_configures_the_pool():
    code = (
        "import numpy as np, os\n"
        "from geode.runtime import native as nt\n"
        "from native_kernels import kernels\n"
        "k = kernels()\n"
        "c = np.zeros(101, np.int64)\n"
        "nt.call(k.addr('count_entry'), 0, (c,), (100, 0))\n"
        "assert (c[:100] == 1).all() and c[100] == 100\n"
        "i = nt.pool_info()\n"
        "print(i['threads'], i['spin_us'], i['workers_running'], len(os.sched_getaffinity(0)))\n"
    )
    assert run_python(code, GEODE_NUM_THREADS="3", GEODE_SPIN_US="0").split() == [
        "3",
        "0",
        "2",
        run_python(code).split()[3],
    ]
    threads, spin, _, cpus = run_python(code).split()  # defaults: affinity CPUs, 300 us
    assert threads == cpus and spin == "300"
    threads, spin, _, cpus = run_python(code, GEODE_NUM_THREADS="0", GEODE_SPIN_US="x").split()
    assert threads == cpus and spin == "300"  # 0 means all CPUs; a bad value the default


# ---- the call trampoline ----------------------------------------------------------------------


def test_call_passes_pointers_records_and_ints(k):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array(7.0)  # 0-d
    out = np.zeros(64, np.int64)
    arrays = (a, b, out)
    recs = [2, 4, 2, 3, 0, 8, 1, 8, 64]
    ints = (3, len(recs), 5, -(2**63), 2**63 - 1)
    assert nt.call(k.addr("dump_entry"), 2, arrays, ints) == 0
    n = len(recs)
    assert out[:n].tolist() == recs
    assert out[n : n + 3].tolist() == [x.ctypes.data for x in arrays]
    assert out[n + 3 : n + 8].tolist() == list(ints)


def test_call_heap_path_for_many_arrays_and_ints(k):
    arrays = [np.zeros((2, 3, 4), np.int16) for _ in range(19)]
    out = np.zeros(512, np.int64)
    arrays.append(out)
    recs = [3, 2, 2, 3, 4] * 19 + [1, 8, 512]
    ints = [20, len(recs), 70] + list(range(100, 167))
    assert nt.call(k.addr("dump_entry"), 19, arrays, ints) == 0  # a list works too
    n = len(recs)
    assert out[:n].tolist() == recs
    assert out[n : n + 20].tolist() == [x.ctypes.data for x in arrays]
    assert out[n + 20 : n + 90].tolist() == ints


def test_call_returns_the_status(k):
    for status in (0, 1, -5, 2**31 - 1, -(2**31)):
        assert nt.call(k.addr("status_entry"), 0, (), (status,)) == status


def test_call_accepts_any_buffer(k):
    out = bytearray(8 * 16)
    ints = (2, 6, 3)
    assert nt.call(k.addr("dump_entry"), 1, (b"abcd", out), ints) == 0
    got = np.frombuffer(out, np.int64)
    assert got[:6].tolist() == [1, 1, 4, 1, 1, len(out)]
    assert got[8:11].tolist() == list(ints)


def test_numpy_arrays_read_directly_pass_what_their_buffers_would(k):
    """A numpy array is read without taking its buffer; a subclass, a memoryview, a 0-d
    and an empty array give the records and pointers of the buffer protocol."""

    class Sub(np.ndarray):
        pass

    base = np.arange(5, dtype=np.int16).reshape(1, 5)
    arrays = (
        np.zeros((2, 3), np.float32),
        np.zeros(4).view(Sub),
        memoryview(base),
        np.array(7.0),
        np.zeros((0, 3), np.int8),
    )
    out = np.zeros(64, np.int64)
    recs = [2, 4, 2, 3, 1, 8, 4, 2, 2, 1, 5, 0, 8, 2, 1, 0, 3, 1, 8, 64]
    ints = (6, len(recs), 1, 42)
    assert nt.call(k.addr("dump_entry"), 5, (*arrays, out), ints) == 0
    assert out[: len(recs)].tolist() == recs
    ptrs = [np.asarray(a).ctypes.data for a in arrays[:4]]
    assert out[len(recs) : len(recs) + 4].tolist() == ptrs


def test_argument_errors_name_the_argument(k):
    good = np.zeros(4)
    strided = np.zeros(8)[::2]
    fortran = np.asfortranarray(np.zeros((3, 4)))
    readonly = np.zeros(4)
    readonly.setflags(write=False)
    addr = k.addr("trivial_entry")
    cases = [
        ((strided, good, good), 1, 0),
        ((good, fortran, good), 2, 1),
        ((good, readonly), 1, 1),  # read-only output
        ((good, good, b"xyz"), 1, 2),  # bytes are read-only
        ((good, 3.5, good), 1, 1),  # not a buffer
    ]
    for arrays, n_in, index in cases:
        with pytest.raises(nt.ArgumentError) as info:
            nt.call(addr, n_in, arrays, ())
        assert info.value.index == index
        assert f"kernel argument {index}" in str(info.value)
        assert isinstance(info.value, ValueError) and isinstance(info.value, GeodeError)
        assert info.value.__cause__ is not None
    assert nt.call(addr, 2, (readonly, b"ok", good), ()) == 0  # read-only inputs are fine


def test_buffers_are_released(k):
    held = bytearray(16)
    addr = k.addr("trivial_entry")
    readonly = np.zeros(2)
    readonly.setflags(write=False)
    assert nt.call(addr, 0, (held, held), ()) == 0
    held.extend(b"x")  # a bytearray with live exports cannot be resized
    with pytest.raises(nt.ArgumentError):
        nt.call(addr, 1, (held, readonly), ())
    held.extend(b"x")
    with pytest.raises(ValueError):
        nt.call(addr, 0, (held,), (2**64,))
    held.extend(b"x")


def test_call_rejects_bad_arguments(k):
    addr = k.addr("trivial_entry")
    a = np.zeros(2)
    with pytest.raises(ValueError, match=r"ints\[1\]"):
        nt.call(addr, 0, (a,), (1, 2**63))
    with pytest.raises(ValueError, match="int64"):
        nt.call(addr, 0, (a,), (-(2**63) - 1,))
    with pytest.raises(TypeError):
        nt.call(addr, 0, (a,), (1.5,))
    with pytest.raises(ValueError, match="n_in"):
        nt.call(addr, 2, (a,), ())
    with pytest.raises(ValueError, match="n_in"):
        nt.call(addr, -1, (a,), ())
    with pytest.raises(TypeError, match="tuple or a list"):
        nt.call(addr, 0, a, ())
    with pytest.raises(TypeError, match="tuple or a list"):
        nt.call(addr, 0, (), 3)
    with pytest.raises(ValueError, match="address is 0"):
        nt.call(0, 0, (), ())
    with pytest.raises(TypeError, match="4 arguments"):
        nt.call(addr, 0, ())


def test_call_releases_the_gil(k):
    ticks = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            ticks[0] += 1

    t = threading.Thread(target=spin)
    t.start()
    try:
        time.sleep(0.01)
        before = ticks[0]
        nt.call(k.addr("sleep_entry"), 0, (), (200_000,))  # 0.2 s natively
        progressed = ticks[0] - before
    finally:
        stop.set()
        join_all([t])
    assert progressed > 1000, progressed


def test_scratch_buffers_are_kept_per_thread_and_grow():
    """geode_scratch: a thread's buffer per slot, reused while big enough, grown (64-byte
    aligned) when not, out-of-range slots refused; release_scratch frees them."""
    import ctypes

    fn = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)(
        nt.symbols()["geode_scratch"]
    )

    def run(out):
        a = fn(0, 1000)
        out["same"] = fn(0, 500) == a
        b = fn(0, 1 << 20)
        out["aligned"] = a % 64 == 0 and b % 64 == 0
        out["held"] = nt.pool_info()["scratch_bytes"]
        other = fn(1, 10)
        out["other_slot"] = other not in (None, b) and fn(0, 100) == b
        out["bad"] = (fn(5, 10), fn(-1, 10), fn(0, -5))
        nt.release_scratch()
        out["after"] = nt.pool_info()["scratch_bytes"]

    out: dict = {}
    t = threading.Thread(target=run, args=(out,))  # a thread of its own: nothing else held
    t.start()
    t.join()
    assert out["same"] and out["aligned"] and out["other_slot"]
    assert out["held"] >= (1 << 20)
    assert out["bad"] == (None, None, None)
    assert out["after"] <= out["held"] - (1 << 20)


# ---- stepped jobs (geode_parallel_steps) ------------------------------------------------------


def run_steps(k, nsteps: int, nchunks: int, nthreads: int = 0, sleep_at: int = -1, us: int = 0):
    """One stepped job of ``step_chunk``: (runs per (step, chunk), chunks done per step,
    chunks that started before the previous step had finished, the thread of each)."""
    total = nsteps * nchunks
    out = np.zeros(2 * total + nsteps + 2, np.int64)
    ints = (nsteps, nchunks, nthreads, sleep_at, us)
    assert nt.call(k.addr("steps_entry"), 0, (out,), ints) == 0
    return out[:total], out[total : total + nsteps], out[total + nsteps], out[total + nsteps + 2 :]


@pytest.mark.parametrize("threads", [1, 2, 3, 4])
def test_stepped_job_runs_every_chunk_once_behind_a_barrier(k, threads):
    old = nt.get_num_threads()
    nt.set_num_threads(threads)
    try:
        before = nt.pool_info()["stepped_launches"]
        cases = [(1, 1), (1, 5), (7, 2), (300, 8), (1000, 3), (40, 17)]
        for nsteps, nchunks in cases:
            for nthreads in (0, 1, 2, 100):
                runs, done, bad, _ = run_steps(k, nsteps, nchunks, nthreads)
                assert (runs == 1).all(), np.flatnonzero(runs != 1)[:10]
                assert (done == nchunks).all()
                assert bad == 0, f"{bad} chunks ran before their previous step ended"
        on_pool = nt.pool_info()["stepped_launches"] - before
        pooled = 3 * sum(1 for _, nchunks in cases if nchunks > 1)  # nthreads 0, 2, 100
        assert on_pool == (0 if threads == 1 else pooled)
    finally:
        nt.set_num_threads(old)


def test_stepped_job_with_a_descheduled_worker_sleeps_at_the_barrier(k, pool3):
    """A chunk that sleeps 100 ms (its thread descheduled inside a step): the others wait
    for it at the barrier asleep (bounded spin), not spinning, and every step still runs
    after the previous one."""
    nsteps, nchunks = 20, 6
    for _ in range(3):  # the sleeping chunk may land on any participant
        sleeps = nt.pool_info()["barrier_sleeps"]
        c0, t0 = time.process_time(), time.monotonic()
        runs, done, bad, _ = run_steps(k, nsteps, nchunks, 0, 5 * nchunks + 1, 100_000)
        cpu, wall = time.process_time() - c0, time.monotonic() - t0
        assert (runs == 1).all() and (done == nchunks).all() and bad == 0
        assert wall >= 0.1
        assert nt.pool_info()["barrier_sleeps"] > sleeps
        assert cpu < 0.3 * wall, f"barrier waits used {cpu:.3f} s CPU in {wall:.3f} s"


def test_stepped_jobs_share_the_work_and_leave_the_pool_idle(k, pool3):
    tids: set[int] = set()
    for _ in range(20):  # a loaded machine may delay a worker: retry
        runs, _, bad, seen = run_steps(k, 50, 6, 0, 3, 2000)  # the chunk 3 waits 2 ms
        assert (runs == 1).all() and bad == 0
        tids |= set(seen.tolist())
        if len(tids) == 3:
            break
    assert threading.get_ident() in tids and len(tids) == 3
    for _ in range(2000):
        run_steps(k, 4, 6)
    time.sleep(0.01)
    t0, c0 = time.monotonic(), time.process_time()
    time.sleep(0.3)
    cpu, wall = time.process_time() - c0, time.monotonic() - t0
    assert cpu < 0.05 * wall, f"idle process used {cpu:.3f} s CPU in {wall:.3f} s"


def test_nested_stepped_jobs_run_inline(k, pool3):
    """A stepped job started while another thread's job holds the pool runs on its caller."""
    before = nt.pool_info()["inline_runs"]
    out = np.zeros(6, np.int64)
    job = threading.Thread(target=nt.call, args=(k.addr("tid_entry"), 0, (out,), (6, 0, 50000)))
    job.start()
    time.sleep(0.02)
    runs, done, bad, seen = run_steps(k, 30, 4)
    join_all([job])
    assert (runs == 1).all() and (done == 4).all() and bad == 0
    assert set(seen.tolist()) == {threading.get_ident()}
    assert nt.pool_info()["inline_runs"] > before


def test_stepped_jobs_without_spinning():
    """GEODE_SPIN_US=0: the barrier does not spin either (every wait sleeps at once), and
    the steps still run in order."""
    code = (
        "import numpy as np\n"
        "from geode.runtime import native as nt\n"
        "from native_kernels import kernels\n"
        "k = kernels()\n"
        "nt.set_num_threads(3)\n"
        "for _ in range(20):\n"
        "    out = np.zeros(2 * 100 * 6 + 100 + 2, np.int64)\n"
        "    nt.call(k.addr('steps_entry'), 0, (out,), (100, 6, 0, 7, 300))\n"
        "    assert (out[:600] == 1).all() and (out[600:700] == 6).all() and out[700] == 0\n"
        "print(nt.pool_info()['spin_us'], nt.pool_info()['stepped_launches'])\n"
    )
    assert run_python(code, GEODE_SPIN_US="0").split() == ["0", "20"]


def test_stepped_job_with_too_many_chunks_per_slot_launches_per_step(k, pool3):
    """More than 65535 chunks per participant do not fit a stepped slot word: the steps
    run as a launch each, still every chunk once and in step order."""
    nsteps, nchunks = 2, 3 * 0xFFFF + 7
    before = nt.pool_info()
    runs, done, bad, _ = run_steps(k, nsteps, nchunks)
    after = nt.pool_info()
    assert (runs == 1).all() and (done == nchunks).all() and bad == 0
    assert after["stepped_launches"] == before["stepped_launches"]
    assert after["launches"] - before["launches"] == nsteps


def test_launch_runs_a_parallel_loop_as_the_backend_asks(pool3):
    """``geode_launch`` (the LLVM backend's ``geode.launch``): nothing for an empty loop,
    one chunk on the caller when the work is small, one thread or one iteration, else
    ``min(ext, CHUNKS_PER_THREAD * threads)`` chunks (threads 0: the pool's size)."""
    import ctypes

    from geode.codegen.backends.llvm.jit import runtime_symbols
    from geode.codegen.backends.llvm.parallel import CHUNKS_PER_THREAD

    seen: list[tuple[int, int]] = []
    lock = threading.Lock()
    chunk_fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)

    def chunk(ctx, c, n):
        with lock:
            seen.append((c, n))

    cb = chunk_fn(chunk)
    args = (chunk_fn, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_bool)
    launch = ctypes.CFUNCTYPE(None, *args)(nt.symbols()["geode_launch"])
    assert runtime_symbols()["geode.launch"] == nt.symbols()["geode_launch"]

    def run(ext: int, threads: int, small: bool) -> list[tuple[int, int]]:
        seen.clear()
        launch(cb, None, ext, threads, small)
        return sorted(seen)

    assert run(0, 3, False) == [] and run(-4, 0, True) == []
    assert run(1000, 3, True) == [(0, 1)]
    assert run(1000, 1, False) == [(0, 1)]
    assert run(1, 3, False) == [(0, 1)]
    assert run(5, 2, False) == [(c, 5) for c in range(5)]
    n = CHUNKS_PER_THREAD * 2
    assert run(1000, 2, False) == [(c, n) for c in range(n)]
    n = CHUNKS_PER_THREAD * pool3
    assert run(1000, 0, False) == [(c, n) for c in range(n)]
