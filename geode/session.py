"""Session: owns a VarManager and drives compiler -> codegen -> runtime.

``Session.compile(graph)`` copies the user's graph (it is never modified), runs the
compile stages of :mod:`geode.spine` on the copy, and returns a
:class:`CompiledModel` whose constants and variables live in this session's
VarManager.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from typing import Any

from geode import config
from geode.compiler.ir import Graph, format_graph
from geode.compiler.ops import control
from geode.compiler.partition.placement import Placement
from geode.debug import Dumper, log
from geode.errors import GraphError
from geode.plan_builder import ALIAS, Unit, held_keys
from geode.runtime.model import CompiledModel
from geode.runtime.var_manager import VarManager, VarManagerPool
from geode.spine import Compilation, compile_graph


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
        dump = Dumper(graph.name, opts.debug, opts.dump_dir)
        g = graph.copy()
        prefix = f"m{next(self._models)}:{g.name}"
        c = compile_graph(Compilation(g, opts, dump, self.var_manager, prefix))
        units, timings = c.units, c.timings
        explain = _Explain(
            g, c.placement, units, c.fusion_text, c.pass_text, self.var_manager, timings
        )
        explain.memory_text = c.plan.memory_text
        kernels = [u.info for u in units if u.engine != ALIAS]  # a view is no kernel
        model = CompiledModel(c.plan, self.var_manager, kernels, explain, {"timings": timings})
        # the model's constants and variables leave the session with the model
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
        return model

    def close(self) -> None:
        """Free the session's VarManager memory."""
        VarManagerPool.instance().destroy(self.id)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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

    def dot(self) -> str:
        """Graphviz DOT of the compiled graph: a cluster per native kernel, engines as colours."""
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
        return to_dot(self.g, self.placement, clusters, kernels=[u.info for u in self.units])

    def __call__(self) -> str:
        g = self.g
        lines = [f"model {g.name}"]
        lines.append("inputs: " + ", ".join(f"{v.name}: {v.desc}" for v in g.inputs))
        lines.append("outputs: " + ", ".join(f"{v.name}: {v.desc}" for v in g.outputs))
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
        kernels = [u for u in self.units if u.engine != ALIAS]
        lines.append(f"kernels ({len(kernels)}):")
        for u in kernels:
            ops = ", ".join(f"{n.op_type}:{n.name}" for n in u.nodes)
            cost = ""
            if u.info.cost:
                cost = " cost " + ", ".join(f"{k}={v:.3g}" for k, v in u.info.cost.items())
            lines.append(f"  {u.name} [{u.engine}] {ops}{cost}")
        views = [u for u in self.units if u.engine == ALIAS]
        lines.append(f"views ({len(views)}): aliases in the memory plan, no kernel, no step")
        for u in views:
            n = u.nodes[0]
            lines.append(
                f"  {u.name} [{ALIAS}] {n.op_type}:{n.name}: alias of {u.inputs[0].name} "
                f"(view: {u.extra.get('view', '')})"
            )
        if self.memory_text:
            lines.append(self.memory_text)
        lines.append(
            f"variables and constants: {len(list(self.vm.keys()))} keys, "
            f"{self.vm.nbytes} bytes, {self.vm.dedup_saved_bytes} bytes saved by dedup"
        )
        return "\n".join(lines)


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
    return control_flow_session().compile(body)


control.set_subgraph_compiler(compile_subgraph)


def default_session() -> Session:
    """The process-wide session used by ``geode.compile``."""
    global _default
    if _default is None:
        _default = Session()
    return _default
