"""Speed-of-light (SOL) cost model: bytes and flops against the device's peaks.

The cheapest of the three models (PAI's "SOL" level): a kernel takes as long as its
slowest resource, memory traffic at full bandwidth or arithmetic at peak
throughput, as if every cache hit and every instruction issued perfectly, plus the
fixed cost of calling it. The fusion planner uses it to score candidate merges:

>>> from geode.costmodel.device import default_spec
>>> spec = default_spec()
>>> add = KernelWork(bytes_read=8 << 20, bytes_written=4 << 20, flops=1 << 20)
>>> mul = KernelWork(bytes_read=4 << 20, bytes_written=4 << 20, flops=1 << 20)
>>> fused = KernelWork(bytes_read=8 << 20, bytes_written=4 << 20, flops=2 << 20)
>>> decide_merge([add, mul], fused, spec).take
True
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .device import MIB, DeviceSpec

_GIB = 1024 * MIB


@dataclass(frozen=True)
class KernelWork:
    """The work of one kernel (or of ``n_kernels`` identical-overhead calls).

    ``bytes_read``/``bytes_written`` count main-memory traffic, ``flops`` arithmetic
    operations (an FMA is two), ``transcendentals`` calls such as ``exp``/``tanh``
    (which on CPUs without a vector math library cost far more than a flop);
    ``parallel`` says whether the kernel runs on all cores in a ``prange`` region.
    """

    bytes_read: float
    bytes_written: float
    flops: float
    transcendentals: float = 0.0
    parallel: bool = True
    n_kernels: int = 1

    def __post_init__(self) -> None:
        for name in ("bytes_read", "bytes_written", "flops", "transcendentals"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not v >= 0:
                raise ValueError(f"KernelWork.{name} must be a number >= 0, got {v!r}")
            if not math.isfinite(v):
                raise ValueError(f"KernelWork.{name} must be finite, got {v!r}")
        if isinstance(self.n_kernels, bool) or not isinstance(self.n_kernels, int):
            raise ValueError(f"KernelWork.n_kernels must be an int, got {self.n_kernels!r}")
        if self.n_kernels < 0:
            raise ValueError(f"KernelWork.n_kernels must be >= 0, got {self.n_kernels}")

    @property
    def bytes_moved(self) -> float:
        """Bytes read plus bytes written."""
        return self.bytes_read + self.bytes_written


@dataclass(frozen=True)
class Estimate:
    """An SOL estimate broken down by resource (all in seconds).

    ``total_s = max(memory_s, compute_s + transcendental_s) + overhead_s``;
    ``bound`` names the largest term: ``"memory"``, ``"compute"`` or ``"overhead"``.
    """

    total_s: float
    memory_s: float
    compute_s: float
    transcendental_s: float
    overhead_s: float

    @property
    def bound(self) -> str:
        """Which resource limits the kernel."""
        arith = self.compute_s + self.transcendental_s
        body = max(self.memory_s, arith)
        if self.overhead_s >= body:
            return "overhead"
        return "memory" if self.memory_s >= arith else "compute"


def breakdown(work: KernelWork, spec: DeviceSpec) -> Estimate:
    """The SOL estimate of ``work`` on ``spec``, term by term.

    Memory time is bytes over the bandwidth (all-core or one-thread); arithmetic
    time is flops over peak plus transcendentals over their rate (both share the
    cores' pipes, so they add); the body takes the larger of the two; each kernel
    call adds the launch overhead, and the fork/join overhead when parallel.
    """
    p = work.parallel
    memory = work.bytes_moved / spec.bandwidth_bytes_per_s(p)
    compute = work.flops / spec.flops_per_s(p)
    trans = work.transcendentals / spec.transcendentals_per_s(p)
    overhead = work.n_kernels * spec.kernel_overhead_s(p)
    total = max(memory, compute + trans) + overhead
    return Estimate(total, memory, compute, trans, overhead)


def estimate(work: KernelWork, spec: DeviceSpec) -> float:
    """Seconds ``work`` takes at the speed of light of ``spec`` (see :func:`breakdown`)."""
    return breakdown(work, spec).total_s


def total_time(works: Iterable[KernelWork], spec: DeviceSpec) -> float:
    """Seconds for running the kernels one after another."""
    return sum(estimate(w, spec) for w in works)


def fusion_gain(separate: Sequence[KernelWork], fused: KernelWork, spec: DeviceSpec) -> float:
    """Seconds saved by running ``fused`` instead of the ``separate`` kernels.

    Positive when fusing pays (intermediates stay in registers/cache, fewer calls),
    negative when it costs more (e.g. recomputing a producer per consumer element).
    """
    return total_time(separate, spec) - estimate(fused, spec)


def flop_equivalents(work: KernelWork, spec: DeviceSpec) -> float:
    """Arithmetic work in flops, counting each transcendental at its cost in flops."""
    per_trans = spec.flops_per_s(True) / spec.transcendentals_per_s(True)
    return work.flops + work.transcendentals * per_trans


@dataclass(frozen=True)
class Decision:
    """The verdict on one candidate fusion, with the reason in words.

    ``take`` is whether to fuse; ``saved_s`` the SOL time saved (negative: lost);
    ``before_s``/``after_s`` the separate and fused estimates; ``bytes_saved`` the
    main-memory traffic removed; ``flops_ratio`` fused over separate arithmetic
    (in flop equivalents; above 1 means recomputation).
    """

    take: bool
    reason: str
    saved_s: float
    before_s: float = 0.0
    after_s: float = 0.0
    bytes_saved: float = 0.0
    flops_ratio: float = 1.0

    def __str__(self) -> str:
        return f"{'fuse' if self.take else 'keep apart'}: {self.reason}"


def format_time(seconds: float) -> str:
    """``0.0000123`` -> ``"12.3 us"``: one decimal, in ns/us/ms/s."""
    a = abs(seconds)
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if a >= scale:
            return f"{seconds / scale:.1f} {unit}"
    return f"{seconds / 1e-9:.1f} ns"


def format_bytes(n: float) -> str:
    """``134217728`` -> ``"128.0 MiB"``: one decimal, in B/KiB/MiB/GiB/TiB."""
    a = abs(n)
    for unit, scale in (("TiB", _GIB * 1024), ("GiB", _GIB), ("MiB", MIB), ("KiB", 1024)):
        if a >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def decide_merge(
    separate: Sequence[KernelWork],
    fused: KernelWork,
    spec: DeviceSpec,
    *,
    min_gain_s: float = 0.0,
    recompute_factor: float | None = None,
) -> Decision:
    """Whether fusing ``separate`` into ``fused`` pays, and why, by the SOL model.

    Takes the fusion when it saves more than ``min_gain_s`` seconds. The reason says
    what moved the estimate: traffic and launches saved
    (``"saves 128.0 MiB of traffic (12.1 ms -> 6.0 ms)"``), or what was lost
    (``"recompute of 4096x expands flops 3.2x, loses 1.1 ms (...)"``);
    ``recompute_factor`` is how many times the fused kernel recomputes each
    producer element, when the caller knows it.
    """
    if not separate:
        raise ValueError("decide_merge needs at least one separate kernel")
    before = total_time(separate, spec)
    after = estimate(fused, spec)
    saved = before - after
    bytes_saved = sum(w.bytes_moved for w in separate) - fused.bytes_moved
    launches_saved = sum(w.n_kernels for w in separate) - fused.n_kernels
    arith_before = sum(flop_equivalents(w, spec) for w in separate)
    arith_after = flop_equivalents(fused, spec)
    if arith_before > 0:
        ratio = arith_after / arith_before
    else:
        ratio = math.inf if arith_after > 0 else 1.0
    expands = ratio > 1.01
    times = f"({format_time(before)} -> {format_time(after)})"
    recompute = "recompute"
    if recompute_factor is not None:
        recompute = f"recompute of {recompute_factor:g}x"
    ratio_text = "from none" if math.isinf(ratio) else f"{ratio:.1f}x"

    take = saved > min_gain_s
    if take:
        parts = []
        if bytes_saved > 0:
            parts.append(f"{format_bytes(bytes_saved)} of traffic")
        if launches_saved > 0:
            parts.append(f"{launches_saved} kernel launch{'' if launches_saved == 1 else 'es'}")
        what = " and ".join(parts) if parts else format_time(saved)
        reason = f"saves {what} {times}"
        if expands:
            reason += f" despite {recompute} expanding flops {ratio_text}"
    else:
        loss = f"loses {format_time(-saved)}" if saved < 0 else "gains nothing"
        if saved >= 0 and min_gain_s > 0:
            reason = (
                f"gain of {format_time(saved)} is below the {format_time(min_gain_s)} "
                f"threshold {times}"
            )
        elif expands:
            reason = f"{recompute} expands flops {ratio_text}, {loss} {times}"
        elif bytes_saved < 0:
            reason = f"adds {format_bytes(-bytes_saved)} of traffic, {loss} {times}"
        elif not fused.parallel and any(w.parallel for w in separate):
            reason = f"fused kernel runs on one core, {loss} {times}"
        else:
            reason = f"fusing {loss} {times}"
    return Decision(
        take=take,
        reason=reason,
        saved_s=saved,
        before_s=before,
        after_s=after,
        bytes_saved=bytes_saved,
        flops_ratio=ratio,
    )
