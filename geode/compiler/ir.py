"""Graph IR: :class:`Graph`, :class:`Node`, :class:`Value` and :class:`TensorDesc`.

A graph owns its values and nodes. Every value is produced once (by a node, or as a
graph input, constant or variable) and knows its uses. Values overload Python's
arithmetic operators, so a graph built with the Python API reads like numpy::

    g = Graph("rmsnorm")
    x = g.input("x", ["N", 768], "float32")
    ms = ops.reduce_mean(x * x, axes=[-1], keepdims=1)
    g.output(x / ops.sqrt(ms + 1e-6), names=["y"])
"""

from __future__ import annotations

import contextlib
import enum
import itertools
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from geode.compiler import dtypes
from geode.compiler.shapes import Shape, SymbolTable, shape_str
from geode.errors import GeodeError, GraphError
from geode.lazy import imported, sympy


@dataclass
class TensorDesc:
    """What is known of a tensor before it exists: dtype, (symbolic) shape and format."""

    dtype: np.dtype
    shape: Shape
    format: str = "ND"

    def __post_init__(self) -> None:
        self.dtype = dtypes.to_numpy(self.dtype)
        if self.shape is not None:
            self.shape = tuple(self.shape)

    @property
    def rank(self) -> int | None:
        """Number of dims, None when unknown."""
        return None if self.shape is None else len(self.shape)

    def __str__(self) -> str:
        fmt = "" if self.format == "ND" else f"@{self.format}"
        return f"{dtypes.name(self.dtype)}{shape_str(self.shape)}{fmt}"


#: the domain of geode's own ops (Assign, AssignAdd, AssignSub, VarIsInitialized,
#: VarRef: ``geode/compiler/ops/state.py``), in graphs and in ONNX models
GEODE_DOMAIN = "geode"

#: optional Value attributes front ends set and copies must keep: ``external``
#: (file, offset, length) and ``external_loader`` of a lazily loaded file constant,
#: ``external_ref``, and ``default`` (an overridable initializer's value)
_VALUE_EXTRAS = ("external", "external_loader", "external_ref", "default")


class ValueKind(enum.Enum):
    """Where a value comes from."""

    INPUT = "input"
    CONSTANT = "constant"
    VARIABLE = "variable"
    INTERMEDIATE = "intermediate"


