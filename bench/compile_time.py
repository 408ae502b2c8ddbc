"""Compile time of real models, cold and warm, against onnxruntime's session creation.

    python bench/compile_time.py [--models torch_bert,torch_block] [--backends llvm,numba]

Every measurement runs in a fresh Python process (nothing imported, nothing in memory):

- ``import geode`` alone, and whether that imported numba;
- per model and backend: ``geode.compile`` plus the first run, with an empty kernel
  cache (cold) and again in a new process with the cache the cold run left (warm);
- onnxruntime: ``InferenceSession`` creation plus the first run of the same model.

Reported: seconds (medians of ``--repeat`` processes), and the ratios geode / onnxruntime
that the targets are stated in (cold at most 20x, warm at most 3x), and the cold
process's CPU time (user + system, every thread: less noisy than wall time on a shared
machine). The machines are noisy: read the ratios, not the absolute times.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"

_FEEDS = """
import numpy as np
def feeds(name):
    rng = np.random.default_rng(0)
    if name == "torch_bert":
        return {"input_ids": rng.integers(0, 50, (1, 32)).astype(np.int64),
                "attention_mask": np.ones((1, 32), np.int64)}
    return {"x": rng.standard_normal((1, 32, 16)).astype(np.float32)}
"""

_GEODE = """
import sys, time, json
t0 = time.perf_counter()
import geode
t_import = time.perf_counter() - t0
model = geode.compile({path!r}, backend={backend!r}, cache_dir={cache!r}, progress=0)
out = model(**feeds({name!r}))
t_total = time.perf_counter() - t0
print(json.dumps({{"import": t_import, "total": t_total, "cpu": time.process_time(),
                  "numba": "numba" in sys.modules}}))
"""

_ORT = """
import time, json
t0 = time.perf_counter()
import onnxruntime as ort
so = ort.SessionOptions(); so.intra_op_num_threads = 2
s = ort.InferenceSession({path!r}, so, providers=["CPUExecutionProvider"])
s.run(None, feeds({name!r}))
print(json.dumps({{"total": time.perf_counter() - t0}}))
"""

_IMPORT = """
import sys, time, json
t0 = time.perf_counter()
import geode
print(json.dumps({"import": time.perf_counter() - t0, "numba": "numba" in sys.modules}))
"""


def run_fresh(code: str) -> dict:
    """Run ``code`` (after the feeds helper) in a fresh Python process; its last stdout
    line, a JSON object."""
    code = _FEEDS + code
    # bytecode caching on, as on a user's machine (this workplace sets PYTHONDONTWRITEBYTECODE)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="torch_bert,torch_block")
    ap.add_argument("--backends", default="llvm,numba")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    imports = [run_fresh(_IMPORT) for _ in range(args.repeat)]
    t_imp = statistics.median(r["import"] for r in imports)
    print(f"import geode: {t_imp:.3f} s (numba imported: {imports[0]['numba']})")
    print(
        f"{'model':<14}{'backend':<8}{'cold s':>9}{'cold cpu':>9}{'warm s':>9}{'ort s':>8}"
        f"{'cold/ort':>10}{'warm/ort':>10}  numba?"
    )
    for name in args.models.split(","):
        path = str(DATA / f"{name}.onnx")
        ort = statistics.median(
            run_fresh(_ORT.format(path=path, name=name))["total"] for _ in range(args.repeat)
        )
        for backend in args.backends.split(","):
            colds, cpus, warms, numba = [], [], [], False
            for _ in range(args.repeat):
                with tempfile.TemporaryDirectory() as cache:
                    code = _GEODE.format(path=path, name=name, backend=backend, cache=cache)
                    cold = run_fresh(code)
                    warm = run_fresh(code)
                colds.append(cold["total"])
                cpus.append(cold["cpu"])
                warms.append(warm["total"])
                numba = numba or warm["numba"]
            c, w = statistics.median(colds), statistics.median(warms)
            cpu = statistics.median(cpus)
            print(
                f"{name:<14}{backend:<8}{c:>9.3f}{cpu:>9.3f}{w:>9.3f}{ort:>8.3f}"
                f"{c / ort:>10.1f}{w / ort:>10.1f}  {numba}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
