"""The benchmark workloads, each implemented for every compared system.

Every workload is float32 with about 64 MiB per input. Systems: geode, numpy, torch
eager, torch.compile, jax.jit, onnxruntime (the geode graph exported to ONNX). A
system that is not installed is reported as missing, never silently skipped.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from geode import examples

ROWS, COLS = 4096, 4096


@dataclass
class Workload:
    """One benchmark problem: the geode example, its inputs, and the bytes it must move."""

    name: str
    example: examples.Example
    inputs: dict[str, np.ndarray]

    @property
    def bytes_moved(self) -> int:
        """Compulsory traffic: every input read once, every output written once."""
        outs = self.example.numpy(**{k: v[:1] for k, v in self.inputs.items()})
        rows = next(iter(self.inputs.values())).shape[0]
        out_bytes = sum(o.nbytes // max(1, o.shape[0]) * rows for o in outs.values())
        return sum(v.nbytes for v in self.inputs.values()) + out_bytes


def workloads(scale: float = 1.0) -> list[Workload]:
    """The six issue-3 workloads; ``scale`` < 1 shrinks the rows (quick runs, tests)."""
    rng = np.random.default_rng(0)
    rows = max(8, int(ROWS * scale))
    out = []

    def add(name: str, ex: examples.Example, n: int) -> None:
        out.append(Workload(name, ex, ex.make_inputs(rng, n)))

    add("rmsnorm", examples.rmsnorm(hidden=COLS), rows)
    add("layernorm", examples.layernorm(hidden=COLS), rows)
    add("softmax", examples.softmax(hidden=COLS), rows)
    add("bias_gelu_tanh", examples.gelu(hidden=COLS, approximate="tanh", with_bias=True), rows)
    chain = examples.reduce_chain(inner=1024)
    s1 = max(1, int(16 * scale))
    out.append(
        Workload(
            "reduce_chain", chain, {"x": rng.standard_normal((s1, 1024, 1024), dtype=np.float32)}
        )
    )
    add("lstm_gates", examples.lstm_gates(hidden=COLS // 4), rows)
    return out


# -- per-system implementations --------------------------------------------------------


def _torch_fns() -> dict[str, Callable]:
    import torch

    def rmsnorm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w

    def layernorm(x: torch.Tensor, g: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.layer_norm(x, (x.shape[-1],), g, b, 1e-5)

    def softmax(x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, -1)

    def bias_gelu(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x + b, approximate="tanh")

    def chain(x: torch.Tensor) -> torch.Tensor:
        s = (x * 2 + 1).sum(-1, keepdim=True) * 2
        return s.expand_as(x) + 1

    def lstm(z: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        i, f, g, o = z.chunk(4, 1)
        c2 = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c2), c2

    return {
        "rmsnorm": rmsnorm,
        "layernorm": layernorm,
        "softmax": softmax,
        "bias_gelu_tanh": bias_gelu,
        "reduce_chain": chain,
        "lstm_gates": lstm,
    }


def _jax_fns() -> dict[str, Callable]:
    import jax
    import jax.numpy as jnp

    def rmsnorm(x, w):  # noqa: ANN001, ANN202
        return x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w

    def layernorm(x, g, b):  # noqa: ANN001, ANN202
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        return (x - m) * jax.lax.rsqrt(v + 1e-5) * g + b

    def softmax(x):  # noqa: ANN001, ANN202
        return jax.nn.softmax(x, axis=-1)

    def bias_gelu(x, b):  # noqa: ANN001, ANN202
        return jax.nn.gelu(x + b, approximate=True)

    def chain(x):  # noqa: ANN001, ANN202
        s = (x * 2 + 1).sum(-1, keepdims=True) * 2
        return jnp.broadcast_to(s, x.shape) + 1

    def lstm(z, c):  # noqa: ANN001, ANN202
        i, f, g, o = jnp.split(z, 4, axis=1)
        c2 = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        return jax.nn.sigmoid(o) * jnp.tanh(c2), c2

    return {
        "rmsnorm": rmsnorm,
        "layernorm": layernorm,
        "softmax": softmax,
        "bias_gelu_tanh": bias_gelu,
        "reduce_chain": chain,
        "lstm_gates": lstm,
    }


def _consts(w: Workload) -> list[np.ndarray]:
    g = w.example.graph
    names = {"rmsnorm": ["weight"], "layernorm": ["gamma", "beta"], "bias_gelu_tanh": ["bias"]}.get(
        w.name, []
    )
    return [g.values[n].data for n in names]


def build(system: str, w: Workload, threads: int) -> Callable[[], object]:
    """A zero-argument callable running workload ``w`` on ``system`` (ImportError if absent)."""
    args = list(w.inputs.values()) + _consts(w)
    if system == "numpy":
        return lambda: w.example.numpy(**w.inputs)
    if system in ("geode", "geode-numba"):
        import geode

        backend = "numba" if system == "geode-numba" else "llvm"
        model = geode.compile(w.example.graph, num_threads=threads, backend=backend)
        return lambda: model(**w.inputs)
    if system in ("torch", "torch.compile"):
        import torch

        torch.set_num_threads(threads)
        fn = _torch_fns()[w.name]
        if system == "torch.compile":
            fn = torch.compile(fn)
        targs = [torch.from_numpy(a) for a in args]
        with torch.no_grad():
            fn(*targs)
        return lambda: fn(*targs)
    if system == "jax":
        import jax

        fn = jax.jit(_jax_fns()[w.name])
        jargs = [jax.device_put(a) for a in args]

        def run() -> object:
            return jax.block_until_ready(fn(*jargs))

        run()
        return run
    if system == "onnxruntime":
        import onnxruntime as ort

        from geode.compiler.frontend.onnx_export import to_onnx

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        sess = ort.InferenceSession(
            to_onnx(w.example.graph).SerializeToString(), so, providers=["CPUExecutionProvider"]
        )
        return lambda: sess.run(None, w.inputs)
    raise ValueError(f"unknown system {system!r}")


#: the systems compared; ``geode`` is the default (LLVM) backend, ``geode-numba`` the
#: previous numba backend, kept for the comparison
SYSTEMS = ("geode", "geode-numba", "numpy", "torch", "torch.compile", "jax", "onnxruntime")


def load_runtimes(systems: list[str], threads: int) -> dict[str, str]:
    """Import the libraries behind ``systems`` and start torch's thread pool, before geode
    or the roofline copies run any numba parallel code; returns ``{system: import error}``
    for those that are not installed.

    Why: numba's OpenMP threading layer loads the system's ``libgomp.so.1``. A torch
    imported after that binds to the same library (its own bundled copy has the same
    soname, so the dynamic linker reuses the loaded one), and its eager kernels then ran
    40-70x slower: the LSTM gates at [4096, 1024] took 1.1-1.7 s instead of 23-28 ms (two
    Zen 4 cores, torch 2.13). Imported first, torch keeps its own OpenMP runtime, as in a
    user's process that imports torch before running geode.
    """
    missing: dict[str, str] = {}
    for system in systems:
        try:
            if system in ("torch", "torch.compile"):
                import torch

                torch.set_num_threads(threads)
                torch.ones(1 << 16).sigmoid_()  # starts torch's OpenMP pool
            elif system == "jax":
                import jax  # noqa: F401
            elif system == "onnxruntime":
                import onnxruntime  # noqa: F401
        except ImportError as exc:
            missing[system] = str(exc)
    return missing


def _copy_kernel(name: str, stream: bool) -> object:
    """A row copy ``Y[i, j] = X[i, j]`` over ``[N, COLS]`` compiled by geode's LLVM backend
    (parallel over rows, vectorized); ``stream``: each row staged and written with
    non-temporal stores (``StreamStore``), as geode's streamed kernels do."""
    from geode.codegen import ast as A
    from geode.codegen.backends.llvm.kernel import compile_kernel

    n, c = A.Var("N"), A.Const(COLS)
    x, y = A.Buffer("X", "float32", (n, c)), A.Buffer("Y", "float32", (n, c))
    iv = [A.IterVar("vi", n), A.IterVar("vj", c)]
    temps = []
    if stream:
        temps = [A.Buffer("S", "float32", (c,), "local")]
        stage = A.Block(
            "s",
            iv,
            [A.Var("i"), A.Var("j")],
            [A.Store("S", (A.Var("vj"),), A.Load("X", (A.Var("vi"), A.Var("vj"))))],
        )
        row = [
            A.For("j", c, [stage], A.ForKind.VECTORIZED),
            A.StreamStore(
                "Y", A.Bin("*", A.Var("i"), c), "S", A.Const(0), c, A.Const(True, "bool")
            ),
        ]
    else:
        blk = A.Block(
            "c",
            iv,
            [A.Var("i"), A.Var("j")],
            [A.Store("Y", (A.Var("vi"), A.Var("vj")), A.Load("X", (A.Var("vi"), A.Var("vj"))))],
        )
        row = [A.For("j", c, [blk], A.ForKind.VECTORIZED)]
    body = [A.For("i", n, row, A.ForKind.PARALLEL)]
    return compile_kernel(A.Kernel(name, [x], [y], ["N"], body, temps))


