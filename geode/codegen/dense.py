"""Dense ops with fused epilogues: the epilogue group rebuilt over one panel of rows, and
the native step that runs the GEMM and the compiled epilogue panel by panel.

:func:`panel_graph` rebuilds a legal epilogue (:mod:`geode.compiler.fusion.epilogue`) as a
small graph over ``[rows, N]``: the product panel is an input (``acc``), the group's other
inputs become inputs of their role's 2-D shape (``full`` ``[rows, N]``, ``col``
``[rows, 1]``, ``row`` ``[N]``, ``scalar`` ``[]``; constant rows and scalars stay constants),
and the group's nodes are cloned onto them (a reduction over the last axis reduces axis 1).
That group is lowered, scheduled and compiled like any other; :func:`dense_interface` then
wraps its kernel in the GEMM entry (:mod:`geode.codegen.backends.llvm.dense`).
"""

from __future__ import annotations

import ctypes
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from geode.codegen.backends.llvm.compiled import DenseKernel, TiledRule, TiledSource, cached_build
from geode.codegen.lower import LoweredKernel
from geode.codegen.packed_weights import packed_value
from geode.compiler.fusion.epilogue import Epilogue
from geode.compiler.fusion.groups import Group
from geode.compiler.fusion.patterns import Pattern, pattern_of
from geode.compiler.ir import Graph, Node, Value
from geode.compiler.ops import registry
from geode.compiler.ops.registry import OpKind
from geode.compiler.shapes import dims_equal
from geode.errors import CodegenError, GeodeError

__all__ = [
    "ROWS",
    "DenseKernel",
    "PanelGraph",
    "abandon_dense",
    "cached_build",
    "dense_kernel",
    "dense_module",
    "panel_graph",
    "start_dense",
    "stored",
    "tiled_source",
]

#: the panel graph's symbol for the rows of one panel (and for the columns when symbolic)
ROWS, COLS = "geode_rows", "geode_cols"


@dataclass
class PanelGraph:
    """An epilogue rebuilt over one panel: its graph and group, the model value each of its
    inputs and outputs stands for, and every panel value's role."""

    epilogue: Epilogue
    graph: Graph
    group: Group
    origin: dict[str, Value] = field(default_factory=dict)
    roles: dict[str, str] = field(default_factory=dict)

    @property
    def dense(self) -> Node:
        """The dense node (MatMul) whose product the epilogue consumes."""
        return self.epilogue.dense

    @property
    def nodes(self) -> list[Node]:
        """The model's nodes the dense step runs: the RMSNorm scale of its rows (when it
        computes it), the MatMul (and its sibling), the epilogue, the second MatMul (and
        the bias and residual Adds)."""
        ep = self.epilogue
        extra = [n for n in (ep.second, ep.bias, ep.residual) if n is not None]
        sibling = [n for n in (ep.sibling, ep.partner) if n is not None]
        before: list[Node] = []  # the layout nodes of operands read in place, in order
        for x in ("A", "B", "V"):
            if x in ep.views:
                before += [n for n in ep.views[x].nodes if all(n is not m for m in before)]
        after = list(ep.views["O"].nodes) if "O" in ep.views else []
        first = [ep.a_transpose] if ep.a_transpose is not None else []
        pro = ep.prologue.nodes if ep.prologue is not None else []
        return [*first, *pro, *before, self.dense, *sibling, *ep.group.nodes, *extra, *after]


#: a role's panel dims: ``r`` the panel's rows, ``c`` the product's columns
_PANEL = {"acc": "rc", "full": "rc", "bfull": "rc", "col": "r1", "row": "c", "brow": "c"}


def _panel_shape(role: str, acc: Value, width: int | None = None) -> tuple:
    rows, cols = acc.shape
    if role == "part":  # a narrow epilogue's columns (compiler/fusion/summed.py)
        return (rows, width)
    return tuple({"r": rows, "c": cols, "1": 1}[x] for x in _PANEL.get(role, ""))


