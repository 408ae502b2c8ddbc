"""The schedule space: knobs around the default schedule, and every setting's schedule
reproducible from its trace alone."""

from __future__ import annotations

import numpy as np
import pytest
from lowering_check import check_groups, prepare
from test_lower import _graph

from geode import examples, ops
from geode.codegen import ast as A
from geode.codegen.driver import default_schedule
from geode.codegen.kernel_key import canonical_lowered
from geode.codegen.lower import lower_group
from geode.codegen.schedule import Trace
from geode.codegen.schedule.trace_json import replay_checked
from geode.codegen.tuning import space
from geode.codegen.tuning.measure import KernelBench
from geode.config import Options
from geode.errors import ScheduleError

OPTS = Options()


def _lowered(graph):
    g, plan = prepare(graph)
    (group,) = plan.groups
    return canonical_lowered(lower_group(group, g, "k")), group


def test_settings_name_only_what_differs_from_the_default() -> None:
    assert space.normalize({"rfactor_partials": 64, "unroll": False}) == {}
    assert space.normalize({"unroll": True, "interleave": 2}) == {"interleave": 2, "unroll": True}
    near = list(space.neighbours({}))
    assert len(near) == sum(len(k.values) - 1 for k in space.KNOBS)
    assert all(len(s) == 1 for s in near)
    from_two = list(space.neighbours({"interleave": 2}))
    assert {} in from_two and {"interleave": 4} in from_two
    assert space.knob("streaming").default == "auto"
    with pytest.raises(KeyError):
        space.knob("nope")
    only = list(space.neighbours({}, ["interleave", "unroll"]))
    assert only == [{"interleave": 2}, {"interleave": 4}, {"unroll": True}]
    with pytest.raises(KeyError, match=r"unknown knobs \['tile'\]"):
        space.select(["tile", "unroll"])


def test_the_empty_setting_is_the_default_schedule() -> None:
    lk, group = _lowered(examples.softmax(hidden=512).graph)
    a = space.build(lk, group, OPTS, {})
    b = default_schedule(lk, group, OPTS)
    assert A.format_kernel(a.kernel) == A.format_kernel(b.kernel)


def test_knobs_reach_the_schedule() -> None:
    full = _graph(lambda x: ops.reduce_sum(x, keepdims=0), [["N", 1024]])
    lk, group = _lowered(full)
    steps = {s.primitive: s for s in space.build(lk, group, OPTS, {"rfactor_partials": 16}).trace}
    assert steps["rfactor"].args["factor"] == 16
    assert "rfactor" not in str(space.build(lk, group, OPTS, {"rfactor_partials": 1}).trace)
    serial = space.build(lk, group, OPTS, {"parallel": 0})
    assert "parallel" not in str(serial.trace)
    lk, group = _lowered(examples.softmax(hidden=1024).graph)
    always = str(space.build(lk, group, OPTS, {"streaming": "always"}).trace)
    assert "stream" in always
    assert "stream" not in str(space.build(lk, group, OPTS, {"streaming": "off"}).trace)
    sch = space.build(lk, group, OPTS, {"interleave": 2})
    vec = [s for s in A.walk_stmts(sch.kernel.body) if isinstance(s, A.For)]
    vec = [f for f in vec if f.kind is A.ForKind.VECTORIZED]
    assert vec and all(f.interleave == 2 for f in vec)


def test_unroll_needs_a_short_loop() -> None:
    lk, group = _lowered(examples.rmsnorm().graph)
    with pytest.raises(ScheduleError, match="no short innermost serial loop"):
        space.build(lk, group, OPTS, {"unroll": True})
    lk, group = _lowered(_graph(lambda x: ops.reduce_sum(x, axes=[0], keepdims=0), [[8, 5, 3]]))
    sch = space.build(lk, group, OPTS, {"unroll": True})
    assert "unroll" in str(sch.trace) and "unrolled for" in A.format_kernel(sch.kernel)


