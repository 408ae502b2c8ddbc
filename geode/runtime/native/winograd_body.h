/* geode native runtime: the body of the Winograd F(2x2, 3x3) and F(4x4, 3x3) convolution,
   included by winograd.c once per instruction set, with WSUF (the functions' suffix) defined and a
   `#pragma GCC target` in force. Vectors are GCC vector extensions of 8 floats (one
   ymm register with AVX2 or AVX-512VL, SSE halves on the plain path); lanes are tiles of
   one tile row (see winograd.c for the layouts). */

#if WVL == 16
#define W_S02 {0, 4, 8, 12, 16, 20, 24, 28, 2, 6, 10, 14, 18, 22, 26, 30}
#define W_S13 {1, 5, 9, 13, 17, 21, 25, 29, 3, 7, 11, 15, 19, 23, 27, 31}
#define W_LO {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23}
#define W_HI {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31}
#define W_NEXT {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
#define W_ZIP_LO ((WVI){0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23})
#define W_ZIP_HI ((WVI){8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31})
#else
#define W_S02 {0, 4, 8, 12, 2, 6, 10, 14}
#define W_S13 {1, 5, 9, 13, 3, 7, 11, 15}
#define W_LO {0, 1, 2, 3, 8, 9, 10, 11}
#define W_HI {4, 5, 6, 7, 12, 13, 14, 15}
#define W_NEXT {1, 2, 3, 4, 5, 6, 7, 8}
#define W_ZIP_LO ZIP_LO
#define W_ZIP_HI ZIP_HI
#endif

#define WCAT2(a, b) a##_##b
#define WCAT(a, b) WCAT2(a, b)
#define WF(name) WCAT(name, WSUF)

/* WRI: output channels per product on this path (its vector registers hold WRI x 3
   accumulators) */

#ifndef WZMM
/* acc[r][j] = sum over k of u[r * c + k] * v[k * tb + 8 j], stored to out[r * tb + 8 j]:
   R output channels by NV vectors of tiles, every sum in k order from zero. */
static inline __attribute__((always_inline)) void WF(gemm)(int R, int NV, const float *u,
                                                          int64_t c, const float *v,
                                                          int64_t tb, float *out)
{
    v8 acc[WR][WMAXNV];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int j = 0; j < NV; j++)
            acc[r][j] = (v8){0};
    for (int64_t k = 0; k < c; k++) {
        v8 b[WMAXNV];
#pragma GCC unroll 4
        for (int j = 0; j < NV; j++)
            b[j] = vload(v + k * tb + 8 * j);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            const v8 a = vsplat(u[r * c + k]);
#pragma GCC unroll 4
            for (int j = 0; j < NV; j++)
                acc[r][j] += a * b[j];
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int j = 0; j < NV; j++)
            vstore(out + r * tb + 8 * j, acc[r][j]);
}
#else
/* The same products in 16-lane vectors: NV / 2 zmm vectors of tiles and, for an odd
   NV, one 8-lane tail; every lane's sum is the one above (fused, in k order from zero),
   so the result is the 8-lane path's, bit for bit. */
