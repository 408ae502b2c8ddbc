"""Distributed tuning over Ray: a local Ray instance (two CPUs, started by a fixture)
measures the candidates; the database gets the entries the local path would record
(keys, device, schedules that replay and run); a worker that crashes leaves its
candidate failed; bad addresses, a missing Ray and a worker of another device are
refused with geode errors. The tests that need Ray are skipped, saying why, when it is
not installed (``pip install 'geode[ray]'``)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import numpy as np
import pytest
from test_tuning_search import QUICK, _task

import geode
from geode import examples
from geode.codegen import ast as A
from geode.codegen.kernel_key import canonical_lowered, kernel_key
from geode.codegen.lower import lower_group
from geode.codegen.schedule.trace_json import replay_checked
from geode.codegen.tuning import ray_runner, search
from geode.codegen.tuning.measure import KernelBench
from geode.codegen.tuning.ray_runner import KernelPayload, RayMeasurer, measure_on_worker
from geode.codegen.tuning_db import TuningDB, device_fingerprint, effective_threads
from geode.config import Options
from geode.errors import TuningError

HAVE_RAY = importlib.util.find_spec("ray") is not None
needs_ray = pytest.mark.skipif(
    not HAVE_RAY, reason="ray is not installed (pip install 'geode[ray]'): Ray tests skipped"
)

OPTS = Options()


@pytest.fixture(scope="module")
def cluster():
    """A local Ray instance of two CPUs for the module's tests, shut down after them."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield ray_runner.connect("local")  # joins the running instance
    finally:
        ray.shutdown()


def _graph() -> geode.Graph:
    return examples.softmax(hidden=256).graph


def _entries(path) -> dict:
    return json.loads(open(path, encoding="utf-8").read())["entries"]


@pytest.mark.slow  # a local Ray instance: 5-10 s to start on two cores
@needs_ray
def test_tuning_through_ray_records_what_the_local_path_records(cluster, tmp_path, monkeypatch):
    kw = {"trials": 3, "shapes": {"x": (64, 256)}, "bench_options": QUICK}
    local = geode.tune(_graph(), db=tmp_path / "local.json", **kw)
    assert not cluster.started  # the fixture's instance, used as it is

    def not_here(self, run):
        raise AssertionError("a candidate was timed on the driver, not on a worker")

    monkeypatch.setattr(KernelBench, "time", not_here)  # the workers' geode is unpatched
    remote = geode.tune(_graph(), db=tmp_path / "ray.json", ray="local", **kw)
    monkeypatch.undo()
    assert remote.device == local.device and remote.threads == local.threads
    assert [(k.name, k.key) for k in remote.kernels] == [(k.name, k.key) for k in local.kernels]
    assert all(k.status in ("tuned", "default") and k.trials == 3 for k in remote.kernels)
    a, b = _entries(tmp_path / "local.json"), _entries(tmp_path / "ray.json")
    assert a.keys() == b.keys()
    for key, entry in b.items():
        assert set(entry) == set(a[key]) and entry["device"] == a[key]["device"]
        assert entry["best_s"] > 0 and entry["default_s"] > 0
    # the chosen schedule replays on the kernel and the compiled model uses it
    g = _graph()
    model = geode.compile(g, tuning_db=str(tmp_path / "ray.json"))
    x = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    (y,) = model(x=x).values()
    np.testing.assert_allclose(y, e / e.sum(-1, keepdims=True), rtol=1e-5)
    assert "tuned" in model.explain()
    (key,) = {k.key for k in remote.kernels}
    assert set(b) == {f"{key}@{remote.device}"}
    entry = TuningDB.open(tmp_path / "ray.json").get(key, remote.device)
    lk = _lowered_softmax()
    assert kernel_key(lk.kernel) == key
    back = replay_checked(entry.trace, lk.kernel)
    assert A.format_kernel(back.kernel) != A.format_kernel(lk.kernel)  # scheduled


