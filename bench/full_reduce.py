"""Full reductions to a scalar: the default two-step schedule (partial sums of
contiguous runs in parallel, then the partials; ``Choices.rfactor_partials``) against
the one-thread schedule it replaced (``rfactor_partials=1``).

    python bench/full_reduce.py [--rows 16384] [--cols 1024] [--threads N] [--rounds 15]

Each reduction (sum, mean, max of squares) of a float32 ``[rows, cols]`` input is
compiled both ways in one process and timed in interleaved rounds (each round's time
the median of a batch of calls); prints the medians, the speedup and the bandwidth
(results: ``docs/performance.md``).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

import geode
from geode import ops
from geode.codegen.autoschedule import override_choices

#: the reductions timed: name -> graph builder over x
REDUCTIONS: dict[str, Callable[[object], object]] = {
    "sum": lambda x: ops.reduce_sum(x, keepdims=0),
    "mean": lambda x: ops.reduce_mean(x, keepdims=0),
    "max_sq": lambda x: ops.reduce_max(ops.mul(x, x), keepdims=0),
}


def graph(name: str, cols: int) -> geode.Graph:
    """The reduction ``name`` of a float32 ``[N, cols]`` input to a scalar."""
    g = geode.Graph(f"full_{name}")
    x = g.input("x", ["N", cols], np.float32)
    g.output(REDUCTIONS[name](x), names=["y"])
    return g


def compile_both(name: str, cols: int, threads: int) -> dict[str, geode.CompiledModel]:
    """The reduction compiled with the two-step schedule and with the serial one."""
    opts = {"num_threads": threads, "model_cache": False}
    two_step = geode.compile(graph(name, cols), **opts)
    with override_choices(rfactor_partials=1):
        serial = geode.compile(graph(name, cols), **opts)
    return {"two-step": two_step, "one thread": serial}


def time_rounds(models: dict, x: np.ndarray, rounds: int, calls: int) -> dict[str, float]:
    """Median seconds per call of each model, timed in interleaved rounds."""
    times: dict[str, list[float]] = {k: [] for k in models}
    for m in models.values():
        m(x=x)
    for _ in range(rounds):
        for k, m in models.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                m(x=x)
            times[k].append((time.perf_counter() - t0) / calls)
    return {k: statistics.median(v) for k, v in times.items()}


def run(rows: int, cols: int, threads: int, rounds: int, calls: int) -> list[str]:
    """One line per reduction: both medians, the speedup and the two-step bandwidth."""
    x = np.random.default_rng(0).standard_normal((rows, cols), dtype=np.float32)
    lines = []
    for name in REDUCTIONS:
        models = compile_both(name, cols, threads)
        outs = {k: float(m(x=x)["y"]) for k, m in models.items()}
        np.testing.assert_allclose(outs["two-step"], outs["one thread"], rtol=1e-4)
        med = time_rounds(models, x, rounds, calls)
        speedup = med["one thread"] / med["two-step"]
        gbs = x.nbytes / med["two-step"] / 1e9
        lines.append(
            f"{name:8s} [{rows}, {cols}] one thread {med['one thread'] * 1e3:8.3f} ms  "
            f"two-step {med['two-step'] * 1e3:8.3f} ms  speedup {speedup:5.2f}x  "
            f"({gbs:.1f} GB/s, {threads} threads)"
        )
    return lines


def main() -> None:
    """Parse the arguments, compile, time and print."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=16384)
    p.add_argument("--cols", type=int, default=1024)
    p.add_argument("--threads", type=int, default=0, help="0: all cores")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--calls", type=int, default=10)
    a = p.parse_args()
    for line in run(a.rows, a.cols, a.threads, a.rounds, a.calls):
        print(line)


if __name__ == "__main__":
    main()
