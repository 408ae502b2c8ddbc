"""A run that would not fit in memory is refused with a GeodeError naming the value and
the bytes asked for, before anything is allocated (issue 39); so is the copy of a
broadcast input. The limit: the memory_limit_mb option, else the memory available."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import geode
from geode import ops
from geode.errors import (
    ExecutionError,
    GeodeError,
    InputError,
    InputMemoryError,
    OutOfMemoryError,
)
from geode.runtime import memlimit

MIB = 1 << 20


def outer_graph() -> geode.Graph:
    """``y = exp(x[:, None] * x[None, :])`` and its row sums: an N x N output from N
    inputs, the case a symbolic dim makes huge."""
    g = geode.Graph("outer")
    x = g.input("x", ["N"], "float32")
    y = ops.exp(ops.reshape(x, [-1, 1]) * ops.reshape(x, [1, -1]))
    g.output(y, ops.reduce_sum(y, axes=[1]), names=["y", "s"])
    return g


def peak_traced(fn) -> int:
    """The peak of memory traced (numpy's allocations included) while ``fn`` runs."""
    tracemalloc.start()
    try:
        fn()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


# ---------------------------------------------------------------------------------
# the limit
# ---------------------------------------------------------------------------------


def test_available_memory_is_positive_and_at_most_the_physical_memory() -> None:
    avail = memlimit.available_bytes()
    assert avail is not None and avail > 0
    with open("/proc/meminfo", encoding="utf-8") as f:
        total = int(next(line for line in f if line.startswith("MemTotal:")).split()[1]) * 1024
    assert avail <= total
    assert memlimit.limit(123 * MIB) == 123 * MIB
    assert memlimit.limit(0) is not None


def test_cgroup_limits_are_read(tmp_path) -> None:
    v2 = tmp_path / "v2"
    (v2 / "job").mkdir(parents=True)
    (v2 / "job" / "memory.max").write_text("1073741824\n", encoding="utf-8")
    (v2 / "job" / "memory.current").write_text("73741824\n", encoding="utf-8")
    proc = tmp_path / "cgroup"
    proc.write_text("0::/job\n", encoding="utf-8")
    assert memlimit.cgroup_left(proc, v2) == 1_000_000_000
    (v2 / "job" / "memory.max").write_text("max\n", encoding="utf-8")
    assert memlimit.cgroup_left(proc, v2) is None
    v1 = tmp_path / "v1"
    (v1 / "memory" / "a" / "b").mkdir(parents=True)
    (v1 / "memory" / "a" / "b" / "memory.limit_in_bytes").write_text("2000", encoding="utf-8")
    (v1 / "memory" / "a" / "b" / "memory.usage_in_bytes").write_text("500", encoding="utf-8")
    proc.write_text("4:memory:/a/b\n3:cpu:/\n", encoding="utf-8")
    assert memlimit.cgroup_left(proc, v1) == 1500
    (v1 / "memory" / "a" / "b" / "memory.limit_in_bytes").write_text(
        "9223372036854771712", encoding="utf-8"
    )
    assert memlimit.cgroup_left(proc, v1) is None


def test_check_names_what_needs_the_memory() -> None:
    memlimit.check(memlimit.CHECK_MIN_BYTES - 1, 1, "tiny")  # small requests: no check
    memlimit.check(100 * MIB, 200 * MIB, "fits")
    with pytest.raises(OutOfMemoryError) as exc:
        memlimit.check(300 * MIB, 200 * MIB, "model 'm': this run", "output 'y' float32[9]")
    msg = str(exc.value)
    assert "model 'm': this run needs 300.0 MiB (314572800 bytes)" in msg
    assert "200.0 MiB (209715200 bytes)" in msg and "memory_limit_mb" in msg
    assert msg.endswith("the largest is output 'y' float32[9]")
    assert isinstance(exc.value, (GeodeError, ExecutionError, MemoryError))
    assert memlimit.format_bytes(512) == "512 bytes"


# ---------------------------------------------------------------------------------
# compiled models
# ---------------------------------------------------------------------------------


def test_an_output_too_large_is_refused_before_allocating() -> None:
    model = geode.compile(outer_graph(), memory_limit_mb=256)
    x = np.linspace(-0.1, 0.1, 300, dtype=np.float32)
    out = model(x=x)  # small sizes run as always
    np.testing.assert_allclose(out["y"], np.exp(np.outer(x, x)), rtol=1e-5)
    big = np.zeros(16384, np.float32)  # y: 16384**2 float32 = 1 GiB
    caught = []

    def run():
        with pytest.raises(OutOfMemoryError) as exc:
            model(x=big)
        caught.append(exc.value)

    peak = peak_traced(run)
    assert peak < 64 * MIB, f"{peak} bytes were allocated before the refusal"
    msg = str(caught[0])
    assert msg.startswith("model 'outer': this run needs 1.0 GiB (1073807360 bytes)")
    assert "256.0 MiB" in msg and "memory_limit_mb" in msg
    assert "the largest is output 'y' float32[16384, 16384]: 1.0 GiB (1073741824 bytes)" in msg
    out = model(x=x)  # and the model still works afterwards
    np.testing.assert_allclose(out["s"], np.exp(np.outer(x, x)).sum(1, keepdims=True), rtol=1e-5)


def test_an_intermediate_too_large_is_refused_and_named(monkeypatch) -> None:
    monkeypatch.setenv("GEODE_MEMORY_LIMIT_MB", "128")
    g = geode.Graph("inter")
    x = g.input("x", ["N"], "float32")
    y = ops.exp(ops.reshape(x, [-1, 1]) * ops.reshape(x, [1, -1]))  # N x N, not an output
    g.output(ops.reduce_sum(y, axes=[1]), names=["s"])
    model = geode.compile(g, fusion=False)  # y lives in memory between steps
    x_small = np.linspace(-1, 1, 100, dtype=np.float32)
    np.testing.assert_allclose(
        model(x=x_small)["s"], np.exp(np.outer(x_small, x_small)).sum(1, keepdims=True), rtol=1e-5
    )
    with pytest.raises(
        OutOfMemoryError, match=r"intermediate '.*' float32\[8192, 8192\]: 256.0 MiB"
    ):
        model(x=np.ones(8192, np.float32))


def test_no_limit_set_means_the_memory_available() -> None:
    model = geode.compile(outer_graph())
    n = 1 << 20  # y: 4 TiB
    with pytest.raises(OutOfMemoryError, match=r"needs 4.0 TiB .* \(available memory;"):
        model(x=np.zeros(n, np.float32))


def test_a_broadcast_input_is_not_copied_to_full_size_blindly() -> None:
    g = geode.Graph("bcast")
    x = g.input("x", ["N"], "float32")
    g.output(ops.reduce_sum(x * 2.0, axes=[0]), names=["s"])
    model = geode.compile(g, memory_limit_mb=1024)
    huge = np.broadcast_to(np.float32(1.0), (1_000_000_000,))  # 4 GB as a copy, 4 bytes read
    caught = []

    def run():
        with pytest.raises(InputMemoryError) as exc:
            model(x=huge)
        caught.append(exc.value)

    assert peak_traced(run) < 64 * MIB
    assert isinstance(caught[0], InputError) and isinstance(caught[0], OutOfMemoryError)
    msg = str(caught[0])
    assert msg.startswith(
        "input 'x': float32[1000000000] is a strided view; its contiguous copy needs "
        "3.7 GiB (4000000000 bytes), more than the 1.0 GiB (1073741824 bytes)"
    ), msg
    small = np.broadcast_to(np.float32(0.5), (1000,))
    assert model(x=small)["s"] == pytest.approx(1000.0)


def test_a_memory_error_inside_a_step_names_the_step() -> None:
    model = geode.compile(outer_graph())
    x = np.ones(4, np.float32)
    model(x=x)
    step = model.plan.steps[0]

    def broke(ins, outs, env):
        raise MemoryError("cannot allocate")

    step.fn, saved = broke, step.fn
    try:
        with pytest.raises(OutOfMemoryError, match=rf"step {step.name!r} .* ran out of memory"):
            model(x=x)
    finally:
        step.fn = saved
    assert model(x=x)["y"].shape == (4, 4)
