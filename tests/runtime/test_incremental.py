"""``runtime/incremental.py`` with stand-in models: the tail is compiled once per shape
of its inputs, reused, and the least recently used beyond TAIL_CACHE is dropped."""

from types import SimpleNamespace

import numpy as np
import pytest

from geode.errors import UnexpectedInputError
from geode.runtime import incremental
from geode.runtime.incremental import IncrementalModel


class Head:
    plan = SimpleNamespace(name="h", inputs=[], outputs=[])
    var_manager, kernels, input_names = None, [], ["x"]

    def run(self, feeds):
        x = feeds["x"]
        return {"k": np.flatnonzero(x)}


class Tail:
    def __init__(self, shapes):
        self.shapes, self.kernels = shapes, []

    def run(self, feeds):
        assert feeds["k"].shape == self.shapes["k"]
        return {"y": feeds["k"] * 2}


def model():
    compiled = []

    def compile_tail(shapes):
        compiled.append(shapes)
        return Tail(shapes)

    return IncrementalModel("m", Head(), ["x"], ["y"], ["k"], compile_tail, lambda: ""), compiled


def test_one_compile_per_shape_and_reuse():
    m, compiled = model()
    for x in ([0, 1, 1], [1, 1, 0], [1, 1, 1], [0, 0, 1]):
        out = m.run({"x": np.array(x)})
        np.testing.assert_array_equal(out["y"], np.flatnonzero(x) * 2)
    assert compiled == [{"k": (2,)}, {"k": (3,)}, {"k": (1,)}]
    assert m.tail_compiles == 3 and len(m.tails) == 3
    with pytest.raises(UnexpectedInputError):
        m.run({"x": np.ones(2), "z": 1})


def test_least_recently_used_tail_is_dropped(monkeypatch):
    monkeypatch.setattr(incremental, "TAIL_CACHE", 2)
    m, compiled = model()
    for n in (1, 2, 1, 3, 2):
        m.run({"x": np.ones(n)})
    # 1, 2 compiled; 1 reused (2 is now the oldest); 3 evicts 2; 2 compiles again
    assert [c["k"] for c in compiled] == [(1,), (2,), (3,), (2,)]
    assert sorted(k[0] for k in m.tails) == [(2,), (3,)]
    assert set(m.tail_seconds) == set(m.tails)
