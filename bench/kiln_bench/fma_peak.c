// The machine's f32 FMA peak: every thread runs 12 independent chains of
// vector FMAs held in registers (enough to cover FMA latency on two
// pipes), so nothing but the FMA units limits it. kiln-bench compiles this
// with the host C compiler (-O2 -march=native) and uses the result as the
// compute roofline of f32 kernels on the CPU.
// Usage: fma_peak THREADS  -> prints GFLOP/s of all threads together.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#if defined(__AVX512F__)
#define LANES 16
#define REG "+v"  // any of zmm0-31
#elif defined(__AVX__)
#define LANES 8
#define REG "+x"
#else
#define LANES 4
#define REG "+x"
#endif
typedef float vec __attribute__((vector_size(LANES * 4)));

static long iters = 1L << 24;

#define STEP(x) x = x * b + c;

static void *work(void *out) {
  const vec zero = {0};  // scalar + vector broadcasts (GNU C vectors)
  vec b = zero + 1.0001f, c = zero + 0.9999f;
  vec a0 = zero, a1 = zero + 1, a2 = zero + 2, a3 = zero + 3, a4 = zero + 4;
  vec a5 = zero + 5, a6 = zero + 6, a7 = zero + 7, a8 = zero + 8;
  vec a9 = zero + 9, a10 = zero + 10, a11 = zero + 11;
  for (long n = 0; n < iters; ++n) {
    STEP(a0) STEP(a1) STEP(a2) STEP(a3) STEP(a4) STEP(a5)
    STEP(a6) STEP(a7) STEP(a8) STEP(a9) STEP(a10) STEP(a11)
    // Keeps the chains in registers and the loop from being folded.
    __asm__ volatile("" : REG(a0), REG(a1), REG(a2), REG(a3));
  }
  vec s = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11;
  *(float *)out = s[0];
  return NULL;
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 1;
  if (threads < 1 || threads > 1024) threads = 1;
  pthread_t *t = calloc((size_t)threads, sizeof(*t));
  float *sink = calloc((size_t)threads, sizeof(*sink));
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {  // best of three: the machine is shared
    double t0 = now();
    for (int i = 0; i < threads; ++i) pthread_create(&t[i], NULL, work, &sink[i]);
    for (int i = 0; i < threads; ++i) pthread_join(t[i], NULL);
    double g = threads * (double)iters * 12 * LANES * 2 / (now() - t0) / 1e9;
    if (g > best) best = g;
  }
  printf("%.1f\n", best);
  free(t);
  free(sink);
  return 0;
}
