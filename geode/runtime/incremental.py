"""A model compiled incrementally (GE's JIT execution points).

The head (everything up to the graph's data-dependent ops) is compiled; each call runs
it, then runs the tail compiled for the shapes the tail's inputs have now: a tail
compiled before for those shapes is reused (the last :data:`TAIL_CACHE` kept), a new
shape compiles one (``compile_tail``, injected by the session). ``tail_compiles``
counts the compiles, ``tails`` holds the tails by shapes.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from geode.errors import GeodeError, MissingInputError, UnexpectedInputError
from geode.runtime.model import CompiledModel

__all__ = ["TAIL_CACHE", "IncrementalModel"]

#: tails kept (by the shapes of their inputs); the least recently used goes first
TAIL_CACHE = 16

Shapes = tuple[tuple[int, ...], ...]


class IncrementalModel(CompiledModel):
    """A compiled head and tails compiled per shape (module docstring). ``kernels``
    are the head's; each tail's are in ``tails[shapes].kernels``."""

    def __init__(
        self,
        name: str,
        head: CompiledModel,
        inputs: list[str],
        outputs: list[str],
        tail_inputs: list[str],
        compile_tail: Callable[[dict[str, tuple[int, ...]]], CompiledModel],
        explain: Callable[[], str],
        stats: dict[str, Any] | None = None,
    ):
        super().__init__(head.plan, head.var_manager, head.kernels, explain, stats)
        self.name = name
        self.head = head
        self._inputs, self._outputs = inputs, outputs
        self.tail_inputs = tail_inputs
        self._compile_tail = compile_tail
        self.tails: OrderedDict[Shapes, CompiledModel] = OrderedDict()
        self.tail_compiles = 0
        #: seconds each kept tail took to compile
        self.tail_seconds: dict[Shapes, float] = {}
        self._lock = threading.Lock()

    @property
    def input_names(self) -> list[str]:
        """The graph's inputs, in order."""
        return list(self._inputs)

    @property
    def output_names(self) -> list[str]:
        """The graph's outputs, in order."""
        return list(self._outputs)

    def tail_for(self, shapes: Mapping[str, tuple[int, ...]]) -> CompiledModel:
        """The tail compiled for these shapes of its inputs (compiled now if new)."""
        key = tuple(tuple(shapes[n]) for n in self.tail_inputs)
        with self._lock:
            model = self.tails.get(key)
            if model is not None:
                self.tails.move_to_end(key)
                return model
            t0 = time.perf_counter()
            model = self._compile_tail({n: tuple(shapes[n]) for n in self.tail_inputs})
            self.tail_seconds[key] = time.perf_counter() - t0
            self.tail_compiles += 1
            self.tails[key] = model
            while len(self.tails) > TAIL_CACHE:
                old, _ = self.tails.popitem(last=False)
                self.tail_seconds.pop(old, None)
            return model

    def run(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Run the head, then the tail for the shapes it produced; the graph's outputs."""
        extra = sorted(set(feeds) - set(self._inputs), key=repr)
        if extra:
            raise UnexpectedInputError(
                f"model {self.name!r}: unexpected input(s) {extra}; inputs are {self._inputs}"
            )
        missing = [n for n in self._inputs if n not in feeds]
        if missing:
            raise MissingInputError(f"model {self.name!r}: missing input(s) {missing}")
        head_in = self.head.input_names
        values: dict[str, Any] = dict(feeds)
        values.update(self.head.run({n: feeds[n] for n in head_in}))
        arrays = {n: np.asarray(values[n]) for n in self.tail_inputs}
        tail = self.tail_for({n: a.shape for n, a in arrays.items()})
        values.update(tail.run(arrays))
        return {n: values[n] for n in self._outputs}

    def save(
        self, path: str | os.PathLike, overwrite: bool = False, external_data: str = "embed"
    ) -> int:
        """Not supported: its tails are compiled as shapes come."""
        raise GeodeError(
            f"model {self.name!r} compiles its tail per shape at run time: a model file "
            "holds one compiled graph; save model.head or a tail"
        )

    def __repr__(self) -> str:
        return f"IncrementalModel({self.name!r}, {self.tail_compiles} tails compiled)"
