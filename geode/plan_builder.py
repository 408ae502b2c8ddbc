"""Turns a compiled graph and its units of work into a runtime :class:`Plan`.

A *unit* is one step of the plan: a fused group compiled to a native kernel, or a
single node on a fallback engine. This module gives every value a slot, registers
constants and variables with the session's VarManager, compiles symbolic shapes to
plain functions, and builds the activation memory plan (liveness-based reuse).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from geode.compiler import dtypes
from geode.compiler.ir import Graph, Node, Value, ValueKind
from geode.compiler.ops import registry
from geode.compiler.shapes import compile_dim_fn, compile_shape_fn, free_symbols, shape_str
from geode.runtime.engines import ENGINES
from geode.runtime.memory import BufferRequest, MemoryPlan
from geode.runtime.model import KernelInfo
from geode.runtime.plan import Constraint, DimCheck, InputSpec, Plan, Slot, Step, StepFn
from geode.runtime.var_manager import VarManager


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


#: ops that must run even when nothing reads their outputs
SIDE_EFFECTS = frozenset({"Assign", "Print"})


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
    """Give every unit its step: its engine's binding of its kernel."""
    for u in units:
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


def build_plan(graph: Graph, units: list[Unit], vm: VarManager, key_prefix: str) -> Plan:
    """Build the runtime plan for ``units`` (already in a valid execution order)."""
    slots: list[Slot] = []
    slot_of: dict[int, int] = {}
    input_symbols: set = set()
    for v in graph.inputs:
        input_symbols |= free_symbols(v.shape)
    input_names = {s.name for s in input_symbols}

    def slot_for(v: Value) -> int:
        if id(v) in slot_of:
            return slot_of[id(v)]
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
        slots.append(
            Slot(
                v.name,
                v.dtype,
                role,
                shape_fn,
                key,
                binds,
                f"{dtypes.name(v.dtype)}{shape_str(v.shape)}",
            )
        )
        slot_of[id(v)] = len(slots) - 1
        return slot_of[id(v)]

    bound_first: dict[str, str] = {}
    specs = [_input_spec(v, slot_for(v), bound_first) for v in graph.inputs]
    steps: list[Step] = []
    for u in units:
        ins = [None if v is None else slot_for(v) for v in u.inputs]
        outs = [slot_for(v) for v in u.outputs]
        fn = u.step if u.step is not None else ENGINES[u.engine].bind(u.name, u.kernel)
        label = "+".join(n.op_type for n in u.nodes) if len(u.nodes) <= 6 else f"{len(u.nodes)} ops"
        steps.append(Step(u.name, u.engine, fn, ins, outs, label, dict(u.extra)))
    outputs = [(v.name, slot_for(v)) for v in graph.outputs]
    memory, arena = _memory_plan(slots, steps, {s for _, s in outputs})
    release = _release_lists(slots, steps, arena, {s for _, s in outputs})
    constraints = []
    for a, b, where in graph.symbols.constraints:
        syms = frozenset(s.name for s in free_symbols((a, b)))
        if syms <= input_names:
            constraints.append(
                Constraint(compile_dim_fn(a), compile_dim_fn(b), syms, f"{a} == {b} ({where})")
            )
    memo = _binding_steps(units, steps, slots)
    steps, release, memo = _chain_native_runs(units, steps, release, memo)
    return Plan(graph.name, specs, outputs, slots, steps, constraints, memory, arena, release, memo)


def _chain_native_runs(
    units: list[Unit], steps: list[Step], release: list[list[int]], memo: frozenset[int]
) -> tuple[list[Step], list[list[int]], frozenset[int]]:
    """Replace every run of two or more consecutive chainable AI Core steps (not memoized)
    by one chain step (:mod:`geode.runtime.chains`); the memory plan was made for the
    unchained steps and stays valid, release lists and memo indices are carried over."""
    from geode.runtime.chains import MAX_CHAIN, chain_step, chainable

    def ok(k: int) -> bool:
        return units[k].engine == "aicore" and k not in memo and chainable(units[k].kernel)

    new_steps: list[Step] = []
    new_release: list[list[int]] = []
    new_memo: set[int] = set()
    k = 0
    while k < len(steps):
        end = k
        while end < len(steps) and ok(end) and end - k < MAX_CHAIN:
            end += 1
        if end - k >= 2:
            new_steps.append(chain_step(steps[k:end], [units[j].kernel for j in range(k, end)]))
            new_release.append([s for j in range(k, end) for s in release[j]])
            k = end
            continue
        if k in memo:
            new_memo.add(len(new_steps))
        new_steps.append(steps[k])
        new_release.append(release[k])
        k += 1
    return new_steps, new_release, frozenset(new_memo)


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
        "If",
        "Loop",
        "Scan",
    }
)
#: ops whose result depends only on their input's shape, not its values
SHAPE_OPS = frozenset({"Shape", "Size"})


def _binding_steps(units: list[Unit], steps: list[Step], slots: list[Slot]) -> frozenset[int]:
    """The steps whose outputs are a function of the symbol binding alone (Plan.memo_steps):
    every input is a constant, the output of such a step, or, for a lone ``Shape``/
    ``Size`` node, a value whose shape the binding determines; no op is impure."""
    known = {i for i, s in enumerate(slots) if s.role == "constant"}
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
    return frozenset(memo)


def _variable_key(vm: VarManager, v: Value) -> Any:
    from geode.runtime.var_manager import VarKey, VarManagerError

    key = VarKey(v.name, v.desc.format, str(v.dtype))
    if key in vm and v.data is None:
        return key
    # registering again checks that the initial value, shape and dtype agree with the
    # session's variable of that name (then the graphs share it), or raises
    try:
        return vm.register_variable(v.name, v.data, v.desc.format)
    except VarManagerError as exc:
        raise VarManagerError(
            f"{exc}; variables of one session are shared by name: give this graph's "
            "variable another name, or compile it in its own geode.Session"
        ) from exc


def _memory_plan(
    slots: list[Slot], steps: list[Step], outputs: set[int]
) -> tuple[MemoryPlan, frozenset[int]]:
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for k, st in enumerate(steps):
        for o in st.outputs:
            first.setdefault(o, k)
            last[o] = max(last.get(o, k), k)
        for i in st.inputs:
            if i is not None and i in first:
                last[i] = k
    requests = []
    for s, k in first.items():
        slot = slots[s]
        if s in outputs or slot.role != "activation" or slot.shape is None:
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
    return MemoryPlan(requests), frozenset(r.slot for r in requests)


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
