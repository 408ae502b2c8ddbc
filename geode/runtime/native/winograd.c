/* geode native runtime: float32 Winograd F(2x2, 3x3) and F(4x4, 3x3) convolution
   (stride 1, dilation 1, one group, NCHW) with its epilogue (bias, residual, Relu), split
   over the pool.

   Each t x t block of outputs (a tile, t = 2 or 4) of output channel co is
     Y = A^T [ sum over ci of U[co][ci] * V[ci] ] A,   V = B^T d B,   U = G g G^T,
   d the tile's (t+2) x (t+2) input window of channel ci, g the 3x3 filter; the sum is
   P = (t+2)^2 products of matrices, one per position xi of the transformed tile: 2.25
   (t = 2) or 4 (t = 4) times fewer multiplies than the direct conv. U is computed once,
   when the model is compiled (geode/codegen/winograd_weights.py), laid out [P][M][C]
   (position, output channel, input channel).

   Work items: a chunk of up to 3 vectors of 8 tiles of one tile row of one image (a tile
   row's vectors shared evenly among its chunks). F(4x4) on a map of 2, 4 or 5 to 8 tiles
   a row (5-8 or 13-32 output columns) takes row groups instead: a vector is rp = 8 / tw
   whole tile rows at 2 and 4 tiles a row (lane s * tw + tx: tile tx of the group's row
   s), so no lane is empty, and one tile row (rp 1) at 5 to 8; an item is up to 3 row
   groups of one image (up to 3 tile rows at 5 to 8 tiles a row: 8 x 3 accumulators per
   product instead of 8 x 1), cut into about GROUP_ITEMS_PER_THREAD items a thread (the
   split changes no result; the prefetches stay off). Per item, in the thread's scratch
   buffer: V for every input channel, [P][C][tb] (tb = the chunk's tiles, lanes along the
   row); then per group of WRI output channels (8 with AVX-512VL's 32 vector registers,
   else 4) the P products [WRI x C] @ [C x tb] into a small buffer m[P][WRI][tb] (kept in
   L1), and the output transform of each channel with the bias, the residual and Relu,
   written straight to Y as interleaved rows.

   The AVX-512 zmm path (full-width 512-bit FMAs: Zen 5, Intel server cores) runs F(4x4)
   in vectors of 16 tiles (plan_items: at 4 or 8 tiles a row row groups of rp = 16 / tw
   tile rows, from 9 tiles a row chunks of up to ZMAXNV vectors of a tile row; else the
   8-lane layout of the AVX-512VL path), 16 output channels a product with one vector of
   tiles, 8 with two (the accumulators fill the 32 registers), its input read by masked
   loads (no copies at the borders); an item too few for the threads is split by output
   channels (each part transforms its input again).

   Every output is computed from its own tile, in the same order, whatever the item
   boundaries or the thread count: the same bits on any split. The zmm and AVX-512VL
   paths give the same bits; they, AVX2 + FMA and the plain path (chosen at run time,
   winograd_set_isa to force one) differ only in whether a product and a sum are fused,
   so their results differ by rounding. A NaN or Inf in a tile's input window reaches all
   of the tile's outputs (the transforms mix the window). */

#define _GNU_SOURCE
#pragma GCC optimize("O3")
/* the vector helpers are always inlined into functions of a vector target */
#pragma GCC diagnostic ignored "-Wpsabi"
#include "pool.h"

#include <immintrin.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* most output channels per product (the zmm path; AVX-512VL: 8, the other paths 4), most
   vectors of 8 tiles per item (the zmm path's 2 vectors of 16; 3 on the others), and
   tiles per item */
#define WR 16
#define WMAXNV 4
#define WMAXTB (WMAXNV * 8)
/* the zmm path's most vectors of 16 tiles an item */
#define ZMAXNV 2
/* floats per row of an item's bordered input copy (the 8-lane paths: F(2x2) 2 * 24 + 2,
   F(4x4) 34; rounded up) */
#define WROW 56
/* the scratch slot (geode_scratch) the kernel uses */
#define WSLOT 2

typedef float v8 __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef float v8u __attribute__((vector_size(32), aligned(4)));
typedef float v16 __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));

