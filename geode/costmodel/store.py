"""Fitted projected models on disk: one JSON file per device fingerprint.

``python -m geode.costmodel.report --save`` fits the projected model on this
machine's kernels and :func:`save_model` keeps it in the cache folder, named by a
hash of the device spec's key (CPU name, core count, numba version);
:func:`load_model` gives it back to every compile on the same machine, or None when
there is none, it belongs to another device, or it does not read as a model (a
warning names the file; the prior is used instead). The file is data only (JSON,
checked field by field), read and written like every geode cache file
(:mod:`geode.safe_files`: regular files of this user's only, atomic writes).
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path

from geode.safe_files import atomic_write, read_file

from .device import DeviceSpec
from .projected import ProjectedModel

#: the largest model file read (a model is a few hundred bytes)
MAX_BYTES = 1 << 16


def model_path(cache_dir: str | os.PathLike[str], spec: DeviceSpec) -> Path:
    """The file in ``cache_dir`` that holds the projected model fitted on ``spec``'s device."""
    digest = hashlib.sha256(spec.key().encode()).hexdigest()[:16]
    return Path(cache_dir) / "costmodel" / f"projected-{digest}.json"


def save_model(cache_dir: str | os.PathLike[str], spec: DeviceSpec, model: ProjectedModel) -> Path:
    """Write ``model`` (fitted on ``spec``'s device) atomically; returns its path.

    ``ValueError`` when the model was fitted on another device than ``spec``'s."""
    if model.device != spec.key():
        raise ValueError(
            f"model fitted on device {model.device!r} cannot be saved for {spec.key()!r}"
        )
    path = model_path(cache_dir, spec)
    atomic_write(path, json.dumps(model.to_dict(), indent=2, sort_keys=True).encode("utf-8"))
    return path


_cache: dict[tuple[str, str], tuple[float, ProjectedModel | None]] = {}


def load_model(cache_dir: str | os.PathLike[str], spec: DeviceSpec) -> ProjectedModel | None:
    """The projected model saved for ``spec``'s device in ``cache_dir``, or None.

    A file that is not valid JSON, not a model, or fitted on another device is ignored
    with a warning naming it. Results are remembered per file until it changes."""
    path = model_path(cache_dir, spec)
    try:
        mtime = path.stat().st_mtime
    except OSError:
        return None
    key = (str(path), spec.key())
    hit = _cache.get(key)
    if hit is not None and hit[0] == mtime:
        return hit[1]
    model = _read(path, spec)
    _cache[key] = (mtime, model)
    return model


def _read(path: Path, spec: DeviceSpec) -> ProjectedModel | None:
    raw = read_file(path, MAX_BYTES)
    if raw is None:
        return None
    try:
        model = ProjectedModel.from_dict(json.loads(raw.decode("utf-8")))
    except (ValueError, UnicodeDecodeError) as e:
        warnings.warn(f"ignoring corrupt projected model {path}: {e}", stacklevel=3)
        return None
    if model.device != spec.key():
        warnings.warn(
            f"ignoring projected model {path}: fitted on {model.device!r}, not {spec.key()!r}",
            stacklevel=3,
        )
        return None
    return model
