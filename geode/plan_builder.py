"""Turns a compiled graph and its units of work into a runtime :class:`Plan`.

A *unit* is one step of the plan: a fused group compiled to a native kernel, or a
single node on a fallback engine, or a view node run as an *alias* (engine ``alias``:
no step, see :func:`alias_unit`), or a variable's write at the end of the run (engine
``commit``: no step, a :class:`~geode.runtime.plan.Commit`, see :func:`commit_unit`). This module gives every value a slot, registers
constants and variables with the session's VarManager, compiles symbolic shapes to
plain functions, and builds the activation memory plan (liveness-based reuse): an alias
gets no buffer, and its root's buffer stays live until the alias's last use.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from geode.compiler import dtypes
from geode.compiler.fusion.views import ViewSpec
from geode.compiler.ir import Graph, Node, Value, ValueKind
from geode.compiler.ops import registry
from geode.compiler.ops.state import SIDE_EFFECT_OPS
from geode.compiler.shapes import compile_dim_fn, compile_shape_fn, free_symbols, shape_str
from geode.errors import ExecutionError
from geode.runtime.engines import ENGINES
from geode.runtime.memory import BufferRequest, MemoryPlan
from geode.runtime.model import KernelInfo
from geode.runtime.plan import (
    Alias,
    BroadcastConstraint,
    Commit,
    Constraint,
    DimCheck,
    Env,
    InputSpec,
    Plan,
    ShapeFn,
    Slot,
    Step,
    StepFn,
)
from geode.runtime.var_manager import VarKey, VarManager, VarManagerError


@dataclass
class Unit:
    """One step to be: its engine, the nodes it covers, its kernel, its boundary values."""

    name: str
    engine: str
    nodes: list[Node]
    inputs: list[Value | None]
    outputs: list[Value]
    kernel: Any  # a reference kernel, or a NativeKernel on the aicore engine
    info: KernelInfo
    extra: dict[str, Any] = field(default_factory=dict)
    step: StepFn | None = None  # the engine's step for ``kernel`` (see bind_units)


def reference_unit(node: Node, engine: str) -> Unit:
    """A unit that runs one node's reference kernel (AICPU or host engine)."""
    od = registry.get(node.op_type, node.domain, node.where)
    attrs = od.full_attrs(node.attrs)
    kernel_fn = od.kernel
    n_out = len(node.outputs)
    out_dtypes = [o.dtype for o in node.outputs]

    def kernel(inputs: list) -> list:
        res = kernel_fn(inputs, attrs)
        outs = []
        for i in range(n_out):
            r = res[i]
            if r.dtype != out_dtypes[i]:
                r = r.astype(out_dtypes[i])
            outs.append(r)
        return outs

    info = KernelInfo(name=node.name, ops=[node], engine=engine)
    return Unit(node.name, engine, [node], list(node.inputs), list(node.outputs), kernel, info)


#: the engine name of units that are aliases (views): no step, no buffer
ALIAS = "alias"


def alias_unit(node: Node, spec: ViewSpec) -> Unit:
    """A unit for a view node that runs as an alias of its input (``spec``: how it
    views it); it has no kernel and becomes no step."""
    info = KernelInfo(name=node.name, ops=[node], engine=ALIAS, kind="view")
    unit = Unit(node.name, ALIAS, [node], [node.inputs[0]], list(node.outputs), spec, info)
    unit.extra["view"] = spec.describe()
    return unit


#: the engine name of units that write a variable when the run ends: no step
COMMIT = "commit"

#: the engines whose units are not steps
NO_STEP = frozenset({ALIAS, COMMIT})


def commit_unit(node: Node) -> Unit:
    """A unit for a ``VarRef`` node (see ``compiler/passes/variable_prepare.py``): its
    value is written into its variable once the run's steps have run; no step."""
    var = node.inputs[0]
    info = KernelInfo(name=node.name, ops=[node], engine=COMMIT, kind="commit")
    unit = Unit(node.name, COMMIT, [node], [node.inputs[1]], [], None, info)
    unit.extra["variable"] = var.name
    return unit


def var_query_unit(node: Node, vm: VarManager) -> Unit:
    """A host unit for a ``VarIsInitialized`` the graph passes could not answer: its step
    asks the session's VarManager, reading nothing of the variable's data."""
    var = node.inputs[0]
    key = _variable_key(vm, var) if var.kind is ValueKind.VARIABLE else None

    def kernel(inputs: list) -> list[np.ndarray]:
        # a value that is not a variable (a write's result) exists: it is initialized
        return [np.array(key is None or vm.is_initialized(key))]

    info = KernelInfo(name=node.name, ops=[node], engine="host")
    return Unit(node.name, "host", [node], [], list(node.outputs), kernel, info)


