"""The op registry and every registered op prototype.

Importing this package registers all ops; ``registry.get(op_type)`` finds one.
"""

from geode.compiler.ops import control as _control  # noqa: F401
from geode.compiler.ops import elementwise as _elementwise  # noqa: F401
from geode.compiler.ops import host as _host  # noqa: F401
from geode.compiler.ops import image as _image  # noqa: F401
from geode.compiler.ops import layout as _layout  # noqa: F401
from geode.compiler.ops import nn as _nn  # noqa: F401
from geode.compiler.ops import quant as _quant  # noqa: F401
from geode.compiler.ops import reduce as _reduce  # noqa: F401
from geode.compiler.ops import registry
from geode.compiler.ops import rnn as _rnn  # noqa: F401
from geode.compiler.ops import scatter as _scatter  # noqa: F401
from geode.compiler.ops import signal as _signal  # noqa: F401
from geode.compiler.ops import state as _state  # noqa: F401
from geode.compiler.ops import strings as _strings  # noqa: F401
from geode.compiler.ops.registry import OpDef, OpKind, all_ops, get, has, register

__all__ = ["OpDef", "OpKind", "all_ops", "get", "has", "register", "registry"]
