"""``runtime/stages.py`` with stand-in stage models: values flow from stage to stage,
the pipeline keeps micro-batches in order and overlaps the stages."""

import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from geode.runtime.stages import StagedModel, StageModel


class Stage:
    def __init__(self, fn, delay=0.0):
        self.fn, self.delay = fn, delay
        self.plan = SimpleNamespace(name="s", inputs=[], outputs=[])
        self.var_manager, self.kernels = None, []
        self.active = 0
        self.overlap = 0

    def run(self, feeds):
        time.sleep(self.delay)
        return self.fn(feeds)


def model(delay=0.0):
    a = Stage(lambda f: {"h": f["x"] + 1}, delay)
    b = Stage(lambda f: {"y": f["h"] * f["x"]}, delay)
    stages = [StageModel(0, a, ["x"], ["h"]), StageModel(1, b, ["h", "x"], ["y"])]
    return StagedModel("m", stages, ["x"], ["y"], lambda: "")


def test_values_flow_through_the_stages():
    out = model().run({"x": np.array([1.0, 2.0])})
    np.testing.assert_array_equal(out["y"], [2.0, 6.0])


def test_pipeline_keeps_order_and_overlaps_stages():
    m = model(delay=0.02)
    busy: set[str] = set()
    both = threading.Event()
    for s in m.stages:
        real = s.model.run

        def run(feeds, real=real, name=f"s{s.index}"):
            busy.add(name)
            if len(busy) == 2:
                both.set()
            try:
                return real(feeds)
            finally:
                busy.discard(name)

        s.model.run = run
    outs = m.pipeline([{"x": np.array([float(i)])} for i in range(8)])
    assert [float(o["y"][0]) for o in outs] == [(i + 1.0) * i for i in range(8)]
    assert both.is_set()  # some micro-batch was in stage 0 while another was in stage 1


def test_a_failing_stage_stops_the_pipeline():
    def boom(f):
        raise ValueError("stage 1 failed")

    m = model()
    m.stages[1].model.fn = boom
    with pytest.raises(ValueError, match="stage 1 failed"):
        m.pipeline([{"x": np.zeros(1)}] * 3)
