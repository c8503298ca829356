// A hand-scheduled tensor-core GEMM for the CUDA target, written in the
// gpu and nvgpu dialects: C[M,N] (f32, overwritten) = A[M,K] x B[K,N], bf16
// operands, row-major. MLIR 22's nvgpu has no bf16 mma.sync: fragments are
// loaded as bf16 and bitcast to f16 vectors for nvgpu.mma.sync, whose PTX
// lowering/gpu.c relabels bf16 (same fragment layout and registers).
//
// Upstream's routes stop short of this: the transform-dialect warp
// schedule with convert-vector-to-gpu reaches mma.sync with operands read
// from global memory (115 TFLOP/s on an H200 at 4096^3), and staging them
// in shared memory left the accumulators round-tripping through global
// memory every K step. Here, per block of BM x BN outputs:
//   - a STAGES-deep pipeline of cp.async copies (nvgpu.device_async_copy,
//     16 bytes each) of BM x BK tiles of A and BK x BN tiles of B into
//     static shared memory (the gpu.launch's workgroup attributions), with
//     16-byte chunks XOR-swizzled so ldmatrix reads are free of bank
//     conflicts;
//   - warps of WM x WN outputs load fragments with nvgpu.ldmatrix (x4; B
//     transposed from its row-major tile) and issue m16n8k16 nvgpu.mma.sync
//     with f32 accumulators carried in registers across the whole K loop;
//   - blocks are ordered in groups of G block rows so consecutive blocks
//     share tiles in L2.
// One barrier per K step: wait for tile kt, barrier (every warp is also done
// with the stage about to be refilled), issue tile kt + STAGES - 1 (clamped
// to the last tile, which keeps the group count uniform), compute tile kt.
//
// Checked on the H200 with exact data (A[i,k] = (i%7)(k%3)/8, B[k,j] =
// (j%5)(k%4)/4): 0.311 ms at 4096^3 (442 TFLOP/s; cuBLAS 0.186 ms).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>

#include "kernels/gpu_splice.h"
#include "kernels/kernels.h"

typedef struct {
  int64_t m, n, k;
  int bm, bn, bk, wm, wn, stages, group;
} mma_shape_t;

// Index arithmetic, emitted once per distinct expression in a scope (the
// loop body's are forgotten after the loop: they do not dominate).
#define MEMO_MAX 4096
typedef struct {
  kiln_sbuf_t *out;
  const char *indent;
  int next;
  int count;
  struct {
    char key[64];
    char name[16];
  } memo[MEMO_MAX];
} emitter_t;

static const char *lookup(emitter_t *e, const char *key) {
  for (int i = e->count - 1; i >= 0; --i)
    if (strcmp(e->memo[i].key, key) == 0) return e->memo[i].name;
  return NULL;
}

static const char *remember(emitter_t *e, const char *key) {
  if (e->count == MEMO_MAX) {
    // Full: a fresh name, not remembered (only costs duplicates).
    static _Thread_local char spare[8][16];
    static _Thread_local int next_spare;
    char *n = spare[next_spare++ % 8];
    snprintf(n, 16, "%%x%d", e->next++);
    return n;
  }
  snprintf(e->memo[e->count].key, sizeof(e->memo[0].key), "%s", key);
  snprintf(e->memo[e->count].name, sizeof(e->memo[0].name), "%%x%d", e->next++);
  return e->memo[e->count++].name;
}

static const char *cst(emitter_t *e, int64_t v) {
  char key[64];
  snprintf(key, sizeof(key), "c %lld", (long long)v);
  const char *n = lookup(e, key);
  if (n) return n;
  n = remember(e, key);
  kiln_sbuf_printf(e->out, "%s%s = arith.constant %lld : index\n", e->indent, n,
                   (long long)v);
  return n;
}

