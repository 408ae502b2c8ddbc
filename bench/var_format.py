"""Variable format acceleration: a Linear whose weight is a variable, with the weight
stored transposed once (the ``variable_format`` pass) against a Transpose every call
(the pass disabled).

    python bench/var_format.py [--out 1024] [--in 768] [--batch 32] [--rounds 30]

The model is PyTorch's Linear as exported, ``x @ Transpose(W)`` with ``W`` a session
variable ``[out, in]``. Both models run in one process, timed in interleaved rounds of
20 calls; prints each one's steps and the medians (results: ``docs/performance.md``).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import geode
from geode import ops


def linear(w0: np.ndarray) -> geode.Graph:
    """``x @ Transpose(W)``, W a variable."""
    g = geode.Graph("linear")
    x = g.input("x", ["N", w0.shape[1]])
    w = g.variable(w0, "W")
    g.output(ops.matmul(x, ops.transpose(w, perm=[1, 0])), names=["y"])
    return g


def main() -> None:
    """Parse the arguments, compile both models, time them and print the medians."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=int, default=1024)
    p.add_argument("--in", dest="inner", type=int, default=768)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--rounds", type=int, default=30)
    a = p.parse_args()
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((a.out, a.inner)).astype(np.float32)
    x = rng.standard_normal((a.batch, a.inner)).astype(np.float32)
    fast = geode.Session().compile(linear(w0))
    slow = geode.Session(disabled_passes=("variable_format",)).compile(linear(w0))
    np.testing.assert_allclose(fast(x=x)["y"], slow(x=x)["y"], rtol=1e-4, atol=1e-4)
    times: dict[str, list[float]] = {"stored transposed": [], "transpose per call": []}
    models = dict(zip(times, (fast, slow)))
    for _ in range(a.rounds):
        for name, model in models.items():
            t0 = time.perf_counter()
            for _ in range(20):
                model(x=x)
            times[name].append((time.perf_counter() - t0) / 20)
    for name, model in models.items():
        steps = " | ".join(st.label for st in model.plan.steps)
        print(f"{name:20s} {statistics.median(times[name]) * 1e3:7.3f} ms  steps: {steps}")


if __name__ == "__main__":
    main()
