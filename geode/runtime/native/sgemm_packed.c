/* geode native runtime: a float32 GEMM against a weight packed once (B constant).

   OpenBLAS packs B into its kernel's layout on every call; for a model's weights, which
   never change, geode packs them once when the model is compiled or loaded
   (geode_sgemm_pack) and multiplies by the packed copy (geode_sgemm_packed).

   Packed layout: B (K x N) as ceil(N / 16) column panels of 16 floats, each panel K rows
   of 16 contiguous floats (panel p holds columns 16p .. 16p + 15, row after row), the
   columns past N zero. Panel p starts at p * K * 16. geode_sgemm_pack also reads B
   transposed (B^T stored N x K, Gemm's transB).

   Every element is c[i][j] = sum over k in order of a[i][k] * b[k][j], one fused
   multiply-add per term from zero (the plain C path: a multiply then an add), then
   times alpha when alpha is not 1, then plus the column's bias when one is given
   (geode_sgemm_packed_bias: a Linear layer's bias), then plus beta * c when beta is not 0
   (a residual: the bits of adding the bias, then C, after the product). So an element's
   value does not depend on the tile or the block it falls in: the product is split over
   the pool by column panels (few rows) or row blocks (many rows), and gives the same bits
   on any thread count; the AVX-512 and AVX2 paths give the same bits too.

   Register tiles: AVX-512F, up to 8 rows x 2 panels (16 accumulators of 16 floats), fewer
   rows over more panels (a row alone, 8 panels: a GEMV is then not bound by the latency of
   one chain of multiply-adds); AVX2 + FMA, up to 6 rows x 1 panel (12 accumulators of 8
   floats), 3 rows x 2, 1 row x 4; plain C, up to 4 rows x 1 panel. Columns past N in the last panel are computed (on zeros) and not
   stored. Loops: a block of panels that the L2 cache holds outermost, then row tiles,
   then the block's panels, so a row tile of A is read from L1 for all of them. K blocks
   (A packed per block, C accumulated across them), 12-row tiles and more row blocks per
   thread were measured against this and not kept (docs/performance.md, "Weights packed
   once").

   geode_sgemm_wide multiplies by a B not packed beforehand (geode_gemm's float32 products
   on AVX-512 CPUs): B packed a strip of two panels at a time into the calling thread's
   scratch (scratch.c, slot WIDE_SLOT: a caller with a small stack is safe), then the same
   tiles over all rows, so the same bits; without that buffer (out of memory) every element
   is summed straight from B in the same order (slow, the same bits). */

#define _GNU_SOURCE
#pragma GCC optimize("O3")
#include "pool.h"

#include <immintrin.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NR 16
#define INLINE static inline __attribute__((always_inline))
#define T512 __attribute__((target("avx512f,avx2,fma")))
#define T256 __attribute__((target("avx2,fma")))

/* What a tile writes: c = acc (* alpha) (+ beta * c). */
typedef struct {
    float alpha, beta;
} scale_t;

/* a: the tile's first row of A, row r at a + r lda, element p of a row at + p ka (1, or A's
   rows when A is read transposed); bias: NULL, or the bias of the tile's first column (a
   tile reads its columns of it) */
typedef void (*tile_fn)(const float *a, int64_t lda, int64_t ka, const float *bp, int64_t k, float *c,
                        int64_t ldc, int64_t last, const scale_t *s, const float *bias);

/* ---------------------------------------------------------------- AVX-512F */

#define MR512 8

T512 INLINE __m512 finish512(__m512 x, const float *out, __mmask16 m, const scale_t *s,
                             const float *bias)
{
    if (s->alpha != 1.0f)
        x = _mm512_mul_ps(x, _mm512_set1_ps(s->alpha));
    if (bias != NULL)
        x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(m, bias));
    if (s->beta != 0.0f) {
        __m512 old = _mm512_maskz_loadu_ps(m, out);
        if (s->beta != 1.0f)
            old = _mm512_mul_ps(old, _mm512_set1_ps(s->beta));
        x = _mm512_add_ps(x, old);
    }
    return x;
}

