// Horizontal fusion of kernel launches (the CUDA target).
//
// After outlining, a graph's host function is a list of gpu.launch_func ops.
// An optimizer step over P parameters is about 3P of them (per parameter:
// the first moment, the second, the parameter), each a few microseconds of
// launch for a kernel that may run for less. Launches that touch disjoint
// buffers can run as one: this pass merges them into one kernel whose
// blocks are the members' blocks laid end to end; a block finds its member
// by comparing its id with the members' first blocks (a binary tree of
// uniform branches) and runs that member's body with its own block ids.
//
// Per run of launches (ended by any host op that is not a constant, a view
// or an allocation):
//   1. each launch's buffers, traced through views to their roots (function
//      arguments, allocations, constants), and whether its kernel writes
//      them (any use other than a load or a view counts as a write);
//   2. a level per launch: one more than the deepest earlier launch it
//      conflicts with (one writes what the other reads or writes), so that
//      launches of one level are independent and levels in order respect
//      every dependence;
//   3. per level, launches with the same block size whose kernels are
//      plain (one block, no shared-memory attributions, no symbol uses)
//      merge, up to kMaxMembers kernels and KILN_GPU_MAX_ARGS distinct
//      buffers per merged kernel; every launch of the run is then placed
//      at the run's end in level order.
// The members' bodies move (not copy) into the merged gpu.func; their
// gpu.block_id / gpu.grid_dim become the member's own values. Same block
// size means each block runs one member's body whole, so barriers and
// warp shuffles inside a body keep their meaning.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <mlir-c/IR.h>

#include "lowering/lowering.h"

enum { kMaxMembers = 64 };

typedef struct {
  MlirOperation launch;  // gpu.launch_func
  MlirOperation module;  // its gpu.module
  MlirOperation func;    // its gpu.func
  bool mergeable;
  int level;
  int64_t grid[3], block[3];
  int nargs;
  MlirValue *roots;  // per kernel operand: the buffer it views
  bool *writes;      // per kernel operand: whether the kernel may write it
} launch_t;

typedef struct {
  MlirContext ctx;
  MlirModule module;
  MlirBlock module_body;
  int fused;  // merged kernels created
  int counter;
} hfuse_t;

static bool is(MlirOperation op, const char *name) {
  MlirStringRef n = mlirIdentifierStr(mlirOperationGetName(op));
  return n.length == strlen(name) && memcmp(n.data, name, n.length) == 0;
}

static bool has_prefix(MlirOperation op, const char *prefix) {
  MlirStringRef n = mlirIdentifierStr(mlirOperationGetName(op));
  return n.length >= strlen(prefix) && memcmp(n.data, prefix, strlen(prefix)) == 0;
}

static bool is_view(MlirOperation op) {
  return is(op, "memref.subview") || is(op, "memref.expand_shape") ||
         is(op, "memref.collapse_shape") || is(op, "memref.cast") ||
         is(op, "memref.reshape") || is(op, "memref.reinterpret_cast") ||
         is(op, "memref.view") || is(op, "memref.assume_alignment") ||
         is(op, "memref.memory_space_cast");
}

// Host ops a launch may move past: they neither read nor write buffers.
static bool is_inert(MlirOperation op) {
  return is(op, "arith.constant") || is(op, "memref.alloc") ||
         is(op, "memref.alloca") || is(op, "memref.get_global") || is_view(op);
}

static MlirValue root_of(MlirValue v) {
  for (int depth = 0; depth < 16 && mlirValueIsAOpResult(v); ++depth) {
    MlirOperation def = mlirOpResultGetOwner(v);
    if (!is_view(def)) break;
    v = mlirOperationGetOperand(def, 0);
  }
  return v;
}

static bool constant_index(MlirValue v, int64_t *out) {
  if (!mlirValueIsAOpResult(v)) return false;
  MlirOperation def = mlirOpResultGetOwner(v);
  if (!is(def, "arith.constant")) return false;
  MlirAttribute a = mlirOperationGetAttributeByName(
      def, mlirStringRefCreateFromCString("value"));
  if (mlirAttributeIsNull(a) || !mlirAttributeIsAInteger(a)) return false;
  *out = mlirIntegerAttrGetValueInt(a);
  return true;
}

