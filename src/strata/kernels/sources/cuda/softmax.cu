// strata-kernel: op=softmax dialect=cuda entry=strata_softmax requires=cuda,sm_80+
//
// softmax.cu -- out[r,:] = exp(x[r,:] - max) / sum(exp(x[r,:] - max)), float32, last dim.
//
// One thread block per row (grid-stride over rows).  Pass 1: each thread keeps an online
// (running max m, running sum s of exp(x - m)) over its strided elements; the pairs are
// merged across the warp with shuffles and across warps through shared memory
// (merge: M = max(m1, m2), s = s1*exp(m1-M) + s2*exp(m2-M)).  Pass 2 re-reads the row and
// writes exp(x - M) * (1/S).  So the row is read twice and written once; expf is the
// full-precision libm version.  -inf entries contribute 0 (a row of all -inf gives NaN, like
// the reference).  Vector path: float4 when cols % 4 == 0 and x, out are 16-byte aligned;
// scalar path otherwise (any cols, e.g. 151936 takes the vector path, 151937 the scalar one).
// Launch: grid min(rows, 2^31-1), block = clamp(next multiple of 32 of the per-row work
//   items, 32, 1024) threads (work items = cols/4 on the vector path, cols otherwise).
// Known limits: one block per row; few long rows use few SMs; for many long rows the
//   second read of a row may miss L2 (3 row-sized transfers instead of 2).

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

namespace {

__device__ __forceinline__ void merge(float &m, float &s, float m2, float s2) {
  const float M = fmaxf(m, m2);
  if (M == -INFINITY) {  // both sides empty / all -inf so far
    m = M;
    s = 0.0f;
    return;
  }
  s = s * expf(m - M) + s2 * expf(m2 - M);
  m = M;
}

__device__ __forceinline__ void add1(float &m, float &s, float v) {
  if (v > m) {
    s = s * expf(m - v);  // m == -inf: s is 0 and expf(-inf) = 0
    m = v;
  }
  if (m != -INFINITY) s += expf(v - m);
}

__device__ __forceinline__ void add4(float &m, float &s, float4 v) {
  const float mx = fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w));
  if (mx > m) {
    s = s * expf(m - mx);
    m = mx;
  }
  if (m != -INFINITY) s += (expf(v.x - m) + expf(v.y - m)) + (expf(v.z - m) + expf(v.w - m));
}

// Block-wide merge of (m, s); every thread receives the result.  sm/ss hold >= 32 floats.
__device__ __forceinline__ void block_merge(float &m, float &s, float *sm, float *ss) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
  const int nw = (blockDim.x + 31) >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    float m2 = __shfl_xor_sync(0xffffffffu, m, o);
    float s2 = __shfl_xor_sync(0xffffffffu, s, o);
    merge(m, s, m2, s2);
  }
  __syncthreads();  // previous row's readers are done with sm/ss
  if (lane == 0) {
    sm[wid] = m;
    ss[wid] = s;
  }
  __syncthreads();
  m = (lane < nw) ? sm[lane] : -INFINITY;
  s = (lane < nw) ? ss[lane] : 0.0f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    float m2 = __shfl_xor_sync(0xffffffffu, m, o);
    float s2 = __shfl_xor_sync(0xffffffffu, s, o);
    merge(m, s, m2, s2);
  }
}

template <bool VEC>
__global__ void softmax_kernel(float *__restrict__ out, const float *__restrict__ x,
                               int64_t rows, int64_t cols) {
  __shared__ float sm[32], ss[32];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const float *xr = x + row * cols;
    float *orow = out + row * cols;
    float m = -INFINITY, s = 0.0f;
    if (VEC) {
      const int64_t n4 = cols >> 2;
      const float4 *x4 = reinterpret_cast<const float4 *>(xr);
      for (int64_t i = threadIdx.x; i < n4; i += blockDim.x) add4(m, s, x4[i]);
      block_merge(m, s, sm, ss);
      const float inv = 1.0f / s;
      float4 *o4 = reinterpret_cast<float4 *>(orow);
      for (int64_t i = threadIdx.x; i < n4; i += blockDim.x) {
        float4 v = x4[i];
        o4[i] = make_float4(expf(v.x - m) * inv, expf(v.y - m) * inv, expf(v.z - m) * inv,
                            expf(v.w - m) * inv);
      }
    } else {
      for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) add1(m, s, xr[i]);
      block_merge(m, s, sm, ss);
      const float inv = 1.0f / s;
      for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) orow[i] = expf(xr[i] - m) * inv;
    }
  }
}

}  // namespace

extern "C" int strata_softmax(float *out, const float *x, int64_t rows, int64_t cols,
                              cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return 0;
  const bool vec = (cols % 4 == 0) && ((reinterpret_cast<uintptr_t>(x) & 15) == 0) &&
                   ((reinterpret_cast<uintptr_t>(out) & 15) == 0);
  const int64_t items = vec ? cols / 4 : cols;
  int64_t threads = (items + 31) / 32 * 32;
  if (threads < 32) threads = 32;
  if (threads > 1024) threads = 1024;
  const unsigned grid = (unsigned)(rows < 2147483647 ? rows : 2147483647);
  if (vec)
    softmax_kernel<true><<<grid, (unsigned)threads, 0, stream>>>(out, x, rows, cols);
  else
    softmax_kernel<false><<<grid, (unsigned)threads, 0, stream>>>(out, x, rows, cols);
  return (int)cudaGetLastError();
}
