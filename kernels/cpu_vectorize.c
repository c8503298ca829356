// The default CPU schedule: tile to vector-sized blocks, then vectorize.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mlir-c/AffineExpr.h>
#include <mlir-c/AffineMap.h>
#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <mlir-c/Dialect/Transform/Interpreter.h>

#include "kernels.h"

kiln_status_t kiln_kernels_cpu_schedule(const kiln_tile_sizes_t *sizes,
                                        int32_t count, char **out_text) {
  kiln_sbuf_t b;
  kiln_sbuf_init(&b);
  kiln_sbuf_puts(&b,
                 "module attributes {transform.with_named_sequence} {\n"
                 "  transform.named_sequence @__transform_main(%root: "
                 "!transform.any_op {transform.readonly}) {\n");
  for (int32_t i = 0; i < count; ++i) {
    const kiln_tile_sizes_t *t = &sizes[i];
    int loops = 0;
    for (int k = 0; k < t->loop_count; ++k) loops += t->sizes[k] != 0;
    kiln_sbuf_printf(&b,
                     "    %%op%d = transform.structured.match attributes "
                     "{kiln.tile_id = %d : i64} in %%root : (!transform.any_op) "
                     "-> !transform.any_op\n",
                     i, i);
    const char *target = "op";
    if (t->forall_dim >= 0) {
      // Threads first: one forall over the distributed loop.
      kiln_sbuf_printf(&b, "    %%par%d, %%forall%d = transform.structured."
                           "tile_using_forall %%op%d tile_sizes [", i, i, i);
      for (int k = 0; k < t->loop_count; ++k)
        kiln_sbuf_printf(&b, "%s%lld", k ? ", " : "",
                         (long long)(k == t->forall_dim ? t->sizes[k] : 0));
      kiln_sbuf_puts(&b, "] : (!transform.any_op) -> (!transform.any_op, "
                         "!transform.any_op)\n");
      target = "par";
      loops -= t->sizes[t->forall_dim] != 0;
    }
    if (loops) {
    kiln_sbuf_printf(&b, "    %%tiled%d", i);
    for (int k = 0; k < loops; ++k) kiln_sbuf_printf(&b, ", %%loop%d_%d", i, k);
    kiln_sbuf_printf(&b, " = transform.structured.tile_using_for %%%s%d tile_sizes [",
                     target, i);
    for (int k = 0; k < t->loop_count; ++k)
      kiln_sbuf_printf(&b, "%s%lld", k ? ", " : "",
                       (long long)(k == t->forall_dim ? 0 : t->sizes[k]));
    kiln_sbuf_puts(&b, "] : (!transform.any_op) -> (!transform.any_op");
    for (int k = 0; k < loops; ++k) kiln_sbuf_puts(&b, ", !transform.any_op");
    kiln_sbuf_puts(&b, ")\n");
    target = "tiled";
    }
    if (t->reduction_dim >= 0) {
      kiln_sbuf_printf(&b, "    %%rfill%d, %%rsplit%d, %%rcomb%d, %%rloop%d = "
                           "transform.structured.tile_reduction_using_for "
                           "%%%s%d by tile_sizes = [", i, i, i, i, target, i);
      for (int k = 0; k < t->loop_count; ++k)
        kiln_sbuf_printf(&b, "%s%lld", k ? ", " : "",
                         (long long)(k == t->reduction_dim ? t->reduction_tile : 0));
      kiln_sbuf_puts(&b, "] : (!transform.any_op) -> (!transform.any_op, "
                         "!transform.any_op, !transform.any_op, "
                         "!transform.any_op)\n");
    }
  }
  kiln_sbuf_puts(&b,
                 "    %funcs = transform.structured.match ops{[\"func.func\"]} "
                 "in %root : (!transform.any_op) -> !transform.any_op\n"
                 "    %vec = transform.structured.vectorize_children_and_apply_"
                 "patterns %funcs : (!transform.any_op) -> !transform.any_op\n"
                 // Lower the n-D vector ops the vectorizer made to forms
                 // convert-vector-to-llvm handles: contractions as outer
                 // products (FMAs), multi-reductions along the inner dim.
                 "    transform.apply_patterns to %vec {\n"
                 "      transform.apply_patterns.vector.lower_contraction "
                 "lowering_strategy = \"outerproduct\"\n"
                 "      transform.apply_patterns.vector.lower_multi_reduction "
                 "lowering_strategy = \"innerreduction\"\n"
                 "      transform.apply_patterns.vector.lower_transpose "
                 "lowering_strategy = \"shuffle_1d\"\n"
                 "      transform.apply_patterns.vector.lower_shape_cast\n"
                 "      transform.apply_patterns.vector.lower_broadcast\n"
                 "      transform.apply_patterns.vector.lower_outerproduct\n"
                 "    } : !transform.any_op\n"
                 // Loop-carried accumulators (matmul tiles, reduction
                 // partials) move out of memory into registers.
                 "    %fors = transform.structured.match ops{[\"scf.for\"]} in "
                 "%root : (!transform.any_op) -> !transform.any_op\n"
                 "    transform.loop.hoist_loop_invariant_subsets %fors : "
                 "!transform.any_op\n"
                 // Forward vector writes to the reads of the same tensor, so
                 // per-row scratch tensors (reduction partials) disappear
                 // instead of becoming an allocation per row. No CSE here:
                 // merged inits of different outputs miscompile later.
                 "    %funcs2 = transform.structured.match ops{[\"func.func\"]} "
                 "in %root : (!transform.any_op) -> !transform.any_op\n"
                 "    transform.apply_patterns to %funcs2 {\n"
                 "      transform.apply_patterns.canonicalization\n"
                 "    } : !transform.any_op\n"
                 "    transform.yield\n  }\n}\n");
  char *text = kiln_sbuf_take(&b);
  if (!text) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "schedule");
  *out_text = text;
  return NULL;
}

