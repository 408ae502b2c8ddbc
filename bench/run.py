"""Run every workload on every system in one process and print a comparison table.

    python bench/run.py [--threads N] [--repeat K] [--scale S] [--systems geode,numpy,...]

All systems run with the same thread count, timed in rounds (see ``time_in_rounds``) so
drifting machine speed hits them alike. Reported per workload: median time per system,
geode's speedup over the best other system and geode's fraction of the memory-bandwidth
roofline (the time a copy of the workload's compulsory bytes takes, over geode's time),
both as medians of per-round ratios (``paired``). Every copy kernel is timed in every
round of every workload, each call interleaved with geode's calls, and the round's fastest
is its roofline copy (a copy chosen once up front would inflate the fraction whenever
noise picked the slower one); the last column is the median bandwidth of those copies
(read plus write), which the fraction was taken against.
Also reported: geode's compile time per kernel, cold (nothing cached, and with the runtime
helpers cached) and warm (disk cache).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path


def _set_threads(n: int) -> None:
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ[var] = str(n)
    os.environ.setdefault(
        "XLA_FLAGS", f"--xla_cpu_multi_thread_eigen=true intra_op_parallelism_threads={n}"
    )


#: seconds of rest before each system's block of calls: longer than the time the other
#: systems' idle threads keep spinning (Intel OpenMP's KMP_BLOCKTIME is 200 ms), so each
#: system is timed on quiet cores
SETTLE = 0.3

#: geode's systems: the default (LLVM) backend and the numba backend
GEODES = ("geode", "geode-numba")

#: seconds per call above which a system is timed once per round
SLOW = 0.1


def _timed(fn: Callable[[], object]) -> float:
    """Seconds one call of ``fn`` takes."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def time_in_rounds(
    fns: dict,  # type: ignore[type-arg]
    repeat: int,
    rounds: int = 3,
    together: Sequence[str] = (),
) -> dict[str, list[float]]:
    """Seconds per call of each function in each of ``rounds`` rounds (the median of the
    round's calls). Each round runs every function in turn: a rest of :data:`SETTLE`
    seconds, one untimed call, then ``repeat`` timed calls back to back (one for systems
    slower than :data:`SLOW` per call, which would otherwise dominate the run time). The
    functions named in ``together`` instead share one block: after the rest and an
    untimed call of each, they are timed call by call in turn, ``repeat`` times, so each
    sees the machine the others see within milliseconds.

    Rounds spread each system's samples over the run, so a machine whose speed drifts (a
    shared VM) slows every system alike, and ratios are taken within a round (see
    :func:`paired`); the rest lets the previous system's thread pool wind down
    (onnxruntime's and OpenMP's workers spin after a run and would otherwise steal the
    cores from the next system). ``together`` is for functions whose ratio is wanted
    tightly paired and that leave no other library's threads spinning (geode and the
    roofline copies: geode's own copy kernels and numpy's memcpy). Timed in separate blocks a
    second apart, the LSTM gates' per-round roofline fractions spread over 37-122% in
    three runs of 7 rounds on a shared two-core VM; interleaved, over 54-86%."""
    samples: dict[str, list[float]] = {k: [] for k in fns}
    units = [[k] for k in fns if k not in together] + ([list(together)] if together else [])
    for _ in range(rounds):
        for unit in units:
            time.sleep(SETTLE)
            n = repeat if max(_timed(fns[k]) for k in unit) < SLOW else 1
            ts: dict[str, list[float]] = {k: [] for k in unit}
            for _ in range(n):
                for k in unit:
                    ts[k].append(_timed(fns[k]))
            for k in unit:
                samples[k].append(statistics.median(ts[k]))
    return samples


def paired(num: list[float], den: list[float]) -> float:
    """Median over rounds of ``num[r] / den[r]``: a ratio of two systems timed in the same
    rounds, so machine-speed drift between rounds cancels."""
    return statistics.median(a / b for a, b in zip(num, den))


