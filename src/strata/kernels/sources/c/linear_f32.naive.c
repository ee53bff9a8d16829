// strata-kernel: op=linear_f32 dialect=c entry=strata_linear_f32
/* Portable reference: out[b,n] = sum_k x[b,k] * w[n,k], x [B,K], w [N,K] (a GGUF F32
 * weight as stored, row n = the K weights of output n). Sums in double. */
#include <stdint.h>

void strata_linear_f32(float *out, const float *x, const float *w, int64_t B, int64_t N,
                       int64_t K) {
    for (int64_t b = 0; b < B; b++) {
        const float *xr = x + b * K;
        for (int64_t n = 0; n < N; n++) {
            const float *wr = w + n * K;
            double acc = 0.0;
            for (int64_t k = 0; k < K; k++) acc += (double)xr[k] * wr[k];
            out[b * N + n] = (float)acc;
        }
    }
}
