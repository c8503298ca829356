// The ORC JIT (through MLIR's ExecutionEngine) and libffi calls.
#include <ffi.h>
#include <stdlib.h>
#include <string.h>

#include <mlir-c/ExecutionEngine.h>

#include "jit.h"

struct kiln_jit {
  MlirExecutionEngine engine;
};

kiln_status_t kiln_jit_create(MlirModule module, int opt_level,
                              kiln_jit_t **out_jit) {
  *out_jit = NULL;
  kiln_jit_t *j = calloc(1, sizeof(*j));
  if (!j) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "JIT");
  if (opt_level < 0) opt_level = 0;
  if (opt_level > 3) opt_level = 3;
  j->engine = mlirExecutionEngineCreate(module, opt_level, 0, NULL,
                                        /*enableObjectDump=*/false,
                                        /*enablePIC=*/false);
  if (mlirExecutionEngineIsNull(j->engine)) {
    free(j);
    return kiln_make_status(KILN_STATUS_COMPILE_ERROR,
                            "LLVM ORC JIT: creating the execution engine "
                            "failed (translation to LLVM IR or codegen)");
  }
  *out_jit = j;
  return NULL;
}

void kiln_jit_destroy(kiln_jit_t *jit) {
  if (!jit) return;
  mlirExecutionEngineDestroy(jit->engine);
  free(jit);
}

void *kiln_jit_lookup(kiln_jit_t *jit, const char *name) {
  return mlirExecutionEngineLookup(jit->engine,
                                   mlirStringRefCreateFromCString(name));
}

struct kiln_ffi_sig {
  ffi_cif cif;
  int32_t count;
  int32_t nargs;
  int32_t *ranks;     // count entries, in the same allocation
  ffi_type **types;   // nargs entries, in the same allocation
};

kiln_status_t kiln_ffi_sig_create(const int32_t *ranks, int32_t count,
                                  kiln_ffi_sig_t **out_sig) {
  *out_sig = NULL;
  int32_t nargs = 0;
  for (int32_t i = 0; i < count; ++i) {
    if (ranks[i] < 0 || ranks[i] > 8)
      return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                              "ffi signature: rank %d out of range", ranks[i]);
    nargs += 3 + 2 * ranks[i];
  }
  kiln_ffi_sig_t *s =
      calloc(1, sizeof(*s) + sizeof(ffi_type *) * ((size_t)nargs + 1) +
                    sizeof(int32_t) * ((size_t)count + 1));
  if (!s) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "ffi signature");
  s->count = count;
  s->nargs = nargs;
  s->types = (ffi_type **)(void *)(s + 1);
  s->ranks = (int32_t *)(void *)(s->types + nargs + 1);
  memcpy(s->ranks, ranks, sizeof(int32_t) * (size_t)count);
  ffi_type **types = s->types;
  int32_t k = 0;
  for (int32_t i = 0; i < count; ++i) {
    types[k++] = &ffi_type_pointer;
    types[k++] = &ffi_type_pointer;
    for (int32_t j = 0; j < 1 + 2 * ranks[i]; ++j) types[k++] = &ffi_type_sint64;
  }
  if (ffi_prep_cif(&s->cif, FFI_DEFAULT_ABI, (unsigned)nargs, &ffi_type_void,
                   types) != FFI_OK) {
    free(s);
    return kiln_make_status(KILN_STATUS_INTERNAL,
                            "libffi: ffi_prep_cif failed for %d arguments",
                            nargs);
  }
  *out_sig = s;
  return NULL;
}

void kiln_ffi_sig_destroy(kiln_ffi_sig_t *sig) { free(sig); }

// Enough argument slots for 256 rank-8 memrefs without touching the heap on
// the call path.
#define KILN_FFI_STACK_ARGS 1024

kiln_status_t kiln_ffi_call(const kiln_ffi_sig_t *sig, void *fn,
                            const kiln_memref_t *memrefs, int32_t count) {
  if (count != sig->count)
    return kiln_make_status(KILN_STATUS_INTERNAL,
                            "ffi call: %d memrefs for a signature of %d", count,
                            sig->count);
  void *stack_values[KILN_FFI_STACK_ARGS];
  void **values = stack_values;
  if (sig->nargs > KILN_FFI_STACK_ARGS) {
    values = malloc(sizeof(void *) * (size_t)sig->nargs);
    if (!values) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "ffi call");
  }
  int32_t k = 0;
  for (int32_t i = 0; i < count; ++i) {
    const kiln_memref_t *m = &memrefs[i];
    if (m->rank != sig->ranks[i]) {
      if (values != stack_values) free(values);
      return kiln_make_status(KILN_STATUS_INTERNAL,
                              "ffi call: memref %d has rank %d, signature %d",
                              i, m->rank, sig->ranks[i]);
    }
    values[k++] = (void *)&m->allocated;
    values[k++] = (void *)&m->aligned;
    values[k++] = (void *)&m->offset;
    for (int32_t j = 0; j < m->rank; ++j) values[k++] = (void *)&m->sizes[j];
    for (int32_t j = 0; j < m->rank; ++j) values[k++] = (void *)&m->strides[j];
  }
  ffi_call((ffi_cif *)&sig->cif, FFI_FN(fn), NULL, values);
  if (values != stack_values) free(values);
  return NULL;
}