/* R rows x V panels; `last` columns (1..16) of the last panel are stored. */
T512 INLINE void tile512(int R, int V, const float *a, int64_t lda, int64_t ka, const float *bp, int64_t k,
                         float *c, int64_t ldc, int64_t last, const scale_t *s,
                         const float *bias)
{
    __m512 acc[MR512][8];
    const int64_t ps = k * NR;
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int v = 0; v < V; v++)
            acc[r][v] = _mm512_setzero_ps();
    for (int64_t p = 0; p < k; p++) {
        __m512 bv[8];
#pragma GCC unroll 8
        for (int v = 0; v < V; v++)
            bv[v] = _mm512_loadu_ps(bp + v * ps + p * NR);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m512 av = _mm512_set1_ps(a[r * lda + p * ka]);
#pragma GCC unroll 8
            for (int v = 0; v < V; v++)
                acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
        }
    }
    const __mmask16 full = 0xFFFF, tail = (__mmask16)((1u << last) - 1u);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int v = 0; v < V; v++) {
            float *out = c + r * ldc + v * NR;
            __mmask16 m = v == V - 1 ? tail : full;
            const float *bv = bias != NULL ? bias + v * NR : NULL;
            _mm512_mask_storeu_ps(out, m, finish512(acc[r][v], out, m, s, bv));
        }
}

#define W512(R, V)                                                                          \
    T512 static void t512_##R##_##V(const float *a, int64_t lda, int64_t ka, const float *bp, int64_t k, \
                                    float *c, int64_t ldc, int64_t last, const scale_t *s,  \
                                    const float *bias)                                      \
    {                                                                                       \
        tile512(R, V, a, lda, ka, bp, k, c, ldc, last, s, bias);                            \
    }
#define W512_ROWS(V)                                                                        \
    W512(1, V) W512(2, V) W512(3, V) W512(4, V) W512(5, V) W512(6, V) W512(7, V) W512(8, V)
W512_ROWS(1) W512_ROWS(2) W512(1, 3) W512(2, 3) W512(3, 3) W512(4, 3) W512(1, 4) W512(2, 4)
W512(3, 4) W512(4, 4) W512(1, 5) W512(2, 5) W512(1, 6) W512(2, 6) W512(1, 7) W512(2, 7)
W512(1, 8) W512(2, 8)

/* Tiles by panels (1..8) and rows: 8 rows take up to 2 panels, 4 rows 4, 2 rows 8 (at
   most 16 accumulators, and at least 4 independent ones for a single row). */
