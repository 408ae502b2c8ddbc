"""The layering of geode's packages, enforced from the source.

Every module under ``geode/`` is parsed with :mod:`ast`; every ``import`` in it,
function-local ones included, is an arrow from the importing module to the imported
one (so is ``importlib.import_module`` of a literal geode module name). Layers, top
to bottom (a module may import its own layer and the layers below):

====  =========  ===========================================================
rank  layer      modules
====  =========  ===========================================================
5     cli        ``geode.cli``, ``geode.__main__``, ``geode.onnx_conformance``,
                 ``geode.benchmark``, ``geode.fuzz.*``,
                 ``geode.costmodel.report`` (the command line, the
                 conformance-suite runner, the timing against onnxruntime and the
                 differential fuzzer drive the API)
4     api        ``geode`` (the package's public face), ``geode.api``,
                 ``geode.onnx_backend`` (the ONNX backend protocol over the API),
                 ``geode.examples`` (built-in graphs the CLI runs), ``geode.tuner``
                 (``geode.tune``: drives the spine, then tunes each kernel)
3     session    ``geode.session``, ``geode.spine`` (the spine: the stages in
                 order), ``geode.plan_builder`` (units -> runtime plan),
                 ``geode.buckets``, ``geode.stages``, ``geode.incremental``
                 (bucketed, staged and incremental compiles),
                 ``geode.viz`` (DOT rendering of a compiled graph),
                 ``geode.modelfile.*`` (model files: a compiled model saved and loaded),
                 ``geode.costmodel.samples`` (profiled samples of compiled kernels)
2     codegen    ``geode.codegen.*``  } peers: codegen may import compiler, never
2     compiler   ``geode.compiler.*`` } the other way round
1     runtime    ``geode.runtime.*``    } peers that never import each other
1     costmodel  ``geode.costmodel.*``  }
0     base       ``geode.errors``, ``geode.config``, ``geode.debug``,
                 ``geode.progress``, ``geode.version``, ``geode.safe_files``,
                 ``geode.signing``, ``geode.lazy`` (errors, options, logging and dumps,
                 progress bars, the version, geode's own files on disk and their
                 signatures, modules imported on first use: used by every layer, they
                 import only each other)
====  =========  ===========================================================

Besides the ranks, no import cycle may run between packages: a *package* here is a
module's name cut to three parts (``geode.compiler.ops.nn`` -> ``geode.compiler.ops``,
``geode.compiler.ir`` stays itself), so ``ir.py`` and the op registry are two
packages, while the modules of one subpackage may import each other freely.

No module imports another's private name (architecture rule 5): ``from geode.x import
_name`` is allowed only when ``_name`` is a module of the importer's own package (a
package-private module, such as a C extension) or is listed in ``geode.x``'s
``__all__`` (declared public; the names generated kernels import, ``_g_*``, are).

A failure names the importing file and line and the imported module.
"""

from __future__ import annotations

import ast
import functools
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "geode"

#: (module-name prefix, layer); the longest matching prefix wins
LAYER_OF: dict[str, str] = {
    "geode.cli": "cli",
    "geode.__main__": "cli",
    "geode.onnx_conformance": "cli",
    "geode.benchmark": "cli",
    "geode.bench_isolated": "cli",
    "geode.fuzz": "cli",
    "geode": "api",
    "geode.api": "api",
    "geode.onnx_backend": "api",
    "geode.examples": "api",
    "geode.tuner": "api",
    "geode.session": "session",
    "geode.buckets": "session",
    "geode.stages": "session",
    "geode.incremental": "session",
    "geode.spine": "session",
    "geode.plan_builder": "session",
    "geode.viz": "session",
    "geode.modelfile": "session",
    "geode.codegen": "codegen",
    "geode.codegen.tuning.ray_runner": "codegen",
    "geode.compiler": "compiler",
    "geode.compiler.fusion.reduce_tree": "compiler",
    "geode.compiler.fusion.stitch": "compiler",
    "geode.codegen.stitch_schedule": "codegen",
    "geode.compiler.partition.clusters": "compiler",
    "geode.compiler.partition.dynamic_shape": "compiler",
    "geode.compiler.partition.engine": "compiler",
    "geode.compiler.partition.multi_batch": "compiler",
    "geode.compiler.partition.subgraph": "compiler",
    "geode.compiler.partition.stages": "compiler",
    "geode.compiler.partition.binary": "compiler",
    "geode.runtime.buckets": "runtime",
    "geode.runtime.stages": "runtime",
    "geode.runtime.incremental": "runtime",
    "geode.runtime": "runtime",
    "geode.costmodel": "costmodel",
    "geode.costmodel.samples": "session",
    "geode.costmodel.report": "cli",
    "geode.errors": "base",
    "geode.config": "base",
    "geode.debug": "base",
    "geode.progress": "base",
    "geode.version": "base",
    "geode.safe_files": "base",
    "geode.signing": "base",
    "geode.lazy": "base",
    "geode.collector": "base",
}

