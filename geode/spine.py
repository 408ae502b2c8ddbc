"""The spine: every stage of a compile, in order, one line each.

``compile_graph`` runs :data:`STAGES` over a :class:`Compilation` (the graph being
compiled and everything the stages derive from it). Each stage is a function of the
compilation that fills in its part; its room is the module named beside it:

=============  ==========================================================
verify         ``geode/compiler/ir.py`` (``Graph.verify``)
infer_shapes   ``geode/compiler/ops/registry.py`` (every op's verify + infer_shape)
graph_passes   ``geode/compiler/pipeline.py`` (``geode/compiler/passes/``)
place          ``geode/compiler/partition/placement.py`` (``assign_engines``)
partition      ``geode/compiler/partition/placement.py`` (``split_partitions``)
fuse           ``geode/compiler/fusion/planner.py`` (groups and their order)
lower          ``geode/codegen/lower.py`` (group -> loop AST)
schedule       ``geode/codegen/autoschedule.py`` (``geode/codegen/schedule/``)
emit           ``geode/codegen/driver.py`` ``emit_kernel`` (the backend)
bind           ``geode/runtime/engines.py`` (the engines' steps; views become aliases;
               library ops natively: ``codegen/driver.py`` MatMul, ``codegen/native_conv.py``
               Conv)
engines        ``geode/compiler/partition/engine.py`` (per-engine subgraphs with
               PlaceHolder/End boundaries, for ``explain()`` and the DOT picture)
plan           ``geode/plan_builder.py`` (slots, memory plan with aliases, runtime Plan)
=============  ==========================================================

A group whose lower, schedule or emit stage fails runs node by node on the AICPU
engine, with a :class:`~geode.codegen.driver.CodegenWarning`: a user never loses a
result to a codegen bug.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import geode.config as config
from geode import collector
from geode.codegen import driver
from geode.codegen.ast import forget_expression_memos
from geode.codegen.cache import maybe_prune
from geode.codegen.epilogues import attach_epilogues
from geode.codegen.lower import make_can_lower
from geode.codegen.schedule_source import schedule_sources
from geode.compiler.fusion.groups import FusionPlan
from geode.compiler.fusion.planner import plan_fusion, schedule_units
from geode.compiler.fusion.profit import make_profit
from geode.compiler.fusion.views import alias_view
from geode.compiler.ir import Graph, Node, format_graph
from geode.compiler.ops import state
from geode.compiler.ops.nn import FUSED_CONV
from geode.compiler.partition.engine import EnginePartition, partition_engines
from geode.compiler.partition.placement import (
    Placement,
    assign_engines,
    input_symbols,
    split_partitions,
)
from geode.compiler.passes.variables import SessionVariable
from geode.compiler.pipeline import PassRecord, run_pipeline
from geode.debug import Dumper, log
from geode.errors import GeodeError, GraphError, UserScheduleError
from geode.plan_builder import (
    ALIAS,
    COMMIT,
    NO_STEP,
    Unit,
    alias_unit,
    bind_units,
    build_plan,
    commit_unit,
    drop_dead_units,
    reference_unit,
    var_query_unit,
)
from geode.progress import progress_bar
from geode.runtime.plan import Plan
from geode.runtime.var_manager import VarManager


@dataclass
class Compilation:
    """One compile in progress: its inputs, then what each stage derives."""

    graph: Graph  # a copy of the user's graph; the stages change it in place
    opts: config.Options
    dump: Dumper
    var_manager: VarManager
    key_prefix: str  # of this model's constants and variables in the VarManager
    pass_records: list[PassRecord] = field(default_factory=list)
    #: the fuse_conv and row_scale passes' decisions (node name -> line), shown with the
    #: fusion plan's dense epilogues
    conv_decisions: dict[str, str] = field(default_factory=dict)
    placement: Placement | None = None
    fusion: FusionPlan | None = None
    #: the fusion plan's order of work: single nodes and groups on their way to kernels
    work: list[Node | driver.KernelJob] = field(default_factory=list)
    units: list[Unit] = field(default_factory=list)
    #: the per-engine subgraphs of the bound units (GE's EnginePartitioner)
    engine_partition: EnginePartition | None = None
    plan: Plan | None = None
    timings: dict[str, float] = field(default_factory=dict)
    #: codegen failures that fell back to a reference kernel (each gave a CodegenWarning)
    fallbacks: int = 0
    #: the IR of the library modules the schedule stage started (``driver.start_library``)
    library_modules: list[str] = field(default_factory=list)

    @property
    def fuses(self) -> bool:
        """Whether AI Core nodes are fused and compiled (else each runs on AICPU)."""
        return self.opts.codegen and self.opts.fusion

    @property
    def jobs(self) -> list[driver.KernelJob]:
        """The groups still on their way to a native kernel (not fallen back)."""
        return [j for j in self.work if isinstance(j, driver.KernelJob) and not j.failed]

    @property
    def pass_text(self) -> str:
        """What each graph pass did, one line each."""
        return "\n".join(
            f"  {r.name}: {'changed' if r.changed else 'no change'} "
            f"({r.nodes_before} -> {r.nodes_after} nodes)"
            for r in self.pass_records
        )

    @property
    def fusion_text(self) -> str:
        """The fusion plan, as ``model.explain()`` shows it."""
        if self.fusion is None:
            return "fusion: off (every node runs on its own)"
        return self.fusion.describe()


def verify(c: Compilation) -> None:
    """Check the graph's structure (outputs exist, values belong to it, no cycles)."""
    if not c.graph.outputs:
        raise GraphError(f"graph {c.graph.name!r} has no outputs; call graph.output(...)")
    c.graph.verify()


