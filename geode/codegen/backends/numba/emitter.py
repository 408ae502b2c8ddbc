"""The numba backend's emitter: one scheduled kernel -> the Python source of its
numba module (see the package docstring for the rules it follows).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from geode.codegen.ast import (
    Bin,
    Block,
    Buffer,
    Cast,
    Const,
    Expr,
    For,
    ForKind,
    If,
    Kernel,
    Load,
    Prefetch,
    Select,
    Stmt,
    Store,
    StreamStore,
    Un,
    Var,
    free_vars,
    substitute,
    transform,
    walk,
    walk_stmts,
)
from geode.codegen.backends.llvm.analysis import (
    NAN_GUARD,
    fold_consts,
    fold_int,
    guarded_registers,
    indexes_register,
    minmax_update,
    static_size,
)
from geode.codegen.backends.numba.helpers import (
    DEFAULT_FLAGS,
    FASTMATH_FLAGS,
    MAX_REGISTER_UNROLL,
    MAX_UNROLL,
    PREFETCH_HELPERS,
)
from geode.codegen.backends.numba.pysource import (
    ADD,
    ATOM,
    BAND,
    BIT_OPS,
    BOR,
    BXOR,
    CMP,
    CMP_OPS,
    FLOATS,
    LOGIC_OPS,
    MATH_UN,
    MUL,
    NOT,
    POW,
    PY_OPS,
    ROUND_UN,
    SINTS,
    TERNARY,
    UINTS,
    UNARY,
    Demote,
    Emitted,
    Names,
    Src,
    call_text,
    chunkable,
    dtype_name,
    float_for,
    has_parallel,
    is_weak,
    nb_scalar,
    np_ctor,
    paren,
    promote,
    shape_text,
)
from geode.codegen.backends.patterns import (
    cubic_parts,
    flat_index,
    is_const,
    one_plus_tanh_parts,
    product_factors,
    scaled_stage,
)
from geode.codegen.backends.vmath import VMATH, VMATH2, VMATH_IEEE
from geode.codegen.schedule import and_flags, conjuncts, line_aligned
from geode.errors import CodegenError


class _Emitter:
    def __init__(self, kernel: Kernel, fastmath: bool, parallel: bool, demoted: set[str]):
        self.k = kernel
        self.fastmath = fastmath
        self.parallel = parallel
        self.demoted = demoted
        self.names = Names()
        self.helpers: set[str] = set()
        #: the vmath functions called, by name, with their argument's dtype
        self.vmath: dict[str, str] = {}
        self.index_vars: set[str] = set(kernel.dims)
        for st in walk_stmts(kernel.body):
            if isinstance(st, For):
                self.index_vars.add(st.var)
            elif isinstance(st, Block):
                self.index_vars.update(iv.name for iv in st.iter_vars)
        self.lines: list[str] = []
        self.bufs: dict[str, Buffer] = {}
        self.roles: dict[str, str] = {}
        self.dtypes: dict[str, str] = {}
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
                self.dtypes[b.name] = dtype_name(
                    b.dtype, f"kernel {kernel.name!r} buffer {b.name!r}"
                )
        self.func_name = self.names.fresh(kernel.name)
        self.py: dict[str, str] = {}  # buffer -> python name
        self.reg_scalars: dict[tuple[str, tuple[int, ...]], str] = {}
        self.alloc_site: dict[str, int | None] = {}
        self.guarded = self.find_guarded()
        self.guard_names: dict[str, str] = {}  # register python name -> its NaN guard
        self.quiet_regs: set[str] = set()  # guarded registers of nan_insensitive buffers
        # loops being emitted, innermost last: where loop-invariant block bindings are
        # hoisted to (see binding)
        self.hoist_frames: list[_HoistFrame] = []
        self.n_hoisted = 0
        # dims-only min/max/floor-division terms (a chunk size such as
        # max(1, min(64, N // 8))) are computed once at the top of the kernel
        self.prologue_at: int | None = None
        self.dim_names: set[str] = set()
        self.dim_terms: dict[str, str] = {}
        self.in_dim_term: set[int] = set()  # ids of the terms being emitted
        self.n_comments = 0
        #: per enclosing For being printed: the guarded registers (python name, dtype) it
        #: updates (None for a prange loop, where updates stay exact)
        self.guard_frames: list[list[tuple[str, str]] | None] = []
        #: a streaming store ran outside any prange loop: fence at the end of the kernel
        self.fence_at_end = False
        #: ids of the non-temporal Stores printed as streaming stores in the body being
        #: printed (see plan_nontemporal)
        self.nt_on: set[int] = set()
        #: a chunked kernel's (chunk, chunks) parameter names (see "Chunked kernels")
        self.chunk_vars: tuple[str, str] | None = None

    # -- min/max reductions ----------------------------------------------------------
    def find_guarded(self) -> set[str]:
        """Scalar float registers that are only ever initialised or updated as
        ``R = max(R, v)`` (or ``min``): their updates print as the fast NaN-ignoring
        ``_g_maxnum_nn`` plus an integer NaN guard, and the loop holding the update is
        followed by ``if guard > bits(inf): R = nan`` (see
        :func:`~geode.codegen.backends.llvm.analysis.guarded_registers`, which both
        backends use)."""

        def candidate(name: str) -> bool:
            return (
                name in self.bufs
                and self.scope(name) == "register"
                and static_size(self.bufs[name]) == 1
                and self.dtypes[name] in NAN_GUARD
            )

        return guarded_registers(self.k.body, candidate)

    minmax_update = staticmethod(minmax_update)

    def where(self) -> str:
        return f"kernel {self.k.name!r}"

    def helper(self, name: str) -> str:
        self.helpers.add(name)
        return name

    def scope(self, name: str) -> str:
        b = self.bufs[name]
        if self.roles[name] != "temp":
            return "global"
        if b.scope == "register" and name not in self.demoted:
            return "register"
        return "local"

    def fold(self, e: Expr, env: dict[str, Expr]) -> Expr:
        """AST expression -> expression over Python names, constants folded."""

        def fn(x: Expr) -> Expr | None:
            if isinstance(x, Var):
                if x.name not in env:
                    raise CodegenError(f"{self.where()}: unbound variable {x.name!r}")
                return env[x.name]
            return None

        return fold_consts(transform(e, fn))

    # -- expressions ---------------------------------------------------------------
    def const(self, value: object, dtype: str) -> Src:
        if dtype == "bool":
            return Src("True" if value else "False", "bool", ATOM, bool(value))
        if dtype in SINTS or dtype in UINTS:
            iv = int(value)  # type: ignore[call-overload]
            if dtype == "int64":
                return Src(repr(iv), dtype, ATOM if iv >= 0 else UNARY, iv)
            return Src(f"np.{dtype}({iv})", dtype, ATOM, iv)
        typed = np.dtype(dtype).type(value)  # round to the constant's dtype
        fv = float(typed)
        if math.isnan(fv):
            text = "math.nan"
        elif math.isinf(fv):
            text = "math.inf" if fv > 0 else "-math.inf"
        else:
            text = repr(fv)
            short = str(typed)  # shortest digits that identify a float32/float16 value
            if (
                dtype != "float64"
                and np.float32(float(short)) == np.float32(fv)
                and len(short) < len(text)
            ):
                text = short if any(ch in short for ch in ".en") else short + ".0"
        if dtype == "float64":
            prec = UNARY if text.startswith("-") else ATOM
            return Src(text, dtype, prec, fv)
        return Src(f"np.float32({text})", dtype, ATOM, fv)

    def convert(self, v: Src, to: str) -> Src:
        """``v`` converted to dtype ``to`` (numpy ``astype`` semantics)."""
        fr = v.dtype
        if fr == to:
            return v
        if v.literal is not None and not (
            to in (*SINTS, *UINTS) and isinstance(v.literal, float) and not math.isfinite(v.literal)
        ):
            return self.const(v.literal, to)  # a typed literal instead of a conversion call
        if to == "bool":
            return Src(f"{paren(v, CMP + 1)} != 0", "bool", CMP)
        if to == "float16":
            if fr == "float32" or fr == "float64":
                return Src(call_text(self.helper("_g_rh"), v), to, ATOM)
            if fr == "float16":  # pragma: no cover - handled by fr == to
                return v
            return Src(call_text(self.helper("_g_rh"), call_text("np.float64", v)), to, ATOM)
        if fr == "float16" and to == "float32":
            return Src(v.code, to, v.prec)  # carrier is already float32
        return Src(call_text(np_ctor(to), v), to, ATOM)

    def wrap(self, code: str, prec: int, dtype: str) -> Src:
        """A numba int64/float32 result brought back to ``dtype``."""
        if dtype in ("int64", "float32", "float64", "bool"):
            return Src(code, dtype, prec)
        if dtype == "float16":
            return Src(f"{self.helper('_g_rh')}({code})", dtype, ATOM)
        return Src(f"np.{dtype}({code})", dtype, ATOM)

    def ex(self, e: Expr) -> Src:
        if isinstance(e, Const):
            return self.const(e.value, dtype_name(e.dtype, f"{self.where()} constant"))
        if isinstance(e, Var):
            return Src(e.name, "int64", ATOM)
        if isinstance(e, Load):
            return self.load(e)
        if isinstance(e, Cast):
            return self.convert(self.ex(e.a), dtype_name(e.dtype, f"{self.where()} cast"))
        if isinstance(e, Select):
            c = self.convert(self.ex(e.cond), "bool")
            t, f = self.ex(e.t), self.ex(e.f)
            r = promote(t.dtype, is_weak(e.t, t), f.dtype, is_weak(e.f, f))
            t, f = self.convert(t, r), self.convert(f, r)
            code = f"{paren(t, TERNARY + 1)} if {paren(c, TERNARY + 1)} else {paren(f, TERNARY)}"
            return Src(code, r, TERNARY)
        if isinstance(e, Un):
            return self.unary(e)
        if isinstance(e, Bin):
            return self.binary(e)
        raise CodegenError(f"{self.where()}: unknown expression {e!r}")

    def index_codes(self, indices: tuple[Expr, ...]) -> list[str]:
        out = []
        for i in indices:
            v = self.ex(i)
            if v.dtype not in SINTS and v.dtype not in UINTS:
                raise CodegenError(f"{self.where()}: index {i!r} has dtype {v.dtype}")
            out.append(v.code)
        return out

    def subscript(self, name: str, indices: tuple[Expr, ...]) -> str:
        b = self.bufs[name]
        if len(indices) != len(b.shape):
            raise CodegenError(
                f"{self.where()}: buffer {name!r} has rank {len(b.shape)} but is "
                f"indexed with {len(indices)} indices"
            )
        py = self.py[name]
        if not indices:
            return f"{py}[0]"  # 0-d buffers are 1-element arrays
        return f"{py}[{', '.join(self.index_codes(indices))}]"

    def register_name(self, name: str, indices: tuple[Expr, ...]) -> str:
        b = self.bufs[name]
        consts = [fold_int(i) for i in indices]
        if any(c is None for c in consts):
            raise Demote(name)
        idx = tuple(c for c in consts if c is not None)
        if len(idx) != len(b.shape):
            raise CodegenError(f"{self.where()}: register {name!r} indexed with {len(idx)} indices")
        key = (name, ()) if static_size(b) == 1 else (name, idx)
        if key not in self.reg_scalars:
            label = name if not key[1] else name + "_" + "_".join(str(i) for i in idx)
            self.reg_scalars[key] = self.names.fresh(label)
        return self.reg_scalars[key]

    def load(self, e: Load) -> Src:
        if e.buffer not in self.bufs:
            raise CodegenError(f"{self.where()}: load of unknown buffer {e.buffer!r}")
        dt = self.dtypes[e.buffer]
        sc = self.scope(e.buffer)
        if sc == "register":
            return Src(self.register_name(e.buffer, e.indices), dt, ATOM)
        sub = self.subscript(e.buffer, e.indices)
        if dt == "float16" and sc == "global":
            return Src(f"{self.helper('_g_h2f')}({sub})", dt, ATOM)
        return Src(sub, dt, ATOM)

    def unary(self, e: Un) -> Src:
        op = e.op
        a = self.ex(e.a)
        dt = a.dtype
        isf = dt in FLOATS
        if op == "neg":
            if dt == "bool":
                raise CodegenError(f"{self.where()}: neg of a bool")
            if isf:
                return Src(f"-{paren(a, UNARY + 1)}", dt, UNARY)
            return self.wrap(f"-{paren(a, UNARY + 1)}", UNARY, dt)
        if op == "not":
            if dt != "bool":
                return Src(f"{paren(a, CMP + 1)} == 0", "bool", CMP)
            return Src(f"not {paren(a, NOT)}", "bool", NOT)
        if op == "bitnot":
            if dt == "bool":
                return Src(f"not {paren(a, NOT)}", "bool", NOT)
            if isf:
                raise CodegenError(f"{self.where()}: bitnot of {dt}")
            return self.wrap(f"~{paren(a, UNARY)}", UNARY, dt)
        if op == "fence":  # numba's fast-math flags are per function: nothing to fence
            return a
        if op == "abs":
            if dt == "bool" or dt in UINTS:
                return a
            if isf:
                return Src(call_text("abs", a), dt, ATOM)
            return self.wrap(call_text("abs", a), ATOM, dt)
        if op == "sigmoid":
            fdt = float_for(dt)
            x = self.convert(a, fdt)
            fn = self.vmath_fn(op, fdt)
            if fn is not None:
                return self.call_vmath(fn, x, fdt)
            one = f"np.{fdt}(1.0)"
            return self.wrap(f"{one} / ({one} + math.exp(-{paren(x, UNARY)}))", MUL, fdt)
        if op in MATH_UN:
            fdt = float_for(dt)
            x = self.convert(a, fdt)
            fn = self.vmath_fn(op, fdt)
            if fn is not None:  # vectorizable implementation (no libm call in the loop)
                return self.call_vmath(fn, x, fdt)
            return self.wrap(call_text(MATH_UN[op], x), ATOM, fdt)
        if op in ROUND_UN:
            if not isf:
                return a
            # floor/ceil/rint of a float16 value is a float16 value: no rounding
            return Src(call_text(ROUND_UN[op], a), dt, ATOM)
        if op == "sign":
            if dt == "bool":
                return a
            if isf:
                one = self.const(1.0, dt)
                return Src(call_text(self.helper("_g_fsign"), a, one), dt, ATOM)
            if dt in UINTS:
                return self.convert(Src(f"{paren(a, CMP + 1)} != 0", "bool", CMP), dt)
            return self.wrap(call_text(self.helper("_g_isign"), self.convert(a, "int64")), ATOM, dt)
        if op in ("isnan", "isinf", "isposinf", "isneginf"):
            if not isf:
                return Src("False", "bool", ATOM)
            if op == "isnan":
                return Src(call_text("math.isnan", a), "bool", ATOM)
            if op == "isinf":
                return Src(call_text("math.isinf", a), "bool", ATOM)
            inf = "math.inf" if op == "isposinf" else "-math.inf"
            return Src(f"{paren(a, CMP + 1)} == {inf}", "bool", CMP)
        raise CodegenError(f"{self.where()}: unknown unary op {op!r}")

    def call_vmath(self, fn: Callable, x: Src, dtype: str) -> Src:
        """A call of the vmath function ``fn`` on ``x`` (already ``dtype``), recorded so the
        module imports it and the backend compiles it before the kernel."""
        self.vmath[fn.__name__] = dtype
        return self.wrap(call_text(fn.__name__, x), ATOM, dtype)

    def vmath_fn(self, op: str, dtype: str) -> Callable | None:
        """The vmath function for ``op``: the variant without a final NaN test when the
        kernel is compiled without ``nnan`` (NaN propagates through its arithmetic)."""
        if not self.fastmath and (op, dtype) in VMATH_IEEE:
            return VMATH_IEEE[op, dtype]
        return VMATH.get((op, dtype))

    def is_index(self, e: Expr) -> bool:
        """A non-negative index expression: loop/iteration variables, dims, non-negative
        constants, and + * // % of them (a zero divisor only occurs in empty loops)."""
        if isinstance(e, Const):
            return e.dtype == "int64" and int(e.value) >= 0
        if isinstance(e, Var):
            return e.name in self.index_vars
        if isinstance(e, Bin) and e.op in ("+", "*", "//", "%"):
            return self.is_index(e.a) and self.is_index(e.b)
        return False

    def one_plus_tanh(self, e: Bin) -> Src | None:
        """``1 + tanh(z)`` (either order) as ``one_plus_tanh`` (``2 / (1 + exp(-2z))``): cheaper,
        and accurate where adding 1 to tanh cancels (z < 0); float32/float64 only, and only
        when the sum keeps z's float dtype."""
        parts = one_plus_tanh_parts(e)
        if parts is None:
            return None
        one, tanh = parts
        z = self.ex(tanh.a)
        fdt = float_for(z.dtype)
        fn = VMATH.get(("one_plus_tanh", fdt))
        if fn is None or not self.keeps_dtype(one, fdt):
            return None
        return self.call_vmath(fn, self.convert(z, fdt), fdt)

    def keeps_dtype(self, c: Const, dtype: str) -> bool:
        """Whether constant ``c`` combined with a ``dtype`` value leaves the result ``dtype``."""
        cv = self.ex(c)
        return promote(dtype, False, cv.dtype, is_weak(c, cv)) == dtype

    def tanh_gate(self, e: Bin) -> Src | None:
        """``0.5 * a * (1 + tanh(z))`` (one product of those factors, in any order and
        grouping; ``a`` may be a product of several) as vmath's ``div_one_plus_exp(a, t)``
        = ``a / (1 + exp(t))`` with ``t = -2z``: the tanh GELU's gate, whose halving and
        product fold into the one division (two multiplies fewer than ``0.5 * a *
        one_plus_tanh(z)``, and more accurate). The GELU's ``z = c * (h + k * h * h * h)``
        becomes ``t = h * (-2c + (-2ck) * (h * h))``: three multiply-adds instead of four
        (the policy allows reassociation). float32/float64 only, and only when every
        factor has z's dtype (the constants may be weak)."""
        if e.op != "*":
            return None
        factors = product_factors(e)
        half = next((i for i, f in enumerate(factors) if is_const(f, 0.5)), None)
        gate = next((i for i, f in enumerate(factors) if one_plus_tanh_parts(f)), None)
        if half is None or gate is None or len(factors) < 3:
            return None
        one, tanh = one_plus_tanh_parts(factors[gate])  # type: ignore[misc]
        z = self.ex(tanh.a)
        dt = z.dtype
        fn = VMATH2.get(("div_one_plus_exp", dt))
        if fn is None or not all(self.keeps_dtype(c, dt) for c in (one, factors[half])):
            return None
        a: Src | None = None
        for f in (f for i, f in enumerate(factors) if i not in (half, gate)):
            v = self.ex(f)
            if v.dtype != dt and not (isinstance(f, Const) and self.keeps_dtype(f, dt)):
                return None
            v = self.convert(v, dt)
            a = v if a is None else self.wrap(f"{paren(a, MUL)} * {paren(v, MUL + 1)}", MUL, dt)
        assert a is not None  # three factors or more
        t = self.gelu_cubic(tanh.a, dt) or self.wrap(
            f"{self.const(-2.0, dt).code} * {paren(z, MUL + 1)}", MUL, dt
        )
        self.vmath[fn.__name__] = dt
        return self.wrap(call_text(fn.__name__, a, t), ATOM, dt)

    def gelu_cubic(self, z: Expr, dtype: str) -> Src | None:
        """``-2z`` for ``z = c * (h + k * h * h * h)`` (constants ``c``, ``k`` that keep
        ``dtype``, ``h`` of ``dtype``; any grouping) as ``h * (-2c + (-2ck) * (h * h))``,
        the constants folded in float64 and rounded once; None for any other ``z``."""
        m = cubic_parts(z)
        if m is None:
            return None
        h, c, k = m
        hv = self.ex(h)
        if hv.dtype != dtype or not (self.keeps_dtype(c, dtype) and self.keeps_dtype(k, dtype)):
            return None
        cv, kv = float(c.value), float(k.value)  # type: ignore[arg-type]
        c0, c2 = self.const(-2.0 * cv, dtype), self.const(-2.0 * cv * kv, dtype)
        h2 = self.wrap(f"{paren(hv, MUL)} * {paren(hv, MUL + 1)}", MUL, dtype)
        q = self.wrap(f"{c0.code} + {c2.code} * {paren(h2, MUL + 1)}", ADD, dtype)
        return self.wrap(f"{paren(hv, MUL)} * {paren(q, MUL + 1)}", MUL, dtype)

    def dim_term(self, e: Bin) -> Src | None:
        """A ``min``/``max``/``//``/``%`` of dims only (no loop variable, no load), emitted once
        at the top of the kernel and referred to by name (the active loops' hoisting
        positions move down by the inserted line)."""
        if (
            self.prologue_at is None
            or id(e) in self.in_dim_term
            or e.op not in ("min", "max", "//", "%")
        ):
            return None
        used = free_vars(e)
        if not used or not used <= self.dim_names or any(isinstance(x, Load) for x in walk(e)):
            return None
        self.in_dim_term.add(id(e))
        try:
            v = self.binary(e)  # its own dims-only terms are hoisted first
        finally:
            self.in_dim_term.discard(id(e))
        if v.dtype != "int64":
            return None
        if v.code not in self.dim_terms:
            name = self.names.fresh("_d")
            self.dim_terms[v.code] = name
            self.lines.insert(self.prologue_at, f"    {name} = {v.code}")
            self.prologue_at += 1
            self.n_hoisted += 1
            for frame in self.hoist_frames:
                frame.at += 1
        return Src(self.dim_terms[v.code], "int64", ATOM)

    def binary(self, e: Bin) -> Src:
        op = e.op
        fused = self.tanh_gate(e) or self.one_plus_tanh(e)
        if fused is not None:
            return fused
        term = self.dim_term(e)
        if term is not None:
            return term
        a, b = self.ex(e.a), self.ex(e.b)
        if op in LOGIC_OPS:
            sym, prec = LOGIC_OPS[op]
            a, b = self.convert(a, "bool"), self.convert(b, "bool")
            return Src(f"{paren(a, prec)} {sym} {paren(b, prec + 1)}", "bool", prec)
        r = promote(a.dtype, is_weak(e.a, a), b.dtype, is_weak(e.b, b))
        a, b = self.convert(a, r), self.convert(b, r)
        isf = r in FLOATS
        if op in CMP_OPS:
            return Src(f"{paren(a, CMP + 1)} {op} {paren(b, CMP + 1)}", "bool", CMP)
        if r == "bool":
            return self.bool_binary(op, a, b)
        if op in PY_OPS and (isf or op in ("+", "-", "*")):
            sym, prec = PY_OPS[op]
            return self.wrap(f"{paren(a, prec)} {sym} {paren(b, prec + 1)}", prec, r)
        if op in ("/", "//", "%", "fmod"):
            if isf:  # op == "fmod"
                return self.wrap(call_text("np.fmod", a, b), ATOM, r)
            if op in ("//", "%") and (
                (isinstance(b.literal, int) and b.literal > 0)
                or (self.is_index(e.a) and self.is_index(e.b))
            ):
                # index arithmetic: Python's // and % are floor/mod, exact for a divisor > 0
                sym, prec = PY_OPS[op]
                return self.wrap(f"{paren(a, prec)} {sym} {paren(b, prec + 1)}", prec, r)
            if r in UINTS:
                fn = "_g_udiv" if op in ("/", "//") else "_g_umod"
                code = call_text(
                    self.helper(fn), self.convert(a, "uint64"), self.convert(b, "uint64")
                )
            else:
                fn = {"/": "_g_tdiv", "//": "_g_fdiv", "%": "_g_mod", "fmod": "_g_fmodi"}[op]
                code = call_text(
                    self.helper(fn), self.convert(a, "int64"), self.convert(b, "int64")
                )
            return self.wrap(code, ATOM, r)
        if op in ("min", "max"):
            if isf and r in ("float32", "float64"):
                return self.wrap(call_text(self.helper("_g_" + op + "imum"), a, b), ATOM, r)
            if isf:
                return self.wrap(call_text(self.helper("_g_f" + op), a, b), ATOM, r)
            return Src(call_text(op, a, b), r, ATOM)
        if op == "pow":
            if isf:
                return self.wrap(f"{paren(a, ATOM)} ** {paren(b, ATOM)}", POW, r)
            if r in UINTS:
                code = call_text(
                    self.helper("_g_upow"), self.convert(a, "uint64"), self.convert(b, "uint64")
                )
            else:
                code = call_text(
                    self.helper("_g_ipow"), self.convert(a, "int64"), self.convert(b, "int64")
                )
            return self.wrap(code, ATOM, r)
        if op in BIT_OPS:
            if isf:
                raise CodegenError(f"{self.where()}: {op} of {r}")
            sym, prec = BIT_OPS[op]
            return self.wrap(f"{paren(a, prec)} {sym} {paren(b, prec + 1)}", prec, r)
        if op in ("shl", "shr"):
            if isf:
                raise CodegenError(f"{self.where()}: {op} of {r}")
            nbits = str(np.dtype(r).itemsize * 8)
            if r in UINTS:
                fn = "_g_ushl" if op == "shl" else "_g_ushr"
                code = call_text(
                    self.helper(fn), self.convert(a, "uint64"), self.convert(b, "uint64"), nbits
                )
            else:
                fn = "_g_shl" if op == "shl" else "_g_shr"
                code = call_text(
                    self.helper(fn), self.convert(a, "int64"), self.convert(b, "int64"), nbits
                )
            return self.wrap(code, ATOM, r)
        raise CodegenError(f"{self.where()}: unknown binary op {op!r}")

    def bool_binary(self, op: str, a: Src, b: Src) -> Src:
        table = {
            "+": ("|", BOR),
            "*": ("&", BAND),
            "min": ("&", BAND),
            "max": ("|", BOR),
            "bitand": ("&", BAND),
            "bitor": ("|", BOR),
            "bitxor": ("^", BXOR),
        }
        if op not in table:
            raise CodegenError(f"{self.where()}: {op} of bool operands")
        sym, prec = table[op]
        return Src(f"{paren(a, prec)} {sym} {paren(b, prec + 1)}", "bool", prec)

    # -- statements ----------------------------------------------------------------
    def emit(self, line: str, ind: int) -> None:
        self.lines.append("    " * ind + line)

    def stmts(self, body: list[Stmt], env: dict[str, Expr], ind: int, in_prange: bool) -> None:
        i = 0
        while i < len(body):
            if i + 1 < len(body) and self.scaled_stream(body[i], body[i + 1], env, ind, in_prange):
                i += 2
                continue
            self.stmt(body[i], env, ind, in_prange)
            i += 1

    def scaled_stream(
        self, f: Stmt, ss: Stmt, env: dict[str, Expr], ind: int, in_prange: bool
    ) -> bool:
        """Emit a staged chunk and its stream as one ``_g_stream_scaled`` when the chunk loop
        ``f`` only stages ``buf[... + j] * s`` (or ``s * buf[...]``; ``buf[...] / s`` as one
        ``_g_stream_divided``, an IEEE division per element) for its variable ``j``, ``buf`` a local buffer read at unit stride in ``j``, ``s`` fixed
        for the chunk, all of the output's float dtype, and ``ss`` streams exactly that
        stage: the products go from registers to the output, without the stage's store and
        load per element. Returns whether it did (nothing is emitted otherwise)."""
        m = scaled_stage(f, ss)
        if m is None:
            return False
        assert isinstance(f, For) and isinstance(ss, StreamStore)
        load, scale, divide = m
        names = (ss.buffer, ss.src, load.buffer)
        if not all(x in self.bufs for x in names) or self.roles.get(ss.buffer) != "output":
            return False
        if self.scope(ss.src) != "local" or self.scope(load.buffer) != "local":
            return False
        dt = self.dtypes[ss.buffer]
        if dt not in ("float32", "float64") or any(self.dtypes[x] != dt for x in names):
            return False
        n = fold_int(self.fold(f.extent, env))
        if (
            n is None
            or n != fold_int(self.fold(ss.length, env))
            or fold_int(self.fold(ss.src_offset, env)) != 0
        ):
            return False
        sv = self.ex(self.fold(scale, env))
        if promote(dt, False, sv.dtype, is_weak(scale, sv)) != dt:
            return False
        sv = self.convert(sv, dt)
        start = [substitute(x, {f.var: Const(0)}) for x in load.indices]
        src_off = flat_index(start, self.bufs[load.buffer].shape)
        direct = StreamStore(ss.buffer, ss.offset, load.buffer, src_off, Const(n), ss.nontemporal)
        helper = "_g_stream_divided" if divide else "_g_stream_scaled"
        self.emit_stream(direct, helper, sv.code, env, ind, in_prange)
        return True

    def emit_stream(
        self,
        s: StreamStore,
        helper: str,
        extra: str | None,
        env: dict[str, Expr],
        ind: int,
        in_prange: bool,
    ) -> None:
        """Emit ``helper(dst, offset, src, src_offset, length, nontemporal[, extra])`` for
        stream ``s``; the thread fences its streaming stores at the end of its parallel
        iteration (or of the kernel), see :meth:`loop` and :meth:`run`."""
        off, soff, n = (
            self.convert(self.ex(self.fold(e, env)), "int64").code
            for e in (s.offset, s.src_offset, s.length)
        )
        nt = self.convert(self.ex(self.fold(s.nontemporal, env)), "bool").code
        tail = "" if extra is None else f", {extra}"
        self.emit(
            f"{self.helper(helper)}({self.py[s.buffer]}, {off}, {self.py[s.src]}, "
            f"{soff}, {n}, {nt}{tail})",
            ind,
        )
        if not in_prange:
            self.fence_at_end = True

    def stmt(self, s: Stmt, env: dict[str, Expr], ind: int, in_prange: bool) -> None:
        if isinstance(s, For):
            self.for_(s, env, ind, in_prange)
        elif isinstance(s, Block):
            self.block(s, env, ind, in_prange)
        elif isinstance(s, If):
            cond = self.convert(self.ex(self.fold(s.cond, env)), "bool")
            if cond.code == "True":
                self.stmts(s.body, env, ind, in_prange)
            elif cond.code != "False":
                self.emit(f"if {cond.code}:", ind)
                self.body(s.body, env, ind + 1, in_prange)
        elif isinstance(s, Store):
            self.store(s, env, ind, in_prange)
        elif isinstance(s, Prefetch):
            if s.buffer not in self.bufs or self.scope(s.buffer) != "global":
                raise CodegenError(f"{self.where()}: prefetch of non-argument {s.buffer!r}")
            if s.level not in PREFETCH_HELPERS:
                raise CodegenError(f"{self.where()}: prefetch to cache level {s.level!r}")
            off = self.convert(self.ex(self.fold(s.offset, env)), "int64")
            fn = self.helper(PREFETCH_HELPERS[s.level])
            self.emit(f"{fn}({self.py[s.buffer]}, {off.code})", ind)
        elif isinstance(s, StreamStore):
            self.stream_store(s, env, ind, in_prange)
        else:
            raise CodegenError(f"{self.where()}: unknown statement {type(s).__name__}")

    def stream_store(self, s: StreamStore, env: dict[str, Expr], ind: int, in_prange: bool) -> None:
        """``_g_stream(dst, offset, src, src_offset, length, nontemporal)`` (see
        :meth:`emit_stream`)."""
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
        self.emit_stream(s, "_g_stream", None, env, ind, in_prange)

    def body(self, body: list[Stmt], env: dict[str, Expr], ind: int, in_prange: bool) -> None:
        n = self.emitted()
        self.stmts(body, env, ind, in_prange)
        if self.emitted() == n:
            self.emit("pass", ind)

    def emitted(self) -> int:
        """Statements emitted in place so far (comments and bindings hoisted above a loop
        not counted): a body that gained none needs a ``pass``."""
        return len(self.lines) - self.n_hoisted - self.n_comments

    def for_(self, s: For, env: dict[str, Expr], ind: int, in_prange: bool) -> None:
        ext = self.fold(s.extent, env)
        n = fold_int(ext)
        prange = s.kind == ForKind.PARALLEL and self.parallel and not in_prange
        unroll = (
            n is not None
            and not self.holds_nt(s)
            and (
                (s.kind == ForKind.UNROLLED and n <= MAX_UNROLL)
                or (
                    s.kind != ForKind.PARALLEL
                    and n <= MAX_REGISTER_UNROLL
                    and self.indexes_register(s)
                )
            )
        )
        self.guard_frames.append(None if prange else [])
        try:
            self.loop(s, env, ind, in_prange, prange, unroll, n, ext)
        finally:
            frame = self.guard_frames.pop()
        for name, dt in frame or []:  # NaN seen in the loop -> the result is NaN
            if name in self.quiet_regs:  # any value will do when the row held a NaN
                self.emit(f"{name} = {self.helper('_g_freeze')}({name})", ind)
                continue
            gty, inf_bits = NAN_GUARD[dt]
            self.emit(f"if {self.guard_names[name]} > np.{gty}({inf_bits}):", ind)
            self.emit(f"{name} = np.{dt}(np.nan)", ind + 1)

    def nt_stores(self, s: For) -> list[tuple[Block, Store]]:
        """The non-temporal stores (:meth:`Schedule.store_nontemporal`) of the blocks directly
        in loop ``s``, when every statement there is a flat block without predicate that
        stores to no register; else none. A non-temporal store not found here prints as an
        ordinary store."""
        found: list[tuple[Block, Store]] = []
        for b in s.body:
            if (
                not isinstance(b, Block)
                or b.predicate is not None
                or any(isinstance(x, (For, Block)) for x in walk_stmts(b.body))
            ):
                return []
            for st in walk_stmts(b.body):
                if (
                    isinstance(st, Store)
                    and st.buffer in self.bufs
                    and self.scope(st.buffer) == "register"
                ):
                    return []
                if isinstance(st, Store) and st.nontemporal is not None:
                    found.append((b, st))
        return found

    def holds_nt(self, s: For) -> bool:
        """Whether loop ``s`` holds a store printed as a streaming one (see
        :meth:`plan_nontemporal`): it is then printed as a loop, never unrolled."""
        return bool(self.nt_on) and any(id(x) in self.nt_on for x in walk_stmts(s.body))

    def plan_nontemporal(self) -> tuple[set[int], Expr, list[str]]:
        """The non-temporal stores a chunked kernel's streaming body prints as streaming
        stores, the condition (over dims) under which that body runs, and the outputs
        whose arrays must start on a vector boundary for it (see "Chunked kernels").

        A store counts when it sits in a flat block directly in a vectorized loop ``L``
        (:meth:`nt_stores`) and every run of ``L`` starts on a cache line of the output:
        checked here again on the AST being printed (``line_aligned`` of the run's first
        element, tested at run time for symbolic shapes), whatever the schedule did after
        marking the store. Its flag joins the condition."""
        ids: set[int] = set()
        cond: Expr = Const(True, "bool")
        outs: list[str] = []
        dims = set(self.k.dims)
        for f in walk_stmts(self.k.body):
            if not isinstance(f, For) or f.kind is not ForKind.VECTORIZED:
                continue
            for b, st in self.nt_stores(f):
                dt = self.dtypes.get(st.buffer)
                if self.roles.get(st.buffer) != "output" or dt not in ("float32", "float64"):
                    raise CodegenError(
                        f"{self.where()}: non-temporal store to {st.buffer!r}, which is not "
                        f"a float32/float64 output"
                    )
                binds = {iv.name: x for iv, x in zip(b.iter_vars, b.bindings)}
                start = [substitute(substitute(i, binds), {f.var: Const(0)}) for i in st.indices]
                first = flat_index(start, self.bufs[st.buffer].shape)
                assert st.nontemporal is not None
                flag = and_flags(st.nontemporal, line_aligned(first, np.dtype(dt).itemsize, dims))
                if flag == Const(False, "bool"):
                    continue
                ids.add(id(st))
                cond = and_flags(cond, flag)
                if st.buffer not in outs:
                    outs.append(st.buffer)
        return ids, cond, outs

    def loop(
        self,
        s: For,
        env: dict[str, Expr],
        ind: int,
        in_prange: bool,
        prange: bool,
        unroll: bool,
        n: int | None,
        ext: Expr,
    ) -> None:
        if unroll:
            assert n is not None
            for k in range(n):
                self.stmts(s.body, {**env, s.var: Const(k)}, ind, in_prange)
            return
        v = self.ex(ext)
        if v.dtype not in SINTS and v.dtype not in UINTS:
            raise CodegenError(f"{self.where()}: loop {s.var!r} has extent of dtype {v.dtype}")
        var = self.names.fresh(s.var)
        frame = _HoistFrame(len(self.lines), ind, {var}, prange)
        chunked = prange and self.chunk_vars is not None
        if chunked:
            per_chunk = self.chunk_range(s, v, var, env, ind)
            frame.at = len(self.lines) - 1
        else:
            self.emit(f"for {var} in {'numba.prange' if prange else 'range'}({v.code}):", ind)
        inner = {**env, s.var: Var(var)}
        n_before = self.emitted()
        if prange and not (chunked and per_chunk):
            self.allocations(id(s), inner, ind + 1)
        self.hoist_frames.append(frame)
        try:
            self.stmts(s.body, inner, ind + 1, in_prange or prange)
        finally:
            self.hoist_frames.pop()
        # streamed stores must be fenced before the thread that made them finishes: once
        # after a chunk's share of the loop, or in every iteration of a prange (numba's
        # workers run the iterations). A fence per row cost softmax over rows of 128
        # floats half its time.
        streams = prange and any(
            isinstance(x, StreamStore) or (isinstance(x, Store) and id(x) in self.nt_on)
            for x in walk_stmts(s.body)
        )
        if streams and not chunked:
            self.emit(f"{self.helper('_g_sfence')}()", ind + 1)
        if self.emitted() == n_before:
            self.emit("pass", ind + 1)
        if streams and chunked:
            self.emit(f"{self.helper('_g_sfence')}()", ind)

    def chunk_range(self, s: For, ext: Src, var: str, env: dict[str, Expr], ind: int) -> bool:
        """The loop header of a chunked kernel's parallel loop: this chunk's share of
        its iterations (nothing to do for an empty share), then the temps private to an
        iteration, allocated once per chunk (as numba hoists them into each thread's
        share of a prange) unless a shape depends on the loop variable, then the
        ``for``. Returns whether the temps were allocated here."""
        assert self.chunk_vars is not None
        c, cs = self.chunk_vars
        e = paren(ext, MUL)
        lo, hi = self.names.fresh(f"{var}_lo"), self.names.fresh(f"{var}_hi")
        self.emit(f"{lo} = {e} * {c} // {cs}", ind)
        self.emit(f"{hi} = {e} * ({c} + 1) // {cs}", ind)
        self.emit(f"if {lo} >= {hi}:", ind)
        self.emit("return", ind + 1)
        per_chunk = not any(
            s.var in free_vars(d)
            for name, site in self.alloc_site.items()
            if site == id(s)
            for d in self.bufs[name].shape
        )
        if per_chunk:
            self.allocations(id(s), env, ind)
        self.emit(f"for {var} in range({lo}, {hi}):", ind)
        return per_chunk

    def indexes_register(self, loop: For) -> bool:
        """Does the loop body index a multi-element register buffer with ``loop.var``?"""
        regs = {
            n for n, b in self.bufs.items() if self.scope(n) == "register" and static_size(b) != 1
        }
        return indexes_register(loop, regs)

    def block(self, s: Block, env: dict[str, Expr], ind: int, in_prange: bool) -> None:
        if len(s.iter_vars) != len(s.bindings):
            raise CodegenError(
                f"{self.where()}: block {s.name!r} binds {len(s.bindings)} "
                f"expressions to {len(s.iter_vars)} iteration variables"
            )
        self.emit(f"# block {s.name}", ind)
        self.n_comments += 1
        inner = dict(env)
        for iv, bind in zip(s.iter_vars, s.bindings):
            e = self.fold(bind, env)
            if isinstance(e, (Const, Var)):
                inner[iv.name] = e
            else:
                inner[iv.name] = Var(self.binding(iv.name, e, ind))
        if s.predicate is not None:
            cond = self.convert(self.ex(self.fold(s.predicate, inner)), "bool")
            if cond.code == "False":
                return
            if cond.code != "True":
                self.emit(f"if {cond.code}:", ind)
                self.body(s.body, inner, ind + 1, in_prange)
                return
        self.stmts(s.body, inner, ind, in_prange)

    def binding(self, iv: str, e: Expr, ind: int) -> str:
        """Emit iteration variable ``iv = e`` (``e`` folded to Python names) and return its
        name. A load-free ``e`` that uses nothing the innermost serial loop defines is
        computed once before that loop instead (once per distinct expression), so row
        indices of a row's passes are not recomputed per element; index arithmetic never
        faults (the division helpers return 0 for a zero divisor), so computing it when
        the loop runs no iteration is harmless."""
        n = self.emitted()
        v = self.ex(e)
        frame = self.hoist_frames[-1] if self.hoist_frames else None
        if (
            frame is None
            or frame.prange
            or self.emitted() != n
            or any(isinstance(x, Load) for x in walk(e))
            or free_vars(e) & frame.defined
        ):
            name = self.names.fresh(iv)
            self.emit(f"{name} = {v.code}", ind)
            if frame is not None:
                frame.defined.add(name)
            return name
        if v.code not in frame.cse:
            frame.cse[v.code] = self.names.fresh(iv)
            self.lines.insert(frame.at, "    " * frame.ind + f"{frame.cse[v.code]} = {v.code}")
            frame.at += 1
            self.n_hoisted += 1
        return frame.cse[v.code]

    def store(self, s: Store, env: dict[str, Expr], ind: int, in_prange: bool) -> None:
        if s.buffer not in self.bufs:
            raise CodegenError(f"{self.where()}: store to unknown buffer {s.buffer!r}")
        if self.roles[s.buffer] == "input":
            raise CodegenError(f"{self.where()}: store to input buffer {s.buffer!r}")
        dt = self.dtypes[s.buffer]
        sc = self.scope(s.buffer)
        indices = tuple(self.fold(i, env) for i in s.indices)
        if sc == "register" and s.buffer in self.guarded:
            self.guarded_store(s, env, ind, dt, indices)
            return
        value = self.ex(self.fold(s.value, env))
        if sc == "register":
            name = self.register_name(s.buffer, indices)
            self.emit(f"{name} = {self.convert(value, dt).code}", ind)
            return
        if id(s) in self.nt_on:  # the streaming body (see plan_nontemporal)
            off = self.ex(self.fold(flat_index(s.indices, self.bufs[s.buffer].shape), env))
            code = self.convert(value, dt).code
            self.emit(f"{self.helper('_g_ntstore')}({self.py[s.buffer]}, {off.code}, {code})", ind)
            self.fence_at_end = self.fence_at_end or not in_prange  # else fenced per chunk
            return
        target = self.subscript(s.buffer, indices)
        if dt == "float16" and sc == "global":
            if value.dtype not in ("float32", "float64", "float16"):
                value = self.convert(value, "float16")
            code = call_text(self.helper("_g_f2h"), value)
        else:
            code = self.convert(value, dt).code
        self.emit(f"{target} = {code}", ind)

    def guarded_store(
        self, s: Store, env: dict[str, Expr], ind: int, dt: str, indices: tuple[Expr, ...]
    ) -> None:
        """A store to a register of :meth:`find_guarded` (see there)."""
        name = self.register_name(s.buffer, indices)
        upd = self.minmax_update(s)
        frame = self.guard_frames[-1] if self.guard_frames else None
        gty, _ = NAN_GUARD[dt]
        quiet = self.bufs[s.buffer].nan_insensitive  # no guard: see geode.codegen.nan_flow
        if upd and frame is not None and name in self.guard_names:
            op, other = upd
            v = self.convert(self.ex(self.fold(other, env)), dt)
            tmp = self.names.fresh(name + "_v")
            guard = self.guard_names[name]
            fn = self.helper("_g_maxnum_nn" if op == "max" else "_g_minnum_nn")
            self.emit(f"{tmp} = {v.code}", ind)
            self.emit(f"{name} = {fn}({name}, {tmp})", ind)
            if not quiet:
                self.emit(f"{guard} = {self.helper('_g_nanguard')}({guard}, {tmp})", ind)
            if (name, dt) not in frame:
                frame.append((name, dt))
            return
        value = self.convert(self.ex(self.fold(s.value, env)), dt)
        self.emit(f"{name} = {value.code}", ind)
        if not upd:  # an initialisation: (re)start the guard
            guard = self.guard_names.setdefault(name, self.names.fresh(name + "_nan"))
            if quiet:
                self.quiet_regs.add(name)
            else:
                self.emit(f"{guard} = np.{gty}(0)", ind)

    # -- allocation ------------------------------------------------------------------
    def plan_allocations(self) -> None:
        """Where each local array is allocated (see the module docstring)."""
        sites: dict[str, set[int | None]] = {}

        def note(name: str, site: int | None) -> None:
            if name in self.bufs and self.scope(name) == "local":
                sites.setdefault(name, set()).add(site)

        def visit(stmts: list[Stmt], site: int | None, in_par: bool) -> None:
            for s in stmts:
                if isinstance(s, Store):
                    note(s.buffer, site)
                elif isinstance(s, StreamStore):
                    note(s.src, site)
                exprs: list[Expr] = []
                if isinstance(s, Store):
                    exprs = [*s.indices, s.value]
                elif isinstance(s, If):
                    exprs = [s.cond]
                elif isinstance(s, Block):
                    exprs = list(s.bindings) + ([s.predicate] if s.predicate is not None else [])
                for ex in exprs:
                    for x in walk(ex):
                        if isinstance(x, Load):
                            note(x.buffer, site)
                if isinstance(s, For):
                    par = s.kind == ForKind.PARALLEL and self.parallel and not in_par
                    visit(s.body, id(s) if par else site, in_par or par)
                elif isinstance(s, (Block, If)):
                    visit(s.body, site, in_par)

        visit(self.k.body, None, False)
        for name in self.bufs:
            if self.scope(name) != "local":
                continue
            found = sites.get(name, {None})
            self.alloc_site[name] = next(iter(found)) if len(found) == 1 else None

    def allocations(self, site: int | None, env: dict[str, Expr], ind: int) -> None:
        for name, at in self.alloc_site.items():
            if at != site:
                continue
            b = self.bufs[name]
            dims = [self.ex(self.fold(d, env)).code for d in b.shape]
            shape = "1" if not dims else (dims[0] + "," if len(dims) == 1 else ", ".join(dims))
            carrier = "np.float32" if self.dtypes[name] == "float16" else np_ctor(self.dtypes[name])
            self.emit(f"{self.py[name]} = np.empty(({shape}), dtype={carrier})", ind)

    # -- the module ------------------------------------------------------------------
    def arguments(self) -> tuple[dict[str, Expr], list[str], list[str], list[int], list[int], list]:
        """The entry's arguments: ``(env, names, signature lines, float16 positions, 0-d
        positions, (buffer, role, dtype, rank) per array)``."""
        k = self.k
        env: dict[str, Expr] = {}
        args: list[str] = []
        sig: list[str] = []
        half: list[int] = []
        zero_d: list[int] = []
        arrays: list[tuple[str, str, str, int]] = []
        pos = 0
        for role, group in (("input", k.inputs), ("output", k.outputs)):
            for b in group:
                py = self.names.fresh(b.name)
                self.py[b.name] = py
                args.append(py)
                dt = self.dtypes[b.name]
                ro = ", readonly=True" if role == "input" else ""
                shape = ", ".join(shape_text(d) for d in b.shape)
                note = " (float16 bits)" if dt == "float16" else ""
                sig.append(
                    f'    _t.Array({nb_scalar(dt)}, {max(len(b.shape), 1)}, "C"{ro}),'
                    f"  # {b.name}: {role} {dt}[{shape}]{note}"
                )
                if dt == "float16":
                    half.append(pos)
                if not b.shape:
                    zero_d.append(pos)
                arrays.append((b.name, role, dt, len(b.shape)))
                pos += 1
        for d in k.dims:
            py = self.names.fresh(d)
            env[d] = Var(py)
            args.append(py)
            sig.append(f"    _t.int64,  # {d}")
        return env, args, sig, half, zero_d, arrays

    def module_head(self, sig: list[str], chunked: bool) -> list[str]:
        """The generated module's imports, ``SIGNATURE``, ``INTERLEAVE`` and options."""
        k = self.k
        flags = FASTMATH_FLAGS if self.fastmath else DEFAULT_FLAGS
        fm = "{" + ", ".join(repr(f) for f in sorted(flags)) + "}"
        head = [
            f"# geode kernel {k.name}: generated by geode.codegen.backends.numba, do not edit",
            "import math",
            "",
            "import numba",
            "import numpy as np",
            "from numba import types as _t",
            "",
        ]
        if self.helpers:
            head.append(
                f"from geode.codegen.backends.numba import {', '.join(sorted(self.helpers))}"
            )
            head.append("")
        if self.vmath:
            head.append(f"from geode.codegen.backends.vmath import {', '.join(sorted(self.vmath))}")
            head.append("")
        head += ["SIGNATURE = (", *sig, ")"]
        interleave = max(
            (
                s.interleave
                for s in walk_stmts(k.body)
                if isinstance(s, For) and s.kind == ForKind.VECTORIZED
            ),
            default=1,
        )
        if interleave > 1:
            head.append(f"INTERLEAVE = {interleave}  # LLVM's interleave count for this kernel")
        head.append(
            f'NJIT_OPTIONS = {{"parallel": {self.parallel and not chunked}, "fastmath": {fm}, '
            f'"nogil": True, "cache": True, "boundscheck": False, "error_model": "numpy"}}'
        )
        return head

    def run(self) -> Emitted:
        """The kernel's module source and what compiling and calling it needs."""
        k = self.k
        env, args, sig, half, zero_d, arrays = self.arguments()
        for b in k.temps:
            if self.scope(b.name) == "local":
                self.py[b.name] = self.names.fresh(b.name)
        has_par = any(isinstance(s, For) and s.kind == ForKind.PARALLEL for s in walk_stmts(k.body))
        self.parallel = self.parallel and has_par
        self.plan_allocations()

        chunked = self.parallel and chunkable(k)
        checks = self.shape_checks(env)
        body_start = len(self.lines)
        entry: list[str] = []
        unpack: list[str] = []
        rows_name = body_name = None
        nt_ids: set[int] = set()
        nt_name = nt_rows_name = None
        rows_params: list[str] = []
        if chunked:
            rows_name = self.names.fresh(f"{self.func_name}_rows")
            body_name = self.names.fresh(f"{self.func_name}_body")
            argv, chunk, chunks, rows, threads = (
                self.names.fresh(n) for n in ("argv", "chunk", "chunks", "rows", "threads")
            )
            self.chunk_vars = (chunk, chunks)
            nt_ids, nt_cond, nt_outs = self.plan_nontemporal()
            test = None
            if nt_ids:
                nt_name = self.names.fresh(f"{self.func_name}_body_nt")
                nt_rows_name = self.names.fresh(f"{self.func_name}_rows_nt")
                tests = [
                    self.convert(self.ex(self.fold(t, env)), "bool") for t in conjuncts(nt_cond)
                ]
                test = " and ".join(
                    [paren(t, CMP) for t in tests]
                    + [f"{self.helper('_g_vector_start')}({self.py[o]}, 0)" for o in nt_outs]
                )
            rows_params = [rows] if test is None else [rows, self.names.fresh("rows_nt")]
            entry = self.chunk_entry(checks, args, argv, rows_params, chunks, threads, test)
            unpack = self.unpack_argv(args, env, argv)
            call = f"({', '.join([*args, chunk, chunks])})"
            sig.append(f"    _t.int64,  # {rows}: the address of {rows_name} (geode passes it)")
            if nt_rows_name is not None:
                sig.append(
                    f"    _t.int64,  # {rows_params[1]}: the address of {nt_rows_name}, "
                    "0 while not compiled (geode passes it)"
                )
            sig.append(f"    _t.int64,  # {chunks}: the launch's chunk count (geode passes it)")
            sig.append(
                f"    _t.int64,  # {threads}: the thread count, 0 for numba's (geode passes it)"
            )
        else:
            self.lines += checks
        self.dim_names = {env[d].name for d in k.dims}  # type: ignore[attr-defined]
        body = self.emit_body(env, body_start, set())
        nt_body = self.emit_body(env, len(self.lines), nt_ids) if chunked and nt_ids else []

        head = self.module_head(sig, chunked)
        if chunked:
            c, cs = self.chunk_vars  # type: ignore[misc]
            params = ", ".join([*args, *rows_params, cs, threads])
            lines = [*head, "", "", f"def {self.func_name}({params}):"]
            lines += [*entry, "", "", f"def {rows_name}({argv}, {c}, {cs}):", *unpack]
            lines.append(f"    {body_name}{call}")
            if nt_body:
                lines += ["", "", f"def {nt_rows_name}({argv}, {c}, {cs}):", *unpack]
                lines.append(f"    {nt_name}{call}")
            lines += ["", "", f"def {body_name}({', '.join([*args, c, cs])}):", *body]
            if nt_body:
                lines += ["", "", f"def {nt_name}({', '.join([*args, c, cs])}):", *nt_body]
        else:
            lines = [*head, "", "", f"def {self.func_name}({', '.join(args)}):", *body]
        source = "\n".join(lines) + "\n"
        return Emitted(
            source,
            self.func_name,
            self.parallel,
            half,
            zero_d,
            arrays,
            list(k.dims),
            rows_name,
            body_name,
            nt_name if nt_body else None,
            nt_rows_name if nt_body else None,
            tuple(sorted(self.vmath.items())),
        )

    def emit_body(self, env: dict[str, Expr], start: int, nt: set[int]) -> list[str]:
        """Print the kernel's statements after line ``start`` (the shape checks of an
        unchunked kernel) and return those lines: the entry's temps, then the loops,
        with the stores of ``nt`` as streaming stores (see :meth:`plan_nontemporal`).
        Each call starts afresh what one function's body holds (its dims-only terms, NaN
        guards, end fence), so a chunked kernel can print a second body."""
        self.dim_terms, self.in_dim_term = {}, set()
        self.guard_names, self.quiet_regs = {}, set()
        self.fence_at_end, self.nt_on = False, nt
        self.allocations(None, env, 1)
        self.prologue_at = len(self.lines)
        self.stmts(self.k.body, env, 1, False)
        if self.fence_at_end:
            self.emit(f"{self.helper('_g_sfence')}()", 1)
        if len(self.lines) == start:
            self.emit("pass", 1)
        body = self.lines[start:]
        del self.lines[start:]
        self.nt_on = set()
        return body

    def shape_checks(self, env: dict[str, Expr]) -> list[str]:
        """The entry's lines checking every argument's shape (``ValueError`` naming it)."""
        k, out = self.k, []
        for b in (*k.inputs, *k.outputs):
            py = self.py[b.name]
            if not b.shape:
                out.append(f"    if {py}.shape[0] != 1:")
                msg = f"kernel {k.name}: argument {b.name} must hold exactly one element"
                out.append(f"        raise ValueError({msg!r})")
                continue
            conds = []
            for axis, d in enumerate(b.shape):
                v = self.ex(self.fold(d, env))
                conds.append(f"{py}.shape[{axis}] != {paren(v, CMP + 1)}")
            want = ", ".join(shape_text(d) for d in b.shape)
            out.append(f"    if {' or '.join(conds)}:")
            msg = f"kernel {k.name}: argument {b.name} must have shape ({want}{',' if len(b.shape) == 1 else ''})"
            out.append(f"        raise ValueError({msg!r})")
        return out

    def chunk_entry(
        self,
        checks: list[str],
        args: list[str],
        argv: str,
        rows: list[str],
        chunks: str,
        threads: str,
        nt_test: str | None,
    ) -> list[str]:
        """A chunked kernel's entry: the shape checks, ``argv`` (the arrays' addresses,
        then the dims) and the shared launcher, which runs the chunk function at address
        ``rows[0]`` in ``chunks`` chunks on ``threads`` threads (0: numba's setting).

        With a streaming body, ``rows`` also names the streaming chunk function's
        address, launched instead when ``nt_test`` holds. Either address may be 0 (a
        chunk function compiled on first need, see "Chunked kernels"): the entry then
        returns 1 (the plain one is needed) or 2 (the streaming one) without running
        anything; it returns 0 after a launch (and nothing, without a streaming body)."""
        n_arrays = len(self.k.inputs) + len(self.k.outputs)
        out = [*checks, f"    {argv} = np.empty({len(args)}, dtype=np.int64)"]
        for i, a in enumerate(args):
            val = f"{self.helper('_g_addr')}({a})" if i < n_arrays else a
            out.append(f"    {argv}[{i}] = {val}")
        launch = self.helper("_g_launch")
        if nt_test is None:
            out.append(f"    {launch}({rows[0]}, {argv}, {chunks}, {threads})")
            return out
        for lead, addr, need in ((f"if {nt_test}:", rows[1], 2), ("else:", rows[0], 1)):
            out += [f"    {lead}", f"        if {addr} == 0:", f"            return {need}"]
            out.append(f"        {launch}({addr}, {argv}, {chunks}, {threads})")
        out.append("    return 0")
        return out

    def unpack_argv(self, args: list[str], env: dict[str, Expr], argv: str) -> list[str]:
        """The chunk function's lines: dims, then each array rebuilt from its address."""
        k, out = self.k, []
        bufs = (*k.inputs, *k.outputs)
        for i in range(len(bufs), len(bufs) + len(k.dims)):
            out.append(f"    {args[i]} = {argv}[{i}]")
        for i, b in enumerate(bufs):
            dt = self.dtypes[b.name]
            carrier = {"float16": "np.uint16", "bool": "np.bool_"}.get(dt, f"np.{dt}")
            # shapes use dims only (never hoisted terms), printed from the buffer's shape
            dims = [paren(self.ex(self.fold(d, env)), CMP + 1) for d in b.shape] or ["1"]
            shape = dims[0] + "," if len(dims) == 1 else ", ".join(dims)
            ptr = f"{self.helper('_g_ptr')}({argv}[{i}], {carrier})"
            out.append(f"    {args[i]} = numba.carray({ptr}, ({shape}))")
        return out


