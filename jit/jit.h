// jit/: turns an LLVM-dialect module into callable code (LLVM ORC through
// MLIR's ExecutionEngine) and calls entry points with their native
// signatures through libffi. Knows MLIR/LLVM and libffi, nothing of graphs.
#ifndef KILN_JIT_JIT_H_
#define KILN_JIT_JIT_H_

#include <stdint.h>

#include <mlir-c/IR.h>

#include "lib/base/base.h"

typedef struct kiln_jit kiln_jit_t;

// Compiles `module` (LLVM dialect) to a relocatable object for this host:
// translation to LLVM IR, the LLVM pipeline at `opt_level` (0..3), codegen
// for the host CPU, all in memory. *out_data is malloc'd (caller frees).
kiln_status_t kiln_jit_compile_object(MlirModule module, int opt_level,
                                      void **out_data, size_t *out_size);
// Links an object from kiln_jit_compile_object (this process or another one,
// through the compile cache) into a fresh LLJIT: no MLIR, no optimization.
kiln_status_t kiln_jit_load_object(const void *data, size_t size,
                                   kiln_jit_t **out_jit);
// Makes the OpenMP runtime (libomp) visible to JIT-linked code, once per
// process. False when it cannot be loaded: kernels then run single-threaded.
bool kiln_jit_openmp_available(void);

// "x86_64-pc-linux-gnu/znver4/+avx2,+fma,..." and the LLVM version: code
// compiled for one host id is only reused on the same.
const char *kiln_jit_host_id(void);
// The CPU has AMX-BF16 and this process may use its tiles (asked of the
// kernel once; KILN_AMX=0 says no). The host id ends in "/amx" then.
bool kiln_jit_amx_available(void);
void kiln_jit_destroy(kiln_jit_t *jit);
// The address of function `name`, or NULL.
void *kiln_jit_lookup(kiln_jit_t *jit, const char *name);

// A memref in MLIR's expanded calling convention: allocated pointer, aligned
// pointer, offset, sizes, strides (in elements).
typedef struct kiln_memref {
  void *allocated;
  void *aligned;
  int64_t offset;
  int32_t rank;
  int64_t sizes[8];
  int64_t strides[8];
} kiln_memref_t;

// A prepared call signature: `count` memref parameters of the given ranks,
// returning void. Immutable after creation; calls may share it across threads.
typedef struct kiln_ffi_sig kiln_ffi_sig_t;
kiln_status_t kiln_ffi_sig_create(const int32_t *ranks, int32_t count,
                                  kiln_ffi_sig_t **out_sig);
void kiln_ffi_sig_destroy(kiln_ffi_sig_t *sig);
// Calls `fn` with `memrefs` expanded into scalar arguments.
kiln_status_t kiln_ffi_call(const kiln_ffi_sig_t *sig, void *fn,
                            const kiln_memref_t *memrefs, int32_t count);

#endif  // KILN_JIT_JIT_H_
