// A hand-scheduled tensor-core GEMM for the CUDA target, written in the
// gpu and nvgpu dialects: C[M,N] (f32, overwritten) = A[M,K] x B[K,N], bf16
// or f16 operands, row-major. MLIR 22's nvgpu has no bf16 mma.sync: bf16
// fragments are loaded as bf16 and bitcast to f16 vectors for
// nvgpu.mma.sync, whose PTX lowering/gpu.c relabels bf16 (same fragment
// layout and registers) in the modules whose ldmatrix reads bf16; f16
// fragments go to it as they are.
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
//
// On sm_90 a second kernel (below) replaces ldmatrix and mma.sync by
// warpgroup MMA (wgmma) reading both operands from shared memory.
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
  const char *el;  // the operands' element type: "bf16" or "f16"
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

// The copies `toks` as one cp.async group, named in `group`.
static void commit_group(emitter_t *e, const name_t *toks, int ntok, char group[16]) {
  snprintf(group, 16, "%%g%d", e->next++);
  kiln_sbuf_printf(e->out, "%s%s = nvgpu.device_async_create_group ", e->indent, group);
  for (int i = 0; i < ntok; ++i)
    kiln_sbuf_printf(e->out, "%s%s", i ? ", " : "", toks[i].s);
  kiln_sbuf_puts(e->out, "\n");
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
  commit_group(e, toks, ntok, group);
}

// Stores the accumulator pair %e<v> (vector<2xf32>) at [row, col] of
// `dest` (of type `type`), rounded first to `round` ("bf16" or "f16") where
// it is not null.
static void store_pair(emitter_t *e, int v, const char *round, const char *dest,
                       const char *row, const char *col, const char *type) {
  if (round)
    kiln_sbuf_printf(e->out,
                     "%s%%r%d = arith.truncf %%e%d : vector<2xf32> to vector<2x%s>\n"
                     "%svector.store %%r%d, %s[%s, %s] : %s, vector<2x%s>\n",
                     e->indent, v, v, round, e->indent, v, dest, row, col, type, round);
  else
    kiln_sbuf_printf(e->out, "%svector.store %%e%d, %s[%s, %s] : %s, vector<2xf32>\n",
                     e->indent, v, dest, row, col, type);
}

// %<p><v> (vector<4x2xf16>) = an ldmatrix x4 of `tile` (`ts`) at [st, r,
// col], transposed for B; bf16 fragments are loaded as bf16 into
// %<p><v>r and bitcast (mma.sync takes f16 vectors; lowering/gpu.c
// relabels the PTX).
static void ldmatrix(emitter_t *e, char p, int v, const char *tile, const char *st,
                     const char *r, const char *col, const char *ts, bool transpose,
                     const char *el) {
  bool bits = strcmp(el, "bf16") == 0;
  kiln_sbuf_printf(e->out,
                   "%s%%%c%d%s = nvgpu.ldmatrix %s[%s, %s, %s] {numTiles = 4 : i32, "
                   "transpose = %s} : %s -> vector<4x2x%s>\n",
                   e->indent, p, v, bits ? "r" : "", tile, st, r, col,
                   transpose ? "true" : "false", ts, el);
  if (bits)
    kiln_sbuf_printf(e->out,
                     "%s%%%c%d = vector.bitcast %%%c%dr : vector<4x2xbf16> to "
                     "vector<4x2xf16>\n",
                     e->indent, p, v, p, v);
}

// The kernel as a function @kiln_mma(%A, %B, %C) holding one gpu.launch;
// with `round` C is of that type ("bf16" or "f16"), the accumulators
// rounded as they are stored, else f32. f16 operands go to mma.sync as
// they are; bf16 ones as their bits in f16 vectors.
static char *kernel_text(const mma_shape_t *s, const char *round) {
  kiln_sbuf_t b;
  kiln_sbuf_init(&b);
  emitter_t *e = calloc(1, sizeof(*e));
  if (!e) return NULL;
  e->out = &b;
  e->indent = "      ";
  const char *ws = "#gpu.address_space<workgroup>";
  char ta[96], tb[96], tc[96], tsa[128], tsb[128];
  const char *el = s->el;
  snprintf(ta, sizeof(ta), "memref<%lldx%lldx%s>", (long long)s->m, (long long)s->k, el);
  snprintf(tb, sizeof(tb), "memref<%lldx%lldx%s>", (long long)s->k, (long long)s->n, el);
  snprintf(tc, sizeof(tc), "memref<%lldx%lldx%s>", (long long)s->m, (long long)s->n,
           round ? round : "f32");
  snprintf(tsa, sizeof(tsa), "memref<%dx%dx%dx%s, %s>", s->stages, s->bm, s->bk, el, ws);
  snprintf(tsb, sizeof(tsb), "memref<%dx%dx%dx%s, %s>", s->stages, s->bk, s->bn, el, ws);
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
      ldmatrix(e, 'a', v, "%sA", st.s, r.s, col.s, tsa, false, el);
    }
    for (int nj = 0; nj < ni_n / 2 && nj < 8; ++nj) {
      name_t r = keep(addc(e, lane16.s, (int64_t)kk * 16));
      name_t ch = keep(bin(e, "addi", mulc(e, c.wn.s, s->wn / 8),
                           addc(e, half.s, (int64_t)nj * 2)));
      name_t sw = swz(e, r.s, ch.s, s->bn / 8);
      name_t col = keep(mulc(e, sw.s, 8));
      int v = e->next++;
      ldmatrix(e, 'b', v, "%sB", st.s, r.s, col.s, tsb, true, el);
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
        store_pair(e, v, round, "%C", row.s, col.s, tc);
      }
  kiln_sbuf_printf(&b, "%sgpu.terminator\n    }\n  return\n}\n", e->indent);
  free(e);
  return kiln_sbuf_take(&b);
}

