"""The search over one kernel's schedule space, from its default schedule.

Hill climbing with first improvement: the candidates are the settings one knob away
from the best so far (:func:`~geode.codegen.tuning.space.neighbours`); each is built,
and one whose kernel is the same as a candidate's already measured (a knob that does
not touch this kernel) is dropped without costing a trial. With a predictor the
candidates are measured best-predicted first, else in knob order, in batches of the
measurer's width (one in this process; a Ray cluster's workers measure several at
once). A candidate whose outputs differ from the default's beyond the tolerances
(:func:`~geode.codegen.tuning.measure.mismatch`) is refused; when the fastest of a
batch beats the best by more than ``min_gain`` it becomes the best and the search moves
there. It stops when ``trials`` candidates have been measured or no neighbour of the
best is faster. Then the default and the :data:`FINALISTS` fastest candidates are timed
again in interleaved rounds (the min of the rounds: load only slows a run down), and the
fastest is kept if it beats the default by ``min_gain``: one candidate measured fast by
luck cannot win alone.

With a predictor and a space small enough to build whole (``whole_space``: the product
of the knobs that change this kernel,
:func:`~geode.codegen.tuning.space.enumerate_space`), every schedule of it is
predicted; the best-predicted :data:`SEED_SHARE` of the trials are measured first, then
the climb starts from the fastest of them (the model proposes, profiling decides, and
the climb corrects what the model misjudged nearby). When the climb stops with trials
left, half of them go to the next best-predicted schedules not measured yet, and the
climb starts again from one of them that is faster than the best, until the trials are
spent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from geode.codegen.lower import LoweredKernel
from geode.codegen.schedule import Schedule, Trace
from geode.codegen.tuning import space
from geode.codegen.tuning.measure import KernelBench, LocalMeasurer, Measurer, schedule_digest
from geode.codegen.tuning.predict import Predictor, predict
from geode.compiler.fusion.groups import Group
from geode.compiler.shapes import compile_dim_fn
from geode.config import Options
from geode.errors import GeodeError, ScheduleError

#: of the trials, the share a whole-space search spends on the best-predicted schedules
#: before it climbs from the fastest of them
SEED_SHARE = 0.5

#: the fastest candidates timed again against the default, in interleaved rounds
FINALISTS = 3


@dataclass
class KernelTask:
    """One kernel to tune: its name and key, its lowered form (canonical: the tuned
    trace is recorded on it), its group, the arrays of its inputs and the symbol sizes
    of the run (symbol name -> size)."""

    name: str
    key: str
    lowered: LoweredKernel
    group: Group
    inputs: list[np.ndarray]
    env: dict[str, int]

    @property
    def dims(self) -> dict[str, int]:
        """The kernel's dim arguments' values."""
        return {n: int(compile_dim_fn(d)(self.env)) for n, d in self.lowered.dim_exprs.items()}


@dataclass
class Candidate:
    """A setting, its schedule, and what measuring it gave."""

    setting: space.Setting
    schedule: Schedule
    digest: str
    predicted: float | None = None
    seconds: float | None = None
    error: str | None = None


@dataclass
class TuneResult:
    """What tuning one kernel found: ``status`` is ``tuned`` (``trace`` beat the default
    by ``default_s / best_s``), ``default`` (nothing did) or ``failed`` (the default
    itself could not be measured: ``notes`` say why)."""

    name: str
    key: str
    status: str
    default_s: float = 0.0
    best_s: float = 0.0
    trials: int = 0
    setting: space.Setting = field(default_factory=dict)
    trace: Trace = field(default_factory=Trace)
    candidates: list[Candidate] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def speedup(self) -> float:
        """Default time over the kept schedule's time."""
        return self.default_s / self.best_s if self.best_s > 0 else 1.0


