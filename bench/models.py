"""Real models exported from PyTorch, timed with geode and onnxruntime at one thread count.

    python bench/models.py [--models bert,gpt2,...] [--sizes small,large] [--threads 2]
                           [--rounds 10] [--json out.json] [--profile K] [--onnx-dir DIR]

Each model (``bench/torch_models.py``) is exported by ``torch.onnx.export`` with dynamic
axes, compiled once by geode (``num_threads=--threads``) and loaded once by onnxruntime
(``intra_op_num_threads=--threads``, ``inter_op_num_threads=1``), then timed at each size
by :mod:`geode.benchmark`: warm-up calls, interleaved rounds of geode and onnxruntime
blocks, the median and IQR of the per-round ratio geode / ORT, each system's median
time, and the largest output difference relative to onnxruntime's largest magnitude
(flagged above 1e-3; the exit status is 1 then). Also timed: compile, geode's
``geode.compile`` plus its first run (an empty kernel cache per model, in this process
where geode has already compiled a one-op graph) against onnxruntime's session creation
plus its first run. ``bench/compile_time.py`` measures compile times in fresh processes instead.

Models and sizes (hidden size 256 and 4 heads where it applies, a quarter of GPT-2
small's 768 per layer: every model at both sizes runs in a few minutes on two cores):

========== ================================================ ==============  ===============
model      what                                             small           large
========== ================================================ ==============  ===============
bert       embeddings + BERT encoder layer + pooler          ids 1x32        ids 8x256
gpt2       pre-norm GPT-2 block, causal attention, GELU MLP  1x32x256        8x256x256
llama_mlp  RMSNorm + SiLU-gated MLP (hidden 688) + residual  1x32x256        8x256x256
lstm_cell  one LSTM step written out (x, h, c inputs)        batch 1         batch 64
lstm       ``nn.LSTM`` over 32 steps                         1x32x256        8x32x256
cnn        ResNet-style conv+BatchNorm+ReLU, residuals,      1x3x64x64       8x3x224x224
           width 32/64 (BatchNormalization kept as a node)
mixer      MLP-Mixer block, 196 tokens x 256 channels        1x196x256       8x196x256
========== ================================================ ==============  ===============

Inputs are random: floats standard normal, BERT's token ids uniform over its 1,000-word
vocabulary and its attention mask all ones. The LSTM cell has no sequence and takes the
issue's batch 64 as its large size; ``nn.LSTM`` runs the issue's 32 steps at both sizes;
the Mixer's token count is fixed by its token-mixing weights.

onnxruntime runs in a worker process of its own (:mod:`geode.bench_isolated`; the rounds
still alternate, geode's process waiting idle while the worker times its block): in one
process its spinning workers take the cores of geode's next calls (a CNN call 39.5 ms
alone, 45.3 ms after onnxruntime's). ``--same-process`` runs it here, as before.

numpy's BLAS (behind geode's MatMul) reads ``OPENBLAS_NUM_THREADS`` when numpy loads:
set it in the environment for a ``--threads`` other than the machine's core count. Its
threads and geode's pool share the cores: with other processes on them, the default
(a BLAS thread per core) made geode's small models 10-100x slower (see the report
header's load average; ``docs/performance.md``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from geode import benchmark  # noqa: E402
from geode.bench_isolated import IsolatedOrt  # noqa: E402

HIDDEN = 256
SIZES = ("small", "large")


@dataclass(frozen=True)
class ModelSpec:
    """A benchmark model: how to build it (needs torch), the shapes its export is traced
    at, its outputs and dynamic axes, and its input shapes per size."""

    name: str
    build: Callable[[], Any]
    outputs: tuple[str, ...]
    axes: dict[str, dict[int, str]]
    sizes: dict[str, dict[str, tuple[int, ...]]]
    #: the export traces at these shapes (not 1: the tracer would fix a size-1 dim)
    sample: dict[str, tuple[int, ...]]
    #: int64 inputs and the range [low, high) of their random values
    ints: dict[str, tuple[int, int]] = field(default_factory=dict)
    keep_batchnorm: bool = False

    def feeds(self, size: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Random inputs at ``size`` (see the module docstring)."""
        return self._random(self.sizes[size], rng)

    def samples(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Random inputs at the export's tracing shapes."""
        return self._random(self.sample, rng)

    def _random(
        self, shapes: dict[str, tuple[int, ...]], rng: np.random.Generator
    ) -> dict[str, np.ndarray]:
        out = {}
        for name, shape in shapes.items():
            if name in self.ints:
                out[name] = rng.integers(*self.ints[name], shape).astype(np.int64)
            else:
                out[name] = rng.standard_normal(shape).astype(np.float32)
        return out


def _model_specs() -> dict[str, ModelSpec]:
    from bench import torch_models as tm

    d = HIDDEN
    seq, batch = {0: "batch", 1: "seq"}, {0: "batch"}
    image = {0: "batch", 2: "height", 3: "width"}

    def tokens(b: int, t: int) -> dict[str, tuple[int, ...]]:
        return {"x": (b, t, d)}

    specs = [
        ModelSpec(
            "bert",
            lambda: tm.BertLayer(vocab=1000, positions=256, dim=d, heads=4),
            ("hidden", "pooled"),
            {"input_ids": seq, "attention_mask": seq, "hidden": seq, "pooled": batch},
            {
                "small": {"input_ids": (1, 32), "attention_mask": (1, 32)},
                "large": {"input_ids": (8, 256), "attention_mask": (8, 256)},
            },
            {"input_ids": (2, 5), "attention_mask": (2, 5)},
            ints={"input_ids": (0, 1000), "attention_mask": (1, 2)},
        ),
        ModelSpec(
            "gpt2",
            lambda: tm.Block(dim=d, heads=4),
            ("y", "pooled"),
            {"x": seq, "y": seq, "pooled": batch},
            {"small": tokens(1, 32), "large": tokens(8, 256)},
            tokens(2, 5),
        ),
        ModelSpec(
            "llama_mlp",
            lambda: tm.LlamaMlp(dim=d, hidden=688),
            ("y",),
            {"x": seq, "y": seq},
            {"small": tokens(1, 32), "large": tokens(8, 256)},
            tokens(2, 5),
        ),
        ModelSpec(
            "lstm_cell",
            lambda: tm.LstmCell(inputs=d, hidden=d),
            ("h_next", "c_next"),
            {k: batch for k in ("x", "h", "c", "h_next", "c_next")},
            {s: {k: (b, d) for k in ("x", "h", "c")} for s, b in (("small", 1), ("large", 64))},
            {k: (2, d) for k in ("x", "h", "c")},
        ),
        ModelSpec(
            "lstm",
            lambda: tm.Lstm(inputs=d, hidden=d),
            ("y", "c_last"),
            {"x": seq, "y": seq, "c_last": batch},
            {"small": tokens(1, 32), "large": tokens(8, 32)},
            tokens(2, 5),
        ),
        ModelSpec(
            "cnn",
            lambda: tm.randomize_norms(tm.ResNet(classes=10, width=32)),
            ("logits",),
            {"x": image, "logits": batch},
            {"small": {"x": (1, 3, 64, 64)}, "large": {"x": (8, 3, 224, 224)}},
            {"x": (2, 3, 32, 32)},
            keep_batchnorm=True,
        ),
        ModelSpec(
            "mixer",
            lambda: tm.MixerBlock(tokens=196, channels=d, token_hidden=128),
            ("y",),
            {"x": batch, "y": batch},
            {"small": {"x": (1, 196, d)}, "large": {"x": (8, 196, d)}},
            {"x": (2, 196, d)},
        ),
    ]
    return {s.name: s for s in specs}


#: the model names, in table order
MODELS = ("bert", "gpt2", "llama_mlp", "lstm_cell", "lstm", "cnn", "mixer")


def export(spec: ModelSpec, folder: str | os.PathLike, seed: int) -> str:
    """Export ``spec``'s model (weights from ``seed``) to ``folder/<name>.onnx``."""
    import torch

    from bench.torch_models import export_onnx

    torch.manual_seed(seed)
    module = spec.build()
    rng = np.random.default_rng(seed)
    samples = {k: torch.from_numpy(v) for k, v in spec.samples(rng).items()}
    path = Path(folder) / f"{spec.name}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's notes on Python-int shapes
        return export_onnx(
            module, samples, path, list(spec.outputs), spec.axes, spec.keep_batchnorm
        )


def _size_label(spec: ModelSpec, size: str) -> str:
    first = next(iter(spec.sizes[size].values()))
    return f"{size} {'x'.join(map(str, first))}"


@dataclass
class ModelRun:
    """What one model's benchmark produced."""

    compiled: benchmark.CompileTime
    results: list[benchmark.Result]
    profiles: dict[str, list[benchmark.StepTime]]


def run_model(
    spec: ModelSpec, path: str, sizes: list[str], args: argparse.Namespace, cache: str
) -> ModelRun:
    """Compile ``path`` (kernel cache ``cache``), time it against onnxruntime at each size."""
    import geode

    rng = np.random.default_rng(1)
    feeds = {size: spec.feeds(size, rng) for size in sizes}
    first = feeds[sizes[0]]
    t0 = time.perf_counter()
    model = geode.compile(path, num_threads=args.threads, cache_dir=cache, progress=0)
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    model.run(first)
    compiled = benchmark.CompileTime(spec.name, compile_s, time.perf_counter() - t0)
    out = ModelRun(compiled, [], {})
    with contextlib.ExitStack() as stack:
        ort_fns = _ort_runners(path, feeds, sizes, args, compiled, stack)
        for size in sizes:
            f = feeds[size]
            res = benchmark.compare(
                spec.name,
                _size_label(spec, size),
                lambda f=f: model.run(f),
                ort_fns.get(size),
                args.rounds,
            )
            out.results.append(res)
            ratio = f", geode/ORT {res.ratio:.2f}" if res.ratio is not None else ""
            print(f"  {spec.name} {size}: geode {res.geode_s * 1e3:.3f} ms{ratio}", file=sys.stderr)
            if args.profile:
                out.profiles[res.size] = benchmark.step_profile(model, f)
    return out


def _ort_runners(
    path: str,
    feeds: dict[str, dict[str, np.ndarray]],
    sizes: list[str],
    args: argparse.Namespace,
    compiled: benchmark.CompileTime,
    stack: contextlib.ExitStack,
) -> dict[str, Callable[[], dict]]:
    """onnxruntime's call per size (none without onnxruntime), its session creation and
    first run recorded in ``compiled``: in a worker process of its own (the default), or
    with ``--same-process`` in this one."""
    if not benchmark.have_onnxruntime():
        return {}
    if args.same_process:
        t0 = time.perf_counter()
        sess = benchmark.ort_session(path, args.threads)
        compiled.ort_session_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        benchmark.ort_runner(sess, feeds[sizes[0]])()
        compiled.ort_first_s = time.perf_counter() - t0
        return {size: benchmark.ort_runner(sess, feeds[size]) for size in sizes}
    ort = stack.enter_context(IsolatedOrt(path, args.threads))
    runners = {size: ort.runner(feeds[size]) for size in sizes}
    compiled.ort_session_s = ort.session_s
    compiled.ort_first_s = runners[sizes[0]].first_s
    return runners


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS), help=f"of {', '.join(MODELS)}")
    ap.add_argument("--sizes", default=",".join(SIZES), help="small and/or large")
    ap.add_argument("--threads", type=int, default=2, help="for both systems (default 2)")
    ap.add_argument("--rounds", type=int, default=10, help="interleaved rounds (default 10)")
    ap.add_argument(
        "--same-process",
        action="store_true",
        help="run onnxruntime in this process (default: a worker process of its own, where "
        "its spinning threads do not take the cores of geode's next calls)",
    )
    ap.add_argument("--json", metavar="PATH", help="also save the results as JSON here")
    ap.add_argument("--profile", type=int, default=0, metavar="K", help="geode's K slowest steps")
    ap.add_argument("--onnx-dir", metavar="DIR", help="keep the exported models in DIR")
    args = ap.parse_args(argv)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    args.sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    for flag, given, known in (("--models", args.models, MODELS), ("--sizes", args.sizes, SIZES)):
        unknown = [x for x in given if x not in known]
        if unknown or not given:
            ap.error(f"{flag}: unknown or none {unknown}; choose from {', '.join(known)}")
    if args.threads < 1 or args.rounds < 1 or args.profile < 0:
        ap.error("--threads and --rounds must be >= 1, --profile >= 0")
    return args


