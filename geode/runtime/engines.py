"""Engines: how a step's kernel is called.

* ``aicore``: JIT-compiled native kernels; they write into the buffers they are given.
  The engine builds their step from a backend-neutral :class:`NativeKernel`: how to
  get the kernel's dim arguments and output shapes from the run's environment, how
  each argument is viewed, which indices to check before a launch, and its threads.
* ``aicpu``: reference kernels (numpy, ONNX semantics); results are copied into the
  planned buffer when there is one, so activations still follow the memory plan.
* ``host``: shape computations and data-dependent ops; their results are small or of
  unknown size, so they keep their own memory.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from geode.errors import ExecutionError
from geode.runtime.plan import Env, StepFn

ReferenceKernel = Callable[[list], Sequence[np.ndarray]]
DimFn = Callable[[Env], int]
ShapeFn = Callable[[Env], tuple[int, ...]]
#: how a kernel argument is viewed: for each dim of the view, the first of the value's
#: dims it merges (the view's dim ``k`` spans ``starts[k]:starts[k + 1]``)
View = tuple[int, ...]


@dataclass(frozen=True)
class IndexBound:
    """Indices a kernel uses to address memory without a bounds check (Gather's): each
    must lie in ``[-dim, dim)``. They are kernel input ``input``, or ``data`` when they
    were folded into the kernel as a literal; ``node`` and ``axis`` name them in errors."""

    node: str
    axis: int
    dim: DimFn
    input: int | None
    data: np.ndarray | None = None
    #: the dim's expression ``dim`` was compiled from (what a model file keeps)
    expr: Any = None


@dataclass(frozen=True)
class NativeKernel:
    """A compiled kernel's calling interface, whatever backend compiled it.

    ``fn(*inputs, *outputs, *dims, **launch)`` writes the outputs: ``inputs`` are the
    step's first ``n_inputs`` arrays, ``outputs`` the planned buffers (or new arrays of
    ``out_shapes(env)`` and ``out_dtypes``), ``dims`` the values of ``dims(env)``. An
    argument whose ``views`` entry is not None is reshaped to that view first. With
    ``launch_threads`` the kernel sets its own threads from ``launch={"threads": n}``;
    else ``set_threads(threads)`` (when given) runs before every call, since a thread
    count is often a setting of the calling thread that another caller may change.

    ``call(arrays, ints)``, when given, is the same kernel's lean entry: ``arrays`` the
    tuple of (viewed) inputs and outputs, ``ints`` the dims then the thread count. The
    step uses it instead of ``fn``: the plan already guarantees the arrays' dtypes (the
    executor checks feeds and every step's outputs), and the kernel still checks ranks,
    shapes, item sizes and contiguity itself.
    """

    name: str
    fn: Callable[..., Any]
    n_inputs: int
    out_shapes: Sequence[ShapeFn]
    out_dtypes: Sequence[np.dtype]
    dims: Sequence[DimFn] = ()
    views: Sequence[View | None] = ()
    index_bounds: Sequence[IndexBound] = ()
    threads: int = 0
    launch_threads: bool = False
    set_threads: Callable[[int], Any] | None = None
    call: Callable[[tuple, tuple], Any] | None = None
    #: the expressions ``dims`` were compiled from (what a model file keeps)
    dim_exprs: Sequence[Any] = ()
    #: ``prepare(arrays)``, when given, runs before a call on ``arrays`` (the kernel's
    #: inputs and outputs): code the kernel compiles on the first call that needs it (a
    #: dense entry's key-tiled body); a chain runs it once per binding
    prepare: Callable[[Sequence[np.ndarray]], Any] | None = None


def _store(
    name: str, results: Sequence[np.ndarray], outs: list, inputs: Sequence[object] = ()
) -> list[np.ndarray]:
    """A reference kernel's results, copied into the buffers the plan gave (``outs``).
    A result with no planned buffer is kept, unless it is a view of one of the step's
    ``inputs`` (``np.transpose`` of a ``[N, 1]``, ``np.broadcast_to``): their memory may
    be an arena buffer the plan reuses, or the caller's, so such a result is copied."""
    stored = []
    for i, r in enumerate(results):
        buf = outs[i] if i < len(outs) else None
        r = np.asarray(r)
        if buf is None:
            if any(isinstance(x, np.ndarray) and np.may_share_memory(r, x) for x in inputs):
                r = r.copy()
            stored.append(r)
            continue
        if buf.shape != r.shape or buf.dtype != r.dtype:
            raise ExecutionError(
                f"step {name!r} output {i}: kernel produced {r.dtype}{list(r.shape)}, "
                f"plan expects {buf.dtype}{list(buf.shape)}"
            )
        np.copyto(buf, r)
        stored.append(buf)
    return stored


