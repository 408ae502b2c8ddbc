"""Profiling cost model: run the real kernel and time it; ground truth for the others.

The most expensive and most accurate of PAI's three levels. :func:`measure` times
any callable (warm-up first, so JIT compilation is not counted; calls batched so
each sample is well above the timer's resolution; the garbage collector paused;
total time bounded). :func:`measure_interleaved` times several callables in
interleaved rounds, each round in a new random order, so a change of load on a
shared machine falls on all of them alike; the median round is the measurement.
:class:`Sample` pairs a measured time with the inputs the cheaper models take,
:func:`compare` reports how far each model is from the measurements, and
:func:`fit_projected` calibrates the projected model on them.
"""

from __future__ import annotations

import gc
import math
import random
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import projected, sol
from .device import DeviceSpec
from .projected import ProjectedModel, ScheduleFeatures
from .sol import KernelWork


@dataclass(frozen=True)
class Timing:
    """Per-call times of a measured callable, in seconds.

    ``samples`` holds one per-call time per batch of ``number`` calls; ``min``,
    ``median`` and ``mean`` summarize them. ``median`` is what the profiling model
    reports as ground truth (``min`` is the least disturbed by other load, but on a
    shared machine the typical call is what a model should predict).
    """

    min: float
    median: float
    mean: float
    samples: tuple[float, ...]
    number: int = 1

    @property
    def stdev(self) -> float:
        """Sample standard deviation (0 with a single sample)."""
        return statistics.stdev(self.samples) if len(self.samples) > 1 else 0.0

    def __str__(self) -> str:
        f = sol.format_time
        return (
            f"min {f(self.min)}, median {f(self.median)}, mean {f(self.mean)} "
            f"({len(self.samples)} x {self.number} calls)"
        )


def measure(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    repeat: int = 7,
    min_time: float = 2e-4,
    max_time: float = 1.0,
    warmup: int = 1,
) -> Timing:
    """Time ``fn(*args, **kwargs)``: ``repeat`` samples of batched calls.

    After ``warmup`` untimed calls, the batch size ``number`` grows until one batch
    takes at least ``min_time`` seconds; then up to ``repeat`` batches are timed
    with ``perf_counter_ns``, stopping early (after at least one) once ``max_time``
    seconds of timing have passed. Each sample is a batch's time divided by
    ``number``. The garbage collector is paused while timing.
    """
    if repeat < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat}")
    if min_time < 0 or max_time <= 0:
        raise ValueError(f"need min_time >= 0 and max_time > 0, got {min_time}, {max_time}")
    kw = dict(kwargs or {})
    for _ in range(max(0, warmup)):
        fn(*args, **kw)

    def batch(number: int) -> float:
        t0 = time.perf_counter_ns()
        for _ in range(number):
            fn(*args, **kw)
        return (time.perf_counter_ns() - t0) * 1e-9

    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter()
        deadline = start + max_time
        number = 1
        t = batch(number)
        # Autorange: grow the batch until it is long enough to time reliably.
        while t < min_time and time.perf_counter() < deadline:
            grow = 10 if t <= 0 else min(10.0, max(2.0, 1.2 * min_time / t))
            number = max(number + 1, int(number * grow))
            t = batch(number)
        samples = [t / number]
        while len(samples) < repeat and time.perf_counter() < deadline:
            samples.append(batch(number) / number)
    finally:
        if gc_was_enabled:
            gc.enable()
    return Timing(
        min=min(samples),
        median=statistics.median(samples),
        mean=statistics.fmean(samples),
        samples=tuple(samples),
        number=number,
    )


def _autorange(fn: Callable[[], Any], min_time: float, deadline: float) -> tuple[int, float]:
    """The batch size that makes ``number`` calls of ``fn`` last ``min_time``, and the
    per-call time of the last batch tried."""
    number = 1
    while True:
        t0 = time.perf_counter_ns()
        for _ in range(number):
            fn()
        t = (time.perf_counter_ns() - t0) * 1e-9
        if t >= min_time or time.perf_counter() >= deadline:
            return number, t / number
        grow = 10 if t <= 0 else min(10.0, max(2.0, 1.2 * min_time / t))
        number = max(number + 1, int(number * grow))


