"""A native chain's own entry: one small LLVM module per chain, one exported function.

A chain (:mod:`geode.runtime.chains`) runs a static subgraph's native entries (kernels,
library routines, index checks) in one crossing from Python. Its entry,
``i64 geode_chain(ptr ptrs, ptr recs, ptr ints)``, takes every member's arguments
concatenated as ``call_chain`` lays them out and calls each member's entry with its
slices, in order; the first nonzero status stops it and is returned as
``((k + 1) << 32) | status`` for member ``k`` (``call_chain``'s encoding), else 0.

The members are called by symbol: ``geode.chain.m<k>``, declared external and given
their addresses when the object is linked (``imports``). So the module's text depends
only on the chain's shape (per member its number of arrays and of ints), never on
addresses: its object code is cached (memory, the disk's object cache, a model file)
under a key of that text and serves every chain of the same shape. The kernels keep
their own modules (compiled in parallel, cached per kernel): the chain's module is
only calls, compiled with no optimization pipeline (level 0), in a few milliseconds.

A member's arrays start at a constant index of ``ptrs`` and its ints at a constant
index of ``ints``; its records start where the previous member's end, found by walking
them (each is ``2 + ndim`` words): the chain trusts no rank it was not given.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from geode.codegen.backends.llvm import jit, objcache
from geode.codegen.backends.llvm.optlevel import Choice
from geode.codegen.backends.llvm.target import host
from geode.errors import CodegenError

__all__ = ["ENTRY", "ChainBuilder", "ChainEntry", "chain_ir", "enabled", "member_symbol"]

#: the symbol a chain's module exports
ENTRY = "geode_chain"
#: the optimization level of a chain's module: only calls, nothing to optimize
LEVEL = Choice(0, "chain entry: calls only")

#: the switch: ``GEODE_CHAIN_ENTRY=0`` leaves chains without an entry of their own (the
#: native runtime's loop; for A/B measurements)
ENV_VAR = "GEODE_CHAIN_ENTRY"


def enabled() -> bool:
    """Whether chains get entries of their own (``GEODE_CHAIN_ENTRY``, on unless ``0``)."""
    return os.environ.get(ENV_VAR, "1").strip() != "0"


#: (number of arrays, number of ints) of each member, in run order
Shape = Sequence[tuple[int, int]]


def member_symbol(k: int) -> str:
    """The symbol a chain's module calls member ``k`` by."""
    return f"geode.chain.m{k}"


def _member_lines(
    k: int, n_arrays: int, at: tuple[int, int, str], last: bool
) -> tuple[list[str], str]:
    """The IR of member ``k``'s call, its status check and (unless it is the ``last``)
    the walk over its records; ``at``: its first array, its first int and the value of
    its first record's index."""
    pa, pi, rec = at
    lines = [
        f"  %p{k} = getelementptr ptr, ptr %ptrs, i64 {pa}",
        f"  %r{k} = getelementptr i64, ptr %recs, i64 {rec}",
        f"  %i{k} = getelementptr i64, ptr %ints, i64 {pi}",
        f'  %s{k} = call i32 @"{member_symbol(k)}"(ptr %p{k}, ptr %r{k}, ptr %i{k})',
        f"  %z{k} = icmp eq i32 %s{k}, 0",
        f"  br i1 %z{k}, label %ok{k}, label %stop{k}",
        f"stop{k}:",
        f"  %w{k} = zext i32 %s{k} to i64",
        f"  %e{k} = or i64 %w{k}, {(k + 1) << 32}",
        f"  ret i64 %e{k}",
        f"ok{k}:",
    ]
    prev = rec
    for j in range(0 if last else n_arrays):  # the next record: 2 + ndim words on
        lines += [
            f"  %nd{k}_{j}p = getelementptr i64, ptr %recs, i64 {prev}",
            f"  %nd{k}_{j} = load i64, ptr %nd{k}_{j}p, align 8",
            f"  %at{k}_{j}a = add i64 {prev}, 2",
            f"  %at{k}_{j} = add i64 %at{k}_{j}a, %nd{k}_{j}",
        ]
        prev = f"%at{k}_{j}"
    return lines, prev


