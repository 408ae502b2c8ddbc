"""The tuning database: entries keyed by kernel key and device, written atomically and
read back; files others may write, other formats and bad signatures refused; a
malformed entry dropped (and so tuned again) without losing the others."""

from __future__ import annotations

import json
import os

import pytest
from test_schedule import k_reduce

from geode.codegen.schedule import Schedule
from geode.codegen.tuning_db import (
    TunedEntry,
    TuningDB,
    TuningDBWarning,
    db_digest,
    device_fingerprint,
    device_info,
    entry_id,
)
from geode.errors import TuningError


def _entry(key="k" * 32, device="d1", status="tuned") -> TunedEntry:
    sch = Schedule(k_reduce())
    sch.rfactor("sum_0", "sum_0_k0", 2)
    return TunedEntry(key, device, status, sch.trace, 2e-3, 1e-3, 12, {"partials": 2})


def test_entries_round_trip_through_the_file(tmp_path) -> None:
    path = tmp_path / "sub" / "db.json"
    db = TuningDB.open(path)
    assert not db.entries and not db.digest
    db.put(_entry(), {"cpu": "x"})
    db.put(_entry("a" * 32, status="default"))
    db.save()
    assert oct(os.stat(path).st_mode & 0o022) == "0o0"
    back = TuningDB.open(path)
    e = back.get("k" * 32, "d1")
    assert e is not None and e.status == "tuned" and e.speedup == pytest.approx(2.0)
    assert str(e.trace) == str(_entry().trace) and e.tuned_at and e.knobs == {"partials": 2}
    assert back.get("k" * 32, "d2") is None  # another device: no entry
    assert back.get("a" * 32, "d1").status == "default"
    assert back.devices == {"d1": {"cpu": "x"}}
    assert back.digest == db_digest(path) and db_digest(tmp_path / "none") == "none"
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["format"] == "geode-tuning-db" and entry_id("k" * 32, "d1") in data["entries"]


def test_the_device_fingerprint_covers_threads() -> None:
    assert device_fingerprint(1) != device_fingerprint(2)
    assert device_fingerprint(2) == device_fingerprint(2)
    info = device_info(2)
    assert info["threads"] == 2 and info["cores"] >= 1 and "cpu_features" in info["target"]


def test_a_malformed_entry_is_dropped_and_the_rest_kept(tmp_path) -> None:
    path = tmp_path / "db.json"
    db = TuningDB.open(path)
    db.put(_entry())
    db.put(_entry("b" * 32))
    db.save()
    data = json.loads(path.read_text(encoding="utf-8"))
    bad = entry_id("b" * 32, "d1")
    data["entries"][bad]["trace"]["steps"][0]["primitive"] = "explode"
    data["entries"]["misfiled"] = data["entries"][entry_id("k" * 32, "d1")]
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.warns(TuningDBWarning) as caught:
        back = TuningDB.open(path)
    text = " ".join(str(w.message) for w in caught)
    assert "unknown primitive 'explode'" in text and "filed under the wrong key" in text
    assert sorted(back.dropped) == sorted([bad, "misfiled"])
    assert list(back.entries) == [entry_id("k" * 32, "d1")]
    back.save()  # rewritten without the bad entries
    assert sorted(json.loads(path.read_text(encoding="utf-8"))["entries"]) == [
        entry_id("k" * 32, "d1")
    ]


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("status", "great", "status 'great'"),
        ("trials", -1, "'trials' must be an int"),
        ("best_s", "fast", "'best_s' must be a number"),
        ("knobs", [], "'knobs' must be an object"),
        ("extra", 1, "unknown fields"),
    ],
)
def test_entry_fields_are_checked(tmp_path, field, value, message) -> None:
    path = tmp_path / "db.json"
    db = TuningDB.open(path)
    db.put(_entry())
    db.save()
    data = json.loads(path.read_text(encoding="utf-8"))
    next(iter(data["entries"].values()))[field] = value
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.warns(TuningDBWarning, match=message):
        assert not TuningDB.open(path).entries


@pytest.mark.parametrize(
    "text,message",
    [
        ("{oops", "not valid JSON"),
        ('{"format": "something-else"}', "is not a geode tuning database"),
        ('{"format": "geode-tuning-db", "version": 9}', "format version 9"),
        ('{"format": "geode-tuning-db", "version": 1, "entries": []}', "must be objects"),
    ],
)
def test_files_that_are_not_tuning_databases_are_refused(tmp_path, text, message) -> None:
    path = tmp_path / "db.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(TuningError, match=message):
        TuningDB.open(path)
    assert path.read_text(encoding="utf-8") == text  # never overwritten


def test_files_others_may_write_are_refused(tmp_path) -> None:
    path = tmp_path / "db.json"
    db = TuningDB.open(path)
    db.put(_entry())
    db.save()
    os.chmod(path, 0o666)
    with pytest.raises(TuningError, match="writable by group or others"):
        TuningDB.open(path)
    assert db_digest(path) == "unreadable"
    os.chmod(path, 0o644)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(TuningError, match="not a regular file"):
        TuningDB.open(tmp_path / "fifo")


def test_signed_databases(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("GEODE_CACHE_KEY", "k" * 32)
    path = tmp_path / "db.json"
    db = TuningDB.open(path, sign=True)
    db.put(_entry())
    db.save()
    assert "hmac" in json.loads(path.read_text(encoding="utf-8"))
    assert TuningDB.open(path, sign=True).get("k" * 32, "d1") is not None
    data = json.loads(path.read_text(encoding="utf-8"))
    data["entries"][entry_id("k" * 32, "d1")]["best_s"] = 1e-9  # tampered
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(TuningError, match="no valid signature"):
        TuningDB.open(path, sign=True)
    monkeypatch.setenv("GEODE_CACHE_KEY", "another key of enough length")
    unsigned = tmp_path / "plain.json"
    plain = TuningDB.open(unsigned)
    plain.put(_entry())
    plain.save()
    with pytest.raises(TuningError, match="no valid signature"):
        TuningDB.open(unsigned, sign=True)
