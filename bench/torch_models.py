"""PyTorch model builders shared by the test models and the benchmarks (needs torch).

``tests/data/make_torch_models.py`` exports small instances of these for the committed
test models; ``bench/models.py`` exports larger ones to time against onnxruntime. Every
module is in eval mode when exported by :func:`export_onnx` (TorchScript-based exporter,
``dynamo=False``, dynamic axes), so the graphs carry the Shape -> Gather -> Unsqueeze ->
Concat -> Reshape chains that ``view``/``reshape`` on dynamic dims produce.
"""

from __future__ import annotations

import math
import os

import torch
from torch import nn

OPSET = 17


class Block(nn.Module):
    """A pre-norm (GPT-2 style) transformer block with causal multi-head attention; returns
    the block's output and its mean over the sequence."""

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


class RMSNorm(nn.Module):
    """RMSNorm written out by hand, as LLaMA and T5 do it."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class LlamaMlp(nn.Module):
    """A LLaMA MLP block: RMSNorm, then the SiLU-gated (SwiGLU) MLP, plus the residual."""

    def __init__(self, dim: int = 16, hidden: int = 40):
        super().__init__()
        self.norm = RMSNorm(dim)
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        return x + self.down(nn.functional.silu(self.gate(h)) * self.up(h))


class LstmCell(nn.Module):
    """One LSTM step written out (input and recurrent projections, four gates); returns
    the new hidden and cell states."""

    def __init__(self, inputs: int = 8, hidden: int = 8):
        super().__init__()
        self.x2g = nn.Linear(inputs, 4 * hidden)
        self.h2g = nn.Linear(hidden, 4 * hidden, bias=False)

    def forward(
        self, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        i, f, g, o = (self.x2g(x) + self.h2g(h)).chunk(4, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c), c


class Lstm(nn.Module):
    """``nn.LSTM`` (batch first) over a whole sequence; returns every step's hidden state
    and the last cell state."""

    def __init__(self, inputs: int = 8, hidden: int = 8):
        super().__init__()
        self.lstm = nn.LSTM(inputs, hidden, batch_first=True)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y, (_, c) = self.lstm(x)
        return y, c[-1]


class ResNet(nn.Module):
    """A small ResNet: stem, two residual stages (one strided with a 1x1 shortcut), head;
    ``width`` channels in the first stage, twice that in the second."""

    def __init__(self, classes: int = 10, width: int = 8):
        super().__init__()
        w, w2 = width, 2 * width
        self.stem = nn.Sequential(nn.Conv2d(3, w, 3, padding=1, bias=False), nn.BatchNorm2d(w))
        self.pool = nn.MaxPool2d(3, stride=2, padding=1)
        self.a1 = nn.Sequential(nn.Conv2d(w, w, 3, padding=1, bias=False), nn.BatchNorm2d(w))
        self.a2 = nn.Sequential(nn.Conv2d(w, w, 3, padding=1, bias=False), nn.BatchNorm2d(w))
        self.b1 = nn.Sequential(nn.Conv2d(w, w2, 3, 2, padding=1, bias=False), nn.BatchNorm2d(w2))
        self.b2 = nn.Sequential(nn.Conv2d(w2, w2, 3, padding=1, bias=False), nn.BatchNorm2d(w2))
        self.short = nn.Sequential(nn.Conv2d(w, w2, 1, 2, bias=False), nn.BatchNorm2d(w2))
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(w2, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(torch.relu(self.stem(x)))
        x = torch.relu(x + self.a2(torch.relu(self.a1(x))))
        x = torch.relu(self.short(x) + self.b2(torch.relu(self.b1(x))))
        return self.head(x)


class MixerBlock(nn.Module):
    """An MLP-Mixer block: a token-mixing MLP across the ``tokens`` patches (on the
    transposed input), then a channel-mixing MLP, each pre-normed with a residual."""

    def __init__(self, tokens: int = 8, channels: int = 16, token_hidden: int = 8):
        super().__init__()
        self.ln1 = nn.LayerNorm(channels)
        self.tok = nn.Sequential(
            nn.Linear(tokens, token_hidden), nn.GELU(), nn.Linear(token_hidden, tokens)
        )
        self.ln2 = nn.LayerNorm(channels)
        self.chan = nn.Sequential(
            nn.Linear(channels, 4 * channels), nn.GELU(), nn.Linear(4 * channels, channels)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.tok(self.ln1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.chan(self.ln2(x))


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


def export_onnx(
    model: nn.Module,
    samples: dict[str, torch.Tensor],
    path: str | os.PathLike,
    outputs: list[str],
    axes: dict[str, dict[int, str]],
    keep_batchnorm: bool = False,
) -> str:
    """Export ``model`` (in eval mode) with named inputs ``samples`` and the dynamic
    ``axes`` to ``path``; returns the path.

    The exporter folds eval-mode BatchNorm into the preceding conv; ``keep_batchnorm``
    exports it as an ONNX BatchNormalization node instead (the model stays in eval mode).
    """
    mode = torch.onnx.TrainingMode.PRESERVE if keep_batchnorm else torch.onnx.TrainingMode.EVAL
    torch.onnx.export(
        model.eval(),
        tuple(samples.values()),
        str(path),
        input_names=list(samples),
        output_names=outputs,
        dynamic_axes=axes,
        opset_version=OPSET,
        training=mode,
        dynamo=False,
    )
    return str(path)
