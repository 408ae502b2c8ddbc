"""Progress bars (tqdm) for long compiles and benchmark runs.

``GEODE_PROGRESS`` (``Options.progress``) decides: ``auto`` shows bars only when
stderr is a terminal, ``1`` always, ``0`` never. Bars appear after a short delay, so
quick compiles (e.g. every kernel from the cache) show nothing.

    with progress_bar(total=len(groups), desc="compiling", setting=opts.progress) as bar:
        for g in groups:
            ...
            bar.update()
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import Any

from geode.config import PROGRESS_OFF, PROGRESS_ON, OptionError

#: Seconds a bar waits before it is drawn.
DEFAULT_DELAY = 0.5


def enabled(setting: str | bool | int | None = "auto", stream: Any = None) -> bool:
    """Whether bars are shown for a ``progress`` setting (auto: only on a terminal)."""
    if isinstance(setting, bool):
        return setting
    if isinstance(setting, int):
        return setting != 0
    s = "auto" if setting is None else str(setting).strip().lower()
    if s in PROGRESS_ON:
        return True
    if s in PROGRESS_OFF:
        return False
    if s != "auto":
        raise OptionError(f"progress={setting!r}: expected auto, 1 or 0")
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class _NullBar:
    """A do-nothing stand-in for a tqdm bar (progress off)."""

    def update(self, n: int = 1) -> None:
        """Ignore progress."""

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        """Ignore the postfix."""

    def close(self) -> None:
        """Nothing to close."""

    def __enter__(self) -> _NullBar:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def progress_bar(
    total: int | None,
    desc: str,
    setting: str | bool | int | None = "auto",
    unit: str = "it",
    delay: float = DEFAULT_DELAY,
) -> Any:
    """A tqdm bar on stderr when ``setting`` enables it, else a bar that does nothing.

    The result is a context manager with ``update(n)``, ``set_postfix_str(s)`` and
    ``close()``; with ``setting`` forced on (``1``) the bar is drawn even off a terminal.
    """
    if not enabled(setting):
        return _NullBar()
    from tqdm import tqdm

    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        delay=delay,
        leave=False,
        file=sys.stderr,
        dynamic_ncols=True,
    )
