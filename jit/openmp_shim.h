// LLVM OpenMP (__kmpc_*) entry points on GNU libgomp; see openmp_shim.c.
#ifndef KILN_JIT_OPENMP_SHIM_H_
#define KILN_JIT_OPENMP_SHIM_H_

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>

// Binds to a libgomp already loaded in the process (or, with
// `load_if_absent`, the system's). False when none is usable.
bool kiln_gomp_bind(bool load_if_absent);
// That libgomp's omp_get_level (after kiln_gomp_bind), or NULL.
int (*kiln_gomp_level_fn(void))(void);

int32_t kiln_kmpc_global_thread_num(void *loc);
void kiln_kmpc_push_num_threads(void *loc, int32_t gtid, int32_t n);
void kiln_kmpc_fork_call(void *loc, int32_t argc, void *microtask, ...);
void kiln_kmpc_for_static_init_8u(void *loc, int32_t gtid, int32_t schedtype,
                                  int32_t *plastiter, uint64_t *plower,
                                  uint64_t *pupper, int64_t *pstride,
                                  int64_t incr, int64_t chunk);
void kiln_kmpc_for_static_fini(void *loc, int32_t gtid);
void kiln_kmpc_barrier(void *loc, int32_t gtid);

#endif  // KILN_JIT_OPENMP_SHIM_H_
