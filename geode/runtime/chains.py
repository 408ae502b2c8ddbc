"""Runs of native steps called in one crossing from Python into native code.

A plan's consecutive AI Core steps whose kernels have a lean native entry (``NativeKernel.
call``: the LLVM backend's kernels and library routines) become one *chain* step: per
call it gathers every member's arrays (the run's inputs, then each member's outputs,
which later members read) and ints, and hands them to the native runtime's
``call_chain``, which runs the entries one after another with the GIL released once. The
members keep their buffers (arena views planned for the unchained steps, so the memory
plan and the release lists stay exact) and their order; only the Python dispatch between
them goes (measurements: ``docs/performance.md``).

A kernel that reads memory at indices it does not check (a fused Gather's,
``NativeKernel.index_bounds``) is a member too. Indices it takes as an input are checked
by one more native entry run just before it (the runtime's ``geode_check_indices``); an
index out of range stops the chain there, and the chain reads the indices again to raise
the same :class:`ExecutionError` as the unchained step, naming the step and the index.
Indices folded into the kernel as constants depend only on the binding: they are checked
once per binding, before the chain's first run with it.

A chain may have a native entry of its own (``entry_maker``, injected by the plan's
builder: the LLVM backend generates one function calling every member by symbol,
``codegen/backends/llvm/chain.py``): ``call_chain`` then validates the arguments as
before and makes one call into it instead of looping over the members; the same slices,
the same status. Without one (no maker, or it has no object code) the loop runs.

A step the executor memoizes (``Plan.memo_steps``) is never part of a chain. A member
that reads an alias (a view, ``Plan.aliases``) of what an earlier member wrote gets the
view from the chain itself: the executor makes aliases only after a step returns.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from geode.errors import ExecutionError
from geode.runtime.engines import IndexBound, NativeKernel, index_error, index_range, view
from geode.runtime.plan import Step

__all__ = [
    "EntryMaker",
    "chainable",
    "chain_shape",
    "chain_step",
    "describe_chains",
    "entries_of",
]

#: the most native entries one chain runs (the native runtime's limit)
MAX_CHAIN = 256


def chainable(kernel: Any) -> bool:
    """Whether a step's kernel can join a chain: a NativeKernel with a lean entry whose
    callable knows its native address (its index checks join with it, see the module
    docs)."""
    return (
        isinstance(kernel, NativeKernel)
        and kernel.call is not None
        and getattr(kernel.fn, "address", None) is not None
    )


#: makes a chain's native entry: ``maker(shape, addresses, name)``, ``shape`` per member
#: its (number of arrays, number of ints), ``addresses`` its entry's; returns an object
#: with the entry's ``address`` (held by the chain: the code lives as long as it), or None
EntryMaker = Callable[[tuple[tuple[int, int], ...], tuple[int, ...], str], Any]

#: alias slot -> (its root slot, ``view(root_array, env)``)
Views = Mapping[int, tuple[int, Callable[[np.ndarray, Any], np.ndarray]]]

#: a native entry a chain runs: (step position, None) for the step's kernel, (step
#: position, bound) for the check of one of its index inputs, run just before it
Member = tuple[int, IndexBound | None]


def _picker(picks: Sequence[int]) -> Callable[[list], tuple]:
    """``src -> tuple(src[p] for p in picks)``, in one C call."""
    if len(picks) == 1:
        only = picks[0]
        return lambda src: (src[only],)
    return operator.itemgetter(*picks)  # type: ignore[return-value]


def _members(kernels: Sequence[NativeKernel]) -> list[Member]:
    """The native entries of a chain of ``kernels``, in run order: each kernel's index
    input checks, then the kernel."""
    members: list[Member] = []
    for k, kern in enumerate(kernels):
        members += [(k, b) for b in kern.index_bounds if b.input is not None]
        members.append((k, None))
    return members


def entries_of(kernel: NativeKernel) -> int:
    """How many native entries a chain runs for ``kernel``: its index input checks, and
    itself (a chain runs at most :data:`MAX_CHAIN`)."""
    return 1 + sum(b.input is not None for b in kernel.index_bounds)


def _entries(steps: Sequence[Step], kernels: Sequence[NativeKernel]) -> tuple:
    """Per native entry of the chain: (address, number of arrays, of inputs, of ints)."""
    from geode.runtime import native

    check = (native.symbols()["geode_check_indices"], 1, 1, 2)
    return tuple(
        check
        if b is not None
        else (
            kernels[k].fn.address,
            len(steps[k].inputs[: kernels[k].n_inputs]) + len(steps[k].outputs),
            kernels[k].n_inputs,
            len(kernels[k].dims) + 1,
        )
        for k, b in _members(kernels)
    )


def chain_shape(
    steps: Sequence[Step], kernels: Sequence[NativeKernel]
) -> tuple[tuple[int, int], ...]:
    """Per native entry of a chain of ``steps``: its number of arrays and of ints (what
    a chain's own entry is generated from: :data:`EntryMaker`)."""
    return _shape(_entries(steps, kernels))


def _shape(entries: tuple) -> tuple[tuple[int, int], ...]:
    """Per native entry (:func:`_entries`) its number of arrays and of ints."""
    return tuple((e[1], e[3]) for e in entries)


@dataclass
class _Layout:
    """Where a chain's arguments come from. The sources are the run's inputs, then its
    outputs, then the aliases of outputs later members read (``made``: made from a
    source by a view), then the arguments a member views differently (``reviewed``);
    ``picks`` lists, member after member, the source of each array it gets."""

    inputs: list[int | None]
    outputs: list[int]
    members: list[Member]
    entries: tuple[tuple[int, int, int, int], ...]
    made: list[tuple[int, Callable[[np.ndarray, Any], np.ndarray]]] = field(default_factory=list)
    picks: list[int] = field(default_factory=list)
    #: (source position, view) of each argument a member views differently: each is
    #: appended to the sources once and picked from there
    reviewed: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)
    #: per member, how its ints are made: the dim functions, then a constant (a kernel's
    #: threads) or, for an index check, the source position of its indices (the int
    #: says whether they are unsigned)
    int_plan: list[tuple[list, int, int | None]] = field(default_factory=list)

    def first_array(self, m: int) -> int:
        """Where member ``m``'s arrays start in those handed to ``call_chain``."""
        return sum(e[1] for e in self.entries[:m])

    def first_int(self, m: int) -> int:
        """Where member ``m``'s ints start in those handed to ``call_chain``."""
        return sum(e[3] for e in self.entries[:m])


