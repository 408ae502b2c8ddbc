"""Object code compiled ahead, on background threads, while the compile goes on.

A cold compile spends about half its time in LLVM and most of the rest in geode's own
Python (lowering and scheduling the next kernels). LLVM runs without the GIL, so a
module handed to :func:`submit` as soon as its IR is known compiles on another core
while the calling thread schedules the next kernel; :func:`claim` then takes the object
code when the module is linked. Modules compile on several threads at once
(:func:`~geode.codegen.backends.llvm.jit.compile_ir` touches no shared LLVM state): on
:data:`WORKERS` background threads, and on the thread that claims one not done yet,
which compiles queued modules (the one it waits for first, else the largest) instead of
waiting idle. The workers take the largest queued module first too (the small ones are
left to the end, when the threads should finish together). On two cores that is one
background thread while geode's Python runs, two LLVMs at the end.

Modules are known by their cache key (:func:`~geode.codegen.backends.llvm.objcache.module_key`:
the IR text, the target and the optimization level), so a claimed result is the object
code the caller would have compiled itself, on whichever thread. A submitted module
nobody will claim (its kernel failed in a later stage) is cancelled when the compile's
emit stage ends (:func:`cancel`), and at the latest dropped once :data:`MAX_PENDING`
newer ones wait. The threads are daemons started on first use, or earlier by
:func:`warm_up` when a compile that will use LLVM starts: then each first compiles the
throw-away module of :mod:`~geode.codegen.backends.llvm.warmup` (LLVM imported,
initialized, its code paged in) while the calling thread is still reading the model.
A fork waits for the modules being compiled, a warm-up's too
(:mod:`~geode.codegen.backends.llvm.jit`'s fork handler, and it takes LLVM's lock
first); the child starts with nothing pending and no thread (what it claims, it
compiles itself).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from typing import Any

from geode.codegen.backends.llvm import jit

__all__ = [
    "MAX_PENDING",
    "WORKERS",
    "cancel",
    "claim",
    "pending",
    "submit",
    "wait_warm",
    "warm_up",
]

log = logging.getLogger("geode")

#: unclaimed modules kept at most (the oldest is dropped beyond)
MAX_PENDING = 256


def _cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


#: background compile threads: one beside the thread running geode's Python on two
#: cores, two with more (a thread claiming a module compiles too, see :func:`claim`)
WORKERS = 1 if _cores() <= 2 else 2

_Job = tuple[Future, str, Any, int]

_lock = threading.Lock()
_futures: OrderedDict[str, Future[bytes]] = OrderedDict()
_queue: list[_Job] = []
_wake = threading.Condition(_lock)
_threads = 0
#: one event per warm-up :func:`warm_up` started, set when it is over
_warm_events: list[threading.Event] = []


def _run(job: _Job) -> None:
    """Compile one queued module into its future (skipped when it was cancelled)."""
    fut, ir, target, level = job
    if not fut.set_running_or_notify_cancel():
        return
    try:
        fut.set_result(jit.compile_ir(ir, target, level))
    except BaseException as exc:  # noqa: BLE001 - handed to the claimer, raised there
        fut.set_exception(exc)


def _pop_largest() -> _Job:
    """Take the largest queued module (by its IR's length; the oldest of equals) off the
    queue (``_lock`` held, the queue not empty). Largest first: the modules left to the
    end are the small ones, so the threads finish together rather than one thread
    alone on a large module."""
    largest = max(range(len(_queue)), key=lambda i: (len(_queue[i][1]), -i))
    return _queue.pop(largest)


def _warm() -> None:
    """Warm LLVM up on this thread (:func:`~geode.codegen.backends.llvm.warmup.warm`).
    A failure is only logged: the modules' own compiles raise it where they always did."""
    try:
        from geode.codegen.backends.llvm import warmup
        from geode.codegen.backends.llvm.target import host

        warmup.warm(host())
    except Exception as exc:  # noqa: BLE001 - the real compiles report it
        log.debug("LLVM warm-up failed: %s", exc)


def _worker(warmed: threading.Event | None = None) -> None:
    if warmed is not None:
        try:
            _warm()
        finally:
            warmed.set()
    while True:
        with _wake:
            while not _queue:
                _wake.wait()
            job = _pop_largest()
        _run(job)


def _take(wanted: Future) -> _Job | None:
    """A queued module for a claiming thread to compile: ``wanted``'s when it is still
    queued, else the largest; None when none is queued."""
    with _lock:
        for i, job in enumerate(_queue):
            if job[0] is wanted:
                return _queue.pop(i)
        if not _queue:
            return None
        return _pop_largest()


def submit(key: str, ir: str, target: Any, level: int) -> None:
    """Start compiling module ``ir`` (cache key ``key``) for ``target`` at ``level`` on
    a background thread, unless it is already pending."""
    with _wake:
        if key in _futures:
            return
        fut: Future[bytes] = Future()
        _futures[key] = fut
        _queue.append((fut, ir, target, level))
        while len(_futures) > MAX_PENDING:
            _, old = _futures.popitem(last=False)
            old.cancel()  # a queued one is skipped; a running one finishes unclaimed
        if _threads < WORKERS:
            _start_worker()
        _wake.notify()


def _start_worker(warmed: threading.Event | None = None) -> None:
    """Start one more background thread (``_lock`` held); with ``warmed``, it warms LLVM
    up first and then sets it."""
    global _threads
    name = f"geode-llvm-{_threads}"
    threading.Thread(target=_worker, args=(warmed,), name=name, daemon=True).start()
    _threads += 1


def warm_up() -> bool:
    """Start the background threads now, each warming LLVM up before it takes a module
    (:mod:`~geode.codegen.backends.llvm.warmup`), unless some are running already (LLVM
    is in use). For a compile that will compile modules, as it starts: LLVM's first-use
    costs are then paid on the other cores while the caller reads and plans the model.
    Returns whether it started them; never raises (a broken LLVM is reported by the
    compiles that need it)."""
    with _lock:
        if _threads:
            return False
        for _ in range(WORKERS):
            warmed = threading.Event()
            try:
                _start_worker(warmed)
            except RuntimeError as exc:  # no thread to be had: the compile goes on without
                log.debug("LLVM warm-up not started: %s", exc)
                return False
            _warm_events.append(warmed)
    return True


def wait_warm(timeout: float | None = None) -> bool:
    """Wait until the warm-ups :func:`warm_up` started are over (at most ``timeout``
    seconds); whether they are."""
    with _lock:
        events = list(_warm_events)
    deadline = None if timeout is None else time.monotonic() + timeout
    for event in events:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not event.wait(left):
            return False
    return True


def claim(key: str) -> bytes | None:
    """The object code of the module submitted under ``key`` (its compile's error is
    raised here), or None if none was submitted. Until it is done, the calling thread
    compiles queued modules, this one first, rather than wait."""
    with _lock:
        fut = _futures.pop(key, None)
    if fut is None or fut.cancelled():
        return None
    while not fut.done():
        job = _take(fut)
        if job is None:
            break  # every queued module is being compiled: wait for this one
        _run(job)
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
    global _lock, _wake, _threads
    _lock = threading.Lock()
    _wake = threading.Condition(_lock)
    _threads = 0
    _warm_events.clear()
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
