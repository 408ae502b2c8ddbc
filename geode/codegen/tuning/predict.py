"""Predictors: a scheduled kernel's time before it is measured, to rank candidates.

A predictor is any callable ``predictor(kernel)`` or ``predictor(kernel, dims)`` (the
scheduled :class:`~geode.codegen.ast.Kernel` and its dim values, symbol name -> size)
returning predicted seconds; :func:`predict` calls it either way. The tuner measures
candidates in the order of their predictions, so a good predictor finds the best
schedule in fewer measurements; its errors cost trials, never correctness (every
candidate kept is measured and checked).

:func:`sol_predictor` is the speed-of-light model (:mod:`geode.costmodel.sol`) over the
kernel's work: the bytes of its arguments, its arithmetic and transcendental operations
counted per iteration of their loops, and whether it runs in parallel. It tells a
parallel schedule from a serial one and a recomputing one from one that keeps a row
buffer; the projected model fitted on profiled kernels (geode's cost-model work) plugs
in the same way.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping

import numpy as np

from geode.codegen import ast as A
from geode.codegen.ast_eval import eval_shape
from geode.config import Options
from geode.costmodel.device import DeviceSpec
from geode.costmodel.sol import KernelWork, estimate

#: a predictor: ``fn(kernel)`` or ``fn(kernel, dims)`` -> predicted seconds
Predictor = Callable[..., float]

#: operations counted as transcendentals (vmath calls) rather than flops
_TRANSCENDENTAL = frozenset(
    {"exp", "log", "log1p", "tanh", "sigmoid", "erf", "sin", "cos", "tan", "pow"}
    | {"asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh"}
)


def _count(e: A.Expr) -> tuple[int, int]:
    """(flops, transcendentals) of one evaluation of ``e`` (index arithmetic excluded)."""
    flops = trans = 0
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, A.Load):
            continue  # its indices are addresses, not arithmetic
        if isinstance(x, (A.Un, A.Bin)):
            if x.op in _TRANSCENDENTAL:
                trans += 1
            else:
                flops += 1
        stack.extend(A.children(x))
    return flops, trans


def kernel_work(kernel: A.Kernel, dims: Mapping[str, int]) -> KernelWork:
    """The SOL model's view of a scheduled kernel with dim values ``dims``."""
    d = dict(dims)

    def size(b: A.Buffer) -> float:
        return float(np.prod(eval_shape(b.shape, d), dtype=np.float64)) * np.dtype(b.dtype).itemsize

    flops = trans = 0.0
    parallel = False

    def visit(stmts: list[A.Stmt], iters: float) -> None:
        nonlocal flops, trans, parallel
        for s in stmts:
            if isinstance(s, A.For):
                parallel |= s.kind is A.ForKind.PARALLEL
                # an extent may use an outer loop's variable (a chunk's clamped length):
                # taken at the loop's first iteration
                n = max(0, eval_shape((s.extent,), d)[0])
                d.setdefault(s.var, 0)
                visit(s.body, iters * n)
            elif isinstance(s, (A.Block, A.If)):
                visit(s.body, iters)
            elif isinstance(s, A.Store):
                f, t = _count(s.value)
                flops += f * iters
                trans += t * iters

    visit(kernel.body, 1.0)
    return KernelWork(
        bytes_read=sum(size(b) for b in kernel.inputs),
        bytes_written=sum(size(b) for b in kernel.outputs),
        flops=flops,
        transcendentals=trans,
        parallel=parallel,
    )


def sol_predictor(spec: DeviceSpec) -> Predictor:
    """The SOL model on ``spec`` as a predictor."""

    def predict_sol(kernel: A.Kernel, dims: Mapping[str, int]) -> float:
        return estimate(kernel_work(kernel, dims), spec)

    return predict_sol


def projected_predictor(opts: Options) -> Predictor:
    """The projected model as a predictor: fitted on this device when a fit was saved
    in ``opts.cache_dir`` (``python -m geode.costmodel.report --save``), else its prior;
    at the thread count ``opts.num_threads`` gives."""
    from geode.codegen.costs import KernelPredictor, projected_model
    from geode.codegen.driver import device_spec

    spec = device_spec(opts.cache_dir)
    model = projected_model(opts.cache_dir, spec)
    return KernelPredictor(spec, model, threads=int(opts.num_threads))


def predict(predictor: Predictor, kernel: A.Kernel, dims: Mapping[str, int]) -> float:
    """``predictor``'s seconds for ``kernel``, called with the dims when it takes two
    arguments."""
    try:
        n = len(inspect.signature(predictor).parameters)
    except (TypeError, ValueError):  # a builtin without a signature
        n = 1
    value = predictor(kernel, dims) if n >= 2 else predictor(kernel)
    return float(value)
