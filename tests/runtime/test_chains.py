"""Chains: runs of native AI Core steps called in one crossing (geode.runtime.chains and
the native runtime's call_chain)."""

import numpy as np
import pytest

import geode
from geode import ops
from geode.codegen import ast as A
from geode.codegen.backends.llvm.kernel import compile_kernel
from geode.compiler.interpret import run_reference
from geode.errors import ExecutionError
from geode.runtime import native


def _scale_kernel(name: str, factor: float):
    """``Y[i] = X[i] * factor`` over ``N``."""
    n = A.Var("N")
    blk = A.Block(
        "b",
        [A.IterVar("vi", n)],
        [A.Var("i")],
        [
            A.Store(
                "Y",
                (A.Var("vi"),),
                A.Bin("*", A.Load("X", (A.Var("vi"),)), A.Const(factor, "float64")),
            )
        ],
    )
    k = A.Kernel(
        name,
        [A.Buffer("X", "float32", (n,))],
        [A.Buffer("Y", "float32", (n,))],
        ["N"],
        [A.For("i", n, [blk])],
    )
    return compile_kernel(k)


def test_call_chain_runs_kernels_in_order_in_one_call():
    k2, k3 = _scale_kernel("twice", 2.0), _scale_kernel("thrice", 3.0)
    x = np.arange(5, dtype=np.float32)
    mid, y = np.zeros(5, np.float32), np.zeros(5, np.float32)
    entries = ((k2.address, 2, 1, 2), (k3.address, 2, 1, 2))
    assert native.call_chain(entries, (x, mid, mid, y), (5, 0, 5, 0)) == 0
    np.testing.assert_array_equal(y, x * 6)


def test_call_chain_stops_at_the_first_refusal_and_says_which():
    k2, k3 = _scale_kernel("twice", 2.0), _scale_kernel("thrice", 3.0)
    x, mid, y = np.ones(5, np.float32), np.zeros(5, np.float32), np.zeros(4, np.float32)
    entries = ((k2.address, 2, 1, 2), (k3.address, 2, 1, 2))
    status = native.call_chain(entries, (x, mid, mid, y), (5, 0, 5, 0))
    assert status >> 32 == 2 and status & 0xFFFFFFFF == 2  # kernel 1 refused its argument 1
    np.testing.assert_array_equal(mid, 2.0)  # kernel 0 ran
    with pytest.raises(native.ArgumentError) as err:
        native.call_chain(entries, (x, mid, mid[::-1], y), (5, 0, 5, 0))
    assert err.value.index == 2
    with pytest.raises(native.ArgumentError) as err:  # an output must be writable
        ro = np.zeros(5, np.float32)
        ro.flags.writeable = False
        native.call_chain(entries, (x, ro, mid, y), (5, 0, 5, 0))
    assert err.value.index == 1
    with pytest.raises(ValueError, match="take 4 arrays and 4 ints"):
        native.call_chain(entries, (x, mid, mid), (5, 0, 5, 0))


def _mlp(layers: int = 4):
    g = geode.Graph("mlp")
    h = g.input("x", ["N", 16])
    rng = np.random.default_rng(0)
    for _ in range(layers):
        w = g.constant((rng.standard_normal((16, 16)) / 4).astype(np.float32))
        b = g.constant(rng.standard_normal(16).astype(np.float32))
        h = ops.relu(ops.matmul(h, w) + b)
    g.output(h, names=["y"])
    return g


def test_a_model_of_native_steps_runs_as_one_chain_for_every_binding():
    g = _mlp()
    model = geode.compile(g)
    assert len(model.plan.steps) == 1 and model.plan.steps[0].info["chain"], model.plan.steps
    rng = np.random.default_rng(1)
    for n in (1, 4, 7, 4, 0):
        x = rng.standard_normal((n, 16)).astype(np.float32)
        want = run_reference(g, {"x": x})["y"]
        np.testing.assert_allclose(model(x=x)["y"], want, rtol=1e-5, atol=1e-6)


