"""From a placed graph to plan units: fusion plan -> lower -> schedule -> native kernel.

For every fusion group: lower it to a loop AST, apply the default schedule for its
pattern, compile it with the numba backend (through the disk cache) and bind it as an
AI Core step. A group whose lowering, scheduling or compilation fails runs node by
node on the AICPU engine, with a warning: a user never loses a result to a codegen bug.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

import geode.codegen.backends  # noqa: F401  (numba's target set up before calibration compiles)
from geode.codegen import ast as A
from geode.codegen.cache import maybe_prune
from geode.codegen.lower import IndexCheck, LoweredKernel, lower_group, make_can_lower
from geode.compiler.fusion.groups import Group
from geode.compiler.fusion.planner import plan_fusion, schedule_units
from geode.compiler.fusion.profit import describe_work, make_profit
from geode.compiler.ir import Graph, Node
from geode.compiler.partition.placement import Placement
from geode.compiler.shapes import compile_dim_fn, compile_shape_fn
from geode.config import Options, stream_min_bytes
from geode.costmodel.device import DeviceSpec, default_spec, load_or_calibrate
from geode.debug import Dumper, log
from geode.errors import ExecutionError, GeodeError
from geode.plan_builder import Unit, reference_unit
from geode.progress import progress_bar
from geode.runtime.model import KernelInfo

_SPECS: dict[str, DeviceSpec] = {}


def device_spec(cache_dir: str) -> DeviceSpec:
    """The calibrated device spec (measured once per machine, cached on disk and in memory)."""
    if cache_dir not in _SPECS:
        try:
            _SPECS[cache_dir] = load_or_calibrate(cache_dir, quick=True)
        except OSError as exc:  # unwritable cache dir: calibrate without caching
            log.warning("device spec not cached (%s); using defaults", exc)
            _SPECS[cache_dir] = default_spec()
    return _SPECS[cache_dir]


class CodegenWarning(UserWarning):
    """A group could not be compiled and falls back to the AICPU engine."""


def compile_groups(
    g: Graph, placement: Placement, opts: Options, dump: Dumper
) -> tuple[list[Unit], str]:
    """Units for the plan (fused native kernels and fallback nodes) and the fusion plan text."""
    spec = device_spec(opts.cache_dir)
    plan = plan_fusion(g, placement, make_can_lower(g), make_profit(spec))
    dump.stage("fusion_plan", plan.describe())
    units: list[Unit] = []
    items = schedule_units(g, plan)
    n_groups = sum(1 for item in items if not isinstance(item, Node))
    bar = progress_bar(n_groups, f"geode: compiling {g.name}", opts.progress, unit="kernel")
    for k, item in enumerate(items):
        if isinstance(item, Node):
            engine = placement.engine[item.name]
            units.append(reference_unit(item, "aicpu" if engine == "aicore" else engine))
            continue
        try:
            units.append(_compile_group(g, item, f"fused_{k}", opts, dump))
        except Exception as exc:  # noqa: BLE001 - any codegen failure falls back, loudly
            msg = f"group {item.id} ({len(item.nodes)} ops) falls back to AICPU: {type(exc).__name__}: {exc}"
            warnings.warn(msg, CodegenWarning, stacklevel=2)
            log.warning(msg)
            if isinstance(exc, GeodeError) is False and opts.debug >= 2:
                log.exception("codegen failure")
            units += [reference_unit(n, "aicpu") for n in item.nodes]
        bar.update()
    bar.close()
    maybe_prune(opts.cache_dir, opts.cache_max_mb << 20)
    return drop_dead_units(units, g), plan.describe()


def drop_dead_units(units: list[Unit], g: Graph) -> list[Unit]:
    """Remove units whose results nothing reads any more (e.g. a Shape feeding an Expand
    that was fused: the kernel knows the shape, so the host step is dead)."""
    needed = {id(v) for v in g.outputs}
    kept: list[Unit] = []
    for u in reversed(units):
        if any(id(v) in needed for v in u.outputs) or any(
            n.op_type in SIDE_EFFECTS for n in u.nodes
        ):
            kept.append(u)
            needed |= {id(v) for v in u.inputs if v is not None}
    return list(reversed(kept))


#: ops that must run even when nothing reads their outputs
SIDE_EFFECTS = frozenset({"Assign", "Print"})


def _compile_group(g: Graph, group: Group, name: str, opts: Options, dump: Dumper) -> Unit:
    from geode.codegen.autoschedule import schedule_group, stream_interleave
    from geode.codegen.backends.numba import compile_kernel
    from geode.codegen.backends.target import vector_registers

    t0 = time.perf_counter()
    lowered = lower_group(group, g, name)
    if dump.wants(2):
        dump.stage(f"{name}_ast_lowered", A.format_kernel(lowered.kernel), level=2)
    spec = device_spec(opts.cache_dir)
    sch = schedule_group(
        lowered,
        group,
        stream_min_bytes(opts, spec.l3_bytes),
        stream_interleave(vector_registers()),
        stream_min_bytes(opts, spec.l2_bytes),
    )
    kernel = sch.kernel
    trace = str(sch.trace)
    if dump.wants(2):
        dump.stage(
            f"{name}_ast_scheduled", A.format_kernel(kernel) + "\n\n# trace\n" + trace, level=2
        )
        dump.stage(f"{name}_trace", trace, level=2)
    native = compile_kernel(kernel, fastmath=opts.fastmath, cache_dir=opts.cache_dir)
    if not opts.lazy_compile:
        native.compile_chunk_functions()
    if dump.wants(3):
        dump.stage(f"{name}_source", native.source, level=3, ext="py")
    if dump.wants(4) and opts.debug >= 4:
        dump.stage(f"{name}_llvm", native.llvm, level=4, ext="ll")
        dump.stage(f"{name}_asm", native.asm, level=4, ext="s")
    step = make_step(lowered, native, opts.num_threads, arg_views(lowered, kernel))
    info = KernelInfo(
        name=name,
        ops=list(group.nodes),
        engine="aicore",
        source=native.source,
        trace=trace,
        cost={
            "compile_s": time.perf_counter() - t0,
            "from_cache": float(getattr(native, "from_cache", False)),
        },
        _llvm=lambda: native.llvm,
        _asm=lambda: native.asm,
    )
    info.cost.update(describe_work(group, g, device_spec(opts.cache_dir)))
    unit = Unit(
        name, "aicore", list(group.nodes), list(lowered.inputs), list(lowered.outputs), step, info
    )
    unit.extra["pattern"] = group.pattern_name()
    return unit


def check_indices(check: IndexCheck, inputs: list, dim: int) -> None:
    """Raise :class:`ExecutionError` unless every index of ``check`` lies in
    ``[-dim, dim)`` (the kernel would read outside its input)."""
    ind = inputs[check.input] if check.input is not None else check.data
    if ind.size == 0:
        return
    lo, hi = int(ind.min()), int(ind.max())
    if lo < -dim or hi >= dim:
        bad = lo if lo < -dim else hi
        raise ExecutionError(
            f"{check.node}: index {bad} is out of range for axis {check.axis} of size {dim} "
            f"(valid: {-dim} to {dim - 1})"
        )


#: how a kernel argument is viewed: for each dim of the view, the first of the value's
#: dims it merges (the view's dim ``k`` spans ``starts[k]:starts[k + 1]``)
View = tuple[int, ...]


def arg_views(lowered: LoweredKernel, kernel: A.Kernel) -> list[View | None]:
    """For each kernel argument (inputs, then outputs), the dims of its value that the
    scheduled ``kernel`` merges (:meth:`Schedule.merge_dims`), or None when it takes the
    value's own shape. The step reshapes those arrays (a view of the same memory)."""
    from geode.codegen.schedule import _eq

    out: list[View | None] = []
    for old, new in zip(
        lowered.kernel.inputs + lowered.kernel.outputs, kernel.inputs + kernel.outputs
    ):
        if len(old.shape) == len(new.shape):
            out.append(None)
            continue
        starts, k = [], 0
        for d in new.shape:
            starts.append(k)
            size: A.Expr = A.Const(1)
            while k < len(old.shape) and not (_eq(size, d) and k > starts[-1]):
                size, k = A.mul(size, old.shape[k]), k + 1
        if k != len(old.shape):
            raise GeodeError(f"kernel {kernel.name}: argument {new.name} has an unknown view")
        out.append(tuple(starts))
    return out


