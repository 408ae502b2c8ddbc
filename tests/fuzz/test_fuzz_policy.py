"""The fuzzer's judgement without compiling anything: which values are exact
(geode/fuzz/oplib.py), the tolerance policy and conditioning check
(geode/fuzz/compare.py), what counts as undefined behaviour (runner.py) and the
shrinker on synthetic predicates (shrink.py)."""

from __future__ import annotations

import numpy as np

from geode.fuzz import (
    Case,
    DimSpec,
    InputSpec,
    NodeSpec,
    build_graph,
    compare,
    noise,
    oplib,
    shrink,
)
from geode.fuzz.runner import undefined_behaviour
from geode.fuzz.shrink import size_of


def _case(nodes: list[NodeSpec], dtype: str = "float32", outputs: list[str] | None = None):
    dims = [DimSpec("N", True, [4, 2]), DimSpec("D", False, [6])]
    inputs = [InputSpec("x", ["N", "D"], dtype), InputSpec("y", ["D"], dtype)]
    rng = np.random.default_rng(0)
    feeds = [
        {
            "x": rng.normal(size=(n, 6)).astype(dtype),
            "y": rng.normal(size=6).astype(dtype),
        }
        for n in (4, 2)
    ]
    return Case(1, 2, dims, inputs, nodes, outputs or [nodes[-1].out], feeds)


def _dtypes(case: Case) -> dict[str, str]:
    return {v.name: str(v.dtype) for v in build_graph(case).values.values()}


def test_exactness_tracks_rounding_and_contraction():
    case = _case(
        [
            NodeSpec("Add", ["x", "y"], {}, "a"),  # one rounding of plain values: exact
            NodeSpec("Mul", ["a", "y"], {}, "m"),  # a*y+... may contract: not exact
            NodeSpec("Neg", ["x"], {}, "n"),  # still plain
            NodeSpec("Exp", ["x"], {}, "e"),
            NodeSpec("Max", ["e", "x"], {}, "mx"),
            NodeSpec("Less", ["a", "n"], {}, "ok"),  # compares exact floats: fair
            NodeSpec("Less", ["m", "x"], {}, "bad1"),  # compares an inexact float: unfair
            NodeSpec("Floor", ["mx"], {}, "bad2"),
            NodeSpec("Cast", ["e"], {"to": "int32"}, "bad3"),
            NodeSpec("Cast", ["n"], {"to": "int32"}, "ok2"),
        ]
    )
    ex = oplib.exactness(case, _dtypes(case))
    assert ex["a"] == oplib.Exactness(True, False)
    assert not ex["m"].exact and ex["n"].plain and not ex["e"].exact
    assert oplib.inexact_discontinuities(case, _dtypes(case)) == ["bad1", "bad2", "bad3"]
    assert oplib.rounding_class(case, "n") == "exact"
    assert oplib.rounding_class(case, "a") == "arith"
    assert oplib.rounding_class(case, "mx") == "trans"


def test_allowed_dtypes_come_from_the_registry():
    assert oplib.allowed_dtypes("And") == ("bool",)
    assert "bool" not in oplib.allowed_dtypes("Add")
    assert set(oplib.allowed_dtypes("Pow")) == {"float16", "float32", "float64", "int32", "int64"}
    assert "uint8" in oplib.allowed_dtypes("Pow", "T1")


def test_integers_and_exact_floats_must_be_equal():
    a = np.array([1, 2, 3], np.int32)
    assert compare.compare_output("o", a, a.copy(), "exact", 0.0) is None
    miss = compare.compare_output("o", a, np.array([1, 2, 4], np.int32), "exact", 0.0)
    assert miss.kind == "int32" and miss.mask.tolist() == [False, False, True]
    assert "1 of 3 elements" in miss.message
    f = np.array([0.0, np.nan, 1.0], np.float32)
    assert (
        compare.compare_output("o", np.array([-0.0, np.nan, 1.0], np.float32), f, "exact", 1)
        is None
    )
    assert compare.compare_output("o", np.array([0, 0, 1], np.float32), f, "exact", 1) is not None
    assert compare.compare_output("o", a, a.astype(np.int64), "exact", 0).kind == "dtype"
    assert compare.compare_output("o", a[:2], a, "exact", 0).kind == "shape"


def test_float_tolerance_by_dtype_class_and_scale():
    want = np.array([1.0, 1e-3, np.inf], np.float32)
    near = np.array([1.0 + 5e-6, 1e-3 + 5e-6, np.inf], np.float32)
    assert compare.compare_output("o", near, want, "arith", 1.0) is None
    # the same absolute error is too much for the small element without the scale
    assert compare.compare_output("o", near, want, "arith", 0.0) is not None
    assert compare.compare_output("o", -want, want, "trans", 1.0) is not None
    flipped = np.array([1.0, 1e-3, -np.inf], np.float32)
    assert compare.compare_output("o", flipped, want, "trans", 1.0) is not None
    # a float32 computation cast to float64 is judged at float32's precision
    w64 = np.array([0.5807359814643860], np.float64)
    g64 = np.array([0.5807359218597412], np.float64)
    assert compare.compare_output("o", g64, w64, "trans", 1.0) is not None
    assert compare.compare_output("o", g64, w64, "trans", 1.0, "float32") is None
    assert compare.least_precise([w64, np.zeros(1, np.float16), np.ones(2, np.int8)]) == "float16"


