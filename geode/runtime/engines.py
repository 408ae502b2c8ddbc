"""Engines: how a step's kernel is called.

* ``aicore``: JIT-compiled native kernels; they write into the buffers they are given.
* ``aicpu``: reference kernels (numpy, ONNX semantics); results are copied into the
  planned buffer when there is one, so activations still follow the memory plan.
* ``host``: shape computations and data-dependent ops; their results are small or of
  unknown size, so they keep their own memory.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from geode.errors import ExecutionError
from geode.runtime.plan import Env, StepFn

ReferenceKernel = Callable[[list], Sequence[np.ndarray]]
NativeKernel = Callable[[list, list, Env], Sequence[np.ndarray]]


def _store(name: str, results: Sequence[np.ndarray], outs: list) -> list[np.ndarray]:
    stored = []
    for i, r in enumerate(results):
        buf = outs[i] if i < len(outs) else None
        r = np.asarray(r)
        if buf is None:
            stored.append(r)
            continue
        if buf.shape != r.shape or buf.dtype != r.dtype:
            raise ExecutionError(
                f"step {name!r} output {i}: kernel produced {r.dtype}{list(r.shape)}, "
                f"plan expects {buf.dtype}{list(buf.shape)}"
            )
        np.copyto(buf, r)
        stored.append(buf)
    return stored


class Engine:
    """Base engine: turns a kernel into a step function."""

    name = "engine"

    def bind(self, name: str, kernel: Callable) -> StepFn:  # pragma: no cover - interface
        """A step function ``fn(inputs, outs, env)`` for ``kernel``."""
        raise NotImplementedError


class AicpuEngine(Engine):
    """Runs reference kernels; copies results into planned buffers."""

    name = "aicpu"

    def bind(self, name: str, kernel: ReferenceKernel) -> StepFn:
        """Wrap a reference kernel ``kernel(inputs) -> outputs``."""

        def step(inputs: list, outs: list, env: Env) -> list[np.ndarray]:
            return _store(name, kernel(inputs), outs)

        return step


class HostEngine(AicpuEngine):
    """Runs shape and data-dependent ops on the host (same calling convention as AICPU)."""

    name = "host"


class AiCoreEngine(Engine):
    """Runs native kernels that write into the buffers they are handed."""

    name = "aicore"

    def bind(self, name: str, kernel: NativeKernel) -> StepFn:
        """Native kernels already have the step signature."""
        return kernel


ENGINES: dict[str, Engine] = {e.name: e for e in (AicpuEngine(), HostEngine(), AiCoreEngine())}
