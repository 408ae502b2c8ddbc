"""The tuning database: tuned schedules as data, keyed by kernel structure and device.

One JSON file (``geode.tune(..., db=path)`` writes it, ``geode.compile(...,
tuning_db=path)`` / ``GEODE_TUNING_DB`` reads it)::

    {"format": "geode-tuning-db", "version": 1,
     "devices": {"<device>": {"cpu": ..., "cores": ..., "threads": ..., "target": ...}},
     "entries": {"<kernel key>@<device>": {
         "kernel_key": ..., "device": ..., "status": "tuned" | "default",
         "trace": <a schedule trace, geode.codegen.schedule.trace_json>,
         "default_s": ..., "best_s": ..., "trials": ..., "knobs": {...},
         "geode": "0.1.0", "tuned_at": "2025-01-01T00:00:00Z"}}}

The kernel key (:func:`geode.codegen.kernel_key.kernel_key`) names the lowered
structure, the device (:func:`device_fingerprint`) the CPU (name, cores, the code
generator's target: triple, features, vector width) and the thread count the kernel
was timed with. An entry is ``tuned`` (its trace, recorded on the kernel's canonical
form, beat the default schedule) or ``default`` (the search found nothing better: the
kernel keeps its default schedule, and a rerun skips it).

Files are treated like the kernel cache's (:mod:`geode.safe_files`): read only if a
regular file of this user's that group and others cannot write (links followed: the
user names the file), written atomically. With ``cache_sign`` the file carries an HMAC
of its contents under the user's key (:mod:`geode.signing`) and one without a valid
signature is refused. A file that is not a tuning database, or of another version, is
refused with a :class:`~geode.errors.TuningError` (and never overwritten); an entry
that is malformed is dropped with a warning (the next tuning run measures that kernel
again and writes it back).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import stat
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import geode.signing as signing
from geode.codegen.schedule import Trace
from geode.codegen.schedule.trace_json import trace_from_data, trace_to_data
from geode.errors import TraceError, TuningError
from geode.safe_files import atomic_writer, make_dirs, read_file
from geode.version import __version__

log = logging.getLogger(__name__)

FORMAT = "geode-tuning-db"
VERSION = 1
#: the largest database read
MAX_DB_BYTES = 256 << 20
#: what an entry's ``status`` may be
STATUSES = ("tuned", "default")


class TuningDBWarning(UserWarning):
    """An entry of a tuning database was malformed and is not used."""


@dataclass
class TunedEntry:
    """What tuning found for one kernel on one device (see the module docstring)."""

    kernel_key: str
    device: str
    status: str
    trace: Trace
    default_s: float
    best_s: float
    trials: int
    knobs: dict[str, Any] = field(default_factory=dict)
    geode: str = __version__
    tuned_at: str = ""

    @property
    def speedup(self) -> float:
        """Default time over tuned time (1.0 for a kept default)."""
        return self.default_s / self.best_s if self.best_s > 0 else 1.0

    def to_data(self) -> dict[str, Any]:
        """The entry as JSON-ready data."""
        d = dataclasses.asdict(self)
        d["trace"] = trace_to_data(self.trace)
        return d


def entry_id(kernel_key: str, device: str) -> str:
    """The database key of a kernel on a device."""
    return f"{kernel_key}@{device}"


def _number(d: dict[str, Any], name: str, where: str) -> float:
    v = d.get(name)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
        raise TuningError(f"{where}: {name!r} must be a number >= 0, got {v!r}")
    return float(v)


def entry_from_data(d: Any, where: str) -> TunedEntry:
    """A :class:`TunedEntry` from its data; :class:`TuningError` naming ``where`` and
    the field when malformed."""
    if not isinstance(d, dict):
        raise TuningError(f"{where}: expected an object, got {type(d).__name__}")
    names = {f.name for f in dataclasses.fields(TunedEntry)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise TuningError(f"{where}: unknown fields {unknown}")
    for name in ("kernel_key", "device", "status", "geode", "tuned_at"):
        if not isinstance(d.get(name, ""), str):
            raise TuningError(f"{where}: {name!r} must be a string")
    if d.get("status") not in STATUSES:
        raise TuningError(f"{where}: status {d.get('status')!r} is not one of {STATUSES}")
    trials = d.get("trials")
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 0:
        raise TuningError(f"{where}: 'trials' must be an int >= 0, got {trials!r}")
    knobs = d.get("knobs", {})
    if not isinstance(knobs, dict):
        raise TuningError(f"{where}: 'knobs' must be an object")
    try:
        trace = trace_from_data(d.get("trace"), f"{where}: trace")
    except TraceError as exc:
        raise TuningError(str(exc)) from None
    return TunedEntry(
        kernel_key=d["kernel_key"],
        device=d["device"],
        status=d["status"],
        trace=trace,
        default_s=_number(d, "default_s", where),
        best_s=_number(d, "best_s", where),
        trials=trials,
        knobs=dict(knobs),
        geode=d.get("geode", ""),
        tuned_at=d.get("tuned_at", ""),
    )


@dataclass
class TuningDB:
    """A tuning database file, read (:meth:`open`) and written back (:meth:`save`)."""

    path: str
    entries: dict[str, TunedEntry] = field(default_factory=dict)
    devices: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: with ``cache_sign``: signed when saved, refused when read without a valid signature
    sign: bool = False
    #: ids of malformed entries dropped when the file was read
    dropped: list[str] = field(default_factory=list)
    #: sha256 of the bytes read ("" when the file did not exist)
    digest: str = ""

    @classmethod
    def open(cls, path: str | os.PathLike[str], sign: bool = False) -> TuningDB:
        """The database at ``path`` (empty when there is no file yet);
        :class:`TuningError` naming the file when it cannot be used."""
        p = os.path.abspath(os.fspath(path))
        db = cls(p, sign=sign)
        if not os.path.lexists(p):
            return db
        raw = read_file(p, MAX_DB_BYTES, private=True, follow_links=True)
        if raw is None:
            raise TuningError(f"tuning database {p!r}: {_refusal(p)}")
        db.digest = hashlib.sha256(raw).hexdigest()
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise TuningError(f"tuning database {p!r} is not valid JSON: {exc}") from None
        db._read(data)
        return db

    def _read(self, data: Any) -> None:
        where = f"tuning database {self.path!r}"
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise TuningError(f"{where} is not a geode tuning database")
        if data.get("version") != VERSION:
            raise TuningError(
                f"{where}: format version {data.get('version')!r}; this geode reads {VERSION}"
            )
        if self.sign:
            key = signing.signing_key()
            if key is None or not signing.verify(data, key):
                raise TuningError(f"{where}: no valid signature (cache_sign is on)")
        entries, devices = data.get("entries", {}), data.get("devices", {})
        if not isinstance(entries, dict) or not isinstance(devices, dict):
            raise TuningError(f"{where}: 'entries' and 'devices' must be objects")
        self.devices = {str(k): v for k, v in devices.items() if isinstance(v, dict)}
        for eid, d in entries.items():
            try:
                entry = entry_from_data(d, f"{where}: entry {eid!r}")
                if eid != entry_id(entry.kernel_key, entry.device):
                    raise TuningError(f"{where}: entry {eid!r} is filed under the wrong key")
            except TuningError as exc:
                warnings.warn(f"{exc}; dropped", TuningDBWarning, stacklevel=4)
                self.dropped.append(eid)
                continue
            self.entries[eid] = entry

    def get(self, kernel_key: str, device: str) -> TunedEntry | None:
        """The entry of ``kernel_key`` on ``device``, or None."""
        return self.entries.get(entry_id(kernel_key, device))

    def put(self, entry: TunedEntry, device_info: dict[str, Any] | None = None) -> None:
        """Add or replace an entry (stamped with the time when it has none)."""
        if not entry.tuned_at:
            entry.tuned_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.entries[entry_id(entry.kernel_key, entry.device)] = entry
        if device_info is not None:
            self.devices[entry.device] = dict(device_info)

    def to_data(self) -> dict[str, Any]:
        """The database as JSON-ready data (signed with ``sign``)."""
        data: dict[str, Any] = {
            "format": FORMAT,
            "version": VERSION,
            "devices": self.devices,
            "entries": {k: e.to_data() for k, e in sorted(self.entries.items())},
        }
        if self.sign:
            key = signing.signing_key()
            if key is None:
                raise TuningError(
                    f"tuning database {self.path!r}: cache_sign is on but there is no "
                    "usable signing key"
                )
            data[signing.FIELD] = signing.sign(data, key)
        return data

    def save(self) -> None:
        """Write the database atomically (the folder is made if missing); a file in its
        place that is not a tuning database is never replaced."""
        if os.path.lexists(self.path) and not self.digest:
            TuningDB.open(self.path, self.sign)  # raises unless it is one
        text = json.dumps(self.to_data(), indent=1, sort_keys=True)
        try:
            make_dirs(os.path.dirname(self.path))
            with atomic_writer(self.path, sync=True) as f:
                f.write(text.encode("utf-8"))
        except OSError as exc:
            raise TuningError(f"cannot write tuning database {self.path!r}: {exc}") from None
        self.digest = hashlib.sha256(text.encode("utf-8")).hexdigest()


def _refusal(path: str) -> str:
    """Why :func:`read_file` refused ``path``."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return f"cannot read it ({exc.strerror})"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_size > MAX_DB_BYTES:
        return f"larger than {MAX_DB_BYTES} bytes"
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return "owned by another user: refused"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return "writable by group or others: refused (chmod go-w it to use it)"
    return "cannot read it"


