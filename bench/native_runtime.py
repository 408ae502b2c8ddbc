"""Measure geode's native runtime: pool launch overhead, idle CPU, kernel call overhead.

    PYTHONPATH=. python bench/native_runtime.py [--threads N] [--reps R]

Launch overhead: median time of one ``geode_parallel_for`` of an empty chunk function over
``2 * threads`` chunks, timed inside a JIT-compiled loop (hot: back-to-back launches; cold:
one launch after 2 ms idle, the workers asleep). Work launch: ``2 * threads`` chunks of 20 us
of busy work each, against the same work run serially. Idle CPU: process CPU time over
0.3 s after a burst of launches. Steps: 32 steps of ``2 * threads`` chunks (empty, then 5 us
of busy work each) as a launch per step against one stepped launch (``geode_parallel_steps``,
a barrier between steps), interleaved, per step. Call overhead: ``call()`` of a trivial kernel with 3 arrays
and 2 ints, against ctypes calling a trivial C function of 3 pointers and 2 ints.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time
import timeit
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "runtime"))

from native_kernels import kernels  # noqa: E402

from geode.runtime import native as nt  # noqa: E402


def launch_overhead(k, threads: int, reps: int) -> tuple[float, float, float]:
    """Median and 90th percentile of a hot launch, and the median cold launch, in us."""
    out = np.zeros(reps, np.int64)
    nt.call(k.addr("launch_bench_entry"), 0, (out,), (reps, 2 * threads))  # warm-up
    nt.call(k.addr("launch_bench_entry"), 0, (out,), (reps, 2 * threads))
    hot = out / 1e3
    one = np.zeros(1, np.int64)
    cold = []
    for _ in range(200):
        time.sleep(0.002)
        nt.call(k.addr("launch_bench_entry"), 0, (one,), (1, 2 * threads))
        cold.append(one[0] / 1e3)
    return float(np.median(hot)), float(np.percentile(hot, 90)), statistics.median(cold)


def work_launch(k, threads: int, chunk_us: int = 20) -> tuple[float, float]:
    """Median time (us) of 2*threads chunks of chunk_us busy work: pooled, then serial."""
    out = np.zeros(500, np.int64)
    ints = (500, 2 * threads, chunk_us * 1000)
    nt.call(k.addr("work_bench_entry"), 0, (out,), ints)
    pooled = float(np.median(out)) / 1e3
    old = nt.get_num_threads()
    nt.set_num_threads(1)
    nt.call(k.addr("work_bench_entry"), 0, (out,), ints)
    nt.set_num_threads(old)
    return pooled, float(np.median(out)) / 1e3


def steps_vs_launches(k, threads: int, chunk_us: float, reps: int = 300) -> tuple[float, ...]:
    """Per step (us): median and 10th percentile of a launch per step, then of one stepped
    launch; 32 steps of ``2 * threads`` chunks of ``chunk_us`` busy work, interleaved."""
    out = np.zeros(2, np.int64)
    rows = []
    for _ in range(reps):
        nt.call(k.addr("steps_bench_entry"), 0, (out,), (32, 2 * threads, int(chunk_us * 1e3)))
        rows.append(out / 32e3)
    r = np.array(rows)
    return tuple(float(f(r[:, j])) for j in (0, 1) for f in (np.median, _p10))


def _p10(values: np.ndarray) -> float:
    return float(np.percentile(values, 10))


def idle_cpu(k, threads: int) -> float:
    """Process CPU seconds over 0.3 s idle after 3000 launches."""
    counts = np.zeros(2 * threads + 1, np.int64)
    for _ in range(3000):
        nt.call(k.addr("count_entry"), 0, (counts,), (2 * threads, 0))
    c0 = time.process_time()
    time.sleep(0.3)
    return time.process_time() - c0


def per_call_us(stmt, number: int = 200_000) -> float:
    """Best of 5 runs of the mean time per call, in us."""
    return min(timeit.repeat(stmt, number=number, repeat=5)) / number * 1e6


def call_overhead(k) -> dict[str, float]:
    """Per-call time (us) of call() and of ctypes references."""
    a, b, c = (np.zeros(16, np.float32) for _ in range(3))
    entry = k.addr("trivial_entry")
    arrays, ints, call = (a, b, c), (16, 3), nt.call
    proto = ctypes.CFUNCTYPE(
        ctypes.c_int32,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_int64,
    )
    cfn = proto(k.addr("trivial5"))
    pa, pb, pc = a.ctypes.data, b.ctypes.data, c.ctypes.data
    return {
        "geode call() (3 arrays, 2 ints)": per_call_us(lambda: call(entry, 2, arrays, ints)),
        "ctypes, prebuilt pointers": per_call_us(lambda: cfn(pa, pb, pc, 16, 3)),
        "ctypes, arr.ctypes.data": per_call_us(
            lambda: cfn(a.ctypes.data, b.ctypes.data, c.ctypes.data, 16, 3), 50_000
        ),
        "empty Python lambda": per_call_us(lambda: None),
    }


def main() -> None:
    """Print the measurements."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=0, help="pool size (0: default)")
    parser.add_argument("--reps", type=int, default=20000, help="hot launches timed")
    args = parser.parse_args()
    if args.threads:
        nt.set_num_threads(args.threads)
    threads = nt.get_num_threads()
    k = kernels()
    print(f"pool: {nt.pool_info()}")
    med, p90, cold = launch_overhead(k, threads, args.reps)
    print(f"launch, empty fn, {2 * threads} chunks: hot median {med:.2f} us (p90 {p90:.2f} us)")
    print(f"launch after 2 ms idle (workers asleep): median {cold:.2f} us")
    pooled, serial = work_launch(k, threads)
    print(f"{2 * threads} chunks x 20 us busy work: pool {pooled:.1f} us, serial {serial:.1f} us")
    for chunk_us in (0.0, 5.0):
        lm, lp, sm, sp = steps_vs_launches(k, threads, chunk_us)
        print(
            f"32 steps x {2 * threads} chunks x {chunk_us:g} us, per step: a launch each "
            f"median {lm:.2f} us (p10 {lp:.2f}), one stepped launch median {sm:.2f} us "
            f"(p10 {sp:.2f})"
        )
    print(f"idle CPU over 0.3 s after a burst: {idle_cpu(k, threads) * 1e3:.2f} ms")
    for name, us in call_overhead(k).items():
        print(f"{name}: {us:.3f} us/call")
    print(f"pool: {nt.pool_info()}")


if __name__ == "__main__":
    main()
