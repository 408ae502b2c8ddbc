"""The direct conv kernel's work split, shared by the kernel
(``codegen/backends/llvm/conv_direct.py: band_rows``) and the cost model that estimates
what fusing a pool into it recomputes (``compiler/fusion/conv_profit.py``): an item is a
band of output rows (of pooled rows with a pool) of one image and group; bands are cut so
a launch has about :data:`ITEMS_PER_THREAD` items per thread (on more than one thread;
on one, bands only as the budget needs) and an item's scratch stays within
:data:`BAND_BUDGET_BYTES`; the cost model, which does not know the thread count, assumes
:data:`ITEMS_WANTED` (two threads). Plain constants: the kernel's module imports nothing heavy
through this one (``tests/test_lazy_imports.py``).
"""

from __future__ import annotations

__all__ = ["BAND_BUDGET_BYTES", "ITEMS_PER_THREAD", "ITEMS_WANTED"]

#: work items a launch aims for per thread when it runs on more than one (bands are cut so a
#: small batch still feeds every thread; work stealing balances them)
ITEMS_PER_THREAD = 4
#: the items the cost model assumes a launch has (two threads)
ITEMS_WANTED = 2 * ITEMS_PER_THREAD
#: bytes of an item's scratch (its band's input rows, and its conv rows when pooling)
BAND_BUDGET_BYTES = 512 << 10
