"""``geode.onnx_backend``: geode as an ``onnx.backend.base.Backend``.

The ONNX project's backend test suite drives a backend through this interface::

    import onnx.backend.test
    import geode.onnx_backend

    onnx.backend.test.BackendTest(geode.onnx_backend.GeodeBackend, __name__)

and users can do the same by hand::

    rep = geode.onnx_backend.prepare(model)            # compile once
    (y,) = rep.run([x])                                # outputs in the model's order

``prepare`` compiles the model through the full pipeline with geode's default options
(fusion on, AI Core kernels on); keyword arguments that name a geode option
(``geode.config.Options``) override it, e.g. ``prepare(model, fusion=False)``.
Every prepared model gets its own :class:`geode.Session`, whose VarManager memory is
released when the :class:`GeodeRep` is garbage collected.
"""

from __future__ import annotations

import dataclasses
import os
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper
from onnx.backend.base import Backend, BackendRep, Device, DeviceType

from geode.compiler import dtypes
from geode.compiler.frontend.onnx_versions import SUPPORTED_OPSET_RANGE
from geode.config import OptionError, Options
from geode.errors import GeodeError, InputError

#: keyword arguments the ONNX test runner passes to ``prepare`` that are not options
RUNNER_KWARGS = frozenset({"rtol", "atol"})

_OPTION_NAMES = frozenset(f.name for f in dataclasses.fields(Options))


def _compile_options(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """geode options among ``prepare``'s keyword arguments (runner-only ones dropped)."""
    opts: dict[str, Any] = {}
    for k, v in kwargs.items():
        if k in RUNNER_KWARGS:
            continue
        if k not in _OPTION_NAMES:
            raise OptionError(
                f"geode.onnx_backend: unknown option {k!r}; known options: {sorted(_OPTION_NAMES)}"
            )
        opts[k] = v
    return opts


def _check_outputs(compiled: Any, output_names: Sequence[str]) -> None:
    """GeodeError unless the compiled model returns every ONNX graph output by its name."""
    missing = [n for n in output_names if n not in compiled.output_names]
    if missing:
        raise GeodeError(
            f"geode.onnx_backend: model {compiled.plan.name!r}: graph output(s) {missing} are "
            f"not among the compiled model's outputs {compiled.output_names}"
        )


def _opset_version(value: Any) -> int:
    """``run_node``'s ``opset_version`` as an int; OptionError for anything else."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return int(value)
    if isinstance(value, str) and value.strip().isdecimal():
        return int(value)
    raise OptionError(
        f"geode.onnx_backend.run_node: opset_version={value!r}: expected an integer opset "
        f"version (geode reads opsets {SUPPORTED_OPSET_RANGE[0]} to {SUPPORTED_OPSET_RANGE[1]})"
    )


def _check_device(device: str) -> None:
    if not GeodeBackend.supports_device(device):
        raise GeodeError(
            f"geode.onnx_backend: device {device!r} is not supported (geode runs on 'CPU')"
        )


class GeodeRep(BackendRep):
    """A model compiled by geode; ``run(inputs)`` returns its outputs in the model's order."""

    def __init__(
        self, compiled: Any, input_names: Sequence[str], output_names: Sequence[str], session: Any
    ):
        self.model = compiled
        #: the model's graph inputs that are fed at run time (initializers excluded), in order
        self.input_names = list(input_names)
        #: the model's graph outputs, in order
        self.output_names = list(output_names)
        self.session = session
        self._finalizer = weakref.finalize(self, session.close)

    def _feeds(self, inputs: Any) -> dict[str, np.ndarray]:
        """A name -> array dict from a dict, a list in input order, or one array."""
        if isinstance(inputs, Mapping):
            feeds = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray) or not isinstance(inputs, (list, tuple)):
                inputs = [inputs]
            if len(inputs) > len(self.input_names):
                raise InputError(
                    f"model {self.model.plan.name!r}: {len(inputs)} inputs given, the model has "
                    f"{len(self.input_names)} ({self.input_names})"
                )
            feeds = dict(zip(self.input_names, inputs))
        wanted = set(self.model.input_names)
        # inputs the compiled graph no longer reads (e.g. unused by any node) are dropped
        return {k: v for k, v in feeds.items() if k in wanted or k not in self.input_names}

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        """Run the model; ``inputs`` is a list in the model's input order, a dict or one array.

        Returns one array per graph output of the ONNX model, in its order and under its
        names (an output that is a graph input is a copy of that input). An output the
        model lists more than once (``[y, y]``) is computed once and returned at each of
        its positions, each position its own copy.
        """
        results = self.model.run(self._feeds(inputs))
        seen: set[str] = set()
        out: list[np.ndarray] = []
        for name in self.output_names:
            value = results[name]
            out.append(np.copy(value) if name in seen else value)
            seen.add(name)
        return tuple(out)


