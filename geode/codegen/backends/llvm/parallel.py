"""Parallel loops: outlined into chunk functions that the native thread pool runs.

An outermost ``parallel`` loop (in a kernel compiled parallel) becomes:

- a *context* in the caller's frame: one 8-byte slot per value the loop body uses
  (every buffer pointer and every bound variable of the enclosing scope);
- ``@K.parN(ptr ctx, i64 chunk, i64 nchunks)``, which loads the slots and calls
- ``@K.parN.body(ptr noalias ..., i64 ..., i64 chunk, i64 nchunks)``: this chunk's
  share ``[ext * chunk / nchunks, ext * (chunk + 1) / nchunks)`` of the iterations,
  the temporaries private to the loop (once per chunk, or per iteration when their
  shape depends on the loop variable), and the loop itself, serial inside (parallel
  loops nested in it run serially). ``noalias`` lets LLVM vectorize without runtime
  alias checks, as numba's prange bodies did. A chunk that streamed stores fences
  them before it returns.
- in the caller, ``@geode.launch(@K.parN, ctx, ext, threads, work)`` (the native
  runtime's ``geode_launch``): nothing for an empty loop; the chunk count is
  ``min(ext, CHUNKS_PER_THREAD * threads)`` (threads: the
  kernel's ``threads`` argument, or the pool's size when it is 0); one thread, one chunk
  or too little work calls the chunk function directly, else ``geode_parallel_for`` of
  the native runtime shares the chunks among the pool's threads by work stealing.
  ``work`` is the element count of the kernel's largest argument, evaluated at run time:
  below ``min_work`` (:data:`MIN_PARALLEL_ELEMENTS` unless the caller gives its own: the
  driver passes the autoscheduler's ``parallel_min_elements``, which decides the same
  for static shapes at compile time) waking the pool's sleeping workers costs more
  than the loop (measurements: ``docs/performance.md``).
"""

from __future__ import annotations

from geode.codegen.ast import Expr, For, Kernel, Store, StreamStore, Var, walk_stmts
from geode.codegen.backends.llvm.irtext import FunctionWriter, quote_name
from geode.codegen.backends.llvm.stmts import StmtWriter

__all__ = ["CHUNKS_PER_THREAD", "LAUNCH", "MIN_PARALLEL_ELEMENTS", "ParallelWriter"]

#: chunks per thread of a launch (work stealing balances uneven chunks)
CHUNKS_PER_THREAD = 32
#: a kernel whose arguments all have fewer elements runs its parallel loops on the
#: calling thread (the default of ``min_work``, see the module docstring)
MIN_PARALLEL_ELEMENTS = 1 << 15

#: the launcher every module with a parallel loop declares: the native runtime's
#: ``geode_launch``, linked under this name (``jit.runtime_symbols``). Defined in each
#: module, it cost LLVM 2-4 ms of a 20-30 ms kernel module (inlined into the caller, its
#: pool branch optimized and compiled again in every kernel); one C call runs the same
#: decisions (:data:`CHUNKS_PER_THREAD` is the runtime's ``GEODE_CHUNKS_PER_THREAD``)
LAUNCH = "declare void @geode.launch(ptr, ptr, i64, i64, i1 zeroext) nounwind"


