/* geode native runtime: the kernel call trampoline. */
#ifndef GEODE_NATIVE_CALL_H
#define GEODE_NATIVE_CALL_H

#include <Python.h>
#include <stdint.h>

/* geode.runtime.native.ArgumentError (set by the module at import). */
extern PyObject *geode_argument_error;

/* call(addr, n_in, arrays, ints) -> int, METH_FASTCALL. */
PyObject *geode_call(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *geode_call_chain(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* A kernel entry (the ABI of call.c) that checks indices: 0 when every index of ptrs[0]
   lies in [-ints[0], ints[0]) (ints[1] != 0: unsigned, [0, ints[0])), 1 when one does
   not, 2 for an item size other than 1, 2, 4 or 8 (indices.c). */
int32_t geode_check_indices(void **ptrs, const int64_t *recs, const int64_t *ints);

#endif
