/* geode native runtime: the trampoline from Python into a JIT-compiled kernel entry.

   entry ABI: int32_t entry(void **ptrs, const int64_t *recs, const int64_t *ints)
     ptrs[i]  data pointer of arrays[i]
     recs     per array, in order: ndim, itemsize, shape[0], ..., shape[ndim - 1]
     ints     the Python ints as int64
   Arrays come through the buffer protocol, C-contiguous (never copied); arrays[n_in:] must
   be writable. The GIL is released around the entry call. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "call.h"

#define STACK_ARRAYS 16
#define STACK_WORDS 64

typedef int32_t (*entry_fn)(void **ptrs, const int64_t *recs, const int64_t *ints);

PyObject *geode_argument_error = NULL;

/* Replaces the pending exception by an ArgumentError for argument `index`, chained to it. */
static void raise_argument_error(Py_ssize_t index, int writable)
{
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *type = NULL, *tb = NULL, *value = PyErr_GetRaisedException();
#else
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL && value != NULL)
        PyException_SetTraceback(value, tb);
#endif
    PyObject *msg = PyUnicode_FromFormat(
        "kernel argument %zd (%s) cannot be passed without a copy: %S; it must be a "
        "C-contiguous%s buffer",
        index, writable ? "output" : "input", value ? value : Py_None,
        writable ? ", writable" : "");
    PyObject *exc = msg ? PyObject_CallOneArg(geode_argument_error, msg) : NULL;
    Py_XDECREF(msg);
    PyObject *idx = exc ? PyLong_FromSsize_t(index) : NULL;
    if (idx == NULL || PyObject_SetAttrString(exc, "index", idx) < 0) {
        Py_XDECREF(idx);
        Py_XDECREF(exc);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        return; /* the error of the failed step is pending */
    }
    Py_DECREF(idx);
    if (value != NULL) {
        Py_INCREF(value);
        PyException_SetCause(exc, value); /* steals */
        PyException_SetContext(exc, value); /* steals */
    }
    Py_XDECREF(type);
    Py_XDECREF(tb);
    PyErr_SetObject(geode_argument_error, exc);
    Py_DECREF(exc);
}

static int is_sequence(PyObject *o, const char *what)
{
    if (PyTuple_Check(o) || PyList_Check(o))
        return 1;
    PyErr_Format(PyExc_TypeError, "call(): %s must be a tuple or a list, not %.100s", what,
                 Py_TYPE(o)->tp_name);
    return 0;
}

PyObject *geode_call(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError,
                     "call() takes 4 arguments (addr, n_in, arrays, ints), %zd given", nargs);
        return NULL;
    }
    void *addr = PyLong_AsVoidPtr(args[0]);
    if (addr == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "call(): the kernel address is 0");
        return NULL;
    }
    Py_ssize_t n_in = PyLong_AsSsize_t(args[1]);
    if (n_in == -1 && PyErr_Occurred())
        return NULL;
    PyObject *arrays = args[2], *ints = args[3];
    if (!is_sequence(arrays, "arrays") || !is_sequence(ints, "ints"))
        return NULL;
    const Py_ssize_t na = PySequence_Fast_GET_SIZE(arrays);
    const Py_ssize_t ni = PySequence_Fast_GET_SIZE(ints);
    if (n_in < 0 || n_in > na) {
        PyErr_Format(PyExc_ValueError, "call(): n_in=%zd is outside [0, %zd] (%zd arrays)", n_in,
                     na, na);
        return NULL;
    }

    Py_buffer sbufs[STACK_ARRAYS];
    void *sptrs[STACK_ARRAYS];
    int64_t srecs[STACK_WORDS], sints[STACK_WORDS];
    Py_buffer *bufs = sbufs;
    void **ptrs = sptrs;
    int64_t *recs = srecs, *ivals = sints;
    Py_ssize_t got = 0;
    PyObject *result = NULL;

    if (na > STACK_ARRAYS) {
        bufs = PyMem_Malloc((size_t)na * sizeof(Py_buffer));
        ptrs = PyMem_Malloc((size_t)na * sizeof(void *));
        if (bufs == NULL || ptrs == NULL) {
            PyErr_NoMemory();
            goto done;
        }
    }
    if (ni > STACK_WORDS && (ivals = PyMem_Malloc((size_t)ni * sizeof(int64_t))) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    PyObject **iitems = PySequence_Fast_ITEMS(ints);
    for (Py_ssize_t j = 0; j < ni; j++) {
        long long v = PyLong_AsLongLong(iitems[j]);
        if (v == -1 && PyErr_Occurred()) {
            if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
                PyErr_Clear();
                PyErr_Format(PyExc_ValueError, "call(): ints[%zd] = %R does not fit in int64", j,
                             iitems[j]);
            }
            goto done;
        }
        ivals[j] = (int64_t)v;
    }

    Py_ssize_t nrec = 0;
    const int is_list = PyList_Check(arrays);
    for (Py_ssize_t i = 0; i < na; i++) {
        PyObject *o;
        if (is_list) { /* a list may shrink under an exporter's feet: re-check each time */
            if (i >= PyList_GET_SIZE(arrays)) {
                PyErr_SetString(PyExc_RuntimeError, "call(): the arrays list changed size");
                goto done;
            }
            o = PyList_GET_ITEM(arrays, i);
        } else {
            o = PyTuple_GET_ITEM(arrays, i);
        }
        const int writable = i >= n_in;
        int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(o, &bufs[i], flags) < 0) {
            raise_argument_error(i, writable);
            goto done;
        }
        got++;
        if ((writable && bufs[i].readonly) || !PyBuffer_IsContiguous(&bufs[i], 'C')) {
            PyErr_SetString(PyExc_BufferError, writable && bufs[i].readonly
                                                   ? "the exporter returned a read-only buffer"
                                                   : "the exporter returned a strided buffer");
            raise_argument_error(i, writable);
            goto done;
        }
        ptrs[i] = bufs[i].buf;
        nrec += 2 + bufs[i].ndim;
    }
    if (nrec > STACK_WORDS && (recs = PyMem_Malloc((size_t)nrec * sizeof(int64_t))) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    int64_t *r = recs;
    for (Py_ssize_t i = 0; i < na; i++) {
        const int nd = bufs[i].ndim;
        *r++ = nd;
        *r++ = bufs[i].itemsize;
        for (int d = 0; d < nd; d++)
            *r++ = bufs[i].shape ? bufs[i].shape[d] : bufs[i].len / bufs[i].itemsize;
    }

    int32_t status;
    entry_fn entry = (entry_fn)addr;
    Py_BEGIN_ALLOW_THREADS
    status = entry(ptrs, recs, ivals);
    Py_END_ALLOW_THREADS
    result = PyLong_FromLong(status);

done:
    for (Py_ssize_t i = 0; i < got; i++)
        PyBuffer_Release(&bufs[i]);
    if (bufs != sbufs)
        PyMem_Free(bufs);
    if (ptrs != sptrs)
        PyMem_Free(ptrs);
    if (recs != srecs)
        PyMem_Free(recs);
    if (ivals != sints)
        PyMem_Free(ivals);
    return result;
}