def tune_kernel(
    task: KernelTask,
    opts: Options,
    trials: int,
    predictor: Predictor | None = None,
    min_gain: float = 0.03,
    bench_options: dict[str, Any] | None = None,
    on_trial: Callable[[Candidate], None] | None = None,
    whole_space: int = 0,
    knobs: Sequence[str] | None = None,
    measurer: Measurer | None = None,
) -> TuneResult:
    """Search ``task``'s schedule space with at most ``trials`` measured candidates
    (see the module docstring); ``on_trial`` is called after each measurement. With a
    predictor and a space of at most ``whole_space`` settings (default 0: never), the
    whole space is built and ranked, the best-predicted measured first, then the climb
    goes on from the fastest of them. ``knobs``: the knobs searched (default all; the
    others stay at their defaults). ``measurer``: where candidates are measured
    (default: this process, a :class:`~geode.codegen.tuning.measure.KernelBench` with
    ``bench_options``; a Ray cluster's workers:
    :mod:`geode.codegen.tuning.ray_runner`)."""
    if measurer is None:
        bench = KernelBench(
            task.name, task.lowered, task.inputs, task.env, opts, **(bench_options or {})
        )
        measurer = LocalMeasurer(bench)
    result = TuneResult(task.name, task.key, "failed")
    default = _candidate(task, opts, {})
    try:
        default.seconds = measurer.start(default.schedule)
    except GeodeError as exc:
        result.notes.append(f"the default schedule could not be measured: {exc}")
        return result
    state = _Search(measurer, result, trials, min_gain, on_trial, default)
    whole = None
    if predictor is not None:
        whole = space.enumerate_space(task.lowered, task.group, opts, whole_space, knobs)
    if whole is None:
        state.climb(task, opts, predictor, knobs)
    else:
        pool = [Candidate(st, sch, schedule_digest(sch)) for st, sch in whole]
        ranked = _rank([c for c in pool if c.digest != default.digest], task, predictor)
        state.seed(ranked, max(1, int(trials * SEED_SHARE)))
        state.climb(task, opts, predictor, knobs)
        while state.left > 0:
            spent = result.trials
            if state.seed(ranked, max(1, state.left // 2)):
                state.climb(task, opts, predictor, knobs)  # from a better one the model found
            elif result.trials == spent:
                break  # every schedule of the space measured
    _decide(state, default, min_gain)
    return result


def _decide(state: _Search, default: Candidate, min_gain: float) -> None:
    """Time the default and the fastest candidates measured (:data:`FINALISTS`) in
    interleaved rounds; the fastest of them is kept when it beats the default by
    ``min_gain``."""
    result = state.result
    result.default_s = result.best_s = default.seconds  # type: ignore[assignment]
    result.status, result.trace = "default", default.schedule.trace
    timed = sorted(
        (c for c in result.candidates if c.seconds is not None and c.digest != default.digest),
        key=lambda c: c.seconds,  # type: ignore[arg-type,return-value]
    )[:FINALISTS]
    if not timed or timed[0].seconds >= default.seconds * (1 - min_gain):  # type: ignore[operator]
        return
    times = state.measurer.confirm([default.schedule] + [c.schedule for c in timed])
    t_default, rest = times[0], times[1:]
    i = min(range(len(rest)), key=rest.__getitem__)
    result.default_s = t_default
    if rest[i] < t_default * (1 - min_gain):
        best = timed[i]
        result.status, result.best_s = "tuned", rest[i]
        result.setting, result.trace = best.setting, best.schedule.trace
    else:
        result.best_s = t_default
        result.notes.append(
            f"best candidate {timed[i].setting} not faster in interleaved rounds "
            f"({rest[i] * 1e6:.1f} us against {t_default * 1e6:.1f} us)"
        )


@dataclass
class _Search:
    """The state of one search: the best so far, the kernels measured and the trials
    spent."""

    measurer: Measurer
    result: TuneResult
    trials: int
    min_gain: float
    on_trial: Callable[[Candidate], None] | None
    best: Candidate
    measured: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.measured.add(self.best.digest)

    @property
    def left(self) -> int:
        """Trials not spent yet."""
        return self.trials - self.result.trials

    def try_batch(self, batch: list[Candidate]) -> bool:
        """Measure ``batch`` (at once, on the measurer); whether its fastest became the
        best (faster than the best by more than ``min_gain``)."""
        self.result.trials += len(batch)
        self.measured.update(c.digest for c in batch)
        for cand, got in zip(batch, self.measurer.measure([c.schedule for c in batch])):
            cand.seconds, cand.error = got.seconds, got.error
            self.result.candidates.append(cand)
            if self.on_trial is not None:
                self.on_trial(cand)
        timed = [c for c in batch if c.seconds is not None]
        if not timed:
            return False
        fastest = min(timed, key=lambda c: c.seconds)  # type: ignore[arg-type,return-value]
        if fastest.seconds >= self.best.seconds * (1 - self.min_gain):  # type: ignore[operator]
            return False
        self.best = fastest
        return True

    def run(self, pool: list[Candidate]) -> bool:
        """Measure ``pool`` in order, a batch of the measurer's width at a time, until
        a batch improves on the best or the trials are spent; whether one did."""
        pool = [c for c in pool if c.digest not in self.measured]
        width = max(1, int(self.measurer.width))
        while pool and self.left > 0:
            batch, pool = pool[: min(width, self.left)], pool[min(width, self.left) :]
            if self.try_batch(batch):
                return True
        return False

    def seed(self, ranked: list[Candidate], n: int) -> bool:
        """Measure the next ``n`` best-predicted of ``ranked`` (the whole space,
        best-predicted first) not measured yet; whether the best improved (the climb
        then starts again from it). False when none is left."""
        pool = [c for c in ranked if c.digest not in self.measured][:n]
        width = max(1, int(self.measurer.width))
        improved = False
        while pool and self.left > 0:
            batch, pool = pool[: min(width, self.left)], pool[min(width, self.left) :]
            improved |= self.try_batch(batch)
        return improved

    def climb(
        self,
        task: KernelTask,
        opts: Options,
        predictor: Predictor | None,
        knobs: Sequence[str] | None,
    ) -> None:
        """Hill climbing with first improvement (per batch) from the best so far."""
        while self.left > 0:
            pool = _pool(task, opts, self.best.setting, self.measured, self.result.notes, knobs)
            if not self.run(_rank(pool, task, predictor)):
                return


def _rank(pool: list[Candidate], task: KernelTask, predictor: Predictor | None) -> list[Candidate]:
    """``pool`` best-predicted first (as it is without a predictor)."""
    if predictor is None:
        return pool
    dims = task.dims
    for cand in pool:
        cand.predicted = predict(predictor, cand.schedule.kernel, dims)
    return sorted(pool, key=lambda c: c.predicted)  # type: ignore[arg-type,return-value]


def _candidate(task: KernelTask, opts: Options, setting: space.Setting) -> Candidate:
    sch = space.build(task.lowered, task.group, opts, setting)
    return Candidate(setting, sch, schedule_digest(sch))


def _pool(
    task: KernelTask,
    opts: Options,
    setting: space.Setting,
    measured: set[str],
    notes: list[str],
    knobs: Sequence[str] | None = None,
) -> list[Candidate]:
    """The neighbours of ``setting`` whose kernels are new."""
    pool: list[Candidate] = []
    digests = set(measured)
    for s in space.neighbours(setting, knobs):
        try:
            cand = _candidate(task, opts, s)
        except ScheduleError as exc:
            notes.append(f"{s}: {exc}")
            continue
        if cand.digest in digests:
            continue
        digests.add(cand.digest)
        pool.append(cand)
    return pool
