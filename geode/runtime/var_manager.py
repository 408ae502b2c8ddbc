"""Session-level storage for weights and variables, after Ascend GE's VarManager.

One :class:`VarManager` per session holds every constant, variable and file constant
the session's models use, in memory the manager owns. Each tensor is identified by a
:class:`VarKey` (name, format, dtype) and lives at a *logical address*
``logic_base + region start + offset`` that stays fixed for the life of the session, so
a compiled plan can refer to weights by address before any data is loaded.

Memory is carved out of regions: numpy ``uint8`` buffers of ``region_size`` bytes
(a tensor larger than a region gets a region of its own). Every tensor starts at an
``alignment``-aligned offset, both logically and physically. Region buffers are only
allocated when first touched.

Reuse, as in GE's ``AssignVarMem``:

* constants with identical contents (same dtype, shape and bytes) are stored once; the
  contents are hashed, then compared byte for byte before sharing;
* file constants are deduplicated by their ``source`` (file, offset) and loaded lazily,
  once, on the first :meth:`VarManager.get`;
* variables are mutable and never shared.

Variables have a storage *format* (:mod:`geode.runtime.var_format`): their data may be
kept in another layout than the user's (a weight stored transposed). :meth:`get` and
:meth:`assign` work on the stored layout; :meth:`get_value` and :meth:`set_value` on
the user's, converting. A variable may be *declared* without a value
(:meth:`declare_variable`): it is then not *initialized* (:meth:`is_initialized`) until
something assigns it, and reading it raises.

A name identifies one tensor in a session: registering a name again returns the same
key when the registration agrees with the first one and raises
:class:`VarManagerError` when it does not.

Every registration is a *hold* on the tensor, and :meth:`VarManager.release_keys` drops
holds: the session gives back a compiled model's holds when the model is collected, so
a constant no live model uses is forgotten, its storage freed once no other key shares
it, and a region's memory once none of its tensors is left (a process compiling model
after model in one session does not keep every model's weights). Variables are the
session's state (graphs write them, checkpoints save them): they stay until the
session closes.

:class:`VarManagerPool` maps session ids to managers for the whole process.
"""

from __future__ import annotations

import bisect
import contextlib
import enum
import hashlib
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from geode.errors import CheckpointError, GeodeError
from geode.runtime import var_format
from geode.runtime.var_checkpoint import VarEntry, describe

__all__ = [
    "VarInfo",
    "VarKey",
    "VarKind",
    "VarManager",
    "VarManagerError",
    "VarManagerPool",
]

_PHYSICAL_ALIGN = 64  # minimum alignment of region data pointers


class VarManagerError(GeodeError):
    """Bad use of a :class:`VarManager`: unknown key, conflicting registration,
    dtype/shape mismatch, writing a constant, a failing file-constant loader."""


@dataclass(frozen=True)
class VarKey:
    """GE-style identity of a session tensor: name, storage format and dtype name.

    ``dtype`` is the numpy name (``"float32"``, ``"int64"``, ``"bool"``).
    """

    name: str
    format: str
    dtype: str

    def __str__(self) -> str:
        return f"{self.name}[{self.format},{self.dtype}]"


class VarKind(enum.Enum):
    """What a session tensor is: an immutable constant, a mutable variable, or a
    constant whose data is loaded lazily from a file."""

    CONSTANT = "constant"
    VARIABLE = "variable"
    FILE_CONSTANT = "file_constant"


@dataclass(frozen=True)
class VarInfo:
    """A read-only description of one registered tensor (see :meth:`VarManager.info`)."""

    key: VarKey
    kind: VarKind
    shape: tuple[int, ...]
    address: int
    nbytes: int
    shared_with: tuple[VarKey, ...]
    loaded: bool
    source: tuple[str, int] | None
    #: False for a variable declared without a value and not assigned since
    initialized: bool = True
    #: the region holding it: its logical start (from ``logic_base``) and size in bytes
    region: tuple[int, int] = (0, 0)


