"""Stage partition end to end (issue 37): a graph whose nodes carry stages compiles
into one model per stage, runs them in turn or as a pipeline over micro-batches in
threads, and matches the same graph compiled as one."""

import contextlib
import threading

import numpy as np
import pytest

import geode
from geode import ops
from geode.errors import GeodeError, UnexpectedInputError
from geode.runtime.stages import StagedModel

RNG = np.random.default_rng(0)
W1 = RNG.standard_normal((16, 32)).astype(np.float32)
W2 = RNG.standard_normal((32, 8)).astype(np.float32)


def two_stage(staged=True):
    g = geode.Graph("two_stage")
    x = g.input("x", ["N", 16])
    with g.stage(0) if staged else contextlib.nullcontext():
        h = ops.relu(ops.matmul(x, g.constant(W1)) + 0.5)
    with g.stage(1) if staged else contextlib.nullcontext():
        y = ops.softmax(ops.matmul(h, g.constant(W2)), axis=-1)
    g.output(y, ops.tanh(h), names=["y", "t"])
    return g


@pytest.fixture(scope="module")
def models():
    return geode.compile(two_stage()), geode.compile(two_stage(staged=False))


def batches(sizes, seed=1):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((n, 16)).astype(np.float32)} for n in sizes]


def same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-6, atol=1e-7, err_msg=k)


def test_two_stages_compile_apart(models):
    staged, single = models
    assert isinstance(staged, StagedModel) and not isinstance(single, StagedModel)
    assert [s.index for s in staged.stages] == [0, 1]
    assert staged.stages[0].outputs == staged.stages[1].inputs
    assert staged.output_names == ["y", "t"] and staged.input_names == ["x"]
    assert len(staged.kernels) == sum(len(s.model.kernels) for s in staged.stages)
    text = staged.explain()
    assert text.startswith("model two_stage: 2 stages")
    assert "  stage 1: 4 nodes, compile " in text or "  stage 1: " in text
    assert "    reads: x" in text and "    hands on: y, t" in text


def test_stages_in_turn_match_the_single_stage_model(models):
    staged, single = models
    for f in batches([1, 5, 0, 33]):
        same(staged.run(f), single.run(f))


def test_pipeline_over_micro_batches_matches(models, monkeypatch):
    staged, single = models
    ran: list[tuple[int, str]] = []
    for s in staged.stages:
        real = s.model.run

        def recorded(feeds, real=real, k=s.index):
            ran.append((k, threading.current_thread().name))
            return real(feeds)

        monkeypatch.setattr(s.model, "run", recorded)
    mbs = batches([3, 1, 7, 2, 5, 4])
    outs = staged.pipeline(mbs)
    assert len(outs) == len(mbs)
    for f, o in zip(mbs, outs):
        same(o, single.run(f))
    assert {name for k, name in ran if k == 0} == {"geode-stage-0"}
    assert {name for k, name in ran if k == 1} == {"geode-stage-1"}
    assert staged.pipeline([]) == []


def test_pipeline_raises_a_stage_error(models):
    staged, _ = models
    bad = batches([2, 3]) + [{"x": np.zeros((2, 15), np.float32)}]
    with pytest.raises(GeodeError, match="dim 1 is 15, expected 16"):
        staged.pipeline(bad)
    with pytest.raises(UnexpectedInputError):
        staged.run({"x": np.zeros((1, 16), np.float32), "q": 1})


def test_staged_model_is_not_saved(models, tmp_path):
    staged, _ = models
    with pytest.raises(GeodeError, match="2 stages"):
        staged.save(tmp_path / "m.geode")
