// strata-kernel: op=silu_mul dialect=c entry=strata_silu_mul
// Portable reference: out = a / (1 + exp(-a)) * b, evaluated in double (no overflow to NaN).
#include <math.h>
#include <stdint.h>

void strata_silu_mul(float *out, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        double av = a[i];
        out[i] = (float)(av / (1.0 + exp(-av)) * (double)b[i]);
    }
}
