"""Integer operations with numpy's results, as small IR functions the kernels call.

LLVM's ``sdiv``/``srem`` are undefined for a zero divisor and for ``MIN / -1``, and its
shifts for amounts past the width; numpy defines all of these (without its warnings):

==============  ==============================================================
``tdiv``        ``a / b`` truncating toward zero (ONNX integer Div); ``/ 0`` -> 0,
                ``MIN / -1`` -> MIN (wraps)
``fdiv``        ``a // b`` (floor); same special cases
``mod``         ``a % b`` with the divisor's sign; ``% 0`` and ``% -1`` -> 0
``fmod``        C ``fmod`` on integers (the dividend's sign); same special cases
``udiv/umod``   unsigned; ``/ 0`` and ``% 0`` -> 0
``ipow/upow``   power by squaring; a negative exponent gives 0 (1 or +-1 for a base
                of 1 or -1) where numpy raises
``shl/shr``     ``a << b``, ``a >> b`` (arithmetic for signed ``shr``); an amount
                below 0 or at least ``nbits`` gives 0 (``shr`` of a negative value: -1)
==============  ==============================================================

All work on ``i64`` (the caller widens narrow operands and wraps the result, like
numpy); division and modulo are branch-free (selects around a safe divisor) so loops
calling them still vectorize. Each function is ``internal`` and ``alwaysinline``:
:func:`definition` gives its text for the module that calls it.
"""

from __future__ import annotations

__all__ = ["NAMES", "definition", "symbol"]

_ATTRS = "alwaysinline nounwind"

