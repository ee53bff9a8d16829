/* strata_conv.h: the portable pieces the convolution kernels share (C + OpenMP):
 * `conv1d_im2col` (conv1d's patch matrix, cols[c*K + k][t] = x[c, t*S - P + k*D], zero
 * outside [0, L)), `conv1d_lowered` (conv1d as that lowering + a GEMM the caller names), and
 * the plain loops they fall back to when scratch memory runs out, `conv1d_plain` (one group
 * of one image) and `conv2d_nchw_plain`. Everything is `static`:
 * each kernel's library keeps its own copy. */
#ifndef STRATA_CONV_H
#define STRATA_CONV_H

#include <stdint.h>
#include <stdlib.h>

static void conv1d_im2col(float *cols, const float *x, int64_t cg, int64_t L, int64_t K,
                          int64_t S, int64_t P, int64_t D, int64_t Lo) {
#pragma omp parallel for schedule(static) if (cg * K * Lo > 65536)
    for (int64_t row = 0; row < cg * K; row++) {
        const int64_t c = row / K, k = row % K;
        const float *src = x + c * L;
        float *dst = cols + row * Lo;
        for (int64_t t = 0; t < Lo; t++) {
            const int64_t s = t * S - P + k * D;
            dst[t] = s >= 0 && s < L ? src[s] : 0.0f;
        }
    }
}

/* o[og, Lo] = the conv1d of one group's input rows xg[cg, L] with its filters wg[og, cg, K]
 * and biases bg[og], no scratch. */
static void conv1d_plain(float *o, const float *xg, const float *wg, const float *bg,
                         int64_t cg, int64_t og, int64_t L, int64_t K, int64_t S, int64_t P,
                         int64_t D, int64_t Lo) {
    for (int64_t r = 0; r < og; r++)
        for (int64_t t = 0; t < Lo; t++) {
            float acc = bg[r];
            for (int64_t c = 0; c < cg; c++)
                for (int64_t k = 0; k < K; k++) {
                    const int64_t s = t * S - P + k * D;
                    if (s >= 0 && s < L) acc += wg[(r * cg + c) * K + k] * xg[c * L + s];
                }
            o[r * Lo + t] = acc;
        }
}

/* out[M,N] = a[M,K] @ b[K,N], row-major; 0 when it could not run (no scratch memory). */
typedef int (*conv_gemm)(float *out, const float *a, const float *b, int64_t M, int64_t N,
                         int64_t K);

/* conv1d (the ABI's arguments): per image and group, cols = the im2col of its input rows,
 * out = w_g[og, cg*K] @ cols through `gemm` (w is [O, C/G*K] row-major: the GEMM's a as it
 * lies), then the bias; the plain loop where scratch runs out. */
static void conv1d_lowered(float *out, const float *x, const float *w, const float *b,
                           const int64_t *geom, int64_t N, int64_t C, int64_t L, int64_t O,
                           int64_t K, int64_t G, int64_t Lo, conv_gemm gemm) {
    const int64_t S = geom[0], P = geom[1], D = geom[2], cg = C / G, og = O / G;
    if (N <= 0 || O <= 0 || Lo <= 0) return;
    float *cols = malloc((size_t)(cg * K * Lo) * sizeof(float));
    for (int64_t n = 0; n < N; n++)
        for (int64_t g = 0; g < G; g++) {
            const float *xg = x + (n * C + g * cg) * L;
            float *o = out + (n * O + g * og) * Lo;
            if (cols) {
                conv1d_im2col(cols, xg, cg, L, K, S, P, D, Lo);
                if (gemm(o, w + g * og * cg * K, cols, og, Lo, cg * K)) {
                    for (int64_t r = 0; r < og; r++)
                        for (int64_t t = 0; t < Lo; t++) o[r * Lo + t] += b[g * og + r];
                    continue;
                }
            }
            /* out of memory for scratch: the plain loop */
            conv1d_plain(o, xg, w + g * og * cg * K, b + g * og, cg, og, L, K, S, P, D, Lo);
        }
    free(cols);
}

/* torch's NCHW conv2d, one output at a time, no scratch. */
static void conv2d_nchw_plain(float *out, const float *x, const float *w, const float *b,
                              int64_t S, int64_t P, int64_t N, int64_t H, int64_t W, int64_t C,
                              int64_t O, int64_t K, int64_t G, int64_t Ho, int64_t Wo) {
    const int64_t cg = C / G, og = O / G;
    for (int64_t n = 0; n < N; n++)
        for (int64_t o = 0; o < O; o++)
            for (int64_t p = 0; p < Ho * Wo; p++) {
                const int64_t i = p / Wo, j = p % Wo, c0 = (o / og) * cg;
                float acc = b[o];
                for (int64_t c = 0; c < cg; c++)
                    for (int64_t kh = 0; kh < K; kh++)
                        for (int64_t kw = 0; kw < K; kw++) {
                            const int64_t r = i * S - P + kh, q = j * S - P + kw;
                            if (r >= 0 && r < H && q >= 0 && q < W)
                                acc += w[((o * cg + c) * K + kh) * K + kw] *
                                       x[((n * C + c0 + c) * H + r) * W + q];
                        }
                out[(n * O + o) * Ho * Wo + p] = acc;
            }
}

#endif
