"""Weights packed once: which native MatMuls multiply by a packed copy of their constant
``B``, and that copy as a derived constant of the model.

A float32 MatMul (plain, or a GEMM with a fused epilogue) whose ``B`` is a constant
matrix takes geode's packed-weight kernel (``runtime/native/sgemm_packed.c``) instead of
the BLAS, which packs ``B`` into its kernel's layout on every call: ``B`` is packed once,
here, into column panels of 16 (:func:`geode.runtime.native.pack_weight`), and the step
reads the packed copy, a constant of its own (:class:`PackedWeight`, named
``<B>#packed16``) that the plan registers in the session's VarManager like any other
weight. The BLAS path is kept when the option ``packed_weights`` is off, when the CPU lacks
AVX2 + FMA (the kernel's plain C path is slower than the BLAS), or when ``B`` is not such a
constant. Every choice is recorded (:attr:`PackChoice.text`, printed by ``explain()``).

The rule follows ``bench/packed_gemm.py`` (its figures: ``docs/performance.md``): the
packed kernel ran the models' products (``M`` = 1 to 2048 rows against their ``K x N``
weights) faster than ``geode_gemm`` (the BLAS per block, or geode's thin kernel) from
``M = 32`` up and as fast at ``M = 1`` (a GEMV: both stream ``B``); ``M`` is most often
known only at run time (a batch, a sequence), so there is one rule for every ``M``.

A native LSTM (:mod:`geode.codegen.backends.llvm.lstm`) whose ``W`` and ``R`` are such
constants takes them packed once too (:func:`choose_lstm_packing`): ``W`` per direction
transposed for the packed-weight GEMM of its input projection (form ``lstm_w``, named
``<W>#lstm_w16``), ``R`` per direction in the panels its steps multiply by (form
``lstm_r<lanes>``, :func:`lstm_panels`, named ``<R>#lstm_r<lanes>``); otherwise the LSTM
packs them on every call.

A model file keeps the original weight (in its graph) and re-packs it when loaded: its
units name a packed input as ``{"packed": <weight's name>}``, with ``"form"`` when it is
not the GEMM's (:func:`packed_value`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from geode.compiler.ir import TensorDesc, Value, ValueKind
from geode.config import Options
from geode.errors import CodegenError

__all__ = [
    "PACKED_SUFFIX",
    "PackChoice",
    "PackedWeight",
    "choose_lstm_packing",
    "choose_packing",
    "lstm_panels",
    "packed_value",
]

#: the packed copy's name: its weight's name then this
PACKED_SUFFIX = "#packed16"
#: what the rule rests on (``explain()`` prints it with each choice)
BASIS = (
    "measured by bench/packed_gemm.py: faster than the BLAS from M = 32 up, as fast at M = 1 "
    "(docs/performance.md)"
)
_ISA = {0: "plain C", 1: "AVX2+FMA", 2: "AVX-512F"}


class PackedWeight(Value):
    """A constant weight ``source`` packed in ``form`` (:func:`packed_value`; ``gemm``: a
    float32 ``K x N`` matrix for the packed-weight GEMM, of shape ``(ceil(N / 16), K,
    16)``): a derived constant, not a node's value in the graph (only a step reads it)."""

    def __init__(self, source: Value, data: np.ndarray, form: str = "gemm"):
        desc = TensorDesc(np.float32, tuple(int(d) for d in data.shape))
        name = source.name + _suffix(form)
        super().__init__(source.graph, name, desc, ValueKind.CONSTANT)
        self.data = data
        self.source = source
        self.form = form


def _suffix(form: str) -> str:
    """The name suffix of a copy packed in ``form``."""
    return PACKED_SUFFIX if form == "gemm" else "#" + form + ("16" if form == "lstm_w" else "")


@dataclass(frozen=True)
class PackChoice:
    """How one MatMul takes its weight: ``packed`` (geode's packed-weight kernel) or not
    (the BLAS), with the shape class, the reason and its basis as ``text``."""

    packed: bool
    text: str
    #: the weight's columns (the packed kernel fixes them)
    n: int = 0


def _isa() -> int:
    from geode.runtime import native

    return int(native.pool_info()["gemm_packed_isa"])


def _blas(why: str) -> PackChoice:
    return PackChoice(False, f"B through the BLAS (packed on every call): {why}")