// `op` in addi muli divui remui xori minui; folds the identities gen.py's
// template relies on (x + 0, x * 1, x * 0, x / 1, x ^ 0).
static const char *bin(emitter_t *e, const char *op, const char *a, const char *b) {
  if (strcmp(a, cst(e, 0)) == 0 && strcmp(op, "addi") == 0) return b;
  if (strcmp(b, cst(e, 0)) == 0 &&
      (!strcmp(op, "addi") || !strcmp(op, "xori")))
    return a;
  if (strcmp(b, cst(e, 0)) == 0 && strcmp(op, "muli") == 0) return b;
  if (strcmp(b, cst(e, 1)) == 0 && (!strcmp(op, "muli") || !strcmp(op, "divui")))
    return a;
  char key[64];
  snprintf(key, sizeof(key), "%s %s %s", op, a, b);
  const char *n = lookup(e, key);
  if (n) return n;
  char a_copy[16], b_copy[16];  // `remember` may reuse the slots a, b live in
  snprintf(a_copy, sizeof(a_copy), "%s", a);
  snprintf(b_copy, sizeof(b_copy), "%s", b);
  n = remember(e, key);
  kiln_sbuf_printf(e->out, "%s%s = arith.%s %s, %s : index\n", e->indent, n, op,
                   a_copy, b_copy);
  return n;
}

static const char *addc(emitter_t *e, const char *a, int64_t c) {
  return bin(e, "addi", a, cst(e, c));
}
static const char *mulc(emitter_t *e, const char *a, int64_t c) {
  return bin(e, "muli", a, cst(e, c));
}
static const char *divc(emitter_t *e, const char *a, int64_t c) {
  return bin(e, "divui", a, cst(e, c));
}
static const char *remc(emitter_t *e, const char *a, int64_t c) {
  return bin(e, "remui", a, cst(e, c));
}

// Names are copied out of the memo before the next emission may reuse it.
typedef struct {
  char s[16];
} name_t;

static name_t keep(const char *n) {
  name_t r;
  snprintf(r.s, sizeof(r.s), "%s", n);
  return r;
}

// The physical 16-byte chunk of logical chunk `ch` in tile row `r` of a
// row of `chunks` chunks.
static name_t swz(emitter_t *e, const char *r, const char *ch, int chunks) {
  name_t x = keep(chunks >= 8 ? remc(e, r, 8) : remc(e, divc(e, r, 2), 4));
  return keep(bin(e, "xori", ch, x.s));
}

typedef struct {
  name_t row0, col0, wm, wn, lane;
} coords_t;

static coords_t coords(emitter_t *e, const mma_shape_t *s) {
  coords_t c;
  int64_t tn = s->n / s->bn;
  int64_t per_group = (int64_t)s->group * tn;
  name_t grp = keep(divc(e, "%bx", per_group));
  name_t rr = keep(remc(e, "%bx", per_group));
  name_t rowt = keep(bin(e, "addi", mulc(e, grp.s, s->group), remc(e, rr.s, s->group)));
  c.row0 = keep(mulc(e, rowt.s, s->bm));
  c.col0 = keep(mulc(e, divc(e, rr.s, s->group), s->bn));
  name_t warp = keep(divc(e, "%tx", 32));
  c.lane = keep(remc(e, "%tx", 32));
  int warps_n = s->bn / s->wn;
  c.wm = keep(divc(e, warp.s, warps_n));
  c.wn = keep(remc(e, warp.s, warps_n));
  return c;
}

