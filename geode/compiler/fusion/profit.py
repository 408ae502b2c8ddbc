"""Profitability: does a legal merge pay? Scored with the speed-of-light cost model.

A group's work is what its kernel would move and compute: bytes of the values it
reads from outside and writes for outside, and flops of every op times the number of
times the fused kernel evaluates it (a Trivial op inlined into both a reduction and
a broadcast epilogue runs twice: that is the recomputation R+T fusion pays for).
Symbolic dims are scored at a nominal size.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import sympy

from geode.compiler.fusion.groups import Group
from geode.compiler.fusion.patterns import Pattern, pattern_of
from geode.compiler.fusion.stitch import STITCH_PARTIALS
from geode.compiler.ir import Graph, Node, Value
from geode.compiler.shapes import Dim
from geode.costmodel.device import DeviceSpec
from geode.costmodel.sol import Decision, KernelWork, decide_merge

#: value every symbolic dim takes when scoring (one nominal problem size)
NOMINAL_DIM = 512

TRANSCENDENTAL = frozenset(
    {
        "Exp",
        "Log",
        "Tanh",
        "Erf",
        "Sigmoid",
        "Sin",
        "Cos",
        "Tan",
        "Softplus",
        "Gelu",
        "Pow",
        "Elu",
        "Selu",
        "Asin",
        "Acos",
        "Atan",
        "Sinh",
        "Cosh",
        "Asinh",
        "Acosh",
        "Atanh",
        "Mish",
    }
)


def numel(v: Value) -> float:
    """Elements of a value at the nominal size."""
    n = 1.0
    for d in v.shape or ():
        if isinstance(d, int):
            n *= d
        elif isinstance(d, sympy.Symbol):
            # a lone symbol is the nominal size itself: no memo lookup, whose hit on an
            # equal but distinct symbol object costs sympy's structural ``==``
            n *= NOMINAL_DIM
        else:
            n *= _nominal(d)
    return n


@functools.lru_cache(maxsize=4096)
def _nominal(d: sympy.Expr) -> float:
    """A symbolic dim at the nominal size (every symbol :data:`NOMINAL_DIM`); remembered
    per dim: the planner asks about the same few dims thousands of times."""
    return float(d.xreplace({s: sympy.Integer(NOMINAL_DIM) for s in d.free_symbols}))


def nbytes(v: Value) -> float:
    """Bytes of a value at the nominal size (scalar constants are free: they are inlined)."""
    if v.is_constant and v.data is not None and v.data.size == 1:
        return 0.0
    return numel(v) * v.dtype.itemsize


def evaluations(group: Group, graph: Graph) -> dict[str, float]:
    """Elements the fused kernel evaluates per node, relative to the node's own size.

    1 for most nodes: row-reduce schedules keep a Trivial value read by several passes
    in a row buffer, and elementwise schedules store every output from one loop body.
    A *partial* node (a [K] computation inside an [N, K] group) is recomputed for every
    element of the domain; in a column-reduce group (no row buffer) a Trivial node is
    recomputed once per pass that reads it.
    """
    from geode.compiler.fusion.patterns import placement_on

    names = group.names
    outputs = {id(v) for v in group.outputs(graph)}
    dom = 1.0
    for d in group.domain:
        dom *= float(d) if isinstance(d, int) else float(NOMINAL_DIM)
    column = group.pattern_name() == "column_reduce"
    passes: dict[str, set[str]] = {}
    for n in reversed(group.nodes):
        sinks: set[str] = set()
        for o in n.outputs:
            for c in o.consumers:
                if c.name not in names:
                    continue
                materialized = pattern_of(c) is Pattern.REDUCE or any(
                    id(x) in outputs for x in c.outputs
                )
                sinks |= {c.name} if materialized else passes.get(c.name, set())
        passes[n.name] = sinks
    out: dict[str, float] = {}
    for n in group.nodes:
        factor = 1.0
        if pattern_of(n) is not Pattern.REDUCE:
            size = max(numel(o) for o in n.outputs)
            if placement_on(n.outputs[0].shape, group.domain, group.axes) == "partial" and size > 0:
                factor = dom / size
            if column and not any(id(o) in outputs for o in n.outputs):
                factor *= max(1, len(passes[n.name]))
        out[n.name] = factor
    return out


def group_work(group: Group, graph: Graph, evals: dict[str, float] | None = None) -> KernelWork:
    """The SOL work of one group's kernel (``evals``: the group's :func:`evaluations`,
    when the caller has them already)."""
    reads = sum(nbytes(v) for v in group.inputs())
    writes = sum(nbytes(v) for v in group.outputs(graph))
    flops = 0.0
    trans = 0.0
    if evals is None:
        evals = evaluations(group, graph)
    for n in group.nodes:
        size = (
            numel(n.inputs[0])
            if pattern_of(n) is Pattern.REDUCE
            else max(numel(o) for o in n.outputs)
        )
        if n.op_type in TRANSCENDENTAL:
            trans += size * evals[n.name]
        else:
            flops += size * evals[n.name]
    return KernelWork(bytes_read=reads, bytes_written=writes, flops=flops, transcendentals=trans)


def make_profit(spec: DeviceSpec) -> Callable[[Group, Group, Group, Graph], tuple[bool, str]]:
    """The planner's profitability callback for a device."""

    def profit(a: Group, b: Group, merged: Group, graph: Graph) -> tuple[bool, str]:
        if merged.levels:
            lost = tree_parallelism_lost(a, b, merged, spec)
            if lost:
                return False, lost
        if merged.branches:
            lost = stitch_parallelism_lost(merged, spec)
            if lost:
                return False, lost
        separate = [kernel_work(a, graph), kernel_work(b, graph)]
        evals = evaluations(merged, graph)  # the recompute factor's, and the work's
        fused = kernel_work(merged, graph, evals)
        factor = max(evals.values()) if evals else 1
        d = decide_merge(
            separate, fused, spec, recompute_factor=float(factor) if factor > 1 else None
        )
        return d.take, d.reason

    return profit


