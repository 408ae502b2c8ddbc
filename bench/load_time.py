"""Loading a geode model file against onnxruntime's session creation, in fresh processes.

    python bench/load_time.py [--models torch_block,torch_bert] [--onnx PATH ...] [--repeat 5]

Each model is compiled once and saved to a ``.geode`` file. Then, alternating, fresh
Python processes (nothing in memory, an empty kernel cache, so nothing can come from
a cache) time:

- geode: ``geode.load(file)`` plus the first run;
- onnxruntime: ``InferenceSession(model)`` plus the first run (2 threads);

each after its own ``import`` (reported apart: ``import geode`` vs ``import
onnxruntime``). Reported: medians over ``--repeat`` process pairs, and the ratio
geode / onnxruntime that issue 35's target is stated in (at most 2x for a GPT-2 block).
Also the warm compile (``geode.compile`` plus first run with a filled kernel cache)
that a model file replaces. The machines are noisy: read the ratios.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from bench.compile_time import DATA, run_fresh

_GEODE_LOAD = """
import time, json, sys, os
import numpy as np
os.environ["GEODE_CACHE_DIR"] = {empty!r}  # nothing can come from a cache
t0 = time.perf_counter()
import geode
t1 = time.perf_counter()
model = geode.load({file!r})
model(**dict(np.load({feeds!r})))
t2 = time.perf_counter()
print(json.dumps({{"import": t1 - t0, "total": t2 - t1, "numba": "numba" in sys.modules,
                   "onnx": "onnx" in sys.modules}}))
"""

_GEODE_COMPILE = """
import time, json
import numpy as np
import geode
t1 = time.perf_counter()
model = geode.compile({path!r}, cache_dir={cache!r}, progress=0)
model(**dict(np.load({feeds!r})))
print(json.dumps({{"total": time.perf_counter() - t1}}))
"""

_ORT = """
import time, json
import numpy as np
t0 = time.perf_counter()
import onnxruntime as ort
t1 = time.perf_counter()
so = ort.SessionOptions(); so.intra_op_num_threads = 2
s = ort.InferenceSession({path!r}, so, providers=["CPUExecutionProvider"])
s.run(None, dict(np.load({feeds!r})))
print(json.dumps({{"import": t1 - t0, "total": time.perf_counter() - t1}}))
"""

_SAVE = """
import json, geode
model = geode.compile({path!r}, cache_dir={cache!r}, progress=0)
size = model.save({file!r})
print(json.dumps({{"size": size}}))
"""


def write_feeds(path: str, out: str) -> None:
    """Random inputs for the ONNX model at ``path`` (symbolic dims: batch 1, then 32;
    integer inputs in ``[0, 50)``, as token ids and masks take) saved to ``out``."""
    import numpy as np
    import onnx
    from onnx import helper

    rng = np.random.default_rng(0)
    model = onnx.load(path, load_external_data=False)
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for v in model.graph.input:
        if v.name in inits:
            continue
        t = v.type.tensor_type
        sizes = iter((1, 32, 32, 32))
        shape = [d.dim_value if d.HasField("dim_value") else next(sizes) for d in t.shape.dim]
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type))
        if dtype.kind in "iu":
            feeds[v.name] = rng.integers(0, 50, shape).astype(dtype)
        else:
            feeds[v.name] = rng.standard_normal(shape).astype(dtype)
    np.savez(out, **feeds)


def measure(name: str, path: str, repeat: int) -> dict[str, float]:
    """Medians of the fresh-process timings for one model."""
    with tempfile.TemporaryDirectory() as tmp:
        file, cache = str(Path(tmp) / f"{name}.geode"), str(Path(tmp) / "cache")
        feeds = str(Path(tmp) / "feeds.npz")
        write_feeds(path, feeds)
        size = run_fresh(_SAVE.format(path=path, cache=cache, file=file))["size"]
        loads, orts, warms = [], [], []
        for _ in range(repeat):  # alternate, so drifts of a noisy machine hit both alike
            with tempfile.TemporaryDirectory() as empty:
                loads.append(run_fresh(_GEODE_LOAD.format(file=file, feeds=feeds, empty=empty)))
            orts.append(run_fresh(_ORT.format(path=path, feeds=feeds)))
            code = _GEODE_COMPILE.format(path=path, cache=cache, feeds=feeds)
            warms.append(run_fresh(code))
    med = statistics.median
    return {
        "size": size,
        "load": med(r["total"] for r in loads),
        "ort": med(r["total"] for r in orts),
        "warm": med(r["total"] for r in warms),
        "import_geode": med(r["import"] for r in loads),
        "import_ort": med(r["import"] for r in orts),
        "numba": any(r["numba"] for r in loads),
        "onnx": any(r["onnx"] for r in loads),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="torch_block,torch_bert")
    ap.add_argument("--onnx", action="append", default=[], help="another .onnx file (repeatable)")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    models = [(n, str(DATA / f"{n}.onnx")) for n in args.models.split(",") if n]
    models += [(Path(p).stem, p) for p in args.onnx]
    print(
        f"{'model':<14}{'file KiB':>9}{'load+run ms':>13}{'ORT ms':>9}{'load/ORT':>10}"
        f"{'warm compile ms':>17}{'warm/ORT':>10}  imports geode/ORT ms  numba/onnx imported"
    )
    for name, path in models:
        r = measure(name, path, args.repeat)
        print(
            f"{name:<14}{r['size'] / 1024:>9.0f}{r['load'] * 1e3:>13.1f}{r['ort'] * 1e3:>9.1f}"
            f"{r['load'] / r['ort']:>10.2f}{r['warm'] * 1e3:>17.1f}{r['warm'] / r['ort']:>10.1f}"
            f"  {r['import_geode'] * 1e3:.0f}/{r['import_ort'] * 1e3:.0f}"
            f"  {r['numba']}/{r['onnx']}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
