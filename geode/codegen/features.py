"""Features of a scheduled loop AST for the projected cost model.

:func:`kernel_features` walks a scheduled :class:`~geode.codegen.ast.Kernel` with its
dims bound to numbers and counts what the projected model
(:mod:`geode.costmodel.projected`) needs: the bytes every argument moves (its
footprint once, the rest as re-reads; split by the level of the memory hierarchy its
working set lives in; accesses that stride along the innermost loop, a cache line
each), the operations every element evaluates by kind (simple, division,
transcendental) and whether a vector loop runs them (not when the statement gathers
strided elements), the parallel loop's extent, and the trips and entries of
every loop. Counting follows the loop nest: a statement counts once per iteration
of the loops around it; inside one statement a repeated sub-expression counts once
(the backend computes it once); a load that does not depend on the innermost loop
counts once per entry of that loop (the backend hoists it). Conditions are taken as
true and an extent that depends on an outer loop is taken at that loop's midpoint.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from geode.codegen import ast as A
from geode.costmodel.device import DeviceSpec
from geode.costmodel.projected import ScheduleFeatures
from geode.errors import GeodeError

#: unary functions that cost a vector math routine (tens of instructions)
TRANSCENDENTAL = frozenset(
    {
        "exp",
        "log",
        "log1p",
        "sin",
        "cos",
        "tan",
        "asin",
        "acos",
        "atan",
        "sinh",
        "cosh",
        "tanh",
        "asinh",
        "acosh",
        "atanh",
        "erf",
        "sigmoid",
    }
)
#: operations on the divider's slow pipe
DIVIDES = frozenset({"/", "//", "%", "fmod", "sqrt"})

#: bytes of a cache line (what a strided access moves)
LINE_BYTES = 64

#: what an extent is taken as when it cannot be evaluated (a dim not in the environment)
NOMINAL_EXTENT = 512


class FeatureError(GeodeError):
    """A kernel's features cannot be computed (a dim missing from the environment)."""


@dataclass
class _Counts:
    flops: dict[bool, float] = field(default_factory=lambda: {True: 0.0, False: 0.0})
    div: dict[bool, float] = field(default_factory=lambda: {True: 0.0, False: 0.0})
    trans: dict[bool, float] = field(default_factory=lambda: {True: 0.0, False: 0.0})
    access: dict[str, float] = field(default_factory=dict)  # global buffer -> bytes accessed
    local_bytes: float = 0.0
    strided_bytes: float = 0.0
    nontemporal_bytes: float = 0.0
    loop_iters: float = 0.0
    loop_entries: float = 0.0
    prefetches: float = 0.0
    parallel_extent: int = 1
    parallel_regions: float = 0.0


@dataclass
class _Loop:
    """The innermost loop around a statement: its variable, extent and kind."""

    var: str
    extent: float
    vector: bool