static MlirOperation find_symbol(MlirBlock body, MlirStringRef name) {
  for (MlirOperation op = mlirBlockGetFirstOperation(body); !mlirOperationIsNull(op);
       op = mlirOperationGetNextInBlock(op)) {
    MlirAttribute s = mlirOperationGetAttributeByName(
        op, mlirStringRefCreateFromCString("sym_name"));
    if (!mlirAttributeIsNull(s) && mlirAttributeIsAString(s) &&
        mlirStringRefEqual(mlirStringAttrGetValue(s), name))
      return op;
  }
  return (MlirOperation){NULL};
}

//===--- what a kernel does with its arguments ----------------------------===//

typedef struct {
  MlirValue *derived;  // the argument and views of it inside the kernel
  int count, cap;
  bool written;
  bool oom;
} uses_t;

static bool derived_from(const uses_t *u, MlirValue v) {
  for (int i = 0; i < u->count; ++i)
    if (mlirValueEqual(u->derived[i], v)) return true;
  return false;
}

static MlirWalkResult scan_uses(MlirOperation op, void *user) {
  uses_t *u = user;
  intptr_t n = mlirOperationGetNumOperands(op);
  bool uses = false;
  for (intptr_t i = 0; i < n && !uses; ++i)
    uses = derived_from(u, mlirOperationGetOperand(op, i));
  if (!uses) return MlirWalkResultAdvance;
  // A linalg op (kernels are lowered to loops later) reads its inputs and
  // writes its outputs.
  MlirAttribute seg = mlirOperationGetAttributeByName(
      op, mlirStringRefCreateFromCString("operandSegmentSizes"));
  if (has_prefix(op, "linalg.") && !mlirAttributeIsNull(seg) &&
      mlirAttributeIsADenseI32Array(seg) && mlirDenseArrayGetNumElements(seg) == 2) {
    for (intptr_t i = mlirDenseI32ArrayGetElement(seg, 0); i < n; ++i)
      if (derived_from(u, mlirOperationGetOperand(op, i))) {
        u->written = true;
        return MlirWalkResultInterrupt;
      }
    return MlirWalkResultAdvance;
  }
  if (is_view(op)) {
    if (u->count == u->cap) {
      int cap = u->cap * 2;
      MlirValue *d = realloc(u->derived, sizeof(*d) * (size_t)cap);
      if (!d) {
        u->oom = true;
        return MlirWalkResultInterrupt;
      }
      u->derived = d;
      u->cap = cap;
    }
    u->derived[u->count++] = mlirOperationGetResult(op, 0);
    return MlirWalkResultAdvance;
  }
  if (is(op, "memref.load") || is(op, "vector.load") ||
      is(op, "vector.transfer_read") || is(op, "vector.maskedload") ||
      is(op, "vector.gather") || is(op, "memref.dim") ||
      is(op, "memref.extract_strided_metadata"))
    return MlirWalkResultAdvance;
  u->written = true;  // stores, copies, and anything not known to only read
  return MlirWalkResultInterrupt;
}

// Whether the kernel `func` may write its argument `arg`; -1 on OOM.
static int kernel_writes(MlirOperation func, MlirValue arg) {
  uses_t u = {malloc(sizeof(MlirValue) * 8), 1, 8, false, false};
  if (!u.derived) return -1;
  u.derived[0] = arg;
  // Pre-order: a view is seen before the ops inside its users' regions.
  mlirOperationWalk(func, scan_uses, &u, MlirWalkPreOrder);
  free(u.derived);
  return u.oom ? -1 : u.written;
}

typedef struct {
  bool plain;
} plain_t;

