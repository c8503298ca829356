// Horizontal fusion: independent loops or kernel launches of a graph run as
// one.
//
// An optimizer step over P parameters is about 3P elementwise updates (per
// parameter: the first moment, the second, the parameter). On the CUDA
// target each is a kernel launch of a few microseconds for a kernel that
// may run for less; on the CPU each large one is an OpenMP parallel region
// (a fork and a join). Updates that touch disjoint buffers can run as one:
//   - CUDA (kiln_gpu_fuse_launches, after outlining): launches of one block
//     size merge into one kernel whose blocks are the members' blocks laid
//     end to end; a block finds its member by comparing its id with the
//     members' first blocks (a binary tree of uniform branches) and runs
//     that member's body with its own block ids. Same block size means each
//     block runs one member's body whole, so barriers and warp shuffles
//     inside a body keep their meaning.
//   - CPU (kiln_cpu_fuse_loops, between scf-forall-to-parallel and
//     convert-scf-to-openmp): top-level scf.parallel loops merge into one
//     loop of one iteration per thread, in which each thread runs its static
//     share of every member in turn (an scf.for over the member's linear
//     iterations, its induction variables recomputed from them).
// The members' bodies move (not copy) into the merged kernel or loop.
//
// The schedule, per run of top-level ops of the entry function (a run ends
// at a call or the return):
//   1. each op's buffers, traced through views to their roots (function
//      arguments, allocations, constants), and whether it may write them
//      (any use other than a load or a view counts as a write; a linalg op
//      reads its inputs), and the results of earlier ops it uses;
//   2. a level per op: one more than the deepest earlier op it depends on
//      (one writes a buffer the other reads or writes, or it uses the
//      other's result), so that ops of one level are independent and levels
//      in order respect every dependence;
//   3. per level, the mergeable ops merge (up to kMaxMembers, and on CUDA
//      KILN_GPU_MAX_ARGS distinct buffers), and every op of the run is
//      placed at the run's end in level order. Constants, allocations and
//      views stay where they are.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <mlir-c/IR.h>

#include "kernels/gpu_splice.h"
#include "lowering/lowering.h"

enum { kMaxMembers = 64, kMaxLoopDims = 8, kMaxWorkgroup = 4 };

typedef enum { NODE_OTHER, NODE_LAUNCH, NODE_LOOP } node_kind_t;

// A top-level op of the entry function that reads or writes buffers, or
// produces values later ops use.
typedef struct {
  node_kind_t kind;
  MlirOperation op;
  bool mergeable;
  int level;
  int nbufs;
  MlirValue *roots;  // the buffers it uses, traced to their roots
  bool *writes;      // per buffer: whether it may write it
  int nuses;
  MlirValue *uses;   // values defined by other top-level ops that it uses
  // NODE_LAUNCH: the kernel, its launch sizes, its operand count.
  MlirOperation module, func;
  int64_t grid[3], block[3];
  int nkargs;
  // Its workgroup (shared memory) attributions: merged kernels share one
  // set, so only kernels with the same types (or none) merge.
  int nwg;
  MlirType wg[kMaxWorkgroup];
  // NODE_LOOP: constant bounds of each dim.
  int dims;
  int64_t lb[kMaxLoopDims], step[kMaxLoopDims], trips[kMaxLoopDims];
  int64_t size;  // blocks (launches) or iterations (loops)
} node_t;

typedef struct {
  MlirContext ctx;
  MlirBlock module_body;
  MlirBlock host;  // the entry function's body
  bool gpu;
  int threads;  // CPU: the parallel loops' thread count
  int fused;    // merged kernels or loops created
  int counter;
} hfuse_t;

static bool has_prefix(MlirOperation op, const char *prefix) {
  MlirStringRef n = mlirIdentifierStr(mlirOperationGetName(op));
  return n.length >= strlen(prefix) && memcmp(n.data, prefix, strlen(prefix)) == 0;
}

// Whether `op` is named one of `names` (NULL-terminated).
static bool named_any(MlirOperation op, const char *const *names) {
  for (; *names; ++names)
    if (kiln_gpu_op_named(op, *names)) return true;
  return false;
}

static bool is_view(MlirOperation op) {
  static const char *const kViews[] = {
      "memref.subview", "memref.expand_shape", "memref.collapse_shape",
      "memref.cast", "memref.reshape", "memref.reinterpret_cast", "memref.view",
      "memref.assume_alignment", "memref.memory_space_cast", NULL};
  return named_any(op, kViews);
}

// Whether `op` is a memref.reshape whose sizes come from a buffer the
// function stores them into (a reshape between shapes with two symbolic
// sizes in a group) rather than from a constant global.
static bool reshape_of_stored_sizes(MlirOperation op) {
  if (!kiln_gpu_op_named(op, "memref.reshape") || mlirOperationGetNumOperands(op) < 2)
    return false;
  MlirValue shape = mlirOperationGetOperand(op, 1);
  return !mlirValueIsAOpResult(shape) ||
         !kiln_gpu_op_named(mlirOpResultGetOwner(shape), "memref.get_global");
}

// Host ops that stay in place: they neither read nor write buffers. Not a
// reshape of stored sizes: it reads that buffer, and the stores move to
// the run's end with the loops. Left in place it read the sizes before they
// were stored: garbage bounds, reads past a buffer (a dynamic-shape
// training step's backward segfaulted). As a node of the run it follows
// the stores.
static bool is_inert(MlirOperation op) {
  static const char *const kInert[] = {"arith.constant", "ub.poison", "memref.alloc",
                                       "memref.alloca", "memref.get_global", NULL};
  return named_any(op, kInert) || (is_view(op) && !reshape_of_stored_sizes(op));
}

