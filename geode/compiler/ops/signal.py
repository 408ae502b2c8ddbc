"""Signal processing: DFT, STFT and MelWeightMatrix (ONNX opset 17/20).

Complex tensors are real tensors whose last dim holds ``[real, imaginary]`` (size 2);
a real signal has a last dim of 1. Reference kernels use ``numpy.fft`` in the input's
precision (complex64 for float16/float32, complex128 for double) and return the input
dtype.

* ``DFT(input, dft_length?, axis?)`` (opset 20 form: ``axis`` is an input, default -2):
  the DFT of ``dft_length`` points (the signal zero-padded or truncated) along ``axis``;
  ``onesided`` keeps the ``n // 2 + 1`` non-redundant bins; ``inverse`` computes the
  inverse DFT (normalized by 1/n; with ``onesided`` the input is one-sided and the
  output real).
* ``STFT(signal, frame_step, window?, frame_length?)``: the DFT of every frame of the
  signal (``(batch, length, 1|2)``) weighted by the window; output ``(batch, frames,
  bins, 2)`` with ``frames = 1 + (length - frame_length) // frame_step``.
* ``MelWeightMatrix``: the ``(dft_length // 2 + 1, num_mel_bins)`` matrix of triangular
  mel filters (as ONNX's reference builds it).

They run on the AICPU engine (OpKind.LIBRARY).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from geode.compiler import dtypes
from geode.compiler.ir import TensorDesc
from geode.compiler.ops.registry import Attr, In, InferContext, OpDef, OpKind, Out, register
from geode.compiler.shapes import Dim, as_dim
from geode.errors import ShapeError, VerifyError

_INDEX = dtypes.INDEX


def _scalar_int(v: Any) -> int | None:
    return None if v is None else int(np.asarray(v).reshape(-1)[0])


def as_complex(x: np.ndarray) -> np.ndarray:
    """A complex array from a real tensor whose last dim is 1 (real) or 2 (real, imag)."""
    ct = np.complex128 if x.dtype == np.float64 else np.complex64  # numpy.fft keeps complex64
    if x.shape[-1] == 1:
        return x[..., 0].astype(ct)
    if x.shape[-1] == 2:
        z = np.empty(x.shape[:-1], dtype=ct)
        z.real, z.imag = x[..., 0], x[..., 1]
        return z
    raise ShapeError(f"the last dim must be 1 (real) or 2 (complex), got {x.shape[-1]}")


def as_real_pair(z: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A complex array as a real tensor with a trailing [real, imag] dim."""
    return np.stack([z.real, z.imag], axis=-1).astype(dtype)


