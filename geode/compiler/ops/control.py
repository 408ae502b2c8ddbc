"""Control flow: If, Loop and Scan, on the host engine.

Their subgraph attributes (``then_branch``/``else_branch``, ``body``) are geode Graphs
(the ONNX front end imports them). A subgraph runs through geode's full pipeline: on
first use with a given signature (the dtypes and ranks of its inputs) it is compiled
by the *subgraph compiler*, with every dim of its inputs a symbol, so one compiled
body serves every iteration whatever its sizes; the compiled bodies are cached per
subgraph. The compiler is injected (:func:`set_subgraph_compiler`): the session
installs one that compiles through a session private to control flow, so the op
definitions here do not import the layers above them.

Values a subgraph reads from enclosing scopes arrive as the node's trailing inputs:
the ``captures`` attribute names them (the front end sets it), and a subgraph's own
``captures`` list (``Graph.captures``) says which of them its inputs after the formal
ones are.

Semantics (ONNX opset 11+ for Loop and If, 9+ for Scan):

* ``If(cond)``: the outputs of ``then_branch`` when ``cond`` (one element) is true,
  else of ``else_branch``.
* ``Loop(M, cond, v...)``: ``i = 0; while (M absent or i < M) and (cond absent or
  cond): cond, v..., scan... = body(i, cond, v...); i += 1``; outputs the final ``v``
  and every scan output stacked along a new first axis.
* ``Scan(states..., inputs...)``: the body runs once per slice of the scan inputs
  (along ``scan_input_axes``, reversed where ``scan_input_directions`` is 1); outputs
  the final states and the scan outputs stacked along ``scan_output_axes`` (in reverse
  order where ``scan_output_directions`` is 1).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from geode.compiler import dtypes
from geode.compiler.ir import Graph, TensorDesc
from geode.compiler.ops.registry import (
    REQUIRED,
    Attr,
    In,
    InferContext,
    OpDef,
    OpKind,
    Out,
    register,
)
from geode.compiler.shapes import Dim, dims_equal, free_symbols
from geode.errors import ExecutionError, GeodeError, ShapeError, VerifyError

#: most iterations a Loop with neither a trip count nor a condition may run
MAX_UNBOUNDED_ITERATIONS = 1 << 31

_BOOL = dtypes.BOOL
_I64 = frozenset([np.dtype(np.int64)])


# -- running subgraphs -----------------------------------------------------------------------
#: compiles a subgraph into a runnable model: something with ``run(feeds) -> dict``,
#: ``input_names`` and ``output_names`` (a :class:`geode.runtime.model.CompiledModel`)
SubgraphCompiler = Callable[[Graph], Any]
_subgraph_compiler: SubgraphCompiler | None = None


def set_subgraph_compiler(fn: SubgraphCompiler | None) -> None:
    """Install the function that compiles If/Loop/Scan bodies (the session does, when
    it is imported); ``None`` uninstalls it."""
    global _subgraph_compiler
    _subgraph_compiler = fn


def subgraph_compiler() -> SubgraphCompiler:
    """The installed subgraph compiler; a GeodeError when there is none."""
    if _subgraph_compiler is None:
        raise GeodeError(
            "control flow needs a subgraph compiler and none is installed "
            "(importing geode.session installs the default one)"
        )
    return _subgraph_compiler


class BodyRunner:
    """Runs one subgraph: compiles it once per input signature (dtypes and ranks)."""

    def __init__(self, body: Graph):
        self.body = body
        self.compiled: dict[tuple, Any] = {}
        self._lock = threading.Lock()

    def _compile(self, arrays: Sequence[np.ndarray]) -> Any:
        g = self.body.copy()
        for i, (v, a) in enumerate(zip(g.inputs, arrays)):
            dims = tuple(g.symbols.named_dim(f"cf{i}_{k}") for k in range(a.ndim))
            v.desc = TensorDesc(a.dtype, dims, v.desc.format)
        return subgraph_compiler()(g)

    def __call__(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Run the subgraph on its inputs (formal ones, then captured ones), in order."""
        if len(arrays) != len(self.body.inputs):
            raise ExecutionError(
                f"subgraph {self.body.name!r} has {len(self.body.inputs)} inputs, got {len(arrays)} values"
            )
        arrays = [np.asarray(a) for a in arrays]
        sig = tuple((a.dtype.str, a.ndim) for a in arrays)
        model = self.compiled.get(sig)
        if model is None:
            with self._lock:
                model = self.compiled.get(sig)
                if model is None:
                    model = self._compile(arrays)
                    self.compiled[sig] = model
        wanted = set(model.input_names)
        feeds = {v.name: a for v, a in zip(self.body.inputs, arrays) if v.name in wanted}
        out = model.run(feeds)
        return [out[name] for name in model.output_names]