def db_digest(path: str | os.PathLike[str]) -> str:
    """A digest of the database at ``path`` for the model cache's key ("none" when
    there is no file, "unreadable" when it cannot be read)."""
    p = os.fspath(path)
    if not os.path.lexists(p):
        return "none"
    raw = read_file(p, MAX_DB_BYTES, private=True, follow_links=True)
    return "unreadable" if raw is None else hashlib.sha256(raw).hexdigest()


def device_info(threads: int) -> dict[str, Any]:
    """What a device fingerprint stands for: CPU name, cores, the target the code
    generator compiles for, and the thread count kernels are timed with."""
    from geode.codegen.backends.llvm.target import host
    from geode.costmodel.device import core_count, cpu_name

    return {
        "cpu": cpu_name(),
        "cores": core_count(),
        "target": host().fingerprint(),
        "threads": int(threads),
    }


def device_fingerprint(threads: int) -> str:
    """The device part of a database key (see :func:`device_info`)."""
    text = json.dumps(device_info(threads), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def effective_threads(num_threads: int) -> int:
    """The threads a kernel compiled with option ``num_threads`` runs on (0: the native
    pool's size)."""
    if num_threads > 0:
        return int(num_threads)
    from geode.runtime.native import get_num_threads

    return int(get_num_threads())
