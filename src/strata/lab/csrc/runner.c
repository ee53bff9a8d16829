/* strata's own decode-step runner (this repository's code, trusted: it never runs kernel
 * source from elsewhere; kernels from outside run confined and are never listed here).
 *
 * A bound decode step is a fixed list of calls: the lab's in-process C kernels and the glue
 * between them (residual and bias adds, K/V rows written into the cache). Calling each from
 * Python costs ~1-2 us of interpreter and ctypes per call, ~400 calls per token on a
 * 30-layer model: the same order as the smallest kernels. strata_run makes one ctypes call
 * run a whole stretch of the list.
 *
 * Kernel calls use the lab's C ABI (docs/kernels-abi.md): pointers, then int64 sizes, then
 * float params. Pointers and int64 are the same argument class in the x86-64 System V and
 * AArch64 calling conventions (integer registers, then the stack in order), and float params
 * go to the vector registers whatever their position, so every entry point is called through
 * one prototype with MAX_INTS integer and MAX_FLOATS float arguments: the callee reads the
 * ones it declares, the caller cleans up the rest. lab/runner.py checks the counts.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define MAX_INTS 16
#define MAX_FLOATS 4

enum { STEP_KERNEL = 0, STEP_ADD = 1, STEP_KV_STORE = 2, STEP_KV_STORE_F16 = 3,
       STEP_KV_STORE_Q8_0 = 4 };

typedef struct {
    int64_t kind;
    void *fn;                 /* STEP_KERNEL: the entry point */
    int64_t a[MAX_INTS];
    float f[MAX_FLOATS];
} strata_step;

typedef void (*entry_fn)(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                         int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                         int64_t, int64_t, float, float, float, float);

/* x[i] += y[i], i < n */
static void add(float *x, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] += y[i];
}

/* src [heads, d] -> the cache [heads, rows, d] at row *at; -1 when the row is outside */
static int kv_store(float *cache, const float *src, int64_t heads, int64_t rows, int64_t d,
                    const int64_t *at) {
    const int64_t row = *at;
    if (row < 0 || row >= rows) return -1;
    for (int64_t h = 0; h < heads; h++)
        memcpy(cache + (h * rows + row) * d, src + h * d, (size_t)d * sizeof(float));
    return 0;
}

/* kv_store into a float16 cache: each value rounded to nearest even (as torch's .to(float16),
   which the step's Python fallback uses) */
static int kv_store_f16(_Float16 *cache, const float *src, int64_t heads, int64_t rows,
                        int64_t d, const int64_t *at) {
    const int64_t row = *at;
    if (row < 0 || row >= rows) return -1;
    for (int64_t h = 0; h < heads; h++) {
        _Float16 *dst = cache + (h * rows + row) * d;
        for (int64_t i = 0; i < d; i++) dst[i] = (_Float16)src[h * d + i];
    }
    return 0;
}

/* kv_store into a q8_0 cache [heads, rows, d/32*34]: each 32 values of a row become a GGUF
   q8_0 block as ggml's quantize_row_q8_0 writes it (and strata.kernels.ops._linear_q's
   q8_0_blocks, the step's Python fallback): amax over the block, the fp16 scale
   fp16(amax/127) (float32 division, then nearest even), q = round-half-even(x * (127/amax))
   in float32 (0 for an all-zero block). A NaN or infinite value gives a NaN or infinite
   scale and zero quants, as the fallback writes. d % 32 == 0 (checked by the caller). */
static int kv_store_q8_0(uint8_t *cache, const float *src, int64_t heads, int64_t rows,
                         int64_t d, const int64_t *at) {
    const int64_t row = *at, nb = d / 32;
    if (row < 0 || row >= rows || d % 32) return -1;
    for (int64_t h = 0; h < heads; h++) {
        uint8_t *dst = cache + (h * rows + row) * nb * 34;
        for (int64_t b = 0; b < nb; b++, dst += 34) {
            const float *x = src + h * d + b * 32;
            float amax = 0.0f;
            for (int i = 0; i < 32; i++) {
                const float a = fabsf(x[i]);
                amax = (a > amax || a != a) && amax == amax ? a : amax;  /* NaN sticks */
            }
            const _Float16 scale = (_Float16)(amax / 127.0f);
            const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
            memcpy(dst, &scale, 2);
            for (int i = 0; i < 32; i++) {
                const float q = nearbyintf(x[i] * id);
                /* NaN and +-inf quants are 0, as torch.nan_to_num makes them */
                const float c = q != q || isinf(q) ? 0.0f : q > 127.0f ? 127.0f
                                : q < -127.0f ? -127.0f : q;
                dst[2 + i] = (uint8_t)(int8_t)c;
            }
        }
    }
    return 0;
}

/* Run steps[0..n): -1 when every step ran, else the index of the step that refused. */
int64_t strata_run(const strata_step *steps, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const strata_step *s = &steps[i];
        const int64_t *a = s->a;
        switch (s->kind) {
        case STEP_KERNEL:
            ((entry_fn)s->fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9],
                              a[10], a[11], a[12], a[13], a[14], a[15],
                              s->f[0], s->f[1], s->f[2], s->f[3]);
            break;
        case STEP_ADD:
            add((float *)a[0], (const float *)a[1], a[2]);
            break;
        case STEP_KV_STORE:
            if (kv_store((float *)a[0], (const float *)a[1], a[2], a[3], a[4],
                         (const int64_t *)a[5]))
                return i;
            break;
        case STEP_KV_STORE_F16:
            if (kv_store_f16((_Float16 *)a[0], (const float *)a[1], a[2], a[3], a[4],
                             (const int64_t *)a[5]))
                return i;
            break;
        case STEP_KV_STORE_Q8_0:
            if (kv_store_q8_0((uint8_t *)a[0], (const float *)a[1], a[2], a[3], a[4],
                              (const int64_t *)a[5]))
                return i;
            break;
        default:
            return i;
        }
    }
    return -1;
}
