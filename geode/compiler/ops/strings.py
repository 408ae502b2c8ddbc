"""String and text ops: StringNormalizer, StringConcat, StringSplit, RegexFullMatch and
TfIdfVectorizer.

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
* ``TfIdfVectorizer(X)`` (ints or strings, ``[C]`` or ``[B, C]``): counts, per row, the
  n-grams of the pool (lengths ``min_gram_length`` to ``max_gram_length``, items
  ``1 .. max_skip_count + 1`` apart; unigrams counted once) into their
  ``ngram_indexes`` slots, then weights them (``TF`` counts, ``IDF`` weight where
  present, ``TFIDF`` weight times count; weights default to 1).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from geode.compiler.ir import TensorDesc
from geode.compiler.ops.common import broadcast_infer
from geode.compiler.ops.registry import (
    REQUIRED,
    Attr,
    In,
    InferContext,
    OpDef,
    OpKind,
    Out,
    register,
)
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
    return np.array([rx.fullmatch(v) is not None for v in x.reshape(-1)], dtype=bool).reshape(
        x.shape
    )


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


# -- TfIdfVectorizer ---------------------------------------------------------------------------
def _ngram_table(attrs: dict[str, Any]) -> tuple[dict[tuple, int], int]:
    """(n-gram -> output slot for the counted lengths, output size) from the pool attributes."""
    pool = attrs.get("pool_strings") or attrs.get("pool_int64s") or []
    pool = [_s(v) if isinstance(v, (str, bytes)) else int(v) for v in pool]
    counts = [int(c) for c in attrs["ngram_counts"]]
    indexes = [int(i) for i in attrs["ngram_indexes"]]
    lo, hi = int(attrs["min_gram_length"]), int(attrs["max_gram_length"])
    table: dict[tuple, int] = {}
    ngram_id = 0
    for k, start in enumerate(counts):
        n = k + 1
        end = counts[k + 1] if k + 1 < len(counts) else len(pool)
        for j in range((end - start) // n):
            if lo <= n <= hi:
                if ngram_id >= len(indexes):
                    raise ShapeError(
                        "TfIdfVectorizer: ngram_indexes is shorter than the pool's n-grams"
                    )
                table[tuple(pool[start + j * n : start + (j + 1) * n])] = indexes[ngram_id]
            ngram_id += 1
    return table, (max(indexes) + 1 if indexes else 0)


def tfidf_vectorizer(x: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    """ONNX TfIdfVectorizer on a ``[C]`` or ``[B, C]`` tensor of ints or strings."""
    x = np.asarray(x)
    if x.ndim > 2:
        raise ShapeError(f"TfIdfVectorizer: input must be [C] or [B, C], got {list(x.shape)}")
    rows = x.reshape(1, -1) if x.ndim < 2 else x
    table, size = _ngram_table(attrs)
    lo, hi = int(attrs["min_gram_length"]), int(attrs["max_gram_length"])
    max_skip = int(attrs["max_skip_count"])
    counts = np.zeros((rows.shape[0], size), dtype=np.float64)
    for r, row in enumerate(rows):
        items = [_s(v) if isinstance(v, (str, bytes)) else int(v) for v in row]
        c = len(items)
        first = lo
        for dist in range(1, max_skip + 2):
            for start in range(c):
                if start + dist * (first - 1) >= c:
                    break
                for n in range(1, hi + 1):
                    last = start + dist * (n - 1)
                    if last >= c:
                        break
                    slot = table.get(tuple(items[start : last + 1 : dist]))
                    if n >= first and slot is not None:
                        counts[r, slot] += 1
            if first == 1:  # unigrams do not depend on the skip distance: count them once
                first = 2
                if first > hi:
                    break
    mode = _s(attrs["mode"])
    w = attrs.get("weights")
    weights = np.ones(size) if not w else np.asarray(w, dtype=np.float64)
    if mode == "TF":
        out = counts
    elif mode == "IDF":
        out = np.where(counts > 0, weights, 0.0)
    elif mode == "TFIDF":
        out = counts * weights
    else:
        raise VerifyError(f"TfIdfVectorizer: mode {mode!r} is not TF, IDF or TFIDF")
    out = out.astype(np.float32)
    return out if x.ndim == 2 else out.reshape(-1)


def _tfidf_verify(ctx: InferContext) -> None:
    if _s(ctx.attr("mode")) not in ("TF", "IDF", "TFIDF"):
        ctx.fail(f"mode {_s(ctx.attr('mode'))!r} is not TF, IDF or TFIDF", VerifyError)
    strings = ctx.attr("pool_strings")
    ints = ctx.attr("pool_int64s")
    if (strings is None) == (ints is None):
        ctx.fail("give exactly one of pool_strings and pool_int64s", VerifyError)
    if (strings is not None) != (ctx.dtype(0) == np.dtype(object)):
        ctx.fail("pool_strings goes with string input, pool_int64s with int input", VerifyError)
    if int(ctx.attr("min_gram_length")) < 1 or int(ctx.attr("max_gram_length")) < int(
        ctx.attr("min_gram_length")
    ):
        ctx.fail("need 1 <= min_gram_length <= max_gram_length", VerifyError)
    r = ctx.rank(0)
    if r is not None and r > 2:
        ctx.fail(f"input must be [C] or [B, C], got rank {r}")


def _tfidf_infer(ctx: InferContext) -> list[TensorDesc]:
    size = max(int(i) for i in ctx.attr("ngram_indexes")) + 1
    x = ctx.shape(0)
    f32 = np.dtype(np.float32)
    if x is not None and len(x) == 2:
        return [TensorDesc(f32, (x[0], size))]
    return [TensorDesc(f32, (size,))]


register(
    OpDef(
        "TfIdfVectorizer",
        OpKind.HOST,
        inputs=[In("X", "T")],
        outputs=[Out("Y", "T1")],
        types={"T": STRING | frozenset([np.dtype(np.int32), np.dtype(np.int64)])},
        attrs=[
            Attr("max_gram_length", "int", REQUIRED),
            Attr("max_skip_count", "int", REQUIRED),
            Attr("min_gram_length", "int", REQUIRED),
            Attr("mode", "string", REQUIRED),
            Attr("ngram_counts", "ints", REQUIRED),
            Attr("ngram_indexes", "ints", REQUIRED),
            Attr("pool_int64s", "ints", None),
            Attr("pool_strings", "strings", None),
            Attr("weights", "floats", None),
        ],
        verify=_tfidf_verify,
        infer=_tfidf_infer,
        kernel=lambda ins, a: [tfidf_vectorizer(ins[0], a)],
        doc="n-gram (with skips) counts of a token sequence, weighted TF / IDF / TFIDF",
    )
)

__all__ = [
    "STRING",
    "regex_full_match",
    "string_concat",
    "string_normalizer",
    "string_split",
    "tfidf_vectorizer",
]