def kernel_work(group: Group, graph: Graph, evals: dict[str, float] | None = None) -> KernelWork:
    """The SOL work of a group's kernel: :func:`stitch_work` for a stitch group, else
    :func:`group_work` (``evals``: the group's :func:`evaluations`, when known)."""
    if group.branches:
        return stitch_work(group, graph, evals)
    return group_work(group, graph, evals)


def stitch_work(group: Group, graph: Graph, evals: dict[str, float] | None = None) -> KernelWork:
    """The SOL work of a stitch group's kernel (``stitch.py``): its reads and writes
    plus the column partials, written by the row blocks and read back by the final
    combine: ``min(STITCH_PARTIALS, rows)`` rows of the column reduction's result
    shape. The shared input is read once. With few rows the partials grow as large as
    the input and the stitch does not pay (the separate kernels win)."""
    w = group_work(group, graph, evals)
    rows_axes, col_axes = group.branches
    rows = _extent([group.domain[i] for i in sorted(col_axes)])  # what the columns reduce
    cols = _extent([group.domain[i] for i in sorted(rows_axes)])
    item = max((o.dtype.itemsize for n in group.nodes for o in n.outputs), default=4)
    partials = min(float(STITCH_PARTIALS), rows) * cols * item
    return KernelWork(
        bytes_read=w.bytes_read + partials,
        bytes_written=w.bytes_written + partials,
        flops=w.flops,
        transcendentals=w.transcendentals,
    )


def stitch_parallelism_lost(group: Group, spec: DeviceSpec) -> str | None:
    """Why a stitch kernel would leave cores idle, or None. Its row blocks cut the
    first axis (``codegen/stitch_schedule.py``): ``min(STITCH_PARTIALS, domain[0])``
    blocks; fewer than the device's cores (a batch of one in ``[1, T, C]``) run the
    whole pass on fewer threads than either reduction alone would use."""
    blocks = min(float(STITCH_PARTIALS), _extent([group.domain[0]]))
    if blocks < spec.cores:
        return (
            f"stitch: {blocks:g} row blocks (the first axis) on {spec.cores} cores: "
            "parallelism lost"
        )
    return None