class Value:
    """An edge of the graph: one tensor, produced once, used by any number of nodes."""

    __array_priority__ = 1000  # numpy scalars defer to our operators

    def __init__(
        self,
        graph: Graph,
        name: str,
        desc: TensorDesc,
        kind: ValueKind,
        producer: Node | None = None,
        data: np.ndarray | None = None,
    ):
        self.graph = graph
        self.name = name
        self.desc = desc
        self.kind = kind
        self.producer = producer
        self.data = data
        self.uses: list[tuple[Node, int]] = []
        #: symbolic contents of a small int tensor computed from shapes (Shape, and
        #: Gather/Concat/... over it): lets Reshape/Expand/... infer symbolic shapes
        self.sym_value: tuple | None = None
        #: set by the variables pass: a variable no op writes
        self.read_only: bool = False

    # -- properties ------------------------------------------------------------------
    @property
    def dtype(self) -> np.dtype:
        """Element type."""
        return self.desc.dtype

    @property
    def shape(self) -> Shape:
        """Symbolic shape (None: unknown rank)."""
        return self.desc.shape

    @property
    def rank(self) -> int | None:
        """Number of dims, None when unknown."""
        return self.desc.rank

    @property
    def is_constant(self) -> bool:
        """True for constants (their data is known at compile time)."""
        return self.kind is ValueKind.CONSTANT

    @property
    def values_known(self) -> bool:
        """Whether the contents are known before run time: a constant's data, or the
        symbolic value a shape computation recorded (``sym_value``)."""
        return (self.is_constant and self.data is not None) or self.sym_value is not None

    @property
    def consumers(self) -> list[Node]:
        """Distinct nodes that read this value, in use order."""
        seen: dict[int, Node] = {}
        for node, _ in self.uses:
            seen.setdefault(id(node), node)
        return list(seen.values())

    def __repr__(self) -> str:
        return f"%{self.name}: {self.desc}"

    __hash__ = object.__hash__

    # -- operators (Python builder) --------------------------------------------------
    def _bin(self, op: str, other: object, reverse: bool = False) -> Value:
        other_v = self.graph.lift(other, like=self)
        a, b = (other_v, self) if reverse else (self, other_v)
        return self.graph.op(op, a, b)

    def __add__(self, o: object) -> Value:
        return self._bin("Add", o)

    def __radd__(self, o: object) -> Value:
        return self._bin("Add", o, True)

    def __sub__(self, o: object) -> Value:
        return self._bin("Sub", o)

    def __rsub__(self, o: object) -> Value:
        return self._bin("Sub", o, True)

    def __mul__(self, o: object) -> Value:
        return self._bin("Mul", o)

    def __rmul__(self, o: object) -> Value:
        return self._bin("Mul", o, True)

    def __truediv__(self, o: object) -> Value:
        return self._bin("Div", o)

    def __rtruediv__(self, o: object) -> Value:
        return self._bin("Div", o, True)

    def __pow__(self, o: object) -> Value:
        return self._bin("Pow", o)

    def __rpow__(self, o: object) -> Value:
        return self._bin("Pow", o, True)

    def __mod__(self, o: object) -> Value:
        return self._bin("Mod", o)

    def __matmul__(self, o: object) -> Value:
        return self._bin("MatMul", o)

    def __rmatmul__(self, o: object) -> Value:
        return self._bin("MatMul", o, True)

    def __neg__(self) -> Value:
        return self.graph.op("Neg", self)

    def __abs__(self) -> Value:
        return self.graph.op("Abs", self)

    def __lt__(self, o: object) -> Value:
        return self._bin("Less", o)

    def __le__(self, o: object) -> Value:
        return self._bin("LessOrEqual", o)

    def __gt__(self, o: object) -> Value:
        return self._bin("Greater", o)

    def __ge__(self, o: object) -> Value:
        return self._bin("GreaterOrEqual", o)

    def __and__(self, o: object) -> Value:
        return self._bin("And", o)

    def __or__(self, o: object) -> Value:
        return self._bin("Or", o)

    def __xor__(self, o: object) -> Value:
        return self._bin("Xor", o)

    def __invert__(self) -> Value:
        return self.graph.op("Not", self)

    def __getitem__(self, index: object) -> Value:
        return basic_index(self, index)

    @property
    def T(self) -> Value:  # noqa: N802 - numpy's name
        """Transpose (reverses all axes)."""
        return self.graph.op("Transpose", self)

    def astype(self, dtype: object) -> Value:
        """Cast to another dtype."""
        return self.graph.op("Cast", self, to=dtypes.to_onnx(dtype))


class Node:
    """One op application: op type, attributes, input values, output values."""

    def __init__(
        self,
        name: str,
        op_type: str,
        inputs: Sequence[Value | None],
        attrs: dict[str, Any] | None = None,
        domain: str = "",
    ):
        self.name = name
        self.op_type = op_type
        self.domain = domain
        self.attrs: dict[str, Any] = dict(attrs or {})
        self.inputs: list[Value | None] = []
        self.outputs: list[Value] = []
        #: the pipeline stage it runs in (GE's ATTR_STAGE_LEVEL; ``Graph.stage``), or None
        self.stage: int | None = None
        for v in inputs:
            self.add_input(v)

    def add_input(self, v: Value | None) -> None:
        """Append an input (None for an omitted optional input)."""
        if v is not None:
            v.uses.append((self, len(self.inputs)))
        self.inputs.append(v)

    def set_input(self, i: int, v: Value | None) -> None:
        """Replace input ``i``, keeping use lists right."""
        old = self.inputs[i]
        if old is not None:
            old.uses = [(n, j) for n, j in old.uses if not (n is self and j == i)]
        if v is not None:
            v.uses.append((self, i))
        self.inputs[i] = v

    def drop_inputs(self) -> None:
        """Disconnect every input (used when a node is removed)."""
        for i in range(len(self.inputs)):
            self.set_input(i, None)

    def input(self, i: int) -> Value | None:
        """Input ``i``, or None when omitted or out of range."""
        return self.inputs[i] if i < len(self.inputs) else None

    def attr(self, name: str, default: Any = None) -> Any:
        """Attribute value, or ``default`` when not set."""
        return self.attrs.get(name, default)

    @property
    def where(self) -> str:
        """How errors name this node."""
        return f"node {self.name!r} ({self.op_type})"

    def __repr__(self) -> str:
        return f"Node({self.name}: {self.op_type})"

    __hash__ = object.__hash__


