"""Library modules of single AICPU nodes started ahead at the schedule stage
(``spine._start_libraries``: ``native_conv.start_conv``, ``native_pool.start_pool``,
``native_rnn.start_lstm``): each module is queued on the background LLVM threads, claimed
at bind (compiled once), nothing is left pending, and the results match the reference."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import geode
from geode.codegen.backends.llvm.library import blas

pytestmark = pytest.mark.skipif(blas() is None, reason="no BLAS in numpy's wheel or process")


def _conv_pool_model():
    """Conv 3x3 (direct) + Relu, then AveragePool 2x2: a conv and a pool module."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("AveragePool", ["r"], ["y"], kernel_shape=[2, 2], strides=[2, 2]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 12, 12])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    g = helper.make_graph(nodes, "convpool", [x], [y], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _lstm_model():
    """One forward LSTM of 8 hidden units over 5 inputs: an LSTM module."""
    rng = np.random.default_rng(1)
    shapes = {"W": (1, 32, 5), "R": (1, 32, 8), "B": (1, 64)}
    inits = [
        numpy_helper.from_array((rng.standard_normal(s) * 0.5).astype(np.float32), n)
        for n, s in shapes.items()
    ]
    nodes = [helper.make_node("LSTM", ["x", "W", "R", "B"], ["y"], hidden_size=8)]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 2, 5])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    g = helper.make_graph(nodes, "lstm", [x], [y], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(
    "make, feed, names",
    [
        (_conv_pool_model, (1, 3, 12, 12), ("@geode_conv_direct_", "@geode_avgpool_")),
        (_lstm_model, (4, 2, 5), ("@geode_lstm",)),
    ],
)
def test_library_modules_start_ahead_and_compile_once(tmp_path, llvm_runs, make, feed, names):
    """Each library module the bind stage links was queued at the schedule stage and
    compiled exactly once (the bind stage claimed it); the results match onnx's
    reference evaluator."""
    from geode.codegen.backends.llvm import background

    started, compiled = llvm_runs
    before = background.pending()
    onnx_model = make()
    model = geode.compile(onnx_model, cache_dir=str(tmp_path), model_cache=False, progress=0)
    for name in names:
        irs = [ir for ir in started if name in ir]
        assert len(irs) == 1, (name, model.explain())
        assert compiled.count(irs[0]) == 1
    assert background.pending() == before
    x = np.random.default_rng(2).standard_normal(feed).astype(np.float32)
    got = model.run({"x": x})
    want = ReferenceEvaluator(onnx_model).run(None, {"x": x})
    np.testing.assert_allclose(got["y"], want[0], rtol=1e-4, atol=1e-5)


def test_every_native_library_op_has_its_module() -> None:
    """The spine's op table (its modules imported on first use) names every op the native
    conv, pool and LSTM code take, and those functions exist."""
    from geode import spine
    from geode.codegen.native_pool import POOL_OPS
    from geode.compiler.ops.nn import FUSED_CONV

    want = {"Conv", FUSED_CONV, "LSTM", *POOL_OPS}
    assert set(spine._NATIVE_LIBRARIES) == want
    for load, start, interface in spine._NATIVE_LIBRARIES.values():
        m = load()
        assert callable(getattr(m, start)) and callable(getattr(m, interface))


def test_a_model_without_lstm_never_imports_its_code_generator(tmp_path) -> None:
    """The LSTM's code generator (~18 ms of imports) stays unimported by a compile of a
    model without one; the conv model imports the conv and pool modules it uses."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import onnx

    path = tmp_path / "convpool.onnx"
    onnx.save(_conv_pool_model(), str(path))
    code = (
        "import sys, geode\n"
        f"geode.compile({str(path)!r}, cache_dir={str(tmp_path / 'c')!r}, progress=0)\n"
        "print(sorted(m for m in sys.modules if m.startswith('geode.codegen.native_')))\n"
    )
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": root}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    mods = out.stdout.strip().splitlines()[-1]
    assert "native_conv" in mods and "native_pool" in mods and "native_rnn" not in mods
