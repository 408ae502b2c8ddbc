"""Compiling a graph with bucketed dynamic dims (GE's multi-batch clone and Case).

``geode.compile(model, dynamic_dims={"batch": [1, 4, 16, 64]})`` (or ``--dynamic-dims
batch=1,4,16,64``) compiles:

* the symbolic graph, which runs any size;
* one clone per bucket (per combination of sizes, with several dims), the dims fixed
  in its input shapes (:func:`geode.compiler.partition.multi_batch.specialize`), so
  every kernel of it is specialized: its dims are constants in its code.

and returns a :class:`~geode.runtime.buckets.BucketedModel`, whose calls pick the
variant of their sizes, pad up to the next bucket when the graph keeps its rows apart
(:func:`~geode.compiler.partition.multi_batch.padding_blockers`, analysed on the graph
after its passes), else run the symbolic one. Each variant goes through the model
cache as any compile does. ``explain()`` lists the buckets, what each cost, and why
padding is refused when it is.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import geode.config as config
from geode.compiler.ir import Graph
from geode.compiler.partition.multi_batch import (
    dim_sites,
    output_axes,
    padding_blockers,
    specialize,
    unpaddable,
)
from geode.debug import Dumper, log
from geode.runtime.buckets import Bucket, BucketedModel, DynamicDim
from geode.runtime.model import CompiledModel

__all__ = ["compile_buckets"]


def compile_buckets(session: Any, g: Graph, opts: config.Options) -> BucketedModel:
    """Compile ``g`` (a copy the session may change) once per bucket of
    ``opts.dynamic_dims`` and once symbolically, in ``session`` (a
    :class:`geode.session.Session`, which calls this); the bucketed model."""
    base = opts.replace(dynamic_dims=())
    names = [name for name, _ in opts.dynamic_dims]
    sites = {name: dim_sites(g, name) for name in names}  # unknown names refused first
    analysed = _after_passes(session, g, base)
    dims = []
    for name, sizes in opts.dynamic_dims:
        problems = padding_blockers(analysed, name)
        dims.append(
            DynamicDim(
                name,
                sizes,
                tuple(sites[name]),
                output_axes(analysed, name),
                unpaddable(problems) if problems else "",
            )
        )
    t0 = time.perf_counter()
    symbolic = session.compile_with(g.copy(), base)
    symbolic_s = time.perf_counter() - t0
    buckets = []
    for combo in itertools.product(*(sizes for _, sizes in opts.dynamic_dims)):
        sizes = dict(zip(names, combo))
        t = time.perf_counter()
        model = session.compile_with(specialize(g, sizes), base)
        buckets.append(Bucket(sizes, model, time.perf_counter() - t))
        log.debug("bucket %s of %s compiled", buckets[-1].label, g.name)
    text = _Explain(symbolic, dims, buckets, symbolic_s)
    stats = {"timings": {"total": time.perf_counter() - t0, "symbolic": symbolic_s}}
    model = BucketedModel(symbolic, dims, buckets, text, stats)
    text.model = model
    return model


def _after_passes(session: Any, g: Graph, opts: config.Options) -> Graph:
    """A copy of ``g`` through the spine's first stages (verify, shapes, graph passes):
    the ops the compiled models run, for the padding analysis."""
    from geode.spine import Compilation, graph_passes, infer_shapes, verify

    c = Compilation(
        g.copy(), opts, Dumper(g.name, 0, None), session.var_manager, f"buckets:{g.name}"
    )
    for stage in (verify, infer_shapes, graph_passes):
        stage(c)
    return c.graph


class _Explain:
    """``explain()`` of a bucketed model: the buckets and their costs, then the
    symbolic model's explanation; ``dot()`` is the symbolic model's picture."""

    def __init__(
        self,
        symbolic: CompiledModel,
        dims: list[DynamicDim],
        buckets: list[Bucket],
        symbolic_s: float,
    ):
        self.symbolic, self.dims, self.buckets, self.symbolic_s = (
            symbolic,
            dims,
            buckets,
            symbolic_s,
        )
        self.model: BucketedModel | None = None  # set once the model exists

    def dot(self) -> str:
        """The symbolic model's DOT picture."""
        return self.symbolic.to_dot()

    def __call__(self) -> str:
        lines = ["buckets (a Case picks the variant of each call's sizes):"]
        for d in self.dims:
            where = ", ".join(f"{name} dim {axis}" for name, axis in d.sites)
            sizes = ", ".join(map(str, d.sizes))
            lines.append(f"  dim {d.name}: {sizes} ({where})")
            if d.pads:
                lines.append(
                    "    between buckets: padded up to the next bucket (last row repeated, "
                    "padded rows sliced off the outputs)"
                )
            else:
                lines.append(
                    f"    between buckets: the symbolic model; padding refused: {d.refused}"
                )
            lines.append(f"    beyond {d.sizes[-1]}: the symbolic model")
        for b in [*self.buckets, None]:
            model = self.symbolic if b is None else b.model
            label = "symbolic" if b is None else f"bucket {b.label}"
            seconds = self.symbolic_s if b is None else b.compile_s
            native = sum(k.engine == "aicore" for k in model.kernels)
            cached = " (from the model cache)" if "model_cache" in model.stats else ""
            lines.append(
                f"  {label}: compile {seconds * 1e3:.1f} ms{cached}, "
                f"{len(model.kernels)} kernels ({native} native)"
            )
        if self.model is not None and self.model.decisions:
            lines.append("  sizes served so far (timed against the symbolic model):")
            for key, dec in sorted(self.model.decisions.items()):
                sizes = ",".join(f"{d.name}={n}" for d, n in zip(self.dims, key))
                lines.append(f"    {sizes}: {dec.describe()}")
        lines.append("symbolic model (every size):")
        lines.append(self.symbolic.explain())
        return "\n".join(lines)