def test_perturbed_rounding_and_wider_precision_tell_noise_from_bugs():
    want = np.array([1.0, 2.0], np.float32)
    got = np.array([1.0, 2.001], np.float32)
    mask = np.array([False, True])
    wobbly = [np.array([1.0, 2.0 + d], np.float32) for d in (-4e-4, 3e-4, 1e-4)]
    assert noise.explained(got, want, mask, wobbly)
    steady = [np.array([1.0, 2.0], np.float32)] * 3
    assert not noise.explained(got, want, mask, steady)
    assert not noise.explained(got, want, mask, [])
    # the reference overflowed where float64 did not: the compiled result is the better one
    big = np.array([1.0, np.inf], np.float32)
    wide = np.array([1.0, 2.001], np.float64)
    assert noise.explained(got, big, mask, [], wide, 1e-4)
    assert not noise.explained(got, big, mask, [], np.array([1.0, 7.0]), 1e-4)
    flipped = np.array([1.0, -np.inf], np.float32)  # an infinity of the wrong sign is no noise
    assert not noise.explained(big, flipped, mask, [flipped] * 3, flipped.astype(np.float64), 1e-4)


def test_perturbed_runs_move_inexact_results_only():
    case = _case(
        [
            NodeSpec("Abs", ["x"], {}, "a"),  # exact: never perturbed
            NodeSpec("Exp", ["x"], {}, "e"),
            NodeSpec("Floor", ["a"], {}, "f"),
        ],
        outputs=["a", "e", "f"],
    )
    runs = noise.perturbed_runs(case, case.feeds[0], [1, 2, 3])
    assert len(runs) == 3
    x = case.feeds[0]["x"]
    for r in runs:
        assert np.array_equal(r["a"], np.abs(x)) and np.array_equal(r["f"], np.floor(np.abs(x)))
        moved = np.abs(r["e"] / np.exp(x) - 1)
        assert 0 < moved.max() <= noise.PERTURB_EPS * np.finfo(np.float32).eps * 1.01
    wide = noise.widened(case)
    assert wide.inputs[0].dtype == "float64" and wide.feeds[0]["x"].dtype == np.float64
    assert noise.wide_run(case, 0)["e"].dtype == np.float64


def test_an_ill_conditioned_mismatch_is_noise_a_planted_one_is_not():
    """tan(acos(x)) near x = 0 amplifies acos's last-ulp rounding a millionfold."""
    x = np.array([-1.3510e-6, 0.25], np.float32)
    case = _case([NodeSpec("Acos", ["x"], {}, "c"), NodeSpec("Tan", ["c"], {}, "t")])
    case.inputs[0].dims = ["D"]
    case.feeds = [{"x": x, "y": case.feeds[0]["y"]}]
    want = np.tan(np.arccos(x))
    runs = [r["t"] for r in noise.perturbed_runs(case, case.feeds[0], [0])]
    mask = np.array([True, False])
    assert noise.explained(want * np.float32(1.1), want, mask, runs)
    assert not noise.explained(want * np.float32(1.1), want, ~mask, runs)


def test_undefined_behaviour_is_recognised():
    case = _case([NodeSpec("Cast", ["x"], {"to": "int8"}, "c")])
    fine = {"x": np.array([1.5, -127.9]), "c": np.array([1, -127], np.int8)}
    assert undefined_behaviour(case, fine) is None
    assert "range" in undefined_behaviour(case, {"x": np.array([300.0]), "c": np.zeros(1, np.int8)})
    assert undefined_behaviour(case, {"x": np.array([np.nan]), "c": np.zeros(1, np.int8)})
    pow_case = _case([NodeSpec("Pow", ["x", "y"], {}, "p")])
    zero = {"x": np.array([0, 2]), "y": np.array([-1, 2]), "p": np.zeros(2, np.int64)}
    assert "negative power" in undefined_behaviour(pow_case, zero)
    big = {"x": np.array([10]), "y": np.array([40.0]), "p": np.zeros(1, np.int64)}
    assert "float power" in undefined_behaviour(pow_case, big)


def test_the_shrinker_removes_what_the_failure_does_not_need():
    nodes = [
        NodeSpec("Tanh", ["x"], {}, "t"),
        NodeSpec("Exp", ["t"], {}, "e"),
        NodeSpec("Add", ["e", "y"], {}, "s"),
        NodeSpec("Sigmoid", ["y"], {}, "g"),
    ]
    case = _case(nodes, outputs=["s", "g"])

    def has_exp(c: Case) -> bool:  # "fails" while an Exp is left
        return any(n.op == "Exp" for n in c.nodes)

    small, checks = shrink(case, has_exp)
    assert [n.op for n in small.nodes] == ["Exp"] and 0 < checks < 100
    assert len(small.feeds) == 1 and small.outputs == ["e"]
    assert all(a.size == 0 for a in small.feeds[0].values()), small.describe()
    again, _ = shrink(case, has_exp)
    assert again.describe() == small.describe()  # deterministic
    assert size_of(small) < size_of(case)


def test_the_shrinker_cuts_a_value_into_an_input_with_its_reference_values():
    nodes = [NodeSpec("Tanh", ["x"], {}, "t"), NodeSpec("Exp", ["t"], {}, "e")]
    case = _case(nodes)
    tanh_of_x = [np.tanh(f["x"]) for f in case.feeds]

    def exp_of_tanh(c: Case) -> bool:  # "fails" on exp's input being tanh(x) of run 0
        if not any(n.op == "Exp" for n in c.nodes) or not c.feeds:
            return False
        src = c.feeds[0].get("t")
        return src is not None and src.shape == (4, 6) and np.allclose(src, tanh_of_x[0])

    small, _ = shrink(case, exp_of_tanh)
    assert [n.op for n in small.nodes] == ["Exp"]
    assert [i.name for i in small.inputs] == ["t"]
