// GPU schedules: linalg ops tiled to blocks and threads with the
// transform dialect (tile_using_forall with #gpu.block / #gpu.thread
// mappings), then mapped to gpu.launch after bufferization.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>

#include "kernels/kernels.h"

// Threads per block: 2-D blocks of up to 32 x 32, or 256 in a row for ops
// with one parallel dim.
#define KILN_GPU_ROW 256
#define KILN_GPU_SIDE 32

static int64_t pow2_divisor(int64_t n, int64_t cap) {
  int64_t p = 1;
  while (p * 2 <= cap && n % (p * 2) == 0) p *= 2;
  return p;
}

static bool equals(MlirStringRef s, const char *p) {
  return s.length == strlen(p) && memcmp(s.data, p, s.length) == 0;
}

typedef struct {
  MlirContext ctx;
  kiln_sbuf_t script;
  int count;
  int k_loops[4096];  // ops whose K loop carries a vector accumulator
  int k_count;
} tiler_t;

// Tiles of the tensor-core schedule: a block of bm x bn outputs, warps of
// wm x wn (so 32 * bn/wn x bm/wm threads), K steps of bk. The lowering
// only emits the mma form for sizes in whole 128 x 128 x 32 tiles, which
// every choice here divides.
typedef struct {
  int bm, bn, wm, wn, bk;
} mma_tile_t;

// 128 x 128 blocks of 4 warps of 64 x 64, K steps of 16: 32 accumulators
// of 16x8 per warp, 164 registers, no spills (ptxas, sm_90). Measured on an
// H200, the matmul kernel at 4096^3 (B viewed transposed): 1.20 ms, against
// 1.46 ms with K steps of 32, 1.83 ms for 8 warps of 64 x 32, 1.77 ms for
// 8 warps of 32 x 64. KILN_GPU_MMA_TILE="bm,bn,wm,wn,bk" overrides it (a
// developer knob for comparing tiles until the autotuner measures them on
// the GPU).
static mma_tile_t mma_tile(void) {
  mma_tile_t t = {128, 128, 64, 64, 16};
  const char *env = getenv("KILN_GPU_MMA_TILE");
  mma_tile_t e;
  if (env && sscanf(env, "%d,%d,%d,%d,%d", &e.bm, &e.bn, &e.wm, &e.wn, &e.bk) == 5 &&
      e.bm > 0 && e.bn > 0 && e.wm > 0 && e.wn > 0 && e.bk > 0 &&
      128 % e.bm == 0 && 128 % e.bn == 0 && 32 % e.bk == 0 && e.bk % 16 == 0 &&
      e.bm % e.wm == 0 && e.bn % e.wn == 0 && e.wm % 16 == 0 && e.wn % 8 == 0 &&
      32 * (e.bn / e.wn) * (e.bm / e.wm) <= 1024)
    t = e;
  return t;
}

// True when `v` is the f16 view of bf16 bits: the result of a linalg.generic
// that yields an arith.bitcast of a bf16 (KILN_MMA_PUN; elementwise fusion
// may have merged producers into that generic).
static bool is_pun(MlirValue v) {
  if (!mlirValueIsAOpResult(v)) return false;
  MlirOperation g = mlirOpResultGetOwner(v);
  if (!equals(mlirIdentifierStr(mlirOperationGetName(g)), "linalg.generic") ||
      mlirOperationGetNumRegions(g) < 1)
    return false;
  MlirBlock body = mlirRegionGetFirstBlock(mlirOperationGetRegion(g, 0));
  if (mlirBlockIsNull(body)) return false;
  MlirOperation yield = mlirBlockGetTerminator(body);
  if (mlirOperationIsNull(yield) || mlirOperationGetNumOperands(yield) < 1)
    return false;
  MlirValue y = mlirOperationGetOperand(
      yield, mlirOpResultGetResultNumber(v) < mlirOperationGetNumOperands(yield)
                 ? mlirOpResultGetResultNumber(v)
                 : 0);
  if (!mlirValueIsAOpResult(y)) return false;
  MlirOperation cast = mlirOpResultGetOwner(y);
  return equals(mlirIdentifierStr(mlirOperationGetName(cast)), "arith.bitcast") &&
         mlirTypeIsABF16(mlirValueGetType(mlirOperationGetOperand(cast, 0)));
}