#define EVENS ((v8i){0, 2, 4, 6, 8, 10, 12, 14})
#define ODDS ((v8i){1, 3, 5, 7, 9, 11, 13, 15})
#define ZIP_LO ((v8i){0, 8, 1, 9, 2, 10, 3, 11})
#define ZIP_HI ((v8i){4, 12, 5, 13, 6, 14, 7, 15})

static inline __attribute__((always_inline)) v8 vload(const float *p)
{
    return *(const v8u *)p;
}

static inline __attribute__((always_inline)) void vstore(float *p, v8 x)
{
    *(v8u *)p = x;
}

static inline __attribute__((always_inline)) v8 vsplat(float x)
{
    const v8 one = {x};
    return __builtin_shuffle(one, (v8i){0});
}

static inline __attribute__((always_inline)) v16 vload16(const float *p)
{
    return *(const v16u *)p;
}

static inline __attribute__((always_inline)) void vstore16(float *p, v16 x)
{
    *(v16u *)p = x;
}

static inline __attribute__((always_inline)) v16 vsplat16(float x)
{
    const v16 one = {x};
    return __builtin_shuffle(one, (v16i){0});
}

/* x < 0 ? 0 : x (NaN and -0.0 kept, as the reference's Relu) */
static inline __attribute__((always_inline)) v8 vrelu(v8 x)
{
    const v8i neg = x < (v8){0};
    return (v8)((v8i)x & ~neg);
}

static inline __attribute__((always_inline)) v16 vrelu16(v16 x)
{
    const v16i neg = x < (v16){0};
    return (v16)((v16i)x & ~neg);
}

typedef struct {
    const float *x, *u, *bias, *z;
    float *y;
    int64_t n, c, m, h, w, oh, ow, pt, pl, relu;
    int64_t tile; /* outputs per tile side: 2 (F(2x2, 3x3)) or 4 (F(4x4, 3x3)) */
    int64_t tw, vr, cr; /* tiles per row, their vectors, chunks per row (with row
                           groups: the image's groups, chunks per image) */
    int64_t rp;         /* tile rows per vector of a row group (see the top), 0: none */
    int64_t items;
    int isa;
    int64_t lanes; /* tiles a vector: 8, or 16 on the AVX-512 zmm path */
    int64_t ms;    /* items an item's tiles are split into by output channels */
    int prefetch; /* the arrays outgrow the L2 cache: prefetch_step's prefetches pay */
} wino_t;

typedef struct {
    int64_t n, ty, tx0, nv; /* image, tile row, first tile, vectors of g->lanes tiles */
    int64_t co0, co1;       /* the output channels */
} item_t;

/* Floats between one position's transformed input matrix ([C][tb]) and the next: the
   matrix and a cache line more, so that the input transform's 16 or 36 stores of a
   vector (one a position) fall in different sets of the L1 cache (with C tb a multiple of
   1024, as at 32 channels by 32 tiles, they fell in one set: a third of the small cnn's
   32-channel conv time on Zen 5). */
#define WVPAD 16

static inline int64_t pos_stride(const wino_t *g, int64_t tb)
{
    return g->c * tb + WVPAD;
}

typedef void (*gemm_fn)(const float *u, int64_t c, const float *v, int64_t tb, float *out);

static const float g_zero_row[WROW];

/* dst[q] = src[col0 + q] for q in [0, span), zero where col0 + q is outside [0, w). */
static void border_copy(float *dst, const float *src, int64_t col0, int64_t span, int64_t w)
{
    int64_t lo = col0 < 0 ? -col0 : 0, hi = w - col0 < span ? w - col0 : span;
    if (hi < lo)
        hi = lo;
    if (lo > span)
        lo = hi = span;
    memset(dst, 0, (size_t)lo * sizeof(float));
    memcpy(dst + lo, src + col0 + lo, (size_t)(hi - lo) * sizeof(float));
    memset(dst + hi, 0, (size_t)(span - hi) * sizeof(float));
}

/* Prefetches, spread over an item's products so that few are in flight at a time: an
   item's t rows of Y and Z for each output channel and its t + 2 rows of X for each
   input channel are more streams than the hardware prefetcher follows. */

/* The lines of Y (to write) and Z (to read) of output unit k of item `it`'s channels
   [co, co + r): channel co + k / t, output row k % t of the item. */
