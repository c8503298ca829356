// Cooperative row reductions for the CUDA target (softmax, log_softmax,
// layer norm): a group of linalg ops over the rows of an f32[M,N] tensor
// becomes one kernel in which L lanes (part of a warp, a warp, or a whole
// block) own a row, each lane holding V 16-byte vectors of it in
// registers, reductions being vector.reduction then a gpu.shuffle xor
// butterfly across the lanes (gpu.all_reduce across a block).
//
// The replacement is written as MLIR text (a block scf.forall over rows and
// a thread scf.forall inside, on tensors, tagged for kiln_kernels_map_gpu),
// parsed as a function and inlined by hand where the group was. The shape
// follows the recipe verified with mlir-opt 22: the expand_shape of the row
// block to [R,V,L,4] and one rectangular parallel_insert_slice per lane
// keep bufferization in place (no allocations in the kernel).
//
// Rows longer than a warp's register budget are a block's: up to 1024
// lanes of at least 2 vectors each (N = 4096: 512 lanes of 8 floats), one
// row per block, read once; each reduction goes across the warps by
// gpu.all_reduce (shared memory and barriers, from convert-gpu-to-nvvm).
// Long rows that do not split so (N a multiple of 128 but not of 256, or
// more than 1024 lanes of 16 vectors) are streamed by a warp instead: each
// reduction is an scf.for over chunks of Vc vectors per lane with a vector
// accumulator, then the butterfly, and the outputs
// are written by a last loop over the chunks. Row values are not kept
// between these passes but recomputed from the inputs in each: a member
// over the rows is emitted where a pass first needs it. At large M the
// rows in flight exceed L2 and every pass reads the row from memory again,
// so softmax's max and sum of exponentials, and layer norm's sum and sum
// of squared deviations, share one pass each ("one-pass forms" below):
// softmax, log_softmax and layer norm read their rows twice. Odd passes
// walk the chunks backwards, so a pass starts on the chunks the previous
// one read last.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mlir-c/AffineExpr.h>
#include <mlir-c/AffineMap.h>
#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>

#include "kernels/kernels.h"

// Block ids of the row kernels: clear of kiln_kernels_tile_gpu's (0, 1, ..).
#define ROWS_BLOCK_ID_BASE 1000000
// Threads per block at most, and at least (whole warps: the butterfly's
// shfl.sync names all 32 lanes).
#define ROWS_MAX_THREADS 256
#define ROWS_MIN_THREADS 64
// f32 per lane of one row value kept in registers (N <= 2048 with 32 lanes):
// ptxas -v (sm_90) gives no spills up to here (softmax 100 registers,
// log_softmax 166, layer norm 119 at N = 2048); longer rows of 32 lanes
// (N a multiple of 128) are streamed, others left to the other schedules.
#define ROWS_MAX_PER_LANE 64
// Enough blocks to fill an H100/H200 (132 SMs) twice before blocks grow.
#define ROWS_TARGET_BLOCKS 264
// 16-byte vectors per lane in one chunk of a streamed row (at most): 8
// (4 KB of loads per warp in flight) for one input, 16 for more. ptxas -v
// (sm_90, f32[16384,4096], blocks of 256, one-pass forms): softmax 64
// registers at 8, log_softmax 63; layer norm with weight and bias 98 at
// 16, without them 64 at 8; no spills.
#define ROWS_CHUNK_VECTORS 8
// Rows of a whole block: up to this many lanes, each holding at least this
// many 16-byte vectors of the row (N = 4096: 512 lanes of 8 floats). On the
// H100, f32[16384,4096] in two alternating runs: softmax 0.246 / 0.228 ms
// at 2 vectors a lane, 0.272 / 0.233 at 4, 0.294 / 0.235 at 8; layer norm
// 0.244 / 0.238, 0.249 / 0.269, 0.275 / 0.245.
#define ROWS_BLOCK_MAX_LANES 1024
#define ROWS_BLOCK_MIN_VECTORS 2
#define ROWS_CHUNK_VECTORS_MULTI 16

#define MAX_OPS 32
#define MAX_VALUES 128
#define MAX_INPUTS 16
#define MAX_OUTPUTS 16
#define NAME 24

typedef enum { K_NONE = 0, K_ROW, K_SCALAR, K_COL } kind_t;

// A tensor value of the group: a member's result, an input, a constant fill.
typedef struct {
  MlirValue v;
  kind_t kind;
  char name[NAME];  // vector<Kxf32> (ROW, COL) or f32 (SCALAR) in the kernel
  // Streamed rows: the member computing a row value, emitted again in each
  // pass that needs it ("" name: not yet in this pass).
  MlirOperation def;
} reg_t;

typedef struct {
  MlirValue v;  // the whole tensor, [M,N] or [N]
  kind_t kind;
  char name[NAME];  // its registers once loaded ("" before)
} input_t;

// A scalar value inside a generic's body, as re-emitted.
typedef struct {
  MlirValue v;
  bool varying;  // differs along the row: a vector<K> in the kernel
  char name[NAME];
} bval_t;

typedef struct {
  MlirContext ctx;
  MlirBlock block;      // the block holding the group (or the forall)
  MlirOperation forall; // case (a): the row forall replaced as a whole
  MlirValue iv;         // its induction variable
  int64_t B, M, N;      // rows of the group's tensors, rows in all, row length
  int64_t L, V, K, R, T;
  // Streamed rows: K = 4 Vc floats per lane per chunk, C chunks; `pass`
  // counts the loops emitted, `in_pass` while inside one.
  bool chunked;
  int64_t Vc, C;
  int pass;
  bool in_pass;
  MlirOperation ops[MAX_OPS];
  int nops;
  input_t in[MAX_INPUTS];
  int nin;
  reg_t regs[MAX_VALUES];
  int nregs;
  // Results: what they replace, their kind, register and type.
  MlirValue out[MAX_OUTPUTS];
  kind_t out_kind[MAX_OUTPUTS];
  char out_reg[MAX_OUTPUTS][NAME];
  int out_regi[MAX_OUTPUTS];  // index in regs
  MlirType out_type[MAX_OUTPUTS];
  int nout;
  // Scalar constants captured from outside the bodies.
  MlirValue cst[MAX_VALUES];
  char cst_name[MAX_VALUES][NAME];
  int ncst;
  bval_t bv[MAX_VALUES * 2];
  int nbv;
  // Streamed rows: a row value standing for another (subst_v, named
  // subst_name) while a member's element is evaluated at one point; the
  // mean and M2 of a row value gathered by the pass of its sum (stat_x;
  // see emit_sum_stats).
  MlirValue subst_v;
  char subst_name[NAME];
  MlirValue stat_x;
  char stat_mean[NAME], stat_m2[NAME];
  kiln_sbuf_t pre, body;
  int next;
  bool failed;
} group_t;

//===--- small helpers ----------------------------------------------------===//

static bool is(MlirOperation op, const char *name) {
  if (mlirOperationIsNull(op)) return false;
  MlirStringRef n = mlirIdentifierStr(mlirOperationGetName(op));
  return n.length == strlen(name) && memcmp(n.data, name, n.length) == 0;
}

static bool prefixed(MlirOperation op, const char *prefix) {
  MlirStringRef n = mlirIdentifierStr(mlirOperationGetName(op));
  return n.length > strlen(prefix) && memcmp(n.data, prefix, strlen(prefix)) == 0;
}

static MlirOperation def_of(MlirValue v) {
  if (mlirValueIsAOpResult(v)) return mlirOpResultGetOwner(v);
  MlirOperation null = {NULL};
  return null;
}

static MlirAttribute attr(MlirOperation op, const char *name) {
  return mlirOperationGetAttributeByName(op, mlirStringRefCreateFromCString(name));
}

static void sbuf_cb(MlirStringRef s, void *user) {
  kiln_sbuf_append(user, s.data, s.length);
}

static void put_type(kiln_sbuf_t *b, MlirType t) { mlirTypePrint(t, sbuf_cb, b); }

static void fresh(group_t *g, char *out) { snprintf(out, NAME, "%%v%d", g->next++); }

// Element i of a dense i64 array attribute, or `dflt`.
static int64_t i64_at(MlirAttribute a, intptr_t i, int64_t dflt) {
  if (mlirAttributeIsNull(a) || !mlirAttributeIsADenseI64Array(a) ||
      i >= mlirDenseArrayGetNumElements(a))
    return dflt;
  return mlirDenseI64ArrayGetElement(a, i);
}

static intptr_t array_len(MlirAttribute a) {
  return mlirAttributeIsNull(a) || !mlirAttributeIsADenseI64Array(a)
             ? -1
             : mlirDenseArrayGetNumElements(a);
}

// The row form of a tensor type for rows B and row length N: [B,N] and
// [B,1,N] are rows, [B] and [B,1] a scalar per row, [N] a vector along
// the row; f32, static. Bit flags, since [B] and [N] agree when B == N.
enum { F_ROW = 1, F_SCALAR = 2, F_COL = 4 };
static int forms(MlirType t, int64_t B, int64_t N) {
  if (!mlirTypeIsARankedTensor(t) || !mlirShapedTypeHasStaticShape(t) ||
      !mlirTypeIsAF32(mlirShapedTypeGetElementType(t)))
    return 0;
  intptr_t r = mlirShapedTypeGetRank(t);
  int64_t d[3] = {0, 0, 0};
  for (intptr_t i = 0; i < r && i < 3; ++i) d[i] = mlirShapedTypeGetDimSize(t, i);
  int f = 0;
  if ((r == 2 && d[0] == B && d[1] == N) ||
      (r == 3 && d[0] == B && d[1] == 1 && d[2] == N))
    f |= F_ROW;
  if ((r == 1 && d[0] == B) || (r == 2 && d[0] == B && d[1] == 1)) f |= F_SCALAR;
  if (r == 1 && d[0] == N) f |= F_COL;
  return f;
}

// Through reshapes between forms of one kind to the value they view.
static MlirValue look_through(MlirValue v, int64_t B, int64_t N) {
  for (int depth = 0; depth < 8; ++depth) {
    MlirOperation d = def_of(v);
    if (!(is(d, "tensor.expand_shape") || is(d, "tensor.collapse_shape"))) break;
    MlirValue src = mlirOperationGetOperand(d, 0);
    int a = forms(mlirValueGetType(src), B, N), b = forms(mlirValueGetType(v), B, N);
    if (!(a & b)) break;
    v = src;
  }
  return v;
}

//===--- recognizing row generics -----------------------------------------===//

typedef enum { D_BAD = 0, D_ROW, D_RED, D_SCALAR } domain_t;

typedef struct {
  domain_t domain;
  int rank;            // of the iteration domain
  int nin, nout;
  kind_t kind[16];     // per operand (inputs then outputs)
} ginfo_t;

// The kind an operand takes in a domain of `rank` dims (row dim d0, the
// column dim last; in a rank-3 reduction d1 is a unit dim), or K_NONE.
static kind_t operand_kind(MlirAffineMap map, MlirType t, int rank, bool scalar_domain,
                           int64_t B, int64_t N) {
  int f = forms(t, B, N);
  intptr_t n = mlirAffineMapGetNumResults(map);
  int dim[3] = {-2, -2, -2};  // dim position, or -1 for the constant 0
  for (intptr_t i = 0; i < n && i < 3; ++i) {
    MlirAffineExpr e = mlirAffineMapGetResult(map, i);
    if (mlirAffineExprIsADim(e)) dim[i] = (int)mlirAffineDimExprGetPosition(e);
    else if (mlirAffineExprIsAConstant(e) && mlirAffineConstantExprGetValue(e) == 0)
      dim[i] = -1;
  }
  intptr_t r = mlirShapedTypeGetRank(t);
  int col = rank - 1;
  if (scalar_domain) {
    // [B] by (d0); [B,1] by (d0, d1) or (d0, 0).
    if ((f & F_SCALAR) && r == 1 && n == 1 && dim[0] == 0) return K_SCALAR;
    if ((f & F_SCALAR) && r == 2 && n == 2 && dim[0] == 0 &&
        (dim[1] == -1 || (rank == 2 && dim[1] == 1)))
      return K_SCALAR;
    return K_NONE;
  }
  if ((f & F_ROW) && r == 2 && n == 2 && dim[0] == 0 && dim[1] == col) return K_ROW;
  if ((f & F_ROW) && r == 3 && rank == 3 && n == 3 && dim[0] == 0 && dim[1] == 1 &&
      dim[2] == 2)
    return K_ROW;
  if ((f & F_SCALAR) && r == 1 && n == 1 && dim[0] == 0) return K_SCALAR;
  if ((f & F_SCALAR) && r == 2 && n == 2 && dim[0] == 0 &&
      (dim[1] == -1 || (rank == 3 && dim[1] == 1)))
    return K_SCALAR;
  if ((f & F_COL) && r == 1 && n == 1 && dim[0] == col) return K_COL;
  return K_NONE;
}

static bool iterator_is(MlirAttribute it, const char *what) {
  kiln_sbuf_t b;
  kiln_sbuf_init(&b);
  mlirAttributePrint(it, sbuf_cb, &b);
  bool r = b.data && strstr(b.data, what) != NULL;
  kiln_sbuf_free(&b);
  return r;
}

