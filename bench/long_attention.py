"""Attention over long sequences: geode's fused attention against onnxruntime, side by
side in one process, in paired interleaved blocks (issue 38's baseline).

    PYTHONPATH=. python bench/long_attention.py [--lengths 2048,4096,8192] [--heads 4]
                                                [--depth 64] [--threads 2] [--blocks 10]
                                                [--mask none|add]

The model is ``softmax(Q K^T * 0.125 [+ mask]) @ V`` over ``q, k, v [1, H, S, D]``
(``mask``: an additive ``[S, S]`` input). geode compiles it to one dense step (per panel
of query rows the scores, the softmax, then ``P @ V``); onnxruntime runs the same ONNX
model with ``intra_op_num_threads=--threads``. Per length: the ratio geode / onnxruntime
per block of calls (their order alternated between blocks), the median and IQR, and the
largest difference between the two results. Results: ``docs/performance.md``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import geode  # noqa: E402
from bench.llama_mlp import paired, summary  # noqa: E402


def attention_model(mask: str) -> bytes:
    """The attention model (see the module docstring), serialized."""
    dims = [1, "H", "S", "D"]
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, dims) for n in ("q", "k", "v")]
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["sc"]),
        helper.make_node("Mul", ["sc", "scale"], ["sd"]),
    ]
    last = "sd"
    if mask == "add":
        ins.append(helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["S", "S"]))
        nodes.append(helper.make_node("Add", ["sd", "mask"], ["sm"]))
        last = "sm"
    nodes.append(helper.make_node("Softmax", [last], ["p"], axis=-1))
    nodes.append(helper.make_node("MatMul", ["p", "v"], ["y"]))
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)
    scale = numpy_helper.from_array(np.array(0.125, np.float32), "scale")
    graph = helper.make_graph(nodes, "attention", ins, [out], [scale])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model.SerializeToString()


def measure(
    length: int, heads: int, depth: int, threads: int, blocks: int, mask: str
) -> dict[str, object]:
    """geode over onnxruntime at one sequence length: per-block ratios, the largest
    difference of the results, and geode's explain() line for the attention."""
    import onnxruntime as ort

    proto = attention_model(mask)
    rng = np.random.default_rng(0)
    shape = (1, heads, length, depth)
    feeds = {n: rng.standard_normal(shape).astype(np.float32) for n in ("q", "k", "v")}
    if mask == "add":
        feeds["mask"] = np.where(rng.random((length, length)) < 0.1, -1e4, 0).astype(np.float32)
    model = geode.compile(proto, num_threads=threads, progress=0, model_cache=False)
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    sess = ort.InferenceSession(proto, so, providers=["CPUExecutionProvider"])
    got, want = model.run(feeds)["y"], sess.run(None, feeds)[0]
    flops = 4.0 * heads * length * length * depth
    calls = max(1, int(2e10 // flops))
    ratios = paired(lambda: model(**feeds), lambda: sess.run(None, feeds), blocks, calls)
    line = next((x.strip() for x in model.explain().splitlines() if "softmax" in x), "")
    return {"ratios": ratios, "diff": float(np.abs(got - want).max()), "plan": line}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", default="2048,4096,8192")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--depth", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--blocks", type=int, default=10)
    p.add_argument("--mask", choices=("none", "add"), default="none")
    p.add_argument("--plan", action="store_true", help="print geode's decision per length")
    args = p.parse_args(argv)
    print("| S | geode / onnxruntime (median, IQR) | max abs diff |")
    print("|---:|---:|---:|")
    for s in (int(x) for x in args.lengths.split(",")):
        r = measure(s, args.heads, args.depth, args.threads, args.blocks, args.mask)
        print(f"| {s} | {summary(r['ratios'])} | {r['diff']:.1e} |", flush=True)
        if args.plan:
            print(f"  {r['plan']}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
