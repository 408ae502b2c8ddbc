"""A fuzz run: check ``n`` cases of one seed, shrink the failures, write reproducers.

:func:`run_fuzz` checks cases 0..n-1 of the seed (on ``jobs`` worker processes at
once; a case depends only on its seed and index, so the outcome does not depend on
``jobs``), stopping early at the time budget, counts outcomes, then shrinks failures (distinct kinds first, up to
``max_shrink`` of them) and writes one reproducer folder per failure (shrunk or
not) under ``out``. The kernel cache goes to a temporary folder unless
``cache_dir`` is given, so a run never fills the user's cache.
"""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from geode.fuzz.build import FuzzError
from geode.fuzz.executors import InProcessExecutor, IsolatedExecutor, WorkerPool
from geode.fuzz.reproducer import load_case, write_reproducer
from geode.fuzz.runner import Outcome
from geode.fuzz.shrink import shrink, size_of
from geode.fuzz.spec import Case

#: the statuses a case can end with, in report order
STATUSES = ("pass", "rejected", "undefined", "invalid", "fail")


@dataclass
class FuzzConfig:
    """Options of one fuzz run (``python -m geode.fuzz --help`` describes them)."""

    n: int = 1000
    seed: int = 0
    out: str | None = None
    max_nodes: int = 8
    time_budget: float | None = None
    isolate: bool = True
    max_shrink: int = 50
    shrink_checks: int = 400
    shrink_seconds: float = 120.0
    cache_dir: str | None = None
    recycle: int = 300
    timeout: float = 300.0
    #: check only these case indices (to rerun a few cases of a seed), not 0..n-1
    only: tuple[int, ...] = ()
    #: worker processes checking cases at once (isolated runs only)
    jobs: int = 1

    def validate(self) -> None:
        """FuzzError naming the first option out of range."""
        if self.n < 0:
            raise FuzzError(f"--n must be >= 0, got {self.n}")
        if self.jobs < 1:
            raise FuzzError(f"--jobs must be >= 1, got {self.jobs}")
        if self.jobs > 1 and not self.isolate:
            raise FuzzError("--jobs above 1 checks in worker processes: drop --no-isolate")
        if self.max_nodes < 1:
            raise FuzzError(f"--max-nodes must be >= 1, got {self.max_nodes}")
        if self.time_budget is not None and self.time_budget <= 0:
            raise FuzzError(f"--time-budget must be > 0 seconds, got {self.time_budget}")
        if self.max_shrink < 0:
            raise FuzzError(f"--max-shrink must be >= 0, got {self.max_shrink}")


@dataclass
class Failure:
    """One failing case: its outcome, the case before and after shrinking, its folder."""

    outcome: Outcome
    case: Case
    shrunk: Case | None = None
    checks: int = 0
    path: Path | None = None

    @property
    def nodes(self) -> int:
        """Nodes of the reported case (shrunk when it was)."""
        return size_of(self.shrunk or self.case)[0]


@dataclass
class FuzzReport:
    """What a run found."""

    config: FuzzConfig
    checked: int = 0
    seconds: float = 0.0
    shrink_seconds: float = 0.0
    counts: Counter = field(default_factory=Counter)
    failures: list[Failure] = field(default_factory=list)
    fallbacks: int = 0
    #: why groups fell back to AICPU (digits blanked) -> how many times
    fallback_reasons: Counter = field(default_factory=Counter)
    noisy: int = 0
    constrained: int = 0
    refused_nodes: dict[str, int] = field(default_factory=dict)

    @property
    def graphs_per_second(self) -> float:
        """Cases checked per second of checking (shrinking excluded)."""
        return self.checked / self.seconds if self.seconds > 0 else 0.0

    @property
    def failed(self) -> int:
        """How many cases failed."""
        return self.counts["fail"]

    def summary(self) -> str:
        """The text ``python -m geode.fuzz`` prints at the end."""
        c = self.counts
        refused = sum(self.refused_nodes.values())
        lines = [
            f"geode.fuzz: seed {self.config.seed}: {self.checked} graphs in {self.seconds:.1f} s "
            f"({self.graphs_per_second:.2f} graphs/s)",
            f"  passed {c['pass']}, rejected-clean {c['rejected']}, failed {c['fail']} "
            f"(undefined behaviour skipped {c['undefined']}, nodes refused while building "
            f"{refused}, groups falling back to AICPU {self.fallbacks}, outputs within "
            f"rounding noise {self.noisy}, runs refused by compiled input constraints "
            f"{self.constrained})",
        ]
        if refused:
            by_op = ", ".join(f"{op} {k}" for op, k in sorted(self.refused_nodes.items()))
            lines.append(f"  nodes refused while building: {by_op}")
        for reason, k in self.fallback_reasons.most_common(5):
            lines.append(f"  fallback x{k}: {reason}")
        if self.failures:
            lines.append(f"  failures (shrinking took {self.shrink_seconds:.1f} s):")
        for f in self.failures:
            where = f" -> {f.path}" if f.path else ""
            first = f.outcome.message.strip().splitlines()[0][:160] if f.outcome.message else ""
            lines.append(
                f"    case {f.case.index}: {f.outcome.kind} ({f.nodes} nodes){where}\n      {first}"
            )
        return "\n".join(lines)


