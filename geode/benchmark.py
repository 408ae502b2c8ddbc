"""Timing geode against onnxruntime: interleaved rounds, paired ratios, accuracy, tables.

``geode bench`` and ``bench/models.py`` time both systems the same way:

* **Warm-up**: each system runs ``warmup`` untimed calls (at least one); the last one's
  time sets how many calls a round block holds (enough for about ``block_s`` seconds,
  at least one).
* **Interleaved rounds**: every round runs a block of geode's calls, then a block of
  onnxruntime's, each after a short rest (``settle_s``: the other system's worker
  threads stop spinning). A block's time is the median of its calls, so a call the
  scheduler preempted does not count.
* **Paired ratios**: the per-round ratio geode / onnxruntime cancels the machine-speed
  drift between rounds (a shared machine); reported are the median of those ratios and
  their interquartile range, plus each system's median time.
* **Accuracy**: the largest difference over every output, relative to the largest
  magnitude of onnxruntime's output (:func:`max_rel_error`).

This module does not import torch; onnxruntime is optional (:func:`have_onnxruntime`).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: the relative error above which a result is flagged (the issue's accuracy target)
TOLERANCE = 1e-3


def have_onnxruntime() -> bool:
    """Whether onnxruntime can be imported."""
    return importlib.util.find_spec("onnxruntime") is not None


def ort_session(model: str | bytes, threads: int) -> Any:
    """An onnxruntime CPU session on ``threads`` intra-op threads and one inter-op thread
    (full graph optimizations, warnings off); ImportError when onnxruntime is missing."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def ort_runner(session: Any, feeds: Mapping[str, np.ndarray]) -> Callable[[], dict]:
    """A zero-argument call of ``session`` on the feeds it takes; returns name -> array."""
    names = [o.name for o in session.get_outputs()]
    wanted = {i.name for i in session.get_inputs()}
    given = {k: v for k, v in feeds.items() if k in wanted}
    return lambda: dict(zip(names, session.run(None, given)))