#define ROWS8(V)                                                                            \
    {0, t512_1_##V, t512_2_##V, t512_3_##V, t512_4_##V, t512_5_##V, t512_6_##V, t512_7_##V, \
     t512_8_##V}
#define ROWS4(V) {0, t512_1_##V, t512_2_##V, t512_3_##V, t512_4_##V}
#define ROWS2(V) {0, t512_1_##V, t512_2_##V}
static const tile_fn g_t512[9][MR512 + 1] = {
    {0},      ROWS8(1), ROWS8(2), ROWS4(3), ROWS4(4),
    ROWS2(5), ROWS2(6), ROWS2(7), ROWS2(8),
};

/* Panels a tile of `rows` rows takes at most. */
static int panels512(int rows)
{
    return rows <= 2 ? 8 : rows <= 4 ? 4 : 2;
}

/* ---------------------------------------------------------------- AVX2 + FMA */

#define MR256 6

static const int32_t g_mask_words[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};

T256 INLINE __m256 finish256(__m256 x, const float *out, __m256i m, const scale_t *s,
                             const float *bias)
{
    if (s->alpha != 1.0f)
        x = _mm256_mul_ps(x, _mm256_set1_ps(s->alpha));
    if (bias != NULL)
        x = _mm256_add_ps(x, _mm256_maskload_ps(bias, m));
    if (s->beta != 0.0f) {
        __m256 old = _mm256_maskload_ps(out, m);
        if (s->beta != 1.0f)
            old = _mm256_mul_ps(old, _mm256_set1_ps(s->beta));
        x = _mm256_add_ps(x, old);
    }
    return x;
}

/* R rows x V panels (two vectors of 8 each); `last` columns (1..16) of the last panel
   stored. */
T256 INLINE void tile256(int R, int V, const float *a, int64_t lda, int64_t ka, const float *bp, int64_t k,
                         float *c, int64_t ldc, int64_t last, const scale_t *s,
                         const float *bias)
{
    __m256 acc[MR256][8];
    const int64_t ps = k * NR;
#pragma GCC unroll 6
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int v = 0; v < 2 * V; v++)
            acc[r][v] = _mm256_setzero_ps();
    for (int64_t p = 0; p < k; p++) {
        __m256 bv[8];
#pragma GCC unroll 8
        for (int v = 0; v < 2 * V; v++)
            bv[v] = _mm256_loadu_ps(bp + (v / 2) * ps + p * NR + 8 * (v % 2));
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            __m256 av = _mm256_broadcast_ss(a + r * lda + p * ka);
#pragma GCC unroll 8
            for (int v = 0; v < 2 * V; v++)
                acc[r][v] = _mm256_fmadd_ps(av, bv[v], acc[r][v]);
        }
    }
    const int64_t lo = last < 8 ? last : 8, hi = last > 8 ? last - 8 : 0;
    const __m256i ones = _mm256_set1_epi32(-1);
    const __m256i m0 = _mm256_loadu_si256((const __m256i *)(g_mask_words + 8 - lo));
    const __m256i m1 = _mm256_loadu_si256((const __m256i *)(g_mask_words + 8 - hi));
#pragma GCC unroll 6
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int v = 0; v < 2 * V; v++) {
            float *out = c + r * ldc + 8 * v;
            const int tail = v >= 2 * V - 2;
            const __m256i m = !tail ? ones : v % 2 == 0 ? m0 : m1;
            if (tail && v % 2 == 1 && hi == 0)
                continue;
            const float *bv = bias != NULL ? bias + 8 * v : NULL;
            _mm256_maskstore_ps(out, m, finish256(acc[r][v], out, m, s, bv));
        }
}

#define W256(R, V)                                                                          \
    T256 static void t256_##R##_##V(const float *a, int64_t lda, int64_t ka, const float *bp, int64_t k, \
                                    float *c, int64_t ldc, int64_t last, const scale_t *s,  \
                                    const float *bias)                                      \
    {                                                                                       \
        tile256(R, V, a, lda, ka, bp, k, c, ldc, last, s, bias);                            \
    }
W256(1, 1) W256(2, 1) W256(3, 1) W256(4, 1) W256(5, 1) W256(6, 1)
W256(1, 2) W256(2, 2) W256(3, 2) W256(1, 3) W256(1, 4)

/* Tiles by panels (1..4) and rows: 6 rows take 1 panel, 3 rows 2, 1 row 4 (at most 12
   accumulators, at least 4 independent ones for a single row). */
static const tile_fn g_t256[5][MR256 + 1] = {
    {0},
    {0, t256_1_1, t256_2_1, t256_3_1, t256_4_1, t256_5_1, t256_6_1},
    {0, t256_1_2, t256_2_2, t256_3_2},
    {0, t256_1_3},
    {0, t256_1_4},
};

static int panels256(int rows)
{
    return rows <= 1 ? 4 : rows <= 3 ? 2 : 1;
}

/* ---------------------------------------------------------------- plain C */

#define MRC 4

