// Strided 1-D vector reads as scalar loads (CPU).
//
// The schedule's direct convolution (lowering/ops/matmul.c, emit_conv_taps:
// the generic contraction, which takes it where the f32 microkernel does
// not: without AVX-512, f64, grouped layers) reads its register tile's
// filter column as one 1-D vector.transfer_read along a dim that is not
// the memref's innermost: the 8 filters of a tile at one (c, kh, kw), 576
// floats apart for 64 channels of a 3x3 kernel. The vectorized multiply
// then broadcasts each lane of that vector across a row of the tile.
//
// convert-vector-to-scf lowers such a read (its 1-D transfer conversion,
// TransferOp1dConversion, whatever the full-unroll option) to an scf.for
// over the lanes, each iteration a scalar load inserted at a dynamic
// position: on x86 a compare, a masked broadcast and a branch per lane,
// and the lanes then reach the FMAs through `vpermps`, which issues on
// port 5, one of the two ports the 512-bit FMAs use. A 3x3 convolution's
// inner step was 16 FMAs, 7 vpermps and some 40 instructions of gather
// loop.
//
// Here each such read becomes its lanes' scalar `memref.load`s and one
// `vector.from_elements`. LLVM folds a splat of a build_vector of loads to
// a broadcast from memory (`vbroadcastss zmm, m32`), which uses a load port
// only, and the gather loop is gone. (On the Xeon the convolution measured
// no faster for it: the loop nest's memory traffic bounds it, which the
// microkernel's channel blocks address.)
//
// Runs in the LLVM stage before convert-vector-to-scf, on the bufferized
// module (reads from memrefs).
#include <stdlib.h>
#include <string.h>

#include <mlir-c/AffineExpr.h>
#include <mlir-c/AffineMap.h>
#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <mlir-c/IR.h>

#include "kernels/gpu_splice.h"
#include "lowering/lowering.h"

// Lanes up to which a read is unrolled: a register tile's column (8 or 16
// rows) with room; longer strided reads keep the loop.
enum { kMaxLanes = 32, kMaxRank = 8 };

typedef struct {
  MlirOperation *ops;
  int count, cap;
  bool oom;
} reads_t;

// The memref dim a 1-D transfer_read walks, when the read is a plain
// strided one: unmasked, in bounds, along a dim other than the innermost
// whose stride is not 1; -1 otherwise.
static int strided_dim(MlirOperation op) {
  if (mlirOperationGetNumResults(op) != 1) return -1;
  MlirValue src = mlirOperationGetOperand(op, 0);
  MlirType mt = mlirValueGetType(src), vt = mlirValueGetType(mlirOperationGetResult(op, 0));
  if (!mlirTypeIsAMemRef(mt) || !mlirTypeIsAVector(vt) || mlirShapedTypeGetRank(vt) != 1)
    return -1;
  int64_t rank = mlirShapedTypeGetRank(mt), lanes = mlirShapedTypeGetDimSize(vt, 0);
  if (rank < 2 || rank > kMaxRank || lanes < 2 || lanes > kMaxLanes ||
      mlirVectorTypeIsScalable(vt))
    return -1;
  // source, indices, padding: no mask
  if (mlirOperationGetNumOperands(op) != 2 + rank) return -1;
  if (!mlirTypeEqual(mlirShapedTypeGetElementType(mt), mlirShapedTypeGetElementType(vt)))
    return -1;
  MlirAttribute ib = mlirOperationGetAttributeByName(op, mlirStringRefCreateFromCString("in_bounds"));
  if (mlirAttributeIsNull(ib) || !mlirAttributeIsAArray(ib) || mlirArrayAttrGetNumElements(ib) != 1 ||
      !mlirBoolAttrGetValue(mlirArrayAttrGetElement(ib, 0)))
    return -1;
  MlirAttribute pm = mlirOperationGetAttributeByName(op, mlirStringRefCreateFromCString("permutation_map"));
  if (mlirAttributeIsNull(pm) || !mlirAttributeIsAAffineMap(pm)) return -1;
  MlirAffineMap map = mlirAffineMapAttrGetValue(pm);
  if (mlirAffineMapGetNumResults(map) != 1 || mlirAffineMapGetNumDims(map) != rank) return -1;
  MlirAffineExpr e = mlirAffineMapGetResult(map, 0);
  if (!mlirAffineExprIsADim(e)) return -1;
  int64_t dim = mlirAffineDimExprGetPosition(e);
  if (dim >= rank - 1) return -1;
  // Along a dim of unit stride (a transposed view) the read is contiguous:
  // left to the vector lowering.
  int64_t strides[kMaxRank], offset;
  if (mlirLogicalResultIsFailure(mlirMemRefTypeGetStridesAndOffset(mt, strides, &offset)) ||
      strides[dim] == 1)
    return -1;
  return (int)dim;
}

