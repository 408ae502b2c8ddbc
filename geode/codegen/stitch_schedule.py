"""The default schedule of a stitch group: row and column reductions, one pass.

A stitch group (``compiler/fusion/stitch.py``) lowers to two reduction nests over the
same input ``x[N, M]`` (the column reduction's axes lead the domain, the row
reduction's trail it; several trailing axes are fused into one column loop first,
several leading ones keep their loops, the first cut into the row blocks)::

    for (i, 0, N)                          # row reduction R
      for (j, 0, M)
        r[i] = r[i] + f(x[i, j])
    for (j', 0, M)                         # column reduction C
      for (i', 0, N)
        c[j'] = c[j'] + f(x[i', j'])

:func:`schedule_stitch` turns them into one pass over ``x``, rows in ``P`` parallel
blocks, each with a private row of column partials (``rfactor(..., partials="outer",
partials_axis="first")``), the row reduction moved under the block's row loop
(``compute_at``) and its column loop fused with the partials' (``fuse_siblings``),
so one vectorized loop both reduces the row horizontally and accumulates the columns
vertically; then the partials are combined::

    for (p, 0, P)                                   parallel
      for (i1, 0, ceil(N / P))
        r[p * run + i1] = 0                         (guard p * run + i1 < N)
        for (j, 0, M)                               vectorized
          c_rf[p, j] = c_rf[p, j] + f(x[p * run + i1, j])
          r[p * run + i1] = r[p * run + i1] + f(x[p * run + i1, j])
    for (p', 0, P)
      for (j', 0, M)                                vectorized
        c[j'] = c[j'] + c_rf[p', j']

Further row reductions of the group join the same loop (each moved and fused the
same way); a full-domain pass the group stores (``x * x``, also an output) joins it
when ``compute_at`` allows (one column axis), else stays a nest of its own. A mean's
division, the inits and the combine stay nests of their own (vectorized).
Every step is a checked schedule primitive, so a failure raises ``ScheduleError`` and
the caller falls back to a simpler schedule (the two nests as lowered, one kernel).
"""

from __future__ import annotations

from geode.codegen import ast as A
from geode.codegen.schedule import Schedule
from geode.compiler.fusion.groups import Group
from geode.debug import log
from geode.errors import ScheduleError


def _updates(sch: Schedule) -> list[str]:
    return [
        n
        for n in sch.blocks()
        if sch.get_block(n).reduce_of is None
        and any(iv.kind == "reduce" for iv in sch.get_block(n).iter_vars)
    ]


def row_and_column_blocks(sch: Schedule, group: Group) -> tuple[list[str], str]:
    """The row reductions' update blocks (one or more, over the same axes) and the
    column reduction's of a stitch group: the group lowers the column reduction first
    (``stitch.lowering_order``), so it is the first update block in program order."""
    updates = _updates(sch)
    if len(updates) < 2:
        raise ScheduleError("stitch", updates[0] if updates else "-", "fewer than two reductions")
    rows, cols = group.branches

    def reduced(name: str) -> int:
        return [iv.kind for iv in sch.get_block(name).iter_vars].count("reduce")

    col, row_side = updates[0], updates[1:]
    if reduced(col) != len(cols) or any(reduced(n) != len(rows) for n in row_side):
        raise ScheduleError("stitch", col, "cannot tell the row and column reductions")
    return row_side, col


def _fused(sch: Schedule, loops: list[str]) -> str:
    return sch.fuse(loops) if len(loops) > 1 else loops[0]


def _init_of(sch: Schedule, block: str) -> str:
    for n in sch.blocks():
        if sch.get_block(n).reduce_of == block:
            return n
    raise ScheduleError("stitch", block, "the reduction has no init block")


def _static(e: A.Expr) -> int | None:
    return int(e.value) if isinstance(e, A.Const) else None


