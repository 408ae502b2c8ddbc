"""Object code compiled ahead on the background thread
(:mod:`geode.codegen.backends.llvm.background`): claimed by key, errors raised at the
claim, nothing left pending after a compile, a forked child starting empty."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import geode
from geode import examples
from geode.codegen.backends.llvm import background, jit
from geode.codegen.backends.llvm.target import host
from geode.errors import CodegenError

IR = "define i32 @bg_{n}(i32 %a) {{\n  %b = add i32 %a, {n}\n  ret i32 %b\n}}\n"


def test_claimed_object_code_is_what_llvm_compiles() -> None:
    ir = IR.format(n=7)
    background.submit("test-bg-7", ir, host(), 2)
    obj = background.claim("test-bg-7")
    assert obj is not None and obj[:4] == b"\x7fELF"
    assert background.claim("test-bg-7") is None  # claimed once
    loaded = jit.load_object(obj, ["bg_7"], runtime=False)
    assert loaded["bg_7"]


def test_unknown_keys_are_not_pending_and_errors_raise_at_the_claim() -> None:
    assert background.claim("test-bg-never-submitted") is None
    background.submit("test-bg-bad", "this is not IR", host(), 2)
    with pytest.raises(CodegenError, match="LLVM rejected"):
        background.claim("test-bg-bad")


def test_only_the_newest_unclaimed_modules_are_kept(monkeypatch) -> None:
    monkeypatch.setattr(background, "MAX_PENDING", 2)
    for n in range(4):
        background.submit(f"test-bg-cap{n}", IR.format(n=n), host(), 2)
    assert background.pending() <= 2
    assert background.claim("test-bg-cap0") is None  # dropped: its caller compiles itself
    assert background.claim("test-bg-cap3") is not None
    background.claim("test-bg-cap2")


def test_a_compile_claims_every_module_it_started(tmp_path) -> None:
    before = background.pending()
    ex = examples.layernorm(hidden=64)
    model = geode.compile(ex.graph, cache_dir=str(tmp_path), model_cache=False)
    assert background.pending() == before
    feeds = ex.make_inputs(np.random.default_rng(0), 9)
    for name, want in ex.numpy(**feeds).items():
        np.testing.assert_allclose(model(**feeds)[name], want, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_kernel_that_fails_after_its_module_started_leaves_nothing_pending(
    tmp_path, monkeypatch
) -> None:
    """A kernel whose link fails after its module went to the background thread falls
    back, and its LLVM run is cancelled: nothing of the compile goes on after it."""
    from geode.codegen import driver

    started, real_submit = [], background.submit

    def submit(key, ir, target, level):
        started.append(key)
        real_submit(key, ir, target, level)

    def failing_emit(kernel, opts, emitted=None):
        raise CodegenError("test: linking refused")

    monkeypatch.setattr(background, "submit", submit)
    monkeypatch.setattr(driver, "emit_kernel", failing_emit)
    before = background.pending()
    ex = examples.layernorm(hidden=64)
    model = geode.compile(ex.graph, cache_dir=str(tmp_path), model_cache=False)
    assert started, "no module went to the background thread"
    assert background.pending() == before
    assert all(background.claim(key) is None for key in started)  # cancelled, not kept
    assert not any(k.engine == "aicore" for k in model.kernels)  # the group fell back
    feeds = ex.make_inputs(np.random.default_rng(0), 9)
    for name, want in ex.numpy(**feeds).items():
        np.testing.assert_allclose(model(**feeds)[name], want, rtol=1e-5, atol=1e-5)


def test_a_forked_child_starts_with_nothing_pending_and_compiles() -> None:
    code = textwrap.dedent(
        """
        import os
        from geode.codegen.backends.llvm import background, jit
        from geode.codegen.backends.llvm.target import host
        ir = "define i32 @f(i32 %a) {\\n  ret i32 %a\\n}\\n"
        background.submit("k1", ir, host(), 2)
        pid = os.fork()
        if pid == 0:
            ok = background.pending() == 0 and background.claim("k1") is None
            background.submit("k2", ir, host(), 2)
            ok = ok and background.claim("k2") is not None
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert background.claim("k1") is not None
        print("ok")
        """
    )
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


LOOP = """define void @axpy_{n}(float* noalias %x, float* noalias %y, i64 %n) {{
entry:
  br label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %j, %loop ]
  %px = getelementptr float, float* %x, i64 %i
  %py = getelementptr float, float* %y, i64 %i
  %a = load float, float* %px
  %b = load float, float* %py
  %m = fmul fast float %a, {n}.0
  %s = fadd fast float %m, %b
  store float %s, float* %py
  %j = add i64 %i, 1
  %c = icmp slt i64 %j, %n
  br i1 %c, label %loop, label %done
done:
  ret void
}}
"""


def _global_context_compile(ir: str, level: int) -> bytes:
    """The object code of ``ir`` as one thread compiles it in LLVM's global context."""
    import llvmlite.binding as llvm

    target = host()
    with jit.LOCK:
        mod = llvm.parse_assembly(ir)
        mod.triple = target.triple
        mod.data_layout = str(jit.target_machine(target).target_data)
        jit._optimize(mod, target, level)
        return bytes(jit.target_machine(target).emit_object(mod))


