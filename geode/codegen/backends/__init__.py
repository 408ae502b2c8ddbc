"""Native code generators for loop ASTs: the LLVM backend (``llvm/``, the default) and the
numba backend (``numba/``, selected with ``GEODE_BACKEND=numba``).

Importing this package imports no backend: numba is loaded only when its backend is
used (:mod:`geode.codegen.backends.numba` sets numba's CPU target up for geode when it
is imported, before it compiles anything).
"""
