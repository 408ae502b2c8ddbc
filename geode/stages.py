"""Compiling a graph whose nodes carry pipeline stages (GE's StagePartitioner).

A graph built with ``with g.stage(k): ...`` compiles into one model per stage
(:func:`geode.compiler.partition.stages.split_stages` cuts it, each stage graph goes
through the whole spine and the model cache), wrapped in a
:class:`~geode.runtime.stages.StagedModel`: called like any model, the stages run one
after another; ``model.pipeline(micro_batches)`` runs them as a pipeline, one thread
per stage. ``explain()`` lists the stages, what each reads and hands on, what each
cost, then each stage's own explanation.
"""

from __future__ import annotations

import time
from typing import Any

import geode.config as config
from geode.compiler.ir import Graph
from geode.compiler.partition.stages import split_stages
from geode.errors import GeodeError
from geode.runtime.stages import StagedModel, StageModel

__all__ = ["compile_stages"]


def compile_stages(session: Any, g: Graph, opts: config.Options) -> StagedModel:
    """Compile each stage of ``g`` (a copy the session may change) in ``session`` (a
    :class:`geode.session.Session`, which calls this); the staged model."""
    if opts.dynamic_dims:
        raise GeodeError(
            f"graph {g.name!r} has stages: compile it without dynamic_dims (buckets of a "
            "staged graph are not supported)"
        )
    t0 = time.perf_counter()
    stages = []
    for st in split_stages(g):
        t = time.perf_counter()
        model = session.compile_with(st.graph, opts)
        seconds = time.perf_counter() - t
        stages.append(StageModel(st.index, model, st.inputs, st.outputs, seconds, st.nodes))
    text = _Explain(g.name, stages)
    stats = {"timings": {"total": time.perf_counter() - t0}}
    inputs = [v.name for v in g.inputs]
    return StagedModel(g.name, stages, inputs, [v.name for v in g.outputs], text, stats)


class _Explain:
    """``explain()`` of a staged model."""

    def __init__(self, name: str, stages: list[StageModel]):
        self.name, self.stages = name, stages

    def dot(self) -> str:
        """The first stage's picture."""
        return self.stages[0].model.to_dot()

    def __call__(self) -> str:
        lines = [f"model {self.name}: {len(self.stages)} stages (GE's StagePartitioner)"]
        for s in self.stages:
            native = sum(k.engine == "aicore" for k in s.model.kernels)
            lines.append(
                f"  stage {s.index}: {len(s.nodes)} nodes, compile "
                f"{s.compile_s * 1e3:.1f} ms, {len(s.model.kernels)} kernels ({native} native)"
            )
            lines.append(f"    reads: {', '.join(s.inputs) or '-'}")
            lines.append(f"    hands on: {', '.join(s.outputs) or '-'}")
        for s in self.stages:
            lines.append(f"stage {s.index}:")
            lines.append("  " + s.model.explain().replace("\n", "\n  "))
        return "\n".join(lines)
