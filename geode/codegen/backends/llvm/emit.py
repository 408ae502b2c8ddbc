"""A scheduled kernel -> one LLVM module: its body function(s), chunk functions and the
entry that Python (or a subgraph function) calls.

Module layout for kernel ``K``::

    i32 @K(ptr ptrs, ptr recs, ptr ints)          ; the entry (external)
    void @K.body(ptr noalias ..., i64 dims..., i64 threads)
    void @K.body.nt(...)                           ; only with streaming stores
    void @K.par0(ptr ctx, i64 chunk, i64 n) / @K.par0.body(...)   ; parallel loops
    @geode.launch, @geode.op.*, @geode.stream.*, vmath functions (internal)

The entry's arguments: ``ptrs[i]`` the data of array ``i`` (inputs, then outputs);
``recs`` per array ``ndim, itemsize, shape...``; ``ints`` the dims, then the thread
count (0: the pool's). It checks every record against the buffer (a 0-d buffer takes
a 0-d or a one-element 1-d array), returns ``i + 1`` for a bad argument ``i`` without
touching memory, else runs the body and returns 0. With streaming stores it runs
``K.body.nt`` when every store's flag holds and each output it streams to starts on a
vector boundary, else ``K.body``: a whole function is duplicated rather than the loop
(a loop printed twice in one function made LLVM spill both copies' constants).
"""

from __future__ import annotations

import numpy as np

from geode.codegen.ast import Const, Expr, For, ForKind, Kernel, Var, expr_str, walk_stmts
from geode.codegen.backends.llvm import dtypes as D
from geode.codegen.backends.llvm.analysis import (
    allocation_sites,
    guarded_registers,
    nt_stores,
    run_start,
    static_size,
    vectorized_loops,
)
from geode.codegen.backends.llvm.compiled import ArgSpec, Emitted
from geode.codegen.backends.llvm.irtext import FunctionWriter, ModuleWriter, quote_name
from geode.codegen.backends.llvm.parallel import MIN_PARALLEL_ELEMENTS, ParallelWriter
from geode.codegen.backends.llvm.target import Target
from geode.codegen.backends.patterns import flat_index
from geode.errors import CodegenError

__all__ = ["ArgSpec", "Emitted", "emit_module"]