class GeodeBackend(Backend):
    """The ONNX backend interface to geode (CPU only)."""

    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        """Whether geode can run models on ``device`` (the model itself is checked on import)."""
        return cls.supports_device(device)

    @classmethod
    def prepare(
        cls, model: onnx.ModelProto | str | os.PathLike | bytes, device: str = "CPU", **kwargs: Any
    ) -> GeodeRep:
        """Compile ``model`` (a ModelProto, a path or serialized bytes) for ``device``."""
        from geode.compiler.frontend.onnx import import_model
        from geode.session import Session

        _check_device(device)
        options = _compile_options(kwargs)
        # the importer checks the model first: ModelLoadError for a missing file, bytes
        # that are not an ONNX model, or an object of another type
        graph = import_model(model)
        if isinstance(model, onnx.ModelProto):
            proto = model
        elif isinstance(model, (str, os.PathLike)):
            proto = onnx.load(os.fspath(model), load_external_data=False)
        else:
            proto = onnx.load_model_from_string(bytes(model))
        inits = {t.name for t in proto.graph.initializer} | {
            s.values.name for s in proto.graph.sparse_initializer
        }
        input_names = [vi.name for vi in proto.graph.input if vi.name not in inits]
        output_names = [vo.name for vo in proto.graph.output]
        session = Session()
        try:
            compiled = session.compile(graph, **options)
            _check_outputs(compiled, output_names)
        except BaseException:
            session.close()
            raise
        return GeodeRep(compiled, input_names, output_names, session)

    @classmethod
    def run_model(
        cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any
    ) -> tuple[np.ndarray, ...]:
        """Compile and run ``model`` once."""
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(
        cls,
        node: onnx.NodeProto,
        inputs: Any,
        device: str = "CPU",
        outputs_info: Sequence[tuple[Any, tuple[int, ...]]] | None = None,
        **kwargs: Any,
    ) -> tuple[np.ndarray, ...]:
        """Run one node on ``inputs`` (a list in the node's input order, or a dict by name).

        ``opset_version`` (keyword) sets the default-domain opset the node is read at
        (default: the newest geode supports).
        """
        _check_device(device)
        opset = _opset_version(kwargs.pop("opset_version", SUPPORTED_OPSET_RANGE[1]))
        if isinstance(inputs, Mapping):
            feeds = {k: np.asarray(v) for k, v in inputs.items()}
        else:
            names = [x for x in node.input if x]
            feeds = {n: np.asarray(v) for n, v in zip(names, inputs)}
        graph_inputs = [
            helper.make_tensor_value_info(n, dtypes.to_onnx(a.dtype), list(a.shape))
            for n, a in feeds.items()
        ]
        graph_outputs = []
        for i, name in enumerate(o for o in node.output if o):
            if outputs_info is not None and i < len(outputs_info):
                elem, shape = outputs_info[i]
                elem_type = elem if isinstance(elem, int) else dtypes.to_onnx(np.dtype(elem))
                graph_outputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))
            else:
                graph_outputs.append(helper.make_empty_tensor_value_info(name))
        opsets = [helper.make_opsetid("", opset)]
        if node.domain not in ("", "ai.onnx"):
            opsets.append(helper.make_opsetid(node.domain, 1))
        graph = helper.make_graph([node], f"run_node_{node.op_type}", graph_inputs, graph_outputs)
        model = helper.make_model(graph, opset_imports=opsets)
        return cls.prepare(model, device, **kwargs).run(feeds)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """True for ``"CPU"`` (also ``"CPU:0"``); geode has no other devices."""
        try:
            return Device(device).type == DeviceType.CPU
        except Exception:  # noqa: BLE001 - an unparsable device string is simply unsupported
            return False


prepare = GeodeBackend.prepare
run_model = GeodeBackend.run_model
run_node = GeodeBackend.run_node
supports_device = GeodeBackend.supports_device

__all__ = ["GeodeBackend", "GeodeRep", "prepare", "run_model", "run_node", "supports_device"]
