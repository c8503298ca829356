// KILN_LOG=regions: per-parallel-region wall times of compiled code
// (jit/regions.c).
#ifndef KILN_JIT_REGIONS_H_
#define KILN_JIT_REGIONS_H_

#include <stdint.h>

typedef void (*kiln_fork_call_fn)(void *loc, int32_t argc, void *microtask, ...);

// Times every region forked through kiln_regions_fork_call with `fork` (the
// real __kmpc_fork_call: libomp's or the libgomp shim's); the report is
// printed at process exit.
void kiln_regions_install(kiln_fork_call_fn fork);

// What compiled code's __kmpc_fork_call binds to while regions are timed.
void kiln_regions_fork_call(void *loc, int32_t argc, void *microtask, ...);

#endif  // KILN_JIT_REGIONS_H_