def choose_packing(a: Value, b: Value, opts: Options) -> PackChoice:
    """Whether ``A @ B`` multiplies by ``B`` packed once (see the module docstring)."""
    if not opts.packed_weights:
        return _blas("option packed_weights is off")
    if np.dtype(a.dtype) != np.float32 or np.dtype(b.dtype) != np.float32:
        return _blas(f"{np.dtype(a.dtype)} operands (the packed kernel is float32)")
    shape = b.shape
    if not b.is_constant or (b.data is None and _loader(b) is None):
        return _blas(f"B {b.name!r} is not a constant known at compile time")
    if shape is None or len(shape) != 2 or not all(isinstance(d, int) for d in shape):
        return _blas(f"B {b.name!r} is not a matrix of known size")
    k, n = shape
    if n < 1:
        return _blas("B has no columns")
    isa = _isa()
    if isa < 1:
        return _blas("this CPU has no AVX2 + FMA (the packed kernel's plain C path is slower)")
    panels = -(-n // 16)
    text = (
        f"B {b.name!r} {k}x{n} float32 packed once into {panels} panels of 16 columns "
        f"({panels * k * 16 * 4} bytes, constant {b.name + PACKED_SUFFIX!r}); geode's "
        f"packed-weight kernel ({_ISA[isa]}) for every M; {BASIS}"
    )
    return PackChoice(True, text, n)


def choose_lstm_packing(w: Value, r: Value, opts: Options, lanes: int) -> PackChoice:
    """Whether a float32 native LSTM takes its ``W`` and ``R`` packed once (see the module
    docstring; ``lanes``: the hidden units of one of R's panels): both constants known at
    compile time, the option ``packed_weights`` on and a CPU with AVX2 + FMA (the input
    projection's packed-weight GEMM)."""
    if not opts.packed_weights:
        return _per_call("option packed_weights is off")
    if np.dtype(w.dtype) != np.float32:
        return _per_call(f"{np.dtype(w.dtype)} weights (packed once: float32)")
    for v in (w, r):
        if not v.is_constant or (v.data is None and _loader(v) is None):
            return _per_call(f"{v.name!r} is not a constant known at compile time")
    isa = _isa()
    if isa < 1:
        return _per_call("this CPU has no AVX2 + FMA (the packed kernel's plain C path)")
    return PackChoice(
        True,
        f"W {w.name!r} and R {r.name!r} float32 packed once, into constants "
        f"{w.name + _suffix('lstm_w')!r} (the input projection, by geode's packed-weight "
        f"kernel ({_ISA[isa]})) and {r.name + _suffix(f'lstm_r{lanes}')!r} (the steps' "
        f"panels of {lanes} units); no packing per call",
    )


def _per_call(why: str) -> PackChoice:
    return PackChoice(False, f"W and R packed on every call: {why}")


def lstm_panels(r: np.ndarray, lanes: int) -> np.ndarray:
    """An LSTM's ``R`` (``[D, 4H, K]``) in the panels its steps multiply by (the layout of
    :mod:`geode.codegen.backends.llvm.lstm_panels`): per direction, panel ``p`` of
    ``lanes`` hidden units (units past ``H`` zero) as 2 groups of 2 gates, a group
    ``[k][gate][unit]``; shape ``(D, ceil(H / lanes) * 4 * lanes * K)``."""
    d, g4, k = r.shape
    hid = g4 // 4
    panels = -(-hid // lanes)
    padded = np.zeros((d, 4, panels * lanes, k), np.float32)
    padded[:, :, :hid] = r.reshape(d, 4, hid, k)
    # (D, group, gate in group, panel, unit, k) -> (D, panel, group, k, gate in group, unit)
    tiles = padded.reshape(d, 2, 2, panels, lanes, k).transpose(0, 3, 1, 5, 2, 4)
    return np.ascontiguousarray(tiles).reshape(d, -1)


def _pack(data: np.ndarray, form: str) -> np.ndarray:
    """``data`` packed in ``form`` (see :func:`packed_value`)."""
    from geode.runtime import native

    if form == "gemm" and data.ndim == 2:
        return native.pack_weight(data)
    if form == "lstm_w" and data.ndim == 3:
        return np.stack([native.pack_weight(m, transposed=True) for m in data])
    if form.startswith("lstm_r") and form[6:].isdigit() and data.ndim == 3:
        if data.shape[1] != 4 * data.shape[2]:
            raise ValueError("not an LSTM's R")
        return lstm_panels(data, int(form[6:]))
    raise ValueError(f"no packed form {form!r} of a {data.ndim}-D weight")


def _loader(b: Value):  # -> Callable[[], np.ndarray] | None
    """The loader of a constant whose data is in an external file (read when called)."""
    return getattr(b, "external_loader", None)


#: the attribute of a weight's Value holding its packed copies by form (one per weight
#: and form, however many steps read it; they live as long as the weight's graph)
_PACKED_ATTR = "_geode_packed_copies"


def packed_value(b: Value, form: str = "gemm") -> PackedWeight:
    """``b`` (a float32 constant, its data in the graph or in an external file) packed in
    ``form``: ``gemm``, a matrix for the packed-weight GEMM; ``lstm_w``, an LSTM's ``W``
    (``[D, 4H, I]``), each direction's transpose for it; ``lstm_r<lanes>``, an LSTM's
    ``R`` in panels (:func:`lstm_panels`). Its :class:`PackedWeight`, made on the first
    call and the same object on the next (a weight that several steps read is packed and
    registered once). Raises :class:`~geode.errors.CodegenError` when ``b`` has no such
    data (and the loader's error when its file is not what it was)."""
    copies = b.__dict__.setdefault(_PACKED_ATTR, {})
    if form in copies:
        return copies[form]
    loader = _loader(b)
    data = b.data if b.data is not None or loader is None else loader()
    if data is None or np.asarray(data).dtype != np.float32:
        raise CodegenError(f"weight {b.name!r} cannot be packed: not float32 data")
    try:
        packed = PackedWeight(b, _pack(np.asarray(data), form), form)
    except ValueError as exc:
        raise CodegenError(f"weight {b.name!r} cannot be packed ({form}): {exc}") from None
    copies[form] = packed
    return packed