RANK = {
    "cli": 5,
    "api": 4,
    "session": 3,
    "codegen": 2,
    "compiler": 2,
    "runtime": 1,
    "costmodel": 1,
    "base": 0,
}

#: arrows forbidden between peers of one rank
FORBIDDEN_PEERS = {("compiler", "codegen"), ("runtime", "costmodel"), ("costmodel", "runtime")}


@dataclass(frozen=True)
class Edge:
    """One import: ``importer`` imports ``imported`` at ``where`` (``file:line``)."""

    importer: str
    imported: str
    where: str


def layer_of(module: str) -> str | None:
    """The layer of a geode module (None when no prefix of its name is mapped)."""
    parts = module.split(".")
    for k in range(len(parts), 0, -1):
        layer = LAYER_OF.get(".".join(parts[:k]))
        if layer is not None and (k > 1 or len(parts) == 1):
            return layer
    return None


def package_of(module: str) -> str:
    """The unit of the cycle check: the module's name cut to three parts."""
    return ".".join(module.split(".")[:3])


def module_name(path: Path, root: Path) -> str:
    """``geode/compiler/ir.py`` -> ``geode.compiler.ir``; a package's ``__init__`` is the package."""
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@functools.cache
def _import_nodes(source: str) -> tuple[tuple[int, int, str, tuple[str, ...], bool], ...]:
    """Every import statement in ``source`` (at any depth) as ``(line, level, module,
    names, is_from)``: parsed once per distinct source text (the tests scan the tree
    several times, and a copy of it once)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.append((node.lineno, 0, "", tuple(a.name for a in node.names), False))
        elif isinstance(node, ast.ImportFrom):
            names = tuple(a.name for a in node.names)
            out.append((node.lineno, node.level, node.module or "", names, True))
        elif _literal_import(node) is not None:
            out.append((node.lineno, 0, "", (_literal_import(node),), False))
    return tuple(out)


def _literal_import(node: ast.AST) -> str | None:
    """The module of ``importlib.import_module("geode...")`` (or a bare
    ``import_module``) called with a literal name: an import too, though no statement
    says so; None for any other node."""
    if not (isinstance(node, ast.Call) and node.args):
        return None
    f, arg = node.func, node.args[0]
    name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
    if name != "import_module" or not isinstance(arg, ast.Constant):
        return None
    return arg.value if isinstance(arg.value, str) else None


def imports_of(
    module: str, source: str, where: str, known: set[str], is_package: bool
) -> list[Edge]:
    """Every import of a geode module in ``source`` (at any depth, so function-local
    ones count), resolved to module names: ``from geode.codegen import ast`` imports
    ``geode.codegen.ast`` when that is a module in ``known``, else ``geode.codegen``."""
    edges: list[Edge] = []
    for line, level, base, names, is_from in _import_nodes(source):
        targets: list[str] = list(names)
        if is_from:
            if level:
                pkg = module.split(".")
                if not is_package:
                    pkg = pkg[:-1]
                pkg = pkg[: len(pkg) - (level - 1)]
                base = ".".join(pkg + ([base] if base else []))
            targets = [f"{base}.{a}" if f"{base}.{a}" in known else base for a in names]
        for t in targets:
            if t == "geode" or t.startswith("geode."):
                edges.append(Edge(module, t, f"{where}:{line}"))
    return edges


def scan(sources: dict[str, tuple[str, str, bool]]) -> list[Edge]:
    """The import edges of ``{module: (file, source, is_package)}``."""
    known = set(sources)
    edges: list[Edge] = []
    for mod, (where, src, is_pkg) in sorted(sources.items()):
        edges += imports_of(mod, src, where, known, is_pkg)
    return edges


def read_tree(root: Path) -> dict[str, tuple[str, str, bool]]:
    """Every module under ``root`` (a ``geode`` directory) with its file and source."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).as_posix()
        out[module_name(path, root)] = (
            rel,
            path.read_text(encoding="utf-8"),
            path.name == "__init__.py",
        )
    return out


