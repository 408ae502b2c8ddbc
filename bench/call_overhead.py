"""Per-call overhead of a compiled model made of many small static steps, against
onnxruntime on the same ONNX graph.

    python bench/call_overhead.py [--layers 10] [--batch 4] [--width 16] [--calls 2000]

The model is ``layers`` blocks of ``h = relu(h @ W + b)`` on ``[batch, width]`` floats
(2 steps per block in geode: the MatMul and the fused bias+ReLU kernel), small enough
that the time per call is the cost of dispatching its steps. Both systems run on one
thread; the calls are timed in interleaved rounds and the medians compared. Reports
microseconds per call and per step, and the ratio geode / onnxruntime (the target is 2x
at most).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def mlp_model(layers: int, batch: int, width: int) -> onnx.ModelProto:
    """``layers`` blocks of ``relu(h @ W + b)`` as an ONNX model (static shapes)."""
    rng = np.random.default_rng(0)
    nodes, inits, h = [], [], "x"
    for i in range(layers):
        w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        b = rng.standard_normal(width).astype(np.float32) * 0.1
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes += [
            helper.make_node("MatMul", [h, f"w{i}"], [f"m{i}"]),
            helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"]),
            helper.make_node("Relu", [f"a{i}"], [f"h{i}"]),
        ]
        h = f"h{i}"
    nodes.append(helper.make_node("Identity", [h], ["y"]))
    g = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, width])],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _per_call(fn, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=10)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args(argv)
    import onnxruntime as ort

    import geode

    model = mlp_model(args.layers, args.batch, args.width)
    x = np.random.default_rng(1).standard_normal((args.batch, args.width)).astype(np.float32)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    compiled = geode.compile(model, num_threads=1, progress=0)
    want = sess.run(None, {"x": x})[0]
    np.testing.assert_allclose(compiled(x=x)["y"], want, rtol=1e-5, atol=1e-6)
    steps = len(compiled.plan.steps) if hasattr(compiled, "plan") else None
    runs = {
        "geode": lambda: compiled(x=x),
        "onnxruntime": lambda: sess.run(None, {"x": x}),
    }
    for fn in runs.values():  # warm up
        _per_call(fn, 100)
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(args.rounds):
        for name, fn in runs.items():
            times[name].append(_per_call(fn, args.calls))
    ratio = statistics.median(g / o for g, o in zip(times["geode"], times["onnxruntime"]))
    med = {k: statistics.median(v) * 1e6 for k, v in times.items()}
    print(
        f"model: {args.layers} x relu(h @ W + b) on [{args.batch}, {args.width}]; geode steps: {steps}"
    )
    for k, v in med.items():
        print(f"  {k:<12} {v:8.1f} us/call")
    print(f"  geode / onnxruntime: {ratio:.2f}x (median of per-round ratios)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
