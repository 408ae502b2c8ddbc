"""The ``geode`` command as a user runs it: ``python -m geode ...`` in a subprocess.

Every subprocess shares one kernel cache (``GEODE_CACHE_DIR`` in the session's tmp
dir), so a kernel compiled by one command is loaded from disk by the next.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

import geode
from geode import cli, ops
from geode.compiler.frontend.onnx_export import to_onnx

REPO = Path(__file__).resolve().parents[1]
HAVE_ORT = importlib.util.find_spec("onnxruntime") is not None
SUBCOMMANDS = ("run", "bench", "explain", "dump", "cache", "demo", "compile", "tune")


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One kernel cache for every test of the session (shared with test_debug/test_viz)."""
    d = tmp_path_factory.getbasetemp() / "geode_cache"
    d.mkdir(exist_ok=True)
    return d


@pytest.fixture(scope="session")
def env(cache_dir: Path) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("GEODE_")}
    e.update(GEODE_CACHE_DIR=str(cache_dir), GEODE_PROGRESS="0", PYTHONPATH=str(REPO))
    return e


def geode_cmd(
    env: dict[str, str], *args: str, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    """Run ``python -m geode args`` the way a user would."""
    return subprocess.run(
        [sys.executable, "-m", "geode", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
        check=False,
    )


def small_graph() -> geode.Graph:
    """Two outputs from one symbolic-batch input: relu(2x + 1) and its row sums."""
    g = geode.Graph("small")
    x = g.input("x", ["N", 16])
    y = ops.relu(x * 2.0 + 1.0)
    g.output(y, ops.reduce_sum(y, axes=[-1], keepdims=0), names=["y", "s"])
    return g


def small_numpy(x: np.ndarray) -> dict[str, np.ndarray]:
    y = np.maximum(x * 2 + 1, 0)
    return {"y": y, "s": y.sum(-1)}


@pytest.fixture(scope="session")
def onnx_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("models") / "small.onnx"
    onnx.save(to_onnx(small_graph()), str(path))
    return path


@pytest.fixture
def in_process(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process ``cli.main`` calls use the shared cache and draw no progress bars."""
    monkeypatch.setenv("GEODE_CACHE_DIR", str(cache_dir))
    monkeypatch.setenv("GEODE_PROGRESS", "0")


def one_error_line(res: subprocess.CompletedProcess) -> str:
    """The single ``geode: error:`` line of a failed command (and no traceback)."""
    assert res.returncode != 0, res.stdout
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("geode: error: "), res.stderr
    assert "Traceback" not in res.stderr
    return lines[0]


# -- run ----------------------------------------------------------------------------------------
def test_run_onnx_file_with_inputs_and_output_file(env, onnx_file, tmp_path):
    x = np.random.default_rng(3).standard_normal((5, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "out.npz"
    res = geode_cmd(
        env, "run", str(onnx_file), "--input", f"x={tmp_path / 'x.npy'}", "-o", str(out)
    )
    assert res.returncode == 0, res.stderr
    assert "(x: float32[N, 16]) -> (y, s)" in res.stdout
    assert "inputs: x float32[5, 16]" in res.stdout
    assert re.search(
        r"^\s+y\s+float32\[5, 16\]\s+min \S+\s+max \S+\s+mean \S+", res.stdout, re.M
    ), res.stdout
    assert re.search(r"^\s+s\s+float32\[5\]\s+min ", res.stdout, re.M), res.stdout
    assert f"saved 2 output(s) to {out}" in res.stdout
    want = small_numpy(x)
    with np.load(out) as got:
        assert sorted(got.files) == ["s", "y"]
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5)
    m = re.search(r"y\s+float32\[5, 16\]\s+min (\S+)\s+max (\S+)\s+mean (\S+)", res.stdout)
    assert m is not None
    lo, hi, mean = map(float, m.groups())
    assert lo == pytest.approx(want["y"].min(), abs=1e-4)
    assert hi == pytest.approx(want["y"].max(), rel=1e-4)
    assert mean == pytest.approx(want["y"].mean(), rel=1e-3, abs=1e-4)


def test_run_builtin_random_inputs_default_dims_to_one(env):
    res = geode_cmd(env, "run", "builtin:layernorm")
    assert res.returncode == 0, res.stderr
    assert "model builtin:layernorm: (x: float32[N, 768]) -> (y)" in res.stdout
    assert "inputs: x float32[1, 768]" in res.stdout
    assert re.search(r"^\s+y\s+float32\[1, 768\]\s+min ", res.stdout, re.M), res.stdout
    assert "note: symbolic dim(s) N (input 'x') set to 1" in res.stderr


def test_run_shape_sets_symbolic_dims(onnx_file, capsys, in_process):
    assert cli.main(["run", str(onnx_file), "--shape", "x:3,16"]) == 0
    out = capsys.readouterr()
    assert "inputs: x float32[3, 16]" in out.out
    assert re.search(r"^\s+s\s+float32\[3\]", out.out, re.M), out.out
    assert "note:" not in out.err


# -- errors: one line, non-zero exit --------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["run", "no/such/model.onnx"], "no/such/model.onnx: no such file"),
        (["run", "builtin:layernorm", "--shape", "x2x768"], "bad --shape 'x2x768'"),
        (["run", "builtin:layernorm", "--input", "x.npy"], "bad --input 'x.npy'"),
    ],
    ids=["missing-file", "shape-syntax", "input-syntax"],
)
def test_errors_are_one_line(env, args, expected):
    line = one_error_line(geode_cmd(env, *args))
    assert expected in line


def test_existing_output_file_is_not_overwritten(env, tmp_path):
    out = tmp_path / "out.npz"
    out.write_bytes(b"keep me")
    line = one_error_line(geode_cmd(env, "run", "builtin:layernorm", "-o", str(out)))
    assert "file exists (use --force to overwrite)" in line
    assert out.read_bytes() == b"keep me"


def test_errors_in_process(tmp_path, capsys, onnx_file, in_process):
    """More user errors, through ``cli.main`` (the same code the command runs)."""
    cases = [
        (["run", str(tmp_path)], "is a directory, expected an .onnx file"),
        (["run", "builtin:layernorm", "--shape", "x:2,big"], "dims must be integers"),
        (["run", "builtin:layernorm", "--shape", "x:2,-1"], "dims must be >= 0"),
        (
            ["run", "builtin:layernorm", "--input", f"x={tmp_path}"],
            "is a directory, expected a .npy file",
        ),
        (
            ["run", "builtin:layernorm", "--input", f"x={onnx_file}", "--input", f"x={onnx_file}"],
            "--input given twice",
        ),
        (["run", "builtin:nope"], "unknown built-in model 'nope'; choose one of: rmsnorm"),
        (["run", "layernorm"], "write builtin:layernorm"),
        (["run", "builtin:layernorm", "-o", str(tmp_path)], "must end in .npz"),
        (["run", "builtin:layernorm", "-o", str(tmp_path / "nodir" / "x.npz")], "does not exist"),
        (["run", "builtin:layernorm", "-o", str(tmp_path / "d.npz")], "is a directory"),
        (
            ["run", "builtin:layernorm", "--input", f"x={tmp_path / 'missing.npy'}"],
            "missing.npy: no such file",
        ),
        (["run", "builtin:layernorm", "--option", "fusion"], "bad --option 'fusion'"),
        (
            ["bench", "builtin:layernorm", "--option", "num_threads=1"],
            "give the thread count with --threads",
        ),
        (["dump", "builtin:layernorm", "-d", str(onnx_file)], "is not a directory"),
    ]
    (tmp_path / "d.npz").mkdir()
    for argv, expected in cases:
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("geode: error: "), (argv, err)
        assert expected in err[0], (argv, err)
    for argv, expected in [
        (["bench"], "the following arguments are required: MODEL"),
        (["run", "builtin:layernorm", "--repeat", "3"], "unrecognized arguments: --repeat 3"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
    ]:  # argparse's own errors: one line too
        with pytest.raises(SystemExit) as exc:
            cli.main(argv)
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("geode: error: "), (argv, err)
        assert expected in err[0], (argv, err)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["run", "builtin:layernorm", "--seed", "-1"],
            "argument --seed: invalid value '-1': must be >= 0",
        ),
        (
            ["bench", "builtin:layernorm", "--seed", "x"],
            "argument --seed: invalid value 'x': expected an integer",
        ),
        (
            ["bench", "builtin:layernorm", "--rounds", "0"],
            "argument --rounds/--repeat: invalid value '0': must be >= 1",
        ),
        (
            ["bench", "builtin:layernorm", "--threads", "0"],
            "argument --threads: invalid value '0': must be >= 1",
        ),
        (["demo", "--batch", "0"], "argument --batch: invalid value '0': must be >= 1"),
        (["demo", "--batch", "-1"], "argument --batch: invalid value '-1': must be >= 1"),
        (["demo", "--hidden", "0"], "argument --hidden: invalid value '0': must be >= 1"),
        (["demo", "--repeat", "0"], "argument --repeat: invalid value '0': must be >= 1"),
    ],
    ids=[
        "seed-negative",
        "seed-text",
        "bench-rounds-0",
        "bench-threads-0",
        "batch-0",
        "batch-negative",
        "hidden-0",
        "repeat-0",
    ],
)
def test_bad_numbers_are_usage_errors(capsys, argv, expected):
    """Negative seeds, empty demo sizes, zero repeats: argparse's one-line usage error."""
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("geode: error: "), err
    assert expected in err[0], err


def test_inputs_too_large_for_memory_are_user_errors(capsys, in_process, monkeypatch):
    """A shape that cannot fit in memory is refused up front, not an internal error."""
    argv = ["run", "builtin:layernorm", "--shape", "x:99999999999,768"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(
        "geode: error: random input 'x' float32[99999999999, 768] needs 279.4 TiB, "
        "more than this machine's memory ("
    ), err
    assert "choose a smaller shape with --shape x:D1,D2,..." in err[0]
    assert cli.main(["demo", "--batch", str(10**12)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "geode demo --batch 1000000000000 --hidden 768 needs" in err[0], err
    monkeypatch.setattr(cli, "physical_memory", lambda: None)  # no up-front check: MemoryError
    with pytest.raises(cli.CLIError, match=r"not enough memory for random data of float32\["):
        cli.random_array(np.random.default_rng(0), np.dtype(np.float32), (99999999999, 768))


def test_a_run_too_large_for_memory_is_a_user_error(tmp_path, capsys, in_process, monkeypatch):
    """An output that would not fit is refused before allocating with a GeodeError the
    CLI prints as one line naming the value and the size; a stray MemoryError is an
    error too, not an internal one."""
    g = geode.Graph("outer")
    x = g.input("x", ["N"], "float32")
    g.output(ops.reshape(x, [-1, 1]) * ops.reshape(x, [1, -1]), names=["y"])
    path = tmp_path / "outer.onnx"
    onnx.save(to_onnx(g), str(path))
    argv = ["run", str(path), "--shape", "x:20000", "--option", "memory_limit_mb=64"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("geode: error: model 'outer': this run needs 1.5 GiB"), err
    assert "the largest is output 'y' float32[20000, 20000]: 1.5 GiB (1600000000 bytes)" in err[0]

    def no_memory(self, feeds):
        raise MemoryError("simulated")

    monkeypatch.setattr(geode.runtime.model.CompiledModel, "run", no_memory)
    assert cli.main(["run", str(path), "--shape", "x:4"]) == 2
    assert capsys.readouterr().err.strip() == "geode: error: out of memory: simulated"


def test_explain_dot_file_is_not_overwritten(tmp_path, capsys, in_process):
    dot = tmp_path / "keep.dot"
    dot.write_text("user data", encoding="utf-8")
    assert cli.main(["explain", "builtin:layernorm", "--dot", str(dot)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"geode: error: --dot {dot}: file exists (use --force to overwrite)"]
    assert dot.read_text(encoding="utf-8") == "user data"
    assert cli.main(["explain", "builtin:layernorm", "--dot", str(tmp_path)]) == 2
    assert f"--dot {tmp_path}: is a directory" in capsys.readouterr().err
    assert cli.main(["explain", "builtin:layernorm", "--dot", str(dot), "--force"]) == 0
    assert dot.read_text(encoding="utf-8").startswith('digraph "layernorm" {')


def test_dump_twice_and_a_users_file(tmp_path, capsys, in_process):
    """The CLI's own dump files (LLVM, graph.svg) are replaced by the next dump; a file
    of the user's in the dump folder stops the dump and is kept."""
    argv = ["dump", "builtin:layernorm", "-d", str(tmp_path), "--llvm"]
    assert cli.main(argv) == 0, capsys.readouterr().err
    first = sorted(p.name for p in (tmp_path / "layernorm").iterdir())
    assert any(n.endswith("_llvm.ll") for n in first)
    assert cli.main(argv) == 0, capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "layernorm").iterdir()) == first
    (tmp_path / "layernorm" / "notes.txt").write_text("mine", encoding="utf-8")
    capsys.readouterr()
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds files geode did not write: notes.txt" in err[0], err
    assert (tmp_path / "layernorm" / "notes.txt").read_text(encoding="utf-8") == "mine"
    assert sorted(p.name for p in (tmp_path / "layernorm").iterdir()) == sorted(
        [*first, "notes.txt"]
    )


def test_missing_and_unknown_inputs(tmp_path, capsys, in_process):
    """--input for some inputs only, or for a name the model lacks: one-line errors."""
    g = geode.Graph("two")
    a, b = g.input("a", ["N", 4]), g.input("b", ["N", 4])
    g.output(a + b, names=["c"])
    path = tmp_path / "two.onnx"
    onnx.save(to_onnx(g), str(path))
    np.save(tmp_path / "a.npy", np.ones((2, 4), np.float32))
    for argv, expected in [
        (["run", str(path), "--input", f"a={tmp_path / 'a.npy'}"], "missing input(s) b"),
        (
            ["run", str(path), "--shape", "q:2,4"],
            "--shape names unknown input 'q'; the model's inputs are: a, b",
        ),
        (
            [
                "run",
                str(path),
                "--input",
                f"a={tmp_path / 'a.npy'}",
                "--input",
                f"b={tmp_path / 'a.npy'}",
                "--shape",
                "a:3,4",
            ],
            None,
        ),
    ]:
        code = cli.main(argv)
        out = capsys.readouterr()
        if expected is None:  # both files given: runs, symbol N bound by the files
            assert code == 0, out.err
            assert "inputs: a float32[2, 4], b float32[2, 4]" in out.out
            continue
        assert code == 2, argv
        assert out.err.startswith("geode: error: ") and expected in out.err, out.err


def test_every_subcommand_has_help(capsys):
    for sub in SUBCOMMANDS:
        with pytest.raises(SystemExit) as exc:
            cli.main([sub, "--help"])
        assert exc.value.code == 0
        text = capsys.readouterr().out
        assert text.startswith(f"usage: geode {sub}"), text
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    top = capsys.readouterr().out
    for sub in SUBCOMMANDS:
        assert sub in top


# -- compile: model files ------------------------------------------------------------------------
def test_compile_then_run_bench_explain_a_model_file(env, onnx_file, tmp_path):
    out = tmp_path / "small.geode"
    res = geode_cmd(env, "compile", str(onnx_file), "-o", str(out))
    assert res.returncode == 0, res.stderr
    assert f"wrote {out}" in res.stdout and out.exists()
    x = np.random.default_rng(4).standard_normal((3, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    npz = tmp_path / "y.npz"
    res = geode_cmd(env, "run", str(out), "--input", f"x={tmp_path / 'x.npy'}", "-o", str(npz))
    assert res.returncode == 0, res.stderr
    assert "loaded (no compiler run) in" in res.stdout
    got = np.load(npz)
    for k, v in small_numpy(x).items():
        np.testing.assert_allclose(got[k], v, rtol=1e-5, atol=1e-5)
    res = geode_cmd(env, "explain", str(out))
    assert res.returncode == 0 and "no compiler run" in res.stdout, res.stderr
    res = geode_cmd(env, "bench", str(out), "--shape", "x:4,16", "--rounds", "2")
    assert res.returncode == 0, res.stderr
    assert "timing geode alone" in res.stderr
    line = one_error_line(geode_cmd(env, "run", str(out), "--option", "fusion=0"))
    assert "compiled already" in line and "fusion" in line


def test_compile_refuses_to_overwrite_other_files(env, onnx_file, tmp_path):
    precious = tmp_path / "notes.txt"
    precious.write_text("mine", encoding="utf-8")
    line = one_error_line(geode_cmd(env, "compile", str(onnx_file), "-o", str(precious)))
    assert "refusing to overwrite" in line
    assert precious.read_text(encoding="utf-8") == "mine"
    res = geode_cmd(env, "compile", str(onnx_file), "-o", str(precious), "--force")
    assert res.returncode == 0, res.stderr
    line = one_error_line(geode_cmd(env, "compile", str(precious), "-o", str(tmp_path / "b")))
    assert "compiled already" in line


# -- bench / explain / dump / demo ------------------------------------------------------------------
#: a row of geode bench's results table: model, size, geode ms, ORT ms, ratio (IQR), error
BENCH_ROW = re.compile(
    r"^\| (\S+) \| (\S+) \| ([\d.]+) \| ([\d.]+|-) \| "
    r"(?:([\d.]+) \(([\d.]+)-([\d.]+)\)|-) \| (\S+)( FAIL)? \|$",
    re.M,
)


def test_bench_onnx_file(env, onnx_file):
    """geode against onnxruntime (when installed) in interleaved rounds: one table row
    with both times, the per-round ratio's median inside its IQR, an error far below the
    1e-3 target; the compile table and the speedup line."""
    res = geode_cmd(
        env, "bench", str(onnx_file), "--shape", "x=8x16", "--warmup", "1", "--rounds", "4",
        "--threads", "1",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "inputs: x float32[8, 16] (random: floats standard normal;" in out
    assert "threads 1; 1 warm-up call(s) each, then 4 interleaved rounds" in out
    assert "| model | size | geode ms | ORT ms | geode/ORT (IQR) | max rel err |" in out
    rows = BENCH_ROW.findall(out)
    assert len(rows) == 1, out
    model, size, geode_ms, ort_ms, ratio, q1, q3, err, fail = rows[0]
    assert (model, size) == ("small", "x=8x16")
    assert float(geode_ms) > 0
    compile_row = re.search(r"^\| small \| ([\d.]+) \| ([\d.]+) \| (\S+) \| (\S+) \|", out, re.M)
    assert compile_row is not None, out
    if HAVE_ORT:  # auto: compared when onnxruntime is installed
        assert "interleaved rounds (geode, onnxruntime)" in out
        assert float(ort_ms) > 0 and 0 < float(q1) <= float(ratio) <= float(q3), rows[0]
        assert float(ratio) == pytest.approx(float(geode_ms) / float(ort_ms), rel=0.5)
        assert float(err) < 1e-5 and not fail
        assert float(compile_row.group(3)) > 0
        assert re.search(
            r"^speedup of geode over onnxruntime \(ORT time / geode time\): [\d.]+x "
            r"\((?:geode|onnxruntime) faster\)$",
            out,
            re.M,
        ), out
    else:
        assert (ort_ms, ratio, err) == ("-", "", "-")
        assert "onnxruntime is not installed: timing geode alone" in res.stderr


def test_bench_builtin_without_ort(capsys, in_process):
    assert (
        cli.main(
            ["bench", "builtin:layernorm", "--rounds", "2", "--warmup", "0", "--no-compare-ort"]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "interleaved rounds (geode alone)" in out
    row = BENCH_ROW.search(out)
    assert row is not None and row.group(1) == "builtin:layernorm", out
    assert row.group(4) == "-" and row.group(5) is None and row.group(8) == "-", out
    assert "no onnxruntime comparison" in out


def test_bench_profile_lists_the_slowest_steps(capsys, in_process, onnx_file):
    """--profile K: the K slowest plan steps, slowest first, with their share."""
    argv = ["bench", str(onnx_file), "--shape", "x:64,16", "--rounds", "1", "--profile", "3"]
    assert cli.main([*argv, "--no-compare-ort"]) == 0
    out = capsys.readouterr().out
    assert "slowest steps:" in out, out
    steps = re.findall(r"^\| (\S+) \| (aicore|aicpu|host) \| ([\d.]+) \| (\d+)% \|", out, re.M)
    assert 1 <= len(steps) <= 3, out
    assert [float(s[2]) for s in steps] == sorted((float(s[2]) for s in steps), reverse=True)
    assert re.search(r"^\d+ steps?, [\d.]+ ms in steps of a [\d.]+ ms run$", out, re.M), out


def test_bench_int_inputs_are_announced(capsys, in_process, tmp_path):
    """Random int inputs (token ids) are drawn from a small safe range, and the output
    says so."""
    g = geode.Graph("lookup")
    table = g.constant(np.arange(12, dtype=np.float32).reshape(6, 2), name="table")
    ids = g.input("ids", ["B", 5], dtype="int64")
    g.output(ops.gather(table, ids, axis=0) * 2.0, names=["y"])
    path = tmp_path / "lookup.onnx"
    onnx.save(to_onnx(g), str(path))
    assert cli.main(["bench", str(path), "--shape", "ids=2x5", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert f"ints uniform in [0, {cli.RANDOM_INT_HIGH})" in out, out
    row = BENCH_ROW.search(out)
    assert row is not None and row.group(2) == "ids=2x5", out
    if HAVE_ORT:
        assert float(row.group(8)) < 1e-6, out


def test_bench_inputs_from_files_are_not_called_random(capsys, in_process, onnx_file, tmp_path):
    np.save(tmp_path / "x.npy", np.ones((4, 16), np.float32))
    argv = ["bench", str(onnx_file), "--input", f"x={tmp_path / 'x.npy'}", "--rounds", "1"]
    assert cli.main([*argv, "--no-compare-ort"]) == 0
    out = capsys.readouterr().out
    assert "inputs: x float32[4, 16]\n" in out, out


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["no/such/model.onnx"], "no/such/model.onnx: no such file"),
        (["builtin:layernorm", "--shape", "x:2,big"], "bad --shape 'x:2,big': dims must be"),
        (["builtin:layernorm", "--shape", "x=2x-768"], "bad --shape 'x=2x-768'"),
        (["builtin:layernorm", "--shape", "768"], "bad --shape '768': expected NAME:D1,D2"),
        (["builtin:layernorm", "--shape", "q=2"], "--shape names unknown input 'q'"),
    ],
    ids=["missing-file", "shape-dims", "shape-negative", "shape-no-name", "shape-unknown-input"],
)
def test_bench_bad_arguments(env, args, expected):
    """A missing model file or a bad --shape: one error line, exit status 2."""
    res = geode_cmd(env, "bench", *args, "--rounds", "1")
    assert res.returncode == 2
    assert expected in one_error_line(res)


def test_shapes_parse_in_both_forms():
    assert cli.parse_shapes(["x:2,128", "m=8x256", "s:", "t=", "u=3,4", "a=b:1x2"]) == {
        "x": (2, 128),
        "m": (8, 256),
        "s": (),
        "t": (),
        "u": (3, 4),
        "a=b": (1, 2),
    }


def test_explain_onnx_file(env, onnx_file, tmp_path):
    dot = tmp_path / "small.dot"
    res = geode_cmd(env, "explain", str(onnx_file), "--dot", str(dot))
    assert res.returncode == 0, res.stderr
    text = res.stdout
    for part in (
        "model small",
        "partitions:",
        "partition 0 [known-shape]",
        "fusion plan:",
        "fusion groups",
        "kernels (",
        "[aicore]",
        "Relu",
        "ReduceSum",
        "sol_us=",
    ):
        assert part in text, (part, text)
    assert re.search(r"merge group \d+ -> group \d+ \(\w\+\w\): .*saves", text), text
    assert dot.read_text(encoding="utf-8").startswith('digraph "small" {')


def test_dump_layernorm(env, tmp_path):
    res = geode_cmd(env, "dump", "builtin:layernorm", "-d", str(tmp_path / "dump"), "--llvm")
    assert res.returncode == 0, res.stderr
    d = tmp_path / "dump" / "layernorm"
    assert f"dumped to {d}" in res.stdout
    names = sorted(p.name for p in d.iterdir())
    for pattern in (
        r"\d+_input_graph\.txt",
        r"\d+_after_\w+\.txt",
        r"\d+_passes\.txt",
        r"\d+_placement\.txt",
        r"\d+_fusion_plan\.txt",
        r"\d+_fused_\d+_ast_lowered\.txt",
        r"\d+_fused_\d+_ast_scheduled\.txt",
        r"\d+_fused_\d+_trace\.txt",
        r"\d+_fused_\d+_source\.(py|ll)",
        r"\d+_final_graph\.txt",
        r"\d+_plan\.txt",
        r"\d+_fused_\d+_llvm\.ll",
        r"\d+_fused_\d+_asm\.s",
        r"graph\.dot",
    ):
        assert any(re.fullmatch(pattern, n) for n in names), (pattern, names)
        assert f"  {next(n for n in names if re.fullmatch(pattern, n))}" in res.stdout
    llvm = next(d.glob("*_llvm.ll")).read_text(encoding="utf-8")
    assert "define " in llvm
    dot = (d / "graph.dot").read_text(encoding="utf-8")
    assert dot.count("subgraph cluster_") >= 2  # the fused kernel and the legend
    if shutil.which("dot"):
        assert (
            (d / "graph.svg")
            .read_text(encoding="utf-8")
            .lstrip()
            .startswith(("<?xml", "<svg", "<!DOCTYPE"))
        )
    else:
        assert "graph.svg not written" in res.stderr


def test_demo(env):
    res = geode_cmd(env, "demo", "--batch", "8", "--repeat", "2")
    assert res.returncode == 0, res.stderr
    assert "geode demo: batch 8, hidden 768, float32" in res.stdout
    for name in ("rmsnorm", "layernorm"):
        row = re.search(rf"^{name}\s+(\d+)/(\d+)\s+[\d.]+\s+(\S+)", res.stdout, re.M)
        assert row is not None, res.stdout
        assert int(row.group(1)) >= 1 and float(row.group(3)) < 1e-3


def test_internal_error_is_one_line(monkeypatch, capsys):
    """A bug (not a user error) still gives one line, exit 3, and the traceback on request."""

    def boom(args):
        raise RuntimeError("kaboom\nsecond line")

    monkeypatch.delenv("GEODE_DEBUG", raising=False)
    monkeypatch.setattr(cli, "cmd_explain", boom)
    assert cli.main(["explain", "builtin:layernorm"]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "geode: internal error: RuntimeError: kaboom second line "
        "(run with GEODE_DEBUG=1 for the traceback)"
    ]
    monkeypatch.setenv("GEODE_DEBUG", "1")
    with pytest.raises(RuntimeError, match="kaboom"):
        cli.main(["explain", "builtin:layernorm"])


def test_save_npz_keeps_any_output_name(tmp_path):
    path = tmp_path / "o.npz"
    cli.save_npz(path, {"file": np.arange(3), "a:0": np.ones((2, 2), np.float32)}, force=False)
    with np.load(path) as z:
        assert sorted(z.files) == ["a:0", "file"] and z["a:0"].dtype == np.float32
    with pytest.raises(cli.CLIError, match="file exists"):
        cli.save_npz(path, {"y": np.zeros(1)}, force=False)
    cli.save_npz(path, {"y": np.zeros(1)}, force=True)
    with np.load(path) as z:
        assert z.files == ["y"]


def test_cache_shows_and_clears_only_geode_entries(env, tmp_path):
    """``geode cache`` counts the kernels a compile left; ``--clear`` removes them and
    leaves the user's own files in the folder alone."""
    own = dict(env, GEODE_CACHE_DIR=str(tmp_path))
    assert geode_cmd(own, "run", "builtin:layernorm", "--shape", "x:2,768").returncode == 0
    (tmp_path / "notes.txt").write_text("mine", encoding="utf-8")
    res = geode_cmd(own, "cache")
    assert res.returncode == 0, res.stderr
    shown = re.fullmatch(
        r"kernel cache (.+): (\d+) entries, ([\d.]+ \w+) \(limit 2048 MiB\)\n", res.stdout
    )
    assert shown is not None, res.stdout
    assert shown.group(1) == str(tmp_path / "kernels") and int(shown.group(2)) >= 1
    res = geode_cmd(own, "cache", "--prune")  # under the limit: nothing to evict
    assert res.returncode == 0 and "evicted 0 entries (0 B)" in res.stdout, res.stdout
    res = geode_cmd(env, "cache", "--dir", str(tmp_path), "--clear")
    assert res.returncode == 0, res.stderr
    assert f"removed {shown.group(2)} entries" in res.stdout
    assert ": 0 entries, 0 B (limit 2048 MiB)" in geode_cmd(own, "cache").stdout
    unlimited = geode_cmd(dict(own, GEODE_CACHE_MAX_MB="0"), "cache")
    assert unlimited.stdout.endswith("(no limit)\n")
    unlimited = geode_cmd(dict(own, GEODE_CACHE_MAX_MB="0"), "cache", "--prune")
    assert unlimited.stdout.endswith("no limit (GEODE_CACHE_MAX_MB=0): nothing evicted\n")
    assert (tmp_path / "notes.txt").read_text(encoding="utf-8") == "mine"


def test_cache_functions_refuse_a_non_path(tmp_path):
    from geode.codegen import cache
    from geode.config import OptionError

    for fn in (cache.cache_info, cache.clear_cache):
        for bad in (None, 3, "a\x00b"):
            with pytest.raises(OptionError, match="cache_dir="):
                fn(bad)


def test_error_notes_join_the_one_line():
    exc = ValueError("bad\n value")
    exc.add_note("in step 's' (aicpu: Slice)")
    assert cli._one_line(exc) == "bad value (in step 's' (aicpu: Slice))"


def test_dynamic_dims_run_and_explain(tmp_path, capsys, in_process):
    block = str(Path(__file__).parent / "data" / "torch_block.onnx")
    argv = ["run", block, "--dynamic-dims", "batch=1,4", "--shape", "x:3,8,16"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "y       float32[3, 8, 16]" in out and "pooled  float32[3, 16]" in out
    assert cli.main(["explain", block, "--dynamic-dims", "batch=1,4"]) == 0
    text = capsys.readouterr().out
    assert "  dim batch: 1, 4 (x dim 0)" in text
    assert "  bucket batch=4: compile " in text and "symbolic model (every size):" in text


@pytest.mark.parametrize(
    ("value", "msg"),
    [
        ("bach=1,4", "dynamic dim 'bach' is not a dim of graph 'main_graph''s inputs"),
        ("batch=4,1", "sizes of dim 'batch' must be positive and increasing, got [4, 1]"),
        ("batch", "expected name=size,size,..."),
    ],
)
def test_bad_dynamic_dims_are_one_error_line(value, msg, capsys, in_process):
    block = str(Path(__file__).parent / "data" / "torch_block.onnx")
    assert cli.main(["explain", block, "--dynamic-dims", value]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("geode: error: ") and msg in err[0], err


def test_compile_refuses_dynamic_dims(tmp_path, capsys, in_process):
    out = tmp_path / "m.geode"
    argv = ["compile", "builtin:layernorm", "-o", str(out), "--dynamic-dims", "N=1,2"]
    assert cli.main(argv) == 2
    assert "a model file holds one compiled graph" in capsys.readouterr().err
    assert not out.exists()


# -- tune ---------------------------------------------------------------------------------------
def test_tune_writes_a_database_the_compile_uses(tmp_path, capsys, in_process):
    db = tmp_path / "tuning.json"
    argv = ["tune", "builtin:rmsnorm", "--db", str(db), "--trials", "1", "--shape", "x:8,768"]
    assert cli.main([*argv, "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "fused_0" in out and "tuning database" in out and db.exists()
    assert cli.main([*argv, "--threads", "1"]) == 0  # resumed: nothing left to tune
    assert "in db" in capsys.readouterr().out
    explain = ["explain", "builtin:rmsnorm", "--option", f"tuning_db={db}"]
    assert cli.main([*explain, "--option", "num_threads=1"]) == 0
    assert "schedule: tuned" in capsys.readouterr().out


def test_tune_errors_are_one_line(tmp_path, capsys, in_process):
    db = tmp_path / "tuning.json"
    assert cli.main(["tune", "builtin:rmsnorm", "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert "input 'x' has the shape" in err and "--shape x:D1,D2" in err
    (tmp_path / "other.json").write_text("{}", encoding="utf-8")
    argv = ["tune", "builtin:rmsnorm", "--db", str(tmp_path / "other.json"), "--shape", "x:2,768"]
    assert cli.main(argv) == 2
    assert "is not a geode tuning database" in capsys.readouterr().err
    argv = ["tune", "builtin:rmsnorm", "--db", str(db), "--shape", "x:2,768", "--ray", "nohost"]
    assert cli.main(argv) == 2
    assert "ray='nohost': not a Ray address" in capsys.readouterr().err


def test_tune_predictor_projected(tmp_path, capsys, in_process):
    db = tmp_path / "tuning.json"
    argv = ["tune", "builtin:rmsnorm", "--db", str(db), "--trials", "2", "--shape", "x:8,768"]
    more = ["--predictor", "projected", "--whole-space", "4096", "--threads", "1"]
    assert cli.main([*argv, *more]) == 0
    assert "fused_0" in capsys.readouterr().out and db.exists()
