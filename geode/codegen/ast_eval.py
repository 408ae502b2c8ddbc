"""A reference interpreter for the loop AST (:mod:`geode.codegen.ast`).

:func:`run_kernel` executes a :class:`~geode.codegen.ast.Kernel` statement by
statement with numpy scalars of the buffers' dtypes. It is deliberately plain: every
loop runs serially whatever its kind, block bindings are evaluated in the enclosing
loop variables, predicates guard block bodies, local temporaries are allocated once
for the whole kernel and register buffers are scalars (0-d arrays). It is the
reference the schedule primitives are tested against, so it is meant for small
sizes only.

It is also strict, so that a broken schedule fails loudly rather than silently:

* every load and store is bounds-checked (numpy's negative indices would wrap);
* a block whose predicate holds must bind every iteration variable inside
  ``[0, extent)``;
* float outputs and temporaries start as NaN, so reading an element that nothing
  wrote shows up in the results.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

import numpy as np

from geode.codegen.ast import (
    Bin,
    Block,
    Buffer,
    Cast,
    Const,
    Expr,
    For,
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
    expr_str,
)

Env = dict[str, Any]
_Fn = Callable[[Env], Any]


class KernelEvalError(RuntimeError):
    """The interpreted kernel did something invalid (out-of-bounds access, an
    iteration variable bound outside its extent, an unknown variable)."""


# ---------------------------------------------------------------------------------
# operator semantics
# ---------------------------------------------------------------------------------


def _is_int(x: Any) -> bool:
    return np.issubdtype(np.asarray(x).dtype, np.integer)


def _div(a: Any, b: Any) -> Any:
    """``/``: true division for floats, truncating division for integers."""
    if _is_int(a) and _is_int(b):
        if b == 0:
            return np.floor_divide(a, b)  # numpy's answer (0) with a warning, as C would be UB
        q = np.floor_divide(a, b)
        if np.mod(a, b) != 0 and ((a < 0) != (b < 0)):
            q = q + type(q)(1)
        return q
    return np.true_divide(a, b)


def _sigmoid(a: Any) -> Any:
    one = np.ones_like(a)
    with np.errstate(over="ignore"):
        return one / (one + np.exp(-a))


def _erf(a: Any) -> Any:
    dt = np.asarray(a).dtype
    if not np.issubdtype(dt, np.floating):
        dt = np.dtype("float64")
    return np.asarray(math.erf(float(a)), dtype=dt)[()]


_BIN: dict[str, Callable[[Any, Any], Any]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": _div,
    "//": np.floor_divide,
    "%": np.mod,
    "fmod": np.fmod,
    "min": np.minimum,
    "max": np.maximum,
    "pow": np.power,
    "<": np.less,
    "<=": np.less_equal,
    ">": np.greater,
    ">=": np.greater_equal,
    "==": np.equal,
    "!=": np.not_equal,
    "and": np.logical_and,
    "or": np.logical_or,
    "xor": np.logical_xor,
    "bitand": np.bitwise_and,
    "bitor": np.bitwise_or,
    "bitxor": np.bitwise_xor,
    "shl": np.left_shift,
    "shr": np.right_shift,
}

_UN: dict[str, Callable[[Any], Any]] = {
    "neg": np.negative,
    "not": np.logical_not,
    "bitnot": np.invert,
    "abs": np.abs,
    "exp": np.exp,
    "log": np.log,
    "log1p": np.log1p,
    "sqrt": np.sqrt,
    "sin": np.sin,
    "cos": np.cos,
    "tan": np.tan,
    "asin": np.arcsin,
    "acos": np.arccos,
    "atan": np.arctan,
    "sinh": np.sinh,
    "cosh": np.cosh,
    "tanh": np.tanh,
    "asinh": np.arcsinh,
    "acosh": np.arccosh,
    "atanh": np.arctanh,
    "erf": _erf,
    "sigmoid": _sigmoid,
    "floor": np.floor,
    "ceil": np.ceil,
    "round": np.rint,
    "sign": np.sign,
    "isnan": np.isnan,
    "isinf": np.isinf,
    "isposinf": np.isposinf,
    "isneginf": np.isneginf,
    "fence": lambda x: x,
}


# ---------------------------------------------------------------------------------
# compilation of the AST to Python closures
# ---------------------------------------------------------------------------------


class _Compiler:
    """Turns AST nodes into closures over an environment dict (variable -> value)."""

    def __init__(self, arrays: dict[str, np.ndarray]):
        self.arrays = arrays

    def expr(self, e: Expr) -> _Fn:
        if isinstance(e, Var):
            name = e.name

            def var(env: Env) -> Any:
                try:
                    return env[name]
                except KeyError:
                    raise KernelEvalError(f"unbound variable {name!r}") from None

            return var
        if isinstance(e, Const):
            val = np.asarray(e.value, dtype=np.dtype(e.dtype))[()]
            return lambda env: val
        if isinstance(e, Bin):
            fn = _BIN.get(e.op)
            if fn is None:
                raise KernelEvalError(f"unknown binary operator {e.op!r}")
            fa, fb = self.expr(e.a), self.expr(e.b)
            return lambda env: fn(fa(env), fb(env))
        if isinstance(e, Un):
            fn1 = _UN.get(e.op)
            if fn1 is None:
                raise KernelEvalError(f"unknown unary operator {e.op!r}")
            fa = self.expr(e.a)
            return lambda env: fn1(fa(env))
        if isinstance(e, Select):
            fc, ft, ff = self.expr(e.cond), self.expr(e.t), self.expr(e.f)
            return lambda env: ft(env) if fc(env) else ff(env)
        if isinstance(e, Cast):
            dt = np.dtype(e.dtype)
            fa = self.expr(e.a)
            return lambda env: np.asarray(fa(env)).astype(dt)[()]
        if isinstance(e, Load):
            arr = self._array(e.buffer)
            index = self._index(e.buffer, e.indices, arr.shape)
            return lambda env: arr[index(env)]
        raise KernelEvalError(f"cannot evaluate expression {e!r}")

    def _array(self, name: str) -> np.ndarray:
        try:
            return self.arrays[name]
        except KeyError:
            raise KernelEvalError(f"unknown buffer {name!r}") from None

    def _index(self, name: str, indices: tuple[Expr, ...], shape: tuple[int, ...]) -> _Fn:
        if len(indices) != len(shape):
            text = ", ".join(expr_str(i) for i in indices)
            raise KernelEvalError(f"{name}[{text}]: {len(indices)} indices for rank {len(shape)}")
        fns = [self.expr(i) for i in indices]

        def index(env: Env) -> tuple[int, ...]:
            out = tuple(int(f(env)) for f in fns)
            for d, (i, n) in enumerate(zip(out, shape)):
                if not 0 <= i < n:
                    raise KernelEvalError(
                        f"{name}{list(out)}: index {i} out of bounds for dim {d} of size {n}"
                    )
            return out

        return index

    def stmts(self, stmts: list[Stmt]) -> Callable[[Env], None]:
        fns = [self.stmt(s) for s in stmts]

        def run(env: Env) -> None:
            for f in fns:
                f(env)

        return run

    def stmt(self, s: Stmt) -> Callable[[Env], None]:
        if isinstance(s, For):
            var, extent, body = s.var, self.expr(s.extent), self.stmts(s.body)

            def loop(env: Env) -> None:
                for i in range(int(extent(env))):
                    env[var] = np.int64(i)
                    body(env)
                env.pop(var, None)

            return loop
        if isinstance(s, Block):
            return self._block(s)
        if isinstance(s, Store):
            arr = self._array(s.buffer)
            index = self._index(s.buffer, s.indices, arr.shape)
            value = self.expr(s.value)

            def store(env: Env) -> None:
                v = value(env)
                arr[index(env)] = v

            return store
        if isinstance(s, If):
            cond, body = self.expr(s.cond), self.stmts(s.body)

            def if_(env: Env) -> None:
                if cond(env):
                    body(env)

            return if_
        if isinstance(s, Prefetch):
            self._array(s.buffer)
            self.expr(s.offset)  # checked like any expression; the hint itself does nothing
            return lambda env: None
        if isinstance(s, StreamStore):
            return self._stream(s)
        raise KernelEvalError(f"cannot execute statement {s!r}")

    def _stream(self, s: StreamStore) -> Callable[[Env], None]:
        """A bounds-checked flat copy (streaming stores write the same values)."""
        dst, src = self._array(s.buffer).reshape(-1), self._array(s.src).reshape(-1)
        off, soff, n = self.expr(s.offset), self.expr(s.src_offset), self.expr(s.length)
        self.expr(s.nontemporal)  # checked like any expression
        text = f"stream({s.buffer}, {expr_str(s.offset)}, {s.src}, {expr_str(s.src_offset)})"

        def stream(env: Env) -> None:
            a, b, k = int(off(env)), int(soff(env)), int(n(env))
            if k < 0 or a < 0 or b < 0 or a + k > dst.size or b + k > src.size:
                raise KernelEvalError(
                    f"{text}: copy of {k} elements from {b} to {a} is out of bounds "
                    f"({s.src} holds {src.size}, {s.buffer} {dst.size})"
                )
            dst[a : a + k] = src[b : b + k]

        return stream

    def _block(self, b: Block) -> Callable[[Env], None]:
        if len(b.bindings) != len(b.iter_vars):
            raise KernelEvalError(
                f"block {b.name}: {len(b.iter_vars)} iter vars, {len(b.bindings)} bindings"
            )
        names = [iv.name for iv in b.iter_vars]
        binds = [self.expr(x) for x in b.bindings]
        extents = [self.expr(iv.extent) for iv in b.iter_vars]
        pred = self.expr(b.predicate) if b.predicate is not None else None
        body = self.stmts(b.body)
        bname = b.name

        def block(env: Env) -> None:
            inner = dict(env)
            for n, f in zip(names, binds):
                inner[n] = np.int64(f(env))
            if pred is not None and not pred(inner):
                return
            for n, ext in zip(names, extents):
                v, e = int(inner[n]), int(ext(env))
                if not 0 <= v < e:
                    raise KernelEvalError(f"block {bname}: iter var {n} = {v} outside [0, {e})")
            body(inner)

        return block


# ---------------------------------------------------------------------------------
# entry point
# ---------------------------------------------------------------------------------


def eval_shape(shape: tuple[Expr, ...], dims: dict[str, int]) -> tuple[int, ...]:
    """A buffer shape with symbolic dims bound to ints."""
    comp = _Compiler({})
    env: Env = {k: np.int64(v) for k, v in dims.items()}
    return tuple(int(comp.expr(d)(env)) for d in shape)


def _alloc(buf: Buffer, dims: dict[str, int]) -> np.ndarray:
    dt = np.dtype(buf.dtype)
    shape = () if buf.scope == "register" and not buf.shape else eval_shape(buf.shape, dims)
    if np.issubdtype(dt, np.floating) or np.issubdtype(dt, np.complexfloating):
        return np.full(shape, np.nan, dtype=dt)
    return np.zeros(shape, dtype=dt)


def run_kernel(
    kernel: Kernel, arrays: dict[str, np.ndarray], dims: dict[str, int]
) -> dict[str, np.ndarray]:
    """Interpret ``kernel`` on ``arrays`` (its inputs, by buffer name) with the symbolic
    dims bound by ``dims``; return its outputs by buffer name.

    Inputs are converted to their buffers' dtypes and must have the buffers' shapes.
    Outputs and local temporaries are allocated fresh (NaN for floats, zero
    otherwise); register buffers are scalars. Raises :class:`KernelEvalError` when
    the kernel reads or writes out of bounds or binds an iteration variable outside
    its extent, and ``ValueError`` for missing inputs, dims or shape mismatches.
    """
    missing = [d for d in kernel.dims if d not in dims]
    if missing:
        raise ValueError(f"kernel {kernel.name}: no value for dims {missing}")
    store: dict[str, np.ndarray] = {}
    for buf in kernel.inputs:
        if buf.name not in arrays:
            raise ValueError(f"kernel {kernel.name}: missing input {buf.name!r}")
        a = np.array(arrays[buf.name], dtype=np.dtype(buf.dtype))
        want = eval_shape(buf.shape, dims)
        if a.shape != want:
            raise ValueError(
                f"kernel {kernel.name}: input {buf.name!r} has shape {a.shape}, expected {want}"
            )
        store[buf.name] = a
    for buf in kernel.outputs + kernel.temps:
        store[buf.name] = _alloc(buf, dims)
    run = _Compiler(store).stmts(kernel.body)
    env: Env = {k: np.int64(v) for k, v in dims.items()}
    with np.errstate(all="ignore"):
        run(env)
    return {b.name: store[b.name] for b in kernel.outputs}
