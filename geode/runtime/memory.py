"""Activation memory: a reuse plan by liveness, and the arena it is laid out in.

A plan step writes some buffers and reads others. Each activation buffer is a
:class:`BufferRequest`: a slot id, a size *function* of the shape binding (sizes may be
symbolic, e.g. ``lambda env: env["N"] * 512``) and its live range ``[first, last]`` in
step indices. :meth:`MemoryPlan.layout` evaluates the sizes for one concrete binding
and assigns offsets greedily, largest buffer first, each into the smallest gap (best
fit) left by the already placed buffers whose live ranges overlap its own. Buffers that
are live at the same time never overlap in memory; buffers with disjoint live ranges
may share bytes. Layouts are cached per binding (bounded LRU).

An *alias* (a view: a Reshape, Squeeze, contiguous Slice, ... of a buffer) requests no
bytes: it shares its root's. The plan builder extends the root's live range to the last
use of any of its aliases; the plan records ``aliases`` (alias slot -> root slot) so a
layout shows them.

An :class:`Arena` owns one growable, aligned ``uint8`` buffer and hands out typed views
at a layout's offsets.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from geode.errors import GeodeError

__all__ = [
    "Arena",
    "BufferRequest",
    "Layout",
    "MemoryPlan",
    "MemoryPlanError",
    "UnboundSymbolError",
    "describe",
]

_PHYSICAL_ALIGN = 64


class MemoryPlanError(GeodeError):
    """A bad buffer request, a size function that fails for a binding, or an arena
    view outside the arena."""


class UnboundSymbolError(MemoryPlanError, KeyError):
    """A size function needs a symbol the shape binding does not define.

    Also a ``KeyError``, so callers that treat a missing symbol as "size known only at
    run time" can catch it as such.
    """

    def __init__(self, message: str, symbol: str):
        super().__init__(message)
        self.symbol = symbol

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass
class BufferRequest:
    """One activation buffer: ``slot`` id, size function of the shape binding, and the
    inclusive live range ``[first, last]`` (written at step ``first``, last read at step
    ``last``). ``nbytes`` may also be a plain int."""

    slot: int
    nbytes: Callable[[Mapping[str, int]], int]
    first: int
    last: int


@dataclass
class Layout:
    """Offsets (bytes into the arena) and sizes of every slot for one shape binding.

    ``total`` is the arena size needed; ``peak_naive`` is what one buffer per slot with
    no reuse would take (sum of aligned sizes), so ``total <= peak_naive``.
    ``lifetimes`` maps slot to its ``(first, last)`` live range; ``aliases`` maps each
    alias slot to the slot whose bytes it shares (it has no offset of its own).
    """

    offsets: dict[int, int]
    sizes: dict[int, int]
    total: int
    peak_naive: int = 0
    lifetimes: dict[int, tuple[int, int]] = field(default_factory=dict)
    aliases: dict[int, int] = field(default_factory=dict)

    @property
    def saved_bytes(self) -> int:
        """Bytes saved by reuse: ``peak_naive - total``."""
        return self.peak_naive - self.total


def _round_up(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def _env_key(env: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted((str(k), int(v)) for k, v in env.items()))


class MemoryPlan:
    """Liveness-based buffer reuse for a fixed set of requests, evaluated per binding.

    Args:
        requests: the buffers; slots must be distinct and ``first <= last``.
        alignment: every offset is a multiple of this (a power of two).
        cache_size: how many layouts (distinct bindings) to keep, least recently used
            evicted first.
        aliases: alias slot -> the requested slot whose bytes it shares (no request of
            its own; the requests' live ranges already cover the aliases' uses).
    """

    def __init__(
        self,
        requests: list[BufferRequest],
        alignment: int = 64,
        cache_size: int = 16,
        aliases: Mapping[int, int] | None = None,
    ):
        if alignment < 1 or alignment & (alignment - 1):
            raise MemoryPlanError(f"alignment must be a power of two, got {alignment}")
        seen: set[int] = set()
        for r in requests:
            if r.slot in seen:
                raise MemoryPlanError(f"buffer slot {r.slot} is requested twice")
            seen.add(r.slot)
            if r.first > r.last:
                raise MemoryPlanError(
                    f"buffer slot {r.slot}: live range [{r.first}, {r.last}] is empty "
                    "(first after last)"
                )
        self.aliases = dict(aliases or {})
        for a, root in self.aliases.items():
            if a in seen or root not in seen:
                raise MemoryPlanError(
                    f"alias slot {a} of slot {root}: an alias requests no buffer and its "
                    "root must be a requested buffer"
                )
        self.requests = list(requests)
        self.alignment = alignment
        self.cache_size = max(1, cache_size)
        self._cache: OrderedDict[tuple[tuple[str, int], ...], Layout] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def sizes(self, env: Mapping[str, int]) -> dict[int, int]:
        """Each slot's size in bytes under the binding ``env``."""
        out: dict[int, int] = {}
        for r in self.requests:
            fn = r.nbytes
            try:
                value = fn(env) if callable(fn) else fn
            except (KeyError, NameError) as exc:
                symbol = str(getattr(exc, "name", None) or (exc.args[0] if exc.args else "?"))
                raise UnboundSymbolError(
                    f"buffer slot {r.slot}: size needs symbol {symbol!r}, which the "
                    f"shape binding {dict(env)} does not define",
                    symbol,
                ) from exc
            except Exception as exc:
                raise MemoryPlanError(
                    f"buffer slot {r.slot}: size function failed for binding {dict(env)}: {exc}"
                ) from exc
            try:
                size = int(value)  # type: ignore[arg-type]
            except (TypeError, ValueError) as exc:
                raise MemoryPlanError(
                    f"buffer slot {r.slot}: size {value!r} is not an integer"
                ) from exc
            if size != value or size < 0:
                raise MemoryPlanError(
                    f"buffer slot {r.slot}: size {value!r} is not a non-negative integer"
                )
            out[r.slot] = size
        return out

    def layout(self, env: Mapping[str, int]) -> Layout:
        """The layout for binding ``env`` (cached). Do not mutate the returned object."""
        key = _env_key(env)
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                self.hits += 1
                return cached
        result = self._compute(self.sizes(env))
        with self._lock:
            self.misses += 1
            self._cache[key] = result
            self._cache.move_to_end(key)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return result

    def cache_info(self) -> dict[str, int]:
        """Cache statistics: hits, misses, current size and capacity."""
        with self._lock:
            return {
                "hits": self.hits,
                "misses": self.misses,
                "size": len(self._cache),
                "capacity": self.cache_size,
            }

    def _compute(self, sizes: dict[int, int]) -> Layout:
        align = self.alignment
        reqs = sorted(self.requests, key=lambda r: (-sizes[r.slot], r.first, r.last, r.slot))
        offsets: dict[int, int] = {}
        # placed: (first, last, offset, end) of buffers already given memory
        placed: list[tuple[int, int, int, int]] = []
        total = 0
        naive = 0
        for r in reqs:
            size = _round_up(sizes[r.slot], align)
            naive += size
            if size == 0:
                offsets[r.slot] = 0
                continue
            busy = sorted((off, end) for (f, l, off, end) in placed if f <= r.last and r.first <= l)
            best_off = None
            best_gap = None
            cursor = 0
            for off, end in busy:
                gap = off - cursor
                if gap >= size and (best_gap is None or gap < best_gap):
                    best_off, best_gap = cursor, gap
                cursor = max(cursor, end)
            if best_off is None:
                best_off = cursor
            offsets[r.slot] = best_off
            placed.append((r.first, r.last, best_off, best_off + size))
            total = max(total, best_off + size)
        return Layout(
            offsets={r.slot: offsets[r.slot] for r in self.requests},
            sizes=dict(sizes),
            total=total,
            peak_naive=naive,
            lifetimes={r.slot: (r.first, r.last) for r in self.requests},
            aliases=dict(self.aliases),
        )

    def check(self, layout: Layout) -> None:
        """Raise :class:`MemoryPlanError` if two simultaneously live buffers overlap,
        an offset is misaligned, or a buffer ends past ``layout.total``."""
        reqs = [r for r in self.requests if layout.sizes[r.slot] > 0]
        for r in reqs:
            off = layout.offsets[r.slot]
            if off % self.alignment:
                raise MemoryPlanError(f"slot {r.slot}: offset {off} is not aligned")
            if off + layout.sizes[r.slot] > layout.total:
                raise MemoryPlanError(f"slot {r.slot}: ends past the arena total")
        for i, a in enumerate(reqs):
            a0 = layout.offsets[a.slot]
            a1 = a0 + layout.sizes[a.slot]
            for b in reqs[i + 1 :]:
                if a.first <= b.last and b.first <= a.last:
                    b0 = layout.offsets[b.slot]
                    b1 = b0 + layout.sizes[b.slot]
                    if a0 < b1 and b0 < a1:
                        raise MemoryPlanError(
                            f"slots {a.slot} and {b.slot} are live together but overlap "
                            f"in memory: [{a0}, {a1}) and [{b0}, {b1})"
                        )

    def describe(self, env: Mapping[str, int]) -> str:
        """:func:`describe` of the layout for ``env``."""
        return describe(self.layout(env))


