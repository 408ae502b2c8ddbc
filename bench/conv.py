"""Native Conv against the AICPU reference kernel and onnxruntime.

    python bench/conv.py [--rounds 15] [--threads 2] [--isolated] [--only NAME]

Each case is a one-Conv ONNX model (constant weights and bias, batch 1): geode with
the native conv (the default), geode with codegen off (every node on the AICPU engine:
the numpy reference kernel that ran Conv before), and onnxruntime with
``intra_op_num_threads`` threads. Calls are timed in interleaved rounds; the report is
the median time per call, the medians of the per-round ratios and the ratio of the
best rounds (on a shared machine the least disturbed). With ``--isolated``
every timing runs in a fresh process: one system's thread pool never meets another's
(in one process OpenBLAS's and onnxruntime's spinning threads slow each other down).

The GEMMs of the native conv run on the threads of numpy's OpenBLAS, whose count comes
from ``OPENBLAS_NUM_THREADS`` (default: every core): run with
``OPENBLAS_NUM_THREADS=<threads>`` to compare at one thread count (the report's first
line says what OpenBLAS uses). ``--threads`` sets geode's (the depthwise kernel's pool)
and onnxruntime's.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: name -> (x shape, w shape, attributes)
CASES = {
    "resnet conv3x3 64->64 56x56": ((1, 64, 56, 56), (64, 64, 3, 3), {"pads": [1, 1, 1, 1]}),
    "resnet conv3x3 128->128 28x28": ((1, 128, 28, 28), (128, 128, 3, 3), {"pads": [1, 1, 1, 1]}),
    "conv3x3 s2 64->128 56x56": (
        (1, 64, 56, 56),
        (128, 64, 3, 3),
        {"pads": [1, 1, 1, 1], "strides": [2, 2]},
    ),
    "pointwise 1x1 64->256 56x56": ((1, 64, 56, 56), (256, 64, 1, 1), {}),
    "depthwise 3x3 64ch 56x56": (
        (1, 64, 56, 56),
        (64, 1, 3, 3),
        {"pads": [1, 1, 1, 1], "group": 64},
    ),
    "depthwise 3x3 256ch 28x28": (
        (1, 256, 28, 28),
        (256, 1, 3, 3),
        {"pads": [1, 1, 1, 1], "group": 256},
    ),
    "depthwise 3x3 s2 128ch 56x56": (
        (1, 128, 56, 56),
        (128, 1, 3, 3),
        {"pads": [1, 1, 1, 1], "group": 128, "strides": [2, 2]},
    ),
    # the convs of bench/models.py's cnn (ResNet-style, width 32), small and large batch
    "cnn stem 3->32 64x64": ((1, 3, 64, 64), (32, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
    "cnn a 32->32 32x32": ((1, 32, 32, 32), (32, 32, 3, 3), {"pads": [1, 1, 1, 1]}),
    "cnn b1 s2 32->64 32x32": (
        (1, 32, 32, 32),
        (64, 32, 3, 3),
        {"pads": [1, 1, 1, 1], "strides": [2, 2]},
    ),
    "cnn b2 64->64 16x16": ((1, 64, 16, 16), (64, 64, 3, 3), {"pads": [1, 1, 1, 1]}),
    "cnn stem 3->32 224x224 b8": ((8, 3, 224, 224), (32, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
    "cnn a 32->32 112x112 b8": ((8, 32, 112, 112), (32, 32, 3, 3), {"pads": [1, 1, 1, 1]}),
    "cnn b1 s2 32->64 112x112 b8": (
        (8, 32, 112, 112),
        (64, 32, 3, 3),
        {"pads": [1, 1, 1, 1], "strides": [2, 2]},
    ),
    "cnn b2 64->64 56x56 b8": ((8, 64, 56, 56), (64, 64, 3, 3), {"pads": [1, 1, 1, 1]}),
}


def conv_model(xs: tuple, ws: tuple, attrs: dict) -> onnx.ModelProto:
    """One Conv with constant weights and bias."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal(ws).astype(np.float32) * 0.1
    b = rng.standard_normal(ws[0]).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)
    g = helper.make_graph(
        [node],
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(xs))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _time(fn, seconds: float = 0.2, settle: float = 0.3) -> float:
    """Seconds per call of ``fn`` over about ``seconds`` of calls, after ``settle``
    seconds of sleep and three untimed calls: the thread pools of the system timed
    before (OpenBLAS's threads spin for tens of milliseconds after a GEMM, onnxruntime's
    after a run) must not take this one's cores."""
    time.sleep(settle)
    for _ in range(3):
        fn()
    n, t0 = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        dt = time.perf_counter() - t0
        if dt > seconds and n >= 3:
            return dt / n


