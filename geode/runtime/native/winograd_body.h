/* geode native runtime: the body of the Winograd F(2x2, 3x3) and F(4x4, 3x3) convolution,
   included by winograd.c once per instruction set, with WSUF (the functions' suffix) defined and a
   `#pragma GCC target` in force. Vectors are GCC vector extensions of 8 floats (one
   ymm register with AVX2 or AVX-512VL, SSE halves on the plain path); lanes are tiles of
   one tile row (see winograd.c for the layouts). */

#define WCAT2(a, b) a##_##b
#define WCAT(a, b) WCAT2(a, b)
#define WF(name) WCAT(name, WSUF)

/* WRI: output channels per product on this path (its vector registers hold WRI x 3
   accumulators) */

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

#define WGEMM(R, NV)                                                                        \
    static void WCAT(WCAT(WF(g), R), NV)(const float *u, int64_t c, const float *v,        \
                                         int64_t tb, float *out)                            \
    {                                                                                       \
        WF(gemm)(R, NV, u, c, v, tb, out);                                                  \
    }
#define WGEMMS(NV)                                                                          \
    WGEMM(1, NV) WGEMM(2, NV) WGEMM(3, NV) WGEMM(4, NV) WGEMM(5, NV) WGEMM(6, NV)          \
    WGEMM(7, NV) WGEMM(8, NV)
WGEMMS(1) WGEMMS(2) WGEMMS(3)

#define WROWS(NV)                                                                           \
    {0,                                                                                     \
     WCAT(WCAT(WF(g), 1), NV),                                                              \
     WCAT(WCAT(WF(g), 2), NV),                                                              \
     WCAT(WCAT(WF(g), 3), NV),                                                              \
     WCAT(WCAT(WF(g), 4), NV),                                                              \
     WCAT(WCAT(WF(g), 5), NV),                                                              \
     WCAT(WCAT(WF(g), 6), NV),                                                              \
     WCAT(WCAT(WF(g), 7), NV),                                                              \
     WCAT(WCAT(WF(g), 8), NV)}
static const gemm_fn WF(g_gemms)[WMAXNV + 1][WR + 1] = {{0}, WROWS(1), WROWS(2), WROWS(3)};
#undef WROWS
#undef WGEMMS

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
            const int64_t xs = g->c * tb; /* one position's matrix */
            for (int i = 0; i < 4; i++) {
                vstore(out + (4 * i + 0) * xs, t[i][0] - t[i][2]);
                vstore(out + (4 * i + 1) * xs, t[i][1] + t[i][2]);
                vstore(out + (4 * i + 2) * xs, t[i][2] - t[i][1]);
                vstore(out + (4 * i + 3) * xs, t[i][1] - t[i][3]);
            }
        }
    }
}

/* Store nvec vectors o (8 nvec outputs of one row, count of them inside the image) to
   dst, adding the residual zs (NULL: none) and applying the Relu. */
static inline __attribute__((always_inline)) void WF(store_row)(const wino_t *g, float *dst,
                                                                const float *zs, v8 *o,
                                                                int nvec, int64_t count)
{
    if (count == 8 * nvec) {
        for (int q = 0; q < nvec; q++) {
            if (zs != NULL)
                o[q] += vload(zs + 8 * q);
            if (g->relu)
                o[q] = vrelu(o[q]);
            vstore(dst + 8 * q, o[q]);
        }
        return;
    }
    float tmp[32];
    for (int q = 0; q < nvec; q++)
        vstore(tmp + 8 * q, o[q]);
    for (int64_t q = 0; q < count; q++) {
        float val = tmp[q];
        if (zs != NULL)
            val += zs[q];
        if (g->relu && val < 0.0f)
            val = 0.0f;
        dst[q] = val;
    }
}

