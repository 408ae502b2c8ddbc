"""Graphviz pictures of graphs: fusion groups as clusters, engines as colours.

``to_dot(graph, placement, fusion_plan)`` gives DOT text: every op is a box filled
with its engine's colour (a legend names them), every fusion group (or compiled
kernel) is a cluster around its ops, graph inputs are green ellipses, outputs double
ellipses, constants grey notes; edges carry the tensor type. Ops in an unknown-shape
partition have a dashed border; ops the compiled model never runs (dead after
fusion) are grey and dotted. Given the engine partition (GE's EnginePartitioner,
:mod:`geode.compiler.partition.engine`), each engine subgraph is a dashed box around
its ops and kernels (subgraph 0 holds the inputs), and a value that crosses between
subgraphs runs through an End node (in the box that produces it) and a PlaceHolder
node (in the box that reads it), joined by a dotted edge labelled with their peer
index. ``render_svg(dot, path)`` runs Graphviz's ``dot`` when it is installed.

``model.to_dot()`` and ``geode dump`` (``graph.dot`` in every dump dir) use it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from geode.compiler.fusion.groups import FusionPlan
from geode.compiler.ir import Graph, Value, ValueKind
from geode.compiler.partition.engine import NET_OUTPUT, EnginePartition
from geode.compiler.partition.placement import Placement
from geode.errors import GeodeError

#: Fill colour per engine.
ENGINE_COLORS: dict[str, str] = {
    "aicore": "#9ecae1",
    "aicpu": "#fdae6b",
    "host": "#c7e9c0",
    "alias": "#dadaeb",  # a view: no kernel, it shares its input's memory
    "commit": "#fcbba1",  # a variable's write when the run ends: no kernel
}
UNPLACED_COLOR = "#ffffff"
DEAD_COLOR = "#e0e0e0"
INPUT_COLOR = "#74c476"
OUTPUT_COLOR = "#fdd0a2"
CONST_COLOR = "#f0f0f0"
#: Largest constant whose values are printed in its label.
CONST_VALUES_SHOWN = 4


class GraphvizError(GeodeError):
    """Graphviz's ``dot`` is not installed or could not render a picture."""


@dataclass
class Cluster:
    """A box drawn around some ops: a fusion group or a compiled kernel."""

    name: str
    label: str
    nodes: list[str] = field(default_factory=list)
    engine: str | None = None


def clusters_from_plan(plan: FusionPlan) -> list[Cluster]:
    """One cluster per fusion group of a plan."""
    return [
        Cluster(
            f"group_{g.id}",
            f"group {g.id} [{g.pattern_name()}]",
            [n.name for n in g.nodes],
            "aicore",
        )
        for g in plan.groups
    ]


def clusters_from_kernels(kernels: Sequence[Any]) -> list[Cluster]:
    """One cluster per native kernel (objects with ``name``, ``ops``, ``engine``)."""
    return [
        Cluster(k.name, f"{k.name} [{k.engine}]", [n.name for n in k.ops], k.engine)
        for k in kernels
        if k.engine == "aicore" and k.ops
    ]


def _q(s: object) -> str:
    """A DOT double-quoted string."""
    text = str(s).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{text}"'


def _desc(v: Value) -> str:
    return str(v.desc)


def _const_label(v: Value) -> str:
    data = v.data
    if data is not None and getattr(data, "size", CONST_VALUES_SHOWN + 1) <= CONST_VALUES_SHOWN:
        vals = ", ".join(
            f"{x:g}" if isinstance(x, float) else str(x) for x in data.ravel().tolist()
        )
        return f"{v.name}\n{_desc(v)}\n= [{vals}]" if data.ndim else f"{v.name}\n= {vals}"
    return f"{v.name}\n{_desc(v)}"


