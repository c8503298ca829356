// Tile-size heuristic, search space, measured search and tuning database.
#include "lib/autotune/autotune.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

// Work below which a kernel runs on one thread: opening a parallel region
// costs microseconds, more than small elementwise ops or reductions take (a
// GPT backward graph of 134 small ops lost ~1 ms to fork/join alone).
#define KILN_MIN_PARALLEL_WORK 65536.0

double kiln_kernel_work(const kiln_kernel_desc_t *d) {
  double w = 1;
  for (int i = 0; i < d->loop_count; ++i)
    w *= (double)(d->range[i] > 0 ? d->range[i] : 1);
  return w;
}

static bool is_reduction(const kiln_kernel_desc_t *d, int i) {
  return (d->reduction_mask >> i) & 1u;
}

static bool is_dynamic(const kiln_kernel_desc_t *d, int i) {
  return (d->dynamic_mask >> i) & 1u;
}

// Lanes of one vector register for the computation's element type.
static int64_t lanes(const kiln_kernel_desc_t *d, const kiln_cpu_target_t *t) {
  int64_t eb = d->elem_bytes > 0 ? d->elem_bytes : 4;
  int64_t n = t->vector_bytes / eb;
  return n > 0 ? n : 1;
}

// Largest of `choices` (descending, ending with 1) that divides `n`.
static int64_t pick(int64_t n, const int64_t *choices, int count) {
  for (int i = 0; i < count; ++i)
    if (choices[i] > 0 && n % choices[i] == 0) return choices[i];
  return 1;
}

// Largest power of two ≤ `cap` dividing `n`.
static int64_t pow2_divisor(int64_t n, int64_t cap) {
  int64_t p = 1;
  while (p * 2 <= cap && n % (p * 2) == 0) p *= 2;
  return p;
}

// Largest multiple of `unit` that divides `n` and is at most `cap`; `n`
// itself when there is none (or `n` is within the cap).
static int64_t block_divisor(int64_t n, int64_t unit, int64_t cap) {
  if (n <= cap || unit <= 0 || n % unit) return n;
  for (int64_t x = cap / unit * unit; x >= unit; x -= unit)
    if (n % x == 0) return x;
  return n;
}

// Vector registers a contraction's register tile keeps live: the
// accumulators, one row of B, one broadcast of A.
static int64_t contraction_registers(const kiln_kernel_desc_t *d,
                                     const kiln_cpu_target_t *t, int64_t rm,
                                     int64_t rn) {
  int64_t l = lanes(d, t);
  int64_t nv = (rn + l - 1) / l;
  return rm * nv + nv + 1;
}

// The extent a tile at a level works within: the size of the enclosing
// level's tile, or the whole range.
static int64_t enclosing(const kiln_kernel_desc_t *d,
                         const kiln_tile_config_t *c, int level, int i) {
  if (level > 1 && c->cache[i] > 0) return c->cache[i];
  if (level > 0 && c->forall[i] > 0) return c->forall[i];
  return d->range[i];
}

// The first parallel loop with more than one tile of size `size[i]`, when
// the nest has the work to pay for threads; -1 otherwise.
static int forall_dim(const kiln_kernel_desc_t *d, const int64_t *size) {
  if (d->nested || kiln_kernel_work(d) < KILN_MIN_PARALLEL_WORK) return -1;
  for (int i = 0; i < d->loop_count; ++i)
    if (!is_reduction(d, i) && size[i] > 0 && d->range[i] > size[i]) return i;
  return -1;
}

static void init_config(const kiln_kernel_desc_t *d, kiln_tile_config_t *c) {
  memset(c, 0, sizeof(*c));
  c->loop_count = d->loop_count;
  c->reduction_dim = -1;
}

// A contraction whose output tiles may be partial: a plain matmul's three
// loops, or a batched one's four (no convolution taps folded into sums).
// Batched: a ViT's 197 tokens made q @ k^T [6, 197, 64] x [6, 64, 197] one
// scalar FMA per tile (1 x 1 tiles, the only divisors of 197), 4 ms of its
// 32 ms layer stack.
static bool ragged_contraction(const kiln_kernel_desc_t *d) {
  if (d->kind != KILN_KERNEL_CONTRACTION || d->sum_maps || d->m_dim < 0 || d->n_dim < 0)
    return false;
  if (d->loop_count == 3) return true;
  // One batch loop besides m, n and the reduction.
  int batch = 0;
  for (int i = 0; i < d->loop_count; ++i)
    if (!is_reduction(d, i) && i != d->m_dim && i != d->n_dim) batch++;
  return d->loop_count == 4 && batch == 1 && __builtin_popcount(d->reduction_mask) == 1;
}

static void heuristic_contraction(const kiln_kernel_desc_t *d,
                                  const kiln_cpu_target_t *t,
                                  kiln_tile_config_t *c) {
  int m = d->m_dim, n = d->n_dim;
  int64_t l = lanes(d, t);
  for (int i = 0; i < d->loop_count; ++i) c->reg[i] = 1;
  // Register tile: the widest N (in whole vectors, up to two) and then the
  // tallest M whose accumulators fit the register file.
  int64_t rn = pick(d->range[n], (int64_t[]){2 * l, l, 8, 4, 2, 1}, 6);
  // A static N with no whole-vector divisor (1000 = 8 x 125) still gets two
  // vectors: the schedule peels the partial last tile, which vectorizes at
  // its own static width. (Dividing tiles only gave N = 1000 a tile of 8
  // lanes: a [256, 2048] x [2048, 1000] matmul ran 3.6x slower than eager.)
  bool ragged_n = ragged_contraction(d) && !is_dynamic(d, n) && rn < l &&
                  d->range[n] > 2 * l;
  if (ragged_n) rn = 2 * l;
  int64_t rm = 1;
  for (int64_t cand = 16; cand >= 1; cand /= 2)
    if (d->range[m] % cand == 0 &&
        contraction_registers(d, t, cand, rn) <= t->vector_registers) {
      rm = cand;
      break;
    }
  // The same for M (a batch of 500 rows got 4-row tiles).
  bool ragged_m = false;
  if (ragged_contraction(d) && !is_dynamic(d, m) && rm < 8 && d->range[m] > 8)
    for (int64_t cand = 16; cand > rm; cand /= 2)
      if (contraction_registers(d, t, cand, rn) <= t->vector_registers &&
          cand < d->range[m]) {
        rm = cand;
        ragged_m = true;
        break;
      }
  // A convolution's grid with no even width (one or three output columns:
  // P = 1, 9, 15) gets no register tile of its filters either: with one
  // pixel a tile the vector runs along the filters, not the output's
  // innermost dim, and after the schedule folds the tile's unit dims MLIR
  // 22's vector code wrote only the first lane of each vector (a 1x1
  // convolution on a 1x1 map, a 3x3 one on 3x3: wrong results). Such
  // grids are small; translate.py gives 1x1 ones a matmul.
  if (d->sum_maps && rn == 1) rm = 1;
  c->reg[m] = rm;
  c->reg[n] = rn;
  if (d->nested || kiln_kernel_work(d) < KILN_MIN_PARALLEL_WORK) return;
  // Distribution: batch loops first (one tile each) when there are enough
  // batches for the threads.
  int64_t batch_tiles = 1;
  for (int i = 0; i < d->loop_count; ++i)
    if (!is_reduction(d, i) && i != m && i != n && d->range[i] >= t->threads) {
      c->forall[i] = 1;
      batch_tiles = d->range[i];
      break;
    }
  // Then 2-D blocks of the output, GotoBLAS-like without packing: a block
  // of up to 512 columns and 128 rows per thread tile; a thread walks K in
  // blocks (below) so the K x 512 slab of B it streams stays in L2 while
  // its rows go by in register tiles. Batched contractions (a convolution's
  // batch) get column blocks too: a whole [K, N] slab per batch (576 x 3136
  // for a 3x3 layer) was streamed from memory once per register row. (A
  // direct convolution reduces over three loops, c, kh and kw, and gets no
  // K blocks: a thread's block of input rows stays in L2 as it is.)
  int64_t nc = block_divisor(d->range[n], rn, 512);
  if (ragged_n && d->range[n] > 512) {
    // Column blocks of whole register tiles, the last one partial.
    int64_t blocks = (d->range[n] + 511) / 512;
    nc = ((d->range[n] + blocks - 1) / blocks + rn - 1) / rn * rn;
  }
  int64_t mc = d->range[m];
  int64_t col_tiles = (d->range[n] + nc - 1) / nc;
  if (ragged_m || (ragged_n && batch_tiles == 1)) {
    // Row blocks of whole register tiles (the last one partial): enough
    // for the threads, at most 128 rows.
    int64_t want = t->threads > col_tiles ? (t->threads + col_tiles - 1) / col_tiles : 1;
    int64_t tiles = (d->range[m] + 127) / 128;
    if (tiles < want) tiles = want;
    int64_t rows = ((d->range[m] + tiles - 1) / tiles + rm - 1) / rm * rm;
    if (batch_tiles == 1 && rows < d->range[m]) mc = rows;
  }
  while (batch_tiles == 1 && mc > rm && mc % 2 == 0 && (mc / 2) % rm == 0 &&
         (mc > 128 || ((d->range[m] + mc - 1) / mc) * col_tiles < t->threads))
    mc /= 2;
  if (mc < d->range[m]) c->forall[m] = mc;
  if (nc < d->range[n]) c->forall[n] = nc;
  if (batch_tiles == 1 && !c->forall[m] && !c->forall[n])
    return;  // one tile: no threads
  // Cache block of the reduction when a thread's slab of B outgrows half of
  // L2. Only reduction loops get cache tiles: a cache tile of an output dim
  // would make the vectorizer copy the whole block through one vector.
  int reductions = 0, k = -1;
  for (int i = 0; i < d->loop_count; ++i)
    if (is_reduction(d, i)) reductions++, k = i;
  if (reductions != 1 || is_dynamic(d, k)) return;
  double slab = (double)d->range[k] * (double)nc * d->elem_bytes;
  if (slab <= (double)t->l2_bytes / 2) return;
  int64_t kc = pow2_divisor(d->range[k], 256);
  if (kc >= 64 && kc < d->range[k]) c->cache[k] = kc;
}