// The lowering's tensor-core form: linalg.matmul of f16 views of bf16 bits
// (is_pun; B transposed) into f32, static, in whole 128 x 128 x 32 tiles.
// A true f16 matmul is not one: lowering/gpu.c relabels the mma.sync of
// these as bf16 and refuses a module with any other mma.sync.
static bool is_mma_matmul(MlirOperation op) {
  if (!equals(mlirIdentifierStr(mlirOperationGetName(op)), "linalg.matmul") ||
      mlirOperationGetNumOperands(op) != 3)
    return false;
  MlirType a = mlirValueGetType(mlirOperationGetOperand(op, 0));
  MlirType b = mlirValueGetType(mlirOperationGetOperand(op, 1));
  MlirType c = mlirValueGetType(mlirOperationGetOperand(op, 2));
  if (!mlirTypeIsARankedTensor(a) || !mlirTypeIsARankedTensor(b) ||
      !mlirTypeIsARankedTensor(c) || !mlirShapedTypeHasStaticShape(a) ||
      !mlirShapedTypeHasStaticShape(b) || !mlirShapedTypeHasStaticShape(c) ||
      mlirShapedTypeGetRank(a) != 2 || mlirShapedTypeGetRank(b) != 2)
    return false;
  // C [M, N] = A [M, K] x B^T, B^T given as [N, K].
  return is_pun(mlirOperationGetOperand(op, 0)) &&
         is_pun(mlirOperationGetOperand(op, 1)) &&
         mlirTypeIsAF16(mlirShapedTypeGetElementType(a)) &&
         mlirTypeIsAF16(mlirShapedTypeGetElementType(b)) &&
         mlirTypeIsAF32(mlirShapedTypeGetElementType(c)) &&
         mlirShapedTypeGetDimSize(a, 0) % 128 == 0 &&
         mlirShapedTypeGetDimSize(b, 0) % 128 == 0 &&
         mlirShapedTypeGetDimSize(a, 1) % 32 == 0 &&
         mlirShapedTypeGetDimSize(b, 1) == mlirShapedTypeGetDimSize(a, 1);
}

// Mma matmuls are tagged kiln.gpu_mma = j before any schedule is applied
// (tiling their bitcast producers hides the pattern is_mma_matmul sees).
static bool marked_mma(MlirOperation op) {
  return !mlirAttributeIsNull(mlirOperationGetDiscardableAttributeByName(
      op, mlirStringRefCreateFromCString("kiln.gpu_mma")));
}

static MlirWalkResult mark_mma(MlirOperation op, void *user) {
  tiler_t *t = user;
  if (is_mma_matmul(op) && !kiln_kernels_inside_forall(op))
    mlirOperationSetDiscardableAttributeByName(
        op, mlirStringRefCreateFromCString("kiln.gpu_mma"),
        mlirIntegerAttrGet(mlirIntegerTypeGet(t->ctx, 64), t->k_count++));
  return MlirWalkResultAdvance;
}

// A linalg.fill whose result is the init of an mma matmul (fused into it).
static bool feeds_mma(MlirOperation op) {
  if (!equals(mlirIdentifierStr(mlirOperationGetName(op)), "linalg.fill") ||
      mlirOperationGetNumResults(op) != 1)
    return false;
  for (MlirOpOperand u = mlirValueGetFirstUse(mlirOperationGetResult(op, 0));
       !mlirOpOperandIsNull(u); u = mlirOpOperandGetNextUse(u))
    if (marked_mma(mlirOpOperandGetOwner(u)) && mlirOpOperandGetOperandNumber(u) == 2)
      return true;
  return false;
}