//===--- sm_90: warpgroup MMA (wgmma) --------------------------------------===//
//
// The same pipeline of cp.async copies into shared memory, but operands are
// read by the tensor cores themselves: per block of 64 WG x BN outputs, WG
// warpgroups (4 warps each) issue wgmma.mma_async m64nBNk16 from shared
// memory descriptors, accumulating into BN / 2 f32 registers per thread
// that stay in flight across K steps (one wgmma group outstanding).
//
// Shared memory (dynamic, aligned at run time to 1024 bytes, the period of
// the 128-byte swizzle; NVPTX prints gpu.dynamic_shared_memory's symbol as
// a demoted 1-byte .shared variable, and the launch's dynamic bytes follow
// it, which is what the accesses past it rely on) holds STAGES tiles of
//   A: 64 WG rows x 64 k (128 bytes a row; K-major): the descriptor's
//      stride byte offset is 1024 (8 rows to the next 8), a k16 step moves
//      the start address by 32 bytes;
//   B: BN / 64 chunks of 64 k rows x 64 n (N-major, imm-trans-b = 1): the
//      leading byte offset is a chunk (8192 bytes: 64 n to the next 64), the
//      stride byte offset 1024 (8 k rows to the next 8), a k16 step moves
//      the start by 16 rows (2048 bytes);
//      or, where B is given as [N, K] (`bt`: a linear's weight, read in
//      place), BN n rows x 64 k laid out as A's tile (K-major,
//      imm-trans-b = 0), with A's descriptor form.
// Within each 1024-byte atom, 16-byte unit u of row r sits at u ^ (r % 8):
// the 128-byte swizzle wgmma reads (descriptor bits 62-63 = 1); the copies
// write it that way. cp.async writes shared memory through the generic
// proxy, wgmma reads it through the async proxy: a fence.proxy.async
// between them, before the barrier.
//
// Per K step kt: wait for tile kt's copies, fence, barrier (every warpgroup
// has also retired its wgmma group of tile kt - 2), refill that stage with
// tile kt + STAGES - 2 (clamped to the last tile), issue tile kt's wgmmas,
// keep one group outstanding.
//
// By default (KILN_GPU_TMA=0 keeps the cp.async copies above) the tiles
// arrive by TMA instead: the host function makes a tensor map of A (boxes
// of 64 WG rows x 64 k) and of B (boxes of 64 k x 64 n, BN / 64 a stage; or
// BN n x 64 k where B is [N, K]), each with the 128-byte swizzle, so TMA
// writes exactly the layout above. kiln's launcher encodes them per call
// and passes them by value (lowering/gpu.c). Each stage has an mbarrier
// (count 1); thread 0 arms it with the stage's bytes and issues the loads
// (cp.async.bulk.tensor), and every thread waits for the phase of tile kt
// (parity (kt / STAGES) % 2) where the cp.async version waits for its
// group; the barrier after it stays (the refilled stage's wgmmas must have
// retired in both warpgroups). No fence is needed: TMA writes and wgmma
// reads are both in the async proxy. Only tiles that exist are loaded, so
// nothing is in flight when the stages become the output tile.
typedef struct {
  int64_t m, n, k;
  int wg;      // warpgroups: blocks of 64 wg rows
  int bn;      // 128 or 256 columns: one m64nBNk16 per k16 step
  int stages;  // at least 3
  int group;   // block rows per L2 group
  bool bt;     // B given as [N, K] (K-major)
  bool tma;    // operands by TMA (cp.async.bulk.tensor) instead of cp.async
  const char *el;  // the operands' element type: "bf16" or "f16"
} wg_shape_t;

enum { WG_BK = 64 };

// The pipeline's stages, reused for the output tile (f32 at most, rows
// padded by 16 bytes), and the 1024 bytes that alignment may skip.
static int64_t wgmma_shared_bytes(const wg_shape_t *s) {
  int64_t pipe = (int64_t)s->stages * (64 * s->wg + s->bn) * WG_BK * 2;
  int64_t out = (int64_t)64 * s->wg * (s->bn * 4 + 16);
  return 1024 + (pipe > out ? pipe : out);
}

// Copies of k-tile `kt` into stage `st` and their group.
static void wg_issue(emitter_t *e, const wg_shape_t *s, const name_t *row0,
                     const name_t *col0, const char *kt, const char *st,
                     const char *ta, const char *tb, const char *tsa,
                     const char *tsb, char group[16]) {
  int nt = 128 * s->wg, bm = 64 * s->wg;
  name_t toks[64];
  int ntok = 0;
  name_t ktk = keep(mulc(e, kt, WG_BK));
  for (int which = 0; which < 2; ++which) {
    // A (and a K-major B): rows of 64 k, 8 units of 16 bytes a row.
    bool kmajor = which == 0 || s->bt;
    int rows = which == 0 ? bm : s->bt ? s->bn : WG_BK,
        chunks = kmajor ? WG_BK / 8 : s->bn / 8;
    for (int i = 0; i < rows * chunks / nt && ntok < 64; ++i) {
      name_t q = keep(addc(e, "%tx", (int64_t)i * nt));
      name_t r = keep(divc(e, q.s, chunks));
      name_t ch = keep(remc(e, q.s, chunks));
      name_t gi, gj;
      if (kmajor) {
        gi = keep(bin(e, "addi", which == 0 ? row0->s : col0->s, r.s));
        gj = keep(bin(e, "addi", ktk.s, mulc(e, ch.s, 8)));
      } else {
        gi = keep(bin(e, "addi", ktk.s, r.s));
        gj = keep(bin(e, "addi", col0->s, mulc(e, ch.s, 8)));
      }
      // The unit within the row's 128 bytes, swizzled; B's 64-column chunk.
      name_t u = keep(kmajor ? ch.s : remc(e, ch.s, 8));
      name_t sw = keep(mulc(e, bin(e, "xori", u.s, remc(e, r.s, 8)), 8));
      snprintf(toks[ntok].s, sizeof(toks[0].s), "%%t%d", e->next++);
      if (kmajor)
        kiln_sbuf_printf(e->out,
                         "%s%s = nvgpu.device_async_copy %%%s[%s, %s], %%s%s[%s, %s, %s], 8 "
                         "{bypassL1} : %s to %s\n",
                         e->indent, toks[ntok].s, which ? "B" : "A", gi.s, gj.s,
                         which ? "B" : "A", st, r.s, sw.s, which ? tb : ta,
                         which ? tsb : tsa);
      else {
        name_t c = keep(divc(e, ch.s, 8));
        kiln_sbuf_printf(e->out,
                         "%s%s = nvgpu.device_async_copy %%B[%s, %s], %%sB[%s, %s, %s, %s], "
                         "8 {bypassL1} : %s to %s\n",
                         e->indent, toks[ntok].s, gi.s, gj.s, st, c.s, r.s, sw.s, tb, tsb);
      }
      ++ntok;
    }
  }
  commit_group(e, toks, ntok, group);
}

// TMA: the descriptor types of A's tile (BM x 64, K-major) and of B's
// (64 k x 64 n chunks, or BN x 64 where B is [N, K]); both write the
// 128-byte swizzle wgmma reads, so the tiles land as wg_issue lays them out.
static void wg_tma_types(const wg_shape_t *s, char da[256], char db[256], char va[96],
                         char vb[96]) {
  const char *ws = "#gpu.address_space<workgroup>";
  snprintf(va, 96, "memref<%dx%dx%s, %s>", 64 * s->wg, WG_BK, s->el, ws);
  snprintf(vb, 96, "memref<%dx%dx%s, %s>", s->bt ? s->bn : WG_BK, 64, s->el, ws);
  snprintf(da, 256,
           "!nvgpu.tensormap.descriptor<tensor = %s, swizzle = swizzle_128b, "
           "l2promo = l2promo_256b, oob = zero, interleave = none>", va);
  snprintf(db, 256,
           "!nvgpu.tensormap.descriptor<tensor = %s, swizzle = swizzle_128b, "
           "l2promo = l2promo_256b, oob = zero, interleave = none>", vb);
}

// The pipeline's mbarriers, one per stage.
static void wg_mbar_type(const wg_shape_t *s, char mb[128]) {
  snprintf(mb, 128,
           "!nvgpu.mbarrier.group<memorySpace = #gpu.address_space<workgroup>, "
           "num_barriers = %d>", s->stages);
}

