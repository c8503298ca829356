// A hand-scheduled f32 GEMM on CUDA cores for the CUDA target, written in
// the gpu and nvgpu dialects: C[M,N] (f32, overwritten) = A[M,K] x B[K,N],
// row-major f32 operands, exact f32 fused multiply-adds in K order (no
// tensor cores, no TF32: PyTorch's default for f32 matmuls).
//
// The transform-dialect schedule of kernels/gpu_schedule.c gives each
// thread a 4x4 register tile with operands read from global memory (28
// TFLOP/s on an H200 at 4096^3, cuBLAS 51). Here, per block of 128 x 128
// outputs and 256 threads (the classic SGEMM):
//   - a STAGES-deep pipeline of cp.async copies (nvgpu.device_async_copy)
//     of the 128 x BK tile of A and the BK x 128 tile of B into static
//     shared memory (the gpu.launch's workgroup attributions). B is copied
//     in 16-byte chunks, row-major. A is stored transposed (sA[k][m], so a
//     thread's rows at one k are contiguous) by 4-byte copies, eight lanes
//     per 32-byte row segment of A; its rows are padded to 132 floats so
//     those transposing stores hit 32 distinct banks;
//   - thread (tr, tc) = (tid / 16, tid % 16) owns rows {4 tr .. 4 tr + 3,
//     64 + 4 tr ..} and columns {4 tc .., 64 + 4 tc ..}: an 8x8 tile as 2x2
//     sub-tiles of 4x4, so each k is 4 vector<4xf32> shared loads (A's are
//     broadcasts within a half-warp, B's 16 lanes read 256 contiguous
//     bytes, conflict-free) and 64 FMAs (vector.fma of a broadcast A value
//     and a B vector); the 64 accumulators are 16 vector<4xf32> iter_args
//     of the K loop, in registers throughout;
//   - blocks are ordered in groups of G block rows so consecutive blocks
//     share tiles in L2; the epilogue stores C with vector<4xf32> stores.
// One barrier per K step, as kernels/gpu_mma.c: wait for tile kt, barrier
// (every thread is also done with the stage about to be refilled), issue
// tile kt + STAGES - 1 (clamped to the last tile, which keeps the group
// count uniform), compute tile kt.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>

#include "kernels/gpu_splice.h"
#include "kernels/kernels.h"

enum {
  SGEMM_BM = 128,   // block tile rows
  SGEMM_BN = 128,   // block tile columns
  SGEMM_PA = 132,   // row pitch of the transposed A tile (floats)
  SGEMM_THREADS = 256,
};

typedef struct {
  int64_t m, n, k;
  int bk, stages, group;
} sgemm_shape_t;

//===--- emitter -----------------------------------------------------------===//

typedef struct {
  char s[24];
} name_t;

// Index constants are emitted once per scope (those of the loop body are
// forgotten after the loop: they do not dominate).
typedef struct {
  kiln_sbuf_t *out;
  const char *indent;
  int next;
  int count;
  int64_t cval[128];
  name_t cname[128];
} emitter_t;

static name_t cst(emitter_t *e, int64_t v) {
  for (int i = e->count - 1; i >= 0; --i)
    if (e->cval[i] == v) return e->cname[i];
  name_t n;
  snprintf(n.s, sizeof(n.s), "%%c%d", e->next++);
  kiln_sbuf_printf(e->out, "%s%s = arith.constant %lld : index\n", e->indent, n.s,
                   (long long)v);
  if (e->count < 128) {
    e->cval[e->count] = v;
    e->cname[e->count++] = n;
  }
  return n;
}

// `op` in addi muli divui remui minui; folds x + 0 and x * 1.
static name_t bin(emitter_t *e, const char *op, name_t a, name_t b) {
  name_t zero = cst(e, 0), one = cst(e, 1);
  if (!strcmp(op, "addi") && !strcmp(b.s, zero.s)) return a;
  if (!strcmp(op, "addi") && !strcmp(a.s, zero.s)) return b;
  if ((!strcmp(op, "muli") || !strcmp(op, "divui")) && !strcmp(b.s, one.s)) return a;
  name_t n;
  snprintf(n.s, sizeof(n.s), "%%i%d", e->next++);
  kiln_sbuf_printf(e->out, "%s%s = arith.%s %s, %s : index\n", e->indent, n.s, op,
                   a.s, b.s);
  return n;
}

