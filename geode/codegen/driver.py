"""Codegen for one fused group, stage by stage: lower -> schedule -> emit -> interface.

The spine (:mod:`geode.spine`) calls these for every group of the fusion plan, one
stage over all groups at a time; a :class:`KernelJob` carries a group through them.
``emit_kernel`` is the one place a backend compiles a scheduled kernel; the runtime's
AI Core engine builds the step from the backend-neutral interface that
:func:`native_interface` describes (:class:`geode.runtime.engines.NativeKernel`).
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from geode.codegen import ast as A
from geode.codegen.dense import (
    PanelGraph,
    TiledBody,
    abandon_dense,
    cached_build,
    dense_kernel,
    dense_module,
    panel_graph,
    start_dense,
    stored,
    tiled_source,
)
from geode.codegen.indexing import exprs_equal
from geode.codegen.kernel_key import canonical_kernel, canonical_lowered, kernel_key
from geode.codegen.lower import LoweredKernel, first_binders, lower_group, unbound_dim
from geode.codegen.packed_weights import PackChoice, choose_packing, packed_value
from geode.codegen.schedule import Schedule
from geode.codegen.schedule_source import ScheduleChoice, ScheduleSources, apply_choice
from geode.codegen.winograd_weights import winograd_value
from geode.compiler.fusion.groups import Group
from geode.compiler.fusion.profit import describe_work
from geode.compiler.ir import Graph, Node, Value
from geode.compiler.shapes import compile_dim_fn, compile_shape_fn, free_symbols
from geode.config import Options, stream_min_bytes
from geode.costmodel.device import DeviceSpec, cached_spec, untimed_spec
from geode.debug import Dumper, log
from geode.errors import CodegenError, GeodeError
from geode.lazy import require_numba
from geode.runtime.engines import IndexBound, NativeKernel, View
from geode.runtime.model import KernelInfo


def device_spec(cache_dir: str) -> DeviceSpec:
    """The calibrated device spec (measured once per machine, cached on disk and in memory)."""
    return cached_spec(cache_dir)


def plan_spec(opts: Options) -> DeviceSpec:
    """The device spec a compile under ``opts`` plans and schedules with: the calibrated
    one (:func:`device_spec`) when the fusion plan search scores plans by measured rates,
    else the untimed one (:func:`~geode.costmodel.device.untimed_spec`: this machine's
    cores and caches, nominal rates), so a greedy compile measures nothing."""
    if opts.fusion_search != "greedy":
        return device_spec(opts.cache_dir)
    return untimed_spec()


def object_cache(opts: Options) -> Any:
    """The LLVM backend's object cache for ``opts``: its folder and whether its entries
    are signed (a :class:`~geode.codegen.backends.llvm.objcache.CacheLocation`)."""
    from geode.codegen.backends.llvm.objcache import CacheLocation

    return CacheLocation(opts.cache_dir, opts.cache_sign)


def chain_builder(opts: Options, dump: Any = None, packed: Any = None) -> Any:
    """What gives a plan's chains of native steps their own native entries (the LLVM
    backend's :class:`~geode.codegen.backends.llvm.chain.ChainBuilder`, its modules in
    the object cache of ``opts``, shown to ``dump``); None for the numba backend, without
    codegen, or with ``GEODE_CHAIN_ENTRY=0``: the chains loop over their members."""
    if opts.backend != "llvm" or not opts.codegen:
        return None
    from geode.codegen.backends.llvm.chain import ChainBuilder, enabled

    return ChainBuilder(object_cache(opts), packed, dump=dump) if enabled() else None


class CodegenWarning(UserWarning):
    """A group could not be compiled and falls back to the AICPU engine."""


@dataclass
class KernelJob:
    """One fused group on its way to a native kernel; each stage fills in its part."""

    name: str
    group: Group
    lowered: LoweredKernel | None = None
    schedule: Schedule | None = None
    #: its module, emitted and being compiled in the background (:func:`start_emit`)
    emitted: Any = None
    native: Any = None
    interface: NativeKernel | None = None
    info: KernelInfo | None = None
    seconds: float = 0.0  # time spent in codegen stages so far
    error: BaseException | None = field(default=None, repr=False)
    #: a GEMM epilogue: the group is its panel form, over its own graph
    panel: PanelGraph | None = None
    #: a GEMM epilogue's step arguments (model values): A, B and the epilogue's inputs;
    #: its outputs
    inputs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    #: the lowered kernel's structural key (:func:`geode.codegen.kernel_key.kernel_key`)
    kernel_key: str = ""
    #: where its schedule came from (given, tuned or default)
    schedule_choice: ScheduleChoice | None = None
    #: a GEMM epilogue's weight: packed once or through the BLAS, and why
    #: (:class:`~geode.codegen.packed_weights.PackChoice`)
    weights: str = ""
    #: the names of its MatMuls that multiply by a weight packed once
    packed_nodes: tuple[str, ...] = ()
    #: a GEMM epilogue's entry module, being compiled in the background (:func:`start_emit`)
    dense_ir: str = ""
    #: an entry that chooses per call (``Epilogue.switch``): its key-tiled body's panel
    #: graph, lowered kernel, schedule and background module (:func:`_start_tiled`)
    tiled: Any = None

    def graph_of(self, model: Graph) -> Graph:
        """The graph the job's group belongs to: the model's, or its panel graph's."""
        return self.panel.graph if self.panel is not None else model

    @property
    def failed(self) -> bool:
        """Whether a stage failed for this group (it then runs node by node on AICPU)."""
        return self.error is not None