def to_dot(
    graph: Graph,
    placement: Placement | None = None,
    fusion_plan: FusionPlan | Sequence[Cluster] | None = None,
    *,
    kernels: Sequence[Any] | None = None,
    title: str | None = None,
    show_constants: bool = True,
    engine_partition: EnginePartition | None = None,
) -> str:
    """Graphviz DOT of ``graph``.

    ``placement`` colours ops by engine and dashes unknown-shape ops; ``fusion_plan``
    (a :class:`FusionPlan` or a list of :class:`Cluster`) draws a cluster per group.
    ``kernels`` (``model.kernels``: objects with ``name``, ``ops``, ``engine``) gives
    the engine each op really runs on, marks ops no kernel runs as dead, and draws a
    cluster per native kernel when no ``fusion_plan`` is given. ``engine_partition``
    draws the engine subgraphs and their PlaceHolder/End nodes (module docstring).
    """
    if isinstance(fusion_plan, FusionPlan):
        clusters = clusters_from_plan(fusion_plan)
    elif fusion_plan is not None:
        clusters = list(fusion_plan)
    elif kernels is not None:
        clusters = clusters_from_kernels(kernels)
    else:
        clusters = []

    engine: dict[str, str] = dict(placement.engine) if placement is not None else {}
    reason: Mapping[str, str] = placement.reason if placement is not None else {}
    unknown: Mapping[str, bool] = placement.unknown_shape if placement is not None else {}
    run_by: dict[str, str] = {}
    if kernels is not None:
        for k in kernels:
            for n in k.ops:
                engine[n.name] = k.engine
                run_by[n.name] = k.name

    ids: dict[str, str] = {}  # op node name -> dot id
    for i, n in enumerate(graph.nodes):
        ids[n.name] = f"op{i}"
    val_ids: dict[int, str] = {}  # id(Value) of inputs/constants -> dot id
    for i, v in enumerate(graph.inputs):
        val_ids[id(v)] = f"in{i}"
    consts = [
        v for v in graph.values.values() if v.kind in (ValueKind.CONSTANT, ValueKind.VARIABLE)
    ]
    used = {id(v) for n in graph.nodes for v in n.inputs if v is not None} | {
        id(v) for v in graph.outputs
    }
    if show_constants:
        for i, v in enumerate(c for c in consts if id(c) in used):
            val_ids[id(v)] = f"c{i}"

    name = title or graph.name
    lines = [
        f"digraph {_q(name)} {{",
        f"  graph [label={_q(name)}, labelloc=t, fontname=Helvetica, rankdir=TB, compound=true];",
        "  node [fontname=Helvetica, fontsize=10];",
        '  edge [fontname=Helvetica, fontsize=8, color="#555555"];',
    ]

    def op_stmt(n: Any) -> str:
        eng = engine.get(n.name)
        dead = kernels is not None and n.name not in run_by
        styles = ["filled"]
        if dead:
            styles.append("dotted")
        elif unknown.get(n.name):
            styles.append("dashed")
        color = DEAD_COLOR if dead else ENGINE_COLORS.get(eng or "", UNPLACED_COLOR)
        label = f"{n.op_type}\n{n.name}" + ("\n(dead)" if dead else "")
        tip = f"{n.op_type} {n.name}"
        if eng:
            tip += f" on {eng}"
        if n.name in reason:
            tip += f": {reason[n.name]}"
        return (
            f"{ids[n.name]} [label={_q(label)}, shape=box, style={_q(','.join(styles))}, "
            f"fillcolor={_q(color)}, tooltip={_q(tip)}];"
        )

    by_name = {n.name: n for n in graph.nodes}
    kernel_boxes: list[tuple[int, Cluster, list[str]]] = []
    clustered: set[str] = set()
    for ci, c in enumerate(clusters):
        members = [m for m in c.nodes if m in ids and m not in clustered]
        if members:
            clustered.update(members)
            kernel_boxes.append((ci, c, members))

    def box_lines(boxes: list[tuple[int, Cluster, list[str]]], loose: list[str], pad: str):
        return _box_lines(boxes, [op_stmt(by_name[m]) for m in loose], pad, op_stmt, by_name)

    loose = [n.name for n in graph.nodes if n.name not in clustered]
    if engine_partition is None:
        lines += box_lines(kernel_boxes, loose, "  ")
        lines += _value_lines(graph, consts, val_ids)
        lines += _edge_lines(graph, ids, val_ids)
    else:
        sub_of = engine_partition.subgraph_of()
        for sg in engine_partition.subgraphs:
            boxes = [b for b in kernel_boxes if sub_of.get(b[2][0]) == sg.index]
            mine = [m for m in loose if sub_of.get(m) == sg.index]
            lines += _subgraph_lines(sg, box_lines(boxes, mine, "    "), graph, val_ids)
        lines += box_lines([], [m for m in loose if m not in sub_of], "  ")
        lines += _value_lines(graph, consts, val_ids, inputs=False)
        lines += _boundary_edges(graph, ids, val_ids, engine_partition)
    dead = kernels is not None and len(run_by) < len(ids)
    lines += _legend_lines(
        sorted({e for e in engine.values() if e} | ({"dead"} if dead else set()))
    )
    lines.append("}")
    return "\n".join(lines) + "\n"


