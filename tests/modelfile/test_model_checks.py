"""Model files are checked before anything in them is used: every way a file can be
wrong, stale, foreign or hostile raises a ModelFileError that names it."""

from __future__ import annotations

import hashlib
import json
import os
import struct

import numpy as np
import pytest

import geode
from geode import examples
from geode.errors import GeodeError, ModelFileError
from geode.modelfile import container
from geode.runtime.var_manager import VarKind


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A saved model with a variable, and its path."""
    g = geode.Graph("checked")
    x = g.input("x", ["N", 4])
    w = g.variable(np.arange(4, dtype=np.float32), "w")
    g.output(g.op("Exp", g.op("Mul", x, w)), names=["y"])
    path = tmp_path_factory.mktemp("m") / "m.geode"
    geode.compile(g, session=geode.Session()).save(path)
    return path


def _split(data: bytes) -> tuple[dict, bytes]:
    """A model file's header and its blob area (from the first blob to the checksum)."""
    _, _, _, n = struct.unpack_from("<8sIIQ", data)
    header = json.loads(data[24 : 24 + n])
    base = 24 + n + (-(24 + n) % 64)
    return header, data[base:-32]


def _reseal(data: bytes, header: dict, version: int = container.FORMAT_VERSION) -> bytes:
    """The file with ``header`` in place of its own and a valid checksum: what an editor
    who knows the format could write."""
    head = json.dumps(header).encode()
    out = struct.pack("<8sIIQ", container.MAGIC, version, 0, len(head)) + head
    out += b"\0" * (-len(out) % 64) + _split(data)[1]
    return out + hashlib.sha256(out).digest()


def _edit(saved, tmp_path, change) -> str:
    data = saved.read_bytes()
    header, _ = _split(data)
    header = change(header) or header
    out = tmp_path / "edited.geode"
    out.write_bytes(_reseal(data, header))
    return out


def _load(path):
    return geode.load(path, session=geode.Session())


def test_reseal_keeps_a_valid_file(saved, tmp_path):
    """The editing helper itself writes loadable files (so the refusals below are real)."""
    model = _load(_edit(saved, tmp_path, lambda h: None))
    y = model.run({"x": np.ones((1, 4), np.float32)})["y"]
    np.testing.assert_allclose(y, np.exp(np.arange(4, dtype=np.float32))[None], rtol=1e-6)


def test_flipped_byte(saved, tmp_path):
    data = bytearray(saved.read_bytes())
    for where in (30, len(data) // 2, len(data) - 40):
        bad = bytearray(data)
        bad[where] ^= 0x10
        (tmp_path / "bad.geode").write_bytes(bytes(bad))
        with pytest.raises(ModelFileError, match="checksum mismatch"):
            _load(tmp_path / "bad.geode")


@pytest.mark.parametrize("keep", [0.99, 0.5, 0.01])
def test_truncated(saved, tmp_path, keep):
    data = saved.read_bytes()
    (tmp_path / "cut.geode").write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(ModelFileError, match="truncated or altered|not a geode model file"):
        _load(tmp_path / "cut.geode")


def test_other_format_version(saved, tmp_path):
    data = saved.read_bytes()
    (tmp_path / "v.geode").write_bytes(_reseal(data, _split(data)[0], version=99))
    with pytest.raises(ModelFileError, match="format version 99"):
        _load(tmp_path / "v.geode")


def test_other_geode_version(saved, tmp_path):
    path = _edit(saved, tmp_path, lambda h: h.update(geode="0.0.1"))
    with pytest.raises(ModelFileError, match=r"written by geode 0\.0\.1"):
        _load(path)


def test_other_llvm(saved, tmp_path):
    path = _edit(saved, tmp_path, lambda h: h["versions"].update(llvm="3.0.0"))
    with pytest.raises(ModelFileError, match="compiled with llvm 3.0.0"):
        _load(path)


def test_missing_cpu_feature(saved, tmp_path):
    def change(h):
        h["target"]["cpu_features"] += ",+imaginary-feature"

    with pytest.raises(ModelFileError, match="CPU features this CPU lacks: imaginary-feature"):
        _load(_edit(saved, tmp_path, change))


def test_other_architecture(saved, tmp_path):
    path = _edit(saved, tmp_path, lambda h: h["target"].update(triple="riscv64-unknown-linux"))
    with pytest.raises(ModelFileError, match="compiled for riscv64"):
        _load(path)


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("shape", [5], r"described as float32\[5\]"),
        ("dtype", "float64", r"described as float64\[4\]"),
        ("format", "NCHW", r"format NCHW"),
    ],
)
def test_changed_variable_description(saved, tmp_path, field, value, match):
    def change(h):
        (var,) = h["variables"]
        var[field] = value

    with pytest.raises(ModelFileError, match=f"variable 'w' is {match}|variable 'w'.*{match}"):
        _load(_edit(saved, tmp_path, change))


