"""How much memory a run may ask for, checked before anything is allocated.

A model with symbolic dims can be asked for an output or an intermediate far larger
than the machine's memory (an outer product of a long vector, a broadcast input of
10^9 elements). Allocating it would raise a bare ``MemoryError`` at best; with Linux's
overcommit the allocation succeeds and the process is killed by the kernel when the
pages are touched. So the executor adds up what a binding needs and compares it with a
limit first (:func:`check`), raising :class:`~geode.errors.OutOfMemoryError` that names
the largest value, its shape and the bytes asked for.

The limit (:func:`limit`) is the ``memory_limit_mb`` option (``GEODE_MEMORY_LIMIT_MB``)
when set, else the memory available now (:func:`available_bytes`): the smallest of the
kernel's estimate of memory available without swapping (``MemAvailable``), what the
process's control group still allows, and what ``RLIMIT_AS`` leaves of the address
space. Requests under :data:`CHECK_MIN_BYTES` are not checked (reading ``/proc`` would
cost more than allocating them).
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Sequence
from pathlib import Path

from geode.errors import OutOfMemoryError

__all__ = [
    "CHECK_MIN_BYTES",
    "available_bytes",
    "cgroup_left",
    "check",
    "format_bytes",
    "limit",
    "nbytes",
]

#: requests smaller than this are not checked
CHECK_MIN_BYTES = 64 << 20
#: a cgroup or rlimit at least this large means "no limit"
_UNLIMITED = 1 << 60


def format_bytes(n: int) -> str:
    """``n`` bytes in words: ``3.7 GiB (4000000000 bytes)``."""
    size, unit = float(n), "bytes"
    for u in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        if size < 1024:
            break
        size, unit = size / 1024, u
    return f"{n} bytes" if unit == "bytes" else f"{size:.1f} {unit} ({n} bytes)"


def nbytes(shape: Sequence[int], itemsize: int) -> int:
    """Bytes of an array of ``shape`` (exact, however large)."""
    return math.prod(int(d) for d in shape) * int(itemsize)


def _meminfo() -> int | None:
    with (
        contextlib.suppress(OSError, ValueError, IndexError),
        open("/proc/meminfo", encoding="ascii") as f,
    ):
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    with contextlib.suppress(OSError, ValueError, AttributeError):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return None


def _read_int(path: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        text = path.read_text(encoding="utf-8").strip()
        return None if text == "max" else int(text)
    return None


def cgroup_left(
    proc: str | os.PathLike[str] = "/proc/self/cgroup",
    root: str | os.PathLike[str] = "/sys/fs/cgroup",
) -> int | None:
    """What this process's memory control group (v2 or v1) still allows, if limited
    (``proc``: the process's cgroup list; ``root``: where cgroups are mounted)."""
    try:
        lines = Path(proc).read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    root = Path(root)
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, rel = parts
        if controllers == "":  # v2
            d, files = root / rel.lstrip("/"), ("memory.max", "memory.current")
        elif "memory" in controllers.split(","):  # v1
            d = root / "memory" / rel.lstrip("/")
            d = d if d.is_dir() else root / "memory"
            files = ("memory.limit_in_bytes", "memory.usage_in_bytes")
        else:
            continue
        cap, used = _read_int(d / files[0]), _read_int(d / files[1])
        if cap is not None and cap < _UNLIMITED and used is not None:
            return max(cap - used, 0)
    return None


def _address_space_left() -> int | None:
    """What ``RLIMIT_AS`` leaves of the address space, if it is set."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    except (ImportError, OSError, ValueError):
        return None
    if soft == resource.RLIM_INFINITY or soft >= _UNLIMITED:
        return None
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/self/status").read_text(encoding="utf-8").splitlines():
            if line.startswith("VmSize:"):
                return max(soft - int(line.split()[1]) * 1024, 0)
    return soft


def available_bytes() -> int | None:
    """The memory a run may use now (see the module docstring); None when unknown."""
    found = [v for v in (_meminfo(), cgroup_left(), _address_space_left()) if v is not None]
    return min(found) if found else None


def limit(setting: int = 0) -> int | None:
    """The limit for a run: ``setting`` bytes when positive (the ``memory_limit_mb``
    option), else :func:`available_bytes`; None when unknown (nothing is checked)."""
    return setting if setting > 0 else available_bytes()


def check(
    need: int,
    setting: int,
    what: str,
    largest: str = "",
    error: type[OutOfMemoryError] = OutOfMemoryError,
) -> None:
    """Raise ``error`` (an :class:`OutOfMemoryError`) if ``need`` bytes exceed the
    :func:`limit` for ``setting``. ``what`` says what needs them (``model 'm': this
    run``); ``largest`` names the largest value among them, with its shape and size."""
    if need < CHECK_MIN_BYTES:
        return
    cap = limit(setting)
    if cap is None or need <= cap:
        return
    source = (
        "memory_limit_mb (GEODE_MEMORY_LIMIT_MB)"
        if setting > 0
        else "available memory; memory_limit_mb (GEODE_MEMORY_LIMIT_MB) sets a limit"
    )
    largest = f"; the largest is {largest}" if largest else ""
    raise error(
        f"{what} needs {format_bytes(need)}, more than the {format_bytes(cap)} it may use "
        f"({source}){largest}"
    )
