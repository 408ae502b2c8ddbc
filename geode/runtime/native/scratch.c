/* geode native runtime: per-thread scratch buffers for JIT-compiled kernels.

   A GEMM with a fused epilogue needs a panel of the product (and one of the epilogue's
   result) for every call. Allocated and freed per call, a large panel comes back from the
   kernel as fresh pages (mmap), and touching them costs more than the arithmetic saved
   (measured: docs/performance.md). So each thread keeps its buffers, one per slot, grown
   to the largest size asked for, 64-byte aligned; a thread's buffers are freed when it
   exits (pool workers stop on a resize), or when it calls geode_scratch_release. Slots 0-3
   are JIT code's (dense.py, winograd.c); slot 4 is geode_sgemm_wide's strip of B, which
   runs inside their GEMMs. */

#define _GNU_SOURCE
#include "pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#define SLOTS 5
#define ALIGN 64

typedef struct {
    void *ptr[SLOTS];
    int64_t cap[SLOTS];
} scratch_t;

static pthread_key_t g_key;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static atomic_llong g_held;

static void release(void *arg)
{
    scratch_t *s = arg;
    if (s == NULL)
        return;
    for (int i = 0; i < SLOTS; i++) {
        free(s->ptr[i]);
        atomic_fetch_sub(&g_held, s->cap[i]);
    }
    free(s);
}

static void make_key(void)
{
    pthread_key_create(&g_key, release);
}

GEODE_EXPORT void *geode_scratch(int64_t slot, int64_t bytes)
{
    if (slot < 0 || slot >= SLOTS || bytes < 0)
        return NULL;
    pthread_once(&g_once, make_key);
    scratch_t *s = pthread_getspecific(g_key);
    if (s == NULL) {
        s = calloc(1, sizeof(scratch_t));
        if (s == NULL || pthread_setspecific(g_key, s) != 0) {
            free(s);
            return NULL;
        }
    }
    if (s->cap[slot] >= bytes && s->ptr[slot] != NULL)
        return s->ptr[slot];
    int64_t want = bytes < ALIGN ? ALIGN : (bytes + ALIGN - 1) / ALIGN * ALIGN;
    void *mem = NULL;
    if (posix_memalign(&mem, ALIGN, (size_t)want) != 0)
        return NULL;
    free(s->ptr[slot]);
    atomic_fetch_add(&g_held, want - s->cap[slot]);
    s->ptr[slot] = mem;
    s->cap[slot] = want;
    return mem;
}

void geode_scratch_release(void)
{
    pthread_once(&g_once, make_key);
    scratch_t *s = pthread_getspecific(g_key);
    if (s != NULL) {
        pthread_setspecific(g_key, NULL);
        release(s);
    }
}

int64_t geode_scratch_held(void)
{
    return atomic_load(&g_held);
}
