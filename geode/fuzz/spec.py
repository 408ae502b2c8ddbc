"""The fuzzer's graph description: a :class:`Case`, independent of geode's IR.

A case names its dims, its graph inputs, its nodes and its outputs, and holds the
input arrays of each run (a *binding*: one size per symbolic dim, one array per
input). Values are referred to by name: inputs by their own, a node's output by
the node's ``out``. The shrinker edits cases (drops nodes, cuts a value into a new
input, shrinks a dim and slices the arrays with it) and rebuilds the graph each
time with :func:`geode.fuzz.build.build_graph`; cases are also what a reproducer
folder stores (``case.json`` plus ``.npy`` arrays).
"""

from __future__ import annotations

import copy
import json
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

#: the dtypes the fuzzer draws from (geode's numeric dtypes; storage dtypes excluded)
DTYPES = (
    "float16",
    "float32",
    "float64",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "bool",
)
FLOAT_DTYPES = ("float16", "float32", "float64")


@dataclass
class DimSpec:
    """A dim variable: symbolic (a named graph-input dim, one size per binding) or static
    (an int in the graph, the same size in every binding)."""

    name: str
    symbolic: bool
    sizes: list[int]

    def size(self, binding: int) -> int:
        """The dim's size in run ``binding``."""
        return self.sizes[binding if self.symbolic else 0]


@dataclass
class InputSpec:
    """A graph input: dims are dim names (of :class:`DimSpec`) or literal ints."""

    name: str
    dims: list[str | int]
    dtype: str


@dataclass
class NodeSpec:
    """One op application: ``op`` (an ONNX op type, or ``Const``), argument value names,
    JSON-able ``params`` read by :mod:`geode.fuzz.build`, and its output's name."""

    op: str
    args: list[str]
    params: dict[str, Any]
    out: str


@dataclass
class Case:
    """One fuzz graph with its runs; ``seed`` and ``index`` say where it came from."""

    seed: int
    index: int
    dims: list[DimSpec]
    inputs: list[InputSpec]
    nodes: list[NodeSpec]
    outputs: list[str]
    #: one dict per run: input name -> array
    feeds: list[dict[str, np.ndarray]] = field(default_factory=list)

    # -- queries -----------------------------------------------------------------------
    def dim(self, name: str) -> DimSpec:
        """The dim variable called ``name``."""
        return next(d for d in self.dims if d.name == name)

    def producer(self, value: str) -> NodeSpec | None:
        """The node whose output is ``value`` (None for an input)."""
        return next((n for n in self.nodes if n.out == value), None)

    def ancestors(self, value: str) -> list[NodeSpec]:
        """Every node ``value`` depends on, itself included, in graph order."""
        need = {value}
        found: list[NodeSpec] = []
        for node in reversed(self.nodes):
            if node.out in need:
                found.append(node)
                need.update(node.args)
        return found[::-1]

    def readers(self, value: str) -> list[NodeSpec]:
        """The nodes that read ``value``."""
        return [n for n in self.nodes if value in n.args]

    # -- editing -----------------------------------------------------------------------
    def copy(self) -> Case:
        """A deep copy (arrays copied too)."""
        return copy.deepcopy(self)

    def prune(self) -> None:
        """Drop nodes no output depends on, then inputs and dims nothing uses."""
        live = set(self.outputs)
        kept: list[NodeSpec] = []
        for node in reversed(self.nodes):
            if node.out in live:
                kept.append(node)
                live.update(node.args)
        self.nodes = kept[::-1]
        self.inputs = [i for i in self.inputs if i.name in live]
        for feeds in self.feeds:
            for name in [k for k in feeds if k not in live]:
                del feeds[name]
        used = {d for i in self.inputs for d in i.dims if isinstance(d, str)}
        self.dims = [d for d in self.dims if d.name in used]

    def fresh_name(self, prefix: str) -> str:
        """A value name not used in this case."""
        taken = {i.name for i in self.inputs} | {n.out for n in self.nodes}
        k = 0
        while f"{prefix}{k}" in taken:
            k += 1
        return f"{prefix}{k}"

    # -- (de)serialization -------------------------------------------------------------
    def to_json(self) -> str:
        """The case without its arrays, as JSON (the arrays go to ``.npy`` files)."""
        body = asdict(self)
        body.pop("feeds")
        body["runs"] = len(self.feeds)
        return json.dumps(body, indent=1)

    @classmethod
    def from_json(cls, text: str, feeds: list[dict[str, np.ndarray]]) -> Case:
        """The case of :meth:`to_json`, with its runs' arrays."""
        body = json.loads(text)
        body.pop("runs", None)
        return cls(
            seed=body["seed"],
            index=body["index"],
            dims=[DimSpec(**d) for d in body["dims"]],
            inputs=[InputSpec(**i) for i in body["inputs"]],
            nodes=[NodeSpec(**n) for n in body["nodes"]],
            outputs=list(body["outputs"]),
            feeds=feeds,
        )

    def describe(self) -> str:
        """A short text form: dims, inputs, nodes and outputs, one per line."""
        lines = [f"case seed={self.seed} index={self.index}"]
        for d in self.dims:
            kind = "symbolic" if d.symbolic else "static"
            lines.append(f"  dim {d.name}: {kind} {d.sizes}")
        for i in self.inputs:
            lines.append(f"  input {i.name}: {i.dtype}{i.dims}")
        for n in self.nodes:
            params = f" {json.dumps(n.params, sort_keys=True)}" if n.params else ""
            lines.append(f"  {n.out} = {n.op}({', '.join(n.args)}){params}")
        lines.append(f"  outputs: {', '.join(self.outputs)}")
        return "\n".join(lines)
