"""Views as aliases in the memory plan: Reshape, Flatten, Squeeze, Unsqueeze, Identity and
contiguous Slices left on their own run no step and get no buffer; their output is a view
of the root's storage, which stays live until the alias's last use; model outputs never
share memory with the model, the caller's inputs, each other or an earlier call's."""

import logging
import re

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import geode
from geode import ops
from geode.errors import ExecutionError
from geode.runtime import native
from geode.runtime.executor import Executor
from geode.runtime.memory import MemoryPlan
from geode.runtime.plan import Alias, InputSpec, Plan, Slot
from geode.runtime.var_manager import VarManager

RNG = np.random.default_rng(7)


def weights(*shape):
    return (RNG.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)


def members(plan):
    """Names of the units the plan's steps run (a chain step runs several)."""
    return [name for s in plan.steps for name in s.info.get("chain", [s.name])]


def by_name(plan):
    return {s.name: i for i, s in enumerate(plan.slots)}


def views_between_matmuls():
    """MatMul -> Reshape -> MatMul -> Flatten -> Unsqueeze -> MatMul -> Squeeze (output)."""
    w1, w2, w3 = weights(64, 128), weights(32, 16), weights(64, 8)
    g = geode.Graph("views_between_matmuls")
    x = g.input("x", ["N", 64])
    h = ops.matmul(x, g.constant(w1, name="w1"))  # [N, 128]
    r = ops.reshape(h, [0, 4, 32])  # [N, 4, 32]
    y = ops.matmul(r, g.constant(w2, name="w2"))  # [N, 4, 16]
    f = ops.flatten(y, axis=1)  # [N, 64]
    u = ops.unsqueeze(f, axes=[1])  # [N, 1, 64]
    z = ops.matmul(u, g.constant(w3, name="w3"))  # [N, 1, 8]
    g.output(ops.squeeze(z, axes=[1]), names=["out"])

    def ref(x):
        y = (x @ w1).reshape(len(x), 4, 32) @ w2
        return {"out": y.reshape(len(x), 64) @ w3}

    return g, ref


def test_views_between_kernels_have_no_step_and_no_buffer():
    g, ref = views_between_matmuls()
    model = geode.compile(g)
    plan = model.plan
    # three kernels (the MatMuls), one native chain, no step for any view
    assert [k.ops[0].op_type for k in model.kernels] == ["MatMul"] * 3
    assert len(members(plan)) == 3 and len(plan.steps) == 1
    slot = by_name(plan)
    views = {plan.slots[a].name for a in plan.aliases}
    assert views == {"reshape_1", "flatten_4", "unsqueeze_6", "out"}
    # the chain makes the views its members read; it takes only x and the weights (packed
    # once where the CPU runs the packed-weight GEMM: codegen/packed_weights.py)
    packed = "#packed16" if native.pool_info()["gemm_packed_isa"] >= 1 else ""
    weights_in = [f"w{i}{packed}" for i in (1, 2, 3)]
    assert sorted(plan.slots[i].name for i in plan.steps[0].inputs) == [*weights_in, "x"]
    # arena: h and y only (the output's root z gets fresh memory per call)
    assert plan.arena_slots == {slot["matmul_0"], slot["matmul_2_3"]}
    layout = plan.memory.layout({"N": 8})
    assert layout.total == 8 * 128 * 4 + 8 * 64 * 4  # h and y are live together
    assert layout.aliases == {slot["reshape_1"]: slot["matmul_0"]} | {
        slot["flatten_4"]: slot["matmul_2_3"],
        slot["unsqueeze_6"]: slot["matmul_2_3"],
    }
    z = model.kernels[-1].ops[0].outputs[0].name
    assert plan.root(slot["out"]) == slot[z] and slot[z] not in plan.arena_slots
    for n in (1, 8, 33):
        x = RNG.standard_normal((n, 64)).astype(np.float32)
        np.testing.assert_allclose(model(x=x)["out"], ref(x)["out"], rtol=1e-4, atol=1e-5)
    text = model.explain()
    assert "views (4)" in text and "kernels (3)" in text
    assert "reshape_1: float32[N, 4, 32] alias of matmul_0 (an arena buffer)" in text


