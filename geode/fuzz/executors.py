"""Where cases are checked: in this process, or in a worker process that may die.

A native kernel that writes out of bounds can kill the process that runs it, and
geode never frees compiled kernels, so a long run is better off in a worker:
:class:`IsolatedExecutor` checks cases in a child process (spawned, one geode
session, restarted every ``recycle`` cases), reports a child that dies as a
``crash:process`` failure and one that stops answering for ``timeout`` seconds as a
``hang``, and starts a fresh child. :class:`InProcessExecutor` checks in this
process (what tests use: a monkeypatched geode is the one checked).
:class:`WorkerPool` checks on ``jobs`` worker processes at once (each an
:class:`IsolatedExecutor`'s worker): a case depends only on (seed, index), so the
outcomes are those of one worker, in the order the cases finish.

All offer ``check_index(seed, index, max_nodes)`` (generate and check),
``check_indices(seed, indices, max_nodes, stop)`` (many, ``(outcome, case)`` as each
finishes, none started once ``stop()`` holds) and ``check_case(case)`` (the
shrinker's check).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import multiprocessing.connection
import os
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from geode.fuzz.gen_state import GenStats
from geode.fuzz.generator import generate_case
from geode.fuzz.runner import Checker, Outcome
from geode.fuzz.spec import Case
from geode.session import Session


def make_checker(cache_dir: str) -> Checker:
    """A checker with its own geode session writing kernels to ``cache_dir``."""
    return Checker(Session(cache_dir=cache_dir, progress="0"))


class InProcessExecutor:
    """Checks cases in this process."""

    def __init__(self, cache_dir: str):
        self.checker = make_checker(cache_dir)
        self.stats = GenStats()

    def check_index(self, seed: int, index: int, max_nodes: int) -> tuple[Outcome, Case]:
        """Generate case ``index`` of ``seed`` and check it."""
        case = generate_case(seed, index, max_nodes, self.stats)
        return self.checker.check(case), case

    def check_case(self, case: Case) -> Outcome:
        """Check a given case."""
        return self.checker.check(case)

    def check_indices(
        self, seed: int, indices: Iterable[int], max_nodes: int, stop: Callable[[], bool]
    ) -> Iterator[tuple[Outcome, Case]]:
        """Check cases ``indices`` of ``seed`` one after another until ``stop()``."""
        return _one_by_one(self, seed, indices, max_nodes, stop)

    def close(self) -> None:
        """Free the session."""
        self.checker.session.close()


def _one_by_one(
    executor: Any, seed: int, indices: Iterable[int], max_nodes: int, stop: Callable[[], bool]
) -> Iterator[tuple[Outcome, Case]]:
    for index in indices:
        if stop():
            return
        yield executor.check_index(seed, index, max_nodes)


def worker_main(conn: Any, cache_dir: str) -> None:
    """The worker process: answers ``("index", seed, i, max_nodes)`` with (outcome, the
    case when it failed, refused-node counts) and ``("case", case)`` with an outcome,
    until ``("stop",)``."""
    os.environ["GEODE_CACHE_DIR"] = cache_dir
    os.environ.setdefault("GEODE_PROGRESS", "0")
    # groups falling back to AICPU are counted from their CodegenWarnings: no log lines
    logging.getLogger("geode").setLevel(logging.ERROR)
    executor = InProcessExecutor(cache_dir)
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg[0] == "stop":
            return
        if msg[0] == "index":
            executor.stats = GenStats()
            outcome, case = executor.check_index(msg[1], msg[2], msg[3])
            conn.send((outcome, case if outcome.failed else None, executor.stats.refused))
        else:
            conn.send(executor.check_case(msg[1]))


class IsolatedExecutor:
    """Checks cases in a worker process (see the module docstring)."""

    def __init__(self, cache_dir: str, recycle: int = 300, timeout: float = 300.0):
        self.cache_dir = cache_dir
        self.recycle = recycle
        self.timeout = timeout
        self.stats = GenStats()
        self._ctx = mp.get_context("spawn")
        self._proc: Any = None
        self._conn: Any = None
        self._served = 0
        #: when the message being answered was sent (None: nothing pending)
        self.sent_at: float | None = None

    def _start(self) -> None:
        parent, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(
            target=worker_main, args=(child, self.cache_dir), daemon=True
        )
        self._proc.start()
        child.close()
        self._conn = parent
        self._served = 0

    def _stop(self, kill: bool = False) -> None:
        self.sent_at = None
        if self._proc is None:
            return
        if not kill:
            try:
                self._conn.send(("stop",))
                self._proc.join(10)
            except (OSError, EOFError):
                pass
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(10)
        self._conn.close()
        self._proc = self._conn = None

    @property
    def connection(self) -> Any:
        """The pipe to the worker (readable when an answer, or the worker's death, is in)."""
        return self._conn

    def submit(self, msg: tuple) -> None:
        """Send ``msg`` to the worker (started, or restarted every ``recycle`` messages);
        :meth:`receive` takes the answer."""
        if self._proc is None or self._served >= self.recycle:
            self._stop()
            self._start()
        self._served += 1
        self.sent_at = time.monotonic()
        with contextlib.suppress(OSError, ConnectionError):  # died: receive() reports it
            self._conn.send(msg)

    def receive(self) -> tuple[Any, Outcome | None]:
        """The answer to the submitted message: (reply, None), or (None, the failure) when
        the worker died before answering (it is then replaced at the next submit)."""
        try:
            reply = self._conn.recv()
            self.sent_at = None
            return reply, None
        except (EOFError, OSError, ConnectionError):
            self._proc.join(10)
            code = self._proc.exitcode
            self._stop(kill=True)
            return None, Outcome(
                "fail", "crash:process", f"the checking process died (exit code {code})", "run"
            )

    def kill_hung(self) -> Outcome:
        """Kill a worker that did not answer in ``timeout`` seconds; the ``hang`` failure."""
        self._stop(kill=True)
        return Outcome("fail", "hang", f"no answer in {self.timeout:.0f} s", "run")

    def _call(self, msg: tuple) -> tuple[Any, Outcome | None]:
        """Send ``msg``; (reply, None), or (None, the failure) when the worker died or hung."""
        self.submit(msg)
        try:
            answered = self._conn.poll(self.timeout)
        except (EOFError, OSError, ConnectionError):
            answered = True  # receive() sees the death
        if not answered:
            return None, self.kill_hung()
        return self.receive()

    def index_result(
        self, answer: tuple[Any, Outcome | None], seed: int, index: int, max_nodes: int
    ) -> tuple[Outcome, Case]:
        """(outcome, case) of case ``index`` from the worker's answer (the case made again
        here when the worker died or hung; only its identity when it passed)."""
        reply, failure = answer
        if failure is not None:
            return failure, generate_case(seed, index, max_nodes)
        outcome, case, refused = reply
        for op, k in refused.items():
            self.stats.refused[op] = self.stats.refused.get(op, 0) + k
        if case is None:  # passing cases stay in the worker; only their identity is needed
            case = Case(seed, index, [], [], [], [])
        return outcome, case

    def check_index(self, seed: int, index: int, max_nodes: int) -> tuple[Outcome, Case]:
        """Generate case ``index`` of ``seed`` and check it in the worker."""
        answer = self._call(("index", seed, index, max_nodes))
        return self.index_result(answer, seed, index, max_nodes)

    def check_indices(
        self, seed: int, indices: Iterable[int], max_nodes: int, stop: Callable[[], bool]
    ) -> Iterator[tuple[Outcome, Case]]:
        """Check cases ``indices`` of ``seed`` one after another until ``stop()``."""
        return _one_by_one(self, seed, indices, max_nodes, stop)

    def check_case(self, case: Case) -> Outcome:
        """Check a given case in the worker."""
        reply, failure = self._call(("case", case))
        return failure if failure is not None else reply

    def close(self) -> None:
        """Stop the worker."""
        self._stop()


class WorkerPool:
    """Checks cases on ``jobs`` worker processes at once (see the module docstring); the
    shrinker's checks go to the first worker."""

    def __init__(self, cache_dir: str, jobs: int, recycle: int = 300, timeout: float = 300.0):
        self.workers = [IsolatedExecutor(cache_dir, recycle, timeout) for _ in range(jobs)]
        self.timeout = timeout

    @property
    def stats(self) -> GenStats:
        """What generation met, over every worker."""
        total = GenStats()
        for w in self.workers:
            for op, k in w.stats.refused.items():
                total.refused[op] = total.refused.get(op, 0) + k
        return total

    def check_index(self, seed: int, index: int, max_nodes: int) -> tuple[Outcome, Case]:
        """Generate case ``index`` of ``seed`` and check it in the first worker."""
        return self.workers[0].check_index(seed, index, max_nodes)

    def check_indices(
        self, seed: int, indices: Iterable[int], max_nodes: int, stop: Callable[[], bool]
    ) -> Iterator[tuple[Outcome, Case]]:
        """Check cases ``indices`` of ``seed``, one per idle worker, yielding each as it
        finishes; a worker that dies or hangs gives that case's failure and is replaced.
        No case is started once ``stop()`` holds (those running are finished)."""
        todo = iter(indices)
        busy: dict[Any, tuple[IsolatedExecutor, int]] = {}

        def feed(worker: IsolatedExecutor) -> None:
            index = next(todo, None)
            if index is not None and not stop():
                worker.submit(("index", seed, index, max_nodes))
                busy[worker.connection] = (worker, index)

        for worker in self.workers:
            feed(worker)
        while busy:
            oldest = min(w.sent_at or 0.0 for w, _ in busy.values())
            wait = max(0.0, oldest + self.timeout - time.monotonic())
            ready = mp.connection.wait(list(busy), timeout=wait)
            for conn in ready:
                worker, index = busy.pop(conn)
                yield worker.index_result(worker.receive(), seed, index, max_nodes)
                feed(worker)
            now = time.monotonic()
            for conn, (worker, index) in list(busy.items()):
                if conn not in ready and now - (worker.sent_at or now) >= self.timeout:
                    del busy[conn]
                    hung = (None, worker.kill_hung())
                    yield worker.index_result(hung, seed, index, max_nodes)
                    feed(worker)

    def check_case(self, case: Case) -> Outcome:
        """Check a given case in the first worker."""
        return self.workers[0].check_case(case)

    def close(self) -> None:
        """Stop every worker."""
        for w in self.workers:
            w.close()
