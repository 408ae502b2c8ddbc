"""Text in an ONNX model that is not valid UTF-8.

ONNX's names, symbolic dims (``dim_param``), op types, domains and doc strings are
protobuf ``string`` fields, which should hold UTF-8. A model whose bytes there are not
valid UTF-8 still parses: protobuf then hands the field back as ``bytes``, and a
``bytes`` name or dim would fail deep inside geode (a ``TypeError`` from a symbol, a
regular expression or a hash) instead of importing. :func:`decoded` gives the model with
every such field decoded as :func:`decode_text` decodes string attributes: UTF-8 when
valid, else Latin-1 (every byte one character, so distinct names stay distinct).
"""

from __future__ import annotations

from typing import Any

import onnx

__all__ = ["decode_text", "decoded"]


def decode_text(b: bytes | str) -> str:
    """``b`` as text: itself if a ``str``, else UTF-8, or Latin-1 if not valid UTF-8."""
    if isinstance(b, str):
        return b
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return b.decode("latin-1")


def _string_fields(msg: Any) -> list[Any]:
    return [fd for fd in msg.DESCRIPTOR.fields if fd.type in (fd.TYPE_STRING, fd.TYPE_MESSAGE)]


def _has_undecoded(msg: Any) -> bool:
    """Whether a ``string`` field of ``msg`` or of a message under it came back as bytes."""
    for fd in _string_fields(msg):
        if fd.is_repeated:
            items = getattr(msg, fd.name)
            if fd.type == fd.TYPE_STRING:
                if any(isinstance(s, bytes) for s in items):
                    return True
            elif any(_has_undecoded(m) for m in items):
                return True
        elif fd.type == fd.TYPE_STRING:
            if isinstance(getattr(msg, fd.name), bytes):
                return True
        elif msg.HasField(fd.name) and _has_undecoded(getattr(msg, fd.name)):
            return True
    return False


def _decode_fields(msg: Any) -> None:
    """Decode, in place, every ``string`` field of ``msg`` and the messages under it."""
    for fd in _string_fields(msg):
        if fd.is_repeated:
            items = getattr(msg, fd.name)
            if fd.type == fd.TYPE_MESSAGE:
                for m in items:
                    _decode_fields(m)
            elif any(isinstance(s, bytes) for s in items):
                text = [decode_text(s) for s in items]
                msg.ClearField(fd.name)
                getattr(msg, fd.name).extend(text)
        elif fd.type == fd.TYPE_STRING:
            value = getattr(msg, fd.name)
            if isinstance(value, bytes):
                setattr(msg, fd.name, decode_text(value))
        elif msg.HasField(fd.name):
            _decode_fields(getattr(msg, fd.name))


def decoded(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` itself when all its text is valid UTF-8, else a copy with every text
    field decoded (see the module docstring); the caller's model is never changed."""
    if not _has_undecoded(model):
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    _decode_fields(copy)
    return copy
