"""Debug output: ``GEODE_DEBUG`` levels through the ``geode`` logger, ``GEODE_DUMP_DIR`` files.

Levels: 1 stage summaries (passes, partitions, fusion plan, kernels); 2 adds graphs
before/after each pass and loop ASTs with schedule traces; 3 adds generated source;
4 adds LLVM IR and assembly. With a dump dir, every stage is written to its own
numbered file under ``<dump_dir>/<model>/`` whatever the level.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

log = logging.getLogger("geode")

_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def safe_name(name: str) -> str:
    """A file-name-safe version of ``name`` (no separators, no leading dots)."""
    s = _SAFE.sub("_", name).lstrip(".")
    return s[:120] or "unnamed"


class Dumper:
    """Writes numbered stage files and logs them at a debug level."""

    def __init__(self, model_name: str, level: int = 0, dump_dir: str | None = None):
        self.level = level
        self.dir: Path | None = None
        self.count = 0
        self.files: list[Path] = []
        if dump_dir:
            self.dir = Path(dump_dir).expanduser() / safe_name(model_name)
            self.dir.mkdir(parents=True, exist_ok=True)

    @property
    def active(self) -> bool:
        """Whether anything is shown or written."""
        return self.level > 0 or self.dir is not None

    def wants(self, level: int) -> bool:
        """Whether a stage of this level is shown or written."""
        return self.dir is not None or self.level >= level

    def stage(self, name: str, text: str, level: int = 1, ext: str = "txt") -> None:
        """Record one stage's text."""
        if self.level >= level:
            log.info("==== %s ====\n%s", name, text)
        if self.dir is not None:
            path = self.dir / f"{self.count:02d}_{safe_name(name)}.{ext}"
            self.count += 1
            path.write_text(text if text.endswith("\n") else text + "\n")
            self.files.append(path)
