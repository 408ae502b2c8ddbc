"""Python's cyclic garbage collector held off while a cold compile runs on one core.

A compile that misses the model cache starts with a stretch of single-threaded Python:
the ONNX and sympy imports, the front end, the graph passes, the fusion plan and the
first kernel's schedule; the code generator's background threads have nothing to
compile until that first kernel's module is emitted. Collections in that stretch sit
on the critical path whole: in a cold compile of the BERT layer of ``tests/data``,
some 60 young collections and one full collection of every object the imports made
(0.04-0.07 s of the main thread). :func:`hold` switches the collector off for the
stretch and :func:`release` switches it back on once LLVM has work
(``spine.schedule``, after the first kernel), or when the compile ends, whichever comes
first (:func:`held`).

Released, the collector's first young collection would scan every object the stretch
made (the imports' hundreds of thousands: 30-70 ms of the main thread, which then
schedules and emits the next kernels on the critical path). So :func:`release` freezes
them first (``gc.freeze``: moved aside in O(1), no collection scans them) and the end
of the outermost :func:`held` block thaws them (``gc.unfreeze``: into the oldest
generation, whose next full collection, after the compile, collects the stretch's
garbage). A program that froze objects itself (``gc.get_freeze_count()`` not 0) is
left alone: nothing frozen, nothing thawed; so is a bare :func:`hold` and
:func:`release` (no block to thaw at its end).

Only a collector that is on is held, and only what :func:`hold` switched off is
switched back on: a program that runs with the collector off keeps it off. The
collector is the process's, so other threads' garbage waits for the same stretch (at
most the compile's first part). A program that switches the collector itself from
another thread during that stretch may find it switched on again at its end. A child
forked during the stretch starts with the collector on.
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["held", "hold", "is_held", "release", "thaw"]

_lock = threading.Lock()
#: whether :func:`hold` switched the collector off and nothing switched it back on yet
_held = False
#: whether :func:`release` froze the stretch's objects and nothing thawed them yet
_frozen = False
#: whether the hold is a :func:`held` block's, which thaws at its end (a bare
#: :func:`hold` and :func:`release` freeze nothing: nothing would thaw it)
_block = False


def hold() -> bool:
    """Switch the garbage collector off if it is on and not held already; whether this
    call did (then :func:`release` switches it back on)."""
    global _held
    with _lock:
        if _held or not gc.isenabled():
            return False
        gc.disable()
        _held = True
        return True


def release() -> None:
    """Switch the collector back on if :func:`hold` switched it off (nothing otherwise;
    calling it again is harmless)."""
    global _held, _frozen
    with _lock:
        if _held:
            _held = False
            if _block and not _frozen and gc.get_freeze_count() == 0:
                gc.freeze()  # the stretch's objects out of the young collections' scans
                _frozen = True
            gc.enable()


def thaw() -> None:
    """Put back what :func:`release` froze (``gc.unfreeze``: into the oldest generation,
    collected by its next full collection); nothing otherwise."""
    global _frozen
    with _lock:
        if _frozen:
            _frozen = False
            gc.unfreeze()


def is_held() -> bool:
    """Whether the collector is off because :func:`hold` switched it off."""
    return _held


def _after_fork_in_child() -> None:
    """A child forked while a compile held the collector runs no such compile: its
    collector is switched back on (and the lock made anew: another thread may have held
    it at the fork)."""
    global _held, _frozen, _block, _lock
    _lock = threading.Lock()
    _block = False
    if _frozen:
        _frozen = False
        gc.unfreeze()
    if _held:
        _held = False
        gc.enable()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


@contextmanager
def held() -> Iterator[None]:
    """The collector held (:func:`hold`) inside the block, released at its end if this
    block took the hold and nothing released it earlier, and what the release froze
    thawed (:func:`thaw`; nested blocks leave both to the outermost)."""
    global _block
    took = hold()
    _block = _block or took
    try:
        yield
    finally:
        if took:
            release()
            thaw()
            _block = False
