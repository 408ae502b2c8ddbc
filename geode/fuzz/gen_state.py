"""The state of one fuzz case being generated (:class:`Gen`) and the draws it is made of.

:class:`Gen` holds the case, a working geode graph with every value built so far
(so each next choice sees real shapes and dtypes) and each value's exactness
(:mod:`geode.fuzz.oplib`). Its :meth:`Gen.add` builds one node: a node geode
refuses with a GeodeError is dropped and counted, one whose building raises
anything else is kept and ends the case (the runner then reports the crash).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from geode.compiler.ir import Graph, Value
from geode.compiler.shapes import dims_equal
from geode.errors import GeodeError
from geode.fuzz import oplib
from geode.fuzz.build import SpecError, apply_node, input_dims, shape_tokens
from geode.fuzz.data import fill_for, make_array
from geode.fuzz.spec import DTYPES, Case, InputSpec, NodeSpec

#: how often each input dtype is drawn
_DTYPE_WEIGHTS = {
    "float32": 0.42,
    "float64": 0.12,
    "float16": 0.08,
    "int32": 0.09,
    "int64": 0.09,
    "int8": 0.03,
    "int16": 0.02,
    "uint8": 0.04,
    "uint16": 0.02,
    "uint32": 0.02,
    "uint64": 0.02,
    "bool": 0.05,
}
#: the most elements an input may have in one run
MAX_ELEMENTS = 40_000
#: runs per case (symbolic dims get other sizes in each)
RUNS = 2


def draw_size(rng: np.random.Generator) -> int:
    """A dim size: 0 and 1 often, small sizes mostly, a few around vector widths."""
    r = rng.random()
    if r < 0.06:
        return 0
    if r < 0.2:
        return 1
    if r < 0.8:
        return int(rng.integers(2, 9))
    if r < 0.95:
        return int(rng.integers(9, 41))
    return int(rng.choice([63, 64, 65, 127, 128, 129]))


def draw_dtype(rng: np.random.Generator, allowed: tuple[str, ...] = DTYPES) -> str:
    """A dtype among ``allowed``, by the usual weights."""
    w = np.asarray([_DTYPE_WEIGHTS[d] for d in allowed])
    return str(rng.choice(allowed, p=w / w.sum()))


@dataclass
class GenStats:
    """What generation met: nodes geode refused (by op), nodes that crashed building."""

    refused: dict[str, int] = field(default_factory=dict)
    build_crashes: int = 0


@dataclass
class Gen:
    """The state of one case being generated: the case, its working graph and the
    value facts the next node's choices need."""

    rng: np.random.Generator
    case: Case
    graph: Graph
    env: dict[str, Value] = field(default_factory=dict)
    exact: dict[str, oplib.Exactness] = field(default_factory=dict)
    stats: GenStats = field(default_factory=GenStats)
    crashed: bool = False

    # -- values --------------------------------------------------------------------------
    def dtype(self, name: str) -> str:
        """dtype name of a value."""
        return str(self.env[name].dtype)

    def values(self, pred: Callable[[str], bool] = lambda _: True) -> list[str]:
        """Names of values satisfying ``pred`` (inputs and node outputs, oldest first)."""
        return [n for n in self.env if pred(n)]

    def pick(self, names: list[str]) -> str | None:
        """One of ``names``, recent ones likelier (chains grow deep)."""
        if not names:
            return None
        w = np.arange(1, len(names) + 1, dtype=np.float64) ** 1.5
        return str(self.rng.choice(names, p=w / w.sum()))

    def usable(self, name: str, discontinuous: bool) -> bool:
        """Whether a value may feed an op (exact floats only into discontinuous ops)."""
        if not discontinuous or not oplib.is_float(self.dtype(name)):
            return True
        return self.exact[name].exact

    def tokens(self, name: str) -> list[str | int] | None:
        """A value's shape in the case's terms (dim names, ints), None if compound."""
        return shape_tokens(self.case, self.env[name].shape)

    # -- growing the case ----------------------------------------------------------------
    def new_input(self, dims: list[str | int], dtype: str) -> str:
        """Add a graph input (and its arrays in every run); returns its name."""
        name = self.case.fresh_name("x")
        spec = InputSpec(name, list(dims), dtype)
        self.case.inputs.append(spec)
        self.env[name] = self.graph.input(name, input_dims(self.case, spec.dims), dtype)
        self.exact[name] = oplib.Exactness(True, True)
        fill = fill_for(self.rng, dtype)
        for run, feeds in enumerate(self.case.feeds):
            shape = tuple(
                self.case.dim(d).size(run) if isinstance(d, str) else int(d) for d in dims
            )
            feeds[name] = make_array(self.rng, shape, dtype, fill)
        return name

    def const(self, value: object, dtype: str) -> str:
        """Add a Const node; returns its value name."""
        data = np.asarray(value, dtype=np.dtype(dtype))
        out = self.add("Const", [], {"value": data.tolist(), "dtype": dtype})
        assert out is not None  # a constant of a supported dtype always builds
        return out

    def add(self, op: str, args: list[str], params: dict) -> str | None:
        """Build one node; its output name, or None when geode refused it (counted).
        A node whose building crashes is kept and ends the case (``crashed``)."""
        node = NodeSpec(op, list(args), params, self.case.fresh_name("v"))
        try:
            out = apply_node(self.graph, self.env, node)
        except SpecError:
            return None
        except GeodeError:
            self.stats.refused[op] = self.stats.refused.get(op, 0) + 1
            return None
        except Exception:  # noqa: BLE001 - a crash in geode's builder: the case shows it
            self.stats.build_crashes += 1
            self.case.nodes.append(node)
            self.crashed = True
            return None
        self.graph.rename(out, node.out)
        self.case.nodes.append(node)
        self.env[node.out] = out
        given = [a for a in args if a]
        float_args = any(oplib.is_float(self.dtype(a)) for a in given)
        self.exact[node.out] = oplib.node_exactness(
            op, params, [self.exact[a] for a in given], float_args
        )
        return node.out

    def partner(self, name: str, dtype: str, discontinuous: bool) -> str:
        """A second operand for ``name`` of ``dtype`` that broadcasts with it: an existing
        value, a new input of a broadcasting shape, or a scalar constant."""
        r = self.rng.random()
        if r < 0.4:
            shape = self.env[name].shape
            fits = self.values(
                lambda n: (
                    self.dtype(n) == dtype
                    and self.usable(n, discontinuous)
                    and broadcastable(shape, self.env[n].shape)
                )
            )
            chosen = self.pick(fits)
            if chosen is not None:
                return chosen
        if r < 0.8:
            tokens = self.tokens(name) or [1] * len(self.env[name].shape)
            return self.new_input(broadcast_partner(self.rng, tokens), dtype)
        return self.const(scalar_for(self.rng, dtype), dtype)


def broadcastable(a: tuple, b: tuple) -> bool:
    """Whether two shapes broadcast for certain (aligned dims equal, or one is 1)."""
    for x, y in zip(reversed(a), reversed(b)):
        if not (x == 1 or y == 1 or dims_equal(x, y) is True):
            return False
    return True


def broadcast_partner(rng: np.random.Generator, tokens: list[str | int]) -> list[str | int]:
    """A shape broadcasting against ``tokens``: some dims 1, some leading dims dropped,
    sometimes a new leading dim of 1."""
    out = [t if rng.random() < 0.7 else 1 for t in tokens]
    if out and rng.random() < 0.3:
        out = out[int(rng.integers(1, len(out) + 1)) :]
    if rng.random() < 0.1:
        out = [1, *out]
    return out


def scalar_for(rng: np.random.Generator, dtype: str) -> object:
    """A scalar constant of ``dtype``."""
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return bool(rng.random() < 0.5)
    if dt.kind in "iu":
        lo = 0 if dt.kind == "u" else -5
        return int(rng.integers(lo, 6))
    return float(rng.choice([0.0, 0.5, -1.0, 2.0, 3.0, 1e-3, -7.25, np.inf, np.nan, 1e4]))
