"""Statements of the loop AST -> IR: loops, blocks, stores, registers, temporaries,
min/max NaN guards, prefetches and streaming stores.

:class:`StmtWriter` is the kernel emitter's statement half (it builds on
:class:`~geode.codegen.backends.llvm.expr.ExprWriter`). Rules it follows:

- ``For``: a canonical counted loop (guard, ``phi`` induction variable, latch with
  ``llvm.loop`` metadata: ``mustprogress``, and for a *vectorized* loop
  ``llvm.loop.vectorize.enable`` plus its interleave count). A loop with a constant
  extent is unrolled (its body repeated with the variable a constant) when it is
  *unrolled* (at most :data:`MAX_UNROLL`) or indexes a multi-element register buffer
  (at most :data:`MAX_REGISTER_UNROLL`), so register arrays become scalars that SLP
  vectorization packs. An outermost parallel loop is outlined and run on the thread
  pool (:mod:`geode.codegen.backends.llvm.parallel`).
- ``Block``: bindings that fold to a constant or a variable are substituted, others
  are computed once; a ``predicate`` guards the body. A loop holding nothing but one
  block whose predicate does not depend on it is emitted inside that predicate instead
  (:func:`hoist_predicate`): the guard of a non-dividing outer split (a two-step
  reduction's runs) is tested once per run, and the loop stays vectorizable. A guard
  ``var + c < e`` on the loop's own variable becomes the loop's bound
  (:func:`narrow_to_predicate`): a tile of a dim it does not divide.
- Buffers: arguments by pointer (float16 as ``half``, bool as ``i8``); registers and
  local temporaries as stack arrays (SROA turns constant-indexed registers into SSA
  values), or ``malloc``'d when larger than :data:`STACK_LIMIT` bytes or of a size
  known only at run time.
- ``R = max(R, v)`` on a scalar float register that only such updates touch
  (:func:`~geode.codegen.backends.llvm.analysis.guarded_registers`) is ``maxnum nnan``
  (plain ``vmaxps``) plus an integer NaN guard checked after the loop, which restores
  np.max's NaN result exactly (a NaN-insensitive reduction just freezes its value).
"""

from __future__ import annotations

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
    Prefetch,
    Select,
    Stmt,
    Store,
    StreamStore,
    Var,
    free_vars,
    substitute,
    walk,
    walk_stmts,
)
from geode.codegen.backends.llvm import dtypes as D
from geode.codegen.backends.llvm.analysis import (
    NAN_GUARD,
    fold_consts,
    fold_int,
    indexes_register,
    minmax_update,
    static_size,
)
from geode.codegen.backends.llvm.expr import ExprWriter
from geode.codegen.backends.llvm.irtext import float_literal
from geode.codegen.backends.llvm.values import V
from geode.codegen.backends.patterns import flat_index, scaled_stage
from geode.errors import CodegenError

__all__ = [
    "MAX_REGISTER_UNROLL",
    "MAX_UNROLL",
    "STACK_LIMIT",
    "StmtWriter",
    "masked_operand",
    "one_vector_innermost",
]

#: an ``unrolled`` loop with a constant extent up to this is unrolled
MAX_UNROLL = 256
#: a loop indexing a register array with a constant extent up to this is unrolled
MAX_REGISTER_UNROLL = 64
#: a short vectorized reduction loop whose trip count is a multiple of this many
#: elements is left to LLVM's unroller (see :meth:`StmtWriter.short_vector_loop`)
WHOLE_VECTORS = 16
#: temporaries up to this many bytes live on the stack, larger ones are malloc'd
STACK_LIMIT = 64 * 1024
_TYPE_BYTES = {"i8": 1, "i16": 2, "i32": 4, "i64": 8, "float": 4, "double": 8}