static MlirWalkResult check_plain(MlirOperation op, void *user) {
  // Symbol uses (globals, calls) would have to move with the body;
  // cluster and global ids depend on the launch's shape.
  if (is(op, "memref.get_global") || is(op, "func.call") ||
      is(op, "gpu.global_id") || has_prefix(op, "gpu.cluster") ||
      is(op, "gpu.dynamic_shared_memory") || is(op, "gpu.printf")) {
    ((plain_t *)user)->plain = false;
    return MlirWalkResultInterrupt;
  }
  return MlirWalkResultAdvance;
}

// A kernel whose body can move into a merged kernel: one block, arguments
// exactly the function's inputs (no workgroup or private attributions).
static bool kernel_plain(MlirOperation func) {
  MlirRegion body = mlirOperationGetRegion(func, 0);
  MlirBlock entry = mlirRegionGetFirstBlock(body);
  if (mlirBlockIsNull(entry) || !mlirBlockIsNull(mlirBlockGetNextInRegion(entry)))
    return false;
  MlirAttribute ft = mlirOperationGetAttributeByName(
      func, mlirStringRefCreateFromCString("function_type"));
  if (mlirAttributeIsNull(ft) || !mlirAttributeIsAType(ft)) return false;
  MlirType fty = mlirTypeAttrGetValue(ft);
  if (mlirFunctionTypeGetNumInputs(fty) != mlirBlockGetNumArguments(entry))
    return false;
  plain_t p = {true};
  mlirOperationWalk(func, check_plain, &p, MlirWalkPreOrder);
  return p.plain;
}

static void launch_free(launch_t *l) {
  free(l->roots);
  free(l->writes);
}

static kiln_status_t read_launch(hfuse_t *h, MlirOperation op, launch_t *l) {
  memset(l, 0, sizeof(*l));
  l->launch = op;
  intptr_t n = mlirOperationGetNumOperands(op);
  // Only launches whose operands are grid, block and kernel arguments (no
  // async tokens, clusters or dynamic shared memory) are read; others stay
  // in place as unmergeable members of their level.
  MlirAttribute seg = mlirOperationGetAttributeByName(
      op, mlirStringRefCreateFromCString("operandSegmentSizes"));
  bool simple = !mlirAttributeIsNull(seg) && mlirAttributeIsADenseI32Array(seg) &&
                mlirDenseArrayGetNumElements(seg) >= 12 && n >= 6;
  // Segments: async tokens, grid x/y/z, block x/y/z, cluster x/y/z,
  // dynamic shared memory, kernel operands, async object.
  for (int k = 0; simple && k < (int)mlirDenseArrayGetNumElements(seg); ++k) {
    int32_t e = mlirDenseI32ArrayGetElement(seg, k);
    if (k != 11) simple = e == (k >= 1 && k <= 6 ? 1 : 0);
  }
  l->nargs = simple ? (int)(n - 6) : (int)n;
  l->roots = calloc((size_t)l->nargs + 1, sizeof(MlirValue));
  l->writes = calloc((size_t)l->nargs + 1, sizeof(bool));
  if (!l->roots || !l->writes)
    return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "cuda: launch fusion");
  for (int k = 0; simple && k < 6; ++k)
    simple = constant_index(mlirOperationGetOperand(op, k),
                            k < 3 ? &l->grid[k] : &l->block[k - 3]);
  MlirAttribute kernel = mlirOperationGetAttributeByName(
      op, mlirStringRefCreateFromCString("kernel"));
  if (simple && !mlirAttributeIsNull(kernel) && mlirAttributeIsASymbolRef(kernel) &&
      mlirSymbolRefAttrGetNumNestedReferences(kernel) == 1) {
    l->module = find_symbol(h->module_body, mlirSymbolRefAttrGetRootReference(kernel));
    if (!mlirOperationIsNull(l->module) && is(l->module, "gpu.module"))
      l->func = find_symbol(
          mlirRegionGetFirstBlock(mlirOperationGetRegion(l->module, 0)),
          mlirSymbolRefAttrGetLeafReference(kernel));
  }
  l->mergeable = simple && !mlirOperationIsNull(l->func) && is(l->func, "gpu.func") &&
                 kernel_plain(l->func);
  MlirBlock entry = l->mergeable
      ? mlirRegionGetFirstBlock(mlirOperationGetRegion(l->func, 0))
      : (MlirBlock){NULL};
  for (int k = 0; k < l->nargs; ++k) {
    MlirValue v = mlirOperationGetOperand(op, simple ? 6 + k : k);
    l->roots[k] = root_of(v);
    if (!mlirTypeIsAMemRef(mlirValueGetType(v))) continue;
    if (!l->mergeable) {
      l->writes[k] = true;
      continue;
    }
    int w = kernel_writes(l->func, mlirBlockGetArgument(entry, k));
    if (w < 0) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "cuda: launch fusion");
    l->writes[k] = w;
  }
  return NULL;
}

