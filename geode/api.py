"""``geode.compile`` and ``geode.load``: pick the front end, hand the graph to a Session."""

from __future__ import annotations

import os
from typing import Any

from geode.compiler.ir import Graph
from geode.errors import GeodeError
from geode.runtime.model import CompiledModel


def compile(model: Any, session: Any = None, **options: Any) -> CompiledModel:  # noqa: A001
    """Compile a ``geode.Graph``, an ONNX ``ModelProto`` or a path to an ``.onnx`` file.

    Options (see ``geode.config``) override the session's, e.g. ``fusion=False``.
    """
    from geode.session import default_session

    sess = session if session is not None else default_session()
    if isinstance(model, (str, os.PathLike)) and os.path.isfile(model):
        return sess.compile_file(model, **options)  # the model cache may know the file
    return sess.compile(to_graph(model), **options)


def to_graph(model: Any) -> Graph:
    """The geode Graph for a Graph, ModelProto, or model path."""
    if isinstance(model, Graph):
        return model
    if isinstance(model, (str, os.PathLike, bytes)) or type(model).__name__ == "ModelProto":
        from geode.compiler.frontend import onnx as onnx_frontend

        return onnx_frontend.import_model(model)
    raise GeodeError(
        f"cannot compile a {type(model).__name__}: give a geode.Graph, an ONNX ModelProto or a path"
    )


def load(path: str | os.PathLike | Any, session: Any = None, **options: Any) -> CompiledModel:
    """Load a model: a geode model file (``.geode``, written by ``CompiledModel.save``)
    is read back without compiling (``num_threads=`` is the one option it takes); an ONNX
    model file, ``ModelProto`` or ``geode.Graph`` is compiled as :func:`compile` would;
    anything else is a GeodeError naming what was given."""
    from geode.modelfile import is_model_file

    if is_model_file(path):
        from geode.session import default_session

        other = sorted(set(options) - {"num_threads"})
        if other:
            raise GeodeError(
                f"a geode model file is compiled already: options {other} do not apply "
                "(num_threads does)"
            )
        sess = session if session is not None else default_session()
        return sess.load(path, options.get("num_threads"))
    return compile(path, session, **options)
