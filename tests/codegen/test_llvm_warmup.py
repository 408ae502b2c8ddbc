"""LLVM warmed up ahead of a cold compile (:mod:`geode.codegen.backends.llvm.warmup`,
:func:`geode.codegen.backends.llvm.background.warm_up`, :func:`geode.codegen.backends.
prewarm.prewarm`): the throw-away module compiles, a compile that misses the model cache
warms the background thread before its first module and leaves nothing claimable, a
model-cache hit and the numba backend start nothing, a broken warm-up changes nothing,
a fork during a warm-up is safe. The process-wide state (threads started once) makes
most of these run in a fresh Python."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from geode.codegen.backends.llvm import jit, warmup
from geode.codegen.backends.llvm.target import host


def _fresh(code: str, *args: str) -> dict:
    """Run ``code`` in a fresh Python with this tree on the path; its last line's JSON."""
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_warm_up_module_is_a_kernel_of_the_target_and_compiles() -> None:
    target = host()
    ir = warmup.warm_module(target)
    assert target.function_attrs in ir and "@geode.warmup(" in ir
    obj = jit.compile_ir(ir, target, warmup.LEVEL)
    assert obj[:4] == b"\x7fELF"
    warmup.warm(target)  # the same, its object code dropped


_RECORD = """
import json, re, sys, threading, time
import numpy as np
import geode
from geode import examples
from geode.codegen.backends.llvm import background, jit
log = []
real = jit.compile_ir
def compile_ir(ir, target, level=3):
    names = re.findall(r"define [^@]*@([\\w.]+)\\(", ir)
    name = names[-1] if names else "?"
    log.append((name, threading.current_thread().name))
    return real(ir, target, level)
jit.compile_ir = compile_ir
ex = examples.layernorm(hidden=64)
def run(**opts):
    model = geode.compile(ex.graph, cache_dir=sys.argv[1], **opts)
    feeds = ex.make_inputs(np.random.default_rng(0), 5)
    for name, want in ex.numpy(**feeds).items():
        np.testing.assert_allclose(model(**feeds)[name], want, rtol=1e-5, atol=1e-5)
    return model
"""


def test_a_cold_compile_warms_the_background_thread_first(tmp_path) -> None:
    """The first module LLVM compiles is the warm-up, on a background thread; the
    compile's own modules follow, nothing stays pending and no kernel of it is linked."""
    report = _fresh(
        _RECORD
        + """
run()
warm = background.wait_warm(60)
print(json.dumps({"log": log, "warm": warm, "pending": background.pending(),
                  "again": background.warm_up(), "workers": background.WORKERS}))
""",
        str(tmp_path),
    )
    names = [name for name, _ in report["log"]]
    assert names[0] == "geode.warmup" and report["log"][0][1].startswith("geode-llvm-")
    assert names.count("geode.warmup") == report["workers"] and len(names) > 1
    assert report["warm"] and report["pending"] == 0
    assert report["again"] is False  # the threads run: warm already
    cached = [p.name for p in tmp_path.rglob("*") if "warmup" in p.name]
    assert cached == []  # its object code is nowhere on disk


def test_a_model_cache_hit_and_the_numba_backend_start_no_warm_up(tmp_path) -> None:
    """A compile that loads its model from the model cache compiles nothing: no thread,
    no LLVM. Nor does prewarm for the numba backend or a compile without codegen."""
    _fresh(_RECORD + "run(model_cache=True)\nprint('{}')", str(tmp_path))  # fills the cache
    report = _fresh(
        _RECORD
        + """
from geode import config
from geode.codegen.backends.prewarm import prewarm
model = run(model_cache=True)
threads = sorted(t.name for t in threading.enumerate() if t.name.startswith("geode-llvm"))
numba = prewarm(config.current(backend="numba"))
nocode = prewarm(config.current(codegen=False))
threads2 = sorted(t.name for t in threading.enumerate() if t.name.startswith("geode-llvm"))
print(json.dumps({"hit": "model_cache" in model.stats, "log": log, "threads": threads,
                  "binding": "llvmlite.binding" in sys.modules, "numba": numba,
                  "nocode": nocode, "threads2": threads2}))
""",
        str(tmp_path),
    )
    assert report["hit"] and report["log"] == [] and report["threads"] == []
    assert report["binding"] is False
    assert report["numba"] is False and report["nocode"] is False and report["threads2"] == []


def test_a_failing_warm_up_changes_nothing(tmp_path) -> None:
    """A warm-up that raises is logged and forgotten: the compile runs as without it,
    and a real error of LLVM still surfaces at the claim of the module that meets it."""
    report = _fresh(
        _RECORD
        + """
from geode.codegen.backends.llvm import warmup
from geode.codegen.backends.llvm.target import host
from geode.errors import CodegenError
def broken(target):
    raise RuntimeError("test: LLVM is broken")
warmup.warm = broken
run()
background.submit("bad", "not IR", host(), 2)
try:
    background.claim("bad")
    raised = ""
except CodegenError as exc:
    raised = str(exc)
print(json.dumps({"warm": background.wait_warm(60), "log": log, "raised": raised}))
""",
        str(tmp_path),
    )
    assert report["warm"] and "geode.warmup" not in [name for name, _ in report["log"]]
    assert "LLVM rejected" in report["raised"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_fork_during_a_warm_up_waits_for_it_and_the_child_compiles() -> None:
    report = _fresh(
        """
import json, os
from geode.codegen.backends.llvm import background
from geode.codegen.backends.llvm.target import host
started = background.warm_up()
pid = os.fork()  # waits for the warm-up's compile when it is under way
if pid == 0:
    ir = "define i32 @f(i32 %a) {\\n  ret i32 %a\\n}\\n"
    background.submit("k", ir, host(), 2)
    os._exit(0 if background.pending() == 1 and background.claim("k") else 1)
_, status = os.waitpid(pid, 0)
print(json.dumps({"started": started, "child": os.waitstatus_to_exitcode(status),
                  "warm": background.wait_warm(60)}))
"""
    )
    assert report == {"started": True, "child": 0, "warm": True}
