// Streaming (non-temporal) stores for outputs larger than the caches (CPU).
//
// A kernel that writes a 64 MB output with ordinary stores reads it too:
// each cache line is fetched before it is overwritten (read for ownership),
// and the line then waits in the caches that the next op could not use
// anyway. On the 2-core development host a 64 MB negation moves at 38 GB/s
// with ordinary stores and 53 GB/s with `vmovntps` (a C loop measuring
// both, docs/cpu-codegen.md). glibc's memcpy makes the same switch above a
// size threshold.
//
// Which stores: those into an entry-function argument of at least
// kStreamMinBytes (the shared L3 of the machines kiln runs on is 32 MB or
// less) that the function only writes, through views, with 1-D in-bounds
// vector.transfer_writes along a unit-stride dim. A kernel that reads the
// buffer back (a matmul accumulating C in memory, an in-place update, a
// softmax normalizing its output in place) keeps ordinary stores: its reads
// would miss.
//
// Each such store becomes
//   scf.if (address % vector bytes == 0) { vector.store nontemporal }
//   else { vector.store }
// since nothing proves the alignment at compile time (a caller's buffer
// may start anywhere; x86 faults on an unaligned vmovntps, and LLVM splits
// an under-aligned non-temporal store into scalar ones). The test is a few
// integer ops per vector store, hoisted in part by LLVM, and always taken
// the same way. Non-temporal stores are weakly ordered: a seq_cst fence at
// the end of each thread's share of a parallel region (and before the
// return) makes them visible before the join.
//
// Runs in the LLVM stage after convert-vector-to-scf (n-D transfers
// unrolled to 1-D ones) and before the memref lowering.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mlir-c/AffineMap.h>
#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <mlir-c/IR.h>

#include "kernels/gpu_splice.h"
#include "lowering/lowering.h"

enum { kStreamMinBytes = 32 << 20, kMaxStores = 256 };

static void print_cb(MlirStringRef s, void *user) {
  kiln_sbuf_printf(user, "%.*s", (int)s.length, s.data);
}

static bool is_view(MlirOperation op) {
  return kiln_gpu_op_named(op, "memref.subview") ||
         kiln_gpu_op_named(op, "memref.expand_shape") ||
         kiln_gpu_op_named(op, "memref.collapse_shape") ||
         kiln_gpu_op_named(op, "memref.cast") ||
         kiln_gpu_op_named(op, "memref.reinterpret_cast");
}

// A 1-D, unmasked, in-bounds transfer_write along the innermost dim of a
// memref whose innermost stride is 1, of a vector of 16 to 64 bytes.
static bool streamable_write(MlirOperation w) {
  MlirValue vec = mlirOperationGetOperand(w, 0);
  MlirValue mem = mlirOperationGetOperand(w, 1);
  MlirType vt = mlirValueGetType(vec), mt = mlirValueGetType(mem);
  if (!mlirTypeIsAVector(vt) || mlirShapedTypeGetRank(vt) != 1 || !mlirTypeIsAMemRef(mt))
    return false;
  int64_t rank = mlirShapedTypeGetRank(mt);
  if (rank < 1 || mlirOperationGetNumOperands(w) != 2 + rank) return false;  // a mask
  MlirType et = mlirShapedTypeGetElementType(vt);
  if (!mlirTypeIsAF32(et) && !mlirTypeIsAF64(et)) return false;
  int64_t bytes = mlirShapedTypeGetDimSize(vt, 0) * (mlirTypeIsAF32(et) ? 4 : 8);
  if (bytes < 16 || bytes > 64 || (bytes & (bytes - 1))) return false;
  MlirAttribute ib = mlirOperationGetAttributeByName(w, mlirStringRefCreateFromCString("in_bounds"));
  if (mlirAttributeIsNull(ib) || !mlirAttributeIsAArray(ib) || mlirArrayAttrGetNumElements(ib) != 1 ||
      !mlirBoolAttrGetValue(mlirArrayAttrGetElement(ib, 0)))
    return false;
  MlirAttribute pm = mlirOperationGetAttributeByName(w, mlirStringRefCreateFromCString("permutation_map"));
  if (mlirAttributeIsNull(pm) || !mlirAttributeIsAAffineMap(pm) ||
      !mlirAffineMapIsMinorIdentity(mlirAffineMapAttrGetValue(pm)))
    return false;
  int64_t strides[8], offset;
  if (rank > 8 || mlirLogicalResultIsFailure(mlirMemRefTypeGetStridesAndOffset(mt, strides, &offset)))
    return false;
  return strides[rank - 1] == 1;
}

typedef struct {
  MlirOperation stores[kMaxStores];
  int count;
  bool ok;
} uses_t;

