"""Expression and statement patterns the numba backend prints as one fused call.

Pure matchers over the loop AST (no emitter state): each returns the parts of the form
it recognises, or None. The emitter (:mod:`geode.codegen.backends.numba`) decides from
the dtypes whether to use them:

- :func:`one_plus_tanh_parts`: ``1 + tanh(z)`` -> vmath's ``one_plus_tanh``;
- :func:`product_factors`, :func:`is_const`: the tanh GELU's ``0.5 * a * (1 + tanh(z))``
  in any grouping -> vmath's ``div_one_plus_exp(a, -2z)``;
- :func:`cubic_parts`: the GELU's ``z = c * (h + k * h * h * h)``, whose ``-2z`` is
  printed as ``h * (-2c + (-2ck) * (h * h))``;
- :func:`scaled_stage` and :func:`flat_index`: a staged chunk ``stage[j] = buf[.. + j] *
  s`` and its ``StreamStore`` -> one ``_g_stream_scaled`` from ``buf``.
"""

from __future__ import annotations

from collections.abc import Sequence

from geode.codegen.ast import (
    Bin,
    Block,
    Const,
    Expr,
    For,
    ForKind,
    Load,
    Stmt,
    Store,
    StreamStore,
    Un,
    Var,
    free_vars,
    substitute,
)


def is_const(e: Expr, value: float) -> bool:
    """A non-bool constant equal to ``value``."""
    return isinstance(e, Const) and e.dtype != "bool" and float(e.value) == value  # type: ignore[arg-type]


def one_plus_tanh_parts(e: Expr) -> tuple[Const, Un] | None:
    """``(1, tanh(z))`` when ``e`` is ``1 + tanh(z)`` or ``tanh(z) + 1``, else None."""
    if not (isinstance(e, Bin) and e.op == "+"):
        return None
    for c, t in ((e.a, e.b), (e.b, e.a)):
        if is_const(c, 1.0) and isinstance(t, Un) and t.op == "tanh":
            return c, t  # type: ignore[return-value]
    return None


def scaled_stage(f: Stmt, ss: Stmt) -> tuple[Load, Expr, bool] | None:
    """``(buf[...], s, divide)`` when loop ``f`` (serial or vectorized, one flat block, one
    store) stages ``buf[..., x + j] * s``, ``s * buf[...]`` or ``buf[...] / s`` (``divide``)
    at ``stage[j]`` for its variable ``j`` (``x`` and every other index of ``buf``, and
    ``s``, free of ``j``), and ``ss`` is a stream from that stage; None otherwise."""
    if not (isinstance(f, For) and isinstance(ss, StreamStore)):
        return None
    if f.kind not in (ForKind.SERIAL, ForKind.VECTORIZED) or len(f.body) != 1:
        return None
    b = f.body[0]
    if not isinstance(b, Block) or b.predicate is not None or len(b.body) != 1:
        return None
    st = b.body[0]
    if not isinstance(st, Store) or st.buffer != ss.src or len(st.indices) != 1:
        return None
    binds = {iv.name: x for iv, x in zip(b.iter_vars, b.bindings)}
    j = Var(f.var)
    if substitute(st.indices[0], binds) != j:
        return None
    v = substitute(st.value, binds)
    if not isinstance(v, Bin) or v.op not in ("*", "/"):
        return None
    pairs = [(v.a, v.b)] if v.op == "/" else [(v.a, v.b), (v.b, v.a)]
    for load, scale in pairs:
        if not isinstance(load, Load) or not load.indices or f.var in free_vars(scale):
            continue
        *outer, last = load.indices
        unit = last == j or (
            isinstance(last, Bin)
            and last.op == "+"
            and any(
                a == j and f.var not in free_vars(b)
                for a, b in ((last.a, last.b), (last.b, last.a))
            )
        )
        if unit and not any(f.var in free_vars(x) for x in outer):
            return load, scale, v.op == "/"
    return None


def flat_index(idx: Sequence[Expr], shape: Sequence[Expr]) -> Expr:
    """Row-major flat offset of index ``idx`` in an array of ``shape``."""
    out: Expr = idx[0] if idx else Const(0)
    for i, n in zip(idx[1:], shape[1:]):
        out = Bin("+", Bin("*", out, n), i)
    return out


def cubic_parts(z: Expr) -> tuple[Expr, Const, Const] | None:
    """``(h, c, k)`` when ``z`` is ``c * (h + k * h * h * h)`` (the tanh GELU's inner
    polynomial; products in any grouping, the sum in either order) with float constants
    ``c`` and ``k``; None otherwise."""
    fs = product_factors(z)
    consts = [f for f in fs if isinstance(f, Const) and f.dtype.startswith("float")]
    rest = [f for f in fs if not isinstance(f, Const)]
    if len(consts) != 1 or len(rest) != 1 or len(fs) != 2:
        return None
    s = rest[0]
    if not (isinstance(s, Bin) and s.op == "+"):
        return None
    for h, cube in ((s.a, s.b), (s.b, s.a)):
        cf = product_factors(cube)
        ks = [f for f in cf if isinstance(f, Const) and f.dtype.startswith("float")]
        hs = [f for f in cf if not isinstance(f, Const)]
        if len(ks) == 1 and len(hs) == 3 and len(cf) == 4 and all(x == h for x in hs):
            return h, consts[0], ks[0]  # type: ignore[return-value]
    return None


def product_factors(e: Expr) -> list[Expr]:
    """The factors of a tree of ``*`` (``e`` itself when it is no product)."""
    if isinstance(e, Bin) and e.op == "*":
        return product_factors(e.a) + product_factors(e.b)
    return [e]
