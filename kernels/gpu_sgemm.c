// A hand-scheduled f32 GEMM on CUDA cores for the CUDA target, written in
// the gpu and nvgpu dialects: C[M,N] (f32, overwritten) = A[M,K] x B[K,N],
// row-major f32 operands, exact f32 fused multiply-adds in K order (per K
// split; the splits are then added in order), no tensor cores, no TF32
// (PyTorch's default for f32 matmuls).
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
// Narrow products (a transformer's 64- and 192-wide weights) take blocks of
// 64 x 64 outputs, each thread one 4x4 sub-tile; products of few blocks
// split K across grid z (see choose()); A may be given transposed.
// Ragged products (M or N not a multiple of the block, but of 4: a
// classifier head's N = 1000) run the same blocks over the sizes rounded
// up: copies of rows or 16-byte chunks past the edge read nothing and fill
// zeros (cp.async's source size 0), and stores past it are skipped.
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
  SGEMM_THREADS = 256,  // 16 x 16 threads, each 4x4 outputs per 64 x 64
  SGEMM_SUB = 64,       // a thread's sub-tiles are 64 rows / columns apart
  SGEMM_WAVE = 132,     // SMs of an H100 (a wave of one block per SM)
  SGEMM_SPLIT_CHUNK = 128,  // the shortest K range of one split
};

// Block tiles: 128 x 128 (BK 8) where M and N allow, else 64 x 64 (BK 16:
// A's and B's copies still divide evenly among 256 threads). A thread owns
// (BM / 64) x (BN / 64) sub-tiles of 4x4. `splits` > 1 splits K across
// grid z: each split writes its partial product into a temporary
// [splits, M, N], which a second kernel sums in split order (the result
// does not depend on scheduling). `at`: A is given as A^T, [K, M] row-major.
typedef struct {
  int64_t m, n, k;
  int bm, bn, bk, stages, group, splits;
  bool at;
  bool ragged;  // M or N not a multiple of the block: edge blocks masked
} sgemm_shape_t;

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

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

enum { MAX_SUB = 2, MAX_COPIES = 8 };

typedef struct {
  name_t row0, col0;     // the block's first output
  name_t k0;             // its split's first k
  name_t ar[MAX_SUB];    // the thread's A rows (x4) within the tile: 4 tr + 64 i
  name_t bc[MAX_SUB];    // its B columns (x4): 4 tc + 64 j
  // Copy coordinates, per tile. A (row-major, 4-byte copies, transposed
  // into sA[k][m]): element i at (am[i], ak[i]). A^T ([K, M]) and B: chunk i
  // of 4 floats at row atk[i] / br[i], columns acol / bcol .. + 3.
  name_t am[MAX_COPIES], ak[MAX_COPIES];
  name_t atk[MAX_COPIES], acol;
  name_t br[MAX_COPIES], bcol;
  int na, nb;  // copies of A and chunks of B per thread and tile
} coords_t;

// Chunks of 16 bytes of a [rows, cols] tile, row-major: `cols / 4` lanes
// per row, 1024 / cols rows per pass of the block's threads.
static int chunks(emitter_t *e, int rows, int cols, name_t first_row[MAX_COPIES],
                  name_t *col) {
  name_t tx = named("%tx");
  int per_row = cols / 4;
  name_t lr = binc(e, "divui", tx, per_row);
  *col = binc(e, "muli", binc(e, "remui", tx, per_row), 4);
  int n = rows * cols / (4 * SGEMM_THREADS);
  for (int i = 0; i < n; ++i)
    first_row[i] = binc(e, "addi", lr, (SGEMM_THREADS / per_row) * i);
  return n;
}