def chain_ir(shape: Shape) -> str:
    """The LLVM IR text of the chain entry for members of ``shape`` (per member its
    number of arrays and of ints)."""
    if not shape:
        raise CodegenError("a chain entry needs at least one member")
    head = [f"; geode chain entry: {len(shape)} members"]
    head += [
        f'declare i32 @"{member_symbol(k)}"(ptr, ptr, ptr) nounwind' for k in range(len(shape))
    ]
    body = [f"define i64 @{ENTRY}(ptr %ptrs, ptr %recs, ptr %ints) nounwind {{", "entry:"]
    pa = pi = 0
    rec = "0"
    for k, (n_arrays, n_ints) in enumerate(shape):
        if n_arrays < 0 or n_ints < 0:
            raise CodegenError(f"chain member {k}: {n_arrays} arrays, {n_ints} ints")
        lines, rec = _member_lines(k, n_arrays, (pa, pi, rec), k == len(shape) - 1)
        body += lines
        pa, pi = pa + n_arrays, pi + n_ints
    body += ["  ret i64 0", "}"]
    return "\n".join(head + [""] + body) + "\n"


@dataclass(eq=False)
class ChainEntry:
    """A chain's entry linked into the process: ``address`` of its function, ``ir`` its
    module's text, ``key`` the object cache's key of it, ``loaded`` the linked code (the
    entry is callable while this object lives) and ``source``: where the object code came
    from (``"cache"``: this process's or the disk's, ``"model file"`` or ``"LLVM"``)."""

    address: int
    ir: str = field(repr=False)
    key: str
    loaded: jit.Loaded = field(repr=False)
    source: str

    @property
    def obj(self) -> bytes:
        """The object code (what a model file keeps)."""
        return self.loaded.obj


class ChainBuilder:
    """What a plan's chains get their native entries from (injected into the runtime
    as a callable: ``builder(shape, addresses, name)``). ``cache_dir``: the disk object
    cache (None: none); ``packed``: object code by key (a model file's; a key there is
    linked without LLVM); ``compile``: whether a module found nowhere is compiled (a
    model file loads without LLVM: its chains without an object run the loop);
    ``dump``: a :class:`geode.debug.Dumper` that is shown each module's text."""

    def __init__(
        self,
        cache_dir: objcache.CacheDir | None = None,
        packed: Mapping[str, bytes] | None = None,
        compile: bool = True,
        dump: Any = None,
    ) -> None:
        self.cache_dir = objcache.location(cache_dir)
        self.packed = dict(packed or {})
        self.compile = compile
        self.dump = dump
        self._started: set[str] = set()
        self._lock = threading.Lock()

    def key(self, ir: str) -> str:
        """The object cache's key of chain module ``ir`` for this host."""
        return objcache.module_key(ir, host(), LEVEL.level)

    def start(self, shape: Shape) -> None:
        """Start LLVM on the chain module of ``shape`` on a background thread, unless its
        object code is packed, cached on disk or this builder does not compile."""
        if not self.compile:
            return
        ir = chain_ir(shape)
        key = self.key(ir)
        with self._lock:
            if key in self._started or key in self.packed:
                return
            self._started.add(key)
        if self.cache_dir is not None and objcache.load(self.cache_dir, key, ENTRY) is not None:
            return
        from geode.codegen.backends.llvm import background  # compiles only

        background.submit(key, ir, host(), LEVEL.level)

    def abandon(self) -> None:
        """Cancel the background runs :meth:`start` began that no chain claimed (a plan
        that failed midway leaves nothing pending)."""
        with self._lock:
            started, self._started = self._started, set()
        if started:
            from geode.codegen.backends.llvm import background  # started: compiles

            for key in started:
                background.cancel(key)

    def __call__(self, shape: Shape, addresses: Sequence[int], name: str = "") -> ChainEntry | None:
        """The entry of a chain of members of ``shape`` at ``addresses`` (None: the loop
        runs it: no object code and no compiling)."""
        ir = chain_ir(shape)
        if self.dump is not None:
            self.dump.stage(f"{name or 'chain'}_chain_llvm", ir, level=3, ext="ll")
        key = self.key(ir)
        imports = {member_symbol(k): int(a) for k, a in enumerate(addresses)}
        obj = self.packed.get(key)
        if obj is not None:
            loaded = jit.load_object(obj, [ENTRY], runtime=False, imports=imports)
            loaded.level = LEVEL.level
            return ChainEntry(loaded[ENTRY], ir, key, loaded, "model file")
        if not self.compile:
            return None
        from geode.codegen.backends.llvm.kernel import build_module  # compiles only

        loaded, cached = build_module(
            ENTRY, ir, host(), self.cache_dir, runtime=False, imports=imports, key=key, choice=LEVEL
        )
        return ChainEntry(loaded[ENTRY], ir, key, loaded, "cache" if cached else "LLVM")