static void prefetch_out_unit(const wino_t *g, const item_t *it, int64_t co, int r, int64_t k)
{
    const int64_t t = g->tile, ox = t * it->tx0, oy = t * it->ty + k % t;
    if (k >= r * t || ox >= g->ow || oy >= g->oh)
        return;
    const int64_t span = g->lanes * t * it->nv;
    const int64_t cols = g->ow - ox < span ? g->ow - ox : span;
    const int64_t at = ((it->n * g->m + co + k / t) * g->oh + oy) * g->ow + ox;
    for (int64_t j = 0; j < cols + 15; j += 16) {
        const int64_t e = j < cols ? j : cols - 1;
        __builtin_prefetch(g->y + at + e, 1, 3);
        if (g->z != NULL)
            __builtin_prefetch(g->z + at + e, 0, 3);
    }
}

/* The lines of X of input unit k of item `it`: channel k / (t + 2), input row
   k % (t + 2) of the item's window. */
static void prefetch_in_unit(const wino_t *g, const item_t *it, int64_t k)
{
    const int64_t t = g->tile, ch = k / (t + 2), iy = t * it->ty - g->pt + k % (t + 2);
    int64_t col0 = t * it->tx0 - g->pl, col1 = col0 + g->lanes * t * it->nv + 2;
    col0 = col0 < 0 ? 0 : col0;
    col1 = col1 > g->w ? g->w : col1;
    if (ch >= g->c || iy < 0 || iy >= g->h || col1 <= col0)
        return;
    const float *row = g->x + ((it->n * g->c + ch) * g->h + iy) * g->w;
    for (int64_t q = col0; q < col1 + 15; q += 16)
        __builtin_prefetch(row + (q < col1 ? q : col1 - 1), 0, 3);
}

/* The prefetches that go with product `step` of an item (steps in all; co, r: the
   channels whose products run now): the next group's output unit, and a share of the
   next item's input units (`next`, NULL: none). Group 0's outputs are prefetched
   before the input transform (step -1: all of them). */
static inline __attribute__((always_inline)) void
prefetch_step(const wino_t *g, const item_t *it, const item_t *next, int64_t co, int r,
              int64_t xi, int64_t step, int64_t steps)
{
    if (!g->prefetch)
        return;
    if (step < 0) {
        for (int64_t k = 0; k < r * g->tile; k++)
            prefetch_out_unit(g, it, 0, r, k);
        return;
    }
    const int64_t nco = co + r;
    if (nco < g->m)
        prefetch_out_unit(g, it, nco, g->m - nco < r ? (int)(g->m - nco) : r, xi);
    if (next == NULL)
        return;
    const int64_t units = g->c * (g->tile + 2), per = (units + steps - 1) / steps;
    for (int64_t k = step * per; k < (step + 1) * per && k < units; k++)
        prefetch_in_unit(g, next, k);
}

/* the body's vectors: 8 lanes (WV v8) on every path but the zmm one (16) */
#define WV v8
#define WVI v8i
#define WVL 8
#define WLOAD vload
#define WSTORE vstore
#define WSPLAT vsplat
#define WRELU vrelu

#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx2,fma")
#define WSUF avx512
#define WRI 8
#include "winograd_body.h"
#undef WRI
#undef WSUF
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define WSUF avx2
#define WRI 4
#include "winograd_body.h"
#undef WRI
#undef WSUF
#pragma GCC pop_options

#define WSUF plain
#define WRI 4
#include "winograd_body.h"
#undef WRI
#undef WSUF

#undef WV
#undef WVI
#undef WVL
#undef WLOAD
#undef WSTORE
#undef WSPLAT
#undef WRELU
#define WV v16
#define WVI v16i
#define WVL 16
#define WLOAD vload16
#define WSTORE vstore16
#define WSPLAT vsplat16
#define WRELU vrelu16

#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx2,fma")
#define WSUF avx512z
#define WRI 16
#define WZMM 1
#include "winograd_body.h"
#undef WZMM
#undef WRI
#undef WSUF
#pragma GCC pop_options

/* ---------------------------------------------------------------- ISA choice */

enum { W_PLAIN = 0, W_AVX2 = 1, W_AVX512 = 2, W_AVX512Z = 3 };

static atomic_int g_isa = -1;

static int best_isa(void)
{
    __builtin_cpu_init();
    const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl"))
        return W_AVX512Z;
    return avx2 ? W_AVX2 : W_PLAIN;
}

