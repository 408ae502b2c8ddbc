"""Structured control flow over :class:`~geode.codegen.backends.llvm.irtext.FunctionWriter`
for hand-written library kernels (the convolutions of :mod:`~.conv`): counted loops,
one-armed ifs, and ``i64`` arithmetic (min, max, floor and ceiling division by a
positive divisor) printed as IR text.

Values are IR operand strings (``"%t3"``, ``"42"``). A loop's body is a Python callable
that receives the induction variable and writes the body's instructions (it may open
blocks of its own); the loop is printed in rotated form (a guard, then body and latch)
so LLVM's loop passes see the canonical shape they vectorize.
"""

from __future__ import annotations

from collections.abc import Callable

from geode.codegen.backends.llvm.irtext import FunctionWriter, ModuleWriter

__all__ = ["Builder"]


class Builder:
    """Helpers writing into one function (see the module docstring)."""

    def __init__(self, fn: FunctionWriter):
        self.fn = fn

    # -- i64 arithmetic ---------------------------------------------------------------
    def op(self, opcode: str, a: str, b: str, hint: str = "t") -> str:
        """``opcode i64 a, b`` (``add``, ``mul``, ``sub``, ``sdiv`` ...)."""
        return self.fn.value(f"{opcode} i64 {a}, {b}", hint)

    def add(self, a: str, b: str, hint: str = "t") -> str:
        """``a + b``."""
        return self.op("add", a, b, hint)

    def mul(self, a: str, b: str, hint: str = "t") -> str:
        """``a * b``."""
        return self.op("mul", a, b, hint)

    def sub(self, a: str, b: str, hint: str = "t") -> str:
        """``a - b``."""
        return self.op("sub", a, b, hint)

    def cmp(self, pred: str, a: str, b: str, hint: str = "c") -> str:
        """``icmp pred i64 a, b`` (an ``i1``)."""
        return self.fn.value(f"icmp {pred} i64 {a}, {b}", hint)

    def select(self, cond: str, a: str, b: str, hint: str = "t") -> str:
        """``cond ? a : b`` of i64s."""
        return self.fn.value(f"select i1 {cond}, i64 {a}, i64 {b}", hint)

    def min(self, a: str, b: str, hint: str = "min") -> str:
        """The smaller of two signed i64s."""
        return self.select(self.cmp("slt", a, b), a, b, hint)

    def max(self, a: str, b: str, hint: str = "max") -> str:
        """The larger of two signed i64s."""
        return self.select(self.cmp("sgt", a, b), a, b, hint)

    def floordiv(self, a: str, b: int, hint: str = "fdiv") -> str:
        """``floor(a / b)`` for a positive constant ``b`` (``a`` of either sign)."""
        if b == 1:
            return a
        neg = self.cmp("slt", a, "0")
        adj = self.select(neg, str(b - 1), "0")
        return self.op("sdiv", self.sub(a, adj), str(b), hint)

    def ceildiv(self, a: str, b: int, hint: str = "cdiv") -> str:
        """``ceil(a / b)`` for a positive constant ``b`` (``a`` of either sign)."""
        if b == 1:
            return a
        return self.sub("0", self.floordiv(self.sub("0", a), b), hint)

    def gep(self, ty: str, base: str, index: str, hint: str = "p") -> str:
        """``&base[index]`` for elements of type ``ty``."""
        return self.fn.value(f"getelementptr inbounds {ty}, ptr {base}, i64 {index}", hint)

    def load(self, ty: str, ptr: str, hint: str = "v") -> str:
        """``*ptr`` as ``ty``."""
        return self.fn.value(f"load {ty}, ptr {ptr}", hint)

    # -- control flow -----------------------------------------------------------------
    def loop(
        self,
        lo: str,
        hi: str,
        body: Callable[[str], None],
        hint: str = "i",
        step: str = "1",
        meta: str = "",
    ) -> None:
        """``for (i = lo; i < hi; i += step) body(i)`` (nothing when ``lo >= hi``);
        ``meta``: the loop's ``!llvm.loop`` metadata node (see :meth:`no_unroll`)."""
        fn = self.fn
        head, latch, done = fn.label(f"{hint}.body"), fn.label(f"{hint}.latch"), fn.label(hint)
        pre = fn.block
        fn.cond_br(self.cmp("slt", lo, hi), head, done)
        fn.start_block(head)
        i = fn.fresh(hint)
        nxt = fn.fresh(f"{hint}.next")
        fn.add(f"{i} = phi i64 [ {lo}, %{pre} ], [ {nxt}, %{latch} ]")
        body(i)
        fn.br(latch)
        fn.start_block(latch)
        fn.add(f"{nxt} = add nsw i64 {i}, {step}")
        more = self.cmp("slt", nxt, hi)
        loop_meta = f", !llvm.loop {meta}" if meta else ""
        fn.terminate(f"br i1 {more}, label %{head}, label %{done}{loop_meta}")
        fn.start_block(done)

    @staticmethod
    def no_unroll(module: ModuleWriter) -> str:
        """A fresh ``!llvm.loop`` node telling LLVM not to unroll the loop (a small
        constant trip count around a vectorized loop would otherwise multiply it)."""
        off = module.metadata('!"llvm.loop.unroll.disable"')
        return module.metadata(f"SELF, {off}", distinct=True)

    @staticmethod
    def tail_folded(module: ModuleWriter) -> str:
        """A fresh ``!llvm.loop`` node asking LLVM to vectorize the loop with its tail
        folded into masked vector operations (a short loop, such as a row of a small
        image, would otherwise spend most of its time in the scalar remainder)."""
        on = module.metadata('!"llvm.loop.vectorize.enable", i1 true')
        fold = module.metadata('!"llvm.loop.vectorize.predicate.enable", i1 true')
        return module.metadata(f"SELF, {on}, {fold}", distinct=True)

    def when(self, cond: str, then: Callable[[], None], hint: str = "if") -> None:
        """``if (cond) then()``."""
        fn = self.fn
        yes, done = fn.label(f"{hint}.then"), fn.label(f"{hint}.end")
        fn.cond_br(cond, yes, done)
        fn.start_block(yes)
        then()
        fn.br(done)
        fn.start_block(done)

    def branch(
        self, cond: str, then: Callable[[], None], other: Callable[[], None], hint: str = "if"
    ) -> None:
        """``if (cond) then() else other()``."""
        fn = self.fn
        yes, no, done = fn.label(f"{hint}.then"), fn.label(f"{hint}.else"), fn.label(f"{hint}.end")
        fn.cond_br(cond, yes, no)
        fn.start_block(yes)
        then()
        fn.br(done)
        fn.start_block(no)
        other()
        fn.br(done)
        fn.start_block(done)

    def fail_unless(self, cond: str, status: int, hint: str = "ok") -> None:
        """Return ``i32 status`` unless ``cond`` holds (then continue in a new block)."""
        fn = self.fn
        ok, bad = fn.label(hint), fn.label(f"bad{status}")
        fn.cond_br(cond, ok, bad)
        fn.start_block(bad)
        fn.terminate(f"ret i32 {status}")
        fn.start_block(ok)

    def any_of(self, conds: list[str]) -> str:
        """The ``or`` of ``i1`` values (``false`` for none)."""
        out = "false"
        for c in conds:
            out = c if out == "false" else self.fn.value(f"or i1 {out}, {c}", "any")
        return out

    def all_of(self, conds: list[str]) -> str:
        """The ``and`` of ``i1`` values (``true`` for none)."""
        out = "true"
        for c in conds:
            out = c if out == "true" else self.fn.value(f"and i1 {out}, {c}", "all")
        return out
