"""Facts about a scheduled kernel that decide how the LLVM backend prints it.

Pure functions of the loop AST (no IR): constant folding of index expressions, buffer
sizes, which registers are min/max reductions that may use the fast NaN-ignoring
instructions (:func:`guarded_registers`), which loops index register arrays (and are
therefore unrolled, :func:`indexes_register`), where each temporary lives
(:func:`allocation_sites`), and which non-temporal stores may really stream
(:func:`streaming_stores`).
"""

from __future__ import annotations

from collections.abc import Callable

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
    Load,
    Stmt,
    Store,
    StreamStore,
    free_vars,
    stmt_exprs,
    substitute,
    transform,
    walk,
    walk_stmts,
)

__all__ = [
    "NAN_GUARD",
    "allocation_sites",
    "fold_consts",
    "fold_int",
    "guarded_registers",
    "indexes_register",
    "minmax_update",
    "nt_stores",
    "static_size",
]

#: float dtype -> (integer dtype of its bits, the bits of +inf): ``|bits| > inf`` iff NaN.
NAN_GUARD = {"float32": ("int32", 0x7F800000), "float64": ("int64", 0x7FF0000000000000)}

_INT_FOLD: dict[str, Callable[[int, int], int | None]] = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "//": lambda a, b: a // b if b else None,
    "%": lambda a, b: a % b if b else None,
    "min": min,
    "max": max,
}


def fold_consts(e: Expr) -> Expr:
    """Fold int64 arithmetic on constants (index expressions after unrolling)."""

    def fn(x: Expr) -> Expr | None:
        if (
            isinstance(x, Bin)
            and x.op in _INT_FOLD
            and isinstance(x.a, Const)
            and isinstance(x.b, Const)
            and x.a.dtype == x.b.dtype == "int64"
        ):
            r = _INT_FOLD[x.op](int(x.a.value), int(x.b.value))
            if r is not None and -(2**63) <= r < 2**63:
                return Const(r, "int64")
        return None

    return transform(e, fn)


def fold_int(e: Expr) -> int | None:
    """The value of an integer constant expression, else None."""
    if isinstance(e, Const) and e.dtype != "bool" and np.dtype(e.dtype).kind in "iu":
        return int(e.value)
    return None


def static_size(b: Buffer) -> int | None:
    """Element count of a buffer whose shape folds to constants, else None."""
    size = 1
    for d in b.shape:
        n = fold_int(fold_consts(d))
        if n is None:
            return None
        size *= n
    return size


def minmax_update(st: Store) -> tuple[str, Expr] | tuple[()] | None:
    """``(op, v)`` for ``R = op(R, v)``, ``()`` for a store not reading ``R``, ``None``
    for any other store reading ``R``."""

    def reads(e: Expr) -> bool:
        return any(isinstance(x, Load) and x.buffer == st.buffer for x in walk(e))

    v = st.value
    if isinstance(v, Bin) and v.op in ("max", "min"):
        for acc, other in ((v.a, v.b), (v.b, v.a)):
            if isinstance(acc, Load) and acc.buffer == st.buffer and not reads(other):
                return (v.op, other)
    return None if reads(v) else ()


def guarded_registers(body: list[Stmt], candidate: Callable[[str], bool]) -> set[str]:
    """Scalar float registers (``candidate``) only ever initialised or updated as
    ``R = max(R, v)`` (or only ``min``): their updates may use the NaN-ignoring
    ``maxnum`` plus an integer NaN guard checked after the loop that holds them (exact
    np.max/np.min results, NaN included; only the sign of a zero result of a +0/-0 tie
    is unspecified). A register is left out when the innermost loop holding one of its
    updates also reads or (re)initialises it elsewhere, since ``R`` is exact only after
    that check."""
    ops: dict[str, set[str]] = {}
    bad: set[str] = set()
    updates: dict[str, list[tuple[int, ...]]] = {}
    others: dict[str, list[tuple[int, ...]]] = {}

    def note_reads(exprs: list[Expr], stack: tuple[int, ...]) -> None:
        for e in exprs:
            for x in walk(e):
                if isinstance(x, Load) and candidate(x.buffer):
                    others.setdefault(x.buffer, []).append(stack)

    def visit(stmts: list[Stmt], stack: tuple[int, ...]) -> None:
        for st in stmts:
            if isinstance(st, Store) and candidate(st.buffer):
                kind = minmax_update(st)
                if kind is None:
                    bad.add(st.buffer)
                elif kind:
                    ops.setdefault(st.buffer, set()).add(kind[0])
                    updates.setdefault(st.buffer, []).append(stack)
                    note_reads([*st.indices, kind[1]], stack)
                    continue
                else:
                    others.setdefault(st.buffer, []).append(stack)
            if isinstance(st, For):
                note_reads([st.extent], stack)
                visit(st.body, (*stack, id(st)))
                continue
            note_reads(stmt_exprs(st), stack)
            if isinstance(st, (Block, If)):
                visit(st.body, stack)

    visit(body, ())
    out = set()
    for name, o in ops.items():
        if name in bad or len(o) != 1:
            continue
        inner = {stk[-1] for stk in updates[name] if stk}
        if any(inner & set(stk) for stk in others.get(name, [])):
            continue
        out.add(name)
    return out


