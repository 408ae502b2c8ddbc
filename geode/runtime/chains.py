"""Runs of native steps called in one crossing from Python into native code.

A plan's consecutive AI Core steps whose kernels have a lean native entry (``NativeKernel.
call``: the LLVM backend's kernels and library routines) and no index checks become one
*chain* step: per call it gathers every member's arrays (the run's inputs, then each
member's outputs, which later members read) and ints, and hands them to the native
runtime's ``call_chain``, which runs the entries one after another with the GIL released
once. The members keep their buffers (arena views planned for the unchained steps, so
the memory plan and the release lists stay exact) and their order; only the Python
dispatch between them goes (measurements: ``docs/performance.md``).

A step the executor memoizes (``Plan.memo_steps``) is never part of a chain. A member
that reads an alias (a view, ``Plan.aliases``) of what an earlier member wrote gets the
view from the chain itself: the executor makes aliases only after a step returns.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from geode.errors import ExecutionError
from geode.runtime.engines import NativeKernel, view
from geode.runtime.plan import Step

__all__ = ["chainable", "chain_step"]

#: the most kernels one chain holds (the native runtime's limit)
MAX_CHAIN = 256


def chainable(kernel: Any) -> bool:
    """Whether a step's kernel can join a chain: a NativeKernel with a lean entry whose
    callable knows its native address, and nothing to check before a launch."""
    return (
        isinstance(kernel, NativeKernel)
        and kernel.call is not None
        and not kernel.index_bounds
        and getattr(kernel.fn, "address", None) is not None
    )


#: alias slot -> (its root slot, ``view(root_array, env)``)
Views = Mapping[int, tuple[int, Callable[[np.ndarray, Any], np.ndarray]]]


def chain_step(
    steps: Sequence[Step], kernels: Sequence[NativeKernel], views: Views | None = None
) -> Step:
    """One step running ``steps`` (consecutive, each with its chainable kernel) in one
    native call; its inputs are those the run reads from before it, its outputs every
    member's outputs, in order. ``views``: the plan's aliases; one whose root an earlier
    member writes is made inside the chain (after the chain's buffers exist)."""
    from geode.runtime import native

    views = views or {}
    produced: set[int] = set()
    inputs: list[int | None] = []
    derived: list[int] = []  # aliases of members' outputs that later members read
    for st in steps:
        for i in st.inputs:
            if i is None or i in produced or i in inputs or i in derived:
                continue
            if i in views and views[i][0] in produced:
                derived.append(i)
            else:
                inputs.append(i)
        produced.update(st.outputs)
    outputs = [o for st in steps for o in st.outputs]
    entries = tuple(
        (k.fn.address, len(st.inputs[: k.n_inputs]) + len(st.outputs), k.n_inputs, len(k.dims) + 1)
        for st, k in zip(steps, kernels)
    )
    # where each member's arguments come from: position p of ins + results (the run's
    # inputs, then its outputs), and which of them a member views differently
    source = {slot: p for p, slot in enumerate(inputs)}
    source.update({o: len(inputs) + j for j, o in enumerate(outputs)})
    source.update({a: len(inputs) + len(outputs) + j for j, a in enumerate(derived)})
    made = [(source[views[a][0]], views[a][1]) for a in derived]
    picks: list[int] = []
    reviews: list[tuple[int, tuple[int, ...]]] = []
    dim_fns: list[tuple[list, int]] = []
    for st, k in zip(steps, kernels):
        args = [*st.inputs[: k.n_inputs], *st.outputs]
        base = len(picks)
        picks += [source[s] for s in args]
        reviews += [(base + j, v) for j, v in enumerate(k.views) if v is not None]
        dim_fns.append((list(k.dims), k.threads))
    shapes = [
        (k.out_shapes[j], k.out_dtypes[j])
        for st, k in zip(steps, kernels)
        for j in range(len(st.outputs))
    ]
    names = [st.name for st in steps]
    call_chain = native.call_chain
    ints_of: dict[tuple, tuple] = {}

    def chain_ints(env: Any) -> tuple:
        key = tuple(env.items())
        got = ints_of.get(key)
        if got is None:
            got = tuple(v for fns, threads in dim_fns for v in (*(f(env) for f in fns), threads))
            if len(ints_of) >= 8:  # a few bindings; threads may race here: harmless
                ints_of.clear()
            ints_of[key] = got
        return got

    def run(ins: list, outs: list, env: Any) -> list:
        results = []
        for j, (shape_fn, dtype) in enumerate(shapes):
            buf = outs[j] if j < len(outs) else None
            results.append(np.empty(shape_fn(env), dtype) if buf is None else buf)
        src = [*ins, *results]
        for p, make in made:
            src.append(make(src[p], env))
        arrays = [src[p] for p in picks]
        for p, starts in reviews:
            arrays[p] = view(arrays[p], starts)
        ints = chain_ints(env)
        try:
            status = call_chain(entries, tuple(arrays), ints)
        except native.ArgumentError:
            status = _one_by_one(arrays, ints)
        if status:
            k, code = (status >> 32) - 1, status & 0xFFFFFFFF
            try:
                kernels[k].fn._bad_argument(code - 1)
            except ValueError as exc:
                raise ExecutionError(f"step {names[k]!r}: {exc}") from None
            raise ExecutionError(f"step {names[k]!r}: kernel returned status {code}")
        return results

    def _one_by_one(arrays: list, ints: tuple) -> int:
        """A strided input: each member's own entry copies what it must."""
        pa = pi = 0
        for k, (_, n_arrays, _, n_ints) in enumerate(entries):
            try:
                kernels[k].call(tuple(arrays[pa : pa + n_arrays]), ints[pi : pi + n_ints])
            except ValueError as exc:
                raise ExecutionError(f"step {names[k]!r}: {exc}") from None
            pa, pi = pa + n_arrays, pi + n_ints
        return 0

    label = " | ".join(st.label for st in steps)
    info = {"chain": names}
    return Step("chain:" + names[0], "aicore", run, inputs, outputs, label, info)
