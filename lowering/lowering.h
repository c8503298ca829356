// lowering/: kiln graph → MLIR linalg on tensors → the target pipeline.
// Knows graphs and MLIR; nothing of the runtime (jit/) or the API.
#ifndef KILN_LOWERING_LOWERING_H_
#define KILN_LOWERING_LOWERING_H_

#include <mlir-c/IR.h>

#include "kernels/kernels.h"
#include "lib/graph/graph.h"

// The name of the entry point every lowered graph defines.
#define KILN_ENTRY_NAME "kiln_main"

// What the target CPU offers the lowering beyond linalg.
typedef struct kiln_lower_options {
  // AVX512-BF16 (vdpbf16ps): bf16 matmuls use the packed dot-product
  // microkernel of lowering/ops/matmul.c instead of f32 FMAs.
  bool x86_bf16_dot;
  // CUDA: a reduction over adjacent dims reduces one collapsed dim (a bias
  // gradient sums [B*T, C], not [B, T, C]), so the GPU schedule can split
  // its single reduction loop across threads.
  bool collapse_reductions;
  // CPU row kernels (lowering/ops/nn.c): a large layer norm runs on blocks
  // of rows that stay in cache, and a softmax held in cache (a block of
  // rows, or a whole tensor under 8 MB) keeps its exponentials and
  // multiplies by the reciprocal sum. Off for CUDA, whose row kernels (kernels/gpu_rows.c)
  // recognize the forms they were written for.
  bool cpu_rows;
  // CPU: convolutions as contractions (lowering/ops/matmul.c: direct over
  // the flattened input at stride 1, one per kernel tap otherwise); CUDA
  // keeps linalg.conv_2d.
  bool conv_taps;
  // CPU: a matmul whose lhs is a transpose reads the untransposed source
  // through its indexing map (the outer-product contraction loads A^T's
  // columns as rows). CUDA: only where the f32 GEMM kernel
  // (kernels/gpu_sgemm.c, which reads A^T's tiles directly) takes the
  // shape; otherwise the transpose is materialized and the matmul keeps
  // the default maps.
  bool lhs_transpose_map;
  // CPU: addmm (alpha = 1) accumulates into its broadcast bias instead of
  // zeros: the bias add is no pass of its own, and the schedule fuses the
  // broadcast into the register tiles (accumulators start as bias vectors).
  // CUDA's matmul kernels start from a zero fill.
  bool matmul_bias_init;
  // CPU: a reduction of a whole large tensor to one value reduces rows of a
  // [P, N/P] view first (parallel, vector partial sums, as any row
  // reduction), then the P partials; as one reduction it ran on one thread
  // with a horizontal sum per vector. CUDA splits reductions in its own
  // schedule (kernels/gpu_schedule.c).
  bool split_full_reductions;
  // CUDA: lhs_transpose_map is subject to kiln_kernels_sgemm_applies (f32).
  bool cuda;
  // CUDA: the device's compute capability (90 for sm_90; 0: unknown). Where
  // the warpgroup-MMA kernel applies (kiln_kernels_wgmma_applies), a bf16
  // matmul against a transposed weight (x @ W^T) reads W [N, K] in place
  // through its indexing map: K-major, wgmma's own layout for B
  // (kernels/gpu_mma.c), instead of a transpose kernel first.
  int cuda_sm;
  // AMX-BF16 (with x86_bf16_dot): the bf16 microkernel's 32-row tiles run
  // on the tile unit (tdpbf16ps over packed B), lowering/ops/matmul.c.
  bool x86_amx;
  // AVX-512: large f32 matmuls use the packed-B FMA microkernel of
  // lowering/ops/matmul.c instead of the tiled linalg.matmul, and f32
  // stride-1 convolutions its convolution microkernel (emit_conv_dot)
  // instead of the schedule's contraction.
  bool x86_f32_dot;
  // With x86_f32_dot: q @ k^T (* scale) -> softmax -> @ v chains run as one
  // kernel whose scores stay in cache (lowering/ops/attention.c);
  // KILN_ATTENTION=0 lowers them op by op (comparisons).
  bool fused_attention;
  // Where microkernels emitted here (the f32 GEMM's, KILN_KERNEL_F32_DOT)
  // get their tiles: lib/api's heuristic, tuning database or measured
  // candidate, as kernels/ asks for the schedule's tiles. NULL: the
  // heuristic.
  const kiln_kernel_tiling_t *tiling;
} kiln_lower_options_t;