class StmtWriter(ExprWriter):
    """Statement emission (state is set up by the kernel emitter)."""

    bufs: dict[str, Buffer]
    roles: dict[str, str]
    dtypes: dict[str, str]
    #: buffer name -> pointer operand in the function being written
    ptrs: dict[str, str]
    #: guarded register -> its NaN guard's pointer in the function being written
    guards: dict[str, str]
    guarded: set[str]
    quiet: set[str]
    #: per loop being written: the guarded registers it updates (None: exact updates)
    guard_frames: list[list[str] | None]
    #: ``id`` of vectorized loops LLVM must not fully unroll (see :meth:`loop_meta`)
    rolled: set[int]
    #: stores written as non-temporal stores in the body being written
    nt_on: set[int]
    #: functions' pending ``free`` calls (pointers malloc'd at function level)
    frees: list[str]
    alloc_site: dict[str, int | None]
    #: a streaming store ran outside a parallel chunk: fence before returning
    fence_at_end: bool
    in_parallel: bool
    kernel_name: str

    def where(self) -> str:
        return f"kernel {self.kernel_name!r}"

    def scope(self, name: str) -> str:
        return "global" if self.roles[name] != "temp" else self.bufs[name].scope

    # -- addressing --------------------------------------------------------------------
    def element_ptr(self, name: str, indices: tuple[Expr, ...]) -> tuple[str, str]:
        """Pointer to element ``indices`` (folded) of buffer ``name`` and the IR type of
        the element in memory."""
        b = self.bufs[name]
        if len(indices) != len(b.shape):
            raise CodegenError(
                f"{self.where()}: buffer {name!r} has rank {len(b.shape)} but is "
                f"indexed with {len(indices)} indices"
            )
        if name not in self.ptrs:
            raise CodegenError(f"{self.where()}: buffer {name!r} is not available here")
        dt = self.dtypes[name]
        ty = D.memory_type(dt) if self.scope(name) == "global" else D.temp_type(dt)
        base = self.ptrs[name]
        if not indices:
            return base, ty
        shape = tuple(self.fold(d) for d in b.shape)
        flat = fold_int_expr(flat_index(indices, shape))
        off = self.as_int64(self.ex(flat), self.where())
        if off == "0":
            return base, ty
        return self.fn.value(f"getelementptr inbounds {ty}, ptr {base}, i64 {off}"), ty

    def load(self, e: Load) -> V:
        if e.buffer not in self.bufs:
            raise CodegenError(f"{self.where()}: load of unknown buffer {e.buffer!r}")
        dt = self.dtypes[e.buffer]
        ptr, ty = self.element_ptr(e.buffer, e.indices)
        v = self.fn.value(f"load {ty}, ptr {ptr}")
        if ty == "half":
            return V(self.fn.value(f"fpext half {v} to float"), dt)
        if dt == "bool":
            return V(self.fn.value(f"icmp ne i8 {v}, 0"), dt)
        return V(v, dt)

    def store_value(self, name: str, indices: tuple[Expr, ...], value: V, nt: bool = False) -> None:
        """Store ``value`` to element ``indices`` (folded) of ``name``, converted to its
        dtype (a float16 argument rounds a float value once, from its own precision)."""
        dt = self.dtypes[name]
        ptr, ty = self.element_ptr(name, indices)
        if ty == "half":
            if not D.is_float(value.dtype):
                value = self.convert(value, "float16")
            ref = self.round_half(value.ref, D.value_type(value.dtype))
        else:
            v = self.convert(value, dt)
            ref = v.ref
            if dt == "bool":
                ref = self.fn.value(f"zext i1 {ref} to i8")
        tail = ""
        if nt:
            meta = self.module.metadata("i32 1")
            tail = f", align {self.target.stream_vector_bytes}, !nontemporal {meta}"
        self.fn.add(f"store {ty} {ref}, ptr {ptr}{tail}")

    # -- statements --------------------------------------------------------------------
    def stmts(self, body: list[Stmt]) -> None:
        i = 0
        while i < len(body):
            if i + 1 < len(body) and self.scaled_stream(body[i], body[i + 1]):
                i += 2
                continue
            self.stmt(body[i])
            i += 1

    def stmt(self, s: Stmt) -> None:
        if isinstance(s, For):
            self.for_(s)
        elif isinstance(s, Block):
            self.block(s)
        elif isinstance(s, If):
            self.if_(self.convert(self.value(s.cond), "bool"), s.body)
        elif isinstance(s, Store):
            self.store(s)
        elif isinstance(s, Prefetch):
            self.prefetch(s)
        elif isinstance(s, StreamStore):
            self.stream_store(s)
        else:
            raise CodegenError(f"{self.where()}: unknown statement {type(s).__name__}")

    def if_(self, cond: V, body: list[Stmt]) -> None:
        if cond.literal is not None:
            if cond.literal:
                self.stmts(body)
            return
        f = self.fn
        then, done = f.label("then"), f.label("endif")
        f.cond_br(cond.ref, then, done)
        f.start_block(then)
        self.stmts(body)
        f.br(done)
        f.start_block(done)

    def block(self, s: Block) -> None:
        if len(s.iter_vars) != len(s.bindings):
            raise CodegenError(
                f"{self.where()}: block {s.name!r} binds {len(s.bindings)} "
                f"expressions to {len(s.iter_vars)} iteration variables"
            )
        saved = self.env
        inner = dict(saved)
        for iv, bind in zip(s.iter_vars, s.bindings):
            e = self.fold(bind)
            if isinstance(e, (Const, Var)):
                inner[iv.name] = e
                continue
            v = self.ex(e)
            ref = self.as_int64(v, self.where())
            if self.is_index(e):
                self.index_ir.add(ref)
            inner[iv.name] = Var(ref) if ref.startswith("%") else Const(int(ref))
        self.env = inner
        try:
            if s.predicate is not None:
                self.if_(self.convert(self.value(s.predicate), "bool"), s.body)
            else:
                self.stmts(s.body)
        finally:
            self.env = saved

    # -- loops -------------------------------------------------------------------------
    def for_(self, s: For) -> None:
        ext = self.fold(s.extent)
        n = fold_int(ext)
        if s.kind is ForKind.PARALLEL and self.parallel and not self.in_parallel:
            self.parallel_loop(s)
            return
        regs = {
            name
            for name, b in self.bufs.items()
            if self.roles[name] == "temp" and b.scope == "register" and static_size(b) != 1
        }
        narrowed = None if indexes_register(s, regs) else narrow_to_predicate(s)
        if narrowed is not None:
            s = narrowed
            ext = self.fold(s.extent)
            n = fold_int(ext)
        hoisted = hoist_predicate(s)
        if hoisted is not None:
            pred, loop = hoisted
            self.if_(self.convert(self.value(pred), "bool"), [loop])
            return
        unroll = (
            n is not None
            and not self.holds_nt(s)
            and (
                (s.kind is ForKind.UNROLLED and n <= MAX_UNROLL)
                or (
                    s.kind is not ForKind.PARALLEL
                    and n <= MAX_REGISTER_UNROLL
                    and indexes_register(s, regs)
                )
            )
        )
        self.guard_frames.append([])
        try:
            if unroll:
                assert n is not None
                saved = self.env
                for k in range(n):
                    self.env = {**saved, s.var: Const(k)}
                    self.stmts(s.body)
                self.env = saved
            else:
                v = self.ex(ext)
                if not D.is_int(v.dtype):
                    raise CodegenError(
                        f"{self.where()}: loop {s.var!r} has extent of dtype {v.dtype}"
                    )
                hi = self.as_int64(v, self.where())
                if s.kind is ForKind.SERIAL:
                    self.rolled.update(id(x) for x in s.body if self.short_vector_loop(x))
                self.counted_loop("0", hi, s.var, self.loop_meta(s), lambda: self.stmts(s.body))
        finally:
            frame = self.guard_frames.pop()
        for name in frame or []:
            self.check_guard(name)

    def short_vector_loop(self, s: Stmt) -> bool:
        """Whether ``s`` is a vectorized reduction loop (a block inside reduces along it)
        of a constant trip count LLVM may unroll fully (at most :data:`MAX_UNROLL`) and
        not a multiple of :data:`WHOLE_VECTORS` (whole vectors unroll into clean vector
        code; a remainder is what sends LLVM to vectorizing the row loop instead), or
        exactly one vector: LLVM unrolls a loop that short before its loop vectorizer sees
        it, and SLP vectorizes the straight-line code only in part (RMSNorm over rows of
        16 8x slower, LayerNorm 2.7x; ``docs/performance.md``). Also any innermost serial
        or vectorized loop of exactly one vector (:func:`one_vector_innermost`)."""
        if not isinstance(s, For):
            return False
        if one_vector_innermost(s):
            return True
        if s.kind is not ForKind.VECTORIZED:
            return False
        n = fold_int(self.fold(s.extent))
        if n is None or n > MAX_UNROLL or (n % WHOLE_VECTORS == 0 and n != WHOLE_VECTORS):
            return False
        return any(
            isinstance(b, Block)
            and any(
                iv.kind == "reduce" and isinstance(x, Var) and x.name == s.var
                for iv, x in zip(b.iter_vars, b.bindings)
            )
            for b in walk_stmts(s.body)
        )

    def loop_meta(self, s: For) -> str:
        """``!llvm.loop`` metadata for loop ``s``."""
        m = self.module
        parts = ["SELF", m.metadata('!"llvm.loop.mustprogress"')]
        # LLVM's cost model decides whether to vectorize (forcing it warns on stderr for
        # loops it cannot vectorize); a vectorized loop's interleave count is kept
        if s.kind is ForKind.VECTORIZED and s.interleave > 1:
            parts.append(m.metadata(f'!"llvm.loop.interleave.count", i32 {s.interleave}'))
        # a vectorized reduction loop with a short constant trip count directly in a
        # serial loop or a parallel chunk (rows of 49 or 56 elements), or any innermost
        # loop of one vector there, is fully unrolled by LLVM, which then vectorizes the
        # loop over rows instead, with gathers (17x slower on rows of 56;
        # bench/stitch.py): keep it a loop
        if id(s) in self.rolled:
            parts.append(m.metadata('!"llvm.loop.unroll.disable"'))
        return m.metadata(", ".join(parts), distinct=True)

    def counted_loop(self, lo: str, hi: str, var: str, meta: str, body, bind: bool = True) -> str:
        """``for var in range(lo, hi): body()`` (``lo``/``hi`` i64 operands); the AST
        variable ``var`` is bound to the induction variable while ``body`` runs. Returns
        the induction variable's name."""
        f = self.fn
        head, loop, latch, done = (
            f.label(x) for x in (f"{var}.pre", var, f"{var}.latch", f"{var}.end")
        )
        f.br(head)
        f.start_block(head)
        enter = f.value(f"icmp slt i64 {lo}, {hi}")
        f.cond_br(enter, loop, done)
        f.start_block(loop)
        iv = f.fresh(var)
        nxt = f.fresh(var + ".next")
        f.add(f"{iv} = phi i64 [ {lo}, %{head} ], [ {nxt}, %{latch} ]")
        self.index_ir.add(iv)
        saved = self.env
        if bind:
            self.env = {**saved, var: Var(iv)}
        try:
            body()
        finally:
            self.env = saved
        f.br(latch)
        f.start_block(latch)
        f.add(f"{nxt} = add nuw nsw i64 {iv}, 1")
        again = f.value(f"icmp slt i64 {nxt}, {hi}")
        f.terminate(f"br i1 {again}, label %{loop}, label %{done}, !llvm.loop {meta}")
        f.start_block(done)
        return iv

    def holds_nt(self, s: For) -> bool:
        """Whether loop ``s`` holds a store written as a streaming store."""
        return bool(self.nt_on) and any(id(x) in self.nt_on for x in walk_stmts(s.body))

    # -- stores ------------------------------------------------------------------------
    def store(self, s: Store) -> None:
        if s.buffer not in self.bufs:
            raise CodegenError(f"{self.where()}: store to unknown buffer {s.buffer!r}")
        if self.roles[s.buffer] == "input":
            raise CodegenError(f"{self.where()}: store to input buffer {s.buffer!r}")
        indices = tuple(self.fold(i) for i in s.indices)
        if s.buffer in self.guarded:
            self.guarded_store(s, indices)
            return
        value = self.value(s.value)
        self.store_value(s.buffer, indices, value, nt=id(s) in self.nt_on)
        if id(s) in self.nt_on and not self.in_parallel:
            self.fence_at_end = True

    def guarded_store(self, s: Store, indices: tuple[Expr, ...]) -> None:
        """A store to a guarded register (see the module docstring)."""
        dt = self.dtypes[s.buffer]
        ty = D.value_type(dt)
        upd = minmax_update(s)
        frame = self.guard_frames[-1] if self.guard_frames else None
        f = self.fn
        if upd and frame is not None and s.buffer in self.guards:
            op, other = upd
            v = self.convert(self.value(other), dt)
            ptr, _ = self.element_ptr(s.buffer, indices)
            cur = f.value(f"load {ty}, ptr {ptr}")
            callee = self.intrinsic(op + "num", ty, [ty, ty])
            arg = f.value(f"freeze {ty} {v.ref}") if masked_operand(other) else v.ref
            r = f.value(f"call nnan nsz {ty} {callee}({ty} {cur}, {ty} {arg})")
            f.add(f"store {ty} {r}, ptr {ptr}")
            if s.buffer not in self.quiet:
                ity, _ = NAN_GUARD[dt]
                it = D.value_type(ity)
                gptr = self.guards[s.buffer]
                g = f.value(f"load {it}, ptr {gptr}")
                bits = f.value(f"bitcast {ty} {v.ref} to {it}")
                mask = (1 << (D.bits(ity) - 1)) - 1
                ab = f.value(f"and {it} {bits}, {mask}")
                umax = self.intrinsic("umax", it, [it, it])
                f.add(f"store {it} {f.value(f'call {it} {umax}({it} {g}, {it} {ab})')}, ptr {gptr}")
            if s.buffer not in frame:
                frame.append(s.buffer)
            return
        self.store_value(s.buffer, indices, self.value(s.value))
        if not upd and s.buffer in self.guards and s.buffer not in self.quiet:
            ity, _ = NAN_GUARD[dt]
            self.fn.add(f"store {D.value_type(ity)} 0, ptr {self.guards[s.buffer]}")

    def check_guard(self, name: str) -> None:
        """After a loop updating guarded register ``name``: NaN if any update saw one (a
        NaN-insensitive register's value is frozen instead)."""
        dt = self.dtypes[name]
        ty = D.value_type(dt)
        f = self.fn
        ptr = self.ptrs[name]
        r = f.value(f"load {ty}, ptr {ptr}")
        if name in self.quiet:
            if self.target.is_x86:
                frozen = f.value(f'call {ty} asm "", "=x,0"({ty} {r})')
            else:
                frozen = f.value(f"freeze {ty} {r}")
            f.add(f"store {ty} {frozen}, ptr {ptr}")
            return
        ity, inf_bits = NAN_GUARD[dt]
        it = D.value_type(ity)
        g = f.value(f"load {it}, ptr {self.guards[name]}")
        bad = f.value(f"icmp ugt {it} {g}, {inf_bits}")
        nan = float_literal(float("nan"), ty)
        f.add(f"store {ty} {f.value(f'select i1 {bad}, {ty} {nan}, {ty} {r}')}, ptr {ptr}")

    # -- prefetch and streams ----------------------------------------------------------
    def prefetch(self, s: Prefetch) -> None:
        if s.buffer not in self.bufs or self.scope(s.buffer) != "global":
            raise CodegenError(f"{self.where()}: prefetch of non-argument {s.buffer!r}")
        if s.level not in (1, 2):
            raise CodegenError(f"{self.where()}: prefetch to cache level {s.level!r}")
        off = self.index(s.offset)
        ty = D.memory_type(self.dtypes[s.buffer])
        p = self.fn.value(f"getelementptr {ty}, ptr {self.ptrs[s.buffer]}, i64 {off}")
        callee = self.module.declare(
            "llvm.prefetch.p0", "declare void @llvm.prefetch.p0(ptr, i32, i32, i32)"
        )
        locality = 3 if s.level == 1 else 2
        self.fn.add(f"call void {callee}(ptr {p}, i32 0, i32 {locality}, i32 1)")

    def stream_store(self, s: StreamStore) -> None:
        for name, want in ((s.buffer, "output"), (s.src, "local")):
            if name not in self.bufs:
                raise CodegenError(f"{self.where()}: stream of unknown buffer {name!r}")
            role = self.roles.get(name) if want == "output" else self.scope(name)
            if role != want:
                raise CodegenError(f"{self.where()}: stream needs a {want} buffer, {name!r} is not")
        if self.dtypes[s.buffer] != self.dtypes[s.src] or self.dtypes[s.src] == "float16":
            raise CodegenError(
                f"{self.where()}: stream from {s.src!r} to {s.buffer!r} needs one dtype "
                f"other than float16"
            )
        self.emit_stream(s, None)

    def emit_stream(self, s: StreamStore, factor: str | None, divide: bool = False) -> None:
        """Copy stream ``s``; each element multiplied by ``factor`` when given (divided by
        it with ``divide``)."""
        from geode.codegen.backends.llvm.streams import stream_function

        dt = self.dtypes[s.buffer]
        ty = D.value_type(dt)
        off, soff, n = (self.index(e) for e in (s.offset, s.src_offset, s.length))
        nt = self.convert(self.value(s.nontemporal), "bool").ref
        name, text, decls = stream_function(dt, factor is not None, self.target, divide)
        self.module.add_global(name, text)
        for d in decls:
            self.module.declare(d.split("@")[1].split("(")[0], d)
        f = self.fn
        dst = f.value(f"getelementptr {ty}, ptr {self.ptrs[s.buffer]}, i64 {off}")
        src = f.value(f"getelementptr {ty}, ptr {self.ptrs[s.src]}, i64 {soff}")
        extra = "" if factor is None else f", {ty} {factor}"
        f.add(f'call void @"{name}"(ptr {dst}, ptr {src}, i64 {n}, i1 {nt}{extra})')
        if not self.in_parallel:
            self.fence_at_end = True
        self.streamed = True

    streamed: bool

    def scaled_stream(self, loop: Stmt, ss: Stmt) -> bool:
        """A staging loop and its stream as one scaled stream (softmax's ``e / sum``):
        the products go from registers to the output (see
        :func:`~geode.codegen.backends.patterns.scaled_stage`). Returns whether it did."""
        m = scaled_stage(loop, ss)
        if m is None:
            return False
        assert isinstance(loop, For) and isinstance(ss, StreamStore)
        load, scale, divide = m
        names = (ss.buffer, ss.src, load.buffer)
        if not all(x in self.bufs for x in names) or self.roles.get(ss.buffer) != "output":
            return False
        if self.scope(ss.src) != "local" or self.scope(load.buffer) != "local":
            return False
        dt = self.dtypes[ss.buffer]
        if dt not in ("float32", "float64") or any(self.dtypes[x] != dt for x in names):
            return False
        n = fold_int(self.fold(loop.extent))
        if (
            n is None
            or n != fold_int(self.fold(ss.length))
            or fold_int(self.fold(ss.src_offset)) != 0
        ):
            return False
        scale_e = self.fold(scale)
        sv = self.ex(scale_e)
        if D.promote(dt, False, sv.dtype, isinstance(scale_e, Const) and sv.dtype in D.WEAK) != dt:
            return False
        scale_dtype = sv.dtype
        sv = self.convert(sv, dt)
        ty = D.value_type(dt)
        ref = sv.ref
        # a division by a divisor whose reciprocal may overflow (a subnormal sum) stays one
        divided = divide and "arcp" not in self.division_flags(scale_e, scale_dtype, dt)
        if divide and not divided:
            ref = self.fn.value(f"fdiv {self.flags} {ty} {float_literal(1.0, ty)}, {ref}")
        start = [substitute(x, {loop.var: Const(0)}) for x in load.indices]
        src_off = flat_index(start, self.bufs[load.buffer].shape)
        direct = StreamStore(ss.buffer, ss.offset, load.buffer, src_off, Const(n), ss.nontemporal)
        self.emit_stream(direct, ref, divided)
        return True

    # -- temporaries -------------------------------------------------------------------
    def allocate(self, site: int | None, per_iteration: bool = False) -> list[str]:
        """Allocate the temporaries of ``site`` in the function being written; returns the
        malloc'd pointers the caller must free (at the end of the site's extent)."""
        out: list[str] = []
        for name, at in self.alloc_site.items():
            if at != site:
                continue
            if per_iteration != self.depends_on_site_var(name):
                continue
            b = self.bufs[name]
            ty = D.temp_type(self.dtypes[name])
            size = static_size(b)
            item = _TYPE_BYTES[ty]
            if size is not None and size * item <= STACK_LIMIT:
                self.ptrs[name] = self.fn.alloca(f"[{max(size, 1)} x {ty}]", name, align=64)
            else:
                if b.scope == "register":
                    raise CodegenError(
                        f"{self.where()}: register {name!r} has no small static size"
                    )
                count = "1"
                for d in b.shape:
                    count = self.fn.value(f"mul i64 {count}, {self.index(d)}")
                nbytes = self.fn.value(f"mul i64 {count}, {item}")
                nbytes = self.fn.value(f"add i64 {nbytes}, 64")  # malloc(0) may return NULL
                malloc = self.module.declare("malloc", "declare noalias ptr @malloc(i64) nounwind")
                self.ptrs[name] = self.fn.value(f"call ptr {malloc}(i64 {nbytes})", name)
                out.append(self.ptrs[name])
            if name in self.guarded:
                ity, _ = NAN_GUARD[self.dtypes[name]]
                self.guards[name] = self.fn.alloca(D.value_type(ity), name + ".nan")
                self.fn.add(f"store {D.value_type(ity)} 0, ptr {self.guards[name]}")
        return out

    site_var: str | None

    def depends_on_site_var(self, name: str) -> bool:
        """Whether temp ``name``'s shape uses the variable of the parallel loop being
        outlined (then it is allocated per iteration)."""
        if self.site_var is None:
            return False
        return any(self.site_var in free_vars(d) for d in self.bufs[name].shape)

    def free_all(self, ptrs: list[str]) -> None:
        if not ptrs:
            return
        free = self.module.declare("free", "declare void @free(ptr) nounwind")
        for p in ptrs:
            self.fn.add(f"call void {free}(ptr {p})")

    def sfence(self) -> None:
        """Order this thread's non-temporal stores before its later stores."""
        if self.target.is_x86:
            callee = self.module.declare(
                "llvm.x86.sse.sfence", "declare void @llvm.x86.sse.sfence() nounwind"
            )
            self.fn.add(f"call void {callee}()")
        else:
            self.fn.add("fence seq_cst")