// Every use of `v` (a buffer or a view of it): views recurse, streamable
// writes are collected, anything else disqualifies the buffer.
static void collect(MlirValue v, uses_t *u) {
  for (MlirOpOperand use = mlirValueGetFirstUse(v); u->ok && !mlirOpOperandIsNull(use);
       use = mlirOpOperandGetNextUse(use)) {
    MlirOperation owner = mlirOpOperandGetOwner(use);
    unsigned idx = mlirOpOperandGetOperandNumber(use);
    if (is_view(owner) && idx == 0) {
      collect(mlirOperationGetResult(owner, 0), u);
    } else if (kiln_gpu_op_named(owner, "vector.transfer_write") && idx == 1 &&
               streamable_write(owner) && u->count < kMaxStores) {
      u->stores[u->count++] = owner;
    } else {
      u->ok = false;
    }
  }
}

static void append_type(kiln_sbuf_t *b, MlirType t) { mlirTypePrint(t, print_cb, b); }

// The store as text: a function of (vector, memref, indices) that the
// splice binds to the transfer_write's operands.
static char *store_text(MlirOperation w) {
  MlirValue vec = mlirOperationGetOperand(w, 0);
  MlirValue mem = mlirOperationGetOperand(w, 1);
  MlirType vt = mlirValueGetType(vec), mt = mlirValueGetType(mem);
  int64_t rank = mlirShapedTypeGetRank(mt);
  MlirType et = mlirShapedTypeGetElementType(vt);
  int esize = mlirTypeIsAF32(et) ? 4 : 8;
  int64_t bytes = mlirShapedTypeGetDimSize(vt, 0) * esize;
  kiln_sbuf_t b, ty, vty;
  kiln_sbuf_init(&b);
  kiln_sbuf_init(&ty);
  kiln_sbuf_init(&vty);
  append_type(&ty, mt);
  append_type(&vty, vt);
  kiln_sbuf_printf(&b, "func.func @stream(%%v: %s, %%m: %s", vty.data, ty.data);
  for (int64_t i = 0; i < rank; ++i) kiln_sbuf_printf(&b, ", %%i%lld: index", (long long)i);
  kiln_sbuf_printf(&b, ") {\n  %%esize = arith.constant %d : index\n"
                       "  %%mask = arith.constant %lld : index\n"
                       "  %%zero = arith.constant 0 : index\n  %%base, %%e0",
                   esize, (long long)(bytes - 1));
  for (int64_t i = 0; i < rank; ++i) kiln_sbuf_printf(&b, ", %%sz%lld", (long long)i);
  for (int64_t i = 0; i < rank; ++i) kiln_sbuf_printf(&b, ", %%st%lld", (long long)i);
  kiln_sbuf_printf(&b, " = memref.extract_strided_metadata %%m : %s -> memref<%s>, index",
                   ty.data, esize == 4 ? "f32" : "f64");
  for (int64_t i = 0; i < 2 * rank; ++i) kiln_sbuf_puts(&b, ", index");
  kiln_sbuf_printf(&b, "\n  %%p = memref.extract_aligned_pointer_as_index %%m : %s -> index\n",
                   ty.data);
  // element offset = offset + sum(i_k * stride_k); address = p + offset * esize
  for (int64_t i = 0; i < rank; ++i)
    kiln_sbuf_printf(&b, "  %%t%lld = arith.muli %%i%lld, %%st%lld : index\n"
                         "  %%e%lld = arith.addi %%e%lld, %%t%lld : index\n",
                     (long long)i, (long long)i, (long long)i, (long long)i + 1,
                     (long long)i, (long long)i);
  kiln_sbuf_printf(&b, "  %%bo = arith.muli %%e%lld, %%esize : index\n"
                       "  %%a = arith.addi %%p, %%bo : index\n"
                       "  %%lo = arith.andi %%a, %%mask : index\n"
                       "  %%ok = arith.cmpi eq, %%lo, %%zero : index\n"
                       "  scf.if %%ok {\n    vector.store %%v, %%m[",
                   (long long)rank);
  for (int pass = 0; pass < 2; ++pass) {
    for (int64_t i = 0; i < rank; ++i) kiln_sbuf_printf(&b, "%s%%i%lld", i ? ", " : "", (long long)i);
    if (pass == 0)
      kiln_sbuf_printf(&b, "] {nontemporal = true, alignment = %lld : i64} : %s, %s\n"
                           "  } else {\n    vector.store %%v, %%m[",
                       (long long)bytes, ty.data, vty.data);
    else
      kiln_sbuf_printf(&b, "] : %s, %s\n  }\n  return\n}\n", ty.data, vty.data);
  }
  kiln_sbuf_free(&ty);
  kiln_sbuf_free(&vty);
  return kiln_sbuf_take(&b);
}