def test_step_and_kernel_counts_before_and_after_views():
    """Without the alias, a lone view was a copy kernel of its own."""
    g, _ = views_between_matmuls()
    with_views = geode.compile(g)
    # the same graph where the views read a buffer the planner must copy (Transpose)
    # keeps its kernels: only views became aliases
    g2 = geode.Graph("transpose_is_no_view")
    x = g2.input("x", ["N", 64])
    h = ops.matmul(x, g2.constant(weights(64, 128), name="w1"))
    t = ops.transpose(ops.reshape(h, [0, 4, 32]), perm=[0, 2, 1])
    g2.output(ops.matmul(t, g2.constant(weights(4, 8), name="w2")), names=["y"])
    copied = geode.compile(g2)
    assert len(with_views.kernels) == 3 and not any(
        n.op_type in ("Reshape", "Flatten", "Unsqueeze", "Squeeze")
        for k in with_views.kernels
        for n in k.ops
    )
    assert [sorted(n.op_type for n in k.ops) for k in copied.kernels] == [
        ["MatMul"],
        ["Reshape", "Transpose"],
        ["MatMul"],
    ]


def onnx_views_model():
    """An ONNX model: Gemm-free MatMuls with Reshape, Flatten, Squeeze, Unsqueeze,
    Identity and a contiguous Slice between them, and outputs that are views of the
    input, of a constant and of each other."""
    w1, w2 = weights(16, 24), weights(6, 5)
    c = np.arange(12, dtype=np.float32)
    inits = [
        numpy_helper.from_array(w1, "w1"),
        numpy_helper.from_array(w2, "w2"),
        numpy_helper.from_array(c, "c"),
        numpy_helper.from_array(np.array([0, 4, 6], np.int64), "shape3"),
        numpy_helper.from_array(np.array([3, 4], np.int64), "shape_c"),
        numpy_helper.from_array(np.array([1], np.int64), "ax1"),
        numpy_helper.from_array(np.array([0], np.int64), "ax0"),
        numpy_helper.from_array(np.array([1], np.int64), "s1"),
        numpy_helper.from_array(np.array([3], np.int64), "e3"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),  # [B, 24]
        helper.make_node("Reshape", ["h", "shape3"], ["r"]),  # [B, 4, 6]
        helper.make_node("MatMul", ["r", "w2"], ["m"]),  # [B, 4, 5]
        helper.make_node("Unsqueeze", ["m", "ax0"], ["u"]),  # [1, B, 4, 5]
        helper.make_node("Slice", ["u", "s1", "e3", "ax1"], ["sl"]),  # [1, 2, 4, 5]
        helper.make_node("Flatten", ["sl"], ["f"], axis=2),  # [2, 20]
        helper.make_node("Exp", ["f"], ["e"]),
        helper.make_node("Squeeze", ["u", "ax0"], ["sq"]),  # [B, 4, 5] view of m
        helper.make_node("Identity", ["x"], ["x_out"]),  # a view of the input
        helper.make_node("Reshape", ["c", "shape_c"], ["c_out"]),  # a view of a constant
    ]
    outputs = [
        helper.make_tensor_value_info("e", TensorProto.FLOAT, [2, 20]),
        helper.make_tensor_value_info("m", TensorProto.FLOAT, ["B", 4, 5]),
        helper.make_tensor_value_info("sq", TensorProto.FLOAT, ["B", 4, 5]),  # view of m
        helper.make_tensor_value_info("x_out", TensorProto.FLOAT, ["B", 16]),
        helper.make_tensor_value_info("c_out", TensorProto.FLOAT, [3, 4]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 16])
    graph = helper.make_graph(nodes, "onnx_views", [x], outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize("codegen", [True, False], ids=["native", "reference"])
def test_onnx_views_match_the_reference_evaluator(codegen):
    model = onnx_views_model()
    # no constant folding: the view of the constant stays a view
    compiled = geode.compile(model, codegen=codegen, disabled_passes=("const_fold",))
    plan = compiled.plan
    names = {plan.slots[a].name for a in plan.aliases}
    if codegen:  # the Exp kernel reads m through Unsqueeze, Slice and Flatten: no copy
        assert names == {"r", "sq", "x_out", "c_out"}
        (exp,) = [k for k in compiled.kernels if any(n.op_type == "Exp" for n in k.ops)]
        assert sorted(n.op_type for n in exp.ops) == ["Exp", "Flatten", "Slice", "Unsqueeze"]
    else:  # on reference kernels every view is an alias
        assert names == {"r", "u", "sl", "f", "sq", "x_out", "c_out"}
    assert not any(s.label in ("Reshape", "Flatten", "Squeeze", "Identity") for s in plan.steps)
    ref = ReferenceEvaluator(model)
    out_names = [o.name for o in model.graph.output]
    for b in (3, 5):
        x = RNG.standard_normal((b, 16)).astype(np.float32)
        got = compiled(x=x.copy())
        want = dict(zip(out_names, ref.run(None, {"x": x})))
        for k in out_names:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)
            assert got[k].shape == want[k].shape


