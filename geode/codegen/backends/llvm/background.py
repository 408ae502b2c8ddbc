"""Object code compiled ahead, on one background thread, while the compile goes on.

A cold compile spends about half its time in LLVM and most of the rest in geode's own
Python (lowering and scheduling the next kernels). LLVM runs without the GIL, so a
module handed to :func:`submit` as soon as its IR is known compiles on the second core
while the calling thread schedules the next kernel; :func:`claim` then takes the object
code (waiting for it if need be) when the module is linked. LLVM's own calls stay
serialized (:data:`~geode.codegen.backends.llvm.jit.LOCK`): one background thread is
all the overlap there is.

Modules are known by their cache key (:func:`~geode.codegen.backends.llvm.kernel.module_key`:
the IR text, the target and the optimization level), so a claimed result is the object
code the caller would have compiled itself. A submitted module nobody will claim (its
kernel failed in a later stage) is cancelled when the compile's emit stage ends
(:func:`cancel`), and at the latest dropped once :data:`MAX_PENDING` newer ones wait. The thread
is a daemon started on first use. A fork waits for the module being compiled (it takes
LLVM's lock first); the child starts with nothing pending and no thread (what it claims,
it compiles itself).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from concurrent.futures import Future
from typing import Any

from geode.codegen.backends.llvm import jit

__all__ = ["MAX_PENDING", "cancel", "claim", "pending", "submit"]

#: unclaimed modules kept at most (the oldest is dropped beyond)
MAX_PENDING = 256

_lock = threading.Lock()
_futures: OrderedDict[str, Future[bytes]] = OrderedDict()
_queue: list[tuple[Future[bytes], str, Any, int]] = []
_wake = threading.Condition(_lock)
_thread: threading.Thread | None = None


def _worker() -> None:
    while True:
        with _wake:
            while not _queue:
                _wake.wait()
            fut, ir, target, level = _queue.pop(0)
        if not fut.set_running_or_notify_cancel():
            continue
        try:
            fut.set_result(jit.compile_ir(ir, target, level))
        except BaseException as exc:  # noqa: BLE001 - handed to the claimer, raised there
            fut.set_exception(exc)


def submit(key: str, ir: str, target: Any, level: int) -> None:
    """Start compiling module ``ir`` (cache key ``key``) for ``target`` at ``level`` on
    the background thread, unless it is already pending."""
    global _thread
    with _wake:
        if key in _futures:
            return
        fut: Future[bytes] = Future()
        _futures[key] = fut
        _queue.append((fut, ir, target, level))
        while len(_futures) > MAX_PENDING:
            _, old = _futures.popitem(last=False)
            old.cancel()  # a queued one is skipped; a running one finishes unclaimed
        if _thread is None:
            _thread = threading.Thread(target=_worker, name="geode-llvm", daemon=True)
            _thread.start()
        _wake.notify()


def claim(key: str) -> bytes | None:
    """The object code of the module submitted under ``key`` (waiting for it; its
    compile's error is raised here), or None if none was submitted."""
    with _lock:
        fut = _futures.pop(key, None)
    if fut is None:
        return None
    if fut.cancelled():
        return None
    return fut.result()


def cancel(key: str) -> None:
    """Forget the module submitted under ``key`` (nothing when none is pending): a queued
    one is never compiled, one being compiled finishes unclaimed. For a kernel whose
    compile stopped before it was linked: its LLVM must not go on after the compile
    returns."""
    with _lock:
        fut = _futures.pop(key, None)
    if fut is not None:
        fut.cancel()


def _before_fork() -> None:
    jit.LOCK.acquire()
    _lock.acquire()


def _after_fork_in_parent() -> None:
    _lock.release()
    jit.LOCK.release()


def _after_fork_in_child() -> None:
    global _lock, _wake, _thread
    _lock = threading.Lock()
    _wake = threading.Condition(_lock)
    _thread = None
    _futures.clear()
    _queue.clear()
    jit.LOCK.release()


os.register_at_fork(
    before=_before_fork,
    after_in_parent=_after_fork_in_parent,
    after_in_child=_after_fork_in_child,
)


def pending() -> int:
    """Modules submitted and not claimed yet."""
    with _lock:
        return len(_futures)