// Whether the f32 microkernel can pack A as `c` asks (cache[0], the rows
// a thread block packs per K block): a plain A of static rows, every row
// block and K block whole, the block a multiple of the register tile.
static bool f32_dot_packs_a(const kiln_kernel_desc_t *d, const kiln_tile_config_t *c) {
  const int64_t M = d->range[0], K = d->range[2];
  int64_t rows = c->forall[0] ? c->forall[0] : M, kc = c->cache[2] ? c->cache[2] : K;
  return !is_dynamic(d, 0) && !d->fixed_rows && c->cache[0] == rows && c->reg[0] > 0 &&
         M % rows == 0 && rows % c->reg[0] == 0 && kc > 0 && K % kc == 0;
}

// The f32 microkernel (KILN_KERNEL_F32_DOT): 8 x 32 register tiles (16
// accumulators, two vectors of B and a broadcast of A: half the AVX-512
// register file, which measured as fast as 12- and 14-row tiles in the
// whole GEMM on the Xeon); K in equal blocks of at most 256 (a 32 KiB
// panel of packed B stays in L1 while a block's rows go by); blocks of at
// most 256 rows (their A block, 256 x kc floats, stays in L2), and where
// there are fewer than four row blocks the panels split into groups for
// about four blocks in all (a block streams all of its panels, so fewer,
// taller blocks read B fewer times).
static void heuristic_f32_dot(const kiln_kernel_desc_t *d, const kiln_cpu_target_t *t,
                              kiln_tile_config_t *c) {
  // (Fewer rows where the register file is smaller: the kernel is only
  // emitted for AVX-512, but the answer stays valid for any target.)
  const int64_t M = d->range[0], N = d->range[1], K = d->range[2],
                rm = 2 * 8 + 3 <= t->vector_registers ? 8 : (t->vector_registers - 3) / 2;
  c->reg[0] = rm;
  c->reg[1] = 32;
  c->reg[2] = 1;
  int64_t nkb = (K + 255) / 256, kc = (K + nkb - 1) / nkb;
  c->cache[2] = kc < K ? kc : 0;
  int64_t nbm = 4, pf = N / 32;
  if (!is_dynamic(d, 0)) {
    nbm = (M + 255) / 256;
    int64_t rows = ((M + nbm - 1) / nbm + rm - 1) / rm * rm;
    if (rows < rm) rows = rm;
    c->forall[0] = rows < M ? rows : 0;
  }
  if (nbm < 4 && pf > 1) {
    int64_t ng = (4 + nbm - 1) / nbm < pf ? (4 + nbm - 1) / nbm : pf;
    int64_t pg = (pf + ng - 1) / ng;
    c->forall[1] = pg < pf ? pg * 32 : 0;
  }
  // A packed per K block where its rows are a multiple of 4 KiB apart: an
  // x86 L1D's 64 sets of 64-byte lines repeat every 4 KiB, so the tile's
  // rows of A, read in place, all fall in one set, with the lines of the
  // B panel the tiles keep there. Only where a group spans 16 panels or
  // more, which read the packed block again.
  int64_t rows = c->forall[0] ? c->forall[0] : M, cols = c->forall[1] ? c->forall[1] : pf * 32;
  if (!is_dynamic(d, 0) && !d->fixed_rows && K * d->elem_bytes % 4096 == 0 &&
      cols / 32 >= 16) {
    c->cache[0] = rows;
    if (!f32_dot_packs_a(d, c)) c->cache[0] = 0;
  }
}

// The convolution microkernel (KILN_KERNEL_CONV_DOT): what
// lowering/ops/matmul.c chose before it asked. Register tiles of 8
// filters x 48 pixels (24 accumulators, three vectors of input and a
// broadcast of a weight: 28 of the 32 AVX-512 registers; fewer filters,
// dividing F, where the register file is smaller); chunks of the
// largest multiple of 16 pixels up to 512 dividing P; channels in blocks
// of about 288 multiply-adds of taps per output (32 channels of a 3x3
// kernel: a tile's input rows and its filters' weights stay in L1 over
// the block); the filters split into groups of whole tiles where images x
// chunks make fewer than 8 tasks (a batch of one through a 14 x 14 layer
// is one chunk).
enum { kConvDotTaps = 288, kConvDotMinTasks = 8 };