_BODIES: dict[str, tuple[str, str]] = {
    # name: (signature params, body)
    "tdiv": (
        "i64 %a, i64 %b",
        """  %z = icmp eq i64 %b, 0
  %m = icmp eq i64 %b, -1
  %bad = or i1 %z, %m
  %d = select i1 %bad, i64 1, i64 %b
  %q = sdiv i64 %a, %d
  %n = sub i64 0, %a
  %q1 = select i1 %m, i64 %n, i64 %q
  %r = select i1 %z, i64 0, i64 %q1
  ret i64 %r""",
    ),
    "fdiv": (
        "i64 %a, i64 %b",
        """  %z = icmp eq i64 %b, 0
  %m = icmp eq i64 %b, -1
  %bad = or i1 %z, %m
  %d = select i1 %bad, i64 1, i64 %b
  %q = sdiv i64 %a, %d
  %p = mul i64 %q, %d
  %inexact = icmp ne i64 %p, %a
  %x = xor i64 %a, %d
  %neg = icmp slt i64 %x, 0
  %adj = and i1 %inexact, %neg
  %qa = sext i1 %adj to i64
  %q2 = add i64 %q, %qa
  %n = sub i64 0, %a
  %q3 = select i1 %m, i64 %n, i64 %q2
  %r = select i1 %z, i64 0, i64 %q3
  ret i64 %r""",
    ),
    "mod": (
        "i64 %a, i64 %b",
        """  %z = icmp eq i64 %b, 0
  %m = icmp eq i64 %b, -1
  %bad = or i1 %z, %m
  %d = select i1 %bad, i64 1, i64 %b
  %r0 = srem i64 %a, %d
  %nz = icmp ne i64 %r0, 0
  %x = xor i64 %r0, %d
  %neg = icmp slt i64 %x, 0
  %adj = and i1 %nz, %neg
  %r1 = add i64 %r0, %d
  %r = select i1 %adj, i64 %r1, i64 %r0
  ret i64 %r""",
    ),
    "fmod": (
        "i64 %a, i64 %b",
        """  %z = icmp eq i64 %b, 0
  %m = icmp eq i64 %b, -1
  %bad = or i1 %z, %m
  %d = select i1 %bad, i64 1, i64 %b
  %r = srem i64 %a, %d
  ret i64 %r""",
    ),
    "udiv": (
        "i64 %a, i64 %b",
        """  %z = icmp eq i64 %b, 0
  %d = select i1 %z, i64 1, i64 %b
  %q = udiv i64 %a, %d
  %r = select i1 %z, i64 0, i64 %q
  ret i64 %r""",
    ),
    "umod": (
        "i64 %a, i64 %b",
        """  %z = icmp eq i64 %b, 0
  %d = select i1 %z, i64 1, i64 %b
  %r = urem i64 %a, %d
  ret i64 %r""",
    ),
    "ipow": (
        "i64 %a, i64 %b",
        """  %negexp = icmp slt i64 %b, 0
  br i1 %negexp, label %neg, label %loop
neg:
  %one = icmp eq i64 %a, 1
  %mone = icmp eq i64 %a, -1
  %odd = and i64 %b, 1
  %isodd = icmp ne i64 %odd, 0
  %pm = select i1 %isodd, i64 -1, i64 1
  %r1 = select i1 %mone, i64 %pm, i64 0
  %r2 = select i1 %one, i64 1, i64 %r1
  ret i64 %r2
loop:
  %r = phi i64 [1, %0], [%rn, %loop]
  %x = phi i64 [%a, %0], [%xn, %loop]
  %e = phi i64 [%b, %0], [%en, %loop]
  %done = icmp eq i64 %e, 0
  %bit = and i64 %e, 1
  %use = icmp ne i64 %bit, 0
  %rx = mul i64 %r, %x
  %rs = select i1 %use, i64 %rx, i64 %r
  %rn = select i1 %done, i64 %r, i64 %rs
  %xn = mul i64 %x, %x
  %en = lshr i64 %e, 1
  br i1 %done, label %out, label %loop
out:
  ret i64 %r""",
    ),
    "upow": (
        "i64 %a, i64 %b",
        """  br label %loop
loop:
  %r = phi i64 [1, %0], [%rn, %loop]
  %x = phi i64 [%a, %0], [%xn, %loop]
  %e = phi i64 [%b, %0], [%en, %loop]
  %done = icmp eq i64 %e, 0
  %bit = and i64 %e, 1
  %use = icmp ne i64 %bit, 0
  %rx = mul i64 %r, %x
  %rn = select i1 %use, i64 %rx, i64 %r
  %xn = mul i64 %x, %x
  %en = lshr i64 %e, 1
  br i1 %done, label %out, label %loop
out:
  ret i64 %r""",
    ),
    "shl": (
        "i64 %a, i64 %b, i64 %n",
        """  %ok = icmp ult i64 %b, %n
  %s = select i1 %ok, i64 %b, i64 0
  %v = shl i64 %a, %s
  %r = select i1 %ok, i64 %v, i64 0
  ret i64 %r""",
    ),
    "shr": (
        "i64 %a, i64 %b, i64 %n",
        """  %ok = icmp ult i64 %b, %n
  %s = select i1 %ok, i64 %b, i64 63
  %r = ashr i64 %a, %s
  ret i64 %r""",
    ),
    "ushr": (
        "i64 %a, i64 %b, i64 %n",
        """  %ok = icmp ult i64 %b, %n
  %s = select i1 %ok, i64 %b, i64 0
  %v = lshr i64 %a, %s
  %r = select i1 %ok, i64 %v, i64 0
  ret i64 %r""",
    ),
}

#: the operations this module defines
NAMES = frozenset(_BODIES)


def symbol(name: str) -> str:
    """The IR function name of operation ``name`` (``@"geode.op.tdiv"``)."""
    return f'@"geode.op.{name}"'


def definition(name: str) -> str:
    """The IR text defining operation ``name``."""
    params, body = _BODIES[name]
    # the ``%0`` entry label of the loops is the implicit name of the first block
    first = "0:\n" if "%0]" in body else ""
    return f"define internal i64 {symbol(name)}({params}) {_ATTRS} {{\n{first}{body}\n}}"
