// GPU schedules: linalg ops tiled to blocks and threads with the
// transform dialect (tile_using_forall with #gpu.block / #gpu.thread
// mappings), then mapped to gpu.launch after bufferization.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mlir-c/AffineMap.h>
#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>

#include "kernels/gpu_splice.h"
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

// Threads along a dim of `n` iterations, at most `cap`: all of them where
// they fit (7 for a 7 x 7 image's rows), else the largest power of two
// dividing n.
static int64_t threads_along(int64_t n, int64_t cap) {
  return n <= cap ? n : pow2_divisor(n, cap);
}

// The largest divisor of `n` from 4 up to `cap` (13 for 1001 = 7 x 11 x
// 13), or 1.
static int64_t small_divisor(int64_t n, int64_t cap) {
  for (int64_t d = cap; d >= 4; --d)
    if (n % d == 0) return d;
  return 1;
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
  int sm;  // the device's compute capability (90 for sm_90)
} tiler_t;

// A matmul for kernels/gpu_mma.c's tensor-core kernel (`half`: both
// operands bf16 or both f16) or kernels/gpu_sgemm.c's f32 one:
// linalg.matmul into f32, static; half: row-major operands (the default
// indexing maps) in whole 128 x 128 x 32 tiles, or B given as [N, K] (a
// linear's weight) where the warpgroup-MMA kernel applies on `sm`; f32: A
// row-major or in kiln's transposed-lhs form, in the tiles
// kiln_kernels_sgemm_applies takes.
static bool is_gemm_matmul(MlirOperation op, bool half, int sm) {
  if (!equals(mlirIdentifierStr(mlirOperationGetName(op)), "linalg.matmul") ||
      mlirOperationGetNumOperands(op) != 3)
    return false;
  int form = kiln_gpu_matmul_lhs_form(op);
  if (form < 0 || (half ? form == 1 : form == 2)) return false;
  MlirType a = mlirValueGetType(mlirOperationGetOperand(op, 0));
  MlirType b = mlirValueGetType(mlirOperationGetOperand(op, 1));
  MlirType c = mlirValueGetType(mlirOperationGetOperand(op, 2));
  if (!mlirTypeIsARankedTensor(a) || !mlirTypeIsARankedTensor(b) ||
      !mlirTypeIsARankedTensor(c) || !mlirShapedTypeHasStaticShape(a) ||
      !mlirShapedTypeHasStaticShape(b) || !mlirShapedTypeHasStaticShape(c) ||
      mlirShapedTypeGetRank(a) != 2 || mlirShapedTypeGetRank(b) != 2)
    return false;
  MlirType ae = mlirShapedTypeGetElementType(a), be = mlirShapedTypeGetElementType(b);
  if (!mlirTypeIsAF32(mlirShapedTypeGetElementType(c))) return false;
  bool a_t = form == 1, b_t = form == 2;
  int64_t m = mlirShapedTypeGetDimSize(a, a_t), k = mlirShapedTypeGetDimSize(a, !a_t),
          n = mlirShapedTypeGetDimSize(b, !b_t);
  if (half)
    return (mlirTypeIsABF16(ae) || mlirTypeIsAF16(ae)) && mlirTypeEqual(ae, be) &&
           m % 128 == 0 && n % 128 == 0 && k % 32 == 0 &&
           (!b_t || kiln_kernels_wgmma_applies(sm, k));
  return mlirTypeIsAF32(ae) && mlirTypeIsAF32(be) && kiln_kernels_sgemm_applies(m, n, k);
}

// Mma matmuls are tagged kiln.gpu_mma = j (f32 ones kiln.gpu_sgemm = j)
// before any schedule is applied; they and their zero fills are left whole
// for kernels/gpu_mma.c (kernels/gpu_sgemm.c).
static bool marked_mma(MlirOperation op) {
  return !mlirAttributeIsNull(mlirOperationGetDiscardableAttributeByName(
             op, mlirStringRefCreateFromCString("kiln.gpu_mma"))) ||
         !mlirAttributeIsNull(mlirOperationGetDiscardableAttributeByName(
             op, mlirStringRefCreateFromCString("kiln.gpu_sgemm")));
}