// Largest of `choices` (descending) that divides `n`.
static int64_t pick(int64_t n, const int64_t *choices, int count) {
  for (int i = 0; i < count; ++i)
    if (n % choices[i] == 0) return choices[i];
  return 1;
}

typedef struct {
  kiln_tile_sizes_t *sizes;
  int32_t count, capacity;
  MlirContext ctx;
  bool oom;
} collect_t;

static bool starts_with(MlirStringRef s, const char *p) {
  size_t n = strlen(p);
  return s.length >= n && memcmp(s.data, p, n) == 0;
}
static bool equals(MlirStringRef s, const char *p) {
  return s.length == strlen(p) && memcmp(s.data, p, s.length) == 0;
}

// Static shape of the op's first result (rank -1 if not a static tensor).
static int result_shape(MlirOperation op, int64_t *dims) {
  if (mlirOperationGetNumResults(op) < 1) return -1;
  MlirType t = mlirValueGetType(mlirOperationGetResult(op, 0));
  if (!mlirTypeIsARankedTensor(t) || !mlirShapedTypeHasStaticShape(t))
    return -1;
  int r = (int)mlirShapedTypeGetRank(t);
  for (int i = 0; i < r && i < 16; ++i) dims[i] = mlirShapedTypeGetDimSize(t, i);
  return r;
}

static void sbuf_cb(MlirStringRef str, void *user) {
  kiln_sbuf_append((kiln_sbuf_t *)user, str.data, str.length);
}

static const int64_t kVec[] = {16, 8, 4, 2, 1};
static const int64_t kRegM[] = {8, 4, 2, 1};
static const int64_t kRegN[] = {32, 16, 8, 4, 2, 1};

// Work below which an op runs on one thread: opening a parallel region costs
// microseconds, more than small elementwise ops or reductions take (a GPT
// backward graph of 134 small ops lost ~1 ms to fork/join alone).
#define KILN_MIN_PARALLEL_WORK (1 << 16)

