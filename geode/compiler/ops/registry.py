"""The op prototype registry: one :class:`OpDef` per op type, keyed by (domain, type).

In the style of GE's op prototype library, an OpDef holds the op's schema (inputs,
outputs, attributes, dtype constraints), a ``verify`` hook run first, an
``infer_shape`` function over symbolic shapes, the op *kind* the fusion planner
reads, and a numpy reference kernel with ONNX semantics.

Registering an op::

    register(OpDef(
        "Relu", OpKind.ELEMENTWISE,
        inputs=[In("X", "T")], outputs=[Out("Y", "T")],
        types={"T": dtypes.NUMERIC},
        infer=same_as_input(0),
        kernel=lambda ins, attrs: [np.maximum(ins[0], 0)],
    ))
"""

from __future__ import annotations

import enum
import importlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from geode.compiler import dtypes
from geode.compiler.ir import set_node_inference
from geode.errors import DTypeError, GeodeError, ShapeError, UnknownOpError, VerifyError

if TYPE_CHECKING:
    import sympy

    from geode.compiler.ir import Graph, Node, TensorDesc, Value
    from geode.compiler.shapes import Shape


class OpKind(enum.Enum):
    """What the fusion planner and partitioner need to know of an op."""

    ELEMENTWISE = "elementwise"  # same shape in and out, one element from one element
    BROADCAST = "broadcast"  # elementwise with numpy broadcasting of inputs
    INJECTIVE = "injective"  # layout/index maps: each output element reads one input element
    REDUCE = "reduce"  # reduces some axes
    LIBRARY = "library"  # MatMul, Gemm, Conv, pooling: dedicated library kernels
    HOST = "host"  # shape computations and data-dependent ops: host engine
    OPAQUE = "opaque"  # anything else (composites before decomposition, control flow)


REQUIRED = object()  # marks an attribute without a default


@dataclass(frozen=True)
class In:
    """An input of an op schema; ``type`` names a type variable of the schema."""

    name: str
    type: str = "T"
    optional: bool = False
    variadic: bool = False


@dataclass(frozen=True)
class Out:
    """An output of an op schema."""

    name: str
    type: str = "T"
    optional: bool = False
    variadic: bool = False


@dataclass(frozen=True)
class Attr:
    """An attribute: name, kind (int, float, string, ints, floats, strings, tensor, graph) and default."""

    name: str
    kind: str
    default: Any = None

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


_ATTR_CHECK = {
    "int": lambda v: (
        isinstance(v, (int, np.integer)) and not isinstance(v, bool) or isinstance(v, bool)
    ),
    "float": lambda v: isinstance(v, (int, float, np.floating, np.integer)),
    "string": lambda v: isinstance(v, (str, bytes)),
    "ints": lambda v: (
        isinstance(v, (list, tuple, np.ndarray))
        and all(isinstance(x, (int, np.integer)) for x in v)
    ),
    "floats": lambda v: isinstance(v, (list, tuple, np.ndarray)),
    "strings": lambda v: isinstance(v, (list, tuple)),
    "tensor": lambda v: isinstance(v, np.ndarray),
    "graph": lambda v: True,
    "any": lambda v: True,
}

InferFn = Callable[["InferContext"], "list[TensorDesc]"]
KernelFn = Callable[[list, dict], Sequence[np.ndarray]]


