// strata-kernel: op=matmul dialect=cuda entry=strata_matmul_bf16 requires=cuda,sm_80+
//
// matmul_bf16.cu -- out[M,N] = a[M,K] @ b[K,N], all row-major bfloat16, fp32 accumulation.
//
// Computation: tensor cores through nvcuda::wmma (16x16x16 bf16 fragments, fp32
// accumulators); the fp32 result is rounded to bf16 (round-to-nearest-even) on store.
//
// Blocking:
//   block tile BM x BN x BK = 128 x 128 x 32, 256 threads = 8 warps laid out 2 (M) x 4 (N);
//   each warp owns a 64 x 32 sub-tile = 4 x 2 accumulator fragments (64 fp32 regs/thread).
//   Shared memory: STAGES = 3 buffers of A [128][32+8] and B [32][128+8] bf16 (the +8
//   padding keeps ldmatrix-style row reads bank-conflict-free and every fragment pointer
//   32-byte aligned, as WMMA requires): 3 * 18944 B = 56832 B of dynamic shared memory
//   (above the 48 KB default, so the launcher opts in with cudaFuncSetAttribute).
//   Main loop: classic multistage pipeline, one __syncthreads per k-tile; tile kt+2 is
//   prefetched while tile kt is multiplied.
//
// Loads (template flag VEC):
//   VEC = true  when K % 8 == 0, N % 8 == 0 and a, b are 16-byte aligned: 16-byte
//               cp.async.cg (bypasses L1) with src-size 0 (hardware zero fill) for chunks
//               outside the matrix, so ragged M / N / K edges are padded with zeros.
//   VEC = false any other shape/alignment: plain bounds-checked element loads into the same
//               shared-memory buffers (zero padding), no cp.async.  Correct, slower.
// Epilogue: each warp stages one 16x16 fp32 fragment at a time in shared memory, converts
//   to bf16 and writes it with 16-byte stores when the row segment is in bounds and
//   aligned, element-wise bounds-checked stores otherwise.
//
// Launch: grid (ceil(N/128), ceil(M/128)), 256 threads, 56832 B dynamic shared memory,
//   on the given stream.  __launch_bounds__(256, 2): 128 registers/thread, no spills
//   (nvcc 13.0), so two blocks (16 warps) fit on an SM.  M, N, K are int64; every global index is computed in 64 bits.
//   M == 0 or N == 0: nothing to do (returns 0).  K == 0: writes zeros.
//
// Known limits: ceil(M/128) must fit gridDim.y (M < 8.3M); ceil(K/32) < 2^31.  Uses mma.sync-class tensor
//   instructions (WMMA); on Hopper cuBLAS uses wgmma/TMA, so this kernel is expected to
//   reach only a fraction (very roughly 50-70%) of cuBLAS at 4096^3.  Requires sm_80+.

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <mma.h>
#include <stdint.h>

