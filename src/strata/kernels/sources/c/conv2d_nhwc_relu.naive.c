// strata-kernel: op=conv2d_nhwc_relu dialect=c entry=strata_conv2d_nhwc_relu
// Portable reference: max(0, conv2d_nhwc): every output (n, i, j, o) sums its group's
// K x K x C/G window in double, reading zeros outside the image, plus the bias, then the
// ReLU. S and P come from geom.
#include <stdint.h>

void strata_conv2d_nhwc_relu(float *out, const float *x, const float *w, const float *b,
                             const int64_t *geom, int64_t N, int64_t H, int64_t W, int64_t C,
                             int64_t O, int64_t K, int64_t G, int64_t Ho, int64_t Wo) {
    const int64_t S = geom[0], P = geom[1], cg = C / G, og = O / G;
    for (int64_t n = 0; n < N; n++)
        for (int64_t i = 0; i < Ho; i++)
            for (int64_t j = 0; j < Wo; j++)
                for (int64_t o = 0; o < O; o++) {
                    const int64_t c0 = (o / og) * cg;
                    double acc = b[o];
                    for (int64_t kh = 0; kh < K; kh++) {
                        const int64_t r = i * S - P + kh;
                        if (r < 0 || r >= H) continue;
                        for (int64_t kw = 0; kw < K; kw++) {
                            const int64_t q = j * S - P + kw;
                            if (q < 0 || q >= W) continue;
                            const float *xp = x + ((n * H + r) * W + q) * C + c0;
                            const float *wp = w + ((o * K + kh) * K + kw) * cg;
                            for (int64_t c = 0; c < cg; c++) acc += (double)wp[c] * xp[c];
                        }
                    }
                    out[((n * Ho + i) * Wo + j) * O + o] = acc > 0.0 ? (float)acc : 0.0f;
                }
}
