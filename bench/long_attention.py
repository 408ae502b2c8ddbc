"""Attention over long sequences: geode's key-tiled (online-softmax) attention against its
row panels and onnxruntime, side by side in one process, in paired interleaved blocks.

    PYTHONPATH=. python bench/long_attention.py [--lengths 2048,4096,8192] [--heads 4]
                                                [--depth 64] [--threads 2] [--blocks 10]
                                                [--mask none|add]

The model is ``softmax(Q K^T * 0.125 [+ mask]) @ V`` over ``q, k, v [1, H, S, D]``
(``mask``: an additive ``[S, S]`` input). geode compiles it to one dense step twice: on
row panels (per panel of query rows all the scores, the softmax, then ``P @ V``; the
module switch ``ONLINE_ATTENTION`` off) and key-tiled (``ONLINE_FORCE``); onnxruntime runs
the same ONNX model with ``intra_op_num_threads=--threads``. Per length and pair: the
ratio of their times per block of calls (the order alternated between blocks), the median
and IQR; and the largest differences from onnxruntime's results. Results:
``docs/performance.md``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import geode  # noqa: E402
import geode.codegen.epilogues as epilogues  # noqa: E402
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


def _compile(proto: bytes, threads: int, tiled: bool) -> geode.Model:
    """The model on row panels (the key-tiled softmax switched off) or key-tiled (forced
    whatever the profit rule says)."""
    saved = epilogues.ONLINE_ATTENTION, epilogues.ONLINE_FORCE
    epilogues.ONLINE_ATTENTION, epilogues.ONLINE_FORCE = tiled, tiled
    try:
        return geode.compile(proto, num_threads=threads, progress=0, model_cache=False)
    finally:
        epilogues.ONLINE_ATTENTION, epilogues.ONLINE_FORCE = saved


def measure(
    length: int, heads: int, depth: int, threads: int, blocks: int, mask: str
) -> dict[str, object]:
    """At one sequence length: per-block ratios key-tiled / row panels, key-tiled /
    onnxruntime and row panels / onnxruntime, the largest differences from onnxruntime's
    results, and the key-tiled model's explain() line for the attention."""
    import onnxruntime as ort

    proto = attention_model(mask)
    rng = np.random.default_rng(0)
    shape = (1, heads, length, depth)
    feeds = {n: rng.standard_normal(shape).astype(np.float32) for n in ("q", "k", "v")}
    if mask == "add":
        feeds["mask"] = np.where(rng.random((length, length)) < 0.1, -1e4, 0).astype(np.float32)
    rows, tiled = _compile(proto, threads, False), _compile(proto, threads, True)
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    sess = ort.InferenceSession(proto, so, providers=["CPUExecutionProvider"])
    want = sess.run(None, feeds)[0]
    diffs = [float(np.abs(m.run(feeds)["y"] - want).max()) for m in (tiled, rows)]
    flops = 4.0 * heads * length * length * depth
    calls = max(1, int(1e10 // flops))
    run_t, run_r = (lambda: tiled(**feeds)), (lambda: rows(**feeds))
    run_o = lambda: sess.run(None, feeds)  # noqa: E731
    line = next((x.strip() for x in tiled.explain().splitlines() if "softmax" in x), "")
    return {
        "tiled/rows": paired(run_t, run_r, blocks, calls),
        "tiled/ort": paired(run_t, run_o, blocks, calls),
        "rows/ort": paired(run_r, run_o, blocks, calls),
        "diffs": diffs,
        "plan": line,
    }


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
    print(
        "| S | key-tiled / row panels | key-tiled / onnxruntime | row panels / onnxruntime |"
        " max abs diff from onnxruntime (tiled, rows) |"
    )
    print("|---:|---:|---:|---:|---:|")
    for s in (int(x) for x in args.lengths.split(",")):
        r = measure(s, args.heads, args.depth, args.threads, args.blocks, args.mask)
        cells = " | ".join(summary(r[k]) for k in ("tiled/rows", "tiled/ort", "rows/ort"))
        d = r["diffs"]
        print(f"| {s} | {cells} | {d[0]:.1e}, {d[1]:.1e} |", flush=True)
        if args.plan:
            print(f"  {r['plan']}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
