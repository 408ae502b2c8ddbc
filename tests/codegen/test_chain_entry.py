"""A chain's own native entry (geode.codegen.backends.llvm.chain): one LLVM module per
chain calling every member by symbol, called by call_chain instead of its loop."""

import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import geode
from geode import ops
from geode.codegen import ast as A
from geode.codegen.backends.llvm.chain import ENTRY, ChainBuilder, chain_ir, member_symbol
from geode.codegen.backends.llvm.kernel import compile_kernel
from geode.compiler.interpret import run_reference
from geode.errors import CodegenError, ExecutionError
from geode.runtime import native

CHECK = native.symbols()["geode_check_indices"]


def _checks(dims: list[int], ids: list[np.ndarray]):
    """``call_chain``'s arguments for a chain of index checks: member k checks
    ``ids[k]`` against an axis of ``dims[k]``."""
    entries = tuple((CHECK, 1, 1, 2) for _ in dims)
    ints = tuple(v for d in dims for v in (d, 0))
    return entries, tuple(ids), ints


def test_the_module_text_depends_only_on_the_shape_and_declares_each_member():
    ir = chain_ir([(2, 1), (1, 2), (3, 0)])
    assert ir == chain_ir(((2, 1), (1, 2), (3, 0)))
    assert f"define i64 @{ENTRY}(ptr %ptrs, ptr %recs, ptr %ints)" in ir
    for k in range(3):
        assert f'declare i32 @"{member_symbol(k)}"' in ir
    assert chain_ir([(2, 2), (1, 2), (3, 0)]) != ir != chain_ir([(3, 1), (1, 2), (3, 0)])
    with pytest.raises(CodegenError):
        chain_ir([])
    with pytest.raises(CodegenError):
        chain_ir([(1, -1)])


@settings(max_examples=25, deadline=None)
@given(
    ranks=st.lists(st.integers(0, 3), min_size=1, max_size=12),
    bad=st.integers(-1, 11),
    data=st.data(),
)
def test_the_entry_returns_the_loops_status_and_stops_where_it_stops(ranks, bad, data):
    """Members with arrays of any rank (records of any length), one maybe out of range:
    the entry's status is the loop's: ``((k + 1) << 32) | 1`` for the bad one, else 0."""
    dims = [data.draw(st.integers(1, 9)) for _ in ranks]
    ids = []
    for k, r in enumerate(ranks):
        shape = (2,) * r
        a = np.full(shape, dims[k] - 1, np.int64)
        if k == bad:
            a.reshape(-1)[-1] = dims[k] + data.draw(st.integers(0, 5))
        ids.append(a)
    entries, arrays, ints = _checks(dims, ids)
    entry = ChainBuilder(compile=True)([(1, 2)] * len(dims), [e[0] for e in entries])
    got = native.call_chain(entries, arrays, ints, entry.address)
    assert got == native.call_chain(entries, arrays, ints)
    assert got == (0 if not 0 <= bad < len(dims) else ((bad + 1) << 32) | 1)


def _scale(name: str, factor: float):
    """A kernel ``Y[i] = X[i] * factor`` over ``N`` (refuses arrays of another size)."""
    n, vi = A.Var("N"), A.Var("vi")
    store = A.Store("Y", (vi,), A.Bin("*", A.Load("X", (vi,)), A.Const(factor, "float64")))
    blk = A.Block("b", [A.IterVar("vi", n)], [A.Var("i")], [store])
    k = A.Kernel(
        name,
        [A.Buffer("X", "float32", (n,))],
        [A.Buffer("Y", "float32", (n,))],
        ["N"],
        [A.For("i", n, [blk])],
    )
    return compile_kernel(k)


def test_kernels_run_in_order_and_none_after_a_refusal():
    k2, k3 = _scale("twice", 2.0), _scale("thrice", 3.0)
    entries = ((k2.address, 2, 1, 2), (k3.address, 2, 1, 2), (k2.address, 2, 1, 2))
    entry = ChainBuilder()([(2, 2)] * 3, [e[0] for e in entries])
    x, mid, y, z = (np.arange(5, dtype=np.float32) for _ in range(4))
    assert native.call_chain(entries, (x, mid, mid, y, y, z), (5, 0) * 3, entry.address) == 0
    np.testing.assert_array_equal(z, x * 12)
    short, z = np.zeros(4, np.float32), np.zeros(5, np.float32)
    status = native.call_chain(entries, (x, mid, mid, short, y, z), (5, 0) * 3, entry.address)
    assert status == native.call_chain(entries, (x, mid, mid, short, y, z), (5, 0) * 3)
    assert status >> 32 == 2 and status & 0xFFFFFFFF == 2  # member 1 refused argument 1
    np.testing.assert_array_equal(z, 0.0)  # member 2 never ran


