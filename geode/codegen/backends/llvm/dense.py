"""A GEMM with a fused epilogue as one native entry: the product is computed a panel of
rows at a time by the BLAS into a scratch panel, and the epilogue kernel (a fused group
compiled over ``[rows, N]``) runs on the panel while it is in cache.

Entry (the kernels' ABI, :mod:`~geode.codegen.backends.llvm.emit`)::

    i32 @D(ptrs, recs, ints)   ; ptrs: A, B, the epilogue's other inputs, its outputs
                               ; ints: the thread count (0: the pool's)

``A`` has rank ``r >= 2`` (its leading dims are the rows ``M``, its last the depth ``K``),
``B`` is ``[K, N]``. Every other argument has a role (:mod:`geode.compiler.fusion.epilogue`):
``full`` (``M x N`` elements, last dim ``N``), ``col`` (``M`` elements, last dim 1), ``row``
(``N`` elements) or ``scalar`` (one). The entry checks ranks, item sizes and sizes against
those (status ``i + 1`` for a bad argument ``i``), allocates the scratch panel (status
:data:`NO_MEMORY` when it cannot), then for each panel of ``mb`` rows::

    scratch[:rows] = A[p0:p0+rows] @ B                  (BLAS; zeros when K or N is 0)
    status = epilogue(panel pointers, panel records, panel dims, threads)

``mb = max(min_rows, panel_bytes / (N * itemsize))``, so a panel fits the caches the cost
model chose. A nonzero epilogue status ``s`` returns :data:`EPILOGUE_STATUS` ``+ s``.
"""

from __future__ import annotations

from dataclasses import dataclass

from geode.codegen.backends.llvm.library import _TYPES, Blas

__all__ = ["EPILOGUE_STATUS", "NO_MEMORY", "DenseSpec", "InnerArg", "OuterArg", "dense_ir"]

#: status of an entry that could not allocate its scratch panel
NO_MEMORY = 1 << 20
#: added to the status an epilogue kernel returned
EPILOGUE_STATUS = 1 << 21

_SIZE = {"full": "MN", "col": "M", "row": "N", "scalar": "1"}


@dataclass(frozen=True)
class OuterArg:
    """An argument of the entry after ``A`` and ``B``: its role, rank and item size."""

    role: str  # full | col | row | scalar
    rank: int
    itemsize: int


@dataclass(frozen=True)
class InnerArg:
    """An argument of the epilogue kernel: where its data comes from (``-1``: the scratch
    panel, else the index of an :class:`OuterArg`), its role, item size, and the dims of
    its 2-D shape that the kernel merges (None: its own shape)."""

    source: int
    role: str  # acc | full | col | row | scalar
    itemsize: int
    view: tuple[int, ...] | None = None


