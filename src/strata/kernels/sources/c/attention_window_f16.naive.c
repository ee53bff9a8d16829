// strata-kernel: op=attention_window_f16 dialect=c entry=strata_attention_window_f16
/* Portable reference: attention_window over a float16 KV cache (strata_attention_ref.h).
 * q [H,T,D] float; k, v [Hkv,C,D] float16; pos = (P, W), W >= 1. */
#include <stdint.h>
#include "strata_attention_ref.h"

void strata_attention_window_f16(float *out, const float *q, const uint16_t *k,
                                 const uint16_t *v, const int64_t *pos, int64_t H,
                                 int64_t Hkv, int64_t T, int64_t C, int64_t D, float scale) {
    const int64_t W = pos[1] >= 1 ? pos[1] : 1;
    attention_ref_half(out, q, k, v, NULL, pos[0], W, H, Hkv, T, C, D, scale);
}
