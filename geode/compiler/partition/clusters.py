"""Clusters of nodes merged without cycles (GE's BasePartitioner and BaseCluster).

Every node starts as its own cluster, labelled with a kind (known/unknown shape, an
engine). Along each data edge, in graph order, the producer's and the consumer's
clusters merge when their kinds allow it and no other path joins them (GE's TryMerge:
a path through a third cluster would become a cycle between clusters once the two are
one). Clusters keep the range of their nodes' positions in the graph's topological
order, which bounds the search for such a path, as GE's ``min_``/``max_`` do.

A node of kind :data:`ANY` (a view or a variable write: no step of its own) joins
whichever cluster it meets first; the merged cluster takes the other's kind.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence

from geode.compiler.ir import Node

__all__ = ["ANY", "merge_clusters"]

#: the kind of a node that may join a cluster of any kind
ANY = "*"


def merge_clusters(nodes: Sequence[Node], kind: Mapping[str, str]) -> list[tuple[str, list[str]]]:
    """Clusters of ``nodes`` (topologically sorted; every node named in ``kind``):
    ``(kind, node names in the given order)``, the clusters in a topological order.
    Edges from nodes outside ``nodes`` are ignored."""
    order = {n.name: i for i, n in enumerate(nodes)}
    members: dict[int, list[str]] = {i: [n.name] for i, n in enumerate(nodes)}
    label = {i: kind[n.name] for i, n in enumerate(nodes)}
    of = dict(order)  # node -> cluster id
    succ: dict[int, set[int]] = {i: set() for i in members}
    pred: dict[int, set[int]] = {i: set() for i in members}
    edges: list[tuple[str, str]] = []
    for node in nodes:
        for v in node.inputs:
            p = None if v is None else v.producer
            if p is not None and p.name in order:
                a, b = order[p.name], order[node.name]
                if a != b and b not in succ[a]:
                    succ[a].add(b)
                    pred[b].add(a)
                    edges.append((p.name, node.name))
    lo = {i: i for i in members}  # the cluster's first node position
    hi = {i: i for i in members}  # its last
    for pa, nb in edges:
        a, b = of[pa], of[nb]
        if a == b or not _compatible(label[a], label[b]) or _other_path(a, b, succ, lo, hi):
            continue
        for n in members[b]:
            of[n] = a
        members[a] += members.pop(b)
        if label[a] == ANY:
            label[a] = label[b]
        del label[b]
        lo[a], hi[a] = min(lo[a], lo[b]), max(hi[a], hi[b])
        for s in succ.pop(b):
            pred[s].discard(b)
            if s != a:
                succ[a].add(s)
                pred[s].add(a)
        for p in pred.pop(b):
            succ[p].discard(b)
            if p != a:
                succ[p].add(a)
                pred[a].add(p)
    out = []
    for cid in _topological(members, succ, pred, lo):
        out.append((label[cid], sorted(members[cid], key=order.__getitem__)))
    return out


def _compatible(a: str, b: str) -> bool:
    return a in (b, ANY) or b == ANY


def _other_path(
    a: int, b: int, succ: Mapping[int, set[int]], lo: Mapping[int, int], hi: Mapping[int, int]
) -> bool:
    """Whether cluster ``b`` is reachable from ``a`` other than by the direct edge: then
    merging them would put a cycle through the clusters on that path. A cluster whose
    first node comes after ``b``'s last cannot lead to ``b`` and is not searched."""
    stack = [c for c in succ[a] if c != b and lo[c] <= hi[b]]
    seen = set(stack)
    while stack:
        c = stack.pop()
        for d in succ[c]:
            if d == b:
                return True
            if d not in seen and lo[d] <= hi[b]:
                seen.add(d)
                stack.append(d)
    return False


def _topological(
    members: Mapping[int, list[str]],
    succ: Mapping[int, set[int]],
    pred: Mapping[int, set[int]],
    lo: Mapping[int, int],
) -> list[int]:
    """The clusters in a topological order, the one with the earliest node first among
    those ready."""
    indeg = {c: len(pred[c]) for c in members}
    ready = [(lo[c], c) for c in members if indeg[c] == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        _, c = heapq.heappop(ready)
        out.append(c)
        for s in succ[c]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(ready, (lo[s], s))
    return out
