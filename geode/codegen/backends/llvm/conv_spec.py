"""What a native conv (:mod:`~.conv`) fixes at compile time, and what its entry hands
the method's body: :class:`ConvSpec`, :class:`Geometry`, :data:`BODY_PARAMS`."""

from __future__ import annotations

from dataclasses import dataclass

from geode.codegen.backends.llvm.irtext import FunctionWriter

__all__ = [
    "AUTO_PADS",
    "MAX_DIRECT_TAPS",
    "WINOGRAD_F2_MIN_CHANNELS",
    "WINOGRAD_F2_MIN_WIDTH",
    "WINOGRAD_F4_MIN_WIDTH",
    "WINOGRAD_MIN_CHANNELS",
    "WINOGRAD_F4_NARROW",
    "WINOGRAD_TILES",
    "f4_width",
    "BODY_PARAMS",
    "TYPES",
    "ConvSpec",
    "Geometry",
    "body_geometry",
]

#: float type and item size of each dtype a native conv takes
TYPES = {"float32": ("float", 4), "float64": ("double", 8)}
AUTO_PADS = ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER")
#: the fused activations of a conv's epilogue ("": none)
ACTIVATIONS = ("", "relu")
#: windows of at most this many taps run the direct kernel (its tiles unroll the taps)
MAX_DIRECT_TAPS = 64
#: what ``ConvSpec.choice`` may ask for: the method by shape, or one forced
CHOICES = ("auto", "im2col", "direct", "winograd")
#: Winograd's tile sides: F(2x2, 3x3) and F(4x4, 3x3)
WINOGRAD_TILES = (2, 4)
#: F(4x4, 3x3) from this output width up (4 tiles a row; or when the width is known only
#: at run time) and at :data:`WINOGRAD_F4_NARROW` columns, F(2x2, 3x3) at the others (9-12
#: and below 5 columns). The kernel packs narrow rows (``winograd.c``: row groups): a
#: vector of 8 lanes holds 2 tile rows at 4 tiles a row, 4 at 2, and an item multiplies up
#: to 3 tile rows together at 5 to 8; F(4x4) measured 0.62-0.92 of F(2x2)'s time at 13-23
#: columns and 0.62-0.86 at 5-8 (16 to 512 channels; the small cnn's 64-channel 16x16
#: conv 0.131 -> 0.090 ms), 1.2-1.5 at 9-12 and at 4 (3 tiles a row and 1: lanes empty)
WINOGRAD_F4_MIN_WIDTH = 13
#: the narrow output widths (first, last) that take F(4x4, 3x3) too: 2 tiles a row
WINOGRAD_F4_NARROW = (5, 8)
#: ``auto`` takes F(4x4, 3x3) when the input and output channels are at least this many
WINOGRAD_MIN_CHANNELS = 16
#: and F(2x2, 3x3) (9-12 and below 5 columns) at least this many channels and this output
#: width (0.72-0.98 of the direct kernel's time at 32 to 128 channels, 4 and 9-12 columns;
#: 1.27 at 24 channels; all the rules measured by bench/winograd.py and the Winograd
#: sections of docs/performance.md)
WINOGRAD_F2_MIN_CHANNELS = 32
WINOGRAD_F2_MIN_WIDTH = 4


def f4_width(width: int) -> bool:
    """Whether Winograd takes F(4x4, 3x3) at this output width (F(2x2, 3x3) otherwise):
    from :data:`WINOGRAD_F4_MIN_WIDTH` columns, and at :data:`WINOGRAD_F4_NARROW`."""
    lo, hi = WINOGRAD_F4_NARROW
    return width >= WINOGRAD_F4_MIN_WIDTH or lo <= width <= hi