def _box_lines(
    boxes: list[tuple[int, Cluster, list[str]]],
    loose: list[str],
    pad: str,
    op_stmt: Any,
    by_name: Mapping[str, Any],
) -> list[str]:
    """A cluster per kernel box (its ops inside), then the ``loose`` op statements."""
    out = []
    for ci, c, members in boxes:
        out.append(f"{pad}subgraph cluster_{ci} {{")
        out.append(f'{pad}  label={_q(c.label)}; style="rounded"; color="#3182bd"; fontsize=10;')
        out += [f"{pad}  " + op_stmt(by_name[m]) for m in members]
        out.append(f"{pad}}}")
    return out + [pad + stmt for stmt in loose]


def _boundary_edges(
    graph: Graph, ids: dict[str, str], val_ids: dict[int, str], part: EnginePartition
) -> list[str]:
    """The edges of an engine-partitioned picture: End -> PlaceHolder pairs (dotted,
    labelled with their peer index), then every value's edges routed through them."""
    lines = [
        f"  end{b.peer_index} -> ph{b.peer_index} [style=dotted, label={_q('#' + str(b.peer_index))}];"
        for b in part.boundaries
        if b.target != NET_OUTPUT
    ]
    routes = {(b.value, b.target): b.peer_index for b in part.boundaries}
    sub_of = {**part.subgraph_of(), **{v.name: 0 for v in graph.inputs}}
    return lines + _edge_lines(graph, ids, val_ids, routes, sub_of)


def _input_line(v: Value, val_ids: dict[int, str]) -> str:
    return (
        f"{val_ids[id(v)]} [label={_q(v.name + chr(10) + _desc(v))}, shape=ellipse, "
        f"style=filled, fillcolor={_q(INPUT_COLOR)}];"
    )


def _subgraph_lines(sg: Any, body: list[str], graph: Graph, val_ids: dict[int, str]) -> list[str]:
    """An engine subgraph's box: its ops and kernel boxes (``body``), the inputs for
    subgraph 0, and a PlaceHolder node per value it reads from another subgraph and an
    End node per value it hands on."""
    lines = [f"  subgraph cluster_sg{sg.index} {{"]
    label = f"subgraph {sg.index} [{sg.engine}]"
    lines.append(f'    label={_q(label)}; style="dashed"; color="#636363"; fontsize=11;')
    if sg.index == 0:
        lines += ["    " + _input_line(v, val_ids) for v in graph.inputs]
    lines += body
    for b in sg.placeholders:
        lines.append(
            f"    ph{b.peer_index} [label={_q(f'PlaceHolder #{b.peer_index}' + chr(10) + b.value)}, "
            'shape=house, style=filled, fillcolor="#ffffff", fontsize=8];'
        )
    for b in sg.ends:
        lines.append(
            f"    end{b.peer_index} [label={_q(f'End #{b.peer_index}' + chr(10) + b.value)}, "
            'shape=invhouse, style=filled, fillcolor="#ffffff", fontsize=8];'
        )
    lines.append("  }")
    return lines


