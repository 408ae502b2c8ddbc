"""The model cache: a second compile of the same graph with the same options loads the
first one's model file (no stage of the pipeline runs), and anything that could make
the result differ is a miss."""

from __future__ import annotations

import os

import numpy as np
import pytest

import geode
from geode import examples, safe_files, spine
from geode.modelfile import cache


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    d.mkdir(mode=0o700)
    monkeypatch.setenv("GEODE_CACHE_DIR", str(d))
    monkeypatch.setenv("GEODE_MODEL_CACHE", "1")  # off for the rest of the suite
    return d


def _no_pipeline(monkeypatch):
    def refuse(c):
        raise AssertionError("the pipeline ran on a cached model")

    monkeypatch.setattr(spine, "compile_graph", refuse)


def _feeds(n=3):
    return {"x": np.random.default_rng(0).standard_normal((n, 64)).astype(np.float32)}


def _scaled(scale: float = 2.0) -> geode.Graph:
    g = geode.Graph("scaled")
    x = g.input("x", ["N", 64])
    g.output(g.op("Tanh", g.op("Mul", x, g.constant(np.float32(scale)))), names=["y"])
    return g


def test_second_compile_is_a_load(cache_dir, monkeypatch):
    g = examples.ALL["layernorm"](hidden=64).graph
    first = geode.compile(g, session=geode.Session())
    assert "model_cache" not in first.stats
    (entry,) = list((cache_dir / cache.MODEL_AREA).glob("*/model.geode"))
    assert os.stat(entry).st_mode & 0o777 == safe_files.file_mode()  # the umask's, never o+w
    _no_pipeline(monkeypatch)
    second = geode.compile(g, session=geode.Session())
    assert second.stats["model_cache"] == str(entry)
    assert "no compiler run" in second.explain()
    a, b = first.run(_feeds()), second.run(_feeds())
    np.testing.assert_array_equal(a["y"], b["y"])


@pytest.mark.parametrize(
    "scale, options",
    [(3.0, {}), (2.0, {"fusion": False}), (2.0, {"num_threads": 1}), (2.0, {"fastmath": True})],
    ids=["constant", "fusion", "threads", "fastmath"],
)
def test_what_changes_the_result_is_a_miss(cache_dir, scale, options):
    geode.compile(_scaled(2.0), session=geode.Session())
    model = geode.compile(_scaled(scale), session=geode.Session(), **options)
    assert "model_cache" not in model.stats
    y = model.run(_feeds())["y"]
    np.testing.assert_allclose(y, np.tanh(_feeds()["x"] * scale), rtol=1e-5, atol=1e-6)


def test_a_refitted_projected_model_is_a_miss_for_the_plan_search(cache_dir):
    """With the plan search on, the fitted projected model scores the plans: refitting it
    changes the key (greedy plans do not depend on it)."""
    from geode.costmodel.device import cached_spec
    from geode.costmodel.projected import DEFAULT_COEFFICIENTS, ProjectedModel
    from geode.costmodel.store import save_model

    opts = geode.config.Options(cache_dir=str(cache_dir), fusion_search="beam")
    greedy = geode.config.Options(cache_dir=str(cache_dir))
    before, before_greedy = cache.cache_key(_scaled(), opts), cache.cache_key(_scaled(), greedy)
    doubled = {t: 2 * c + 1e-9 for t, c in DEFAULT_COEFFICIENTS.items()}
    spec = cached_spec(str(cache_dir))
    save_model(cache_dir, spec, ProjectedModel(coefficients=doubled, device=spec.key()))
    assert cache.cache_key(_scaled(), opts) != before
    assert cache.cache_key(_scaled(), greedy) == before_greedy


def test_the_key_is_the_devices_fingerprint_not_its_measured_numbers(cache_dir, monkeypatch):
    """Calibrations of one machine differ by their timing noise: the key does not (with
    the plan search on, which scores plans by the measured numbers, it does); another
    machine's fingerprint (here: other cache sizes) is another key."""
    import dataclasses

    from geode.costmodel import device

    greedy = geode.config.Options(cache_dir=str(cache_dir))
    beam = geode.config.Options(cache_dir=str(cache_dir), fusion_search="beam")
    spec = device.default_spec()
    monkeypatch.setitem(device._SPECS, str(cache_dir), spec)
    before, before_beam = cache.cache_key(_scaled(), greedy), cache.cache_key(_scaled(), beam)
    noisy = dataclasses.replace(spec, mem_bandwidth_gbs=11.5, launch_overhead_us=2.5)
    monkeypatch.setitem(device._SPECS, str(cache_dir), noisy)
    assert cache.cache_key(_scaled(), greedy) == before
    assert cache.cache_key(_scaled(), beam) != before_beam
    monkeypatch.setattr(device, "detect_cache_sizes", lambda: (1 << 15, 1 << 21, 1 << 25))
    assert cache.cache_key(_scaled(), greedy) != before


