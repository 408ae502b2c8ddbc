"""Default schedules: scheduled kernels (interpreted) match the reference, the intended
pattern schedule is applied without fallback, and traces replay to the same AST."""

import math
import re

import numpy as np
import pytest
from lowering_check import check_groups, prepare
from test_lower import CASES, _graph

import geode
from geode import examples, ops
from geode.codegen import ast as A
from geode.codegen.autoschedule import Choices, schedule_group
from geode.codegen.lower import lower_group

rng = np.random.default_rng(5)

#: the default tuning choices the schedules below are checked against
DEFAULTS = Choices()
chunk = DEFAULTS.elementwise_prefetch_chunk
PREFETCH_CHUNK = DEFAULTS.prefetch_chunk


def scheduled(lk, group):
    sch = schedule_group(lk, group)
    assert sch.level == "full", sch.notes
    return sch.kernel


@pytest.mark.parametrize("name", sorted(examples.ALL))
def test_examples_scheduled_correctly(name):
    ex = examples.ALL[name]()
    feeds = ex.make_inputs(rng, 3)
    if name == "reduce_chain":
        feeds = {"x": rng.standard_normal((2, 3, 1024), dtype=np.float32)}
    check_groups(ex.graph, feeds, scheduled)


@pytest.mark.parametrize("case", sorted(CASES))
def test_cases_scheduled_correctly(case):
    build, shapes = CASES[case]
    feeds = {
        f"x{i}": rng.standard_normal([3 if isinstance(d, str) else d for d in s]).astype(np.float32)
        for i, s in enumerate(shapes)
    }
    check_groups(_graph(build, shapes), feeds, lambda lk, g: schedule_group(lk, g).kernel)


def _kernel(name):
    g, plan = prepare(examples.ALL[name]().graph)
    lk = lower_group(plan.groups[0], g, "k")
    return lk, plan.groups[0]


def test_row_reduce_pattern_structure():
    lk, group = _kernel("layernorm")
    sch = schedule_group(lk, group)
    text = A.format_kernel(sch.kernel)
    top = [s for s in sch.kernel.body if isinstance(s, A.For)]
    assert len(top) == 1 and top[0].kind is A.ForKind.PARALLEL  # one parallel row loop
    # mean | variance | normalise: three walks over each row; the centring x - mean is
    # cheap, so the variance and normalise passes recompute it (no row buffer)
    assert text.count("vectorized for") == 3
    assert "local " not in text and "reuse_output" not in str(sch.trace)
    assert "register" in text  # per-row statistics live in registers


def test_small_static_domain_runs_serially():
    g = _graph(lambda a: a * 2.0 + 1.0, [[4, 8]])
    gg, plan = prepare(g)
    sch = schedule_group(lower_group(plan.groups[0], gg, "k"), plan.groups[0])
    assert "parallel for" not in A.format_kernel(sch.kernel)
    assert "vectorized for" in A.format_kernel(sch.kernel)


@pytest.mark.parametrize("name", ["rmsnorm", "softmax", "lstm_gates", "attention"])
def test_trace_replays_to_the_same_ast(name):
    g, plan = prepare(examples.ALL[name]().graph)
    for group in plan.groups:
        lk = lower_group(group, g, "k")
        sch = schedule_group(lk, group)
        again = sch.trace.replay(lk.kernel)
        assert A.format_kernel(again.kernel) == A.format_kernel(sch.kernel)


def test_fuse_siblings_refuses_illegal_fusions():
    from geode.codegen.schedule import Schedule
    from geode.errors import ScheduleError

    lk, group = _kernel("layernorm")
    sch = schedule_group(lk, group)
    sp = [s for s in sch.kernel.body if isinstance(s, A.For)][0]
    loops = [s.var for s in sp.body if isinstance(s, A.For)]
    assert len(loops) == 3
    fresh = Schedule(sch.kernel)
    # the centring pass reads the mean the first pass accumulates: not the same element
    with pytest.raises(ScheduleError, match="fuse_siblings"):
        fresh.fuse_siblings(loops[0], loops[1])
    # the output pass reads the variance register the fused pass accumulates
    with pytest.raises(ScheduleError, match="fuse_siblings"):
        fresh.fuse_siblings(loops[1], loops[2])
    with pytest.raises(ScheduleError, match="does not follow"):
        fresh.fuse_siblings(loops[2], loops[1])
    with pytest.raises(ScheduleError, match="no loop"):
        fresh.fuse_siblings(loops[0], "nope")
    assert A.format_kernel(fresh.kernel) == A.format_kernel(sch.kernel)  # failures change nothing


# ---------------------------------------------------------------------------------
# streaming stores: which outputs the default schedules stream
# ---------------------------------------------------------------------------------


def _traces(name, min_bytes, **kw):
    ex = examples.ALL[name](**kw)
    g, plan = prepare(ex.graph)
    out = []
    for group in plan.groups:
        sch = schedule_group(lower_group(group, g, "k"), group, stream_min_bytes=min_bytes)
        assert sch.level == "full", sch.notes
        out.append(str(sch.trace))
    return out


@pytest.mark.parametrize(
    "name,streamed",
    [
        ("rmsnorm", True),
        ("layernorm", True),
        # its exp row stays in a row buffer; the scaled row streams (rows of 1024: whole
        # cache lines, see test_kernels.test_rows_off_the_cache_line_or_too_short_...)
        ("softmax", True),
        ("reduce_chain", True),
        ("gelu", False),  # tanh per element: compute-bound, staging would cost
        ("lstm_gates", False),  # five transcendentals per output element
    ],
)
def test_cheap_outputs_stream_and_costly_ones_do_not(name, streamed):
    kw = {"hidden": 1024} if name == "softmax" else {}
    traces = _traces(name, 0, **kw)
    assert any("stream_output(" in t for t in traces) == streamed, traces
    assert not any("stream_output(" in t for t in _traces(name, None, **kw)), "None never streams"


