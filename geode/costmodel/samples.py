"""Profiled samples of geode's own kernels: a generator of diverse kernels, compiled
through the real pipeline and timed, for fitting and checking the cost models.

:func:`generate_cases` draws :class:`KernelCase` records from a seed: elementwise
chains (simple and transcendental ops, one to three inputs, broadcasts), row, column,
middle-axis and full reductions with prologues, normalizations (a reduction broadcast
back: softmax, layer norm), transposes; float32 and float64; sizes from a few KiB to
beyond the last-level cache; leading dims static or symbolic; schedules varied by
the run's thread count, the serial/parallel threshold and streaming stores.
:func:`collect` compiles each case with the spine's stages up to ``emit`` (every
kernel of the case: a case may become several), times the kernels of a few cases at
a time in interleaved rounds (:func:`geode.costmodel.profiling.measure_interleaved`,
the median), and returns :class:`~geode.costmodel.profiling.Sample` records carrying
the SOL work and the projected features of each. Samples save to and load from JSON
(:func:`save_samples`, :func:`load_samples`), with the device spec they were measured
on, so a fit can be replayed.

This module drives the compiler (layer ``session``); the cost models it feeds import
nothing of it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import geode.config as config
from geode.codegen.autoschedule import override_choices
from geode.codegen.costs import KernelPredictor, kernel_env, kernel_timer, sol_work
from geode.compiler.frontend import builder as ops
from geode.compiler.ir import Graph, Value
from geode.costmodel.device import DeviceSpec, cached_spec
from geode.costmodel.profiling import Sample, measure_interleaved
from geode.costmodel.projected import ScheduleFeatures
from geode.costmodel.sol import KernelWork
from geode.debug import Dumper
from geode.errors import GeodeError
from geode.progress import progress_bar
from geode.runtime.var_manager import VarManager
from geode.safe_files import atomic_write, read_file

#: simple elementwise ops of the chains (name -> builder)
SIMPLE: dict[str, Callable[[Value, Value], Value]] = {
    "add": lambda a, b: ops.add(a, b),
    "mul": lambda a, b: ops.mul(a, b),
    "sub": lambda a, b: ops.sub(a, b),
    "div": lambda a, b: ops.div(a, b),
    "max": lambda a, b: ops.max(a, b),
}
#: unary ops of the chains (the costly ones are transcendental)
UNARY: dict[str, Callable[[Value], Value]] = {
    "relu": lambda a: ops.relu(a),
    "abs": lambda a: ops.abs(a),
    "sqrt": lambda a: ops.sqrt(ops.abs(a)),
    "exp": lambda a: ops.exp(ops.neg(ops.abs(a))),
    "tanh": lambda a: ops.tanh(a),
    "sigmoid": lambda a: ops.sigmoid(a),
    "log": lambda a: ops.log(ops.add(ops.abs(a), 1.0)),
    "erf": lambda a: ops.erf(a),
}
REDUCE: dict[str, Callable[..., Value]] = {
    "sum": ops.reduce_sum,
    "max": ops.reduce_max,
    "mean": ops.reduce_mean,
}
KINDS = ("elementwise", "broadcast", "row", "column", "middle", "full", "norm", "transpose")


@dataclass(frozen=True)
class KernelCase:
    """One generated graph to compile and time: how to build it (``kind``, ``shape``,
    ``dtype``, ``ops`` drawn), the symbols' values of the run (``env``), the run's
    thread count (0: every core) and the schedule's variations (``choices`` for
    :func:`~geode.codegen.autoschedule.override_choices`, ``streaming``)."""

    name: str
    kind: str
    shape: tuple[int, ...]
    dtype: str
    ops: tuple[str, ...]
    symbolic: bool = False
    threads: int = 0
    choices: tuple[tuple[str, int], ...] = ()
    streaming: str = "auto"
    env: dict[str, int] = field(default_factory=dict)

    def graph(self) -> Graph:
        """The case's graph (built fresh each call)."""
        return _build(self)


def _shape(rng: np.random.Generator, kind: str, itemsize: int) -> tuple[int, ...]:
    """A shape of 2**10 .. 2**22.5 elements (log-uniform, fewer for float64)."""
    total = 2.0 ** rng.uniform(10, 22.5 if itemsize == 4 else 21.5)
    if kind in ("elementwise",) and rng.random() < 0.3:
        return (int(total),)
    if kind == "middle":
        c = int(2 ** rng.integers(2, 7))
        inner = int(2 ** rng.integers(3, 9))
        return (max(1, int(total / (c * inner))), c, inner)
    cols = int(2 ** rng.uniform(3, min(14, math.log2(total) - 1)))
    if rng.random() < 0.3:
        cols += int(rng.integers(1, 8))  # not a power of two: vector remainders
    return (max(1, int(total / cols)), cols)


