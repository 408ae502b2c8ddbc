"""Shrinking a failing case to a small one that still fails the same way.

:func:`shrink` is greedy and deterministic: it walks a fixed list of candidate
edits of the current case, checks each, keeps the first that still fails with the
same ``kind`` and starts over from it, until no edit helps or the budget is spent.
The edits, in order:

1. drop an output;
2. bypass a node: its readers (and the outputs) read one of its arguments instead;
3. cut a node: it becomes a graph input holding the values the reference computed
   for it in each run (everything only it needed goes away);
4. keep only one run;
5. shrink a dim toward 0 and 1 (to 0, 1, half, one less), slicing every input
   array along it (a symbolic dim in one run at a time).

After each edit the case is pruned (nodes no output needs, unused inputs and dims).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import numpy as np

from geode.compiler.interpret import run_reference
from geode.errors import GeodeError
from geode.fuzz.build import build_graph, shape_tokens
from geode.fuzz.spec import Case, InputSpec

#: a predicate: does this candidate still fail the same way?
StillFails = Callable[[Case], bool]


def _drop_outputs(case: Case) -> Iterator[Case]:
    if len(case.outputs) < 2:
        return
    for out in case.outputs:
        cand = case.copy()
        cand.outputs.remove(out)
        yield cand


def _replace_value(case: Case, old: str, new: str) -> None:
    for node in case.nodes:
        node.args = [new if a == old else a for a in node.args]
    outs: list[str] = []
    for o in case.outputs:
        o = new if o == old else o
        if o not in outs:
            outs.append(o)
    case.outputs = outs


def _bypass(case: Case, dtype_of: dict[str, str]) -> Iterator[Case]:
    for node in reversed(case.nodes):
        if node.op == "Const":
            continue
        for arg in dict.fromkeys(a for a in node.args if a):
            if dtype_of.get(arg) != dtype_of.get(node.out):
                continue
            cand = case.copy()
            cand.nodes = [n for n in cand.nodes if n.out != node.out]
            _replace_value(cand, node.out, arg)
            yield cand


def _reference_values(case: Case) -> tuple[dict[str, tuple], list[dict[str, np.ndarray]]] | None:
    """Shapes and reference values of every value, per run (None if a run fails)."""
    try:
        graph = build_graph(case)
        values = [run_reference(graph, feeds, keep_all=True) for feeds in case.feeds]
    except GeodeError:
        return None
    shapes = {v.name: v.shape for v in graph.values.values() if v.shape is not None}
    return shapes, values


def _cut(case: Case) -> Iterator[Case]:
    ref = _reference_values(case)
    if ref is None:
        return
    shapes, values = ref
    # cut the nodes with the most ancestors first: each cut removes the most
    order = sorted(
        (n for n in case.nodes if n.op != "Const" and n.args),
        key=lambda n: -len(case.ancestors(n.out)),
    )
    for node in order:
        tokens = shape_tokens(case, shapes.get(node.out, ()))
        if tokens is None or any(node.out not in v for v in values):
            continue
        cand = case.copy()
        cand.nodes = [n for n in cand.nodes if n.out != node.out]
        dtype = str(values[0][node.out].dtype)
        cand.inputs.append(InputSpec(node.out, tokens, dtype))
        for run, feeds in enumerate(cand.feeds):
            feeds[node.out] = np.array(values[run][node.out])
        yield cand


def _one_run(case: Case) -> Iterator[Case]:
    if len(case.feeds) < 2:
        return
    for run in range(len(case.feeds)):
        cand = case.copy()
        cand.feeds = [cand.feeds[run]]
        for d in cand.dims:
            if d.symbolic:
                d.sizes = [d.sizes[run]]
        yield cand


def _slice_dim(case: Case, dim: str, size: int, runs: list[int]) -> None:
    for spec in case.inputs:
        for axis, tok in enumerate(spec.dims):
            if tok != dim:
                continue
            for run in runs:
                arr = case.feeds[run][spec.name]
                case.feeds[run][spec.name] = np.take(arr, np.arange(size), axis=axis)


def _shrink_dims(case: Case) -> Iterator[Case]:
    for d in case.dims:
        runs = list(range(len(case.feeds)))
        for run in runs if d.symbolic else [0]:
            current = d.sizes[run]
            for size in dict.fromkeys([0, 1, current // 2, current - 1]):
                if not 0 <= size < current:
                    continue
                cand = case.copy()
                spec = cand.dim(d.name)
                spec.sizes[run] = size
                _slice_dim(cand, d.name, size, [run] if d.symbolic else runs)
                yield cand


def candidates(case: Case) -> Iterator[Case]:
    """Every candidate edit of ``case``, in the shrinker's order, pruned."""
    try:
        graph = build_graph(case)
        dtype_of = {v.name: str(v.dtype) for v in graph.values.values()}
    except GeodeError:
        dtype_of = {}
    for gen in (
        _drop_outputs(case),
        _bypass(case, dtype_of),
        _cut(case),
        _one_run(case),
        _shrink_dims(case),
    ):
        for cand in gen:
            cand.prune()
            yield cand


def size_of(case: Case) -> tuple[int, int, int, int]:
    """How big a case is: nodes (Const excluded), runs, input elements, outputs."""
    nodes = sum(1 for n in case.nodes if n.op != "Const")
    elements = sum(int(np.asarray(a).size) for feeds in case.feeds for a in feeds.values())
    return nodes, len(case.feeds), elements, len(case.outputs)


def shrink(
    case: Case, still_fails: StillFails, max_checks: int = 400, max_seconds: float = 300.0
) -> tuple[Case, int]:
    """The smallest case reached from ``case`` by edits that keep ``still_fails`` true,
    and the number of checks spent (at most ``max_checks``, about ``max_seconds``)."""
    best = case.copy()
    best.prune()
    checks = 0
    deadline = time.monotonic() + max_seconds
    improved = True
    while improved and checks < max_checks and time.monotonic() < deadline:
        improved = False
        for cand in candidates(best):
            if checks >= max_checks or time.monotonic() >= deadline:
                break
            if size_of(cand) >= size_of(best):
                continue
            checks += 1
            if still_fails(cand):
                best, improved = cand, True
                break
    return best, checks