// Whether `b` (later) depends on `a` (earlier): one writes a buffer the
// other reads or writes.
static bool conflict(const launch_t *a, const launch_t *b) {
  for (int i = 0; i < a->nargs; ++i) {
    if (!mlirTypeIsAMemRef(mlirValueGetType(a->roots[i]))) continue;
    for (int j = 0; j < b->nargs; ++j)
      if ((a->writes[i] || b->writes[j]) && mlirValueEqual(a->roots[i], b->roots[j]))
        return true;
  }
  return false;
}

//===--- building a merged kernel -----------------------------------------===//

static void print_cb(MlirStringRef s, void *user) {
  kiln_sbuf_append((kiln_sbuf_t *)user, s.data, s.length);
}

// The leaves of the block-id search tree: block ids [first[lo], first[hi]).
static void emit_tree(kiln_sbuf_t *t, const int64_t *first, launch_t *const *m,
                      int lo, int hi) {
  if (hi - lo == 1) {
    const launch_t *l = m[lo];
    // The member's own grid and block ids (x fastest, as CUDA numbers a
    // grid's blocks); the marker finds this leaf after parsing.
    int j = lo;
    kiln_sbuf_printf(t, "%%gx%d = arith.constant %lld : index\n", j, (long long)l->grid[0]);
    kiln_sbuf_printf(t, "%%gy%d = arith.constant %lld : index\n", j, (long long)l->grid[1]);
    kiln_sbuf_printf(t, "%%gz%d = arith.constant %lld : index\n", j, (long long)l->grid[2]);
    kiln_sbuf_printf(t, "%%off%d = arith.constant %lld : index\n", j, (long long)first[j]);
    kiln_sbuf_printf(t, "%%lin%d = \"arith.subi\"(%%bid, %%off%d) {kiln.hfuse_member = %d : i64}"
                        " : (index, index) -> index\n", j, j, j);
    kiln_sbuf_printf(t, "%%bx%d = arith.remui %%lin%d, %%gx%d : index\n", j, j, j);
    kiln_sbuf_printf(t, "%%q%d = arith.divui %%lin%d, %%gx%d : index\n", j, j, j);
    kiln_sbuf_printf(t, "%%by%d = arith.remui %%q%d, %%gy%d : index\n", j, j, j);
    kiln_sbuf_printf(t, "%%bz%d = arith.divui %%q%d, %%gy%d : index\n", j, j, j);
    return;
  }
  int mid = (lo + hi) / 2;
  kiln_sbuf_printf(t,
                   "%%m%d_%d = arith.constant %lld : index\n"
                   "%%p%d_%d = arith.cmpi ult, %%bid, %%m%d_%d : index\n"
                   "scf.if %%p%d_%d {\n",
                   lo, hi, (long long)first[mid], lo, hi, lo, hi, lo, hi);
  emit_tree(t, first, m, lo, mid);
  kiln_sbuf_puts(t, "} else {\n");
  emit_tree(t, first, m, mid, hi);
  kiln_sbuf_puts(t, "}\n");
}

typedef struct {
  MlirOperation *ops;
  int count, cap;
  bool oom;
} oplist_t;

