"""Debug output: GEODE_DEBUG levels on the ``geode`` logger, GEODE_DUMP_DIR files, set_options,
and progress bars (GEODE_PROGRESS)."""

from __future__ import annotations

import io
import logging
import re
from pathlib import Path

import numpy as np
import pytest

import geode
from geode import config, examples, progress
from geode.debug import MANIFEST, Dumper, configure_logging, log


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.getbasetemp() / "geode_cache"
    d.mkdir(exist_ok=True)
    return d


@pytest.fixture
def clean_options(monkeypatch: pytest.MonkeyPatch, cache_dir: Path) -> None:
    """No GEODE_* flags from outside; set_options() changes undone after the test."""
    for var in ("GEODE_DEBUG", "GEODE_DUMP_DIR", "GEODE_PROGRESS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("GEODE_CACHE_DIR", str(cache_dir))
    monkeypatch.setattr(config, "_global_overrides", {})


def stage_names(d: Path) -> list[str]:
    """Stage names of numbered files, in order (``03_fusion_plan.txt`` -> ``fusion_plan``)."""
    files = sorted(p.name for p in d.iterdir() if re.match(r"\d+_", p.name))
    return [re.sub(r"^\d+_|\.\w+$", "", n) for n in files]


# -- Dumper -------------------------------------------------------------------------------------------
def test_dumper_numbers_files_and_respects_levels(tmp_path):
    d = Dumper("my/model", level=0, dump_dir=str(tmp_path))
    assert d.dir == tmp_path / "my_model" and d.active
    assert d.wants(1) and d.wants(3) and not d.wants(4)  # LLVM only on request
    d.stage("a", "one")
    d.stage("b", "two\n", level=3, ext="py")
    assert d.stage("llvm", "ir", level=4, ext="ll") is None
    d.artifact("graph.dot", "digraph {}")
    assert sorted(p.name for p in d.dir.iterdir()) == [
        MANIFEST,
        "00_a.txt",
        "01_b.py",
        "graph.dot",
    ]
    assert (d.dir / MANIFEST).read_text(encoding="utf-8").splitlines()[1:] == [
        "00_a.txt",
        "01_b.py",
        "graph.dot",
    ]
    assert (d.dir / "00_a.txt").read_text(encoding="utf-8") == "one\n"
    quiet = Dumper("m", level=0)
    assert not quiet.active and not quiet.wants(1)
    assert quiet.stage("a", "x") is None and quiet.artifact("graph.dot", "x") is None
    two = Dumper("m", level=2)
    assert two.wants(2) and not two.wants(3)


def test_dumper_replaces_an_earlier_dump_only(tmp_path):
    d = Dumper("m", dump_dir=str(tmp_path))
    for i in range(3):
        d.stage(f"s{i}", "x")
    d.artifact("graph.dot", "digraph {}")
    (d.dir / ".DS_Store").write_text("hidden entries are left alone", encoding="utf-8")
    again = Dumper("m", dump_dir=str(tmp_path))
    again.stage("only", "y")
    assert sorted(p.name for p in again.dir.iterdir()) == [
        ".DS_Store",
        MANIFEST,
        "00_only.txt",
    ]
    assert (again.dir / MANIFEST).read_text(encoding="utf-8").splitlines()[1:] == ["00_only.txt"]


def test_dump_folder_with_files_geode_did_not_write_is_refused(tmp_path):
    """A user's files in <dump_dir>/<model>/ (even ones named like geode's) survive."""
    user = {"01_my_notes.txt": "a", "2024_report.txt": "b", "10_analysis.py": "c"}
    user.update({"graph.dot": "d", "keep.txt": "e"})
    folder = tmp_path / "m"
    folder.mkdir()
    for name, text in user.items():
        (folder / name).write_text(text, encoding="utf-8")
    with pytest.raises(config.OptionError) as exc:  # no manifest: not geode's folder
        Dumper("m", dump_dir=str(tmp_path))
    msg = str(exc.value)
    assert f"dump_dir {str(tmp_path)!r}" in msg and str(folder) in msg
    assert "holds files geode did not write" in msg and "01_my_notes.txt" in msg
    assert {p.name: p.read_text(encoding="utf-8") for p in folder.iterdir()} == user
    # a geode dump folder where the user added a file: that file is kept, nothing removed
    ours = Dumper("n", dump_dir=str(tmp_path))
    ours.stage("a", "x")
    (ours.dir / "notes.md").write_text("mine", encoding="utf-8")
    with pytest.raises(config.OptionError, match=r"geode did not write.*: notes\.md"):
        Dumper("n", dump_dir=str(tmp_path))
    assert sorted(p.name for p in ours.dir.iterdir()) == [MANIFEST, "00_a.txt", "notes.md"]
    assert (ours.dir / "notes.md").read_text(encoding="utf-8") == "mine"


def test_dumper_never_writes_over_a_file_that_appears(tmp_path):
    d = Dumper("m", dump_dir=str(tmp_path))
    (d.dir / "00_a.txt").write_text("user's", encoding="utf-8")
    with pytest.raises(config.OptionError, match="00_a.txt appeared during the compile"):
        d.stage("a", "geode's")
    assert (d.dir / "00_a.txt").read_text(encoding="utf-8") == "user's"
    assert "00_a.txt" not in (d.dir / MANIFEST).read_text(
        encoding="utf-8"
    )  # the next dump keeps it too


@pytest.mark.parametrize(
    "name", ["../../evil", "..", ".", "a/b", "/abs/path", "x\x00y", "..\\..\\win", ""]
)
def test_model_name_cannot_leave_the_dump_dir(tmp_path, name):
    d = Dumper(name, dump_dir=str(tmp_path / "dumps"))
    assert d.dir is not None and d.dir.parent == tmp_path / "dumps"
    assert d.dir.name not in (".", "..") and not d.dir.name.startswith(".")
    assert "/" not in d.dir.name and "\x00" not in d.dir.name and "\\" not in d.dir.name
    d.artifact("../../up.dot", "x")
    assert [p.name for p in (tmp_path / "dumps").iterdir()] == [d.dir.name]


def option_error(text: str) -> pytest.RaisesContext:
    """``pytest.raises(OptionError)`` whose message contains ``text`` (literally)."""
    return pytest.raises(config.OptionError, match=re.escape(text))


def test_bad_dump_dir_is_an_option_error(clean_options, tmp_path):
    g = examples.layernorm().graph
    a_file = tmp_path / "afile"
    a_file.write_text("user data", encoding="utf-8")
    with option_error(f"dump_dir '{a_file}': exists and is not a folder"):
        geode.compile(g, dump_dir=str(a_file))
    assert a_file.read_text(encoding="utf-8") == "user data"
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "layernorm").write_text("x", encoding="utf-8")
    with option_error(f"dump_dir '{tmp_path / 'd'}': {tmp_path / 'd' / 'layernorm'} exists"):
        geode.compile(g, dump_dir=str(tmp_path / "d"))
    assert (tmp_path / "d" / "layernorm").read_text(encoding="utf-8") == "x"
    for option, value in (("dump_dir", 3), ("cache_dir", 5), ("dump_dir", b"/tmp")):
        with option_error(f"{option}={value!r}: expected a folder path"):
            geode.compile(g, **{option: value})
        with option_error(f"{option}={value!r}: expected a folder path"):
            geode.set_options(**{option: value})
    with option_error(r"cache_dir='a\x00b': a path cannot contain a NUL character"):
        geode.Session(cache_dir="a\x00b")
    assert config.current(dump_dir=tmp_path / "p").dump_dir == str(tmp_path / "p")  # PathLike


