"""Random fuzz graphs: :func:`generate_case` turns (seed, index) into a :class:`Case`.

The generator draws dim variables (symbolic or static, sizes 0 and 1 included), a
few graph inputs over them, then nodes one at a time from the op families of
:mod:`geode.fuzz.gen_math` (unary math, transcendental and not; binary arithmetic,
comparisons and logic with broadcasting partners; Where, Clip, casts, reductions
over random axes, softmax) and :mod:`geode.fuzz.gen_layout` (Reshape, Transpose,
Slice, Concat, Squeeze, Unsqueeze, Expand, Flatten, Gather). dtypes come from
geode's op registry (what geode claims to support). Outputs are the values nothing
reads, sometimes plus an intermediate.

Everything is drawn from ``numpy.random.default_rng([seed, index])``: the same
(seed, index) gives the same case on every machine.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from geode.compiler.ir import Graph
from geode.fuzz import gen_math
from geode.fuzz.gen_layout import make_layout
from geode.fuzz.gen_state import MAX_ELEMENTS, RUNS, Gen, GenStats, draw_dtype, draw_size
from geode.fuzz.spec import Case, DimSpec

_FAMILIES: list[tuple[Callable[[Gen], str | None], float]] = [
    (gen_math.make_unary, 0.24),
    (gen_math.make_binary, 0.3),
    (gen_math.make_where, 0.05),
    (gen_math.make_clip, 0.03),
    (gen_math.make_cast, 0.08),
    (gen_math.make_reduce, 0.1),
    (gen_math.make_softmax, 0.03),
    (make_layout, 0.17),
]


def _draw_dims(rng: np.random.Generator) -> list[DimSpec]:
    dims: list[DimSpec] = []
    static_sizes: set[int] = set()
    for k in range(int(rng.integers(1, 4))):
        if rng.random() < 0.4:
            dims.append(DimSpec(f"N{k}", True, [draw_size(rng) for _ in range(RUNS)]))
            continue
        size = draw_size(rng)
        while size == 1 or size in static_sizes:  # size 1 is a literal; sizes name dims
            size = draw_size(rng)
        static_sizes.add(size)
        dims.append(DimSpec(f"D{k}", False, [size]))
    return dims


def _draw_input_dims(rng: np.random.Generator, case: Case) -> list[str | int]:
    for _ in range(20):
        rank = int(rng.choice([0, 1, 2, 3, 4], p=[0.06, 0.24, 0.36, 0.24, 0.1]))
        dims: list[str | int] = [
            str(rng.choice([d.name for d in case.dims])) if rng.random() < 0.85 else 1
            for _ in range(rank)
        ]
        sizes = [
            int(np.prod([case.dim(d).size(r) if isinstance(d, str) else d for d in dims]))
            for r in range(RUNS)
        ]
        if max(sizes, default=1) <= MAX_ELEMENTS:
            return dims
    return [1]


def generate_case(seed: int, index: int, max_nodes: int = 8, stats: GenStats | None = None) -> Case:
    """The fuzz case number ``index`` of ``seed``: a graph of 1..``max_nodes`` nodes
    with its inputs' arrays for every run."""
    rng = np.random.default_rng([seed, index])
    case = Case(seed, index, _draw_dims(rng), [], [], [], [{} for _ in range(RUNS)])
    gen = Gen(rng, case, Graph(f"fuzz_{seed}_{index}"), stats=stats or GenStats())
    for _ in range(int(rng.integers(1, 4))):
        gen.new_input(_draw_input_dims(rng, case), draw_dtype(rng))
    target = int(rng.integers(1, max_nodes + 1))
    makers = [m for m, _ in _FAMILIES]
    weights = np.asarray([w for _, w in _FAMILIES])
    built = 0
    for _ in range(6 * target):
        if built >= target or gen.crashed:
            break
        maker = makers[int(rng.choice(len(makers), p=weights / weights.sum()))]
        if maker(gen) is not None:
            built += 1
    if not any(n.op != "Const" for n in case.nodes) and not gen.crashed:
        gen.add("Identity", [case.inputs[0].name], {})
    case.outputs = _choose_outputs(rng, case)
    case.prune()
    return case


def _choose_outputs(rng: np.random.Generator, case: Case) -> list[str]:
    computed = [n.out for n in case.nodes if n.op != "Const"]
    read = {a for n in case.nodes for a in n.args}
    outs = [v for v in computed if v not in read]
    extra = [v for v in computed if v not in outs]
    if extra and rng.random() < 0.3:
        outs.append(str(rng.choice(extra)))
    return outs[-4:] or computed[-1:]
