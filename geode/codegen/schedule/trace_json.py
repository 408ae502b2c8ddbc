"""Schedule traces as data: a versioned JSON form, checked on the way in, and a replay
that names the step that fails.

The format (``FORMAT``, version ``VERSION``)::

    {"format": "geode-schedule-trace", "version": 1,
     "steps": [{"primitive": "split", "args": {"loop": "l0", "factors": [null, 4]},
                "result": ["l0_0", "l0_1"]}, ...]}

Only data: every step names one of the primitives of
:class:`~geode.codegen.schedule.Schedule` (:func:`primitives`) and gives its arguments
by keyword, each of the JSON kind its parameter takes (a name, an int, a bool, a list
of ints or names, or null where the parameter allows it); ``result``, optional, is what
the primitive returned when the trace was recorded. :func:`trace_from_data` refuses
anything else with a :class:`~geode.errors.TraceError` saying what is wrong and where
(the file or the caller's label, the step, the argument). :func:`replay_checked`
applies the steps to a kernel and, where a step recorded a result, checks the replay
returns the same names: a trace recorded on another kernel stops at the first step
that differs instead of scheduling the wrong loops.
"""

from __future__ import annotations

import copy
import functools
import inspect
import json
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from geode.codegen.ast import Kernel
from geode.codegen.schedule.trace import Trace, TraceStep
from geode.errors import GeodeError, TraceError
from geode.safe_files import atomic_writer, make_dirs, read_file

if TYPE_CHECKING:
    from geode.codegen.schedule import Schedule

FORMAT = "geode-schedule-trace"
VERSION = 1
#: the largest trace file read (a trace is a few hundred bytes per step)
MAX_TRACE_BYTES = 16 << 20


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_name(v: Any) -> bool:
    return isinstance(v, str) and v != "" and "\x00" not in v


#: the JSON kinds of primitive parameters, by their annotation: (check, description)
_KINDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "str": (_is_name, "a non-empty name"),
    "int": (_is_int, "an int"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "str | None": (lambda v: v is None or _is_name(v), "a name or null"),
    "Sequence[int | None]": (
        lambda v: isinstance(v, list) and all(x is None or _is_int(x) for x in v),
        "a list of ints or nulls",
    ),
    "Sequence[str]": (
        lambda v: isinstance(v, list) and all(_is_name(x) for x in v),
        "a list of names",
    ),
    "Sequence[int] | None": (
        lambda v: v is None or (isinstance(v, list) and all(_is_int(x) for x in v)),
        "a list of ints or null",
    ),
}


@functools.cache
def primitives() -> dict[str, inspect.Signature]:
    """Every schedule primitive by name, with its signature (``self`` dropped)."""
    from geode.codegen.schedule import Schedule

    out: dict[str, inspect.Signature] = {}
    for name in dir(Schedule):
        fn = getattr(Schedule, name)
        if callable(fn) and getattr(fn, "__geode_primitive__", False):
            sig = inspect.signature(fn)
            params = list(sig.parameters.values())[1:]
            out[name] = sig.replace(parameters=params)
    return out


def parameter_kind(param: inspect.Parameter) -> tuple[Callable[[Any], bool], str]:
    """The check and description of the JSON values parameter ``param`` takes
    (KeyError for an annotation the format does not know)."""
    return _KINDS[str(param.annotation)]


def trace_to_data(trace: Trace) -> dict[str, Any]:
    """``trace`` as a JSON-ready dict of the format."""
    steps = []
    for st in trace:
        d: dict[str, Any] = {"primitive": st.primitive, "args": _json_value(st.args)}
        if st.result is not None:
            d["result"] = _json_value(st.result)
        steps.append(d)
    return {"format": FORMAT, "version": VERSION, "steps": steps}


def _json_value(v: Any) -> Any:
    """``v`` with tuples as lists (the form it has after a JSON round trip)."""
    return json.loads(json.dumps(v))


def trace_to_json(trace: Trace, indent: int | None = 1) -> str:
    """``trace`` as JSON text."""
    return json.dumps(trace_to_data(trace), indent=indent)


