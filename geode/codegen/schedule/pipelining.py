"""Software pipelining of row passes: software_pipeline, defer_last_pass (the next
row's first pass overlapped with this row's last, with double-buffered row temps).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from geode.codegen.ast import (
    Bin,
    Block,
    Buffer,
    Const,
    Expr,
    For,
    ForKind,
    If,
    IterVar,
    Load,
    Stmt,
    Store,
    StreamStore,
    Var,
    add,
    expr_str,
    floordiv,
    free_vars,
    loads,
    mul,
    sub,
    transform,
    walk_stmts,
)
from geode.codegen.ast import blocks as ast_blocks
from geode.codegen.indexing import index_parity
from geode.codegen.schedule.base import ScheduleBase
from geode.codegen.schedule.blocks import (
    accessed_buffers,
    block_exprs,
    block_reads,
    block_writes,
    index_of,
    is_flat_block,
    map_block_exprs,
    rename_loads,
    subst_loop_vars,
    walk_loops,
)
from geode.codegen.schedule.trace import primitive
from geode.errors import ScheduleError


@dataclass
class RowChunks:
    """A row loop of ``n`` rows cut into chunks of ``c`` rows: chunk loop ``vo`` over
    ``count`` chunks, row loop ``vi`` over the ``ext`` rows of chunk ``vo`` (the last
    chunk may be short), which starts at row ``start``; ``row`` is row ``vi``'s index."""

    c: Expr
    vo: str
    vi: str
    count: Expr
    start: Expr
    ext: Expr
    row: Expr