#: ops that must run even when nothing reads their outputs
SIDE_EFFECTS = SIDE_EFFECT_OPS | {"Print"}


def drop_dead_units(units: list[Unit], g: Graph) -> list[Unit]:
    """Remove units whose results nothing reads any more (e.g. a Shape feeding an Expand
    that was fused: the kernel knows the shape, so the host step is dead)."""
    needed = {id(v) for v in g.outputs}
    kept: list[Unit] = []
    for u in reversed(units):
        if any(id(v) in needed for v in u.outputs) or any(
            n.op_type in SIDE_EFFECTS for n in u.nodes
        ):
            kept.append(u)
            needed |= {id(v) for v in u.inputs if v is not None}
    return list(reversed(kept))


def bind_units(units: list[Unit]) -> None:
    """Give every unit its step: its engine's binding of its kernel (aliases and commits
    have none)."""
    for u in units:
        if u.engine not in NO_STEP:
            u.step = ENGINES[u.engine].bind(u.name, u.kernel)


def _input_spec(v: Value, slot: int, bound_first: dict[str, str]) -> InputSpec:
    if v.shape is None:
        return InputSpec(v.name, slot, v.dtype, None)
    dims: list[int | str | None] = []
    checks: list[DimCheck] = []
    for axis, d in enumerate(v.shape):
        if isinstance(d, int):
            dims.append(d)
        elif d.is_Symbol:
            dims.append(d.name)
            bound_first.setdefault(d.name, v.name)
        else:
            dims.append(None)
            checks.append(DimCheck(axis, compile_dim_fn(d), str(d)))
    text = tuple(str(d) for d in v.shape)
    return InputSpec(v.name, slot, v.dtype, tuple(dims), text, tuple(checks))


def build_plan(
    graph: Graph,
    units: list[Unit],
    vm: VarManager,
    key_prefix: str,
    chain_entries: Any = None,
) -> Plan:
    """Build the runtime plan for ``units`` (already in a valid execution order). Every
    constant and variable it registers in ``vm`` is held once per slot (the session
    releases the holds when the model dies: :func:`held_keys`); on failure the holds
    taken so far are released. ``chain_entries``: what gives each chain of native steps
    its own native entry (a :class:`geode.codegen.backends.llvm.chain.ChainBuilder`;
    None: chains loop over their members)."""
    held: list = []
    try:
        return _build_plan(graph, units, vm, key_prefix, held, chain_entries)
    except BaseException:
        vm.release_keys(held)
        raise


def held_keys(plan: Plan) -> list:
    """The VarManager keys ``plan`` holds, one per slot (see :func:`build_plan`)."""
    return [s.var_key for s in plan.slots if s.var_key is not None]


