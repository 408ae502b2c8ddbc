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
from geode.compiler.fusion.causal import causal_legality
from geode.compiler.fusion.epilogue import (
    Epilogue,
    epilogue_legality,
    rms_prologue,
    second_gemm,
    sibling_candidates,
    sibling_gemm,
    store_adds,
    transposed_a,
)
from geode.compiler.fusion.groups import FusionPlan, Group
from geode.compiler.fusion.head_views import (
    HeadView,
    absorbable,
    operand_view,
    remaining_groups,
    result_view,
)
from geode.compiler.fusion.online import OnlineSoftmax, online_legality
from geode.compiler.fusion.profit import (
    causal_plan,
    epilogue_plan,
    head_view_plan,
    online_plan,
    online_switch_keys,
    partner_plan,
    prologue_plan,
    sibling_plan,
    store_plan,
    transpose_plan,
)
from geode.compiler.fusion.summed import partner_candidates, partner_gemm
from geode.compiler.ir import Graph, Node
from geode.config import Options
from geode.costmodel.device import DeviceSpec
from geode.errors import GeodeError

__all__ = [
    "CAUSAL_ATTENTION",
    "ONLINE_ATTENTION",
    "ONLINE_FORCE",
    "ONLINE_PER_CALL",
    "attach_epilogues",
]

#: a switch for measuring: off, no attention takes causal panels (a module switch, not an
#: option: the results are the same, only the work differs)
CAUSAL_ATTENTION = True
#: switches for measuring and testing: off, no attention takes the key-tiled (online)
#: softmax; ``ONLINE_FORCE``, every one whose form is legal and that the kernel runs takes
#: it whatever the profit rule says (module switches: the results agree within the float
#: sums' bounds, only the work differs)
ONLINE_ATTENTION = True
ONLINE_FORCE = False
#: a switch for measuring: off, a symbolic key length keeps the row panels alone (on, its
#: entry also holds the key-tiled body, taken per call on long rows)
ONLINE_PER_CALL = True


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


def _legality(
    node: Node, job: KernelJob, g: Graph, native: Callable[[Node], bool], opts: Options
) -> Epilogue | str:
    """The epilogue of ``node`` in ``job``'s group, or why not; with ``sibling_gemms``, the
    nodes that read another native MatMul's product of the same ``A`` stay in it (not
    hoisted), that product a candidate sibling GEMM (:func:`sibling_candidates`); else
    with ``summed_gemms`` likewise a MatMul's of another ``A`` of the same rows, a
    candidate partner GEMM (:func:`partner_candidates`)."""
    ep = epilogue_legality(node, job.group, g)
    if not isinstance(ep, Epilogue) or not ep.hoisted:
        return ep
    found = sibling_candidates(ep, native) if opts.sibling_gemms else ()
    if not found and opts.summed_gemms:
        found = partner_candidates(ep, native)
    if not found:
        return ep
    wide = epilogue_legality(node, job.group, g, found)
    return wide if isinstance(wide, Epilogue) else ep


def _deciding_order(
    work: list, jobs: list[KernelJob], g: Graph, native: Callable[[Node], bool], opts: Options
) -> list[Node]:
    """The native MatMuls of ``work`` in the order their epilogues are decided: graph
    order, except that one whose epilogue alone (no sibling) would hoist nodes reading
    the product of a later native MatMul of the same ``A``, whose own epilogue hoists
    nothing of its product (a gated MLP's ``up`` before its ``gate``), waits for that
    one: the gate's epilogue, with up as its sibling GEMM, is then the dense step."""
    nodes = [w for w in work if isinstance(w, Node) and native(w)]
    if not opts.sibling_gemms:
        return nodes
    at = {n.name: i for i, n in enumerate(nodes)}
    reads: dict[str, list[str]] = {}  # node -> the same-A MatMuls its hoisted nodes read
    for node in nodes:
        job = _consumer_job(node, jobs)
        ep = epilogue_legality(node, job.group, g) if job is not None else None
        hoisted = ep.hoisted if isinstance(ep, Epilogue) else []
        reads[node.name] = [
            v.producer.name
            for h in hoisted
            for v in h.inputs
            if v is not None
            and v.producer is not None
            and v.producer.name in at
            and v.producer.op_type == "MatMul"
            and v.producer.inputs[0] is node.inputs[0]
        ]
    keys = {}
    for i, node in enumerate(nodes):
        keys[node.name] = float(i)
        for other in reads[node.name]:
            if at[other] > i and node.name not in reads[other]:
                keys[node.name] = at[other] + 0.5
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


def _partner(ep: Epilogue, g: Graph, spec: DeviceSpec, native: Callable, opts: Options) -> str:
    """Attach the epilogue's partner GEMM (another ``A`` of the same rows) when legal and
    paying; returns the decision's text ("" when no other MatMul's product is a
    candidate)."""
    found = partner_gemm(ep, g, native)
    if isinstance(found, str):
        none = found.startswith("no full input") or found == "the product is batched"
        return "" if none else f"no partner GEMM: {found}"
    if not (_packed(None, ep.dense, opts) and _packed(None, found, opts)):
        return f"{found.name} apart: a partner GEMM needs both weights packed once"
    take, why = partner_plan(ep.dense, found, spec)
    if take:
        ep.partner = found
    return why if take else f"{found.name} apart: {why}"


