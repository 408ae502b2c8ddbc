"""Legality (``compiler/fusion/online.py``) and profitability (``compiler/fusion/profit.py:
online_plan``) of attention with a key-tiled (online) softmax, on epilogues built by hand
as the Softmax decomposition writes them: the accepted forms, and every refusal with its
reason."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from geode.compiler.fusion.online import online_legality
from geode.compiler.fusion.profit import epilogue_plan, online_plan
from geode.compiler.ir import Graph, Node, Value
from geode.costmodel.device import default_spec

F32 = np.float32


class Epi:
    """An attention epilogue over scores ``s [2, 8, 8]`` built node by node: ``nodes`` in
    order, ``roles`` by value name, ``v`` the second MatMul's right operand."""

    def __init__(self, dtype: type = F32) -> None:
        self.g = Graph("epi")
        self.dtype = dtype
        self.s = self.g.input("s", [2, 8, 8], dtype)
        self.v = self.g.input("v", [2, 8, 4], dtype)
        self.nodes: list[Node] = []
        self.roles: dict[str, str] = {"s": "acc"}
        self.ax = self.g.constant(np.array([-1], np.int64), name="ax")

    def const(self, x: float, name: str) -> Value:
        c = self.g.constant(np.array(x, self.dtype), name=name)
        self.roles[c.name] = "scalar"
        return c

    def op(self, op: str, ins: list[Value], role: str = "full", **attrs: object) -> Value:
        n = self.g.add_node(op, ins, attrs)
        self.nodes.append(n)
        self.roles[n.outputs[0].name] = role
        return n.outputs[0]

    def softmax(self, x: Value, clamp: float | None = 0.0) -> Value:
        """The decomposition's softmax of ``x`` over the last axis (``Min`` at ``clamp``)."""
        m = self.op("ReduceMax", [x, self.ax], "col", keepdims=1)
        d = self.op("Sub", [x, m])
        if clamp is not None:
            d = self.op("Min", [d, self.const(clamp, "lim")])
        e = self.op("Exp", [d])
        return self.op("Div", [e, self.op("ReduceSum", [e, self.ax], "col", keepdims=1)])

    def check(self, p: Value) -> object:
        """``p @ v`` appended (not an epilogue node), then the legality's answer."""
        self.g.add_node("MatMul", [p, self.v], {})
        return online_legality(self.nodes, self.roles, self.s, p)


def test_plain_softmax_is_legal():
    e = Epi()
    got = e.check(e.softmax(e.s))
    assert not isinstance(got, str), got
    assert got.x is e.s and got.pre == ()
    assert [n.op_type for n in got.softmax] == [
        "ReduceMax",
        "Sub",
        "Min",
        "Exp",
        "ReduceSum",
        "Div",
    ]
    assert "per element before it: none" in got.describe()


@pytest.mark.parametrize("mask", ["add", "where", "where_lower", "cast_row", "none"])
def test_scale_and_masks_are_per_element(mask):
    e = Epi()
    x = e.op("Mul", [e.s, e.const(0.125, "scale")])
    if mask == "add":  # an additive mask of the scores' shape
        m = e.g.input("mask", [8, 8], F32)
        e.roles["mask"] = "bfull"
        x = e.op("Add", [x, m])
    elif mask.startswith("where"):  # Where(bool, -inf, s) / Where(bool, s, -inf)
        b = e.g.input("mask", [8, 8], np.bool_)
        e.roles["mask"] = "bfull"
        ninf = e.const(-np.inf, "ninf")
        x = e.op("Where", [b, ninf, x] if mask == "where" else [b, x, ninf])
    elif mask == "cast_row":  # a padding mask per key, cast from float64
        m = e.g.input("mask", [2, 1, 8], np.float64)
        e.roles["mask"] = "brow"
        mc = e.op("Cast", [m], "brow", to=1)
        x = e.op("Add", [x, mc])
    got = e.check(e.softmax(x))
    assert not isinstance(got, str), got
    assert got.x is x and len(got.pre) >= 1
    assert got.pre[0].op_type == "Mul"


def test_no_clamp_and_a_cast_after():
    e = Epi()
    p = e.op("Cast", [e.softmax(e.s, clamp=None)], to=1)
    got = e.check(p)
    assert not isinstance(got, str), got
    assert got.softmax[-1].op_type == "Cast"


def _refused(build, why: str) -> None:
    e = Epi()
    got = build(e)
    assert isinstance(got, str), got
    assert why in got, got