// Distributes the first parallel loop that has more than one tile, when the
// op's iteration space is big enough to pay for the threads.
static void set_forall(kiln_tile_sizes_t *t, const bool *parallel,
                       const int64_t *range) {
  t->forall_dim = -1;
  double work = 1;
  for (int i = 0; i < t->loop_count; ++i) work *= (double)(range[i] > 0 ? range[i] : 1);
  if (work < KILN_MIN_PARALLEL_WORK) return;
  for (int i = 0; i < t->loop_count; ++i)
    if (parallel[i] && t->sizes[i] > 0 && range[i] > t->sizes[i]) {
      t->forall_dim = i;
      return;
    }
}

// Chooses tile sizes for one op; false when the op is left alone.
static bool choose(MlirOperation op, kiln_tile_sizes_t *t) {
  MlirStringRef name = mlirIdentifierStr(mlirOperationGetName(op));
  int64_t dims[16];
  int r = result_shape(op, dims);
  if (r < 0) return false;
  memset(t, 0, sizeof(*t));
  t->forall_dim = -1;
  t->reduction_dim = -1;
  if (equals(name, "linalg.matmul") || equals(name, "linalg.batch_matmul")) {
    int b = equals(name, "linalg.batch_matmul") ? 1 : 0;
    t->loop_count = 3 + b;
    if (b) t->sizes[0] = 1;
    t->sizes[b] = pick(dims[b], kRegM, 4);
    t->sizes[b + 1] = pick(dims[b + 1], kRegN, 6);
    t->sizes[b + 2] = 1;
    bool par[16] = {true, true, true, false};
    if (!b) par[2] = false;
    int64_t range[16] = {0};
    for (int i = 0; i <= b + 1; ++i) range[i] = dims[i];
    set_forall(t, par, range);
    return true;
  }
  if (equals(name, "linalg.transpose") && r >= 2) {
    // Square register blocks: the vector transpose of a block is a few
    // shuffles, where a 1x16 tile read a column one element at a time.
    MlirAttribute perm = mlirOperationGetAttributeByName(
        op, mlirStringRefCreateFromCString("permutation"));
    bool last_two_swapped = false;
    if (!mlirAttributeIsNull(perm) && mlirAttributeIsADenseI64Array(perm) &&
        mlirDenseArrayGetNumElements(perm) == r)
      last_two_swapped = mlirDenseI64ArrayGetElement(perm, r - 1) == r - 2 &&
                         mlirDenseI64ArrayGetElement(perm, r - 2) == r - 1;
    if (last_two_swapped) {
      t->loop_count = r;
      for (int i = 0; i < r - 2; ++i) t->sizes[i] = 1;
      t->sizes[r - 2] = pick(dims[r - 2], kRegM, 4);
      t->sizes[r - 1] = pick(dims[r - 1], kRegM, 4);
      bool par[16];
      for (int i = 0; i < 16; ++i) par[i] = true;
      set_forall(t, par, dims);
      return true;
    }
  }
  if (equals(name, "linalg.fill") || equals(name, "linalg.transpose")) {
    if (r == 0) return false;
    t->loop_count = r;
    for (int i = 0; i < r - 1; ++i) t->sizes[i] = 1;
    t->sizes[r - 1] = pick(dims[r - 1], kVec, 5);
    bool par[16];
    for (int i = 0; i < 16; ++i) par[i] = true;
    set_forall(t, par, dims);
    return true;
  }
  if (!equals(name, "linalg.generic")) return false;
  MlirAttribute it = mlirOperationGetAttributeByName(
      op, mlirStringRefCreateFromCString("iterator_types"));
  if (mlirAttributeIsNull(it) || !mlirAttributeIsAArray(it)) return false;
  int loops = (int)mlirArrayAttrGetNumElements(it);
  if (loops == 0 || loops > 16) return false;
  // Gathers (tensor.extract in the body) stay scalar.
  MlirRegion region = mlirOperationGetRegion(op, 0);
  MlirBlock block = mlirRegionGetFirstBlock(region);
  for (MlirOperation o = mlirBlockGetFirstOperation(block);
       !mlirOperationIsNull(o); o = mlirOperationGetNextInBlock(o))
    if (equals(mlirIdentifierStr(mlirOperationGetName(o)), "tensor.extract"))
      return false;
  // Static loop ranges: every map result that is a plain dim d_j names the
  // size of loop j through the operand's shape.
  int64_t range[16];
  for (int i = 0; i < loops; ++i) range[i] = -1;
  MlirAttribute maps = mlirOperationGetAttributeByName(
      op, mlirStringRefCreateFromCString("indexing_maps"));
  if (mlirAttributeIsNull(maps) || !mlirAttributeIsAArray(maps)) return false;
  intptr_t nops = mlirOperationGetNumOperands(op);
  if (mlirArrayAttrGetNumElements(maps) != nops) return false;
  // Which loops each operand indexes (bit i: loop i), for telling a
  // contraction from a reduction.
  uint32_t uses[16] = {0};
  intptr_t ninputs = nops - mlirOperationGetNumResults(op);
  for (intptr_t k = 0; k < nops; ++k) {
    MlirType ty = mlirValueGetType(mlirOperationGetOperand(op, k));
    if (!mlirTypeIsARankedTensor(ty) || !mlirShapedTypeHasStaticShape(ty))
      return false;
    MlirAffineMap m = mlirAffineMapAttrGetValue(mlirArrayAttrGetElement(maps, k));
    intptr_t nres = mlirAffineMapGetNumResults(m);
    for (intptr_t j = 0; j < nres; ++j) {
      MlirAffineExpr e = mlirAffineMapGetResult(m, j);
      if (!mlirAffineExprIsADim(e)) continue;
      intptr_t pos = mlirAffineDimExprGetPosition(e);
      if (pos < loops) {
        range[pos] = mlirShapedTypeGetDimSize(ty, j);
        if (k < 16) uses[k] |= 1u << pos;
      }
    }
  }
  for (int i = 0; i < loops; ++i)
    if (range[i] < 0) return false;
  t->loop_count = loops;
  // A contraction in generic form (a batch matmul whose batch dims were
  // reshaped by fusion): reduction loops, at least two parallel loops, a
  // multiply feeding an add. Tile it like a matmul: a register tile on the
  // last two parallel loops, the reduction stepped by one, so the vectorizer
  // makes an outer-product contraction instead of a horizontal reduction per
  // output element.
  int reductions = 0, last_red = -1;
  int par[16], npar = 0;
  for (int i = 0; i < loops; ++i) {
    kiln_sbuf_t pb;
    kiln_sbuf_init(&pb);
    mlirAttributePrint(mlirArrayAttrGetElement(it, i), sbuf_cb, &pb);
    bool red = pb.data && strstr(pb.data, "reduction");
    kiln_sbuf_free(&pb);
    if (red) {
      reductions++;
      last_red = i;
    } else {
      par[npar++] = i;
    }
  }
  bool has_mul = false, has_add = false;
  for (MlirOperation o = mlirBlockGetFirstOperation(block);
       !mlirOperationIsNull(o); o = mlirOperationGetNextInBlock(o)) {
    MlirStringRef on = mlirIdentifierStr(mlirOperationGetName(o));
    has_mul |= equals(on, "arith.mulf") || equals(on, "arith.muli");
    has_add |= equals(on, "arith.addf") || equals(on, "arith.addi");
  }
  bool is_par[16] = {false};
  for (int i = 0; i < npar; ++i) is_par[par[i]] = true;
  // A contraction multiplies operands broadcast along different output
  // dims: one input misses the last parallel loop (A, no n) and another the
  // one before (B, no m). A reduction whose body merely contains a multiply
  // (exp's polynomial) reads one full-rank input and is not one.
  bool no_n = false, no_m = false;
  if (npar >= 2)
    for (intptr_t k = 0; k < ninputs && k < 16; ++k) {
      no_n |= !(uses[k] & (1u << par[npar - 1]));
      no_m |= !(uses[k] & (1u << par[npar - 2]));
    }
  if (reductions >= 1 && npar >= 2 && has_mul && has_add && no_n && no_m) {
    // Every reduction loop steps by one (fusion may have split K in two, as
    // after a head reshape in attention).
    for (int i = 0; i < loops; ++i) t->sizes[i] = 1;
    t->sizes[par[npar - 2]] = pick(range[par[npar - 2]], kRegM, 4);
    t->sizes[par[npar - 1]] = pick(range[par[npar - 1]], kRegN, 6);
    set_forall(t, is_par, range);
    return true;
  }
  if (reductions == 1 && last_red == loops - 1 && loops >= 2) {
    // Row reduction: rows over threads and one at a time, the row split by
    // the vector width into a vector accumulator.
    for (int i = 0; i < loops - 1; ++i) t->sizes[i] = 1;
    t->sizes[last_red] = 0;
    set_forall(t, is_par, range);
    t->reduction_dim = last_red;
    t->reduction_tile = pick(range[last_red], kVec, 5);
    if (t->reduction_tile == 1) t->reduction_dim = -1;  // nothing to split
    return true;
  }
  for (int i = 0; i < loops - 1; ++i) t->sizes[i] = 1;
  t->sizes[loops - 1] = pick(range[loops - 1], kVec, 5);
  set_forall(t, is_par, range);
  return true;
}

