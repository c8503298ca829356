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
#include <stdlib.h>
#include <string.h>

#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
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

//===--- outputs stored through reshapes ----------------------------------===//
//
// An output computed as a reshape of another tensor (a graph-level view: a
// linear layer's [B*T, N] product returned as [B, T, N], the activations a
// training forward saves; or a reshape inside a lowering, as the row kernels
// add) is stored by `materialize_in_destination %reshape in %out`, which
// bufferizes to a temporary for the producer and a copy into %out:
// bufferization does not push a destination back through a reshape. The
// store is rewritten to `materialize_in_destination %source in %view`, %view
// being %out collapsed to one dim and expanded to the source's dims (same
// elements in the same order), and the producer then writes %out in place.
// Of several stores of one source, the first is rewritten; the others keep
// their reshape and copy from it (two in-place stores of one tensor are the
// case MLIR 22.1 orders wrongly, see lowering/pipeline.c).

enum { kMaxStores = 1024 };

typedef struct {
  MlirOperation ops[kMaxStores];  // stores into buffers (outputs, inputs)
  int count;
  MlirValue stored[kMaxStores];  // values stored into tensors (mutations)
  int stored_count;
  bool overflow;
} stores_t;

static MlirWalkResult collect_stores(MlirOperation op, void *user) {
  stores_t *s = user;
  if (!kiln_gpu_op_named(op, "bufferization.materialize_in_destination"))
    return MlirWalkResultAdvance;
  if (mlirOperationGetNumResults(op) == 0) {
    if (s->count < kMaxStores) s->ops[s->count++] = op;
    else s->overflow = true;
  } else {
    if (s->stored_count < kMaxStores)
      s->stored[s->stored_count++] = mlirOperationGetOperand(op, 0);
    else s->overflow = true;
  }
  return MlirWalkResultAdvance;
}

static bool has_unit_attr(MlirOperation op, const char *name) {
  MlirAttribute a = mlirOperationGetAttributeByName(op, mlirStringRefCreateFromCString(name));
  return !mlirAttributeIsNull(a) && mlirAttributeIsAUnit(a);
}

static bool is_reshape(MlirOperation op) {
  return kiln_gpu_op_named(op, "tensor.expand_shape") ||
         kiln_gpu_op_named(op, "tensor.collapse_shape") ||
         kiln_gpu_op_named(op, "tensor.reshape");
}

static void print_cb(MlirStringRef str, void *user) {
  kiln_sbuf_printf(user, "%.*s", (int)str.length, str.data);
}

// "AxBx...": the static shape of `t`.
static void put_shape(kiln_sbuf_t *b, MlirType t) {
  for (intptr_t d = 0; d < mlirShapedTypeGetRank(t); ++d)
    kiln_sbuf_printf(b, "%lldx", (long long)mlirShapedTypeGetDimSize(t, d));
}

static void put_group(kiln_sbuf_t *b, intptr_t rank) {
  kiln_sbuf_puts(b, "[[");
  for (intptr_t d = 0; d < rank; ++d) kiln_sbuf_printf(b, "%s%d", d ? ", " : "", (int)d);
  kiln_sbuf_puts(b, "]]");
}

// The store text: func(%src, %dst) viewing %dst in %src's shape.
static char *store_text(MlirType src, MlirType dst) {
  kiln_sbuf_t b, el;
  kiln_sbuf_init(&b);
  kiln_sbuf_init(&el);
  mlirTypePrint(mlirShapedTypeGetElementType(src), print_cb, &el);
  int64_t n = 1;
  for (intptr_t d = 0; d < mlirShapedTypeGetRank(dst); ++d) n *= mlirShapedTypeGetDimSize(dst, d);
  intptr_t sr = mlirShapedTypeGetRank(src), dr = mlirShapedTypeGetRank(dst);
  kiln_sbuf_puts(&b, "func.func @store(%src: ");
  mlirTypePrint(src, print_cb, &b);
  kiln_sbuf_puts(&b, ", %dst: ");
  mlirTypePrint(dst, print_cb, &b);
  kiln_sbuf_puts(&b, ") {\n");
  const char *cur = "%dst";
  if (dr != 1) {
    kiln_sbuf_puts(&b, "  %flat = memref.collapse_shape %dst ");
    put_group(&b, dr);
    kiln_sbuf_puts(&b, " : ");
    mlirTypePrint(dst, print_cb, &b);
    kiln_sbuf_printf(&b, " into memref<%lldx%s>\n", (long long)n, el.data);
    cur = "%flat";
  }
  if (sr != 1) {
    kiln_sbuf_printf(&b, "  %%view = memref.expand_shape %s ", cur);
    put_group(&b, sr);
    kiln_sbuf_puts(&b, " output_shape [");
    for (intptr_t d = 0; d < sr; ++d)
      kiln_sbuf_printf(&b, "%s%lld", d ? ", " : "",
                       (long long)mlirShapedTypeGetDimSize(src, d));
    kiln_sbuf_printf(&b, "] : memref<%lldx%s> into memref<", (long long)n, el.data);
    put_shape(&b, src);
    kiln_sbuf_printf(&b, "%s>\n", el.data);
    cur = "%view";
  }
  kiln_sbuf_printf(&b, "  bufferization.materialize_in_destination %%src in restrict writable %s : (",
                   cur);
  mlirTypePrint(src, print_cb, &b);
  kiln_sbuf_puts(&b, ", memref<");
  put_shape(&b, src);
  kiln_sbuf_printf(&b, "%s>) -> ()\n  return\n}\n", el.data);
  kiln_sbuf_free(&el);
  return kiln_sbuf_take(&b);
}