static bool is_identity(MlirAttribute maps, intptr_t i) {
  return mlirAffineMapIsIdentity(mlirAffineMapAttrGetValue(mlirArrayAttrGetElement(maps, i)));
}

// (d0, d1) -> (d1): a row vector broadcast over the rows.
static bool is_row_broadcast(MlirAttribute maps, intptr_t i) {
  MlirAffineMap m = mlirAffineMapAttrGetValue(mlirArrayAttrGetElement(maps, i));
  return mlirAffineMapGetNumDims(m) == 2 && mlirAffineMapGetNumResults(m) == 1 &&
         mlirAffineMapIsProjectedPermutation(m) &&
         mlirAffineExprIsADim(mlirAffineMapGetResult(m, 0)) &&
         mlirAffineDimExprGetPosition(mlirAffineMapGetResult(m, 0)) == 1;
}

// The matmul's only consumer when kernels/gpu_mma.c folds it into the
// kernel's stores: a linalg.generic reading the matmul's result with the
// identity map and writing one [M, N] bf16, f16 or f32 result. Always when
// it only rounds to bf16 or f16; with `epilogues` (the wgmma kernel, which
// stages its outputs through shared memory) also any elementwise body of
// region-free ops over up to 4 other inputs, each [M, N] (identity map) or
// [N] ((d0, d1) -> (d1)) of bf16, f16 or f32, that uses no loop index, not
// the output's old value, and nothing from outside but constants.
static MlirOperation epilogue_consumer(MlirOperation mm, bool epilogues) {
  MlirOperation none = {NULL};
  MlirValue r = mlirOperationGetResult(mm, 0);
  MlirOpOperand u = mlirValueGetFirstUse(r);
  if (mlirOpOperandIsNull(u) || !mlirOpOperandIsNull(mlirOpOperandGetNextUse(u)))
    return none;
  MlirOperation g = mlirOpOperandGetOwner(u);
  intptr_t n = mlirOperationGetNumOperands(g);
  if (!equals(mlirIdentifierStr(mlirOperationGetName(g)), "linalg.generic") ||
      mlirOperationGetNumResults(g) != 1 || n < 2 || n > 6 ||
      mlirOpOperandGetOperandNumber(u) >= n - 1)
    return none;
  MlirAttribute maps = mlirOperationGetAttributeByName(
      g, mlirStringRefCreateFromCString("indexing_maps"));
  MlirAttribute iters = mlirOperationGetAttributeByName(
      g, mlirStringRefCreateFromCString("iterator_types"));
  if (mlirAttributeIsNull(maps) || mlirArrayAttrGetNumElements(maps) != n ||
      mlirAttributeIsNull(iters) || mlirArrayAttrGetNumElements(iters) != 2 ||
      !is_identity(maps, mlirOpOperandGetOperandNumber(u)) || !is_identity(maps, n - 1))
    return none;
  MlirType ot = mlirValueGetType(mlirOperationGetResult(g, 0));
  MlirType ct = mlirValueGetType(r);
  MlirType oe = mlirShapedTypeGetElementType(ot);
  if (!mlirTypeIsARankedTensor(ot) || mlirShapedTypeGetRank(ot) != 2 ||
      mlirShapedTypeGetDimSize(ot, 0) != mlirShapedTypeGetDimSize(ct, 0) ||
      mlirShapedTypeGetDimSize(ot, 1) != mlirShapedTypeGetDimSize(ct, 1) ||
      !(mlirTypeIsABF16(oe) || mlirTypeIsAF16(oe) || mlirTypeIsAF32(oe)))
    return none;
  MlirBlock body = mlirRegionGetFirstBlock(mlirOperationGetRegion(g, 0));
  MlirOperation first = mlirBlockGetFirstOperation(body);
  MlirOperation yield = mlirBlockGetTerminator(body);
  // Only rounding: the mma.sync kernel folds it too.
  if (n == 2 && equals(mlirIdentifierStr(mlirOperationGetName(first)), "arith.truncf") &&
      mlirOperationEqual(mlirOperationGetNextInBlock(first), yield) &&
      mlirValueEqual(mlirOperationGetOperand(first, 0), mlirBlockGetArgument(body, 0)) &&
      mlirValueEqual(mlirOperationGetOperand(yield, 0), mlirOperationGetResult(first, 0)) &&
      (mlirTypeIsABF16(oe) || mlirTypeIsAF16(oe)))
    return g;
  if (!epilogues) return none;
  for (intptr_t i = 0; i < n - 1; ++i) {
    MlirType t = mlirValueGetType(mlirOperationGetOperand(g, i));
    MlirType e = mlirShapedTypeGetElementType(t);
    bool matrix = mlirShapedTypeGetRank(t) == 2 && is_identity(maps, i) &&
                  mlirShapedTypeHasStaticShape(t) &&
                  mlirShapedTypeGetDimSize(t, 0) == mlirShapedTypeGetDimSize(ot, 0) &&
                  mlirShapedTypeGetDimSize(t, 1) == mlirShapedTypeGetDimSize(ot, 1);
    bool row = mlirShapedTypeGetRank(t) == 1 && is_row_broadcast(maps, i) &&
               mlirShapedTypeHasStaticShape(t) &&
               mlirShapedTypeGetDimSize(t, 0) == mlirShapedTypeGetDimSize(ot, 1);
    if (!mlirTypeIsARankedTensor(t) || !(matrix || row) ||
        !(mlirTypeIsABF16(e) || mlirTypeIsAF16(e) || mlirTypeIsAF32(e)))
      return none;
  }
  MlirValue out_arg = mlirBlockGetArgument(body, n - 1);
  if (!mlirOpOperandIsNull(mlirValueGetFirstUse(out_arg))) return none;
  for (MlirOperation op = first; !mlirOperationEqual(op, yield);
       op = mlirOperationGetNextInBlock(op)) {
    if (mlirOperationGetNumRegions(op) != 0 || mlirOperationGetNumResults(op) != 1 ||
        equals(mlirIdentifierStr(mlirOperationGetName(op)), "linalg.index"))
      return none;
    for (intptr_t k = 0; k < mlirOperationGetNumOperands(op); ++k) {
      MlirValue v = mlirOperationGetOperand(op, k);
      if (mlirValueIsABlockArgument(v)) {
        if (!mlirBlockEqual(mlirBlockArgumentGetOwner(v), body)) return none;
      } else {
        MlirOperation d = mlirOpResultGetOwner(v);
        if (!mlirBlockEqual(mlirOperationGetBlock(d), body) &&
            !equals(mlirIdentifierStr(mlirOperationGetName(d)), "arith.constant"))
          return none;
      }
    }
  }
  return g;
}