MlirValue kiln_memref_view_root(MlirValue v) {
  for (int depth = 0; depth < 16 && mlirValueIsAOpResult(v); ++depth) {
    MlirOperation def = mlirOpResultGetOwner(v);
    if (!is_view(def)) break;
    v = mlirOperationGetOperand(def, 0);
  }
  return v;
}

static kiln_status_t oom(void) {
  return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "horizontal fusion");
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

typedef struct {
  MlirValue *v;
  int count, cap;
  bool oom;
} vlist_t;

static bool vlist_has(const vlist_t *l, MlirValue v) {
  for (int i = 0; i < l->count; ++i)
    if (mlirValueEqual(l->v[i], v)) return true;
  return false;
}

static void vlist_add(vlist_t *l, MlirValue v) {
  if (vlist_has(l, v)) return;
  if (l->count == l->cap) {
    int cap = l->cap ? l->cap * 2 : 8;
    MlirValue *n = realloc(l->v, sizeof(*n) * (size_t)cap);
    if (!n) {
      l->oom = true;
      return;
    }
    l->v = n;
    l->cap = cap;
  }
  l->v[l->count++] = v;
}

//===--- what an op does with a buffer ------------------------------------===//

typedef struct {
  vlist_t derived;  // the buffer and views of it
  bool written;
} uses_t;

static MlirWalkResult scan_uses(MlirOperation op, void *user) {
  uses_t *u = user;
  intptr_t n = mlirOperationGetNumOperands(op);
  bool uses = false;
  for (intptr_t i = 0; i < n && !uses; ++i)
    uses = vlist_has(&u->derived, mlirOperationGetOperand(op, i));
  if (!uses) return MlirWalkResultAdvance;
  // A linalg op (lowered to loops later) reads its inputs and writes its
  // outputs.
  MlirAttribute seg = mlirOperationGetAttributeByName(
      op, mlirStringRefCreateFromCString("operandSegmentSizes"));
  if (has_prefix(op, "linalg.") && !mlirAttributeIsNull(seg) &&
      mlirAttributeIsADenseI32Array(seg) && mlirDenseArrayGetNumElements(seg) == 2) {
    for (intptr_t i = mlirDenseI32ArrayGetElement(seg, 0); i < n; ++i)
      if (vlist_has(&u->derived, mlirOperationGetOperand(op, i))) {
        u->written = true;
        return MlirWalkResultInterrupt;
      }
    return MlirWalkResultAdvance;
  }
  if (is_view(op)) {
    vlist_add(&u->derived, mlirOperationGetResult(op, 0));
    return u->derived.oom ? MlirWalkResultInterrupt : MlirWalkResultAdvance;
  }
  if (kiln_gpu_op_named(op, "memref.extract_strided_metadata")) {
    // Its base buffer (result 0) is the buffer again.
    vlist_add(&u->derived, mlirOperationGetResult(op, 0));
    return u->derived.oom ? MlirWalkResultInterrupt : MlirWalkResultAdvance;
  }
  static const char *const kReads[] = {"memref.load", "vector.load",
                                       "vector.transfer_read", "vector.maskedload",
                                       "vector.gather", "memref.dim",
                                       "memref.prefetch", NULL};
  if (named_any(op, kReads)) return MlirWalkResultAdvance;
  // cp.async (kernels/gpu_sgemm.c, gpu_mma.c) writes its destination
  // (operand 0, shared memory) and reads its source.
  if (kiln_gpu_op_named(op, "nvgpu.device_async_copy") &&
      !vlist_has(&u->derived, mlirOperationGetOperand(op, 0)))
    return MlirWalkResultAdvance;
  u->written = true;  // stores, copies, and anything not known to only read
  return MlirWalkResultInterrupt;
}

// Whether `op` (and what it holds) may write `buffer`; -1 on OOM.
static int may_write(MlirOperation op, MlirValue buffer) {
  uses_t u = {{0}, false};
  vlist_add(&u.derived, buffer);
  // Pre-order: a view is seen before the ops inside its users' regions.
  if (!u.derived.oom) mlirOperationWalk(op, scan_uses, &u, MlirWalkPreOrder);
  bool failed = u.derived.oom;
  free(u.derived.v);
  return failed ? -1 : u.written;
}

//===--- reading the ops of a run -----------------------------------------===//

typedef struct {
  MlirBlock host;
  MlirOperation self;
  vlist_t outside;  // values defined outside `self` that it uses
} outside_t;

static MlirWalkResult collect_outside(MlirOperation op, void *user) {
  outside_t *o = user;
  for (intptr_t i = 0; i < mlirOperationGetNumOperands(op); ++i) {
    MlirValue v = mlirOperationGetOperand(op, i);
    bool outside;
    if (mlirValueIsABlockArgument(v)) {
      outside = mlirBlockEqual(mlirBlockArgumentGetOwner(v), o->host);
    } else {
      MlirOperation def = mlirOpResultGetOwner(v);
      outside = mlirBlockEqual(mlirOperationGetBlock(def), o->host) &&
                !mlirOperationEqual(def, o->self);
    }
    if (outside) vlist_add(&o->outside, v);
  }
  return o->outside.oom ? MlirWalkResultInterrupt : MlirWalkResultAdvance;
}

static void node_free(node_t *n) {
  free(n->roots);
  free(n->writes);
  free(n->uses);
}