static coords_t coords(emitter_t *e, const sgemm_shape_t *s) {
  coords_t c;
  name_t bx = named("%bx"), bz = named("%bz"), tx = named("%tx");
  int64_t tn = ceil_div(s->n, s->bn);
  int64_t per_group = (int64_t)s->group * tn;
  name_t grp = binc(e, "divui", bx, per_group);
  name_t rr = binc(e, "remui", bx, per_group);
  name_t rowt = bin(e, "addi", binc(e, "muli", grp, s->group),
                    binc(e, "remui", rr, s->group));
  c.row0 = binc(e, "muli", rowt, s->bm);
  c.col0 = binc(e, "muli", binc(e, "divui", rr, s->group), s->bn);
  c.k0 = binc(e, "muli", bz, s->k / s->splits);
  name_t tr = binc(e, "divui", tx, 16), tc = binc(e, "remui", tx, 16);
  for (int i = 0; i < s->bm / SGEMM_SUB; ++i)
    c.ar[i] = binc(e, "addi", binc(e, "muli", tr, 4), SGEMM_SUB * i);
  for (int j = 0; j < s->bn / SGEMM_SUB; ++j)
    c.bc[j] = binc(e, "addi", binc(e, "muli", tc, 4), SGEMM_SUB * j);
  if (s->at) {
    // A^T's tile is BK rows of BM contiguous floats: chunks, as B's.
    c.na = chunks(e, s->bk, s->bm, c.atk, &c.acol);
  } else {
    // A: copy i covers k = tid % 8 + 8 (i % (BK/8)) and m = tid / 8 + 32
    // (i / (BK/8)): a warp reads 4 rows x 32 bytes and writes sA[k][m] at
    // banks (4k + m) % 32 (row pitch BM + 4), all distinct.
    name_t lk = binc(e, "remui", tx, 8), lm = binc(e, "divui", tx, 8);
    int kc = s->bk / 8;
    c.na = s->bm * s->bk / SGEMM_THREADS;
    for (int i = 0; i < c.na; ++i) {
      c.ak[i] = binc(e, "addi", lk, 8 * (i % kc));
      c.am[i] = binc(e, "addi", lm, 32 * (i / kc));
    }
  }
  c.nb = chunks(e, s->bk, s->bn, c.br, &c.bcol);
  return c;
}

// A copy past a ragged edge: `idx` (< `limit` where the data is) clamped to
// `last` so the address stays inside the operand, and the count of
// elements read, `whole` inside and 0 (zero fill) past it; "" when every
// copy is inside (`limit` < 0).
static name_t edge(emitter_t *e, name_t *idx, int64_t limit, int64_t last, int whole) {
  if (limit < 0) return named("");
  int v = e->next++;
  name_t in = cst(e, whole), none = cst(e, 0), lim = cst(e, limit);
  name_t clamped = binc(e, "minui", *idx, last);
  kiln_sbuf_printf(e->out,
                   "%s%%p%d = arith.cmpi ult, %s, %s : index\n"
                   "%s%%n%d = arith.select %%p%d, %s, %s : index\n",
                   e->indent, v, idx->s, lim.s, e->indent, v, v, in.s, none.s);
  *idx = clamped;
  name_t n;
  snprintf(n.s, sizeof(n.s), ", %%n%d", v);
  return n;
}

// 16-byte cp.async copies of a tile stored k-major (B, or A given as A^T):
// chunk i from src[k0 + rows[i], col0 + col] to dst[st, rows[i], col];
// their tokens are appended to toks. Columns from `limit` on (>= 0: a
// ragged edge) are zero-filled.
static void copy_chunks(emitter_t *e, const char *src, const char *dst, name_t k0,
                        name_t col0, const name_t *rows, name_t col, int n, name_t st,
                        const char *tsrc, const char *tdst, int64_t limit, int *toks,
                        int *ntok) {
  name_t gj = bin(e, "addi", col0, col);
  name_t count = edge(e, &gj, limit, limit - 4, 4);
  for (int i = 0; i < n; ++i) {
    name_t gi = bin(e, "addi", k0, rows[i]);
    toks[*ntok] = e->next++;
    kiln_sbuf_printf(e->out,
                     "%s%%t%d = nvgpu.device_async_copy %s[%s, %s], %s[%s, %s, %s], 4%s "
                     "{bypassL1} : %s to %s\n",
                     e->indent, toks[(*ntok)++], src, gi.s, gj.s, dst, st.s, rows[i].s,
                     col.s, count.s, tsrc, tdst);
  }
}