static void heuristic_conv_dot(const kiln_kernel_desc_t *d, const kiln_cpu_target_t *t,
                               kiln_tile_config_t *c) {
  const int64_t N = d->range[0], F = d->range[1], P = d->range[2], C = d->range[3],
                taps = d->range[4];
  int64_t rows = (t->vector_registers - 4) / 3;
  if (rows > 8) rows = 8;
  while (rows > 1 && F % rows) --rows;
  c->reg[1] = rows > 0 ? rows : 1;
  c->reg[2] = 48;
  int64_t pc = 0;
  for (int64_t x = 512; x >= 16 && !pc; x -= 16)
    if (P % x == 0) pc = x;
  if (!pc) pc = P;
  c->forall[2] = pc < P ? pc : 0;
  int64_t nb = (C * taps + kConvDotTaps - 1) / kConvDotTaps, cb = (C + nb - 1) / nb;
  c->cache[3] = cb < C ? cb : 0;
  int64_t fg = 1, tiles = F / c->reg[1];
  while (N * (P / pc) * fg < kConvDotMinTasks && fg < tiles) {
    int64_t g = fg + 1;
    while (tiles % g) ++g;
    fg = g;
  }
  c->forall[1] = fg > 1 ? F / fg : 0;
}

// The bf16 microkernel (KILN_KERNEL_BF16_DOT): what lowering/ops/matmul.c
// chose before it asked. Register tiles of 8 rows (4 or 2 where M has no
// factor 8; fewer where the register file is smaller), blocks of rows
// halved up to twice while the halves keep whole tiles (32-row AMX tiles
// with AMX): four blocks where M allows.
static void heuristic_bf16_dot(const kiln_kernel_desc_t *d, const kiln_cpu_target_t *t,
                               kiln_tile_config_t *c) {
  const int64_t M = d->range[0];
  bool sym = is_dynamic(d, 0);
  int64_t rm = sym || M % 8 == 0 ? 8 : M % 4 == 0 ? 4 : 2;
  while (rm > 2 && 2 * rm + 3 > t->vector_registers) rm /= 2;
  c->reg[0] = rm;
  c->reg[1] = 32;
  c->reg[2] = 2;
  if (sym) return;
  int64_t tile = d->amx ? 32 : rm, mb = M;
  for (int split = 0; split < 2 && mb % 2 == 0 && (mb / 2) % tile == 0; ++split) mb /= 2;
  c->forall[0] = mb < M ? mb : 0;
}

static bool bf16_dot_config_valid(const kiln_kernel_desc_t *d, const kiln_cpu_target_t *t,
                                  const kiln_tile_config_t *c, char *why, size_t why_len) {
  const int64_t M = d->range[0], N = d->range[1];
  int64_t rm = c->reg[0];
  if (d->loop_count != 3 || c->reg[1] != 32 || c->reg[2] != 2 || rm < 1 || rm > 16 ||
      2 * rm + 3 > t->vector_registers) {
    snprintf(why, why_len, "bf16 microkernel: register tile %lldx%lldx%lld; expected rows "
             "x 32 x 2 within %d vector registers", (long long)rm, (long long)c->reg[1],
             (long long)c->reg[2], t->vector_registers);
    return false;
  }
  // (A partial last panel's masked tiles: at most 8 rows, as the f32
  // microkernel's, for compile time.)
  if (rm > 8 && N % 32) {
    snprintf(why, why_len, "bf16 microkernel: %lld-row tiles with a partial last panel "
             "(N = %lld)", (long long)rm, (long long)N);
    return false;
  }
  int64_t mb = c->forall[0] ? c->forall[0] : M;
  // A static block runs whole register tiles (after its 32-row AMX tiles).
  if (c->forall[0] < 0 || (c->forall[0] && (is_dynamic(d, 0) || c->forall[0] >= M)) ||
      (!is_dynamic(d, 0) && (M % mb || (d->amx ? mb % 32 : mb) % rm))) {
    snprintf(why, why_len, "bf16 microkernel: row block %lld (rows %lld, register tile "
             "%lld%s)", (long long)c->forall[0], (long long)M, (long long)rm,
             d->amx ? ", after 32-row AMX tiles" : "");
    return false;
  }
  for (int i = 0; i < 3; ++i)
    if ((i && c->forall[i]) || c->cache[i]) {
      snprintf(why, why_len, "bf16 microkernel: only reg[0] and forall[0] are knobs");
      return false;
    }
  if (c->reduction_dim != -1) {
    snprintf(why, why_len, "bf16 microkernel: no reduction split");
    return false;
  }
  return true;
}

static bool conv_dot_config_valid(const kiln_kernel_desc_t *d, const kiln_cpu_target_t *t,
                                  const kiln_tile_config_t *c, char *why, size_t why_len) {
  const int64_t F = d->range[1], P = d->range[2], C = d->range[3];
  int64_t r = c->reg[1], px = c->reg[2], nv = px / 16;
  if (d->loop_count != 5 || r < 1 || px < 16 || px % 16 || c->reg[0] || c->reg[3] ||
      c->reg[4]) {
    snprintf(why, why_len, "convolution microkernel: register tile %lld filters x %lld "
             "pixels; expected whole 16-lane vectors of pixels", (long long)r, (long long)px);
    return false;
  }
  if (r * nv + nv + 1 > t->vector_registers) {
    snprintf(why, why_len, "register tile %lldx%lld needs %lld vector registers, the "
             "target has %d", (long long)r, (long long)px, (long long)(r * nv + nv + 1),
             t->vector_registers);
    return false;
  }
  int64_t fp = c->forall[1] ? c->forall[1] : F;
  if (c->forall[1] < 0 || fp > F || F % fp || fp % r) {
    snprintf(why, why_len, "convolution microkernel: %lld filters a task of %lld, register "
             "tile %lld; expected whole tiles dividing the filters", (long long)fp,
             (long long)F, (long long)r);
    return false;
  }
  int64_t pc = c->forall[2] ? c->forall[2] : P;
  if (c->forall[2] < 0 || pc > P || pc % 16 || P % pc) {
    snprintf(why, why_len, "convolution microkernel: chunks of %lld of %lld pixels; "
             "expected a multiple of 16 dividing them", (long long)pc, (long long)P);
    return false;
  }
  if (c->cache[3] < 0 || c->cache[3] >= C || c->forall[0] || c->forall[3] || c->forall[4] ||
      c->cache[0] || c->cache[1] || c->cache[2] || c->cache[4]) {
    snprintf(why, why_len, "convolution microkernel: channel block %lld of %lld; only "
             "forall[1], forall[2] and cache[3] are blocks", (long long)c->cache[3],
             (long long)C);
    return false;
  }
  if (c->reduction_dim != -1) {
    snprintf(why, why_len, "convolution microkernel: no reduction split");
    return false;
  }
  return true;
}

// The tensor-core GEMM (KILN_KERNEL_GPU_MMA): what kernels/gpu_mma.c chose
// before it asked: blocks of 128 x 128 (128 x 256 for warpgroup MMA where
// N allows), 3 stages (4 for warpgroup MMA), groups of up to 8 block rows.
static void heuristic_gpu_mma(const kiln_kernel_desc_t *d, kiln_tile_config_t *c) {
  c->reg[0] = 128;
  c->reg[1] = d->wgmma && d->range[1] % 256 == 0 ? 256 : 128;
  c->reg[2] = d->wgmma ? 64 : 32;
  c->cache[2] = d->wgmma ? 4 : 3;
  int64_t rows = d->range[0] / 128, g = 1;
  while (g < 8 && rows % (g * 2) == 0) g *= 2;
  c->forall[0] = g;
}

// Shared memory of the warpgroup-MMA kernel for `c`: its stages of
// 128 x 64 A and 64 x BN B bf16 tiles, or the f32 output tile (rows padded
// by 16 bytes) where larger, and 1024 bytes of alignment (kernels/gpu_mma.c,
// wgmma_shared_bytes), plus the TMA pipeline's mbarriers (static, 8 bytes a
// stage).
static int64_t gpu_mma_shared_bytes(const kiln_tile_config_t *c) {
  int64_t pipe = c->cache[2] * (128 + c->reg[1]) * 64 * 2;
  int64_t out = 128 * (c->reg[1] * 4 + 16);
  return 1024 + (pipe > out ? pipe : out) + 8 * c->cache[2];
}