def indexes_register(loop: For, regs: set[str]) -> bool:
    """Does the loop body index one of the multi-element register buffers ``regs`` with
    ``loop.var`` (directly or through block iteration variables bound to it)?"""
    if not regs:
        return False
    dep = {loop.var}

    def hits(e: Expr) -> bool:
        return any(
            isinstance(x, Load) and x.buffer in regs and any(free_vars(i) & dep for i in x.indices)
            for x in walk(e)
        )

    def visit(stmts: list[Stmt]) -> bool:
        for s in stmts:
            if isinstance(s, Block):
                for iv, bind in zip(s.iter_vars, s.bindings):
                    if free_vars(bind) & dep:
                        dep.add(iv.name)
            exprs: list[Expr] = []
            if isinstance(s, Store):
                if s.buffer in regs and any(free_vars(i) & dep for i in s.indices):
                    return True
                exprs = [s.value]
            elif isinstance(s, If):
                exprs = [s.cond]
            elif isinstance(s, Block) and s.predicate is not None:
                exprs = [s.predicate]
            if any(hits(ex) for ex in exprs):
                return True
            if isinstance(s, (For, Block, If)) and visit(s.body):
                return True
        return False

    return visit(loop.body)


def _accessed(s: Stmt) -> list[str]:
    """Buffers a statement reads or writes directly (not in nested statements)."""
    names = [x.buffer for e in stmt_exprs(s) for x in walk(e) if isinstance(x, Load)]
    if isinstance(s, Store):
        names.append(s.buffer)
    elif isinstance(s, StreamStore):
        names += [s.src, s.buffer]
    return names


def allocation_sites(
    body: list[Stmt], temps: set[str], outlined: Callable[[For], bool]
) -> dict[str, int | None]:
    """Where each temporary in ``temps`` lives: ``id(loop)`` of the outlined parallel loop
    (``outlined``) holding every access to it, so each chunk of that loop gets its own
    copy, else None (the kernel's body function allocates it once)."""
    sites: dict[str, set[int | None]] = {}

    def visit(stmts: list[Stmt], site: int | None) -> None:
        for s in stmts:
            for name in _accessed(s):
                if name in temps:
                    sites.setdefault(name, set()).add(site)
            if isinstance(s, For):
                visit(s.body, id(s) if site is None and outlined(s) else site)
            elif isinstance(s, (Block, If)):
                visit(s.body, site)

    visit(body, None)
    out: dict[str, int | None] = {}
    for name in sorted(temps):  # a set's order changes between processes: the IR must not
        found = sites.get(name, {None})
        out[name] = next(iter(found)) if len(found) == 1 else None
    return out


def nt_stores(loop: For, is_register: Callable[[str], bool]) -> list[tuple[Block, Store]]:
    """The non-temporal stores (:meth:`Schedule.store_nontemporal`) of the blocks directly
    in ``loop``, when every statement there is a flat block without predicate that
    stores to no register; else none (such stores print as ordinary stores)."""
    found: list[tuple[Block, Store]] = []
    for b in loop.body:
        if (
            not isinstance(b, Block)
            or b.predicate is not None
            or any(isinstance(x, (For, Block)) for x in walk_stmts(b.body))
        ):
            return []
        for st in walk_stmts(b.body):
            if isinstance(st, Store) and is_register(st.buffer):
                return []
            if isinstance(st, Store) and st.nontemporal is not None:
                found.append((b, st))
    return found


def run_start(block: Block, st: Store, loop: For) -> list[Expr]:
    """The indices ``st`` writes at the first iteration of ``loop`` (block bindings
    substituted, the loop variable set to 0)."""
    binds = {iv.name: x for iv, x in zip(block.iter_vars, block.bindings)}
    return [substitute(substitute(i, binds), {loop.var: Const(0)}) for i in st.indices]


def vectorized_loops(body: list[Stmt]) -> list[For]:
    """Every loop of kind ``vectorized``, in program order."""
    return [s for s in walk_stmts(body) if isinstance(s, For) and s.kind is ForKind.VECTORIZED]
