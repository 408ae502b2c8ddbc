"""Random fusable graphs (hypothesis): compiled natively they match the reference engine.

Each graph starts from inputs x [N, K] (N symbolic), a row bias [K] and a column
scale [N, 1]; then a random sequence of steps picks earlier values and applies a
unary op, a broadcasting binary op, a reduction (sum/mean/max/min over a random axis,
keepdims or not, broadcast back or not), a comparison + Where, or a transpose /
slice remap. The compiled model (fusion + native kernels) must equal the reference
interpreter over the same graph at two batch sizes.
"""

import contextlib
import os
import warnings

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import geode
from geode import ops
from geode.codegen.driver import CodegenWarning
from geode.compiler.interpret import run_reference

UNARY = ["tanh", "sigmoid", "relu", "abs", "neg", "exp_tanh", "sqrt_abs", "floor"]
BINARY = ["add", "sub", "mul", "max", "min", "div_safe"]
REDUCE = ["reduce_sum", "reduce_mean", "reduce_max", "reduce_min"]


def apply_unary(name, v):
    if name == "exp_tanh":
        return ops.exp(ops.tanh(v))
    if name == "sqrt_abs":
        return ops.sqrt(ops.abs(v))
    return getattr(ops, name)(v)


def apply_binary(name, a, b):
    if name == "div_safe":
        return a / (ops.abs(b) + 1.0)
    return {"add": ops.add, "sub": ops.sub, "mul": ops.mul, "max": ops.max, "min": ops.min}[name](
        a, b
    )


step = st.one_of(
    st.tuples(st.just("unary"), st.sampled_from(UNARY), st.integers(0, 50)),
    st.tuples(st.just("binary"), st.sampled_from(BINARY), st.integers(0, 50), st.integers(0, 50)),
    st.tuples(
        st.just("reduce"),
        st.sampled_from(REDUCE),
        st.integers(0, 50),
        st.integers(0, 1),
        st.booleans(),
        st.booleans(),
    ),
    st.tuples(st.just("where"), st.integers(0, 50), st.integers(0, 50)),
    st.tuples(st.just("remap"), st.sampled_from(["transpose2", "slice"]), st.integers(0, 50)),
)


def broadcasts_to_full(shape, k):
    """Whether a value of ``shape`` broadcasts against [N, K] for every N."""
    if shape is None or len(shape) > 2:
        return False
    dims = [str(d) for d in shape]
    want = ["N", str(k)][-len(dims) :] if dims else []
    return all(d == "1" or d == w for d, w in zip(dims, want))


def build(steps, k):
    g = geode.Graph("random")
    x = g.input("x", ["N", k])
    bias = g.input("bias", [k])
    col = g.input("col", ["N", 1])
    full = [x]  # values of shape [N, K]
    anything = [x, bias, col]
    for s in steps:
        kind = s[0]
        if kind == "unary":
            # floor jumps at integers: of a computed value, a 1-2 ulp difference (tanh
            # near 1) flips it, so it floors only the inputs, whose values are exact
            pool = anything[:3] if s[1] == "floor" else anything
            v = pool[s[2] % len(pool)]
            out = apply_unary(s[1], v)
        elif kind == "binary":
            a = full[s[2] % len(full)]
            b = anything[s[3] % len(anything)]
            out = apply_binary(s[1], a, b)
        elif kind == "reduce":
            v = full[s[2] % len(full)]
            axis, keep, back = s[3], s[4], s[5]
            r = getattr(ops, s[1])(v, axes=[axis], keepdims=int(keep))
            if back:
                if not keep:
                    r = ops.unsqueeze(r, axes=[axis])
                out = v - r
            else:
                out = r
        elif kind == "where":
            a, b = full[s[1] % len(full)], full[s[2] % len(full)]
            # an offset keeps structurally near-equal operands (b = tanh(tanh(a)) for small
            # a) from tying, where a 1-ulp difference in tanh would flip the comparison
            out = ops.where(a > b + 0.125, a, b * 0.5)
        else:
            v = full[s[2] % len(full)]
            if s[1] == "transpose2":
                out = ops.transpose(ops.transpose(ops.tanh(v), perm=[1, 0]), perm=[1, 0])
            else:
                out = v[:, 1:] if k > 1 else v
        if broadcasts_to_full(out.shape, k):
            anything.append(out)  # only values that broadcast against [N, K] feed binaries
        if (
            out.shape is not None
            and len(out.shape) == 2
            and out.shape[1] == k
            and str(out.shape[0]) == "N"
        ):
            full.append(out)
    outs = (anything[3:] + [v for v in full[1:] if v not in anything])[-3:] or [x * 1.0]
    g.output(*outs, names=[f"y{i}" for i in range(len(outs))])
    return g