static bool gpu_mma_config_valid(const kiln_kernel_desc_t *d, const kiln_tile_config_t *c,
                                 char *why, size_t why_len) {
  const int64_t M = d->range[0], N = d->range[1], K = d->range[2];
  int64_t bk = d->wgmma ? 64 : 32, g = c->forall[0];
  bool bn_ok = c->reg[1] == 128 || (d->wgmma && c->reg[1] == 256);
  if (d->loop_count != 3 || c->reg[0] != 128 || !bn_ok || c->reg[2] != bk ||
      M % 128 || N % c->reg[1] || K % bk) {
    snprintf(why, why_len, "tensor-core GEMM %lldx%lldx%lld: block %lldx%lldx%lld; expected "
             "128 x %s x %lld dividing the sizes", (long long)M, (long long)N, (long long)K,
             (long long)c->reg[0], (long long)c->reg[1], (long long)c->reg[2],
             d->wgmma ? "128 or 256" : "128", (long long)bk);
    return false;
  }
  int64_t lo = 3, hi = d->wgmma ? 6 : 3;
  if (c->cache[2] < lo || c->cache[2] > hi ||
      (d->wgmma && gpu_mma_shared_bytes(c) > KILN_GPU_MMA_SHARED_BYTES)) {
    snprintf(why, why_len, "tensor-core GEMM: %lld stages of 128 x %lld blocks (%lld..%lld, "
             "within %d bytes of shared memory)", (long long)c->cache[2],
             (long long)c->reg[1], (long long)lo, (long long)hi, KILN_GPU_MMA_SHARED_BYTES);
    return false;
  }
  if (g < 1 || (g & (g - 1)) || (M / 128) % g) {
    snprintf(why, why_len, "tensor-core GEMM: groups of %lld block rows (%lld rows of "
             "blocks)", (long long)g, (long long)(M / 128));
    return false;
  }
  for (int i = 0; i < 3; ++i)
    if ((i && c->forall[i]) || (i < 2 && c->cache[i])) {
      snprintf(why, why_len, "tensor-core GEMM: only forall[0] and cache[2] are knobs");
      return false;
    }
  if (c->reduction_dim != -1) {
    snprintf(why, why_len, "tensor-core GEMM: no reduction split");
    return false;
  }
  return true;
}

void kiln_autotune_heuristic(const kiln_kernel_desc_t *d,
                             const kiln_cpu_target_t *t,
                             kiln_tile_config_t *c) {
  init_config(d, c);
  int r = d->loop_count;
  if (r == 0) return;
  // Elementwise vectors and reduction accumulators are 16 lanes whatever
  // the target: one AVX-512 register, two AVX2 ones (LLVM splits them, which
  // unrolls by two), so the IR does not depend on the host.
  const int64_t vec[] = {16, 8, 4, 2, 1};
  const int64_t acc4[] = {64, 32, 16, 8, 4, 2, 1};
  switch (d->kind) {
  case KILN_KERNEL_CONTRACTION:
    heuristic_contraction(d, t, c);
    return;
  case KILN_KERNEL_F32_DOT:
    heuristic_f32_dot(d, t, c);
    return;
  case KILN_KERNEL_GPU_MMA:
    heuristic_gpu_mma(d, c);
    return;
  case KILN_KERNEL_CONV_DOT:
    heuristic_conv_dot(d, t, c);
    return;
  case KILN_KERNEL_BF16_DOT:
    heuristic_bf16_dot(d, t, c);
    return;
  case KILN_KERNEL_TRANSPOSE: {
    // Square register blocks: a block's vector transpose is a few shuffles.
    // Over a dim of 4 or less (a stride's phases) the block is that dim by
    // a whole vector.
    const int q = d->transpose_dim;
    for (int i = 0; i < r - 1; ++i) c->reg[i] = 1;
    const int64_t blk[] = {8, 4, 2, 1};
    c->reg[q] = pick(d->range[q], blk, 4);
    c->reg[r - 1] = c->reg[q] <= 4 && d->range[q] <= 4 ? pick(d->range[r - 1], vec, 5)
                                                       : pick(d->range[r - 1], blk, 4);
    break;
  }
  case KILN_KERNEL_ROW_REDUCTION:
    // Rows one at a time, the row split into a vector accumulator of four
    // vector registers where the row allows: four independent add (or max)
    // chains instead of one, whose latency bound a row held in cache.
    for (int i = 0; i < r - 1; ++i) c->reg[i] = 1;
    c->reg[r - 1] = 0;
    // (A row of symbolic length is reduced in scalar: its split would end
    // in a partial vector.)
    c->reduction_tile = is_dynamic(d, r - 1) ? 1 : pick(d->range[r - 1], acc4, 7);
    c->reduction_dim = c->reduction_tile > 1 ? r - 1 : -1;
    if (c->reduction_dim < 0) c->reduction_tile = 0;
    break;
  case KILN_KERNEL_ELEMENTWISE:
    for (int i = 0; i < r - 1; ++i) c->reg[i] = 1;
    c->reg[r - 1] = pick(d->range[r - 1], vec, 5);
    break;
  }
  int f = forall_dim(d, c->reg);
  if (f < 0) return;
  c->forall[f] = c->reg[f];
  // Few tiles that do not split evenly over the threads (an attention
  // block's head split, [4, 128, 3, 8, 32] -> [3, 4, 8, 128, 32]: 3 tiles,
  // two on one thread of two) are spread over the next parallel dim too.
  int64_t trips = (d->range[f] + c->reg[f] - 1) / c->reg[f];
  if (t->threads > 1 && trips % t->threads && trips < 4 * t->threads && f < r - 1 &&
      !d->reduction_mask)
    for (int g = f + 1; g < r - 1; ++g)
      if (!is_reduction(d, g) && !is_dynamic(d, g) && c->reg[g] > 0 &&
          d->range[g] > c->reg[g]) {
        c->forall[g] = c->reg[g];
        break;
      }
  if (d->kind == KILN_KERNEL_ELEMENTWISE && d->reduction_mask && f == r - 1 &&
      !is_dynamic(d, f) && t->threads > 0) {
    // A column reduction (its reduction loops outside the innermost,
    // vectorized dim): a thread's share of the columns, not one vector of
    // them, so each thread walks the rows in order and adds each row's run
    // of its columns into accumulators that stay in L1. With a vector of
    // columns per tile, every row was a strided 64-byte read (a page apart
    // for rows of 1024 floats).
    int64_t share = (d->range[f] + t->threads - 1) / t->threads;
    for (int64_t s = c->reg[f]; s <= share; s += c->reg[f])
      if (d->range[f] % s == 0) c->forall[f] = s;
  }
}