static void oplist_push(oplist_t *l, MlirOperation op) {
  if (l->count == l->cap) {
    int cap = l->cap ? l->cap * 2 : 16;
    MlirOperation *n = realloc(l->ops, sizeof(*n) * (size_t)cap);
    if (!n) {
      l->oom = true;
      return;
    }
    l->ops = n;
    l->cap = cap;
  }
  l->ops[l->count++] = op;
}

static MlirWalkResult collect_ids(MlirOperation op, void *user) {
  if (is(op, "gpu.block_id") || is(op, "gpu.grid_dim") ||
      (is(op, "arith.subi") &&
       !mlirAttributeIsNull(mlirOperationGetAttributeByName(
           op, mlirStringRefCreateFromCString("kiln.hfuse_member")))))
    oplist_push(user, op);
  return MlirWalkResultAdvance;
}

static int dim_of(MlirOperation op) {
  MlirAttribute d = mlirOperationGetAttributeByName(
      op, mlirStringRefCreateFromCString("dimension"));
  kiln_sbuf_t s;
  kiln_sbuf_init(&s);
  if (!mlirAttributeIsNull(d)) mlirAttributePrint(d, print_cb, &s);
  int dim = -1;
  if (s.data) dim = strstr(s.data, "x") ? 0 : strstr(s.data, "y") ? 1 : strstr(s.data, "z") ? 2 : -1;
  kiln_sbuf_free(&s);
  return dim;
}

static MlirValue index_constant(MlirContext ctx, MlirBlock block, MlirOperation before,
                                int64_t v) {
  MlirLocation loc = mlirLocationUnknownGet(ctx);
  MlirType index = mlirIndexTypeGet(ctx);
  MlirOperationState st = mlirOperationStateGet(mlirStringRefCreateFromCString("arith.constant"), loc);
  MlirNamedAttribute value = mlirNamedAttributeGet(
      mlirIdentifierGet(ctx, mlirStringRefCreateFromCString("value")),
      mlirIntegerAttrGet(index, v));
  mlirOperationStateAddAttributes(&st, 1, &value);
  mlirOperationStateAddResults(&st, 1, &index);
  MlirOperation op = mlirOperationCreate(&st);
  mlirBlockInsertOwnedOperationBefore(block, before, op);
  return mlirOperationGetResult(op, 0);
}