// True when `op` already sits inside a parallel loop (the lowering's own
// row loops): it must not open a nested one.
static bool inside_forall(MlirOperation op) {
  for (MlirOperation p = mlirOperationGetParentOperation(op);
       !mlirOperationIsNull(p); p = mlirOperationGetParentOperation(p))
    if (equals(mlirIdentifierStr(mlirOperationGetName(p)), "scf.forall"))
      return true;
  return false;
}

static MlirWalkResult collect_op(MlirOperation op, void *user) {
  collect_t *c = user;
  MlirStringRef name = mlirIdentifierStr(mlirOperationGetName(op));
  if (!starts_with(name, "linalg.")) return MlirWalkResultAdvance;
  kiln_tile_sizes_t t;
  if (!choose(op, &t)) return MlirWalkResultAdvance;
  if (inside_forall(op)) t.forall_dim = -1;
  if (c->count == c->capacity) {
    int32_t cap = c->capacity ? c->capacity * 2 : 16;
    kiln_tile_sizes_t *n = realloc(c->sizes, sizeof(*n) * (size_t)cap);
    if (!n) {
      c->oom = true;
      return MlirWalkResultInterrupt;
    }
    c->sizes = n;
    c->capacity = cap;
  }
  c->sizes[c->count] = t;
  mlirOperationSetDiscardableAttributeByName(
      op, mlirStringRefCreateFromCString("kiln.tile_id"),
      mlirIntegerAttrGet(mlirIntegerTypeGet(c->ctx, 64), c->count));
  c->count++;
  return MlirWalkResultAdvance;
}

