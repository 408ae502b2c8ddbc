"""onnxruntime in a worker process of its own, timed in blocks on request.

Run in geode's process, onnxruntime's intra-op workers keep spinning after each of its
calls (its default), and they spin on the cores geode's next calls want: measured on two
cores, a CNN's geode call took 39.5 ms alone and 45.3 ms after onnxruntime's calls, and
an LSTM's 3.05 ms against 3.50 ms (``docs/performance.md``). Turning the spinning off
would charge onnxruntime a wake-up on every short call instead. :class:`IsolatedOrt`
keeps each system in its own process, each with its own defaults: the session lives in
a spawned worker, and the interleaved rounds of :func:`geode.benchmark.interleave` ask it
for a block of calls (timed there, its median sent back) while geode's process waits
idle on the pipe, so the rounds still alternate and the per-round ratios still cancel
the machine's drift.

The spinning goes on after a block too: measured, onnxruntime's worker process used
about 40 ms of CPU after each block of Llama MLP calls (8 x 8x256x256), longer than the
interleaved rounds' settling sleep (20 ms), so geode's next block started on one and a
half cores. :meth:`IsolatedOrt.ask` therefore returns once the worker is quiet
(:func:`wait_quiet`: its threads' CPU time grew by less than :data:`QUIET_SHARE` of a core
in :data:`QUIET_WINDOWS` windows of :data:`QUIET_WINDOW_S` in a row, at most
:data:`QUIET_MAX_S`; ``quiet_s`` sums the waits).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from geode.errors import GeodeError

__all__ = ["QUIET_MAX_S", "IsolatedOrt", "RemoteRunner", "process_cpu_s", "wait_quiet"]

#: the worker counts as quiet once its threads used less than this share of one core in
#: each of :data:`QUIET_WINDOWS` windows of :data:`QUIET_WINDOW_S` seconds in a row (a
#: spinning thread that other processes keep off the cores for one window is not quiet)
QUIET_SHARE = 0.1
QUIET_WINDOW_S = 0.005
QUIET_WINDOWS = 4
#: the longest wait for a quiet worker (seconds)
QUIET_MAX_S = 0.5


def process_cpu_s(pid: int) -> float | None:
    """Seconds of CPU all threads of process ``pid`` have run (Linux's
    ``/proc/<pid>/task/*/schedstat``), or None where that cannot be read."""
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat", encoding="utf-8") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that just exited
    return total * 1e-9


def wait_quiet(
    cpu_s: Callable[[], float | None],
    clock: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], object] = time.sleep,
    window_s: float = QUIET_WINDOW_S,
    share: float = QUIET_SHARE,
    windows: int = QUIET_WINDOWS,
    max_s: float = QUIET_MAX_S,
) -> float:
    """Wait until ``cpu_s()`` (a process's CPU seconds) grew by less than ``share`` of the
    time in each of ``windows`` windows of ``window_s`` seconds in a row, or ``max_s``
    seconds have passed, or ``cpu_s`` cannot tell (None); returns the seconds waited."""
    t0 = clock()
    before = cpu_s()
    quiet = 0
    while before is not None and quiet < windows and clock() - t0 < max_s:
        w0 = clock()
        sleep(window_s)
        after = cpu_s()
        if after is None:
            break
        quiet = quiet + 1 if after - before < share * (clock() - w0) else 0
        before = after
    return clock() - t0


def _serve(conn: Any, model: str, threads: int) -> None:
    """The worker: one onnxruntime session, answering requests until ``stop``."""
    from geode.benchmark import ort_runner, ort_session

    try:
        t0 = time.perf_counter()
        session = ort_session(model, threads)
        conn.send(("ok", time.perf_counter() - t0))
    except Exception as exc:  # the parent raises it
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    runners: dict[int, Any] = {}
    while True:
        op, *args = conn.recv()
        try:
            if op == "stop":
                return
            if op == "feeds":
                key, feeds = args
                runners[key] = ort_runner(session, feeds)
                t0 = time.perf_counter()
                runners[key]()
                reply: Any = time.perf_counter() - t0
            elif op == "run":
                reply = runners[args[0]]()
            else:  # "block"
                fn, calls = runners[args[0]], args[1]
                times = []
                for _ in range(calls):
                    t0 = time.perf_counter()
                    fn()
                    times.append(time.perf_counter() - t0)
                reply = statistics.median(times)
            conn.send(("ok", reply))
        except Exception as exc:
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


class IsolatedOrt:
    """An onnxruntime session on ``threads`` intra-op threads in a spawned process.
    ``session_s``: its creation time there. Use :meth:`runner` per set of feeds, and
    :meth:`close` (or ``with``) when done."""

    def __init__(self, model: str, threads: int):
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, model, threads), daemon=True)
        self._proc.start()
        child.close()
        self._next = 0
        #: seconds spent waiting for the worker to go quiet after its answers
        self.quiet_s = 0.0
        try:
            self.session_s: float = self._reply()
        except BaseException:
            self.close()
            raise

    def _reply(self) -> Any:
        status, value = self._conn.recv()
        if status != "ok":
            raise GeodeError(f"onnxruntime's worker process: {value}")
        return value

    def ask(self, *request: Any) -> Any:
        """Send ``request`` to the worker; its answer (its error raised here), once the
        worker is quiet (:func:`wait_quiet`)."""
        self._conn.send(request)
        try:
            return self._reply()
        finally:
            pid = self._proc.pid
            if pid is not None:
                self.quiet_s += wait_quiet(lambda: process_cpu_s(pid))

    def runner(self, feeds: Mapping[str, np.ndarray]) -> RemoteRunner:
        """The session's calls on ``feeds`` (sent to the worker once; the first call is
        made there and timed: ``RemoteRunner.first_s``)."""
        key, self._next = self._next, self._next + 1
        first = self.ask("feeds", key, dict(feeds))
        return RemoteRunner(self, key, first)

    def close(self) -> None:
        """Stop the worker."""
        if self._proc.is_alive():
            with contextlib.suppress(OSError):  # the worker is already gone
                self._conn.send(("stop",))
            self._proc.join(5)
            if self._proc.is_alive():
                self._proc.kill()
        self._conn.close()

    def __enter__(self) -> IsolatedOrt:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RemoteRunner:
    """One set of feeds in the worker: calling it runs the session once there and returns
    the outputs; :meth:`block` times ``calls`` calls there (their median, seconds)."""

    def __init__(self, owner: IsolatedOrt, key: int, first_s: float):
        self._owner, self._key = owner, key
        self.first_s = first_s

    def __call__(self) -> dict[str, np.ndarray]:
        return self._owner.ask("run", self._key)

    def block(self, calls: int) -> float:
        """The median seconds of ``calls`` calls, timed in the worker."""
        return self._owner.ask("block", self._key, calls)