def one_vector_innermost(s: For) -> bool:
    """Whether ``s`` is a serial or vectorized loop of exactly :data:`WHOLE_VECTORS`
    iterations (a constant extent, not one known only from the enclosing loops'
    variables) holding no loop. LLVM unrolls such a loop fully before its loop
    vectorizer runs and then vectorizes the loop around it instead, with gathers and
    scatters at a stride of one vector (a GPT-2 block's residual Add and
    column mean over ``[batch, seq, 16]``: 3.4x slower, and twice LLVM's time); kept a
    loop, it becomes one vector operation."""
    if s.kind not in (ForKind.SERIAL, ForKind.VECTORIZED):
        return False
    if fold_int(fold_consts(s.extent)) != WHOLE_VECTORS:
        return False
    return not any(isinstance(x, For) for x in walk_stmts(s.body))


def fold_int_expr(e: Expr) -> Expr:
    """Constant-fold an index expression (a flat index over constant shapes)."""
    from geode.codegen.backends.llvm.analysis import fold_consts

    return fold_consts(e)


def hoist_predicate(s: For) -> tuple[Expr, For] | None:
    """For a serial, vectorized or unrolled loop whose body is one block with a predicate
    that uses neither the loop variable nor the block's iteration variables: the
    predicate and the loop with the block unguarded (testing it once before the loop
    means the same); None otherwise."""
    if s.kind is ForKind.PARALLEL or len(s.body) != 1 or not isinstance(s.body[0], Block):
        return None
    b = s.body[0]
    if b.predicate is None:
        return None
    used = free_vars(b.predicate)
    if s.var in used or used & {iv.name for iv in b.iter_vars}:
        return None
    inner = Block(b.name, b.iter_vars, b.bindings, b.body, None, b.reduce_of)
    return b.predicate, For(s.var, s.extent, [inner], s.kind, s.interleave)


