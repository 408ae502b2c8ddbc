"""Run every workload on every system in one process and print a comparison table.

    python bench/run.py [--threads N] [--repeat K] [--scale S] [--systems geode,numpy,...]

All systems run with the same thread count, timed in rounds (see ``time_in_rounds``) so
drifting machine speed hits them alike. Reported per workload: median time per system,
geode's speedup over the best other system, and geode's fraction of the memory-bandwidth
roofline (compulsory bytes / time, against the fastest copy kernel).
Also reported: geode's cold and warm (disk cache) compile time per kernel.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
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


def time_in_rounds(fns: dict, repeat: int, rounds: int = 3) -> dict[str, float]:  # type: ignore[type-arg]
    """Median seconds per call of each function over ``rounds`` rounds; each round runs
    every function in turn: a rest of :data:`SETTLE` seconds, one untimed call, then
    ``repeat`` timed calls back to back.
    Rounds spread each system's samples over the run, so a machine whose speed drifts (a
    shared VM) slows every system alike; the rest lets the previous system's thread pool
    wind down (onnxruntime's and OpenMP's workers spin after a run and would otherwise
    steal the cores from the next system)."""
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            time.sleep(SETTLE)
            fn()
            for _ in range(repeat):
                t0 = time.perf_counter()
                fn()
                samples[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in samples.items()}


def compile_times(scale: float) -> list[tuple[str, float, float]]:
    """Cold and warm compile seconds per workload, each in a fresh process."""
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

    out = []
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, GEODE_CACHE_DIR=cache)
        for w in workloads(scale):
            res = []
            for _ in range(2):  # cold, then warm from the disk cache
                p = subprocess.run(
                    [sys.executable, "-c", code.format(root=root, scale=scale, name=w.name)],
                    capture_output=True,
                    text=True,
                    env=env,
                    check=True,
                )
                secs, nk = p.stdout.split()
                res.append(float(secs) / max(1, int(nk)))
            out.append((w.name, res[0], res[1]))
    return out


def main(argv: list[str] | None = None) -> int:
    """Entry point; prints the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of the full 64 MiB inputs")
    ap.add_argument("--systems", default=None, help="comma-separated subset of systems")
    ap.add_argument("--no-compile-times", action="store_true")
    args = ap.parse_args(argv)
    _set_threads(args.threads)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    # geode chooses numba's vector width when numba's CPU target is built: before the
    # roofline's numba copy kernels are compiled (see geode.codegen.backends.target)
    import geode.codegen.backends  # noqa: F401
    from bench.workloads import SYSTEMS, geomean, roofline_copies, workloads

    systems = args.systems.split(",") if args.systems else list(SYSTEMS)
    nbytes = int((64 << 20) * max(args.scale, 1 / 16))
    copies = time_in_rounds(roofline_copies(nbytes), args.repeat)
    best = min(copies, key=copies.get)
    copy_bw = 2 * nbytes / copies[best]
    print(
        f"threads {args.threads}; roofline {copy_bw / 1e9:.2f} GB/s (fastest copy: {best}; "
        + ", ".join(f"{k} {2 * nbytes / t / 1e9:.2f} GB/s" for k, t in copies.items())
        + ")"
    )
    header = (
        f"{'workload':<16}"
        + "".join(f"{s:>14}" for s in systems)
        + f"{'speedup':>9}{'roofline':>9}"
    )
    print(header)
    print("-" * len(header))
    speedups = []
    missing: dict[str, str] = {}
    from bench.workloads import build

    for w in workloads(args.scale):
        fns = {}
        for s in systems:
            try:
                fns[s] = build(s, w, args.threads)
            except ImportError as exc:
                missing[s] = str(exc)
        times = time_in_rounds(fns, args.repeat)
        row = f"{w.name:<16}" + "".join(
            f"{times[s] * 1e3:>12.2f}ms" if s in times else f"{'missing':>14}" for s in systems
        )
        others = [t for s, t in times.items() if s != "geode"]
        if "geode" in times and others:
            sp = min(others) / times["geode"]
            speedups.append(sp)
            roof = w.bytes_moved / times["geode"] / copy_bw
            row += f"{sp:>8.2f}x{roof * 100:>8.0f}%"
        print(row, flush=True)
    print(f"geometric mean speedup of geode over the best other system: {geomean(speedups):.2f}x")
    for s, why in missing.items():
        print(f"missing system {s}: {why}")
    if not args.no_compile_times and "geode" in systems:
        print("\ngeode compile time per kernel (fresh process): cold / warm (disk cache)")
        for name, cold, warm in compile_times(args.scale):
            print(f"  {name:<16} {cold * 1e3:8.1f} ms / {warm * 1e3:8.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
