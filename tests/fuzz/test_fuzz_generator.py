"""The fuzz generator (geode/fuzz/generator.py, gen_*.py, data.py, spec.py, build.py):
deterministic per (seed, index), covering the op families, dtypes and dims the issue
asks for, and producing cases that build into geode graphs and survive a JSON round trip."""

from __future__ import annotations

import numpy as np
import pytest

from geode.fuzz import Case, build_graph, generate_case, oplib
from geode.fuzz.build import SpecError, reshape_target
from geode.fuzz.data import FLOAT_FILLS, make_array
from geode.fuzz.gen_state import GenStats
from geode.fuzz.spec import DimSpec, InputSpec, NodeSpec


def _same(a: Case, b: Case) -> bool:
    if a.to_json() != b.to_json() or len(a.feeds) != len(b.feeds):
        return False
    for fa, fb in zip(a.feeds, b.feeds):
        if fa.keys() != fb.keys():
            return False
        for k in fa:
            if fa[k].dtype != fb[k].dtype or not np.array_equal(fa[k], fb[k], equal_nan=True):
                return False
    return True


def test_the_generator_is_deterministic_per_seed_and_index():
    for index in range(25):
        assert _same(generate_case(11, index), generate_case(11, index)), index
    assert not _same(generate_case(11, 3), generate_case(12, 3))
    assert not _same(generate_case(11, 3), generate_case(11, 4))


@pytest.fixture(scope="module")
def many() -> tuple[list[Case], GenStats]:
    stats = GenStats()
    return [generate_case(5, i, 8, stats) for i in range(250)], stats


def test_generated_cases_cover_ops_dtypes_and_dims(many):
    cases, stats = many
    ops = {n.op for c in cases for n in c.nodes}
    for op in ("Exp", "Log", "Tanh", "Erf", "Sigmoid", "Sin", "Cos", "Sqrt", "Pow"):
        assert op in ops, op
    for op in ("Where", "And", "Or", "Not", "Div", "Mod", "Less", "Equal", "Cast"):
        assert op in ops, op
    for op in ("ReduceSum", "ReduceMax", "Reshape", "Transpose", "Slice", "Concat", "Expand"):
        assert op in ops, op
    dtypes = {i.dtype for c in cases for i in c.inputs}
    assert {"float16", "float32", "float64", "int32", "int64", "uint8", "bool"} <= dtypes
    casts = {n.params["to"] for c in cases for n in c.nodes if n.op == "Cast"}
    assert {"float16", "float32", "float64", "int32"} <= casts
    reduces = [n.params for c in cases for n in c.nodes if n.op.startswith("Reduce")]
    assert {p["keepdims"] for p in reduces} == {0, 1}
    assert any(len(p.get("axes") or []) > 1 for p in reduces)
    assert any(d.symbolic for c in cases for d in c.dims)
    assert any(not d.symbolic for c in cases for d in c.dims)
    sizes = {s for c in cases for d in c.dims for s in d.sizes}
    assert {0, 1} <= sizes
    floats = [a for c in cases for f in c.feeds for a in f.values() if a.dtype.kind == "f"]
    assert any(np.isnan(a).any() for a in floats) and any(np.isinf(a).any() for a in floats)
    assert stats.build_crashes == 0


def test_generated_cases_build_and_keep_discontinuous_ops_on_exact_floats(many):
    cases, _ = many
    for case in cases[:80]:
        g = build_graph(case)
        assert [v.name for v in g.outputs] == case.outputs
        dtype_of = {v.name: str(v.dtype) for v in g.values.values()}
        assert oplib.inexact_discontinuities(case, dtype_of) == [], case.describe()
        for run, feeds in enumerate(case.feeds):
            for spec in case.inputs:
                want = tuple(case.dim(d).size(run) if isinstance(d, str) else d for d in spec.dims)
                assert feeds[spec.name].shape == want
                assert str(feeds[spec.name].dtype) == spec.dtype


def test_a_case_survives_its_json_form():
    case = generate_case(3, 17)
    back = Case.from_json(case.to_json(), case.feeds)
    assert _same(case, back)
    assert "case seed=3 index=17" in back.describe()


def test_input_fills_stay_in_their_ranges():
    rng = np.random.default_rng(0)
    assert (make_array(rng, (500,), "float32", "positive") > 0).all()
    assert (np.abs(make_array(rng, (500,), "float64", "unit")) < 1).all()
    halves = make_array(rng, (500,), "float32", "halves")
    assert np.array_equal(halves * 2, np.round(halves * 2))
    full = make_array(rng, (2000,), "int8", "full")
    assert full.dtype == np.int8 and full.min() == -128 and full.max() == 127
    small = make_array(rng, (200,), "uint16", "small")
    assert small.dtype == np.uint16 and small.max() <= 19
    assert make_array(rng, (10,), "bool", "bool").dtype == np.bool_
    for fill in FLOAT_FILLS:
        assert make_array(rng, (0, 3), "float16", fill).shape == (0, 3)


def _case_with(shape: list, node: NodeSpec) -> Case:
    dims = [DimSpec("N", True, [3, 0]), DimSpec("D", False, [6])]
    return Case(0, 0, dims, [InputSpec("x", shape, "float32")], [node], [node.out])


def test_reshape_targets_follow_the_input_shape():
    g = build_graph(_case_with(["N", "D", 2], NodeSpec("Reshape", ["x"], _merge(1, 3), "y")))
    assert [str(d) for d in g.values["y"].shape] == ["N", "12"]
    g = build_graph(_case_with(["D", "N"], NodeSpec("Reshape", ["x"], _split(0, 3), "y")))
    assert [str(d) for d in g.values["y"].shape] == ["3", "2", "N"]
    x = build_graph(_case_with(["N", "N"], NodeSpec("Identity", ["x"], {}, "y"))).values["x"]
    with pytest.raises(SpecError):
        reshape_target(x, _split(0, 2))  # a symbolic dim cannot be split


def _merge(a: int, b: int) -> dict:
    return {"kind": "merge", "start": a, "stop": b}


def _split(axis: int, factor: int) -> dict:
    return {"kind": "split", "axis": axis, "factor": factor}