_RUNNERS: weakref.WeakKeyDictionary[Graph, BodyRunner] = weakref.WeakKeyDictionary()
_RUNNERS_LOCK = threading.Lock()


def body_runner(body: Graph) -> BodyRunner:
    """The (cached) runner of a subgraph."""
    with _RUNNERS_LOCK:
        r = _RUNNERS.get(body)
        if r is None:
            r = BodyRunner(body)
            _RUNNERS[body] = r
        return r


def split_captures(ins: Sequence[Any], attrs: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """(the node's own inputs, outer name -> captured value) from a node's input list."""
    names = list(attrs.get("captures") or [])
    if not names:
        return list(ins), {}
    k = len(ins) - len(names)
    if k < 0:
        raise ExecutionError(f"{len(names)} captured names but only {len(ins)} inputs")
    return list(ins[:k]), dict(zip(names, ins[k:]))


def body_inputs(
    body: Graph, formal: Sequence[np.ndarray], outer: dict[str, Any]
) -> list[np.ndarray]:
    """A subgraph's input values: the formal ones, then the captured ones it reads."""
    caps = list(getattr(body, "captures", None) or [])
    n_formal = len(body.inputs) - len(caps)
    if len(formal) != n_formal:
        raise ExecutionError(f"subgraph {body.name!r} takes {n_formal} inputs, got {len(formal)}")
    try:
        return list(formal) + [outer[n] for n in caps]
    except KeyError as exc:
        raise ExecutionError(
            f"subgraph {body.name!r} reads outer value {exc.args[0]!r}, which is not captured"
        ) from None


def _formal_count(body: Graph) -> int:
    return len(body.inputs) - len(getattr(body, "captures", None) or [])


# -- shape helpers ---------------------------------------------------------------------------
def outer_shape(ctx: InferContext, shape: tuple | None) -> tuple | None:
    """A subgraph shape in the outer graph: int dims kept, and symbolic dims built from
    the symbols of the node's inputs (a captured value's dims mean the same inside and
    out: the ONNX front end gives a graph and its subgraphs one symbol namespace); any
    other dim (a symbol the subgraph made up) becomes a fresh symbol."""
    if shape is None:
        return None
    known: set = set()
    for v in ctx.node.inputs:
        if v is not None:
            known |= free_symbols(v.shape)
    return tuple(
        d if isinstance(d, int) or d.free_symbols <= known else ctx.fresh("cf") for d in shape
    )


def merge_shapes(ctx: InferContext, a: tuple | None, b: tuple | None) -> tuple | None:
    """Dims equal in both shapes, fresh symbols where they may differ (None: ranks differ)."""
    if a is None or b is None or len(a) != len(b):
        return None
    return tuple(x if dims_equal(x, y) is True else ctx.fresh("cf") for x, y in zip(a, b))


def _carried(
    ctx: InferContext, initial: TensorDesc, body_in: TensorDesc | None, body_out: TensorDesc | None
) -> TensorDesc:
    """A loop-carried value's final desc: the initial dims the body provably keeps (its
    output dim is its input dim, or the same int), fresh symbols for the others."""
    if body_out is None or body_out.shape is None or initial.shape is None:
        return TensorDesc(
            initial.dtype, None if body_out is None or body_out.shape is None else initial.shape
        )
    if len(initial.shape) != len(body_out.shape):
        return TensorDesc(initial.dtype, None)
    ins = body_in.shape if body_in is not None and body_in.shape is not None else None
    dims: list[Dim] = []
    for k, (x, y) in enumerate(zip(initial.shape, body_out.shape)):
        same_int = isinstance(x, int) and isinstance(y, int) and x == y
        kept = ins is not None and len(ins) == len(body_out.shape) and dims_equal(ins[k], y) is True
        dims.append(x if same_int or kept else ctx.fresh("cf"))
    return TensorDesc(initial.dtype, tuple(dims))


# == If ===========================================================================================
def _if_verify(ctx: InferContext) -> None:
    t, e = ctx.attr("then_branch"), ctx.attr("else_branch")
    for name, b in (("then_branch", t), ("else_branch", e)):
        if not isinstance(b, Graph):
            ctx.fail(f"attribute {name} must be a graph", VerifyError)
        if _formal_count(b) != 0:
            ctx.fail(f"{name} must take no inputs, takes {_formal_count(b)}", VerifyError)
    if len(t.outputs) != len(e.outputs):
        ctx.fail(
            f"then_branch has {len(t.outputs)} outputs, else_branch {len(e.outputs)}", VerifyError
        )
    for i, (a, b) in enumerate(zip(t.outputs, e.outputs)):
        if a.dtype != b.dtype:
            ctx.fail(
                f"output {i}: then_branch gives {dtypes.name(a.dtype)}, else_branch {dtypes.name(b.dtype)}",
                VerifyError,
            )
    shape = ctx.shape(0)
    static = shape is not None and all(isinstance(d, int) for d in shape)
    if static and int(np.prod(shape, dtype=np.int64)) != 1:
        ctx.fail(f"cond must hold one element, has shape {list(shape)}")


def _if_infer(ctx: InferContext) -> list[TensorDesc]:
    t, e = ctx.attr("then_branch"), ctx.attr("else_branch")
    cond = ctx.value(0)
    if cond is not None and cond.size == 1:
        chosen = t if bool(cond.reshape(-1)[0]) else e
        return [TensorDesc(o.dtype, outer_shape(ctx, o.shape)) for o in chosen.outputs]
    return [
        TensorDesc(a.dtype, merge_shapes(ctx, outer_shape(ctx, a.shape), outer_shape(ctx, b.shape)))
        for a, b in zip(t.outputs, e.outputs)
    ]


def _if_kernel(ins: list, attrs: dict) -> list[np.ndarray]:
    own, outer = split_captures(ins, attrs)
    cond = np.asarray(own[0])
    if cond.size != 1:
        raise ExecutionError(f"If: cond must hold one element, has shape {list(cond.shape)}")
    body = attrs["then_branch"] if bool(cond.reshape(-1)[0]) else attrs["else_branch"]
    return body_runner(body)(body_inputs(body, [], outer))


register(
    OpDef(
        "If",
        OpKind.HOST,
        inputs=[In("cond", "B"), In("captured", "V", optional=True, variadic=True)],
        outputs=[Out("outputs", "V", variadic=True)],
        types={"B": _BOOL},
        attrs=[
            Attr("then_branch", "graph", REQUIRED),
            Attr("else_branch", "graph", REQUIRED),
            Attr("captures", "strings", None),
        ],
        verify=_if_verify,
        infer=_if_infer,
        kernel=_if_kernel,
        doc="run then_branch or else_branch on the one-element bool cond",
    )
)


# == Loop =========================================================================================
def _loop_parts(ctx: InferContext) -> tuple[list, int]:
    """(the v_initial values, K scan outputs) of a Loop node."""
    n_caps = len(ctx.attr("captures") or [])
    own = list(ctx.node.inputs[: len(ctx.node.inputs) - n_caps])
    v_init = own[2:]
    body = ctx.attr("body")
    k = len(body.outputs) - 1 - len(v_init)
    return v_init, k


def _loop_verify(ctx: InferContext) -> None:
    body = ctx.attr("body")
    if not isinstance(body, Graph):
        ctx.fail("attribute body must be a graph", VerifyError)
    v_init, k = _loop_parts(ctx)
    if any(v is None for v in v_init):
        ctx.fail("loop-carried initial values may not be omitted", VerifyError)
    if _formal_count(body) != 2 + len(v_init):
        ctx.fail(
            f"body takes {_formal_count(body)} inputs, expected 2 + {len(v_init)} (iteration, cond, carried)",
            VerifyError,
        )
    if k < 0:
        ctx.fail(
            f"body has {len(body.outputs)} outputs, expected at least 1 + {len(v_init)}",
            VerifyError,
        )
    for i, v in enumerate(v_init):
        out = body.outputs[1 + i]
        if out.dtype != v.dtype:
            ctx.fail(
                f"carried value {i}: initial {dtypes.name(v.dtype)}, body gives {dtypes.name(out.dtype)}",
                VerifyError,
            )


def _loop_infer(ctx: InferContext) -> list[TensorDesc]:
    body = ctx.attr("body")
    v_init, k = _loop_parts(ctx)
    outs = [
        _carried(ctx, v.desc, body.inputs[2 + i].desc, body.outputs[1 + i].desc)
        for i, v in enumerate(v_init)
    ]
    trips: Dim | None = None
    m = ctx.value(0) if ctx.has(0) else None
    if m is not None and not ctx.has(1):
        trips = max(int(np.asarray(m).reshape(-1)[0]), 0)
    for j in range(k):
        o = body.outputs[1 + len(v_init) + j]
        shape = outer_shape(ctx, o.shape)
        first = trips if trips is not None else ctx.fresh("trips")
        outs.append(TensorDesc(o.dtype, None if shape is None else (first, *shape)))
    return outs


def _empty_scan(o: Any) -> np.ndarray:
    """A scan output of a loop that ran zero times: (0, *the body output's static dims)."""
    dims = [] if o.shape is None else [d if isinstance(d, int) else 0 for d in o.shape]
    return np.zeros((0, *dims), dtype=o.dtype)


def _loop_kernel(ins: list, attrs: dict) -> list[np.ndarray]:
    own, outer = split_captures(ins, attrs)
    body: Graph = attrs["body"]
    run = body_runner(body)
    m = own[0] if len(own) > 0 else None
    cond_in = own[1] if len(own) > 1 else None
    carried = [np.asarray(v) for v in own[2:]]
    n = len(carried)
    k = len(body.outputs) - 1 - n
    max_trips = int(np.asarray(m).reshape(-1)[0]) if m is not None else MAX_UNBOUNDED_ITERATIONS
    cond = bool(np.asarray(cond_in).reshape(-1)[0]) if cond_in is not None else True
    it_dtype = body.inputs[0].dtype
    cond_dtype = body.inputs[1].dtype
    scans: list[list[np.ndarray]] = [[] for _ in range(k)]
    i = 0
    while i < max_trips and (cond_in is None or cond):
        formal = [np.array(i, dtype=it_dtype), np.array(cond, dtype=cond_dtype), *carried]
        res = run(body_inputs(body, formal, outer))
        if cond_in is not None:
            cond = bool(np.asarray(res[0]).reshape(-1)[0])
        carried = [np.asarray(r) for r in res[1 : 1 + n]]
        for j in range(k):
            scans[j].append(np.asarray(res[1 + n + j]))
        i += 1
    outs = list(carried)
    for j in range(k):
        if scans[j]:
            first = scans[j][0].shape
            if any(s.shape != first for s in scans[j]):
                raise ExecutionError(
                    f"Loop: scan output {j} changes shape across iterations "
                    f"({first} vs {next(s.shape for s in scans[j] if s.shape != first)})"
                )
            outs.append(np.stack(scans[j], axis=0))
        else:
            outs.append(_empty_scan(body.outputs[1 + n + j]))
    return outs


register(
    OpDef(
        "Loop",
        OpKind.HOST,
        inputs=[
            In("M", "I", optional=True),
            In("cond", "B", optional=True),
            In("v_initial", "V", optional=True, variadic=True),
        ],
        outputs=[Out("v_final_and_scan_outputs", "V", variadic=True)],
        types={"I": _I64, "B": _BOOL},
        attrs=[Attr("body", "graph", REQUIRED), Attr("captures", "strings", None)],
        verify=_loop_verify,
        infer=_loop_infer,
        kernel=_loop_kernel,
        doc="run body while i < M and cond; carried values and stacked scan outputs",
    )
)


# == Scan =========================================================================================
def _scan_axes(attrs: dict[str, Any], name: str, n: int) -> list[int]:
    v = attrs.get(name)
    if v is None:
        return [0] * n
    v = [int(x) for x in v]
    if len(v) != n:
        raise ShapeError(f"Scan: {name} has {len(v)} values, expected {n}")
    return v


def _scan_parts(attrs: dict[str, Any], n_inputs: int) -> tuple[int, int, int]:
    """(N states, M scan inputs, K scan outputs)."""
    body: Graph = attrs["body"]
    m = int(attrs["num_scan_inputs"])
    n = n_inputs - m
    k = len(body.outputs) - n
    return n, m, k


def _scan_verify(ctx: InferContext) -> None:
    body = ctx.attr("body")
    if not isinstance(body, Graph):
        ctx.fail("attribute body must be a graph", VerifyError)
    n_caps = len(ctx.attr("captures") or [])
    n_in = ctx.n_inputs - n_caps
    n, m, k = _scan_parts(ctx.attrs, n_in)
    if m < 1 or n < 0:
        ctx.fail(f"num_scan_inputs={m} does not fit {n_in} inputs", VerifyError)
    if _formal_count(body) != n + m:
        ctx.fail(
            f"body takes {_formal_count(body)} inputs, expected {n} states + {m} scan inputs",
            VerifyError,
        )
    if k < 0:
        ctx.fail(f"body has {len(body.outputs)} outputs, expected at least {n}", VerifyError)
    for name, count in (
        ("scan_input_axes", m),
        ("scan_input_directions", m),
        ("scan_output_axes", k),
        ("scan_output_directions", k),
    ):
        v = ctx.attr(name)
        if v is not None and len(v) != count:
            ctx.fail(f"{name} has {len(v)} values, expected {count}", VerifyError)


def _scan_infer(ctx: InferContext) -> list[TensorDesc]:
    body = ctx.attr("body")
    n_caps = len(ctx.attr("captures") or [])
    n_in = ctx.n_inputs - n_caps
    n, m, k = _scan_parts(ctx.attrs, n_in)
    outs = [_carried(ctx, ctx.desc(i), body.inputs[i].desc, body.outputs[i].desc) for i in range(n)]
    in_axes = _scan_axes(ctx.attrs, "scan_input_axes", m)
    first = ctx.shape(n)
    seq: Dim = ctx.fresh("seq")
    if first is not None:
        seq = first[ctx.axis(in_axes[0], len(first))]
    out_axes = _scan_axes(ctx.attrs, "scan_output_axes", k)
    for j in range(k):
        o = body.outputs[n + j]
        shape = outer_shape(ctx, o.shape)
        if shape is None:
            outs.append(TensorDesc(o.dtype, None))
            continue
        ax = ctx.axis(out_axes[j], len(shape) + 1)
        outs.append(TensorDesc(o.dtype, (*shape[:ax], seq, *shape[ax:])))
    return outs


def _scan_kernel(ins: list, attrs: dict) -> list[np.ndarray]:
    own, outer = split_captures(ins, attrs)
    body: Graph = attrs["body"]
    run = body_runner(body)
    n, m, k = _scan_parts(attrs, len(own))
    states = [np.asarray(v) for v in own[:n]]
    xs = [np.asarray(v) for v in own[n:]]
    in_axes = [a % max(x.ndim, 1) for a, x in zip(_scan_axes(attrs, "scan_input_axes", m), xs)]
    in_dirs = _scan_axes(attrs, "scan_input_directions", m)
    lengths = {x.shape[a] for x, a in zip(xs, in_axes)}
    if len(lengths) != 1:
        raise ExecutionError(f"Scan: scan inputs have different lengths {sorted(lengths)}")
    steps = lengths.pop()
    scans: list[list[np.ndarray]] = [[] for _ in range(k)]
    for t in range(steps):
        slices = [
            np.take(x, steps - 1 - t if d else t, axis=a) for x, a, d in zip(xs, in_axes, in_dirs)
        ]
        res = run(body_inputs(body, [*states, *slices], outer))
        states = [np.asarray(r) for r in res[:n]]
        for j in range(k):
            scans[j].append(np.asarray(res[n + j]))
    out_axes = _scan_axes(attrs, "scan_output_axes", k)
    out_dirs = _scan_axes(attrs, "scan_output_directions", k)
    outs = list(states)
    for j in range(k):
        seq = scans[j][::-1] if out_dirs[j] else scans[j]
        if seq:
            ax = out_axes[j] % (seq[0].ndim + 1)
            outs.append(np.stack(seq, axis=ax))
        else:
            o = body.outputs[n + j]
            dims = [] if o.shape is None else [d if isinstance(d, int) else 0 for d in o.shape]
            ax = out_axes[j] % (len(dims) + 1)
            outs.append(np.zeros((*dims[:ax], 0, *dims[ax:]), dtype=o.dtype))
    return outs


register(
    OpDef(
        "Scan",
        OpKind.HOST,
        inputs=[In("initial_state_and_scan_inputs", "V", variadic=True)],
        outputs=[Out("final_state_and_scan_outputs", "V", variadic=True)],
        attrs=[
            Attr("body", "graph", REQUIRED),
            Attr("num_scan_inputs", "int", REQUIRED),
            Attr("scan_input_axes", "ints", None),
            Attr("scan_input_directions", "ints", None),
            Attr("scan_output_axes", "ints", None),
            Attr("scan_output_directions", "ints", None),
            Attr("captures", "strings", None),
        ],
        verify=_scan_verify,
        infer=_scan_infer,
        kernel=_scan_kernel,
        doc="run body over slices of the scan inputs, carrying states; stacked scan outputs",
    )
)

__all__ = [
    "MAX_UNBOUNDED_ITERATIONS",
    "BodyRunner",
    "body_inputs",
    "body_runner",
    "merge_shapes",
    "outer_shape",
    "split_captures",
]