static MlirWalkResult mark_mma(MlirOperation op, void *user) {
  tiler_t *t = user;
  if (!is_gemm_matmul(op, true, t->sm) || kiln_kernels_inside_forall(op))
    return MlirWalkResultAdvance;
  MlirAttribute id = mlirIntegerAttrGet(mlirIntegerTypeGet(t->ctx, 64), t->k_count++);
  mlirOperationSetDiscardableAttributeByName(
      op, mlirStringRefCreateFromCString("kiln.gpu_mma"), id);
  // Rounded to bf16 or f16, or an elementwise epilogue, as the kernel stores
  // (kernels/gpu_mma.c folds it in).
  int64_t k = mlirShapedTypeGetDimSize(mlirValueGetType(mlirOperationGetOperand(op, 0)), 1);
  MlirOperation g = epilogue_consumer(op, kiln_kernels_wgmma_applies(t->sm, k));
  if (!mlirOperationIsNull(g))
    mlirOperationSetDiscardableAttributeByName(
        g, mlirStringRefCreateFromCString("kiln.gpu_mma_epilogue"), id);
  return MlirWalkResultAdvance;
}

// f32 matmuls for kernels/gpu_sgemm.c (no epilogue folded: a bias add or
// activation after it stays its own kernel).
static MlirWalkResult mark_sgemm(MlirOperation op, void *user) {
  tiler_t *t = user;
  if (!is_gemm_matmul(op, false, t->sm) || kiln_kernels_inside_forall(op))
    return MlirWalkResultAdvance;
  mlirOperationSetDiscardableAttributeByName(
      op, mlirStringRefCreateFromCString("kiln.gpu_sgemm"),
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

// Reductions with few outputs (a bias gradient sums 4096 rows into 64
// columns) would give each of a handful of threads a long serial loop: the
// GPU sits nearly idle while each thread waits on one load after another.
// transform.structured.split_reduction splits such a reduction into a
// parallel op over chunks of KILN_GPU_SPLIT_CHUNK or more and a combining
// op, repeated (up to KILN_GPU_SPLIT_ROUNDS) while the combining op is
// itself long and narrow.
#define KILN_GPU_SPLIT_THREADS 65536  // parallel iterations to aim for
#define KILN_GPU_SPLIT_NARROW 16384   // below this many outputs, split
#define KILN_GPU_SPLIT_CHUNK 16
// Contractions: below this many outputs (their threads would own register
// tiles of 4x4 outputs), K is split into chunks for 4x as many threads.
#define KILN_GPU_SPLIT_NARROW_MM 65536
#define KILN_GPU_SPLIT_ROUNDS 4

typedef struct {
  MlirContext ctx;
  kiln_sbuf_t script;
  int count;
} splitter_t;

// True when `op`'s body yields a combiner split_reduction knows (add, max,
// min) of the output block argument and one other value.
static bool splittable_combiner(MlirOperation op) {
  static const char *const kinds[] = {"arith.addf", "arith.maximumf", "arith.minimumf",
                                      "arith.maxnumf", "arith.minnumf", "arith.addi"};
  MlirBlock body = mlirRegionGetFirstBlock(mlirOperationGetRegion(op, 0));
  intptr_t nargs = mlirBlockGetNumArguments(body);
  MlirOperation yield = mlirBlockGetTerminator(body);
  if (nargs < 2 || mlirOperationGetNumOperands(yield) != 1) return false;
  MlirValue v = mlirOperationGetOperand(yield, 0);
  if (!mlirValueIsAOpResult(v)) return false;
  MlirOperation c = mlirOpResultGetOwner(v);
  bool known = false;
  for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); ++i)
    known |= equals(mlirIdentifierStr(mlirOperationGetName(c)), kinds[i]);
  if (!known || mlirOperationGetNumOperands(c) != 2) return false;
  MlirValue acc = mlirBlockGetArgument(body, nargs - 1);
  return mlirValueEqual(mlirOperationGetOperand(c, 0), acc) ||
         mlirValueEqual(mlirOperationGetOperand(c, 1), acc);
}

