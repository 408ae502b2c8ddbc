"""A kernel bench: scheduled candidates of one kernel compiled, run on fixed arguments,
checked against the default schedule's outputs and timed.

Times come from :func:`geode.costmodel.profiling.measure` (warm-up calls, batches long
enough for the timer, several samples, the garbage collector paused); the bench takes
their min (``statistic="min"``, the default: on a shared machine other work only
slows a run down, so the fastest sample is the kernel's own time) or their median.
Every candidate runs with the thread count the compile options give
(``num_threads``; 0: the native pool's size), the one the tuned kernel will run with.
:meth:`KernelBench.confirm` times two candidates in interleaved rounds, so a change of
the machine's load during the search cannot make the chosen one look faster.

A :class:`Measurer` is where a search's candidates are measured: :class:`LocalMeasurer`
in this process (a :class:`KernelBench`), or a Ray cluster's workers
(:mod:`geode.codegen.tuning.ray_runner`). The search hands it schedules and gets back
seconds or why a candidate failed.
"""

from __future__ import annotations

import hashlib
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np

from geode.codegen import ast as A
from geode.codegen.driver import emit_kernel, native_interface
from geode.codegen.lower import LoweredKernel
from geode.codegen.schedule import Schedule
from geode.config import Options
from geode.costmodel.profiling import measure
from geode.errors import GeodeError, TuningError
from geode.runtime.engines import AiCoreEngine

#: how a measurement's samples become its seconds
STATISTICS: dict[str, Callable[[Sequence[float]], float]] = {
    "min": lambda xs: float(min(xs)),
    "median": lambda xs: float(statistics.median(xs)),
}

#: relative and absolute tolerances (the absolute one scaled by the output's largest
#: magnitude) within which a candidate's outputs must match the default's: schedules
#: may reassociate reductions (see geode.config.ACCURACY_POLICY), nothing else
TOLERANCES: dict[str, tuple[float, float]] = {
    "float16": (2e-2, 2e-3),
    "bfloat16": (5e-2, 1e-2),
    "float32": (2e-4, 2e-6),
    "float64": (1e-9, 1e-12),
}


@dataclass(frozen=True)
class Timing:
    """Seconds per call of a candidate (the bench's statistic of the samples: their
    min or median) and the samples."""

    seconds: float
    samples: tuple[float, ...]


class KernelBench:
    """Candidates of one lowered kernel (``lowered``, in the form their schedules were
    made on), run on ``inputs`` (one array per kernel input) with the dims of ``env``
    (symbol name -> size). ``statistic``: ``min`` (default) or ``median`` of a
    measurement's samples."""

    def __init__(
        self,
        name: str,
        lowered: LoweredKernel,
        inputs: Sequence[np.ndarray],
        env: Mapping[str, int],
        opts: Options,
        repeat: int = 7,
        min_time: float = 2e-3,
        max_time: float = 1.0,
        statistic: str = "min",
    ):
        if statistic not in STATISTICS:
            raise TuningError(f"statistic={statistic!r}: expected one of {sorted(STATISTICS)}")
        self.statistic = statistic
        self.name, self.lowered, self.opts = name, lowered, opts
        self.inputs = [np.ascontiguousarray(a) for a in inputs]
        self.env = dict(env)
        self.repeat, self.min_time, self.max_time = repeat, min_time, max_time

    def runner(self, sch: Schedule) -> Callable[[], list[np.ndarray]]:
        """Compile ``sch``'s kernel: a call runs it once on the bench's arguments into
        the same output arrays and returns them."""
        native = emit_kernel(sch.kernel, self.opts)
        iface = native_interface(self.name, self.lowered, sch.kernel, native, self.opts)
        step = AiCoreEngine().bind(self.name, iface)
        outs = [
            np.empty(tuple(shape(self.env)), dtype)
            for shape, dtype in zip(iface.out_shapes, iface.out_dtypes)
        ]
        inputs, env = self.inputs, self.env

        def run() -> list[np.ndarray]:
            return step(inputs, outs, env)

        return run

    def time(self, run: Callable[[], object]) -> Timing:
        """Seconds per call of ``run``: the bench's statistic (min or median) of its
        samples, after two warm-up calls."""
        t = measure(
            run, repeat=self.repeat, min_time=self.min_time, max_time=self.max_time, warmup=2
        )
        return Timing(STATISTICS[self.statistic](t.samples), t.samples)

    def confirm(
        self, a: Callable[[], object], b: Callable[[], object], rounds: int = 5
    ) -> tuple[float, float]:
        """Median seconds per call of ``a`` and ``b``, timed in ``rounds`` interleaved
        rounds."""
        ta, tb = self.confirm_many([a, b], rounds, statistics.median)
        return ta, tb

    def confirm_many(
        self,
        runs: Sequence[Callable[[], object]],
        rounds: int = 5,
        reduce: Callable[[list[float]], float] = min,
    ) -> list[float]:
        """Seconds per call of each of ``runs``, timed one after another in ``rounds``
        interleaved rounds, each round starting one further along (no run always goes
        first): ``reduce`` (default the min: a busy machine only slows a run down) of
        each one's round times."""
        times: list[list[float]] = [[] for _ in runs]
        n = len(runs)
        for r in range(rounds):
            for k in range(n):
                i = (r + k) % n
                times[i].append(self.time(runs[i]).seconds)
        return [float(reduce(t)) for t in times]


