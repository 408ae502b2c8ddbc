"""Interleaved timing of several callables (the profiling model's harness)."""

from __future__ import annotations

import pytest

from geode.costmodel import profiling


def test_interleaved_rounds_shuffle_the_order_and_count_the_calls():
    order: list[str] = []
    fns = {name: (lambda name=name: order.append(name)) for name in "abcd"}
    t = profiling.measure_interleaved(fns, rounds=5, warmup=2, min_time=0, seed=3)
    assert set(t) == set("abcd")
    for name, timing in t.items():
        assert timing.number == 1 and len(timing.samples) == 5
        assert timing.min <= timing.median <= max(timing.samples)
        assert order.count(name) == 2 + 1 + 5  # warm-up, autorange, rounds
    rounds = ["".join(order[12 + 4 * r : 16 + 4 * r]) for r in range(5)]
    assert all(sorted(r) == list("abcd") for r in rounds)
    assert len(set(rounds)) > 1  # shuffled per round
    again: list[str] = []
    fns2 = {name: (lambda name=name: again.append(name)) for name in "abcd"}
    profiling.measure_interleaved(fns2, rounds=5, warmup=2, min_time=0, seed=3)
    assert again == order  # the same seed, the same order


def test_interleaved_batches_fast_calls_and_stops_at_the_deadline():
    calls = {"n": 0}

    def fast():
        calls["n"] += 1

    t = profiling.measure_interleaved({"fast": fast}, rounds=3, min_time=1e-3)
    assert t["fast"].number > 1
    assert t["fast"].samples[0] * t["fast"].number >= 1e-3 * 0.5
    slow = profiling.measure_interleaved(
        {"s": lambda: sum(range(20000))}, rounds=1000, min_time=0, max_time=0.05
    )
    assert 3 <= len(slow["s"].samples) < 1000


def test_interleaved_validates_and_handles_nothing():
    assert profiling.measure_interleaved({}) == {}
    with pytest.raises(ValueError, match="rounds"):
        profiling.measure_interleaved({"a": lambda: None}, rounds=0)
    with pytest.raises(ValueError, match="max_time"):
        profiling.measure_interleaved({"a": lambda: None}, max_time=0)


def test_profile_reports_the_median():
    s = profiling.profile("noop", lambda: None, repeat=5, min_time=0)
    assert s.measured_s == s.timing.median
