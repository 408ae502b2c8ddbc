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
                                                  numba (the previous backend; needs the
                                                  optional extra: pip install
                                                  "geode[numba]")
dense_epilogues           GEODE_DENSE_EPILOGUES   fuse the group that consumes a native
                                                  MatMul's product into it (run per panel
                                                  of rows while the panel is in cache)
sibling_gemms             GEODE_SIBLING_GEMMS     a fused GEMM epilogue that reads another
                                                  MatMul of the same A (a gated MLP's up
                                                  beside its gate) computes that product
                                                  per panel too, when both weights are
                                                  packed once and the cost model says it
                                                  pays (reason in explain())
summed_gemms              GEODE_SUMMED_GEMMS      a fused GEMM epilogue that reads the
                                                  product of a MatMul of another A of the
                                                  same rows (an LSTM cell's x Wx + h Wh)
                                                  computes that product per panel too,
                                                  when both weights are packed once and
                                                  the cost model says it pays (same bits;
                                                  reason in explain())
residual_epilogues        GEODE_RESIDUAL_EPILOGUES  the residual Add after a fused second
                                                  GEMM is summed into that GEMM's panels,
                                                  and a bias Add before it (a Linear
                                                  layer's) added to its sums (same bits;
                                                  reason in explain())
transposed_operands       GEODE_TRANSPOSED_OPERANDS  a fused GEMM whose A is a Transpose of
                                                  the last two axes (an MLP-Mixer's token
                                                  mixing) reads the Transpose's input in
                                                  place, when the cost model says it pays
                                                  (same bits; reason in explain())
row_scale_gemms           GEODE_ROW_SCALE_GEMMS   a row scale before MatMuls by constant
                                                  weights (an RMSNorm's x * c * w) is
                                                  folded into them: w into the packed
                                                  weights, c applied to the products' rows
                                                  (in the fused epilogue), when legal and
                                                  the cost model says it pays (reason in
                                                  explain(); the graph pass row_scale)
in_place_heads            GEODE_IN_PLACE_HEADS    a fused attention reads Q, K and V in place
                                                  as heads of their projection (no transpose
                                                  copies; a qkv Split's bias Add then joins
                                                  the projection's GEMM) and writes its
                                                  result in place through the transpose back
                                                  to rows, where legal and paying (reasons
                                                  in explain())
packed_weights            GEODE_PACKED_WEIGHTS    a native float32 MatMul whose B is a constant
                                                  matrix multiplies by a copy of B packed once
                                                  at compile (or load) time, with geode's own
                                                  kernel (where the CPU has AVX2 + FMA; the
                                                  choice and its basis in explain()); 0: the
                                                  BLAS, which packs B on every call
fusion_search             GEODE_FUSION_SEARCH     how fusion groups are chosen: greedy (the
                                                  SOL model's verdict on each legal merge, in
                                                  graph order) or beam (a beam search over
                                                  plans scored by the projected model, the
                                                  greedy plan among the candidates; see
                                                  geode.compiler.fusion.search)
conv_method               GEODE_CONV_METHOD       native convs' method: auto (by shape:
                                                  Winograd F(2x2,3x3) for float32 3x3 stride-1
                                                  convs where it measured faster, the direct
                                                  register-blocked kernel for windows of 2-64
                                                  taps at horizontal stride 1 or 2, 1x1 GEMM,
                                                  depthwise, else im2col + GEMM), im2col
                                                  (instead of the direct kernel; a conv with a
                                                  fused MaxPool stays direct), direct (auto
                                                  without Winograd) or winograd (Winograd for
                                                  every conv it can run, else as auto)
stitch_fusion             GEODE_STITCH_FUSION     fuse chained reductions over different axes
                                                  (x -> sum over HW -> sum over C) into one
                                                  kernel, a reduce tree, where the cost model
                                                  says it pays (see
                                                  geode.compiler.fusion.reduce_tree), and a
                                                  row and a column reduction of one input
                                                  into one kernel, a stitch (see
                                                  geode.compiler.fusion.stitch); 0: never
model_cache               GEODE_MODEL_CACHE       keep each compiled model in the cache
                                                  folder; compiling the same graph with the
                                                  same options again loads it (no pipeline
                                                  stage runs; see geode.modelfile.cache)
incremental               GEODE_INCREMENTAL       compile a graph with data-dependent shapes
                                                  up to its data-dependent ops; the rest is
                                                  compiled per shape at run time and cached
                                                  (see geode.incremental)
dynamic_dims              GEODE_DYNAMIC_DIMS      bucketed variants: {"batch": [1, 4, 16]}
                                                  (environment: "batch=1,4,16;seq=32,64")
                                                  compiles the graph once per bucket with
                                                  that dim static, plus the symbolic graph;
                                                  each call runs the bucket of its size (see
                                                  geode.buckets)
tuning_db                 GEODE_TUNING_DB         a tuning database (``geode.tune``): each
                                                  kernel it holds a tuned schedule for, on
                                                  this device and thread count, gets it
schedules                 (none)                  ``{kernel_key: trace or function}``:
                                                  the schedule of the kernels with those
                                                  keys (a Trace is replayed, a function
                                                  gets the Schedule); see
                                                  geode.codegen.given_schedules
========================  ======================  =========================================

``dump_dir`` and ``cache_dir`` take a ``str`` or ``os.PathLike`` path (anything else is
an :class:`OptionError`); see :mod:`geode.debug` for the files a dump folder may hold.

Process-wide flags that are not options:

- ``GEODE_VECTOR_WIDTH`` = auto (default; 512-bit vectors on AVX-512 hosts), 256 or 512
  (numba builds its CPU target once per process); see :mod:`geode.codegen.backends.target`.
- ``GEODE_LLVM_OPT`` = auto (default: O2 for kernels without vmath calls, O3 for the
  others and for library modules), 2 or 3: the LLVM backend's optimization level per
  module; see :mod:`geode.codegen.backends.llvm.optlevel`.
- ``GEODE_BLAS_POOL`` = 1 (default) or 0: whether OpenBLAS's threads run on geode's native
  pool once a model uses the BLAS (numpy's own matmul included: one pool, one thread
  count); see :func:`geode.codegen.backends.llvm.library.share_pool`.
- ``GEODE_NUM_THREADS`` and ``GEODE_SPIN_US`` also size the native pool and its workers'
  spin before they sleep (:mod:`geode.runtime.native`).
- ``GEODE_PACKED_ISA`` = plain, avx2 or avx512 (default: the best the CPU runs): the
  packed-weight GEMM's path, read once per process (``runtime/native/sgemm_packed.c``;
  a path the CPU cannot run is ignored).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
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
    sibling_gemms: bool = True
    summed_gemms: bool = True
    residual_epilogues: bool = True
    transposed_operands: bool = True
    row_scale_gemms: bool = True
    in_place_heads: bool = True
    packed_weights: bool = True
    fusion_search: str = "greedy"
    conv_method: str = "auto"
    stitch_fusion: bool = True
    model_cache: bool = True
    incremental: bool = False
    #: ((dim name, sizes increasing), ...): see :func:`dynamic_dims_setting`
    dynamic_dims: tuple[tuple[str, tuple[int, ...]], ...] = ()
    tuning_db: str | None = None
    schedules: Mapping[str, Any] | None = None

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
            "sibling_gemms": "GEODE_SIBLING_GEMMS",
            "summed_gemms": "GEODE_SUMMED_GEMMS",
            "residual_epilogues": "GEODE_RESIDUAL_EPILOGUES",
            "transposed_operands": "GEODE_TRANSPOSED_OPERANDS",
            "row_scale_gemms": "GEODE_ROW_SCALE_GEMMS",
            "in_place_heads": "GEODE_IN_PLACE_HEADS",
            "packed_weights": "GEODE_PACKED_WEIGHTS",
            "fusion_search": "GEODE_FUSION_SEARCH",
            "conv_method": "GEODE_CONV_METHOD",
            "stitch_fusion": "GEODE_STITCH_FUSION",
            "model_cache": "GEODE_MODEL_CACHE",
            "incremental": "GEODE_INCREMENTAL",
            "dynamic_dims": "GEODE_DYNAMIC_DIMS",
            "tuning_db": "GEODE_TUNING_DB",
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
            elif k == "dynamic_dims":
                overrides[k] = dynamic_dims_setting(v)
            elif isinstance(v, str) and k not in (
                "progress",
                "streaming",
                "backend",
                "fusion_search",
                "conv_method",
            ):
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
    "sibling_gemms",
    "summed_gemms",
    "residual_epilogues",
    "transposed_operands",
    "row_scale_gemms",
    "in_place_heads",
    "packed_weights",
    "incremental",
    "stitch_fusion",
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
    elif name == "schedules":
        _check_schedules(value)
    elif name == "backend" and value not in BACKENDS:
        raise OptionError(f"backend={value!r}: expected one of {', '.join(BACKENDS)}")
    elif name == "fusion_search" and value not in FUSION_SEARCHES:
        raise OptionError(f"fusion_search={value!r}: expected one of {', '.join(FUSION_SEARCHES)}")
    elif name == "conv_method" and value not in CONV_METHODS:
        raise OptionError(f"conv_method={value!r}: expected one of {', '.join(CONV_METHODS)}")
    elif (
        name == "progress"
        and not isinstance(value, (bool, int))
        and str(value).strip().lower() not in _PROGRESS_WORDS
    ):
        raise OptionError(f"progress={value!r}: expected auto, 1 or 0")


#: the native code generators (``backend`` option)
BACKENDS = ("llvm", "numba")
#: how fusion plans are chosen (``fusion_search`` option)
FUSION_SEARCHES = ("greedy", "beam")
#: what native convs may be asked to use (``conv_method`` option)
CONV_METHODS = ("auto", "im2col", "direct", "winograd")

#: the words ``progress`` accepts for on and off (besides ``auto``; see :mod:`geode.progress`)
PROGRESS_ON = ("1", "true", "yes", "on", "always")
PROGRESS_OFF = ("0", "false", "no", "off", "never")
_PROGRESS_WORDS = ("auto", *PROGRESS_ON, *PROGRESS_OFF)


def _check_schedules(value: Any) -> None:
    """``schedules`` is None or a mapping of kernel keys (str) to traces or functions
    (anything with a ``replay`` method, or a callable); what each does to its kernel
    is checked when the kernel is scheduled."""
    if value is None:
        return
    if not isinstance(value, Mapping):
        raise OptionError(
            f"schedules={value!r}: expected a dict of kernel keys to traces or functions"
        )
    for key, v in value.items():
        if not isinstance(key, str) or not key:
            raise OptionError(f"schedules: key {key!r} is not a kernel key (a str)")
        if not (callable(v) or callable(getattr(v, "replay", None))):
            raise OptionError(
                f"schedules[{key!r}]: expected a Trace or a function of the Schedule, "
                f"got {type(v).__name__}"
            )


#: options whose value is a path (``dump_dir`` and ``tuning_db`` may also be None)
_PATH_OPTIONS = ("dump_dir", "cache_dir", "tuning_db")
_NONE_PATH_OPTIONS = ("dump_dir", "tuning_db")


def check_path_option(name: str, value: Any) -> str | None:
    """``value`` of the path option ``name`` as a ``str`` path; OptionError if it is not one.

    A ``str`` or ``os.PathLike`` (e.g. ``pathlib.Path``) is a path; ``None`` is allowed for
    ``dump_dir`` (no dumps) and ``tuning_db`` (none) only. Anything else (a number, bytes,
    a path holding a NUL character) is refused with an error naming the option and the
    value.
    """
    if value is None and name in _NONE_PATH_OPTIONS:
        return None
    path = os.fspath(value) if isinstance(value, os.PathLike) else value
    if not isinstance(path, str):
        what = "a file path" if name == "tuning_db" else "a folder path"
        raise OptionError(
            f"{name}={value!r}: expected {what} (str or os.PathLike), got {type(value).__name__}"
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
        if name == "dynamic_dims":
            return dynamic_dims_setting(raw, source)
        if kind.startswith("tuple"):
            return tuple(p.strip() for p in raw.split(",") if p.strip())
        if name in ("backend", "fusion_search", "conv_method"):
            return raw.strip().lower()
        return raw
    except ValueError:
        raise OptionError(f"{source}={raw!r}: expected {kind} for option {name!r}") from None


#: the most bucketed variants one compile makes (the product of every dim's sizes)
MAX_BUCKETS = 64


def dynamic_dims_setting(value: Any, source: str = "dynamic_dims") -> tuple:
    """The ``dynamic_dims`` option in its canonical form, ``((name, (sizes...)), ...)``,
    from a mapping (``{"batch": [1, 4, 16]}``), a sequence of pairs, that form itself,
    or the text of the environment and the command line (``"batch=1,4,16;seq=32,64"``);
    None or empty: no buckets. OptionError naming the dim when a name is not a str,
    the sizes are not positive ints in increasing order, or the variants are more than
    :data:`MAX_BUCKETS`."""
    if value is None or (isinstance(value, (str, dict, tuple, list)) and not value):
        return ()
    if isinstance(value, str):
        pairs = []
        for part in value.split(";"):
            name, eq, sizes = part.partition("=")
            if not eq or not name.strip():
                raise OptionError(
                    f"{source}={value!r}: expected name=size,size,... (e.g. batch=1,4,16)"
                )
            try:
                pairs.append((name.strip(), [int(t) for t in sizes.split(",")]))
            except ValueError:
                raise OptionError(
                    f"{source}: sizes of dim {name.strip()!r} must be ints, got {sizes.strip()!r}"
                ) from None
        value = pairs
    items = list(value.items()) if isinstance(value, dict) else list(value)
    out = []
    total = 1
    for item in items:
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise OptionError(f"{source}: expected dim name -> sizes, got {item!r}")
        name, sizes = item
        if not isinstance(name, str) or not name:
            raise OptionError(f"{source}: a dim name is a non-empty str, got {name!r}")
        sizes = list(sizes) if isinstance(sizes, (tuple, list, range)) else [sizes]
        if not sizes:
            raise OptionError(f"{source}: dim {name!r} has no sizes")
        if not all(isinstance(n, (int, np.integer)) and not isinstance(n, bool) for n in sizes):
            raise OptionError(f"{source}: sizes of dim {name!r} must be ints, got {sizes!r}")
        if min(sizes) < 1 or any(b <= a for a, b in zip(sizes, sizes[1:])):
            raise OptionError(
                f"{source}: sizes of dim {name!r} must be positive and increasing, got {sizes}"
            )
        out.append((name, tuple(int(n) for n in sizes)))
        total *= len(sizes)
    if len({n for n, _ in out}) != len(out):
        raise OptionError(f"{source}: a dim is named twice in {[n for n, _ in out]}")
    if total > MAX_BUCKETS:
        raise OptionError(
            f"{source}: {total} bucketed variants (the product of the dims' sizes); "
            f"at most {MAX_BUCKETS}"
        )
    return tuple(out)


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
