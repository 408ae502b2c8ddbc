"""Default schedules: scheduled kernels (interpreted) match the reference, the intended
pattern schedule is applied without fallback, and traces replay to the same AST."""

import numpy as np
import pytest
from lowering_check import check_groups, prepare
from test_lower import CASES, _graph

from geode import examples
from geode.codegen import ast as A
from geode.codegen.autoschedule import schedule_group
from geode.codegen.lower import lower_group

rng = np.random.default_rng(5)


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
    # mean | centre + variance (fused passes) | normalise: three walks over each row
    assert text.count("vectorized for") == 3
    assert "fuse_siblings" in str(sch.trace)
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