// Validity of a KILN_KERNEL_F32_DOT config (see the kind's comment).
static bool f32_dot_config_valid(const kiln_kernel_desc_t *d, const kiln_cpu_target_t *t,
                                 const kiln_tile_config_t *c, char *why, size_t why_len) {
  const int64_t M = d->range[0], NF = d->range[1] / 32 * 32, K = d->range[2];
  int64_t rm = c->reg[0];
  if (d->loop_count != 3 || c->reg[1] != 32 || c->reg[2] != 1 || rm < 1 || rm > 16) {
    snprintf(why, why_len, "f32 microkernel: register tile %lldx%lldx%lld; expected "
             "1..16 rows x 32 x 1", (long long)rm, (long long)c->reg[1], (long long)c->reg[2]);
    return false;
  }
  if (2 * rm + 3 > t->vector_registers) {
    snprintf(why, why_len, "register tile %lldx32 needs %lld vector registers, the "
             "target has %d", (long long)rm, (long long)(2 * rm + 3), t->vector_registers);
    return false;
  }
  // A last panel of N % 32 columns is written by masked tiles; with more
  // than 8 rows their code made one-shot bufferization take 20 s (10
  // rows) to minutes (12) for a 1024 x 1000 result.
  if (rm > 8 && d->range[1] % 32) {
    snprintf(why, why_len, "f32 microkernel: %lld-row tiles with a partial last panel "
             "(N = %lld)", (long long)rm, (long long)d->range[1]);
    return false;
  }
  if (d->fixed_rows) {
    kiln_tile_config_t h;
    heuristic_f32_dot(d, t, &h);
    if (rm != h.reg[0]) {
      snprintf(why, why_len, "f32 microkernel: A is packed by %lld-row tiles", (long long)h.reg[0]);
      return false;
    }
  }
  if (c->cache[0] && !f32_dot_packs_a(d, c)) {
    snprintf(why, why_len, "f32 microkernel: A packed in blocks of %lld rows (rows %lld, "
             "row block %lld, register tile %lld, K %lld, K block %lld); expected the "
             "whole row block of a plain A, every block whole", (long long)c->cache[0],
             (long long)M, (long long)c->forall[0], (long long)rm, (long long)K,
             (long long)c->cache[2]);
    return false;
  }
  if (c->cache[1] || c->cache[2] < 0 || c->cache[2] >= K) {
    snprintf(why, why_len, "f32 microkernel: K block %lld of %lld", (long long)c->cache[2],
             (long long)K);
    return false;
  }
  if (c->forall[2] || c->forall[0] < 0 || (c->forall[0] && (is_dynamic(d, 0) ||
      c->forall[0] % rm || c->forall[0] >= M))) {
    snprintf(why, why_len, "f32 microkernel: row block %lld (rows %lld, register tile %lld)",
             (long long)c->forall[0], (long long)M, (long long)rm);
    return false;
  }
  if (c->forall[1] < 0 || (c->forall[1] && (c->forall[1] % 32 || c->forall[1] >= NF))) {
    snprintf(why, why_len, "f32 microkernel: column group %lld of %lld whole-panel columns",
             (long long)c->forall[1], (long long)NF);
    return false;
  }
  if (c->reduction_dim != -1) {
    snprintf(why, why_len, "f32 microkernel: no reduction split");
    return false;
  }
  return true;
}

bool kiln_autotune_config_valid(const kiln_kernel_desc_t *d,
                                const kiln_cpu_target_t *t,
                                const kiln_tile_config_t *c, char *why,
                                size_t why_len) {
  char dummy[8];
  if (!why) why = dummy, why_len = sizeof(dummy);
  why[0] = 0;
  if (c->loop_count != d->loop_count) {
    snprintf(why, why_len, "config has %d loops, the kernel %d", c->loop_count,
             d->loop_count);
    return false;
  }
  if (d->kind == KILN_KERNEL_F32_DOT) return f32_dot_config_valid(d, t, c, why, why_len);
  if (d->kind == KILN_KERNEL_GPU_MMA) return gpu_mma_config_valid(d, c, why, why_len);
  if (d->kind == KILN_KERNEL_CONV_DOT) return conv_dot_config_valid(d, t, c, why, why_len);
  if (d->kind == KILN_KERNEL_BF16_DOT) return bf16_dot_config_valid(d, t, c, why, why_len);
  for (int i = 0; i < d->loop_count; ++i) {
    const int64_t *lv[3] = {c->forall, c->cache, c->reg};
    for (int level = 0; level < 3; ++level) {
      int64_t s = lv[level][i];
      int64_t within = enclosing(d, c, level, i);
      // The output loops of a plain contraction may have a partial last
      // tile at the thread and register levels (the schedule peels it).
      bool ragged_ok = ragged_contraction(d) && level != 1 && !is_reduction(d, i) &&
                       !is_dynamic(d, i) && (i == d->m_dim || i == d->n_dim);
      if (s < 0 || (s > 0 && (within <= 0 || (within % s != 0 && !ragged_ok)))) {
        snprintf(why, why_len, "loop %d: tile %lld does not divide %lld", i,
                 (long long)s, (long long)within);
        return false;
      }
    }
    if (c->cache[i] > 0 && is_dynamic(d, i)) {
      snprintf(why, why_len, "loop %d: symbolic size, no cache tile", i);
      return false;
    }
    if (c->cache[i] > 0 && !is_reduction(d, i)) {
      snprintf(why, why_len, "loop %d: cache tiles are for reduction loops "
               "(an output block would be copied through one vector)", i);
      return false;
    }
    if (c->forall[i] > 0 && (d->nested || is_reduction(d, i))) {
      snprintf(why, why_len, "loop %d: cannot be distributed", i);
      return false;
    }
  }
  if (d->kind == KILN_KERNEL_CONTRACTION && d->sum_maps && d->m_dim >= 0 && d->n_dim >= 0) {
    // (See heuristic_contraction: a one-pixel register tile keeps one
    // filter too.)
    int64_t rm = c->reg[d->m_dim] > 0 ? c->reg[d->m_dim] : d->range[d->m_dim];
    int64_t rn = c->reg[d->n_dim] > 0 ? c->reg[d->n_dim] : d->range[d->n_dim];
    if (rn == 1 && rm > 1) {
      snprintf(why, why_len, "a convolution's register tile of one pixel and %lld filters "
               "(MLIR 22 vectorizes it wrongly)", (long long)rm);
      return false;
    }
  }
  if (c->reduction_dim >= 0) {
    int k = c->reduction_dim;
    if (k >= d->loop_count || !is_reduction(d, k) || is_dynamic(d, k) || c->reg[k] != 0 ||
        c->reduction_tile < 2 || d->range[k] % c->reduction_tile) {
      snprintf(why, why_len, "reduction split %d:%lld does not fit", k,
               (long long)c->reduction_tile);
      return false;
    }
  }
  if (d->kind == KILN_KERNEL_CONTRACTION && d->m_dim >= 0 && d->n_dim >= 0) {
    int64_t regs = contraction_registers(d, t, c->reg[d->m_dim],
                                         c->reg[d->n_dim]);
    if (regs > t->vector_registers) {
      snprintf(why, why_len, "register tile %lldx%lld needs %lld vector "
               "registers, the target has %d", (long long)c->reg[d->m_dim],
               (long long)c->reg[d->n_dim], (long long)regs,
               t->vector_registers);
      return false;
    }
    for (int i = 0; i < d->loop_count; ++i)
      if (is_reduction(d, i) && c->reg[i] != 1) {
        snprintf(why, why_len, "contraction loop %d must step by one", i);
        return false;
      }
  }
  return true;
}

int kiln_autotune_stage_count(const kiln_kernel_desc_t *d) {
  switch (d->kind) {
  case KILN_KERNEL_F32_DOT: return 5;
  case KILN_KERNEL_CONV_DOT: return 4;
  case KILN_KERNEL_BF16_DOT: return 2;
  case KILN_KERNEL_CONTRACTION: return 4;
  case KILN_KERNEL_GPU_MMA: return 3;
  default: return 2;
  }
}

typedef struct {
  const kiln_kernel_desc_t *d;
  const kiln_cpu_target_t *t;
  const kiln_tile_config_t *base;
  kiln_tile_config_t *out;
  int cap, n;
} emitter_t;