// Copies of k-tile `kt` into stage `st` and their group (`group` gets its
// token's name).
static void issue(emitter_t *e, const sgemm_shape_t *s, const coords_t *c,
                  name_t kt, name_t st, const char *ta, const char *tb,
                  const char *tsa, const char *tsb, char group[24]) {
  name_t k0 = bin(e, "addi", c->k0, binc(e, "muli", kt, s->bk));
  int toks[2 * MAX_COPIES], ntok = 0;
  int64_t mlim = s->ragged && s->m % s->bm ? s->m : -1,
          nlim = s->ragged && s->n % s->bn ? s->n : -1;
  if (s->at) {
    copy_chunks(e, "%A", "%sA", k0, c->row0, c->atk, c->acol, c->na, st, ta, tsa, mlim,
                toks, &ntok);
  } else {
    for (int i = 0; i < c->na; ++i) {
      name_t gi = bin(e, "addi", c->row0, c->am[i]);
      name_t gj = bin(e, "addi", k0, c->ak[i]);
      name_t count = edge(e, &gi, mlim, s->m - 1, 1);
      toks[ntok] = e->next++;
      kiln_sbuf_printf(e->out,
                       "%s%%t%d = nvgpu.device_async_copy %%A[%s, %s], %%sA[%s, %s, %s], "
                       "1%s : %s to %s\n",
                       e->indent, toks[ntok++], gi.s, gj.s, st.s, c->ak[i].s, c->am[i].s,
                       count.s, ta, tsa);
    }
  }
  copy_chunks(e, "%B", "%sB", k0, c->col0, c->br, c->bcol, c->nb, st, tb, tsb, nlim, toks,
              &ntok);
  snprintf(group, 24, "%%g%d", e->next++);
  kiln_sbuf_printf(e->out, "%s%s = nvgpu.device_async_create_group ", e->indent, group);
  for (int i = 0; i < ntok; ++i) kiln_sbuf_printf(e->out, "%s%%t%d", i ? ", " : "", toks[i]);
  kiln_sbuf_puts(e->out, "\n");
}

// The split partials' sum: one thread per 4 outputs adds the `splits`
// vectors of P[s, row, col .. col + 3] in split order and stores them in C.
static void reduce_launch(kiln_sbuf_t *b, const sgemm_shape_t *s, const char *tp,
                          const char *tc) {
  int64_t vectors = s->m * s->n / 4;
  kiln_sbuf_printf(b,
                   "  %%rgx = arith.constant %lld : index\n"
                   "  gpu.launch blocks(%%rx, %%ry, %%rz) in (%%rsx = %%rgx, %%rsy = "
                   "%%one, %%rsz = %%one)\n"
                   "             threads(%%qx, %%qy, %%qz) in (%%qsx = %%nt, %%qsy = "
                   "%%one, %%qsz = %%one) {\n"
                   "    %%r0 = arith.constant 0 : index\n"
                   "    %%r1 = arith.constant 1 : index\n"
                   "    %%r4 = arith.constant 4 : index\n"
                   "    %%rn = arith.constant %lld : index\n"
                   "    %%rs = arith.constant %d : index\n"
                   "    %%rnt = arith.constant %d : index\n"
                   "    %%rz0 = arith.constant dense<0.0> : vector<4xf32>\n"
                   "    %%rb = arith.muli %%rx, %%rnt : index\n"
                   "    %%rv = arith.addi %%rb, %%qx : index\n"
                   "    %%re = arith.muli %%rv, %%r4 : index\n"
                   "    %%row = arith.divui %%re, %%rn : index\n"
                   "    %%col = arith.remui %%re, %%rn : index\n"
                   "    %%sum = scf.for %%sp = %%r0 to %%rs step %%r1 iter_args(%%acc = "
                   "%%rz0) -> (vector<4xf32>) {\n"
                   "      %%v = vector.load %%P[%%sp, %%row, %%col] : %s, vector<4xf32>\n"
                   "      %%a = arith.addf %%acc, %%v : vector<4xf32>\n"
                   "      scf.yield %%a : vector<4xf32>\n"
                   "    }\n"
                   "    vector.store %%sum, %%C[%%row, %%col] : %s, vector<4xf32>\n"
                   "    gpu.terminator\n"
                   "  }\n",
                   (long long)(vectors / SGEMM_THREADS), (long long)s->n, s->splits,
                   SGEMM_THREADS, tp, tc);
}