def _layout(steps: Sequence[Step], kernels: Sequence[NativeKernel], views: Views) -> _Layout:
    """The :class:`_Layout` of a chain of ``steps`` (see :func:`chain_step`)."""
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
    members = _members(kernels)
    lay = _Layout(inputs, outputs, members, _entries(steps, kernels))
    source = {slot: p for p, slot in enumerate(inputs)}
    source.update({o: len(inputs) + j for j, o in enumerate(outputs)})
    source.update({a: len(inputs) + len(outputs) + j for j, a in enumerate(derived)})
    lay.made = [(source[views[a][0]], views[a][1]) for a in derived]
    n_src = len(inputs) + len(outputs) + len(derived)
    for k, b in members:
        st, kern = steps[k], kernels[k]
        if b is not None:
            lay.picks.append(source[st.inputs[b.input]])
            lay.int_plan.append(([b.dim], 0, lay.picks[-1]))
            continue
        args = [source[s] for s in [*st.inputs[: kern.n_inputs], *st.outputs]]
        for j, v in enumerate(kern.views):
            if v is not None:
                if (args[j], v) not in lay.reviewed:
                    lay.reviewed.append((args[j], v))
                args[j] = n_src + lay.reviewed.index((args[j], v))
        lay.picks += args
        lay.int_plan.append((list(kern.dims), kern.threads, None))
    return lay


def _refusal(
    status: int,
    lay: _Layout,
    names: list[str],
    kernels: Sequence[NativeKernel],
    arrays: tuple,
    ints: tuple,
) -> ExecutionError:
    """The error of the member that stopped the chain with ``status``: an index check
    reads the indices again to name the one out of range."""
    m, code = (status >> 32) - 1, status & 0xFFFFFFFF
    k, bound = lay.members[m]
    if bound is not None:
        ind = arrays[lay.first_array(m)]
        msg = index_error(bound, index_range(ind), ints[lay.first_int(m)]) if code == 1 else None
        why = msg or f"{bound.node}: indices of type {ind.dtype} cannot be checked"
        return ExecutionError(f"step {names[k]!r}: {why}")
    try:
        kernels[k].fn._bad_argument(code - 1)
    except ValueError as exc:
        return ExecutionError(f"step {names[k]!r}: {exc}")
    return ExecutionError(f"step {names[k]!r}: kernel returned status {code}")


def _one_by_one(
    lay: _Layout, names: list[str], kernels: Sequence[NativeKernel], arrays: tuple, ints: tuple
) -> int:
    """A strided argument: each member's own entry copies what it must (an index check
    runs in Python)."""
    pa = pi = 0
    for (k, bound), (_, n_arrays, _, n_ints) in zip(lay.members, lay.entries):
        if bound is not None:
            msg = index_error(bound, index_range(np.asarray(arrays[pa])), ints[pi])
            if msg is not None:
                raise ExecutionError(f"step {names[k]!r}: {msg}")
        else:
            try:
                kernels[k].call(tuple(arrays[pa : pa + n_arrays]), ints[pi : pi + n_ints])
            except ValueError as exc:
                raise ExecutionError(f"step {names[k]!r}: {exc}") from None
        pa, pi = pa + n_arrays, pi + n_ints
    return 0


