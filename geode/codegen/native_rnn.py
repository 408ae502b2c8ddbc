"""LSTM nodes as native AI Core steps (the bind stage asks :func:`rnn_interface` for
every LSTM placed on AICPU).

An LSTM goes native (:mod:`geode.codegen.backends.llvm.lstm`: the input projection of
every step at once, then per step the recurrent product and a vectorized gate loop, all
in one JIT-compiled call) when, with the LLVM backend and codegen on: X, W, R (and B,
initial_h, initial_c, P) and its outputs are all float32 or all float64; W's and R's shapes are static; the activations are the
default ones (Sigmoid, Tanh, Tanh), with no ``clip`` and no ``input_forget``; a
``sequence_lens`` input, when given, is int32; and the outputs' shapes follow from the graph inputs' symbols (a
dim known only once a value is computed cannot size a native step's output). Every
direction and both layouts are native. A float32 LSTM whose ``W`` and ``R`` are constants
takes them packed once, at compile time (or when its model file is loaded), as derived
constants of the model (:func:`~geode.codegen.packed_weights.choose_lstm_packing`; the
choice is its kernel's ``weights:`` line in ``explain()``), so a call packs nothing. Otherwise the node keeps the reference kernel
(:func:`geode.compiler.ops.rnn.recurrent`), and the placement records why.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from geode.codegen.backends.llvm.lstm import LstmSpec, item_panels_together, panel_lanes
from geode.codegen.driver import LibraryChoice, library_fallback, library_step, object_cache
from geode.codegen.packed_weights import choose_lstm_packing
from geode.compiler.ir import Graph, Node
from geode.compiler.shapes import free_symbols
from geode.config import Options
from geode.errors import CodegenError

__all__ = ["lstm_spec", "rnn_interface", "start_lstm"]

_DEFAULT_ACTS = ("sigmoid", "tanh", "tanh")


def _text(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _static(shape: object, rank: int) -> bool:
    return (
        isinstance(shape, tuple | list)
        and len(shape) == rank
        and all(isinstance(d, int) for d in shape)
    )


def lstm_spec(node: Node, g: Graph) -> LstmSpec | str:
    """The :class:`~geode.codegen.backends.llvm.lstm.LstmSpec` of an LSTM node, or a
    string saying why it cannot run natively (see the module docstring)."""
    ins = list(node.inputs) + [None] * (8 - len(node.inputs))
    x, w, r, bias, lens, h0, c0, p = ins[:8]
    if x is None or w is None or r is None:
        return "X, W or R is missing"
    dtype = str(np.dtype(x.dtype))
    if dtype not in ("float32", "float64"):
        return f"{dtype} (native: float32, float64)"
    present = [v for v in (w, r, bias, h0, c0, p, *node.outputs) if v is not None]
    if any(v.dtype != x.dtype for v in present):
        return "mixed dtypes"
    attrs = node.attrs
    if attrs.get("clip") is not None:
        return "clip (native: none)"
    if int(attrs.get("input_forget") or 0):
        return "input_forget (native: 0)"
    direction = _text(attrs.get("direction") or "forward")
    n_dirs = 2 if direction == "bidirectional" else 1
    acts = [_text(a).lower() for a in attrs.get("activations") or []]
    if acts and acts not in (list(_DEFAULT_ACTS), list(_DEFAULT_ACTS) * n_dirs):
        return f"activations {acts} (native: Sigmoid, Tanh, Tanh)"
    if lens is not None and str(np.dtype(lens.dtype)) != "int32":
        return f"sequence_lens of {np.dtype(lens.dtype)} (native: int32)"
    if x.shape is None or len(x.shape) != 3:
        return "X is not 3-D"
    if not _static(w.shape, 3) or not _static(r.shape, 3):
        return "W's or R's shape is not static"
    hidden = int(attrs.get("hidden_size") or r.shape[-1])
    if w.shape[1] != 4 * hidden or r.shape[1:] != (4 * hidden, hidden):
        return f"W or R does not hold 4 gates of hidden_size {hidden}"
    if w.shape[0] != n_dirs or r.shape[0] != n_dirs:
        return f"W or R does not hold {n_dirs} direction(s)"
    known = set().union(*(free_symbols(v.shape) for v in g.inputs if v.shape is not None))
    for out in node.outputs:
        if out.shape is None or not free_symbols(out.shape) <= known:
            return f"output {out.name!r}'s shape is known only at run time"
    try:
        return LstmSpec(
            dtype=dtype,
            hidden=hidden,
            input_size=w.shape[2],
            directions=n_dirs,
            reverse=direction == "reverse",
            layout=int(attrs.get("layout") or 0),
            bias=bias is not None,
            initial_h=h0 is not None,
            initial_c=c0 is not None,
            peephole=p is not None,
            n_outputs=len(node.outputs),
            lens=lens is not None,
        )
    except ValueError as exc:
        return str(exc)


def _native_lstm(node: Node, opts: Options) -> bool:
    """Whether ``node`` is an LSTM and native code is on (LLVM backend and codegen)."""
    if node.op_type != "LSTM" or node.domain not in ("", "ai.onnx"):
        return False
    return opts.backend == "llvm" and opts.codegen


def _packed(node: Node, spec: LstmSpec, opts: Options) -> tuple[LstmSpec, Any]:
    """``spec`` with its weights' panels when the packing choice packs them, and that
    choice."""
    from geode.codegen.backends.llvm.target import host

    lanes = panel_lanes(spec.dtype, host())
    choice = choose_lstm_packing(node.inputs[1], node.inputs[2], opts, lanes)
    if choice.packed:
        spec = dataclasses.replace(spec, panel_lanes=lanes)
    return spec, choice


def start_lstm(node: Node, g: Graph, opts: Options) -> str | None:
    """Start LLVM, on the background threads, on the module :func:`rnn_interface` will
    link for ``node`` (see ``native_conv.start_conv``): its IR, or None."""
    if not _native_lstm(node, opts):
        return None
    spec = lstm_spec(node, g)
    if isinstance(spec, str):
        return None
    from geode.codegen.backends.llvm.kernel import start_module
    from geode.codegen.backends.llvm.lstm import lstm_ir, vector_bytes
    from geode.codegen.backends.llvm.target import host

    spec, _ = _packed(node, spec, opts)
    target = host()
    args = (target.function_attrs, vector_bytes(target), target.vector_registers)
    name, ir = lstm_ir(spec, *args)
    start_module(name, ir, object_cache(opts))
    return ir


def rnn_interface(node: Node, g: Graph, opts: Options) -> LibraryChoice | None:
    """The native step of an LSTM node (see the module docstring): an
    :class:`LibraryChoice`, or None for a node that is not an LSTM or when native code is off
    (LLVM backend and codegen both needed)."""
    if not _native_lstm(node, opts):
        return None
    spec = lstm_spec(node, g)
    if isinstance(spec, str):
        return LibraryChoice(None, None, f"library op: reference kernel (LSTM: {spec})")
    from geode.codegen.backends.llvm.lstm import lstm_kernel

    spec, choice = _packed(node, spec, opts)
    try:
        kernel = lstm_kernel(spec, object_cache(opts))
    except CodegenError as exc:
        return library_fallback(node, exc)
    interface, info = library_step(node, kernel, spec.n_inputs, spec.describe(), opts)
    why = "library op: LSTM, native products and gate loop" + _together_note(spec)
    return LibraryChoice(interface, info, why, weights=choice.text)


def _together_note(spec: LstmSpec) -> str:
    """What :func:`rnn_interface`'s reason says of the steps' products at a small batch:
    an item of few rows takes all its panels of ``R`` in one pass over ``K``
    (``lstm.ITEM_PANELS_TOGETHER``: more independent chains of multiply-adds, where one
    panel's 4 at batch 1 are bound by their latency), or nothing when it never does on
    this target (or below the batch from which ``R`` is in panels at all)."""
    from geode.codegen.backends.llvm.lstm_panels import panel_rows
    from geode.codegen.backends.llvm.target import host

    target = host()
    lanes, block = panel_lanes(spec.dtype, target), panel_rows(target.vector_registers)
    panels, rows = item_panels_together(lanes, block, bool(spec.panel_lanes))
    if not rows:
        return ""
    return (
        f" (a step's items of at most {rows} batch rows: their {panels} panels of R in one "
        "pass, more independent chains)"
    )
