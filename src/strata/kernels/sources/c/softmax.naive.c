// strata-kernel: op=softmax dialect=c entry=strata_softmax
// Portable reference: softmax over the last dim, max-subtracted, double accumulation.
#include <math.h>
#include <stdint.h>

void strata_softmax(float *out, const float *x, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *o = out + r * cols;
        float m = -INFINITY;
        for (int64_t c = 0; c < cols; c++) if (xr[c] > m) m = xr[c];
        double s = 0.0;
        for (int64_t c = 0; c < cols; c++) s += exp((double)xr[c] - (double)m);
        double inv = 1.0 / s;
        for (int64_t c = 0; c < cols; c++) o[c] = (float)(exp((double)xr[c] - (double)m) * inv);
    }
}