static name_t binc(emitter_t *e, const char *op, name_t a, int64_t c) {
  return bin(e, op, a, cst(e, c));
}

static name_t named(const char *s) {
  name_t n;
  snprintf(n.s, sizeof(n.s), "%s", s);
  return n;
}

//===--- kernel ------------------------------------------------------------===//

typedef struct {
  name_t row0, col0;  // the block's first output
  name_t ar[2];       // the thread's A rows (x4) within the tile: 4 tr, 64 + 4 tr
  name_t bc[2];       // its B columns (x4): 4 tc, 64 + 4 tc
  // Copy coordinates, per tile: A element i at (am[i], ak[i]) of the tile,
  // B chunk i at row br[i], columns bcol .. bcol + 3.
  name_t am[16], ak[16], br[4], bcol;
} coords_t;

static coords_t coords(emitter_t *e, const sgemm_shape_t *s) {
  coords_t c;
  name_t bx = named("%bx"), tx = named("%tx");
  int64_t tn = s->n / SGEMM_BN;
  int64_t per_group = (int64_t)s->group * tn;
  name_t grp = binc(e, "divui", bx, per_group);
  name_t rr = binc(e, "remui", bx, per_group);
  name_t rowt = bin(e, "addi", binc(e, "muli", grp, s->group),
                    binc(e, "remui", rr, s->group));
  c.row0 = binc(e, "muli", rowt, SGEMM_BM);
  c.col0 = binc(e, "muli", binc(e, "divui", rr, s->group), SGEMM_BN);
  name_t tr = binc(e, "divui", tx, 16), tc = binc(e, "remui", tx, 16);
  c.ar[0] = binc(e, "muli", tr, 4);
  c.ar[1] = binc(e, "addi", c.ar[0], 64);
  c.bc[0] = binc(e, "muli", tc, 4);
  c.bc[1] = binc(e, "addi", c.bc[0], 64);
  // A: BK/2 elements per thread; copy i covers k = tid % 8 + 8 (i % (BK/8))
  // and m = tid / 8 + 32 (i / (BK/8)): a warp reads 4 rows x 32 bytes and
  // writes sA[k][m] at banks (4k + m) % 32, all distinct.
  name_t lk = binc(e, "remui", tx, 8), lm = binc(e, "divui", tx, 8);
  int kc = s->bk / 8;
  for (int i = 0; i < s->bk / 2; ++i) {
    c.ak[i] = binc(e, "addi", lk, 8 * (i % kc));
    c.am[i] = binc(e, "addi", lm, 32 * (i / kc));
  }
  // B: BK/8 chunks of 16 bytes per thread, a warp per row of 32 chunks.
  name_t lr = binc(e, "divui", tx, 32);
  c.bcol = binc(e, "muli", binc(e, "remui", tx, 32), 4);
  for (int i = 0; i < kc; ++i) c.br[i] = binc(e, "addi", lr, 8 * i);
  return c;
}

// Copies of k-tile `kt` into stage `st` and their group (`group` gets its
// token's name).
static void issue(emitter_t *e, const sgemm_shape_t *s, const coords_t *c,
                  name_t kt, name_t st, const char *ta, const char *tb,
                  const char *tsa, const char *tsb, char group[24]) {
  name_t k0 = binc(e, "muli", kt, s->bk);
  int toks[32], ntok = 0;
  for (int i = 0; i < s->bk / 2; ++i) {
    name_t gi = bin(e, "addi", c->row0, c->am[i]);
    name_t gj = bin(e, "addi", k0, c->ak[i]);
    toks[ntok] = e->next++;
    kiln_sbuf_printf(e->out,
                     "%s%%t%d = nvgpu.device_async_copy %%A[%s, %s], %%sA[%s, %s, %s], 1 "
                     ": %s to %s\n",
                     e->indent, toks[ntok++], gi.s, gj.s, st.s, c->ak[i].s, c->am[i].s,
                     ta, tsa);
  }
  name_t gj = bin(e, "addi", c->col0, c->bcol);
  for (int i = 0; i < s->bk / 8; ++i) {
    name_t gi = bin(e, "addi", k0, c->br[i]);
    toks[ntok] = e->next++;
    kiln_sbuf_printf(e->out,
                     "%s%%t%d = nvgpu.device_async_copy %%B[%s, %s], %%sB[%s, %s, %s], 4 "
                     "{bypassL1} : %s to %s\n",
                     e->indent, toks[ntok++], gi.s, gj.s, st.s, c->br[i].s, c->bcol.s,
                     tb, tsb);
  }
  snprintf(group, 24, "%%g%d", e->next++);
  kiln_sbuf_printf(e->out, "%s%s = nvgpu.device_async_create_group ", e->indent, group);
  for (int i = 0; i < ntok; ++i) kiln_sbuf_printf(e->out, "%s%%t%d", i ? ", " : "", toks[i]);
  kiln_sbuf_puts(e->out, "\n");
}

