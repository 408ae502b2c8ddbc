"""Cost models: pure functions of work, schedule features and a device spec.

Three levels, after Alibaba PAI's XLA work: :mod:`.sol` (speed of light: bytes and
flops against the device's peaks; cheap, used by the greedy fusion planner),
:mod:`.projected` (a fitted per-kernel model over a scheduled kernel's features, used
by the fusion plan search and by schedule searches) and :mod:`.profiling` (real
measurements, interleaved; ground truth that calibrates the others). :mod:`.device`
measures and caches the :class:`DeviceSpec` they divide by; :mod:`.store` keeps a
fitted projected model per device; :mod:`.stats` and :mod:`.accuracy` measure how
well each model ranks and predicts held-out kernels.

This package imports no other geode package (plain data in, numbers out), except its
two drivers: :mod:`.samples` (compiles and times generated kernels; layer session)
and :mod:`.report` (``python -m geode.costmodel.report``; layer cli), which nothing
in the package imports.
"""

from .device import DeviceSpec, calibrate, default_spec, load_or_calibrate
from .profiling import Sample, Timing, compare, measure, measure_interleaved
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
    "measure_interleaved",
]
