"""String ops: StringNormalizer, StringConcat, StringSplit and RegexFullMatch.

String tensors are numpy object arrays of Python ``str`` (ONNX ``STRING``). These ops
run on the host engine (OpKind.HOST): geode compiles nothing over strings, and string
tensors never live in the activation arena.

* ``StringNormalizer(X)`` (``[C]`` or ``[1, C]``): drops the elements that are stop
  words (compared case-insensitively unless ``is_case_sensitive``), then lower- or
  upper-cases the rest (``case_change_action``); an empty result is ``[""]``.
* ``StringConcat(X, Y)``: elementwise ``x + y`` with numpy broadcasting.
* ``StringSplit(X)``: splits every element by ``delimiter`` (runs of whitespace when
  empty or absent) at most ``maxsplit`` times; ``Y`` has a trailing dim as long as the
  longest split, padded with ``""``, ``Z`` the number of pieces of each element.
* ``RegexFullMatch(X)``: whether each element matches ``pattern`` entirely (RE2
  syntax, evaluated with Python's ``re``, which agrees on the common subset).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from geode.compiler.ir import TensorDesc
from geode.compiler.ops.common import broadcast_infer
from geode.compiler.ops.registry import Attr, In, InferContext, OpDef, OpKind, Out, register
from geode.errors import ShapeError, VerifyError

STRING = frozenset([np.dtype(object)])


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _strs(x: np.ndarray) -> np.ndarray:
    """An object array of Python str (bytes decoded as UTF-8)."""
    x = np.asarray(x, dtype=object)
    out = np.empty(x.shape, dtype=object)
    flat = out.reshape(-1)
    for i, v in enumerate(x.reshape(-1)):
        flat[i] = v.decode("utf-8") if isinstance(v, bytes) else str(v)
    return out


# -- StringNormalizer -----------------------------------------------------------------------------
def string_normalizer(x: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    """ONNX StringNormalizer on a ``[C]`` or ``[1, C]`` string tensor."""
    x = _strs(x)
    if x.ndim not in (1, 2) or (x.ndim == 2 and x.shape[0] != 1):
        raise ShapeError(f"StringNormalizer: input must be [C] or [1, C], got {list(x.shape)}")
    words = list(x.reshape(-1))
    stops = [_s(w) for w in (attrs.get("stopwords") or [])]
    if stops:
        if int(attrs.get("is_case_sensitive") or 0):
            stop_set = set(stops)
            words = [w for w in words if w not in stop_set]
        else:
            stop_set = {w.casefold() for w in stops}
            words = [w for w in words if w.casefold() not in stop_set]
    action = _s(attrs.get("case_change_action") or "NONE")
    if action == "LOWER":
        words = [w.lower() for w in words]
    elif action == "UPPER":
        words = [w.upper() for w in words]
    if not words:
        words = [""]
    out = np.empty(len(words), dtype=object)
    out[:] = words
    return out.reshape(1, -1) if x.ndim == 2 else out


def _normalizer_verify(ctx: InferContext) -> None:
    action = _s(ctx.attr("case_change_action"))
    if action not in ("NONE", "LOWER", "UPPER"):
        ctx.fail(f"case_change_action {action!r} is not NONE, LOWER or UPPER", VerifyError)
    r = ctx.rank(0)
    if r is not None and r not in (1, 2):
        ctx.fail(f"input must be [C] or [1, C], got rank {r}")


def _normalizer_infer(ctx: InferContext) -> list[TensorDesc]:
    x = ctx.shape(0)
    n = ctx.fresh("words")
    if x is not None and len(x) == 2:
        return [TensorDesc(np.dtype(object), (1, n))]
    return [TensorDesc(np.dtype(object), (n,))]


register(
    OpDef(
        "StringNormalizer",
        OpKind.HOST,
        inputs=[In("X", "T")],
        outputs=[Out("Y", "T")],
        types={"T": STRING},
        attrs=[
            Attr("case_change_action", "string", "NONE"),
            Attr("is_case_sensitive", "int", 0),
            Attr("locale", "string", None),
            Attr("stopwords", "strings", None),
        ],
        verify=_normalizer_verify,
        infer=_normalizer_infer,
        kernel=lambda ins, a: [string_normalizer(ins[0], a)],
        value_inputs=(0,),
        doc="remove stop words, then change case",
    )
)


# -- StringConcat -------------------------------------------------------------------------------
def string_concat(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Elementwise concatenation with broadcasting."""
    a, b = np.broadcast_arrays(_strs(x), _strs(y))
    out = np.empty(a.shape, dtype=object)
    out.reshape(-1)[:] = [p + q for p, q in zip(a.reshape(-1), b.reshape(-1))]
    return out


