"""Expressions of the loop AST -> IR instructions (numpy semantics, see the package
docstring for the rules on dtypes and operators).

:class:`ExprWriter` is a mixin of the kernel emitter: it evaluates an AST expression
whose variables were folded to IR operands (:meth:`ExprWriter.fold`) into a typed
value :class:`~geode.codegen.backends.llvm.values.V`.
"""

from __future__ import annotations

import numpy as np

from geode.codegen.ast import Bin, Cast, Const, Expr, Load, Select, Un, Var, transform
from geode.codegen.backends.llvm import dtypes as D
from geode.codegen.backends.llvm import ops as O
from geode.codegen.backends.llvm.analysis import fold_consts
from geode.codegen.backends.llvm.irtext import float_literal
from geode.codegen.backends.llvm.values import V, ValueWriter
from geode.codegen.backends.patterns import (
    cubic_parts,
    is_const,
    one_plus_tanh_parts,
    product_factors,
)
from geode.errors import CodegenError

__all__ = ["ExprWriter"]

#: float instructions (fadd ...) by AST operator
_FLOAT_OPS = {"+": "fadd", "-": "fsub", "*": "fmul", "/": "fdiv", "fmod": "frem"}
_INT_OPS = {"+": "add", "-": "sub", "*": "mul", "bitand": "and", "bitor": "or", "bitxor": "xor"}
_FCMP = {"<": "olt", "<=": "ole", ">": "ogt", ">=": "oge", "==": "oeq", "!=": "une"}
_SCMP = {"<": "slt", "<=": "sle", ">": "sgt", ">=": "sge", "==": "eq", "!=": "ne"}
_UCMP = {"<": "ult", "<=": "ule", ">": "ugt", ">=": "uge", "==": "eq", "!=": "ne"}
#: math functions without a vmath version: the C library's (``expf`` for float)
_LIBM = {
    "exp": "exp",
    "log": "log",
    "log1p": "log1p",
    "sin": "sin",
    "cos": "cos",
    "tan": "tan",
    "asin": "asin",
    "acos": "acos",
    "atan": "atan",
    "sinh": "sinh",
    "cosh": "cosh",
    "tanh": "tanh",
    "asinh": "asinh",
    "acosh": "acosh",
    "atanh": "atanh",
    "erf": "erf",
}
_ROUND = {"floor": "floor", "ceil": "ceil", "round": "roundeven"}
#: fast-math flags of float arithmetic: geode's default policy, and ``fastmath=True``
DEFAULT_FLAGS = "reassoc arcp contract"
FASTMATH_FLAGS = "fast"
#: the default policy's flags on a division whose divisor may be tiny: no ``arcp``. With it
#: LLVM turns ``x / d`` into ``x * (1 / d)`` (hoisting ``1 / d`` out of a loop when ``d`` is
#: fixed there), and ``1 / d`` overflows to inf for a subnormal ``d``: NaN or inf where the
#: quotient is finite (found by geode.fuzz). See :meth:`ExprWriter.division_flags`.
DIVISION_FLAGS = "reassoc contract"


def _weak(e: Expr, v: V) -> bool:
    return isinstance(e, Const) and v.dtype in D.WEAK