/* The path in use: 0 plain C, 1 AVX2 + FMA, 2 AVX-512VL (8 lanes), 3 AVX-512 zmm (16
   lanes; the best the CPU runs unless geode_winograd_set_isa chose another). */
int geode_winograd_isa(void)
{
    int isa = atomic_load_explicit(&g_isa, memory_order_relaxed);
    if (isa < 0) {
        isa = best_isa();
        atomic_store_explicit(&g_isa, isa, memory_order_relaxed);
    }
    return isa;
}

/* Test hook: use path `isa` (< 0: the best again). Returns the previous path, or -2
   (nothing changed) when the CPU cannot run `isa`. */
int geode_winograd_set_isa(int isa)
{
    const int old = geode_winograd_isa();
    if (isa > best_isa())
        return -2;
    atomic_store_explicit(&g_isa, isa < 0 ? best_isa() : isa, memory_order_relaxed);
    return old;
}

/* ---------------------------------------------------------------- items */

static void item_of(const wino_t *g, int64_t k, item_t *it)
{
    const int64_t groups = (g->m + WR - 1) / WR, part = k % g->ms;
    it->co0 = WR * (groups * part / g->ms);
    it->co1 = WR * (groups * (part + 1) / g->ms);
    it->co1 = it->co1 < g->m ? it->co1 : g->m;
    k /= g->ms;
    const int64_t chunk = k % g->cr, row = k / g->cr;
    if (g->rp > 0) { /* row groups: row is the image, vectors are groups of rp tile rows */
        const int64_t v0 = g->vr * chunk / g->cr, v1 = g->vr * (chunk + 1) / g->cr;
        it->n = row;
        it->ty = g->rp * v0;
        it->tx0 = 0;
        it->nv = v1 - v0;
        return;
    }
    const int64_t th = (g->oh + g->tile - 1) / g->tile;
    it->n = row / th;
    it->ty = row % th;
    const int64_t v0 = g->vr * chunk / g->cr, v1 = g->vr * (chunk + 1) / g->cr;
    it->tx0 = g->lanes * v0;
    it->nv = v1 - v0;
}

static int64_t scratch_floats(int64_t c, int64_t tile)
{
    const int64_t side = tile + 2;
    return side * side * ((c + WR) * WMAXTB + 2 * WVPAD) + 4 * side * WROW; /* rp <= 4 */
}

typedef struct {
    const wino_t *g;
    int64_t nchunks;
    atomic_int failed;
} job_t;

static void run_range(const wino_t *g, int64_t k0, int64_t k1, atomic_int *failed)
{
    if (k1 <= k0)
        return;
    float *scratch = geode_scratch(WSLOT, scratch_floats(g->c, g->tile) * (int64_t)sizeof(float));
    if (scratch == NULL) {
        atomic_store(failed, 1);
        return;
    }
    item_t it, next;
    item_of(g, k0, &it);
    for (int64_t k = k0; k < k1; k++) {
        const int more = k + 1 < k1;
        if (more)
            item_of(g, k + 1, &next);
        const item_t *after = more ? &next : NULL;
        const int f4 = g->tile == 4;
        if (it.nv <= 0 || it.co1 <= it.co0)
            ;
        else if (g->lanes == 16)
            run_item4_avx512z(g, &it, after, scratch);
        else if (g->isa >= W_AVX512)
            (f4 ? run_item4_avx512 : run_item_avx512)(g, &it, after, scratch);
        else if (g->isa == W_AVX2)
            (f4 ? run_item4_avx2 : run_item_avx2)(g, &it, after, scratch);
        else
            (f4 ? run_item4_plain : run_item_plain)(g, &it, after, scratch);
        it = next;
    }
}

static void chunk_fn(void *ctx, int64_t chunk, int64_t nchunks)
{
    job_t *job = ctx;
    const int64_t items = job->g->items;
    run_range(job->g, items * chunk / nchunks, items * (chunk + 1) / nchunks, &job->failed);
}

#define CHUNKS_PER_THREAD 4
/* items a thread with row groups: fewer, longer items than CHUNKS_PER_THREAD (more
   row groups an item multiply together) */
#define GROUP_ITEMS_PER_THREAD 2
/* X, Y and Z together over this many bytes: prefetch (below it they stay in the L2
   cache between calls and the prefetches cost more than they save: the small cnn's
   32x32 convs 0.112 -> 0.119 ms with them) */
