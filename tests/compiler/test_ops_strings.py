"""Conformance tests of the string ops (geode/compiler/ops/strings.py) against ONNX's
reference evaluator, and string tensors through a compiled model."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from opcheck import check_op

import geode


def _s(*words):
    return np.array(list(words), dtype=object)


@pytest.mark.parametrize("action", ["NONE", "LOWER", "UPPER"])
@pytest.mark.parametrize("sensitive", [0, 1])
def test_string_normalizer(action, sensitive):
    x = _s("Monday", "tuesday", "monday", "WEDNESDAY")
    got = check_op(
        "StringNormalizer",
        [x],
        {"case_change_action": action, "is_case_sensitive": sensitive, "stopwords": ["monday"]},
        compare=False,
    )[0]
    kept = [w for w in x if (w if sensitive else w.lower()) != "monday"]
    want = [w.lower() if action == "LOWER" else w.upper() if action == "UPPER" else w for w in kept]
    assert list(got) == want


def test_string_normalizer_2d_and_empty_result():
    # (the evaluator answers a numpy unicode array here; geode's strings are objects)
    (got,) = check_op(
        "StringNormalizer",
        [np.array([["a", "b"]], dtype=object)],
        {"case_change_action": "UPPER"},
        compare=False,
    )
    assert got.tolist() == [["A", "B"]]
    (got,) = check_op("StringNormalizer", [_s("x", "X")], {"stopwords": ["x"]}, compare=False)
    assert got.tolist() == [""]


def test_string_concat_broadcasts():
    check_op(
        "StringConcat", [np.array([["a", "b"], ["c", "d"]], dtype=object), _s("1", "2")], opset=20
    )


@pytest.mark.parametrize("attrs", [{}, {"delimiter": "-"}, {"delimiter": "-", "maxsplit": 1}])
def test_string_split(attrs):
    x = np.array([["a-b-c", "d  e"], ["", "f-g"]], dtype=object)
    check_op("StringSplit", [x], attrs, n_outputs=2, opset=20)


def test_regex_full_match():
    check_op(
        "RegexFullMatch",
        [_s("www.google.com", "www.facebook.com", "www.bbc.co.uk")],
        {"pattern": r"www\.[\w.-]+\.\bcom\b"},
        opset=20,
    )


def test_string_tensors_through_a_compiled_model():
    nodes = [
        helper.make_node(
            "StringNormalizer", ["x"], ["n"], case_change_action="LOWER", stopwords=["the"]
        ),
        helper.make_node("StringConcat", ["n", "suffix"], ["y"]),
        helper.make_node("Equal", ["y", "target"], ["eq"]),
    ]
    graph = helper.make_graph(
        nodes,
        "strings",
        [
            helper.make_tensor_value_info(n, TensorProto.STRING, s)
            for n, s in (("x", ["W"]), ("suffix", [1]), ("target", [1]))
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.STRING, None),
            helper.make_tensor_value_info("eq", TensorProto.BOOL, None),
        ],
    )
    model = geode.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]))
    out = model(x=_s("The", "Cat", "SAT"), suffix=_s("!"), target=_s("cat!"))
    assert list(out["y"]) == ["cat!", "sat!"]
    assert list(out["eq"]) == [True, False]


@pytest.mark.parametrize("mode", ["TF", "IDF", "TFIDF"])
@pytest.mark.parametrize("skip,lo,hi", [(0, 1, 2), (2, 2, 2), (3, 1, 1)])
def test_tfidf_vectorizer_ints(mode, skip, lo, hi):
    x = np.array([[1, 1, 3, 3, 3, 7], [8, 6, 7, 5, 6, 8]], np.int32)
    attrs = {
        "mode": mode,
        "min_gram_length": lo,
        "max_gram_length": hi,
        "max_skip_count": skip,
        "ngram_counts": [0, 4],
        "ngram_indexes": [0, 1, 2, 3, 4, 5, 6],
        "pool_int64s": [2, 3, 5, 4, 5, 6, 7, 8, 6, 7],  # unigrams 2 3 5 4; bigrams 56 78 67
        "weights": [1.0, 0.5, 2.0, 1.0, 3.0, 0.25, 1.5],
    }
    check_op("TfIdfVectorizer", [x], attrs)
    check_op("TfIdfVectorizer", [x[1]], attrs)


def test_tfidf_vectorizer_strings():
    x = _s("a", "b", "a", "c", "b", "a")
    attrs = {
        "mode": "TF",
        "min_gram_length": 1,
        "max_gram_length": 2,
        "max_skip_count": 1,
        "ngram_counts": [0, 2],
        "ngram_indexes": [0, 1, 2, 3],
        "pool_strings": ["a", "b", "a", "b", "b", "a"],
    }
    (got,) = check_op("TfIdfVectorizer", [x], attrs, compare=False)
    # unigrams a: 3, b: 2; 'a b' at positions (0, 1) and (2, 4); 'b a' at (1, 2) and (4, 5)
    assert got.tolist() == [3.0, 2.0, 2.0, 2.0]
