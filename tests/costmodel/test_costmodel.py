"""Tests of geode.costmodel: SOL arithmetic, fusion decisions, device spec cache,
projected-model fitting, profiling, and the package's import boundary."""

from __future__ import annotations

import ast
import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from geode.costmodel import device, profiling, sol
from geode.costmodel.device import MIB, DeviceSpec, default_spec
from geode.costmodel.projected import ScheduleFeatures
from geode.costmodel.sol import KernelWork, decide_merge, estimate, fusion_gain


def round_spec(**overrides) -> DeviceSpec:
    """A spec with round numbers so expected times are easy to write down."""
    fields = dict(
        name="test-cpu",
        cores=4,
        mem_bandwidth_gbs=10.0,
        mem_bandwidth_1t_gbs=5.0,
        peak_gflops_fp32=100.0,
        l1_bytes=32 * 1024,
        l2_bytes=1 * MIB,
        l3_bytes=8 * MIB,
        launch_overhead_us=2.0,
        parallel_overhead_us=10.0,
        transcendental_gops=1.0,
        numba_version="0.0",
        method="full",
    )
    fields.update(overrides)
    return DeviceSpec(**fields)


# -- SOL -------------------------------------------------------------------------


def test_sol_memory_bound_arithmetic():
    spec = round_spec()
    w = KernelWork(bytes_read=6e8, bytes_written=4e8, flops=1e8)
    b = sol.breakdown(w, spec)
    assert b.memory_s == pytest.approx(0.1)  # 1e9 B at 10 GB/s
    assert b.compute_s == pytest.approx(1e-3)  # 1e8 flop at 100 GFLOPS
    assert b.overhead_s == pytest.approx(12e-6)  # launch 2 + fork/join 10 us
    assert b.bound == "memory"
    assert estimate(w, spec) == pytest.approx(0.1 + 12e-6)


def test_sol_compute_bound_serial_and_transcendentals():
    spec = round_spec()
    w = KernelWork(bytes_read=1e6, bytes_written=0, flops=1e10, transcendentals=1e8, parallel=False)
    b = sol.breakdown(w, spec)
    assert b.memory_s == pytest.approx(1e6 / 5e9)  # one-thread bandwidth
    assert b.compute_s == pytest.approx(1e10 / 25e9)  # a quarter of the peak
    assert b.transcendental_s == pytest.approx(1e8 / 0.25e9)
    assert b.overhead_s == pytest.approx(2e-6)  # no fork/join
    assert b.bound == "compute"
    assert b.total_s == pytest.approx(0.4 + 0.4 + 2e-6)


def test_sol_overhead_counts_each_kernel():
    spec = round_spec()
    w = KernelWork(bytes_read=0, bytes_written=0, flops=0, n_kernels=3)
    assert estimate(w, spec) == pytest.approx(36e-6)
    assert sol.breakdown(w, spec).bound == "overhead"


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(bytes_read=-1, bytes_written=0, flops=0),
        dict(bytes_read=0, bytes_written=math.nan, flops=0),
        dict(bytes_read=0, bytes_written=0, flops=0, n_kernels=-1),
        dict(bytes_read="1", bytes_written=0, flops=0),
    ],
)
def test_kernel_work_rejects_bad_values(kwargs):
    with pytest.raises(ValueError, match="KernelWork"):
        KernelWork(**kwargs)


def elementwise_chain(n: int):
    """y = exp(a + b) * c as two kernels (add, then exp-mul) or one fused kernel."""
    f32 = 4
    add = KernelWork(bytes_read=2 * n * f32, bytes_written=n * f32, flops=n)
    mul = KernelWork(bytes_read=2 * n * f32, bytes_written=n * f32, flops=n, transcendentals=n)
    fused = KernelWork(
        bytes_read=3 * n * f32, bytes_written=n * f32, flops=2 * n, transcendentals=n
    )
    return [add, mul], fused


def test_fusion_gain_positive_for_elementwise_chain():
    spec = round_spec(transcendental_gops=100.0)
    n = 1 << 24
    separate, fused = elementwise_chain(n)
    gain = fusion_gain(separate, fused, spec)
    # The intermediate's round trip (written once, read once) plus one launch.
    expected = 2 * n * 4 / 10e9 + 12e-6
    assert gain == pytest.approx(expected)
    assert gain > 0