#: what a declared input dim may be (also a sympy expression: a dim of an outer graph,
#: for subgraph inputs; see _is_symbolic)
_DIM_TYPES = (int, np.integer, str, type(None))


def _is_symbolic(d: object) -> bool:
    """Whether ``d`` is a sympy expression (none can exist before sympy is imported)."""
    return imported("sympy") and isinstance(d, sympy.Basic)


def _dims(name: str, shape: object) -> list[object] | None:
    """An input's declared dims as a list (GraphError naming the input when ``shape`` is
    not None or a sequence of ints, strings and None, or holds a negative int other
    than -1, which means unknown)."""
    if shape is None:
        return None
    if isinstance(shape, (str, bytes)) or not isinstance(shape, Iterable):
        raise GraphError(
            f"input {name!r}: shape must be a sequence of dims, got {type(shape).__name__}"
        )
    dims = list(shape)
    for d in dims:
        if isinstance(d, (bool, np.bool_)) or not (isinstance(d, _DIM_TYPES) or _is_symbolic(d)):
            raise GraphError(f"input {name!r}: dim {d!r} is not an int, a name or None")
        if isinstance(d, (int, np.integer)) and d < -1:
            raise GraphError(f"input {name!r}: dim {d} is negative (-1 or None: unknown)")
    return dims


def _array(data: object, dtype: object, what: str) -> np.ndarray:
    """``data`` as a numpy array of ``dtype`` (GraphError naming ``what`` when numpy
    cannot make one, e.g. ragged nested lists)."""
    try:
        return np.array(data, dtype=dtypes.to_numpy(dtype) if dtype is not None else None)
    except (ValueError, TypeError, OverflowError) as exc:
        raise GraphError(f"{what}: cannot make an array of {type(data).__name__}: {exc}") from None


def _fmt_attr(v: Any) -> str:
    if isinstance(v, np.ndarray):
        if v.size <= 8:
            return f"tensor<{dtypes.name(v.dtype)}>{v.tolist()}"
        return f"tensor<{dtypes.name(v.dtype)}{list(v.shape)}>"
    if isinstance(v, Graph):
        return f"graph<{v.name}>"
    if isinstance(v, float):
        return f"{v:g}"
    return repr(v)