def _lowered_softmax():
    from lowering_check import prepare

    g, plan = prepare(_graph())
    (group,) = plan.groups
    return canonical_lowered(lower_group(group, g, "k"))


@pytest.mark.slow  # a local Ray instance: 5-10 s to start on two cores
@needs_ray
def test_a_crashed_worker_leaves_its_candidate_failed(cluster):
    def _crash_on_interleave(payload, traces, rounds=0):
        """A worker body that dies (its process exits) on candidates that interleave;
        defined here so that Ray ships it by value."""
        if not rounds and any('"interleave"' in text for text, _ in traces):
            os._exit(3)
        return measure_on_worker(payload, traces, rounds)

    task = _task("softmax", rows=32)
    threads = effective_threads(0)
    measurer = RayMeasurer(
        cluster,
        task.name,
        task.lowered,
        task.inputs,
        task.env,
        OPTS,
        threads,
        device_fingerprint(threads),
        QUICK,
        worker=_crash_on_interleave,
    )
    assert measurer.width == max(1, cluster.cpus // threads)
    res = search.tune_kernel(
        task, OPTS, trials=6, knobs=["interleave", "parallel"], measurer=measurer
    )
    assert res.status in ("tuned", "default") and res.trials == len(res.candidates) >= 2
    crashed = [c for c in res.candidates if c.setting.get("interleave")]
    assert crashed and all(c.error.startswith("Ray task failed") for c in crashed)
    assert any(c.seconds is not None for c in res.candidates if not c.setting.get("interleave"))


def test_a_worker_of_another_device_refuses_to_measure() -> None:
    task = _task("softmax", rows=8)
    sch = search._candidate(task, OPTS, {}).schedule
    threads = effective_threads(0)
    payload = KernelPayload(
        task.name, task.lowered, task.inputs, task.env, OPTS, QUICK, [], threads, "another-cpu"
    )
    got = measure_on_worker(payload, [ray_runner._wire(sch)])
    assert got[0][0] is None and "not the driver's another-cpu" in got[0][1]


def test_a_worker_checks_the_trace_and_the_outputs() -> None:
    task = _task("softmax", rows=8)
    cand = search._candidate(task, OPTS, {"interleave": 2})
    threads = effective_threads(0)
    want = [np.zeros((8, 1024), np.float32)]
    payload = KernelPayload(
        task.name, task.lowered, task.inputs, task.env, OPTS, QUICK, want, threads,
        device_fingerprint(threads),
    )  # fmt: skip
    text, digest = ray_runner._wire(cand.schedule)
    wrong, other = measure_on_worker(payload, [(text, digest), (text, "0" * 64)])
    assert wrong[0] is None and wrong[1].startswith("wrong results")
    assert other[0] is None and "replays to another kernel" in other[1]


@pytest.mark.parametrize(
    ("address", "message"),
    [
        ("", "expected 'local'"),
        ("nohost", "not a Ray address"),
        ("host:99999", "not a Ray address"),
        ("127.0.0.1:1", "cannot reach the Ray cluster at '127.0.0.1:1'"),
    ],
)
def test_bad_addresses_are_refused(address, message) -> None:
    with pytest.raises(TuningError, match=message):
        ray_runner.connect(address)


def test_ray_not_installed_names_the_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(TuningError, match=r"pip install 'geode\[ray\]'"):
        ray_runner.connect("local")


def test_tune_refuses_a_bad_address_before_measuring(tmp_path) -> None:
    with pytest.raises(TuningError, match="127.0.0.1:1"):
        geode.tune(_graph(), db=tmp_path / "db.json", shapes={"x": (8, 256)}, ray="127.0.0.1:1")
    assert not (tmp_path / "db.json").exists() or not _entries(tmp_path / "db.json")


def test_the_kernel_travels_as_data() -> None:
    """What a worker gets pickles (Ray's object store) and replays the same kernel."""
    import pickle

    lk = _lowered_softmax()
    back = pickle.loads(pickle.dumps(lk))
    assert kernel_key(back.kernel) == kernel_key(lk.kernel)
