"""geode: a fusion compiler for deep-learning graphs that emits native CPU kernels.

Public face::

    import geode
    from geode import ops

    g = geode.Graph("rmsnorm")
    x = g.input("x", ["N", 768])
    g.output(x / ops.sqrt(ops.reduce_mean(x * x, axes=[-1]) + 1e-6), names=["y"])
    model = geode.compile(g)
    out = model(x=np.ones((4, 768), np.float32))["y"]
"""

from geode.compiler import ops as _registry  # noqa: F401  (registers every op)
from geode.compiler.ir import Graph, Node, TensorDesc, Value
from geode.config import set_options
from geode.errors import GeodeError

__all__ = [
    "GeodeError",
    "Graph",
    "Node",
    "Session",
    "TensorDesc",
    "Value",
    "compile",
    "load",
    "ops",
    "set_options",
    "tune",
]
# The runtime comes with the package: what loading a model file and running it use (the
# session, the model-file reader, the native runtime), so that geode.load and a first
# run pay only for their own work; the model's object code is linked through
# libllvmlite's C functions (codegen/backends/llvm/linker.py), not llvmlite's Python
# binding. The compiler's symbolic algebra (sympy), the ONNX importer and llvmlite's
# binding (to compile IR) are imported by the first compile (geode.lazy).
from geode.api import compile, load  # noqa: E402, A004
from geode.modelfile import load as _modelfile_load  # noqa: E402, F401
from geode.session import Session  # noqa: E402
from geode.version import __version__ as __version__  # noqa: E402


def __getattr__(name: str) -> object:
    if name == "ops":  # the graph builder: imported when a graph is built, not by a load
        from geode.compiler.frontend import builder

        globals()["ops"] = builder
        return builder
    if name == "tune":
        from geode.tuner import tune

        return tune
    if name == "onnx_backend":
        import importlib

        return importlib.import_module("geode.onnx_backend")
    raise AttributeError(f"module 'geode' has no attribute {name!r}")
