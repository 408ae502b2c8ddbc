"""Profitability of a legal conv fusion (``compiler/fusion/conv_epilogue.py``): the
speed-of-light model (``costmodel/sol.py: decide_merge``) on the conv's kernel and the
kernel after it, apart and fused.

- ``conv_epilogue``: apart, the conv writes its output and a second kernel reads it (and
  the residual) to write the sum; fused, the tile's epilogue reads the residual and the
  conv's output never goes to memory: the intermediate's write and read saved, a launch.
- ``conv_pool``: fused, the direct kernel computes a band of *pooled* rows per work item
  from the conv rows their windows reach, so where windows overlap across bands (a pool
  stride below its window) those conv rows are computed twice: the conv's flops grow by
  :func:`pool_recompute` (the kernel's band rule estimated at the shapes: symbolic dims
  at ``profit.NOMINAL_DIM``) against the intermediate's traffic saved. Small maps cut
  into many bands with a stride-1 pool lose.
"""

from __future__ import annotations

import math

import numpy as np
import sympy

from geode.compiler.fusion.conv_bands import BAND_BUDGET_BYTES, ITEMS_WANTED
from geode.compiler.fusion.conv_epilogue import ConvFusion
from geode.compiler.fusion.profit import NOMINAL_DIM, nbytes, numel
from geode.compiler.ir import Node, Value
from geode.costmodel.device import DeviceSpec
from geode.costmodel.sol import KernelWork, decide_merge

__all__ = ["conv_fusion_profit", "pool_recompute"]


def conv_fusion_profit(c: ConvFusion, spec: DeviceSpec) -> tuple[bool, str]:
    """Whether fusing ``c`` pays on ``spec``, and the cost model's reason."""
    conv = c.conv
    y = conv.outputs[0]
    ins = [v for v in conv.inputs if v is not None]
    flops = 2.0 * numel(y) * _taps(conv)
    read = sum(nbytes(v) for v in ins)
    if c.rule == "conv_epilogue":
        z = nbytes(c.z) if c.z is not None else 0.0
        epi = numel(y) * ((c.z is not None) + (c.relu is not None))
        separate = [KernelWork(read, nbytes(y), flops), KernelWork(nbytes(y) + z, nbytes(y), epi)]
        fused = KernelWork(read + z, nbytes(y), flops + epi)
        d = decide_merge(separate, fused, spec)
        return d.take, d.reason + _nominal_note(c)
    pooled = c.pool.outputs[0]
    kh, kw = (int(k) for k in c.pool.attrs["kernel_shape"])
    pool_flops = numel(pooled) * kh * kw
    factor = pool_recompute(conv, c.pool)
    separate = [
        KernelWork(read, nbytes(y), flops),
        KernelWork(nbytes(y), nbytes(pooled), pool_flops),
    ]
    fused = KernelWork(read, nbytes(pooled), flops * factor + pool_flops)
    d = decide_merge(separate, fused, spec, recompute_factor=round(factor, 2))
    return d.take, d.reason + _nominal_note(c)


def _nominal_note(c: ConvFusion) -> str:
    """What the figures assume when a shape is symbolic (the sizes are then nominal)."""
    values = [*c.conv.inputs, *c.conv.outputs, c.z, c.pool.outputs[0] if c.pool else None]
    if any(not isinstance(d, int) for v in values if v is not None for d in v.shape):
        return f" (symbolic dims taken as {NOMINAL_DIM})"
    return ""


def _taps(conv: Node) -> int:
    """Multiply-adds per output element: input channels per group times window taps."""
    return math.prod(int(d) for d in conv.inputs[1].shape[1:])


def _size(d: object) -> int:
    """A dim's size, symbolic dims at the nominal size."""
    if isinstance(d, int):
        return d
    return int(d.xreplace({s: sympy.Integer(NOMINAL_DIM) for s in d.free_symbols}))


def pool_recompute(conv: Node, pool: Node) -> float:
    """Conv rows the fused kernel computes per conv output row: the direct kernel's bands
    of pooled rows (:data:`ITEMS_WANTED` items, a scratch within
    :data:`BAND_BUDGET_BYTES`) each compute the conv rows their windows reach, so rows
    shared by two bands' windows are computed twice."""
    y: Value = conv.outputs[0]
    n, m, oh, ow = (_size(d) for d in y.shape)
    poh = _size(pool.outputs[0].shape[2])
    if oh <= 0 or poh <= 0:
        return 1.0
    w = conv.inputs[1].shape
    group = int(conv.attrs.get("group") or 1)
    sh, sw = (int(s) for s in conv.attrs.get("strides") or [1, 1])
    a = pool.attrs
    pkh = int(a["kernel_shape"][0])
    psh = int((a.get("strides") or [1, 1])[0])
    ppt = int((a.get("pads") or [0, 0, 0, 0])[0])
    item = np.dtype(y.dtype).itemsize
    wp = ow * sw + int(w[3]) - 1
    dh = int((conv.attrs.get("dilations") or [1, 1])[0])
    step = min(sh, dh * (int(w[2]) - 1) + 1)  # scratch rows per conv row (kernel's row_step)
    row_bytes = (wp * int(w[1]) * step + ow * (m // group)) * item * psh
    want = -(-ITEMS_WANTED // max(1, n * group))
    band = max(1, min(-(-poh // want), BAND_BUDGET_BYTES // max(1, row_bytes)))
    rows = 0
    for r0 in range(0, poh, band):
        yrows = min(band, poh - r0)
        first = min(max(r0 * psh - ppt, 0), oh)
        last = min((r0 + yrows - 1) * psh + pkh - ppt, oh)
        rows += max(last - first, 0)
    return max(rows / oh, 1.0)
