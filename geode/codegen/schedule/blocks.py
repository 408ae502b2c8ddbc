"""Statement and block queries and rewrites that the schedule primitives share: which
buffers a block reads and writes, the accesses inside a loop, expression rewrites
over a block, a reduction's combine op and identity, where a temp is allocated.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np

from geode.codegen.ast import (
    Bin,
    Block,
    Const,
    Expr,
    For,
    If,
    Kernel,
    Load,
    Prefetch,
    Stmt,
    Store,
    StreamStore,
    expr_str,
    free_vars,
    loads,
    substitute,
    transform,
    transform_loads_of,
    walk_stmts,
)
from geode.codegen.ast import blocks as ast_blocks

#: combine operators a reduction may use
COMBINE_OPS = ("+", "*", "max", "min")


def walk_loops(
    stmts: list[Stmt], loops: tuple[For, ...] = ()
) -> Iterator[tuple[Stmt, list[Stmt], tuple[For, ...]]]:
    """(statement, the list holding it, enclosing loops) for every statement outside
    block bodies, pre-order.

    Lazy, like the recursive walk it stands for (each list is copied when the walk
    enters it, after its parent was yielded), but with an explicit stack: nested
    generators cost a step per level for every statement, and the schedule looks
    blocks and loops up this way many times per primitive."""
    stack = [(iter(list(stmts)), stmts, loops)]
    while stack:
        it, cont, outer = stack[-1]
        s = next(it, None)
        if s is None:
            stack.pop()
            continue
        yield s, cont, outer
        if isinstance(s, For):
            stack.append((iter(list(s.body)), s.body, outer + (s,)))
        elif isinstance(s, If):
            stack.append((iter(list(s.body)), s.body, outer))


def find_in_loops(
    stmts: list[Stmt], match: Callable[[Stmt], bool], loops: tuple[For, ...] = ()
) -> tuple[Stmt, list[Stmt], tuple[For, ...]] | None:
    """The first (statement, the list holding it, enclosing loops) of :func:`walk_loops`
    whose statement ``match`` accepts, or None: the same search, by plain recursion (the
    schedule locates blocks and loops this way for nearly every query)."""
    for s in stmts:
        if match(s):
            return s, stmts, loops
        kind = type(s)
        if kind is For:
            found = find_in_loops(s.body, match, loops + (s,))
        elif kind is If:
            found = find_in_loops(s.body, match, loops)
        else:
            continue
        if found is not None:
            return found
    return None


def block_stores(b: Block) -> list[Store]:
    return [s for s in walk_stmts(b.body) if isinstance(s, Store)]


def block_loads(b: Block) -> list[Load]:
    """The loads in ``b``'s body, in program order (store indices, then the value)."""
    out: list[Load] = []
    body = b.body
    if len(body) == 1 and type(body[0]) is Store:  # the common flat block, read directly
        st = body[0]
        for i in st.indices:
            out += loads(i)
        return out + loads(st.value)
    for s in walk_stmts(body):
        if isinstance(s, Store):
            for i in s.indices:
                out += loads(i)
            out += loads(s.value)
        elif isinstance(s, If):
            out += loads(s.cond)
    return out


def block_writes(b: Block) -> set[str]:
    """The buffers ``b``'s body stores into."""
    body = b.body
    if len(body) == 1 and type(body[0]) is Store:  # the common flat block, walked directly
        return {body[0].buffer}
    return {s.buffer for s in block_stores(b)}


def block_reads(b: Block) -> set[str]:
    """The buffers ``b``'s body loads from."""
    return {ld.buffer for ld in block_loads(b)}


def is_reduce(b: Block) -> bool:
    return any(iv.kind == "reduce" for iv in b.iter_vars)


def in_loop_terms(b: Block, e: Expr) -> Expr:
    """``e`` (in ``b``'s iteration variables) in terms of loop variables."""
    return substitute(e, {iv.name: x for iv, x in zip(b.iter_vars, b.bindings)})


def reduce_binding_vars(b: Block) -> set[str]:
    out: set[str] = set()
    for iv, x in zip(b.iter_vars, b.bindings):
        if iv.kind == "reduce":
            out |= free_vars(x)
    return out