// Tensor-core schedule of one mma matmul (kernels/gpu_schedule.c's only
// warp-level one): blocks of outputs, tiled to warps (#gpu.warp, x then y),
// K in steps (mma_tile); the zero fill fused in and, once the K loop
// carries the warp's 16x8 accumulators (unrolled to mma shape, then
// hoisted), folded away. The
// pipeline's convert-vector-to-gpu turns the 16x8x16 contracts into
// nvgpu.mma.sync.
static MlirWalkResult mma_op(MlirOperation op, void *user) {
  tiler_t *t = user;
  if (!marked_mma(op)) return MlirWalkResultAdvance;
  int i = t->count++;
  mlirOperationSetDiscardableAttributeByName(
      op, mlirStringRefCreateFromCString("kiln.gpu_mma"),
      mlirIntegerAttrGet(mlirIntegerTypeGet(t->ctx, 64), i));
  mma_tile_t mt = mma_tile();
  // '@' stands for this op's index in the handle names and attributes, '?'
  // for the next of its tile numbers.
  static const char *const kScript =
      "    %mm@ = transform.structured.match attributes {kiln.gpu_mma = @ : "
      "i64} in %root : (!transform.any_op) -> !transform.any_op\n"
      "    %fill@ = transform.get_producer_of_operand %mm@[2] : "
      "(!transform.any_op) -> !transform.any_op\n"
      "    %b@, %bf@ = transform.structured.tile_using_forall %mm@ "
      "tile_sizes [?, ?] (mapping = [#gpu.block<y>, #gpu.block<x>]) : "
      "(!transform.any_op) -> (!transform.any_op, !transform.any_op)\n"
      "    %fb@, %bff@ = transform.structured.fuse_into_containing_op "
      "%fill@ into %bf@ : (!transform.any_op, !transform.any_op) -> "
      "(!transform.any_op, !transform.any_op)\n"
      "    %w@, %wf@ = transform.structured.tile_using_forall %b@ "
      "tile_sizes [?, ?] (mapping = [#gpu.warp<y>, #gpu.warp<x>]) : "
      "(!transform.any_op) -> (!transform.any_op, !transform.any_op)\n"
      "    %fw@, %wff@ = transform.structured.fuse_into_containing_op "
      "%fb@ into %wf@ : (!transform.any_op, !transform.any_op) -> "
      "(!transform.any_op, !transform.any_op)\n"
      "    %k@, %kl@ = transform.structured.tile_using_for %w@ "
      "tile_sizes [0, 0, ?] : (!transform.any_op) -> (!transform.any_op, "
      "!transform.any_op)\n"
      "    transform.structured.vectorize %k@ : !transform.any_op\n"
      "    transform.structured.vectorize %fw@ : !transform.any_op\n"
      "    %p@ = transform.param.constant @ : i64 -> !transform.param<i64>\n"
      "    transform.annotate %bff@ \"kiln.gpu_block\" = %p@ : "
      "!transform.any_op, !transform.param<i64>\n"
      "    %px@ = transform.param.constant ? : i64 -> !transform.param<i64>\n"
      "    transform.annotate %bff@ \"kiln.gpu_tx\" = %px@ : "
      "!transform.any_op, !transform.param<i64>\n"
      "    %py@ = transform.param.constant ? : i64 -> !transform.param<i64>\n"
      "    transform.annotate %bff@ \"kiln.gpu_ty\" = %py@ : "
      "!transform.any_op, !transform.param<i64>\n";
  const int tiles[] = {mt.bm, mt.bn, mt.wm, mt.wn, mt.bk,
                       32 * (mt.bn / mt.wn), mt.bm / mt.wm};
  int next = 0;
  for (const char *c = kScript; *c; ++c)
    if (*c == '@') kiln_sbuf_printf(&t->script, "%d", i);
    else if (*c == '?') kiln_sbuf_printf(&t->script, "%d", tiles[next++]);
    else kiln_sbuf_printf(&t->script, "%c", *c);
  if (t->k_count < 4096) t->k_loops[t->k_count++] = i;
  return MlirWalkResultAdvance;
}

