"""Dims read from a model file (compiler/stored_dims.py, modelfile/exprs.py): the JSON of
every kind of symbolic dim the compiler makes reads back as a StoredDim that prints as
sympy printed it and evaluates to what the compiler's shape functions compute, without
sympy; malformed trees are refused with the reason."""

from __future__ import annotations

import json

import pytest
import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

from geode.compiler.shapes import BroadcastDim, compile_dim_fn, compile_shape_fn, sym
from geode.compiler.stored_dims import MAX_DEPTH, StoredDim, compile_stored_shape, stored_dim
from geode.errors import ModelFileError, ShapeError
from geode.modelfile.exprs import Decoder, encode

N, M, H = sym("N"), sym("M"), sym("H")

#: dims of the kinds inference makes (pooling, slicing, broadcasts, reshapes, padding)
DIMS = [
    N,
    N * 256,
    N + M - 1,
    sympy.Max(M, N),
    sympy.Min(1, N - 1),
    sympy.floor((H - 3) / 2) + 1,
    sympy.floor(H / 2 - sympy.Rational(1, 2)) + 1,
    sympy.ceiling(H / 3),
    sympy.Mod(N, 3) + M,
    BroadcastDim(M, N),
    N**2 * M,
    sympy.Abs(N - M) + 1,
    sympy.Max(0, sympy.ceiling((N - 2) / 3)),
]


def _read(e):
    return Decoder({})(json.loads(json.dumps(encode(e))))  # through JSON text, as a file


@pytest.mark.parametrize("e", DIMS, ids=str)
def test_reads_back_as_printed_and_named(e):
    d = _read(e)
    assert isinstance(d, StoredDim)
    assert str(d) == str(e)
    assert {s.name for s in d.free_symbols} == {s.name for s in e.free_symbols}
    assert d == _read(e) and hash(d) == hash(_read(e))
    assert d.is_Symbol == e.is_Symbol and not d.is_Integer
    if e.is_Symbol:
        assert d.name == e.name
    else:
        with pytest.raises(AttributeError):
            d.name  # noqa: B018


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 400), m=st.integers(1, 400), h=st.integers(1, 400))
def test_evaluates_as_the_compilers_shape_functions(n, m, h):
    env = {"N": n, "M": m, "H": h}
    for e in DIMS:
        d = _read(e)
        try:
            want = compile_dim_fn(e)(env)
        except ShapeError:  # bcast(M, N) of two sizes that do not broadcast
            with pytest.raises(ShapeError):
                d.evaluate(env)
            continue
        assert d.evaluate(env) == want, e


def test_shape_functions_of_stored_shapes():
    shape = (_read(N), 16, _read(sympy.floor((H - 3) / 2) + 1))
    fn = compile_shape_fn(shape)
    assert fn({"N": 4, "H": 9}) == (4, 16, 4)
    assert compile_stored_shape(shape)({"N": 1, "H": 3}) == (1, 16, 1)
    with pytest.raises(KeyError):
        fn({"N": 4})  # H unbound, as the compiled functions


def test_equal_names_are_one_symbol_per_graph():
    symbols: dict = {}
    dec = Decoder(symbols)
    a, b = dec(encode(N)), dec(encode(N * 2))
    assert symbols == {"N": a}
    assert next(iter(b.free_symbols)) == a


def test_ints_stay_ints():
    assert Decoder({})(encode(sympy.Integer(7))) == 7
    assert stored_dim(5, "5") == 5


@pytest.mark.parametrize(
    "tree, why",
    [
        (["exec", 1], "unknown operator"),
        (["floor"], "operand"),
        (["Mod", 1, 2, 3], "operand"),
        (["s", 3], "bad symbol"),
        (["q", 1, 0], "bad rational"),
        (["^", ["s", "N"], ["s", "M"]], "integer exponent"),
        ("N + 1", "not a dim expression"),
        ([True], "not a dim expression"),
        (["+", True, 1], "not a dim expression"),
    ],
)
def test_malformed_trees_are_refused(tree, why):
    with pytest.raises(ValueError, match=why):
        stored_dim(tree, "x")
    with pytest.raises(ModelFileError, match=why):
        Decoder({})({"t": "x", "e": tree})


def test_deep_trees_are_refused():
    tree: list = ["s", "N"]
    for _ in range(MAX_DEPTH + 2):
        tree = ["Abs", tree]
    with pytest.raises(ModelFileError, match="too deeply"):
        Decoder({})({"t": "x", "e": tree})


@pytest.mark.parametrize("data", [["s", "N"], {"t": "N"}, {"t": "N", "e": ["s", "N"], "x": 1}])
def test_records_that_are_not_dims_are_refused(data):
    with pytest.raises(ModelFileError, match="not a dim"):
        Decoder({})(data)


def test_evaluation_errors_are_shape_errors():
    with pytest.raises(ShapeError, match="modulo 0"):
        stored_dim(["Mod", ["s", "N"], ["s", "M"]], "Mod(N, M)").evaluate({"N": 3, "M": 0})
    with pytest.raises(ShapeError, match="divides by 0"):
        stored_dim(["^", ["s", "N"], -1], "1/N").evaluate({"N": 0})
