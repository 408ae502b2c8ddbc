/* geode native runtime: OpenBLAS's parallel work on geode's pool (caller-managed threading).

   OpenBLAS (0.3.27 and newer) lets its caller run its threads: once a callback is set with
   openblas_set_threads_callback_function, every parallel BLAS call hands the callback its
   jobs (numjobs records of jobdata_elsize bytes) and a function that runs one. With
   geode_blas_callback installed, BLAS work inside geode kernels and numpy's own matmul run
   on the same pool as the fused kernels, with one thread count, and OpenBLAS's own workers
   (which spin long after each call) stay asleep.

   The jobs of a level-3 call wait on each other, so they must run at once on numjobs
   threads: geode_pool_run_concurrent promises that, or refuses (a BLAS call made from inside
   a pool job, or more jobs than pool threads); then the jobs run on short-lived threads. */

#define _GNU_SOURCE
#include "pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

typedef void (*blas_dojob_fn)(int thread, void *jobdata, int dojob_data);
typedef void (*blas_set_threads_fn)(int n);

typedef struct {
    blas_dojob_fn dojob;
    char *jobs;
    size_t size;
    int data;
} blas_work_t;

typedef struct {
    const blas_work_t *work;
    int64_t index;
} blas_thread_arg_t;

static _Atomic(blas_set_threads_fn) g_set_threads;
static atomic_ullong g_blas_pool_runs;
static atomic_ullong g_blas_thread_runs;

static void run_one(const blas_work_t *w, int64_t i)
{
    w->dojob((int)i, w->jobs + (size_t)i * w->size, w->data);
}

static void pool_chunk(void *ctx, int64_t chunk, int64_t nchunks)
{
    (void)nchunks;
    run_one((const blas_work_t *)ctx, chunk);
}

static void *thread_main(void *arg)
{
    const blas_thread_arg_t *a = arg;
    run_one(a->work, a->index);
    return NULL;
}

/* Jobs 1..n-1 on new threads, job 0 on the caller. A thread that cannot be created runs its
   job on the caller after the others started (the caller's own job may then wait on it:
   only when the system is out of threads). */
static void run_on_threads(const blas_work_t *w, int64_t n)
{
    pthread_t *tids = calloc((size_t)n, sizeof(pthread_t));
    blas_thread_arg_t *args = calloc((size_t)n, sizeof(blas_thread_arg_t));
    char *made = calloc((size_t)n, 1);
    if (tids == NULL || args == NULL || made == NULL) {
        free(tids);
        free(args);
        free(made);
        for (int64_t i = 0; i < n; i++)
            run_one(w, i);
        return;
    }
    for (int64_t i = 1; i < n; i++) {
        args[i].work = w;
        args[i].index = i;
        made[i] = pthread_create(&tids[i], NULL, thread_main, &args[i]) == 0;
    }
    run_one(w, 0);
    for (int64_t i = 1; i < n; i++) {
        if (made[i])
            pthread_join(tids[i], NULL);
        else
            run_one(w, i);
    }
    free(tids);
    free(args);
    free(made);
}

/* The callback OpenBLAS calls (its openblas_threads_callback type). Always synchronous. */
GEODE_EXPORT void geode_blas_callback(int sync, blas_dojob_fn dojob, int numjobs,
                                      size_t jobdata_elsize, void *jobdata, int dojob_data)
{
    (void)sync; /* OpenBLAS passes 1: wait for the jobs; this always does */
    blas_work_t w = {dojob, (char *)jobdata, jobdata_elsize, dojob_data};
    if (numjobs <= 0)
        return;
    if (geode_pool_run_concurrent(pool_chunk, &w, numjobs)) {
        atomic_fetch_add_explicit(&g_blas_pool_runs, 1, memory_order_relaxed);
        return;
    }
    atomic_fetch_add_explicit(&g_blas_thread_runs, 1, memory_order_relaxed);
    run_on_threads(&w, numjobs);
}

void geode_blas_follow_pool(int64_t n)
{
    blas_set_threads_fn set = atomic_load(&g_set_threads);
    if (set != NULL)
        set((int)n);
}

void geode_blas_share_pool(void (*set_callback)(void *), blas_set_threads_fn set_threads)
{
    atomic_store(&g_set_threads, set_threads);
    set_threads((int)geode_num_threads());
    set_callback((void *)&geode_blas_callback);
}

void geode_blas_stats(uint64_t *pool_runs, uint64_t *thread_runs)
{
    *pool_runs = atomic_load(&g_blas_pool_runs);
    *thread_runs = atomic_load(&g_blas_thread_runs);
}
