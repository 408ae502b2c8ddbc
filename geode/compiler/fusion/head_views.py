"""Legality of attention's operands read in place: a batched MatMul's ``A``, ``B`` or
``V`` that is only a view of heads over a wider array, and the second product ``O``
written in place through the transpose back to rows.

Exporters write multi-head attention's layout changes as nodes: the projection
``[*lead, S, W]`` (``W`` the width of all heads; for a fused ``qkv`` projection a
``Split`` on the last axis first) is reshaped to ``[*lead, S, H, D]`` and transposed to
``[*lead, H, S, D]`` (``K`` to ``[*lead, H, D, S]``), and the attention result
``[*lead, H, S, D]`` is transposed to ``[*lead, S, H, D]`` and reshaped to
``[*lead, S, H * D]``. As fusion groups these are copy kernels. The operand is, though,
``root[..., s, offset + h * D + d]`` of the root array, with a leading dim of ``W``:
a GEMM reads it in place (``K^T`` through ``transB``), and writes ``O`` in place likewise
(the dense entry's head layouts, ``codegen/backends/llvm/dense.py: HeadLayout``).

:func:`operand_view` and :func:`result_view` recognise one chain each and say why not
otherwise. Whether a chain's nodes can leave their fusion group (every value they make
read only by the chain or the dense op; what stays in the group a plain elementwise
group) is :func:`absorbable`'s and :func:`remaining_groups`'; whether it pays is the cost model's
(:func:`geode.compiler.fusion.profit.head_view_plan`).
"""

from __future__ import annotations

from dataclasses import dataclass

from geode.compiler.fusion.groups import Group
from geode.compiler.ir import Graph, Node, Value
from geode.compiler.ops import registry
from geode.compiler.ops.registry import OpKind
from geode.compiler.shapes import same_dim

__all__ = ["HeadView", "absorbable", "operand_view", "remaining_groups", "result_view"]


@dataclass(frozen=True)
class HeadView:
    """An operand of a dense op (``A``, ``B``, ``V``) read in place from ``root``, or its
    result ``O`` written in place into ``root``: ``root`` is ``[*lead, S, W]`` and the
    operand ``[*lead, H, S, D]`` (``transposed``: ``[*lead, H, D, S]``) is
    ``root[..., s, offset + h * D + d]``. ``nodes`` are the layout nodes the dense step
    takes over (they run no kernel)."""

    operand: str
    root: Value
    nodes: tuple[Node, ...]
    heads: int
    depth: int
    offset: int = 0
    transposed: bool = False

    def describe(self) -> str:
        """``B read in place from qkv (4 heads of 64 at column 256, transposed: ...)``."""
        verb = "written in place into" if self.operand == "O" else "read in place from"
        at = f" at column {self.offset}" if self.offset else ""
        how = ", transposed" if self.transposed else ""
        names = ", ".join(n.name for n in self.nodes)
        return (
            f"{self.operand} {verb} {self.root.name} ({self.heads} heads of {self.depth}"
            f"{at}{how}; {names} run no kernel)"
        )


def _only_reader(v: Value, graph: Graph) -> Node | None:
    """``v``'s one reader, when it has exactly one and is not a graph output."""
    if any(o is v for o in graph.outputs) or len(v.consumers) != 1:
        return None
    return v.consumers[0]


def _perm(node: Node, rank: int) -> list[int]:
    perm = node.attrs.get("perm")
    return list(range(rank))[::-1] if perm is None else [int(p) for p in perm]


def _heads_of(wide: Value, split: Value) -> tuple[int, int] | str:
    """``(H, D)`` when ``split`` is ``wide`` ``[*lead, S, H * D]`` with its last axis split
    into static ``[H, D]``, else why not."""
    ws, ss = wide.shape, split.shape
    if ws is None or ss is None or len(ss) != len(ws) + 1 or len(ws) < 2:
        return "the reshape does not split the last axis in two"
    h, d, w = ss[-2], ss[-1], ws[-1]
    if not all(isinstance(x, int) for x in (h, d, w)) or h * d != w or h < 1 or d < 1:
        return "the heads' count and depth are not static or do not make the row"
    if not all(same_dim(a, b) for a, b in zip(ws[:-1], ss[:-2])):
        return "the reshape changes more than the last axis"
    return h, d


def _split_offset(src: Value) -> tuple[Value, int, Node] | None:
    """``(root, offset, split)`` when ``src`` is an output of a ``Split`` of ``root`` on its
    last axis with static sizes: ``src`` starts at column ``offset`` of ``root``."""
    sp = src.producer
    if sp is None or sp.op_type != "Split" or sp.inputs[0] is None:
        return None
    root = sp.inputs[0]
    if root.shape is None or not isinstance(root.shape[-1], int):
        return None
    rank = len(root.shape)
    if int(sp.attrs.get("axis", 0)) % rank != rank - 1:
        return None
    sizes = [o.shape[-1] if o.shape is not None else None for o in sp.outputs]
    if not all(isinstance(x, int) for x in sizes):
        return None
    at = next(i for i, o in enumerate(sp.outputs) if o is src)
    return root, sum(sizes[:at]), sp