static MlirWalkResult tile_op(MlirOperation op, void *user) {
  tiler_t *t = user;
  MlirStringRef name = mlirIdentifierStr(mlirOperationGetName(op));
  if (name.length < 7 || memcmp(name.data, "linalg.", 7) != 0)
    return MlirWalkResultAdvance;
  if (marked_mma(op) || feeds_mma(op)) return MlirWalkResultAdvance;  // mma_op's
  kiln_kernel_desc_t d;
  if (!kiln_kernels_describe(op, &d) || kiln_kernels_inside_forall(op))
    return MlirWalkResultAdvance;
  // Parallel dims of more than one iteration, innermost first: x, then y,
  // then z.
  int par[3], np = 0;
  for (int i = d.loop_count - 1; i >= 0 && np < 3; --i)
    if (!((d.reduction_mask >> i) & 1u) && d.range[i] > 1) par[np++] = i;
  if (np == 0) return MlirWalkResultAdvance;
  int64_t block[KILN_TILE_MAX_LOOPS] = {0}, thread[KILN_TILE_MAX_LOOPS] = {0};
  // Elementwise ops whose contiguous dim allows it move 4 elements per
  // thread as one 16-byte vector (ld.global.v4), for f32 and smaller.
  bool elementwise = d.reduction_mask == 0 && d.elem_bytes <= 4;
  int64_t vec = elementwise && d.range[par[0]] % (4 * 32) == 0 ? 4 : 1;
  // Contractions with one K loop and at most 3 parallel dims walk K in
  // vectorized steps of 4 with register accumulators (below); when the
  // output allows, each thread owns a 4x4 block of it (an outer-product
  // register tile: 16 accumulators, 64 multiply-adds per 8 vector loads).
  int k = -1, reductions = 0, big = 0;
  for (int l = 0; l < d.loop_count; ++l) {
    if ((d.reduction_mask >> l) & 1u) k = l, reductions++;
    else big += d.range[l] > 1;
  }
  // Row reductions (softmax, layer norm) likewise read their row 4 at a
  // time into a vector accumulator.
  bool kstep = ((d.kind == KILN_KERNEL_CONTRACTION && np >= 2) ||
                d.kind == KILN_KERNEL_ROW_REDUCTION) &&
               reductions == 1 && big == np && d.range[k] % 4 == 0;
  int64_t rt = kstep && d.kind == KILN_KERNEL_CONTRACTION &&
                       d.range[par[0]] % (4 * 32) == 0 &&
                       d.range[par[1]] % (4 * 8) == 0 ? 4 : 1;
  // A row reduction gives each thread a whole row, so it has as many
  // threads as rows: blocks of one warp spread them over every SM.
  int64_t xcap = d.kind == KILN_KERNEL_ROW_REDUCTION ? 32
                 : np == 1                           ? KILN_GPU_ROW
                                                     : KILN_GPU_SIDE;
  int64_t tx = pow2_divisor(d.range[par[0]] / (vec * rt), xcap);
  int64_t ty = np > 1 ? pow2_divisor(d.range[par[1]] / rt,
                                     rt > 1 ? KILN_GPU_SIDE / 2 : KILN_GPU_SIDE)
                      : 1;
  // Whole tiles only (the thread mapping needs static trip counts): a dim
  // whose power-of-two divisor is small (1000 = 8 x 125) would make tiny
  // blocks; such ops take the parallel-loop mapping with guarded tails.
  if (tx < 32 && d.range[par[0]] >= 32) return MlirWalkResultAdvance;
  block[par[0]] = tx * vec * rt;
  thread[par[0]] = vec * rt;
  if (np > 1) block[par[1]] = ty * rt, thread[par[1]] = rt;
  if (np > 2) block[par[2]] = 1;  // one block per index along z
  int i = t->count++;
  mlirOperationSetDiscardableAttributeByName(
      op, mlirStringRefCreateFromCString("kiln.gpu_op"),
      mlirIntegerAttrGet(mlirIntegerTypeGet(t->ctx, 64), i));
  kiln_sbuf_t *b = &t->script;
  kiln_sbuf_printf(b,
                   "    %%op%d = transform.structured.match attributes "
                   "{kiln.gpu_op = %d : i64} in %%root : (!transform.any_op) -> "
                   "!transform.any_op\n"
                   "    %%bt%d, %%bf%d = transform.structured.tile_using_forall "
                   "%%op%d tile_sizes [",
                   i, i, i, i, i);
  for (int k = 0; k < d.loop_count; ++k)
    kiln_sbuf_printf(b, "%s%lld", k ? ", " : "", (long long)block[k]);
  // Mapping attributes in loop order of the tiled dims.
  static const char *const xyz = "xyz";
  kiln_sbuf_puts(b, "] (mapping = [");
  bool first = true;
  for (int k = 0; k < d.loop_count; ++k) {
    if (!block[k]) continue;
    int which = k == par[0] ? 0 : (np > 1 && k == par[1]) ? 1 : 2;
    kiln_sbuf_printf(b, "%s#gpu.block<%c>", first ? "" : ", ", xyz[which]);
    first = false;
  }
  kiln_sbuf_puts(b, "]) : (!transform.any_op) -> (!transform.any_op, "
                    "!transform.any_op)\n");
  kiln_sbuf_printf(b,
                   "    %%p%d = transform.param.constant %d : i64 -> "
                   "!transform.param<i64>\n"
                   "    transform.annotate %%bf%d \"kiln.gpu_block\" = %%p%d : "
                   "!transform.any_op, !transform.param<i64>\n"
                   "    %%px%d = transform.param.constant %lld : i64 -> "
                   "!transform.param<i64>\n"
                   "    transform.annotate %%bf%d \"kiln.gpu_tx\" = %%px%d : "
                   "!transform.any_op, !transform.param<i64>\n"
                   "    %%py%d = transform.param.constant %lld : i64 -> "
                   "!transform.param<i64>\n"
                   "    transform.annotate %%bf%d \"kiln.gpu_ty\" = %%py%d : "
                   "!transform.any_op, !transform.param<i64>\n",
                   i, i, i, i, i, (long long)tx, i, i, i, (long long)ty, i, i);
  kiln_sbuf_printf(b, "    %%tt%d, %%tf%d = transform.structured.tile_using_forall "
                      "%%bt%d tile_sizes [", i, i, i);
  for (int k = 0; k < d.loop_count; ++k)
    kiln_sbuf_printf(b, "%s%lld", k ? ", " : "", (long long)thread[k]);
  kiln_sbuf_puts(b, "] (mapping = [");
  first = true;
  for (int k = 0; k < d.loop_count; ++k) {
    if (!thread[k]) continue;
    int which = k == par[0] ? 0 : 1;
    kiln_sbuf_printf(b, "%s#gpu.thread<%c>", first ? "" : ", ", xyz[which]);
    first = false;
  }
  kiln_sbuf_puts(b, "]) : (!transform.any_op) -> (!transform.any_op, "
                    "!transform.any_op)\n");
  if (vec > 1)
    kiln_sbuf_printf(b, "    transform.structured.vectorize %%tt%d : "
                        "!transform.any_op\n", i);
  // A contraction's (or row reduction's) thread walks K in steps of 4 with
  // its accumulators in registers (a vector.contract or multi_reduction per
  // step, the loop-carried value hoisted), instead of loading and storing
  // its outputs at every k.
  if (kstep && t->k_count < 4096) {
    kiln_sbuf_printf(b, "    %%kt%d, %%kl%d = transform.structured.tile_using_for "
                        "%%tt%d tile_sizes [", i, i, i);
    for (int l = 0; l < d.loop_count; ++l)
      kiln_sbuf_printf(b, "%s%d", l ? ", " : "", l == k ? 4 : 0);
    kiln_sbuf_printf(b, "] : (!transform.any_op) -> (!transform.any_op, "
                        "!transform.any_op)\n"
                        "    transform.structured.vectorize %%kt%d : "
                        "!transform.any_op\n", i);
    t->k_loops[t->k_count++] = i;
  }
  return MlirWalkResultAdvance;
}

