// Helpers shared by the hand-written GPU kernels (kernels/gpu_mma.c,
// kernels/gpu_sgemm.c): checks on the bufferized linalg.matmul a kernel
// replaces, and the splice of the kernel's MLIR text in its place.
// Internal to kernels/.
#ifndef KILN_KERNELS_GPU_SPLICE_H_
#define KILN_KERNELS_GPU_SPLICE_H_

#include <stdbool.h>
#include <stdint.h>

#include <mlir-c/IR.h>

#include "lib/base/base.h"

bool kiln_gpu_op_named(MlirOperation op, const char *name);
// A static, identity-layout (row-major) 2-D memref of d0 x d1 `element`s.
bool kiln_gpu_whole_matrix(MlirType t, int64_t d0, int64_t d1, MlirType element);
// True when an op strictly between `from` and `to` (same block) uses `buf`
// or a view of it, at any depth.
bool kiln_gpu_used_between(MlirOperation from, MlirOperation to, MlirValue buf);
// The linalg.fill of `c` with 0.0 before `mm` in its block, with nothing
// touching `c` in between, or a null op: a kernel that overwrites C stands
// for both.
MlirOperation kiln_gpu_zero_fill(MlirOperation mm, MlirValue c);
// Parses `text` (one func.func whose arguments are `args`), moves its body
// before `mm` with the arguments bound, and erases `mm`. `what` names the
// kernel in the error when the text does not parse (a generator bug).
kiln_status_t kiln_gpu_splice(MlirContext ctx, const char *text, MlirOperation mm,
                              const MlirValue *args, int nargs, const char *what);

// A linalg.matmul's operand form: 0 for the default indexing maps (A[M, K]),
// 1 for kiln's transposed-lhs form (A given as A^T, [K, M]: lowering/ops/
// matmul.c), 2 for its transposed-rhs form (B given as B^T, [N, K]: a
// linear's weight), -1 for anything else.
int kiln_gpu_matmul_lhs_form(MlirOperation mm);

#endif  // KILN_KERNELS_GPU_SPLICE_H_