// Whether `op` is a linalg.generic over the rows (B, N), and how.
static bool classify(MlirOperation op, int64_t B, int64_t N, ginfo_t *gi) {
  memset(gi, 0, sizeof(*gi));
  if (!is(op, "linalg.generic") || B < 1 || N < 2) return false;
  MlirAttribute seg = attr(op, "operandSegmentSizes");
  MlirAttribute maps = attr(op, "indexing_maps");
  MlirAttribute iters = attr(op, "iterator_types");
  if (mlirAttributeIsNull(seg) || !mlirAttributeIsADenseI32Array(seg) ||
      mlirDenseArrayGetNumElements(seg) != 2 || mlirAttributeIsNull(maps) ||
      mlirAttributeIsNull(iters) || !mlirAttributeIsAArray(iters))
    return false;
  gi->nin = mlirDenseI32ArrayGetElement(seg, 0);
  gi->nout = mlirDenseI32ArrayGetElement(seg, 1);
  int n = gi->nin + gi->nout;
  if (gi->nout < 1 || n > 16 || mlirArrayAttrGetNumElements(maps) != n ||
      mlirOperationGetNumResults(op) != gi->nout)
    return false;
  int rank = (int)mlirArrayAttrGetNumElements(iters);
  bool red[3] = {false, false, false};
  if (rank < 1 || rank > 3) return false;
  for (int i = 0; i < rank; ++i) {
    MlirAttribute it = mlirArrayAttrGetElement(iters, i);
    red[i] = iterator_is(it, "reduction");
    if (!red[i] && !iterator_is(it, "parallel")) return false;
  }
  // The loop ranges, read off the operand shapes.
  int64_t range[3] = {-1, -1, -1};
  for (int i = 0; i < n; ++i) {
    MlirType t = mlirValueGetType(mlirOperationGetOperand(op, i));
    MlirAffineMap m = mlirAffineMapAttrGetValue(mlirArrayAttrGetElement(maps, i));
    if (!mlirTypeIsARankedTensor(t) || !mlirShapedTypeHasStaticShape(t) ||
        mlirAffineMapGetNumDims(m) != rank || mlirAffineMapGetNumSymbols(m) != 0 ||
        mlirAffineMapGetNumResults(m) != mlirShapedTypeGetRank(t))
      return false;
    for (intptr_t k = 0; k < mlirAffineMapGetNumResults(m); ++k) {
      MlirAffineExpr e = mlirAffineMapGetResult(m, k);
      if (!mlirAffineExprIsADim(e)) continue;
      intptr_t p = mlirAffineDimExprGetPosition(e);
      int64_t s = mlirShapedTypeGetDimSize(t, k);
      if (range[p] >= 0 && range[p] != s) return false;
      range[p] = s;
    }
  }
  for (int i = 0; i < rank; ++i)
    if (range[i] < 0) return false;
  if (rank == 2 && !red[0] && !red[1] && range[0] == B && range[1] == N)
    gi->domain = D_ROW;
  else if (rank == 2 && !red[0] && red[1] && range[0] == B && range[1] == N)
    gi->domain = D_RED;
  else if (rank == 3 && !red[0] && !red[1] && red[2] && range[0] == B &&
           range[1] == 1 && range[2] == N)
    gi->domain = D_RED;
  else if (rank == 2 && !red[0] && !red[1] && range[0] == B && range[1] == 1)
    gi->domain = D_SCALAR;
  else if (rank == 1 && !red[0] && range[0] == B)
    gi->domain = D_SCALAR;
  else
    return false;
  gi->rank = rank;
  if (gi->domain == D_RED && gi->nout != 1) return false;
  for (int i = 0; i < n; ++i) {
    MlirType t = mlirValueGetType(mlirOperationGetOperand(op, i));
    MlirAffineMap m = mlirAffineMapAttrGetValue(mlirArrayAttrGetElement(maps, i));
    kind_t k = operand_kind(m, t, rank, gi->domain == D_SCALAR, B, N);
    if (k == K_NONE) return false;
    bool output = i >= gi->nin;
    if (output && gi->domain == D_ROW && k != K_ROW) return false;
    if (output && gi->domain != D_ROW && k != K_SCALAR) return false;
    gi->kind[i] = k;
  }
  return true;
}

//===--- emitting the kernel body -----------------------------------------===//

static reg_t *find_reg(group_t *g, MlirValue v) {
  for (int i = 0; i < g->nregs; ++i)
    if (mlirValueEqual(g->regs[i].v, v)) return &g->regs[i];
  return NULL;
}

static bool member(group_t *g, MlirOperation op) {
  for (int i = 0; i < g->nops; ++i)
    if (mlirOperationEqual(g->ops[i], op)) return true;
  return false;
}

// The kernel name of a scalar arith.constant captured from outside (emitted
// once, at the top of the thread body); NULL when `v` is anything else.
static const char *constant(group_t *g, MlirValue v) {
  for (int i = 0; i < g->ncst; ++i)
    if (mlirValueEqual(g->cst[i], v)) return g->cst_name[i];
  MlirOperation d = def_of(v);
  MlirType t = mlirValueGetType(v);
  if (!is(d, "arith.constant") || g->ncst == MAX_VALUES ||
      !(mlirTypeIsAFloat(t) || mlirTypeIsAInteger(t)))
    return NULL;
  char *name = g->cst_name[g->ncst];
  snprintf(name, NAME, "%%cap%d", g->next++);
  g->cst[g->ncst++] = v;
  kiln_sbuf_printf(&g->pre, "        %s = arith.constant ", name);
  mlirAttributePrint(attr(d, "value"), sbuf_cb, &g->pre);
  kiln_sbuf_puts(&g->pre, "\n");
  return name;
}

// Loads this lane's K/4 vectors of an input row (or of a [N] vector): the
// whole of it, or the chunk of the current pass.
static const char *load_input(group_t *g, input_t *in) {
  if (in->name[0]) return in->name;
  int idx = (int)(in - g->in);
  char prev[NAME];
  fresh(g, prev);
  // A row of a whole block loads its inputs at the kernel's start, so that
  // all of them are in flight before the first reduction's barriers (on
  // the H100, layer norm of f32[16384,4096] with weight and bias: 0.243
  // and 0.238 ms loaded where needed, 0.231 and 0.226 at the start).
  kiln_sbuf_t *b = !g->chunked && g->L > 32 ? &g->pre : &g->body;
  kiln_sbuf_printf(b, "        %s = arith.constant dense<0.0> : vector<%lldxf32>\n",
                   prev, (long long)g->K);
  for (int64_t j = 0; j < g->K / 4; ++j) {
    char l[NAME], acc[NAME];
    fresh(g, l);
    fresh(g, acc);
    kiln_sbuf_printf(b, "        %s = vector.transfer_read %%a%d[", l, idx);
    if (in->kind == K_ROW) kiln_sbuf_puts(b, "%row, ");
    if (g->chunked)
      kiln_sbuf_printf(b, "%%p%dc%lld], %%pad {in_bounds = [true]} : ", g->pass,
                       (long long)j);
    else
      kiln_sbuf_printf(b, "%%cc%lld], %%pad {in_bounds = [true]} : ", (long long)j);
    put_type(b, mlirValueGetType(in->v));
    kiln_sbuf_printf(b,
                     ", vector<4xf32>\n"
                     "        %s = vector.insert_strided_slice %s, %s {offsets = [%lld], "
                     "strides = [1]} : vector<4xf32> into vector<%lldxf32>\n",
                     acc, l, prev, (long long)(4 * j), (long long)g->K);
    memcpy(prev, acc, NAME);
  }
  memcpy(in->name, prev, NAME);
  return in->name;
}

static bool emit_generic(group_t *g, MlirOperation op, const ginfo_t *gi);

// Streamed rows: a row value in the current pass, its member emitted here
// the first time the pass needs it.
static bool demand(group_t *g, reg_t *r) {
  if (r->name[0]) return true;
  ginfo_t gi;
  if (!g->in_pass || mlirOperationIsNull(r->def) || !classify(r->def, g->B, g->N, &gi) ||
      !emit_generic(g, r->def, &gi))
    return false;
  return r->name[0] != 0;
}

// The kernel value of a generic's tensor operand: a member's register, an
// input (loaded), or a constant fill. Records new inputs.
static bool operand_reg(group_t *g, MlirValue v, kind_t kind, char *out) {
  MlirValue base = look_through(v, g->B, g->N);
  if (kind == K_ROW && !mlirValueIsNull(g->subst_v) && mlirValueEqual(base, g->subst_v)) {
    memcpy(out, g->subst_name, NAME);
    return true;
  }
  reg_t *r = find_reg(g, base);
  if (r) {
    if (r->kind != kind || !demand(g, r)) return false;
    memcpy(out, r->name, NAME);
    return true;
  }
  MlirOperation d = def_of(base);
  if (is(d, "linalg.fill") && kind == K_SCALAR) {
    const char *c = constant(g, mlirOperationGetOperand(d, 0));
    if (!c || !mlirTypeIsAF32(mlirValueGetType(mlirOperationGetOperand(d, 0))))
      return false;
    snprintf(out, NAME, "%s", c);
    return true;
  }
  // An input: a slice [iv, 0] [B, N] of a whole tensor in the forall, or a
  // whole tensor ([M,N] rows, [N] along the row) from outside the group.
  if (g->forall.ptr && is(d, "tensor.extract_slice") &&
      mlirOperationEqual(mlirOperationGetParentOperation(d), g->forall)) {
    if (kind != K_ROW || mlirOperationGetNumOperands(d) != 2 ||
        !mlirValueEqual(mlirOperationGetOperand(d, 1), g->iv) ||
        i64_at(attr(d, "static_offsets"), 1, -1) != 0 ||
        i64_at(attr(d, "static_sizes"), 0, -1) != g->B ||
        i64_at(attr(d, "static_sizes"), 1, -1) != g->N ||
        i64_at(attr(d, "static_strides"), 0, -1) != 1 ||
        i64_at(attr(d, "static_strides"), 1, -1) != 1)
      return false;
    base = mlirOperationGetOperand(d, 0);
    if (mlirValueIsABlockArgument(base) &&
        mlirBlockEqual(mlirBlockArgumentGetOwner(base),
                       mlirRegionGetFirstBlock(mlirOperationGetRegion(g->forall, 0))))
      return false;  // a shared output
    if (!(forms(mlirValueGetType(base), g->M, g->N) & F_ROW) ||
        mlirShapedTypeGetRank(mlirValueGetType(base)) != 2)
      return false;
  } else {
    if (g->forall.ptr) {
      // Defined inside the forall by anything else: not ours.
      MlirOperation scope = d.ptr ? mlirOperationGetParentOperation(d)
                                  : mlirBlockGetParentOperation(mlirBlockArgumentGetOwner(base));
      for (MlirOperation p = scope; !mlirOperationIsNull(p);
           p = mlirOperationGetParentOperation(p))
        if (mlirOperationEqual(p, g->forall)) return false;
    }
    MlirType t = mlirValueGetType(base);
    intptr_t rank = mlirTypeIsARankedTensor(t) ? mlirShapedTypeGetRank(t) : -1;
    int f = forms(t, g->M, g->N);
    if (kind == K_ROW && !((f & F_ROW) && rank == 2 && g->B == g->M)) return false;
    if (kind == K_COL && !(f & F_COL)) return false;
    if (kind == K_SCALAR) return false;  // scalar inputs: not yet
  }
  input_t *in = NULL;
  for (int i = 0; i < g->nin; ++i)
    if (mlirValueEqual(g->in[i].v, base)) in = &g->in[i];
  if (!in) {
    if (g->nin == MAX_INPUTS) return false;
    in = &g->in[g->nin++];
    in->v = base;
    in->kind = kind;
    in->name[0] = 0;
  }
  if (in->kind != kind) return false;
  memcpy(out, load_input(g, in), NAME);
  return true;
}

static bval_t *find_bv(group_t *g, MlirValue v) {
  for (int i = g->nbv - 1; i >= 0; --i)
    if (mlirValueEqual(g->bv[i].v, v)) return &g->bv[i];
  return NULL;
}

static bval_t *add_bv(group_t *g, MlirValue v, bool varying, const char *name) {
  if (g->nbv == MAX_VALUES * 2) return NULL;
  bval_t *b = &g->bv[g->nbv++];
  b->v = v;
  b->varying = varying;
  snprintf(b->name, NAME, "%s", name);
  return b;
}

static void put_vtype(group_t *g, MlirType t, bool varying) {
  if (varying) kiln_sbuf_printf(&g->body, "vector<%lldx", (long long)g->K);
  put_type(&g->body, t);
  if (varying) kiln_sbuf_puts(&g->body, ">");
}

// A body operand as a kernel value, broadcast to a vector when `varying`.
static bool body_operand(group_t *g, MlirValue v, bool varying, char *out) {
  bval_t *b = find_bv(g, v);
  const char *name = b ? b->name : constant(g, v);
  if (!name) return false;
  if (!varying || (b && b->varying)) {
    snprintf(out, NAME, "%s", name);
    return true;
  }
  fresh(g, out);
  kiln_sbuf_printf(&g->body, "        %s = vector.broadcast %s : ", out, name);
  put_type(&g->body, mlirValueGetType(v));
  kiln_sbuf_puts(&g->body, " to ");
  put_vtype(g, mlirValueGetType(v), true);
  kiln_sbuf_puts(&g->body, "\n");
  return true;
}

// Math ops known to lower on vectors in the NVVM pipeline; any other op of
// the math dialect is kept to row scalars.
static bool vector_math_ok(MlirOperation op) {
  static const char *const ok[] = {"math.floor", "math.ceil", "math.absf",
                                   "math.sqrt", "math.rsqrt", "math.fma",
                                   "math.trunc", "math.round", "math.copysign"};
  for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); ++i)
    if (is(op, ok[i])) return true;
  return false;
}