/* Y = A^T m A for output channel co (m: mb[xi][r][tb]), then bias, residual, Relu. */
static void WF(output_transform)(const wino_t *g, const item_t *it, const float *mb, int r,
                                 int64_t co)
{
    const int64_t tb = it->nv * 8;
    const v8 bias = vsplat(g->bias != NULL ? g->bias[co] : 0.0f);
    const int64_t plane = (it->n * g->m + co) * g->oh * g->ow;
    for (int64_t j = 0; j < it->nv; j++) {
        const int64_t ox = 2 * (it->tx0 + 8 * j);
        if (ox >= g->ow)
            break;
        v8 m[16];
        for (int xi = 0; xi < 16; xi++)
            m[xi] = vload(mb + (xi * WR + r) * tb + 8 * j);
        v8 a[2][4];
        for (int q = 0; q < 4; q++) {
            a[0][q] = m[q] + m[4 + q] + m[8 + q];
            a[1][q] = m[4 + q] - m[8 + q] - m[12 + q];
        }
        const int64_t count = g->ow - ox < 16 ? g->ow - ox : 16;
        for (int i = 0; i < 2; i++) {
            const int64_t oy = 2 * it->ty + i;
            if (oy >= g->oh)
                break;
            const v8 y0 = a[i][0] + a[i][1] + a[i][2] + bias;
            const v8 y1 = a[i][1] - a[i][2] - a[i][3] + bias;
            v8 o[2] = {__builtin_shuffle(y0, y1, ZIP_LO), __builtin_shuffle(y0, y1, ZIP_HI)};
            WF(store_row)(g, g->y + plane + oy * g->ow + ox,
                          g->z != NULL ? g->z + plane + oy * g->ow + ox : NULL, o, 2, count);
        }
    }
}

/* ---------------------------------------------------------------- F(4x4, 3x3) */

/* out = B^T d for one column of 6 (B^T of F(4x4, 3x3), points 0, 1, -1, 2, -2). */
static inline __attribute__((always_inline)) void WF(bt6)(const v8 *d, int sd, v8 *out,
                                                         int so)
{
    const v8 four = vsplat(4.0f), five = vsplat(5.0f), two = vsplat(2.0f);
    const v8 a = d[4 * sd] - four * d[2 * sd], b = d[3 * sd] - four * d[sd];
    const v8 e = d[4 * sd] - d[2 * sd], f = two * (d[3 * sd] - d[sd]);
    out[0] = four * d[0] - five * d[2 * sd] + d[4 * sd];
    out[so] = a + b;
    out[2 * so] = a - b;
    out[3 * so] = e + f;
    out[4 * so] = e - f;
    out[5 * so] = four * d[sd] - five * d[3 * sd] + d[5 * sd];
}

/* Lanes t of columns 0..3 of a row: c[j][t] = p[4 t + j] for 8 tiles, from 32 floats. */
static inline __attribute__((always_inline)) void WF(cols4)(const float *p, v8 *c)
{
    const v8 a0 = vload(p), a1 = vload(p + 8), a2 = vload(p + 16), a3 = vload(p + 24);
    const v8i s02 = {0, 4, 8, 12, 2, 6, 10, 14}, s13 = {1, 5, 9, 13, 3, 7, 11, 15};
    const v8i lo = {0, 1, 2, 3, 8, 9, 10, 11}, hi = {4, 5, 6, 7, 12, 13, 14, 15};
    const v8 p02 = __builtin_shuffle(a0, a1, s02), q02 = __builtin_shuffle(a2, a3, s02);
    const v8 p13 = __builtin_shuffle(a0, a1, s13), q13 = __builtin_shuffle(a2, a3, s13);
    c[0] = __builtin_shuffle(p02, q02, lo);
    c[2] = __builtin_shuffle(p02, q02, hi);
    c[1] = __builtin_shuffle(p13, q13, lo);
    c[3] = __builtin_shuffle(p13, q13, hi);
}

/* B^T d B of one lane vector's 6 x 6 windows d, its 36 points stored at
   out + point * xs (xs: one point's matrix). */