// Wraps `body` into @__transform_main and applies it to `module`.
static kiln_status_t apply(MlirContext ctx, MlirModule module, const char *body,
                           const char *what) {
  kiln_sbuf_t b;
  kiln_sbuf_init(&b);
  kiln_sbuf_printf(&b,
                   "module attributes {transform.with_named_sequence} {\n"
                   "  transform.named_sequence @__transform_main(%%root: "
                   "!transform.any_op {transform.readonly}) {\n%s"
                   "    transform.yield\n  }\n}\n",
                   body);
  char *text = kiln_sbuf_take(&b);
  if (!text) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "%s", what);
  kiln_status_t s = kiln_kernels_apply_script(ctx, module, text, what);
  free(text);
  return s;
}

// Walks `module` with `fn` (which appends to `script` and counts in
// `count`), then applies what it wrote, if anything.
static kiln_status_t walk_and_apply(MlirContext ctx, MlirModule module,
                                    MlirOperationWalkCallback fn, void *state,
                                    kiln_sbuf_t *script, const int *count,
                                    const char *what) {
  mlirOperationWalk(mlirModuleGetOperation(module), fn, state, MlirWalkPreOrder);
  char *body = kiln_sbuf_take(script);
  kiln_status_t s = NULL;
  if (*count > 0)
    s = body ? apply(ctx, module, body, what)
             : kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "%s", what);
  free(body);
  return s;
}

