/* geode native runtime: thread pool (C ABI used by JIT-compiled kernels). */
#ifndef GEODE_NATIVE_POOL_H
#define GEODE_NATIVE_POOL_H

#include <stdbool.h>
#include <stdint.h>

#define GEODE_EXPORT __attribute__((visibility("default")))

/* Largest pool size (GEODE_NUM_THREADS is clamped to it, set_num_threads refuses more). */
#define GEODE_MAX_THREADS 1024

/* Default spin time (microseconds) of a worker after a job before it sleeps. */
#define GEODE_DEFAULT_SPIN_US 300

/* Longest a participant of a stepped job spins at a step's barrier before it sleeps
   (microseconds; at most the pool's spin time, GEODE_SPIN_US). */
#define GEODE_BARRIER_SPIN_US 50

typedef void (*geode_chunk_fn)(void *ctx, int64_t chunk, int64_t nchunks);
typedef void (*geode_step_fn)(void *ctx, int64_t step, int64_t chunk, int64_t nchunks);

/* Runs fn(ctx, c, nchunks) for every c in [0, nchunks) on up to nthreads threads (<= 0: the
   pool size) and returns when all are done. The caller runs chunks too. A call from inside a
   job, or while another thread's job holds the pool, runs serially on the caller. */
GEODE_EXPORT void geode_parallel_for(geode_chunk_fn fn, void *ctx, int64_t nchunks,
                                     int64_t nthreads);

/* Runs fn(ctx, s, c, nchunks) for every step s in [0, nsteps) and chunk c in [0, nchunks) as
   ONE job of the pool: every chunk of step s returns before any chunk of step s + 1 starts (a
   barrier between steps, inside the job: no launch per step). A participant takes the same
   range of chunks at every step (stealing single chunks once its own are done). Falls back
   like geode_parallel_for (inline when nested, busy pool, one thread or one chunk). */
GEODE_EXPORT void geode_parallel_steps(geode_step_fn fn, void *ctx, int64_t nsteps,
                                       int64_t nchunks, int64_t nthreads);

/* The pool size (threads of a job, the caller included). */
GEODE_EXPORT int64_t geode_num_threads(void);

/* Chunks per thread of a launch (the LLVM backend's CHUNKS_PER_THREAD). */
#define GEODE_CHUNKS_PER_THREAD 32

/* A generated kernel's parallel loop of ext iterations (the LLVM backend's geode.launch):
   nothing when ext < 1; fn(ctx, 0, 1) on the caller when small, or when one thread (threads
   <= 0: the pool size) or one chunk would run it; else geode_parallel_for of
   min(ext, GEODE_CHUNKS_PER_THREAD * threads) chunks. */
GEODE_EXPORT void geode_launch(geode_chunk_fn fn, void *ctx, int64_t ext, int64_t threads,
                               bool small);

/* Runs fn(ctx, c, n) for every c in [0, n) on n concurrent threads (the caller included),
   waiting for the pool if another thread's job holds it. Returns 0 without running anything
   when n concurrent threads cannot be promised (nested call, pool smaller than n). */
int geode_pool_run_concurrent(geode_chunk_fn fn, void *ctx, int64_t n);

/* blas_threads.c: OpenBLAS's thread count follows the pool size once shared (no-op before). */
void geode_blas_follow_pool(int64_t n);

/* blas_threads.c: route OpenBLAS's parallel work to the pool (set_callback is OpenBLAS's
   openblas_set_threads_callback_function, set_threads its openblas_set_num_threads). */
void geode_blas_share_pool(void (*set_callback)(void *), void (*set_threads)(int));
void geode_blas_stats(uint64_t *pool_runs, uint64_t *thread_runs);

/* scratch.c: a per-thread buffer for slot `slot` (0..3) of at least `bytes` bytes, 64-byte
   aligned, kept for the thread's next call (NULL when out of memory). */
GEODE_EXPORT void *geode_scratch(int64_t slot, int64_t bytes);
void geode_scratch_release(void);  /* frees the calling thread's buffers */
int64_t geode_scratch_held(void);  /* bytes held by every thread's buffers */

