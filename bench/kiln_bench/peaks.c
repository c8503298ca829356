// The machine's peaks, for kiln-bench's CPU roofline. kiln-bench compiles
// this with the host C compiler (-O2 -march=native) and runs it once.
//   peaks fma THREADS   f32 FMA peak in GFLOP/s: every thread runs 12
//                       independent chains of vector FMAs held in registers
//                       (enough to cover FMA latency on two pipes).
//   peaks copy THREADS  memory bandwidth in GB/s (bytes read + written):
//                       each thread memcpy's its share of a 256 MB buffer
//                       pair (libc's copy: non-temporal stores at this size).
// Best of three runs each: the machine is shared.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

static size_t copy_bytes = (size_t)256 << 20;
static char *copy_src, *copy_dst;
static int copy_threads;

static void *copy_part(void *arg) {
  size_t i = (size_t)arg, part = copy_bytes / (size_t)copy_threads;
  memcpy(copy_dst + i * part, copy_src + i * part, part);
  return NULL;
}

static int copy_peak(int threads) {
  copy_threads = threads;
  copy_src = aligned_alloc(64, copy_bytes);
  copy_dst = aligned_alloc(64, copy_bytes);
  if (!copy_src || !copy_dst) return 1;
  memset(copy_src, 1, copy_bytes);  // map every page before timing
  memset(copy_dst, 0, copy_bytes);
  pthread_t *t = calloc((size_t)threads, sizeof(*t));
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    double t0 = now();
    for (int i = 0; i < threads; ++i)
      pthread_create(&t[i], NULL, copy_part, (void *)(size_t)i);
    for (int i = 0; i < threads; ++i) pthread_join(t[i], NULL);
    double g = 2.0 * (double)copy_bytes / (now() - t0) / 1e9;
    if (g > best) best = g;
  }
  printf("%.1f\n", best);
  free(t);
  free(copy_src);
  free(copy_dst);
  return 0;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "fma";
  int threads = argc > 2 ? atoi(argv[2]) : 1;
  if (threads < 1 || threads > 1024) threads = 1;
  if (strcmp(mode, "copy") == 0) return copy_peak(threads);
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