/* R rows x one panel, no fused multiply-add (the baseline x86-64 has none to contract to) */
static void tile_c(int R, const float *a, int64_t lda, int64_t ka, const float *bp, int64_t k,
                   float *c, int64_t ldc, int64_t last, const scale_t *s, const float *bias)
{
    float acc[MRC][NR];
    memset(acc, 0, sizeof acc);
    for (int64_t p = 0; p < k; p++)
        for (int r = 0; r < R; r++) {
            const float av = a[r * lda + p * ka];
            for (int j = 0; j < NR; j++) {
                float prod = av * bp[p * NR + j];
                acc[r][j] = acc[r][j] + prod;
            }
        }
    for (int r = 0; r < R; r++)
        for (int64_t j = 0; j < last; j++) {
            float x = acc[r][j];
            if (s->alpha != 1.0f)
                x = x * s->alpha;
            if (bias != NULL)
                x = x + bias[j];
            if (s->beta != 0.0f) {
                float old = c[r * ldc + j];
                if (s->beta != 1.0f)
                    old = old * s->beta;
                x = x + old;
            }
            c[r * ldc + j] = x;
        }
}

/* ---------------------------------------------------------------- ISA choice */

enum { ISA_PLAIN = 0, ISA_AVX2 = 1, ISA_AVX512 = 2 };

static atomic_int g_isa = -1;     /* the path used: -1 until first asked */
static atomic_ullong g_calls;     /* geode_sgemm_packed calls with work to do */

/* The best path this CPU runs. */
int geode_sgemm_packed_best_isa(void)
{
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") &&
        __builtin_cpu_supports("fma"))
        return ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return ISA_AVX2;
    return ISA_PLAIN;
}

/* The path in use: GEODE_PACKED_ISA (plain, avx2, avx512) when set and the CPU runs it,
   else the best. */
int geode_sgemm_packed_isa(void)
{
    int isa = atomic_load_explicit(&g_isa, memory_order_relaxed);
    if (isa >= 0)
        return isa;
    int best = geode_sgemm_packed_best_isa();
    isa = best;
    const char *env = getenv("GEODE_PACKED_ISA");
    if (env != NULL) {
        int want = strcmp(env, "plain") == 0    ? ISA_PLAIN
                   : strcmp(env, "avx2") == 0   ? ISA_AVX2
                   : strcmp(env, "avx512") == 0 ? ISA_AVX512
                                                : -1;
        if (want >= 0 && want <= best)
            isa = want;
    }
    atomic_store_explicit(&g_isa, isa, memory_order_relaxed);
    return isa;
}

/* Test hook: use path `isa` (0 plain, 1 AVX2, 2 AVX-512; < 0: the default again). Returns
   the previous path, or -2 (nothing changed) when the CPU cannot run `isa`. */
int geode_sgemm_packed_set_isa(int isa)
{
    int old = geode_sgemm_packed_isa();
    if (isa > geode_sgemm_packed_best_isa())
        return -2;
    if (isa < 0) {
        atomic_store_explicit(&g_isa, -1, memory_order_relaxed);
        geode_sgemm_packed_isa();
    } else {
        atomic_store_explicit(&g_isa, isa, memory_order_relaxed);
    }
    return old;
}

uint64_t geode_sgemm_packed_calls(void)
{
    return atomic_load(&g_calls);
}

/* ---------------------------------------------------------------- packing */

/* Panels of B (K x N, row-major, leading dim ldb; trans: B^T stored N x K, leading dim
   ldb) into out (ceil(N / 16) * K * 16 floats, see the top of the file). */
GEODE_EXPORT void geode_sgemm_pack(int64_t k, int64_t n, const float *b, int64_t ldb,
                                   int64_t trans, float *out)
{
    const int64_t panels = (n + NR - 1) / NR;
    for (int64_t p = 0; p < panels; p++) {
        float *dst = out + p * k * NR;
        const int64_t j0 = p * NR, w = n - j0 < NR ? n - j0 : NR;
        for (int64_t r = 0; r < k; r++) {
            float *row = dst + r * NR;
            for (int64_t j = 0; j < w; j++)
                row[j] = trans ? b[(j0 + j) * ldb + r] : b[r * ldb + j0 + j];
            for (int64_t j = w; j < NR; j++)
                row[j] = 0.0f;
        }
    }
}

