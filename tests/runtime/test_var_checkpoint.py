"""The variable checkpoint format (geode/runtime/var_checkpoint.py) and the VarManager's
snapshot/restore over it."""

import json
import os
import stat
import struct

import numpy as np
import pytest

from geode.errors import CheckpointError, GeodeError
from geode.runtime import var_checkpoint as vc
from geode.runtime import var_format
from geode.runtime.var_manager import VarManager


def _entries():
    rng = np.random.default_rng(0)
    return [
        vc.entry("w", rng.standard_normal((3, 4)).astype(np.float32)),
        vc.entry("step", np.array(7, np.int64)),
        vc.entry("mask", np.array([True, False, True])),
        vc.entry("empty", np.zeros((0, 5), np.float16)),
        vc.entry("z", np.arange(4).astype(np.complex64)),
        vc.entry("wt", rng.standard_normal((2, 5)), var_format.transposed([1, 0])),
    ]


def _same(a, b):
    assert [e.describe() for e in a] == [e.describe() for e in b]
    for x, y in zip(a, b):
        assert x.data.dtype == y.data.dtype and x.data.shape == y.data.shape
        np.testing.assert_array_equal(x.data, y.data)


def test_round_trip_bytes_and_file(tmp_path):
    entries = _entries()
    blob = vc.encode(entries)
    assert blob[:8] == vc.MAGIC
    _same(entries, vc.decode(blob, "blob"))
    path = tmp_path / "vars.ckpt"
    vc.write(path, entries)
    assert path.read_bytes() == blob
    _same(entries, vc.read(str(path)))
    vc.write(path, [])  # an empty checkpoint is a checkpoint
    assert vc.read(path) == []


def test_big_endian_data_is_saved_little_endian():
    data = np.arange(6, dtype=">i4").reshape(2, 3)
    (got,) = vc.decode(vc.encode([vc.entry("b", data)]), "x")
    assert got.dtype == np.dtype("int32") and got.dtype.isnative
    np.testing.assert_array_equal(got.data, data)


@pytest.mark.parametrize(
    "bad, match",
    [
        (
            vc.VarEntry("s", np.dtype(object), (1,), "ND", np.array(["x"], object)),
            "cannot be saved",
        ),
        (vc.VarEntry("s", np.dtype("f4"), (2,), "ND", np.zeros(3, np.float32)), "description"),
        (vc.VarEntry("", np.dtype("f4"), (1,), "ND", np.zeros(1, np.float32)), "name"),
        (vc.entry("r", np.zeros(3, np.float32), "TRANSPOSED(1,0)"), "rank 1"),
    ],
)
def test_entries_that_cannot_be_saved(bad, match):
    with pytest.raises(GeodeError, match=match):
        vc.encode([bad])


def test_duplicate_names_refused():
    with pytest.raises(CheckpointError, match=r"\['a'\] appear more than once"):
        vc.encode([vc.entry("a", np.zeros(1)), vc.entry("a", np.ones(1))])


