"""Type stubs of geode's native runtime extension (see geode.runtime.native)."""

from collections.abc import Sequence
from typing import Any

from geode.errors import GeodeError

MAX_THREADS: int

class ArgumentError(ValueError, GeodeError):
    """A kernel argument that cannot be passed without a copy; ``index`` is its position."""

    index: int | None

def call(addr: int, n_in: int, arrays: Sequence[object], ints: Sequence[int], /) -> int: ...
def set_num_threads(n: int, /) -> None: ...
def get_num_threads() -> int: ...
def pool_info() -> dict[str, int]: ...
def symbols() -> dict[str, int]: ...
def _set_max_slot_chunks(n: int, /) -> int: ...
def _set_packed_isa(isa: int, /) -> int: ...
def call_chain(
    entries: tuple[tuple[int, int, int, int], ...],
    arrays: tuple[Any, ...],
    ints: tuple[int, ...],
    /,
) -> int: ...
