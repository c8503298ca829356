// kernels/: kernel strategies as transform-dialect schedules. lowering/
// instantiates them with tile sizes; issue-by-issue they grow into the
// per-kernel strategies of DESIGN.md (matmul packing, row reductions, ...).
#ifndef KILN_KERNELS_KERNELS_H_
#define KILN_KERNELS_KERNELS_H_

#include <stdint.h>

#include <mlir-c/IR.h>

#include "lib/base/base.h"

// Tile sizes for one structured op: one per loop, 0 = not tiled.
typedef struct kiln_tile_sizes {
  int32_t loop_count;
  int64_t sizes[16];
  // The parallel loop distributed over threads (scf.forall, then OpenMP),
  // tiled by sizes[forall_dim]; -1 for none.
  int32_t forall_dim;
  // A row reduction: after the tiling above, the reduction loop
  // `reduction_dim` is split by `reduction_tile` with a partial accumulator
  // (tile_reduction_using_for), so the loop carries a vector, not a scalar
  // that needs a horizontal reduction per step. -1 for none.
  int32_t reduction_dim;
  int64_t reduction_tile;
} kiln_tile_sizes_t;

// The schedule text for `count` tagged ops: each op tagged with
// `kiln.tile_id = i` is distributed over threads along its forall_dim
// (scf.forall) and tiled with sizes[i] (scf.for), then every function is
// vectorized (vectorize_children_and_apply_patterns). Caller frees.
kiln_status_t kiln_kernels_cpu_schedule(const kiln_tile_sizes_t *sizes,
                                        int32_t count, char **out_text);

// Picks tile sizes for every linalg op of `module` (the default heuristic:
// innermost dims to a vector width that divides them, outer dims to 1,
// matmuls to an 8x32 register tile), tags the ops, and applies the schedule.
// Ops it cannot tile statically (dynamic shapes, convolutions) are left for
// the scalar loop lowering.
kiln_status_t kiln_kernels_vectorize_cpu(MlirContext ctx, MlirModule module);

#endif  // KILN_KERNELS_KERNELS_H_
