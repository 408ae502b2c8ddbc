"""Memory stays flat under load (issue 39): 10,000 calls of one model, and model after
model compiled and deleted in one process, keep RSS bounded; a deleted model's kernels,
JIT libraries and weights are freed.

RSS is read from ``/proc/self/statm``. The numbers are printed (``-s``); the bounds are
loose enough for allocator noise and tight enough to catch a per-call or per-model leak.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import weakref
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import geode
from geode import ops
from geode.codegen.backends.llvm import kernel as kernel_mod

KIB = 1024
MIB = 1 << 20


def rss() -> int:
    """Resident set size of this process, in bytes."""
    with open("/proc/self/statm", encoding="utf-8") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


W = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)


def dense_model() -> geode.Graph:
    """``h = tanh(x @ W + 1)`` (a native GEMM with its epilogue) and ``sum(h * h)``."""
    g = geode.Graph("calls")
    x = g.input("x", ["N", 64], "float32")
    w = g.constant(W, name="w")
    h = ops.tanh(ops.matmul(x, w) + 1.0)
    g.output(h, ops.reduce_sum(h * h, axes=[1]), names=["h", "s"])
    return g


@pytest.mark.slow  # 11,000 calls: about 10 s on two cores
def test_ten_thousand_calls_keep_rss_flat() -> None:
    model = geode.compile(dense_model())
    rng = np.random.default_rng(1)
    # small batches, and one whose output (1.1 MB) comes from the output pool
    sizes = [3, 17, 5, 1100] + [3, 17] * 3
    feeds = [rng.standard_normal((n, 64)).astype(np.float32) for n in sizes]

    def calls(n: int) -> None:
        out = None
        for i in range(n):
            out = model(x=feeds[i % len(feeds)])
        del out

    calls(1000)  # warm-up: pools, memo, bindings, thread stacks
    gc.collect()
    start = rss()
    samples = []
    for _ in range(5):
        calls(2000)
        gc.collect()
        samples.append(rss() - start)
    print(
        f"\nRSS over 10,000 calls after warm-up (KiB, every 2,000): {[s // KIB for s in samples]}"
    )
    assert samples[-1] < 1 * MIB, samples
    assert samples[-1] - samples[0] < 256 * KIB, "RSS grows with the number of calls"
    x, w = feeds[3].astype(np.float64), W.astype(np.float64)
    h = np.tanh(x @ w + 1)
    out = model(x=feeds[3])
    # float32 sums of 64 products in any order: within K eps sum|x w| of the exact product
    # (tanh's slope is at most 1), the float32 rounding of h on top
    bound = 64 * np.finfo(np.float32).eps * (np.abs(x) @ np.abs(w)) + 1e-6
    np.testing.assert_array_less(np.abs(out["h"] - h), bound)
    np.testing.assert_allclose(out["s"], (h * h).sum(1, keepdims=True), rtol=1e-4)


def conv_model(i: int) -> onnx.ModelProto:
    """Conv + Sigmoid + MaxPool + Flatten + MatMul + Tanh: native conv, pool and dense
    kernels and fused ones; ``i`` changes the shapes (distinct kernels per model)."""
    rng = np.random.default_rng(i)
    c = 3 + i % 4
    w = rng.standard_normal((8, c, 3, 3)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    w2 = rng.standard_normal((8 * 8 * 8, 10 + i)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c"], ["r"]),  # a fused kernel (a Relu joins the conv)
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("MatMul", ["f", "W2"], ["m"]),
        helper.make_node("Tanh", ["m"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        f"conv{i}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", c, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10 + i])],
        [
            numpy_helper.from_array(w, "W"),
            numpy_helper.from_array(b, "B"),
            numpy_helper.from_array(w2, "W2"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def memo_items() -> dict[int, object]:
    """Every kernel and linked code the LLVM backend's memos know now, by id."""
    from geode.codegen.backends.llvm.conv import conv_kernel
    from geode.codegen.backends.llvm.pool import pool_kernel

    memos = [kernel_mod._memo, kernel_mod._linked, conv_kernel.memo, pool_kernel.memo]
    return {id(k): k for memo in memos for _, k in memo.items()}


