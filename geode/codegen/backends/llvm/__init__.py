"""The LLVM backend: scheduled loop AST -> LLVM IR text -> llvmlite (O3, the host CPU)
-> machine code, called through the native runtime.

Rooms, in the order a kernel passes through them:

- :mod:`~.target`: the CPU compiled for (features, preferred vector width);
- :mod:`~.emit`: the module of one kernel (entry, body, streaming body), built from
  :mod:`~.stmts` (loops, blocks, stores, registers, temporaries, NaN guards, prefetch,
  streams), :mod:`~.expr` (expressions with numpy semantics), :mod:`~.values` (typed
  constants and conversions), :mod:`~.parallel` (outlined parallel loops on the native
  thread pool), :mod:`~.ops` (integer helpers), :mod:`~.streams` (the stream copy),
  :mod:`~.vmath` (vectorizable exp/log/tanh/erf/sigmoid/sin/cos), with the pure AST
  facts of :mod:`~.analysis`, the dtype rules of :mod:`~.dtypes` and the text writers
  of :mod:`~.irtext`;
- :mod:`~.jit`: parse, optimize, emit object code, link it into the process;
- :mod:`~.background`: modules compiled ahead on background threads, which a compile
  starts early to warm LLVM up (:mod:`~.warmup`: a throw-away module compiled first);
- :mod:`~.objcache`: object code on disk (a warm start runs no optimizer);
- :mod:`~.kernel`: :func:`compile_kernel` and the callable :class:`LLVMKernel`.

Library routines are written as IR directly, not from a loop AST: :mod:`~.library`
(MatMul through numpy's BLAS) and the convolutions, :mod:`~.conv` (the entry and
:func:`~.conv.conv_kernel`) with :mod:`~.conv_spec`, :mod:`~.conv_gemm` (im2col and
1x1 through BLAS), :mod:`~.conv_depthwise` (direct), the pools, :mod:`~.pool` (the
entry and :func:`~.pool.pool_kernel`) with :mod:`~.pool_spec` and :mod:`~.pool_body`
(direct window reductions), and :mod:`~.irloops` (structured loops over the IR text
writer).

Semantics are those of the numba backend it replaces (numpy's dtype promotion with
weak Python-scalar constants, integer division and shifts as numpy defines them,
NaN-propagating min/max, float16 values carried as float32 and rounded after every
operation, saturating float -> int casts); see :mod:`~.expr` and :mod:`~.stmts`.
Float arithmetic carries the flags of ``config.ACCURACY_POLICY``: ``reassoc contract``,
and ``arcp`` only on a division whose divisor has a finite, normal reciprocal
(:meth:`~.expr.ExprWriter.division_flags`), so a division is IEEE division.
Importing this package imports neither numba nor LLVM.
"""
