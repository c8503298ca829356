// The LLVM OpenMP entry points that MLIR's OpenMP translation calls
// (__kmpc_fork_call, static work-sharing, barrier), implemented on GNU
// libgomp. When the host process already runs a libgomp (PyTorch's CPU build
// does), kiln's parallel loops run on that same thread pool: two OpenMP
// runtimes on the same cores spin against each other (a kiln backward graph
// ran 1.6x slower inside PyTorch than alone). Without a host libgomp, kiln
// uses LLVM's libomp directly and this file is not involved.
#include <dlfcn.h>
#include <ffi.h>
#include <link.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "openmp_shim.h"

typedef void (*gomp_parallel_fn)(void (*fn)(void *), void *data,
                                 unsigned num_threads, unsigned flags);
typedef void (*gomp_barrier_fn)(void);
typedef int (*omp_int_fn)(void);

static struct {
  gomp_parallel_fn parallel;
  gomp_barrier_fn barrier;
  omp_int_fn thread_num, num_threads, level;
} gomp;

static _Thread_local int next_num_threads;

// The first loaded object whose name contains "libgomp".
static int find_gomp(struct dl_phdr_info *info, size_t size, void *out) {
  (void)size;
  if (info->dlpi_name && strstr(info->dlpi_name, "libgomp")) {
    *(void **)out = dlopen(info->dlpi_name, RTLD_NOW | RTLD_NOLOAD);
    return *(void **)out != NULL;
  }
  return 0;
}

bool kiln_gomp_bind(bool load_if_absent) {
  void *h = NULL;
  dl_iterate_phdr(find_gomp, &h);
  if (!h && load_if_absent) h = dlopen("libgomp.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (!h) return false;
  gomp.parallel = (gomp_parallel_fn)dlsym(h, "GOMP_parallel");
  gomp.barrier = (gomp_barrier_fn)dlsym(h, "GOMP_barrier");
  gomp.thread_num = (omp_int_fn)dlsym(h, "omp_get_thread_num");
  gomp.num_threads = (omp_int_fn)dlsym(h, "omp_get_num_threads");
  gomp.level = (omp_int_fn)dlsym(h, "omp_get_level");
  return gomp.parallel && gomp.barrier && gomp.thread_num && gomp.num_threads;
}

int (*kiln_gomp_level_fn(void))(void) { return gomp.level; }

int32_t kiln_kmpc_global_thread_num(void *loc) {
  (void)loc;
  return gomp.thread_num();
}

void kiln_kmpc_push_num_threads(void *loc, int32_t gtid, int32_t n) {
  (void)loc;
  (void)gtid;
  next_num_threads = n;
}

#define KILN_MAX_MICROTASK_ARGS 64

typedef struct {
  void *microtask;
  int32_t argc;
  void *args[KILN_MAX_MICROTASK_ARGS];
} fork_data_t;

// microtask(int32_t *gtid, int32_t *btid, args...): called through libffi,
// since the number of captured pointers varies per parallel region.
static void trampoline(void *p) {
  fork_data_t *d = p;
  int32_t gtid = gomp.thread_num(), btid = gtid;
  int32_t *pg = &gtid, *pb = &btid;
  ffi_type *types[KILN_MAX_MICROTASK_ARGS + 2];
  void *values[KILN_MAX_MICROTASK_ARGS + 2];
  types[0] = types[1] = &ffi_type_pointer;
  values[0] = &pg;
  values[1] = &pb;
  for (int32_t i = 0; i < d->argc; ++i) {
    types[i + 2] = &ffi_type_pointer;
    values[i + 2] = &d->args[i];
  }
  ffi_cif cif;
  if (ffi_prep_cif(&cif, FFI_DEFAULT_ABI, (unsigned)d->argc + 2, &ffi_type_void,
                   types) == FFI_OK)
    ffi_call(&cif, FFI_FN(d->microtask), NULL, values);
}

void kiln_kmpc_fork_call(void *loc, int32_t argc, void *microtask, ...) {
  (void)loc;
  fork_data_t d;
  d.microtask = microtask;
  d.argc = argc < KILN_MAX_MICROTASK_ARGS ? argc : KILN_MAX_MICROTASK_ARGS;
  va_list ap;
  va_start(ap, microtask);
  for (int32_t i = 0; i < d.argc; ++i) d.args[i] = va_arg(ap, void *);
  va_end(ap);
  int n = next_num_threads;
  next_num_threads = 0;
  gomp.parallel(trampoline, &d, (unsigned)(n > 0 ? n : 0), 0);
}

// Static schedule over the inclusive range [*lower, *upper] by `incr`: each
// thread gets one contiguous block (kmp_sch_static, no chunk).
void kiln_kmpc_for_static_init_8u(void *loc, int32_t gtid, int32_t schedtype,
                                  int32_t *plastiter, uint64_t *plower,
                                  uint64_t *pupper, int64_t *pstride,
                                  int64_t incr, int64_t chunk) {
  (void)loc;
  (void)gtid;
  (void)schedtype;
  (void)chunk;
  uint64_t lo = *plower, hi = *pupper;
  uint64_t step = incr > 0 ? (uint64_t)incr : 1;
  uint64_t trips = hi >= lo ? (hi - lo) / step + 1 : 0;
  uint64_t nth = (uint64_t)gomp.num_threads(), tid = (uint64_t)gomp.thread_num();
  uint64_t q = trips / nth, r = trips % nth;
  uint64_t first = tid * q + (tid < r ? tid : r);
  uint64_t count = q + (tid < r ? 1 : 0);
  if (count == 0) {
    // An empty block: lower above upper.
    *plower = hi + step;
    *pupper = hi;
    if (*plower < *pupper) {  // wrapped: use a canonical empty range
      *plower = 1;
      *pupper = 0;
    }
    if (plastiter) *plastiter = 0;
  } else {
    *plower = lo + first * step;
    *pupper = lo + (first + count - 1) * step;
    if (plastiter) *plastiter = first + count == trips;
  }
  if (pstride) *pstride = (int64_t)(trips * step);
}

void kiln_kmpc_for_static_fini(void *loc, int32_t gtid) {
  (void)loc;
  (void)gtid;
}

void kiln_kmpc_barrier(void *loc, int32_t gtid) {
  (void)loc;
  (void)gtid;
  gomp.barrier();
}
