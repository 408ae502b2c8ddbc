/* geode native runtime: geode's own float32 GEMM for products too small to split in the BLAS.

   geode_gemm splits a GEMM over the pool only in blocks the BLAS computes with its packed
   kernel (a block in OpenBLAS's small-matrix path rounds its edge columns unlike the rest).
   A product under twice that size (a GEMV of an LSTM cell, a 32 x 256 x 256 projection)
   therefore ran as one single-threaded BLAS call while the other core idled. This kernel
   computes C[m x n] = A @ B (+ C) for any column range with the same arithmetic for every
   element: c[i][j] = sum over k in order of a[i][k] * b[k][j], one fused multiply-add per
   term, from zero (then added to C when beta is 1). So a column's value does not depend on
   the block it falls in, and the product can be split into column blocks of any size.

   The register tile is 4 rows x 16 columns (8 accumulators of 8 floats, AVX2 + FMA); a
   product of one or two rows (a GEMV, whose speed is that of streaming B) keeps its sums
   in the L1 cache instead (gemv_panel). The last columns of a row (fewer than 8) are loaded and stored
   masked, with the same per-lane arithmetic. Hosts without AVX2 and FMA never use it
   (geode_sgemm_thin_ok is 0; geode_gemm keeps the BLAS). Where the packed kernel's tiles
   are AVX-512, geode_gemm gives it only products of 1 or 2 rows or with K past 1024
   (gemm.c: the rest take geode_sgemm_wide, the same bits). */

#define _GNU_SOURCE
#pragma GCC optimize("O3")
#include "pool.h"

#include <immintrin.h>
#include <stdint.h>

#define TARGET __attribute__((target("avx2,fma")))
#define INLINE static inline __attribute__((always_inline))

static const int32_t g_mask_words[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};

/* lanes [0, cols) of a vector of 8 (cols in 1..8) */
TARGET INLINE __m256i lane_mask(int64_t cols)
{
    return _mm256_loadu_si256((const __m256i *)(g_mask_words + 8 - cols));
}

/* A tile of R rows (1..4) and V vectors of 8 columns (1..4), the last vector masked to
   `last` lanes (8: full). */
#define TILE(R, V)                                                                          \
    TARGET static void tile_##R##_##V(const float *a, int64_t lda, const float *b,          \
                                      int64_t ldb, float *c, int64_t ldc, int64_t k,        \
                                      int add, int64_t last)                                \
    {                                                                                       \
        __m256 acc[R][V];                                                                   \
        const __m256i m = lane_mask(last);                                                  \
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)                                 \
            _Pragma("GCC unroll 4") for (int v = 0; v < V; v++) acc[r][v] =                 \
                _mm256_setzero_ps();                                                        \
        for (int64_t p = 0; p < k; p++) {                                                   \
            __m256 bv[V];                                                                   \
            const float *brow = b + p * ldb;                                                \
            _Pragma("GCC unroll 4") for (int v = 0; v < V; v++) bv[v] =                     \
                v == V - 1 ? _mm256_maskload_ps(brow + 8 * v, m)                            \
                           : _mm256_loadu_ps(brow + 8 * v);                                 \
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)                             \
            {                                                                               \
                __m256 av = _mm256_broadcast_ss(a + r * lda + p);                           \
                _Pragma("GCC unroll 4") for (int v = 0; v < V; v++) acc[r][v] =             \
                    _mm256_fmadd_ps(av, bv[v], acc[r][v]);                                  \
            }                                                                               \
        }                                                                                   \
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)                                 \
            _Pragma("GCC unroll 4") for (int v = 0; v < V; v++)                             \
            {                                                                               \
                float *out = c + r * ldc + 8 * v;                                           \
                __m256 x = acc[r][v];                                                       \
                if (v == V - 1) {                                                           \
                    if (add)                                                                \
                        x = _mm256_add_ps(_mm256_maskload_ps(out, m), x);                   \
                    _mm256_maskstore_ps(out, m, x);                                         \
                } else {                                                                    \
                    if (add)                                                                \
                        x = _mm256_add_ps(_mm256_loadu_ps(out), x);                         \
                    _mm256_storeu_ps(out, x);                                               \
                }                                                                           \
            }                                                                               \
    }

TILE(1, 1)
TILE(2, 1)
TILE(3, 1)
TILE(4, 1)
TILE(1, 2)
TILE(2, 2)
TILE(3, 2)
TILE(4, 2)

typedef void (*tile_fn)(const float *, int64_t, const float *, int64_t, float *, int64_t,
                        int64_t, int, int64_t);

/* Per row count (1..4): the tile of a whole strip, and the one-vector tile. */
static const tile_fn g_strip[5] = {0, tile_1_2, tile_2_2, tile_3_2, tile_4_2};
static const tile_fn g_one[5] = {0, tile_1_1, tile_2_1, tile_3_1, tile_4_1};

/* One or two rows (a GEMV): the sums of a panel of up to GEMV_PANEL columns kept in the L1
   cache (not registers) so that B is read a row segment at a time, not in 128-byte
   pieces a page apart; the same fused multiply-adds in the same order as the tiles. */
