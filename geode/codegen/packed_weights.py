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

A model file keeps the original ``B`` (in its graph) and re-packs it when loaded: its
units name a packed input as ``{"packed": <B's name>}`` (:func:`packed_value`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from geode.compiler.ir import TensorDesc, Value, ValueKind
from geode.config import Options
from geode.errors import CodegenError

__all__ = ["PACKED_SUFFIX", "PackChoice", "PackedWeight", "choose_packing", "packed_value"]

#: the packed copy's name: its weight's name then this
PACKED_SUFFIX = "#packed16"
#: what the rule rests on (``explain()`` prints it with each choice)
BASIS = (
    "measured by bench/packed_gemm.py: faster than the BLAS from M = 32 up, as fast at M = 1 "
    "(docs/performance.md)"
)
_ISA = {0: "plain C", 1: "AVX2+FMA", 2: "AVX-512F"}


class PackedWeight(Value):
    """A constant weight ``source`` (float32 ``K x N``) packed for the packed-weight GEMM:
    a derived constant of shape ``(ceil(N / 16), K, 16)``, not a node's value in the graph
    (only a step reads it)."""

    def __init__(self, source: Value, data: np.ndarray):
        desc = TensorDesc(np.float32, tuple(int(d) for d in data.shape))
        super().__init__(source.graph, source.name + PACKED_SUFFIX, desc, ValueKind.CONSTANT)
        self.data = data
        self.source = source


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


def _loader(b: Value):  # -> Callable[[], np.ndarray] | None
    """The loader of a constant whose data is in an external file (read when called)."""
    return getattr(b, "external_loader", None)


#: the attribute of a weight's Value holding its packed copy (one per weight, however
#: many MatMuls read it; it lives as long as the weight's graph)
_PACKED_ATTR = "_geode_packed_copy"


def packed_value(b: Value) -> PackedWeight:
    """``b`` (a float32 constant matrix, its data in the graph or in an external file)
    packed: its :class:`PackedWeight`, made on the first call and the same object on the
    next (a weight that several MatMuls read is packed and registered once). Raises
    :class:`~geode.errors.CodegenError` when ``b`` has no such data (and the loader's
    error when its file is not what it was)."""
    from geode.runtime import native

    done = getattr(b, _PACKED_ATTR, None)
    if done is not None:
        return done
    loader = _loader(b)
    data = b.data if b.data is not None or loader is None else loader()
    if data is None or np.asarray(data).dtype != np.float32 or np.ndim(data) != 2:
        raise CodegenError(f"weight {b.name!r} cannot be packed: not a float32 matrix")
    packed = PackedWeight(b, native.pack_weight(np.asarray(data)))
    setattr(b, _PACKED_ATTR, packed)
    return packed