def _panel_input(pg: PanelGraph, v: Value, role: str, cols: object) -> Value:
    g = pg.graph
    if role == "param":  # a column Slice's bounds: constants as they are
        nv = g.constant(np.asarray(v.data), name=v.name, dtype=v.dtype)
        pg.origin[nv.name] = v
        pg.roles[nv.name] = role
        return nv
    if role == "part":
        nv = g.input(g.unique_name(v.name), [ROWS, pg.epilogue.width], v.dtype)
        pg.origin[nv.name] = v
        pg.roles[nv.name] = role
        return nv
    if v.is_constant and v.data is not None and role in ("row", "scalar"):
        shape = (-1,) if role == "row" else ()
        nv = g.constant(np.asarray(v.data).reshape(shape), name=v.name, dtype=v.dtype)
    else:
        dims = [{"r": ROWS, "c": cols, "1": 1}[x] for x in _PANEL.get(role, "")]
        nv = g.input(g.unique_name(v.name), dims, v.dtype)
    pg.origin[nv.name] = v
    pg.roles[nv.name] = role
    return nv


def _clone(pg: PanelGraph, node: Node, new: dict[int, Value]) -> Node:
    ins = [None if v is None else new[id(v)] for v in node.inputs]
    attrs = dict(node.attrs)
    if node.op_type == "Slice" and not node.domain:  # a column slice: axis 1 here
        ins[3] = pg.graph.constant(np.array([1], dtype=np.int64), name="axes")
    elif node.op_type == "Split" and not node.domain:  # column pieces: axis 1 here
        attrs["axis"] = 1
    elif pattern_of(node) is Pattern.REDUCE:  # the last axis of the product is axis 1 here
        if len(ins) > 1 and ins[1] is not None:
            ins[1] = pg.graph.constant(np.array([1], dtype=np.int64), name="axes")
        else:
            attrs["axes"] = [1]
    return pg.graph.add_node(
        node.op_type, ins, attrs, n_outputs=len(node.outputs), domain=node.domain
    )


def panel_graph(ep: Epilogue, model: Graph) -> PanelGraph:
    """``ep``'s group rebuilt over one panel (see the module docstring). Raises
    :class:`~geode.errors.CodegenError` when a cloned value's shape is not its role's."""
    y = ep.dense.outputs[0]
    # causal panels compute fewer columns than the product's, key-tiled ones a block of
    # them: the epilogue takes them as an argument
    fixed = isinstance(y.shape[-1], int) and ep.causal is None and ep.online is None
    cols = y.shape[-1] if fixed else COLS
    src = _source_group(ep)
    pg = PanelGraph(ep, Graph(f"group{ep.group.id}_panel"), src)
    new: dict[int, Value] = {}
    for v in src.inputs():
        new[id(v)] = _panel_input(pg, v, ep.roles[v.name], cols)
    acc = next(nv for nv in new.values() if pg.roles.get(nv.name) == "acc")
    nodes = []
    try:
        for node in src.nodes:
            clone = _clone(pg, node, new)
            nodes.append(clone)
            for old, nv in zip(node.outputs, clone.outputs):
                want = _panel_shape(ep.roles[old.name], acc, ep.width)
                if (
                    nv.shape is None
                    or len(nv.shape) != len(want)
                    or not all(dims_equal(a, b) is True for a, b in zip(nv.shape, want))
                ):
                    raise CodegenError(f"panel value {nv.name} has shape {nv.shape}, not {want}")
                new[id(old)] = nv
                pg.roles[nv.name] = ep.roles[old.name]
    except GeodeError as exc:
        raise CodegenError(f"epilogue of {ep.dense.name} has no panel form: {exc}") from None
    outs = src.outputs(model)
    pg.graph.output(*[new[id(o)] for o in outs])
    for o in outs:
        pg.origin[new[id(o)].name] = o
    axes = frozenset({1}) if src.axes else frozenset()
    domain = tuple(acc.shape) if ep.width is None else (acc.shape[0], ep.width)
    pg.group = Group(ep.group.id, nodes, domain, axes)
    return pg


def _source_group(ep: Epilogue) -> Group:
    """The group the panel kernel computes: the epilogue's, or with a key-tiled softmax its
    per-element part alone (its output the softmax's input; the entry does the rest)."""
    if ep.online is None:
        return ep.group
    return Group(ep.group.id, list(ep.online.pre), ep.group.domain)


