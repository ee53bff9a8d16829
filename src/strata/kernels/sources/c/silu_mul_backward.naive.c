// strata-kernel: op=silu_mul_backward dialect=c entry=strata_silu_mul_backward
// Portable reference: the gradients of silu(a)*b in double, one thread.
// out = [da (n) | db (n)]; s = 1/(1+exp(-a)): da = dy*b*s*(1 + a*(1-s)), db = dy*a*s.
#include <math.h>
#include <stdint.h>

void strata_silu_mul_backward(float *out, const float *a, const float *b, const float *dy,
                              int64_t n) {
    float *da = out, *db = out + n;
    for (int64_t i = 0; i < n; i++) {
        double x = a[i], s = 1.0 / (1.0 + exp(-x));
        da[i] = (float)((double)dy[i] * b[i] * s * (1.0 + x * (1.0 - s)));
        db[i] = (float)((double)dy[i] * x * s);
    }
}
