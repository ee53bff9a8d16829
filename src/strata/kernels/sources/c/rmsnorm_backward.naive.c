// strata-kernel: op=rmsnorm_backward dialect=c entry=strata_rmsnorm_backward
// Portable reference: rmsnorm's gradients with double accumulation, one thread.
// out = [dx (rows*cols) | dw (cols)]; r = 1/sqrt(mean(x^2)+eps), g = dy*w:
//   dx = r*g - x * r^3 * mean(g*x),   dw = sum over rows of dy*x*r.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

void strata_rmsnorm_backward(float *out, const float *x, const float *w, const float *dy,
                             int64_t rows, int64_t cols, float eps) {
    if (cols <= 0) return;
    float *dw_out = out + rows * cols;
    double *dw = calloc((size_t)cols, sizeof(double));
    if (!dw) return;
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols, *gr = dy + r * cols;
        float *dx = out + r * cols;
        double ss = 0.0, gx = 0.0;
        for (int64_t c = 0; c < cols; c++) {
            ss += (double)xr[c] * xr[c];
            gx += (double)gr[c] * w[c] * xr[c];
        }
        double rinv = 1.0 / sqrt(ss / (double)cols + (double)eps);
        double k = rinv * rinv * rinv * gx / (double)cols;
        for (int64_t c = 0; c < cols; c++) {
            dx[c] = (float)(rinv * gr[c] * w[c] - k * xr[c]);
            dw[c] += (double)gr[c] * xr[c] * rinv;
        }
    }
    for (int64_t c = 0; c < cols; c++) dw_out[c] = (float)dw[c];
    free(dw);
}
