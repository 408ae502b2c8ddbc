"""The plan the session hands the runtime: slots, steps, input specs, memory plan.

A plan holds no compiler objects: shapes are functions of the bound symbol values
(``env``: symbol name -> int), kernels are bound callables. A step function has the
signature ``fn(inputs, outs, env) -> outputs``: ``outs`` holds a preallocated buffer
per output (or None when the step allocates its own); it returns the output arrays.

An :class:`Alias` is a value with no buffer and no step of its own: a view (reshape,
contiguous slice) of its *root*, the slot that owns the storage. The executor makes it
from the root's array when the root is there (at the start of a run for inputs and
constants, after the root's step otherwise); the memory plan keeps the root's buffer
live until the last use of any of its aliases.

A :class:`Commit` writes a variable once all of a run's steps have run (the graph's
writes, see ``geode/compiler/passes/variable_prepare.py``): no step sees the VarManager
change under it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from geode.runtime.memory import MemoryPlan
from geode.runtime.var_manager import VarKey

Env = Mapping[str, int]
ShapeFn = Callable[[Env], tuple[int, ...]]
StepFn = Callable[[list, list, Env], Sequence[np.ndarray]]


@dataclass
class DimCheck:
    """A dim of an input that is an expression of symbols, checked once they are bound."""

    axis: int
    fn: Callable[[Env], int]
    text: str


@dataclass
class InputSpec:
    """A model input: dtype and dims (int: static, str: a symbol it binds, None: checked later)."""

    name: str
    slot: int
    dtype: np.dtype
    dims: tuple[int | str | None, ...] | None
    dim_text: tuple[str, ...] = ()
    checks: tuple[DimCheck, ...] = ()

    def signature(self) -> str:
        """``x: float32[N, 768]``."""
        if self.dims is None:
            return f"{self.name}: {self.dtype}[?]"
        return f"{self.name}: {self.dtype}[{', '.join(self.dim_text)}]"


@dataclass
class Slot:
    """A tensor the plan stores: an input, constant, variable or activation."""

    name: str
    dtype: np.dtype
    role: str  # input | constant | variable | activation
    shape: ShapeFn | None = None  # None: known only once its step ran
    var_key: VarKey | None = None
    binds: tuple[tuple[int, str], ...] = ()  # (axis, symbol) bound from the produced array
    shape_text: str = ""


@dataclass
class Step:
    """One unit of work on one engine."""

    name: str
    engine: str
    fn: StepFn
    inputs: list[int | None]
    outputs: list[int]
    label: str = ""
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Alias:
    """A slot that shares its root's storage: ``view(root_array, env)`` is its value.

    ``source`` is the slot it views (itself an alias, or the root); ``root`` owns the
    storage and is never an alias; ``text`` says what it is (``Reshape 'r' of 'h'``);
    ``reshape``: the view only reshapes the root (no slice on the way)."""

    slot: int
    source: int
    root: int
    view: Callable[[np.ndarray, Env], np.ndarray]
    text: str = ""
    reshape: bool = True


@dataclass
class Commit:
    """A write of a variable when the run ends (a graph's VarRef): the value of ``slot``,
    in the user's layout, becomes variable ``key``'s value (converted to its storage
    format by the VarManager)."""

    slot: int
    key: VarKey
    text: str = ""


@dataclass
class Constraint:
    """Two dim expressions that must agree at run time."""

    lhs: Callable[[Env], int]
    rhs: Callable[[Env], int]
    symbols: frozenset[str]
    text: str


@dataclass
class BroadcastConstraint:
    """Dims broadcast together (ONNX): at run time those that are not 1 must be equal.

    ``dims`` holds each dim's value as a function of the binding and its text (``N``);
    ``where`` names the op that broadcasts them."""

    dims: tuple[tuple[Callable[[Env], int], str], ...]
    symbols: frozenset[str]
    where: str

    def violation(self, env: Env) -> str | None:
        """None when the bound dims broadcast, else what is wrong, naming two dims that
        are neither equal nor 1 and their values."""
        seen: tuple[str, int] | None = None
        for fn, text in self.dims:
            v = fn(env)
            if v == 1:
                continue
            if seen is not None and seen[1] != v:
                a, b = _named(*seen), _named(text, v)
                return (
                    f"dims {a} and {b} cannot broadcast "
                    f"(they must be equal or one of them 1) at {self.where}"
                )
            seen = seen or (text, v)
        return None


def _named(text: str, value: int) -> str:
    """``N = 5`` for a symbolic dim, ``5`` for a static one."""
    return text if text == str(value) else f"{text} = {value}"


@dataclass
class Plan:
    """Everything the executor needs to run a compiled graph."""

    name: str
    inputs: list[InputSpec]
    outputs: list[tuple[str, int]]
    slots: list[Slot]
    steps: list[Step]
    constraints: list[Constraint] = field(default_factory=list)
    memory: MemoryPlan | None = None
    arena_slots: frozenset[int] = frozenset()
    #: slots to drop after each step (last use), so dynamic buffers are freed early
    release: list[list[int]] = field(default_factory=list)
    #: steps whose outputs depend only on the input shapes (the symbol binding) and on
    #: constants: shape arithmetic, masks built from it. The executor runs them once per
    #: binding and reuses their results (see ``Executor.run``)
    memo_steps: frozenset[int] = frozenset()
    #: slot -> its alias record, for every slot that is a view of another's storage
    aliases: dict[int, Alias] = field(default_factory=dict)
    #: aliases of inputs and constants: made at the start of a run
    alias_start: list[int] = field(default_factory=list)
    #: per step, the aliases of what it produced: made right after it ran
    alias_after: list[list[int]] = field(default_factory=list)
    #: the memory plan in words (arena buffers and their live ranges, aliases), for
    #: ``explain()`` and the dumps
    memory_text: str = ""
    #: the variables the run writes, in order, once every step has run
    commits: list[Commit] = field(default_factory=list)
    #: dims broadcast together by symbolic broadcasts, checked once the inputs bind them
    broadcasts: list[BroadcastConstraint] = field(default_factory=list)
    #: the most bytes a run may ask for (the ``memory_limit_mb`` option); 0: the memory
    #: available at the time (see :mod:`geode.runtime.memlimit`)
    memory_limit: int = 0
    #: per step, the constraints and broadcasts over symbols a step binds (a NonZero's
    #: count) that become checkable once it has run: checked right after it, before any
    #: kernel that relies on them
    checks_after: list[list[Constraint | BroadcastConstraint]] = field(default_factory=list)

    def root(self, slot: int) -> int:
        """The slot that owns ``slot``'s storage (``slot`` itself unless an alias)."""
        alias = self.aliases.get(slot)
        return slot if alias is None else alias.root