def _inner_dims(lowered: LoweredKernel) -> list[str | int]:
    """What each dim argument of the epilogue kernel is: ``rows``, ``cols`` or a constant."""
    out: list[str | int] = []
    for expr in lowered.dim_exprs.values():
        if isinstance(expr, (int, np.integer)) or getattr(expr, "is_Integer", False):
            out.append(int(expr))
        elif str(expr) in (ROWS, COLS):
            out.append("rows" if str(expr) == ROWS else "cols")
        else:
            raise CodegenError(f"epilogue dim {expr} is not the panel's rows or columns")
    return out


def _arguments(pg: PanelGraph, lowered: LoweredKernel, views: list) -> tuple[list, list, list]:
    """The entry's arguments after A and B (model values), their :class:`OuterArg`, and the
    epilogue kernel's :class:`InnerArg` list."""
    from geode.codegen.backends.llvm.dense import InnerArg, OuterArg

    values: list[Value] = []
    outer: list[OuterArg] = []
    inner: list[InnerArg] = []
    second = pg.epilogue.second
    for v, view in zip(lowered.inputs + lowered.outputs, views):
        role = pg.roles[v.name]
        item = v.dtype.itemsize
        width = pg.epilogue.width if role == "part" else 0
        if role == "acc":
            inner.append(InnerArg(-1, role, item, view))
            continue
        online = pg.epilogue.online
        read = None if second is None else second.inputs[0] if online is None else online.x
        if second is not None and pg.origin[v.name] is read:
            inner.append(InnerArg(-2, role, item, view))  # the panel the second GEMM reads
            continue
        beside = [n.outputs[0] for n in (pg.epilogue.sibling, pg.epilogue.partner) if n]
        if any(pg.origin.get(v.name) is u for u in beside):
            inner.append(InnerArg(-3, role, item, view))  # the sibling's or partner's panel
            continue
        pro = pg.epilogue.prologue
        if pro is not None and pg.origin.get(v.name) is pro.scale:
            inner.append(InnerArg(-4, role, item, view))  # the scale per row, from A's panel
            continue
        model_value = pg.origin[v.name]
        inner.append(InnerArg(len(values), role, item, view, width))
        values.append(model_value)
        outer.append(OuterArg(role, len(model_value.shape), item, width))
    return values, outer, inner


def _entry_spec(
    pg: PanelGraph, lowered: LoweredKernel, views: list, entry: str, sizes: tuple, tiled: Any
) -> Any:
    """The ``DenseSpec`` of the GEMM entry (``sizes``: panel bytes, minimum rows,
    ``packed_n``, ``packed_d``), with the key-tiled body's (:class:`TiledBody`) when given."""
    name = f"geode_dense_{entry}"
    spec = _spec(pg, lowered, views, name, entry, sizes)
    if tiled is None:
        return spec
    same = [id(v) for v in _arguments(pg, lowered, views)[0]]
    if same != [id(v) for v in _arguments(tiled.pg, tiled.lowered, tiled.views)[0]]:
        raise CodegenError(f"{pg.dense.name}: the key-tiled body takes other arguments")
    body = _spec(tiled.pg, tiled.lowered, tiled.views, f"{name}_tiled", tiled.entry, sizes)
    return dataclasses.replace(spec, tiled=body, tiled_limit=tiled.limit)


def dense_module(
    pg: PanelGraph,
    lowered: LoweredKernel,
    views: list,
    entry: str,
    panel_bytes: int,
    min_rows: int,
    packed_n: int = 0,
    packed_d: int = 0,
    tiled: TiledBody | None = None,
) -> tuple[str, str]:
    """The symbol and the LLVM module of the GEMM entry around the epilogue kernel whose
    symbol is ``entry`` (the arguments as :func:`dense_kernel`'s). The module calls the
    epilogue by name, so it is known, and LLVM can compile it, once the epilogue's module
    is emitted (:func:`start_dense`). ``tiled``: the key-tiled body of a symbolic key
    length (``Epilogue.switch``), taken per call on long rows once linked: the entry holds
    the row panels and a branch through its cell (:func:`tiled_source` makes the body)."""
    from geode.codegen.backends.llvm.dense import dense_ir

    sizes = (panel_bytes, min_rows, packed_n, packed_d)
    spec = _entry_spec(pg, lowered, views, entry, sizes, tiled)
    return spec.name, dense_ir(spec)


