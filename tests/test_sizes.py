"""Size limits: no module in geode/ over 1,500 lines, no function over 120 lines.

Small rooms with one job each are what keeps the compiler readable top to bottom;
past these sizes a module or function holds more than one job and is split.

Exempt files are listed in ``EXEMPT`` with the reason (the only way out of the limits).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "geode"
MAX_MODULE_LINES = 1500
MAX_FUNCTION_LINES = 120

#: path (relative to the repository) -> why it is exempt (generated tables, were there
#: any, would be listed here); none is
EXEMPT: dict[str, str] = {}


def oversized(path: Path, source: str, rel: str) -> list[str]:
    """Messages for the module and for each function of ``source`` over the limits."""
    out = []
    n = len(source.splitlines())
    if n > MAX_MODULE_LINES:
        out.append(f"{rel}: {n} lines (limit {MAX_MODULE_LINES})")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            size = node.end_lineno - node.lineno + 1
            if size > MAX_FUNCTION_LINES:
                out.append(
                    f"{rel}:{node.lineno}: function {node.name} has {size} lines "
                    f"(limit {MAX_FUNCTION_LINES})"
                )
    return out


def test_no_module_or_function_over_the_limits() -> None:
    bad = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).as_posix()
        if rel not in EXEMPT:
            bad += oversized(path, path.read_text(encoding="utf-8"), rel)
    assert not bad, "split these (one job per module and function):\n" + "\n".join(bad)


def test_exemptions_exist() -> None:
    """An exemption for a file that no longer exists is removed with the file."""
    missing = [rel for rel in EXEMPT if not (ROOT.parent / rel).exists()]
    assert not missing, f"exempt files that are gone: {missing}"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("x = 1\n" * (MAX_MODULE_LINES + 1), ["m.py: 1501 lines (limit 1500)"]),
        (
            "def f():\n" + "    x = 1\n" * MAX_FUNCTION_LINES,
            ["m.py:1: function f has 121 lines (limit 120)"],
        ),
        ("def f():\n" + "    x = 1\n" * (MAX_FUNCTION_LINES - 1), []),
        (
            "class C:\n    def m(self):\n" + "        x = 1\n" * MAX_FUNCTION_LINES,
            ["m.py:2: function m has 121 lines (limit 120)"],
        ),
    ],
)
def test_the_checker_catches_oversized_code(source: str, expected: list[str]) -> None:
    assert oversized(Path("m.py"), source, "m.py") == expected
