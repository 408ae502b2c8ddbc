"""A bucketed model: one compiled variant per bucket of its dynamic dims, and a Case
that picks one per call (GE's multi-batch Case node).

The variants are compiled models of the same graph with the dynamic dims fixed to the
bucket's sizes (static dims in every kernel), plus the symbolic model (any size). A
call reads each dynamic dim's size from its inputs and runs:

* the bucket of exactly those sizes, when there is one;
* else, when each size lies below the dim's last bucket and padding is allowed for the
  dim (the graph keeps its rows apart, see ``geode/compiler/partition/multi_batch.py``),
  the next larger bucket: inputs padded along the dim by repeating their last row, the
  outputs' padded rows sliced off;
* else the symbolic model (sizes beyond the last bucket, padding refused, sizes of 0,
  inputs whose sizes disagree: the symbolic model's checks name the problem).

A bucket is never slower than the symbolic model for long: the first calls of each
size that a bucket serves alternate between the bucket (padding included) and the
symbolic model, a warm-up and :data:`TRIALS` timed calls each, and the faster of the
two (by its fastest call: preemption only adds time) serves the size from then on
(``BucketedModel.decisions``). An exact bucket
usually wins (its kernels have static dims); a bucket padded far up often loses.
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from geode.errors import GeodeError
from geode.runtime.model import CompiledModel

__all__ = ["SYMBOLIC", "TRIALS", "Bucket", "BucketedModel", "Choice", "Decision", "DynamicDim"]

#: timed calls of each variant (bucket, symbolic) before a size's variant is decided
TRIALS = 5


@dataclass
class DynamicDim:
    """A dynamic dim: its ``sizes`` (the buckets, increasing), the inputs' axes that are
    it (``sites``), the outputs' axis that is it (None: none), and whether a size
    between buckets may pad up (``refused``: why not, else empty)."""

    name: str
    sizes: tuple[int, ...]
    sites: tuple[tuple[str, int], ...]
    output_axes: Mapping[str, int | None]
    refused: str = ""

    @property
    def pads(self) -> bool:
        """Whether a size between buckets runs padded up to the next one."""
        return not self.refused


@dataclass
class Bucket:
    """One variant: the dims' sizes, its compiled model and what it cost to compile."""

    sizes: dict[str, int]
    model: CompiledModel
    compile_s: float = 0.0

    @property
    def label(self) -> str:
        """``batch=4``."""
        return ",".join(f"{k}={v}" for k, v in self.sizes.items())


class Choice:
    """What a call runs: a bucket (None: the symbolic model) and the sizes to pad up
    from, per dim (empty: the bucket fits exactly); ``label`` names it."""

    __slots__ = ("bucket", "label", "padded")

    def __init__(self, bucket: Bucket | None, padded: dict[str, int] | None = None):
        self.bucket = bucket
        self.padded = dict(padded or {})
        if bucket is None:
            self.label = "symbolic"
        elif not self.padded:
            self.label = bucket.label
        else:
            sizes = ",".join(f"{k}={v}" for k, v in self.padded.items())
            self.label = f"{bucket.label} (padded from {sizes})"

    def __repr__(self) -> str:
        return f"Choice({self.label})"


#: the symbolic model, as a choice
SYMBOLIC = Choice(None)


@dataclass
class Decision:
    """Which variant serves one size: the bucket's ``choice`` when its fastest timed
    call was not slower than the symbolic model's, else the symbolic model."""

    choice: Choice
    bucket_s: float
    symbolic_s: float
    winner: Choice = field(init=False)

    def __post_init__(self) -> None:
        self.winner = self.choice if self.bucket_s <= self.symbolic_s else SYMBOLIC

    def describe(self) -> str:
        """``batch=4 (padded from batch=3) 0.109 ms, symbolic 0.081 ms -> symbolic``."""
        return (
            f"{self.choice.label} {self.bucket_s * 1e3:.3f} ms, symbolic "
            f"{self.symbolic_s * 1e3:.3f} ms -> {self.winner.label}"
        )


