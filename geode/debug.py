"""Debug output: ``GEODE_DEBUG`` levels through the ``geode`` logger, ``GEODE_DUMP_DIR`` files.

One flag system, settable from the environment or from Python
(``geode.set_options(debug=2, dump_dir="dumps")`` or ``geode.compile(g, debug=2)``):

=====  ==========================================================================
level  what is logged (INFO records on the ``geode`` logger)
=====  ==========================================================================
1      stage summaries: passes run, partitions, fusion plan with the reason for
       every decision, kernels with their costs (the ``explain()`` text)
2      adds the graph before and after each pass that changed it, the final
       graph annotated with each node's kernel, loop ASTs before and after
       scheduling, and the schedule trace
3      adds the generated kernel source
4      adds LLVM IR and assembly of every kernel
=====  ==========================================================================

With a dump dir, every stage of levels 1 to 3 is written to its own numbered file
under ``<dump_dir>/<model>/`` whatever the level (level 4 stages too when the level
is 4), plus ``graph.dot``, the Graphviz picture of the compiled graph. A dump dir
describes the latest compile of that model: files of an earlier dump are replaced.

When a level is set and nothing configured the ``geode`` logger, records go to
stderr; an application that configures logging itself keeps control of where they go.
"""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path

log = logging.getLogger("geode")

_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")
#: Files a Dumper writes (numbered stages, artifacts); an earlier dump's are removed.
_OWN_FILE = re.compile(r"^(\d{2,}_.+\.(txt|py|ll|s|dot)|graph\.(dot|svg))$")
_handler: logging.Handler | None = None


def safe_name(name: str) -> str:
    """A file-name-safe version of ``name`` (no separators, no leading dots)."""
    s = _SAFE.sub("_", name).lstrip(".")
    return s[:120] or "unnamed"


def configure_logging(level: int) -> None:
    """Make ``geode`` logger INFO records visible for a debug ``level`` > 0.

    Sets the logger's level to INFO when it has none, and adds one stderr handler when
    no handler would receive the records (the application configured no logging).
    Calling it again is harmless.
    """
    global _handler
    if level <= 0:
        return
    if log.level == logging.NOTSET or log.level > logging.INFO:
        log.setLevel(logging.INFO)
    if _handler is None and not log.hasHandlers():
        _handler = logging.StreamHandler(sys.stderr)
        _handler.setFormatter(logging.Formatter("[geode] %(message)s"))
        log.addHandler(_handler)


class Dumper:
    """Writes numbered stage files and logs them at a debug level.

    ``level`` is ``Options.debug``; ``dump_dir`` is ``Options.dump_dir`` (files go to
    ``<dump_dir>/<model_name>/``). ``stage(name, text, level)`` records one stage;
    ``artifact(file_name, text)`` writes an unnumbered file (e.g. ``graph.dot``).
    """

    def __init__(self, model_name: str, level: int = 0, dump_dir: str | None = None):
        self.level = level
        self.dir: Path | None = None
        self.count = 0
        self.files: list[Path] = []
        configure_logging(level)
        if dump_dir:
            self.dir = Path(dump_dir).expanduser() / safe_name(model_name)
            self.dir.mkdir(parents=True, exist_ok=True)
            for old in self.dir.iterdir():
                if old.is_file() and _OWN_FILE.match(old.name):
                    old.unlink(missing_ok=True)

    @property
    def active(self) -> bool:
        """Whether anything is shown or written."""
        return self.level > 0 or self.dir is not None

    def wants(self, level: int) -> bool:
        """Whether a stage of this level is shown or written (level 4 only when asked)."""
        if level >= 4:
            return self.level >= level
        return self.dir is not None or self.level >= level

    def stage(self, name: str, text: str, level: int = 1, ext: str = "txt") -> Path | None:
        """Record one stage's text: log it at ``level``, write it as a numbered file."""
        if self.level >= level:
            log.info("==== %s ====\n%s", name, text)
        if self.dir is None or (level >= 4 and self.level < level):
            return None
        path = self.dir / f"{self.count:02d}_{safe_name(name)}.{ext}"
        self.count += 1
        path.write_text(text if text.endswith("\n") else text + "\n")
        self.files.append(path)
        return path

    def artifact(self, file_name: str, text: str) -> Path | None:
        """Write an unnumbered file into the dump dir (nothing without one); its path."""
        if self.dir is None:
            return None
        path = self.dir / safe_name(file_name)
        path.write_text(text if text.endswith("\n") else text + "\n")
        self.files.append(path)
        return path