typedef struct {
  bool plain;
} plain_t;

static MlirWalkResult check_plain(MlirOperation op, void *user) {
  // Symbol uses (globals, calls) would have to move with the body;
  // cluster and global ids depend on the launch's shape.
  static const char *const kMoving[] = {"memref.get_global", "func.call",
                                        "gpu.global_id", "gpu.dynamic_shared_memory",
                                        "gpu.printf", NULL};
  if (named_any(op, kMoving) || has_prefix(op, "gpu.cluster")) {
    ((plain_t *)user)->plain = false;
    return MlirWalkResultInterrupt;
  }
  return MlirWalkResultAdvance;
}

// A loop that stays as it is: a stack allocation in the body would pile up
// in the merged loop's scf.for (scf.parallel is an allocation scope,
// scf.for is not); a contraction's register tile (vector.fma, which only
// the contraction lowering makes: the math expansions use math.fma) runs
// long enough that its fork and join are noise, and sharing its loop with
// a memory-bound op measured slower (the bench's MLP block: its second
// weight's transpose merged into the first matmul's loop, 1.43 -> 1.55 ms
// in kiln-run).
static MlirWalkResult check_stays(MlirOperation op, void *user) {
  if (kiln_gpu_op_named(op, "memref.alloca") || kiln_gpu_op_named(op, "vector.fma")) {
    ((plain_t *)user)->plain = false;
    return MlirWalkResultInterrupt;
  }
  return MlirWalkResultAdvance;
}

// A kernel whose body can move into a merged kernel: one block, arguments
// the function's inputs then up to kMaxWorkgroup workgroup attributions
// (their types into `n`), no private attributions.
static bool kernel_plain(MlirOperation func, node_t *n) {
  MlirRegion body = mlirOperationGetRegion(func, 0);
  MlirBlock entry = mlirRegionGetFirstBlock(body);
  if (mlirBlockIsNull(entry) || !mlirBlockIsNull(mlirBlockGetNextInRegion(entry)))
    return false;
  MlirAttribute ft = mlirOperationGetAttributeByName(
      func, mlirStringRefCreateFromCString("function_type"));
  if (mlirAttributeIsNull(ft) || !mlirAttributeIsAType(ft)) return false;
  MlirType fty = mlirTypeAttrGetValue(ft);
  intptr_t inputs = mlirFunctionTypeGetNumInputs(fty);
  MlirAttribute wa = mlirOperationGetAttributeByName(
      func, mlirStringRefCreateFromCString("workgroup_attributions"));
  int64_t nwg = !mlirAttributeIsNull(wa) && mlirAttributeIsAInteger(wa)
                    ? mlirIntegerAttrGetValueInt(wa)
                    : 0;
  if (nwg < 0 || nwg > kMaxWorkgroup || inputs + nwg != mlirBlockGetNumArguments(entry))
    return false;
  n->nwg = (int)nwg;
  for (int i = 0; i < n->nwg; ++i)
    n->wg[i] = mlirValueGetType(mlirBlockGetArgument(entry, inputs + i));
  plain_t p = {true};
  mlirOperationWalk(func, check_plain, &p, MlirWalkPreOrder);
  return p.plain;
}

// How many launches of the host function name `kernel` (its body moves
// into a merged kernel only if this one launch runs it).
static int launches_of(MlirBlock host, MlirAttribute kernel) {
  int n = 0;
  for (MlirOperation op = mlirBlockGetFirstOperation(host); !mlirOperationIsNull(op);
       op = mlirOperationGetNextInBlock(op)) {
    if (!kiln_gpu_op_named(op, "gpu.launch_func")) continue;
    MlirAttribute k = mlirOperationGetAttributeByName(
        op, mlirStringRefCreateFromCString("kernel"));
    n += !mlirAttributeIsNull(k) && mlirAttributeEqual(k, kernel);
  }
  return n;
}

// A gpu.launch_func whose operands are grid, block and kernel arguments only
// (no async tokens, clusters or dynamic shared memory), of constant sizes,
// launching a plain kernel.
static void read_launch(hfuse_t *h, node_t *n) {
  MlirOperation op = n->op;
  n->kind = NODE_LAUNCH;
  intptr_t count = mlirOperationGetNumOperands(op);
  // Segments: async tokens, grid x/y/z, block x/y/z, cluster x/y/z,
  // dynamic shared memory, kernel operands, async object.
  MlirAttribute seg = mlirOperationGetAttributeByName(
      op, mlirStringRefCreateFromCString("operandSegmentSizes"));
  bool simple = !mlirAttributeIsNull(seg) && mlirAttributeIsADenseI32Array(seg) &&
                mlirDenseArrayGetNumElements(seg) >= 12 &&
                mlirDenseArrayGetNumElements(seg) <= 16 && count >= 6 &&
                mlirOperationGetNumResults(op) == 0;  // no async token
  for (int k = 0; simple && k < (int)mlirDenseArrayGetNumElements(seg); ++k) {
    int32_t e = mlirDenseI32ArrayGetElement(seg, k);
    if (k != 11) simple = e == (k >= 1 && k <= 6 ? 1 : 0);
  }
  for (int k = 0; simple && k < 6; ++k)
    simple = kiln_mlir_constant_index(mlirOperationGetOperand(op, k),
                            k < 3 ? &n->grid[k] : &n->block[k - 3]);
  if (!simple) return;
  n->nkargs = (int)(count - 6);
  n->size = n->grid[0] * n->grid[1] * n->grid[2];
  MlirAttribute kernel = mlirOperationGetAttributeByName(
      op, mlirStringRefCreateFromCString("kernel"));
  if (mlirAttributeIsNull(kernel) || !mlirAttributeIsASymbolRef(kernel) ||
      mlirSymbolRefAttrGetNumNestedReferences(kernel) != 1)
    return;
  n->module = kiln_mlir_find_symbol(h->module_body, mlirSymbolRefAttrGetRootReference(kernel));
  if (mlirOperationIsNull(n->module) || !kiln_gpu_op_named(n->module, "gpu.module")) return;
  n->func = kiln_mlir_find_symbol(mlirRegionGetFirstBlock(mlirOperationGetRegion(n->module, 0)),
                        mlirSymbolRefAttrGetLeafReference(kernel));
  n->mergeable = !mlirOperationIsNull(n->func) && kiln_gpu_op_named(n->func, "gpu.func") &&
                 kernel_plain(n->func, n) && launches_of(h->host, kernel) == 1;
}