def test_variable_missing_from_the_table(saved, tmp_path):
    with pytest.raises(ModelFileError, match=r"no record of variables \['w'\]"):
        _load(_edit(saved, tmp_path, lambda h: h.update(variables=[])))


def test_variable_described_as_the_session_holds_it_otherwise(saved):
    """A session whose variable ``w`` has another shape refuses the file's ``w``."""
    sess = geode.Session()
    g = geode.Graph("other")
    x = g.input("x", [3])
    g.output(g.op("Add", x, g.variable(np.zeros(3, np.float32), "w")), names=["y"])
    geode.compile(g, session=sess)
    with pytest.raises(GeodeError, match="'w'"):
        geode.load(saved, session=sess)


@pytest.mark.parametrize(
    "change",
    [
        lambda h: h.update(units="nope"),
        lambda h: h.update(images=[{"kind": "llvm"}]),
        lambda h: h["images"].__setitem__(0, {**h["images"][0], "object": 10**6}),
        lambda h: h["images"].__setitem__(0, {**h["images"][0], "kind": "python"}),
        lambda h: h["units"][-1].update(engine="shell"),
        lambda h: h["graph"]["values"][0].update(shape=[["__import__", "os"]]),
        lambda h: h["graph"]["values"][0].update(dtype="object-pickle"),
        lambda h: h.update(graph={"name": 1}),
        lambda h: h.update(memory="another plan"),
    ],
    ids=[
        "units",
        "image-fields",
        "blob-ref",
        "image-kind",
        "engine",
        "expr",
        "dtype",
        "graph",
        "memory",
    ],
)
def test_hostile_header(saved, tmp_path, change):
    with pytest.raises(ModelFileError):
        _load(_edit(saved, tmp_path, change))


def test_not_a_model_file(tmp_path):
    (tmp_path / "junk.geode").write_bytes(b"GEODEMDL" + b"\0" * 10)
    with pytest.raises(ModelFileError, match="not a geode model file"):
        geode.Session().load(tmp_path / "junk.geode")
    with pytest.raises(ModelFileError, match="no such file"):
        geode.Session().load(tmp_path / "missing.geode")
    with pytest.raises(ModelFileError, match="not a regular file"):
        geode.Session().load(tmp_path)


def test_fifo_does_not_block(tmp_path):
    fifo = tmp_path / "pipe.geode"
    os.mkfifo(fifo)
    with pytest.raises(ModelFileError, match="not a regular file"):
        geode.Session().load(fifo)


def test_save_never_overwrites_other_files(tmp_path):
    ex = examples.ALL["silu"]()
    model = geode.compile(ex.graph)
    precious = tmp_path / "notes.txt"
    precious.write_text("mine", encoding="utf-8")
    with pytest.raises(ModelFileError, match="refusing to overwrite"):
        model.save(precious)
    assert precious.read_text(encoding="utf-8") == "mine"
    with pytest.raises(ModelFileError, match="not a regular file"):
        model.save(tmp_path)
    with pytest.raises(ModelFileError, match="does not exist"):
        model.save(tmp_path / "no" / "such" / "m.geode")
    model.save(tmp_path / "m.geode")
    model.save(tmp_path / "m.geode")  # a model file is replaced
    model.save(precious, overwrite=True)
    assert container.is_model_file(precious)
    assert sorted(os.listdir(tmp_path)) == ["m.geode", "notes.txt"]  # no temporary left


def test_saved_file_follows_the_umask(tmp_path):
    model = geode.compile(examples.ALL["silu"]().graph)
    old = os.umask(0o077)
    try:
        model.save(tmp_path / "m.geode")
    finally:
        os.umask(old)
    assert os.stat(tmp_path / "m.geode").st_mode & 0o777 == 0o600


