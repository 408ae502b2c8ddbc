"""Winograd against the direct conv kernel and onnxruntime, one conv at a time.

    python bench/winograd.py [--rounds 9] [--threads 1,2] [--only SUBSTRING] [--calls N]
                             [--paths 2,3]

Each case is a one-layer ONNX model as the cnn of ``bench/models.py`` has them after
BatchNormalization is folded: a 3x3 conv (pads 1, stride 1, a bias) with its Relu and,
for the residual ones, the Add of a second input before it (geode fuses both into the
kernel). Timed: geode with ``conv_method="direct"``, geode with ``conv_method="winograd"``
and onnxruntime (``intra_op_num_threads`` = the thread count, spinning off so its
threads do not take the cores from geode's next calls), in interleaved rounds of
``--calls`` calls each; the report gives each system's best round (ms per call) and the
median over rounds of Winograd's time over the direct kernel's and over onnxruntime's.
The cases named ``cnn ...`` are the cnn's layers at its two sizes; the ``rule ...`` cases
(C = M from 8 to 128) are what the choice by channels (``WINOGRAD_MIN_CHANNELS``) rests on.

``--paths`` times the Winograd kernel alone on each of the given vector paths of the
native runtime (``_set_winograd_isa``: 0 plain C, 1 AVX2, 2 AVX-512VL, 3 AVX-512 zmm; the
paths the CPU cannot run are left out) in the same process, alternating paths in
``--rounds`` blocks; the report gives each path's median ms per call and the median
over blocks of its time over the first path's.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: name -> (N, C, M, H = W, residual)
CASES = {
    "cnn a1 32->32 +relu 8x112": (8, 32, 32, 112, False),
    "cnn a2 32->32 +res+relu 8x112": (8, 32, 32, 112, True),
    "cnn b2 64->64 +res+relu 8x56": (8, 64, 64, 56, True),
    "cnn a1 32->32 +relu 1x32": (1, 32, 32, 32, False),
    "cnn a2 32->32 +res+relu 1x32": (1, 32, 32, 32, True),
    "cnn b2 64->64 +res+relu 1x16": (1, 64, 64, 16, True),
    **{f"rule {c}->{c} 1x{h}": (1, c, c, h, False) for c in (8, 12, 16, 24) for h in (16, 56)},
    "rule 32->32 1x16": (1, 32, 32, 16, False),
    "rule 32->32 1x8": (1, 32, 32, 8, False),
    "rule 64->64 1x8": (1, 64, 64, 8, False),
    "rule 16->16 1x24": (1, 16, 16, 24, False),
    "rule 128->128 1x28": (1, 128, 128, 28, False),
    "rule 256->256 1x28": (1, 256, 256, 28, False),
    "rule 512->512 1x24": (1, 512, 512, 24, False),
}


def conv_model(n: int, c: int, m: int, h: int, residual: bool) -> onnx.ModelProto:
    """A 3x3 conv with bias, (+ Z,) Relu, fixed shapes."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((m, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32) * 0.1
    nodes = [helper.make_node("Conv", ["X", "W", "B"], ["c"], pads=[1] * 4)]
    ins = [helper.make_tensor_value_info("X", TensorProto.FLOAT, [n, c, h, h])]
    last = "c"
    if residual:
        ins.append(helper.make_tensor_value_info("Z", TensorProto.FLOAT, [n, m, h, h]))
        nodes.append(helper.make_node("Add", ["c", "Z"], ["a"]))
        last = "a"
    nodes.append(helper.make_node("Relu", [last], ["Y"]))
    outs = [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [n, m, h, h])]
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")]
    graph = helper.make_graph(nodes, "conv", ins, outs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def systems(model: onnx.ModelProto, threads: int, method: str = "winograd") -> dict:
    """name -> callable(feeds) for geode direct, geode Winograd (``conv_method=method``;
    ``auto``: Winograd where the rule by shape takes it) and onnxruntime."""
    import onnxruntime as ort

    import geode

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    direct = geode.compile(model, conv_method="direct", num_threads=threads)
    wino = geode.compile(model, conv_method=method, num_threads=threads)
    return {
        "direct": lambda f: direct(**f),
        "winograd": lambda f: wino(**f),
        "ort": lambda f: sess.run(None, f),
    }


def case_model(case: tuple) -> tuple[onnx.ModelProto, dict]:
    """A case's one-conv model and its random feeds (X, and Z for a residual)."""
    n, c, m, h, residual = case
    model = conv_model(n, c, m, h, residual)
    rng = np.random.default_rng(1)
    feeds = {"X": rng.standard_normal((n, c, h, h)).astype(np.float32)}
    if residual:
        feeds["Z"] = rng.standard_normal((n, m, h, h)).astype(np.float32)
    return model, feeds


def time_case(
    case: tuple, threads: int, rounds: int, calls: int, clock=time.perf_counter
) -> dict[str, list[float]]:
    """Per system, the ms per call of each round (rounds interleaved, order rotated),
    timed by ``clock``."""
    model, feeds = case_model(case)
    return time_model(model, feeds, threads, rounds, calls, clock)


def time_model(
    model: onnx.ModelProto,
    feeds: dict,
    threads: int,
    rounds: int,
    calls: int,
    clock,
    method: str = "winograd",
) -> dict[str, list[float]]:
    """:func:`time_case` for any one-output model and its feeds (its output checked
    against onnxruntime's first: within 1e-4 of its largest magnitude)."""
    runs = systems(model, threads, method)
    want = np.asarray(runs["ort"](feeds)[0])
    for name in ("direct", "winograd"):
        got = np.asarray(next(iter(runs[name](feeds).values())))
        err = float(np.abs(got - want).max() / max(1e-30, float(np.abs(want).max())))
        assert err < 1e-4, f"{name}: relative error {err}"
    times: dict[str, list[float]] = {k: [] for k in runs}
    names = list(runs)
    for r in range(rounds):
        for name in names[r % 3 :] + names[: r % 3]:
            fn = runs[name]
            fn(feeds)
            t0 = clock()
            for _ in range(calls):
                fn(feeds)
            times[name].append((clock() - t0) / calls * 1e3)
    return times


def time_paths(
    case: tuple, threads: int, rounds: int, calls: int, clock, paths: list[int]
) -> dict[int, list[float]]:
    """Per Winograd path, the ms per call of each block (blocks interleaved, the order
    reversed every other block), the path set by ``_set_winograd_isa`` before each."""
    import geode
    from geode.runtime import native

    model, feeds = case_model(case)
    wino = geode.compile(model, conv_method="winograd", num_threads=threads)
    old = native._ext._set_winograd_isa(-1)
    times: dict[int, list[float]] = {p: [] for p in paths}
    try:
        for r in range(rounds):
            for path in paths if r % 2 == 0 else paths[::-1]:
                native._ext._set_winograd_isa(path)
                wino(**feeds)
                t0 = clock()
                for _ in range(calls):
                    wino(**feeds)
                times[path].append((clock() - t0) / calls * 1e3)
    finally:
        native._ext._set_winograd_isa(old)
    return times


def _runnable(paths: list[int]) -> list[int]:
    """The paths of ``paths`` this CPU runs."""
    from geode.runtime import native

    old = native._ext._set_winograd_isa(-1)
    best = native._ext._set_winograd_isa(old)
    return [p for p in paths if p <= best]


def main(argv: list[str] | None = None) -> None:
    """Time the cases and print a table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--only", default="")
    p.add_argument("--calls", type=int, default=0, help="calls per round (0: by size)")
    p.add_argument(
        "--cpu",
        action="store_true",
        help="one thread's CPU time (time.thread_time) instead of wall time, for --threads 1 "
        "on a loaded machine: every system then runs on the calling thread",
    )
    p.add_argument(
        "--model",
        default="",
        help="time this ONNX model (one float32 input) instead of the cases: geode's "
        "conv_method direct against auto (Winograd by shape) and onnxruntime",
    )
    p.add_argument("--shape", default="1x3x64x64", help="--model's input shape")
    p.add_argument(
        "--paths",
        default="",
        help="time the Winograd kernel on these vector paths against each other (e.g. 2,3)",
    )
    a = p.parse_args(argv)
    clock = time.thread_time if a.cpu else time.perf_counter
    if a.paths:
        _paths_table(a, clock)
        return
    if a.model:
        model = onnx.load(a.model)
        shape = tuple(int(d) for d in a.shape.split("x"))
        x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
        feeds = {model.graph.input[0].name: x}
        print("| model | threads | direct ms | auto ms | ORT ms | auto/direct | auto/ORT |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for threads in [int(t) for t in a.threads.split(",")]:
            t = time_model(model, feeds, threads, a.rounds, a.calls or 10, clock, "auto")
            _row(f"{a.model} {a.shape}", threads, t)
        return
    print("| case | threads | direct ms | winograd ms | ORT ms | wino/direct | wino/ORT |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, case in CASES.items():
        if a.only not in name:
            continue
        for threads in [int(t) for t in a.threads.split(",")]:
            calls = _calls(a, case)
            if a.cpu and threads != 1:
                p.error("--cpu times one thread only (--threads 1)")
            _row(name, threads, time_case(case, threads, a.rounds, calls, clock))


def _calls(a: argparse.Namespace, case: tuple) -> int:
    """Calls per timed block: ``--calls``, else about 2e8 multiply-adds' worth."""
    n, c, m, h, _ = case
    return a.calls or max(1, int(2e8 // (n * c * m * h * h * 9)))


def _paths_table(a: argparse.Namespace, clock) -> None:
    """The ``--paths`` report: each case's median ms per path and ratios to the first."""
    paths = _runnable([int(v) for v in a.paths.split(",")])
    cols = " | ".join(f"path {p} ms" for p in paths)
    ratios = " | ".join(f"{p}/{paths[0]}" for p in paths[1:])
    print(f"| case | threads | {cols} | {ratios} |")
    print("|---|---:|" + "---:|" * (2 * len(paths) - 1))
    for name, case in CASES.items():
        if a.only not in name:
            continue
        for threads in [int(t) for t in a.threads.split(",")]:
            calls = _calls(a, case)
            t = time_paths(case, threads, a.rounds, calls, clock, paths)
            base = t[paths[0]]
            meds = " | ".join(f"{statistics.median(t[p]):.3f}" for p in paths)
            rs = " | ".join(
                f"{statistics.median(x / y for x, y in zip(t[p], base)):.2f}" for p in paths[1:]
            )
            print(f"| {name} | {threads} | {meds} | {rs} |", flush=True)


def _row(name: str, threads: int, t: dict[str, list[float]]) -> None:
    """One table row: best rounds, medians of the per-round ratios."""
    rd = statistics.median(w / d for w, d in zip(t["winograd"], t["direct"]))
    ro = statistics.median(w / o for w, o in zip(t["winograd"], t["ort"]))
    best = {k: min(v) for k, v in t.items()}
    print(
        f"| {name} | {threads} | {best['direct']:.3f} | {best['winograd']:.3f} | "
        f"{best['ort']:.3f} | {rd:.2f} | {ro:.2f} |",
        flush=True,
    )


if __name__ == "__main__":
    main()
