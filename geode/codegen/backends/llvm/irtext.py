"""A small writer of LLVM IR text: modules, functions, basic blocks, SSA names.

The LLVM backend prints IR as text (llvmlite parses it): this module holds the
bookkeeping that printing needs and nothing about geode's loop AST. A
:class:`FunctionWriter` hands out unique SSA names and block labels, appends
instructions to the current block, keeps ``alloca`` instructions at the top of the
entry block (where ``mem2reg``/SROA turn them into registers), and a
:class:`ModuleWriter` collects functions, declarations, globals, attribute groups and
metadata nodes, each once.

Types are IR type strings (``"float"``, ``"i64"``, ``"ptr"``, ``"<16 x float>"``);
values are IR operand strings (``"%t3"``, ``"42"``, ``"0x3FF0000000000000"``).
"""

from __future__ import annotations

import math
import re
import struct
from dataclasses import dataclass, field

__all__ = ["FunctionWriter", "ModuleWriter", "float_literal", "int_literal", "quote_name"]

_PLAIN_NAME = re.compile(r"^[A-Za-z_.$][A-Za-z0-9_.$]*$")


def quote_name(name: str) -> str:
    """A global or local identifier body, quoted when it holds other characters.

    >>> quote_name("fused_0")
    'fused_0'
    >>> quote_name("my kernel")
    '"my kernel"'
    """
    if _PLAIN_NAME.match(name):
        return name
    escaped = "".join(
        ch if 32 <= ord(ch) < 127 and ch not in '"\\' else f"\\{ord(ch):02X}" for ch in name
    )
    return f'"{escaped}"'


def float_literal(value: float, ty: str) -> str:
    """The IR literal of ``value`` in float type ``ty`` (``half``, ``float``, ``double``).

    IR writes every float constant as the hexadecimal bits of the *double* holding the
    value; a ``float`` or ``half`` constant must be exactly representable in its type, so
    the value is first rounded to it.

    >>> float_literal(1.0, "float")
    '0x3FF0000000000000'
    >>> float_literal(0.1, "float")  # rounded to float first
    '0x3FB99999A0000000'
    """
    import numpy as np

    if ty == "float":
        value = float(np.float32(value))
    elif ty == "half":
        value = float(np.float16(value))
    elif ty != "double":
        raise ValueError(f"not a float type: {ty}")
    if math.isnan(value):
        value = math.nan  # the canonical quiet NaN
    bits = struct.unpack("<Q", struct.pack("<d", value))[0]
    return f"0x{bits:016X}"


def int_literal(value: int, bits: int) -> str:
    """The IR literal of ``value`` as an ``i<bits>`` (wrapped to the width, signed text).

    >>> int_literal(255, 8)
    '-1'
    >>> int_literal(True, 1)
    'true'
    """
    if bits == 1:
        return "true" if value else "false"
    mask = (1 << bits) - 1
    v = int(value) & mask
    if v >= 1 << (bits - 1):
        v -= 1 << bits
    return str(v)


@dataclass
class _Block:
    label: str
    lines: list[str] = field(default_factory=list)
    terminated: bool = False