class Emitter(ParallelWriter):
    """Writes one kernel's module (see the module docstring)."""

    def __init__(
        self,
        kernel: Kernel,
        fastmath: bool,
        parallel: bool,
        target: Target,
        min_work: int = MIN_PARALLEL_ELEMENTS,
    ):
        self.k = kernel
        self.min_work = min_work
        self.kernel_name = kernel.name
        self.fastmath = fastmath
        self.target = target
        self.module = ModuleWriter(kernel.name)
        self.bufs, self.roles, self.dtypes = {}, {}, {}
        for role, group in (
            ("input", kernel.inputs),
            ("output", kernel.outputs),
            ("temp", kernel.temps),
        ):
            for b in group:
                if b.name in self.bufs:
                    raise CodegenError(f"kernel {kernel.name!r}: buffer {b.name!r} declared twice")
                self.bufs[b.name] = b
                self.roles[b.name] = role
                self.dtypes[b.name] = D.check_dtype(
                    b.dtype, f"kernel {kernel.name!r} buffer {b.name!r}"
                )
                if role == "temp" and b.scope not in ("local", "register"):
                    raise CodegenError(
                        f"kernel {kernel.name!r}: temporary {b.name!r} has scope {b.scope!r}"
                    )
        has_par = any(
            isinstance(s, For) and s.kind is ForKind.PARALLEL for s in walk_stmts(kernel.body)
        )
        self.parallel = parallel and has_par
        self.guarded = guarded_registers(kernel.body, self.guard_candidate)
        self.quiet = {n for n in self.guarded if self.bufs[n].nan_insensitive}
        temps = {b.name for b in kernel.temps}
        self.alloc_site = allocation_sites(
            kernel.body, temps, lambda s: s.kind is ForKind.PARALLEL and self.parallel
        )
        self.attrs = target.function_attrs
        self.func_prefix = kernel.name
        self.entry_name = self.module.unique(kernel.name)
        self.vmath_used: set[str] = set()
        self.n_outlined = 0
        self.site_var = None
        self.nt_on = set()

    def guard_candidate(self, name: str) -> bool:
        """A scalar float32/float64 register (see ``guarded_registers``)."""
        b = self.bufs.get(name)
        return (
            b is not None
            and self.roles[name] == "temp"
            and b.scope == "register"
            and self.dtypes[name] in ("float32", "float64")
            and static_size(b) == 1
        )

    # -- functions ---------------------------------------------------------------------
    def body_function(self, name: str, nt: set[int]) -> None:
        """``@name(arrays..., dims..., threads)``: the kernel's statements."""
        k = self.k
        args = [*k.inputs, *k.outputs]
        params = [("ptr noalias", b.name) for b in args] + [("i64", d) for d in k.dims]
        params.append(("i64", "threads"))
        fn = FunctionWriter(name, "void", params)
        fn.linkage = "internal"
        fn.attrs = f" {self.module.attr_group('nounwind ' + self.attrs)}"
        self.fn = fn
        self.ptrs = {b.name: fn.param(i) for i, b in enumerate(args)}
        self.guards = {}
        self.env = {d: Var(fn.param(len(args) + i)) for i, d in enumerate(k.dims)}
        self.index_ir = {fn.param(len(args) + i) for i in range(len(k.dims))}
        self.threads = fn.param(len(params) - 1)
        self.in_parallel = False
        self.fence_at_end = False
        self.streamed = False
        self.guard_frames = []
        self.rolled = set()
        self.nt_on = nt
        frees = self.allocate(None)
        self.stmts(k.body)
        self.free_all(frees)
        if self.fence_at_end:
            self.sfence()
        fn.terminate("ret void")
        self.module.add_function(fn)
        self.nt_on = set()

    def plan_nontemporal(self) -> tuple[set[int], Expr, list[str]]:
        """The non-temporal stores the streaming body writes as such, the condition over
        the dims under which it runs, and the outputs that must start on a vector
        boundary. A store counts when it sits in a flat block directly in a vectorized
        loop and every run of that loop starts on a cache line of the output (checked
        here again on the AST being printed, at run time for symbolic shapes)."""
        from geode.codegen.indexing import and_flags, line_aligned

        ids: set[int] = set()
        cond: Expr = Const(True, "bool")
        outs: list[str] = []
        dims = set(self.k.dims)
        for f in vectorized_loops(self.k.body):
            for b, st in nt_stores(
                f, lambda n: self.roles.get(n) == "temp" and self.bufs[n].scope == "register"
            ):
                dt = self.dtypes.get(st.buffer)
                if self.roles.get(st.buffer) != "output" or dt not in ("float32", "float64"):
                    raise CodegenError(
                        f"kernel {self.k.name!r}: non-temporal store to {st.buffer!r}, which "
                        f"is not a float32/float64 output"
                    )
                first = flat_index(run_start(b, st, f), self.bufs[st.buffer].shape)
                assert st.nontemporal is not None
                flag = and_flags(st.nontemporal, line_aligned(first, np.dtype(dt).itemsize, dims))
                if flag == Const(False, "bool"):
                    continue
                ids.add(id(st))
                cond = and_flags(cond, flag)
                if st.buffer not in outs:
                    outs.append(st.buffer)
        return ids, cond, outs

    def entry_function(
        self, body: str, nt_body: str | None, nt_cond: Expr, nt_outs: list[str]
    ) -> None:
        """The entry (see the module docstring)."""
        from geode.codegen.indexing import conjuncts

        k = self.k
        args = [*k.inputs, *k.outputs]
        fn = FunctionWriter(
            self.entry_name, "i32", [("ptr", "ptrs"), ("ptr", "recs"), ("ptr", "ints")]
        )
        fn.attrs = f" {self.module.attr_group('nounwind ' + self.attrs)}"
        self.fn = fn
        ptrs, recs, ints = fn.param(0), fn.param(1), fn.param(2)
        self.env, self.index_ir = {}, set()
        dims = []
        for i, d in enumerate(k.dims):
            p = fn.value(f"getelementptr inbounds i64, ptr {ints}, i64 {i}")
            v = fn.value(f"load i64, ptr {p}", d)
            self.env[d] = Var(v)
            self.index_ir.add(v)
            dims.append(v)
        p = fn.value(f"getelementptr inbounds i64, ptr {ints}, i64 {len(k.dims)}")
        threads = fn.value(f"load i64, ptr {p}", "threads")
        off = "0"
        for i, b in enumerate(args):
            off = self.check_record(i, b, recs, off)
        arrays = []
        for i, b in enumerate(args):
            p = fn.value(f"getelementptr inbounds ptr, ptr {ptrs}, i64 {i}")
            arrays.append(fn.value(f"load ptr, ptr {p}", b.name))
        call_args = [f"ptr {a}" for a in arrays] + [f"i64 {d}" for d in dims] + [f"i64 {threads}"]
        text = ", ".join(call_args)
        if nt_body is None:
            fn.add(f"call void @{quote_name(body)}({text})")
        else:
            conds = [self.convert(self.value(t), "bool").ref for t in conjuncts(nt_cond)]
            mask = self.target.stream_vector_bytes - 1
            for o in nt_outs:
                addr = fn.value(f"ptrtoint ptr {arrays[[b.name for b in args].index(o)]} to i64")
                low = fn.value(f"and i64 {addr}, {mask}")
                conds.append(fn.value(f"icmp eq i64 {low}, 0"))
            ok = "true"
            for c in conds:
                ok = c if ok == "true" else fn.value(f"and i1 {ok}, {c}")
            yes, no, done = fn.label("stream"), fn.label("plain"), fn.label("done")
            fn.cond_br(ok, yes, no)
            fn.start_block(yes)
            fn.add(f"call void @{quote_name(nt_body)}({text})")
            fn.br(done)
            fn.start_block(no)
            fn.add(f"call void @{quote_name(body)}({text})")
            fn.br(done)
            fn.start_block(done)
        fn.terminate("ret i32 0")
        self.module.add_function(fn)

    def check_record(self, i: int, b, recs: str, off: str) -> str:
        """Check array ``i``'s record at offset ``off`` of ``recs``; returns the next
        record's offset. A mismatch returns ``i + 1`` from the entry."""
        fn = self.fn
        rank, item = len(b.shape), np.dtype(self.dtypes[b.name]).itemsize
        base = fn.value(f"getelementptr inbounds i64, ptr {recs}, i64 {off}")
        nd = fn.value(f"load i64, ptr {base}", f"{b.name}.ndim")
        ip = fn.value(f"getelementptr inbounds i64, ptr {base}, i64 1")
        isz = fn.value(f"load i64, ptr {ip}")
        bad, good = fn.label(f"bad.{b.name}"), fn.label(f"ok.{b.name}")
        item_ok = fn.value(f"icmp eq i64 {isz}, {item}")
        if rank == 0:  # a 0-d array, or a 1-d array of one element
            zero = fn.value(f"icmp eq i64 {nd}, 0")
            one_d = fn.label(f"one.{b.name}")
            check1 = fn.label(f"check1.{b.name}")
            z_ok = fn.value(f"and i1 {zero}, {item_ok}")
            fn.cond_br(z_ok, good, one_d)
            fn.start_block(one_d)
            one = fn.value(f"icmp eq i64 {nd}, 1")
            o_ok = fn.value(f"and i1 {one}, {item_ok}")
            fn.cond_br(o_ok, check1, bad)
            fn.start_block(check1)
            dp = fn.value(f"getelementptr inbounds i64, ptr {base}, i64 2")
            d0 = fn.value(f"load i64, ptr {dp}")
            fn.cond_br(fn.value(f"icmp eq i64 {d0}, 1"), good, bad)
        else:
            dims_b = fn.label(f"dims.{b.name}")
            r_ok = fn.value(f"icmp eq i64 {nd}, {rank}")
            fn.cond_br(fn.value(f"and i1 {r_ok}, {item_ok}"), dims_b, bad)
            fn.start_block(dims_b)
            ok = "true"
            for axis, d in enumerate(b.shape):
                dp = fn.value(f"getelementptr inbounds i64, ptr {base}, i64 {2 + axis}")
                got = fn.value(f"load i64, ptr {dp}")
                want = self.index(d)
                c = fn.value(f"icmp eq i64 {got}, {want}")
                ok = c if ok == "true" else fn.value(f"and i1 {ok}, {c}")
            fn.cond_br(ok, good, bad)
        fn.start_block(bad)
        fn.terminate(f"ret i32 {i + 1}")
        fn.start_block(good)
        return fn.value(f"add i64 {off}, {fn.value(f'add i64 {nd}, 2')}")

    # -- the module --------------------------------------------------------------------
    def run(self) -> Emitted:
        k = self.k
        body = self.module.unique(f"{k.name}.body")
        self.body_function(body, set())
        nt_ids, nt_cond, nt_outs = self.plan_nontemporal()
        nt_body = None
        if nt_ids:
            nt_body = self.module.unique(f"{k.name}.body.nt")
            self.func_prefix = f"{k.name}.nt"
            self.body_function(nt_body, nt_ids)
        self.entry_function(body, nt_body, nt_cond, nt_outs)
        if self.vmath_used:
            self.add_vmath()
        args = tuple(
            ArgSpec(
                b.name,
                role,
                self.dtypes[b.name],
                len(b.shape),
                "("
                + ", ".join(expr_str(d) for d in b.shape)
                + ("," if len(b.shape) == 1 else "")
                + ")",
            )
            for role, group in (("input", k.inputs), ("output", k.outputs))
            for b in group
        )
        return Emitted(
            self.module.text(),
            self.entry_name,
            args,
            tuple(k.dims),
            self.parallel,
            tuple(sorted(self.vmath_used)),
        )

    def add_vmath(self) -> None:
        """Define the vmath functions the kernel calls (and what they need)."""
        from geode.codegen.backends.llvm import vmath

        lib = vmath.definitions(sorted(self.vmath_used), vmath.VmathTarget.host())
        for name, text in lib.globals.items():
            self.module.add_global(name, text)
        for name, text in lib.declares.items():
            self.module.declare(name, text)
        self.module.add_function(lib.functions)


def emit_module(
    kernel: Kernel,
    fastmath: bool,
    parallel: bool,
    target: Target,
    min_work: int = MIN_PARALLEL_ELEMENTS,
) -> Emitted:
    """The LLVM module of ``kernel`` (see the module docstring; ``min_work``: see
    :data:`~geode.codegen.backends.llvm.parallel.MIN_PARALLEL_ELEMENTS`)."""
    return Emitter(kernel, fastmath, parallel, target, min_work).run()
