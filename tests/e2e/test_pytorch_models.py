"""Real architectures exported from PyTorch compile, fuse and match onnxruntime and ONNX's
reference evaluator at many dynamic sizes, size-1 dims included.

The models (``tests/data/torch_*.onnx``, made by ``tests/data/make_torch_models.py``)
are committed, so torch is not needed here: a small ResNet (conv + folded BatchNorm,
residual adds, MaxPool, global average pool, Gemm), a MobileNetV3 block (depthwise conv,
BatchNormalization nodes, HardSwish, HardSigmoid squeeze-excite, Clip), an LSTM + GRU
stack (ONNX LSTM/GRU ops), a LLaMA block (hand-written RMSNorm, rotary embedding, causal
mask, SwiGLU), a BERT layer (embeddings from int64 token ids, an int64 attention mask,
erf GELU, LayerNormalization), a 1-D temporal conv net (dilation, GroupNorm and
InstanceNorm, LeakyReLU, ConvTranspose1d) and a small U-Net (reflect Pad, ceil-mode
AveragePool, grouped conv, ConvTranspose2d, nearest and bilinear Resize, LogSoftmax).

Tolerances: every model is float32 end to end and every output is a few dozen
operations deep (a handful of reductions over at most 64 elements), so geode's result
differs from the references by rounding order only: rtol 1e-4 / atol 1e-5 (the
project's float32 policy, as in ``test_torch_export.py``) with a wide margin; the
largest error seen is a few 1e-7 absolute.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable

import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator
from opcheck import model_runner

import geode
from geode.codegen.driver import CodegenWarning

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")
RTOL, ATOL = 1e-4, 1e-5

Feeds = dict[str, np.ndarray]


def _floats(*shapes: tuple[int, ...]) -> Callable[[np.random.Generator], list[Feeds]]:
    """Feeds of one float32 input ``x`` per shape."""
    return lambda rng: [{"x": rng.standard_normal(s).astype(np.float32)} for s in shapes]


def _bert_feeds(rng: np.random.Generator) -> list[Feeds]:
    """Token ids below the vocabulary (50), masks with padded tails and one all-ones row."""
    feeds = []
    for batch, seq in [(1, 1), (2, 5), (3, 8), (1, 17), (2, 32)]:
        ids = rng.integers(0, 50, (batch, seq)).astype(np.int64)
        mask = np.ones((batch, seq), np.int64)
        mask[1:, seq // 2 + 1 :] = 0
        feeds.append({"input_ids": ids, "attention_mask": mask})
    return feeds


#: model file -> the feeds it runs on (the dims after the first are the dynamic ones)
MODELS = {
    "torch_resnet.onnx": _floats((1, 3, 1, 1), (2, 3, 16, 16), (1, 3, 7, 9), (3, 3, 1, 13)),
    "torch_mobilenet.onnx": _floats((1, 8, 1, 1), (2, 8, 10, 10), (1, 8, 3, 7), (3, 8, 6, 1)),
    "torch_rnn.onnx": _floats((1, 1, 8), (2, 5, 8), (3, 7, 8), (1, 12, 8)),
    "torch_llama.onnx": _floats((1, 1, 16), (2, 5, 16), (3, 7, 16), (1, 17, 16)),
    "torch_bert.onnx": _bert_feeds,
    "torch_tcn.onnx": _floats((1, 4, 1), (2, 4, 12), (3, 4, 7), (1, 4, 33)),
    # reflect padding needs at least 2 pixels per side (onnxruntime refuses fewer)
    "torch_unet.onnx": _floats((1, 3, 2, 2), (2, 3, 8, 8), (1, 3, 7, 9), (3, 3, 5, 2)),
}


def _load(name: str) -> geode.load:
    """Compile a model; no fused group may fall back to the reference engine."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", CodegenWarning)
        return geode.load(os.path.join(DATA, name))


#: models whose check takes the longest (the U-Net: about 4 s on two cores) run in `-m slow`
SLOW_MODELS = {"torch_unet.onnx"}


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_MODELS else n for n in sorted(MODELS)],
)
def test_real_model_matches_references(name):
    path = os.path.join(DATA, name)
    model = _load(name)
    assert any(k.engine == "aicore" for k in model.kernels), "nothing was fused and compiled"
    # every dim is known symbolically: nothing is left unfused for want of a shape
    assert "known only at run time" not in model.explain()
    kernels = [k.name for k in model.kernels]
    ref, evaluator = model_runner(path), ReferenceEvaluator(path)
    for feeds in MODELS[name](np.random.default_rng(0)):
        got = model(**feeds)
        sizes = {k: v.shape for k, v in feeds.items()}
        want, also = ref(feeds), evaluator.run(None, feeds)
        assert list(got) == list(model.output_names)
        for out, w, a in zip(model.output_names, want, also):
            assert got[out].shape == w.shape, (out, sizes)
            assert got[out].dtype == w.dtype, (out, sizes)
            np.testing.assert_allclose(got[out], w, rtol=RTOL, atol=ATOL, err_msg=f"{out} {sizes}")
            np.testing.assert_allclose(got[out], a, rtol=RTOL, atol=ATOL, err_msg=f"{out} {sizes}")
    assert [k.name for k in model.kernels] == kernels  # one compile served every size


def test_bert_rejects_positions_past_its_table():
    """Sequences longer than the position table (32) are a GeodeError, not garbage."""
    model = _load("torch_bert.onnx")
    ids = np.zeros((1, 33), np.int64)
    with pytest.raises(geode.GeodeError, match="out of range"):
        model(input_ids=ids, attention_mask=np.ones_like(ids))
    with pytest.raises(geode.GeodeError, match="int64"):
        model(input_ids=ids.astype(np.float32), attention_mask=np.ones_like(ids))
