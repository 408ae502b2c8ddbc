"""Graphviz pictures: DOT structure (always), SVG rendering (when ``dot`` is installed)."""

from __future__ import annotations

import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import geode
from geode import examples, ops, viz
from geode.codegen.lower import make_can_lower
from geode.compiler.fusion.planner import plan_fusion
from geode.compiler.fusion.profit import make_profit
from geode.compiler.partition.placement import place
from geode.compiler.pipeline import run_pipeline
from geode.costmodel.device import default_spec

HAVE_DOT = shutil.which("dot") is not None
needs_dot = pytest.mark.skipif(
    not HAVE_DOT,
    reason="Graphviz 'dot' is not installed: SVG rendering not checked "
    "(the DOT text is still checked structurally)",
)
_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.getbasetemp() / "geode_cache"
    d.mkdir(exist_ok=True)
    return d


def planned(graph: geode.Graph):
    g = graph.copy()
    g.infer_shapes()
    run_pipeline(g)
    g.sort()
    placement = place(g)
    plan = plan_fusion(g, placement, make_can_lower(g), make_profit(default_spec()))
    return g, placement, plan


def unquote(s: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), s[1:-1])


def parse_dot(text: str) -> dict:
    """A structural reading of DOT text: balanced braces, declared nodes, edges, clusters, labels."""
    bare = _QUOTED.sub('""', text)
    depth = 0
    for ch in bare:
        depth += {"{": 1, "}": -1}.get(ch, 0)
        assert depth >= 0, "a '}' closes nothing"
    assert depth == 0, "unbalanced braces"
    assert bare.lstrip().startswith("digraph")
    labels: dict[str, str] = {}
    for m in re.finditer(r'^\s*(\w+) \[label=("(?:[^"\\]|\\.)*")', text, re.M):
        labels[m.group(1)] = unquote(m.group(2))
    edges = re.findall(r"^\s*(\w+) -> (\w+)", bare, re.M)
    clusters: dict[str, list[str]] = {}
    open_clusters: list[str] = []  # nested: a node belongs to every cluster around it
    for line in text.splitlines():
        m = re.match(r"\s*subgraph (cluster_\w+) \{", line)
        if m:
            open_clusters.append(m.group(1))
            clusters[m.group(1)] = []
            continue
        if open_clusters and line.strip() == "}":
            open_clusters.pop()
            continue
        m = re.match(r"\s*(\w+) \[label=", line)
        if m:
            for c in open_clusters:
                clusters[c].append(m.group(1))
    for a, b in edges:
        assert a in labels and b in labels, f"edge {a} -> {b} names an undeclared node"
    return {"labels": labels, "edges": edges, "clusters": clusters}


def op_ids(parsed: dict, node_name: str) -> list[str]:
    return [
        i
        for i, lab in parsed["labels"].items()
        if i.startswith("op") and lab.split("\n")[1:2] == [node_name]
    ]


def test_clusters_engines_and_every_node():
    g, placement, plan = planned(examples.attention().graph)
    dot = viz.to_dot(g, placement, plan)
    parsed = parse_dot(dot)
    fusion = {
        k: v
        for k, v in parsed["clusters"].items()
        if k != "cluster_legend" and not k.startswith("cluster_sg")
    }
    assert len(fusion) == len(plan.groups) >= 2
    for n in g.nodes:  # every op once, inside its group's cluster when it has one
        (i,) = op_ids(parsed, n.name)
        grp = plan.group_of(n.name)
        inside = [c for c, members in fusion.items() if i in members]
        assert len(inside) == (1 if grp is not None else 0), n.name
    groups_of_cluster = {
        c: {plan.group_of(parsed["labels"][m].split("\n")[1]).id for m in ms}
        for c, ms in fusion.items()
    }
    assert all(len(ids) == 1 for ids in groups_of_cluster.values())
    # engines as colours, with a legend naming each engine used
    assert (
        f'fillcolor="{viz.ENGINE_COLORS["aicpu"]}"' in dot
        and f'fillcolor="{viz.ENGINE_COLORS["aicore"]}"' in dot
    )
    legend = {parsed["labels"][i] for i in parsed["clusters"]["cluster_legend"]}
    assert legend == set(placement.engine.values()) == {"aicore", "aicpu"}
    # inputs, outputs, constants styled and connected
    assert re.search(r'in0 \[label="x\\nfloat32\[B, S, 64\]", shape=ellipse', dot)
    assert re.search(r"out0 \[label=\"y\\n[^\"]*\", shape=ellipse, peripheries=2", dot)
    assert "shape=note" in dot and {b for _, b in parsed["edges"] if b.startswith("out")} == {
        "out0"
    }
    matmul = op_ids(parsed, "matmul")[0]
    assert ("in0", matmul) in parsed["edges"]
    assert 'tooltip="MatMul matmul on aicpu' in dot