def broadcast_recompute(m: int, k: int):
    """exp over [m] broadcast into [m, k]: separately, or fused with exp per output."""
    f32 = 4
    producer = KernelWork(bytes_read=m * f32, bytes_written=m * f32, flops=0, transcendentals=m)
    consumer = KernelWork(bytes_read=(m * k + m) * f32, bytes_written=m * k * f32, flops=m * k)
    fused = KernelWork(
        bytes_read=(m * k + m) * f32,
        bytes_written=m * k * f32,
        flops=m * k,
        transcendentals=m * k,
    )
    return [producer, consumer], fused


def test_fusion_gain_negative_for_recompute_heavy_broadcast():
    spec = round_spec()
    separate, fused = broadcast_recompute(4096, 4096)
    assert fusion_gain(separate, fused, spec) < 0


def test_decision_reason_for_saved_traffic():
    spec = round_spec(transcendental_gops=100.0)
    n = 1 << 24
    separate, fused = elementwise_chain(n)
    d = decide_merge(separate, fused, spec)
    assert d.take
    assert d.bytes_saved == 2 * n * 4
    assert d.saved_s == pytest.approx(fusion_gain(separate, fused, spec))
    assert d.reason.startswith("saves 128.0 MiB of traffic and 1 kernel launch (")
    before, after = sol.format_time(d.before_s), sol.format_time(d.after_s)
    assert f"({before} -> {after})" in d.reason
    assert str(d).startswith("fuse: saves")


def test_decision_reason_for_recompute():
    spec = round_spec()
    separate, fused = broadcast_recompute(4096, 4096)
    d = decide_merge(separate, fused, spec, recompute_factor=4096)
    assert not d.take
    assert d.flops_ratio > 10
    assert d.reason.startswith(f"recompute of 4096x expands flops {d.flops_ratio:.1f}x, loses ")
    assert sol.format_time(-d.saved_s) in d.reason
    assert str(d).startswith("keep apart: ")


def test_decision_reason_below_threshold_and_serial():
    spec = round_spec()
    tiny = KernelWork(bytes_read=64, bytes_written=64, flops=16, parallel=False)
    fused = KernelWork(bytes_read=64, bytes_written=64, flops=32, parallel=False)
    d = decide_merge([tiny, tiny], fused, spec, min_gain_s=1e-3)
    assert not d.take and "below the 1.0 ms threshold" in d.reason

    big = KernelWork(bytes_read=1e8, bytes_written=1e8, flops=0)
    serial = KernelWork(bytes_read=1e8, bytes_written=1e8, flops=0, parallel=False)
    d = decide_merge([big], serial, spec)
    assert not d.take and d.reason.startswith("fused kernel runs on one core, loses")


def test_format_helpers():
    assert sol.format_bytes(128 * MIB) == "128.0 MiB"
    assert sol.format_bytes(512) == "512 B"
    assert sol.format_time(0.0121) == "12.1 ms"
    assert sol.format_time(2.5e-6) == "2.5 us"
    assert sol.format_time(3e-8) == "30.0 ns"


# -- device spec -----------------------------------------------------------------


def test_device_spec_json_round_trip():
    spec = round_spec()
    back = DeviceSpec.from_json(spec.to_json())
    assert back == spec
    d = json.loads(spec.to_json())
    assert d["key"] == "test-cpu|4 cores|numba 0.0"
    assert d["format"] == device.FORMAT_VERSION


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.pop("peak_gflops_fp32"),
        lambda d: d.update(cores="4"),
        lambda d: d.update(cores=0),
        lambda d: d.update(mem_bandwidth_gbs=-1.0),
        lambda d: d.update(mem_bandwidth_gbs=None),
        lambda d: d.update(method="guessed"),
        lambda d: d.update(key="other|1 cores|numba 1"),
        lambda d: d.update(format=999),
        lambda d: d.update(surprise=1),
    ],
)
def test_device_spec_rejects_malformed(mutate):
    d = round_spec().to_dict()
    mutate(d)
    with pytest.raises(ValueError):
        DeviceSpec.from_dict(d)


