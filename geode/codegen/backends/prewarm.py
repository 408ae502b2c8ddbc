"""The code generator a compile will use, started early: :func:`prewarm`.

A cold compile reads the model and plans it (the ONNX import, the front end, the graph
passes, the fusion plan) for a while before its first kernel reaches a code generator;
the other cores idle meanwhile. :func:`prewarm` hands them the code generator's
first-use costs then: for the LLVM backend, its background threads start at once and
each compiles a throw-away module first
(:func:`geode.codegen.backends.llvm.background.warm_up`). The numba backend, and a
compile that generates no code, are left alone.
"""

from __future__ import annotations

from geode.config import Options

__all__ = ["prewarm"]


def prewarm(opts: Options) -> bool:
    """Start warming the code generator a compile with ``opts`` will use, in the
    background; whether this call started it (False: another backend, no code generated,
    or warm already). For a compile that will generate code, as it starts (the session,
    on a model cache miss); it never raises and never delays the caller."""
    if opts.backend != "llvm" or not opts.codegen:
        return False
    from geode.codegen.backends.llvm import background

    return background.warm_up()
