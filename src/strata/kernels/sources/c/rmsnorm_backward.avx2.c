// strata-kernel: op=rmsnorm_backward dialect=c entry=strata_rmsnorm_backward requires=avx2,fma
// AVX2/FMA rmsnorm backward, out = [dx (rows*cols) | dw (cols)].
// Per row: one pass for sum(x^2) and sum(dy*w*x), one pass writing dx and adding dy*x*r to
// the dw partial of the row's block. dw is race-free and deterministic: rows are cut into
// blocks whose size depends only on the shape (never on the thread count), each block sums
// into its own partial, and the partials are combined in block order (in double). Any
// thread count, parallel or not, gives the same bits.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "strata_simd.h"

/* Below this much work (elements) the kernel stays on one thread: a fork-join costs
   microseconds on a quiet machine and milliseconds when the cores are shared, so only
   ~0.5 ms+ of serial work forks (~1 ns per element here: ~3x a forward's work; the tiny
   training preset's 2048x128 stays serial). Override with -DPAR_MIN_WORK=... */
#ifndef PAR_MIN_WORK
#define PAR_MIN_WORK ((int64_t)(1 << 19))
#endif
#define MIN_BLOCK_ROWS 32   /* rows per dw partial, at least */
#define MAX_BLOCKS 256      /* partials, at most: bounds the scratch to 256 rows of floats */

/* dx of one row; adds dy*x*r into the block partial p. */
static void row_backward(float *dx, float *p, const float *x, const float *w, const float *dy,
                         int64_t C, float eps) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, g0 = s0, g1 = s0;
    int64_t c = 0;
    for (; c + 16 <= C; c += 16) {
        __m256 x0 = _mm256_loadu_ps(x + c), x1 = _mm256_loadu_ps(x + c + 8);
        s0 = _mm256_fmadd_ps(x0, x0, s0);
        s1 = _mm256_fmadd_ps(x1, x1, s1);
        g0 = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_loadu_ps(dy + c), _mm256_loadu_ps(w + c)), x0, g0);
        g1 = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_loadu_ps(dy + c + 8), _mm256_loadu_ps(w + c + 8)), x1, g1);
    }
    for (; c + 8 <= C; c += 8) {
        __m256 x0 = _mm256_loadu_ps(x + c);
        s0 = _mm256_fmadd_ps(x0, x0, s0);
        g0 = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_loadu_ps(dy + c), _mm256_loadu_ps(w + c)), x0, g0);
    }
    int64_t rem = C - c;
    __m256i m = tailmask(rem);
    if (rem) {
        __m256 x0 = _mm256_maskload_ps(x + c, m);
        s1 = _mm256_fmadd_ps(x0, x0, s1);
        g1 = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_maskload_ps(dy + c, m), _mm256_maskload_ps(w + c, m)), x0, g1);
    }
    double ss = hsum256_ps(_mm256_add_ps(s0, s1)), gx = hsum256_ps(_mm256_add_ps(g0, g1));
    double rinv = 1.0 / sqrt(ss / (double)C + (double)eps);
    const __m256 r = _mm256_set1_ps((float)rinv);
    const __m256 k = _mm256_set1_ps((float)(rinv * rinv * rinv * gx / (double)C));
    for (c = 0; c + 8 <= C; c += 8) {
        __m256 x0 = _mm256_loadu_ps(x + c), d0 = _mm256_loadu_ps(dy + c);
        __m256 rg = _mm256_mul_ps(r, _mm256_mul_ps(d0, _mm256_loadu_ps(w + c)));
        _mm256_storeu_ps(dx + c, _mm256_fnmadd_ps(k, x0, rg));
        _mm256_storeu_ps(p + c, _mm256_fmadd_ps(_mm256_mul_ps(d0, x0), r, _mm256_loadu_ps(p + c)));
    }
    if (rem) {
        __m256 x0 = _mm256_maskload_ps(x + c, m), d0 = _mm256_maskload_ps(dy + c, m);
        __m256 rg = _mm256_mul_ps(r, _mm256_mul_ps(d0, _mm256_maskload_ps(w + c, m)));
        _mm256_maskstore_ps(dx + c, m, _mm256_fnmadd_ps(k, x0, rg));
        _mm256_maskstore_ps(p + c, m, _mm256_fmadd_ps(_mm256_mul_ps(d0, x0), r, _mm256_maskload_ps(p + c, m)));
    }
}

static void block_backward(float *out, float *p, const float *x, const float *w,
                           const float *dy, int64_t r0, int64_t r1, int64_t C, float eps) {
    memset(p, 0, (size_t)C * sizeof(float));
    for (int64_t r = r0; r < r1; r++)
        row_backward(out + r * C, p, x + r * C, w, dy + r * C, C, eps);
}

/* dw[c] = sum of the partials in block order: a fixed order whoever runs it. */
static void combine(float *dw, const float *part, int64_t nb, int64_t c0, int64_t c1,
                    int64_t C) {
    for (int64_t c = c0; c < c1; c++) {
        double s = 0.0;
        for (int64_t b = 0; b < nb; b++) s += part[b * C + c];
        dw[c] = (float)s;
    }
}

void strata_rmsnorm_backward(float *out, const float *x, const float *w, const float *dy,
                             int64_t rows, int64_t cols, float eps) {
    if (cols <= 0) return;
    int64_t bs = (rows + MAX_BLOCKS - 1) / MAX_BLOCKS;
    if (bs < MIN_BLOCK_ROWS) bs = MIN_BLOCK_ROWS;
    int64_t nb = (rows + bs - 1) / bs;
    float *dw = out + rows * cols;
    if (nb == 0) { memset(dw, 0, (size_t)cols * sizeof(float)); return; }
    float *part = malloc((size_t)(nb * cols) * sizeof(float));
    if (!part) return;  /* the output stays as it was: the caller sees the failure */
    int par = nb > 1 && rows * cols >= PAR_MIN_WORK;
#pragma omp parallel for schedule(static) if (par)
    for (int64_t b = 0; b < nb; b++) {
        int64_t r1 = (b + 1) * bs < rows ? (b + 1) * bs : rows;
        block_backward(out, part + b * cols, x, w, dy, b * bs, r1, cols, eps);
    }
    const int64_t cchunk = 256;
    int64_t nc = (cols + cchunk - 1) / cchunk;
#pragma omp parallel for schedule(static) if (par && nc > 1)
    for (int64_t j = 0; j < nc; j++) {
        int64_t c1 = (j + 1) * cchunk < cols ? (j + 1) * cchunk : cols;
        combine(dw, part, nb, j * cchunk, c1, cols);
    }
    free(part);
}
