// strata-kernel: op=conv1d_causal_step dialect=c entry=strata_conv1d_causal_step
// Portable reference: per (b, c), y = bias + taps over [state, x] (double accumulation), and
// the new state = the window without its oldest position. out = [new state | y].
#include <stdint.h>

void strata_conv1d_causal_step(float *out, const float *state, const float *x, const float *w,
                               const float *b, int64_t B, int64_t C, int64_t K) {
    float *new_state = out;
    float *y = out + B * C * (K - 1);
    for (int64_t r = 0; r < B * C; r++) {
        const int64_t c = r % C;
        const float *s = state + r * (K - 1);
        const float *wc = w + c * K;
        double acc = b[c];
        for (int64_t k = 0; k < K - 1; k++) acc += (double)wc[k] * s[k];
        acc += (double)wc[K - 1] * x[r];
        y[r] = (float)acc;
        for (int64_t k = 0; k + 1 < K - 1; k++) new_state[r * (K - 1) + k] = s[k + 1];
        new_state[r * (K - 1) + K - 2] = x[r];
    }
}
