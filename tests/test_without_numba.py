"""numba is an optional extra (``pip install "geode[numba]"``): with numba unimportable
(``sys.modules["numba"] = None`` in a fresh process, which is what ``import numba``
sees when it is not installed) the default LLVM backend compiles and runs graphs and
ONNX models to the bits it gives with numba installed, every geode module but the numba
backend's imports, and choosing the numba backend raises
:class:`~geode.errors.MissingDependencyError` naming the extra when the compile starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from test_pytorch_models import DATA, MODELS

import geode
from geode.costmodel import device
from geode.errors import MissingDependencyError
from geode.lazy import require_numba

ROOT = Path(geode.__file__).resolve().parent.parent
EXTRA = 'pip install "geode[numba]"'
#: the modules that import numba when imported: the numba backend and its runtime helpers
NUMBA_MODULES = {
    "geode.codegen.backends.chunks",
    "geode.codegen.backends.vmath",
    *(
        "geode.codegen.backends.numba" + ("" if p.stem == "__init__" else "." + p.stem)
        for p in (ROOT / "geode/codegen/backends/numba").glob("*.py")
    ),
}


def _without_numba(code: str, *args: str, env: dict | None = None) -> dict:
    """Run ``code`` in a fresh Python where numba cannot be imported; the JSON its last
    line prints."""
    script = "import sys\nsys.modules['numba'] = None\n" + textwrap.dedent(code)
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


#: a small graph (fused elementwise ops, a matmul, a reduction), built here and in the child
GRAPH = """
def small_graph():
    g = geode.Graph("g")
    x = g.input("x", ["N", 8])
    w = g.constant(np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8), "w")
    h = geode.ops.tanh(geode.ops.matmul(x, w)) + geode.ops.exp(x) * 2.0
    g.output(h, geode.ops.reduce_sum(h, axes=[-1], keepdims=0), names=["h", "s"])
    return g
"""
exec(GRAPH)  # defines small_graph


def test_llvm_backend_runs_models_without_numba(tmp_path):
    """A small graph (fused elementwise, a matmul, a reduction) and two ONNX models
    (BERT, a LLaMA block: the bench's kinds of model) compile and run with numba
    unimportable, to the same bits as here; numba's version is "none" in the keys."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 8)).astype(np.float32)
    want = {"g": geode.compile(small_graph(), progress=0)(x=x)}  # noqa: F821
    np.savez(tmp_path / "g_in.npz", x=x)
    names = ["torch_bert.onnx", "torch_llama.onnx"]
    for name in names:
        feeds = MODELS[name](rng)[0]
        want[name] = geode.compile(os.path.join(DATA, name), progress=0)(**feeds)
        np.savez(tmp_path / f"{name}_in.npz", **feeds)
    report = _without_numba(
        f"""
        import json, os
        import numpy as np
        import geode
        from geode.costmodel import device
        out = sys.argv[1]
        exec(sys.argv[2])
        got = geode.compile(small_graph(), progress=0)(**np.load(out + "/g_in.npz"))
        np.savez(out + "/g_out.npz", **got)
        for name in {names!r}:
            m = geode.compile(os.path.join({DATA!r}, name), progress=0)
            np.savez(out + f"/{{name}}_out.npz", **m(**np.load(out + f"/{{name}}_in.npz")))
        print(json.dumps({{"numba": sys.modules["numba"] is None,
                          "version": device.fingerprint()["numba_version"],
                          "backend": geode.config.current().backend}}))
        """,
        str(tmp_path),
        GRAPH,
        env={"GEODE_CACHE_DIR": str(tmp_path / "cache"), "GEODE_BACKEND": "llvm"},
    )  # fmt: skip
    assert report == {"numba": True, "version": "none", "backend": "llvm"}
    for key, outputs in want.items():
        got = dict(np.load(tmp_path / f"{key}_out.npz"))
        assert got.keys() == outputs.keys()
        for k in outputs:
            np.testing.assert_array_equal(got[k], outputs[k], err_msg=f"{key}: {k}")


def test_numba_backend_without_numba_says_how_to_install_it():
    """``backend="numba"`` (option or ``GEODE_BACKEND``) raises when the compile starts,
    before any stage, naming the extra; importing the backend's package does too."""
    report = _without_numba(
        """
        import json, os
        import numpy as np
        import geode
        from geode.errors import MissingDependencyError

        def attempt(fn):
            try:
                fn()
            except MissingDependencyError as exc:
                return str(exc)
            return "no error"

        g = geode.Graph("g")
        x = g.input("x", ["N", 8])
        g.output(geode.ops.exp(x) * 2.0, names=["y"])
        option = attempt(lambda: geode.compile(g, progress=0, backend="numba"))
        os.environ["GEODE_BACKEND"] = "numba"
        env = attempt(lambda: geode.compile(g, progress=0))
        package = attempt(lambda: __import__("geode.codegen.backends.numba"))
        print(json.dumps({"option": option, "env": env, "package": package}))
        """
    )
    for how, message in report.items():
        assert EXTRA in message, (how, message)
        assert "numba" in message.split(" needs ")[0], (how, message)


def test_only_the_numba_backend_imports_numba():
    """Every module of geode imports with numba unimportable except the numba backend's
    own (its package and the runtime helpers its kernels link: chunks, vmath)."""
    report = _without_numba(
        """
        import importlib, json, pathlib
        import geode
        root = pathlib.Path(geode.__file__).parent
        failed = {}
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root.parent).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            if name == "geode.__main__":
                continue
            try:
                importlib.import_module(name)
            except Exception as exc:
                failed[name] = type(exc).__name__
        print(json.dumps(failed))
        """
    )
    assert set(report) == NUMBA_MODULES
    # the backend's package says how to get numba; the helpers fail on their import line
    assert report["geode.codegen.backends.numba"] == "MissingDependencyError"


def test_require_numba_and_the_version_without_numba(monkeypatch):
    """In-process: ``require_numba`` raises the error naming the extra, and the device
    fingerprint's numba version is "none", when numba cannot be imported."""
    monkeypatch.setitem(sys.modules, "numba", None)
    device.numba_version.cache_clear()
    try:
        assert device.numba_version() == "none"
        with pytest.raises(
            MissingDependencyError, match=r"the numba backend needs numba.*geode\[numba\]"
        ):
            require_numba("the numba backend")
    finally:
        device.numba_version.cache_clear()