static kiln_status_t merge(hfuse_t *h, launch_t *const *m, int count, MlirOperation before) {
  MlirContext ctx = h->ctx;
  kiln_status_t s = NULL;
  // Distinct host operands, in first-use order, and each member's mapping.
  int total_args = 0;
  for (int j = 0; j < count; ++j) total_args += m[j]->nargs;
  MlirValue *args = calloc((size_t)total_args + 1, sizeof(MlirValue));
  int *map = calloc((size_t)total_args + 1, sizeof(int));
  int64_t *first = calloc((size_t)count + 1, sizeof(int64_t));
  oplist_t ids = {0};
  kiln_sbuf_t t;
  kiln_sbuf_init(&t);
  if (!args || !map || !first) {
    s = kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "cuda: launch fusion");
    goto done;
  }
  int nargs = 0;
  for (int j = 0, at = 0; j < count; ++j)
    for (int k = 0; k < m[j]->nargs; ++k, ++at) {
      MlirValue v = mlirOperationGetOperand(m[j]->launch, 6 + k);
      int found = -1;
      for (int u = 0; u < nargs && found < 0; ++u)
        if (mlirValueEqual(args[u], v)) found = u;
      if (found < 0) {
        found = nargs;
        args[nargs++] = v;
      }
      map[at] = found;
    }
  int64_t blocks = 0;
  for (int j = 0; j < count; ++j) {
    first[j] = blocks;
    blocks += m[j]->grid[0] * m[j]->grid[1] * m[j]->grid[2];
  }
  char name[64];
  snprintf(name, sizeof(name), "kiln_hfused_%d", h->counter++);
  kiln_sbuf_printf(&t, "gpu.module @%s {\ngpu.func @%s(", name, name);
  for (int u = 0; u < nargs; ++u) {
    kiln_sbuf_printf(&t, "%s%%a%d: ", u ? ", " : "", u);
    mlirTypePrint(mlirValueGetType(args[u]), print_cb, &t);
  }
  kiln_sbuf_printf(&t,
                   ") kernel attributes {known_block_size = array<i32: %lld, %lld, %lld>} {\n"
                   "%%bid = gpu.block_id x\n",
                   (long long)m[0]->block[0], (long long)m[0]->block[1],
                   (long long)m[0]->block[2]);
  emit_tree(&t, first, m, 0, count);
  kiln_sbuf_puts(&t, "gpu.return\n}\n}\n");
  if (t.oom) {
    s = kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "cuda: launch fusion");
    goto done;
  }
  MlirOperation mod = mlirOperationCreateParse(
      ctx, mlirStringRefCreate(t.data, t.length),
      mlirStringRefCreateFromCString("kiln-hfuse"));
  if (mlirOperationIsNull(mod)) {
    s = kiln_make_status(KILN_STATUS_INTERNAL, "cuda: launch fusion: the merged "
                         "kernel's skeleton does not parse");
    goto done;
  }
  mlirBlockAppendOwnedOperation(h->module_body, mod);
  MlirOperation func = mlirBlockGetFirstOperation(
      mlirRegionGetFirstBlock(mlirOperationGetRegion(mod, 0)));
  MlirBlock entry = mlirRegionGetFirstBlock(mlirOperationGetRegion(func, 0));
  // The leaves, in member order (their markers).
  mlirOperationWalk(func, collect_ids, &ids, MlirWalkPreOrder);
  MlirOperation *leaf = calloc((size_t)count + 1, sizeof(MlirOperation));
  if (ids.oom || !leaf) {
    free(leaf);
    s = kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "cuda: launch fusion");
    goto done;
  }
  int leaves = 0;
  for (int i = 0; i < ids.count; ++i)
    if (is(ids.ops[i], "arith.subi") && leaves < count) leaf[leaves++] = ids.ops[i];
  if (leaves != count) {
    free(leaf);
    s = kiln_make_status(KILN_STATUS_INTERNAL, "cuda: launch fusion: %d leaves for "
                         "%d kernels", leaves, count);
    goto done;
  }
  for (int j = 0, at = 0; j < count; ++j) {
    MlirOperation lin = leaf[j];
    mlirOperationRemoveAttributeByName(lin, mlirStringRefCreateFromCString("kiln.hfuse_member"));
    MlirBlock lb = mlirOperationGetBlock(lin);
    // [gx, gy, gz, off, lin, bx, q, by, bz, terminator]
    MlirOperation o[10];
    o[0] = mlirBlockGetFirstOperation(lb);
    for (int k = 1; k < 10; ++k) o[k] = mlirOperationGetNextInBlock(o[k - 1]);
    MlirValue bid[3] = {mlirOperationGetResult(o[5], 0), mlirOperationGetResult(o[7], 0),
                        mlirOperationGetResult(o[8], 0)};
    MlirValue grid[3] = {mlirOperationGetResult(o[0], 0), mlirOperationGetResult(o[1], 0),
                         mlirOperationGetResult(o[2], 0)};
    // Move the member's body in front of the leaf's terminator.
    MlirBlock body = mlirRegionGetFirstBlock(mlirOperationGetRegion(m[j]->func, 0));
    oplist_t moved = {0};
    for (MlirOperation op = mlirBlockGetFirstOperation(body); !mlirOperationIsNull(op);
         op = mlirOperationGetNextInBlock(op))
      if (!is(op, "gpu.return")) oplist_push(&moved, op);
    if (moved.oom) {
      free(moved.ops);
      free(leaf);
      s = kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "cuda: launch fusion");
      goto done;
    }
    for (int k = 0; k < moved.count; ++k) mlirOperationMoveBefore(moved.ops[k], o[9]);
    for (int k = 0; k < m[j]->nargs; ++k, ++at)
      mlirValueReplaceAllUsesOfWith(mlirBlockGetArgument(body, k),
                                    mlirBlockGetArgument(entry, map[at]));
    oplist_t found = {0};
    for (int k = 0; k < moved.count; ++k)
      mlirOperationWalk(moved.ops[k], collect_ids, &found, MlirWalkPreOrder);
    free(moved.ops);
    for (int k = 0; k < found.count && !found.oom; ++k) {
      int d = dim_of(found.ops[k]);
      if (d < 0) continue;  // left as is: the verifier will name it
      mlirValueReplaceAllUsesOfWith(mlirOperationGetResult(found.ops[k], 0),
                                    is(found.ops[k], "gpu.block_id") ? bid[d] : grid[d]);
      mlirOperationDestroy(found.ops[k]);
    }
    bool oom = found.oom;
    free(found.ops);
    if (oom) {
      free(leaf);
      s = kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "cuda: launch fusion");
      goto done;
    }
  }
  free(leaf);
  // The host launch: the members' blocks end to end, their block size.
  MlirBlock host = mlirOperationGetBlock(before);
  MlirValue grid = index_constant(ctx, host, before, blocks);
  MlirValue one = index_constant(ctx, host, before, 1);
  MlirValue *operands = calloc((size_t)nargs + 6, sizeof(MlirValue));
  if (!operands) {
    s = kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "cuda: launch fusion");
    goto done;
  }
  operands[0] = grid;
  operands[1] = operands[2] = one;
  for (int k = 3; k < 6; ++k) operands[k] = mlirOperationGetOperand(m[0]->launch, k);
  memcpy(operands + 6, args, sizeof(MlirValue) * (size_t)nargs);
  MlirAttribute seg = mlirOperationGetAttributeByName(
      m[0]->launch, mlirStringRefCreateFromCString("operandSegmentSizes"));
  int32_t segs[16];
  int nseg = (int)mlirDenseArrayGetNumElements(seg);
  for (int k = 0; k < nseg && k < 16; ++k) segs[k] = mlirDenseI32ArrayGetElement(seg, k);
  segs[11] = nargs;
  MlirOperationState st = mlirOperationStateGet(
      mlirStringRefCreateFromCString("gpu.launch_func"), mlirOperationGetLocation(m[0]->launch));
  mlirOperationStateAddOperands(&st, nargs + 6, operands);
  MlirAttribute leafref = mlirFlatSymbolRefAttrGet(ctx, mlirStringRefCreateFromCString(name));
  MlirNamedAttribute attrs[2] = {
      mlirNamedAttributeGet(mlirIdentifierGet(ctx, mlirStringRefCreateFromCString("operandSegmentSizes")),
                            mlirDenseI32ArrayGet(ctx, nseg, segs)),
      mlirNamedAttributeGet(mlirIdentifierGet(ctx, mlirStringRefCreateFromCString("kernel")),
                            mlirSymbolRefAttrGet(ctx, mlirStringRefCreateFromCString(name), 1,
                                                 &leafref)),
  };
  mlirOperationStateAddAttributes(&st, 2, attrs);
  MlirOperation launch = mlirOperationCreate(&st);
  free(operands);
  if (mlirOperationIsNull(launch)) {
    s = kiln_make_status(KILN_STATUS_INTERNAL, "cuda: launch fusion: gpu.launch_func");
    goto done;
  }
  mlirBlockInsertOwnedOperationBefore(host, before, launch);
  for (int j = 0; j < count; ++j) {
    mlirOperationDestroy(m[j]->launch);
    mlirOperationDestroy(m[j]->module);
    m[j]->launch = m[j]->module = m[j]->func = (MlirOperation){NULL};
  }
  h->fused++;
