// Helpers shared by the hand-written GPU kernels; see gpu_splice.h.
#include "kernels/gpu_splice.h"

#include <string.h>

#include <mlir-c/AffineMap.h>
#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>

bool kiln_gpu_op_named(MlirOperation op, const char *name) {
  MlirStringRef n = mlirIdentifierStr(mlirOperationGetName(op));
  return n.length == strlen(name) && memcmp(n.data, name, n.length) == 0;
}

bool kiln_gpu_whole_matrix(MlirType t, int64_t d0, int64_t d1, MlirType element) {
  if (!mlirTypeIsAMemRef(t) || !mlirShapedTypeHasStaticShape(t) ||
      mlirShapedTypeGetRank(t) != 2 || mlirShapedTypeGetDimSize(t, 0) != d0 ||
      mlirShapedTypeGetDimSize(t, 1) != d1 ||
      !mlirTypeEqual(mlirShapedTypeGetElementType(t), element))
    return false;
  MlirAttribute layout = mlirMemRefTypeGetLayout(t);
  return mlirAttributeIsNull(layout) ||
         (mlirAttributeIsAAffineMap(layout) &&
          mlirAffineMapIsIdentity(mlirAffineMapAttrGetValue(layout)));
}

// True when `v` is `buf` or a view of it (one reshape or cast deep).
static bool is_buffer(MlirValue v, MlirValue buf) {
  if (mlirValueEqual(v, buf)) return true;
  if (!mlirValueIsAOpResult(v)) return false;
  MlirOperation d = mlirOpResultGetOwner(v);
  return (kiln_gpu_op_named(d, "memref.expand_shape") ||
          kiln_gpu_op_named(d, "memref.collapse_shape") ||
          kiln_gpu_op_named(d, "memref.subview") ||
          kiln_gpu_op_named(d, "memref.cast") ||
          kiln_gpu_op_named(d, "memref.reshape")) &&
         mlirValueEqual(mlirOperationGetOperand(d, 0), buf);
}

typedef struct {
  MlirValue buf;
  bool uses;
} use_finder_t;

static MlirWalkResult find_use(MlirOperation op, void *user) {
  use_finder_t *u = user;
  for (intptr_t i = 0; i < mlirOperationGetNumOperands(op); ++i)
    if (is_buffer(mlirOperationGetOperand(op, i), u->buf)) {
      u->uses = true;
      return MlirWalkResultInterrupt;
    }
  return MlirWalkResultAdvance;
}

bool kiln_gpu_used_between(MlirOperation from, MlirOperation to, MlirValue buf) {
  use_finder_t uf = {buf, false};
  for (MlirOperation op = mlirOperationGetNextInBlock(from);
       !mlirOperationIsNull(op) && !mlirOperationEqual(op, to) && !uf.uses;
       op = mlirOperationGetNextInBlock(op))
    mlirOperationWalk(op, find_use, &uf, MlirWalkPreOrder);
  return uf.uses;
}

MlirOperation kiln_gpu_zero_fill(MlirOperation mm, MlirValue c) {
  MlirOperation none = {NULL};
  for (MlirOpOperand u = mlirValueGetFirstUse(c); !mlirOpOperandIsNull(u);
       u = mlirOpOperandGetNextUse(u)) {
    MlirOperation fill = mlirOpOperandGetOwner(u);
    if (!kiln_gpu_op_named(fill, "linalg.fill") ||
        mlirOperationGetNumOperands(fill) != 2 ||
        !mlirValueEqual(mlirOperationGetOperand(fill, 1), c) ||
        !mlirBlockEqual(mlirOperationGetBlock(fill), mlirOperationGetBlock(mm)) ||
        !mlirOperationIsBeforeInBlock(fill, mm))
      continue;
    MlirValue v = mlirOperationGetOperand(fill, 0);
    if (!mlirValueIsAOpResult(v) ||
        !kiln_gpu_op_named(mlirOpResultGetOwner(v), "arith.constant"))
      return none;
    MlirAttribute a = mlirOperationGetAttributeByName(
        mlirOpResultGetOwner(v), mlirStringRefCreateFromCString("value"));
    if (mlirAttributeIsNull(a) || !mlirAttributeIsAFloat(a) ||
        mlirFloatAttrGetValueDouble(a) != 0.0)
      return none;
    return kiln_gpu_used_between(fill, mm, c) ? none : fill;
  }
  return none;
}

kiln_status_t kiln_gpu_splice(MlirContext ctx, const char *text, MlirOperation mm,
                              const MlirValue *args, int nargs, const char *what) {
  MlirModule km = mlirModuleCreateParse(ctx, mlirStringRefCreateFromCString(text));
  if (mlirModuleIsNull(km))
    return kiln_make_status(KILN_STATUS_INTERNAL,
                            "kernels: the %s kernel does not parse", what);
  MlirOperation func = mlirBlockGetFirstOperation(mlirModuleGetBody(km));
  MlirBlock entry = mlirRegionGetFirstBlock(mlirOperationGetRegion(func, 0));
  for (int i = 0; i < nargs; ++i)
    mlirValueReplaceAllUsesOfWith(mlirBlockGetArgument(entry, i), args[i]);
  MlirOperation ret = mlirBlockGetTerminator(entry);
  for (MlirOperation op = mlirBlockGetFirstOperation(entry); !mlirOperationEqual(op, ret);) {
    MlirOperation next = mlirOperationGetNextInBlock(op);
    mlirOperationMoveBefore(op, mm);
    op = next;
  }
  mlirModuleDestroy(km);
  mlirOperationDestroy(mm);
  return NULL;
}

int kiln_gpu_matmul_lhs_form(MlirOperation mm) {
  if (!kiln_gpu_op_named(mm, "linalg.matmul")) return -1;
  MlirAttribute maps = mlirOperationGetAttributeByName(
      mm, mlirStringRefCreateFromCString("indexing_maps"));
  if (mlirAttributeIsNull(maps)) return 0;
  static const char *const forms[3] = {
      "[affine_map<(d0, d1, d2) -> (d0, d2)>, affine_map<(d0, d1, d2) -> (d2, d1)>, "
      "affine_map<(d0, d1, d2) -> (d0, d1)>]",
      "[affine_map<(d0, d1, d2) -> (d2, d0)>, affine_map<(d0, d1, d2) -> (d2, d1)>, "
      "affine_map<(d0, d1, d2) -> (d0, d1)>]",
      "[affine_map<(d0, d1, d2) -> (d0, d2)>, affine_map<(d0, d1, d2) -> (d1, d2)>, "
      "affine_map<(d0, d1, d2) -> (d0, d1)>]"};
  MlirContext ctx = mlirOperationGetContext(mm);
  for (int i = 0; i < 3; ++i) {
    MlirAttribute f = mlirAttributeParseGet(ctx, mlirStringRefCreateFromCString(forms[i]));
    if (!mlirAttributeIsNull(f) && mlirAttributeEqual(f, maps)) return i;
  }
  return -1;
}