/* ---------------------------------------------------------------- blocks */

typedef struct {
    int64_t m, n, k, lda, ldc;
    int64_t ka;        /* A's element stride along k (1: row-major) */
    int64_t a_rows;    /* > 0: A's rows come in batches of this many ... */
    int64_t a_bstride; /* ... a batch this many elements after the previous one */
    int64_t row0;      /* the first row of A this product reads (C's row 0) */
    const float *a, *bp;
    float *c;
    scale_t s;
    const float *bias; /* NULL: none */
    int isa;
    int by_cols;        /* blocks are column panels (else rows) */
    int64_t panels;     /* ceil(n / 16) */
    int64_t cache_pan;  /* panels per L2 block */
    int64_t units;      /* panel pairs (by_cols) or row tiles in all */
    int64_t unit;       /* panels (by_cols) or rows per unit */
} packed_t;

/* Rows [r0, r1) by panels [p0, p1). */
static void run_block(const packed_t *g, int64_t r0, int64_t r1, int64_t p0, int64_t p1)
{
    const int64_t ps = g->k * NR;
    const int mr = g->isa == ISA_AVX512 ? MR512 : g->isa == ISA_AVX2 ? MR256 : MRC;
    for (int64_t q0 = p0; q0 < p1; q0 += g->cache_pan) {
        const int64_t q1 = q0 + g->cache_pan < p1 ? q0 + g->cache_pan : p1;
        for (int64_t i = r0; i < r1;) {
            int rows = r1 - i < mr ? (int)(r1 - i) : mr;
            const float *ai = g->a + (g->row0 + i) * g->lda;
            if (g->a_rows > 0) { /* a tile stays in one batch of A's rows */
                const int64_t row = g->row0 + i, in = row % g->a_rows;
                if (g->a_rows - in < rows)
                    rows = (int)(g->a_rows - in);
                ai = g->a + (row / g->a_rows) * g->a_bstride + in * g->lda;
            }
            float *ci = g->c + i * g->ldc;
            const int most = g->isa == ISA_AVX512 ? panels512(rows)
                             : g->isa == ISA_AVX2   ? panels256(rows)
                                                    : 1;
            for (int64_t p = q0; p < q1;) {
                const int v = q1 - p < most ? (int)(q1 - p) : most;
                const int64_t end = (p + v) * NR; /* the column after the tile's panels */
                const int64_t last = end <= g->n ? NR : g->n - (end - NR);
                const float *bp = g->bp + p * ps;
                const float *bias = g->bias != NULL ? g->bias + p * NR : NULL;
                float *cp = ci + p * NR;
                if (g->isa == ISA_AVX512)
                    g_t512[v][rows](ai, g->lda, g->ka, bp, g->k, cp, g->ldc, last, &g->s, bias);
                else if (g->isa == ISA_AVX2)
                    g_t256[v][rows](ai, g->lda, g->ka, bp, g->k, cp, g->ldc, last, &g->s, bias);
                else
                    tile_c(rows, ai, g->lda, g->ka, bp, g->k, cp, g->ldc, last, &g->s, bias);
                p += v;
            }
            i += rows;
        }
    }
}

static void block_fn(void *ctx, int64_t chunk, int64_t nchunks)
{
    const packed_t *g = ctx;
    const int64_t u0 = g->units * chunk / nchunks, u1 = g->units * (chunk + 1) / nchunks;
    if (u1 <= u0)
        return;
    if (g->by_cols) {
        int64_t p0 = u0 * g->unit, p1 = u1 * g->unit;
        run_block(g, 0, g->m, p0, p1 < g->panels ? p1 : g->panels);
    } else {
        int64_t r0 = u0 * g->unit, r1 = u1 * g->unit;
        run_block(g, r0, r1 < g->m ? r1 : g->m, 0, g->panels);
    }
}

