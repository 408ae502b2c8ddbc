"""The cost models applied to codegen's kernels: predict, score groups, time kernels.

* :class:`KernelPredictor`: a scheduled kernel (and its dims' values) -> predicted
  seconds by the projected model (:mod:`geode.costmodel.projected`) on the calibrated
  device; the model fitted on this machine (``python -m geode.costmodel.report
  --save``) when there is one, else the prior. This is the callable a schedule search
  ranks candidates with.
* :func:`group_cost`: a fusion group -> predicted seconds of the kernel it would be
  (lowered and scheduled as the compile would, symbolic dims at the nominal size):
  what the fusion plan search scores plans with.
* :func:`kernel_timer`: a compiled kernel job -> a callable running its step on
  arrays of a given size (the profiling model's subject).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from geode.codegen import ast as A
from geode.codegen.features import kernel_features
from geode.codegen.lower import LoweredKernel, lower_group
from geode.compiler.fusion.groups import Group
from geode.compiler.fusion.profit import NOMINAL_DIM
from geode.compiler.ir import Graph
from geode.compiler.shapes import compile_dim_fn, compile_shape_fn, free_symbols
from geode.config import Options
from geode.costmodel.device import DeviceSpec
from geode.costmodel.projected import DEFAULT_MODEL, ProjectedModel, ScheduleFeatures
from geode.costmodel.sol import KernelWork
from geode.costmodel.store import load_model
from geode.errors import GeodeError


def vector_bits(opts: Options | None = None) -> int:
    """Bits per vector register the backend's loops use (LLVM: 512 on AVX-512 hosts
    unless ``GEODE_VECTOR_WIDTH`` says 256; 256 otherwise)."""
    if opts is not None and opts.backend == "numba":
        return 256
    from geode.codegen.backends.llvm.target import host

    t = host()
    if t.prefer_vector_width:
        return int(t.prefer_vector_width)
    return 256 if "+avx" in t.features else 128


def projected_model(cache_dir: str, spec: DeviceSpec) -> ProjectedModel:
    """The projected model fitted on this device (saved in ``cache_dir``), else the prior."""
    return load_model(cache_dir, spec) or DEFAULT_MODEL


class KernelPredictor:
    """Predicted seconds of scheduled kernels: ``predictor(kernel, env) -> float``.

    ``env`` maps the kernel's dim names (``kernel.dims``) to values; ``threads`` is
    the run's thread count (0: every core); ``model`` the projected model (default:
    the prior). :meth:`features` gives the inputs of a prediction,
    :meth:`explain` its terms.
    """

    def __init__(
        self,
        spec: DeviceSpec,
        model: ProjectedModel | None = None,
        *,
        threads: int = 0,
        bits: int | None = None,
    ):
        self.spec = spec
        self.model = model or DEFAULT_MODEL
        self.threads = threads
        self.bits = vector_bits() if bits is None else bits

    def features(self, kernel: A.Kernel, env: Mapping[str, int] | None = None) -> ScheduleFeatures:
        """The projected model's features of ``kernel`` with its dims bound by ``env``."""
        return kernel_features(
            kernel, env, spec=self.spec, vector_bits=self.bits, threads=self.threads
        )

    def __call__(self, kernel: A.Kernel, env: Mapping[str, int] | None = None) -> float:
        return self.model.predict(self.features(kernel, env), self.spec)

    def explain(self, kernel: A.Kernel, env: Mapping[str, int] | None = None) -> str:
        """The prediction for ``kernel`` term by term, as one line."""
        return self.model.explain(self.features(kernel, env), self.spec)


def kernel_env(lowered: LoweredKernel, graph_env: Mapping[str, int] | None = None) -> dict:
    """The kernel's dim arguments' values for the graph's symbols ``graph_env``; a
    symbol missing from it takes the nominal size the fusion planner scores with."""
    env = dict(graph_env or {})
    out = {}
    for name, dim in lowered.dim_exprs.items():
        values = {str(s): env.get(str(s), NOMINAL_DIM) for s in free_symbols((dim,))}
        out[name] = int(compile_dim_fn(dim)(values))
    return out


def sol_work(f: ScheduleFeatures) -> KernelWork:
    """The speed-of-light model's view of a kernel with features ``f``: its compulsory
    bytes and operations, parallel when it has a parallel loop."""
    return KernelWork(
        bytes_read=f.bytes_read,
        bytes_written=f.bytes_written,
        flops=f.flops,
        transcendentals=f.transcendentals,
        parallel=f.parallel_extent > 1,
    )


#: ``schedule(lowered, group) -> Schedule``: the compile's default schedule of a group
Scheduler = Callable[[LoweredKernel, Group], Any]


def group_cost(
    graph: Graph,
    predictor: KernelPredictor,
    scheduler: Scheduler,
) -> Callable[[Group], float]:
    """``cost(group)``: the predicted seconds of the kernel ``group`` would become,
    lowered and scheduled by ``scheduler``, symbolic dims at the nominal size. A group
    the code generator cannot lower or schedule costs infinity (never chosen)."""

    def cost(group: Group) -> float:
        try:
            lowered = lower_group(group, graph, f"cand_{group.id}")
            sch = scheduler(lowered, group)
        except GeodeError:
            return float("inf")
        return predictor(sch.kernel, kernel_env(lowered))

    return cost


def kernel_timer(
    lowered: LoweredKernel,
    interface: Any,
    graph_env: Mapping[str, int] | None = None,
    seed: int = 0,
) -> Callable[[], Any]:
    """A callable of no argument running a compiled kernel's step (its native
    interface, as the executor binds it) on arrays of the shapes ``graph_env`` gives:
    inputs random (uniform in [0.5, 1.5), so logs and roots stay defined), outputs
    allocated once."""
    from geode.runtime.engines import AiCoreEngine

    env = dict(graph_env or {})
    rng = np.random.default_rng(seed)
    inputs = []
    for v in lowered.inputs:
        shape = compile_shape_fn(v.shape)(env)
        if v.is_constant and v.data is not None:
            inputs.append(np.ascontiguousarray(v.data))
        elif np.dtype(v.dtype).kind == "f":
            inputs.append((rng.random(shape) + 0.5).astype(v.dtype))
        else:
            inputs.append(rng.integers(1, 8, size=shape).astype(v.dtype))
    outs = [np.empty(compile_shape_fn(v.shape)(env), v.dtype) for v in lowered.outputs]
    step = AiCoreEngine().bind(interface.name, interface)

    def run() -> Any:
        return step(inputs, outs, env)

    return run