static inline __attribute__((always_inline)) void WF(input_points)(v8 d[6][6], float *out,
                                                                   int64_t xs)
{
    v8 t[6][6];
    for (int q = 0; q < 6; q++)
        WF(bt6)(&d[0][q], 6, &t[0][q], 6); /* down each column */
    for (int i = 0; i < 6; i++) {
        v8 r[6];
        WF(bt6)(t[i], 1, r, 1); /* along each row */
        for (int q = 0; q < 6; q++)
            vstore(out + (6 * i + q) * xs, r[q]);
    }
}

/* V = B^T d B for every input channel of one item into v ([36][c][tb]). */
static void WF(input_transform4)(const wino_t *g, const item_t *it, float *v, float *rowbuf)
{
    const int64_t tb = it->nv * 8, span = 4 * tb + 4;
    const int64_t col0 = 4 * it->tx0 - g->pl;
    const int64_t xs = g->c * tb; /* one position's matrix */
    for (int64_t ch = 0; ch < g->c; ch++) {
        const float *plane = g->x + (it->n * g->c + ch) * g->h * g->w;
        const float *rows[6];
        WF(input_rows)(g, plane, 4 * it->ty - g->pt, 6, col0, span, rowbuf, rows);
        for (int64_t j = 0; j < it->nv; j++) {
            v8 d[6][6];
            const v8i next = {1, 2, 3, 4, 5, 6, 7, 8};
            for (int i = 0; i < 6; i++) {
                const float *p = rows[i] + 32 * j;
                WF(cols4)(p, d[i]);
                /* columns 4 and 5: columns 0 and 1 one tile on, p[32] and p[33] last */
                d[i][4] = __builtin_shuffle(d[i][0], vsplat(p[32]), next);
                d[i][5] = __builtin_shuffle(d[i][1], vsplat(p[33]), next);
            }
            WF(input_points)(d, v + ch * tb + 8 * j, xs);
        }
    }
}

/* V = B^T d B for every input channel of one item of row groups (g->rp > 0, tw 2, 4 or
   5 to 8 tiles a row: a vector's lane s * tw + tx is tile tx of tile row ty + rp j + s)
   into v ([36][c][tb]). Lanes of a group's row hold consecutive tiles, so columns 4 and
   5 of a lane are columns 0 and 1 of the next, except for a row's last tile (its row's
   columns 4 tw and 4 tw + 1). */
static void WF(input_transform4_rows)(const wino_t *g, const item_t *it, float *v,
                                      float *rowbuf)
{
    const int64_t tb = it->nv * 8, tw = g->tw, rp = g->rp, seg = rp > 1 ? 4 * tw : 32;
    /* one tile row a vector (5 to 8 tiles): a whole vector's 34 columns read, zeros (or
       columns never stored) past the row's tiles */
    const int64_t span = seg + 2;
    const int64_t xs = g->c * tb; /* one position's matrix */
    const v8i next = {1, 2, 3, 4, 5, 6, 7, 8};
    for (int64_t ch = 0; ch < g->c; ch++) {
        const float *plane = g->x + (it->n * g->c + ch) * g->h * g->w;
        for (int64_t j = 0; j < it->nv; j++) {
            const float *rows[4][6]; /* [row of the group][window row] */
            for (int64_t s = 0; s < rp; s++)
                WF(input_rows)(g, plane, 4 * (it->ty + rp * j + s) - g->pt, 6, -g->pl, span,
                               rowbuf + 6 * s * WROW, rows[s]);
            v8 d[6][6];
            for (int i = 0; i < 6; i++) {
                float q32[32];
                for (int k = 0; k < 4; k++) { /* floats 8 k.. of the lanes' 32 columns */
                    const int64_t f = 8 * k;
                    vstore(q32 + f, vload(rows[f / seg][i] + f % seg)); /* rp 1: row 0 */
                }
                WF(cols4)(q32, d[i]);
                v8 c4 = __builtin_shuffle(d[i][0], vsplat(rows[rp - 1][i][seg]), next);
                v8 c5 = __builtin_shuffle(d[i][1], vsplat(rows[rp - 1][i][seg + 1]), next);
                for (int64_t s = 0; s + 1 < rp; s++) {
                    c4[s * tw + tw - 1] = rows[s][i][seg];
                    c5[s * tw + tw - 1] = rows[s][i][seg + 1];
                }
                d[i][4] = c4;
                d[i][5] = c5;
            }
            WF(input_points)(d, v + ch * tb + 8 * j, xs);
        }
    }
}