register(
    OpDef(
        "StringConcat",
        OpKind.HOST,
        inputs=[In("X", "T"), In("Y", "T")],
        outputs=[Out("Z", "T")],
        types={"T": STRING},
        infer=broadcast_infer(),
        kernel=lambda ins, a: [string_concat(ins[0], ins[1])],
        doc="elementwise X + Y on strings, with broadcasting",
    )
)


# -- StringSplit -------------------------------------------------------------------------------
def string_split(x: np.ndarray, delimiter: str | None, maxsplit: int | None) -> list[np.ndarray]:
    """[pieces padded with "" (X.shape + [longest]), piece counts (X.shape, int64)]."""
    x = _strs(x)
    sep = delimiter or None  # "" or absent: runs of whitespace
    limit = -1 if maxsplit is None else int(maxsplit)
    parts = [v.split(sep, limit) for v in x.reshape(-1)]
    longest = max((len(p) for p in parts), default=0)
    y = np.empty((len(parts), longest), dtype=object)
    y[:] = ""
    for i, p in enumerate(parts):
        y[i, : len(p)] = p
    z = np.array([len(p) for p in parts], dtype=np.int64).reshape(x.shape)
    return [y.reshape(*x.shape, longest), z]


def _split_infer(ctx: InferContext) -> list[TensorDesc]:
    x = ctx.shape(0)
    obj = np.dtype(object)
    if x is None:
        return [TensorDesc(obj, None), TensorDesc(np.dtype(np.int64), None)]
    return [TensorDesc(obj, (*x, ctx.fresh("pieces"))), TensorDesc(np.dtype(np.int64), tuple(x))]


register(
    OpDef(
        "StringSplit",
        OpKind.HOST,
        inputs=[In("X", "T1")],
        outputs=[Out("Y", "T2"), Out("Z", "T3")],
        types={"T1": STRING},
        attrs=[Attr("delimiter", "string", None), Attr("maxsplit", "int", None)],
        infer=_split_infer,
        kernel=lambda ins, a: string_split(
            ins[0], None if a.get("delimiter") is None else _s(a["delimiter"]), a.get("maxsplit")
        ),
        value_inputs=(0,),
        doc="split each string by a delimiter; pieces padded with empty strings, and their counts",
    )
)


# -- RegexFullMatch ------------------------------------------------------------------------------
def _compile(pattern: str) -> re.Pattern:
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise VerifyError(f"RegexFullMatch: invalid pattern {pattern!r}: {exc}") from exc


def regex_full_match(x: np.ndarray, pattern: str) -> np.ndarray:
    """Whether each element matches ``pattern`` in full."""
    rx = _compile(pattern)
    x = _strs(x)
    return np.array([rx.fullmatch(v) is not None for v in x.reshape(-1)], dtype=bool).reshape(x.shape)


def _regex_verify(ctx: InferContext) -> None:
    p = ctx.attr("pattern")
    if p is None:
        ctx.fail("attribute 'pattern' is required", VerifyError)
    _compile(_s(p))


register(
    OpDef(
        "RegexFullMatch",
        OpKind.HOST,
        inputs=[In("X", "T1")],
        outputs=[Out("Y", "T2")],
        types={"T1": STRING},
        attrs=[Attr("pattern", "string", None)],
        verify=_regex_verify,
        infer=lambda ctx: [TensorDesc(np.dtype(np.bool_), ctx.shape(0))],
        kernel=lambda ins, a: [regex_full_match(ins[0], _s(a["pattern"]))],
        doc="whether each string fully matches the regular expression 'pattern'",
    )
)

__all__ = ["STRING", "regex_full_match", "string_concat", "string_normalizer", "string_split"]