// TMA loads of k-tile `kt` into stage `st`, completing on the stage's
// mbarrier; emitted inside the issuing thread's scf.if (`e->count` is
// restored by the caller: nothing here dominates the rest).
static void wg_issue_tma(emitter_t *e, const wg_shape_t *s, const name_t *row0,
                         const name_t *col0, const name_t *pad, const char *kt,
                         const char *st) {
  int bm = 64 * s->wg;
  char da[256], db[256], va[96], vb[96], mb[128];
  wg_tma_types(s, da, db, va, vb);
  wg_mbar_type(s, mb);
  const char *tsm = "memref<?xi8, #gpu.address_space<workgroup>>";
  int64_t a_stage = (int64_t)bm * WG_BK * 2, b_stage = (int64_t)s->bn * WG_BK * 2;
  name_t k0 = keep(mulc(e, kt, WG_BK));
  kiln_sbuf_printf(e->out, "%snvgpu.mbarrier.arrive.expect_tx %%mb[%s], %s : %s\n",
                   e->indent, st, cst(e, a_stage + b_stage), mb);
  name_t offa = keep(bin(e, "addi", pad->s, mulc(e, st, a_stage)));
  int v = e->next++;
  kiln_sbuf_printf(e->out,
                   "%s%%ta%d = memref.view %%dsm[%s][] : %s to %s\n"
                   "%snvgpu.tma.async.load %%tmA[%s, %s], %%mb[%s] to %%ta%d : %s, "
                   "%s -> %s\n",
                   e->indent, v, offa.s, tsm, va, e->indent, k0.s, row0->s, st, v, da, mb,
                   va);
  name_t offb = keep(bin(e, "addi", addc(e, pad->s, s->stages * a_stage),
                         mulc(e, st, b_stage)));
  for (int c = 0; c < (s->bt ? 1 : s->bn / 64); ++c) {
    // Coordinates innermost first: (k, n) of a [N, K] B, else (n, k).
    name_t x = keep(s->bt ? k0.s : addc(e, col0->s, 64 * c));
    name_t y = keep(s->bt ? col0->s : k0.s);
    name_t off = keep(addc(e, offb.s, (int64_t)c * WG_BK * 128));
    int w = e->next++;
    kiln_sbuf_printf(e->out,
                     "%s%%tb%d = memref.view %%dsm[%s][] : %s to %s\n"
                     "%snvgpu.tma.async.load %%tmB[%s, %s], %%mb[%s] to %%tb%d : %s, "
                     "%s -> %s\n",
                     e->indent, w, off.s, tsm, vb, e->indent, x.s, y.s, st, w, db, mb,
                     vb);
  }
}

// A wgmma descriptor (i64) for the shared byte address `addr` (index):
// start address >> 4 in bits 0-13, `high` the byte offsets and swizzle.
static name_t wg_desc(emitter_t *e, const char *addr, uint64_t high) {
  name_t d;
  int v = e->next++;
  kiln_sbuf_printf(e->out,
                   "%s%%da%d = arith.index_cast %s : index to i64\n"
                   "%s%%ds%d = arith.shrui %%da%d, %%i4 : i64\n"
                   "%s%%dl%d = arith.andi %%ds%d, %%i16383 : i64\n"
                   "%s%%dh%d = arith.constant %llu : i64\n"
                   "%s%%d%d = arith.ori %%dl%d, %%dh%d : i64\n",
                   e->indent, v, addr, e->indent, v, v, e->indent, v, v, e->indent, v,
                   (unsigned long long)high, e->indent, v, v, v);
  snprintf(d.s, sizeof(d.s), "%%d%d", v);
  return d;
}

static uint64_t wg_desc_bits(uint64_t lead_bytes, uint64_t stride_bytes) {
  return ((lead_bytes >> 4) << 16) | ((stride_bytes >> 4) << 32) | (1ull << 62);
}

bool kiln_kernels_tma_applies(void) {
  const char *env = getenv("KILN_GPU_TMA");
  return !(env && strcmp(env, "0") == 0);
}

bool kiln_kernels_wgmma_applies(int sm, int64_t k) {
  const char *env = getenv("KILN_GPU_WGMMA");
  return sm == 90 && k % WG_BK == 0 && !(env && strcmp(env, "0") == 0);
}

// An elementwise consumer folded into the wgmma kernel's stores: the
// generic's inputs in order, one of them the f32 accumulators (`c_pos`),
// the others [M, N] matrices or [N] rows of `elt[i]`; its result `out`.
// The kernel calls @kiln_epilogue(inputs...) -> out per element; after the
// splice, fold_epilogue() puts the generic's body in place of each call.
#define KILN_EPILOGUE_MAX_INPUTS 5
typedef struct {
  int n_in, c_pos;
  bool row[KILN_EPILOGUE_MAX_INPUTS];
  const char *elt[KILN_EPILOGUE_MAX_INPUTS];
  const char *out;
} epilogue_t;

