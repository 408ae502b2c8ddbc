"""Which native MatMuls take the group that consumes their product as a fused epilogue.

For every MatMul the BLAS runs natively (:func:`geode.codegen.driver.native_matmul`) whose
product one fusion group reads: legality (:func:`geode.compiler.fusion.epilogue.
epilogue_legality`), then the panel form (:func:`geode.codegen.dense.panel_graph`). A legal
epilogue always pays: the cost model's panel rule (:func:`geode.compiler.fusion.profit.
epilogue_plan`, applied by the kernel to each run's shapes) falls back to one panel of all
rows when panels would re-pack the weights too often; the plan records its nominal choice. A taken epilogue turns the
group's job into a dense job and removes the MatMul from the work list (the job runs where
the group ran: after everything either reads). Every decision, taken or not, is recorded
with its reason in the fusion plan (``explain()`` shows it).
"""

from __future__ import annotations

from collections.abc import Callable

from geode.codegen.dense import panel_graph
from geode.codegen.driver import KernelJob, native_matmul
from geode.codegen.packed_weights import choose_packing
from geode.compiler.fusion.epilogue import (
    Epilogue,
    epilogue_legality,
    residual_add,
    second_gemm,
    sibling_gemm,
)
from geode.compiler.fusion.groups import FusionPlan, Group
from geode.compiler.fusion.head_views import (
    HeadView,
    absorbable,
    operand_view,
    remaining_groups,
    result_view,
)
from geode.compiler.fusion.profit import (
    epilogue_plan,
    head_view_plan,
    residual_plan,
    sibling_plan,
)
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


def _hoisted_job(ep: Epilogue, job: KernelJob, plan: FusionPlan, g: Graph) -> KernelJob:
    """The epilogue's product-independent nodes as a group of their own (run first)."""
    names = {n.name for n in ep.hoisted}
    outs = [
        o
        for n in ep.hoisted
        for o in n.outputs
        if any(c.name not in names for c in o.consumers) or any(o is x for x in g.outputs)
    ]
    gid = max((x.id for x in plan.groups), default=0) + 1
    group = Group(gid, list(ep.hoisted), tuple(outs[0].shape))
    plan.groups.append(group)
    return KernelJob(f"{job.name}_pre", group)


def _deciding_order(
    work: list, jobs: list[KernelJob], g: Graph, native: Callable[[Node], bool], opts: Options
) -> list[Node]:
    """The native MatMuls of ``work`` in the order their epilogues are decided: graph
    order, except that one whose epilogue would hoist nodes reading the product of
    another native MatMul of the same ``A`` (a gated MLP's ``up`` before its ``gate``)
    waits for that one, which can take the group with it as its sibling GEMM."""
    nodes = [w for w in work if isinstance(w, Node) and native(w)]
    if not opts.sibling_gemms:
        return nodes
    at = {n.name: i for i, n in enumerate(nodes)}
    keys = {}
    for i, node in enumerate(nodes):
        keys[node.name] = float(i)
        job = _consumer_job(node, jobs)
        ep = epilogue_legality(node, job.group, g) if job is not None else None
        if not isinstance(ep, Epilogue):
            continue
        for v in (v for h in ep.hoisted for v in h.inputs if v is not None):
            other = v.producer
            if (
                other is not None
                and other.name in at
                and at[other.name] > i
                and other.op_type == "MatMul"
                and other.inputs[0] is node.inputs[0]
            ):
                keys[node.name] = at[other.name] + 0.5
                break
    return sorted(nodes, key=lambda n: keys[n.name])


def _packed(a: Node | None, w_of: Node, opts: Options) -> bool:
    """Whether ``w_of``'s weight is packed once (its A given or its own)."""
    x, w = w_of.inputs[0], w_of.inputs[1]
    return choose_packing(a if a is not None else x, w, opts).packed


def _sibling(ep: Epilogue, g: Graph, spec: DeviceSpec, native: Callable, opts: Options) -> str:
    """Attach the epilogue's sibling GEMM when legal and paying; returns the decision's
    text ("" when no MatMul of the same A was a candidate)."""
    found = sibling_gemm(ep, g, native)
    if isinstance(found, str):
        none = found.startswith("no full input") or found == "the product is batched"
        return "" if none else f"no sibling GEMM: {found}"
    if not (_packed(None, ep.dense, opts) and _packed(None, found, opts)):
        return f"{found.name} apart: a sibling GEMM needs both weights packed once"
    take, why = sibling_plan(ep.dense, found, spec)
    if take:
        ep.sibling = found
    return why if take else f"{found.name} apart: {why}"


