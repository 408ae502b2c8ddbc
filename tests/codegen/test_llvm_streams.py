"""The LLVM backend's stream copy (``backends/llvm/streams.py``): staged values copied to
an output at any offset and length, streamed or not, plain, scaled and divided; its
head and tail before and after the aligned vectors are masked vector stores (no scalar
loop LLVM would turn into a ``memcpy`` call)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geode import examples
from geode.codegen.ast import (
    Bin,
    Block,
    Buffer,
    Const,
    For,
    ForKind,
    IterVar,
    Kernel,
    Load,
    Store,
    StreamStore,
    Var,
)
from geode.codegen.backends.llvm import streams
from geode.codegen.backends.llvm.kernel import compile_kernel
from geode.codegen.backends.llvm.target import Target, host

N, O = Var("N"), Var("O")
#: the sentinel every element outside the streamed range keeps
FILL = 77


def _copy_block(name: str, dst: str, value: object, n: object) -> For:
    """``dst[j] = value`` for ``j`` in ``[0, n)`` (vectorized)."""
    blk = Block(name, [IterVar("vj", n)], [Var("j")], [Store(dst, (Var("vj"),), value)])
    return For("j", n, [blk], ForKind.VECTORIZED)


def stream_at(dtype: str, nontemporal: bool) -> Kernel:
    """``Y[O : O + N] = X[0 : N]`` through a local stage and a stream (``Y`` has ``N + O + 40``
    elements; the others are left as they were)."""
    stage = Buffer("S", dtype, (N,), "local")
    nt = Bin(">", Const(1 if nontemporal else 0), Const(0))
    body = [
        _copy_block("s", "S", Load("X", (Var("vj"),)), N),
        StreamStore("Y", O, "S", Const(0), N, nt),
    ]
    out = Buffer("Y", dtype, (Bin("+", Bin("+", N, O), Const(40)),))
    return Kernel(f"stream_{dtype}", [Buffer("X", dtype, (N,))], [out], ["N", "O"], body, [stage])


def scaled_stream_at(n: int, divide: bool, nontemporal: bool) -> Kernel:
    """``Y[O : O + n] = T[0 : n] * F[0]`` (or ``/ F[0]``) for a stage ``T`` of ``X``, the
    product staged in ``S`` and streamed (the scaled stream: from the registers)."""
    t = Buffer("T", "float32", (Const(n),), "local")
    stage = Buffer("S", "float32", (Const(n),), "local")
    nt = Bin(">", Const(1 if nontemporal else 0), Const(0))
    scale = Bin("/" if divide else "*", Load("T", (Var("vj"),)), Load("F", (Const(0),)))
    body = [
        _copy_block("t", "T", Load("X", (Var("vj"),)), Const(n)),
        _copy_block("s", "S", scale, Const(n)),
        StreamStore("Y", O, "S", Const(0), Const(n), nt),
    ]
    ins = [Buffer("X", "float32", (Const(n),)), Buffer("F", "float32", (Const(1),))]
    out = Buffer("Y", "float32", (Bin("+", O, Const(n + 40)),))
    return Kernel(f"scaled_{n}_{divide}", ins, [out], ["O"], body, [t, stage])


def _values(dtype: str, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.random(n) < 0.5
    if dtype.startswith("float"):
        return rng.standard_normal(n).astype(dtype)
    return rng.integers(-100, 100, n).astype(dtype)


def _check_stream(dtype: str, nontemporal: bool, n: int, off: int) -> None:
    k = compile_kernel(stream_at(dtype, nontemporal))
    x = _values(dtype, n, n + off)
    y = np.full(n + off + 40, FILL).astype(dtype)
    k(x, y, n, off)
    want = np.full(n + off + 40, FILL).astype(dtype)
    want[off : off + n] = x
    np.testing.assert_array_equal(y, want)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int8", "int32", "int64", "bool"])
@pytest.mark.parametrize("nontemporal", [True, False])
def test_stream_every_head_and_tail(dtype: str, nontemporal: bool) -> None:
    """Every offset within a vector, lengths around one and two vectors: heads and tails
    of every size, nothing written outside the range."""
    lanes = host().stream_vector_bytes // np.dtype(dtype).itemsize
    for off in range(lanes + 1):
        for n in (0, 1, lanes - 1, lanes, lanes + 1, 2 * lanes + 3):
            _check_stream(dtype, nontemporal, n, off)


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(["float32", "float64", "int16"]),
    st.booleans(),
    st.integers(0, 300),
    st.integers(0, 70),
)
def test_stream_property(dtype: str, nontemporal: bool, n: int, off: int) -> None:
    _check_stream(dtype, nontemporal, n, off)


@pytest.mark.parametrize("n", [1, 15, 16, 17, 100, 128])
@pytest.mark.parametrize("divide", [False, True])
@pytest.mark.parametrize("nontemporal", [True, False])
def test_scaled_stream_matches_numpy(n: int, divide: bool, nontemporal: bool) -> None:
    k = compile_kernel(scaled_stream_at(n, divide, nontemporal))
    assert "geode.stream.float32." + ("divided" if divide else "scaled") in k.source
    x = _values("float32", n, n)
    f = np.array([3.0], np.float32)
    for off in range(17):
        y = np.full(n + off + 40, FILL, np.float32)
        k(x, f, y, off)
        want = np.full(n + off + 40, FILL, np.float32)
        want[off : off + n] = x / f[0] if divide else x * f[0]
        np.testing.assert_array_equal(y, want)


def test_stream_to_an_unaligned_element_address() -> None:
    """An output not even element-aligned streams nothing: the plain copy, same values."""
    k = compile_kernel(stream_at("float32", True))
    raw = np.zeros(4 * 300 + 4, np.uint8)
    y = np.frombuffer(raw.data, np.float32, 290, offset=1)
    x = _values("float32", 200, 0)
    try:
        k(x, y, 200, 50)
    except (TypeError, ValueError):
        pytest.skip("the kernel's checks refuse an unaligned array")
    np.testing.assert_array_equal(y[50:250], x)
    assert not y[:50].any() and not y[250:].any()


def test_reduce_chain_stream_calls_no_memcpy() -> None:
    """The reduce chain's streamed output (the LLVM backend's slow workload against numba):
    head and tail as masked stores, so no ``memcpy`` call is left in the chunk loop whose
    possibility made LLVM spill the next row's eight partial vectors on every chunk; with
    the module switch off, the scalar loops come back as ``memcpy`` calls."""
    import geode

    graph = examples.reduce_chain(inner=1024).graph
    x = np.random.default_rng(0).standard_normal((2, 3, 1024), dtype=np.float32)
    want = examples.reduce_chain(inner=1024).numpy(x)["y"]
    asm = {}
    for masked in (True, False):
        old = streams.MASKED_EDGES
        streams.MASKED_EDGES = masked
        try:
            m = geode.compile(graph, progress=0, model_cache=False)
        finally:
            streams.MASKED_EDGES = old
        np.testing.assert_allclose(m(x=x)["y"], want, rtol=1e-5)
        (k,) = [k for k in m.kernels if k.kind == "fused"]
        asm[masked] = k.asm
        if masked:
            assert "llvm.masked.store" in k.source
    assert "memcpy" not in asm[True]
    if host().has("avx512f"):
        assert "memcpy" in asm[False]


def _narrowed(features: str, drop: tuple[str, ...]) -> str:
    """``features`` with every ``+x`` whose name starts with one of ``drop`` turned off."""
    return ",".join(
        "-" + f[1:] if f.startswith("+") and f[1:].startswith(drop) else f
        for f in features.split(",")
        if f
    )


def _stream_on(target: Target, dtype: str) -> tuple[object, object]:
    """The stream copy of ``dtype`` compiled for ``target`` (O3, MCJIT) behind an exported
    ``run(dst, src, n, nt)``; returns (the ctypes function, its engine to keep alive)."""
    import ctypes

    import llvmlite.binding as llvm

    name, text, decls = streams.stream_function(dtype, False, target)
    wrapper = (
        "define void @run(ptr %dst, ptr %src, i64 %n, i1 %nt) {\n"
        f'  call void @"{name}"(ptr %dst, ptr %src, i64 %n, i1 %nt)\n'
        "  ret void\n}"
    )
    mod = llvm.parse_assembly("\n".join([text, *decls, wrapper]))
    mod.verify()
    tm = llvm.Target.from_triple(target.triple).create_target_machine(
        cpu=target.cpu, features=target.features, opt=3, jit=True
    )
    pb = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=3))
    pb.getModulePassManager().run(mod, pb)
    engine = llvm.create_mcjit_compiler(mod, tm)
    engine.finalize_object()
    proto = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_bool)
    return proto(engine.get_function_address("run")), engine


@pytest.mark.parametrize("narrow", ["avx512", "avx"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int8"])
def test_stream_on_narrower_targets(narrow: str, dtype: str) -> None:
    """The masked head and tail on AVX2 (32-byte vectors) and SSE (16 bytes, the masked
    stores scalarized by LLVM): the same values at every offset, nothing outside."""
    import dataclasses

    h = host()
    if not h.is_x86:
        pytest.skip("x86 feature names")
    drop = ("avx512",) if narrow == "avx512" else ("avx", "fma", "f16c", "vaes", "vpclmul")
    target = dataclasses.replace(h, features=_narrowed(h.features, drop))
    assert target.stream_vector_bytes == (32 if narrow == "avx512" else 16)
    run, _engine = _stream_on(target, dtype)
    lanes = target.stream_vector_bytes // np.dtype(dtype).itemsize
    for nt in (True, False):
        for off in range(lanes + 1):
            for n in (0, 1, lanes - 1, lanes + 1, 3 * lanes + 2):
                x = _values(dtype, n, n + off)
                y = np.full(n + off + 40, FILL).astype(dtype)
                run(y.ctypes.data + off * y.itemsize, x.ctypes.data, n, nt)
                want = np.full(n + off + 40, FILL).astype(dtype)
                want[off : off + n] = x
                np.testing.assert_array_equal(y, want)
