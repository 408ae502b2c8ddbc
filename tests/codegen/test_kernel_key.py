"""The kernel key: a lowered kernel's structure, whatever the model named its tensors,
nodes and symbols; and the canonical form given and tuned schedules are recorded on."""

from __future__ import annotations

import numpy as np
import pytest
from lowering_check import prepare

import geode
from geode import examples, ops
from geode.codegen import ast as A
from geode.codegen.autoschedule import schedule_group
from geode.codegen.kernel_key import canonical_kernel, canonical_lowered, kernel_key
from geode.codegen.lower import lower_group


def _lowered(build, x="x", dim="N", cols=1024, dtype=np.float32, name="g"):
    g = geode.Graph(name)
    v = g.input(x, [dim, cols], dtype)
    g.output(build(v), names=[f"out_{x}"])
    gg, plan = prepare(g)
    (group,) = plan.groups
    return lower_group(group, gg, f"kernel_{x}"), group


def softmax(v):
    return ops.softmax(v, axis=-1)


def test_names_do_not_change_the_key() -> None:
    a, _ = _lowered(softmax)
    b, _ = _lowered(softmax, x="inputs", dim="batch", name="other")
    assert A.format_kernel(a.kernel) != A.format_kernel(b.kernel)
    assert kernel_key(a.kernel) == kernel_key(b.kernel)
    assert len(kernel_key(a.kernel)) == 32 and kernel_key(a.kernel) == kernel_key(a.kernel)


@pytest.mark.parametrize(
    "change",
    [
        {"cols": 512},
        {"dtype": np.float64},
        {"dim": 64},  # a static dim instead of a symbol
        {"build": lambda v: ops.softmax(v * 2.0, axis=-1)},
        {"build": lambda v: ops.log_softmax(v, axis=-1)},
    ],
)
def test_structure_dtypes_and_shapes_change_the_key(change) -> None:
    base, _ = _lowered(softmax)
    kw = {"build": softmax, **change}
    other, _ = _lowered(**kw)
    assert kernel_key(other.kernel) != kernel_key(base.kernel)


def test_canonical_form_names_in_order_of_appearance() -> None:
    lk, _ = _lowered(lambda v: ops.reduce_sum(v * v, axes=[1], keepdims=1))
    text = A.format_kernel(canonical_kernel(lk.kernel))
    assert text.startswith("kernel kernel(in0: float32[d0, 1024], out0: float32[d0, 1]; dims d0)")
    for name in ("ScheduleBlock(b0)", "serial for (l0, 0, d0)", "v0"):
        assert name in text
    # nothing of the model's names is left
    for name in ("x", "N", "reducesum", "mul"):
        assert f"{name}[" not in text and f"({name}" not in text


@pytest.mark.parametrize("name", sorted(examples.ALL))
def test_default_schedules_work_on_the_canonical_form(name) -> None:
    """The default schedule of the canonical form is the same schedule, names aside:
    the same primitives in the same order, and the same kernel once both are made
    canonical again."""
    g, plan = prepare(examples.ALL[name]().graph)
    for group in plan.groups:
        lk = lower_group(group, g, "k")
        clk = canonical_lowered(lk)
        assert list(clk.dim_exprs.values()) == list(lk.dim_exprs.values())
        assert clk.kernel.dims == list(clk.dim_exprs)
        a, b = schedule_group(lk, group), schedule_group(clk, group)
        assert b.level == a.level == "full", b.notes
        assert [s.primitive for s in a.trace] == [s.primitive for s in b.trace]
        assert A.format_kernel(canonical_kernel(a.kernel)) == A.format_kernel(
            canonical_kernel(b.kernel)
        )