/* out[0..3] = A^T m for one column of 6. */
static inline __attribute__((always_inline)) void WF(at6)(const v8 *m, int sm, v8 *out,
                                                         int so)
{
    const v8 two = vsplat(2.0f), four = vsplat(4.0f), eight = vsplat(8.0f);
    const v8 s12 = m[sm] + m[2 * sm], d12 = m[sm] - m[2 * sm];
    const v8 s34 = m[3 * sm] + m[4 * sm], d34 = m[3 * sm] - m[4 * sm];
    out[0] = m[0] + s12 + s34;
    out[so] = d12 + two * d34;
    out[2 * so] = s12 + four * s34;
    out[3 * so] = d12 + eight * d34 + m[5 * sm];
}

/* The column half of an F(4x4) output transform: a[i][q] = (A^T m)[i][q] for the
   36 points of one lane vector, m[xi] read at m0 + xi * WR * tb (m0: the vector's first
   point). */
static inline __attribute__((always_inline)) void WF(output_columns)(const float *m0, int64_t tb, v8 a[4][6])
{
    v8 m[36];
    for (int xi = 0; xi < 36; xi++)
        m[xi] = vload(m0 + xi * WR * tb);
    for (int q = 0; q < 6; q++)
        WF(at6)(&m[q], 6, &a[0][q], 6);
}

/* Output row i of the lane vector's tiles from its column half (ai = a[i]): the row
   half of the transform, plus bias, turned from point-major to column-major: o[k] holds
   the 4 outputs of 2 tiles' row, in output order. */
static inline __attribute__((always_inline)) void WF(output_row)(const v8 ai[6], v8 bias, v8 o[4])
{
    v8 y[4];
    WF(at6)(ai, 1, y, 1);
    for (int q = 0; q < 4; q++)
        y[q] += bias;
    const v8 e = __builtin_shuffle(y[0], y[2], ZIP_LO);
    const v8 f = __builtin_shuffle(y[1], y[3], ZIP_LO);
    const v8 e2 = __builtin_shuffle(y[0], y[2], ZIP_HI);
    const v8 f2 = __builtin_shuffle(y[1], y[3], ZIP_HI);
    o[0] = __builtin_shuffle(e, f, ZIP_LO);
    o[1] = __builtin_shuffle(e, f, ZIP_HI);
    o[2] = __builtin_shuffle(e2, f2, ZIP_LO);
    o[3] = __builtin_shuffle(e2, f2, ZIP_HI);
}

/* Y = A^T m A for output channel co (m: mb[xi][r][tb], 36 positions), then bias,
   residual, Relu. */
static void WF(output_transform4)(const wino_t *g, const item_t *it, const float *mb, int r,
                                  int64_t co)
{
    const int64_t tb = it->nv * 8;
    const v8 bias = vsplat(g->bias != NULL ? g->bias[co] : 0.0f);
    const int64_t plane = (it->n * g->m + co) * g->oh * g->ow;
    for (int64_t j = 0; j < it->nv; j++) {
        const int64_t ox = 4 * (it->tx0 + 8 * j);
        if (ox >= g->ow)
            break;
        v8 a[4][6];
        WF(output_columns)(mb + r * tb + 8 * j, tb, a);
        const int64_t count = g->ow - ox < 32 ? g->ow - ox : 32;
        for (int i = 0; i < 4; i++) {
            const int64_t oy = 4 * it->ty + i;
            if (oy >= g->oh)
                break;
            v8 o[4];
            WF(output_row)(a[i], bias, o);
            WF(store_row)(g, g->y + plane + oy * g->ow + ox,
                          g->z != NULL ? g->z + plane + oy * g->ow + ox : NULL, o, 4, count);
        }
    }
}

