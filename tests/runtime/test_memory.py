import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import geode
from geode.errors import GeodeError
from geode.runtime.memory import (
    Arena,
    BufferRequest,
    Layout,
    MemoryPlan,
    MemoryPlanError,
    UnboundSymbolError,
    describe,
)


def req(slot, nbytes, first, last):
    return BufferRequest(slot, (lambda e, n=nbytes: n), first, last)


def overlaps(layout, a, b):
    a0, b0 = layout.offsets[a], layout.offsets[b]
    return a0 < b0 + layout.sizes[b] and b0 < a0 + layout.sizes[a]


def test_disjoint_lifetimes_share():
    plan = MemoryPlan([req(0, 1024, 0, 1), req(1, 1024, 2, 3)])
    lay = plan.layout({})
    assert lay.offsets[0] == lay.offsets[1] == 0
    assert lay.total == 1024
    assert lay.peak_naive == 2048
    assert lay.saved_bytes == 1024


def test_overlapping_lifetimes_do_not_share():
    # inclusive ranges: slot 0 is still read at step 2, where slot 1 is written
    plan = MemoryPlan([req(0, 1000, 0, 2), req(1, 1000, 2, 4)])
    lay = plan.layout({})
    assert not overlaps(lay, 0, 1)
    assert lay.total == 2 * 1024  # each rounded up to the 64-byte alignment
    assert all(off % 64 == 0 for off in lay.offsets.values())
    plan.check(lay)


def test_chain_reuses_two_buffers():
    # a linear chain where each step reads the previous output: ping-pong
    plan = MemoryPlan([req(i, 4096, i, i + 1) for i in range(10)])
    lay = plan.layout({})
    assert lay.total == 2 * 4096
    plan.check(lay)


def test_best_fit_picks_smallest_gap():
    # placed largest first: A [0,300), B [300,401), C [401,501), D [501,600).
    # At step 1 only B and D are live, leaving gaps of 300 at 0 and of 100 at 401;
    # Z (80 bytes, live at step 1) goes into the smaller gap.
    reqs = [
        req(0, 300, 0, 0),  # A
        req(1, 101, 0, 1),  # B
        req(2, 100, 0, 0),  # C
        req(3, 99, 0, 1),  # D
        req(4, 80, 1, 1),  # Z
    ]
    plan = MemoryPlan(reqs, alignment=1)
    lay = plan.layout({})
    plan.check(lay)
    assert lay.offsets == {0: 0, 1: 300, 2: 401, 3: 501, 4: 401}
    assert lay.total == 600


def test_symbolic_sizes_and_cache():
    calls = []

    def size(e):
        calls.append(dict(e))
        return e["N"] * 4 * 128

    plan = MemoryPlan([BufferRequest(0, size, 0, 1), BufferRequest(1, lambda e: e["N"] * 4, 1, 2)])
    l1 = plan.layout({"N": 2})
    assert l1.sizes == {0: 2 * 512, 1: 8}
    assert plan.layout({"N": 2}) is l1  # cache hit
    assert len(calls) == 1
    l2 = plan.layout({"N": 8})
    assert l2.sizes[0] == 8 * 512 and l2 is not l1
    info = plan.cache_info()
    assert info["hits"] == 1 and info["misses"] == 2
    # key order in the binding does not matter
    assert plan.layout({"N": 8}) is l2


def test_cache_is_bounded_lru():
    plan = MemoryPlan([BufferRequest(0, lambda e: e["N"], 0, 0)], cache_size=4)
    first = plan.layout({"N": 0})
    for n in range(1, 10):
        plan.layout({"N": n})
    assert plan.cache_info()["size"] == 4
    assert plan.layout({"N": 0}) is not first  # evicted, recomputed


