"""The engines (geode/runtime/engines.py): the AI Core step built from a NativeKernel."""

from __future__ import annotations

import numpy as np
import pytest

from geode.errors import ExecutionError
from geode.runtime.engines import ENGINES, IndexBound, NativeKernel, view


def _add_rows(x: np.ndarray, idx: np.ndarray, out: np.ndarray, n: int, **launch: int) -> None:
    """out[i] = x[idx[i]] + n (a Gather-like kernel taking one dim argument)."""
    for i in range(out.shape[0]):
        out[i] = x[idx[i]] + n
    calls.append(launch)


calls: list[dict[str, int]] = []


def _kernel(**kw: object) -> NativeKernel:
    args = dict(
        name="k",
        fn=_add_rows,
        n_inputs=2,
        out_shapes=[lambda env: (env["M"], env["K"])],
        out_dtypes=[np.dtype(np.float32)],
        dims=[lambda env: env["N"]],
        index_bounds=[IndexBound("Gather:g", 0, lambda env: env["N"], 1)],
    )
    args.update(kw)
    return NativeKernel(**args)


def test_step_computes_dims_and_allocates_outputs() -> None:
    calls.clear()
    step = ENGINES["aicore"].bind("k", _kernel())
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    idx = np.array([2, 0], np.int64)
    (out,) = step([x, idx], [None], {"M": 2, "K": 2, "N": 3})
    np.testing.assert_array_equal(out, x[[2, 0]] + 3)
    assert calls == [{}]


def test_step_writes_the_planned_buffer() -> None:
    step = ENGINES["aicore"].bind("k", _kernel())
    buf = np.zeros((2, 2), np.float32)
    x = np.ones((3, 2), np.float32)
    (out,) = step([x, np.array([1, 1])], [buf], {"M": 2, "K": 2, "N": 3})
    assert out is buf and (buf == 4).all()


def test_step_checks_indices_before_the_launch() -> None:
    step = ENGINES["aicore"].bind("k", _kernel())
    x = np.ones((3, 2), np.float32)
    with pytest.raises(ExecutionError, match=r"Gather:g: index 3 is out of range for axis 0"):
        step([x, np.array([0, 3])], [None], {"M": 2, "K": 2, "N": 3})
    bound = IndexBound("Gather:c", 1, lambda env: 4, None, np.array([-5]))
    step = ENGINES["aicore"].bind("k", _kernel(index_bounds=[bound]))
    with pytest.raises(ExecutionError, match=r"index -5 .* \(valid: -4 to 3\)"):
        step([x, np.array([0, 1])], [None], {"M": 2, "K": 2, "N": 3})


def test_threads_are_set_before_each_call_or_passed_at_launch() -> None:
    seen: list[int] = []
    calls.clear()
    env = {"M": 1, "K": 2, "N": 3}
    x, idx = np.ones((3, 2), np.float32), np.array([0])
    step = ENGINES["aicore"].bind("k", _kernel(threads=3, set_threads=seen.append))
    step([x, idx], [None], env)
    step([x, idx], [None], env)
    assert seen == [3, 3] and calls == [{}, {}]
    step = ENGINES["aicore"].bind(
        "k", _kernel(threads=2, launch_threads=True, set_threads=seen.append)
    )
    step([x, idx], [None], env)
    assert seen == [3, 3] and calls[-1] == {"threads": 2}


def test_views_reshape_arguments() -> None:
    got: list[tuple[int, ...]] = []

    def fn(a: np.ndarray, out: np.ndarray) -> None:
        got.extend([a.shape, out.shape])
        out[...] = a.sum(axis=1)

    k = NativeKernel("v", fn, 1, [lambda env: (2,)], [np.dtype(np.float64)], views=[(0, 1), None])
    a = np.ones((2, 3, 4))
    (out,) = ENGINES["aicore"].bind("v", k)([a], [None], {})
    assert got == [(2, 12), (2,)] and (out == 12).all()
    assert view(np.zeros((2, 3, 4, 5)), (0, 2)).shape == (6, 20)


def test_a_non_contiguous_output_is_refused_when_viewed() -> None:
    k = NativeKernel(
        "v", lambda a, o: None, 1, [lambda env: (2, 2)], [np.dtype(np.float64)], views=[None, (0,)]
    )
    buf = np.zeros((2, 4))[:, ::2]
    with pytest.raises(ExecutionError, match="step 'v': kernel output 0 is not C-contiguous"):
        ENGINES["aicore"].bind("v", k)([np.ones(4)], [buf], {})


def test_an_aicpu_result_that_views_its_input_is_copied() -> None:
    """A reference kernel may return a view of its input (a Transpose of [N, 1] is one);
    with no planned buffer the step copies it, since the input's memory may be an arena
    buffer the plan reuses (found by geode.fuzz: a float16 Transpose output read the
    values of a later step)."""
    x = np.arange(4, dtype=np.float16).reshape(4, 1)
    step = ENGINES["aicpu"].bind("t", lambda ins: [np.ascontiguousarray(ins[0].T)])
    (out,) = step([x], [], {})
    assert not np.may_share_memory(out, x)
    x[:] = -1  # the arena reuses the input's memory
    assert out.tolist() == [[0, 1, 2, 3]]
    fresh = ENGINES["aicpu"].bind("n", lambda ins: [ins[0] + 1])
    (y,) = fresh([x], [], {})
    assert y.tolist() == [[0]] * 4  # results of their own are not copied again


def test_a_float16_transpose_output_is_not_overwritten_by_later_steps() -> None:
    """End to end: Tanh and Transpose of float16 run on AICPU; the Transpose's output
    (a model output) must keep its values while later steps reuse the arena."""
    import tempfile

    import geode
    from geode import ops
    from geode.compiler.interpret import run_reference

    g = geode.Graph("f16_transpose")
    x0 = g.input("x0", ["N", 1], "float16")
    x1 = g.input("x1", [], "float16")
    x2 = g.input("x2", ["N", 1], "float16")
    g.output(ops.sum(x0, x1, x2), ops.transpose(ops.tanh(x2)), names=["s", "t"])
    model = geode.compile(g, cache_dir=tempfile.mkdtemp())
    rng = np.random.default_rng(0)
    feeds = {
        "x0": rng.normal(size=(4, 1)).astype(np.float16),
        "x1": np.asarray(0.5, np.float16),
        "x2": rng.normal(size=(4, 1)).astype(np.float16),
    }
    want = run_reference(g, feeds)
    got = model.run(feeds)
    for name in ("s", "t"):
        np.testing.assert_array_equal(got[name], want[name])
