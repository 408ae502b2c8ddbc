"""The device spec found on a background thread (:func:`geode.costmodel.device.
start_calibration`): waited for where it is used, measured once, errors raised at the use,
and the fingerprint the model cache keys by, which no timing changes; a greedy compile
measures nothing (it plans on :func:`~geode.costmodel.device.untimed_spec`)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import pytest

from geode.costmodel import device
from geode.costmodel.device import default_spec


@pytest.fixture
def slow_measure(monkeypatch):
    """``device._measure`` held until ``release`` is set; records the threads it ran on."""
    release = threading.Event()
    threads: list[str] = []

    def measure(cache_dir):
        threads.append(threading.current_thread().name)
        assert release.wait(10), "the test never released the measurement"
        return default_spec()

    monkeypatch.setattr(device, "_measure", measure)
    monkeypatch.setattr(device, "_SPECS", {})
    monkeypatch.setattr(device, "_PENDING", {})
    return release, threads


def test_the_spec_is_measured_on_a_thread_and_waited_for(slow_measure, tmp_path) -> None:
    release, threads = slow_measure
    device.start_calibration(str(tmp_path))
    device.start_calibration(str(tmp_path))  # already under way: no second thread
    got: list = []
    user = threading.Thread(target=lambda: got.append(device.cached_spec(str(tmp_path))))
    user.start()
    user.join(0.2)
    assert user.is_alive(), "the spec was handed out before it was measured"
    release.set()
    user.join(10)
    assert got == [default_spec()]
    assert threads == ["geode-calibration"]  # once, on the background thread
    assert device.cached_spec(str(tmp_path)) is got[0]  # known now: no other measurement
    assert threads == ["geode-calibration"]


def test_without_a_started_calibration_the_caller_measures(slow_measure, tmp_path) -> None:
    release, threads = slow_measure
    release.set()
    assert device.cached_spec(str(tmp_path)) == default_spec()
    assert threads == [threading.current_thread().name]


def test_a_failed_background_calibration_raises_where_the_spec_is_used(
    monkeypatch, tmp_path
) -> None:
    def broken(cache_dir):
        raise RuntimeError("test: calibration broke")

    monkeypatch.setattr(device, "_measure", broken)
    monkeypatch.setattr(device, "_SPECS", {})
    monkeypatch.setattr(device, "_PENDING", {})
    device.start_calibration(str(tmp_path))
    with pytest.raises(RuntimeError, match="calibration broke"):
        device.cached_spec(str(tmp_path))
    assert str(tmp_path) not in device._PENDING  # the next use tries again


def test_the_fingerprint_has_no_measured_numbers() -> None:
    fp = device.fingerprint()
    l1, l2, l3 = device.detect_cache_sizes()
    assert fp["name"] == device.cpu_name() and fp["cores"] == device.core_count()
    assert (fp["l1_bytes"], fp["l2_bytes"], fp["l3_bytes"]) == (l1, l2, l3)
    assert fp == device.fingerprint()
    measured = {"mem_bandwidth_gbs", "peak_gflops_fp32", "launch_overhead_us", "calibration_s"}
    assert not measured & set(fp)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_does_not_wait_for_its_parents_calibration(tmp_path) -> None:
    code = textwrap.dedent(
        f"""
        import os, threading
        from geode.costmodel import device
        hold = threading.Event()
        device._measure = lambda cache_dir: hold.wait(30) and device.default_spec()
        device.start_calibration({str(tmp_path)!r})
        pid = os.fork()
        if pid == 0:
            device._measure = lambda cache_dir: device.default_spec()
            ok = device.cached_spec({str(tmp_path)!r}) == device.default_spec()
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        hold.set()
        assert os.waitstatus_to_exitcode(status) == 0
        assert device.cached_spec({str(tmp_path)!r}) == device.default_spec()
        print("ok")
        """
    )
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_a_compile_that_fails_early_leaves_no_calibration_running(monkeypatch, tmp_path) -> None:
    """A compile with the plan search (which calibrates) stopping before the fusion stage
    (here: a graph without outputs) waits for the calibration it started: none goes on
    after it returns."""
    import geode
    from geode.errors import GraphError

    finished = threading.Event()

    def measure(cache_dir):
        threading.Event().wait(0.3)
        finished.set()
        return default_spec()

    monkeypatch.setattr(device, "_measure", measure)
    monkeypatch.setattr(device, "_SPECS", {})
    monkeypatch.setattr(device, "_PENDING", {})
    g = geode.Graph("no_outputs")
    g.input("x", [4], "float32")
    with pytest.raises(GraphError, match="no outputs"):
        geode.compile(g, cache_dir=str(tmp_path), model_cache=False, fusion_search="beam")
    assert finished.is_set() and not device._PENDING
    assert device._SPECS[str(tmp_path)] == default_spec()


def _refuse_measuring(monkeypatch) -> None:
    def refuse(cache_dir):
        raise AssertionError("test: the device was measured")

    monkeypatch.setattr(device, "_measure", refuse)
    monkeypatch.setattr(device, "_SPECS", {})
    monkeypatch.setattr(device, "_PENDING", {})


def test_the_untimed_spec_is_the_fingerprint_with_nominal_rates(monkeypatch) -> None:
    _refuse_measuring(monkeypatch)
    spec, fp = device.untimed_spec(), device.fingerprint()
    assert spec.method == "default" and spec is device.untimed_spec()
    assert (spec.name, spec.cores, spec.numba_version) == (
        fp["name"],
        fp["cores"],
        fp["numba_version"],
    )
    assert (spec.l1_bytes, spec.l2_bytes, spec.l3_bytes) == (
        fp["l1_bytes"],
        fp["l2_bytes"],
        fp["l3_bytes"],
    )
    assert spec.flops_per_s(parallel=False) == pytest.approx(100e9)  # per core, any cores
    assert spec.transcendentals_per_s(parallel=False) == pytest.approx(0.4e9)
    assert spec.source() == f"{fp['name']}, {fp['cores']} cores: nominal rates (not timed)"
    monkeypatch.setattr(device, "core_count", lambda: 5)  # the affinity changed
    assert device.untimed_spec().cores == 5
    assert device.untimed_spec().peak_gflops_fp32 == pytest.approx(500.0)
    quick = default_spec()
    quick.method = "quick"
    assert quick.source().endswith(": quick calibration")


def _tanh_graph():
    import geode

    g = geode.Graph("greedy_plan")
    x = g.input("x", [64, 32], "float32")
    g.output(g.op("Tanh", g.op("Mul", x, x)), names=["y"])
    return g


def test_a_greedy_compile_measures_no_device(monkeypatch, tmp_path) -> None:
    """The default (greedy) compile plans on the untimed spec: no calibration runs, none
    is stored in the cache folder, and ``explain()`` says which spec the plan used."""
    import numpy as np

    import geode

    _refuse_measuring(monkeypatch)
    model = geode.compile(_tanh_graph(), cache_dir=str(tmp_path), model_cache=False)
    x = np.linspace(-1, 1, 64 * 32, dtype=np.float32).reshape(64, 32)
    np.testing.assert_allclose(model(x=x)["y"], np.tanh(x * x), rtol=1e-5, atol=1e-6)
    assert not device._SPECS and not device._PENDING
    assert not list(tmp_path.glob("device-*.json"))
    assert f"device spec: {device.untimed_spec().source()}" in model.explain()


def test_the_plan_search_plans_on_the_measured_spec(monkeypatch, tmp_path) -> None:
    """``fusion_search="beam"`` scores plans by measured rates: its compile calibrates
    (here a stand-in measurement) and ``explain()`` names that spec."""
    import geode

    measured = default_spec()
    measured.method = "quick"
    monkeypatch.setattr(device, "_measure", lambda cache_dir: measured)
    monkeypatch.setattr(device, "_SPECS", {})
    monkeypatch.setattr(device, "_PENDING", {})
    model = geode.compile(
        _tanh_graph(), cache_dir=str(tmp_path), model_cache=False, fusion_search="beam"
    )
    assert device._SPECS[str(tmp_path)] is measured
    assert "device spec: generic-cpu, 4 cores: quick calibration" in model.explain()
