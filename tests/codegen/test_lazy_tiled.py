"""The key-tiled body of an entry choosing per call, compiled on the first call that takes
it (``DenseKernel.prepare``, ``NativeKernel.prepare``): the compile emits its modules but
runs LLVM on none of them; a short call runs the row panels (their bits) and builds
nothing; the first long call builds the body once (through the object cache), and
returns the bits of the key-tiled form forced; later calls build nothing, whether they
run as a native chain or step by step, on two threads at once, after a warm start from
the object cache or from a model cache's file (a saved model file carries the body as
object code: ``test_lazy_tiled_file.py``). The limit is forced low (``_per_call``: the body
from 33 keys)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from dense_helpers import dense_kernels
from test_online_attention import compile_with, feeds_for, model, reference

import geode
import geode.codegen.epilogues as epilogues
from geode.codegen.backends.llvm.compiled import DenseKernel
from geode.compiler.fusion import profit


@pytest.fixture
def low_limit(monkeypatch):
    """The key-tiled body from 33 keys (with as many query rows), panels of 8 rows,
    blocks of 16 keys."""
    monkeypatch.setattr(profit, "online_limit", lambda spec: 4096)
    monkeypatch.setattr(profit, "ONLINE_ROWS", 8)
    monkeypatch.setattr(profit, "ONLINE_KEYS", 16)


_FORMS: list = []


def forms() -> tuple[geode.Model, geode.Model]:
    """(key-tiled forced, row panels alone) of ``model("pad")``, compiled once."""
    if not _FORMS:
        _FORMS.extend([compile_with(model("pad"), True), compile_with(model("pad"), False)])
    return _FORMS[0], _FORMS[1]


def compiled(cache_dir: object = None) -> geode.Model:
    more = {} if cache_dir is None else {"cache_dir": cache_dir}
    return geode.compile(model("pad"), session=geode.Session(), model_cache=False, **more)


def entry(m: geode.Model) -> DenseKernel:
    """The model's one dense entry choosing per call (the kernel its info's ``llvm``
    reads)."""
    found = [c.cell_contents for info in dense_kernels(m) for c in info._llvm.__closure__]
    (k,) = [
        k
        for k in found
        if isinstance(k, DenseKernel) and (k.lazy is not None or k.linked is not None)
    ]
    return k


def _is_body(ir: str) -> bool:
    return "_tiled.par" in ir or "_tiled(ptr %ptrs" in ir


def check(m: geode.Model, s: int, want: geode.Model) -> np.ndarray:
    feeds = feeds_for("pad", "float32", 2, 3, s, 8, s)
    got = m.run(feeds)["y"]
    np.testing.assert_array_equal(got, want.run(feeds)["y"])
    np.testing.assert_allclose(got, reference("pad", feeds), rtol=2e-5, atol=2e-5)
    return got


def test_short_then_long(low_limit, tmp_path, llvm_runs):
    """Compiled: no module of the body started or compiled. Short calls: nothing built,
    the row panels' bits. The first long call: built once, the key-tiled bits; then no
    second build."""
    from geode.codegen.backends.llvm.kernel import forget_kernels

    forget_kernels()  # no code linked by an earlier test
    started, done = llvm_runs
    m = compiled(str(tmp_path))
    assert any(st.name.startswith("chain:") for st in m.plan.steps)  # the dense step a member
    k = entry(m)
    assert not [ir for ir in started + done if _is_body(ir)]
    assert "key-tiled body compiled on the first call from 33" in m.explain()
    tiled, rows = forms()
    for s in (16, 32):
        check(m, s, rows)
    assert k.tiled_builds == 0 and k.tiled is None
    assert not [ir for ir in done if _is_body(ir)]
    check(m, 48, tiled)
    assert k.tiled_builds == 1 and k.tiled is not None and not k.tiled_error
    assert len([ir for ir in done if _is_body(ir)]) == 2  # its epilogue, then the body
    for s in (70, 33, 16):
        check(m, s, tiled if s >= 33 else rows)
    assert k.tiled_builds == 1


def test_unchained_steps_build_it_too(low_limit, monkeypatch):
    """Steps run one by one (no native chain): the step builds the body before its call."""
    import geode.plan_builder as pb

    monkeypatch.setattr(
        pb,
        "_chain_native_runs",
        lambda units, steps, release, memo, aliases, *rest: (steps, release, memo),
    )
    m = compiled()
    assert not any(st.name.startswith("chain:") for st in m.plan.steps)
    k = entry(m)
    tiled, rows = forms()
    check(m, 20, rows)
    assert k.tiled_builds == 0
    check(m, 40, tiled)
    check(m, 41, tiled)
    assert k.tiled_builds == 1


@pytest.mark.parametrize("lengths", [(60, 64), (64, 64)])
def test_two_threads_race_on_the_first_long_call(low_limit, lengths):
    """Two threads' first long calls at once (two bindings, or one): one build, both the
    key-tiled bits (a thread finding the binding known finds the body linked)."""
    m = compiled()
    k = entry(m)
    tiled, _ = forms()
    feeds = [feeds_for("pad", "float32", 2, 3, s, 8, i) for i, s in enumerate(lengths)]
    got: list = [None, None]
    go = threading.Barrier(2)

    def run(i: int) -> None:
        go.wait()
        got[i] = m.run(feeds[i])["y"]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert k.tiled_builds == 1
    for f, y in zip(feeds, got):
        np.testing.assert_array_equal(y, tiled.run(f)["y"])


def test_warm_start_loads_the_body_from_the_object_cache(low_limit, tmp_path, llvm_runs):
    """A second compile on the same object cache: its first long call links the body the
    first compile's long call stored, LLVM compiles nothing."""
    from geode.codegen.backends.llvm.kernel import forget_kernels

    tiled, _ = forms()
    first = compiled(str(tmp_path))
    check(first, 50, tiled)
    del first
    forget_kernels()
    _, done = llvm_runs
    done.clear()
    m = compiled(str(tmp_path))
    k = entry(m)
    check(m, 50, tiled)
    assert k.tiled_builds == 1 and not done, [ir[:80] for ir in done]


