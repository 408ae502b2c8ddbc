"""How close the tuner's search gets to the best schedule of a space small enough to
measure whole, and how many measurements it needs.

    python bench/tuning_search.py [--kernels softmax,column] [--rows 4096] [--limit 4096]
                                  [--budget 0.2] [--predictor none|sol|projected]
                                  [--threads N] [--knobs parallel,streaming,...]
                                  [--passes 2] [--finalists 5] [--runs 3] [--rounds 7]

For each kernel (a row softmax over ``[rows, 1024]``; a column reduction, the sum over
axis 0 of ``[rows, 1024]``) the space is the product of the knobs that change its
schedule, its distinct kernels (:func:`geode.codegen.tuning.space.enumerate_space`;
a product over ``--limit`` settings is skipped). The machine may be shared, so every
time is a min: each schedule is measured in ``--passes`` passes over the whole space
(shuffled order; the min of the passes), then the ``--finalists`` fastest are timed
again in ``--rounds`` interleaved rounds (min of the rounds): the fastest of them is the
exhaustive best. Then the search (:func:`geode.codegen.tuning.search.tune_kernel`, the
predictor ranking the whole space) runs ``--runs`` times with ``budget`` times the
space's size as its trials; each run's pick, the exhaustive best and the default are
timed together in ``--rounds`` interleaved rounds (min of the rounds). Prints, per
kernel and run: the space's size, the default, the exhaustive best, the pick, how far
the pick is from the best and the fraction of the space measured.
"""

from __future__ import annotations

import argparse
import random
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
from geode.codegen.tuning.measure import KernelBench, schedule_digest  # noqa: E402
from geode.codegen.tuning.predict import projected_predictor, sol_predictor  # noqa: E402
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


def exhaustive(
    t: KernelTask, opts: Options, schedules: list, passes: int, finalists: int, rounds: int
) -> list[tuple[float, dict, object]]:
    """Every schedule measured in ``passes`` shuffled passes (min of the passes), then
    the ``finalists`` fastest timed again in ``rounds`` interleaved rounds (min):
    (seconds, setting, schedule), fastest first."""
    bench = KernelBench(t.name, t.lowered, t.inputs, t.env, opts)
    runs = {}
    best: dict[int, float] = {}
    for i, (setting, sch) in enumerate(schedules):
        try:
            runs[i] = bench.runner(sch)
        except GeodeError as exc:
            print(f"  {setting}: {exc}", file=sys.stderr)
    order = list(runs)
    rng = random.Random(0)
    for _ in range(passes):
        rng.shuffle(order)
        for i in order:
            s = bench.time(runs[i]).seconds
            best[i] = min(s, best.get(i, s))
    ranked = sorted(best, key=best.__getitem__)
    top = ranked[:finalists]
    again = bench.confirm_many([runs[i] for i in top], rounds)
    for i, s in zip(top, again):
        best[i] = min(best[i], s)
    ranked = sorted(best, key=best.__getitem__)
    return [(best[i], schedules[i][0], schedules[i][1]) for i in ranked]


def make_predictor(name: str, opts: Options):
    """The predictor called ``name``: none, sol or projected."""
    if name == "sol":
        return sol_predictor(cached_spec(opts.cache_dir))
    if name == "projected":
        return projected_predictor(opts)
    return None


def main() -> None:
    """Parse the arguments, measure each space and run the search on it."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kernels", default="softmax,column")
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--limit", type=int, default=4096)
    p.add_argument("--budget", type=float, default=0.2)
    p.add_argument("--predictor", choices=("none", "sol", "projected"), default="projected")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--passes", type=int, default=2, help="passes over the whole space")
    p.add_argument("--finalists", type=int, default=5, help="the fastest timed again")
    p.add_argument("--runs", type=int, default=3, help="searches per kernel")
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds of a comparison")
    p.add_argument(
        "--knobs",
        default="",
        help="the knobs of the space (comma-separated; empty: all)",
    )
    a = p.parse_args()
    opts = Options(num_threads=a.threads)
    predictor = make_predictor(a.predictor, opts)
    for name in a.kernels.split(","):
        t = task(name, a.rows)
        knobs = a.knobs.split(",") if a.knobs else None
        schedules = space.enumerate_space(t.lowered, t.group, opts, a.limit, knobs)
        if schedules is None:
            print(f"{name}: the space has more than --limit {a.limit} settings")
            continue
        ranked = exhaustive(t, opts, schedules, a.passes, a.finalists, a.rounds)
        best_s, best, best_sch = ranked[0]
        print(
            f"{name}: space {len(schedules)} kernels, exhaustive best {best_s * 1e6:.1f} us "
            f"{best}, default {next(s for s, st, _ in ranked if not st) * 1e6:.1f} us",
            flush=True,
        )
        trials = max(1, int(a.budget * len(schedules)))
        bench = KernelBench(t.name, t.lowered, t.inputs, t.env, opts)
        run_best = bench.runner(best_sch)
        run_default = bench.runner(schedules[0][1])
        for r in range(a.runs):
            res = tune_kernel(t, opts, trials, predictor, whole_space=a.limit, knobs=knobs)
            pick = space.build(t.lowered, t.group, opts, res.setting)
            same = schedule_digest(pick) == schedule_digest(best_sch)
            run_pick = run_best if same else bench.runner(pick)  # the same kernel: one runner
            tb, tp, td = bench.confirm_many([run_best, run_pick, run_default], a.rounds)
            print(
                f"  run {r}: pick {res.setting} ({res.status}{', the best' if same else ''}), "
                f"{res.trials} measured "
                f"({res.trials / len(schedules):.0%} of the space, predictor {a.predictor}); "
                f"together: best {tb * 1e6:.1f} us, pick {tp * 1e6:.1f} us "
                f"({tp / tb - 1:+.1%}{': the same kernel, the noise' if same else ''}), "
                f"default {td * 1e6:.1f} us ({td / tb - 1:+.1%})",
                flush=True,
            )


if __name__ == "__main__":
    main()