class _Walker:
    def __init__(self, kernel: A.Kernel, env: Mapping[str, int], lanes: int):
        self.kernel = kernel
        self.lanes = lanes
        self.values: dict[str, float] = {k: float(v) for k, v in env.items()}
        self.globals = {b.name: b for b in kernel.inputs + kernel.outputs}
        self.scopes = {b.name: b.scope for b in kernel.temps}
        self.items = {b.name: np.dtype(b.dtype).itemsize for b in kernel.inputs + kernel.outputs}
        self.items.update({b.name: np.dtype(b.dtype).itemsize for b in kernel.temps})
        self.c = _Counts()

    def value(self, e: A.Expr) -> float:
        """An index expression's value (loop variables at their midpoints)."""
        v = _evaluate(e, self.values)
        return float(NOMINAL_EXTENT) if v is None else max(0.0, v)

    def stmts(self, body: list[A.Stmt], mult: float, loop: _Loop | None, bind: dict) -> None:
        for s in body:
            self.stmt(s, mult, loop, bind)

    def stmt(self, s: A.Stmt, mult: float, loop: _Loop | None, bind: dict) -> None:
        c = self.c
        if isinstance(s, A.For):
            ext = self.value(s.extent)
            c.loop_entries += mult
            vector = s.kind is A.ForKind.VECTORIZED
            if s.kind is A.ForKind.PARALLEL and c.parallel_regions == 0:
                c.parallel_extent = max(1, int(ext))
            if s.kind is A.ForKind.PARALLEL:
                c.parallel_regions += mult
            c.loop_iters += mult * (math.ceil(ext / self.lanes) if vector else ext)
            saved = self.values.get(s.var)
            self.values[s.var] = (ext - 1) / 2
            self.stmts(s.body, mult * ext, _Loop(s.var, ext, vector), bind)
            if saved is None:
                self.values.pop(s.var, None)
            else:
                self.values[s.var] = saved
        elif isinstance(s, A.Block):
            inner = dict(bind)
            for iv, b in zip(s.iter_vars, s.bindings):
                inner[iv.name] = A.substitute(b, bind) if bind else b
            self.stmts(s.body, mult, loop, inner)
        elif isinstance(s, A.If):
            self.stmts(s.body, mult, loop, bind)
        elif isinstance(s, A.Store):
            self.store(s, mult, loop, bind)
        elif isinstance(s, A.StreamStore):
            n = self.value(s.length) * mult
            self.access(s.buffer, n * self.items.get(s.buffer, 4), None, None, bind)
            self.c.local_bytes += n * self.items.get(s.src, 4)
            if _evaluate(s.nontemporal, self.values) != 0:
                c.nontemporal_bytes += n * self.items.get(s.buffer, 4)
        elif isinstance(s, A.Prefetch):
            c.prefetches += mult

    def store(self, s: A.Store, mult: float, loop: _Loop | None, bind: dict) -> None:
        seen: set[A.Expr] = set()
        vector = loop is not None and loop.vector
        if vector and any(
            l.buffer in self.globals and l.indices and _strided(l.indices, loop.var, bind)
            for l in A.loads(s.value)
        ):
            vector = False  # a gather: the backend keeps such a loop's arithmetic scalar
        self.expr(s.value, mult, loop, bind, seen, vector)
        size = self.items.get(s.buffer, 4)
        self.access(s.buffer, mult * size, s.indices, loop, bind)
        if s.nontemporal is not None and _evaluate(s.nontemporal, self.values) != 0:
            self.c.nontemporal_bytes += mult * size

    def access(
        self, buf: str, nbytes: float, indices: tuple | None, loop: _Loop | None, bind: dict
    ) -> None:
        """Count ``nbytes`` of traffic to ``buf`` (strided when ``indices`` stride along
        the innermost ``loop``)."""
        if buf in self.globals:
            self.c.access[buf] = self.c.access.get(buf, 0.0) + nbytes
            if indices and loop is not None and _strided(indices, loop.var, bind):
                # every strided access touches a cache line of its own
                self.c.strided_bytes += nbytes / self.items.get(buf, 4) * LINE_BYTES
        elif self.scopes.get(buf) == "local":
            self.c.local_bytes += nbytes

    def expr(
        self,
        e: A.Expr,
        mult: float,
        loop: _Loop | None,
        bind: dict,
        seen: set[A.Expr],
        vector: bool,
    ) -> None:
        if e in seen or isinstance(e, A.Var | A.Const):
            return
        seen.add(e)
        c = self.c
        if isinstance(e, A.Load):
            m = mult
            if loop is not None and not _depends(e.indices, loop.var, bind):
                m = mult / max(loop.extent, 1.0)  # hoisted out of the innermost loop
            self.access(e.buffer, m * self.items.get(e.buffer, 4), e.indices, loop, bind)
            return
        if isinstance(e, A.Un):
            kind = c.trans if e.op in TRANSCENDENTAL else c.div if e.op in DIVIDES else c.flops
            kind[vector] += mult
        elif isinstance(e, A.Bin):
            kind = c.trans if e.op == "pow" else c.div if e.op in DIVIDES else c.flops
            kind[vector] += mult
        elif isinstance(e, A.Select | A.Cast):
            c.flops[vector] += mult
        for k in A.children(e):
            self.expr(k, mult, loop, bind, seen, vector)


def _depends(indices: tuple, var: str, bind: dict) -> bool:
    return any(var in _vars(i, bind) for i in indices)


def _vars(e: A.Expr, bind: dict) -> set[str]:
    out: set[str] = set()
    for name in A.free_vars(e):
        out |= A.free_vars(bind[name]) if name in bind else {name}
    return out


def _strided(indices: tuple, var: str, bind: dict) -> bool:
    """Whether an access walks memory with a stride along loop ``var``: an earlier
    index moves with it while the last does not."""
    if var in _vars(indices[-1], bind):
        return False
    return any(var in _vars(i, bind) for i in indices[:-1])