def generate_cases(n: int, seed: int = 0) -> list[KernelCase]:
    """``n`` diverse kernel cases drawn from ``seed`` (the same seed, the same cases)."""
    if n < 0:
        raise ValueError(f"need n >= 0 cases, got {n}")
    rng = np.random.default_rng(seed)
    cases = []
    for i in range(n):
        kind = KINDS[i % len(KINDS)] if i < len(KINDS) else str(rng.choice(KINDS))
        dtype = "float64" if rng.random() < 0.2 else "float32"
        shape = _shape(rng, kind, np.dtype(dtype).itemsize)
        length = int(rng.integers(1, 6))
        pool = list(SIMPLE) + list(UNARY)
        drawn = tuple(str(rng.choice(pool)) for _ in range(length))
        if kind in ("row", "column", "middle", "full", "norm"):
            drawn = (str(rng.choice(list(REDUCE))), *drawn[:2])
        choices: list[tuple[str, int]] = []
        if rng.random() < 0.25:
            choices.append(("parallel_min_elements", 1 << 30))  # serial
        elif rng.random() < 0.2:
            choices.append(("parallel_min_elements", 1))  # parallel however small
        symbolic = len(shape) > 1 and rng.random() < 0.3
        cases.append(
            KernelCase(
                name=f"{kind}_{i}",
                kind=kind,
                shape=shape,
                dtype=dtype,
                ops=drawn,
                symbolic=symbolic,
                threads=1 if rng.random() < 0.25 else 0,
                choices=tuple(choices),
                streaming="off" if rng.random() < 0.2 else "auto",
                env={"N": shape[0]} if symbolic else {},
            )
        )
    return cases


def _chain(x: Value, others: list[Value], names: Sequence[str]) -> Value:
    y = x
    for k, name in enumerate(names):
        if name in SIMPLE:
            y = SIMPLE[name](y, others[k % len(others)] if others else y)
        else:
            y = UNARY[name](y)
    return y


def _build(case: KernelCase) -> Graph:
    g = Graph(case.name)
    dims: list[object] = list(case.shape)
    if case.symbolic:
        dims[0] = "N"
    x = g.input("x", dims, case.dtype)
    kind, names = case.kind, case.ops
    if kind in ("elementwise", "transpose"):
        others = [g.input(f"in{k}", dims, case.dtype) for k in range(len(names) % 3)]
        y = _chain(x, others, names)
        if kind == "transpose" and len(dims) == 2:
            y = ops.transpose(y, perm=[1, 0])
        g.output(y, names=["y"])
        return g
    if kind == "broadcast":
        row = g.input("row", [dims[-1]], case.dtype)
        col = g.input("col", [*dims[:-1], 1], case.dtype)
        g.output(_chain(ops.mul(ops.add(x, row), col), [row], names), names=["y"])
        return g
    red, rest = REDUCE[names[0]], names[1:]
    pre = _chain(x, [], rest[:1])
    if kind == "full":
        g.output(red(pre, keepdims=0), names=["y"])
    elif kind == "column":
        g.output(red(pre, axes=[0], keepdims=0), names=["y"])
    elif kind == "middle":
        g.output(red(pre, axes=[1], keepdims=0), names=["y"])
    elif kind == "row":
        g.output(red(pre, axes=[-1], keepdims=0), names=["y"])
    else:  # norm: reduce a row and broadcast the result back
        s = red(pre, axes=[-1], keepdims=1)
        g.output(_chain(ops.sub(pre, s), [], rest[1:]), names=["y"])
    return g


@dataclass
class CompiledCase:
    """A case's kernels compiled: per kernel its name, features, SOL work and a timer."""

    case: KernelCase
    kernels: list[tuple[str, ScheduleFeatures, KernelWork, Callable[[], Any]]]


@contextlib.contextmanager
def _choices(case: KernelCase) -> Iterator[None]:
    with override_choices(**dict(case.choices)):
        yield


def compile_case(case: KernelCase, opts: config.Options, spec: DeviceSpec) -> CompiledCase:
    """Compile ``case`` with the spine's stages up to ``emit`` under its schedule
    variations; every kernel job that compiled, with its features for the case's run."""
    from geode.spine import STAGES, Compilation

    run_opts = opts.replace(num_threads=case.threads, streaming=case.streaming)
    c = Compilation(
        case.graph(), run_opts, Dumper(case.name, 0, None), VarManager("costmodel"), "cm"
    )
    with _choices(case):
        for name, stage in STAGES:
            if name == "bind":
                break
            stage(c)
    predictor = KernelPredictor(spec, threads=case.threads)
    kernels = []
    for job in c.jobs:
        if job.panel is not None or job.interface is None:
            continue
        f = predictor.features(job.schedule.kernel, kernel_env(job.lowered, case.env))
        timer = kernel_timer(job.lowered, job.interface, case.env)
        kernels.append((f"{case.name}/{job.name}", f, sol_work(f), timer))
    return CompiledCase(case, kernels)


