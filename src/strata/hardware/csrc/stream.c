/* STREAM-style memory bandwidth kernels for `strata probe --measure`.
 *
 * Rules kept (McCalpin's STREAM): arrays much larger than the last-level cache, every
 * thread first-touches the part of the arrays it later streams (so pages land on its NUMA
 * node), static OpenMP schedule so the same thread touches the same range every time.
 * Timing is done by the caller (strata.measure.timer), not here.
 */
#include <omp.h>
#include <stddef.h>

int strata_threads(void) { return omp_get_max_threads(); }

void strata_set_threads(int n) { if (n > 0) omp_set_num_threads(n); }

void strata_init(double *a, double *b, double *c, long n) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) { a[i] = 1.0; b[i] = 2.0; c[i] = 0.0; }
}

void strata_copy(const double *restrict a, double *restrict c, long n) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) c[i] = a[i];
}

void strata_triad(double *restrict a, const double *restrict b, const double *restrict c,
                  double s, long n) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) a[i] = b[i] + s * c[i];
}

/* Read-only stream: what a decode step does with the weights. `simd` lets the compiler
 * reorder the sum into vector accumulators; without it one dependent add chain per thread
 * bounds the loop by FP-add latency, not by memory. */
double strata_read(const double *restrict a, long n) {
    double sum = 0.0;
#pragma omp parallel for simd schedule(static) reduction(+ : sum)
    for (long i = 0; i < n; i++) sum += a[i];
    return sum;
}
