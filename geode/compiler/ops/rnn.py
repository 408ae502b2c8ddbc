"""Recurrent layers: RNN, GRU and LSTM (ONNX opset 14/22 semantics).

Shared conventions (ONNX): ``X`` is ``(seq_length, batch, input_size)`` (``layout=0``)
or ``(batch, seq_length, input_size)`` (``layout=1``); ``W`` is ``(num_directions,
gates*hidden, input_size)``, ``R`` is ``(num_directions, gates*hidden, hidden)``, ``B``
is ``(num_directions, 2*gates*hidden)`` (input then recurrence biases). Gate orders:
GRU ``z, r, h``; LSTM ``i, o, f, c``. ``direction`` is forward, reverse or
bidirectional (two directions, outputs stacked on the direction axis).

Outputs: ``Y`` ``(seq_length, num_directions, batch, hidden)`` (``layout=1``:
``(batch, seq_length, num_directions, hidden)``), ``Y_h`` (and LSTM's ``Y_c``) the
last state ``(num_directions, batch, hidden)`` (``layout=1``: batch first).

``sequence_lens`` limits each batch entry's steps: positions past its length output
zeros and its last state is the state at its last step (a reverse direction starts at
its own last step). ``activations`` (with ``activation_alpha``/``activation_beta``,
consumed in order by the functions that take them) replace the default functions;
``clip`` bounds every gate's input to the activation. float16 computes in float32.

They run on the AICPU engine (OpKind.LIBRARY); the input projection of every step is
one matmul over the whole sequence, the recurrence a loop over time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from geode.compiler import dtypes
from geode.compiler.ir import TensorDesc
from geode.compiler.ops.registry import Attr, In, InferContext, OpDef, OpKind, Out, register
from geode.errors import ShapeError, VerifyError

Act = Callable[[np.ndarray], np.ndarray]

#: activation functions: name -> (takes alpha, takes beta, default alpha, default beta)
ACTIVATIONS: dict[str, tuple[bool, bool, float, float]] = {
    "relu": (False, False, 0.0, 0.0),
    "tanh": (False, False, 0.0, 0.0),
    "sigmoid": (False, False, 0.0, 0.0),
    "softsign": (False, False, 0.0, 0.0),
    "softplus": (False, False, 0.0, 0.0),
    "affine": (True, True, 1.0, 0.0),
    "leakyrelu": (True, False, 0.01, 0.0),
    "thresholdedrelu": (True, False, 1.0, 0.0),
    "scaledtanh": (True, True, 1.0, 1.0),
    "hardsigmoid": (True, True, 0.2, 0.5),
    "elu": (True, False, 1.0, 0.0),
}

#: (number of gates, default activations per direction) per op
CELLS: dict[str, tuple[int, tuple[str, ...]]] = {
    "RNN": (1, ("Tanh",)),
    "GRU": (3, ("Sigmoid", "Tanh")),
    "LSTM": (4, ("Sigmoid", "Tanh", "Tanh")),
}


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def activation(name: str, alpha: float, beta: float) -> Act:
    """The activation function ``name`` (case-insensitive) with its parameters."""
    n = name.lower()
    if n == "relu":
        return lambda x: np.maximum(x, 0)
    if n == "tanh":
        return np.tanh
    if n == "sigmoid":
        return lambda x: 1.0 / (1.0 + np.exp(-x))
    if n == "softsign":
        return lambda x: x / (1 + np.abs(x))
    if n == "softplus":
        return lambda x: np.logaddexp(0, x)
    if n == "affine":
        return lambda x: alpha * x + beta
    if n == "leakyrelu":
        return lambda x: np.where(x >= 0, x, alpha * x)
    if n == "thresholdedrelu":
        return lambda x: np.where(x > alpha, x, 0)
    if n == "scaledtanh":
        return lambda x: alpha * np.tanh(beta * x)
    if n == "hardsigmoid":
        return lambda x: np.clip(alpha * x + beta, 0, 1)
    if n == "elu":
        return lambda x: np.where(x >= 0, x, alpha * np.expm1(np.minimum(x, 0)))
    raise ShapeError(f"unknown activation function {name!r}")


def activations_for(op: str, attrs: dict[str, Any], n_dirs: int) -> list[list[Act]]:
    """The activation functions of each direction, with their alpha/beta parameters."""
    per_dir = len(CELLS[op][1])
    names = [_s(a) for a in (attrs.get("activations") or [])] or list(CELLS[op][1]) * n_dirs
    if len(names) == per_dir and n_dirs == 2:
        names = names * 2
    if len(names) != per_dir * n_dirs:
        raise ShapeError(f"{op}: {len(names)} activations given, expected {per_dir * n_dirs}")
    alphas = [float(np.float32(a)) for a in (attrs.get("activation_alpha") or [])]
    betas = [float(np.float32(b)) for b in (attrs.get("activation_beta") or [])]
    fns = []
    for name in names:
        spec = ACTIVATIONS.get(name.lower())
        if spec is None:
            raise ShapeError(f"{op}: unknown activation function {name!r}")
        takes_a, takes_b, da, db = spec
        a = alphas.pop(0) if takes_a and alphas else da
        b = betas.pop(0) if takes_b and betas else db
        fns.append(activation(name, a, b))
    return [fns[d * per_dir : (d + 1) * per_dir] for d in range(n_dirs)]


def _clipper(clip: float | None) -> Callable[[np.ndarray], np.ndarray]:
    if clip is None:
        return lambda x: x
    c = float(np.float32(clip))
    return lambda x: np.clip(x, -c, c)


def run_direction(
    op: str,
    xw: np.ndarray,
    r: np.ndarray,
    rb: np.ndarray,
    h0: np.ndarray,
    c0: np.ndarray | None,
    p: np.ndarray | None,
    lens: np.ndarray,
    reverse: bool,
    acts: Sequence[Act],
    attrs: dict[str, Any],
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """One direction over time: xw is the input projection (T, B, G*H) with the input
    bias; returns (Y (T, B, H), last hidden (B, H), last cell (B, H) or None)."""
    t_len, batch, _ = xw.shape
    hid = h0.shape[-1]
    clip = _clipper(attrs.get("clip"))
    h, c = h0.copy(), None if c0 is None else c0.copy()
    y = np.zeros((t_len, batch, hid), dtype=xw.dtype)
    rows = np.arange(batch)
    for s in range(t_len):
        valid = s < lens
        t_idx = np.where(valid, lens - 1 - s, 0) if reverse else np.full(batch, s)
        x_t = xw[t_idx, rows]  # (B, G*H)
        if op == "RNN":
            h_new = acts[0](clip(x_t + h @ r.T + rb))
        elif op == "GRU":
            f, g = acts
            zr = clip(x_t[:, : 2 * hid] + h @ r[: 2 * hid].T + rb[: 2 * hid])
            z, rr = f(zr[:, :hid]), f(zr[:, hid:])
            rh, rbh = r[2 * hid :], rb[2 * hid :]
            if int(attrs.get("linear_before_reset") or 0):
                cand = g(clip(x_t[:, 2 * hid :] + rr * (h @ rh.T + rbh)))
            else:
                cand = g(clip(x_t[:, 2 * hid :] + (rr * h) @ rh.T + rbh))
            h_new = (1 - z) * cand + z * h
        else:  # LSTM, gates i, o, f, c
            f, g, hact = acts
            gates = x_t + h @ r.T + rb
            gi, go, gf, gc = (gates[:, k * hid : (k + 1) * hid] for k in range(4))
            pi, po, pf = (
                (np.zeros(hid), np.zeros(hid), np.zeros(hid))
                if p is None
                else (
                    p[:hid],
                    p[hid : 2 * hid],
                    p[2 * hid :],
                )
            )
            assert c is not None
            i = f(clip(gi + pi * c))
            fg = 1 - i if int(attrs.get("input_forget") or 0) else f(clip(gf + pf * c))
            c_new = fg * c + i * g(clip(gc))
            o = f(clip(go + po * c_new))
            h_new = o * hact(c_new)
            c = np.where(valid[:, None], c_new, c)
        h = np.where(valid[:, None], h_new, h)
        y[t_idx[valid], rows[valid]] = h_new[valid]
    return y, h, c


def recurrent(op: str, ins: list, attrs: dict[str, Any]) -> list[np.ndarray]:
    """RNN, GRU or LSTM on numpy arrays; returns [Y, Y_h] (+ [Y_c] for LSTM)."""
    n_gates = CELLS[op][0]

    def get(i: int) -> np.ndarray | None:
        """Input i, or None when omitted."""
        return None if i >= len(ins) or ins[i] is None else np.asarray(ins[i])

    x, w, r = get(0), get(1), get(2)
    assert x is not None and w is not None and r is not None
    out_dtype = x.dtype
    ct = np.float32 if x.dtype == np.float16 else x.dtype
    layout = int(attrs.get("layout") or 0)
    if layout:
        x = np.swapaxes(x, 0, 1)
    t_len, batch, _ = x.shape
    n_dirs, gh, _ = w.shape
    hid = int(attrs.get("hidden_size") or r.shape[-1])
    if gh != n_gates * hid:
        raise ShapeError(f"{op}: W has {gh} rows, expected {n_gates} gates x hidden_size {hid}")
    b = get(3)
    b = np.zeros((n_dirs, 2 * n_gates * hid), ct) if b is None else b.astype(ct)
    lens_in = get(4)
    lens = (
        np.full(batch, t_len, np.int64) if lens_in is None else lens_in.reshape(-1).astype(np.int64)
    )
    h0 = get(5)
    c0 = get(6) if op == "LSTM" else None
    p = get(7) if op == "LSTM" else None
    if layout:
        h0 = None if h0 is None else np.swapaxes(h0, 0, 1)
        c0 = None if c0 is None else np.swapaxes(c0, 0, 1)
    h0 = np.zeros((n_dirs, batch, hid), ct) if h0 is None else h0.astype(ct)
    if op == "LSTM":
        c0 = np.zeros((n_dirs, batch, hid), ct) if c0 is None else c0.astype(ct)
    direction = _s(attrs.get("direction") or "forward")
    acts = activations_for(op, attrs, n_dirs)
    xs = x.astype(ct)
    ys, hs, cs = [], [], []
    for d in range(n_dirs):
        reverse = direction == "reverse" or (direction == "bidirectional" and d == 1)
        wd, rd = w[d].astype(ct), r[d].astype(ct)
        wb, rb = b[d, : n_gates * hid], b[d, n_gates * hid :]
        xw = xs @ wd.T + wb
        y, h, c = run_direction(
            op,
            xw,
            rd,
            rb,
            h0[d],
            None if c0 is None else c0[d],
            None if p is None else p[d].astype(ct),
            lens,
            reverse,
            acts[d],
            attrs,
        )
        ys.append(y)
        hs.append(h)
        cs.append(c)
    y_all = np.stack(ys, axis=1)  # (T, D, B, H)
    y_h = np.stack(hs, axis=0)  # (D, B, H)
    outs = [y_all, y_h]
    if op == "LSTM":
        outs.append(np.stack(cs, axis=0))
    if layout:
        outs = [np.transpose(outs[0], (2, 0, 1, 3))] + [np.swapaxes(o, 0, 1) for o in outs[1:]]
    return [np.ascontiguousarray(o).astype(out_dtype) for o in outs]


def _verify(op: str) -> Callable[[InferContext], None]:
    def verify(ctx: InferContext) -> None:
        """verify: direction, layout, ranks and activation names."""
        direction = _s(ctx.attr("direction"))
        if direction not in ("forward", "reverse", "bidirectional"):
            ctx.fail(
                f"direction {direction!r} is not forward, reverse or bidirectional", VerifyError
            )
        if int(ctx.attr("layout")) not in (0, 1):
            ctx.fail(f"layout must be 0 or 1, got {ctx.attr('layout')}", VerifyError)
        x, w = ctx.shape(0), ctx.shape(1)
        if x is not None and len(x) != 3:
            ctx.fail(f"X must be 3-D, got shape {list(x)}")
        if w is not None and len(w) != 3:
            ctx.fail(f"W must be 3-D, got shape {list(w)}")
        n_dirs = 2 if direction == "bidirectional" else 1
        if w is not None and isinstance(w[0], int) and w[0] != n_dirs:
            ctx.fail(f"W has {w[0]} directions, direction={direction!r} needs {n_dirs}")
        names = ctx.attr("activations")
        if names is not None:
            for n in names:
                if _s(n).lower() not in ACTIVATIONS:
                    ctx.fail(f"unknown activation function {_s(n)!r}", VerifyError)

    return verify


def _infer(op: str) -> Callable[[InferContext], list[TensorDesc]]:
    def infer(ctx: InferContext) -> list[TensorDesc]:
        """infer: Y, Y_h (and Y_c) from X's dims, the layout and hidden_size."""
        x, r = ctx.shape(0), ctx.shape(2)
        dtype = ctx.dtype(0)
        n_dirs = 2 if _s(ctx.attr("direction")) == "bidirectional" else 1
        hid = ctx.attr("hidden_size")
        h = int(hid) if hid is not None else (r[-1] if r is not None else ctx.fresh("hidden"))
        if x is None:
            t, b = ctx.fresh("seq"), ctx.fresh("batch")
        elif int(ctx.attr("layout")):
            b, t = x[0], x[1]
        else:
            t, b = x[0], x[1]
        if int(ctx.attr("layout")):
            y, state = (b, t, n_dirs, h), (b, n_dirs, h)
        else:
            y, state = (t, n_dirs, b, h), (n_dirs, b, h)
        outs = [TensorDesc(dtype, y), TensorDesc(dtype, state)]
        if op == "LSTM":
            outs.append(TensorDesc(dtype, state))
        return outs

    return infer