class ExprWriter(ValueWriter):
    """Expression evaluation; the kernel emitter provides the state named below."""

    fastmath: bool
    #: IR operands holding non-negative index values (loop variables, dims, bindings)
    index_ir: set[str]
    env: dict[str, Expr]

    # provided by the statement writer
    def where(self) -> str:  # pragma: no cover - overridden
        raise NotImplementedError

    def load(self, e: Load) -> V:  # pragma: no cover - overridden
        raise NotImplementedError

    # -- helpers -----------------------------------------------------------------------
    @property
    def flags(self) -> str:
        """Fast-math flags of this kernel's float arithmetic."""
        return FASTMATH_FLAGS if self.fastmath else DEFAULT_FLAGS

    def fold(self, e: Expr, env: dict[str, Expr] | None = None) -> Expr:
        """``e`` with its variables replaced by their values in ``env`` (IR operands or
        constants), constants folded."""
        env = self.env if env is None else env

        def fn(x: Expr) -> Expr | None:
            if isinstance(x, Var):
                if x.name not in env:
                    raise CodegenError(f"{self.where()}: unbound variable {x.name!r}")
                return env[x.name]
            return None

        return fold_consts(transform(e, fn))

    def value(self, e: Expr, env: dict[str, Expr] | None = None) -> V:
        """The value of AST expression ``e`` (variables looked up in ``env``)."""
        return self.ex(self.fold(e, env))

    def index(self, e: Expr, env: dict[str, Expr] | None = None) -> str:
        """``e`` as an ``i64`` operand."""
        return self.as_int64(self.value(e, env), self.where())

    def libm(self, name: str, ty: str, n_args: int = 1) -> str:
        """Declare the C library's ``name`` (``namef`` for float) and return it."""
        sym = name + ("f" if ty == "float" else "")
        args = ", ".join([ty] * n_args)
        return self.module.declare(sym, f"declare {ty} @{sym}({args}) nounwind")

    def op(self, name: str) -> str:
        """The integer operation ``name`` of :mod:`~geode.codegen.backends.llvm.ops`,
        defined in the module on first use."""
        self.module.add_global("geode.op." + name, O.definition(name))
        return O.symbol(name)

    def is_index(self, e: Expr) -> bool:
        """A non-negative index expression (folded): index operands, non-negative
        literals, and + * // % of them."""
        if isinstance(e, Const):
            return e.dtype == "int64" and int(e.value) >= 0  # type: ignore[arg-type]
        if isinstance(e, Var):
            return e.name in self.index_ir
        if isinstance(e, Bin) and e.op in ("+", "*", "//", "%"):
            return self.is_index(e.a) and self.is_index(e.b)
        return False

    # -- expressions -------------------------------------------------------------------
    def ex(self, e: Expr) -> V:
        """Evaluate a folded expression."""
        if isinstance(e, Const):
            return self.const(e.value, D.check_dtype(e.dtype, f"{self.where()} constant"))
        if isinstance(e, Var):
            if not e.name.startswith("%"):
                raise CodegenError(f"{self.where()}: unbound variable {e.name!r}")
            return V(e.name, "int64")
        if isinstance(e, Load):
            return self.load(e)
        if isinstance(e, Cast):
            return self.convert(self.ex(e.a), D.check_dtype(e.dtype, f"{self.where()} cast"))
        if isinstance(e, Select):
            return self.select(e)
        if isinstance(e, Un) and e.op == "fence":
            # its root operation without fast-math flags: LLVM then neither contracts nor
            # reassociates it with its users (both instructions would need the flag), and
            # it vectorizes (llvm.arithmetic.fence does not)
            return self.binary(e.a, plain=True) if isinstance(e.a, Bin) else self.ex(e.a)
        if isinstance(e, Un):
            return self.unary(e)
        if isinstance(e, Bin):
            return self.binary(e)
        raise CodegenError(f"{self.where()}: unknown expression {e!r}")

    def select(self, e: Select) -> V:
        c = self.convert(self.ex(e.cond), "bool")
        t, f = self.ex(e.t), self.ex(e.f)
        r = D.promote(t.dtype, _weak(e.t, t), f.dtype, _weak(e.f, f))
        t, f = self.convert(t, r), self.convert(f, r)
        if c.literal is not None:
            return t if c.literal else f
        ty = D.value_type(r)
        return V(self.fn.value(f"select i1 {c.ref}, {ty} {t.ref}, {ty} {f.ref}"), r)

    # -- unary -------------------------------------------------------------------------
    def unary(self, e: Un) -> V:
        op = e.op
        a = self.ex(e.a)
        dt = a.dtype
        isf = D.is_float(dt)
        ty = D.value_type(dt)
        f = self.fn
        if op == "neg":
            if dt == "bool":
                raise CodegenError(f"{self.where()}: neg of a bool")
            if isf:
                return self.wrap(f.value(f"fneg {self.flags} {ty} {a.ref}"), dt)
            return V(f.value(f"sub {ty} 0, {a.ref}"), dt)
        if op == "not":
            if dt != "bool":
                return V(self.compare("==", a, self.const(0, dt)), "bool")
            return V(f.value(f"xor i1 {a.ref}, true"), "bool")
        if op == "bitnot":
            if isf:
                raise CodegenError(f"{self.where()}: bitnot of {dt}")
            if dt == "bool":
                return V(f.value(f"xor i1 {a.ref}, true"), "bool")
            return V(f.value(f"xor {ty} {a.ref}, -1"), dt)
        if op == "abs":
            if dt == "bool" or dt in D.UINTS:
                return a
            if isf:
                return V(self.unary_intrinsic("fabs", a.ref, ty), dt)
            callee = self.intrinsic("abs", ty, [ty, "i1"])
            return V(self.call(callee, ty, [(ty, a.ref), ("i1", "false")]), dt)
        if op in ("sigmoid", "sqrt") or op in _LIBM:
            return self.math(op, a)
        if op in _ROUND:
            if not isf:
                return a
            return V(self.unary_intrinsic(_ROUND[op], a.ref, ty), dt)
        if op == "sign":
            return self.sign(a)
        if op in ("isnan", "isinf", "isposinf", "isneginf"):
            if not isf:
                return self.const(False, "bool")
            if op == "isnan":
                return V(f.value(f"fcmp uno {ty} {a.ref}, {a.ref}"), "bool")
            inf = float_literal(float("inf"), ty)
            if op == "isinf":
                ab = self.unary_intrinsic("fabs", a.ref, ty)
                return V(f.value(f"fcmp oeq {ty} {ab}, {inf}"), "bool")
            x = inf if op == "isposinf" else float_literal(float("-inf"), ty)
            return V(f.value(f"fcmp oeq {ty} {a.ref}, {x}"), "bool")
        raise CodegenError(f"{self.where()}: unknown unary op {op!r}")

    def sign(self, a: V) -> V:
        dt, f = a.dtype, self.fn
        ty = D.value_type(dt)
        if dt == "bool":
            return a
        if D.is_float(dt):
            one, mone = float_literal(1.0, ty), float_literal(-1.0, ty)
            zero = float_literal(0.0, ty)
            pos = f.value(f"fcmp ogt {ty} {a.ref}, {zero}")
            neg = f.value(f"fcmp olt {ty} {a.ref}, {zero}")
            r = f.value(f"select i1 {neg}, {ty} {mone}, {ty} {a.ref}")
            return V(f.value(f"select i1 {pos}, {ty} {one}, {ty} {r}"), dt)
        if dt in D.UINTS:
            return self.convert(V(f.value(f"icmp ne {ty} {a.ref}, 0"), "bool"), dt)
        p = f.value(f"zext i1 {f.value(f'icmp sgt {ty} {a.ref}, 0')} to {ty}")
        n = f.value(f"zext i1 {f.value(f'icmp slt {ty} {a.ref}, 0')} to {ty}")
        return V(f.value(f"sub {ty} {p}, {n}"), dt)

    def math(self, op: str, a: V) -> V:
        """A math function of ``a`` in the float dtype numpy computes it in: vmath for
        float32/float64 where it has the function, else LLVM's ``sqrt`` or the C library."""
        fdt = D.float_for(a.dtype)
        x = self.convert(a, fdt)
        ty = D.value_type(fdt)
        fn = self.vmath_call(op, fdt, [x.ref])
        if fn is not None:
            return V(fn, fdt)
        if op == "sqrt":
            return self.wrap(self.unary_intrinsic("sqrt", x.ref, ty, self.flags), fdt)
        if op == "sigmoid":
            one = float_literal(1.0, ty)
            nx = self.fn.value(f"fneg {ty} {x.ref}")
            ex = self.call(self.libm("exp", ty), ty, [(ty, nx)])
            den = self.fn.value(f"fadd {ty} {one}, {ex}")
            return self.wrap(self.fn.value(f"fdiv {ty} {one}, {den}"), fdt)
        r = self.call(self.libm(_LIBM[op], ty), ty, [(ty, x.ref)])
        return self.wrap(r, fdt)

    def vmath_call(self, op: str, dtype: str, args: list[str]) -> str | None:
        """A call of vmath's ``op`` for ``dtype`` (float32/float64), or None when vmath
        has no such function. The ``ieee`` variants (no final NaN test) serve kernels
        compiled without ``nnan``."""
        from geode.codegen.backends.llvm import vmath

        if dtype not in ("float32", "float64") or not vmath.available(op, dtype):
            return None
        name = vmath.function_name(op, dtype, ieee=not self.fastmath)
        self.vmath_used.add(name)
        ty = D.value_type(dtype)
        arg_text = ", ".join(f"{ty} {a}" for a in args)
        return self.fn.value(f'call {ty} @"{name}"({arg_text})')

    vmath_used: set[str]

    # -- binary ------------------------------------------------------------------------
    def compare(self, op: str, a: V, b: V) -> str:
        """``a op b`` (same dtype) as an ``i1`` operand."""
        ty = D.value_type(a.dtype)
        if D.is_float(a.dtype):
            return self.fn.value(f"fcmp {_FCMP[op]} {ty} {a.ref}, {b.ref}")
        table = _SCMP if D.is_signed(a.dtype) else _UCMP
        return self.fn.value(f"icmp {table[op]} {ty} {a.ref}, {b.ref}")

    def binary(self, e: Bin, plain: bool = False) -> V:
        """``e``'s value; ``plain``: its own float operation (not its operands') carries no
        fast-math flags (a ``fence``)."""
        op = e.op
        fused = self.tanh_gate(e) or self.one_plus_tanh(e)
        if fused is not None:
            return fused
        a, b = self.ex(e.a), self.ex(e.b)
        f = self.fn
        if op in ("and", "or", "xor"):
            a, b = self.convert(a, "bool"), self.convert(b, "bool")
            return V(f.value(f"{op} i1 {a.ref}, {b.ref}"), "bool")
        r = D.promote(a.dtype, _weak(e.a, a), b.dtype, _weak(e.b, b))
        b_dtype = b.dtype
        a, b = self.convert(a, r), self.convert(b, r)
        ty = D.value_type(r)
        if op in _FCMP:
            return V(self.compare(op, a, b), "bool")
        if r == "bool":
            return self.bool_binary(op, a, b)
        if D.is_float(r):
            if op == "/":
                fl = "" if plain else self.division_flags(e.b, b_dtype, r)
                return self.wrap(self.fn.value(f"fdiv {fl} {ty} {a.ref}, {b.ref}"), r)
            return self.float_binary(op, a, b, r, plain)
        if op in ("+", "*") and self.is_index(e):
            return V(f.value(f"{_INT_OPS[op]} nsw {ty} {a.ref}, {b.ref}"), r)
        if op in _INT_OPS:
            return V(f.value(f"{_INT_OPS[op]} {ty} {a.ref}, {b.ref}"), r)
        if op in ("/", "//", "%", "fmod"):
            return self.int_division(e, op, a, b, r)
        if op in ("min", "max"):
            base = ("s" if D.is_signed(r) else "u") + op
            return V(
                self.call(self.intrinsic(base, ty, [ty, ty]), ty, [(ty, a.ref), (ty, b.ref)]), r
            )
        if op == "pow":
            fn = "ipow" if D.is_signed(r) else "upow"
            return self.int_op(fn, [a, b], r)
        if op in ("shl", "shr"):
            nbits = self.const(D.bits(r), "int64")
            fn = op if (op == "shl" or D.is_signed(r)) else "ushr"
            return self.int_op(fn, [a, b, nbits], r)
        raise CodegenError(f"{self.where()}: unknown binary op {op!r}")

    def float_binary(self, op: str, a: V, b: V, r: str, plain: bool = False) -> V:
        ty = D.value_type(r)
        if op in _FLOAT_OPS:
            fl = "" if op == "fmod" or plain else f"{self.flags} "
            return self.wrap(self.fn.value(f"{_FLOAT_OPS[op]} {fl}{ty} {a.ref}, {b.ref}"), r)
        if op in ("min", "max"):
            callee = self.intrinsic(op + "imum", ty, [ty, ty])
            return V(self.call(callee, ty, [(ty, a.ref), (ty, b.ref)]), r)
        if op == "pow":
            callee = self.intrinsic("pow", ty, [ty, ty])
            return self.wrap(self.call(callee, ty, [(ty, a.ref), (ty, b.ref)]), r)
        if op == "//":
            return self.wrap(self.float_floor_divide(a.ref, b.ref, ty), r)
        if op == "%":  # numpy's remainder: fmod, moved to the divisor's sign
            return self.wrap(self.float_remainder(a.ref, b.ref, ty), r)
        raise CodegenError(f"{self.where()}: {op} of {r}")

    def division_flags(self, divisor: Expr, divisor_dtype: str, dtype: str) -> str:
        """Fast-math flags of a ``dtype`` division by ``divisor`` (folded; ``divisor_dtype``:
        its dtype before the conversion to ``dtype``). ``fastmath`` kernels keep ``fast``.
        Under the default policy only a divisor whose reciprocal is finite and normal in
        ``dtype`` keeps ``arcp`` (``x * (1 / d)`` is then within an ulp of ``x / d``, and
        faster): a constant whose reciprocal is, or an integer converted to float32 or
        float64 (|d| >= 1, or 0, whose reciprocal inf gives the same inf or NaN as the
        division). Any other divisor may be subnormal: IEEE division, no ``arcp``."""
        if self.fastmath:
            return FASTMATH_FLAGS
        return (
            DEFAULT_FLAGS
            if self.reciprocal_is_safe(divisor, divisor_dtype, dtype)
            else (DIVISION_FLAGS)
        )

    def reciprocal_is_safe(self, divisor: Expr, divisor_dtype: str, dtype: str) -> bool:
        """Whether ``1 / divisor`` is finite and normal in ``dtype`` (see
        :meth:`division_flags`)."""
        if isinstance(divisor, Const):
            info = np.finfo(dtype)
            with np.errstate(all="ignore"):
                d = np.asarray(divisor.value).astype(dtype)
                inv = np.asarray(1, dtype) / d
            return bool(np.isfinite(d) and info.tiny <= abs(d) and info.tiny <= abs(inv) < np.inf)
        if dtype not in ("float32", "float64"):
            return False
        if D.is_int(divisor_dtype) or divisor_dtype == "bool":
            return True
        return isinstance(divisor, Cast) and self.is_index(divisor.a)

    def float_floor_divide(self, a: str, b: str, ty: str) -> str:
        """numpy's float ``floor_divide`` (its divmod algorithm, without fast-math)."""
        f = self.fn
        zero, one, half = (float_literal(v, ty) for v in (0.0, 1.0, 0.5))
        mod = f.value(f"frem {ty} {a}, {b}")
        q0 = f.value(f"fdiv {ty} {a}, {b}")
        div = f.value(f"fdiv {ty} {f.value(f'fsub {ty} {a}, {mod}')}, {b}")
        mod_nz = f.value(f"fcmp une {ty} {mod}, {zero}")
        bneg = f.value(f"fcmp olt {ty} {b}, {zero}")
        mneg = f.value(f"fcmp olt {ty} {mod}, {zero}")
        adj = f.value(f"and i1 {mod_nz}, {f.value(f'xor i1 {bneg}, {mneg}')}")
        div = f.value(f"select i1 {adj}, {ty} {f.value(f'fsub {ty} {div}, {one}')}, {ty} {div}")
        fl = self.unary_intrinsic("floor", div, ty)
        big = f.value(f"fcmp ogt {ty} {f.value(f'fsub {ty} {div}, {fl}')}, {half}")
        fl = f.value(f"select i1 {big}, {ty} {f.value(f'fadd {ty} {fl}, {one}')}, {ty} {fl}")
        copysign = self.intrinsic("copysign", ty, [ty, ty])
        signed_zero = self.call(copysign, ty, [(ty, zero), (ty, q0)])
        div_nz = f.value(f"fcmp une {ty} {div}, {zero}")
        res = f.value(f"select i1 {div_nz}, {ty} {fl}, {ty} {signed_zero}")
        bz = f.value(f"fcmp oeq {ty} {b}, {zero}")
        return f.value(f"select i1 {bz}, {ty} {q0}, {ty} {res}")

    def float_remainder(self, a: str, b: str, ty: str) -> str:
        """numpy's float ``remainder``: ``fmod`` moved to the divisor's sign; a zero
        result takes the divisor's sign; NaN stays NaN."""
        f = self.fn
        zero = float_literal(0.0, ty)
        m = f.value(f"frem {ty} {a}, {b}")
        nz = f.value(f"fcmp une {ty} {m}, {zero}")
        mneg = f.value(f"fcmp olt {ty} {m}, {zero}")
        bneg = f.value(f"fcmp olt {ty} {b}, {zero}")
        fix = f.value(f"and i1 {nz}, {f.value(f'xor i1 {mneg}, {bneg}')}")
        out = f.value(f"select i1 {fix}, {ty} {f.value(f'fadd {ty} {m}, {b}')}, {ty} {m}")
        sgn = self.call(self.intrinsic("copysign", ty, [ty, ty]), ty, [(ty, zero), (ty, b)])
        return f.value(f"select i1 {nz}, {ty} {out}, {ty} {sgn}")

    def int_division(self, e: Bin, op: str, a: V, b: V, r: str) -> V:
        f, ty = self.fn, D.value_type(r)
        if op in ("//", "%") and self.is_index(e.a) and self.is_index(e.b):
            # non-negative index arithmetic: unsigned division (floor == trunc); a zero
            # divisor (an empty loop's extent) must not trap
            inst = "udiv" if op == "//" else "urem"
            if isinstance(b.literal, int) and b.literal > 0:
                return V(f.value(f"{inst} {ty} {a.ref}, {b.ref}"), r)
            z = f.value(f"icmp eq {ty} {b.ref}, 0")
            d = f.value(f"select i1 {z}, {ty} 1, {ty} {b.ref}")
            return V(f.value(f"{inst} {ty} {a.ref}, {d}"), r)
        if r in D.UINTS:
            fn = "udiv" if op in ("/", "//") else "umod"
        else:
            fn = {"/": "tdiv", "//": "fdiv", "%": "mod", "fmod": "fmod"}[op]
        return self.int_op(fn, [a, b], r)

    def int_op(self, name: str, args: list[V], r: str) -> V:
        """Integer operation ``name`` of :mod:`ops` on ``args`` widened to 64 bits, the
        result wrapped to ``r``."""
        wide = "uint64" if r in D.UINTS else "int64"
        refs = [self.convert(x, wide if D.is_int(x.dtype) else "int64").ref for x in args]
        arg_text = ", ".join(f"i64 {x}" for x in refs)
        res = self.fn.value(f"call i64 {self.op(name)}({arg_text})")
        return self.convert(V(res, wide), r)

    def bool_binary(self, op: str, a: V, b: V) -> V:
        table = {
            "+": "or",
            "*": "and",
            "min": "and",
            "max": "or",
            "bitand": "and",
            "bitor": "or",
            "bitxor": "xor",
        }
        if op not in table:
            raise CodegenError(f"{self.where()}: {op} of bool operands")
        return V(self.fn.value(f"{table[op]} i1 {a.ref}, {b.ref}"), "bool")

    # -- fused patterns ----------------------------------------------------------------
    def keeps_dtype(self, c: Const, dtype: str) -> bool:
        """Whether constant ``c`` combined with a ``dtype`` value leaves the result ``dtype``."""
        cv = self.ex(c)
        return D.promote(dtype, False, cv.dtype, _weak(c, cv)) == dtype

    def one_plus_tanh(self, e: Bin) -> V | None:
        """``1 + tanh(z)`` as vmath's ``one_plus_tanh(z)`` (cheaper, and accurate where
        adding 1 to tanh cancels); float32/float64 only, when the sum keeps z's dtype."""
        parts = one_plus_tanh_parts(e)
        if parts is None:
            return None
        one, tanh = parts
        z = self.ex(tanh.a)
        fdt = D.float_for(z.dtype)
        if fdt not in ("float32", "float64") or not self.keeps_dtype(one, fdt):
            return None
        ref = self.vmath_call("one_plus_tanh", fdt, [self.convert(z, fdt).ref])
        return None if ref is None else V(ref, fdt)

    def tanh_gate(self, e: Bin) -> V | None:
        """``0.5 * a * (1 + tanh(z))`` (one product of those factors, any order) as vmath's
        ``div_one_plus_exp(a, -2z)`` = ``a / (1 + exp(-2z))``: the tanh GELU's gate in one
        division; the GELU's cubic ``z`` becomes ``h * (-2c + (-2ck) * h * h)``."""
        if e.op != "*":
            return None
        factors = product_factors(e)
        half = next((i for i, x in enumerate(factors) if is_const(x, 0.5)), None)
        gate = next((i for i, x in enumerate(factors) if one_plus_tanh_parts(x)), None)
        if half is None or gate is None or len(factors) < 3:
            return None
        one, tanh = one_plus_tanh_parts(factors[gate])  # type: ignore[misc]
        from geode.codegen.backends.llvm import vmath

        z = self.ex(tanh.a)
        dt = z.dtype
        if dt not in ("float32", "float64") or not vmath.available("div_one_plus_exp", dt):
            return None
        if not all(self.keeps_dtype(c, dt) for c in (one, factors[half])):
            return None
        ty = D.value_type(dt)
        a: V | None = None
        for x in (x for i, x in enumerate(factors) if i not in (half, gate)):
            v = self.ex(x)
            if v.dtype != dt and not (isinstance(x, Const) and self.keeps_dtype(x, dt)):
                return None
            v = self.convert(v, dt)
            a = v if a is None else V(self.fn.value(f"fmul {self.flags} {ty} {a.ref}, {v.ref}"), dt)
        assert a is not None
        t = self.gelu_cubic(tanh.a, dt)
        if t is None:
            m2 = float_literal(-2.0, ty)
            t = self.fn.value(f"fmul {self.flags} {ty} {m2}, {z.ref}")
        ref = self.vmath_call("div_one_plus_exp", dt, [a.ref, t])
        return None if ref is None else V(ref, dt)

    def gelu_cubic(self, z: Expr, dtype: str) -> str | None:
        """``-2z`` for ``z = c * (h + k * h * h * h)`` as ``h * (-2c + (-2ck) * (h * h))``
        (constants folded in float64, rounded once); None for any other ``z``."""
        m = cubic_parts(z)
        if m is None:
            return None
        h, c, k = m
        hv = self.ex(h)
        if hv.dtype != dtype or not (self.keeps_dtype(c, dtype) and self.keeps_dtype(k, dtype)):
            return None
        ty, fl = D.value_type(dtype), self.flags
        cv, kv = float(c.value), float(k.value)  # type: ignore[arg-type]
        c0, c2 = self.const(-2.0 * cv, dtype).ref, self.const(-2.0 * cv * kv, dtype).ref
        f = self.fn
        h2 = f.value(f"fmul {fl} {ty} {hv.ref}, {hv.ref}")
        q = f.value(f"fmul {fl} {ty} {c2}, {h2}")
        q = f.value(f"fadd {fl} {ty} {c0}, {q}")
        return f.value(f"fmul {fl} {ty} {hv.ref}, {q}")
