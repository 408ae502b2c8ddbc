"""Node makers for layout ops: Reshape, Transpose, Slice, Concat, Squeeze, Unsqueeze,
Expand, Flatten and Gather.

Parameters are drawn against the operand's shape (a symbolic dim counts with its
size in the first run): slices with any step and out-of-range starts and ends,
concats with new inputs that differ only along the axis, gathers with negative
indices, reshapes that merge or split axes (:func:`geode.fuzz.build.reshape_target`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import sympy

from geode.fuzz.gen_state import Gen

_BIG = int(np.iinfo(np.int64).max)


def _size(gen: Gen, d: object) -> int | None:
    """A dim's size in the first run (None for a compound symbolic dim)."""
    if isinstance(d, (int, np.integer)):
        return int(d)
    if isinstance(d, sympy.Symbol):
        return gen.case.dim(d.name).sizes[0]
    return None


def _ranked(gen: Gen, min_rank: int) -> str | None:
    return gen.pick(gen.values(lambda n: len(gen.env[n].shape) >= min_rank))


def make_transpose(gen: Gen) -> str | None:
    """Transpose by a random permutation (or the default reversal)."""
    x = _ranked(gen, 2)
    if x is None:
        return None
    rank = len(gen.env[x].shape)
    if gen.rng.random() < 0.2:
        return gen.add("Transpose", [x], {})
    perm = [int(p) for p in gen.rng.permutation(rank)]
    return gen.add("Transpose", [x], {"attrs": {"perm": perm}})


def _slice_bounds(gen: Gen, size: int, step: int) -> tuple[int, int]:
    r = gen.rng
    start = int(r.integers(-size - 2, size + 3))
    end = int(r.integers(-size - 2, size + 3))
    if r.random() < 0.15:
        end = _BIG if step > 0 else -_BIG
    return start, end


def make_slice(gen: Gen) -> str | None:
    """Slice one or two axes with steps of either sign and clamped bounds."""
    x = _ranked(gen, 1)
    if x is None:
        return None
    shape = gen.env[x].shape
    k = int(gen.rng.integers(1, min(2, len(shape)) + 1))
    axes = [int(a) for a in gen.rng.choice(len(shape), size=k, replace=False)]
    starts, ends, steps = [], [], []
    for a in axes:
        size = _size(gen, shape[a])
        if size is None:
            return None
        step = int(gen.rng.choice([1, 1, 1, 2, 3, -1, -2]))
        start, end = _slice_bounds(gen, size, step)
        starts.append(start)
        ends.append(end)
        steps.append(step)
    axes = [a - len(shape) if gen.rng.random() < 0.2 else a for a in axes]
    params = {"starts": starts, "ends": ends, "axes": axes, "steps": steps}
    return gen.add("Slice", [x], params)


def make_concat(gen: Gen) -> str | None:
    """Concat along a random axis with itself, a fitting value or a new input."""
    x = _ranked(gen, 1)
    if x is None:
        return None
    shape = gen.env[x].shape
    axis = int(gen.rng.integers(len(shape)))
    tokens = gen.tokens(x)
    others = []
    for _ in range(int(gen.rng.integers(1, 3))):
        if tokens is None or gen.rng.random() < 0.3:
            others.append(x)
            continue
        new = list(tokens)
        new[axis] = (
            str(gen.rng.choice([d.name for d in gen.case.dims]))
            if gen.rng.random() < 0.5
            else int(gen.rng.integers(1, 4))
        )
        others.append(gen.new_input(new, gen.dtype(x)))
    if gen.rng.random() < 0.3:
        axis -= len(shape)
    return gen.add("Concat", [x, *others], {"attrs": {"axis": axis}})


def make_squeeze(gen: Gen) -> str | None:
    """Squeeze some unit dims."""
    x = gen.pick(gen.values(lambda n: 1 in list(gen.env[n].shape)))
    if x is None:
        return None
    units = [a for a, d in enumerate(gen.env[x].shape) if d == 1]
    k = int(gen.rng.integers(1, len(units) + 1))
    axes = sorted(int(a) for a in gen.rng.choice(units, size=k, replace=False))
    return gen.add("Squeeze", [x], {"axes": axes})


