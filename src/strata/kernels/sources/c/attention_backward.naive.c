// strata-kernel: op=attention_backward dialect=c entry=strata_attention_backward
// Portable reference: causal GQA attention gradients from the saved o and lse, recomputing
// each probability row (flash-attention-2 style, no T x T matrix):
//   p_s = exp(scale q_t.k_s - lse_t), delta = dout_t.o_t, ds_s = p_s (dout_t.v_s - delta),
//   dq_t = scale sum_s ds_s k_s, dk_s += scale ds_s q_t, dv_s += p_s dout_t.
// out = [dq (H*T*D) | dk (Hkv*T*D) | dv (Hkv*T*D)]; dk/dv summed over each kv head's group.
// Serial, double accumulators; dk/dv accumulate in scratch, never in the output buffer.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

void strata_attention_backward(float *out, const float *q, const float *k, const float *v,
                               const float *o, const float *lse, const float *dout,
                               int64_t H, int64_t Hkv, int64_t T, int64_t D, float scale) {
    if (T <= 0 || D <= 0 || H <= 0) return;
    int64_t group = H / Hkv;
    float *dq = out, *dk = out + H * T * D, *dv = dk + Hkv * T * D;
    double *p = (double *)malloc((size_t)T * sizeof(double));
    double *ds = (double *)malloc((size_t)T * sizeof(double));
    double *gk = (double *)malloc((size_t)(T * D) * sizeof(double));
    double *gv = (double *)malloc((size_t)(T * D) * sizeof(double));
    if (!p || !ds || !gk || !gv) { free(p); free(ds); free(gk); free(gv); return; }
    for (int64_t g = 0; g < Hkv; g++) {
        const float *kh = k + g * T * D, *vh = v + g * T * D;
        for (int64_t i = 0; i < T * D; i++) { gk[i] = 0.0; gv[i] = 0.0; }
        for (int64_t h = g * group; h < (g + 1) * group; h++) {
            for (int64_t t = 0; t < T; t++) {
                const float *qr = q + (h * T + t) * D, *orow = o + (h * T + t) * D;
                const float *dor = dout + (h * T + t) * D;
                double delta = 0.0;
                for (int64_t i = 0; i < D; i++) delta += (double)dor[i] * orow[i];
                for (int64_t s = 0; s <= t; s++) {
                    double sc = 0.0, dp = 0.0;
                    for (int64_t i = 0; i < D; i++) {
                        sc += (double)qr[i] * kh[s * D + i];
                        dp += (double)dor[i] * vh[s * D + i];
                    }
                    p[s] = exp(sc * scale - (double)lse[h * T + t]);
                    ds[s] = p[s] * (dp - delta);
                }
                for (int64_t i = 0; i < D; i++) {
                    double a = 0.0;
                    for (int64_t s = 0; s <= t; s++) a += ds[s] * kh[s * D + i];
                    dq[(h * T + t) * D + i] = (float)(a * scale);
                }
                for (int64_t s = 0; s <= t; s++)
                    for (int64_t i = 0; i < D; i++) {
                        gk[s * D + i] += ds[s] * scale * qr[i];
                        gv[s * D + i] += p[s] * dor[i];
                    }
            }
        }
        for (int64_t i = 0; i < T * D; i++) {
            dk[g * T * D + i] = (float)gk[i];
            dv[g * T * D + i] = (float)gv[i];
        }
    }
    free(p); free(ds); free(gk); free(gv);
}
