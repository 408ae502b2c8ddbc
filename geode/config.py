"""Compile options and ``GEODE_*`` environment flags, in one place.

Every option has a default, may be set by an environment variable, and may be
overridden per call: ``geode.compile(g, fusion=False, debug=2)``.

========================  ======================  =========================================
option                    environment             meaning
========================  ======================  =========================================
debug                     GEODE_DEBUG             0 quiet .. 4 everything (see dumps)
dump_dir                  GEODE_DUMP_DIR          write every stage's text to this folder
cache_dir                 GEODE_CACHE_DIR         on-disk kernel cache (default ~/.cache/geode)
cache_max_mb              GEODE_CACHE_MAX_MB      the kernel cache is kept under this many MiB:
                                                  least recently used entries are evicted
                                                  (checked at most hourly; 0: no limit)
cache_sign                GEODE_CACHE_SIGN        sign each kernel cache entry with this
                                                  user's secret key (HMAC, see
                                                  geode.signing) and ignore (rebuild)
                                                  entries without a valid signature (the
                                                  numba backend's cache, whose entries
                                                  are pickles, is always signed)
memory_limit_mb           GEODE_MEMORY_LIMIT_MB   a run whose buffers would need more than
                                                  this many MiB raises a GeodeError before
                                                  allocating (0: the memory available at
                                                  the time, see geode.runtime.memlimit)
fusion                    GEODE_FUSION            fuse Trivial/Reduce ops into groups
codegen                   GEODE_CODEGEN           compile groups to native AI Core kernels
fastmath                  GEODE_FASTMATH          allow reassociation (see ACCURACY_POLICY)
num_threads               GEODE_NUM_THREADS       threads for parallel kernels (0: all cores)
disabled_passes           GEODE_DISABLE_PASSES    comma-separated pass names to skip
const_fold_limit          GEODE_CONST_FOLD_LIMIT  folded constants may be this large (or as
                                                  large as the inputs they replace)
freeze_variables          GEODE_FREEZE_VARIABLES  treat variables no op writes as constants
progress                  GEODE_PROGRESS          progress bars: auto (tty only), 1, 0
streaming                 GEODE_STREAMING         streaming (non-temporal) stores for the
                                                  outputs of cheap kernels: auto (outputs
                                                  of at least the last-level cache size),
                                                  off, or a minimum output size in bytes
lazy_compile              GEODE_LAZY_COMPILE      (numba backend) a kernel with streaming
                                                  stores compiles its plain loop (small or
                                                  misaligned outputs) on the first call that
                                                  needs it; 0: in geode.compile
backend                   GEODE_BACKEND           the native code generator: llvm (default:
                                                  LLVM IR through llvmlite, no numba) or
                                                  numba (the previous backend)
dense_epilogues           GEODE_DENSE_EPILOGUES   fuse the group that consumes a native
                                                  MatMul's product into it (run per panel
                                                  of rows while the panel is in cache)
model_cache               GEODE_MODEL_CACHE       keep each compiled model in the cache
                                                  folder; compiling the same graph with the
                                                  same options again loads it (no pipeline
                                                  stage runs; see geode.modelfile.cache)
========================  ======================  =========================================

``dump_dir`` and ``cache_dir`` take a ``str`` or ``os.PathLike`` path (anything else is
an :class:`OptionError`); see :mod:`geode.debug` for the files a dump folder may hold.

Process-wide flags that are not options:

- ``GEODE_VECTOR_WIDTH`` = auto (default; 512-bit vectors on AVX-512 hosts), 256 or 512
  (numba builds its CPU target once per process); see :mod:`geode.codegen.backends.target`.
- ``GEODE_BLAS_POOL`` = 1 (default) or 0: whether OpenBLAS's threads run on geode's native
  pool once a model uses the BLAS (numpy's own matmul included: one pool, one thread
  count); see :func:`geode.codegen.backends.llvm.library.share_pool`.
- ``GEODE_NUM_THREADS`` and ``GEODE_SPIN_US`` also size the native pool and its workers'
  spin before they sleep (:mod:`geode.runtime.native`).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from geode.errors import GeodeError

#: How floating-point accuracy is traded for speed, stated once for every kernel.
ACCURACY_POLICY = """\
fastmath=False (default): kernels may reassociate floating-point arithmetic and contract
  multiply-adds into FMAs (LLVM flags 'reassoc', 'contract'), which is what lets reductions
  vectorize and run in parallel. Division is IEEE division: only a divisor whose reciprocal
  is finite and normal (a constant such as 3.0, an integer such as a mean's count) may
  become a multiply with its reciprocal ('arcp', within an ulp); any other divisor may be
  subnormal, and 1/d would overflow to inf. NaN and Inf keep IEEE semantics
  (no 'nnan'/'ninf'), transcendentals use geode's vectorized implementations (a few
  ulp), and a max/min reduction may return either zero when +0 and -0 tie (NaN still
  propagates). Results match the reference within the tests' tolerance policy.