class Engine:
    """Base engine: turns a kernel into a step function."""

    name = "engine"

    def bind(self, name: str, kernel: Callable) -> StepFn:  # pragma: no cover - interface
        """A step function ``fn(inputs, outs, env)`` for ``kernel``."""
        raise NotImplementedError


class AicpuEngine(Engine):
    """Runs reference kernels; copies results into planned buffers."""

    name = "aicpu"

    def bind(self, name: str, kernel: ReferenceKernel) -> StepFn:
        """Wrap a reference kernel ``kernel(inputs) -> outputs``."""

        def step(inputs: list, outs: list, env: Env) -> list[np.ndarray]:
            return _store(name, kernel(inputs), outs, inputs)

        return step


class HostEngine(AicpuEngine):
    """Runs shape and data-dependent ops on the host (same calling convention as AICPU)."""

    name = "host"


def index_range(indices: np.ndarray) -> tuple[int, int] | None:
    """The least and the greatest of ``indices``, None when there are none."""
    if indices.size == 0:
        return None
    return int(indices.min()), int(indices.max())


def index_error(bound: IndexBound, span: tuple[int, int] | None, dim: int) -> str | None:
    """What is wrong with indices spanning ``span`` (:func:`index_range`) on an axis of
    size ``dim``: None when they all lie in ``[-dim, dim)``, else the message naming the
    first one outside and the valid range."""
    if span is None:
        return None
    lo, hi = span
    if lo >= -dim and hi < dim:
        return None
    bad = lo if lo < -dim else hi
    return (
        f"{bound.node}: index {bad} is out of range for axis {bound.axis} of size {dim} "
        f"(valid: {-dim} to {dim - 1})"
    )


def view(a: np.ndarray, starts: View) -> np.ndarray:
    """``a`` reshaped so the view's dim ``k`` merges ``a``'s dims ``starts[k]:starts[k+1]``."""
    ends = (*starts[1:], a.ndim)
    return a.reshape(tuple(math.prod(a.shape[s:e]) for s, e in zip(starts, ends)))


class AiCoreEngine(Engine):
    """Runs native kernels that write into the buffers they are handed."""

    name = "aicore"

    def bind(self, name: str, kernel: NativeKernel) -> StepFn:
        """The step ``fn(inputs, outs, env)`` for a native kernel: checks its indices,
        allocates the outputs the plan did not, computes its dims from ``env``, views
        its arguments and calls it (setting its threads first when it needs that)."""
        fn, n_in, out_shapes, out_dtypes = (
            kernel.fn,
            kernel.n_inputs,
            list(kernel.out_shapes),
            list(kernel.out_dtypes),
        )
        dim_fns = list(kernel.dims)
        # indices given as kernel inputs are read per call; folded ones once, here
        bounds = [b for b in kernel.index_bounds if b.input is not None]
        folded = [(b, index_range(b.data)) for b in kernel.index_bounds if b.input is None]
        reshaped = [(i, v) for i, v in enumerate(kernel.views) if v is not None]
        launch = {"threads": kernel.threads} if kernel.launch_threads else {}
        set_threads = None if kernel.launch_threads else kernel.set_threads
        threads = kernel.threads
        lean = kernel.call
        prepare = kernel.prepare

        def step(inputs: list, outs: list, env: Env) -> list:
            for bound in bounds:
                msg = index_error(bound, index_range(inputs[bound.input]), bound.dim(env))
                if msg is not None:
                    raise ExecutionError(f"step {name!r}: {msg}")
            for bound, span in folded:
                msg = index_error(bound, span, bound.dim(env))
                if msg is not None:
                    raise ExecutionError(f"step {name!r}: {msg}")
            arrays = []
            for i in range(len(out_dtypes)):
                o = outs[i] if i < len(outs) else None
                if o is None:
                    o = np.empty(out_shapes[i](env), out_dtypes[i])
                arrays.append(o)
            dims = [f(env) for f in dim_fns]
            args = [*inputs[:n_in], *arrays]
            for i, starts in reshaped:
                if i >= n_in and not args[i].flags.c_contiguous:  # a reshape would copy it
                    raise ExecutionError(
                        f"step {name!r}: kernel output {i - n_in} is not C-contiguous"
                    )
                args[i] = view(args[i], starts)
            if prepare is not None:
                prepare(args)
            if lean is not None:
                lean(tuple(args), (*dims, threads))
                return arrays
            if set_threads is not None:
                set_threads(threads)
            fn(*args, *dims, **launch)
            return arrays

        return step


ENGINES: dict[str, Engine] = {e.name: e for e in (AicpuEngine(), HostEngine(), AiCoreEngine())}