class _Writer:
    """Numbered SSA temporaries and lines of one function."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.n = 0

    def tmp(self, text: str) -> str:
        self.n += 1
        name = f"%t{self.n}"
        self.lines.append(f"  {name} = {text}")
        return name

    def emit(self, text: str) -> None:
        self.lines.append(text)

    def product(self, values: list[str]) -> str:
        acc = "1"
        for v in values:
            acc = v if acc == "1" else self.tmp(f"mul i64 {acc}, {v}")
        return acc

    def all_of(self, conds: list[str]) -> str:
        ok = "true"
        for c in conds:
            ok = c if ok == "true" else self.tmp(f"and i1 {ok}, {c}")
        return ok

    def check(self, cond: str, status: int) -> None:
        self.n += 1
        self.emit(f"  br i1 {cond}, label %ok{self.n}, label %bad{self.n}")
        self.emit(f"bad{self.n}:")
        self.emit(f"  ret i32 {status}")
        self.emit(f"ok{self.n}:")


def _records(w: _Writer, ranks: list[int]) -> list[tuple[str, str, list[str]]]:
    """Load every record: ``(ndim, itemsize, dims)`` per array."""
    out, pos = [], 0
    for rank in ranks:
        words = []
        for _ in range(2 + rank):
            p = w.tmp(f"getelementptr inbounds i64, ptr %recs, i64 {pos}")
            words.append(w.tmp(f"load i64, ptr {p}"))
            pos += 1
        out.append((words[0], words[1], words[2:]))
    return out


def _inner_dims(w: _Writer, arg: InnerArg, rows: str, n: str) -> list[str]:
    """The epilogue argument's record dims for a panel of ``rows``: its 2-D shape by role,
    with the dims its view merges multiplied."""
    two = {"acc": [rows, n], "full": [rows, n], "col": [rows, "1"], "row": [n], "scalar": []}
    dims = two[arg.role]
    if arg.view is None:
        return dims
    bounds = [*arg.view, len(dims)]
    return [w.product(dims[bounds[k] : bounds[k + 1]]) for k in range(len(arg.view))]


def _inner_rank(arg: InnerArg) -> int:
    return len(arg.view) if arg.view is not None else {"row": 1, "scalar": 0}.get(arg.role, 2)


@dataclass(frozen=True)
class DenseSpec:
    """Everything the entry is generated from (see :func:`dense_ir`)."""

    name: str
    dtype: str
    a_rank: int
    outer: tuple[OuterArg, ...]
    inner: tuple[InnerArg, ...]
    #: the epilogue's dim arguments: ``"rows"``, ``"cols"`` or a constant
    inner_dims: tuple[str | int, ...]
    epilogue: str  # the epilogue kernel's entry symbol
    panel_bytes: int
    min_rows: int


def _check_args(w: _Writer, sp: DenseSpec, item: int) -> tuple[str, str, str]:
    """Load and check every record; returns ``(M, K, N)``."""
    recs = _records(w, [sp.a_rank, 2] + [o.rank for o in sp.outer])
    (a_nd, a_it, a_dims), (b_nd, b_it, b_dims) = recs[0], recs[1]
    m = w.product(a_dims[:-1])
    k, n = a_dims[-1], b_dims[1]
    a_ok = [w.tmp(f"icmp eq i64 {a_nd}, {sp.a_rank}"), w.tmp(f"icmp eq i64 {a_it}, {item}")]
    w.check(w.all_of(a_ok), 1)
    b_ok = [
        w.tmp(f"icmp eq i64 {b_nd}, 2"),
        w.tmp(f"icmp eq i64 {b_it}, {item}"),
        w.tmp(f"icmp eq i64 {b_dims[0]}, {k}"),
    ]
    w.check(w.all_of(b_ok), 2)
    sizes = {"MN": w.tmp(f"mul i64 {m}, {n}"), "M": m, "N": n, "1": "1"}
    for i, (arg, (nd, its, dims)) in enumerate(zip(sp.outer, recs[2:])):
        conds = [
            w.tmp(f"icmp eq i64 {nd}, {arg.rank}"),
            w.tmp(f"icmp eq i64 {its}, {arg.itemsize}"),
            w.tmp(f"icmp eq i64 {w.product(dims)}, {sizes[_SIZE[arg.role]]}"),
        ]
        if arg.role in ("full", "row") and arg.rank:
            conds.append(w.tmp(f"icmp eq i64 {dims[-1]}, {n}"))
        w.check(w.all_of(conds), 3 + i)
    return m, k, n


def _panel_rows(w: _Writer, sp: DenseSpec, m: str, n: str, item: int) -> tuple[str, str]:
    """``(mb, row_bytes)``: ``mb = max(min_rows, panel_bytes / (N * item))`` clamped to
    ``[1, M]`` (all rows at once when ``N`` is 0)."""
    nz = w.tmp(f"icmp eq i64 {n}, 0")
    row_bytes = w.tmp(f"mul i64 {n}, {item}")
    safe = w.tmp(f"select i1 {nz}, i64 1, i64 {row_bytes}")
    fit = w.tmp(f"udiv i64 {sp.panel_bytes}, {safe}")
    big = w.tmp(f"icmp ugt i64 {fit}, {sp.min_rows}")
    mb0 = w.tmp(f"select i1 {big}, i64 {fit}, i64 {sp.min_rows}")
    mall = w.tmp(f"select i1 {nz}, i64 {m}, i64 {mb0}")
    lt = w.tmp(f"icmp ult i64 {m}, {mall}")
    mb1 = w.tmp(f"select i1 {lt}, i64 {m}, i64 {mall}")
    one = w.tmp(f"icmp ult i64 {mb1}, 1")
    return w.tmp(f"select i1 {one}, i64 1, i64 {mb1}"), row_bytes


def _gemm_panel(w: _Writer, sp: DenseSpec, lib: Blas, v: dict[str, str]) -> None:
    """Blocks ``zero`` and ``gemm``: the panel's product into the scratch panel."""
    ty = _TYPES[sp.dtype][0]
    it = f"i{lib.int_bits}"
    kz = w.tmp(f"icmp eq i64 {v['k']}, 0")
    nz = w.tmp(f"icmp eq i64 {v['n']}, 0")
    skip = w.tmp(f"or i1 {kz}, {nz}")
    a_off = w.tmp(f"mul i64 %p0, {v['k']}")
    a_p = w.tmp(f"getelementptr inbounds {ty}, ptr {v['A']}, i64 {a_off}")
    w.emit(f"  br i1 {skip}, label %zero, label %gemm")
    w.emit("zero:")
    zb = w.tmp(f"mul i64 {v['rows']}, {v['row_bytes']}")
    w.emit(f"  call void @llvm.memset.p0.i64(ptr {v['scratch']}, i8 0, i64 {zb}, i1 false)")
    w.emit("  br label %epi")
    w.emit("gemm:")
    ints = [v["rows"], v["n"], v["k"]]
    if lib.int_bits == 32:
        ints = [w.tmp(f"trunc i64 {x} to i32") for x in ints]
    ri, ni, ki = ints
    w.emit(
        f"  call void @{lib.symbol(sp.dtype)}(i32 101, i32 111, i32 111, {it} {ri}, {it} {ni}, "
        f"{it} {ki}, {ty} 1.0, ptr {a_p}, {it} {ki}, ptr {v['B']}, {it} {ni}, {ty} 0.0, "
        f"ptr {v['scratch']}, {it} {ni})"
    )
    w.emit("  br label %epi")