// Re-emits one scalar body op on the kernel's values, in generic form with
// its attributes (inherent ones parse back into properties).
static bool emit_body_op(group_t *g, MlirOperation op) {
  if (mlirOperationGetNumRegions(op) != 0 || mlirOperationGetNumResults(op) != 1)
    return false;
  MlirValue res = mlirOperationGetResult(op, 0);
  MlirType rt = mlirValueGetType(res);
  if (!(mlirTypeIsAFloat(rt) || mlirTypeIsAInteger(rt))) return false;
  if (is(op, "arith.constant")) {
    char name[NAME];
    fresh(g, name);
    kiln_sbuf_printf(&g->pre, "        %s = arith.constant ", name);
    mlirAttributePrint(attr(op, "value"), sbuf_cb, &g->pre);
    kiln_sbuf_puts(&g->pre, "\n");
    return add_bv(g, res, false, name) != NULL;
  }
  if (!prefixed(op, "arith.") && !prefixed(op, "math.")) return false;
  intptr_t n = mlirOperationGetNumOperands(op);
  if (n > 4) return false;
  bool varying = false;
  for (intptr_t i = 0; i < n; ++i) {
    MlirValue v = mlirOperationGetOperand(op, i);
    MlirType t = mlirValueGetType(v);
    if (!(mlirTypeIsAFloat(t) || mlirTypeIsAInteger(t))) return false;
    bval_t *b = find_bv(g, v);
    if (b && b->varying) varying = true;
  }
  if (varying && prefixed(op, "math.") && !vector_math_ok(op)) return false;
  // Streamed rows: a row divided by a row scalar (softmax's sum) becomes
  // one reciprocal and a multiply per element. The division is some ten
  // instructions an element, and streamed softmax already recomputes the
  // exponential for its output, so the kernel would issue as long as it
  // reads; the multiply is within 1.5 ulp of the quotient.
  if (g->chunked && varying && is(op, "arith.divf") && mlirTypeIsAF32(rt)) {
    MlirValue den = mlirOperationGetOperand(op, 1);
    bval_t *d = find_bv(g, den);
    const char *dn = d ? (d->varying ? NULL : d->name) : constant(g, den);
    if (dn) {
      char x[NAME], one[NAME], r[NAME], rb[NAME], name[NAME];
      if (!body_operand(g, mlirOperationGetOperand(op, 0), true, x)) return false;
      fresh(g, one);
      fresh(g, r);
      fresh(g, rb);
      fresh(g, name);
      kiln_sbuf_printf(&g->pre, "        %s = arith.constant 1.0 : f32\n", one);
      kiln_sbuf_printf(&g->body,
                       "        %s = arith.divf %s, %s : f32\n"
                       "        %s = vector.broadcast %s : f32 to vector<%lldxf32>\n"
                       "        %s = arith.mulf %s, %s : vector<%lldxf32>\n",
                       r, one, dn, rb, r, (long long)g->K, name, x, rb, (long long)g->K);
      return add_bv(g, res, true, name) != NULL;
    }
  }
  char ops[4][NAME];
  for (intptr_t i = 0; i < n; ++i)
    if (!body_operand(g, mlirOperationGetOperand(op, i), varying, ops[i])) return false;
  char name[NAME];
  fresh(g, name);
  MlirStringRef opname = mlirIdentifierStr(mlirOperationGetName(op));
  kiln_sbuf_printf(&g->body, "        %s = \"%.*s\"(", name, (int)opname.length,
                   opname.data);
  for (intptr_t i = 0; i < n; ++i)
    kiln_sbuf_printf(&g->body, "%s%s", i ? ", " : "", ops[i]);
  kiln_sbuf_puts(&g->body, ")");
  intptr_t na = mlirOperationGetNumAttributes(op);
  for (intptr_t i = 0; i < na; ++i) {
    MlirNamedAttribute a = mlirOperationGetAttribute(op, i);
    MlirStringRef an = mlirIdentifierStr(a.name);
    kiln_sbuf_printf(&g->body, "%s%.*s = ", i ? ", " : " {", (int)an.length, an.data);
    mlirAttributePrint(a.attribute, sbuf_cb, &g->body);
  }
  kiln_sbuf_puts(&g->body, na ? "} : (" : " : (");
  for (intptr_t i = 0; i < n; ++i) {
    if (i) kiln_sbuf_puts(&g->body, ", ");
    put_vtype(g, mlirValueGetType(mlirOperationGetOperand(op, i)), varying);
  }
  kiln_sbuf_puts(&g->body, ") -> ");
  put_vtype(g, rt, varying);
  kiln_sbuf_puts(&g->body, "\n");
  return add_bv(g, res, varying, name) != NULL;
}

// The vector.reduction kind of a combiner op, or NULL.
static const char *reduction_kind(MlirOperation op) {
  static const char *const map[][2] = {
      {"arith.addf", "add"},           {"arith.mulf", "mul"},
      {"arith.maximumf", "maximumf"},  {"arith.minimumf", "minimumf"},
      {"arith.maxnumf", "maxnumf"},    {"arith.minnumf", "minnumf"}};
  for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); ++i)
    if (is(op, map[i][0])) return map[i][1];
  return NULL;
}

// The identity of a combiner, as a vector<K> constant's value.
static const char *neutral(const char *kind) {
  if (!strcmp(kind, "add")) return "0.0";
  if (!strcmp(kind, "mul")) return "1.0";
  if (!strcmp(kind, "maximumf")) return "0xFF800000";  // -inf
  if (!strcmp(kind, "minimumf")) return "0x7F800000";  // +inf
  return "0x7FC00000";  // maxnumf, minnumf: a NaN is dropped
}

// Streamed rows: opens the loop over the chunks, `iter` its iter_args and
// `types` their types; defines the chunk's columns %p<pass>c<j>.
static void begin_pass(group_t *g, const char *result, const char *iter, const char *types) {
  int p = g->pass;
  kiln_sbuf_printf(&g->body,
                   "        %s = scf.for %%i%d = %%z to %%cC step %%c1 iter_args(%s) -> (%s) {\n",
                   result, p, iter, types);
  if (p % 2)
    kiln_sbuf_printf(&g->body, "        %%k%d = arith.subi %%cCm1, %%i%d : index\n", p, p);
  else
    kiln_sbuf_printf(&g->body, "        %%k%d = arith.addi %%i%d, %%z : index\n", p, p);
  kiln_sbuf_printf(&g->body, "        %%b%d = arith.muli %%k%d, %%cS : index\n", p, p);
  for (int64_t j = 0; j < g->Vc; ++j)
    kiln_sbuf_printf(&g->body, "        %%p%dc%lld = arith.addi %%b%d, %%cc%lld : index\n", p,
                     (long long)j, p, (long long)j);
  g->in_pass = true;
  for (int i = 0; i < g->nregs; ++i)
    if (g->regs[i].kind == K_ROW) g->regs[i].name[0] = 0;
  for (int i = 0; i < g->nin; ++i) g->in[i].name[0] = 0;
}

static void end_pass(group_t *g) {
  kiln_sbuf_puts(&g->body, "        }\n");
  g->in_pass = false;
  for (int i = 0; i < g->nregs; ++i)
    if (g->regs[i].kind == K_ROW) g->regs[i].name[0] = 0;
  for (int i = 0; i < g->nin; ++i) g->in[i].name[0] = 0;
  g->pass++;
}

// Streamed rows: a member over the rows outside a pass is only recorded,
// and emitted in the passes that need its values.
static bool defer_row(group_t *g, MlirOperation op, const ginfo_t *gi) {
  for (int i = 0; i < gi->nout; ++i) {
    MlirValue v = mlirOperationGetResult(op, i);
    if (find_reg(g, v)) return false;
    if (g->nregs == MAX_VALUES) return false;
    reg_t *r = &g->regs[g->nregs++];
    r->v = v;
    r->kind = K_ROW;
    r->name[0] = 0;
    r->def = op;
  }
  return true;
}

// A reduction member's combiner, its accumulator argument and the value
// it combines per element; false when the body is not of that form.
static bool red_parts(MlirOperation op, const ginfo_t *gi, MlirOperation *comb,
                      MlirValue *acc, MlirValue *elem) {
  MlirBlock body = mlirRegionGetFirstBlock(mlirOperationGetRegion(op, 0));
  if (mlirBlockIsNull(body) || mlirBlockGetNumArguments(body) != gi->nin + gi->nout)
    return false;
  MlirOperation yield = mlirBlockGetTerminator(body);
  if (!is(yield, "linalg.yield") || mlirOperationGetNumOperands(yield) != 1) return false;
  MlirValue y = mlirOperationGetOperand(yield, 0);
  *acc = mlirBlockGetArgument(body, gi->nin);
  *comb = def_of(y);
  if (mlirOperationIsNull(*comb) || !reduction_kind(*comb) ||
      !mlirBlockEqual(mlirOperationGetBlock(*comb), body) ||
      !mlirTypeIsAF32(mlirValueGetType(y)))
    return false;
  MlirValue a = mlirOperationGetOperand(*comb, 0), b = mlirOperationGetOperand(*comb, 1);
  if (!(mlirValueEqual(a, *acc) ^ mlirValueEqual(b, *acc))) return false;
  MlirOpOperand u = mlirValueGetFirstUse(*acc);
  if (mlirOpOperandIsNull(u) || !mlirOpOperandIsNull(mlirOpOperandGetNextUse(u)))
    return false;
  *elem = mlirValueEqual(a, *acc) ? b : a;
  return true;
}

// Binds the block arguments of `op`'s body to its inputs' registers.
static bool bind_inputs(group_t *g, MlirOperation op, const ginfo_t *gi, MlirBlock body) {
  for (int i = 0; i < gi->nin; ++i) {
    char name[NAME];
    if (!operand_reg(g, mlirOperationGetOperand(op, i), gi->kind[i], name)) return false;
    if (!add_bv(g, mlirBlockGetArgument(body, i), gi->kind[i] != K_SCALAR, name))
      return false;
  }
  return true;
}

// Emits a reduction member's inputs and body but its combiner; `out` names
// the element value (varying). Body values are the caller's to scope.
static bool emit_elem(group_t *g, MlirOperation op, const ginfo_t *gi, MlirOperation comb,
                      MlirValue elem, char *out) {
  MlirBlock body = mlirRegionGetFirstBlock(mlirOperationGetRegion(op, 0));
  MlirOperation yield = mlirBlockGetTerminator(body);
  if (!bind_inputs(g, op, gi, body)) return false;
  for (MlirOperation b = mlirBlockGetFirstOperation(body);
       !mlirOperationEqual(b, yield); b = mlirOperationGetNextInBlock(b)) {
    if (mlirOperationEqual(b, comb)) continue;
    if (!emit_body_op(g, b)) return false;
  }
  bval_t *bv = find_bv(g, elem);
  if (!bv || !bv->varying) return false;  // a reduction of a row constant
  memcpy(out, bv->name, NAME);
  return true;
}

// The butterfly: after log2(L) steps of `op` every lane of the row holds
// the combination of all of them. A row of a whole block (L > 32) is
// combined by a gpu.all_reduce over the block instead, which
// convert-gpu-to-nvvm lowers to a butterfly per warp and the warps'
// partials through shared memory. gpu.all_reduce declares no memory
// effects, which bufferization's deallocation rejects, so the kernel
// carries a pure stand-in until then: a gpu.shuffle tagged
// kiln.block_reduce = "<kind>" (kiln_kernels_rows_gpu_finish).
static void butterfly(group_t *g, const char *cur, const char *op, char *out) {
  if (g->L > 32) {
    char r[NAME], ok[NAME];
    fresh(g, r);
    fresh(g, ok);
    const char *kind = strncmp(op, "arith.", 6) == 0 ? op + 6 : op;
    kiln_sbuf_printf(&g->body,
                     "        %s, %s = gpu.shuffle idx %s, %%zi32, %%width "
                     "{kiln.block_reduce = \"%s\"} : f32\n",
                     r, ok, cur,
                     !strcmp(kind, "addf") ? "add" : !strcmp(kind, "mulf") ? "mul" : kind);
    memcpy(out, r, NAME);
    return;
  }
  char c[NAME];
  memcpy(c, cur, NAME);
  for (int64_t off = g->L / 2; off >= 1; off /= 2) {
    char s[NAME], ok[NAME], nx[NAME];
    fresh(g, s);
    fresh(g, ok);
    fresh(g, nx);
    kiln_sbuf_printf(&g->body,
                     "        %s, %s = gpu.shuffle xor %s, %%sh%lld, %%width : f32\n"
                     "        %s = %s %s, %s : f32\n",
                     s, ok, c, (long long)off, nx, op, c, s);
    memcpy(c, nx, NAME);
  }
  memcpy(out, c, NAME);
}

static reg_t *add_scalar_reg(group_t *g, MlirValue v) {
  if (g->nregs == MAX_VALUES) return NULL;
  reg_t *r = &g->regs[g->nregs++];
  r->v = v;
  r->kind = K_SCALAR;
  r->name[0] = 0;
  r->def.ptr = NULL;
  return r;
}

static void clear_rows(group_t *g) {
  for (int i = 0; i < g->nregs; ++i)
    if (g->regs[i].kind == K_ROW) g->regs[i].name[0] = 0;
  for (int i = 0; i < g->nin; ++i) g->in[i].name[0] = 0;
}

//===--- one-pass forms of streamed reductions ----------------------------===//
//
// Streamed, each reduction is a pass over the row, and the row misses L2 on
// every pass after the first at large M. Two pairs of reductions over one
// row value x are computed by one pass instead:
//  - m = max(x) then s = sum(e(x, m)) with e(x, m) = exp(x - m) (softmax,
//    log_softmax): an online max and sum. Each lane keeps a running max
//    and a sum scaled to it, multiplied by e(m_old, m_new) as the max grows;
//    after the max's butterfly each lane's sum is scaled to the row's max
//    the same way, then summed by the butterfly.
//  - sum(x) then q = sum(f(x, m)) with f(x, m) = (x - m)^2 for a scalar m
//    known by then (layer norm's variance): the pass of the sum keeps each
//    lane's mean and M2 (chunks merged by Chan's formula, lanes by the
//    butterfly), and q = M2 + N (mean - m)^2, exact for any m.
// e and f are whatever the members compute (kiln's exp is a polynomial of
// arith ops): their bodies, reached only from x, m and constants, are
// evaluated here in f32 on sample points and must agree with exp(x - m)
// (and give 0 at x = -inf) or (x - m)^2 there. The kernel evaluates the
// members' own bodies for the rescaling factors too.

typedef union {
  float f;
  int32_t i;
} word_t;

typedef struct {
  group_t *g;
  MlirValue x, m;  // the row value and the scalar (null: the first met)
  float xv, mv;
  MlirValue memo_v[64];
  word_t memo[64];
  int nmemo;
  bool bad;
} interp_t;

static word_t interp_value(interp_t *it, MlirValue v, int depth);

static bool word_type(MlirType t) {
  return mlirTypeIsAF32(t) || (mlirTypeIsAInteger(t) && (mlirIntegerTypeGetWidth(t) == 32 ||
                                                         mlirIntegerTypeGetWidth(t) == 1));
}

// A generic's input operand of `kind`: x, m, a constant fill or a row
// member (its inputs evaluated too, so that nothing else reaches it).
static word_t interp_operand(interp_t *it, MlirValue operand, kind_t kind, int depth) {
  word_t r = {.i = 0};
  group_t *g = it->g;
  MlirValue base = look_through(operand, g->B, g->N);
  MlirOperation d = def_of(base);
  ginfo_t gi;
  if (kind == K_ROW && mlirValueEqual(base, it->x)) {
    r.f = it->xv;
  } else if (kind == K_SCALAR && !mlirValueIsNull(it->m) && mlirValueEqual(base, it->m)) {
    r.f = it->mv;
  } else if (kind == K_SCALAR && is(d, "linalg.fill") &&
             mlirTypeIsAF32(mlirValueGetType(mlirOperationGetOperand(d, 0)))) {
    r = interp_value(it, mlirOperationGetOperand(d, 0), depth + 1);
  } else if (kind == K_ROW && member(g, d) && classify(d, g->B, g->N, &gi) &&
             gi.domain == D_ROW) {
    for (int i = 0; i < gi.nin; ++i) interp_operand(it, mlirOperationGetOperand(d, i), gi.kind[i], depth + 1);
    MlirBlock body = mlirRegionGetFirstBlock(mlirOperationGetRegion(d, 0));
    MlirOperation yield = mlirBlockGetTerminator(body);
    for (int i = 0; i < gi.nout; ++i)
      if (mlirValueEqual(mlirOperationGetResult(d, i), base))
        r = interp_value(it, mlirOperationGetOperand(yield, i), depth + 1);
  } else if (kind == K_SCALAR && mlirValueIsNull(it->m) && member(g, d)) {
    it->m = base;  // a member's result: named by the time it is needed
    r.f = it->mv;
  } else {
    it->bad = true;
  }
  return r;
}

