"""Generated kernels, compiled and timed (costmodel/samples.py), and their replay."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from geode import config
from geode.costmodel import accuracy, samples
from geode.costmodel.device import default_spec

DATA = Path(__file__).resolve().parent.parent / "data" / "costmodel_samples.json"


def test_cases_are_seeded_and_diverse():
    a = samples.generate_cases(40, seed=3)
    assert a == samples.generate_cases(40, seed=3)
    assert a != samples.generate_cases(40, seed=4)
    assert {c.kind for c in a} == set(samples.KINDS)
    assert {c.dtype for c in a} == {"float32", "float64"}
    assert any(c.symbolic for c in a) and any(c.threads == 1 for c in a)
    assert any(c.choices for c in a) and any(c.streaming == "off" for c in a)
    sizes = [c.shape[0] * (c.shape[1] if len(c.shape) > 1 else 1) for c in a]
    assert min(sizes) < 1 << 14 and max(sizes) > 1 << 19
    for c in a[:16]:  # every kind builds a valid graph
        g = c.graph()
        g.infer_shapes()
        assert g.outputs
    with pytest.raises(ValueError):
        samples.generate_cases(-1)


def test_collect_compiles_and_times_real_kernels(tmp_path):
    opts = config.current(progress="0", model_cache=False)
    got = samples.collect(10, seed=5, opts=opts, rounds=2, min_time=0, progress="0")
    assert len(got) >= 10  # every case compiles (some to more than one kernel)
    for s in got:
        assert s.measured_s > 0 and s.timing is not None and len(s.timing.samples) == 2
        assert s.features.bytes_read > 0 and s.work.bytes_read == s.features.bytes_read
    spec = default_spec()
    path = tmp_path / "s.json"
    samples.save_samples(path, got, spec)
    back, back_spec = samples.load_samples(path)
    assert back_spec == spec
    assert [(s.name, s.measured_s, s.features) for s in back] == [
        (s.name, s.measured_s, s.features) for s in got
    ]


@pytest.mark.parametrize(
    "doc, match",
    [
        ("nope", "not valid JSON"),
        ('{"format": 2, "samples": []}', "format 1"),
        ('{"format": 1, "samples": [{"name": "a"}]}', "sample 0"),
        (
            '{"format": 1, "samples": [{"name": "a", "measured_s": -1, "features": {}}]}',
            "positive",
        ),
        (
            '{"format": 1, "samples": [{"name": "a", "measured_s": 1, "features": {"x": 1}}]}',
            "unknown schedule features",
        ),
        ('{"format": 1, "samples": [], "device": {"name": ""}}', "device"),
    ],
)
def test_malformed_sample_files_are_refused(doc, match):
    with pytest.raises(ValueError, match=match):
        samples.samples_from_json(doc)


def test_missing_sample_file_is_refused(tmp_path):
    with pytest.raises(ValueError, match="not a readable"):
        samples.load_samples(tmp_path / "missing.json")


def test_replayed_kernels_of_a_real_machine_meet_the_accuracy_bar():
    """240 kernels measured on the 2-core development machine (shared with other
    work, so noisy): fitted on 70%, the projected model ranks the held-out 30% with a
    Spearman correlation of at least 0.8 (the issue's bar) and beats the prior and the
    bytes-only baseline at the median."""
    got, spec = samples.load_samples(DATA)
    assert spec is not None and len(got) >= 200
    ev = accuracy.evaluate(got, spec, holdout=0.3, seed=0)
    proj = ev.models["projected"]
    assert proj.spearman >= 0.8
    assert proj.median_rel_error < ev.models["projected-prior"].median_rel_error
    assert proj.median_rel_error < ev.models["bytes-baseline"].median_rel_error
    assert json.loads(json.dumps(ev.fitted.to_dict()))["device"] == spec.key()