/* A block has at least this many multiply-adds (the pool's launch, a few microseconds,
   is then a small part of it). */
#define MIN_BLOCK_WORK (1 << 16)
#define BLOCKS_PER_THREAD 4
/* Bytes of B a block of panels keeps in the L2 cache. */
#define L2_PANEL_BYTES (256 << 10)

/* C[m x n] = alpha * A[m x k] @ B + bias + beta * C, B packed by geode_sgemm_pack (k x n),
   bias NULL (none) or n floats added to every row (after alpha, before beta C). Row-major,
   leading dims in elements; threads <= 0: the pool's size. k = 0: C = bias + beta C (C =
   beta C without a bias). Split over the pool unless called from inside a pool job. */
GEODE_EXPORT void geode_sgemm_packed_bias(int64_t m, int64_t n, int64_t k, float alpha,
                                          const float *a, int64_t lda, const float *bp,
                                          const float *bias, float beta, float *c, int64_t ldc,
                                          int64_t threads)
{
    geode_sgemm_packed_at(m, n, k, alpha, a, lda, 1, 0, 0, 0, bp, bias, beta, c, ldc, threads);
}

/* geode_sgemm_packed_bias with A's rows anywhere: C's row i is A's row row0 + i, at
   a + (row / a_rows) a_bstride + (row mod a_rows) lda (a_rows 0: a + row lda), its
   element p ka further on. A stored transposed, X[batch, k, rows] read as A[batch, rows,
   k] (a Transpose of the last two axes the product reads in place): lda 1, ka and a_rows
   X's rows, a_bstride X's matrix size. The same bits as A copied out first. */
GEODE_EXPORT void geode_sgemm_packed_at(int64_t m, int64_t n, int64_t k, float alpha,
                                        const float *a, int64_t lda, int64_t ka, int64_t a_rows,
                                        int64_t a_bstride, int64_t row0, const float *bp,
                                        const float *bias, float beta, float *c, int64_t ldc,
                                        int64_t threads)
{
    if (m <= 0 || n <= 0)
        return;
    if (k <= 0 && bias != NULL) {
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                float x = 0.0f + bias[j];
                if (beta != 0.0f)
                    x = x + (beta == 1.0f ? c[i * ldc + j] : beta * c[i * ldc + j]);
                c[i * ldc + j] = x;
            }
        return;
    }
    if (k <= 0) {
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++)
                c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
        return;
    }
    atomic_fetch_add_explicit(&g_calls, 1, memory_order_relaxed);
    packed_t g = {m,     n,         k,    lda, ldc, ka, a_rows, a_bstride, row0, a, bp, c,
                  {alpha, beta}, bias, geode_sgemm_packed_isa()};
    g.panels = (n + NR - 1) / NR;
    g.cache_pan = L2_PANEL_BYTES / (k * NR * 4);
    if (g.cache_pan < 2)
        g.cache_pan = 2;
    const int mr = g.isa == ISA_AVX512 ? MR512 : g.isa == ISA_AVX2 ? MR256 : MRC;
    g.by_cols = (g.panels + 1) / 2 >= (m + mr - 1) / mr;
    g.unit = g.by_cols ? 2 : mr;
    g.units = g.by_cols ? (g.panels + 1) / 2 : (m + mr - 1) / mr;
    const int64_t t = threads > 0 ? threads : geode_num_threads();
    const double work = (double)m * (double)n * (double)k;
    int64_t blocks = t * BLOCKS_PER_THREAD;
    if ((double)blocks > work / MIN_BLOCK_WORK)
        blocks = (int64_t)(work / MIN_BLOCK_WORK);
    if (blocks > g.units)
        blocks = g.units;
    if (t > 1 && blocks > t && blocks < t * BLOCKS_PER_THREAD)
        blocks -= blocks % t;
    if (t > 1 && blocks >= 2 && !geode_pool_in_job())
        geode_parallel_for(block_fn, &g, blocks, t);
    else
        run_block(&g, 0, m, 0, g.panels);
}

