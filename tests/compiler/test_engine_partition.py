"""Per-engine subgraphs with PlaceHolder/End boundaries (``compiler/partition/engine.py``),
built by the ``engines`` stage and printed by ``model.explain()``."""

import numpy as np

import geode
from geode import ops
from geode.compiler.partition.engine import DATA, NET_OUTPUT, partition_engines


def test_subgraphs_boundaries_and_their_printed_form():
    g = geode.Graph("engines")
    x = g.input("x", ["N", 8])
    a = ops.exp(x) * 2.0
    nz = ops.cast(ops.non_zero(a > 3.0), to=1)
    g.output(ops.sigmoid(nz), ops.tanh(a), names=["z", "b"])
    model = geode.compile(g)
    text = model.explain()
    part = text[text.index("engine partition:") : text.index("memory plan:")].rstrip()
    lines = part.splitlines()
    assert lines[0] == "engine partition: 4 subgraphs, 3 PlaceHolder/End pairs"
    assert lines[1:4] == [
        "  subgraph 0 [data] (1 inputs)",
        "    Data: x",
        "    End #0 x -> subgraph 1",
    ]
    assert "  subgraph 1 [aicore] (4 nodes)" in lines
    assert "    PlaceHolder #0 x <- subgraph 0" in lines
    assert "  subgraph 2 [host] (1 nodes)" in lines
    assert "    steps: nonzero" in lines
    assert "  subgraph 3 [aicore] (2 nodes)" in lines
    ends = [ln.strip() for ln in lines if ln.strip().startswith("End #")]
    assert sum(e.endswith("-> NetOutput") for e in ends) == 2
    # each PlaceHolder's peer is an End of the subgraph it names
    for ln in lines:
        if ln.strip().startswith("PlaceHolder #"):
            peer = ln.split("#")[1].split()[0]
            value, src = ln.split()[2], ln.split()[-1]
            block = part.split(f"subgraph {src} [")[1].split("\n  subgraph")[0]
            assert f"End #{peer} {value} -> subgraph" in block


def test_a_path_through_another_engine_keeps_two_subgraphs():
    # exp -> NonZero (host) -> ... -> mul, and exp -> mul directly: one aicore subgraph
    # holding exp and mul would feed the host subgraph and depend on it
    g = geode.Graph("cycle")
    x = g.input("x", ["N", 8])
    a = ops.exp(x)
    u = ops.reduce_sum(ops.cast(ops.non_zero(a), to=1), axes=[0, 1], keepdims=1)
    g.output(a * u, names=["y"])
    model = geode.compile(g)
    text = model.explain()
    engines = [
        ln.split("[")[1].split("]")[0]
        for ln in text.splitlines()
        if ln.startswith("  subgraph ") and "[" in ln
    ]
    assert engines[0] == DATA
    assert engines.count("host") == 1
    assert engines.index("host") not in (len(engines) - 1, 1)
    xx = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    got = model(x=xx)["y"]
    nz = np.array(np.nonzero(np.exp(xx)), dtype=np.float32)
    want = np.exp(xx) * nz.sum()
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_views_and_inputs_read_by_two_subgraphs():
    g = geode.Graph("two_readers")
    x = g.input("x", [4, 8])
    r = ops.reshape(x, [32])  # an alias: joins a neighbour, no subgraph of its own
    nz = ops.non_zero(r)
    g.output(ops.exp(r), nz, x * 3.0, names=["e", "n", "t"])
    gg = g.copy()
    gg.infer_shapes()
    gg.sort()
    engine_of = {n.name: ("host" if n.op_type == "NonZero" else "aicore") for n in gg.nodes}
    engine_of["reshape"] = "alias"
    step_of = {n.name: n.name for n in gg.nodes if n.name != "reshape"}
    part = partition_engines(gg, engine_of, step_of, ["alias", "commit"])
    engines = [sg.engine for sg in part.subgraphs]
    assert engines[0] == DATA and "alias" not in engines
    sub = part.subgraph_of()
    assert sub["reshape"] in (sub["nonzero"], sub["exp"])  # with a neighbour
    # x leaves subgraph 0 once per subgraph that reads it
    from_data = [b for b in part.boundaries if b.source == 0]
    assert len({b.target for b in from_data}) == len(from_data)
    outs = [b for b in part.boundaries if b.target == NET_OUTPUT]
    assert sorted(b.value for b in outs) == ["e", "n", "t"]