// Copies of k-tile `kt` into stage `st` (index SSA names) and their group.
static void issue(emitter_t *e, const mma_shape_t *s, const coords_t *c,
                  const char *kt, const char *st, const char *ta, const char *tb,
                  const char *tsa, const char *tsb, char group[16]) {
  int nt = 32 * (s->bm / s->wm) * (s->bn / s->wn);
  int ca = s->bk / 8, cb = s->bn / 8;
  name_t toks[64];
  int ntok = 0;
  name_t ktk = keep(mulc(e, kt, s->bk));
  for (int which = 0; which < 2; ++which) {
    int rows = which == 0 ? s->bm : s->bk, chunks = which == 0 ? ca : cb;
    for (int i = 0; i < rows * chunks / nt && ntok < 64; ++i) {
      name_t q = keep(addc(e, "%tx", (int64_t)i * nt));
      name_t r = keep(divc(e, q.s, chunks));
      name_t ch = keep(remc(e, q.s, chunks));
      name_t gi, gj;
      if (which == 0) {
        gi = keep(bin(e, "addi", c->row0.s, r.s));
        gj = keep(bin(e, "addi", ktk.s, mulc(e, ch.s, 8)));
      } else {
        gi = keep(bin(e, "addi", ktk.s, r.s));
        gj = keep(bin(e, "addi", c->col0.s, mulc(e, ch.s, 8)));
      }
      name_t sw = swz(e, r.s, ch.s, chunks);
      name_t sj = keep(mulc(e, sw.s, 8));
      snprintf(toks[ntok].s, sizeof(toks[0].s), "%%t%d", e->next++);
      kiln_sbuf_printf(e->out,
                       "%s%s = nvgpu.device_async_copy %%%s[%s, %s], %%s%s[%s, %s, "
                       "%s], 8 {bypassL1} : %s to %s\n",
                       e->indent, toks[ntok].s, which ? "B" : "A", gi.s, gj.s,
                       which ? "B" : "A", st, r.s, sj.s, which ? tb : ta,
                       which ? tsb : tsa);
      ++ntok;
    }
  }
  snprintf(group, 16, "%%g%d", e->next++);
  kiln_sbuf_printf(e->out, "%s%s = nvgpu.device_async_create_group ", e->indent, group);
  for (int i = 0; i < ntok; ++i)
    kiln_sbuf_printf(e->out, "%s%s", i ? ", " : "", toks[i].s);
  kiln_sbuf_puts(e->out, "\n");
}