// Lowers a static-shaped graph to MLIR text: one func.func @kiln_main taking
// one memref per input (strided layout where `input_strided[i]`, which may be
// NULL for all-contiguous) then one contiguous memref per output, with the
// body in linalg on tensors. `options` may be NULL (generic CPU).
kiln_status_t kiln_lower_to_linalg(const kiln_graph_t *g,
                                   const bool *input_strided,
                                   const kiln_lower_options_t *options,
                                   char **out_text);

// An MLIR context set up for kiln: every dialect, pass and LLVM translation
// registered, diagnostics captured for error messages.
typedef struct kiln_mlir kiln_mlir_t;
kiln_status_t kiln_mlir_create(kiln_mlir_t **out);
void kiln_mlir_destroy(kiln_mlir_t *m);
MlirContext kiln_mlir_context(kiln_mlir_t *m);

typedef struct kiln_pipeline_options {
  int vectorize;         // run the kernels/ schedules at the VECTORIZED stage
  int threads;           // > 1: scf.forall loops become OpenMP with this many
                         // threads; otherwise sequential loops
  const char *dump_dir;  // write the IR after every stage here (NULL: none)
  const char *dump_tag;  // file name prefix for dumps
  // Tile sizes for the kernels/ schedules (NULL: the heuristic for a
  // generic target).
  const struct kiln_kernel_tiling *tiling;
} kiln_pipeline_options_t;

// The diagnostics MLIR emitted since the last clear, appended to `s` (and
// cleared); for steps that apply transform scripts (kernels/).
void kiln_mlir_clear_diagnostics(kiln_mlir_t *m);
kiln_status_t kiln_mlir_with_diagnostics(kiln_mlir_t *m, kiln_status_t s);
// Parses MLIR text into a module (errors carry MLIR's diagnostics).
kiln_status_t kiln_mlir_parse(kiln_mlir_t *m, const char *text,
                              MlirModule *out_module);
// Runs the CPU pipeline stages after `from` up to and including `to`
// (from = KILN_STAGE_LINALG runs fusion first).
kiln_status_t kiln_pipeline_run(kiln_mlir_t *m, MlirModule module,
                                kiln_stage_t from, kiln_stage_t to,
                                const kiln_pipeline_options_t *opts);
// Prints a module (caller frees with free()).
kiln_status_t kiln_mlir_print(MlirModule module, char **out_text);
// C API helpers the lowering's IR rewrites share (op names:
// kiln_gpu_op_named, kernels/gpu_splice.h): the value of an index
// arith.constant; a new one before `before`; a symbol of a block.
bool kiln_mlir_constant_index(MlirValue v, int64_t *out);
MlirValue kiln_mlir_index_constant(MlirContext ctx, MlirBlock block,
                                   MlirOperation before, int64_t v);
MlirOperation kiln_mlir_find_symbol(MlirBlock body, MlirStringRef name);
// Writes `text` to dump_dir/<tag>-<NN>-<stage>.mlir when dumping is on.
void kiln_pipeline_dump(const kiln_pipeline_options_t *opts, kiln_stage_t stage,
                        const char *text);

// Runs a pass pipeline (textual form) on `module`; errors carry MLIR's
// diagnostics and `what`.
kiln_status_t kiln_pipeline_run_text(kiln_mlir_t *m, MlirModule module,
                                     const char *pipeline, const char *what);

