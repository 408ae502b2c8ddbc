"""The model benchmark (``bench/models.py``): a smoke run of its smallest model and size,
its usage errors, and its answer when torch is missing.

The smoke run needs torch (the models are exported from PyTorch): without it the test
is reported as skipped with the reason. It runs in a fresh process, as users run the
script (torch loads before geode runs anything).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "models.py"


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600
    )


@pytest.mark.slow  # geode and onnxruntime in worker processes: about 5 s
def test_smoke_run_of_the_lstm_cell_at_batch_1(tmp_path) -> None:
    """One tiny model at its small size: a results row (geode and ORT times, the ratio
    inside its IQR, an error within the target), the compile row, the speedup line, a
    profile, the exported model kept, and the JSON file."""
    pytest.importorskip("torch", reason="torch is not installed: bench/models.py exports with it")
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
    out_json, onnx_dir = tmp_path / "r.json", tmp_path / "onnx"
    p = _run(
        [
            *("--models", "lstm_cell", "--sizes", "small", "--rounds", "2", "--threads", "1"),
            *("--profile", "2", "--json", str(out_json), "--onnx-dir", str(onnx_dir)),
        ]
    )
    assert p.returncode == 0, p.stderr
    out = p.stdout
    row = re.search(
        r"^\| lstm_cell \| small 1x256 \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \(([\d.]+)-([\d.]+)\) "
        r"\| (\S+) \|$",
        out,
        re.M,
    )
    assert row is not None, out
    geode_ms, ort_ms, ratio, q1, q3, err = map(float, row.groups())
    assert geode_ms > 0 and ort_ms > 0 and 0 < q1 <= ratio <= q3
    assert err <= 1e-3
    assert re.search(
        r"^\| lstm_cell \| [\d.]+ \| [\d.]+ \| [\d.]+ \| [\d.]+ \| [\d.]+ \|$", out, re.M
    )
    assert "speedup of geode over onnxruntime" in out
    assert "lstm_cell small 1x256: geode's slowest steps" in out
    assert (onnx_dir / "lstm_cell.onnx").is_file()
    doc = json.loads(out_json.read_text(encoding="utf-8"))
    assert doc["threads"] == 1 and doc["rounds"] == 2
    assert set(doc["load_average"]) == {"before", "after"}
    assert re.search(r"load average [\d.]+ before, [\d.]+ after", out), out
    assert [(r["model"], r["size"]) for r in doc["results"]] == [("lstm_cell", "small 1x256")]
    assert doc["results"][0]["ratio"] == pytest.approx(ratio, abs=0.01)
    assert doc["compile"][0]["geode_compile_s"] > 0
    assert doc["geomean_speedup"] == pytest.approx(1 / doc["results"][0]["ratio"])
    assert doc["profiles"]["lstm_cell small 1x256"][0]["seconds"] > 0


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--models", "bert,resnet"], "--models: unknown or none ['resnet']; choose from bert"),
        (["--sizes", "huge"], "--sizes: unknown or none ['huge']; choose from small, large"),
        (["--rounds", "0"], "--threads and --rounds must be >= 1"),
    ],
)
def test_bad_arguments_are_usage_errors(args, expected) -> None:
    p = _run(args)
    assert p.returncode == 2
    assert expected in p.stderr, p.stderr


def test_without_torch_it_says_so(monkeypatch, capsys) -> None:
    """torch missing: exit status 2 and the reason, before anything runs."""
    monkeypatch.syspath_prepend(str(ROOT))
    from bench import models

    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    assert models.main(["--models", "lstm_cell", "--sizes", "small"]) == 2
    assert "bench/models.py needs torch to export the models" in capsys.readouterr().err
