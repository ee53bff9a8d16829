// strata-kernel: op=conv2d_nhwc dialect=c entry=strata_conv2d_nhwc requires=avx512f,fma
/* conv2d_nhwc by Winograd F(2x2, 3x3) for dense 3x3 stride-1 layers (Lavin & Gray 2016);
 * every other geometry goes to the direct engine (strata_conv2d.h).
 *
 * Each 2x2 block of output pixels comes from a 4x4 block of input: with B, G, A the F(2,3)
 * transforms, Y = A^T [ sum_c (G g_oc G^T) . (B^T d_c B) ] A. So: (1) every input block is
 * transformed, 16 channels per vector (NHWC keeps them contiguous), into V[16][tiles][C];
 * (2) the weights into U[16][O][C]; (3) 16 independent products M[xi] = V[xi] U[xi]^T, each
 * a 1x1 convolution the direct engine runs at full speed; (4) every M block is transformed
 * back, plus the bias. 16 products of depth C per 4 outputs instead of 36: 2.25x fewer
 * multiply-adds, for three transform passes over memory.
 *
 * Numerics: the transforms add and subtract up to 9 terms and halve (exact in binary), so the
 * result differs from a direct convolution by a few more float32 roundings per output; it is
 * verified against the float64 reference at the op's own tolerance like every kernel.
 *
 * Scratch is allocated and freed inside the call; there is no global state. */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "strata_conv2d.h"

typedef struct {
    int64_t N, H, W, C, O, P, Ho, Wo, th, tw;
} wino_t;

static inline __mmask16 lanes(int64_t left) {
    return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
}

/* V[xi][t - t0][c] = (B^T d B)[xi] of tile t, for the tc tiles from t0. */
static void input_transform(float *V, const float *x, const wino_t *g, int64_t t0,
                            int64_t tc) {
#pragma omp for schedule(static)
    for (int64_t t = t0; t < t0 + tc; t++) {
        const int64_t n = t / (g->th * g->tw), ty = (t / g->tw) % g->th, tx = t % g->tw;
        const int64_t r0 = 2 * ty - g->P, q0 = 2 * tx - g->P;
        for (int64_t c = 0; c < g->C; c += 16) {
            const __mmask16 m = lanes(g->C - c);
            __m512 d[4][4];
            for (int u = 0; u < 4; u++)
                for (int v = 0; v < 4; v++) {
                    const int64_t r = r0 + u, q = q0 + v;
                    d[u][v] = r >= 0 && r < g->H && q >= 0 && q < g->W
                        ? _mm512_maskz_loadu_ps(m, x + ((n * g->H + r) * g->W + q) * g->C + c)
                        : _mm512_setzero_ps();
                }
            __m512 e[4][4];  /* B^T d: rows */
            for (int v = 0; v < 4; v++) {
                e[0][v] = _mm512_sub_ps(d[0][v], d[2][v]);
                e[1][v] = _mm512_add_ps(d[1][v], d[2][v]);
                e[2][v] = _mm512_sub_ps(d[2][v], d[1][v]);
                e[3][v] = _mm512_sub_ps(d[1][v], d[3][v]);
            }
            for (int u = 0; u < 4; u++) {  /* (B^T d) B: columns */
                const __m512 f[4] = {_mm512_sub_ps(e[u][0], e[u][2]),
                                     _mm512_add_ps(e[u][1], e[u][2]),
                                     _mm512_sub_ps(e[u][2], e[u][1]),
                                     _mm512_sub_ps(e[u][1], e[u][3])};
                for (int v = 0; v < 4; v++)
                    _mm512_mask_storeu_ps(V + ((int64_t)(u * 4 + v) * tc + t - t0) * g->C + c,
                                          m, f[v]);
            }
        }
    }
}

/* U[xi][o][c] = (G g G^T)[xi] of filter (o, c); w is OHWI [O,3,3,C]: 16 channels per
 * vector, so each of the 16 planes is written a cache line at a time. */
static void weight_transform(float *U, const float *w, int64_t O, int64_t C) {
    const __m512 half = _mm512_set1_ps(0.5f);
#pragma omp for schedule(static)
    for (int64_t o = 0; o < O; o++)
        for (int64_t c = 0; c < C; c += 16) {
            const __mmask16 m = lanes(C - c);
            __m512 g[3][3], e[4][3];
            for (int k = 0; k < 9; k++)
                g[k / 3][k % 3] = _mm512_maskz_loadu_ps(m, w + (o * 9 + k) * C + c);
            for (int v = 0; v < 3; v++) {  /* G g: rows */
                const __m512 outer = _mm512_add_ps(g[0][v], g[2][v]);
                e[0][v] = g[0][v];
                e[1][v] = _mm512_mul_ps(half, _mm512_add_ps(outer, g[1][v]));
                e[2][v] = _mm512_mul_ps(half, _mm512_sub_ps(outer, g[1][v]));
                e[3][v] = g[2][v];
            }
            for (int u = 0; u < 4; u++) {  /* (G g) G^T: columns */
                const __m512 outer = _mm512_add_ps(e[u][0], e[u][2]);
                const __m512 f[4] = {e[u][0], _mm512_mul_ps(half, _mm512_add_ps(outer, e[u][1])),
                                     _mm512_mul_ps(half, _mm512_sub_ps(outer, e[u][1])),
                                     e[u][2]};
                for (int v = 0; v < 4; v++)
                    _mm512_mask_storeu_ps(U + ((int64_t)(u * 4 + v) * O + o) * C + c, m, f[v]);
            }
        }
}