def _epilogue_call(w: _Writer, sp: DenseSpec, v: dict[str, str], ptrs: list[str]) -> str:
    """The epilogue's pointers, records and dims for this panel, and its call's status."""
    pos = 0
    for j, arg in enumerate(sp.inner):
        if arg.source < 0:
            data = v["scratch"]
        else:
            base = ptrs[2 + arg.source]
            per_row = {"full": v["n"], "col": "1"}.get(arg.role)
            if per_row is None:  # row, scalar: the same data for every panel
                data = base
            else:
                elems = w.tmp(f"mul i64 %p0, {per_row}")
                off = w.tmp(f"mul i64 {elems}, {arg.itemsize}")
                data = w.tmp(f"getelementptr inbounds i8, ptr {base}, i64 {off}")
        slot = w.tmp(f"getelementptr inbounds ptr, ptr {v['iptrs']}, i64 {j}")
        w.emit(f"  store ptr {data}, ptr {slot}")
        dims = _inner_dims(w, arg, v["rows"], v["n"])
        for word in [str(len(dims)), str(arg.itemsize), *dims]:
            slot = w.tmp(f"getelementptr inbounds i64, ptr {v['irecs']}, i64 {pos}")
            w.emit(f"  store i64 {word}, ptr {slot}")
            pos += 1
    named = {"rows": v["rows"], "cols": v["n"], "threads": v["threads"]}
    for j, d in enumerate([*sp.inner_dims, "threads"]):
        value = named[d] if isinstance(d, str) else str(int(d))
        slot = w.tmp(f"getelementptr inbounds i64, ptr {v['iints']}, i64 {j}")
        w.emit(f"  store i64 {value}, ptr {slot}")
    return w.tmp(f"call i32 @{sp.epilogue}(ptr {v['iptrs']}, ptr {v['irecs']}, ptr {v['iints']})")