def _extent(dims: list[Dim]) -> float:
    n = 1.0
    for d in dims:
        n *= float(d) if isinstance(d, int) else float(NOMINAL_DIM)
    return n


def tree_parallelism_lost(a: Group, b: Group, merged: Group, spec: DeviceSpec) -> str | None:
    """Why a reduce tree would lose too much parallelism, or None.

    The tree's kernel runs its rows (the axes no level reduces) in parallel; its first
    reduction alone ran the rows times its other kept axes. A tree with fewer rows than
    the device has cores leaves cores idle while the separate first reduction would
    use them all: the traffic it saves (the intermediate, written and read once) is a
    fraction of what the first reduction reads, so idle cores cost more."""
    if not (a.axes and b.axes):
        return None  # an elementwise group joins a tree: its rows stay
    rows = _extent([merged.domain[i] for i in range(len(merged.domain)) if i not in merged.axes])
    first = a if len(a.domain) == len(merged.domain) and a.domain == merged.domain else b
    before = _extent([first.domain[i] for i in range(len(first.domain)) if i not in first.axes])
    if rows < spec.cores and before > rows:
        return (
            f"reduce tree: {rows:g} rows in parallel on {spec.cores} cores, where the first "
            f"reduction alone runs {before:g}: parallelism lost"
        )
    return None


def describe_work(group: Group, graph: Graph, spec: DeviceSpec) -> dict[str, float]:
    """Cost numbers shown next to a kernel in explain(): bytes, flops, SOL time."""
    from geode.costmodel.sol import estimate

    w = group_work(group, graph)
    return {
        "bytes": w.bytes_moved,
        "flops": w.flops + w.transcendentals,
        "sol_us": estimate(w, spec) * 1e6,
    }


#: a GEMM panel holds at least this many rows (fewer re-pack the right operand too often)
DENSE_MIN_ROWS = 64


