"""Where blocks compute: compute_inline, reverse_compute_inline, compute_at, fuse_siblings, reuse_output."""

from __future__ import annotations

from collections.abc import Callable

from geode.codegen.ast import (
    Block,
    Const,
    Expr,
    For,
    Load,
    Stmt,
    Store,
    Var,
    expr_str,
    fenced,
    free_vars,
    loads,
    prod,
    substitute,
    transform,
    transform_loads_of,
    walk_stmts,
)
from geode.codegen.ast import blocks as ast_blocks
from geode.codegen.indexing import decompose_index, exprs_equal, flatten_index
from geode.codegen.schedule.base import ScheduleBase
from geode.codegen.schedule.blocks import (
    block_exprs,
    block_loads,
    block_reads,
    block_stores,
    block_writes,
    common_prefix,
    in_loop_terms,
    index_of,
    is_reduce,
    loop_accesses,
    map_block_exprs,
    reduce_binding_vars,
    reduction_combine,
    retarget,
    subst_loop_vars,
    walk_loops,
)
from geode.codegen.schedule.trace import primitive
from geode.errors import ScheduleError


class ComputeLocation(ScheduleBase):
    """Where blocks compute: compute_inline, reverse_compute_inline, compute_at, fuse_siblings, reuse_output."""

    @primitive
    def compute_inline(self, block: str) -> None:
        """Inline a pure spatial block into every consumer and delete it with its temp.

        Requirements: not a reduction or init block; its body is one store whose
        indices are exactly its iteration variables, in order; the stored buffer is a
        temp (not a kernel output) that no other block writes and that the value does
        not read; the buffers it reads are not written after it. (Inline before
        :meth:`compute_at` shrinks the temp: the shrunk indices are no longer the
        iteration variables.)

        Example, ``compute_inline("A")``::

            for (i, 0, N)                       for (j, 0, N)
              ScheduleBlock(A)                    ScheduleBlock(B)
                vi = axis.bind(i)                   vj = axis.bind(j)
                A[vi] = X[vi] * 2.0f     ->         B[vj] = X[vj] * 2.0f + 1.0f
            for (j, 0, N)
              ScheduleBlock(B)
                vj = axis.bind(j)
                B[vj] = A[vj] + 1.0f
        """
        b, _, _ = self._locate_block("compute_inline", block)
        buf, value, ivs = self._inlinable("compute_inline", b)
        order = self._order()
        writers = self._writers_index()
        for y in {ld.buffer for ld in loads(value)}:
            for w in writers.get(y, []):
                if order[w] > order[block]:
                    raise ScheduleError(
                        "compute_inline", block, f"{y}, which it reads, is written later by {w}"
                    )
        consumers = [self.get_block(n) for n in self.readers(buf)]
        for c in consumers:
            if order[c.name] < order[block]:
                raise ScheduleError(
                    "compute_inline", block, f"consumer {c.name} runs before the block"
                )
        # what the value reads must still hold the same data where the consumers run:
        # a writer re-executed by a loop it shares with the block must enclose them too
        loop_ids = self._loop_ids_index()

        def ids(name: str) -> set[int]:
            if name not in loop_ids:
                raise ScheduleError("-", name, "no such block")
            return loop_ids[name]

        for y in {ld.buffer for ld in loads(value)}:
            for w in writers.get(y, []):
                shared = ids(w) & ids(block)
                for c in consumers:
                    if not shared <= ids(c.name):
                        raise ScheduleError(
                            "compute_inline",
                            block,
                            f"{y} is rewritten by {w} in a loop that does not enclose "
                            f"consumer {c.name}",
                        )

        # a value recomputed at several sites is fenced, so that every copy rounds alike
        sites = sum(1 for c in consumers for ld in block_loads(c) if ld.buffer == buf)
        if sites > 1:
            value = fenced(value, self.kernel.buffer(buf).dtype)

        def repl(e: Expr) -> Expr | None:
            if isinstance(e, Load) and e.buffer == buf:
                return substitute(value, dict(zip(ivs, e.indices)))
            return None

        for c in consumers:
            map_block_exprs(c, lambda e: transform_loads_of(e, buf, repl))
        self._remove(b)
        self.kernel.temps = [t for t in self.kernel.temps if t.name != buf]
        return None

    def _inlinable(self, prim: str, b: Block) -> tuple[str, Expr, list[str]]:
        if is_reduce(b) or b.reduce_of is not None:
            raise ScheduleError(prim, b.name, "a reduction (or its init) cannot be inlined")
        if len(b.body) != 1 or not isinstance(b.body[0], Store):
            raise ScheduleError(prim, b.name, "the body must be a single store")
        st = b.body[0]
        buf = st.buffer
        if buf not in {t.name for t in self.kernel.temps}:
            raise ScheduleError(prim, b.name, f"{buf} is a kernel argument, not a temp")
        ivs = [iv.name for iv in b.iter_vars]
        if list(st.indices) != [Var(n) for n in ivs]:
            raise ScheduleError(
                prim,
                b.name,
                f"store index [{', '.join(expr_str(i) for i in st.indices)}] is not "
                f"exactly the iteration variables [{', '.join(ivs)}]",
            )
        if buf in {ld.buffer for ld in loads(st.value)}:
            raise ScheduleError(prim, b.name, f"the value reads {buf} itself")
        if self.writers(buf) != [b.name]:
            raise ScheduleError(prim, b.name, f"{buf} has other writers: {self.writers(buf)}")
        return buf, st.value, ivs

    @primitive
    def reverse_compute_inline(self, block: str) -> None:
        """Fold an elementwise consumer into its single producer: the producer then
        computes and stores the consumer's result, the consumer and the temp go away.

        Requirements: ``block`` is not a reduction, its body is one store; among the
        buffers it reads exactly one is written by a block (the producer), a temp read
        by no other block; every load of it indexes a permutation of the consumer's
        iteration variables (all of them, extents matching the temp's shape); the
        producer is a pure spatial single-store block whose store index is exactly its
        iteration variables; nothing between producer and consumer writes what the
        consumer reads or touches what it writes.

        Example, ``reverse_compute_inline("B")``::

            for (i, 0, N)                       for (i, 0, N)
              ScheduleBlock(A)                    ScheduleBlock(A)
                vi = axis.bind(i)                   vi = axis.bind(i)
                A[vi] = X[vi] * 2.0f     ->         B[vi] = X[vi] * 2.0f + 1.0f
            for (j, 0, N)
              ScheduleBlock(B)
                vj = axis.bind(j)
                B[vj] = A[vj] + 1.0f
        """
        prim = "reverse_compute_inline"
        c, _, _ = self._locate_block(prim, block)
        if is_reduce(c) or c.reduce_of is not None:
            raise ScheduleError(prim, block, "the consumer must not be a reduction")
        if len(c.body) != 1 or not isinstance(c.body[0], Store):
            raise ScheduleError(prim, block, "the body must be a single store")
        cst = c.body[0]
        produced = [y for y in sorted(block_reads(c)) if self.writers(y)]
        if len(produced) != 1:
            raise ScheduleError(
                prim, block, f"needs exactly one produced input, found {produced or 'none'}"
            )
        buf = produced[0]
        if buf == cst.buffer:
            raise ScheduleError(prim, block, f"the block reads its own output {buf}")
        if self.readers(buf) != [block]:
            raise ScheduleError(prim, block, f"{buf} is also read by {self.readers(buf)}")
        if len(self.writers(buf)) != 1:
            raise ScheduleError(prim, block, f"{buf} has several writers")
        pname = self.writers(buf)[0]
        p = self.get_block(pname)
        try:
            _, pvalue, pivs = self._inlinable(prim, p)
        except ScheduleError as e:
            raise ScheduleError(prim, block, f"producer {pname}: {e}") from None
        civs = [iv.name for iv in c.iter_vars]
        idxs = {ld.indices for ld in block_loads(c) if ld.buffer == buf}
        if len(idxs) != 1:
            raise ScheduleError(prim, block, f"{buf} is loaded at several indices")
        (idx,) = idxs
        shape = self.kernel.buffer(buf).shape
        names = [i.name if isinstance(i, Var) else None for i in idx]
        if sorted(n for n in names if n) != sorted(civs) or len(idx) != len(civs):
            raise ScheduleError(
                prim,
                block,
                f"load {buf}[{', '.join(expr_str(i) for i in idx)}] is not a permutation "
                "of the iteration variables",
            )
        ext = {iv.name: iv.extent for iv in c.iter_vars}
        for n, d, piv in zip(names, shape, p.iter_vars):
            if not (exprs_equal(ext[n], d) and exprs_equal(piv.extent, d)):  # type: ignore[index]
                raise ScheduleError(
                    prim, block, f"iter vars {n} / {piv.name} do not both span {buf}'s dim"
                )
        sigma: dict[str, Expr] = {n: Var(pv) for n, pv in zip(names, pivs)}  # type: ignore[misc]
        order = self._order()
        lo, hi = order[pname], order[block]
        if lo > hi:
            raise ScheduleError(prim, block, f"producer {pname} runs after the block")
        others = block_reads(c) - {buf}
        for x in ast_blocks(self.kernel.body):
            if lo < order[x.name] < hi and (
                block_writes(x) & (others | {cst.buffer}) or cst.buffer in block_reads(x)
            ):
                raise ScheduleError(prim, block, f"block {x.name} between them conflicts")
        # the store must not depend on the consumer's loop context (e.g. a shrunk temp)
        out_shape = self.kernel.buffer(cst.buffer).shape
        snames = [i.name for i in cst.indices if isinstance(i, Var)]
        if sorted(snames) != sorted(civs) or not all(
            isinstance(i, Var) or (i == Const(0) and exprs_equal(d, Const(1)))
            for i, d in zip(cst.indices, out_shape)
        ):
            raise ScheduleError(
                prim,
                block,
                f"store index [{', '.join(expr_str(i) for i in cst.indices)}] is not a permutation "
                "of the iteration variables",
            )
        # what else the consumer reads must hold the same data at the producer
        for y in others:
            for w in self.writers(y):
                if order[w] > lo or self._shared_loops(w, block) != self._shared_loops(w, pname):
                    raise ScheduleError(
                        prim, block, f"{y} (written by {w}) may differ at producer {pname}"
                    )

        def repl(e: Expr) -> Expr | None:
            if isinstance(e, Load) and e.buffer == buf:
                return pvalue
            if isinstance(e, Var) and e.name in sigma:
                return sigma[e.name]
            return None

        new_value = transform(cst.value, repl)
        new_idx = tuple(substitute(i, sigma) for i in cst.indices)
        p.body = [Store(cst.buffer, new_idx, new_value)]
        self._remove(c)
        self.kernel.temps = [t for t in self.kernel.temps if t.name != buf]
        return None

    @primitive
    def compute_at(self, block: str, loop: str) -> list[str]:
        """Move ``block`` (with its init, for a reduction) inside ``loop`` of another
        nest, CINN SimpleComputeAt style; returns the block's loops afterwards.

        The block's outer loops are identified with the loops from the root down to
        ``loop``: one to one when their extents are equal, else the shortest prefix of
        the block's loops whose extents' product equals theirs is recomputed from them
        with ``//``/``%``. The block keeps its remaining loops. It goes first in
        ``loop``'s body when blocks there read what it writes (producer), last when it
        reads what blocks there write (consumer). Temps it writes or reads shrink to
        the per-iteration region when every access to them lies in common loops
        (a temp whose every dim shrinks becomes a register scalar).

        Requirements: not an init block; the block (and its init) sit alone in their
        own nests at kernel level, outside ``loop``'s nest; the extents match as above
        and the identified loops bind only spatial iteration variables; the block is
        a producer or a consumer of the loop's blocks, not both; no block whose order
        relative to it changes, or that shares the outer loops but not ``loop``,
        conflicts with it; inside one iteration of the shared loops, every access to a
        buffer they exchange touches only what the writers store in that iteration
        (same index expression in the shared loops, or a full dim covered by the
        writer's inner loops), and no writer reduces across the shared loops.

        Example, ``compute_at("D", "F_sp")`` (D feeds F; D becomes a register)::

            for (D_sp, 0, N)
              ScheduleBlock(D)
                vi = axis.bind(D_sp)
                D[vi] = C[vi] * 2.0f
            for (F_sp, 0, N)
              for (F_rb, 0, 64)
                ScheduleBlock(F)
                  vi, vj = axis.bind(F_sp, F_rb)
                  F[vi, vj] = D[vi] + 1.0f
            ->
            for (F_sp, 0, N)
              ScheduleBlock(D)
                vi = axis.bind(F_sp)
                D[] = C[vi] * 2.0f
              for (F_rb, 0, 64)
                ScheduleBlock(F)
                  vi, vj = axis.bind(F_sp, F_rb)
                  F[vi, vj] = D[] + 1.0f
        """
        prim = "compute_at"
        b, _, _ = self._locate_block(prim, block)
        if b.reduce_of is not None:
            raise ScheduleError(
                prim, block, f"an init block moves with its reduction {b.reduce_of}"
            )
        init = self._init_of(b) if is_reduce(b) else None
        t, _, tpath = self._locate_loop(prim, loop)
        target = list(tpath) + [t]
        chain = self._root_chain(prim, b)
        ichain = self._root_chain(prim, init) if init is not None else []
        for f in target:
            if any(f is x for x in chain + ichain):
                raise ScheduleError(prim, block, f"loop {loop} is in the block's own nest")
        moved = [x for x in (init, b) if x is not None]
        moved_names = {x.name for x in moved}
        bw = set().union(*(block_writes(x) for x in moved))
        br = set().union(*(block_reads(x) for x in moved)) - bw
        sub_blocks = [x for x in ast_blocks(t.body) if x.name not in moved_names]
        producer = any(block_reads(x) & bw for x in sub_blocks)
        consumer = any(block_writes(x) & br for x in sub_blocks)
        if producer and consumer:
            raise ScheduleError(prim, block, f"the block both feeds and reads blocks in {loop}")
        for x in sub_blocks:
            bad = (
                block_writes(x) & bw
                or (block_writes(x) & br if producer else False)
                or (block_reads(x) & bw if not producer else False)
            )
            if bad:
                raise ScheduleError(
                    prim, block, f"block {x.name} in {loop} conflicts on {sorted(bad)}"
                )
        order_before = self._order()
        # identify loops and rewrite bindings
        tops: list[Stmt] = []
        rests: list[list[For]] = []
        for x, ch in ((init, ichain), (b, chain)):
            if x is None:
                continue
            keep = self._match_loops(prim, block, x, ch, target)
            tops.append(keep[0] if keep else x)
            rests.append(keep)
        if init is not None and not _init_in_step(init, rests[0], b, rests[1]):
            raise ScheduleError(
                prim,
                block,
                f"its init {init.name} would not write, in an iteration of {loop}'s nest, "
                f"the elements {block} reduces into there (their loops differ in order)",
            )
        for x, ch in ((init, ichain), (b, chain)):
            if x is None:
                continue
            root = ch[0] if ch else x
            del self.kernel.body[index_of(self.kernel.body, root)]
        if producer:
            t.body[0:0] = tops
        else:
            t.body.extend(tops)
        self._ctx().simplify_bindings(tops)
        self._check_moved(block, moved_names, t, target, order_before, bw, br, producer, sub_blocks)
        for buf in sorted(bw | br):
            self._try_shrink(buf)
        return self.get_loops(block)

    def _check_moved(
        self,
        block: str,
        moved: set[str],
        t: For,
        target: list[For],
        order_before: dict[str, int],
        bw: set[str],
        br: set[str],
        producer: bool,
        sub_blocks: list[Block],
    ) -> None:
        """:meth:`compute_at`'s checks on the new tree: no conflicting block was
        reordered around the ``moved`` ones, and every buffer exchanged with the blocks of
        ``t`` is accessed only where one iteration of the shared loops writes it."""
        prim = "compute_at"
        order_after = self._order()
        l0 = target[0]
        inside_t = {x.name for x in ast_blocks(t.body)}
        inside_l0 = {x.name for x in ast_blocks(l0.body)}
        for x in ast_blocks(self.kernel.body):
            if x.name in moved or x.name in inside_t:
                continue
            flipped = (order_before[x.name] < order_before[block]) != (
                order_after[x.name] < order_after[block]
            )
            if (flipped or x.name in inside_l0) and (
                block_writes(x) & (bw | br) or block_reads(x) & bw
            ):
                raise ScheduleError(
                    prim, block, f"block {x.name} conflicts with it and would be reordered"
                )
        exchanged = (bw if producer else br) & set().union(
            *((block_reads(x) if producer else block_writes(x)) for x in sub_blocks)
        )
        users = [(s, lp) for s, _, lp in walk_loops(t.body, tuple(target)) if isinstance(s, Block)]
        for buf in sorted(exchanged):
            acc = [(s, lp) for s, lp in users if buf in (block_reads(s) | block_writes(s))]
            res = self._slab_analysis(buf, acc, tuple(target))
            if isinstance(res, str):
                raise ScheduleError(prim, block, res)

    def _match_loops(
        self, prim: str, block: str, x: Block, chain: list[For], target: list[For]
    ) -> list[For]:
        """Rewrite ``x``'s bindings so its outer loops become ``target``; return the
        remaining loops of its chain (re-linked, innermost holding ``x``)."""
        tex = [f.extent for f in target]
        mex = [f.extent for f in chain]
        k = len(target)
        mapping: dict[str, Expr] | None = None
        used = 0
        if len(chain) >= k and all(exprs_equal(a, c) for a, c in zip(mex, tex)):
            mapping = {f.var: Var(g.var) for f, g in zip(chain, target)}
            used = k
        else:
            tprod = prod(tex)
            for j in range(len(chain) + 1):
                if exprs_equal(prod(mex[:j]), tprod):
                    flat = flatten_index([Var(g.var) for g in target], tex)
                    mapping = dict(zip([f.var for f in chain[:j]], decompose_index(flat, mex[:j])))
                    used = j
                    break
        if mapping is None:
            raise ScheduleError(
                prim,
                block,
                f"loops of {x.name} ({', '.join(expr_str(e) for e in mex)}) do not match "
                f"the loops down to {target[-1].var} ({', '.join(expr_str(e) for e in tex)})",
            )
        if reduce_binding_vars(x) & set(mapping):
            raise ScheduleError(
                prim,
                block,
                f"a loop of {x.name} identified with {target[-1].var}'s nest "
                "binds a reduce iteration variable",
            )
        rest = chain[used:]
        subst_loop_vars(rest if rest else [x], mapping)
        return rest

    def _check_independent(
        self,
        prim: str,
        f: For,
        path: tuple[For, ...],
        reassoc: Callable[[Block], bool] | None,
    ) -> None:
        """Iterations of ``f`` must not touch each other's stores. ``reassoc`` (for
        vectorize) says whether a reduction carried by ``f`` may be reassociated."""
        v = f.var
        blocks_in = ast_blocks(f.body)
        if not blocks_in:
            return
        if isinstance(f.extent, Const) and f.extent.value <= 1:
            return
        carried: dict[str, str] = {}
        for b in blocks_in:
            if any(
                iv.kind == "reduce" and v in free_vars(x) for iv, x in zip(b.iter_vars, b.bindings)
            ):
                comb = reduction_combine(b)
                if reassoc is None or comb is None or not reassoc(b):
                    raise ScheduleError(prim, b.name, f"loop {v} carries a reduction of the block")
                carried[b.name] = comb[1].buffer
        ctx = self._ctx()
        inside = {b.name for b in blocks_in}
        temps = {t.name for t in self.kernel.temps}
        written = sorted(set().union(*(block_writes(b) for b in blocks_in)))
        for buf in written:
            acc: list[tuple[Block, tuple[Expr, ...]]] = []
            for b in blocks_in:
                if carried.get(b.name) == buf:
                    continue
                acc += [(b, idx) for _, idx in self._accesses(b, buf)]
            if not acc:
                continue
            everyone = set(self.readers(buf)) | set(self.writers(buf))
            if (
                buf in temps
                and everyone <= inside
                and all(v not in set().union(*(free_vars(i) for i in idx)) for _, idx in acc)
            ):
                # a temp private to each iteration: what an iteration reads must be
                # what it wrote itself
                users = [
                    (s, lp)
                    for s, _, lp in walk_loops(f.body, (*path, f))
                    if isinstance(s, Block) and s.name in everyone
                ]
                res = self._slab_analysis(buf, users, (*path, f))
                if isinstance(res, str):
                    raise ScheduleError(prim, self._first_block(f), res)
                continue
            first: tuple | None = None
            for b, idx in acc:
                rc = ctx.recipe(idx, v)
                if rc is None:
                    raise ScheduleError(
                        prim,
                        b.name,
                        f"the location of {buf}[{', '.join(expr_str(i) for i in idx)}] "
                        f"does not determine {v}: iterations may touch the same element",
                    )
                if first is None:
                    first = rc
                elif rc != first:
                    raise ScheduleError(
                        prim,
                        b.name,
                        f"accesses to {buf} in different iterations of {v} may overlap",
                    )

    @primitive
    def fuse_siblings(self, first: str, second: str) -> str:
        """Loop fusion: merge loop ``second`` into the adjacent sibling loop ``first`` before it
        (same extent); returns ``first``.

        Requirements: both loops sit in the same statement list, ``second`` after
        ``first`` with only loop-free blocks between them that neither read what
        ``first`` writes nor write what it touches (they move before ``first``), with
        textually equal extents; no buffer is written by both; nothing
        ``first`` reads is written by ``second``; every buffer ``first`` writes and
        ``second`` reads is read at the very element iteration ``i`` of ``first`` wrote
        (so it is ready when iteration ``i`` of ``second`` runs); a register (0-d)
        ``first`` writes is not read by ``second``, nor is any buffer a reduction carried by
        ``first`` accumulates into (it is final only after the last iteration).

        Example, ``fuse_siblings("E_rb", "S_rb")`` (a row's exp, then its sum)::

            serial for (E_rb, 0, K)                  serial for (E_rb, 0, K)
              ScheduleBlock(E)                         ScheduleBlock(E)
                vk = axis.bind(E_rb)                     vk = axis.bind(E_rb)
                T[vk] = exp(X[vk] - m)        ->          T[vk] = exp(X[vk] - m)
            serial for (S_rb, 0, K)                    ScheduleBlock(S)
              ScheduleBlock(S)                           r:vk = axis.bind(E_rb)
                r:vk = axis.bind(S_rb)                   s = s + T[vk]
                s = s + T[vk]
        """
        prim = "fuse_siblings"
        a, cont, _ = self._locate_loop(prim, first)
        b, cont_b, _ = self._locate_loop(prim, second)
        blk = self._first_block(a)
        if cont is not cont_b:
            raise ScheduleError(prim, blk, f"loops {first} and {second} are not siblings")
        ia = next(i for i, x in enumerate(cont) if x is a)
        ib = next((i for i, x in enumerate(cont) if x is b), -1)
        if ib <= ia:
            raise ScheduleError(prim, blk, f"loop {second} does not follow {first}")
        if expr_str(a.extent) != expr_str(b.extent):
            raise ScheduleError(
                prim, blk, f"extents differ: {expr_str(a.extent)} vs {expr_str(b.extent)}"
            )
        wa, ra = loop_accesses(a, a.var)
        between = cont[ia + 1 : ib]
        for st in between:
            if not isinstance(st, Block) or any(isinstance(x, For) for x in walk_stmts(st.body)):
                raise ScheduleError(
                    prim, blk, f"a loop or non-block statement separates {first} and {second}"
                )
            ws = {x.buffer for x in walk_stmts(st.body) if isinstance(x, Store)}
            rs = {ld.buffer for e in block_exprs(st) for ld in loads(e)}
            if ws & (set(wa) | set(ra)) or rs & set(wa):
                raise ScheduleError(
                    prim, blk, f"block {st.name} between the loops depends on {first}"
                )
        wb, rb = loop_accesses(b, a.var, rename={b.var: Var(a.var)})
        both = set(wa) & set(wb)
        if both:
            raise ScheduleError(prim, blk, f"both loops write {sorted(both)}")
        back = set(wb) & set(ra)
        if back:
            raise ScheduleError(prim, blk, f"{second} writes {sorted(back)}, which {first} reads")
        reducing = {
            w
            for x in ast_blocks(a.body)
            if a.var in reduce_binding_vars(x)
            for w in block_writes(x)
        }
        if reducing & set(rb):
            raise ScheduleError(
                prim,
                blk,
                f"{second} reads {sorted(reducing & set(rb))}, which {first} is still reducing",
            )
        for buf, idxs in rb.items():
            if buf not in wa:
                continue
            stores = {tuple(expr_str(i) for i in idx) for idx in wa[buf]}
            if len(stores) != 1 or not stores.pop():
                raise ScheduleError(
                    prim, blk, f"{first} writes {buf} at several places or as a scalar"
                )
            want = tuple(expr_str(i) for i in wa[buf][0])
            for idx in idxs:
                if tuple(expr_str(i) for i in idx) != want:
                    raise ScheduleError(
                        prim, blk, f"{second} reads {buf} at another element than {first} writes"
                    )
        subst_loop_vars(b.body, {b.var: Var(a.var)})
        a.body.extend(b.body)
        del cont[ia + 1 : ib + 1]
        cont[ia:ia] = between  # independent blocks in between now run before the fused loop
        return a.var

    @primitive
    def reuse_output(self, temp: str, block: str) -> None:
        """Keep local temp ``temp`` in the kernel output that ``block`` writes from it, so
        a row buffer costs no memory of its own and the row is written to the output
        once (softmax: exp values go straight into ``y``, then ``y`` is scaled in
        place).

        Requirements: ``temp`` is a local temp; ``block`` stores one kernel output
        ``O`` (same dtype), which no other block reads or writes, and reads ``temp``
        at one index ``t``; no block after ``block`` accesses ``temp``, and every other
        accessor sits outside ``block``'s loops below their common outer loops, or, if it
        shares a loop that indexes ``temp``, accesses only ``block``'s element; each
        component of ``block``'s ``O`` index (in loop terms) is either a component of
        ``t`` (with ``temp``'s extent equal to ``O``'s there) or an expression of the
        loops enclosing every accessor, which each accessor binds to one of its
        iteration variables; every component of ``t`` that is not a constant 0 over an
        extent-1 axis is used. Then ``temp[s]`` becomes ``O[h(s)]`` at every access,
        with ``h(t) = `` ``block``'s own store index, and ``temp`` is deleted.

        Example, ``reuse_output("T", "D")``::

            parallel for (i, 0, N)                  parallel for (i, 0, N)
              for (k, 0, K)                           for (k, 0, K)
                ScheduleBlock(E)                        ScheduleBlock(E)
                  vi, vk = axis.bind(i, k)                vi, vk = axis.bind(i, k)
                  T[0, vk] = exp(X[vi, vk])     ->        Y[vi, vk] = exp(X[vi, vk])
              for (k2, 0, K)                          for (k2, 0, K)
                ScheduleBlock(D)                        ScheduleBlock(D)
                  vi, vk = axis.bind(i, k2)               vi, vk = axis.bind(i, k2)
                  Y[vi, vk] = T[0, vk] / s[]              Y[vi, vk] = Y[vi, vk] / s[]
        """
        prim = "reuse_output"
        out, users, plan = self._reuse_plan(prim, temp, block)
        self._redirect(prim, temp, out, [x for x, _ in users], plan)
        return None

    def _reuse_plan(
        self, prim: str, temp: str, block: str
    ) -> tuple[str, list[tuple[Block, tuple[For, ...]]], list[int | Expr]]:
        """:meth:`reuse_output`'s checks; returns the output, the blocks accessing ``temp``
        (with their loops) and, per output axis, the temp axis it takes or a row expression."""
        k = self.kernel
        tbuf = next((t for t in k.temps if t.name == temp), None)
        if tbuf is None or tbuf.scope != "local":
            raise ScheduleError(prim, block, f"{temp} is not a local temp buffer")
        b, _, b_loops = self._locate_block(prim, block)
        stores = block_stores(b)
        if len(stores) != 1 or stores[0].buffer not in {o.name for o in k.outputs}:
            raise ScheduleError(prim, block, "the block must store exactly one kernel output")
        out = k.buffer(stores[0].buffer)
        if out.dtype != tbuf.dtype:
            raise ScheduleError(prim, block, f"{out.name} and {temp} have different dtypes")
        if self.writers(out.name) != [block] or self.readers(out.name):
            raise ScheduleError(prim, block, f"another block accesses {out.name}")
        t_loads = {tuple(ld.indices) for ld in block_loads(b) if ld.buffer == temp}
        if len(t_loads) != 1:
            raise ScheduleError(prim, block, f"it must read {temp} at exactly one index")
        users = [
            (x, lp)
            for x, _, lp in walk_loops(k.body)
            if isinstance(x, Block) and temp in (block_reads(x) | block_writes(x))
        ]
        if users[-1][0] is not b:
            raise ScheduleError(prim, block, f"{users[-1][0].name} accesses {temp} after it")
        outer = common_prefix([lp for _, lp in users])
        mine = {id(f) for f in b_loops[len(outer) :]}
        for x, lp in users[:-1]:
            if mine & {id(f) for f in lp}:
                raise ScheduleError(prim, block, f"{x.name} shares a loop with it below the rows")
        t_idx = [in_loop_terms(b, i) for i in next(iter(t_loads))]
        t_vars = set().union(*(free_vars(e) for e in t_idx))
        for x, lp in users[:-1]:
            shared = {f.var for f in lp} & {f.var for f in b_loops}
            if not shared & t_vars:
                continue
            for _, idx in self._accesses(x, temp):
                if len(idx) != len(t_idx) or not all(exprs_equal(a, c) for a, c in zip(idx, t_idx)):
                    raise ScheduleError(
                        prim,
                        block,
                        f"{x.name} shares loop(s) {sorted(shared & t_vars)} with it and "
                        f"accesses {temp} at another element",
                    )
        o_idx = [in_loop_terms(b, i) for i in stores[0].indices]
        outer_vars = {f.var for f in outer}
        plan: list[int | Expr] = []  # per O axis: the temp axis it takes, or a row expression
        for i, oe in enumerate(o_idx):
            j = next(
                (
                    j
                    for j, te in enumerate(t_idx)
                    if not isinstance(te, Const) and exprs_equal(te, oe)
                ),
                None,
            )
            if j is not None:
                if not exprs_equal(tbuf.shape[j], out.shape[i]):
                    raise ScheduleError(
                        prim, block, f"{temp} axis {j} and {out.name} axis {i} differ"
                    )
                plan.append(j)
            elif free_vars(oe) <= outer_vars | set(k.dims):
                plan.append(oe)
            else:
                raise ScheduleError(prim, block, f"{out.name} index {expr_str(oe)} has no match")
        used = {p for p in plan if isinstance(p, int)}
        for j, te in enumerate(t_idx):
            if j not in used and not (
                exprs_equal(te, Const(0)) and exprs_equal(tbuf.shape[j], Const(1))
            ):
                raise ScheduleError(prim, block, f"{temp} axis {j} does not reach {out.name}")
        return out.name, users, plan

    def _redirect(
        self, prim: str, temp: str, out: str, users: list[Block], plan: list[int | Expr]
    ) -> None:
        """Replace every access ``temp[s]`` in ``users`` by ``out[h(s)]``: ``plan`` maps each
        ``out`` axis to a ``temp`` axis or to a row expression, which each block reads
        through the iteration variable it binds to that expression."""
        for x in users:
            row: dict[str, Expr] = {}
            for p in plan:
                if isinstance(p, int):
                    continue
                iv = next(
                    (iv for iv, bd in zip(x.iter_vars, x.bindings) if exprs_equal(bd, p)), None
                )
                if iv is None:
                    raise ScheduleError(
                        prim, x.name, f"no iteration variable is bound to {expr_str(p)}"
                    )
                row[expr_str(p)] = Var(iv.name)
            retarget(x, temp, out, plan, row)
        self.kernel.temps = [t for t in self.kernel.temps if t.name != temp]


