"""Schedule traces as data: the JSON format round-trips every primitive, refuses
malformed traces naming what and where, and a checked replay stops at the first step
that does not fit the kernel."""

from __future__ import annotations

import json
import os

import pytest
from lowering_check import prepare
from test_schedule import _lowered, k_chain, k_reduce

from geode import examples
from geode.codegen.ast import format_kernel
from geode.codegen.autoschedule import schedule_group
from geode.codegen.lower import lower_group
from geode.codegen.schedule import Schedule, Trace
from geode.codegen.schedule.trace_json import (
    FORMAT,
    VERSION,
    parameter_kind,
    primitives,
    replay_checked,
    trace_from_data,
    trace_to_data,
)
from geode.errors import TraceError


def _roundtrip(kernel, sch: Schedule) -> Trace:
    back = Trace.from_json(sch.trace.to_json())
    assert format_kernel(replay_checked(back, kernel).kernel) == format_kernel(sch.kernel)
    return back


def _schedules():
    """(kernel, schedule) pairs that together apply every primitive."""
    out = []
    for name in ("softmax", "gelu", "attention", "lstm_gates", "reduce_chain"):
        g, plan = prepare(examples.ALL[name]().graph)
        for group in plan.groups:
            lk = lower_group(group, g, "k")
            for streaming in (None, 0):
                out.append((lk.kernel, schedule_group(lk, group, streaming, 4, streaming)))
    lk, group = _lowered("softmax", hidden=1024)  # streamed: its last pass is deferred
    out.append((lk.kernel, schedule_group(lk, group, stream_min_bytes=0)))
    k = k_reduce()
    s = Schedule(k)
    s.rfactor("sum_0", "sum_0_k0", 4, partials="outer")
    s.unroll("sum_0_k0_0_f")
    out.append((k, s))
    k = k_chain()
    s = Schedule(k)
    s.reverse_compute_inline("F")
    s.align_all()
    out.append((k, s))
    return out


def test_every_primitive_round_trips_through_json() -> None:
    seen: set[str] = set()
    for kernel, sch in _schedules():
        _roundtrip(kernel, sch)
        seen |= {s.primitive for s in sch.trace}
    assert seen == set(primitives())


def test_every_parameter_has_a_json_kind() -> None:
    for sig in primitives().values():
        for p in sig.parameters.values():
            parameter_kind(p)  # KeyError names an annotation the format lacks


def test_the_format_is_versioned_data() -> None:
    sch = Schedule(k_reduce())
    sch.rfactor("sum_0", "sum_0_k0", 2)
    sch.parallel("sum_0_i0")
    data = json.loads(sch.trace.to_json())
    assert data["format"] == FORMAT and data["version"] == VERSION
    assert data["steps"][0] == {
        "primitive": "rfactor",
        "args": {
            "block": "sum_0",
            "loop": "sum_0_k0",
            "factor": 2,
            "partials": "inner",
            "partials_axis": "last",
        },
        "result": ["sum_0_k0_0", "sum_0_k0_1"],
    }
    assert data["steps"][1] == {"primitive": "parallel", "args": {"loop": "sum_0_i0"}}
    assert trace_to_data(trace_from_data(data)) == data


def _data(*steps) -> dict:
    return {"format": FORMAT, "version": VERSION, "steps": list(steps)}


@pytest.mark.parametrize(
    "data,message",
    [
        ([], "expected a JSON object"),
        ({"format": "other", "version": 1, "steps": []}, "not a geode schedule trace"),
        ({"format": FORMAT, "version": 2, "steps": []}, "version 2; this geode reads version 1"),
        ({"format": FORMAT, "version": "1", "steps": []}, "version '1'"),
        ({**_data(), "extra": 1}, r"unknown fields \['extra'\]"),
        ({"format": FORMAT, "version": 1, "steps": {}}, "'steps' must be a list"),
        (_data(3), "step 0: expected an object"),
        (_data({"primitive": "explode", "args": {}}), "step 0: unknown primitive 'explode'"),
        (_data({"primitive": "parallel", "args": []}), r"step 0 \(parallel\): 'args' must be"),
        (
            _data({"primitive": "parallel", "args": {"loop": "i"}, "when": 1}),
            r"step 0: unknown fields \['when'\]",
        ),
        (_data({"primitive": "parallel", "args": {}}), "missing argument 'loop'"),
        (
            _data({"primitive": "parallel", "args": {"loop": "i", "level": 2}}),
            r"unknown arguments \['level'\]",
        ),
        (
            _data({"primitive": "split", "args": {"loop": "i", "factors": [None, "4"]}}),
            r"step 0 \(split\): argument 'factors' must be a list of ints or nulls",
        ),
        (
            _data({"primitive": "interleave", "args": {"loop": "i", "factor": True}}),
            "argument 'factor' must be an int",
        ),
        (
            _data({"primitive": "vectorize", "args": {"loop": "i", "allow_reassoc": 1}}),
            "'allow_reassoc' must be true or false",
        ),
        (_data({"primitive": "fuse", "args": {"loops": ["a", ""]}}), "a list of names"),
        (_data({"primitive": "parallel", "args": {"loop": 7}}), "must be a non-empty name"),
    ],
)
def test_malformed_traces_are_refused_naming_what_and_where(data, message) -> None:
    with pytest.raises(TraceError, match=message) as info:
        trace_from_data(data, "my.json")
    assert str(info.value).startswith("my.json")


def test_bad_json_text_is_a_trace_error() -> None:
    with pytest.raises(TraceError, match="t.json: not valid JSON"):
        Trace.from_json("{not json", "t.json")
    with pytest.raises(TraceError, match="not valid JSON"):
        Trace.from_json(b"\xff\xfe")


def test_a_checked_replay_names_the_failing_step() -> None:
    k = k_reduce()
    sch = Schedule(k)
    sch.rfactor("sum_0", "sum_0_k0", 2)
    sch.parallel("sum_0_i0")
    data = trace_to_data(sch.trace)
    data["steps"][1]["args"]["loop"] = "nope"
    with pytest.raises(TraceError, match=r"kernel K: step 1 parallel\(loop='nope'\).*no loop"):
        replay_checked(trace_from_data(data), k, "kernel K")
    # a step that returns other names than it recorded: recorded on another kernel
    data = trace_to_data(sch.trace)
    data["steps"][0]["result"] = ["a", "b"]
    with pytest.raises(TraceError, match="step 0 rfactor returned .* recorded on another kernel"):
        replay_checked(trace_from_data(data), k)
    # an argument value the primitive refuses is a trace error too
    data = trace_to_data(sch.trace)
    data["steps"][0]["args"]["factor"] = 0
    with pytest.raises(TraceError, match="step 0 rfactor.*positive int"):
        replay_checked(trace_from_data(data), k)


def test_save_and_load(tmp_path) -> None:
    k = k_chain()
    sch = Schedule(k)
    sch.align_all()
    sch.compute_inline("A")
    path = tmp_path / "sub" / "t.json"
    sch.trace.save(path)
    back = Trace.load(path)
    assert format_kernel(replay_checked(back, k).kernel) == format_kernel(sch.kernel)
    with pytest.raises(TraceError, match="no such file"):
        Trace.load(tmp_path / "missing.json")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(TraceError, match="no such file|cannot read"):
        Trace.load(tmp_path / "fifo")  # a FIFO is never opened for reading (no hang)
    (tmp_path / "bad.json").write_text('{"format": "x"}', encoding="utf-8")
    with pytest.raises(TraceError, match="bad.json.*not a geode schedule trace"):
        Trace.load(tmp_path / "bad.json")