// The kernel as a function @kiln_sgemm(%A, %B, %C) holding one gpu.launch.
static char *kernel_text(const sgemm_shape_t *s) {
  kiln_sbuf_t b;
  kiln_sbuf_init(&b);
  emitter_t *e = calloc(1, sizeof(*e));
  if (!e) return NULL;
  e->out = &b;
  e->indent = "      ";
  const char *ws = "#gpu.address_space<workgroup>";
  char ta[96], tb[96], tc[96], tsa[128], tsb[128];
  snprintf(ta, sizeof(ta), "memref<%lldx%lldxf32>", (long long)s->m, (long long)s->k);
  snprintf(tb, sizeof(tb), "memref<%lldx%lldxf32>", (long long)s->k, (long long)s->n);
  snprintf(tc, sizeof(tc), "memref<%lldx%lldxf32>", (long long)s->m, (long long)s->n);
  snprintf(tsa, sizeof(tsa), "memref<%dx%dx%dxf32, %s>", s->stages, s->bk, SGEMM_PA, ws);
  snprintf(tsb, sizeof(tsb), "memref<%dx%dx%dxf32, %s>", s->stages, s->bk, SGEMM_BN, ws);
  int64_t blocks = (s->m / SGEMM_BM) * (s->n / SGEMM_BN), kt_count = s->k / s->bk;
  kiln_sbuf_printf(&b,
                   "func.func @kiln_sgemm(%%A: %s, %%B: %s, %%C: %s) {\n"
                   "  %%one = arith.constant 1 : index\n"
                   "  %%gx = arith.constant %lld : index\n"
                   "  %%nt = arith.constant %d : index\n"
                   "  gpu.launch blocks(%%bx, %%by, %%bz) in (%%sgx = %%gx, %%sgy = "
                   "%%one, %%sgz = %%one)\n"
                   "             threads(%%tx, %%ty, %%tz) in (%%stx = %%nt, %%sty = "
                   "%%one, %%stz = %%one)\n"
                   "             workgroup(%%sA : %s, %%sB : %s) {\n",
                   ta, tb, tc, (long long)blocks, SGEMM_THREADS, tsa, tsb);
  coords_t c = coords(e, s);
  // Prologue: k-tiles 0 .. STAGES-2 into stages 0 .. STAGES-2.
  char g0[24] = "", g[24];
  for (int p = 0; p < s->stages - 1; ++p) {
    issue(e, s, &c, cst(e, p < kt_count ? p : kt_count - 1), cst(e, p), ta, tb, tsa,
          tsb, g);
    if (!g0[0]) memcpy(g0, g, sizeof(g0));
  }
  enum { NACC = 16 };  // acc[2 r + h]: row r of the 8, columns bc[h] .. + 3
  name_t c0 = cst(e, 0), c1 = cst(e, 1), ckt = cst(e, kt_count);
  kiln_sbuf_printf(&b, "%s%%zacc = arith.constant dense<0.0> : vector<4xf32>\n",
                   e->indent);
  kiln_sbuf_printf(&b, "%s%%res:%d = scf.for %%kt = %s to %s step %s iter_args(",
                   e->indent, NACC, c0.s, ckt.s, c1.s);
  for (int i = 0; i < NACC; ++i)
    kiln_sbuf_printf(&b, "%s%%acc%d = %%zacc", i ? ", " : "", i);
  kiln_sbuf_puts(&b, ") -> (");
  for (int i = 0; i < NACC; ++i) kiln_sbuf_printf(&b, "%svector<4xf32>", i ? ", " : "");
  kiln_sbuf_puts(&b, ") {\n");
  int outer = e->count;  // the loop body's constants end with the loop
  e->indent = "        ";
  kiln_sbuf_printf(&b, "%snvgpu.device_async_wait %s {numGroups = %d : i32}\n",
                   e->indent, g0, s->stages - 2);
  kiln_sbuf_printf(&b, "%sgpu.barrier\n", e->indent);
  name_t kt = named("%kt");
  name_t ahead = binc(e, "addi", kt, s->stages - 1);
  issue(e, s, &c, binc(e, "minui", ahead, kt_count - 1),
        binc(e, "remui", ahead, s->stages), ta, tb, tsa, tsb, g);
  name_t st = binc(e, "remui", kt, s->stages);
  char cur[NACC][24];
  for (int i = 0; i < NACC; ++i) snprintf(cur[i], sizeof(cur[i]), "%%acc%d", i);
  for (int k = 0; k < s->bk; ++k) {
    name_t kk = cst(e, k);
    int v = e->next++;
    // a0, a1: rows ar[0] .. +3, ar[1] .. +3 at k; b0, b1 likewise columns.
    for (int h = 0; h < 2; ++h)
      kiln_sbuf_printf(&b, "%s%%a%d_%d = vector.load %%sA[%s, %s, %s] : %s, vector<4xf32>\n",
                       e->indent, v, h, st.s, kk.s, c.ar[h].s, tsa);
    for (int h = 0; h < 2; ++h)
      kiln_sbuf_printf(&b, "%s%%b%d_%d = vector.load %%sB[%s, %s, %s] : %s, vector<4xf32>\n",
                       e->indent, v, h, st.s, kk.s, c.bc[h].s, tsb);
    for (int r = 0; r < 8; ++r) {
      kiln_sbuf_printf(&b,
                       "%s%%s%d_%d = vector.extract %%a%d_%d[%d] : f32 from vector<4xf32>\n"
                       "%s%%x%d_%d = vector.broadcast %%s%d_%d : f32 to vector<4xf32>\n",
                       e->indent, v, r, v, r / 4, r % 4, e->indent, v, r, v, r);
      for (int h = 0; h < 2; ++h) {
        int d = e->next++;
        kiln_sbuf_printf(&b, "%s%%d%d = vector.fma %%x%d_%d, %%b%d_%d, %s : vector<4xf32>\n",
                         e->indent, d, v, r, v, h, cur[2 * r + h]);
        snprintf(cur[2 * r + h], sizeof(cur[0]), "%%d%d", d);
      }
    }
  }
  kiln_sbuf_printf(&b, "%sscf.yield ", e->indent);
  for (int i = 0; i < NACC; ++i) kiln_sbuf_printf(&b, "%s%s", i ? ", " : "", cur[i]);
  kiln_sbuf_puts(&b, " : ");
  for (int i = 0; i < NACC; ++i) kiln_sbuf_printf(&b, "%svector<4xf32>", i ? ", " : "");
  kiln_sbuf_puts(&b, "\n      }\n");
  e->indent = "      ";
  e->count = outer;
  // The clamped re-loads of the last tile are still in flight.
  kiln_sbuf_printf(&b, "%snvgpu.device_async_wait %s {numGroups = 0 : i32}\n",
                   e->indent, g0);
  for (int r = 0; r < 8; ++r) {
    name_t row = bin(e, "addi", c.row0, binc(e, "addi", c.ar[r / 4], r % 4));
    for (int h = 0; h < 2; ++h) {
      name_t col = bin(e, "addi", c.col0, c.bc[h]);
      kiln_sbuf_printf(&b, "%svector.store %%res#%d, %%C[%s, %s] : %s, vector<4xf32>\n",
                       e->indent, 2 * r + h, row.s, col.s, tc);
    }
  }
  kiln_sbuf_printf(&b, "%sgpu.terminator\n    }\n  return\n}\n", e->indent);
  free(e);
  return kiln_sbuf_take(&b);
}