def trace_from_data(data: Any, where: str = "trace") -> Trace:
    """The trace of ``data`` (parsed JSON of the format); :class:`TraceError` naming
    ``where``, the step and the argument for anything malformed."""
    if not isinstance(data, Mapping):
        raise TraceError(f"{where}: expected a JSON object, got {type(data).__name__}")
    if data.get("format") != FORMAT:
        raise TraceError(f"{where}: not a geode schedule trace (format {data.get('format')!r})")
    version = data.get("version")
    if not _is_int(version) or version != VERSION:
        raise TraceError(
            f"{where}: trace format version {version!r}; this geode reads version {VERSION}"
        )
    unknown = sorted(set(data) - {"format", "version", "steps"})
    if unknown:
        raise TraceError(f"{where}: unknown fields {unknown}")
    steps = data.get("steps")
    if not isinstance(steps, list):
        raise TraceError(f"{where}: 'steps' must be a list, got {type(steps).__name__}")
    return Trace([_step(s, f"{where}: step {i}") for i, s in enumerate(steps)])


def _step(s: Any, where: str) -> TraceStep:
    if not isinstance(s, Mapping):
        raise TraceError(f"{where}: expected an object, got {type(s).__name__}")
    unknown = sorted(set(s) - {"primitive", "args", "result"})
    if unknown:
        raise TraceError(f"{where}: unknown fields {unknown}")
    name = s.get("primitive")
    prims = primitives()
    if not isinstance(name, str) or name not in prims:
        raise TraceError(f"{where}: unknown primitive {name!r}; known: {', '.join(sorted(prims))}")
    where = f"{where} ({name})"
    args = s.get("args", {})
    if not isinstance(args, Mapping):
        raise TraceError(f"{where}: 'args' must be an object, got {type(args).__name__}")
    params = prims[name].parameters
    extra = sorted(set(args) - set(params))
    if extra:
        raise TraceError(f"{where}: unknown arguments {extra}; it takes {list(params)}")
    for p in params.values():
        if p.name not in args:
            if p.default is inspect.Parameter.empty:
                raise TraceError(f"{where}: missing argument {p.name!r}")
            continue
        check, what = parameter_kind(p)
        if not check(args[p.name]):
            raise TraceError(f"{where}: argument {p.name!r} must be {what}, got {args[p.name]!r}")
    ordered = {p: copy.deepcopy(args[p]) for p in params if p in args}  # signature order
    return TraceStep(name, ordered, copy.deepcopy(s.get("result")))


def trace_from_json(text: str | bytes, where: str = "trace") -> Trace:
    """The trace of JSON ``text`` (see :func:`trace_from_data`)."""
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TraceError(f"{where}: not valid JSON: {exc}") from None
    return trace_from_data(data, where)


def save_trace(trace: Trace, path: str | os.PathLike[str]) -> None:
    """Write ``trace`` to ``path`` as JSON, atomically (the folder is made if missing)."""
    p = os.fspath(path)
    try:
        make_dirs(os.path.dirname(os.path.abspath(p)))
        with atomic_writer(p, sync=True) as f:
            f.write(trace_to_json(trace).encode("utf-8"))
    except OSError as exc:
        raise TraceError(f"cannot write schedule trace {p!r}: {exc}") from None


def load_trace(path: str | os.PathLike[str]) -> Trace:
    """The trace in the JSON file at ``path`` (a regular file, links followed)."""
    p = os.fspath(path)
    if not os.path.isfile(p):
        raise TraceError(f"schedule trace {p!r}: no such file")
    raw = read_file(p, MAX_TRACE_BYTES, private=False, follow_links=True)
    if raw is None:
        raise TraceError(
            f"schedule trace {p!r}: cannot read it (not a regular file, unreadable, or "
            f"larger than {MAX_TRACE_BYTES} bytes)"
        )
    return trace_from_json(raw, f"schedule trace {p!r}")


def replay_checked(trace: Trace, kernel: Kernel, where: str = "trace") -> Schedule:
    """Apply ``trace`` to a fresh copy of ``kernel``; a step that fails, or that returns
    other names than it recorded, raises :class:`TraceError` naming ``where`` and the
    step."""
    from geode.codegen.schedule import Schedule

    sch = Schedule(kernel)
    for i, step in enumerate(trace):
        try:
            result = getattr(sch, step.primitive)(**copy.deepcopy(step.args))
        except GeodeError as exc:
            raise TraceError(f"{where}: step {i} {step}: {exc}") from None
        except (TypeError, ValueError) as exc:  # an argument the primitive cannot take
            raise TraceError(f"{where}: step {i} {step}: bad arguments: {exc}") from None
        if step.result is not None and _json_value(result) != _json_value(step.result):
            raise TraceError(
                f"{where}: step {i} {step.primitive} returned {_json_value(result)!r}, the trace "
                f"recorded {_json_value(step.result)!r}: it was recorded on another kernel"
            )
    return sch