class Graph:
    """A dataflow graph of :class:`Node` over :class:`Value`, with its symbol table."""

    def __init__(self, name: str = "graph"):
        self.name = name
        self.symbols = SymbolTable()
        self.nodes: list[Node] = []
        self.inputs: list[Value] = []
        self.outputs: list[Value] = []
        self.values: dict[str, Value] = {}
        self.opset: int = 21
        self._names = itertools.count()
        self._node_names: set[str] = set()  # every node name ever used (only grows)
        self._stage: int | None = None  # the stage nodes added now run in (see stage)

    # -- naming ----------------------------------------------------------------------
    def unique_name(self, base: str) -> str:
        """A value/node name not used yet in this graph."""
        base = base or "v"
        if base not in self.values and base not in self._node_names:
            return base
        while True:
            cand = f"{base}_{next(self._names)}"
            if cand not in self.values and cand not in self._node_names:
                return cand

    def _new_value(self, name: str, desc: TensorDesc, kind: ValueKind, **kw: Any) -> Value:
        if name in self.values:
            raise GraphError(f"graph {self.name!r}: value name {name!r} is already used")
        v = Value(self, name, desc, kind, **kw)
        self.values[name] = v
        return v

    # -- building --------------------------------------------------------------------
    def input(self, name: str, shape: Iterable[object] | None, dtype: object = "float32") -> Value:
        """Declare a graph input; string dims are shared symbols, None/-1 fresh ones."""
        desc = TensorDesc(
            dtypes.to_numpy(dtype, f"input {name!r}"), self.symbols.shape(_dims(name, shape))
        )
        v = self._new_value(name, desc, ValueKind.INPUT)
        self.inputs.append(v)
        return v

    def constant(self, data: object, name: str | None = None, dtype: object = None) -> Value:
        """A constant tensor (its data is known at compile time)."""
        arr = _array(data, dtype, f"constant {name or 'const'!r}")
        if arr.dtype == np.float64 and dtype is None and not isinstance(data, np.ndarray):
            arr = arr.astype(np.float32)  # Python floats default to float32, like frameworks
        name = self.unique_name(name or "const")
        return self._new_value(
            name, TensorDesc(arr.dtype, tuple(arr.shape)), ValueKind.CONSTANT, data=arr
        )

    def variable(
        self,
        data: object = None,
        name: str | None = None,
        dtype: object = None,
        *,
        shape: Iterable[int] | None = None,
    ) -> Value:
        """A variable: a named tensor that lives in the session's VarManager, shared by
        every model of the session that names it, and that graphs may write
        (:meth:`assign`). Arguments in the order of :meth:`constant`: ``data`` (its initial
        value) first, then ``name`` (required)::

            w = g.variable(np.zeros((4, 3), np.float32), "w")
            step = g.variable(name="step", shape=[], dtype="int64")  # no value yet

        Without ``data``, ``shape`` (static) and ``dtype`` declare it: it has no value
        until a graph assigns it, ``session.set_variable`` sets it or a checkpoint is
        restored (reading it before raises; ``var_is_initialized`` tells).

        The former order ``variable(name, data)`` still works (a str first, then
        something that is not a str) with a DeprecationWarning.
        """
        if isinstance(data, str) and name is not None and not isinstance(name, str):
            warnings.warn(
                f"Graph.variable({data!r}, data) is deprecated: pass the data first, "
                f"like Graph.constant: variable(data, {data!r})",
                DeprecationWarning,
                stacklevel=2,
            )
            data, name = name, data
        if not isinstance(name, str) or not name:
            raise GraphError(
                f"a variable needs a name (a non-empty str), got {name!r}: variable(data, name)"
            )
        if data is None:
            return self._declared_variable(name, shape, dtype)
        arr = _array(data, dtype, f"variable {name!r}")
        if shape is not None and tuple(arr.shape) != tuple(shape):
            raise GraphError(
                f"variable {name!r}: data has shape {list(arr.shape)}, shape= says {list(shape)}"
            )
        return self._new_value(
            name, TensorDesc(arr.dtype, tuple(arr.shape)), ValueKind.VARIABLE, data=arr
        )

    def _declared_variable(self, name: str, shape: object, dtype: object) -> Value:
        """A variable without an initial value (static shape and dtype required)."""
        if shape is None or dtype is None:
            raise GraphError(
                f"variable {name!r} has no data: give its shape= and dtype= to declare it"
            )
        dims = _dims(name, shape)
        if dims is None or not all(isinstance(d, (int, np.integer)) and d >= 0 for d in dims):
            raise GraphError(f"variable {name!r}: shape {shape!r} must be static (ints >= 0)")
        desc = TensorDesc(dtypes.to_numpy(dtype, f"variable {name!r}"), tuple(int(d) for d in dims))
        return self._new_value(name, desc, ValueKind.VARIABLE, data=None)

    # -- writing variables (ops of GEODE_DOMAIN, geode/compiler/ops/state.py) -------------
    def assign(self, var: Value, value: object, name: str | None = None) -> Value:
        """Write ``value`` into variable ``var``; returns the new value.

        ``value`` must have the variable's exact dtype and shape; a Python or numpy
        scalar or array (not a graph Value) becomes a constant of the variable's dtype,
        broadcast to its shape (``g.assign_add(step, 1)``). Order is the graph's: nodes built before this call that read ``var``
        see its old value, nodes built after it see the new one; the session's
        VarManager holds the new value once the run ends (other models see it then).
        """
        return self._write("Assign", var, value, name)

    def assign_add(self, var: Value, delta: object, name: str | None = None) -> Value:
        """``var <- var + delta`` (as :meth:`assign`); returns the new value."""
        return self._write("AssignAdd", var, delta, name)

    def assign_sub(self, var: Value, delta: object, name: str | None = None) -> Value:
        """``var <- var - delta`` (as :meth:`assign`); returns the new value."""
        return self._write("AssignSub", var, delta, name)

    def var_is_initialized(self, var: Value, name: str | None = None) -> Value:
        """A bool scalar: whether variable ``var`` has a value when this node runs (its
        initial value, an earlier write in the graph, or the session's value)."""
        var = self.lift(var)
        node = self.add_node("VarIsInitialized", [var], name=name, domain=GEODE_DOMAIN)
        return node.outputs[0]

    def _write(self, op: str, var: Value, value: object, name: str | None) -> Value:
        if not isinstance(var, Value):
            raise GraphError(f"{op}: the target must be a variable Value, got {type(var).__name__}")
        var = self.lift(var)
        if not isinstance(value, Value):
            arr = _array(value, var.dtype, f"{op} of variable {var.name!r}")
            try:
                arr = np.broadcast_to(arr, var.shape).copy()
            except (ValueError, TypeError):
                raise GraphError(
                    f"{op} of variable {var.name!r} ({var.desc}): a value of shape "
                    f"{list(arr.shape)} does not broadcast to it"
                ) from None
            value = self.constant(arr, f"{var.name}_{op.lower()}_value", dtype=var.dtype)
        node = self.add_node(op, [var, self.lift(value)], name=name, domain=GEODE_DOMAIN)
        return node.outputs[0]

    def lift(self, x: object, like: Value | None = None) -> Value:
        """A Value for ``x``: Values pass through, Python/numpy scalars become constants."""
        if isinstance(x, Value):
            if x.graph is not self:
                raise GraphError(
                    f"value {x.name!r} belongs to graph {x.graph.name!r}, not {self.name!r}"
                )
            return x
        dtype = like.dtype if like is not None and not isinstance(x, np.ndarray) else None
        if dtype is not None and dtype == np.bool_ and not isinstance(x, (bool, np.bool_)):
            dtype = None
        if dtype is not None and dtype.kind in "iub" and isinstance(x, (float, np.floating)):
            dtype = None  # never truncate a float scalar to an integer constant
        return self.constant(x, dtype=dtype)

    def add_node(
        self,
        op_type: str,
        inputs: Sequence[Value | None],
        attrs: dict[str, Any] | None = None,
        n_outputs: int = 1,
        name: str | None = None,
        domain: str = "",
        output_names: Sequence[str] | None = None,
        infer: bool = True,
    ) -> Node:
        """Append a node; with ``infer`` its schema is verified and output shapes inferred."""
        node = Node(self.unique_name(name or op_type.lower()), op_type, inputs, attrs, domain)
        node.stage = self._stage
        self._node_names.add(node.name)
        for v in inputs:
            if v is not None and v.graph is not self:
                raise GraphError(f"{node.where}: input {v.name!r} belongs to another graph")
        for i in range(n_outputs):
            oname = (
                output_names[i]
                if output_names
                else self.unique_name(f"{node.name}_out{i}" if n_outputs > 1 else node.name)
            )
            out = self._new_value(
                oname, TensorDesc(np.float32, None), ValueKind.INTERMEDIATE, producer=node
            )
            node.outputs.append(out)
        self.nodes.append(node)
        if infer:
            try:
                infer_node(self, node)
            except Exception:
                self.remove_node(node)
                raise
        return node

    def op(
        self,
        op_type: str,
        *inputs: object,
        n_outputs: int = 1,
        name: str | None = None,
        **attrs: Any,
    ) -> Any:
        """Apply an op to values (scalars are lifted to constants); returns its output(s)."""
        like = next((x for x in inputs if isinstance(x, Value)), None)
        vals = [None if x is None else self.lift(x, like) for x in inputs]
        node = self.add_node(op_type, vals, attrs, n_outputs=n_outputs, name=name)
        return node.outputs[0] if n_outputs == 1 else tuple(node.outputs)

    @contextlib.contextmanager
    def stage(self, index: int) -> Iterator[None]:
        """Nodes added inside ``with g.stage(k):`` run in pipeline stage ``k`` (GE's
        StagePartitioner): a graph with stages compiles into one model per stage, run
        one after another or pipelined over micro-batches (``geode/stages.py``). Nodes
        outside any ``with`` take the stage of their first reader, or the last stage."""
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or index < 0:
            raise GraphError(f"graph {self.name!r}: a stage is an int >= 0, got {index!r}")
        before, self._stage = self._stage, int(index)
        try:
            yield
        finally:
            self._stage = before

    def output(self, *values: Value, names: Sequence[str] | None = None) -> None:
        """Mark values as graph outputs, optionally renaming them."""
        if names is not None and len(names) != len(values):
            raise GraphError(f"graph {self.name!r}: {len(values)} outputs but {len(names)} names")
        for i, v in enumerate(values):
            v = self.lift(v)
            if names is not None and names[i] != v.name:
                if v.kind is not ValueKind.INTERMEDIATE or v in self.outputs:
                    v = self.op("Identity", v)
                self.rename(v, names[i])
            self.outputs.append(v)

    def rename(self, v: Value, new: str) -> None:
        """Rename a value; GraphError if the name is taken."""
        if new == v.name:
            return
        if new in self.values:
            raise GraphError(
                f"graph {self.name!r}: cannot rename {v.name!r} to {new!r}, name is taken"
            )
        del self.values[v.name]
        v.name = new
        self.values[new] = v

    # -- editing ---------------------------------------------------------------------
    def remove_node(self, node: Node) -> None:
        """Remove a node and its outputs (they must be unused)."""
        node.drop_inputs()
        self.nodes = [n for n in self.nodes if n is not node]
        for out in node.outputs:
            if self.values.get(out.name) is out:
                del self.values[out.name]

    def remove_value(self, v: Value) -> None:
        """Forget an unused constant/variable/input value."""
        if self.values.get(v.name) is v:
            del self.values[v.name]
        if v in self.inputs:
            self.inputs.remove(v)

    # -- queries ---------------------------------------------------------------------
    def toposort(self) -> list[Node]:
        """Nodes in a topological order (stable); GraphError on a cycle."""
        indeg: dict[int, int] = {}
        readers: dict[int, list[Node]] = {}
        for n in self.nodes:
            preds = {id(v.producer) for v in n.inputs if v is not None and v.producer is not None}
            indeg[id(n)] = len(preds)
            for p in preds:
                readers.setdefault(p, []).append(n)
        order: list[Node] = []
        ready = [n for n in self.nodes if indeg[id(n)] == 0]
        pos = {id(n): i for i, n in enumerate(self.nodes)}
        import heapq

        heap = [(pos[id(n)], n) for n in ready]
        heapq.heapify(heap)
        while heap:
            _, n = heapq.heappop(heap)
            order.append(n)
            for r in readers.get(id(n), []):
                indeg[id(r)] -= 1
                if indeg[id(r)] == 0:
                    heapq.heappush(heap, (pos[id(r)], r))
        if len(order) != len(self.nodes):
            stuck = [n.name for n in self.nodes if indeg[id(n)] > 0][:5]
            raise GraphError(f"graph {self.name!r} has a cycle through nodes {stuck}")
        return order

    def sort(self) -> None:
        """Put ``nodes`` in topological order."""
        self.nodes = self.toposort()

    def constants(self) -> list[Value]:
        """Constant values, in name order."""
        return [v for v in self.values.values() if v.kind is ValueKind.CONSTANT]

    def variables(self) -> list[Value]:
        """Variable values."""
        return [v for v in self.values.values() if v.kind is ValueKind.VARIABLE]

    def verify(self) -> None:
        """Check structural invariants: acyclic, each value produced once, names unique, uses consistent."""
        node_names: set[str] = set()
        produced: dict[str, str] = {}
        for v in self.inputs:
            if v.kind is not ValueKind.INPUT:
                raise GraphError(f"graph input {v.name!r} is a {v.kind.value}, not an input")
            produced[v.name] = "graph input"
        for n in self.nodes:
            if n.name in node_names:
                raise GraphError(f"graph {self.name!r}: node name {n.name!r} is used twice")
            node_names.add(n.name)
            for i, v in enumerate(n.inputs):
                if v is None:
                    continue
                if self.values.get(v.name) is not v:
                    raise GraphError(
                        f"{n.where}: input {i} ({v.name!r}) is not a value of this graph"
                    )
                if (n, i) not in [(u, j) for u, j in v.uses]:
                    raise GraphError(f"{n.where}: input {v.name!r} does not record this use")
                if v.kind is ValueKind.INTERMEDIATE and (
                    v.producer is None or v.producer not in self.nodes
                ):
                    raise GraphError(f"{n.where}: input {v.name!r} has no producer in the graph")
            for o in n.outputs:
                if o.name in produced:
                    raise GraphError(
                        f"value {o.name!r} is produced twice: by {produced[o.name]} and {n.where}"
                    )
                if o.producer is not n:
                    raise GraphError(f"{n.where}: output {o.name!r} names another producer")
                produced[o.name] = n.where
        for o in self.outputs:
            if self.values.get(o.name) is not o:
                raise GraphError(f"graph output {o.name!r} is not a value of this graph")
        if len({o.name for o in self.outputs}) != len(self.outputs):
            raise GraphError(f"graph {self.name!r}: an output name is used twice")
        self.toposort()

    def infer_shapes(self) -> None:
        """Run every node's verify and infer_shape in topological order."""
        self.sort()
        for n in self.nodes:
            infer_node(self, n)

    def copy(self) -> Graph:
        """A structural copy (tensor data is shared, not copied)."""
        g = Graph(self.name)
        g.symbols = SymbolTable(
            dict(self.symbols.named),
            self.symbols.counter,
            list(self.symbols.constraints),
            list(self.symbols.broadcasts),
        )
        g.opset = self.opset
        vmap: dict[int, Value] = {}
        for v in self.values.values():
            if v.producer is None:
                nv = g._new_value(
                    v.name, TensorDesc(v.dtype, v.shape, v.desc.format), v.kind, data=v.data
                )
                nv.read_only = v.read_only
                for extra in _VALUE_EXTRAS:  # set by front ends (external data, defaults)
                    if hasattr(v, extra):
                        setattr(nv, extra, getattr(v, extra))
                vmap[id(v)] = nv
        g.inputs = [vmap[id(v)] for v in self.inputs]
        for n in self.nodes:
            nn = Node(
                n.name,
                n.op_type,
                [None if v is None else vmap[id(v)] for v in n.inputs],
                n.attrs,
                n.domain,
            )
            nn.stage = n.stage
            for o in n.outputs:
                no = g._new_value(
                    o.name, TensorDesc(o.dtype, o.shape, o.desc.format), o.kind, producer=nn
                )
                no.sym_value = o.sym_value
                nn.outputs.append(no)
                vmap[id(o)] = no
            g.nodes.append(nn)
        g._node_names = set(self._node_names) | {n.name for n in self.nodes}
        g.outputs = [vmap[id(v)] for v in self.outputs]
        return g

    # -- printing --------------------------------------------------------------------
    def __str__(self) -> str:
        return format_graph(self)

    def __repr__(self) -> str:
        return f"Graph({self.name!r}, {len(self.nodes)} nodes)"