def roofline_copies(nbytes: int = 64 << 20) -> dict[str, Callable[[], None]]:
    """Copy kernels over ``nbytes``: a row copy compiled by geode's LLVM backend (by rows of
    ``COLS`` like the workloads, on geode's thread pool), numpy's memcpy, and the same row
    copy with non-temporal (streaming) stores into a cache-line aligned buffer (the stored
    lines are not read first, so it moves two thirds of an ordinary copy's bytes). The
    fastest is the memory-bandwidth roofline (read + write of every byte).

    The copies run on geode's native pool, whose idle workers sleep: numba's OpenMP
    workers, which the copies used before, spin for 200 ms after a call and took a core
    from whatever ran next between them (the LLVM backend's kernels measured 1.3-1.9x
    slower paired with them)."""
    from geode.runtime.memory import Arena

    copy_rows = _copy_kernel("copy_rows", stream=False)
    stream_rows = _copy_kernel("stream_rows", stream=True)
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    src2, dst2 = src.reshape(-1, COLS), dst.reshape(-1, COLS)
    rows = src2.shape[0]
    arena = Arena()  # a cache-line aligned destination
    arena.ensure(nbytes)
    dst3 = arena.view(0, src2.shape, np.float32)
    copy_rows(src2, dst2, rows)
    stream_rows(src2, dst3, rows)
    return {
        "row copy": lambda: copy_rows(src2, dst2, rows),
        "np.copyto": lambda: np.copyto(dst, src),
        "streaming row copy": lambda: stream_rows(src2, dst3, rows),
    }


def geomean(xs: list[float]) -> float:
    """Geometric mean (nan for an empty list)."""
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")