def compile_times(
    scale: float, names: list[str], backend: str = "llvm"
) -> list[tuple[str, float, float, float]]:
    """Compile seconds per kernel of each workload, three ways, each in a fresh process on
    the workload's own empty cache folder: cold with nothing cached (the first compile on
    a machine: the runtime helpers the kernel links in, the chunk launcher and the vmath
    functions, are compiled too), cold with the helpers cached (the usual cold compile
    once anything has been compiled: the kernel entries are deleted, ``runtime/`` is kept),
    and warm (the kernel loaded from its disk cache entry)."""
    # each process first compiles a tiny graph, so numba's one-time start-up is not
    # charged to the workload's kernels
    code = (
        "import time, sys; sys.path.insert(0, {root!r}); from bench.workloads import workloads; import geode;"
        "g = geode.Graph('warmup'); x = g.input('x', [7]); g.output(x * 3.0, names=['y']); geode.compile(g);"
        "w = [w for w in workloads({scale}) if w.name == {name!r}][0]; t = time.perf_counter();"
        "m = geode.compile(w.example.graph); print(time.perf_counter() - t, len([k for k in m.kernels if k.engine == 'aicore']))"
    )
    root = str(Path(__file__).resolve().parents[1])
    from bench.workloads import workloads
    from geode.codegen.cache import KERNEL_AREA

    def seconds_per_kernel(name: str, env: dict[str, str]) -> float:
        p = subprocess.run(
            [sys.executable, "-c", code.format(root=root, scale=scale, name=name)],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        secs, nk = p.stdout.split()
        return float(secs) / max(1, int(nk))

    out = []
    for w in workloads(scale):
        if w.name not in names:
            continue
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, GEODE_CACHE_DIR=cache, GEODE_BACKEND=backend)
            cold = seconds_per_kernel(w.name, env)
            shutil.rmtree(Path(cache) / KERNEL_AREA, ignore_errors=True)
            kernel_cold = seconds_per_kernel(w.name, env)
            warm = seconds_per_kernel(w.name, env)
        out.append((w.name, cold, kernel_cold, warm))
    return out


