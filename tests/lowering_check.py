"""Shared check for lowering and scheduling: every fused group's kernel, interpreted by
ast_eval, must reproduce the reference interpreter's values for that group."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from opcheck import assert_close

from geode.codegen import ast as A
from geode.codegen.ast_eval import eval_shape, run_kernel
from geode.codegen.lower import LoweredKernel, lower_group, make_can_lower
from geode.compiler.fusion.planner import always_profitable, plan_fusion
from geode.compiler.interpret import bind_inputs, run_reference
from geode.compiler.partition.placement import place
from geode.compiler.pipeline import run_pipeline
from geode.compiler.shapes import evaluate_dim


def prepare(graph):
    """Copy, infer, run the pass pipeline and plan fusion (every legal merge taken)."""
    g = graph.copy()
    g.infer_shapes()
    run_pipeline(g)
    g.sort()
    plan = plan_fusion(g, place(g), make_can_lower(g), always_profitable)
    return g, plan


def check_groups(
    graph,
    feeds: dict[str, np.ndarray],
    transform: Callable[[LoweredKernel, object], A.Kernel] | None = None,
) -> int:
    """Lower (and optionally transform) each group; compare with the reference; returns #groups."""
    g, plan = prepare(graph)
    ref = run_reference(g, feeds, keep_all=True)
    env = bind_inputs(g, feeds)
    for group in plan.groups:
        lk = lower_group(group, g, f"k{group.id}")
        kernel = lk.kernel if transform is None else transform(lk, group)
        arrays = {}
        dims = {name: evaluate_dim(d, env) for name, d in lk.dim_exprs.items()}
        for buf, v in zip(kernel.inputs, lk.inputs):
            a = v.data if v.is_constant else (feeds[v.name] if v.name in feeds else ref[v.name])
            # a scheduled kernel may view an argument with dims merged (merge_dims)
            arrays[buf.name] = np.asarray(a).reshape(eval_shape(buf.shape, dims))
        got = run_kernel(kernel, arrays, dims)
        for buf, v in zip(kernel.outputs, lk.outputs):
            assert_close(
                got[buf.name].reshape(np.shape(ref[v.name])),
                ref[v.name],
                f"group {group.id} output {v.name}\n{A.format_kernel(kernel)}",
            )
    return len(plan.groups)