// An scf.parallel without reductions, of constant bounds, one block.
static void read_loop(node_t *n) {
  MlirOperation op = n->op;
  n->kind = NODE_LOOP;
  MlirAttribute seg = mlirOperationGetAttributeByName(
      op, mlirStringRefCreateFromCString("operandSegmentSizes"));
  if (mlirAttributeIsNull(seg) || !mlirAttributeIsADenseI32Array(seg) ||
      mlirDenseArrayGetNumElements(seg) != 4 || mlirDenseI32ArrayGetElement(seg, 3) != 0 ||
      mlirOperationGetNumResults(op) != 0)
    return;
  int dims = mlirDenseI32ArrayGetElement(seg, 0);
  if (dims < 1 || dims > kMaxLoopDims) return;
  n->dims = dims;
  n->size = 1;
  for (int d = 0; d < dims; ++d) {
    int64_t ub = 0;
    if (!kiln_mlir_constant_index(mlirOperationGetOperand(op, d), &n->lb[d]) ||
        !kiln_mlir_constant_index(mlirOperationGetOperand(op, dims + d), &ub) ||
        !kiln_mlir_constant_index(mlirOperationGetOperand(op, 2 * dims + d), &n->step[d]) ||
        n->step[d] < 1 || ub <= n->lb[d])
      return;
    n->trips[d] = (ub - n->lb[d] + n->step[d] - 1) / n->step[d];
    n->size *= n->trips[d];
  }
  MlirBlock body = mlirRegionGetFirstBlock(mlirOperationGetRegion(op, 0));
  if (mlirBlockIsNull(body) || !mlirBlockIsNull(mlirBlockGetNextInRegion(body)))
    return;
  MlirOperation term = mlirBlockGetTerminator(body);
  plain_t p = {true};
  mlirOperationWalk(op, check_stays, &p, MlirWalkPreOrder);
  n->mergeable = !mlirOperationIsNull(term) && kiln_gpu_op_named(term, "scf.reduce") &&
                 mlirOperationGetNumOperands(term) == 0 && p.plain;
}

static kiln_status_t read_node(hfuse_t *h, MlirOperation op, node_t *n) {
  memset(n, 0, sizeof(*n));
  n->op = op;
  n->kind = NODE_OTHER;
  if (h->gpu && kiln_gpu_op_named(op, "gpu.launch_func")) read_launch(h, n);
  if (!h->gpu && kiln_gpu_op_named(op, "scf.parallel")) read_loop(n);
  outside_t o = {h->host, op, {0}};
  mlirOperationWalk(op, collect_outside, &o, MlirWalkPreOrder);
  vlist_t bufs = {0};
  for (int i = 0; i < o.outside.count; ++i) {
    MlirValue v = o.outside.v[i];
    MlirType t = mlirValueGetType(v);
    // A TMA tensor map (the tensor-core kernel's) stands for the buffer it
    // describes, which the kernel reads; unranked views (what a map is
    // made of) are buffers too.
    MlirValue src = n->kind == NODE_LAUNCH ? kiln_gpu_tensor_map_source(v) : (MlirValue){NULL};
    if (!mlirValueIsNull(src))
      vlist_add(&bufs, src);
    else if (mlirTypeIsAMemRef(t) || mlirTypeIsAUnrankedMemRef(t))
      vlist_add(&bufs, v);
  }
  n->uses = o.outside.v;
  n->nuses = o.outside.count;
  n->roots = calloc((size_t)bufs.count + 1, sizeof(MlirValue));
  n->writes = calloc((size_t)bufs.count + 1, sizeof(bool));
  kiln_status_t s = o.outside.oom || bufs.oom || !n->roots || !n->writes ? oom() : NULL;
  // A launch's kernel says what it does with its operands; other ops say
  // it themselves.
  MlirBlock entry = n->mergeable && n->kind == NODE_LAUNCH
                        ? mlirRegionGetFirstBlock(mlirOperationGetRegion(n->func, 0))
                        : (MlirBlock){NULL};
  for (int i = 0; !s && i < bufs.count; ++i) {
    n->roots[i] = kiln_memref_view_root(bufs.v[i]);
    int w = 1;
    if (n->kind != NODE_LAUNCH) {
      w = may_write(op, bufs.v[i]);
    } else if (!mlirBlockIsNull(entry)) {
      // Every kernel operand that is this buffer.
      w = 0;
      for (int k = 0; k < n->nkargs && w == 0; ++k)
        if (mlirValueEqual(mlirOperationGetOperand(op, 6 + k), bufs.v[i]))
          w = may_write(n->func, mlirBlockGetArgument(entry, k));
    }
    if (w < 0) s = oom();
    n->writes[i] = w == 1;
    ++n->nbufs;
  }
  free(bufs.v);
  return s;
}