class Pipelining(ScheduleBase):
    """Software pipelining of row passes: software_pipeline, defer_last_pass."""

    @primitive
    def software_pipeline(
        self, loop: str, chunk: int = 64, min_chunks: int = 8, into: str | None = None
    ) -> list[str]:
        """Overlap each iteration's first pass with a later pass of the previous iteration:
        while row ``i``'s pass ``into`` (default: the last pass) runs, the same loop
        computes row ``i + 1``'s first pass, so the memory traffic of reading the next row
        (the first pass) overlaps the host pass's writes and arithmetic instead of
        alternating with them.
        ``loop`` (extent ``n``) is split into chunks of ``c = max(1, min(chunk, n //
        min_chunks))`` rows, run like ``loop`` (parallel if it was); each chunk runs its
        first row's first pass as a prologue. Returns the chunk loop and the row loop.

        Requirements: ``loop`` is serial or parallel; its body is loop-free blocks (the
        *head*, initialising the first pass), a loop ``F`` (the first pass), any
        statements, and last a loop; the host pass ``L`` (loop ``into``, or that last
        loop) is a loop of the body after ``F`` with the same extent as ``F``, which does not depend
        on the row; ``F`` and ``L`` hold only loop-free blocks; neither is parallel, and
        ``L`` is vectorized only if ``F`` is (its reductions were accepted for that); the
        head and ``F`` write only registers (0-d temps) and read only kernel inputs and
        the registers they write, each one set earlier in the same row (nothing is
        carried from row to row); nothing after ``F`` writes those registers.

        Those registers, where read after ``F``, are read from a copy taken at the top of
        the row (``<reg>_cur``), since the next row's first pass overwrites them during
        ``L`` (the next row's initialisation moves just before ``L``). In the last row of
        a chunk the "next" row is the row itself (a re-read from cache, the value unused).

        Example, ``software_pipeline("i", 64)`` on RMSNorm (``X: float32[N, K]``)::

            parallel for (i, 0, N)               parallel for (i_o, 0, (N + c - 1) // c)
              ScheduleBlock(S_init)                ScheduleBlock(S_init_pro) ... row i_o * c
                s[] = 0.0f                         serial for (k_pro, 0, K)
              serial for (k, 0, K)                   ScheduleBlock(S_pro) ... row i_o * c
                ScheduleBlock(S)                   serial for (i_i, 0, min(c, N - i_o * c))
                  s[] = s[] + X[i, k] ^ 2            ScheduleBlock(s_cur)
              serial for (k2, 0, K)       ->          s_cur[] = s[]
                ScheduleBlock(Y)                     ScheduleBlock(S_init) ... row i'
                  Y[i, k2] = X[i, k2] * f(s[])         s[] = 0.0f
                                                     serial for (k2, 0, K)
                                                       ScheduleBlock(Y) ... row i
                                                         Y[i, k2] = X[i, k2] * f(s_cur[])
                                                       ScheduleBlock(S) ... row i'
                                                         s[] = s[] + X[i', k2] ^ 2

        with ``c`` the chunk, ``i = i_o * c + i_i`` and
        ``i' = i_o * c + min(i_i + 1, min(c, N - i_o * c) - 1)``.
        """
        prim = "software_pipeline"
        f, cont, head, first, rest, host, regs = self._pipeline_plan(
            prim, loop, chunk, min_chunks, into
        )
        last = rest[host]
        assert isinstance(last, For)
        k = self.kernel
        rest_blocks = ast_blocks(rest)
        head_blocks = head + list(first.body)
        rc = self._row_chunks(f, chunk, min_chunks)
        vo, vi, start, ext, row = rc.vo, rc.vi, rc.start, rc.ext, rc.row
        nxt = add(start, Bin("min", add(Var(vi), Const(1)), sub(ext, Const(1))))
        used_regs = {ld.buffer for b in rest_blocks for e in block_exprs(b) for ld in loads(e)}
        cur: dict[str, str] = {}
        copies: list[Stmt] = []
        taken: set[str] = set()
        for r in sorted(regs & used_regs):
            cur[r] = self._fresh(f"{r}_cur", kind="buffer")
            k.temps.append(Buffer(cur[r], k.buffer(r).dtype, (), "register"))
            copies.append(
                Block(
                    self._fresh(cur[r], taken, kind="block"),
                    [],
                    [],
                    [Store(cur[r], (), Load(r, ()))],
                )
            )
        names: dict[str, str] = {
            b.name: self._fresh(f"{b.name}_pro", taken, kind="block") for b in head_blocks
        }
        pro_var = self._fresh(f"{first.var}_pro", taken)
        prologue = copy.deepcopy(head + [first])
        for b in ast_blocks(prologue):
            b.name = names[b.name]
            if b.reduce_of is not None:
                b.reduce_of = names.get(b.reduce_of, b.reduce_of)
        prologue[-1].var = pro_var  # type: ignore[attr-defined]
        subst_loop_vars(prologue, {f.var: start, first.var: Var(pro_var)})
        subst_loop_vars(rest, {f.var: row})
        for b in rest_blocks:
            map_block_exprs(b, lambda e: rename_loads(e, cur))
        subst_loop_vars(head, {f.var: nxt})
        subst_loop_vars(first.body, {f.var: nxt, first.var: Var(last.var)})
        last.body.extend(first.body)
        inner = For(vi, ext, copies + rest[:host] + head + rest[host:], ForKind.SERIAL)
        outer = For(vo, rc.count, prologue + [inner], f.kind)
        cont[next(i for i, x in enumerate(cont) if x is f)] = outer
        return [vo, vi]

    def _row_chunks(self, f: For, chunk: int, min_chunks: int) -> RowChunks:
        """Cut row loop ``f`` into chunks of at most ``chunk`` rows and at least
        ``min_chunks`` chunks (when there are that many rows), with fresh loop names."""
        n = f.extent
        c: Expr = (
            Const(max(1, min(chunk, int(n.value) // min_chunks)))
            if isinstance(n, Const)
            else Bin("max", Const(1), Bin("min", Const(chunk), floordiv(n, Const(min_chunks))))
        )
        vo, vi = self._fresh(f"{f.var}_o"), self._fresh(f"{f.var}_i")
        start = mul(Var(vo), c)
        count = floordiv(add(n, sub(c, Const(1))), c)
        return RowChunks(c, vo, vi, count, start, Bin("min", c, sub(n, start)), add(start, Var(vi)))

    def _pipeline_plan(
        self, prim: str, loop: str, chunk: int, min_chunks: int, into: str | None
    ) -> tuple[For, list[Stmt], list[Stmt], For, list[Stmt], int, set[str]]:
        """:meth:`software_pipeline`'s checks; returns the row loop, the list holding it, the
        head, the first pass, the statements after it, the host's index among them and the
        registers the head and first pass write."""
        f, cont, _ = self._locate_loop(prim, loop)
        blk = self._first_block(f)
        if f.kind not in (ForKind.SERIAL, ForKind.PARALLEL):
            raise ScheduleError(prim, blk, f"loop {loop} is {f.kind.value}")
        if chunk < 1 or min_chunks < 1:
            raise ScheduleError(prim, blk, "chunk and min_chunks must be positive")
        pos = next((i for i, x in enumerate(f.body) if isinstance(x, For)), None)
        if pos is None:
            raise ScheduleError(prim, blk, f"loop {loop} holds no pass")
        head, first, rest = f.body[:pos], f.body[pos], f.body[pos + 1 :]
        host = next(
            (
                i
                for i, x in enumerate(rest)
                if isinstance(x, For) and (x.var == into or (into is None and i == len(rest) - 1))
            ),
            -1,
        )
        if host < 0:
            why = (
                f"loop {loop} does not end with a pass"
                if into is None
                else f"no pass {into!r} follows the first pass in loop {loop}"
            )
            raise ScheduleError(prim, blk, why)
        last = rest[host]
        assert isinstance(last, For)
        if not all(is_flat_block(x) for x in head):
            raise ScheduleError(
                prim, blk, "statements before the first pass must be loop-free blocks"
            )
        for g in (first, last):
            if not all(is_flat_block(x) for x in g.body):
                raise ScheduleError(prim, blk, f"pass {g.var} must hold only loop-free blocks")
        if expr_str(first.extent) != expr_str(last.extent) or f.var in free_vars(first.extent):
            raise ScheduleError(
                prim,
                blk,
                f"passes {first.var} and {last.var} differ in extent or depend on the row",
            )
        if ForKind.PARALLEL in (first.kind, last.kind) or (
            last.kind == ForKind.VECTORIZED and first.kind != ForKind.VECTORIZED
        ):
            raise ScheduleError(
                prim,
                blk,
                f"pass {first.var} ({first.kind.value}) cannot run inside "
                f"{last.var} ({last.kind.value})",
            )
        k = self.kernel
        head_blocks = head + list(first.body)
        regs = set().union(*(block_writes(b) for b in head_blocks))
        registers = {t.name for t in k.temps if t.scope == "register" and not t.shape}
        if not regs <= registers:
            raise ScheduleError(
                prim, blk, f"the first pass writes {sorted(regs - registers)}, not registers"
            )
        inputs = {b.name for b in k.inputs}
        reads = set().union(*(block_reads(b) for b in head_blocks))
        if not reads <= inputs | regs:
            raise ScheduleError(
                prim, blk, f"the first pass reads {sorted(reads - inputs - regs)}, not inputs"
            )
        ready: set[str] = set()
        for b in head_blocks:  # every row starts afresh: each register is set before use
            early = (block_reads(b) & regs) - ready
            if early:
                raise ScheduleError(
                    prim, b.name, f"it reads {sorted(early)} before this row sets them"
                )
            ready |= block_writes(b)
        clash = regs & set().union(set(), *(block_writes(b) for b in ast_blocks(rest)))
        if clash:
            raise ScheduleError(prim, blk, f"a later pass writes {sorted(clash)}")
        return f, cont, head, first, rest, host, regs

    @primitive
    def defer_last_pass(
        self, loop: str, into: str, chunk: int = 64, min_chunks: int = 8
    ) -> list[str]:
        """Run each iteration's last pass ``D`` inside the next iteration's pass ``into``
        (``H``, just before ``D``), chunk by chunk: while row ``i``'s ``H`` computes
        (softmax's exp), row ``i - 1``'s ``D`` writes its output (the streamed scale pass),
        so the output's memory traffic overlaps ``H``'s arithmetic instead of following
        it. ``loop`` (extent ``n``) is split into chunks of ``c = max(1, min(chunk, n //
        min_chunks))`` rows, run like ``loop``; a chunk's first row defers nothing and its
        last row's ``D`` runs after the row loop (an epilogue). Returns the chunk loop and
        the row loop.

        What ``D`` reads of the row is kept for it: each register it reads that the row
        writes is copied to ``<reg>_prev`` at the end of the row; each local row buffer it
        reads that the row writes gets a leading dim of 2, alternated by row parity (a
        block accessing it gets an iteration variable ``<block>parity`` bound to the
        parity of its row within the chunk).

        Requirements: ``loop`` is parallel, or serial with independent iterations (as
        :meth:`parallel` requires); ``D`` is the last statement of its body and a loop,
        ``H`` is the loop just before it, both serial with the same extent, which does not
        depend on the row; ``D`` writes only kernel outputs and local temps that nothing
        outside ``D`` accesses; a row buffer ``D`` reads is not streamed from and its
        shape does not depend on the row; ``chunk`` and ``min_chunks`` are positive.

        Example, ``defer_last_pass("i", "j", 64)`` on softmax (``X: float32[N, K]``,
        ``K = 128 J``, the exp pass ``j`` and the streamed scale pass ``j2`` in chunks)::

            parallel for (i, 0, N)                parallel for (i_o, 0, (N + c - 1) // c)
              ... m[] = max over X[i, :]            ScheduleBlock(s_prev_init)
              serial for (j, 0, J)                    s_prev[] = 0.0f
                vectorized for (k, 0, 128)          serial for (i_i, 0, min(c, N - i_o * c))
                  E[0, ..] = exp(X[i, ..] - m[])      ... m[] = max over X[i, :]
                  s[] = s[] + E[0, ..]                serial for (j, 0, J)
              serial for (j2, 0, J)         ->          vectorized for (k, 0, 128)
                vectorized for (k2, 0, 128)               E[p, 0, ..] = exp(X[i, ..] - m[])
                  Y_stage[k2] = E[0, ..] / s[]            s[] = s[] + E[p, 0, ..]
                stream(Y[i, j2 * 128 +: 128])           if (0 < i_i)
                                                          vectorized for (k2, 0, 128)
                                                            Y_stage[k2] = E[q, 0, ..] / s_prev[]
                                                          stream(Y[i - 1, j * 128 +: 128])
                                                      ScheduleBlock(s_prev)
                                                        s_prev[] = s[]
                                                    serial for (j2_epi, 0, J) ... row i_o * c + ext - 1

        with ``c`` the chunk, ``i = i_o * c + i_i``, ``p = i_i % 2``, ``q = (i_i + 1) % 2``
        and ``ext = min(c, N - i_o * c)``.
        """
        prim = "defer_last_pass"
        f, cont, host, last, regs, bufs = self._defer_plan(prim, loop, into, chunk, min_chunks)
        k = self.kernel
        rc = self._row_chunks(f, chunk, min_chunks)
        vo, vi, start, ext, row = rc.vo, rc.vi, rc.start, rc.ext, rc.row
        taken: set[str] = set()
        prev: dict[str, str] = {}
        inits: list[Stmt] = []
        copies: list[Stmt] = []
        for r in sorted(regs):
            dt = k.buffer(r).dtype
            prev[r] = self._fresh(f"{r}_prev", kind="buffer")
            k.temps.append(Buffer(prev[r], dt, (), "register"))
            zero = Const(np.zeros((), dt).item(), dt)
            init = self._fresh(f"{prev[r]}_init", taken, kind="block")
            inits.append(Block(init, [], [], [Store(prev[r], (), zero)]))
            name = self._fresh(prev[r], taken, kind="block")
            copies.append(Block(name, [], [], [Store(prev[r], (), Load(r, ()))]))
        parity = self._double_buffer(f, bufs)
        epilogue = copy.deepcopy(last)
        renames: dict[str, Expr] = {}
        for g in [s for s in walk_stmts([epilogue]) if isinstance(s, For)]:
            renames[g.var] = Var(self._fresh(f"{g.var}_epi", taken))
            g.var = renames[g.var].name  # type: ignore[attr-defined]
        for b in ast_blocks([epilogue]):
            b.name = self._fresh(f"{b.name}_epi", taken, kind="block")
        deferred = last.body
        last_row = sub(ext, Const(1))
        subst_loop_vars(
            deferred,
            {
                f.var: sub(row, Const(1)),
                last.var: Var(host.var),
                parity: index_parity(add(Var(vi), Const(1))),
            },
        )
        subst_loop_vars(
            [epilogue], {**renames, f.var: add(start, last_row), parity: index_parity(last_row)}
        )
        for b in ast_blocks(deferred) + ast_blocks([epilogue]):
            map_block_exprs(b, lambda e: rename_loads(e, prev))
        rest = f.body[:-1]
        subst_loop_vars(rest, {f.var: row, parity: index_parity(Var(vi))})
        at = next((i for i, s in enumerate(host.body) if isinstance(s, If)), len(host.body))
        host.body.insert(at, If(Bin("<", Const(0), Var(vi)), deferred))
        inner = For(vi, ext, rest + copies, ForKind.SERIAL)
        outer = For(vo, rc.count, inits + [inner, epilogue], f.kind)
        cont[index_of(cont, f)] = outer
        self._ctx().simplify_bindings([outer])
        return [vo, vi]

    def _defer_plan(
        self, prim: str, loop: str, into: str, chunk: int, min_chunks: int
    ) -> tuple[For, list[Stmt], For, For, set[str], set[str]]:
        """:meth:`defer_last_pass`'s checks; returns the row loop, the list holding it, the
        host and last passes, the registers and the row buffers the last pass reads of
        the row."""
        f, cont, path = self._locate_loop(prim, loop)
        blk = self._first_block(f)
        if f.kind not in (ForKind.SERIAL, ForKind.PARALLEL):
            raise ScheduleError(prim, blk, f"loop {loop} is {f.kind.value}")
        ok = all(
            isinstance(x, (int, np.integer)) and not isinstance(x, bool)
            for x in (chunk, min_chunks)
        )
        if not ok or chunk < 1 or min_chunks < 1:
            raise ScheduleError(prim, blk, "chunk and min_chunks must be positive ints")
        if len(f.body) < 2 or not isinstance(f.body[-1], For):
            raise ScheduleError(prim, blk, f"loop {loop} does not end with a pass")
        host, last = f.body[-2], f.body[-1]
        if not isinstance(host, For) or host.var != into:
            raise ScheduleError(
                prim, blk, f"the pass before the last of loop {loop} is not {into!r}"
            )
        for g in (host, last):
            if g.kind != ForKind.SERIAL:
                raise ScheduleError(prim, blk, f"pass {g.var} is {g.kind.value}, not serial")
        if expr_str(host.extent) != expr_str(last.extent) or f.var in free_vars(host.extent):
            raise ScheduleError(
                prim, blk, f"passes {host.var} and {last.var} differ in extent or depend on the row"
            )
        if f.kind == ForKind.SERIAL:
            self._check_independent(prim, f, path, None)
        k = self.kernel
        scope = {b.name: b.scope for b in k.temps}
        outputs = {b.name for b in k.outputs}
        mine = ast_blocks([last])
        streams = [s for s in walk_stmts([last]) if isinstance(s, StreamStore)]
        written = set().union(set(), *(block_writes(b) for b in mine)) | {s.buffer for s in streams}
        for w in sorted(written):
            if w not in outputs and scope.get(w) != "local":
                raise ScheduleError(
                    prim, blk, f"the last pass writes {w!r}, not an output or local"
                )
        outside = [s for s, _, loops in walk_loops(k.body) if s is not last and last not in loops]
        touched = set().union(set(), *(accessed_buffers(s) for s in outside))
        if written & touched:
            raise ScheduleError(
                prim,
                blk,
                f"{sorted(written & touched)} written by the last pass are used elsewhere",
            )
        row_writes = set().union(set(), *(block_writes(b) for b in ast_blocks(f.body[:-1])))
        reads = set().union(set(), *(block_reads(b) for b in mine)) | {s.src for s in streams}
        carried = (reads - written) & row_writes
        regs = {r for r in carried if scope.get(r) == "register"}
        bufs = carried - regs
        for b in sorted(bufs):
            if scope.get(b) != "local":
                raise ScheduleError(prim, blk, f"the last pass reads {b!r}, which the row writes")
            if f.var in set().union(set(), *(free_vars(d) for d in k.buffer(b).shape)):
                raise ScheduleError(prim, blk, f"the shape of row buffer {b!r} depends on the row")
            if any(isinstance(s, StreamStore) and s.src == b for s in walk_stmts(f.body)):
                raise ScheduleError(prim, blk, f"row buffer {b!r} is streamed from")
            if any(
                b in accessed_buffers(s)
                for s, _, loops in walk_loops(k.body)
                if s is not f and f not in loops
            ):
                raise ScheduleError(prim, blk, f"row buffer {b!r} is used outside loop {loop}")
        return f, cont, host, last, regs, bufs

    def _double_buffer(self, f: For, bufs: set[str]) -> str:
        """Give each local buffer in ``bufs`` a leading dim of 2 and every block in ``f``
        accessing one an iteration variable bound to a placeholder variable (returned),
        which indexes that dim."""
        par = self._fresh("par")
        for name in bufs:
            buf = self.kernel.buffer(name)
            buf.shape = (Const(2), *buf.shape)
        for b in ast_blocks(f.body):
            if not (block_reads(b) | block_writes(b)) & bufs:
                continue
            iv = self._fresh(f"{b.name}_par", {v.name for v in b.iter_vars})
            b.iter_vars.append(IterVar(iv, Const(2)))
            b.bindings.append(Var(par))

            def lead(e: Expr, iv: str = iv) -> Expr:
                def repl(x: Expr) -> Expr | None:
                    if isinstance(x, Load) and x.buffer in bufs:
                        return Load(x.buffer, (Var(iv), *x.indices))
                    return None

                return transform(e, repl)

            for s in walk_stmts(b.body):
                if isinstance(s, Store):
                    s.value = lead(s.value)
                    s.indices = tuple(lead(i) for i in s.indices)
                    if s.buffer in bufs:
                        s.indices = (Var(iv), *s.indices)
                elif isinstance(s, If):
                    s.cond = lead(s.cond)
        return par
