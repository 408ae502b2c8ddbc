"""Which native MatMuls take the group that consumes their product as a fused epilogue.

For every MatMul the BLAS runs natively (:func:`geode.codegen.driver.native_matmul`) whose
product one fusion group reads: legality (:func:`geode.compiler.fusion.epilogue.
epilogue_legality`), then profit (:func:`geode.compiler.fusion.profit.epilogue_profit`),
then the panel form (:func:`geode.codegen.dense.panel_graph`). A taken epilogue turns the
group's job into a dense job and removes the MatMul from the work list (the job runs where
the group ran: after everything either reads). Every decision, taken or not, is recorded
with its reason in the fusion plan (``explain()`` shows it).
"""

from __future__ import annotations

from geode.codegen.dense import panel_graph
from geode.codegen.driver import KernelJob, native_matmul
from geode.compiler.fusion.epilogue import epilogue_legality
from geode.compiler.fusion.groups import FusionPlan
from geode.compiler.fusion.profit import epilogue_profit
from geode.compiler.ir import Graph, Node
from geode.config import Options
from geode.costmodel.device import DeviceSpec
from geode.errors import GeodeError

__all__ = ["attach_epilogues"]


def _consumer_job(node: Node, jobs: list[KernelJob]) -> KernelJob | None:
    """The one group job that reads ``node``'s product, if exactly one does."""
    readers = {c.name for c in node.outputs[0].consumers}
    found = [j for j in jobs if readers & j.group.names]
    return found[0] if len(found) == 1 and j_covers(found[0], readers) else None


def j_covers(job: KernelJob, names: set[str]) -> bool:
    """Whether every node named is in ``job``'s group."""
    return names <= job.group.names


def _decide(node: Node, job: KernelJob, g: Graph, spec: DeviceSpec) -> str | None:
    """Attach the epilogue to ``job`` and return None, or return why not."""
    ep = epilogue_legality(node, job.group, g)
    if isinstance(ep, str):
        return ep
    take, why = epilogue_profit(node, spec)
    if not take:
        return why
    try:
        job.panel = panel_graph(ep, g)
    except GeodeError as exc:
        return str(exc)
    job.group = job.panel.group
    ep.reason = why
    return None


def attach_epilogues(
    work: list, g: Graph, opts: Options, plan: FusionPlan, spec: DeviceSpec
) -> list:
    """``work`` with each profitable epilogue attached (see the module docstring)."""
    if not opts.dense_epilogues:
        return work
    jobs = [w for w in work if isinstance(w, KernelJob)]
    dropped: set[str] = set()
    for item in work:
        if not isinstance(item, Node) or not native_matmul(item, g, opts):
            continue
        job = _consumer_job(item, [j for j in jobs if j.panel is None])
        if job is None:
            plan.epilogues.append(
                f"{item.name}: no epilogue (its product is not read by one group)"
            )
            continue
        why = _decide(item, job, g, spec)
        if why is None:
            plan.epilogues.append(
                f"{item.name} + group {job.group.id} -> {job.name}: {job.panel.epilogue.reason}"
            )
            dropped.add(item.name)
            plan.unfused.pop(item.name, None)
        else:
            plan.epilogues.append(f"{item.name}: keep apart from group {job.group.id}: {why}")
    return [w for w in work if not (isinstance(w, Node) and w.name in dropped)]
