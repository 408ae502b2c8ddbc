"""The benchmark script's command line (``bench/run.py``): workload selection and its errors.

The script runs in a fresh process, as users run it: it sets the thread count of every
library (numba's included) before any of them starts its threads.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "run.py"
TINY = ["--threads", "1", "--scale", str(1 / 512), "--rounds", "1", "--repeat", "1"]


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *TINY, *args], capture_output=True, text=True, timeout=600
    )


def test_a_workload_subset_runs_only_those_rows() -> None:
    """``--workloads`` runs the named workloads only; with geode and numpy each row has a
    speedup and a roofline percentage."""
    p = _run(["--systems", "geode,numpy", "--workloads", "rmsnorm", "--no-compile-times"])
    assert p.returncode == 0, p.stderr
    out = p.stdout
    rows = [ln for ln in out.splitlines() if re.match(r"^[a-z_]+\s+[\d.]+ms", ln)]
    assert [r.split()[0] for r in rows] == ["rmsnorm"], out
    assert re.search(r"rmsnorm\s+\S+ms\s+\S+ms\s+\d+\.\d\dx\s+\d+%\s+\d+\.\d$", rows[0]), rows[0]
    assert "copy GB/s" in out  # the bandwidth each row's roofline was taken against
    assert "geometric mean speedup" in out


def test_geode_alone_still_reports_the_roofline() -> None:
    """Without another system there is no speedup, but the roofline column is filled."""
    p = _run(["--systems", "geode", "--workloads", "softmax", "--no-compile-times"])
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert re.search(r"softmax\s+\S+ms\s+-\s+\d+%\s+\d+\.\d\n", out), out
    assert "geometric mean" not in out


def test_an_unknown_workload_is_a_usage_error() -> None:
    p = _run(["--workloads", "rmsnorm,lstm"])
    assert p.returncode == 2
    err = p.stderr
    assert "unknown workload(s) ['lstm']" in err and "lstm_gates" in err


def test_rounds_time_the_together_group_call_by_call(monkeypatch) -> None:
    """``time_in_rounds``: a function outside ``together`` runs in a block of its own
    calls; the ``together`` functions alternate call by call in one block; every function
    gets one sample per round, the median of that round's timed calls."""
    monkeypatch.syspath_prepend(str(SCRIPT.parents[1]))
    from bench import run

    monkeypatch.setattr(run, "SETTLE", 0.0)
    calls: list[str] = []
    fns = {k: (lambda k=k: calls.append(k)) for k in ("numpy", "copy", "geode")}
    samples = run.time_in_rounds(fns, repeat=3, rounds=2, together=["copy", "geode"])
    block = ["numpy"] * 4 + ["copy", "geode"] * 4  # an untimed call of each, then 3 timed
    assert calls == block * 2
    assert {k: len(v) for k, v in samples.items()} == {"numpy": 2, "copy": 2, "geode": 2}


def test_the_other_runtimes_load_before_any_numba_parallel_code(monkeypatch) -> None:
    """``main`` imports the compared libraries (``load_runtimes``) before the roofline
    copies, the first numba parallel code it runs: torch imported after numba's OpenMP
    layer started ran its eager kernels 40-70x slower (see ``load_runtimes``)."""
    monkeypatch.syspath_prepend(str(SCRIPT.parents[1]))
    from bench import run, workloads

    order: list[tuple[str, object]] = []

    class Stop(Exception):
        pass

    def fake_copies(nbytes: int) -> dict:
        order.append(("copies", nbytes))
        raise Stop

    monkeypatch.setattr(workloads, "load_runtimes", lambda s, t: order.append(("load", (s, t))))
    monkeypatch.setattr(workloads, "roofline_copies", fake_copies)
    with pytest.raises(Stop):
        run.main(["--threads", "2", "--systems", "numpy,torch", "--scale", str(1 / 512)])
    assert order == [("load", (["numpy", "torch"], 2)), ("copies", 4 << 20)]