// True when every indexing map of `op` is a projected permutation (plain
// dims): split_reduction reads a broadcast's constant 0 in a map as a dim
// (wrong indices, or invalid IR that sends the whole graph to the plain
// mapping). Named matmuls without the attribute have the default maps.
static bool plain_maps(MlirOperation op) {
  MlirAttribute maps = mlirOperationGetAttributeByName(
      op, mlirStringRefCreateFromCString("indexing_maps"));
  if (mlirAttributeIsNull(maps)) return true;
  if (!mlirAttributeIsAArray(maps)) return false;
  for (intptr_t i = 0; i < mlirArrayAttrGetNumElements(maps); ++i) {
    MlirAttribute m = mlirArrayAttrGetElement(maps, i);
    if (!mlirAttributeIsAAffineMap(m) ||
        !mlirAffineMapIsProjectedPermutation(mlirAffineMapAttrGetValue(m)))
      return false;
  }
  return true;
}

// Tags `op` for this round's script and matches it as %s<i>; returns i.
static int mark_split(splitter_t *t, MlirOperation op) {
  int i = t->count++;
  mlirOperationSetDiscardableAttributeByName(
      op, mlirStringRefCreateFromCString("kiln.gpu_split"),
      mlirIntegerAttrGet(mlirIntegerTypeGet(t->ctx, 64), i));
  kiln_sbuf_printf(&t->script,
                   "    %%s%d = transform.structured.match attributes "
                   "{kiln.gpu_split = %d : i64} in %%root : (!transform.any_op) "
                   "-> !transform.any_op\n", i, i);
  return i;
}