// The schedule for M x N x K (whole 128 x 128 x 8 tiles): K steps of 8 in
// 4 stages (33 KB of shared memory: two blocks of 256 threads per SM at 128
// registers, no spills), groups of up to 8 block rows. BK = 16 in 2 stages
// (33 KB) also fits 128 registers; 3 stages of it exceed the 48 KB of static
// shared memory with A's padding. Not yet timed against each other on the
// H200.
static sgemm_shape_t choose(int64_t m, int64_t n, int64_t k) {
  sgemm_shape_t s = {m, n, k, KILN_SGEMM_BK, 4, 1};
  int64_t rows = m / SGEMM_BM;
  while (s.group < 8 && rows % (s.group * 2) == 0) s.group *= 2;
  return s;
}

char *kiln_kernels_sgemm_text(int64_t m, int64_t n, int64_t k) {
  if (m <= 0 || n <= 0 || k <= 0 || m % SGEMM_BM || n % SGEMM_BN ||
      k % KILN_SGEMM_BK)
    return NULL;
  sgemm_shape_t s = choose(m, n, k);
  return kernel_text(&s);
}

//===--- replacing tagged matmuls ------------------------------------------===//

typedef struct {
  MlirOperation found[256];
  int count;
} finder_t;

static MlirWalkResult find(MlirOperation op, void *user) {
  finder_t *f = user;
  if (kiln_gpu_op_named(op, "linalg.matmul") && f->count < 256 &&
      !mlirAttributeIsNull(mlirOperationGetDiscardableAttributeByName(
          op, mlirStringRefCreateFromCString("kiln.gpu_sgemm"))))
    f->found[f->count++] = op;
  return MlirWalkResultAdvance;
}