def test_outputs_that_are_views_share_memory_with_nothing():
    model = geode.compile(onnx_views_model(), disabled_passes=("const_fold",))
    x = RNG.standard_normal((4, 16)).astype(np.float32)
    first = model(x=x)
    kept = {k: v.copy() for k, v in first.items()}
    for k, v in first.items():
        assert not np.shares_memory(v, x), k
        for k2, v2 in first.items():
            assert k == k2 or not np.shares_memory(v, v2), (k, k2)
    # the caller may write into every output: the model and later calls do not change
    for v in first.values():
        v[...] = -1.0
    second = model(x=x)
    for k in kept:
        np.testing.assert_array_equal(second[k], kept[k])
        assert not np.shares_memory(second[k], first[k]), k
    third = model(x=x)
    for k in kept:  # the second call's outputs are not reused by the third
        np.testing.assert_array_equal(second[k], kept[k])
        assert not np.shares_memory(third[k], second[k]), k


def test_a_views_root_stays_live_until_the_views_last_use():
    """e is read by a MatMul right away and, through a view, only much later: without
    the extended live range the big buffers between would reuse e's bytes."""
    w = weights(64, 64)
    g = geode.Graph("late_view")
    x = g.input("x", ["N", 64])
    e = ops.exp(x)
    a = ops.matmul(e, g.constant(w, name="w"))  # e's last direct use
    big = a
    for i in range(3):  # buffers that could take e's bytes
        big = ops.matmul(ops.tanh(big), g.constant(w + i, name=f"w{i}"))
    late = ops.reshape(e, [0, 8, 8])  # read at the very end
    g.output(ops.matmul(late, g.constant(weights(8, 8), name="w8")) + ops.reshape(big, [0, 8, 8]))
    model = geode.compile(g)
    plan = model.plan
    (alias,) = plan.aliases.values()
    root = alias.root
    assert plan.slots[root].name == "exp_0" and root in plan.arena_slots
    req = {r.slot: r for r in plan.memory.requests}[root]
    # live from Exp to the MatMul that reads the view, not to the first MatMul only
    (reader,) = [k.name for k in model.kernels if k.ops[0].inputs[0].name == "reshape_13"]
    assert re.search(rf"exp_0: .*? arena buffer, live \S+ \.\. {reader}\n", plan.memory_text)
    assert req.last - req.first >= 4  # Exp, then 4 MatMul steps (Tanh fuse into them)
    layout = plan.memory.layout({"N": 16})
    plan.memory.check(layout)
    x_in = RNG.standard_normal((16, 64)).astype(np.float32)
    ev = np.exp(x_in)
    b = ev @ w
    for i in range(3):
        b = np.tanh(b) @ (w + i)
    w8 = g.values["w8"].data
    want = ev.reshape(16, 8, 8) @ w8 + b.reshape(16, 8, 8)
    (got,) = model(x=x_in).values()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_fusion_still_sees_through_views():
    """Exp -> Reshape -> Tanh is one kernel (the view is read through its index map);
    a view whose input the kernel writes anyway is left out of it, as an alias."""
    g = geode.Graph("through")
    x = g.input("x", ["N", 64])
    g.output(ops.tanh(ops.reshape(ops.exp(x), [0, 8, 8])), names=["y"])
    model = geode.compile(g)
    assert len(model.kernels) == 1 and not model.plan.aliases
    assert sorted(n.op_type for n in model.kernels[0].ops) == ["Exp", "Reshape", "Tanh"]

    g2 = geode.Graph("apart")
    x = g2.input("x", ["N", 64])
    e = ops.exp(x)
    g2.output(ops.matmul(e, g2.constant(weights(64, 4), name="w")), names=["a"])
    g2.output(ops.matmul(ops.reshape(e, [0, 8, 8]), g2.constant(weights(8, 2), name="v")))
    m2 = geode.compile(g2)
    assert [sorted(n.op_type for n in k.ops) for k in m2.kernels] == [
        ["Exp"],
        ["MatMul"],
        ["MatMul"],
    ]
    assert "apart, it is an alias of its input (no copy)" in m2.explain()
    xa = RNG.standard_normal((3, 64)).astype(np.float32)
    out = m2(x=xa)
    np.testing.assert_allclose(out["a"], np.exp(xa) @ g2.values["w"].data, rtol=1e-5)


