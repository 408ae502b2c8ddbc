"""The LLVM optimization level of each module: O3 or O2, chosen from the module's IR.

LLVM's O3 pipeline differs from O2 in a few passes that cost compile time in proportion
to the loops they copy: non-trivial loop unswitching (a loop with a branch on a value the
loop does not change is cloned, once per side), a doubled unrolling threshold, argument
promotion and a higher inlining threshold. Measured on the bench workloads (one thread,
the best tenth of interleaved calls; ``docs/performance.md``), O2 code ran as fast as O3
code on the memory-bound kernels (RMSNorm, LayerNorm, softmax: within 2%; the reduce chain
25% faster), and 5-6% slower on the LSTM gates, whose sigmoid and tanh are vmath's
polynomials inlined into the loop; O2 saved a fifth of LLVM's time on a BERT layer's
kernels (the most on kernels whose loops O3 unswitched: 108 -> 39 ms for one).

:func:`choose` therefore picks, per module:

- O3 for a hand-written library module (dense, batched MatMul, conv, pool, LSTM: few,
  compute-bound, their inner loops written for the vectorizer);
- O3 for a generated kernel that calls a vmath function (``exp``, ``tanh``, ``erf``, ...:
  compute-bound loops);
- O2 for every other generated kernel (elementwise, reductions, normalizations, copies:
  bound by memory).

The environment variable ``GEODE_LLVM_OPT`` overrides the choice for every module:
``auto`` (the default: the rules above), ``2`` or ``3``. The level is part of the
module's cache key (:func:`geode.codegen.backends.llvm.objcache.module_key`), so object
code compiled at one level is never loaded for another; a compiled kernel keeps it
(``opt_level``; ``model.explain()`` lists it per kernel) and the logger of
:mod:`~geode.codegen.backends.llvm.kernel` records it with LLVM's time per module (DEBUG).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from geode.config import OptionError

__all__ = ["ENV_VAR", "Choice", "choose", "setting"]

#: Environment variable overriding the choice: auto (default), 2 or 3.
ENV_VAR = "GEODE_LLVM_OPT"

_SETTINGS = ("auto", "2", "3")


@dataclass(frozen=True)
class Choice:
    """An optimization level and why it was chosen."""

    level: int
    reason: str

    def describe(self) -> str:
        """``O2 (reason)``."""
        return f"O{self.level} ({self.reason})"


def setting() -> str:
    """The value of ``GEODE_LLVM_OPT`` (``auto`` when unset); a bad value raises
    :class:`~geode.config.OptionError` naming the variable and its values."""
    value = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
    if value not in _SETTINGS:
        raise OptionError(f"{ENV_VAR}={value!r}: expected one of {', '.join(_SETTINGS)}")
    return value


#: what a module that calls vmath's functions contains (their definitions' names)
_VMATH = "@geode.vm."


def choose(ir_text: str, generated: bool = True) -> Choice:
    """The level to compile the module ``ir_text`` at: a kernel ``generated`` from a loop
    AST, or a hand-written library module (see the module docstring)."""
    value = setting()
    if value != "auto":
        return Choice(int(value), f"{ENV_VAR}={value}")
    if not generated:
        return Choice(3, "library module")
    if _VMATH in ir_text:
        return Choice(3, "calls vmath: compute-bound")
    return Choice(2, "no vmath call: memory-bound")