@pytest.mark.parametrize("hidden,chunk", [(16, None), (112, None), (128, 128), (4096, 128)])
def test_short_rows_are_not_streamed(hidden, chunk):
    """A row shorter than the streaming chunk would be streamed as one chunk of its own
    length, but float32 rows under STREAM_MIN_RUN_BYTES (128 elements) are not streamed at
    all (the staging costs more than it saves); results hold either way."""
    STREAM_MIN_RUN_BYTES = DEFAULTS.stream_min_run_bytes

    assert STREAM_MIN_RUN_BYTES == 512
    (trace,) = _traces("rmsnorm", 0, hidden=hidden)
    if chunk is None:
        assert "stream_output(" not in trace, trace
    else:
        assert f"stream_output(block='mul', chunk={chunk}, " in trace, trace
    ex = examples.rmsnorm(hidden=hidden)
    model = geode.compile(ex.graph, streaming="0")
    x = np.random.default_rng(0).standard_normal((5, hidden), dtype=np.float32)
    np.testing.assert_allclose(model(x=x)["y"], ex.numpy(x=x)["y"], rtol=1e-5)


def test_softmax_streams_its_scaled_row_and_prefetches_over_its_exp_chunks():
    """A streamed softmax keeps its exp row in a row buffer (an output read back cannot
    stream); unstreamed, the row is scaled in place in the output. Either way the costly
    exp pass is cut into chunks that each prefetch a share of the next row into the L2,
    and no row loop is pipelined."""
    (streamed,) = _traces("softmax", 0, hidden=4096)
    assert "reuse_output" not in streamed and "stream_output" in streamed
    (plain,) = _traces("softmax", None, hidden=4096)
    assert "reuse_output" in plain and "stream_output" not in plain
    for trace in (streamed, plain):
        assert f"split(loop='softmax_exp_rb', factors=[None, {PREFETCH_CHUNK}])" in trace
        # 4 rows ahead: 64 KiB of rows of 16 KiB (PREFETCH_AHEAD_BYTES)
        assert "spread='softmax_exp_rb_0', level=2, distance=4)" in trace
        assert "software_pipeline" not in trace


@pytest.mark.parametrize("hidden", [128, 512, 1000, 1024, 4096])
@pytest.mark.numba
def test_softmax_streams_only_rows_it_prefetches_over(hidden):
    """Streaming the scaled row needs the exp row in a row buffer; that pays only where
    the next row is prefetched over the exp pass's chunks (static rows of at least
    PREFETCH_MIN_ROW, a multiple of the chunk). Shorter or uneven rows are scaled in
    place in the output with ordinary stores, whatever the output's size."""
    PREFETCH_MIN_ROW = DEFAULTS.prefetch_min_row

    (trace,) = _traces("softmax", 0, hidden=hidden)
    prefetched = hidden >= PREFETCH_MIN_ROW and hidden % PREFETCH_CHUNK == 0
    assert ("stream_output(" in trace) == prefetched, trace
    assert ("reuse_output(" in trace) != prefetched, trace
    assert ("prefetch_next(" in trace) == prefetched, trace
    ex = examples.softmax(hidden=hidden)
    model = geode.compile(ex.graph, streaming="0", backend="numba")  # stream whatever the size
    x = np.random.default_rng(1).standard_normal((37, hidden), dtype=np.float32) * 4
    want = ex.numpy(x=x.astype(np.float64))["y"]
    np.testing.assert_allclose(model(x=x)["y"], want, rtol=2e-6, atol=1e-9)
    # e / sum: divided on the way (the sum may be subnormal, its reciprocal inf)
    assert any("_g_stream_divided(" in k.source for k in model.kernels) == prefetched


@pytest.mark.parametrize("hidden", [1000, 1030])  # shorter than PREFETCH_MIN_ROW; not 128k
def test_softmax_short_or_uneven_rows_are_not_cut(hidden):
    (trace,) = _traces("softmax", None, hidden=hidden)
    assert "split(" not in trace and "prefetch_next" not in trace


@pytest.mark.parametrize("name", ["rmsnorm", "layernorm"])
def test_streamed_row_kernels_prefetch_instead_of_pipelining(name):
    (streamed,) = _traces(name, 0, hidden=4096)
    (plain,) = _traces(name, None, hidden=4096)
    assert "stream_output(" in streamed and "prefetch_next(" in streamed
    assert "software_pipeline(" not in streamed
    # spread over the streamed pass's chunks, into the L2
    assert re.search(
        r"prefetch_next\(loop='\w+', buffer='x', at_start=False, spread='\w+_rb_0', level=2, "
        r"distance=4\)",
        streamed,
    )
    assert "software_pipeline(" in plain and "stream_output(" not in plain


@pytest.mark.parametrize(
    "shapes,prefetched,distance",
    [
        ([["N", 4096]], ["x0"], 4),  # 64 KiB ahead in rows of 16 KiB
        ([["N", 1040]], ["x0"], 8),  # rows the chunks do not divide; at most 8 rows ahead
        ([["N", 1024], [1024]], ["x0"], 8),  # a broadcast row has no next row
        ([["N", 1024], ["N", 1024]], ["x0", "x1"], 8),
        ([["N", 8192], ["N", 8192]], ["x0", "x1"], 1),  # 64 KiB in one row
        ([["N", 4, 1024]], ["x0"], 4),  # the rows of the fused outer loops
        ([["N", 512]], [], None),  # shorter than PREFETCH_MIN_ROW: the hardware keeps up
        ([["N"]], [], None),  # no rows (cut in parallel chunks, not streamed)
    ],
)
def test_streamed_elementwise_rows_prefetch_over_their_chunks(shapes, prefetched, distance):
    """A streamed elementwise row spreads the fetch of a row ahead (about 64 KiB of rows
    ahead) over its chunks into the L2; unstreamed, nothing is prefetched (measured
    neutral or worse)."""
    g = _graph(lambda *xs: sum(xs[1:], xs[0] * 2.0) + 1.0, shapes)
    gg, plan = prepare(g)
    (group,) = plan.groups
    lk = lower_group(group, gg, "k")
    streamed = str(schedule_group(lk, group, stream_min_bytes=0).trace)
    assert ("stream_output(" in streamed) == (len(shapes[0]) >= 2)
    got = re.findall(
        r"prefetch_next\(loop='\w+', buffer='(\w+)', at_start=False, spread='\w+_0', level=2, "
        r"distance=(\d+)\)",
        streamed,
    )
    assert got == [(b, str(distance)) for b in prefetched]
    assert streamed.count("prefetch_next(") == len(prefetched)
    assert "prefetch_next(" not in str(schedule_group(lk, group, stream_min_bytes=None).trace)


