"""Throughput of the LLVM vmath functions against the numba ones (ns per element).

    python bench/vmath_llvm.py [--n 1000000] [--rounds 15] [--ops exp,tanh,...]

Each (op, dtype) runs as a single-threaded loop ``y[i] = f(x[i])`` over ``n`` elements:
the LLVM version through :mod:`geode.codegen.backends.llvm.vmath.harness` (O3, host
CPU, 512-bit vectors on AVX-512), the numba version as a plain ``njit`` loop (geode sets
numba's target to prefer 512-bit vectors too). Calls alternate between the two in each
round (which goes first alternates too); reported are the medians over rounds and their
ratio. The LLVM loop is called through its bare ctypes function (no argument checks).
Inputs are uniform in a range where the function does real work. Where an op has a
legacy LLVM form kept for A/B (float32 erf: ``geode.vm.erf_legacy.f32``, the numba
library's form), it runs in the same rounds and the last column is the new form's
time over the legacy one's (median of the per-round ratios).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numba
import numpy as np

from geode.codegen.backends import vmath as numba_vmath
from geode.codegen.backends.llvm import vmath
from geode.codegen.backends.llvm.vmath.harness import compile_loop

#: (op, dtype) -> the vmath function of its legacy form, measured alongside
LEGACY = {("erf", "float32"): "geode.vm.erf_legacy.f32"}

#: input ranges per op
RANGES = {
    "exp": (-80.0, 80.0),
    "expm1": (-10.0, 10.0),
    "log": (1e-3, 1e3),
    "log1p": (-0.9, 10.0),
    "tanh": (-8.0, 8.0),
    "one_plus_tanh": (-8.0, 8.0),
    "sigmoid": (-30.0, 30.0),
    "erf": (-4.0, 4.0),
    "sin": (-100.0, 100.0),
    "cos": (-100.0, 100.0),
    "div_one_plus_exp": (-30.0, 30.0),
}


def _numba_loop(fn, nargs: int):
    if nargs == 1:

        @numba.njit
        def run1(x, y):
            for i in range(x.size):
                y[i] = fn(x[i])

        return lambda xs, y: run1(xs[0], y)

    @numba.njit
    def run2(a, t, y):
        for i in range(a.size):
            y[i] = fn(a[i], t[i])

    return lambda xs, y: run2(xs[0], xs[1], y)


def _numba_fn(op: str, dtype: str):
    key = (op, dtype)
    return numba_vmath.VMATH2[key] if key in numba_vmath.VMATH2 else numba_vmath.VMATH[key]


def measure(op: str, dtype: str, n: int, rounds: int) -> tuple[float, float, float | None]:
    """Median ns per element of (LLVM, numba) and the median ratio of the LLVM time to
    its legacy form's (None without one)."""
    rng = np.random.default_rng(0)
    nargs = vmath.arity(op)
    lo, hi = RANGES[op]
    xs = [rng.uniform(lo, hi, n).astype(dtype) for _ in range(nargs)]
    y = np.empty(n, dtype)
    llvm_loop = compile_loop(op, dtype)
    nb_loop = _numba_loop(_numba_fn(op, dtype), nargs)
    nb_loop(xs, y)
    llvm_loop(*xs, out=y)
    # the raw ctypes call: CompiledLoop.__call__ checks its arrays (a few microseconds)
    ptrs = [y.ctypes.data, *(x.ctypes.data for x in xs)]
    runs = {"llvm": lambda: llvm_loop.cfunc(*ptrs, n, 1.0), "numba": lambda: nb_loop(xs, y)}
    if (op, dtype) in LEGACY:
        old = compile_loop(op, dtype, name=LEGACY[op, dtype])
        runs["legacy"] = lambda: old.cfunc(*ptrs, n, 1.0)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(rounds):
        order = list(runs) if r % 2 == 0 else list(reversed(runs))
        for name in order:
            t0 = time.perf_counter()
            runs[name]()
            times[name].append(time.perf_counter() - t0)
    vs_legacy = None
    if "legacy" in times:
        vs_legacy = statistics.median(a / b for a, b in zip(times["llvm"], times["legacy"]))
    return (
        statistics.median(times["llvm"]) / n * 1e9,
        statistics.median(times["numba"]) / n * 1e9,
        vs_legacy,
    )


def main() -> None:
    """Print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=101)
    ap.add_argument("--ops", default=",".join(sorted(vmath.OPS)))
    args = ap.parse_args()
    head = f"{'op':<18}{'dtype':<9}{'llvm ns/el':>11}{'numba ns/el':>12}{'ratio':>7}"
    print(head + f"{'new/legacy':>11}")
    for op in args.ops.split(","):
        for dtype in vmath.DTYPES:
            t_llvm, t_nb, vs_legacy = measure(op, dtype, args.n, args.rounds)
            legacy = f"{vs_legacy:>11.3f}" if vs_legacy is not None else ""
            print(f"{op:<18}{dtype:<9}{t_llvm:>11.3f}{t_nb:>12.3f}{t_llvm / t_nb:>7.2f}{legacy}")


if __name__ == "__main__":
    main()
