"""Measuring candidates (outputs checked against the default's, median times) and the
search over a kernel's space (hill climbing from the default, predictor-ranked,
refusing wrong candidates, confirming the winner in interleaved rounds)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from lowering_check import prepare

from geode import Graph, examples, ops
from geode.codegen import ast as A
from geode.codegen.kernel_key import canonical_lowered, kernel_key
from geode.codegen.lower import lower_group
from geode.codegen.schedule.trace_json import replay_checked
from geode.codegen.tuning import measure, search, space
from geode.codegen.tuning.measure import KernelBench, Timing, mismatch
from geode.codegen.tuning.predict import kernel_work, predict, sol_predictor
from geode.compiler.interpret import bind_inputs, run_reference
from geode.config import Options
from geode.costmodel.device import default_spec

OPTS = Options()
QUICK = {"repeat": 1, "min_time": 0.0, "max_time": 0.05}


def _task(name="softmax", rows=16, **kw) -> search.KernelTask:
    ex = examples.ALL[name](**({"hidden": 1024} if name == "softmax" else {}) | kw)
    g, plan = prepare(ex.graph)
    (group,) = plan.groups
    lk = lower_group(group, g, "fused_0")
    feeds = ex.make_inputs(np.random.default_rng(1), rows)
    values = run_reference(g, feeds, keep_all=True)
    env = {str(k): int(v) for k, v in bind_inputs(g, feeds).items()}
    clk = canonical_lowered(lk)
    arrays = [
        v.data if v.data is not None else feeds.get(v.name, values.get(v.name)) for v in clk.inputs
    ]
    return search.KernelTask("fused_0", kernel_key(lk.kernel), clk, group, arrays, env)


# -- measuring --------------------------------------------------------------------------


def test_mismatch_within_and_beyond_the_tolerances() -> None:
    a = np.linspace(-3, 3, 100, dtype=np.float32)
    assert mismatch([a], [a.copy()]) is None
    assert mismatch([a * (1 + 1e-5)], [a]) is None  # a reassociated reduction's rounding
    worse = a.copy()
    worse[7] += 0.1
    assert "1 elements differ, e.g. at flat index 7" in mismatch([worse], [a])
    nan = a.copy()
    nan[3] = np.nan
    assert mismatch([nan], [nan.copy()]) is None
    assert "differ" in mismatch([a], [nan])
    assert "2 elements differ" in mismatch([np.array([1, 2, 3])], [np.array([1, 5, 6])])
    assert "expected float32[100]" in mismatch([a[:5]], [a])
    assert "expected" in mismatch([a.astype(np.float64)], [a])


def test_the_bench_runs_candidates_on_the_real_arguments() -> None:
    task = _task()
    bench = KernelBench(task.name, task.lowered, task.inputs, task.env, OPTS, **QUICK)
    sch = space.build(task.lowered, task.group, OPTS, {})
    run = bench.runner(sch)
    (y,) = run()
    x = task.inputs[0]
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(axis=-1, keepdims=True), rtol=1e-5)
    t = bench.time(run)
    assert t.seconds > 0 and len(t.samples) >= 1
    a, b = bench.confirm(run, run, rounds=2)
    assert a > 0 and b > 0


def test_the_sol_predictor_sees_parallel_and_work() -> None:
    task = _task(rows=4096)
    dims = task.dims
    par = space.build(task.lowered, task.group, OPTS, {})
    ser = space.build(task.lowered, task.group, OPTS, {"parallel": 0})
    w = kernel_work(par.kernel, dims)
    assert w.parallel and not kernel_work(ser.kernel, dims).parallel
    n = 4096 * task.lowered.kernel.inputs[0].shape[-1].value
    assert w.bytes_read == n * 4 and w.bytes_written == n * 4
    assert w.transcendentals == n  # one exp per element
    sol = sol_predictor(default_spec())
    assert predict(sol, par.kernel, dims) < predict(sol, ser.kernel, dims)
    assert predict(lambda k: 2.5, par.kernel, dims) == 2.5  # one-argument predictors too
    # loops whose extent uses an outer loop's variable (a deferred pass's chunks)
    deferred = space.build(task.lowered, task.group, OPTS, {"streaming": "always"})
    assert "defer_last_pass" in str(deferred.trace)
    assert kernel_work(deferred.kernel, dims).transcendentals == n


# -- the search ----------------------------------------------------------------------------


def _fake_times(monkeypatch, seconds_of) -> list[str]:
    """Time candidates by their kernel text (deterministic); returns the texts timed."""
    timed: list[str] = []
    real_runner = KernelBench.runner

    def runner(self, sch):
        run = real_runner(self, sch)
        run.text = A.format_kernel(sch.kernel)  # type: ignore[attr-defined]
        return run

    def time(self, run):
        timed.append(run.text)
        return Timing(seconds_of(run.text), (seconds_of(run.text),))

    monkeypatch.setattr(KernelBench, "runner", runner)
    monkeypatch.setattr(KernelBench, "time", time)
    return timed


def test_the_search_climbs_to_a_faster_schedule_and_keeps_it(monkeypatch) -> None:
    def seconds(text):  # interleaving by 4 halves the time; nothing else matters
        return 1.0 if "interleave(4)" in text else 2.0

    _fake_times(monkeypatch, seconds)
    task = _task()
    res = search.tune_kernel(task, OPTS, trials=40)
    assert res.status == "tuned" and res.setting.get("interleave") == 4
    assert res.speedup == pytest.approx(2.0)
    assert res.trials <= 40 and len({c.digest for c in res.candidates}) == len(res.candidates)
    back = replay_checked(res.trace, task.lowered.kernel)
    assert "interleave(4)" in A.format_kernel(back.kernel)


def _likes_interleave_2(kernel) -> float:
    return 0.0 if "interleave(2)" in A.format_kernel(kernel) else 1.0


def test_a_predictor_orders_the_climb(monkeypatch) -> None:
    _fake_times(monkeypatch, lambda text: 1.0 if "interleave(2)" in text else 2.0)
    res = search.tune_kernel(_task(), OPTS, trials=40, predictor=_likes_interleave_2, whole_space=0)
    assert res.candidates[0].setting == {"interleave": 2} and res.status == "tuned"
    assert res.candidates[0].predicted == 0.0


def test_a_predictor_ranks_a_small_space_whole(monkeypatch) -> None:
    """With a predictor and a space small enough, every schedule of it is predicted, the
    best-predicted are measured first, then the climb from the fastest, up to the trials;
    the default and the three fastest are timed again in interleaved rounds."""
    timed = _fake_times(monkeypatch, lambda text: 1.0 if "interleave(2)" in text else 2.0)
    task = _task("rmsnorm")
    whole = space.enumerate_space(task.lowered, task.group, OPTS, 512)
    assert whole is not None and len(whole) > 8
    res = search.tune_kernel(task, OPTS, trials=5, predictor=_likes_interleave_2, whole_space=512)
    rounds = (1 + search.FINALISTS) * 5
    assert res.trials == 5 and len(timed) == 1 + 5 + rounds  # the default, 5, confirm rounds
    seeded = res.candidates[: int(5 * search.SEED_SHARE)]
    assert seeded and all(c.predicted == 0.0 for c in seeded)  # the best-predicted went first
    assert res.status == "tuned" and res.setting.get("interleave") == 2


def test_the_budget_and_a_local_optimum_stop_the_search(monkeypatch) -> None:
    timed = _fake_times(monkeypatch, lambda text: 1.0)
    res = search.tune_kernel(_task(), OPTS, trials=3)
    assert res.trials == 3 and res.status == "default" and not res.setting
    assert len(timed) == 4  # the default, then three candidates
    timed.clear()
    res = search.tune_kernel(_task(), OPTS, trials=1000)
    assert res.status == "default" and res.trials == len(res.candidates) < 40  # ran out


def test_wrong_candidates_are_refused(monkeypatch) -> None:
    real_runner = KernelBench.runner
    calls = []

    def runner(self, sch):
        run = real_runner(self, sch)
        if not calls:  # the first runner is the default's
            calls.append(sch)
            return run

        def wrong():
            outs = run()
            outs[0][0, 0] += 1.0
            return outs

        return wrong

    monkeypatch.setattr(KernelBench, "runner", runner)
    res = search.tune_kernel(_task(), OPTS, trials=3, bench_options=QUICK)
    assert res.status == "default" and len(res.candidates) == 3
    assert all(c.error.startswith("wrong results") for c in res.candidates)


def test_a_winner_not_confirmed_in_interleaved_rounds_is_dropped(monkeypatch) -> None:
    _fake_times(monkeypatch, lambda text: 1.0 if "interleave(2)" in text else 2.0)
    monkeypatch.setattr(KernelBench, "confirm_many", lambda self, runs, rounds=5: [1.0] * len(runs))
    res = search.tune_kernel(_task(), OPTS, trials=40)
    assert res.status == "default" and "not faster in interleaved rounds" in res.notes[-1]


def test_a_real_search_keeps_correct_schedules() -> None:
    res = search.tune_kernel(_task(rows=64), OPTS, trials=4, bench_options=QUICK)
    assert res.status in ("tuned", "default") and res.default_s > 0 and res.best_s > 0
    assert res.trials <= 4 and all(c.error is None for c in res.candidates), res.candidates
    assert measure.TOLERANCES["float32"][0] < 1e-3


# -- the search on a synthetic cost over a real space ---------------------------------


def _column_task() -> search.KernelTask:
    """The sum over axis 0 of ``[64, 1024]``: a real space of a few dozen kernels."""
    g = Graph("column")
    x = g.input("x", ["N", 1024], np.float32)
    g.output(ops.reduce_sum(x, axes=[0], keepdims=0), names=["y"])
    gg, plan = prepare(g)
    (group,) = plan.groups
    lk = lower_group(group, gg, "column")
    arr = np.random.default_rng(0).standard_normal((64, 1024)).astype(np.float32)
    env = {str(k): int(v) for k, v in bind_inputs(gg, {"x": arr}).items()}
    return search.KernelTask(
        "column", kernel_key(lk.kernel), canonical_lowered(lk), group, [arr], env
    )


class _Synthetic:
    """A measurer whose seconds are a known function of each kernel's setting: nothing
    compiled, no clock. ``cost(setting)``; ``by_digest``: the whole space's kernels."""

    def __init__(self, by_digest, cost, width):
        self.by_digest, self.cost, self.width = by_digest, cost, width
        self.measured: list[dict] = []

    def _seconds(self, sch) -> float:
        return self.cost(self.by_digest[measure.schedule_digest(sch)])

    def start(self, default) -> float:
        return self._seconds(default)

    def measure(self, schedules):
        assert len(schedules) <= self.width
        self.measured += [self.by_digest[measure.schedule_digest(s)] for s in schedules]
        return [measure.Measured(self._seconds(s), None) for s in schedules]

    def confirm(self, schedules, rounds=5):
        return [self._seconds(s) for s in schedules]


