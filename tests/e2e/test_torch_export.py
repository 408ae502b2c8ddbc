"""Models exported by PyTorch with dynamic batch and sequence axes compile once and run
for many sizes, matching onnxruntime.

The models (``tests/data/torch_*.onnx``) are committed, with the script that made them
(``tests/data/make_torch_models.py``), so torch is not needed to run these tests; their
graphs hold the Shape/Gather/Unsqueeze/Concat/Reshape chains of ``view``/``reshape`` on
dynamic dims. onnxruntime is the reference when installed; ONNX's reference evaluator
always checks too.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator
from opcheck import model_runner

import geode
from geode.codegen.driver import CodegenWarning

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")
SIZES = [(1, 1), (2, 5), (3, 8), (4, 3), (1, 17)]


@pytest.mark.parametrize("name,width", [("torch_block.onnx", 16), ("torch_mlp.onnx", 8)])
def test_dynamic_batch_and_sequence(name, width):
    path = os.path.join(DATA, name)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CodegenWarning)  # no group may fall back
        model = geode.load(path)
    assert sum(k.engine == "aicore" for k in model.kernels) > 0, "nothing was fused and compiled"
    sig = model.signature
    assert "batch" in sig and "seq" in sig, sig
    ref = model_runner(path)
    evaluator = ReferenceEvaluator(path)
    rng = np.random.default_rng(0)
    for batch, seq in SIZES:
        x = rng.standard_normal((batch, seq, width)).astype(np.float32)
        got = model(x=x)
        want = ref({"x": x})
        also = evaluator.run(None, {"x": x})
        for name_out, w, a in zip(model.output_names, want, also):
            assert got[name_out].shape == w.shape, (name_out, batch, seq)
            np.testing.assert_allclose(
                got[name_out], w, rtol=1e-4, atol=1e-5, err_msg=f"{name_out} {batch}x{seq}"
            )
            np.testing.assert_allclose(got[name_out], a, rtol=1e-4, atol=1e-5)


def test_one_compile_serves_every_size():
    """The compiled plan binds batch and seq at run time: no recompilation per size."""
    model = geode.load(os.path.join(DATA, "torch_block.onnx"))
    kernels = [k.name for k in model.kernels]
    for batch, seq in SIZES:
        model(x=np.zeros((batch, seq, 16), np.float32))
    assert [k.name for k in model.kernels] == kernels
    with pytest.raises(geode.GeodeError, match="16"):
        model(x=np.zeros((2, 3, 15), np.float32))


@pytest.mark.slow  # re-exports with torch: about 4 s
def test_exporter_script_regenerates_the_models(tmp_path):
    """When torch is installed, the committed script still exports loadable models."""
    pytest.importorskip(
        "torch", reason="torch is not installed; the committed models are used as they are"
    )
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "make_torch_models", os.path.join(DATA, "make_torch_models.py")
    )
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    mod.HERE = str(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod.main()
    for name in ("torch_block.onnx", "torch_mlp.onnx"):
        model = geode.load(tmp_path / name)
        assert model(x=np.ones((2, 3, 16 if "block" in name else 8), np.float32))