// The tensor-core schedules, after the others (whose contraction lowering
// to outer products would take the mma contracts apart).
static kiln_status_t tile_mma(MlirContext ctx, MlirModule module, int first,
                              int *out_mma) {
  tiler_t *t = calloc(1, sizeof(*t));
  if (!t) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "GPU schedule");
  t->ctx = ctx;
  t->count = first;
  kiln_sbuf_init(&t->script);
  mlirOperationWalk(mlirModuleGetOperation(module), mma_op, t, MlirWalkPreOrder);
  *out_mma = t->k_count;
  if (t->k_count) {
    kiln_sbuf_puts(&t->script,
                   "    %funcs = transform.structured.match ops{[\"func.func\"]} "
                   "in %root : (!transform.any_op) -> !transform.any_op\n"
                   "    transform.apply_patterns to %funcs {\n"
                   "      transform.apply_patterns.vector.reduction_to_contract\n"
                   "      transform.apply_patterns.vector.fold_arith_extension\n"
                   "      transform.apply_patterns.vector.transfer_permutation_patterns\n"
                   "      transform.apply_patterns.canonicalization\n"
                   "    } : !transform.any_op\n"
                   "    transform.apply_patterns to %funcs {\n"
                   "      transform.apply_patterns.gpu.unroll_vectors_subgroup_mma "
                   "[16, 8, 16]\n"
                   "      transform.apply_patterns.canonicalization\n"
                   "    } : !transform.any_op\n");
    for (int j = 0; j < t->k_count; ++j)
      kiln_sbuf_printf(&t->script, "    transform.loop.hoist_loop_invariant_subsets "
                       "%%kl%d : !transform.any_op\n", t->k_loops[j]);
    kiln_sbuf_puts(&t->script,
                   "    transform.apply_patterns to %funcs {\n"
                   "      transform.apply_patterns.canonicalization\n"
                   "    } : !transform.any_op\n");
  }
  char *body = kiln_sbuf_take(&t->script);
  kiln_status_t s = NULL;
  if (*out_mma > 0)
    s = body ? apply(ctx, module, body, "GPU tensor-core schedule")
             : kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "GPU schedule");
  free(body);
  free(t);
  return s;
}