// Graphs that write their inputs (lowering/inplace.c): whether `module`
// stores into an input, and the rewrite that lets those stores happen in
// place. Run after fusion, before the kernels/ schedules.
bool kiln_inplace_needed(MlirModule module);
kiln_status_t kiln_inplace_prepare(kiln_mlir_t *m, MlirModule module);
// Outputs computed as reshapes of other tensors are stored from those
// tensors into views of the outputs, so their producers write the outputs
// in place (lowering/inplace.c); after fusion, on both targets.
kiln_status_t kiln_store_through_reshapes(MlirContext ctx, MlirModule module);

//===--- the CUDA target ---------------------------------------------------===//

#define KILN_GPU_MAX_ARGS 256
// The most dynamic shared memory a kiln kernel asks for (sm_90's 227 KB).
#define KILN_GPU_MAX_SHARED_BYTES (227 * 1024)

// One step of a compiled graph on the device: a kernel launch with its grid
// and block sizes and each kernel argument as a buffer index (the
// function's inputs then outputs, then the temporaries), or a
// device-to-device copy of `bytes` from args[0] + offsets[0] to args[1] +
// offsets[1] (offsets in bytes: a contiguous view inside a buffer).
typedef enum kiln_gpu_step_kind_e {
  KILN_GPU_LAUNCH = 0,
  KILN_GPU_COPY = 1,
} kiln_gpu_step_kind_t;

// A TMA tensor map a kernel takes by value (a 128-byte parameter): the
// launcher encodes it per call (cuTensorMapEncodeTiled) from the address
// of `buffer` plus `offset_bytes`. Sizes are innermost first, as CUDA
// takes them; strides[0] is the element size. The kernels' maps load tiles
// with out-of-bounds elements zero and no interleave.
#define KILN_GPU_TMAP_MAX_RANK 5
typedef struct kiln_gpu_tmap {
  int32_t buffer;    // buffer index, as a launch argument's
  int32_t rank;      // 1 .. KILN_GPU_TMAP_MAX_RANK
  int32_t dtype;     // kiln_dtype_t of the elements
  int32_t swizzle;   // shared-memory swizzle span in bytes: 0, 32, 64, 128
  int32_t l2promo;   // L2 promotion in bytes: 0, 64, 128, 256
  int32_t reserved;  // 0
  int64_t offset_bytes;
  int64_t dims[KILN_GPU_TMAP_MAX_RANK];
  int64_t strides[KILN_GPU_TMAP_MAX_RANK];  // bytes
  int32_t box[KILN_GPU_TMAP_MAX_RANK];      // the tile a load moves
} kiln_gpu_tmap_t;

// The ranked memref a TMA tensor-map kernel argument describes (the
// tensor-core kernel's `!llvm.ptr` launch operand, through its cast and
// nvgpu.tma.create.descriptor), or null: the buffer the kernel reads.
MlirValue kiln_gpu_tensor_map_source(MlirValue v);

// A launch argument that is tensor map i of the program, not a buffer.
#define KILN_GPU_TMAP_ARG(i) (-1 - (i))
#define KILN_GPU_ARG_TMAP(arg) (-1 - (arg))

typedef struct kiln_gpu_launch {
  kiln_gpu_step_kind_t kind;
  int64_t bytes;       // KILN_GPU_COPY
  int64_t offsets[2];  // KILN_GPU_COPY: source, destination
  int32_t module;  // KILN_GPU_LAUNCH: index into the program's PTX modules
  char name[128];
  uint32_t grid[3], block[3];
  uint32_t shared_bytes;  // KILN_GPU_LAUNCH: dynamic shared memory
  int32_t arg_count;
  int32_t args[KILN_GPU_MAX_ARGS];  // buffer indices, or KILN_GPU_TMAP_ARG(i)
} kiln_gpu_launch_t;