def infer_shapes(c: Compilation) -> None:
    """Verify every node against its op prototype and infer its outputs' descs."""
    c.graph.infer_shapes()
    c.dump.stage("input_graph", format_graph(c.graph), level=2)


def graph_passes(c: Compilation) -> None:
    """Run the graph pass pipeline to a fixed point (fold, simplify, decompose, CSE, DCE)."""
    opts, dump = c.opts, c.dump
    c.pass_records = run_pipeline(
        c.graph,
        disabled=(*opts.disabled_passes, *(() if opts.row_scale_gemms else ("row_scale",))),
        enabled=("freeze_variables",) if opts.freeze_variables else (),
        fold_limit=opts.const_fold_limit,
        session_variables=session_variables(c.var_manager),
        decisions=c.conv_decisions,
        on_pass=lambda name, gr, changed: (
            dump.stage(f"after_{name}", format_graph(gr), level=2)
            if changed and dump.wants(2)
            else None
        ),
    )
    dump.stage("passes", c.pass_text, level=1)
    c.graph.sort()


def session_variables(vm: VarManager) -> dict[str, SessionVariable]:
    """What the session's VarManager knows of its variables, for the variable passes."""
    return {k.name: SessionVariable(k.format, vm.is_initialized(k)) for k in vm.variables()}


def place(c: Compilation) -> None:
    """Place every node on an engine: AI Core, AICPU or host."""
    c.placement = assign_engines(c.graph, codegen=c.opts.codegen)


def partition(c: Compilation) -> None:
    """Split the placed graph into known-shape and unknown-shape partitions."""
    split_partitions(c.graph, c.placement)
    c.dump.stage("placement", c.placement.describe())


def fuse(c: Compilation) -> None:
    """Plan fusion groups (legal and worth it) and order the groups and other nodes."""
    if not c.fuses:
        c.work = list(c.graph.nodes)
        return
    profit_spec = driver.plan_spec(c.opts)
    profit = make_profit(profit_spec)
    can_lower = make_can_lower(c.graph)
    trees = bool(c.opts.stitch_fusion)
    c.fusion = plan_fusion(c.graph, c.placement, can_lower, profit, trees=trees)
    if c.opts.fusion_search == "beam":
        from geode.compiler.fusion.search import search_fusion  # the plan search's only use

        cost = driver.group_cost_fn(c.graph, c.opts)
        c.fusion = search_fusion(c.graph, c.placement, can_lower, cost, c.fusion, trees=trees)
    c.fusion.epilogues[:0] = c.conv_decisions.values()
    c.fusion.device = profit_spec.source()
    c.dump.stage("fusion_plan", c.fusion.describe())
    c.work = [
        item if isinstance(item, Node) else driver.KernelJob(f"fused_{k}", item)
        for k, item in enumerate(schedule_units(c.graph, c.fusion))
    ]
    c.work = attach_epilogues(c.work, c.graph, c.opts, c.fusion, profit_spec)


def lower(c: Compilation) -> None:
    """Lower every group to a loop AST."""
    for job in c.jobs:
        _codegen_stage(c, job, driver.lower_job)