def _build_plan(
    graph: Graph,
    units: list[Unit],
    vm: VarManager,
    key_prefix: str,
    held: list,
    chain_entries: Any = None,
) -> Plan:
    slots: list[Slot] = []
    slot_of: dict[int, int] = {}
    input_symbols: set = set()
    for v in graph.inputs:
        input_symbols |= free_symbols(v.shape)
    input_names = {s.name for s in input_symbols}

    def slot_for(v: Value) -> int:
        if id(v) not in slot_of:
            slots.append(_slot(v, input_names, vm, key_prefix))
            if slots[-1].var_key is not None:
                held.append(slots[-1].var_key)
            slot_of[id(v)] = len(slots) - 1
        return slot_of[id(v)]

    bound_first: dict[str, str] = {}
    specs = [_input_spec(v, slot_for(v), bound_first) for v in graph.inputs]
    steps: list[Step] = []
    aliases: dict[int, Alias] = {}
    commits: list[Commit] = []
    step_units = [u for u in units if u.engine not in NO_STEP]
    for u in units:
        if u.engine == COMMIT:
            var = u.nodes[0].inputs[0]
            text = f"{u.name}: {u.inputs[0].name!r} into variable {var.name!r}"
            commits.append(Commit(slot_for(u.inputs[0]), _variable_key(vm, var), text))
            continue
        if u.engine == ALIAS:
            alias = _alias(u, slot_for(u.inputs[0]), slot_for(u.outputs[0]), slots, aliases)
            aliases[alias.slot] = alias
            continue
        ins = [None if v is None else slot_for(v) for v in u.inputs]
        outs = [slot_for(v) for v in u.outputs]
        fn = u.step if u.step is not None else ENGINES[u.engine].bind(u.name, u.kernel)
        label = "+".join(n.op_type for n in u.nodes) if len(u.nodes) <= 6 else f"{len(u.nodes)} ops"
        steps.append(Step(u.name, u.engine, fn, ins, outs, label, dict(u.extra)))
    outputs = [(v.name, slot_for(v)) for v in graph.outputs]
    out_slots = {s for _, s in outputs}
    kept = out_slots | {c.slot for c in commits}  # live to the end of the run
    memory, arena = _memory_plan(slots, steps, kept, aliases)
    release = _release_lists(slots, steps, arena, kept)
    constraints, late = _constraints(graph, input_names)
    broadcasts = _broadcast_constraints(graph, input_names)
    memo = _binding_steps(step_units, steps, slots, aliases)
    text = describe_memory(slots, steps, memory, aliases, out_slots)
    steps, release, memo = _chain_native_runs(
        step_units, steps, release, memo, aliases, chain_entries
    )
    start, after = _alias_schedule(steps, aliases)
    late += _broadcast_constraints(graph, input_names, late=True)
    checks_after = _late_check_schedule(late, steps, slots, input_names)
    return Plan(
        graph.name,
        specs,
        outputs,
        slots,
        steps,
        constraints,
        memory,
        arena,
        release,
        memo,
        aliases,
        start,
        after,
        text,
        commits,
        broadcasts,
        checks_after=checks_after,
    )


def _constraints(graph: Graph, input_names: set[str]) -> tuple[list[Constraint], list[Constraint]]:
    """The graph's equality constraints: those over symbols the inputs bind (checked
    before the run), and those over symbols a step binds (checked after it)."""
    early: list[Constraint] = []
    late: list[Constraint] = []
    for a, b, where in graph.symbols.constraints:
        syms = frozenset(s.name for s in free_symbols((a, b)))
        c = Constraint(compile_dim_fn(a), compile_dim_fn(b), syms, f"{a} == {b} ({where})")
        (early if syms <= input_names else late).append(c)
    return early, late


def _broadcast_constraints(
    graph: Graph, input_names: set[str], late: bool = False
) -> list[BroadcastConstraint]:
    """The graph's recorded symbolic broadcasts (``SymbolTable.broadcasts``) whose dims the
    inputs bind, for the executor to check before the run; with ``late``, the others:
    those over symbols a step binds (a NonZero's count), checked once it has run."""
    out = []
    for dims, where in graph.symbols.broadcasts:
        syms = frozenset(s.name for s in free_symbols(dims))
        if (syms <= input_names) != late:
            fns = tuple((compile_dim_fn(d), str(d)) for d in dims)
            out.append(BroadcastConstraint(fns, syms, where))
    return out


def _late_check_schedule(
    checks: list[Constraint | BroadcastConstraint],
    steps: list[Step],
    slots: list[Slot],
    input_names: set[str],
) -> list[list[Constraint | BroadcastConstraint]]:
    """Per step, the checks whose last symbol it binds (``Slot.binds`` of its outputs):
    the executor runs them right after the step, before any later kernel reads dims that
    rely on them. A check over a symbol no step binds is dropped (nothing can be wrong
    before it is bound, and nothing that reads it runs)."""
    after: list[list[Constraint | BroadcastConstraint]] = [[] for _ in steps]
    if not checks:
        return after
    bound = set(input_names)
    pending = list(checks)
    for k, st in enumerate(steps):
        bound.update(name for o in st.outputs for _, name in slots[o].binds)
        ready = [c for c in pending if c.symbols <= bound]
        after[k] = ready
        pending = [c for c in pending if c not in ready]
    return after


