"""Cache hints: prefetch_next, stream_output, stream_row, store_nontemporal."""

from __future__ import annotations

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
    Prefetch,
    Store,
    StreamStore,
    Var,
    add,
    expr_str,
    floordiv,
    free_vars,
    mul,
    prod,
    sub,
    substitute,
    transform_loads_of,
    walk_stmts,
)
from geode.codegen.ast import blocks as ast_blocks
from geode.codegen.indexing import (
    and_flags,
    exprs_equal,
    flatten_index,
    line_aligned,
    steps_along,
)
from geode.codegen.schedule.base import ScheduleBase
from geode.codegen.schedule.blocks import (
    accessed_buffers,
    in_loop_terms,
    is_flat_block,
    is_reduce,
    loop_accesses,
    map_stmt_exprs,
)
from geode.codegen.schedule.trace import primitive
from geode.errors import ScheduleError


class CacheHints(ScheduleBase):
    """Cache hints: prefetch_next, stream_output, stream_row, store_nontemporal."""

    @primitive
    def prefetch_next(
        self,
        loop: str,
        buffer: str,
        at_start: bool = False,
        spread: str | None = None,
        level: int = 1,
        distance: int = 1,
    ) -> str:
        """Prefetch, during each iteration of ``loop``, the slab of input ``buffer`` that the
        iteration ``distance`` ahead reads (1: the next one), one cache line at a time, to
        cache ``level`` (see :class:`~geode.codegen.ast.Prefetch`). Where:

        * by default, in one burst right after the first loop in ``loop``'s body (the
          first pass over a row has brought the current slab in; the hint overlaps
          fetching the next one with the remaining passes' arithmetic);
        * with ``at_start``, in one burst at the top of the body (a single pass: an
          elementwise row);
        * with ``spread``, a serial loop directly in ``loop``'s body (a pass, such as
          the chunk loop of a streamed output), spread over its iterations: each fetches
          its share of the slab's lines at the end of its body, so the fetches overlap
          that pass's stores instead of queueing up in one burst (the last iteration may
          run up to ``spread``'s extent lines past the slab: harmless).

        Returns the new prefetch loop's variable.

        Requirements: ``buffer`` is a kernel input read inside ``loop``; every such read
        indexes it as ``buffer[f(v), ..., g...]``: a non-empty leading part that depends
        only on ``loop``'s variable ``v`` (and dims), the same in every read, then trailing
        components that do not depend on ``v``; ``loop``'s body holds a loop; ``level``
        is 1 or 2; ``distance`` is an int >= 1; ``spread`` (not with ``at_start``) is a
        serial loop directly in ``loop``'s body whose extent depends on dims only.

        Example, ``prefetch_next("i", "X")`` with ``X: float32[N, 4096]``::

            parallel for (i, 0, N)                 parallel for (i, 0, N)
              for (k, 0, 4096)                       for (k, 0, 4096)
                ScheduleBlock(M) ...     ->            ScheduleBlock(M) ...
              for (k2, 0, 4096)                      if (i + 1 < N)
                ScheduleBlock(E) ...                   serial for (i_pf, 0, 256)
                                                         prefetch(X, (i + 1) * 4096 + i_pf * 16)
                                                     for (k2, 0, 4096)
                                                       ScheduleBlock(E) ...

        and ``prefetch_next("i", "X", spread="c", level=2)`` on a chunked last pass::

            parallel for (i, 0, N)                 parallel for (i, 0, N)
              for (k, 0, 4096)                       for (k, 0, 4096)
                ScheduleBlock(M) ...                   ScheduleBlock(M) ...
              for (c, 0, 8)              ->          for (c, 0, 8)
                for (k2, 0, 512)                       for (k2, 0, 512)
                  ScheduleBlock(E) ...                   ScheduleBlock(E) ...
                                                       if (i + 1 < N)
                                                         serial for (i_pf, 0, 32)
                                                           prefetch(X, (i + 1) * 4096
                                                             + (c * 32 + i_pf) * 16, L2)
        """
        prim = "prefetch_next"
        f, _, _ = self._locate_loop(prim, loop)
        blk = self._first_block(f)
        k = self.kernel
        if level not in (1, 2):
            raise ScheduleError(prim, blk, f"cache level {level!r} is not 1 or 2")
        if isinstance(distance, bool) or not isinstance(distance, int) or distance < 1:
            raise ScheduleError(prim, blk, f"distance {distance!r} is not an int >= 1")
        if buffer not in {b.name for b in k.inputs}:
            raise ScheduleError(prim, blk, f"{buffer} is not a kernel input")
        buf = k.buffer(buffer)
        lead, idx0 = self._row_lead(prim, blk, f, buf)
        pos = next((i for i, x in enumerate(f.body) if isinstance(x, For)), None)
        if pos is None:
            raise ScheduleError(prim, blk, f"loop {loop} holds no pass to prefetch behind")
        ahead = add(Var(f.var), Const(distance))
        nxt = {f.var: ahead}
        base: Expr = Const(0)
        for i in range(len(buf.shape)):
            comp = substitute(idx0[i], nxt) if i < lead else Const(0)
            base = add(mul(base, buf.shape[i]), comp)
        line = max(1, 64 // np.dtype(buf.dtype).itemsize)
        row = prod(list(buf.shape[lead:])) if lead < len(buf.shape) else Const(1)
        lines = floordiv(add(row, Const(line - 1)), Const(line))
        var = self._fresh(f"{f.var}_pf")
        first: Expr = Const(0)
        if spread is not None:
            host = self._spread_loop(prim, blk, f, spread, at_start)
            lines = floordiv(add(lines, sub(host.extent, Const(1))), host.extent)
            first = mul(Var(host.var), lines)
        pf = Prefetch(buffer, add(base, mul(add(first, Var(var)), Const(line))), level)
        guard = If(Bin("<", ahead, f.extent), [For(var, lines, [pf])])
        if spread is not None:
            host.body.append(guard)
        else:
            f.body.insert(0 if at_start else pos + 1, guard)
        return var

    def reads_rows(self, loop: str, buffer: str) -> bool:
        """Does each iteration of ``loop`` read its own slab of input ``buffer``, so that
        :meth:`prefetch_next` may fetch it ahead? (A query: nothing is changed or traced;
        raises :class:`ScheduleError` when there is no loop ``loop``.)"""
        f, _, _ = self._locate_loop("reads_rows", loop)
        if buffer not in {b.name for b in self.kernel.inputs}:
            return False
        try:
            self._row_lead("reads_rows", self._first_block(f), f, self.kernel.buffer(buffer))
        except ScheduleError:
            return False
        return True

    def _row_lead(self, prim: str, blk: str, f: For, buf: Buffer) -> tuple[int, tuple[Expr, ...]]:
        """How many leading indices of ``buf``'s reads inside ``f`` depend on ``f``'s
        variable (checked: the same in every read, over dims and that variable only,
        and the trailing indices free of it), and the first read's indices."""
        _, reads = loop_accesses(f, f.var)
        idxs = reads.get(buf.name, [])
        if not idxs:
            raise ScheduleError(prim, blk, f"{buf.name} is not read inside loop {f.var}")
        lead = 0
        while lead < len(buf.shape) and f.var in free_vars(idxs[0][lead]):
            lead += 1
        if lead == 0:
            raise ScheduleError(prim, blk, f"{buf.name}'s first index does not depend on {f.var}")
        allowed = {f.var} | set(self.kernel.dims)
        for idx in idxs:
            if any(
                not free_vars(e) <= allowed or not exprs_equal(e, idxs[0][i])
                for i, e in enumerate(idx[:lead])
            ):
                raise ScheduleError(prim, blk, f"{buf.name} is read at different rows of {f.var}")
            if any(f.var in free_vars(e) for e in idx[lead:]):
                raise ScheduleError(prim, blk, f"{buf.name}'s trailing indices depend on {f.var}")
        return lead, tuple(idxs[0])

    def _spread_loop(self, prim: str, blk: str, f: For, spread: str, at_start: bool) -> For:
        """The serial pass ``spread`` of ``f``'s body that a prefetch is spread over."""
        if at_start:
            raise ScheduleError(prim, blk, "spread and at_start exclude each other")
        host = next((s for s in f.body if isinstance(s, For) and s.var == spread), None)
        if host is None:
            raise ScheduleError(prim, blk, f"{spread} is not a loop directly in {f.var}'s body")
        if host.kind is not ForKind.SERIAL:
            raise ScheduleError(prim, blk, f"loop {spread} is {host.kind.value}, not serial")
        if not free_vars(host.extent) <= set(self.kernel.dims):
            raise ScheduleError(prim, blk, f"loop {spread}'s extent is not over dims only")
        return host

    @primitive
    def stream_output(self, block: str, chunk: int = 512, min_bytes: int = 0) -> list[str]:
        """Write ``block``'s kernel output ``O`` with streaming (non-temporal) stores: the
        innermost loop ``L`` around ``block`` is split into chunks of ``chunk`` elements,
        ``block`` stores each chunk into a small local staging buffer ``O_stage``, and a
        ``StreamStore`` after the chunk copies it to ``O``. The copy uses non-temporal
        stores when ``O`` holds at least ``min_bytes`` bytes and every chunk starts on a
        cache line of ``O`` (:data:`LINE_BYTES`; each term of the chunk's offset is a
        multiple of it; run-time tests when ``O``'s shape is symbolic; a chunk starting
        mid-line would share that line with the previous chunk's plain stores, which
        fetch it): a streamed line is never read from memory before it is
        overwritten (an ordinary store first fetches it: 1.5x the traffic of a copy) and
        does not evict useful lines, which pays for outputs larger than the caches.
        Returns the chunk loop and the element loop. Apply it last: afterwards ``O`` is
        written by the ``StreamStore``, not by a block.

        Requirements: ``block`` is a flat block without predicate whose body is one
        store to ``O``; no other block reads or writes ``O``; ``block`` sits directly in
        a serial or vectorized loop ``L`` holding only flat blocks; in loop terms the
        store's last index is ``L``'s variable plus terms free of it and the other
        indices are free of it (consecutive iterations write consecutive elements);
        ``chunk`` is a positive int; ``O`` is not known to be smaller than ``min_bytes``.

        Example, ``stream_output("E", chunk=512)`` with ``Y: float32[N, 4096]``::

            parallel for (i, 0, N)                parallel for (i, 0, N)
              vectorized for (j, 0, 4096)           serial for (j_0, 0, 8)
                ScheduleBlock(E)                      vectorized for (j_1, 0, 512)
                  vi, vj = axis.bind(i, j)    ->        ScheduleBlock(E)
                  Y[vi, vj] = exp(X[vi, vj])              vi, vj, vj_s = axis.bind(i, j_0 * 512 + j_1, j_1)
                                                          Y_stage[vj_s] = exp(X[vi, vj])
                                                      stream(Y[i * 4096 + j_0 * 512 +: 512]
                                                             = Y_stage[0 +: 512], nontemporal=...)
        """
        prim = "stream_output"
        k = self.kernel
        b, cont, loops = self._locate_block(prim, block)
        if isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer)) or chunk < 1:
            raise ScheduleError(prim, block, f"chunk {chunk!r} is not a positive int")
        chunk = int(chunk)
        st, out = self._output_store(prim, b)
        if self.writers(out.name) != [block] or self.readers(out.name):
            raise ScheduleError(prim, block, f"another block accesses {out.name}")
        if not loops or cont is not loops[-1].body:
            raise ScheduleError(prim, block, "the block must sit directly in a loop")
        f = loops[-1]
        if f.kind not in (ForKind.SERIAL, ForKind.VECTORIZED):
            raise ScheduleError(prim, block, f"loop {f.var} is {f.kind.value}")
        if not all(is_flat_block(x) for x in f.body):
            raise ScheduleError(prim, block, f"loop {f.var} holds more than flat blocks")
        idx = self._consecutive_store(prim, b, st, out, f)
        start = mul(Var(f.var), Const(chunk))  # the chunk loop's variable, renamed below
        offset: Expr = Const(0)
        for i, e in enumerate(idx):
            comp = substitute(e, {f.var: start}) if i == len(idx) - 1 else e
            offset = add(mul(offset, out.shape[i]), comp)
        nontemporal = self._streaming_flag(prim, block, out, offset, min_bytes)
        kind = f.kind
        extent = f.extent
        names = self.split(f.var, [None, chunk])
        outer, inner = self._locate_loop(prim, names[0])[0], self._locate_loop(prim, names[1])[0]
        inner.kind = kind
        start = mul(Var(names[0]), Const(chunk))
        offset = substitute(offset, {f.var: Var(names[0])})
        if isinstance(extent, Const) and int(extent.value) % chunk == 0:
            length: Expr = Const(chunk)
        else:
            length = Bin("min", Const(chunk), sub(extent, start))
        stage = self._fresh(f"{out.name}_stage", kind="buffer")
        k.temps.append(Buffer(stage, out.dtype, (Const(chunk),), "local"))
        iv = self._fresh(f"{b.iter_vars[-1].name}_s" if b.iter_vars else "v_s")
        b.iter_vars.append(IterVar(iv, Const(chunk)))
        b.bindings.append(Var(names[1]))
        st.buffer, st.indices = stage, (Var(iv),)
        outer.body.append(StreamStore(out.name, offset, stage, Const(0), length, nontemporal))
        self._ctx().simplify_bindings([outer])
        return names

    def _output_store(self, prim: str, b: Block) -> tuple[Store, Buffer]:
        """The one store of flat block ``b`` (no predicate), to a kernel output, not yet
        non-temporal, and that output: :meth:`stream_output`'s and
        :meth:`store_nontemporal`'s checks of the block."""
        if not is_flat_block(b) or b.predicate is not None:
            raise ScheduleError(prim, b.name, "the block must be flat and have no predicate")
        if len(b.body) != 1 or not isinstance(b.body[0], Store):
            raise ScheduleError(prim, b.name, "the block body must be a single store")
        st = b.body[0]
        if st.nontemporal is not None:
            raise ScheduleError(prim, b.name, f"the store to {st.buffer} is already non-temporal")
        if st.buffer not in {o.name for o in self.kernel.outputs}:
            raise ScheduleError(prim, b.name, f"{st.buffer} is not a kernel output")
        return st, self.kernel.buffer(st.buffer)

    def _consecutive_store(self, prim: str, b: Block, st: Store, out: Buffer, f: For) -> list[Expr]:
        """The indices of ``b``'s store ``st`` to ``out`` in loop terms, checked to write
        consecutive elements in consecutive iterations of loop ``f``: the last index is
        ``f``'s variable plus terms free of it, the others are free of it."""
        idx = [in_loop_terms(b, i) for i in st.indices]
        if not idx:
            raise ScheduleError(prim, b.name, f"{out.name} is a scalar")
        if any(f.var in free_vars(e) for e in idx[:-1]) or not steps_along(idx[-1], f.var):
            raise ScheduleError(
                prim, b.name, f"{out.name} is not written at consecutive elements along {f.var}"
            )
        return idx

    def _streaming_flag(
        self, prim: str, block: str, out: Buffer, offset: Expr, min_bytes: int
    ) -> Expr:
        """When a stream into ``out`` starting at element ``offset`` may use
        non-temporal stores: ``out`` holds at least ``min_bytes`` bytes (raises
        ScheduleError when it is known not to) and ``offset`` starts a cache line."""
        itemsize = np.dtype(out.dtype).itemsize
        size = mul(prod(list(out.shape)), Const(itemsize))
        if isinstance(size, Const):
            if int(size.value) < min_bytes:
                raise ScheduleError(
                    prim, block, f"{out.name} holds {size.value} bytes < min_bytes {min_bytes}"
                )
            big: Expr = Const(True, "bool")
        elif min_bytes <= 0:
            big = Const(True, "bool")
        else:
            big = Bin(">=", size, Const(int(min_bytes)))
        return and_flags(big, line_aligned(offset, itemsize, set(self.kernel.dims)))

    @primitive
    def stream_row(
        self, block: str, loop: str, min_bytes: int = 0, spread: str | None = None
    ) -> str:
        """Write the row of kernel output ``O`` that ``block`` produces in each iteration of
        ``loop`` into a local row buffer ``O_row`` instead, copy that buffer to ``O`` with
        a ``StreamStore`` right after the pass ``P`` (the loop in ``loop``'s body) holding
        ``block``, and let the later passes of the row that read ``O`` read ``O_row``.
        The output is then written once, with non-temporal stores under the conditions
        of :meth:`stream_output` (``O`` holds at least ``min_bytes`` bytes, each row starts
        on a cache line), while the row's readers find it in the L1: the output of a
        split chain (the LSTM cell's ``c'``, which ``h = sigmoid(o) * tanh(c')`` reads)
        streams without a staging copy per chunk, and the stores no longer fetch the
        output's lines from memory. With ``spread``, a serial loop of ``loop``'s body
        after ``P`` of static extent ``n``, the copy is cut in ``n`` equal parts instead,
        one at the end of each of its iterations, so the stores overlap that pass's
        arithmetic rather than stalling in one burst. Returns ``O_row``.

        Requirements: ``block`` is a flat block without predicate or reduce iteration
        variables whose body is one store to ``O``, at its own distinct iteration
        variables with ``O``'s extents (it writes every element of ``O`` once), and no
        other block writes ``O`` or streams into it; ``loop`` is a serial or parallel loop
        around ``block``, and ``block`` sits inside a loop ``P`` of ``loop``'s body whose
        loops (down to ``block``) have extents over dims only; in loop terms the store's
        index is a leading part over ``loop``'s variable and dims (the row, at least one
        component) and a trailing part over the loops inside ``loop`` and dims (at least
        one component); every block that reads ``O`` sits in a statement of ``loop``'s
        body after ``P`` and reads it at the same row; ``spread`` (if given) is a serial
        loop directly in ``loop``'s body after ``P`` whose static extent divides the row's
        static length. Each iteration of ``loop`` then writes its whole row before any
        read of it.

        Example, ``stream_row("C", "i")`` with ``Cn: float32[N, 1024]``::

            parallel for (i, 0, N)                 parallel for (i, 0, N)
              for (j, 0, 1024)                       for (j, 0, 1024)
                ScheduleBlock(C)                       ScheduleBlock(C)
                  vi, vj = axis.bind(i, j)               vi, vj = axis.bind(i, j)
                  Cn[vi, vj] = f(X[vi, vj])   ->          Cn_row[vj] = f(X[vi, vj])
              for (j2, 0, 1024)                      stream(Cn[i * 1024 +: 1024]
                ScheduleBlock(H)                            = Cn_row[0 +: 1024], nontemporal=...)
                  vi, vj = axis.bind(i, j2)          for (j2, 0, 1024)
                  Y[vi, vj] = g(Cn[vi, vj])            ScheduleBlock(H)
                                                         vi, vj = axis.bind(i, j2)
                                                         Y[vi, vj] = g(Cn_row[vj])

        and ``stream_row("C", "i", spread="j2_0")`` once the second pass is cut in 16
        chunks (``split("j2", [None, 64])``)::

            parallel for (i, 0, N)
              for (j, 0, 1024)
                ScheduleBlock(C) ... Cn_row[vj] = f(X[vi, vj])
              serial for (j2_0, 0, 16)
                vectorized for (j2_1, 0, 64)
                  ScheduleBlock(H) ... Y[vi, vj] = g(Cn_row[vj])
                stream(Cn[i * 1024 + j2_0 * 64 +: 64] = Cn_row[j2_0 * 64 +: 64], nontemporal=...)
        """
        prim = "stream_row"
        k = self.kernel
        b, _, loops = self._locate_block(prim, block)
        st, out = self._row_store(prim, b)
        f, host = self._row_host(prim, b, loops, loop)
        lead = self._row_lead_of_store(prim, b, st, f, loops)
        row_idx = [in_loop_terms(b, i) for i in st.indices[:lead]]
        trail = out.shape[lead:]
        for x in self.readers(out.name):
            self._check_row_reader(prim, block, x, out.name, row_idx, f, host)
        length = prod(list(trail))
        offset = flatten_index([*row_idx, *[Const(0)] * len(trail)], out.shape)
        at, start, part = f.body, Const(0), length
        if spread is not None:
            n, spread_loop = self._row_parts(prim, block, f, host, spread, length)
            at, start, part = spread_loop.body, mul(Var(spread), Const(n)), Const(n)
        flag = self._streaming_flag(prim, block, out, add(offset, start), min_bytes)
        row = self._fresh(f"{out.name}_row", kind="buffer")
        k.temps.append(Buffer(row, out.dtype, (length,), "local"))

        def repl(e: Expr) -> Expr | None:
            if isinstance(e, Load) and e.buffer == out.name:
                return Load(row, (flatten_index(e.indices[lead:], trail),))
            return None

        for name in self.readers(out.name):
            for s in walk_stmts([self.get_block(name)]):
                map_stmt_exprs(s, lambda e: transform_loads_of(e, out.name, repl))
        st.buffer, st.indices = row, (flatten_index(st.indices[lead:], trail),)
        ss = StreamStore(out.name, add(offset, start), row, start, part, flag)
        if spread is None:
            f.body.insert(next(i for i, s in enumerate(f.body) if s is host) + 1, ss)
        else:
            at.append(ss)
        return row

    @primitive
    def store_nontemporal(self, block: str, min_bytes: int = 0) -> str:
        """Write ``block``'s kernel output ``O`` with non-temporal (streaming) stores
        straight from the vector registers: unlike :meth:`stream_output`, no staging
        buffer, so an element costs no store and load in the L1 on its way; like it, a
        streamed line is not read from memory before it is overwritten and does not
        evict useful lines. Returns the loop ``L`` the backend versions for it.

        The store's ``nontemporal`` flag holds when ``O`` holds at least ``min_bytes``
        bytes and every run of ``L`` starts on a cache line of ``O`` (each term of the
        start's offset is a multiple of :data:`LINE_BYTES`; tested at run time when
        ``O``'s shape is symbolic). The backend prints a second body of the kernel with
        streaming stores and runs it where the flag holds and ``O``'s array starts on a
        vector boundary (checked at run time, so a misaligned array takes the plain
        body); LLVM's loop vectorizer then stores whole vectors of ``L``, each starting on
        a vector boundary (see the backend's "Chunked kernels"). Apply it last, like
        :meth:`stream_output`: it is meant for outputs that no pass of the kernel reads
        (the LSTM cell's ``h``), written by arithmetic costly enough that a staging
        buffer's copy shows.

        Requirements: ``block`` is a flat block without predicate whose body is one
        store, not yet non-temporal, to ``O`` of dtype float32 or float64; no other
        statement reads or writes ``O``; ``block`` sits directly in a vectorized loop
        ``L``; in loop terms the store's last index is ``L``'s variable plus terms free
        of it and the other indices are free of it (consecutive iterations write
        consecutive elements); ``O`` is not known to be smaller than ``min_bytes`` and
        its runs are not known to start off the cache lines.

        Example, ``store_nontemporal("H")`` with ``Y: float32[N, 1024]``::

            parallel for (i, 0, N)                      parallel for (i, 0, N)
              serial for (j_0, 0, 16)                     serial for (j_0, 0, 16)
                vectorized for (j_1, 0, 64)       ->        vectorized for (j_1, 0, 64)
                  ScheduleBlock(H)                            ScheduleBlock(H)
                    vi, vj = axis.bind(i, j_0 * 64 + j_1)       vi, vj = axis.bind(...)
                    Y[vi, vj] = g(X[vi, vj])                    Y[vi, vj] = g(X[vi, vj]), nontemporal=true
        """
        prim = "store_nontemporal"
        k = self.kernel
        b, cont, loops = self._locate_block(prim, block)
        st, out = self._output_store(prim, b)
        if out.dtype not in ("float32", "float64"):
            raise ScheduleError(prim, block, f"{out.name} is {out.dtype}, not float32 or float64")
        streams = (s for s in walk_stmts(k.body) if isinstance(s, StreamStore))
        if (
            self.writers(out.name) != [block]
            or self.readers(out.name)
            or any(out.name in accessed_buffers(s) for s in streams)
        ):
            raise ScheduleError(prim, block, f"another statement accesses {out.name}")
        if not loops or cont is not loops[-1].body:
            raise ScheduleError(prim, block, "the block must sit directly in a loop")
        f = loops[-1]
        if f.kind is not ForKind.VECTORIZED:
            raise ScheduleError(prim, block, f"loop {f.var} is {f.kind.value}, not vectorized")
        idx = self._consecutive_store(prim, b, st, out, f)
        start = substitute(flatten_index(idx, out.shape), {f.var: Const(0)})
        flag = self._streaming_flag(prim, block, out, start, min_bytes)
        if flag == Const(False, "bool"):
            raise ScheduleError(
                prim, block, f"the runs of {f.var} never start a line of {out.name}"
            )
        st.nontemporal = flag
        return f.var

    def _row_parts(
        self, prim: str, block: str, f: For, host: For, spread: str, length: Expr
    ) -> tuple[int, For]:
        """:meth:`stream_row`'s spread loop (checked: serial, directly in ``f``'s body
        after ``host``, a static extent that divides the static row ``length``) and the
        elements of the row each of its iterations copies."""
        pos = {id(s): i for i, s in enumerate(f.body)}
        loop = next((s for s in f.body if isinstance(s, For) and s.var == spread), None)
        if loop is None or pos[id(loop)] <= pos[id(host)]:
            raise ScheduleError(
                prim, block, f"{spread} is not a loop of {f.var} after the row's pass"
            )
        if loop.kind is not ForKind.SERIAL:
            raise ScheduleError(prim, block, f"loop {spread} is {loop.kind.value}, not serial")
        n, total = loop.extent, length
        if (
            not (isinstance(n, Const) and isinstance(total, Const))
            or int(n.value) < 1
            or int(total.value) % int(n.value)
        ):
            raise ScheduleError(
                prim, block, f"loop {spread}'s extent does not divide the row statically"
            )
        return int(total.value) // int(n.value), loop

    def _row_store(self, prim: str, b: Block) -> tuple[Store, Buffer]:
        """:meth:`stream_row`'s checks of the block: its one store, to an output it alone
        writes, at its own iteration variables over the output's whole extent."""
        k = self.kernel
        if not is_flat_block(b) or b.predicate is not None or is_reduce(b):
            raise ScheduleError(prim, b.name, "the block must be flat, spatial, without predicate")
        st, out = self._output_store(prim, b)
        if self.writers(out.name) != [b.name] or any(
            isinstance(s, StreamStore) and s.buffer == out.name for s in walk_stmts(k.body)
        ):
            raise ScheduleError(prim, b.name, f"another statement writes {out.name}")
        ivs = {iv.name: iv for iv in b.iter_vars}
        names = [i.name if isinstance(i, Var) else None for i in st.indices]
        if (
            len(names) != len(out.shape)
            or None in names
            or len(set(names)) != len(names)
            or any(
                n not in ivs or not exprs_equal(ivs[n].extent, d) for n, d in zip(names, out.shape)
            )
        ):
            raise ScheduleError(
                prim, b.name, f"{out.name} is not stored at the block's own variables"
            )
        return st, out

    def _row_host(self, prim: str, b: Block, loops: tuple[For, ...], loop: str) -> tuple[For, For]:
        """:meth:`stream_row`'s row loop ``loop`` around ``b`` and the pass in its body
        holding ``b`` (checked: the row loop is serial or parallel, the pass's loops
        down to ``b`` have extents over dims only)."""
        at = next((i for i, x in enumerate(loops) if x.var == loop), None)
        if at is None:
            raise ScheduleError(prim, b.name, f"loop {loop} does not enclose the block")
        f = loops[at]
        if f.kind not in (ForKind.SERIAL, ForKind.PARALLEL):
            raise ScheduleError(prim, b.name, f"loop {loop} is {f.kind.value}")
        if at + 1 == len(loops) or not any(s is loops[at + 1] for s in f.body):
            raise ScheduleError(prim, b.name, f"the block is not in a loop of {loop}'s body")
        dims = set(self.kernel.dims)
        for x in loops[at + 1 :]:
            if not free_vars(x.extent) <= dims:
                raise ScheduleError(prim, b.name, f"loop {x.var}'s extent is not over dims only")
        return f, loops[at + 1]

    def _row_lead_of_store(
        self, prim: str, b: Block, st: Store, f: For, loops: tuple[For, ...]
    ) -> int:
        """How many leading components of ``st``'s index (in loop terms) select the row:
        up to the last that uses ``f``'s variable or an outer loop's, they use ``f``'s
        variable and dims only; the rest use the loops inside ``f`` and dims only
        (checked, both parts non-empty)."""
        at = next(i for i, x in enumerate(loops) if x is f)
        outer = {x.var for x in loops[: at + 1]}
        inner = {x.var for x in loops[at + 1 :]}
        dims = set(self.kernel.dims)
        idx = [in_loop_terms(b, i) for i in st.indices]
        lead = 1 + max((i for i, e in enumerate(idx) if free_vars(e) & outer), default=-1)
        if lead == 0 or lead == len(idx):
            raise ScheduleError(
                prim, b.name, f"the store does not split into a row of {f.var} and its elements"
            )
        for e in idx[:lead]:
            if not free_vars(e) <= dims | {f.var}:
                raise ScheduleError(prim, b.name, f"row index {expr_str(e)} is not over {f.var}")
        for e in idx[lead:]:
            if not free_vars(e) <= dims | inner:
                raise ScheduleError(
                    prim, b.name, f"element index {expr_str(e)} is not over the loops in {f.var}"
                )
        return lead

    def _check_row_reader(
        self, prim: str, block: str, name: str, out: str, row: list[Expr], f: For, host: For
    ) -> None:
        """:meth:`stream_row`'s check of a reader of the row: it sits in a statement of
        ``f``'s body after ``host`` and reads ``out`` only at row ``row``."""
        x = self.get_block(name)
        pos = next((i for i, s in enumerate(f.body) if any(y is x for y in ast_blocks([s]))), None)
        if pos is None:
            raise ScheduleError(prim, block, f"{name} reads {out} outside loop {f.var}")
        if pos <= next(i for i, s in enumerate(f.body) if s is host):
            raise ScheduleError(prim, block, f"{name} reads {out} before the row is written")
        for _, idx in self._accesses(x, out):
            if not all(exprs_equal(a, c) for a, c in zip(idx, row)):
                raise ScheduleError(prim, block, f"{name} reads {out} off the row")