// Whether `b` (later) depends on `a` (earlier): one writes a buffer the
// other reads or writes, or `b` uses a result of `a`.
static bool depends(const node_t *a, const node_t *b) {
  for (int i = 0; i < a->nbufs; ++i)
    for (int j = 0; j < b->nbufs; ++j)
      if ((a->writes[i] || b->writes[j]) && mlirValueEqual(a->roots[i], b->roots[j]))
        return true;
  for (int j = 0; j < b->nuses; ++j)
    if (mlirValueIsAOpResult(b->uses[j]) &&
        mlirOperationEqual(mlirOpResultGetOwner(b->uses[j]), a->op))
      return true;
  return false;
}

//===--- building a merged kernel or loop ---------------------------------===//

static void print_cb(MlirStringRef s, void *user) {
  kiln_sbuf_append((kiln_sbuf_t *)user, s.data, s.length);
}

typedef void (*leaf_fn)(kiln_sbuf_t *t, const int64_t *first, node_t *const *m, int j);

// The member search: a binary tree of comparisons of `id` with the members'
// first blocks or iterations; leaf j is member j's.
static void emit_tree(kiln_sbuf_t *t, const char *id, const int64_t *first,
                      node_t *const *m, int lo, int hi, leaf_fn leaf) {
  if (hi - lo == 1) {
    leaf(t, first, m, lo);
    return;
  }
  int mid = (lo + hi) / 2;
  kiln_sbuf_printf(t,
                   "%%m%d_%d = arith.constant %lld : index\n"
                   "%%p%d_%d = arith.cmpi ult, %s, %%m%d_%d : index\n"
                   "scf.if %%p%d_%d {\n",
                   lo, hi, (long long)first[mid], lo, hi, id, lo, hi, lo, hi);
  emit_tree(t, id, first, m, lo, mid, leaf);
  kiln_sbuf_puts(t, "} else {\n");
  emit_tree(t, id, first, m, mid, hi, leaf);
  kiln_sbuf_puts(t, "}\n");
}

// A launch's leaf: the member's own grid and block ids (x fastest, as CUDA
// numbers a grid's blocks), in a fixed order; the marker finds the leaf
// after parsing.
static void emit_block_leaf(kiln_sbuf_t *t, const int64_t *first, node_t *const *m,
                            int j) {
  const node_t *l = m[j];
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
}

// A loop member's induction variables from its linear iteration `lin` (the
// last dim fastest), each marked with its dim, after a marked subtraction
// of nothing (the member's marker).
static void emit_ivs(kiln_sbuf_t *t, const node_t *l, int j, const char *lin) {
  kiln_sbuf_printf(t, "%%r%d_%d = \"arith.subi\"(%s, %%c0) {kiln.hfuse_member = %d : i64}"
                      " : (index, index) -> index\n", j, l->dims, lin, j);
  for (int d = l->dims - 1; d >= 0; --d) {
    kiln_sbuf_printf(t, "%%t%d_%d = arith.constant %lld : index\n", j, d, (long long)l->trips[d]);
    kiln_sbuf_printf(t, "%%s%d_%d = arith.constant %lld : index\n", j, d, (long long)l->step[d]);
    kiln_sbuf_printf(t, "%%l%d_%d = arith.constant %lld : index\n", j, d, (long long)l->lb[d]);
    kiln_sbuf_printf(t, "%%x%d_%d = arith.remui %%r%d_%d, %%t%d_%d : index\n", j, d, j, d + 1, j, d);
    kiln_sbuf_printf(t, "%%r%d_%d = arith.divui %%r%d_%d, %%t%d_%d : index\n", j, d, j, d + 1, j, d);
    kiln_sbuf_printf(t, "%%y%d_%d = arith.muli %%x%d_%d, %%s%d_%d : index\n", j, d, j, d, j, d);
    kiln_sbuf_printf(t, "%%iv%d_%d = \"arith.addi\"(%%l%d_%d, %%y%d_%d) {kiln.hfuse_iv = %d : i64}"
                        " : (index, index) -> index\n", j, d, j, d, j, d, d);
  }
}

static bool marked(MlirOperation op, const char *attr) {
  return !mlirAttributeIsNull(
      mlirOperationGetAttributeByName(op, mlirStringRefCreateFromCString(attr)));
}

static MlirWalkResult collect_markers(MlirOperation op, void *user) {
  if (marked(op, "kiln.hfuse_member") || marked(op, "kiln.hfuse_iv")) oplist_push(user, op);
  return MlirWalkResultAdvance;
}

