/* geode native runtime: the kernel call trampoline. */
#ifndef GEODE_NATIVE_CALL_H
#define GEODE_NATIVE_CALL_H

#include <Python.h>

/* geode.runtime.native.ArgumentError (set by the module at import). */
extern PyObject *geode_argument_error;

/* call(addr, n_in, arrays, ints) -> int, METH_FASTCALL. */
PyObject *geode_call(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *geode_call_chain(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

#endif