def _make_executor(config: FuzzConfig, cache_dir: str) -> Any:
    if config.isolate and config.jobs > 1:
        return WorkerPool(cache_dir, config.jobs, config.recycle, config.timeout)
    if config.isolate:
        return IsolatedExecutor(cache_dir, config.recycle, config.timeout)
    return InProcessExecutor(cache_dir)


def _check_all(config: FuzzConfig, executor: Any, report: FuzzReport, log: Callable) -> None:
    start = last = time.monotonic()
    indices = config.only or range(config.n)
    budget_hit = False

    def stop() -> bool:
        """Whether the time budget is spent (no further case is started)."""
        nonlocal budget_hit
        budget = config.time_budget
        budget_hit = budget_hit or (budget is not None and time.monotonic() - start >= budget)
        return budget_hit

    for outcome, case in executor.check_indices(config.seed, indices, config.max_nodes, stop):
        report.checked += 1
        report.counts[outcome.status] += 1
        report.fallbacks += outcome.fallbacks
        for reason in outcome.fallback_reasons:
            report.fallback_reasons[_reason_key(reason)] += 1
        report.noisy += outcome.noisy
        report.constrained += outcome.constrained
        if outcome.failed:
            report.failures.append(Failure(outcome, case))
        now = time.monotonic()
        if now - last >= 30:
            last = now
            c = report.counts
            log(
                f"geode.fuzz: {report.checked}/{len(indices)} graphs, {report.checked / (now - start):.2f}"
                f"/s: passed {c['pass']}, rejected {c['rejected']}, failed {c['fail']}"
            )
    if budget_hit:
        log(
            f"geode.fuzz: time budget of {config.time_budget:g} s reached after "
            f"{report.checked} graphs"
        )
    report.seconds = time.monotonic() - start
    report.failures.sort(key=lambda f: f.case.index)  # finishing order varies with jobs
    report.refused_nodes = dict(executor.stats.refused)


def _reason_key(reason: str) -> str:
    """A fallback reason without its group number and sizes (so alike ones count together)."""
    return re.sub(r"\d+", "#", reason.split(" falls back to AICPU: ")[-1])[:160]


def _shrink_order(failures: list[Failure]) -> list[Failure]:
    """Distinct kinds first (the first case of each kind), then the rest."""
    seen: set[str] = set()
    first, rest = [], []
    for f in failures:
        (rest if f.outcome.kind in seen else first).append(f)
        seen.add(f.outcome.kind)
    return first + rest


def _shrink_all(config: FuzzConfig, executor: Any, report: FuzzReport, log: Callable) -> None:
    start = time.monotonic()
    for f in _shrink_order(report.failures)[: config.max_shrink]:
        kind = f.outcome.kind

        def still_fails(cand: Case, kind: str = kind) -> bool:
            """Whether ``cand`` fails the way the original case did."""
            out = executor.check_case(cand)
            return out.failed and out.kind == kind

        f.shrunk, f.checks = shrink(
            f.case, still_fails, config.shrink_checks, config.shrink_seconds
        )
        final = executor.check_case(f.shrunk)
        if final.failed and final.kind == kind:
            f.outcome = final  # the message of the shrunk case
        log(
            f"geode.fuzz: case {f.case.index} ({kind}) shrunk from {size_of(f.case)[0]} to "
            f"{size_of(f.shrunk)[0]} nodes in {f.checks} checks"
        )
    report.shrink_seconds = time.monotonic() - start


def replay(folder: str | Path, isolate: bool = True) -> Outcome:
    """Check the case of a reproducer folder again (in a worker when ``isolate``)."""
    case = load_case(folder)
    cache_dir = tempfile.mkdtemp(prefix="geode-fuzz-cache-")
    executor = _make_executor(FuzzConfig(isolate=isolate), cache_dir)
    try:
        return executor.check_case(case)
    finally:
        executor.close()
        shutil.rmtree(cache_dir, ignore_errors=True)


def run_fuzz(config: FuzzConfig, log: Callable[[str], None] | None = None) -> FuzzReport:
    """Run the fuzzer as ``config`` says; returns the report (reproducers written to
    ``config.out`` when failures are found)."""
    config.validate()
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    report = FuzzReport(config)
    own_cache = config.cache_dir is None
    cache_dir = tempfile.mkdtemp(prefix="geode-fuzz-cache-") if own_cache else config.cache_dir
    executor = _make_executor(config, cache_dir)
    try:
        _check_all(config, executor, report, log)
        _shrink_all(config, executor, report, log)
    finally:
        executor.close()
        if own_cache:
            shutil.rmtree(cache_dir, ignore_errors=True)
    if report.failures:
        out = Path(config.out or "geode-fuzz-out")
        for f in report.failures:
            original = f.case if f.shrunk is not None else None
            f.path = write_reproducer(out, f.shrunk or f.case, f.outcome, original, f.checks)
    return report