def _slot(v: Value, input_names: set[str], vm: VarManager, key_prefix: str) -> Slot:
    """The slot of value ``v``: its role, shape function, VarManager key and bindings."""
    shape_fn = None
    if v.shape is not None and {s.name for s in free_symbols(v.shape)} <= input_names:
        shape_fn = compile_shape_fn(v.shape)
    role = {
        ValueKind.INPUT: "input",
        ValueKind.CONSTANT: "constant",
        ValueKind.VARIABLE: "variable",
        ValueKind.INTERMEDIATE: "activation",
    }[v.kind]
    key = None
    if v.kind is ValueKind.CONSTANT and getattr(v, "external_loader", None) is not None:
        path, offset, _ = v.external
        key = vm.register_file_constant(
            f"{key_prefix}/{v.name}",
            v.external_loader,
            v.dtype,
            tuple(v.shape),
            v.desc.format,
            source=(path, offset),
        )
    elif v.kind is ValueKind.CONSTANT:
        key = vm.register_constant(f"{key_prefix}/{v.name}", v.data)
    elif v.kind is ValueKind.VARIABLE:
        key = _variable_key(vm, v)
    binds: tuple[tuple[int, str], ...] = ()
    if role == "activation" and v.shape is not None and shape_fn is None:
        binds = tuple(
            (a, d.name) for a, d in enumerate(v.shape) if not isinstance(d, int) and d.is_Symbol
        )
    return Slot(
        v.name, v.dtype, role, shape_fn, key, binds, f"{dtypes.name(v.dtype)}{shape_str(v.shape)}"
    )


View = Callable[[np.ndarray, Env], np.ndarray]


def _alias(u: Unit, source: int, slot: int, slots: list[Slot], aliases: dict[int, Alias]) -> Alias:
    """The alias record of view unit ``u`` (``slot`` views ``source``): its view reads
    the root's array, composed with the source's own view when the source is an alias
    too (a reshape of a reshape is one reshape)."""
    shape_fn = slots[slot].shape
    if shape_fn is None:  # alias_view admits only shapes known from the binding
        raise ExecutionError(f"view {u.name!r}: its shape is not known before the run")
    own = _view_fn(u.kernel, shape_fn, u.name)
    root, view, reshape = source, own, u.kernel.kind == "reshape"
    parent = aliases.get(source)
    if parent is not None:
        root = parent.root
        if not (reshape and parent.reshape):  # reshapes of a reshape: one reshape
            view = _compose(own, parent.view)
        reshape = reshape and parent.reshape
    op = u.nodes[0].op_type
    text = f"{op} {u.name!r} of {slots[source].name!r} ({u.kernel.describe()})"
    return Alias(slot, source, root, view, text, reshape)


def _view_fn(spec: ViewSpec, shape_fn: ShapeFn, name: str) -> View:
    """``array, env -> view``: a reshape to the slot's shape, or a contiguous slice."""
    if spec.kind == "reshape":
        try:
            static = shape_fn({})
        except KeyError:  # the shape depends on the binding
            static = None
        if static is not None:
            return lambda a, env: a.reshape(static)

        def reshaped(a: np.ndarray, env: Env) -> np.ndarray:
            shape = shape_fn(env)
            if min(shape, default=0) < 0:  # numpy would read a -1 as "whatever fits"
                raise ExecutionError(
                    f"view {name!r} would have shape {list(shape)}: the inputs are too "
                    "small for this op"
                )
            return a.reshape(shape)

        return reshaped
    index = (slice(None),) * spec.axis + (slice(spec.start, spec.end),)

    def sliced(a: np.ndarray, env: Env) -> np.ndarray:
        r = a[index]
        want = shape_fn(env)
        if r.shape != want:
            raise ExecutionError(
                f"view {name!r}: slice gives shape {list(r.shape)}, the plan expects {list(want)}"
            )
        return r

    return sliced


def _compose(outer: View, inner: View) -> View:
    def view(a: np.ndarray, env: Env) -> np.ndarray:
        return outer(inner(a, env), env)

    return view


def _alias_schedule(
    steps: list[Step], aliases: dict[int, Alias]
) -> tuple[list[int], list[list[int]]]:
    """When each alias is made: at the start of a run (its root is an input or a
    constant) or right after the step that produces its root."""
    producer = {o: k for k, st in enumerate(steps) for o in st.outputs}
    start: list[int] = []
    after: list[list[int]] = [[] for _ in steps]
    for slot, alias in aliases.items():
        k = producer.get(alias.root)
        if k is None:
            start.append(slot)
        else:
            after[k].append(slot)
    return start, after


