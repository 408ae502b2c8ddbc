"""Session: owns a VarManager and drives compiler -> codegen -> runtime.

``Session.compile(graph)`` copies the user's graph (it is never modified), runs the
compile stages of :mod:`geode.spine` on the copy, and returns a
:class:`CompiledModel` whose constants and variables live in this session's
VarManager. A compile that misses the model cache first has the code generator warmed
up on the other cores (:func:`geode.codegen.backends.prewarm.prewarm`) while the model is
read and planned.

Variables are the session's: every model compiled in it that names a variable shares
it, sees what another model's run wrote into it, and reads it through the methods
here in the user's layout whatever its storage format (``get_variable``,
``set_variable``); ``save_variables`` / ``restore_variables`` checkpoint them all
(:mod:`geode.runtime.var_checkpoint`).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

import geode.config as config
from geode import collector
from geode.codegen.backends.prewarm import prewarm
from geode.compiler.ir import Graph, format_graph
from geode.compiler.ops import control
from geode.debug import Dumper, log
from geode.errors import CheckpointError, GeodeError, GraphError
from geode.plan_builder import ALIAS, COMMIT, NO_STEP, Unit, held_keys
from geode.runtime import var_checkpoint
from geode.runtime.model import CompiledModel
from geode.runtime.var_manager import VarKind, VarManager, VarManagerError, VarManagerPool

if TYPE_CHECKING:
    from geode.compiler.partition.engine import EnginePartition
    from geode.compiler.partition.placement import Placement


class Session:
    """A compile-and-run context: one VarManager shared by every model compiled in it."""

    _ids = itertools.count(1)

    def __init__(self, **options: Any):
        config.current(**options)  # validate now
        self._overrides = dict(options)
        self.id = next(Session._ids)
        self.var_manager: VarManager = VarManagerPool.instance().get(self.id)
        self._models = itertools.count()

    @property
    def options(self) -> config.Options:
        """Effective options: defaults < GEODE_* environment < set_options() < this session's."""
        return config.current(**self._overrides)

    def compile(self, graph: Graph, **options: Any) -> CompiledModel:
        """Compile a graph into a callable model (the graph itself is left unchanged).

        The stages, in order, are :data:`geode.spine.STAGES`."""
        if not isinstance(graph, Graph):
            raise GraphError(f"compile() expects a geode.Graph, got {type(graph).__name__}")
        opts = config.current(**{**self._overrides, **options})  # read at every compile
        g = graph.copy()
        from geode.compiler.partition.stages import has_stages  # a compile's: not a load's

        if has_stages(g):
            from geode.stages import compile_stages

            return compile_stages(self, g, opts)
        if opts.incremental:
            from geode.incremental import compile_incremental

            return compile_incremental(self, g, opts)
        if opts.dynamic_dims:
            from geode.buckets import compile_buckets

            return compile_buckets(self, g, opts)
        return self.compile_with(g, opts)

    def compile_with(self, g: Graph, opts: config.Options) -> CompiledModel:
        """Compile ``g`` (a graph the session may change: a copy of the user's) with
        ``opts`` as given (no buckets, stages or incremental cut: ``dynamic_dims`` and
        ``incremental`` are ignored here), through the model cache."""
        key = _model_cache_key(g, opts)
        hit = None if key is None else self._cached_model(key, opts)
        return hit if hit is not None else self._compile(g, opts, key)

    def compile_file(self, path: str | os.PathLike, **options: Any) -> CompiledModel:
        """Compile the ONNX model file at ``path`` (as :meth:`compile` would its graph).

        The model cache is keyed by the file's bytes here (when it refers to no external
        data file), so a model compiled before is loaded without reading it as ONNX
        (see :mod:`geode.modelfile.cache`)."""
        from geode.modelfile import cache

        opts = config.current(**{**self._overrides, **options})
        key = None if opts.dynamic_dims or opts.incremental else cache.file_key(path, opts)
        hit = None if key is None else self._cached_model(key, opts)
        if hit is not None:
            return hit
        prewarm(opts)  # LLVM warmed up on the other cores while ONNX is read
        # no collections while one core works alone: see geode.collector
        with collector.held(), _calibrating(opts):  # while ONNX is read, the compiler imported
            from geode.compiler.frontend.onnx import import_model  # onnx: 0.07 s to import

            g = import_model(path)
            if key is None or not cache.usable(g, opts):
                return self.compile(g, **options)  # buckets too
            return self._compile(g, opts, key)

    def _compile(self, g: Graph, opts: config.Options, key: str | None) -> CompiledModel:
        """Run the spine on ``g`` (a copy of the user's graph); the result goes into the
        model cache under ``key`` unless None."""
        dump = Dumper(g.name, opts.debug, opts.dump_dir)
        prefix = f"m{next(self._models)}:{g.name}"
        prewarm(opts)  # LLVM warmed up while the first stages run (once per process)
        # the collector held until the first kernel goes to LLVM (see geode.collector)
        with collector.held(), _calibrating(opts):  # while the compiler is imported, ...
            from geode.spine import Compilation, compile_graph  # the whole compiler: first use

            c = compile_graph(Compilation(g, opts, dump, self.var_manager, prefix))
        units, timings = c.units, c.timings
        explain = _Explain(
            g, c.placement, units, c.fusion_text, c.pass_text, self.var_manager, timings
        )
        explain.memory_text = c.plan.memory_text
        from geode.runtime.chains import describe_chains  # imported by a compile only

        explain.chain_text = describe_chains(c.plan.steps)
        explain.engine_partition = c.engine_partition
        kernels = [u.info for u in units if u.engine not in NO_STEP]  # views, commits: none
        model = CompiledModel(c.plan, self.var_manager, kernels, explain, {"timings": timings})
        model.saver = _saver(model, g, units, explain, explain.dot)
        # the model's constants leave the session with the model
        weakref.finalize(model, self.var_manager.release_keys, held_keys(c.plan))
        if dump.wants(2):
            run_by = {n.name: f"{u.name} [{u.engine}]" for u in units for n in u.nodes}
            dump.stage(
                "final_graph",
                format_graph(g, {n.name: run_by.get(n.name, "dead") for n in g.nodes}),
                level=2,
            )
        dump.stage("plan", explain())
        if dump.dir is not None:
            dump.artifact("graph.dot", explain.dot())
        log.debug("compiled %s in %.3fs: %d steps", g.name, timings["total"], len(units))
        if key is not None and not c.fallbacks:  # a fall-back stays loud at every compile
            _store_model(model, key, opts)
        return model

    def _cached_model(self, key: str, opts: config.Options) -> CompiledModel | None:
        """The model of a compile done before with the same key (see
        :mod:`geode.modelfile.cache`), or None."""
        from geode.modelfile import cache

        path = cache.lookup(opts.cache_dir, key, opts.cache_sign)
        if path is None:
            return None
        try:
            model = self._load(path, None, (opts.cache_dir, opts.cache_sign))
        except GeodeError as exc:  # stale or damaged: compile again, and rewrite it
            log.info("cached model %s not used: %s", path, exc)
            return None
        model.stats["model_cache"] = str(path)
        return model

    def load(self, path: str | os.PathLike, num_threads: int | None = None) -> CompiledModel:
        """Load a geode model file (written by ``CompiledModel.save``) into this session:
        no compiler runs (see :mod:`geode.modelfile`). ``num_threads`` overrides the
        thread count it was compiled with."""
        return self._load(path, num_threads)

    def _load(
        self,
        path: str | os.PathLike,
        num_threads: int | None,
        object_cache: tuple[str, bool] | None = None,
    ) -> CompiledModel:
        """:meth:`load`; ``object_cache``: the object cache code compiled after loading
        goes through (a model cache entry's: its compile's own)."""
        from geode.modelfile import load_model

        prefix = f"m{next(self._models)}:file"
        model, g, units = load_model(path, self.var_manager, prefix, num_threads, object_cache)
        model.saver = _saver(model, g, units, model.explain, model.to_dot)
        model.plan.memory_limit = self.options.memory_limit_mb << 20
        weakref.finalize(model, self.var_manager.release_keys, held_keys(model.plan))
        return model

    # -- variables --------------------------------------------------------------------
    def variable_names(self) -> list[str]:
        """The names of the session's variables, in registration order."""
        return [k.name for k in self.var_manager.variables()]

    def _variable(self, name: str) -> str:
        if not isinstance(name, str) or name not in self.var_manager:
            raise VarManagerError(
                f"session {self.id} has no variable {name!r}; it has {self.variable_names()}"
            )
        if self.var_manager.kind(name) is not VarKind.VARIABLE:
            raise VarManagerError(f"{name!r} is a constant of session {self.id}, not a variable")
        return name

    def get_variable(self, name: str) -> np.ndarray:
        """A copy of variable ``name``'s current value, in the layout of its initial value
        (a variable stored in another format is converted back)."""
        return self.var_manager.get_value(self._variable(name))

    def set_variable(self, name: str, value: object) -> None:
        """Set variable ``name`` (its exact dtype and shape, in the user's layout); every
        model of the session sees the new value from its next run."""
        self.var_manager.set_value(self._variable(name), value)

    def save_variables(self, path: str | os.PathLike) -> list[str]:
        """Write every variable that has a value to a checkpoint at ``path`` (atomically:
        the file is replaced only once complete); returns their names. See
        :mod:`geode.runtime.var_checkpoint` for the format."""
        entries = self.var_manager.snapshot()
        var_checkpoint.write(path, entries)
        return [e.name for e in entries]

    def restore_variables(self, path: str | os.PathLike) -> list[str]:
        """Set the session's variables from the checkpoint at ``path``; returns the names
        restored. Variables the session does not have yet are created (a graph that
        declares one later uses the restored value); one it has must have the same
        dtype and shape, else :class:`CheckpointError` names it and nothing changes."""
        try:
            p = os.fspath(path)
        except TypeError:
            raise CheckpointError(
                f"a checkpoint path is a str or os.PathLike, got {type(path).__name__}"
            ) from None
        entries = var_checkpoint.read(p)
        return self.var_manager.restore(entries, f"checkpoint {p!r}")

    def close(self) -> None:
        """Free the session's VarManager memory."""
        VarManagerPool.instance().destroy(self.id)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def _calibrating(opts: config.Options) -> Iterator[None]:
    """Have the measured device spec the fusion stage needs found on a background thread
    while the body runs (read from the cache folder, else measured: :func:`~geode.
    costmodel.device.start_calibration`), for a compile that runs the pipeline with the
    fusion plan search (which scores plans by measured rates; a greedy compile plans on
    the untimed spec, :func:`geode.codegen.driver.plan_spec`, and measures nothing); a
    body that stops early (an error before the fusion stage) waits for it: nothing of a
    compile goes on after it returns."""
    if not (opts.codegen and opts.fusion and opts.fusion_search != "greedy"):
        yield
        return
    from geode.costmodel.device import start_calibration, wait_calibration

    start_calibration(opts.cache_dir)
    try:
        yield
    finally:
        wait_calibration(opts.cache_dir)