def _load() -> float:
    """The one-minute load average (nan where the platform has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return float("nan")


def _report(args: argparse.Namespace, runs: list[ModelRun]) -> str:
    results = [r for run in runs for r in run.results]
    text = [
        f"threads {args.threads}, {args.rounds} interleaved rounds, onnxruntime in "
        f"{'this process' if args.same_process else 'a worker process of its own'}; "
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
        f"load average {args.load_before:.2f} before, {_load():.2f} after (other processes "
        "on the cores slow geode and onnxruntime unequally: compare runs at low load); "
        f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset (all cores)')}",
        "",
        benchmark.results_table(results),
        "",
        benchmark.summary(results),
        "",
        "compile (geode: empty kernel cache) and first run, at the first size:",
        "",
        benchmark.compile_table([run.compiled for run in runs]),
    ]
    for run in runs:
        for size, steps in run.profiles.items():
            res = next(r for r in run.results if r.size == size)
            text += ["", f"{run.compiled.model} {size}: geode's slowest steps", ""]
            text.append(benchmark.profile_table(steps, args.profile, res.geode_s))
    return "\n".join(text)


def _save_json(path: str, args: argparse.Namespace, runs: list[ModelRun]) -> None:
    results = [r for run in runs for r in run.results]
    ratios = [r.ratio for r in results if r.ratio]
    doc = {
        "threads": args.threads,
        "rounds": args.rounds,
        "machine": {"arch": platform.machine(), "cores": os.cpu_count()},
        "load_average": {"before": args.load_before, "after": _load()},
        "openblas_num_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
        "results": [r.as_dict() for r in results],
        "compile": [run.compiled.as_dict() for run in runs],
        "geomean_speedup": benchmark.geomean([1 / x for x in ratios]) if ratios else None,
        "profiles": {
            f"{run.compiled.model} {size}": [vars(s) for s in steps]
            for run in runs
            for size, steps in run.profiles.items()
        },
    }
    Path(path).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


def _warm_up_geode(cache: str) -> None:
    """Compile and run a one-op graph, so what geode does once per process (importing its
    code generator, starting LLVM) is not charged to the first model's compile."""
    import geode

    g = geode.Graph("warm_up")
    x = g.input("x", [4])
    g.output(x * 2.0, names=["y"])
    geode.compile(g, cache_dir=cache, progress=0)(x=np.ones(4, np.float32))


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the tables; 1 when an output is off by more than
    1e-3 relative, 2 when torch is missing."""
    args = _parse_args(argv)
    args.load_before = _load()
    try:  # before geode runs anything: torch keeps its own OpenMP runtime
        import torch
    except ImportError as exc:
        print(f"bench/models.py needs torch to export the models: {exc}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    if not benchmark.have_onnxruntime():
        print("onnxruntime is not installed: timing geode alone", file=sys.stderr)
    specs = _model_specs()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        _warm_up_geode(str(Path(tmp) / "cache" / "warm-up"))
        folder = args.onnx_dir or tmp
        Path(folder).mkdir(parents=True, exist_ok=True)
        for name in args.models:
            spec = specs[name]
            path = export(spec, folder, seed=MODELS.index(name))
            cache = str(Path(tmp) / "cache" / name)
            runs.append(run_model(spec, path, args.sizes, args, cache))
    print(_report(args, runs))
    if args.json:
        _save_json(args.json, args, runs)
    return 0 if all(r.accurate for run in runs for r in run.results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
