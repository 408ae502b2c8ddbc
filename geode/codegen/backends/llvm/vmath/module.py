"""Assembling the IR text of a set of vmath functions with everything they need."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from geode.errors import CodegenError

from ._registry import FUNCTIONS, TABLES
from .target import VmathTarget

__all__ = ["FUNCTION_ATTRS", "VmathModule", "definitions"]

#: attributes of every vmath function: inlined into each caller (where the loop
#: vectorizer sees the straight-line code), never unwinding
FUNCTION_ATTRS = "alwaysinline nounwind willreturn"


@dataclass(frozen=True)
class VmathModule:
    """The IR of some vmath functions, in three parts the caller merges into its module.

    ``functions``: the ``define internal ...`` texts (the requested functions and the
    helpers they call), each once, in a deterministic order. ``globals``: table name ->
    its whole definition line (``@name = internal unnamed_addr constant [...]``).
    ``declares``: intrinsic name (``llvm.fmuladd.f32``) -> its whole ``declare`` line.
    A caller that also declares some of these intrinsics dedups by name (the key).
    The mappings are read-only (results are cached and shared).
    """

    functions: str
    globals: Mapping[str, str]
    declares: Mapping[str, str]

    @property
    def text(self) -> str:
        """Everything as one IR fragment (globals, declares, functions), for a module
        that has no declarations of its own to merge."""
        parts = [*self.globals.values(), *self.declares.values(), self.functions]
        return "\n\n".join(p for p in parts if p) + "\n"


def definitions(names: Iterable[str], target: VmathTarget) -> VmathModule:
    """The IR of the vmath functions ``names`` (as from
    :func:`geode.codegen.backends.llvm.vmath.function_name`) for ``target``, with the
    helper functions, tables and intrinsic declarations they depend on."""
    wanted = tuple(sorted(set(names)))
    unknown = [n for n in wanted if n not in FUNCTIONS]
    if unknown:
        raise CodegenError(f"vmath: unknown function(s) {', '.join(unknown)}")
    return _definitions(wanted, target)


@functools.lru_cache(maxsize=64)
def _definitions(names: tuple[str, ...], target: VmathTarget) -> VmathModule:
    texts: dict[str, str] = {}
    tables: set[str] = set()
    declares: dict[str, str] = {}
    pending = list(names)
    while pending:
        name = pending.pop()
        if name in texts:
            continue
        fb = FUNCTIONS[name](target)
        if fb.name != name:
            raise AssertionError(f"vmath emitter for {name} wrote {fb.name}")
        texts[name] = fb.text(FUNCTION_ATTRS)
        tables |= fb.tables
        declares.update(fb.declares)
        pending += sorted(fb.callees - texts.keys())
    return VmathModule(
        functions="\n\n".join(texts[n] for n in sorted(texts)),
        globals=MappingProxyType({t: TABLES[t]() for t in sorted(tables)}),
        declares=MappingProxyType({d: declares[d] for d in sorted(declares)}),
    )
