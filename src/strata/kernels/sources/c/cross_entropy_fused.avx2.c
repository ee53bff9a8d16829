// strata-kernel: op=cross_entropy_fused dialect=c entry=strata_cross_entropy_fused requires=avx2,fma
// AVX2/FMA fused cross entropy, loss and gradient: per row a max pass, an exp-sum pass
// (vectorised exp, four accumulators), then one pass writing dlogits = exp(x - max) / sum
// (minus 1 at the target); loss = log(sum) + max - x[target]. Nothing but the row itself
// is ever held (the gradient row is the output). out = [loss (rows) | dlogits (rows*V)].
// A target outside [0, V) (e.g. ignore_index -100) gives loss 0 and a zero gradient row.
// Rows are independent: in parallel only when the work amortises an OpenMP team.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "strata_simd.h"

/* Below this many elements the kernel stays on one thread (~1 ms of serial work: a
   fork-join on shared cores can cost that much). Override with -DPAR_MIN_WORK=... */
#ifndef PAR_MIN_WORK
#define PAR_MIN_WORK ((int64_t)(1 << 20))
#endif

static float row_max(const float *x, int64_t V) {
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    __m256 m0 = ninf, m1 = ninf, m2 = ninf, m3 = ninf;
    int64_t c = 0;
    for (; c + 32 <= V; c += 32) {
        m0 = _mm256_max_ps(m0, _mm256_loadu_ps(x + c));
        m1 = _mm256_max_ps(m1, _mm256_loadu_ps(x + c + 8));
        m2 = _mm256_max_ps(m2, _mm256_loadu_ps(x + c + 16));
        m3 = _mm256_max_ps(m3, _mm256_loadu_ps(x + c + 24));
    }
    for (; c + 8 <= V; c += 8) m0 = _mm256_max_ps(m0, _mm256_loadu_ps(x + c));
    if (c < V) {
        __m256i mask = tailmask(V - c);
        m1 = _mm256_max_ps(m1, _mm256_blendv_ps(ninf, _mm256_maskload_ps(x + c, mask),
                                                _mm256_castsi256_ps(mask)));
    }
    return hmax256_ps(_mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3)));
}

static double row_expsum(const float *x, int64_t V, float m) {
    const __m256 mv = _mm256_set1_ps(m);
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t c = 0;
    for (; c + 32 <= V; c += 32) {
        s0 = _mm256_add_ps(s0, exp256_ps(_mm256_sub_ps(_mm256_loadu_ps(x + c), mv)));
        s1 = _mm256_add_ps(s1, exp256_ps(_mm256_sub_ps(_mm256_loadu_ps(x + c + 8), mv)));
        s2 = _mm256_add_ps(s2, exp256_ps(_mm256_sub_ps(_mm256_loadu_ps(x + c + 16), mv)));
        s3 = _mm256_add_ps(s3, exp256_ps(_mm256_sub_ps(_mm256_loadu_ps(x + c + 24), mv)));
    }
    for (; c + 8 <= V; c += 8) s0 = _mm256_add_ps(s0, exp256_ps(_mm256_sub_ps(_mm256_loadu_ps(x + c), mv)));
    if (c < V) {
        __m256i mask = tailmask(V - c);
        s1 = _mm256_add_ps(s1, _mm256_and_ps(exp256_ps(_mm256_sub_ps(_mm256_maskload_ps(x + c, mask), mv)),
                                             _mm256_castsi256_ps(mask)));
    }
    /* per-lane float partial sums of values in (0, 1]; summed in double at the end */
    return hsum256_ps(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
}

/* g[c] = exp(x[c] - m) * inv for c < V. */
static void row_probs(float *g, const float *x, int64_t V, float m, float inv) {
    const __m256 mv = _mm256_set1_ps(m), iv = _mm256_set1_ps(inv);
    int64_t c = 0;
    for (; c + 16 <= V; c += 16) {
        _mm256_storeu_ps(g + c, _mm256_mul_ps(exp256_ps(_mm256_sub_ps(_mm256_loadu_ps(x + c), mv)), iv));
        _mm256_storeu_ps(g + c + 8, _mm256_mul_ps(exp256_ps(_mm256_sub_ps(_mm256_loadu_ps(x + c + 8), mv)), iv));
    }
    for (; c + 8 <= V; c += 8)
        _mm256_storeu_ps(g + c, _mm256_mul_ps(exp256_ps(_mm256_sub_ps(_mm256_loadu_ps(x + c), mv)), iv));
    if (c < V) {
        __m256i mask = tailmask(V - c);
        _mm256_maskstore_ps(g + c, mask, _mm256_mul_ps(exp256_ps(_mm256_sub_ps(_mm256_maskload_ps(x + c, mask), mv)), iv));
    }
}

static float ce_row(float *g, const float *x, int64_t V, int64_t t) {
    if (t < 0 || t >= V) {
        memset(g, 0, (size_t)V * sizeof(float));
        return 0.0f;
    }
    float m = row_max(x, V);
    double s = row_expsum(x, V, m);
    row_probs(g, x, V, m, (float)(1.0 / s));
    g[t] = (float)((double)g[t] - 1.0);
    return (float)(log(s) + (double)m - (double)x[t]);
}

void strata_cross_entropy_fused(float *out, const float *logits, const int64_t *target,
                                int64_t rows, int64_t V) {
    if (V <= 0) return;
    float *grad = out + rows;
    if (rows < 2 || rows * V < PAR_MIN_WORK) {
        for (int64_t r = 0; r < rows; r++) out[r] = ce_row(grad + r * V, logits + r * V, V, target[r]);
    } else {
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < rows; r++) out[r] = ce_row(grad + r * V, logits + r * V, V, target[r]);
    }
}
