// strata-kernel: op=rope dialect=c entry=strata_rope
// Portable reference: rotate-half RoPE, x [T,H,D], cos/sin [T,D/2].
#include <stdint.h>

void strata_rope(float *out, const float *x, const float *cos, const float *sin,
                 int64_t T, int64_t H, int64_t D) {
    int64_t half = D / 2;
    for (int64_t t = 0; t < T; t++) {
        const float *c = cos + t * half, *s = sin + t * half;
        for (int64_t h = 0; h < H; h++) {
            const float *xr = x + (t * H + h) * D;
            float *o = out + (t * H + h) * D;
            for (int64_t i = 0; i < half; i++) {
                double x1 = xr[i], x2 = xr[i + half];
                o[i] = (float)(x1 * c[i] - x2 * s[i]);
                o[i + half] = (float)(x2 * c[i] + x1 * s[i]);
            }
            if (D & 1) o[D - 1] = xr[D - 1];  /* odd D: last element passes through */
        }
    }
}
