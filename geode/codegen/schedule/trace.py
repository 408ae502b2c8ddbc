"""The trace of a schedule: every primitive applied, replayable on a fresh kernel.

:func:`primitive` makes a :class:`~geode.codegen.schedule.Schedule` method a
primitive: atomic (the kernel is restored when it raises) and recorded in the trace.
"""

from __future__ import annotations

import copy
import functools
import inspect
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from geode.codegen.ast import Kernel

if TYPE_CHECKING:
    from geode.codegen.schedule import Schedule
    from geode.codegen.schedule.base import ScheduleBase


@dataclass
class TraceStep:
    """One applied primitive: its name, its arguments by keyword, and what it returned."""

    primitive: str
    args: dict[str, Any]
    result: Any = None

    def __str__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.args.items())
        out = f"{self.primitive}({args})"
        return out if self.result is None else f"{out} -> {self.result!r}"


@dataclass
class Trace:
    """The primitives applied by a :class:`Schedule`, in order."""

    steps: list[TraceStep] = field(default_factory=list)

    def append(self, step: TraceStep) -> None:
        """Record one more step."""
        self.steps.append(step)

    def __iter__(self) -> Iterator[TraceStep]:
        return iter(self.steps)

    def __len__(self) -> int:
        return len(self.steps)

    def __getitem__(self, i: int) -> TraceStep:
        return self.steps[i]

    def __str__(self) -> str:
        return "\n".join(str(s) for s in self.steps)

    def replay(self, kernel: Kernel) -> Schedule:
        """Apply the steps again to a fresh copy of ``kernel`` (the kernel the trace was
        recorded on, as lowered) and return the resulting schedule."""
        from geode.codegen.schedule import Schedule

        sch = Schedule(kernel)
        for step in self.steps:
            getattr(sch, step.primitive)(**copy.deepcopy(step.args))
        return sch

    def to_json(self, indent: int | None = 1) -> str:
        """The trace as JSON text (the versioned, data-only format of
        :mod:`geode.codegen.schedule.trace_json`)."""
        from geode.codegen.schedule.trace_json import trace_to_json

        return trace_to_json(self, indent)

    @classmethod
    def from_json(cls, text: str | bytes, where: str = "trace") -> Trace:
        """The trace of JSON ``text``; :class:`~geode.errors.TraceError` naming ``where``,
        the step and the argument when it is malformed."""
        from geode.codegen.schedule.trace_json import trace_from_json

        return trace_from_json(text, where)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the trace to ``path`` as JSON (atomically)."""
        from geode.codegen.schedule.trace_json import save_trace

        save_trace(self, path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Trace:
        """The trace saved at ``path`` (see :meth:`save`)."""
        from geode.codegen.schedule.trace_json import load_trace

        return load_trace(path)


F = TypeVar("F", bound=Callable[..., Any])


def primitive(fn: F) -> F:
    """Make a method a schedule primitive: atomic (the kernel is restored when it
    raises) and recorded in the trace (only when called by the user, not by another
    primitive)."""
    arguments = _binder(fn)

    @functools.wraps(fn)
    def wrapper(self: ScheduleBase, *args: Any, **kwargs: Any) -> Any:
        top = self._depth == 0
        if top:  # a primitive called by another is neither recorded nor backed up
            record = {k: _plain(v) for k, v in arguments(self, args, kwargs).items()}
        backup = copy.deepcopy(self.kernel) if top else None
        self._depth += 1
        try:
            result = fn(self, *args, **kwargs)
        except BaseException:
            if top:
                self.kernel = backup  # type: ignore[assignment]
            raise
        finally:
            self._depth -= 1
        if top:
            self.trace.append(TraceStep(fn.__name__, record, copy.deepcopy(result)))
        return result

    wrapper.__geode_primitive__ = True  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]


def _binder(fn: Callable[..., Any]) -> Callable[[Any, tuple, dict], dict[str, Any]]:
    """``arguments(self, args, kwargs)``: a call's arguments by name, defaults applied,
    in the order of ``fn``'s parameters (past ``self``), as ``inspect``'s binding gives
    them; a call of the usual shape (positional, then keyword, every parameter plain)
    is bound directly, anything else (and every bad call, which raises) by ``inspect``."""
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())[1:]
    names = [p.name for p in params]
    defaults = {p.name: p.default for p in params if p.default is not p.empty}
    plain = all(p.kind is p.POSITIONAL_OR_KEYWORD for p in params)

    def arguments(self: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
        rest = names[len(args) :]
        if (
            plain
            and len(args) <= len(names)
            and all(k in rest for k in kwargs)
            and all(n in kwargs or n in defaults for n in rest)
        ):
            out = dict(zip(names, args))
            for n in rest:
                out[n] = kwargs[n] if n in kwargs else defaults[n]
            return out
        bound = sig.bind(self, *args, **kwargs)
        bound.apply_defaults()
        return dict(list(bound.arguments.items())[1:])

    return arguments


def _plain(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, np.integer):
        return int(v)
    return copy.deepcopy(v)