def make_unsqueeze(gen: Gen) -> str | None:
    """Unsqueeze one or two new unit dims anywhere."""
    x = _ranked(gen, 0)
    if x is None:
        return None
    rank = len(gen.env[x].shape)
    k = int(gen.rng.integers(1, 3))
    axes = sorted(int(a) for a in gen.rng.choice(rank + k, size=k, replace=False))
    axes = [a - rank - k if gen.rng.random() < 0.2 else a for a in axes]
    return gen.add("Unsqueeze", [x], {"axes": axes})


def make_expand(gen: Gen) -> str | None:
    """Expand unit dims to static sizes, maybe with a new leading dim."""
    x = _ranked(gen, 0)
    if x is None:
        return None
    shape = gen.env[x].shape
    sizes = [d.sizes[0] for d in gen.case.dims if not d.symbolic] + [2, 3, 5]
    grow = {
        str(a): int(gen.rng.choice(sizes))
        for a, d in enumerate(shape)
        if d == 1 and gen.rng.random() < 0.7
    }
    lead = [int(gen.rng.choice(sizes))] if gen.rng.random() < 0.3 else []
    if not grow and not lead:
        return None
    return gen.add("Expand", [x], {"grow": grow, "lead": lead})


def make_flatten(gen: Gen) -> str | None:
    """Flatten to 2-D at a random axis."""
    x = _ranked(gen, 0)
    if x is None:
        return None
    rank = len(gen.env[x].shape)
    return gen.add("Flatten", [x], {"attrs": {"axis": int(gen.rng.integers(0, rank + 1))}})


def make_gather(gen: Gen) -> str | None:
    """Gather constant indices (negative ones too) along a random axis."""
    x = _ranked(gen, 1)
    if x is None:
        return None
    shape = gen.env[x].shape
    axis = int(gen.rng.integers(len(shape)))
    d = shape[axis]
    sizes = [_size(gen, d)] if not isinstance(d, sympy.Symbol) else gen.case.dim(d.name).sizes
    size = min(s for s in sizes if s is not None) if None not in sizes else 0
    if size <= 0:
        return None
    idx_shape = [(), (int(gen.rng.integers(1, 5)),), (2, int(gen.rng.integers(1, 3)))][
        int(gen.rng.integers(3))
    ]
    indices = gen.rng.integers(-size, size, idx_shape)
    return gen.add("Gather", [x], {"axis": axis, "indices": np.asarray(indices).tolist()})


def make_reshape(gen: Gen) -> str | None:
    """Reshape merging a run of axes into one, or splitting a static axis in two."""
    x = _ranked(gen, 1)
    if x is None:
        return None
    shape = gen.env[x].shape
    rank = len(shape)
    if rank >= 2 and gen.rng.random() < 0.6:
        a = int(gen.rng.integers(0, rank - 1))
        b = int(gen.rng.integers(a + 2, rank + 1))
        return gen.add("Reshape", [x], {"kind": "merge", "start": a, "stop": b})
    axes = [a for a, d in enumerate(shape) if isinstance(d, (int, np.integer)) and d >= 2]
    if not axes:
        return None
    a = int(gen.rng.choice(axes))
    d = int(shape[a])
    factors = [f for f in (1, 2, 3, 4, d) if d % f == 0]
    factor = int(gen.rng.choice(factors))
    return gen.add("Reshape", [x], {"kind": "split", "axis": a, "factor": factor})


LAYOUT_MAKERS: dict[str, Callable[[Gen], str | None]] = {
    "Concat": make_concat,
    "Expand": make_expand,
    "Flatten": make_flatten,
    "Gather": make_gather,
    "Reshape": make_reshape,
    "Slice": make_slice,
    "Squeeze": make_squeeze,
    "Transpose": make_transpose,
    "Unsqueeze": make_unsqueeze,
}


def make_layout(gen: Gen) -> str | None:
    """One layout op, drawn uniformly."""
    return LAYOUT_MAKERS[str(gen.rng.choice(sorted(LAYOUT_MAKERS)))](gen)
