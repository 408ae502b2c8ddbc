"""The Llama MLP block (``bench/models.py``'s ``llama_mlp``) against its bare GEMMs, and
a compile option's variant against the default, in paired interleaved blocks.

    PYTHONPATH=. python bench/llama_mlp.py [--onnx /tmp/onnx/llama_mlp.onnx] [--threads 2,1]
                                           [--sizes small,large] [--blocks 15]
                                           [--option row_scale_gemms=false]

The block compiles to one dense step (RMSNorm as a row-scale prologue, gate and up
GEMMs, the SiLU-gated epilogue, the down GEMM with the residual in its store). Per size
and thread count: the compiled model's call against the three packed-weight GEMMs of the
same shapes called bare (``geode_sgemm_packed`` through ctypes, gate ``rows x dim x
hidden``, up likewise, down ``rows x hidden x dim``), and with ``--option`` a variant
compiled with that option against the default. Each pair runs in alternating order in
``--blocks`` blocks of calls; the figure is the median of the per-block ratios (IQR), the
robust one on a shared machine. Results: ``docs/performance.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import geode  # noqa: E402
from geode.runtime import native  # noqa: E402

#: (batch, sequence) of the input ``[batch, seq, dim]`` per size, as in bench/models.py
SIZES = {"small": (1, 32), "large": (8, 256)}


class BareGemms:
    """The block's three products against packed random weights (gate and up ``dim x
    hidden``, down ``hidden x dim``), each a bare ``geode_sgemm_packed`` call on
    ``threads`` threads; ``outputs`` holds their last results, ``inputs`` ``A`` and ``H``."""

    def __init__(self, rows: int, dim: int, hidden: int, threads: int, seed: int = 1):
        rng = np.random.default_rng(seed)
        f32 = np.float32
        self.inputs = (
            rng.standard_normal((rows, dim)).astype(f32),
            rng.standard_normal((rows, hidden)).astype(f32),
        )
        self.weights = [rng.standard_normal(s).astype(f32) for s in [(dim, hidden)] * 2]
        self.weights.append(rng.standard_normal((hidden, dim)).astype(f32))
        self._packed = [native.pack_weight(w) for w in self.weights]
        self.outputs = [np.empty((rows, w.shape[1]), f32) for w in self.weights]
        self._fn = native.packed_gemm_function()
        self._shape = (rows, dim, hidden, threads)

    def __call__(self) -> None:
        rows, _, _, threads = self._shape
        for i, (b, c) in enumerate(zip(self._packed, self.outputs)):
            a = self.inputs[0] if i < 2 else self.inputs[1]
            k, n = self.weights[i].shape
            self._fn(
                rows, n, k, 1.0, a.ctypes.data, k, b.ctypes.data, 0.0, c.ctypes.data, n, threads
            )


def paired(
    first: Callable[[], object], second: Callable[[], object], blocks: int, calls: int
) -> list[float]:
    """Per block, ``first``'s time over ``second``'s for ``calls`` calls each, the order
    alternated between blocks (after one warm-up call of each)."""
    first(), second()
    out = []
    for blk in range(blocks):
        spent = {}
        for which, fn in ((0, first), (1, second)) if blk % 2 else ((1, second), (0, first)):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            spent[which] = time.perf_counter() - t0
        out.append(spent[0] / spent[1])
    return out


def summary(ratios: list[float]) -> str:
    """``median (IQR low-high)`` with three decimals."""
    q1, med, q3 = np.percentile(ratios, [25, 50, 75])
    return f"{med:.3f} ({q1:.3f}-{q3:.3f})"


def _option(text: str | None) -> dict[str, object]:
    if not text:
        return {}
    name, _, value = text.partition("=")
    try:
        return {name: json.loads(value)}
    except json.JSONDecodeError:
        return {name: value}


def measure(
    path: str,
    shape: tuple[int, int, int],
    threads: int,
    hidden: int,
    blocks: int,
    option: str | None = None,
) -> dict[str, object]:
    """``step/bare`` (the model's call over the bare GEMMs') and, with ``option``
    (``name=value``, the value JSON or a string), ``variant/base`` and whether both give
    the same bits; each a list of per-block ratios."""
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    base = geode.compile(path, num_threads=threads, progress=0, model_cache=False)
    feeds = {base.input_names[0]: x}
    calls = max(1, int(3e7 // (shape[0] * shape[1] * shape[2] * hidden * 3)))
    bare = BareGemms(shape[0] * shape[1], shape[2], hidden, threads)
    native.set_num_threads(threads)
    out: dict[str, object] = {"step/bare": paired(lambda: base(**feeds), bare, blocks, calls)}
    if option:
        var = geode.compile(
            path, num_threads=threads, progress=0, model_cache=False, **_option(option)
        )
        a, b = base.run(feeds), var.run(feeds)
        out["same_bits"] = all(np.array_equal(a[k], b[k]) for k in a)
        out["variant/base"] = paired(lambda: var(**feeds), lambda: base(**feeds), blocks, calls)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--onnx", default="/tmp/onnx/llama_mlp.onnx")
    p.add_argument("--threads", default="2,1")
    p.add_argument("--sizes", default="small,large")
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--hidden", type=int, default=688)
    p.add_argument("--blocks", type=int, default=15)
    p.add_argument("--option", default=None, help="name=value: a variant against the default")
    args = p.parse_args(argv)
    print("| size | threads | step / bare GEMMs | variant / default | same bits |")
    print("|---|---:|---:|---:|---|")
    for size in args.sizes.split(","):
        shape = (*SIZES[size], args.dim)
        for t in (int(v) for v in args.threads.split(",")):
            r = measure(args.onnx, shape, t, args.hidden, args.blocks, args.option)
            var = summary(r["variant/base"]) if "variant/base" in r else "-"  # type: ignore[arg-type]
            print(
                f"| {size} | {t} | {summary(r['step/bare'])} | {var} | {r.get('same_bits', '-')} |"
            )  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