def _model_cache_key(g: Graph, opts: config.Options) -> str | None:
    """The model cache's key for compiling ``g`` with ``opts``, or None to compile
    without it."""
    from geode.modelfile import cache

    return cache.cache_key(g, opts) if cache.usable(g, opts) else None


def _store_model(model: CompiledModel, key: str, opts: config.Options) -> None:
    """Put a freshly compiled model into the model cache (with its initial variables)."""
    from geode.modelfile import cache

    saver = model.saver

    def save(path: os.PathLike, max_bytes: int) -> int:
        # a cache; a key-tiled body stays IR (the cold compile pays no LLVM for it)
        return saver(path, True, "embed", "initial", max_bytes, sync=False, bodies=False)

    cache.store(opts.cache_dir, key, (opts.cache_max_mb << 20) // 8, save, opts.cache_sign)


def _saver(model: CompiledModel, g: Graph, units: list[Unit], explain, dot) -> Callable:
    """``model``'s ``save(path, overwrite, external_data)``: writes its model file."""

    def save(
        path: str | os.PathLike,
        overwrite: bool,
        external_data: str,
        snapshot: str = "current",
        max_bytes: int | None = None,
        sync: bool = True,
        bodies: bool = True,
    ) -> int:
        from geode.modelfile import save_model

        return save_model(
            model, g, units, explain, dot, path, overwrite, external_data, snapshot, max_bytes,
            sync, bodies,
        )  # fmt: skip

    return save


class _Explain:
    """Builds ``model.explain()`` text lazily."""

    def __init__(
        self,
        g: Graph,
        placement: Placement,
        units: list[Unit],
        plan_text: str,
        pass_text: str,
        vm: VarManager,
        timings: dict[str, float],
    ):
        self.g, self.placement, self.units = g, placement, units
        self.plan_text, self.pass_text, self.vm, self.timings = plan_text, pass_text, vm, timings
        self.memory_text = ""
        self.chain_text = ""
        self.engine_partition: EnginePartition | None = None

    def dot(self) -> str:
        """Graphviz DOT of the compiled graph: a cluster per native kernel, engines as
        colours, a box per engine subgraph with its PlaceHolder and End nodes."""
        from geode.viz import Cluster, to_dot

        clusters = [
            Cluster(
                u.name,
                f"{u.name} [{u.extra.get('pattern', u.engine)}]",
                [n.name for n in u.nodes],
                u.engine,
            )
            for u in self.units
            if u.engine == "aicore"
        ]
        return to_dot(
            self.g,
            self.placement,
            clusters,
            kernels=[u.info for u in self.units],
            engine_partition=self.engine_partition,
        )

    def __call__(self) -> str:
        g = self.g
        lines = [f"model {g.name}"]
        lines.append("inputs: " + ", ".join(f"{v.name}: {v.desc}" for v in g.inputs))
        lines.append("outputs: " + ", ".join(f"{v.name}: {v.desc}" for v in g.outputs))
        if g.symbols.broadcasts:
            groups = "; ".join(
                f"{', '.join(map(str, dims))} ({where})" for dims, where in g.symbols.broadcasts
            )
            lines.append(f"broadcasts (checked at run time: equal or 1): {groups}")
        lines.append(
            f"compile time: {self.timings.get('total', 0.0) * 1e3:.1f} ms "
            f"(passes {self.timings.get('passes', 0.0) * 1e3:.1f} ms, "
            f"codegen {self.timings.get('codegen', 0.0) * 1e3:.1f} ms)"
        )
        lines.append("passes:")
        lines.append(self.pass_text or "  (none)")
        lines.append("partitions:")
        lines.append("  " + self.placement.describe().replace("\n", "\n  "))
        lines.append("fusion plan:")
        lines.append("  " + self.plan_text.replace("\n", "\n  "))
        kernels = [u for u in self.units if u.engine not in NO_STEP]
        lines.append(f"kernels ({len(kernels)}):")
        for u in kernels:
            ops = ", ".join(f"{n.op_type}:{n.name}" for n in u.nodes)
            cost = ""
            if u.info.cost:
                cost = " cost " + ", ".join(f"{k}={v:.3g}" for k, v in u.info.cost.items())
            lines.append(f"  {u.name} [{u.engine}] {ops}{cost}")
            if u.extra.get("kernel_key"):
                note = u.extra.get("schedule_note", "default")
                lines.append(f"    key {u.extra['kernel_key']}, schedule: {note}")
            if u.extra.get("weights"):
                lines.append(f"    weights: {u.extra['weights']}")
        lines.append(_schedule_summary(kernels))
        views = [u for u in self.units if u.engine == ALIAS]
        lines.append(f"views ({len(views)}): aliases in the memory plan, no kernel, no step")
        for u in views:
            n = u.nodes[0]
            lines.append(
                f"  {u.name} [{ALIAS}] {n.op_type}:{n.name}: alias of {u.inputs[0].name} "
                f"(view: {u.extra.get('view', '')})"
            )
        writes = [u for u in self.units if u.engine == COMMIT]
        if writes:
            lines.append(f"variable writes ({len(writes)}): once every step has run, no step")
            for u in writes:
                var = u.nodes[0].inputs[0]
                lines.append(f"  {var.name}: {var.desc} <- {u.inputs[0].name} [{COMMIT}]")
        if self.engine_partition is not None:
            lines.append(self.engine_partition.describe())
        if self.memory_text:
            lines.append(self.memory_text)
        if self.chain_text:
            lines.append(self.chain_text)
        lines.append(
            f"variables and constants: {len(list(self.vm.keys()))} keys, "
            f"{self.vm.nbytes} bytes, {self.vm.dedup_saved_bytes} bytes saved by dedup"
        )
        return "\n".join(lines)


def _schedule_summary(units: list[Unit]) -> str:
    """``schedules: ...``: how many kernels got a given, a tuned or the default schedule,
    naming the given and tuned ones."""
    by: dict[str, list[str]] = {}
    for u in units:
        if u.extra.get("kernel_key"):
            by.setdefault(str(u.extra.get("schedule", "default")), []).append(u.name)
    parts = []
    for origin, what in (
        ("given", "given"),
        ("tuned", "tuned"),
        ("tuned-default", "tuned (default kept)"),
    ):
        names = by.get(origin, [])
        if names:
            parts.append(f"{len(names)} {what} ({', '.join(names)})")
    parts.append(f"{len(by.get('default', []))} default")
    return "schedules: " + ", ".join(parts)


_default: Session | None = None
_control_flow: Session | None = None
_control_flow_lock = threading.Lock()


def control_flow_session() -> Session:
    """The session private to control flow: it owns every compiled subgraph's constants."""
    global _control_flow
    with _control_flow_lock:
        if _control_flow is None:
            _control_flow = Session()
        return _control_flow


def compile_subgraph(body: Graph) -> CompiledModel:
    """Compile an If/Loop/Scan body in the control-flow session (the subgraph compiler
    this module installs in :mod:`geode.compiler.ops.control`)."""
    return control_flow_session().compile(body, dynamic_dims=())  # buckets: the outer graph's


control.set_subgraph_compiler(compile_subgraph)


def default_session() -> Session:
    """The process-wide session used by ``geode.compile``."""
    global _default
    if _default is None:
        _default = Session()
    return _default