// The kernel as a function @kiln_sgemm(%A, %B, %C) holding one gpu.launch
// (two with split K, and the partials' memref.alloc).
static char *kernel_text(const sgemm_shape_t *s) {
  kiln_sbuf_t b;
  kiln_sbuf_init(&b);
  emitter_t *e = calloc(1, sizeof(*e));
  if (!e) return NULL;
  e->out = &b;
  e->indent = "      ";
  const char *ws = "#gpu.address_space<workgroup>";
  int rm = s->bm / SGEMM_SUB, rn = s->bn / SGEMM_SUB;
  char ta[96], tb[96], tc[96], tp[96], tsa[128], tsb[128];
  if (s->at)
    snprintf(ta, sizeof(ta), "memref<%lldx%lldxf32>", (long long)s->k, (long long)s->m);
  else
    snprintf(ta, sizeof(ta), "memref<%lldx%lldxf32>", (long long)s->m, (long long)s->k);
  snprintf(tb, sizeof(tb), "memref<%lldx%lldxf32>", (long long)s->k, (long long)s->n);
  snprintf(tc, sizeof(tc), "memref<%lldx%lldxf32>", (long long)s->m, (long long)s->n);
  snprintf(tp, sizeof(tp), "memref<%dx%lldx%lldxf32>", s->splits, (long long)s->m,
           (long long)s->n);
  // A's rows are padded by 4 floats: the transposing 4-byte stores hit
  // distinct banks, and rows stay 16-byte aligned for the chunk copies.
  snprintf(tsa, sizeof(tsa), "memref<%dx%dx%dxf32, %s>", s->stages, s->bk, s->bm + 4, ws);
  snprintf(tsb, sizeof(tsb), "memref<%dx%dx%dxf32, %s>", s->stages, s->bk, s->bn, ws);
  int64_t blocks = ceil_div(s->m, s->bm) * ceil_div(s->n, s->bn);
  int64_t kt_count = s->k / s->splits / s->bk;
  // Each split's product goes to its slice of the partials, viewed as C.
  const char *out = s->splits > 1 ? "%Cs" : "%C";
  kiln_sbuf_printf(&b,
                   "func.func @kiln_sgemm(%%A: %s, %%B: %s, %%C: %s) {\n"
                   "  %%one = arith.constant 1 : index\n"
                   "  %%gx = arith.constant %lld : index\n"
                   "  %%gz = arith.constant %d : index\n"
                   "  %%nt = arith.constant %d : index\n",
                   ta, tb, tc, (long long)blocks, s->splits, SGEMM_THREADS);
  if (s->splits > 1)
    kiln_sbuf_printf(&b, "  %%P = memref.alloc() {alignment = 64 : i64} : %s\n", tp);
  kiln_sbuf_printf(&b,
                   "  gpu.launch blocks(%%bx, %%by, %%bz) in (%%sgx = %%gx, %%sgy = "
                   "%%one, %%sgz = %%gz)\n"
                   "             threads(%%tx, %%ty, %%tz) in (%%stx = %%nt, %%sty = "
                   "%%one, %%stz = %%one)\n"
                   "             workgroup(%%sA : %s, %%sB : %s) {\n",
                   tsa, tsb);
  coords_t c = coords(e, s);
  if (s->splits > 1)
    kiln_sbuf_printf(&b,
                     "%s%%Cs = memref.subview %%P[%%bz, 0, 0] [1, %lld, %lld] [1, 1, 1] : "
                     "%s to memref<%lldx%lldxf32, strided<[%lld, 1], offset: ?>>\n",
                     e->indent, (long long)s->m, (long long)s->n, tp, (long long)s->m,
                     (long long)s->n, (long long)s->n);
  char tcs[128];
  if (s->splits > 1)
    snprintf(tcs, sizeof(tcs), "memref<%lldx%lldxf32, strided<[%lld, 1], offset: ?>>",
             (long long)s->m, (long long)s->n, (long long)s->n);
  else
    snprintf(tcs, sizeof(tcs), "%s", tc);
  // Prologue: k-tiles 0 .. STAGES-2 into stages 0 .. STAGES-2.
  char g0[24] = "", g[24];
  for (int p = 0; p < s->stages - 1; ++p) {
    issue(e, s, &c, cst(e, p < kt_count ? p : kt_count - 1), cst(e, p), ta, tb, tsa,
          tsb, g);
    if (!g0[0]) memcpy(g0, g, sizeof(g0));
  }
  // acc[(r * rn) + h]: row r of the thread's 4 rm, columns bc[h] .. + 3.
  int nacc = 4 * rm * rn;
  name_t c0 = cst(e, 0), c1 = cst(e, 1), ckt = cst(e, kt_count);
  kiln_sbuf_printf(&b, "%s%%zacc = arith.constant dense<0.0> : vector<4xf32>\n",
                   e->indent);
  kiln_sbuf_printf(&b, "%s%%res:%d = scf.for %%kt = %s to %s step %s iter_args(",
                   e->indent, nacc, c0.s, ckt.s, c1.s);
  for (int i = 0; i < nacc; ++i)
    kiln_sbuf_printf(&b, "%s%%acc%d = %%zacc", i ? ", " : "", i);
  kiln_sbuf_puts(&b, ") -> (");
  for (int i = 0; i < nacc; ++i) kiln_sbuf_printf(&b, "%svector<4xf32>", i ? ", " : "");
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
  char cur[4 * MAX_SUB * MAX_SUB][24];
  for (int i = 0; i < nacc; ++i) snprintf(cur[i], sizeof(cur[i]), "%%acc%d", i);
  for (int k = 0; k < s->bk; ++k) {
    name_t kk = cst(e, k);
    int v = e->next++;
    // a<i>: rows ar[i] .. +3 at k; b<j>: columns bc[j] .. +3.
    for (int h = 0; h < rm; ++h)
      kiln_sbuf_printf(&b, "%s%%a%d_%d = vector.load %%sA[%s, %s, %s] : %s, vector<4xf32>\n",
                       e->indent, v, h, st.s, kk.s, c.ar[h].s, tsa);
    for (int h = 0; h < rn; ++h)
      kiln_sbuf_printf(&b, "%s%%b%d_%d = vector.load %%sB[%s, %s, %s] : %s, vector<4xf32>\n",
                       e->indent, v, h, st.s, kk.s, c.bc[h].s, tsb);
    for (int r = 0; r < 4 * rm; ++r) {
      kiln_sbuf_printf(&b,
                       "%s%%s%d_%d = vector.extract %%a%d_%d[%d] : f32 from vector<4xf32>\n"
                       "%s%%x%d_%d = vector.broadcast %%s%d_%d : f32 to vector<4xf32>\n",
                       e->indent, v, r, v, r / 4, r % 4, e->indent, v, r, v, r);
      for (int h = 0; h < rn; ++h) {
        int d = e->next++;
        kiln_sbuf_printf(&b, "%s%%d%d = vector.fma %%x%d_%d, %%b%d_%d, %s : vector<4xf32>\n",
                         e->indent, d, v, r, v, h, cur[r * rn + h]);
        snprintf(cur[r * rn + h], sizeof(cur[0]), "%%d%d", d);
      }
    }
  }
  kiln_sbuf_printf(&b, "%sscf.yield ", e->indent);
  for (int i = 0; i < nacc; ++i) kiln_sbuf_printf(&b, "%s%s", i ? ", " : "", cur[i]);
  kiln_sbuf_puts(&b, " : ");
  for (int i = 0; i < nacc; ++i) kiln_sbuf_printf(&b, "%svector<4xf32>", i ? ", " : "");
  kiln_sbuf_puts(&b, "\n      }\n");
  e->indent = "      ";
  e->count = outer;
  // The clamped re-loads of the last tile are still in flight.
  kiln_sbuf_printf(&b, "%snvgpu.device_async_wait %s {numGroups = 0 : i32}\n",
                   e->indent, g0);
  for (int r = 0; r < 4 * rm; ++r) {
    name_t row = bin(e, "addi", c.row0, binc(e, "addi", c.ar[r / 4], r % 4));
    for (int h = 0; h < rn; ++h) {
      name_t col = bin(e, "addi", c.col0, c.bc[h]);
      if (!s->ragged) {
        kiln_sbuf_printf(&b, "%svector.store %%res#%d, %s[%s, %s] : %s, vector<4xf32>\n",
                         e->indent, r * rn + h, out, row.s, col.s, tcs);
        continue;
      }
      // Past a ragged edge nothing is stored (N is a multiple of 4: a
      // vector is wholly inside or outside).
      int v = e->next++;
      name_t mm = cst(e, s->m), nn = cst(e, s->n);
      kiln_sbuf_printf(&b,
                       "%s%%ir%d = arith.cmpi ult, %s, %s : index\n"
                       "%s%%ic%d = arith.cmpi ult, %s, %s : index\n"
                       "%s%%in%d = arith.andi %%ir%d, %%ic%d : i1\n"
                       "%sscf.if %%in%d {\n"
                       "%s  vector.store %%res#%d, %s[%s, %s] : %s, vector<4xf32>\n"
                       "%s}\n",
                       e->indent, v, row.s, mm.s, e->indent, v, col.s, nn.s, e->indent, v, v,
                       v, e->indent, v, e->indent, r * rn + h, out, row.s, col.s, tcs,
                       e->indent);
    }
  }
  kiln_sbuf_printf(&b, "%sgpu.terminator\n    }\n", e->indent);
  if (s->splits > 1) reduce_launch(&b, s, tp, tc);
  kiln_sbuf_puts(&b, "  return\n}\n");
  free(e);
  return kiln_sbuf_take(&b);
}

