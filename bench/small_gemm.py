"""The small float32 products of batch-1 models through ``geode_gemm``, against numpy.

    PYTHONPATH=. python bench/small_gemm.py [--calls 2000] [--threads 2]

Per shape ``M x K x N`` (the GEMV of an LSTM cell, BERT's and GPT-2's 32-row projections,
the Llama MLP's): ``geode_gemm`` on ``--threads`` threads (geode's own kernel split over
the pool where the BLAS would run one call: ``runtime/native/sgemm_thin.c``), on one
thread (the BLAS, or geode's kernel for a GEMV), and numpy's ``matmul`` (OpenBLAS). Two
weight matrices alternate, as in a model whose weights do not all fit the L2 cache. Each
call is timed on its own; the 5th percentile (the time when nothing else ran on the cores)
and the median are printed in microseconds, with which path each call took.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from geode.codegen.backends.llvm.library import blas  # noqa: E402
from geode.runtime import native  # noqa: E402

SHAPES = [(1, 256, 1024), (1, 256, 256), (32, 256, 256), (32, 256, 768), (32, 256, 688)]


def _times(fn, calls: int) -> tuple[float, float]:
    """5th percentile and median of ``calls`` timed calls (after 200 untimed), in us."""
    for i in range(200):
        fn(i)
    t = np.empty(calls)
    clock = time.perf_counter
    for i in range(calls):
        t0 = clock()
        fn(i)
        t[i] = clock() - t0
    return float(np.percentile(t, 5) * 1e6), float(np.median(t) * 1e6)


def _row(gemm, shape: tuple[int, int, int], threads: int, calls: int) -> str:
    """One table row: the shape's three timings and the threaded call's path."""
    m, k, n = shape
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(np.float32)
    bs = [rng.standard_normal((k, n)).astype(np.float32) for _ in range(2)]
    c = np.empty((m, n), np.float32)
    pa, pbs, pc = a.ctypes.data, [b.ctypes.data for b in bs], c.ctypes.data

    def geode(i: int, t: int) -> None:
        gemm(0, m, n, k, pa, k, pbs[i & 1], n, 0.0, pc, n, t)

    info = native.pool_info()
    geode(0, threads)
    after = native.pool_info()
    if after["gemm_thin_calls"] > info["gemm_thin_calls"]:
        path = "geode kernel"
    elif after["gemm_split_calls"] > info["gemm_split_calls"]:
        path = "BLAS blocks"
    else:
        path = "one BLAS call"
    np.testing.assert_allclose(c, a.astype(np.float64) @ bs[0], rtol=1e-4, atol=1e-3)
    par = _times(lambda i: geode(i, threads), calls)
    one = _times(lambda i: geode(i, 1), calls)
    ref = _times(lambda i: np.matmul(a, bs[i & 1], out=c), calls)
    cells = [f"{p5:.1f} / {med:.1f}" for p5, med in (par, one, ref)]
    return f"| {m} x {k} x {n} | {cells[0]} | {path} | {cells[1]} | {cells[2]} |"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    if blas() is None:
        print("no BLAS found in numpy's wheel")
        return 1
    native.set_num_threads(args.threads)
    gemm = native.gemm_function()
    print(f"threads {args.threads}; us per call, p5 / median; path of the threaded call")
    print("| M x K x N | geode threaded | path | geode 1 thread | numpy |")
    print("|---|---:|---|---:|---:|")
    for shape in SHAPES:
        print(_row(gemm, shape, args.threads, args.calls))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