def chain_step(
    steps: Sequence[Step],
    kernels: Sequence[NativeKernel],
    views: Views | None = None,
    entry_maker: EntryMaker | None = None,
) -> Step:
    """One step running ``steps`` (consecutive, each with its chainable kernel) in one
    native call; its inputs are those the run reads from before it, its outputs every
    member's outputs, in order. ``views``: the plan's aliases; one whose root an earlier
    member writes is made inside the chain (after the chain's buffers exist).
    ``entry_maker``: makes the chain's own native entry (see the module docs; None, or
    a maker that returns None: the native runtime loops over the members)."""

    lay = _layout(steps, kernels, views or {})
    names = [st.name for st in steps]
    entry = None
    why = "loop: no chain entries (GEODE_CHAIN_ENTRY=0, the numba backend or no codegen)"
    if entry_maker is not None:
        addresses = tuple(e[0] for e in lay.entries)
        entry = entry_maker(_shape(lay.entries), addresses, names[0])
        why = "loop: no object code for its module (nothing is compiled at a load)"
    step = _chain_run(steps, kernels, lay, entry)
    if entry is not None:
        step.info["chain_entry"] = entry
        why = f"native entry ({len(lay.entries)} calls; object from {entry.source})"
    step.info["chain_how"] = why
    return step


def describe_chains(steps: Sequence[Step]) -> str:
    """What ``model.explain()`` says of a plan's chains: per chain its steps and whether
    its own native entry or the native runtime's loop runs them, and why ("" for none)."""
    chains = [st for st in steps if "chain" in st.info]
    if not chains:
        return ""
    lines = [f"chains of native steps ({len(chains)}), one crossing each:"]
    for st in chains:
        lines.append(f"  {st.name}: {len(st.info['chain'])} steps, {st.info.get('chain_how', '')}")
    return "\n".join(lines)


def _chain_run(
    steps: Sequence[Step], kernels: Sequence[NativeKernel], lay: _Layout, entry: Any
) -> Step:
    """:func:`chain_step`'s step, calling ``entry`` (None: the members one by one)."""
    from geode.runtime import native

    entries, made, reviewed, int_plan = lay.entries, lay.made, lay.reviewed, lay.int_plan
    folded = [
        (k, b, index_range(b.data))
        for k, kern in enumerate(kernels)
        for b in kern.index_bounds
        if b.input is None
    ]
    pick = _picker(lay.picks)
    shapes = [
        (k.out_shapes[j], k.out_dtypes[j])
        for st, k in zip(steps, kernels)
        for j in range(len(st.outputs))
    ]
    n_out = len(shapes)
    names = [st.name for st in steps]
    call_chain = native.call_chain
    address = None if entry is None else entry.address
    #: members whose kernel compiles code on the first call that needs it: (first array,
    #: arrays, prepare), run once per binding (``NativeKernel.prepare``)
    prepares = [
        (lay.first_array(m), lay.entries[m][1], kernels[k].prepare)
        for m, (k, b) in enumerate(lay.members)
        if b is None and kernels[k].prepare is not None
    ]
    #: per binding: the members' ints, and per reviewed argument the shape it has and
    #: the shape its view gets (all fixed by the binding; checked per call all the same)
    per_binding: dict[tuple, tuple[tuple, list[tuple[tuple, tuple]]]] = {}

    def for_binding(env: Any, src: list) -> tuple[tuple, list[tuple[tuple, tuple]]]:
        for k, b, span in folded:  # constant indices: right for every run of the binding
            msg = index_error(b, span, b.dim(env))
            if msg is not None:
                raise ExecutionError(f"step {names[k]!r}: {msg}")
        ints: list[int] = []
        for fns, last, at in int_plan:
            ints += [f(env) for f in fns]
            ints.append(last if at is None else int(src[at].dtype.kind == "u"))
        reshapes = [(src[p].shape, view(src[p], starts).shape) for p, starts in reviewed]
        if len(per_binding) >= 8:  # a few bindings; threads may race here: harmless
            per_binding.clear()
        if not prepares:  # else kept once the members' code is ready (``run``)
            per_binding[tuple(env.items())] = (tuple(ints), reshapes)
        return tuple(ints), reshapes

    def run(ins: list, outs: list, env: Any) -> list:
        results = list(outs)
        if len(results) < n_out:
            results += [None] * (n_out - len(results))
        for j, buf in enumerate(results):
            if buf is None:
                shape_fn, dtype = shapes[j]
                results[j] = np.empty(shape_fn(env), dtype)
        src = [*ins, *results]
        for p, make in made:
            src.append(make(src[p], env))
        got = per_binding.get(tuple(env.items()))
        ints, reshapes = got if got is not None else for_binding(env, src)
        for (p, starts), (have, want) in zip(reviewed, reshapes):
            a = src[p]
            src.append(a.reshape(want) if a.shape == have else view(a, starts))
        arrays = pick(src)
        if got is None and prepares:  # another thread skips them once the binding is kept
            for first, n, prepare in prepares:
                prepare(arrays[first : first + n])
            per_binding[tuple(env.items())] = (ints, reshapes)
        try:
            status = call_chain(entries, arrays, ints, address)
        except native.ArgumentError:
            status = _one_by_one(lay, names, kernels, arrays, ints)
        if status:
            raise _refusal(status, lay, names, kernels, arrays, ints)
        return results

    run.entry = entry  # type: ignore[attr-defined]  # its code lives while the step does
    label = " | ".join(st.label for st in steps)
    info = {"chain": names}
    return Step("chain:" + names[0], "aicore", run, lay.inputs, lay.outputs, label, info)
