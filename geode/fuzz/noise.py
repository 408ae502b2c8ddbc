"""Is a float mismatch rounding noise? Two checks, run only when an output mismatches.

Some functions amplify rounding far beyond any fixed tolerance: ``tan(acos(x))``
near ``x = 0`` (acos lands within an ulp of pi/2), a product whose partial products
overflow in one order of multiplication and not in another. Neither engine is wrong
there; they round differently, as ``geode.config.ACCURACY_POLICY`` allows.

* **Perturbed rounding** (:func:`perturbed_runs`): the reference is evaluated node by
  node with every inexact float result (:func:`geode.fuzz.oplib.exactness`) scaled by
  ``1 + u * k * eps`` (u uniform in [-1, 1], k = :data:`PERTURB_EPS`): what the output
  does when each op rounds a few ulp differently. Exact values (the only ones that
  reach discontinuous ops) are never perturbed.
* **Wider precision** (:func:`wide_run`): the case evaluated with float32 promoted to
  float64 (inputs, constants, casts to float32), the result rounded back: when the
  compiled result is as close to it as the tolerance asks, the reference's own
  rounding (an overflowing partial product) was the difference.

:func:`explained` accepts a mismatch when every differing element is within
:data:`NOISE_FACTOR` times the perturbed spread, or matches the wide result.

* **Order-dependent products** (:func:`order_dependent`): a float ReduceProd whose
  partial products can leave the dtype's normal range in some order of multiplication
  (the big factors first overflow, the small ones first go subnormal or to 0) has no
  one result: ONNX leaves the order open, and geode's vector lanes and numpy's pairwise
  order meet inf where the other meets a finite value, or inf * 0 = NaN where the other
  meets 0 first. An output downstream of such a product is not compared.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from geode.compiler.interpret import as_input_array, run_reference
from geode.compiler.ir import Graph, ValueKind
from geode.compiler.ops import registry
from geode.errors import GeodeError
from geode.fuzz import oplib
from geode.fuzz.build import SpecError, build_graph
from geode.fuzz.spec import Case

#: how far inexact results are perturbed, in units of their dtype's eps
PERTURB_EPS = 4
#: a mismatch up to this many times the perturbed spread is noise
NOISE_FACTOR = 8.0


def _perturb(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    eps = float(np.finfo(x.dtype).eps) * PERTURB_EPS
    u = rng.uniform(-1.0, 1.0, x.shape)
    with np.errstate(all="ignore"):
        return (x.astype(np.float64) * (1.0 + u * eps)).astype(x.dtype)


def perturbed_run(
    graph: Graph, feeds: dict[str, np.ndarray], inexact: set[str], rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Every value of ``graph`` on ``feeds``, computed by the reference kernels with the
    results named in ``inexact`` perturbed by a few ulp (GeodeError when a kernel
    refuses)."""
    vals: dict[str, np.ndarray] = {v.name: as_input_array(v, feeds[v.name]) for v in graph.inputs}
    for v in graph.values.values():
        if v.kind in (ValueKind.CONSTANT, ValueKind.VARIABLE) and v.data is not None:
            vals[v.name] = np.asarray(v.data)
    for node in graph.toposort():
        od = registry.get(node.op_type, node.domain, where=node.where)
        args = [None if v is None else vals[v.name] for v in node.inputs]
        try:
            outs = od.run(args, node.attrs)
        except GeodeError:
            raise
        except Exception as exc:  # noqa: BLE001 - a refusing kernel ends the check
            raise GeodeError(f"{node.where}: {type(exc).__name__}: {exc}") from exc
        for out, arr in zip(node.outputs, outs):
            if out.name in inexact and arr.dtype.kind == "f" and arr.size:
                arr = _perturb(arr, rng)
            vals[out.name] = arr
    return vals


def perturbed_runs(
    case: Case, feeds: dict[str, np.ndarray], seed: list[int], count: int = 3
) -> list[dict[str, np.ndarray]]:
    """``count`` perturbed evaluations of ``case`` (empty when the reference refuses)."""
    try:
        graph = build_graph(case)
    except GeodeError:
        return []
    dtype_of = {v.name: str(v.dtype) for v in graph.values.values()}
    ex = oplib.exactness(case, dtype_of)
    inexact = {name for name, e in ex.items() if not e.exact}
    rng = np.random.default_rng(seed)
    try:
        return [perturbed_run(graph, feeds, inexact, rng) for _ in range(count)]
    except GeodeError:
        return []