def describe_memory(
    slots: list[Slot],
    steps: list[Step],
    memory: MemoryPlan,
    aliases: dict[int, Alias],
    outputs: set[int],
) -> str:
    """The memory plan in words: every arena buffer with the steps it is live between,
    every alias with its root; outputs and their roots get fresh memory per call."""
    lines = [
        f"memory plan: {len(memory.requests)} arena buffers, {len(aliases)} aliases "
        "(views: no buffer, no step)"
    ]
    for r in sorted(memory.requests, key=lambda r: (r.first, r.slot)):
        s = slots[r.slot]
        lines.append(
            f"  {s.name}: {s.shape_text} arena buffer, live {steps[r.first].name} .. "
            f"{steps[r.last].name}"
        )
    arena = {r.slot for r in memory.requests}
    out_roots = {aliases[o].root if o in aliases else o for o in outputs}
    for slot, alias in aliases.items():
        s, root = slots[slot], slots[alias.root]
        if alias.root in arena:
            where = "an arena buffer"
        elif root.role != "activation":
            where = f"a model {root.role}"
        elif alias.root in out_roots:
            where = "a fresh buffer per call: a model output's"
        else:
            where = "its step's own memory"
        lines.append(f"  {s.name}: {s.shape_text} alias of {root.name} ({where}): {alias.text}")
    return "\n".join(lines)


def _chain_native_runs(
    units: list[Unit],
    steps: list[Step],
    release: list[list[int]],
    memo: frozenset[int],
    aliases: dict[int, Alias],
    chain_entries: Any = None,
) -> tuple[list[Step], list[list[int]], frozenset[int]]:
    """Replace every run of two or more consecutive chainable AI Core steps (not memoized)
    by one chain step (:mod:`geode.runtime.chains`); the memory plan was made for the
    unchained steps and stays valid, release lists and memo indices are carried over. A
    chain makes the aliases its members read of what earlier members wrote itself.
    ``chain_entries`` (see :func:`build_plan`): every chain's entry module is started
    first (compiled on the background threads while the others are made)."""
    from geode.runtime.chains import chain_shape

    runs = _chain_runs(units, len(steps), memo)
    if chain_entries is not None:
        for k, end in runs:
            kernels = [units[j].kernel for j in range(k, end)]
            chain_entries.start(chain_shape(steps[k:end], kernels))
    try:
        return _chained(units, steps, release, memo, aliases, runs, chain_entries)
    finally:
        if chain_entries is not None:
            chain_entries.abandon()


def _chained(
    units: list[Unit],
    steps: list[Step],
    release: list[list[int]],
    memo: frozenset[int],
    aliases: dict[int, Alias],
    runs: list[tuple[int, int]],
    chain_entries: Any,
) -> tuple[list[Step], list[list[int]], frozenset[int]]:
    """:func:`_chain_native_runs`'s steps, release lists and memo indices, the chains
    over ``runs``."""
    from geode.runtime.chains import chain_step

    starts = dict(runs)
    new_steps: list[Step] = []
    new_release: list[list[int]] = []
    new_memo: set[int] = set()
    k = 0
    while k < len(steps):
        if k in starts:
            end = starts[k]
            kernels = [units[j].kernel for j in range(k, end)]
            views = {a: (x.root, x.view) for a, x in aliases.items()}
            new_steps.append(chain_step(steps[k:end], kernels, views, chain_entries))
            new_release.append([s for j in range(k, end) for s in release[j]])
            k = end
            continue
        if k in memo:
            new_memo.add(len(new_steps))
        new_steps.append(steps[k])
        new_release.append(release[k])
        k += 1
    return new_steps, new_release, frozenset(new_memo)


def _chain_runs(units: list[Unit], n_steps: int, memo: frozenset[int]) -> list[tuple[int, int]]:
    """The ``(first, end)`` step ranges :func:`_chain_native_runs` makes chains of."""
    from geode.runtime.chains import MAX_CHAIN, chainable, entries_of

    def ok(k: int) -> bool:
        return units[k].engine == "aicore" and k not in memo and chainable(units[k].kernel)

    runs: list[tuple[int, int]] = []
    k = 0
    while k < n_steps:
        end, n_entries = k, 0
        while end < n_steps and ok(end):
            n_entries += entries_of(units[end].kernel)
            if n_entries > MAX_CHAIN:
                break
            end += 1
        if end - k >= 2:
            runs.append((k, end))
            k = end
        else:
            k += 1
    return runs