@pytest.mark.parametrize(("width", "distortion"), [(1, 0.6), (1, 3.0), (3, 3.0)])
def test_the_model_guided_search_finds_a_known_optimum_within_a_fifth_of_the_space(
    width, distortion
):
    """Seconds: 1 at a hidden target setting, plus a weighted distance per knob from it
    (knob values by position); the predictor sees that cost multiplied by a fixed
    factor per kernel, from 1 to ``1 + distortion`` (a model that ranks well, or one
    that ranks poorly: then the target is not among the best-predicted and the climb
    finds it). With 20% of the space as trials, measured ``width`` at a time (as on a
    Ray cluster), the search must measure at most that many and keep exactly the
    target."""
    task = _column_task()
    whole = space.enumerate_space(task.lowered, task.group, OPTS, 10**4)
    assert whole is not None and 50 <= len(whole) <= 150
    by_digest = {measure.schedule_digest(sch): st for st, sch in whole}
    target = {"column_partials": 4, "column_tile": 64, "interleave": 2}
    assert target in by_digest.values()
    weights = {k.name: 0.05 * (i + 1) for i, k in enumerate(space.KNOBS)}

    def cost(setting: dict) -> float:
        total = 1.0
        for k in space.KNOBS:
            a = k.values.index(setting.get(k.name, k.default))
            b = k.values.index(target.get(k.name, k.default))
            total += weights[k.name] * abs(a - b)
        return total

    def predictor(kernel) -> float:
        digest = hashlib.sha256(A.format_kernel(kernel).encode()).hexdigest()
        noise = int(digest[:8], 16) / 16**8  # fixed per kernel, in [0, 1)
        return cost(by_digest[digest]) * (1 + distortion * noise)

    budget = int(0.2 * len(whole))
    fake = _Synthetic(by_digest, cost, width)
    res = search.tune_kernel(task, OPTS, budget, predictor, whole_space=10**4, measurer=fake)
    assert res.trials <= budget and len(fake.measured) == res.trials == len(res.candidates)
    assert len({repr(sorted(s.items())) for s in fake.measured}) == len(fake.measured)
    assert res.status == "tuned" and res.setting == target, (res.setting, fake.measured)
    assert res.best_s == pytest.approx(1.0) and res.default_s == pytest.approx(cost({}))
    seeds = fake.measured[: int(budget * search.SEED_SHARE)]
    assert (target in seeds) == (distortion < 1), seeds  # else the climb found it