@pytest.mark.parametrize(
    "option,value,message",
    [
        ("num_threads", -3, "num_threads=-3: expected an int >= 0"),
        ("num_threads", 2.5, "num_threads=2.5: expected an int, got float"),
        ("num_threads", True, "num_threads=True: expected an int, got bool"),
        ("debug", -1, "debug=-1: expected an int >= 0"),
        ("const_fold_limit", -1, "const_fold_limit=-1: expected an int >= 0"),
        ("fusion", 2, "fusion=2: expected a bool, got int"),
        ("codegen", "maybe", "expected bool for option 'codegen'"),
        ("disabled_passes", [1], "disabled_passes=(1,): expected pass names"),
        ("streaming", "-5", "streaming='-5': expected auto, off or a size in bytes"),
        ("streaming", 1.5, "streaming=1.5: expected auto, off or a size in bytes"),
        ("progress", "sometimes", "progress='sometimes': expected auto, 1 or 0"),
        ("conv_method", "fft", "conv_method='fft': expected one of auto, im2col"),
    ],
)
def test_bad_option_values_are_refused_when_set(clean_options, option, value, message):
    """A bad value is an OptionError when it is set, before anything compiles (a negative
    thread count used to fail inside every kernel's compile and send every group to the
    fallback engine with a warning)."""
    g = examples.layernorm().graph
    with option_error(message):
        geode.compile(g, **{option: value})
    with option_error(message):
        geode.set_options(**{option: value})
    assert config._global_overrides == {}