def schedule(c: Compilation) -> None:
    """Schedule every group's loop AST (tile, inline, reduce, parallelize, vectorize):
    with the schedule given for its kernel key, its tuned one, or the default."""
    sources = schedule_sources(c.opts)
    _start_libraries(c)

    def stage(job: driver.KernelJob, g: Graph, opts: config.Options, dump: Dumper) -> None:
        driver.schedule_job(job, g, opts, dump, sources)
        driver.start_emit(job, opts, g)  # LLVM on it while the next kernels are scheduled

    for job in c.jobs:
        _codegen_stage(c, job, stage)
        collector.release()  # LLVM has work: collections now share the cores with it
    unused = sources.unused()
    if unused:
        msg = (
            f"schedules given for kernel keys {unused} match no kernel of {c.graph.name!r} "
            "(model.explain() lists its kernels' keys)"
        )
        warnings.warn(msg, UserWarning, stacklevel=3)
        log.warning(msg)


def _conv_library() -> ModuleType:
    from geode.codegen import native_conv

    return native_conv


def _pool_library() -> ModuleType:
    from geode.codegen import native_pool

    return native_pool


def _rnn_library() -> ModuleType:
    from geode.codegen import native_rnn

    return native_rnn


#: the native library code of single AICPU nodes by op type: what imports its module,
#: its function starting the node's module ahead, and its function choosing the node's
#: step. A module is imported on the first node of its ops (an LSTM's code generator
#: alone is ~18 ms of a cold compile's main thread before its first kernel; a model with
#: no LSTM never needs it); each function checks the node's domain itself
_NATIVE_LIBRARIES: dict[str, tuple[Callable[[], ModuleType], str, str]] = {
    "Conv": (_conv_library, "start_conv", "conv_interface"),
    FUSED_CONV: (_conv_library, "start_conv", "conv_interface"),
    **{
        op: (_pool_library, "start_pool", "pool_interface")
        for op in ("MaxPool", "AveragePool", "GlobalMaxPool", "GlobalAveragePool")
    },
    "LSTM": (_rnn_library, "start_lstm", "rnn_interface"),
}


def _native_library(node: Node, which: int) -> Callable[..., Any] | None:
    """The start (``which`` 1) or interface (2) function of ``node``'s op type in
    :data:`_NATIVE_LIBRARIES`, its module imported now; None for other op types."""
    entry = _NATIVE_LIBRARIES.get(node.op_type)
    if entry is None:
        return None
    return getattr(entry[0](), entry[which])


def _library_starts(node: Node) -> tuple[Callable[..., str | None], ...]:
    """What starts a single AICPU node's library module ahead (the first that takes it)."""
    start = _native_library(node, 1)
    return (driver.start_library,) if start is None else (driver.start_library, start)


def _start_libraries(c: Compilation) -> None:
    """Start LLVM on the library modules the bind stage will link for the single nodes on
    AICPU (a MatMul run natively: ``driver.start_library``; a conv, pool or LSTM: their
    modules' ``start_*``), so they compile beside the kernels on the background threads
    rather than one after another on this one; one that cannot be started is left to
    bind."""
    for item in c.work:
        if isinstance(item, Node) and c.placement.engine.get(item.name) == "aicpu":
            for start in _library_starts(item):
                try:
                    ir = start(item, c.graph, c.opts)
                except Exception:  # noqa: BLE001 - bind meets the same error and reports it
                    continue
                if ir is not None:
                    c.library_modules.append(ir)
                    break


def emit(c: Compilation) -> None:
    """Compile every scheduled kernel to native code (through the kernel cache). Every
    module, a GEMM entry's too, went to the background threads at the schedule stage;
    this thread claims them, compiling queued ones while it waits. The GEMMs with an
    epilogue go first (the order changes no kernel)."""
    jobs = sorted(c.jobs, key=lambda job: job.panel is None)
    title = f"geode: compiling {c.graph.name}"
    bar = progress_bar(len(jobs), title, c.opts.progress, unit="kernel")
    for job in jobs:
        _codegen_stage(c, job, driver.emit_job)
        if not job.failed:
            _codegen_stage(c, job, driver.interface_job)
        bar.update()
    bar.close()
    if c.fuses:
        maybe_prune(c.opts.cache_dir, c.opts.cache_max_mb << 20)