// A static memref laid out row-major from offset 0 (as kiln's outputs).
static bool row_major(MlirType t) {
  intptr_t rank = mlirShapedTypeGetRank(t);
  int64_t strides[8], offset = -1;
  if (rank > 8 || mlirLogicalResultIsFailure(mlirMemRefTypeGetStridesAndOffset(t, strides, &offset)))
    return false;
  int64_t step = 1;
  for (intptr_t d = rank - 1; d >= 0; --d) {
    if (strides[d] != step) return false;
    step *= mlirShapedTypeGetDimSize(t, d);
  }
  return offset == 0;
}

// The source `store` may take instead of its reshape, or a null value.
static MlirValue reshape_source(const stores_t *s, MlirOperation store) {
  MlirValue none = {NULL};
  MlirValue v = mlirOperationGetOperand(store, 0);
  MlirValue dst = mlirOperationGetOperand(store, 1);
  // Only the output stores lower.c writes (`restrict writable`): a store
  // into an input the graph writes (no `restrict`) keeps its form.
  if (!has_unit_attr(store, "restrict") || !has_unit_attr(store, "writable") ||
      !mlirValueIsAOpResult(v))
    return none;
  MlirOperation def = mlirOpResultGetOwner(v);
  if (!is_reshape(def)) return none;
  MlirValue src = mlirOperationGetOperand(def, 0);
  MlirType st = mlirValueGetType(src), dt = mlirValueGetType(dst);
  if (!mlirTypeIsARankedTensor(st) || !mlirShapedTypeHasStaticShape(st) ||
      mlirShapedTypeGetRank(st) == 0 || !mlirTypeIsAMemRef(dt) ||
      !mlirShapedTypeHasStaticShape(dt) || mlirShapedTypeGetRank(dt) == 0 ||
      !row_major(dt) ||
      !mlirTypeEqual(mlirShapedTypeGetElementType(st), mlirShapedTypeGetElementType(dt)))
    return none;
  for (int k = 0; k < s->count; ++k)
    if (!mlirOperationEqual(s->ops[k], store) &&
        mlirValueEqual(mlirOperationGetOperand(s->ops[k], 0), src))
      return none;  // another store takes it
  for (int k = 0; k < s->stored_count; ++k)
    if (mlirValueEqual(s->stored[k], src)) return none;  // a mutation stores it
  return src;
}

kiln_status_t kiln_store_through_reshapes(MlirContext ctx, MlirModule module) {
  stores_t *s = malloc(sizeof(*s));
  if (!s) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "output stores");
  kiln_status_t st = NULL;
  // One rewrite per walk (a splice replaces the store); chains of reshapes
  // take one rewrite each.
  for (int round = 0; round < kMaxStores && !st; ++round) {
    memset(s, 0, sizeof(*s));
    mlirOperationWalk(mlirModuleGetOperation(module), collect_stores, s, MlirWalkPreOrder);
    // Past the cap the claims cannot be checked: every store stays.
    if (s->overflow) break;
    int k = 0;
    MlirValue src = {NULL};
    for (; k < s->count; ++k) {
      src = reshape_source(s, s->ops[k]);
      if (!mlirValueIsNull(src)) break;
    }
    if (k == s->count) break;
    MlirValue dst = mlirOperationGetOperand(s->ops[k], 1);
    char *text = store_text(mlirValueGetType(src), mlirValueGetType(dst));
    if (!text) {
      st = kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "output stores");
      break;
    }
    MlirValue args[2] = {src, dst};
    st = kiln_gpu_splice(ctx, text, s->ops[k], args, 2, "output store");
    free(text);
  }
  free(s);
  return st;
}