done:
  free(ids.ops);
  kiln_sbuf_free(&t);
  free(args);
  free(map);
  free(first);
  return s;
}

//===--- runs of launches -------------------------------------------------===//

static bool same_block(const launch_t *a, const launch_t *b) {
  return a->block[0] == b->block[0] && a->block[1] == b->block[1] &&
         a->block[2] == b->block[2];
}

// Levels, then merges, then every launch of the run at its end in level
// order (`end`: the op that ended the run).
static kiln_status_t fuse_run(hfuse_t *h, launch_t *run, int n, MlirOperation end) {
  int levels = 0;
  for (int i = 0; i < n; ++i) {
    run[i].level = 0;
    for (int j = 0; j < i; ++j)
      if (run[j].level + 1 > run[i].level && conflict(&run[j], &run[i]))
        run[i].level = run[j].level + 1;
    if (run[i].level + 1 > levels) levels = run[i].level + 1;
  }
  // Anything to merge at all? Otherwise leave the run as it is.
  bool any = false;
  for (int i = 0; i < n && !any; ++i)
    for (int j = i + 1; j < n && !any; ++j)
      any = run[i].mergeable && run[j].mergeable && run[i].level == run[j].level &&
            same_block(&run[i], &run[j]);
  if (!any) return NULL;
  launch_t **members = calloc((size_t)n + 1, sizeof(launch_t *));
  bool *placed = calloc((size_t)n + 1, sizeof(bool));
  if (!members || !placed) {
    free(members);
    free(placed);
    return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "cuda: launch fusion");
  }
  kiln_status_t s = NULL;
  for (int lv = 0; lv < levels && !s; ++lv) {
    for (int i = 0; i < n && !s; ++i) {
      if (placed[i] || run[i].level != lv) continue;
      placed[i] = true;
      int count = 0, distinct = run[i].nargs;
      members[count++] = &run[i];
      for (int j = i + 1; j < n && run[i].mergeable && count < kMaxMembers; ++j) {
        if (placed[j] || run[j].level != lv || !run[j].mergeable ||
            !same_block(&run[i], &run[j]))
          continue;
        if (distinct + run[j].nargs > KILN_GPU_MAX_ARGS) break;
        distinct += run[j].nargs;  // an upper bound: shared buffers count once
        placed[j] = true;
        members[count++] = &run[j];
      }
      if (count == 1)
        mlirOperationMoveBefore(run[i].launch, end);
      else
        s = merge(h, members, count, end);
    }
  }
  free(members);
  free(placed);
  return s;
}