def lower_job(job: KernelJob, g: Graph, opts: Options, dump: Dumper) -> None:
    """Lower the job's group to a loop AST."""
    job.lowered = lower_group(job.group, g, job.name)
    if dump.wants(2):
        dump.stage(f"{job.name}_ast_lowered", A.format_kernel(job.lowered.kernel), level=2)


def schedule_job(
    job: KernelJob, g: Graph, opts: Options, dump: Dumper, sources: ScheduleSources | None = None
) -> None:
    """Schedule the group's loop AST: with the schedule the user gave for its kernel
    key, else its tuned one, else the default of its pattern (see
    :mod:`geode.codegen.schedule_source`). A given or tuned schedule is applied to the
    kernel's canonical form, which then replaces ``job.lowered``."""
    job.kernel_key = kernel_key(job.lowered.kernel)
    choice = sources.choose(job.kernel_key) if sources is not None else ScheduleChoice("default")
    job.schedule_choice = choice
    if dump.wants(2):
        canonical = A.format_kernel(canonical_kernel(job.lowered.kernel, job.name))
        dump.stage(f"{job.name}_ast_canonical", f"# key {job.kernel_key}\n{canonical}", level=2)
    sch = None
    if choice.origin in ("given", "tuned"):
        job.lowered = canonical_lowered(job.lowered)
        sch = apply_choice(choice, job.lowered, job.name, job.kernel_key)
    job.schedule = sch if sch is not None else default_schedule(job.lowered, job.group, opts)
    if dump.wants(2):
        trace = str(job.schedule.trace)
        text = A.format_kernel(job.schedule.kernel) + "\n\n# trace\n" + trace
        dump.stage(f"{job.name}_ast_scheduled", text, level=2)
        dump.stage(f"{job.name}_trace", trace, level=2)


def default_schedule(lowered: LoweredKernel, group: Group, opts: Options) -> Schedule:
    """The default schedule of a lowered group's pattern under ``opts`` (streaming
    thresholds from the device's caches, interleave from the target's registers)."""
    from geode.codegen.autoschedule import schedule_group, stream_interleave

    spec = plan_spec(opts)
    return schedule_group(
        lowered,
        group,
        stream_min_bytes(opts, spec.l3_bytes),
        stream_interleave(vector_registers(opts)),
        stream_min_bytes(opts, spec.l2_bytes),
    )


def group_cost_fn(g: Graph, opts: Options) -> Any:
    """``cost(group) -> seconds``: the projected model's prediction for the kernel a
    fusion group would become under ``opts`` (fitted on this device when a fit was
    saved; the fusion plan search's score)."""
    from geode.codegen.costs import KernelPredictor, group_cost, projected_model

    spec = device_spec(opts.cache_dir)
    predictor = KernelPredictor(
        spec, projected_model(opts.cache_dir, spec), threads=int(opts.num_threads)
    )
    return group_cost(g, predictor, lambda lowered, group: default_schedule(lowered, group, opts))


def vector_registers(opts: Options) -> int:
    """Vector registers of the CPU the ``backend`` option's code generator targets."""
    if opts.backend == "numba":
        from geode.codegen.backends.target import vector_registers as numba_registers

        return numba_registers()
    from geode.codegen.backends.llvm.target import host

    return host().vector_registers


