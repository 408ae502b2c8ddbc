"""Regenerate the PyTorch-exported ONNX models under tests/data/ (needs torch).

    python tests/data/make_torch_models.py

Exports with torch's TorchScript-based exporter (``dynamo=False``) and dynamic axes, so
the graphs carry the Shape -> Gather -> Unsqueeze -> Concat -> Reshape chains that
``view``/``reshape`` on dynamic dims produce:

* ``torch_block.onnx``: a pre-norm transformer block (LayerNorm, multi-head causal
  self-attention with ``view``/``transpose`` on the dynamic batch and sequence dims,
  GELU MLP) on input ``x`` of shape ``(batch, seq, 16)``; outputs ``y`` (same shape) and
  ``pooled`` (``(batch, 16)``, a mean over the sequence).
* ``torch_mlp.onnx``: ``x`` of shape ``(batch, seq, 8)`` flattened with
  ``view(batch, -1)``-style reshapes through an MLP on the last dim, then
  ``reshape(batch, seq * 4)``; output ``y``.

Weights come from a fixed seed, so regenerating gives the same files (up to exporter
version differences). The modules the benchmarks export too (``Block``, ``BertLayer``,
``RMSNorm``, ``ResNet``) and the exporter call live in ``bench/torch_models.py``.
"""

from __future__ import annotations

import math
import os
import sys

import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repository: bench/

from bench.torch_models import (  # noqa: E402
    BertLayer,
    Block,
    ResNet,
    RMSNorm,
    export_onnx,
    randomize_norms,
)