def _step_inputs(model, step, feeds):
    """The arrays the executor hands ``step``: feeds by input slot, constants from the
    model's VarManager."""
    by_slot = {spec.slot: feeds[spec.name] for spec in model.plan.inputs}
    return [
        by_slot[i] if i in by_slot else model.var_manager.get(model.plan.slots[i].var_key)
        for i in step.inputs
    ]


def test_a_chain_copies_a_strided_input_through_its_members():
    model = geode.compile(_mlp(2))
    (step,) = model.plan.steps
    x = np.random.default_rng(2).standard_normal((6, 32)).astype(np.float32)[:, ::2]
    assert not x.flags.c_contiguous
    got = step.fn(_step_inputs(model, step, {"x": x}), [None] * len(step.outputs), {"N": 6})
    want = model(x=np.ascontiguousarray(x))["y"]
    np.testing.assert_array_equal(got[-1], want)


def test_memo_steps_stay_out_of_chains():
    g = geode.Graph("masked_mlp")
    x = g.input("x", ["N", "N"])
    ones = ops.constant_of_shape(ops.shape(x), value=np.array([1.0], np.float32))
    w = g.constant(np.eye(4, dtype=np.float32) * 2)
    g.output(ops.relu(ops.matmul(x * ops.trilu(ones, upper=0), w)), names=["y"])
    model = geode.compile(g)
    plan = model.plan
    chains = [s for s in plan.steps if "chain" in s.info]
    memo_labels = {plan.steps[k].label for k in plan.memo_steps}
    assert (
        chains
        and "Trilu" in memo_labels
        and not any("chain" in plan.steps[k].info for k in plan.memo_steps)
    )
    x4 = np.random.default_rng(3).standard_normal((4, 4)).astype(np.float32)
    for _ in range(2):
        np.testing.assert_allclose(
            model(x=x4)["y"],
            np.maximum((x4 * np.tril(np.ones((4, 4)))) @ (np.eye(4) * 2), 0),
            rtol=1e-6,
        )


def test_a_member_refusing_its_arguments_names_its_step():
    model = geode.compile(_mlp(2))
    (step,) = model.plan.steps
    ins = _step_inputs(model, step, {"x": np.zeros((3, 16), np.float32)})
    outs = [None] * len(step.outputs)
    outs[0] = np.zeros((3, 15), np.float32)  # a planned buffer of the wrong shape
    with pytest.raises(ExecutionError, match=r"step '.*': kernel .* must have shape"):
        step.fn(ins, outs, {"N": 3})


def test_threads_calling_one_model_get_the_results_of_one_thread():
    """Chains, memo steps and the pool under concurrent callers: every thread's results
    equal a single thread's, bit for bit."""
    from concurrent.futures import ThreadPoolExecutor

    g = geode.Graph("concurrent")
    x = g.input("x", ["N", 16])
    rng = np.random.default_rng(0)
    h = x
    for _ in range(3):
        w = g.constant((rng.standard_normal((16, 16)) / 4).astype(np.float32))
        h = ops.tanh(ops.matmul(h, w))
    mask = ops.constant_of_shape(ops.shape(h), value=np.array([0.5], np.float32))
    g.output(h * mask, names=["y"])
    model = geode.compile(g)
    feeds = [rng.standard_normal((n, 16)).astype(np.float32) for n in (1, 3, 64, 3, 1, 2048)]
    want = [model(x=f)["y"] for f in feeds]

    def work(i: int) -> bool:
        return all(
            np.array_equal(model(x=feeds[(i + j) % len(feeds)])["y"], want[(i + j) % len(feeds)])
            for j in range(60)
        )

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(work, range(8)))


def test_a_chain_keeps_its_binding_state_across_bindings_and_a_grown_arena():
    """A chain model called with shapes that alternate, then with one that makes the
    arena grow, then with the first again: every result right, and the outputs of
    consecutive calls never share memory (with each other or with the model)."""
    g = _mlp(3)
    model = geode.compile(g)
    runner = model._executor()
    rng = np.random.default_rng(3)
    previous = None
    for n in (2, 5, 2, 5, 3000, 2, 5):
        x = rng.standard_normal((n, 16)).astype(np.float32)
        generation = runner.arena.generation
        got = model(x=x)["y"]
        if n == 3000:
            assert runner.arena.generation > generation  # the arena moved under the chain
        np.testing.assert_allclose(got, run_reference(g, {"x": x})["y"], rtol=1e-5, atol=1e-5)
        if previous is not None:
            kept, before = previous
            assert not np.shares_memory(got, kept)
            np.testing.assert_array_equal(kept, before)
        assert not np.shares_memory(got, runner.arena.buffer)
        previous = (got, got.copy())