static bool same_config(const kiln_tile_config_t *a,
                        const kiln_tile_config_t *b) {
  return memcmp(a, b, sizeof(*a)) == 0;
}

// Adds `c` when valid and new.
static void emit(emitter_t *e, const kiln_tile_config_t *c) {
  if (e->n >= e->cap || same_config(c, e->base)) return;
  if (!kiln_autotune_config_valid(e->d, e->t, c, NULL, 0)) return;
  for (int i = 0; i < e->n; ++i)
    if (same_config(&e->out[i], c)) return;
  e->out[e->n++] = *c;
}

// Re-fits the distribution tile of loop `i` to a new register tile: the
// tile keeps its share of the range, rounded to whole register tiles.
static void refit_forall(const kiln_kernel_desc_t *d, kiln_tile_config_t *c,
                         int i) {
  if (c->forall[i] <= 0 || c->reg[i] <= 0) return;
  int64_t f = c->forall[i] / c->reg[i] * c->reg[i];
  if (f < c->reg[i]) f = c->reg[i];
  while (f > c->reg[i] && d->range[i] % f) f -= c->reg[i];
  c->forall[i] = f;
}

static void stages_contraction(emitter_t *e, int stage) {
  const kiln_kernel_desc_t *d = e->d;
  int m = d->m_dim, n = d->n_dim;
  int64_t l = lanes(d, e->t);
  int k = -1;
  for (int i = 0; i < d->loop_count; ++i)
    if (is_reduction(d, i)) k = i;
  kiln_tile_config_t c;
  switch (stage) {
  case 0:  // register tile
    for (int64_t rn = l / 2 > 0 ? l / 2 : 1; rn <= 4 * l; rn *= 2)
      for (int64_t rm = 1; rm <= 16; rm = rm < 4 ? rm * 2 : rm + 2) {
        c = *e->base;
        c.reg[m] = rm;
        c.reg[n] = rn;
        refit_forall(d, &c, m);
        refit_forall(d, &c, n);
        emit(e, &c);
      }
    return;
  case 1:  // cache block of the reduction
    if (k < 0) return;
    for (int64_t kc = 32; kc <= 1024; kc *= 2) {
      c = *e->base;
      c.cache[k] = kc < d->range[k] ? kc : 0;
      emit(e, &c);
    }
    return;
  case 2:  // thread tile: columns
  case 3:  // thread tile: rows
    for (int64_t size = 8; size <= 4096; size *= 2) {
      int dim = stage == 2 ? n : m;
      c = *e->base;
      if (c.reg[dim] <= 0 || size % c.reg[dim]) continue;
      c.forall[dim] = size < d->range[dim] ? size : 0;
      emit(e, &c);
    }
    return;
  }
}

// A packed A (cache[0]) follows its row block when another knob moves
// it; where the new sizes cannot pack A, the candidate reads A in place.
static void refit_a_pack(const kiln_kernel_desc_t *d, bool pack, kiln_tile_config_t *c) {
  c->cache[0] = pack ? (c->forall[0] ? c->forall[0] : d->range[0]) : 0;
  if (c->cache[0] && !f32_dot_packs_a(d, c)) c->cache[0] = 0;
}

// The f32 microkernel's knobs, one per stage: register tile rows (the
// row block refitted to whole tiles), K block, row block, column group,
// A packed or read in place.
static void stages_f32_dot(emitter_t *e, int stage) {
  const kiln_kernel_desc_t *d = e->d;
  const int64_t M = d->range[0], K = d->range[2];
  const bool packed = e->base->cache[0] != 0;
  kiln_tile_config_t c;
  switch (stage) {
  case 0:
    for (int64_t rm = 2; rm <= 16; rm += 2) {
      c = *e->base;
      c.reg[0] = rm;
      if (c.forall[0]) {
        c.forall[0] = (c.forall[0] + rm - 1) / rm * rm;
        if (c.forall[0] >= M) c.forall[0] = 0;
      }
      refit_a_pack(d, packed, &c);
      emit(e, &c);
    }
    return;
  case 1: {
    static const int64_t kcs[] = {0, 64, 128, 192, 256, 384, 512, 768, 1024};
    for (size_t i = 0; i < sizeof(kcs) / sizeof(kcs[0]); ++i) {
      c = *e->base;
      c.cache[2] = kcs[i] < K ? kcs[i] : 0;
      refit_a_pack(d, packed, &c);
      emit(e, &c);
    }
    return;
  }
  case 2:
    if (is_dynamic(d, 0)) return;
    for (int64_t rows = 32; rows <= 2048; rows *= 2)
      for (int half = 0; half < 2; ++half) {
        c = *e->base;
        int64_t r = half ? rows * 3 / 2 : rows;
        r = (r + c.reg[0] - 1) / c.reg[0] * c.reg[0];
        c.forall[0] = r < M ? r : 0;
        refit_a_pack(d, packed, &c);
        emit(e, &c);
      }
    return;
  case 3:
    for (int64_t cols = 32; cols <= 4096; cols *= 2) {
      c = *e->base;
      c.forall[1] = cols < d->range[1] / 32 * 32 ? cols : 0;
      emit(e, &c);
    }
    return;
  case 4:
    c = *e->base;
    refit_a_pack(d, !packed, &c);
    emit(e, &c);
    return;
  }
}

// The tensor-core GEMM's knobs, one per stage: block columns (warpgroup
// MMA), pipeline stages (warpgroup MMA), block rows per L2 group.
static void stages_gpu_mma(emitter_t *e, int stage) {
  kiln_tile_config_t c;
  switch (stage) {
  case 0:
    for (int64_t bn = 128; bn <= 256; bn *= 2) {
      c = *e->base;
      c.reg[1] = bn;
      // The deepest pipeline that fits, as the heuristic's 4 at 256.
      for (c.cache[2] = 6; c.cache[2] > 3 && gpu_mma_shared_bytes(&c) >
                                                  KILN_GPU_MMA_SHARED_BYTES;)
        c.cache[2]--;
      if (c.reg[1] == 256 && c.cache[2] > 4) c.cache[2] = 4;
      emit(e, &c);
    }
    return;
  case 1:
    for (int64_t st = 3; st <= 6; ++st) {
      c = *e->base;
      c.cache[2] = st;
      emit(e, &c);
    }
    return;
  case 2:
    for (int64_t g = 1; g <= 16; g *= 2) {
      c = *e->base;
      c.forall[0] = g;
      emit(e, &c);
    }
    return;
  }
}

static void stages_other(emitter_t *e, int stage) {
  const kiln_kernel_desc_t *d = e->d;
  int r = d->loop_count;
  kiln_tile_config_t c;
  if (stage == 0) {  // vector width (or transpose block, or reduction split)
    for (int64_t w = 2; w <= 128; w *= 2) {
      c = *e->base;
      if (d->kind == KILN_KERNEL_ROW_REDUCTION) {
        c.reduction_dim = r - 1;
        c.reduction_tile = w;
      } else if (d->kind == KILN_KERNEL_TRANSPOSE) {
        if (w > 16) continue;
        c.reg[d->transpose_dim] = c.reg[r - 1] = w;
        refit_forall(d, &c, d->transpose_dim);
      } else {
        c.reg[r - 1] = w;
        refit_forall(d, &c, r - 1);
      }
      emit(e, &c);
    }
    return;
  }
  // Distribution: none, or the first distributable loop in blocks of 1..64
  // register tiles.
  c = *e->base;
  memset(c.forall, 0, sizeof(c.forall));
  emit(e, &c);
  int64_t unit[KILN_TILE_MAX_LOOPS];
  for (int i = 0; i < r; ++i) unit[i] = e->base->reg[i] > 0 ? e->base->reg[i] : 0;
  int f = -1;
  for (int i = 0; i < r && f < 0; ++i)
    if (!is_reduction(d, i) && unit[i] > 0 && d->range[i] > unit[i]) f = i;
  if (f < 0 || d->nested) return;
  for (int64_t mult = 1; mult <= 64; mult *= 4) {
    c = *e->base;
    memset(c.forall, 0, sizeof(c.forall));
    c.forall[f] = unit[f] * mult;
    if (c.forall[f] < d->range[f]) emit(e, &c);
  }
}

