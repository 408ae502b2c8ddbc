/* geode native runtime: GEMMs partitioned over the pool, without barriers.

   OpenBLAS threads a large GEMM as jobs that wait on each other (they share packed blocks).
   Such jobs must all run at once: when a core is busy with another process, or a worker
   sleeps after idling, every job waits for the late one (measured: tens of milliseconds per
   call on a shared 2-core machine, against a fraction of a millisecond). geode_gemm instead
   splits C into independent blocks (columns when C is wide, rows when it is tall: the
   operand each block re-packs is the smaller one) and runs them through
   geode_parallel_for: work stealing, so a late worker's blocks are taken by the others and
   nothing waits. Each block is one single-threaded BLAS call: while any geode_gemm runs,
   OpenBLAS's thread count is 1 (restored to what it was after the last one; a numpy matmul
   in another thread meanwhile runs single-threaded, and right).

   A float32 product too small for such blocks (under 4M multiply-adds) would be one
   single-threaded BLAS call while the other cores idle: it is split instead with geode's
   own kernel (sgemm_thin.c), whose blocks may be any size (every element is summed alike),
   and a GEMV (one row) always takes that kernel, split or not (it streams B faster than
   the BLAS's GEMV).

   Where the packed kernel's tiles are AVX-512 (sgemm_packed.c), float32 products of 3 rows
   or more with K up to 1024 (B or B^T given) take its geode_sgemm_wide instead of the BLAS
   or the thin kernel (AVX2):
   OpenBLAS runs its AVX2 kernels on AMD's AVX-512 CPUs (Zen 4, Zen 5), at half the speed
   (docs/performance.md, "geode_gemm on the packed kernel"). Every element is one fused
   multiply-add chain in k order there too, so its blocks may be any size and a product
   gives the same bits on any thread count. */

#define _GNU_SOURCE
#include "pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

typedef void (*sgemm64_fn)(int, int, int, int64_t, int64_t, int64_t, float, const float *,
                           int64_t, const float *, int64_t, float, float *, int64_t);
typedef void (*dgemm64_fn)(int, int, int, int64_t, int64_t, int64_t, double, const double *,
                           int64_t, const double *, int64_t, double, double *, int64_t);
typedef void (*sgemm32_fn)(int, int, int, int, int, int, float, const float *, int,
                           const float *, int, float, float *, int);
typedef void (*dgemm32_fn)(int, int, int, int, int, int, double, const double *, int,
                           const double *, int, double, double *, int);
typedef void (*set_threads_fn)(int);
typedef int (*get_threads_fn)(void);

static void *g_gemm[2];
static int g_bits = 64;
static set_threads_fn g_set_threads;
static get_threads_fn g_get_threads;
static int g_saved_threads = 1;
static pthread_mutex_t g_single_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_single_depth;
static atomic_ullong g_split_calls;

/* Every block has at least this many multiply-adds: splitting a smaller GEMM costs more
   than it saves, and OpenBLAS computes GEMMs below about 10^6 multiply-adds with another
   kernel (its small-matrix path), whose edge columns round differently: a block under that
   size would give a row of the product columns rounded unlike its neighbours (equal logits
   would no longer be equal). */
#define BLOCK_MIN_WORK (1 << 20)
/* Blocks per thread: enough for stealing to even out a late or slow thread. */
#define BLOCKS_PER_THREAD 4

/* `blocks` even blocks on `t` threads: a multiple of t when there are too few for stealing
   to even them out (3 blocks on 2 threads take as long as 4, the last one alone). */
static int64_t balanced(int64_t blocks, int64_t t)
{
    if (t > 1 && blocks > t && blocks < t * BLOCKS_PER_THREAD)
        blocks -= blocks % t;
    return blocks;
}

/* Blocks for `t` threads: BLOCKS_PER_THREAD each, but none under `min_work` multiply-adds
   of the product's `work` and at most `most`. */
static int64_t capped_blocks(int64_t t, double work, double min_work, int64_t most)
{
    int64_t blocks = t * BLOCKS_PER_THREAD;
    if ((double)blocks > work / min_work)
        blocks = (int64_t)(work / min_work);
    return blocks > most ? most : blocks;
}

