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
"""

from __future__ import annotations

import contextlib
import multiprocessing
import statistics
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from geode.errors import GeodeError

__all__ = ["IsolatedOrt", "RemoteRunner"]


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
        """Send ``request`` to the worker; its answer (its error raised here)."""
        self._conn.send(request)
        return self._reply()

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