static word_t interp_op(interp_t *it, MlirOperation op, int depth) {
  word_t r = {.i = 0}, a[3] = {{.i = 0}, {.i = 0}, {.i = 0}};
  intptr_t n = mlirOperationGetNumOperands(op);
  if (n > 3 || mlirOperationGetNumResults(op) != 1 ||
      !word_type(mlirValueGetType(mlirOperationGetResult(op, 0)))) {
    it->bad = true;
    return r;
  }
  for (intptr_t i = 0; i < n; ++i) {
    if (!word_type(mlirValueGetType(mlirOperationGetOperand(op, i)))) it->bad = true;
    a[i] = interp_value(it, mlirOperationGetOperand(op, i), depth + 1);
  }
  if (it->bad) return r;
  float x = a[0].f, y = a[1].f;
  if (is(op, "arith.addf")) r.f = x + y;
  else if (is(op, "arith.subf")) r.f = x - y;
  else if (is(op, "arith.mulf")) r.f = x * y;
  else if (is(op, "arith.divf")) r.f = x / y;
  else if (is(op, "arith.negf")) r.f = -x;
  else if (is(op, "arith.minimumf")) r.f = x != x || y != y ? NAN : (x < y ? x : y);
  else if (is(op, "arith.maximumf")) r.f = x != x || y != y ? NAN : (x > y ? x : y);
  else if (is(op, "math.floor")) r.f = floorf(x);
  else if (is(op, "math.absf")) r.f = fabsf(x);
  else if (is(op, "math.exp")) r.f = expf(x);
  else if (is(op, "math.fma")) r.f = fmaf(x, y, a[2].f);
  else if (is(op, "arith.addi")) r.i = (int32_t)((uint32_t)a[0].i + (uint32_t)a[1].i);
  else if (is(op, "arith.subi")) r.i = (int32_t)((uint32_t)a[0].i - (uint32_t)a[1].i);
  else if (is(op, "arith.bitcast")) r = a[0];
  else if (is(op, "arith.select")) r = a[0].i ? a[1] : a[2];
  else if (is(op, "arith.sitofp")) r.f = (float)a[0].i;
  else if (is(op, "arith.shli") && a[1].i >= 0 && a[1].i < 32)
    r.i = (int32_t)((uint32_t)a[0].i << a[1].i);
  else if (is(op, "arith.fptosi") && x > -2.0e9f && x < 2.0e9f)
    r.i = (int32_t)x;
  else if (is(op, "arith.cmpf")) {
    MlirAttribute p = attr(op, "predicate");
    int64_t k = !mlirAttributeIsNull(p) && mlirAttributeIsAInteger(p)
                    ? mlirIntegerAttrGetValueInt(p) : -1;
    bool un = x != x || y != y;
    switch (k) {  // arith::CmpFPredicate
      case 1: r.i = !un && x == y; break;  // oeq
      case 2: r.i = !un && x > y; break;   // ogt
      case 3: r.i = !un && x >= y; break;  // oge
      case 4: r.i = !un && x < y; break;   // olt
      case 5: r.i = !un && x <= y; break;  // ole
      case 9: r.i = un || x > y; break;    // ugt
      case 11: r.i = un || x < y; break;   // ult
      default: it->bad = true;
    }
  } else {
    it->bad = true;
  }
  return r;
}

static word_t interp_value(interp_t *it, MlirValue v, int depth) {
  word_t r = {.i = 0};
  if (it->bad || depth > 200) {
    it->bad = true;
    return r;
  }
  for (int i = 0; i < it->nmemo; ++i)
    if (mlirValueEqual(it->memo_v[i], v)) return it->memo[i];
  if (mlirValueIsABlockArgument(v)) {
    MlirOperation gen = mlirBlockGetParentOperation(mlirBlockArgumentGetOwner(v));
    intptr_t i = mlirBlockArgumentGetArgNumber(v);
    ginfo_t gi;
    if (member(it->g, gen) && classify(gen, it->g->B, it->g->N, &gi) && i < gi.nin)
      r = interp_operand(it, mlirOperationGetOperand(gen, i), gi.kind[i], depth + 1);
    else
      it->bad = true;
  } else {
    MlirOperation op = mlirOpResultGetOwner(v);
    MlirAttribute c = is(op, "arith.constant") ? attr(op, "value") : (MlirAttribute){NULL};
    if (!mlirAttributeIsNull(c) && mlirAttributeIsAFloat(c) && mlirTypeIsAF32(mlirValueGetType(v)))
      r.f = (float)mlirFloatAttrGetValueDouble(c);
    else if (!mlirAttributeIsNull(c) && mlirAttributeIsAInteger(c) &&
             word_type(mlirValueGetType(v)))
      r.i = (int32_t)mlirIntegerAttrGetValueInt(c);
    else if (member(it->g, mlirOperationGetParentOperation(op)))
      r = interp_op(it, op, depth + 1);
    else
      it->bad = true;
  }
  if (!it->bad && it->nmemo < 64) {
    it->memo_v[it->nmemo] = v;
    it->memo[it->nmemo++] = r;
  }
  return r;
}

enum { WANT_EXP, WANT_SQUARE };

// Whether the element `elem` of the reduction member `red` is exp(x - m)
// (WANT_EXP) or (x - m)^2 (WANT_SQUARE) of the row value x and the scalar
// *m (null: any one member's scalar result, returned in *m).
static bool elem_is(group_t *g, MlirOperation red, const ginfo_t *gi, MlirValue elem,
                    MlirValue x, MlirValue *m, int want) {
  static const float exp_m[] = {0.0f, 3.5f, -40.25f, 100.0f};
  static const float exp_d[] = {0.0f, -0.001f, -0.3f, -1.0f, -2.5f, -7.125f, -15.75f,
                                -30.0f, -60.5f, -86.0f, -100.0f, -INFINITY};
  static const float sq_m[] = {100.0f, 0.25f, -2.5f};
  static const float sq_x[] = {100.5f, -3.25f, 0.1f, 7.0f, 1000.0f, 99.0f};
  interp_t it = {.g = g, .x = x, .m = *m};
  int nm = want == WANT_EXP ? 4 : 3, nx = want == WANT_EXP ? 12 : 6;
  for (int i = 0; i < nm; ++i)
    for (int j = 0; j < nx; ++j) {
      it.mv = want == WANT_EXP ? exp_m[i] : sq_m[i];
      it.xv = want == WANT_EXP ? exp_m[i] + exp_d[j] : sq_x[j];
      it.nmemo = 0;
      for (int k = 0; k < gi->nin; ++k)
        interp_operand(&it, mlirOperationGetOperand(red, k), gi->kind[k], 0);
      float f = interp_value(&it, elem, 0).f;
      if (it.bad) return false;
      double d = (double)(float)(it.xv - it.mv);
      if (want == WANT_EXP && isinf(it.xv)) {
        if (f != 0.0f) return false;
      } else {
        double ref = want == WANT_EXP ? exp(d) : d * d;
        if (!(fabs((double)f - ref) <= 1e-6 * ref + 1e-37)) return false;
      }
    }
  *m = it.m;
  return !mlirValueIsNull(it.m);
}

// A reduction of one row value with no other computation, x being that
// value; false for others.
static bool plain_reduction(group_t *g, MlirOperation op, const ginfo_t *gi, MlirValue elem,
                            MlirValue *x) {
  MlirBlock body = mlirRegionGetFirstBlock(mlirOperationGetRegion(op, 0));
  if (gi->nin != 1 || gi->kind[0] != K_ROW || !mlirValueEqual(elem, mlirBlockGetArgument(body, 0)))
    return false;
  *x = look_through(mlirOperationGetOperand(op, 0), g->B, g->N);
  return true;
}

// Streamed rows: a later member summing exp(x - op) (want WANT_EXP, op
// being max(x)) or (x - m)^2 (WANT_SQUARE, op being sum(x)); null if none.
static MlirOperation partner(group_t *g, MlirOperation op, MlirValue x, int want) {
  MlirOperation none = {NULL};
  int k = 0;
  while (k < g->nops && !mlirOperationEqual(g->ops[k], op)) ++k;
  for (++k; k < g->nops; ++k) {
    ginfo_t gi;
    MlirOperation comb;
    MlirValue acc, elem, m = want == WANT_EXP ? mlirOperationGetResult(op, 0) : (MlirValue){NULL};
    if (classify(g->ops[k], g->B, g->N, &gi) && gi.domain == D_RED &&
        red_parts(g->ops[k], &gi, &comb, &acc, &elem) && is(comb, "arith.addf") &&
        elem_is(g, g->ops[k], &gi, elem, x, &m, want))
      return g->ops[k];
  }
  return none;
}

// Evaluates a reduction member's element at one point, the row value x
// taken as the f32 `xs` (other values as named now); `out` names an f32.
static bool emit_elem_at(group_t *g, MlirOperation op, const ginfo_t *gi, MlirOperation comb,
                         MlirValue elem, MlirValue x, const char *xs, char *out) {
  int64_t K = g->K;
  bool in_pass = g->in_pass;
  int base = g->nbv;
  char e[NAME];
  clear_rows(g);
  fresh(g, g->subst_name);
  kiln_sbuf_printf(&g->body, "        %s = vector.broadcast %s : f32 to vector<1xf32>\n",
                   g->subst_name, xs);
  g->subst_v = x;
  g->K = 1;
  g->in_pass = true;
  bool ok = emit_elem(g, op, gi, comb, elem, e);
  g->K = K;
  g->in_pass = in_pass;
  g->nbv = base;
  g->subst_v.ptr = NULL;
  clear_rows(g);
  if (!ok) return false;
  fresh(g, out);
  kiln_sbuf_printf(&g->body, "        %s = vector.extract %s[0] : f32 from vector<1xf32>\n",
                   out, e);
  return true;
}

// Streamed softmax: r1 = max(x) and r2 = sum(exp(x - r1)) by one pass (an
// online max and sum), r2 emitted here. `init` names r1's initial value.
static bool emit_online(group_t *g, MlirOperation r1, MlirOperation r2, MlirValue x,
                        const char *init) {
  ginfo_t gi1, gi2;
  MlirOperation comb1, comb2;
  MlirValue acc, elem1, elem2;
  char init2[NAME];
  if (!classify(r1, g->B, g->N, &gi1) || !red_parts(r1, &gi1, &comb1, &acc, &elem1) ||
      !classify(r2, g->B, g->N, &gi2) || !red_parts(r2, &gi2, &comb2, &acc, &elem2) ||
      !operand_reg(g, mlirOperationGetOperand(r2, gi2.nin), K_SCALAR, init2))
    return false;
  // The rows between them: deferred now, emitted where the pass needs them.
  int k = 0;
  while (k < g->nops && !mlirOperationEqual(g->ops[k], r1)) ++k;
  for (++k; k < g->nops && !mlirOperationEqual(g->ops[k], r2); ++k) {
    ginfo_t gi;
    if (classify(g->ops[k], g->B, g->N, &gi) && gi.domain == D_ROW &&
        !find_reg(g, mlirOperationGetResult(g->ops[k], 0)) && !defer_row(g, g->ops[k], &gi))
      return false;
  }
  reg_t *m = add_scalar_reg(g, mlirOperationGetResult(r1, 0));
  if (!m) return false;
  int mi = (int)(m - g->regs);
  char ninf[NAME], zero[NAME], lp[NAME], lm[NAME], ls[NAME], iter[4 * NAME + 16];
  fresh(g, ninf);
  fresh(g, zero);
  fresh(g, lp);
  fresh(g, lm);
  fresh(g, ls);
  kiln_sbuf_printf(&g->pre,
                   "        %s = arith.constant 0xFF800000 : f32\n"
                   "        %s = arith.constant 0.0 : f32\n",
                   ninf, zero);
  snprintf(iter, sizeof(iter), "%s = %s, %s = %s", lm, ninf, ls, zero);
  char res[NAME + 4];
  snprintf(res, sizeof(res), "%s:2", lp);
  begin_pass(g, res, iter, "f32, f32");
  // The running max with this chunk, and the reference of the chunk's
  // exponentials: the max, or 0 while it is -inf (exp(-inf - -inf) would be
  // a NaN where the reference has 0).
  char xe[NAME], cm[NAME], mn[NAME], isn[NAME], ref[NAME], ee[NAME], cs[NAME], fac[NAME],
      t[NAME], sn[NAME];
  int base = g->nbv;
  bool ok = emit_elem(g, r1, &gi1, comb1, elem1, xe);
  g->nbv = base;
  if (!ok) return false;
  fresh(g, cm);
  fresh(g, mn);
  fresh(g, isn);
  fresh(g, ref);
  kiln_sbuf_printf(&g->body,
                   "        %s = vector.reduction <maximumf>, %s : vector<%lldxf32> into f32\n"
                   "        %s = arith.maximumf %s, %s : f32\n"
                   "        %s = arith.cmpf oeq, %s, %s : f32\n"
                   "        %s = arith.select %s, %s, %s : f32\n",
                   cm, xe, (long long)g->K, mn, lm, cm, isn, mn, ninf, ref, isn, zero, mn);
  memcpy(g->regs[mi].name, ref, NAME);
  ok = emit_elem(g, r2, &gi2, comb2, elem2, ee);
  g->nbv = base;
  if (!ok) return false;
  fresh(g, cs);
  kiln_sbuf_printf(&g->body, "        %s = vector.reduction <add>, %s : vector<%lldxf32> into f32\n",
                   cs, ee, (long long)g->K);
  // The sum so far, to the new reference: times exp(m_old - ref).
  if (!emit_elem_at(g, r2, &gi2, comb2, elem2, x, lm, fac)) return false;
  fresh(g, t);
  fresh(g, sn);
  kiln_sbuf_printf(&g->body,
                   "        %s = arith.mulf %s, %s : f32\n"
                   "        %s = arith.addf %s, %s : f32\n"
                   "        scf.yield %s, %s : f32, f32\n",
                   t, ls, fac, sn, t, cs, mn, sn);
  end_pass(g);
  // The row's max, then each lane's sum to it, then their sum.
  char lmax[NAME + 4], lsum[NAME + 4], mx[NAME], sl[NAME], sum[NAME];
  snprintf(lmax, sizeof(lmax), "%s#0", lp);
  snprintf(lsum, sizeof(lsum), "%s#1", lp);
  butterfly(g, lmax, "arith.maximumf", mx);
  fresh(g, g->regs[mi].name);
  fresh(g, isn);
  fresh(g, ref);
  kiln_sbuf_printf(&g->body,
                   "        %s = arith.maximumf %s, %s : f32\n"
                   "        %s = arith.cmpf oeq, %s, %s : f32\n"
                   "        %s = arith.select %s, %s, %s : f32\n",
                   g->regs[mi].name, init, mx, isn, g->regs[mi].name, ninf, ref, isn, zero,
                   g->regs[mi].name);
  char mfinal[NAME];
  memcpy(mfinal, g->regs[mi].name, NAME);
  memcpy(g->regs[mi].name, ref, NAME);
  ok = emit_elem_at(g, r2, &gi2, comb2, elem2, x, lmax, fac);
  memcpy(g->regs[mi].name, mfinal, NAME);
  if (!ok) return false;
  fresh(g, sl);
  kiln_sbuf_printf(&g->body, "        %s = arith.mulf %s, %s : f32\n", sl, lsum, fac);
  butterfly(g, sl, "arith.addf", sum);
  reg_t *s = add_scalar_reg(g, mlirOperationGetResult(r2, 0));
  if (!s) return false;
  fresh(g, s->name);
  kiln_sbuf_printf(&g->body, "        %s = arith.addf %s, %s : f32\n", s->name, init2, sum);
  return true;
}

