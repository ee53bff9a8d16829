// strata-kernel: op=layernorm dialect=c entry=strata_layernorm
// Portable reference: (x-mean)/sqrt(var+eps)*w+b with biased variance, double accumulation.
#include <math.h>
#include <stdint.h>

void strata_layernorm(float *out, const float *x, const float *w, const float *b,
                      int64_t rows, int64_t cols, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *o = out + r * cols;
        double mean = 0.0;
        for (int64_t c = 0; c < cols; c++) mean += xr[c];
        mean /= (double)cols;
        double var = 0.0;
        for (int64_t c = 0; c < cols; c++) { double d = xr[c] - mean; var += d * d; }
        var /= (double)cols;
        double rstd = 1.0 / sqrt(var + (double)eps);
        for (int64_t c = 0; c < cols; c++)
            o[c] = (float)(((double)xr[c] - mean) * rstd * w[c] + b[c]);
    }
}