namespace {

using namespace nvcuda;

constexpr int BM = 128;
constexpr int BN = 128;
constexpr int BK = 32;
constexpr int STAGES = 3;
constexpr int THREADS = 256;
constexpr int WARPS_M = 2;
constexpr int WARPS_N = 4;
constexpr int WM = BM / WARPS_M;  // 64
constexpr int WN = BN / WARPS_N;  // 32
constexpr int FM = WM / 16;       // 4
constexpr int FN = WN / 16;       // 2
constexpr int A_LD = BK + 8;      // 40 bf16 = 80 B per row
constexpr int B_LD = BN + 8;      // 136 bf16 = 272 B per row
constexpr int A_STAGE = BM * A_LD;  // elements
constexpr int B_STAGE = BK * B_LD;  // elements
constexpr int SMEM_BYTES = STAGES * (A_STAGE + B_STAGE) * (int)sizeof(__nv_bfloat16);
constexpr int C_LD = 20;  // fp32 staging row stride for one 16x16 fragment (multiple of 4)

static_assert(WARPS_M * WARPS_N * 32 == THREADS, "warp layout");
static_assert((A_STAGE * 2) % 128 == 0 && (B_STAGE * 2) % 128 == 0, "stage alignment");
static_assert(THREADS / 32 * 16 * C_LD * 4 <= SMEM_BYTES, "epilogue staging fits");

__device__ __forceinline__ void cp_async16(void *smem_dst, const void *gmem_src, int src_bytes) {
  unsigned s = (unsigned)__cvta_generic_to_shared(smem_dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem_src),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Load k-tile `kt` of A (rows m0.., cols kt*BK..) and B (rows kt*BK.., cols n0..) into stage
// buffers As / Bs.  Out-of-range elements become zero.
template <bool VEC>
__device__ __forceinline__ void load_tile(__nv_bfloat16 *As, __nv_bfloat16 *Bs,
                                          const __nv_bfloat16 *__restrict__ a,
                                          const __nv_bfloat16 *__restrict__ b, int64_t M,
                                          int64_t N, int64_t K, int64_t m0, int64_t n0,
                                          int64_t k0) {
  const int tid = threadIdx.x;
  // A tile: BM x BK = 128 x 32 = 512 chunks of 8 bf16; 2 per thread.
#pragma unroll
  for (int i = 0; i < (BM * BK / 8) / THREADS; ++i) {
    int c = tid + i * THREADS;
    int r = c / (BK / 8);          // 0..127
    int kc = (c % (BK / 8)) * 8;   // 0,8,16,24
    int64_t gm = m0 + r, gk = k0 + kc;
    __nv_bfloat16 *dst = As + r * A_LD + kc;
    if (VEC) {
      bool ok = (gm < M) && (gk < K);  // K % 8 == 0: the chunk is all-in or all-out
      const __nv_bfloat16 *src = ok ? (a + gm * K + gk) : a;
      cp_async16(dst, src, ok ? 16 : 0);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        __nv_bfloat16 v = __float2bfloat16(0.0f);
        if (gm < M && gk + e < K) v = a[gm * K + gk + e];
        dst[e] = v;
      }
    }
  }
  // B tile: BK x BN = 32 x 128 = 512 chunks of 8 bf16; 2 per thread.
#pragma unroll
  for (int i = 0; i < (BK * BN / 8) / THREADS; ++i) {
    int c = tid + i * THREADS;
    int r = c / (BN / 8);          // 0..31
    int nc = (c % (BN / 8)) * 8;   // 0..120
    int64_t gk = k0 + r, gn = n0 + nc;
    __nv_bfloat16 *dst = Bs + r * B_LD + nc;
    if (VEC) {
      bool ok = (gk < K) && (gn < N);  // N % 8 == 0: all-in or all-out
      const __nv_bfloat16 *src = ok ? (b + gk * N + gn) : b;
      cp_async16(dst, src, ok ? 16 : 0);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        __nv_bfloat16 v = __float2bfloat16(0.0f);
        if (gk < K && gn + e < N) v = b[gk * N + gn + e];
        dst[e] = v;
      }
    }
  }
}

template <bool VEC>
__global__ void __launch_bounds__(THREADS, 2)
matmul_bf16_wmma(__nv_bfloat16 *__restrict__ out, const __nv_bfloat16 *__restrict__ a,
                 const __nv_bfloat16 *__restrict__ b, int64_t M, int64_t N, int64_t K) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __nv_bfloat16 *As = reinterpret_cast<__nv_bfloat16 *>(smem_raw);
  __nv_bfloat16 *Bs = As + STAGES * A_STAGE;

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int wm = warp / WARPS_N;  // 0..1
  const int wn = warp % WARPS_N;  // 0..3
  const int64_t m0 = (int64_t)blockIdx.y * BM;
  const int64_t n0 = (int64_t)blockIdx.x * BN;
  const int ktiles = (int)((K + BK - 1) / BK);

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[FM][FN];
#pragma unroll
  for (int i = 0; i < FM; ++i)