def test_contiguous_slices_are_views_for_every_batch_size():
    """Rows [1:3] of h, and a run of a unit-led view of h: aliases with no step, right
    also when the slice is clamped (N < 3) or empty (N = 1)."""
    w, v = weights(64, 32), weights(32, 4)
    g = geode.Graph("slices")
    x = g.input("x", ["N", 64])
    h = ops.matmul(x, g.constant(w, name="w"))
    rows = ops.slice(h, [1], [3], [0])
    run = ops.slice(ops.unsqueeze(h, axes=[0]), [2], [4], [1])  # [1, <=2, 32]
    g.output(ops.matmul(rows, g.constant(v, name="v")), names=["y"])
    g.output(run, names=["run"])
    model = geode.compile(g)
    assert len(model.plan.aliases) == 3  # rows, the unsqueeze, run
    assert [k.ops[0].op_type for k in model.kernels] == ["MatMul", "MatMul"]
    for n in (1, 2, 3, 6):
        xa = RNG.standard_normal((n, 64)).astype(np.float32)
        got = model(x=xa)
        hh = xa @ w
        np.testing.assert_allclose(got["y"], hh[1:3] @ v, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got["run"], hh[None, 2:4], rtol=1e-5, atol=1e-6)
        assert got["y"].shape == (len(hh[1:3]), 4) and got["run"].shape == hh[None, 2:4].shape


def test_a_strided_slice_is_no_view():
    """A Slice of a non-leading axis reads a strided part: it stays a kernel."""
    g = geode.Graph("strided")
    x = g.input("x", ["N", 64])
    h = ops.matmul(x, g.constant(weights(64, 32), name="w"))
    g.output(ops.matmul(ops.slice(h, [0], [8], [1]), g.constant(weights(8, 4), name="v")))
    model = geode.compile(g)
    assert not model.plan.aliases
    assert any(n.op_type == "Slice" for k in model.kernels for n in k.ops)


def test_views_of_a_variable_are_not_aliases():
    """An assignment may replace a variable during the run: a view of it stays a step."""
    g = geode.Graph("var_view")
    x = g.input("x", [2, 3])
    v = g.variable(np.arange(6, dtype=np.float32), "table")
    g.output(x + ops.reshape(v, [2, 3]), names=["y"])
    model = geode.compile(g)
    assert not model.plan.aliases
    np.testing.assert_array_equal(
        model(x=np.ones((2, 3), np.float32))["y"], 1 + np.arange(6).reshape(2, 3)
    )