@dataclass
class OpDef:
    """The prototype of one op type."""

    op_type: str
    kind: OpKind
    inputs: list[In]
    outputs: list[Out]
    infer: InferFn
    kernel: KernelFn | None
    types: dict[str, frozenset] = field(default_factory=dict)
    attrs: list[Attr] = field(default_factory=list)
    verify: Callable[[InferContext], None] | None = None
    #: inputs whose *values* (not only shapes) decide output shapes
    value_inputs: tuple[int, ...] = ()
    domain: str = ""
    doc: str = ""

    def attr_spec(self, name: str) -> Attr | None:
        """The schema of one attribute."""
        return next((a for a in self.attrs if a.name == name), None)

    def full_attrs(self, node_attrs: dict[str, Any]) -> dict[str, Any]:
        """Node attributes with defaults filled in (required ones must be present)."""
        out = {a.name: a.default for a in self.attrs if not a.required}
        out.update(node_attrs)
        return out

    def run(self, inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
        """Run the reference kernel with defaults filled in."""
        if self.kernel is None:
            raise GeodeError(f"op {self.op_type!r} has no reference kernel")
        out = self.kernel(inputs, self.full_attrs(attrs))
        return [np.asarray(o) for o in out]

    @property
    def min_inputs(self) -> int:
        n = 0
        for i, spec in enumerate(self.inputs):
            if not spec.optional and not spec.variadic or spec.variadic and not spec.optional:
                n = i + 1
        return n


_REGISTRY: dict[tuple[str, str], OpDef] = {}

#: the modules (``geode.compiler.ops.<family>``) that define geode's op prototypes
FAMILIES = (
    "control", "elementwise", "host", "image", "layout", "nn", "quant", "reduce", "rnn",
    "scatter", "signal", "state", "strings",
)  # fmt: skip


def load_family(family: str) -> None:
    """Import the op family ``family`` (one of :data:`FAMILIES`): its ops are registered
    once the import returns (a family imported on this thread already, or being imported,
    is not imported again)."""
    if family not in FAMILIES:
        raise GeodeError(f"no op family {family!r}; the families are {FAMILIES}")
    importlib.import_module(f"{__package__}.{family}")


def load_all() -> None:
    """Import every op family."""
    for family in FAMILIES:
        load_family(family)


def _key(op_type: str, domain: str) -> tuple[str, str]:
    return ("" if domain in ("", "ai.onnx") else domain, op_type)


def _lookup(key: tuple[str, str]) -> OpDef | None:
    """The prototype of ``key``, its family imported first when it is not registered
    yet (every family when the op is not in the family table)."""
    opdef = _REGISTRY.get(key)
    if opdef is None:
        from geode.compiler.ops.family_table import FAMILY_OF

        family = FAMILY_OF.get(key)
        if family is not None:
            load_family(family)
            opdef = _REGISTRY.get(key)
        if opdef is None:
            load_all()
            opdef = _REGISTRY.get(key)
    return opdef


def register(opdef: OpDef) -> OpDef:
    """Add an op prototype (replacing one of the same domain and type: the family that
    defines one of geode's is imported first, so that it does not replace this one
    later)."""
    key = (opdef.domain, opdef.op_type)
    if key not in _REGISTRY:
        from geode.compiler.ops.family_table import FAMILY_OF

        family = FAMILY_OF.get(key)
        if family is not None and f"{__package__}.{family}" not in sys.modules:
            load_family(family)
    _REGISTRY[key] = opdef
    return opdef


def get(op_type: str, domain: str = "", where: str = "") -> OpDef:
    """The prototype of an op type; UnknownOpError if none is registered."""
    opdef = _lookup(_key(op_type, domain))
    if opdef is None:
        raise UnknownOpError(op_type, domain, where=where)
    return opdef


def has(op_type: str, domain: str = "") -> bool:
    """Whether an op type is registered."""
    return _lookup(_key(op_type, domain)) is not None


def all_ops() -> list[OpDef]:
    """Every registered prototype, sorted by type."""
    load_all()
    return sorted(_REGISTRY.values(), key=lambda d: (d.domain, d.op_type))


class InferContext:
    """What ``verify`` and ``infer_shape`` functions see of a node."""

    def __init__(self, graph: Graph, node: Node, opdef: OpDef):
        self.graph = graph
        self.node = node
        self.opdef = opdef
        self.attrs = opdef.full_attrs(node.attrs)
        self.sym_values: dict[int, tuple | None] = {}

    @property
    def n_inputs(self) -> int:
        return len(self.node.inputs)

    @property
    def n_outputs(self) -> int:
        return len(self.node.outputs)

    def input(self, i: int) -> Value | None:
        """Input ``i`` (None when omitted)."""
        return self.node.input(i)

    def has(self, i: int) -> bool:
        """Whether optional input ``i`` is given."""
        return self.node.input(i) is not None

    def desc(self, i: int) -> TensorDesc:
        """TensorDesc of input ``i`` (error if omitted)."""
        v = self.node.input(i)
        if v is None:
            self.fail(f"input {i} is required")
        return v.desc

    def shape(self, i: int) -> Shape:
        """Shape of input ``i``."""
        return self.desc(i).shape

    def rank(self, i: int) -> int | None:
        """Rank of input ``i`` (None when unknown)."""
        return self.desc(i).rank

    def dtype(self, i: int) -> np.dtype:
        """dtype of input ``i``."""
        return self.desc(i).dtype

    def value(self, i: int) -> np.ndarray | None:
        """Data of input ``i`` when it is a compile-time constant, else None."""
        v = self.node.input(i)
        if v is None or not v.is_constant:
            return None
        return v.data

    def sym_ints(self, i: int) -> list | None:
        """Contents of an int input as dims (ints or sympy expressions), when known.

        Known when the input is a constant, or a shape tensor computed from shapes
        (its producer recorded a symbolic value with :meth:`set_sym_value`).
        """
        v = self.node.input(i)
        if v is None:
            return None
        if v.is_constant and v.data is not None and v.data.dtype.kind in "iu":
            return [int(x) for x in np.asarray(v.data).reshape(-1)]
        if v.sym_value is not None:
            return list(v.sym_value)
        return None

    def set_sym_value(self, k: int, dims: Sequence[Any] | None) -> None:
        """Record the symbolic contents of output ``k`` (a small int tensor)."""
        self.sym_values[k] = None if dims is None else tuple(dims)

    def attr(self, name: str) -> Any:
        """Attribute with its default applied."""
        return self.attrs.get(name)

    def fresh(self, prefix: str = "s") -> sympy.Symbol:
        """A fresh symbol for a dim that cannot be known before run time."""
        return self.graph.symbols.fresh(prefix)

    def axis(self, axis: int, rank: int) -> int:
        """Normalise an axis against a rank, with this node named in errors."""
        from geode.compiler.shapes import normalize_axis

        return normalize_axis(axis, rank, self.node.where)

    @property
    def where(self) -> str:
        return self.node.where

    def fail(self, msg: str, exc: type[GeodeError] = ShapeError) -> None:
        """Raise ``exc`` with this node named."""
        raise exc(f"{self.node.where}: {msg}")


def check_schema(ctx: InferContext) -> None:
    """Generic verify: input/output counts, attributes, dtype constraints."""
    od, node = ctx.opdef, ctx.node
    n_in = len(node.inputs)
    variadic = bool(od.inputs) and od.inputs[-1].variadic
    if n_in < od.min_inputs:
        missing = [s.name for i, s in enumerate(od.inputs) if i >= n_in and not s.optional]
        ctx.fail(
            f"expects at least {od.min_inputs} inputs, got {n_in} (missing {missing})", VerifyError
        )
    if not variadic and n_in > len(od.inputs):
        ctx.fail(f"expects at most {len(od.inputs)} inputs, got {n_in}", VerifyError)
    for i, v in enumerate(node.inputs):
        spec = od.inputs[min(i, len(od.inputs) - 1)] if od.inputs else None
        if v is None and spec is not None and not spec.optional:
            ctx.fail(f"input {i} ({spec.name}) is required", VerifyError)
    for a in od.attrs:
        if a.required and a.name not in node.attrs:
            ctx.fail(f"attribute {a.name!r} is required", VerifyError)
    for name, v in node.attrs.items():
        spec = od.attr_spec(name)
        if spec is None:
            ctx.fail(
                f"unknown attribute {name!r} (known: {[a.name for a in od.attrs]})", VerifyError
            )
        if not _ATTR_CHECK[spec.kind](v):
            ctx.fail(f"attribute {name!r} should be {spec.kind}, got {v!r}", VerifyError)
    bound: dict[str, np.dtype] = {}
    for i, v in enumerate(node.inputs):
        if v is None:
            continue
        spec = od.inputs[min(i, len(od.inputs) - 1)]
        allowed = od.types.get(spec.type)
        if allowed is not None and v.dtype not in allowed:
            names = sorted(dtypes.name(t) for t in allowed)
            ctx.fail(
                f"input {i} ({spec.name}, {v.name!r}) has dtype {dtypes.name(v.dtype)}, expected one of {names}",
                DTypeError,
            )
        if spec.type in bound and bound[spec.type] != v.dtype and allowed is not None:
            ctx.fail(
                f"input {i} ({spec.name}, {v.name!r}) has dtype {dtypes.name(v.dtype)} but type "
                f"{spec.type} is already {dtypes.name(bound[spec.type])}",
                DTypeError,
            )
        bound.setdefault(spec.type, v.dtype)


def infer_node(graph: Graph, node: Node) -> None:
    """Verify a node against its prototype and set its outputs' TensorDescs."""
    opdef = get(node.op_type, node.domain, where=node.where)
    ctx = InferContext(graph, node, opdef)
    check_schema(ctx)
    try:
        if opdef.verify is not None:
            opdef.verify(ctx)
        descs = opdef.infer(ctx)
    except GeodeError:
        raise
    except Exception as exc:  # an op's infer function hit input it did not expect
        raise ShapeError(
            f"{node.where}: shape inference failed: {type(exc).__name__}: {exc}"
        ) from exc
    if len(descs) < len(node.outputs):
        raise ShapeError(
            f"{node.where}: produces {len(descs)} outputs, node has {len(node.outputs)}"
        )
    for k, (out, d) in enumerate(zip(node.outputs, descs)):
        out.desc = d
        out.sym_value = ctx.sym_values.get(k)


set_node_inference(infer_node)  # Graph.add_node and Graph.infer_shapes call it
