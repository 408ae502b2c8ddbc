"""A small writer of hand-written LLVM IR functions (the library kernels' entries: the
batched MatMul, the GEMM with a fused epilogue): numbered temporaries, word loads and
stores, products, conjunctions and early-return status checks."""

from __future__ import annotations

__all__ = ["SsaWriter"]


class SsaWriter:
    """The lines of one hand-written LLVM function, with numbered SSA temporaries
    (``%t1``, ``%t2`` ...), loads and stores of i64 words, and status checks that
    return early."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.n = 0

    def tmp(self, text: str) -> str:
        self.n += 1
        self.lines.append(f"  %t{self.n} = {text}")
        return f"%t{self.n}"

    def emit(self, text: str) -> None:
        self.lines.append(text)

    def word(self, base: str, i: int | str, ty: str = "i64") -> str:
        p = self.tmp(f"getelementptr inbounds {ty}, ptr {base}, i64 {i}")
        return self.tmp(f"load {ty}, ptr {p}")

    def put(self, base: str, i: int | str, value: str, ty: str = "i64") -> None:
        p = self.tmp(f"getelementptr inbounds {ty}, ptr {base}, i64 {i}")
        self.emit(f"  store {ty} {value}, ptr {p}")

    def product(self, values: list[str]) -> str:
        acc = "1"
        for v in values:
            acc = v if acc == "1" else self.tmp(f"mul i64 {acc}, {v}")
        return acc

    def all_of(self, conds: list[str]) -> str:
        ok = "true"
        for c in conds:
            ok = c if ok == "true" else self.tmp(f"and i1 {ok}, {c}")
        return ok

    def op(self, opcode: str, a: str, b: str | int, ty: str = "i64") -> str:
        """``opcode ty a, b`` (``mul``, ``add``, ``icmp ult`` ...) as a new temporary."""
        return self.tmp(f"{opcode} {ty} {a}, {b}")

    def eq(self, a: str, b: str | int) -> str:
        return self.tmp(f"icmp eq i64 {a}, {b}")

    def check(self, cond: str, status: int) -> None:
        self.n += 1
        self.emit(f"  br i1 {cond}, label %ok{self.n}, label %bad{self.n}")
        self.emit(f"bad{self.n}:")
        self.emit(f"  ret i32 {status}")
        self.emit(f"ok{self.n}:")

    def label(self, name: str) -> None:
        self.emit(f"{name}:")
