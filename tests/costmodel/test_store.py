"""Fitted projected models on disk, per device."""

from __future__ import annotations

import json
import os

import pytest

from geode.costmodel import projected, store
from geode.costmodel.device import default_spec
from geode.costmodel.projected import ProjectedModel


def fitted_for(spec):
    return ProjectedModel({**projected.DEFAULT_COEFFICIENTS, "dram": 1.7}, 0.2, 40, spec.key())


def test_round_trip(tmp_path):
    spec = default_spec()
    model = fitted_for(spec)
    assert store.load_model(tmp_path, spec) is None
    path = store.save_model(tmp_path, spec, model)
    assert path == store.model_path(tmp_path, spec) and path.is_file()
    assert (path.stat().st_mode & 0o022) == 0
    back = store.load_model(tmp_path, spec)
    assert back.coefficients == model.coefficients and back.device == spec.key()
    assert back.n_samples == 40 and back.fit_error == pytest.approx(0.2)


def test_models_are_kept_per_device(tmp_path):
    a = default_spec()
    b = default_spec()
    b.name = "another-cpu"
    store.save_model(tmp_path, a, fitted_for(a))
    assert store.model_path(tmp_path, a) != store.model_path(tmp_path, b)
    assert store.load_model(tmp_path, b) is None
    with pytest.raises(ValueError, match="cannot be saved"):
        store.save_model(tmp_path, b, fitted_for(a))


def test_a_file_of_another_device_is_ignored_with_a_warning(tmp_path):
    a = default_spec()
    b = default_spec()
    b.name = "another-cpu"
    path = store.model_path(tmp_path, a)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(fitted_for(b).to_dict()), encoding="utf-8")
    with pytest.warns(UserWarning, match="fitted on"):
        assert store.load_model(tmp_path, a) is None


@pytest.mark.parametrize("text", ["{not json", "[]", '{"format": 2}', "\xff\xfe"])
def test_a_corrupt_file_is_ignored_with_a_warning(tmp_path, text):
    spec = default_spec()
    path = store.model_path(tmp_path, spec)
    path.parent.mkdir(parents=True)
    path.write_bytes(text.encode("latin-1"))
    with pytest.warns(UserWarning, match="corrupt projected model"):
        assert store.load_model(tmp_path, spec) is None
    store.save_model(tmp_path, spec, fitted_for(spec))  # a good one replaces it
    assert store.load_model(tmp_path, spec) is not None


def test_a_link_or_a_public_file_is_not_read(tmp_path):
    spec = default_spec()
    real = tmp_path / "elsewhere.json"
    real.write_text(json.dumps(fitted_for(spec).to_dict()), encoding="utf-8")
    path = store.model_path(tmp_path, spec)
    path.parent.mkdir(parents=True)
    os.symlink(real, path)
    assert store.load_model(tmp_path, spec) is None
    path.unlink()
    path.write_text(json.dumps(fitted_for(spec).to_dict()), encoding="utf-8")
    os.chmod(path, 0o666)
    assert store.load_model(tmp_path, spec) is None
