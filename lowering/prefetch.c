// Software prefetch of the next row block (CPU).
//
// A row kernel held in cache (softmax over blocks of rows, lowering/ops/
// nn.c) reads its block from memory in its first pass, the max, which is
// one instruction per vector and so waits on memory, and then works on the
// block in cache: the exponentials are ~15 instructions per vector and the
// memory sits idle. Each thread walks its blocks in order (scf.forall ->
// omp.wsloop, static schedule: one contiguous run of blocks per thread), so
// the compute pass of block i can fetch block i + 1 into L2 a line per
// vector: the first pass of the next block then reads from cache, and the
// memory traffic overlaps the arithmetic.
//
// Which loops: in an scf.forall with one induction variable and a static
// step B >= 2 (blocks of rows), the innermost scf.for with the most fused
// multiply-adds (at least kMinFma: a pass that computes, not one that
// streams) gets, for each vector.transfer_read in it of a static 2-D
// entry-function argument A[R, C] (or a view of one: a [B, H, T, T] input
// is read as its [B*H*T, T] rows) at [i, j] with i computed from the
// forall's variable, and which an earlier pass of the block reads too, a
//   memref.prefetch A[min(i + B, R - 1), j], read, locality<2>, data
// (locality 2: prefetcht1, to L2, leaving L1 to the block in use). The last
// block's prefetches land on its own last row.
//
// Runs on the bufferized module, before scf-forall-to-parallel.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <mlir-c/IR.h>

#include "kernels/gpu_splice.h"
#include "lowering/lowering.h"

enum { kMinFma = 6, kMaxReads = 8 };

typedef struct {
  MlirOperation best;  // the innermost scf.for with the most fmas
  int best_fma;
} loop_pick_t;

static int count_fma(MlirOperation loop, bool *has_inner_loop) {
  int n = 0;
  MlirBlock body = mlirRegionGetFirstBlock(mlirOperationGetRegion(loop, 0));
  for (MlirOperation op = mlirBlockGetFirstOperation(body); !mlirOperationIsNull(op);
       op = mlirOperationGetNextInBlock(op)) {
    if (kiln_gpu_op_named(op, "math.fma")) n++;
    if (mlirOperationGetNumRegions(op) > 0) *has_inner_loop = true;
  }
  return n;
}

static MlirWalkResult pick_loop(MlirOperation op, void *user) {
  if (!kiln_gpu_op_named(op, "scf.for")) return MlirWalkResultAdvance;
  bool inner = false;
  int n = count_fma(op, &inner);
  loop_pick_t *p = user;
  if (!inner && n > p->best_fma) {
    p->best = op;
    p->best_fma = n;
  }
  return MlirWalkResultAdvance;
}

// True when `v` is `iv` or computed from it by ops of the forall's body
// (affine.apply, arith.addi), a few levels deep.
static bool derives_from(MlirValue v, MlirValue iv, int depth) {
  if (mlirValueEqual(v, iv)) return true;
  if (depth == 0 || !mlirValueIsAOpResult(v)) return false;
  MlirOperation def = mlirOpResultGetOwner(v);
  if (!kiln_gpu_op_named(def, "affine.apply") && !kiln_gpu_op_named(def, "arith.addi"))
    return false;
  for (intptr_t i = 0; i < mlirOperationGetNumOperands(def); ++i)
    if (derives_from(mlirOperationGetOperand(def, i), iv, depth - 1)) return true;
  return false;
}

static MlirOperation index_const(MlirContext ctx, MlirLocation loc, int64_t v) {
  MlirType index = mlirIndexTypeGet(ctx);
  MlirNamedAttribute a = mlirNamedAttributeGet(
      mlirIdentifierGet(ctx, mlirStringRefCreateFromCString("value")),
      mlirIntegerAttrGet(index, v));
  MlirOperationState st =
      mlirOperationStateGet(mlirStringRefCreateFromCString("arith.constant"), loc);
  mlirOperationStateAddResults(&st, 1, &index);
  mlirOperationStateAddAttributes(&st, 1, &a);
  return mlirOperationCreate(&st);
}

