"""The op registry and every registered op prototype.

The prototypes are defined by family (``control``, ``elementwise``, ``nn``, ...: see
:data:`~geode.compiler.ops.registry.FAMILIES`), each family's module imported by the
first lookup of one of its ops (``registry.get(op_type)``, ``has``, ``register``;
``all_ops`` imports them all): loading a compiled model that runs only a few ops on the
reference engines imports only their families.
"""

from geode.compiler.ops import registry
from geode.compiler.ops.registry import OpDef, OpKind, all_ops, get, has, register

__all__ = ["OpDef", "OpKind", "all_ops", "get", "has", "register", "registry"]