def _prologue(
    ep: Epilogue, jobs: list[KernelJob], g: Graph, spec: DeviceSpec
) -> tuple[KernelJob | None, str]:
    """The job of the RMSNorm whose scale per row of ``A`` the epilogue reads, when the
    kernel can compute it from ``A``'s panels and that pays (attached to ``ep``: the job
    goes), and the decision's text ("" when there is no such scale)."""
    found = rms_prologue(ep, g)
    if found is None:
        return None, ""
    if isinstance(found, str):
        return None, f"no RMSNorm prologue: {found}"
    names = {n.name for n in found.nodes}
    job = next((j for j in jobs if j.panel is None and j.group.names == names), None)
    if job is None:
        return None, "RMSNorm prologue apart: its kernel computes more than the scale"
    take, why = prologue_plan(ep.dense, found.scale, spec)
    if not take:
        return None, f"RMSNorm prologue apart: {why}"
    ep.prologue = found
    return job, why


def _residual(
    ep: Epilogue, jobs: list[KernelJob], g: Graph, spec: DeviceSpec, opts: Options
) -> tuple[KernelJob | None, str]:
    """The job of the bias and residual ``Add`` nodes after the second MatMul when they are
    legal and pay as part of that GEMM's store (attached to ``ep``), and the decision's
    text."""
    job = _consumer_job(ep.second, jobs)
    if job is None:
        return None, ""
    found = store_adds(ep, job.group, g)
    if isinstance(found, str):
        return None, f"no residual: {found}"
    adds = [a for a in (found.bias, found.residual) if a is not None]
    names = " and ".join(a.name for a in adds)
    if not _packed(None, ep.second, opts):
        return None, f"{names} apart: a bias or a residual needs V packed once"
    take, why = store_plan(ep.second, adds, spec)
    if not take:
        return None, f"{names} apart: {why}"
    ep.bias, ep.residual = found.bias, found.residual
    return job, why


def _transposed(
    ep: Epilogue, jobs: list[KernelJob], g: Graph, spec: DeviceSpec, opts: Options
) -> tuple[KernelJob | None, str]:
    """The job of the Transpose that makes the dense node's ``A`` when the GEMM reads its
    input in place instead, legal and paying (attached to ``ep``), and the decision's text
    ("" when ``A`` is no Transpose's result)."""
    found = transposed_a(ep, g)
    if isinstance(found, str):
        return None, "" if found == "A is not a Transpose's result" else f"A copied: {found}"
    job = next((j for j in jobs if j.panel is None and j.group.names == {found.name}), None)
    if job is None:
        return None, f"A copied: {found.name} is not a kernel of its own"
    if not _packed(found.inputs[0], ep.dense, opts):
        return None, f"A copied: reading {found.name}'s input in place needs B packed once"
    take, why = transpose_plan(found, ep.dense, spec)
    if not take:
        return None, f"A copied: {why}"
    ep.a_transpose = found
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
    ep = _legality(node, job, g, native, opts)
    if isinstance(ep, str):
        return ep
    ep.views = dict(views or {})
    second = second_gemm(ep, g, native)
    if isinstance(second, Node):
        ep.second = second
    sibling = _sibling(ep, g, spec, native, opts) if opts.sibling_gemms else ""
    if ep.second is None and ep.sibling is None and opts.summed_gemms:
        sibling = "; ".join(x for x in (sibling, _partner(ep, g, spec, native, opts)) if x)
    causal = _causal(ep) if ep.second is not None and ep.batched else ""
    attention = ep.second is not None and ep.batched and ep.causal is None
    online = _online(ep, spec) if attention else ""
    _, why = epilogue_plan(node, spec, ep.second)
    try:
        job.panel = panel_graph(ep, g)
    except GeodeError as exc:
        return str(exc)
    job.group = job.panel.group
    ep.reason = why if ep.second is None else f"{why}; then {ep.second.name} per panel"
    if ep.width is not None:
        ep.reason += f"; elementwise on {ep.width}-column slices of the product"
    if sibling:
        ep.reason += f"; {sibling}"
    if causal:
        ep.reason += f"; {causal}"
    if online:
        ep.reason += f"; {online}"
    for x in "ABVO":
        if x in ep.views:
            ep.reason += f"; {ep.views[x].describe()}"
    return ep


def _causal(ep: Epilogue) -> str:
    """Attach the attention's causal mask to ``ep`` when one is proven
    (:func:`~geode.compiler.fusion.causal.causal_legality`) and its panels pay
    (:func:`~geode.compiler.fusion.profit.causal_plan`); the decision's text."""
    if not CAUSAL_ATTENTION:
        return "not causal: switched off"
    assert ep.second is not None
    found = causal_legality(ep.group.nodes, ep.roles, ep.dense.outputs[0], ep.second.inputs[0])
    if isinstance(found, str):
        return f"not causal: {found}"
    pays, why = causal_plan(ep.dense, found.offset)
    if not pays:
        return f"{found.describe()}; all key columns: {why}"
    ep.causal = found
    return f"{found.describe()}: {why}"


