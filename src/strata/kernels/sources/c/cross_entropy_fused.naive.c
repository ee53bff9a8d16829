// strata-kernel: op=cross_entropy_fused dialect=c entry=strata_cross_entropy_fused
// Portable reference: per row a max pass, an exp-sum pass (double sum), then a pass writing
// dlogits = exp(x - max) / sum - onehot(target); loss = log(sum) + max - x[target].
// out = [loss (rows) | dlogits (rows*V)]. A target outside [0, V) gives loss 0, zero row.
#include <math.h>
#include <stdint.h>

void strata_cross_entropy_fused(float *out, const float *logits, const int64_t *target,
                                int64_t rows, int64_t V) {
    if (V <= 0) return;
    float *grad = out + rows;
    for (int64_t r = 0; r < rows; r++) {
        const float *x = logits + r * V;
        float *g = grad + r * V;
        int64_t t = target[r];
        if (t < 0 || t >= V) {
            out[r] = 0.0f;
            for (int64_t c = 0; c < V; c++) g[c] = 0.0f;
            continue;
        }
        float m = x[0];
        for (int64_t c = 1; c < V; c++) if (x[c] > m) m = x[c];
        double s = 0.0;
        for (int64_t c = 0; c < V; c++) s += exp((double)x[c] - m);
        double inv = 1.0 / s;
        for (int64_t c = 0; c < V; c++)
            g[c] = (float)(exp((double)x[c] - m) * inv - (c == t ? 1.0 : 0.0));
        out[r] = (float)(log(s) + (double)m - (double)x[t]);
    }
}