/* ---------------------------------------------------------------- B not packed */

/* geode_sgemm_wide: strips of this many panels of B are packed at a time, into the calling
   thread's scratch buffer WIDE_SLOT (at most WIDE_PANELS * WIDE_MAX_K * 64 bytes: 128 KiB;
   not the stack: a thread started with a small stack would overflow it). The dense entries
   (dense.py) hold slots 0-3 while their GEMMs run; the wide path has its own. */
#define WIDE_PANELS 2
#define WIDE_MAX_K 1024
#define WIDE_SLOT 4

static atomic_int g_wide_direct; /* test hook: 1 acts as if the scratch were not given */

/* The 16 columns of x[0..15] (16 rows of 16 floats) as rows: out[c] = (x[0][c], ...,
   x[15][c]); only rows c < rows are stored, at out + c * NR. */
T512 static void transpose16(__m512 x[16], float *out, int64_t rows)
{
    __m512 t[16], u[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(x[i], x[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(x[i], x[i + 1]);
    }
    for (int g = 0; g < 4; g++) { /* u[4g + c]: column 4L + c of rows 4g..4g+3 in lane L */
        const __m512d a0 = _mm512_castps_pd(t[4 * g]), a1 = _mm512_castps_pd(t[4 * g + 1]);
        const __m512d b0 = _mm512_castps_pd(t[4 * g + 2]), b1 = _mm512_castps_pd(t[4 * g + 3]);
        u[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(a0, b0));
        u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a0, b0));
        u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(a1, b1));
        u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(a1, b1));
    }
    for (int c = 0; c < 4; c++) {
        const __m512 v0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x44);
        const __m512 v1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xEE);
        const __m512 v2 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x44);
        const __m512 v3 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xEE);
        const __m512 col[4] = {_mm512_shuffle_f32x4(v0, v2, 0x88), _mm512_shuffle_f32x4(v0, v2, 0xDD),
                               _mm512_shuffle_f32x4(v1, v3, 0x88), _mm512_shuffle_f32x4(v1, v3, 0xDD)};
        for (int l = 0; l < 4; l++)
            if (4 * l + c < rows)
                _mm512_store_ps(out + (4 * l + c) * NR, col[l]);
    }
}

/* B[0:k, 0:16 * WIDE_PANELS] as WIDE_PANELS panels: B row-major (leading dim ldb), or,
   trans, B^T row-major (element (p, j) at b[j * ldb + p]: 16 x 16 blocks transposed). */
T512 static void pack_strip512(const float *b, int64_t ldb, int64_t k, int trans, float *out)
{
    if (trans) {
        for (int64_t p = 0; p < k; p += 16) {
            const int64_t rows = k - p < 16 ? k - p : 16;
            const __mmask16 m = (__mmask16)((1u << rows) - 1u);
            for (int q = 0; q < WIDE_PANELS; q++) {
                __m512 x[16];
                for (int i = 0; i < 16; i++)
                    x[i] = _mm512_maskz_loadu_ps(m, b + (q * NR + i) * ldb + p);
                transpose16(x, out + q * k * NR + p * NR, rows);
            }
        }
        return;
    }
    for (int64_t p = 0; p < k; p++) {
#pragma GCC unroll 4
        for (int q = 0; q < WIDE_PANELS; q++)
            _mm512_store_ps(out + q * k * NR + p * NR, _mm512_loadu_ps(b + p * ldb + q * NR));
    }
}

/* 1 when geode_sgemm_wide runs with AVX-512 tiles (geode_gemm then takes it for float32
   products instead of the BLAS, which runs AVX2 kernels on AMD's AVX-512 CPUs). */
