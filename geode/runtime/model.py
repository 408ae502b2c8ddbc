"""CompiledModel: the callable a user holds after ``geode.compile``."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from geode.errors import GeodeError
from geode.runtime.executor import Executor
from geode.runtime.plan import Plan
from geode.runtime.var_manager import VarManager


@dataclass
class KernelInfo:
    """One compiled kernel (or fallback step) as users see it in ``model.kernels``."""

    name: str
    ops: list[Any]
    engine: str
    source: str = ""
    #: "fused" (a kernel compiled from a fusion group), "library" (a library routine
    #: called natively, such as MatMul through BLAS) or "" (a fallback step)
    kind: str = ""
    trace: str = ""
    cost: dict[str, float] = field(default_factory=dict)
    #: a fused kernel's structural key (``geode.compile(..., schedules={key: ...})``)
    key: str = ""
    #: where its schedule came from: "default", "given", "tuned" or "tuned-default"
    schedule: str = ""
    _llvm: Callable[[], str] | None = None
    _asm: Callable[[], str] | None = None

    @property
    def llvm(self) -> str:
        """LLVM IR of the native kernel ('' for fallback steps)."""
        return self._llvm() if self._llvm else ""

    @property
    def asm(self) -> str:
        """Assembly of the native kernel ('' for fallback steps)."""
        return self._asm() if self._asm else ""

    def __repr__(self) -> str:
        return f"KernelInfo({self.name!r}, engine={self.engine!r}, ops={len(self.ops)})"


class CompiledModel:
    """A compiled graph: call it with numpy arrays by input name; returns name -> array."""

    def __init__(
        self,
        plan: Plan,
        var_manager: VarManager,
        kernels: list[KernelInfo],
        explain: Callable[[], str],
        stats: dict[str, Any] | None = None,
    ):
        self.plan = plan
        self.var_manager = var_manager
        self.kernels = kernels
        self._explain = explain
        self.stats = dict(stats or {})
        self._local = threading.local()
        #: ``(path, overwrite, external_data) -> bytes written``: set by the session
        self.saver: Callable[[str | os.PathLike, bool, str], int] | None = None

    @property
    def input_names(self) -> list[str]:
        """Names of the model's inputs, in order."""
        return [s.name for s in self.plan.inputs]

    @property
    def output_names(self) -> list[str]:
        """Names of the model's outputs, in order."""
        return [n for n, _ in self.plan.outputs]

    @property
    def signature(self) -> str:
        """``(x: float32[N, 768]) -> (y)``."""
        ins = ", ".join(s.signature() for s in self.plan.inputs)
        return f"({ins}) -> ({', '.join(self.output_names)})"

    def _executor(self) -> Executor:
        ex = getattr(self._local, "executor", None)
        if ex is None:
            ex = Executor(self.plan, self.var_manager)
            self._local.executor = ex
        return ex

    def run(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Run on a dict of input name -> array."""
        return self._executor().run(feeds)

    def __call__(self, **feeds: Any) -> dict[str, np.ndarray]:
        return self.run(feeds)

    def save(
        self, path: str | os.PathLike, overwrite: bool = False, external_data: str = "embed"
    ) -> int:
        """Write this model to a geode model file (``.geode``) that ``geode.load`` reads
        back in any process without compiling; returns the file's size in bytes.

        Variables are saved with their current values. ``external_data="reference"``
        keeps constants that came from external data files as references to those files
        (checked by length and sha256 when loaded) instead of copies. A file already at
        ``path`` is replaced only when it is a geode model file, or with ``overwrite``.
        Needs the LLVM backend (the default)."""
        if self.saver is None:
            raise GeodeError(f"model {self.plan.name!r} cannot be saved (no compile record)")
        return self.saver(path, overwrite, external_data)

    def explain(self) -> str:
        """Partition, fusion groups with the reason for each decision, kernels and costs."""
        return self._explain()

    def to_dot(self) -> str:
        """Graphviz DOT of the compiled graph: kernels as clusters, engines as colours."""
        dot = getattr(self._explain, "dot", None)
        if dot is None:
            raise GeodeError(f"model {self.plan.name!r} keeps no graph to draw")
        return str(dot())

    def __repr__(self) -> str:
        return f"CompiledModel({self.plan.name!r} {self.signature}, {len(self.kernels)} kernels)"