// A graph compiled for CUDA: PTX for all its kernels and the launches, in
// order, that the host function makes (kiln's launcher replays them on the
// caller's stream; memrefs are passed as bare device pointers). Buffer
// indices: the graph's inputs and outputs (arg_count), then temporaries
// (allocated per call), then constants (uploaded once when the program is
// loaded).
typedef struct kiln_gpu_program {
  int32_t module_count;
  char **ptx;  // per module (one per outlined kernel), NUL-terminated
  int32_t align;  // 16 when kernels use vector accesses: buffers must be
                  // 16-byte aligned; else 0
  int32_t arg_count;
  int32_t temp_count;
  int64_t *temp_bytes;
  int32_t launch_count;
  kiln_gpu_launch_t *launches;
  int32_t const_count;
  int64_t *const_bytes;
  void **const_data;  // host copies, const_bytes[i] each
  int32_t tmap_count;
  kiln_gpu_tmap_t *tmaps;  // TMA tensor maps the launches pass
} kiln_gpu_program_t;

// Lowers a module at the linalg stage for an NVIDIA GPU of `chip`
// ("sm_90"): fusion and bufferization as on the CPU, then parallel loops
// tiled to blocks of threads, outlined kernels, NVVM, PTX (no CUDA toolkit
// needed; libdevice is linked when installed). Graphs whose host side is
// more than launches and temporaries are UNSUPPORTED, with the op named.
kiln_status_t kiln_pipeline_run_gpu(kiln_mlir_t *m, MlirModule module,
                                    const char *chip,
                                    const kiln_pipeline_options_t *opts,
                                    kiln_gpu_program_t *out);
void kiln_gpu_program_free(kiln_gpu_program_t *program);
// Horizontal fusion (lowering/hfuse.c), KILN_HFUSE=0 turns it off. CUDA:
// independent launches of one block size in the host function of an
// outlined module become one kernel each; `*fused` counts the merged
// kernels.
kiln_status_t kiln_gpu_fuse_launches(MlirContext ctx, MlirModule module, int *fused);
// The buffer a chain of memref views (subview, expand/collapse_shape, cast,
// reshape, ...) starts from: a function argument or an allocation
// (lowering/hfuse.c).
MlirValue kiln_memref_view_root(MlirValue v);
// CPU: independent top-level scf.parallel loops (thread-distributed ops,
// before convert-scf-to-openmp) become one loop of `threads` iterations,
// each running its thread's share of every member.
kiln_status_t kiln_cpu_fuse_loops(MlirContext ctx, MlirModule module, int threads,
                                  int *fused);
// Stores into entry-function arguments larger than the caches, which the
// function only writes, become non-temporal where the address is aligned
// (lowering/streaming.c); `*count` counts them. CPU, in the LLVM stage after
// convert-vector-to-scf. KILN_STREAM_STORES=0 turns it off (part of the
// cache key: lib/api).
kiln_status_t kiln_cpu_streaming_stores(MlirContext ctx, MlirModule module, int *count);
bool kiln_streaming_stores_enabled(void);
// CPU, in the LLVM stage before convert-vector-to-scf: 1-D vector reads
// along a dim other than the innermost (a contraction tile's lhs column)
// become scalar loads and a vector.from_elements, which LLVM turns into
// broadcasts from memory (lowering/strided_reads.c); `*count` counts them.
// KILN_STRIDED_READS=0 turns it off (part of the cache key).
kiln_status_t kiln_cpu_unroll_strided_reads(MlirContext ctx, MlirModule module, int *count);
bool kiln_unroll_strided_reads_enabled(void);
// CPU, on the bufferized module: the compute pass of a row-block kernel
// prefetches the next block into L2 (lowering/prefetch.c); `*count` counts
// the prefetches. KILN_PREFETCH=0 turns it off (part of the cache key).
kiln_status_t kiln_cpu_prefetch_row_blocks(MlirContext ctx, MlirModule module, int *count);
bool kiln_prefetch_enabled(void);
// A program as bytes (the compile cache's payload for a CUDA variant) and
// back; deserializing checks every count and index.
kiln_status_t kiln_gpu_program_serialize(const kiln_gpu_program_t *program,
                                         void **out_data, size_t *out_size);
kiln_status_t kiln_gpu_program_deserialize(const void *data, size_t size,
                                           kiln_gpu_program_t *out);

#endif  // KILN_LOWERING_LOWERING_H_
