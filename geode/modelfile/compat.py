"""What a model file's machine code needs of the process that loads it, and the check.

The file records the geode version that wrote it, the versions the object code depends
on (llvmlite, LLVM, the backend's code conventions) and the target it was compiled for
(triple, CPU, features). A loader refuses, naming what differs: another geode version,
another LLVM or code convention, another architecture, or a CPU feature the code may use
that this CPU lacks (a different CPU with every feature is fine).
"""

from __future__ import annotations

from typing import Any

from geode.codegen.backends.llvm.objcache import versions
from geode.codegen.backends.llvm.target import host
from geode.errors import ModelFileError

#: versions the object code depends on (python's is not: the code calls no CPython API)
CODE_VERSIONS = ("llvmlite", "llvm", "codegen_version")


def geode_version() -> str:
    """This geode's version."""
    from geode.version import __version__

    return __version__


def environment() -> dict[str, Any]:
    """What this process would write into a model file."""
    import numpy as np

    return {
        "geode": geode_version(),
        "versions": {**{k: versions()[k] for k in CODE_VERSIONS}, "numpy": np.__version__},
        "target": host().fingerprint(),
    }


def _features(text: str) -> set[str]:
    return {f[1:] for f in text.split(",") if f.startswith("+")}


def check(header: dict[str, Any], label: str) -> None:
    """Raise :class:`ModelFileError` unless this process can run the file's code."""
    mine = environment()
    theirs = header.get("geode")
    if theirs != mine["geode"]:
        raise ModelFileError(
            f"model file {label!r} was written by geode {theirs}, this is geode "
            f"{mine['geode']}; compile the model again"
        )
    got = header.get("versions")
    if not isinstance(got, dict):
        raise ModelFileError(f"model file {label!r}: no library versions recorded")
    for name in CODE_VERSIONS:
        if got.get(name) != mine["versions"][name]:
            raise ModelFileError(
                f"model file {label!r}: compiled with {name} {got.get(name)}, this process "
                f"has {mine['versions'][name]}; compile the model again"
            )
    target = header.get("target")
    if not isinstance(target, dict):
        raise ModelFileError(f"model file {label!r}: no target recorded")
    here = mine["target"]
    if target.get("triple") != here["triple"]:
        raise ModelFileError(
            f"model file {label!r}: compiled for {target.get('triple')}, this machine is "
            f"{here['triple']}"
        )
    missing = _features(str(target.get("cpu_features", ""))) - _features(here["cpu_features"])
    if missing:
        raise ModelFileError(
            f"model file {label!r}: its code needs CPU features this CPU lacks: "
            f"{', '.join(sorted(missing))} (compiled for {target.get('cpu_name')}, this CPU "
            f"is {here['cpu_name']})"
        )