def emit_kernel(kernel: A.Kernel, opts: Options, emitted: Any = None) -> Any:
    """Compile a scheduled kernel with the backend the ``backend`` option names: the native
    kernel object (callable as ``fn(*inputs, *outputs, *dims, threads=n)``, with
    ``source``, ``llvm`` and ``asm`` to inspect). ``emitted``: what :func:`start_emit`
    began for it (LLVM backend)."""
    if opts.backend == "llvm":
        from geode.codegen.autoschedule import choices
        from geode.codegen.backends.llvm.kernel import compile_kernel as llvm_compile

        return llvm_compile(
            kernel,
            fastmath=opts.fastmath,
            cache_dir=object_cache(opts),
            min_work=choices().parallel_min_elements,
            emitted=emitted,
        )
    from geode.codegen.backends.numba import compile_kernel

    native = compile_kernel(kernel, fastmath=opts.fastmath, cache_dir=opts.cache_dir)
    if not opts.lazy_compile:
        native.compile_chunk_functions()
    return native


def check_backend_settings(opts: Options) -> None:
    """Raise :class:`~geode.config.OptionError` for a bad process-wide setting of the
    backend (``GEODE_LLVM_OPT``), and :class:`~geode.errors.MissingDependencyError` for
    the numba backend without numba installed (an optional extra), before any kernel is
    compiled: inside a kernel's stages the error would only make that kernel fall back."""
    if opts.backend == "numba" and opts.codegen:
        require_numba('the numba backend (backend="numba" / GEODE_BACKEND=numba)')
    if opts.backend == "llvm" and opts.codegen:
        from geode.codegen.backends.llvm.optlevel import setting

        setting()


def start_emit(job: KernelJob, opts: Options, model: Graph | None = None) -> None:
    """Begin compiling the job's scheduled kernel (LLVM backend): its module emitted now,
    LLVM started on it on a background thread, so it compiles while the next kernels
    are scheduled; :func:`emit_job` links it. A module that cannot be emitted is left to
    :func:`emit_job`, which raises. A GEMM epilogue's entry module starts too, and for an
    entry that chooses per call (``model`` given) its key-tiled body's kernel
    (:func:`_start_tiled`)."""
    if opts.backend != "llvm" or job.schedule is None:
        return
    from geode.codegen.autoschedule import choices
    from geode.codegen.backends.llvm.kernel import start_compile

    try:
        job.emitted = start_compile(
            job.schedule.kernel,
            fastmath=opts.fastmath,
            cache_dir=object_cache(opts),
            min_work=choices().parallel_min_elements,
        )
    except CodegenError:
        job.emitted = None
    if job.panel is None or job.emitted is None:
        return
    try:
        body = None
        if job.panel.epilogue.switch is not None:
            if model is None:
                return  # left to dense_job
            body = _start_tiled(job, model, opts)
        _, job.dense_ir = dense_module(*_dense_args(job, opts, job.emitted.entry), tiled=body)
    except GeodeError:
        return  # left to dense_job, which raises (or builds the row panels alone)
    start_dense(f"geode_dense_{job.emitted.entry}", job.dense_ir, object_cache(opts))


def abandon_emit(job: KernelJob) -> None:
    """Cancel the job's background LLVM runs nothing claimed: its kernel's when it was
    never linked (a later stage failed), its GEMM entry's (see :func:`start_emit`)."""
    if job.emitted is not None and job.native is None:
        from geode.codegen.backends.llvm.kernel import abandon_compile

        abandon_compile(job.emitted)
    if job.dense_ir:
        abandon_dense(job.dense_ir)


def emit_job(job: KernelJob, g: Graph, opts: Options, dump: Dumper) -> None:
    """Compile the job's scheduled kernel (:func:`emit_kernel`) and dump its code."""
    native = emit_kernel(job.schedule.kernel, opts, job.emitted)
    job.native = native
    if dump.wants(3):
        dump.stage(
            f"{job.name}_source",
            native.source,
            level=3,
            ext="ll" if opts.backend == "llvm" else "py",
        )
    if dump.wants(4) and opts.debug >= 4:
        dump.stage(f"{job.name}_llvm", native.llvm, level=4, ext="ll")
        dump.stage(f"{job.name}_asm", native.asm, level=4, ext="s")


