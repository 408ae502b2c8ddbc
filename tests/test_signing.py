"""geode.signing: the per-user key (file or GEODE_CACHE_KEY) and manifest signatures."""

from __future__ import annotations

import logging
import os
import stat

import pytest

from geode import signing


@pytest.fixture
def config_home(tmp_path, monkeypatch):
    """A fresh XDG_CONFIG_HOME, no GEODE_CACHE_KEY."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv(signing.KEY_ENV, raising=False)
    monkeypatch.setattr(signing, "_warned", set())  # each test sees its warnings
    return tmp_path / "config"


def test_key_file_is_made_private_on_first_use_and_kept(config_home) -> None:
    path = signing.key_path()
    assert path == config_home / "geode" / "cache.key"
    assert not path.exists()
    key = signing.signing_key()
    assert key is not None and len(key) >= 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert signing.signing_key() == key  # the same key on every use
    assert [p.name for p in path.parent.iterdir()] == ["cache.key"], "temporary file left"


@pytest.mark.parametrize("bad_mode", [0o640, 0o604, 0o620])
def test_a_key_file_others_can_read_or_write_is_refused(config_home, caplog, bad_mode) -> None:
    key = signing.signing_key()
    assert key is not None
    os.chmod(signing.key_path(), bad_mode)
    with caplog.at_level(logging.WARNING):
        assert signing.signing_key() is None
    assert str(signing.key_path()) in caplog.text


def test_the_key_can_come_from_the_environment(config_home, monkeypatch, caplog) -> None:
    monkeypatch.setenv(signing.KEY_ENV, "a-shared-ci-secret-of-some-length")
    assert signing.signing_key() == b"a-shared-ci-secret-of-some-length"
    assert not signing.key_path().exists()
    monkeypatch.setenv(signing.KEY_ENV, "short")
    with caplog.at_level(logging.WARNING):
        assert signing.signing_key() is None
    assert signing.KEY_ENV in caplog.text


def test_signatures_cover_every_field_and_need_the_key() -> None:
    key, other = b"k" * 32, b"o" * 32
    manifest = {"key": "abc", "files": {"a.o": "00ff"}, "size": 3}
    signed = {**manifest, signing.FIELD: signing.sign(manifest, key)}
    assert signing.verify(signed, key)
    assert not signing.verify(signed, other)
    assert not signing.verify(manifest, key)  # unsigned
    for field, value in [("size", 4), ("files", {"a.o": "00fe"}), ("key", "abd")]:
        assert not signing.verify({**signed, field: value}, key), field
    assert not signing.verify({**signed, signing.FIELD: 42}, key)
    # the signature does not depend on the order of the fields
    reordered = dict(reversed(list(signed.items())))
    assert signing.verify(reordered, key)