static MlirWalkResult split_op(MlirOperation op, void *user) {
  splitter_t *t = user;
  MlirStringRef name = mlirIdentifierStr(mlirOperationGetName(op));
  if (!(equals(name, "linalg.generic") || equals(name, "linalg.matmul") ||
        equals(name, "linalg.batch_matmul")) ||
      mlirOperationGetNumResults(op) != 1 || marked_mma(op) || feeds_mma(op) ||
      kiln_kernels_inside_forall(op) || !splittable_combiner(op) || !plain_maps(op))
    return MlirWalkResultAdvance;
  kiln_kernel_desc_t d;
  // Column-like reductions and contractions (a weight gradient's K is every
  // token); row reductions (innermost loop) keep their thread per row.
  // (Gathers keep the GPU's scalar form: the CPU schedule's gather
  // vectorization is CPU-only.)
  if (!kiln_kernels_describe(op, &d) || d.gather || d.dynamic_mask ||
      (d.kind != KILN_KERNEL_CONTRACTION &&
       (d.kind == KILN_KERNEL_ROW_REDUCTION ||
        ((d.reduction_mask >> (d.loop_count - 1)) & 1u))))
    return MlirWalkResultAdvance;
  int k = -1, reductions = 0;
  double outputs = 1;
  for (int l = 0; l < d.loop_count; ++l) {
    if ((d.reduction_mask >> l) & 1u) k = l, reductions++;
    else outputs *= (double)d.range[l];
  }
  if (reductions >= 2 && outputs < KILN_GPU_SPLIT_NARROW &&
      d.kind != KILN_KERNEL_CONTRACTION) {
    // Several reduction loops (a bias gradient over [B, T, C] sums B and
    // T): all but the outermost become parallel dims of partial results
    // (tile_reduction_using_for, one whole tile), summed by a merge op.
    // The partial dims come last, so the merge is a row reduction: a thread
    // per output walks them (not split further).
    int first = -1;
    for (int l = 0; l < d.loop_count && first < 0; ++l)
      if ((d.reduction_mask >> l) & 1u) first = l;
    int i = mark_split(t, op);
    kiln_sbuf_printf(&t->script,
                     "    %%sa%d, %%sb%d, %%sc%d, %%sd%d = transform.structured."
                     "tile_reduction_using_for %%s%d by tile_sizes = [",
                     i, i, i, i, i);
    for (int l = 0; l < d.loop_count; ++l)
      kiln_sbuf_printf(&t->script, "%s%lld", l ? ", " : "",
                       (long long)(((d.reduction_mask >> l) & 1u) && l != first
                                       ? d.range[l] : 0));
    kiln_sbuf_printf(&t->script,
                     "] : (!transform.any_op) -> (!transform.any_op, "
                     "!transform.any_op, !transform.any_op, !transform.any_op)\n"
                     "    %%sg%d = transform.structured.generalize %%sc%d : "
                     "(!transform.any_op) -> !transform.any_op\n", i, i);
    return MlirWalkResultAdvance;
  }
  bool mm = d.kind == KILN_KERNEL_CONTRACTION;
  if (reductions != 1 ||
      outputs >= (mm ? KILN_GPU_SPLIT_NARROW_MM : KILN_GPU_SPLIT_NARROW) ||
      d.range[k] < (mm ? 16 : 4) * KILN_GPU_SPLIT_CHUNK)
    return MlirWalkResultAdvance;
  int64_t want = (int64_t)((mm ? 4.0 * KILN_GPU_SPLIT_THREADS : KILN_GPU_SPLIT_THREADS) /
                           outputs);
  int64_t cap = d.range[k] / KILN_GPU_SPLIT_CHUNK;
  int64_t factor = pow2_divisor(d.range[k], want < cap ? want : cap);
  if (factor < 4) return MlirWalkResultAdvance;
  int i = mark_split(t, op);
  kiln_sbuf_printf(&t->script,
                   "    %%sa%d, %%sb%d, %%sc%d, %%sd%d = transform.structured."
                   "split_reduction %%s%d {split_factor = %lld, "
                   "insert_split_dimension = 0} : (!transform.any_op) -> "
                   "(!transform.any_op, !transform.any_op, !transform.any_op, "
                   "!transform.any_op)\n"
                   // The split op's threads walk their K chunk in scalar
                   // steps (tile_op's vectorized K steps fail on it).
                   "    transform.annotate %%sc%d \"kiln.gpu_split_part\" : "
                   "!transform.any_op\n",
                   i, i, i, i, i, (long long)factor, i);
  return MlirWalkResultAdvance;
}