def test_device_spec_rejects_non_json():
    with pytest.raises(ValueError, match="not valid JSON"):
        DeviceSpec.from_json("{not json")
    with pytest.raises(ValueError, match="JSON object"):
        DeviceSpec.from_json("[1, 2]")


def test_default_spec_is_fixed_and_valid():
    a, b = default_spec(), default_spec()
    assert a == b and a.method == "default"
    assert a.mem_bandwidth_1t_gbs <= a.mem_bandwidth_gbs
    assert "GB/s" in a.summary()


def test_parse_size():
    assert device._parse_size("48K") == 48 * 1024
    assert device._parse_size("4 MiB") == 4 * MIB
    assert device._parse_size("2048 KiB (2 instances)") == 2 * MIB
    assert device._parse_size("1048576") == MIB
    assert device._parse_size("lots") is None


def test_detect_cache_sizes_is_ordered_and_positive():
    l1, l2, l3 = device.detect_cache_sizes()
    assert 0 < l1 <= l2 <= l3


@pytest.fixture
def fake_measurements(monkeypatch):
    """Replace the microbenchmarks with instant fakes; count calibrations."""
    calls = {"n": 0}

    def bandwidth(src, dst, threads, budget_s):
        calls["n"] += threads == 1
        return 5.0 * threads

    monkeypatch.setattr(device, "_buffers", lambda nbytes: (np.ones(4), np.ones(4)))
    monkeypatch.setattr(device, "_kernels", lambda: {})
    monkeypatch.setattr(device, "_copy_bandwidth", bandwidth)
    monkeypatch.setattr(device, "_numba_copy_bandwidth", lambda src, dst, budget_s: 12.0)
    monkeypatch.setattr(
        device, "measure_peak_gflops", lambda threads, budget_s, run_s: 40.0 * threads
    )
    monkeypatch.setattr(device, "measure_transcendental_gops", lambda threads, budget_s, run_s: 0.5)
    monkeypatch.setattr(device, "measure_launch_overhead_us", lambda budget_s: 1.5)
    monkeypatch.setattr(
        device, "measure_parallel_overhead_us", lambda launch_us, budget_s: 7.0 + 0 * launch_us
    )
    return calls


def test_calibrate_assembles_measurements(fake_measurements):
    spec = device.calibrate()
    cores = device.core_count()
    assert spec.method == "full" and spec.cores == cores
    assert spec.mem_bandwidth_1t_gbs == 5.0
    assert spec.mem_bandwidth_gbs == max(5.0 * cores, 12.0)
    assert spec.peak_gflops_fp32 == 40.0 * cores
    assert spec.parallel_overhead_us == 7.0
    assert spec.numba_version == device.numba_version()
    quick = device.calibrate(quick=True)
    assert quick.method == "quick"
    assert quick.parallel_overhead_us == device._DEFAULT_PARALLEL_OVERHEAD_US


def test_load_or_calibrate_caches(tmp_path, fake_measurements):
    spec = device.load_or_calibrate(tmp_path)
    assert fake_measurements["n"] == 1
    path = device.cache_path(tmp_path)
    assert path.exists() and path.parent == tmp_path
    again = device.load_or_calibrate(tmp_path)
    assert fake_measurements["n"] == 1  # cache hit
    assert again == spec
    # A full calibration satisfies a quick request too.
    assert device.load_or_calibrate(tmp_path, quick=True) == spec
    assert fake_measurements["n"] == 1


def test_quick_cache_is_upgraded_by_full_request(tmp_path, fake_measurements):
    assert device.load_or_calibrate(tmp_path, quick=True).method == "quick"
    assert device.load_or_calibrate(tmp_path, quick=True).method == "quick"
    assert fake_measurements["n"] == 1
    assert device.load_or_calibrate(tmp_path).method == "full"
    assert fake_measurements["n"] == 2


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda text: "{ truncated",
        lambda text: "",
        lambda text: text.replace('"cores"', '"kernels"'),
        lambda text: text.replace('"mem_bandwidth_gbs": ', '"mem_bandwidth_gbs": -'),
    ],
    ids=["truncated", "empty", "renamed-field", "negative"],
)
def test_corrupt_cache_is_recalibrated(tmp_path, fake_measurements, corrupt):
    device.load_or_calibrate(tmp_path)
    path = device.cache_path(tmp_path)
    path.write_text(corrupt(path.read_text(encoding="utf-8")), encoding="utf-8")
    with pytest.warns(UserWarning, match="corrupt device spec"):
        spec = device.load_or_calibrate(tmp_path)
    assert fake_measurements["n"] == 2
    assert DeviceSpec.from_json(path.read_text(encoding="utf-8")) == spec  # rewritten, valid