def main(argv: list[str] | None = None) -> int:
    """Entry point; prints the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeat", type=int, default=7, help="timed calls per round")
    ap.add_argument("--rounds", type=int, default=5, help="rounds (ratios are paired per round)")
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of the full 64 MiB inputs")
    ap.add_argument("--systems", default=None, help="comma-separated subset of systems")
    ap.add_argument("--workloads", default=None, help="comma-separated subset of workloads")
    ap.add_argument("--no-compile-times", action="store_true")
    args = ap.parse_args(argv)
    _set_threads(args.threads)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.workloads import SYSTEMS, geomean, load_runtimes, roofline_copies, workloads

    systems = args.systems.split(",") if args.systems else list(SYSTEMS)
    # the names are checked before the runtimes load (seconds): a typo fails at once
    every = workloads(args.scale)
    known = [w.name for w in every]
    wanted = set(args.workloads.split(",")) if args.workloads else set(known)
    chosen = [w for w in every if w.name in wanted]
    unknown = wanted - set(known)
    if unknown:
        ap.error(f"unknown workload(s) {sorted(unknown)}; known: {', '.join(known)}")
    # before any numba parallel code runs (geode-numba's kernels): see load_runtimes
    load_runtimes(systems, args.threads)
    nbytes = int((64 << 20) * max(args.scale, 1 / 16))
    copies = roofline_copies(nbytes)
    copy_times = {k: statistics.median(v) for k, v in time_in_rounds(copies, args.repeat).items()}
    print(
        f"threads {args.threads}; roofline: the fastest copy of each round (copies: "
        + ", ".join(f"{k} {2 * nbytes / t / 1e9:.2f} GB/s" for k, t in copy_times.items())
        + "), all timed again in every round of every workload"
    )
    header = (
        f"{'workload':<16}"
        + "".join(f"{s:>14}" for s in systems)
        + "".join(f"{'speedup':>9}{'roofline':>9}" for g in GEODES if g in systems)
        + f"{'copy GB/s':>11}"
    )
    print(header)
    print("-" * len(header))
    speedups: dict[str, list[float]] = {}
    roofs: dict[str, list[float]] = {}
    missing: dict[str, str] = {}
    from bench.workloads import build

    for w in chosen:
        fns = {f"copy: {k}": fn for k, fn in copies.items()}
        for s in systems:
            try:
                fns[s] = build(s, w, args.threads)
            except ImportError as exc:
                missing[s] = str(exc)
        # the roofline fraction is paired call by call (see time_in_rounds)
        # geode-numba runs in a block of its own: numba's OpenMP workers spin for 200 ms
        # after a call and would take a core from the calls interleaved with them
        together = [*(f"copy: {k}" for k in copies), "geode"] if "geode" in fns else []
        if "geode-numba" in fns:  # both backends alike, each in a block of its own
            together = []
        rounds = time_in_rounds(
            fns, args.repeat, args.rounds, together if len(together) > len(copies) else []
        )
        times = {k: statistics.median(v) for k, v in rounds.items() if k in systems}
        row = f"{w.name:<16}" + "".join(
            f"{times[s] * 1e3:>12.2f}ms" if s in times else f"{'missing':>14}" for s in systems
        )
        # geode's speedup over the best system that is not geode (either backend)
        others = [s for s in times if s not in GEODES]
        fastest = [min(rounds[f"copy: {k}"][r] for k in copies) for r in range(args.rounds)]
        for g in (g for g in GEODES if g in times):
            if others:
                best_other = [min(rounds[s][r] for s in others) for r in range(args.rounds)]
                sp = paired(best_other, rounds[g])
                speedups.setdefault(g, []).append(sp)
                row += f"{sp:>8.2f}x"
            else:
                row += f"{'-':>9}"
            # a copy moving the workload's compulsory bytes at the round's copy bandwidth
            ideal = [t * w.bytes_moved / (2 * nbytes) for t in fastest]
            roof = paired(ideal, rounds[g])
            roofs.setdefault(g, []).append(roof)
            row += f"{roof * 100:>8.0f}%"
        # the bandwidth the fractions were taken against (memory speed drifts on a shared
        # host: the header's copy figures were measured before the first workload)
        bandwidth = statistics.median(2 * nbytes / t for t in fastest)
        row += f"{bandwidth / 1e9:>11.1f}"
        print(row, flush=True)
    for g, sps in speedups.items():
        print(f"geometric mean speedup of {g} over the best other system: {geomean(sps):.2f}x")
    if len(roofs) == 2:  # both backends: compare them
        for g, rs in roofs.items():
            print(f"geometric mean roofline fraction of {g}: {geomean(rs) * 100:.0f}%")
    if len(speedups) == 2:
        print(
            "LLVM backend / numba backend: speedup "
            f"{geomean(speedups['geode']) / geomean(speedups['geode-numba']):.3f}, roofline "
            f"{geomean(roofs['geode']) / geomean(roofs['geode-numba']):.3f}"
        )
    for s, why in missing.items():
        print(f"missing system {s}: {why}")
    for g in (g for g in GEODES if g in systems and not args.no_compile_times):
        backend = "numba" if g == "geode-numba" else "llvm"
        print(
            f"\n{g} compile time per kernel (fresh process): cold, nothing cached / cold, "
            "runtime helpers cached / warm (disk cache)"
        )
        for name, cold, kernel_cold, warm in compile_times(
            args.scale, [w.name for w in chosen], backend
        ):
            print(
                f"  {name:<16} {cold * 1e3:8.1f} ms / {kernel_cold * 1e3:8.1f} ms"
                f" / {warm * 1e3:8.1f} ms"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
