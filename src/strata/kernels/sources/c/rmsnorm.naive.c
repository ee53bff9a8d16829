// strata-kernel: op=rmsnorm dialect=c entry=strata_rmsnorm
// Portable reference: x / sqrt(mean(x^2) + eps) * w, double accumulation.
#include <math.h>
#include <stdint.h>

void strata_rmsnorm(float *out, const float *x, const float *w, int64_t rows, int64_t cols,
                    float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *o = out + r * cols;
        double ss = 0.0;
        for (int64_t c = 0; c < cols; c++) ss += (double)xr[c] * xr[c];
        double rinv = 1.0 / sqrt(ss / (double)cols + (double)eps);
        for (int64_t c = 0; c < cols; c++) o[c] = (float)(xr[c] * rinv * w[c]);
    }
}
