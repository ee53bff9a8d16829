// strata-kernel: op=matmul dialect=c entry=strata_matmul requires=avx2,fma
/* fp32 GEMM with AVX2/FMA and OpenMP: out[M,N] = a[M,K] @ b[K,N], row-major, contiguous.
 * The GEMM itself (Goto/BLIS packing, a 6x16 micro-kernel, a skinny path for decode) lives
 * in strata_sgemm.h, shared with the im2col convolutions. */
#include <stdint.h>
#include "strata_sgemm.h"

void strata_matmul(float *out, const float *a, const float *b, int64_t M, int64_t N, int64_t K) {
    strata_sgemm(out, a, b, M, N, K);
}