def test_missing_symbol_and_bad_sizes():
    plan = MemoryPlan([BufferRequest(3, lambda e: e["M"] * 2, 0, 0)])
    with pytest.raises(MemoryPlanError, match=r"slot 3.*'M'") as info:
        plan.layout({"N": 1})
    # also a KeyError, for callers that fall back when a size is not yet known
    assert isinstance(info.value, KeyError) and isinstance(info.value, UnboundSymbolError)
    assert info.value.symbol == "M" and str(info.value).startswith("buffer slot 3")
    with pytest.raises(KeyError):
        MemoryPlan([BufferRequest(0, lambda e: undefined_name, 0, 0)]).layout({})  # noqa: F821
    with pytest.raises(MemoryPlanError, match="slot 5"):
        MemoryPlan([BufferRequest(5, lambda e: -1, 0, 0)]).layout({})
    with pytest.raises(MemoryPlanError, match="slot 5"):
        MemoryPlan([BufferRequest(5, lambda e: 2.5, 0, 0)]).layout({})
    with pytest.raises(MemoryPlanError, match="twice"):
        MemoryPlan([req(1, 4, 0, 0), req(1, 4, 1, 1)])
    with pytest.raises(MemoryPlanError, match="slot 2"):
        MemoryPlan([req(2, 4, 3, 1)])
    assert issubclass(MemoryPlanError, GeodeError)


def test_int_sizes_and_zero_size():
    plan = MemoryPlan([BufferRequest(0, 128, 0, 3), BufferRequest(1, 0, 0, 3)])
    lay = plan.layout({})
    assert lay.sizes == {0: 128, 1: 0}
    assert lay.total == 128
    plan.check(lay)


def test_empty_plan():
    lay = MemoryPlan([]).layout({})
    assert lay.total == 0 and lay.offsets == {}
    assert "0 buffers" in describe(lay)


def test_describe():
    plan = MemoryPlan([req(0, 64, 0, 1), req(1, 64, 2, 3), req(7, 128, 0, 3)])
    text = plan.describe({})
    assert "saved" in text and "[2, 3]" in text
    assert len(text.splitlines()) == 2 + 1 + 3


@st.composite
def requests(draw):
    n = draw(st.integers(min_value=0, max_value=24))
    out = []
    for slot in range(n):
        first = draw(st.integers(0, 30))
        last = draw(st.integers(first, first + draw(st.integers(0, 12))))
        size = draw(st.integers(0, 5000))
        out.append((slot, size, first, last))
    return out


@settings(max_examples=200, deadline=None)
@given(requests(), st.sampled_from([1, 8, 64]))
def test_random_lifetimes_never_overlap(reqs, alignment):
    plan = MemoryPlan([req(*r) for r in reqs], alignment=alignment)
    lay = plan.layout({})
    by_slot = {r[0]: r for r in reqs}
    for i, (a, _, af, al) in enumerate(reqs):
        assert lay.offsets[a] % alignment == 0
        assert lay.offsets[a] + lay.sizes[a] <= lay.total
        for b, _, bf, bl in reqs[i + 1 :]:
            if af <= bl and bf <= al and lay.sizes[a] and lay.sizes[b]:
                assert not overlaps(lay, a, b), (by_slot[a], by_slot[b], lay)
    assert lay.total <= lay.peak_naive
    if alignment == 1:
        assert lay.total <= sum(r[1] for r in reqs)
    # never below the largest set of simultaneously live bytes
    steps = {s for _, _, f, l in reqs for s in range(f, l + 1)}
    live_peak = max((sum(sz for _, sz, f, l in reqs if f <= s <= l) for s in steps), default=0)
    assert lay.total >= live_peak
    plan.check(lay)


def test_arena_views_and_growth():
    plan = MemoryPlan(
        [
            BufferRequest(0, lambda e: e["N"] * 4, 0, 1),
            BufferRequest(1, lambda e: e["N"] * 8, 1, 2),
            BufferRequest(2, lambda e: e["N"] * 4, 2, 3),
        ]
    )
    arena = Arena()
    assert arena.capacity == 0
    lay = plan.layout({"N": 100})
    assert arena.ensure(lay.total)
    gen = arena.generation
    assert not arena.ensure(lay.total)  # big enough already
    assert not arena.ensure(10)
    assert arena.generation == gen
    a = arena.view(lay.offsets[0], (100,), np.float32)
    b = arena.view(lay.offsets[1], (10, 10), np.float64)
    c = arena.view(lay.offsets[2], (100,), "int32")
    for v in (a, b, c):
        assert v.flags.c_contiguous and v.flags.writeable
        assert v.ctypes.data % 64 == 0
    a[:] = 1.0
    b[:] = 2.0  # live together with a: must not clobber it
    np.testing.assert_array_equal(a, 1.0)
    c[:] = 3  # may share with a (a is dead by step 2)
    np.testing.assert_array_equal(b, 2.0)
    bigger = plan.layout({"N": 10_000})
    assert arena.ensure(bigger.total)
    assert arena.generation == gen + 1 and arena.capacity >= bigger.total


