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

import importlib
from typing import Any

#: the package's names, by the module they come from: imported on first use (a warm
#: start needs only :mod:`.device`, and the others cost milliseconds to import)
_EXPORTS = {
    "device": ("DeviceSpec", "calibrate", "default_spec", "load_or_calibrate"),
    "profiling": ("Sample", "Timing", "compare", "measure", "measure_interleaved"),
    "projected": ("ProjectedModel", "ScheduleFeatures"),
    "sol": ("Decision", "KernelWork", "decide_merge", "estimate", "fusion_gain"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'geode.costmodel' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


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
