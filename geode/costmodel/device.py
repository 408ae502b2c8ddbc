"""The device model: what the CPU can do, measured by microbenchmarks and cached.

A :class:`DeviceSpec` holds the handful of numbers the cost models divide work by:
memory bandwidth (one thread and all cores), vectorized fp32 FMA throughput,
transcendental throughput, cache sizes and the fixed costs of calling a kernel and
of forking/joining a ``prange`` region.

:func:`calibrate` measures them (a few seconds; ``quick=True`` about 0.2 s),
:func:`load_or_calibrate` caches the result as JSON keyed by CPU name, core count
and numba version ("none" without numba), :func:`default_spec` gives fixed conservative numbers for
code (and tests) that must not measure, and :func:`untimed_spec` this machine's cores
and caches with nominal rates (what a greedy compile plans with: no timing).

Conventions: bandwidth counts bytes read plus bytes written, like STREAM's copy
(a copy of ``n`` bytes moves ``2n``); GB/s and GFLOPS are decimal (1e9).

This module imports no other geode package (see docs/architecture.md): the kernels it
measures with come from a provider the codegen package installs
(:func:`set_kernel_provider`: the LLVM backend's), or, without one, from numba (an
optional extra: :func:`geode.lazy.require_numba` says how to install it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import mmap
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from geode.lazy import require_numba
from geode.safe_files import atomic_write, read_file

if TYPE_CHECKING:
    from concurrent.futures import Future

#: Bumped whenever the JSON layout or the meaning of a field changes.
FORMAT_VERSION = 1

KIB = 1024
MIB = 1024 * 1024

_DEFAULT_L1 = 32 * KIB
_DEFAULT_L2 = 1 * MIB
_DEFAULT_L3 = 8 * MIB

#: Default parallel (prange fork/join) overhead when it is not measured, in us.
_DEFAULT_PARALLEL_OVERHEAD_US = 20.0

_METHODS = ("default", "quick", "full")


@dataclass
class DeviceSpec:
    """Throughputs, cache sizes and fixed overheads of one CPU, as the cost models see it.

    Bandwidths are in GB/s counting read + written bytes (STREAM copy convention);
    ``peak_gflops_fp32`` is the all-core rate of vectorized fp32 FMA loops as numba
    compiles them (2 flops per FMA); ``transcendental_gops`` is the all-core rate of
    fp32 ``exp`` calls, in billions per second. ``method`` says where the numbers
    came from: ``"default"`` (constants), ``"quick"`` or ``"full"`` calibration.
    """

    name: str
    cores: int
    mem_bandwidth_gbs: float
    mem_bandwidth_1t_gbs: float
    peak_gflops_fp32: float
    l1_bytes: int
    l2_bytes: int
    l3_bytes: int
    launch_overhead_us: float
    parallel_overhead_us: float
    transcendental_gops: float = 1.0
    numba_version: str = ""
    method: str = "default"
    calibration_s: float = 0.0

    def __post_init__(self) -> None:
        _validate(self)

    # -- derived rates (SI units) ---------------------------------------------

    def bandwidth_bytes_per_s(self, parallel: bool = True) -> float:
        """Memory bandwidth in bytes/s for a parallel (all cores) or serial kernel."""
        gbs = self.mem_bandwidth_gbs if parallel else self.mem_bandwidth_1t_gbs
        return gbs * 1e9

    def flops_per_s(self, parallel: bool = True) -> float:
        """Peak vectorized fp32 flops/s on all cores, or on one core when serial."""
        total = self.peak_gflops_fp32 * 1e9
        return total if parallel else total / self.cores

    def transcendentals_per_s(self, parallel: bool = True) -> float:
        """Transcendental function evaluations per second, all cores or one."""
        total = self.transcendental_gops * 1e9
        return total if parallel else total / self.cores

    def kernel_overhead_s(self, parallel: bool = True) -> float:
        """Fixed cost of one kernel call in seconds (plus fork/join when parallel)."""
        us = self.launch_overhead_us + (self.parallel_overhead_us if parallel else 0.0)
        return us * 1e-6

    # -- serialization ---------------------------------------------------------

    def key(self) -> str:
        """The cache key this spec belongs to: CPU name, core count, numba version."""
        return device_key(self.name, self.cores, self.numba_version)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field, plus the format version and cache key."""
        d = dataclasses.asdict(self)
        d["format"] = FORMAT_VERSION
        d["key"] = self.key()
        return d

    def to_json(self) -> str:
        """The spec as an indented JSON document."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DeviceSpec:
        """Rebuild a spec from :meth:`to_dict` output; raise ``ValueError`` if malformed.

        Every field must be present with the right type and a sane value; the format
        version and key, when present, must match. Unknown keys are rejected.
        """
        if not isinstance(d, Mapping):
            raise ValueError(f"device spec must be a JSON object, got {type(d).__name__}")
        fmt = d.get("format", FORMAT_VERSION)
        if fmt != FORMAT_VERSION:
            raise ValueError(f"device spec format {fmt!r}, expected {FORMAT_VERSION}")
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = set(d) - set(names) - {"format", "key"}
        if unknown:
            raise ValueError(f"device spec has unknown fields {sorted(unknown)}")
        missing = [
            f.name
            for f in dataclasses.fields(cls)
            if f.name not in d and f.default is dataclasses.MISSING
        ]
        if missing:
            raise ValueError(f"device spec is missing fields {missing}")
        spec = cls(**{k: d[k] for k in names if k in d})
        if "key" in d and d["key"] != spec.key():
            raise ValueError(f"device spec key {d['key']!r} does not match {spec.key()!r}")
        return spec

    @classmethod
    def from_json(cls, text: str) -> DeviceSpec:
        """Parse :meth:`to_json` output; raise ``ValueError`` on any defect."""
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"device spec is not valid JSON: {e}") from e
        return cls.from_dict(d)

    def source(self) -> str:
        """One line naming the device and where the numbers came from (for ``explain()``):
        ``"AMD EPYC, 2 cores: nominal rates (not timed)"``, ``"...: quick calibration"``."""
        where = (
            "nominal rates (not timed)"
            if self.method == "default"
            else f"{self.method} calibration"
        )
        return f"{self.name}, {self.cores} cores: {where}"

    def summary(self) -> str:
        """One line per number, for logs and ``explain()`` output."""
        return "\n".join(
            [
                f"device {self.name} ({self.cores} cores, {self.method}, numba {self.numba_version})",
                f"  bandwidth    {self.mem_bandwidth_1t_gbs:.1f} GB/s (1 thread), "
                f"{self.mem_bandwidth_gbs:.1f} GB/s (all)",
                f"  fp32 peak    {self.peak_gflops_fp32:.1f} GFLOPS; "
                f"exp {self.transcendental_gops:.2f} G/s",
                f"  caches       L1 {self.l1_bytes // KIB} KiB, L2 {self.l2_bytes // KIB} KiB, "
                f"L3 {self.l3_bytes // KIB} KiB",
                f"  overheads    launch {self.launch_overhead_us:.2f} us, "
                f"parallel {self.parallel_overhead_us:.2f} us",
            ]
        )


def _validate(spec: DeviceSpec) -> None:
    if not isinstance(spec.name, str) or not spec.name:
        raise ValueError(f"device name must be a non-empty string, got {spec.name!r}")
    if not isinstance(spec.numba_version, str):
        raise ValueError(f"numba_version must be a string, got {spec.numba_version!r}")
    if spec.method not in _METHODS:
        raise ValueError(f"method must be one of {_METHODS}, got {spec.method!r}")
    for name in ("cores", "l1_bytes", "l2_bytes", "l3_bytes"):
        v = getattr(spec, name)
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    positive = (
        "mem_bandwidth_gbs",
        "mem_bandwidth_1t_gbs",
        "peak_gflops_fp32",
        "transcendental_gops",
    )
    nonneg = ("launch_overhead_us", "parallel_overhead_us", "calibration_s")
    for name in positive + nonneg:
        v = getattr(spec, name)
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise ValueError(f"{name} must be a finite number, got {v!r}")
        if v < 0 or (name in positive and v == 0):
            raise ValueError(f"{name} must be {'positive' if name in positive else '>= 0'}")
        setattr(spec, name, float(v))


# -- identity of the machine ----------------------------------------------------


def cpu_name() -> str:
    """The CPU model name (``/proc/cpuinfo``, else ``platform``), never empty."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Processor", "cpu model") and value.strip():
                    return " ".join(value.split())
    except OSError:
        pass
    import platform  # here: a fallback that a warm start never takes

    return platform.processor() or platform.machine() or "unknown-cpu"