def schedule_stitch(sch: Schedule, group: Group, par: bool, partials: int) -> None:
    """Schedule a stitch group as in the module docstring: ``partials`` row blocks
    (at most one per row when the rows are static), run in parallel when ``par``.
    With several row axes the first is cut into the blocks and the others stay loops
    inside them; several column axes are fused into one loop.

    Requirements: the group's kernel has one column reduction update block, nest
    ``columns | rows``, and one or more row reductions', nests ``rows | columns``
    (as lowered, prologues inlined); the primitives' own requirements (a failure
    raises ``ScheduleError``, the kernel left in an unspecified state: schedule a fresh
    copy)."""
    rows, col = row_and_column_blocks(sch, group)
    n_rows = len(group.branches[1])  # axes the column reduction reduces lead the domain
    c_loops = sch.get_loops(col)
    c_sp = _fused(sch, c_loops[: len(c_loops) - n_rows])
    c_red = sch.get_loops(col)[1:]
    extent = _static(sch.get_loop(c_red[0]).extent)
    p = max(1, min(partials, extent)) if extent is not None else max(1, partials)
    p0, p1 = sch.rfactor(col, c_red[0], p, partials="outer", partials_axis="first")
    rf = next(n for n in sch.blocks() if p0 in sch.get_loops(n))
    sch.reorder([p0, p1, *c_red[1:], c_sp])
    anchor = c_red[-1] if len(c_red) > 1 else p1
    j = c_sp
    for row in rows:
        j = _join_row(sch, row, n_rows, p, anchor, j)
    for name in sch.blocks():
        if name not in (*rows, rf) and _writes_domain(sch, name, len(group.domain)):
            j = _join_pass(sch, name, n_rows, p, anchor, j)
    if par and p > 1:
        sch.parallel(p0)
    sch.vectorize(j, allow_reassoc=True)
    _by_rows(sch, col)
    _by_rows(sch, _init_of(sch, rf))
    for name in sch.blocks():
        loops = sch.get_loops(name)
        last = sch.get_loop(loops[-1]) if loops else None
        if (
            last is not None
            and last.kind is A.ForKind.SERIAL
            and all(isinstance(s, A.Block) for s in last.body)
            and _static(last.extent) != 1
        ):
            sch.vectorize(loops[-1], allow_reassoc=True)


def _join_row(sch: Schedule, row: str, n_rows: int, p: int, anchor: str, j: str) -> str:
    """Move row reduction ``row`` (and its init) into the row blocks: its leading loop
    split like the partials' rows, ``compute_at`` the block's row loop, its reduce loop
    fused with the column loop ``j``; returns the fused loop."""
    r_first = sch.get_loops(row)[0]
    r_red = _fused(sch, sch.get_loops(row)[n_rows:])
    init = _init_of(sch, row)
    i_loops = sch.get_loops(init)
    if len(i_loops) < n_rows:
        raise ScheduleError("stitch", init, "the row init has fewer loops than the rows")
    if len(i_loops) > n_rows:  # keepdims: unit loops over the reduced axes
        _fused(sch, i_loops[n_rows - 1 :])
    sch.split(r_first, [p, None])
    sch.split(sch.get_loops(init)[0], [p, None])
    sch.compute_at(row, anchor)
    return sch.fuse_siblings(j, r_red)


def _writes_domain(sch: Schedule, block: str, rank: int) -> bool:
    """Whether ``block`` is an elementwise block alone at kernel level in a nest of
    ``rank`` loops (a prologue value that is also an output, ``x * x`` stored)."""
    b = sch.get_block(block)
    loops = sch.get_loops(block)
    return (
        b.reduce_of is None
        and all(iv.kind == "spatial" for iv in b.iter_vars)
        and len(loops) == rank
        and len(sch.get_loop(loops[0]).body) == 1
    )


def _join_pass(sch: Schedule, block: str, n_rows: int, p: int, anchor: str, j: str) -> str:
    """Move a full-domain elementwise pass (a prologue value stored as an output) into
    the row blocks, its column loop fused with theirs, so it too runs in parallel and
    reads the row while it is in cache. Optional: a primitive that refuses leaves the
    pass a nest of its own (the last ones applied leave it split, same values).
    Returns the fused column loop (its name is the pass's loop once fused)."""
    try:
        loops = sch.get_loops(block)
        _fused(sch, loops[n_rows:])
        sch.split(loops[0], [p, None])
        inner = sch.compute_at(block, anchor)
        return sch.fuse_siblings(inner[-1], j)
    except ScheduleError as exc:
        log.debug("stitch: %s stays a pass of its own: %s", block, exc)
        return j


def _by_rows(sch: Schedule, block: str) -> None:
    """The final combine ``for j: for p: c[j] += c_rf[p, j]`` (and the partials' init)
    walks the partials by rows instead (``for p: for j``, ``j`` vectorized): unit
    stride."""
    loops = sch.get_loops(block)
    if len(loops) != 2:
        return
    sch.reorder([loops[1], loops[0]])
    sch.vectorize(loops[0], allow_reassoc=True)