static char *wgmma_text(const wg_shape_t *s, const char *round, const epilogue_t *ep) {
  kiln_sbuf_t b;
  kiln_sbuf_init(&b);
  emitter_t *e = calloc(1, sizeof(*e));
  if (!e) return NULL;
  e->out = &b;
  e->indent = "      ";
  const char *ws = "#gpu.address_space<workgroup>";
  int bm = 64 * s->wg, nt = 128 * s->wg, chunks = s->bn / 64;
  char ta[96], tb[96], tc[96], tsa[128], tsb[128], tsm[96];
  const char *el = s->el;
  snprintf(ta, sizeof(ta), "memref<%lldx%lldx%s>", (long long)s->m, (long long)s->k, el);
  if (s->bt)
    snprintf(tb, sizeof(tb), "memref<%lldx%lldx%s>", (long long)s->n, (long long)s->k, el);
  else
    snprintf(tb, sizeof(tb), "memref<%lldx%lldx%s>", (long long)s->k, (long long)s->n, el);
  snprintf(tc, sizeof(tc), "memref<%lldx%lldx%s>", (long long)s->m, (long long)s->n,
           ep ? ep->out : round ? round : "f32");
  // The epilogue's other inputs are arguments %E<i> after %C.
  char te[KILN_EPILOGUE_MAX_INPUTS][96] = {{0}};
  kiln_sbuf_t eargs;
  kiln_sbuf_init(&eargs);
  for (int i = 0; ep && i < ep->n_in; ++i) {
    if (i == ep->c_pos) continue;
    if (ep->row[i])
      snprintf(te[i], sizeof(te[i]), "memref<%lldx%s>", (long long)s->n, ep->elt[i]);
    else
      snprintf(te[i], sizeof(te[i]), "memref<%lldx%lldx%s>", (long long)s->m,
               (long long)s->n, ep->elt[i]);
    kiln_sbuf_printf(&eargs, ", %%E%d: %s", i, te[i]);
  }
  snprintf(tsa, sizeof(tsa), "memref<%dx%dx%dx%s, %s>", s->stages, bm, WG_BK, el, ws);
  if (s->bt)
    snprintf(tsb, sizeof(tsb), "memref<%dx%dx%dx%s, %s>", s->stages, s->bn, WG_BK, el, ws);
  else
    snprintf(tsb, sizeof(tsb), "memref<%dx%dx%dx64x%s, %s>", s->stages, chunks, WG_BK, el,
             ws);
  snprintf(tsm, sizeof(tsm), "memref<?xi8, %s>", ws);
  // The accumulator: BN / 2 floats per thread.
  kiln_sbuf_t acc;
  kiln_sbuf_init(&acc);
  kiln_sbuf_puts(&acc, "!llvm.struct<(");
  for (int i = 0; i < s->bn / 2; ++i) kiln_sbuf_puts(&acc, i ? ", f32" : "f32");
  kiln_sbuf_puts(&acc, ")>");
  const char *ty = acc.data;
  int64_t blocks = (s->m / bm) * (s->n / s->bn), kt_count = s->k / WG_BK;
  int64_t a_stage = (int64_t)bm * WG_BK * 2, b_stage = (int64_t)s->bn * WG_BK * 2;
  // TMA: the tensor maps of A and B, made on the host (kiln's launcher
  // encodes them per call from these ops: lowering/gpu.c) and passed to
  // the kernel as pointers (convert-nvgpu-to-nvvm's form; the pipeline
  // makes each a 128-byte by-value parameter).
  char da[256], db[256], va[96], vb[96], mb[128];
  kiln_sbuf_t host;
  kiln_sbuf_init(&host);
  if (s->tma) {
    wg_tma_types(s, da, db, va, vb);
    wg_mbar_type(s, mb);
    kiln_sbuf_printf(&host,
                     "  %%tbA0 = arith.constant %d : index\n"
                     "  %%tbA1 = arith.constant %d : index\n"
                     "  %%tbB0 = arith.constant %d : index\n"
                     "  %%tbB1 = arith.constant 64 : index\n"
                     "  %%uA = memref.cast %%A : %s to memref<*x%s>\n"
                     "  %%uB = memref.cast %%B : %s to memref<*x%s>\n"
                     "  %%hA = nvgpu.tma.create.descriptor %%uA box[%%tbA0, %%tbA1] : "
                     "memref<*x%s> -> %s\n"
                     "  %%hB = nvgpu.tma.create.descriptor %%uB box[%%tbB0, %%tbB1] : "
                     "memref<*x%s> -> %s\n"
                     "  %%pA = builtin.unrealized_conversion_cast %%hA : %s to !llvm.ptr\n"
                     "  %%pB = builtin.unrealized_conversion_cast %%hB : %s to !llvm.ptr\n",
                     bm, WG_BK, s->bt ? s->bn : WG_BK, ta, el, tb, el, el, da, el, db, da,
                     db);
  }
  kiln_sbuf_printf(&b,
                   "func.func @kiln_mma(%%A: %s, %%B: %s, %%C: %s%s) {\n"
                   "  %%one = arith.constant 1 : index\n"
                   "  %%gx = arith.constant %lld : index\n"
                   "  %%nt = arith.constant %d : index\n"
                   "  %%smem = arith.constant %lld : i32\n"
                   "%s"
                   "  gpu.launch blocks(%%bx, %%by, %%bz) in (%%sgx = %%gx, %%sgy = "
                   "%%one, %%sgz = %%one)\n"
                   "             threads(%%tx, %%ty, %%tz) in (%%stx = %%nt, %%sty = "
                   "%%one, %%stz = %%one)\n"
                   "             dynamic_shared_memory_size %%smem {\n"
                   "      %%i4 = arith.constant 4 : i64\n"
                   "      %%i16383 = arith.constant 16383 : i64\n"
                   "      %%dsm = gpu.dynamic_shared_memory : %s\n"
                   "      %%base = memref.extract_aligned_pointer_as_index %%dsm : %s -> "
                   "index\n",
                   ta, tb, tc, eargs.data ? eargs.data : "", (long long)blocks, nt,
                   (long long)wgmma_shared_bytes(s), host.data ? host.data : "", tsm, tsm);
  kiln_sbuf_free(&host);
  kiln_sbuf_free(&eargs);
  name_t c1024 = keep(cst(e, 1024));
  name_t pad = keep(remc(e, bin(e, "subi", c1024.s, remc(e, "%base", 1024)), 1024));
  name_t a0 = keep(bin(e, "addi", "%base", pad.s));  // shared address of sA
  name_t padb = keep(addc(e, pad.s, s->stages * a_stage));
  name_t b0 = keep(bin(e, "addi", "%base", padb.s));
  kiln_sbuf_printf(&b,
                   "%s%%sA = memref.view %%dsm[%s][] : %s to %s\n"
                   "%s%%sB = memref.view %%dsm[%s][] : %s to %s\n",
                   e->indent, pad.s, tsm, tsa, e->indent, padb.s, tsm, tsb);
  name_t t0 = {{0}};
  if (s->tma) {
    // One mbarrier per stage, armed by the issuing thread (%tx 0) with the
    // stage's bytes; the TMA unit completes it as they land.
    name_t c0i = keep(cst(e, 0)), c1i = keep(cst(e, 1)), stage_i[8];
    for (int p = 0; p < s->stages && p < 8; ++p) stage_i[p] = keep(cst(e, p));
    t0 = keep("%t0");
    kiln_sbuf_printf(&b,
                     "%s%%tmA = builtin.unrealized_conversion_cast %%pA : !llvm.ptr to %s\n"
                     "%s%%tmB = builtin.unrealized_conversion_cast %%pB : !llvm.ptr to %s\n"
                     "%s%%mb = nvgpu.mbarrier.create -> %s\n"
                     "%s%%t0 = arith.cmpi eq, %%tx, %s : index\n"
                     "%sscf.if %%t0 {\n",
                     e->indent, da, e->indent, db, e->indent, mb, e->indent, c0i.s,
                     e->indent);
    for (int p = 0; p < s->stages; ++p)
      kiln_sbuf_printf(&b, "%s  nvgpu.mbarrier.init %%mb[%s], %s : %s\n", e->indent,
                       stage_i[p].s, c1i.s, mb);
    kiln_sbuf_printf(&b,
                     "%s  nvvm.fence.proxy {kind = #nvvm.proxy_kind<async.shared>, space = "
                     "#nvvm.shared_space<cta>}\n"
                     "%s}\n%sgpu.barrier\n",
                     e->indent, e->indent, e->indent);
  }
  // Blocks in groups of `group` block rows (as coords() orders them).
  int64_t tn = s->n / s->bn, per_group = (int64_t)s->group * tn;
  name_t grp = keep(divc(e, "%bx", per_group));
  name_t rr = keep(remc(e, "%bx", per_group));
  name_t rowt = keep(bin(e, "addi", mulc(e, grp.s, s->group), remc(e, rr.s, s->group)));
  name_t row0 = keep(mulc(e, rowt.s, bm));
  name_t col0 = keep(mulc(e, divc(e, rr.s, s->group), s->bn));
  name_t wgi = keep(divc(e, "%tx", 128));
  // This warpgroup's rows of A in every stage: 64 rows of 128 bytes.
  name_t a_wg = keep(bin(e, "addi", a0.s, mulc(e, wgi.s, 64 * WG_BK * 2)));
  char g0[16] = "", g[16];
  if (s->tma) {
    // Tiles 0 .. STAGES - 3 (those that exist): one thread issues them.
    kiln_sbuf_printf(&b, "%sscf.if %s {\n", e->indent, t0.s);
    int saved = e->count;
    e->indent = "        ";
    for (int p = 0; p < s->stages - 2 && p < kt_count; ++p) {
      name_t kt = keep(cst(e, p));
      wg_issue_tma(e, s, &row0, &col0, &pad, kt.s, kt.s);
    }
    e->indent = "      ";
    e->count = saved;
    kiln_sbuf_printf(&b, "%s}\n", e->indent);
  }
  for (int p = 0; !s->tma && p < s->stages - 2; ++p) {
    name_t kt = keep(cst(e, p < kt_count ? p : kt_count - 1));
    name_t st = keep(cst(e, p));
    wg_issue(e, s, &row0, &col0, kt.s, st.s, ta, tb, tsa, tsb, g);
    if (!g0[0]) memcpy(g0, g, sizeof(g0));
  }
  name_t c0 = keep(cst(e, 0)), c1 = keep(cst(e, 1)), ckt = keep(cst(e, kt_count));
  kiln_sbuf_printf(&b,
                   "%s%%zacc = llvm.mlir.zero : %s\n"
                   "%s%%res = scf.for %%kt = %s to %s step %s iter_args(%%acc = %%zacc) -> "
                   "(%s) {\n",
                   e->indent, ty, e->indent, c0.s, ckt.s, c1.s, ty);
  int outer = e->count;
  e->indent = "        ";
  name_t st = keep(remc(e, "%kt", s->stages));
  if (s->tma) {
    // Tile kt is the (kt / STAGES)-th fill of its stage: that phase's
    // parity.
    name_t ph = keep(remc(e, divc(e, "%kt", s->stages), 2));
    int v = e->next++;
    kiln_sbuf_printf(&b,
                     "%s%%ph%d = arith.index_cast %s : index to i32\n"
                     "%s%%pb%d = arith.trunci %%ph%d : i32 to i1\n"
                     "%snvgpu.mbarrier.try_wait.parity %%mb[%s], %%pb%d, %s : %s\n"
                     "%sgpu.barrier\n",
                     e->indent, v, ph.s, e->indent, v, v, e->indent, st.s, v,
                     cst(e, 10000000), mb, e->indent);
  } else
    kiln_sbuf_printf(&b,
                     "%snvgpu.device_async_wait %s {numGroups = %d : i32}\n"
                     "%snvvm.fence.proxy {kind = #nvvm.proxy_kind<async.shared>, space = "
                     "#nvvm.shared_space<cta>}\n"
                     "%sgpu.barrier\n",
                     e->indent, g0, s->stages - 3, e->indent, e->indent);
  name_t aaddr = keep(bin(e, "addi", a_wg.s, mulc(e, st.s, a_stage)));
  name_t baddr = keep(bin(e, "addi", b0.s, mulc(e, st.s, b_stage)));
  kiln_sbuf_printf(&b, "%snvvm.wgmma.fence.aligned\n", e->indent);
  char cur[16];
  snprintf(cur, sizeof(cur), "%%acc");
  for (int kk = 0; kk < WG_BK / 16; ++kk) {
    // k16 step kk: 32 bytes along A's rows, 16 rows (2048 bytes) of B.
    name_t da = wg_desc(e, addc(e, aaddr.s, kk * 32), wg_desc_bits(16, 1024));
    // (K-major B: 32 bytes along its rows, as A.)
    name_t db = s->bt ? wg_desc(e, addc(e, baddr.s, kk * 32), wg_desc_bits(16, 1024))
                      : wg_desc(e, addc(e, baddr.s, kk * 2048),
                                wg_desc_bits((uint64_t)WG_BK * 128, 1024));
    char d[16];
    snprintf(d, sizeof(d), "%%w%d", e->next++);
    kiln_sbuf_printf(&b,
                     "%s%s = nvvm.wgmma.mma_async %s, %s, %s, #nvvm.shape<m = 64, n = %d, "
                     "k = 16>, D [<f32>, #nvvm.wgmma_scale_out<one>], A [<%s>, "
                     "#nvvm.wgmma_scale_in<one>, <row>], B [<%s>, "
                     "#nvvm.wgmma_scale_in<one>, <%s>] : %s -> %s\n",
                     e->indent, d, da.s, db.s, cur, s->bn, el, el, s->bt ? "col" : "row", ty,
                     ty);
    memcpy(cur, d, sizeof(cur));
  }
  kiln_sbuf_printf(&b, "%snvvm.wgmma.commit.group.sync.aligned\n", e->indent);
  // The refill, while the tensor cores work.
  name_t ahead = keep(addc(e, "%kt", s->stages - 2));
  name_t ld_stage = keep(remc(e, ahead.s, s->stages));
  if (s->tma) {
    // Only tiles that exist: every armed mbarrier phase is waited for
    // before the loop ends, so no copy is in flight when the pipeline's
    // memory becomes the output tile.
    int v = e->next++;
    kiln_sbuf_printf(&b,
                     "%s%%more%d = arith.cmpi ult, %s, %s : index\n"
                     "%s%%go%d = arith.andi %s, %%more%d : i1\n"
                     "%sscf.if %%go%d {\n",
                     e->indent, v, ahead.s, cst(e, kt_count), e->indent, v, t0.s, v,
                     e->indent, v);
    int saved = e->count;
    e->indent = "          ";
    wg_issue_tma(e, s, &row0, &col0, &pad, ahead.s, ld_stage.s);
    e->indent = "        ";
    e->count = saved;
    kiln_sbuf_printf(&b, "%s}\n", e->indent);
  } else {
    name_t ld_tile = keep(bin(e, "minui", ahead.s, cst(e, kt_count - 1)));
    wg_issue(e, s, &row0, &col0, ld_tile.s, ld_stage.s, ta, tb, tsa, tsb, g);
  }
  kiln_sbuf_printf(&b,
                   "%snvvm.wgmma.wait.group.sync.aligned 1\n"
                   "%sscf.yield %s : %s\n      }\n",
                   e->indent, e->indent, cur, ty);
  e->indent = "      ";
  e->count = outer;
  kiln_sbuf_printf(&b, "%snvvm.wgmma.wait.group.sync.aligned 0\n", e->indent);
  if (!s->tma)
    kiln_sbuf_printf(&b, "%snvgpu.device_async_wait %s {numGroups = 0 : i32}\n",
                     e->indent, g0);
  // The outputs go through shared memory (the pipeline's, now idle) so
  // that global stores are whole 16-byte vectors along rows. Accumulator i
  // of a thread: row 16 w + lane / 4 (+ 8 for i % 4 >= 2) of its
  // warpgroup's 64, column 8 (i / 4) + 2 (lane % 4) + (i % 2). Rows are
  // padded by 16 bytes: a warp's pairs fall in 32 distinct banks.
  const char *staged = ep ? NULL : round;  // rounded as they are staged
  const char *et = staged ? staged : "f32";
  int esz = staged ? 2 : 4, per16 = 16 / esz, ld = s->bn + per16;
  char tso[96];
  snprintf(tso, sizeof(tso), "memref<%dx%dx%s, %s>", bm, ld, et, ws);
  kiln_sbuf_printf(&b, "%sgpu.barrier\n%s%%sO = memref.view %%dsm[%s][] : %s to %s\n",
                   e->indent, e->indent, pad.s, tsm, tso);
  name_t wl = keep(remc(e, "%tx", 128));
  name_t warp = keep(divc(e, wl.s, 32)), lane = keep(remc(e, wl.s, 32));
  name_t wrow = keep(bin(e, "addi", mulc(e, wgi.s, 64),
                         bin(e, "addi", mulc(e, warp.s, 16), divc(e, lane.s, 4))));
  name_t tcol = keep(mulc(e, remc(e, lane.s, 4), 2));
  for (int i = 0; i < s->bn / 8; ++i)
    for (int h = 0; h < 2; ++h) {
      name_t row = keep(addc(e, wrow.s, 8 * h));
      name_t col = keep(addc(e, tcol.s, 8 * i));
      int v = e->next++, x = 4 * i + 2 * h;
      kiln_sbuf_printf(&b,
                       "%s%%e%da = llvm.extractvalue %%res[%d] : %s\n"
                       "%s%%e%db = llvm.extractvalue %%res[%d] : %s\n"
                       "%s%%e%d = vector.from_elements %%e%da, %%e%db : vector<2xf32>\n",
                       e->indent, v, x, ty, e->indent, v, x + 1, ty, e->indent, v, v, v);
      store_pair(e, v, staged, "%sO", row.s, col.s, tso);
    }
  kiln_sbuf_printf(&b, "%sgpu.barrier\n", e->indent);
  int per_row = s->bn / per16;  // 16-byte vectors in a row
  for (int i = 0; i < bm * per_row / nt; ++i) {
    name_t q = keep(addc(e, "%tx", (int64_t)i * nt));
    name_t r = keep(divc(e, q.s, per_row));
    name_t c = keep(mulc(e, remc(e, q.s, per_row), per16));
    name_t gr = keep(bin(e, "addi", row0.s, r.s));
    name_t gc = keep(bin(e, "addi", col0.s, c.s));
    int v = e->next++;
    kiln_sbuf_printf(&b, "%s%%o%d = vector.load %%sO[%s, %s] : %s, vector<%dx%s>\n",
                     e->indent, v, r.s, c.s, tso, per16, et);
    if (!ep) {
      kiln_sbuf_printf(&b, "%svector.store %%o%d, %%C[%s, %s] : %s, vector<%dx%s>\n",
                       e->indent, v, gr.s, gc.s, tc, per16, et);
      continue;
    }
    // The epilogue, element by element, on vectors of the other inputs.
    for (int in = 0; in < ep->n_in; ++in)
      if (in != ep->c_pos) {
        if (ep->row[in])
          kiln_sbuf_printf(&b, "%s%%o%dx%d = vector.load %%E%d[%s] : %s, vector<%dx%s>\n",
                           e->indent, v, in, in, gc.s, te[in], per16, ep->elt[in]);
        else
          kiln_sbuf_printf(&b,
                           "%s%%o%dx%d = vector.load %%E%d[%s, %s] : %s, vector<%dx%s>\n",
                           e->indent, v, in, in, gr.s, gc.s, te[in], per16, ep->elt[in]);
      }
    for (int j = 0; j < per16; ++j) {
      for (int in = 0; in < ep->n_in; ++in) {
        const char *t = in == ep->c_pos ? "f32" : ep->elt[in];
        char src[32];
        if (in == ep->c_pos)
          snprintf(src, sizeof(src), "%%o%d", v);
        else
          snprintf(src, sizeof(src), "%%o%dx%d", v, in);
        kiln_sbuf_printf(&b, "%s%%o%de%d_%d = vector.extract %s[%d] : %s from vector<%dx%s>\n",
                         e->indent, v, in, j, src, j, t, per16, t);
      }
      kiln_sbuf_printf(&b, "%s%%o%dy%d = func.call @kiln_epilogue(", e->indent, v, j);
      for (int in = 0; in < ep->n_in; ++in)
        kiln_sbuf_printf(&b, "%s%%o%de%d_%d", in ? ", " : "", v, in, j);
      kiln_sbuf_puts(&b, ") : (");
      for (int in = 0; in < ep->n_in; ++in)
        kiln_sbuf_printf(&b, "%s%s", in ? ", " : "", in == ep->c_pos ? "f32" : ep->elt[in]);
      kiln_sbuf_printf(&b, ") -> %s\n", ep->out);
    }
    kiln_sbuf_printf(&b, "%s%%o%dv = vector.from_elements ", e->indent, v);
    for (int j = 0; j < per16; ++j) kiln_sbuf_printf(&b, "%s%%o%dy%d", j ? ", " : "", v, j);
    kiln_sbuf_printf(&b,
                     " : vector<%dx%s>\n"
                     "%svector.store %%o%dv, %%C[%s, %s] : %s, vector<%dx%s>\n",
                     per16, ep->out, e->indent, v, gr.s, gc.s, tc, per16, ep->out);
  }
  kiln_sbuf_printf(&b, "%sgpu.terminator\n    }\n  return\n}\n", e->indent);
  if (ep) {
    kiln_sbuf_puts(&b, "func.func private @kiln_epilogue(");
    for (int in = 0; in < ep->n_in; ++in)
      kiln_sbuf_printf(&b, "%s%s", in ? ", " : "", in == ep->c_pos ? "f32" : ep->elt[in]);
    kiln_sbuf_printf(&b, ") -> %s\n", ep->out);
  }
  kiln_sbuf_free(&acc);
  free(e);
  return kiln_sbuf_take(&b);
}

