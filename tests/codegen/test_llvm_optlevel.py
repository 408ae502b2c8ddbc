"""The LLVM optimization level per module (:mod:`geode.codegen.backends.llvm.optlevel`):
the rules, the override, the level in the cache key and in ``explain()``, and kernels
compiled at either level computing what the reference does."""

from __future__ import annotations

import numpy as np
import pytest

import geode
from geode import examples
from geode.codegen import ast as A
from geode.codegen.ast_eval import run_kernel
from geode.codegen.backends.llvm import jit, optlevel
from geode.codegen.backends.llvm.kernel import compile_kernel, module_key
from geode.codegen.backends.llvm.target import host
from geode.config import OptionError
from geode.errors import CodegenError

N = A.Var("N")


def _kernel(name: str, value) -> A.Kernel:
    """``Y[i] = value(X[i])`` over ``N`` elements, vectorized."""
    blk = A.Block(
        "b",
        [A.IterVar("vi", N)],
        [A.Var("i")],
        [A.Store("Y", (A.Var("vi"),), value(A.Load("X", (A.Var("vi"),))))],
    )
    body = [A.For("i", N, [blk], A.ForKind.VECTORIZED)]
    return A.Kernel(
        name, [A.Buffer("X", "float32", (N,))], [A.Buffer("Y", "float32", (N,))], ["N"], body
    )


def _affine(x: A.Expr) -> A.Expr:
    return A.Bin("+", A.Bin("*", x, A.Const(3.0, "float32")), A.Const(1.0, "float32"))


def _exp(x: A.Expr) -> A.Expr:
    return A.Un("exp", x)


def _check(kern: A.Kernel, native) -> None:
    x = np.linspace(-4, 4, 1003, dtype=np.float32)
    got = np.empty_like(x)
    native(x, got, x.size)
    want = run_kernel(kern, {"X": x}, {"N": x.size})["Y"]
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)  # a contracted FMA


def test_rules_pick_o2_for_plain_kernels_and_o3_for_vmath_and_library(monkeypatch) -> None:
    monkeypatch.delenv(optlevel.ENV_VAR, raising=False)
    assert optlevel.choose("define void @k() {\n ret void\n}").level == 2
    vm = "call float @geode.vm.exp.f32(float %x)"
    assert optlevel.choose(vm).level == 3
    assert "vmath" in optlevel.choose(vm).describe()
    library = optlevel.choose("define void @k() {\n ret void\n}", generated=False)
    assert library.level == 3 and library.describe() == "O3 (library module)"


@pytest.mark.parametrize("value", ["2", "3"])
def test_environment_overrides_every_choice(monkeypatch, value: str) -> None:
    monkeypatch.setenv(optlevel.ENV_VAR, value)
    for ir, generated in (("plain", True), ("@geode.vm.tanh", True), ("plain", False)):
        choice = optlevel.choose(ir, generated)
        assert choice.level == int(value) and optlevel.ENV_VAR in choice.reason


def test_bad_setting_and_bad_level_raise_clear_errors(monkeypatch) -> None:
    monkeypatch.setenv(optlevel.ENV_VAR, "fast")
    with pytest.raises(OptionError, match="GEODE_LLVM_OPT='fast'"):
        optlevel.choose("plain")
    with pytest.raises(CodegenError, match="no LLVM optimization level 1"):
        jit.compile_ir("define void @k() {\n ret void\n}", host(), 1)


def test_a_bad_setting_fails_the_compile_instead_of_every_kernel(monkeypatch) -> None:
    monkeypatch.setenv(optlevel.ENV_VAR, "O3")
    with pytest.raises(OptionError, match="GEODE_LLVM_OPT='o3'"):
        geode.compile(examples.layernorm(hidden=8).graph, model_cache=False)


def test_kernels_record_their_level_and_match_the_reference(monkeypatch) -> None:
    monkeypatch.delenv(optlevel.ENV_VAR, raising=False)
    plain, vm = _kernel("ol_affine", _affine), _kernel("ol_exp", _exp)
    k_plain, k_vm = compile_kernel(plain), compile_kernel(vm, fastmath=True)
    assert (k_plain.opt_level, k_vm.opt_level) == (2, 3)
    _check(plain, k_plain)
    _check(vm, k_vm)
    assert "define" in k_plain.llvm  # inspection re-optimizes at the kernel's level


def test_the_level_is_part_of_the_cache_key(monkeypatch, tmp_path) -> None:
    kern = _kernel("ol_keyed", _affine)
    monkeypatch.setenv(optlevel.ENV_VAR, "2")
    at2 = compile_kernel(kern, cache_dir=tmp_path)
    monkeypatch.setenv(optlevel.ENV_VAR, "3")
    at3 = compile_kernel(kern, cache_dir=tmp_path)
    assert (at2.opt_level, at3.opt_level) == (2, 3)
    assert at2 is not at3 and not at3.from_cache  # O2's object code is not O3's
    assert module_key(at2.source, host(), 2) != module_key(at2.source, host(), 3)
    _check(kern, at2)
    _check(kern, at3)


@pytest.mark.parametrize("level", ["auto", "2", "3"])
def test_models_at_every_setting_match_numpy_and_explain_the_level(monkeypatch, level) -> None:
    monkeypatch.setenv(optlevel.ENV_VAR, level)
    rng = np.random.default_rng(0)
    for ex in (examples.layernorm(hidden=64), examples.gelu(hidden=64, approximate="tanh")):
        model = geode.compile(ex.graph, model_cache=False)
        feeds = ex.make_inputs(rng, 37)
        want = ex.numpy(**feeds)
        got = model(**feeds)
        for name, w in want.items():
            np.testing.assert_allclose(got[name], w, rtol=1e-5, atol=1e-5, err_msg=name)
        levels = [k.cost["opt_level"] for k in model.kernels if "opt_level" in k.cost]
        assert levels, "every LLVM kernel lists its level"
        if level != "auto":
            assert set(levels) == {float(level)}
        assert "opt_level=" in model.explain()
    if level == "auto":  # the tanh GELU calls vmath, the LayerNorm does not
        ln = geode.compile(examples.layernorm(hidden=64).graph, model_cache=False)
        assert {k.cost["opt_level"] for k in ln.kernels if "opt_level" in k.cost} == {2.0}


def test_model_file_keeps_the_level(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv(optlevel.ENV_VAR, "2")
    ex = examples.softmax(hidden=64)
    model = geode.compile(ex.graph, model_cache=False)
    model.save(tmp_path / "m.geode")
    loaded = geode.load(tmp_path / "m.geode")
    native = [k for k in loaded.kernels if k.engine == "aicore"]
    assert native and all(k.cost["opt_level"] == 2.0 for k in native)
    feeds = ex.make_inputs(np.random.default_rng(1), 5)
    for name, w in model(**feeds).items():
        np.testing.assert_array_equal(loaded(**feeds)[name], w)
