"""Read a model file back into a runnable model (see :mod:`geode.modelfile`).

Loading runs no compiler: the graph, the units and the kernels' images come from the
file; the object code is linked into the process as it is; the plan (slots, memory
plan, chains) is built from the units as a compile builds it, and checked against the
memory plan the file recorded.
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from typing import Any

import numpy as np

from geode.codegen.backends.llvm.compiled import cached_build
from geode.codegen.images import ImageLoader
from geode.compiler import dtypes
from geode.compiler.ir import Graph, Value, ValueKind
from geode.errors import GeodeError, ModelFileError
from geode.modelfile import compat, container
from geode.modelfile.graph_codec import decode_array, decode_graph
from geode.modelfile.units_codec import decode_units
from geode.modelfile.var_state import check_state, layout
from geode.plan_builder import NO_STEP, bind_units, build_plan, held_keys
from geode.runtime.model import CompiledModel
from geode.runtime.var_manager import VarManager


def load_model(
    path: str | os.PathLike,
    vm: VarManager,
    key_prefix: str,
    num_threads: int | None = None,
    object_cache: tuple[str, bool] | None = None,
) -> tuple[CompiledModel, Graph, list]:
    """The model in the file at ``path``, its constants and variables in ``vm`` (under
    ``key_prefix``), and its graph and units; ``num_threads`` overrides the thread count
    it was compiled with. ``object_cache``: ``(folder, signed)`` of the object cache that
    code compiled after loading (a key-tiled attention body) goes through (None: compiled
    in memory). Raises :class:`ModelFileError` for a file it cannot trust or run, naming
    what is wrong."""
    t0 = time.perf_counter()
    c = container.read(path)
    h = c.header
    compat.check(h, c.path)
    t_read = time.perf_counter()
    build = None if object_cache is None else cached_build(*object_cache)
    kernels = ImageLoader(h.get("images"), c.blob, c.path, build).load_all()
    t_link = time.perf_counter()
    g = decode_graph(h.get("graph"), c, _external_loader(c.path))
    snapshots = _variables(h.get("variables"), g, c)
    units = decode_units(h.get("units"), g, kernels, c, num_threads, vm)
    bind_units(units)
    shared = {name for name in snapshots if name in vm}
    try:
        plan = build_plan(g, units, vm, key_prefix, _chain_builder(h.get("chains"), c))
    except ModelFileError:
        raise
    except GeodeError as exc:
        raise ModelFileError(f"model file {c.path!r}: {exc}") from exc
    timings = {"read": t_read - t0, "link": t_link - t_read}
    infos = [u.info for u in units if u.engine not in NO_STEP]
    stats = {"timings": timings, "loaded_from": c.path, "tiled_bodies": _bodies(kernels)}
    text = _Text(c.path, str(h.get("explain", "")), str(h.get("dot", "")), stats)
    stats["compile_seconds"] = float(h.get("compile_seconds", 0.0))
    model = CompiledModel(plan, vm, infos, text, stats)
    try:
        if plan.memory_text != h.get("memory"):
            raise ModelFileError(
                f"model file {c.path!r}: the memory plan built from it differs from the one "
                "it recorded"
            )
        offsets = check_state(h.get("var_manager"), model, c.path)
        stats["var_offsets"] = model.stats["var_offsets"] = offsets
    except BaseException:
        vm.release_keys(held_keys(plan))  # the session keeps nothing of a refused file
        raise
    _restore(plan, vm, {k: a for k, a in snapshots.items() if k not in shared})
    t_end = time.perf_counter()
    timings.update(plan=t_end - t_link, total=t_end - t0)
    return model, g, units


def _bodies(kernels: list) -> tuple[int, int]:
    """How many attention entries' key-tiled bodies the file gave as object code (linked
    now) and as IR (compiled on their first long call)."""
    linked = sum(getattr(k, "linked", None) is not None for k in kernels)
    return linked, sum(getattr(k, "lazy", None) is not None for k in kernels)


def _chain_builder(records: Any, c: container.Container) -> Any:
    """What the plan's chains get their entries from: the object code the file packed
    (a chain whose module it lacks runs the loop; nothing is compiled), None with
    ``GEODE_CHAIN_ENTRY=0``. Raises ModelFileError for malformed records."""
    from geode.codegen.backends.llvm.chain import ChainBuilder, enabled

    records = [] if records is None else records
    if not isinstance(records, list):
        raise ModelFileError(f"model file {c.path!r}: bad chain records")
    packed: dict[str, bytes] = {}
    for rec in records:
        if not isinstance(rec, dict) or not isinstance(rec.get("key"), str):
            raise ModelFileError(f"model file {c.path!r}: bad chain record {rec!r}")
        packed[rec["key"]] = bytes(c.blob(rec.get("object")))
    return ChainBuilder(packed=packed, compile=False) if enabled() else None


class _Text:
    """``explain()`` and ``to_dot()`` of a loaded model: what the compile wrote, headed
    by where it came from."""

    def __init__(self, path: str, explain: str, dot: str, stats: dict[str, Any]):
        self.path, self.text, self._dot, self.stats = path, explain, dot, stats

    def __call__(self) -> str:
        ms = self.stats["timings"]["total"] * 1e3
        head = f"loaded from {self.path} in {ms:.1f} ms (no compiler run)"
        linked, ir = self.stats["tiled_bodies"]
        if linked or ir:
            head += f"; key-tiled bodies: {linked} linked from object code, {ir} kept as IR"
        return f"{head}; {layout(self.stats['var_offsets'])}\n{self.text}"

    def dot(self) -> str:
        """The DOT picture the compile drew."""
        return self._dot


def _variables(records: Any, g: Graph, c: container.Container) -> dict[str, np.ndarray]:
    """Each variable's snapshot, checked against its description and the graph's
    variable of that name."""
    if not isinstance(records, list):
        raise ModelFileError(f"model file {c.path!r}: bad variable table")
    graph_vars = {v.name: v for v in g.values.values() if v.kind is ValueKind.VARIABLE}
    out: dict[str, np.ndarray] = {}
    for r in records:
        if not isinstance(r, dict) or not isinstance(r.get("name"), str):
            raise ModelFileError(f"model file {c.path!r}: bad variable record")
        name = r["name"]
        v = graph_vars.get(name)
        if v is None:
            raise ModelFileError(f"model file {c.path!r}: variable {name!r} is not in its graph")
        want = _describe(v)
        got = (r.get("dtype"), r.get("shape"), r.get("format"))
        if got != want:
            raise ModelFileError(
                f"model file {c.path!r}: variable {name!r} is described as {_text(got)} but "
                f"the plan expects {_text(want)}"
            )
        snap = decode_array(r.get("snapshot"), c)
        if (dtypes.name(snap.dtype), list(snap.shape)) != (want[0], want[1]):
            raise ModelFileError(
                f"model file {c.path!r}: variable {name!r}: the snapshot is "
                f"{dtypes.name(snap.dtype)}{list(snap.shape)}, the plan expects {_text(want)}"
            )
        out[name] = snap
    if set(out) != set(graph_vars):
        missing = sorted(set(graph_vars) - set(out))
        raise ModelFileError(f"model file {c.path!r}: no record of variables {missing}")
    return out


def _describe(v: Value) -> tuple[str, list[int], str]:
    return dtypes.name(v.dtype), [int(d) for d in v.shape], v.desc.format


def _text(desc: tuple) -> str:
    dtype, shape, fmt = desc
    return f"{dtype}{shape} (format {fmt})"


def _restore(plan: Any, vm: VarManager, snapshots: dict[str, np.ndarray]) -> None:
    """Give each variable new to the session its snapshot (a variable the session
    already held, shared with another model, keeps its current value)."""
    for slot in plan.slots:
        if slot.role == "variable" and slot.var_key is not None and slot.name in snapshots:
            vm.assign(slot.var_key, snapshots[slot.name])


def _external_loader(label: str):
    """``(record, value) -> loader`` for a constant kept as a reference to an external
    data file: the loader reads the recorded bytes and checks their length and sha256."""

    def make(ext: Any, v: Value):
        if not isinstance(ext, dict):
            raise ModelFileError(f"model file {label!r}: bad external data record")
        path, offset, length, digest = (
            ext.get("path"),
            ext.get("offset"),
            ext.get("length"),
            ext.get("sha256"),
        )
        if not (
            isinstance(path, str)
            and isinstance(offset, int)
            and isinstance(length, int)
            and isinstance(digest, str)
            and offset >= 0
            and length >= 0
        ):
            raise ModelFileError(f"model file {label!r}: bad external data record for {v.name!r}")
        dtype, shape = v.dtype, tuple(int(d) for d in v.shape)

        def loader() -> np.ndarray:
            data = _read_range(path, offset, length, f"constant {v.name!r}")
            if hashlib.sha256(data).hexdigest() != digest:
                raise ModelFileError(
                    f"constant {v.name!r}: its external data in {path!r} changed since the "
                    "model file was written (sha256 differs)"
                )
            return np.frombuffer(data, dtype=dtype).reshape(shape).copy()

        return loader

    return make


def _read_range(path: str, offset: int, length: int, what: str) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise ModelFileError(
            f"{what}: cannot open its external data {path!r}: {exc.strerror}"
        ) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ModelFileError(f"{what}: its external data {path!r} is not a regular file")
        if st.st_size < offset + length:
            raise ModelFileError(
                f"{what}: its external data {path!r} is {st.st_size} bytes, shorter than "
                f"the {length} bytes at offset {offset} it needs"
            )
        data = os.pread(fd, length, offset)
    finally:
        os.close(fd)
    if len(data) != length:
        raise ModelFileError(f"{what}: short read from {path!r}")
    return data
