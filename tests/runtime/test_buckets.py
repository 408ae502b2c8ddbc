"""The Case of a bucketed model (``runtime/buckets.py``): which variant a call's sizes
pick, padding and cutting, and the timed decision between a bucket and the symbolic
model. The variants here are stand-ins recording what they were given."""

import time
from types import SimpleNamespace

import numpy as np
import pytest

from geode.runtime.buckets import SYMBOLIC, TRIALS, Bucket, BucketedModel, DynamicDim


class Variant:
    """A stand-in compiled model: returns ``x * 2`` and the shape it saw, after
    sleeping ``delay`` seconds."""

    def __init__(self, delay=0.0):
        self.delay = delay
        self.seen = []
        self.plan = SimpleNamespace(name="m", inputs=[], outputs=[])
        self.var_manager = None
        self.kernels = []

    def run(self, feeds):
        self.seen.append(feeds["x"].shape)
        time.sleep(self.delay)
        return {"y": feeds["x"] * 2, "c": np.ones(3, np.float32)}


def model(pads=True, delays=(0.0, 0.0)):
    sym, bucket_delay = Variant(delays[1]), delays[0]
    dim = DynamicDim("b", (2, 8), (("x", 0),), {"y": 0, "c": None}, "" if pads else "refused")
    buckets = [Bucket({"b": n}, Variant(bucket_delay)) for n in dim.sizes]
    return BucketedModel(sym, [dim], buckets, lambda: "explained"), sym, buckets


def x(n, cols=3):
    return np.arange(n * cols, dtype=np.float32).reshape(n, cols)


def test_choose_exact_padded_and_symbolic():
    m, _, buckets = model()
    assert m.choose({"x": x(2)}).bucket is buckets[0]
    padded = m.choose({"x": x(5)})
    assert padded.bucket is buckets[1] and padded.padded == {"b": 5}
    assert padded.label == "b=8 (padded from b=5)"
    for n in (0, 9):
        assert m.choose({"x": x(n)}) is SYMBOLIC
    assert m.choose({"y": x(2)}) is SYMBOLIC  # no such input: the symbolic model says so
    refused, _, _ = model(pads=False)
    assert refused.choose({"x": x(5)}) is SYMBOLIC


def test_padding_repeats_the_last_row_and_outputs_are_cut():
    m, _, buckets = model()
    a = x(5)
    out = m.run_variant({"x": a}, m.choose({"x": a}))
    assert buckets[1].model.seen == [(8, 3)]
    np.testing.assert_array_equal(out["y"], a * 2)  # cut back to 5 rows
    np.testing.assert_array_equal(out["c"], np.ones(3))  # no batch axis: left whole
    assert m.runs["b=8 (padded from b=5)"] == 1


def test_pad_along_an_inner_axis():
    from geode.runtime import buckets

    a = x(2, 3)
    p = buckets._pad(a, 1, 5)
    np.testing.assert_array_equal(p[:, :3], a)
    np.testing.assert_array_equal(p[:, 3:], np.repeat(a[:, 2:3], 2, axis=1))
    cut = buckets._cut(p, 1, 3)
    assert cut.flags.c_contiguous
    np.testing.assert_array_equal(cut, a)


@pytest.mark.parametrize(("delays", "winner"), [((0.0, 0.004), "b=8"), ((0.004, 0.0), "symbolic")])
def test_the_faster_variant_serves_a_size(delays, winner):
    m, sym, buckets = model(delays=delays)
    f = {"x": x(8)}
    for _ in range(2 * (TRIALS + 1)):
        m.run(f)
    assert len(buckets[1].model.seen) == len(sym.seen) == TRIALS + 1  # turns, warm-up each
    decision = m.decisions[(8,)]
    assert decision.winner.label == winner
    served = buckets[1].model if winner != "symbolic" else sym
    before = len(served.seen)
    m.run(f)
    assert len(served.seen) == before + 1
