"""Schedules given to geode.compile by kernel key (a trace replayed, a function
applied), tuned schedules from a database, and what explain() says of them."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

import geode
from geode import examples
from geode.codegen.autoschedule import schedule_group
from geode.codegen.kernel_key import canonical_lowered
from geode.codegen.schedule import Schedule, Trace
from geode.codegen.schedule_source import TunedScheduleWarning
from geode.codegen.tuning_db import TunedEntry, TuningDB, device_fingerprint, effective_threads
from geode.config import OptionError
from geode.errors import TuningError, UserScheduleError

rng = np.random.default_rng(11)


def _softmax():
    ex = examples.softmax(hidden=256)
    return ex, ex.make_inputs(rng, 40)


def _key(model) -> str:
    (key,) = re.findall(r"key ([0-9a-f]{32})", model.explain())
    return key


def _default_trace(ex) -> Trace:
    """The default schedule's trace, recorded on the canonical form (what a tuner or an
    experimenter saves)."""
    from lowering_check import prepare

    from geode.codegen.lower import lower_group

    g, plan = prepare(ex.graph)
    (group,) = plan.groups
    return schedule_group(canonical_lowered(lower_group(group, g, "k")), group).trace


def test_a_given_trace_is_replayed_instead_of_the_default() -> None:
    ex, feeds = _softmax()
    base = geode.compile(ex.graph, model_cache=False)
    key = _key(base)
    trace = Trace([s for s in _default_trace(ex) if s.primitive != "parallel"])  # serial rows
    model = geode.compile(ex.graph, schedules={key: trace})
    (k,) = [k for k in model.kernels if k.engine == "aicore"]
    assert k.trace == str(trace) and "parallel" not in k.trace
    assert (k.key, k.schedule) == (key, "given")
    assert [(i.key, i.schedule) for i in base.kernels] == [(key, "default")]
    np.testing.assert_allclose(model(**feeds)["y"], base(**feeds)["y"], rtol=1e-6)
    text = model.explain()
    assert f"key {key}, schedule: given (trace)" in text
    assert "schedules: 1 given (fused_0), 0 default" in text
    assert "schedules: 1 default" in base.explain()


def test_a_given_function_applies_primitives() -> None:
    ex, feeds = _softmax()
    key = _key(geode.compile(ex.graph))
    seen = []

    def schedule(sch: Schedule) -> None:
        seen.append(sch.blocks())
        sch.align_all()
        sch.parallel(sch.get_loops("b7")[0])

    model = geode.compile(ex.graph, schedules={key: schedule})
    assert seen == [[f"b{i}" for i in range(8)]]  # the canonical form's block names
    assert "given (function)" in model.explain()
    np.testing.assert_allclose(model(**feeds)["y"], ex.numpy(**feeds)["y"], rtol=1e-5)
    # returning another Schedule of the same kernel is fine too
    model = geode.compile(ex.graph, schedules={key: lambda sch: Schedule(sch.kernel)})
    np.testing.assert_allclose(model(**feeds)["y"], ex.numpy(**feeds)["y"], rtol=1e-5)


def test_bad_given_schedules_are_errors_naming_the_kernel() -> None:
    ex, _ = _softmax()
    key = _key(geode.compile(ex.graph))
    bad = Trace.from_json(
        '{"format": "geode-schedule-trace", "version": 1, '
        '"steps": [{"primitive": "parallel", "args": {"loop": "nope"}}]}'
    )
    with pytest.raises(UserScheduleError, match=rf"kernel fused_0 \(key {key}\): step 0"):
        geode.compile(ex.graph, schedules={key: bad})

    def broken(sch):
        sch.vectorize("l0")  # an outer loop: refused by the primitive

    with pytest.raises(UserScheduleError, match=rf"function for kernel fused_0 \(key {key}\)"):
        geode.compile(ex.graph, schedules={key: broken})
    with pytest.raises(UserScheduleError, match="raised ZeroDivisionError"):
        geode.compile(ex.graph, schedules={key: lambda sch: 1 / 0})
    with pytest.raises(UserScheduleError, match="returned a int"):
        geode.compile(ex.graph, schedules={key: lambda sch: 3})
    with pytest.raises(OptionError, match="expected a Trace or a function"):
        geode.compile(ex.graph, schedules={key: "split"})
    with pytest.raises(OptionError, match="is not a kernel key"):
        geode.compile(ex.graph, schedules={3: broken})


def test_keys_matching_no_kernel_are_reported() -> None:
    ex, _ = _softmax()
    with pytest.warns(UserWarning, match=r"kernel keys \['0{32}'\] match no kernel"):
        geode.compile(ex.graph, schedules={"0" * 32: lambda sch: None})


def _tuned_db(tmp_path, ex, trace, status="tuned"):
    key = _key(geode.compile(ex.graph))
    device = device_fingerprint(effective_threads(0))
    db = TuningDB.open(tmp_path / "db.json")
    db.put(TunedEntry(key, device, status, trace, 3e-3, 1e-3, 9))
    db.save()
    return tmp_path / "db.json"


def test_a_tuning_database_gives_kernels_their_tuned_schedules(tmp_path, monkeypatch) -> None:
    ex, feeds = _softmax()
    trace = Trace([s for s in _default_trace(ex) if s.primitive != "parallel"])
    path = _tuned_db(tmp_path, ex, trace)
    model = geode.compile(ex.graph, tuning_db=path)
    assert "schedule: tuned (3.00x the default, 9 trials)" in model.explain()
    assert "schedules: 1 tuned (fused_0)" in model.explain()
    np.testing.assert_allclose(model(**feeds)["y"], ex.numpy(**feeds)["y"], rtol=1e-5)
    monkeypatch.setenv("GEODE_TUNING_DB", str(path))
    assert "tuned (3.00x" in geode.compile(ex.graph).explain()
    # another thread count is another device: no entry
    assert "schedules: 1 default" in geode.compile(ex.graph, num_threads=7).explain()
    monkeypatch.delenv("GEODE_TUNING_DB")
    kept = _tuned_db(tmp_path, ex, trace, status="default")
    assert "tuned (the default was best)" in geode.compile(ex.graph, tuning_db=kept).explain()


def test_a_tuned_trace_that_does_not_replay_warns_and_uses_the_default(tmp_path) -> None:
    ex, feeds = _softmax()
    bad = Trace.from_json(
        '{"format": "geode-schedule-trace", "version": 1, '
        '"steps": [{"primitive": "parallel", "args": {"loop": "nope"}}]}'
    )
    path = _tuned_db(tmp_path, ex, bad)
    with pytest.warns(TunedScheduleWarning, match="the default schedule is used"):
        model = geode.compile(ex.graph, tuning_db=path, model_cache=False)
    assert "schedules: 1 default" in model.explain()
    np.testing.assert_allclose(model(**feeds)["y"], ex.numpy(**feeds)["y"], rtol=1e-5)


def test_a_database_that_cannot_be_used_stops_the_compile(tmp_path) -> None:
    ex, _ = _softmax()
    path = tmp_path / "db.json"
    path.write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(TuningError, match="is not a geode tuning database"):
        geode.compile(ex.graph, tuning_db=path)
    # a database not written yet is empty
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        geode.compile(ex.graph, tuning_db=tmp_path / "new.json")