#define GEMV_PANEL 256
TARGET INLINE void gemv_panel(int rows, const float *a, int64_t lda, const float *b,
                              int64_t ldb, float *c, int64_t ldc, int64_t k, int add, int64_t w)
{
    __m256 acc[2][GEMV_PANEL / 8];
    const int64_t nv = (w + 7) / 8;
    const __m256i m = lane_mask(w - 8 * (nv - 1));
    for (int64_t v = 0; v < nv; v++)
        acc[0][v] = acc[1][v] = _mm256_setzero_ps();
    int64_t p = 0;
    for (; p + 4 <= k; p += 4) { /* four rows of B per pass over the sums, in order */
        const float *b0 = b + p * ldb;
        __m256 x0[4], x1[4];
        for (int q = 0; q < 4; q++) {
            x0[q] = _mm256_broadcast_ss(a + p + q);
            x1[q] = rows == 2 ? _mm256_broadcast_ss(a + lda + p + q) : x0[q];
        }
        for (int64_t v = 0; v < nv; v++) {
            __m256 s0 = acc[0][v], s1 = acc[1][v];
            if (v < nv - 1) {
#pragma GCC unroll 4
                for (int q = 0; q < 4; q++) {
                    __m256 bv = _mm256_loadu_ps(b0 + q * ldb + 8 * v);
                    s0 = _mm256_fmadd_ps(x0[q], bv, s0);
                    if (rows == 2)
                        s1 = _mm256_fmadd_ps(x1[q], bv, s1);
                }
            } else {
#pragma GCC unroll 4
                for (int q = 0; q < 4; q++) {
                    __m256 bv = _mm256_maskload_ps(b0 + q * ldb + 8 * v, m);
                    s0 = _mm256_fmadd_ps(x0[q], bv, s0);
                    if (rows == 2)
                        s1 = _mm256_fmadd_ps(x1[q], bv, s1);
                }
            }
            acc[0][v] = s0;
            if (rows == 2)
                acc[1][v] = s1;
        }
    }
    for (; p < k; p++) {
        const float *brow = b + p * ldb;
        const __m256 a0 = _mm256_broadcast_ss(a + p);
        const __m256 a1 = rows == 2 ? _mm256_broadcast_ss(a + lda + p) : a0;
        for (int64_t v = 0; v < nv; v++) {
            __m256 bv = v == nv - 1 ? _mm256_maskload_ps(brow + 8 * v, m)
                                    : _mm256_loadu_ps(brow + 8 * v);
            acc[0][v] = _mm256_fmadd_ps(a0, bv, acc[0][v]);
            if (rows == 2)
                acc[1][v] = _mm256_fmadd_ps(a1, bv, acc[1][v]);
        }
    }
    for (int r = 0; r < rows; r++) {
        const float *sums = (const float *)acc[r];
        float *out = c + r * ldc;
        for (int64_t j = 0; j < w; j++)
            out[j] = add ? out[j] + sums[j] : sums[j];
    }
}

TARGET static void gemv_1(const float *a, int64_t lda, const float *b, int64_t ldb, float *c,
                          int64_t ldc, int64_t k, int add, int64_t w)
{
    gemv_panel(1, a, lda, b, ldb, c, ldc, k, add, w);
}

TARGET static void gemv_2(const float *a, int64_t lda, const float *b, int64_t ldb, float *c,
                          int64_t ldc, int64_t k, int add, int64_t w)
{
    gemv_panel(2, a, lda, b, ldb, c, ldc, k, add, w);
}

/* Strips of B are copied (packed) to a contiguous buffer when several row tiles read them
   and K is at most this: B's rows are far apart in memory (a page for 1024 columns), and
   the cache keeps few lines a page apart. */
#define PACK_MAX_K 512

TARGET static void pack_strip(const float *b, int64_t ldb, int64_t k, float *out)
{
    for (int64_t p = 0; p < k; p++) {
        _mm256_store_ps(out + 16 * p, _mm256_loadu_ps(b + p * ldb));
        _mm256_store_ps(out + 16 * p + 8, _mm256_loadu_ps(b + p * ldb + 8));
    }
}

/* C[0:m, j0:j1] (= or +=) A[0:m, :] @ B[:, j0:j1], row-major, leading dims in elements.
   Column strips of 16 outermost, so a strip of B stays in the L1 cache for all rows. */
void geode_sgemm_thin(int64_t m, int64_t j0, int64_t j1, int64_t k, const float *a,
                      int64_t lda, const float *b, int64_t ldb, int add, float *c, int64_t ldc)
{
    if (m <= 2) {
        for (int64_t j = j0; j < j1; j += GEMV_PANEL) {
            int64_t w = j1 - j < GEMV_PANEL ? j1 - j : GEMV_PANEL;
            (m == 1 ? gemv_1 : gemv_2)(a, lda, b + j, ldb, c + j, ldc, k, add, w);
        }
        return;
    }
    const int64_t strip = 16;
    float packed[PACK_MAX_K * 16] __attribute__((aligned(64)));
    const int pack = m > 4 && k <= PACK_MAX_K;
    for (int64_t j = j0; j < j1; j += strip) {
        int64_t w = j1 - j < strip ? j1 - j : strip;
        const float *bj = b + j;
        int64_t ldbj = ldb;
        if (pack && w == strip) {
            pack_strip(b + j, ldb, k, packed);
            bj = packed;
            ldbj = strip;
        }
        for (int64_t i = 0; i < m; i += 4) {
            int rows = m - i < 4 ? (int)(m - i) : 4;
            const float *ai = a + i * lda;
            float *ci = c + i * ldc + j;
            if (w == strip) {
                g_strip[rows](ai, lda, bj, ldbj, ci, ldc, k, add, 8);
                continue;
            }
            for (int64_t q = 0; q < w; q += 8) {
                int64_t last = w - q < 8 ? w - q : 8;
                g_one[rows](ai, lda, b + j + q, ldb, ci + q, ldc, k, add, last);
            }
        }
    }
}

int geode_sgemm_thin_ok(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
