// strata-kernel: op=attention_sinks dialect=c entry=strata_attention_sinks
/* Portable reference: gpt-oss's attention of T queries over a KV cache with a sink logit per
 * head, GQA, optionally windowed. q [H,T,D]; k, v [Hkv,C,D]; pos int64 [2]: P = pos[0] cache
 * rows precede the queries (P + T <= C), W = pos[1]; sinks [H]. Query t of head h attends rows
 * max(0, P+t-W+1)..P+t (W > 0) or 0..P+t (W = 0) of kv head h / (H/Hkv); no other row is
 * read. Softmax in double over the scores and the sink: m = max(max_j s_j, sink), the sink's
 * e^(sink - m) joins the sum only (no value, not scaled), as ggml's soft_max with sinks. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

void strata_attention_sinks(float *out, const float *q, const float *k, const float *v,
                            const int64_t *pos, const float *sinks, int64_t H, int64_t Hkv,
                            int64_t T, int64_t C, int64_t D, float scale) {
    if (H <= 0 || T <= 0 || D <= 0 || Hkv <= 0) return;
    const int64_t P = pos[0], group = H / Hkv, W = pos[1] > 0 ? pos[1] : 0;
    const int64_t most = W > 0 && W < P + T ? W : P + T;  /* keys of the widest query */
    double *p = (double *)malloc((size_t)most * sizeof(double));
    double *acc = (double *)malloc((size_t)D * sizeof(double));
    if (!p || !acc) { free(p); free(acc); return; }
    for (int64_t h = 0; h < H; h++) {
        const float *kh = k + (h / group) * C * D, *vh = v + (h / group) * C * D;
        const double sink = sinks[h];
        for (int64_t t = 0; t < T; t++) {
            const float *qr = q + (h * T + t) * D;
            const int64_t end = P + t + 1, lo = W > 0 && end > W ? end - W : 0;
            double m = -INFINITY;
            for (int64_t s = lo; s < end; s++) {
                double d = 0.0;
                for (int64_t i = 0; i < D; i++) d += (double)qr[i] * kh[s * D + i];
                p[s - lo] = d * scale;
                if (p[s - lo] > m) m = p[s - lo];
            }
            if (sink > m) m = sink;  /* a sink of -inf leaves m at the scores' max */
            double sum = exp(sink - m);
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
