"""geode.lazy: ``import geode``, loading a model file and running it import neither sympy
nor onnx nor numba nor llvmlite's binding (the compiler's dependencies) nor ray
(distributed tuning's), in a fresh process; the first compile imports sympy, and a
loaded model with symbolic dims gives the compiled model's bits at every input size."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from test_pytorch_models import DATA, MODELS

import geode
from geode.lazy import LazyModule

_HEAVY = ("sympy", "onnx", "numba", "ray", "llvmlite.binding")
#: what loading compiled code needs none of: the code generator's emitting side (a
#: loaded chain's entry, a key-tiled body: linked from object code)
_LOADING = _HEAVY + tuple(
    f"geode.codegen.backends.llvm.{m}" for m in ("emit", "kernel", "background", "stmts")
)


def _child(code: str, *args: str, env: dict | None = None) -> dict:
    """Run ``code`` in a fresh Python; the JSON its last line prints."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_import_geode_imports_no_compiler_dependency():
    report = _child(
        f"""
        import json, sys
        import geode
        assert callable(geode.compile) and callable(geode.load) and geode.Session
        print(json.dumps({{m: m in sys.modules for m in {_HEAVY!r}}}))
        """
    )
    assert report == dict.fromkeys(_HEAVY, False)


@pytest.mark.parametrize("name", ["torch_bert.onnx", "torch_resnet.onnx"])
def test_load_and_run_import_no_sympy(name, tmp_path):
    """Symbolic batch and sequence (BERT), symbolic image sizes through convolutions and
    pools (ResNet: floor expressions): every size of the compiled model's feeds."""
    model = geode.load(os.path.join(DATA, name))
    feeds = MODELS[name](np.random.default_rng(3))
    model.save(tmp_path / "m.geode")
    for i, f in enumerate(feeds):
        np.savez(tmp_path / f"in{i}.npz", **f)
    report = _child(
        f"""
        import json, sys
        import numpy as np
        import geode
        model = geode.load(sys.argv[1])
        for i in range({len(feeds)}):
            np.savez(sys.argv[2] + f"/out{{i}}.npz", **model.run(dict(np.load(sys.argv[2] + f"/in{{i}}.npz"))))
        print(json.dumps({{m: m in sys.modules for m in {_LOADING!r}}}))
        """,
        str(tmp_path / "m.geode"),
        str(tmp_path),
        env={"GEODE_CACHE_DIR": str(tmp_path / "cache")},
    )
    # the conv and pool kernels' classes still import the code generator (ResNet)
    unwanted = _LOADING if name == "torch_bert.onnx" else _HEAVY
    assert {m: v for m, v in report.items() if m in unwanted} == dict.fromkeys(unwanted, False)
    for i, f in enumerate(feeds):
        got = dict(np.load(tmp_path / f"out{i}.npz"))
        want = model.run(f)
        assert got.keys() == want.keys()
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])


def test_first_compile_imports_sympy():
    report = _child(
        """
        import json, sys
        import numpy as np
        import geode
        before = "sympy" in sys.modules
        g = geode.Graph("g")
        x = g.input("x", ["N", 8])
        g.output(geode.ops.exp(x) * 2.0, names=["y"])
        y = geode.compile(g, progress=0)(x=np.ones((3, 8), np.float32))["y"]
        print(json.dumps({"before": before, "after": "sympy" in sys.modules,
                          "search": "geode.compiler.fusion.search" in sys.modules,
                          "ok": bool(np.allclose(y, 2 * np.e))}))
        """
    )
    # the fusion plan search is imported by a compile that asks for it only
    assert report == {"before": False, "after": True, "search": False, "ok": True}


def test_lazy_module_keeps_what_it_handed_out():
    m = LazyModule("json")
    assert m.dumps is json.dumps  # imported on this first read
    assert "dumps" in vars(m)  # kept: the next read is a plain attribute
    assert "imported" in repr(m)
    with pytest.raises(AttributeError, match="lazily"):
        m.dumps = None
    with pytest.raises(AttributeError):
        m.no_such_function  # noqa: B018


def test_a_model_cache_hit_imports_no_sympy(tmp_path):
    """A compile the model cache answers is a load: no sympy, no onnx (the ONNX file is
    keyed by its bytes)."""
    code = f"""
        import json, sys
        import numpy as np
        import geode
        m = geode.compile({os.path.join(DATA, "torch_block.onnx")!r}, progress=0)
        m(x=np.ones((1, 4, 16), np.float32))
        print(json.dumps({{"cached": "model_cache" in m.stats,
                          **{{k: k in sys.modules for k in {_LOADING!r}}}}}))
        """
    env = {"GEODE_CACHE_DIR": str(tmp_path / "cache"), "GEODE_MODEL_CACHE": "1"}
    first = _child(code, env=env)
    assert first["cached"] is False and first["sympy"] is True  # compiled: the compiler ran
    assert _child(code, env=env) == {"cached": True, **dict.fromkeys(_LOADING, False)}
