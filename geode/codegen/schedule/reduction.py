"""Two-step reductions: rfactor."""

from __future__ import annotations

import numpy as np

from geode.codegen.ast import (
    Bin,
    Block,
    Buffer,
    Const,
    Expr,
    For,
    IterVar,
    Load,
    Stmt,
    Store,
    Var,
    add,
    free_vars,
    mul,
    substitute,
)
from geode.codegen.indexing import all_and, conjuncts
from geode.codegen.schedule.base import ScheduleBase
from geode.codegen.schedule.blocks import (
    combine_identity,
    index_of,
    is_reduce,
    reduce_binding_vars,
    reduction_combine,
    spatial_binding_vars,
)
from geode.codegen.schedule.trace import primitive
from geode.errors import ScheduleError


class Reduction(ScheduleBase):
    """Two-step reductions: rfactor."""

    @primitive
    def rfactor(
        self,
        block: str,
        loop: str,
        factor: int,
        partials: str = "inner",
        partials_axis: str = "last",
    ) -> list[str]:
        """Two-step reduce: split reduce loop ``loop`` into ``outer * factor``,
        accumulate ``factor`` partial results per output element in a new local buffer
        ``<buf>_rf`` (the output's shape plus an axis of size ``factor``) in a block
        ``<block>_rf`` (with its init ``<block>_rf__init``), then let ``block`` reduce
        that axis into the output. Returns the rf nest's two new loops
        ``[<loop>_0, <loop>_1]``; the inner one carries the partials' axis and is
        spatial for the rf block, so it can be vectorized or parallelized.

        ``partials="outer"`` splits ``loop`` the other way, ``factor * inner``: partial
        ``p`` reduces the ``p``-th contiguous run of ``ceil(extent / factor)``
        iterations, and the outer loop ``<loop>_0`` carries the partials' axis (run it
        in parallel: a full reduction on every thread), the inner one ``<loop>_1`` the
        run (vectorize it). A symbolic or non-dividing extent guards the rf block with
        ``p * run + r < extent``.

        ``partials_axis="first"`` puts the partials' axis first in ``<buf>_rf``: each
        partial a contiguous row (unit stride along the output's last axis).

        Requirements: ``block`` is a reduction ``C[idx] = C[idx] op value`` with op in
        ``+ * max min``; ``loop`` is among the loops holding nothing but the block,
        bound directly (``vk = loop``) to one reduce iteration variable and used by no
        other binding; those loops bind spatial iteration variables outside and reduce
        ones inside, and enclosing loops bind no reduce variable; ``factor`` >= 1. The
        result equals the original up to float reassociation.

        Example, ``rfactor("C", "k", 4)`` (C's own init, unchanged, omitted)::

            for (i, 0, N)
              for (k, 0, 16)
                ScheduleBlock(C)
                  vi, r:vk = axis.bind(i, k)
                  C[vi] = C[vi] + X[vi, vk]
            ->
            for (i_i, 0, N)
              for (k_1_i, 0, 4)
                ScheduleBlock(C_rf__init)
                  vi, vk_i = axis.bind(i_i, k_1_i)
                  C_rf[vi, vk_i] = 0.0f
            for (i, 0, N)
              for (k_0, 0, 4)
                for (k_1, 0, 4)
                  ScheduleBlock(C_rf)
                    vi, r:vk_o, vk_i = axis.bind(i, k_0, k_1)
                    C_rf[vi, vk_i] = C_rf[vi, vk_i] + X[vi, vk_o * 4 + vk_i]
            for (i_f, 0, N)
              for (k_1_f, 0, 4)
                ScheduleBlock(C)
                  vi, r:vk_i = axis.bind(i_f, k_1_f)
                  C[vi] = C[vi] + C_rf[vi, vk_i]
        """
        b, (op, st, rest, acc_left), ri, sp_loops, red_vars = self._rfactor_target(
            block, loop, factor
        )
        _check_layout(block, partials, partials_axis)
        factor = int(factor)
        cbuf = self.kernel.buffer(st.buffer)
        old_pred = b.predicate
        # 1.-2. split the reduce loop; its iter var becomes vk_o (reduce), vk_i (spatial)
        taken: set[str] = set()
        iv_name = b.iter_vars[ri].name
        r0, r1, part_loop, vi, recon = self._rfactor_split(
            b, ri, loop, factor, partials == "outer", taken
        )
        rest = substitute(rest, {iv_name: recon})
        # 3. partial buffer and the rf block
        rf_buf, rf_idx = self._partials_buffer(cbuf, st, vi, factor, partials_axis == "first")
        acc = Load(rf_buf, rf_idx)
        b.body = [Store(rf_buf, rf_idx, Bin(op, acc, rest) if acc_left else Bin(op, rest, acc))]
        final_name = b.name
        b.name = self._fresh(f"{final_name}_rf", kind="block")
        # 4. init of the partials and the final reduction, in nests copying the
        #    block's spatial loops plus the partials' axis
        sp_ivs = [
            (v, x) for v, x in zip(b.iter_vars, b.bindings) if v.kind != "reduce" and v.name != vi
        ]
        keep_pred = [c for c in conjuncts(old_pred) if not (free_vars(c) & red_vars)]

        def nest(suffix: str, blk: Block) -> Stmt:
            ren = {f.var: Var(self._fresh(f"{f.var}_{suffix}", taken)) for f in sp_loops}
            rvar = self._fresh(f"{part_loop}_{suffix}", taken)
            blk.bindings = [substitute(x, ren) for x in blk.bindings[:-1]] + [Var(rvar)]
            blk.predicate = all_and([substitute(c, ren) for c in keep_pred])
            inner: Stmt = For(rvar, Const(factor), [blk])
            for f in reversed(sp_loops):
                inner = For(ren[f.var].name, f.extent, [inner])  # type: ignore[union-attr]
            return inner

        ivs_copy = [IterVar(v.name, v.extent, "spatial") for v, _ in sp_ivs]
        init_blk = Block(
            self._fresh(f"{b.name}__init", kind="block"),
            ivs_copy + [IterVar(vi, Const(factor), "spatial")],
            [x for _, x in sp_ivs] + [Const(0)],
            [Store(rf_buf, rf_idx, combine_identity(op, cbuf.dtype))],
            reduce_of=b.name,
        )
        facc = Load(st.buffer, st.indices)
        fin_blk = Block(
            final_name,
            [IterVar(v.name, v.extent, "spatial") for v, _ in sp_ivs]
            + [IterVar(vi, Const(factor), "reduce")],
            [x for _, x in sp_ivs] + [Const(0)],
            [Store(st.buffer, st.indices, Bin(op, facc, acc) if acc_left else Bin(op, acc, facc))],
        )
        init_nest = nest("i", init_blk)
        fin_nest = nest("f", fin_blk)
        chain, _ = self._own_chain(b)
        top = chain[0] if chain else b
        cont, _ = self._container(top)
        at = index_of(cont, top)
        cont[at + 1 : at + 1] = [fin_nest]
        cont[at:at] = [init_nest]
        return [r0, r1]

    def _partials_buffer(
        self, cbuf: Buffer, st: Store, vi: str, factor: int, first: bool
    ) -> tuple[str, tuple[Expr, ...]]:
        """The partials' local buffer ``<buf>_rf`` (the output's shape with an axis of
        ``factor``, first or last) and the index its partial ``vi`` is stored at."""
        rf_buf = self._fresh(f"{cbuf.name}_rf", kind="buffer")
        part = (Const(factor),)
        shape = part + tuple(cbuf.shape) if first else tuple(cbuf.shape) + part
        self.kernel.temps.append(Buffer(rf_buf, cbuf.dtype, shape, "local"))
        idx = (Var(vi),) + tuple(st.indices) if first else tuple(st.indices) + (Var(vi),)
        return rf_buf, idx

    def _rfactor_split(
        self, b: Block, ri: int, loop: str, factor: int, outer: bool, taken: set[str]
    ) -> tuple[str, str, str, str, Expr]:
        """Split ``loop`` for :meth:`rfactor` (the partials' loop the inner part, or the
        outer one) and replace ``b``'s iteration variable ``ri`` by the reduce ``vk_o``
        and the spatial partials' ``vk_i``; returns the two loops, the partials' loop,
        ``vk_i`` and the old variable in terms of the new ones."""
        r0, r1 = self.split(loop, [factor, None] if outer else [None, factor])
        red_loop, part_loop = (r1, r0) if outer else (r0, r1)
        ctx = self._ctx()
        iv = b.iter_vars[ri]
        vo = self._fresh(f"{iv.name}_o", taken)
        vi = self._fresh(f"{iv.name}_i", taken)
        red_iv = IterVar(vo, ctx.ext[red_loop], "reduce")
        part_iv = IterVar(vi, Const(factor), "spatial")
        b.iter_vars[ri : ri + 1] = [part_iv, red_iv] if outer else [red_iv, part_iv]
        b.bindings[ri : ri + 1] = [Var(r0), Var(r1)]
        if outer:
            recon = add(mul(Var(vi), ctx.ext[red_loop]), Var(vo))
        else:
            recon = add(mul(Var(vo), Const(factor)), Var(vi))
        return r0, r1, part_loop, vi, recon

    def _rfactor_target(
        self, block: str, loop: str, factor: int
    ) -> tuple[Block, tuple[str, Store, Expr, bool], int, list[For], set[str]]:
        """Check :meth:`rfactor`'s requirements on ``block``; returns the block, its
        combine (op, store, combined value, accumulator on the left), the index of the
        reduce iteration variable ``loop`` binds, the block's own spatial loops and the
        loop variables its reduce iteration variables are bound to."""
        prim = "rfactor"
        b, _, loops = self._locate_block(prim, block)
        if not is_reduce(b) or b.reduce_of is not None:
            raise ScheduleError(prim, block, "not a reduction block")
        comb = reduction_combine(b)
        if comb is None:
            raise ScheduleError(prim, block, "body is not a single store C[i] = C[i] op value")
        if isinstance(factor, bool) or not isinstance(factor, (int, np.integer)) or factor < 1:
            raise ScheduleError(prim, block, f"factor {factor!r} is not a positive int")
        chain, _ = self._own_chain(b)
        chain_vars = [f.var for f in chain]
        if loop not in chain_vars:
            raise ScheduleError(prim, block, f"loop {loop} is not one of the block's own loops")
        red_vars = reduce_binding_vars(b)
        bound = [i for i, x in enumerate(b.bindings) if loop in free_vars(x)]
        if len(bound) != 1 or b.bindings[bound[0]] != Var(loop):
            raise ScheduleError(prim, block, f"loop {loop} must bind exactly one iter var directly")
        ri = bound[0]
        if b.iter_vars[ri].kind != "reduce":
            raise ScheduleError(prim, block, f"loop {loop} binds a spatial iter var")
        shared = {f.var for f in loops} - set(chain_vars)
        if red_vars & shared:
            raise ScheduleError(prim, block, "an enclosing shared loop binds a reduce iter var")
        kinds = ["r" if v in red_vars else "s" for v in chain_vars]
        if "".join(kinds) != "s" * kinds.count("s") + "r" * kinds.count("r"):
            raise ScheduleError(prim, block, "spatial loops must enclose the reduce loops")
        sp_loops = [f for f in chain if f.var not in red_vars]
        sp_bound = spatial_binding_vars(b)
        for f in sp_loops:
            if f.var not in sp_bound:
                raise ScheduleError(prim, block, f"loop {f.var} binds no iteration variable")
        return b, comb, ri, sp_loops, red_vars


def _check_layout(block: str, partials: str, partials_axis: str) -> None:
    """:meth:`Reduction.rfactor`'s ``partials`` and ``partials_axis`` are known values."""
    if partials not in ("inner", "outer"):
        raise ScheduleError("rfactor", block, f"partials {partials!r} is not inner or outer")
    if partials_axis not in ("first", "last"):
        raise ScheduleError(
            "rfactor", block, f"partials_axis {partials_axis!r} is not first or last"
        )