def test_refusals():
    """Every form the key-tiled softmax cannot compute keeps the row panels, with why."""
    _refused(lambda e: e.check(e.op("Relu", [e.s])), "the softmax needs Div where it has Relu")

    def centred(e: Epi) -> object:  # a reduction over the scores before the softmax
        mean = e.op("ReduceMean", [e.s, e.ax], "col", keepdims=1)
        return e.check(e.softmax(e.op("Sub", [e.s, mean])))

    _refused(centred, "ReduceMean ")
    _refused(
        lambda e: e.check(e.softmax(e.op("Abs", [e.s]))), "not a per-element op the form takes"
    )

    def read_twice(e: Epi) -> object:  # x kept beside the softmax
        x = e.op("Mul", [e.s, e.const(2.0, "two")])
        p = e.softmax(x)
        return e.check(e.op("Add", [p, x]))

    _refused(read_twice, "the softmax needs Div where it has Add")

    def x_elsewhere(e: Epi) -> object:  # the softmax's input also read by another op
        x = e.op("Mul", [e.s, e.const(2.0, "two")])
        e.op("Neg", [x])
        return e.check(e.softmax(x))

    _refused(x_elsewhere, "read by more than its max and difference")

    _refused(lambda e: e.check(e.softmax(e.s, clamp=-1.0)), "clamps other than at a constant >= 0")

    def other_max(e: Epi) -> object:  # x - max(y)
        y = e.op("Mul", [e.s, e.const(2.0, "two")])
        m = e.op("ReduceMax", [y, e.ax], "col", keepdims=1)
        ex = e.op("Exp", [e.op("Sub", [e.s, m])])
        return e.check(e.op("Div", [ex, e.op("ReduceSum", [ex, e.ax], "col", keepdims=1)]))

    _refused(other_max, "subtracts the row max of another value")

    def other_sum(e: Epi) -> object:  # exp(x - m) / sum(exp(2 x))
        m = e.op("ReduceMax", [e.s, e.ax], "col", keepdims=1)
        ex = e.op("Exp", [e.op("Sub", [e.s, m])])
        e2 = e.op("Exp", [e.op("Mul", [e.s, e.const(2.0, "two")])])
        return e.check(e.op("Div", [ex, e.op("ReduceSum", [e2, e.ax], "col", keepdims=1)]))

    _refused(other_sum, "divides by the row sum of another value")

    def max_not_per_row(e: Epi) -> object:  # the max's role is not a value per row
        p = e.softmax(e.s)
        e.roles[e.nodes[0].outputs[0].name] = "full"
        return e.check(p)

    _refused(max_not_per_row, "not one value per query row")

    def exp_kept(e: Epi) -> object:  # the exp read by another op too
        p = e.softmax(e.s)
        e.op("Neg", [next(n for n in e.nodes if n.op_type == "Exp").outputs[0]])
        return e.check(p)

    _refused(exp_kept, "(the exp) is read by more than the row sum and division")

    def p_twice(e: Epi) -> object:
        p = e.softmax(e.s)
        e.g.add_node("Neg", [p], {})
        return e.check(p)

    _refused(p_twice, "is read by more than the second MatMul")


def test_float16_scores_are_refused():
    e = Epi(np.float16)
    got = e.check(e.softmax(e.s))
    assert isinstance(got, str) and "not float32 or float64" in got, got


def _attention(seq: int, depth: int = 64, dtype: type = F32) -> tuple[Node, Node]:
    g = Graph("attn")
    q = g.input("q", [1, 4, seq, depth], dtype)
    kt = g.input("kt", [1, 4, depth, seq], dtype)
    v = g.input("v", [1, 4, seq, depth], dtype)
    first = g.add_node("MatMul", [q, kt], {})
    second = g.add_node("MatMul", [first.outputs[0], v], {})
    return first, second


@pytest.mark.parametrize("l2", [1 << 20, 2 << 20])
def test_online_pays_past_the_l2_share(l2):
    """Taken exactly when the row-panel path's panel of scores is past half a core's L2."""
    spec = dataclasses.replace(default_spec(), l2_bytes=l2, cores=2)
    for seq in (16, 64, 256, 512, 1024, 2048, 4096, 8192):
        for dtype in (F32, np.float64):
            first, second = _attention(seq, dtype=dtype)
            rows, _ = epilogue_plan(first, spec, second)
            pays, why = online_plan(first, second, spec)
            big = rows * seq * np.dtype(dtype).itemsize > l2 // 2
            assert pays == big, (seq, why)
            assert (f"{rows} query rows x {seq} keys") in why
            assert ("blocks of 256 x 1024" in why) == pays
    assert online_plan(*_attention(8192), spec)[0]  # long sequences take it on any L2
    assert not online_plan(*_attention(16), spec)[0]
