// lib/autotune: tile sizes for kernels — a heuristic choice, a search space,
// a measured search, and a persistent tuning database.
//
// Knows neither MLIR nor CUDA. kernels/ describes each structured op it is
// about to tile as a kiln_kernel_desc_t (kind, loop ranges, which loops
// reduce, a hash of the op); this module answers with a kiln_tile_config_t.
// lib/api decides which answer to use: the heuristic (mode "default"), a
// tuning-database entry, or the candidate being measured ("max-autotune").
//
// The heuristic follows IREE's CPU strategy: distribution tiles from the
// workload and the thread count, register tiles bounded by the vector
// register file, cache tiles only where a contraction's operands outgrow L2.
#ifndef KILN_LIB_AUTOTUNE_AUTOTUNE_H_
#define KILN_LIB_AUTOTUNE_AUTOTUNE_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lib/base/base.h"
#include "lib/cache/cache.h"

#define KILN_TILE_MAX_LOOPS 16

typedef enum kiln_kernel_kind_e {
  KILN_KERNEL_ELEMENTWISE = 0,    // every loop parallel (fills, copies too)
  KILN_KERNEL_TRANSPOSE = 1,      // a permute moving the innermost dim
  KILN_KERNEL_ROW_REDUCTION = 2,  // one reduction loop, the innermost
  KILN_KERNEL_CONTRACTION = 3,    // matmul-like: one input misses n, one m
  // The f32 GEMM microkernel (lowering/ops/matmul.c, emit_f32_dot), emitted
  // by lowering/ rather than tiled by kernels/: loops (m, n, k), m_dim 0,
  // n_dim 1, k a reduction. Its config reads: reg[0] the register tile's
  // rows (its columns are two vectors, reg[1] = 32; reg[2] = 1); cache[2]
  // the K block (0: all of K); forall[0] the rows of a thread's block (0
  // where M is symbolic: quarters of it at run time); forall[1] the
  // columns of a thread's group of 32-column panels (0: one group, all
  // columns); cache[0] the rows of A a thread block packs per K block
  // (its whole block, forall[0] or M; 0: A read in place). Blocks and
  // groups may end partial (the kernel masks its last rows and panel);
  // where A is packed, row blocks and K blocks are whole.
  KILN_KERNEL_F32_DOT = 4,
  // The bf16 tensor-core GEMM of the CUDA target (kernels/gpu_mma.c):
  // loops (m, n, k), whole blocks. Its config reads: reg[0] the block's
  // rows (128), reg[1] its columns (128; 128 or 256 for the warpgroup-MMA
  // form where N allows), reg[2] the K step (32; 64 for warpgroup MMA);
  // cache[2] the pipeline's stages (3; 3..6 for warpgroup MMA, within the
  // shared memory of a block, KILN_GPU_MMA_SHARED_BYTES); forall[0] the
  // block rows of an L2 group (blocks run down a group's rows before the
  // next column: a power of two dividing M / 128). The target is the GPU,
  // so kiln_cpu_target_t plays no part.
  KILN_KERNEL_GPU_MMA = 5,
  // The f32 convolution microkernel (lowering/ops/matmul.c, emit_conv_dot),
  // emitted by lowering/: loops (n, f, p, c, t) over images, filters,
  // pixels of the flat wide grid, channels and taps (kh, kw as one loop),
  // c and t reductions; m_dim 1, n_dim 2. Its config reads: reg[1] the
  // register tile's filters, reg[2] its pixels (whole 16-lane vectors;
  // the chunk's last pixels go in tiles of one vector); forall[1] the
  // filters of a task (0: all; a multiple of reg[1] dividing F);
  // forall[2] the pixels of a task's chunk (0: all of P; a multiple of 16
  // dividing P); cache[3] the channels of a block, whose taps stay in L1
  // while a tile goes through them (0: all C; the last block may be
  // shorter). Images are always tasks of their own.
  KILN_KERNEL_CONV_DOT = 6,
  // The bf16 GEMM microkernel (lowering/ops/matmul.c, emit_bf16_dot):
  // loops (m, n, k), k a reduction, the whole of K in registers. Its
  // config reads: reg[0] the register tile's rows (its columns are two
  // vectors, reg[1] = 32; reg[2] = 2, a vdpbf16ps pair of k); forall[0]
  // the rows of a thread's block (0: all of M, or quarters of a symbolic
  // M at run time). With AMX (`amx`) a block's rows run as 32-row tiles on
  // the tile unit first and its last rows % 32 as register tiles.
  KILN_KERNEL_BF16_DOT = 7,
} kiln_kernel_kind_t;

