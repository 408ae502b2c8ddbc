"""Debug output: ``GEODE_DEBUG`` levels through the ``geode`` logger, ``GEODE_DUMP_DIR`` files.

One flag system, settable from the environment or from Python
(``geode.set_options(debug=2, dump_dir="dumps")`` or ``geode.compile(g, debug=2)``):

=====  ==========================================================================
level  what is logged (INFO records on the ``geode`` logger)
=====  ==========================================================================
1      stage summaries: passes run, partitions, fusion plan with the reason for
       every decision, the memory plan (arena buffers, views run as aliases),
       kernels with their costs (the ``explain()`` text)
2      adds the graph before and after each pass that changed it, the final
       graph annotated with each node's kernel, loop ASTs before and after
       scheduling, and the schedule trace
3      adds the generated kernel source
4      adds LLVM IR and assembly of every kernel
=====  ==========================================================================

With a dump dir, every stage of levels 1 to 3 is written to its own numbered file
under ``<dump_dir>/<model>/`` whatever the level (level 4 stages too when the level
is 4), plus ``graph.dot``, the Graphviz picture of the compiled graph. ``<model>`` is
the model's name made file-name safe (:func:`safe_name`: no path separators, no
leading dots, no NUL), so a dump never lands outside ``<dump_dir>``.

A dump folder describes the latest compile of that model, and geode only ever
removes or overwrites files it wrote itself: each dump folder holds a manifest,
``.geode-dump``, listing the files geode wrote there. A new dump removes the listed
files of the earlier one and nothing else. A folder that holds anything geode did not
write (a file or folder missing from the manifest, or any entry at all when there is
no manifest, e.g. a folder of the user's or a dump of a geode version before
manifests) is refused with an :class:`~geode.config.OptionError` naming the folder and
the files: geode does not guess which of them are safe to replace, and writing to
another folder instead would leave the user looking at the wrong one. Hidden entries
(names starting with ``.``, e.g. ``.DS_Store``) are left alone and do not count:
geode never writes such names (other than its manifest). A ``dump_dir`` that is not
a path, that is a file, whose ``<model>`` entry is a file, or that cannot be written
is an ``OptionError`` too, naming ``dump_dir`` and the path.

When a level is set and nothing configured the ``geode`` logger, records go to
stderr; an application that configures logging itself keeps control of where they go.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from pathlib import Path

from geode.config import OptionError, check_path_option

log = logging.getLogger("geode")

_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")
#: The manifest in every dump folder: the names of the files geode wrote there.
MANIFEST = ".geode-dump"
_MANIFEST_HEADER = "# geode dump manifest: files geode wrote in this folder (it removes only these)"
_handler: logging.Handler | None = None


def safe_name(name: object) -> str:
    """A file-name-safe version of ``name``: only ``A-Z a-z 0-9 _ . -`` (anything else,
    path separators and NUL included, becomes ``_``), no leading dots (so never ``.``,
    ``..`` or a hidden name), at most 120 characters, never empty."""
    s = _SAFE.sub("_", str(name)).lstrip(".")
    return s[:120] or "unnamed"


def dump_folder(dump_dir: object, model_name: object) -> Path:
    """Where a model's dump goes: ``<dump_dir>/<safe_name(model_name)>``.

    OptionError when ``dump_dir`` is not a path (see :func:`geode.config.check_path_option`).
    """
    path = check_path_option("dump_dir", dump_dir)
    if not path:
        raise OptionError("dump_dir='': expected a folder path")
    return Path(path).expanduser() / safe_name(model_name)


def _dump_error(dump_dir: object, what: str) -> OptionError:
    return OptionError(f"dump_dir {os.fspath(dump_dir)!r}: {what}")  # type: ignore[arg-type]


def _os_text(exc: OSError) -> str:
    return exc.strerror or str(exc) or type(exc).__name__


def _read_manifest(folder: Path, dump_dir: object) -> set[str] | None:
    """Names listed in ``folder``'s manifest (None when there is no manifest)."""
    manifest = folder / MANIFEST
    if not manifest.exists() and not manifest.is_symlink():
        return None
    if manifest.is_symlink() or not manifest.is_file():
        raise _dump_error(
            dump_dir, f"{manifest} is not a regular file; geode does not use folder {folder}"
        )
    try:
        lines = manifest.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        text = _os_text(exc) if isinstance(exc, OSError) else "not UTF-8 text"
        raise _dump_error(dump_dir, f"cannot read the manifest {manifest}: {text}") from None
    # only plain names geode could have written; anything else is ignored (never removed)
    return {n for n in lines if n and not n.startswith("#") and safe_name(n) == n}


