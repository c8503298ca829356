// In-place updates of inputs the graph writes (`return %v -> %x`).
//
// lower.c stores such a value into its input's tensor with a tensor-form
// bufferization.materialize_in_destination, so one-shot bufferization sees
// the input's reads and the write on one buffer and writes in place where no
// later read needs the old value. Left to the usual pipeline, in place does
// not happen for the common case, an elementwise update x' = f(x, ...):
// eliminate-empty-tensors (at bufferization) makes x the update's init, but
// by then the update is tiled into an scf.forall whose body reads x through
// extract_slices of x itself while it writes the loop's shared output, and
// the analysis cannot tell those slices match. So, for graphs with
// mutations, right after fusion:
//   1. eliminate-empty-tensors: the update's init becomes x;
//   2. an op reading x as an input with the init's indexing map, and not
//      reading its init, reads the init's block argument instead (same
//      values: the init is x); the dead input is erased;
//   3. tiling then reads x only through the shared output's slices, which
//      the analysis matches with the parallel_insert_slice: in place.
#include <stdbool.h>
#include <string.h>

#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/IR.h>

#include "kernels/gpu_splice.h"
#include "lowering.h"

static MlirWalkResult find_tensor_store(MlirOperation op, void *user) {
  if (!kiln_gpu_op_named(op, "bufferization.materialize_in_destination") ||
      mlirOperationGetNumResults(op) == 0)
    return MlirWalkResultAdvance;
  *(bool *)user = true;
  return MlirWalkResultInterrupt;
}

bool kiln_inplace_needed(MlirModule module) {
  bool found = false;
  mlirOperationWalk(mlirModuleGetOperation(module), find_tensor_store, &found,
                    MlirWalkPreOrder);
  return found;
}

// Only ops with every loop parallel: in a reduction the init's block
// argument is the running accumulator, not the init's value.
static bool all_parallel(MlirOperation op, MlirAttribute parallel) {
  MlirAttribute it = mlirOperationGetAttributeByName(
      op, mlirStringRefCreateFromCString("iterator_types"));
  if (mlirAttributeIsNull(it) || !mlirAttributeIsAArray(it)) return false;
  for (intptr_t i = 0; i < mlirArrayAttrGetNumElements(it); ++i)
    if (!mlirAttributeEqual(mlirArrayAttrGetElement(it, i), parallel))
      return false;
  return true;
}

static MlirWalkResult read_init(MlirOperation op, void *user) {
  MlirAttribute parallel = *(MlirAttribute *)user;
  if (!kiln_gpu_op_named(op, "linalg.generic")) return MlirWalkResultAdvance;
  intptr_t nres = mlirOperationGetNumResults(op);
  intptr_t nin = mlirOperationGetNumOperands(op) - nres;
  MlirAttribute maps = mlirOperationGetAttributeByName(
      op, mlirStringRefCreateFromCString("indexing_maps"));
  if (nres == 0 || nin <= 0 || mlirAttributeIsNull(maps) ||
      !mlirAttributeIsAArray(maps) ||
      mlirArrayAttrGetNumElements(maps) != nin + nres ||
      !all_parallel(op, parallel))
    return MlirWalkResultAdvance;
  MlirBlock body = mlirRegionGetFirstBlock(mlirOperationGetRegion(op, 0));
  for (intptr_t j = 0; j < nres; ++j) {
    MlirValue init = mlirOperationGetOperand(op, nin + j);
    MlirValue out_arg = mlirBlockGetArgument(body, nin + j);
    // An init the body reads already carries its own values; leave it.
    if (!mlirOpOperandIsNull(mlirValueGetFirstUse(out_arg))) continue;
    MlirAttribute out_map = mlirArrayAttrGetElement(maps, nin + j);
    for (intptr_t k = 0; k < nin; ++k) {
      if (!mlirValueEqual(mlirOperationGetOperand(op, k), init) ||
          !mlirAttributeEqual(mlirArrayAttrGetElement(maps, k), out_map))
        continue;
      mlirValueReplaceAllUsesOfWith(mlirBlockGetArgument(body, k), out_arg);
    }
  }
  return MlirWalkResultAdvance;
}

kiln_status_t kiln_inplace_prepare(kiln_mlir_t *m, MlirModule module) {
  KILN_RETURN_IF_ERROR_PLAIN(kiln_pipeline_run_text(
      m, module, "builtin.module(eliminate-empty-tensors,canonicalize)",
      "in-place updates: eliminate-empty-tensors"));
  MlirAttribute parallel = mlirAttributeParseGet(
      mlirModuleGetContext(module),
      mlirStringRefCreateFromCString("#linalg.iterator_type<parallel>"));
  if (mlirAttributeIsNull(parallel))
    return kiln_make_status(KILN_STATUS_INTERNAL,
                            "in-place updates: #linalg.iterator_type does "
                            "not parse");
  mlirOperationWalk(mlirModuleGetOperation(module), read_init, &parallel,
                    MlirWalkPostOrder);
  // linalg-fuse-elementwise-ops erases the now unread inputs
  // (canonicalize keeps an unread input that is also the init, and its
  // slices, read inside the tiled loop, defeat in place again).
  return kiln_pipeline_run_text(
      m, module, "builtin.module(linalg-fuse-elementwise-ops,canonicalize)",
      "in-place updates: erasing unread inputs");
}
