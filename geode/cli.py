"""The ``geode`` command line (also ``python -m geode``).

Subcommands, in the style of onnxruntime_perf_test and tvmc:

* ``geode run MODEL [--input name=file.npy ...] [--shape name:2,128 ...] [-o out.npz]``
  compiles and runs a model once: random inputs of the right dtypes unless
  ``--input`` files are given; prints each output's shape, dtype and min/max/mean,
  or saves all outputs to an ``.npz`` file;
* ``geode bench MODEL [--shape x=1x32 ...] [--threads N] [--rounds R] [--profile K]``:
  geode against onnxruntime at the same thread count in interleaved rounds (see
  :mod:`geode.benchmark`): median times, the per-round ratio's median and IQR, the
  outputs' relative difference, compile times; geode alone without onnxruntime;
* ``geode explain MODEL [--dot FILE.dot [--force]]``: engines and partitions, fusion
  groups with the reason for each decision, kernels with their ops and cost estimates;
* ``geode dump MODEL -d DIR [--llvm]``: every compile stage as files (what
  ``GEODE_DUMP_DIR`` writes) plus ``graph.dot`` (and ``graph.svg`` with Graphviz);
* ``geode tune MODEL --db PATH [--trials N] [--shape x:64,1024 ...] [--threads N]``:
  searches each kernel's schedule space and keeps faster schedules in a tuning
  database (see :mod:`geode.tuner`), resumable;
* ``geode cache [--dir DIR] [--clear | --prune]``: the kernel cache's folder, number of
  entries, size and limit; ``--clear`` removes geode's entries (and nothing else in the
  folder), ``--prune`` evicts the least recently used ones down to the limit;
* ``geode demo``: the README's built-in example.

MODEL is an ``.onnx`` file or ``builtin:NAME`` for a graph of ``geode.examples.ALL``.
Compile options may be given as ``--option key=value`` (see ``geode.config``).
Errors print one line, ``geode: error: ...``, and exit with status 2 (3 for an
internal error, whose traceback ``GEODE_DEBUG=1`` shows); running out of memory is an
error, not an internal one (a run that would not fit is refused before allocating,
naming the value and the size: :mod:`geode.runtime.memlimit`).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import sys
import time
import warnings
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from geode.costmodel.sol import format_bytes
from geode.errors import GeodeError

BUILTIN_PREFIX = "builtin:"
#: random integer inputs are drawn from [0, RANDOM_INT_HIGH): valid token ids and indices
#: for any table of at least this many rows
RANDOM_INT_HIGH = 4


class CLIError(GeodeError):
    """A command-line mistake: a bad argument, path or file."""


# -- shared helpers -------------------------------------------------------------------------
def _median_time(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    fn()
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def note(msg: str) -> None:
    """Print a note for the user on stderr."""
    print(f"geode: note: {msg}", file=sys.stderr)


def _int_at_least(low: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer >= ``low`` (argparse reports anything else)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"invalid value {text!r}: expected an integer"
            ) from None
        if value < low:
            raise argparse.ArgumentTypeError(f"invalid value {text!r}: must be >= {low}")
        return value

    parse.__name__ = f"integer >= {low}"
    return parse


def physical_memory() -> int | None:
    """This machine's physical memory in bytes (None when the platform does not say)."""
    try:
        pages, page = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
    return pages * page if pages > 0 and page > 0 else None


def check_fits(what: str, nbytes: int, hint: str) -> None:
    """CLIError when ``nbytes`` (the memory ``what`` needs) exceeds the physical memory."""
    mem = physical_memory()
    if mem is not None and nbytes > mem:
        raise CLIError(
            f"{what} needs {format_bytes(nbytes)}, more than this machine's memory "
            f"({format_bytes(mem)}); {hint}"
        )


@dataclass
class Loaded:
    """A model as the CLI knows it: its graph, where it came from, and its ONNX form."""

    graph: Any
    label: str
    onnx_path: str | None = None
    example: Any = None
    #: a geode model file (compiled already: loaded, not compiled)
    geode_path: str | None = None

    def onnx_bytes(self) -> bytes:
        """The serialized ONNX model (exported for built-in examples)."""
        if self.geode_path is not None:
            raise CLIError(
                f"{self.label}: a geode model file holds no ONNX model for onnxruntime; "
                "bench the .onnx file to compare, or use --no-compare-ort"
            )
        if self.onnx_path is not None:
            return Path(self.onnx_path).read_bytes()
        from geode.compiler.frontend.onnx_export import to_onnx

        return to_onnx(self.graph).SerializeToString()


def load_model(spec: str) -> Loaded:
    """The graph for MODEL: an ``.onnx`` path or ``builtin:NAME``."""
    from geode import examples

    if spec.startswith(BUILTIN_PREFIX):
        name = spec[len(BUILTIN_PREFIX) :]
        if name not in examples.ALL:
            raise CLIError(
                f"unknown built-in model {name!r}; choose one of: {', '.join(examples.ALL)}"
            )
        ex = examples.ALL[name]()
        return Loaded(ex.graph, f"builtin:{name}", example=ex)
    path = Path(spec)
    if not path.exists():
        hint = ""
        if spec in examples.ALL:
            hint = f" (for the built-in example write {BUILTIN_PREFIX}{spec})"
        raise CLIError(f"{spec}: no such file{hint}")
    if path.is_dir():
        raise CLIError(f"{spec}: is a directory, expected an .onnx file")
    from geode.modelfile import is_model_file

    if is_model_file(path):
        return Loaded(None, str(path), geode_path=str(path))
    from geode.compiler.frontend.onnx import import_model

    return Loaded(import_model(str(path)), str(path), onnx_path=str(path))


