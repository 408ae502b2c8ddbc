"""``geode.tune``: search every kernel's schedule space of a model and keep what is faster.

::

    report = geode.tune("model.onnx", trials=32, db="tuning.json", shapes={"x": (64, 1024)})
    print(report)
    model = geode.compile("model.onnx", tuning_db="tuning.json")  # the tuned schedules

The model runs the compile stages up to lowering (:func:`geode.spine.compile_until`);
the reference interpreter gives every kernel its real input values for the run
(``inputs``, or random data of ``shapes``: floats standard normal, integers in
``[0, 4)``). Each kernel not in the database yet (for this device and thread count)
is tuned (:func:`geode.codegen.tuning.search.tune_kernel`) and its entry written at
once, atomically, so an interrupted run loses at most the kernel it was on and a rerun
skips the kernels done (``retune=True`` measures them again). Kernels with the same
key are tuned once. A progress bar follows the kernels (option ``progress``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from geode.api import to_graph
from geode.codegen.kernel_key import canonical_lowered, kernel_key
from geode.codegen.tuning import space
from geode.codegen.tuning.predict import Predictor, projected_predictor, sol_predictor
from geode.codegen.tuning.search import KernelTask, TuneResult, tune_kernel
from geode.codegen.tuning_db import (
    TunedEntry,
    TuningDB,
    device_fingerprint,
    device_info,
    effective_threads,
)
from geode.compiler.interpret import bind_inputs, run_reference
from geode.compiler.ir import Graph, Value
from geode.config import Options
from geode.costmodel.sol import format_time
from geode.debug import Dumper, log
from geode.errors import TuningError
from geode.progress import progress_bar

#: random integer inputs are drawn from [0, RANDOM_INT_HIGH) (valid indices of any
#: table of at least that many rows), as the command line's
RANDOM_INT_HIGH = 4


@dataclass
class KernelReport:
    """One kernel of a tuning run: ``status`` is ``tuned``, ``default`` (kept: nothing
    was faster), ``in db`` (tuned before: skipped), ``duplicate`` (same key as an earlier
    kernel), ``skipped`` (a GEMM epilogue, not tuned on its own), ``failed`` (``note``
    says why) or ``pending`` (not reached: the run stopped)."""

    name: str
    key: str
    status: str
    default_s: float = 0.0
    best_s: float = 0.0
    trials: int = 0
    note: str = ""

    @property
    def speedup(self) -> float:
        """Default time over the kept schedule's time (1.0 when not measured)."""
        return self.default_s / self.best_s if self.best_s > 0 else 1.0