def test_static_outputs_below_the_threshold_are_not_streamed():
    g = _graph(lambda a: a * 2.0 + 1.0, [[64, 1024]])  # 256 KiB
    gg, plan = prepare(g)
    group = plan.groups[0]
    lk = lower_group(group, gg, "k")
    assert "stream_output" not in str(schedule_group(lk, group, stream_min_bytes=1 << 20).trace)
    assert "stream_output" in str(schedule_group(lk, group, stream_min_bytes=256 << 10).trace)


def test_element_cost_counts_what_varies_along_the_row():
    from geode.codegen.autoschedule import element_cost

    STREAM_MAX_OPS = DEFAULTS.stream_max_ops  # noqa: N806

    v = (A.Var("vi"), A.Var("vj"))
    ivs = [A.IterVar("vi", A.Var("N")), A.IterVar("vj", A.Const(8))]
    x = A.Load("X", v)
    row = A.Load("S", (A.Var("vi"),))
    cases = {
        "copy": (x, 0),
        "scaled by a row scalar": (
            A.Bin("*", x, A.Un("sqrt", A.Bin("/", row, A.Const(8.0, "float32")))),
            1,
        ),
        "divided element-wise": (A.Bin("/", x, A.Bin("+", x, A.Const(1.0, "float32"))), 5),
        "exp": (A.Un("exp", x), 16),
        "tanh GELU core": (A.Bin("*", x, A.Un("tanh", A.Bin("*", x, x))), 26),
        "erf GELU core": (A.Bin("*", x, A.Un("erf", x)), 30),
    }
    for what, (value, cost) in cases.items():
        b = A.Block("b", ivs, [A.Var("i"), A.Var("j")], [A.Store("Y", v, value)])
        assert element_cost(b) == cost, what
    assert 16 <= STREAM_MAX_OPS < 26


def _lowered_group(graph):
    gg, plan = prepare(graph)
    (group,) = [gr for gr in plan.groups if gr.pattern_name() != "column_reduce"]
    return lower_group(group, gg, "k"), group


def _exported_gelu() -> geode.Graph:
    """The erf GELU of a Linear layer's output as torch exports it: ``h = x + b``,
    ``h * (erf(h / sqrt(2)) + 1) * 0.5``."""
    g = geode.Graph("exported_gelu")
    x = g.input("x", ["N", 4096])
    h = x + g.constant(np.linspace(-0.5, 0.5, 4096, dtype=np.float32), name="b")
    g.output(h * (ops.erf(h / math.sqrt(2.0)) + 1.0) * 0.5, names=["y"])
    return g


def test_erf_cost_is_its_compiled_loop():
    """The price of erf in ``element_cost`` is the vector arithmetic of the float32 loop
    the LLVM backend compiles on an AVX-512 host (not its loads, stores, register
    copies and loop control; a division counts 4, as in the table), within 3; exp's
    price (16) is counted the same way."""
    from collections import Counter

    from geode.codegen.autoschedule import _OP_COST
    from geode.codegen.backends.llvm.target import host
    from geode.codegen.backends.llvm.vmath.harness import compile_loop

    if not host().has("avx512f"):
        pytest.skip("counted on AVX-512")
    for op in ("exp", "erf"):
        asm = compile_loop(op, "float32").asm.splitlines()
        body = _longest_vector_loop(asm)
        c = Counter(line.split()[0] for line in body)
        overhead = c["vmovups"] + c["vmovaps"] + c["addq"] + c["cmpq"] + c["jne"]
        count = len(body) - overhead + 3 * c["vdivps"]
        assert abs(count - _OP_COST[op]) <= 3, (op, count, c)


def _longest_vector_loop(asm: list[str]) -> list[str]:
    """The instructions of the longest loop (a block branching back to its own label)
    that uses zmm registers."""
    labels = {ln.strip()[:-1]: i for i, ln in enumerate(asm) if re.match(r"^\.LBB\S+:$", ln)}
    best: list[str] = []
    for i, ln in enumerate(asm):
        m = re.match(r"\s+j\w+\s+(\.LBB\S+)", ln)
        if not m or labels.get(m.group(1), i) >= i:
            continue
        body = [x.strip() for x in asm[labels[m.group(1)] + 1 : i + 1] if x.startswith("\t")]
        body = [x for x in body if not x.startswith(".")]
        if any("zmm" in x for x in body) and len(body) > len(best):
            best = body
    return best


