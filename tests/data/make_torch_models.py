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
version differences).
"""

from __future__ import annotations

import math
import os

import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
OPSET = 17


class Block(nn.Module):
    """A pre-norm transformer block with causal multi-head attention."""

    def __init__(self, dim: int = 16, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, t, c = x.shape
        h = self.ln1(x)
        q, k, v = self.qkv(h).split(c, dim=-1)
        hd = c // self.heads
        q = q.view(b, t, self.heads, hd).transpose(1, 2)
        k = k.view(b, t, self.heads, hd).transpose(1, 2)
        v = v.view(b, t, self.heads, hd).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
        att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        x = x + self.mlp(self.ln2(x))
        return x, x.mean(dim=1)


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


class ResNet(nn.Module):
    """A small ResNet: stem, two residual stages (one strided with a 1x1 shortcut), head."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8))
        self.pool = nn.MaxPool2d(3, stride=2, padding=1)
        self.a1 = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8))
        self.a2 = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8))
        self.b1 = nn.Sequential(nn.Conv2d(8, 16, 3, 2, padding=1, bias=False), nn.BatchNorm2d(16))
        self.b2 = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16))
        self.short = nn.Sequential(nn.Conv2d(8, 16, 1, 2, bias=False), nn.BatchNorm2d(16))
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(torch.relu(self.stem(x)))
        x = torch.relu(x + self.a2(torch.relu(self.a1(x))))
        x = torch.relu(self.short(x) + self.b2(torch.relu(self.b1(x))))
        return self.head(x)


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


class RMSNorm(nn.Module):
    """RMSNorm written out by hand, as LLaMA and T5 do it."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


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


class BertLayer(nn.Module):
    """A BERT embedding + one encoder layer + pooler, with an attention-mask input."""

    def __init__(self, vocab: int = 50, positions: int = 32, dim: int = 16, heads: int = 2):
        super().__init__()
        self.heads, self.hd = heads, dim // heads
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(positions, dim)
        self.ln_emb = nn.LayerNorm(dim, eps=1e-12)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.ln1 = nn.LayerNorm(dim, eps=1e-12)
        self.ffn = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.ln2 = nn.LayerNorm(dim, eps=1e-12)
        self.pool = nn.Linear(dim, dim)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        b, t = input_ids.shape
        positions = torch.arange(t, dtype=torch.long).unsqueeze(0)
        x = self.ln_emb(self.tok(input_ids) + self.pos(positions))
        q, k, v = self.qkv(x).split(x.shape[-1], dim=-1)
        q = q.view(b, t, self.heads, self.hd).permute(0, 2, 1, 3)
        k = k.view(b, t, self.heads, self.hd).permute(0, 2, 3, 1)
        v = v.view(b, t, self.heads, self.hd).permute(0, 2, 1, 3)
        bias = (1.0 - attention_mask[:, None, None, :].to(torch.float32)) * -10000.0
        att = torch.softmax(q @ k / math.sqrt(self.hd) + bias, dim=-1)
        y = (att @ v).permute(0, 2, 1, 3).reshape(b, t, -1)
        x = self.ln1(x + self.out(y))
        x = self.ln2(x + self.ffn(x))
        return x, torch.tanh(self.pool(x[:, 0]))


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
    path = os.path.join(HERE, name)
    axes = {"x": {0: "batch", 1: "seq"}}
    for o in outputs:
        axes[o] = {0: "batch"}
    torch.onnx.export(
        model.eval(),
        (sample,),
        path,
        input_names=["x"],
        output_names=outputs,
        dynamic_axes=axes,
        opset_version=OPSET,
        dynamo=False,
    )
    return path


def export_named(
    model: nn.Module,
    samples: dict[str, torch.Tensor],
    name: str,
    outputs: list[str],
    axes: dict[str, dict[int, str]],
    keep_batchnorm: bool = False,
) -> str:
    """Export ``model`` with named inputs ``samples`` and the given dynamic ``axes``.

    The exporter folds eval-mode BatchNorm into the preceding conv; ``keep_batchnorm``
    exports it as an ONNX BatchNormalization node instead (the model stays in eval mode).
    """
    mode = torch.onnx.TrainingMode.PRESERVE if keep_batchnorm else torch.onnx.TrainingMode.EVAL
    path = os.path.join(HERE, name)
    torch.onnx.export(
        model.eval(),
        tuple(samples.values()),
        path,
        input_names=list(samples),
        output_names=outputs,
        dynamic_axes=axes,
        opset_version=OPSET,
        training=mode,
        dynamo=False,
    )
    return path


def randomize_norms(model: nn.Module) -> nn.Module:
    """Give every norm layer non-trivial affine parameters and running statistics."""
    for m in model.modules():
        if isinstance(m, (nn.BatchNorm2d, nn.GroupNorm, nn.InstanceNorm1d)):
            with torch.no_grad():
                if m.weight is not None:
                    m.weight.uniform_(0.5, 1.5)
                    m.bias.uniform_(-0.5, 0.5)
                if isinstance(m, nn.BatchNorm2d):
                    m.running_mean.uniform_(-0.5, 0.5)
                    m.running_var.uniform_(0.5, 2.0)
    return model


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