def bind(c: Compilation) -> None:
    """A unit per step (native kernels, and single nodes on AICPU or host), each bound
    to its engine's step, and an alias unit per view node left on its own (no step);
    units whose results nothing reads are dropped."""
    units: list[Unit] = []
    bound = input_symbols(c.graph)
    for item in c.work:
        if isinstance(item, Node):
            units.append(_node_unit(c, item, bound))
        elif item.failed:
            units += [_node_unit(c, n, bound) for n in _nodes_of(item)]
        elif item.panel is not None:
            nodes = item.panel.nodes
            for n in nodes:
                if n.op_type == "MatMul":
                    how = "geode's packed-weight GEMM" if n.name in item.packed_nodes else "BLAS"
                    c.placement.engine[n.name] = "aicore"
                    c.placement.reason[n.name] = f"library op: {how} with a fused epilogue"
            unit = Unit(
                item.name, "aicore", nodes, item.inputs, item.outputs, item.interface, item.info
            )
            unit.extra["pattern"] = "dense+" + item.panel.epilogue.group.pattern_name()
            if item.weights:
                unit.extra["weights"] = item.weights
            _note_schedule(unit, item)
            units.append(unit)
        else:
            lowered = item.lowered
            nodes = list(item.group.nodes)
            unit = Unit(
                item.name,
                "aicore",
                nodes,
                list(lowered.inputs),
                list(lowered.outputs),
                item.interface,
                item.info,
            )
            unit.extra["pattern"] = item.group.pattern_name()
            _note_schedule(unit, item)
            units.append(unit)
    c.units = drop_dead_units(units, c.graph) if c.fuses else units
    bind_units(c.units)


def _note_schedule(unit: Unit, job: driver.KernelJob) -> None:
    """Record the kernel's key and where its schedule came from (for ``explain()``)."""
    unit.extra["kernel_key"] = job.kernel_key
    if job.schedule_choice is not None:
        unit.extra["schedule"] = job.schedule_choice.origin
        unit.extra["schedule_note"] = job.schedule_choice.describe()


def _nodes_of(job: driver.KernelJob) -> list[Node]:
    """A failed job's model nodes (each then runs on its own: natively, as an alias, or
    its reference kernel); a failed epilogue's are its MatMuls' and its group's."""
    return job.panel.nodes if job.panel is not None else list(job.group.nodes)


def _node_unit(c: Compilation, node: Node, bound: set) -> Unit:
    """The unit of a node outside any kernel: a variable's write at the end of the run
    (VarRef), a question to the session (VarIsInitialized), an alias (a view of a known
    shape), a library routine called natively (MatMul: BLAS), or its reference kernel."""
    if state.is_write(node):
        raise GraphError(
            f"{node.where} writes variable {node.inputs[0].name!r}, but the variable_prepare "
            "pass, which gives writes their meaning, did not run: do not disable it"
        )
    if state.is_var_ref(node):
        c.placement.engine[node.name] = COMMIT
        c.placement.reason[node.name] = (
            f"writes variable {node.inputs[0].name!r} once the run's steps have run: no step"
        )
        return commit_unit(node)
    if state.is_var_query(node):
        c.placement.reason[node.name] = "asks the session's VarManager at run time"
        return var_query_unit(node, c.var_manager)
    view = alias_view(node, bound)
    if view is not None:
        c.placement.engine[node.name] = ALIAS
        c.placement.reason[node.name] = (
            f"view ({view.describe()}) of {node.inputs[0].name!r}: an alias in the memory "
            "plan, no step"
        )
        return alias_unit(node, view)
    engine = c.placement.engine[node.name]
    library = driver.library_interface(node, c.graph, c.opts) if engine == "aicpu" else None
    reason, weights = "library op: BLAS, called natively", ""
    choose = _native_library(node, 2) if engine == "aicpu" else None
    if choose is not None:
        # Conv (im2col + BLAS, depthwise), pools (direct) and LSTM (vectorized products and
        # gate loop): native, or why not
        choice = choose(node, c.graph, c.opts)
        if choice is not None:
            c.fallbacks += choice.fallback
            c.placement.reason[node.name] = reason = choice.reason
            weights = choice.weights
            library = None if choice.interface is None else (choice.interface, choice.info)
    if library is not None:  # a library routine called natively (MatMul; Conv; pools; LSTM)
        interface, info = library
        c.placement.engine[node.name] = "aicore"
        if getattr(interface.fn, "packed_n", 0):
            reason = "library op: geode's packed-weight GEMM, called natively"
        c.placement.reason[node.name] = reason
        inputs = driver.library_inputs(node, interface)  # a weight packed once, if so
        unit = Unit(node.name, "aicore", [node], inputs, list(node.outputs), interface, info)
        if node.op_type == "MatMul" and info.trace:
            unit.extra["weights"] = info.trace
        if weights:
            unit.extra["weights"] = weights
        return unit
    return reference_unit(node, "aicpu" if engine == "aicore" else engine)