typedef struct {
    int kind; /* 0: float32, 1: float64 */
    int trans_b; /* B is stored transposed: element (k, j) at b[j * ldb + k] */
    int64_t m, n, k, lda, ldb, ldc;
    const char *a, *b;
    char *c;
    double beta;
    int by_cols;
    int64_t align; /* block edges are multiples of it (the last block ends at the edge) */
} gemm_t;

/* The product with plain loops: only when no BLAS was configured (a compile or a model
   load configures numpy's first, so only a direct call of the runtime gets here). */
static void plain_product(const gemm_t *g, int64_t m, int64_t n, const char *a, const char *b,
                          char *c)
{
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double sum = 0.0;
            for (int64_t p = 0; p < g->k; p++) {
                int64_t bi = g->trans_b ? j * g->ldb + p : p * g->ldb + j;
                sum += g->kind == 0 ? (double)((const float *)a)[i * g->lda + p] *
                                          (double)((const float *)b)[bi]
                                    : ((const double *)a)[i * g->lda + p] *
                                          ((const double *)b)[bi];
            }
            if (g->kind == 0) {
                float *out = (float *)c + i * g->ldc + j;
                *out = (float)(sum + (g->beta != 0.0 ? (double)*out : 0.0));
            } else {
                double *out = (double *)c + i * g->ldc + j;
                *out = sum + (g->beta != 0.0 ? *out : 0.0);
            }
        }
}

static void one_call(const gemm_t *g, int64_t m, int64_t n, const char *a, const char *b,
                     char *c)
{
    const int rm = 101, nt = 111, tb = g->trans_b ? 112 : 111;
    if (g_gemm[g->kind] == NULL) {
        plain_product(g, m, n, a, b, c);
        return;
    }
    if (g->kind == 0) {
        if (g_bits == 64)
            ((sgemm64_fn)g_gemm[0])(rm, nt, tb, m, n, g->k, 1.0f, (const float *)a, g->lda,
                                    (const float *)b, g->ldb, (float)g->beta, (float *)c, g->ldc);
        else
            ((sgemm32_fn)g_gemm[0])(rm, nt, tb, (int)m, (int)n, (int)g->k, 1.0f,
                                    (const float *)a, (int)g->lda, (const float *)b,
                                    (int)g->ldb, (float)g->beta, (float *)c, (int)g->ldc);
    } else {
        if (g_bits == 64)
            ((dgemm64_fn)g_gemm[1])(rm, nt, tb, m, n, g->k, 1.0, (const double *)a, g->lda,
                                    (const double *)b, g->ldb, g->beta, (double *)c, g->ldc);
        else
            ((dgemm32_fn)g_gemm[1])(rm, nt, tb, (int)m, (int)n, (int)g->k, 1.0,
                                    (const double *)a, (int)g->lda, (const double *)b,
                                    (int)g->ldb, g->beta, (double *)c, (int)g->ldc);
    }
}

/* Block `chunk` of `nchunks` even blocks: [edge(chunk), edge(chunk + 1)). */
static int64_t edge(const gemm_t *g, int64_t chunk, int64_t nchunks)
{
    int64_t dim = g->by_cols ? g->n : g->m;
    if (chunk >= nchunks)
        return dim;
    return dim * chunk / nchunks / g->align * g->align;
}

static void block_fn(void *ctx, int64_t chunk, int64_t nchunks)
{
    const gemm_t *g = ctx;
    const int64_t item = g->kind == 0 ? 4 : 8;
    int64_t lo = edge(g, chunk, nchunks), hi = edge(g, chunk + 1, nchunks);
    if (hi <= lo)
        return;
    if (g->by_cols)
        one_call(g, g->m, hi - lo, g->a, g->b + lo * (g->trans_b ? g->ldb : 1) * item,
                 g->c + lo * item);
    else
        one_call(g, hi - lo, g->n, g->a + lo * g->lda * item, g->b, g->c + lo * g->ldc * item);
}

