// Host tensors for the tools and tests: allocation, random fill, comparison
// with per-dtype tolerances. Uses the public API plus the reference
// interpreter's element conversions (lib/ref), linked statically.
#ifndef KILN_TOOLS_TENSOR_UTIL_H_
#define KILN_TOOLS_TENSOR_UTIL_H_

#include <stdbool.h>
#include <stdint.h>

#include "kiln/kiln.h"

// A host tensor owning its buffers. `strided` tensors are views with every
// other element skipped in the last dim (a real non-contiguous layout).
typedef struct kt_tensor {
  DLTensor dl;
  int64_t shape[KILN_MAX_RANK];
  int64_t strides[KILN_MAX_RANK];
  void *base;
  size_t bytes;
} kt_tensor_t;

bool kt_alloc(kt_tensor_t *t, const kiln_tensor_type_t *type, bool strided);
void kt_free(kt_tensor_t *t);
int64_t kt_numel(const kt_tensor_t *t);

// The output side of a checked call: for each of `n` output types, a `got`
// tensor (poisoned, for kiln to fill) and a `want` tensor (for the reference
// interpreter), with their DLTensor views. On failure (out of memory) frees
// what it allocated and returns false.
bool kt_alloc_outputs(const kiln_tensor_type_t *types, size_t n, kt_tensor_t *got,
                      kt_tensor_t *want, DLTensor *got_dl, DLTensor *want_dl);
// Frees `n` tensors; zero-initialized (never allocated) ones are fine.
void kt_free_n(kt_tensor_t *t, size_t n);

// xorshift64*: deterministic per seed.
uint64_t kt_rand(uint64_t *state);
// Fills with uniform values: floats in [-1, 1), integers in [-5, 5],
// bools 0/1. Every element the view can reach, strided or not.
void kt_fill_random(kt_tensor_t *t, uint64_t *state);
// Fills every byte of the buffer with a poison pattern (NaN for floats).
void kt_poison(kt_tensor_t *t);

// Element `i` (row-major over the view) as a double.
double kt_get(const kt_tensor_t *t, int64_t i);

// Tolerances per dtype: |a - b| <= atol * scale + rtol * |b|, where scale is
// max(1, max |b|) over the tensor. Integers and bools compare exactly.
typedef struct kt_tolerance {
  double atol, rtol;
} kt_tolerance_t;
kt_tolerance_t kt_tolerance_for(DLDataType dtype);

typedef struct kt_compare {
  double max_abs_err;
  double max_rel_err;
  int64_t mismatches;
  int64_t first_bad;  // -1 if none
} kt_compare_t;

// Compares `got` with `want` (same type); NaNs match NaNs, infinities match
// infinities of the same sign. Returns true when within tolerance.
bool kt_compare(const kt_tensor_t *got, const kt_tensor_t *want,
                kt_tolerance_t tol, kt_compare_t *out);

// Monotonic time in seconds.
double kt_now(void);

#endif  // KILN_TOOLS_TENSOR_UTIL_H_