@pytest.mark.parametrize("name", ["softmax", "layernorm", "gelu"])
def test_every_neighbour_of_the_default_replays_from_json_and_is_correct(name) -> None:
    ex = examples.ALL[name]()
    lk, group = _lowered(ex.graph)
    settings = [{}, *space.neighbours({})]
    texts = set()
    for s in settings:
        try:
            sch = space.build(lk, group, OPTS, s)
        except ScheduleError:
            continue
        back = replay_checked(Trace.from_json(sch.trace.to_json()), lk.kernel)
        assert A.format_kernel(back.kernel) == A.format_kernel(sch.kernel), s
        texts.add(A.format_kernel(sch.kernel))
    assert len(texts) > 3  # the knobs make different kernels
    feeds = ex.make_inputs(np.random.default_rng(0), 5)
    for s in ({"streaming": "always", "interleave": 4}, {"pipeline_max_host_ops": 0}):
        check_groups(ex.graph, feeds, lambda lk_, grp, s=s: space.build(lk_, grp, OPTS, s).kernel)


def test_the_live_knobs_and_the_whole_space() -> None:
    full = _graph(lambda x: ops.reduce_sum(x, keepdims=0), [["N", 1024]])
    lk, group = _lowered(full)
    live = {k.name for k in space.live_knobs(lk, group, OPTS)}
    assert "rfactor_partials" in live and "transpose_tile_bytes" not in live
    whole = space.enumerate_space(lk, group, OPTS, 10**6)
    texts = [A.format_kernel(sch.kernel) for _, sch in whole]
    assert whole[0][0] == {} and len(set(texts)) == len(texts)  # the default first, distinct
    assert space.enumerate_space(lk, group, OPTS, 2) is None  # too large


COLUMN_SETTINGS = [
    {"column_partials": 8},
    {"column_tile": 64},
    {"column_partials": 2, "column_tile": 128, "interleave": 2},
    {"column_partials": 4, "column_tile": 32, "interleave": 4},
    {"column_tile": 512, "parallel": 0},
]


def test_a_column_reduction_has_a_real_space_and_every_schedule_is_correct() -> None:
    """The sum over axis 0 of ``[N, 1024]``: row runs (rfactor, in parallel) and column
    tiles (outermost, in parallel) make a space of dozens of kernels; each replays from
    JSON and gives numpy's sums, interpreted and compiled (row counts below, at and
    above the runs: 5, 8, 37)."""
    graph = _graph(lambda x: ops.reduce_sum(x, axes=[0], keepdims=0), [["N", 1024]])
    lk, group = _lowered(graph)
    live = {k.name for k in space.live_knobs(lk, group, OPTS)}
    assert {"column_partials", "column_tile", "parallel", "interleave"} <= live
    whole = space.enumerate_space(lk, group, OPTS, 10**4)
    assert whole is not None and 50 <= len(whole) <= 150
    rng = np.random.default_rng(2)
    for s in COLUMN_SETTINGS:
        sch = space.build(lk, group, OPTS, s)
        text = A.format_kernel(sch.kernel)
        if s.get("column_partials"):
            assert "rfactor" in str(sch.trace) and "parallel for (l2_0" in text, text
        elif s.get("parallel", 1):
            assert "parallel for (l1_0" in text, text
        back = replay_checked(Trace.from_json(sch.trace.to_json()), lk.kernel)
        assert A.format_kernel(back.kernel) == text
        x = rng.standard_normal((7, 1024)).astype(np.float32)  # the loop nest, interpreted
        check_groups(graph, {"x0": x}, lambda lk_, grp, s=s: space.build(lk_, grp, OPTS, s).kernel)
        for rows in (5, 8, 37):  # compiled
            x = rng.standard_normal((rows, 1024)).astype(np.float32)
            bench = KernelBench("k", lk, [x], {"N": rows}, OPTS)
            (got,) = bench.runner(sch)()
            np.testing.assert_allclose(got, x.sum(axis=0), rtol=1e-5, atol=1e-5)
