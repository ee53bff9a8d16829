// strata-kernel: op=attention_window dialect=c entry=strata_attention_window
/* Portable reference: sliding-window causal attention of T queries over a KV cache, GQA.
 * q [H,T,D]; k, v [Hkv,C,D]; pos int64 [2]: P = pos[0] cache rows precede the queries
 * (P + T <= C), W = pos[1] >= 1 the window. Query t of head h attends rows
 * max(0, P+t-W+1)..P+t of kv head h / (H/Hkv); no other row is read. Plain softmax in
 * double (max subtracted). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

void strata_attention_window(float *out, const float *q, const float *k, const float *v,
                             const int64_t *pos, int64_t H, int64_t Hkv, int64_t T,
                             int64_t C, int64_t D, float scale) {
    if (H <= 0 || T <= 0 || D <= 0 || Hkv <= 0) return;
    const int64_t P = pos[0], group = H / Hkv, W = pos[1] >= 1 ? pos[1] : 1;
    double *p = (double *)malloc((size_t)(W < P + T ? W : P + T) * sizeof(double));
    double *acc = (double *)malloc((size_t)D * sizeof(double));
    if (!p || !acc) { free(p); free(acc); return; }
    for (int64_t h = 0; h < H; h++) {
        const float *kh = k + (h / group) * C * D, *vh = v + (h / group) * C * D;
        for (int64_t t = 0; t < T; t++) {
            const float *qr = q + (h * T + t) * D;
            const int64_t end = P + t + 1, lo = end > W ? end - W : 0;
            double m = -INFINITY;
            for (int64_t s = lo; s < end; s++) {
                double d = 0.0;
                for (int64_t i = 0; i < D; i++) d += (double)qr[i] * kh[s * D + i];
                p[s - lo] = d * scale;
                if (p[s - lo] > m) m = p[s - lo];
            }
            double sum = 0.0;
            for (int64_t s = 0; s < end - lo; s++) { p[s] = exp(p[s] - m); sum += p[s]; }
            for (int64_t i = 0; i < D; i++) acc[i] = 0.0;
            for (int64_t s = lo; s < end; s++)
                for (int64_t i = 0; i < D; i++) acc[i] += p[s - lo] * vh[s * D + i];
            float *o = out + (h * T + t) * D;
            for (int64_t i = 0; i < D; i++) o[i] = (float)(acc[i] / sum);
        }
    }
    free(p);
    free(acc);
}
