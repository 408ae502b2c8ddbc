"""The benchmark script's command line (``bench/run.py``): workload selection and its errors."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import run  # noqa: E402

TINY = ["--threads", "1", "--scale", str(1 / 512), "--rounds", "1", "--repeat", "1"]


def test_a_workload_subset_runs_only_those_rows(capsys: pytest.CaptureFixture[str]) -> None:
    """``--workloads`` runs the named workloads only; with geode and numpy each row has a
    speedup and a roofline percentage."""
    argv = TINY + ["--systems", "geode,numpy", "--workloads", "rmsnorm", "--no-compile-times"]
    assert run.main(argv) == 0
    out = capsys.readouterr().out
    rows = [ln for ln in out.splitlines() if re.match(r"^[a-z_]+\s+[\d.]+ms", ln)]
    assert [r.split()[0] for r in rows] == ["rmsnorm"], out
    assert re.search(r"rmsnorm\s+\S+ms\s+\S+ms\s+\d+\.\d\dx\s+\d+%", rows[0]), rows[0]
    assert "geometric mean speedup" in out


def test_geode_alone_still_reports_the_roofline(capsys: pytest.CaptureFixture[str]) -> None:
    """Without another system there is no speedup, but the roofline column is filled."""
    argv = TINY + ["--systems", "geode", "--workloads", "softmax", "--no-compile-times"]
    assert run.main(argv) == 0
    out = capsys.readouterr().out
    assert re.search(r"softmax\s+\S+ms\s+-\s+\d+%", out), out
    assert "geometric mean" not in out


def test_an_unknown_workload_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        run.main(TINY + ["--workloads", "rmsnorm,lstm"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "unknown workload(s) ['lstm']" in err and "lstm_gates" in err
