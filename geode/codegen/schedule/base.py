"""The schedule's state and queries (blocks, loops, producers, consumers, strides) and
the internal helpers every primitive family uses; the families are mixins of
:class:`ScheduleBase` and :class:`~geode.codegen.schedule.Schedule` combines them.
"""

from __future__ import annotations

from collections.abc import Sequence

from geode.codegen.ast import (
    Block,
    Const,
    Expr,
    For,
    If,
    Kernel,
    Load,
    Stmt,
    Var,
    add,
    expr_str,
    format_kernel,
    free_vars,
    substitute,
    transform_loads_of,
)
from geode.codegen.ast import blocks as ast_blocks
from geode.codegen.indexing import IndexContext, constant_difference, exprs_equal
from geode.codegen.schedule.blocks import (
    block_loads,
    block_reads,
    block_stores,
    block_writes,
    common_prefix,
    find_in_loops,
    in_loop_terms,
    map_block_exprs,
    reduce_binding_vars,
    walk_loops,
)
from geode.codegen.schedule.trace import Trace
from geode.errors import ScheduleError


class ScheduleBase:
    """Schedule primitives over a copy of a lowered kernel; see the module docstring.

    ``sch.kernel`` is the kernel being rewritten, ``sch.trace`` the primitives applied
    so far. ``str(sch)`` prints the current loop AST.
    """

    def __init__(self, kernel: Kernel):
        self.kernel: Kernel = kernel.copy()
        self.trace: Trace = Trace()
        self._depth = 0

    def __str__(self) -> str:
        return format_kernel(self.kernel)

    def blocks(self) -> list[str]:
        """Names of all blocks, in program order."""
        return [b.name for b in ast_blocks(self.kernel.body)]

    def get_block(self, name: str) -> Block:
        """The block called ``name`` (raises ScheduleError if there is none)."""
        for b in ast_blocks(self.kernel.body):
            if b.name == name:
                return b
        raise ScheduleError("get_block", name, "no such block")

    def get_loops(self, block: str) -> list[str]:
        """Loop variables enclosing ``block``, outermost first."""
        return [f.var for f in self._locate_block("get_loops", block)[2]]

    def get_loop(self, loop: str) -> For:
        """The loop whose variable is ``loop``."""
        return self._locate_loop("get_loop", loop)[0]

    def writers(self, buffer: str) -> list[str]:
        """Blocks storing into ``buffer``, in program order."""
        return [b.name for b in ast_blocks(self.kernel.body) if buffer in block_writes(b)]

    def readers(self, buffer: str) -> list[str]:
        """Blocks loading from ``buffer``, in program order."""
        return [b.name for b in ast_blocks(self.kernel.body) if buffer in block_reads(b)]

    def producers(self, block: str) -> list[str]:
        """Blocks writing a buffer that ``block`` reads (a reduction's own init block
        counts as part of it, not as a producer)."""
        b = self.get_block(block)
        rs = block_reads(b)
        return [
            x.name
            for x in ast_blocks(self.kernel.body)
            if x is not b and x.reduce_of != b.name and block_writes(x) & rs
        ]

    def consumers(self, block: str) -> list[str]:
        """Blocks reading a buffer that ``block`` writes (for an init block, the
        reduction it initialises is not counted)."""
        b = self.get_block(block)
        ws = block_writes(b)
        return [
            x.name
            for x in ast_blocks(self.kernel.body)
            if x is not b
            and b.reduce_of != x.name
            and x.reduce_of != b.name
            and block_reads(x) & ws
        ]

    def load_strides(self, block: str, loop: str) -> list[tuple[str, list[int | None]]]:
        """For every load of ``block``: its buffer and, per index, how far that index
        moves when loop ``loop`` advances by one (the constant coefficient of ``loop`` in
        the index written in loop variables; 0 when the index does not use ``loop``;
        None when it is not affine in ``loop`` with a constant coefficient)."""
        b = self.get_block(block)
        out: list[tuple[str, list[int | None]]] = []
        for ld in block_loads(b):
            strides: list[int | None] = []
            for i in ld.indices:
                e = in_loop_terms(b, i)
                if loop not in free_vars(e):
                    strides.append(0)
                    continue
                strides.append(
                    constant_difference(substitute(e, {loop: add(Var(loop), Const(1))}), e)
                )
            out.append((ld.buffer, strides))
        return out

    def _ctx(self) -> IndexContext:
        ext = {s.var: s.extent for s, _, _ in walk_loops(self.kernel.body) if isinstance(s, For)}
        return IndexContext(ext, self.kernel.dims)

    def _names_in_use(self, kind: str) -> set[str]:
        """Names taken in one namespace: "var" (dims, loop and iteration variables),
        "block" or "buffer"."""
        k = self.kernel
        if kind == "buffer":
            return {b.name for b in k.inputs + k.outputs + k.temps}
        used: set[str] = set(k.dims) if kind == "var" else set()
        for s, _, _ in walk_loops(k.body):
            if isinstance(s, For) and kind == "var":
                used.add(s.var)
            elif isinstance(s, Block):
                if kind == "block":
                    used.add(s.name)
                else:
                    used |= {iv.name for iv in s.iter_vars}
        return used

    def _fresh(
        self,
        base: str,
        taken: set[str] | None = None,
        free: set[str] | None = None,
        kind: str = "var",
    ) -> str:
        """A name starting with ``base`` unused in namespace ``kind`` and not in
        ``taken`` (which receives it); names in ``free`` count as unused."""
        used = (self._names_in_use(kind) - (free or set())) | (taken or set())
        if base not in used:
            name = base
        else:
            n = 1
            while f"{base}_{n}" in used:
                n += 1
            name = f"{base}_{n}"
        if taken is not None:
            taken.add(name)
        return name

    def _locate_block(self, prim: str, name: str) -> tuple[Block, list[Stmt], tuple[For, ...]]:
        found = find_in_loops(self.kernel.body, lambda s: isinstance(s, Block) and s.name == name)
        if found is None:
            raise ScheduleError(prim, name, "no such block")
        return found  # type: ignore[return-value]

    def _locate_loop(self, prim: str, var: str) -> tuple[For, list[Stmt], tuple[For, ...]]:
        found = find_in_loops(self.kernel.body, lambda s: isinstance(s, For) and s.var == var)
        if found is None:
            raise ScheduleError(prim, "-", f"no loop with variable {var!r}")
        return found  # type: ignore[return-value]

    def _container(self, stmt: Stmt) -> tuple[list[Stmt], tuple[For, ...]]:
        found = find_in_loops(self.kernel.body, lambda s: s is stmt)
        if found is None:
            raise KeyError("statement not in kernel")
        return found[1], found[2]

    @staticmethod
    def _first_block(stmt: Stmt) -> str:
        bs = ast_blocks([stmt])
        return bs[0].name if bs else "-"

    def _loop_ids(self, block: str) -> set[int]:
        """Identities of the loops enclosing ``block``."""
        return {id(f) for f in self._locate_block("-", block)[2]}

    def _loop_ids_index(self) -> dict[str, set[int]]:
        """:meth:`_loop_ids` of every block at once (one walk of the kernel): for a
        primitive's checks, which ask for many blocks while the kernel stays as it is."""
        out: dict[str, set[int]] = {}
        for s, _, loops in walk_loops(self.kernel.body):
            if isinstance(s, Block) and s.name not in out:
                out[s.name] = {id(f) for f in loops}
        return out

    def _writers_index(self) -> dict[str, list[str]]:
        """:meth:`writers` of every buffer at once (one walk of the kernel)."""
        out: dict[str, list[str]] = {}
        for b in ast_blocks(self.kernel.body):
            for buf in block_writes(b):
                out.setdefault(buf, []).append(b.name)
        return out

    def _shared_loops(self, a: str, b: str) -> set[int]:
        """Identities of the loops enclosing both blocks."""
        return self._loop_ids(a) & self._loop_ids(b)

    def _order(self) -> dict[str, int]:
        return {b.name: i for i, b in enumerate(ast_blocks(self.kernel.body))}

    def _init_of(self, b: Block) -> Block | None:
        for x in ast_blocks(self.kernel.body):
            if x.reduce_of == b.name:
                return x
        return None

    def _own_chain(self, b: Block) -> tuple[list[For], list[Stmt]]:
        """The loops around ``b`` that hold nothing else (innermost upward), and the
        list holding the outermost of them (or ``b`` itself)."""
        cont, loops = self._container(b)
        chain: list[For] = []
        child: Stmt = b
        holder = cont
        for f in reversed(loops):
            if len(holder) == 1 and holder[0] is child:
                chain.insert(0, f)
                child = f
                holder = self._container(f)[0]
            else:
                break
        return chain, holder

    def _root_chain(self, prim: str, b: Block) -> list[For]:
        """``b``'s loops when ``b`` sits alone in a perfect nest at kernel level."""
        chain, holder = self._own_chain(b)
        _, loops = self._container(b)
        if holder is not self.kernel.body or len(chain) != len(loops):
            raise ScheduleError(
                prim, b.name, "the block must sit alone in its own loop nest at kernel level"
            )
        return chain

    def _remove(self, stmt: Stmt) -> None:
        cont, _ = self._container(stmt)
        for i, s in enumerate(cont):
            if s is stmt:
                del cont[i]
                break
        self._prune(self.kernel.body)

    def _prune(self, stmts: list[Stmt]) -> None:
        i = 0
        while i < len(stmts):
            s = stmts[i]
            if isinstance(s, (For, If)):
                self._prune(s.body)
                if not s.body:
                    del stmts[i]
                    continue
            i += 1

    def _accesses(self, b: Block, buf: str) -> list[tuple[str, tuple[Expr, ...]]]:
        """('w'|'r', indices in loop terms) for every access of ``b`` to ``buf``."""
        out: list[tuple[str, tuple[Expr, ...]]] = []
        for st in block_stores(b):
            if st.buffer == buf:
                out.append(("w", tuple(in_loop_terms(b, i) for i in st.indices)))
        for ld in block_loads(b):
            if ld.buffer == buf:
                out.append(("r", tuple(in_loop_terms(b, i) for i in ld.indices)))
        return out

    def _slab_analysis(
        self, buf: str, blocks_: Sequence[tuple[Block, tuple[For, ...]]], outer: tuple[For, ...]
    ) -> list[bool] | str:
        """Check that, inside one iteration of the loops ``outer``, the given blocks'
        accesses to ``buf`` only touch what the writers among them store in that same
        iteration. Returns per dim whether it is a *slab* dim (fixed by ``outer``: the
        same index in every access) or a reason string when the check fails."""
        ctx = self._ctx()
        lset = {f.var for f in outer} | set(self.kernel.dims)
        shape = self.kernel.buffer(buf).shape
        acc: list[tuple[Block, str, tuple[Expr, ...], set[str]]] = []
        for b, path in blocks_:
            inner = {f.var for f in path[len(outer) :]}
            for kind, idx in self._accesses(b, buf):
                acc.append((b, kind, idx, inner))
            if buf in block_writes(b) and reduce_binding_vars(b) & {f.var for f in outer}:
                return f"block {b.name} reduces across the shared loops"
        slab: list[bool] = []
        covered_by: dict[str, set[str]] = {}
        for d in range(len(shape)):
            exprs = [a[2][d] for a in acc]
            if all(free_vars(e) <= lset for e in exprs) and all(
                exprs_equal(e, exprs[0]) for e in exprs
            ):
                slab.append(True)
                continue
            for b, kind, idx, inner in acc:
                if kind != "w":
                    continue
                used = ctx.covers(idx[d], shape[d], inner)
                if used is None or used & covered_by.get(b.name, set()):
                    return (
                        f"{buf} dim {d}: block {b.name} writes index "
                        f"{expr_str(idx[d])}, which neither matches every access in the shared "
                        f"loops nor covers the whole dim within one iteration"
                    )
                covered_by.setdefault(b.name, set()).update(used)
            slab.append(False)
        return slab

    def _try_shrink(self, buf: str) -> None:
        """Shrink local temp ``buf`` to its per-iteration region when every access to it
        lies inside common loops and the slab analysis holds."""
        k = self.kernel
        b = next((t for t in k.temps if t.name == buf), None)
        if b is None or b.scope != "local" or not b.shape:
            return
        users = [
            (s, loops)
            for s, _, loops in walk_loops(k.body)
            if isinstance(s, Block) and buf in (block_reads(s) | block_writes(s))
        ]
        if not users:
            return
        outer = common_prefix([p for _, p in users])
        if not outer:
            return
        slab = self._slab_analysis(buf, users, outer)
        if isinstance(slab, str) or not any(slab):
            return
        full = all(slab)

        def fix(idx: tuple[Expr, ...]) -> tuple[Expr, ...]:
            if full:
                return ()
            return tuple(Const(0) if s else i for s, i in zip(slab, idx))

        def relabel(e: Expr) -> Expr | None:
            if isinstance(e, Load) and e.buffer == buf:
                return Load(buf, fix(e.indices))
            return None

        for blk, _ in users:
            for st in block_stores(blk):
                if st.buffer == buf:
                    st.indices = fix(st.indices)
            map_block_exprs(blk, lambda e: transform_loads_of(e, buf, relabel))
        if full:
            b.shape = ()
            b.scope = "register"
        else:
            b.shape = tuple(Const(1) if s else d for s, d in zip(slab, b.shape))