def interface_job(job: KernelJob, g: Graph, opts: Options, dump: Dumper) -> None:
    """Describe the compiled kernel's interface for the runtime and its KernelInfo."""
    if job.panel is not None:
        dense_job(job, g, opts, dump)
        return
    native = job.native
    job.interface = native_interface(job.name, job.lowered, job.schedule.kernel, native, opts)
    job.info = KernelInfo(
        name=job.name,
        ops=list(job.group.nodes),
        engine="aicore",
        source=native.source,
        kind="fused",
        trace=str(job.schedule.trace),
        key=job.kernel_key,
        schedule=job.schedule_choice.origin if job.schedule_choice is not None else "",
        cost=compile_cost(native, job.seconds),
        _llvm=lambda: native.llvm,
        _asm=lambda: native.asm,
    )
    job.info.cost.update(describe_work(job.group, g, plan_spec(opts)))


def compile_cost(native: Any, seconds: float) -> dict[str, float]:
    """What compiling ``native`` cost, for its KernelInfo (``explain()`` prints it): the
    seconds, whether it came from the cache, and the LLVM optimization level its code was
    compiled at (a dense kernel's: its epilogue's, the loop LLVM optimized)."""
    cost = {"compile_s": seconds, "from_cache": float(getattr(native, "from_cache", False))}
    level = getattr(getattr(native, "epilogue", native), "opt_level", None)
    if level is not None:
        cost["opt_level"] = float(level)
    return cost


def native_matmul(node: Node, g: Graph, opts: Options) -> bool:
    """Whether ``node`` is a MatMul the BLAS runs natively (see :func:`library_interface`)."""
    if opts.backend != "llvm" or not opts.codegen or node.op_type != "MatMul":
        return False
    if len(node.inputs) != 2 or any(v is None for v in node.inputs) or len(node.outputs) != 1:
        return False
    a, b = node.inputs
    y = node.outputs[0]
    dtype = str(np.dtype(a.dtype))
    if dtype not in ("float32", "float64") or b.dtype != a.dtype or y.dtype != a.dtype:
        return False
    return (
        a.shape is not None
        and b.shape is not None
        and y.shape is not None
        and (min(len(a.shape), len(b.shape)) >= 2)
        and _sized_before(node, g)
    )


def _sized_before(node: Node, g: Graph) -> bool:
    """Whether every dim of ``node``'s operands and result is bound before it runs (see
    :func:`~geode.codegen.lower.unbound_dim`); the graph is walked only when a dim is not
    the graph inputs' own (the common case needs no walk)."""
    own = set().union(*(free_symbols(v.shape) for v in g.inputs if v.shape is not None))
    dims = set().union(*(free_symbols(v.shape or ()) for v in (*node.inputs, *node.outputs) if v))
    return dims <= own or unbound_dim(node, first_binders(g)) is None


def library_interface(
    node: Node, g: Graph, opts: Options
) -> tuple[NativeKernel, KernelInfo] | None:
    """A library routine as a native AI Core step, or None to keep the node on AICPU:
    MatMul of float32/float64 ``A`` of rank >= 2 by a matrix ``B`` calls the BLAS numpy
    ships from JIT-compiled code (:mod:`geode.codegen.backends.llvm.library`), batched
    operands one GEMM per matrix (:mod:`geode.codegen.backends.llvm.batched`), writing
    straight into the planned output (no Python step, no copy). Only with the LLVM
    backend and codegen on. A dim known only once a value is computed (after a NonZero)
    is bound by then: the step sizes its output from the run's symbols."""
    if not native_matmul(node, g, opts):
        return None
    from geode.codegen.backends.llvm.batched import batched_matmul_kernel
    from geode.codegen.backends.llvm.library import matmul_kernel
    from geode.codegen.backends.llvm.packed import packed_matmul_kernel

    form, choice = _matmul_form(node, opts)
    if form[0] == "packed":
        kernel = packed_matmul_kernel(*form[1:], opts.cache_dir)
    elif form[0] == "blas":
        kernel = matmul_kernel(*form[1:], opts.cache_dir)
    else:
        kernel = batched_matmul_kernel(*form[1:], opts.cache_dir)
    if kernel is None:
        return None
    interface, info = library_step(node, kernel, 2, "", opts)
    if choice is not None:
        info.trace = choice.text
    return interface, info


def _matmul_form(node: Node, opts: Options) -> tuple[tuple, PackChoice | None]:
    """Which library kernel runs native MatMul ``node`` (see :func:`library_interface`),
    as ``(kind, its builder's arguments...)`` (kind ``packed``, ``blas`` or ``batched``),
    and the packing choice (None for a batched ``B``)."""
    a, b = node.inputs
    dtype = str(np.dtype(a.dtype))
    choice = choose_packing(a, b, opts) if len(b.shape) == 2 else None
    if choice is not None and choice.packed:
        return ("packed", len(a.shape), choice.n), choice
    if len(b.shape) == 2:
        return ("blas", dtype, len(a.shape)), choice
    return ("batched", dtype, len(a.shape), len(b.shape)), choice