@dataclass
class TuneReport:
    """What ``geode.tune`` did: the database, the device key and one report per kernel."""

    db: str
    device: str
    threads: int
    kernels: list[KernelReport] = field(default_factory=list)

    def table(self) -> str:
        """One line per kernel: status, times, speedup, trials, key."""
        lines = [
            f"tuning database {self.db} (device {self.device}, {self.threads} threads)",
            f"{'kernel':<12} {'status':<10} {'default':>10} {'tuned':>10} {'speedup':>8} "
            f"{'trials':>6}  key",
        ]
        for k in self.kernels:
            measured = k.status in ("tuned", "default")
            d = format_time(k.default_s) if measured else "-"
            b = format_time(k.best_s) if measured else "-"
            s = f"{k.speedup:.2f}x" if measured else "-"
            line = f"{k.name:<12} {k.status:<10} {d:>10} {b:>10} {s:>8} {k.trials:>6}  {k.key}"
            lines.append(line + (f"  ({k.note})" if k.note else ""))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def tune(
    model: Any,
    trials: int = 32,
    db: str | os.PathLike[str] | None = None,
    *,
    inputs: Mapping[str, Any] | None = None,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    predictor: Predictor | str | None = None,
    retune: bool = False,
    min_gain: float = 0.03,
    seed: int = 0,
    bench_options: Mapping[str, Any] | None = None,
    knobs: Sequence[str] | None = None,
    whole_space: int = 0,
    session: Any = None,
    ray: str | None = None,
    **options: Any,
) -> TuneReport:
    """Tune the schedule of every kernel of ``model`` (a Graph, ONNX model or path) and
    record the results in the tuning database ``db`` (default: the ``tuning_db``
    option); returns a :class:`TuneReport`.

    ``trials``: candidates measured per kernel at most. ``inputs`` (arrays by input
    name) or ``shapes`` (shapes by input name, random data) size the run; a symbolic
    dim neither fixes is a :class:`TuningError`. ``predictor``: ranks candidates before
    they are measured: None (knob order), ``"sol"`` (the speed-of-light model),
    ``"projected"`` (the projected model: fitted on this device when a fit was saved,
    else its prior; :func:`~geode.codegen.tuning.predict.projected_predictor`) or a
    callable ``fn(kernel[, dims]) -> seconds``. ``min_gain``: the fraction by which a
    schedule must beat the default to be kept. ``seed``: of the random inputs.
    ``bench_options``: how each candidate is timed (``repeat``, ``min_time``,
    ``max_time``, ``statistic`` of :class:`~geode.codegen.tuning.measure.KernelBench`). ``knobs``: the
    knobs searched (names of :data:`geode.codegen.tuning.space.KNOBS`; default all).
    ``whole_space``: with a predictor, a kernel whose space has at most this many
    settings is searched whole, best-predicted first (see
    :func:`~geode.codegen.tuning.search.tune_kernel`; default 0: hill climbing).
    ``ray``: the address of a Ray cluster (``host:port``, ``ray://host:port``; ``local``
    or ``auto`` start one on this machine) whose workers measure the candidates, several
    at once (:mod:`geode.codegen.tuning.ray_runner`; the ``geode[ray]`` extra); the
    results go into the same database. ``options`` are
    compile options (e.g. ``num_threads``: the tuned kernels' thread count, part of the
    database key)."""
    from geode.session import default_session

    sess = session if session is not None else default_session()
    opts = sess.options.replace(**options)
    if opts.backend != "llvm":
        raise TuningError(f"tuning needs the llvm backend, not {opts.backend!r}")
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 0:
        raise TuningError(f"trials={trials!r}: expected an int >= 0")
    path = db if db is not None else opts.tuning_db
    if path is None:
        raise TuningError("no tuning database: give db=PATH (or the tuning_db option)")
    try:
        space.select(knobs)
    except KeyError as exc:
        raise TuningError(str(exc.args[0])) from None
    tdb = TuningDB.open(path, opts.cache_sign)
    graph = to_graph(model)
    rank = _predictor(predictor, opts)
    c = _lowered(graph, opts, sess)
    threads = effective_threads(opts.num_threads)
    device = device_fingerprint(threads)
    report = TuneReport(tdb.path, device, threads)
    todo = []
    seen: set[str] = set()
    for job in c.jobs:
        key = kernel_key(job.lowered.kernel)
        if job.panel is not None:
            note = "a GEMM epilogue: it runs per panel, inside the GEMM's step"
            report.kernels.append(KernelReport(job.name, key, "skipped", note=note))
        elif key in seen:
            report.kernels.append(KernelReport(job.name, key, "duplicate"))
        elif not retune and tdb.get(key, device) is not None:
            report.kernels.append(KernelReport(job.name, key, "in db"))
        else:
            todo.append((job, key))
            report.kernels.append(KernelReport(job.name, key, "pending"))
        seen.add(key)
    if not todo:
        return report
    feeds = make_feeds(c.graph, inputs, shapes, np.random.default_rng(seed))
    values = run_reference(c.graph, feeds, keep_all=True)
    env = {str(k): int(v) for k, v in bind_inputs(c.graph, feeds).items()}
    cluster = None
    if ray is not None:
        from geode.codegen.tuning.ray_runner import connect

        cluster = connect(ray)
    bar = progress_bar(len(todo), f"geode: tuning {graph.name}", opts.progress, unit="kernel")
    at = {r.name: i for i, r in enumerate(report.kernels)}
    try:
        for job, key in todo:
            lowered = canonical_lowered(job.lowered)
            arrays = [_value_array(v, values, feeds) for v in lowered.inputs]
            task = KernelTask(job.name, key, lowered, job.group, arrays, env)
            result = tune_kernel(
                task,
                opts,
                trials,
                rank,
                min_gain,
                dict(bench_options or {}),
                whole_space=whole_space,
                knobs=knobs,
                measurer=_measurer(cluster, task, opts, threads, device, bench_options),
            )
            report.kernels[at[job.name]] = _record(tdb, result, device, threads)
            bar.set_postfix_str(f"{job.name}: {result.status}")
            bar.update()
    finally:
        bar.close()
        if cluster is not None:
            cluster.close()
    return report