class BucketedModel(CompiledModel):
    """A compiled model with a variant per bucket of its dynamic dims; calls run the
    variant their sizes pick (module docstring). ``kernels``, ``plan`` and ``to_dot``
    are the symbolic model's; ``buckets`` holds the variants; ``decisions`` the variant
    serving each size seen; ``runs`` counts what the calls ran (``Choice.label`` ->
    calls)."""

    def __init__(
        self,
        symbolic: CompiledModel,
        dims: list[DynamicDim],
        buckets: list[Bucket],
        explain: Callable[[], str],
        stats: dict[str, Any] | None = None,
    ):
        super().__init__(symbolic.plan, symbolic.var_manager, symbolic.kernels, explain, stats)
        self.symbolic = symbolic
        self.dims = dims
        self.buckets = buckets
        self._by_sizes = {tuple(b.sizes[d.name] for d in dims): b for b in buckets}
        self.runs: Counter[str] = Counter()
        #: per size served by a bucket (the dims' sizes), the variant that serves it
        self.decisions: dict[tuple[int, ...], Decision] = {}
        self._trials: dict[tuple[int, ...], tuple[list[float], list[float]]] = {}
        self._lock = threading.Lock()

    def sizes_of(self, feeds: Mapping[str, Any]) -> tuple[int, ...] | None:
        """The dynamic dims' sizes in ``feeds`` (None when an input is missing or lacks
        the axis, or two inputs disagree: the symbolic model names the problem)."""
        out = []
        for d in self.dims:
            n = None
            for name, axis in d.sites:
                shape = getattr(feeds.get(name), "shape", None)
                if shape is None or len(shape) <= axis or (n is not None and shape[axis] != n):
                    return None
                n = shape[axis]
            if n is None:
                return None
            out.append(int(n))
        return tuple(out)

    def choose(self, feeds: Mapping[str, Any]) -> Choice:
        """The bucket that can serve ``feeds`` (exactly or padded up), else the
        symbolic model (module docstring); which of the two serves is
        :meth:`run`'s decision."""
        sizes = self.sizes_of(feeds)
        return SYMBOLIC if sizes is None else self._choose(sizes)

    def _choose(self, sizes: tuple[int, ...]) -> Choice:
        key: list[int] = []
        padded: dict[str, int] = {}
        for d, n in zip(self.dims, sizes):
            i = bisect.bisect_left(d.sizes, n)
            if i == len(d.sizes):
                return SYMBOLIC
            if d.sizes[i] != n:
                if not d.pads or n == 0:
                    return SYMBOLIC
                padded[d.name] = n
            key.append(d.sizes[i])
        return Choice(self._by_sizes[tuple(key)], padded)

    def run(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Run ``feeds`` on the variant that serves their sizes (module docstring)."""
        sizes = self.sizes_of(feeds)
        if sizes is None:
            return self.run_variant(feeds, SYMBOLIC)
        decided = self.decisions.get(sizes)
        if decided is not None:
            return self.run_variant(feeds, decided.winner)
        choice = self._choose(sizes)
        if choice.bucket is None:
            return self.run_variant(feeds, choice)
        return self._trial(feeds, sizes, choice)

    def _trial(
        self, feeds: Mapping[str, Any], sizes: tuple[int, ...], choice: Choice
    ) -> dict[str, np.ndarray]:
        """One of the first calls of ``sizes``: the bucket and the symbolic model take
        turns, each first untimed (a first call at new sizes prepares its buffers), then
        :data:`TRIALS` times timed; the fastest call of each decides."""
        with self._lock:
            times = self._trials.setdefault(sizes, ([], []))
            on_bucket = len(times[0]) <= len(times[1])
        t0 = time.perf_counter()
        out = self.run_variant(feeds, choice if on_bucket else SYMBOLIC)
        seconds = time.perf_counter() - t0
        with self._lock:
            times[0 if on_bucket else 1].append(seconds)
            if min(len(times[0]), len(times[1])) > TRIALS and sizes not in self.decisions:
                # the first call of each is a warm-up
                self.decisions[sizes] = Decision(choice, min(times[0][1:]), min(times[1][1:]))
                self._trials.pop(sizes, None)
        return out

    def run_variant(self, feeds: Mapping[str, Any], choice: Choice) -> dict[str, np.ndarray]:
        """Run ``feeds`` on the variant ``choice`` names (from :meth:`choose`; the
        symbolic model for ``Choice(None)``), padding and cutting as it says."""
        self.runs[choice.label] += 1
        if choice.bucket is None:
            return self.symbolic.run(feeds)
        if not choice.padded:
            return choice.bucket.model.run(feeds)
        feeds = dict(feeds)
        for d in self.dims:
            if d.name in choice.padded:
                size = choice.bucket.sizes[d.name]
                for name, axis in d.sites:
                    feeds[name] = _pad(np.asarray(feeds[name]), axis, size)
        out = choice.bucket.model.run(feeds)
        for d in self.dims:
            n = choice.padded.get(d.name)
            if n is None:
                continue
            for name, axis in d.output_axes.items():
                if axis is not None:
                    out[name] = _cut(out[name], axis, n)
        return out

    def save(
        self, path: str | os.PathLike, overwrite: bool = False, external_data: str = "embed"
    ) -> int:
        """Not supported: a model file holds one compiled graph. Save ``symbolic`` or a
        bucket's ``model``."""
        raise GeodeError(
            f"model {self.plan.name!r} is bucketed ({len(self.buckets)} variants): a model "
            "file holds one compiled graph; save model.symbolic or model.buckets[i].model"
        )

    def __repr__(self) -> str:
        return (
            f"BucketedModel({self.plan.name!r} {self.signature}, "
            f"buckets {', '.join(b.label for b in self.buckets)})"
        )


def _pad(a: np.ndarray, axis: int, size: int) -> np.ndarray:
    """``a`` grown to ``size`` along ``axis`` by repeating its last row (the padded rows
    then hold values the model sees in real rows: no new NaN, no index out of range)."""
    n = a.shape[axis]
    out = np.empty(a.shape[:axis] + (size,) + a.shape[axis + 1 :], a.dtype)
    head = (slice(None),) * axis
    out[(*head, slice(0, n))] = a
    out[(*head, slice(n, size))] = a[(*head, slice(n - 1, n))]
    return out


def _cut(a: np.ndarray, axis: int, n: int) -> np.ndarray:
    """The first ``n`` rows of ``a`` along ``axis``: a view when that is contiguous (the
    leading axis), else a copy."""
    part = a[(slice(None),) * axis + (slice(0, n),)]
    return part if part.flags.c_contiguous else np.ascontiguousarray(part)