def test_a_warm_compile_measures_no_device(cache_dir, monkeypatch):
    """The model cache's key needs no calibration: a compile loading its model from the
    cache finds no device spec (neither in memory nor in the cache folder)."""
    from geode.costmodel import device

    geode.compile(_scaled(), session=geode.Session())
    monkeypatch.setattr(device, "_SPECS", {})
    monkeypatch.setattr(device, "_PENDING", {})

    def refuse(cache_dir):
        raise AssertionError("a warm compile asked for the device spec")

    monkeypatch.setattr(device, "_measure", refuse)
    _no_pipeline(monkeypatch)
    model = geode.compile(_scaled(), session=geode.Session())
    assert "model_cache" in model.stats
    assert not device._PENDING


def test_debug_and_dumps_bypass_the_cache(cache_dir, tmp_path):
    geode.compile(_scaled(), session=geode.Session())
    again = geode.compile(_scaled(), session=geode.Session(), dump_dir=str(tmp_path / "d"))
    assert "model_cache" not in again.stats
    assert any((tmp_path / "d").rglob("*"))


def test_damaged_entry_is_recompiled_and_rewritten(cache_dir):
    geode.compile(_scaled(), session=geode.Session())
    (entry,) = list((cache_dir / cache.MODEL_AREA).glob("*/model.geode"))
    data = bytearray(entry.read_bytes())
    data[len(data) // 2] ^= 0xFF
    entry.write_bytes(bytes(data))
    model = geode.compile(_scaled(), session=geode.Session())
    assert "model_cache" not in model.stats
    np.testing.assert_allclose(
        model.run(_feeds())["y"], np.tanh(_feeds()["x"] * 2), rtol=1e-5, atol=1e-6
    )
    assert geode.compile(_scaled(), session=geode.Session()).stats["model_cache"] == str(entry)


def test_entry_writable_by_others_is_not_trusted(cache_dir):
    geode.compile(_scaled(), session=geode.Session())
    (entry,) = list((cache_dir / cache.MODEL_AREA).glob("*/model.geode"))
    os.chmod(entry, 0o622)
    assert "model_cache" not in geode.compile(_scaled(), session=geode.Session()).stats


def test_cache_folder_writable_by_others_is_not_used(tmp_path, monkeypatch):
    d = tmp_path / "shared"
    d.mkdir()
    os.chmod(d, 0o777)
    monkeypatch.setenv("GEODE_CACHE_DIR", str(d))
    monkeypatch.setenv("GEODE_MODEL_CACHE", "1")
    geode.compile(_scaled(), session=geode.Session())
    assert not (d / cache.MODEL_AREA).exists()


def test_a_cached_model_starts_from_the_initial_variables(cache_dir):
    def graph():
        g = geode.Graph("v")
        x = g.input("x", ["N", 4])
        g.output(g.op("Mul", x, g.variable(np.ones(4, np.float32), "w")), names=["y"])
        return g

    first = geode.compile(graph(), session=geode.Session())
    key = next(s.var_key for s in first.plan.slots if s.name == "w")
    first.var_manager.assign(key, np.full(4, 7.0, np.float32))
    second = geode.compile(graph(), session=geode.Session())
    assert "model_cache" in second.stats
    y = second.run({"x": np.ones((1, 4), np.float32)})["y"]
    np.testing.assert_array_equal(y, np.ones((1, 4), np.float32))


@pytest.mark.numba
def test_numba_backend_is_never_cached(cache_dir):
    g = _scaled()
    geode.compile(g, session=geode.Session(), backend="numba")
    assert not (cache_dir / cache.MODEL_AREA).exists()


def test_option_turns_it_off(cache_dir):
    geode.compile(_scaled(), session=geode.Session(), model_cache=False)
    assert not (cache_dir / cache.MODEL_AREA).exists()
    geode.compile(_scaled(), session=geode.Session())
    again = geode.compile(_scaled(), session=geode.Session(), model_cache=False)
    assert "model_cache" not in again.stats


def _onnx_file(folder, scale=2.0, external=False):
    import onnx

    from geode.compiler.frontend.onnx_export import to_onnx

    path = os.path.join(folder, f"m{scale}{'x' if external else ''}.onnx")
    proto = to_onnx(_scaled(scale))
    if external:
        onnx.save_model(proto, path, save_as_external_data=True, size_threshold=0)
    else:
        onnx.save_model(proto, path)
    return path


def test_an_onnx_file_seen_before_is_not_read_as_onnx(cache_dir, tmp_path, monkeypatch):
    from geode.compiler.frontend import onnx as frontend

    path = _onnx_file(tmp_path)
    first = geode.compile(path, session=geode.Session())
    assert "model_cache" not in first.stats

    def refuse(*a, **k):
        raise AssertionError("the ONNX file was read again")

    monkeypatch.setattr(frontend, "import_model", refuse)
    _no_pipeline(monkeypatch)
    second = geode.load(path, session=geode.Session())
    assert "model_cache" in second.stats
    np.testing.assert_array_equal(first.run(_feeds())["y"], second.run(_feeds())["y"])


def test_changed_onnx_bytes_are_a_miss(cache_dir, tmp_path):
    path = _onnx_file(tmp_path, 2.0)
    geode.compile(path, session=geode.Session())
    os.replace(_onnx_file(tmp_path, 3.0), path)
    model = geode.compile(path, session=geode.Session())
    assert "model_cache" not in model.stats
    np.testing.assert_allclose(
        model.run(_feeds())["y"], np.tanh(_feeds()["x"] * 3), rtol=1e-5, atol=1e-6
    )


def test_external_data_is_keyed_by_the_graph(cache_dir, tmp_path):
    """A file whose weights live in another file is keyed by what it holds (read as
    ONNX), so changed weights are a miss even when the .onnx file is the same."""
    path = _onnx_file(tmp_path, 2.0, external=True)
    assert cache.file_key(path, geode.config.current()) is None
    geode.compile(path, session=geode.Session())
    assert "model_cache" in geode.compile(path, session=geode.Session()).stats


def test_signed_cache_trusts_only_signed_models(cache_dir, monkeypatch, tmp_path):
    """With cache signing, a cached model is used only when its manifest carries a valid
    HMAC of its checksum under the user's key; another key's or an unsigned one is not."""
    monkeypatch.setenv("GEODE_CACHE_KEY", str(tmp_path / "key"))
    signed = {"cache_sign": True}
    geode.compile(_scaled(), session=geode.Session(), **signed)
    (entry,) = list((cache_dir / cache.MODEL_AREA).glob("*/model.geode"))
    assert (entry.parent / "model.json").exists()
    assert "model_cache" in geode.compile(_scaled(), session=geode.Session(), **signed).stats
    monkeypatch.setenv("GEODE_CACHE_KEY", str(tmp_path / "another key"))
    model = geode.compile(_scaled(), session=geode.Session(), **signed)
    assert "model_cache" not in model.stats  # written by someone without our key
    (entry.parent / "model.json").unlink()
    assert "model_cache" not in geode.compile(_scaled(), session=geode.Session(), **signed).stats


def test_the_cache_follows_the_tuning_database_and_skips_given_schedules(cache_dir, tmp_path):
    """A model compiled with a tuning database is cached under the database's contents:
    tuned further, the database gives another key; a compile given schedules (functions
    have no file form) does not use the cache."""
    import re

    from geode.codegen.schedule import Trace
    from geode.codegen.tuning_db import (
        TunedEntry,
        TuningDB,
        device_fingerprint,
        effective_threads,
    )

    g = examples.ALL["layernorm"](hidden=64).graph
    db_path = tmp_path / "db.json"
    first = geode.compile(g, session=geode.Session(), tuning_db=db_path)
    assert "model_cache" not in first.stats
    again = geode.compile(g, session=geode.Session(), tuning_db=db_path)
    assert "model_cache" in again.stats
    (key,) = re.findall(r"key ([0-9a-f]{32})", first.explain())
    db = TuningDB.open(db_path)
    device = device_fingerprint(effective_threads(0))
    db.put(TunedEntry(key, device, "default", Trace(), 1e-3, 1e-3, 4))
    db.save()
    tuned = geode.compile(g, session=geode.Session(), tuning_db=db_path)
    assert "model_cache" not in tuned.stats
    assert "tuned (the default was best)" in tuned.explain()
    cached = geode.compile(g, session=geode.Session(), tuning_db=db_path)
    assert "model_cache" in cached.stats and "tuned (the default was best)" in cached.explain()
    fused = [k for k in cached.kernels if k.key]  # the key and origin survive the model file
    assert [(k.key, k.schedule) for k in fused] == [(key, "tuned-default")]
    given = geode.compile(g, session=geode.Session(), schedules={key: lambda sch: None})
    assert "model_cache" not in given.stats


def test_a_cache_entry_is_not_flushed_to_disk_a_saved_model_is(cache_dir, monkeypatch, tmp_path):
    """The cache's entries are written like the kernel cache's files (atomically, no
    fsync: a load checks each against its digest, and a lost one is compiled again); a
    file the user saves is flushed before it replaces the old one."""
    synced: list[int] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    model = geode.compile(_scaled(5.0), session=geode.Session())
    assert list((cache_dir / cache.MODEL_AREA).glob("*/model.geode"))
    assert synced == []
    model.save(tmp_path / "kept.geode")
    assert len(synced) == 1
    _no_pipeline(monkeypatch)
    again = geode.compile(_scaled(5.0), session=geode.Session())  # the entry loads
    assert "model_cache" in again.stats
    np.testing.assert_array_equal(model.run(_feeds())["y"], again.run(_feeds())["y"])