def tiled_source(
    args: tuple, tiled: TiledBody, epilogue: Any, name: str, fastmath: bool
) -> TiledSource:
    """The key-tiled body of the entry :func:`dense_module` makes of ``args`` (its
    arguments, ``tiled`` omitted) as code to compile when a call first takes it: the
    body's module, its epilogue kernel's module ``epilogue`` (an ``Emitted``, kernel
    ``name``) and the entry's rule (:class:`~geode.codegen.backends.llvm.compiled.TiledRule`)."""
    from geode.codegen.backends.llvm.dense import tiled_ir

    pg, lowered, views, entry = args[:4]
    entry = entry if isinstance(entry, str) else entry.entry  # a compiled kernel's symbol
    sp = _entry_spec(pg, lowered, views, entry, tuple(args[4:8]), tiled)
    lays = tuple(None if x is None else (x.heads, x.depth, x.transposed) for x in sp.layouts[:3])
    item = int(np.dtype(sp.dtype).itemsize)
    rule = TiledRule(item, sp.panel_bytes, sp.min_rows, sp.tiled_limit, sp.batch > 0, sp.v_at, lays)
    return TiledSource(name, epilogue, fastmath, sp.tiled.name, tiled_ir(sp), rule)


@dataclass
class TiledBody:
    """The key-tiled body of an entry that chooses per call (``Epilogue.switch``): its panel
    graph (the epilogue's per-element part), lowered kernel, argument views, the epilogue
    kernel's symbol and the scores' bytes per row panel past which it runs."""

    pg: PanelGraph
    lowered: LoweredKernel
    views: list
    entry: str
    limit: int


def _spec(
    pg: PanelGraph, lowered: LoweredKernel, views: list, name: str, entry: str, sizes: tuple
) -> Any:
    """The ``DenseSpec`` of the entry ``name`` around the epilogue ``entry``; ``sizes``:
    panel bytes, minimum rows, ``packed_n``, ``packed_d``."""
    from geode.codegen.backends.llvm.dense import CausalPanels, DenseSpec, HeadLayout

    panel_bytes, min_rows, packed_n, packed_d = sizes
    if lowered.index_checks:
        raise CodegenError("an epilogue with index checks has no panel form")
    if pg.epilogue.a_transpose is not None and not packed_n:
        raise CodegenError("a GEMM reading A transposed in place needs B packed once")
    a, b = pg.epilogue.a_value, pg.dense.inputs[1]
    values, outer, inner = _arguments(pg, lowered, views)
    return DenseSpec(
        name,
        str(np.dtype(a.dtype)),
        len(a.shape),
        len(b.shape),
        tuple(outer),
        tuple(inner),
        tuple(_inner_dims(lowered)),
        entry,
        panel_bytes,
        min_rows,
        len(pg.epilogue.second.inputs[1].shape) if pg.epilogue.second is not None else 0,
        packed_n,
        packed_d,
        pg.epilogue.sibling is not None,
        pg.epilogue.residual is not None,
        len(_bias_input(pg.epilogue).shape) if pg.epilogue.bias is not None else 0,
        pg.epilogue.a_transpose is not None,
        pg.epilogue.prologue.eps if pg.epilogue.prologue is not None else None,
        tuple(_layout(pg.epilogue, x, HeadLayout) for x in "ABVO"),
        _in_place(pg, lowered, inner, len(b.shape)),
        _causal(pg, values, inner, packed_n or packed_d, CausalPanels),
        pg.epilogue.partner is not None,
        online=_online(pg, values, inner, packed_n or packed_d),
    )


def _causal(pg: PanelGraph, values: list, inner: list, packed: int, panels: Any) -> Any:
    """The entry's causal panels (``CausalPanels``) of a causal attention: its mask's
    argument among the epilogue's, the offset and the mask's values; None without a causal
    mask, or with weights packed once (no attention has them)."""
    c = pg.epilogue.causal
    if c is None or packed:
        return None
    from geode.compiler.fusion.profit import CAUSAL_ROWS

    arg = next(
        (j for j, a in enumerate(inner) if a.source >= 0 and values[a.source] is c.mask), None
    )
    if arg is None:
        raise CodegenError(f"{pg.dense.name}: the causal mask {c.mask.name} is not an argument")
    return panels(c.offset, arg, c.masked, c.kept, CAUSAL_ROWS)