def test_call_chain_validates_as_before_with_an_entry():
    dims, ids = [3, 3], [np.zeros(2, np.int64), np.zeros(2, np.int64)]
    entries, arrays, ints = _checks(dims, ids)
    entry = ChainBuilder()([(1, 2), (1, 2)], [CHECK, CHECK])
    assert native.call_chain(entries, arrays, ints, None) == 0
    with pytest.raises(native.ArgumentError) as err:
        native.call_chain(entries, (ids[0], np.zeros(4, np.int64)[::2]), ints, entry.address)
    assert err.value.index == 1
    with pytest.raises(ValueError, match="take 2 arrays and 4 ints"):
        native.call_chain(entries, arrays, ints[:2] + (0, 0, 0, 0), entry.address)
    with pytest.raises(TypeError):
        native.call_chain(entries, arrays, ints, "entry")


def test_a_builder_that_does_not_compile_gives_none_or_the_packed_object():
    shape, addrs = [(1, 2), (1, 2)], [CHECK, CHECK]
    made = ChainBuilder()(shape, addrs)
    assert ChainBuilder(compile=False)(shape, addrs) is None
    again = ChainBuilder(packed={made.key: made.obj}, compile=False)(shape, addrs)
    assert again.source == "model file" and again.address != 0


def _net(layers: int, width: int, seed: int) -> geode.Graph:
    """A stack of MatMul + bias + activation layers: one chain of native steps."""
    g = geode.Graph("chained")
    h = g.input("x", ["N", width])
    rng = np.random.default_rng(seed)
    acts = [ops.relu, ops.tanh, ops.sigmoid]
    for i in range(layers):
        w = g.constant((rng.standard_normal((width, width)) / 4).astype(np.float32))
        b = g.constant(rng.standard_normal(width).astype(np.float32))
        h = acts[(seed + i) % 3](ops.matmul(h, w) + b) * 0.5
    g.output(h, names=["y"])
    return g


def _compiled(g: geode.Graph, on: bool, monkeypatch) -> Any:
    monkeypatch.setenv("GEODE_CHAIN_ENTRY", "1" if on else "0")
    return geode.compile(g, model_cache=False)


def _entries(model) -> list:
    return [s.info.get("chain_entry") for s in model.plan.steps if "chain" in s.info]


def test_a_model_gives_the_loops_bits_through_its_chain_entry(monkeypatch):
    g = _net(4, 16, 0)
    with_entry, loop = _compiled(g, True, monkeypatch), _compiled(g, False, monkeypatch)
    assert [e is not None for e in _entries(with_entry)] == [True]
    assert _entries(loop) == [None]
    assert "1 steps" not in with_entry.explain()
    assert ", native entry (" in with_entry.explain().split("chains of native steps (1)")[1]
    assert "loop: no chain entries (GEODE_CHAIN_ENTRY=0" in loop.explain()
    rng = np.random.default_rng(1)
    for n in (1, 5, 0, 5):
        x = rng.standard_normal((n, 16)).astype(np.float32)
        got = with_entry(x=x)["y"]
        np.testing.assert_array_equal(got, loop(x=x)["y"])
        np.testing.assert_allclose(got, run_reference(g, {"x": x})["y"], rtol=1e-5, atol=1e-6)


@settings(max_examples=6, deadline=None)
@given(layers=st.integers(2, 5), width=st.sampled_from([3, 8, 17]), seed=st.integers(0, 50))
def test_random_chained_nets_give_the_same_bits_with_and_without_an_entry(layers, width, seed):
    g = _net(layers, width, seed)
    mp = pytest.MonkeyPatch()
    try:
        with_entry, loop = _compiled(g, True, mp), _compiled(g, False, mp)
    finally:
        mp.undo()
    assert all(e is not None for e in _entries(with_entry))
    x = np.random.default_rng(seed).standard_normal((seed % 7 + 1, width)).astype(np.float32)
    np.testing.assert_array_equal(with_entry(x=x)["y"], loop(x=x)["y"])