#: ops whose results are not a function of their inputs (random draws), that act on
#: something else (variables, output), or that run subgraphs: never memoized
IMPURE_OPS = frozenset(
    {
        "RandomNormal",
        "RandomUniform",
        "RandomNormalLike",
        "RandomUniformLike",
        "Bernoulli",
        "Multinomial",
        "Dropout",
        "Assign",
        "AssignAdd",
        "AssignSub",
        "Print",
        "VarIsInitialized",
        "VarRef",
        "If",
        "Loop",
        "Scan",
    }
)
#: ops whose result depends only on their input's shape, not its values
SHAPE_OPS = frozenset({"Shape", "Size"})


def _binding_steps(
    units: list[Unit], steps: list[Step], slots: list[Slot], aliases: dict[int, Alias]
) -> frozenset[int]:
    """The steps whose outputs are a function of the symbol binding alone (Plan.memo_steps):
    every input is a constant, the output of such a step (or a view of one of those),
    or, for a lone ``Shape``/``Size`` node, a value whose shape the binding determines;
    no op is impure."""
    known = {i for i, s in enumerate(slots) if s.role == "constant"}
    known |= {a for a, x in aliases.items() if x.root in known}
    memo: set[int] = set()
    for k, (u, st) in enumerate(zip(units, steps)):
        ops = [n.op_type for n in u.nodes]
        if not ops or any(op in IMPURE_OPS for op in ops):
            continue
        shape_only = len(ops) == 1 and ops[0] in SHAPE_OPS
        ok = all(
            i is None or i in known or (shape_only and slots[i].shape is not None)
            for i in st.inputs
        )
        if ok and st.outputs:
            memo.add(k)
            known.update(st.outputs)
            known |= {a for a, x in aliases.items() if x.root in st.outputs}
    return frozenset(memo)


def _variable_key(vm: VarManager, v: Value) -> VarKey:
    """Register variable ``v`` with the session (declare it when it has no initial value)
    and return its key; registering again checks that the initial value, shape, dtype
    and format agree with the session's variable of that name (then the graphs share
    it), or raises."""
    try:
        if v.data is None:
            return vm.declare_variable(v.name, v.dtype, tuple(v.shape), v.desc.format)
        return vm.register_variable(v.name, v.data, v.desc.format)
    except VarManagerError as exc:
        raise VarManagerError(
            f"{exc}; variables of one session are shared by name: give this graph's "
            "variable another name, or compile it in its own geode.Session"
        ) from exc


def _memory_plan(
    slots: list[Slot], steps: list[Step], outputs: set[int], aliases: dict[int, Alias]
) -> tuple[MemoryPlan, frozenset[int]]:
    """The arena's buffer requests: one per activation a step writes, live from that
    step to the last step that reads it or any alias of it. Model outputs, and roots of
    aliases that are model outputs, get fresh memory per call instead (outputs are
    never arena views); aliases request nothing."""

    def root(s: int) -> int:
        alias = aliases.get(s)
        return s if alias is None else alias.root

    out_roots = {root(o) for o in outputs}
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for k, st in enumerate(steps):
        for o in st.outputs:
            first.setdefault(o, k)
            last[o] = max(last.get(o, k), k)
        for i in st.inputs:
            if i is not None and root(i) in first:
                last[root(i)] = k
    requests = []
    for s, k in first.items():
        slot = slots[s]
        if s in out_roots or slot.role != "activation" or slot.shape is None:
            continue
        if slot.dtype.hasobject:  # strings are Python objects: never in the byte arena
            continue
        if steps[k].engine == "host":
            continue
        shape_fn, itemsize = slot.shape, slot.dtype.itemsize

        def nbytes(env: Any, shape_fn: Any = shape_fn, itemsize: int = itemsize) -> int:
            n = itemsize
            for d in shape_fn(env):
                n *= d
            return n

        requests.append(BufferRequest(s, nbytes, k, last[s]))
    arena = frozenset(r.slot for r in requests)
    in_arena = {a: x.root for a, x in aliases.items() if x.root in arena}
    return MemoryPlan(requests, aliases=in_arena), arena


def _release_lists(
    slots: list[Slot], steps: list[Step], arena: frozenset[int], outputs: set[int]
) -> list[list[int]]:
    last: dict[int, int] = {}
    for k, st in enumerate(steps):
        for i in list(st.inputs) + list(st.outputs):
            if i is not None:
                last[i] = k
    release: list[list[int]] = [[] for _ in steps]
    for s, k in last.items():
        if slots[s].role == "activation" and s not in arena and s not in outputs:
            release[k].append(s)
    return release