static inline __attribute__((always_inline)) void WF(gemm)(int R, int NV, const float *u,
                                                          int64_t c, const float *v,
                                                          int64_t tb, float *out)
{
    const int nz = NV / 2, tail = NV % 2;
    v16 acc[WR][WMAXNV / 2];
    v8 acct[WR];
#pragma GCC unroll 16
    for (int r = 0; r < R; r++) {
#pragma GCC unroll 4
        for (int j = 0; j < nz; j++)
            acc[r][j] = (v16){0};
        acct[r] = (v8){0};
    }
    for (int64_t k = 0; k < c; k++) {
        v16 b[WMAXNV / 2];
        v8 bt = {0};
#pragma GCC unroll 4
        for (int j = 0; j < nz; j++)
            b[j] = vload16(v + k * tb + 16 * j);
        if (tail)
            bt = vload(v + k * tb + 16 * nz);
#pragma GCC unroll 16
        for (int r = 0; r < R; r++) {
            const float a = u[r * c + k];
#pragma GCC unroll 4
            for (int j = 0; j < nz; j++)
                acc[r][j] += vsplat16(a) * b[j];
            if (tail)
                acct[r] += vsplat(a) * bt;
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; r++) {
#pragma GCC unroll 4
        for (int j = 0; j < nz; j++)
            vstore16(out + r * tb + 16 * j, acc[r][j]);
        if (tail)
            vstore(out + r * tb + 16 * nz, acct[r]);
    }
}
#endif

/* The products' functions g_R_NV (R output channels, NV vectors of 8 tiles) this path
   calls: R up to WRI; NV up to 3 on the 8-lane paths; 2 and 4 on the zmm path (1 or 2
   vectors of 16 tiles; up to WRI / 2 channels with 4), and the table of them. */
#define WG(R, NV) WCAT(WCAT(WF(g), R), NV)
#define WGEMM(R, NV)                                                                        \
    static void WG(R, NV)(const float *u, int64_t c, const float *v, int64_t tb, float *out) \
    {                                                                                       \
        WF(gemm)(R, NV, u, c, v, tb, out);                                                  \
    }
#define WGEMMS4(NV) WGEMM(1, NV) WGEMM(2, NV) WGEMM(3, NV) WGEMM(4, NV)
#define WGEMMS8(NV) WGEMMS4(NV) WGEMM(5, NV) WGEMM(6, NV) WGEMM(7, NV) WGEMM(8, NV)
#define WGEMMS16(NV)                                                                        \
    WGEMMS8(NV) WGEMM(9, NV) WGEMM(10, NV) WGEMM(11, NV) WGEMM(12, NV) WGEMM(13, NV)       \
    WGEMM(14, NV) WGEMM(15, NV) WGEMM(16, NV)
#define WSET4(NV) [NV][1] = WG(1, NV), [NV][2] = WG(2, NV), [NV][3] = WG(3, NV), [NV][4] = WG(4, NV)
#define WSET8(NV)                                                                           \
    WSET4(NV), [NV][5] = WG(5, NV), [NV][6] = WG(6, NV), [NV][7] = WG(7, NV),              \
    [NV][8] = WG(8, NV)
#define WSET16(NV)                                                                          \
    WSET8(NV), [NV][9] = WG(9, NV), [NV][10] = WG(10, NV), [NV][11] = WG(11, NV),          \
    [NV][12] = WG(12, NV), [NV][13] = WG(13, NV), [NV][14] = WG(14, NV),                  \
    [NV][15] = WG(15, NV), [NV][16] = WG(16, NV)
#if WRI == 16
WGEMMS16(2) WGEMMS8(4)
static const gemm_fn WF(g_gemms)[WMAXNV + 1][WR + 1] = {WSET16(2), WSET8(4)};
#elif WRI == 8
WGEMMS8(1) WGEMMS8(2) WGEMMS8(3)
static const gemm_fn WF(g_gemms)[WMAXNV + 1][WR + 1] = {WSET8(1), WSET8(2), WSET8(3)};
#else
WGEMMS4(1) WGEMMS4(2) WGEMMS4(3)
static const gemm_fn WF(g_gemms)[WMAXNV + 1][WR + 1] = {WSET4(1), WSET4(2), WSET4(3)};
#endif
#undef WSET16
#undef WSET8
#undef WSET4
#undef WGEMMS16
#undef WGEMMS8
#undef WGEMMS4
#undef WGEMM
#undef WG

/* rows[i] = input row y0 + i of plane from column col0, span floats: in place when the
   plane holds them, else the zero row (above or below the plane) or a copy with zeros
   past its borders in rowbuf. */
static inline __attribute__((always_inline)) void WF(input_rows)(const wino_t *g,
                                                                 const float *plane, int64_t y0,
                                                                 int n, int64_t col0,
                                                                 int64_t span, float *rowbuf,
                                                                 const float **rows)
{
    for (int i = 0; i < n; i++) {
        const int64_t iy = y0 + i;
        if (iy < 0 || iy >= g->h) {
            rows[i] = g_zero_row;
        } else if (col0 >= 0 && col0 + span <= g->w) {
            rows[i] = plane + iy * g->w + col0;
        } else {
            float *dst = rowbuf + i * WROW;
            border_copy(dst, plane + iy * g->w, col0, span, g->w);
            rows[i] = dst;
        }
    }
}

#if WVL == 8 /* F(2x2, 3x3): 8 lanes only */
/* V = B^T d B for every input channel of one item into v ([16][c][tb]). */
static void WF(input_transform)(const wino_t *g, const item_t *it, float *v, float *rowbuf)
{
    const int64_t tb = it->nv * 8, span = 2 * tb + 2;
    const int64_t col0 = 2 * it->tx0 - g->pl;
    for (int64_t ch = 0; ch < g->c; ch++) {
        const float *plane = g->x + (it->n * g->c + ch) * g->h * g->w;
        const float *rows[4];
        WF(input_rows)(g, plane, 2 * it->ty - g->pt, 4, col0, span, rowbuf, rows);
        for (int64_t j = 0; j < it->nv; j++) {
            v8 d[4][4];
            for (int i = 0; i < 4; i++) {
                const float *p = rows[i] + 16 * j;
                const v8 a = vload(p), b = vload(p + 8), e = vload(p + 2), f = vload(p + 10);
                d[i][0] = __builtin_shuffle(a, b, EVENS);
                d[i][1] = __builtin_shuffle(a, b, ODDS);
                d[i][2] = __builtin_shuffle(e, f, EVENS);
                d[i][3] = __builtin_shuffle(e, f, ODDS);
            }
            v8 t[4][4];
            for (int q = 0; q < 4; q++) {
                t[0][q] = d[0][q] - d[2][q];
                t[1][q] = d[1][q] + d[2][q];
                t[2][q] = d[2][q] - d[1][q];
                t[3][q] = d[1][q] - d[3][q];
            }
            float *out = v + ch * tb + 8 * j;
            const int64_t xs = pos_stride(g, tb); /* one position's matrix */
            for (int i = 0; i < 4; i++) {
                vstore(out + (4 * i + 0) * xs, t[i][0] - t[i][2]);
                vstore(out + (4 * i + 1) * xs, t[i][1] + t[i][2]);
                vstore(out + (4 * i + 2) * xs, t[i][2] - t[i][1]);
                vstore(out + (4 * i + 3) * xs, t[i][1] - t[i][3]);
            }
        }
    }
}

#endif

/* Store nvec vectors o (WVL nvec outputs of one row, count of them inside the image)
   to dst, adding the residual zs (NULL: none) and applying the Relu. */
static inline __attribute__((always_inline)) void WF(store_row)(const wino_t *g, float *dst,
                                                                const float *zs, WV *o,
                                                                int nvec, int64_t count)
{
    if (count == WVL * nvec) {
#pragma GCC unroll 4
        for (int q = 0; q < nvec; q++) {
            if (zs != NULL)
                o[q] += WLOAD(zs + WVL * q);
            if (g->relu)
                o[q] = WRELU(o[q]);
            WSTORE(dst + WVL * q, o[q]);
        }
        return;
    }
    float tmp[4 * WVL];
    for (int q = 0; q < nvec; q++)
        WSTORE(tmp + WVL * q, o[q]);
    for (int64_t q = 0; q < count; q++) {
        float val = tmp[q];
        if (zs != NULL)
            val += zs[q];
        if (g->relu && val < 0.0f)
            val = 0.0f;
        dst[q] = val;
    }
}

#if WVL == 8
/* Y = A^T m A for output channel co (m: mb[xi][r][tb], positions ms apart), then bias,
   residual, Relu. */
static void WF(output_transform)(const wino_t *g, const item_t *it, const float *mb, int64_t ms,
                                 int r, int64_t co)
{
    const int64_t tb = it->nv * 8;
    const WV bias = WSPLAT(g->bias != NULL ? g->bias[co] : 0.0f);
    const int64_t plane = (it->n * g->m + co) * g->oh * g->ow;
    for (int64_t j = 0; j < it->nv; j++) {
        const int64_t ox = 2 * (it->tx0 + 8 * j);
        if (ox >= g->ow)
            break;
        WV m[16];
        for (int xi = 0; xi < 16; xi++)
            m[xi] = WLOAD(mb + xi * ms + r * tb + 8 * j);
        WV a[2][4];
        for (int q = 0; q < 4; q++) {
            a[0][q] = m[q] + m[4 + q] + m[8 + q];
            a[1][q] = m[4 + q] - m[8 + q] - m[12 + q];
        }
        const int64_t count = g->ow - ox < 16 ? g->ow - ox : 16;
        for (int i = 0; i < 2; i++) {
            const int64_t oy = 2 * it->ty + i;
            if (oy >= g->oh)
                break;
            const WV y0 = a[i][0] + a[i][1] + a[i][2] + bias;
            const WV y1 = a[i][1] - a[i][2] - a[i][3] + bias;
            WV o[2] = {__builtin_shuffle(y0, y1, ZIP_LO), __builtin_shuffle(y0, y1, ZIP_HI)};
            WF(store_row)(g, g->y + plane + oy * g->ow + ox,
                          g->z != NULL ? g->z + plane + oy * g->ow + ox : NULL, o, 2, count);
        }
    }
}
#endif

/* ---------------------------------------------------------------- F(4x4, 3x3) */

/* out = B^T d for one column of 6 (B^T of F(4x4, 3x3), points 0, 1, -1, 2, -2). */
static inline __attribute__((always_inline)) void WF(bt6)(const WV *d, int sd, WV *out,
                                                         int so)
{
    const WV four = WSPLAT(4.0f), five = WSPLAT(5.0f), two = WSPLAT(2.0f);
    const WV a = d[4 * sd] - four * d[2 * sd], b = d[3 * sd] - four * d[sd];
    const WV e = d[4 * sd] - d[2 * sd], f = two * (d[3 * sd] - d[sd]);
    out[0] = four * d[0] - five * d[2 * sd] + d[4 * sd];
    out[so] = a + b;
    out[2 * so] = a - b;
    out[3 * so] = e + f;
    out[4 * so] = e - f;
    out[5 * so] = four * d[sd] - five * d[3 * sd] + d[5 * sd];
}

/* Lanes t of columns 0..3 of a row: c[j][t] = p[4 t + j] for WVL tiles, from 4 WVL
   floats. */
static inline __attribute__((always_inline)) void WF(cols4v)(WV a0, WV a1, WV a2, WV a3,
                                                             WV *c)
{
    const WVI s02 = W_S02, s13 = W_S13, lo = W_LO, hi = W_HI;
    const WV p02 = __builtin_shuffle(a0, a1, s02), q02 = __builtin_shuffle(a2, a3, s02);
    const WV p13 = __builtin_shuffle(a0, a1, s13), q13 = __builtin_shuffle(a2, a3, s13);
    c[0] = __builtin_shuffle(p02, q02, lo);
    c[2] = __builtin_shuffle(p02, q02, hi);
    c[1] = __builtin_shuffle(p13, q13, lo);
    c[3] = __builtin_shuffle(p13, q13, hi);
}

/* cols4v of the 4 WVL floats at p. */
static inline __attribute__((always_inline)) void WF(cols4)(const float *p, WV *c)
{
    WF(cols4v)(WLOAD(p), WLOAD(p + WVL), WLOAD(p + 2 * WVL), WLOAD(p + 3 * WVL), c);
}

/* B^T d B of one lane vector's 6 x 6 windows d, its 36 points stored at
   out + point * xs (xs: one point's matrix). */
static inline __attribute__((always_inline)) void WF(input_points)(WV d[6][6], float *out,
                                                                   int64_t xs)
{
    WV t[6][6];
    for (int q = 0; q < 6; q++)
        WF(bt6)(&d[0][q], 6, &t[0][q], 6); /* down each column */
    for (int i = 0; i < 6; i++) {
        WV r[6];
        WF(bt6)(t[i], 1, r, 1); /* along each row */
        for (int q = 0; q < 6; q++)
            WSTORE(out + (6 * i + q) * xs, r[q]);
    }
}

#ifdef WZMM
/* The mask of the columns [col, col + 16) inside [0, w). */
static inline __attribute__((always_inline)) __mmask16 WF(colmask)(int64_t col, int64_t w)
{
    const int64_t lo = col >= 0 ? 0 : -col < 16 ? -col : 16;
    const int64_t hi = w - col >= 16 ? 16 : w - col > 0 ? w - col : 0;
    return (__mmask16)(hi > lo ? ((1u << hi) - 1u) & ~((1u << lo) - 1u) : 0u);
}

/* 16 floats of row from column col, zeros outside mask: a masked load, which reads no
   column outside the mask. */
static inline __attribute__((always_inline)) v16 WF(mload)(const float *row, int64_t col,
                                                          __mmask16 mask)
{
    return (v16)_mm512_maskz_loadu_ps(mask, row + col);
}

/* The 6 window rows of tile row ty (the plane's first row, with ok[i] 0, above or below
   the plane). */
static inline __attribute__((always_inline)) void WF(plane_rows)(const wino_t *g,
                                                                 const float *plane,
                                                                 int64_t ty,
                                                                 const float **rows,
                                                                 int *ok)
{
    for (int i = 0; i < 6; i++) {
        const int64_t iy = 4 * ty - g->pt + i;
        ok[i] = iy >= 0 && iy < g->h;
        rows[i] = ok[i] ? plane + iy * g->w : plane;
    }
}

/* Window row i of a lane vector: 4 masked loads (floats 16 k.. from row r[k], or zeros
   where o[k] is 0, columns col[k] under mask[k]) turned to columns 0 to 3, and columns 4
   and 5 (of the last lane: columns c4 and c4 + 1 of row `last` where okl, in4, in5). */
static inline __attribute__((always_inline)) void
WF(window_row)(const float *const *r, const int *o, const int64_t *col, const __mmask16 *mask,
               const float *last, int okl, int64_t c4, int in4, int in5, v16 *d)
{
    const v16i next = W_NEXT;
    const __mmask16 none = 0;
    WF(cols4v)(WF(mload)(r[0], col[0], o[0] ? mask[0] : none),
               WF(mload)(r[1], col[1], o[1] ? mask[1] : none),
               WF(mload)(r[2], col[2], o[2] ? mask[2] : none),
               WF(mload)(r[3], col[3], o[3] ? mask[3] : none), d);
    const float e4 = okl && in4 ? last[c4] : 0.0f, e5 = okl && in5 ? last[c4 + 1] : 0.0f;
    d[4] = __builtin_shuffle(d[0], WSPLAT(e4), next);
    d[5] = __builtin_shuffle(d[1], WSPLAT(e5), next);
}

/* V = B^T d B for every input channel of one item into v ([36][c][tb]): the zmm path's
   vectors of 16 tiles, their 66 columns read by masked loads (zeros past the plane's
   borders, no copies; the masks computed once an item). */
static void WF(input_transform4)(const wino_t *g, const item_t *it, float *v, float *rowbuf)
{
    (void)rowbuf;
    const int64_t tb = it->nv * WVL, w = g->w;
    const int64_t xs = pos_stride(g, tb); /* one position's matrix */
    int64_t col[ZMAXNV][4];
    __mmask16 mask[ZMAXNV][4];
    for (int64_t j = 0; j < it->nv; j++)
        for (int k = 0; k < 4; k++) {
            col[j][k] = 4 * (it->tx0 + WVL * j) - g->pl + 16 * k;
            mask[j][k] = WF(colmask)(col[j][k], w);
        }
    for (int64_t ch = 0; ch < g->c; ch++) {
        const float *plane = g->x + (it->n * g->c + ch) * g->h * w;
        const float *rows[6];
        int ok[6];
        WF(plane_rows)(g, plane, it->ty, rows, ok);
        for (int64_t j = 0; j < it->nv; j++) {
            const int64_t c4 = col[j][0] + 64;
            const int in4 = c4 >= 0 && c4 < w, in5 = c4 + 1 >= 0 && c4 + 1 < w;
            v16 d[6][6];
            for (int i = 0; i < 6; i++) {
                const float *r[4] = {rows[i], rows[i], rows[i], rows[i]};
                const int o[4] = {ok[i], ok[i], ok[i], ok[i]};
                WF(window_row)(r, o, col[j], mask[j], rows[i], ok[i], c4, in4, in5, d[i]);
            }
            WF(input_points)(d, v + ch * tb + WVL * j, xs);
        }
    }
}

/* V = B^T d B for every input channel of one item of row groups on the zmm path (tw 4
   or 8: rp = 4 or 2 tile rows a vector, a row's 4 tw columns whole vectors of 16 or
   32 floats; lane s * tw + tx is tile tx of tile row ty + rp j + s) into v ([36][c][tb]),
   read by masked loads. Columns 4 and 5 of a lane are columns 0 and 1 of the next, but
   at a row's last tile (its row's columns 4 tw - pl and 4 tw + 1 - pl). */
static void WF(input_transform4_rows)(const wino_t *g, const item_t *it, float *v,
                                      float *rowbuf)
{
    (void)rowbuf;
    const int64_t tb = it->nv * WVL, tw = g->tw, rp = g->rp, seg = 4 * tw, w = g->w;
    const int64_t xs = pos_stride(g, tb); /* one position's matrix */
    int64_t col[4];
    __mmask16 mask[4];
    int part[4]; /* the group's row of floats 16 k.. of the lanes' 64 columns */
    for (int k = 0; k < 4; k++) {
        part[k] = (int)(16 * k / seg);
        col[k] = 16 * k % seg - g->pl;
        mask[k] = WF(colmask)(col[k], w);
    }
    const int64_t c4 = seg - g->pl;
    const int in4 = c4 >= 0 && c4 < w, in5 = c4 + 1 >= 0 && c4 + 1 < w;
    for (int64_t ch = 0; ch < g->c; ch++) {
        const float *plane = g->x + (it->n * g->c + ch) * g->h * w;
        for (int64_t j = 0; j < it->nv; j++) {
            const float *rows[4][6]; /* [row of the group][window row] */
            int ok[4][6];
            for (int64_t s = 0; s < rp; s++)
                WF(plane_rows)(g, plane, it->ty + rp * j + s, rows[s], ok[s]);
            v16 d[6][6];
            for (int i = 0; i < 6; i++) {
                const float *r[4] = {rows[part[0]][i], rows[part[1]][i], rows[part[2]][i],
                                     rows[part[3]][i]};
                const int o[4] = {ok[part[0]][i], ok[part[1]][i], ok[part[2]][i],
                                  ok[part[3]][i]};
                WF(window_row)(r, o, col, mask, rows[rp - 1][i], ok[rp - 1][i], c4, in4, in5,
                               d[i]);
                for (int64_t s = 0; s + 1 < rp; s++) {
                    d[i][4][s * tw + tw - 1] = ok[s][i] && in4 ? rows[s][i][c4] : 0.0f;
                    d[i][5][s * tw + tw - 1] = ok[s][i] && in5 ? rows[s][i][c4 + 1] : 0.0f;
                }
            }
            WF(input_points)(d, v + ch * tb + WVL * j, xs);
        }
    }
}
#else
/* V = B^T d B for every input channel of one item into v ([36][c][tb]). Each vector of
   WVL tiles reads its 4 WVL + 2 columns in place, or from a copy with zeros past the
   plane's borders when its window crosses one (so only the vectors at a border copy). */
static void WF(input_transform4)(const wino_t *g, const item_t *it, float *v, float *rowbuf)
{
    const int64_t tb = it->nv * WVL;
    const int64_t xs = pos_stride(g, tb); /* one position's matrix */
    const WVI next = W_NEXT;
    for (int64_t ch = 0; ch < g->c; ch++) {
        const float *plane = g->x + (it->n * g->c + ch) * g->h * g->w;
        for (int64_t j = 0; j < it->nv; j++) {
            const int64_t col0 = 4 * (it->tx0 + WVL * j) - g->pl;
            const float *rows[6];
            WF(input_rows)(g, plane, 4 * it->ty - g->pt, 6, col0, 4 * WVL + 2, rowbuf, rows);
            WV d[6][6];
            for (int i = 0; i < 6; i++) {
                const float *p = rows[i];
                WF(cols4)(p, d[i]);
                /* columns 4 and 5: columns 0 and 1 one tile on, p[4 WVL] and p[4 WVL + 1]
                   last */
                d[i][4] = __builtin_shuffle(d[i][0], WSPLAT(p[4 * WVL]), next);
                d[i][5] = __builtin_shuffle(d[i][1], WSPLAT(p[4 * WVL + 1]), next);
            }
            WF(input_points)(d, v + ch * tb + WVL * j, xs);
        }
    }
}

/* V = B^T d B for every input channel of one item of row groups (g->rp > 0; 8 lanes: tw
   2, 4 or 5 to 8 tiles a row, 16 lanes: 4 or 8; a vector's lane s * tw + tx is tile tx of
   tile row ty + rp j + s)
   into v ([36][c][tb]). Lanes of a group's row hold consecutive tiles, so columns 4 and
   5 of a lane are columns 0 and 1 of the next, except for a row's last tile (its row's
   columns 4 tw and 4 tw + 1). */
static void WF(input_transform4_rows)(const wino_t *g, const item_t *it, float *v,
                                      float *rowbuf)
{
    const int64_t tb = it->nv * WVL, tw = g->tw, rp = g->rp;
    const int64_t seg = rp > 1 ? 4 * tw : 4 * WVL;
    /* one tile row a vector (5 to 8 tiles): a whole vector's 4 WVL + 2 columns read,
       zeros (or columns never stored) past the row's tiles */
    const int64_t span = seg + 2;
    const int64_t xs = pos_stride(g, tb); /* one position's matrix */
    const WVI next = W_NEXT;
    for (int64_t ch = 0; ch < g->c; ch++) {
        const float *plane = g->x + (it->n * g->c + ch) * g->h * g->w;
        for (int64_t j = 0; j < it->nv; j++) {
            const float *rows[4][6]; /* [row of the group][window row] */
            for (int64_t s = 0; s < rp; s++)
                WF(input_rows)(g, plane, 4 * (it->ty + rp * j + s) - g->pt, 6, -g->pl, span,
                               rowbuf + 6 * s * WROW, rows[s]);
            WV d[6][6];
            for (int i = 0; i < 6; i++) {
                float q[4 * WVL];
                for (int k = 0; k < WVL / 2; k++) { /* floats 8 k.. of the lanes' columns */
                    const int64_t f = 8 * k;
                    vstore(q + f, vload(rows[f / seg][i] + f % seg)); /* rp 1: row 0 */
                }
                WF(cols4)(q, d[i]);
                WV c4 = __builtin_shuffle(d[i][0], WSPLAT(rows[rp - 1][i][seg]), next);
                WV c5 = __builtin_shuffle(d[i][1], WSPLAT(rows[rp - 1][i][seg + 1]), next);
                for (int64_t s = 0; s + 1 < rp; s++) {
                    c4[s * tw + tw - 1] = rows[s][i][seg];
                    c5[s * tw + tw - 1] = rows[s][i][seg + 1];
                }
                d[i][4] = c4;
                d[i][5] = c5;
            }
            WF(input_points)(d, v + ch * tb + WVL * j, xs);
        }
    }
}

#endif

/* out[0..3] = A^T m for one column of 6. */
static inline __attribute__((always_inline)) void WF(at6)(const WV *m, int sm, WV *out,
                                                         int so)
{
    const WV two = WSPLAT(2.0f), four = WSPLAT(4.0f), eight = WSPLAT(8.0f);
    const WV s12 = m[sm] + m[2 * sm], d12 = m[sm] - m[2 * sm];
    const WV s34 = m[3 * sm] + m[4 * sm], d34 = m[3 * sm] - m[4 * sm];
    out[0] = m[0] + s12 + s34;
    out[so] = d12 + two * d34;
    out[2 * so] = s12 + four * s34;
    out[3 * so] = d12 + eight * d34 + m[5 * sm];
}

/* The column half of an F(4x4) output transform: a[i][q] = (A^T m)[i][q] for the
   36 points of one lane vector, m[xi] read at m0 + xi * ms (m0: the vector's first
   point, ms: one position's products, padded). */
static inline __attribute__((always_inline)) void WF(output_columns)(const float *m0, int64_t tb,
                                                                     int64_t ms, WV a[4][6])
{
#pragma GCC unroll 6
    for (int q = 0; q < 6; q++) {
        WV m[6]; /* column q's points, loaded as the transform needs them */
#pragma GCC unroll 6
        for (int k = 0; k < 6; k++)
            m[k] = WLOAD(m0 + (6 * k + q) * ms);
        WF(at6)(m, 1, &a[0][q], 6);
    }
}

/* Output row i of the lane vector's tiles from its column half (ai = a[i]): the row
   half of the transform, plus bias, turned from point-major to column-major: o[k] holds
   the 4 outputs of WVL / 4 tiles' row, in output order. */
static inline __attribute__((always_inline)) void WF(output_row)(const WV ai[6], WV bias, WV o[4])
{
    WV y[4];
    WF(at6)(ai, 1, y, 1);
    for (int q = 0; q < 4; q++)
        y[q] += bias;
    const WV e = __builtin_shuffle(y[0], y[2], W_ZIP_LO);
    const WV f = __builtin_shuffle(y[1], y[3], W_ZIP_LO);
    const WV e2 = __builtin_shuffle(y[0], y[2], W_ZIP_HI);
    const WV f2 = __builtin_shuffle(y[1], y[3], W_ZIP_HI);
    o[0] = __builtin_shuffle(e, f, W_ZIP_LO);
    o[1] = __builtin_shuffle(e, f, W_ZIP_HI);
    o[2] = __builtin_shuffle(e2, f2, W_ZIP_LO);
    o[3] = __builtin_shuffle(e2, f2, W_ZIP_HI);
}

/* Y = A^T m A for output channel co (m: mb[xi][r][tb], 36 positions ms apart), then bias,
   residual, Relu. */
static void WF(output_transform4)(const wino_t *g, const item_t *it, const float *mb, int64_t ms,
                                  int r, int64_t co)
{
    const int64_t tb = it->nv * WVL;
    const WV bias = WSPLAT(g->bias != NULL ? g->bias[co] : 0.0f);
    const int64_t plane = (it->n * g->m + co) * g->oh * g->ow;
    for (int64_t j = 0; j < it->nv; j++) {
        const int64_t ox = 4 * (it->tx0 + WVL * j);
        if (ox >= g->ow)
            break;
        WV a[4][6];
        WF(output_columns)(mb + r * tb + WVL * j, tb, ms, a);
        const int64_t count = g->ow - ox < 4 * WVL ? g->ow - ox : 4 * WVL;
        for (int i = 0; i < 4; i++) {
            const int64_t oy = 4 * it->ty + i;
            if (oy >= g->oh)
                break;
            WV o[4];
            WF(output_row)(a[i], bias, o);
            WF(store_row)(g, g->y + plane + oy * g->ow + ox,
                          g->z != NULL ? g->z + plane + oy * g->ow + ox : NULL, o, 4, count);
        }
    }
}

/* Y = A^T m A for output channel co of an item of row groups (g->rp > 0; m:
   mb[xi][r][tb], 36 positions ms apart), then bias, residual, Relu: a lane vector's 4 output rows
   of every tile row of its group (a row's 4 tw outputs: whole vectors of o when rp > 1). */
static void WF(output_transform4_rows)(const wino_t *g, const item_t *it, const float *mb,
                                       int64_t ms, int r, int64_t co)
{
    const int64_t tb = it->nv * WVL, tw = g->tw, rp = g->rp;
    const int64_t seg = rp > 1 ? 4 * tw : 4 * WVL;
    const WV bias = WSPLAT(g->bias != NULL ? g->bias[co] : 0.0f);
    const int64_t plane = (it->n * g->m + co) * g->oh * g->ow;
    const int64_t count = g->ow < seg ? g->ow : seg; /* the row's columns */
    for (int64_t j = 0; j < it->nv; j++) {
        WV a[4][6];
        WF(output_columns)(mb + r * tb + WVL * j, tb, ms, a);
        for (int i = 0; i < 4; i++) {
            WV o[4];
            WF(output_row)(a[i], bias, o);
            for (int64_t s = 0; s < rp; s++) { /* seg floats of o a row of the group */
                const int64_t oy = 4 * (it->ty + rp * j + s) + i;
                if (oy >= g->oh)
                    break;
                float *dst = g->y + plane + oy * g->ow;
                const float *zs = g->z != NULL ? g->z + plane + oy * g->ow : NULL;
                WF(store_row)(g, dst, zs, o + s * seg / WVL, (int)(seg / WVL), count);
            }
        }
    }
}

/* One item of `points` (16: F(2x2, 3x3), 36: F(4x4, 3x3)) transformed points: a chunk
   of one tile row (or of row groups) of one image, every output channel. While a group
   of output channels multiplies, the lines the next group's epilogue reads (Z) and
   writes (Y) are prefetched, and a share of the next item's input rows (`next`, NULL:
   none), a few after each product (prefetch_step). */
static inline __attribute__((always_inline)) void WF(run_points)(const wino_t *g,
                                                                 const item_t *it,
                                                                 const item_t *next,
                                                                 float *scratch, int points)
{
    float *v = scratch;
    float *mb = v + points * (g->c * WMAXTB + WVPAD);
    float *rowbuf = mb + points * (WR * WMAXTB + WVPAD);
    const int64_t tb = it->nv * WVL, xs = pos_stride(g, tb);
    /* output channels a product: WRI (zmm: half of them with two zmm vectors of tiles,
       so that the accumulators fit the 32 registers) */
    const int wr = WVL == 16 && it->nv > 1 ? WRI / 2 : WRI;
    const int64_t ms = wr * tb + WVPAD; /* one position's products, padded as xs */
    const int64_t steps = (g->m + wr - 1) / wr * points;
    int64_t step = 0;
    prefetch_step(g, it, next, 0, g->m < wr ? (int)g->m : wr, 0, -1, steps);
#if WVL == 8
    if (points == 16)
        WF(input_transform)(g, it, v, rowbuf);
    else
#endif
    if (g->rp > 0)
        WF(input_transform4_rows)(g, it, v, rowbuf);
    else
        WF(input_transform4)(g, it, v, rowbuf);
    for (int64_t co = it->co0; co < it->co1; co += wr) {
        const int r = it->co1 - co < wr ? (int)(it->co1 - co) : wr;
        const gemm_fn fn = WF(g_gemms)[it->nv * (WVL / 8)][r];
        for (int xi = 0; xi < points; xi++) {
            fn(g->u + (xi * g->m + co) * g->c, g->c, v + xi * xs, tb, mb + xi * ms);
            prefetch_step(g, it, next, co, r, xi, step++, steps);
        }
        for (int q = 0; q < r; q++) {
#if WVL == 8
            if (points == 16)
                WF(output_transform)(g, it, mb, ms, q, co + q);
            else
#endif
            if (g->rp > 0)
                WF(output_transform4_rows)(g, it, mb, ms, q, co + q);
            else
                WF(output_transform4)(g, it, mb, ms, q, co + q);
        }
    }
}

#if WVL == 8
/* One F(2x2, 3x3) item. */
static void WF(run_item)(const wino_t *g, const item_t *it, const item_t *next,
                         float *scratch)
{
    WF(run_points)(g, it, next, scratch, 16);
}
#endif

/* One F(4x4, 3x3) item. */
static void WF(run_item4)(const wino_t *g, const item_t *it, const item_t *next,
                          float *scratch)
{
    WF(run_points)(g, it, next, scratch, 36);
}

#undef WF
#undef WCAT
#undef WCAT2
#undef W_S02
#undef W_S13
#undef W_LO
#undef W_HI
#undef W_NEXT
#undef W_ZIP_LO
#undef W_ZIP_HI