# -- index-checked kernels as chain members ----------------------------------------------


def _check_indices(indices: np.ndarray, dim: int) -> int:
    """The native index check (``geode_check_indices``) run alone, as a one-member chain."""
    entry = ((native.symbols()["geode_check_indices"], 1, 1, 2),)
    return native.call_chain(entry, (indices,), (dim, int(indices.dtype.kind == "u")))


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64"])
def test_the_native_index_check_accepts_exactly_minus_dim_to_dim(dtype):
    ok = np.array([[0, 4], [-5, -1]], dtype)
    assert _check_indices(ok, 5) == 0
    for bad in (5, -6, 100):
        idx = ok.copy()
        idx[1, 0] = bad
        assert _check_indices(idx, 5) == (1 << 32) | 1, bad
    assert _check_indices(np.zeros((3, 0), dtype), 0) == 0  # no indices: nothing to check
    assert _check_indices(np.zeros(1, dtype), 0) == (1 << 32) | 1  # an empty axis


@pytest.mark.parametrize("dtype", ["uint8", "uint32", "uint64"])
def test_the_native_index_check_reads_unsigned_indices_as_unsigned(dtype):
    idx = np.array([0, 4], dtype)
    assert _check_indices(idx, 5) == 0
    idx[1] = np.iinfo(dtype).max  # negative if read as signed: must still be refused
    assert _check_indices(idx, 5) == (1 << 32) | 1
    assert _check_indices(np.array([2.0], np.complex128), 5) == (1 << 32) | 2  # 16 bytes


def _gather_chain() -> geode.Graph:
    """MatMul, then a kernel gathering rows of its product at the ``ids`` input and at a
    constant index (folded into the kernel), then a MatMul with an epilogue."""
    g = geode.Graph("gather_chain")
    x = g.input("x", ["N", 8])
    ids = g.input("ids", ["K"], "int64")
    rng = np.random.default_rng(0)
    w = g.constant((rng.standard_normal((8, 8)) / 3).astype(np.float32))
    h = ops.relu(ops.matmul(x, w))
    first = ops.gather(h, g.constant(np.array(1, np.int64)), axis=0)
    g.output(ops.tanh(ops.matmul(ops.gather(h, ids, axis=0), w)) + first, names=["y"])
    return g


def test_index_checked_kernels_join_the_chain_and_refuse_bad_indices_by_step():
    """The Gather kernel is a member of the model's one chain; for two bindings in turn
    the results are the reference's; an index out of range (given, or the constant one
    against a too short axis) raises ExecutionError naming the step, the node and the
    index, before any member runs; the model still runs right afterwards."""
    g = _gather_chain()
    model = geode.compile(g)
    (step,) = model.plan.steps
    gather = next(k.name for k in model.kernels if any(n.op_type == "Gather" for n in k.ops))
    assert gather in step.info["chain"], step.info
    rng = np.random.default_rng(1)
    feeds = {
        n: {
            "x": rng.standard_normal((n, 8)).astype(np.float32),
            "ids": np.array([0, n - 1, -n, 1], np.int64),
        }
        for n in (3, 6)
    }
    for n in (3, 6, 3, 6):
        want = run_reference(g, feeds[n])["y"]
        np.testing.assert_allclose(model.run(feeds[n])["y"], want, rtol=1e-5, atol=1e-6)
    for bad in (6, -7, 2**40):
        ids = np.array([0, bad, 1], np.int64)
        with pytest.raises(ExecutionError) as err:
            model.run({"x": feeds[6]["x"], "ids": ids})
        assert f"step {gather!r}:" in str(err.value)
        assert f"index {bad} is out of range for axis 0 of size 6" in str(err.value)
    with pytest.raises(ExecutionError, match=rf"step {gather!r}: .*index 1 is out of range"):
        model.run({"x": feeds[6]["x"][:1], "ids": np.array([0], np.int64)})
    with pytest.raises(ExecutionError, match="index 1 is out of range"):  # every call
        model.run({"x": feeds[6]["x"][:1], "ids": np.array([0], np.int64)})
    np.testing.assert_allclose(
        model.run(feeds[3])["y"], run_reference(g, feeds[3])["y"], rtol=1e-5, atol=1e-6
    )


