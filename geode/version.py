"""geode's version (one place: the package, model files and caches read it here), and a
digest of its installed code."""

from __future__ import annotations

import functools
import hashlib
import os

__version__ = "0.1.0"

#: the files whose change changes what geode computes
_CODE_SUFFIXES = (".py", ".so", ".pyd")


@functools.cache
def source_digest() -> str:
    """A digest of geode's code as installed (:func:`code_digest` of the package). It
    changes whenever the code does, also under one version number (an editable install,
    a patched wheel), which the model cache's keys need: a compile by other code is not
    this code's result."""
    return code_digest(os.path.dirname(os.path.abspath(__file__)))


def code_digest(root: str) -> str:
    """sha256 over the version and the relative name, size and modification time of
    every ``.py`` and extension file under ``root`` (``__pycache__`` left out)."""
    lines = [__version__]
    _list_code(root, "", lines)
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def _list_code(folder: str, rel: str, lines: list[str]) -> None:
    """A line per code file under ``folder`` (its name relative to the root is ``rel``
    plus the file's), in name order, folders after files (a walk of one ``scandir`` per
    folder: this runs at every warm start)."""
    with os.scandir(folder) as it:
        entries = sorted(it, key=lambda e: e.name)
    subdirs = []
    for e in entries:
        if e.name.endswith(_CODE_SUFFIXES) and e.is_file():
            st = e.stat()
            lines.append(f"{rel}{e.name}\0{st.st_size}\0{st.st_mtime_ns}")
        elif e.name != "__pycache__" and e.is_dir():
            subdirs.append(e)
    for d in subdirs:
        _list_code(d.path, f"{rel}{d.name}/", lines)
