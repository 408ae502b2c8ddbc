"""The incremental (JIT) compile option (GE's binary partition and execution points).

With ``incremental=True`` (``GEODE_INCREMENTAL=1``) a graph whose shapes depend on
values computed at run time compiles only its head: everything up to and including its
data-dependent ops (:func:`geode.compiler.partition.binary.binary_cut`). A call runs
the head, then the rest compiled for the shapes the head produced, every dim static;
compiled once per new shape and reused (:class:`~geode.runtime.incremental.
IncrementalModel`). A tail that holds data-dependent ops of its own is compiled
incrementally too. A graph without data-dependent ops compiles as usual.
"""

from __future__ import annotations

import time
from typing import Any

import geode.config as config
from geode.compiler.ir import Graph
from geode.compiler.partition.binary import binary_cut
from geode.compiler.partition.subgraph import with_input_shapes
from geode.errors import GeodeError
from geode.runtime.incremental import IncrementalModel
from geode.runtime.model import CompiledModel

__all__ = ["compile_incremental"]


def compile_incremental(session: Any, g: Graph, opts: config.Options) -> CompiledModel:
    """Compile ``g`` (a copy the session may change) in ``session`` (a
    :class:`geode.session.Session`, which calls this) for incremental runs: an
    :class:`IncrementalModel`, or a plain compiled model when ``g`` has no
    data-dependent op."""
    if opts.dynamic_dims:
        raise GeodeError(
            f"graph {g.name!r}: incremental and dynamic_dims (buckets) do not combine; choose one"
        )
    work = g.copy()
    work.infer_shapes()
    cut = binary_cut(work)
    if cut is None:
        return session.compile_with(g, opts)
    t0 = time.perf_counter()
    head = session.compile_with(cut.head, opts)
    head_s = time.perf_counter() - t0
    tail = cut.tail

    def compile_tail(shapes: dict[str, tuple[int, ...]]) -> CompiledModel:
        fixed = with_input_shapes(tail, shapes)
        fixed.name = f"{tail.name}@" + ",".join(
            "x".join(map(str, s)) or "scalar" for s in shapes.values()
        )
        return compile_incremental(session, fixed, opts)

    inputs = [v.name for v in g.inputs]
    outputs = [v.name for v in g.outputs]
    text = _Explain(g.name, cut.origins, cut.crossing, head_s)
    model = IncrementalModel(
        g.name, head, inputs, outputs, cut.tail_inputs, compile_tail, text, {"head_s": head_s}
    )
    text.model = model
    return model


class _Explain:
    """``explain()`` of an incremental model: the cut, the tails compiled so far, then
    the head's explanation."""

    def __init__(self, name: str, origins: list[str], crossing: list[str], head_s: float):
        self.name, self.origins, self.crossing, self.head_s = name, origins, crossing, head_s
        self.model: IncrementalModel | None = None

    def dot(self) -> str:
        """The head's picture."""
        assert self.model is not None
        return self.model.head.to_dot()

    def __call__(self) -> str:
        m = self.model
        assert m is not None
        lines = [
            f"model {self.name}: incremental (GE's binary partition)",
            f"  head: compiled once ({self.head_s * 1e3:.1f} ms), up to the data-dependent "
            f"op(s) {', '.join(self.origins)}",
            f"  tail: compiled per shape of {', '.join(m.tail_inputs)} "
            f"(crossing from the head: {', '.join(self.crossing)})",
            f"  tails compiled: {m.tail_compiles}, kept: {len(m.tails)}",
        ]
        for key, tail in list(m.tails.items()):
            shapes = ", ".join(f"{n}{list(s)}" for n, s in zip(m.tail_inputs, key))
            seconds = m.tail_seconds.get(key, 0.0)
            lines.append(
                f"    {shapes}: compile {seconds * 1e3:.1f} ms, {len(tail.kernels)} kernels"
            )
        lines.append("head:")
        lines.append("  " + m.head.explain().replace("\n", "\n  "))
        return "\n".join(lines)