def layer_violations(edges: list[Edge]) -> list[str]:
    """One message per arrow against the layers (or from/to an unmapped module)."""
    bad = []
    for e in edges:
        src, dst = layer_of(e.importer), layer_of(e.imported)
        if src is None or dst is None:
            unmapped = e.importer if src is None else e.imported
            bad.append(f"{e.where}: {unmapped} has no layer; add it to LAYER_OF")
        elif RANK[src] < RANK[dst]:
            bad.append(
                f"{e.where}: {e.importer} ({src}) imports {e.imported} ({dst}), a higher layer"
            )
        elif (src, dst) in FORBIDDEN_PEERS:
            bad.append(
                f"{e.where}: {e.importer} ({src}) imports {e.imported} ({dst}), a forbidden peer"
            )
    return bad


def package_cycles(edges: list[Edge]) -> list[str]:
    """One message per import cycle between packages (strongly connected components of
    the package graph), listing the imports that close it."""
    graph: dict[str, dict[str, Edge]] = {}
    for e in edges:
        a, b = package_of(e.importer), package_of(e.imported)
        if a != b:
            graph.setdefault(a, {}).setdefault(b, e)
            graph.setdefault(b, {})
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    comps: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    out = []
    for comp in comps:
        inner = [
            f"{e.where}: {e.importer} imports {e.imported}"
            for a in comp
            for b, e in sorted(graph[a].items())
            if b in comp
        ]
        out.append(f"import cycle between {', '.join(comp)}:\n    " + "\n    ".join(inner))
    return out


def _declared_public(source: str) -> frozenset[str]:
    """The names a module lists in its ``__all__`` (a literal list or tuple; empty when it
    has none)."""
    for node in ast.parse(source).body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
            and isinstance(node.value, (ast.List, ast.Tuple))
        ):
            return frozenset(e.value for e in node.value.elts if isinstance(e, ast.Constant))
    return frozenset()


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_imports(sources: dict[str, tuple[str, str, bool]]) -> list[str]:
    """One message per import of another module's private name (rule 5): a ``_name``
    that is neither a module of the importer's own package nor in its module's
    ``__all__``, and a private module imported from outside its package."""
    known = set(sources)
    public = {m: _declared_public(src) for m, (_, src, _) in sources.items()}
    bad = []
    for mod, (where, src, is_pkg) in sorted(sources.items()):
        own = mod if is_pkg else mod.rpartition(".")[0]
        for e in imports_of(mod, src, where, known, is_pkg):
            parts = e.imported.split(".")
            for i, part in enumerate(parts):
                inside = mod == ".".join(parts[:i]) or own.startswith(".".join(parts[:i]))
                if _is_private(part) and not inside:
                    bad.append(f"{e.where}: {mod} imports the private module {e.imported}")
        for line, level, base, names, is_from in _import_nodes(src):
            if not is_from:
                continue
            if level:
                pkg = mod.split(".") if is_pkg else mod.split(".")[:-1]
                pkg = pkg[: len(pkg) - (level - 1)]
                base = ".".join(pkg + ([base] if base else []))
            if not (base == "geode" or base.startswith("geode.")):
                continue
            for name in names:
                if not _is_private(name) or f"{base}.{name}" in known or base == mod:
                    continue  # a public name, a module (checked above), or its own
                if name not in public.get(base, frozenset()):
                    bad.append(f"{where}:{line}: {mod} imports {base}'s private name {name}")
    return bad


def test_every_module_has_a_layer() -> None:
    missing = [m for m in read_tree(ROOT) if layer_of(m) is None]
    assert not missing, f"modules with no layer (add them to LAYER_OF): {missing}"