class ParallelWriter(StmtWriter):
    """Outlining of parallel loops (see the module docstring)."""

    k: Kernel
    #: see MIN_PARALLEL_ELEMENTS
    min_work: int
    threads: str
    n_outlined: int
    func_prefix: str
    attrs: str

    def parallel_loop(self, s: For) -> None:
        """Outline parallel loop ``s`` and launch it on the thread pool."""
        ext = self.index(s.extent)
        m, f = self.module, self.fn
        n = self.n_outlined
        self.n_outlined += 1
        thunk_name = m.unique(f"{self.func_prefix}.par{n}")
        body_name = m.unique(f"{thunk_name}.body")
        # what the body may use: every buffer pointer and bound variable in scope
        ptr_items = sorted(self.ptrs.items()) + sorted(
            (f"{k}.nan", v) for k, v in self.guards.items()
        )
        val_items = sorted(
            (k, e.name)
            for k, e in self.env.items()
            if isinstance(e, Var) and e.name.startswith("%")
        )
        n_slots = len(ptr_items) + len(val_items)
        ctx = f.alloca(f"[{max(n_slots, 1)} x i64]", "ctx", align=8)
        for i, (_, p) in enumerate(ptr_items):
            slot = f.value(f"getelementptr inbounds [{n_slots} x i64], ptr {ctx}, i64 0, i64 {i}")
            f.add(f"store ptr {p}, ptr {slot}")
        for j, (_, v) in enumerate(val_items):
            i = len(ptr_items) + j
            slot = f.value(f"getelementptr inbounds [{n_slots} x i64], ptr {ctx}, i64 0, i64 {i}")
            f.add(f"store i64 {v}, ptr {slot}")
        self.write_thunk(thunk_name, body_name, len(ptr_items), len(val_items))
        self.write_chunk_body(s, body_name, ptr_items, val_items)
        m.declare("geode_num_threads", "declare i64 @geode_num_threads() nounwind")
        m.declare(
            "geode_parallel_for", "declare void @geode_parallel_for(ptr, ptr, i64, i64) nounwind"
        )
        m.add_global("geode.launch", LAUNCH)
        small = self.small_work()
        f.add(
            f"call void @geode.launch(ptr @{quote_name(thunk_name)}, ptr {ctx}, i64 {ext}, "
            f"i64 {self.threads}, i1 {small})"
        )

    def small_work(self) -> str:
        """An ``i1``: whether every argument of the kernel has fewer elements than
        ``min_work`` (then the loop runs on the calling thread, see the module docstring)."""
        limit = self.min_work
        f = self.fn
        small = "true"
        for b in [*self.k.inputs, *self.k.outputs]:
            n = "1"
            for d in b.shape:
                v = self.index(d)
                n = v if n == "1" else f.value(f"mul i64 {n}, {v}")
            if n.lstrip("-").isdigit():
                if int(n) >= limit:
                    return "false"
                continue
            c = f.value(f"icmp slt i64 {n}, {limit}")
            small = c if small == "true" else f.value(f"and i1 {small}, {c}")
        return small

    def write_thunk(self, name: str, body: str, n_ptrs: int, n_vals: int) -> None:
        """``@name(ctx, chunk, nchunks)``: load the context's slots, call the body."""
        fn = FunctionWriter(name, "void", [("ptr", "ctx"), ("i64", "chunk"), ("i64", "nchunks")])
        fn.linkage = "internal"
        fn.attrs = f" {self.module.attr_group('nounwind ' + self.attrs)}"
        ctx = fn.param(0)
        args = []
        for i in range(n_ptrs + n_vals):
            ty = "ptr" if i < n_ptrs else "i64"
            slot = fn.value(f"getelementptr inbounds i64, ptr {ctx}, i64 {i}")
            args.append(f"{ty} {fn.value(f'load {ty}, ptr {slot}')}")
        args += [f"i64 {fn.param(1)}", f"i64 {fn.param(2)}"]
        fn.add(f"call void @{quote_name(body)}({', '.join(args)})")
        fn.terminate("ret void")
        self.module.add_function(fn)

    def write_chunk_body(
        self, s: For, name: str, ptr_items: list[tuple[str, str]], val_items: list[tuple[str, str]]
    ) -> None:
        """The chunk function of parallel loop ``s`` (see the module docstring)."""
        params = [("ptr noalias", k) for k, _ in ptr_items] + [("i64", k) for k, _ in val_items]
        params += [("i64", "chunk"), ("i64", "nchunks")]
        fn = FunctionWriter(name, "void", params)
        fn.linkage = "internal"
        fn.attrs = f" {self.module.attr_group('nounwind noinline ' + self.attrs)}"
        saved = self.save_function_state()
        try:
            self.fn = fn
            self.in_parallel = True
            self.ptrs, self.guards = {}, {}
            for i, (k, _) in enumerate(ptr_items):
                if k.endswith(".nan") and k[:-4] in saved["guards"]:
                    self.guards[k[:-4]] = fn.param(i)
                else:
                    self.ptrs[k] = fn.param(i)
            env: dict[str, Expr] = {
                k: e
                for k, e in saved["env"].items()
                if not (isinstance(e, Var) and e.name.startswith("%"))
            }
            for j, (k, old) in enumerate(val_items):
                ref = fn.param(len(ptr_items) + j)
                env[k] = Var(ref)
                if old in saved["index_ir"]:
                    self.index_ir.add(ref)
            self.env = env
            chunk, nchunks = fn.param(len(params) - 2), fn.param(len(params) - 1)
            ext = self.index(s.extent)
            a = fn.value(f"mul i64 {ext}, {chunk}")
            lo = fn.value(f"udiv i64 {a}, {nchunks}")
            b = fn.value(f"add i64 {a}, {ext}")
            hi = fn.value(f"udiv i64 {b}, {nchunks}")
            self.streamed = False
            self.site_var = s.var
            per_chunk = self.allocate(id(s))
            self.guard_frames.append(None)

            def body() -> None:
                per_iter = self.allocate(id(s), per_iteration=True)
                self.stmts(s.body)
                self.free_all(per_iter)

            self.rolled.update(id(x) for x in s.body if self.short_vector_loop(x))
            try:
                self.counted_loop(lo, hi, s.var, self.loop_meta(s), body)
            finally:
                self.guard_frames.pop()
                self.site_var = None
            self.free_all(per_chunk)
            streams = self.streamed or any(
                (isinstance(x, Store) and id(x) in self.nt_on) or isinstance(x, StreamStore)
                for x in walk_stmts(s.body)
            )
            if streams:
                self.sfence()
            fn.terminate("ret void")
            self.module.add_function(fn)
        finally:
            self.restore_function_state(saved)

    def save_function_state(self) -> dict:
        return {
            "fn": self.fn,
            "ptrs": self.ptrs,
            "guards": self.guards,
            "env": self.env,
            "in_parallel": self.in_parallel,
            "index_ir": set(self.index_ir),
            "streamed": getattr(self, "streamed", False),
        }

    def restore_function_state(self, st: dict) -> None:
        self.fn = st["fn"]
        self.ptrs = st["ptrs"]
        self.guards = st["guards"]
        self.env = st["env"]
        self.in_parallel = st["in_parallel"]
        self.index_ir = st["index_ir"]
        self.streamed = st["streamed"]