def _foreign_entries(folder: Path, owned: set[str] | None, dump_dir: object) -> list[str]:
    """Non-hidden entries of ``folder`` that geode did not write (not in ``owned``)."""
    try:
        names = sorted(n for n in os.listdir(folder) if not n.startswith("."))
    except OSError as exc:
        raise _dump_error(dump_dir, f"cannot list {folder}: {_os_text(exc)}") from None
    own = owned or set()
    return [
        n for n in names if n not in own or (folder / n).is_symlink() or not (folder / n).is_file()
    ]


def open_dump_folder(dump_dir: object, model_name: object) -> Path:
    """Make ``<dump_dir>/<model>/`` ready for a new dump; its path.

    Creates the folder (and ``dump_dir``) when missing; otherwise checks that geode
    wrote everything in it (its manifest, see the module docstring), removes the files
    of the earlier dump and starts an empty manifest. OptionError naming ``dump_dir``
    and the path when ``dump_dir`` or ``<model>`` exists and is not a folder, when the
    folder holds entries geode did not write (nothing is removed then), or when the
    folder cannot be created or written.
    """
    folder = dump_folder(dump_dir, model_name)
    root = folder.parent
    if root.exists() and not root.is_dir():
        raise _dump_error(dump_dir, "exists and is not a folder")
    if (folder.exists() or folder.is_symlink()) and not folder.is_dir():
        raise _dump_error(dump_dir, f"{folder} exists and is not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _dump_error(dump_dir, f"cannot create folder {folder}: {_os_text(exc)}") from None
    owned = _read_manifest(folder, dump_dir)
    foreign = _foreign_entries(folder, owned, dump_dir)
    if foreign:
        shown = ", ".join(foreign[:5]) + (
            f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""
        )
        why = "" if owned is not None else f" (there is no {MANIFEST} manifest)"
        raise _dump_error(
            dump_dir,
            f"folder {folder} holds files geode did not write{why}: {shown}; geode never "
            "removes or overwrites those: move them away, or choose another dump_dir",
        )
    try:
        for name in sorted(owned or ()):
            (folder / name).unlink(missing_ok=True)
        (folder / MANIFEST).write_text(_MANIFEST_HEADER + "\n", encoding="utf-8")
    except OSError as exc:
        raise _dump_error(dump_dir, f"cannot write in {folder}: {_os_text(exc)}") from None
    return folder


def record_dump_file(folder: Path, file_name: str) -> Path:
    """Add ``file_name`` (made safe) to the manifest of the dump ``folder`` (one that
    :func:`open_dump_folder` prepared); the path of the file.

    Only for a file geode creates itself (never for a name that was already in the
    folder: that file would be removed by the next dump), before writing its content.
    """
    name = safe_name(file_name)
    with open(folder / MANIFEST, "a", encoding="utf-8") as f:
        f.write(name + "\n")
    return folder / name


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
    ``<dump_dir>/<model_name>/``, prepared by :func:`open_dump_folder`: OptionError for
    a folder holding files geode did not write). ``stage(name, text, level)`` records
    one stage; ``artifact(file_name, text)`` writes an unnumbered file (e.g.
    ``graph.dot``). Every file written is listed in the folder's manifest first.
    """

    def __init__(
        self, model_name: str, level: int = 0, dump_dir: str | os.PathLike[str] | None = None
    ):
        self.level = level
        self.dir: Path | None = None
        self.dump_dir = check_path_option("dump_dir", dump_dir)
        self.count = 0
        self.files: list[Path] = []
        configure_logging(level)
        if self.dump_dir:  # "" (e.g. GEODE_DUMP_DIR=) means no dump, like None
            self.dir = open_dump_folder(self.dump_dir, model_name)

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
        path = self._write(self.dir, f"{self.count:02d}_{safe_name(name)}.{safe_name(ext)}", text)
        self.count += 1
        return path

    def artifact(self, file_name: str, text: str) -> Path | None:
        """Write an unnumbered file into the dump dir (nothing without one); its path."""
        if self.dir is None:
            return None
        return self._write(self.dir, file_name, text)

    def _write(self, folder: Path, file_name: str, text: str) -> Path:
        """Create ``file_name`` in ``folder``, list it in the manifest, write ``text``
        (newline-ended) to it. A file this Dumper did not create is never replaced nor
        listed (e.g. one that appeared in the folder during the compile)."""
        path = folder / safe_name(file_name)
        new = path not in self.files
        try:
            with open(path, "x" if new else "w", encoding="utf-8") as f:
                if new:
                    record_dump_file(folder, file_name)
                f.write(text if text.endswith("\n") else text + "\n")
        except FileExistsError:
            raise _dump_error(
                self.dump_dir, f"{path} appeared during the compile; geode did not write it"
            ) from None
        except OSError as exc:
            raise _dump_error(self.dump_dir, f"cannot write {path}: {_os_text(exc)}") from None
        if path not in self.files:
            self.files.append(path)
        return path