def start_library(node: Node, g: Graph, opts: Options) -> str | None:
    """Start LLVM, on a background thread, on the module :func:`library_interface` will
    link for ``node`` (a MatMul run natively; nothing for another node), unless this
    process holds it linked or the disk cache its object code: the bind stage then claims
    it instead of compiling it alone at the end of the compile. Returns the module's IR,
    for :func:`abandon_library`, or None when none was started."""
    if not native_matmul(node, g, opts):
        return None
    from geode.codegen.backends.llvm.batched import batched_matmul_ir
    from geode.codegen.backends.llvm.kernel import start_module
    from geode.codegen.backends.llvm.library import blas, matmul_ir
    from geode.codegen.backends.llvm.packed import packed_matmul_ir

    form, _ = _matmul_form(node, opts)
    if form[0] == "packed":
        name, ir = packed_matmul_ir(*form[1:])
    elif blas() is None:
        return None  # no BLAS: library_interface links no module
    elif form[0] == "blas":
        name, ir = matmul_ir(*form[1:])
    else:
        name, ir = batched_matmul_ir(*form[1:])
    start_module(name, ir, opts.cache_dir)
    return ir


def abandon_library(ir: str) -> None:
    """Forget the background LLVM run :func:`start_library` began on ``ir`` if nothing
    claimed it (the node was never bound, or its kernel was held in memory)."""
    from geode.codegen.backends.llvm.kernel import abandon_module

    abandon_module(ir)


def library_inputs(node: Node, interface: NativeKernel) -> list[Value]:
    """The step arguments of library node ``node`` run by ``interface``: its inputs (those
    given), its weight packed once when its kernel multiplies by a packed weight
    (:func:`library_interface`), a conv's weight in its Winograd transform when its kernel
    is the Winograd one, and the packed copies a kernel's ``packed_inputs`` asks for in
    their weights' places (:mod:`geode.codegen.native_rnn`)."""
    inputs = [v for v in node.inputs if v is not None]  # omitted optional inputs
    if getattr(interface.fn, "packed_n", 0):
        inputs[1] = packed_value(inputs[1])
    tiles = getattr(interface.fn, "winograd_weight", ())
    if tiles:
        inputs[1] = winograd_value(inputs[1], tiles)
    # weights a kernel takes packed once, in their places (a native LSTM's W and R)
    for i, form in getattr(interface.fn, "packed_inputs", ()):
        inputs[i] = packed_value(inputs[i], form)
    return inputs


@dataclass
class LibraryChoice:
    """What became of one library node (Conv, pool, LSTM): its native step
    (``interface`` and ``info``, or None to keep the reference kernel) and the
    placement's ``reason``."""

    interface: NativeKernel | None
    info: KernelInfo | None
    reason: str
    #: its native kernel failed to compile (a CodegenWarning was given)
    fallback: bool = False
    #: how it takes its weights (packed once or per call, and why; ``explain()``)
    weights: str = ""


def library_fallback(node: Node, exc: GeodeError) -> LibraryChoice:
    """The reference kernel for ``node``, whose native kernel failed to compile with
    ``exc``: a result is never lost to a codegen bug, but the fall-back is loud (a
    :class:`CodegenWarning` and a log line)."""
    msg = f"{node.op_type} {node.name!r} falls back to AICPU: {exc}"
    warnings.warn(msg, CodegenWarning, stacklevel=4)
    log.warning(msg)
    return LibraryChoice(
        None, None, f"library op: reference kernel ({node.op_type}: {exc})", fallback=True
    )


def library_step(
    node: Node, kernel: Any, n_inputs: int, trace: str, opts: Options
) -> tuple[NativeKernel, KernelInfo]:
    """The native step of a library node run by the LLVM ``kernel`` (its first
    ``n_inputs`` arrays the node's inputs, then its outputs) and its kernel record
    (``trace``: the spec's summary)."""
    interface = NativeKernel(
        name=node.name,
        fn=kernel,
        n_inputs=n_inputs,
        out_shapes=[compile_shape_fn(o.shape) for o in node.outputs],
        out_dtypes=[o.dtype for o in node.outputs],
        threads=int(opts.num_threads),
        launch_threads=True,
        call=kernel.call,
    )
    info = KernelInfo(
        name=node.name,
        ops=[node],
        engine="aicore",
        source=kernel.source,
        kind="library",
        trace=trace,
        cost=compile_cost(kernel, kernel.compile_seconds),
        _llvm=lambda: kernel.llvm,
        _asm=lambda: kernel.asm,
    )
    return interface, info


