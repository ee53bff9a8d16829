// strata-kernel: op=conv1d dialect=c entry=strata_conv1d
// Portable reference: every output (n, o, t) sums its group's C/G x K taps in double (x at
// t*S - P + k*D, zeros outside [0, L)), plus the bias. S, P and D come from geom.
#include <stdint.h>

void strata_conv1d(float *out, const float *x, const float *w, const float *b,
                   const int64_t *geom, int64_t N, int64_t C, int64_t L, int64_t O, int64_t K,
                   int64_t G, int64_t Lo) {
    const int64_t S = geom[0], P = geom[1], D = geom[2], cg = C / G, og = O / G;
    for (int64_t n = 0; n < N; n++)
        for (int64_t o = 0; o < O; o++) {
            const int64_t c0 = (o / og) * cg;
            for (int64_t t = 0; t < Lo; t++) {
                double acc = b[o];
                for (int64_t c = 0; c < cg; c++)
                    for (int64_t k = 0; k < K; k++) {
                        const int64_t s = t * S - P + k * D;
                        if (s >= 0 && s < L)
                            acc += (double)w[(o * cg + c) * K + k] * x[(n * C + c0 + c) * L + s];
                    }
                out[(n * O + o) * Lo + t] = (float)acc;
            }
        }
}