def dft(
    x: np.ndarray, dft_length: int | None, axis: int, inverse: bool, onesided: bool
) -> np.ndarray:
    """ONNX DFT on numpy arrays."""
    x = np.asarray(x)
    r = x.ndim
    if not -r <= axis < r - 1 and axis != -r:
        raise ShapeError(f"DFT: axis {axis} is out of range (the last dim is the complex one)")
    ax = axis % r
    if ax == r - 1:
        raise ShapeError("DFT: the last dim holds real/imaginary parts and cannot be transformed")
    z = as_complex(x)  # drops the last dim; ax still indexes the signal dims
    if inverse:
        n = (
            dft_length
            if dft_length is not None
            else (2 * (z.shape[ax] - 1) if onesided else z.shape[ax])
        )
        if onesided:
            return np.fft.irfft(z, n=n, axis=ax)[..., None].astype(x.dtype)
        return as_real_pair(np.fft.ifft(z, n=n, axis=ax), x.dtype)
    n = dft_length if dft_length is not None else z.shape[ax]
    out = np.fft.fft(z, n=n, axis=ax)
    if onesided:
        out = np.take(out, np.arange(n // 2 + 1), axis=ax)
    return as_real_pair(out, x.dtype)


def _dft_axis(ctx: InferContext) -> int | None:
    if not ctx.has(2):
        return -2
    return _scalar_int(ctx.value(2))


def _dft_infer(ctx: InferContext) -> list[TensorDesc]:
    x = ctx.shape(0)
    dtype = ctx.dtype(0)
    if x is None:
        return [TensorDesc(dtype, None)]
    r = len(x)
    if r < 2:
        ctx.fail(f"input must have rank >= 2 (signal dims + [real, imag]), got {list(x)}")
    axis = _dft_axis(ctx)
    inverse, onesided = bool(ctx.attr("inverse")), bool(ctx.attr("onesided"))
    if axis is None:
        return [TensorDesc(dtype, tuple(ctx.fresh() for _ in range(r)))]
    ax = axis % r
    if ax == r - 1:
        ctx.fail("axis may not be the last dim (it holds real/imaginary parts)")
    n: Dim | None = _scalar_int(ctx.value(1)) if ctx.has(1) else None
    if ctx.has(1) and n is None:
        n = ctx.fresh("dft")
    size = x[ax]
    if n is None:
        n = as_dim(2 * (size - 1)) if inverse and onesided else size
    out = list(x)
    if inverse:
        out[ax] = n
        out[-1] = 1 if onesided else 2
    else:
        out[ax] = (n // 2 + 1 if isinstance(n, int) else ctx.fresh("bins")) if onesided else n
        out[-1] = 2
    return [TensorDesc(dtype, tuple(out))]


def _dft_verify(ctx: InferContext) -> None:
    x = ctx.shape(0)
    if x is not None and isinstance(x[-1], int) and x[-1] not in (1, 2):
        ctx.fail(f"the last dim must be 1 (real) or 2 (complex), got {x[-1]}")
    for i, what in ((1, "dft_length"), (2, "axis")):
        s = ctx.shape(i) if ctx.has(i) else None
        if s is not None and len(s) > 1:
            ctx.fail(f"{what} must be a scalar, got shape {list(s)}")
    v = ctx.value(1) if ctx.has(1) else None
    if v is not None and _scalar_int(v) < 1:
        ctx.fail(f"dft_length must be positive, got {_scalar_int(v)}", VerifyError)


register(
    OpDef(
        "DFT",
        OpKind.LIBRARY,
        inputs=[
            In("input", "T1"),
            In("dft_length", "T2", optional=True),
            In("axis", "T3", optional=True),
        ],
        outputs=[Out("output", "T1")],
        types={"T1": dtypes.FLOATS, "T2": _INDEX, "T3": frozenset([np.dtype(np.int64)])},
        attrs=[Attr("inverse", "int", 0), Attr("onesided", "int", 0)],
        verify=_dft_verify,
        infer=_dft_infer,
        kernel=lambda ins, a: [
            dft(
                ins[0],
                _scalar_int(ins[1]) if len(ins) > 1 else None,
                _scalar_int(ins[2]) if len(ins) > 2 and ins[2] is not None else -2,
                bool(a["inverse"]),
                bool(a["onesided"]),
            )
        ],
        value_inputs=(1, 2),
        doc="discrete Fourier transform along axis (complex as a trailing [re, im] dim)",
    )
)


# -- STFT ----------------------------------------------------------------------------------------
def stft(
    signal: np.ndarray,
    frame_step: int,
    window: np.ndarray | None,
    frame_length: int | None,
    onesided: bool,
) -> np.ndarray:
    """ONNX STFT on numpy arrays: (batch, frames, bins, 2)."""
    x = np.asarray(signal)
    length = x.shape[1]
    if frame_length is None:
        frame_length = length if window is None else int(np.asarray(window).shape[0])
    w = np.ones(frame_length) if window is None else np.asarray(window).astype(np.float64)
    if w.shape[0] != frame_length:
        raise ShapeError(f"STFT: window has {w.shape[0]} entries, frame_length is {frame_length}")
    if frame_step < 1:
        raise ShapeError(f"STFT: frame_step must be positive, got {frame_step}")
    n_frames = 1 + (length - frame_length) // frame_step
    if n_frames < 1:
        raise ShapeError(f"STFT: the signal ({length}) is shorter than a frame ({frame_length})")
    z = as_complex(x)  # (batch, length)
    starts = np.arange(n_frames) * frame_step
    frames = (
        z[:, starts[:, None] + np.arange(frame_length)[None, :]] * w
    )  # (batch, frames, frame_length)
    spec = np.fft.fft(frames, n=frame_length, axis=-1)
    if onesided:
        spec = spec[..., : frame_length // 2 + 1]
    return as_real_pair(spec, x.dtype)


def _stft_infer(ctx: InferContext) -> list[TensorDesc]:
    x = ctx.shape(0)
    dtype = ctx.dtype(0)
    batch: Dim = x[0] if x is not None else ctx.fresh()
    step = _scalar_int(ctx.value(1))
    fl: Dim | None = None
    if ctx.has(3):
        fl = _scalar_int(ctx.value(3))
    elif ctx.has(2) and ctx.shape(2) is not None:
        fl = ctx.shape(2)[0]
    elif x is not None:
        fl = x[1]
    frames: Dim = ctx.fresh("frames")
    if (
        x is not None
        and fl is not None
        and step is not None
        and isinstance(x[1], int)
        and isinstance(fl, int)
    ):
        frames = 1 + (x[1] - fl) // step
    bins: Dim = ctx.fresh("bins")
    if isinstance(fl, int):
        bins = fl // 2 + 1 if ctx.attr("onesided") else fl
    return [TensorDesc(dtype, (batch, frames, bins, 2))]


register(
    OpDef(
        "STFT",
        OpKind.LIBRARY,
        inputs=[
            In("signal", "T1"),
            In("frame_step", "T2"),
            In("window", "T1", optional=True),
            In("frame_length", "T2", optional=True),
        ],
        outputs=[Out("output", "T1")],
        types={"T1": dtypes.FLOATS, "T2": _INDEX},
        attrs=[Attr("onesided", "int", 1)],
        infer=_stft_infer,
        kernel=lambda ins, a: [
            stft(
                ins[0],
                int(_scalar_int(ins[1]) or 0),
                ins[2] if len(ins) > 2 else None,
                _scalar_int(ins[3]) if len(ins) > 3 and ins[3] is not None else None,
                bool(a["onesided"]),
            )
        ],
        value_inputs=(1, 3),
        doc="short-time Fourier transform: the DFT of each windowed frame",
    )
)


# -- MelWeightMatrix -----------------------------------------------------------------------------
def mel_weight_matrix(
    num_mel_bins: int,
    dft_length: int,
    sample_rate: int,
    lower_hz: float,
    upper_hz: float,
    dtype: np.dtype,
) -> np.ndarray:
    """Triangular mel filters over the ``dft_length // 2 + 1`` spectrogram bins."""
    n_spec = dft_length // 2 + 1
    edges = np.arange(num_mel_bins + 2)
    lo_mel = 2595 * np.log10(1 + lower_hz / 700)
    hi_mel = 2595 * np.log10(1 + upper_hz / 700)
    mel = edges * ((hi_mel - lo_mel) / (num_mel_bins + 2)) + lo_mel
    hz = 700 * (10 ** (mel / 2595) - 1)
    bins = (((dft_length + 1) * hz) // sample_rate).astype(int)
    out = np.zeros((n_spec, num_mel_bins))
    j = np.arange(n_spec)[:, None]
    left, center, right = bins[:-2][None, :], bins[1:-1][None, :], bins[2:][None, :]
    rise = center - left
    up = np.where(
        (j >= left) & (j <= center) & (rise > 0), (j - left) / np.where(rise > 0, rise, 1), 0.0
    )
    up = np.where((rise == 0) & (j == center), 1.0, up)
    fall = right - center
    down = np.where(
        (j >= center) & (j < right) & (fall > 0), (right - j) / np.where(fall > 0, fall, 1), 0.0
    )
    out = np.where(down > 0, down, up)  # the falling edge overwrites the shared center bin
    out = np.where((j == center) & (fall > 0), 1.0, out)
    return out.astype(dtype)


def _mel_infer(ctx: InferContext) -> list[TensorDesc]:
    dtype = dtypes.to_numpy(int(ctx.attr("output_datatype")))
    n_mel = _scalar_int(ctx.value(0))
    n_dft = _scalar_int(ctx.value(1))
    return [
        TensorDesc(
            dtype,
            (
                n_dft // 2 + 1 if n_dft is not None else ctx.fresh(),
                n_mel if n_mel is not None else ctx.fresh(),
            ),
        )
    ]


register(
    OpDef(
        "MelWeightMatrix",
        OpKind.HOST,
        inputs=[
            In("num_mel_bins", "T1"),
            In("dft_length", "T1"),
            In("sample_rate", "T1"),
            In("lower_edge_hertz", "T2"),
            In("upper_edge_hertz", "T2"),
        ],
        outputs=[Out("output", "T3")],
        types={"T1": _INDEX, "T2": dtypes.FLOATS},
        attrs=[Attr("output_datatype", "int", 1)],
        infer=_mel_infer,
        kernel=lambda ins, a: [
            mel_weight_matrix(
                int(_scalar_int(ins[0]) or 0),
                int(_scalar_int(ins[1]) or 0),
                int(_scalar_int(ins[2]) or 0),
                float(np.asarray(ins[3]).reshape(-1)[0]),
                float(np.asarray(ins[4]).reshape(-1)[0]),
                dtypes.to_numpy(int(a["output_datatype"])),
            )
        ],
        value_inputs=(0, 1),
        doc="mel filter bank weights (spectrogram bins x mel bins)",
    )
)

__all__ = ["as_complex", "as_real_pair", "dft", "mel_weight_matrix", "stft"]