// The kernel as a function @kiln_mma(%A, %B, %C) holding one gpu.launch;
// with `bf16_out` C is bf16, the accumulators rounded as they are stored.
static char *kernel_text(const mma_shape_t *s, bool bf16_out) {
  kiln_sbuf_t b;
  kiln_sbuf_init(&b);
  emitter_t *e = calloc(1, sizeof(*e));
  if (!e) return NULL;
  e->out = &b;
  e->indent = "      ";
  const char *ws = "#gpu.address_space<workgroup>";
  char ta[96], tb[96], tc[96], tsa[128], tsb[128];
  snprintf(ta, sizeof(ta), "memref<%lldx%lldxbf16>", (long long)s->m, (long long)s->k);
  snprintf(tb, sizeof(tb), "memref<%lldx%lldxbf16>", (long long)s->k, (long long)s->n);
  snprintf(tc, sizeof(tc), "memref<%lldx%lldx%s>", (long long)s->m, (long long)s->n,
           bf16_out ? "bf16" : "f32");
  snprintf(tsa, sizeof(tsa), "memref<%dx%dx%dxbf16, %s>", s->stages, s->bm, s->bk, ws);
  snprintf(tsb, sizeof(tsb), "memref<%dx%dx%dxbf16, %s>", s->stages, s->bk, s->bn, ws);
  int nt = 32 * (s->bm / s->wm) * (s->bn / s->wn);
  int64_t blocks = (s->m / s->bm) * (s->n / s->bn), kt_count = s->k / s->bk;
  int mi_n = s->wm / 16, ni_n = s->wn / 8, kk_n = s->bk / 16;
  kiln_sbuf_printf(&b,
                   "func.func @kiln_mma(%%A: %s, %%B: %s, %%C: %s) {\n"
                   "  %%one = arith.constant 1 : index\n"
                   "  %%gx = arith.constant %lld : index\n"
                   "  %%nt = arith.constant %d : index\n"
                   "  gpu.launch blocks(%%bx, %%by, %%bz) in (%%sgx = %%gx, %%sgy = "
                   "%%one, %%sgz = %%one)\n"
                   "             threads(%%tx, %%ty, %%tz) in (%%stx = %%nt, %%sty = "
                   "%%one, %%stz = %%one)\n"
                   "             workgroup(%%sA : %s, %%sB : %s) {\n",
                   ta, tb, tc, (long long)blocks, nt, tsa, tsb);
  coords_t c = coords(e, s);
  // Prologue: k-tiles 0 .. STAGES-2 into stages 0 .. STAGES-2.
  char g0[16] = "", g[16];
  for (int p = 0; p < s->stages - 1; ++p) {
    name_t kt = keep(cst(e, p < kt_count ? p : kt_count - 1));
    name_t st = keep(cst(e, p));
    issue(e, s, &c, kt.s, st.s, ta, tb, tsa, tsb, g);
    if (!g0[0]) memcpy(g0, g, sizeof(g0));
  }
  int nacc = mi_n * ni_n;
  name_t c0 = keep(cst(e, 0)), c1 = keep(cst(e, 1)), ckt = keep(cst(e, kt_count));
  kiln_sbuf_printf(&b, "%s%%zacc = arith.constant dense<0.0> : vector<2x2xf32>\n",
                   e->indent);
  kiln_sbuf_printf(&b, "%s%%res:%d = scf.for %%kt = %s to %s step %s iter_args(",
                   e->indent, nacc, c0.s, ckt.s, c1.s);
  for (int i = 0; i < nacc; ++i)
    kiln_sbuf_printf(&b, "%s%%acc%d = %%zacc", i ? ", " : "", i);
  kiln_sbuf_puts(&b, ") -> (");
  for (int i = 0; i < nacc; ++i)
    kiln_sbuf_printf(&b, "%svector<2x2xf32>", i ? ", " : "");
  kiln_sbuf_puts(&b, ") {\n");
  int outer = e->count;  // the loop body's expressions end with the loop
  e->indent = "        ";
  kiln_sbuf_printf(&b, "%snvgpu.device_async_wait %s {numGroups = %d : i32}\n",
                   e->indent, g0, s->stages - 2);
  kiln_sbuf_printf(&b, "%sgpu.barrier\n", e->indent);
  name_t ahead = keep(addc(e, "%kt", s->stages - 1));
  name_t ld_tile = keep(bin(e, "minui", ahead.s, cst(e, kt_count - 1)));
  name_t ld_stage = keep(remc(e, ahead.s, s->stages));
  issue(e, s, &c, ld_tile.s, ld_stage.s, ta, tb, tsa, tsb, g);
  name_t st = keep(remc(e, "%kt", s->stages));
  char (*cur)[16] = calloc((size_t)nacc, 16);
  if (!cur) {
    free(e);
    kiln_sbuf_free(&b);
    return NULL;
  }
  for (int i = 0; i < nacc; ++i) snprintf(cur[i], 16, "%%acc%d", i);
  name_t lane16 = keep(remc(e, c.lane.s, 16)), half = keep(divc(e, c.lane.s, 16));
  for (int kk = 0; kk < kk_n; ++kk) {
    name_t afr[8], bfr[16];
    for (int mi = 0; mi < mi_n && mi < 8; ++mi) {
      name_t r = keep(bin(e, "addi", mulc(e, c.wm.s, s->wm),
                          addc(e, lane16.s, (int64_t)mi * 16)));
      name_t ch = keep(addc(e, half.s, (int64_t)kk * 2));
      name_t sw = swz(e, r.s, ch.s, s->bk / 8);
      name_t col = keep(mulc(e, sw.s, 8));
      int v = e->next++;
      snprintf(afr[mi].s, 16, "%%a%d", v);
      kiln_sbuf_printf(&b,
                       "%s%%a%dr = nvgpu.ldmatrix %%sA[%s, %s, %s] {numTiles = 4 : i32, "
                       "transpose = false} : %s -> vector<4x2xbf16>\n"
                       "%s%s = vector.bitcast %%a%dr : vector<4x2xbf16> to "
                       "vector<4x2xf16>\n",
                       e->indent, v, st.s, r.s, col.s, tsa, e->indent, afr[mi].s, v);
    }
    for (int nj = 0; nj < ni_n / 2 && nj < 8; ++nj) {
      name_t r = keep(addc(e, lane16.s, (int64_t)kk * 16));
      name_t ch = keep(bin(e, "addi", mulc(e, c.wn.s, s->wn / 8),
                           addc(e, half.s, (int64_t)nj * 2)));
      name_t sw = swz(e, r.s, ch.s, s->bn / 8);
      name_t col = keep(mulc(e, sw.s, 8));
      int v = e->next++;
      kiln_sbuf_printf(&b,
                       "%s%%b%dr = nvgpu.ldmatrix %%sB[%s, %s, %s] {numTiles = 4 : i32, "
                       "transpose = true} : %s -> vector<4x2xbf16>\n"
                       "%s%%b%d = vector.bitcast %%b%dr : vector<4x2xbf16> to "
                       "vector<4x2xf16>\n",
                       e->indent, v, st.s, r.s, col.s, tsb, e->indent, v, v);
      snprintf(bfr[2 * nj].s, 16, "%%b%dl", v);
      snprintf(bfr[2 * nj + 1].s, 16, "%%b%dh", v);
      kiln_sbuf_printf(&b,
                       "%s%s = vector.shuffle %%b%d, %%b%d [0, 1] : vector<4x2xf16>, "
                       "vector<4x2xf16>\n"
                       "%s%s = vector.shuffle %%b%d, %%b%d [2, 3] : vector<4x2xf16>, "
                       "vector<4x2xf16>\n",
                       e->indent, bfr[2 * nj].s, v, v, e->indent, bfr[2 * nj + 1].s, v, v);
    }
    for (int mi = 0; mi < mi_n; ++mi)
      for (int ni = 0; ni < ni_n; ++ni) {
        int nn = mi % 2 == 0 ? ni : ni_n - 1 - ni;  // serpentine: operand reuse
        int idx = mi * ni_n + nn;
        char d[16];
        snprintf(d, sizeof(d), "%%d%d", e->next++);
        kiln_sbuf_printf(&b,
                         "%s%s = nvgpu.mma.sync(%s, %s, %s) {mmaShape = [16, 8, 16]} "
                         ": (vector<4x2xf16>, vector<2x2xf16>, vector<2x2xf32>) -> "
                         "vector<2x2xf32>\n",
                         e->indent, d, afr[mi].s, bfr[nn].s, cur[idx]);
        memcpy(cur[idx], d, 16);
      }
  }
  kiln_sbuf_printf(&b, "%sscf.yield ", e->indent);
  for (int i = 0; i < nacc; ++i) kiln_sbuf_printf(&b, "%s%s", i ? ", " : "", cur[i]);
  kiln_sbuf_puts(&b, " : ");
  for (int i = 0; i < nacc; ++i)
    kiln_sbuf_printf(&b, "%svector<2x2xf32>", i ? ", " : "");
  kiln_sbuf_puts(&b, "\n      }\n");
  free(cur);
  e->indent = "      ";
  e->count = outer;
  // The clamped re-loads of the last tile are still in flight.
  kiln_sbuf_printf(&b, "%snvgpu.device_async_wait %s {numGroups = 0 : i32}\n",
                   e->indent, g0);
  name_t gq = keep(divc(e, c.lane.s, 4)), tq = keep(remc(e, c.lane.s, 4));
  name_t wrow = keep(bin(e, "addi", c.row0.s, mulc(e, c.wm.s, s->wm)));
  name_t wcol = keep(bin(e, "addi", c.col0.s, mulc(e, c.wn.s, s->wn)));
  name_t tcol = keep(mulc(e, tq.s, 2));
  for (int mi = 0; mi < mi_n; ++mi)
    for (int ni = 0; ni < ni_n; ++ni)
      for (int h = 0; h < 2; ++h) {
        name_t row = keep(bin(e, "addi", wrow.s, addc(e, gq.s, (int64_t)mi * 16 + 8 * h)));
        name_t col = keep(bin(e, "addi", wcol.s, addc(e, tcol.s, (int64_t)ni * 8)));
        int v = e->next++;
        kiln_sbuf_printf(&b,
                         "%s%%e%d = vector.extract %%res#%d[%d] : vector<2xf32> from "
                         "vector<2x2xf32>\n",
                         e->indent, v, mi * ni_n + ni, h);
        if (bf16_out)
          kiln_sbuf_printf(&b,
                           "%s%%r%d = arith.truncf %%e%d : vector<2xf32> to "
                           "vector<2xbf16>\n"
                           "%svector.store %%r%d, %%C[%s, %s] : %s, vector<2xbf16>\n",
                           e->indent, v, v, e->indent, v, row.s, col.s, tc);
        else
          kiln_sbuf_printf(&b, "%svector.store %%e%d, %%C[%s, %s] : %s, vector<2xf32>\n",
                           e->indent, v, row.s, col.s, tc);
      }
  kiln_sbuf_printf(&b, "%sgpu.terminator\n    }\n  return\n}\n", e->indent);
  free(e);
  return kiln_sbuf_take(&b);
}

