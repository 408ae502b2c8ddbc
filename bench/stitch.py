"""Reduce trees (chained reductions over different axes in one kernel) and stitches (a
row and a column reduction of one input in one kernel) against the same reductions as
separate kernels (``stitch_fusion=False``), numpy and onnxruntime.

    python bench/stitch.py [--threads 0] [--rounds 15] [--case NAME ...] [--json out.json]

Each case is a float32 chain (a mean over HW then over C of ``[N, C, HW]``, a sum of
squares over W then H of ``[N, C, H, W]``, ...) compiled twice by geode in one process
(fused: one kernel; unfused: one kernel per reduction, the intermediate through
memory), run by numpy and, when installed, by onnxruntime. A *stitch* case (``kind=
"rowcol"``: a row reduction over the trailing axes and a column reduction over the
leading ones of the same input, optionally of its square, two outputs) compiles to one
kernel that reads the input once against two kernels that read it twice. The four run
in interleaved
rounds (:func:`geode.benchmark.interleave`); printed are each one's median time per
call and the medians and interquartile ranges of the per-round ratios fused / unfused,
fused / numpy and fused / onnxruntime, with the largest output difference, the kernel
counts and the load average (the machine may be shared: compare ratios, not times).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import geode  # noqa: E402
from geode.benchmark import (  # noqa: E402
    have_onnxruntime,
    interleave,
    max_rel_error,
    ort_runner,
    ort_session,
    quartiles,
)


@dataclass(frozen=True)
class Case:
    """A chain of reductions (``kind="tree"``: input shape, each level's axes in turn,
    the op, a squared input), or a row and a column reduction of one input
    (``kind="rowcol"``: ``levels`` the row's axes then the column's, ``ops`` theirs)."""

    name: str
    shape: tuple[int, ...]
    levels: tuple[tuple[int, ...], ...]
    op: str = "ReduceSum"
    square: bool = False
    kind: str = "tree"
    ops: tuple[str, str] = ("ReduceSum", "ReduceSum")


CASES = [
    Case("mean_hw_then_c", (256, 256, 196), ((2,), (1,)), "ReduceMean"),
    Case("sum_hw_then_c_small", (64, 64, 49), ((2,), (1,))),
    Case("sumsq_w_then_h", (32, 64, 56, 56), ((3,), (2,)), square=True),
    Case("max_hw_then_c", (128, 512, 49), ((2,), (1,)), "ReduceMax"),
    Case("rowsum_colsum", (4096, 1024), ((1,), (0,)), kind="rowcol"),
    Case("rowsum_colsum_large", (16384, 1024), ((1,), (0,)), kind="rowcol"),
    Case("rowsum_colsum_small", (256, 64), ((1,), (0,)), kind="rowcol"),
    Case("rowsum_colsum_tall", (65536, 64), ((1,), (0,)), kind="rowcol"),
    Case(
        "rowmean_colsum_sq_3d",
        (32, 128, 512),
        ((2,), (0, 1)),
        square=True,
        kind="rowcol",
        ops=("ReduceMean", "ReduceSum"),
    ),
    Case("rowmax_colmax", (2048, 1024), ((1,), (0,)), kind="rowcol", ops=("ReduceMax",) * 2),
]

NUMPY = {"ReduceSum": np.sum, "ReduceMean": np.mean, "ReduceMax": np.max}


def graph(case: Case) -> geode.Graph:
    """The case as a geode graph (symbolic leading dim, keepdims=1)."""
    g = geode.Graph(case.name)
    x = g.input("x", ["N", *case.shape[1:]], np.float32)
    v = g.op("Mul", x, x) if case.square else x
    if case.kind == "rowcol":
        r, c = (
            g.op(op, v, g.constant(np.array(axes, np.int64)), keepdims=1)
            for op, axes in zip(case.ops, case.levels)
        )
        g.output(r, c, names=["r", "c"])
        return g
    for axes in case.levels:
        v = g.op(case.op, v, g.constant(np.array(axes, np.int64)), keepdims=1)
    g.output(v, names=["y"])
    return g


def numpy_fn(case: Case) -> Callable[[np.ndarray], dict[str, np.ndarray]]:
    """The case in numpy (outputs by name)."""

    def fn(x: np.ndarray) -> dict[str, np.ndarray]:
        v = x * x if case.square else x
        if case.kind == "rowcol":
            return {
                k: NUMPY[op](v, axis=axes, keepdims=True)
                for k, op, axes in zip("rc", case.ops, case.levels)
            }
        for axes in case.levels:
            v = NUMPY[case.op](v, axis=axes, keepdims=True)
        return {"y": v}

    return fn


def run_case(case: Case, threads: int, rounds: int) -> dict:
    """Compile, check and time one case; its row of results."""
    opts = {"num_threads": threads, "model_cache": False}
    fused = geode.compile(graph(case), **opts)
    unfused = geode.compile(graph(case), stitch_fusion=False, **opts)
    x = np.random.default_rng(0).standard_normal(case.shape, dtype=np.float32)
    ref = numpy_fn(case)
    want = ref(x)
    fns: dict[str, Callable[[], object]] = {
        "fused": lambda: fused(x=x),
        "unfused": lambda: unfused(x=x),
        "numpy": lambda: ref(x),
    }
    err = max(max_rel_error(fused(x=x), want), max_rel_error(unfused(x=x), want))
    if have_onnxruntime():
        from geode.compiler.frontend.onnx_export import to_onnx

        sess = ort_session(to_onnx(graph(case)).SerializeToString(), threads or os.cpu_count())
        fns["onnxruntime"] = ort_runner(sess, {"x": x})
        err = max(err, max_rel_error(fns["onnxruntime"](), want))
    times = interleave(fns, rounds)
    row = {
        "case": case.name,
        "shape": list(case.shape),
        "kernels": {"fused": len(fused.kernels), "unfused": len(unfused.kernels)},
        "median_ms": {k: quartiles(v)[1] * 1e3 for k, v in times.items()},
        "max_rel_error": err,
        "ratios": {},
    }
    for other in [k for k in fns if k != "fused"]:
        r = [a / b for a, b in zip(times["fused"], times[other])]
        row["ratios"][f"fused/{other}"] = quartiles(r)
    return row


def describe(row: dict) -> str:
    """One case's lines of text."""
    ms = "  ".join(f"{k} {v:.3f} ms" for k, v in row["median_ms"].items())
    ratios = "  ".join(f"{k} {q[1]:.2f} [{q[0]:.2f}, {q[2]:.2f}]" for k, q in row["ratios"].items())
    k = row["kernels"]
    return (
        f"{row['case']} {row['shape']} (kernels fused {k['fused']}, unfused {k['unfused']}, "
        f"max rel error {row['max_rel_error']:.1e})\n  {ms}\n  {ratios}"
    )


def main() -> None:
    """Parse the arguments, run the cases, print (and save) the results."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=0, help="0: all cores")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--case", action="append", choices=[c.name for c in CASES])
    p.add_argument("--kind", choices=["tree", "rowcol"], help="only the cases of this kind")
    p.add_argument("--json")
    a = p.parse_args()
    print(f"load average before: {os.getloadavg()}")
    rows = []
    for case in CASES:
        if a.case and case.name not in a.case or a.kind and case.kind != a.kind:
            continue
        rows.append(run_case(case, a.threads, a.rounds))
        print(describe(rows[-1]), flush=True)
    print(f"load average after: {os.getloadavg()}")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
