"""A kernel bench: scheduled candidates of one kernel compiled, run on fixed arguments,
checked against the default schedule's outputs and timed.

Times come from :func:`geode.costmodel.profiling.measure` (warm-up calls, batches long
enough for the timer, several samples, the garbage collector paused); the bench takes
their median. Every candidate runs with the thread count the compile options give
(``num_threads``; 0: the native pool's size), the one the tuned kernel will run with.
:meth:`KernelBench.confirm` times two candidates in interleaved rounds, so a change of
the machine's load during the search cannot make the chosen one look faster.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from geode.codegen.driver import emit_kernel, native_interface
from geode.codegen.lower import LoweredKernel
from geode.codegen.schedule import Schedule
from geode.config import Options
from geode.costmodel.profiling import measure
from geode.runtime.engines import AiCoreEngine

#: relative and absolute tolerances (the absolute one scaled by the output's largest
#: magnitude) within which a candidate's outputs must match the default's: schedules
#: may reassociate reductions (see geode.config.ACCURACY_POLICY), nothing else
TOLERANCES: dict[str, tuple[float, float]] = {
    "float16": (2e-2, 2e-3),
    "bfloat16": (5e-2, 1e-2),
    "float32": (2e-4, 2e-6),
    "float64": (1e-9, 1e-12),
}


@dataclass(frozen=True)
class Timing:
    """Seconds per call of a candidate (the median of the samples) and the samples."""

    seconds: float
    samples: tuple[float, ...]


class KernelBench:
    """Candidates of one lowered kernel (``lowered``, in the form their schedules were
    made on), run on ``inputs`` (one array per kernel input) with the dims of ``env``
    (symbol name -> size)."""

    def __init__(
        self,
        name: str,
        lowered: LoweredKernel,
        inputs: Sequence[np.ndarray],
        env: Mapping[str, int],
        opts: Options,
        repeat: int = 7,
        min_time: float = 2e-3,
        max_time: float = 1.0,
    ):
        self.name, self.lowered, self.opts = name, lowered, opts
        self.inputs = [np.ascontiguousarray(a) for a in inputs]
        self.env = dict(env)
        self.repeat, self.min_time, self.max_time = repeat, min_time, max_time

    def runner(self, sch: Schedule) -> Callable[[], list[np.ndarray]]:
        """Compile ``sch``'s kernel: a call runs it once on the bench's arguments into
        the same output arrays and returns them."""
        native = emit_kernel(sch.kernel, self.opts)
        iface = native_interface(self.name, self.lowered, sch.kernel, native, self.opts)
        step = AiCoreEngine().bind(self.name, iface)
        outs = [
            np.empty(tuple(shape(self.env)), dtype)
            for shape, dtype in zip(iface.out_shapes, iface.out_dtypes)
        ]
        inputs, env = self.inputs, self.env

        def run() -> list[np.ndarray]:
            return step(inputs, outs, env)

        return run

    def time(self, run: Callable[[], object]) -> Timing:
        """The median seconds per call of ``run`` (after two warm-up calls)."""
        t = measure(
            run, repeat=self.repeat, min_time=self.min_time, max_time=self.max_time, warmup=2
        )
        return Timing(t.median, t.samples)

    def confirm(
        self, a: Callable[[], object], b: Callable[[], object], rounds: int = 5
    ) -> tuple[float, float]:
        """Median seconds per call of ``a`` and ``b``, timed in ``rounds`` interleaved
        rounds."""
        ta: list[float] = []
        tb: list[float] = []
        for _ in range(rounds):
            ta.append(self.time(a).seconds)
            tb.append(self.time(b).seconds)
        return statistics.median(ta), statistics.median(tb)


def mismatch(got: Sequence[np.ndarray], want: Sequence[np.ndarray]) -> str | None:
    """Why ``got`` differs from ``want`` beyond the tolerances, or None when it does not."""
    for i, (g, w) in enumerate(zip(got, want)):
        if g.shape != w.shape or g.dtype != w.dtype:
            return f"output {i}: {g.dtype}{list(g.shape)}, expected {w.dtype}{list(w.shape)}"
        if w.dtype.kind not in "fc":
            if not np.array_equal(g, w):
                return f"output {i}: {int(np.sum(g != w))} elements differ"
            continue
        rtol, atol = TOLERANCES.get(str(w.dtype), TOLERANCES["float32"])
        finite = np.isfinite(w)
        scale = float(np.max(np.abs(w[finite]), initial=0.0))
        close = np.isclose(g, w, rtol=rtol, atol=atol * max(1.0, scale), equal_nan=True)
        if not close.all():
            bad = int(np.argmax(~close.ravel()))
            return (
                f"output {i}: {int(np.sum(~close))} elements differ, e.g. at flat index {bad}: "
                f"{g.ravel()[bad]!r} instead of {w.ravel()[bad]!r}"
            )
    return None