kiln_status_t kiln_gpu_fuse_launches(MlirContext ctx, MlirModule module, int *fused) {
  hfuse_t h = {ctx, module, mlirModuleGetBody(module), 0, 0};
  *fused = 0;
  MlirOperation main = find_symbol(h.module_body,
                                   mlirStringRefCreateFromCString(KILN_ENTRY_NAME));
  if (mlirOperationIsNull(main)) return NULL;
  MlirBlock body = mlirRegionGetFirstBlock(mlirOperationGetRegion(main, 0));
  if (mlirBlockIsNull(body) || !mlirBlockIsNull(mlirBlockGetNextInRegion(body)))
    return NULL;
  int cap = 64, n = 0;
  launch_t *run = calloc((size_t)cap, sizeof(launch_t));
  if (!run) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "cuda: launch fusion");
  kiln_status_t s = NULL;
  MlirOperation op = mlirBlockGetFirstOperation(body);
  while (!s && !mlirOperationIsNull(op)) {
    MlirOperation next = mlirOperationGetNextInBlock(op);
    if (is(op, "gpu.launch_func")) {
      if (n == cap) {
        launch_t *g = realloc(run, sizeof(*g) * (size_t)cap * 2);
        if (!g) {
          s = kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "cuda: launch fusion");
          break;
        }
        run = g;
        cap *= 2;
      }
      s = read_launch(&h, op, &run[n++]);
    } else if (!is_inert(op)) {
      if (n > 1) s = fuse_run(&h, run, n, op);
      for (int i = 0; i < n; ++i) launch_free(&run[i]);
      n = 0;
    }
    op = next;
  }
  for (int i = 0; i < n; ++i) launch_free(&run[i]);
  free(run);
  *fused = h.fused;
  return s;
}
