"""``python -m geode.costmodel.report``: the command around the report's computation."""

from __future__ import annotations

import json
from pathlib import Path

from geode.costmodel import report, store
from geode.costmodel.samples import load_samples

DATA = Path(__file__).resolve().parent.parent / "data" / "costmodel_samples.json"


def test_replayed_report_prints_every_model(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("GEODE_CACHE_DIR", str(tmp_path))
    assert report.main(["--samples", str(DATA), "--seed", "0", "--save"]) == 0
    out = capsys.readouterr().out
    for name in ("sol", "projected-prior", "projected", "bytes-baseline", "spearman"):
        assert name in out
    assert "replayed" in out and "saved the model" in out and "load average" in out
    _, spec = load_samples(DATA)
    saved = store.load_model(tmp_path, spec)
    assert saved is not None and saved.n_samples >= 200


def test_measured_report_on_a_few_kernels(capsys, tmp_path):
    out_file = tmp_path / "s.json"
    assert report.main(["--n", "6", "--rounds", "1", "--save-samples", str(out_file)]) == 0
    assert "measured" in capsys.readouterr().out
    assert json.loads(out_file.read_text(encoding="utf-8"))["format"] == 1


def test_bad_arguments_exit_2(capsys, tmp_path):
    assert report.main(["--n", "1"]) == 2
    assert report.main(["--holdout", "1.5"]) == 2
    assert report.main(["--rounds", "0"]) == 2
    assert report.main(["--samples", str(tmp_path / "none.json")]) == 2
    err = capsys.readouterr().err
    assert "--n" in err and "--holdout" in err and "not a readable" in err
