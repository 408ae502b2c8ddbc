"""A kernel's identity by its structure: the canonical form of a lowered kernel and its key.

Lowering names buffers, blocks and loops after the graph's values and nodes, and dims
after the model's symbols, so two models with the same fused group give kernels that
differ only in names. :func:`canonical_kernel` renames everything in order of
appearance (dims ``d0, d1, ..``; inputs ``in0, ..``; outputs ``out0, ..``; temporaries
``t0, ..``; loops ``l0, ..`` and blocks ``b0, ..`` in program order; iteration variables
``v0, ..``), leaving the structure, dtypes, static extents and scopes as they were.
:func:`kernel_key` hashes the canonical form's text: the same lowered structure gives
the same key whatever the model called its tensors, and any change to the loops, the
arithmetic, a dtype or a static extent gives another.

Schedules kept as data (a trace given to ``geode.compile(..., schedules=...)``, a
tuning database's entries) are recorded on the canonical form, so they name ``b0``
and ``l1``, not a model's names; :func:`canonical_lowered` gives the driver the
lowered kernel in that form to replay them on.
"""

from __future__ import annotations

import dataclasses
import hashlib

from geode.codegen import ast as A
from geode.codegen.lower import LoweredKernel

#: bumped whenever the canonical form or its text changes meaning
KEY_VERSION = 1
#: hex digits of a key
KEY_CHARS = 32


@dataclasses.dataclass
class _Names:
    """The renaming of one kernel: variables (dims, loops, iteration variables), buffers
    and blocks."""

    var: dict[str, str] = dataclasses.field(default_factory=dict)
    buf: dict[str, str] = dataclasses.field(default_factory=dict)
    block: dict[str, str] = dataclasses.field(default_factory=dict)
    counts: dict[str, int] = dataclasses.field(default_factory=dict)

    def add(self, table: dict[str, str], old: str, prefix: str) -> None:
        if old not in table:
            i = self.counts.get(prefix, 0)
            self.counts[prefix] = i + 1
            table[old] = f"{prefix}{i}"


def _collect(k: A.Kernel) -> _Names:
    n = _Names()
    for d in k.dims:
        n.add(n.var, d, "d")
    for prefix, bufs in (("in", k.inputs), ("out", k.outputs), ("t", k.temps)):
        for b in bufs:
            n.add(n.buf, b.name, prefix)
    for s in A.walk_stmts(k.body):
        if isinstance(s, A.For):
            n.add(n.var, s.var, "l")
        elif isinstance(s, A.Block):
            n.add(n.block, s.name, "b")
            for iv in s.iter_vars:
                n.add(n.var, iv.name, "v")
    return n


def _expr(e: A.Expr, n: _Names) -> A.Expr:
    """``e`` renamed (rebuilt node by node, never folded)."""
    if isinstance(e, A.Var):
        return A.Var(n.var.get(e.name, e.name))
    if isinstance(e, A.Bin):
        return A.Bin(e.op, _expr(e.a, n), _expr(e.b, n))
    if isinstance(e, A.Un):
        return A.Un(e.op, _expr(e.a, n))
    if isinstance(e, A.Select):
        return A.Select(_expr(e.cond, n), _expr(e.t, n), _expr(e.f, n))
    if isinstance(e, A.Cast):
        return A.Cast(e.dtype, _expr(e.a, n))
    if isinstance(e, A.Load):
        return A.Load(n.buf.get(e.buffer, e.buffer), tuple(_expr(i, n) for i in e.indices))
    return e


def _opt(e: A.Expr | None, n: _Names) -> A.Expr | None:
    return None if e is None else _expr(e, n)


def _stmt(s: A.Stmt, n: _Names) -> A.Stmt:
    if isinstance(s, A.For):
        body = [_stmt(x, n) for x in s.body]
        return A.For(n.var[s.var], _expr(s.extent, n), body, s.kind, s.interleave)
    if isinstance(s, A.Block):
        return A.Block(
            n.block[s.name],
            [A.IterVar(n.var[iv.name], _expr(iv.extent, n), iv.kind) for iv in s.iter_vars],
            [_expr(b, n) for b in s.bindings],
            [_stmt(x, n) for x in s.body],
            _opt(s.predicate, n),
            None if s.reduce_of is None else n.block.get(s.reduce_of, s.reduce_of),
        )
    if isinstance(s, A.Store):
        idx = tuple(_expr(i, n) for i in s.indices)
        return A.Store(n.buf[s.buffer], idx, _expr(s.value, n), _opt(s.nontemporal, n))
    if isinstance(s, A.If):
        return A.If(_expr(s.cond, n), [_stmt(x, n) for x in s.body])
    if isinstance(s, A.Prefetch):
        return A.Prefetch(n.buf[s.buffer], _expr(s.offset, n), s.level)
    if isinstance(s, A.StreamStore):
        return A.StreamStore(
            n.buf[s.buffer],
            _expr(s.offset, n),
            n.buf[s.src],
            _expr(s.src_offset, n),
            _expr(s.length, n),
            _expr(s.nontemporal, n),
        )
    raise TypeError(f"unknown statement {type(s).__name__}")


def _buffer(b: A.Buffer, n: _Names) -> A.Buffer:
    shape = tuple(_expr(d, n) for d in b.shape)
    return A.Buffer(n.buf[b.name], b.dtype, shape, b.scope, b.nan_insensitive)


def canonical_kernel(k: A.Kernel, name: str = "kernel") -> A.Kernel:
    """A copy of ``k`` with every name replaced by its canonical one (see the module
    docstring), called ``name``."""
    n = _collect(k)
    return A.Kernel(
        name,
        [_buffer(b, n) for b in k.inputs],
        [_buffer(b, n) for b in k.outputs],
        [n.var[d] for d in k.dims],
        [_stmt(s, n) for s in k.body],
        [_buffer(b, n) for b in k.temps],
    )


def canonical_lowered(lowered: LoweredKernel) -> LoweredKernel:
    """``lowered`` with its kernel in canonical form (keeping the kernel's own name, so
    the native code is named as before) and its dim arguments renamed to match."""
    n = _collect(lowered.kernel)
    kernel = canonical_kernel(lowered.kernel, lowered.kernel.name)
    dims = {n.var[name]: dim for name, dim in lowered.dim_exprs.items()}
    return dataclasses.replace(lowered, kernel=kernel, dim_exprs=dims)


def kernel_key(k: A.Kernel) -> str:
    """The key of kernel ``k`` (a lowered kernel, before any schedule): a hash of its
    canonical form's text."""
    text = A.format_kernel(canonical_kernel(k))
    digest = hashlib.sha256(f"geode-kernel-key-{KEY_VERSION}\n{text}".encode())
    return digest.hexdigest()[:KEY_CHARS]