def engines(c: Compilation) -> None:
    """Cut the bound graph into per-engine subgraphs with PlaceHolder/End boundaries
    (GE's EnginePartitioner): what ``explain()`` and the DOT picture show of engines."""
    engine_of = {n.name: u.engine for u in c.units for n in u.nodes}
    step_of = {n.name: u.name for u in c.units for n in u.nodes if u.engine not in NO_STEP}
    c.engine_partition = partition_engines(c.graph, engine_of, step_of, sorted(NO_STEP))
    c.dump.stage("engine_partition", c.engine_partition.describe())


def plan(c: Compilation) -> None:
    """The runtime plan: a slot per value, constants and variables registered with the
    VarManager, the activation memory plan."""
    chains = driver.chain_builder(c.opts, c.dump)
    c.plan = build_plan(c.graph, c.units, c.var_manager, c.key_prefix, chains)
    c.plan.memory_limit = c.opts.memory_limit_mb << 20
    c.dump.stage("memory_plan", c.plan.memory_text)


Stage = Callable[[Compilation], None]

# fmt: off
STAGES: list[tuple[str, Stage]] = [
    ("verify", verify),
    ("infer_shapes", infer_shapes),
    ("graph_passes", graph_passes),
    ("place", place),
    ("partition", partition),
    ("fuse", fuse),
    ("lower", lower),
    ("schedule", schedule),
    ("emit", emit),
    ("bind", bind),
    ("engines", engines),
    ("plan", plan),
]
# fmt: on


def compile_graph(c: Compilation) -> Compilation:
    """Run every stage on ``c`` in order; ``c.timings`` gets each stage's seconds, plus
    ``passes`` (verify to graph passes), ``codegen`` (place to bind) and ``total``.
    A bad backend setting (or the numba backend without numba) raises before any stage."""
    t0 = time.perf_counter()
    driver.check_backend_settings(c.opts)
    try:
        for name, stage in STAGES:
            t = time.perf_counter()
            stage(c)
            c.timings[name] = time.perf_counter() - t
    finally:
        _abandon_unlinked(c)
        forget_expression_memos()
    tm = c.timings
    tm["passes"] = tm["verify"] + tm["infer_shapes"] + tm["graph_passes"]
    tm["codegen"] = sum(tm[s] for s in ("fuse", "lower", "schedule", "emit", "bind"))
    tm["total"] = time.perf_counter() - t0
    return c


def compile_until(c: Compilation, last: str) -> Compilation:
    """Run the stages of :data:`STAGES` on ``c`` up to and including ``last`` (the tuner
    stops after ``lower``: it schedules and compiles each kernel itself)."""
    names = [name for name, _ in STAGES]
    if last not in names:
        raise GeodeError(f"no compile stage {last!r}; the stages are {names}")
    driver.check_backend_settings(c.opts)
    try:
        for name, stage in STAGES[: names.index(last) + 1]:
            t = time.perf_counter()
            stage(c)
            c.timings[name] = time.perf_counter() - t
    finally:
        _abandon_unlinked(c)
    return c


def _abandon_unlinked(c: Compilation) -> None:
    """Cancel the background LLVM runs of kernels never linked (a stage failed, or the
    compile stopped before ``emit``): none goes on after the compile returns."""
    for job in c.work or ():
        if isinstance(job, driver.KernelJob):
            driver.abandon_emit(job)
    for ir in c.library_modules:
        driver.abandon_library(ir)


def _codegen_stage(
    c: Compilation,
    job: driver.KernelJob,
    stage: Callable[[driver.KernelJob, Graph, config.Options, Dumper], None],
) -> None:
    """Run a codegen stage on one group; a failure makes the group fall back, loudly."""
    t0 = time.perf_counter()
    try:
        stage(job, job.graph_of(c.graph), c.opts, c.dump)
    except UserScheduleError:
        raise  # the user's schedule is wrong: no fall-back hides it
    except Exception as exc:  # noqa: BLE001 - any codegen failure falls back, loudly
        job.error = exc
        c.fallbacks += 1
        group = job.group
        msg = (
            f"group {group.id} ({len(group.nodes)} ops) falls back to AICPU: "
            f"{type(exc).__name__}: {exc}"
        )
        warnings.warn(msg, driver.CodegenWarning, stacklevel=4)
        log.warning(msg)
        if not isinstance(exc, GeodeError) and c.opts.debug >= 2:
            log.exception("codegen failure")
    finally:
        job.seconds += time.perf_counter() - t0