def test_mismatching_cache_is_recalibrated(tmp_path, fake_measurements):
    device.load_or_calibrate(tmp_path)
    path = device.cache_path(tmp_path)
    d = json.loads(path.read_text(encoding="utf-8"))
    d["numba_version"] = "0.0.1"
    d["key"] = device.device_key(d["name"], d["cores"], "0.0.1")
    path.write_text(json.dumps(d), encoding="utf-8")  # valid JSON, but for another numba
    spec = device.load_or_calibrate(tmp_path)
    assert fake_measurements["n"] == 2
    assert spec.numba_version == device.numba_version()


@pytest.mark.parametrize("what", ["fifo", "others-writable"])
def test_untrustworthy_cached_spec_is_ignored_without_blocking(tmp_path, fake_measurements, what):
    """A FIFO in place of the spec never blocks the read; a spec others could write is
    not trusted; both are measured again and replaced by a private file."""
    import signal
    import stat

    device.load_or_calibrate(tmp_path)
    path = device.cache_path(tmp_path)
    if what == "fifo":
        path.unlink()
        os.mkfifo(path)
    else:
        os.chmod(path, 0o666)

    def expired(signum, frame):
        raise TimeoutError("reading the cached device spec blocked")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(30)
    try:
        spec = device.load_or_calibrate(tmp_path)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert fake_measurements["n"] == 2
    st = os.lstat(path)
    assert stat.S_ISREG(st.st_mode) and not st.st_mode & 0o022
    assert DeviceSpec.from_json(path.read_text(encoding="utf-8")) == spec


def test_unwritable_cache_dir_warns_but_returns(tmp_path, fake_measurements):
    blocker = tmp_path / "file"
    blocker.write_text("x", encoding="utf-8")
    with pytest.warns(UserWarning, match="could not cache"):
        spec = device.load_or_calibrate(blocker / "sub")
    assert spec.method == "full"


def test_calibration_buffers_are_touched_and_kernels_compiled_beside_them(monkeypatch):
    compiled = []
    monkeypatch.setattr(device, "_kernels", lambda: compiled.append(1) or {})
    src, dst = device._buffers_and_kernels(3 * MIB + 8)
    assert compiled == [1]
    assert src.dtype == dst.dtype == np.float32 and src.size == dst.size == (3 * MIB + 8) // 4
    assert np.all(src == 1.0) and np.all(dst == 0.0) and dst.flags.writeable


def test_a_calibration_kernel_that_fails_to_compile_raises_in_the_caller(monkeypatch):
    def broken() -> dict:
        raise RuntimeError("no kernels today")

    monkeypatch.setattr(device, "_kernels", broken)
    with pytest.raises(RuntimeError, match="no kernels today"):
        device._buffers_and_kernels(MIB)


def test_quick_calibration_measures_sane_numbers():
    """The real microbenchmarks, in quick mode (about a second)."""
    spec = device.calibrate(quick=True)
    assert spec.method == "quick"
    for name in ("mem_bandwidth_gbs", "mem_bandwidth_1t_gbs", "peak_gflops_fp32"):
        assert 0.1 < getattr(spec, name) < 1e5, name
    assert spec.mem_bandwidth_gbs >= spec.mem_bandwidth_1t_gbs
    assert 0 < spec.transcendental_gops < 1e4
    assert 0 < spec.launch_overhead_us < 1e4
    assert DeviceSpec.from_json(spec.to_json()) == spec


# -- profiling --------------------------------------------------------------------


def test_measure_numpy_op_stats():
    a = np.ones(100_000, dtype=np.float32)
    out = np.empty_like(a)
    t = profiling.measure(np.add, (a, a, out), repeat=5, min_time=1e-4, max_time=0.5)
    assert 1 <= len(t.samples) <= 5
    assert t.number >= 1
    assert 0 < t.min <= t.median <= max(t.samples)
    assert t.min <= t.mean <= max(t.samples)
    assert t.min < 0.1  # 400 KB add: microseconds, never a tenth of a second
    assert t.samples[0] * t.number >= 1e-4 * 0.5  # batched past min_time
    np.testing.assert_array_equal(out, 2 * a)
    assert "min" in str(t) and t.stdev >= 0