static MlirOperation index_binary(MlirContext ctx, MlirLocation loc, const char *name,
                                  MlirValue a, MlirValue b) {
  MlirType index = mlirIndexTypeGet(ctx);
  MlirOperationState st = mlirOperationStateGet(mlirStringRefCreateFromCString(name), loc);
  MlirValue ops[2] = {a, b};
  mlirOperationStateAddOperands(&st, 2, ops);
  mlirOperationStateAddResults(&st, 1, &index);
  return mlirOperationCreate(&st);
}

typedef struct {
  MlirValue arg;
  bool found;
} reads_arg_t;

static MlirWalkResult find_read_of(MlirOperation op, void *user) {
  reads_arg_t *r = user;
  if (kiln_gpu_op_named(op, "vector.transfer_read") &&
      mlirValueEqual(kiln_memref_view_root(mlirOperationGetOperand(op, 0)), r->arg)) {
    r->found = true;
    return MlirWalkResultInterrupt;
  }
  return MlirWalkResultAdvance;
}

// True when a top-level op of the forall body before the one holding `loop`
// reads `arg` (through views): the block's first pass, which streams it
// from memory.
static bool read_before(MlirOperation forall, MlirOperation loop, MlirValue arg) {
  MlirBlock body = mlirRegionGetFirstBlock(mlirOperationGetRegion(forall, 0));
  MlirOperation top = loop;
  while (!mlirOperationIsNull(top) && !mlirBlockEqual(mlirOperationGetBlock(top), body))
    top = mlirOperationGetParentOperation(top);
  if (mlirOperationIsNull(top)) return false;
  for (MlirOperation op = mlirBlockGetFirstOperation(body);
       !mlirOperationIsNull(op) && !mlirOperationEqual(op, top);
       op = mlirOperationGetNextInBlock(op)) {
    reads_arg_t r = {arg, false};
    mlirOperationWalk(op, find_read_of, &r, MlirWalkPreOrder);
    if (r.found) return true;
  }
  return false;
}

// Prefetches the next block's line for each qualifying read in `loop`.
static int prefetch_reads(MlirContext ctx, MlirOperation forall, MlirOperation loop,
                          MlirValue iv, int64_t step, MlirBlock entry) {
  MlirOperation reads[kMaxReads];
  int nreads = 0;
  MlirBlock body = mlirRegionGetFirstBlock(mlirOperationGetRegion(loop, 0));
  for (MlirOperation op = mlirBlockGetFirstOperation(body); !mlirOperationIsNull(op);
       op = mlirOperationGetNextInBlock(op)) {
    if (!kiln_gpu_op_named(op, "vector.transfer_read") || nreads == kMaxReads) continue;
    MlirValue src = mlirOperationGetOperand(op, 0), root = kiln_memref_view_root(src);
    MlirType t = mlirValueGetType(src);
    if (!mlirValueIsABlockArgument(root) ||
        !mlirBlockEqual(mlirBlockArgumentGetOwner(root), entry) || !mlirTypeIsAMemRef(t) ||
        mlirShapedTypeGetRank(t) != 2 || !mlirShapedTypeHasStaticShape(t) ||
        mlirOperationGetNumOperands(op) < 3)
      continue;
    if (!derives_from(mlirOperationGetOperand(op, 1), iv, 4) || !read_before(forall, loop, root))
      continue;
    reads[nreads++] = op;
  }
  MlirNamedAttribute attrs[3] = {
      mlirNamedAttributeGet(mlirIdentifierGet(ctx, mlirStringRefCreateFromCString("isWrite")),
                            mlirBoolAttrGet(ctx, 0)),
      mlirNamedAttributeGet(mlirIdentifierGet(ctx, mlirStringRefCreateFromCString("localityHint")),
                            mlirIntegerAttrGet(mlirIntegerTypeGet(ctx, 32), 2)),
      mlirNamedAttributeGet(mlirIdentifierGet(ctx, mlirStringRefCreateFromCString("isDataCache")),
                            mlirBoolAttrGet(ctx, 1)),
  };
  for (int r = 0; r < nreads; ++r) {
    MlirOperation rd = reads[r];
    MlirLocation loc = mlirOperationGetLocation(rd);
    MlirValue src = mlirOperationGetOperand(rd, 0);
    int64_t rows = mlirShapedTypeGetDimSize(mlirValueGetType(src), 0);
    MlirOperation cb = index_const(ctx, loc, step);
    MlirOperation last = index_const(ctx, loc, rows - 1);
    mlirBlockInsertOwnedOperationBefore(body, rd, cb);
    mlirBlockInsertOwnedOperationBefore(body, rd, last);
    MlirOperation next = index_binary(ctx, loc, "arith.addi", mlirOperationGetOperand(rd, 1),
                                      mlirOperationGetResult(cb, 0));
    mlirBlockInsertOwnedOperationBefore(body, rd, next);
    MlirOperation clamped = index_binary(ctx, loc, "arith.minsi", mlirOperationGetResult(next, 0),
                                         mlirOperationGetResult(last, 0));
    mlirBlockInsertOwnedOperationBefore(body, rd, clamped);
    MlirValue operands[3] = {src, mlirOperationGetResult(clamped, 0),
                             mlirOperationGetOperand(rd, 2)};
    MlirOperationState st =
        mlirOperationStateGet(mlirStringRefCreateFromCString("memref.prefetch"), loc);
    mlirOperationStateAddOperands(&st, 3, operands);
    mlirOperationStateAddAttributes(&st, 3, attrs);
    mlirBlockInsertOwnedOperationBefore(body, rd, mlirOperationCreate(&st));
  }
  return nreads;
}

