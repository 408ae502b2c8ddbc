"""What a native pooling kernel (:mod:`~.pool`) fixes at compile time: :class:`PoolSpec`,
and the parameters its entry hands the body (:data:`BODY_PARAMS`)."""

from __future__ import annotations

from dataclasses import dataclass

from geode.codegen.backends.llvm.conv_spec import AUTO_PADS, TYPES

__all__ = ["BODY_PARAMS", "OPS", "PoolSpec"]

#: the reductions a native pool computes
OPS = ("max", "avg")


@dataclass(frozen=True)
class PoolSpec:
    """What a compiled pool fixes (see :mod:`~.pool`). 1-D pools have ``spatial=1`` and
    the H entries of ``kernel``/``strides``/``dilations``/``pads`` at 1, 1, 1, 0; a
    global pool (``is_global``) reduces each whole plane and ignores the window fields.
    The channels are not fixed: every ``(n, c)`` plane is pooled alike."""

    dtype: str
    spatial: int  # 1 or 2
    op: str  # max | avg
    kernel: tuple[int, int] = (1, 1)  # (kh, kw)
    strides: tuple[int, int] = (1, 1)
    dilations: tuple[int, int] = (1, 1)
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)  # top, left, bottom, right
    auto_pad: str = "NOTSET"
    ceil_mode: bool = False
    count_include_pad: bool = False
    is_global: bool = False

    def __post_init__(self) -> None:
        if self.dtype not in TYPES or self.op not in OPS:
            raise ValueError(f"native pool: {self.op} over {self.dtype}")
        if self.spatial not in (1, 2) or self.auto_pad not in AUTO_PADS:
            raise ValueError(f"native pool: {self.spatial}-D / auto_pad {self.auto_pad}")
        if min(*self.kernel, *self.strides, *self.dilations) < 1 or min(self.pads) < 0:
            raise ValueError(f"native pool: bad window {self}")
        unit_h = self.kernel[0] == self.strides[0] == 1 and self.pads[0] == self.pads[2] == 0
        if self.spatial == 1 and not unit_h:
            raise ValueError("native pool: a 1-D pool has a unit H window")

    @property
    def explicit_pads(self) -> tuple[int, int, int, int]:
        """The pads of NOTSET (VALID: none); SAME pads are computed at run time."""
        return (0, 0, 0, 0) if self.auto_pad == "VALID" else self.pads

    @property
    def taps(self) -> int:
        """Window size (``kh * kw``)."""
        return self.kernel[0] * self.kernel[1]

    @property
    def arrays(self) -> tuple[str, ...]:
        """The entry's arrays, in order."""
        return ("X", "Y")

    def describe(self) -> str:
        """A short readable summary (kernel names, ``explain()``)."""
        head = f"{self.op}pool {self.spatial}-D {self.dtype}"
        if self.is_global:
            return f"global {head}"
        kh, kw = self.kernel
        pads = (
            self.auto_pad if self.auto_pad != "NOTSET" else "pads " + ",".join(map(str, self.pads))
        )
        extra = " ceil" * self.ceil_mode + " count_include_pad" * self.count_include_pad
        return f"{head} k={kh}x{kw} s={self.strides} d={self.dilations} {pads}{extra}"


#: the body's parameters: the arrays, the plane count (N * C), the input and output
#: sizes, the begin pads, and per axis the padded-coordinate range ``[lo, hi)`` whose
#: taps an average counts
BODY_PARAMS = [
    ("ptr noalias", "X"),
    ("ptr noalias", "Y"),
    *(
        ("i64", n)
        for n in ("planes", "H", "Wd", "OH", "OW", "pt", "pl", "hlo", "hhi", "wlo", "whi")
    ),
    ("i64", "threads"),
]
