"""The ``geode`` command line.

Subcommands: ``demo`` (compile and run the built-in RMSNorm and LayerNorm graphs and
compare them with numpy). Errors print one line and exit non-zero.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import numpy as np

from geode.errors import GeodeError


def _median_time(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    fn()
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def cmd_demo(args: argparse.Namespace) -> int:
    """Compile the built-in RMSNorm and LayerNorm graphs, check and time them against numpy."""
    import geode
    from geode import examples

    rng = np.random.default_rng(0)
    print(f"geode demo: batch {args.batch}, hidden {args.hidden}, float32")
    print(f"{'model':<12}{'kernels':>8}{'compile ms':>12}{'max |err|':>12}{'geode ms':>10}{'numpy ms':>10}{'speedup':>9}")
    for name in ("rmsnorm", "layernorm"):
        ex = getattr(examples, name)(hidden=args.hidden)
        t0 = time.perf_counter()
        model = geode.compile(ex.graph)
        compile_ms = (time.perf_counter() - t0) * 1e3
        feeds = ex.make_inputs(rng, args.batch)
        got = model(**feeds)
        want = ex.numpy(**feeds)
        err = max(float(np.max(np.abs(got[k] - want[k]))) for k in want)
        tg = _median_time(lambda: model(**feeds), args.repeat)  # noqa: B023
        tn = _median_time(lambda: ex.numpy(**feeds), args.repeat)  # noqa: B023
        native = sum(1 for k in model.kernels if k.engine == "aicore")
        kern = f"{native}/{len(model.kernels)}"
        print(f"{name:<12}{kern:>8}{compile_ms:>12.1f}{err:>12.2e}{tg * 1e3:>10.3f}{tn * 1e3:>10.3f}{tn / tg:>8.2f}x")
        if err > 1e-3:
            print(f"error: {name} differs from numpy by {err}", file=sys.stderr)
            return 1
    print("kernels column: native AI Core kernels / all steps")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand."""
    p = argparse.ArgumentParser(prog="geode", description="geode: a fusion compiler for deep-learning graphs")
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="compile and run the built-in RMSNorm and LayerNorm graphs")
    d.add_argument("--batch", type=int, default=4096, help="rows of the input (default 4096)")
    d.add_argument("--hidden", type=int, default=768, help="hidden size (default 768)")
    d.add_argument("--repeat", type=int, default=20, help="timed repetitions (default 20)")
    d.set_defaults(func=cmd_demo)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``geode`` command; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except GeodeError as exc:
        print(f"geode: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("geode: interrupted", file=sys.stderr)
        return 130
