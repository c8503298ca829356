// kernels/tiling.c: the tiles of a kernel that is emitted whole rather
// than scheduled by kernels/ (the CPU f32 GEMM microkernel in
// lowering/ops/matmul.c, the CUDA tensor-core GEMM in kernels/gpu_mma.c).
#include <string.h>

#include "kernels/kernels.h"

void kiln_kernel_tiles(const kiln_kernel_tiling_t *tiling, const kiln_cpu_target_t *fallback,
                       const char *identity, kiln_kernel_desc_t *desc,
                       kiln_tile_config_t *out) {
  kiln_hasher_t h;
  kiln_hasher_init(&h);
  kiln_hasher_update(&h, identity, strlen(identity));
  desc->hash = kiln_hasher_final(&h);
  const kiln_cpu_target_t *target = tiling ? &tiling->target : fallback;
  if (tiling && tiling->choose)
    tiling->choose(tiling->user, desc, out);
  else
    kiln_autotune_heuristic(desc, target, out);
  if (!kiln_autotune_config_valid(desc, target, out, NULL, 0))
    kiln_autotune_heuristic(desc, target, out);
}
