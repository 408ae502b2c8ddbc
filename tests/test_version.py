"""geode/version.py: the code digest the model cache keys on changes with any code file's
name, size or modification time, and nothing else (bytecode caches, other files)."""

from __future__ import annotations

import os

from geode.version import code_digest, source_digest


def test_code_digest_follows_the_code(tmp_path):
    (tmp_path / "pkg").mkdir()
    mod = tmp_path / "pkg" / "mod.py"
    mod.write_text("x = 1\n", encoding="utf-8")
    first = code_digest(str(tmp_path))
    assert code_digest(str(tmp_path)) == first
    (tmp_path / "pkg" / "__pycache__").mkdir()
    (tmp_path / "pkg" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\0")
    (tmp_path / "notes.txt").write_text("not code", encoding="utf-8")
    assert code_digest(str(tmp_path)) == first
    st = os.stat(mod)
    os.utime(mod, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    second = code_digest(str(tmp_path))
    assert second != first
    (tmp_path / "pkg" / "_ext.so").write_bytes(b"\x7fELF")
    assert code_digest(str(tmp_path)) not in (first, second)


def test_source_digest_is_geodes():
    import geode

    assert source_digest() == code_digest(os.path.dirname(geode.__file__))