# -- corruption ---------------------------------------------------------------------------
def _data_offset(blob: bytes, name: str) -> int:
    hlen = struct.unpack_from("<Q", blob, 16)[0]
    header = json.loads(blob[24 : 24 + hlen])
    start = -(-(24 + hlen) // 64) * 64
    rec = next(r for r in header["entries"] if r["name"] == name)
    return start + rec["offset"]


def test_flipped_data_byte_names_the_variable():
    blob = bytearray(vc.encode(_entries()))
    blob[_data_offset(bytes(blob), "w") + 5] ^= 0x10
    with pytest.raises(CheckpointError, match=r"altered: checksum mismatch in the data of \['w'\]"):
        vc.decode(bytes(blob), "ckpt")


def test_flipped_header_byte_or_trailer_is_altered():
    blob = vc.encode(_entries())
    hlen = struct.unpack_from("<Q", blob, 16)[0]
    text = blob[24 : 24 + hlen]
    # a shape digit changed: still valid JSON, caught by the checksum (or the size check)
    pos = 24 + text.index(b'"shape": [3, 4]') + len('"shape": [')
    changed = bytearray(blob)
    changed[pos] = ord("2")
    with pytest.raises(CheckpointError, match="altered"):
        vc.decode(bytes(changed), "ckpt")
    trailer = bytearray(blob)
    trailer[-1] ^= 1
    with pytest.raises(
        CheckpointError, match="altered: checksum mismatch in its header or padding"
    ):
        vc.decode(bytes(trailer), "ckpt")
    broken = bytearray(blob)
    broken[24] = ord("[")  # the header is no longer the JSON object
    with pytest.raises(CheckpointError, match="altered"):
        vc.decode(bytes(broken), "ckpt")


@pytest.mark.parametrize("keep", [0, 10, 30, 200, -33, -1])
def test_truncated_file(tmp_path, keep):
    blob = vc.encode(_entries())
    path = tmp_path / "t.ckpt"
    path.write_bytes(blob[:keep])
    with pytest.raises(CheckpointError, match="truncated"):
        vc.read(path)


def test_not_a_checkpoint_other_version_and_trailing_bytes(tmp_path):
    blob = vc.encode(_entries())
    with pytest.raises(CheckpointError, match="not a geode variable checkpoint"):
        vc.decode(b"PK\x03\x04" + blob[4:], "zip")
    other = bytearray(blob)
    struct.pack_into("<I", other, 8, 99)
    with pytest.raises(CheckpointError, match="version 99; this geode reads version 1"):
        vc.decode(bytes(other), "x")
    with pytest.raises(CheckpointError, match="1 bytes after the checksum"):
        vc.decode(blob + b"\0", "x")


def test_header_lies_even_with_a_valid_checksum():
    """A crafted file with a correct checksum is still checked field by field."""
    import hashlib

    def craft(mutate):
        header = {
            "version": 1,
            "payload_size": 64,
            "entries": [
                {
                    "name": "x",
                    "dtype": "<f4",
                    "shape": [4],
                    "format": "ND",
                    "offset": 0,
                    "nbytes": 16,
                    "sha256": hashlib.sha256(bytes(16)).hexdigest(),
                }
            ],
        }
        mutate(header["entries"][0])
        text = json.dumps(header).encode()
        head = struct.pack("<8sIIQ", vc.MAGIC, 1, 0, len(text)) + text
        head += bytes(-len(head) % 64) + bytes(64)
        return head + hashlib.sha256(head).digest()

    assert vc.decode(craft(lambda r: None), "ok")[0].shape == (4,)
    with pytest.raises(CheckpointError, match="unsupported dtype '|O'"):
        vc.decode(craft(lambda r: r.update(dtype="|O", nbytes=16, shape=[2])), "x")
    with pytest.raises(CheckpointError, match="do not hold"):
        vc.decode(craft(lambda r: r.update(shape=[5])), "x")
    with pytest.raises(CheckpointError, match="malformed entry"):
        vc.decode(craft(lambda r: r.update(offset=60)), "x")
    with pytest.raises(CheckpointError, match="malformed entry"):
        vc.decode(craft(lambda r: r.update(shape=[-4])), "x")
    with pytest.raises(CheckpointError, match="rank 1"):
        vc.decode(craft(lambda r: r.update(format="TRANSPOSED(1,0)")), "x")


# -- paths --------------------------------------------------------------------------------
def test_write_is_atomic_and_keeps_the_old_file_on_failure(tmp_path):
    path = tmp_path / "v.ckpt"
    vc.write(path, _entries()[:1])
    before = path.read_bytes()
    bad = [vc.entry("ok", np.ones(2)), vc.VarEntry("s", np.dtype(object), (1,), "ND", np.zeros(1))]
    with pytest.raises(CheckpointError):
        vc.write(path, bad)
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["v.ckpt"]  # no temporary file left behind


def test_write_keeps_an_existing_files_mode(tmp_path):
    path = tmp_path / "v.ckpt"
    path.write_bytes(b"old")
    os.chmod(path, 0o640)
    vc.write(path, _entries())
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640


def test_hostile_paths(tmp_path):
    entries = _entries()[:1]
    with pytest.raises(CheckpointError, match="is a directory"):
        vc.write(tmp_path, entries)
    with pytest.raises(CheckpointError, match="is a directory"):
        vc.read(tmp_path)
    with pytest.raises(CheckpointError, match="does not exist"):
        vc.write(tmp_path / "no" / "v.ckpt", entries)
    with pytest.raises(CheckpointError, match="cannot read"):
        vc.read(tmp_path / "missing.ckpt")
    with pytest.raises(CheckpointError, match="str or os.PathLike"):
        vc.write(42, entries)
    with pytest.raises(CheckpointError, match="NUL"):
        vc.read("a\0b")
    target = tmp_path / "real.ckpt"
    vc.write(target, entries)
    link = tmp_path / "link.ckpt"
    link.symlink_to(target)
    with pytest.raises(CheckpointError, match="symbolic link"):
        vc.write(link, entries)
    _same(entries, vc.read(link))  # reading follows the link the user named
    dangling = tmp_path / "dangling.ckpt"
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(CheckpointError, match="symbolic link"):
        vc.write(dangling, entries)
    assert not (tmp_path / "nowhere").exists()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(CheckpointError, match="not a regular file"):
        vc.write(fifo, entries)
    with pytest.raises(CheckpointError, match="not a regular file"):
        vc.read(fifo)


def test_unwritable_folder(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    os.chmod(folder, 0o500)
    target = folder / "v.ckpt"
    if os.geteuid() == 0:  # root writes in any folder of a writable file system
        if not os.path.isdir("/sys"):
            pytest.skip("running as root without a read-only /sys")
        target = "/sys/geode-test.ckpt"
    try:
        with pytest.raises(CheckpointError, match="cannot create a file"):
            vc.write(target, _entries())
    finally:
        os.chmod(folder, 0o700)


# -- the VarManager over it ---------------------------------------------------------------
def test_snapshot_and_restore_between_managers_with_other_formats():
    a = VarManager(1)
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    a.register_variable("w", w.T.copy(), var_format.transposed([1, 0]))
    a.register_variable("b", np.ones(3, np.float32))
    a.register_constant("c", np.zeros(2, np.float32))
    a.declare_variable("later", np.float32, (2,))
    snap = vc.decode(vc.encode(a.snapshot()), "snap")
    assert [e.name for e in snap] == ["w", "b"]  # constants and uninitialized: not saved
    b = VarManager(2)
    b.register_variable("w", np.zeros((2, 3), np.float32))  # stored as the user sees it
    before = var_format.conversions()
    assert b.restore(snap) == ["w", "b"]
    assert var_format.conversions() == before + 1  # the transposed data converted once
    np.testing.assert_array_equal(b.get("w"), w)
    np.testing.assert_array_equal(b.get_value("b"), np.ones(3))
    # b was not in manager b: registered, but not as an initial value
    b.register_variable("b", np.full(3, 5.0, np.float32))
    np.testing.assert_array_equal(b.get("b"), np.ones(3))


def test_restore_refuses_a_changed_description_before_changing_anything():
    vm = VarManager(3)
    vm.register_variable("a", np.zeros(2, np.float32))
    vm.register_variable("w", np.zeros((2, 3), np.float32))
    vm.register_constant("k", np.zeros(1, np.float32))
    entries = [vc.entry("a", np.ones(2, np.float32)), vc.entry("w", np.ones((3, 2), np.float32))]
    with pytest.raises(CheckpointError, match=r"'w' differs.*float32\[3, 2\].*float32\[2, 3\]"):
        vm.restore(entries, "ckpt")
    np.testing.assert_array_equal(vm.get("a"), 0.0)  # nothing written
    with pytest.raises(CheckpointError, match="'w' differs"):
        vm.restore([vc.entry("w", np.ones((2, 3), np.float64))])
    with pytest.raises(CheckpointError, match="'k' is a constant"):
        vm.restore([vc.entry("k", np.ones(1, np.float32))])