def native_interface(
    name: str, lowered: LoweredKernel, kernel: A.Kernel, native: Any, opts: Options
) -> NativeKernel:
    """The backend-neutral interface of ``native`` (compiled from the scheduled ``kernel``
    of ``lowered``): dims and output shapes as functions of the run's environment, the
    argument views, the index checks, and how it takes its threads.

    numba's thread count is a setting of the calling thread that outlives the call, so a
    parallel kernel sets its own every time: one left at 1 by another model
    (``num_threads=1``) or by the user's code would otherwise run an all-cores model on
    one core. A chunked kernel sets it in compiled code (its ``threads`` argument); any
    other parallel kernel through ``numba.set_num_threads`` (cost: ``docs/performance.md``).
    An LLVM backend kernel takes its thread count per call (0: the native pool's size).
    """
    parallel = bool(getattr(native, "parallel", True))
    chunked = bool(getattr(native, "chunked", False))
    if opts.backend == "llvm":
        threads, set_threads = int(opts.num_threads), None
    else:
        numba = require_numba("a numba backend kernel")
        from geode.codegen.backends.numba import clamp_threads

        threads = clamp_threads(opts.num_threads)  # once, not per call (0: all cores)
        set_threads = numba.set_num_threads if parallel and not chunked else None
    return NativeKernel(
        name=name,
        fn=native,
        n_inputs=len(lowered.inputs),
        out_shapes=[compile_shape_fn(v.shape) for v in lowered.outputs],
        out_dtypes=[v.dtype for v in lowered.outputs],
        dims=[compile_dim_fn(d) for d in lowered.dim_exprs.values()],
        dim_exprs=tuple(lowered.dim_exprs.values()),
        views=arg_views(lowered, kernel),
        index_bounds=[
            IndexBound(c.node, c.axis, compile_dim_fn(c.dim), c.input, c.data, c.dim)
            for c in lowered.index_checks
        ],
        threads=threads,
        launch_threads=chunked,
        set_threads=set_threads,
        call=getattr(native, "call", None) if opts.backend == "llvm" else None,
    )


def arg_views(lowered: LoweredKernel, kernel: A.Kernel) -> list[View | None]:
    """For each kernel argument (inputs, then outputs), the dims of its value that the
    scheduled ``kernel`` merges (:meth:`Schedule.merge_dims`), or None when it takes the
    value's own shape. The step reshapes those arrays (a view of the same memory)."""
    out: list[View | None] = []
    for old, new in zip(
        lowered.kernel.inputs + lowered.kernel.outputs, kernel.inputs + kernel.outputs
    ):
        if len(old.shape) == len(new.shape):
            out.append(None)
            continue
        starts = view_starts(list(old.shape), list(new.shape))
        if starts is None:
            raise GeodeError(f"kernel {kernel.name}: argument {new.name} has an unknown view")
        out.append(starts)
    return out


def view_starts(old: list[A.Expr], new: list[A.Expr]) -> tuple[int, ...] | None:
    """Where each dim of ``new`` starts among the dims of ``old``, when ``new`` merges
    runs of consecutive dims of ``old`` (each new dim the product of its run), else
    None. Unit and zero dims make a greedy match ambiguous (``(4, 1) -> (4,)``,
    ``(0, 0, 1, 0) -> (0, 1, 0)``), so runs are searched with backtracking."""
    memo: dict[tuple[int, int], tuple[int, ...] | None] = {}

    def search(i: int, k: int) -> tuple[int, ...] | None:
        if i == len(new):
            return () if k == len(old) else None
        if (i, k) not in memo:
            memo[i, k] = None
            size: A.Expr = A.Const(1)
            for end in range(k, len(old)):
                size = A.mul(size, old[end])
                if exprs_equal(size, new[i]):
                    rest = search(i + 1, end + 1)
                    if rest is not None:
                        memo[i, k] = (k, *rest)
                        break
        return memo[i, k]

    return search(0, 0)


def dense_packing(
    a: Value, b: Value, second: Node | None, opts: Options
) -> tuple[PackChoice | None, PackChoice | None]:
    """How a GEMM with a fused epilogue takes its weights ``B`` and (with a second GEMM)
    ``V``: packed once or through the BLAS (None: a batched operand, not a choice)."""
    if len(b.shape) != 2:
        return None, None
    first = choose_packing(a, b, opts)
    if second is None or len(second.inputs[1].shape) != 2:
        return first, None
    return first, choose_packing(second.inputs[0], second.inputs[1], opts)


