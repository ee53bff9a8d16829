// strata-kernel: op=decode_attention dialect=c entry=strata_decode_attention
// Portable reference: one query per head over S cached positions (no mask), GQA.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

void strata_decode_attention(float *out, const float *q, const float *k, const float *v,
                             int64_t H, int64_t Hkv, int64_t S, int64_t D, float scale) {
    if (D <= 0) return;
    int64_t group = H / Hkv;
    double *p = (double *)malloc((size_t)(S > 0 ? S : 1) * sizeof(double));
    double *acc = (double *)malloc((size_t)D * sizeof(double));
    if (!p || !acc) { free(p); free(acc); return; }
    for (int64_t h = 0; h < H; h++) {
        int64_t g = h / group;
        const float *kh = k + g * S * D, *vh = v + g * S * D, *qr = q + h * D;
        double m = -INFINITY;
        for (int64_t s = 0; s < S; s++) {
            double d = 0.0;
            for (int64_t i = 0; i < D; i++) d += (double)qr[i] * kh[s * D + i];
            p[s] = d * scale;
            if (p[s] > m) m = p[s];
        }
        double sum = 0.0;
        for (int64_t s = 0; s < S; s++) { p[s] = exp(p[s] - m); sum += p[s]; }
        for (int64_t i = 0; i < D; i++) acc[i] = 0.0;
        for (int64_t s = 0; s < S; s++)
            for (int64_t i = 0; i < D; i++) acc[i] += p[s] * vh[s * D + i];
        for (int64_t i = 0; i < D; i++) out[h * D + i] = (float)(acc[i] / sum);
    }
    free(p);
    free(acc);
}