// The schedule for M x N x K. 128 x 128 blocks where M and N allow: K steps
// of 8 in 4 stages (33 KB of shared memory: two blocks of 256 threads per
// SM at 128 registers, no spills); else 64 x 64 blocks, K steps of 16 in 4
// stages (34 KB). Groups of up to 8 block rows. Under a quarter wave of
// blocks (a weight gradient's [64, 4096] x [4096, 256] makes 4), K is split
// in powers of two up to two blocks per SM, each split at least
// SGEMM_SPLIT_CHUNK long. (At 64 blocks, [4096, 256] x [256, 64], a split
// in 2 would save less than the second launch costs.)
static bool choose(int64_t m, int64_t n, int64_t k, bool at, sgemm_shape_t *s) {
  if (m <= 0 || n <= 0 || k <= 0) return false;
  bool big = m % 128 == 0 && n % 128 == 0 && k % KILN_SGEMM_BK == 0;
  bool ragged = !big && (m % 64 || n % 64 || k % 16);
  // Ragged: rows of B and C (and of A^T) 16-byte aligned, whole K steps;
  // 128 x 128 blocks where they still make a wave.
  if (ragged && (m % 4 || n % 4 || k % 16)) return false;
  if (ragged) big = ceil_div(m, 128) * ceil_div(n, 128) >= SGEMM_WAVE;
  *s = (sgemm_shape_t){m, n, k, big ? 128 : 64, big ? 128 : 64, big ? KILN_SGEMM_BK : 16,
                       4, 1, 1, at, ragged};
  int64_t rows = ceil_div(m, s->bm), tiles = rows * ceil_div(n, s->bn);
  while (s->group < 8 && rows % (s->group * 2) == 0) s->group *= 2;
  // The partials' sum takes whole vectors of 256 threads: not ragged.
  if (4 * tiles < SGEMM_WAVE && !ragged)
    while (tiles * s->splits * 2 <= 2 * SGEMM_WAVE &&
           k / (s->splits * 2) >= SGEMM_SPLIT_CHUNK &&
           k % (s->splits * 2 * s->bk) == 0)
      s->splits *= 2;
  return true;
}

