"""Reproducer folders: a failing case written so that anyone can rerun it.

A folder holds

* ``REPORT.txt``: the failure (kind and message), where the case came from (seed,
  index, size before and after shrinking), the graph as geode prints it, the case,
  and how to replay it;
* ``model.onnx``: the graph exported by :func:`geode.compiler.frontend.onnx_export.to_onnx`
  (``model.onnx.error.txt`` says why when it does not export);
* ``inputs/run<k>/<name>.npy``: the inputs of each run, and ``expected/run<k>/<name>.npy``
  the reference engine's outputs (when it computes them);
* ``case.json``: the case itself, which :func:`load_case` reads back together with
  the inputs (``python -m geode.fuzz --replay <folder>`` checks it again).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from geode.compiler.frontend.onnx_export import to_onnx
from geode.compiler.interpret import run_reference
from geode.compiler.ir import format_graph
from geode.fuzz.build import FuzzError, build_graph
from geode.fuzz.runner import Outcome
from geode.fuzz.spec import Case


def folder_name(case: Case, kind: str) -> str:
    """``seed<S>-case<I>-<kind>`` with the kind made file-name safe."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", kind).strip("-")[:60]
    return f"seed{case.seed}-case{case.index:05d}-{slug}"


def _save_arrays(root: Path, runs: list[dict[str, np.ndarray]]) -> None:
    for k, arrays in enumerate(runs):
        folder = root / f"run{k}"
        folder.mkdir(parents=True, exist_ok=True)
        for name, arr in arrays.items():
            np.save(folder / f"{name}.npy", np.asarray(arr), allow_pickle=False)


def _report(case: Case, outcome: Outcome, original: Case | None, checks: int, where: Path) -> str:
    graph_text = "(the case does not build)"
    try:
        graph_text = format_graph(build_graph(case))
    except Exception as exc:  # noqa: BLE001 - a build crash is what some reports are about
        graph_text = f"(building the graph raised {type(exc).__name__}: {exc})"
    sizes = f"{sum(1 for n in case.nodes if n.op != 'Const')} nodes"
    if original is not None:
        before = sum(1 for n in original.nodes if n.op != "Const")
        sizes = f"{before} nodes, shrunk to {sizes} in {checks} checks"
    return "\n".join(
        [
            f"geode fuzz failure: {outcome.kind}",
            f"seed {case.seed}, case {case.index} ({sizes})",
            "",
            outcome.message.rstrip(),
            "",
            "graph:",
            graph_text,
            "",
            case.describe(),
            "",
            "replay:",
            f"  python -m geode.fuzz --replay {where}",
            "or by hand:",
            "  import geode, numpy as np",
            f"  m = geode.load('{where / 'model.onnx'}')",
            f"  m.run({{name: np.load('{where}/inputs/run0/' + name + '.npy') for name in "
            "m.input_names})",
            "",
        ]
    )


def write_reproducer(
    out_dir: str | Path,
    case: Case,
    outcome: Outcome,
    original: Case | None = None,
    checks: int = 0,
) -> Path:
    """Write the reproducer folder of a failing ``case`` under ``out_dir``; returns it.
    ``original``: the case before shrinking, ``checks``: how many checks that took."""
    where = Path(out_dir) / folder_name(case, outcome.kind)
    where.mkdir(parents=True, exist_ok=True)
    (where / "case.json").write_text(case.to_json(), encoding="utf-8")
    _save_arrays(where / "inputs", case.feeds)
    try:
        graph = build_graph(case)
    except Exception:  # noqa: BLE001 - the failure may be in building; the report says so
        graph = None
    if graph is not None:
        try:
            (where / "model.onnx").write_bytes(to_onnx(graph).SerializeToString())
        except Exception as exc:  # noqa: BLE001 - an export failure is noted, not fatal
            (where / "model.onnx.error.txt").write_text(
                f"{type(exc).__name__}: {exc}\n", encoding="utf-8"
            )
        expected = []
        for feeds in case.feeds:
            try:
                res = run_reference(graph, feeds)
            except Exception:  # noqa: BLE001 - the reference may be what fails
                res = {}
            expected.append(res)
        _save_arrays(where / "expected", expected)
    text = _report(case, outcome, original, checks, where)
    (where / "REPORT.txt").write_text(text, encoding="utf-8")
    return where


def load_case(folder: str | Path) -> Case:
    """The case of a reproducer folder, with its inputs (FuzzError when the folder is
    not one)."""
    root = Path(folder)
    spec = root / "case.json"
    if not spec.is_file():
        raise FuzzError(f"{root}: no case.json, not a geode fuzz reproducer")
    runs = json.loads(spec.read_text(encoding="utf-8")).get("runs", 1)
    feeds = []
    for k in range(int(runs)):
        folder_k = root / "inputs" / f"run{k}"
        if not folder_k.is_dir():
            raise FuzzError(f"{root}: inputs of run {k} are missing ({folder_k})")
        feeds.append(
            {p.stem: np.load(p, allow_pickle=False) for p in sorted(folder_k.glob("*.npy"))}
        )
    try:
        return Case.from_json(spec.read_text(encoding="utf-8"), feeds)
    except (KeyError, TypeError, ValueError) as exc:
        raise FuzzError(f"{spec}: not a valid case: {exc}") from exc