def test_arena_view_errors():
    arena = Arena()
    arena.ensure(256)
    with pytest.raises(MemoryPlanError, match="does not fit"):
        arena.view(0, (100,), np.float32)
    with pytest.raises(MemoryPlanError, match="misaligned"):
        arena.view(2, (4,), np.float32)
    assert arena.view(256, (0,), np.float32).shape == (0,)
    assert arena.view(0, (2, 0, 3), np.float64).size == 0
    arena.release()
    assert arena.capacity == 0


def test_layout_dataclass_fields():
    lay = Layout(offsets={0: 0}, sizes={0: 8}, total=64, peak_naive=64)
    assert lay.saved_bytes == 0
    assert "arena 64 B" in describe(lay)


def test_check_detects_overlap():
    plan = MemoryPlan([req(0, 64, 0, 2), req(1, 64, 1, 3)])
    bad = Layout(offsets={0: 0, 1: 0}, sizes={0: 64, 1: 64}, total=64, peak_naive=128)
    with pytest.raises(MemoryPlanError, match="slots 0 and 1"):
        plan.check(bad)


def test_executor_reuses_prepared_buffers_per_binding():
    """The executor prepares each step's arena views once per input binding and reuses
    them: results stay right when shapes alternate, model outputs are new arrays on every
    call, the prepared bindings are bounded, and a grown arena drops the views of its old
    buffer."""
    from geode import examples
    from geode.runtime import executor as executor_mod

    ex = examples.layernorm(hidden=32)
    model = geode.compile(ex.graph, fusion=False)  # many steps, activations in the arena
    rng = np.random.default_rng(0)
    runner = model._executor()
    sizes = [3, 5, 3, 1, 5] + list(range(6, 6 + executor_mod._PREPARED_BINDINGS + 2))
    previous = None
    for n in sizes:
        x = rng.standard_normal((n, 32), dtype=np.float32)
        got = model(x=x)["y"]
        np.testing.assert_allclose(got, ex.numpy(x=x)["y"], rtol=1e-5, atol=1e-5)
        if previous is not None:
            kept, before = previous
            assert got is not kept and not np.shares_memory(got, kept)
            np.testing.assert_array_equal(kept, before)  # an earlier result is untouched
        previous = (got, got.copy())
        assert runner.prepared_bindings() <= 2 * executor_mod._PREPARED_BINDINGS
    generation = runner.arena.generation
    model(x=rng.standard_normal((4096, 32), dtype=np.float32))  # the arena must grow
    assert runner.arena.generation > generation
    assert runner.prepared_bindings() == 1  # only views of the new buffer are kept


def test_executor_prepares_outputs_of_a_plan_without_arena_buffers():
    """A plan whose only values are the model's inputs and outputs (one fused step: no
    arena buffer) prepares its output buffers once per binding too, and still hands out
    a new array on every call."""
    g = geode.Graph("one_step")
    x = g.input("x", ["N", 8], np.float32)
    g.output(g.op("Tanh", g.op("Mul", x, x)), names=["y"])
    model = geode.compile(g, session=geode.Session(), model_cache=False)
    runner = model._executor()
    assert not runner.plan.arena_slots
    rng = np.random.default_rng(1)
    previous = None
    for n in (3, 5, 3, 0, 5):
        a = rng.standard_normal((n, 8), dtype=np.float32)
        got = model(x=a)["y"]
        np.testing.assert_allclose(got, np.tanh(a * a), rtol=1e-6, atol=1e-6)
        if previous is not None:
            assert not np.shares_memory(got, previous[0])
            np.testing.assert_array_equal(previous[0], previous[1])
        previous = (got, got.copy())
    assert runner.prepared_bindings() >= 1