def _view(a: np.ndarray, starts: View) -> np.ndarray:
    ends = (*starts[1:], a.ndim)
    return a.reshape(tuple(math.prod(a.shape[s:e]) for s, e in zip(starts, ends)))


def make_step(
    lowered: LoweredKernel,
    native: Callable[..., Any],
    num_threads: int = 0,
    views: list[View | None] | None = None,
) -> Callable[[list, list, Any], list]:
    """The AI Core step: ``fn(inputs, outs, env)`` calling the kernel with dims from ``env``
    (on ``num_threads`` threads when it has parallel loops; 0: all cores), each argument
    reshaped as ``views`` says (see :func:`arg_views`).

    numba's thread count is a setting of the calling thread that outlives the call, so
    a parallel kernel sets its own every time: one left at 1 by another model
    (``num_threads=1``) or by the user's code would otherwise run an all-cores model on
    one core. A chunked kernel sets it in compiled code (its ``threads`` argument); any
    other parallel kernel through ``numba.set_num_threads`` (about 1 us, but 35-57 us
    right after a kernel that streamed the caches out).
    """
    import numba

    from geode.codegen.backends.numba import clamp_threads

    threads = clamp_threads(num_threads)  # once, not per call (0: all cores)
    parallel = bool(getattr(native, "parallel", True))
    chunked = bool(getattr(native, "chunked", False))
    sets_threads = parallel and not chunked  # a chunked kernel sets them itself
    launch = {"threads": threads} if chunked else {}
    dim_fns = [compile_dim_fn(d) for d in lowered.dim_exprs.values()]
    out_shapes = [compile_shape_fn(v.shape) for v in lowered.outputs]
    out_dtypes = [v.dtype for v in lowered.outputs]
    n_in = len(lowered.inputs)
    checks = [(c, compile_dim_fn(c.dim)) for c in lowered.index_checks]
    reshaped = [(i, v) for i, v in enumerate(views or []) if v is not None]

    def step(inputs: list, outs: list, env: Any) -> list:
        for check, dim_fn in checks:
            check_indices(check, inputs, dim_fn(env))
        arrays = []
        for i in range(len(out_dtypes)):
            o = outs[i]
            if o is None:
                o = np.empty(out_shapes[i](env), out_dtypes[i])
            arrays.append(o)
        dims = [f(env) for f in dim_fns]
        args = [*inputs[:n_in], *arrays]
        for i, starts in reshaped:
            if i >= n_in and not args[i].flags.c_contiguous:  # a reshape would copy it
                raise ExecutionError(f"kernel output {i - n_in} is not C-contiguous")
            args[i] = _view(args[i], starts)
        if sets_threads:
            numba.set_num_threads(threads)  # numba's setting is per calling thread
        native(*args, *dims, **launch)
        return arrays

    return step