@pytest.mark.parametrize(
    "var,raw,message",
    [
        ("GEODE_NUM_THREADS", "-3", "GEODE_NUM_THREADS: num_threads=-3: expected an int >= 0"),
        ("GEODE_NUM_THREADS", "two", "GEODE_NUM_THREADS='two': expected int"),
        ("GEODE_STREAMING", "sometimes", "GEODE_STREAMING: streaming='sometimes'"),
        ("GEODE_PROGRESS", "7x", "GEODE_PROGRESS: progress='7x': expected auto, 1 or 0"),
        ("GEODE_CONV_METHOD", "fft", "GEODE_CONV_METHOD: conv_method='fft'"),
    ],
)
def test_bad_environment_values_name_the_variable(clean_options, monkeypatch, var, raw, message):
    monkeypatch.setenv(var, raw)
    with option_error(message):
        geode.compile(examples.layernorm().graph)


def test_good_option_values_are_kept(clean_options):
    opts = config.current(num_threads=2, fusion=0, streaming="off", progress=True)
    assert (opts.num_threads, opts.fusion, opts.streaming, opts.progress) == (2, 0, "off", True)
    opts = config.current(disabled_passes=["cse"], streaming=1024, num_threads=np.int64(1))
    assert opts.disabled_passes == ("cse",) and opts.streaming == 1024
    assert config.current(conv_method="im2col").conv_method == "im2col"