@pytest.mark.parametrize(
    ("name", "ex", "streams_at", "interleaved"),
    [
        # one transcendental per element: streamed from the L2 size straight from the
        # registers (no stage: its store and load per element would show), interleaved
        ("tanh GELU", examples.gelu(4096, "tanh", with_bias=True), 1 << 20, True),
        ("erf GELU", examples.gelu(4096), 1 << 20, True),
        # as torch exports it (a bias Add, a Div by sqrt(2)): 37, inside the band too
        ("erf GELU, exported", None, 1 << 20, True),
        # cheap: streamed from the last-level cache size as before, now interleaved
        ("x * 2 + 1", None, 32 << 20, True),
        # SiLU (25) is under STREAM_MIN_OPS_HEAVY, the LSTM's h (50) over the band
        ("SiLU", examples.silu(4096), None, False),
        ("LSTM gates", examples.lstm_gates(1024), None, False),
        # row kernels stream as before and are never interleaved
        ("RMSNorm", examples.rmsnorm(4096), 32 << 20, False),
    ],
)
def test_streamed_elementwise_nests_are_interleaved(name, ex, streams_at, interleaved):
    """With the target's interleave factor, an elementwise nest streams a cheap output
    from the last-level cache size through staged chunks and a one-transcendental output
    from the L2 size from the registers, in chunks as long, and its streamed vector loops
    are interleaved; other blocks and patterns are unchanged, and without a factor
    nothing is interleaved and the costly blocks do not stream."""
    graph = ex.graph if ex is not None else _graph(lambda a: a * 2.0 + 1.0, [["N", 4096]])
    if name == "erf GELU, exported":
        graph = _exported_gelu()
    lk, group = _lowered_group(graph)
    kw = {"stream_min_bytes": 32 << 20, "heavy_stream_min_bytes": 1 << 20}
    trace = str(schedule_group(lk, group, interleave=4, **kw).trace)
    staged = re.findall(r"stream_output\(block='\w+', chunk=\d+, min_bytes=(\d+)\)", trace)
    # (the LSTM's h is stored from the registers too, by the split-row rule, at its
    # share of the last-level cache size)
    direct = re.findall(r"store_nontemporal\(block='\w+', min_bytes=(1048576)\)", trace)
    assert not (staged and direct), name
    assert bool(direct) == (streams_at == 1 << 20), name
    if direct:  # cut in chunks first, like the staged stream's
        assert re.search(r"split\(loop='\w+', factors=\[None, 128\]\)", trace), trace
    streams = staged + direct
    assert streams == ([] if streams_at is None else [str(streams_at)] * len(streams)), name
    assert bool(streams) == (streams_at is not None), name
    loops = re.findall(r"interleave\(loop='(\w+)', factor=4\)", trace)
    assert len(loops) == (len(streams) if interleaved else 0), name
    sch = schedule_group(lk, group, interleave=4, **kw)
    for lp in loops:
        f = sch.get_loop(lp)
        assert f.kind is A.ForKind.VECTORIZED and f.interleave == 4
        assert f"vectorized for ({lp}, 0, 128) interleave(4)" in A.format_kernel(sch.kernel)
    plain = str(schedule_group(lk, group, interleave=1, **kw).trace)
    assert "interleave(" not in plain
    if streams_at == 1 << 20:  # too costly to stream without interleaving
        assert "stream_output(" not in plain and "store_nontemporal(" not in plain


# ---------------------------------------------------------------------------------
# reductions over several axes and over middle axes
# ---------------------------------------------------------------------------------


def _compiled_kernel(model):
    (k,) = [k for k in model.kernels if k.engine == "aicore"]
    return k


def _spatial_reduction_cases():
    def instnorm(x):
        m = geode.ops.reduce_mean(x, axes=[2, 3], keepdims=1)
        d = x - m
        v = geode.ops.reduce_mean(d * d, axes=[2, 3], keepdims=1)
        return d / geode.ops.sqrt(v + 1e-5)

    def instnorm_ref(x):
        d = x - x.mean((2, 3), keepdims=True)
        return d / np.sqrt((d * d).mean((2, 3), keepdims=True) + np.float32(1e-5))

    return {
        "sum_hw": (
            lambda x: geode.ops.reduce_sum(x, axes=[2, 3], keepdims=1),
            lambda x: x.sum((2, 3), keepdims=True),
        ),
        "mean_chw": (
            lambda x: geode.ops.reduce_mean(x, axes=[1, 2, 3], keepdims=0),
            lambda x: x.mean((1, 2, 3)),
        ),
        "instnorm": (instnorm, instnorm_ref),
    }


