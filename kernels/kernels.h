// kernels/: kernel strategies as transform-dialect schedules. lowering/
// instantiates them with tile sizes; issue-by-issue they grow into the
// per-kernel strategies of DESIGN.md (matmul packing, row reductions, ...).
#ifndef KILN_KERNELS_KERNELS_H_
#define KILN_KERNELS_KERNELS_H_

#include <stdint.h>

#include <mlir-c/IR.h>

#include "lib/autotune/autotune.h"
#include "lib/base/base.h"

// Asks for the tile config of one op. lib/api answers from the heuristic,
// the tuning database or the candidate being measured (lib/autotune); the
// answer must be valid for `desc` (kiln_autotune_config_valid).
typedef void (*kiln_tile_chooser_fn)(void *user, const kiln_kernel_desc_t *desc,
                                     kiln_tile_config_t *out);

typedef struct kiln_kernel_tiling {
  kiln_cpu_target_t target;      // for the heuristic when `choose` is NULL
  kiln_tile_chooser_fn choose;   // NULL: kiln_autotune_heuristic
  void *user;
} kiln_kernel_tiling_t;

// The tiles of a kernel emitted whole rather than scheduled here (the f32
// GEMM microkernel, the tensor-core GEMM): `desc` gets the hash of
// `identity` (its sizes and form: the tuning database's key), then
// `tiling` answers (NULL, or no chooser: the heuristic, on `fallback`
// where `tiling` is NULL); an answer that is not valid for `desc` is
// replaced by the heuristic's (kernels/tiling.c).
void kiln_kernel_tiles(const kiln_kernel_tiling_t *tiling, const kiln_cpu_target_t *fallback,
                       const char *identity, kiln_kernel_desc_t *desc,
                       kiln_tile_config_t *out);

// Producer fusion of one tagged op, three kinds (kernels/cpu_vectorize.c):
//   - the elementwise op making a contraction's init (a zero fill, an
//     addmm's broadcast bias), computed inside the contraction's thread
//     tiles rather than by a parallel loop of its own (one fork/join and
//     one pass over memory fewer per contraction): `fill`, `operand`;
//   - an elementwise op computed inside the thread tiles of a later
//     elementwise op that reads it, its result still written out
//     (multi-output fusion: an optimizer step's moment updates inside the
//     parameter update): `consumer`;
//   - a matmul computed inside the register tiles of the elementwise op
//     that is its only user (epilogue fusion): `epilogue`.
typedef struct kiln_kernel_fusion {
  int32_t fill;      // for a contraction: tile_id of its fused init, or -1
  int32_t operand;   // the contraction's operand that init is
  int32_t consumer;  // for an elementwise producer: its consumer's tile_id, or -1
  // For an elementwise op: tile_id of the matmul whose result it reads and
  // that is computed inside its register tiles (an epilogue: the matmul's
  // accumulators go through the op before they are stored), or -1.
  int32_t epilogue;
  int32_t epilogue_operand;  // the op's operand that is the matmul's result
  bool fused;        // tiled with its consumer, not on its own
} kiln_kernel_fusion_t;

// The schedule text for `count` tagged ops: each op tagged with
// `kiln.tile_id = i` is distributed over threads by configs[i].forall
// (scf.forall), tiled by its cache then register tiles (scf.for), its
// reduction split into a vector accumulator, then every function is
// vectorized (vectorize_children_and_apply_patterns). `fusion` (NULL: none)
// has one entry per op. Caller frees.
kiln_status_t kiln_kernels_cpu_schedule(const kiln_kernel_desc_t *descs,
                                        const kiln_tile_config_t *configs,
                                        const kiln_kernel_fusion_t *fusion,
                                        int32_t count, char **out_text);

// Describes every linalg op of `module` it can tile (static shapes;
// gathers only from dense tables; not named convolutions), asks `tiling` for its tiles, tags the ops and
// applies the schedule. Ops it cannot tile are left for the scalar loop
// lowering. `tiling` may be NULL (the heuristic for an AVX2-class target).
kiln_status_t kiln_kernels_vectorize_cpu(MlirContext ctx, MlirModule module,
                                         const kiln_kernel_tiling_t *tiling);

// Parses `text` (a transform module with @__transform_main) and applies it
// to `module`; `what` names it in errors.
kiln_status_t kiln_kernels_apply_script(MlirContext ctx, MlirModule module,
                                        const char *text, const char *what);

// The descriptor of a tileable linalg op (static shapes; gathers only from
// dense tables, marked `gather`, which the GPU schedule leaves alone; not
// named convolutions); false when kernels/ leaves the op alone. `nested` and
// `hash` are not filled.
bool kiln_kernels_describe(MlirOperation op, kiln_kernel_desc_t *desc);
// True when `op` already sits inside an scf.forall.
bool kiln_kernels_inside_forall(MlirOperation op);

//===--- GPU schedules (kernels/gpu_schedule.c) ----------------------------===//

// On tensors: every describable op not already inside a parallel loop is
// tiled to a 2-D (or 3-D) grid of blocks over its innermost parallel dims
// (scf.forall mapped to #gpu.block) and within a block to one output
// element per thread, the innermost dim on thread x so a warp's accesses
// are contiguous (scf.forall mapped to #gpu.thread). Reduction loops stay
// sequential per thread. The block foralls are tagged kiln.gpu_block = i.
// On tensor cores (`sm` 80 and up), bf16 x bf16 -> f32 matmuls in whole
// 128 x 128 x 32 tiles are tagged kiln.gpu_mma and left whole, with their
// zero fills, for kiln_kernels_mma_gpu; *out_mma counts them. Their only
// consumer is tagged kiln.gpu_mma_epilogue and left whole too when it
// rounds them to bf16, or, where the wgmma kernel applies, when it is an
// elementwise generic over the result and [M, N] or [N] inputs (a bias,
// an activation, a residual add).
// On tensor cores, also f32 x f32 -> f32 matmuls (the default indexing
// maps or the transposed-lhs form, static, sizes
// kiln_kernels_sgemm_applies takes) are tagged kiln.gpu_sgemm and left whole,
// with their zero fills, for kiln_kernels_sgemm_gpu (its kernel needs
// cp.async: sm_80+); *out_sgemm counts them. Other f32 matmuls keep the
// tiled schedule.
kiln_status_t kiln_kernels_tile_gpu(MlirContext ctx, MlirModule module, int sm,
                                    int *out_mma, int *out_sgemm);
