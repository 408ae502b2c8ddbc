"""geode.compiler.ops.registry: op families imported on first lookup. The family table
(``family_table.FAMILY_OF``) is exact: importing an op's family alone registers the op,
and every op a family registers is in the table. A lookup imports only the op's family;
an unknown op still raises UnknownOpError after every family is imported; a prototype
registered before its family is imported is not replaced by the family later."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from geode.compiler.ops import registry
from geode.compiler.ops.family_table import FAMILY_OF
from geode.errors import GeodeError, UnknownOpError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _child(code: str) -> dict:
    """Run ``code`` in a fresh Python with this tree first on the path; its last line's
    JSON."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_family_table_is_exact():
    """Each family imported alone (geode's package __init__, which imports some
    families, skipped; every family module dropped and the registry emptied between
    them): the ops it registers."""
    registered = _child(
        f"""
        import importlib, json, sys, types
        pkg = types.ModuleType("geode")
        pkg.__path__ = [{os.path.join(ROOT, "geode")!r}]
        sys.modules["geode"] = pkg
        from geode.compiler.ops import registry
        out = {{}}
        for fam in registry.FAMILIES:
            for m in [m for m in sys.modules if m.rsplit(".", 1)[-1] in registry.FAMILIES]:
                del sys.modules[m]
            registry._REGISTRY.clear()
            importlib.import_module("geode.compiler.ops." + fam)
            out[fam] = sorted(registry._REGISTRY)
        print(json.dumps(out))
        """
    )
    by_family = {fam: {tuple(k) for k in keys} for fam, keys in registered.items()}
    wrong = sorted(k for k, fam in FAMILY_OF.items() if k not in by_family[fam])
    missing = sorted(set().union(*by_family.values()) - set(FAMILY_OF))
    assert not wrong and not missing, (
        f"family_table.py is stale: {wrong} not registered by their family, {missing} "
        "not in the table"
    )


def test_a_lookup_imports_only_its_family():
    report = _child(
        """
        import json, sys
        import geode
        from geode.compiler.ops import registry
        fams = lambda: sorted(
            f for f in registry.FAMILIES if "geode.compiler.ops." + f in sys.modules
        )
        before = fams()
        registry.get("Shape")
        print(json.dumps({"before": before, "after": fams()}))
        """
    )
    assert "host" not in report["before"] and "nn" not in report["before"]
    assert set(report["after"]) - set(report["before"]) == {"host"}


def test_a_prototype_registered_before_its_family_stays():
    report = _child(
        """
        import json, sys
        import geode
        from geode.compiler.ops import registry
        assert "geode.compiler.ops.strings" not in sys.modules
        mine = registry.OpDef(
            "StringNormalizer", registry.OpKind.OPAQUE, inputs=[], outputs=[],
            types={}, infer=lambda ctx: [], kernel=None,
        )
        registry.register(mine)
        registry.get("RegexFullMatch")  # the same family, imported now if not before
        print(json.dumps({"kept": registry.get("StringNormalizer") is mine,
                          "family": "geode.compiler.ops.strings" in sys.modules}))
        """
    )
    assert report == {"kept": True, "family": True}


def test_unknown_ops_and_families():
    with pytest.raises(UnknownOpError):
        registry.get("NoSuchOp")
    assert not registry.has("NoSuchOp", "no.such.domain")
    assert registry.has("Relu")
    with pytest.raises(GeodeError, match="no op family"):
        registry.load_family("../evil")
    assert {d.op_type for d in registry.all_ops()} >= {k[1] for k in FAMILY_OF}