// The convolution microkernel's knobs, one per stage: the register tile
// (filters x vectors of pixels within the register file; the task's
// filters refitted to whole tiles), the channel block (taps per block),
// the pixel chunk, the filters of a task.
static void stages_conv_dot(emitter_t *e, int stage) {
  const kiln_kernel_desc_t *d = e->d;
  const int64_t F = d->range[1], P = d->range[2], C = d->range[3], taps = d->range[4];
  kiln_tile_config_t c;
  switch (stage) {
  case 0: {
    static const int64_t tiles[][2] = {{4, 4}, {4, 6}, {6, 4}, {8, 2}, {8, 3},
                                       {12, 2}, {14, 2}, {16, 1}};
    for (size_t i = 0; i < sizeof(tiles) / sizeof(tiles[0]); ++i) {
      c = *e->base;
      c.reg[1] = tiles[i][0];
      c.reg[2] = 16 * tiles[i][1];
      if (c.forall[1] && c.forall[1] % c.reg[1]) {
        // The nearest group of whole tiles dividing F, else all filters.
        int64_t fp = c.forall[1] / c.reg[1] * c.reg[1];
        while (fp >= c.reg[1] && F % fp) fp -= c.reg[1];
        c.forall[1] = fp >= c.reg[1] && fp < F ? fp : 0;
      }
      emit(e, &c);
    }
    return;
  }
  case 1: {
    static const int64_t per_block[] = {72, 144, 288, 576, 1152, 0};
    for (size_t i = 0; i < sizeof(per_block) / sizeof(per_block[0]); ++i) {
      c = *e->base;
      int64_t nb = per_block[i] ? (C * taps + per_block[i] - 1) / per_block[i] : 1,
              cb = (C + nb - 1) / nb;
      c.cache[3] = cb < C ? cb : 0;
      emit(e, &c);
    }
    return;
  }
  case 2:
    // The largest chunk up to each cap that divides P.
    for (int64_t cap = 64; cap <= 2048; cap *= 2) {
      c = *e->base;
      int64_t pc = 0;
      for (int64_t x = cap; x >= 16 && !pc; x -= 16)
        if (P % x == 0) pc = x;
      if (!pc) continue;
      c.forall[2] = pc < P ? pc : 0;
      emit(e, &c);
    }
    return;
  case 3:
    for (int64_t g = 1; g <= 16; g *= 2) {
      c = *e->base;
      if (F % g) break;
      c.forall[1] = g > 1 ? F / g : 0;
      emit(e, &c);
    }
    return;
  }
}

// The bf16 microkernel's knobs, one per stage: register tile rows (the
// row block refitted to whole tiles), rows of a thread's block.
static void stages_bf16_dot(emitter_t *e, int stage) {
  const kiln_kernel_desc_t *d = e->d;
  const int64_t M = d->range[0];
  kiln_tile_config_t c;
  if (stage == 0) {
    // With AMX and blocks of whole 32-row tiles no row is left to the
    // register tiles: nothing to vary.
    int64_t mb = e->base->forall[0] ? e->base->forall[0] : M;
    if (d->amx && !is_dynamic(d, 0) && mb % 32 == 0) return;
    for (int64_t rm = 2; rm <= 16; rm += 2) {
      c = *e->base;
      c.reg[0] = rm;
      // The nearest block that divides M and keeps whole tiles, else all.
      int64_t unit = d->amx ? 32 : rm;
      if (c.forall[0] && (d->amx ? c.forall[0] % 32 : c.forall[0]) % rm) {
        int64_t mb = c.forall[0] / unit * unit;
        while (mb >= unit && (M % mb || (d->amx ? mb % 32 : mb) % rm)) mb -= unit;
        c.forall[0] = mb >= unit && mb < M ? mb : 0;
      }
      emit(e, &c);
    }
    return;
  }
  if (is_dynamic(d, 0)) return;
  // Blocks of M / 2^j rows, and the largest multiple of 16 rows up to a
  // few sizes that divides M.
  for (int64_t parts = 1; parts <= 32; parts *= 2) {
    if (M % parts) break;
    c = *e->base;
    c.forall[0] = parts > 1 ? M / parts : 0;
    emit(e, &c);
  }
  for (int64_t cap = 32; cap <= 512; cap *= 2) {
    c = *e->base;
    for (int64_t mb = cap; mb >= 16; mb -= 16)
      if (M % mb == 0) {
        c.forall[0] = mb < M ? mb : 0;
        emit(e, &c);
        break;
      }
  }
}

int kiln_autotune_candidates(const kiln_kernel_desc_t *d,
                             const kiln_cpu_target_t *t,
                             const kiln_tile_config_t *base, int stage,
                             kiln_tile_config_t *out, int cap) {
  emitter_t e = {d, t, base, out, cap, 0};
  if (d->kind == KILN_KERNEL_CONTRACTION)
    stages_contraction(&e, stage);
  else if (d->kind == KILN_KERNEL_F32_DOT)
    stages_f32_dot(&e, stage);
  else if (d->kind == KILN_KERNEL_GPU_MMA)
    stages_gpu_mma(&e, stage);
  else if (d->kind == KILN_KERNEL_CONV_DOT)
    stages_conv_dot(&e, stage);
  else if (d->kind == KILN_KERNEL_BF16_DOT)
    stages_bf16_dot(&e, stage);
  else
    stages_other(&e, stage);
  return e.n;
}

static void format_sizes(char **p, size_t *left, const char *name,
                         const int64_t *s, int n) {
  int w = snprintf(*p, *left, "%s=[", name);
  for (int i = 0; i < n && w >= 0 && (size_t)w < *left; ++i)
    w += snprintf(*p + w, *left - (size_t)w, "%s%lld", i ? "," : "",
                  (long long)s[i]);
  if (w >= 0 && (size_t)w < *left) w += snprintf(*p + w, *left - (size_t)w, "] ");
  if (w < 0 || (size_t)w >= *left) w = (int)*left - 1;
  *p += w;
  *left -= (size_t)w;
}

void kiln_autotune_config_format(const kiln_tile_config_t *c, char *buf,
                                 size_t len) {
  if (!len) return;
  buf[0] = 0;
  char *p = buf;
  size_t left = len;
  format_sizes(&p, &left, "forall", c->forall, c->loop_count);
  format_sizes(&p, &left, "cache", c->cache, c->loop_count);
  format_sizes(&p, &left, "reg", c->reg, c->loop_count);
  snprintf(p, left, "split=%d:%lld", c->reduction_dim,
           (long long)c->reduction_tile);
}