def _measurer(
    cluster: Any,
    task: KernelTask,
    opts: Options,
    threads: int,
    device: str,
    bench_options: Mapping[str, Any] | None,
) -> Any:
    """Where ``task``'s candidates are measured: on ``cluster``'s workers, or here (None)."""
    if cluster is None:
        return None
    from geode.codegen.tuning.ray_runner import RayMeasurer

    return RayMeasurer(
        cluster,
        task.name,
        task.lowered,
        task.inputs,
        task.env,
        opts,
        threads,
        device,
        dict(bench_options or {}),
    )


def _lowered(graph: Graph, opts: Options, sess: Any) -> Any:
    """The compile of ``graph`` run up to lowering (the tuner schedules each kernel)."""
    from geode.spine import Compilation, compile_until

    g = graph.copy()
    plain = opts.replace(schedules=None, tuning_db=None, debug=0, dump_dir=None)
    c = Compilation(g, plain, Dumper(g.name, 0, None), sess.var_manager, f"tune:{g.name}")
    return compile_until(c, "lower")


def _record(tdb: TuningDB, result: TuneResult, device: str, threads: int) -> KernelReport:
    """Write ``result`` into the database (atomically, now) and report it."""
    note = "; ".join(result.notes[-1:])
    if result.status == "failed":
        log.warning("kernel %s not tuned: %s", result.name, note)
        return KernelReport(result.name, result.key, "failed", note=note)
    entry = TunedEntry(
        kernel_key=result.key,
        device=device,
        status=result.status,
        trace=result.trace,
        default_s=result.default_s,
        best_s=result.best_s,
        trials=result.trials,
        knobs=dict(result.setting),
    )
    tdb.put(entry, device_info(threads))
    tdb.save()
    return KernelReport(
        result.name,
        result.key,
        result.status,
        result.default_s,
        result.best_s,
        result.trials,
        "" if result.status == "tuned" else note,
    )


def _predictor(predictor: Predictor | str | None, opts: Options) -> Predictor | None:
    if predictor is None or predictor == "none":
        return None
    if predictor == "sol":
        from geode.codegen.driver import device_spec

        return sol_predictor(device_spec(opts.cache_dir))
    if predictor == "projected":
        return projected_predictor(opts)
    if callable(predictor):
        return predictor
    raise TuningError(f"predictor={predictor!r}: expected None, 'sol', 'projected' or a callable")


def make_feeds(
    g: Graph,
    inputs: Mapping[str, Any] | None,
    shapes: Mapping[str, tuple[int, ...]] | None,
    rng: np.random.Generator,
) -> dict[str, np.ndarray]:
    """The run's input arrays: ``inputs`` where given, else random data of the shape in
    ``shapes`` or of the input's static shape; TuningError naming an input whose shape
    is not known."""
    feeds: dict[str, np.ndarray] = {}
    names = {v.name for v in g.inputs}
    unknown = sorted((set(inputs or {}) | set(shapes or {})) - names)
    if unknown:
        raise TuningError(f"inputs {unknown} are not inputs of {g.name!r} ({sorted(names)})")
    for v in g.inputs:
        if inputs is not None and v.name in inputs:
            feeds[v.name] = np.asarray(inputs[v.name])
            continue
        if shapes is not None and v.name in shapes:
            shape = tuple(int(n) for n in shapes[v.name])
        elif v.shape is not None and all(isinstance(d, int) for d in v.shape):
            shape = tuple(int(d) for d in v.shape)
        else:
            raise TuningError(
                f"input {v.name!r} has the shape {v.desc}: give its size (shapes= or inputs=; "
                f"--shape {v.name}:D1,D2,... on the command line): a kernel is tuned for one size"
            )
        feeds[v.name] = random_array(rng, np.dtype(v.dtype), shape)
    return feeds


def random_array(rng: np.random.Generator, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """Random data of ``dtype``: standard normal floats, integers in ``[0,
    RANDOM_INT_HIGH)``, random bools."""
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(np.bool_)
    if dtype.kind in "iu":
        return rng.integers(0, RANDOM_INT_HIGH, shape).astype(dtype)
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    raise TuningError(f"cannot make random data of {dtype}: give this input with inputs=")


def _value_array(v: Value, values: Mapping[str, np.ndarray], feeds: Mapping[str, Any]) -> Any:
    """The array of kernel input ``v`` in the reference run."""
    if v.name in feeds:
        return feeds[v.name]
    if v.name in values:
        return values[v.name]
    if v.data is not None:
        return np.asarray(v.data)
    raise TuningError(f"value {v.name!r} has no data for the tuning run")