def _residual(
    ep: Epilogue, jobs: list[KernelJob], g: Graph, spec: DeviceSpec, opts: Options
) -> tuple[KernelJob | None, str]:
    """The job of the residual ``Add`` after the second MatMul when it is legal and pays
    as that GEMM's starting value (attached to ``ep``), and the decision's text."""
    job = _consumer_job(ep.second, jobs)
    if job is None:
        return None, ""
    found = residual_add(ep, job.group, g)
    if isinstance(found, str):
        return None, f"no residual: {found}"
    if not _packed(None, ep.second, opts):
        return None, f"{found.name} apart: a residual needs V packed once"
    take, why = residual_plan(ep.second, found, spec)
    if not take:
        return None, f"{found.name} apart: {why}"
    ep.residual = found
    return job, why


def _head_candidates(
    node: Node, jobs: list[KernelJob], g: Graph, native: Callable[[Node], bool]
) -> tuple[list[HeadView], list[str]]:
    """The head views of a batched native MatMul that will take its epilogue (checked as
    :func:`_decide` will: legality and the panel form), and why the others are not."""
    b = node.inputs[1]
    if b is None or b.shape is None or len(b.shape) < 3:
        return [], []
    job = _consumer_job(node, jobs)
    ep = epilogue_legality(node, job.group, g) if job is not None else None
    if not isinstance(ep, Epilogue):
        return [], []
    try:
        panel_graph(ep, g)
    except GeodeError:
        return [], []
    second = second_gemm(ep, g, native)
    found = [operand_view(node.inputs[0], "A", g), operand_view(b, "B", g)]
    if isinstance(second, Node):
        found += [operand_view(second.inputs[1], "V", g), result_view(second.outputs[0], g)]
    return [v for v in found if isinstance(v, HeadView)], [w for w in found if isinstance(w, str)]


def _written(views: dict[str, list[HeadView]]) -> frozenset[int]:
    """The ids of the values the dense ops write in place (their results' roots)."""
    return frozenset(id(v.root) for vs in views.values() for v in vs if v.operand == "O")


def _refused(
    views: dict[str, list[HeadView]], readers: set[str], jobs: list[KernelJob], g: Graph
) -> dict[int, str]:
    """The views (by id) whose nodes cannot all leave their groups, with why: a value
    they make is read elsewhere, or what would stay in a group is no group."""
    taken = {n.name for vs in views.values() for v in vs for n in v.nodes}
    bad: dict[int, str] = {}
    for vs in views.values():
        for v in vs:
            chain = v.nodes[:-1] if v.operand == "O" else v.nodes  # O's root is written
            for n in chain:
                if not absorbable(n, taken, readers, g):
                    bad[id(v)] = f"{n.name}'s result is read elsewhere"
    for job in jobs:
        if not (job.group.names & taken):
            continue
        left = remaining_groups(job.group, taken, g, _written(views))
        if isinstance(left, str):
            for vs in views.values():
                for v in vs:
                    if any(n.name in job.group.names for n in v.nodes):
                        bad.setdefault(id(v), left)
    return bad


def _take_views(
    views: dict[str, list[HeadView]], jobs: list[KernelJob], plan: FusionPlan, g: Graph
) -> dict[int, list[KernelJob]]:
    """Take the views' nodes out of their groups; returns, by job id, the jobs that run
    in place of each job whose group changed: none for a group left empty, its own job
    with what is left, and one more per further part of it (see
    :func:`~geode.compiler.fusion.head_views.remaining_groups`)."""
    taken = {n.name for vs in views.values() for v in vs for n in v.nodes}
    instead: dict[int, list[KernelJob]] = {}
    for job in jobs:
        if not (job.group.names & taken):
            continue
        left = remaining_groups(job.group, taken, g, _written(views))
        assert not isinstance(left, str)  # refused views were dropped (_refused)
        at = next(i for i, grp in enumerate(plan.groups) if grp is job.group)
        instead[id(job)] = []
        for k, grp in enumerate(left):
            if k:
                grp.id = max(x.id for x in plan.groups) + 1
            job_k = job if k == 0 else KernelJob(f"{job.name}_{k}", grp)
            job_k.group = grp
            instead[id(job)].append(job_k)
        plan.groups[at : at + 1] = left
    return instead