def test_an_index_out_of_range_stops_the_entry_at_its_gather_step():
    g = geode.Graph("gathers")
    x = g.input("x", ["N", 8])
    ids = g.input("ids", ["K"], dtype="int64")
    w = g.constant(np.eye(8, dtype=np.float32))
    h = ops.relu(ops.matmul(x, w))
    g.output(ops.tanh(ops.matmul(ops.gather(h, ids, axis=0), w)), names=["y"])
    model = geode.compile(g, model_cache=False)
    (step,) = model.plan.steps
    assert step.info["chain_entry"] is not None
    gather = next(k.name for k in model.kernels if any(n.op_type == "Gather" for n in k.ops))
    xs = np.ones((4, 8), np.float32)
    with pytest.raises(ExecutionError, match=rf"step {gather!r}: .*index 4 is out of range"):
        model.run({"x": xs, "ids": np.array([0, 4], np.int64)})
    good = {"x": xs, "ids": np.array([3, -4], np.int64)}
    np.testing.assert_allclose(model.run(good)["y"], run_reference(g, good)["y"], rtol=1e-6)


def test_the_dump_shows_the_chain_module(tmp_path):
    geode.compile(_net(3, 8, 2), dump_dir=str(tmp_path), model_cache=False)
    dumped = list(tmp_path.rglob("*_chain_llvm.ll"))
    assert len(dumped) == 1
    assert f"define i64 @{ENTRY}" in dumped[0].read_text()


def _fresh(code: str, env: dict) -> dict:
    """Run ``code`` in a fresh Python with this tree on the path; its last line's JSON."""
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": os.getcwd(), **env},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


_RUN = """
import json, sys
import numpy as np
import geode
sys.path.insert(0, {tests!r})
from test_chain_entry import _net
{make}
y = m(x=np.linspace(-1, 1, 48, dtype=np.float32).reshape(6, 8))["y"]
e = [s.info.get("chain_entry") for s in m.plan.steps if "chain" in s.info]
print(json.dumps({{"y": y.tolist(), "src": [x and x.source for x in e],
                  "binding": "llvmlite.binding" in sys.modules}}))
"""


def test_the_object_cache_and_model_files_carry_the_chain_object(tmp_path):
    """A second compile with the object cache takes the chain's object from it; a model
    file (saved, loaded in a fresh process with an empty cache, and the model cache's
    hit) links it from the file, importing no llvmlite.binding."""
    tests = os.path.dirname(__file__)
    compile_ = f"m = geode.compile(_net(3, 8, 4)); m.save({str(tmp_path / 'm.geode')!r})"
    env = {"GEODE_CACHE_DIR": str(tmp_path / "c"), "GEODE_MODEL_CACHE": "0"}
    cold = _fresh(_RUN.format(tests=tests, make=compile_), env)
    warm = _fresh(_RUN.format(tests=tests, make=compile_), env)
    assert cold["src"] == ["LLVM"] and warm["src"] == ["cache"]
    load = f"m = geode.load({str(tmp_path / 'm.geode')!r})"
    loaded = _fresh(_RUN.format(tests=tests, make=load), {"GEODE_CACHE_DIR": str(tmp_path / "e")})
    assert loaded["src"] == ["model file"] and loaded["binding"] is False
    assert cold["y"] == warm["y"] == loaded["y"]
    env = {"GEODE_CACHE_DIR": str(tmp_path / "mc"), "GEODE_MODEL_CACHE": "1"}
    make = "m = geode.compile(_net(3, 8, 4))"
    _fresh(_RUN.format(tests=tests, make=make), env)
    hit = _fresh(_RUN.format(tests=tests, make=make), env)
    assert hit["src"] == ["model file"] and hit["binding"] is False and hit["y"] == cold["y"]


def test_a_started_module_nobody_claims_is_abandoned():
    """A plan that fails between starting its chains' modules and making them leaves
    nothing pending on the background threads."""
    from geode.codegen.backends.llvm import background

    before = background.pending()
    builder = ChainBuilder(cache_dir=None)
    builder.start([(7, 3)] * 5 + [(1, 1)])
    assert background.pending() == before + 1
    builder.abandon()
    assert background.pending() == before
