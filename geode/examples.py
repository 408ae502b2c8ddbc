"""Built-in example graphs, built with the Python API, each with a numpy twin.

Used by ``geode demo``, the tests and the benchmarks. Every builder takes the sizes of
its static dims and leaves the batch (and sequence) dims symbolic, so one compiled
model serves every batch size.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from geode.compiler.frontend import builder as ops
from geode.compiler.ir import Graph


@dataclass
class Example:
    """A graph, a numpy function computing the same outputs, and an input maker."""

    name: str
    graph: Graph
    numpy: Callable[..., dict[str, np.ndarray]]
    make_inputs: Callable[[np.random.Generator, int], dict[str, np.ndarray]]


def _randn(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape, dtype=np.float32)


def rmsnorm(hidden: int = 768, eps: float = 1e-6) -> Example:
    """RMSNorm from primitives: x / sqrt(mean(x^2) + eps) * w."""
    g = Graph("rmsnorm")
    x = g.input("x", ["N", hidden])
    w = g.constant(np.linspace(0.5, 1.5, hidden, dtype=np.float32), name="weight")
    ms = ops.reduce_mean(ops.pow(x, 2.0), axes=[-1], keepdims=1)
    y = x / ops.sqrt(ms + eps) * w
    g.output(y, names=["y"])
    wv = g.values["weight"].data

    def ref(x: np.ndarray) -> dict[str, np.ndarray]:
        return {"y": x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(eps)) * wv}

    return Example("rmsnorm", g, ref, lambda rng, n: {"x": _randn(rng, n, hidden)})


def layernorm(hidden: int = 768, eps: float = 1e-5) -> Example:
    """LayerNorm from primitives: (x - mean) / sqrt(var + eps) * gamma + beta."""
    g = Graph("layernorm")
    x = g.input("x", ["N", hidden])
    gamma = g.constant(np.linspace(0.5, 1.5, hidden, dtype=np.float32), name="gamma")
    beta = g.constant(np.linspace(-0.1, 0.1, hidden, dtype=np.float32), name="beta")
    mean = ops.reduce_mean(x, axes=[-1], keepdims=1)
    d = x - mean
    var = ops.reduce_mean(d * d, axes=[-1], keepdims=1)
    y = d / ops.sqrt(var + eps) * gamma + beta
    g.output(y, names=["y"])
    gv, bv = g.values["gamma"].data, g.values["beta"].data

    def ref(x: np.ndarray) -> dict[str, np.ndarray]:
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        return {"y": (x - m) / np.sqrt(v + np.float32(eps)) * gv + bv}

    return Example("layernorm", g, ref, lambda rng, n: {"x": _randn(rng, n, hidden)})


def softmax(hidden: int = 1000) -> Example:
    """Softmax over the last axis (the registry op; decomposition makes it primitives)."""
    g = Graph("softmax")
    x = g.input("x", ["N", hidden])
    g.output(ops.softmax(x, axis=-1), names=["y"])

    def ref(x: np.ndarray) -> dict[str, np.ndarray]:
        e = np.exp(x - x.max(-1, keepdims=True))
        return {"y": e / e.sum(-1, keepdims=True)}

    return Example("softmax", g, ref, lambda rng, n: {"x": _randn(rng, n, hidden)})


def gelu(hidden: int = 1024, approximate: str = "none", with_bias: bool = False) -> Example:
    """GELU (erf, or tanh approximation), optionally after a bias add."""
    g = Graph(f"gelu_{approximate}" + ("_bias" if with_bias else ""))
    x = g.input("x", ["N", hidden])
    bv = np.linspace(-0.5, 0.5, hidden, dtype=np.float32)
    h = x + g.constant(bv, name="bias") if with_bias else x
    if approximate == "tanh":
        c = math.sqrt(2.0 / math.pi)
        y = 0.5 * h * (1.0 + ops.tanh(c * (h + 0.044715 * h * h * h)))
    else:
        y = 0.5 * h * (1.0 + ops.erf(h * (1.0 / math.sqrt(2.0))))
    g.output(y, names=["y"])

    def ref_np(x: np.ndarray) -> dict[str, np.ndarray]:
        h = (x + bv) if with_bias else x
        f = np.float32
        if approximate == "tanh":  # plain float32 numpy, as a numpy user would write it
            return {
                "y": f(0.5)
                * h
                * (f(1) + np.tanh(f(math.sqrt(2 / math.pi)) * (h + f(0.044715) * h * h * h)))
            }
        # numpy has no erf: math.erf per element (float64), rounded once
        h64 = h.astype(np.float64)
        y = 0.5 * h64 * (1 + np.vectorize(math.erf)(h64 / math.sqrt(2)))
        return {"y": y.astype(np.float32)}

    return Example(g.name, g, ref_np, lambda rng, n: {"x": _randn(rng, n, hidden)})


def silu(hidden: int = 1024) -> Example:
    """SiLU: x * sigmoid(x)."""
    g = Graph("silu")
    x = g.input("x", ["N", hidden])
    g.output(x * ops.sigmoid(x), names=["y"])

    def ref(x: np.ndarray) -> dict[str, np.ndarray]:
        return {"y": x / (1 + np.exp(-x))}

    return Example("silu", g, ref, lambda rng, n: {"x": _randn(rng, n, hidden)})


def lstm_cell(input_size: int = 64, hidden: int = 128) -> Example:
    """One LSTM cell step: gates = [x, h] @ W + b; i, f, g, o; c' = f*c + i*g; h' = o*tanh(c')."""
    rng = np.random.default_rng(7)
    g = Graph("lstm_cell")
    x = g.input("x", ["N", input_size])
    h = g.input("h", ["N", hidden])
    c = g.input("c", ["N", hidden])
    wx = g.constant(
        (rng.standard_normal((input_size, 4 * hidden)) * 0.1).astype(np.float32), name="wx"
    )
    wh = g.constant((rng.standard_normal((hidden, 4 * hidden)) * 0.1).astype(np.float32), name="wh")
    b = g.constant((rng.standard_normal(4 * hidden) * 0.1).astype(np.float32), name="b")
    gates = ops.matmul(x, wx) + ops.matmul(h, wh) + b
    i, f, gg, o = ops.split(gates, axis=1, num_outputs=4)
    c2 = ops.sigmoid(f) * c + ops.sigmoid(i) * ops.tanh(gg)
    h2 = ops.sigmoid(o) * ops.tanh(c2)
    g.output(h2, c2, names=["h_out", "c_out"])
    wxv, whv, bv = (g.values[k].data for k in ("wx", "wh", "b"))

    def sig(z: np.ndarray) -> np.ndarray:
        return 1 / (1 + np.exp(-z))

    def ref(x: np.ndarray, h: np.ndarray, c: np.ndarray) -> dict[str, np.ndarray]:
        z = x @ wxv + h @ whv + bv
        zi, zf, zg, zo = np.split(z, 4, axis=1)
        c2 = sig(zf) * c + sig(zi) * np.tanh(zg)
        return {"h_out": sig(zo) * np.tanh(c2), "c_out": c2}

    def make(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
        return {
            "x": _randn(rng, n, input_size),
            "h": _randn(rng, n, hidden),
            "c": _randn(rng, n, hidden),
        }

    return Example("lstm_cell", g, ref, make)


def lstm_gates(hidden: int = 128) -> Example:
    """The LSTM cell's gate math alone: gates [N, 4H] and c [N, H] -> h', c'."""
    g = Graph("lstm_gates")
    z = g.input("gates", ["N", 4 * hidden])
    c = g.input("c", ["N", hidden])
    i, f, gg, o = ops.split(z, axis=1, num_outputs=4)
    c2 = ops.sigmoid(f) * c + ops.sigmoid(i) * ops.tanh(gg)
    h2 = ops.sigmoid(o) * ops.tanh(c2)
    g.output(h2, c2, names=["h_out", "c_out"])

    def sig(t: np.ndarray) -> np.ndarray:
        return 1 / (1 + np.exp(-t))

    def ref(gates: np.ndarray, c: np.ndarray) -> dict[str, np.ndarray]:
        zi, zf, zg, zo = np.split(gates, 4, axis=1)
        c2 = sig(zf) * c + sig(zi) * np.tanh(zg)
        return {"h_out": sig(zo) * np.tanh(c2), "c_out": c2}

    def make(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
        return {"gates": _randn(rng, n, 4 * hidden), "c": _randn(rng, n, hidden)}

    return Example("lstm_gates", g, ref, make)


def attention(d_model: int = 64, heads: int = 4) -> Example:
    """Single-layer multi-head self-attention over [B, S, D] with symbolic B and S."""
    rng = np.random.default_rng(11)
    dh = d_model // heads
    g = Graph("attention")
    x = g.input("x", ["B", "S", d_model])
    w = {
        k: g.constant(
            (rng.standard_normal((d_model, d_model)) / math.sqrt(d_model)).astype(np.float32),
            name=k,
        )
        for k in ("wq", "wk", "wv", "wo")
    }

    def heads_of(t: object) -> object:
        t = ops.reshape(t, [0, 0, heads, dh])
        return ops.transpose(t, perm=[0, 2, 1, 3])

    q = heads_of(ops.matmul(x, w["wq"]))
    k = heads_of(ops.matmul(x, w["wk"]))
    v = heads_of(ops.matmul(x, w["wv"]))
    scores = ops.matmul(q, ops.transpose(k, perm=[0, 1, 3, 2])) * (1.0 / math.sqrt(dh))
    p = ops.softmax(scores, axis=-1)
    ctx = ops.transpose(ops.matmul(p, v), perm=[0, 2, 1, 3])
    ctx = ops.reshape(ctx, [0, 0, d_model])
    g.output(ops.matmul(ctx, w["wo"]), names=["y"])
    wv_ = {k: g.values[k].data for k in w}

    def ref(x: np.ndarray) -> dict[str, np.ndarray]:
        b, s, _ = x.shape

        def hs(t: np.ndarray) -> np.ndarray:
            return t.reshape(b, s, heads, dh).transpose(0, 2, 1, 3)

        qq, kk, vv = hs(x @ wv_["wq"]), hs(x @ wv_["wk"]), hs(x @ wv_["wv"])
        sc = qq @ kk.transpose(0, 1, 3, 2) / np.float32(math.sqrt(dh))
        e = np.exp(sc - sc.max(-1, keepdims=True))
        pp = e / e.sum(-1, keepdims=True)
        c = (pp @ vv).transpose(0, 2, 1, 3).reshape(b, s, d_model)
        return {"y": c @ wv_["wo"]}

    return Example("attention", g, ref, lambda rng, n: {"x": _randn(rng, n, 2 * n + 1, d_model)})


def reduce_chain(inner: int = 1024) -> Example:
    """X*2 -> +1 -> ReduceSum(last axis) -> *2 -> broadcast back -> +1, over [S1, S2, inner]."""
    g = Graph("reduce_chain")
    x = g.input("x", ["S1", "S2", inner])
    a = x * 2.0 + 1.0
    s = ops.reduce_sum(a, axes=[-1], keepdims=1) * 2.0
    g.output(ops.expand(s, ops.shape(x)) + 1.0, names=["y"])

    def ref(x: np.ndarray) -> dict[str, np.ndarray]:
        s = (x * 2 + 1).sum(-1, keepdims=True) * 2
        return {"y": np.broadcast_to(s, x.shape) + np.float32(1)}

    return Example("reduce_chain", g, ref, lambda rng, n: {"x": _randn(rng, n, 3, inner)})


ALL: dict[str, Callable[[], Example]] = {
    "rmsnorm": rmsnorm,
    "layernorm": layernorm,
    "softmax": softmax,
    "gelu": gelu,
    "gelu_tanh": lambda: gelu(approximate="tanh"),
    "bias_gelu_tanh": lambda: gelu(approximate="tanh", with_bias=True),
    "silu": silu,
    "lstm_cell": lstm_cell,
    "lstm_gates": lstm_gates,
    "attention": attention,
    "reduce_chain": reduce_chain,
}