def test_a_deleted_models_kernels_and_weights_are_freed(tmp_path) -> None:
    """Fused, conv, pool and dense kernels (each with its JIT library) and the model's
    weights in the session die with the model (once the memos' recent kernels are let
    go, see test_backend_llvm)."""
    from geode.codegen.driver import device_spec

    device_spec(str(tmp_path))  # a new cache folder calibrates (kernels of the process's)
    gc.collect()
    before = set(memo_items())
    session = geode.Session(cache_dir=str(tmp_path))
    model = geode.compile(conv_model(1), session=session)
    x = np.random.default_rng(0).standard_normal((2, 4, 16, 16)).astype(np.float32)
    assert model(x=x)["y"].shape == (2, 11)
    engines = {k.kind for k in model.kernels if k.engine == "aicore"}
    assert {"fused", "library"} <= engines, engines
    mine = [k for i, k in memo_items().items() if i not in before]
    kinds = {type(k).__name__ for k in mine}
    assert {"LLVMKernel", "ConvKernel", "PoolKernel", "Loaded"} <= kinds, kinds
    assert sum(type(k).__name__ == "Loaded" for k in mine) >= 4, "fused, conv, pool, dense"
    refs = [weakref.ref(k) for k in mine]
    vm = session.var_manager
    assert vm.nbytes > 0
    del model, mine
    kernel_mod.drop_recent_kernels()
    gc.collect()
    assert all(r() is None for r in refs), "a kernel outlived its model"
    assert len(vm) == 0 and vm.nbytes == 0, vm.describe()
    session.close()


@pytest.mark.slow  # compiles models in turn: about 6 s
def test_models_compiled_and_deleted_give_their_weights_back() -> None:
    """geode.compile's default session kept every model's constants (8 MiB each here:
    +144 MiB over 20 models before); now they leave with the model."""
    samples = []
    for i in range(6):
        g = geode.Graph(f"weights{i}")
        x = g.input("x", ["N", 1024], "float32")
        w = g.constant(np.random.default_rng(i).standard_normal((1024, 2048)).astype(np.float32))
        g.output(ops.matmul(x, w), names=["y"])
        model = geode.compile(g)
        assert model(x=np.ones((2, 1024), np.float32))["y"].shape == (2, 2048)
        del model, g, w
        gc.collect()
        samples.append(rss())
    growth = samples[-1] - samples[1]
    print(f"\nRSS after 4 more models of 8 MiB of weights: {growth / MIB:+.1f} MiB")
    assert growth < 8 * MIB, [s // MIB for s in samples]


_MODELS_SCRIPT = r"""
import gc, json, os, sys, time
import numpy as np
sys.path.insert(0, {here!r})
import geode
from geode import examples
from test_memory_growth import conv_model, rss

cache = sys.argv[1]
rng = np.random.default_rng(0)

def once(i):
    model = geode.compile(conv_model(i), cache_dir=cache)
    c = 3 + i % 4
    model(x=rng.standard_normal((2, c, 16, 16)).astype(np.float32))
    ex = examples.layernorm(hidden=64 + i)
    other = geode.compile(ex.graph, cache_dir=cache)
    other(**ex.make_inputs(rng, 3))

def series(indices):
    out = []
    for i in indices:
        once(i)
        gc.collect()
        out.append(rss())
    return out

t0 = time.perf_counter()
distinct = series(range(50))           # 100 models, all different
same = series([7] * 50)                # the same two models, 50 times
print(json.dumps({{"distinct": distinct, "same": same, "seconds": time.perf_counter() - t0}}))
"""


@pytest.mark.slow
def test_fifty_models_compiled_and_deleted_keep_rss_bounded(tmp_path) -> None:
    script = _MODELS_SCRIPT.format(here=str(Path(__file__).parent))
    res = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "cache")],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout.strip().splitlines()[-1])
    distinct, same = data["distinct"], data["same"]
    per_model = (distinct[-1] - distinct[9]) / (2 * 40)
    same_growth = same[-1] - same[9]
    print(
        f"\n50 x 2 distinct models: RSS {distinct[9] / MIB:.1f} -> {distinct[-1] / MIB:.1f} MiB "
        f"({per_model / KIB:.0f} KiB per model after the first 20); the same 2 models 50 "
        f"times: {same_growth / KIB:.0f} KiB after the first 20; {data['seconds']:.0f} s"
    )
    # LLVM keeps ~10 KB per JIT library ever linked (llvmlite cannot remove one), so
    # distinct kernels cost that much each; everything else is freed or bounded
    assert per_model < 256 * KIB, per_model
    assert same_growth < 1 * MIB, same_growth