def _online(pg: PanelGraph, values: list, inner: list, packed: int) -> Any:
    """The entry's key-tiled panels (``OnlinePanels``) of an attention with an online
    softmax: :data:`~geode.compiler.fusion.profit.ONLINE_ROWS` query rows by blocks of
    :data:`~geode.compiler.fusion.profit.ONLINE_KEYS` keys, its one mask of the scores'
    size (copied per block) among the epilogue's arguments; None without one."""
    if pg.epilogue.online is None:
        return None
    if packed:
        raise CodegenError(f"{pg.dense.name}: a key-tiled attention with weights packed once")
    from geode.codegen.backends.llvm.attention_tiled import OnlinePanels
    from geode.compiler.fusion import profit

    masks = [j for j, a in enumerate(inner) if a.source >= 0 and a.role in ("full", "bfull")]
    if len(masks) > 1:
        raise CodegenError(f"{pg.dense.name}: more than one input of the scores' size")
    return OnlinePanels(profit.ONLINE_ROWS, profit.ONLINE_KEYS, masks[0] if masks else -1)


def _in_place(pg: PanelGraph, lowered: LoweredKernel, inner: list, b_rank: int) -> int:
    """The ``outer`` index of the output the GEMM writes its panels into for the epilogue
    to rewrite in place (``DenseSpec.in_place``), or -1: one GEMM (no second, no sibling),
    unbatched, ``A`` and ``O`` in place; an elementwise epilogue (each element read before
    it is written, at the same place) with one output, ``full`` and of the product's
    type, and no ``full`` input but the product."""
    ep = pg.epilogue
    one_gemm = ep.second is None and ep.sibling is None and ep.a_transpose is None
    one_gemm = one_gemm and ep.partner is None
    if not one_gemm or ep.views or b_rank != 2 or len(lowered.outputs) != 1:
        return -1
    same_place = (OpKind.ELEMENTWISE, OpKind.BROADCAST)  # no Slice, Transpose, reduction
    if any(
        registry.get(n.op_type, n.domain, n.where).kind not in same_place for n in ep.group.nodes
    ):
        return -1
    n_in = len(lowered.inputs)
    ins, out = inner[:n_in], inner[n_in]
    acc = next((a for a in ins if a.source == -1), None)
    if acc is None or out.role != "full" or out.source < 0 or out.itemsize != acc.itemsize:
        return -1
    if any(a.role in ("full", "bfull") for a in ins if a.source >= 0):
        return -1
    return out.source


def _layout(ep: Epilogue, operand: str, layout: Any) -> Any:
    """The entry's head layout of ``operand`` (None: C-contiguous)."""
    hv = ep.views.get(operand)
    if hv is None:
        return None
    return layout(hv.heads, hv.depth, hv.offset, hv.transposed)


def stored(ep: Epilogue, operand: str, value: Value) -> Value:
    """The model value passed for ``operand`` (``value`` itself, or the root it is read
    from or written into in place)."""
    hv = ep.views.get(operand)
    return value if hv is None else hv.root


def start_dense(name: str, ir: str, cache_dir: Any) -> None:
    """Start LLVM on the GEMM entry module ``ir`` (symbol ``name``, from
    :func:`dense_module`) on a background thread, unless the disk cache in ``cache_dir``
    holds its object code; :func:`dense_kernel` then claims it."""
    from geode.codegen.backends.llvm.kernel import start_module

    start_module(name, ir, cache_dir)


def abandon_dense(ir: str) -> None:
    """Forget the background LLVM run :func:`start_dense` began on ``ir`` if nothing
    claimed it (the entry was never linked, or linked from memory)."""
    from geode.codegen.backends.llvm.kernel import abandon_module

    abandon_module(ir)


def _residual_input(ep: Epilogue) -> Value:
    """The residual ``Add``'s input that is not the second product (or the bias's sum)."""
    o = (ep.bias if ep.bias is not None else ep.second).outputs[0]
    a, b = ep.residual.inputs
    return b if a is o else a


def _bias_input(ep: Epilogue) -> Value:
    """The bias ``Add``'s input that is not the second product: the bias."""
    o = ep.second.outputs[0]
    a, b = ep.bias.inputs
    return b if a is o else a


