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
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(self: ScheduleBase, *args: Any, **kwargs: Any) -> Any:
        top = self._depth == 0
        if top:  # a primitive called by another is neither recorded nor backed up
            bound = sig.bind(self, *args, **kwargs)
            bound.apply_defaults()
            record = {k: _plain(v) for k, v in list(bound.arguments.items())[1:]}
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


def _plain(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, np.integer):
        return int(v)
    return copy.deepcopy(v)