def panel_bytes(spec: DeviceSpec) -> int:
    """Bytes of one product panel: half the L2 of every core (the GEMM's packed blocks
    take the rest), so the epilogue reads the panel the GEMM just wrote from cache."""
    return max(spec.l2_bytes * spec.cores // 2, 1 << 16)


def epilogue_plan(dense: Node, spec: DeviceSpec, second: Node | None = None) -> tuple[int, str]:
    """The panel rows a fused epilogue uses at the nominal size, and why: the rule the
    kernel's entry applies to each run's shapes
    (:func:`geode.codegen.backends.llvm.dense._panel_rows`). Panels the caches hold
    (:func:`panel_bytes`, at least :data:`DENSE_MIN_ROWS` rows) save writing the product
    (with a ``second`` MatMul, also the epilogue's result) to memory and reading it back;
    but the BLAS re-packs the weights (``B``, and ``V``) on every call and slows down
    several-fold on panels of a few hundred rows, so weights larger than a panel get one
    panel of all rows: as much traffic as unfused, the steps fewer (weights packed once at
    compile time, :mod:`geode.codegen.packed_weights`, are not re-packed: their kernel
    runs row panels whatever this says). So a legal epilogue always pays; this says how."""
    y, b = dense.outputs[0], dense.inputs[1]
    item = y.dtype.itemsize
    cols = _last(y)
    batched = len(b.shape or ()) > 2
    rows = _dim(y, -2) if batched else numel(y) / max(cols, 1)
    depth = _dim(b, -2) + (_last(second.inputs[1]) if second is not None else 0.0)
    steps = 2 if second is not None else 1
    if depth * cols * item > panel_bytes(spec):
        return int(rows), (
            "one panel through the BLAS (weights too large to re-pack per panel; weights "
            f"packed once run row panels, see the kernel's weights line): {steps} step(s) fewer"
        )
    mb = int(max(1, min(max(DENSE_MIN_ROWS, panel_bytes(spec) // max(int(cols * item), 1)), rows)))
    saved = numel(y) * item * steps
    return (
        mb,
        f"panels of {mb} rows: {2 * saved / 2**20:.1f} MiB less traffic, {steps} step(s) fewer",
    )


def _dim(v: Value, axis: int) -> float:
    d = (v.shape or (1, 1))[axis]
    return float(d) if isinstance(d, int) else float(NOMINAL_DIM)


def _last(v: Value) -> float:
    d = (v.shape or (1,))[-1]
    return float(d) if isinstance(d, int) else float(NOMINAL_DIM)


def sibling_plan(dense: Node, sibling: Node, spec: DeviceSpec) -> tuple[bool, str]:
    """Whether computing ``sibling``'s product (a MatMul of ``dense``'s ``A``) per panel
    beside ``dense``'s pays, and why, by the SOL model: apart, the sibling's GEMM writes
    its product and the epilogue reads it back, a launch of its own; fused, its GEMM runs
    in the panel (the same multiply-adds and weight reads, ``A``'s panel read again)."""
    d = _beside(sibling, spec)
    return d.take, f"{sibling.name} per panel beside {dense.name}: {d.reason}"


def _beside(gemm_node: Node, spec: DeviceSpec) -> Decision:
    """The SOL model's verdict on a MatMul computed per panel beside another GEMM: apart,
    its GEMM writes its product and the epilogue reads it back, a launch of its own;
    fused, its GEMM runs in the panel (the same multiply-adds and reads of its ``A`` and
    weight)."""
    u, a, w = gemm_node.outputs[0], gemm_node.inputs[0], gemm_node.inputs[1]
    flops = 2.0 * numel(u) * _dim(w, -2)
    gemm = KernelWork(bytes_read=nbytes(a) + nbytes(w), bytes_written=nbytes(u), flops=flops)
    readback = KernelWork(bytes_read=nbytes(u), bytes_written=0.0, flops=0.0, n_kernels=0)
    fused = KernelWork(
        bytes_read=nbytes(a) + nbytes(w), bytes_written=0.0, flops=flops, n_kernels=0
    )
    return decide_merge([gemm, readback], fused, spec)


def partner_plan(dense: Node, partner: Node, spec: DeviceSpec) -> tuple[bool, str]:
    """Whether computing ``partner``'s product (a MatMul of another ``A`` of the same rows,
    :func:`geode.compiler.fusion.summed.partner_gemm`) per panel beside ``dense``'s pays,
    and why, by the SOL model: apart, the partner's GEMM writes its product and the
    epilogue reads it back, a launch of its own; fused, its GEMM runs in the panel (the
    same multiply-adds and reads of its ``A`` and weight)."""
    d = _beside(partner, spec)
    return d.take, f"{partner.name} per panel beside {dense.name} (its own A): {d.reason}"


def store_plan(second: Node, adds: list[Node], spec: DeviceSpec) -> tuple[bool, str]:
    """Whether the ``adds`` after the ``second`` MatMul (a bias ``Add``, then a residual
    ``Add``, or one of them; :func:`geode.compiler.fusion.epilogue.store_adds`) pay as
    part of that GEMM's store, and why, by the SOL model: apart, the GEMM writes its
    product, the ``Add`` kernel (a launch) reads it and their other inputs and writes the
    result; fused, the panel reads those inputs and writes the result."""
    o, out = second.outputs[0], adds[-1].outputs[0]
    mids = {id(o)} | {id(a.outputs[0]) for a in adds}
    others = [x for a in adds for x in a.inputs if id(x) not in mids]
    read = sum(nbytes(x) for x in others)
    flops = numel(out) * len(adds)
    store = KernelWork(bytes_read=0.0, bytes_written=nbytes(o), flops=0.0, n_kernels=0)
    alone = KernelWork(bytes_read=nbytes(o) + read, bytes_written=nbytes(out), flops=flops)
    fused = KernelWork(bytes_read=read, bytes_written=nbytes(out), flops=flops, n_kernels=0)
    d = decide_merge([store, alone], fused, spec)
    names = " and ".join(a.name for a in adds)
    return d.take, f"{names} summed into {second.name}'s panels: {d.reason}"


def transpose_plan(transpose: Node, dense: Node, spec: DeviceSpec) -> tuple[bool, str]:
    """Whether the GEMM of ``dense`` reading ``transpose``'s input in place (its ``A``
    transposed) pays, and why, by the SOL model: apart, the Transpose's kernel (a launch)
    reads ``X`` and writes ``X^T``, which the GEMM reads; in place, the GEMM reads ``X``
    (its row tiles walk ``X``'s columns: each step along ``K`` reads a few contiguous
    values of one row of ``X``, the same bytes)."""
    x, a = transpose.inputs[0], transpose.outputs[0]
    copy = KernelWork(bytes_read=nbytes(x), bytes_written=nbytes(a), flops=0.0)
    read = KernelWork(bytes_read=nbytes(a), bytes_written=0.0, flops=0.0, n_kernels=0)
    fused = KernelWork(bytes_read=nbytes(x), bytes_written=0.0, flops=0.0, n_kernels=0)
    d = decide_merge([copy, read], fused, spec)
    return d.take, f"{transpose.name} read in place by {dense.name} (A transposed): {d.reason}"


def row_scale_plan(
    h: Value,
    gemms: list[Node],
    n_muls: int,
    spec: DeviceSpec,
    fused_readers: object,
    x_computed: bool = False,
) -> tuple[bool, str]:
    """Whether folding the row scale that computes ``h`` (``n_muls`` Mul nodes) into the
    ``gemms`` reading it pays, and why, by the SOL model
    (:mod:`geode.compiler.fusion.row_scale`): apart, the norm's kernel writes ``h`` (its
    multiplies over ``h``); folded, it writes a value per row, and each product is
    multiplied by it, inside its readers' kernel when ``fused_readers(gemm)`` says they
    are all elementwise (a fused epilogue), else in a pass of its own over the product.
    The GEMMs read ``x`` instead of ``h``: the same bytes; ``x_computed``: ``x`` is an
    elementwise result the norm's kernel would compute and now has to write (a
    LayerNorm's ``x - mean``), as many bytes as ``h``."""
    rows = numel(h) / max(_last(h), 1.0)
    item = h.dtype.itemsize
    apart = KernelWork(
        bytes_read=0.0, bytes_written=nbytes(h), flops=numel(h) * n_muls, n_kernels=0
    )
    reads = writes = flops = 0.0
    kernels = 0
    for mm in gemms:
        y = mm.outputs[0]
        flops += numel(y)
        if not fused_readers(mm):  # type: ignore[operator]
            reads += nbytes(y)
            writes += nbytes(y)
            kernels += 1
    fused = KernelWork(
        bytes_read=reads + rows * item * len(gemms),
        bytes_written=writes + rows * item + (nbytes(h) if x_computed else 0.0),
        flops=flops,
        n_kernels=kernels,
    )
    d = decide_merge([apart], fused, spec)
    return d.take, d.reason.replace("recompute expanding", "the products' scale expanding")


def prologue_plan(dense: Node, scale: Value, spec: DeviceSpec) -> tuple[bool, str]:
    """Whether the RMSNorm scale per row of ``dense``'s ``A`` (``scale``, read by the
    epilogue) pays computed in the kernel from each panel's rows of ``A``, and why, by the
    SOL model: apart, the norm's kernel (a launch) reads ``A`` and writes the scale, and
    the epilogue reads it back; in the kernel, the panel's rows are in cache for the GEMM
    (no traffic) and the same sums of squares are done there.

    Two costs the traffic alone misses (measured, ``docs/performance.md``, "The RMSNorm
    prologue's fixed cost"): the prologue costs the dense step about a kernel call per
    call however few rows it computes (the same with one row as with 32), and when ``A``
    and the scale fit in L2 (:func:`resident`) the norm's kernel apart moves them in
    cache, not through memory. So the prologue pays only where it saves memory traffic:
    a large ``A`` (or one of symbolic rows, costed at the nominal size)."""
    a = dense.inputs[0]
    flops = 2.0 * numel(a) + 4.0 * numel(scale)
    cached = resident([a, scale], spec)
    a_bytes, s_bytes = (0.0, 0.0) if cached else (nbytes(a), nbytes(scale))
    alone = KernelWork(bytes_read=a_bytes, bytes_written=s_bytes, flops=flops)
    readback = KernelWork(bytes_read=s_bytes, bytes_written=0.0, flops=0.0, n_kernels=0)
    fused = KernelWork(bytes_read=0.0, bytes_written=0.0, flops=flops, n_kernels=1)
    d = decide_merge([alone, readback], fused, spec)
    where = f"{a.name} and the scale in L2, " if cached else ""
    return d.take, (
        f"the RMSNorm scale {scale.name} from {dense.name}'s A per panel: {where}{d.reason}"
    )


def resident(values: list[Value], spec: DeviceSpec) -> bool:
    """Whether ``values`` (at the nominal size when their dims are symbolic) fit in
    ``spec``'s L2 together: read or written there, they cost no memory traffic."""
    return sum(nbytes(v) for v in values) <= spec.l2_bytes


def head_view_plan(
    copies: list[Value], kernels: int, spec: DeviceSpec, gathered: list[Value] | None = None
) -> tuple[bool, str]:
    """Whether a dense op reading its operands (writing its result) in place as heads of
    wider arrays pays, and why, by the SOL model: apart, each of ``copies`` is a layout
    copy (read and written once) and ``kernels`` copy kernels run; in place, the GEMMs
    read (write) the same elements where they are (the BLAS packs every operand block it
    multiplies, strided or not), but a transposed operand (``gathered``: K read through
    transB) is gathered while packed: costed as one more read of it (measured: QK^T with
    K in place 3-10% slower than from a copy, ``docs/performance.md``)."""
    apart = [
        KernelWork(bytes_read=nbytes(v), bytes_written=nbytes(v), flops=0.0, n_kernels=0)
        for v in copies
    ]
    apart.append(KernelWork(bytes_read=0.0, bytes_written=0.0, flops=0.0, n_kernels=kernels))
    gather = sum(nbytes(v) for v in gathered or [])
    fused = KernelWork(bytes_read=gather, bytes_written=0.0, flops=0.0, n_kernels=0)
    d = decide_merge(apart, fused, spec)
    return d.take, d.reason


#: causal attention's panel height (query rows): a panel computes the key columns its last
#: row sees, so smaller panels skip more of the masked triangle but run smaller GEMMs
#: (measured on GPT-2 large: ``docs/performance.md``, "Causal attention")
CAUSAL_ROWS = 64


def causal_plan(dense: Node, offset: int) -> tuple[bool, str]:
    """Whether causal panels of :data:`CAUSAL_ROWS` query rows pay for ``dense``'s
    attention (a mask proven causal with ``offset``), and why: they do when there is more
    than one panel (the rows, nominal when symbolic, above the panel height), each panel
    computing the scores, the softmax and ``P @ V`` over the key columns its last row
    sees instead of all of them (the panel's mask built by the kernel)."""
    y = dense.outputs[0]
    rows, cols = int(_dim(y, -2)), int(_last(y))
    if rows <= CAUSAL_ROWS:
        return False, f"{rows} query rows: one panel sees every key column"
    seen = 0
    for p0 in range(0, rows, CAUSAL_ROWS):
        height = min(CAUSAL_ROWS, rows - p0)
        seen += height * min(cols, p0 + height - 1 + offset)
    frac = seen / max(rows * cols, 1)
    return True, (
        f"panels of {CAUSAL_ROWS} query rows compute {frac:.0%} of the scores and of P @ V"
    )


#: the key-tiled (online-softmax) attention's panels of query rows and blocks of key
#: columns (fewer rows when there are few panels: ``attention_tiled.online_rows``): a
#: block's scores 1 MiB at float32; measured at S = 256 to 8192, 4 heads of 64 (``docs/
#: performance.md``): 128 x 1024 and 256 x 512 0.86-0.91 of 64 x 256's time, 256 x 1024
#: 0.97-0.98 of 128 x 1024's, 128 x 2048 1.2x slower than 64 x 256
ONLINE_ROWS = 256
ONLINE_KEYS = 1024
#: the row-panel path's scores (and the softmax's result beside them) fit while a panel's
#: rows of scores take at most this share of a core's L2
ONLINE_L2_SHARE = 0.5


def online_plan(dense: Node, second: Node, spec: DeviceSpec) -> tuple[bool, str]:
    """Whether attention with a key-tiled softmax pays for ``dense`` (its scores, the
    ``second`` MatMul ``P @ V``), and why: it does when the row-panel path's panel
    (:func:`epilogue_plan`'s rows, all the query rows when the weights are too large to
    re-pack per panel) holds more scores than :data:`ONLINE_L2_SHARE` of one core's L2:
    each panel's scores, and the softmax's result beside them, then go to memory and back,
    where the key-tiled form keeps a block of :data:`ONLINE_ROWS` x :data:`ONLINE_KEYS`
    scores in cache. A symbolic key length does not take it here: short rows pay the
    key-tiled form's extra passes (BERT at 32 and 256 keys: 1.02-1.03x;
    ``docs/performance.md``); its entry holds both bodies and chooses per call by the same
    rule (:func:`online_switch_keys`)."""
    y = dense.outputs[0]
    if not isinstance((y.shape or (0,))[-1], int):
        return False, "the key length is symbolic (the key-tiled form pays on long rows only)"
    item = y.dtype.itemsize
    rows, _ = epilogue_plan(dense, spec, second)
    keys = int(_last(y))
    score_bytes = rows * keys * item
    limit = int(spec.l2_bytes * ONLINE_L2_SHARE)
    what = (
        f"a panel of {rows} query rows x {keys} keys holds {score_bytes / 2**10:.0f} KiB of scores"
    )
    if score_bytes <= limit:
        return False, f"{what}, within {limit // 2**10} KiB of the core's L2"
    block = ONLINE_ROWS * ONLINE_KEYS * item
    return True, (
        f"{what}, past {limit // 2**10} KiB of the core's L2: blocks of {ONLINE_ROWS} x "
        f"{ONLINE_KEYS} ({block // 2**10} KiB) instead"
    )


def online_limit(spec: DeviceSpec) -> int:
    """Bytes of a row-panel path's panel of scores past which the key-tiled form pays
    (:data:`ONLINE_L2_SHARE` of one core's L2; the dense entry's per-call rule)."""
    return int(spec.l2_bytes * ONLINE_L2_SHARE)


def _row_panel_rows(m: int, n: int, depth: int, item: int, spec: DeviceSpec) -> int:
    """The row-panel path's rows per panel for ``m`` query rows and ``n`` keys (``depth``:
    ``K + D``): the entry's rule (``backends/llvm/dense.py: _panel_rows``)."""
    pb = panel_bytes(spec)
    if n == 0 or depth * n * item > pb:
        return max(1, m)
    return max(1, min(max(DENSE_MIN_ROWS, pb // (n * item)), m))


def online_switch_keys(dense: Node, second: Node, spec: DeviceSpec) -> tuple[int, str]:
    """With a symbolic key length: the fewest keys from which the dense entry takes the
    key-tiled body per call (the row-panel path's panel of scores past
    :func:`online_limit`; query rows as many as keys unless fixed), and its text."""
    y = dense.outputs[0]
    item = y.dtype.itemsize
    fixed_m = (y.shape or (0, 0))[-2]
    depth = int(_dim(dense.inputs[1], -2) + _last(second.inputs[1]))
    limit = online_limit(spec)
    keys = 1
    while keys < 1 << 20:
        m = fixed_m if isinstance(fixed_m, int) else keys
        if _row_panel_rows(m, keys, depth, item, spec) * keys * item > limit:
            break
        keys += 1
    rows = f"{fixed_m} query rows" if isinstance(fixed_m, int) else "as many query rows as keys"
    return keys, (
        f"chosen per call: row panels below {keys} keys, key-tiled from {keys} (with {rows}, "
        f"a row panel's scores past {limit // 2**10} KiB of the core's L2)"
    )
