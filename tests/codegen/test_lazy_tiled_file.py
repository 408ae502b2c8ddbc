"""A model file carries an attention entry's key-tiled body as object code: saving builds
it when no call has (``DenseKernel.build_tiled``), the file records the body's module
and its epilogue kernel with the rule, and loading links them with the other kernels
(one link) and writes the entry's cell, so a loaded model's long calls run no LLVM and
import no ``llvmlite.binding`` (checked in a fresh process), with the bits of the
in-process build. Records that are not what the writer wrote raise ModelFileError.
The limit is forced low (``low_limit``: the body from 33 keys)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from test_lazy_tiled import check, compiled, entry, forms, low_limit  # noqa: F401
from test_online_attention import feeds_for

import geode
from geode.errors import ModelFileError
from geode.modelfile import container

pytestmark = pytest.mark.usefixtures("low_limit")

LENGTHS = (16, 48, 49)  # a short call, then two long ones

_CHILD = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import geode
    from geode.codegen.backends.llvm import jit

    def refuse(*a, **k):
        raise AssertionError("LLVM compiled code after loading a model file")

    jit.compile_ir = refuse
    model = geode.load(sys.argv[1])
    data = np.load(sys.argv[2])
    out = {}
    for s in sys.argv[4:]:
        feeds = {k[len(s) + 1:]: data[k] for k in data.files if k.startswith(s + "_")}
        out[s] = model.run(feeds)["y"]
    np.savez(sys.argv[3], **out)
    print(json.dumps({"binding": "llvmlite.binding" in sys.modules}))
    """
)


def _run_child(tmp_path, path) -> dict[str, np.ndarray]:
    """The loaded model's outputs at :data:`LENGTHS` in a fresh process that refuses LLVM
    and must not import ``llvmlite.binding``."""
    feeds = {s: feeds_for("pad", "float32", 2, 3, s, 8, s) for s in LENGTHS}
    flat = {f"{s}_{k}": v for s, f in feeds.items() for k, v in f.items()}
    np.savez(tmp_path / "feeds.npz", **flat)
    (tmp_path / "child.py").write_text(_CHILD, encoding="utf-8")
    env = {**os.environ, "GEODE_CACHE_DIR": str(tmp_path / "empty_cache")}
    args = [sys.executable, str(tmp_path / "child.py"), str(path), str(tmp_path / "feeds.npz")]
    args += [str(tmp_path / "out.npz"), *map(str, LENGTHS)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"binding": False}
    assert not os.path.exists(tmp_path / "empty_cache" / "kernels")  # nothing compiled
    out = np.load(tmp_path / "out.npz")
    return {s: out[str(s)] for s in LENGTHS}


@pytest.mark.parametrize("long_first", [False, True])
def test_a_fresh_process_runs_the_body_from_the_file(tmp_path, long_first):
    """Saved before any long call (save builds the body, through the object cache) or
    after one (the body built then): a fresh process loads the file and runs short and
    long calls without LLVM, with the in-process build's bits."""
    m = compiled(str(tmp_path / "cache"))
    k = entry(m)
    if long_first:
        check(m, 48, forms()[0])
    assert k.tiled_builds == int(long_first)
    m.save(tmp_path / "a.geode")
    assert k.tiled_builds == 1 and k.linked is not None
    got = _run_child(tmp_path, tmp_path / "a.geode")
    tiled, rows = forms()
    for s in LENGTHS:
        feeds = feeds_for("pad", "float32", 2, 3, s, 8, s)
        np.testing.assert_array_equal(got[s], m.run(feeds)["y"], err_msg=str(s))
        np.testing.assert_array_equal(got[s], (tiled if s >= 33 else rows).run(feeds)["y"])


def test_loaded_in_process_links_once_and_builds_nothing(tmp_path, llvm_runs):
    """Loaded here: the body linked in the one link of the model's kernels, its cell
    written, nothing left to build; short and long calls compile nothing; saved again,
    the file carries the same body."""
    m = compiled()
    m.save(tmp_path / "a.geode")
    _, done = llvm_runs
    done.clear()
    back = geode.load(tmp_path / "a.geode", session=geode.Session())
    k = entry(back)
    assert k.prepare is None and k.lazy is None and k.tiled_builds == 0
    assert "key-tiled bodies: 1 linked from object code, 0 kept as IR" in back.explain()
    assert k.linked.loaded.tracker is k.kernel._loaded.tracker  # one library
    assert k.linked.rule == entry(m).linked.rule
    tiled, rows = forms()
    for s in (16, 48, 70, 33, 32):
        check(back, s, tiled if s >= 33 else rows)
    back.save(tmp_path / "b.geode")
    again = geode.load(tmp_path / "b.geode", session=geode.Session())
    assert entry(again).linked is not None
    check(again, 48, tiled)
    assert not done, [ir[:80] for ir in done]


