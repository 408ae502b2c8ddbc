"""Where cases are checked: in this process, or in a worker process that may die.

A native kernel that writes out of bounds can kill the process that runs it, and
geode never frees compiled kernels, so a long run is better off in a worker:
:class:`IsolatedExecutor` checks cases in a child process (spawned, one geode
session, restarted every ``recycle`` cases), reports a child that dies as a
``crash:process`` failure and one that stops answering for ``timeout`` seconds as a
``hang``, and starts a fresh child. :class:`InProcessExecutor` checks in this
process (what tests use: a monkeypatched geode is the one checked).

Both offer ``check_index(seed, index, max_nodes)`` (generate and check) and
``check_case(case)`` (the shrinker's check).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
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

    def close(self) -> None:
        """Free the session."""
        self.checker.session.close()


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

    def _call(self, msg: tuple) -> tuple[Any, Outcome | None]:
        """Send ``msg``; (reply, None), or (None, the failure) when the worker died or hung."""
        if self._proc is None or self._served >= self.recycle:
            self._stop()
            self._start()
        self._served += 1
        try:
            self._conn.send(msg)
            if self._conn.poll(self.timeout):
                return self._conn.recv(), None
            self._stop(kill=True)
            return None, Outcome("fail", "hang", f"no answer in {self.timeout:.0f} s", "run")
        except (EOFError, OSError, ConnectionError):
            self._proc.join(10)
            code = self._proc.exitcode
            self._stop(kill=True)
            return None, Outcome(
                "fail", "crash:process", f"the checking process died (exit code {code})", "run"
            )

    def check_index(self, seed: int, index: int, max_nodes: int) -> tuple[Outcome, Case]:
        """Generate case ``index`` of ``seed`` and check it in the worker."""
        reply, failure = self._call(("index", seed, index, max_nodes))
        if failure is not None:
            return failure, generate_case(seed, index, max_nodes)
        outcome, case, refused = reply
        for op, k in refused.items():
            self.stats.refused[op] = self.stats.refused.get(op, 0) + k
        if case is None:  # passing cases stay in the worker; only their identity is needed
            case = Case(seed, index, [], [], [], [])
        return outcome, case

    def check_case(self, case: Case) -> Outcome:
        """Check a given case in the worker."""
        reply, failure = self._call(("case", case))
        return failure if failure is not None else reply

    def close(self) -> None:
        """Stop the worker."""
        self._stop()