def core_count() -> int:
    """Cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


@cache
def numba_version() -> str:
    """The installed numba version, read without importing numba (nor
    ``importlib.metadata``, 30 ms: the name of numba's ``.dist-info`` folder says it);
    ``"none"`` when numba is not installed (an optional extra: the numba backend's)."""
    loaded = sys.modules.get("numba")
    if loaded is not None:
        return str(loaded.__version__)
    import importlib.util

    try:
        spec = importlib.util.find_spec("numba")
    except (ImportError, ValueError):  # hidden from imports, or a half-initialized stub
        return "none"
    if spec is None or not spec.origin:
        return "none"
    try:
        names = sorted(os.listdir(Path(spec.origin).parent.parent))  # no glob: 1 ms less
    except OSError:
        names = []
    for name in names:
        if name.startswith("numba-") and name.endswith(".dist-info"):
            return name[len("numba-") : -len(".dist-info")]
    try:
        from importlib.metadata import version

        return version("numba")
    except Exception:  # metadata may be missing in odd installs
        try:
            import numba

            return str(numba.__version__)
        except ImportError:
            return "none"


def device_key(name: str, cores: int, numba_ver: str) -> str:
    """The cache key of a device: ``"<cpu name>|<cores> cores|numba <version>"``."""
    return f"{name}|{cores} cores|numba {numba_ver}"


def _parse_size(text: str) -> int | None:
    """Parse ``"48K"``, ``"2048 KiB"``, ``"4 MiB"``, ``"1048576"`` into bytes."""
    t = text.strip().split("(")[0].strip().replace(" ", "")
    if not t:
        return None
    units = {"K": KIB, "KB": KIB, "KIB": KIB, "M": MIB, "MB": MIB, "MIB": MIB}
    units |= {"G": 1024 * MIB, "GB": 1024 * MIB, "GIB": 1024 * MIB, "B": 1, "": 1}
    i = len(t)
    while i > 0 and not t[i - 1].isdigit():
        i -= 1
    num, unit = t[:i], t[i:].upper()
    if unit not in units:
        return None
    try:
        value = float(num)
    except ValueError:
        return None
    size = int(value * units[unit])
    return size if size > 0 else None


def detect_cache_sizes() -> tuple[int, int, int]:
    """Per-core L1d, L2 and L3 sizes in bytes: from /sys, else ``lscpu -C``, else defaults."""
    found: dict[int, int] = {}
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    try:
        for idx in sorted(base.glob("index*")):
            try:
                level = int((idx / "level").read_text(encoding="utf-8").strip())
                kind = (idx / "type").read_text(encoding="utf-8").strip()
                size = _parse_size((idx / "size").read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if kind != "Instruction" and size and level in (1, 2, 3):
                found.setdefault(level, size)
    except OSError:
        pass
    if len(found) < 3:
        import subprocess  # here: a fallback that a warm start never takes

        try:
            out = subprocess.run(
                ["lscpu", "-C=NAME,ONE-SIZE"],
                capture_output=True,
                text=True,
                timeout=2,
                check=False,
            ).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        for line in out.splitlines()[1:]:
            parts = line.split(None, 1)
            if len(parts) != 2:
                continue
            name, size = parts[0].upper(), _parse_size(parts[1])
            level = {"L1D": 1, "L2": 2, "L3": 3}.get(name)
            if level and size:
                found.setdefault(level, size)
    return (
        found.get(1, _DEFAULT_L1),
        found.get(2, _DEFAULT_L2),
        found.get(3, _DEFAULT_L3),
    )


# -- the fixed fallback ---------------------------------------------------------


def default_spec() -> DeviceSpec:
    """A fixed, conservative spec that measures nothing (same numbers on every machine).

    Four cores, 10 GB/s (5 GB/s on one thread), 50 GFLOPS fp32, 0.5 G exp/s,
    32 KiB / 1 MiB / 8 MiB caches, 2 us per call and 20 us per parallel region.
    """
    return DeviceSpec(
        name="generic-cpu",
        cores=4,
        mem_bandwidth_gbs=10.0,
        mem_bandwidth_1t_gbs=5.0,
        peak_gflops_fp32=50.0,
        l1_bytes=_DEFAULT_L1,
        l2_bytes=_DEFAULT_L2,
        l3_bytes=_DEFAULT_L3,
        launch_overhead_us=2.0,
        parallel_overhead_us=_DEFAULT_PARALLEL_OVERHEAD_US,
        transcendental_gops=0.5,
        numba_version="",
        method="default",
    )


#: the untimed spec's nominal rates (a current x86 server core with AVX2 and FMA; the
#: quick calibration measured 106 GFLOPS, 0.42 G exp/s, 24.7 GB/s and 0.23 us a core on
#: the AMD EPYC of docs/performance.md): compute per core, memory per thread and in all
_NOMINAL_GFLOPS_PER_CORE = 100.0
_NOMINAL_EXP_GOPS_PER_CORE = 0.4
_NOMINAL_BANDWIDTH_1T_GBS = 20.0
_NOMINAL_BANDWIDTH_GBS = 30.0
_NOMINAL_LAUNCH_US = 0.5


def untimed_spec() -> DeviceSpec:
    """This machine's spec without timing anything: its identity as :func:`fingerprint`
    reads it (CPU name, cores, cache sizes, numba version) with nominal rates: 100
    GFLOPS fp32 and 0.4 G exp/s a core, 20 GB/s on one thread and 30 GB/s on all, 0.5 us
    per call and 20 us per parallel region. ``method`` is ``"default"``. What a greedy
    compile plans and schedules with (:func:`geode.codegen.driver.plan_spec`): its
    decisions turn mostly on the cores and cache sizes, which are exact here, and two
    machines with one fingerprint get the same plans (the model cache keys compiles by
    the fingerprint). Made once per process and core count (the cores are this
    process's affinity, read each time as the fingerprint reads them)."""
    return _untimed_spec(core_count())


@cache
def _untimed_spec(cores: int) -> DeviceSpec:
    l1, l2, l3 = detect_cache_sizes()
    return DeviceSpec(
        name=cpu_name(),
        cores=cores,
        mem_bandwidth_gbs=_NOMINAL_BANDWIDTH_GBS,
        mem_bandwidth_1t_gbs=_NOMINAL_BANDWIDTH_1T_GBS,
        peak_gflops_fp32=_NOMINAL_GFLOPS_PER_CORE * cores,
        l1_bytes=l1,
        l2_bytes=l2,
        l3_bytes=l3,
        launch_overhead_us=_NOMINAL_LAUNCH_US,
        parallel_overhead_us=_DEFAULT_PARALLEL_OVERHEAD_US,
        transcendental_gops=_NOMINAL_EXP_GOPS_PER_CORE * cores,
        numba_version=numba_version(),
        method="default",
    )


# -- microbenchmarks --------------------------------------------------------------


#: the function returning the calibration kernels (:func:`set_kernel_provider`)
_provider: Callable[[], Mapping[str, Callable[..., Any]]] | None = None


def set_kernel_provider(fn: Callable[[], Mapping[str, Callable[..., Any]]] | None) -> None:
    """Install what compiles the calibration kernels: ``fn()`` returns ``{"tiny": tiny(a,
    b, c) setting c[0] = a[0] + b[0] (three float32 arrays), "compute": compute(x, out,
    reps, mode) (mode 0: ``reps`` times 16 dependent FMAs per element, mode 1: ``reps``
    times ``exp``; float32, releases the GIL), "pcopy": pcopy(src, dst) (a parallel copy
    of float32 vectors)}``. geode's codegen package installs its LLVM backend's; without a
    provider, numba compiles them. None restores numba's."""
    global _provider
    _provider = fn
    _kernels.cache_clear()


@cache
def _kernels() -> dict[str, Callable[..., Any]]:
    """The calibration kernels, compiled on first use (see :func:`set_kernel_provider`)."""
    if _provider is not None:
        return dict(_provider())
    return _numba_kernels()


def _numba_kernels() -> dict[str, Callable[..., Any]]:
    """The calibration kernels compiled by numba (without a provider: ``geode.codegen``
    installs the LLVM backend's, so a compile never gets here)."""
    numba = require_numba("calibrating the device without geode.codegen's kernels")

    @numba.njit(nogil=True, cache=False)
    def tiny(a, b, c):  # pragma: no cover - compiled
        c[0] = a[0] + b[0]

    @numba.njit(nogil=True, fastmath=True, cache=False)
    def compute(x, out, reps, mode):  # pragma: no cover - compiled
        n = x.shape[0]
        if mode == 0:
            # 16 dependent FMAs per element; elements vectorize across SIMD lanes and
            # independent iterations overlap, so this runs near the FMA pipes' peak.
            for _ in range(reps):
                for i in range(n):
                    v = x[i]
                    acc = v
                    for _k in range(16):
                        acc = acc * v + np.float32(0.5)
                    out[i] = acc
        else:
            for _ in range(reps):
                for i in range(n):
                    out[i] = np.exp(x[i])

    @numba.njit(parallel=True, nogil=True, cache=False)
    def pcopy(src, dst):  # pragma: no cover - compiled
        for i in numba.prange(src.shape[0]):
            dst[i] = src[i]

    return {"tiny": tiny, "compute": compute, "pcopy": pcopy}


def _parallel_copy() -> Callable[..., Any]:
    """The parallel copy kernel of the calibration (see :func:`set_kernel_provider`)."""
    return _kernels()["pcopy"]


#: Flops per element per rep of the FMA kernel (16 FMAs of 2 flops).
_FMA_FLOPS_PER_ELEM = 32
#: Elements of the compute kernels' arrays: small enough to stay in L1.
_COMPUTE_ELEMS = 512


def _best_of(run: Callable[[], float], budget_s: float, min_runs: int, max_runs: int) -> float:
    """Call ``run`` (which returns a duration) until the budget is spent; the minimum."""
    best = math.inf
    deadline = time.perf_counter() + budget_s
    for i in range(max_runs):
        best = min(best, run())
        if i + 1 >= min_runs and time.perf_counter() > deadline:
            break
    return best


def _in_threads(fns: list[Callable[[], None]]) -> float:
    """Run each callable in its own thread, all released at once; wall seconds."""
    if len(fns) == 1:
        t0 = time.perf_counter_ns()
        fns[0]()
        return (time.perf_counter_ns() - t0) * 1e-9
    barrier = threading.Barrier(len(fns) + 1)

    def body(fn: Callable[[], None]) -> None:
        barrier.wait()
        fn()

    threads = [threading.Thread(target=body, args=(fn,), daemon=True) for fn in fns]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter_ns()
    for t in threads:
        t.join()
    return (time.perf_counter_ns() - t0) * 1e-9


def _buffers(nbytes: int) -> tuple[np.ndarray, np.ndarray]:
    """Two float32 buffers of ``nbytes`` (``src`` all ones), both touched now, not inside
    a timing. They are anonymous memory maps of their own rather than numpy's allocations:
    numpy asks for transparent huge pages on large arrays, and on a kernel that compacts
    memory for them when asked (``defrag=madvise``) the first touch of 64 MiB took 0.1 s
    of the quick calibration, against 0.04 s in small pages (the copy's speed is the same:
    ``docs/performance.md``)."""
    n = max(1, nbytes // 4)
    src, dst = (np.frombuffer(mmap.mmap(-1, n * 4), dtype=np.float32) for _ in range(2))
    src.fill(1.0)
    dst.fill(0.0)
    return src, dst


def _buffers_and_kernels(nbytes: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_buffers`, while another thread compiles the calibration kernels
    (:func:`_kernels`): touching the buffers' pages is the kernel's work and compiling is
    LLVM's, both without the GIL, so on two cores they overlap (40-60 ms each here). Both
    are done when this returns, so no timing runs beside either. A compile error is
    raised here."""
    failure: list[BaseException] = []

    def compile_kernels() -> None:
        try:
            _kernels()
        except BaseException as exc:  # noqa: BLE001 - raised in the calling thread
            failure.append(exc)

    worker = threading.Thread(target=compile_kernels, name="geode-calibration", daemon=True)
    worker.start()
    try:
        buffers = _buffers(nbytes)
    finally:
        worker.join()
    if failure:
        raise failure[0]
    return buffers


def _copy_bandwidth(src: np.ndarray, dst: np.ndarray, threads: int, budget_s: float) -> float:
    threads = max(1, threads)
    bounds = np.linspace(0, src.size, threads + 1).astype(np.int64)
    chunks = [(src[a:b], dst[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]

    def run() -> float:
        return _in_threads([lambda s=s, d=d: np.copyto(d, s) for s, d in chunks])

    run()  # warm the pages and the threads
    best = _best_of(run, budget_s, min_runs=2, max_runs=50)
    return 2 * src.nbytes / best / 1e9


def _numba_copy_bandwidth(src: np.ndarray, dst: np.ndarray, budget_s: float) -> float:
    pcopy = _parallel_copy()
    pcopy(src, dst)  # compile + warm

    def run() -> float:
        t0 = time.perf_counter_ns()
        pcopy(src, dst)
        return (time.perf_counter_ns() - t0) * 1e-9

    best = _best_of(run, budget_s, min_runs=2, max_runs=50)
    return 2 * src.nbytes / best / 1e9


def _compute_rate(mode: int, threads: int, budget_s: float, run_s: float = 0.01) -> float:
    """Elements-times-reps per second of the compute kernel in ``mode`` on ``threads``
    (each timed run about ``run_s`` seconds)."""
    compute = _kernels()["compute"]
    rng = np.random.default_rng(0)
    # Values in [0.1, 0.2): the FMA recurrence stays bounded, exp stays normal.
    x = (rng.random(_COMPUTE_ELEMS, dtype=np.float32) * 0.1 + 0.1).astype(np.float32)
    outs = [np.empty_like(x) for _ in range(max(1, threads))]
    compute(x, outs[0], 1, mode)  # compile + warm
    # Size one run at ~run_s from a short probe.
    reps = 16
    while True:
        t0 = time.perf_counter_ns()
        compute(x, outs[0], reps, mode)
        dt = (time.perf_counter_ns() - t0) * 1e-9
        if dt > min(2e-3, run_s / 2) or reps >= 1 << 24:
            break
        reps *= 4
    reps = max(1, int(reps * run_s / max(dt, 1e-9)))

    def run() -> float:
        return _in_threads([lambda o=o: compute(x, o, reps, mode) for o in outs])

    best = _best_of(run, budget_s, min_runs=2, max_runs=100)
    return len(outs) * reps * x.size / best


def measure_peak_gflops(threads: int = 1, budget_s: float = 0.3, run_s: float = 0.01) -> float:
    """All-thread fp32 GFLOPS of an L1-resident, vectorized FMA-chain numba loop.

    Runs the kernel in ``threads`` Python threads (it releases the GIL), the best of runs
    of about ``run_s`` seconds within ``budget_s``.
    """
    return _compute_rate(0, threads, budget_s, run_s) * _FMA_FLOPS_PER_ELEM / 1e9


def measure_transcendental_gops(
    threads: int = 1, budget_s: float = 0.2, run_s: float = 0.01
) -> float:
    """Billions of fp32 ``exp`` evaluations per second from a numba loop on ``threads``
    (runs of about ``run_s`` seconds within ``budget_s``)."""
    return _compute_rate(1, threads, budget_s, run_s) / 1e9


def _per_call_us(fn: Callable[..., Any], args: tuple[Any, ...], budget_s: float) -> float:
    """Minimum over batches of the per-call time of ``fn(*args)``, in microseconds."""
    fn(*args)
    calls = 200

    def run() -> float:
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn(*args)
        return (time.perf_counter_ns() - t0) * 1e-9 / calls

    return _best_of(run, budget_s, min_runs=3, max_runs=1000) * 1e6


def measure_launch_overhead_us(budget_s: float = 0.1) -> float:
    """Cost in us of calling a trivial numba kernel from Python with three array args."""
    a = np.ones(8, dtype=np.float32)
    b = np.ones(8, dtype=np.float32)
    c = np.zeros(8, dtype=np.float32)
    return _per_call_us(_kernels()["tiny"], (a, b, c), budget_s)


def measure_parallel_overhead_us(launch_us: float | None = None, budget_s: float = 0.2) -> float:
    """Extra cost in us of a ``prange`` region's fork/join over a plain kernel call.

    Times the prange copy kernel on a few elements per core and subtracts the
    serial launch overhead (measured if not given).
    """
    if launch_us is None:
        launch_us = measure_launch_overhead_us()
    n = 16 * core_count()
    src = np.ones(n, dtype=np.float32)
    dst = np.zeros(n, dtype=np.float32)
    t = _per_call_us(_parallel_copy(), (src, dst), budget_s)
    return max(0.0, t - launch_us)


# -- calibration and its cache ----------------------------------------------------


def calibrate(quick: bool = False) -> DeviceSpec:
    """Measure this machine's :class:`DeviceSpec` with microbenchmarks.

    Full mode (a few seconds, mostly numba compilation) measures bandwidth with a
    numpy copy on one thread and the best of a numba ``prange`` copy and a threaded
    numpy copy on all cores, over 256 MiB buffers; the FMA and ``exp`` throughput
    with nogil numba loops in one thread per core; the kernel-call overhead; and the
    ``prange`` fork/join overhead. Quick mode (what a compile runs once per machine and
    cache folder: about 0.2 s) copies buffers just past the last-level cache (each at
    least the L3's size, together twice it; 16 MiB at least), takes the best of a few
    short runs (3 ms compute runs) and runs no ``prange`` kernel: the all-core bandwidth
    comes from the threaded numpy copy and the fork/join overhead is the default
    constant (measurements: ``docs/performance.md``). The kernels are compiled on a
    thread of their own while the buffers are allocated and touched, before anything is
    timed (:func:`_buffers_and_kernels`).
    """
    t_start = time.perf_counter()
    cores = core_count()
    l1, l2, l3 = detect_cache_sizes()
    scale = 0.1 if quick else 1.0
    src, dst = _buffers_and_kernels(max(l3, 16 * MIB) if quick else 256 * MIB)

    bw_1t = _copy_bandwidth(src, dst, threads=1, budget_s=0.25 * scale)
    bw_all = bw_1t
    if cores > 1:
        bw_all = max(bw_all, _copy_bandwidth(src, dst, threads=cores, budget_s=0.25 * scale))
    if not quick:
        bw_all = max(bw_all, _numba_copy_bandwidth(src, dst, budget_s=0.4))
    del src, dst
    run_s = 0.003 if quick else 0.01
    gflops = measure_peak_gflops(threads=cores, budget_s=0.3 * scale, run_s=run_s)
    trans = measure_transcendental_gops(threads=cores, budget_s=0.2 * scale, run_s=run_s)
    launch = measure_launch_overhead_us(budget_s=0.1 * scale)
    if quick:
        par = _DEFAULT_PARALLEL_OVERHEAD_US
    else:
        par = measure_parallel_overhead_us(launch_us=launch, budget_s=0.2)

    return DeviceSpec(
        name=cpu_name(),
        cores=cores,
        mem_bandwidth_gbs=bw_all,
        mem_bandwidth_1t_gbs=bw_1t,
        peak_gflops_fp32=gflops,
        l1_bytes=l1,
        l2_bytes=l2,
        l3_bytes=l3,
        launch_overhead_us=launch,
        parallel_overhead_us=par,
        transcendental_gops=trans,
        numba_version=numba_version(),
        method="quick" if quick else "full",
        calibration_s=time.perf_counter() - t_start,
    )


def cache_path(cache_dir: str | os.PathLike[str]) -> Path:
    """The JSON file in ``cache_dir`` that holds this machine's spec."""
    key = device_key(cpu_name(), core_count(), numba_version())
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return Path(cache_dir) / f"device-{digest}.json"


def _load_cached(path: Path, quick: bool) -> DeviceSpec | None:
    """The cached spec if it is well formed, for this machine and good enough. Read like
    every cache file (:func:`geode.safe_files.read_file`): a regular file of this user's
    that others cannot write, opened non-blocking (a FIFO in its place is a miss, never
    a hang)."""
    raw = read_file(path, 1 << 20)
    if raw is None:
        return None
    try:
        spec = DeviceSpec.from_json(raw.decode("utf-8"))
    except (ValueError, TypeError) as e:
        warnings.warn(f"ignoring corrupt device spec {path}: {e}", stacklevel=3)
        return None
    if spec.key() != device_key(cpu_name(), core_count(), numba_version()):
        return None
    if spec.method == "default" or (spec.method == "quick" and not quick):
        return None
    return spec


def _store(path: Path, spec: DeviceSpec) -> None:
    """Write atomically (temp file + rename, the umask respected); warn instead of failing."""
    try:
        atomic_write(path, spec.to_json().encode("utf-8"))
    except OSError as e:
        warnings.warn(f"could not cache the device spec in {path.parent}: {e}", stacklevel=3)


def load_or_calibrate(cache_dir: str | os.PathLike[str], quick: bool = False) -> DeviceSpec:
    """This machine's spec from ``cache_dir``, calibrating (and caching) when needed.

    The cache file is keyed by CPU name, core count and numba version. A file that
    is not valid JSON, misses or mistypes a field, belongs to another key, or was a
    quick calibration when a full one is asked for, is recalibrated and overwritten.
    A full calibration satisfies a quick request.
    """
    path = cache_path(cache_dir)
    spec = _load_cached(path, quick)
    if spec is not None:
        return spec
    spec = calibrate(quick=quick)
    _store(path, spec)
    return spec


def fingerprint() -> dict[str, Any]:
    """What identifies this machine's spec without timing anything: the CPU's name, the
    cores this process may use, the cache sizes, the numba version and the spec's format.
    Two processes with the same fingerprint share a cached spec (:func:`cache_path` keys
    the file by the first, second and fourth); the model cache keys compiles by it
    rather than by the measured numbers, which vary from calibration to calibration."""
    l1, l2, l3 = detect_cache_sizes()
    return {
        "name": cpu_name(),
        "cores": core_count(),
        "l1_bytes": l1,
        "l2_bytes": l2,
        "l3_bytes": l3,
        "numba_version": numba_version(),
        "format": FORMAT_VERSION,
    }


#: the spec of each cache folder, once known in this process
_SPECS: dict[str, DeviceSpec] = {}
#: the spec of each cache folder being measured (or loaded) now, on whichever thread
_PENDING: dict[str, Future[DeviceSpec]] = {}
_specs_lock = threading.Lock()


def _measure(cache_dir: str) -> DeviceSpec:
    """The spec of ``cache_dir`` from its file, else a quick calibration (stored); the
    defaults when the cache folder cannot be written."""
    try:
        return load_or_calibrate(cache_dir, quick=True)
    except OSError as exc:  # unwritable cache dir: calibrate without caching
        logging.getLogger(__name__).warning("device spec not cached (%s); using defaults", exc)
        return default_spec()


def _claim(cache_dir: str) -> tuple[DeviceSpec | None, Future[DeviceSpec] | None, bool]:
    """The spec of ``cache_dir`` when known; else its pending future, and whether the
    caller just registered it (and so must fill it in)."""
    with _specs_lock:
        spec = _SPECS.get(cache_dir)
        if spec is not None:
            return spec, None, False
        fut = _PENDING.get(cache_dir)
        if fut is not None:
            return None, fut, False
        from concurrent.futures import Future  # a calibration's: a warm start has none

        fut = Future()
        _PENDING[cache_dir] = fut
        return None, fut, True


def _fill(cache_dir: str, fut: Future[DeviceSpec]) -> None:
    """Measure ``cache_dir``'s spec into ``fut`` (its error, if any, goes to the waiters)."""
    fut.set_running_or_notify_cancel()
    try:
        spec = _measure(cache_dir)
    except BaseException as exc:  # noqa: BLE001 - raised where the spec is asked for
        with _specs_lock:
            _PENDING.pop(cache_dir, None)
        fut.set_exception(exc)
        return
    with _specs_lock:
        _SPECS[cache_dir] = spec
        _PENDING.pop(cache_dir, None)
    fut.set_result(spec)


def start_calibration(cache_dir: str) -> None:
    """Begin finding this machine's spec for ``cache_dir`` on a background thread (its
    file read, else a quick calibration: LLVM compiles and native runs, which release the
    GIL), unless it is known or under way already; :func:`cached_spec` waits for it. A
    compile starts it first thing, so the calibration overlaps the compile's own work
    up to the first stage that needs the measured numbers."""
    _, fut, mine = _claim(cache_dir)
    if mine and fut is not None:
        threading.Thread(
            target=_fill, args=(cache_dir, fut), name="geode-calibration", daemon=True
        ).start()


def cached_spec(cache_dir: str) -> DeviceSpec:
    """This machine's spec for compiles using ``cache_dir``: a quick calibration, measured
    once per machine (cached on disk) and once per process (in memory); the defaults when
    the cache folder cannot be written. Waits for the one :func:`start_calibration`
    began, if any (measured once, whichever thread asks)."""
    spec, fut, mine = _claim(cache_dir)
    if spec is not None:
        return spec
    assert fut is not None  # (no spec known: one is pending)
    if mine:
        _fill(cache_dir, fut)
    return fut.result()


def wait_calibration(cache_dir: str) -> None:
    """Wait until no calibration for ``cache_dir`` is under way (nothing when none is):
    a compile that stops early lets none go on after it returns. A failed one's error is
    left to the next use of the spec (which measures again)."""
    with _specs_lock:
        fut = _PENDING.get(cache_dir)
    if fut is not None:
        from concurrent.futures import wait

        wait([fut])


def _reset_after_fork() -> None:
    """A forked child has none of its parent's threads: what they were measuring, it
    measures again when asked."""
    global _specs_lock
    _specs_lock = threading.Lock()
    _PENDING.clear()


os.register_at_fork(after_in_child=_reset_after_fork)
