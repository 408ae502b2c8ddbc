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
    digest = hashlib.sha256(__version__.encode())
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(_CODE_SUFFIXES):
                path = os.path.join(folder, name)
                st = os.stat(path)
                rel = os.path.relpath(path, root)
                digest.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()
