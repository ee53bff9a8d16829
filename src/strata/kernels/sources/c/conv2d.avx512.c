// strata-kernel: op=conv2d dialect=c entry=strata_conv2d requires=avx512f,fma
/* conv2d (NCHW) through the lab's direct NHWC engine (strata_conv2d.h): x is transposed to
 * channels-last, the OIHW weights to OHWI, the engine runs, and its NHWC result is
 * transposed back into out. The transposes are three extra passes over memory (x, w, out),
 * cheap next to a 3x3 layer's arithmetic and dear for a small 1x1 one, so a 1x1 stride-1
 * layer skips them: out[n] = w[O,C] @ x[n][C,HW] is a GEMM on the tensors as they lie, which
 * the engine runs with w's rows as its pixels and x's rows as its packed depth.
 *
 * Scratch is allocated and freed inside the call; there is no global state. */
#include <stdint.h>
#include <stdlib.h>
#include "strata_conv.h"
#include "strata_conv2d.h"

/* dst[a][b] = src[b][a] for an R x S matrix per batch item, in 16 x 16 tiles. */
static void transpose(float *dst, const float *src, int64_t batch, int64_t R, int64_t S) {
    const int64_t tiles_r = (R + 15) / 16, tiles_s = (S + 15) / 16;
#pragma omp parallel for collapse(2) schedule(static) if (batch * R * S > 65536)
    for (int64_t n = 0; n < batch; n++)
        for (int64_t t = 0; t < tiles_r * tiles_s; t++) {
            const int64_t r0 = (t / tiles_s) * 16, s0 = (t % tiles_s) * 16;
            const int64_t r1 = r0 + 16 < R ? r0 + 16 : R, s1 = s0 + 16 < S ? s0 + 16 : S;
            const float *in = src + n * R * S;
            float *o = dst + n * R * S;
            for (int64_t r = r0; r < r1; r++)
                for (int64_t s = s0; s < s1; s++) o[s * R + r] = in[r * S + s];
        }
}

void strata_conv2d(float *out, const float *x, const float *w, const float *b,
                   const int64_t *geom, int64_t N, int64_t H, int64_t W, int64_t C, int64_t O,
                   int64_t K, int64_t G, int64_t Ho, int64_t Wo) {
    if (N <= 0 || O <= 0 || Ho <= 0 || Wo <= 0) return;
    const int64_t cg = C / G, KK = K * K;
    if (K == 1 && geom[0] == 1 && geom[1] == 0 && G == 1) {
        /* a 1x1 layer is out[n] = w[O,C] @ x[n][C,HW] as the tensors lie: no transposes */
        int ok = 1;
        for (int64_t n = 0; n < N && ok; n++)
            ok = gemm_nn_run(out + n * O * H * W, w, x + n * C * H * W, O, H * W, C);
        if (ok) {
#pragma omp parallel for schedule(static) if (N * O * H * W > 65536)
            for (int64_t r = 0; r < N * O; r++) {
                float *row = out + r * H * W;
                const float bias = b[r % O];
                for (int64_t p = 0; p < H * W; p++) row[p] += bias;
            }
            return;
        }
    }
    float *xt = malloc((size_t)(N * H * W * C) * sizeof(float));
    float *wt = malloc((size_t)(O * KK * cg) * sizeof(float));
    float *ot = malloc((size_t)(N * Ho * Wo * O) * sizeof(float));
    if (xt && wt && ot) {
        transpose(xt, x, N, C, H * W);      /* [C][HW] -> [HW][C] per image */
        transpose(wt, w, O, cg, KK);        /* [cg][KK] -> [KK][cg] per output channel */
        conv2d_nhwc_run(ot, xt, wt, b, geom[0], geom[1], N, H, W, C, O, K, G, Ho, Wo);
        transpose(out, ot, N, Ho * Wo, O);  /* [HoWo][O] -> [O][HoWo] per image */
    } else {  /* out of memory for scratch: the plain loop */
        conv2d_nchw_plain(out, x, w, b, geom[0], geom[1], N, H, W, C, O, K, G, Ho, Wo);
    }
    free(xt);
    free(wt);
    free(ot);
}
