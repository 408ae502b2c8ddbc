"""``python -m geode.costmodel.report``: how accurate each cost model is on this machine.

Generates kernels (:mod:`geode.costmodel.samples`), compiles them through the real
pipeline, times them (interleaved rounds, the median), fits the projected model on
part of them and prints each model's accuracy on the kernels held out: Spearman rank
correlation and median relative error (:mod:`geode.costmodel.accuracy`)::

    python -m geode.costmodel.report [--n 160] [--seed 0] [--holdout 0.3]
        [--rounds 7] [--save] [--save-samples FILE] [--samples FILE] [--progress 1]

``--save`` refits the projected model on every sample and keeps it for this device in
the cache folder, where compiles find it (:mod:`geode.costmodel.store`).
``--samples FILE`` replays samples saved with ``--save-samples`` (on the device spec
they were measured on) instead of measuring.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

from geode import config
from geode.costmodel import projected
from geode.costmodel.accuracy import evaluate
from geode.costmodel.device import cached_spec
from geode.costmodel.samples import collect, load_samples, save_samples
from geode.costmodel.store import save_model
from geode.errors import GeodeError


def parser() -> argparse.ArgumentParser:
    """The command's arguments."""
    p = argparse.ArgumentParser(
        prog="python -m geode.costmodel.report",
        description="Accuracy of geode's cost models on held-out kernels of this machine.",
    )
    p.add_argument("--n", type=int, default=160, help="kernel cases to generate (default 160)")
    p.add_argument("--seed", type=int, default=0, help="seed of the cases and the split")
    p.add_argument("--holdout", type=float, default=0.3, help="share held out (default 0.3)")
    p.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds")
    p.add_argument("--save", action="store_true", help="keep the model fitted on all samples")
    p.add_argument("--save-samples", metavar="FILE", help="write the samples as JSON")
    p.add_argument("--samples", metavar="FILE", help="replay samples instead of measuring")
    p.add_argument("--progress", default="auto", help="progress bar: auto, 1 or 0")
    return p


def load_text() -> str:
    """The machine's load average, which the timings depend on (other processes on the
    cores slow kernels down, parallel ones most)."""
    try:
        one, five, _ = os.getloadavg()
    except OSError:
        return "load average unknown"
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min)"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the report; 0 on success, 2 on bad arguments or input."""
    args = parser().parse_args(argv)
    if args.n < 2 and not args.samples:
        print("error: --n must be at least 2", file=sys.stderr)
        return 2
    if not 0 < args.holdout < 1:
        print("error: --holdout must be between 0 and 1", file=sys.stderr)
        return 2
    if args.rounds < 1:
        print("error: --rounds must be at least 1", file=sys.stderr)
        return 2
    opts = config.current(progress="0", model_cache=False)
    import geode.codegen  # noqa: F401 - installs the calibration kernels of the LLVM backend

    spec = cached_spec(opts.cache_dir)
    t0 = time.perf_counter()
    try:
        if args.samples:
            samples, recorded = load_samples(args.samples)
            spec = recorded or spec
        else:
            samples = collect(
                args.n, args.seed, opts=opts, rounds=args.rounds, progress=args.progress
            )
        if args.save_samples:
            save_samples(args.save_samples, samples, spec)
        ev = evaluate(samples, spec, holdout=args.holdout, seed=args.seed)
    except (ValueError, GeodeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    took = time.perf_counter() - t0
    print(f"device: {spec.key()} ({spec.method} calibration); {load_text()}")
    print(
        f"{len(samples)} kernels ({'replayed' if args.samples else 'measured'} in {took:.1f} s): "
        f"fitted on {ev.n_fit}, held out {ev.n_held_out} (seed {args.seed})"
    )
    print(ev.table())
    coef = ", ".join(f"{t} {ev.fitted.coefficients[t]:.3g}" for t in projected.TERMS)
    print(f"projected coefficients: {coef}")
    if args.save:
        full = projected.fit([(s.features, s.measured_s) for s in samples], spec)
        print(
            f"saved the model fitted on all {len(samples)}: {save_model(opts.cache_dir, spec, full)}"
        )
    return 0


if __name__ == "__main__":  # pragma: no cover - the command
    sys.exit(main())
