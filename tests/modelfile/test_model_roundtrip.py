"""Model files: a compiled model saved and loaded gives bit-identical outputs, in this
process and in a fresh one that runs no compiler; variables keep their values."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_pytorch_models import DATA, MODELS

import geode
from geode import examples
from geode.errors import ModelFileError


def _same(a: dict, b: dict) -> None:
    assert set(a) == set(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def _roundtrip(model, path, feeds_list) -> geode.CompiledModel:
    size = model.save(path)
    assert size == os.path.getsize(path)
    with geode.Session() as sess:
        loaded = sess.load(path)
        assert "no compiler run" in loaded.explain()
        for feeds in feeds_list:
            _same(model.run(feeds), loaded.run(feeds))
    return loaded


@pytest.mark.parametrize("name", sorted(examples.ALL))
def test_examples_roundtrip(name, tmp_path):
    ex = examples.ALL[name]()
    model = geode.compile(ex.graph)
    rng = np.random.default_rng(3)
    _roundtrip(model, tmp_path / "m.geode", [ex.make_inputs(rng, n) for n in (1, 5)])


@pytest.mark.parametrize("name", sorted(MODELS))
def test_pytorch_models_roundtrip(name, tmp_path):
    """Conv, pools, LSTM/GRU, attention, GEMMs with fused epilogues, views, host steps."""
    model = geode.load(os.path.join(DATA, name))
    feeds = MODELS[name](np.random.default_rng(0))[:2]
    loaded = _roundtrip(model, tmp_path / "m.geode", feeds)
    assert [k.name for k in loaded.kernels] == [k.name for k in model.kernels]
    assert [k.kind for k in loaded.kernels] == [k.kind for k in model.kernels]


def test_empty_and_scalar_tensors(tmp_path):
    g = geode.Graph("empty")
    x = g.input("x", ["N", 3])
    empty = g.constant(np.zeros((0, 3), np.float32), "empty")
    scalar = g.constant(np.float32(2.5), "scalar")
    g.output(g.op("Concat", g.op("Mul", x, scalar), empty, axis=0), names=["y"])
    model = geode.compile(g)
    feeds = [{"x": np.arange(6, dtype=np.float32).reshape(2, 3)}, {"x": np.ones((0, 3), "f4")}]
    _roundtrip(model, tmp_path / "m.geode", feeds)


def test_loaded_model_saves_again(tmp_path):
    ex = examples.ALL["layernorm"]()
    model = geode.compile(ex.graph)
    model.save(tmp_path / "a.geode")
    again = geode.load(tmp_path / "a.geode")
    again.save(tmp_path / "b.geode")
    feeds = ex.make_inputs(np.random.default_rng(0), 3)
    _same(model.run(feeds), geode.load(tmp_path / "b.geode").run(feeds))


def test_loaded_kernels_share_one_library(tmp_path, monkeypatch):
    """A model file's kernels are linked in one link (codegen/images.py): one library
    for all, the GEMM entries calling their epilogues inside it; then each chain's entry
    (its object from the file, linked to the kernels' addresses) in one link of its own."""
    from geode.codegen.backends.llvm import linker

    model = geode.load(os.path.join(DATA, "torch_bert.onnx"))
    model.save(tmp_path / "bert.geode")
    links, real = [], linker.link
    monkeypatch.setattr(linker, "link", lambda objs, *a: links.append(len(objs)) or real(objs, *a))
    feeds = MODELS["torch_bert.onnx"](np.random.default_rng(2))
    loaded = geode.load(tmp_path / "bert.geode", session=geode.Session())
    for f in feeds:
        _same(model.run(f), loaded.run(f))
    chains = [s for s in loaded.plan.steps if s.info.get("chain_entry") is not None]
    assert chains and all(s.info["chain_entry"].source == "model file" for s in chains)
    assert len(links) == 1 + len(chains) and links[0] > 3 and set(links[1:]) == {1}


def test_kernel_source_and_explain_survive(tmp_path):
    ex = examples.ALL["softmax"]()
    model = geode.compile(ex.graph)
    model.save(tmp_path / "m.geode")
    loaded = geode.load(tmp_path / "m.geode")
    native = [k for k in model.kernels if k.engine == "aicore"]
    got = [k for k in loaded.kernels if k.engine == "aicore"]
    assert native and [k.source for k in native] == [k.source for k in got]
    assert loaded.explain().endswith(model.explain())
    assert loaded.to_dot() == model.to_dot()
    assert "define" in got[0].llvm


def _variable_graph() -> geode.Graph:
    g = geode.Graph("with_var")
    x = g.input("x", ["N", 4])
    w = g.variable(np.arange(4, dtype=np.float32), "w")
    g.output(g.op("Mul", x, w), names=["y"])
    return g


def test_variable_snapshot_is_saved(tmp_path):
    model = geode.compile(_variable_graph(), session=geode.Session())
    key = next(s.var_key for s in model.plan.slots if s.name == "w")
    model.var_manager.assign(key, np.full(4, 2.0, np.float32))
    model.save(tmp_path / "m.geode")
    with geode.Session() as sess:
        loaded = sess.load(tmp_path / "m.geode")
        y = loaded.run({"x": np.ones((2, 4), np.float32)})["y"]
        np.testing.assert_array_equal(y, np.full((2, 4), 2.0, np.float32))


def test_variable_shared_in_session_keeps_its_value(tmp_path):
    sess = geode.Session()
    model = geode.compile(_variable_graph(), session=sess)
    model.save(tmp_path / "m.geode")
    key = next(s.var_key for s in model.plan.slots if s.name == "w")
    sess.var_manager.assign(key, np.full(4, 5.0, np.float32))
    loaded = sess.load(tmp_path / "m.geode")  # the session's variable, not the snapshot
    y = loaded.run({"x": np.ones((1, 4), np.float32)})["y"]
    np.testing.assert_array_equal(y, np.full((1, 4), 5.0, np.float32))


def _external_model(folder) -> str:
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    init = numpy_helper.from_array(w, "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "ext",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        [init],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    path = os.path.join(folder, "ext.onnx")
    onnx.save_model(proto, path, save_as_external_data=True, size_threshold=0, location="w.bin")
    return path


@pytest.mark.parametrize("mode", ["embed", "reference"])
def test_external_data(tmp_path, mode):
    src = _external_model(tmp_path)
    model = geode.load(src)
    out = tmp_path / "m.geode"
    model.save(out, external_data=mode)
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    want = model.run({"x": x})
    _same(want, geode.load(out, session=geode.Session()).run({"x": x}))
    with open(tmp_path / "w.bin", "r+b") as f:  # the weights change behind the file's back
        f.write(b"\x01\x02\x03\x04")
    if mode == "embed":
        _same(want, geode.load(out, session=geode.Session()).run({"x": x}))
    else:
        with pytest.raises(ModelFileError, match="sha256"):
            geode.load(out, session=geode.Session()).run({"x": x})


_CHILD = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import geode
    from geode import spine
    from geode.codegen.backends.llvm import jit

    def refuse(*a, **k):
        raise AssertionError("a compiler ran while loading a model file")

    jit.compile_ir = refuse          # no LLVM optimizer or code generator
    spine.compile_graph = refuse     # no geode pipeline
    feeds = dict(np.load(sys.argv[2]))
    model = geode.load(sys.argv[1])
    out = model.run(feeds)
    np.savez(sys.argv[3], **out)
    print(json.dumps({"numba": "numba" in sys.modules, "onnx": "onnx" in sys.modules,
                      "load_ms": model.stats["timings"]["total"] * 1e3}))
    """
)


def test_fresh_process_loads_without_compiling(tmp_path):
    path = os.path.join(DATA, "torch_bert.onnx")
    model = geode.load(path)
    feeds = MODELS["torch_bert.onnx"](np.random.default_rng(1))[2]
    model.save(tmp_path / "bert.geode")
    np.savez(tmp_path / "feeds.npz", **feeds)
    script = tmp_path / "child.py"
    script.write_text(_CHILD, encoding="utf-8")
    env = {**os.environ, "GEODE_CACHE_DIR": str(tmp_path / "empty_cache")}
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "bert.geode"), str(tmp_path / "feeds.npz"),
         str(tmp_path / "out.npz")],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report == {**report, "numba": False, "onnx": False}
    _same(model.run(feeds), dict(np.load(tmp_path / "out.npz")))
    assert not os.path.exists(tmp_path / "empty_cache" / "kernels")  # nothing compiled


def test_training_graph_resumes_from_its_file(tmp_path):
    """An SGD loop written as a graph (Assign): saved after 3 steps, loaded into a new
    session, it goes on from the saved weights, step for step like numpy."""
    from test_variables import X, Y, numpy_sgd, sgd_graph

    with geode.Session() as sess:
        train = sess.compile(sgd_graph())
        w = np.zeros((X.shape[1], 1), np.float32)
        for _ in range(3):
            train(x=X, y=Y)
            w, _ = numpy_sgd(w)
        train.save(tmp_path / "train.geode")
    with geode.Session() as sess:
        resumed = sess.load(tmp_path / "train.geode")
        np.testing.assert_allclose(sess.get_variable("w"), w, rtol=1e-5, atol=1e-6)
        for _ in range(3):
            loss = float(resumed(x=X, y=Y)["loss"])
            w, want = numpy_sgd(w)
            np.testing.assert_allclose(loss, want, rtol=1e-5)
        np.testing.assert_allclose(sess.get_variable("w"), w, rtol=1e-5, atol=1e-6)


def test_weight_kept_in_its_accelerated_format(tmp_path):
    """A variable stored transposed (format acceleration) is saved in that format and
    loaded without converting it again; read out, it is in the user's layout."""
    from test_variables import _linear_graph

    from geode.runtime import var_format

    w0 = np.random.default_rng(5).standard_normal((6, 8)).astype(np.float32)
    x = np.random.default_rng(6).standard_normal((3, 8)).astype(np.float32)
    with geode.Session() as sess:
        model = sess.compile(_linear_graph(w0))
        model.save(tmp_path / "lin.geode")
    with geode.Session() as sess:
        start = var_format.conversions()
        loaded = sess.load(tmp_path / "lin.geode")
        assert var_format.conversions() == start  # stored as it was: no conversion
        assert sess.var_manager.info("W").key.format == "TRANSPOSED(1,0)"
        np.testing.assert_allclose(loaded(x=x)["y"], x @ w0.T + 1.0, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(sess.get_variable("W"), w0)


def test_symbolic_broadcast_and_its_check_survive(tmp_path):
    """``x[N, 16] + y[M, 16]``: the ``bcast(M, N)`` dims and the run-time check that N and
    M broadcast come back from the file."""
    g = geode.Graph("bcast")
    x, y = g.input("x", ["N", 16]), g.input("y", ["M", 16])
    g.output(g.op("Mul", g.op("Exp", g.op("Add", x, y)), x), names=["z"])
    model = geode.compile(g)
    rng = np.random.default_rng(0)
    feeds = [
        {
            "x": rng.standard_normal((n, 16)).astype("f4"),
            "y": rng.standard_normal((m, 16)).astype("f4"),
        }
        for n, m in ((4, 4), (1, 5), (5, 1))
    ]
    loaded = _roundtrip(model, tmp_path / "m.geode", feeds)
    with pytest.raises(geode.GeodeError, match="cannot broadcast"):
        loaded.run({"x": np.ones((5, 16), "f4"), "y": np.ones((6, 16), "f4")})
