// strata-kernel: op=conv2d dialect=c entry=strata_conv2d
// Portable reference: every output (n, o, i, j) sums its group's C/G x K x K window in
// double, reading zeros outside the image, plus the bias. S and P come from geom.
#include <stdint.h>

void strata_conv2d(float *out, const float *x, const float *w, const float *b,
                   const int64_t *geom, int64_t N, int64_t H, int64_t W, int64_t C, int64_t O,
                   int64_t K, int64_t G, int64_t Ho, int64_t Wo) {
    const int64_t S = geom[0], P = geom[1], cg = C / G, og = O / G;
    for (int64_t n = 0; n < N; n++)
        for (int64_t o = 0; o < O; o++) {
            const int64_t c0 = (o / og) * cg;
            for (int64_t i = 0; i < Ho; i++)
                for (int64_t j = 0; j < Wo; j++) {
                    double acc = b[o];
                    for (int64_t c = 0; c < cg; c++)
                        for (int64_t kh = 0; kh < K; kh++) {
                            const int64_t r = i * S - P + kh;
                            if (r < 0 || r >= H) continue;
                            for (int64_t kw = 0; kw < K; kw++) {
                                const int64_t q = j * S - P + kw;
                                if (q < 0 || q >= W) continue;
                                acc += (double)w[((o * cg + c) * K + kh) * K + kw] *
                                       x[((n * C + c0 + c) * H + r) * W + q];
                            }
                        }
                    out[((n * O + o) * Ho + i) * Wo + j] = (float)acc;
                }
        }
}