fastmath=True: every fast-math flag ('nnan', 'ninf', 'nsz', 'arcp', 'contract', 'afn',
  'reassoc'); NaN/Inf inputs give unspecified results.
"""


class OptionError(GeodeError):
    """An unknown option or an option value of the wrong kind."""


def _default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(base) / "geode")


@dataclass
class Options:
    """All compile options; see the module docstring for meanings and env flags."""

    debug: int = 0
    dump_dir: str | None = None
    cache_dir: str = field(default_factory=_default_cache_dir)
    cache_max_mb: int = 2048
    cache_sign: bool = False
    memory_limit_mb: int = 0
    fusion: bool = True
    codegen: bool = True
    fastmath: bool = False
    num_threads: int = 0
    disabled_passes: tuple[str, ...] = ()
    const_fold_limit: int = 64 << 10
    freeze_variables: bool = False
    progress: str = "auto"
    streaming: str = "auto"
    lazy_compile: bool = True
    backend: str = "llvm"
    dense_epilogues: bool = True
    model_cache: bool = True

    @classmethod
    def from_env(cls, **overrides: Any) -> Options:
        """Defaults, then GEODE_* environment variables, then ``overrides``."""
        opts = cls()
        env = {
            "debug": "GEODE_DEBUG",
            "dump_dir": "GEODE_DUMP_DIR",
            "cache_dir": "GEODE_CACHE_DIR",
            "cache_max_mb": "GEODE_CACHE_MAX_MB",
            "cache_sign": "GEODE_CACHE_SIGN",
            "memory_limit_mb": "GEODE_MEMORY_LIMIT_MB",
            "fusion": "GEODE_FUSION",
            "codegen": "GEODE_CODEGEN",
            "fastmath": "GEODE_FASTMATH",
            "num_threads": "GEODE_NUM_THREADS",
            "disabled_passes": "GEODE_DISABLE_PASSES",
            "const_fold_limit": "GEODE_CONST_FOLD_LIMIT",
            "freeze_variables": "GEODE_FREEZE_VARIABLES",
            "progress": "GEODE_PROGRESS",
            "streaming": "GEODE_STREAMING",
            "lazy_compile": "GEODE_LAZY_COMPILE",
            "backend": "GEODE_BACKEND",
            "dense_epilogues": "GEODE_DENSE_EPILOGUES",
            "model_cache": "GEODE_MODEL_CACHE",
        }
        for name, var in env.items():
            raw = os.environ.get(var)
            if raw is not None and raw != "":
                value = _parse(name, raw, var)
                _check_value(name, value, var)
                setattr(opts, name, value)
        return opts.replace(**overrides)

    def replace(self, **overrides: Any) -> Options:
        """A copy with some options changed; OptionError on unknown names or bad kinds."""
        known = {f.name: f for f in dataclasses.fields(self)}
        for k, v in overrides.items():
            if k not in known:
                raise OptionError(f"unknown option {k!r}; known options: {sorted(known)}")
            if k in _PATH_OPTIONS:
                overrides[k] = check_path_option(k, v)
            elif isinstance(v, str) and k not in ("progress", "streaming", "backend"):
                overrides[k] = _parse(k, v, k)
            if k == "disabled_passes" and isinstance(v, (list, set)):
                overrides[k] = tuple(v)
            _check_value(k, overrides[k])
        return dataclasses.replace(self, **overrides)


#: int options and the smallest value each accepts
_INT_MINIMUMS = {
    "debug": 0,
    "num_threads": 0,
    "const_fold_limit": 0,
    "cache_max_mb": 0,
    "memory_limit_mb": 0,
}
_BOOL_OPTIONS = (
    "cache_sign",
    "fusion",
    "codegen",
    "fastmath",
    "freeze_variables",
    "lazy_compile",
    "dense_epilogues",
)


def _check_value(name: str, value: Any, source: str | None = None) -> None:
    """OptionError unless ``value`` has the kind and range option ``name`` takes
    (``source``: the environment variable it came from, named in the message).

    Checked when the option is set, so a bad value (``GEODE_NUM_THREADS=-3``,
    ``num_threads=2.5``) is refused once with its name instead of failing later inside
    every kernel's compile (which would send every group to the fallback engine).
    """
    where = f"{source}: " if source else ""
    try:
        _check_kind(name, value)
    except OptionError as exc:
        raise OptionError(f"{where}{exc}") from None


def _check_kind(name: str, value: Any) -> None:
    if name in _INT_MINIMUMS:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise OptionError(f"{name}={value!r}: expected an int, got {type(value).__name__}")
        if value < _INT_MINIMUMS[name]:
            raise OptionError(f"{name}={value!r}: expected an int >= {_INT_MINIMUMS[name]}")
    elif name in _BOOL_OPTIONS and not (
        isinstance(value, (bool, np.bool_))
        or (isinstance(value, (int, np.integer)) and value in (0, 1))
    ):
        raise OptionError(f"{name}={value!r}: expected a bool, got {type(value).__name__}")
    elif name == "disabled_passes" and not (
        isinstance(value, tuple) and all(isinstance(p, str) for p in value)
    ):
        raise OptionError(f"{name}={value!r}: expected pass names (a tuple of str)")
    elif name == "streaming":
        _streaming_setting(value)
    elif name == "backend" and value not in BACKENDS:
        raise OptionError(f"backend={value!r}: expected one of {', '.join(BACKENDS)}")
    elif (
        name == "progress"
        and not isinstance(value, (bool, int))
        and str(value).strip().lower() not in _PROGRESS_WORDS
    ):
        raise OptionError(f"progress={value!r}: expected auto, 1 or 0")


#: the native code generators (``backend`` option)
BACKENDS = ("llvm", "numba")

#: the words ``progress`` accepts for on and off (besides ``auto``; see :mod:`geode.progress`)
PROGRESS_ON = ("1", "true", "yes", "on", "always")
PROGRESS_OFF = ("0", "false", "no", "off", "never")
_PROGRESS_WORDS = ("auto", *PROGRESS_ON, *PROGRESS_OFF)


#: options whose value is a folder path (``dump_dir`` may also be None: no dumps)
_PATH_OPTIONS = ("dump_dir", "cache_dir")


def check_path_option(name: str, value: Any) -> str | None:
    """``value`` of the folder option ``name`` as a ``str`` path; OptionError if it is not one.

    A ``str`` or ``os.PathLike`` (e.g. ``pathlib.Path``) is a path; ``None`` is allowed for
    ``dump_dir`` only (no dumps). Anything else (a number, bytes, a path holding a NUL
    character) is refused with an error naming the option and the value.
    """
    if value is None and name == "dump_dir":
        return None
    path = os.fspath(value) if isinstance(value, os.PathLike) else value
    if not isinstance(path, str):
        raise OptionError(
            f"{name}={value!r}: expected a folder path (str or os.PathLike), "
            f"got {type(value).__name__}"
        )
    if "\x00" in path:
        raise OptionError(f"{name}={path!r}: a path cannot contain a NUL character")
    return path


def _parse(name: str, raw: str, source: str) -> Any:
    kind = {f.name: f.type for f in dataclasses.fields(Options)}[name]
    try:
        if kind == "bool":
            low = raw.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if kind == "int":
            return int(raw)
        if kind.startswith("tuple"):
            return tuple(p.strip() for p in raw.split(",") if p.strip())
        if name == "backend":
            return raw.strip().lower()
        return raw
    except ValueError:
        raise OptionError(f"{source}={raw!r}: expected {kind} for option {name!r}") from None


def stream_min_bytes(opts: Options, cache_bytes: int) -> int | None:
    """The ``streaming`` option as the smallest output (bytes) to stream, or None for off;
    ``cache_bytes`` (the last-level cache size) is the ``auto`` threshold."""
    setting = _streaming_setting(opts.streaming)
    return cache_bytes if setting == "auto" else setting


def _streaming_setting(value: Any) -> str | int | None:
    """``streaming`` as ``"auto"``, None (off) or a byte count; OptionError otherwise."""
    raw = str(value).strip().lower()
    if raw in ("auto", "off"):
        return None if raw == "off" else raw
    try:
        n = int(raw)
    except ValueError:
        n = -1
    if isinstance(value, (bool, float)) or n < 0:
        raise OptionError(f"streaming={value!r}: expected auto, off or a size in bytes (>= 0)")
    return n


_global_overrides: dict[str, Any] = {}


def set_options(**overrides: Any) -> None:
    """Set process-wide defaults from Python (e.g. ``geode.set_options(debug=2, dump_dir="d")``)."""
    Options().replace(**overrides)  # validate
    _global_overrides.update(overrides)


def current(**overrides: Any) -> Options:
    """Effective options: defaults < environment < set_options() < ``overrides``."""
    return Options.from_env(**{**_global_overrides, **overrides})