// Whether a tagged matmul with K = `k` becomes the wgmma kernel on `sm`
// (90, K a multiple of 64, KILN_GPU_WGMMA not 0).
bool kiln_kernels_wgmma_applies(int sm, int64_t k);
// Whether the wgmma kernel takes its operand tiles by TMA
// (cp.async.bulk.tensor on tensor maps kiln's launcher encodes per call;
// KILN_GPU_TMA=0 keeps cp.async).
bool kiln_kernels_tma_applies(void);
// After bufferization: each kiln.gpu_mma matmul on whole row-major buffers
// becomes kernels/gpu_mma.c's hand-scheduled tensor-core kernel (a
// gpu.launch: cp.async pipeline into shared memory, then on `sm` 90 with K
// a multiple of 64 warpgroup MMA from shared memory (wgmma, dynamic shared
// memory: the module needs sm_90a), else ldmatrix and mma.sync), its
// kiln.gpu_mma_epilogue consumer folded into the stores; *out_count counts
// the mma.sync kernels, *out_wgmma the wgmma ones. Each kernel's block
// shape, pipeline depth and L2 grouping are asked of `tiling`
// (KILN_KERNEL_GPU_MMA; NULL: lib/autotune's heuristic).
kiln_status_t kiln_kernels_mma_gpu(MlirContext ctx, MlirModule module, int sm,
                                   const kiln_kernel_tiling_t *tiling,
                                   int *out_count, int *out_wgmma);
// The K step of kernels/gpu_sgemm.c's f32 GEMM in 128 x 128 blocks.
#define KILN_SGEMM_BK 8
// Whether kernels/gpu_sgemm.c's f32 GEMM takes M x N x K: whole 128 x 128 x
// KILN_SGEMM_BK tiles, whole 64 x 64 x 16 ones, or ragged sizes (M and N
// multiples of 4, K of 16) over the sizes rounded up to its blocks.
bool kiln_kernels_sgemm_applies(int64_t m, int64_t n, int64_t k);
// The same in whole tiles only (where a product of few blocks splits K).
bool kiln_kernels_sgemm_whole(int64_t m, int64_t n, int64_t k);
// After bufferization: each kiln.gpu_sgemm matmul on whole row-major f32
// buffers (A as [M, K], or as [K, M] in the transposed-lhs form) whose C is
// zero-filled just before becomes kernels/gpu_sgemm.c's hand-scheduled
// CUDA-core kernel (a gpu.launch of 256 threads per 128 x 128 or 64 x 64
// outputs: cp.async pipeline into shared memory, 8x8 or 4x4 f32 register
// tiles, exact FMAs; with few blocks, K split across grid z into a
// temporary of partial products that a second launch sums in a fixed
// order), which overwrites C; the fill is dropped. Others stay
// linalg.matmul (the parallel-loop mapping computes them). *out_count
// counts those replaced. Fails only when a generated kernel does not parse
// (a bug) or on allocation failure.
kiln_status_t kiln_kernels_sgemm_gpu(MlirContext ctx, MlirModule module,
                                     int *out_count);
// The text of that kernel for M x N x K (`a_transposed`: A given as [K,
// M]): func.func @kiln_sgemm(%A, %B, %C) holding its launches (for tests
// and standalone builds); NULL when kiln_kernels_sgemm_applies is false or
// on allocation failure. Caller frees.
char *kiln_kernels_sgemm_text(int64_t m, int64_t n, int64_t k, bool a_transposed);
// On tensors, before kiln_kernels_tile_gpu: each group of linalg generics
// over the rows of an f32[M,N] (softmax, log_softmax, layer norm: row
// reductions and the elementwise ops around them, in kiln's row forall or at
// function level) becomes one kernel, a row per L <= 32 lanes held in
// registers (16-byte loads and stores), reduced by gpu.shuffle xor
// butterflies -- longer rows (N > 2048) held by a whole block and reduced
// by gpu.all_reduce, or, when they do not split into whole warps, streamed
// by a warp in chunks --; block foralls tagged kiln.gpu_block >=
// 1000000. Groups it cannot do exactly (N not a multiple of 4, other
// element types, dynamic shapes, unknown ops) are left unchanged, as is a
// group whose generated kernel does not parse (a bug; KILN_LOG=cuda).
kiln_status_t kiln_kernels_rows_gpu(MlirContext ctx, MlirModule module);
// After bufferization: the row kernels' block-wide reductions (rows of
// whole blocks) become gpu.all_reduce ops; until then they are pure
// stand-ins, as deallocation rejects ops of undeclared memory effects.
kiln_status_t kiln_kernels_rows_gpu_finish(MlirContext ctx, MlirModule module);
// After bufferization: each tagged block forall becomes a gpu.launch
// (transform.gpu.map_forall_to_blocks) with its threads mapped
// (map_nested_forall_to_threads, the block's own dims).
kiln_status_t kiln_kernels_map_gpu(MlirContext ctx, MlirModule module);

#endif  // KILN_KERNELS_KERNELS_H_