def _head_views(
    work: list, g: Graph, opts: Options, plan: FusionPlan, spec: DeviceSpec
) -> tuple[list, dict[str, dict[str, HeadView]]]:
    """Attention's operands read, and its result written, in place
    (:mod:`geode.compiler.fusion.head_views`) where legal and paying: their layout
    nodes leave their groups (before any epilogue is decided, so a qkv ``Split``'s bias
    ``Add`` left alone can join its GEMM). Returns ``work`` without the groups left
    empty, and per dense node its views by operand."""
    if not opts.in_place_heads:
        return work, {}
    native = lambda n: native_matmul(n, g, opts)  # noqa: E731
    jobs = [w for w in work if isinstance(w, KernelJob)]
    views: dict[str, list[HeadView]] = {}
    readers: set[str] = set()
    for node in (w for w in work if isinstance(w, Node) and native(w)):
        found, why = _head_candidates(node, jobs, g, native)
        if found:
            plan.epilogues += [f"{node.name}: not in place: {w}" for w in why]
            views[node.name] = found
            last = [v.nodes[-1].outputs[0] for v in found if v.operand != "O"]
            readers |= {c.name for x in last for c in x.consumers}
    while True:
        bad = _refused(views, readers, jobs, g)
        if not bad:
            break
        for name, vs in views.items():
            for v in vs:
                if id(v) in bad:
                    plan.epilogues.append(f"{name}: {v.operand} not in place: {bad[id(v)]}")
            views[name] = [v for v in vs if id(v) not in bad]
    for name, vs in list(views.items()):
        copies = [v.nodes[0].inputs[0] if v.operand == "O" else v.nodes[-1].outputs[0] for v in vs]
        mine = {n.name for v in vs for n in v.nodes}
        emptied = [j for j in jobs if j.group.names <= mine]
        gathered = [v.nodes[-1].outputs[0] for v in vs if v.transposed]
        take, why = head_view_plan(copies, len(emptied), spec, gathered) if vs else (False, "")
        if not take:
            if vs:
                plan.epilogues.append(f"{name}: operands not in place: {why}")
            del views[name]
            continue
        plan.epilogues.append(f"{name}: heads in place: {why}")
    instead = _take_views(views, jobs, plan, g)
    taken = {n.name for vs in views.values() for v in vs for n in v.nodes}
    for name in taken:
        plan.unfused.pop(name, None)
    out: list = []
    for w in work:
        if isinstance(w, Node) and w.name in taken:
            continue
        out += instead.get(id(w), [w]) if isinstance(w, KernelJob) else [w]
    work = out
    return work, {name: {v.operand: v for v in vs} for name, vs in views.items()}


def _decide(
    node: Node,
    job: KernelJob,
    g: Graph,
    spec: DeviceSpec,
    native: Callable[[Node], bool],
    opts: Options,
    views: dict[str, HeadView] | None = None,
) -> Epilogue | str:
    """The epilogue of ``node`` in ``job`` (its panel form attached to the job), or why not."""
    ep = epilogue_legality(node, job.group, g)
    if isinstance(ep, str):
        return ep
    ep.views = dict(views or {})
    second = second_gemm(ep, g, native)
    if isinstance(second, Node):
        ep.second = second
    sibling = _sibling(ep, g, spec, native, opts) if opts.sibling_gemms else ""
    _, why = epilogue_plan(node, spec, ep.second)
    try:
        job.panel = panel_graph(ep, g)
    except GeodeError as exc:
        return str(exc)
    job.group = job.panel.group
    ep.reason = why if ep.second is None else f"{why}; then {ep.second.name} per panel"
    if sibling:
        ep.reason += f"; {sibling}"
    for x in "ABVO":
        if x in ep.views:
            ep.reason += f"; {ep.views[x].describe()}"
    return ep


