// strata-kernel: op=conv2d_nhwc dialect=cuda entry=strata_conv2d_nhwc requires=cuda,sm_80+
//
// conv2d_nhwc.cu -- channels-last conv2d with stride, zero padding and groups, + bias, float32.
//
// One thread per output element, grid-stride over N*Ho*Wo*O in memory order: consecutive
// threads take consecutive output channels of one pixel, so they read the same input
// pixel row (a broadcast through L1) and write out coalesced. S and P are read from geom
// on the device (the ABI passes device pointers only). Accumulation in float32, taps in
// (kh, kw, c) order. A correctness-first baseline: no shared-memory tiling yet; its speed is
// measured on a GPU, not here.
// Launch: 256 threads, grid = min(ceil(outputs/256), 16 * number of SMs) blocks.

#include <cuda_runtime.h>
#include <stdint.h>

namespace {

__global__ void conv2d_nhwc_kernel(float *__restrict__ out, const float *__restrict__ x,
                                   const float *__restrict__ w, const float *__restrict__ b,
                                   const int64_t *__restrict__ geom, int64_t N, int64_t H,
                                   int64_t W, int64_t C, int64_t O, int64_t K, int64_t G,
                                   int64_t Ho, int64_t Wo) {
  const int64_t S = geom[0], P = geom[1], cg = C / G, og = O / G;
  const int64_t total = N * Ho * Wo * O;
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride) {
    const int64_t o = e % O, pix = e / O;
    const int64_t j = pix % Wo, i = (pix / Wo) % Ho, n = pix / (Wo * Ho);
    const int64_t c0 = (o / og) * cg;
    float acc = b[o];
    for (int64_t kh = 0; kh < K; kh++) {
      const int64_t r = i * S - P + kh;
      if (r < 0 || r >= H) continue;
      for (int64_t kw = 0; kw < K; kw++) {
        const int64_t q = j * S - P + kw;
        if (q < 0 || q >= W) continue;
        const float *xp = x + ((n * H + r) * W + q) * C + c0;
        const float *wp = w + ((o * K + kh) * K + kw) * cg;
        for (int64_t c = 0; c < cg; c++) acc = fmaf(wp[c], xp[c], acc);
      }
    }
    out[e] = acc;
  }
}

}  // namespace

extern "C" int strata_conv2d_nhwc(float *out, const float *x, const float *w, const float *b,
                                  const int64_t *geom, int64_t N, int64_t H, int64_t W,
                                  int64_t C, int64_t O, int64_t K, int64_t G, int64_t Ho,
                                  int64_t Wo, cudaStream_t stream) {
  const int64_t total = N * Ho * Wo * O;
  if (total <= 0) return 0;
  int dev = 0, sms = 132;
  if (cudaGetDevice(&dev) == cudaSuccess)
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  const int threads = 256;
  int64_t blocks = (total + threads - 1) / threads;
  if (blocks > (int64_t)sms * 16) blocks = (int64_t)sms * 16;
  conv2d_nhwc_kernel<<<(unsigned)blocks, threads, 0, stream>>>(out, x, w, b, geom, N, H, W, C,
                                                               O, K, G, Ho, Wo);
  return (int)cudaGetLastError();
}