static int wide_takes(const gemm_t *g);

/* geode's own float32 kernel (sgemm_thin.c) for the products the BLAS cannot split */
void geode_sgemm_thin(int64_t m, int64_t j0, int64_t j1, int64_t k, const float *a,
                      int64_t lda, const float *b, int64_t ldb, int add, float *c, int64_t ldc);
static atomic_ullong g_thin_calls;
static atomic_int g_thin = -1; /* -1: not yet asked, else geode_sgemm_thin_ok() */

/* A thin product's blocks have at least this many multiply-adds (the pool's launch, a few
   microseconds, is then a small part of a block), and are at least THIN_ALIGN columns or
   4 rows. Products smaller than two such blocks stay one BLAS call. */
#define THIN_BLOCK_MIN_WORK (1 << 15)
#define THIN_ALIGN 32
/* One thread computes a product the kernel would split on two with the kernel too (the
   same bits on any thread count) when it has at most this many rows or this K (the
   kernel's packed strips): there it is as fast as the BLAS or faster; a product of more
   rows with a longer K takes the BLAS on one thread (1.6x faster at 16 x 2048 x 512). */
#define THIN_SERIAL_MAX_ROWS 4
#define THIN_SERIAL_MAX_K 512

/* A block's product, rows [0, m) by columns [j0, j1) of A's rows from `a` into `c`. */
typedef void (*block_run_fn)(const gemm_t *g, int64_t m, int64_t j0, int64_t j1, const float *a,
                             float *c);

/* Block `chunk` of `nchunks` of a float32 product by `run`: a range of columns or of rows. */
static void float_block(const gemm_t *g, int64_t chunk, int64_t nchunks, block_run_fn run)
{
    int64_t lo = edge(g, chunk, nchunks), hi = edge(g, chunk + 1, nchunks);
    if (hi <= lo)
        return;
    const float *a = (const float *)g->a;
    float *c = (float *)g->c;
    if (g->by_cols)
        run(g, g->m, lo, hi, a, c);
    else
        run(g, hi - lo, 0, g->n, a + lo * g->lda, c + lo * g->ldc);
}

static void thin_run(const gemm_t *g, int64_t m, int64_t j0, int64_t j1, const float *a, float *c)
{
    geode_sgemm_thin(m, j0, j1, g->k, a, g->lda, (const float *)g->b, g->ldb, g->beta != 0.0, c,
                     g->ldc);
}

static void thin_block_fn(void *ctx, int64_t chunk, int64_t nchunks)
{
    float_block(ctx, chunk, nchunks, thin_run);
}

/* A float32 product with geode's own kernel: when the BLAS would compute it in one call
   (`blas_split` 0; `blas_splits`: whether it would split it on two threads) and it makes
   two blocks, split over `t` threads, or computed as one block on one thread (or inside a
   job) within THIN_SERIAL_MAX_ROWS / _K, so such a product takes the same kernel, hence
   the same bits, on any thread count; or (one row, at least a block's work) serially: the
   kernel streams B faster than the BLAS's GEMV when B is not in the L2 cache, and a split
   GEMV is one anyway. Returns 0 when the BLAS should. */