def collect(
    n: int,
    seed: int = 0,
    *,
    opts: config.Options | None = None,
    rounds: int = 7,
    batch: int = 6,
    min_time: float = 1e-3,
    progress: str | bool = "auto",
) -> list[Sample]:
    """Generate ``n`` cases from ``seed``, compile them and time their kernels: ``batch``
    cases at a time in ``rounds`` interleaved rounds, each kernel's calls batched to
    ``min_time`` seconds. Cases that fail to compile (a
    :class:`~geode.errors.GeodeError`) are skipped. A progress bar counts cases."""
    opts = opts or config.current(progress="0", model_cache=False)
    spec = cached_spec(opts.cache_dir)
    cases = generate_cases(n, seed)
    samples: list[Sample] = []
    bar = progress_bar(len(cases), "geode: profiling kernels", progress, unit="case")
    for start in range(0, len(cases), batch):
        compiled = []
        for case in cases[start : start + batch]:
            with contextlib.suppress(GeodeError):
                compiled.append(compile_case(case, opts, spec))
            bar.update()
        timers = {name: t for cc in compiled for name, _, _, t in cc.kernels}
        timings = measure_interleaved(timers, rounds=rounds, min_time=min_time, seed=seed + start)
        for cc in compiled:
            for name, f, w, _ in cc.kernels:
                t = timings[name]
                samples.append(Sample(name, t.median, work=w, features=f, timing=t))
    bar.close()
    return samples


def samples_to_json(samples: Sequence[Sample], spec: DeviceSpec | None = None) -> str:
    """Samples as a JSON document: name, measured seconds, features (the SOL work
    follows from the features), and the device spec they were measured on."""
    rows = [
        {"name": s.name, "measured_s": s.measured_s, "features": _features_dict(s)}
        for s in samples
        if s.features is not None
    ]
    doc: dict[str, Any] = {"format": 1, "samples": rows}
    if spec is not None:
        doc["device"] = spec.to_dict()
    return json.dumps(doc, separators=(",", ":"))


def _features_dict(s: Sample) -> dict[str, Any]:
    f = s.features
    return f.to_dict() if isinstance(f, ScheduleFeatures) else dict(f)


def samples_from_json(text: str) -> tuple[list[Sample], DeviceSpec | None]:
    """Samples and their device spec (None when not recorded) from
    :func:`samples_to_json`; ``ValueError`` naming the defect otherwise."""
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"samples are not valid JSON: {e}") from e
    if not isinstance(d, dict) or d.get("format") != 1 or not isinstance(d.get("samples"), list):
        raise ValueError("samples: expected an object with format 1 and a list of samples")
    spec = DeviceSpec.from_dict(d["device"]) if "device" in d else None
    out = []
    for i, row in enumerate(d["samples"]):
        if not isinstance(row, dict) or set(row) != {"name", "measured_s", "features"}:
            raise ValueError(f"sample {i}: expected name, measured_s and features")
        t = row["measured_s"]
        if isinstance(t, bool) or not isinstance(t, int | float) or not 0 < t < math.inf:
            raise ValueError(f"sample {i}: measured_s must be a positive number, got {t!r}")
        if not isinstance(row["features"], dict):
            raise ValueError(f"sample {i}: features must be an object")
        f = ScheduleFeatures.from_mapping(row["features"])
        out.append(Sample(str(row["name"]), float(t), work=sol_work(f), features=f))
    return out, spec


def save_samples(
    path: str | os.PathLike[str], samples: Sequence[Sample], spec: DeviceSpec | None = None
) -> None:
    """Write samples (and the spec they were measured on) to ``path`` as JSON, atomically."""
    atomic_write(path, samples_to_json(samples, spec).encode("utf-8"))


def load_samples(path: str | os.PathLike[str]) -> tuple[list[Sample], DeviceSpec | None]:
    """Samples saved by :func:`save_samples`, and their spec; ``ValueError`` if the file
    is unreadable or malformed."""
    raw = read_file(path, 64 << 20, private=False, follow_links=True)
    if raw is None:
        raise ValueError(f"{path}: not a readable regular file of samples")
    return samples_from_json(raw.decode("utf-8", errors="replace"))