def _loop(w: _Writer, sp: DenseSpec, lib: Blas, v: dict[str, str], ptrs: list[str]) -> None:
    """The panel loop, then the scratch panel's release."""
    w.emit("  br label %pre")
    w.emit("pre:")
    w.emit("  br label %loop")
    w.emit("loop:")
    w.emit("  %p0 = phi i64 [ 0, %pre ], [ %p1, %next ]")
    w.emit(f"  %more = icmp ult i64 %p0, {v['m']}")
    w.emit("  br i1 %more, label %panel, label %done")
    w.emit("panel:")
    left = w.tmp(f"sub i64 {v['m']}, %p0")
    short = w.tmp(f"icmp ult i64 {left}, {v['mb']}")
    v["rows"] = w.tmp(f"select i1 {short}, i64 {left}, i64 {v['mb']}")
    _gemm_panel(w, sp, lib, v)
    w.emit("epi:")
    st = _epilogue_call(w, sp, v, ptrs)
    bad = w.tmp(f"icmp ne i32 {st}, 0")
    w.emit(f"  br i1 {bad}, label %fail, label %next")
    w.emit("fail:")
    w.emit(f"  call void @free(ptr {v['scratch']})")
    code = w.tmp(f"add i32 {st}, {EPILOGUE_STATUS}")
    w.emit(f"  ret i32 {code}")
    w.emit("next:")
    w.emit(f"  %p1 = add i64 %p0, {v['mb']}")
    w.emit("  br label %loop")
    w.emit("done:")
    w.emit(f"  call void @free(ptr {v['scratch']})")
    w.emit("  ret i32 0")


def dense_ir(sp: DenseSpec, lib: Blas) -> str:
    """The entry's module (see the module docstring)."""
    ty, _, item = _TYPES[sp.dtype]
    it = f"i{lib.int_bits}"
    w = _Writer()
    m, k, n = _check_args(w, sp, item)
    ptrs = []
    for i in range(2 + len(sp.outer)):
        p = w.tmp(f"getelementptr inbounds ptr, ptr %ptrs, i64 {i}")
        ptrs.append(w.tmp(f"load ptr, ptr {p}"))
    v = {"m": m, "k": k, "n": n, "A": ptrs[0], "B": ptrs[1]}
    v["threads"] = w.tmp("load i64, ptr %ints")
    v["mb"], v["row_bytes"] = _panel_rows(w, sp, m, n, item)
    pb = w.tmp(f"mul i64 {v['mb']}, {v['row_bytes']}")
    small = w.tmp(f"icmp ult i64 {pb}, 64")
    alloc = w.tmp(f"select i1 {small}, i64 64, i64 {pb}")
    v["scratch"] = w.tmp(f"call ptr @malloc(i64 {alloc})")
    w.check(w.tmp(f"icmp ne ptr {v['scratch']}, null"), NO_MEMORY)
    n_rec = sum(2 + _inner_rank(a) for a in sp.inner)
    v["iptrs"] = w.tmp(f"alloca [{max(len(sp.inner), 1)} x ptr]")
    v["irecs"] = w.tmp(f"alloca [{max(n_rec, 1)} x i64]")
    v["iints"] = w.tmp(f"alloca [{len(sp.inner_dims) + 1} x i64]")
    _loop(w, sp, lib, v, ptrs)
    head = [
        f"declare void @{lib.symbol(sp.dtype)}(i32, i32, i32, {it}, {it}, {it}, {ty}, ptr, "
        f"{it}, ptr, {it}, {ty}, ptr, {it}) nounwind",
        f"declare i32 @{sp.epilogue}(ptr, ptr, ptr)",
        "declare ptr @malloc(i64)",
        "declare void @free(ptr)",
        "declare void @llvm.memset.p0.i64(ptr, i8, i64, i1)",
        f"define i32 @{sp.name}(ptr %ptrs, ptr %recs, ptr %ints) {{",
        "entry:",
    ]
    return "\n".join(head + w.lines + ["}"]) + "\n"