static MlirWalkResult unmark_split(MlirOperation op, void *user) {
  (void)user;
  mlirOperationRemoveDiscardableAttributeByName(
      op, mlirStringRefCreateFromCString("kiln.gpu_split"));
  return MlirWalkResultAdvance;
}

static kiln_status_t apply(MlirContext ctx, MlirModule module, const char *body,
                           const char *what);

static kiln_status_t split_reductions(MlirContext ctx, MlirModule module) {
  for (int round = 0; round < KILN_GPU_SPLIT_ROUNDS; ++round) {
    splitter_t t;
    memset(&t, 0, sizeof(t));
    t.ctx = ctx;
    kiln_sbuf_init(&t.script);
    mlirOperationWalk(mlirModuleGetOperation(module), split_op, &t, MlirWalkPreOrder);
    // (Whole-tile reduction loops run once: canonicalization removes them.)
    kiln_sbuf_puts(&t.script,
                   "    %funcs = transform.structured.match ops{[\"func.func\"]} "
                   "in %root : (!transform.any_op) -> !transform.any_op\n"
                   "    transform.apply_patterns to %funcs {\n"
                   "      transform.apply_patterns.canonicalization\n"
                   "    } : !transform.any_op\n");
    char *body = kiln_sbuf_take(&t.script);
    kiln_status_t s = NULL;
    if (t.count > 0)
      s = body ? apply(ctx, module, body, "GPU reduction split")
               : kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "GPU schedule");
    free(body);
    // The split ops inherit the attribute; the next round decides afresh.
    mlirOperationWalk(mlirModuleGetOperation(module), unmark_split, NULL,
                      MlirWalkPreOrder);
    if (s || t.count == 0) return s;
  }
  return NULL;
}