bool kiln_kernels_sgemm_applies(int64_t m, int64_t n, int64_t k) {
  sgemm_shape_t s;
  return choose(m, n, k, false, &s);
}

bool kiln_kernels_sgemm_whole(int64_t m, int64_t n, int64_t k) {
  sgemm_shape_t s;
  return choose(m, n, k, false, &s) && !s.ragged;
}

char *kiln_kernels_sgemm_text(int64_t m, int64_t n, int64_t k, bool a_transposed) {
  sgemm_shape_t s;
  if (!choose(m, n, k, a_transposed, &s)) return NULL;
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
  int form = kiln_gpu_matmul_lhs_form(mm);
  if (form < 0 || form == 2) return NULL;
  bool a_t = form == 1;  // A given as [K, M]
  int64_t m = mlirShapedTypeGetDimSize(at, a_t ? 1 : 0),
          k = mlirShapedTypeGetDimSize(at, a_t ? 0 : 1), n = mlirShapedTypeGetDimSize(bt, 1);
  MlirType f32 = mlirF32TypeGet(ctx);
  // The kernel overwrites C: only where C is zero-filled just before.
  MlirOperation fill = kiln_gpu_zero_fill(mm, cv);
  if (!kiln_gpu_whole_matrix(at, a_t ? k : m, a_t ? m : k, f32) ||
      !kiln_gpu_whole_matrix(bt, k, n, f32) ||
      !kiln_gpu_whole_matrix(mlirValueGetType(cv), m, n, f32) ||
      mlirOperationIsNull(fill))
    return NULL;
  char *text = kiln_kernels_sgemm_text(m, n, k, a_t);
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