def _evaluate(e: A.Expr, values: Mapping[str, float]) -> float | None:
    """An index or condition expression's value, None when a variable is unknown."""
    if isinstance(e, A.Const):
        return float(e.value)
    if isinstance(e, A.Var):
        return values.get(e.name)
    if isinstance(e, A.Bin):
        a, b = _evaluate(e.a, values), _evaluate(e.b, values)
        if a is None or b is None:
            return None
        return _binary(e.op, a, b)
    if isinstance(e, A.Un) and e.op in ("neg", "not"):
        a = _evaluate(e.a, values)
        return None if a is None else (-a if e.op == "neg" else float(not a))
    if isinstance(e, A.Select):
        cond = _evaluate(e.cond, values)
        if cond is None:
            return None
        return _evaluate(e.t if cond else e.f, values)
    if isinstance(e, A.Cast):
        return _evaluate(e.a, values)
    return None


def _binary(op: str, a: float, b: float) -> float | None:
    table = {
        "+": lambda: a + b,
        "-": lambda: a - b,
        "*": lambda: a * b,
        "/": lambda: a / b if b else 0.0,
        "//": lambda: a // b if b else 0.0,
        "%": lambda: a % b if b else 0.0,
        "min": lambda: min(a, b),
        "max": lambda: max(a, b),
        "<": lambda: float(a < b),
        "<=": lambda: float(a <= b),
        ">": lambda: float(a > b),
        ">=": lambda: float(a >= b),
        "==": lambda: float(a == b),
        "!=": lambda: float(a != b),
        "and": lambda: float(bool(a) and bool(b)),
        "or": lambda: float(bool(a) or bool(b)),
    }
    fn = table.get(op)
    return None if fn is None else fn()


def vector_lanes(kernel: A.Kernel, vector_bits: int) -> int:
    """Elements per vector of the kernel's widest output dtype (float32 at 256 bits: 8)."""
    sizes = [np.dtype(b.dtype).itemsize for b in kernel.outputs] or [4]
    return max(1, vector_bits // (8 * max(sizes)))


def footprint(buf: A.Buffer, values: Mapping[str, float]) -> float:
    """Bytes of a buffer with its dims bound (an unknown dim at :data:`NOMINAL_EXTENT`)."""
    n = 1.0
    for d in buf.shape:
        v = _evaluate(d, values)
        n *= float(NOMINAL_EXTENT) if v is None else max(0.0, v)
    return n * np.dtype(buf.dtype).itemsize


def kernel_features(
    kernel: A.Kernel,
    env: Mapping[str, int] | None = None,
    *,
    spec: DeviceSpec,
    vector_bits: int = 256,
    threads: int = 0,
) -> ScheduleFeatures:
    """The projected model's features of a scheduled ``kernel`` with its dims bound by
    ``env`` (kernel dim name -> value; a dim missing from it raises
    :class:`FeatureError`), on ``spec``'s caches, for vectors of ``vector_bits`` and a
    run on ``threads`` threads (0: every core)."""
    env = dict(env or {})
    missing = [d for d in kernel.dims if d not in env]
    if missing:
        raise FeatureError(f"kernel {kernel.name}: no value for dims {missing}")
    w = _Walker(kernel, env, vector_lanes(kernel, vector_bits))
    w.stmts(kernel.body, 1.0, None, {})
    c = w.c
    values = {k: float(v) for k, v in env.items()}
    reads = sum(footprint(b, values) for b in kernel.inputs if b.name in c.access)
    writes = sum(footprint(b, values) for b in kernel.outputs if b.name in c.access)
    compulsory = reads + writes
    accessed = sum(c.access.values())
    in_cache = compulsory <= spec.l3_bytes
    return ScheduleFeatures(
        bytes_read=reads,
        bytes_written=writes,
        flops=sum(c.flops.values()) + sum(c.div.values()),
        transcendentals=sum(c.trans.values()),
        dram_bytes=0.0 if in_cache else compulsory,
        cache_bytes=compulsory if in_cache else 0.0,
        reuse_bytes=max(0.0, accessed - compulsory) + c.local_bytes,
        strided_bytes=c.strided_bytes,
        nontemporal_bytes=c.nontemporal_bytes,
        vec_flops=c.flops[True],
        scalar_flops=c.flops[False],
        vec_div=c.div[True],
        scalar_div=c.div[False],
        vec_trans=c.trans[True],
        scalar_trans=c.trans[False],
        lanes=w.lanes,
        parallel_extent=c.parallel_extent,
        parallel_regions=int(round(c.parallel_regions)),
        threads=int(threads),
        loop_iters=c.loop_iters,
        loop_entries=c.loop_entries,
        prefetches=c.prefetches,
    )