static MlirWalkResult collect(MlirOperation op, void *user) {
  reads_t *r = user;
  if (!kiln_gpu_op_named(op, "vector.transfer_read") || strided_dim(op) < 0)
    return MlirWalkResultAdvance;
  if (r->count == r->cap) {
    int cap = r->cap ? 2 * r->cap : 64;
    MlirOperation *ops = realloc(r->ops, (size_t)cap * sizeof(*ops));
    if (!ops) {
      r->oom = true;
      return MlirWalkResultInterrupt;
    }
    r->ops = ops, r->cap = cap;
  }
  r->ops[r->count++] = op;
  return MlirWalkResultAdvance;
}

static MlirOperation create_before(MlirOperation at, MlirOperationState *st) {
  MlirOperation op = mlirOperationCreate(st);
  mlirBlockInsertOwnedOperationBefore(mlirOperationGetBlock(at), at, op);
  return op;
}

static void unroll(MlirContext ctx, MlirOperation read) {
  MlirLocation loc = mlirOperationGetLocation(read);
  int dim = strided_dim(read);
  MlirValue src = mlirOperationGetOperand(read, 0);
  MlirValue result = mlirOperationGetResult(read, 0);
  MlirType vt = mlirValueGetType(result);
  MlirType et = mlirShapedTypeGetElementType(vt);
  MlirType index = mlirIndexTypeGet(ctx);
  int64_t rank = mlirShapedTypeGetRank(mlirValueGetType(src));
  int64_t lanes = mlirShapedTypeGetDimSize(vt, 0);
  MlirValue operands[1 + kMaxRank], elems[kMaxLanes];
  for (int64_t i = 0; i < rank; ++i) operands[1 + i] = mlirOperationGetOperand(read, 1 + i);
  operands[0] = src;
  MlirValue base = operands[1 + dim];
  MlirIdentifier value_id = mlirIdentifierGet(ctx, mlirStringRefCreateFromCString("value"));
  for (int64_t l = 0; l < lanes; ++l) {
    if (l > 0) {
      MlirOperationState c = mlirOperationStateGet(mlirStringRefCreateFromCString("arith.constant"), loc);
      MlirNamedAttribute v = mlirNamedAttributeGet(value_id, mlirIntegerAttrGet(index, l));
      mlirOperationStateAddAttributes(&c, 1, &v);
      mlirOperationStateAddResults(&c, 1, &index);
      MlirValue off = mlirOperationGetResult(create_before(read, &c), 0);
      MlirOperationState add = mlirOperationStateGet(mlirStringRefCreateFromCString("arith.addi"), loc);
      MlirValue ab[2] = {base, off};
      mlirOperationStateAddOperands(&add, 2, ab);
      mlirOperationStateAddResults(&add, 1, &index);
      operands[1 + dim] = mlirOperationGetResult(create_before(read, &add), 0);
    }
    MlirOperationState ld = mlirOperationStateGet(mlirStringRefCreateFromCString("memref.load"), loc);
    mlirOperationStateAddOperands(&ld, 1 + rank, operands);
    mlirOperationStateAddResults(&ld, 1, &et);
    elems[l] = mlirOperationGetResult(create_before(read, &ld), 0);
  }
  MlirOperationState fe = mlirOperationStateGet(mlirStringRefCreateFromCString("vector.from_elements"), loc);
  mlirOperationStateAddOperands(&fe, lanes, elems);
  mlirOperationStateAddResults(&fe, 1, &vt);
  MlirValue v = mlirOperationGetResult(create_before(read, &fe), 0);
  mlirValueReplaceAllUsesOfWith(result, v);
  mlirOperationDestroy(read);
}

kiln_status_t kiln_cpu_unroll_strided_reads(MlirContext ctx, MlirModule module, int *count) {
  *count = 0;
  reads_t r = {0};
  mlirOperationWalk(mlirModuleGetOperation(module), collect, &r, MlirWalkPostOrder);
  if (r.oom) {
    free(r.ops);
    return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "strided reads");
  }
  for (int i = 0; i < r.count; ++i) unroll(ctx, r.ops[i]);
  *count = r.count;
  free(r.ops);
  return NULL;
}

bool kiln_unroll_strided_reads_enabled(void) {
  const char *v = getenv("KILN_STRIDED_READS");
  return !v || strcmp(v, "0") != 0;
}