int geode_sgemm_wide_ok(void)
{
    return geode_sgemm_packed_isa() == ISA_AVX512;
}

/* C[0:m, j0:j1] (= or, add 1, +=) A[0:m, 0:k] @ B without a buffer: each element one fused
   multiply-add chain from zero in k order, then plus C (the bits of the packed tiles); the
   fallback when the strip's scratch cannot be had. */
static void wide_direct(int64_t m, int64_t j0, int64_t j1, int64_t k, const float *a,
                        int64_t lda, const float *b, int64_t ldb, int trans, int add, float *c,
                        int64_t ldc)
{
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = j0; j < j1; j++) {
            float acc = 0.0f;
            for (int64_t p = 0; p < k; p++)
                acc = fmaf(a[i * lda + p], trans ? b[j * ldb + p] : b[p * ldb + j], acc);
            c[i * ldc + j] = add ? acc + c[i * ldc + j] : acc;
        }
}

/* Test hook: on 1, geode_sgemm_wide acts as if its scratch could not be allocated (the
   unbuffered fallback). Returns the previous setting. */
GEODE_EXPORT int geode_sgemm_wide_set_direct(int on)
{
    return atomic_exchange(&g_wide_direct, on != 0);
}

/* C[0:m, j0:j1] (= or, add 1, +=) A[0:m, 0:k] @ B[0:k, j0:j1], row-major, leading dims in
   elements (trans: B^T given, row-major [n x k]), k in 1..WIDE_MAX_K, on the
   calling thread: B packed a strip of WIDE_PANELS panels at a time into the thread's
   scratch, then the packed kernel's tiles, all rows of the strip. Every element one fused
   multiply-add chain from zero in k order (then plus C): the bits of geode_sgemm_packed,
   and of sgemm_thin.c's kernel, whatever the columns' range. */
void geode_sgemm_wide(int64_t m, int64_t j0, int64_t j1, int64_t k, const float *a,
                      int64_t lda, const float *b, int64_t ldb, int trans, int add, float *c,
                      int64_t ldc)
{
    float *strip = atomic_load_explicit(&g_wide_direct, memory_order_relaxed)
                       ? NULL
                       : geode_scratch(WIDE_SLOT, WIDE_PANELS * k * NR * (int64_t)sizeof(float));
    if (strip == NULL) {
        wide_direct(m, j0, j1, k, a, lda, b, ldb, trans, add, c, ldc);
        return;
    }
    packed_t g = {m,     0,    k,     lda, ldc, 1, 0, 0, 0, a, strip, c,
                  {1.0f, add ? 1.0f : 0.0f}, NULL, geode_sgemm_packed_isa()};
    g.cache_pan = WIDE_PANELS;
    for (int64_t j = j0; j < j1; j += WIDE_PANELS * NR) {
        const int64_t w = j1 - j < WIDE_PANELS * NR ? j1 - j : WIDE_PANELS * NR;
        const float *bj = trans ? b + j * ldb : b + j;
        if (w == WIDE_PANELS * NR && g.isa == ISA_AVX512)
            pack_strip512(bj, ldb, k, trans, strip);
        else
            geode_sgemm_pack(k, w, bj, ldb, trans, strip);
        g.n = w;
        g.panels = (w + NR - 1) / NR;
        g.c = c + j;
        run_block(&g, 0, m, 0, g.panels);
    }
}

/* C = alpha * A @ B + beta * C (geode_sgemm_packed_bias without a bias). */
GEODE_EXPORT void geode_sgemm_packed(int64_t m, int64_t n, int64_t k, float alpha,
                                     const float *a, int64_t lda, const float *bp, float beta,
                                     float *c, int64_t ldc, int64_t threads)
{
    geode_sgemm_packed_bias(m, n, k, alpha, a, lda, bp, NULL, beta, c, ldc, threads);
}