def test_the_rule_matches_the_entry(low_limit):
    """The Python rule (``TiledRule.long``) says what the entry chose: the body built
    exactly when a length reaches 33 keys, at lengths around it."""
    for s, built in ((31, 0), (32, 0), (33, 1)):
        m = compiled()
        k = entry(m)
        feeds = feeds_for("pad", "float32", 1, 2, s, 8, s)
        m.run(feeds)
        assert k.tiled_builds == built, s
        rule = k.lazy.rule
        assert rule.long((feeds["q"], np.swapaxes(feeds["kk"], -1, -2), feeds["v"])) == bool(built)
    assert not rule.long((np.zeros(3),))  # arrays the entry refuses: no build


def test_a_model_cache_hit_links_the_body_from_the_object_cache(low_limit, tmp_path, llvm_runs):
    """A warm start (the model cache's file loaded): its first long call links the body
    the cold compile's long call stored in the object cache; LLVM compiles nothing."""
    from geode.codegen.backends.llvm.kernel import forget_kernels

    tiled, _ = forms()
    opts = {"cache_dir": str(tmp_path), "model_cache": True}
    cold = geode.compile(model("pad"), session=geode.Session(), **opts)
    check(cold, 50, tiled)
    del cold
    forget_kernels()
    _, done = llvm_runs
    done.clear()
    warm = geode.compile(model("pad"), session=geode.Session(), **opts)
    assert "model_cache" in warm.stats
    k = entry(warm)
    check(warm, 16, forms()[1])
    assert k.tiled_builds == 0
    check(warm, 50, tiled)
    assert k.tiled_builds == 1 and not done, [ir[:80] for ir in done]


@pytest.mark.parametrize("fused", [True, False])
def test_the_rule_matches_the_entry_on_heads_in_place(low_limit, fused):
    """Operands read in place as heads (K^T transposed): the first length at which the
    rule builds the body is the first the entry takes it at (the length before it, run
    after the build, gives the row panels' bits; it and the next, the key-tiled form's)."""
    from test_dense_heads import _feeds, attention_proto

    proto, names = attention_proto(3, 8, 32, fused, "pad", True)

    def build(**switches: bool) -> geode.Model:
        saved = {n: getattr(epilogues, n) for n in switches}
        for n, v in switches.items():
            setattr(epilogues, n, v)
        try:
            return geode.compile(proto, session=geode.Session(), model_cache=False)
        finally:
            for n, v in saved.items():
                setattr(epilogues, n, v)

    m = build()
    assert "transposed" in m.explain() and "key-tiled body compiled" in m.explain()
    k = entry(m)
    first = next(s for s in range(1, 200) if m.run(_feeds(names, 1, s, 32)) and k.tiled_builds)
    tiled, rows = build(ONLINE_FORCE=True), build(ONLINE_ATTENTION=False)
    for s, want in ((first - 1, rows), (first, tiled), (first + 1, tiled)):
        feeds = _feeds(names, 1, s, 32)
        (key,) = want.run(feeds)
        np.testing.assert_array_equal(m.run(feeds)[key], want.run(feeds)[key], err_msg=str(s))


def test_a_body_that_cannot_be_built_leaves_the_row_panels(low_limit, caplog):
    """A body LLVM refuses: the long call runs the row panels (their bits), the reason is
    kept and logged, and no later call tries again."""
    import dataclasses

    m = compiled()
    k = entry(m)
    k.lazy = dataclasses.replace(k.lazy, body_ir="this is not IR")
    _, rows = forms()
    check(m, 48, rows)
    assert k.tiled_builds == 0 and "LLVM rejected" in k.tiled_error
    assert "no key-tiled body" in caplog.text
    k.lazy = None  # a second try would fail on it
    check(m, 50, rows)