def test_plain_graph_and_escaping(tmp_path):
    g = geode.Graph('we"ird\\name')
    x = g.input('in "q"', ["N", 3])
    g.output(ops.exp(x) + 1.0, names=["out\\1"])
    dot = viz.to_dot(g)
    parsed = parse_dot(dot)
    assert parsed["clusters"] == {}  # no placement, no plan: no clusters, no legend
    assert parsed["labels"]["in0"] == 'in "q"\nfloat32[N, 3]'
    assert parsed["labels"]["out0"].startswith("out\\1\n")
    assert dot.startswith('digraph "we\\"ird\\\\name" {')
    if HAVE_DOT:
        svg = viz.render_svg(dot, tmp_path / "w.svg")
        assert ET.parse(svg).getroot().tag.endswith("svg")


def test_kernels_mark_engines_and_dead_ops():
    g, placement, _ = planned(examples.layernorm(hidden=8).graph)
    nodes = list(g.nodes)
    kernels = [
        SimpleNamespace(name="fused_0", ops=nodes[:-2], engine="aicore"),
        SimpleNamespace(name=nodes[-2].name, ops=[nodes[-2]], engine="aicpu"),
    ]
    parsed = parse_dot(dot := viz.to_dot(g, placement, kernels=kernels))
    assert [len(v) for k, v in parsed["clusters"].items() if k != "cluster_legend"] == [
        len(nodes) - 2
    ]
    assert parsed["labels"][op_ids(parsed, nodes[-1].name)[0]].endswith("(dead)")
    assert {parsed["labels"][i] for i in parsed["clusters"]["cluster_legend"]} == {
        "aicore",
        "aicpu",
        "dead",
    }
    (fallback,) = op_ids(parsed, nodes[-2].name)
    assert re.search(rf'{fallback} \[[^\n]*fillcolor="{viz.ENGINE_COLORS["aicpu"]}"', dot)


def test_compiled_model_gives_its_dot(cache_dir):
    g = geode.Graph("mlp_softmax")
    x = g.input("x", ["N", 8])
    h = ops.relu(x * 2.0) @ g.constant(np.eye(8, dtype=np.float32), name="w")
    g.output(ops.trilu(ops.softmax(h, axis=-1)), names=["y"])
    model = geode.compile(g, cache_dir=str(cache_dir), progress="0")
    dot = model.to_dot()
    parsed = parse_dot(dot)
    native = [k for k in model.kernels if k.engine == "aicore"]  # fused and library
    fusion = {
        k: v
        for k, v in parsed["clusters"].items()
        if k != "cluster_legend" and not k.startswith("cluster_sg")
    }
    assert len(fusion) == len(native) >= 2
    labels = {unquote(m) for m in re.findall(r'label=("(?:[^"\\]|\\.)*");', dot)}
    for k in native:
        assert any(lab.startswith(f"{k.name} [") for lab in labels), k.name
    for k in model.kernels:
        for n in k.ops:
            assert len(op_ids(parsed, n.name)) == 1
    assert {k.engine for k in model.kernels} == {"aicore", "aicpu"}
    legend = {parsed["labels"][i] for i in parsed["clusters"]["cluster_legend"]}
    assert legend == {"aicore", "aicpu"}


