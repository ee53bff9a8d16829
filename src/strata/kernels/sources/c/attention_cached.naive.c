// strata-kernel: op=attention_cached dialect=c entry=strata_attention_cached
/* Portable reference: causal attention of T queries over a KV cache, GQA.
 * q [H,T,D]; k, v [Hkv,C,D]; P = pos[0] cache rows precede the queries (P + T <= C).
 * Query t of head h attends rows 0..P+t of kv head h / (H/Hkv); later rows are never
 * read. Plain softmax in double (max subtracted). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

void strata_attention_cached(float *out, const float *q, const float *k, const float *v,
                             const int64_t *pos, int64_t H, int64_t Hkv, int64_t T,
                             int64_t C, int64_t D, float scale) {
    if (H <= 0 || T <= 0 || D <= 0 || Hkv <= 0) return;
    const int64_t P = pos[0], group = H / Hkv;
    double *p = (double *)malloc((size_t)(P + T) * sizeof(double));
    double *acc = (double *)malloc((size_t)D * sizeof(double));
    if (!p || !acc) { free(p); free(acc); return; }
    for (int64_t h = 0; h < H; h++) {
        const float *kh = k + (h / group) * C * D, *vh = v + (h / group) * C * D;
        for (int64_t t = 0; t < T; t++) {
            const float *qr = q + (h * T + t) * D;
            const int64_t n = P + t + 1;  /* keys 0..P+t */
            double m = -INFINITY;
            for (int64_t s = 0; s < n; s++) {
                double d = 0.0;
                for (int64_t i = 0; i < D; i++) d += (double)qr[i] * kh[s * D + i];
                p[s] = d * scale;
                if (p[s] > m) m = p[s];
            }
            double sum = 0.0;
            for (int64_t s = 0; s < n; s++) { p[s] = exp(p[s] - m); sum += p[s]; }
            for (int64_t i = 0; i < D; i++) acc[i] = 0.0;
            for (int64_t s = 0; s < n; s++)
                for (int64_t i = 0; i < D; i++) acc[i] += p[s] * vh[s * D + i];
            float *o = out + (h * T + t) * D;
            for (int64_t i = 0; i < D; i++) o[i] = (float)(acc[i] / sum);
        }
    }
    free(p);
    free(acc);
}
