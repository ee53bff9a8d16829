// strata-kernel: op=matmul dialect=c entry=strata_matmul
/* Reference fp32 GEMM: out[M,N] = a[M,K] @ b[K,N], all row-major and contiguous.
 *
 * Portable and single-threaded on purpose: it is the baseline the optimised variants are
 * measured against. The i-k-j loop order streams rows of b and out contiguously, so the
 * compiler can vectorise the inner loop without any intrinsics.
 */
#include <stdint.h>

void strata_matmul(float *out, const float *a, const float *b, int64_t M, int64_t N, int64_t K) {
    for (int64_t i = 0; i < M; i++) {
        float *o = out + i * N;
        for (int64_t j = 0; j < N; j++) o[j] = 0.0f;  /* out arrives filled with NaN */
        for (int64_t k = 0; k < K; k++) {
            const float aik = a[i * K + k];
            const float *brow = b + k * N;
            for (int64_t j = 0; j < N; j++) o[j] += aik * brow[j];
        }
    }
}
