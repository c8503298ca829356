// KILN_LOG=regions: the wall time of every OpenMP parallel region that
// compiled code forks, for finding where a graph's time goes (which loop,
// and how much runs outside any parallel region).
//
// The JIT binds compiled code's __kmpc_fork_call to kiln_regions_fork_call,
// which times the real fork (libomp's, or the libgomp shim's) from the call
// to the join. A region is identified by its outlined body; the report, at
// process exit on stderr, lists regions in the order of their first call,
// which for one compiled function is the order of the omp.parallel ops at
// its loops stage (`kiln-opt --emit=loops`, KILN_DUMP_DIR). Calls, mean and
// minimum per region; the minimum is the steadier measure on a shared host.
// Compiled code is the same with and without it (binding happens at load
// time, cached objects included), so it is not part of the cache key.
#include <ffi.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "jit/regions.h"

enum { kMaxRegions = 512, kMaxArgs = 64 };

typedef struct {
  void *task;
  long calls;
  double total_ms, min_ms;
} region_t;

static kiln_fork_call_fn real_fork;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static region_t regions[kMaxRegions];
static int nregions, dropped;

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static void report(void) {
  pthread_mutex_lock(&lock);
  double total = 0;
  for (int i = 0; i < nregions; ++i) total += regions[i].total_ms;
  fprintf(stderr, "[kiln regions] %d parallel regions, %.3f ms in all\n", nregions, total);
  for (int i = 0; i < nregions; ++i) {
    const region_t *r = &regions[i];
    fprintf(stderr, "[kiln regions] region %d: %ld calls, mean %.4f ms, min %.4f ms\n", i,
            r->calls, r->total_ms / (double)r->calls, r->min_ms);
  }
  if (dropped)
    fprintf(stderr, "[kiln regions] %d more regions not recorded (over %d)\n", dropped,
            kMaxRegions);
  pthread_mutex_unlock(&lock);
}

static void record(void *task, double ms) {
  pthread_mutex_lock(&lock);
  int i = 0;
  while (i < nregions && regions[i].task != task) ++i;
  if (i == nregions) {
    if (nregions == kMaxRegions) {
      ++dropped;
      pthread_mutex_unlock(&lock);
      return;
    }
    regions[nregions++] = (region_t){task, 0, 0, ms};
  }
  region_t *r = &regions[i];
  r->calls++;
  r->total_ms += ms;
  if (ms < r->min_ms) r->min_ms = ms;
  pthread_mutex_unlock(&lock);
}

void kiln_regions_install(kiln_fork_call_fn fork) {
  pthread_mutex_lock(&lock);
  bool first = real_fork == NULL;
  real_fork = fork;
  pthread_mutex_unlock(&lock);
  if (first) atexit(report);
}

// The same variadic call as the caller's: (loc, argc, microtask, argc
// pointers), through libffi since argc varies per region.
void kiln_regions_fork_call(void *loc, int32_t argc, void *microtask, ...) {
  void *args[kMaxArgs];
  int32_t n = argc < kMaxArgs ? argc : kMaxArgs;
  va_list ap;
  va_start(ap, microtask);
  for (int32_t i = 0; i < n; ++i) args[i] = va_arg(ap, void *);
  va_end(ap);
  ffi_type *types[kMaxArgs + 3];
  void *values[kMaxArgs + 3];
  types[0] = &ffi_type_pointer;
  types[1] = &ffi_type_sint32;
  types[2] = &ffi_type_pointer;
  values[0] = &loc;
  values[1] = &n;
  values[2] = &microtask;
  for (int32_t i = 0; i < n; ++i) {
    types[i + 3] = &ffi_type_pointer;
    values[i + 3] = &args[i];
  }
  ffi_cif cif;
  if (ffi_prep_cif_var(&cif, FFI_DEFAULT_ABI, 3, (unsigned)n + 3, &ffi_type_void, types) !=
      FFI_OK) {
    // Not expected (pointer and int arguments only); the region runs
    // untimed through the fixed-argument form, which passes such arguments
    // the same way on x86-64.
    ffi_cif plain;
    if (ffi_prep_cif(&plain, FFI_DEFAULT_ABI, (unsigned)n + 3, &ffi_type_void, types) == FFI_OK)
      ffi_call(&plain, FFI_FN(real_fork), NULL, values);
    return;
  }
  double t0 = now_ms();
  ffi_call(&cif, FFI_FN(real_fork), NULL, values);
  record(microtask, now_ms() - t0);
}
