"""The device calibration's kernels (:func:`geode.costmodel.device.set_kernel_provider`)
compiled by the LLVM backend, so measuring a machine needs no numba.

- ``tiny(a, b, c)``: ``c[0] = a[0] + b[0]`` (the cost of calling a kernel);
- ``compute(x, out, reps, mode)``: ``reps`` passes over ``x`` of 16 dependent
  multiply-adds per element (mode 0, vectorized: the FMA peak) or of ``exp`` (mode 1:
  vmath's), compiled with fast-math like the numba version;
- ``pcopy(src, dst)``: a parallel copy on the native thread pool (compiled on its first
  call: only the full calibration runs it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from geode.codegen import ast as A

__all__ = ["kernels"]


def _loop_kernel(name: str, value: Callable[[A.Expr], A.Expr], reps: bool) -> A.Kernel:
    """``out[i] = value(x[i])`` over ``N`` elements, ``R`` times when ``reps``."""
    n = A.Var("N")
    xi = A.Load("x", (A.Var("vi"),))
    blk = A.Block(
        "b", [A.IterVar("vi", n)], [A.Var("i")], [A.Store("out", (A.Var("vi"),), value(xi))]
    )
    body: list[A.Stmt] = [A.For("i", n, [blk], A.ForKind.VECTORIZED)]
    dims = ["N"]
    if reps:
        body = [A.For("r", A.Var("R"), body)]
        dims.append("R")
    return A.Kernel(
        name, [A.Buffer("x", "float32", (n,))], [A.Buffer("out", "float32", (n,))], dims, body
    )


def _fma_chain(v: A.Expr) -> A.Expr:
    acc = v
    for _ in range(16):
        acc = A.Bin("+", A.Bin("*", acc, v), A.Const(0.5, "float32"))
    return acc


def kernels() -> dict[str, Callable[..., Any]]:
    """Compile the calibration kernels (see the module docstring)."""
    from geode.codegen.backends.llvm.kernel import compile_kernel

    one = A.Const(1)
    tiny_k = A.Kernel(
        "calib_tiny",
        [A.Buffer("a", "float32", (A.Const(8),)), A.Buffer("b", "float32", (A.Const(8),))],
        [A.Buffer("c", "float32", (A.Const(8),))],
        [],
        [
            A.For(
                "i",
                one,
                [
                    A.Store(
                        "c",
                        (A.Const(0),),
                        A.Bin("+", A.Load("a", (A.Const(0),)), A.Load("b", (A.Const(0),))),
                    )
                ],
            )
        ],
    )
    tiny = compile_kernel(tiny_k)
    fma = compile_kernel(_loop_kernel("calib_fma", _fma_chain, reps=True), fastmath=True)
    exp = compile_kernel(
        _loop_kernel("calib_exp", lambda v: A.Un("exp", v), reps=True), fastmath=True
    )
    n = A.Var("N")
    copy_k = A.Kernel(
        "calib_pcopy",
        [A.Buffer("src", "float32", (n,))],
        [A.Buffer("dst", "float32", (n,))],
        ["N"],
        [
            A.For(
                "i",
                n,
                [
                    A.Block(
                        "c",
                        [A.IterVar("vi", n)],
                        [A.Var("i")],
                        [A.Store("dst", (A.Var("vi"),), A.Load("src", (A.Var("vi"),)))],
                    )
                ],
                A.ForKind.PARALLEL,
            )
        ],
    )
    copy: list = []  # compiled on first use: the quick calibration runs no parallel copy

    def compute(x: np.ndarray, out: np.ndarray, reps: int, mode: int) -> None:
        (fma if mode == 0 else exp)(x, out, x.shape[0], int(reps))

    def pcopy(src: np.ndarray, dst: np.ndarray) -> None:
        if not copy:
            copy.append(compile_kernel(copy_k))
        copy[0](src, dst, src.shape[0])

    return {"tiny": tiny, "compute": compute, "pcopy": pcopy}
