"""Loop transformations: split, fuse, reorder, align, and the buffer dim merges of merge_dims."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from geode.codegen.ast import (
    Bin,
    Block,
    Const,
    Expr,
    For,
    If,
    Load,
    Stmt,
    Store,
    Var,
    add,
    expr_str,
    floordiv,
    free_vars,
    mul,
    prod,
    substitute,
    transform_loads_of,
)
from geode.codegen.ast import blocks as ast_blocks
from geode.codegen.indexing import (
    and_expr,
    decompose_index,
    exprs_equal,
    flatten_index,
    join_digits,
)
from geode.codegen.schedule.base import ScheduleBase
from geode.codegen.schedule.blocks import (
    block_loads,
    block_stores,
    index_of,
    is_reduce,
    map_stmt_exprs,
    subst_loop_vars,
)
from geode.codegen.schedule.trace import primitive
from geode.errors import ScheduleError


class LoopTransforms(ScheduleBase):
    """Loop transformations: split, fuse, reorder, align, and the buffer dim merges of merge_dims."""

    @primitive
    def split(self, loop: str, factors: Sequence[int | None]) -> list[str]:
        """Split ``loop`` into nested loops of the given extents, outermost first.

        Requirements: the loop exists; ``factors`` has at least two entries, positive
        ints, at most one of them ``-1``/``None`` (inferred as a ceiling division of
        the extent by the others). A symbolic extent needs an inferred factor; with
        constant factors only their product must reach the extent. When the product
        may overrun the extent (non-dividing or symbolic), every block inside gets
        the predicate ``flat < extent``. New loops are serial and named
        ``<loop>_0, <loop>_1, ...``; returns their names.

        Example, ``split("i", [-1, 4])`` with extent 10::

            serial for (i, 0, 10)              serial for (i_0, 0, 3)
              ScheduleBlock(A)                   serial for (i_1, 0, 4)
                vi = axis.bind(i)       ->         ScheduleBlock(A)
                A[vi] = X[vi] * 2.0f                 vi = axis.bind(i_0 * 4 + i_1)
                                                     predicate = i_0 * 4 + i_1 < 10
                                                     A[vi] = X[vi] * 2.0f
        """
        f, cont, _ = self._locate_loop("split", loop)
        blk = self._first_block(f)
        fs = list(factors)
        if len(fs) < 2:
            raise ScheduleError("split", blk, f"split of {loop} needs at least two factors")
        inferred = [i for i, x in enumerate(fs) if x is None or x == -1]
        if len(inferred) > 1:
            raise ScheduleError("split", blk, "at most one factor may be inferred (-1/None)")
        for x in fs:
            if x is None or x == -1:
                continue
            if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 1:
                raise ScheduleError("split", blk, f"factor {x!r} is not a positive int")
        known = 1
        for x in fs:
            if not (x is None or x == -1):
                known *= int(x)
        extent = f.extent
        exts: list[Expr] = []
        if inferred:
            if isinstance(extent, Const):
                inf: Expr = Const(-(-int(extent.value) // known))
            else:
                inf = floordiv(add(extent, Const(known - 1)), Const(known))
            exts = [inf if i in inferred else Const(int(x)) for i, x in enumerate(fs)]
        else:
            if not isinstance(extent, Const):
                raise ScheduleError(
                    "split",
                    blk,
                    f"extent {expr_str(extent)} of {loop} is symbolic: infer one factor",
                )
            if known < int(extent.value):
                raise ScheduleError(
                    "split", blk, f"factors {fs} cover {known} < extent {extent.value} of {loop}"
                )
            exts = [Const(int(x)) for x in fs]
        total = prod(exts)
        exact = (
            isinstance(extent, Const) and isinstance(total, Const) and total.value == extent.value
        )
        taken: set[str] = set()
        names = [self._fresh(f"{loop}_{i}", taken) for i in range(len(fs))]
        flat = flatten_index([Var(n) for n in names], exts)
        body = f.body
        subst_loop_vars(body, {loop: flat})
        if not exact:
            pred = Bin("<", flat, extent)
            for b in ast_blocks(body):
                b.predicate = and_expr(b.predicate, pred)
        inner: list[Stmt] = body
        for n, e in reversed(list(zip(names, exts))):
            inner = [For(n, e, inner)]
        cont[index_of(cont, f)] = inner[0]
        self._ctx().simplify_bindings(inner)
        return names

    @primitive
    def fuse(self, loops: Sequence[str]) -> str:
        """Fuse perfectly nested loops (given outermost first, each the only statement
        of the previous one) into one loop; returns its name ``<a>_<b>_fused``.

        Requirements: at least two loops, consecutive and perfectly nested; no extent
        depends on a fused loop. Bindings recover the old variables with ``//``/``%``.

        Example, ``fuse(["i", "j"])``::

            serial for (i, 0, N)                 serial for (i_j_fused, 0, N * 8)
              serial for (j, 0, 8)                 ScheduleBlock(A)
                ScheduleBlock(A)          ->         vi, vj = axis.bind(i_j_fused // 8,
                  vi, vj = axis.bind(i, j)                              i_j_fused % 8)
                  A[vi, vj] = X[vi, vj]              A[vi, vj] = X[vi, vj]
        """
        names = list(loops)
        if len(names) < 2:
            raise ScheduleError("fuse", "-", "fuse needs at least two loops")
        first, cont, _ = self._locate_loop("fuse", names[0])
        blk = self._first_block(first)
        fors = [first]
        for n in names[1:]:
            cur = fors[-1]
            if len(cur.body) != 1 or not isinstance(cur.body[0], For) or cur.body[0].var != n:
                raise ScheduleError(
                    "fuse", blk, f"loop {n} is not the only statement of loop {cur.var}"
                )
            fors.append(cur.body[0])
        fused = set(names)
        for f in fors:
            if free_vars(f.extent) & fused:
                raise ScheduleError("fuse", blk, f"extent of {f.var} depends on a fused loop")
        name = self._fresh("_".join(names) + "_fused")
        exts = [f.extent for f in fors]
        mapping = dict(zip(names, decompose_index(Var(name), exts)))
        new = For(name, prod(exts), fors[-1].body)
        subst_loop_vars(new.body, mapping)
        cont[index_of(cont, first)] = new
        self._ctx().simplify_bindings([new])
        return name

    @primitive
    def reorder(self, loops: Sequence[str]) -> None:
        """Permute loops of one perfect nest: the given loops take, in the given order,
        the nest positions they occupied (loops of the nest not listed keep theirs).

        Requirements: distinct loops lying on one chain of loops, each loop of the
        chain between the outermost and innermost given one being the only statement
        of its parent; no moved extent depends on a loop of the chain. Reordering a
        loop nest only changes the order in which a reduction combines its values.

        Example, ``reorder(["j", "i"])``::

            serial for (i, 0, 4)                 serial for (j, 0, 8)
              serial for (j, 0, 8)      ->         serial for (i, 0, 4)
                ScheduleBlock(A) ...                 ScheduleBlock(A) ...
        """
        names = list(loops)
        if len(set(names)) != len(names):
            raise ScheduleError("reorder", "-", f"repeated loops in {names}")
        if not names:
            return None
        located = [self._locate_loop("reorder", n) for n in names]
        deepest = max(located, key=lambda t: len(t[2]))
        path = list(deepest[2]) + [deepest[0]]
        blk = self._first_block(deepest[0])
        pos: list[int] = []
        for n in names:
            idx = [i for i, f in enumerate(path) if f.var == n]
            if not idx:
                raise ScheduleError(
                    "reorder", blk, f"loop {n} is not in the same nest as the others"
                )
            pos.append(idx[0])
        lo, hi = min(pos), max(pos)
        blk = self._first_block(path[lo])
        for i in range(lo, hi):
            if len(path[i].body) != 1 or path[i].body[0] is not path[i + 1]:
                raise ScheduleError(
                    "reorder", blk, f"loop {path[i].var} holds more than loop {path[i + 1].var}"
                )
        chain_vars = {f.var for f in path[lo : hi + 1]}
        for i in pos:
            if free_vars(path[i].extent) & chain_vars:
                raise ScheduleError(
                    "reorder", blk, f"extent of {path[i].var} depends on a loop of the nest"
                )
        heads = [(path[i].var, path[i].extent, path[i].kind) for i in pos]
        for p, (v, e, kd) in zip(sorted(pos), heads):
            path[p].var, path[p].extent, path[p].kind = v, e, kd
        return None

    @primitive
    def align(self, block: str, reduce_axes: Sequence[int] | None = None) -> list[str]:
        """Iteration-space alignment (CINN): rewrite ``block``'s nest into the canonical
        ``for sp in prod(spatial extents)`` [``for rb in prod(reduce extents)``] form;
        returns the new loop names ``<block>_sp`` [, ``<block>_rb``].

        The ``rb`` loop gathers the block's reduce iteration variables; for a
        non-reduction block, ``reduce_axes`` (positions of iteration variables) names
        the axes to put there instead (CINN's impure spatial axes, e.g. the broadcast
        axis after a reduction). Requirements: the block sits alone in its own perfect
        nest at kernel level, has no predicate, and each loop binds exactly one
        iteration variable directly (``vi = i``) with the same extent. Aligning an
        already aligned block returns its loops unchanged.

        Example, a ``ReduceSum`` over the last axis::

            serial for (i, 0, S1)                  serial for (C_sp, 0, S1 * S2)
              serial for (j, 0, S2)                  serial for (C_rb, 0, 1024)
                serial for (k, 0, 1024)      ->        ScheduleBlock(C)
                  ScheduleBlock(C)                       vi, vj, r:vk = axis.bind(
                    vi, vj, r:vk = axis.bind(              C_sp // S2, C_sp % S2, C_rb)
                      i, j, k)                           C[vi, vj] = C[vi, vj] + B[vi, vj, vk]
                    C[vi, vj] = C[vi, vj] + B[vi, vj, vk]
        """
        b, _, loops = self._locate_block("align", block)
        is_red = is_reduce(b)
        ivs = b.iter_vars
        if is_red:
            rb_idx = [i for i, iv in enumerate(ivs) if iv.kind == "reduce"]
        else:
            rb_idx = sorted(set(reduce_axes or ()))
            if any(not 0 <= i < len(ivs) for i in rb_idx):
                raise ScheduleError(
                    "align",
                    block,
                    f"reduce_axes {list(reduce_axes or ())} "
                    f"out of range for {len(ivs)} iteration variables",
                )
        sp_idx = [i for i in range(len(ivs)) if i not in rb_idx]
        sp_ext = prod([ivs[i].extent for i in sp_idx])
        rb_ext = prod([ivs[i].extent for i in rb_idx])
        reason = self._not_one_to_one(b)
        if reason is not None:
            want = 2 if rb_idx else 1
            if len(loops) == want and b.predicate is None:
                canon = self._aligned_bindings(b, sp_idx, rb_idx, [f.var for f in loops])
                if (
                    canon == b.bindings
                    and exprs_equal(loops[0].extent, sp_ext)
                    and (not rb_idx or exprs_equal(loops[1].extent, rb_ext))
                ):
                    return [f.var for f in loops]  # already aligned
            raise ScheduleError("align", block, reason)
        chain = self._root_chain("align", b)
        own = {f.var for f in chain}
        taken: set[str] = set()
        sp = self._fresh(f"{block}_sp", taken, own)
        names = [sp] + ([self._fresh(f"{block}_rb", taken, own)] if rb_idx else [])
        b.bindings = self._aligned_bindings(b, sp_idx, rb_idx, names)
        inner: list[Stmt] = [b]
        if rb_idx:
            inner = [For(names[1], rb_ext, inner)]
        top = For(sp, sp_ext, inner)
        root = chain[0] if chain else b
        self.kernel.body[index_of(self.kernel.body, root)] = top
        return names

    def _not_one_to_one(self, b: Block) -> str | None:
        """Why ``b``'s nest is not a lowered-style nest (alone at kernel level, no
        predicate, each loop binding one iteration variable directly), or None."""
        try:
            chain = self._root_chain("align", b)
        except ScheduleError as e:
            return str(e).split(": ", 1)[1]
        if b.predicate is not None:
            return "the block has a predicate (its nest was split)"
        lvars = {f.var: f for f in chain}
        seen: set[str] = set()
        for iv, x in zip(b.iter_vars, b.bindings):
            if not (isinstance(x, Var) and x.name in lvars) or x.name in seen:
                return f"iter var {iv.name} is not bound directly to its own loop"
            seen.add(x.name)
            if not exprs_equal(lvars[x.name].extent, iv.extent):
                return f"loop {x.name} and iter var {iv.name} differ in extent"
        if len(seen) != len(chain):
            return "a loop of the nest binds no iteration variable"
        return None

    @staticmethod
    def _aligned_bindings(
        b: Block, sp_idx: list[int], rb_idx: list[int], names: list[str]
    ) -> list[Expr]:
        out: list[Expr] = [Const(0)] * len(b.iter_vars)
        groups = [(sp_idx, names[0])] + ([(rb_idx, names[1])] if rb_idx else [])
        for idx, var in groups:
            digits = decompose_index(Var(var), [b.iter_vars[i].extent for i in idx])
            for i, e in zip(idx, digits):
                out[i] = e
        return out

    @primitive
    def align_all(self) -> dict[str, list[str]]:
        """Align every block (see :meth:`align`); returns block -> its new loops.

        The impure spatial axes of non-reduction blocks are inferred from the first
        reduction: its input's axes that the reduce iteration variables index are put in
        the ``rb`` loop of every non-reduction block whose iteration extents equal that
        input's shape (the elementwise blocks before and the broadcast blocks after the
        reduction), so that all nests share ``sp`` (and ``rb``) extents.

        Requirements: those of :meth:`align` for every block (the error names the
        first block that fails; nothing is changed then).

        Example, X*2 then a ReduceSum over the last axis (init omitted)::

            for (A_i0, 0, N)                     for (A_sp, 0, N)
              for (A_i1, 0, 64)                    for (A_rb, 0, 64)
                ScheduleBlock(A)                     ScheduleBlock(A)
                  vi0, vi1 = axis.bind(                vi0, vi1 = axis.bind(A_sp, A_rb)
                    A_i0, A_i1)                        A[vi0, vi1] = X[vi0, vi1] * 2.0f
                  A[vi0, vi1] = X[vi0, vi1] * 2.0f
            for (C_i0, 0, N)                ->   for (C_sp, 0, N)
              for (C_k0, 0, 64)                    for (C_rb, 0, 64)
                ScheduleBlock(C)                     ScheduleBlock(C)
                  vi0, r:vk0 = axis.bind(              vi0, r:vk0 = axis.bind(C_sp, C_rb)
                    C_i0, C_k0)                        C[vi0] = C[vi0] + A[vi0, vk0]
                  C[vi0] = C[vi0] + A[vi0, vk0]
        """
        axes: list[int] | None = None
        shape: tuple[Expr, ...] = ()
        for b in ast_blocks(self.kernel.body):
            if not is_reduce(b) or b.reduce_of is not None:
                continue
            red = {iv.name for iv in b.iter_vars if iv.kind == "reduce"}
            for ld in block_loads(b):
                names = [i.name if isinstance(i, Var) else None for i in ld.indices]
                if red <= set(n for n in names if n):
                    axes = [i for i, n in enumerate(names) if n in red]
                    shape = self.kernel.buffer(ld.buffer).shape
                    break
            if axes is not None:
                break
        out: dict[str, list[str]] = {}
        for name in self.blocks():
            b = self.get_block(name)
            ra: list[int] | None = None
            if (
                axes
                and not is_reduce(b)
                and len(b.iter_vars) == len(shape)
                and all(exprs_equal(iv.extent, d) for iv, d in zip(b.iter_vars, shape))
            ):
                ra = axes
            try:
                out[name] = self.align(name, ra)
            except ScheduleError as e:
                raise ScheduleError("align_all", e.block, str(e).split(": ", 1)[1]) from None
        return out

    def digit_dims(self, buffer: str) -> list[int]:
        """The dims ``k`` of kernel argument ``buffer`` where some access indexes dims
        ``k`` and ``k + 1`` with the two digits of one index (``e // d, e % d``, through
        the block's bindings): what :meth:`merge_dims` folds."""
        buf = self.kernel.buffer(buffer)
        found: set[int] = set()
        for b in ast_blocks(self.kernel.body):
            bind = {iv.name: x for iv, x in zip(b.iter_vars, b.bindings)}
            idxs = [st.indices for st in block_stores(b) if st.buffer == buffer]
            idxs += [ld.indices for ld in block_loads(b) if ld.buffer == buffer]
            for idx in idxs:
                for k in range(len(idx) - 1):
                    hi, lo = substitute(idx[k], bind), substitute(idx[k + 1], bind)
                    if join_digits(hi, lo, buf.shape[k + 1]) is not None:
                        found.add(k)
        return sorted(found)

    @primitive
    def merge_dims(self, buffer: str, dim: int) -> None:
        """View kernel argument ``buffer`` with dims ``dim`` and ``dim + 1`` merged into
        one (a C-contiguous array reshaped: the caller passes it in the new shape), or
        allocate local temp ``buffer`` so. Every
        access's index pair ``(hi, lo)`` becomes ``hi * d + lo`` (``d`` the size of dim
        ``dim + 1``), folded where the pair splits one index into digits, through the
        block's bindings: ``(e // d, e % d)`` is ``e`` and ``(e // d % m, e % d)`` is
        ``e % (m * d)``. A loop fused over several axes of an array (``align``'s reduce
        loop over H and W) then walks it with one contiguous index instead of a division
        and a modulo per element, which keeps the loop vectorizable.

        Requirements: ``buffer`` is a kernel input or output or a local temp;
        ``0 <= dim < rank - 1``.

        Example, ``merge_dims("x", 2)`` with ``x`` of shape ``[N, 64, 56, 56]``::

            for (sp, 0, N * 64)                  for (sp, 0, N * 64)
              for (rb, 0, 3136)                    for (rb, 0, 3136)
                ScheduleBlock(R)          ->         ScheduleBlock(R)
                  vi, vj, r:vk, r:vl =                 vi, vj, r:vk, r:vl =
                    axis.bind(sp // 64, sp % 64,         axis.bind(sp // 64, sp % 64,
                              rb // 56, rb % 56)                   rb // 56, rb % 56)
                  R[vi, vj] = R[vi, vj]                R[vi, vj] = R[vi, vj]
                    + x[vi, vj, vk, vl]                  + x[vi, vj, rb]
        """
        prim = "merge_dims"
        local = [b for b in self.kernel.temps if b.scope == "local"]
        args = {b.name: b for b in self.kernel.inputs + self.kernel.outputs + local}
        if buffer not in args:
            raise ScheduleError(prim, buffer, "not a kernel input or output or a local temp")
        buf = args[buffer]
        if not 0 <= dim < len(buf.shape) - 1:
            raise ScheduleError(prim, buffer, f"dim {dim} has no next dim in rank {len(buf.shape)}")
        d = buf.shape[dim + 1]

        def merged(idx: tuple[Expr, ...], bind: dict[str, Expr]) -> tuple[Expr, ...]:
            hi, lo = idx[dim], idx[dim + 1]
            joined = join_digits(substitute(hi, bind), substitute(lo, bind), d)
            if joined is None:
                joined = add(mul(hi, d), lo)
            return (*idx[:dim], joined, *idx[dim + 2 :])

        def visit(stmts: list[Stmt], bind: dict[str, Expr]) -> None:
            def repl(e: Expr) -> Expr | None:
                if isinstance(e, Load) and e.buffer == buffer:
                    return Load(e.buffer, merged(e.indices, bind))
                return None

            for st in stmts:
                map_stmt_exprs(st, lambda e: transform_loads_of(e, buffer, repl))
                if isinstance(st, Store) and st.buffer == buffer:
                    st.indices = merged(st.indices, bind)
                if isinstance(st, Block):
                    visit(st.body, {iv.name: x for iv, x in zip(st.iter_vars, st.bindings)})
                elif isinstance(st, (For, If)):
                    visit(st.body, bind)

        visit(self.kernel.body, {})
        buf.shape = (*buf.shape[:dim], mul(buf.shape[dim], d), *buf.shape[dim + 2 :])
        return None
