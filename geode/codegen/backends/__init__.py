"""Native code generators for loop ASTs (numba today).

Importing this package sets numba's CPU target up for geode (see
:mod:`geode.codegen.backends.target`) before any backend module compiles anything.
"""

from geode.codegen.backends import target as _target

_target.configure()
