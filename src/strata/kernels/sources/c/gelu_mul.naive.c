// strata-kernel: op=gelu_mul dialect=c entry=strata_gelu_mul
// Portable reference: out = gelu(a) * b with ggml's CPU GELU. a <= -10: 0; a >= 10: a;
// otherwise a rounded to fp16, 0.5x(1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))) in float32,
// rounded to fp16 (ggml's 64K-entry table holds exactly these values).
#include <math.h>
#include <stdint.h>
#include "strata_half.h"

static float ggml_gelu(float a) {
    if (a <= -10.0f) return 0.0f;
    if (a >= 10.0f) return a;
    const float x = half_to_float(float_to_half(a));
    const float g = 0.5f * x * (1.0f + tanhf(0.79788456080286535588f * x *
                                             (1.0f + 0.044715f * x * x)));
    return half_to_float(float_to_half(g));
}

void strata_gelu_mul(float *out, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = ggml_gelu(a[i]) * b[i];
}
