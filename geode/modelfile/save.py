"""Write a compiled model to a model file (see :mod:`geode.modelfile`)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from geode.codegen.images import ImageWriter
from geode.compiler.ir import Graph, ValueKind
from geode.errors import ModelFileError
from geode.modelfile import compat
from geode.modelfile.container import Writer
from geode.modelfile.graph_codec import encode_array, encode_graph
from geode.modelfile.units_codec import encode_units
from geode.modelfile.var_state import encode_state
from geode.plan_builder import Unit
from geode.runtime.model import CompiledModel

#: what ``external_data=`` may be
EXTERNAL_DATA = ("embed", "reference")


def save_model(
    model: CompiledModel,
    graph: Graph,
    units: list[Unit],
    explain: Callable[[], str],
    dot: Callable[[], str] | None,
    path: str | os.PathLike,
    overwrite: bool = False,
    external_data: str = "embed",
    snapshot: str = "current",
    max_bytes: int | None = None,
    sync: bool = True,
    bodies: bool = True,
) -> int:
    """Write ``model`` (compiled from ``graph`` into ``units``) to ``path``; returns the
    file's size. ``external_data``: ``"embed"`` copies constants read from external data
    files into the model file; ``"reference"`` keeps the file's path, offset, length and
    sha256 instead (loading checks them). Variables are saved with their current values.
    ``overwrite``: replace an existing file that is not a geode model file (one that is
    is always replaced). ``snapshot="initial"`` saves the variables' initial values
    instead (the model cache: a compile's result must not depend on earlier runs);
    ``max_bytes``: refuse (a :class:`ModelFileError`, nothing written) a file that would
    hold more tensor and code bytes. ``sync``: flush the file to the disk before it
    replaces ``path`` (off for the model cache's entries: a cache, whose entries a load
    checks against their digest). ``bodies``: an attention entry's key-tiled body not
    built yet is built now (through the compile's object cache when it has one), so the
    file carries it as object code and a loaded model runs no LLVM; off (the model
    cache's entries, written by a cold compile) it is kept as IR, compiled on its first
    long call after loading."""
    if external_data not in EXTERNAL_DATA:
        raise ModelFileError(
            f"external_data={external_data!r}: use one of {', '.join(EXTERNAL_DATA)}"
        )
    t0 = time.perf_counter()
    w = Writer()
    images = ImageWriter(lambda data: w.add(data), bodies)
    header: dict[str, Any] = {
        **compat.environment(),
        "name": graph.name,
        "graph": encode_graph(graph, w, constants=external_data == "embed"),
        "units": encode_units(units, w, images),
        "images": images.records,
        "chains": _chain_objects(model, w),
        "variables": _variables(model, graph, w, snapshot == "current"),
        "var_manager": encode_state(model),
        "memory": model.plan.memory_text,
        "explain": explain(),
        "dot": "" if dot is None else dot(),
        "compile_seconds": float(model.stats.get("timings", {}).get("total", 0.0)),
    }
    if max_bytes is not None and w.size > max_bytes:
        raise ModelFileError(
            f"model {graph.name!r}: {w.size} bytes of tensors and code, more than {max_bytes}"
        )
    size = w.write(path, header, overwrite, sync)
    model.stats["save_seconds"] = time.perf_counter() - t0
    return size


def _chain_objects(model: CompiledModel, w: Writer) -> list[dict[str, Any]]:
    """The object code of the model's chain entries (``codegen/backends/llvm/chain.py``),
    one record per module key: what a load links them from without LLVM."""
    records: dict[str, dict[str, Any]] = {}
    for step in model.plan.steps:
        entry = step.info.get("chain_entry")
        if entry is not None and entry.key not in records:
            records[entry.key] = {"key": entry.key, "object": w.add(entry.obj)}
    return list(records.values())


def _variables(
    model: CompiledModel, graph: Graph, w: Writer, current: bool
) -> list[dict[str, Any]]:
    """Each variable's description and a snapshot of its current value (or, without
    ``current``, of its initial value)."""
    from geode.compiler import dtypes

    out = []
    for v in graph.values.values():
        if v.kind is not ValueKind.VARIABLE:
            continue
        slot = next((s for s in model.plan.slots if s.name == v.name and s.var_key), None)
        if slot is None or not current:  # the initial value
            current = v.data
        else:
            current = model.var_manager.get(slot.var_key)
        out.append(
            {
                "name": v.name,
                "dtype": dtypes.name(v.dtype),
                "shape": [int(d) for d in v.shape],
                "format": v.desc.format,
                "snapshot": encode_array(current, w),
            }
        )
    return out