def _seconds(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _block(fn: Callable[[], object], calls: int) -> float:
    """The median seconds of ``calls`` calls of ``fn``; a function timed elsewhere (one
    with a ``block(calls)`` method: :class:`geode.bench_isolated.RemoteRunner`) times
    them itself."""
    block = getattr(fn, "block", None)
    if block is not None:
        return float(block(calls))
    return statistics.median(_seconds(fn) for _ in range(calls))


def interleave(
    fns: Mapping[str, Callable[[], object]],
    rounds: int,
    warmup: int = 3,
    block_s: float = 0.1,
    settle_s: float = 0.02,
    on_round: Callable[[], object] | None = None,
) -> dict[str, list[float]]:
    """Seconds per call of each function in each of ``rounds`` interleaved rounds (the
    median of the round's block of calls); see the module docstring. A function with a
    ``block(calls)`` method times its blocks itself (onnxruntime in a process of its own:
    :mod:`geode.bench_isolated`). ``on_round`` is called after each round (a progress
    bar's update)."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    calls: dict[str, int] = {}
    for name, fn in fns.items():
        t = _block(fn, 1)
        for _ in range(warmup - 1):
            t = _block(fn, 1)
        calls[name] = max(1, min(1000, int(block_s / max(t, 1e-9))))
    out: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            time.sleep(settle_s)
            out[name].append(_block(fn, calls[name]))
        if on_round is not None:
            on_round()
    return out


def quartiles(xs: Sequence[float]) -> tuple[float, float, float]:
    """The first quartile, median and third quartile of ``xs`` (linear interpolation)."""
    q1, med, q3 = np.percentile(np.asarray(xs, np.float64), [25, 50, 75])
    return float(q1), float(med), float(q3)


def geomean(xs: Sequence[float]) -> float:
    """The geometric mean of positive numbers (nan for none)."""
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def max_rel_error(ours: Mapping[str, Any], theirs: Mapping[str, Any]) -> float:
    """The largest ``max |ours - theirs| / max |theirs|`` over the outputs both have (an
    output of zeros is compared absolutely); inf when shapes differ or only one side has
    a NaN where the other does not."""
    worst = 0.0
    for name, want in theirs.items():
        if name not in ours:
            continue
        a, b = np.asarray(ours[name]), np.asarray(want)
        if a.shape != b.shape:
            return math.inf
        if a.size == 0 or a.dtype.kind not in "biuf" or b.dtype.kind not in "biuf":
            continue
        a, b = a.astype(np.float64), b.astype(np.float64)
        nan_a, nan_b = np.isnan(a), np.isnan(b)
        if (nan_a != nan_b).any():
            return math.inf
        a, b = a[~nan_b], b[~nan_b]
        if a.size == 0:
            continue
        scale = float(np.max(np.abs(b)))
        diff = float(np.max(np.abs(a - b)))
        worst = max(worst, diff / scale if scale > 0 else diff)
    return worst


@dataclass
class Result:
    """One model at one size: geode's and onnxruntime's times (seconds per call, medians
    over rounds), the median and quartiles of the per-round ratio geode / onnxruntime,
    and the accuracy (None where onnxruntime did not run)."""

    model: str
    size: str
    geode_s: float
    ort_s: float | None = None
    ratio: float | None = None
    ratio_q1: float | None = None
    ratio_q3: float | None = None
    rel_err: float | None = None
    rounds: int = 0

    @property
    def accurate(self) -> bool:
        """Whether the error is within :data:`TOLERANCE` (True when not compared)."""
        return self.rel_err is None or self.rel_err <= TOLERANCE

    def as_dict(self) -> dict[str, Any]:
        """The fields, for JSON."""
        return dataclasses.asdict(self)


def compare(
    model: str,
    size: str,
    geode_fn: Callable[[], Mapping[str, Any]],
    ort_fn: Callable[[], Mapping[str, Any]] | None,
    rounds: int,
    warmup: int = 3,
    block_s: float = 0.1,
    on_round: Callable[[], object] | None = None,
) -> Result:
    """Time ``geode_fn`` (and ``ort_fn`` when given) in interleaved rounds and check the
    outputs agree; see the module docstring."""
    fns: dict[str, Callable[[], object]] = {"geode": geode_fn}
    if ort_fn is not None:
        fns["ort"] = ort_fn
    times = interleave(fns, rounds, warmup, block_s, on_round=on_round)
    res = Result(model, size, statistics.median(times["geode"]), rounds=rounds)
    if ort_fn is not None:
        res.ort_s = statistics.median(times["ort"])
        ratios = [g / o for g, o in zip(times["geode"], times["ort"])]
        res.ratio_q1, res.ratio, res.ratio_q3 = quartiles(ratios)
        res.rel_err = max_rel_error(geode_fn(), ort_fn())
    return res


@dataclass
class CompileTime:
    """Seconds from nothing to a first result: geode's compile and first run, and
    onnxruntime's session creation and first run (None where it did not run)."""

    model: str
    geode_compile_s: float
    geode_first_s: float
    ort_session_s: float | None = None
    ort_first_s: float | None = None

    @property
    def ratio(self) -> float | None:
        """(geode compile + first run) / (onnxruntime session + first run)."""
        if self.ort_session_s is None or self.ort_first_s is None:
            return None
        return (self.geode_compile_s + self.geode_first_s) / (self.ort_session_s + self.ort_first_s)

    def as_dict(self) -> dict[str, Any]:
        """The fields and the ratio, for JSON."""
        return {**dataclasses.asdict(self), "ratio": self.ratio}


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    ms = seconds * 1e3
    return f"{ms:.3f}" if ms < 10 else f"{ms:.1f}"


def results_table(results: Sequence[Result]) -> str:
    """The markdown table of :class:`Result` rows; an error above :data:`TOLERANCE` is
    marked FAIL."""
    lines = [
        "| model | size | geode ms | ORT ms | geode/ORT (IQR) | max rel err |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in results:
        ratio = "-"
        if r.ratio is not None:
            ratio = f"{r.ratio:.2f} ({r.ratio_q1:.2f}-{r.ratio_q3:.2f})"
        err = _num(r.rel_err, ".1e") + ("" if r.accurate else " FAIL")
        lines.append(
            f"| {r.model} | {r.size} | {_ms(r.geode_s)} | {_ms(r.ort_s)} | {ratio} | {err} |"
        )
    return "\n".join(lines)


def compile_table(times: Sequence[CompileTime]) -> str:
    """The markdown table of :class:`CompileTime` rows."""
    lines = [
        "| model | geode compile ms | geode 1st run ms | ORT session ms | ORT 1st run ms "
        "| geode/ORT to 1st result |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for c in times:
        lines.append(
            f"| {c.model} | {_ms(c.geode_compile_s)} | {_ms(c.geode_first_s)} "
            f"| {_ms(c.ort_session_s)} | {_ms(c.ort_first_s)} | {_num(c.ratio, '.1f')} |"
        )
    return "\n".join(lines)


def summary(results: Sequence[Result]) -> str:
    """The geometric mean of the onnxruntime / geode speedups, and the accuracy verdict."""
    ratios = [r.ratio for r in results if r.ratio]
    if not ratios:
        return "no onnxruntime comparison"
    speedup = geomean([1 / x for x in ratios])
    verdict = "geode faster" if speedup > 1 else "onnxruntime faster"
    bad = [f"{r.model} {r.size}" for r in results if not r.accurate]
    what = "speedup" if len(ratios) == 1 else f"geometric mean (of {len(ratios)} rows) speedup"
    text = f"{what} of geode over onnxruntime (ORT time / geode time): {speedup:.2f}x ({verdict})"
    if bad:
        text += f"\naccuracy FAIL (max rel err above {TOLERANCE:g}): {', '.join(bad)}"
    return text


@dataclass
class StepTime:
    """One plan step's mean seconds per run (see :func:`step_profile`)."""

    name: str
    engine: str
    label: str
    seconds: float


def step_profile(model: Any, feeds: Mapping[str, np.ndarray], runs: int = 20) -> list[StepTime]:
    """Each step of a compiled model's plan timed over ``runs`` runs on ``feeds`` (after as
    many untimed ones: another library's spinning threads settle, caches warm up), as the
    median of its times per run (a run the scheduler slowed does not count), slowest
    first. The steps run in a private executor of a copy of the plan, so the model itself
    is untouched; steps the executor skips on repeated runs (shape arithmetic remembered
    per input shapes) show zero."""
    from geode.runtime.executor import Executor

    spent = [0.0] * len(model.plan.steps)

    def timed(k: int, fn: Callable) -> Callable:
        def run(ins: list, outs: list, env: Mapping[str, int]) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(ins, outs, env)
            finally:
                spent[k] += time.perf_counter() - t0

        return run

    steps = [dataclasses.replace(s, fn=timed(k, s.fn)) for k, s in enumerate(model.plan.steps)]
    executor = Executor(dataclasses.replace(model.plan, steps=steps), model.var_manager)
    for _ in range(max(1, runs)):
        executor.run(feeds)
    per_run = []
    for _ in range(max(1, runs)):
        spent[:] = [0.0] * len(spent)
        executor.run(feeds)
        per_run.append(list(spent))
    medians = np.median(np.asarray(per_run), axis=0)
    out = [
        StepTime(s.name, s.engine, s.label, float(medians[k]))
        for k, s in enumerate(model.plan.steps)
    ]
    return sorted(out, key=lambda s: -s.seconds)


def profile_table(steps: Sequence[StepTime], top: int, run_s: float | None = None) -> str:
    """The ``top`` slowest steps as a markdown table with their share of all steps' time
    (and, given the run's time ``run_s``, what the executor spends between steps)."""
    total = sum(s.seconds for s in steps) or 1e-12
    lines = ["| step | engine | ms | share | ops |", "|---|---|---:|---:|---|"]
    for s in steps[:top]:
        label = s.label if len(s.label) <= 80 else s.label[:77] + "..."
        label = label.replace("|", "\\|")  # a chain step's label lists its kernels by |
        lines.append(
            f"| {s.name} | {s.engine} | {_ms(s.seconds)} | {100 * s.seconds / total:.0f}% "
            f"| {label} |"
        )
    text = "\n".join(lines)
    text += f"\n{len(steps)} steps, {_ms(sum(s.seconds for s in steps))} ms in steps"
    if run_s is not None:
        text += f" of a {_ms(run_s)} ms run"
    return text