/* out[n, 2ty+dy, 2tx+dx, o] = (A^T m A)[dy][dx] + b[o], within the output. */
static void output_transform(float *out, const float *M, const float *b, const wino_t *g,
                             int64_t t0, int64_t tc) {
#pragma omp for schedule(static)
    for (int64_t t = t0; t < t0 + tc; t++) {
        const int64_t n = t / (g->th * g->tw), ty = (t / g->tw) % g->th, tx = t % g->tw;
        for (int64_t o = 0; o < g->O; o += 16) {
            const __mmask16 m = lanes(g->O - o);
            __m512 mm[4][4], e[2][4];
            for (int k = 0; k < 16; k++)
                mm[k / 4][k % 4] = _mm512_maskz_loadu_ps(m, M + ((int64_t)k * tc + t - t0) * g->O
                                                         + o);
            for (int v = 0; v < 4; v++) {  /* A^T m: rows */
                e[0][v] = _mm512_add_ps(_mm512_add_ps(mm[0][v], mm[1][v]), mm[2][v]);
                e[1][v] = _mm512_sub_ps(_mm512_sub_ps(mm[1][v], mm[2][v]), mm[3][v]);
            }
            const __m512 bias = _mm512_maskz_loadu_ps(m, b + o);
            for (int dy = 0; dy < 2; dy++) {
                const int64_t i = 2 * ty + dy;
                if (i >= g->Ho) continue;
                const __m512 y[2] = {
                    _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(e[dy][0], e[dy][1]), e[dy][2]),
                                  bias),
                    _mm512_add_ps(_mm512_sub_ps(_mm512_sub_ps(e[dy][1], e[dy][2]), e[dy][3]),
                                  bias)};
                for (int dx = 0; dx < 2; dx++) {
                    const int64_t j = 2 * tx + dx;
                    if (j < g->Wo)
                        _mm512_mask_storeu_ps(out + ((n * g->Ho + i) * g->Wo + j) * g->O + o, m,
                                              y[dx]);
                }
            }
        }
    }
}

/* Tiles per pass: V and M of one pass (16 planes each) take ~2 MiB (the two cores' L2), the same
 * two buffers serve every pass (a call's scratch is touched once, whatever the image). */
static int64_t tiles_per_pass(const wino_t *g, int64_t T) {
    int64_t tc = (1 << 21) / (16 * (g->C + g->O) * (int64_t)sizeof(float));
    tc = tc < 48 ? 48 : tc;
    return tc < T ? tc : T;
}

static int winograd(float *out, const float *x, const float *w, const float *b,
                    const wino_t *g) {
    const int64_t T = g->N * g->th * g->tw, TC = tiles_per_pass(g, T);
    float *V = malloc((size_t)(16 * TC * g->C) * sizeof(float));
    float *U = malloc((size_t)(16 * g->O * g->C) * sizeof(float));
    float *M = malloc((size_t)(16 * TC * g->O) * sizeof(float));
    float *zero = calloc((size_t)g->O, sizeof(float));
    const int ok = V && U && M && zero;
    if (ok) {
        /* one parallel region: the transforms split their loops, the 16 products of a pass
         * go one per thread at a time (the engine's own regions nest inactive, each runs on
         * its thread), so no team is started and stopped 19 times per pass */
#pragma omp parallel
        {
            weight_transform(U, w, g->O, g->C);
            for (int64_t t0 = 0; t0 < T; t0 += TC) {
                const int64_t tc = T - t0 < TC ? T - t0 : TC;
                input_transform(V, x, g, t0, tc);
#pragma omp for schedule(dynamic, 1)
                for (int64_t xi = 0; xi < 16; xi++)  /* M[xi] = V[xi] U[xi]^T: a 1x1 conv */
                    conv2d_nhwc_run(M + xi * tc * g->O, V + xi * tc * g->C,
                                    U + xi * g->O * g->C, zero, 1, 0, 1, 1, tc, g->C, g->O, 1,
                                    1, 1, tc);
                output_transform(out, M, b, g, t0, tc);
            }
        }
    }
    free(V);
    free(U);
    free(M);
    free(zero);
    return ok;
}

void strata_conv2d_nhwc(float *out, const float *x, const float *w, const float *b,
                        const int64_t *geom, int64_t N, int64_t H, int64_t W, int64_t C,
                        int64_t O, int64_t K, int64_t G, int64_t Ho, int64_t Wo) {
    if (N <= 0 || Ho <= 0 || Wo <= 0 || O <= 0) return;
    const int64_t S = geom[0], P = geom[1];
    if (K == 3 && S == 1 && G == 1) {
        const wino_t g = {N, H, W, C, O, P, Ho, Wo, (Ho + 1) / 2, (Wo + 1) / 2};
        if (winograd(out, x, w, b, &g)) return;
    }
    conv2d_nhwc_run(out, x, w, b, S, P, N, H, W, C, O, K, G, Ho, Wo);
}