@dataclass
class _HoistFrame:
    """A loop being emitted: the line index of its ``for`` (where hoisted bindings go,
    advanced past each), its indentation, the Python names its body defines, whether it
    is a prange, and the hoisted bindings by code."""

    at: int
    ind: int
    defined: set[str]
    prange: bool
    cse: dict[str, str] = field(default_factory=dict)


def emit_module_source(kernel: Kernel, fastmath: bool, parallel: bool | None) -> Emitted:
    par = has_parallel(kernel) if parallel is None else bool(parallel)
    demoted: set[str] = set()
    while True:
        try:
            return _Emitter(kernel, fastmath, par, demoted).run()
        except Demote as d:
            if d.buffer in demoted:  # pragma: no cover - defensive
                raise CodegenError(
                    f"kernel {kernel.name!r}: cannot place register {d.buffer!r}"
                ) from None
            demoted.add(d.buffer)


def emit_source(kernel: Kernel, fastmath: bool = False, parallel: bool | None = None) -> str:
    """The Python source of one numba function computing ``kernel``.

    The text is a complete module: imports, ``SIGNATURE`` (the numba argument types,
    inputs read-only), ``NJIT_OPTIONS`` and the function (with its chunk function and
    body, for a chunked kernel: see "Chunked kernels"). ``parallel=None`` compiles
    parallel loops in parallel when the kernel has any; ``False`` prints them as
    ``range``. Raises :class:`CodegenError` naming the kernel for anything the backend
    cannot express.
    """
    return emit_module_source(kernel, fastmath, parallel).source
