"""geode's error hierarchy: one subclass of :class:`GeodeError` per failure kind.

Every error raised on bad user input is a ``GeodeError``; its message names what was
wrong and where (node, op, input, attribute, file) so the user can act on it.
"""

from __future__ import annotations


class GeodeError(Exception):
    """Base class of every error geode raises on purpose."""


class GraphError(GeodeError):
    """A structural problem in a graph: cycles, duplicate names, dangling values."""


class UnknownOpError(GeodeError):
    """An op type (or domain) that the registry does not know."""

    def __init__(self, op_type: str, domain: str = "", opset: int | None = None, where: str = ""):
        dom = domain or "ai.onnx"
        msg = f"unknown op {op_type!r} in domain {dom!r}"
        if opset is not None:
            msg += f" (opset {opset})"
        if where:
            msg += f" at {where}"
        super().__init__(msg)
        self.op_type = op_type
        self.domain = domain
        self.opset = opset


class VerifyError(GeodeError):
    """A node that breaks its op's schema: input count, attributes, dtypes."""


class ShapeError(GeodeError):
    """Shapes that cannot be inferred or that contradict each other."""


class DTypeError(GeodeError):
    """A dtype that an op, a graph input or a kernel does not accept."""


class InputError(GeodeError):
    """Inputs given to a compiled model that do not match its signature."""


class MissingInputError(InputError):
    """A required model input was not given."""


class UnexpectedInputError(InputError):
    """A name was given that is not an input of the model."""


class InputDTypeError(InputError, DTypeError):
    """A model input was given with the wrong dtype."""


class InputShapeError(InputError, ShapeError):
    """A model input has the wrong rank or a dim that contradicts the graph."""


class ScheduleError(GeodeError):
    """A schedule primitive whose requirements do not hold."""

    def __init__(self, primitive: str, block: str, reason: str):
        super().__init__(f"schedule primitive {primitive!r} on block {block!r}: {reason}")
        self.primitive = primitive
        self.block = block


class CodegenError(GeodeError):
    """Lowering or native compilation of a fused group failed."""


class ModelLoadError(GeodeError):
    """A model file or proto that cannot be read (truncated, not ONNX, bad paths)."""


class ModelFileError(ModelLoadError):
    """A geode model file (``.geode``) that cannot be written, or cannot be trusted or
    used when read: a bad format, a checksum that does not match, another geode or
    library version, a CPU feature this machine lacks, a variable described otherwise."""


class CheckpointError(GeodeError):
    """A variable checkpoint that cannot be written or read: a bad path, a truncated or
    altered file, or variables whose description differs from the session's."""


class ExecutionError(GeodeError):
    """A failure while running a compiled plan (a kernel raised, a shape mismatch)."""


class OutOfMemoryError(ExecutionError, MemoryError):
    """A run (or the copy of an input) would need more memory than it may use: raised
    before allocating, naming the value and the bytes asked for (see
    :mod:`geode.runtime.memlimit`). Also a ``MemoryError``."""


class InputMemoryError(OutOfMemoryError, InputError):
    """A model input geode would have to copy (a strided or broadcast view, a
    byte-swapped array) whose contiguous copy would not fit in memory."""


class TraceError(GeodeError):
    """A schedule trace that cannot be read or replayed: not the trace format, a
    version geode does not know, an unknown primitive or a bad argument, or a step
    whose requirements fail on the kernel it is replayed on (the message names the
    trace and the step)."""


class UserScheduleError(GeodeError):
    """A schedule given to ``geode.compile(..., schedules=...)`` that cannot be applied
    to its kernel (the message names the kernel and its key)."""


class TuningError(GeodeError):
    """A tuning database that cannot be used (not a tuning database, another format
    version, a file others may write, a bad signature) or a tuning run that cannot
    proceed (no inputs for the model's symbolic dims)."""


class MissingDependencyError(GeodeError):
    """An optional dependency that the chosen option needs is not installed (numba for
    ``backend="numba"``); the message names the extra that installs it."""
