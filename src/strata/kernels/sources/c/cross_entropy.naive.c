// strata-kernel: op=cross_entropy dialect=c entry=strata_cross_entropy
// Portable reference: out[r] = logsumexp(logits[r]) - logits[r, target[r]], double accumulation.
// A target outside [0, V) (e.g. ignore_index -100) yields 0, like torch's ignore_index.
#include <math.h>
#include <stdint.h>

void strata_cross_entropy(float *out, const float *logits, const int64_t *target,
                          int64_t rows, int64_t V) {
    for (int64_t r = 0; r < rows; r++) {
        const float *l = logits + r * V;
        int64_t t = target[r];
        if (t < 0 || t >= V) { out[r] = 0.0f; continue; }
        float m = -INFINITY;
        for (int64_t i = 0; i < V; i++) if (l[i] > m) m = l[i];
        double s = 0.0;
        for (int64_t i = 0; i < V; i++) s += exp((double)l[i] - (double)m);
        out[r] = (float)(log(s) + (double)m - (double)l[t]);
    }
}
