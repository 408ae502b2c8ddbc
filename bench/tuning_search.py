"""How close the tuner's search gets to the best schedule of a space small enough to
measure whole, and how many measurements it needs.

    python bench/tuning_search.py [--kernels softmax,column] [--rows 4096] [--limit 4096]
                                  [--budget 0.2] [--predictor none|sol] [--threads N]
                                  [--knobs parallel,streaming,...] [--whole-space N]

For each kernel (a row softmax over ``[rows, 1024]``; a column reduction, the sum over
axis 0 of ``[rows, 1024]``) the space is the product of the knobs that change its
schedule, its distinct kernels (:func:`geode.codegen.tuning.space.enumerate_space`;
a product over ``--limit`` settings is skipped). Every one is measured (the exhaustive
best); then the search (:func:`geode.codegen.tuning.search.tune_kernel`) runs with
``budget`` times the space's size as its trials. Prints, per kernel: the space's size, the default, the exhaustive
best, the search's pick (measured again alongside), how far the pick is from the best
and the fraction of the space measured.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from lowering_check import prepare  # noqa: E402

import geode  # noqa: E402
from geode import examples, ops  # noqa: E402
from geode.codegen.kernel_key import canonical_lowered, kernel_key  # noqa: E402
from geode.codegen.lower import lower_group  # noqa: E402
from geode.codegen.tuning import space  # noqa: E402
from geode.codegen.tuning.measure import KernelBench  # noqa: E402
from geode.codegen.tuning.predict import sol_predictor  # noqa: E402
from geode.codegen.tuning.search import KernelTask, tune_kernel  # noqa: E402
from geode.compiler.interpret import bind_inputs, run_reference  # noqa: E402
from geode.config import Options  # noqa: E402
from geode.costmodel.device import cached_spec  # noqa: E402
from geode.errors import GeodeError  # noqa: E402


def graph(name: str) -> geode.Graph:
    """The kernel's graph: a row softmax, or a column sum."""
    if name == "softmax":
        return examples.softmax(hidden=1024).graph
    g = geode.Graph("column")
    x = g.input("x", ["N", 1024], np.float32)
    g.output(ops.reduce_sum(x, axes=[0], keepdims=0), names=["y"])
    return g


def task(name: str, rows: int) -> KernelTask:
    """The kernel of ``name`` with its inputs for ``rows`` rows."""
    g, plan = prepare(graph(name))
    (group,) = plan.groups
    lk = lower_group(group, g, name)
    x = np.random.default_rng(0).standard_normal((rows, 1024)).astype(np.float32)
    values = run_reference(g, {"x": x}, keep_all=True)
    env = {str(k): int(v) for k, v in bind_inputs(g, {"x": x}).items()}
    clk = canonical_lowered(lk)
    arrays = [x if v.name == "x" else values[v.name] for v in clk.inputs]
    return KernelTask(name, kernel_key(lk.kernel), clk, group, arrays, env)


def exhaustive(t: KernelTask, opts: Options, schedules: list) -> list[tuple[float, dict]]:
    """Every schedule measured: (seconds, setting), fastest first."""
    bench = KernelBench(t.name, t.lowered, t.inputs, t.env, opts)
    out = []
    for setting, sch in schedules:
        try:
            out.append((bench.time(bench.runner(sch)).seconds, setting))
        except GeodeError as exc:
            print(f"  {setting}: {exc}", file=sys.stderr)
    return sorted(out, key=lambda x: x[0])


def main() -> None:
    """Parse the arguments, measure each space and run the search on it."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kernels", default="softmax,column")
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--limit", type=int, default=4096)
    p.add_argument("--budget", type=float, default=0.2)
    p.add_argument("--predictor", choices=("none", "sol"), default="sol")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument(
        "--whole-space",
        type=int,
        default=0,
        help="with a predictor, rank a space of at most this many settings whole (default 0)",
    )
    p.add_argument(
        "--knobs",
        default="",
        help="the knobs of the space (comma-separated; empty: all)",
    )
    a = p.parse_args()
    opts = Options(num_threads=a.threads)
    predictor = sol_predictor(cached_spec(opts.cache_dir)) if a.predictor == "sol" else None
    for name in a.kernels.split(","):
        t = task(name, a.rows)
        knobs = a.knobs.split(",") if a.knobs else None
        schedules = space.enumerate_space(t.lowered, t.group, opts, a.limit, knobs)
        if schedules is None:
            print(f"{name}: the space has more than --limit {a.limit} settings")
            continue
        ranked = exhaustive(t, opts, schedules)
        best_s, best = ranked[0]
        default_s = next(s for s, st in ranked if not st)
        trials = max(1, int(a.budget * len(schedules)))
        res = tune_kernel(t, opts, trials, predictor, whole_space=a.whole_space, knobs=knobs)
        pick = res.setting
        bench = KernelBench(t.name, t.lowered, t.inputs, t.env, opts)
        run_best = bench.runner(next(sch for st, sch in schedules if st == best))
        run_pick = bench.runner(space.build(t.lowered, t.group, opts, pick))
        rounds = [bench.confirm(run_best, run_pick, rounds=3) for _ in range(3)]
        gap = statistics.median(b / a_ for a_, b in rounds) - 1
        print(
            f"{name:8s} space {len(schedules):4d}  default {default_s * 1e6:8.1f} us  "
            f"exhaustive best {best_s * 1e6:8.1f} us {best}  search {pick} "
            f"({res.trials} measured, {res.trials / len(schedules):.0%} of the space, "
            f"predictor {a.predictor})  pick vs best {gap:+.1%}"
        )


if __name__ == "__main__":
    main()