def _value_lines(
    graph: Graph, consts: list[Value], val_ids: dict[int, str], inputs: bool = True
) -> list[str]:
    """DOT nodes of the graph's inputs (unless ``inputs`` is false: they are drawn in
    subgraph 0), drawn constants and variables, and outputs."""
    lines = ["  " + _input_line(v, val_ids) for v in graph.inputs] if inputs else []
    for v in consts:
        if id(v) in val_ids:
            kind = "variable" if v.kind is ValueKind.VARIABLE else "constant"
            lines.append(
                f"  {val_ids[id(v)]} [label={_q(_const_label(v))}, shape=note, style=filled, "
                f"fillcolor={_q(CONST_COLOR)}, fontsize=8, tooltip={_q(kind)}];"
            )
    for i, v in enumerate(graph.outputs):
        lines.append(
            f"  out{i} [label={_q(v.name + chr(10) + _desc(v))}, shape=ellipse, "
            f"peripheries=2, style=filled, fillcolor={_q(OUTPUT_COLOR)}];"
        )
    return lines


def _edge_lines(
    graph: Graph,
    ids: dict[str, str],
    val_ids: dict[int, str],
    routes: Mapping[tuple[str, int], int] | None = None,
    sub_of: Mapping[str, int] | None = None,
) -> list[str]:
    """DOT edges: each value from its producer (or its own node) to its readers. With
    an engine partition (``routes``: (value, reading subgraph) -> peer index; ``sub_of``:
    op or input name -> its subgraph), a value that crosses subgraphs runs from its
    producer to its End and from the paired PlaceHolder to its readers; a model output
    from its End."""
    routes = routes or {}
    sub_of = sub_of or {}

    def source(v: Value) -> str | None:
        if v.producer is not None and v.producer.name in ids:
            return ids[v.producer.name]
        return val_ids.get(id(v))

    lines = []
    ended: set[int] = set()

    def via(v: Value, src: str, peer: int | None) -> str:
        if peer is None:
            return src
        if peer not in ended:
            ended.add(peer)
            lines.append(f"  {src} -> end{peer} [label={_q(_desc(v))}];")
        return f"end{peer}"

    for n in graph.nodes:
        for v in n.inputs:
            if v is None:
                continue
            src = source(v)
            if src is None:
                continue
            peer = routes.get((v.name, sub_of.get(n.name, -2)))
            if peer is not None:
                via(v, src, peer)
                src = f"ph{peer}"
            lines.append(f"  {src} -> {ids[n.name]} [label={_q(_desc(v))}];")
    outs = {value: peer for (value, target), peer in routes.items() if target == NET_OUTPUT}
    for i, v in enumerate(graph.outputs):
        src = source(v)
        if src is not None:
            lines.append(f"  {via(v, src, outs.get(v.name))} -> out{i};")
    return lines


def _legend_lines(present: list[str]) -> list[str]:
    """A legend cluster with one box per engine shown (and "dead"), or nothing."""
    if not present:
        return []
    lines = ["  subgraph cluster_legend {"]
    lines.append('    label="engines"; style="rounded,dashed"; color="#999999"; fontsize=9;')
    prev = None
    for e in present:
        color = DEAD_COLOR if e == "dead" else ENGINE_COLORS.get(e, UNPLACED_COLOR)
        lid = f"legend_{e}"
        lines.append(
            f"    {lid} [label={_q(e)}, shape=box, style=filled, fillcolor={_q(color)}, fontsize=9];"
        )
        if prev is not None:
            lines.append(f"    {prev} -> {lid} [style=invis];")
        prev = lid
    lines.append("  }")
    return lines


def have_dot() -> bool:
    """Whether Graphviz's ``dot`` program is on the PATH."""
    return shutil.which("dot") is not None


def render_svg(dot: str, path: str | os.PathLike[str], timeout: float = 60.0) -> Path:
    """Render DOT text to an SVG file with Graphviz's ``dot``; the file's path.

    Raises :class:`GraphvizError` when ``dot`` is not installed (``apt install
    graphviz``) or rejects the input.
    """
    exe = shutil.which("dot")
    if exe is None:
        raise GraphvizError(
            "Graphviz 'dot' is not installed (e.g. apt install graphviz); no SVG written"
        )
    out = Path(path)
    try:
        proc = subprocess.run(
            [exe, "-Tsvg", "-o", str(out)],
            input=dot.encode(),
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GraphvizError(f"dot failed on {out}: {exc}") from None
    if proc.returncode != 0:
        msg = proc.stderr.decode(errors="replace").strip().splitlines()
        raise GraphvizError(f"dot failed on {out}: {msg[0] if msg else f'exit {proc.returncode}'}")
    return out
