"""Legality of attention's operands read in place as heads of wider arrays
(``compiler/fusion/head_views.py``): which layout chains are views of heads, with what
offset, transposed or not, and why the others are not; what stays of a group once the
chains leave it."""

from __future__ import annotations

import numpy as np

import geode
from geode.compiler.fusion.groups import Group
from geode.compiler.fusion.head_views import (
    absorbable,
    operand_view,
    remaining_groups,
    result_view,
)

F32 = np.float32


def _heads(g, x, h, d, perm):
    r = g.op("Reshape", x, g.constant(np.array([0, 0, h, d], np.int64), g.unique_name("s")))
    return g.op("Transpose", r, perm=perm)


def _graph(width=8):
    g = geode.Graph("heads")
    x = g.input("x", ["B", "S", width], F32)
    return g, x


def test_heads_of_a_projection_are_a_view():
    g, x = _graph()
    q = _heads(g, x, 2, 4, [0, 2, 1, 3])
    g.output(g.op("MatMul", q, g.input("k", ["B", 2, 4, "S"], F32)))
    view = operand_view(q, "A", g)
    assert not isinstance(view, str), view
    assert (view.root, view.heads, view.depth, view.offset, view.transposed) == (x, 2, 4, 0, False)
    assert [n.op_type for n in view.nodes] == ["Reshape", "Transpose"]
    assert "A read in place from x (2 heads of 4;" in view.describe()


def test_k_transposed_is_a_view_only_as_b():
    g, x = _graph()
    kt = _heads(g, x, 2, 4, [0, 2, 3, 1])
    g.output(g.op("MatMul", g.input("q", ["B", 2, "S", 4], F32), kt))
    view = operand_view(kt, "B", g)
    assert not isinstance(view, str) and view.transposed
    assert "transposed" in view.describe()
    assert operand_view(kt, "A", g) == "A is read transposed (only B can be)"


def test_a_split_output_is_read_at_its_column_offset():
    g, x = _graph(24)
    parts = g.op(
        "Split", x, g.constant(np.array([8, 8, 8], np.int64), "sizes"), axis=2, n_outputs=3
    )
    v = _heads(g, parts[2], 2, 4, [0, 2, 1, 3])
    g.output(g.op("MatMul", g.input("p", ["B", 2, "S", "S"], F32), v))
    view = operand_view(v, "V", g)
    assert not isinstance(view, str)
    assert view.root is x and view.offset == 16
    assert [n.op_type for n in view.nodes] == ["Split", "Reshape", "Transpose"]
    assert "at column 16" in view.describe()


def test_refusals_say_why():
    g, x = _graph()
    t = _heads(g, x, 2, 4, [0, 1, 2, 3])  # no swap: the heads are not before the rows
    g.output(g.op("MatMul", t, g.input("y", ["B", "S", 4, 3], F32)))
    assert "does not put the heads before the rows" in operand_view(t, "A", g)
    g2, x2 = _graph()
    q2 = _heads(g2, x2, 2, 4, [0, 2, 1, 3])
    g2.output(g2.op("MatMul", q2, g2.input("k", ["B", 2, 4, "S"], F32)), q2)
    assert operand_view(q2, "A", g2) == "A is not a transpose read by the product alone"
    assert "is not a transpose" in operand_view(x2, "A", g2)


def test_the_result_written_back_to_rows():
    g = geode.Graph("out")
    o = g.op("MatMul", g.input("p", ["B", 2, "S", "S"], F32), g.input("v", ["B", 2, "S", 4], F32))
    rows = g.op(
        "Reshape",
        g.op("Transpose", o, perm=[0, 2, 1, 3]),
        g.constant(np.array([0, 0, 8], np.int64), "rows"),
    )
    g.output(rows)
    view = result_view(o, g)
    assert not isinstance(view, str), view
    assert view.root is rows and (view.heads, view.depth) == (2, 4)
    assert "O written in place into" in view.describe()
    g2 = geode.Graph("out2")
    o2 = g2.op(
        "MatMul", g2.input("p", ["B", 2, "S", "S"], F32), g2.input("v", ["B", 2, "S", 4], F32)
    )
    g2.output(g2.op("Transpose", o2, perm=[0, 1, 3, 2]))
    assert result_view(o2, g2) == "the result's transpose does not swap the heads and the rows"


def test_what_stays_of_a_group_splits_into_its_parts():
    """Two bias Adds the planner put side by side, each before its heads' layout nodes:
    with the layout nodes gone, each Add is a group of its own over its rows."""
    g, x = _graph()
    y = g.input("y", ["B", "S", 8], F32)
    a = g.op("Add", x, g.constant(np.ones(8, F32), "ba"))
    b = g.op("Add", y, g.constant(np.ones(8, F32), "bb"))
    qa, qb = _heads(g, a, 2, 4, [0, 2, 1, 3]), _heads(g, b, 2, 4, [0, 2, 1, 3])
    g.output(g.op("MatMul", qa, g.op("Transpose", qb, perm=[0, 1, 3, 2])))
    nodes = [n for n in g.nodes if n.op_type in ("Add", "Reshape", "Transpose")][:6]
    group = Group(3, nodes, ("B", 2, "S", 4))
    taken = {n.name for n in nodes if n.op_type != "Add"}
    left = remaining_groups(group, taken, g)
    assert [[n.op_type for n in p.nodes] for p in left] == [["Add"], ["Add"]]
    assert left[0].id == 3 and [str(d) for d in left[0].domain] == ["B", "S", "8"]
    assert remaining_groups(group, set(), g) == [group]
    assert remaining_groups(group, {n.name for n in nodes}, g) == []
    reshape = next(n for n in nodes if n.op_type == "Reshape")
    assert not absorbable(reshape, set(), set(), g)
    readers = {c.name for c in reshape.outputs[0].consumers}
    assert absorbable(reshape, readers, set(), g)


def test_the_cost_model_weighs_the_copies_against_the_gather():
    """Copies (read and written once) and their kernels saved against a transposed
    operand gathered while the BLAS packs it (one more read)."""
    from geode.compiler.fusion.profit import head_view_plan
    from geode.costmodel.device import default_spec

    g = geode.Graph("cost")
    k = g.input("k", [8, 4, 64, 256], F32)
    spec = default_spec()
    take, why = head_view_plan([k], 1, spec, [k])
    assert take and why.startswith("saves"), why
    take, why = head_view_plan([], 0, spec, [k])
    assert not take, why
