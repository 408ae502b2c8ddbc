"""The pass pipeline: one ordered list of graph passes, run to a fixed point.

Each pass is a function ``(graph) -> bool`` that says whether it changed the graph.
``run_pipeline`` runs the list in rounds until a round changes nothing (at most
``max_rounds``), calls ``on_pass`` after every pass (debug dumps hook in there), and
returns a :class:`PassRecord` per pass run. Passes marked ``optional`` run only when
named in ``enabled``; any pass can be skipped by naming it in ``disabled``
(``GEODE_DISABLE_PASSES=cse,simplify``). Passes marked ``decides`` (``fuse_conv``: the
conv epilogue fusion decisions; ``row_scale``: row scales folded into GEMMs) also record each decision they make, taken or refused,
in the ``decisions`` mapping given to ``run_pipeline`` (node name -> line, a later round's
decision replacing an earlier one).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from geode.compiler.ir import Graph
from geode.compiler.passes.const_fold import fold_constants
from geode.compiler.passes.cse import cse
from geode.compiler.passes.dce import dce
from geode.compiler.passes.decompose import decompose
from geode.compiler.passes.fold_bn import fold_batch_norm
from geode.compiler.passes.fuse_conv import fuse_conv_epilogues
from geode.compiler.passes.rnn_layout import absorb_lstm_transposes
from geode.compiler.passes.rnn_states import drop_zero_states
from geode.compiler.passes.row_scale import fold_row_scales
from geode.compiler.passes.simplify import simplify
from geode.compiler.passes.variable_format import accelerate_variable_formats
from geode.compiler.passes.variable_prepare import prepare_variables
from geode.compiler.passes.variables import (
    SessionVariables,
    fold_var_is_initialized,
    freeze_read_only_variables,
    mark_read_only_variables,
)
from geode.errors import GeodeError

PassFn = Callable[[Graph], bool]


@dataclass(frozen=True)
class Pass:
    """A named graph pass; ``optional`` passes run only when enabled by name; ``session``
    passes also take what the compiling session knows of the graph's variables
    (``fn(graph, session=...)``); ``decides`` passes record their decisions
    (``fn(graph, decisions=...)``)."""

    name: str
    fn: PassFn
    optional: bool = False
    session: bool = False
    decides: bool = False


@dataclass
class PassRecord:
    """What one pass run did: name, round, whether it changed the graph, node counts, time."""

    name: str
    changed: bool
    nodes_before: int
    nodes_after: int
    seconds: float
    round: int = 0


# fmt: off
PIPELINE: list[Pass] = [
    Pass("variable_prepare", prepare_variables),  # first: reads the graph's order
    Pass("var_is_initialized", fold_var_is_initialized, session=True),
    Pass("mark_variables", mark_read_only_variables),
    Pass("freeze_variables", freeze_read_only_variables, optional=True),
    Pass("fold_bn", fold_batch_norm),  # before decompose splits BatchNormalization
    Pass("decompose", decompose),
    Pass("rnn_layout", absorb_lstm_transposes),  # before simplify folds what it leaves
    Pass("rnn_zero_states", drop_zero_states),  # after rnn_layout's views, before dce
    Pass("simplify", simplify),
    Pass("variable_format", accelerate_variable_formats, session=True),  # after decompose
    Pass("const_fold", fold_constants),
    Pass("cse", cse),
    Pass("dce", dce),
    Pass("fuse_conv", fuse_conv_epilogues, decides=True),  # last: fold_bn has folded what it can
    Pass("row_scale", fold_row_scales, decides=True),  # after const_fold: the weights constant
]
# fmt: on


def pass_names() -> list[str]:
    """Names of every pass in the pipeline, in order."""
    return [p.name for p in PIPELINE]


def run_pipeline(
    graph: Graph,
    *,
    disabled: Collection[str] = (),
    enabled: Collection[str] = (),
    on_pass: Callable[[str, Graph, bool], None] | None = None,
    max_rounds: int = 4,
    fold_limit: int | None = None,
    verify: bool = False,
    passes: list[Pass] | None = None,
    session_variables: SessionVariables | None = None,
    decisions: dict[str, str] | None = None,
) -> list[PassRecord]:
    """Run the pipeline on ``graph`` in place until nothing changes; returns one record per pass run.

    ``disabled`` names passes to skip, ``enabled`` optional passes to run (unknown
    names raise :class:`GeodeError`). ``fold_limit`` overrides const_fold's minimum
    size budget in bytes. With ``verify`` the graph's invariants are checked after
    every pass that changed it. ``session_variables`` is what the compiling session
    knows of variables (their storage formats, whether they have values), for the
    passes marked ``session``; ``decisions`` receives what the passes marked ``decides``
    decided (see the module docstring). The graph ends topologically sorted.
    """
    plist = PIPELINE if passes is None else passes
    known = {p.name for p in plist}
    for what, names in (("disabled", disabled), ("enabled", enabled)):
        unknown = sorted(set(names) - known)
        if unknown:
            raise GeodeError(
                f"{what} passes {unknown} are not passes; known: {[p.name for p in plist]}"
            )
    active = [
        p
        for p in plist
        if p.name not in set(disabled) and (not p.optional or p.name in set(enabled))
    ]
    if fold_limit is not None:
        active = [
            Pass(p.name, functools.partial(fold_constants, min_bytes=fold_limit), p.optional)
            if p.fn is fold_constants
            else p
            for p in active
        ]
    active = [
        Pass(p.name, functools.partial(p.fn, session=session_variables or {}), p.optional)
        if p.session
        else p
        for p in active
    ]
    active = [
        Pass(p.name, functools.partial(p.fn, decisions=decisions), p.optional) if p.decides else p
        for p in active
    ]
    records: list[PassRecord] = []
    graph.sort()
    for rnd in range(max(1, max_rounds)):
        any_change = False
        for p in active:
            before = len(graph.nodes)
            t0 = time.perf_counter()
            try:
                changed = bool(p.fn(graph))
                if changed:
                    graph.sort()
                    if verify:
                        graph.verify()
            except Exception as exc:
                exc.add_note(f"in graph pass {p.name!r} (round {rnd + 1}) on graph {graph.name!r}")
                raise
            records.append(
                PassRecord(
                    p.name, changed, before, len(graph.nodes), time.perf_counter() - t0, rnd + 1
                )
            )
            if on_pass is not None:
                on_pass(p.name, graph, changed)
            any_change |= changed
        if not any_change:
            break
    graph.sort()
    return records