def test_no_import_against_the_layers() -> None:
    bad = layer_violations(scan(read_tree(ROOT)))
    assert not bad, "imports against the layering:\n" + "\n".join(bad)


def test_no_import_cycle_between_packages() -> None:
    bad = package_cycles(scan(read_tree(ROOT)))
    assert not bad, "\n".join(bad)


def test_no_import_of_another_modules_private_name() -> None:
    bad = private_imports(read_tree(ROOT))
    assert not bad, "imports of private names (rule 5):\n" + "\n".join(bad)


def test_checker_catches_a_private_name_and_a_private_module() -> None:
    sources = {
        "geode.codegen.lower": (
            "geode/codegen/lower.py",
            "_HIDDEN = 1\n__all__ = ['_g_declared', 'lower']\n",
            False,
        ),
        "geode.codegen.user": (
            "geode/codegen/user.py",
            "def f():\n    from geode.codegen.lower import _HIDDEN, _g_declared, lower\n",
            False,
        ),
        "geode.runtime.native": (
            "geode/runtime/native/__init__.py",
            "from geode.runtime.native import _ext\n",  # its own private module: allowed
            True,
        ),
        "geode.runtime.native._ext": ("geode/runtime/native/_ext.py", "", False),
        "geode.runtime.engines": (
            "geode/runtime/engines.py",
            "from .native import _ext\n",
            False,
        ),
    }
    assert private_imports(sources) == [
        "geode/codegen/user.py:2: geode.codegen.user imports geode.codegen.lower's private "
        "name _HIDDEN",
        "geode/runtime/engines.py:1: geode.runtime.engines imports the private module "
        "geode.runtime.native._ext",
    ]


def test_checker_catches_a_planted_upward_import() -> None:
    sources = {
        "geode.runtime.plan": ("geode/runtime/plan.py", "import numpy\n", False),
        "geode.session": ("geode/session.py", "from geode.runtime import plan\n", False),
        "geode.runtime.bad": (
            "geode/runtime/bad.py",
            "def f():\n    from geode.session import Session\n    return Session\n",
            False,
        ),
    }
    bad = layer_violations(scan(sources))
    assert bad == [
        "geode/runtime/bad.py:2: geode.runtime.bad (runtime) imports geode.session "
        "(session), a higher layer"
    ]


def test_checker_catches_an_upward_import_by_name() -> None:
    sources = {
        "geode.session": ("geode/session.py", "", False),
        "geode.runtime.bad": (
            "geode/runtime/bad.py",
            "import importlib\n\ndef f():\n    return importlib.import_module('geode.session')\n",
            False,
        ),
    }
    assert layer_violations(scan(sources)) == [
        "geode/runtime/bad.py:4: geode.runtime.bad (runtime) imports geode.session "
        "(session), a higher layer"
    ]


def test_checker_catches_a_forbidden_peer_and_relative_imports() -> None:
    sources = {
        "geode.compiler.fusion.planner": (
            "geode/compiler/fusion/planner.py",
            "from ...codegen import lower\n",
            False,
        ),
        "geode.codegen.lower": ("geode/codegen/lower.py", "", False),
        "geode.codegen": ("geode/codegen/__init__.py", "", True),
    }
    bad = layer_violations(scan(sources))
    assert bad == [
        "geode/compiler/fusion/planner.py:1: geode.compiler.fusion.planner (compiler) imports "
        "geode.codegen.lower (codegen), a forbidden peer"
    ]


def test_checker_catches_a_cycle_between_packages() -> None:
    sources = {
        "geode.compiler.ir": ("geode/compiler/ir.py", "from geode.compiler.ops import nn\n", False),
        "geode.compiler.ops.nn": ("geode/compiler/ops/nn.py", "import geode.compiler.ir\n", False),
        "geode.compiler.ops.host": (
            "geode/compiler/ops/host.py",
            "from geode.compiler.ops import nn\n",  # inside one package: not a cycle
            False,
        ),
    }
    (msg,) = package_cycles(scan(sources))
    assert "geode.compiler.ir, geode.compiler.ops" in msg
    assert "geode/compiler/ir.py:1: geode.compiler.ir imports geode.compiler.ops.nn" in msg
    assert "geode/compiler/ops/nn.py:1: geode.compiler.ops.nn imports geode.compiler.ir" in msg