static int thin_path(const gemm_t *g0, int64_t t, double work, int blas_split, int blas_splits,
                     int in_job)
{
    if (g0->kind != 0 || g0->trans_b || work < THIN_BLOCK_MIN_WORK || wide_takes(g0))
        return 0;
    if (atomic_load_explicit(&g_thin, memory_order_relaxed) < 0)
        atomic_store_explicit(&g_thin, geode_sgemm_thin_ok(), memory_order_relaxed);
    if (!atomic_load_explicit(&g_thin, memory_order_relaxed) || (blas_split && g0->m > 1))
        return 0;
    gemm_t copy = *g0, *g = &copy;
    g->by_cols = g->m == 1 || g->n / THIN_ALIGN >= g->m / 4;
    g->align = g->by_cols ? THIN_ALIGN : 4;
    int64_t dim = g->by_cols ? g->n : g->m;
    int64_t blocks = capped_blocks(t, work, THIN_BLOCK_MIN_WORK, dim / g->align);
    /* two blocks or more on two threads, decided without `t`: then the kernel, not the
       BLAS, on one thread too where it is as fast (a few rows, or B's strips packed) */
    int splits = !(blas_splits && g->m > 1) && work >= 2 * THIN_BLOCK_MIN_WORK &&
                 dim / g->align >= 2 &&
                 (g->m <= THIN_SERIAL_MAX_ROWS || g->k <= THIN_SERIAL_MAX_K);
    blocks = balanced(blocks, t);
    if (t > 1 && blocks >= 2 && !in_job) {
        atomic_fetch_add_explicit(&g_thin_calls, 1, memory_order_relaxed);
        geode_parallel_for(thin_block_fn, g, blocks, t);
        return 1;
    }
    if (g->m != 1 && !splits)
        return 0;
    atomic_fetch_add_explicit(&g_thin_calls, 1, memory_order_relaxed);
    thin_block_fn(g, 0, 1);
    return 1;
}

/* geode's packed kernel with B packed per call (sgemm_packed.c: geode_sgemm_wide) for the
   float32 products the BLAS would compute, where its tiles are AVX-512 (OpenBLAS runs its
   AVX2 kernels on AMD's AVX-512 CPUs: half the speed, docs/performance.md). */
void geode_sgemm_wide(int64_t m, int64_t j0, int64_t j1, int64_t k, const float *a,
                      int64_t lda, const float *b, int64_t ldb, int trans, int add, float *c,
                      int64_t ldc);
static atomic_ullong g_wide_calls;
static atomic_int g_wide_set = 1; /* _set_gemm_wide */

/* 1 when float32 products take geode_sgemm_wide */
int geode_gemm_wide_on(void)
{
    return atomic_load_explicit(&g_wide_set, memory_order_relaxed) && geode_sgemm_wide_ok();
}

/* Test hook: on 0 keeps float32 products on the BLAS. Returns the previous setting. */
int geode_gemm_set_wide(int on)
{
    return atomic_exchange_explicit(&g_wide_set, on != 0, memory_order_relaxed);
}

/* K up to this (geode_sgemm_wide's strip buffer) */
#define WIDE_MAX_K 1024
/* columns of a wide block (a multiple of the kernel's strip of 32) or rows (its tile) */
#define WIDE_COLS 32
#define WIDE_ROWS 8

static void wide_run(const gemm_t *g, int64_t m, int64_t j0, int64_t j1, const float *a, float *c)
{
    geode_sgemm_wide(m, j0, j1, g->k, a, g->lda, (const float *)g->b, g->ldb, g->trans_b,
                     g->beta != 0.0, c, g->ldc);
}

static void wide_block_fn(void *ctx, int64_t chunk, int64_t nchunks)
{
    float_block(ctx, chunk, nchunks, wide_run);
}

/* 1 when geode_sgemm_wide computes this product: float32, K <= WIDE_MAX_K, 3 rows or more
   (B or B^T given), its tiles AVX-512 and not switched off. */
static int wide_takes(const gemm_t *g)
{
    return g->kind == 0 && g->k <= WIDE_MAX_K && g->m >= 3 && geode_gemm_wide_on();
}

/* The product with geode_sgemm_wide when wide_takes: split over `t` threads into blocks of
   any size (every element is summed alike), or on the calling thread inside a pool job.
   Returns 0 when the BLAS (or the thin kernel) should compute it. */
static int wide_path(const gemm_t *g0, int64_t t, double work, int in_job)
{
    if (!wide_takes(g0))
        return 0;
    gemm_t copy = *g0, *g = &copy;
    g->by_cols = g->n / WIDE_COLS >= g->m / WIDE_ROWS;
    g->align = g->by_cols ? WIDE_COLS : WIDE_ROWS;
    int64_t dim = g->by_cols ? g->n : g->m;
    int64_t blocks = capped_blocks(t, work, THIN_BLOCK_MIN_WORK, dim / g->align);
    blocks = balanced(blocks, t);
    atomic_fetch_add_explicit(&g_wide_calls, 1, memory_order_relaxed);
    if (t > 1 && blocks >= 2 && !in_job)
        geode_parallel_for(wide_block_fn, g, blocks, t);
    else
        wide_block_fn(g, 0, 1);
    return 1;
}