def test_a_body_that_cannot_be_built_saves_the_row_panels(tmp_path, llvm_runs):
    """A body LLVM refuses at save: the file records none (no IR to fail again), the
    loaded model's long calls run the row panels, compiling nothing."""
    m = compiled()
    k = entry(m)
    k.lazy = dataclasses.replace(k.lazy, body_ir="this is not IR")
    m.save(tmp_path / "a.geode")
    assert "LLVM rejected" in k.tiled_error
    header = _split((tmp_path / "a.geode").read_bytes())
    (dense,) = [r for r in header["images"] if r["kind"] == "dense"]
    assert not {"lazy", "body", "tiled"} & set(dense)
    _, done = llvm_runs
    done.clear()
    back = geode.load(tmp_path / "a.geode", session=geode.Session())
    check(back, 48, forms()[1])
    assert not done


def test_a_file_with_the_body_as_ir_still_loads(tmp_path):
    """The body kept as IR (the model cache's files, and files written before): the first
    long call after loading compiles it, once."""
    m = compiled()
    m.saver(tmp_path / "a.geode", True, "embed", bodies=False)
    assert entry(m).tiled_builds == 0
    back = geode.load(tmp_path / "a.geode", session=geode.Session())
    k = entry(back)
    tiled, rows = forms()
    check(back, 16, rows)
    assert k.tiled_builds == 0 and k.linked is None
    assert "key-tiled bodies: 0 linked from object code, 1 kept as IR" in back.explain()
    check(back, 48, tiled)
    assert k.tiled_builds == 1


def _split(data: bytes) -> dict:
    """A model file's header (its layout: ``modelfile/container.py``)."""
    _, _, _, n = struct.unpack_from("<8sIIQ", data)
    return json.loads(data[24 : 24 + n])


def _reseal(data: bytes, header: dict) -> bytes:
    """The file with ``header`` in place of its own and a valid checksum: what an editor
    who knows the format could write."""
    _, _, _, n = struct.unpack_from("<8sIIQ", data)
    blobs = data[24 + n + (-(24 + n) % 64) : -32]
    head = json.dumps(header).encode()
    out = struct.pack("<8sIIQ", container.MAGIC, container.FORMAT_VERSION, 0, len(head)) + head
    out += b"\0" * (-len(out) % 64) + blobs
    return out + hashlib.sha256(out).digest()


def _dense(h: dict) -> dict:
    (r,) = [r for r in h["images"] if r.get("kind") == "dense" and "body" in r]
    return r


def _body(h: dict) -> dict:
    return h["images"][_dense(h)["body"]]


EDITS = {
    "rule field": lambda h: _dense(h)["rule"].update(limit="4096"),
    "rule layouts": lambda h: _dense(h)["rule"].update(layouts=[None, [2, 8]]),
    "rule bool": lambda h: _dense(h)["rule"].update(batched=1),
    "no rule": lambda h: _dense(h).pop("rule"),
    "body index": lambda h: _dense(h).update(body=10**6),
    "body not a body": lambda h: _dense(h).update(body=_dense(h)["epilogue"]),
    "no epilogue": lambda h: _dense(h).pop("tiled"),
    "two bodies": lambda h: _dense(h).update(lazy={}),
    "not calling it": lambda h: _body(h).update(imports=[]),
    "wrong symbol": lambda h: _body(h).update(entry="geode_elsewhere"),
    "bad object": lambda h: _body(h).update(object=10**6),
}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_a_hostile_body_record_is_refused(tmp_path, edit):
    """Each record an editor could write in place of the writer's raises ModelFileError."""
    if not _SAVED:
        m = compiled()
        m.save(tmp_path / "a.geode")
        _SAVED.append((tmp_path / "a.geode").read_bytes())
    data = _SAVED[0]
    header = _split(data)
    EDITS[edit](header)
    (tmp_path / "bad.geode").write_bytes(_reseal(data, header))
    with pytest.raises(ModelFileError, match="model file"):
        geode.load(tmp_path / "bad.geode", session=geode.Session())


_SAVED: list[bytes] = []
