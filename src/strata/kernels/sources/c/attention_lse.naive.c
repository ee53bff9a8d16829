// strata-kernel: op=attention_lse dialect=c entry=strata_attention_lse
// Portable reference: causal softmax(q k^T * scale) v plus each query's logsumexp, q [H,T,D],
// k/v [Hkv,T,D], GQA; out = [o (H*T*D) | lse (H*T)]. Scores and sums in double.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

void strata_attention_lse(float *out, const float *q, const float *k, const float *v,
                          int64_t H, int64_t Hkv, int64_t T, int64_t D, float scale) {
    if (T <= 0 || D <= 0 || H <= 0) return;
    int64_t group = H / Hkv;
    float *lse = out + H * T * D;
    double *p = (double *)malloc((size_t)T * sizeof(double));
    double *acc = (double *)malloc((size_t)D * sizeof(double));
    if (!p || !acc) { free(p); free(acc); return; }
    for (int64_t h = 0; h < H; h++) {
        int64_t g = h / group;
        const float *kh = k + g * T * D, *vh = v + g * T * D;
        for (int64_t t = 0; t < T; t++) {
            const float *qr = q + (h * T + t) * D;
            double m = -INFINITY;
            for (int64_t s = 0; s <= t; s++) {
                double d = 0.0;
                for (int64_t i = 0; i < D; i++) d += (double)qr[i] * kh[s * D + i];
                p[s] = d * scale;
                if (p[s] > m) m = p[s];
            }
            double sum = 0.0;
            for (int64_t s = 0; s <= t; s++) { p[s] = exp(p[s] - m); sum += p[s]; }
            for (int64_t i = 0; i < D; i++) acc[i] = 0.0;
            for (int64_t s = 0; s <= t; s++)
                for (int64_t i = 0; i < D; i++) acc[i] += p[s] * vh[s * D + i];
            float *o = out + (h * T + t) * D;
            for (int64_t i = 0; i < D; i++) o[i] = (float)(acc[i] / sum);
            lse[h * T + t] = (float)(m + log(sum));
        }
    }
    free(p);
    free(acc);
}
