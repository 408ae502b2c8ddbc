"""Bucketed dynamic dims end to end (issue 37): ``geode.compile(..., dynamic_dims=...)``
compiles a variant per bucket with the dim static in its kernels' code, plus the
symbolic model; each call runs the variant of its sizes (exact, padded up, or
symbolic), and every path matches the symbolic model."""

import numpy as np
import pytest

import geode
from geode import ops
from geode.compiler.interpret import run_reference
from geode.errors import GeodeError
from geode.runtime.buckets import SYMBOLIC, TRIALS, BucketedModel

W = np.random.default_rng(0).standard_normal((16, 24)).astype(np.float32)
INSIDE, BETWEEN, BEYOND = [1, 4, 16], [3, 10], [20, 33]


def mlp():
    g = geode.Graph("mlp")
    x = g.input("x", ["batch", 16])
    h = ops.relu(ops.matmul(x, g.constant(W)) + 0.5)
    g.output(ops.softmax(h, axis=-1), ops.reduce_sum(h * h, axes=[1], keepdims=0), names=["p", "s"])
    return g


@pytest.fixture(scope="module")
def bucketed():
    g = mlp()
    return g, geode.compile(g, dynamic_dims={"batch": [1, 4, 16]})


def feeds(n, seed=0):
    return {"x": np.random.default_rng(seed + n).standard_normal((n, 16)).astype(np.float32)}


def same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].shape == b[k].shape, k
        np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_variants_and_their_kernels(bucketed):
    _, model = bucketed
    assert isinstance(model, BucketedModel)
    assert [b.label for b in model.buckets] == ["batch=1", "batch=4", "batch=16"]
    assert model.kernels is model.symbolic.kernels
    symbolic_src = [k.source for k in model.symbolic.kernels if k.kind == "fused"]
    assert symbolic_src and all("i64 %batch" in s for s in symbolic_src)
    for b in model.buckets:
        fused = [k for k in b.model.kernels if k.kind in ("fused", "dense")]
        assert len(b.model.kernels) == len(model.symbolic.kernels)
        assert fused and all("%batch" not in k.source for k in fused)  # the dim is static
        assert all(s.dims == (b.sizes["batch"], 16) for s in b.model.plan.inputs)


@pytest.mark.parametrize("n", INSIDE + BETWEEN + BEYOND)
def test_every_path_matches_the_symbolic_model(bucketed, n):
    g, model = bucketed
    f = feeds(n)
    choice = model.choose(f)
    if n in INSIDE:
        assert choice.label == f"batch={n}"
    elif n in BETWEEN:
        assert choice.padded == {"batch": n} and choice.bucket.sizes["batch"] > n
    else:
        assert choice is SYMBOLIC
    want = model.symbolic.run(f)
    same(model.run_variant(f, choice), want)
    same(model.run(f), want)
    ref = run_reference(g, f)
    np.testing.assert_allclose(want["p"], ref["p"], rtol=1e-5, atol=1e-6)


def test_each_size_is_served_by_the_faster_variant(bucketed):
    _, model = bucketed
    f = feeds(10, seed=5)
    for _ in range(2 * (TRIALS + 1)):
        same(model.run(f), model.symbolic.run(f))
    decision = model.decisions[(10,)]
    assert decision.choice.label == "batch=16 (padded from batch=10)"
    assert decision.winner.label in ("symbolic", decision.choice.label)
    assert (decision.winner is SYMBOLIC) == (decision.bucket_s > decision.symbolic_s)
    before = model.runs[decision.winner.label]
    model.run(f)
    assert model.runs[decision.winner.label] == before + 1
    text = model.explain()
    assert f"    batch=10: {decision.describe()}" in text


def test_explain_lists_buckets_and_their_cost(bucketed):
    _, model = bucketed
    text = model.explain()
    lines = text.splitlines()
    assert lines[0].startswith("buckets")
    assert "  dim batch: 1, 4, 16 (x dim 0)" in lines
    assert any(ln.startswith("    between buckets: padded up to the next bucket") for ln in lines)
    assert "    beyond 16: the symbolic model" in lines
    for label in ("bucket batch=1", "bucket batch=4", "bucket batch=16", "symbolic"):
        (line,) = [ln for ln in lines if ln.startswith(f"  {label}: compile ")]
        assert line.endswith(f"{len(model.kernels)} kernels (2 native)")
    assert "symbolic model (every size):" in lines
    assert "model mlp" in lines


def test_padding_refused_runs_the_symbolic_model_between_buckets():
    g = geode.Graph("centered")
    x = g.input("x", ["batch", 8])
    g.output(x - ops.reduce_mean(x, axes=[0], keepdims=1), names=["y"])
    model = geode.compile(g, dynamic_dims={"batch": [2, 8]})
    (dim,) = model.dims
    assert not dim.pads and "reduces over batch" in dim.refused
    assert "padding refused: node" in model.explain()
    for n, label in ((2, "batch=2"), (5, "symbolic"), (8, "batch=8"), (9, "symbolic")):
        f = {"x": np.random.default_rng(n).standard_normal((n, 8)).astype(np.float32)}
        assert model.choose(f).label == label
        same(model.run(f), model.symbolic.run(f))
        np.testing.assert_allclose(model.run(f)["y"], f["x"] - f["x"].mean(0), atol=1e-6)


def test_two_dynamic_dims_pad_each():
    g = geode.Graph("two")
    x = g.input("x", ["b", "s"])
    g.output(ops.tanh(x) * 2.0 + ops.transpose(ops.exp(x), perm=[0, 1]), names=["y"])
    model = geode.compile(g, dynamic_dims={"b": [2, 4], "s": [3, 6]})
    assert sorted(b.label for b in model.buckets) == ["b=2,s=3", "b=2,s=6", "b=4,s=3", "b=4,s=6"]
    for shape in [(2, 3), (3, 5), (1, 6), (4, 7), (5, 2)]:
        f = {"x": np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)}
        choice = model.choose(f)
        same(model.run_variant(f, choice), model.symbolic.run(f))
    assert model.choose({"x": np.zeros((3, 5), np.float32)}).label == (
        "b=4,s=6 (padded from b=3,s=5)"
    )


def test_pytorch_block_inside_between_and_beyond():
    model = geode.compile("tests/data/torch_block.onnx", dynamic_dims={"batch": [1, 4, 16]})
    assert model.dims[0].pads
    rng = np.random.default_rng(0)
    for n in (1, 3, 8, 30):
        f = {"x": rng.standard_normal((n, 12, 16)).astype(np.float32)}
        want = model.symbolic.run(f)
        got = model.run_variant(f, model.choose(f))
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("dims", "msg"),
    [
        ({"bach": [1, 2]}, "dynamic dim 'bach' is not a dim of graph 'mlp'"),
        ({"batch": [4, 2]}, "must be positive and increasing"),
        ({"batch": [0, 2]}, "must be positive and increasing"),
        ({"batch": [-1]}, "must be positive and increasing"),
        ({"batch": "x"}, "must be ints"),
    ],
)
def test_bad_dynamic_dims_are_refused(dims, msg):
    with pytest.raises(GeodeError, match=msg):
        geode.compile(mlp(), dynamic_dims=dims)


def test_a_bucketed_model_is_not_saved(bucketed, tmp_path):
    _, model = bucketed
    with pytest.raises(GeodeError, match="bucketed"):
        model.save(tmp_path / "m.geode")
