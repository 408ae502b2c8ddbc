"""float32 GEMMs against constant weights: numpy (OpenBLAS), ``geode_gemm`` as the dense
entry called it before, geode's packed-weight kernel, and onnxruntime's MatMul.

    PYTHONPATH=. python bench/packed_gemm.py [--threads 1,2] [--rounds 5] [--shapes small]
                                             [--rows 2048] [--ort-spin] [--json out.json]

Per shape ``M x K x N`` (the rows of the models of ``bench/models.py``: 1, 32, 196/197 and
2048, against their weights ``K x N``, plus two large ones) and thread count: numpy's
``matmul`` into a preallocated output, ``geode_gemm`` (``runtime/native/gemm.c``: BLAS
blocks over the pool, or geode's ``sgemm_thin.c`` kernel for small products; on AVX-512
CPUs the packed kernel with B packed per call, ``geode_sgemm_wide``), the packed
kernel (``runtime/native/sgemm_packed.c``, the weight packed once beforehand) and a
one-node onnxruntime MatMul whose ``B`` is an initializer (onnxruntime's MLAS packs it
once at session creation; called through an IO binding, so its call costs a few
microseconds more than the ctypes calls of the others). onnxruntime's intra-op workers
sleep after a call here (``session.intra_op.allow_spinning`` 0): left spinning, as they
do by default, they hold a core while the next way in the round runs, and on two cores
the two-thread figures of the others then measure that contention (``--ort-spin`` keeps
onnxruntime's default, to see it). Times are the medians of
interleaved rounds (:func:`geode.costmodel.profiling.measure_interleaved`), in
microseconds; the ratios are packed / each other (below 1: the packed kernel is faster).
Results: ``docs/performance.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from geode.codegen.backends.llvm.library import blas, share_pool  # noqa: E402
from geode.costmodel.profiling import measure_interleaved  # noqa: E402
from geode.runtime import native  # noqa: E402

#: the models' weights (K x N): BERT/GPT-2 projections, their MLPs, the Llama MLP's 688
WEIGHTS = [(256, 256), (256, 768), (256, 1024), (1024, 256), (256, 688), (688, 256)]
ROWS = [1, 32, 197, 2048]
LARGE = [(2048, 1024, 1024), (512, 1024, 4096)]


def shapes(which: str) -> list[tuple[int, int, int]]:
    """``M x K x N`` triples: ``small`` only M <= 197, ``all`` every row count and the
    large ones."""
    rows = [m for m in ROWS if which == "all" or m <= 197]
    out = [(m, k, n) for m in rows for k, n in WEIGHTS]
    return out + (LARGE if which == "all" else [])


def ort_session(b: np.ndarray, m: int, threads: int, spin: bool = False):
    """onnxruntime's one-node ``Y = X @ B`` with ``B`` an initializer; ``spin``: its
    intra-op workers spin after a call (onnxruntime's default) instead of sleeping."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    k, n = b.shape
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "B"], ["Y"])],
        "mm",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [m, n])],
        [numpy_helper.from_array(b, "B")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    sess = ort.InferenceSession(
        onnx._serialize(model) if hasattr(onnx, "_serialize") else model.SerializeToString(),
        so,
        providers=["CPUExecutionProvider"],
    )
    return sess


def measure(
    m: int, k: int, n: int, threads: int, rounds: int, ort_spin: bool = False
) -> dict[str, float]:
    """Median microseconds of the four ways for one shape and thread count."""
    lib = blas()  # geode_gemm calls the BLAS it is given
    if lib is None:
        raise RuntimeError("no BLAS found in numpy's wheel")
    share_pool(lib)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    bp = native.pack_weight(b)
    outs = {name: np.empty((m, n), np.float32) for name in ("numpy", "gemm", "packed", "ort")}
    gemm, packed = native.gemm_function(), native.packed_gemm_function()
    pa, pb, pbp = a.ctypes.data, b.ctypes.data, bp.ctypes.data
    cg, cp = outs["gemm"].ctypes.data, outs["packed"].ctypes.data
    sess = ort_session(b, m, threads, ort_spin)
    binding = sess.io_binding()
    binding.bind_cpu_input("X", a)
    binding.bind_output("Y", "cpu", 0, np.float32, (m, n), outs["ort"].ctypes.data)
    native.set_num_threads(threads)
    fns = {
        "numpy": lambda: np.matmul(a, b, out=outs["numpy"]),
        "gemm": lambda: gemm(0, m, n, k, pa, k, pb, n, 0.0, cg, n, threads),
        "packed": lambda: packed(m, n, k, 1.0, pa, k, pbp, 0.0, cp, n, threads),
        "ort": lambda: sess.run_with_iobinding(binding),
    }
    timings = measure_interleaved(fns, rounds=rounds, max_time=3.0)
    ref = a.astype(np.float64) @ b
    scale = float(np.abs(ref).max()) or 1.0
    for name, out in outs.items():
        err = float(np.abs(out - ref).max()) / scale
        if err > 1e-5:
            raise AssertionError(f"{name} {m}x{k}x{n}: relative error {err:.1e}")
    return {name: t.median * 1e6 for name, t in timings.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--shapes", choices=("small", "all"), default="all")
    ap.add_argument("--rows", default="", help="only these M (comma-separated)")
    ap.add_argument("--ort-spin", action="store_true", help="onnxruntime's workers spin")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    lib = blas()
    if lib is None:
        print("no BLAS found in numpy's wheel")
        return 1
    share_pool(lib)
    isa = ["plain C", "AVX2", "AVX-512"][native.pool_info()["gemm_packed_isa"]]
    print(f"packed kernel path: {isa}")
    print(
        "| M x K x N | thr | numpy us | geode_gemm us | packed us | ORT us |"
        " packed/numpy | packed/gemm | packed/ORT |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows = []
    for t in (int(x) for x in args.threads.split(",")):
        keep = {int(x) for x in args.rows.split(",")} if args.rows else None
        for m, k, n in shapes(args.shapes):
            if keep is not None and m not in keep:
                continue
            r = measure(m, k, n, t, args.rounds, args.ort_spin)
            rows.append({"m": m, "k": k, "n": n, "threads": t, **r})
            p = r["packed"]
            print(
                f"| {m} x {k} x {n} | {t} | {r['numpy']:.1f} | {r['gemm']:.1f} | {p:.1f} | "
                f"{r['ort']:.1f} | {p / r['numpy']:.2f} | {p / r['gemm']:.2f} | "
                f"{p / r['ort']:.2f} |",
                flush=True,
            )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