def _dense_args(job: KernelJob, opts: Options, entry: Any) -> tuple:
    """:func:`~geode.codegen.dense.dense_module`'s arguments for the job's GEMM entry
    around the epilogue ``entry`` (its symbol, or its compiled kernel for
    :func:`~geode.codegen.dense.dense_kernel`)."""
    from geode.compiler.fusion.profit import DENSE_MIN_ROWS, panel_bytes

    pg = job.panel
    a, b = pg.dense.inputs
    choices = dense_packing(a, b, pg.epilogue.second, opts)
    packed = [c is not None and c.packed for c in choices]
    return (
        pg,
        job.lowered,
        arg_views(job.lowered, job.schedule.kernel),
        entry,
        panel_bytes(plan_spec(opts)),
        DENSE_MIN_ROWS,
        choices[0].n if packed[0] else 0,
        choices[1].n if packed[1] else 0,
    )


def _tiled_body(job: KernelJob, g: Graph, opts: Options) -> tuple[TiledBody, Any] | None:
    """The key-tiled body of an attention whose entry chooses per call
    (``Epilogue.switch``: a symbolic key length) and its epilogue kernel's module (the
    softmax's per-element part over a block of keys, default schedule; emitted, not
    compiled: that waits for the first call that takes the body), or None."""
    if job.panel.epilogue.switch is None:
        return None
    pg, lowered, schedule, emitted = job.tiled or (*_tiled_parts(job, g, opts), None)
    if emitted is None:
        emitted = _emit_tiled(schedule, opts)
    return _tiled(pg, lowered, schedule, emitted.entry, opts), emitted


def _tiled_parts(job: KernelJob, g: Graph, opts: Options) -> tuple:
    """The key-tiled body's panel graph (the epilogue's per-element part), lowered
    kernel and default schedule, for an entry that chooses per call."""
    ep = job.panel.epilogue
    pg = panel_graph(dataclasses.replace(ep, online=ep.switch, switch=None), g)
    lowered = lower_group(pg.group, pg.graph, f"{job.name}_tiled")
    return pg, lowered, default_schedule(lowered, pg.group, opts)


def _tiled(pg: PanelGraph, lowered: Any, schedule: Any, entry: str, opts: Options) -> TiledBody:
    from geode.compiler.fusion.profit import online_limit

    views = arg_views(lowered, schedule.kernel)
    return TiledBody(pg, lowered, views, entry, online_limit(plan_spec(opts)))


def _emit_tiled(schedule: Any, opts: Options) -> Any:
    """The key-tiled body's epilogue kernel's module, emitted (LLVM runs on it only when
    a call first takes the body: :meth:`~geode.codegen.backends.llvm.compiled.DenseKernel.prepare`)."""
    from geode.codegen.autoschedule import choices
    from geode.codegen.backends.llvm.kernel import emit

    return emit(schedule.kernel, fastmath=opts.fastmath, min_work=choices().parallel_min_elements)


def _start_tiled(job: KernelJob, g: Graph, opts: Options) -> TiledBody:
    """The key-tiled body of an entry that chooses per call, its epilogue kernel's module
    emitted (kept in ``job.tiled`` for :func:`_tiled_body`), not compiled: the entry's
    module needs only its names."""
    pg, lowered, schedule = _tiled_parts(job, g, opts)
    emitted = _emit_tiled(schedule, opts)
    job.tiled = (pg, lowered, schedule, emitted)
    return _tiled(pg, lowered, schedule, emitted.entry, opts)


def _dense_kernel(job: KernelJob, g: Graph, opts: Options, args: tuple) -> tuple:
    """:func:`~geode.codegen.dense.dense_kernel` for the job, with the key-tiled body
    beside the row panels when the epilogue has one (:func:`_tiled_body`; compiled on the
    first call that takes it; row panels alone when it cannot be made); the kernel, its
    inputs and outputs, and a note on the body."""
    cache = object_cache(opts)
    try:
        found = _tiled_body(job, g, opts)
        if found is not None:
            body, emitted = found
            source = tiled_source(args, body, emitted, f"{job.name}_tiled", opts.fastmath)
            kernel, ins, outs = dense_kernel(
                *args[:6], cache, *args[6:], (body, source), cached_build(cache)
            )
            return kernel, ins, outs, _lazy_note(job, opts)
    except GeodeError as exc:
        kernel, ins, outs = dense_kernel(*args[:6], cache, *args[6:])
        return kernel, ins, outs, f"row panels alone (no key-tiled body: {exc})"
    return (*dense_kernel(*args[:6], cache, *args[6:]), "")


