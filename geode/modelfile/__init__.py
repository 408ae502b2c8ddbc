"""Model files: a compiled model written once, loaded anywhere without compiling.

A model file (``.geode``) holds everything a run needs and nothing to execute but
machine code: a format version, the compiled graph, its units of work, the native
code of every kernel (object code: loading links it, no compiler runs), the memory
plan, the variables' descriptions and a snapshot of their values, constants (or
references to the external files they came from, with sizes and hashes), and the
``explain()`` text. The file is data only (a JSON header and raw blobs, see
:mod:`~geode.modelfile.container`): nothing is unpickled or evaluated.

Loading checks, before anything in the file is used: the format version, the
checksum over the whole file (truncated or altered files are refused), the geode
version that wrote it, the versions the object code depends on, the CPU features it
may use (:mod:`~geode.modelfile.compat`), and every variable's description against
the plan; any difference is a :class:`~geode.errors.ModelFileError` naming it.

``CompiledModel.save(path)``, ``geode.load(path)`` and ``Session.load(path)`` are the
public face; ``geode compile MODEL -o model.geode`` the command line's.
"""

from geode.modelfile.container import is_model_file
from geode.modelfile.load import load_model
from geode.modelfile.save import save_model

__all__ = ["is_model_file", "load_model", "save_model"]