// sm_90's shape for M x N x K (M a multiple of 128, N of 128, K of 64):
// 2 warpgroups of 64 x BN, BN 256 where N allows (128 accumulators a
// thread, 199 registers, no spills), 4 stages (193 KB of shared memory at
// BN 256). Measured on the H100 at 4096^3 (docs/gpu.md): 128 x 256 blocks
// in 4 stages 0.296 ms, 128 x 128 in 4 stages 0.386 ms, in 5 stages
// 0.331 ms, 128 x 256 in 3 stages 0.429 ms (before the refill moved
// behind the wgmma issue and the stores through shared memory: 0.25 ms).
// These are lib/autotune's heuristic for KILN_KERNEL_GPU_MMA; `tc` (from
// gpu_mma_tiles) carries the block columns, stages and group.
static wg_shape_t wg_choose(int64_t m, int64_t n, int64_t k, bool bt, const char *el,
                            const kiln_tile_config_t *tc) {
  wg_shape_t s = {m,  n, k, 2, (int)tc->reg[1], (int)tc->cache[2], (int)tc->forall[0],
                  bt, kiln_kernels_tma_applies(), el};
  return s;
}

// The block shape for M x N x K (whole 128 x 128 x 32 tiles): blocks of
// 128 x 128 outputs, 4 warps of 64 x 64, K steps of 32 in 3 stages (48 KB of
// shared memory, 234 registers, no spills); groups of up to 8 block rows.
// Measured on the H200 at 4096^3 against other shapes of the same template:
// 8 warps of 64 x 32 0.378 ms, 128 x 256 blocks 0.390 ms, 2 stages with
// padded rows 0.504 ms.
static mma_shape_t choose(int64_t m, int64_t n, int64_t k, const char *el,
                          const kiln_tile_config_t *tc) {
  mma_shape_t s = {m, n, k, 128, 128, 32, 64, 64, (int)tc->cache[2], (int)tc->forall[0], el};
  return s;
}