// Streamed layer norm: the pass of r1 = sum(x) also keeps each lane's mean
// and M2 of x, for a later sum of (x - m)^2 (emit_generic_in).
static bool emit_sum_stats(group_t *g, MlirOperation r1, MlirValue x, const char *init) {
  ginfo_t gi;
  MlirOperation comb;
  MlirValue acc, elem;
  if (!classify(r1, g->B, g->N, &gi) || !red_parts(r1, &gi, &comb, &acc, &elem)) return false;
  char zero[NAME], kf[NAME], kinv[NAME], lp[NAME], ls[NAME], lmean[NAME], lm2[NAME], ln[NAME];
  char iter[8 * NAME + 32], res[NAME + 4];
  fresh(g, zero);
  fresh(g, kf);
  fresh(g, kinv);
  fresh(g, lp);
  fresh(g, ls);
  fresh(g, lmean);
  fresh(g, lm2);
  fresh(g, ln);
  kiln_sbuf_printf(&g->pre,
                   "        %s = arith.constant 0.0 : f32\n"
                   "        %s = arith.constant %lld.0 : f32\n"
                   "        %s = arith.constant %.9e : f32\n",
                   zero, kf, (long long)g->K, kinv, 1.0 / (double)g->K);
  snprintf(iter, sizeof(iter), "%s = %s, %s = %s, %s = %s, %s = %s", ls, zero, lmean, zero, lm2,
           zero, ln, zero);
  snprintf(res, sizeof(res), "%s:4", lp);
  begin_pass(g, res, iter, "f32, f32, f32, f32");
  char xe[NAME];
  int base = g->nbv;
  bool ok = emit_elem(g, r1, &gi, comb, elem, xe);
  g->nbv = base;
  if (!ok) return false;
  // The chunk's sum, mean and M2, merged into the lane's (Chan et al.).
  char v[16][NAME];
  for (int i = 0; i < 16; ++i) fresh(g, v[i]);
  long long K = g->K;
  kiln_sbuf_printf(&g->body,
                   "        %s = vector.reduction <add>, %s : vector<%lldxf32> into f32\n"
                   "        %s = arith.mulf %s, %s : f32\n"
                   "        %s = vector.broadcast %s : f32 to vector<%lldxf32>\n"
                   "        %s = arith.subf %s, %s : vector<%lldxf32>\n"
                   "        %s = arith.mulf %s, %s : vector<%lldxf32>\n"
                   "        %s = vector.reduction <add>, %s : vector<%lldxf32> into f32\n",
                   v[0], xe, K, v[1], v[0], kinv, v[2], v[1], K, v[3], xe, v[2], K, v[4], v[3],
                   v[3], K, v[5], v[4], K);
  // n = n_a + K, w = K / n; mean += d w; M2 += q + d (d w) n_a. The
  // quotient approximate (2 ulp; no IEEE division's slow path in the
  // loop): the mean only enters q through (mean - m)^2, far below M2.
  kiln_sbuf_printf(&g->body,
                   "        %s = arith.addf %s, %s : f32\n"
                   "        %s = arith.addf %s, %s : f32\n"
                   "        %s = arith.divf %s, %s fastmath<afn> : f32\n"
                   "        %s = arith.subf %s, %s : f32\n"
                   "        %s = arith.mulf %s, %s : f32\n"
                   "        %s = arith.addf %s, %s : f32\n"
                   "        %s = arith.mulf %s, %s : f32\n"
                   "        %s = arith.mulf %s, %s : f32\n"
                   "        %s = arith.addf %s, %s : f32\n"
                   "        %s = arith.addf %s, %s : f32\n"
                   "        scf.yield %s, %s, %s, %s : f32, f32, f32, f32\n",
                   v[6], ls, v[0], v[7], ln, kf, v[8], kf, v[7], v[9], v[1], lmean, v[10], v[9],
                   v[8], v[11], lmean, v[10], v[12], v[10], ln, v[13], v[12], v[9], v[14], lm2,
                   v[5], v[15], v[14], v[13], v[6], v[11], v[15], v[7]);
  end_pass(g);
  char lsum[NAME + 4], mean[NAME + 4], m2[NAME + 4], sum[NAME];
  snprintf(lsum, sizeof(lsum), "%s#0", lp);
  snprintf(mean, sizeof(mean), "%s#1", lp);
  snprintf(m2, sizeof(m2), "%s#2", lp);
  butterfly(g, lsum, "arith.addf", sum);
  reg_t *s = add_scalar_reg(g, mlirOperationGetResult(r1, 0));
  if (!s) return false;
  fresh(g, s->name);
  kiln_sbuf_printf(&g->body, "        %s = arith.addf %s, %s : f32\n", s->name, init, sum);
  // Lanes of equal counts c: mean = (a + b) / 2, M2 = M2a + M2b + d^2 c / 2.
  char half[NAME];
  fresh(g, half);
  kiln_sbuf_printf(&g->pre, "        %s = arith.constant 0.5 : f32\n", half);
  long long c = g->C * g->K;
  for (int64_t off = g->L / 2; off >= 1; off /= 2, c *= 2) {
    char w[9][NAME];
    for (int i = 0; i < 9; ++i) fresh(g, w[i]);
    kiln_sbuf_printf(&g->pre, "        %s = arith.constant %lld.0 : f32\n", w[0], c / 2);
    kiln_sbuf_printf(&g->body,
                     "        %s, %s = gpu.shuffle xor %s, %%sh%lld, %%width : f32\n"
                     "        %s, %s = gpu.shuffle xor %s, %%sh%lld, %%width : f32\n"
                     "        %s = arith.subf %s, %s : f32\n"
                     "        %s = arith.addf %s, %s : f32\n"
                     "        %s = arith.mulf %s, %s : f32\n",
                     w[1], w[2], mean, (long long)off, w[3], w[4], m2, (long long)off, w[5],
                     mean, w[1], w[6], mean, w[1], w[7], w[6], half);
    char d2[NAME], dc[NAME], q[NAME], m2n[NAME];
    fresh(g, d2);
    fresh(g, dc);
    fresh(g, q);
    fresh(g, m2n);
    kiln_sbuf_printf(&g->body,
                     "        %s = arith.mulf %s, %s : f32\n"
                     "        %s = arith.mulf %s, %s : f32\n"
                     "        %s = arith.addf %s, %s : f32\n"
                     "        %s = arith.addf %s, %s : f32\n",
                     d2, w[5], w[5], dc, d2, w[0], q, m2, w[3], m2n, q, dc);
    memcpy(mean, w[7], NAME);
    memcpy(m2, m2n, NAME);
  }
  g->stat_x = x;
  memcpy(g->stat_mean, mean, NAME);
  memcpy(g->stat_m2, m2, NAME);
  return true;
}

static bool emit_generic_in(group_t *g, MlirOperation op, const ginfo_t *gi) {
  MlirBlock body = mlirRegionGetFirstBlock(mlirOperationGetRegion(op, 0));
  if (mlirBlockIsNull(body) || mlirBlockGetNumArguments(body) != gi->nin + gi->nout)
    return false;
  MlirOperation yield = mlirBlockGetTerminator(body);
  if (!is(yield, "linalg.yield") || mlirOperationGetNumOperands(yield) != gi->nout)
    return false;
  // A reduction: the yielded value combines the output argument with the
  // per-element value, and the output argument has no other use.
  MlirOperation comb = {NULL};
  MlirValue acc, elem;
  char init[NAME] = "";
  if (gi->domain == D_RED) {
    if (!red_parts(op, gi, &comb, &acc, &elem) ||
        !operand_reg(g, mlirOperationGetOperand(op, gi->nin), K_SCALAR, init))
      return false;
  } else {
    for (int i = 0; i < gi->nout; ++i)
      if (!mlirOpOperandIsNull(mlirValueGetFirstUse(mlirBlockGetArgument(body, gi->nin + i))))
        return false;
  }
  // Streamed rows: a reduction is a pass of its own, the vector
  // accumulator carried by the loop over the chunks, but where one pass
  // serves two reductions (see above).
  char lp[NAME] = "", lacc[NAME] = "";
  if (g->chunked && gi->domain == D_RED) {
    if (g->in_pass) return false;
    MlirValue x, m = {NULL};
    if (plain_reduction(g, op, gi, elem, &x)) {
      MlirOperation p = {NULL};
      if (is(comb, "arith.maximumf") && (p = partner(g, op, x, WANT_EXP)).ptr)
        return emit_online(g, op, p, x, init);
      if (is(comb, "arith.addf") && partner(g, op, x, WANT_SQUARE).ptr)
        return emit_sum_stats(g, op, x, init);
    }
    if (is(comb, "arith.addf") && !mlirValueIsNull(g->stat_x) &&
        elem_is(g, op, gi, elem, g->stat_x, &m, WANT_SQUARE)) {
      // sum((x - m)^2) = M2 + N (mean - m)^2.
      char mn[NAME], v[5][NAME];
      reg_t *r = add_scalar_reg(g, mlirOperationGetResult(op, 0));
      if (!r || !operand_reg(g, m, K_SCALAR, mn)) return false;
      for (int i = 0; i < 5; ++i) fresh(g, v[i]);
      fresh(g, r->name);
      kiln_sbuf_printf(&g->pre, "        %s = arith.constant %lld.0 : f32\n", v[0],
                       (long long)g->N);
      kiln_sbuf_printf(&g->body,
                       "        %s = arith.subf %s, %s : f32\n"
                       "        %s = arith.mulf %s, %s : f32\n"
                       "        %s = arith.mulf %s, %s : f32\n"
                       "        %s = arith.addf %s, %s : f32\n"
                       "        %s = arith.addf %s, %s : f32\n",
                       v[1], g->stat_mean, mn, v[2], v[1], v[1], v[3], v[2], v[0], v[4],
                       g->stat_m2, v[3], r->name, init, v[4]);
      return true;
    }
    char n0[NAME], iter[2 * NAME + 8], types[32];
    fresh(g, n0);
    fresh(g, lp);
    fresh(g, lacc);
    kiln_sbuf_printf(&g->pre, "        %s = arith.constant dense<%s> : vector<%lldxf32>\n", n0,
                     neutral(reduction_kind(comb)), (long long)g->K);
    snprintf(iter, sizeof(iter), "%s = %s", lacc, n0);
    snprintf(types, sizeof(types), "vector<%lldxf32>", (long long)g->K);
    begin_pass(g, lp, iter, types);
  }
  if (gi->domain == D_RED) {
    char ev[NAME];
    if (!emit_elem(g, op, gi, comb, elem, ev)) return false;
    MlirStringRef cn = mlirIdentifierStr(mlirOperationGetName(comb));
    char cname[40];
    snprintf(cname, sizeof(cname), "%.*s", (int)cn.length, cn.data);
    const char *whole = ev;
    if (lp[0]) {
      char nx[NAME];
      fresh(g, nx);
      kiln_sbuf_printf(&g->body,
                       "        %s = %s %s, %s : vector<%lldxf32>\n"
                       "        scf.yield %s : vector<%lldxf32>\n",
                       nx, cname, lacc, ev, (long long)g->K, nx, (long long)g->K);
      end_pass(g);
      whole = lp;
    }
    char cur[NAME];
    fresh(g, cur);
    kiln_sbuf_printf(&g->body,
                     "        %s = vector.reduction <%s>, %s : vector<%lldxf32> into f32\n",
                     cur, reduction_kind(comb), whole, (long long)g->K);
    butterfly(g, cur, cname, cur);
    reg_t *r = add_scalar_reg(g, mlirOperationGetResult(op, 0));
    if (!r) return false;
    fresh(g, r->name);
    kiln_sbuf_printf(&g->body, "        %s = %s %s, %s : f32\n", r->name, cname, init, cur);
    return true;
  }
  if (!bind_inputs(g, op, gi, body)) return false;
  for (MlirOperation b = mlirBlockGetFirstOperation(body);
       !mlirOperationEqual(b, yield); b = mlirOperationGetNextInBlock(b))
    if (!emit_body_op(g, b)) return false;
  for (int i = 0; i < gi->nout; ++i) {
    MlirValue y = mlirOperationGetOperand(yield, i);
    bool row = gi->domain == D_ROW;
    // A deferred member (streamed rows) names its registers in place.
    reg_t *r = find_reg(g, mlirOperationGetResult(op, i));
    if (!r) {
      if (g->nregs == MAX_VALUES) return false;
      r = &g->regs[g->nregs];
      r->def.ptr = NULL;
    }
    if (!body_operand(g, y, row, r->name)) return false;
    if (!row) {
      bval_t *b = find_bv(g, y);
      if (b && b->varying) return false;
    }
    if (r == &g->regs[g->nregs]) {
      r->v = mlirOperationGetResult(op, i);
      r->kind = row ? K_ROW : K_SCALAR;
      g->nregs++;
    }
  }
  return true;
}

// Emits a member over the rows on the kernel's values. Body values are
// scoped to it: a member emitted on demand inside another one's operands
// (streamed rows) leaves the outer one's values as they were.
static bool emit_generic(group_t *g, MlirOperation op, const ginfo_t *gi) {
  int base = g->nbv;
  bool ok = g->chunked && gi->domain == D_ROW && !g->in_pass ? defer_row(g, op, gi)
                                                             : emit_generic_in(g, op, gi);
  g->nbv = base;
  return ok;
}

//===--- the kernel text --------------------------------------------------===//