_COMMON_ATTRS = [
    Attr("activation_alpha", "floats", None),
    Attr("activation_beta", "floats", None),
    Attr("activations", "strings", None),
    Attr("clip", "float", None),
    Attr("direction", "string", "forward"),
    Attr("hidden_size", "int", None),
    Attr("layout", "int", 0),
]

_COMMON_INPUTS = [
    In("X", "T"),
    In("W", "T"),
    In("R", "T"),
    In("B", "T", optional=True),
    In("sequence_lens", "T1", optional=True),
    In("initial_h", "T", optional=True),
]

for _op, _extra_in, _extra_attrs, _outs in (
    ("RNN", [], [], [Out("Y", "T", optional=True), Out("Y_h", "T", optional=True)]),
    (
        "GRU",
        [],
        [Attr("linear_before_reset", "int", 0)],
        [Out("Y", "T", optional=True), Out("Y_h", "T", optional=True)],
    ),
    (
        "LSTM",
        [In("initial_c", "T", optional=True), In("P", "T", optional=True)],
        [Attr("input_forget", "int", 0)],
        [
            Out("Y", "T", optional=True),
            Out("Y_h", "T", optional=True),
            Out("Y_c", "T", optional=True),
        ],
    ),
):
    register(
        OpDef(
            _op,
            OpKind.LIBRARY,
            inputs=[*_COMMON_INPUTS, *_extra_in],
            outputs=_outs,
            types={"T": dtypes.FLOATS, "T1": frozenset([np.dtype(np.int32)])},
            attrs=[*_COMMON_ATTRS, *_extra_attrs],
            verify=_verify(_op),
            infer=_infer(_op),
            kernel=(lambda op: lambda ins, a: recurrent(op, ins, a))(_op),
            doc=f"{_op} layer over a sequence (forward, reverse or bidirectional)",
        )
    )

__all__ = ["ACTIVATIONS", "CELLS", "activation", "activations_for", "recurrent", "run_direction"]