// Replaces `mm` (linalg.matmul on memrefs) by the kernel's gpu.launch.
static kiln_status_t replace(MlirContext ctx, MlirOperation mm, bool *done) {
  *done = false;
  if (mlirOperationGetNumOperands(mm) != 3) return NULL;
  MlirValue a = mlirOperationGetOperand(mm, 0), bv = mlirOperationGetOperand(mm, 1),
            cv = mlirOperationGetOperand(mm, 2);
  MlirType at = mlirValueGetType(a), bt = mlirValueGetType(bv);
  if (!mlirTypeIsAMemRef(at) || !mlirTypeIsAMemRef(bt) ||
      !mlirShapedTypeHasStaticShape(at) || !mlirShapedTypeHasStaticShape(bt) ||
      mlirShapedTypeGetRank(at) != 2 || mlirShapedTypeGetRank(bt) != 2)
    return NULL;
  int64_t m = mlirShapedTypeGetDimSize(at, 0), k = mlirShapedTypeGetDimSize(at, 1),
          n = mlirShapedTypeGetDimSize(bt, 1);
  MlirType f32 = mlirF32TypeGet(ctx);
  // The kernel overwrites C: only where C is zero-filled just before.
  MlirOperation fill = kiln_gpu_zero_fill(mm, cv);
  if (!kiln_gpu_whole_matrix(at, m, k, f32) || !kiln_gpu_whole_matrix(bt, k, n, f32) ||
      !kiln_gpu_whole_matrix(mlirValueGetType(cv), m, n, f32) ||
      mlirOperationIsNull(fill))
    return NULL;
  char *text = kiln_kernels_sgemm_text(m, n, k);
  if (!text) return NULL;  // not whole tiles: the matmul stays
  MlirValue args[3] = {a, bv, cv};
  kiln_status_t st = kiln_gpu_splice(ctx, text, mm, args, 3, "f32 GEMM");
  free(text);
  if (st) return st;
  mlirOperationDestroy(fill);
  *done = true;
  return NULL;
}

kiln_status_t kiln_kernels_sgemm_gpu(MlirContext ctx, MlirModule module,
                                     int *out_count) {
  *out_count = 0;
  finder_t *f = calloc(1, sizeof(*f));
  if (!f) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "f32 GEMM kernels");
  mlirOperationWalk(mlirModuleGetOperation(module), find, f, MlirWalkPreOrder);
  kiln_status_t s = NULL;
  for (int i = 0; !s && i < f->count; ++i) {
    bool done = false;
    s = replace(ctx, f->found[i], &done);
    *out_count += done;
  }
  free(f);
  return s;
}