def format_graph(g: Graph, annotate: dict[str, str] | None = None) -> str:
    """Readable text form of a graph; ``annotate`` adds a comment per node name."""
    ins = ", ".join(f"%{v.name}: {v.desc}" for v in g.inputs)
    outs = ", ".join(f"%{v.name}: {v.desc}" for v in g.outputs)
    lines = [f"graph {g.name}({ins}) -> ({outs}) {{"]
    for v in g.values.values():
        if v.kind is ValueKind.CONSTANT:
            d = v.data
            body = (
                repr(d.tolist())
                if d is not None and d.size <= 6
                else f"<{d.size if d is not None else '?'} elements>"
            )
            lines.append(f"  %{v.name}: {v.desc} = const {body}")
        elif v.kind is ValueKind.VARIABLE:
            lines.append(f"  %{v.name}: {v.desc} = variable")
    for n in g.nodes:
        outs_s = ", ".join(f"%{o.name}: {o.desc}" for o in n.outputs)
        args = ", ".join("_" if v is None else f"%{v.name}" for v in n.inputs)
        attrs = ", ".join(f"{k}={_fmt_attr(v)}" for k, v in sorted(n.attrs.items()))
        dom = f"{n.domain}." if n.domain else ""
        line = f"  {outs_s} = {dom}{n.op_type}({args})"
        if attrs:
            line += f" {{{attrs}}}"
        if annotate and n.name in annotate:
            line += f"  # {annotate[n.name]}"
        lines.append(line)
    if g.symbols.constraints:
        cons = "; ".join(f"{a} == {b}" for a, b, _ in g.symbols.constraints)
        lines.append(f"  constraints: {cons}")
    if g.symbols.broadcasts:
        groups = "; ".join(", ".join(map(str, dims)) for dims, _ in g.symbols.broadcasts)
        lines.append(f"  broadcast (equal or 1): {groups}")
    lines.append("}")
    return "\n".join(lines)