def matches_reference(g, model, k, seed, sizes):
    """The compiled model equals the reference interpreter on random inputs of each batch size."""
    rng = np.random.default_rng(seed)
    for n in sizes:
        feeds = {
            "x": rng.standard_normal((n, k)).astype(np.float32),
            "bias": rng.standard_normal(k).astype(np.float32),
            "col": rng.standard_normal((n, 1)).astype(np.float32),
        }
        want = run_reference(g, feeds)
        got = model(**feeds)
        for name in want:
            np.testing.assert_allclose(
                got[name], want[name], rtol=2e-5, atol=2e-5, err_msg=f"n={n} {name}\n{g}"
            )


def random_graphs(min_k: int = 1):
    """Hypothesis over random step lists, row lengths ``k`` from ``min_k`` and seeds
    (``GEODE_RANDOM_GRAPHS`` examples)."""
    configured = settings(
        max_examples=int(os.environ.get("GEODE_RANDOM_GRAPHS", "20")),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    drawn = given(
        steps=st.lists(step, min_size=1, max_size=7),
        k=st.integers(min_k, 33),
        seed=st.integers(0, 1000),
    )
    return lambda fn: configured(drawn(fn))


@contextlib.contextmanager
def pipelining_everywhere(**more: int):
    """Every multi-pass row loop software-pipelined (short rows and costly hosts too),
    with further autoschedule choices overridden by name."""
    from geode.codegen import autoschedule

    with autoschedule.override_choices(prefetch_min_row=2, pipeline_max_host_ops=1000, **more):
        yield


@random_graphs()
def test_random_fusable_graphs_match_reference(steps, k, seed):
    g = build(steps, k)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CodegenWarning)  # a fallback would hide a codegen bug
        model = geode.compile(g)
    matches_reference(g, model, k, seed, (1, 6))


@random_graphs(min_k=2)
def test_random_graphs_with_pipelined_rows_match_reference(steps, k, seed):
    """As above, with every multi-pass row loop software-pipelined (the default schedule
    does it only for rows of 1024+ elements), at batch sizes giving one chunk, a short
    chunk and several chunks of rows."""
    g = build(steps, k)
    with pipelining_everywhere(), warnings.catch_warnings():
        warnings.simplefilter("error", CodegenWarning)
        model = geode.compile(g, fusion=True, streaming="off")
    matches_reference(g, model, k, seed, (1, 9, 35))


def test_pipelined_rows_are_exercised_by_the_random_graphs():
    """The pipelined variant above really pipelines: a softmax-like row graph built by
    the same steps gets ``software_pipeline`` in its kernel trace."""
    g = build([("reduce", "reduce_max", 0, 1, True, True), ("unary", "exp_tanh", 3, 0)], 8)
    with pipelining_everywhere():
        model = geode.compile(g, streaming="off")
    traces = [k.trace for k in model.kernels if k.engine == "aicore"]
    assert any("software_pipeline(" in t for t in traces), traces


#: autoschedule choices that stream every cheap output row, however short (chunks of 4)
#: or off the cache lines (the chunks then take the plain copy unless aligned)
STREAM_ANY_ROW = {"stream_chunk": 4, "stream_min_run_bytes": 0, "line_bytes": 1}


@random_graphs()
def test_random_graphs_with_streamed_outputs_match_reference(steps, k, seed):
    """As above, with every cheap output written through staging chunks of 4 elements and
    streaming stores at any size (``streaming=0``), on pipelined rows too: chunks that do
    not divide the row, outputs that are not vector-aligned."""
    g = build(steps, k)
    with pipelining_everywhere(**STREAM_ANY_ROW), warnings.catch_warnings():
        warnings.simplefilter("error", CodegenWarning)
        model = geode.compile(g, streaming="0")
    matches_reference(g, model, k, seed, (1, 9, 35))


def test_streamed_outputs_are_exercised_by_the_random_graphs():
    """The streamed variant above really streams: an elementwise graph and a softmax-like
    row graph built by the same steps get ``stream_output`` in their kernel traces."""
    from geode.codegen import autoschedule

    for steps in (
        [("unary", "abs", 0)],
        [("reduce", "reduce_max", 0, 1, True, True), ("binary", "mul", 1, 0)],
    ):
        g = build(steps, 8)
        with autoschedule.override_choices(**STREAM_ANY_ROW):
            model = geode.compile(g, streaming="0")
        traces = [k.trace for k in model.kernels if k.engine == "aicore"]
        assert any("stream_output(" in t for t in traces), (steps, traces)