def test_a_failing_view_is_an_execution_error():
    """A view whose input does not fit its shape fails with the view's name."""
    slots = [
        Slot("x", np.dtype(np.float32), "input"),
        Slot("y", np.dtype(np.float32), "activation", lambda env: (4, 4)),
    ]

    def view(a, env):
        return a.reshape(slots[1].shape(env))

    alias = Alias(1, 0, 0, view, "Reshape 'r' of 'x'")
    spec = InputSpec("x", 0, np.dtype(np.float32), (5,), ("5",))
    plan = Plan("bad_view", [spec], [("y", 1)], slots, [], aliases={1: alias}, alias_start=[1])
    with pytest.raises(ExecutionError, match="view Reshape 'r' of 'x': ValueError"):
        Executor(plan, VarManager(session_id=99)).run({"x": np.ones(5, np.float32)})


def test_memory_plan_aliases_are_checked_and_described():
    from geode.errors import GeodeError
    from geode.runtime.memory import BufferRequest, describe

    with pytest.raises(GeodeError, match="root must be a requested buffer"):
        MemoryPlan([BufferRequest(0, 64, 0, 1)], aliases={2: 1})
    plan = MemoryPlan([BufferRequest(0, 64, 0, 1)], aliases={2: 0})
    layout = plan.layout({})
    assert layout.aliases == {2: 0} and layout.total == 64
    assert "slot 2: alias of slot 0" in describe(layout)


# -- random view chains ------------------------------------------------------------------
def _factor(n, rng):
    """A random split of n into factors."""
    dims = []
    while n > 1 and len(dims) < 3:
        divisors = [d for d in range(2, n + 1) if n % d == 0]
        d = rng.choice(divisors)
        dims.append(int(d))
        n //= d
    return dims + ([n] if n > 1 else []) or [1]


@st.composite
def view_chains(draw):
    n = draw(st.integers(1, 4))
    k = draw(st.sampled_from([4, 6, 8, 12]))
    ops_ = draw(
        st.lists(
            st.sampled_from(["reshape", "flatten", "unsqueeze", "squeeze", "identity", "slice"]),
            min_size=1,
            max_size=5,
        )
    )
    seed = draw(st.integers(0, 1000))
    tail = draw(st.sampled_from(["output", "matmul", "both"]))
    return n, k, ops_, seed, tail


def _apply(kind, t, arr, rng):
    """Apply view ``kind`` to graph value t and numpy array arr alike."""
    if kind == "reshape":
        dims = _factor(arr.size, rng)
        return ops.reshape(t, dims), arr.reshape(dims)
    if kind == "flatten":
        axis = int(rng.integers(0, arr.ndim + 1))
        return ops.flatten(t, axis=axis), arr.reshape(
            int(np.prod(arr.shape[:axis])), int(np.prod(arr.shape[axis:]))
        )
    if kind == "unsqueeze":
        axis = int(rng.integers(0, arr.ndim + 1))
        return ops.unsqueeze(t, axes=[axis]), np.expand_dims(arr, axis)
    if kind == "squeeze":
        ones = [i for i, d in enumerate(arr.shape) if d == 1]
        if not ones:
            return t, arr
        axis = int(rng.choice(ones))
        return ops.squeeze(t, axes=[axis]), np.squeeze(arr, axis)
    if kind == "slice":  # a contiguous run of the first axis that is not a 1
        lead = [i for i, d in enumerate(arr.shape) if d != 1]
        if not lead:
            return t, arr
        a = lead[0]
        start = int(rng.integers(0, arr.shape[a]))
        end = int(rng.integers(start + 1, arr.shape[a] + 1))
        return ops.slice(t, [start], [end], [a]), arr[(slice(None),) * a + (slice(start, end),)]
    return ops.identity(t), arr


