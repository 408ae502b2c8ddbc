"""The garbage collector held off through a cold compile's single-threaded start
(:mod:`geode.collector`): hold and release switch only what they own, nested holds
leave the release to the outermost, a cold compile holds it from the ONNX import to its
first kernel and leaves it on however it ends, a model-cache hit never holds it."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import geode
from geode import collector
from geode.codegen import driver
from geode.compiler.frontend import onnx as onnx_frontend
from geode.errors import GeodeError

DATA = Path(__file__).parent / "data"


@pytest.fixture(autouse=True)
def _collector_restored() -> Iterator[None]:
    was = gc.isenabled()
    yield
    collector.release()
    collector.thaw()
    if was:
        gc.enable()
    else:
        gc.disable()


def test_hold_switches_off_a_running_collector_and_release_switches_it_back() -> None:
    gc.enable()
    assert collector.hold() is True
    assert not gc.isenabled() and collector.is_held()
    assert collector.hold() is False  # held already
    collector.release()
    assert gc.isenabled() and not collector.is_held()
    collector.release()  # again: nothing
    assert gc.isenabled()


def test_a_collector_switched_off_by_the_program_stays_off() -> None:
    gc.disable()
    assert collector.hold() is False
    assert not collector.is_held()
    collector.release()
    assert not gc.isenabled()
    with collector.held():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_nested_holds_leave_the_release_to_the_outermost() -> None:
    gc.enable()
    with collector.held():
        with collector.held():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner block took no hold
    assert gc.isenabled()


def test_a_hold_released_early_is_not_released_twice() -> None:
    gc.enable()
    with collector.held():
        collector.release()  # as the schedule stage does after the first kernel
        assert gc.isenabled()
        gc.disable()  # the program's own choice after that
    assert not gc.isenabled()


def test_an_exception_releases_the_hold() -> None:
    gc.enable()
    with pytest.raises(ValueError), collector.held():
        raise ValueError("boom")
    assert gc.isenabled()


def _feeds() -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(0).standard_normal((1, 32, 16)).astype(np.float32)}


def test_a_cold_compile_holds_the_collector_until_its_first_kernel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gc.enable()
    seen: list[tuple[str, bool]] = []
    real_import, real_schedule = onnx_frontend.import_model, driver.schedule_job

    def import_model(*args, **kwargs):
        seen.append(("import", gc.isenabled()))
        return real_import(*args, **kwargs)

    def schedule_job(job, *args, **kwargs):
        seen.append((job.name, gc.isenabled()))
        return real_schedule(job, *args, **kwargs)

    monkeypatch.setattr(onnx_frontend, "import_model", import_model)
    monkeypatch.setattr(driver, "schedule_job", schedule_job)
    model = geode.compile(DATA / "torch_block.onnx", cache_dir=tmp_path, progress=0)
    assert gc.isenabled() and not collector.is_held()
    assert len(seen) >= 3, seen  # the import and at least two kernels
    assert seen[0] == ("import", False)
    assert seen[1][1] is False  # the first kernel is scheduled with the collector held
    assert all(on for _, on in seen[2:]), seen  # released once LLVM has work
    reference = geode.compile(DATA / "torch_block.onnx", codegen=False, progress=0)
    got, want = model(**_feeds()), reference(**_feeds())
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5)


def test_a_compile_that_fails_leaves_the_collector_on(tmp_path: Path) -> None:
    gc.enable()
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not an onnx model")
    with pytest.raises(GeodeError):
        geode.compile(bad, cache_dir=tmp_path / "cache", progress=0)
    assert gc.isenabled() and not collector.is_held()


def test_a_model_cache_hit_never_holds_the_collector(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GEODE_MODEL_CACHE", "1")  # off for the rest of the suite
    gc.enable()
    geode.compile(DATA / "torch_mlp.onnx", cache_dir=tmp_path, progress=0)

    def refuse() -> bool:
        raise AssertionError("a warm start held the collector")

    monkeypatch.setattr(collector, "hold", refuse)
    model = geode.compile(DATA / "torch_mlp.onnx", cache_dir=tmp_path, progress=0)
    assert "model_cache" in model.stats
    assert gc.isenabled()


def test_a_graph_compile_holds_it_too(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from geode import examples

    gc.enable()
    seen: list[bool] = []
    real_schedule = driver.schedule_job

    def schedule_job(job, *args, **kwargs):
        seen.append(gc.isenabled())
        return real_schedule(job, *args, **kwargs)

    monkeypatch.setattr(driver, "schedule_job", schedule_job)
    ex = examples.layernorm(hidden=64)
    geode.compile(ex.graph, cache_dir=tmp_path, progress=0)
    assert seen and seen[0] is False
    assert gc.isenabled() and not collector.is_held()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_while_held_starts_with_the_collector_on() -> None:
    gc.enable()
    assert collector.hold()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, and leave without running the parent's cleanup
        os.close(read)
        os.write(write, b"%d%d" % (gc.isenabled(), collector.is_held()))
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        got = f.read()
    os.waitpid(pid, 0)
    assert got == b"10"  # on, not held
    assert not gc.isenabled() and collector.is_held()  # the parent's hold is untouched
    collector.release()
    assert gc.isenabled()


class _Node:
    """An object that can sit in a reference cycle (and be referred to weakly)."""

    def __init__(self) -> None:
        self.other: object = None


def test_release_freezes_the_stretchs_objects_and_the_end_thaws_them() -> None:
    """The objects made while held are frozen at the release (no young collection scans
    them while the compile goes on) and thawed at the outermost block's end, when a full
    collection collects the stretch's garbage."""
    import weakref

    gc.enable()
    with collector.held():
        a, b = _Node(), _Node()
        a.other, b.other = b, a  # a cycle: only the collector frees it
        ref = weakref.ref(a)
        del a, b
        assert gc.get_freeze_count() == 0
        collector.release()
        assert gc.isenabled() and gc.get_freeze_count() > 0
        gc.collect()
        assert ref() is not None  # frozen: not collected during the compile
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert ref() is None


def test_a_program_that_froze_objects_itself_is_left_alone() -> None:
    gc.enable()
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with collector.held():
            collector.release()
            assert gc.get_freeze_count() == frozen
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()


def test_a_cold_compile_leaves_nothing_frozen(tmp_path: Path) -> None:
    gc.enable()
    model = geode.compile(DATA / "torch_block.onnx", cache_dir=tmp_path, progress=0)
    assert model is not None and gc.get_freeze_count() == 0 and gc.isenabled()


def test_a_bare_hold_and_release_freeze_nothing() -> None:
    """Only a :func:`collector.held` block, which thaws at its end, freezes."""
    gc.enable()
    assert collector.hold() is True
    collector.release()
    assert gc.get_freeze_count() == 0 and gc.isenabled()
