"""Which schedule a kernel gets: one the user gave, a tuned one, or the default.

``geode.compile(model, schedules={kernel_key: trace_or_function})`` gives kernels
their schedules by key (:func:`geode.codegen.kernel_key.kernel_key`, shown by
``model.explain()``): a :class:`~geode.codegen.schedule.Trace` is replayed on the
kernel's canonical form (checked step by step,
:func:`~geode.codegen.schedule.trace_json.replay_checked`), a function is called with
a fresh :class:`~geode.codegen.schedule.Schedule` of that form and applies primitives
to it (it may also return another Schedule of the same kernel). Either failing is a
:class:`~geode.errors.UserScheduleError` naming the kernel and the key: the compile
stops, the schedule is not silently dropped.

Otherwise, with a tuning database (``tuning_db=`` / ``GEODE_TUNING_DB``), a kernel
with an entry for this device and thread count gets its tuned trace
(:mod:`geode.codegen.tuning_db`); an entry whose trace no longer replays (a kernel
changed by another geode version) is skipped with a warning and the default is used.
Everything else gets the default schedule of its pattern
(:func:`geode.codegen.autoschedule.schedule_group`).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from geode.codegen.lower import LoweredKernel
from geode.codegen.schedule import Schedule, Trace
from geode.codegen.schedule.trace_json import replay_checked
from geode.codegen.tuning_db import (
    TunedEntry,
    TuningDB,
    device_fingerprint,
    effective_threads,
)
from geode.config import Options
from geode.debug import log
from geode.errors import GeodeError, TraceError, UserScheduleError

#: what :attr:`ScheduleChoice.origin` may be
ORIGINS = ("default", "given", "tuned", "tuned-default")


class TunedScheduleWarning(UserWarning):
    """A tuning database's schedule did not replay on its kernel; the default is used."""


@dataclass
class ScheduleChoice:
    """Where a kernel's schedule comes from: ``origin`` (one of :data:`ORIGINS`), the
    user's trace or function, or the tuning database's entry."""

    origin: str
    given: Any = None
    entry: TunedEntry | None = None

    def describe(self) -> str:
        """One line for ``explain()``."""
        if self.origin == "given":
            kind = "trace" if isinstance(self.given, Trace) else "function"
            return f"given ({kind})"
        if self.entry is not None and self.origin == "tuned":
            e = self.entry
            return f"tuned ({e.speedup:.2f}x the default, {e.trials} trials)"
        if self.origin == "tuned-default":
            return "tuned (the default was best)"
        return "default"


@dataclass
class ScheduleSources:
    """What one compile may draw schedules from: the user's ``schedules`` and the
    tuning database, with the device key its entries are looked up under."""

    given: Mapping[str, Any] = field(default_factory=dict)
    db: TuningDB | None = None
    device: str = ""
    #: keys of ``given`` some kernel used
    used: set[str] = field(default_factory=set)

    def choose(self, key: str) -> ScheduleChoice:
        """The choice for the kernel with ``key``."""
        if key in self.given:
            self.used.add(key)
            return ScheduleChoice("given", given=self.given[key])
        entry = self.db.get(key, self.device) if self.db is not None else None
        if entry is None:
            return ScheduleChoice("default")
        return ScheduleChoice("tuned" if entry.status == "tuned" else "tuned-default", entry=entry)

    def unused(self) -> list[str]:
        """Keys of ``given`` that matched no kernel."""
        return sorted(set(self.given) - self.used)


_DB_MEMO: dict[tuple[str, int, int, bool], TuningDB] = {}


def open_tuning_db(path: str, sign: bool) -> TuningDB:
    """The tuning database at ``path``, read once per version of the file."""
    p = os.path.abspath(path)
    try:
        st = os.stat(p)
        memo_key = (p, st.st_mtime_ns, st.st_size, sign)
    except OSError:
        return TuningDB.open(p, sign)
    if memo_key not in _DB_MEMO:
        if len(_DB_MEMO) > 16:
            _DB_MEMO.clear()
        _DB_MEMO[memo_key] = TuningDB.open(p, sign)
    return _DB_MEMO[memo_key]


def schedule_sources(opts: Options) -> ScheduleSources:
    """The sources of one compile with ``opts`` (TuningError when the database given
    cannot be used; the numba backend uses none: its code differs)."""
    db = None
    device = ""
    if opts.tuning_db and opts.backend == "llvm":
        db = open_tuning_db(opts.tuning_db, opts.cache_sign)
        device = device_fingerprint(effective_threads(opts.num_threads))
    elif opts.tuning_db:
        log.info("tuning database %s not used: it is for the llvm backend", opts.tuning_db)
    return ScheduleSources(dict(opts.schedules or {}), db, device)


def apply_choice(
    choice: ScheduleChoice, lowered: LoweredKernel, name: str, key: str
) -> Schedule | None:
    """The schedule ``choice`` makes of ``lowered`` (in canonical form), or None for the
    default. A given schedule that fails raises :class:`UserScheduleError`; a tuned one
    that fails warns and gives None."""
    where = f"kernel {name} (key {key})"
    if choice.origin == "given":
        return _given(choice.given, lowered, where)
    if choice.origin == "tuned" and choice.entry is not None:
        try:
            return replay_checked(choice.entry.trace, lowered.kernel, f"tuned schedule of {where}")
        except TraceError as exc:
            warnings.warn(f"{exc}; the default schedule is used", TunedScheduleWarning, 2)
            choice.origin = "default"
    return None


def _given(value: Any, lowered: LoweredKernel, where: str) -> Schedule:
    if isinstance(value, Trace):
        try:
            return replay_checked(value, lowered.kernel, f"schedules[...] for {where}")
        except TraceError as exc:
            raise UserScheduleError(str(exc)) from None
    if not callable(value):
        raise UserScheduleError(f"{where}: a schedule is a Trace or a function, not {value!r}")
    fn: Callable[[Schedule], Any] = value
    sch = Schedule(lowered.kernel)
    try:
        out = fn(sch)
    except GeodeError as exc:
        raise UserScheduleError(f"the schedule function for {where} failed: {exc}") from exc
    except Exception as exc:
        raise UserScheduleError(
            f"the schedule function for {where} raised {type(exc).__name__}: {exc}"
        ) from exc
    if out is None or out is sch:
        return sch
    if not isinstance(out, Schedule):
        raise UserScheduleError(
            f"the schedule function for {where} returned a {type(out).__name__}; return "
            "None (the Schedule it was given is used) or a Schedule"
        )
    args = [b.name for b in lowered.kernel.inputs + lowered.kernel.outputs]
    if [b.name for b in out.kernel.inputs + out.kernel.outputs] != args:
        raise UserScheduleError(
            f"the schedule function for {where} returned a Schedule of another kernel "
            f"(arguments {args} expected)"
        )
    return out
