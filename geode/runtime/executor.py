"""The executor: checks inputs, binds symbols, lays out memory and runs a plan's steps;
when they have all run, hands out the outputs and commits the variables the graph
writes (``Plan.commits``)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from geode.errors import (
    ExecutionError,
    GeodeError,
    InputDTypeError,
    InputError,
    InputMemoryError,
    InputShapeError,
    MissingInputError,
    OutOfMemoryError,
    UnexpectedInputError,
)
from geode.runtime import memlimit
from geode.runtime.allocator import OutputPool, lent
from geode.runtime.memory import Arena
from geode.runtime.plan import BroadcastConstraint, Plan
from geode.runtime.var_manager import VarManager


def _dtype_name(d: np.dtype) -> str:
    return "bool" if d == np.bool_ else str(d)


def _contiguous(
    name: str, raw: np.ndarray, dtype: np.dtype | None = None, limit: int = 0
) -> np.ndarray:
    """A C-contiguous copy of a strided feed, of ``dtype`` if given. A broadcast view
    (stride 0) can be far larger than the memory it reads, so the copy's size is checked
    against the memory limit (``limit``: the plan's setting) first:
    :class:`OutOfMemoryError` (an ``InputError`` too) naming the input and the size when
    it would not fit, never a copy that gets the process killed."""
    dt = np.dtype(dtype) if dtype is not None else raw.dtype
    need = memlimit.nbytes(raw.shape, dt.itemsize)
    what = f"input {name!r}: {dt}{list(raw.shape)} is a strided view; its contiguous copy"
    memlimit.check(need, limit, what, error=InputMemoryError)
    try:
        return np.ascontiguousarray(raw, dtype=dtype)
    except MemoryError:
        raise InputMemoryError(
            f"{what} needs {memlimit.format_bytes(need)}, which does not fit in memory"
        ) from None


#: bindings (input shapes) whose prepared step outputs, and whose checked symbol
#: binding, an executor keeps
_PREPARED_BINDINGS = 8


def _remember(cache: dict, key: Any, value: Any) -> None:
    """Store ``value`` under ``key``, first dropping the oldest entry when ``cache``
    already holds :data:`_PREPARED_BINDINGS`."""
    if len(cache) >= _PREPARED_BINDINGS:
        cache.pop(next(iter(cache)))
    cache[key] = value


class _Binding:
    """What a run derives from its input shapes alone, kept per binding (see
    :meth:`Executor._record`): the symbols the inputs bind, the memo key, the memory
    layout, each step's output buffers for the arena buffer of ``generation``, and the
    shape of every alias that only reshapes its root (``view_shapes``: fixed by the
    binding once its slot's shape is)."""

    __slots__ = ("env", "memo_key", "layout", "prepared", "generation", "view_shapes")

    def __init__(self, env: dict[str, int], layout: Any) -> None:
        self.env = env
        self.memo_key = tuple(env.items())
        self.layout = layout
        self.prepared: list[list] | None = None
        self.generation = -1
        self.view_shapes: dict[int, tuple[int, ...]] = {}


def _output_shape(step: str, slot: Any, env: Mapping[str, int]) -> tuple[int, ...]:
    """The shape of a step's output for the bound symbols (ExecutionError when a dim is
    negative: the inputs are too small for the op, e.g. a convolution window larger
    than its input)."""
    shape = slot.shape(env)
    if any(d < 0 for d in shape):
        raise ExecutionError(
            f"step {step!r}: output {slot.name!r} would have shape {list(shape)}: "
            "the inputs are too small for this op"
        )
    return shape


def _masked(a: object) -> bool:
    """Whether ``a`` is a numpy masked array (without importing ``numpy.ma``, 30-50 ms:
    when it is not imported, no masked array exists)."""
    ma = sys.modules.get("numpy.ma")
    return ma is not None and isinstance(a, ma.MaskedArray)


def bind_inputs(
    plan: Plan, feeds: Mapping[str, Any]
) -> tuple[dict[str, int], dict[str, np.ndarray]]:
    """Check feeds against the plan's inputs; returns the symbol binding and the arrays."""
    if not isinstance(feeds, Mapping):
        raise InputError(
            f"model {plan.name!r}: feeds must map input names to arrays, got {type(feeds).__name__}"
        )
    names = [s.name for s in plan.inputs]
    missing = [n for n in names if n not in feeds]
    if missing:
        sigs = ", ".join(s.signature() for s in plan.inputs if s.name in missing)
        raise MissingInputError(f"model {plan.name!r}: missing input(s) {sigs}")
    extra = sorted(set(feeds) - set(names), key=repr)
    if extra:
        raise UnexpectedInputError(
            f"model {plan.name!r}: unexpected input(s) {extra}; inputs are {names}"
        )
    env: dict[str, int] = {}
    where: dict[str, str] = {}
    arrays: dict[str, np.ndarray] = {}
    for spec in plan.inputs:
        raw = feeds[spec.name]
        if type(raw) is not np.ndarray and _masked(raw):
            raise InputError(
                f"input {spec.name!r}: a masked array (its mask would be ignored); "
                "pass .filled(value) or .data"
            )
        if not isinstance(raw, np.ndarray):
            if isinstance(raw, (list, tuple, int, float, bool, np.generic)):
                raw = np.asarray(raw)
            else:
                raise InputError(
                    f"input {spec.name!r}: expected a numpy array, got {type(raw).__name__}"
                )
        if raw.dtype != spec.dtype and raw.dtype.newbyteorder("=") == spec.dtype:
            # byte-swapped: same values
            raw = _contiguous(spec.name, raw, spec.dtype, plan.memory_limit)
        if raw.dtype != spec.dtype:
            raise InputDTypeError(
                f"input {spec.name!r}: dtype {_dtype_name(raw.dtype)}, expected {_dtype_name(spec.dtype)}"
            )
        if spec.dims is not None:
            if raw.ndim != len(spec.dims):
                raise InputShapeError(
                    f"input {spec.name!r}: rank {raw.ndim} (shape {list(raw.shape)}), "
                    f"expected rank {len(spec.dims)} ({spec.signature()})"
                )
            for axis, (d, n) in enumerate(zip(spec.dims, raw.shape)):
                if isinstance(d, int):
                    if d != n:
                        raise InputShapeError(
                            f"input {spec.name!r}: dim {axis} is {n}, expected {d} ({spec.signature()})"
                        )
                elif isinstance(d, str):
                    if d in env and env[d] != n:
                        raise InputShapeError(
                            f"input {spec.name!r}: dim {axis} is {n}, but symbol {d} is already {env[d]} "
                            f"from {where[d]}"
                        )
                    env.setdefault(d, int(n))
                    where.setdefault(d, f"input {spec.name!r} dim {axis}")
        arrays[spec.name] = (
            raw if raw.flags.c_contiguous else _contiguous(spec.name, raw, None, plan.memory_limit)
        )
    for spec in plan.inputs:
        for chk in spec.checks:
            try:
                want = chk.fn(env)
            except (KeyError, NameError):
                continue
            got = arrays[spec.name].shape[chk.axis]
            if want != got:
                raise InputShapeError(
                    f"input {spec.name!r}: dim {chk.axis} is {got}, expected {chk.text} = {want}"
                )
    for c in plan.constraints:
        if c.symbols <= env.keys():
            a, b = c.lhs(env), c.rhs(env)
            if a != b:
                raise InputShapeError(
                    f"model {plan.name!r}: inputs break constraint {c.text} ({a} != {b})"
                )
    for bc in plan.broadcasts:
        if bc.symbols <= env.keys():
            problem = bc.violation(env)
            if problem is not None:
                raise InputShapeError(f"model {plan.name!r}: input {problem}")
    return env, arrays


def _bind_symbols(step: Any, slot: Any, r: np.ndarray, env: dict[str, int]) -> None:
    """Bind the symbols ``slot`` binds (``Slot.binds``) from its array ``r`` into ``env``;
    ExecutionError when one is already bound to another size."""
    for axis, name in slot.binds:
        n = int(r.shape[axis])
        if env.setdefault(name, n) != n:
            raise ExecutionError(
                f"step {step.name!r}: output {slot.name!r} dim {axis} is {n}, "
                f"but symbol {name} is {env[name]}"
            )


def _check_late(model: str, step: str, checks: list, env: Mapping[str, int]) -> None:
    """Check the constraints and broadcasts whose symbols step ``step`` has just bound
    (``Plan.checks_after``): ExecutionError naming the dims and their sizes, before any
    kernel reads them."""
    for c in checks:
        if isinstance(c, BroadcastConstraint):
            problem = c.violation(env)
        else:
            a, b = c.lhs(env), c.rhs(env)
            problem = None if a == b else f"constraint {c.text} is broken ({a} != {b})"
        if problem is not None:
            raise ExecutionError(
                f"model {model!r}: sizes computed at run time: {problem} "
                f"(known after step {step!r})"
            )


class Executor:
    """Runs a plan; owns the activation arena; reads constants/variables from a VarManager."""

    def __init__(self, plan: Plan, var_manager: VarManager):
        self.plan = plan
        self.vm = var_manager
        self.arena = Arena()
        self.pool = OutputPool()
        self._outputs = {slot for _, slot in plan.outputs}
        #: the outputs and the roots of outputs that are aliases, and the values committed
        #: to variables (read when the run ends): fresh memory per call
        self._output_roots = {plan.root(slot) for _, slot in plan.outputs}
        self._output_roots |= {plan.root(c.slot) for c in plan.commits}
        #: per commit: slot, key, and whether its value is a variable's own memory
        self._commits = [
            (c.slot, c.key, plan.slots[plan.root(c.slot)].role == "variable") for c in plan.commits
        ]
        #: per step, the aliases made right after it (a plan built by hand may have none)
        self._alias_after = plan.alias_after or [[] for _ in plan.steps]
        self._static = [
            (i, var_manager.get(s.var_key))
            for i, s in enumerate(plan.slots)
            if s.var_key is not None and s.role == "constant"
        ]
        self._variables = [(i, s.var_key) for i, s in enumerate(plan.slots) if s.role == "variable"]
        #: input shapes that passed :func:`bind_inputs` and the memory check -> what the
        #: run derives from them (see :meth:`_record`)
        self._records: dict[tuple, _Binding] = {}
        #: the same records by binding (feeds that take :func:`bind_inputs` every call)
        self._by_env: dict[tuple, _Binding] = {}
        #: the arena buffer (its generation) the records' prepared buffers are views of
        self._prepared_for = self.arena.generation
        #: the values list a run starts from: the constants in their slots
        self._base: list[Any] = [None] * len(plan.slots)
        for i, arr in self._static:
            self._base[i] = arr
        self._input_slots = [(s.name, s.slot) for s in plan.inputs]
        #: per binding, the results of the plan's memo steps (see run)
        self._memo: dict[tuple, dict[int, np.ndarray]] = {}
        #: what memo steps write: the memo keeps those arrays across runs
        self._memo_outputs = {o for k in plan.memo_steps for o in plan.steps[k].outputs}
        #: per step: its index, the step, whether it is a memo step, its outputs (slot
        #: id, Slot), the checks and aliases after it, and the values it releases
        self._steps = [
            (
                k,
                step,
                k in plan.memo_steps,
                [(o, plan.slots[o]) for o in step.outputs],
                plan.checks_after[k] if plan.checks_after else [],
                self._alias_after[k],
                plan.release[k] if plan.release else [],
            )
            for k, step in enumerate(plan.steps)
        ]
        #: per output: name, slot, and whether it is copied when handed out (see _hand_out)
        self._handout = self._handout_plan()
        #: aliases that only reshape their root to a shape the binding fixes: their
        #: shapes are kept per binding (see _make_aliases)
        self._view_kept = frozenset(
            a for a, x in plan.aliases.items() if x.reshape and plan.slots[a].shape is not None
        )
        #: intermediates a step allocates itself (not in the arena, not an output)
        self._dynamic = [
            i
            for i, s in enumerate(plan.slots)
            if s.role == "activation"
            and i not in plan.arena_slots
            and i not in self._output_roots
            and i not in plan.aliases
        ]

    def _shapes_key(self, feeds: Mapping[str, Any]) -> tuple | None:
        """The input shapes, in the plan's input order, when ``feeds`` is a dict of
        exactly the inputs, each a plain C-contiguous ndarray of its input's dtype (what
        :func:`bind_inputs` passes through unchanged), else None: such feeds with
        shapes that passed before skip the checks, which depend on nothing but those
        shapes (the symbol binding, the inputs' dim checks, the plan's constraints)."""
        specs = self.plan.inputs
        if type(feeds) is not dict or len(feeds) != len(specs):
            return None
        key = []
        for spec in specs:
            raw = feeds.get(spec.name)
            if type(raw) is not np.ndarray or raw.dtype != spec.dtype or not raw.flags.c_contiguous:
                return None
            key.append(raw.shape)
        return tuple(key)

    def _record(self, feeds: Mapping[str, Any]) -> tuple[_Binding, dict[str, np.ndarray]]:
        """The binding of ``feeds`` and the arrays to run on. Feeds that qualify (see
        :meth:`_shapes_key`) with shapes seen before reuse their :class:`_Binding`
        (binding, layout, memory check, prepared buffers); anything else is checked by
        :func:`bind_inputs`, laid out and checked against the memory limit, and the
        result kept when the feeds qualify. Measurements: ``docs/performance.md``."""
        key = self._shapes_key(feeds)
        if key is not None:
            rec = self._records.get(key)
            if rec is not None:
                return rec, feeds  # type: ignore[return-value]
        env, arrays = bind_inputs(self.plan, feeds)
        rec = self._by_env.get(tuple(env.items()))
        if rec is None:
            plan = self.plan
            layout = None
            if plan.memory is not None and plan.arena_slots:
                try:
                    layout = plan.memory.layout(env)
                except (KeyError, NameError):
                    layout = None  # a size depends on a value known only at run time
            self._check_memory(layout, env)
            rec = _Binding(env, layout)
            _remember(self._by_env, rec.memo_key, rec)
        if key is not None:
            _remember(self._records, key, rec)
        return rec, arrays

    def _step_outputs(self, rec: _Binding) -> list[list] | None:
        """Each step's output buffers for the binding ``rec`` (see :meth:`_buffers`),
        built once per binding and arena buffer, then reused: making ~20 views and
        evaluating their shapes was a third of a small model's per-call time. Views
        stay valid while the arena keeps its buffer (its ``generation``; the arena only
        grows, so a binding that fitted it still does); model outputs are never views,
        so nothing handed to the caller is shared between calls. None without a
        layout. The arena is grown here when the binding needs more."""
        layout = rec.layout
        if layout is None:
            return self._unplanned_outputs(rec)
        if rec.generation == self.arena.generation:
            return rec.prepared
        try:
            self.arena.ensure(layout.total)
        except MemoryError:
            raise OutOfMemoryError(
                f"model {self.plan.name!r}: the intermediates of this run need "
                f"{memlimit.format_bytes(layout.total)}, which does not fit in memory"
            ) from None
        if self._prepared_for != self.arena.generation:
            # views of a replaced buffer: drop them all (and with them the buffer)
            for old in (*self._records.values(), *self._by_env.values()):
                old.prepared, old.generation = None, -1
            self._prepared_for = self.arena.generation
        env = rec.env
        rec.prepared = [self._buffers(step, layout, env) for step in self.plan.steps]
        rec.generation = self.arena.generation
        return rec.prepared

    def _unplanned_outputs(self, rec: _Binding) -> list[list] | None:
        """The steps' output buffers of a plan without arena buffers (its only values the
        model's inputs and outputs: a fused LSTM cell), built once per binding like
        :meth:`_step_outputs`' (no arena: they stay valid); None when a plan has arena
        buffers but no layout, or an output's shape needs a symbol bound at run time."""
        if self.plan.arena_slots:
            return None
        if rec.prepared is None and rec.generation != -2:
            try:
                rec.prepared = [self._buffers(step, None, rec.env) for step in self.plan.steps]
            except (KeyError, NameError, GeodeError):
                rec.generation = -2  # not for this binding: each run makes its own
        return rec.prepared

    def _buffers(self, step: Any, layout: Any, env: dict[str, int]) -> list:
        """What each output of ``step`` is written into: an arena view (``layout`` given
        and the output planned in it), ``(shape, dtype)`` for a new array per call (a
        model output of an aicore step, or the root of an output that is an alias of
        it, and whether the pool lends it; see :meth:`_fresh`), or None (the step
        allocates)."""
        outs: list = []
        for o in step.outputs:
            slot = self.plan.slots[o]
            if layout is not None and o in self.plan.arena_slots:
                shape = _output_shape(step.name, slot, env)
                outs.append(self.arena.view(layout.offsets[o], shape, slot.dtype))
            elif o in self._output_roots and step.engine == "aicore" and slot.shape is not None:
                shape = _output_shape(step.name, slot, env)
                pooled = lent(memlimit.nbytes(shape, slot.dtype.itemsize))
                outs.append((shape, slot.dtype, pooled))
            else:
                outs.append(None)
        return outs

    def _fresh(self, bufs: list, ins: list) -> list:
        """The buffers of :meth:`_buffers` as the step gets them: each ``(shape, dtype,
        pooled)`` becomes a new array, when ``pooled`` one the pool lends placed within
        its page away from the step's array inputs and earlier outputs (see
        :data:`geode.runtime.allocator.PAGE`)."""
        outs = list(bufs)  # a new list: the step may not change the prepared one
        for j in [j for j, buf in enumerate(bufs) if type(buf) is tuple]:
            shape, dtype, pooled = bufs[j]
            try:
                if pooled:
                    outs[j] = self.pool.empty(shape, dtype, near=(*ins, *outs[:j]))
                else:  # small: straight from numpy (what the pool would do)
                    outs[j] = np.empty(shape, dtype)
            except MemoryError:
                need = memlimit.nbytes(shape, np.dtype(dtype).itemsize)
                raise OutOfMemoryError(
                    f"model {self.plan.name!r}: an output of {np.dtype(dtype)}"
                    f"{list(shape)} needs {memlimit.format_bytes(need)}, which does "
                    "not fit in memory"
                ) from None
        return outs

    def _describe(self, slot: int, env: dict[str, int]) -> tuple[int, str] | None:
        """``(bytes, "kind 'name' dtype[shape]: size")`` of a slot whose shape the
        binding gives, else None."""
        s = self.plan.slots[slot]
        if s.shape is None:
            return None
        try:
            shape = s.shape(env)
        except (KeyError, NameError, TypeError, ValueError):
            return None
        n = memlimit.nbytes(shape, s.dtype.itemsize)
        kind = "output" if slot in self._output_roots else "intermediate"
        return (
            n,
            f"{kind} {s.name!r} {_dtype_name(s.dtype)}{list(shape)}: {memlimit.format_bytes(n)}",
        )

    def _check_memory(self, layout: Any, env: dict[str, int]) -> None:
        """Raise :class:`OutOfMemoryError` before anything is allocated when the binding
        ``env`` needs more memory than the plan may use (:mod:`~geode.runtime.memlimit`):
        what the arena must grow by, plus every output (each gets memory of its own),
        plus the largest intermediate a step allocates itself (they come and go). Each
        binding is checked once (before its record is kept: :meth:`_record`)."""
        plan = self.plan
        found = []
        need = 0
        if layout is not None:
            need += max(layout.total - self.arena.capacity, 0)
            found += [self._describe(i, env) for i in layout.sizes]
        outputs = [self._describe(slot, env) for _, slot in plan.outputs]
        need += sum(d[0] for d in outputs if d is not None)
        dynamic = [self._describe(i, env) for i in self._dynamic]
        need += max((d[0] for d in dynamic if d is not None), default=0)
        if need >= memlimit.CHECK_MIN_BYTES:
            known = [d for d in (*found, *outputs, *dynamic) if d is not None]
            largest = max(known)[1] if known else ""
            memlimit.check(need, plan.memory_limit, f"model {plan.name!r}: this run", largest)

    def _memo_for(self, key: tuple) -> tuple[dict | None, dict | None]:
        """``(memo, None)``: the memo steps' results for this binding, which the run
        reuses instead of running those steps; ``(None, fresh)`` on the binding's first
        run, which fills ``fresh`` (remembered once the run succeeds); ``(None, None)``
        for a plan without memo steps.

        Memo steps (``Plan.memo_steps``: shape arithmetic, and masks built from shapes
        and constants) give the same results for every run of a binding (measurements:
        ``docs/performance.md``)."""
        if not self.plan.memo_steps:
            return None, None
        memo = self._memo.get(key)
        if memo is not None:
            return memo, None
        return None, {}

    def run(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Run the plan on ``feeds`` (input name -> array); returns output name -> array."""
        plan = self.plan
        rec, arrays = self._record(feeds)
        env = dict(rec.env)  # steps may bind more symbols
        values = self._base.copy()
        for name, slot in self._input_slots:
            values[slot] = arrays[name]
        for i, key in self._variables:
            values[i] = self.vm.get(key)  # looked up per run: assignments replace the array
        if plan.alias_start:
            self._make_aliases(plan.alias_start, values, env, rec.view_shapes)
        prepared = self._step_outputs(rec)
        memo_key = rec.memo_key  # the binding: memo steps' results depend on it alone
        memo, fresh_memo = self._memo_for(memo_key)
        for k, step, is_memo, outs_of, checks, after, release in self._steps:
            if is_memo and memo is not None:
                for o, slot in outs_of:
                    values[o] = memo[o]
                    if slot.binds:
                        _bind_symbols(step, slot, memo[o], env)
                if after:
                    self._make_aliases(after, values, env, rec.view_shapes)
                if checks:
                    _check_late(plan.name, step.name, checks, env)
                continue
            ins = [None if i is None else values[i] for i in step.inputs]
            bufs = prepared[k] if prepared is not None else self._buffers(step, None, env)
            # a new list either way: the step may not change the prepared one
            outs = self._fresh(bufs, ins) if tuple in map(type, bufs) else list(bufs)
            try:
                results = step.fn(ins, outs, env)
            except GeodeError as exc:
                if not str(exc).startswith(f"step {step.name!r}"):
                    exc.add_note(f"in step {step.name!r} ({step.engine}: {step.label})")
                raise
            except MemoryError as exc:
                raise OutOfMemoryError(
                    f"step {step.name!r} ({step.engine}: {step.label}) ran out of memory: {exc}"
                ) from None
            except Exception as exc:
                raise ExecutionError(
                    f"step {step.name!r} ({step.engine}: {step.label}) failed: {type(exc).__name__}: {exc}"
                ) from exc
            for (o, slot), r, given in zip(outs_of, results, outs):
                # a buffer the executor made has the slot's dtype
                if (r is not given or given is None) and r.dtype != slot.dtype:
                    raise ExecutionError(
                        f"step {step.name!r}: output {slot.name!r} is {_dtype_name(r.dtype)}, "
                        f"expected {_dtype_name(slot.dtype)}"
                    )
                if slot.binds:
                    _bind_symbols(step, slot, r, env)
                values[o] = r
                if is_memo and fresh_memo is not None:
                    fresh_memo[o] = np.array(r, copy=True)  # its own: arena memory is reused
            if checks:
                _check_late(plan.name, step.name, checks, env)
            if after:
                self._make_aliases(after, values, env, rec.view_shapes)
            for o in release:
                values[o] = None
        if fresh_memo is not None:
            _remember(self._memo, memo_key, fresh_memo)
        out = self._hand_out(values)
        if self._commits:
            self._commit(values)
        return out

    def _commit(self, values: list[Any]) -> None:
        """Write the run's variable updates into the VarManager, in plan order. A value
        that is a variable's own memory (``Assign(a, b)`` with ``b`` a variable the run
        also writes) is copied first, so every commit writes what the run computed."""
        staged = [
            (key, np.array(values[slot], copy=True) if own else values[slot])
            for slot, key, own in self._commits
        ]
        for key, value in staged:
            self.vm.set_value(key, value)

    def _handout_plan(self) -> list[tuple[str, int, bool]]:
        """Per model output: its name, its slot, and whether it is copied when handed
        out: when its storage (its root's, for an alias) is an input, a constant, a
        variable, the arena, the memo or an earlier output's. All of it is fixed by the
        plan, so it is worked out once."""
        plan = self.plan
        rows = []
        handed: set[int] = set()
        for name, slot in plan.outputs:
            root = plan.root(slot)
            copy = (
                plan.slots[root].role != "activation"
                or root in plan.arena_slots
                or root in self._memo_outputs
                or root in handed
            )
            handed.add(root)
            rows.append((name, slot, copy))
        return rows

    def prepared_bindings(self) -> int:
        """How many bindings hold prepared step buffers (views of the current arena
        buffer; see :meth:`_step_outputs`)."""
        recs = {id(r): r for r in (*self._records.values(), *self._by_env.values())}
        return sum(r.prepared is not None for r in recs.values())

    def _hand_out(self, values: list[Any]) -> dict[str, np.ndarray]:
        """The model's outputs, none sharing memory with the model or with each other
        (see :meth:`_handout_plan`)."""
        return {
            name: np.array(values[slot], copy=True) if copy else values[slot]
            for name, slot, copy in self._handout
        }

    def _make_aliases(
        self, slots: list[int], values: list[Any], env: dict[str, int], shapes: dict
    ) -> None:
        """Set each alias of ``slots`` to its view of its root's array. An alias that only
        reshapes its root, with a shape the binding fixes, is made once by its view and
        then by a reshape to the shape kept in ``shapes`` (the binding's; evaluating the
        shape per call was a fifth of a small model's Python time)."""
        aliases, kept = self.plan.aliases, self._view_kept
        for a in slots:
            alias = aliases[a]
            shape = shapes.get(a)
            try:
                if shape is not None:
                    values[a] = values[alias.root].reshape(shape)
                    continue
                values[a] = v = alias.view(values[alias.root], env)
            except GeodeError:
                raise
            except Exception as exc:
                raise ExecutionError(f"view {alias.text}: {type(exc).__name__}: {exc}") from exc
            if a in kept:
                shapes[a] = v.shape
