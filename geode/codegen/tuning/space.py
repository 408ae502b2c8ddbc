"""A kernel's schedule space: knobs over the default schedule, and the schedule a
setting of them gives.

A *setting* maps knob names to values; a knob it does not name keeps its default (the
first of its values), so the empty setting is the default schedule. Most knobs are
fields of :class:`~geode.codegen.autoschedule.Choices` that the default schedules read
(split and tile factors, rfactor runs, a column reduction's row runs and column tiles, whether loops run in parallel, the prefetch
distance and chunks, software pipelining, chains split in passes, stream chunks and
the interleave of streamed loops); ``streaming`` is the streaming-stores threshold the
driver passes (``auto``: the cache size, ``off``, ``always``); ``interleave`` and
``unroll`` edit the schedule afterwards with primitives (every vectorized loop
interleaved by that factor; every innermost serial loop of at most
:data:`UNROLL_MAX` iterations unrolled). Whatever a setting does ends up in the
schedule's trace, so the trace alone reproduces it.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from geode.codegen import ast as A
from geode.codegen.autoschedule import override_choices
from geode.codegen.driver import default_schedule
from geode.codegen.lower import LoweredKernel
from geode.codegen.schedule import Schedule
from geode.compiler.fusion.groups import Group
from geode.config import Options
from geode.errors import ScheduleError

#: the longest innermost serial loop the ``unroll`` knob unrolls
UNROLL_MAX = 16

#: a setting of the knobs: name -> value (unnamed knobs keep their default)
Setting = dict[str, Any]


@dataclass(frozen=True)
class Knob:
    """One dimension of the space: its name, its values (the default first) and how it
    applies (``choice``: a Choices field; ``streaming``, ``interleave``, ``unroll``)."""

    name: str
    values: tuple[Any, ...]
    kind: str
    doc: str

    @property
    def default(self) -> Any:
        """The value the default schedule uses."""
        return self.values[0]


KNOBS: tuple[Knob, ...] = (
    Knob("rfactor_partials", (64, 1, 16, 256), "choice", "runs of a full reduction (1: serial)"),
    Knob("rfactor_max_outputs", (1, 64), "choice", "two steps for reductions of a few rows"),
    Knob("column_partials", (1, 2, 4, 8), "choice", "a column reduction's row runs"),
    Knob("column_tile", (0, 512, 256, 128, 64, 32), "choice", "a column reduction's tile"),
    Knob("parallel", (1, 0), "choice", "loops in parallel, or one thread"),
    Knob("parallel_min_elements", (1 << 15, 1 << 12), "choice", "the smallest parallel domain"),
    Knob("vector_chunk", (4096, 1024, 16384), "choice", "split factor of a 1-D nest"),
    Knob("transpose_tile_bytes", (128, 64, 256), "choice", "tile edge of a transpose"),
    Knob("prefetch_ahead_bytes", (64 << 10, 16 << 10, 256 << 10), "choice", "prefetch distance"),
    Knob("prefetch_chunk", (128, 64, 256), "choice", "chunk of a row pass carrying prefetches"),
    Knob("pipeline_max_host_ops", (8, 0, 1000), "choice", "software pipelining of row passes"),
    Knob("split_min_chain", (2, 99), "choice", "a chain of math functions split in passes"),
    Knob("stream_chunk", (128, 64, 256), "choice", "chunk of a streamed output"),
    Knob("stream_interleave", (4, 1, 2, 8), "choice", "interleave of streamed loops"),
    Knob("streaming", ("auto", "off", "always"), "streaming", "streaming stores"),
    Knob("interleave", (1, 2, 4), "interleave", "every vectorized loop interleaved"),
    Knob("unroll", (False, True), "unroll", "short innermost serial loops unrolled"),
)

_BY_NAME = {k.name: k for k in KNOBS}


def knob(name: str) -> Knob:
    """The knob called ``name`` (KeyError when there is none)."""
    return _BY_NAME[name]


def normalize(setting: Setting) -> Setting:
    """``setting`` without the knobs at their default, in knob order."""
    return {k.name: setting[k.name] for k in KNOBS if setting.get(k.name, k.default) != k.default}


def select(names: Sequence[str] | None) -> tuple[Knob, ...]:
    """The knobs called ``names`` (all for None), in knob order; KeyError naming an
    unknown one."""
    if names is None:
        return KNOBS
    unknown = sorted(set(names) - set(_BY_NAME))
    if unknown:
        raise KeyError(f"unknown knobs {unknown}; the knobs are {[k.name for k in KNOBS]}")
    return tuple(k for k in KNOBS if k.name in set(names))


def neighbours(setting: Setting, knobs: Sequence[str] | None = None) -> Iterator[Setting]:
    """Every setting that changes one knob of ``setting`` (of ``knobs``, default all) to
    another of its values."""
    for k in select(knobs):
        current = setting.get(k.name, k.default)
        for v in k.values:
            if v != current:
                yield normalize({**setting, k.name: v})


def build(lowered: LoweredKernel, group: Group, opts: Options, setting: Setting) -> Schedule:
    """The schedule ``setting`` gives ``lowered`` (the default schedule under its choices,
    then its edits); ScheduleError when an edit cannot apply."""
    choices = {k.name: setting[k.name] for k in KNOBS if k.kind == "choice" and k.name in setting}
    streaming = setting.get("streaming", "auto")
    run_opts = opts if streaming == "auto" else opts.replace(streaming=_STREAMING[streaming])
    with override_choices(**choices):
        sch = default_schedule(lowered, group, run_opts)
    factor = setting.get("interleave", 1)
    if factor > 1:
        for f in _loops(sch, A.ForKind.VECTORIZED):
            if f.interleave == 1:
                sch.interleave(f.var, factor)
    if setting.get("unroll", False):
        unrolled = 0
        for f in _loops(sch, A.ForKind.SERIAL):
            if _short_innermost(f):
                with contextlib.suppress(ScheduleError):
                    sch.unroll(f.var, UNROLL_MAX)
                    unrolled += 1
        if not unrolled:
            raise ScheduleError("unroll", "-", "no short innermost serial loop to unroll")
    return sch


def live_knobs(
    lowered: LoweredKernel, group: Group, opts: Options, knobs: Sequence[str] | None = None
) -> list[Knob]:
    """The knobs (of ``knobs``, default all) of which some value changes ``lowered``'s
    default schedule (the others do not apply to this kernel: no transpose to tile, no
    full reduction to cut)."""
    base = A.format_kernel(build(lowered, group, opts, {}).kernel)
    live = []
    for k in select(knobs):
        for v in k.values[1:]:
            try:
                sch = build(lowered, group, opts, {k.name: v})
            except ScheduleError:
                continue
            if A.format_kernel(sch.kernel) != base:
                live.append(k)
                break
    return live


def enumerate_space(
    lowered: LoweredKernel,
    group: Group,
    opts: Options,
    limit: int,
    knobs: Sequence[str] | None = None,
) -> list[tuple[Setting, Schedule]] | None:
    """Every distinct schedule of the product of the live knobs' values (the default
    first), or None when the product has more than ``limit`` settings."""
    live = live_knobs(lowered, group, opts, knobs)
    size = 1
    for k in live:
        size *= len(k.values)
    if size > limit:
        return None
    out: dict[str, tuple[Setting, Schedule]] = {}
    for values in itertools.product(*(k.values for k in live)):
        setting = normalize(dict(zip((k.name for k in live), values)))
        try:
            sch = build(lowered, group, opts, setting)
        except ScheduleError:
            continue
        out.setdefault(A.format_kernel(sch.kernel), (setting, sch))
    return list(out.values())


_STREAMING = {"off": "off", "always": "0"}


def _loops(sch: Schedule, kind: A.ForKind) -> list[A.For]:
    return [s for s in A.walk_stmts(sch.kernel.body) if isinstance(s, A.For) and s.kind is kind]


def _short_innermost(f: A.For) -> bool:
    return (
        isinstance(f.extent, A.Const)
        and 1 < int(f.extent.value) <= UNROLL_MAX
        and not any(isinstance(s, A.For) for s in A.walk_stmts(f.body))
    )