class Arena:
    """One growable, aligned ``uint8`` buffer that activation views are cut from.

    :meth:`ensure` reallocates only when more bytes are needed; after a reallocation
    (``generation`` increases) views taken earlier point at the old buffer and must be
    taken again.
    """

    def __init__(self, alignment: int = 64):
        if alignment < 1 or alignment & (alignment - 1):
            raise MemoryPlanError(f"alignment must be a power of two, got {alignment}")
        self.alignment = max(alignment, _PHYSICAL_ALIGN)
        self.generation = 0
        self._buf = self._allocate(0)

    def _allocate(self, nbytes: int) -> np.ndarray:
        raw = np.empty(nbytes + self.alignment, dtype=np.uint8)
        shift = (-raw.ctypes.data) % self.alignment
        return raw[shift : shift + nbytes]

    @property
    def capacity(self) -> int:
        """Current size of the buffer in bytes."""
        return int(self._buf.size)

    @property
    def buffer(self) -> np.ndarray:
        """The whole current buffer (uint8)."""
        return self._buf

    def ensure(self, total: int) -> bool:
        """Make the buffer at least ``total`` bytes; True if it was reallocated.
        Contents are not preserved across a reallocation."""
        if total < 0:
            raise MemoryPlanError(f"arena size must be non-negative, got {total}")
        if total <= self._buf.size:
            return False
        self._buf = self._allocate(_round_up(total, self.alignment))
        self.generation += 1
        return True

    def view(self, offset: int, shape: Sequence[int], dtype: object) -> np.ndarray:
        """A writable, C-contiguous ndarray of ``shape``/``dtype`` at byte ``offset``."""
        dt = np.dtype(dtype)  # type: ignore[call-overload]
        dims = tuple(int(d) for d in shape)
        nbytes = math.prod(dims) * dt.itemsize
        if offset < 0 or offset + nbytes > self._buf.size:
            raise MemoryPlanError(
                f"arena view [{offset}, {offset + nbytes}) of {dims} {dt} does not fit the "
                f"arena of {self._buf.size} bytes"
            )
        if dt.alignment > 1 and offset % dt.alignment:
            raise MemoryPlanError(
                f"arena view at offset {offset} is misaligned for dtype {dt} (needs {dt.alignment})"
            )
        return np.ndarray(dims, dt, buffer=self._buf, offset=offset)

    def release(self) -> None:
        """Drop the buffer (capacity becomes 0)."""
        self._buf = self._allocate(0)
        self.generation += 1


def describe(layout: Layout) -> str:
    """A readable table of a layout: slot, live range, offset, end, bytes."""
    rows = [("slot", "live", "offset", "end", "bytes")]
    for slot in sorted(layout.offsets, key=lambda s: (layout.offsets[s], s)):
        off = layout.offsets[slot]
        size = layout.sizes[slot]
        live = layout.lifetimes.get(slot)
        rows.append(
            (
                str(slot),
                f"[{live[0]}, {live[1]}]" if live else "?",
                str(off),
                str(off + size),
                str(size),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    saved = layout.saved_bytes
    pct = 100.0 * saved / layout.peak_naive if layout.peak_naive else 0.0
    aliases = f", {len(layout.aliases)} aliases" if layout.aliases else ""
    lines = [
        f"memory plan: {len(layout.offsets)} buffers{aliases}, arena {layout.total} B, "
        f"without reuse {layout.peak_naive} B, saved {saved} B ({pct:.1f}%)"
    ]
    for i, row in enumerate(rows):
        lines.append("  ".join(c.rjust(w) for c, w in zip(row, widths)))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    for alias, root in sorted(layout.aliases.items()):
        lines.append(f"slot {alias}: alias of slot {root} (a view of its bytes, none of its own)")
    return "\n".join(lines)