// The block shape for M x N x K (whole 128 x 128 x 32 tiles): blocks of
// 128 x 128 outputs, 4 warps of 64 x 64, K steps of 32 in 3 stages (48 KB of
// shared memory, 234 registers, no spills); groups of up to 8 block rows.
// Measured on the H200 at 4096^3 against other shapes of the same template:
// 8 warps of 64 x 32 0.378 ms, 128 x 256 blocks 0.390 ms, 2 stages with
// padded rows 0.504 ms.
static mma_shape_t choose(int64_t m, int64_t n, int64_t k) {
  mma_shape_t s = {m, n, k, 128, 128, 32, 64, 64, 3, 1};
  int64_t rows = m / s.bm;
  while (s.group < 8 && rows % (s.group * 2) == 0) s.group *= 2;
  return s;
}

typedef struct {
  MlirContext ctx;
  MlirOperation found[256];
  int count;
  MlirOperation round[256];  // kiln.gpu_mma_round generics
  int round_count;
} finder_t;

static int64_t tag(MlirOperation op, const char *name) {
  MlirAttribute a = mlirOperationGetDiscardableAttributeByName(
      op, mlirStringRefCreateFromCString(name));
  return mlirAttributeIsNull(a) || !mlirAttributeIsAInteger(a)
             ? -1
             : mlirIntegerAttrGetValueInt(a);
}

