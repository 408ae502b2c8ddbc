"""``python -m geode.fuzz`` (geode/fuzz/__main__.py) and the worker process that checks
cases in isolation (geode/fuzz/executors.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from geode.fuzz import Case, DimSpec, FuzzConfig, InputSpec, NodeSpec, Outcome, run_fuzz
from geode.fuzz.__main__ import main
from geode.fuzz.executors import IsolatedExecutor, WorkerPool
from geode.fuzz.reproducer import write_reproducer

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("fuzz_cli_cache"))


def _exp_case() -> Case:
    feeds = [{"x": np.linspace(-1, 1, 5).astype(np.float32)}]
    return Case(
        4, 2, [DimSpec("N", True, [5])], [InputSpec("x", ["N"], "float32")],
        [NodeSpec("Exp", ["x"], {}, "y")], ["y"], feeds,
    )  # fmt: skip


def test_the_command_prints_speed_seed_and_counts(capsys, tmp_path, cache_dir):
    args = ["--n", "3", "--seed", "5", "--no-isolate", "--cache-dir", cache_dir]
    assert main([*args, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "seed 5: 3 graphs" in out and "graphs/s" in out
    assert "passed 3, rejected-clean 0, failed 0" in out


def test_the_time_budget_stops_the_run(capsys, cache_dir):
    args = ["--n", "1000", "--seed", "5", "--no-isolate", "--cache-dir", cache_dir]
    assert main([*args, "--time-budget", "0.5"]) == 0
    captured = capsys.readouterr()
    assert "time budget of 0.5 s reached" in captured.err
    checked = int(re.search(r"seed 5: (\d+) graphs", captured.out).group(1))
    assert 1 <= checked < 1000


def test_bad_options_are_refused(capsys):
    assert main(["--n", "-1"]) == 2
    assert "--n must be >= 0" in capsys.readouterr().err
    assert main(["--max-nodes", "0"]) == 2
    assert main(["--replay", "/nonexistent/folder"]) == 2
    assert "not a geode fuzz reproducer" in capsys.readouterr().err
    assert main(["--jobs", "0"]) == 2
    assert "--jobs must be >= 1" in capsys.readouterr().err
    assert main(["--jobs", "2", "--no-isolate"]) == 2
    assert "drop --no-isolate" in capsys.readouterr().err


def test_replay_checks_a_reproducer_again(capsys, tmp_path):
    folder = write_reproducer(tmp_path, _exp_case(), Outcome("fail", "mismatch:float32", "m"))
    assert main(["--replay", str(folder), "--no-isolate"]) == 0
    assert capsys.readouterr().out.startswith(f"{folder}: pass")


def test_the_command_runs_in_a_worker_process(tmp_path):
    """As a user runs it: a subprocess, cases checked in a spawned worker."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "geode.fuzz", "--n", "1", "--seed", "9", "--out", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "seed 9: 1 graphs" in done.stdout


class _KillsTheWorker:
    """Unpickled in the worker, it ends that process at once (a stand-in for a kernel
    that crashes it)."""

    def __reduce__(self):
        return (os._exit, (3,))


@pytest.mark.slow  # a worker pool killed and restarted: about 3 s
def test_a_worker_that_dies_is_a_failure_and_is_replaced(cache_dir):
    executor = IsolatedExecutor(cache_dir, recycle=10, timeout=120)
    try:
        dead = executor.check_case(_KillsTheWorker())
        assert dead.failed and dead.kind == "crash:process", dead
        assert "exit code 3" in dead.message
        again = executor.check_case(_exp_case())  # a fresh worker answers
        assert again.status == "pass", again
        outcome, case = executor.check_index(3, 0, 8)  # generated in the worker
        assert outcome.status == "pass" and (case.seed, case.index) == (3, 0)
    finally:
        executor.close()


def _digest(report) -> tuple:
    """Everything a run found, whatever order its cases finished in."""
    failures = [(f.case.index, f.outcome.kind) for f in report.failures]
    return (
        report.checked,
        dict(report.counts),
        report.fallbacks,
        report.noisy,
        report.constrained,
        report.refused_nodes,
        failures,
    )


def test_jobs_give_the_results_of_one_process(tmp_path, cache_dir):
    """Cases depend only on (seed, index): two workers find what one process finds."""
    common = {"n": 12, "seed": 5, "out": str(tmp_path), "cache_dir": cache_dir}
    one = run_fuzz(FuzzConfig(isolate=False, **common), log=lambda _: None)
    two = run_fuzz(FuzzConfig(jobs=2, **common), log=lambda _: None)
    assert _digest(two) == _digest(one)
    assert two.counts["pass"] >= 9, two.summary()


@pytest.mark.slow  # waits out a hung worker's timeout: about 3 s
def test_a_pool_worker_that_hangs_is_a_failure_and_is_replaced(cache_dir):
    pool = WorkerPool(cache_dir, jobs=2, recycle=10, timeout=0.01)
    try:
        # no worker answers in 10 ms (starting one takes longer): each case is a hang
        hung = list(pool.check_indices(3, range(3), 8, lambda: False))
        assert sorted(case.index for _, case in hung) == [0, 1, 2]
        assert all(o.failed and o.kind == "hang" for o, _ in hung), hung
        assert all(case.nodes for _, case in hung)  # the case made again, to shrink
        pool.timeout = 600.0
        for w in pool.workers:
            w.timeout = 600.0
        done = list(pool.check_indices(3, [0, 1, 2], 8, lambda: False))
        assert sorted(case.index for _, case in done) == [0, 1, 2]
        assert all(o.status == "pass" for o, _ in done), done
        # nothing starts once stop() holds
        assert list(pool.check_indices(3, range(5), 8, lambda: True)) == []
    finally:
        pool.close()