def test_a_chain_checks_indices_an_earlier_member_computed():
    """Indices a member computes (a Cast) are checked natively when the Gather that reads
    them runs, after the member that wrote them."""
    g = geode.Graph("computed_ids")
    x = g.input("x", ["N", 4])
    f = g.input("f", ["K"])
    w = g.constant(np.eye(4, dtype=np.float32) * 2)
    i = ops.cast(ops.abs(f) * 2.0, to=7)
    g.output(ops.relu(ops.matmul(ops.gather(x, i, axis=1), w)), names=["y"])
    model = geode.compile(g)
    chains = [s for s in model.plan.steps if "chain" in s.info]
    assert len(chains) == 1 and len(chains[0].info["chain"]) >= 2, model.plan.steps
    x = np.arange(-6, 6, dtype=np.float32).reshape(3, 4)
    f = np.array([0.5, -1.0, 1.5, 0.0], np.float32)
    np.testing.assert_array_equal(model(x=x, f=f)["y"], np.maximum(x[:, [1, 2, 3, 0]] * 2, 0))
    with pytest.raises(ExecutionError, match=r"step '.*': .*index 4 is out of range for axis 1"):
        model(x=x, f=np.array([0.0, 2.0, 1.0, 1.0], np.float32))


def test_a_chain_with_a_strided_input_checks_indices_in_python():
    """A strided argument sends the chain member by member (each copies what it must):
    its index checks still run, in Python, with the same error."""
    model = geode.compile(_gather_chain())
    (step,) = model.plan.steps
    x = np.random.default_rng(2).standard_normal((5, 16)).astype(np.float32)[:, ::2]
    ids = np.array([4, 0], np.int64)
    ins = _step_inputs(model, step, {"x": x, "ids": ids})
    outs = [None] * len(step.outputs)
    got = step.fn(ins, outs, {"N": 5, "K": 2})
    np.testing.assert_array_equal(got[-1], model(x=np.ascontiguousarray(x), ids=ids)["y"])
    ins = _step_inputs(model, step, {"x": x, "ids": np.array([5], np.int64)})
    with pytest.raises(ExecutionError, match=r"step '.*': .*index 5 is out of range"):
        step.fn(ins, outs, {"N": 5, "K": 1})


def test_an_unchained_gather_kernel_names_its_step_too():
    """A Gather kernel alone (no chain) refuses a bad index with the same message."""
    g = geode.Graph("gather_alone")
    x = g.input("x", ["N", 4])
    ids = g.input("ids", ["K"], "int64")
    g.output(ops.relu(ops.gather(x, ids, axis=0)), names=["y"])
    model = geode.compile(g)
    (step,) = model.plan.steps
    assert "chain" not in step.info
    x = np.ones((3, 4), np.float32)
    with pytest.raises(ExecutionError, match=rf"step {step.name!r}: .*index 3 is out of range"):
        model(x=x, ids=np.array([3], np.int64))


def test_index_checks_count_towards_the_entries_of_a_chain(monkeypatch):
    """A chain runs at most MAX_CHAIN native entries, its index checks included: with a
    limit of 3, the MatMul and the Gather kernel with its check fill one chain and the
    last kernel runs on its own, with the same results."""
    from geode.runtime import chains

    g = _gather_chain()
    feeds = {"x": np.ones((4, 8), np.float32), "ids": np.array([3, 0], np.int64)}
    monkeypatch.setattr(chains, "MAX_CHAIN", 3)
    model = geode.compile(g)
    assert [len(s.info.get("chain", [s.name])) for s in model.plan.steps] == [2, 1]
    want = run_reference(g, feeds)["y"]
    np.testing.assert_allclose(model.run(feeds)["y"], want, rtol=1e-5, atol=1e-6)