def _round_up(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def _aligned_zeros(nbytes: int, alignment: int) -> np.ndarray:
    """A zeroed uint8 buffer of ``nbytes`` whose data pointer is ``alignment``-aligned."""
    raw = np.zeros(nbytes + alignment, dtype=np.uint8)
    shift = (-raw.ctypes.data) % alignment
    return raw[shift : shift + nbytes]


class _Region:
    """One contiguous piece of VarManager memory, bump-allocated.

    The buffer is zero-filled with ``np.zeros`` (calloc), so the OS only commits pages
    that are actually written.
    """

    __slots__ = ("start", "size", "used", "dedicated", "buffer", "live")

    def __init__(self, start: int, size: int, dedicated: bool, align: int):
        self.start = start  # logical offset from logic_base
        self.size = size
        self.used = 0
        self.dedicated = dedicated
        self.buffer = _aligned_zeros(size, align)
        self.live = 0  # blocks allocated here and not yet freed


class _Block:
    """The storage of one tensor; shared by several keys when deduplicated."""

    __slots__ = (
        "region",
        "offset",
        "reserved",
        "nbytes",
        "dtype",
        "shape",
        "owners",
        "loaded",
        "load_lock",
    )

    def __init__(
        self,
        region: _Region,
        offset: int,
        reserved: int,
        dtype: np.dtype,
        shape: tuple[int, ...],
    ):
        self.region = region
        self.offset = offset
        self.reserved = reserved
        self.dtype = dtype
        self.shape = shape
        self.nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        self.owners: list[VarKey] = []
        self.loaded = False
        self.load_lock = threading.Lock()

    @property
    def rel_address(self) -> int:
        return self.region.start + self.offset

    def raw(self) -> np.ndarray:
        buf = self.region.buffer
        return buf[self.offset : self.offset + self.nbytes]

    def array(self) -> np.ndarray:
        return np.ndarray(self.shape, self.dtype, buffer=self.region.buffer, offset=self.offset)


@dataclass
class _Entry:
    key: VarKey
    kind: VarKind
    block: _Block
    digest: bytes | None = None  # constants: content hash; variables: initial value hash
    loader: Callable[[], np.ndarray] | None = None
    source: tuple[str, int] | None = None
    declared: tuple[np.dtype, tuple[int, ...]] | None = field(default=None)
    initialized: bool = True  # variables: whether the variable has a value
    holds: int = 1  # registrations not yet released (see VarManager.release_keys)


def _as_dtype(dtype: object, what: str) -> np.dtype:
    try:
        dt = np.dtype(dtype)  # type: ignore[call-overload]
    except TypeError as exc:
        raise VarManagerError(f"{what}: {dtype!r} is not a numpy dtype") from exc
    if dt.hasobject:
        raise VarManagerError(f"{what}: dtype {dt} holds Python objects; cannot be stored")
    if not dt.isnative:
        dt = dt.newbyteorder("=")
    return dt


def _prepare(array: object, what: str) -> np.ndarray:
    """Host copy source: a C-contiguous, native-byte-order ndarray."""
    arr = np.asarray(array)
    dt = _as_dtype(arr.dtype, what)
    return arr.astype(dt, order="C", copy=False)


def _flat_bytes(arr: np.ndarray) -> np.ndarray:
    return arr.reshape(-1).view(np.uint8)


def _digest(arr: np.ndarray) -> bytes:
    return hashlib.blake2b(_flat_bytes(arr), digest_size=16).digest()


def _shape_tuple(shape: Sequence[int], what: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in shape)
    except TypeError as exc:
        raise VarManagerError(f"{what}: shape {shape!r} is not a sequence of ints") from exc
    if any(d < 0 for d in dims):
        raise VarManagerError(f"{what}: shape {dims} has a negative dim")
    return dims


class VarManager:
    """Storage for one session's constants, variables and file constants.

    Args:
        session_id: the owning session.
        region_size: bytes per memory region; larger tensors get their own region.
        logic_base: first logical address (GE's ``var_mem_logic_base``).
        alignment: every tensor starts at a multiple of this many bytes (a power of two).

    All registration and lookup methods are thread safe.
    """

    def __init__(
        self,
        session_id: int,
        region_size: int = 64 << 20,
        logic_base: int = 0x1000_0000_0000,
        alignment: int = 64,
    ):
        if alignment < 1 or alignment & (alignment - 1):
            raise VarManagerError(f"alignment must be a power of two, got {alignment}")
        if region_size < 1:
            raise VarManagerError(f"region_size must be positive, got {region_size}")
        if logic_base < 0 or logic_base % alignment:
            raise VarManagerError(
                f"logic_base {logic_base:#x} must be non-negative and a multiple of "
                f"alignment {alignment}"
            )
        self.session_id = session_id
        self.region_size = region_size
        self.logic_base = logic_base
        self.alignment = alignment
        self._lock = threading.RLock()
        self._regions: list[_Region] = []
        self._next_start = 0
        self._entries: dict[VarKey, _Entry] = {}
        self._names: dict[str, VarKey] = {}
        self._by_content: dict[tuple[str, tuple[int, ...], bytes], list[_Block]] = {}
        self._by_source: dict[tuple[str, int, str, tuple[int, ...]], _Block] = {}
        self._blocks: list[_Block] = []  # sorted by rel_address
        self._block_starts: list[int] = []
        self._released = False
        #: holds to drop (see release_keys) and how deep this thread is in _locked
        self._pending: list[tuple[VarKey, ...]] = []
        self._depth = 0
        self._last_drained = 0

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """The manager's lock; on the outermost acquisition, drop the holds released
        meanwhile (:meth:`release_keys` may run inside a locked section: a finalizer
        called by the garbage collector on any allocation only queues them)."""
        with self._lock:
            self._depth += 1
            try:
                if self._depth == 1 and self._pending:
                    self._drain()
                yield
            finally:
                self._depth -= 1

    # ------------------------------------------------------------------ allocation

    def _allocate(self, dtype: np.dtype, shape: tuple[int, ...]) -> _Block:
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        # Zero-size tensors still reserve one aligned slot so every key has its own address.
        reserved = _round_up(max(nbytes, 1), self.alignment)
        region = None
        if reserved > self.region_size:
            region = self._new_region(reserved, dedicated=True)
        else:
            for r in self._regions:
                if not r.dedicated and r.used + reserved <= r.size:
                    region = r
                    break
            if region is None:
                region = self._new_region(self.region_size, dedicated=False)
        block = _Block(region, region.used, reserved, dtype, shape)
        region.used += reserved
        region.live += 1
        idx = bisect.bisect(self._block_starts, block.rel_address)
        self._block_starts.insert(idx, block.rel_address)
        self._blocks.insert(idx, block)
        return block

    def _new_region(self, size: int, dedicated: bool) -> _Region:
        region = _Region(self._next_start, size, dedicated, max(self.alignment, _PHYSICAL_ALIGN))
        self._next_start += _round_up(size, self.alignment)
        self._regions.append(region)
        return region

    # ---------------------------------------------------------------- registration

    def _check_live(self) -> None:
        if self._released:
            raise VarManagerError(f"VarManager of session {self.session_id} has been released")

    def _existing(self, name: str, kind: VarKind, fmt: str, dtype: np.dtype) -> _Entry | None:
        key = self._names.get(name)
        if key is None:
            return None
        entry = self._entries[key]
        if entry.kind is not kind:
            raise VarManagerError(
                f"{name!r} is already registered as a {entry.kind.value}; "
                f"cannot register it again as a {kind.value}"
            )
        if key.format != fmt or key.dtype != dtype.name:
            raise VarManagerError(
                f"{name!r} is already registered as {key}; cannot register it again "
                f"with format {fmt!r} and dtype {dtype.name}"
            )
        return entry

    def _check_same_shape(self, entry: _Entry, shape: tuple[int, ...]) -> None:
        if entry.block.shape != shape:
            raise VarManagerError(
                f"{entry.key.name!r} is already registered with shape {entry.block.shape}; "
                f"cannot register it again with shape {shape}"
            )

    def _add(self, entry: _Entry) -> VarKey:
        self._entries[entry.key] = entry
        self._names[entry.key.name] = entry.key
        entry.block.owners.append(entry.key)
        return entry.key

    def register_constant(self, name: str, array: object, format: str = "ND") -> VarKey:
        """Copy ``array`` into session memory as an immutable constant; return its key.

        Constants with the same dtype, shape and bytes share one copy (and one logical
        address). Registering ``name`` again with identical data returns the same key;
        with different data (or dtype, shape, format) raises :class:`VarManagerError`.
        """
        what = f"constant {name!r}"
        arr = _prepare(array, what)
        digest = _digest(arr)
        with self._locked():
            self._check_live()
            entry = self._existing(name, VarKind.CONSTANT, format, arr.dtype)
            if entry is not None:
                self._check_same_shape(entry, arr.shape)
                if entry.digest != digest or not np.array_equal(
                    entry.block.raw(), _flat_bytes(arr)
                ):
                    raise VarManagerError(
                        f"constant {name!r} is already registered with different contents"
                    )
                entry.holds += 1
                return entry.key
            content_key = (arr.dtype.str, arr.shape, digest)
            block = None
            for candidate in self._by_content.get(content_key, ()):
                if np.array_equal(candidate.raw(), _flat_bytes(arr)):
                    block = candidate
                    break
            if block is None:
                block = self._allocate(arr.dtype, arr.shape)
                block.raw()[:] = _flat_bytes(arr)
                block.loaded = True
                self._by_content.setdefault(content_key, []).append(block)
            key = VarKey(name, format, arr.dtype.name)
            return self._add(_Entry(key, VarKind.CONSTANT, block, digest=digest))

    def register_variable(
        self, name: str, array: object, format: str = "ND", *, initial: bool = True
    ) -> VarKey:
        """Copy ``array`` (stored layout) into session memory as a mutable variable.

        With ``initial`` the array is the variable's *initial value*: registering
        ``name`` again with the same initial value returns the existing key and keeps
        the variable's *current* value (several graphs of a session share a variable);
        a different initial value, dtype, shape or format raises
        :class:`VarManagerError`. Without ``initial`` (a value restored from a
        checkpoint) the value is current but not initial: any later initial value of
        that name is accepted once, and the current value kept.

        A variable declared without a value (:meth:`declare_variable`) and not yet
        initialized takes ``array`` as its value.
        """
        what = f"variable {name!r}"
        arr = _prepare(array, what)
        digest = _digest(arr)
        var_format.storage_shape(arr.shape, format)  # the format fits the rank
        with self._locked():
            self._check_live()
            entry = self._existing(name, VarKind.VARIABLE, format, arr.dtype)
            if entry is not None:
                self._check_same_shape(entry, arr.shape)
                if not entry.initialized:
                    entry.block.raw()[:] = _flat_bytes(arr)
                    entry.initialized = True
                elif initial and entry.digest is not None and entry.digest != digest:
                    raise VarManagerError(
                        f"variable {name!r} is already registered with a different initial value"
                    )
                if initial and entry.digest is None:
                    entry.digest = digest
                entry.holds += 1
                return entry.key
            block = self._allocate(arr.dtype, arr.shape)
            block.raw()[:] = _flat_bytes(arr)
            block.loaded = True
            key = VarKey(name, format, arr.dtype.name)
            return self._add(
                _Entry(key, VarKind.VARIABLE, block, digest=digest if initial else None)
            )

    def declare_variable(
        self, name: str, dtype: object, shape: Sequence[int], format: str = "ND"
    ) -> VarKey:
        """Register a variable without a value (``shape``: its stored shape): it is not
        initialized until assigned (:meth:`assign`, :meth:`set_value`, a graph's write or
        a restored checkpoint); reading it before raises. Declaring a registered variable
        again checks dtype, shape and format and returns its key."""
        what = f"variable {name!r}"
        dt = _as_dtype(dtype, what)
        dims = _shape_tuple(shape, what)
        var_format.storage_shape(dims, format)
        with self._locked():
            self._check_live()
            entry = self._existing(name, VarKind.VARIABLE, format, dt)
            if entry is not None:
                self._check_same_shape(entry, dims)
                entry.holds += 1
                return entry.key
            block = self._allocate(dt, dims)
            block.loaded = True
            key = VarKey(name, format, dt.name)
            return self._add(_Entry(key, VarKind.VARIABLE, block, initialized=False))

    def register_file_constant(
        self,
        name: str,
        loader: Callable[[], np.ndarray],
        dtype: object,
        shape: Sequence[int],
        format: str = "ND",
        source: tuple[str, int] | None = None,
    ) -> VarKey:
        """Register a constant whose data ``loader()`` produces on the first :meth:`get`.

        The logical address is reserved now (size from ``dtype`` and ``shape``); the loader
        runs once, and its result must have exactly the declared dtype and shape. File
        constants with the same ``source`` (file, byte offset), dtype and shape share one
        copy and one load.
        """
        what = f"file constant {name!r}"
        if not callable(loader):
            raise VarManagerError(f"{what}: loader {loader!r} is not callable")
        dt = _as_dtype(dtype, what)
        dims = _shape_tuple(shape, what)
        if source is not None:
            try:
                path, offset = source
                source = (os.path.abspath(os.fspath(path)), int(offset))
            except (TypeError, ValueError) as exc:
                raise VarManagerError(
                    f"{what}: source must be (file, offset), got {source!r}"
                ) from exc
        with self._locked():
            self._check_live()
            entry = self._existing(name, VarKind.FILE_CONSTANT, format, dt)
            if entry is not None:
                self._check_same_shape(entry, dims)
                if entry.source != source:
                    raise VarManagerError(
                        f"file constant {name!r} is already registered from "
                        f"{_source_text(entry.source)}; cannot register it again from "
                        f"{_source_text(source)}"
                    )
                entry.holds += 1
                return entry.key
            block = None
            if source is not None:
                source_key = (source[0], source[1], dt.str, dims)
                block = self._by_source.get(source_key)
                if block is None:
                    block = self._allocate(dt, dims)
                    self._by_source[source_key] = block
            else:
                block = self._allocate(dt, dims)
            key = VarKey(name, format, dt.name)
            return self._add(
                _Entry(
                    key,
                    VarKind.FILE_CONSTANT,
                    block,
                    loader=loader,
                    source=source,
                    declared=(dt, dims),
                )
            )

    # --------------------------------------------------------------------- access

    def _entry(self, key: VarKey | str) -> _Entry:
        with self._locked():
            self._check_live()
            if isinstance(key, str):
                k = self._names.get(key)
                entry = self._entries.get(k) if k is not None else None
            else:
                entry = self._entries.get(key)
        if entry is None:
            raise VarManagerError(
                f"unknown variable/constant {str(key)!r} in session {self.session_id}"
            )
        return entry

    def _load(self, entry: _Entry) -> None:
        block = entry.block
        with block.load_lock:
            if block.loaded:
                return
            where = _source_text(entry.source)
            try:
                data = entry.loader()  # type: ignore[misc]
            except GeodeError:
                raise
            except Exception as exc:
                raise VarManagerError(
                    f"file constant {entry.key.name!r}: loading from {where} failed: {exc}"
                ) from exc
            arr = np.asarray(data)
            dt, dims = entry.declared  # type: ignore[misc]
            native = arr.dtype.newbyteorder("=") if arr.dtype.byteorder != "|" else arr.dtype
            if native != dt or arr.shape != dims:
                raise VarManagerError(
                    f"file constant {entry.key.name!r} loaded from {where}: expected "
                    f"dtype {dt.name} and shape {dims}, got dtype {arr.dtype} and "
                    f"shape {arr.shape}"
                )
            block.raw()[:] = _flat_bytes(arr.astype(dt, order="C", copy=False))
            block.loaded = True

    def get(self, key: VarKey | str) -> np.ndarray:
        """The tensor's data: a view into session memory with its registered dtype/shape.

        Writable for variables, read-only for constants. A file constant is loaded on the
        first call. ``key`` may also be a registered name.
        """
        entry = self._entry(key)
        if not entry.initialized:
            raise VarManagerError(
                f"variable {entry.key.name!r} is read before it has a value: it was declared "
                "without one; assign it in a graph, call session.set_variable, or restore "
                "a checkpoint first"
            )
        if not entry.block.loaded:
            self._load(entry)
        view = entry.block.array()
        if entry.kind is not VarKind.VARIABLE:
            view.flags.writeable = False
        return view

    def assign(self, key: VarKey | str, array: object) -> None:
        """Overwrite a variable's stored value; ``array`` must have its exact dtype and
        stored shape. The variable is initialized afterwards."""
        entry = self._writable(key)
        name = entry.key.name
        arr = np.asarray(array)
        block = entry.block
        if arr.dtype != block.dtype:
            raise VarManagerError(
                f"assign to variable {name!r}: expected dtype {block.dtype.name}, got {arr.dtype}"
            )
        if arr.shape != block.shape:
            raise VarManagerError(
                f"assign to variable {name!r}: expected shape {block.shape}, got {arr.shape}"
            )
        np.copyto(block.array(), arr)
        entry.initialized = True

    def _writable(self, key: VarKey | str) -> _Entry:
        entry = self._entry(key)
        if entry.kind is not VarKind.VARIABLE:
            raise VarManagerError(
                f"cannot assign to {entry.kind.value} {entry.key.name!r}: it is read-only"
            )
        return entry

    def user_shape(self, key: VarKey | str) -> tuple[int, ...]:
        """The tensor's shape in the user's layout (its stored shape converted back)."""
        entry = self._entry(key)
        return var_format.user_shape(entry.block.shape, entry.key.format)

    def get_value(self, key: VarKey | str) -> np.ndarray:
        """A copy of the tensor's value in the user's layout (converted back from its
        storage format)."""
        entry = self._entry(key)
        stored = self.get(entry.key)
        value = var_format.from_storage(stored, entry.key.format)
        return np.array(value, copy=True) if value is stored else value

    def set_value(self, key: VarKey | str, array: object) -> None:
        """Overwrite a variable from a value in the user's layout (exact dtype and user
        shape), converting it to its storage format."""
        entry = self._writable(key)
        name = entry.key.name
        arr = np.asarray(array)
        want = self.user_shape(entry.key)
        if arr.dtype != entry.block.dtype:
            raise VarManagerError(
                f"set variable {name!r}: expected dtype {entry.block.dtype.name}, got {arr.dtype}"
            )
        if arr.shape != want:
            raise VarManagerError(f"set variable {name!r}: expected shape {want}, got {arr.shape}")
        self.assign(entry.key, var_format.to_storage(arr, entry.key.format))

    def is_initialized(self, key: VarKey | str) -> bool:
        """Whether the tensor has a value: always for constants, for a variable unless it
        was declared without one and not assigned since."""
        return self._entry(key).initialized

    def variables(self) -> list[VarKey]:
        """The keys of every variable (not constants), in registration order."""
        with self._locked():
            return [k for k, e in self._entries.items() if e.kind is VarKind.VARIABLE]

    def snapshot(self) -> list[VarEntry]:
        """Every initialized variable as a checkpoint entry: name, dtype, stored shape,
        format and a copy of its stored data (see :mod:`geode.runtime.var_checkpoint`)."""
        with self._locked():
            self._check_live()
            return [
                VarEntry(k.name, e.block.dtype, e.block.shape, k.format, e.block.array().copy())
                for k, e in self._entries.items()
                if e.kind is VarKind.VARIABLE and e.initialized
            ]

    def restore(self, entries: Sequence[VarEntry], where: str = "checkpoint") -> list[str]:
        """Set variables from checkpoint entries; returns their names.

        A variable the session has must agree with its entry in dtype and user shape
        (the entry's stored data is converted when the storage formats differ); one it
        does not have is registered with the entry's format and value (not as an initial
        value: a graph declaring it later keeps the restored value). Every entry is
        checked before any variable changes: :class:`CheckpointError` names the first
        variable whose description differs, or that is a constant in this session.
        Variables the checkpoint does not hold keep their values.
        """
        plan: list[tuple[VarEntry, _Entry | None]] = []
        with self._locked():
            self._check_live()
            for e in entries:
                key = self._names.get(e.name)
                mine = self._entries[key] if key is not None else None
                if mine is not None:
                    self._check_restorable(e, mine, where)
                plan.append((e, mine))
            for e, mine in plan:
                if mine is None:
                    self.register_variable(e.name, e.data, e.format, initial=False)
                elif mine.key.format == e.format:
                    self.assign(mine.key, e.data)
                else:
                    self.set_value(mine.key, var_format.from_storage(e.data, e.format))
        return [e.name for e, _ in plan]

    def _check_restorable(self, e: VarEntry, mine: _Entry, where: str) -> None:
        if mine.kind is not VarKind.VARIABLE:
            raise CheckpointError(
                f"{where}: {e.name!r} is a {mine.kind.value} in session {self.session_id}, "
                "not a variable"
            )
        theirs = var_format.user_shape(e.shape, e.format)
        ours = var_format.user_shape(mine.block.shape, mine.key.format)
        if np.dtype(e.dtype) != mine.block.dtype or theirs != ours:
            raise CheckpointError(
                f"{where}: variable {e.name!r} differs: the checkpoint has "
                f"{describe(e.dtype, e.shape, e.format)} (user shape {list(theirs)}), the "
                f"session has {describe(mine.block.dtype, mine.block.shape, mine.key.format)} "
                f"(user shape {list(ours)})"
            )

    def logic_address(self, key: VarKey | str) -> int:
        """The tensor's logical address, ``logic_base + region start + offset``."""
        return self.logic_base + self._entry(key).block.rel_address

    def kind(self, key: VarKey | str) -> VarKind:
        """Whether ``key`` is a constant, a variable or a file constant."""
        return self._entry(key).kind

    def lookup(self, name: str) -> VarKey:
        """The key registered under ``name``."""
        return self._entry(name).key

    def info(self, key: VarKey | str) -> VarInfo:
        """Kind, shape, address, size, sharers and load state of one tensor."""
        entry = self._entry(key)
        with self._locked():
            block = entry.block
            return VarInfo(
                key=entry.key,
                kind=entry.kind,
                shape=block.shape,
                address=self.logic_base + block.rel_address,
                nbytes=block.nbytes,
                shared_with=tuple(k for k in block.owners if k != entry.key),
                loaded=block.loaded,
                source=entry.source,
                initialized=entry.initialized,
                region=(block.region.start, block.region.size),
            )

    def owners(self, address: int) -> list[VarKey]:
        """Keys whose storage contains logical ``address`` (empty when none does)."""
        with self._locked():
            block = self._block_at(address)
            return list(block.owners) if block is not None else []

    def memory_of(self, address: int) -> np.ndarray:
        """Debugging: the raw bytes (uint8, read-only) of the tensor holding ``address``,
        from ``address`` to the tensor's end. Raises when no tensor holds it."""
        with self._locked():
            self._check_live()
            block = self._block_at(address)
            if block is None:
                raise VarManagerError(
                    f"logical address {address:#x} is not inside any tensor of session "
                    f"{self.session_id}"
                )
            start = address - self.logic_base - block.rel_address
            view = block.raw()[start:]
        view.flags.writeable = False
        return view

    def _block_at(self, address: int) -> _Block | None:
        rel = address - self.logic_base
        idx = bisect.bisect_right(self._block_starts, rel) - 1
        if idx < 0:
            return None
        block = self._blocks[idx]
        if rel < block.rel_address + max(block.nbytes, 1):
            return block
        return None

    def keys(self) -> list[VarKey]:
        """All registered keys, in registration order."""
        with self._locked():
            return list(self._entries)

    def __contains__(self, key: object) -> bool:
        with self._locked():
            if isinstance(key, str):
                return key in self._names
            return key in self._entries

    def __len__(self) -> int:
        with self._locked():
            return len(self._entries)

    def __iter__(self) -> Iterator[VarKey]:
        return iter(self.keys())

    # -------------------------------------------------------------------- accounting

    @property
    def nbytes(self) -> int:
        """Bytes of tensor data held; storage shared by several keys counts once."""
        with self._locked():
            return sum(b.nbytes for b in self._blocks)

    @property
    def num_regions(self) -> int:
        """Number of memory regions created so far."""
        with self._locked():
            return len(self._regions)

    @property
    def dedup_saved_bytes(self) -> int:
        """Bytes not stored thanks to sharing (constant dedup and file-constant sources)."""
        with self._locked():
            return sum(b.nbytes * (len(b.owners) - 1) for b in self._blocks if b.owners)

    def describe(self) -> str:
        """A readable table of every tensor: key, kind, address, bytes, shared-with."""
        with self._locked():
            rows = [("key", "kind", "shape", "address", "bytes", "state", "shared-with")]
            for key, entry in self._entries.items():
                block = entry.block
                state = "loaded" if block.loaded else "pending"
                if not entry.initialized:
                    state = "uninitialized"
                rows.append(
                    (
                        str(key),
                        entry.kind.value,
                        str(block.shape),
                        f"{self.logic_base + block.rel_address:#x}",
                        str(block.nbytes),
                        state,
                        ", ".join(k.name for k in block.owners if k != key) or "-",
                    )
                )
            widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
            lines = [
                f"VarManager session={self.session_id} tensors={len(self._entries)} "
                f"regions={len(self._regions)} data={self.nbytes} B "
                f"dedup-saved={self.dedup_saved_bytes} B"
                + (" (released)" if self._released else "")
            ]
            for i, row in enumerate(rows):
                lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
                if i == 0:
                    lines.append("  ".join("-" * w for w in widths))
            return "\n".join(lines)

    def hold(self, key: VarKey) -> None:
        """Take one more hold on a registered ``key`` (as registering it again would)."""
        with self._locked():
            self._check_live()
            entry = self._entries.get(key)
            if entry is None:
                raise VarManagerError(f"unknown variable/constant {str(key)!r}")
            entry.holds += 1

    def release_keys(self, keys: Iterable[VarKey]) -> int:
        """Drop one hold on each of ``keys`` (one per time it appears); a tensor left
        without holds is forgotten (see the module docstring). Returns how many were
        forgotten now: 0 when called inside a locked section of this thread (a finalizer
        run by the garbage collector), whose holds are dropped on the next use. Unknown
        keys and a released manager are ignored."""
        self._pending.append(tuple(keys))
        with self._locked():
            return self._last_drained if self._depth == 1 else 0

    def _drain(self) -> None:
        """Drop the holds :meth:`release_keys` queued (called with the lock held)."""
        forgotten = 0
        while self._pending:
            keys = self._pending.pop()
            if self._released:
                continue
            for key in keys:
                entry = self._entries.get(key)
                if entry is None:
                    continue
                entry.holds -= 1
                if entry.holds > 0 or entry.kind is VarKind.VARIABLE:
                    continue  # variables are the session's state: kept until it closes
                del self._entries[key]
                if self._names.get(key.name) == key:
                    del self._names[key.name]
                entry.block.owners.remove(key)
                if not entry.block.owners:
                    self._free(entry.block, entry)
                forgotten += 1
        self._last_drained = forgotten

    def _free(self, block: _Block, entry: _Entry) -> None:
        """Forget a block no key owns; free its region when it was the region's last."""
        if entry.digest is not None and entry.kind is VarKind.CONSTANT:
            content_key = (block.dtype.str, block.shape, entry.digest)
            same = self._by_content.get(content_key, [])
            if block in same:
                same.remove(block)
            if not same:
                self._by_content.pop(content_key, None)
        for source_key, b in list(self._by_source.items()):
            if b is block:
                del self._by_source[source_key]
        idx = bisect.bisect_left(self._block_starts, block.rel_address)
        while idx < len(self._blocks) and self._blocks[idx] is not block:
            idx += 1
        if idx < len(self._blocks):
            del self._blocks[idx]
            del self._block_starts[idx]
        region = block.region
        region.live -= 1
        if block.offset + block.reserved == region.used:
            region.used = block.offset  # the bump pointer steps back over the last block
        if region.live == 0:
            self._regions.remove(region)  # its memory goes once no array views it

    def release(self) -> None:
        """Free every region. The manager is unusable afterwards; arrays handed out
        earlier stay valid (they keep their memory alive) but are no longer managed."""
        with self._locked():
            self._regions.clear()
            self._entries.clear()
            self._names.clear()
            self._by_content.clear()
            self._by_source.clear()
            self._blocks.clear()
            self._block_starts.clear()
            self._released = True

    @property
    def released(self) -> bool:
        """Whether :meth:`release` has been called."""
        return self._released

    def __repr__(self) -> str:
        return (
            f"VarManager(session_id={self.session_id}, tensors={len(self._entries)}, "
            f"nbytes={self.nbytes})"
        )


def _source_text(source: tuple[str, int] | None) -> str:
    if source is None:
        return "<loader without source file>"
    return f"file {source[0]!r} at offset {source[1]}"


class VarManagerPool:
    """Process-wide map from session id to that session's :class:`VarManager`."""

    _instance: VarManagerPool | None = None
    _instance_lock = threading.Lock()

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._managers: dict[int, VarManager] = {}

    @classmethod
    def instance(cls) -> VarManagerPool:
        """The process-wide pool."""
        if cls._instance is None:
            with cls._instance_lock:
                if cls._instance is None:
                    cls._instance = cls()
        return cls._instance

    def get(self, session_id: int, **options: int) -> VarManager:
        """The manager of ``session_id``, created on first use with ``options``
        (``region_size``, ``logic_base``, ``alignment``); options are ignored afterwards."""
        with self._lock:
            manager = self._managers.get(session_id)
            if manager is None:
                manager = VarManager(session_id, **options)
                self._managers[session_id] = manager
            return manager

    def destroy(self, session_id: int) -> bool:
        """Release and forget the manager of ``session_id``; False if there was none."""
        with self._lock:
            manager = self._managers.pop(session_id, None)
        if manager is None:
            return False
        manager.release()
        return True

    def sessions(self) -> list[int]:
        """Ids of the sessions that currently have a manager, sorted."""
        with self._lock:
            return sorted(self._managers)

    def __contains__(self, session_id: object) -> bool:
        with self._lock:
            return session_id in self._managers
