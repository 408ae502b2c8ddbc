"""Node makers for math: unary ops, binary ops, Where, Clip, Cast, reductions, softmax.

Each maker draws an op, operands its registry dtypes allow (exact floats only into
discontinuous ops) and parameters, and adds the node through :meth:`Gen.add`;
it returns the new value's name, or None when nothing fitted or geode refused.
"""

from __future__ import annotations

from geode.fuzz import oplib
from geode.fuzz.gen_state import Gen, broadcastable, draw_dtype, scalar_for


def make_unary(gen: Gen) -> str | None:
    """A one-input op on a value its registry dtypes allow."""
    op = str(gen.rng.choice(oplib.UNARY))
    allowed = oplib.allowed_dtypes(op)
    disc = op in oplib.DISCONTINUOUS_UNARY
    x = gen.pick(gen.values(lambda n: gen.dtype(n) in allowed and gen.usable(n, disc)))
    if x is None:
        return None
    choices = oplib.UNARY_ATTRS.get(op, [{}])
    attrs = choices[int(gen.rng.integers(len(choices)))]
    return gen.add(op, [x], {"attrs": dict(attrs)} if attrs else {})


def _binary_attrs(gen: Gen, op: str, dtype: str) -> dict:
    if op == "Mod":
        fmod = 1 if oplib.is_float(dtype) and gen.rng.random() < 0.7 else int(gen.rng.integers(2))
        return {"attrs": {"fmod": fmod}}
    if op == "BitShift":
        return {"attrs": {"direction": str(gen.rng.choice(["LEFT", "RIGHT"]))}}
    return {}


def make_binary(gen: Gen) -> str | None:
    """A broadcasting two-input op (Sum, Mean, Max and Min sometimes take three)."""
    op = str(gen.rng.choice(oplib.BINARY))
    allowed = oplib.allowed_dtypes(op)
    disc = op in oplib.COMPARE or op == "Mod"
    a = gen.pick(gen.values(lambda n: gen.dtype(n) in allowed and gen.usable(n, disc)))
    if a is None:
        return None
    dtype = gen.dtype(a)
    if op == "Pow":
        exp_dtype = draw_dtype(gen.rng, oplib.allowed_dtypes("Pow", "T1"))
        if gen.rng.random() < 0.6:
            value = (
                gen.rng.choice([2.0, 3.0, 0.5, -1.0, 1.5, 0.0])
                if oplib.is_float(exp_dtype)
                else gen.rng.integers(-1, 4)
            )
            b = gen.const(value, exp_dtype)
        else:
            b = gen.partner(a, exp_dtype, False)
        return gen.add(op, [a, b], {})
    args = [a, gen.partner(a, dtype, disc)]
    if op in ("Sum", "Mean", "Max", "Min") and gen.rng.random() < 0.3:
        args.append(gen.partner(a, dtype, disc))
    return gen.add(op, args, _binary_attrs(gen, op, dtype))


def make_where(gen: Gen) -> str | None:
    """Where(condition, a, b), all three broadcasting."""
    a = gen.pick(gen.values())
    if a is None:
        return None
    dtype = gen.dtype(a)
    conds = gen.values(
        lambda n: gen.dtype(n) == "bool" and broadcastable(gen.env[n].shape, gen.env[a].shape)
    )
    cond = gen.pick(conds) if conds and gen.rng.random() < 0.7 else None
    if cond is None:
        cond = gen.partner(a, "bool", True)
    return gen.add("Where", [cond, a, gen.partner(a, dtype, False)], {})


def make_clip(gen: Gen) -> str | None:
    """Clip(x, min?, max?) with scalar constant bounds (min > max sometimes)."""
    allowed = oplib.allowed_dtypes("Clip")
    x = gen.pick(gen.values(lambda n: gen.dtype(n) in allowed))
    if x is None:
        return None
    dtype = gen.dtype(x)
    bounds = [gen.const(scalar_for(gen.rng, dtype), dtype) if gen.rng.random() < 0.7 else ""]
    if gen.rng.random() < 0.7:
        bounds.append(gen.const(scalar_for(gen.rng, dtype), dtype))
    while bounds and not bounds[-1]:
        bounds.pop()
    return gen.add("Clip", [x, *bounds], {})


def make_cast(gen: Gen) -> str | None:
    """Cast to another dtype (floats into integers only when exact)."""
    to = draw_dtype(gen.rng)
    disc = not oplib.is_float(to)
    x = gen.pick(gen.values(lambda n: gen.dtype(n) != to and gen.usable(n, disc)))
    if x is None:
        return None
    return gen.add("Cast", [x], {"to": to})


def make_reduce(gen: Gen) -> str | None:
    """A reduction over a random set of axes (all, some, negative), keepdims or not."""
    op = str(gen.rng.choice(oplib.REDUCE))
    allowed = oplib.allowed_dtypes(op)
    x = gen.pick(gen.values(lambda n: gen.dtype(n) in allowed))
    if x is None:
        return None
    rank = len(gen.env[x].shape)
    params: dict = {"keepdims": int(gen.rng.integers(2))}
    if rank and gen.rng.random() < 0.8:
        k = int(gen.rng.integers(1, rank + 1))
        axes = sorted(int(a) for a in gen.rng.choice(rank, size=k, replace=False))
        params["axes"] = [a - rank if gen.rng.random() < 0.3 else a for a in axes]
    elif gen.rng.random() < 0.2:
        params["axes"] = []
        params["noop"] = int(gen.rng.integers(2))
    return gen.add(op, [x], params)


def make_softmax(gen: Gen) -> str | None:
    """Softmax or LogSoftmax along a random axis of a float value."""
    op = str(gen.rng.choice(oplib.SOFTMAX))
    x = gen.pick(gen.values(lambda n: oplib.is_float(gen.dtype(n)) and gen.env[n].shape != ()))
    if x is None:
        return None
    rank = len(gen.env[x].shape)
    return gen.add(op, [x], {"attrs": {"axis": int(gen.rng.integers(-rank, rank))}})