def test_checker_catches_an_upward_import_planted_in_a_copy_of_the_tree(tmp_path: Path) -> None:
    copy = tmp_path / "geode"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / "runtime" / "engines.py"
    lines = target.read_text(encoding="utf-8").splitlines()
    lines.append("def _planted():\n    import geode.codegen.lower  # noqa\n")
    target.write_text("\n".join(lines) + "\n", encoding="utf-8")
    bad = layer_violations(scan(read_tree(copy)))
    where = f"geode/runtime/engines.py:{len(lines) + 1}"
    assert bad == [
        f"{where}: geode.runtime.engines (runtime) imports geode.codegen.lower (codegen), "
        "a higher layer"
    ]


@pytest.mark.parametrize(
    ("module", "layer"),
    [
        ("geode", "api"),
        ("geode.cli", "cli"),
        ("geode.compiler.ops.nn", "compiler"),
        ("geode.codegen.backends.llvm.emit", "codegen"),
        ("geode.runtime.native.pool", "runtime"),
        ("geode.errors", "base"),
        ("geode.unknown", None),
    ],
)
def test_layer_of(module: str, layer: str | None) -> None:
    assert layer_of(module) == layer


# -- the injections that keep the arrows downward ------------------------------------------------
def test_control_flow_without_a_subgraph_compiler_is_a_clear_error() -> None:
    import geode.session  # noqa: F401  (installs the default subgraph compiler)
    from geode.compiler.ops import control
    from geode.errors import GeodeError

    installed = control.subgraph_compiler()
    control.set_subgraph_compiler(None)
    try:
        with pytest.raises(GeodeError, match="no.*subgraph compiler|none is installed"):
            control.subgraph_compiler()
    finally:
        control.set_subgraph_compiler(installed)
    assert installed.__module__ == "geode.session"


def test_ir_infers_through_the_installed_registry() -> None:
    import numpy as np

    from geode.compiler import ir
    from geode.errors import GraphError

    g = ir.Graph("g")
    x = g.input("x", [2, 3])
    saved = ir._node_inference
    ir.set_node_inference(None)  # type: ignore[arg-type]
    try:
        with pytest.raises(GraphError, match="no op registry is loaded"):
            g.op("Relu", x)
    finally:
        ir.set_node_inference(saved)
    y = x[1:, None, 0]
    assert y.shape == (1, 1)
    assert [n.op_type for n in g.nodes][-3:] == ["Slice", "Squeeze", "Unsqueeze"]
    assert np.dtype(y.dtype) == np.float32


@pytest.mark.numba  # the numba backend's kernel cache
def test_the_kernel_cache_needs_a_target_fingerprint() -> None:
    from geode.codegen import cache
    from geode.errors import CodegenError

    saved = cache._target_fingerprint
    cache.set_target_fingerprint(None)  # type: ignore[arg-type]
    try:
        with pytest.raises(CodegenError, match="no target fingerprint"):
            cache.environment_fingerprint()
    finally:
        cache.set_target_fingerprint(saved)
    assert "cpu_features" in cache.environment_fingerprint()


def test_the_tree_reads_under_an_ascii_locale() -> None:
    """The sources are read as UTF-8 whatever the locale: under ``LC_ALL=C`` with
    UTF-8 mode off, Python's default text encoding is ASCII, and a docstring with a
    non-ASCII character made every scan fail there."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0"}
    env.pop("PYTHONIOENCODING", None)
    code = (
        "import locale, sys; sys.path.insert(0, sys.argv[1]); import test_layering as t; "
        "print(locale.getpreferredencoding(False), len(t.read_tree(t.ROOT)))"
    )
    here = str(Path(__file__).resolve().parent)
    out = subprocess.run(
        [sys.executable, "-c", code, here], env=env, capture_output=True, timeout=60
    )
    assert out.returncode == 0, out.stderr.decode("utf-8", "replace")
    encoding, count = out.stdout.decode().split()
    assert int(count) == len(read_tree(ROOT))
