"""Bucketed dynamic batch against the symbolic model and onnxruntime.

    python bench/buckets.py [--model tests/data/torch_bert.onnx | --export-dim 256]
                            [--buckets 1,4,16,64] [--batches 1,3,8,30] [--seq 32]
                            [--threads 1] [--rounds 15] [--json out.json]

A PyTorch-exported transformer layer with a dynamic batch (default: the committed
``tests/data/torch_bert.onnx``, BERT embeddings + one encoder layer + pooler, hidden
16; ``--export-dim D`` exports the same layer at hidden size D with torch, which must
be installed) is compiled twice by geode, with ``dynamic_dims={"batch": buckets}``
(bucketed: a static-shape variant per bucket, a Case per call) and without (symbolic),
and loaded by onnxruntime. At each batch size the three run in interleaved rounds
(:func:`geode.benchmark.interleave`); reported are each one's median time per call and
the medians (and interquartile ranges) of the per-round ratios buckets / symbolic and
buckets / onnxruntime, plus which variant the bucketed model ran (a bucket, a bucket
padded up, or the symbolic model) and the largest output difference.

The bucketed model must never be slower than the symbolic one (ratio <= 1 within the
noise): the exit status is 1 when a median ratio buckets / symbolic exceeds
``--max-ratio`` (default 1.10) or an output differs by more than 1e-3.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from geode.benchmark import (  # noqa: E402
    TOLERANCE,
    have_onnxruntime,
    interleave,
    max_rel_error,
    ort_runner,
    ort_session,
    quartiles,
)

DEFAULT_MODEL = ROOT / "tests" / "data" / "torch_bert.onnx"


def export_bert(dim: int, folder: str) -> str:
    """``BertLayer`` at hidden size ``dim`` (4 heads, 1,000 words, 256 positions)
    exported to ONNX with dynamic batch and sequence; its path."""
    import torch

    from bench.torch_models import BertLayer, export_onnx

    torch.manual_seed(0)
    model = BertLayer(vocab=1000, positions=256, dim=dim, heads=4)
    ids = torch.randint(0, 1000, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.int64)
    path = os.path.join(folder, f"bert{dim}.onnx")
    export_onnx(
        model,
        {"input_ids": ids, "attention_mask": mask},
        path,
        ["hidden", "pooled"],
        {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}},
    )
    return path


def feeds_for(batch: int, seq: int, vocab: int, rng: np.random.Generator) -> dict:
    """BERT's inputs: token ids uniform over the vocabulary, an all-ones mask."""
    return {
        "input_ids": rng.integers(0, vocab, (batch, seq)).astype(np.int64),
        "attention_mask": np.ones((batch, seq), np.int64),
    }


def ratio_stats(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """Quartiles of the per-round ratios a / b."""
    return quartiles([x / y for x, y in zip(a, b)])


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; 0 when buckets never lose to the symbolic model."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(DEFAULT_MODEL))
    ap.add_argument(
        "--export-dim", type=int, default=0, help="export BertLayer at this hidden size"
    )
    ap.add_argument("--buckets", default="1,4,16,64")
    ap.add_argument("--batches", default="1,3,8,30")
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--max-ratio", type=float, default=1.10)
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)

    import geode

    tmp = tempfile.mkdtemp(prefix="geode_buckets_")
    path = export_bert(args.export_dim, tmp) if args.export_dim else args.model
    vocab = 1000 if args.export_dim else 50
    buckets = [int(b) for b in args.buckets.split(",")]
    opts = {"num_threads": args.threads, "progress": "0"}
    t = time.perf_counter()
    symbolic = geode.compile(path, **opts)
    t_sym = time.perf_counter() - t
    t = time.perf_counter()
    bucketed = geode.compile(path, dynamic_dims={"batch": buckets}, **opts)
    t_bk = time.perf_counter() - t
    ort = ort_session(path, args.threads) if have_onnxruntime() else None
    print(f"model {path}: compile symbolic {t_sym:.2f} s, bucketed {t_bk:.2f} s")
    print(bucketed.explain().split("symbolic model (every size):")[0].rstrip())
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"threads {args.threads}, seq {args.seq}, rounds {args.rounds}, load {load:.2f}")
    head = (
        f"{'batch':>5}  {'runs':<28} {'buckets ms':>10} {'symbolic ms':>11} {'ort ms':>8}"
        f"  {'bk/sym (IQR)':>20}  {'bk/ort (IQR)':>20}  {'err':>8}"
    )
    print(head)
    rng = np.random.default_rng(0)
    rows, failed = [], False
    for n in [int(b) for b in args.batches.split(",")]:
        feeds = feeds_for(n, args.seq, vocab, rng)
        fns = {
            "buckets": lambda f=feeds: bucketed.run(f),
            "symbolic": lambda f=feeds: symbolic.run(f),
        }
        if ort is not None:
            fns["ort"] = ort_runner(ort, feeds)
        err = max_rel_error(bucketed.run(feeds), symbolic.run(feeds))
        if ort is not None:
            err = max(err, max_rel_error(bucketed.run(feeds), fns["ort"]()))
        times = interleave(fns, args.rounds)
        med = {k: float(np.median(v)) for k, v in times.items()}
        q_sym = ratio_stats(times["buckets"], times["symbolic"])
        q_ort = ratio_stats(times["buckets"], times["ort"]) if ort is not None else (np.nan,) * 3
        choice = bucketed.choose(feeds)
        decided = bucketed.decisions.get((n,))
        ran = choice.label if decided is None else decided.winner.label
        print(
            f"{n:>5}  {ran:<28} {med['buckets'] * 1e3:>10.3f} {med['symbolic'] * 1e3:>11.3f} "
            f"{med.get('ort', np.nan) * 1e3:>8.3f}  "
            f"{q_sym[1]:>6.3f} ({q_sym[0]:.3f}-{q_sym[2]:.3f})  "
            f"{q_ort[1]:>6.3f} ({q_ort[0]:.3f}-{q_ort[2]:.3f})  {err:>8.1e}"
        )
        failed |= q_sym[1] > args.max_ratio or err > TOLERANCE
        rows.append(
            {
                "batch": n,
                "ran": ran,
                "ms": {k: v * 1e3 for k, v in med.items()},
                "buckets_over_symbolic": q_sym,
                "buckets_over_ort": q_ort,
                "max_rel_error": err,
                "decision": None if decided is None else decided.describe(),
            }
        )
        if decided is not None:
            print(f"       decided: {decided.describe()}")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"model": path, "rows": rows}, indent=2), encoding="utf-8"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
