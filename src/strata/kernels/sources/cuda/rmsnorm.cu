// strata-kernel: op=rmsnorm dialect=cuda entry=strata_rmsnorm requires=cuda,sm_80+
//
// rmsnorm.cu -- out[r,c] = x[r,c] / sqrt(mean_c(x[r,:]^2) + eps) * w[c], float32.
//
// One thread block per row (grid-stride over rows if rows > 2^31-1).  Pass 1 accumulates the
// row's sum of squares in fp32 (per-thread partials, warp shuffle, then shared memory across
// warps); pass 2 re-reads the row (L1/L2 hit) and writes x * rsqrt(ms + eps) * w.
// Vector path: float4 loads/stores when cols % 4 == 0 and x, w, out are 16-byte aligned;
// otherwise a scalar path with the same structure (any cols).
// Launch: grid min(rows, 2^31-1), block = clamp(next multiple of 32 of the per-row work
//   items, 32, 512) threads (work items = cols/4 on the vector path, cols otherwise).
// Known limits: one block per row, so a handful of very long rows leaves most SMs idle.

#include <cuda_runtime.h>
#include <stdint.h>

namespace {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the block; every thread gets the total.  `sh` holds >= 32 floats.
__device__ __forceinline__ float block_sum(float v, float *sh) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
  const int nw = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();  // sh may still be read from a previous call
  if (lane == 0) sh[wid] = v;
  __syncthreads();
  float t = (lane < nw) ? sh[lane] : 0.0f;
  return warp_sum(t);
}

template <bool VEC>
__global__ void rmsnorm_kernel(float *__restrict__ out, const float *__restrict__ x,
                               const float *__restrict__ w, int64_t rows, int64_t cols,
                               float eps) {
  __shared__ float sh[32];
  const float inv_cols = 1.0f / (float)cols;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const float *xr = x + row * cols;
    float *orow = out + row * cols;
    float ss = 0.0f;
    if (VEC) {
      const int64_t n4 = cols >> 2;
      const float4 *x4 = reinterpret_cast<const float4 *>(xr);
      for (int64_t i = threadIdx.x; i < n4; i += blockDim.x) {
        float4 v = x4[i];
        ss = fmaf(v.x, v.x, ss);
        ss = fmaf(v.y, v.y, ss);
        ss = fmaf(v.z, v.z, ss);
        ss = fmaf(v.w, v.w, ss);
      }
      const float inv = rsqrtf(block_sum(ss, sh) * inv_cols + eps);
      const float4 *w4 = reinterpret_cast<const float4 *>(w);
      float4 *o4 = reinterpret_cast<float4 *>(orow);
      for (int64_t i = threadIdx.x; i < n4; i += blockDim.x) {
        float4 v = x4[i], g = w4[i];
        o4[i] = make_float4(v.x * inv * g.x, v.y * inv * g.y, v.z * inv * g.z, v.w * inv * g.w);
      }
    } else {
      for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
        float v = xr[i];
        ss = fmaf(v, v, ss);
      }
      const float inv = rsqrtf(block_sum(ss, sh) * inv_cols + eps);
      for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) orow[i] = xr[i] * inv * w[i];
    }
  }
}

}  // namespace

extern "C" int strata_rmsnorm(float *out, const float *x, const float *w, int64_t rows,
                              int64_t cols, float eps, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return 0;
  const bool vec = (cols % 4 == 0) && ((reinterpret_cast<uintptr_t>(x) & 15) == 0) &&
                   ((reinterpret_cast<uintptr_t>(w) & 15) == 0) &&
                   ((reinterpret_cast<uintptr_t>(out) & 15) == 0);
  const int64_t items = vec ? cols / 4 : cols;
  int64_t threads = (items + 31) / 32 * 32;
  if (threads < 32) threads = 32;
  if (threads > 512) threads = 512;
  const unsigned grid = (unsigned)(rows < 2147483647 ? rows : 2147483647);
  if (vec)
    rmsnorm_kernel<true><<<grid, (unsigned)threads, 0, stream>>>(out, x, w, rows, cols, eps);
  else
    rmsnorm_kernel<false><<<grid, (unsigned)threads, 0, stream>>>(out, x, w, rows, cols, eps);
  return (int)cudaGetLastError();
}