// KILN_GPU_BLOCK_ROWS=0 streams long rows by a warp as before block-wide
// rows (for A/B timings; part of the compile cache's key, lib/api/api.c).
static bool block_rows_enabled(void) {
  const char *v = getenv("KILN_GPU_BLOCK_ROWS");
  return !v || strcmp(v, "0") != 0;
}

// Lanes per row, vectors per lane, rows and threads per block (and the
// chunks of streamed rows, from the count of `inputs` read); false when
// the rows do not fit this scheme.
static bool choose_sizes(group_t *g, int inputs) {
  if (g->N % 4 != 0) return false;
  int64_t q = g->N / 4, L = 1;
  while (L * 2 <= 32 && q % (L * 2) == 0) L *= 2;
  g->L = L;
  g->V = q / L;
  g->K = 4 * g->V;
  g->chunked = false;
  if (g->K > ROWS_MAX_PER_LANE) {
    // Streamed by a whole warp, in chunks of Vc vectors dividing V.
    if (L != 32) return false;
    int64_t Vc = inputs > 1 ? ROWS_CHUNK_VECTORS_MULTI : ROWS_CHUNK_VECTORS;
    while (g->V % Vc != 0) --Vc;
    g->chunked = true;
    g->Vc = Vc;
    g->C = g->V / Vc;
    g->K = 4 * Vc;
  }
  if (g->chunked && block_rows_enabled()) {
    // A row per block instead, if the row splits into whole warps of lanes
    // holding at least ROWS_BLOCK_MIN_VECTORS vectors each.
    int64_t Lb = 32;
    while (Lb * 2 <= ROWS_BLOCK_MAX_LANES && q % (Lb * 2) == 0 &&
           q / (Lb * 2) >= ROWS_BLOCK_MIN_VECTORS)
      Lb *= 2;
    if (Lb > 32 && 4 * (q / Lb) <= ROWS_MAX_PER_LANE) {  // Lb divides q
      g->chunked = false;
      g->L = Lb;
      g->V = q / Lb;
      g->K = 4 * g->V;
      g->R = 1;
      g->T = Lb;
      return true;
    }
  }
  int64_t R = 1;
  while (R * 2 * L <= ROWS_MAX_THREADS && g->M % (R * 2) == 0) R *= 2;
  // Smaller blocks while there are too few of them to fill the device.
  while (R > 1 && R * L > ROWS_MIN_THREADS && g->M / R < ROWS_TARGET_BLOCKS) R /= 2;
  g->R = R;
  g->T = R * L;
  return g->T >= 32 && g->T % 32 == 0 && g->T <= ROWS_MAX_THREADS;
}

static void put_out_type(group_t *g, kiln_sbuf_t *b, int i, bool whole) {
  if (g->out_kind[i] == K_ROW) {
    if (whole) kiln_sbuf_printf(b, "tensor<%lldx%lldxf32>", (long long)g->M, (long long)g->N);
    else kiln_sbuf_printf(b, "tensor<%lldx%lldx%lldx4xf32>", (long long)g->R,
                          (long long)g->V, (long long)g->L);
  } else {
    kiln_sbuf_printf(b, "tensor<%lldx1xf32>", (long long)(whole ? g->M : g->R));
  }
}

// Streamed rows: the last pass, a loop over the chunks writing each row
// output into this lane's slice of it (carried by the loop); out_reg then
// names the loop's result.
static bool emit_writes(group_t *g) {
  long long V = g->V, Vc = g->Vc, R = g->R, L = g->L;
  kiln_sbuf_t iter, types;
  kiln_sbuf_init(&iter);
  kiln_sbuf_init(&types);
  int n = 0;
  for (int i = 0; i < g->nout; ++i) {
    if (g->out_kind[i] != K_ROW) continue;
    kiln_sbuf_printf(&g->body,
                     "        %%wi%d = tensor.extract_slice %%t%d[%%rloc, 0, %%lane, 0] "
                     "[1, %lld, 1, 4] [1, 1, 1, 1] : tensor<%lldx%lldx%lldx4xf32> to "
                     "tensor<1x%lldx1x4xf32>\n",
                     i, i, V, R, V, L, V);
    kiln_sbuf_printf(&iter, "%s%%u%d = %%wi%d", n ? ", " : "", i, i);
    kiln_sbuf_printf(&types, "%stensor<1x%lldx1x4xf32>", n ? ", " : "", V);
    snprintf(g->out_reg[i], NAME, "%%wl#%d", n++);
  }
  bool ok = !iter.oom && !types.oom;
  if (ok && n > 0) {
    char result[NAME];
    snprintf(result, NAME, "%%wl:%d", n);
    int p = g->pass;
    begin_pass(g, result, iter.data, types.data);
    kiln_sbuf_printf(&g->body, "        %%wo = arith.muli %%k%d, %%cVc : index\n", p);
    for (int i = 0; ok && i < g->nout; ++i) {
      if (g->out_kind[i] != K_ROW) continue;
      reg_t *r = &g->regs[g->out_regi[i]];
      ok = demand(g, r);
      if (!ok) break;
      kiln_sbuf_printf(&g->body,
                       "        %%ws%d = vector.shape_cast %s : vector<%lldxf32> to "
                       "vector<1x%lldx1x4xf32>\n"
                       "        %%un%d = vector.transfer_write %%ws%d, %%u%d[%%z, %%wo, %%z, %%z] "
                       "{in_bounds = [true, true, true, true]} : vector<1x%lldx1x4xf32>, "
                       "tensor<1x%lldx1x4xf32>\n",
                       i, r->name, (long long)g->K, Vc, i, i, i, Vc, V);
    }
    kiln_sbuf_puts(&g->body, "        scf.yield ");
    for (int i = 0, k = 0; i < g->nout; ++i)
      if (g->out_kind[i] == K_ROW) kiln_sbuf_printf(&g->body, "%s%%un%d", k++ ? ", " : "", i);
    kiln_sbuf_printf(&g->body, " : %s\n", types.data);
    end_pass(g);
  }
  kiln_sbuf_free(&iter);
  kiln_sbuf_free(&types);
  return ok && !g->body.oom && !g->pre.oom;
}

// The function text: block forall over rows, thread forall, body, writes.
static char *kernel_text(group_t *g, int64_t id) {
  kiln_sbuf_t t;
  kiln_sbuf_init(&t);
  long long M = g->M, N = g->N, R = g->R, V = g->V, L = g->L, T = g->T;
  kiln_sbuf_printf(&t, "func.func private @kiln_rows(");
  for (int i = 0; i < g->nin; ++i) {
    kiln_sbuf_printf(&t, "%s%%a%d: ", i ? ", " : "", i);
    put_type(&t, mlirValueGetType(g->in[i].v));
  }
  kiln_sbuf_puts(&t, ") -> (");
  for (int i = 0; i < g->nout; ++i) {
    if (i) kiln_sbuf_puts(&t, ", ");
    put_type(&t, g->out_type[i]);
  }
  kiln_sbuf_puts(&t, ") {\n");
  for (int i = 0; i < g->nout; ++i) {
    kiln_sbuf_printf(&t, "  %%e%d = tensor.empty() : ", i);
    put_out_type(g, &t, i, true);
    kiln_sbuf_puts(&t, "\n");
  }
  // Block forall.
  kiln_sbuf_printf(&t, "  %%f:%d = scf.forall (%%bx) in (%lld) shared_outs(", g->nout, M / R);
  for (int i = 0; i < g->nout; ++i) kiln_sbuf_printf(&t, "%s%%o%d = %%e%d", i ? ", " : "", i, i);
  kiln_sbuf_puts(&t, ") -> (");
  for (int i = 0; i < g->nout; ++i) {
    if (i) kiln_sbuf_puts(&t, ", ");
    put_out_type(g, &t, i, true);
  }
  kiln_sbuf_printf(&t, ") {\n    %%cR = arith.constant %lld : index\n"
                       "    %%r0 = arith.muli %%bx, %%cR : index\n", R);
  for (int i = 0; i < g->nout; ++i) {
    if (g->out_kind[i] == K_ROW)
      kiln_sbuf_printf(&t,
                       "    %%s%d = tensor.extract_slice %%o%d[%%r0, 0] [%lld, %lld] [1, 1] : "
                       "tensor<%lldx%lldxf32> to tensor<%lldx%lldxf32>\n"
                       "    %%x%d = tensor.expand_shape %%s%d [[0], [1, 2, 3]] output_shape "
                       "[%lld, %lld, %lld, 4] : tensor<%lldx%lldxf32> into "
                       "tensor<%lldx%lldx%lldx4xf32>\n",
                       i, i, R, N, M, N, R, N, i, i, R, V, L, R, N, R, V, L);
    else
      kiln_sbuf_printf(&t,
                       "    %%x%d = tensor.extract_slice %%o%d[%%r0, 0] [%lld, 1] [1, 1] : "
                       "tensor<%lldx1xf32> to tensor<%lldx1xf32>\n",
                       i, i, R, M, R);
  }
  // Thread forall: one per lane; a row per L lanes.
  kiln_sbuf_printf(&t, "    %%g:%d = scf.forall (%%tx) in (%lld) shared_outs(", g->nout, T);
  for (int i = 0; i < g->nout; ++i) kiln_sbuf_printf(&t, "%s%%t%d = %%x%d", i ? ", " : "", i, i);
  kiln_sbuf_puts(&t, ") -> (");
  for (int i = 0; i < g->nout; ++i) {
    if (i) kiln_sbuf_puts(&t, ", ");
    put_out_type(g, &t, i, false);
  }
  kiln_sbuf_printf(&t,
                   ") {\n"
                   "        %%z = arith.constant 0 : index\n"
                   "        %%c4 = arith.constant 4 : index\n"
                   "        %%cL = arith.constant %lld : index\n"
                   "        %%pad = arith.constant 0.0 : f32\n"
                   "        %%width = arith.constant 32 : i32\n"
                   "        %%zi32 = arith.constant 0 : i32\n"
                   "        %%lane = arith.remui %%tx, %%cL : index\n"
                   "        %%rloc = arith.divui %%tx, %%cL : index\n"
                   "        %%row = arith.addi %%r0, %%rloc : index\n"
                   "        %%col0 = arith.muli %%lane, %%c4 : index\n",
                   L);
  for (long long off = 1; off < L; off *= 2)
    kiln_sbuf_printf(&t, "        %%sh%lld = arith.constant %lld : i32\n", off, off);
  if (g->chunked)
    kiln_sbuf_printf(&t,
                     "        %%c1 = arith.constant 1 : index\n"
                     "        %%cC = arith.constant %lld : index\n"
                     "        %%cCm1 = arith.constant %lld : index\n"
                     "        %%cS = arith.constant %lld : index\n"
                     "        %%cVc = arith.constant %lld : index\n",
                     (long long)g->C, (long long)g->C - 1, 4 * L * (long long)g->Vc,
                     (long long)g->Vc);
  // Lane l's vector j starts at column 4l + 4Lj: each load is one
  // coalesced access of the L lanes (j within the chunk when streamed,
  // the chunk adding 4 L Vc per step).
  for (long long j = 0; j < g->K / 4; ++j)
    kiln_sbuf_printf(&t,
                     "        %%co%lld = arith.constant %lld : index\n"
                     "        %%cc%lld = arith.addi %%col0, %%co%lld : index\n",
                     j, 4 * L * j, j, j);
  if (g->pre.data) kiln_sbuf_puts(&t, g->pre.data);
  if (g->body.data) kiln_sbuf_puts(&t, g->body.data);
  for (int i = 0; i < g->nout; ++i) {
    if (g->out_kind[i] == K_ROW && g->chunked)
      continue;  // written by the last pass (emit_writes)
    else if (g->out_kind[i] == K_ROW)
      kiln_sbuf_printf(&t,
                       "        %%w4_%d = vector.shape_cast %s : vector<%lldxf32> to "
                       "vector<1x%lldx1x4xf32>\n"
                       "        %%we%d = tensor.empty() : tensor<1x%lldx1x4xf32>\n"
                       "        %%w%d = vector.transfer_write %%w4_%d, %%we%d[%%z, %%z, %%z, %%z] "
                       "{in_bounds = [true, true, true, true]} : vector<1x%lldx1x4xf32>, "
                       "tensor<1x%lldx1x4xf32>\n",
                       i, g->out_reg[i], (long long)g->K, V, i, V, i, i, i, V, V);
    else  // every lane of the row writes the same value
      kiln_sbuf_printf(&t,
                       "        %%w4_%d = vector.broadcast %s : f32 to vector<1x1xf32>\n"
                       "        %%we%d = tensor.empty() : tensor<1x1xf32>\n"
                       "        %%w%d = vector.transfer_write %%w4_%d, %%we%d[%%z, %%z] "
                       "{in_bounds = [true, true]} : vector<1x1xf32>, tensor<1x1xf32>\n",
                       i, g->out_reg[i], i, i, i, i);
  }
  kiln_sbuf_puts(&t, "        scf.forall.in_parallel {\n");
  for (int i = 0; i < g->nout; ++i) {
    // A streamed row's lane slice is the last pass's result (out_reg).
    char w[NAME];
    if (g->out_kind[i] == K_ROW && g->chunked) snprintf(w, NAME, "%s", g->out_reg[i]);
    else snprintf(w, NAME, "%%w%d", i);
    if (g->out_kind[i] == K_ROW)
      kiln_sbuf_printf(&t,
                       "          tensor.parallel_insert_slice %s into %%t%d[%%rloc, 0, "
                       "%%lane, 0] [1, %lld, 1, 4] [1, 1, 1, 1] : tensor<1x%lldx1x4xf32> "
                       "into tensor<%lldx%lldx%lldx4xf32>\n",
                       w, i, V, V, R, V, L);
    else
      kiln_sbuf_printf(&t,
                       "          tensor.parallel_insert_slice %%w%d into %%t%d[%%rloc, 0] "
                       "[1, 1] [1, 1] : tensor<1x1xf32> into tensor<%lldx1xf32>\n",
                       i, i, R);
  }
  kiln_sbuf_puts(&t, "        }\n    } {mapping = [#gpu.thread<x>]}\n");
  for (int i = 0; i < g->nout; ++i)
    if (g->out_kind[i] == K_ROW)
      kiln_sbuf_printf(&t,
                       "    %%y%d = tensor.collapse_shape %%g#%d [[0], [1, 2, 3]] : "
                       "tensor<%lldx%lldx%lldx4xf32> into tensor<%lldx%lldxf32>\n",
                       i, i, R, V, L, R, N);
  kiln_sbuf_puts(&t, "    scf.forall.in_parallel {\n");
  for (int i = 0; i < g->nout; ++i) {
    if (g->out_kind[i] == K_ROW)
      kiln_sbuf_printf(&t,
                       "      tensor.parallel_insert_slice %%y%d into %%o%d[%%r0, 0] [%lld, %lld] "
                       "[1, 1] : tensor<%lldx%lldxf32> into tensor<%lldx%lldxf32>\n",
                       i, i, R, N, R, N, M, N);
    else
      kiln_sbuf_printf(&t,
                       "      tensor.parallel_insert_slice %%g#%d into %%o%d[%%r0, 0] [%lld, 1] "
                       "[1, 1] : tensor<%lldx1xf32> into tensor<%lldx1xf32>\n",
                       i, i, R, R, M);
  }
  kiln_sbuf_printf(&t,
                   "    }\n  } {mapping = [#gpu.block<x>], kiln.gpu_block = %lld : i64, "
                   "kiln.gpu_tx = %lld : i64, kiln.gpu_ty = 1 : i64}\n",
                   (long long)id, T);
  // Results of type [M] (a reduction's own) from the [M,1] written.
  for (int i = 0; i < g->nout; ++i)
    if (mlirShapedTypeGetRank(g->out_type[i]) == 1)
      kiln_sbuf_printf(&t, "  %%q%d = tensor.collapse_shape %%f#%d [[0, 1]] : "
                           "tensor<%lldx1xf32> into tensor<%lldxf32>\n", i, i, M, M);
  kiln_sbuf_puts(&t, "  return ");
  for (int i = 0; i < g->nout; ++i)
    kiln_sbuf_printf(&t, "%s%%%s%d", i ? ", " : "",
                     mlirShapedTypeGetRank(g->out_type[i]) == 1 ? "q" : "f#", i);
  kiln_sbuf_puts(&t, " : ");
  for (int i = 0; i < g->nout; ++i) {
    if (i) kiln_sbuf_puts(&t, ", ");
    put_type(&t, g->out_type[i]);
  }
  kiln_sbuf_puts(&t, "\n}\n");
  return kiln_sbuf_take(&t);
}

