"""geode.tune: every kernel of a model tuned into the database, resumable, keyed by
kernel and device; the database used by geode.compile; bad requests refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

import geode
from geode import examples, ops
from geode import tuner as tuner_mod
from geode.codegen.tuning import search
from geode.codegen.tuning_db import TuningDB, TuningDBWarning
from geode.errors import TuningError

QUICK = {"repeat": 1, "min_time": 0.0, "max_time": 0.05}


def _two_kernels() -> geode.Graph:
    """A row softmax, a MatMul (BLAS, no fusion across it), then an RMSNorm-like row
    scale: two fused kernels with different keys; the same softmax again: a duplicate."""
    g = geode.Graph("two")
    x = g.input("x", ["N", 64])
    w = g.constant(np.eye(64, dtype=np.float32), "w")
    a = ops.softmax(x, axis=-1)
    b = ops.matmul(a, w)
    c = b / ops.sqrt(ops.reduce_mean(b * b, axes=[-1]) + 1e-6)
    d = ops.softmax(ops.matmul(c, w), axis=-1)
    g.output(d, names=["y"])
    return g


def _tune(g, db, **kw):
    kw = {"trials": 1, "shapes": {"x": (16, 64)}, "bench_options": QUICK, **kw}
    kw.setdefault("dense_epilogues", False)  # the middle kernel a kernel of its own
    return geode.tune(g, db=db, **kw)


def test_tune_records_every_kernel_and_resumes(tmp_path, monkeypatch) -> None:
    db = tmp_path / "db.json"
    report = _tune(_two_kernels(), db)
    statuses = [k.status for k in report.kernels]
    assert statuses.count("duplicate") == 1 and len(statuses) == 3
    assert all(s in ("tuned", "default", "duplicate") for s in statuses), report.table()
    entries = json.loads(db.read_text(encoding="utf-8"))["entries"]
    assert (
        len(entries) == 2 and report.device in json.loads(db.read_text(encoding="utf-8"))["devices"]
    )
    assert "fused_0" in str(report) and "speedup" in str(report)

    def refuse(*a, **k):
        raise AssertionError("a kernel in the database was measured again")

    monkeypatch.setattr(tuner_mod, "tune_kernel", refuse)
    again = _tune(_two_kernels(), db)
    assert [k.status for k in again.kernels] == ["in db", "in db", "duplicate"]
    monkeypatch.undo()
    redo = _tune(_two_kernels(), db, retune=True)
    assert [k.status for k in redo.kernels].count("in db") == 0


def test_an_interrupted_run_keeps_the_kernels_done(tmp_path, monkeypatch) -> None:
    db = tmp_path / "db.json"
    real = search.tune_kernel
    calls = []

    def second_interrupts(task, *a, **k):
        calls.append(task.name)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(task, *a, **k)

    monkeypatch.setattr(tuner_mod, "tune_kernel", second_interrupts)
    with pytest.raises(KeyboardInterrupt):
        _tune(_two_kernels(), db)
    assert len(json.loads(db.read_text(encoding="utf-8"))["entries"]) == 1
    monkeypatch.setattr(tuner_mod, "tune_kernel", real)
    report = _tune(_two_kernels(), db)
    assert [k.status for k in report.kernels][0] == "in db"
    assert len(json.loads(db.read_text(encoding="utf-8"))["entries"]) == 2


def test_another_thread_count_is_another_device(tmp_path) -> None:
    db = tmp_path / "db.json"
    g = examples.softmax(hidden=64).graph
    one = geode.tune(g, 1, db, shapes={"x": (8, 64)}, bench_options=QUICK, num_threads=1)
    two = geode.tune(g, 1, db, shapes={"x": (8, 64)}, bench_options=QUICK, num_threads=2)
    assert one.device != two.device and two.kernels[0].status != "in db"
    assert len(json.loads(db.read_text(encoding="utf-8"))["entries"]) == 2
    m1 = geode.compile(g, tuning_db=db, num_threads=1)
    assert "schedules: 1 default" not in m1.explain()
    m3 = geode.compile(g, tuning_db=db, num_threads=3)
    assert "schedules: 1 default" in m3.explain()


def test_a_corrupt_entry_is_tuned_again(tmp_path) -> None:
    db = tmp_path / "db.json"
    g = examples.softmax(hidden=64).graph
    _tune(g, db, shapes={"x": (8, 64)})
    data = json.loads(db.read_text(encoding="utf-8"))
    (eid,) = data["entries"]
    data["entries"][eid]["trace"] = {"format": "garbage"}
    db.write_text(json.dumps(data), encoding="utf-8")
    with pytest.warns(TuningDBWarning, match="not a geode schedule trace"):
        report = _tune(g, db, shapes={"x": (8, 64)})
    assert report.kernels[0].status in ("tuned", "default")
    assert TuningDB.open(db).entries[eid].trace is not None  # rewritten, readable


def test_the_tuned_model_gives_the_same_results(tmp_path) -> None:
    ex = examples.layernorm(hidden=128)
    db = tmp_path / "db.json"
    _tune(ex.graph, db, trials=3, shapes={"x": (32, 128)}, predictor="sol")
    model = geode.compile(ex.graph, tuning_db=db)
    assert "key " in model.explain() and "tuned" in model.explain()
    feeds = ex.make_inputs(np.random.default_rng(0), 32)
    for k, want in ex.numpy(**feeds).items():
        np.testing.assert_allclose(model(**feeds)[k], want, rtol=1e-4, atol=1e-5)


def test_only_the_knobs_asked_for_are_searched(tmp_path) -> None:
    g = examples.softmax(hidden=64).graph
    db = tmp_path / "db.json"
    report = _tune(g, db, trials=10, shapes={"x": (8, 64)}, knobs=["interleave"])
    assert report.kernels[0].trials <= 2  # interleave 2 and 4
    knobs = next(iter(json.loads(db.read_text(encoding="utf-8"))["entries"].values()))["knobs"]
    assert set(knobs) <= {"interleave"}


def test_gemm_epilogues_are_skipped(tmp_path) -> None:
    report = _tune(_two_kernels(), tmp_path / "db.json", dense_epilogues=True)
    assert "skipped" in [k.status for k in report.kernels]
    assert "GEMM epilogue" in report.table()


def test_real_inputs_size_the_run(tmp_path) -> None:
    g = examples.softmax(hidden=64).graph
    x = np.random.default_rng(0).standard_normal((5, 64)).astype(np.float32)
    report = geode.tune(g, 0, tmp_path / "db.json", inputs={"x": x}, bench_options=QUICK)
    assert report.kernels[0].status == "default" and report.kernels[0].trials == 0


@pytest.mark.parametrize(
    "kw,message",
    [
        ({"db": None}, "no tuning database"),
        ({"shapes": None}, "input 'x' has the shape float32\\[N, 64\\]"),
        ({"shapes": {"y": (1, 64)}}, r"inputs \['y'\] are not inputs"),
        ({"trials": -1}, "trials=-1"),
        ({"predictor": "psychic"}, "predictor='psychic'"),
        ({"backend": "numba"}, "needs the llvm backend"),
        ({"knobs": ["interleave", "warp"]}, r"unknown knobs \['warp'\]"),
    ],
)
def test_bad_requests_are_tuning_errors(tmp_path, kw, message) -> None:
    args = {"db": tmp_path / "db.json", "shapes": {"x": (4, 64)}, "trials": 1, **kw}
    with pytest.raises(TuningError, match=message):
        geode.tune(examples.softmax(hidden=64).graph, **args)


def test_random_inputs_of_every_kind() -> None:
    rng = np.random.default_rng(0)
    ints = tuner_mod.random_array(rng, np.dtype(np.int64), (100,))
    assert ints.min() >= 0 and ints.max() < tuner_mod.RANDOM_INT_HIGH
    assert tuner_mod.random_array(rng, np.dtype(np.bool_), (3,)).dtype == np.bool_
    with pytest.raises(TuningError, match="cannot make random data of complex64"):
        tuner_mod.random_array(rng, np.dtype(np.complex64), (3,))