/* Y = A^T m A for output channel co of an item of row groups (g->rp > 0; m:
   mb[xi][r][tb], 36 positions), then bias, residual, Relu: a lane vector's 4 output rows
   of every tile row of its group. */
static void WF(output_transform4_rows)(const wino_t *g, const item_t *it, const float *mb,
                                       int r, int64_t co)
{
    const int64_t tb = it->nv * 8, tw = g->tw, rp = g->rp, seg = rp > 1 ? 4 * tw : 32;
    const v8 bias = vsplat(g->bias != NULL ? g->bias[co] : 0.0f);
    const int64_t plane = (it->n * g->m + co) * g->oh * g->ow;
    const int64_t count = g->ow < seg ? g->ow : seg; /* the row's columns */
    for (int64_t j = 0; j < it->nv; j++) {
        v8 a[4][6];
        WF(output_columns)(mb + r * tb + 8 * j, tb, a);
        for (int i = 0; i < 4; i++) {
            v8 o[4];
            WF(output_row)(a[i], bias, o);
            for (int64_t s = 0; s < rp; s++) { /* seg floats of o a row of the group */
                const int64_t oy = 4 * (it->ty + rp * j + s) + i;
                if (oy >= g->oh)
                    break;
                float *dst = g->y + plane + oy * g->ow;
                const float *zs = g->z != NULL ? g->z + plane + oy * g->ow : NULL;
                WF(store_row)(g, dst, zs, o + s * seg / 8, (int)(seg / 8), count);
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
    float *mb = v + points * g->c * WMAXTB;
    float *rowbuf = mb + points * WR * WMAXTB;
    const int64_t tb = it->nv * 8;
    const int64_t steps = (g->m + WRI - 1) / WRI * points;
    int64_t step = 0;
    prefetch_step(g, it, next, 0, g->m < WRI ? (int)g->m : WRI, 0, -1, steps);
    if (points == 16)
        WF(input_transform)(g, it, v, rowbuf);
    else if (g->rp > 0)
        WF(input_transform4_rows)(g, it, v, rowbuf);
    else
        WF(input_transform4)(g, it, v, rowbuf);
    for (int64_t co = 0; co < g->m; co += WRI) {
        const int r = g->m - co < WRI ? (int)(g->m - co) : WRI;
        const gemm_fn fn = WF(g_gemms)[it->nv][r];
        for (int xi = 0; xi < points; xi++) {
            fn(g->u + (xi * g->m + co) * g->c, g->c, v + xi * g->c * tb, tb, mb + xi * WR * tb);
            prefetch_step(g, it, next, co, r, xi, step++, steps);
        }
        for (int q = 0; q < r; q++) {
            if (points == 16)
                WF(output_transform)(g, it, mb, q, co + q);
            else if (g->rp > 0)
                WF(output_transform4_rows)(g, it, mb, q, co + q);
            else
                WF(output_transform4)(g, it, mb, q, co + q);
        }
    }
}

/* One F(2x2, 3x3) item. */
static void WF(run_item)(const wino_t *g, const item_t *it, const item_t *next,
                         float *scratch)
{
    WF(run_points)(g, it, next, scratch, 16);
}

/* One F(4x4, 3x3) item. */
static void WF(run_item4)(const wino_t *g, const item_t *it, const item_t *next,
                          float *scratch)
{
    WF(run_points)(g, it, next, scratch, 36);
}

#undef WF
#undef WCAT
#undef WCAT2
