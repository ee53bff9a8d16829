// strata-kernel: op=conv2d dialect=c entry=strata_conv2d requires=avx2,fma
/* conv2d (NCHW) as im2col + the lab's matmul (strata_sgemm.h, matmul.avx2.c's GEMM).
 *
 * Per image and group: cols[(c*K + kh)*K + kw][i*Wo + j] = x[n, g*cg + c, i*S-P+kh, j*S-P+kw]
 * (zero outside the image), then out[n, g*og:(g+1)*og] = w_g[og, cg*K*K] @ cols: the weight
 * rows are already the GEMM's a (OIHW is [O, C*K*K] row-major), and the output planes its
 * rows. A 1x1, stride-1, unpadded layer needs no lowering: x's planes are cols. The bias is
 * added after the product. cols is K*K times the input: the price of reusing one GEMM for
 * every geometry (conv2d_nhwc's direct kernel forms the patches in registers instead).
 *
 * Scratch is allocated and freed inside the call; there is no global state. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "strata_conv.h"
#include "strata_sgemm.h"

/* The lowering of one group of one image (rows in parallel: a row is one (c, kh, kw)). */
static void im2col(float *cols, const float *x, int64_t cg, int64_t H, int64_t W, int64_t K,
                   int64_t S, int64_t P, int64_t Ho, int64_t Wo) {
    const int64_t rows = cg * K * K;
#pragma omp parallel for schedule(static) if (rows * Ho * Wo > 65536)
    for (int64_t row = 0; row < rows; row++) {
        const int64_t c = row / (K * K), kh = (row / K) % K, kw = row % K;
        const float *plane = x + c * H * W;
        float *dst = cols + row * Ho * Wo;
        for (int64_t i = 0; i < Ho; i++, dst += Wo) {
            const int64_t r = i * S - P + kh;
            if (r < 0 || r >= H) {
                memset(dst, 0, (size_t)Wo * sizeof(float));
                continue;
            }
            const float *src = plane + r * W;
            if (S == 1) {  /* a shifted copy of the row, zeros where it leaves the image */
                for (int64_t j = 0; j < Wo; j++) {
                    const int64_t q = j - P + kw;
                    dst[j] = q >= 0 && q < W ? src[q] : 0.0f;
                }
                continue;
            }
            for (int64_t j = 0; j < Wo; j++) {
                const int64_t q = j * S - P + kw;
                dst[j] = q >= 0 && q < W ? src[q] : 0.0f;
            }
        }
    }
}

static void add_bias(float *o, const float *b, int64_t rows, int64_t plane) {
#pragma omp parallel for schedule(static) if (rows * plane > 65536)
    for (int64_t r = 0; r < rows; r++)
        for (int64_t p = 0; p < plane; p++) o[r * plane + p] += b[r];
}

void strata_conv2d(float *out, const float *x, const float *w, const float *b,
                   const int64_t *geom, int64_t N, int64_t H, int64_t W, int64_t C, int64_t O,
                   int64_t K, int64_t G, int64_t Ho, int64_t Wo) {
    const int64_t S = geom[0], P = geom[1], cg = C / G, og = O / G, depth = cg * K * K;
    const int64_t plane = Ho * Wo;
    if (N <= 0 || O <= 0 || plane <= 0) return;
    const int direct = K == 1 && S == 1 && P == 0;  /* x's planes are the patch matrix */
    float *cols = direct ? NULL : malloc((size_t)(depth * plane) * sizeof(float));
    if (!direct && !cols) {  /* out of memory: the plain loop, no scratch */
        conv2d_nchw_plain(out, x, w, b, S, P, N, H, W, C, O, K, G, Ho, Wo);
        return;
    }
    for (int64_t n = 0; n < N; n++)
        for (int64_t g = 0; g < G; g++) {
            const float *xg = x + (n * C + g * cg) * H * W;
            float *og_out = out + (n * O + g * og) * plane;
            if (!direct) im2col(cols, xg, cg, H, W, K, S, P, Ho, Wo);
            strata_sgemm(og_out, w + g * og * depth, direct ? xg : cols, og, plane, depth);
            add_bias(og_out, b + g * og, og, plane);
        }
    free(cols);
}