def _stored_at(x: Block, rest: list[For]) -> list[list[Expr]]:
    """The indices ``x`` stores at, as expressions of the loops: its bindings put in, its
    own remaining loops (``rest``) of one iteration as 0, and each other one that is a
    whole index renamed after that index's position, so two blocks' stores compare in
    the loops they share."""
    single = {f.var: Const(0) for f in rest if f.extent == Const(1)}  # a loop of one: 0
    env = {iv.name: substitute(e, single) for iv, e in zip(x.iter_vars, x.bindings)}
    own = {f.var for f in rest}
    out = []
    for st in block_stores(x):
        idx = [substitute(i, env) for i in st.indices]
        rename: dict[str, Expr] = {
            e.name: Var(f"@{p}") for p, e in enumerate(idx) if isinstance(e, Var) and e.name in own
        }
        out.append([substitute(e, rename) for e in idx])
    return out


def _init_in_step(init: Block, irest: list[For], b: Block, brest: list[For]) -> bool:
    """Whether ``init`` and its reduction ``b``, their outer loops just identified with
    a target nest's, store at the same indices: then each iteration of the shared loops
    initializes exactly the elements the reduction accumulates into in it. (An init
    whose loops were reordered before a compute_at has them identified position by
    position, and would initialize other elements: refused.)"""
    ii = _stored_at(init, irest)[0]  # an init stores once
    return any(
        len(bi) == len(ii) and all(exprs_equal(e, f) for e, f in zip(ii, bi))
        for bi in _stored_at(b, brest)
    )
