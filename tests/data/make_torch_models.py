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


def main() -> None:
    """Write both models."""
    torch.manual_seed(0)
    print(export(Block(), torch.randn(2, 5, 16), "torch_block.onnx", ["y", "pooled"]))
    torch.manual_seed(1)
    print(export(Mlp(), torch.randn(2, 5, 8), "torch_mlp.onnx", ["y"]))


if __name__ == "__main__":
    main()