def test_modules_compiled_on_several_threads_at_once_are_the_same_code() -> None:
    """Each in a context of its own, by its thread's target machine, past llvmlite's
    lock: the object code of one thread in LLVM's global context, byte for byte."""
    import threading

    irs = [(LOOP.format(n=n), 2 + n % 2) for n in range(1, 9)]
    want = [_global_context_compile(ir, level) for ir, level in irs]
    got: dict[int, bytes] = {}

    def work(first: int) -> None:
        for i in range(first, len(irs), 3):
            got[i] = jit.compile_ir(irs[i][0], host(), irs[i][1])

    threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [got[i] for i in range(len(irs))] == want


def _busy_workers(monkeypatch, first: int) -> tuple:
    """Every background worker inside a module of its own (``bg_<first>``, the next
    numbers), held there until the returned event is set; ``jit.compile_ir`` as the
    background module sees it records (module, thread) in the returned log."""
    import threading

    release, log, real = threading.Event(), [], jit.compile_ir
    monkeypatch.setattr(background, "WORKERS", 1)
    workers = max(background._threads, 1)  # (more when started on more cores before)
    held = {f"bg_{first + k}" for k in range(workers)}

    def compile_ir(ir, target, level=3):
        name = ir.split("@")[1].split("(")[0]
        log.append((name, threading.current_thread().name))
        if name in held:
            assert release.wait(10)
        return real(ir, target, level)

    monkeypatch.setattr(background.jit, "compile_ir", compile_ir)
    for k in range(workers):
        background.submit(f"test-bg-held{first + k}", IR.format(n=first + k), host(), 2)
    while len(log) < workers:
        threading.Event().wait(0.01)
    return release, log, [f"test-bg-held{first + k}" for k in range(workers)]


def test_a_claim_compiles_its_module_while_the_workers_are_busy(monkeypatch) -> None:
    """The claiming thread does not wait behind a long module: it compiles the one it
    claims itself, and the result is the module's code."""
    import threading

    release, log, held = _busy_workers(monkeypatch, 101)
    background.submit("test-bg-next", IR.format(n=100), host(), 2)
    obj = background.claim("test-bg-next")
    assert ("bg_100", threading.current_thread().name) in log
    assert obj == jit.compile_ir(IR.format(n=100), host(), 2)
    release.set()
    assert all(background.claim(key) is not None for key in held)


def test_a_cancelled_module_is_not_compiled_by_a_claiming_thread(monkeypatch) -> None:
    import threading

    release, log, held = _busy_workers(monkeypatch, 111)
    background.submit("test-bg-dropped", IR.format(n=110), host(), 2)
    background.cancel("test-bg-dropped")
    threading.Timer(0.2, release.set).start()
    assert all(background.claim(key) is not None for key in held)  # waited, compiling none
    assert "bg_110" not in [name for name, _ in log]
    assert background.claim("test-bg-dropped") is None


def test_a_claim_whose_module_is_being_compiled_takes_the_largest_queued(monkeypatch) -> None:
    """While a worker compiles the claimed module, the claiming thread compiles the
    largest queued one: no large module is left to the end for one thread alone."""
    import threading

    release, log, held = _busy_workers(monkeypatch, 121)
    small, large = IR.format(n=120), LOOP.format(n=120)
    background.submit("test-bg-small", small, host(), 2)
    background.submit("test-bg-large", large, host(), 2)
    threading.Timer(0.3, release.set).start()
    assert background.claim(held[0]) is not None
    me = threading.current_thread().name
    assert log[len(held)] == ("axpy_120", me), log  # the large one first, on this thread
    assert all(background.claim(key) is not None for key in [*held[1:], "test-bg-small"])
    assert background.claim("test-bg-large") == jit.compile_ir(large, host(), 2)


def test_a_worker_takes_the_largest_queued_module_first(monkeypatch) -> None:
    """Largest first on the workers too: of a small module queued before a large one,
    the large one is compiled first."""
    import threading

    release, log, held = _busy_workers(monkeypatch, 131)
    small, large = IR.format(n=130), LOOP.format(n=130)
    background.submit("test-bg-small2", small, host(), 2)
    background.submit("test-bg-large2", large, host(), 2)
    release.set()
    for _ in range(1000):
        if {"bg_130", "axpy_130"} <= {name for name, _ in log}:
            break
        threading.Event().wait(0.01)
    names = [name for name, _ in log[len(held) :]]
    assert names == ["axpy_130", "bg_130"], log
    assert all(background.claim(key) is not None for key in held)
    assert background.claim("test-bg-small2") == jit.compile_ir(small, host(), 2)
    assert background.claim("test-bg-large2") == jit.compile_ir(large, host(), 2)