def widened(case: Case) -> Case:
    """``case`` with float32 promoted to float64: inputs, constants and casts to it."""
    wide = case.copy()
    for spec in wide.inputs:
        if spec.dtype == "float32":
            spec.dtype = "float64"
            for feeds in wide.feeds:
                feeds[spec.name] = feeds[spec.name].astype(np.float64)
    for node in wide.nodes:
        if node.op == "Const" and node.params.get("dtype") == "float32":
            node.params = {**node.params, "dtype": "float64"}
        if node.op == "Cast" and node.params.get("to") == "float32":
            node.params = {**node.params, "to": "float64"}
    return wide


def wide_run(case: Case, run: int) -> dict[str, np.ndarray] | None:
    """The outputs of run ``run`` of :func:`widened` ``case`` (None when it does not
    build or run: promotion may pair float64 with an op's other float32 operand)."""
    wide = widened(case)
    try:
        return run_reference(build_graph(wide), wide.feeds[run])
    except (GeodeError, SpecError):
        return None


def order_dependent(case: Case, values: dict[str, np.ndarray], name: str) -> bool:
    """Whether output ``name`` of a run (``values``: the reference's values by name)
    depends on a float ReduceProd whose partial products leave the normal range in some
    order: per reduced group, the product of its finite factors above 1 in magnitude
    overflows, or that of its nonzero factors below 1 goes below the smallest normal."""
    for node in case.ancestors(name):
        x = values.get(node.args[0]) if node.op == "ReduceProd" and node.args else None
        if x is None or x.dtype.kind != "f" or x.size == 0:
            continue
        axes = node.params.get("axes")
        if axes is not None and len(axes) == 0 and node.params.get("noop"):
            continue  # an identity
        over = None if not axes else tuple(int(a) % x.ndim for a in axes)
        info = np.finfo(x.dtype)
        with np.errstate(all="ignore"):
            mag = np.abs(x.astype(np.float64))
            logs = np.log2(np.where(np.isfinite(mag) & (mag > 0), mag, 1.0))
        high = np.sum(np.where(logs > 0, logs, 0.0), axis=over)
        low = np.sum(np.where(logs < 0, logs, 0.0), axis=over)
        if (high >= np.log2(float(info.max))).any() or (low < np.log2(float(info.tiny))).any():
            return True
    return False


def explained(
    got: np.ndarray,
    want: np.ndarray,
    mask: np.ndarray,
    perturbed: Sequence[np.ndarray],
    wide: np.ndarray | None = None,
    rtol: float = 0.0,
) -> bool:
    """Whether every element of ``mask`` is noise: it differs no more than the reference
    moves under perturbed rounding (a NaN or infinity the perturbation also flips
    counts), or ``got`` matches the ``wide`` result (within ``rtol``) there."""
    g = np.asarray(got, dtype=np.float64)[mask]
    w = np.asarray(want, dtype=np.float64)[mask]
    ok = np.zeros(w.shape, dtype=bool)
    if wide is not None and np.shape(wide) == np.shape(want):
        wd = np.asarray(wide).astype(want.dtype).astype(np.float64)[mask]
        with np.errstate(invalid="ignore", over="ignore"):
            near = np.isfinite(wd) & (np.abs(g - wd) <= rtol * np.abs(wd))
            ok |= (np.isnan(wd) & np.isnan(g)) | (g == wd) | near
    spread = np.zeros(w.shape)
    flips = np.zeros(w.shape, dtype=bool)
    for p in perturbed:
        p = np.asarray(p, dtype=np.float64)
        if p.shape != np.shape(want):
            continue
        pv = p[mask]
        with np.errstate(invalid="ignore"):
            flips |= (np.isnan(pv) != np.isnan(w)) | (np.isinf(pv) & (pv != w))
            d = np.abs(pv - w)
        spread = np.maximum(spread, np.where(np.isfinite(d), d, 0.0))
    if perturbed:
        with np.errstate(invalid="ignore"):
            ok |= flips | (np.abs(g - w) <= NOISE_FACTOR * spread)
    return bool(np.all(ok))
