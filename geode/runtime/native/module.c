/* geode native runtime: the Python module geode.runtime.native._ext. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "call.h"
#include "pool.h"

#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL geode_ARRAY_API
#include <numpy/arrayobject.h>

PyDoc_STRVAR(call_chain_doc,
             "call_chain($module, entries, arrays, ints, chain=None, /)\n--\n\n"
             "Call several kernel entries in one crossing, the GIL released once: entries is a\n"
             "tuple of (addr, n_arrays, n_in, n_ints) per kernel, arrays and ints every kernel's\n"
             "arguments concatenated. Returns 0, or ((k + 1) << 32) | status for the first\n"
             "kernel k that returned a nonzero status (the later ones do not run). chain: the\n"
             "address of a native entry generated for these entries (the same slices and\n"
             "status), called once instead of the loop (None or 0: the loop).");

PyDoc_STRVAR(call_doc,
             "call($module, addr, n_in, arrays, ints, /)\n--\n\n"
             "Call the kernel entry at `addr` and return its int32 status.\n\n"
             "The entry has the C signature int32_t entry(void **ptrs, const int64_t *recs,\n"
             "const int64_t *ints). arrays (tuple or list) are passed as their C-contiguous\n"
             "buffers, never copied; arrays[n_in:] must be writable (ArgumentError otherwise).\n"
             "ints (tuple or list) are converted to int64. The GIL is released during the call.");

PyDoc_STRVAR(set_num_threads_doc,
             "set_num_threads($module, n, /)\n--\n\n"
             "Resize the pool to n threads (the caller included). Waits until no job runs,\n"
             "stops the workers; they restart lazily on the next parallel job.");

PyDoc_STRVAR(get_num_threads_doc,
             "get_num_threads($module, /)\n--\n\nReturn the pool size (threads of a job).");

PyDoc_STRVAR(pool_info_doc,
             "pool_info($module, /)\n--\n\n"
             "Return a dict: threads, spin_us, workers_running, launches, inline_runs,\n"
             "stepped_launches, barrier_sleeps,\n"
             "blas_pool_runs, blas_thread_runs, scratch_bytes, gemm_split_calls, gemm_thin_calls,\n"
             "gemm_thin_kernel (1: geode's own float32 GEMM kernel runs on this CPU),\n"
             "gemm_wide_calls, gemm_wide_kernel (1: float32 products take the packed kernel),\n"
             "gemm_packed_calls, gemm_packed_isa (packed-weight GEMM path: 0 plain C, 1 AVX2,\n"
             "2 AVX-512), winograd_isa (Winograd conv path: 0 plain C, 1 AVX2, 2 AVX-512VL,\n"
             "3 AVX-512 zmm).");

PyDoc_STRVAR(symbols_doc,
             "symbols($module, /)\n--\n\n"
             "Return a dict of the C functions JIT code may call: name -> address.");

PyDoc_STRVAR(set_max_slot_chunks_doc,
             "_set_max_slot_chunks($module, n, /)\n--\n\n"
             "Testing hook: limit the chunks of one participant's range per round (a job\n"
             "with more chunks runs in several rounds); n < 1 restores the default 2**31.\n"
             "Returns the previous limit.");

static PyObject *py_set_num_threads(PyObject *module, PyObject *arg)
{
    (void)module;
    long long n = PyLong_AsLongLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < 1 || n > GEODE_MAX_THREADS) {
        PyErr_Format(PyExc_ValueError, "set_num_threads(): n=%lld is outside [1, %d]", n,
                     GEODE_MAX_THREADS);
        return NULL;
    }
    if (geode_pool_in_job()) {
        PyErr_SetString(PyExc_RuntimeError,
                        "set_num_threads() called from inside a parallel job");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    geode_pool_resize((int64_t)n);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *py_get_num_threads(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyLong_FromLongLong(geode_num_threads());
}

static PyObject *py_pool_info(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    geode_pool_stats s;
    uint64_t blas_pool = 0, blas_threads = 0;
    geode_pool_get_stats(&s);
    geode_blas_stats(&blas_pool, &blas_threads);
    return Py_BuildValue("{s:L,s:L,s:L,s:K,s:K,s:K,s:K,s:K,s:K,s:L,s:K,s:K,s:i,s:K,s:i,s:K,s:i,s:i}",
                         "threads", (long long)s.threads,
                         "spin_us", (long long)s.spin_us, "workers_running",
                         (long long)s.workers_running, "launches", (unsigned long long)s.launches,
                         "inline_runs", (unsigned long long)s.inline_runs, "stepped_launches",
                         (unsigned long long)s.stepped_launches, "barrier_sleeps",
                         (unsigned long long)s.barrier_sleeps, "blas_pool_runs",
                         (unsigned long long)blas_pool, "blas_thread_runs",
                         (unsigned long long)blas_threads, "scratch_bytes",
                         (long long)geode_scratch_held(), "gemm_split_calls",
                         (unsigned long long)geode_gemm_split_calls(), "gemm_thin_calls",
                         (unsigned long long)geode_gemm_thin_calls(), "gemm_thin_kernel",
                         geode_sgemm_thin_ok(), "gemm_wide_calls",
                         (unsigned long long)geode_gemm_wide_calls(), "gemm_wide_kernel",
                         geode_gemm_wide_on(), "gemm_packed_calls",
                         (unsigned long long)geode_sgemm_packed_calls(), "gemm_packed_isa",
                         geode_sgemm_packed_isa(), "winograd_isa", geode_winograd_isa());
}

static PyObject *py_symbols(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return Py_BuildValue("{s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N}", "geode_parallel_for",
                         PyLong_FromVoidPtr((void *)&geode_parallel_for), "geode_launch",
                         PyLong_FromVoidPtr((void *)&geode_launch), "geode_parallel_steps",
                         PyLong_FromVoidPtr((void *)&geode_parallel_steps), "geode_num_threads",
                         PyLong_FromVoidPtr((void *)&geode_num_threads), "geode_scratch",
                         PyLong_FromVoidPtr((void *)&geode_scratch), "geode_gemm",
                         PyLong_FromVoidPtr((void *)&geode_gemm), "geode_sgemm_packed",
                         PyLong_FromVoidPtr((void *)&geode_sgemm_packed),
                         "geode_sgemm_packed_bias", PyLong_FromVoidPtr((void *)&geode_sgemm_packed_bias),
                         "geode_sgemm_packed_at", PyLong_FromVoidPtr((void *)&geode_sgemm_packed_at),
                         "geode_sgemm_pack",
                         PyLong_FromVoidPtr((void *)&geode_sgemm_pack), "geode_conv_winograd",
                         PyLong_FromVoidPtr((void *)&geode_conv_winograd), "geode_check_indices",
                         PyLong_FromVoidPtr((void *)&geode_check_indices));
}

PyDoc_STRVAR(blas_share_pool_doc,
             "blas_share_pool($module, set_callback, set_threads, /)\n--\n\n"
             "Route OpenBLAS's parallel work to the pool: set_callback and set_threads are the\n"
             "addresses of OpenBLAS's openblas_set_threads_callback_function and\n"
             "openblas_set_num_threads. OpenBLAS's thread count then follows the pool size.");

static PyObject *py_blas_share_pool(PyObject *module, PyObject *const *args, Py_ssize_t n)
{
    (void)module;
    if (n != 2) {
        PyErr_SetString(PyExc_TypeError, "blas_share_pool() takes 2 addresses");
        return NULL;
    }
    void *set_callback = PyLong_AsVoidPtr(args[0]);
    void *set_threads = PyLong_AsVoidPtr(args[1]);
    if (PyErr_Occurred())
        return NULL;
    if (set_callback == NULL || set_threads == NULL) {
        PyErr_SetString(PyExc_ValueError, "blas_share_pool(): a null address");
        return NULL;
    }
    geode_blas_share_pool((void (*)(void *))set_callback, (void (*)(int))set_threads);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(gemm_configure_doc,
             "gemm_configure($module, sgemm, dgemm, int_bits, set_threads, get_threads, /)\n"
             "--\n\n"
             "Give geode_gemm the BLAS's row-major cblas ?gemm (int_bits-bit ints) and its\n"
             "openblas_set/get_num_threads (0: none; without set, geode_gemm never splits).");

static PyObject *py_gemm_configure(PyObject *module, PyObject *const *args, Py_ssize_t n)
{
    (void)module;
    if (n != 5) {
        PyErr_SetString(PyExc_TypeError, "gemm_configure() takes 5 arguments");
        return NULL;
    }
    void *s = PyLong_AsVoidPtr(args[0]), *d = PyLong_AsVoidPtr(args[1]);
    long bits = PyLong_AsLong(args[2]);
    void *set = PyLong_AsVoidPtr(args[3]), *get = PyLong_AsVoidPtr(args[4]);
    if (PyErr_Occurred())
        return NULL;
    if (s == NULL || d == NULL || (bits != 32 && bits != 64)) {
        PyErr_SetString(PyExc_ValueError, "gemm_configure(): null routine or bad int width");
        return NULL;
    }
    geode_gemm_configure(s, d, (int)bits, set, get);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(release_scratch_doc,
             "release_scratch($module, /)\n--\n\n"
             "Free the calling thread's scratch buffers (kernels keep them between calls).");

static PyObject *py_release_scratch(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    geode_scratch_release();
    Py_RETURN_NONE;
}

static PyObject *py_set_max_slot_chunks(PyObject *module, PyObject *arg)
{
    (void)module;
    long long n = PyLong_AsLongLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    return PyLong_FromLongLong(geode_pool_set_max_slot_chunks((int64_t)n));
}

PyDoc_STRVAR(set_packed_isa_doc,
             "_set_packed_isa($module, isa, /)\n--\n\n"
             "Testing hook: the packed-weight GEMM's path (0 plain C, 1 AVX2, 2 AVX-512; < 0:\n"
             "the default again). Returns the previous path; ValueError when the CPU cannot\n"
             "run `isa`.");

static PyObject *py_set_packed_isa(PyObject *module, PyObject *arg)
{
    (void)module;
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n > 2) {
        PyErr_Format(PyExc_ValueError, "_set_packed_isa(): no path %ld (0, 1 or 2)", n);
        return NULL;
    }
    int old = geode_sgemm_packed_set_isa((int)n);
    if (old == -2) {
        PyErr_Format(PyExc_ValueError, "_set_packed_isa(): this CPU cannot run path %ld", n);
        return NULL;
    }
    return PyLong_FromLong(old);
}

PyDoc_STRVAR(set_gemm_wide_doc,
             "_set_gemm_wide($module, on, /)\n--\n\n"
             "Testing hook: 0 keeps geode_gemm's float32 products off geode_sgemm_wide (the\n"
             "BLAS then computes them, as before it), 1 lets them take it again. Returns the\n"
             "previous setting.");

static PyObject *py_set_gemm_wide(PyObject *module, PyObject *arg)
{
    (void)module;
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    return PyLong_FromLong(geode_gemm_set_wide(n != 0));
}

PyDoc_STRVAR(set_winograd_isa_doc,
             "_set_winograd_isa($module, isa, /)\n--\n\n"
             "Testing hook: the Winograd conv's path (0 plain C, 1 AVX2, 2 AVX-512VL, 3 AVX-512\n"
             "zmm; < 0: the best again). Returns the previous path; ValueError when the CPU\n"
             "cannot run `isa`.");

static PyObject *py_set_winograd_isa(PyObject *module, PyObject *arg)
{
    (void)module;
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    int old = n > 3 ? -2 : geode_winograd_set_isa((int)n);
    if (old == -2) {
        PyErr_Format(PyExc_ValueError, "_set_winograd_isa(): this CPU cannot run path %ld", n);
        return NULL;
    }
    return PyLong_FromLong(old);
}

static PyMethodDef methods[] = {
    {"call", (PyCFunction)(void (*)(void))geode_call, METH_FASTCALL, call_doc},
    {"call_chain", (PyCFunction)(void (*)(void))geode_call_chain, METH_FASTCALL, call_chain_doc},
    {"set_num_threads", py_set_num_threads, METH_O, set_num_threads_doc},
    {"get_num_threads", py_get_num_threads, METH_NOARGS, get_num_threads_doc},
    {"pool_info", py_pool_info, METH_NOARGS, pool_info_doc},
    {"symbols", py_symbols, METH_NOARGS, symbols_doc},
    {"blas_share_pool", (PyCFunction)(void (*)(void))py_blas_share_pool, METH_FASTCALL,
     blas_share_pool_doc},
    {"release_scratch", py_release_scratch, METH_NOARGS, release_scratch_doc},
    {"gemm_configure", (PyCFunction)(void (*)(void))py_gemm_configure, METH_FASTCALL,
     gemm_configure_doc},
    {"_set_max_slot_chunks", py_set_max_slot_chunks, METH_O, set_max_slot_chunks_doc},
    {"_set_packed_isa", py_set_packed_isa, METH_O, set_packed_isa_doc},
    {"_set_gemm_wide", py_set_gemm_wide, METH_O, set_gemm_wide_doc},
    {"_set_winograd_isa", py_set_winograd_isa, METH_O, set_winograd_isa_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "geode.runtime.native._ext",
    "geode's native runtime (thread pool and kernel call trampoline); see geode.runtime.native.",
    -1,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

/* ArgumentError derives from ValueError and geode.errors.GeodeError. */
static PyObject *make_argument_error(void)
{
    PyObject *errors = PyImport_ImportModule("geode.errors");
    if (errors == NULL)
        return NULL;
    PyObject *geode_error = PyObject_GetAttrString(errors, "GeodeError");
    Py_DECREF(errors);
    if (geode_error == NULL)
        return NULL;
    PyObject *bases = PyTuple_Pack(2, PyExc_ValueError, geode_error);
    Py_DECREF(geode_error);
    if (bases == NULL)
        return NULL;
    PyObject *dict = Py_BuildValue("{s:O}", "index", Py_None);
    PyObject *cls = dict == NULL ? NULL
                                 : PyErr_NewExceptionWithDoc(
                                       "geode.runtime.native.ArgumentError",
                                       "A kernel argument that cannot be passed without a copy "
                                       "(not a buffer, not C-contiguous, or read-only where the "
                                       "kernel writes). `index` is its position in arrays.",
                                       bases, dict);
    Py_DECREF(bases);
    Py_XDECREF(dict);
    return cls;
}

PyMODINIT_FUNC PyInit__ext(void)
{
    import_array(); /* numpy's C API: the trampoline reads numpy arrays directly */
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    if (geode_argument_error == NULL && (geode_argument_error = make_argument_error()) == NULL) {
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(geode_argument_error);
    if (PyModule_AddObject(m, "ArgumentError", geode_argument_error) < 0) {
        Py_DECREF(geode_argument_error);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "MAX_THREADS", GEODE_MAX_THREADS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    geode_pool_init();
    return m;
}
