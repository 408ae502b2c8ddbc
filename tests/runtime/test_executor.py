"""Runtime integration: the session's VarManager, the activation memory plan, engines."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import geode
from geode import ops
from geode.runtime.allocator import ALIGNMENT, PAGE, OutputPool, page_offset, spread_offset
from geode.runtime.var_manager import VarManagerError


def chain_graph(n_ops=6, hidden=64):
    g = geode.Graph("chain")
    x = g.input("x", ["N", hidden])
    y = x
    for i in range(n_ops):
        y = ops.exp(ops.tanh(y)) if i % 2 else ops.sigmoid(y) * 1.5
    g.output(y, names=["y"])
    return g


def test_activation_buffers_are_reused_by_liveness():
    model = geode.compile(chain_graph(), fusion=False)  # every op its own step
    plan = model.plan
    assert len(plan.steps) >= 6
    assert len(plan.arena_slots) >= 4
    layout = plan.memory.layout({"N": 128})
    # a chain needs two live buffers at a time, whatever its length
    assert layout.total < layout.peak_naive
    assert layout.total <= 2 * 128 * 64 * 4 + 2 * 64
    x = np.random.default_rng(0).standard_normal((128, 64)).astype(np.float32)
    fused = geode.compile(chain_graph())
    np.testing.assert_allclose(model(x=x)["y"], fused(x=x)["y"], rtol=1e-5, atol=1e-6)


def test_constants_deduplicated_across_models_of_a_session():
    w = np.arange(1024, dtype=np.float32)
    graphs = []
    for name in ("a", "b"):
        g = geode.Graph(name)
        x = g.input("x", [1024])
        g.output(x * g.constant(w.copy(), name="w"), names=["y"])
        graphs.append(g)
    with geode.Session() as sess:
        m1, m2 = sess.compile(graphs[0]), sess.compile(graphs[1])
        vm = sess.var_manager
        keys = [k for k in vm if k.name.endswith("/w")]
        assert len(keys) == 2
        assert vm.logic_address(keys[0]) == vm.logic_address(keys[1])
        assert vm.dedup_saved_bytes >= w.nbytes
        x = np.ones(1024, np.float32)
        np.testing.assert_array_equal(m1(x=x)["y"], m2(x=x)["y"])


def test_variables_live_in_the_session_and_are_shared():
    def graph(name):
        g = geode.Graph(name)
        x = g.input("x", [4])
        v = g.variable(np.full(4, 2.0, np.float32), "scale")
        g.output(x * v, names=["y"])
        return g

    with geode.Session() as sess:
        m1, m2 = sess.compile(graph("a")), sess.compile(graph("b"))
        x = np.ones(4, np.float32)
        np.testing.assert_array_equal(m1(x=x)["y"], 2.0)
        key = sess.var_manager.lookup("scale")
        sess.var_manager.assign(key, np.full(4, 3.0, np.float32))
        np.testing.assert_array_equal(m1(x=x)["y"], 3.0)
        np.testing.assert_array_equal(m2(x=x)["y"], 3.0)


@pytest.mark.parametrize(
    "second",
    [np.full(4, 5.0, np.float32), np.full((2, 4), 2.0, np.float32)],
    ids=["value", "shape"],
)
def test_same_variable_name_with_another_initial_value_is_refused(second):
    """A second graph of the session declaring variable 'scale' with another initial value
    or shape is refused at compile time, naming the variable and the way out (it silently
    used the first graph's value, or failed at run time in a kernel); the first graph
    keeps working."""

    def graph(name, init):
        g = geode.Graph(name)
        x = g.input("x", [4])
        g.output(x * g.variable(init, "scale"), names=["y"])
        return g

    with geode.Session() as sess:
        m1 = sess.compile(graph("a", np.full(4, 2.0, np.float32)))
        with pytest.raises(VarManagerError, match="'scale'.*own geode.Session"):
            sess.compile(graph("b", second))
        np.testing.assert_array_equal(m1(x=np.ones(4, np.float32))["y"], 2.0)
    with geode.Session() as other:
        out = other.compile(graph("b", np.full(4, 5.0, np.float32)))(x=np.ones(4, np.float32))
        np.testing.assert_array_equal(out["y"], 5.0)


def test_engines_in_plan():
    g = geode.Graph("engines")
    x = g.input("x", ["N", 8])
    w = g.constant(np.eye(8, dtype=np.float32))
    s = ops.shape(x)
    y = ops.reshape(ops.matmul(x, w) * 2.0, s)
    g.output(y, ops.cast(s, to=1), ops.trilu(x), names=["y", "s", "t"])
    model = geode.compile(g)
    engines = {st.engine for st in model.plan.steps}
    assert engines == {"host", "aicpu", "aicore"}, model.explain()
    # the MatMul calls BLAS natively with the Mul fused as its epilogue (one aicore step),
    # Trilu runs its reference kernel (aicpu)
    by_label = {st.label: st.engine for st in model.plan.steps}
    assert by_label["MatMul+Mul"] == "aicore" and by_label["Trilu"] == "aicpu", by_label
    out = model(x=np.ones((3, 8), np.float32))
    np.testing.assert_array_equal(out["y"], 2.0)
    np.testing.assert_array_equal(out["s"], [3, 8])
    np.testing.assert_array_equal(out["t"], np.triu(np.ones((3, 8), np.float32)))


def _circular(a: int, b: int) -> int:
    d = (a - b) % PAGE
    return min(d, PAGE - d)


def test_spread_offset_fixed_cases():
    assert spread_offset([]) == 0
    assert spread_offset([16]) == 2048  # numpy's large arrays start 16 bytes into a page
    assert spread_offset([16, 2048]) == 3072
    assert spread_offset([16, 16, 16]) == 2048
    assert spread_offset([0, 1024, 2048, 3072]) == 512  # equal gaps: the first
    assert spread_offset([4096 + 16]) == 2048  # offsets are read within the page


@given(st.lists(st.integers(0, 1 << 40), min_size=1, max_size=12))
def test_spread_offset_lands_mid_way_in_the_widest_gap(taken):
    off = spread_offset(taken)
    assert 0 <= off < PAGE and off % ALIGNMENT == 0
    marks = sorted(t % PAGE for t in taken)
    widest = max(b - a for a, b in zip(marks, [*marks[1:], marks[0] + PAGE]))
    nearest = min(_circular(off, t) for t in taken)
    assert nearest >= widest // 2 - ALIGNMENT, (off, marks)


def _at_page_offset(off: int, n: int) -> np.ndarray:
    raw = np.empty(n * 4 + 2 * PAGE, np.uint8)
    s = (off - raw.ctypes.data) % PAGE
    return raw[s : s + n * 4].view(np.float32)


def test_output_pool_places_arrays_away_from_their_neighbours():
    pool = OutputPool()
    x = _at_page_offset(16, 1 << 18)
    a = pool.empty((1 << 18,), np.float32, near=[x])
    assert page_offset(a) == 2048 and a.ctypes.data % ALIGNMENT == 0
    b = pool.empty((1 << 18,), np.float32, near=[x, a])
    assert page_offset(b) == 3072
    a[:] = 1.0
    b[:] = 2.0
    assert not np.shares_memory(a, b)
    np.testing.assert_array_equal(a, 1.0)
    del a
    # the freed block comes back placed for its new neighbours
    c = pool.empty((1 << 18,), np.float32, near=[_at_page_offset(2048, 16)])
    assert pool.hits == 1 and page_offset(c) == 0
    np.testing.assert_array_equal(b, 2.0)
    assert pool.empty((16,), np.float32, near=[x]).shape == (16,)  # small: plain numpy


def test_output_pool_lends_a_block_again_only_when_nothing_refers_to_it():
    pool = OutputPool()
    n = 1 << 18
    a = pool.empty((n,), np.float32)
    addr = a.ctypes.data
    keepers = [
        lambda x: x[5:9],  # a view
        lambda x: x.reshape(64, -1).T[3],  # a view of a view
        memoryview,  # a buffer export
        lambda x: np.frombuffer(x, np.uint8),  # an array over a buffer export
    ]
    for keep in keepers:
        held = keep(a)
        del a
        b = pool.empty((n,), np.float32)
        assert b.ctypes.data != addr, keep  # still visible through `held`: not lent again
        del held, b
        a = pool.empty((n,), np.float32)  # now free: lent again
        assert a.ctypes.data == addr
    copy = a.copy()  # a copy refers to nothing of the block
    del a
    assert pool.empty((n,), np.float32).ctypes.data == addr
    assert copy.shape == (n,)


def test_output_pool_keeps_at_most_max_bytes_of_blocks():
    n = 1 << 18
    block = n * 4 + PAGE
    pool = OutputPool(max_bytes=2 * block)
    arrays = [pool.empty((n,), np.float32) for _ in range(3)]  # the third is not kept
    assert pool.misses == 3 and pool.kept_bytes == 0
    del arrays
    assert pool.kept_bytes == 2 * block
    pool.clear()
    assert pool.kept_bytes == 0
    assert pool.empty((n,), np.float32).shape == (n,) and pool.misses == 4


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["lend", "view", "export", "drop"]), st.integers(0, 7)),
        max_size=40,
    )
)
def test_output_pool_never_lends_memory_that_is_still_visible(steps):
    pool = OutputPool()
    live: list = []
    for op, k in steps:
        if op == "lend":
            shape = [(1 << 18,), (512, 512), (1 << 17, 2)][k % 3]
            new = pool.empty(shape, np.float32)
            for obj in live:
                assert not np.may_share_memory(new, np.asarray(obj)), (op, k)
            new[...] = len(live)
            live.append(new)
        elif live and op == "view":
            base = np.asarray(live[k % len(live)])
            live.append(base.reshape(-1)[k : k + 100])
        elif live and op == "export":
            live.append(memoryview(np.asarray(live[k % len(live)])))
        elif live and op == "drop":
            live.pop(k % len(live))


def test_model_outputs_sit_away_from_the_inputs_page_offsets():
    g = geode.Graph("two_outputs")
    x = g.input("x", ["N", 1024])
    y = g.input("y", ["N", 1024])
    g.output(ops.sigmoid(x) * y, x + y, names=["p", "s"])
    model = geode.compile(g)
    assert len([k for k in model.kernels if k.engine == "aicore"]) == 1
    n = 512
    rng = np.random.default_rng(0)
    xs = _at_page_offset(16, n * 1024).reshape(n, 1024)
    ys = _at_page_offset(80, n * 1024).reshape(n, 1024)
    xs[:] = rng.standard_normal((n, 1024))
    ys[:] = rng.standard_normal((n, 1024))
    out = model(x=xs, y=ys)
    offsets = [page_offset(xs), page_offset(ys), *(page_offset(out[k]) for k in ("p", "s"))]
    for i in (2, 3):  # each output, against the inputs and the other output
        for j in range(i):
            assert _circular(offsets[i], offsets[j]) >= 1024, offsets
    np.testing.assert_allclose(out["p"], 1 / (1 + np.exp(-xs)) * ys, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(out["s"], xs + ys)


def test_output_pool_reuses_memory_only_after_release():
    g = geode.Graph("big")
    x = g.input("x", ["N", 1024])
    g.output(x * 2.0, names=["y"])
    model = geode.compile(g)
    x = np.ones((512, 1024), np.float32)
    first = model(x=x)["y"]
    second = model(x=x)["y"]
    assert not np.shares_memory(first, second)  # first is still alive: never reused
    addr = second.ctypes.data
    del second
    third = model(x=x)["y"]
    assert third.ctypes.data == addr  # freed memory comes back from the pool
    np.testing.assert_array_equal(first, 2.0)
    np.testing.assert_array_equal(third, 2.0)


def _mask_model():
    """``y = x * tril(ones(shape(x)))``: the mask depends on the input's shape only."""
    g = geode.Graph("masked")
    x = g.input("x", ["N", "N"])
    ones = ops.constant_of_shape(ops.shape(x), value=np.array([1.0], np.float32))
    mask = ops.trilu(ones, upper=0)
    g.output(x * mask, mask, names=["y", "mask"])
    return geode.compile(g)


def test_steps_of_the_binding_alone_run_once_per_binding():
    """Shape arithmetic and a mask built from it (Plan.memo_steps) run on a binding's
    first call only; later calls reuse their results, for every binding seen."""
    model = _mask_model()
    plan = model.plan
    memo = [plan.steps[k] for k in sorted(plan.memo_steps)]
    assert {s.label for s in memo} >= {"Shape", "ConstantOfShape", "Trilu"}, [
        s.label for s in plan.steps
    ]
    calls = {s.name: 0 for s in memo}
    for s in memo:
        fn = s.fn

        def counted(ins, outs, env, fn=fn, name=s.name):
            calls[name] += 1
            return fn(ins, outs, env)

        s.fn = counted
    rng = np.random.default_rng(0)
    for n in (3, 5, 3, 5, 3):
        x = rng.standard_normal((n, n)).astype(np.float32)
        out = model(x=x)
        np.testing.assert_array_equal(out["y"], x * np.tril(np.ones((n, n), np.float32)))
    assert set(calls.values()) == {2}, calls  # two bindings, each computed once


def test_memoized_outputs_are_copies_the_caller_may_change():
    model = _mask_model()
    x = np.ones((4, 4), np.float32)
    first = model(x=x)["mask"]
    first[:] = 7  # the caller's own array
    np.testing.assert_array_equal(model(x=x)["mask"], np.tril(np.ones((4, 4), np.float32)))


def test_steps_reading_data_or_variables_are_not_memoized():
    g = geode.Graph("data")
    x = g.input("x", ["N", 4])
    v = g.variable(np.ones(4, np.float32), "v")
    g.output(ops.shape(x), x + v, names=["s", "y"])
    model = geode.compile(g)
    memo_labels = {model.plan.steps[k].label for k in model.plan.memo_steps}
    assert memo_labels == {"Shape"}


def test_broadcast_constraints_in_the_plan_are_checked_before_any_step():
    """A symbolic broadcast becomes a plan constraint, checked when the inputs bind its
    symbols: the refusal names both dims and their values, and the op; the AICPU
    engine (codegen off) relies on the same check."""
    from geode.errors import InputShapeError
    from geode.runtime.plan import BroadcastConstraint

    g = geode.Graph("bc")
    x, y = g.input("x", ["N", 3]), g.input("y", ["M", 3])
    g.output(ops.sigmoid(x * y), names=["z"])
    for codegen in (True, False):
        model = geode.compile(g, codegen=codegen)
        (bc,) = model.plan.broadcasts
        assert [text for _, text in bc.dims] == ["M", "N"] and bc.symbols == {"M", "N"}
        assert bc.violation({"N": 4, "M": 1}) is None and bc.violation({"N": 0, "M": 0}) is None
        with pytest.raises(InputShapeError, match=r"dims M = 2 and N = 4 cannot broadcast.*'mul'"):
            model(x=np.ones((4, 3), np.float32), y=np.ones((2, 3), np.float32))
        out = model(x=np.ones((1, 3), np.float32), y=np.full((2, 3), 2, np.float32))["z"]
        np.testing.assert_allclose(out, np.full((2, 3), 1 / (1 + np.exp(-2)), np.float32))
    static = BroadcastConstraint(((lambda env: 5, "5"), (lambda env: env["N"], "N")), {"N"}, "op")
    assert static.violation({"N": 3}) == (
        "dims 5 and N = 3 cannot broadcast (they must be equal or one of them 1) at op"
    )


def test_a_remembered_binding_still_checks_every_call():
    """Once a binding is remembered (by input shapes, and by binding for feeds that are
    checked every call), feeds of those shapes skip nothing that depends on the values:
    a wrong dtype, a byte-swapped array, a strided array and a wrong shape are still handled per call."""
    import geode
    from geode import ops
    from geode.errors import InputDTypeError, InputShapeError

    g = geode.Graph("twice")
    x = g.input("x", ["N", 8])
    g.output(ops.relu(x) * 2.0, names=["y"])
    model = geode.compile(g)
    runner = model._executor()
    a = np.arange(-16, 16, dtype=np.float32).reshape(4, 8)
    want = np.maximum(a, 0) * 2
    for _ in range(2):
        np.testing.assert_array_equal(model(x=a)["y"], want)
    np.testing.assert_array_equal(model(x=a.astype(">f4"))["y"], want)  # checked, same record
    strided = np.repeat(a, 2, axis=1)[:, ::2]
    np.testing.assert_array_equal(model(x=strided)["y"], want)
    assert len({id(r) for r in runner._by_env.values()}) == 1
    with pytest.raises(InputDTypeError):
        model(x=a.astype(np.float64))
    with pytest.raises(InputShapeError):
        model(x=np.zeros((4, 9), np.float32))
    first, second = model(x=a)["y"], model(x=a)["y"]
    assert not np.shares_memory(first, second)