def narrow_to_predicate(s: For) -> For | None:
    """For a serial or vectorized loop whose body is one block guarded by ``var + c < e``
    (``var`` the loop's variable; ``c`` and ``e`` free of it; other conjuncts of the
    guard free of it too): the loop over ``[0, min(extent, e - c))`` with that conjunct
    dropped (the others stay, for :func:`hoist_predicate`); None otherwise.

    A tile's guard where a symbolic dim does not divide into tiles of the innermost
    loop is of this form (``t * 32 + i < seq``): tested per iteration it makes LLVM
    predicate the vectorized loop into masked operations, slow to run and, for a
    transposing copy, hundreds of milliseconds to compile; as the loop's bound it is a
    plain vector loop and a remainder. Before and after::

        vectorized for (i, 0, 32)                vectorized for (i, 0, min(32, seq - t * 32))
          ScheduleBlock(B)                         ScheduleBlock(B)
            predicate = t * 32 + i < seq             out[t * 32 + i] = ...
            out[t * 32 + i] = ...
    """
    if s.kind not in (ForKind.SERIAL, ForKind.VECTORIZED) or len(s.body) != 1:
        return None
    b = s.body[0]
    if not isinstance(b, Block) or b.predicate is None:
        return None
    if {iv.name for iv in b.iter_vars} & free_vars(b.predicate):
        return None
    bound, rest = None, []
    for conj in _conjuncts(b.predicate):
        if s.var not in free_vars(conj):
            rest.append(conj)
            continue
        limit = _upper_limit(conj, s.var)
        if limit is None or bound is not None:
            return None
        bound = limit
    if bound is None:
        return None
    pred = None
    for conj in rest:
        pred = conj if pred is None else Bin("and", pred, conj)
    inner = Block(b.name, b.iter_vars, b.bindings, b.body, pred, b.reduce_of)
    extent = Bin("max", Const(0), Bin("min", s.extent, bound))
    return For(s.var, extent, [inner], s.kind, s.interleave)