def spatial_binding_vars(b: Block) -> set[str]:
    out: set[str] = set()
    for iv, x in zip(b.iter_vars, b.bindings):
        if iv.kind != "reduce":
            out |= free_vars(x)
    return out


def loop_accesses(
    loop: For, var: str, rename: dict[str, Expr] | None = None
) -> tuple[dict[str, list[tuple[Expr, ...]]], dict[str, list[tuple[Expr, ...]]]]:
    """Stores and loads inside ``loop`` by buffer, with indices rewritten from block
    iteration variables to loop variables (``rename`` renames loop variables first)."""
    writes: dict[str, list[tuple[Expr, ...]]] = {}
    reads: dict[str, list[tuple[Expr, ...]]] = {}
    for b in ast_blocks(loop.body):
        bind = {iv.name: substitute(x, rename or {}) for iv, x in zip(b.iter_vars, b.bindings)}
        exprs: list[Expr] = [substitute(x, rename or {}) for x in b.bindings]
        if b.predicate is not None:
            exprs.append(b.predicate)
        for st in walk_stmts(b.body):
            if isinstance(st, Store):
                writes.setdefault(st.buffer, []).append(
                    tuple(substitute(i, bind) for i in st.indices)
                )
                exprs += list(st.indices) + [st.value]
            elif isinstance(st, If):
                exprs.append(st.cond)
        for e in exprs:
            for ld in loads(e):
                reads.setdefault(ld.buffer, []).append(
                    tuple(substitute(i, bind) for i in ld.indices)
                )
    return writes, reads


def block_exprs(b: Block) -> list[Expr]:
    """Every expression of a block: bindings, predicate, store indices and values, conditions."""
    out: list[Expr] = list(b.bindings) + ([b.predicate] if b.predicate is not None else [])
    for st in walk_stmts(b.body):
        if isinstance(st, Store):
            out += list(st.indices) + [st.value]
        elif isinstance(st, If):
            out.append(st.cond)
    return out


def subst_loop_vars(stmts: list[Stmt], mapping: dict[str, Expr]) -> None:
    """Replace loop variables in loop extents, conditions, bindings, predicates and
    prefetch offsets."""
    for s in stmts:
        if isinstance(s, For):
            s.extent = substitute(s.extent, mapping)
            subst_loop_vars(s.body, mapping)
        elif isinstance(s, If):
            s.cond = substitute(s.cond, mapping)
            subst_loop_vars(s.body, mapping)
        elif isinstance(s, Block):
            s.bindings = [substitute(x, mapping) for x in s.bindings]
            if s.predicate is not None:
                s.predicate = substitute(s.predicate, mapping)
        elif isinstance(s, Prefetch):
            s.offset = substitute(s.offset, mapping)
        elif isinstance(s, StreamStore):
            s.offset = substitute(s.offset, mapping)
            s.src_offset = substitute(s.src_offset, mapping)
            s.length = substitute(s.length, mapping)


def is_flat_block(x: Stmt) -> bool:
    """A block holding no loop and no nested block."""
    return isinstance(x, Block) and not any(isinstance(y, (For, Block)) for y in walk_stmts(x.body))


def rename_loads(e: Expr, names: dict[str, str]) -> Expr:
    """``e`` with loads of the buffers in ``names`` reading the renamed buffers instead."""

    def repl(x: Expr) -> Expr | None:
        if isinstance(x, Load) and x.buffer in names:
            return Load(names[x.buffer], x.indices)
        return None

    return transform(e, repl)


def accessed_buffers(s: Stmt) -> set[str]:
    """The buffers statement ``s`` reads or writes itself (a block: anywhere in it)."""
    if isinstance(s, Block):
        return block_reads(s) | block_writes(s)
    if isinstance(s, StreamStore):
        return {s.buffer, s.src}
    if isinstance(s, Prefetch):
        return {s.buffer}
    return set()


def map_block_exprs(b: Block, fn: Callable[[Expr], Expr]) -> None:
    """Rewrite every expression in a block's body (store indices, values, conditions)."""
    for s in walk_stmts(b.body):
        if isinstance(s, (Store, If)):
            map_stmt_exprs(s, fn)