#pragma unroll
    for (int j = 0; j < FN; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

  // Prologue: tiles 0 .. STAGES-2.  Always commit so the group count stays uniform.
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < ktiles)
      load_tile<VEC>(As + s * A_STAGE, Bs + s * B_STAGE, a, b, M, N, K, m0, n0,
                     (int64_t)s * BK);
    cp_async_commit();
  }

  for (int kt = 0; kt < ktiles; ++kt) {
    // Groups committed so far: STAGES-1+kt; allow STAGES-2 pending => tile kt has landed.
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // tile kt visible to all; everyone is done with tile kt-1's buffer

    {
      const int nk = kt + STAGES - 1;
      const int st = nk % STAGES;
      if (nk < ktiles)
        load_tile<VEC>(As + st * A_STAGE, Bs + st * B_STAGE, a, b, M, N, K, m0, n0,
                       (int64_t)nk * BK);
      cp_async_commit();
    }

    const int st = kt % STAGES;
    const __nv_bfloat16 *At = As + st * A_STAGE + (wm * WM) * A_LD;
    const __nv_bfloat16 *Bt = Bs + st * B_STAGE + wn * WN;
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa[FM];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb[FN];
#pragma unroll
      for (int i = 0; i < FM; ++i) wmma::load_matrix_sync(fa[i], At + i * 16 * A_LD + kk, A_LD);
#pragma unroll
      for (int j = 0; j < FN; ++j) wmma::load_matrix_sync(fb[j], Bt + kk * B_LD + j * 16, B_LD);
#pragma unroll
      for (int i = 0; i < FM; ++i)
#pragma unroll
        for (int j = 0; j < FN; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
    }
  }

  // Epilogue: drain (only empty groups can remain) and reuse shared memory for staging.
  cp_async_wait<0>();
  __syncthreads();
  float *stage = reinterpret_cast<float *>(smem_raw) + warp * 16 * C_LD;
  const bool vec_out = ((N & 7) == 0) && ((reinterpret_cast<uintptr_t>(out) & 15) == 0);
  const int r = lane / 2;          // 0..15
  const int cbase = (lane % 2) * 8;  // 0 or 8
#pragma unroll
  for (int i = 0; i < FM; ++i) {
#pragma unroll
    for (int j = 0; j < FN; ++j) {
      wmma::store_matrix_sync(stage, acc[i][j], C_LD, wmma::mem_row_major);
      __syncwarp();
      const int64_t gm = m0 + wm * WM + i * 16 + r;
      const int64_t gn = n0 + wn * WN + j * 16 + cbase;
      if (gm < M) {
        const float *src = stage + r * C_LD + cbase;
        if (vec_out && gn + 8 <= N) {
          __align__(16) __nv_bfloat162 h[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) h[e] = __floats2bfloat162_rn(src[2 * e], src[2 * e + 1]);
          *reinterpret_cast<uint4 *>(out + gm * N + gn) = *reinterpret_cast<const uint4 *>(h);
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e)
            if (gn + e < N) out[gm * N + gn + e] = __float2bfloat16_rn(src[e]);
        }
      }
      __syncwarp();  // staging buffer is rewritten by the next fragment
    }
  }
}

}  // namespace

extern "C" int strata_matmul_bf16(__nv_bfloat16 *out, const __nv_bfloat16 *a,
                                  const __nv_bfloat16 *b, int64_t M, int64_t N, int64_t K,
                                  cudaStream_t stream) {
  if (M <= 0 || N <= 0) return 0;
  const bool vec = (K % 8 == 0) && (N % 8 == 0) &&
                   ((reinterpret_cast<uintptr_t>(a) & 15) == 0) &&
                   ((reinterpret_cast<uintptr_t>(b) & 15) == 0);
  dim3 grid((unsigned)((N + BN - 1) / BN), (unsigned)((M + BM - 1) / BM));
  if ((M + BM - 1) / BM > 65535) return (int)cudaErrorInvalidValue;
  cudaError_t err;
  if (vec) {
    err = cudaFuncSetAttribute(matmul_bf16_wmma<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               SMEM_BYTES);
    if (err != cudaSuccess) return (int)err;
    matmul_bf16_wmma<true><<<grid, THREADS, SMEM_BYTES, stream>>>(out, a, b, M, N, K);
  } else {
    err = cudaFuncSetAttribute(matmul_bf16_wmma<false>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES);
    if (err != cudaSuccess) return (int)err;
    matmul_bf16_wmma<false><<<grid, THREADS, SMEM_BYTES, stream>>>(out, a, b, M, N, K);
  }
  return (int)cudaGetLastError();
}
