// strata-kernel: op=rope_backward dialect=c entry=strata_rope_backward
// Portable reference: rotate-half RoPE's gradient over dy [T,H,D] with cos/sin [T,D/2], the
// inverse rotation: dx[i] = dy[i]*c + dy[i+D/2]*s, dx[i+D/2] = dy[i+D/2]*c - dy[i]*s.
#include <stdint.h>

void strata_rope_backward(float *out, const float *dy, const float *cos, const float *sin,
                          int64_t T, int64_t H, int64_t D) {
    int64_t half = D / 2;
    for (int64_t t = 0; t < T; t++) {
        const float *c = cos + t * half, *s = sin + t * half;
        for (int64_t h = 0; h < H; h++) {
            const float *g = dy + (t * H + h) * D;
            float *o = out + (t * H + h) * D;
            for (int64_t i = 0; i < half; i++) {
                o[i] = g[i] * c[i] + g[i + half] * s[i];
                o[i + half] = g[i + half] * c[i] - g[i] * s[i];
            }
            if (D & 1) o[D - 1] = g[D - 1];
        }
    }
}
