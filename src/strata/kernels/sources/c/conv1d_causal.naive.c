// strata-kernel: op=conv1d_causal dialect=c entry=strata_conv1d_causal
// Portable reference: each channel's K taps over its last K inputs (zeros before t = 0),
// accumulated in double, plus the channel's bias.
#include <stdint.h>

void strata_conv1d_causal(float *out, const float *x, const float *w, const float *b,
                          int64_t B, int64_t C, int64_t T, int64_t K) {
    for (int64_t r = 0; r < B * C; r++) {
        const int64_t c = r % C;
        const float *xr = x + r * T;
        const float *wc = w + c * K;
        for (int64_t t = 0; t < T; t++) {
            double acc = b[c];
            for (int64_t k = 0; k < K; k++) {
                const int64_t s = t - (K - 1) + k;
                if (s >= 0) acc += (double)wc[k] * xr[s];
            }
            out[r * T + t] = (float)acc;
        }
    }
}