SYSTEMS = ("native", "aicpu", "ort")
#: the systems a run times (``--no-aicpu`` drops the slow reference kernel)
ACTIVE = list(SYSTEMS)


def runner(system: str, name: str, threads: int):
    """``(call, result)``: a no-argument call running case ``name`` on ``system``, and
    its output."""
    xs, ws, attrs = CASES[name]
    model = conv_model(xs, ws, attrs)
    x = np.random.default_rng(1).standard_normal(xs).astype(np.float32)
    if system == "ort":
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        sess = ort.InferenceSession(
            model.SerializeToString(), so, providers=["CPUExecutionProvider"]
        )
        return (lambda: sess.run(None, {"x": x})), sess.run(None, {"x": x})[0]
    import geode

    if system == "native":
        compiled = geode.compile(model, num_threads=threads)
        assert [k.kind for k in compiled.kernels] == ["library"], compiled.explain()
    else:
        compiled = geode.compile(model, codegen=False)
    return (lambda: compiled(x=x)), compiled(x=x)["y"]


def run_case(name: str, rounds: int, threads: int, isolated: bool) -> dict[str, float]:
    """Timings of one case, the systems interleaved round by round (each in a process
    of its own with ``isolated``): medians (ms) and median ratios."""
    times: dict[str, list[float]] = {k: [] for k in ACTIVE}
    if isolated:
        for _ in range(rounds):
            for k in ACTIVE:
                cmd = [sys.executable, __file__, "--one", k, "--case", name]
                out = subprocess.run(
                    [*cmd, "--threads", str(threads)], capture_output=True, text=True, check=True
                )
                times[k].append(float(out.stdout.split()[-1]))
        err = float("nan")
    else:
        calls = {k: runner(k, name, threads) for k in ACTIVE}
        want, got = calls["ort"][1], calls["native"][1]
        err = float(np.abs(got - want).max() / max(1e-6, np.abs(want).max()))
        for _ in range(rounds):
            for k, (fn, _) in calls.items():
                times[k].append(_time(fn))
    ratios = {
        "native/ort": statistics.median(n / o for n, o in zip(times["native"], times["ort"])),
        "aicpu/native": statistics.median(
            a / n for a, n in zip(times.get("aicpu", [np.nan]), times["native"])
        ),
        "best native/ort": min(times["native"]) / min(times["ort"]),
    }
    medians = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    return {"aicpu": float("nan"), **medians, **ratios, "err": err}


def blas_threads() -> int | None:
    """The thread count of numpy's OpenBLAS (None when it cannot be asked)."""
    import ctypes

    from geode.codegen.backends.llvm.library import blas

    lib = blas()
    if lib is None or lib.where == "process":
        return None
    for name in ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_"):
        fn = getattr(ctypes.CDLL(lib.where), name, None)
        if fn is not None:
            fn.restype = ctypes.c_int
            return int(fn())
    return None


def main() -> None:
    """Run every case and print a table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", default="", help="run the cases whose name contains this")
    ap.add_argument("--isolated", action="store_true", help="each system in its own process")
    ap.add_argument("--no-aicpu", action="store_true", help="skip the AICPU reference kernel")
    ap.add_argument("--one", choices=SYSTEMS, help=argparse.SUPPRESS)
    ap.add_argument("--case", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.no_aicpu:
        ACTIVE.remove("aicpu")
    if args.one:  # a child of --isolated: print seconds per call of one system
        fn, _ = runner(args.one, args.case, args.threads)
        print(_time(fn, seconds=1.0, settle=0.0))
        return
    print(f"threads: geode {args.threads}, onnxruntime {args.threads}, OpenBLAS {blas_threads()}")
    print(
        f"{'case':32} {'native ms':>10} {'aicpu ms':>10} {'ort ms':>10} "
        f"{'native/ort':>10} {'aicpu/native':>12} {'best n/o':>9} {'rel err':>9}"
    )
    for name in CASES:
        if args.only not in name:
            continue
        r = run_case(name, args.rounds, args.threads, args.isolated)
        print(
            f"{name:32} {r['native']:10.3f} {r['aicpu']:10.3f} {r['ort']:10.3f} "
            f"{r['native/ort']:10.2f} {r['aicpu/native']:12.2f} {r['best native/ort']:9.2f} "
            f"{r['err']:9.1e}"
        )


if __name__ == "__main__":
    main()