// Dynamic shared memory a block may have on sm_90 (227 KB).
#define KILN_GPU_MMA_SHARED_BYTES (227 << 10)

// The range the heuristic plans a loop of unknown size (a symbolic size)
// with. A power of two, so every power-of-two tile divides it; at run time
// the last tile of such a loop is partial (kernels/ peels it off).
#define KILN_DYNAMIC_RANGE_STANDIN 1024

// One structured op, as kernels/ sees it. Loops in `dynamic_mask` have a
// size known only at run time; their `range` is KILN_DYNAMIC_RANGE_STANDIN.
typedef struct kiln_kernel_desc {
  kiln_kernel_kind_t kind;
  int32_t loop_count;
  int64_t range[KILN_TILE_MAX_LOOPS];
  uint32_t reduction_mask;  // bit i: loop i is a reduction loop
  uint32_t dynamic_mask;    // bit i: loop i's size is symbolic
  // Contractions: the two parallel loops that get the register tile (the
  // rows and columns of the output block); -1 otherwise.
  int32_t m_dim, n_dim;
  // Transposes: the output loop that walks the input's innermost dim (the
  // register block spans it and the output's innermost loop); r - 2 for a
  // swap of the last two dims.
  int32_t transpose_dim;
  int32_t elem_bytes;  // bytes of one element of the computation (f32: 4)
  bool nested;         // already inside a parallel loop: no forall of its own
  // An operand index is a sum of loops (a convolution's input, kh*Wp + p):
  // the schedule folds the register tile's unit loops so the vectorizer
  // sees plain maps.
  bool sum_maps;
  // The body gathers (tensor.extract). From a dense tensor it is vectorized
  // with vector.gather (kernels/cpu_vectorize.c, gather_source_dense); from
  // one that may be strided once bufferized (`gather_scalar`), it is tiled
  // and threaded but stays scalar.
  bool gather, gather_scalar;
  // KILN_KERNEL_F32_DOT: A is packed per register tile ([M / rows, K,
  // rows]) by a kernel of its own (a transposed lhs, a weight gradient),
  // so the tile's rows stay the heuristic's: other rows would change that
  // kernel, and the measured search replays kernels in a fixed order.
  bool fixed_rows;
  // KILN_KERNEL_GPU_MMA: the warpgroup-MMA form (sm_90), else mma.sync.
  bool wgmma;
  // KILN_KERNEL_BF16_DOT: rows run on AMX tiles first.
  bool amx;
  kiln_hash128_t hash; // the op's identity (its printed form, shapes included)
} kiln_kernel_desc_t;

// Tile sizes at three levels; 0 means "not tiled at this level". Each
// nonzero size divides the size of the level above (the loop range for
// `forall`), so every tile is full and vectorizes with static shapes.
typedef struct kiln_tile_config {
  int32_t loop_count;
  int64_t forall[KILN_TILE_MAX_LOOPS];  // one scf.forall over threads
  int64_t cache[KILN_TILE_MAX_LOOPS];   // scf.for blocks that stay in cache
  int64_t reg[KILN_TILE_MAX_LOOPS];     // the vectorized register tile
  // A row reduction's reduction loop split by `reduction_tile` into a vector
  // accumulator (tile_reduction_using_for); -1 for none.
  int32_t reduction_dim;
  int64_t reduction_tile;
} kiln_tile_config_t;

// What the heuristic needs to know of the machine.
typedef struct kiln_cpu_target {
  int32_t vector_bytes;      // 64 (AVX-512), 32 (AVX2), 16 (SSE, NEON)
  int32_t vector_registers;  // 32 (AVX-512), 16 (AVX2)
  int32_t threads;           // threads a kernel may use
  int64_t l1_bytes, l2_bytes;
} kiln_cpu_target_t;

// Iterations of the whole loop nest (as a double: no overflow).
double kiln_kernel_work(const kiln_kernel_desc_t *desc);