kiln_status_t kiln_kernels_tile_gpu(MlirContext ctx, MlirModule module,
                                    int *out_mma) {
  *out_mma = 0;
  tiler_t *t = calloc(1, sizeof(*t));
  if (!t) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "GPU schedule");
  t->ctx = ctx;
  kiln_sbuf_init(&t->script);
  mlirOperationWalk(mlirModuleGetOperation(module), mark_mma, t, MlirWalkPreOrder);
  t->k_count = 0;
  mlirOperationWalk(mlirModuleGetOperation(module), tile_op, t, MlirWalkPreOrder);
  // The vectorized K steps lowered to multiply-adds, and each contraction's
  // K loop keeps its accumulator in registers.
  if (t->k_count) {
    kiln_sbuf_puts(&t->script,
                   "    %funcs = transform.structured.match ops{[\"func.func\"]} "
                   "in %root : (!transform.any_op) -> !transform.any_op\n"
                   "    transform.apply_patterns to %funcs {\n"
                   "      transform.apply_patterns.vector.lower_contraction "
                   "lowering_strategy = \"outerproduct\"\n"
                   "      transform.apply_patterns.vector.lower_multi_reduction "
                   "lowering_strategy = \"innerreduction\"\n"
                   "    } : !transform.any_op\n");
    for (int j = 0; j < t->k_count; ++j)
      kiln_sbuf_printf(&t->script, "    transform.loop.hoist_loop_invariant_subsets "
                       "%%kl%d : !transform.any_op\n", t->k_loops[j]);
  }
  char *body = kiln_sbuf_take(&t->script);
  kiln_status_t s = NULL;
  if (t->count > 0)
    s = body ? apply(ctx, module, body, "GPU tiling schedule")
             : kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "GPU schedule");
  int next = t->count;
  free(body);
  free(t);
  return s ? s : tile_mma(ctx, module, next, out_mma);
}

typedef struct {
  kiln_sbuf_t script;
  int count;
} mapper_t;

static int64_t int_attr(MlirOperation op, const char *name) {
  MlirAttribute a =
      mlirOperationGetAttributeByName(op, mlirStringRefCreateFromCString(name));
  return mlirAttributeIsNull(a) || !mlirAttributeIsAInteger(a)
             ? -1
             : mlirIntegerAttrGetValueInt(a);
}

static MlirWalkResult map_forall(MlirOperation op, void *user) {
  mapper_t *m = user;
  if (!equals(mlirIdentifierStr(mlirOperationGetName(op)), "scf.forall"))
    return MlirWalkResultAdvance;
  int64_t i = int_attr(op, "kiln.gpu_block");
  int64_t tx = int_attr(op, "kiln.gpu_tx"), ty = int_attr(op, "kiln.gpu_ty");
  if (i < 0 || tx < 1 || ty < 1) return MlirWalkResultAdvance;
  kiln_sbuf_printf(&m->script,
                   "    %%f%lld = transform.structured.match ops{[\"scf.forall\"]} "
                   "attributes {kiln.gpu_block = %lld : i64} in %%root : "
                   "(!transform.any_op) -> !transform.any_op\n"
                   "    %%l%lld = transform.gpu.map_forall_to_blocks %%f%lld "
                   "generate_gpu_launch : (!transform.any_op) -> !transform.any_op\n"
                   "    %%m%lld = transform.gpu.map_nested_forall_to_threads %%l%lld "
                   "block_dims = [%lld, %lld, 1] : (!transform.any_op) -> "
                   "!transform.any_op\n",
                   (long long)i, (long long)i, (long long)i, (long long)i,
                   (long long)i, (long long)i, (long long)tx, (long long)ty);
  m->count++;
  return MlirWalkResultSkip;  // its nested forall is mapped with it
}

kiln_status_t kiln_kernels_map_gpu(MlirContext ctx, MlirModule module) {
  mapper_t m;
  m.count = 0;
  kiln_sbuf_init(&m.script);
  return walk_and_apply(ctx, module, map_forall, &m, &m.script, &m.count,
                        "GPU mapping schedule");
}
