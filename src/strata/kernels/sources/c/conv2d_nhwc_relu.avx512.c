// strata-kernel: op=conv2d_nhwc_relu dialect=c entry=strata_conv2d_nhwc_relu requires=avx512f,fma
/* conv2d_nhwc + bias + ReLU in one pass: strata_conv2d.h's direct engine with max(0, .)
 * applied to each register tile as its last kernel row is stored (a separate ReLU would
 * read and write the whole output once more). */
#include <stdint.h>
#include "strata_conv2d.h"

void strata_conv2d_nhwc_relu(float *out, const float *x, const float *w, const float *b,
                             const int64_t *geom, int64_t N, int64_t H, int64_t W, int64_t C,
                             int64_t O, int64_t K, int64_t G, int64_t Ho, int64_t Wo) {
    conv2d_nhwc_act(out, x, w, b, geom[0], geom[1], N, H, W, C, O, K, G, Ho, Wo, 1);
}
