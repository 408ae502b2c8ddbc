"""The search over one kernel's schedule space, from its default schedule.

Hill climbing with first improvement: the candidates are the settings one knob away from the best so
far (:func:`~geode.codegen.tuning.space.neighbours`); each is built,
and one whose kernel is the same as a candidate's already measured (a knob that does
not touch this kernel) is dropped without costing a trial. With a predictor the
candidates are measured best-predicted first, else in knob order. A candidate whose
outputs differ from the default's beyond the tolerances
(:func:`~geode.codegen.tuning.measure.mismatch`) is refused; one faster than the best by
more than ``min_gain`` becomes the best and the search moves there. It stops when
``trials`` candidates have been measured or no neighbour of the best is faster. The best
is then timed against the default in interleaved rounds and kept only if still faster by
``min_gain``.

With a predictor that ranks schedules well and a space small enough to build whole
(``whole_space``: the product of the knobs that change this kernel,
:func:`~geode.codegen.tuning.space.enumerate_space`), every schedule of it is predicted
instead and measured best-predicted first until ``trials`` are spent (PAI's way: the
model proposes, profiling decides).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from geode.codegen import ast as A
from geode.codegen.lower import LoweredKernel
from geode.codegen.schedule import Schedule, Trace
from geode.codegen.tuning import space
from geode.codegen.tuning.measure import KernelBench, mismatch
from geode.codegen.tuning.predict import Predictor, predict
from geode.compiler.fusion.groups import Group
from geode.compiler.shapes import compile_dim_fn
from geode.config import Options
from geode.errors import GeodeError, ScheduleError


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


def _digest(sch: Schedule) -> str:
    return hashlib.sha256(A.format_kernel(sch.kernel).encode()).hexdigest()


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
) -> TuneResult:
    """Search ``task``'s schedule space with at most ``trials`` measured candidates
    (see the module docstring); ``on_trial`` is called after each measurement. With a
    predictor and a space of at most ``whole_space`` settings (default 0: never), the
    whole space is built and measured best-predicted first instead of climbing: for a
    predictor that ranks schedules well (a fitted model), not the SOL model, which sees
    no difference between most of them. ``knobs``: the knobs searched
    (default all; the others stay at their defaults)."""
    bench = KernelBench(
        task.name, task.lowered, task.inputs, task.env, opts, **(bench_options or {})
    )
    result = TuneResult(task.name, task.key, "failed")
    default = _candidate(task, opts, {})
    try:
        run_default = bench.runner(default.schedule)
        want = [o.copy() for o in run_default()]
        default.seconds = bench.time(run_default).seconds
    except GeodeError as exc:
        result.notes.append(f"the default schedule could not be measured: {exc}")
        return result
    state = _Search(bench, want, result, trials, min_gain, on_trial, default, run_default)
    whole = None
    if predictor is not None:
        whole = space.enumerate_space(task.lowered, task.group, opts, whole_space, knobs)
    if whole is not None:
        pool = [Candidate(st, sch, _digest(sch)) for st, sch in whole]
        state.ranked(_rank([c for c in pool if c.digest != default.digest], task, predictor))
    else:
        state.climb(task, opts, predictor, knobs)
    best = state.best
    result.default_s = result.best_s = default.seconds
    result.status, result.trace = "default", default.schedule.trace
    if best is not default:
        t_default, t_best = bench.confirm(run_default, state.runners[best.digest])
        result.default_s = t_default
        if t_best < t_default * (1 - min_gain):
            result.status, result.best_s = "tuned", t_best
            result.setting, result.trace = best.setting, best.schedule.trace
        else:
            result.best_s = t_default
            result.notes.append(
                f"best candidate {best.setting} not faster in interleaved rounds "
                f"({t_best * 1e6:.1f} us against {t_default * 1e6:.1f} us)"
            )
    return result


@dataclass
class _Search:
    """The state of one search: the best so far and the trials spent."""

    bench: KernelBench
    want: list[np.ndarray]
    result: TuneResult
    trials: int
    min_gain: float
    on_trial: Callable[[Candidate], None] | None
    best: Candidate
    run_best: Callable[[], list[np.ndarray]]
    runners: dict[str, Callable[[], list[np.ndarray]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.runners[self.best.digest] = self.run_best

    def try_one(self, cand: Candidate) -> bool:
        """Measure ``cand``; whether it became the best."""
        self.result.trials += 1
        run = _measure(self.bench, cand, self.want)
        self.result.candidates.append(cand)
        if self.on_trial is not None:
            self.on_trial(cand)
        if run is None or cand.seconds >= self.best.seconds * (1 - self.min_gain):  # type: ignore[operator]
            return False
        self.best = cand
        self.runners[cand.digest] = run
        return True

    def ranked(self, pool: list[Candidate]) -> None:
        """Measure ``pool`` in order until the trials are spent."""
        for cand in pool[: self.trials]:
            self.try_one(cand)

    def climb(
        self,
        task: KernelTask,
        opts: Options,
        predictor: Predictor | None,
        knobs: Sequence[str] | None,
    ) -> None:
        """Hill climbing with first improvement from the best (the default)."""
        measured = {self.best.digest}
        while self.result.trials < self.trials:
            pool = _pool(task, opts, self.best.setting, measured, self.result.notes, knobs)
            improved = False
            for cand in _rank(pool, task, predictor):
                if self.result.trials >= self.trials:
                    break
                measured.add(cand.digest)
                if self.try_one(cand):
                    improved = True
                    break
            if not improved:
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
    return Candidate(setting, sch, _digest(sch))


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


def _measure(
    bench: KernelBench, cand: Candidate, want: list[np.ndarray]
) -> Callable[[], list[np.ndarray]] | None:
    """Compile, check and time ``cand`` (its ``seconds`` or ``error`` set); its runner
    when it is correct."""
    try:
        run = bench.runner(cand.schedule)
        wrong = mismatch(run(), want)
        if wrong is not None:
            cand.error = f"wrong results: {wrong}"
            return None
        cand.seconds = bench.time(run).seconds
    except GeodeError as exc:
        cand.error = f"{type(exc).__name__}: {exc}"
        return None
    return run