void kiln_autotune_desc_format(const kiln_kernel_desc_t *d, char *buf,
                               size_t len) {
  static const char *kinds[] = {"elementwise", "transpose", "row-reduction",
                                "contraction", "f32-microkernel", "tensor-core-gemm",
                                "conv-microkernel", "bf16-microkernel"};
  int w = snprintf(buf, len, "%s ", kinds[d->kind]);
  for (int i = 0; i < d->loop_count && w >= 0 && (size_t)w < len; ++i) {
    if (is_dynamic(d, i))
      w += snprintf(buf + w, len - (size_t)w, "%s?%s", i ? "x" : "",
                    is_reduction(d, i) ? "r" : "");
    else
      w += snprintf(buf + w, len - (size_t)w, "%s%lld%s", i ? "x" : "",
                    (long long)d->range[i], is_reduction(d, i) ? "r" : "");
  }
}

//===--- measured search ---------------------------------------------------===//

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct {
  int index;
  double work;
} order_t;

static int by_work_desc(const void *a, const void *b) {
  double x = ((const order_t *)a)->work, y = ((const order_t *)b)->work;
  return x < y ? 1 : x > y ? -1 : 0;
}

kiln_status_t kiln_autotune_search(const kiln_kernel_desc_t *descs, int count,
                                   const kiln_cpu_target_t *target,
                                   const kiln_autotune_search_options_t *opts,
                                   kiln_autotune_measure_fn measure, void *user,
                                   kiln_tile_config_t *configs,
                                   kiln_autotune_search_result_t *result) {
  memset(result, 0, sizeof(*result));
  double start = now_seconds();
  double best = 0;
  KILN_RETURN_IF_ERROR_PLAIN(measure(user, configs, &best));
  result->measured = 1;
  result->baseline_seconds = result->best_seconds = best;
  order_t *order = malloc(sizeof(*order) * (size_t)(count > 0 ? count : 1));
  kiln_tile_config_t *trial = malloc(sizeof(*trial) * (size_t)(count > 0 ? count : 1));
  enum { kCap = 64 };
  kiln_tile_config_t *cands = malloc(sizeof(*cands) * kCap);
  if (!order || !trial || !cands) {
    free(order), free(trial), free(cands);
    return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "autotune search");
  }
  int n = 0;
  for (int i = 0; i < count; ++i) {
    double w = kiln_kernel_work(&descs[i]);
    if (w >= opts->min_work && !(opts->known && opts->known[i]))
      order[n++] = (order_t){i, w};
  }
  qsort(order, (size_t)n, sizeof(*order), by_work_desc);
  bool tty = opts->progress && isatty(2);
  for (int o = 0; o < n && !result->budget_exhausted; ++o) {
    int i = order[o].index;
    char what[160];
    kiln_autotune_desc_format(&descs[i], what, sizeof(what));
    result->tuned++;
    for (int stage = 0; stage < kiln_autotune_stage_count(&descs[i]); ++stage) {
      int nc = kiln_autotune_candidates(&descs[i], target, &configs[i], stage,
                                        cands, kCap);
      kiln_tile_config_t stage_best = configs[i];
      for (int c = 0; c < nc; ++c) {
        if (now_seconds() - start > opts->budget_seconds) {
          result->budget_exhausted = true;
          break;
        }
        memcpy(trial, configs, sizeof(*trial) * (size_t)count);
        trial[i] = cands[c];
        double s = 0;
        kiln_status_t ms = measure(user, trial, &s);
        result->measured++;
        if (ms) {  // a candidate that does not compile is not a result
          kiln_status_free(ms);
          continue;
        }
        if (s < best * 0.98) {
          best = s;
          stage_best = cands[c];
        }
        if (tty)
          fprintf(stderr, "\r[kiln autotune] @%s kernel %d/%d (%s) stage %d "
                  "candidate %d/%d best %.3f ms   ", opts->label, o + 1, n,
                  what, stage, c + 1, nc, best * 1e3);
      }
      configs[i] = stage_best;
      if (result->budget_exhausted) break;
    }
    if (opts->done && !result->budget_exhausted) opts->done[i] = true;
    if (opts->progress) {
      char cfg[256];
      kiln_autotune_config_format(&configs[i], cfg, sizeof(cfg));
      fprintf(stderr, "%s[kiln autotune] @%s kernel %d/%d %s: %s (%.3f ms)\n",
              tty ? "\r" : "", opts->label, o + 1, n, what, cfg, best * 1e3);
    }
  }
  result->best_seconds = best;
  if (opts->progress && result->budget_exhausted)
    fprintf(stderr, "[kiln autotune] @%s: time budget of %.1f s spent after "
            "%d measurements; the rest keep their current tiles\n",
            opts->label, opts->budget_seconds, result->measured);
  free(order);
  free(trial);
  free(cands);
  return NULL;
}

//===--- tuning database ---------------------------------------------------===//

#define KILN_TUNE_MAGIC "kiln-tune-v1"

typedef struct {
  char magic[16];
  kiln_hash128_t kernel;
  int32_t loop_count;
  int32_t threads;
  int64_t range[KILN_TILE_MAX_LOOPS];
  kiln_tile_config_t config;
  double seconds;
} tune_record_t;

static kiln_hash128_t db_key(const char *cpu_id, const kiln_kernel_desc_t *d,
                             const kiln_cpu_target_t *t) {
  kiln_hasher_t h;
  kiln_hasher_init(&h);
  kiln_hasher_update_str(&h, KILN_TUNE_MAGIC);
  kiln_hasher_update_str(&h, cpu_id ? cpu_id : "");
  kiln_hasher_update(&h, &d->hash, sizeof(d->hash));
  kiln_hasher_update(&h, &t->threads, sizeof(t->threads));
  return kiln_hasher_final(&h);
}

bool kiln_autotune_db_get(kiln_cache_t *cache, const char *cpu_id,
                          const kiln_kernel_desc_t *d,
                          const kiln_cpu_target_t *t, kiln_tile_config_t *out,
                          double *out_seconds) {
  if (!cache) return false;
  void *data = NULL;
  size_t size = 0;
  char note[256];
  if (!kiln_cache_get(cache, db_key(cpu_id, d, t), &data, &size, note,
                      sizeof(note))) {
    if (note[0])
      fprintf(stderr, "[kiln autotune] discarded a bad tuning entry: %s\n", note);
    return false;
  }
  tune_record_t r;
  bool ok = size == sizeof(r);
  if (ok) memcpy(&r, data, sizeof(r));
  free(data);
  ok = ok && memcmp(r.magic, KILN_TUNE_MAGIC, sizeof(KILN_TUNE_MAGIC)) == 0 &&
       r.kernel.hi == d->hash.hi && r.kernel.lo == d->hash.lo &&
       r.loop_count == d->loop_count && r.threads == t->threads &&
       memcmp(r.range, d->range, sizeof(r.range)) == 0 &&
       kiln_autotune_config_valid(d, t, &r.config, NULL, 0);
  if (!ok) return false;
  *out = r.config;
  if (out_seconds) *out_seconds = r.seconds;
  return true;
}

kiln_status_t kiln_autotune_db_put(kiln_cache_t *cache, const char *cpu_id,
                                   const kiln_kernel_desc_t *d,
                                   const kiln_cpu_target_t *t,
                                   const kiln_tile_config_t *config,
                                   double seconds) {
  if (!cache) return NULL;
  tune_record_t r;
  memset(&r, 0, sizeof(r));
  memcpy(r.magic, KILN_TUNE_MAGIC, sizeof(KILN_TUNE_MAGIC));
  r.kernel = d->hash;
  r.loop_count = d->loop_count;
  r.threads = t->threads;
  memcpy(r.range, d->range, sizeof(r.range));
  r.config = *config;
  r.seconds = seconds;
  return kiln_cache_put(cache, db_key(cpu_id, d, t), &r, sizeof(r));
}
