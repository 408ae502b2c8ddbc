"""A row scale (an RMSNorm's ``x * c * w``) folded into the GEMMs that read it
(``compiler/fusion/row_scale.py``: legality; ``fusion/profit.py: row_scale_plan``: profit;
``compiler/passes/row_scale.py``: the rewrite): the rules' verdicts and reasons, the
plan (the norm's kernel writes a value per row, one dense step after it), and the
numbers against numpy (float64), against the unfolded plan and the reference engine."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import geode
from geode.compiler.fusion.profit import prologue_plan, resident, row_scale_plan
from geode.compiler.fusion.row_scale import RowScale, row_scale_candidate
from geode.compiler.passes.row_scale import fold_row_scales
from geode.costmodel.device import default_spec

RNG = np.random.default_rng(7)


def _rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _weights(k: int, n: int) -> dict[str, np.ndarray]:
    s, t = np.float32(1 / np.sqrt(max(k, 1))), np.float32(1 / np.sqrt(max(n, 1)))
    return {
        "wg": _rand(k, n) * s,
        "wu": _rand(k, n) * s,
        "wd": _rand(n, k) * t,
        "gamma": np.float32(1) + np.float32(0.1) * _rand(k),
    }


def _llama(w: dict[str, np.ndarray], gamma: bool = True, rows: tuple = ("B", "S")) -> geode.Graph:
    """RMSNorm (as torch exports it: ``x * (1 / sqrt(mean(x^2) + eps)) * w``), then
    ``silu(h @ Wg) * (h @ Wu) @ Wd + x``; ``x`` of dims ``[*rows, K]``."""
    k = w["wg"].shape[0]
    g = geode.Graph("llama_mlp")
    x = g.input("x", [*rows, k], np.float32)
    axes = g.constant(np.array([-1], np.int64), name="axes")
    ms = g.op("ReduceMean", g.op("Mul", x, x), axes, keepdims=1)
    one = g.constant(np.float32(1), name="one")
    inv = g.op("Div", one, g.op("Sqrt", g.op("Add", ms, g.constant(np.float32(1e-6)))))
    h = g.op("Mul", x, inv)
    if gamma:
        h = g.op("Mul", h, g.constant(w["gamma"], name="gamma"))
    gate = g.op("MatMul", h, g.constant(w["wg"], name="wg"))
    up = g.op("MatMul", h, g.constant(w["wu"], name="wu"))
    act = g.op("Mul", g.op("Mul", gate, g.op("Sigmoid", gate)), up)
    g.output(g.op("Add", x, g.op("MatMul", act, g.constant(w["wd"], name="wd"))), names=["y"])
    return g


def _want(x: np.ndarray, w: dict, gamma: bool = True) -> np.ndarray:
    x64 = x.astype(np.float64)
    h = x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-6)
    if gamma:
        h = h * w["gamma"]
    gate, up = h @ w["wg"], h @ w["wu"]
    return (gate / (1 + np.exp(-gate)) * up) @ w["wd"] + x64


def _close(got: np.ndarray, want: np.ndarray, rtol: float = 1e-5) -> None:
    scale = float(np.abs(want).max()) if want.size else 1.0
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * (scale or 1.0))


def _compile(g: geode.Graph, **opts) -> geode.Model:
    return geode.compile(g, session=geode.Session(), model_cache=False, **opts)


def _norm_mul(g: geode.Graph):
    """The Mul whose result the gate and up MatMuls read."""
    mm = next(n for n in g.nodes if n.op_type == "MatMul")
    return mm.inputs[0].producer


W = _weights(40, 37)


# -- legality ----------------------------------------------------------------------------
def test_rmsnorm_is_a_legal_row_scale_of_both_gemms():
    g = _llama(W)
    found = row_scale_candidate(g, _norm_mul(g))
    assert isinstance(found, RowScale)
    assert found.x is g.inputs[0]
    assert [v.name for v in found.consts] == ["gamma"]
    assert len(found.cols) == 1 and found.cols[0].producer.op_type == "Div"
    assert sorted(n.inputs[1].name for n in found.gemms) == ["wg", "wu"]
    assert len(found.muls) == 2
    np.testing.assert_array_equal(found.column_scale(), W["gamma"].astype(np.float64))
    assert "into" in found.describe() and "gamma" in found.describe()


def test_not_a_candidate():
    """A Mul no MatMul reads, and a product of whole tensors (the gated MLP's), are not
    row scales at all (no decision recorded)."""
    g = _llama(W)
    silu = next(n for n in g.nodes if n.op_type == "Sigmoid").outputs[0].consumers[0]
    assert row_scale_candidate(g, silu) is None
    act = next(n for n in g.nodes if n.op_type == "MatMul" and n.inputs[1].name == "wd")
    assert row_scale_candidate(g, act.inputs[0].producer) is None
    assert row_scale_candidate(g, next(n for n in g.nodes if n.op_type == "Sqrt")) is None


def _scaled(b: object, extra: str = "", k: int = 8, n: int = 5) -> tuple[geode.Graph, object]:
    """``(x * c) @ B`` with variations: ``extra`` = "output" (h also a graph output),
    "add" (h also read by an Add), "b_input" (B a graph input)."""
    g = geode.Graph("scaled")
    x = g.input("x", ["M", k], np.float32)
    c = g.input("c", ["M", 1], np.float32)
    h = g.op("Mul", x, c)
    if extra == "b_input":
        bv = g.input("b", [k, n], np.float32)
    else:
        bv = g.constant(b, name="b")
    y = g.op("MatMul", h, bv)
    outs, names = [y], ["y"]
    if extra == "output":
        outs.append(h)
        names.append("h")
    if extra == "add":
        outs.append(g.op("Add", h, x))
        names.append("s")
    g.output(*outs, names=names)
    return g, h.producer


@pytest.mark.parametrize(
    "extra,reason",
    [
        ("output", "is a graph output"),
        ("add", "not as a MatMul's A"),
        ("b_input", "is not a constant matrix"),
    ],
)
def test_illegal_row_scales_say_why(extra, reason):
    g, mul = _scaled(_rand(8, 5), extra)
    found = row_scale_candidate(g, mul)
    assert isinstance(found, str) and reason in found, found


def test_an_empty_depth_is_refused():
    """K = 0: ``h @ B`` is zeros, but the scale of an empty row (mean of nothing) is NaN."""
    g, mul = _scaled(np.zeros((0, 5), np.float32), k=0)
    found = row_scale_candidate(g, mul)
    assert isinstance(found, str) and "depth K is 0" in found


def test_a_factor_neither_per_row_nor_per_column_is_refused():
    g = geode.Graph("mixed")
    x = g.input("x", [4, 8], np.float32)
    c = g.input("c", [4, 1], np.float32)
    t = g.constant(_rand(4, 8), name="t")  # a constant of h's shape: not one row for all
    h = g.op("Mul", g.op("Mul", x, c), t)
    g.output(g.op("MatMul", h, g.constant(_rand(8, 4), name="b")), names=["y"])
    found = row_scale_candidate(g, h.producer)
    assert isinstance(found, str) and "neither per row nor" in found


# -- profit ------------------------------------------------------------------------------
def test_profit_pays_when_the_scale_joins_an_epilogue_not_when_it_is_a_pass():
    g = _llama(W)
    found = row_scale_candidate(g, _norm_mul(g))
    spec = default_spec()
    take, why = row_scale_plan(found.value, found.gemms, 2, spec, lambda mm: True)
    assert take and "saves" in why
    # a narrow h (K = 8) before a wide product (N = 4096) read by no elementwise op: the
    # scale would be a pass over the product of its own
    g2, mul = _scaled(_rand(8, 4096))
    found2 = row_scale_candidate(g2, mul)
    take2, why2 = row_scale_plan(found2.value, found2.gemms, 1, spec, lambda mm: False)
    assert not take2 and "loses" in why2


@pytest.mark.parametrize(
    ("rows", "take"),
    [((1, 32), False), ((8, 256), True), (("B", "S"), True)],
)
def test_the_prologue_pays_only_where_it_saves_memory_traffic(rows, take):
    """The Llama MLP's sizes (K = 256): at 1x32 rows ``x`` (32 KiB) and the scale sit in
    L2, the norm's kernel apart moves them in cache and the prologue's fixed cost (a
    kernel call's: measured) cancels the launch it saves: refused. At 8x256 rows (2 MiB)
    and at the nominal size of symbolic rows it saves the traffic: taken."""
    g = _llama(_weights(256, 688), rows=rows)
    gate = next(n for n in g.nodes if n.op_type == "MatMul")
    scale = next(n for n in g.nodes if n.op_type == "Div").outputs[0]
    spec = default_spec()
    assert resident([gate.inputs[0], scale], spec) is not take
    got, why = prologue_plan(gate, scale, spec)
    assert got is take, why
    assert why.startswith(f"the RMSNorm scale {scale.name} from {gate.name}'s A per panel: ")
    assert ("saves" in why) is take and ("in L2, fusing gains nothing" in why) is not take


def test_a_small_known_size_keeps_the_norms_kernel_and_says_why():
    """Known small rows: the fold still pays (the norm's kernel writes only the scale),
    the prologue is refused with its reason in explain(); the numbers stay right."""
    g = _llama(W, rows=(1, 32))
    model = _compile(g, num_threads=2)
    text = model.explain()
    assert "row scale of" in text and "fold: saves" in text
    assert "RMSNorm prologue apart: the RMSNorm scale" in text and "in L2" in text
    assert len(model.kernels) == 2
    norm = next(k for k in model.kernels if k.kind != "dense")
    assert [n.op_type for n in norm.ops] == ["Mul", "ReduceMean", "Add", "Sqrt", "Div"]
    x = _rand(1, 32, 40)
    _close(model(x=x)["y"], _want(x, W))
    _close(model(x=x)["y"], _compile(g, num_threads=2, row_scale_gemms=False)(x=x)["y"])


def test_the_pass_keeps_a_scale_whose_product_is_a_graph_output_and_says_why():
    g, _ = _scaled(_rand(8, 4096))
    decisions: dict[str, str] = {}
    assert not fold_row_scales(g, decisions)
    (line,) = decisions.values()
    assert "keep apart" in line and "loses" in line


# -- the plan and the numbers ------------------------------------------------------------
def test_the_norm_is_computed_in_the_dense_step():
    """Folded: the gate's and up's panels are scaled per row, and the scale (the norm's
    kernel ends at its reciprocal, a value per row) is computed by the dense step from
    A's panel rows: one kernel for the block; explain() says what and why."""
    g = _llama(W)
    model = _compile(g, num_threads=2)
    assert len(model.kernels) == 1, model.explain()
    (dense,) = model.kernels
    ops = [n.op_type for n in dense.ops]
    assert ops[:7] == ["Mul", "ReduceMean", "Add", "Sqrt", "Div", "MatMul", "MatMul"], ops
    assert ops[-2:] == ["MatMul", "Add"]
    assert ops.count("Mul") == 5 and "Sigmoid" in ops  # x*x, two row scales, SiLU's, gate's
    text = model.explain()
    line = next(t for t in text.splitlines() if "row scale of" in t)
    assert "fold: saves" in line and "gamma" in line
    assert "the RMSNorm scale" in text and "from matmul_rowscaled's A per panel: saves" in text
    assert "per panel beside" in text and "summed into" in text
    off = _compile(g, num_threads=2, row_scale_gemms=False)
    assert "row scale of" not in off.explain() and "RMSNorm scale" not in off.explain()
    assert len(off.kernels) == 2
    x = _rand(2, 9, 40)
    _close(model(x=x)["y"], _want(x, W))
    _close(model(x=x)["y"], off(x=x)["y"])


def test_a_scale_read_elsewhere_stays_in_the_norms_kernel():
    """The scale also a graph output: the fold still pays, the prologue is refused with
    its reason, and the norm's kernel writes the scale (a value per row)."""
    g = _llama(W)
    div = next(n for n in g.nodes if n.op_type == "Div")
    g.output(div.outputs[0], names=["scale"])
    model = _compile(g, num_threads=2)
    assert "no RMSNorm prologue: the scale" in model.explain()
    assert len(model.kernels) == 2
    norm = next(k for k in model.kernels if k.kind != "dense")
    assert [n.op_type for n in norm.ops] == ["Mul", "ReduceMean", "Add", "Sqrt", "Div"]
    x = _rand(2, 9, 40)
    out = model(x=x)
    _close(out["y"], _want(x, W))
    x64 = x.astype(np.float64)
    _close(out["scale"], 1 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-6))


def test_model_file_round_trip(tmp_path):
    model = _compile(_llama(W), num_threads=2)
    x = _rand(2, 33, 40)
    want = model(x=x)["y"]
    path = tmp_path / "llama.geode"
    model.save(path)
    loaded = geode.load(path, session=geode.Session())
    np.testing.assert_array_equal(loaded(x=x)["y"], want)
    assert len(loaded.kernels) == 1


def test_the_pass_can_be_disabled_by_name():
    model = _compile(_llama(W), disabled_passes=["row_scale"])
    assert "row scale of" not in model.explain()


def test_up_before_gate_with_the_scale_is_one_dense_step():
    g = _llama(W)
    mms = [n for n in g.nodes if n.op_type == "MatMul"]
    g.nodes.remove(mms[1])
    g.nodes.insert(g.nodes.index(mms[0]), mms[1])  # up listed before gate
    model = _compile(g, num_threads=2)
    assert len(model.kernels) == 1, model.explain()
    x = _rand(1, 17, 40)
    _close(model(x=x)["y"], _want(x, W))


def test_without_the_norm_weight():
    g = _llama(W, gamma=False)
    model = _compile(g, num_threads=2)
    assert "per column none" in model.explain()
    x = _rand(3, 5, 40)
    _close(model(x=x)["y"], _want(x, W, gamma=False))


def test_against_the_reference_engine():
    g = _llama(W)
    x = _rand(2, 7, 40)
    ref = _compile(g, codegen=False)(x=x)["y"]
    _close(_compile(g, num_threads=2)(x=x)["y"], ref)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batch=st.integers(0, 2),
    rows=st.integers(0, 200),
    k=st.integers(1, 48),
    n=st.integers(1, 50),
    gamma=st.booleans(),
    threads=st.sampled_from([1, 2]),
)
def test_random_shapes_match_numpy_and_the_unfolded_plan(batch, rows, k, n, gamma, threads):
    """Degenerate dims too (no batch, no rows, one column): within 1e-5 of numpy in
    float64 and of the plan without the fold (the rounding differs by a few ulps)."""
    w = _weights(k, n)
    g = _llama(w, gamma)
    x = _rand(batch, rows, k)
    got = _compile(g, num_threads=threads)(x=x)["y"]
    assert got.shape == x.shape
    _close(got, _want(x, w, gamma))
    _close(got, _compile(g, num_threads=threads, row_scale_gemms=False)(x=x)["y"])


def test_the_blas_path_computes_the_prologue_too():
    """Weights not packed: no sibling GEMM (up runs apart, its scaled product an epilogue
    input), the scale still computed in the dense step's panels (through the BLAS)."""
    model = _compile(_llama(W), num_threads=2, packed_weights=False)
    text = model.explain()
    assert "needs both weights packed once" in text and "the RMSNorm scale" in text
    x = _rand(2, 70, 40)
    _close(model(x=x)["y"], _want(x, W))


def test_float64():
    w64 = {k: v.astype(np.float64) for k, v in W.items()}
    g = geode.Graph("llama64")
    x = g.input("x", ["B", "S", 40], np.float64)
    axes = g.constant(np.array([-1], np.int64), name="axes")
    ms = g.op("ReduceMean", g.op("Mul", x, x), axes, keepdims=1)
    inv = g.op(
        "Reciprocal", g.op("Sqrt", g.op("Add", ms, g.constant(np.array(1e-6), dtype=np.float64)))
    )
    h = g.op("Mul", g.op("Mul", x, inv), g.constant(w64["gamma"], name="gamma"))
    gate = g.op("MatMul", h, g.constant(w64["wg"], name="wg"))
    up = g.op("MatMul", h, g.constant(w64["wu"], name="wu"))
    act = g.op("Mul", g.op("Mul", gate, g.op("Sigmoid", gate)), up)
    g.output(g.op("Add", x, g.op("MatMul", act, g.constant(w64["wd"], name="wd"))), names=["y"])
    model = _compile(g, num_threads=2)
    assert "row scale of" in model.explain() and "the RMSNorm scale" in model.explain()
    xs = RNG.standard_normal((2, 9, 40))
    np.testing.assert_allclose(model(x=xs)["y"], _want(xs, w64), rtol=1e-10, atol=1e-10)


def test_a_constant_per_row_is_a_row_factor_not_a_column_one():
    """A constant ``[K, 1]`` against ``h [K, K]`` varies along the rows: it scales the
    product's rows (a value per row), it is not folded into B."""
    g = geode.Graph("square")
    x = g.input("x", [6, 6], np.float32)
    r = g.constant(_rand(6, 1) + np.float32(2), name="r")
    h = g.op("Mul", x, r)
    b = _rand(6, 3)
    g.output(g.op("MatMul", h, g.constant(b, name="b")), names=["y"])
    found = row_scale_candidate(g, h.producer)
    assert isinstance(found, RowScale) and [v.name for v in found.cols] == ["r"]
    assert not found.consts
    xs = _rand(6, 6)
    want = (xs.astype(np.float64) * (np.asarray(r.data, np.float64))) @ b
    _close(_compile(g)(x=xs)["y"], want)