def _conjuncts(e: Expr) -> list[Expr]:
    if isinstance(e, Bin) and e.op == "and":
        return _conjuncts(e.a) + _conjuncts(e.b)
    return [e]


def _upper_limit(cond: Expr, var: str) -> Expr | None:
    """``e - c`` when ``cond`` is ``var + c < e`` (or ``<= e``: ``e - c + 1``) with ``c``
    and ``e`` free of ``var``, else None."""
    from geode.codegen.indexing import exprs_equal

    if not isinstance(cond, Bin) or cond.op not in ("<", "<="):
        return None
    lhs, rhs = cond.a, cond.b
    if var in free_vars(rhs):
        return None
    c = substitute(lhs, {var: Const(0)})
    if var in free_vars(c) or not exprs_equal(lhs, Bin("+", Var(var), c)):
        return None
    limit = Bin("-", rhs, c)
    return Bin("+", limit, Const(1)) if cond.op == "<=" else limit


def masked_operand(e: Expr) -> bool:
    """Whether a guarded ``R = max(R, v)`` update's ``v`` holds a select (a masked
    score, ``where(m, -inf, x)``). Its value is then frozen before the ``maxnum``: LLVM
    would otherwise fold the select's ``-inf`` arm (the max's identity, under ``nnan``)
    into ``R = m ? R : maxnum(R, x)``, a conditional reduction its loop vectorizer leaves
    scalar (a causal softmax's max pass ran one element at a time). ``freeze`` of a
    defined value is that value: the same bits."""
    return any(isinstance(x, Select) for x in walk(e))