//===--- finding groups and replacing them --------------------------------===//

// The op before `op` in its block, or null (the C API has no such call).
static MlirOperation prev_in_block(MlirOperation op) {
  MlirOperation prev = {NULL};
  for (MlirOperation o = mlirBlockGetFirstOperation(mlirOperationGetBlock(op));
       !mlirOperationIsNull(o) && !mlirOperationEqual(o, op); o = mlirOperationGetNextInBlock(o))
    prev = o;
  return prev;
}

// The ancestor of `op` in `block`, or null.
static MlirOperation ancestor_in(MlirOperation op, MlirBlock block) {
  while (!mlirOperationIsNull(op) && !mlirBlockEqual(mlirOperationGetBlock(op), block))
    op = mlirOperationGetParentOperation(op);
  return op;
}

typedef struct {
  MlirOperation ops[64];
  int n;
} oplist_t;

// Whether a member's result `v` is used outside the group (through
// reshapes); the reshapes on the way are collected in `views`.
static bool used_outside(group_t *g, MlirValue v, oplist_t *views, int depth) {
  bool outside = false;
  for (MlirOpOperand u = mlirValueGetFirstUse(v); !mlirOpOperandIsNull(u);
       u = mlirOpOperandGetNextUse(u)) {
    MlirOperation user = mlirOpOperandGetOwner(u);
    if (member(g, user)) continue;
    if ((is(user, "tensor.expand_shape") || is(user, "tensor.collapse_shape")) &&
        depth < 8 && mlirOperationEqual(ancestor_in(user, g->block), user)) {
      bool seen = false;
      for (int i = 0; i < views->n; ++i) seen |= mlirOperationEqual(views->ops[i], user);
      if (!seen && views->n < 64) views->ops[views->n++] = user;
      outside |= used_outside(g, mlirOperationGetResult(user, 0), views, depth + 1);
      continue;
    }
    outside = true;
  }
  return outside;
}

// Parses the kernel function and moves its body in front of `before`, its
// arguments bound to the group's inputs; the values it returns go to
// `results`.
static kiln_status_t splice(group_t *g, const char *text, MlirOperation before,
                            MlirValue *results) {
  MlirModule m = mlirModuleCreateParse(g->ctx, mlirStringRefCreateFromCString(text));
  if (mlirModuleIsNull(m)) {
    // A generator bug: the group keeps the other schedules (nothing was
    // changed yet); KILN_LOG=cuda says so.
    const char *log = getenv("KILN_LOG");
    if (log && strstr(log, "cuda"))
      fprintf(stderr, "[kiln cuda] the row kernel for f32[%lld,%lld] does not "
              "parse; left to the other schedules\n", (long long)g->M,
              (long long)g->N);
    return kiln_make_status(KILN_STATUS_UNSUPPORTED, "row kernel");
  }
  MlirOperation func = mlirBlockGetFirstOperation(mlirModuleGetBody(m));
  MlirBlock entry = mlirRegionGetFirstBlock(mlirOperationGetRegion(func, 0));
  for (int i = 0; i < g->nin; ++i)
    mlirValueReplaceAllUsesOfWith(mlirBlockGetArgument(entry, i), g->in[i].v);
  MlirOperation ret = mlirBlockGetTerminator(entry);
  for (int i = 0; i < g->nout; ++i) results[i] = mlirOperationGetOperand(ret, i);
  for (MlirOperation op = mlirBlockGetFirstOperation(entry); !mlirOperationEqual(op, ret);) {
    MlirOperation next = mlirOperationGetNextInBlock(op);
    mlirOperationMoveBefore(op, before);
    op = next;
  }
  mlirModuleDestroy(m);
  return NULL;
}

// The group's kernel text (after the chunked writes, when streamed),
// spliced before `before`; *spliced stays false when the group is left
// unchanged (not streamable, or the text does not parse).
static kiln_status_t build_and_splice(group_t *g, int64_t id, MlirOperation before,
                                      MlirValue *results, bool *spliced) {
  *spliced = false;
  if (g->chunked && !emit_writes(g)) return NULL;
  char *text = kernel_text(g, id);
  if (!text) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "row kernel");
  kiln_status_t s = splice(g, text, before, results);
  free(text);
  if (s && kiln_status_code(s) == KILN_STATUS_UNSUPPORTED) {
    kiln_status_free(s);
    return NULL;  // left unchanged
  }
  *spliced = !s;
  return s;
}

// Erases, backwards from `last`, the group's members and the reshapes,
// fills and empties left without uses.
static void sweep(group_t *g, MlirOperation last, MlirOperation stop) {
  for (MlirOperation op = last; !mlirOperationIsNull(op);) {
    MlirOperation prev = prev_in_block(op);
    bool dead = true;
    for (intptr_t i = 0; i < mlirOperationGetNumResults(op); ++i)
      dead &= mlirOpOperandIsNull(mlirValueGetFirstUse(mlirOperationGetResult(op, i)));
    bool pure = is(op, "tensor.empty") || is(op, "linalg.fill") ||
                is(op, "tensor.expand_shape") || is(op, "tensor.collapse_shape");
    if (dead && (member(g, op) || pure)) mlirOperationDestroy(op);
    if (mlirOperationEqual(op, stop)) break;
    op = prev;
  }
}

// Emits the group's kernel body (members in block order) and picks its
// outputs; false when something is not handled.
// How many tensors from outside the members the members read, at most 2
// (choose_sizes' chunks grow with it).
static int outside_tensors(group_t *g) {
  MlirValue seen[2];
  int n = 0;
  for (int k = 0; k < g->nops && n < 2; ++k) {
    MlirAttribute seg = attr(g->ops[k], "operandSegmentSizes");
    int nin = mlirDenseI32ArrayGetElement(seg, 0);
    for (int i = 0; i < nin && n < 2; ++i) {
      MlirValue v = look_through(mlirOperationGetOperand(g->ops[k], i), g->B, g->N);
      MlirOperation d = def_of(v);
      if (!mlirTypeIsARankedTensor(mlirValueGetType(v)) ||
          (d.ptr && (member(g, d) || is(d, "linalg.fill"))))
        continue;
      bool dup = false;
      for (int j = 0; j < n; ++j) dup |= mlirValueEqual(seen[j], v);
      if (!dup) seen[n++] = v;
    }
  }
  return n;
}

static bool build(group_t *g) {
  if (!choose_sizes(g, outside_tensors(g))) return false;
  for (int i = 0; i < g->nops; ++i) {
    ginfo_t gi;
    // Emitted already: by a one-pass form (emit_online).
    if (mlirOperationGetNumResults(g->ops[i]) > 0 &&
        find_reg(g, mlirOperationGetResult(g->ops[i], 0)))
      continue;
    if (!classify(g->ops[i], g->B, g->N, &gi) || !emit_generic(g, g->ops[i], &gi))
      return false;
  }
  return !g->pre.oom && !g->body.oom;
}

static bool has_reduction(group_t *g) {
  for (int i = 0; i < g->nops; ++i) {
    ginfo_t gi;
    if (classify(g->ops[i], g->B, g->N, &gi) && gi.domain == D_RED) return true;
  }
  return false;
}

static void group_init(group_t *g, MlirContext ctx, MlirBlock block) {
  memset(g, 0, sizeof(*g));
  g->ctx = ctx;
  g->block = block;
  kiln_sbuf_init(&g->pre);
  kiln_sbuf_init(&g->body);
}

static void group_free(group_t *g) {
  kiln_sbuf_free(&g->pre);
  kiln_sbuf_free(&g->body);
}

// Case (a): the row forall of softmax and log_softmax (lowering/ops/nn.c):
// a block of B rows per iteration, its body linalg generics over them.
static kiln_status_t try_forall(group_t *g, MlirOperation fa, int64_t id, bool *done) {
  *done = false;
  MlirAttribute lb = attr(fa, "staticLowerBound"), ub = attr(fa, "staticUpperBound"),
                st = attr(fa, "staticStep");
  if (array_len(lb) != 1 || array_len(ub) != 1 || array_len(st) != 1 ||
      i64_at(lb, 0, -1) != 0)
    return NULL;
  int64_t M = i64_at(ub, 0, -1), B = i64_at(st, 0, -1);
  intptr_t nres = mlirOperationGetNumResults(fa);
  if (B < 1 || M < 1 || M % B != 0 || nres < 1 || nres > MAX_OUTPUTS ||
      mlirOperationGetNumOperands(fa) != nres)
    return NULL;
  MlirType t0 = mlirValueGetType(mlirOperationGetResult(fa, 0));
  if (!mlirTypeIsARankedTensor(t0) || mlirShapedTypeGetRank(t0) != 2) return NULL;
  int64_t N = mlirShapedTypeGetDimSize(t0, 1);
  MlirBlock body = mlirRegionGetFirstBlock(mlirOperationGetRegion(fa, 0));
  g->forall = fa;
  g->iv = mlirBlockGetArgument(body, 0);
  g->B = B;
  g->M = M;
  g->N = N;
  MlirOperation term = mlirBlockGetTerminator(body);
  for (MlirOperation op = mlirBlockGetFirstOperation(body); !mlirOperationEqual(op, term);
       op = mlirOperationGetNextInBlock(op)) {
    if (is(op, "linalg.generic")) {
      if (g->nops == MAX_OPS) return NULL;
      g->ops[g->nops++] = op;
    } else if (!(is(op, "tensor.empty") || is(op, "linalg.fill") ||
                 is(op, "tensor.expand_shape") || is(op, "tensor.collapse_shape") ||
                 is(op, "tensor.extract_slice") || is(op, "arith.constant"))) {
      return NULL;
    }
  }
  // The shared outputs: whole [M,N] rows written [iv, 0] [B, N] by the
  // terminator, and used nowhere else.
  MlirBlock tb = mlirRegionGetFirstBlock(mlirOperationGetRegion(term, 0));
  MlirOperation ins = mlirBlockGetFirstOperation(tb);
  for (intptr_t i = 0; i < nres; ++i, ins = mlirOperationGetNextInBlock(ins)) {
    MlirValue arg = mlirBlockGetArgument(body, 1 + i);
    MlirOpOperand u = mlirValueGetFirstUse(arg);
    if (mlirOperationIsNull(ins) || !is(ins, "tensor.parallel_insert_slice") ||
        mlirOpOperandIsNull(u) || !mlirOpOperandIsNull(mlirOpOperandGetNextUse(u)) ||
        !mlirOperationEqual(mlirOpOperandGetOwner(u), ins) ||
        mlirOperationGetNumOperands(ins) != 3 ||
        !mlirValueEqual(mlirOperationGetOperand(ins, 1), arg) ||
        !mlirValueEqual(mlirOperationGetOperand(ins, 2), g->iv) ||
        i64_at(attr(ins, "static_offsets"), 1, -1) != 0 ||
        i64_at(attr(ins, "static_sizes"), 0, -1) != B ||
        i64_at(attr(ins, "static_sizes"), 1, -1) != N ||
        i64_at(attr(ins, "static_strides"), 0, -1) != 1 ||
        i64_at(attr(ins, "static_strides"), 1, -1) != 1)
      return NULL;
    MlirType rt = mlirValueGetType(mlirOperationGetResult(fa, i));
    if (!(forms(rt, M, N) & F_ROW) || mlirShapedTypeGetRank(rt) != 2) return NULL;
  }
  if (!mlirOperationIsNull(ins) || !has_reduction(g) || !build(g)) return NULL;
  ins = mlirBlockGetFirstOperation(tb);
  for (intptr_t i = 0; i < nres; ++i, ins = mlirOperationGetNextInBlock(ins)) {
    MlirValue src = look_through(mlirOperationGetOperand(ins, 0), B, N);
    reg_t *r = find_reg(g, src);
    if (!r || r->kind != K_ROW) return NULL;
    g->out[g->nout] = mlirOperationGetResult(fa, i);
    g->out_kind[g->nout] = K_ROW;
    g->out_type[g->nout] = mlirValueGetType(g->out[g->nout]);
    g->out_regi[g->nout] = (int)(r - g->regs);
    memcpy(g->out_reg[g->nout++], r->name, NAME);
  }
  MlirValue results[MAX_OUTPUTS];
  bool spliced = false;
  kiln_status_t s = build_and_splice(g, id, fa, results, &spliced);
  if (s || !spliced) return s;
  for (int i = 0; i < g->nout; ++i) mlirValueReplaceAllUsesOfWith(g->out[i], results[i]);
  MlirOperation prev = prev_in_block(fa);
  mlirOperationDestroy(fa);
  g->nops = 0;  // destroyed with the forall
  // The shared outputs' empties, now unused.
  if (!mlirOperationIsNull(prev)) sweep(g, prev, mlirBlockGetFirstOperation(g->block));
  *done = true;
  return NULL;
}

