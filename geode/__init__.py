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
from geode.compiler.frontend import builder as ops
from geode.compiler.ir import Graph, Node, TensorDesc, Value
from geode.errors import GeodeError

__all__ = ["GeodeError", "Graph", "Node", "TensorDesc", "Value", "ops"]
__version__ = "0.1.0"
