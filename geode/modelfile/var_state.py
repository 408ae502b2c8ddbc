"""The VarManager's state in a model file: every tensor the plan holds there, and how.

A compile registers the model's constants and variables in its session's VarManager
(:mod:`geode.runtime.var_manager`): each under a :class:`VarKey` (name, format, dtype),
at a logical address in one of its regions. The file records, per plan slot that holds
a key: its role, key format and dtype, shape, size, logical offset (the address less
the manager's ``logic_base``) and region (its logical start and size), with the
manager's region size, alignment and region count.

Loading registers the model in the loading session's VarManager (a session's memory is
shared by its models, so a file cannot reserve addresses in it) and then checks what it
registered against the record, like GE's model-cache check: a tensor missing from
either side, or described otherwise (role, format, dtype, shape, size), refuses the
file with a :class:`ModelFileError` naming it. Addresses are relocated, not refused:
geode's kernels take their pointers per call, so no code depends on them. Loaded into
a new session, a model gets the layout it was saved with (the same offsets), which
:func:`layout` reports beside the recorded one.
"""

from __future__ import annotations

from typing import Any

from geode.errors import ModelFileError
from geode.runtime.model import CompiledModel

#: what must agree between the record and the loaded plan
_DESCRIPTION = ("role", "format", "dtype", "shape", "nbytes")


def encode_state(model: CompiledModel) -> dict[str, Any]:
    """The record of ``model``'s VarManager tensors (see the module docstring)."""
    vm = model.var_manager
    return {
        "region_size": vm.region_size,
        "alignment": vm.alignment,
        "regions": vm.num_regions,
        "tensors": [_tensor(model, slot) for slot in model.plan.slots if slot.var_key],
    }


def _tensor(model: CompiledModel, slot: Any) -> dict[str, Any]:
    vm = model.var_manager
    info = vm.info(slot.var_key)
    offset = info.address - vm.logic_base
    return {
        "slot": slot.name,
        "role": slot.role,
        "format": info.key.format,
        "dtype": info.key.dtype,
        "shape": list(info.shape),
        "nbytes": int(info.nbytes),
        "offset": int(offset),
        "region": [int(info.region[0]), int(info.region[1])],
    }


def check_state(record: Any, model: CompiledModel, label: str) -> dict[str, tuple[int, int]]:
    """Check the loaded ``model``'s VarManager tensors against the file's ``record``;
    returns ``{slot: (recorded offset, loaded offset)}``. :class:`ModelFileError` for
    a malformed record or a tensor that differs."""
    if not isinstance(record, dict) or not isinstance(record.get("tensors"), list):
        raise ModelFileError(f"model file {label!r}: bad VarManager record")
    recorded: dict[str, dict[str, Any]] = {}
    for t in record["tensors"]:
        if not isinstance(t, dict) or not isinstance(t.get("slot"), str):
            raise ModelFileError(f"model file {label!r}: bad VarManager tensor record")
        recorded[t["slot"]] = t
    loaded = {t["slot"]: t for t in encode_state(model)["tensors"]}
    for name in sorted(set(recorded) ^ set(loaded)):
        where = "the file's VarManager record" if name in loaded else "the plan"
        raise ModelFileError(
            f"model file {label!r}: tensor {name!r} of the VarManager is missing from {where}"
        )
    for name, mine in loaded.items():
        theirs = recorded[name]
        for field in _DESCRIPTION:
            if theirs.get(field) != mine[field]:
                raise ModelFileError(
                    f"model file {label!r}: VarManager tensor {name!r} is recorded with "
                    f"{field} {theirs.get(field)!r}, the plan holds it with {mine[field]!r}"
                )
    return {
        name: (int(recorded[name].get("offset", -1)), t["offset"]) for name, t in loaded.items()
    }


def layout(addresses: dict[str, tuple[int, int]]) -> str:
    """One line: how many tensors kept their recorded logical offsets."""
    kept = sum(1 for a, b in addresses.values() if a == b)
    return f"VarManager: {len(addresses)} tensors, {kept} at their recorded logical offsets"