// The kernel's shape, asked of `tiling` (the heuristic, the tuning
// database or a measured candidate), else the heuristic's. The kernel's
// identity for the tuning database is its sizes, form, operand type (f16
// named; bf16 kept as it was before f16 existed) and epilogue.
static void gpu_mma_tiles(const kiln_kernel_tiling_t *tiling, int64_t m, int64_t n, int64_t k,
                          bool wgmma, bool bt, const char *el, const char *round,
                          const epilogue_t *ep, kiln_tile_config_t *out) {
  kiln_kernel_desc_t kd;
  memset(&kd, 0, sizeof(kd));
  kd.kind = KILN_KERNEL_GPU_MMA;
  kd.loop_count = 3;
  kd.range[0] = m;
  kd.range[1] = n;
  kd.range[2] = k;
  kd.reduction_mask = 1u << 2;
  kd.m_dim = 0;
  kd.n_dim = 1;
  kd.transpose_dim = -1;
  kd.elem_bytes = 2;
  kd.wgmma = wgmma;
  char id[224];
  // An epilogue's types where f16 is among them (ids without f16 stay as
  // they were).
  char ept[64] = "";
  bool ep16 = ep && strcmp(ep->out, "f16") == 0;
  for (int i = 0; ep && i < ep->n_in; ++i) ep16 |= i != ep->c_pos && !strcmp(ep->elt[i], "f16");
  for (int i = 0, at = 0; ep16 && i <= ep->n_in && at < (int)sizeof(ept); ++i)
    at += snprintf(ept + at, sizeof(ept) - (size_t)at, "%s%s", i ? "," : " epi_types=",
                   i == ep->n_in ? ep->out : i == ep->c_pos ? "acc" : ep->elt[i]);
  snprintf(id, sizeof(id), "gpu_mma m=%lld n=%lld k=%lld wgmma=%d out=%s epi=%d%s%s%s%s",
           (long long)m, (long long)n, (long long)k, wgmma, round ? round : "f32",
           ep ? ep->n_in : -1, bt ? " bt" : "",
           wgmma && kiln_kernels_tma_applies() ? " tma" : "",
           strcmp(el, "f16") == 0 ? " f16" : "", ept);
  kiln_cpu_target_t none = {0, 0, 1, 0, 0};
  kiln_kernel_tiles(tiling, &none, id, &kd, out);
}