// The first op of the block (in order) outside the group that uses one of
// its members' results, directly or through reshapes; null when none.
static MlirOperation first_outside_user(group_t *g) {
  MlirOperation first = {NULL};
  for (int k = 0; k < g->nops; ++k)
    for (intptr_t i = 0; i < mlirOperationGetNumResults(g->ops[k]); ++i) {
      MlirValue vals[65];
      int nv = 1;
      vals[0] = mlirOperationGetResult(g->ops[k], i);
      oplist_t views = {.n = 0};
      used_outside(g, vals[0], &views, 0);
      for (int j = 0; j < views.n; ++j) vals[nv++] = mlirOperationGetResult(views.ops[j], 0);
      for (int j = 0; j < nv; ++j)
        for (MlirOpOperand u = mlirValueGetFirstUse(vals[j]); !mlirOpOperandIsNull(u);
             u = mlirOpOperandGetNextUse(u)) {
          MlirOperation user = ancestor_in(mlirOpOperandGetOwner(u), g->block);
          if (mlirOperationIsNull(user) || member(g, user) ||
              is(user, "tensor.expand_shape") || is(user, "tensor.collapse_shape"))
            continue;
          if (mlirOperationIsNull(first) || mlirOperationIsBeforeInBlock(user, first))
            first = user;
        }
    }
  return first;
}

static bool has_member_user(group_t *g, MlirOperation op) {
  for (intptr_t i = 0; i < mlirOperationGetNumResults(op); ++i) {
    oplist_t views = {.n = 0};
    MlirValue v = mlirOperationGetResult(op, i);
    used_outside(g, v, &views, 0);
    MlirValue vals[65];
    int nv = 1;
    vals[0] = v;
    for (int j = 0; j < views.n; ++j) vals[nv++] = mlirOperationGetResult(views.ops[j], 0);
    for (int j = 0; j < nv; ++j)
      for (MlirOpOperand u = mlirValueGetFirstUse(vals[j]); !mlirOpOperandIsNull(u);
           u = mlirOpOperandGetNextUse(u))
        if (member(g, mlirOpOperandGetOwner(u))) return true;
  }
  return false;
}

// Case (b): generics over the rows of one [M,N] at function level
// (softmax and log_softmax of smaller tensors, layer norm): the ones
// connected to a row reduction through values of row forms.
static kiln_status_t try_connected(group_t *g, MlirOperation seed, int64_t id, bool *done) {
  *done = false;
  // The rows from the reduction's iteration domain.
  ginfo_t gi;
  MlirAttribute maps = attr(seed, "indexing_maps");
  if (mlirAttributeIsNull(maps) || mlirOperationGetNumOperands(seed) < 2) return NULL;
  MlirType t = mlirValueGetType(mlirOperationGetOperand(seed, 0));
  if (!mlirTypeIsARankedTensor(t) || !mlirShapedTypeHasStaticShape(t)) return NULL;
  intptr_t r = mlirShapedTypeGetRank(t);
  if (r < 2 || r > 3) return NULL;
  g->B = g->M = mlirShapedTypeGetDimSize(t, 0);
  g->N = mlirShapedTypeGetDimSize(t, r - 1);
  if (!classify(seed, g->B, g->N, &gi) || gi.domain != D_RED) return NULL;
  g->ops[g->nops++] = seed;
  // Grow along uses and definitions (through reshapes) to every generic
  // over the same rows in this block.
  for (int k = 0; k < g->nops; ++k) {
    MlirOperation op = g->ops[k];
    MlirValue cand[64];
    int nc = 0;
    for (intptr_t i = 0; i < mlirOperationGetNumOperands(op) && nc < 64; ++i)
      cand[nc++] = look_through(mlirOperationGetOperand(op, i), g->B, g->N);
    oplist_t views = {.n = 0};
    for (intptr_t i = 0; i < mlirOperationGetNumResults(op); ++i)
      used_outside(g, mlirOperationGetResult(op, i), &views, 0);
    for (int v = 0; v < views.n && nc < 64; ++v)
      cand[nc++] = mlirOperationGetResult(views.ops[v], 0);
    for (intptr_t i = 0; i < mlirOperationGetNumResults(op) && nc < 64; ++i)
      cand[nc++] = mlirOperationGetResult(op, i);
    for (int c = 0; c < nc; ++c) {
      // The producer, then the users.
      MlirOperation d = def_of(cand[c]);
      ginfo_t x;
      if (is(d, "linalg.generic") && mlirBlockEqual(mlirOperationGetBlock(d), g->block) &&
          !member(g, d) && classify(d, g->B, g->N, &x)) {
        if (g->nops == MAX_OPS) return NULL;
        g->ops[g->nops++] = d;
      }
      for (MlirOpOperand u = mlirValueGetFirstUse(cand[c]); !mlirOpOperandIsNull(u);
           u = mlirOpOperandGetNextUse(u)) {
        MlirOperation user = mlirOpOperandGetOwner(u);
        if (is(user, "linalg.generic") &&
            mlirBlockEqual(mlirOperationGetBlock(user), g->block) && !member(g, user) &&
            classify(user, g->B, g->N, &x)) {
          if (g->nops == MAX_OPS) return NULL;
          g->ops[g->nops++] = user;
        }
      }
    }
  }
  // Block order.
  for (int i = 1; i < g->nops; ++i)
    for (int j = i; j > 0 && mlirOperationIsBeforeInBlock(g->ops[j], g->ops[j - 1]); --j) {
      MlirOperation tmp = g->ops[j];
      g->ops[j] = g->ops[j - 1];
      g->ops[j - 1] = tmp;
    }
  // The kernel goes after the last member, so members that come after an
  // op outside the group using the group's values (a matmul of softmax's
  // rows, say) and that feed no other member are left out.
  for (bool again = true; again && g->nops > 1;) {
    again = false;
    MlirOperation first = first_outside_user(g);
    if (mlirOperationIsNull(first)) break;
    for (int k = g->nops - 1; k >= 0 && !again; --k) {
      if (!mlirOperationIsBeforeInBlock(first, g->ops[k]) || has_member_user(g, g->ops[k]))
        continue;
      memmove(&g->ops[k], &g->ops[k + 1], sizeof(g->ops[0]) * (size_t)(g->nops - k - 1));
      g->nops--;
      again = true;
    }
  }
  if (!has_reduction(g)) return NULL;
  MlirOperation last = g->ops[g->nops - 1];
  if (!build(g)) return NULL;
  // Outputs: member results used outside the group, all after the last
  // member (the kernel goes there); reshapes of them before it move after.
  oplist_t views = {.n = 0};
  for (int k = 0; k < g->nops; ++k)
    for (intptr_t i = 0; i < mlirOperationGetNumResults(g->ops[k]); ++i) {
      MlirValue v = mlirOperationGetResult(g->ops[k], i);
      oplist_t mine = {.n = 0};
      if (!used_outside(g, v, &mine, 0)) continue;
      for (int j = 0; j < mine.n; ++j) {
        MlirValue w = mlirOperationGetResult(mine.ops[j], 0);
        for (MlirOpOperand u = mlirValueGetFirstUse(w); !mlirOpOperandIsNull(u);
             u = mlirOpOperandGetNextUse(u)) {
          MlirOperation user = ancestor_in(mlirOpOperandGetOwner(u), g->block);
          if (mlirOperationIsNull(user)) return NULL;
          if (!member(g, user) && !is(user, "tensor.expand_shape") &&
              !is(user, "tensor.collapse_shape") &&
              !mlirOperationIsBeforeInBlock(last, user))
            return NULL;
        }
        if (views.n < 64) views.ops[views.n++] = mine.ops[j];
      }
      for (MlirOpOperand u = mlirValueGetFirstUse(v); !mlirOpOperandIsNull(u);
           u = mlirOpOperandGetNextUse(u)) {
        MlirOperation user = ancestor_in(mlirOpOperandGetOwner(u), g->block);
        if (mlirOperationIsNull(user)) return NULL;
        if (!member(g, user) && !is(user, "tensor.expand_shape") &&
            !is(user, "tensor.collapse_shape") && !mlirOperationIsBeforeInBlock(last, user))
          return NULL;
      }
      reg_t *rg = find_reg(g, v);
      if (!rg || rg->kind == K_COL || g->nout == MAX_OUTPUTS) return NULL;
      g->out[g->nout] = v;
      g->out_kind[g->nout] = rg->kind;
      g->out_type[g->nout] = mlirValueGetType(v);
      g->out_regi[g->nout] = (int)(rg - g->regs);
      memcpy(g->out_reg[g->nout++], rg->name, NAME);
    }
  if (g->nout == 0) return NULL;
  MlirOperation after = mlirOperationGetNextInBlock(last);
  MlirValue results[MAX_OUTPUTS];
  bool spliced = false;
  kiln_status_t s = build_and_splice(g, id, after, results, &spliced);
  if (s || !spliced) return s;
  // Reshapes of outputs that sat between the members follow the kernel.
  MlirOperation anchor = prev_in_block(after);
  for (int i = 1; i < views.n; ++i)
    for (int j = i; j > 0 && mlirOperationIsBeforeInBlock(views.ops[j], views.ops[j - 1]); --j) {
      MlirOperation tmp = views.ops[j];
      views.ops[j] = views.ops[j - 1];
      views.ops[j - 1] = tmp;
    }
  for (int i = 0; i < views.n; ++i)
    if (mlirOperationIsBeforeInBlock(views.ops[i], after)) {
      mlirOperationMoveAfter(views.ops[i], anchor);
      anchor = views.ops[i];
    }
  for (int i = 0; i < g->nout; ++i) mlirValueReplaceAllUsesOfWith(g->out[i], results[i]);
  sweep(g, last, mlirBlockGetFirstOperation(g->block));
  *done = true;
  return NULL;
}

kiln_status_t kiln_kernels_rows_gpu(MlirContext ctx, MlirModule module) {
  group_t *g = malloc(sizeof(*g));
  if (!g) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "row kernels");
  int64_t id = ROWS_BLOCK_ID_BASE;
  kiln_status_t s = NULL;
  for (MlirOperation func = mlirBlockGetFirstOperation(mlirModuleGetBody(module));
       !s && !mlirOperationIsNull(func); func = mlirOperationGetNextInBlock(func)) {
    if (!is(func, "func.func") || mlirOperationGetNumRegions(func) != 1) continue;
    MlirBlock block = mlirRegionGetFirstBlock(mlirOperationGetRegion(func, 0));
    if (mlirBlockIsNull(block)) continue;
    // Restart the scan after every replacement: it rewrites the block.
    bool changed = true;
    while (!s && changed) {
      changed = false;
      for (MlirOperation op = mlirBlockGetFirstOperation(block);
           !s && !changed && !mlirOperationIsNull(op); op = mlirOperationGetNextInBlock(op)) {
        bool fa = is(op, "scf.forall") &&
                  mlirAttributeIsNull(attr(op, "kiln.gpu_block"));
        ginfo_t gi;
        bool red = false;
        if (is(op, "linalg.generic")) {
          MlirType t = mlirValueGetType(mlirOperationGetOperand(op, 0));
          if (mlirTypeIsARankedTensor(t) && mlirShapedTypeHasStaticShape(t) &&
              mlirShapedTypeGetRank(t) >= 2 && mlirShapedTypeGetRank(t) <= 3)
            red = classify(op, mlirShapedTypeGetDimSize(t, 0),
                           mlirShapedTypeGetDimSize(t, mlirShapedTypeGetRank(t) - 1), &gi) &&
                  gi.domain == D_RED;
        }
        if (!fa && !red) continue;
        group_init(g, ctx, block);
        bool done = false;
        s = fa ? try_forall(g, op, id, &done) : try_connected(g, op, id, &done);
        group_free(g);
        if (done) {
          ++id;
          changed = true;
        }
      }
    }
  }
  free(g);
  return s;
}

// Each stand-in left by butterfly() becomes the gpu.all_reduce it stands
// for, on the value it takes: found one at a time (a walk must not see the
// ops it erases); a kernel has a few.
static MlirWalkResult find_stand_in(MlirOperation op, void *user) {
  if (!is(op, "gpu.shuffle") || mlirAttributeIsNull(attr(op, "kiln.block_reduce")))
    return MlirWalkResultAdvance;
  *(MlirOperation *)user = op;
  return MlirWalkResultInterrupt;
}

kiln_status_t kiln_kernels_rows_gpu_finish(MlirContext ctx, MlirModule module) {
  for (;;) {
    MlirOperation sh = {NULL};
    mlirOperationWalk(mlirModuleGetOperation(module), find_stand_in, &sh, MlirWalkPreOrder);
    if (mlirOperationIsNull(sh)) return NULL;
    MlirAttribute k = attr(sh, "kiln.block_reduce");
    MlirAttribute opattr = {NULL};
    if (mlirAttributeIsAString(k)) {
      char text[64];
      MlirStringRef ks = mlirStringAttrGetValue(k);
      snprintf(text, sizeof(text), "#gpu<all_reduce_op %.*s>", (int)ks.length, ks.data);
      opattr = mlirAttributeParseGet(ctx, mlirStringRefCreateFromCString(text));
    }
    if (mlirAttributeIsNull(opattr))
      return kiln_make_status(KILN_STATUS_INTERNAL, "row kernel: a block reduction's kind");
    MlirValue x = mlirOperationGetOperand(sh, 0);
    MlirType t = mlirValueGetType(x);
    MlirNamedAttribute attrs[2] = {
        mlirNamedAttributeGet(mlirIdentifierGet(ctx, mlirStringRefCreateFromCString("op")),
                              opattr),
        mlirNamedAttributeGet(mlirIdentifierGet(ctx, mlirStringRefCreateFromCString("uniform")),
                              mlirUnitAttrGet(ctx))};
    MlirRegion region = mlirRegionCreate();
    MlirOperationState st = mlirOperationStateGet(
        mlirStringRefCreateFromCString("gpu.all_reduce"), mlirOperationGetLocation(sh));
    mlirOperationStateAddOperands(&st, 1, &x);
    mlirOperationStateAddResults(&st, 1, &t);
    mlirOperationStateAddAttributes(&st, 2, attrs);
    mlirOperationStateAddOwnedRegions(&st, 1, &region);
    MlirOperation ar = mlirOperationCreate(&st);
    if (mlirOperationIsNull(ar))
      return kiln_make_status(KILN_STATUS_INTERNAL, "row kernel: gpu.all_reduce");
    mlirBlockInsertOwnedOperationBefore(mlirOperationGetBlock(sh), sh, ar);
    mlirValueReplaceAllUsesOfWith(mlirOperationGetResult(sh, 0), mlirOperationGetResult(ar, 0));
    mlirOperationDestroy(sh);
  }
}