def attach_epilogues(
    work: list, g: Graph, opts: Options, plan: FusionPlan, spec: DeviceSpec
) -> list:
    """``work`` with each profitable epilogue attached (see the module docstring)."""
    if not opts.dense_epilogues:
        return work
    work, views = _head_views(work, g, opts, plan, spec)
    native = lambda n: native_matmul(n, g, opts)  # noqa: E731
    jobs = [w for w in work if isinstance(w, KernelJob)]
    dropped: set[str] = set()
    moved: dict[str, KernelJob] = {}  # second MatMul's name -> the job that runs in its place
    absorbed: dict[int, KernelJob] = {}  # a residual Add's job id -> the job that runs there
    pre: dict[int, KernelJob] = {}  # job id -> its hoisted nodes' job
    before: dict[str, list[Node]] = {}  # layout nodes run again before / after a node
    after: dict[str, list[Node]] = {}
    for item in _deciding_order(work, jobs, g, native, opts):
        if item.name in dropped:
            continue
        job = _consumer_job(item, [j for j in jobs if j.panel is None and id(j) not in absorbed])
        if job is None:
            plan.epilogues.append(
                f"{item.name}: no epilogue (its product is not read by one group)"
            )
            _restore(views.get(item.name, {}), item, before, after, plan)
            continue
        ep = _decide(item, job, g, spec, native, opts, views.get(item.name))
        if isinstance(ep, str):
            plan.epilogues.append(f"{item.name}: keep apart from group {job.group.id}: {ep}")
            _restore(views.get(item.name, {}), item, before, after, plan)
            continue
        plan.epilogues.append(f"{item.name} + group {job.group.id} -> {job.name}: {ep.reason}")
        dropped.add(item.name)
        plan.unfused.pop(item.name, None)
        if ep.hoisted:
            pre[id(job)] = _hoisted_job(ep, job, plan, g)
        if ep.sibling is not None:
            dropped.add(ep.sibling.name)
            plan.unfused.pop(ep.sibling.name, None)
        if ep.second is not None:
            dropped.add(ep.second.name)
            plan.unfused.pop(ep.second.name, None)
            moved[ep.second.name] = job
            free = [j for j in jobs if j.panel is None and id(j) not in absorbed]
            add_job, text = (
                _residual(ep, free, g, spec, opts) if opts.residual_epilogues else (None, "")
            )
            if text:
                plan.epilogues[-1] += f"; {text}"
            if add_job is not None:
                absorbed[id(add_job)] = job
                del moved[ep.second.name]
    out: list = []
    for w in work:
        if isinstance(w, Node):
            out += before.get(w.name, [])
        if isinstance(w, KernelJob) and id(w) in pre:
            out.append(pre[id(w)])
        if isinstance(w, KernelJob) and id(w) in absorbed:
            out.append(absorbed[id(w)])  # where its residual Add ran (R is ready there)
            continue
        if isinstance(w, KernelJob) and w.panel is not None and w.panel.epilogue.second:
            continue  # runs where its second MatMul ran (V is ready there)
        if isinstance(w, Node) and w.name in moved:
            out.append(moved[w.name])
        elif not (isinstance(w, Node) and w.name in dropped):
            out.append(w)
        if isinstance(w, Node):
            out += after.get(w.name, [])
    return out


def _restore(
    views: dict[str, HeadView],
    node: Node,
    before: dict[str, list[Node]],
    after: dict[str, list[Node]],
    plan: FusionPlan,
) -> None:
    """A dense node whose operands were to be read in place took no epilogue after all
    (its decision differed from :func:`_head_candidates`'): its layout nodes run again,
    each on its own, the operands' before the MatMul reading them and the result's after
    its second MatMul."""
    if not views:
        return
    ins = [n for x in ("A", "B") if x in views for n in views[x].nodes]
    before[node.name] = [n for i, n in enumerate(ins) if all(n is not m for m in ins[:i])]
    if "V" in views:  # before the MatMul reading V (V's root may come after the first)
        v_reader = views["V"].nodes[-1].outputs[0].consumers[0]
        seen = before[node.name]
        before[v_reader.name] = [n for n in views["V"].nodes if all(n is not m for m in seen)]
    if "O" in views:
        second = views["O"].nodes[0].inputs[0].producer
        after[second.name] = list(views["O"].nodes)
    plan.epilogues.append(f"{node.name}: its heads are copied again, each node on its own")