typedef struct {
  MlirContext ctx;
  MlirOperation found[256];
  int count;
  MlirOperation round[256];  // kiln.gpu_mma_epilogue generics
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
  if (tag(op, "kiln.gpu_mma_epilogue") >= 0 && f->round_count < 256)
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

// The body of `g` (an epilogue generic) in place of each call to
// @kiln_epilogue under `root`: its ops cloned before the call with block
// argument i read as the call's operand i, the call's result the yielded
// value.
typedef struct {
  MlirOperation calls[4096];
  int count;
} call_finder_t;

static MlirWalkResult find_calls(MlirOperation op, void *user) {
  call_finder_t *f = user;
  if (kiln_gpu_op_named(op, "func.call") && f->count < 4096) {
    MlirAttribute callee = mlirOperationGetAttributeByName(
        op, mlirStringRefCreateFromCString("callee"));
    MlirStringRef name = mlirAttributeIsNull(callee)
                             ? mlirStringRefCreateFromCString("")
                             : mlirSymbolRefAttrGetRootReference(callee);
    if (name.length == 13 && memcmp(name.data, "kiln_epilogue", 13) == 0)
      f->calls[f->count++] = op;
  }
  return MlirWalkResultAdvance;
}

static kiln_status_t fold_epilogue(MlirOperation root, MlirOperation g) {
  call_finder_t *f = calloc(1, sizeof(*f));
  if (!f) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "epilogue");
  mlirOperationWalk(root, find_calls, f, MlirWalkPreOrder);
  MlirBlock body = mlirRegionGetFirstBlock(mlirOperationGetRegion(g, 0));
  MlirOperation yield = mlirBlockGetTerminator(body);
  intptr_t nargs = mlirBlockGetNumArguments(body);
  int nops = 0;
  for (MlirOperation op = mlirBlockGetFirstOperation(body); !mlirOperationEqual(op, yield);
       op = mlirOperationGetNextInBlock(op))
    ++nops;
  MlirValue *from = calloc((size_t)(nargs + nops) + 1, sizeof(MlirValue));
  MlirValue *to = calloc((size_t)(nargs + nops) + 1, sizeof(MlirValue));
  kiln_status_t s = NULL;
  if (!from || !to) s = kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "epilogue");
  for (int c = 0; !s && c < f->count; ++c) {
    MlirOperation call = f->calls[c];
    int n = 0;
    for (intptr_t i = 0; i < nargs - 1; ++i) {  // not the output's old value
      from[n] = mlirBlockGetArgument(body, i);
      to[n++] = mlirOperationGetOperand(call, i);
    }
    for (MlirOperation op = mlirBlockGetFirstOperation(body); !mlirOperationEqual(op, yield);
         op = mlirOperationGetNextInBlock(op)) {
      MlirOperation clone = mlirOperationClone(op);
      for (intptr_t k = 0; k < mlirOperationGetNumOperands(clone); ++k)
        for (int m = 0; m < n; ++m)
          if (mlirValueEqual(mlirOperationGetOperand(op, k), from[m])) {
            mlirOperationSetOperand(clone, k, to[m]);
            break;
          }
      mlirBlockInsertOwnedOperationBefore(mlirOperationGetBlock(call), call, clone);
      from[n] = mlirOperationGetResult(op, 0);
      to[n++] = mlirOperationGetResult(clone, 0);
    }
    MlirValue y = mlirOperationGetOperand(yield, 0);
    for (int m = 0; m < n; ++m)
      if (mlirValueEqual(y, from[m])) y = to[m];
    mlirValueReplaceAllUsesOfWith(mlirOperationGetResult(call, 0), y);
    mlirOperationDestroy(call);
  }
  free(from);
  free(to);
  free(f);
  return s;
}

// True when `g` (a kiln.gpu_mma_epilogue generic) only rounds C (to bf16
// or f16: its output's type).
static bool only_rounds(MlirOperation g) {
  if (mlirOperationGetNumOperands(g) != 2) return false;
  MlirBlock body = mlirRegionGetFirstBlock(mlirOperationGetRegion(g, 0));
  MlirOperation first = mlirBlockGetFirstOperation(body);
  return kiln_gpu_op_named(first, "arith.truncf") &&
         mlirOperationEqual(mlirOperationGetNextInBlock(first), mlirBlockGetTerminator(body));
}

// Makes `v` available before `op`: nothing to do where it already is (a
// function argument, a value defined in another block or before `op`),
// else `v` must be a memref.alloc without operands in `op`'s block, which
// moves before `op`. False where it cannot.
static bool hoist_alloc(MlirValue v, MlirOperation op) {
  if (!mlirValueIsAOpResult(v)) return true;
  MlirOperation def = mlirOpResultGetOwner(v);
  if (!mlirBlockEqual(mlirOperationGetBlock(def), mlirOperationGetBlock(op)) ||
      mlirOperationIsBeforeInBlock(def, op))
    return true;
  if (!kiln_gpu_op_named(def, "memref.alloc") || mlirOperationGetNumOperands(def) != 0)
    return false;
  mlirOperationMoveBefore(def, op);
  return true;
}

// The name of a float element type the kernels read or write, or NULL.
static const char *float_name(MlirType t) {
  return mlirTypeIsABF16(t) ? "bf16" : mlirTypeIsAF16(t) ? "f16" : mlirTypeIsAF32(t) ? "f32"
                                                                                      : NULL;
}

