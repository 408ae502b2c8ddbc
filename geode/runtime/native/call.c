/* geode native runtime: the trampoline from Python into a JIT-compiled kernel entry.

   entry ABI: int32_t entry(void **ptrs, const int64_t *recs, const int64_t *ints)
     ptrs[i]  data pointer of arrays[i]
     recs     per array, in order: ndim, itemsize, shape[0], ..., shape[ndim - 1]
     ints     the Python ints as int64
   Arrays come through the buffer protocol, C-contiguous (never copied); arrays[n_in:] must
   be writable. A numpy array is read directly (take_ndarray), under the same rules. The
   GIL is released around the entry call. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "call.h"

#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL geode_ARRAY_API
#define NO_IMPORT_ARRAY
#include <numpy/arrayobject.h>

#define STACK_ARRAYS 16
#define STACK_WORDS 64

typedef int32_t (*entry_fn)(void **ptrs, const int64_t *recs, const int64_t *ints);
typedef int64_t (*chain_fn)(void **ptrs, const int64_t *recs, const int64_t *ints);

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

/* A numpy array (exactly: no subclass) that is C-contiguous, and writable when
   `writable`, described in `view` straight from the array: its data, ndim, itemsize and
   shape, with no buffer to take or release (numpy's buffer export costs 150-250 ns an
   array, 10 us per call of a chain of 50 arrays). The caller holds a reference to `o` for
   the call. Returns 0 (nothing set) for anything else: the buffer protocol takes it. */
static int take_ndarray(PyObject *o, int writable, Py_buffer *view)
{
    if (!PyArray_CheckExact(o))
        return 0;
    PyArrayObject *a = (PyArrayObject *)o;
    const int flags = PyArray_FLAGS(a);
    if (!(flags & NPY_ARRAY_C_CONTIGUOUS) || (writable && !(flags & NPY_ARRAY_WRITEABLE)))
        return 0;
    view->obj = NULL; /* PyBuffer_Release does nothing with it */
    view->buf = PyArray_DATA(a);
    view->ndim = PyArray_NDIM(a);
    view->itemsize = PyArray_ITEMSIZE(a);
    view->len = PyArray_NBYTES(a);
    view->readonly = !(flags & NPY_ARRAY_WRITEABLE);
    view->shape = (Py_ssize_t *)PyArray_DIMS(a);
    view->strides = NULL;
    return 1;
}

/* Take arrays argument `o` into `view`: a numpy array directly (take_ndarray), anything
   else through the buffer protocol, C-contiguous (and writable when `writable`).
   Returns -1 with ArgumentError raised for argument `index` when it cannot be taken. */
static int take_array(PyObject *o, Py_ssize_t index, int writable, Py_buffer *view)
{
    if (take_ndarray(o, writable, view))
        return 0;
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(o, view, flags) < 0) {
        view->obj = NULL;
        raise_argument_error(index, writable);
        return -1;
    }
    if ((writable && view->readonly) || !PyBuffer_IsContiguous(view, 'C')) {
        PyErr_SetString(PyExc_BufferError, writable && view->readonly
                                               ? "the exporter returned a read-only buffer"
                                               : "the exporter returned a strided buffer");
        PyBuffer_Release(view);
        raise_argument_error(index, writable);
        return -1;
    }
    return 0;
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
        if (take_array(o, i, i >= n_in, &bufs[i]) < 0)
            goto done;
        got++;
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

/* call_chain(entries, arrays, ints): several kernel entries in one crossing.

   entries  a tuple of (addr, n_arrays, n_in, n_ints) tuples, one per kernel, in run order
   arrays   every kernel's arrays, concatenated in that order (an array may appear several
            times: an output of one kernel is an input of a later one)
   ints     every kernel's ints, concatenated
   Kernel k gets its slices of ptrs, recs and ints; positions n_in.. of its slice must be
   writable. The kernels run one after another with the GIL released; the first nonzero
   status stops the chain. Returns 0, or ((k + 1) << 32) | status for kernel k. A bad array
   raises ArgumentError with .index its position in `arrays`.

   chain    (optional 4th argument, None or 0: absent) the address of the chain's own
            native entry, int64_t chain(void **ptrs, const int64_t *recs, const int64_t *ints),
            generated for these entries (the same slices, the same status encoding): after
            the same validation it is called once instead of the loop. */
#define CHAIN_MAX 256