def schedule_digest(sch: Schedule) -> str:
    """A scheduled kernel's identity: the hash of its text (two settings that make the
    same kernel have the same digest)."""
    return hashlib.sha256(A.format_kernel(sch.kernel).encode()).hexdigest()


class Measured(NamedTuple):
    """What measuring one candidate gave: its seconds, or why it failed."""

    seconds: float | None
    error: str | None


class Measurer(Protocol):
    """Where a search's candidates are compiled, checked against the default's outputs
    and timed. ``width``: how many candidates it measures at once (the search hands it
    batches of that many)."""

    width: int

    def start(self, default: Schedule) -> float:
        """Measure the default schedule (its outputs the reference of every later
        check); its seconds. Raises GeodeError when it cannot be measured."""
        ...

    def measure(self, schedules: Sequence[Schedule]) -> list[Measured]:
        """Measure ``schedules`` (one result each, in order; a failure is a result)."""
        ...

    def confirm(self, schedules: Sequence[Schedule], rounds: int = 5) -> list[float]:
        """Seconds of each of ``schedules`` timed in ``rounds`` interleaved rounds under
        the same conditions (the min of the rounds)."""
        ...


class LocalMeasurer:
    """Candidates measured in this process on ``bench``, one at a time."""

    width = 1

    def __init__(self, bench: KernelBench):
        self.bench = bench
        self.want: list[np.ndarray] = []
        self.runners: dict[str, Callable[[], list[np.ndarray]]] = {}

    def start(self, default: Schedule) -> float:
        """Compile and time the default; its outputs become the reference."""
        run = self.bench.runner(default)
        self.want = [o.copy() for o in run()]
        self.runners[schedule_digest(default)] = run
        return self.bench.time(run).seconds

    def measure(self, schedules: Sequence[Schedule]) -> list[Measured]:
        """Compile, check and time each schedule in turn."""
        return [self._one(sch) for sch in schedules]

    def _one(self, sch: Schedule) -> Measured:
        try:
            run = self.bench.runner(sch)
            wrong = mismatch(run(), self.want)
            if wrong is not None:
                return Measured(None, f"wrong results: {wrong}")
            return Measured(self.bench.time(run).seconds, None)
        except GeodeError as exc:
            return Measured(None, f"{type(exc).__name__}: {exc}")

    def confirm(self, schedules: Sequence[Schedule], rounds: int = 5) -> list[float]:
        """Time ``schedules`` in interleaved rounds (compiled again unless kept: only
        the default's runner is kept, a candidate's output arrays are freed with it)."""
        runs = []
        for sch in schedules:
            run = self.runners.get(schedule_digest(sch))
            runs.append(run if run is not None else self.bench.runner(sch))
        return self.bench.confirm_many(runs, rounds)


def mismatch(got: Sequence[np.ndarray], want: Sequence[np.ndarray]) -> str | None:
    """Why ``got`` differs from ``want`` beyond the tolerances, or None when it does not."""
    for i, (g, w) in enumerate(zip(got, want)):
        if g.shape != w.shape or g.dtype != w.dtype:
            return f"output {i}: {g.dtype}{list(g.shape)}, expected {w.dtype}{list(w.shape)}"
        if w.dtype.kind not in "fc":
            if not np.array_equal(g, w):
                return f"output {i}: {int(np.sum(g != w))} elements differ"
            continue
        rtol, atol = TOLERANCES.get(str(w.dtype), TOLERANCES["float32"])
        finite = np.isfinite(w)
        scale = float(np.max(np.abs(w[finite]), initial=0.0))
        close = np.isclose(g, w, rtol=rtol, atol=atol * max(1.0, scale), equal_nan=True)
        if not close.all():
            bad = int(np.argmax(~close.ravel()))
            return (
                f"output {i}: {int(np.sum(~close))} elements differ, e.g. at flat index {bad}: "
                f"{g.ravel()[bad]!r} instead of {w.ravel()[bad]!r}"
            )
    return None
