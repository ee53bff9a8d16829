// strata-kernel: op=swiglu_oai dialect=c entry=strata_swiglu_oai
// Portable reference: gpt-oss's clamped SwiGLU as ggml's CPU kernel computes it, in float32:
// x = min(a, 7) (a NaN stays NaN, as std::min(a, limit)), y = clamp(b, -7, 7),
// out = x / (1 + expf(1.702 * -x)) * (y + 1). For a << 0 expf overflows to inf: the gate is -0.
#include <math.h>
#include <stdint.h>

void strata_swiglu_oai(float *out, const float *a, const float *b, int64_t n) {
    const float alpha = 1.702f, limit = 7.0f;
    for (int64_t i = 0; i < n; i++) {
        const float x = limit < a[i] ? limit : a[i];
        const float y = b[i] < -limit ? -limit : (limit < b[i] ? limit : b[i]);
        out[i] = x / (1.0f + expf(alpha * -x)) * (y + 1.0f);
    }
}