#define PREFETCH_MIN_BYTES (1 << 20)

/* The items of a call (th tile rows, t threads): the lanes a vector (16 on the zmm path
   for F(4x4) at 4 or 8 tiles a row (row groups of 4 or 2 tile rows) or 9 and more, else
   8), the row groups (see the top), the vectors and chunks of a tile row or an image,
   and the split by output channels: the zmm path's few, wide items of a small map
   shared among the threads by output channels (each part transforms the item's input
   again). */
static void plan_items(wino_t *g, int64_t th, int64_t t)
{
    const int64_t tw = g->tw, n = g->n;
    const int z = g->isa == W_AVX512Z && g->tile == 4 && (tw == 4 || tw >= 8);
    g->lanes = z ? 16 : 8;
    const int64_t maxnv = z ? ZMAXNV : 3;
    if (z)
        g->rp = tw == 4 || tw == 8 ? 16 / tw : 0;
    else if (g->tile == 4)
        g->rp = tw == 2 || tw == 4 ? 8 / tw : tw >= 5 && tw <= 8 ? 1 : 0;
    else
        g->rp = 0;
    if (g->rp > 0) { /* vectors of row groups, per image */
        g->vr = (th + g->rp - 1) / g->rp;
        const int64_t want = t > 1 ? (GROUP_ITEMS_PER_THREAD * t + n - 1) / n : 1;
        const int64_t least = (g->vr + maxnv - 1) / maxnv;
        g->cr = want < least ? least : want > g->vr ? g->vr : want;
        g->items = n * g->cr;
    } else {
        g->vr = (tw + g->lanes - 1) / g->lanes;
        g->cr = (g->vr + maxnv - 1) / maxnv;
        g->items = n * th * g->cr;
    }
    g->ms = 1;
    if (z && g->items < t) { /* fewer items than threads: split them */
        const int64_t groups = (g->m + WR - 1) / WR, want = (t + g->items - 1) / g->items;
        g->ms = want < groups ? want : groups;
        g->items *= g->ms;
    }
}

/* Y[n][m][oh][ow] = act(conv(X, W) + bias + Z) with W given as U ([P][m][c], see the top
   of the file; P = 16 for tile 2, F(2x2, 3x3), 36 for tile 4, F(4x4, 3x3)); bias and z
   may be NULL; pt, pl: the top and left pads (the bottom and right ones follow from oh
   and ow); threads <= 0: the pool's size. Returns 0, 1 when a thread's scratch buffer
   could not be allocated, 2 for a tile other than 2 or 4. */
GEODE_EXPORT int32_t geode_conv_winograd(const float *x, const float *u, const float *bias,
                                         const float *z, float *y, int64_t n, int64_t c,
                                         int64_t m, int64_t h, int64_t w, int64_t oh,
                                         int64_t ow, int64_t pt, int64_t pl, int64_t relu,
                                         int64_t tile, int64_t threads)
{
    if (n <= 0 || m <= 0 || oh <= 0 || ow <= 0)
        return 0;
    if (tile != 2 && tile != 4)
        return 2;
    wino_t g = {x, u, bias, z, y, n, c, m, h, w, oh, ow, pt, pl, relu, tile};
    const int64_t t = threads > 0 ? threads : geode_num_threads();
    g.tw = (ow + tile - 1) / tile;
    g.isa = geode_winograd_isa();
    plan_items(&g, (oh + tile - 1) / tile, t);
    const int64_t outs = n * m * oh * ow * (z != NULL ? 2 : 1);
    /* row groups read short rows of several tile rows: the prefetches are written for
       one tile row (and narrow maps are small) */
    const int64_t bytes = (n * c * h * w + outs) * (int64_t)sizeof(float);
    g.prefetch = g.rp == 0 && g.ms == 1 && bytes > PREFETCH_MIN_BYTES;
    job_t job = {&g, 0, 0};
    int64_t chunks = t * CHUNKS_PER_THREAD;
    if (chunks > g.items)
        chunks = g.items;
    if (t > 1 && chunks >= 2 && !geode_pool_in_job())
        geode_parallel_for(chunk_fn, &job, chunks, t);
    else
        run_range(&g, 0, g.items, &job.failed);
    return atomic_load(&job.failed) ? 1 : 0;
}