class Mlp(nn.Module):
    """An MLP applied to every position, with reshapes over the dynamic dims."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        flat = x.reshape(b * t, c)
        y = self.fc2(torch.relu(self.fc1(flat)))
        return y.view(b, -1)


class MobileBlock(nn.Module):
    """A MobileNetV3 inverted residual: expand, depthwise, squeeze-excite, project."""

    def __init__(self, c: int = 8, expand: int = 24, squeeze: int = 8):
        super().__init__()
        self.expand = nn.Sequential(nn.Conv2d(c, expand, 1, bias=False), nn.BatchNorm2d(expand))
        self.dw = nn.Sequential(
            nn.Conv2d(expand, expand, 3, padding=1, groups=expand, bias=False),
            nn.BatchNorm2d(expand),
        )
        self.se = nn.Sequential(
            nn.AdaptiveAvgPool2d(1),
            nn.Conv2d(expand, squeeze, 1),
            nn.ReLU(),
            nn.Conv2d(squeeze, expand, 1),
            nn.Hardsigmoid(),
        )
        self.project = nn.Sequential(nn.Conv2d(expand, c, 1, bias=False), nn.BatchNorm2d(c))
        self.act = nn.Hardswish()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.expand(x))
        h = self.act(self.dw(h))
        h = h * self.se(h)
        return nn.functional.relu6(x + self.project(h))


class Recurrent(nn.Module):
    """A two-layer LSTM feeding a bidirectional GRU, both batch-first."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(8, 12, num_layers=2, batch_first=True)
        self.gru = nn.GRU(12, 6, batch_first=True, bidirectional=True)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h, (hn, cn) = self.lstm(x)
        y, _ = self.gru(h)
        return y, hn[-1], cn[-1]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) over the last dim."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaBlock(nn.Module):
    """A LLaMA-style block: RMSNorm, rotary causal attention, SwiGLU MLP."""

    def __init__(self, dim: int = 16, heads: int = 2, hidden: int = 40):
        super().__init__()
        self.heads, self.hd = heads, dim // heads
        self.norm1, self.norm2 = RMSNorm(dim), RMSNorm(dim)
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)
        inv = 1.0 / (10000 ** (torch.arange(0, self.hd, 2).float() / self.hd))
        self.register_buffer("inv_freq", inv, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        h = self.norm1(x)
        q = self.wq(h).view(b, t, self.heads, self.hd).transpose(1, 2)
        k = self.wk(h).view(b, t, self.heads, self.hd).transpose(1, 2)
        v = self.wv(h).view(b, t, self.heads, self.hd).transpose(1, 2)
        pos = torch.arange(t, dtype=torch.float32)
        freqs = torch.outer(pos, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.hd)
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        att = torch.softmax(att.masked_fill(mask, torch.finfo(torch.float32).min), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.wo(y)
        h = self.norm2(x)
        return x + self.down(nn.functional.silu(self.gate(h)) * self.up(h))


class Temporal(nn.Module):
    """A 1-D temporal conv net: dilated conv, GroupNorm, LeakyReLU, InstanceNorm, upsampling."""

    def __init__(self, c_in: int = 4, c: int = 8):
        super().__init__()
        self.conv1 = nn.Conv1d(c_in, c, 3, padding=2, dilation=2)
        self.gn = nn.GroupNorm(2, c)
        self.conv2 = nn.Conv1d(c, c, 5, padding=2)
        self.inorm = nn.InstanceNorm1d(c, affine=True)
        self.up = nn.ConvTranspose1d(c, c_in, 4, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = nn.functional.leaky_relu(self.gn(self.conv1(x)), 0.1)
        h = h + nn.functional.leaky_relu(self.inorm(self.conv2(h)), 0.1)
        return self.up(h)


class TinyUNet(nn.Module):
    """A two-level U-Net: reflect padding, grouped conv, ceil-mode average pooling,
    nearest and bilinear upsampling, ConvTranspose2d, skip concatenation, tanh-GELU and
    a per-pixel LogSoftmax over the classes."""

    def __init__(self, c: int = 4, classes: int = 3):
        super().__init__()
        self.enc = nn.Sequential(
            nn.ReflectionPad2d(1), nn.Conv2d(3, 2 * c, 3), nn.GELU(approximate="tanh")
        )
        self.down = nn.Sequential(
            nn.AvgPool2d(2, ceil_mode=True), nn.Conv2d(2 * c, 2 * c, 3, padding=1, groups=2)
        )
        self.up_t = nn.ConvTranspose2d(2 * c, c, 2, stride=2)
        self.up_n = nn.Upsample(scale_factor=2, mode="nearest")
        self.up_b = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
        self.head = nn.Conv2d(2 * c + c + 4 * c, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        e = self.enc(x)
        d = self.down(e)
        u = torch.cat((self.up_t(d), self.up_n(d), self.up_b(d)), dim=1)[..., :h, :w]
        return torch.log_softmax(self.head(torch.cat((e, u), dim=1)), dim=1)


def export(model: nn.Module, sample: torch.Tensor, name: str, outputs: list[str]) -> str:
    """Export ``model`` with dynamic batch and seq axes; returns the file path."""
    axes = {"x": {0: "batch", 1: "seq"}}
    for o in outputs:
        axes[o] = {0: "batch"}
    return export_named(model, {"x": sample}, name, outputs, axes)


def export_named(
    model: nn.Module,
    samples: dict[str, torch.Tensor],
    name: str,
    outputs: list[str],
    axes: dict[str, dict[int, str]],
    keep_batchnorm: bool = False,
) -> str:
    """Export ``model`` to ``HERE/name`` (see ``bench.torch_models.export_onnx``)."""
    path = os.path.join(HERE, name)
    return export_onnx(model, samples, path, outputs, axes, keep_batchnorm)


def main() -> None:
    """Write every model."""
    torch.manual_seed(0)
    print(export(Block(), torch.randn(2, 5, 16), "torch_block.onnx", ["y", "pooled"]))
    torch.manual_seed(1)
    print(export(Mlp(), torch.randn(2, 5, 8), "torch_mlp.onnx", ["y"]))
    image = {0: "batch", 2: "height", 3: "width"}
    torch.manual_seed(2)
    resnet = randomize_norms(ResNet())
    x = torch.randn(2, 3, 16, 16)
    print(export_named(resnet, {"x": x}, "torch_resnet.onnx", ["logits"], {"x": image}))
    torch.manual_seed(3)
    mobile = randomize_norms(MobileBlock())
    x = torch.randn(2, 8, 10, 10)
    axes = {"x": image, "y": image}
    print(export_named(mobile, {"x": x}, "torch_mobilenet.onnx", ["y"], axes, keep_batchnorm=True))
    torch.manual_seed(4)
    seq = {0: "batch", 1: "seq"}
    print(
        export_named(
            Recurrent(),
            {"x": torch.randn(2, 5, 8)},
            "torch_rnn.onnx",
            ["y", "h_last", "c_last"],
            {"x": seq, "y": seq, "h_last": {0: "batch"}, "c_last": {0: "batch"}},
        )
    )
    torch.manual_seed(5)
    x = torch.randn(2, 5, 16)
    print(export_named(LlamaBlock(), {"x": x}, "torch_llama.onnx", ["y"], {"x": seq, "y": seq}))
    torch.manual_seed(6)
    ids = torch.randint(0, 50, (2, 5))
    mask = torch.ones(2, 5, dtype=torch.long)
    print(
        export_named(
            BertLayer(),
            {"input_ids": ids, "attention_mask": mask},
            "torch_bert.onnx",
            ["hidden", "pooled"],
            {"input_ids": seq, "attention_mask": seq, "hidden": seq, "pooled": {0: "batch"}},
        )
    )
    torch.manual_seed(7)
    time = {0: "batch", 2: "time"}
    temporal = randomize_norms(Temporal())
    x = torch.randn(2, 4, 12)
    print(export_named(temporal, {"x": x}, "torch_tcn.onnx", ["y"], {"x": time, "y": time}))
    torch.manual_seed(8)
    x = torch.randn(2, 3, 8, 8)
    axes = {"x": image, "y": image}
    print(export_named(TinyUNet(), {"x": x}, "torch_unet.onnx", ["y"], axes))


if __name__ == "__main__":
    main()
