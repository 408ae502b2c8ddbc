"""Cost models: pure functions of work, schedule features and a device spec.

Three levels, after Alibaba PAI's XLA work: :mod:`.sol` (speed of light: bytes and
flops against the device's peaks; cheap, used by the fusion planner),
:mod:`.projected` (a fitted per-kernel model over schedule features, used to pick
schedules) and :mod:`.profiling` (real measurements; ground truth that calibrates
the others). :mod:`.device` measures and caches the :class:`DeviceSpec` they
divide by.

This package imports no other geode package; callers hand it plain data.
"""

from .device import DeviceSpec, calibrate, default_spec, load_or_calibrate
from .profiling import Sample, Timing, compare, measure
from .projected import ProjectedModel, ScheduleFeatures
from .sol import Decision, KernelWork, decide_merge, estimate, fusion_gain

__all__ = [
    "Decision",
    "DeviceSpec",
    "KernelWork",
    "ProjectedModel",
    "Sample",
    "ScheduleFeatures",
    "Timing",
    "calibrate",
    "compare",
    "decide_merge",
    "default_spec",
    "estimate",
    "fusion_gain",
    "load_or_calibrate",
    "measure",
]