typedef struct {
  MlirContext ctx;
  MlirBlock entry;
  int count;
} walk_t;

static MlirWalkResult visit_forall(MlirOperation op, void *user) {
  if (!kiln_gpu_op_named(op, "scf.forall")) return MlirWalkResultAdvance;
  walk_t *w = user;
  MlirAttribute steps = mlirOperationGetAttributeByName(
      op, mlirStringRefCreateFromCString("staticStep"));
  MlirBlock body = mlirRegionGetFirstBlock(mlirOperationGetRegion(op, 0));
  if (mlirAttributeIsNull(steps) || !mlirAttributeIsADenseI64Array(steps) ||
      mlirDenseArrayGetNumElements(steps) != 1 || mlirBlockGetNumArguments(body) != 1)
    return MlirWalkResultAdvance;
  int64_t step = mlirDenseI64ArrayGetElement(steps, 0);
  if (step < 2) return MlirWalkResultAdvance;  // one row a block, or a symbolic step
  loop_pick_t p = {{NULL}, 0};
  mlirOperationWalk(op, pick_loop, &p, MlirWalkPreOrder);
  if (mlirOperationIsNull(p.best) || p.best_fma < kMinFma) return MlirWalkResultAdvance;
  w->count +=
      prefetch_reads(w->ctx, op, p.best, mlirBlockGetArgument(body, 0), step, w->entry);
  return MlirWalkResultAdvance;
}

bool kiln_prefetch_enabled(void) {
  const char *v = getenv("KILN_PREFETCH");
  return !v || strcmp(v, "0") != 0;
}

kiln_status_t kiln_cpu_prefetch_row_blocks(MlirContext ctx, MlirModule module, int *count) {
  *count = 0;
  MlirOperation main = kiln_mlir_find_symbol(mlirModuleGetBody(module),
                                             mlirStringRefCreateFromCString(KILN_ENTRY_NAME));
  if (mlirOperationIsNull(main) || !kiln_gpu_op_named(main, "func.func")) return NULL;
  walk_t w = {ctx, mlirRegionGetFirstBlock(mlirOperationGetRegion(main, 0)), 0};
  mlirOperationWalk(main, visit_forall, &w, MlirWalkPreOrder);
  *count = w.count;
  return NULL;
}