@pytest.mark.parametrize("case", sorted(_spatial_reduction_cases()))
@pytest.mark.parametrize("w", [7, "W"])
@pytest.mark.numba
def test_reduction_over_trailing_axes_reads_a_merged_view(case, w):
    """A reduction over H and W (and C) of [N, C, H, W] runs one loop over their
    product; its input is viewed with those dims merged, so the loop reads ``x[.., rb]``
    instead of ``x[.., rb // W, rb % W]`` (a division and a modulo per element kept the
    loop scalar: 8x slower on [8, 256, 56, 56]). Results match numpy at N = 1 and 3."""
    build, ref = _spatial_reduction_cases()[case]
    g = _graph(build, [["N", 3, 5, w]])
    model = geode.compile(g, backend="numba")
    k = _compiled_kernel(model)
    assert "x0.shape[1] != " in k.source and "x0.shape[2]" not in k.source  # [N * C, H * W]
    for line in k.source.splitlines():
        if "x0[" in line:
            for idx in re.findall(r"x0\[([^\]]*)\]", line):
                assert "//" not in idx and "%" not in idx, line
    for n in (1, 3):
        x = rng.standard_normal((n, 3, 5, 7)).astype(np.float32)
        np.testing.assert_allclose(model(x0=x)["y0"], ref(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("shape", "axis"), [(["N", 10, 16], 1), (["N", 6, 5, 4], 1), (["N", 6, "S"], 1)]
)
def test_column_reduction_vectorizes_the_contiguous_axes(shape, axis):
    """Softmax over a middle axis: each reduction's loop order is outer spatial |
    reduce | inner spatial, the inner spatial axes (contiguous in the input) fused into
    one vectorized loop, so each reduce step adds a contiguous run into a row of
    accumulators (the reduce loop innermost strided through memory: softmax over axis
    1 of [32, 1000, 64] was 15x slower). Results match numpy at N = 1 and 3."""
    g = _graph(lambda x: geode.ops.softmax(x, axis=axis), [shape])
    gg, plan = prepare(g)
    groups = [gr for gr in plan.groups if gr.pattern_name() == "column_reduce"]
    assert groups
    for group in groups:
        sch = schedule_group(lower_group(group, gg, "k"), group)
        assert sch.level == "full", sch.notes
        updates = [
            n
            for n in sch.blocks()
            if sch.get_block(n).reduce_of is None
            and any(iv.kind == "reduce" for iv in sch.get_block(n).iter_vars)
        ]
        assert updates
        for name in updates:
            loops = [sch.get_loop(lp) for lp in sch.get_loops(name)]
            assert loops[-1].kind is A.ForKind.VECTORIZED
            reduce_loops = {
                v
                for iv, x in zip(sch.get_block(name).iter_vars, sch.get_block(name).bindings)
                if iv.kind == "reduce"
                for v in A.free_vars(x)
            }
            assert loops[-2].var in reduce_loops and loops[-1].var not in reduce_loops
    model = geode.compile(g)
    for n in (1, 3):
        dims = [n if d == "N" else 7 if isinstance(d, str) else d for d in shape]
        x = rng.standard_normal(dims).astype(np.float32)
        e = np.exp(x - x.max(axis, keepdims=True))
        np.testing.assert_allclose(
            model(x0=x)["y0"], e / e.sum(axis, keepdims=True), rtol=1e-4, atol=1e-6
        )


@pytest.mark.parametrize(("lead", "parallel"), [(1, False), ("N", True), (3, True)])
def test_column_reduction_of_one_batch_is_not_wrapped_in_a_parallel_loop(lead, parallel):
    """A column reduction whose outer spatial loop has one iteration leaves it serial
    (numba's parallel loop body did not vectorize the reduction: 2.8x slower); a batch of
    several or of unknown size still runs its outer loop in parallel. Results match numpy
    either way."""
    g = geode.Graph("colsum")
    x = g.input("x", [lead, "R", 256])
    g.output(geode.ops.reduce_sum(x, axes=[1], keepdims=0), names=["y"])
    gg, plan = prepare(g)
    (group,) = plan.groups
    assert group.pattern_name() == "column_reduce"
    sch = schedule_group(lower_group(group, gg, "k"), group)
    assert sch.level == "full", sch.notes
    top = [s for s in sch.kernel.body if isinstance(s, A.For)]
    assert any(f.kind is A.ForKind.PARALLEL for f in top) == parallel, str(sch.trace)
    model = geode.compile(g)
    for rows in (1, 37):
        xv = rng.standard_normal((1 if lead == "N" else lead, rows, 256)).astype(np.float32)
        want = xv.astype(np.float64).sum(axis=1)
        np.testing.assert_allclose(model(x=xv)["y"], want, rtol=1e-5, atol=1e-4)


def _t(perm, then=None):
    """A transpose by ``perm`` (then ``then``), as a graph builder and as numpy."""

    def build(x):
        y = geode.ops.transpose(x, perm=perm)
        return y if then is None else then(y)

    def ref(x):
        y = np.ascontiguousarray(np.transpose(x, perm))
        return y if then is None else then(y)

    return build, ref


def _relu_affine(y):
    """Exact in float32 with or without a fused multiply-add (``y * 2`` is exact)."""
    return (
        geode.ops.relu(y * 2.0 + 1.0)
        if isinstance(y, geode.Value)
        else np.maximum(y * np.float32(2.0) + np.float32(1.0), np.float32(0.0))
    )


#: transposes: (builder and numpy, input shape, sizes bound to its symbolic dims in turn)
TRANSPOSES = {
    "last_two_small": (_t([0, 2, 1]), ["N", 33, 70], [(1,), (2,)]),
    "last_two_big": (_t([0, 2, 1]), [2, 256, 512], [()]),
    "last_two_symbolic": (
        _t([0, 2, 1]),
        [2, "S", "T"],
        [(1, 1), (1, 70), (33, 70), (64, 96), (100, 37)],
    ),
    "nhwc_to_nchw": (_t([0, 3, 1, 2]), ["N", 14, 14, 64], [(1,), (3,)]),
    "nchw_to_nhwc": (_t([0, 2, 3, 1]), ["N", 64, 14, 14], [(1,), (3,)]),
    "then_elementwise": (_t([1, 0], _relu_affine), [300, "M"], [(1,), (45,), (130,)]),
    "two_d_uneven": (_t([1, 0]), [300, 130], [()]),
    "unit_dim": (_t([0, 2, 1]), ["N", 1, 4000], [(1,), (5,)]),
}


def _vector_nest(sch):
    """(block, innermost loop, second innermost loop) of the first vectorized nest."""
    for name in sch.blocks():
        loops = [sch.get_loop(lp) for lp in sch.get_loops(name)]
        if len(loops) >= 2 and loops[-1].kind is A.ForKind.VECTORIZED:
            return name, loops[-1], loops[-2]
    raise AssertionError(str(sch))


@pytest.mark.parametrize("case", sorted(TRANSPOSES))
def test_transposes_are_tiled_and_exact(case):
    """A transposing elementwise nest is cut into tiles: the input's contiguous axis and
    the output's innermost axis each run a tile loop of constant extent innermost (the
    input read along the second innermost loop with unit stride, the output written
    along the innermost one), a tile of both arrays fits the L1, and the other loops run
    fused in one parallel loop. Results equal numpy exactly at every size."""
    (build, ref), shape, sizes = TRANSPOSES[case]
    g = _graph(build, [shape])
    gg, plan = prepare(g)
    (group,) = plan.groups
    lk = lower_group(group, gg, "k")
    sch = schedule_group(lk, group)
    assert sch.level == "full", sch.notes
    steps = [s.primitive for s in sch.trace]
    assert "split" in steps and "reorder" in steps, str(sch.trace)
    name, inner, tile = _vector_nest(sch)
    x = sch.kernel.inputs[0].name
    assert isinstance(inner.extent, A.Const) and isinstance(tile.extent, A.Const)
    assert inner.extent.value * tile.extent.value * 4 * 2 <= 32 * 1024
    assert dict(sch.load_strides(name, tile.var))[x][-1] == 1  # the input, contiguously
    assert dict(sch.load_strides(name, inner.var))[x][-1] == 0
    top = [s for s in sch.kernel.body if isinstance(s, A.For)]
    assert len(top) == 1 and top[0].kind is A.ForKind.PARALLEL
    again = sch.trace.replay(lk.kernel)
    assert A.format_kernel(again.kernel) == A.format_kernel(sch.kernel)
    model = geode.compile(g)
    for bound in sizes:
        it = iter(bound)
        xv = rng.standard_normal([next(it) if isinstance(d, str) else d for d in shape])
        xv = xv.astype(np.float32)
        np.testing.assert_array_equal(model(x0=xv)["y0"], ref(xv))


@pytest.mark.parametrize(
    ("build", "shapes"),
    [
        (lambda a: a * 2.0 + 1.0, [["N", 512, 512]]),
        (lambda a, b: a + b, [[512, 512], [512, 1]]),  # a column broadcast, no transpose
        (lambda a: geode.ops.transpose(a, perm=[1, 0]), [[64, 64]]),  # in the L1 already
    ],
)
def test_non_transposing_nests_are_not_tiled(build, shapes):
    g = _graph(build, shapes)
    gg, plan = prepare(g)
    for group in plan.groups:
        sch = schedule_group(lower_group(group, gg, "k"), group)
        assert "reorder" not in str(sch.trace) and "split" not in str(sch.trace)


def _two_outputs(hidden, build, lead=("N",)):
    """A graph with two outputs of the same nest: ``y1 = f(x)`` and ``y2 = g(y1, x)``."""
    g = geode.Graph("two_outputs")
    x = g.input("x", [*lead, hidden])
    y1, y2 = build(x)
    g.output(y1, y2, names=["y1", "y2"])
    return g


def _long_chain(x):  # y2 reaches its store through sigmoid(tanh(...)): two in series
    y1 = ops.tanh(x) * 2.0 + ops.sigmoid(x)
    return y1, ops.sigmoid(y1) * x


def _short_chain(x):  # one math function in series
    y1 = ops.tanh(x) + 1.0
    return y1, y1 * x


@pytest.mark.parametrize(
    "hidden,build,lead,split",
    [
        (1024, _long_chain, ("N",), True),
        (64, _long_chain, ("B", "S"), True),  # the row loop is the middle loop
        (1024, _short_chain, ("N",), False),
        (8192, _long_chain, ("N",), False),  # a 32 KiB row would not stay in the L1
        ("H", _long_chain, ("N",), False),  # a symbolic row: its size is unknown
    ],
)
def test_long_math_chains_split_at_the_stored_producer(hidden, build, lead, split):
    graph = _two_outputs(hidden, build, lead)
    g, plan = prepare(graph)
    (group,) = plan.groups
    sch = schedule_group(lower_group(group, g, "k"), group)
    assert sch.level == "full", sch.notes
    text = A.format_kernel(sch.kernel)
    top = [s for s in sch.kernel.body if isinstance(s, A.For)]
    assert len(top) == 1 and top[0].kind is A.ForKind.PARALLEL
    # split: the producer's loop and its consumer's loop, one after the other in each row,
    # both vectorized; not split: one loop computes both outputs
    assert text.count("vectorized for") == (2 if split else 1), text
    trace = str(sch.trace)
    if split and hidden == 1024:
        # the first pass (the costliest) is cut in chunks of ELEMENTWISE_PREFETCH_CHUNK,
        # over which the next row of x is prefetched into the L2
        (row,) = top
        first = next(s for s in row.body if isinstance(s, A.For))
        assert first.kind is A.ForKind.SERIAL and first.extent == A.Const(1024 // chunk)
        assert f"factors=[None, {chunk}]" in trace
        assert re.search(
            rf"prefetch_next\(loop='{row.var}', buffer='x', .*spread='{first.var}', level=2, "
            r"distance=\d+\)",
            trace,
        )
    else:  # rows under PREFETCH_MIN_ROW, or one pass: the hardware prefetcher streams them
        assert "prefetch" not in trace and "factors" not in trace, trace
    dims = [3 if isinstance(d, str) else d for d in [*lead, hidden]]
    if lead == ("B", "S"):
        dims = [2, 5, hidden]
    x = rng.standard_normal(dims).astype(np.float32) * 3
    check_groups(graph, {"x": x}, lambda lk, gr: schedule_group(lk, gr).kernel)


@pytest.mark.numba
def test_lstm_gates_split_into_two_passes_per_row_and_compile_exactly():
    lk, group = _kernel("lstm_gates")
    sch = schedule_group(lk, group)
    # c' = sigmoid(f) * c + sigmoid(i) * tanh(g) in its own loop, then
    # h' = sigmoid(o) * tanh(c') re-reading c' from the row just written
    steps = [s for s in sch.trace.steps if s.primitive == "compute_at"]
    (row,) = [s for s in sch.kernel.body if isinstance(s, A.For)]
    assert [s.args["loop"] for s in steps] == [row.var]
    assert "prefetch" not in str(sch.trace)  # rows of 128: the hardware prefetcher's
    # rows of 1024: the first pass (three math functions) runs in chunks, over which the
    # next row of both inputs is prefetched into the L2
    g, plan = prepare(examples.lstm_gates(hidden=1024).graph)
    sch = schedule_group(lower_group(plan.groups[0], g, "k"), plan.groups[0])
    (row,) = [s for s in sch.kernel.body if isinstance(s, A.For)]
    pf = [s.args for s in sch.trace.steps if s.primitive == "prefetch_next"]
    first = next(s for s in row.body if isinstance(s, A.For))
    assert sorted(a["buffer"] for a in pf) == ["c", "gates"]
    assert all(a["spread"] == first.var and a["level"] == 2 for a in pf)
    # rows of 16 KiB of gates and 4 KiB of c: 4 rows make up PREFETCH_AHEAD_BYTES
    assert all(a["distance"] == 4 for a in pf)
    for hidden, rows in ((256, 37), (1024, 9)):
        ex = examples.lstm_gates(hidden=hidden)
        model = geode.compile(ex.graph, backend="numba")
        source = model.kernels[0].source
        assert ("_g_prefetch_l2(gates" in source) == (hidden == 1024), source
        feeds = ex.make_inputs(rng, rows)
        feeds["gates"] *= 4
        got = model(**feeds)
        want = ex.numpy(**{k: v.astype(np.float64) for k, v in feeds.items()})
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("hidden,spread", [(128, True), (80, False), (16, False)])
@pytest.mark.numba
def test_lstm_gates_stream_c_by_rows_over_the_h_pass(hidden, spread):
    """c' (read back by the h pass) goes through a row buffer streamed to the output: over
    the h pass cut in chunks of ROW_STREAM_CHUNK where its row is a larger multiple of
    it, else after c's pass; h, which no pass reads, is stored non-temporally straight
    from the registers of its vector loop (``store_nontemporal``). Streamed and plain
    stores give the numpy reference's values, rows of odd counts included."""
    ROW_STREAM_CHUNK = DEFAULTS.row_stream_chunk

    (trace,) = _traces("lstm_gates", 0, hidden=hidden)
    assert "stream_row(block='add'" in trace and "stream_output(" not in trace, trace
    assert (f"factors=[None, {ROW_STREAM_CHUNK}]" in trace) == spread, trace
    assert ("spread=None" in trace) != spread, trace
    inner = "mul_12_i1_1" if spread else "mul_12_i1"
    assert f"store_nontemporal(block='mul_12', min_bytes=0) -> '{inner}'" in trace, trace
    assert not any(
        "stream_row(" in t or "store_nontemporal(" in t
        for t in _traces("lstm_gates", None, hidden=hidden)
    )
    ex = examples.lstm_gates(hidden=hidden)
    rng = np.random.default_rng(4)
    for streaming in ("0", "auto"):
        model = geode.compile(ex.graph, streaming=streaming, backend="numba")
        source = model.kernels[0].source
        assert "c_out_row" in source  # N is symbolic: tested at run time
        assert "_g_ntstore(h_out, " in source and "_g_vector_start(h_out, 0)" in source
        for rows in (1, 7, 33):
            feeds = ex.make_inputs(rng, rows)
            got = model(**feeds)
            want = ex.numpy(**{k: v.astype(np.float64) for k, v in feeds.items()})
            for name in want:
                np.testing.assert_allclose(got[name], want[name], rtol=2e-6, atol=1e-6)


def test_row_streaming_threshold_counts_every_array_of_the_kernel():
    """The L3 test is on the kernel's whole footprint: with all arrays sharing the row
    dim, the output's share of the threshold (LSTM gates: c' is 1 of 7 rows' worth)."""
    (trace,) = _traces("lstm_gates", 7 * 4096, hidden=1024)
    assert "stream_row(block='add', loop=" in trace and "min_bytes=4096," in trace, trace
    assert "store_nontemporal(block='mul_12', min_bytes=4096)" in trace, trace


@pytest.mark.parametrize(
    "shapes,dtype,rows",
    [
        ([["N", 4096]], "float32", 4),  # 16 KiB rows: 64 KiB is 4 of them
        ([["N", 4096], ["N", 1024]], "float32", 4),  # the LSTM gates: 20 KiB, rounded up
        ([["N", "M"]], "float32", 8),  # symbolic: PREFETCH_MIN_ROW elements, capped at 8
        ([["N", 8192]], "float64", 1),  # one row is already 64 KiB
        ([["N", 3, 1024]], "float16", 11),  # 6 KiB rows of the fused outer loops
        ([], "float32", 1),  # nothing prefetched
    ],
)
def test_prefetch_distance_makes_up_the_bytes_ahead(shapes, dtype, rows):
    from geode.codegen.autoschedule import choices, prefetch_distance

    bufs = [
        A.Buffer(f"x{i}", dtype, tuple(A.Var(d) if isinstance(d, str) else A.Const(d) for d in s))
        for i, s in enumerate(shapes)
    ]
    assert prefetch_distance(bufs) == min(rows, choices().prefetch_max_rows)


def test_only_long_or_symbolic_rows_are_prefetched():
    from geode.codegen.autoschedule import long_rows

    def b(*shape):
        return A.Buffer(
            "x", "float32", tuple(A.Var(d) if isinstance(d, str) else A.Const(d) for d in shape)
        )

    assert long_rows(b("N", 1024)) and long_rows(b("N", "M")) and long_rows(b("N", 2, 512))
    assert not long_rows(b("N", 512)) and not long_rows(b("N", 0)) and not long_rows(b("N"))


# -- the tuning choices ----------------------------------------------------------------------------
def test_override_choices_applies_inside_the_block_only():
    import threading

    from geode.codegen.autoschedule import choices, override_choices

    assert choices() == DEFAULTS
    with override_choices(prefetch_min_row=2) as c:
        assert c.prefetch_min_row == 2 and choices() is c
        with override_choices(stream_chunk=8):
            assert (choices().prefetch_min_row, choices().stream_chunk) == (2, 8)
        seen = []
        t = threading.Thread(target=lambda: seen.append(choices()))
        t.start()
        t.join()
        assert seen == [DEFAULTS]  # another thread keeps the defaults
        assert choices().stream_chunk == DEFAULTS.stream_chunk
    assert choices() == DEFAULTS


def test_override_choices_refuses_unknown_names():
    from geode.codegen.autoschedule import override_choices
    from geode.config import OptionError

    with (
        pytest.raises(OptionError, match=r"unknown choices \['no_such'\]"),
        override_choices(no_such=1),
    ):
        pass


def test_schedule_group_takes_its_choices():
    """Softmax rows of 1024 are pipelined only when the host-cost limit is lifted."""
    g, plan = prepare(examples.softmax(hidden=1024).graph)
    (group,) = plan.groups
    lk = lower_group(group, g, "softmax")
    plain = [s.primitive for s in schedule_group(lk, group).trace]
    lifted = Choices(pipeline_max_host_ops=1000)
    piped = [s.primitive for s in schedule_group(lk, group, tuning=lifted).trace]
    assert "software_pipeline" not in plain and "software_pipeline" in piped


# ---------------------------------------------------------------------------------
# full reductions to a scalar: two steps, the runs in parallel
# ---------------------------------------------------------------------------------

FULL_REDUCTIONS = {
    "sum": lambda x: ops.reduce_sum(x, keepdims=0),
    "mean_keepdims": lambda x: ops.reduce_mean(x, keepdims=1),
    "max_of_squares": lambda x: ops.reduce_max(x * x, keepdims=0),
    "sum_and_min": lambda x: (ops.reduce_sum(x, keepdims=0), ops.reduce_min(x, keepdims=0)),
}


@pytest.mark.parametrize("name", sorted(FULL_REDUCTIONS))
# 129 rows interpret for 6-12 s per case: `-m slow` (70 rows are not a multiple of the runs either)
@pytest.mark.parametrize("rows", [1, 3, 70, pytest.param(129, marks=pytest.mark.slow)])
def test_full_reduction_runs_in_parallel_runs(name, rows):
    """A reduction of [N, 1024] to a scalar is cut into contiguous runs reduced on every
    thread (an rfactor with outer partials, its loop parallel), then their partials;
    the interpreted kernel matches the reference for N not a multiple of the runs."""
    graph = _graph(FULL_REDUCTIONS[name], [["N", 1024]])
    runs = DEFAULTS.rfactor_partials

    def check(lk, group):
        sch = schedule_group(lk, group)
        assert sch.level == "full", sch.notes
        prims = [s.primitive for s in sch.trace]
        steps = [s for s in sch.trace if s.primitive == "rfactor"]
        assert steps and all(s.args["partials"] == "outer" for s in steps), prims
        assert all(s.args["factor"] == runs for s in steps)
        for s in steps:
            p = s.result[0]
            assert sch.get_loop(p).kind is A.ForKind.PARALLEL
        return sch.kernel

    x = rng.standard_normal((rows, 1024)).astype(np.float32)
    assert check_groups(graph, {"x0": x}, check) == 1


def test_full_reduction_of_a_short_outer_axis_cuts_the_longest():
    """[4, 100000]: the rows are too few to share out, so the runs cut the row axis."""
    graph = _graph(lambda x: ops.reduce_sum(x, keepdims=0), [[4, 100000]])
    g, plan = prepare(graph)
    (group,) = plan.groups
    sch = schedule_group(lower_group(group, g, "k"), group)
    (step,) = [s for s in sch.trace if s.primitive == "rfactor"]
    assert step.args["factor"] == DEFAULTS.rfactor_partials
    assert sch.get_loop(step.args["loop"] + "_1").extent == A.Const(-(-100000 // 64))
    top = sch.kernel.body[2]  # the rf nest: the runs' loop moved outermost, in parallel
    assert isinstance(top, A.For) and top.kind is A.ForKind.PARALLEL
    assert top.var == step.result[0]
    # its own data, positive (no cancellation: float32 sums of 400,000 terms in another
    # order stay within the tolerance), whichever tests ran before
    x = np.random.default_rng(7).random((4, 100000), dtype=np.float32)
    check_groups(graph, {"x0": x}, lambda lk, grp: schedule_group(lk, grp).kernel)


def test_small_full_reductions_and_the_off_switch_stay_serial():
    small = _graph(lambda x: ops.reduce_sum(x, keepdims=0), [[8, 64]])
    big = _graph(lambda x: ops.reduce_sum(x, keepdims=0), [["N", 1024]])
    for graph, choices in ((small, None), (big, Choices(rfactor_partials=1))):
        g, plan = prepare(graph)
        (group,) = plan.groups
        sch = schedule_group(lower_group(group, g, "k"), group, tuning=choices)
        assert "rfactor" not in str(sch.trace)
    # not every output a scalar: a row reduction keeps its row schedule
    rows = _graph(lambda x: ops.reduce_sum(x, axes=[1], keepdims=0), [["N", 1024]])
    g, plan = prepare(rows)
    sch = schedule_group(lower_group(plan.groups[0], g, "k"), plan.groups[0])
    assert "rfactor" not in str(sch.trace)


@pytest.mark.parametrize("rows", [5, 1000])
def test_full_reductions_compiled_match_numpy_nan_included(rows):
    """Compiled (LLVM): sums within the reassociation tolerance, max and min exact, a NaN
    anywhere reaches the max."""
    g = _graph(
        lambda x: (ops.reduce_sum(x, keepdims=0), ops.reduce_max(x, keepdims=0)),
        [["N", 1024]],
    )
    model = geode.compile(g, model_cache=False)
    assert "rfactor" in next(k.trace for k in model.kernels if k.engine == "aicore")
    x = rng.standard_normal((rows, 1024)).astype(np.float32)
    out = model(x0=x)
    np.testing.assert_allclose(out["y0"], x.sum(dtype=np.float64), rtol=1e-4, atol=1e-2)
    assert out["y1"] == x.max()
    x[rows - 1, 1000] = np.nan
    out = model(x0=x)
    assert np.isnan(out["y0"]) and np.isnan(out["y1"])


@pytest.mark.parametrize("rows", [2, 3])
def test_reductions_of_a_few_rows_in_two_steps_when_asked(rows):
    """``rfactor_max_outputs``: a sum over the rows of [R, 100000] (R outputs) is cut
    in runs too, each run covering every row, the runs' loop outermost and parallel."""
    graph = _graph(lambda x: ops.reduce_sum(x, axes=[1], keepdims=0), [[rows, 100000]])
    g, plan = prepare(graph)
    (group,) = plan.groups
    lk = lower_group(group, g, "k")
    assert "rfactor" not in str(schedule_group(lk, group).trace)  # not by default (one: yes)

    def two_steps(lk, group):
        sch = schedule_group(lk, group, tuning=Choices(rfactor_max_outputs=4))
        (step,) = [s for s in sch.trace if s.primitive == "rfactor"]
        top = [s for s in sch.kernel.body if isinstance(s, A.For)]
        assert any(f.var == step.result[0] and f.kind is A.ForKind.PARALLEL for f in top)
        return sch.kernel

    x = rng.integers(-3, 4, (rows, 100000)).astype(np.float32)  # sums exact in any order
    check_groups(graph, {"x0": x}, two_steps)