def operand_view(x: Value, operand: str, graph: Graph) -> HeadView | str:
    """``x`` (operand ``A``, ``B`` or ``V`` of a batched dense op) as a view of heads
    (``Transpose(Reshape(root))``, ``root`` possibly a ``Split`` output on the last axis,
    then read at its column offset in the ``Split``'s input), else why not. Only ``B``
    may be transposed (``[*lead, H, D, S]``: ``K^T``)."""
    t = x.producer
    if t is None or t.op_type != "Transpose" or _only_reader(x, graph) is None:
        return f"{operand} is not a transpose read by the product alone"
    r = t.inputs[0]
    rs = r.producer if r is not None else None
    if rs is None or rs.op_type != "Reshape" or _only_reader(r, graph) is not t:
        return f"{operand}'s transpose does not read a reshape of its own"
    src = rs.inputs[0]
    if src is None or src.dtype != x.dtype:
        return f"{operand}'s reshape has no input of its type"
    hd = _heads_of(src, r)
    if isinstance(hd, str):
        return f"{operand}: {hd}"
    lead = len(r.shape) - 3
    base = list(range(lead))
    perm = _perm(t, len(r.shape))
    transposed = perm == [*base, lead + 1, lead + 2, lead]
    if perm != [*base, lead + 1, lead, lead + 2] and not transposed:
        return f"{operand}'s transpose {perm} does not put the heads before the rows"
    if transposed and operand != "B":
        return f"{operand} is read transposed (only B can be)"
    root, offset, nodes = src, 0, (rs, t)
    found = _split_offset(src)
    if found is not None:
        root, offset, sp = found
        nodes = (sp, rs, t)
    return HeadView(operand, root, nodes, hd[0], hd[1], offset, transposed)


def result_view(o: Value, graph: Graph) -> HeadView | str:
    """The second product ``o`` ``[*lead, H, S, D]`` written in place into the value its
    ``Transpose`` to ``[*lead, S, H, D]`` and ``Reshape`` to ``[*lead, S, H * D]`` make,
    else why not."""
    t = _only_reader(o, graph)
    if t is None or t.op_type != "Transpose" or o.shape is None or len(o.shape) < 3:
        return "the result is not read by one transpose alone"
    lead = len(o.shape) - 3
    if _perm(t, len(o.shape)) != [*range(lead), lead + 1, lead, lead + 2]:
        return "the result's transpose does not swap the heads and the rows"
    rs = _only_reader(t.outputs[0], graph)
    if rs is None or rs.op_type != "Reshape":
        return "the transposed result is not read by one reshape alone"
    root = rs.outputs[0]
    hd = _heads_of(root, t.outputs[0])
    if isinstance(hd, str):
        return f"O: {hd}"
    return HeadView("O", root, (t, rs), hd[0], hd[1])


def absorbable(node: Node, taken: set[str], readers: set[str], graph: Graph) -> bool:
    """Whether ``node`` (of a view chain) can run no kernel: every value it makes is read
    only by nodes in ``taken`` (the chains' nodes) or ``readers`` (the dense ops), and is
    no graph output."""
    outs = {id(v) for v in graph.outputs}
    return all(
        id(v) not in outs and all(c.name in taken or c.name in readers for c in v.consumers)
        for v in node.outputs
    )


def _components(nodes: list[Node]) -> list[list[Node]]:
    """``nodes`` split into the parts that share no value (each in order)."""
    part = {n.name: i for i, n in enumerate(nodes)}

    def root(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    parent = list(range(len(nodes)))
    for i, n in enumerate(nodes):
        for v in n.inputs:
            if v is not None and v.producer is not None and v.producer.name in part:
                parent[root(i)] = root(part[v.producer.name])
    groups: dict[int, list[Node]] = {}
    for i, n in enumerate(nodes):
        groups.setdefault(root(i), []).append(n)
    return list(groups.values())


def remaining_groups(
    group: Group, taken: set[str], graph: Graph, written: frozenset[int] = frozenset()
) -> list[Group] | str:
    """``group`` without the chains' nodes ``taken``: no group when nothing is left, else
    a plain elementwise group over its outputs' shape per part that shares no value with
    the others (a ``qkv`` projection's bias ``Add`` left after its ``Split``; the biases
    of separate projections the planner had merged side by side), the first with the
    group's id, the others with id 0 (the caller numbers them); or why what is left is no
    group. ``written``: the ids of the values the dense ops write in place (results'
    roots), which what is left may read."""
    left = [n for n in group.nodes if n.name not in taken]
    if len(left) == len(group.nodes):
        return [group]
    if not left:
        return []
    if group.axes or group.levels or group.branches:
        return f"group {group.id} reduces: its other nodes stay with the chain"
    plain = (OpKind.ELEMENTWISE, OpKind.BROADCAST)
    if any(registry.get(n.op_type, n.domain, n.where).kind not in plain for n in left):
        return f"group {group.id} keeps nodes that are not elementwise"
    if any(
        v is not None
        and v.producer is not None
        and v.producer.name in taken
        and id(v) not in written
        for n in left
        for v in n.inputs
    ):
        return f"group {group.id} keeps nodes that read the chain"
    out: list[Group] = []
    for part in _components(left):
        names = {n.name for n in part}
        made = [o for n in part for o in n.outputs]
        outs = [o for o in made if any(o is g for g in graph.outputs)]
        outs += [o for o in made if any(c.name not in names for c in o.consumers)]
        shapes = {tuple(str(d) for d in (o.shape or ())) for o in outs}
        if len(shapes) != 1 or outs[0].shape is None:
            return f"group {group.id}'s other nodes make values of several shapes"
        out.append(Group(group.id if not out else 0, part, tuple(outs[0].shape)))
    return out