// The op whose region `op` is in, walking up to the nearest omp.parallel
// (its thread body) or a null op at the function.
static MlirOperation enclosing_parallel(MlirOperation op) {
  for (MlirOperation p = mlirOperationGetParentOperation(op); !mlirOperationIsNull(p);
       p = mlirOperationGetParentOperation(p)) {
    if (kiln_gpu_op_named(p, "omp.parallel")) return p;
    if (kiln_gpu_op_named(p, "func.func")) break;
  }
  return (MlirOperation){NULL};
}

// `llvm.fence seq_cst` before the terminator of `block`.
static void add_fence(MlirContext ctx, MlirBlock block) {
  // LLVM's AtomicOrdering enum: 7 is seq_cst.
  MlirAttribute ord = mlirIntegerAttrGet(mlirIntegerTypeGet(ctx, 64), 7);
  MlirOperationState st = mlirOperationStateGet(mlirStringRefCreateFromCString("llvm.fence"),
                                                mlirLocationUnknownGet(ctx));
  MlirNamedAttribute a = mlirNamedAttributeGet(
      mlirIdentifierGet(ctx, mlirStringRefCreateFromCString("ordering")), ord);
  mlirOperationStateAddAttributes(&st, 1, &a);
  MlirOperation fence = mlirOperationCreate(&st);
  mlirBlockInsertOwnedOperationBefore(block, mlirBlockGetTerminator(block), fence);
}

bool kiln_streaming_stores_enabled(void) {
  const char *v = getenv("KILN_STREAM_STORES");
  return !v || strcmp(v, "0") != 0;
}

kiln_status_t kiln_cpu_streaming_stores(MlirContext ctx, MlirModule module, int *count) {
  *count = 0;
  MlirOperation main = kiln_mlir_find_symbol(mlirModuleGetBody(module),
                                             mlirStringRefCreateFromCString("kiln_main"));
  if (mlirOperationIsNull(main) || !kiln_gpu_op_named(main, "func.func")) return NULL;
  MlirBlock entry = mlirRegionGetFirstBlock(mlirOperationGetRegion(main, 0));
  MlirOperation fenced[16];
  int nfenced = 0;
  bool fence_at_return = false;
  for (intptr_t a = 0; a < mlirBlockGetNumArguments(entry); ++a) {
    MlirValue arg = mlirBlockGetArgument(entry, a);
    MlirType t = mlirValueGetType(arg);
    if (!mlirTypeIsAMemRef(t) || !mlirShapedTypeHasStaticShape(t)) continue;
    MlirType et = mlirShapedTypeGetElementType(t);
    if (!mlirTypeIsAF32(et) && !mlirTypeIsAF64(et)) continue;
    int64_t bytes = mlirTypeIsAF32(et) ? 4 : 8;
    for (int64_t i = 0; i < mlirShapedTypeGetRank(t); ++i) bytes *= mlirShapedTypeGetDimSize(t, i);
    if (bytes < kStreamMinBytes) continue;
    uses_t *u = calloc(1, sizeof(*u));
    if (!u) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "streaming stores");
    u->ok = true;
    collect(arg, u);
    for (int s = 0; u->ok && s < u->count; ++s) {
      MlirOperation w = u->stores[s];
      MlirOperation par = enclosing_parallel(w);
      if (mlirOperationIsNull(par)) {
        fence_at_return = true;
      } else {
        bool seen = false;
        for (int k = 0; k < nfenced; ++k) seen |= mlirOperationEqual(fenced[k], par);
        if (!seen && nfenced == 16) continue;  // keeps its ordinary store
        if (!seen) {
          fenced[nfenced++] = par;
          MlirBlock body = mlirRegionGetFirstBlock(mlirOperationGetRegion(par, 0));
          add_fence(ctx, body);
        }
      }
      char *text = store_text(w);
      if (!text) {
        free(u);
        return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "streaming stores");
      }
      intptr_t n = mlirOperationGetNumOperands(w);
      MlirValue args[2 + 8];
      for (intptr_t k = 0; k < n; ++k) args[k] = mlirOperationGetOperand(w, k);
      kiln_status_t st = kiln_gpu_splice(ctx, text, w, args, (int)n, "streaming store");
      free(text);
      if (st) {
        free(u);
        return st;
      }
      ++*count;
    }
    free(u);
  }
  if (fence_at_return) {
    // Before every return of the entry function (one block in kiln's IR).
    MlirBlock last = entry;
    for (MlirBlock b = entry; !mlirBlockIsNull(b); b = mlirBlockGetNextInRegion(b)) last = b;
    add_fence(ctx, last);
  }
  return NULL;
}