static MlirWalkResult find(MlirOperation op, void *user) {
  finder_t *f = user;
  MlirStringRef name = mlirIdentifierStr(mlirOperationGetName(op));
  if (name.length == 13 && memcmp(name.data, "linalg.matmul", 13) == 0 &&
      tag(op, "kiln.gpu_mma") >= 0 && f->count < 256)
    f->found[f->count++] = op;
  if (tag(op, "kiln.gpu_mma_round") >= 0 && f->round_count < 256)
    f->round[f->round_count++] = op;
  return MlirWalkResultAdvance;
}

// Erases `buf`'s memref.alloc when its only remaining uses are deallocs.
static void erase_if_dead(MlirValue buf) {
  if (!mlirValueIsAOpResult(buf) || !kiln_gpu_op_named(mlirOpResultGetOwner(buf), "memref.alloc"))
    return;
  for (MlirOpOperand u = mlirValueGetFirstUse(buf); !mlirOpOperandIsNull(u);
       u = mlirOpOperandGetNextUse(u))
    if (!kiln_gpu_op_named(mlirOpOperandGetOwner(u), "memref.dealloc")) return;
  MlirOpOperand u;
  while (!mlirOpOperandIsNull(u = mlirValueGetFirstUse(buf)))
    mlirOperationDestroy(mlirOpOperandGetOwner(u));
  mlirOperationDestroy(mlirOpResultGetOwner(buf));
}

