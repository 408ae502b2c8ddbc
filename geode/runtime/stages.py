"""A model compiled stage by stage (GE's StagePartitioner at run time).

Each stage is a compiled model of its own. :meth:`StagedModel.run` runs them one after
another, each on the graph inputs and earlier stages' outputs it reads.
:meth:`StagedModel.pipeline` runs a list of micro-batches through them as a pipeline:
one thread per stage, queues between them, so stage ``k`` works on micro-batch ``i``
while stage ``k + 1`` works on micro-batch ``i - 1`` (native kernels and the BLAS run
without Python's lock); the results come back in order. A stage that fails stops the
pipeline and its error is raised.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from geode.errors import GeodeError, UnexpectedInputError
from geode.runtime.model import CompiledModel

__all__ = ["StageModel", "StagedModel"]


@dataclass
class StageModel:
    """One stage's compiled model, what it reads and hands on, and its compile time."""

    index: int
    model: CompiledModel
    inputs: list[str]
    outputs: list[str]
    compile_s: float = 0.0
    nodes: list[str] = field(default_factory=list)


_DONE = object()


class StagedModel(CompiledModel):
    """A graph compiled stage by stage; called like any model (the stages run in turn)
    or through :meth:`pipeline`. ``kernels`` are every stage's, in stage order."""

    def __init__(
        self,
        name: str,
        stages: list[StageModel],
        inputs: list[str],
        outputs: list[str],
        explain: Callable[[], str],
        stats: dict[str, Any] | None = None,
    ):
        first = stages[0].model
        kernels = [k for s in stages for k in s.model.kernels]
        super().__init__(first.plan, first.var_manager, kernels, explain, stats)
        self.name = name
        self.stages = stages
        self._inputs = inputs
        self._outputs = outputs

    @property
    def input_names(self) -> list[str]:
        """The graph's inputs, in order."""
        return list(self._inputs)

    @property
    def output_names(self) -> list[str]:
        """The graph's outputs, in order."""
        return list(self._outputs)

    @property
    def signature(self) -> str:
        """``(x, y) -> (z)``, with the stage count."""
        return f"({', '.join(self._inputs)}) -> ({', '.join(self._outputs)}) in {len(self.stages)} stages"

    def run(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Run every stage in turn on ``feeds``; returns the graph's outputs."""
        self._check(feeds)
        values = dict(feeds)
        for s in self.stages:
            values.update(self._run_stage(s, values))
        return {name: values[name] for name in self._outputs}

    def _run_stage(self, s: StageModel, values: Mapping[str, Any]) -> dict[str, np.ndarray]:
        # a graph input the caller left out: the first stage reading it names it
        return s.model.run({n: values[n] for n in s.inputs if n in values})

    def _check(self, feeds: Mapping[str, Any]) -> None:
        extra = sorted(set(feeds) - set(self._inputs), key=repr)
        if extra:
            raise UnexpectedInputError(
                f"model {self.name!r}: unexpected input(s) {extra}; inputs are {self._inputs}"
            )

    def pipeline(self, micro_batches: Sequence[Mapping[str, Any]]) -> list[dict[str, np.ndarray]]:
        """Run each feeds of ``micro_batches`` through the stages as a pipeline (one
        thread per stage); the outputs of each, in order."""
        batches = list(micro_batches)
        for feeds in batches:
            self._check(feeds)
        if not batches:
            return []
        links: list[queue.Queue] = [queue.Queue() for _ in range(len(self.stages) + 1)]
        failure: list[BaseException] = []
        stop = threading.Event()

        def work(k: int) -> None:
            s = self.stages[k]
            while True:
                item = links[k].get()
                if item is _DONE:
                    links[k + 1].put(_DONE)
                    return
                i, values = item
                if not stop.is_set():
                    try:
                        values = {**values, **self._run_stage(s, values)}
                    except BaseException as exc:  # noqa: BLE001 - handed to the caller
                        failure.append(exc)
                        stop.set()
                links[k + 1].put((i, values))

        threads = [
            threading.Thread(target=work, args=(k,), name=f"geode-stage-{k}", daemon=True)
            for k in range(len(self.stages))
        ]
        for t in threads:
            t.start()
        for i, feeds in enumerate(batches):
            links[0].put((i, dict(feeds)))
        links[0].put(_DONE)
        results: list[dict[str, np.ndarray] | None] = [None] * len(batches)
        while True:
            item = links[-1].get()
            if item is _DONE:
                break
            i, values = item
            if not failure:
                results[i] = {name: values[name] for name in self._outputs}
        for t in threads:
            t.join()
        if failure:
            raise failure[0]
        return results  # type: ignore[return-value]

    def save(
        self, path: str | os.PathLike, overwrite: bool = False, external_data: str = "embed"
    ) -> int:
        """Not supported: a model file holds one compiled graph (save a stage's model)."""
        raise GeodeError(
            f"model {self.name!r} runs in {len(self.stages)} stages: a model file holds one "
            "compiled graph; save model.stages[k].model"
        )

    def to_dot(self) -> str:
        """The first stage's picture (each stage's: ``model.stages[k].model.to_dot()``)."""
        return self.stages[0].model.to_dot()

    def __repr__(self) -> str:
        return f"StagedModel({self.name!r} {self.signature})"