static MlirWalkResult tile_op(MlirOperation op, void *user) {
  tiler_t *t = user;
  MlirStringRef name = mlirIdentifierStr(mlirOperationGetName(op));
  if (name.length < 7 || memcmp(name.data, "linalg.", 7) != 0)
    return MlirWalkResultAdvance;
  // kernels/gpu_mma.c's and gpu_sgemm.c's (after bufferization)
  if (marked_mma(op) || feeds_mma(op) ||
      !mlirAttributeIsNull(mlirOperationGetDiscardableAttributeByName(
          op, mlirStringRefCreateFromCString("kiln.gpu_mma_epilogue"))))
    return MlirWalkResultAdvance;
  kiln_kernel_desc_t d;
  if (!kiln_kernels_describe(op, &d) || d.gather || kiln_kernels_inside_forall(op))
    return MlirWalkResultAdvance;
  // Parallel dims of more than one iteration, innermost first: x, then y,
  // then z.
  int par[3], np = 0;
  for (int i = d.loop_count - 1; i >= 0 && np < 3; --i)
    if (!((d.reduction_mask >> i) & 1u) && d.range[i] > 1) par[np++] = i;
  if (np == 0) return MlirWalkResultAdvance;
  // Beyond three such dims (a permuted copy of [B, T, H, D]) the ones not
  // mapped are walked serially by every thread: z takes the largest of the
  // outer ones, so the serial walk is the shortest. (Linearizing the grid,
  // #gpu.block<linear_dim_*>, produced a wrong grid with
  // map_forall_to_blocks' generate_gpu_launch in MLIR 22.)
  if (np == 3)
    for (int i = par[2] - 1; i >= 0; --i)
      if (!((d.reduction_mask >> i) & 1u) && d.range[i] > d.range[par[2]] &&
          d.range[i] <= 65535)  // the grid's z limit
        par[2] = i;
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
  bool split_part = !mlirAttributeIsNull(mlirOperationGetDiscardableAttributeByName(
      op, mlirStringRefCreateFromCString("kiln.gpu_split_part")));
  bool kstep = ((d.kind == KILN_KERNEL_CONTRACTION && np >= 2) ||
                d.kind == KILN_KERNEL_ROW_REDUCTION) &&
               reductions == 1 && big == np && d.range[k] % 4 == 0 && !split_part;
  int64_t rt = kstep && d.kind == KILN_KERNEL_CONTRACTION &&
                       d.range[par[0]] % (4 * 32) == 0 &&
                       d.range[par[1]] % (4 * 8) == 0 ? 4 : 1;
  // A row reduction gives each thread a whole row, so it has as many
  // threads as rows: blocks of one warp spread them over every SM.
  int64_t xcap = d.kind == KILN_KERNEL_ROW_REDUCTION ? 32
                 : np == 1                           ? KILN_GPU_ROW
                                                     : KILN_GPU_SIDE;
  int64_t tx = threads_along(d.range[par[0]] / (vec * rt), xcap);
  // Whole tiles only (the thread mapping needs static trip counts). A
  // contiguous dim whose power-of-two divisor is small (1000 = 8 x 125)
  // gets blocks of 4 to 16 columns made up in rows (8 x 32 for
  // [4096, 1000]): a warp still reads each row's 16 to 64 contiguous
  // bytes. The parallel-loop mapping these ops took before tiles the
  // outer dim onto the threads, one element per 32-byte sector (a
  // [4096, 1000] add, a 4096 x 4096 x 1000 matmul at 0.2% of the GPU).
  // An elementwise op's odd dim (1001) takes a divisor that is no power
  // of two (13 columns, 52 contiguous bytes).
  if (np > 1 && tx < 4 && d.reduction_mask == 0) {
    int64_t odd = small_divisor(d.range[par[0]], KILN_GPU_SIDE);
    if (odd > 1) tx = odd;
  }
  bool narrow = np > 1 && tx < 32 && tx >= 4 && d.range[par[0]] >= 32;
  // Narrow or odd-sized x (a whole 7) makes up its block in rows.
  int64_t ycap = narrow || (tx & (tx - 1))
                     ? KILN_GPU_ROW / tx
                     : rt > 1 ? KILN_GPU_SIDE / 2 : KILN_GPU_SIDE;
  int64_t ty = np > 1 ? threads_along(d.range[par[1]] / rt, ycap) : 1;
  // Narrow blocks under 64 threads, and 1-D ops of few whole tiles, take
  // the parallel-loop mapping with guarded tails (1-D: along the threads).
  if (tx < 32 && d.range[par[0]] >= 32 && !(narrow && tx * ty >= 64))
    return MlirWalkResultAdvance;
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

kiln_status_t kiln_kernels_tile_gpu(MlirContext ctx, MlirModule module, int sm,
                                    int *out_mma, int *out_sgemm) {
  *out_mma = 0;
  *out_sgemm = 0;
  bool tensor_cores = sm >= 80;
  tiler_t *t = calloc(1, sizeof(*t));
  if (!t) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "GPU schedule");
  t->ctx = ctx;
  t->sm = sm;
  kiln_sbuf_init(&t->script);
  if (tensor_cores)
    mlirOperationWalk(mlirModuleGetOperation(module), mark_mma, t, MlirWalkPreOrder);
  *out_mma = t->k_count;
  t->k_count = 0;
  if (tensor_cores)  // cp.async, as the mma kernels
    mlirOperationWalk(mlirModuleGetOperation(module), mark_sgemm, t, MlirWalkPreOrder);
  *out_sgemm = t->k_count;
  t->k_count = 0;
  kiln_status_t ss = split_reductions(ctx, module);
  if (ss) {
    kiln_sbuf_free(&t->script);
    free(t);
    return ss;
  }
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
  free(body);
  free(t);
  return s;
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