def test_load_runtimes_reports_a_missing_library(monkeypatch) -> None:
    """A system whose library cannot be imported is returned with the import error (the
    table then lists it as missing); numpy and geode need nothing loaded."""
    monkeypatch.syspath_prepend(str(SCRIPT.parents[1]))
    from bench.workloads import load_runtimes

    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # makes `import onnxruntime` fail
    missing = load_runtimes(["geode", "numpy", "onnxruntime"], 1)
    assert list(missing) == ["onnxruntime"]
    assert "onnxruntime" in missing["onnxruntime"]


def test_conv_bench_systems_agree() -> None:
    """``bench/conv.py``: the three systems it times compute the same conv, and the
    native one is the library kernel (its ``runner`` asserts it)."""
    sys.path.insert(0, str(SCRIPT.parents[1]))
    try:
        from bench.conv import CASES, runner
    finally:
        sys.path.pop(0)
    name = next(n for n in CASES if "depthwise" in n)
    outs = {s: runner(s, name, 1)[1] for s in ("native", "aicpu", "ort")}
    for s in ("aicpu", "ort"):
        np.testing.assert_allclose(outs["native"], outs[s], rtol=1e-4, atol=1e-4, err_msg=s)


@pytest.mark.slow  # a bench run per batch: about 6 s on two cores
def test_bucket_bench_reports_every_batch(tmp_path) -> None:
    """``bench/buckets.py``: one row per batch size with the variant that served it, the
    three systems' times and the ratios; the JSON holds the same rows."""
    script = SCRIPT.parent / "buckets.py"
    out_json = tmp_path / "b.json"
    args = ["--buckets", "1,4", "--batches", "1,3,6", "--seq", "8", "--rounds", "1"]
    p = subprocess.run(
        [sys.executable, str(script), *args, "--max-ratio", "100", "--json", str(out_json)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert p.returncode == 0, p.stderr
    rows = [ln.split() for ln in p.stdout.splitlines() if re.match(r"^\s+\d+\s+\S", ln)]
    assert [r[0] for r in rows] == ["1", "3", "6"], p.stdout
    assert rows[2][1] == "symbolic"  # beyond the last bucket
    import json

    data = json.loads(out_json.read_text(encoding="utf-8"))
    assert [r["batch"] for r in data["rows"]] == [1, 3, 6]
    assert all(r["max_rel_error"] < 1e-3 for r in data["rows"])


def test_full_reduce_bench_compares_both_schedules() -> None:
    """``bench/full_reduce.py``: both schedules of each full reduction agree (its ``run``
    asserts it) and the two-step one is the default's rfactor schedule."""
    sys.path.insert(0, str(SCRIPT.parents[1]))
    try:
        from bench.full_reduce import REDUCTIONS, compile_both, run
    finally:
        sys.path.pop(0)
    lines = run(rows=70, cols=256, threads=1, rounds=1, calls=1)
    assert len(lines) == len(REDUCTIONS) and all("speedup" in ln for ln in lines)
    models = compile_both("sum", 256, 1)
    traces = {
        k: next(i.trace for i in m.kernels if i.engine == "aicore") for k, m in models.items()
    }
    assert "partials='outer'" in traces["two-step"] and "rfactor" not in traces["one thread"]


def test_stitch_bench_rowcol_case_runs_and_is_one_kernel() -> None:
    """``bench/stitch.py``: a row + column case (kind ``rowcol``) runs against the separate
    kernels and numpy, stitched into one kernel, within the tolerance."""
    sys.path.insert(0, str(SCRIPT.parents[1]))
    try:
        from bench.stitch import Case, describe, run_case
    finally:
        sys.path.pop(0)
    case = Case(
        "rc", (67, 33), ((1,), (0,)), square=True, kind="rowcol", ops=("ReduceMean", "ReduceMax")
    )
    row = run_case(case, threads=1, rounds=1)
    assert row["kernels"] == {"fused": 1, "unfused": 2}
    assert row["max_rel_error"] < 1e-5
    assert "fused/unfused" in row["ratios"] and "fused/numpy" in row["ratios"]
    assert "rc [67, 33]" in describe(row)


def test_packed_gemm_bench_ways_agree() -> None:
    """``bench/packed_gemm.py``: numpy, ``geode_gemm``, the packed kernel and
    onnxruntime's MatMul compute the same product (its ``measure`` checks each against
    float64) and every way is timed."""
    from geode.runtime import native

    sys.path.insert(0, str(SCRIPT.parents[1]))
    try:
        from bench.packed_gemm import measure, shapes
    finally:
        sys.path.pop(0)
    assert (2048, 1024, 1024) in shapes("all") and (2048, 256, 256) not in shapes("small")
    saved = native.get_num_threads()
    try:
        times = measure(5, 24, 40, 1, 1)
    finally:
        native.set_num_threads(saved)
    assert set(times) == {"numpy", "gemm", "packed", "ort"} and min(times.values()) > 0


def test_winograd_bench_runs_a_case(monkeypatch, capsys) -> None:
    """``bench/winograd.py``: one small case at one thread count, its three systems
    checked against each other, a row of the table."""
    monkeypatch.syspath_prepend(str(SCRIPT.parents[1]))
    from bench import winograd

    winograd.main(["--only", "rule 8->8 1x16", "--threads", "1", "--rounds", "1", "--calls", "1"])
    rows = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| rule 8->8")]
    assert len(rows) == 1 and rows[0].count("|") == 8, rows


def test_winograd_bench_times_the_vector_paths(monkeypatch, capsys) -> None:
    """``bench/winograd.py --paths``: the Winograd kernel on each path the CPU runs (the
    others left out), a column each and a ratio to the first, the path in use restored."""
    monkeypatch.syspath_prepend(str(SCRIPT.parents[1]))
    from bench import winograd
    from geode.runtime import native

    before = native.pool_info()["winograd_isa"]
    args = ["--paths", "0,1,2,3", "--only", "rule 8->8 1x16", "--threads", "1"]
    winograd.main([*args, "--rounds", "2", "--calls", "1"])
    rows = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| rule 8->8")]
    paths = before + 1  # 0 .. the best path
    assert len(rows) == 1 and rows[0].count("|") == 2 * paths + 2, rows
    assert native.pool_info()["winograd_isa"] == before


@pytest.mark.slow  # exports with torch, which the default suite's machine may not have
def test_llama_mlp_bench_pairs_the_step_with_its_bare_gemms(monkeypatch, tmp_path) -> None:
    """``bench/llama_mlp.py``: the bare GEMMs compute the block's three products, and a
    measurement gives one ratio per block for the step against them and for an option's
    variant against the default (a changed row scale: not the same bits)."""
    pytest.importorskip("torch")
    from geode.runtime import native

    monkeypatch.syspath_prepend(str(SCRIPT.parents[1]))
    from bench import llama_mlp
    from bench.models import _model_specs, export

    bare = llama_mlp.BareGemms(9, 16, 40, 1)
    bare()
    a, h = bare.inputs
    for out, x, w in zip(bare.outputs, (a, a, h), bare.weights):
        np.testing.assert_allclose(out, x.astype(np.float64) @ w, rtol=1e-4, atol=1e-4)
    path = export(_model_specs()["llama_mlp"], tmp_path, 0)
    saved = native.get_num_threads()
    try:
        got = llama_mlp.measure(path, (1, 8, 256), 1, 688, 2, "row_scale_gemms=false")
    finally:
        native.set_num_threads(saved)
    assert len(got["step/bare"]) == 2 and min(got["step/bare"]) > 0
    assert len(got["variant/base"]) == 2 and got["same_bits"] is False
    assert llama_mlp.summary([1.0, 1.0]) == "1.000 (1.000-1.000)"


@pytest.mark.slow  # ~18 s: two compiles, an onnxruntime session, timed blocks
def test_long_attention_bench_prints_a_row_per_length(monkeypatch, capsys) -> None:
    """``bench/long_attention.py``: the key-tiled and the row-panel forms and onnxruntime
    are timed side by side, one table row per length, with the forms' results within
    rounding of onnxruntime's."""
    monkeypatch.syspath_prepend(str(SCRIPT.parents[1]))
    from bench import long_attention

    args = ["--lengths", "40", "--heads", "1", "--depth", "8", "--blocks", "2", "--mask", "add"]
    assert long_attention.main([*args, "--threads", "1"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 40 |")]
    assert len(rows) == 1, rows
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert len(cells) == 5
    diffs = [float(x) for x in cells[4].split(",")]
    assert all(0.0 <= d < 1e-4 for d in diffs), diffs
