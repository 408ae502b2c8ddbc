"""The CPU the LLVM backend compiles for: triple, CPU name, features, vector widths.

The host's own CPU and features (``llvm.get_host_cpu_name`` / ``get_host_cpu_features``)
are used, as numba did. LLVM tunes AVX-512 CPUs to prefer 256-bit vectors; geode's
compute-heavy loops (exp, tanh, erf) run faster with 512-bit vectors and the
memory-bound ones are never slower (measurements: ``docs/performance.md``), so every
function geode emits carries the attribute ``"prefer-vector-width"="512"`` on AVX-512 hosts (``GEODE_VECTOR_WIDTH=256``
keeps LLVM's choice; ``512`` or ``auto``, the default, prefer 512).

:meth:`Target.fingerprint` is part of every cache key: code compiled for one CPU or
vector width is never loaded for another.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

from geode.config import OptionError

__all__ = ["ENV_VAR", "Target", "host"]

#: Environment variable choosing the preferred vector width (auto, 256, 512).
ENV_VAR = "GEODE_VECTOR_WIDTH"


@dataclass(frozen=True)
class Target:
    """A CPU to compile for (see the module docstring)."""

    triple: str
    cpu: str
    features: str
    #: ``prefer-vector-width`` for every function, or "" for LLVM's default
    prefer_vector_width: str

    @property
    def is_x86(self) -> bool:
        """Whether the target is x86 (``sfence`` orders non-temporal stores)."""
        return self.triple.startswith(("x86_64", "i386", "i686", "amd64"))

    def has(self, feature: str) -> bool:
        """Whether ``+feature`` is among the target's features."""
        return f"+{feature}" in self.features.split(",")

    @property
    def stream_vector_bytes(self) -> int:
        """Bytes per non-temporal vector store: 64 (AVX-512), 32 (AVX) or 16. A
        streaming store of a whole vector needs an address aligned to this size."""
        if self.has("avx512f"):
            return 64
        return 32 if self.has("avx") else 16

    @property
    def vector_registers(self) -> int:
        """Vector registers: 32 with AVX-512, else 16."""
        return 32 if self.is_x86 and self.has("avx512f") else 16

    @property
    def function_attrs(self) -> str:
        """Attributes every emitted function carries (CPU, features, vector width)."""
        attrs = [f'"target-cpu"="{self.cpu}"', f'"target-features"="{self.features}"']
        if self.prefer_vector_width:
            attrs.append(f'"prefer-vector-width"="{self.prefer_vector_width}"')
        return " ".join(attrs)

    def fingerprint(self) -> dict[str, str]:
        """What the generated code depends on (for cache keys)."""
        return {
            "triple": self.triple,
            "cpu_name": self.cpu,
            "cpu_features": self.features,
            "prefer_vector_width": self.prefer_vector_width,
        }


def _vector_width(features: str, setting: str) -> str:
    """``prefer-vector-width`` for ``setting`` (auto, 256, 512) on a CPU with
    ``features``.

    >>> _vector_width("+avx2,+avx512f", "auto"), _vector_width("+avx2,-avx512f", "auto")
    ('512', '')
    >>> _vector_width("+avx2,+avx512f", "256")
    ''
    """
    setting = setting.strip().lower() or "auto"
    if setting not in ("auto", "256", "512"):
        raise OptionError(f"{ENV_VAR}={setting!r}: expected auto, 256 or 512")
    if setting == "256" or "+avx512f" not in features.split(","):
        return ""
    return "512"


@functools.lru_cache(maxsize=4)
def _host(setting: str) -> Target:
    from geode.codegen.backends.llvm.linker import host_cpu  # no llvmlite.binding import

    triple, cpu, features = host_cpu()
    return Target(
        triple=triple,
        cpu=cpu,
        features=features,
        prefer_vector_width=_vector_width(features, setting),
    )


def host() -> Target:
    """The host CPU, with the vector width ``GEODE_VECTOR_WIDTH`` asks for."""
    return _host(os.environ.get(ENV_VAR, "auto"))
