"""Differential fuzzing: random graphs compiled by geode against its reference engine.

``python -m geode.fuzz --n 10000 --seed S`` generates random graphs with the Python
builder (:mod:`geode.fuzz.generator`), compiles each natively and compares every
run's outputs with the reference interpreter (:mod:`geode.fuzz.runner`, tolerances
in :mod:`geode.fuzz.compare`), shrinks the failures to small graphs
(:mod:`geode.fuzz.shrink`) and writes a reproducer folder for each
(:mod:`geode.fuzz.reproducer`). The rooms, in order of a run:

=================  ===================================================================
``spec``           :class:`Case`: dims, inputs, nodes, outputs, the runs' input arrays
``oplib``          the ops the fuzzer draws, and which results are exact
``data``           input arrays: distributions, NaN/Inf, integer extremes
``gen_state``      :class:`~geode.fuzz.gen_state.Gen`: one case being generated
``gen_math``       node makers for math, casts, reductions, softmax
``gen_layout``     node makers for layout ops
``generator``      :func:`generate_case` (seed, index) -> :class:`Case`
``build``          :func:`build_graph` :class:`Case` -> ``geode.Graph``
``compare``        the tolerance policy
``noise``          is a mismatch rounding noise? (perturbed rounding, wider precision)
``runner``         :class:`Checker`: build, compile, run both engines -> :class:`Outcome`
``shrink``         :func:`shrink`: smaller cases that fail the same way
``reproducer``     :func:`write_reproducer`, :func:`load_case`
``executors``      checking in this process or in a worker process that may crash
``driver``         :func:`run_fuzz`, :class:`FuzzConfig`, :class:`FuzzReport`, :func:`replay`
``__main__``       the command line
=================  ===================================================================
"""

from geode.fuzz.build import FuzzError, SpecError, build_graph
from geode.fuzz.driver import FuzzConfig, FuzzReport, replay, run_fuzz
from geode.fuzz.generator import generate_case
from geode.fuzz.reproducer import load_case, write_reproducer
from geode.fuzz.runner import Checker, Outcome
from geode.fuzz.shrink import shrink
from geode.fuzz.spec import Case, DimSpec, InputSpec, NodeSpec

__all__ = [
    "Case",
    "Checker",
    "DimSpec",
    "FuzzConfig",
    "FuzzError",
    "FuzzReport",
    "InputSpec",
    "NodeSpec",
    "Outcome",
    "SpecError",
    "build_graph",
    "generate_case",
    "load_case",
    "replay",
    "run_fuzz",
    "shrink",
    "write_reproducer",
]