// Replaces `mm` (linalg.matmul on memrefs, bf16 or f16 operands) by the
// kernel's gpu.launch; with `round` (its kiln.gpu_mma_epilogue generic
// reading C and writing an [M, N] buffer), the kernel stores there,
// through the generic's body when it does more than round to bf16 or f16
// (wgmma only), and C is gone.
static kiln_status_t replace(MlirContext ctx, MlirOperation mm, MlirOperation round,
                             int sm, const kiln_kernel_tiling_t *tiling, bool *done,
                             bool *wgmma) {
  *done = false;
  *wgmma = false;
  if (mlirOperationGetNumOperands(mm) != 3) return NULL;
  MlirValue a = mlirOperationGetOperand(mm, 0), bv = mlirOperationGetOperand(mm, 1),
            cv = mlirOperationGetOperand(mm, 2);
  MlirType at = mlirValueGetType(a), bt = mlirValueGetType(bv);
  if (!mlirTypeIsAMemRef(at) || !mlirTypeIsAMemRef(bt) ||
      !mlirShapedTypeHasStaticShape(at) || !mlirShapedTypeHasStaticShape(bt))
    return NULL;
  // B as [K, N], or as [N, K] (b_t: a linear's weight, warpgroup MMA only).
  int form = kiln_gpu_matmul_lhs_form(mm);
  if (form != 0 && form != 2) return NULL;
  bool b_t = form == 2;
  int64_t m = mlirShapedTypeGetDimSize(at, 0), k = mlirShapedTypeGetDimSize(at, 1),
          n = mlirShapedTypeGetDimSize(bt, b_t ? 0 : 1);
  MlirType f32 = mlirF32TypeGet(ctx), et = mlirShapedTypeGetElementType(at);
  const char *el = mlirTypeIsABF16(et) ? "bf16" : mlirTypeIsAF16(et) ? "f16" : NULL;
  if (!el) return NULL;
  // The kernel overwrites C: only where C is zero-filled just before.
  MlirOperation fill = kiln_gpu_zero_fill(mm, cv);
  if (!kiln_gpu_whole_matrix(at, m, k, et) ||
      !kiln_gpu_whole_matrix(bt, b_t ? n : k, b_t ? k : n, et) ||
      !kiln_gpu_whole_matrix(mlirValueGetType(cv), m, n, f32) || m % 128 ||
      n % 128 || k % 32 || mlirOperationIsNull(fill))
    return NULL;
  // wgmma is sm_90a's (not later architectures'); KILN_GPU_WGMMA=0 keeps
  // mma.sync there.
  *wgmma = kiln_kernels_wgmma_applies(sm, k);
  if (b_t && !*wgmma) return NULL;
  // The consumer on whole buffers: ins(..., C, ...) outs(O), O [M, N],
  // after the matmul in its block, nothing between them touching its
  // buffers; its other inputs whole [M, N] or [N] buffers.
  MlirValue out = cv;
  const char *rounded = NULL;  // the type C is rounded to as it is stored
  bool folded = false;
  epilogue_t ep = {0};
  intptr_t nops = mlirOperationIsNull(round) ? 0 : mlirOperationGetNumOperands(round);
  bool usable = nops >= 2 && nops - 1 <= KILN_EPILOGUE_MAX_INPUTS &&
                mlirOperationGetNumResults(round) == 0 &&
                mlirBlockEqual(mlirOperationGetBlock(round), mlirOperationGetBlock(mm)) &&
                mlirOperationIsBeforeInBlock(mm, round);
  ep.n_in = (int)nops - 1;
  ep.c_pos = -1;
  for (intptr_t i = 0; usable && i < nops; ++i) {
    MlirValue v = mlirOperationGetOperand(round, i);
    MlirType t = mlirValueGetType(v);
    usable = !kiln_gpu_used_between(mm, round, v);
    MlirType e = mlirTypeIsAMemRef(t) ? mlirShapedTypeGetElementType(t) : f32;
    const char *name = float_name(e);
    usable = usable && name;
    if (i == nops - 1) {
      usable = usable && kiln_gpu_whole_matrix(t, m, n, e);
      ep.out = name;
    } else if (mlirValueEqual(v, cv)) {
      usable = usable && ep.c_pos < 0;
      ep.c_pos = (int)i;
    } else {
      ep.elt[i] = name;
      ep.row[i] = mlirTypeIsAMemRef(t) && mlirShapedTypeGetRank(t) == 1;
      MlirAttribute layout = ep.row[i] ? mlirMemRefTypeGetLayout(t) : (MlirAttribute){NULL};
      usable = usable && (ep.row[i] ? mlirShapedTypeHasStaticShape(t) &&
                                          mlirShapedTypeGetDimSize(t, 0) == n &&
                                          mlirTypeEqual(mlirShapedTypeGetElementType(t), e) &&
                                          (mlirAttributeIsNull(layout) ||
                                           (mlirAttributeIsAAffineMap(layout) &&
                                            mlirAffineMapIsIdentity(
                                                mlirAffineMapAttrGetValue(layout))))
                                    : kiln_gpu_whole_matrix(t, m, n, e));
    }
  }
  usable = usable && ep.c_pos >= 0;
  if (usable && only_rounds(round) && ep.c_pos == 0 && strcmp(ep.out, "f32") != 0) {
    out = mlirOperationGetOperand(round, 1);
    rounded = ep.out;
    folded = true;
  } else if (usable && *wgmma) {
    out = mlirOperationGetOperand(round, nops - 1);
    folded = true;
  }
  bool general = folded && !rounded;
  // The kernel goes where the matmul is, and stores into `out`: a buffer
  // allocated after the matmul (the rounded result of one GEMM that feeds
  // another) is allocated before it instead.
  if (folded && !hoist_alloc(out, mm)) return NULL;
  char *text;
  kiln_tile_config_t tc;
  gpu_mma_tiles(tiling, m, n, k, *wgmma, b_t, el, rounded, general ? &ep : NULL, &tc);
  if (*wgmma) {
    wg_shape_t w = wg_choose(m, n, k, b_t, el, &tc);
    text = wgmma_text(&w, rounded, general ? &ep : NULL);
  } else {
    mma_shape_t s = choose(m, n, k, el, &tc);
    text = kernel_text(&s, rounded);
  }
  if (!text) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "mma kernel");
  MlirValue args[3 + KILN_EPILOGUE_MAX_INPUTS];
  int nargs = 0;
  args[nargs++] = a;
  args[nargs++] = bv;
  args[nargs++] = out;
  for (int i = 0; general && i < ep.n_in; ++i)
    if (i != ep.c_pos) args[nargs++] = mlirOperationGetOperand(round, i);
  // Constants the epilogue's body reads must come before the kernel.
  if (general) {
    MlirBlock body = mlirRegionGetFirstBlock(mlirOperationGetRegion(round, 0));
    for (MlirOperation op = mlirBlockGetFirstOperation(body); !mlirOperationIsNull(op);
         op = mlirOperationGetNextInBlock(op))
      for (intptr_t k2 = 0; k2 < mlirOperationGetNumOperands(op); ++k2) {
        MlirValue v = mlirOperationGetOperand(op, k2);
        if (!mlirValueIsAOpResult(v)) continue;
        MlirOperation d = mlirOpResultGetOwner(v);
        if (mlirBlockEqual(mlirOperationGetBlock(d), mlirOperationGetBlock(mm)) &&
            mlirOperationIsBeforeInBlock(mm, d))
          mlirOperationMoveBefore(d, mm);
      }
  }
  MlirOperation parent = mlirOperationGetParentOperation(mm);
  kiln_status_t st = kiln_gpu_splice(ctx, text, mm, args, nargs, "tensor-core GEMM");
  free(text);
  if (!st && general) st = fold_epilogue(parent, round);
  if (st) return st;
  mlirOperationDestroy(fill);
  if (folded) {
    mlirOperationDestroy(round);
    erase_if_dead(cv);
  }
  *done = true;
  return NULL;
}

kiln_status_t kiln_kernels_mma_gpu(MlirContext ctx, MlirModule module, int sm,
                                   const kiln_kernel_tiling_t *tiling,
                                   int *out_count, int *out_wgmma) {
  *out_count = 0;
  *out_wgmma = 0;
  finder_t *f = calloc(1, sizeof(*f));
  if (!f) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "mma kernels");
  f->ctx = ctx;
  mlirOperationWalk(mlirModuleGetOperation(module), find, f, MlirWalkPreOrder);
  kiln_status_t s = NULL;
  for (int i = 0; !s && i < f->count; ++i) {
    MlirOperation round = {NULL};
    for (int j = 0; j < f->round_count; ++j)
      if (!mlirOperationIsNull(f->round[j]) &&
          tag(f->round[j], "kiln.gpu_mma_epilogue") == tag(f->found[i], "kiln.gpu_mma")) {
        round = f->round[j];
        // replace() may destroy it (folded): never read again.
        f->round[j] = (MlirOperation){NULL};
      }
    bool done = false, wgmma = false;
    s = replace(ctx, f->found[i], round, sm, tiling, &done, &wgmma);
    *out_count += done && !wgmma;
    *out_wgmma += done && wgmma;
  }
  free(f);
  return s;
}