// Replaces `mm` (linalg.matmul on memrefs) by the kernel's gpu.launch; with
// `round` (its kiln.gpu_mma_round generic reading C and writing a bf16
// buffer), the kernel stores bf16 there and C is gone.
static kiln_status_t replace(MlirContext ctx, MlirOperation mm, MlirOperation round,
                             bool *done) {
  *done = false;
  if (mlirOperationGetNumOperands(mm) != 3) return NULL;
  MlirValue a = mlirOperationGetOperand(mm, 0), bv = mlirOperationGetOperand(mm, 1),
            cv = mlirOperationGetOperand(mm, 2);
  MlirType at = mlirValueGetType(a), bt = mlirValueGetType(bv);
  if (!mlirTypeIsAMemRef(at) || !mlirTypeIsAMemRef(bt) ||
      !mlirShapedTypeHasStaticShape(at) || !mlirShapedTypeHasStaticShape(bt))
    return NULL;
  int64_t m = mlirShapedTypeGetDimSize(at, 0), k = mlirShapedTypeGetDimSize(at, 1),
          n = mlirShapedTypeGetDimSize(bt, 1);
  MlirType bf16 = mlirBF16TypeGet(ctx), f32 = mlirF32TypeGet(ctx);
  // The kernel overwrites C: only where C is zero-filled just before.
  MlirOperation fill = kiln_gpu_zero_fill(mm, cv);
  if (!kiln_gpu_whole_matrix(at, m, k, bf16) || !kiln_gpu_whole_matrix(bt, k, n, bf16) ||
      !kiln_gpu_whole_matrix(mlirValueGetType(cv), m, n, f32) || m % 128 ||
      n % 128 || k % 32 || mlirOperationIsNull(fill))
    return NULL;
  // The rounding generic on whole buffers: ins(C) outs(O), O bf16 [M, N],
  // after the matmul in its block, nothing between them touching C or O.
  MlirValue out = cv;
  bool bf16_out = false;
  if (!mlirOperationIsNull(round) && mlirOperationGetNumOperands(round) == 2 &&
      mlirValueEqual(mlirOperationGetOperand(round, 0), cv) &&
      kiln_gpu_whole_matrix(mlirValueGetType(mlirOperationGetOperand(round, 1)), m, n,
                            bf16) &&
      mlirBlockEqual(mlirOperationGetBlock(round), mlirOperationGetBlock(mm)) &&
      mlirOperationIsBeforeInBlock(mm, round) &&
      !kiln_gpu_used_between(mm, round, cv) &&
      !kiln_gpu_used_between(mm, round, mlirOperationGetOperand(round, 1))) {
    out = mlirOperationGetOperand(round, 1);
    bf16_out = true;
  }
  mma_shape_t s = choose(m, n, k);
  char *text = kernel_text(&s, bf16_out);
  if (!text) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "mma kernel");
  MlirValue args[3] = {a, bv, out};
  kiln_status_t st = kiln_gpu_splice(ctx, text, mm, args, 3, "tensor-core GEMM");
  free(text);
  if (st) return st;
  mlirOperationDestroy(fill);
  if (bf16_out) {
    mlirOperationDestroy(round);
    erase_if_dead(cv);
  }
  *done = true;
  return NULL;
}

kiln_status_t kiln_kernels_mma_gpu(MlirContext ctx, MlirModule module,
                                   int *out_count) {
  *out_count = 0;
  finder_t *f = calloc(1, sizeof(*f));
  if (!f) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "mma kernels");
  f->ctx = ctx;
  mlirOperationWalk(mlirModuleGetOperation(module), find, f, MlirWalkPreOrder);
  kiln_status_t s = NULL;
  for (int i = 0; !s && i < f->count; ++i) {
    MlirOperation round = {NULL};
    for (int j = 0; j < f->round_count; ++j)
      if (tag(f->round[j], "kiln.gpu_mma_round") == tag(f->found[i], "kiln.gpu_mma"))
        round = f->round[j];
    bool done = false;
    s = replace(ctx, f->found[i], round, &done);
    *out_count += done;
  }
  free(f);
  return s;
}