def test_load_options(saved):
    with pytest.raises(GeodeError, match=r"options \['fusion'\] do not apply"):
        geode.load(saved, fusion=False)
    model = geode.load(saved, session=geode.Session(), num_threads=1)
    y = model.run({"x": np.ones((2, 4), np.float32)})["y"]
    np.testing.assert_allclose(y, np.exp(np.tile(np.arange(4.0), (2, 1))), rtol=1e-6)


@pytest.mark.numba
def test_numba_models_cannot_be_saved(tmp_path):
    ex = examples.ALL["silu"]()
    model = geode.compile(ex.graph, backend="numba")
    with pytest.raises(ModelFileError, match="LLVM backend"):
        model.save(tmp_path / "m.geode")
    assert not (tmp_path / "m.geode").exists()


# -- the VarManager's record ---------------------------------------------------------------


def test_var_manager_record_holds_every_tensor(saved):
    header, _ = _split(saved.read_bytes())
    state = header["var_manager"]
    assert state["regions"] >= 1 and state["alignment"] > 0 and state["region_size"] > 0
    (w,) = [t for t in state["tensors"] if t["slot"] == "w"]
    assert w == {**w, "role": "variable", "dtype": "float32", "shape": [4], "nbytes": 16}
    start, size = w["region"]
    assert start <= w["offset"] < start + size


def test_a_new_session_gets_the_recorded_layout(saved):
    from geode.modelfile.var_state import layout

    model = _load(saved)
    offsets = model.stats["var_offsets"]
    assert "w" in offsets and all(a == b for a, b in offsets.values())
    assert layout(offsets) in model.explain().splitlines()[0]
    assert (
        layout(offsets)
        == f"VarManager: {len(offsets)} tensors, {len(offsets)} at their recorded logical offsets"
    )
    busy = geode.Session()  # another model's tensors first: relocated, and it still runs
    geode.compile(examples.ALL["layernorm"](hidden=64).graph, session=busy)
    moved = geode.load(saved, session=busy)
    assert any(a != b for a, b in moved.stats["var_offsets"].values())
    x = np.ones((2, 4), np.float32)
    np.testing.assert_array_equal(moved.run({"x": x})["y"], model.run({"x": x})["y"])


@pytest.mark.parametrize(
    "field, value",
    [("dtype", "float64"), ("shape", [5]), ("format", "NC"), ("role", "constant"), ("nbytes", 8)],
)
def test_changed_var_manager_record(saved, tmp_path, field, value):
    def change(h):
        (w,) = [t for t in h["var_manager"]["tensors"] if t["slot"] == "w"]
        w[field] = value

    with pytest.raises(ModelFileError, match=f"VarManager tensor 'w' is recorded with {field}"):
        _load(_edit(saved, tmp_path, change))


def test_a_refused_file_leaves_no_constant_behind(tmp_path):
    g = geode.Graph("consts")
    x = g.input("x", ["N", 4])
    g.output(g.op("Add", x, g.constant(np.arange(4, dtype=np.float32), "b")), names=["y"])
    path = tmp_path / "c.geode"
    geode.compile(g, session=geode.Session()).save(path)

    def change(h):
        (b,) = [t for t in h["var_manager"]["tensors"] if t["role"] == "constant"]
        b["shape"] = [2, 2]

    session = geode.Session()
    with pytest.raises(ModelFileError, match="is recorded with shape"):
        geode.load(_edit(path, tmp_path, change), session=session)
    vm = session.var_manager
    assert [k.name for k in list(vm.keys()) if vm.kind(k) is VarKind.CONSTANT] == []
    assert geode.load(path, session=session).run({"x": np.ones((1, 4), np.float32)})["y"].shape


@pytest.mark.parametrize(
    "change, match",
    [
        (
            lambda h: h["var_manager"].update(tensors=[]),
            "'w' of the VarManager is missing from the file",
        ),
        (
            lambda h: h["var_manager"]["tensors"].append({"slot": "ghost"}),
            "'ghost' of the VarManager is missing from the plan",
        ),
        (lambda h: h.update(var_manager=[1]), "bad VarManager record"),
        (lambda h: h["var_manager"]["tensors"].append(7), "bad VarManager tensor record"),
    ],
    ids=["missing", "extra", "malformed", "bad-tensor"],
)
def test_var_manager_record_must_match_the_plan(saved, tmp_path, change, match):
    with pytest.raises(ModelFileError, match=match):
        _load(_edit(saved, tmp_path, change))
