"""The device spec found on a background thread (:func:`geode.costmodel.device.
start_calibration`): waited for where it is used, measured once, errors raised at the use,
and the fingerprint the model cache keys by, which no timing changes."""

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
    """A compile stopping before the fusion stage (here: a graph without outputs) waits
    for the calibration it started: none goes on after it returns."""
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
        geode.compile(g, cache_dir=str(tmp_path), model_cache=False)
    assert finished.is_set() and not device._PENDING
    assert device._SPECS[str(tmp_path)] == default_spec()