def test_measure_warms_up_and_validates():
    calls = []
    t = profiling.measure(lambda: calls.append(1), repeat=2, min_time=0, warmup=3)
    assert len(calls) == 3 + 2 * t.number
    with pytest.raises(ValueError):
        profiling.measure(lambda: None, repeat=0)


def test_compare_reports_relative_error_per_model():
    spec = round_spec()
    samples = []
    for n in (1 << 16, 1 << 20, 1 << 24):
        w = KernelWork(bytes_read=8.0 * n, bytes_written=4.0 * n, flops=float(n))
        f = ScheduleFeatures(bytes_read=8.0 * n, bytes_written=4.0 * n, flops=float(n))
        samples.append(profiling.Sample(f"add{n}", sol.estimate(w, spec), work=w, features=f))
    samples.append(profiling.Sample("no-inputs", 1e-3))
    cmp = profiling.compare(
        {
            "sol": profiling.sol_predictor(spec),
            "double": lambda s: 2 * s.measured_s,
            "projected": profiling.projected_predictor(spec),
        },
        samples,
    )
    assert cmp.errors["sol"].n == 3  # skipped the sample without work
    assert cmp.mean_rel_error["sol"] == pytest.approx(0.0, abs=1e-12)
    assert cmp.mean_rel_error["double"] == pytest.approx(1.0)
    assert cmp.errors["double"].n == 4 and cmp.errors["double"].log2_bias == pytest.approx(1.0)
    assert cmp.best() == "sol"
    assert "double" in cmp.table()
    fitted = profiling.fit_projected(samples, spec)
    assert fitted.n_samples == 3


def test_profile_real_numpy_kernels_against_models():
    """End to end on real numpy ops: the models give finite, positive predictions."""
    spec = default_spec()
    samples = []
    for n in (1 << 12, 1 << 18):
        a = np.ones(n, dtype=np.float32)
        out = np.empty_like(a)
        w = KernelWork(bytes_read=8.0 * n, bytes_written=4.0 * n, flops=float(n), parallel=False)
        samples.append(
            profiling.profile(f"add{n}", np.add, (a, a, out), work=w, max_time=0.1, repeat=3)
        )
    cmp = profiling.compare({"sol": profiling.sol_predictor(spec)}, samples)
    e = cmp.errors["sol"]
    assert e.n == 2 and math.isfinite(e.mean_rel_error) and e.mean_rel_error >= 0


# -- layering ---------------------------------------------------------------------

COSTMODEL = Path(device.__file__).parent
ALLOWED_THIRD_PARTY = {"numpy", "numba", "llvmlite"}
#: geode's base-layer modules the cost models may use: the device spec is a cache file,
#: read and written like every other (never blocking on a FIFO, umask respected); numba,
#: an optional extra, is imported through geode.lazy (a clear error without it)
ALLOWED_GEODE = {"geode.safe_files", "geode.lazy"}


def imported_modules(path: Path) -> list[tuple[str, int]]:
    """(absolute module name or relative name, level) for each import in a file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, 0) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.module or "", node.level))
    return found


#: modules of the folder in higher layers (they drive the compiler to make and report
#: samples; tests/test_layering.py places them), left out of this check
ABOVE = {"samples.py", "report.py"}


def test_costmodel_imports_nothing_else_of_geode():
    files = sorted(f for f in COSTMODEL.glob("*.py") if f.name not in ABOVE)
    assert {f.name for f in files} >= {"device.py", "sol.py", "projected.py", "profiling.py"}
    allowed = set(sys.stdlib_module_names) | ALLOWED_THIRD_PARTY | {"__future__"}
    for f in files:
        for name, level in imported_modules(f):
            where = f"{f.name}: import {'.' * level}{name}"
            if level:
                assert level == 1, f"{where} reaches outside geode.costmodel"
                continue
            top = name.split(".")[0]
            if top == "geode":
                assert name.startswith("geode.costmodel") or name in ALLOWED_GEODE, where
            else:
                assert top in allowed, where