class FunctionWriter:
    """One function being written: its signature, blocks and SSA names.

    Instructions go to the *current* block (:meth:`add`); :meth:`new_block` opens
    another (the caller branches to it); :meth:`alloca` puts a stack slot at the top of
    the entry block. :meth:`text` prints the function."""

    def __init__(self, name: str, ret: str, params: list[tuple[str, str]], attrs: str = ""):
        self.name = name
        self.ret = ret
        self.attrs = attrs
        self._used: dict[str, int] = {}
        self.params: list[tuple[str, str]] = []
        for ty, pname in params:
            self.params.append((ty, self.fresh(pname)))
        self._allocas: list[str] = []
        self._blocks: list[_Block] = [_Block("entry")]
        self._used["entry"] = 1
        self._current = self._blocks[0]
        self.linkage = ""

    # -- names ------------------------------------------------------------------------
    def fresh(self, hint: str = "t") -> str:
        """A new local name ``%hint``, ``%hint.1`` ... (with the ``%``)."""
        return "%" + self._fresh_body(hint)

    def _fresh_body(self, hint: str) -> str:
        base = re.sub(r"[^A-Za-z0-9_.]", "_", hint) or "t"
        if base[0].isdigit():
            base = "v" + base
        n = self._used.get(base, 0)
        self._used[base] = n + 1
        return base if n == 0 else f"{base}.{n}"

    def label(self, hint: str) -> str:
        """A new block label (without ``%``); the block is opened by :meth:`start_block`."""
        return self._fresh_body(hint)

    def param(self, i: int) -> str:
        """The name of parameter ``i``."""
        return self.params[i][1]

    # -- blocks -----------------------------------------------------------------------
    @property
    def block(self) -> str:
        """The label of the block instructions currently go to."""
        return self._current.label

    @property
    def terminated(self) -> bool:
        """Whether the current block already ends in a terminator."""
        return self._current.terminated

    def start_block(self, label: str) -> None:
        """Open block ``label`` (from :meth:`label`); later instructions go there."""
        if not self._current.terminated:
            raise AssertionError(f"{self.name}: block {self._current.label} is not terminated")
        blk = _Block(label)
        self._blocks.append(blk)
        self._current = blk

    def add(self, text: str) -> None:
        """Append an instruction that defines no value."""
        if self._current.terminated:
            raise AssertionError(f"{self.name}: instruction after the terminator: {text}")
        self._current.lines.append("  " + text)

    def value(self, text: str, hint: str = "t") -> str:
        """Append ``%name = text`` and return ``%name``."""
        name = self.fresh(hint)
        self.add(f"{name} = {text}")
        return name

    def terminate(self, text: str) -> None:
        """Append the block's terminator (``br``, ``ret``)."""
        self.add(text)
        self._current.terminated = True

    def br(self, label: str, meta: str = "") -> None:
        """``br label %label`` (with ``, !llvm.loop !N`` when ``meta`` is given)."""
        self.terminate(f"br label %{label}" + (f", !llvm.loop {meta}" if meta else ""))

    def cond_br(self, cond: str, yes: str, no: str) -> None:
        """``br i1 cond, label %yes, label %no``."""
        self.terminate(f"br i1 {cond}, label %{yes}, label %{no}")

    def alloca(self, ty: str, hint: str, count: str | None = None, align: int = 0) -> str:
        """A stack slot of ``ty`` (``count`` of them) at the top of the entry block."""
        name = self.fresh(hint)
        text = f"{name} = alloca {ty}"
        if count is not None:
            text += f", i64 {count}"
        if align:
            text += f", align {align}"
        self._allocas.append("  " + text)
        return name

    def text(self) -> str:
        """The function's IR text."""
        params = ", ".join(f"{ty} {name}" for ty, name in self.params)
        link = f"{self.linkage} " if self.linkage else ""
        head = f"define {link}{self.ret} @{quote_name(self.name)}({params}){self.attrs} {{"
        out = [head]
        for i, blk in enumerate(self._blocks):
            out.append(f"{blk.label}:")
            if i == 0:
                out += self._allocas
            out += blk.lines
        out.append("}")
        return "\n".join(out)


class ModuleWriter:
    """A module being written: functions, declarations, globals and metadata."""

    def __init__(self, name: str):
        self.name = name
        self._functions: list[FunctionWriter | str] = []
        self._declared: dict[str, str] = {}
        self._globals: dict[str, str] = {}
        self._meta: list[str] = []
        self._meta_ids: dict[str, str] = {}
        self._attr_groups: dict[str, int] = {}
        self._names: set[str] = set()

    def unique(self, hint: str) -> str:
        """A function or global name not used in this module yet."""
        name, n = hint, 1
        while name in self._names:
            name, n = f"{hint}.{n}", n + 1
        self._names.add(name)
        return name

    def add_function(self, fn: FunctionWriter | str) -> None:
        """Add a function (a writer, or finished IR text such as a helper library)."""
        self._functions.append(fn)

    def declare(self, name: str, text: str) -> str:
        """Declare an external function once (``text`` is the whole ``declare`` line);
        returns ``@name``."""
        self._declared.setdefault(name, text)
        return "@" + quote_name(name)

    def add_global(self, name: str, text: str) -> str:
        """Define a global once (``text`` is the whole definition); returns ``@name``."""
        self._globals.setdefault(name, text)
        return "@" + quote_name(name)

    def attr_group(self, attrs: str) -> str:
        """``#N`` for an attribute group holding ``attrs`` (shared between functions)."""
        if attrs not in self._attr_groups:
            self._attr_groups[attrs] = len(self._attr_groups)
        return f"#{self._attr_groups[attrs]}"

    def metadata(self, body: str, distinct: bool = False) -> str:
        """A metadata node ``!{body}`` (``body`` may say ``SELF`` for a self reference, as
        loop ids need); identical non-distinct nodes are shared. Returns ``!N``."""
        if not distinct and body in self._meta_ids:
            return self._meta_ids[body]
        ref = f"!{len(self._meta)}"
        text = f"{'distinct ' if distinct else ''}!{{{body.replace('SELF', ref)}}}"
        self._meta.append(f"{ref} = {text}")
        if not distinct:
            self._meta_ids[body] = ref
        return ref

    def text(self) -> str:
        """The module's IR text."""
        out = [f"; ModuleID = '{self.name}'"]
        out += list(self._globals.values())
        out += list(self._declared.values())
        for fn in self._functions:
            out.append("")
            out.append(fn if isinstance(fn, str) else fn.text())
        out.append("")
        for attrs, n in self._attr_groups.items():
            out.append(f"attributes #{n} = {{ {attrs} }}")
        out += self._meta
        return "\n".join(out) + "\n"