def parse_options(pairs: Sequence[str]) -> dict[str, str]:
    """``--option key=value`` pairs as a dict (values parsed later by geode.config)."""
    out: dict[str, str] = {}
    for p in pairs:
        key, eq, value = p.partition("=")
        if not eq or not key.strip():
            raise CLIError(f"bad --option {p!r}: expected KEY=VALUE (e.g. fusion=0)")
        out[key.strip()] = value.strip()
    return out


def command_options(args: argparse.Namespace) -> dict[str, str]:
    """The compile options of a command: its ``--option`` pairs, and ``--dynamic-dims``
    as the ``dynamic_dims`` option (checked by geode.config)."""
    out = parse_options(getattr(args, "option", None) or [])
    dims = getattr(args, "dynamic_dims", None)
    if dims:
        out["dynamic_dims"] = ";".join(dims)
    return out


def parse_shapes(items: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """``--shape`` items as name -> shape: ``name:2,128`` or ``name=2x128`` (dims separated
    by ``,`` or ``x`` in either form; ``name:`` or ``name=`` is a scalar)."""
    out: dict[str, tuple[int, ...]] = {}
    for item in items:
        name, sep, dims = item.rpartition(":") if ":" in item else item.rpartition("=")
        if not sep or not name:
            raise CLIError(
                f"bad --shape {item!r}: expected NAME:D1,D2,... or NAME=D1xD2... "
                "(e.g. x:2,128 or x=2x128)"
            )
        try:
            parts = dims.replace("x", ",").split(",")
            shape = tuple(int(d) for d in parts) if dims.strip() else ()
        except ValueError:
            raise CLIError(
                f"bad --shape {item!r}: dims must be integers, e.g. {name}:2,128 or {name}=2x128"
            ) from None
        if any(d < 0 for d in shape):
            raise CLIError(f"bad --shape {item!r}: dims must be >= 0")
        if name in out:
            raise CLIError(f"--shape given twice for input {name!r}")
        out[name] = shape
    return out


def parse_input_files(items: Sequence[str]) -> dict[str, str]:
    """``--input name=file.npy`` items as name -> path."""
    out: dict[str, str] = {}
    for item in items:
        name, eq, path = item.partition("=")
        if not eq or not name or not path:
            raise CLIError(f"bad --input {item!r}: expected NAME=FILE.npy (e.g. x=x.npy)")
        if name in out:
            raise CLIError(f"--input given twice for input {name!r}")
        if not Path(path).exists():
            raise CLIError(f"--input {item}: no such file")
        if Path(path).is_dir():
            raise CLIError(f"--input {item}: is a directory, expected a .npy file")
        out[name] = path
    return out


def load_npy(name: str, path: str) -> np.ndarray:
    """The array of one ``--input`` file."""
    p = Path(path)
    if not p.exists():
        raise CLIError(f"--input {name}={path}: no such file")
    if p.is_dir():
        raise CLIError(f"--input {name}={path}: is a directory, expected a .npy file")
    try:
        arr = np.load(p, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise CLIError(f"--input {name}={path}: not a readable .npy file ({exc})") from None
    if not isinstance(arr, np.ndarray):
        arr.close()
        raise CLIError(
            f"--input {name}={path}: is an .npz archive, expected one array in a .npy file"
        )
    return arr


def random_array(rng: np.random.Generator, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """Random data of ``dtype``: normal floats, small non-negative ints, random bools."""
    dtype = np.dtype(dtype)
    try:
        if dtype == np.bool_:
            return rng.integers(0, 2, shape).astype(np.bool_)
        if dtype.kind in "iu":
            return rng.integers(0, RANDOM_INT_HIGH, shape).astype(dtype)
        if dtype.kind == "c":
            return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
        if dtype.kind == "f":
            return rng.standard_normal(shape).astype(dtype)
    except MemoryError:
        size = math.prod(shape) * dtype.itemsize
        raise CLIError(
            f"not enough memory for random data of {dtype}[{', '.join(map(str, shape))}] "
            f"({format_bytes(size)}); choose a smaller shape with --shape"
        ) from None
    raise CLIError(f"cannot make random data of dtype {dtype}; give this input with --input")


def make_feeds(
    specs: Sequence[Any],
    shapes: dict[str, tuple[int, ...]],
    files: dict[str, str],
    rng: np.random.Generator,
    notes: Callable[[str], None] = note,
) -> dict[str, np.ndarray]:
    """Input arrays for a model's input specs (``model.plan.inputs``).

    Arrays come from ``files`` (then every input must have one), else random data of
    each input's dtype, shaped by ``shapes`` or by the model's dims, symbolic dims
    taking values bound by other inputs or 1 (with a note).
    """
    names = [s.name for s in specs]
    for flag, given in (("--shape", shapes), ("--input", files)):
        unknown = [n for n in given if n not in names]
        if unknown:
            raise CLIError(
                f"{flag} names unknown input {unknown[0]!r}; the model's inputs are: {', '.join(names)}"
            )
    if files:
        missing = [n for n in names if n not in files]
        if missing:
            raise CLIError(
                f"missing input(s) {', '.join(missing)}: give --input NAME=FILE.npy for every input "
                "(or no --input for random inputs)"
            )
    env: dict[str, int] = {}
    feeds: dict[str, np.ndarray] = {}

    def bind(spec: Any, shape: tuple[int, ...]) -> None:
        if spec.dims is None or len(spec.dims) != len(shape):
            return  # the model reports the rank mismatch when it runs
        for d, n in zip(spec.dims, shape):
            if isinstance(d, str):
                env.setdefault(d, int(n))

    for spec in specs:
        if spec.name in files:
            feeds[spec.name] = load_npy(spec.name, files[spec.name])
            bind(spec, feeds[spec.name].shape)
        elif spec.name in shapes:
            bind(spec, shapes[spec.name])
    defaulted: list[str] = []
    total = 0  # bytes of the random inputs so far
    for spec in specs:
        if spec.name in feeds:
            continue
        if spec.name in shapes:
            shape = shapes[spec.name]
        elif spec.dims is None:
            raise CLIError(
                f"input {spec.name!r} has unknown rank: give its shape with --shape {spec.name}:D1,D2,..."
            )
        else:
            dims: list[int] = []
            checks = {c.axis: c for c in spec.checks}
            for axis, d in enumerate(spec.dims):
                if isinstance(d, int):
                    dims.append(d)
                elif isinstance(d, str):
                    if d not in env:
                        env[d] = 1
                        defaulted.append(f"{d} (input {spec.name!r})")
                    dims.append(env[d])
                else:
                    try:
                        dims.append(int(checks[axis].fn(env)))
                    except (KeyError, NameError, TypeError):
                        dims.append(1)
                        defaulted.append(f"{spec.dim_text[axis]} (input {spec.name!r})")
            shape = tuple(dims)
        nbytes = math.prod(shape) * np.dtype(spec.dtype).itemsize
        total += nbytes
        what = f"random input {spec.name!r} {np.dtype(spec.dtype)}[{', '.join(map(str, shape))}]"
        if total > nbytes:
            what += " together with the random inputs before it"
        check_fits(what, total, f"choose a smaller shape with --shape {spec.name}:D1,D2,...")
        feeds[spec.name] = random_array(rng, spec.dtype, shape)
    if defaulted:
        notes(
            f"symbolic dim(s) {', '.join(defaulted)} set to 1; choose sizes with --shape NAME:D1,D2,..."
        )
    return feeds


def compile_model(loaded: Loaded, options: dict[str, Any]) -> tuple[Any, float]:
    """The compiled model and the compile time in seconds (for a geode model file: the
    model loaded, and the load time; ``num_threads`` is the one option it takes)."""
    import geode

    t0 = time.perf_counter()
    if loaded.geode_path is not None:
        other = sorted(set(options) - {"num_threads"})
        if other:
            raise CLIError(
                f"{loaded.label}: a geode model file is compiled already; options "
                f"{', '.join(other)} do not apply"
            )
        threads = options.get("num_threads")
        model = geode.load(loaded.geode_path, num_threads=None if threads is None else int(threads))
    else:
        model = geode.compile(loaded.graph, **options)
    return model, time.perf_counter() - t0


def _shape_str(a: np.ndarray) -> str:
    return f"{a.dtype}[{', '.join(str(d) for d in a.shape)}]"


def summarize(a: np.ndarray) -> str:
    """``min .. max .. mean ..`` of an array (counts for booleans, notes NaN/Inf)."""
    if a.size == 0:
        return "(empty)"
    if a.dtype == np.bool_:
        return f"true {int(a.sum())}/{a.size}"
    if a.dtype.kind not in "iufc":
        return ""
    if a.dtype.kind == "c":
        a = np.abs(a)
    extra = ""
    if a.dtype.kind == "f":
        bad = ~np.isfinite(a)
        if bad.any():
            extra = f"  non-finite {int(bad.sum())}"
            a = a[~bad]
            if a.size == 0:
                return extra.strip()
    x = a.astype(np.float64)
    return f"min {x.min():.6g}  max {x.max():.6g}  mean {x.mean():.6g}{extra}"


def describe_feeds(feeds: dict[str, np.ndarray]) -> str:
    """``x float32[2, 64], ...``."""
    return ", ".join(f"{k} {_shape_str(v)}" for k, v in feeds.items())


def check_new_file(flag: str, path: str, force: bool) -> Path:
    """Where ``flag`` writes: a file in an existing folder, not a directory, not an
    existing file unless ``force``."""
    p = Path(path)
    if p.is_dir():
        raise CLIError(f"{flag} {path}: is a directory")
    if (p.exists() or p.is_symlink()) and not force:
        raise CLIError(f"{flag} {path}: file exists (use --force to overwrite)")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise CLIError(f"{flag} {path}: folder {str(parent)!r} does not exist")
    return p


def check_output_path(path: str, force: bool) -> Path:
    """Where ``-o`` writes: an ``.npz`` file, not a directory, not overwritten unless ``force``."""
    if Path(path).suffix.lower() != ".npz":
        raise CLIError(f"-o {path}: the output file must end in .npz")
    return check_new_file("-o", path, force)


def write_new_text(flag: str, path: Path, text: str, force: bool) -> None:
    """Write ``text`` to ``path``, never replacing a file unless ``force``."""
    try:
        with open(path, "w" if force else "x", encoding="utf-8") as f:
            f.write(text)
    except FileExistsError:
        raise CLIError(f"{flag} {path}: file exists (use --force to overwrite)") from None


def save_npz(path: Path, outputs: dict[str, np.ndarray], force: bool) -> None:
    """Save outputs to ``path`` (never replacing a file unless ``force``)."""
    try:
        with (
            open(path, "wb" if force else "xb") as f,
            zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as zf,
        ):
            for name, arr in outputs.items():  # np.savez's layout, any output name
                with zf.open(f"{name}.npy", "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, np.asanyarray(arr), allow_pickle=False)
    except FileExistsError:
        raise CLIError(f"-o {path}: file exists (use --force to overwrite)") from None


# -- subcommands ------------------------------------------------------------------------------
def _prepare(
    args: argparse.Namespace, **extra: str
) -> tuple[Loaded, Any, float, dict[str, np.ndarray]]:
    """Parse the model arguments, compile (with the ``--option`` options and ``extra``),
    and make the inputs."""
    shapes = parse_shapes(getattr(args, "shape", None) or [])
    files = parse_input_files(getattr(args, "input", None) or [])
    options = {**command_options(args), **extra}
    loaded = load_model(args.model)
    model, compile_s = compile_model(loaded, options)
    feeds = make_feeds(model.plan.inputs, shapes, files, np.random.default_rng(args.seed))
    return loaded, model, compile_s, feeds


def cmd_run(args: argparse.Namespace) -> int:
    """Compile a model, run it once, print or save its outputs."""
    out_path = check_output_path(args.output, args.force) if args.output else None
    loaded, model, compile_s, feeds = _prepare(args)
    t0 = time.perf_counter()
    outputs = model.run(feeds)
    run_s = time.perf_counter() - t0
    native = sum(1 for k in model.kernels if k.engine == "aicore")
    print(f"model {loaded.label}: {model.signature}")
    print(f"inputs: {describe_feeds(feeds)}")
    how = "loaded (no compiler run)" if loaded.geode_path else "compiled"
    print(
        f"{how} in {compile_s * 1e3:.1f} ms ({native} native kernels, {len(model.kernels)} "
        f"steps); ran in {run_s * 1e3:.3f} ms"
    )
    print("outputs:")
    width = max((len(k) for k in outputs), default=0)
    for name, arr in outputs.items():
        arr = np.asarray(arr)
        print(f"  {name:<{width}}  {_shape_str(arr):<20}  {summarize(arr)}")
    if out_path is not None:
        save_npz(out_path, {k: np.asarray(v) for k, v in outputs.items()}, args.force)
        print(f"saved {len(outputs)} output(s) to {out_path}")
    return 0


def usable_cores() -> int:
    """The number of cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _size_text(feeds: dict[str, np.ndarray]) -> str:
    """``x=8x16, mask=8x16`` (``x=scalar`` for a 0-d input)."""
    return ", ".join(
        f"{k}={'x'.join(map(str, v.shape)) if v.ndim else 'scalar'}" for k, v in feeds.items()
    )


def _random_note(feeds: dict[str, np.ndarray], inputs: Sequence[str]) -> str:
    """What the random inputs hold ('' when every input came from an ``--input`` file)."""
    given = {item.partition("=")[0] for item in inputs}
    kinds = {v.dtype.kind for k, v in feeds.items() if k not in given}
    parts = []
    if kinds & set("fc"):
        parts.append("floats standard normal")
    if kinds & set("iu"):
        parts.append(
            f"ints uniform in [0, {RANDOM_INT_HIGH}) (valid ids for any table of >= 4 rows)"
        )
    if "b" in kinds:
        parts.append("bools uniform")
    return f" (random: {', '.join(parts)}; give real data with --input)" if parts else ""


def _ort_for_bench(args: argparse.Namespace, loaded: Loaded, feeds: dict) -> tuple[Any, Any]:
    """onnxruntime's runner on ``feeds`` and its :class:`CompileTime` part, or (None, None)
    when it is not compared (not installed, --no-compare-ort, or it rejects the model)."""
    from geode import benchmark

    if args.compare_ort is False:
        return None, None
    if loaded.geode_path is not None and args.compare_ort is None:
        note("a geode model file holds no ONNX model: timing geode alone (bench the .onnx file)")
        return None, None
    if not benchmark.have_onnxruntime():
        if args.compare_ort:
            raise CLIError("--compare-ort: onnxruntime is not installed (pip install onnxruntime)")
        note("onnxruntime is not installed: timing geode alone (pip install onnxruntime)")
        return None, None
    try:
        t0 = time.perf_counter()
        sess = benchmark.ort_session(loaded.onnx_bytes(), args.threads)
        session_s = time.perf_counter() - t0
        run = benchmark.ort_runner(sess, feeds)
        t0 = time.perf_counter()
        run()
        return run, (session_s, time.perf_counter() - t0)
    except GeodeError:
        raise
    except Exception as exc:  # onnxruntime rejects the model: report, keep geode's numbers
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        if args.compare_ort:
            raise CLIError(f"onnxruntime cannot run {loaded.label}: {first}") from None
        note(f"onnxruntime cannot run this model, timing geode alone: {first}")
        return None, None


def cmd_bench(args: argparse.Namespace) -> int:
    """Time a compiled model against onnxruntime in interleaved rounds (see
    :mod:`geode.benchmark`); geode alone when onnxruntime is not compared."""
    from geode import benchmark, config
    from geode.progress import progress_bar

    options = command_options(args)
    if "num_threads" in options:
        raise CLIError("give the thread count with --threads, not --option num_threads")
    setting = config.current(**options).progress
    loaded, model, compile_s, feeds = _prepare(args, num_threads=str(args.threads))
    t0 = time.perf_counter()
    model.run(feeds)
    compiled = benchmark.CompileTime(Path(loaded.label).stem, compile_s, time.perf_counter() - t0)
    ort_run, ort_start = _ort_for_bench(args, loaded, feeds)
    if ort_start is not None:
        compiled.ort_session_s, compiled.ort_first_s = ort_start
    with progress_bar(args.rounds, "geode: bench", setting, unit="round") as bar:
        res = benchmark.compare(
            compiled.model,
            _size_text(feeds),
            lambda: model.run(feeds),
            ort_run,
            args.rounds,
            args.warmup,
            on_round=bar.update,
        )
    systems = "geode, onnxruntime" if ort_run is not None else "geode alone"
    print(f"model {loaded.label}: {model.signature}")
    print(f"inputs: {describe_feeds(feeds)}{_random_note(feeds, args.input or [])}")
    print(
        f"threads {args.threads}; {max(1, args.warmup)} warm-up call(s) each, then "
        f"{args.rounds} interleaved rounds ({systems}); times are medians over rounds"
    )
    print()
    print(benchmark.results_table([res]))
    print()
    print(benchmark.compile_table([compiled]))
    print()
    print(benchmark.summary([res]))
    if args.profile:
        steps = benchmark.step_profile(model, feeds)
        print(f"\ngeode's {min(args.profile, len(steps))} slowest steps:")
        print(benchmark.profile_table(steps, args.profile, res.geode_s))
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    """Print how a model was compiled: partitions, fusion decisions, kernels and costs."""
    dot_path = check_new_file("--dot", args.dot, args.force) if args.dot else None
    loaded = load_model(args.model)
    model, _ = compile_model(loaded, command_options(args))
    print(model.explain())
    if dot_path is not None:
        write_new_text("--dot", dot_path, model.to_dot(), args.force)
        print(f"wrote {args.dot}")
    return 0


def cmd_compile(args: argparse.Namespace) -> int:
    """Compile a model and write it to a geode model file that loads without compiling."""
    from geode.modelfile.container import writable_target

    if args.dynamic_dims:
        raise CLIError(
            "--dynamic-dims: a model file holds one compiled graph, not a bucketed model "
            "(run, bench and explain take --dynamic-dims)"
        )
    writable_target(args.output, args.force)  # refuse before compiling, not after
    loaded = load_model(args.model)
    if loaded.geode_path is not None:
        raise CLIError(f"{loaded.label}: a geode model file is compiled already")
    model, compile_s = compile_model(loaded, command_options(args))
    size = model.save(args.output, overwrite=args.force, external_data=args.external_data)
    native = sum(1 for k in model.kernels if k.engine == "aicore")
    print(f"model {loaded.label}: {model.signature}")
    print(
        f"compiled in {compile_s * 1e3:.1f} ms ({native} native kernels, "
        f"{len(model.kernels)} steps); wrote {args.output} ({format_bytes(size)})"
    )
    print(f"run it with: geode run {args.output}   (or geode.load({args.output!r}) in Python)")
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    """Tune every kernel's schedule of a model into a tuning database."""
    import geode

    loaded = load_model(args.model)
    if loaded.geode_path is not None:
        raise CLIError(f"{loaded.label}: a geode model file is compiled already; tune the model")
    shapes = parse_shapes(args.shape or [])
    files = parse_input_files(args.input or [])
    inputs = {name: load_npy(name, path) for name, path in files.items()}
    options: dict[str, Any] = dict(parse_options(args.option or []))
    if args.threads is not None:
        options["num_threads"] = args.threads
    report = geode.tune(
        loaded.graph,
        trials=args.trials,
        db=args.db,
        inputs=inputs or None,
        shapes=shapes or None,
        predictor=None if args.predictor == "none" else args.predictor,
        retune=args.retune,
        seed=args.seed,
        knobs=args.knobs.split(",") if args.knobs else None,
        ray=args.ray,
        whole_space=args.whole_space,
        **options,
    )
    print(f"model {loaded.label}")
    print(report.table())
    tuned = sum(k.status == "tuned" for k in report.kernels)
    print(f"{tuned} kernel(s) tuned; compile with tuning_db={args.db!r} (or GEODE_TUNING_DB)")
    return 0


def cmd_cache(args: argparse.Namespace) -> int:
    """Show where the on-disk kernel cache is and what it holds; ``--clear`` empties it."""
    from geode import config
    from geode.codegen import cache

    opts = config.current()
    cache_dir = args.dir if args.dir is not None else opts.cache_dir
    info = cache.cache_info(cache_dir)
    limit = f"limit {opts.cache_max_mb} MiB" if opts.cache_max_mb else "no limit"
    # entries, not kernels: a kernel with a streaming body may own two (see
    # geode.codegen.backends.numba, "Chunked kernels")
    print(f"kernel cache {info.path}: {info.entries} entries, {format_bytes(info.bytes)} ({limit})")
    if args.clear:
        print(f"removed {cache.clear_cache(cache_dir)} entries")
    elif args.prune and not opts.cache_max_mb:
        print("no limit (GEODE_CACHE_MAX_MB=0): nothing evicted")
    elif args.prune:
        done = cache.prune_cache(cache_dir, opts.cache_max_mb << 20)
        print(
            f"evicted {done.removed} entries ({format_bytes(done.freed)}), {format_bytes(done.left)} left"
        )
    return 0


def cmd_dump(args: argparse.Namespace) -> int:
    """Compile a model writing every stage into a dump dir, plus the graph picture."""
    from geode.debug import dump_folder
    from geode.viz import have_dot, render_svg

    d = Path(args.dir)
    if d.exists() and not d.is_dir():
        raise CLIError(f"-d {args.dir}: exists and is not a directory")
    options = command_options(args)
    loaded = load_model(args.model)
    options["dump_dir"] = str(d)
    model, _ = compile_model(loaded, options)
    out = dump_folder(str(d), loaded.graph.name)  # the folder the compile's Dumper prepared
    dot_path = out / "graph.dot"
    if not dot_path.exists():
        _new_dump_file(out, "graph.dot").write_text(model.to_dot(), encoding="utf-8")
    if args.llvm:
        numbered = [p for p in out.iterdir() if p.name[:2].isdigit()]
        n = len(numbered)
        for k in model.kernels:
            if k.engine != "aicore":
                continue
            for kind, ext in (("llvm", "ll"), ("asm", "s")):
                if any(p.name.endswith(f"_{k.name}_{kind}.{ext}") for p in numbered):
                    continue  # written by the compile itself (debug level 4)
                text = k.llvm if kind == "llvm" else k.asm
                _new_dump_file(out, f"{n:02d}_{k.name}_{kind}.{ext}").write_text(
                    text, encoding="utf-8"
                )
                n += 1
    if have_dot():
        render_svg(dot_path.read_text(encoding="utf-8"), _new_dump_file(out, "graph.svg"))
    else:
        note("Graphviz 'dot' is not installed: graph.svg not written (graph.dot is)")
    print(f"model {loaded.label}: {model.signature}")
    print(f"dumped to {out}:")
    for p in sorted(out.iterdir()):
        if p.is_file():
            print(f"  {p.name}")
    return 0


def _new_dump_file(out: Path, name: str) -> Path:
    """A file the CLI adds to the dump folder ``out``, listed in its manifest (so the next
    dump may replace it); CLIError if something of that name is already there."""
    from geode.debug import record_dump_file, safe_name

    path = out / safe_name(name)
    if path.exists() or path.is_symlink():
        raise CLIError(f"{path}: exists and was not written by this dump")
    return record_dump_file(out, name)


def cmd_demo(args: argparse.Namespace) -> int:
    """Compile the built-in RMSNorm and LayerNorm graphs, check and time them against numpy."""
    import geode
    from geode import examples

    check_fits(
        f"geode demo --batch {args.batch} --hidden {args.hidden}",
        4 * args.batch * args.hidden * 4,  # the input, geode's and numpy's outputs, temporaries
        "choose a smaller --batch or --hidden",
    )
    rng = np.random.default_rng(0)
    print(f"geode demo: batch {args.batch}, hidden {args.hidden}, float32")
    print(
        f"{'model':<12}{'kernels':>8}{'compile ms':>12}{'max |err|':>12}{'geode ms':>10}{'numpy ms':>10}{'speedup':>9}"
    )
    for name in ("rmsnorm", "layernorm"):
        ex = getattr(examples, name)(hidden=args.hidden)
        t0 = time.perf_counter()
        model = geode.compile(ex.graph)
        compile_ms = (time.perf_counter() - t0) * 1e3
        feeds = ex.make_inputs(rng, args.batch)
        got = model(**feeds)
        want = ex.numpy(**feeds)
        err = max(float(np.max(np.abs(got[k] - want[k]))) for k in want)
        tg = _median_time(lambda: model(**feeds), args.repeat)  # noqa: B023
        tn = _median_time(lambda: ex.numpy(**feeds), args.repeat)  # noqa: B023
        native = sum(1 for k in model.kernels if k.engine == "aicore")
        kern = f"{native}/{len(model.kernels)}"
        print(
            f"{name:<12}{kern:>8}{compile_ms:>12.1f}{err:>12.2e}{tg * 1e3:>10.3f}{tn * 1e3:>10.3f}{tn / tg:>8.2f}x"
        )
        if err > 1e-3:
            print(f"geode: error: {name} differs from numpy by {err}", file=sys.stderr)
            return 1
    print("kernels column: native AI Core kernels / all steps")
    return 0


# -- parser ------------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line: ``geode: error: ...``."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"geode: error: {message} (see '{self.prog} --help')\n")


_MODEL_HELP = (
    "an .onnx file, a geode model file (.geode, from `geode compile`), or builtin:NAME for "
    "a built-in example graph (e.g. builtin:layernorm)"
)
_SHAPE = (
    ("--shape",),
    dict(
        action="append",
        metavar="NAME:D1,D2,...",
        help="shape of a random input (sets its symbolic dims; default 1), e.g. x:2,128 or x=2x128",
    ),
)
_INPUT = (
    ("--input",),
    dict(
        action="append",
        metavar="NAME=FILE.npy",
        help="read an input from a .npy file (give one for every input)",
    ),
)
_SEED = (
    ("--seed",),
    dict(type=_int_at_least(0), default=0, help="seed of the random inputs (default 0)"),
)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help=_MODEL_HELP)
    p.add_argument(
        "--option",
        action="append",
        metavar="KEY=VALUE",
        help="a compile option of geode.config, e.g. fusion=0 or debug=2 (repeatable)",
    )
    p.add_argument(
        "--dynamic-dims",
        action="append",
        metavar="NAME=S1,S2,...",
        help="compile a variant per size of a symbolic input dim (buckets), e.g. "
        "batch=1,4,16,64 (repeatable); other sizes pad up to the next bucket or run "
        "the symbolic model",
    )


def _add_bench(sub: Any) -> None:
    """The ``bench`` subcommand's parser."""
    b = sub.add_parser(
        "bench",
        help="time a model against onnxruntime (interleaved rounds, paired ratios)",
        description="Compile MODEL and time it against onnxruntime at the same thread count: "
        "warm-up calls, then interleaved rounds; prints the median times, the median and "
        "interquartile range of the per-round ratio geode/ORT, the largest relative "
        "difference of the outputs, and the compile times (geode alone when onnxruntime is "
        "not installed). Random inputs: floats standard normal, ints in [0, 4).",
    )
    _common(b)
    for flags, kw in (_INPUT, _SHAPE, _SEED):
        b.add_argument(*flags, **kw)
    b.add_argument(
        "--threads",
        type=_int_at_least(1),
        default=usable_cores(),
        metavar="N",
        help="threads for geode and onnxruntime alike (default: the usable cores, "
        f"{usable_cores()} here)",
    )
    b.add_argument(
        "--rounds",
        "--repeat",
        type=_int_at_least(1),
        default=10,
        metavar="R",
        help="interleaved rounds of timed calls (default 10)",
    )
    b.add_argument(
        "--warmup",
        type=_int_at_least(0),
        default=3,
        metavar="N",
        help="untimed warm-up calls of each system (default 3; at least one is made)",
    )
    b.add_argument(
        "--compare-ort",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also time onnxruntime on the same inputs (default: when it is installed)",
    )
    b.add_argument(
        "--profile",
        type=_int_at_least(0),
        default=0,
        metavar="K",
        help="also time each step of geode's plan and list the K slowest",
    )
    b.set_defaults(func=cmd_bench)


def _add_tune(sub: Any) -> None:
    """The ``tune`` subcommand's parser."""
    t = sub.add_parser(
        "tune",
        help="search each kernel's schedule space; keep faster schedules in a database",
        description="Compile MODEL up to its kernels and, for each kernel not in the tuning "
        "database yet, measure schedules around the default one (split, tile and rfactor "
        "factors, parallel or not, prefetch distance, streaming stores, interleave, unroll), "
        "keeping the fastest that gives the default's results. The database is written after "
        "every kernel; a rerun skips the kernels done. Compile with "
        "--option tuning_db=PATH (or GEODE_TUNING_DB) to use it.",
    )
    _common(t)
    for flags, kw in (_INPUT, _SHAPE, _SEED):
        t.add_argument(*flags, **kw)
    t.add_argument("--db", required=True, metavar="PATH", help="the tuning database (JSON)")
    t.add_argument(
        "--trials",
        type=_int_at_least(0),
        default=32,
        metavar="N",
        help="candidates measured per kernel at most (default 32)",
    )
    t.add_argument(
        "--threads",
        type=_int_at_least(1),
        default=None,
        metavar="N",
        help="threads the kernels run with (part of the database key; default: all cores)",
    )
    t.add_argument(
        "--predictor",
        choices=("none", "sol", "projected"),
        default="none",
        help="rank candidates before measuring them (default none: knob order; projected: "
        "the projected cost model, fitted on this machine when a fit was saved)",
    )
    t.add_argument(
        "--knobs",
        metavar="K1,K2,...",
        help="search only these knobs (default all; see geode/codegen/tuning/space.py)",
    )
    t.add_argument(
        "--whole-space",
        type=_int_at_least(0),
        default=0,
        metavar="N",
        help="with a predictor, rank a kernel's whole space when it has at most N settings, "
        "the best-predicted measured first (default 0: climb from the default)",
    )
    t.add_argument(
        "--ray",
        metavar="ADDRESS",
        default=None,
        help="measure candidates on the Ray cluster at ADDRESS (HOST:PORT, ray://HOST:PORT; "
        "'local' or 'auto' start one here); needs the geode[ray] extra",
    )
    t.add_argument("--retune", action="store_true", help="tune kernels already in the database")
    t.set_defaults(func=cmd_tune)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand."""
    from geode import __version__

    p = _Parser(
        prog="geode",
        description="geode: a fusion compiler for deep-learning graphs",
        epilog="MODEL is an .onnx file, a .geode model file or builtin:NAME. Environment: "
        "GEODE_DEBUG=1..4, "
        "GEODE_DUMP_DIR=dir, GEODE_PROGRESS=auto|1|0, GEODE_CACHE_DIR (see geode/config.py).",
    )
    p.add_argument("--version", action="version", version=f"geode {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    r = sub.add_parser(
        "run",
        help="compile and run a model once; print or save its outputs",
        description="Compile MODEL, run it once on the given inputs (random ones of the right "
        "dtypes by default) and print each output's shape, dtype and min/max/mean.",
    )
    _common(r)
    for flags, kw in (_INPUT, _SHAPE, _SEED):
        r.add_argument(*flags, **kw)
    r.add_argument("-o", "--output", metavar="OUT.npz", help="save the outputs to this .npz file")
    r.add_argument("--force", action="store_true", help="overwrite the -o file if it exists")
    r.set_defaults(func=cmd_run)

    _add_bench(sub)

    k = sub.add_parser(
        "compile",
        help="compile a model into a geode model file (.geode) that loads without compiling",
        description="Compile MODEL and write it to OUT.geode: the compiled graph, every "
        "kernel's machine code, the memory plan, constants and variables. `geode run`, "
        "`bench` and `explain` (and geode.load in Python) read it back in any process on a "
        "machine with the same CPU features, without compiling.",
    )
    _common(k)
    k.add_argument("-o", "--output", required=True, metavar="OUT.geode", help="the model file")
    k.add_argument(
        "--force", action="store_true", help="overwrite OUT even if it is not a geode model file"
    )
    k.add_argument(
        "--external-data",
        choices=("embed", "reference"),
        default="embed",
        help="constants from external data files: copied in (embed, the default) or kept "
        "as references checked by sha256 when loaded",
    )
    k.set_defaults(func=cmd_compile)

    e = sub.add_parser(
        "explain",
        help="show partitions, fusion decisions and kernels",
        description="Compile MODEL and print its engines and partitions, the fusion groups "
        "with the reason for each decision, and the kernels with their ops and costs.",
    )
    _common(e)
    e.add_argument(
        "--dot", metavar="FILE.dot", help="also write the graph picture (Graphviz DOT) here"
    )
    e.add_argument("--force", action="store_true", help="overwrite the --dot file if it exists")
    e.set_defaults(func=cmd_explain)

    d = sub.add_parser(
        "dump",
        help="write every compile stage to files (like GEODE_DUMP_DIR)",
        description="Compile MODEL writing every stage under DIR/<model>/: graphs before and "
        "after passes, placement, fusion plan, loop ASTs before and after scheduling, "
        "schedule traces, kernel source, the final plan, graph.dot (and graph.svg when "
        "Graphviz is installed).",
    )
    _common(d)
    d.add_argument(
        "-d", "--dir", required=True, metavar="DIR", help="the dump folder (created if needed)"
    )
    d.add_argument(
        "--llvm", action="store_true", help="also write each kernel's LLVM IR and assembly"
    )
    d.set_defaults(func=cmd_dump)

    _add_tune(sub)

    c = sub.add_parser(
        "cache",
        help="show or clear the on-disk kernel cache",
        description="Print the kernel cache folder, its number of kernels and their size. "
        "--clear removes geode's entries (kernels and runtime helpers) and nothing else; "
        "--prune evicts the least recently used ones down to the size limit.",
    )
    c.add_argument(
        "--dir", metavar="DIR", help="the cache folder (default: GEODE_CACHE_DIR or ~/.cache/geode)"
    )
    what = c.add_mutually_exclusive_group()
    what.add_argument("--clear", action="store_true", help="remove every cached kernel")
    what.add_argument(
        "--prune",
        action="store_true",
        help="evict least recently used entries now, down to GEODE_CACHE_MAX_MB "
        "(compiles do it at most hourly)",
    )
    c.set_defaults(func=cmd_cache)

    m = sub.add_parser(
        "demo",
        help="compile and run the built-in RMSNorm and LayerNorm graphs",
        description="Compile the README's RMSNorm and LayerNorm graphs, check them against "
        "numpy and time both.",
    )
    positive = _int_at_least(1)
    m.add_argument("--batch", type=positive, default=4096, help="rows of the input (default 4096)")
    m.add_argument("--hidden", type=positive, default=768, help="hidden size (default 768)")
    m.add_argument("--repeat", type=positive, default=20, help="timed repetitions (default 20)")
    m.set_defaults(func=cmd_demo)
    return p


# -- entry point --------------------------------------------------------------------------------
class _CLIFormatter(logging.Formatter):
    """``geode: warning: ...`` for warnings, ``[geode] ...`` for debug output."""

    def format(self, record: logging.LogRecord) -> str:
        msg = record.getMessage()
        if record.levelno >= logging.WARNING:
            return f"geode: {record.levelname.lower()}: {msg}"
        return f"[geode] {msg}"


def _setup_output() -> logging.Handler:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_CLIFormatter())
    logging.getLogger("geode").addHandler(handler)

    def showwarning(message, category, filename, lineno, file=None, line=None):  # type: ignore[no-untyped-def]
        if category.__name__ == "CodegenWarning":
            return  # the geode logger reports it already
        print(f"geode: warning: {category.__name__}: {message}", file=sys.stderr)

    warnings.showwarning = showwarning
    return handler


def _debug_level() -> int:
    try:
        return int(os.environ.get("GEODE_DEBUG", "0") or 0)
    except ValueError:
        return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``geode`` command; returns the exit status."""
    args = build_parser().parse_args(argv)
    saved_showwarning = warnings.showwarning
    handler = _setup_output()
    try:
        return int(args.func(args))
    except GeodeError as exc:
        print(f"geode: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except MemoryError as exc:  # not foreseen by a check (those raise GeodeErrors)
        detail = f": {_one_line(exc)}" if str(exc) else ""
        print(f"geode: error: out of memory{detail}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `geode explain m.onnx | head`: stop quietly
        with contextlib.suppress(OSError):  # keep the interpreter's final flush quiet
            sys.stdout = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115
        return 0
    except OSError as exc:
        print(f"geode: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("geode: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug in geode: one line, the traceback on request
        if _debug_level() > 0:
            raise
        print(
            f"geode: internal error: {type(exc).__name__}: {_one_line(exc)} "
            "(run with GEODE_DEBUG=1 for the traceback)",
            file=sys.stderr,
        )
        return 3
    finally:
        logging.getLogger("geode").removeHandler(handler)
        warnings.showwarning = saved_showwarning


def _one_line(exc: BaseException) -> str:
    notes = "".join(f" ({note})" for note in getattr(exc, "__notes__", ()))
    text = " ".join((str(exc) + notes).split()) or type(exc).__name__
    return text if len(text) <= 2000 else text[:2000] + " ..."