// The default choice for `desc` on `target`.
void kiln_autotune_heuristic(const kiln_kernel_desc_t *desc,
                             const kiln_cpu_target_t *target,
                             kiln_tile_config_t *out);

// True when `config` fits `desc` (same loop count, every size divides the
// level above, the register tile stays within the register file for
// contractions). `why` (may be NULL) says what is wrong otherwise.
bool kiln_autotune_config_valid(const kiln_kernel_desc_t *desc,
                                const kiln_cpu_target_t *target,
                                const kiln_tile_config_t *config, char *why,
                                size_t why_len);

// The search space, as stages of a coordinate descent: stage `stage` varies
// one knob of `base` (register tile, cache tiles, distribution, vector
// width) and writes up to `cap` valid configs other than `base` itself.
// Returns how many; kiln_autotune_stage_count says how many stages `desc`
// has.
int kiln_autotune_stage_count(const kiln_kernel_desc_t *desc);
int kiln_autotune_candidates(const kiln_kernel_desc_t *desc,
                             const kiln_cpu_target_t *target,
                             const kiln_tile_config_t *base, int stage,
                             kiln_tile_config_t *out, int cap);

// "forall=[0,64,0] cache=[...] reg=[...] split=-1:0", for logs.
void kiln_autotune_config_format(const kiln_tile_config_t *config, char *buf,
                                 size_t len);
// "contraction 1024x1024x1024", for logs and progress lines.
void kiln_autotune_desc_format(const kiln_kernel_desc_t *desc, char *buf,
                               size_t len);

//===--- measured search ---------------------------------------------------===//

// Compiles the kernels with `configs` (one per kernel, in kernels/' order)
// and returns the time of one run of the whole compiled function.
typedef kiln_status_t (*kiln_autotune_measure_fn)(
    void *user, const kiln_tile_config_t *configs, double *out_seconds);

typedef struct kiln_autotune_search_options {
  double budget_seconds;   // stop starting new measurements past this
  double min_work;         // kernels with less work keep the heuristic
  const char *label;       // progress lines name this (the graph)
  bool progress;           // print progress to stderr
  // Kernels whose config came from the tuning database: not searched.
  const bool *known;
  // Receives, per kernel, whether its search ran to the end (those results
  // are worth keeping in the database). May be NULL.
  bool *done;
} kiln_autotune_search_options_t;

typedef struct kiln_autotune_search_result {
  int measured;            // configurations compiled and timed
  int tuned;               // kernels searched
  double baseline_seconds; // the function with the starting configs
  double best_seconds;     // ... and with the chosen ones
  bool budget_exhausted;
} kiln_autotune_search_result_t;

// Coordinate descent over every kernel of `descs` with enough work, biggest
// first: for each stage of its search space, every candidate is measured
// with all other kernels at their current best; a candidate replaces the
// current config only when it is at least 2% faster (noise on shared
// machines). `configs` holds the starting configs and receives the chosen
// ones. A measurement that fails (the candidate does not compile) is
// skipped and counted out, never fatal.
kiln_status_t kiln_autotune_search(const kiln_kernel_desc_t *descs, int count,
                                   const kiln_cpu_target_t *target,
                                   const kiln_autotune_search_options_t *opts,
                                   kiln_autotune_measure_fn measure, void *user,
                                   kiln_tile_config_t *configs,
                                   kiln_autotune_search_result_t *result);

//===--- tuning database ---------------------------------------------------===//

// Entries live in the compile cache (lib/cache: atomic writes, checksums,
// ownership checks, LRU), under a key made of the kernel hash, the CPU model
// (`cpu_id`) and the thread count, so a tuned config is reused by any graph
// holding the same kernel on the same machine, in any later process. An
// entry that does not fit `desc` is ignored.
bool kiln_autotune_db_get(kiln_cache_t *cache, const char *cpu_id,
                          const kiln_kernel_desc_t *desc,
                          const kiln_cpu_target_t *target,
                          kiln_tile_config_t *out, double *out_seconds);
kiln_status_t kiln_autotune_db_put(kiln_cache_t *cache, const char *cpu_id,
                                   const kiln_kernel_desc_t *desc,
                                   const kiln_cpu_target_t *target,
                                   const kiln_tile_config_t *config,
                                   double seconds);

#endif  // KILN_LIB_AUTOTUNE_AUTOTUNE_H_
