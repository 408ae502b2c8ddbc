"""geode.safe_files: reads that never block or follow links, private folders, the umask."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import stat
from pathlib import Path

import pytest

from geode import safe_files


@contextlib.contextmanager
def umask(mask: int):
    """Run the block under ``mask`` (process-wide: the tests here create no threads)."""
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


@contextlib.contextmanager
def deadline(seconds: int):
    """Fail (instead of hanging) if the block takes longer than ``seconds``."""

    def expired(signum, frame):
        raise TimeoutError(f"blocked for more than {seconds} s")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def test_umask_is_read_without_changing_it() -> None:
    for m in (0o022, 0o077, 0o002):
        with umask(m):
            assert safe_files.umask() == m
            assert safe_files.umask() == m


@pytest.mark.parametrize(
    "mask, file_mode, dir_mode",
    [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700), (0o002, 0o644, 0o755), (0o027, 0o640, 0o750)],
)
def test_writes_are_never_more_permissive_than_the_umask(tmp_path, mask, file_mode, dir_mode):
    target = tmp_path / "a" / "b" / "f.bin"
    with umask(mask):
        safe_files.atomic_write(target, b"data")
    assert target.read_bytes() == b"data"
    assert mode(target) == file_mode
    assert mode(tmp_path / "a") == dir_mode and mode(tmp_path / "a" / "b") == dir_mode
    # never group- or other-writable, even when the umask would allow it
    assert not mode(target) & 0o022
    assert [p.name for p in target.parent.iterdir()] == ["f.bin"], "temporary file left"


def test_read_file_reads_a_private_regular_file(tmp_path) -> None:
    p = tmp_path / "f"
    p.write_bytes(b"x" * 100)
    os.chmod(p, 0o644)
    assert safe_files.read_file(p, 100) == b"x" * 100
    assert safe_files.read_file(p, 99) is None  # too large
    assert safe_files.read_file(tmp_path / "missing", 100) is None
    assert safe_files.read_file(p, 100, forbid=stat.S_IROTH) is None
    os.chmod(p, 0o666)  # writable by others: refused unless private is off
    assert safe_files.read_file(p, 100) is None
    assert safe_files.read_file(p, 100, private=False) == b"x" * 100


def test_read_file_never_blocks_on_a_fifo_or_follows_a_link(tmp_path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    link = tmp_path / "link"
    link.symlink_to("/dev/zero")
    with deadline(10):
        assert safe_files.read_file(fifo, 1 << 20) is None
        assert safe_files.read_file(link, 1 << 20) is None
        assert safe_files.read_file(tmp_path, 1 << 20) is None  # a folder


def test_private_folder_refuses_a_folder_others_can_write_and_names_it(tmp_path, caplog) -> None:
    ok = tmp_path / "mine"
    (ok / "kernels").mkdir(parents=True)
    os.chmod(ok, 0o755)
    os.chmod(ok / "kernels", 0o700)
    assert safe_files.private_folder(ok, ("kernels",), "test cache")
    assert safe_files.private_folder(tmp_path / "not-yet", ("kernels",), "test cache")
    shared = tmp_path / "shared"
    (shared / "kernels").mkdir(parents=True)
    os.chmod(shared / "kernels", 0o775)
    with caplog.at_level(logging.WARNING):
        assert not safe_files.private_folder(shared, ("kernels",), "test cache")
        assert not safe_files.private_folder(shared, ("kernels",), "test cache")
    msgs = [r.getMessage() for r in caplog.records if str(shared) in r.getMessage()]
    assert len(msgs) == 1 and "test cache" in msgs[0] and "not private" in msgs[0]
    link = tmp_path / "link"
    link.symlink_to(ok)
    assert not safe_files.private_folder(link, (), "test cache")


def test_a_folder_of_another_owner_is_not_private(tmp_path) -> None:
    d = tmp_path / "theirs"
    d.mkdir(mode=0o755)
    try:
        os.chown(d, os.getuid() + 4242, -1)
    except PermissionError:
        pytest.skip("changing a folder's owner needs root")
    assert not safe_files.private_dir(d)
    assert not safe_files.private_folder(d, (), "test cache")
