"""``python -m geode.fuzz``: differential fuzzing of geode against its reference engine.

    python -m geode.fuzz --n 10000 --seed 1 [--jobs J] [--out DIR] [--max-nodes K]
                         [--time-budget SEC]
    python -m geode.fuzz --replay DIR

Prints graphs per second, the seed and the counts (passed, rejected-clean, failed);
exits 1 when a case failed (each failure gets a reproducer folder under ``--out``),
2 on bad options.
"""

from __future__ import annotations

import argparse
import sys

from geode.errors import GeodeError
from geode.fuzz.driver import FuzzConfig, replay, run_fuzz


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(
        prog="python -m geode.fuzz",
        description="Random graphs compiled by geode and compared with its reference engine.",
    )
    p.add_argument("--n", type=int, default=1000, help="graphs to check (default 1000)")
    p.add_argument("--seed", type=int, default=0, help="the run's seed (default 0)")
    p.add_argument("--out", help="folder for reproducers (default ./geode-fuzz-out)")
    p.add_argument("--max-nodes", type=int, default=8, help="nodes per graph at most (8)")
    p.add_argument("--time-budget", type=float, help="stop checking after this many seconds")
    p.add_argument(
        "--max-shrink", type=int, default=50, help="failures to shrink at most (default 50)"
    )
    p.add_argument(
        "--no-isolate",
        action="store_true",
        help="check in this process (a crashing kernel then ends the run)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="worker processes checking cases at once (default 1; the results do not depend on it)",
    )
    p.add_argument("--cache-dir", help="kernel cache folder (default: a temporary one)")
    p.add_argument(
        "--only",
        type=int,
        action="append",
        default=[],
        metavar="INDEX",
        help="check only case INDEX of the seed (repeatable), e.g. to rerun a failure",
    )
    p.add_argument("--replay", metavar="DIR", help="check one reproducer folder again")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the command; returns the exit status."""
    args = parse_args(argv)
    try:
        if args.replay:
            outcome = replay(args.replay, isolate=not args.no_isolate)
            print(f"{args.replay}: {outcome.status} {outcome.kind}\n{outcome.message}".rstrip())
            return 1 if outcome.failed else 0
        config = FuzzConfig(
            n=args.n,
            seed=args.seed,
            out=args.out,
            max_nodes=args.max_nodes,
            time_budget=args.time_budget,
            isolate=not args.no_isolate,
            max_shrink=args.max_shrink,
            cache_dir=args.cache_dir,
            only=tuple(args.only),
            jobs=args.jobs,
        )
        report = run_fuzz(config)
    except GeodeError as exc:
        print(f"geode.fuzz: {exc}", file=sys.stderr)
        return 2
    print(report.summary())
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