@dataclass(frozen=True)
class ConvSpec:
    """What a compiled conv fixes (see :mod:`~.conv`). 1-D convs have ``spatial=1``
    and the H entries of ``kernel``/``strides``/``dilations``/``pads`` at 1, 1, 1, 0."""

    dtype: str
    spatial: int  # 1 or 2
    channels: int  # C
    out_channels: int  # M
    group: int
    kernel: tuple[int, int]  # (kh, kw)
    strides: tuple[int, int]
    dilations: tuple[int, int]
    pads: tuple[int, int, int, int]  # top, left, bottom, right (unused by SAME_*)
    auto_pad: str
    bias: bool
    #: the epilogue: Z (Y's shape) added after the bias, then the activation
    residual: bool = False
    activation: str = ""
    #: ``auto``: the method by shape; ``im2col`` or ``direct``: that one where it applies
    choice: str = "auto"
    #: a MaxPool of the conv's output: (kh, kw, sh, sw, top, left, bottom, right), or ()
    pool: tuple[int, ...] = ()
    #: W is a constant known at compile time (Winograd transforms it then)
    constant_weight: bool = True
    #: the output width when known at compile time (0: known only at run time)
    out_width: int = 0
    #: Winograd's output tile side (:data:`WINOGRAD_TILES`; 0: by the output width)
    winograd_tile: int = 0

    def __post_init__(self) -> None:
        if self.dtype not in TYPES:
            raise ValueError(f"native conv: dtype {self.dtype} is not float32/float64")
        if self.spatial not in (1, 2) or self.auto_pad not in AUTO_PADS:
            raise ValueError(f"native conv: {self.spatial}-D / auto_pad {self.auto_pad}")
        if self.group < 1 or self.channels % self.group or self.out_channels % self.group:
            raise ValueError(
                f"native conv: C={self.channels}, M={self.out_channels} and group={self.group}"
            )
        if self.winograd_tile not in (0, *WINOGRAD_TILES) or self.out_width < 0:
            raise ValueError(f"native conv: Winograd tile {self.winograd_tile}")
        if self.activation not in ACTIVATIONS or self.choice not in CHOICES:
            raise ValueError(f"native conv: activation {self.activation!r} / {self.choice!r}")
        if self.pool and (
            len(self.pool) != 8
            or self.spatial != 2
            or min(self.pool[:4]) < 1
            or min(self.pool[4:]) < 0
            or self.residual
            or self.strides[1] > 2
            or self.cg == 0
            or self.kernel[0] * self.kernel[1] > MAX_DIRECT_TAPS
            or (self.cg == 1 and self.group > 1)
        ):
            raise ValueError(f"native conv: pooling {self.pool} with {self}")
        if min(*self.kernel, *self.strides, *self.dilations) < 1 or min(self.pads) < 0:
            raise ValueError(f"native conv: bad window {self}")
        unit_h = self.kernel[0] == self.strides[0] == 1 and self.pads[0] == self.pads[2] == 0
        if self.spatial == 1 and not unit_h:
            raise ValueError("native conv: a 1-D conv has a unit H window")

    @property
    def cg(self) -> int:
        """Input channels per group."""
        return self.channels // self.group

    @property
    def mg(self) -> int:
        """Output channels per group."""
        return self.out_channels // self.group

    @property
    def depth(self) -> int:
        """Rows of a group's column matrix: ``C/g * kh * kw`` (the GEMM's K)."""
        return self.cg * self.kernel[0] * self.kernel[1]

    @property
    def explicit_pads(self) -> tuple[int, int, int, int]:
        """The pads of NOTSET (VALID: none); SAME pads are computed at run time."""
        return (0, 0, 0, 0) if self.auto_pad == "VALID" else self.pads

    @property
    def method(self) -> str:
        """``depthwise``, ``pointwise``, ``winograd``, ``direct`` or ``im2col`` (see
        :mod:`~.conv`): depthwise for one input channel per group; a 1x1 window at unit
        stride without padding is one GEMM on the input; a conv Winograd runs
        (:attr:`winograd_blocker`) by Winograd with ``choice="winograd"``, or by shape
        (:attr:`winograd_pays`) with ``choice="auto"``; other windows of 2 to :data:`MAX_DIRECT_TAPS`
        taps, and strided 1x1 windows, at horizontal stride 1 or 2 run the direct kernel
        (``choice="im2col"`` forces im2col there), the rest im2col (a padded 1x1 window
        at stride 1 among them). A strided 1x1 conv, direct, reads only the rows and
        columns its taps read: 0.65 of im2col + GEMM's time at 1x32x32x32 -> 64, 0.89 at
        8x32x112x112, one thread, Zen 5 (docs/performance.md)."""
        if self.cg == 1 and self.group > 1:
            return "depthwise"
        if self.pool:
            return "direct"  # the one method that pools its output
        if self.depth == 0:
            return "im2col"  # no input channels: Y is the bias, no GEMM runs
        unit = self.kernel == (1, 1) and self.strides == (1, 1)
        if unit and (self.auto_pad != "NOTSET" or not any(self.pads)):
            return "pointwise"  # SAME with a 1x1 window at stride 1 pads nothing
        wanted = self.choice == "winograd" or (self.choice == "auto" and self.winograd_pays)
        if wanted and not self.winograd_blocker:
            return "winograd"
        taps = self.kernel[0] * self.kernel[1]
        small = 1 < taps <= MAX_DIRECT_TAPS or (taps == 1 and self.strides != (1, 1))
        if self.strides[1] <= 2 and small and self.choice != "im2col":
            return "direct"
        return "im2col"

    @property
    def winograd_blocker(self) -> str:
        """Why the Winograd kernel cannot run this conv ("" when it can: float32, 2-D,
        a 3x3 window, stride 1, dilation 1, one group, no fused MaxPool)."""
        if self.dtype != "float32":
            return f"{self.dtype} (Winograd: float32)"
        if self.spatial != 2 or self.kernel != (3, 3):
            return f"a {self.kernel[0]}x{self.kernel[1]} window (Winograd: 3x3)"
        if self.strides != (1, 1) or self.dilations != (1, 1):
            return f"strides {self.strides}, dilations {self.dilations} (Winograd: 1)"
        if self.group != 1:
            return f"group={self.group} (Winograd: 1)"
        if self.pool:
            return "a fused MaxPool (the direct kernel pools)"
        if self.depth == 0:
            return "no input channels"
        if not self.constant_weight:
            return "W is not a constant known at compile time"
        return ""

    @property
    def tile_side(self) -> int:
        """Winograd's output tile side: ``winograd_tile`` when given, else 4 at the
        widths :func:`f4_width` takes, 2 at the others; 0 when the width is
        known only at run time (the kernel then takes both transforms and picks by the
        same rule at run time)."""
        if self.winograd_tile:
            return self.winograd_tile
        if not self.out_width:
            return 0
        return 4 if f4_width(self.out_width) else 2

    @property
    def winograd_tiles(self) -> tuple[int, ...]:
        """The tile sides whose transforms the Winograd kernel takes, in order."""
        return (self.tile_side,) if self.tile_side else WINOGRAD_TILES

    @property
    def winograd_pays(self) -> bool:
        """Whether Winograd measured faster than the direct kernel for this conv's
        channels and output width (see :data:`WINOGRAD_MIN_CHANNELS`)."""
        least = min(self.channels, self.out_channels)
        if self.tile_side != 2:
            return least >= WINOGRAD_MIN_CHANNELS
        return least >= WINOGRAD_F2_MIN_CHANNELS and self.out_width >= WINOGRAD_F2_MIN_WIDTH

    def _rule(self) -> str:
        """The rule by shape for this conv's tile, as text."""
        if self.tile_side != 2:
            return f"C, M >= {WINOGRAD_MIN_CHANNELS}"
        return f"C, M >= {WINOGRAD_F2_MIN_CHANNELS} and width >= {WINOGRAD_F2_MIN_WIDTH}"

    @property
    def reason(self) -> str:
        """Why the method was chosen, for ``explain()`` ("" for the methods that follow
        from the window alone)."""
        if self.method == "winograd":
            tile = f"F({self.tile_side}x{self.tile_side},3x3)"
            if not self.tile_side:
                lo, hi = WINOGRAD_F4_NARROW
                tile = (
                    f"F(4x4,3x3), F(2x2,3x3) below {WINOGRAD_F4_MIN_WIDTH} columns but at {lo}-{hi}"
                )
            elif self.tile_side == 4 and self.out_width <= 32:
                tiles = -(-self.out_width // 4)
                rows = f"{8 // tiles} tile rows" if tiles in (2, 4) else "one tile row"
                tile += f" in row groups ({tiles} tiles a row, {rows} a vector)"
            if self.choice == "winograd":
                return f"Winograd {tile}: forced by conv_method=winograd"
            return (
                f"Winograd {tile}: C={self.channels}, M={self.out_channels}, "
                f"width {self.out_width or 'known at run time'}: {self._rule()}, where it "
                "measured faster than the direct kernel (docs/performance.md)"
            )
        if self.method not in ("direct", "im2col") or self.choice == "im2col":
            return ""
        blocker = self.winograd_blocker
        if blocker and self.method == "direct" and self.kernel == (1, 1):
            return (
                f"not Winograd: {blocker}; a strided 1x1 window: direct (only the rows and "
                "columns it reads copied), where it measured faster than im2col + GEMM"
            )
        if blocker:
            return f"not Winograd: {blocker}"
        if self.choice == "direct":
            return "not Winograd: conv_method=direct"
        return (
            f"not Winograd: C={self.channels}, M={self.out_channels}, width "
            f"{self.out_width or 'known at run time'}: outside {self._rule()}, where the "
            "direct kernel measured faster"
        )

    @property
    def arrays(self) -> tuple[str, ...]:
        """The entry's arrays, in order: X, W, then B and Z when the conv has them, Y."""
        return ("X", "W") + ("B",) * self.bias + ("Z",) * self.residual + ("Y",)

    def describe(self) -> str:
        """A short readable summary (kernel names, ``explain()``)."""
        kh, kw = self.kernel
        pads = (
            self.auto_pad if self.auto_pad != "NOTSET" else "pads " + ",".join(map(str, self.pads))
        )
        return (
            f"{self.method} {self.spatial}-D {self.dtype} C={self.channels} M={self.out_channels} "
            f"g={self.group} k={kh}x{kw} s={self.strides} d={self.dilations} {pads}"
            + (" +bias" if self.bias else "")
            + (" +residual" if self.residual else "")
            + (f" +{self.activation}" if self.activation else "")
            + (
                " +maxpool {}x{} s{},{} pads {}".format(
                    *self.pool[:4], ",".join(map(str, self.pool[4:]))
                )
                if self.pool
                else ""
            )
        )


@dataclass(frozen=True)
class Geometry:
    """The IR operands an entry hands its body: pointers, sizes and pads (i64)."""

    x: str
    w: str
    b: str  # "null" without a bias
    y: str
    n: str
    h: str
    wd: str
    oh: str
    ow: str
    pt: str
    pl: str
    threads: str

    def args(self) -> str:
        """The body's call arguments."""
        ptrs = ", ".join(f"ptr {p}" for p in (self.x, self.w, self.b, self.y))
        ints = ", ".join(
            f"i64 {v}"
            for v in (self.n, self.h, self.wd, self.oh, self.ow, self.pt, self.pl, self.threads)
        )
        return f"{ptrs}, {ints}"


#: the body's parameters, in :meth:`Geometry.args` order
BODY_PARAMS = [
    ("ptr noalias", "X"),
    ("ptr noalias", "W"),
    ("ptr noalias", "B"),
    ("ptr noalias", "Y"),
    *(("i64", n) for n in ("N", "H", "Wd", "OH", "OW", "pt", "pl", "threads")),
]


def body_geometry(fn: FunctionWriter) -> Geometry:
    """The body function's parameters as a :class:`Geometry`."""
    return Geometry(*(fn.param(i) for i in range(len(BODY_PARAMS))))