def test_a_view_run_as_an_alias_is_coloured_as_one(cache_dir):
    g = geode.Graph("view_between_matmuls")
    x = g.input("x", ["N", 8])
    h = x @ g.constant(np.eye(8, dtype=np.float32), name="w")
    g.output(ops.reshape(h, [0, 2, 4]) @ g.constant(np.ones((4, 3), np.float32), name="v"))
    model = geode.compile(g, cache_dir=str(cache_dir), progress="0")
    dot = model.to_dot()
    parsed = parse_dot(dot)
    (view,) = op_ids(parsed, "reshape")
    assert not parsed["labels"][view].endswith("(dead)")
    assert re.search(rf'{view} \[[^\n]*fillcolor="{viz.ENGINE_COLORS["alias"]}"', dot)
    assert "alias" in {parsed["labels"][i] for i in parsed["clusters"]["cluster_legend"]}


@needs_dot
def test_render_svg(tmp_path):
    g, placement, plan = planned(examples.softmax(hidden=16).graph)
    path = viz.render_svg(viz.to_dot(g, placement, plan), tmp_path / "g.svg")
    root = ET.parse(path).getroot()
    assert root.tag.endswith("svg")
    ns = {"s": "http://www.w3.org/2000/svg"}
    clusters = root.findall(".//s:g[@class='cluster']", ns)
    assert len(clusters) == len(plan.groups) + 1  # + the legend
    titles = {t.text for t in root.findall(".//s:g[@class='node']/s:title", ns)}
    assert {f"op{i}" for i in range(len(g.nodes))} <= titles


def test_render_svg_without_dot(monkeypatch, tmp_path):
    monkeypatch.setattr(viz.shutil, "which", lambda name: None)
    assert not viz.have_dot()
    with pytest.raises(viz.GraphvizError, match="'dot' is not installed"):
        viz.render_svg("digraph g {}", tmp_path / "g.svg")
    assert not (tmp_path / "g.svg").exists()


@needs_dot
def test_render_svg_rejects_bad_dot(tmp_path):
    with pytest.raises(viz.GraphvizError, match="dot failed"):
        viz.render_svg("digraph {", tmp_path / "bad.svg")


def test_engine_subgraphs_with_placeholder_and_end_nodes(cache_dir):
    g = geode.Graph("engines")
    x = g.input("x", ["N", 8])
    a = ops.exp(x) * 2.0
    nz = ops.cast(ops.non_zero(a > 3.0), to=1)  # host, then aicore again
    g.output(ops.sigmoid(nz), ops.tanh(a), names=["z", "b"])
    model = geode.compile(g, cache_dir=str(cache_dir), progress="0")
    parsed = parse_dot(model.to_dot())
    boxes = {k: v for k, v in parsed["clusters"].items() if k.startswith("cluster_sg")}
    assert sorted(boxes) == ["cluster_sg0", "cluster_sg1", "cluster_sg2", "cluster_sg3"]
    labels = parsed["labels"]
    assert [labels[i] for i in boxes["cluster_sg0"]] == ["x\nfloat32[N, 8]", "End #0\nx"]
    (nonzero,) = op_ids(parsed, "nonzero")
    assert nonzero in boxes["cluster_sg2"]
    (exp,) = op_ids(parsed, "exp")
    assert exp in boxes["cluster_sg1"]
    # every crossing runs producer -> End -> PlaceHolder -> reader, End and PlaceHolder
    # in the boxes of the producer and of the reader
    edges = set(parsed["edges"])
    ends = sorted(i for i in labels if i.startswith("end"))
    phs = sorted(i for i in labels if i.startswith("ph"))
    assert len(ends) == len(phs) + 2  # + the two model outputs' Ends
    for ph in phs:
        peer = ph[2:]
        assert (f"end{peer}", ph) in edges
        assert labels[ph].startswith(f"PlaceHolder #{peer}\n")
        src = next(k for k, v in boxes.items() if f"end{peer}" in v)
        dst = next(k for k, v in boxes.items() if ph in v)
        assert src != dst
    assert any(a == nonzero and b.startswith("end") for a, b in edges)
    assert not any(a == exp and b == nonzero for a, b in edges)  # no direct crossing edge
    assert {b for _, b in edges if b.startswith("out")} == {"out0", "out1"}
    assert all(a.startswith("end") for a, b in edges if b.startswith("out"))
