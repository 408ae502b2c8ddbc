"""Fixtures shared by the codegen tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def llvm_runs(monkeypatch):
    """``(started, compiled)``: the IR of every module queued on the background LLVM
    threads (``background.submit``) and of every module LLVM compiled (``jit.compile_ir``)
    while the test runs, in order."""
    from geode.codegen.backends.llvm import background, jit

    started: list[str] = []
    compiled: list[str] = []
    real_submit, real_compile = background.submit, jit.compile_ir

    def submit(key, ir, target, level):
        started.append(ir)
        real_submit(key, ir, target, level)

    def compile_ir(ir, target, level=3):
        compiled.append(ir)
        return real_compile(ir, target, level)

    monkeypatch.setattr(background, "submit", submit)
    monkeypatch.setattr(jit, "compile_ir", compile_ir)
    return started, compiled