def map_stmt_exprs(s: Stmt, fn: Callable[[Expr], Expr]) -> None:
    """Rewrite every expression ``s`` holds directly (not those of nested statements)."""
    if isinstance(s, Store):
        s.indices = tuple(fn(i) for i in s.indices)
        s.value = fn(s.value)
        if s.nontemporal is not None:
            s.nontemporal = fn(s.nontemporal)
    elif isinstance(s, For):
        s.extent = fn(s.extent)
    elif isinstance(s, Block):
        s.bindings = [fn(x) for x in s.bindings]
        if s.predicate is not None:
            s.predicate = fn(s.predicate)
    elif isinstance(s, If):
        s.cond = fn(s.cond)
    elif isinstance(s, Prefetch):
        s.offset = fn(s.offset)
    elif isinstance(s, StreamStore):
        s.offset, s.src_offset = fn(s.offset), fn(s.src_offset)
        s.length, s.nontemporal = fn(s.length), fn(s.nontemporal)


def retarget(b: Block, temp: str, out: str, plan: list[int | Expr], row: dict[str, Expr]) -> None:
    """In ``b``, turn ``temp[s]`` into ``out[...]``: axis ``i`` of ``out`` takes ``s[plan[i]]``
    or, for a row expression, ``row[expr_str(plan[i])]``."""

    def to_out(idx: Sequence[Expr]) -> tuple[Expr, ...]:
        return tuple(idx[p] if isinstance(p, int) else row[expr_str(p)] for p in plan)

    def repl(e: Expr) -> Expr | None:
        if isinstance(e, Load) and e.buffer == temp:
            return Load(out, to_out(e.indices))
        return None

    for st in block_stores(b):
        if st.buffer == temp:
            st.buffer = out
            st.indices = to_out(st.indices)
    map_block_exprs(b, lambda e: transform_loads_of(e, temp, repl))


def reduction_combine(b: Block) -> tuple[str, Store, Expr, bool] | None:
    """For a reduction block: (combine op, the store, the combined value, whether the
    accumulator is the left operand), or None if the body is not ``C = C op x``."""
    if len(b.body) != 1 or not isinstance(b.body[0], Store):
        return None
    st = b.body[0]
    v = st.value
    if not (isinstance(v, Bin) and v.op in COMBINE_OPS):
        return None
    acc = Load(st.buffer, st.indices)
    if v.a == acc and st.buffer not in {ld.buffer for ld in loads(v.b)}:
        return v.op, st, v.b, True
    if v.b == acc and st.buffer not in {ld.buffer for ld in loads(v.a)}:
        return v.op, st, v.a, False
    return None


def combine_identity(op: str, dtype: str) -> Const:
    dt = np.dtype(dtype)
    if op == "+":
        return Const(0.0 if dt.kind == "f" else 0, dtype)
    if op == "*":
        return Const(1.0 if dt.kind == "f" else 1, dtype)
    if dt.kind == "f":
        return Const(float("-inf") if op == "max" else float("inf"), dtype)
    if dt.kind == "b":
        return Const(op == "min", dtype)
    info = np.iinfo(dt)
    return Const(int(info.min) if op == "max" else int(info.max), dtype)


def alloc_loop(kernel: Kernel, buffer: str) -> str | None:
    """The innermost loop enclosing every access to temp ``buffer``: where a backend
    should allocate it (one private copy per iteration), or None for kernel level.

    After :meth:`Schedule.compute_at` shrinks a temp to its per-iteration region, the
    temp must live inside this loop when the loop (or one around it) is parallel.
    """
    paths: list[tuple[For, ...]] = []
    for s, _, loops in walk_loops(kernel.body):
        reads_it = (isinstance(s, Block) and buffer in (block_reads(s) | block_writes(s))) or (
            isinstance(s, StreamStore) and buffer == s.src
        )
        if reads_it:
            paths.append(loops)
    if not paths:
        return None
    common = common_prefix(paths)
    return common[-1].var if common else None


def index_of(cont: list[Stmt], x: Stmt) -> int:
    """Position of ``x`` in ``cont`` by identity (statements compare by value)."""
    for i, s in enumerate(cont):
        if s is x:
            return i
    raise ValueError("statement not in list")


def common_prefix(paths: Sequence[tuple[For, ...]]) -> tuple[For, ...]:
    out: list[For] = []
    for group in zip(*paths):
        if all(f is group[0] for f in group):
            out.append(group[0])
        else:
            break
    return tuple(out)