static void single_enter(void)
{
    pthread_mutex_lock(&g_single_lock);
    if (g_single_depth++ == 0) {
        g_saved_threads = g_get_threads != NULL ? g_get_threads() : (int)geode_num_threads();
        g_set_threads(1);
    }
    pthread_mutex_unlock(&g_single_lock);
}

static void single_exit(void)
{
    pthread_mutex_lock(&g_single_lock);
    if (--g_single_depth == 0)
        g_set_threads(g_saved_threads);
    pthread_mutex_unlock(&g_single_lock);
}

/* C[m x n] = A[m x k] @ B[k x n] + beta C (row-major, leading dims in elements; beta 0 or
   1). kind 0: float32, 1: float64; plus 2: B is stored transposed (B^T row-major [n x k],
   leading dim ldb: attention's K read in place; never through sgemm_thin.c's kernel, but
   through geode_sgemm_wide where it takes float32 products).
   threads <= 0: the pool's size. k = 0 scales C by beta. */
GEODE_EXPORT void geode_gemm(int64_t kind, int64_t m, int64_t n, int64_t k, const void *a,
                             int64_t lda, const void *b, int64_t ldb, double beta, void *c,
                             int64_t ldc, int64_t threads)
{
    const int trans_b = (int)((kind >> 1) & 1);
    kind &= 1;
    const int64_t item = kind == 0 ? 4 : 8;
    if (m <= 0 || n <= 0)
        return;
    if (k <= 0) {
        if (beta == 0.0)
            for (int64_t i = 0; i < m; i++)
                memset((char *)c + i * ldc * item, 0, (size_t)(n * item));
        return;
    }
    gemm_t g = {(int)kind, trans_b, m, n, k, lda, ldb, ldc, a, b, c, beta, m <= n,
                m <= n ? 16 : 4};
    int64_t t = threads > 0 ? threads : geode_num_threads();
    double work = (double)m * (double)n * (double)k;
    int64_t dim = g.by_cols ? n : m;
    /* even blocks of at least 2 x BLOCK_MIN_WORK (so alignment cannot take one under it) */
    int64_t blocks = capped_blocks(t, work, 2.0 * BLOCK_MIN_WORK, dim / g.align);
    blocks = balanced(blocks, t);
    int in_job = geode_pool_in_job();
    int blas_split = g_set_threads != NULL && t > 1 && blocks >= 2 && !in_job;
    /* whether the BLAS splits it on two threads (blocks >= 2 there), decided without `t` */
    int blas_splits = g_set_threads != NULL && work >= 4.0 * BLOCK_MIN_WORK && dim / g.align >= 2;
    if (thin_path(&g, t, work, blas_split, blas_splits, in_job) || wide_path(&g, t, work, in_job))
        return;
    if (!blas_split) {
        if (g_set_threads != NULL)
            single_enter();
        one_call(&g, m, n, a, b, c);
        if (g_set_threads != NULL)
            single_exit();
        return;
    }
    atomic_fetch_add_explicit(&g_split_calls, 1, memory_order_relaxed);
    single_enter();
    geode_parallel_for(block_fn, &g, blocks, t);
    single_exit();
}

void geode_gemm_configure(void *sgemm, void *dgemm, int bits, void *set_threads,
                          void *get_threads)
{
    g_gemm[0] = sgemm;
    g_gemm[1] = dgemm;
    g_bits = bits;
    g_set_threads = (set_threads_fn)set_threads;
    g_get_threads = (get_threads_fn)get_threads;
}

uint64_t geode_gemm_split_calls(void)
{
    return atomic_load(&g_split_calls);
}

uint64_t geode_gemm_thin_calls(void)
{
    return atomic_load(&g_thin_calls);
}

uint64_t geode_gemm_wide_calls(void)
{
    return atomic_load(&g_wide_calls);
}