def test_unwritable_dump_dir_is_an_option_error(tmp_path, monkeypatch):
    def refuse(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied")

    ro = tmp_path / "ro"
    (ro / "old").mkdir(parents=True)
    monkeypatch.setattr(Path, "write_text", refuse)  # (root may write into read-only folders)
    with option_error(f"dump_dir '{ro}': cannot write in {ro / 'old'}: Permission denied"):
        Dumper("old", dump_dir=str(ro))
    monkeypatch.setattr(Path, "mkdir", refuse)
    with option_error(f"dump_dir '{ro}': cannot create folder {ro / 'm'}: Permission denied"):
        Dumper("m", dump_dir=str(ro))


def test_stages_are_logged_at_their_level(caplog):
    caplog.set_level(logging.INFO, logger="geode")
    d = Dumper("m", level=2)
    d.stage("summary", "S1", level=1)
    d.stage("ast", "S2", level=2)
    d.stage("source", "S3", level=3)
    text = "\n".join(r.getMessage() for r in caplog.records if r.name == "geode")
    assert "==== summary ====\nS1" in text and "==== ast ====\nS2" in text and "S3" not in text


def test_configure_logging_makes_records_visible(monkeypatch):
    monkeypatch.setattr(log, "level", logging.NOTSET)
    monkeypatch.setattr(log, "handlers", [])
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    monkeypatch.setattr("geode.debug._handler", None)
    configure_logging(0)
    assert log.level == logging.NOTSET and not log.handlers  # level 0: untouched
    configure_logging(1)
    assert log.level == logging.INFO and len(log.handlers) == 1
    configure_logging(3)
    assert len(log.handlers) == 1  # idempotent


# -- the compile pipeline's dumps ----------------------------------------------------------------------
def test_layernorm_dump_dir_from_set_options(clean_options, tmp_path, capsys):
    geode.set_options(dump_dir=str(tmp_path))
    model = geode.compile(examples.layernorm().graph)
    assert capsys.readouterr().out == ""  # library code prints nothing
    d = tmp_path / "layernorm"
    names = stage_names(d)
    k = model.kernels[0].name
    for stage in (
        "input_graph",
        "passes",
        "placement",
        "fusion_plan",
        f"{k}_ast_lowered",
        f"{k}_ast_scheduled",
        f"{k}_trace",
        f"{k}_source",
        "final_graph",
        "memory_plan",
        "plan",
    ):
        assert stage in names, (stage, names)
    # the graph after a pass that changed it
    assert any(n.startswith("after_") for n in names), names
    assert (
        names.index("input_graph")
        < names.index("placement")
        < names.index("fusion_plan")
        < names.index(f"{k}_ast_lowered")
        < names.index(f"{k}_ast_scheduled")
        < names.index("plan")
    )
    # optimized LLVM IR and machine code only at level 4 (level 3 has the generated source)
    assert not list(d.glob("*_llvm.ll")) and not list(d.glob("*.s"))

    def read(stage: str) -> str:
        (p,) = [p for p in d.iterdir() if re.fullmatch(rf"\d+_{stage}\.\w+", p.name)]
        return p.read_text(encoding="utf-8")

    assert read("input_graph").startswith("graph layernorm(")
    assert "ReduceMean" in read("input_graph")
    assert "partition 0 [known-shape]" in read("placement")
    assert "fusion groups" in read("fusion_plan") and "merge group" in read("fusion_plan")
    assert read(f"{k}_trace").strip() == model.kernels[0].trace.strip() != ""
    assert "\n# trace\n" in read(f"{k}_ast_scheduled")
    assert read(f"{k}_ast_lowered") != read(f"{k}_ast_scheduled")
    assert read(f"{k}_source").strip() == model.kernels[0].source.strip()
    assert f"# {k} [aicore]" in read("final_graph")
    assert read("plan").strip() == model.explain().strip()
    assert read("memory_plan").strip() == model.plan.memory_text.strip() != ""
    assert read("memory_plan").strip() in model.explain()
    dot = (d / "graph.dot").read_text(encoding="utf-8")
    # the kernel and the legend, and the engine subgraphs: the inputs', the kernel's
    assert dot == model.to_dot() and dot.count("subgraph cluster_") == 4
    assert dot.count("subgraph cluster_sg") == 2
    assert "engine partition: 2 subgraphs" in read("engine_partition")


def test_debug_env_levels_log_stages(clean_options, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="geode")
    ex = examples.layernorm()

    def logged(level: str) -> str:
        caplog.clear()
        monkeypatch.setenv("GEODE_DEBUG", level)
        geode.compile(ex.graph)  # the default session reads the flag at every compile
        return "\n".join(r.getMessage() for r in caplog.records if r.name == "geode")

    one = logged("1")
    assert (
        "==== fusion_plan ====" in one and "==== placement ====" in one and "==== plan ====" in one
    )
    assert "ast_lowered" not in one and "==== after_" not in one
    two = logged("2")
    assert "==== fused_0_ast_lowered ====" in two and "==== fused_0_trace ====" in two
    assert "==== after_" in two and "_source ====" not in two
    three = logged("3")
    assert "==== fused_0_source ====" in three and "==== fused_0_llvm" not in three


def test_level_4_dumps_llvm_and_asm(clean_options, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="geode")  # keep the level-4 text out of the report
    model = geode.compile(examples.layernorm().graph, debug=4, dump_dir=str(tmp_path))
    d = tmp_path / "layernorm"
    (ll,) = d.glob("*_llvm.ll")
    (asm,) = d.glob("*_asm.s")
    assert "define " in ll.read_text(encoding="utf-8") and ll.read_text(
        encoding="utf-8"
    ) == model.kernels[0].llvm + ("" if model.kernels[0].llvm.endswith("\n") else "\n")
    assert asm.stat().st_size > 0


# -- progress bars --------------------------------------------------------------------------------------
class _TTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_settings():
    assert progress.enabled("auto", _TTY()) and not progress.enabled("auto", io.StringIO())
    assert progress.enabled("1", io.StringIO()) and progress.enabled(True)
    assert not progress.enabled("0", _TTY()) and not progress.enabled(0)
    with pytest.raises(config.OptionError, match="progress='sometimes'"):
        progress.enabled("sometimes")


def test_progress_bar_draws_only_when_enabled(capsys):
    with progress.progress_bar(3, "quiet", "0") as bar:
        bar.update()
    assert capsys.readouterr().err == ""
    with progress.progress_bar(3, "compiling demo", "1", unit="kernel", delay=0) as bar:
        for _ in range(3):
            bar.update()
    err = capsys.readouterr().err
    assert "compiling demo" in err and "/3 " in err and "kernel" in err