PyObject *geode_call_chain(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 3 && nargs != 4) {
        PyErr_Format(PyExc_TypeError,
                     "call_chain() takes 3 or 4 arguments (entries, arrays, ints[, chain]), "
                     "%zd given",
                     nargs);
        return NULL;
    }
    PyObject *entries = args[0], *arrays = args[1], *ints = args[2];
    chain_fn chain = NULL;
    if (nargs == 4 && args[3] != Py_None) {
        chain = (chain_fn)PyLong_AsVoidPtr(args[3]);
        if (chain == NULL && PyErr_Occurred())
            return NULL;
    }
    if (!PyTuple_Check(entries) || !PyTuple_Check(arrays) || !PyTuple_Check(ints)) {
        PyErr_SetString(PyExc_TypeError, "call_chain(): entries, arrays and ints must be tuples");
        return NULL;
    }
    const Py_ssize_t nk = PyTuple_GET_SIZE(entries);
    const Py_ssize_t na = PyTuple_GET_SIZE(arrays);
    const Py_ssize_t ni = PyTuple_GET_SIZE(ints);
    if (nk > CHAIN_MAX) {
        PyErr_Format(PyExc_ValueError, "call_chain(): at most %d kernels, got %zd", CHAIN_MAX, nk);
        return NULL;
    }
    entry_fn fns[CHAIN_MAX];
    Py_ssize_t k_arrays[CHAIN_MAX], k_in[CHAIN_MAX], k_ints[CHAIN_MAX];
    Py_ssize_t sum_a = 0, sum_i = 0;
    for (Py_ssize_t k = 0; k < nk; k++) {
        PyObject *e = PyTuple_GET_ITEM(entries, k);
        if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 4) {
            PyErr_Format(PyExc_TypeError, "call_chain(): entries[%zd] must be a 4-tuple", k);
            return NULL;
        }
        void *addr = PyLong_AsVoidPtr(PyTuple_GET_ITEM(e, 0));
        k_arrays[k] = PyLong_AsSsize_t(PyTuple_GET_ITEM(e, 1));
        k_in[k] = PyLong_AsSsize_t(PyTuple_GET_ITEM(e, 2));
        k_ints[k] = PyLong_AsSsize_t(PyTuple_GET_ITEM(e, 3));
        if (PyErr_Occurred())
            return NULL;
        if (addr == NULL || k_arrays[k] < 0 || k_in[k] < 0 || k_in[k] > k_arrays[k] ||
            k_ints[k] < 0) {
            PyErr_Format(PyExc_ValueError, "call_chain(): entries[%zd] is not a valid entry", k);
            return NULL;
        }
        fns[k] = (entry_fn)addr;
        sum_a += k_arrays[k];
        sum_i += k_ints[k];
    }
    if (sum_a != na || sum_i != ni) {
        PyErr_Format(PyExc_ValueError,
                     "call_chain(): the entries take %zd arrays and %zd ints, got %zd and %zd",
                     sum_a, sum_i, na, ni);
        return NULL;
    }

    Py_buffer *bufs = PyMem_Malloc((size_t)(na ? na : 1) * sizeof(Py_buffer));
    void **ptrs = PyMem_Malloc((size_t)(na ? na : 1) * sizeof(void *));
    int64_t *ivals = PyMem_Malloc((size_t)(ni ? ni : 1) * sizeof(int64_t));
    int64_t *recs = NULL;
    Py_ssize_t got = 0;
    PyObject *result = NULL;
    if (bufs == NULL || ptrs == NULL || ivals == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t j = 0; j < ni; j++) {
        long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(ints, j));
        if (v == -1 && PyErr_Occurred()) {
            if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
                PyErr_Clear();
                PyErr_Format(PyExc_ValueError, "call_chain(): ints[%zd] does not fit in int64", j);
            }
            goto done;
        }
        ivals[j] = (int64_t)v;
    }
    Py_ssize_t nrec = 0, pos = 0;
    for (Py_ssize_t k = 0; k < nk; k++) {
        for (Py_ssize_t i = 0; i < k_arrays[k]; i++, pos++) {
            if (take_array(PyTuple_GET_ITEM(arrays, pos), pos, i >= k_in[k], &bufs[pos]) < 0)
                goto done;
            got++;
            ptrs[pos] = bufs[pos].buf;
            nrec += 2 + bufs[pos].ndim;
        }
    }
    recs = PyMem_Malloc((size_t)(nrec ? nrec : 1) * sizeof(int64_t));
    if (recs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t rec_at[CHAIN_MAX];
    int64_t *r = recs;
    pos = 0;
    for (Py_ssize_t k = 0; k < nk; k++) {
        rec_at[k] = r - recs;
        for (Py_ssize_t i = 0; i < k_arrays[k]; i++, pos++) {
            const int nd = bufs[pos].ndim;
            *r++ = nd;
            *r++ = bufs[pos].itemsize;
            for (int d = 0; d < nd; d++)
                *r++ = bufs[pos].shape ? bufs[pos].shape[d] : bufs[pos].len / bufs[pos].itemsize;
        }
    }

    long long status = 0;
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t pa = 0, pi = 0;
    if (chain != NULL)
        status = (long long)chain(ptrs, recs, ivals);
    for (Py_ssize_t k = 0; chain == NULL && k < nk; k++) {
        int32_t s = fns[k](ptrs + pa, recs + rec_at[k], ivals + pi);
        if (s != 0) {
            status = ((long long)(k + 1) << 32) | (uint32_t)s;
            break;
        }
        pa += k_arrays[k];
        pi += k_ints[k];
    }
    Py_END_ALLOW_THREADS
    result = PyLong_FromLongLong(status);

done:
    for (Py_ssize_t i = 0; i < got; i++)
        PyBuffer_Release(&bufs[i]);
    PyMem_Free(bufs);
    PyMem_Free(ptrs);
    PyMem_Free(ivals);
    PyMem_Free(recs);
    return result;
}