def _lazy_note(job: KernelJob, opts: Options) -> str:
    """``explain()``'s note on an entry choosing per call."""
    from geode.compiler.fusion.profit import online_switch_keys

    ep = job.panel.epilogue
    keys, _ = online_switch_keys(ep.dense, ep.second, plan_spec(opts))
    return (
        f"one entry: row panels below {keys} keys; key-tiled body compiled on the first call"
        f" from {keys}"
    )


def dense_job(job: KernelJob, g: Graph, opts: Options, dump: Dumper) -> None:
    """A GEMM with its fused epilogue (``job.panel``): the entry around the compiled
    epilogue kernel, its interface (inputs ``A``, ``B``, then the epilogue's) and info."""
    pg = job.panel
    a, b = pg.dense.inputs
    second = pg.epilogue.second
    choices = dense_packing(a, b, second, opts)
    packed = [c is not None and c.packed for c in choices]
    args = _dense_args(job, opts, job.native)
    kernel, ins, outs, note = _dense_kernel(job, g, opts, args)
    ep = pg.epilogue
    a_in, b_in = stored(ep, "A", ep.a_value), stored(ep, "B", b)
    job.inputs = [a_in, packed_value(b) if packed[0] else b_in, *ins]
    notes = [("" if i == 0 else "V: ") + c.text for i, c in enumerate(choices) if c is not None]
    job.weights = "; ".join(x for x in ("; then ".join(notes), note) if x)
    if packed[0] and (second is None or packed[1]):
        from geode.codegen.backends.llvm.dense import BIG_PANELS, BIG_ROWS, SPLIT_ROWS

        job.weights += (
            f"; up to {SPLIT_ROWS} rows per thread: a panel per thread (GEMM, epilogue"
            f"{', second GEMM' if second is not None else ''} on one thread), one pool launch"
            f"; from {BIG_PANELS * BIG_ROWS} rows per thread: panels of {BIG_ROWS} rows"
            " on the pool, each on one thread"
        )
    if kernel.in_place:
        job.weights += (
            "; the GEMM writes the output's panels, the elementwise epilogue rewrites them in"
            " place (no scratch panel; the scratch when the output overlaps A)"
        )
    sibling, residual = pg.epilogue.sibling, pg.epilogue.residual
    if sibling is not None:  # taken only with both weights packed once
        job.weights += "; beside it U: " + choose_packing(a, sibling.inputs[1], opts).text
    if pg.epilogue.a_transpose is not None:
        job.weights += f"; A read in place through {pg.epilogue.a_transpose.name}"
    adds = [n.name for n in (pg.epilogue.bias, residual) if n is not None]
    if adds:
        job.weights += f"; {' and '.join(adds)} summed into the second GEMM's panels"
    nodes = [pg.dense, second]
    job.packed_nodes = tuple(n.name for n, p in zip(nodes, packed) if p and n is not None)
    job.packed_nodes += (sibling.name,) if sibling is not None else ()
    partner = pg.epilogue.partner
    if partner is not None:  # taken only with both weights packed once
        job.weights += (
            f"; beside it {partner.name}: "
            + choose_packing(partner.inputs[0], partner.inputs[1], opts).text
        )
        job.packed_nodes += (partner.name,)
    job.outputs = outs
    job.interface = NativeKernel(
        name=job.name,
        fn=kernel,
        n_inputs=len(job.inputs),
        out_shapes=[compile_shape_fn(v.shape) for v in outs],
        out_dtypes=[v.dtype for v in outs],
        threads=int(opts.num_threads),
        launch_threads=True,
        call=kernel.call,
        prepare=kernel.prepare,
    )
    job.info = KernelInfo(
        name=job.name,
        ops=pg.nodes,
        engine="aicore",
        source=kernel.source,
        kind="dense",
        trace=str(job.schedule.trace),
        key=job.kernel_key,
        schedule=job.schedule_choice.origin if job.schedule_choice is not None else "",
        cost=compile_cost(kernel, job.seconds),
        _llvm=lambda: kernel.llvm,
        _asm=lambda: kernel.asm,
    )
    if dump.wants(3):
        dump.stage(f"{job.name}_dense_entry", kernel.source, level=3, ext="ll")