def measure_interleaved(
    fns: Mapping[str, Callable[[], Any]],
    *,
    rounds: int = 7,
    warmup: int = 2,
    min_time: float = 2e-4,
    max_time: float = 5.0,
    seed: int = 0,
) -> dict[str, Timing]:
    """Time each of ``fns`` (callables of no argument) in interleaved rounds.

    Every callable is first called ``warmup`` times and its batch size grown until a
    batch lasts ``min_time`` seconds; then each round times one batch of every
    callable, in an order shuffled per round (seeded by ``seed``), so drifts in the
    machine's load spread evenly. Rounds stop at ``rounds``, or once ``max_time``
    seconds have passed after at least three. The garbage collector is paused.
    Returns a :class:`Timing` per name (its ``median`` is the measurement).
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    if min_time < 0 or max_time <= 0:
        raise ValueError(f"need min_time >= 0 and max_time > 0, got {min_time}, {max_time}")
    names = list(fns)
    if not names:
        return {}
    rng = random.Random(seed)
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        deadline = time.perf_counter() + max_time
        numbers: dict[str, int] = {}
        for name in names:
            for _ in range(max(0, warmup)):
                fns[name]()
            numbers[name], _ = _autorange(fns[name], min_time, deadline)
        samples: dict[str, list[float]] = {n: [] for n in names}
        for r in range(rounds):
            order = names[:]
            rng.shuffle(order)
            for name in order:
                fn, number = fns[name], numbers[name]
                t0 = time.perf_counter_ns()
                for _ in range(number):
                    fn()
                samples[name].append((time.perf_counter_ns() - t0) * 1e-9 / number)
            if r + 1 >= min(3, rounds) and time.perf_counter() > deadline:
                break
    finally:
        if gc_was_enabled:
            gc.enable()
    return {
        n: Timing(
            min=min(s),
            median=statistics.median(s),
            mean=statistics.fmean(s),
            samples=tuple(s),
            number=numbers[n],
        )
        for n, s in samples.items()
    }


@dataclass(frozen=True)
class Sample:
    """One measured kernel: its name, measured seconds and the models' inputs.

    ``work`` feeds the SOL model, ``features`` the projected model; either may be
    missing, and a model that cannot use a sample skips it.
    """

    name: str
    measured_s: float
    work: KernelWork | None = None
    features: ScheduleFeatures | Mapping[str, Any] | None = None
    timing: Timing | None = field(default=None, compare=False)


def profile(
    name: str,
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    *,
    work: KernelWork | None = None,
    features: ScheduleFeatures | Mapping[str, Any] | None = None,
    **measure_options: Any,
) -> Sample:
    """Measure ``fn(*args)`` and pair its median time with the models' inputs."""
    timing = measure(fn, args, **measure_options)
    return Sample(name, timing.median, work=work, features=features, timing=timing)


#: A model, as :func:`compare` sees it: seconds for a sample, or None to skip it.
Predictor = Callable[[Sample], float | None]


def sol_predictor(spec: DeviceSpec) -> Predictor:
    """The SOL model as a predictor (skips samples without ``work``)."""

    def predict(s: Sample) -> float | None:
        return None if s.work is None else sol.estimate(s.work, spec)

    return predict


def projected_predictor(spec: DeviceSpec, model: ProjectedModel | None = None) -> Predictor:
    """The projected model as a predictor (skips samples without ``features``)."""

    def predict(s: Sample) -> float | None:
        return None if s.features is None else projected.predict(s.features, spec, model)

    return predict


@dataclass(frozen=True)
class ModelError:
    """How far one model's predictions are from the measurements (relative errors).

    ``relative_errors`` is ``|predicted - measured| / measured`` per sample used;
    ``log2_bias`` the mean of ``log2(predicted / measured)`` (positive: the model
    predicts too slow).
    """

    name: str
    n: int
    mean_rel_error: float
    median_rel_error: float
    max_rel_error: float
    log2_bias: float
    relative_errors: tuple[float, ...] = ()


@dataclass(frozen=True)
class Comparison:
    """The errors of every compared model, and a text table of them."""

    errors: Mapping[str, ModelError]

    @property
    def mean_rel_error(self) -> dict[str, float]:
        """Model name -> mean relative error."""
        return {k: e.mean_rel_error for k, e in self.errors.items()}

    def best(self) -> str:
        """The name of the model with the lowest mean relative error."""
        scored = [(e.mean_rel_error, k) for k, e in self.errors.items() if e.n]
        if not scored:
            raise ValueError("no model predicted any sample")
        return min(scored)[1]

    def table(self) -> str:
        """One line per model: samples used, mean / median / max error and bias."""
        lines = [f"{'model':<16} {'n':>4} {'mean':>8} {'median':>8} {'max':>8} {'log2 bias':>10}"]
        for k, e in self.errors.items():
            lines.append(
                f"{k:<16} {e.n:>4} {e.mean_rel_error:>8.1%} {e.median_rel_error:>8.1%} "
                f"{e.max_rel_error:>8.1%} {e.log2_bias:>+10.2f}"
            )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def compare(models: Mapping[str, Predictor], samples: Sequence[Sample]) -> Comparison:
    """Mean (and median, max) relative error of each model over the samples.

    A model returning None for a sample skips it; ``n`` counts the samples used.
    """
    errors = {}
    for name, model in models.items():
        rel: list[float] = []
        logs: list[float] = []
        for s in samples:
            if not s.measured_s > 0:
                raise ValueError(f"sample {s.name!r}: measured time must be > 0")
            p = model(s)
            if p is None:
                continue
            p = float(p)
            rel.append(abs(p - s.measured_s) / s.measured_s)
            logs.append(math.log2(p / s.measured_s) if p > 0 else -math.inf)
        nan = math.nan
        errors[name] = ModelError(
            name=name,
            n=len(rel),
            mean_rel_error=statistics.fmean(rel) if rel else nan,
            median_rel_error=statistics.median(rel) if rel else nan,
            max_rel_error=max(rel) if rel else nan,
            log2_bias=statistics.fmean(logs) if logs else nan,
            relative_errors=tuple(rel),
        )
    return Comparison(errors)


def fit_projected(
    samples: Sequence[Sample], spec: DeviceSpec, prior: ProjectedModel | None = None
) -> ProjectedModel:
    """Calibrate the projected model on the measured samples that carry features."""
    usable = [(s.features, s.measured_s) for s in samples if s.features is not None]
    if not usable:
        raise ValueError("no sample carries schedule features to fit on")
    return projected.fit(usable, spec, prior)


def predictions(model: Predictor, samples: Sequence[Sample]) -> tuple[list[float], list[float]]:
    """``(predicted, measured)`` seconds of the samples ``model`` predicts (others
    skipped), for :mod:`.stats`."""
    pred, meas = [], []
    for s in samples:
        p = model(s)
        if p is not None:
            pred.append(float(p))
            meas.append(s.measured_s)
    return pred, meas