/* gemm.c: C = A @ B + beta C, split into independent blocks over the pool (see gemm.c). */
GEODE_EXPORT void geode_gemm(int64_t kind, int64_t m, int64_t n, int64_t k, const void *a,
                             int64_t lda, const void *b, int64_t ldb, double beta, void *c,
                             int64_t ldc, int64_t threads);
void geode_gemm_configure(void *sgemm, void *dgemm, int bits, void *set_threads,
                          void *get_threads);
uint64_t geode_gemm_split_calls(void);
uint64_t geode_gemm_thin_calls(void); /* products computed with geode's own kernel */
int geode_sgemm_thin_ok(void);        /* sgemm_thin.c: 1 when the CPU can run it */
uint64_t geode_gemm_wide_calls(void); /* products computed with geode_sgemm_wide */
int geode_sgemm_wide_ok(void);        /* sgemm_packed.c: 1 when its tiles are AVX-512 */
int geode_gemm_wide_on(void);         /* 1 when geode_gemm takes geode_sgemm_wide */
int geode_gemm_set_wide(int on);      /* test hook: returns the previous setting */

/* sgemm_packed.c: C = alpha A @ B + beta C against B packed once (geode_sgemm_pack: panels
   of 16 columns, K contiguous per panel; trans: B^T given, N x K), split over the pool. */
GEODE_EXPORT void geode_sgemm_pack(int64_t k, int64_t n, const float *b, int64_t ldb,
                                   int64_t trans, float *out);
GEODE_EXPORT void geode_sgemm_packed(int64_t m, int64_t n, int64_t k, float alpha,
                                     const float *a, int64_t lda, const float *bp, float beta,
                                     float *c, int64_t ldc, int64_t threads);
GEODE_EXPORT void geode_sgemm_packed_bias(int64_t m, int64_t n, int64_t k, float alpha,
                                          const float *a, int64_t lda, const float *bp,
                                          const float *bias, float beta, float *c, int64_t ldc,
                                          int64_t threads);
GEODE_EXPORT void geode_sgemm_packed_at(int64_t m, int64_t n, int64_t k, float alpha,
                                        const float *a, int64_t lda, int64_t ka, int64_t a_rows,
                                        int64_t a_bstride, int64_t row0, const float *bp,
                                        const float *bias, float beta, float *c, int64_t ldc,
                                        int64_t threads);
int geode_sgemm_packed_isa(void);      /* the path in use: 0 plain C, 1 AVX2, 2 AVX-512 */
int geode_sgemm_packed_best_isa(void); /* the best path this CPU runs */
int geode_sgemm_packed_set_isa(int isa); /* test hook (see sgemm_packed.c) */
uint64_t geode_sgemm_packed_calls(void);

/* winograd.c: Y = act(conv3x3(X, W) + bias + Z) by Winograd F(tile x tile, 3x3), W given
   as its transform U ([(tile + 2)^2][m][c]); returns 1 when out of memory (winograd.c). */
GEODE_EXPORT int32_t geode_conv_winograd(const float *x, const float *u, const float *bias,
                                         const float *z, float *y, int64_t n, int64_t c,
                                         int64_t m, int64_t h, int64_t w, int64_t oh,
                                         int64_t ow, int64_t pt, int64_t pl, int64_t relu,
                                         int64_t tile, int64_t threads);
int geode_winograd_isa(void);        /* the path in use: 0 plain C, 1 AVX2, 2 AVX-512VL */
int geode_winograd_set_isa(int isa); /* test hook (see winograd.c) */

/* Internal API for the Python module. */
typedef struct {
    int64_t threads;
    int64_t spin_us;
    int64_t workers_running;
    uint64_t launches;
    uint64_t inline_runs;
    uint64_t stepped_launches; /* geode_parallel_steps jobs run on the pool */
    uint64_t barrier_sleeps;   /* barrier waits that went to sleep (the spin ran out) */
} geode_pool_stats;

void geode_pool_init(void);                /* registers the fork handlers (once) */
int geode_pool_in_job(void);               /* nonzero on a thread that runs a job */
void geode_pool_resize(int64_t n);         /* waits for the pool, stops workers, sets size */
void geode_pool_get_stats(geode_pool_stats *out);
int64_t geode_pool_set_max_slot_chunks(int64_t n); /* test hook; returns the old limit */

#endif