kiln_status_t kiln_kernels_vectorize_cpu(MlirContext ctx, MlirModule module) {
  collect_t c;
  memset(&c, 0, sizeof(c));
  c.ctx = ctx;
  MlirOperation root = mlirModuleGetOperation(module);
  mlirOperationWalk(root, collect_op, &c, MlirWalkPreOrder);
  if (c.oom) {
    free(c.sizes);
    return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "tile sizes");
  }
  char *text = NULL;
  kiln_status_t s = kiln_kernels_cpu_schedule(c.sizes, c.count, &text);
  free(c.sizes);
  if (s) return s;
  MlirModule script =
      mlirModuleCreateParse(ctx, mlirStringRefCreateFromCString(text));
  free(text);
  if (mlirModuleIsNull(script))
    return kiln_make_status(KILN_STATUS_INTERNAL,
                            "kernels: the CPU schedule does not parse");
  MlirOperation script_op = mlirModuleGetOperation(script);
  MlirOperation entry = mlirBlockGetFirstOperation(
      mlirRegionGetFirstBlock(mlirOperationGetRegion(script_op, 0)));
  MlirTransformOptions topts = mlirTransformOptionsCreate();
  MlirLogicalResult r =
      mlirTransformApplyNamedSequence(root, entry, script_op, topts);
  mlirTransformOptionsDestroy(topts);
  mlirModuleDestroy(script);
  if (mlirLogicalResultIsFailure(r))
    return kiln_make_status(KILN_STATUS_COMPILE_ERROR,
                            "kernels: applying the CPU schedule failed");
  return NULL;
}