static MlirWalkResult collect_ids(MlirOperation op, void *user) {
  if (kiln_gpu_op_named(op, "gpu.block_id") || kiln_gpu_op_named(op, "gpu.grid_dim"))
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

// Moves the ops of `from` (all but its terminator) in front of `before`.
static kiln_status_t move_body(MlirBlock from, MlirOperation before, oplist_t *moved) {
  MlirOperation term = mlirBlockGetTerminator(from);
  for (MlirOperation op = mlirBlockGetFirstOperation(from); !mlirOperationIsNull(op);
       op = mlirOperationGetNextInBlock(op))
    if (mlirOperationIsNull(term) || !mlirOperationEqual(op, term)) oplist_push(moved, op);
  if (moved->oom) return oom();
  for (int k = 0; k < moved->count; ++k) mlirOperationMoveBefore(moved->ops[k], before);
  return NULL;
}

static kiln_status_t merge_launches(hfuse_t *h, node_t *const *m, int count,
                                    MlirOperation before) {
  MlirContext ctx = h->ctx;
  kiln_status_t s = NULL;
  // Distinct host operands, in first-use order, and each member's mapping.
  int total_args = 0;
  for (int j = 0; j < count; ++j) total_args += m[j]->nkargs;
  MlirValue *args = calloc((size_t)total_args + 1, sizeof(MlirValue));
  int *map = calloc((size_t)total_args + 1, sizeof(int));
  int64_t *first = calloc((size_t)count + 1, sizeof(int64_t));
  oplist_t ids = {0};
  kiln_sbuf_t t;
  kiln_sbuf_init(&t);
  if (!args || !map || !first) {
    s = oom();
    goto done;
  }
  int nargs = 0;
  for (int j = 0, at = 0; j < count; ++j)
    for (int k = 0; k < m[j]->nkargs; ++k, ++at) {
      MlirValue v = mlirOperationGetOperand(m[j]->op, 6 + k);
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
  kiln_sbuf_puts(&t, ")");
  // One set of workgroup buffers for all members (same_kind: same types):
  // a block runs one member, so they never share it.
  if (m[0]->nwg) {
    kiln_sbuf_puts(&t, " workgroup(");
    for (int i = 0; i < m[0]->nwg; ++i) {
      kiln_sbuf_printf(&t, "%s%%w%d : ", i ? ", " : "", i);
      mlirTypePrint(m[0]->wg[i], print_cb, &t);
      // 16-byte aligned: cp.async and vector loads of 16 bytes use them.
      kiln_sbuf_puts(&t, " {llvm.align = 16 : i64}");
    }
    kiln_sbuf_puts(&t, ")");
  }
  kiln_sbuf_printf(&t,
                   " kernel attributes {known_block_size = array<i32: %lld, %lld, %lld>} {\n"
                   "%%bid = gpu.block_id x\n",
                   (long long)m[0]->block[0], (long long)m[0]->block[1],
                   (long long)m[0]->block[2]);
  emit_tree(&t, "%bid", first, m, 0, count, emit_block_leaf);
  kiln_sbuf_puts(&t, "gpu.return\n}\n}\n");
  if (t.oom) {
    s = oom();
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
  mlirOperationWalk(func, collect_markers, &ids, MlirWalkPreOrder);
  MlirOperation *leaf = calloc((size_t)count + 1, sizeof(MlirOperation));
  if (ids.oom || !leaf) {
    free(leaf);
    s = oom();
    goto done;
  }
  int leaves = 0;
  for (int i = 0; i < ids.count; ++i)
    if (kiln_gpu_op_named(ids.ops[i], "arith.subi") && leaves < count)
      leaf[leaves++] = ids.ops[i];
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
    s = move_body(body, o[9], &moved);
    if (s) {
      free(moved.ops);
      free(leaf);
      goto done;
    }
    for (int k = 0; k < m[j]->nkargs; ++k, ++at)
      mlirValueReplaceAllUsesOfWith(mlirBlockGetArgument(body, k),
                                    mlirBlockGetArgument(entry, map[at]));
    for (int k = 0; k < m[j]->nwg; ++k)
      mlirValueReplaceAllUsesOfWith(mlirBlockGetArgument(body, m[j]->nkargs + k),
                                    mlirBlockGetArgument(entry, nargs + k));
    oplist_t found = {0};
    for (int k = 0; k < moved.count; ++k)
      mlirOperationWalk(moved.ops[k], collect_ids, &found, MlirWalkPreOrder);
    free(moved.ops);
    for (int k = 0; k < found.count && !found.oom; ++k) {
      int d = dim_of(found.ops[k]);
      if (d < 0) continue;  // left as is: the verifier will name it
      bool block = kiln_gpu_op_named(found.ops[k], "gpu.block_id");
      mlirValueReplaceAllUsesOfWith(mlirOperationGetResult(found.ops[k], 0),
                                    block ? bid[d] : grid[d]);
      mlirOperationDestroy(found.ops[k]);
    }
    bool failed = found.oom;
    free(found.ops);
    if (failed) {
      free(leaf);
      s = oom();
      goto done;
    }
  }
  free(leaf);
  // The host launch: the members' blocks end to end, their block size.
  MlirBlock host = mlirOperationGetBlock(before);
  MlirValue grid = kiln_mlir_index_constant(ctx, host, before, blocks);
  MlirValue one = kiln_mlir_index_constant(ctx, host, before, 1);
  MlirValue *operands = calloc((size_t)nargs + 6, sizeof(MlirValue));
  if (!operands) {
    s = oom();
    goto done;
  }
  operands[0] = grid;
  operands[1] = operands[2] = one;
  for (int k = 3; k < 6; ++k) operands[k] = mlirOperationGetOperand(m[0]->op, k);
  memcpy(operands + 6, args, sizeof(MlirValue) * (size_t)nargs);
  MlirAttribute seg = mlirOperationGetAttributeByName(
      m[0]->op, mlirStringRefCreateFromCString("operandSegmentSizes"));
  int32_t segs[16];
  int nseg = (int)mlirDenseArrayGetNumElements(seg);
  for (int k = 0; k < nseg && k < 16; ++k) segs[k] = mlirDenseI32ArrayGetElement(seg, k);
  segs[11] = nargs;
  MlirOperationState st = mlirOperationStateGet(
      mlirStringRefCreateFromCString("gpu.launch_func"), mlirOperationGetLocation(m[0]->op));
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
    mlirOperationDestroy(m[j]->op);
    mlirOperationDestroy(m[j]->module);
    m[j]->op = m[j]->module = m[j]->func = (MlirOperation){NULL};
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

// The merged loop has one iteration per thread; each runs its static share
// of every member in turn (the share a separate parallel loop would give
// it), so members of different sizes or costs stay balanced as they were,
// at one fork and join for all.
static kiln_status_t merge_loops(hfuse_t *h, node_t *const *m, int count,
                                 MlirOperation before) {
  kiln_status_t s = NULL;
  oplist_t marks = {0};
  kiln_sbuf_t t;
  kiln_sbuf_init(&t);
  int64_t threads = h->threads;
  // A function holding the merged loop, parsed on its own; the loop then
  // moves into the host function and takes the host's bounds.
  kiln_sbuf_puts(&t, "func.func @kiln_hfuse(%lo: index, %hi: index, %one: index) {\n"
                     "scf.parallel (%p) = (%lo) to (%hi) step (%one) {\n"
                     "%c0 = arith.constant 0 : index\n%c1 = arith.constant 1 : index\n");
  kiln_sbuf_printf(&t, "%%nt = arith.constant %lld : index\n"
                       "%%p1 = arith.addi %%p, %%c1 : index\n", (long long)threads);
  for (int j = 0; j < count; ++j) {
    kiln_sbuf_printf(&t, "%%n%d = arith.constant %lld : index\n"
                         "%%a%d = arith.muli %%p, %%n%d : index\n"
                         "%%from%d = arith.divui %%a%d, %%nt : index\n"
                         "%%b%d = arith.muli %%p1, %%n%d : index\n"
                         "%%to%d = arith.divui %%b%d, %%nt : index\n"
                         "scf.for %%i%d = %%from%d to %%to%d step %%c1 {\n",
                     j, (long long)m[j]->size, j, j, j, j, j, j, j, j, j, j, j);
    char lin[32];
    snprintf(lin, sizeof(lin), "%%i%d", j);
    emit_ivs(&t, m[j], j, lin);
    kiln_sbuf_puts(&t, "}\n");
  }
  kiln_sbuf_puts(&t, "scf.reduce\n}\nreturn\n}\n");
  if (t.oom) {
    s = oom();
    goto done;
  }
  MlirOperation func = mlirOperationCreateParse(
      h->ctx, mlirStringRefCreate(t.data, t.length),
      mlirStringRefCreateFromCString("kiln-hfuse"));
  if (mlirOperationIsNull(func)) {
    s = kiln_make_status(KILN_STATUS_INTERNAL, "horizontal fusion: the merged loop's "
                         "skeleton does not parse");
    goto done;
  }
  MlirOperation loop = mlirBlockGetFirstOperation(
      mlirRegionGetFirstBlock(mlirOperationGetRegion(func, 0)));
  mlirOperationMoveBefore(loop, before);
  // The bounds stop using the skeleton's arguments before it goes.
  mlirOperationSetOperand(loop, 0, kiln_mlir_index_constant(h->ctx, h->host, loop, 0));
  mlirOperationSetOperand(loop, 1, kiln_mlir_index_constant(h->ctx, h->host, loop, threads));
  mlirOperationSetOperand(loop, 2, kiln_mlir_index_constant(h->ctx, h->host, loop, 1));
  mlirOperationDestroy(func);
  mlirOperationWalk(loop, collect_markers, &marks, MlirWalkPreOrder);
  if (marks.oom) {
    s = oom();
    goto done;
  }
  // Markers in pre-order: member j's subi, then its dims' induction
  // variables, then member j + 1's.
  int at = 0;
  for (int j = 0; j < count && !s; ++j) {
    MlirValue iv[kMaxLoopDims];
    MlirOperation lin = at < marks.count ? marks.ops[at++] : (MlirOperation){NULL};
    for (int d = m[j]->dims - 1; d >= 0 && at < marks.count; --d)
      iv[d] = mlirOperationGetResult(marks.ops[at++], 0);
    if (mlirOperationIsNull(lin) || !marked(lin, "kiln.hfuse_member")) {
      s = kiln_make_status(KILN_STATUS_INTERNAL, "horizontal fusion: leaf %d", j);
      break;
    }
    MlirBlock leaf = mlirOperationGetBlock(lin);
    MlirBlock body = mlirRegionGetFirstBlock(mlirOperationGetRegion(m[j]->op, 0));
    oplist_t moved = {0};
    s = move_body(body, mlirBlockGetTerminator(leaf), &moved);
    free(moved.ops);
    for (int d = 0; !s && d < m[j]->dims; ++d)
      mlirValueReplaceAllUsesOfWith(mlirBlockGetArgument(body, d), iv[d]);
  }
  for (int k = 0; k < marks.count; ++k) {
    mlirOperationRemoveAttributeByName(marks.ops[k], mlirStringRefCreateFromCString("kiln.hfuse_member"));
    mlirOperationRemoveAttributeByName(marks.ops[k], mlirStringRefCreateFromCString("kiln.hfuse_iv"));
  }
  for (int j = 0; !s && j < count; ++j) {
    mlirOperationDestroy(m[j]->op);
    m[j]->op = (MlirOperation){NULL};
  }
  if (!s) h->fused++;
done:
  free(marks.ops);
  kiln_sbuf_free(&t);
  return s;
}

//===--- runs -------------------------------------------------------------===//

static bool same_kind(const node_t *a, const node_t *b) {
  if (a->kind != b->kind) return false;
  if (a->kind != NODE_LAUNCH) return true;
  if (a->block[0] != b->block[0] || a->block[1] != b->block[1] ||
      a->block[2] != b->block[2] || a->nwg != b->nwg)
    return false;
  for (int i = 0; i < a->nwg; ++i)
    if (!mlirTypeEqual(a->wg[i], b->wg[i])) return false;
  return true;
}

// Levels, then merges, then every op of the run at its end in level order
// (`end`: the op that ended the run).
static kiln_status_t fuse_run(hfuse_t *h, node_t *run, int n, MlirOperation end) {
  int levels = 0;
  for (int i = 0; i < n; ++i) {
    run[i].level = 0;
    for (int j = 0; j < i; ++j)
      if (run[j].level + 1 > run[i].level && depends(&run[j], &run[i]))
        run[i].level = run[j].level + 1;
    if (run[i].level + 1 > levels) levels = run[i].level + 1;
  }
  // Anything to merge at all? Otherwise leave the run as it is.
  bool any = false;
  for (int i = 0; i < n && !any; ++i)
    for (int j = i + 1; j < n && !any; ++j)
      any = run[i].mergeable && run[j].mergeable && run[i].level == run[j].level &&
            same_kind(&run[i], &run[j]);
  if (!any) return NULL;
  node_t **members = calloc((size_t)n + 1, sizeof(node_t *));
  bool *placed = calloc((size_t)n + 1, sizeof(bool));
  if (!members || !placed) {
    free(members);
    free(placed);
    return oom();
  }
  kiln_status_t s = NULL;
  for (int lv = 0; lv < levels && !s; ++lv) {
    for (int i = 0; i < n && !s; ++i) {
      if (placed[i] || run[i].level != lv) continue;
      placed[i] = true;
      int count = 0, distinct = run[i].nkargs;
      members[count++] = &run[i];
      for (int j = i + 1; j < n && run[i].mergeable && count < kMaxMembers; ++j) {
        if (placed[j] || run[j].level != lv || !run[j].mergeable ||
            !same_kind(&run[i], &run[j]))
          continue;
        if (distinct + run[j].nkargs > KILN_GPU_MAX_ARGS) break;
        distinct += run[j].nkargs;  // an upper bound: shared buffers count once
        placed[j] = true;
        members[count++] = &run[j];
      }
      if (count == 1)
        mlirOperationMoveBefore(run[i].op, end);
      else if (run[i].kind == NODE_LAUNCH)
        s = merge_launches(h, members, count, end);
      else
        s = merge_loops(h, members, count, end);
    }
  }
  free(members);
  free(placed);
  return s;
}

static bool uses_any_result(MlirOperation op, const node_t *run, int n) {
  for (intptr_t i = 0; i < mlirOperationGetNumOperands(op); ++i) {
    MlirValue v = mlirOperationGetOperand(op, i);
    if (!mlirValueIsAOpResult(v)) continue;
    for (int k = 0; k < n; ++k)
      if (mlirOperationEqual(mlirOpResultGetOwner(v), run[k].op)) return true;
  }
  return false;
}

static kiln_status_t fuse(MlirContext ctx, MlirModule module, bool gpu, int threads,
                          int *fused) {
  hfuse_t h = {ctx, mlirModuleGetBody(module), {NULL}, gpu, threads, 0, 0};
  *fused = 0;
  MlirOperation main = kiln_mlir_find_symbol(h.module_body,
                                   mlirStringRefCreateFromCString(KILN_ENTRY_NAME));
  if (mlirOperationIsNull(main)) return NULL;
  h.host = mlirRegionGetFirstBlock(mlirOperationGetRegion(main, 0));
  if (mlirBlockIsNull(h.host) || !mlirBlockIsNull(mlirBlockGetNextInRegion(h.host)))
    return NULL;
  int cap = 64, n = 0;
  node_t *run = calloc((size_t)cap, sizeof(node_t));
  if (!run) return oom();
  kiln_status_t s = NULL;
  MlirOperation term = mlirBlockGetTerminator(h.host);
  MlirOperation op = mlirBlockGetFirstOperation(h.host);
  while (!s && !mlirOperationIsNull(op)) {
    MlirOperation next = mlirOperationGetNextInBlock(op);
    // A run ends at the return, at a call (effects unknown), and before an
    // op that stays in place but uses a result of the run.
    bool ends = mlirOperationEqual(op, term) || kiln_gpu_op_named(op, "func.call") ||
                (is_inert(op) && uses_any_result(op, run, n));
    if (ends) {
      if (n > 1) s = fuse_run(&h, run, n, op);
      for (int i = 0; i < n; ++i) node_free(&run[i]);
      n = 0;
    }
    if (!ends && !is_inert(op)) {
      if (n == cap) {
        node_t *g = realloc(run, sizeof(*g) * (size_t)cap * 2);
        if (!g) {
          s = oom();
          break;
        }
        run = g;
        cap *= 2;
      }
      s = read_node(&h, op, &run[n++]);
    }
    op = next;
  }
  for (int i = 0; i < n; ++i) node_free(&run[i]);
  free(run);
  *fused = h.fused;
  return s;
}

kiln_status_t kiln_gpu_fuse_launches(MlirContext ctx, MlirModule module, int *fused) {
  return fuse(ctx, module, true, 1, fused);
}

kiln_status_t kiln_cpu_fuse_loops(MlirContext ctx, MlirModule module, int threads,
                                  int *fused) {
  return fuse(ctx, module, false, threads, fused);
}