@dataclass
class GraphStats:
    """Counts used by explain()/dumps."""

    nodes: int = 0
    by_op: dict[str, int] = field(default_factory=dict)


def stats(g: Graph) -> GraphStats:
    """Op counts of a graph."""
    s = GraphStats(len(g.nodes))
    for n in g.nodes:
        s.by_op[n.op_type] = s.by_op.get(n.op_type, 0) + 1
    return s


#: verifies one node against its op prototype and sets its outputs' descs
NodeInference = Callable[[Graph, Node], None]
_node_inference: NodeInference | None = None


def set_node_inference(fn: NodeInference) -> None:
    """Install the function that verifies a node and infers its outputs' descs.

    The op registry (:mod:`geode.compiler.ops.registry`) installs its ``infer_node``
    when it is imported, which ``import geode`` does first; the IR thus runs shape
    inference without importing the registry that depends on it.
    """
    global _node_inference
    _node_inference = fn


def infer_node(graph: Graph, node: Node) -> None:
    """Verify ``node`` of ``graph`` and set its outputs' descs (the installed inference)."""
    if _node_inference is None:
        raise GraphError(
            f"{node.where}: no op registry is loaded to infer shapes; import geode.compiler.ops"
        )
    _node_inference(graph, node)


def basic_index(x: Value, index: object) -> Value:
    """numpy-style basic indexing (ints, slices, None, Ellipsis) as Slice/Squeeze/Unsqueeze."""
    idx = index if isinstance(index, tuple) else (index,)
    rank = x.rank
    if rank is None:
        raise GeodeError(f"cannot index {x.name!r}: its rank is unknown")
    n_ellipsis = sum(1 for i in idx if i is Ellipsis)
    if n_ellipsis > 1:
        raise GeodeError("an index can only have a single ellipsis")
    used = sum(1 for i in idx if i is not None and i is not Ellipsis)
    if used > rank:
        raise GeodeError(f"too many indices for {x.name!r} of rank {rank}")
    if n_ellipsis:
        pos = idx.index(Ellipsis)
        idx = idx[:pos] + (slice(None),) * (rank - used) + idx[pos + 1 :]
    starts, ends, axes, steps, squeeze, unsqueeze = [], [], [], [], [], []
    axis = 0
    out_axis = 0
    big = np.iinfo(np.int64).max
    for it in idx:
        if it is None:
            unsqueeze.append(out_axis)
            out_axis += 1
            continue
        if isinstance(it, (int, np.integer)):
            i = int(it)
            starts.append(i)
            ends.append(i + 1 if i != -1 else big)
            axes.append(axis)
            steps.append(1)
            squeeze.append(axis)
        elif isinstance(it, slice):
            step = 1 if it.step is None else int(it.step)
            if step == 0:
                raise GeodeError("slice step cannot be zero")
            if it.start is not None or it.stop is not None or step != 1:
                starts.append(int(it.start) if it.start is not None else (0 if step > 0 else big))
                ends.append(int(it.stop) if it.stop is not None else (big if step > 0 else -big))
                axes.append(axis)
                steps.append(step)
            out_axis += 1
        else:
            raise GeodeError(f"unsupported index {it!r}: use ints, slices, None or ...")
        axis += 1
    g = x.graph

    def ints(values: list[int]) -> Value:
        return g.constant(np.asarray(values, np.int64))

    y = x
    if axes:
        y = g.op("Slice", y, ints(starts), ints(ends), ints(axes), ints(steps))
    if squeeze:
        y = g.op("Squeeze", y, ints(squeeze))
    if unsqueeze:
        y = g.op("Unsqueeze", y, ints(unsqueeze))
    return y if y is not x else g.op("Identity", x)