@settings(max_examples=40, deadline=None)
@given(view_chains())
def test_random_view_chains_are_aliases_with_numpy_results(case):
    n, k, chain, seed, tail = case
    rng = np.random.default_rng(seed)
    w = weights(8, k)
    g = geode.Graph("random_views")
    x = g.input("x", [n, 8])
    t = ops.matmul(x, g.constant(w, name="w"))
    xa = RNG.standard_normal((n, 8)).astype(np.float32)
    arr = xa @ w
    n_views = 0
    for kind in chain:
        before = t
        t, arr = _apply(kind, t, arr, rng)
        n_views += t is not before
    want = {}
    if tail in ("output", "both"):
        g.output(t, names=["v"])
        want["v"] = arr
    if tail in ("matmul", "both"):
        flat = ops.reshape(t, [-1, 1])
        v = weights(1, 3)
        g.output(ops.matmul(flat, g.constant(v, name="v_w")), names=["m"])
        want["m"] = arr.reshape(-1, 1) @ v
        n_views += 1
    # no simplification: every view of the chain stays a node (and becomes an alias)
    model = geode.compile(g, disabled_passes=("simplify",))
    plan = model.plan
    assert len(plan.aliases) == n_views
    assert all(n.op_type == "MatMul" for kern in model.kernels for n in kern.ops)
    for _ in range(2):
        got = model(x=xa)
        for name, value in want.items():
            np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-5)
            assert got[name].shape == value.shape
            assert not np.shares_memory(got[name], xa)


def test_the_memory_plan_dump_and_log_show_the_aliases(tmp_path, caplog):
    g, _ = views_between_matmuls()
    caplog.set_level(logging.INFO, logger="geode")
    model = geode.compile(g, dump_dir=str(tmp_path), debug=1)
    (path,) = (tmp_path / g.name).glob("*_memory_plan.txt")
    text = path.read_text(encoding="utf-8")
    assert text.strip() == model.plan.memory_text.strip()
    assert "memory plan: 2 arena buffers, 4 aliases" in text
    assert "reshape_1: float32[N, 4, 32] alias of matmul_0 (an arena buffer)" in text
    assert "out: float32[N, 8] alias of" in text and "a model output's" in text
    logged = "\n".join(r.getMessage() for r in caplog.records if r.name == "geode")
    assert "==== memory_plan ====" in logged and "alias of matmul_0" in logged


def test_a_reshape_alias_runs_its_view_once_per_binding():
    """An alias that only reshapes its root is made by its view on a binding's first run,
    then by a reshape to the shape kept for the binding (two bindings in turn); an alias
    with a slice on the way runs its view every time."""
    f32 = np.dtype(np.float32)
    slots = [
        Slot("x", f32, "input"),
        Slot("y", f32, "activation", lambda env: (env["N"] * 2,)),
        Slot("z", f32, "activation", lambda env: (env["N"] - 1, 2)),
    ]
    calls = []

    def flat(a, env):
        calls.append(("y", env["N"]))
        return a.reshape(slots[1].shape(env))

    def tail(a, env):
        calls.append(("z", env["N"]))
        return a[1:]

    aliases = {
        1: Alias(1, 0, 0, flat, "Reshape 'r' of 'x'"),
        2: Alias(2, 0, 0, tail, "Slice 's' of 'x'", reshape=False),
    }
    spec = InputSpec("x", 0, f32, ("N", 2), ("N", "2"))
    outputs = [("y", 1), ("z", 2)]
    plan = Plan("aliases", [spec], outputs, slots, [], aliases=aliases, alias_start=[1, 2])
    runner = Executor(plan, VarManager(session_id=98))
    for n in (3, 5, 3, 5, 3):
        x = np.arange(2 * n, dtype=np.float32).reshape(n, 2)
        got = runner.run({"x": x})
        np.testing.assert_array_equal(got["y"], x.reshape(-1))
        np.testing.assert_array_equal(got["z"], x[1:])
    assert [c for c in calls if c[0] == "y"] == [("y", 3), ("y", 5)]
    assert [c for c in calls if c[0] == "z"] == [("z", n) for n in (3, 5, 3, 5, 3)]