def _online_blocker(ep: Epilogue, found: OnlineSoftmax) -> str:
    """Why the key-tiled kernel (``backends/llvm/attention_tiled.py``) cannot run the legal
    form ``found`` of ``ep``, or ``""``."""
    acc = ep.dense.outputs[0]
    if not found.pre:
        return "no per-element op before the softmax for the block's kernel"
    if str(acc.dtype) not in ("float32", "float64") or found.x.dtype != acc.dtype:
        return "the softmax's input is not of the scores' type, float32 or float64"
    if found.softmax[-1].op_type != "Div":
        return "a cast after the softmax"
    if any(v.is_constant for v in (ep.dense.inputs[1], ep.second.inputs[1])):
        return "a constant K or V (weights packed once)"
    made = {id(o) for n in found.pre for o in n.outputs}
    ins = {id(v): v for n in found.pre for v in n.inputs if v is not None and id(v) not in made}
    ins.pop(id(acc), None)
    if sum(ep.roles.get(v.name) in ("full", "bfull") for v in ins.values()) > 1:
        return "more than one input of the scores' size"
    if any(ep.roles.get(v.name) == "row" and v.is_constant for v in ins.values()):
        return "a constant per key column"
    return ""


def _online(ep: Epilogue, spec: DeviceSpec) -> str:
    """Attach the key-tiled (online) softmax to a non-causal attention ``ep`` when its
    epilogue is that form (:func:`~geode.compiler.fusion.online.online_legality`), it pays
    (:func:`~geode.compiler.fusion.profit.online_plan`; any legal one with
    :data:`ONLINE_FORCE`) and the kernel runs it (:func:`_online_blocker`); the decision's
    text."""
    assert ep.second is not None
    if not ONLINE_ATTENTION:
        return "row panels: the key-tiled softmax switched off"
    found = online_legality(ep.group.nodes, ep.roles, ep.dense.outputs[0], ep.second.inputs[0])
    if isinstance(found, str):
        return f"row panels, not key-tiled: {found}"
    pays, why = online_plan(ep.dense, ep.second, spec)
    if ONLINE_FORCE:
        pays, why = True, f"forced ({why})"
    if not pays:
        return f"{found.describe()}; row panels: {why}" + _switch(ep, found, spec)
    blocker = _online_blocker(ep, found)
    if blocker:
        return f"{found.describe()}; would pay ({why}); row panels: {blocker}"
    ep.online = found
    return f"{found.describe()}; key-tiled: {why}"


def _switch(ep: Epilogue, found: OnlineSoftmax, spec: DeviceSpec) -> str:
    """With a symbolic key length, attach ``found`` as the key-tiled body the entry takes
    per call beside the row panels' (:data:`ONLINE_PER_CALL`) when the kernel runs it;
    the decision's text (after the row panels' reason)."""
    if not ONLINE_PER_CALL or isinstance(ep.dense.outputs[0].shape[-1], int):
        return ""
    blocker = _online_blocker(ep, found)
    if blocker:
        return f"; not key-tiled per call: {blocker}"
    ep.switch = found
    _, why = online_switch_keys(ep.dense, ep.second, spec)
    return f"; {why}"


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
    # ids of the jobs that go: Transposes their GEMM reads in place, RMSNorm scales the
    # dense steps compute
    gone: set[int] = set()
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
        # a MatMul another dense op already runs (its own, a second, a sibling, a
        # partner) is no candidate for this one's
        free = lambda n, taken=frozenset(dropped): native(n) and n.name not in taken  # noqa: E731
        ep = _decide(item, job, g, spec, free, opts, views.get(item.name))
        if isinstance(ep, str):
            plan.epilogues.append(f"{item.name}: keep apart from group {job.group.id}: {ep}")
            _restore(views.get(item.name, {}), item, before, after, plan)
            continue
        plan.epilogues.append(f"{item.name} + group {job.group.id} -> {job.name}: {ep.reason}")
        if opts.transposed_operands:
            t_job, text = _transposed(ep, [j for j in jobs if id(j) not in gone], g, spec, opts)
            plan.epilogues[-1] += f"; {text}" if text else ""
            gone |= {id(t_job)} if t_job is not None else set()
        if opts.row_scale_gemms:
            norm_job, text = _prologue(ep, [j for j in jobs if id(j) not in gone], g, spec)
            if text:
                plan.epilogues[-1] += f"; {text}"
            if norm_job is not None:
                gone.add(id(norm_job))
        dropped.add(item.name)
        plan.unfused.pop(item.name, None)
        if ep.hoisted:
            pre[id(job)] = _hoisted_job(ep, job, plan, g)
        for beside in (ep.sibling, ep.partner):
            if beside is not None:
                dropped.add(beside.name)
                plan.unfused.pop(beside.name, None)
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
        if id(w) in gone:
            continue  # a Transpose its GEMM reads in place, a scale its panels compute
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