def dense_kernel(
    pg: PanelGraph,
    lowered: LoweredKernel,
    views: list,
    epilogue: Any,
    panel_bytes: int,
    min_rows: int,
    cache_dir: Any,
    packed_n: int = 0,
    packed_d: int = 0,
    tiled: tuple[TiledBody, TiledSource] | None = None,
    build: Any = None,
) -> tuple[DenseKernel, list[Value], list[Value]]:
    """Compile the GEMM entry around the compiled ``epilogue`` kernel; returns it, the model
    values of its inputs after ``A`` and ``B`` (a sibling's ``Bu`` packed, or a partner's
    ``B2`` packed and its ``A2``; ``V``, a residual ``R``, a bias, then the epilogue's) and
    of its outputs (the epilogue's, then ``O``, or the residual's or the bias ``Add``'s
    result). ``packed_n > 0``: ``B`` (float32, that many columns) is passed packed once (:mod:`geode.codegen.packed_weights`); ``packed_d > 0``:
    likewise ``V`` (returned packed among the inputs; the caller passes ``B`` packed).
    ``tiled``: the key-tiled body and its code (:func:`tiled_source`), linked by ``build``
    (:func:`cached_build`) when a call first takes it; the entry's cell holds its address
    (null until then)."""
    from geode.codegen.backends.llvm.compiled import ArgSpec, Emitted, LLVMKernel
    from geode.codegen.backends.llvm.dense import link_dense
    from geode.codegen.backends.llvm.library import blas, share_pool
    from geode.codegen.backends.llvm.target import host

    if lowered.index_checks:
        raise CodegenError("an epilogue with index checks has no panel form")
    lib = blas()
    a, b = pg.epilogue.a_value, pg.dense.inputs[1]
    dtype = str(np.dtype(a.dtype))
    if lib is None:
        raise CodegenError("no BLAS found")
    share_pool(lib)
    values, _, inner = _arguments(pg, lowered, views)
    t0 = time.perf_counter()
    body, source = tiled if tiled is not None else (None, None)
    name, ir = dense_module(
        pg, lowered, views, epilogue.entry, panel_bytes, min_rows, packed_n, packed_d, body
    )
    target = host()
    cell = None if tiled is None else ctypes.c_void_p()
    loaded, from_cache = link_dense(name, ir, cache_dir, epilogue, cell)
    n_ext_in = sum(
        1 for a_ in inner[: len(lowered.inputs)] if a_.source >= 0
    )  # the epilogue's own inputs come first among its arguments
    ep = pg.epilogue
    second = ep.second
    v_in = [stored(ep, "V", second.inputs[1])] if second is not None else []
    if packed_d and v_in:  # V, packed once
        v_in[0] = packed_value(v_in[0])
    u_in = [packed_value(ep.sibling.inputs[1])] if ep.sibling is not None else []
    if ep.partner is not None:  # its weight packed once, then its A
        u_in = [packed_value(ep.partner.inputs[1]), ep.partner.inputs[0]]
    r_in = [_residual_input(ep)] if ep.residual is not None else []
    b_in = [_bias_input(ep)] if ep.bias is not None else []
    ins = u_in + v_in + r_in + b_in + values[:n_ext_in]
    last = next((n for n in (ep.residual, ep.bias, second) if n is not None), None)
    last_out = [] if last is None else [stored(ep, "O", last.outputs[0])]
    outs = values[n_ext_in:] + last_out
    a, b = stored(ep, "A", a), stored(ep, "B", b)
    specs = [
        ArgSpec("A", "input", dtype, len(a.shape), str(list(a.shape))),
        ArgSpec("B", "input", dtype, len(b.shape), str(list(b.shape))),
    ]
    if packed_n:
        k = b.shape[0]
        specs[1] = ArgSpec("Bp", "input", dtype, 3, str([-(-packed_n // 16), k, 16]))
    for role, group in (("input", ins), ("output", outs)):
        specs += [
            ArgSpec(v.name, role, str(v.dtype), len(v.shape), str(list(v.shape))) for v in group
        ]
    emitted = Emitted(ir, name, tuple(specs), (), False, ())
    seconds = time.perf_counter() - t0
    entry = LLVMKernel(name, emitted, loaded, target, seconds, from_cache, False)
    in_place = _in_place(pg, lowered, inner, len(pg.dense.inputs[1].shape)) >= 0
    kernel = DenseKernel(
        pg.dense.name, entry, epilogue, ir, in_place, lazy=source, cell=cell, build=build
    )
    return kernel, ins, outs
