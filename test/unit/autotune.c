// lib/autotune on its own: the heuristic gives valid tiles for every shape
// and target, the search space holds only valid configs, the validity check
// rejects what it must, the measured search follows its cost function and
// its budget, and the tuning database round-trips and refuses what does not
// fit. Links the module directly (no MLIR): kernels are plain descriptors.
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lib/autotune/autotune.h"
#include "test/unit/test_util.h"

static const kiln_cpu_target_t kAvx512x2 = {64, 32, 2, 48 << 10, 1 << 20};
static const kiln_cpu_target_t kAvx2x8 = {32, 16, 8, 32 << 10, 512 << 10};
static const kiln_cpu_target_t kSse1 = {16, 16, 1, 32 << 10, 256 << 10};

static kiln_kernel_desc_t matmul(int64_t m, int64_t n, int64_t k) {
  kiln_kernel_desc_t d;
  memset(&d, 0, sizeof(d));
  d.kind = KILN_KERNEL_CONTRACTION;
  d.loop_count = 3;
  d.range[0] = m, d.range[1] = n, d.range[2] = k;
  d.reduction_mask = 1u << 2;
  d.m_dim = 0, d.n_dim = 1;
  d.elem_bytes = 4;
  d.hash.hi = (uint64_t)m * 1000003u + (uint64_t)n;
  d.hash.lo = (uint64_t)k;
  return d;
}

static kiln_kernel_desc_t batch_matmul(int64_t b, int64_t m, int64_t n,
                                       int64_t k) {
  kiln_kernel_desc_t d;
  memset(&d, 0, sizeof(d));
  d.kind = KILN_KERNEL_CONTRACTION;
  d.loop_count = 4;
  d.range[0] = b, d.range[1] = m, d.range[2] = n, d.range[3] = k;
  d.reduction_mask = 1u << 3;
  d.m_dim = 1, d.n_dim = 2;
  d.elem_bytes = 4;
  return d;
}

static kiln_kernel_desc_t rows(kiln_kernel_kind_t kind, int64_t r, int64_t c) {
  kiln_kernel_desc_t d;
  memset(&d, 0, sizeof(d));
  d.kind = kind;
  d.loop_count = 2;
  d.range[0] = r, d.range[1] = c;
  if (kind == KILN_KERNEL_ROW_REDUCTION) d.reduction_mask = 1u << 1;
  d.m_dim = d.n_dim = -1;
  d.elem_bytes = 4;
  return d;
}

// The f32 microkernel's descriptor (lowering/ops/matmul.c, f32_dot_tiles):
// m x n x k, m symbolic where `m` is negative.
static kiln_kernel_desc_t f32_dot(int64_t m, int64_t n, int64_t k) {
  kiln_kernel_desc_t d = matmul(m < 0 ? KILN_DYNAMIC_RANGE_STANDIN : m, n, k);
  d.kind = KILN_KERNEL_F32_DOT;
  d.dynamic_mask = m < 0 ? 1u : 0u;
  d.transpose_dim = -1;
  return d;
}

static int64_t forall_tiles(const kiln_kernel_desc_t *d,
                            const kiln_tile_config_t *c) {
  int64_t n = 1;
  for (int i = 0; i < d->loop_count; ++i)
    if (c->forall[i] > 0) n *= d->range[i] / c->forall[i];
  return n;
}

static void check_valid(const kiln_kernel_desc_t *d, const kiln_cpu_target_t *t,
                        const kiln_tile_config_t *c) {
  char why[256];
  if (!kiln_autotune_config_valid(d, t, c, why, sizeof(why))) {
    char a[160], b[256];
    kiln_autotune_desc_format(d, a, sizeof(a));
    kiln_autotune_config_format(c, b, sizeof(b));
    fprintf(stderr, "invalid config for %s: %s (%s)\n", a, b, why);
    kt_failures++;
  }
}

// The heuristic's config for `d` on `t` and every candidate of its search
// space are valid, and the candidates distinct from it and each other;
// returns how many candidates there were.
static int check_space(const kiln_kernel_desc_t *d, const kiln_cpu_target_t *t) {
  kiln_tile_config_t c, cand[64];
  kiln_autotune_heuristic(d, t, &c);
  check_valid(d, t, &c);
  int checked = 0;
  for (int st = 0; st < kiln_autotune_stage_count(d); ++st) {
    int n = kiln_autotune_candidates(d, t, &c, st, cand, 64);
    for (int i = 0; i < n; ++i) {
      check_valid(d, t, &cand[i]);
      CHECK(memcmp(&cand[i], &c, sizeof(c)) != 0);
      for (int j = 0; j < i; ++j) CHECK(memcmp(&cand[i], &cand[j], sizeof(c)) != 0);
    }
    checked += n;
  }
  return checked;
}

// The heuristic is valid for every shape, including primes and 1s, on
// every target; the search space of each holds only valid configs.
static void test_heuristic_valid_everywhere(void) {
  const int64_t sizes[] = {1, 2, 3, 7, 16, 31, 64, 100, 128, 257, 512, 1024, 4096};
  const kiln_cpu_target_t *targets[] = {&kAvx512x2, &kAvx2x8, &kSse1};
  int checked = 0;
  for (int ti = 0; ti < 3; ++ti)
    for (int a = 0; a < 13; ++a)
      for (int b = 0; b < 13; ++b) {
        kiln_kernel_desc_t ds[5] = {
            matmul(sizes[a], sizes[b], sizes[(a + b) % 13]),
            batch_matmul(sizes[a % 4 + 1], sizes[b], sizes[a], 64),
            rows(KILN_KERNEL_ELEMENTWISE, sizes[a], sizes[b]),
            rows(KILN_KERNEL_ROW_REDUCTION, sizes[a], sizes[b]),
            rows(KILN_KERNEL_TRANSPOSE, sizes[a], sizes[b])};
        for (int k = 0; k < 5; ++k) {
          kiln_tile_config_t c;
          kiln_autotune_heuristic(&ds[k], targets[ti], &c);
          check_valid(&ds[k], targets[ti], &c);
          ds[k].nested = true;
          kiln_autotune_heuristic(&ds[k], targets[ti], &c);
          check_valid(&ds[k], targets[ti], &c);
          for (int i = 0; i < c.loop_count; ++i) CHECK(c.forall[i] == 0);
          ds[k].nested = false;
          kiln_autotune_heuristic(&ds[k], targets[ti], &c);
          kiln_tile_config_t cand[64];
          for (int st = 0; st < kiln_autotune_stage_count(&ds[k]); ++st) {
            int n = kiln_autotune_candidates(&ds[k], targets[ti], &c, st, cand, 64);
            for (int i = 0; i < n; ++i) {
              check_valid(&ds[k], targets[ti], &cand[i]);
              CHECK(memcmp(&cand[i], &c, sizeof(c)) != 0);
              for (int j = 0; j < i; ++j)
                CHECK(memcmp(&cand[i], &cand[j], sizeof(c)) != 0);
            }
            checked += n;
          }
        }
      }
  printf("heuristic and %d candidates valid over 3 targets x 845 kernels\n",
         checked);
}

// What the heuristic picks for the bench's 1024^3 matmul: a register tile
// that fills but does not overflow the register file, at least one thread
// tile per thread, K in cache blocks once B outgrows L2.
static void test_heuristic_matmul(void) {
  kiln_kernel_desc_t d = matmul(1024, 1024, 1024);
  kiln_tile_config_t c;
  kiln_autotune_heuristic(&d, &kAvx512x2, &c);
  CHECK(c.reg[0] == 8 && c.reg[1] == 32 && c.reg[2] == 1);
  CHECK(forall_tiles(&d, &c) >= kAvx512x2.threads);
  CHECK(c.cache[2] == 256);
  // AVX2 has half the registers of half the width: 8x32 would spill.
  kiln_autotune_heuristic(&d, &kAvx2x8, &c);
  CHECK(c.reg[0] * (c.reg[1] / 8) + c.reg[1] / 8 + 1 <= 16);
  CHECK(c.reg[1] >= 8);
  CHECK(forall_tiles(&d, &c) >= kAvx2x8.threads);
  // Small problems run on one thread and keep K whole.
  d = matmul(16, 32, 16);
  kiln_autotune_heuristic(&d, &kAvx512x2, &c);
  CHECK(forall_tiles(&d, &c) == 1 && c.cache[2] == 0);
  // Batched: one batch per thread tile.
  d = batch_matmul(8, 64, 64, 64);
  kiln_autotune_heuristic(&d, &kAvx512x2, &c);
  CHECK(c.forall[0] == 1 && c.forall[1] == 0 && c.forall[2] == 0);
  // Row reductions: an accumulator of four vectors, rows over threads; a
  // row of 24 takes the largest split that divides it.
  d = rows(KILN_KERNEL_ROW_REDUCTION, 4096, 4096);
  kiln_autotune_heuristic(&d, &kAvx512x2, &c);
  CHECK(c.reduction_dim == 1 && c.reduction_tile == 64 && c.forall[0] > 0);
  d = rows(KILN_KERNEL_ROW_REDUCTION, 4096, 24);
  kiln_autotune_heuristic(&d, &kAvx512x2, &c);
  CHECK(c.reduction_dim == 1 && c.reduction_tile == 8);
  // Output sizes with no whole-vector divisor (1000 columns, 500 rows)
  // keep the full register tile and thread tiles of whole register tiles;
  // the last tiles are partial.
  d = matmul(500, 1000, 2048);
  kiln_autotune_heuristic(&d, &kAvx512x2, &c);
  CHECK(c.reg[0] == 8 && c.reg[1] == 32);
  CHECK(c.forall[1] > 0 && c.forall[1] % 32 == 0 && c.forall[0] > 0 && c.forall[0] % 8 == 0);
  CHECK(kiln_autotune_config_valid(&d, &kAvx512x2, &c, NULL, 0));
  // Batched too: a ViT's q @ k^T over 197 tokens ([6, 197, 64] x [6, 64,
  // 197]) keeps the 8 x 32 register tile (197 has no other divisor than
  // 1, which made every tile one scalar FMA); a batch per thread tile.
  d = batch_matmul(6, 197, 197, 64);
  kiln_autotune_heuristic(&d, &kAvx512x2, &c);
  CHECK(c.reg[1] == 8 && c.reg[2] == 32 && c.forall[0] == 1);
  CHECK(kiln_autotune_config_valid(&d, &kAvx512x2, &c, NULL, 0));
  // A partial tile of the batch is still refused.
  kiln_tile_config_t bad = c;
  bad.forall[0] = 4;
  CHECK(!kiln_autotune_config_valid(&d, &kAvx512x2, &bad, NULL, 0));
  // A convolution's contraction (n, g, f, p, c, kh, kw; the input's index
  // a sum of loops) over a grid of odd width: a register tile of one
  // pixel keeps one filter (several were vectorized wrongly), and the
  // search may not ask for more.
  kiln_kernel_desc_t cv;
  memset(&cv, 0, sizeof(cv));
  cv.kind = KILN_KERNEL_CONTRACTION;
  cv.loop_count = 7;
  const int64_t cr[7] = {2, 1, 32, 9, 16, 1, 1};
  memcpy(cv.range, cr, sizeof(cr));
  cv.reduction_mask = 7u << 4;
  cv.m_dim = 2, cv.n_dim = 3;
  cv.elem_bytes = 4;
  cv.sum_maps = true;
  kiln_autotune_heuristic(&cv, &kAvx512x2, &c);
  CHECK(c.reg[3] == 1 && c.reg[2] == 1);
  check_space(&cv, &kAvx512x2);
  bad = c;
  bad.reg[2] = 8;
  CHECK(!kiln_autotune_config_valid(&cv, &kAvx512x2, &bad, NULL, 0));
}

// The f32 microkernel's tiles: the heuristic's documented choices, valid
// for every shape and target with a search space of valid, distinct
// configs, and the validity check's refusals.
static void test_f32_microkernel(void) {
  const int64_t sizes[] = {-1, 1, 7, 31, 32, 100, 256, 257, 1000, 1024, 2048};
  const kiln_cpu_target_t *targets[] = {&kAvx512x2, &kAvx2x8, &kSse1};
  int checked = 0;
  for (int ti = 0; ti < 3; ++ti)
    for (int a = 0; a < 11; ++a)
      for (int b = 1; b < 11; ++b)
        for (int k = 1; k < 11; k += 3) {
          kiln_kernel_desc_t d = f32_dot(sizes[a], sizes[b], sizes[k]);
          d.fixed_rows = (a + b) % 2 == 0;
          checked += check_space(&d, targets[ti]);
        }
  printf("f32 microkernel: heuristic and %d candidates valid\n", checked);
  // 1024^3: 8 x 32 tiles, K blocks of 256, four blocks of 256 rows, one
  // group of panels; rows of A 4 KiB apart, so each block packs its A.
  kiln_kernel_desc_t d = f32_dot(1024, 1024, 1024);
  kiln_tile_config_t c;
  kiln_autotune_heuristic(&d, &kAvx512x2, &c);
  CHECK(c.reg[0] == 8 && c.reg[1] == 32 && c.reg[2] == 1);
  CHECK(c.cache[2] == 256 && c.forall[0] == 256 && c.forall[1] == 0);
  CHECK(c.cache[0] == 256);
  {
    // The last stage toggles the packing, and the others keep it where
    // the new sizes allow: 4-row tiles keep blocks of 256 rows, 12-row
    // tiles make them 264, which do not divide M, so A is read in place.
    kiln_tile_config_t cand[64];
    int n = kiln_autotune_candidates(&d, &kAvx512x2, &c, 4, cand, 64);
    CHECK(n == 1 && cand[0].cache[0] == 0);
    kiln_tile_config_t back[4];
    CHECK(kiln_autotune_candidates(&d, &kAvx512x2, &cand[0], 4, back, 4) == 1 &&
          back[0].cache[0] == 256);
    n = kiln_autotune_candidates(&d, &kAvx512x2, &c, 0, cand, 64);
    int seen = 0;
    for (int i = 0; i < n; ++i) {
      if (cand[i].reg[0] == 4) seen += cand[i].forall[0] == 256 && cand[i].cache[0] == 256;
      if (cand[i].reg[0] == 12) seen += cand[i].forall[0] == 264 && cand[i].cache[0] == 0;
    }
    CHECK(seen == 2);
    // Not where A is transposed (packed per tile already), its rows are
    // symbolic, its rows are not 4 KiB apart, or groups of 8 panels
    // would read the packed block too few times.
    kiln_kernel_desc_t e = d;
    e.fixed_rows = true;
    kiln_tile_config_t h;
    kiln_autotune_heuristic(&e, &kAvx512x2, &h);
    CHECK(h.cache[0] == 0);
    const int64_t no[][3] = {{-1, 1024, 1024}, {1024, 1024, 512}, {256, 1024, 1024}};
    for (int i = 0; i < 3; ++i) {
      e = f32_dot(no[i][0], no[i][1], no[i][2]);
      kiln_autotune_heuristic(&e, &kAvx512x2, &h);
      CHECK(h.cache[0] == 0);
    }
    // Refused: a packed block other than the row block.
    kiln_tile_config_t bad = c;
    bad.cache[0] = 128;
    char why[256];
    CHECK(!kiln_autotune_config_valid(&d, &kAvx512x2, &bad, why, sizeof(why)));
    CHECK(strstr(why, "A packed") != NULL);
  }
  // One block of 256 rows: its 32 panels in four groups; K = 300 in two
  // equal blocks.
  d = f32_dot(256, 1024, 300);
  kiln_autotune_heuristic(&d, &kAvx512x2, &c);
  CHECK(c.forall[0] == 0 && c.forall[1] == 256 && c.cache[2] == 150);
  // 500 rows: two blocks of 256 (whole tiles), the panels in two groups;
  // K within one block.
  d = f32_dot(500, 1000, 256);
  kiln_autotune_heuristic(&d, &kAvx512x2, &c);
  CHECK(c.forall[0] == 256 && c.forall[1] == 16 * 32 && c.cache[2] == 0);
  // Symbolic rows: quarters at run time, no groups.
  d = f32_dot(-1, 1024, 1024);
  kiln_autotune_heuristic(&d, &kAvx512x2, &c);
  CHECK(c.forall[0] == 0 && c.forall[1] == 0);
  // Sixteen registers: fewer rows.
  kiln_autotune_heuristic(&d, &kAvx2x8, &c);
  CHECK(c.reg[0] == 6);
  // Refusals.
  d = f32_dot(512, 512, 512);
  kiln_autotune_heuristic(&d, &kAvx512x2, &c);
  char why[256];
  kiln_tile_config_t bad = c;
  bad.reg[0] = 16;  // 32 accumulators + 3
  CHECK(!kiln_autotune_config_valid(&d, &kAvx512x2, &bad, why, sizeof(why)));
  CHECK(strstr(why, "vector registers") != NULL);
  bad = c;
  bad.reg[1] = 16;  // the tile is two vectors wide
  CHECK(!kiln_autotune_config_valid(&d, &kAvx512x2, &bad, why, sizeof(why)));
  bad = c;
  bad.forall[0] = 100;  // not whole 8-row tiles
  CHECK(!kiln_autotune_config_valid(&d, &kAvx512x2, &bad, why, sizeof(why)));
  CHECK(strstr(why, "row block") != NULL);
  bad = c;
  bad.cache[2] = 512;  // a K block of all of K is 0
  CHECK(!kiln_autotune_config_valid(&d, &kAvx512x2, &bad, why, sizeof(why)));
  bad = c;
  bad.forall[1] = 48;  // groups take whole panels
  CHECK(!kiln_autotune_config_valid(&d, &kAvx512x2, &bad, why, sizeof(why)));
  CHECK(strstr(why, "column group") != NULL);
  d = f32_dot(-1, 512, 512);
  kiln_autotune_heuristic(&d, &kAvx512x2, &c);
  bad = c;
  bad.forall[0] = 64;  // symbolic rows take no static block
  CHECK(!kiln_autotune_config_valid(&d, &kAvx512x2, &bad, why, sizeof(why)));
  // A partial last panel keeps tiles of at most 8 rows (compile time).
  d = f32_dot(1024, 1000, 1024);
  kiln_autotune_heuristic(&d, &kAvx512x2, &c);
  bad = c;
  bad.reg[0] = 10, bad.forall[0] = 260;
  CHECK(!kiln_autotune_config_valid(&d, &kAvx512x2, &bad, why, sizeof(why)));
  CHECK(strstr(why, "partial last panel") != NULL);
  // A packed per register tile (a weight gradient): the heuristic's rows
  // only, and the first stage has no other candidate.
  d = f32_dot(512, 1024, 256);
  d.fixed_rows = true;
  kiln_autotune_heuristic(&d, &kAvx512x2, &c);
  CHECK(c.reg[0] == 8 && kiln_autotune_config_valid(&d, &kAvx512x2, &c, NULL, 0));
  bad = c;
  bad.reg[0] = 12, bad.forall[0] = 264;
  CHECK(!kiln_autotune_config_valid(&d, &kAvx512x2, &bad, why, sizeof(why)));
  CHECK(strstr(why, "packed") != NULL);
  kiln_tile_config_t none[16];
  CHECK(kiln_autotune_candidates(&d, &kAvx512x2, &c, 0, none, 16) == 0);
}

// The convolution microkernel's descriptor (lowering/ops/matmul.c,
// conv_dot_tiles): n images, f filters, p pixels, c channels, t taps.
static kiln_kernel_desc_t conv_dot(int64_t n, int64_t f, int64_t p, int64_t c, int64_t t) {
  kiln_kernel_desc_t d;
  memset(&d, 0, sizeof(d));
  d.kind = KILN_KERNEL_CONV_DOT;
  d.loop_count = 5;
  int64_t r[5] = {n, f, p, c, t};
  memcpy(d.range, r, sizeof(r));
  d.reduction_mask = (1u << 3) | (1u << 4);
  d.m_dim = 1, d.n_dim = 2;
  d.transpose_dim = -1;
  d.elem_bytes = 4;
  return d;
}

// KILN_KERNEL_CONV_DOT: the heuristic is what emit_conv_dot had fixed, valid
// for every shape and target with a search space of valid, distinct
// configs, and the validity check's refusals.
static void test_conv_microkernel(void) {
  const int64_t ns[] = {1, 2, 8}, fs[] = {8, 24, 64, 256}, ps[] = {48, 64, 224, 896, 3248},
                cs[] = {3, 45, 64, 512}, ts[] = {1, 9, 25};
  const kiln_cpu_target_t *targets[] = {&kAvx512x2, &kAvx2x8, &kSse1};
  int checked = 0;
  for (int ti = 0; ti < 3; ++ti)
    for (int a = 0; a < 3; ++a)
      for (int b = 0; b < 4; ++b)
        for (int p = 0; p < 5; ++p)
          for (int k = 0; k < 4; ++k)
            for (int t = 0; t < 3; ++t) {
              kiln_kernel_desc_t d = conv_dot(ns[a], fs[b], ps[p], cs[k], ts[t]);
              checked += check_space(&d, targets[ti]);
            }
  printf("conv microkernel: heuristic and %d candidates valid\n", checked);
  // 3x3, 64 -> 64 channels, 2 x 28 x 28 (P = 28 x 32): 8 x 48 tiles,
  // chunks of 448 pixels, blocks of 32 channels (288 taps), 2 x 2 tasks
  // too few, so the filters split in two groups of 32.
  kiln_kernel_desc_t d = conv_dot(2, 64, 896, 64, 9);
  kiln_tile_config_t c;
  kiln_autotune_heuristic(&d, &kAvx512x2, &c);
  CHECK(c.reg[1] == 8 && c.reg[2] == 48 && c.forall[2] == 448 && c.cache[3] == 32);
  CHECK(c.forall[1] == 32 && c.forall[0] == 0);
  // A batch of one through a 14 x 14 layer, 256 channels: one chunk of
  // 224 pixels (all of P), 8 channel blocks of 32, 8 groups of 32 filters.
  d = conv_dot(1, 256, 224, 256, 9);
  kiln_autotune_heuristic(&d, &kAvx512x2, &c);
  CHECK(c.forall[2] == 0 && c.cache[3] == 32 && c.forall[1] == 32);
  // Eight images make tasks enough: one group of filters. Sixteen
  // registers: 4-filter tiles.
  d = conv_dot(8, 64, 3248, 64, 9);
  kiln_autotune_heuristic(&d, &kAvx512x2, &c);
  CHECK(c.forall[1] == 0 && c.forall[2] == 464);
  kiln_autotune_heuristic(&d, &kAvx2x8, &c);
  CHECK(c.reg[1] == 4 && c.reg[2] == 48);
  // The register tile stage keeps a task's filters whole tiles: 12-filter
  // tiles divide no group of 64 filters and are not offered; 16 x 16 is.
  d = conv_dot(2, 64, 896, 64, 9);
  kiln_autotune_heuristic(&d, &kAvx512x2, &c);
  kiln_tile_config_t cand[64];
  int n = kiln_autotune_candidates(&d, &kAvx512x2, &c, 0, cand, 64);
  int sixteen = 0;
  for (int i = 0; i < n; ++i) {
    CHECK(cand[i].reg[1] != 12 && cand[i].reg[1] != 6);
    sixteen += cand[i].reg[1] == 16 && cand[i].reg[2] == 16;
  }
  CHECK(sixteen == 1);
  // Refusals.
  char why[256];
  kiln_tile_config_t bad = c;
  bad.reg[1] = 16, bad.reg[2] = 32;  // 32 accumulators + 3
  CHECK(!kiln_autotune_config_valid(&d, &kAvx512x2, &bad, why, sizeof(why)));
  CHECK(strstr(why, "vector registers") != NULL);
  bad = c;
  bad.reg[2] = 40;  // whole vectors of pixels
  CHECK(!kiln_autotune_config_valid(&d, &kAvx512x2, &bad, why, sizeof(why)));
  CHECK(strstr(why, "register tile") != NULL);
  bad = c;
  bad.forall[1] = 24;  // does not divide 64 filters
  CHECK(!kiln_autotune_config_valid(&d, &kAvx512x2, &bad, why, sizeof(why)));
  CHECK(strstr(why, "filters a task") != NULL);
  bad = c;
  bad.reg[1] = 6, bad.reg[2] = 64;  // 6-filter tiles in a group of 32
  CHECK(!kiln_autotune_config_valid(&d, &kAvx512x2, &bad, why, sizeof(why)));
  bad = c;
  bad.forall[2] = 100;  // not whole vectors
  CHECK(!kiln_autotune_config_valid(&d, &kAvx512x2, &bad, why, sizeof(why)));
  CHECK(strstr(why, "chunks") != NULL);
  bad = c;
  bad.forall[2] = 384;  // does not divide 896
  CHECK(!kiln_autotune_config_valid(&d, &kAvx512x2, &bad, why, sizeof(why)));
  bad = c;
  bad.cache[3] = 64;  // a block of all channels is 0
  CHECK(!kiln_autotune_config_valid(&d, &kAvx512x2, &bad, why, sizeof(why)));
  CHECK(strstr(why, "channel block") != NULL);
  bad = c;
  bad.forall[0] = 1;  // images are always tasks
  CHECK(!kiln_autotune_config_valid(&d, &kAvx512x2, &bad, why, sizeof(why)));
  bad = c;
  bad.reduction_dim = 3, bad.reduction_tile = 16;
  CHECK(!kiln_autotune_config_valid(&d, &kAvx512x2, &bad, why, sizeof(why)));
}

// The bf16 microkernel's descriptor (lowering/ops/matmul.c,
// bf16_dot_tiles): m x n x k, m symbolic where `m` is negative.
static kiln_kernel_desc_t bf16_dot(int64_t m, int64_t n, int64_t k, bool amx) {
  kiln_kernel_desc_t d = f32_dot(m, n, k);
  d.kind = KILN_KERNEL_BF16_DOT;
  d.elem_bytes = 2;
  d.amx = amx;
  return d;
}

// KILN_KERNEL_BF16_DOT: the heuristic is what emit_bf16_dot had fixed,
// valid for every shape and target with a search space of valid, distinct
// configs, and the validity check's refusals.
static void test_bf16_microkernel(void) {
  const int64_t sizes[] = {-1, 2, 6, 32, 64, 96, 256, 500, 512, 1024};
  const kiln_cpu_target_t *targets[] = {&kAvx512x2, &kAvx2x8, &kSse1};
  int checked = 0;
  for (int ti = 0; ti < 3; ++ti)
    for (int a = 0; a < 10; ++a)
      for (int b = 1; b < 10; ++b)
        for (int amx = 0; amx < 2; ++amx) {
          kiln_kernel_desc_t d = bf16_dot(sizes[a], sizes[b], 768, amx);
          checked += check_space(&d, targets[ti]);
        }
  printf("bf16 microkernel: heuristic and %d candidates valid\n", checked);
  // 512 rows: 8-row tiles, four blocks of 128; with AMX too (32-row
  // tiles). 64 rows with AMX: two blocks of 32 (16-row blocks would run
  // on the vector kernel); without, four of 16. 6 rows: 2-row tiles.
  kiln_kernel_desc_t d = bf16_dot(512, 512, 512, false);
  kiln_tile_config_t c;
  kiln_autotune_heuristic(&d, &kAvx512x2, &c);
  CHECK(c.reg[0] == 8 && c.reg[1] == 32 && c.reg[2] == 2 && c.forall[0] == 128);
  d.amx = true;
  kiln_autotune_heuristic(&d, &kAvx512x2, &c);
  CHECK(c.forall[0] == 128);
  d = bf16_dot(64, 768, 768, true);
  kiln_autotune_heuristic(&d, &kAvx512x2, &c);
  CHECK(c.forall[0] == 32);
  d.amx = false;
  kiln_autotune_heuristic(&d, &kAvx512x2, &c);
  CHECK(c.forall[0] == 16);
  d = bf16_dot(6, 512, 512, false);
  kiln_autotune_heuristic(&d, &kAvx512x2, &c);
  CHECK(c.reg[0] == 2 && c.forall[0] == 0);
  d = bf16_dot(-1, 512, 512, true);
  kiln_autotune_heuristic(&d, &kAvx512x2, &c);
  CHECK(c.reg[0] == 8 && c.forall[0] == 0);
  // The tile stage refits the block to whole tiles that divide M: 512
  // rows take no 12-row tiles (no block of them divides 512) and 6-row
  // ones neither; 4-row tiles keep blocks of 128. With AMX blocks of 128
  // rows are 32-row tiles only: no register tile is offered; 96 rows in
  // blocks of 48 leave 16 to them.
  d = bf16_dot(512, 512, 512, false);
  kiln_autotune_heuristic(&d, &kAvx512x2, &c);
  kiln_tile_config_t cand[64];
  int n = kiln_autotune_candidates(&d, &kAvx512x2, &c, 0, cand, 64);
  int four = 0;
  for (int i = 0; i < n; ++i) {
    CHECK(cand[i].reg[0] != 12 && cand[i].reg[0] != 6);
    four += cand[i].reg[0] == 4 && cand[i].forall[0] == 128;
  }
  CHECK(four == 1);
  d.amx = true;
  kiln_autotune_heuristic(&d, &kAvx512x2, &c);
  CHECK(kiln_autotune_candidates(&d, &kAvx512x2, &c, 0, cand, 64) == 0);
  kiln_kernel_desc_t e96 = bf16_dot(96, 512, 512, true);
  kiln_tile_config_t c96;
  kiln_autotune_heuristic(&e96, &kAvx512x2, &c96);
  CHECK(c96.forall[0] == 0);
  c96.forall[0] = 48;
  n = kiln_autotune_candidates(&e96, &kAvx512x2, &c96, 0, cand, 64);
  int kept = 0;  // tiles that divide the 16 rows keep the block
  for (int i = 0; i < n; ++i)
    if (cand[i].forall[0] == 48) kept += cand[i].reg[0] == 2 || cand[i].reg[0] == 4 ? 1 : 100;
  CHECK(kept == 2);
  d.amx = false;
  kiln_autotune_heuristic(&d, &kAvx512x2, &c);
  // Refusals.
  char why[256];
  kiln_tile_config_t bad = c;
  bad.reg[0] = 16;  // 32 accumulators + 3
  CHECK(!kiln_autotune_config_valid(&d, &kAvx512x2, &bad, why, sizeof(why)));
  CHECK(strstr(why, "vector registers") != NULL);
  bad = c;
  bad.forall[0] = 100;  // does not divide 512
  CHECK(!kiln_autotune_config_valid(&d, &kAvx512x2, &bad, why, sizeof(why)));
  CHECK(strstr(why, "row block") != NULL);
  bad = c;
  bad.reg[0] = 6;  // blocks of 128 rows are no whole 6-row tiles
  CHECK(!kiln_autotune_config_valid(&d, &kAvx512x2, &bad, why, sizeof(why)));
  bad = c;
  bad.cache[2] = 256;  // no K blocks: the whole of K stays in registers
  CHECK(!kiln_autotune_config_valid(&d, &kAvx512x2, &bad, why, sizeof(why)));
  d = bf16_dot(512, 500, 512, false);
  kiln_autotune_heuristic(&d, &kAvx512x2, &c);
  bad = c;
  bad.reg[0] = 10, bad.forall[0] = 0;
  CHECK(!kiln_autotune_config_valid(&d, &kAvx512x2, &bad, why, sizeof(why)));
  CHECK(strstr(why, "partial last panel") != NULL);
  d = bf16_dot(-1, 512, 512, false);
  kiln_autotune_heuristic(&d, &kAvx512x2, &c);
  bad = c;
  bad.forall[0] = 64;  // symbolic rows take no static block
  CHECK(!kiln_autotune_config_valid(&d, &kAvx512x2, &bad, why, sizeof(why)));
}

// The tensor-core GEMM of the CUDA target (KILN_KERNEL_GPU_MMA): the
// heuristic is the shape kernels/gpu_mma.c had fixed, the candidates stay
// within the block's shared memory, and bad shapes are refused.
static kiln_kernel_desc_t gpu_mma(int64_t m, int64_t n, int64_t k, bool wgmma) {
  kiln_kernel_desc_t d = matmul(m, n, k);
  d.kind = KILN_KERNEL_GPU_MMA;
  d.transpose_dim = -1;
  d.elem_bytes = 2;
  d.wgmma = wgmma;
  return d;
}

static void test_gpu_mma(void) {
  const kiln_cpu_target_t none = {0, 0, 1, 0, 0};
  // 4096^3 on sm_90: 128 x 256 blocks, 4 stages, groups of 8 block rows.
  kiln_kernel_desc_t d = gpu_mma(4096, 4096, 4096, true);
  kiln_tile_config_t c;
  kiln_autotune_heuristic(&d, &none, &c);
  CHECK(c.reg[0] == 128 && c.reg[1] == 256 && c.reg[2] == 64);
  CHECK(c.cache[2] == 4 && c.forall[0] == 8);
  check_valid(&d, &none, &c);
  // N = 384: 128-column blocks; 2 rows of blocks: groups of 2.
  d = gpu_mma(256, 384, 512, true);
  kiln_autotune_heuristic(&d, &none, &c);
  CHECK(c.reg[1] == 128 && c.cache[2] == 4 && c.forall[0] == 2);
  // mma.sync: 128 x 128 x 32 blocks in 3 stages; its only knob the group.
  d = gpu_mma(1024, 640, 256, false);
  kiln_autotune_heuristic(&d, &none, &c);
  CHECK(c.reg[1] == 128 && c.reg[2] == 32 && c.cache[2] == 3 && c.forall[0] == 8);
  kiln_tile_config_t cand[64];
  CHECK(kiln_autotune_candidates(&d, &none, &c, 0, cand, 64) == 0);
  CHECK(kiln_autotune_candidates(&d, &none, &c, 1, cand, 64) == 0);
  int n = kiln_autotune_candidates(&d, &none, &c, 2, cand, 64);
  CHECK(n == 3);  // groups of 1, 2, 4 (16 does not divide 8 rows of blocks)
  // Every candidate valid and distinct, over shapes and both forms; the
  // warpgroup-MMA ones within 227 KB of shared memory.
  const int64_t sizes[] = {128, 256, 384, 1024, 4096};
  int checked = 0;
  for (int w = 0; w < 2; ++w)
    for (int a = 0; a < 5; ++a)
      for (int b = 0; b < 5; ++b) {
        d = gpu_mma(sizes[a], sizes[b], 1024, w);
        kiln_autotune_heuristic(&d, &none, &c);
        check_valid(&d, &none, &c);
        for (int st = 0; st < kiln_autotune_stage_count(&d); ++st) {
          n = kiln_autotune_candidates(&d, &none, &c, st, cand, 64);
          for (int i = 0; i < n; ++i) {
            check_valid(&d, &none, &cand[i]);
            CHECK(memcmp(&cand[i], &c, sizeof(c)) != 0);
            for (int j = 0; j < i; ++j) CHECK(memcmp(&cand[i], &cand[j], sizeof(c)) != 0);
            if (w) {
              int64_t pipe = cand[i].cache[2] * (128 + cand[i].reg[1]) * 64 * 2;
              CHECK(1024 + pipe <= KILN_GPU_MMA_SHARED_BYTES);
            }
          }
          checked += n;
        }
      }
  printf("tensor-core GEMM: heuristic and %d candidates valid\n", checked);
  // Refusals.
  d = gpu_mma(4096, 4096, 4096, true);
  kiln_autotune_heuristic(&d, &none, &c);
  char why[256];
  kiln_tile_config_t bad = c;
  bad.cache[2] = 5;  // 5 x 48 KB of 128 x 256 stages
  CHECK(!kiln_autotune_config_valid(&d, &none, &bad, why, sizeof(why)));
  CHECK(strstr(why, "shared memory") != NULL);
  bad = c;
  bad.forall[0] = 3;
  CHECK(!kiln_autotune_config_valid(&d, &none, &bad, why, sizeof(why)));
  CHECK(strstr(why, "groups") != NULL);
  d = gpu_mma(4096, 384, 4096, true);
  bad = c;  // 256-column blocks do not divide N = 384
  CHECK(!kiln_autotune_config_valid(&d, &none, &bad, why, sizeof(why)));
  d = gpu_mma(1024, 640, 256, false);
  kiln_autotune_heuristic(&d, &none, &c);
  bad = c;
  bad.reg[1] = 256;  // mma.sync blocks are 128 wide
  CHECK(!kiln_autotune_config_valid(&d, &none, &bad, why, sizeof(why)));
}

static void test_validity_rejects(void) {
  kiln_kernel_desc_t d = matmul(64, 64, 64);
  kiln_tile_config_t c;
  kiln_autotune_heuristic(&d, &kAvx512x2, &c);
  char why[256];
  kiln_tile_config_t bad = c;
  bad.cache[2] = 48;  // 48 does not divide K = 64
  CHECK(!kiln_autotune_config_valid(&d, &kAvx512x2, &bad, why, sizeof(why)));
  CHECK(strstr(why, "does not divide") != NULL);
  // A plain matmul's output tiles may be partial (peeled by the schedule).
  bad = c;
  bad.reg[0] = 6;
  CHECK(kiln_autotune_config_valid(&d, &kAvx512x2, &bad, why, sizeof(why)));
  bad = c;
  bad.cache[0] = 32;  // a cache tile of an output dim
  CHECK(!kiln_autotune_config_valid(&d, &kAvx512x2, &bad, why, sizeof(why)));
  CHECK(strstr(why, "reduction loops") != NULL);
  bad = c;
  bad.forall[2] = 32;  // distributing the reduction
  CHECK(!kiln_autotune_config_valid(&d, &kAvx512x2, &bad, why, sizeof(why)));
  bad = c;
  bad.reg[0] = 16, bad.reg[1] = 64;  // 16 x 4 accumulators + 5
  CHECK(!kiln_autotune_config_valid(&d, &kAvx512x2, &bad, why, sizeof(why)));
  CHECK(strstr(why, "vector registers") != NULL);
  bad = c;
  bad.reg[2] = 4;  // contractions step K by one
  CHECK(!kiln_autotune_config_valid(&d, &kAvx512x2, &bad, why, sizeof(why)));
  bad = c;
  bad.loop_count = 2;
  CHECK(!kiln_autotune_config_valid(&d, &kAvx512x2, &bad, why, sizeof(why)));
  kiln_kernel_desc_t r = rows(KILN_KERNEL_ROW_REDUCTION, 64, 100);
  kiln_autotune_heuristic(&r, &kAvx512x2, &c);
  bad = c;
  bad.reduction_dim = 1, bad.reduction_tile = 8;  // 8 does not divide 100
  CHECK(!kiln_autotune_config_valid(&r, &kAvx512x2, &bad, why, sizeof(why)));
}

// Symbolic loops are planned with the stand-in range; nothing may split
// them into blocks that assume their size: no cache block of a symbolic K,
// no vector split of a symbolic row.
static void test_symbolic_loops(void) {
  const int64_t any = KILN_DYNAMIC_RANGE_STANDIN;
  kiln_kernel_desc_t d = matmul(any, 1024, 1024);
  d.dynamic_mask = 1u << 0;  // symbolic M: tiles as for a large M
  kiln_tile_config_t c;
  kiln_autotune_heuristic(&d, &kAvx512x2, &c);
  CHECK(c.reg[0] == 8 && c.reg[1] == 32);
  check_valid(&d, &kAvx512x2, &c);
  d = matmul(1024, 1024, any);
  d.dynamic_mask = 1u << 2;  // symbolic K
  kiln_autotune_heuristic(&d, &kAvx512x2, &c);
  CHECK(c.cache[2] == 0);
  check_valid(&d, &kAvx512x2, &c);
  char why[256];
  kiln_tile_config_t bad = c;
  bad.cache[2] = 256;
  CHECK(!kiln_autotune_config_valid(&d, &kAvx512x2, &bad, why, sizeof(why)));
  CHECK(strstr(why, "symbolic") != NULL);
  kiln_kernel_desc_t r = rows(KILN_KERNEL_ROW_REDUCTION, 4096, any);
  r.dynamic_mask = 1u << 1;  // rows of symbolic length: reduced in scalar
  kiln_autotune_heuristic(&r, &kAvx512x2, &c);
  CHECK(c.reduction_dim == -1);
  check_valid(&r, &kAvx512x2, &c);
  bad = c;
  bad.reduction_dim = 1, bad.reduction_tile = 16;
  CHECK(!kiln_autotune_config_valid(&r, &kAvx512x2, &bad, why, sizeof(why)));
  r = rows(KILN_KERNEL_ROW_REDUCTION, any, 4096);
  r.dynamic_mask = 1u << 0;  // a symbolic number of rows keeps the split
  kiln_autotune_heuristic(&r, &kAvx512x2, &c);
  CHECK(c.reduction_dim == 1 && c.reduction_tile == 64);
  char text[160];
  kiln_autotune_desc_format(&r, text, sizeof(text));
  CHECK(strcmp(text, "row-reduction ?x4096r") == 0);
}

// A synthetic cost: time grows with the distance of the register tile from
// 4x16 and of the K block from 128; candidates with reg[0] == 2 "fail to
// compile". The search must end at the optimum, skip the failures and
// count every measurement.
typedef struct {
  int calls, failures;
} fake_t;

static kiln_status_t fake_measure(void *user, const kiln_tile_config_t *cs,
                                  double *out) {
  fake_t *f = user;
  f->calls++;
  const kiln_tile_config_t *c = &cs[0];
  if (c->reg[0] == 2) {
    f->failures++;
    return kiln_make_status(KILN_STATUS_COMPILE_ERROR, "fake: no");
  }
  double cost = 1.0 + labs((long)c->reg[0] - 4) + labs((long)c->reg[1] - 16) / 8.0 +
                (c->cache[2] == 128 ? 0 : 0.5) + 0.001 * (double)(cs[1].reg[1] != 16);
  *out = cost * 1e-3;
  return NULL;
}

static void test_search(void) {
  kiln_kernel_desc_t ds[2] = {matmul(512, 512, 512),
                              rows(KILN_KERNEL_ELEMENTWISE, 8, 8)};
  kiln_tile_config_t cs[2];
  for (int i = 0; i < 2; ++i) kiln_autotune_heuristic(&ds[i], &kAvx512x2, &cs[i]);
  kiln_tile_config_t small_before = cs[1];
  fake_t f = {0, 0};
  bool done[2] = {false, false};
  kiln_autotune_search_options_t o = {60.0, 1 << 12, "fake", false, NULL, done};
  kiln_autotune_search_result_t r;
  CHECK_OK(kiln_autotune_search(ds, 2, &kAvx512x2, &o, fake_measure, &f, cs, &r));
  CHECK(cs[0].reg[0] == 4 && cs[0].reg[1] == 16 && cs[0].cache[2] == 128);
  CHECK(memcmp(&cs[1], &small_before, sizeof(cs[1])) == 0);  // below min_work
  CHECK(done[0] && !done[1]);
  CHECK(r.tuned == 1 && r.measured == f.calls && f.failures > 0);
  CHECK(r.best_seconds < r.baseline_seconds && !r.budget_exhausted);
  // A zero budget measures the baseline only and says so.
  for (int i = 0; i < 2; ++i) kiln_autotune_heuristic(&ds[i], &kAvx512x2, &cs[i]);
  fake_t g = {0, 0};
  done[0] = done[1] = false;
  o.budget_seconds = 0;
  CHECK_OK(kiln_autotune_search(ds, 2, &kAvx512x2, &o, fake_measure, &g, cs, &r));
  CHECK(g.calls == 1 && r.budget_exhausted && !done[0]);
  // Kernels known from the database are not searched.
  bool known[2] = {true, false};
  o.budget_seconds = 60;
  o.known = known;
  fake_t h = {0, 0};
  CHECK_OK(kiln_autotune_search(ds, 2, &kAvx512x2, &o, fake_measure, &h, cs, &r));
  CHECK(h.calls == 1 && r.tuned == 0);
  // A baseline that cannot be measured is an error, not a crash.
  kiln_tile_config_t failing[2] = {cs[0], cs[1]};
  failing[0].reg[0] = 2;
  o.known = NULL;
  kiln_status_t s = kiln_autotune_search(ds, 2, &kAvx512x2, &o, fake_measure,
                                         &h, failing, &r);
  CHECK(s != NULL);
  kiln_status_free(s);
}

static void test_database(void) {
  char dir[] = "/tmp/kiln-tune-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  kiln_cache_t *cache = NULL;
  CHECK_OK(kiln_cache_open(dir, 0, &cache));
  if (!cache) return;
  kiln_kernel_desc_t d = matmul(256, 256, 256);
  kiln_tile_config_t c, got;
  kiln_autotune_heuristic(&d, &kAvx512x2, &c);
  c.reg[0] = 4;
  double secs = 0;
  CHECK(!kiln_autotune_db_get(cache, "cpu-a", &d, &kAvx512x2, &got, &secs));
  CHECK_OK(kiln_autotune_db_put(cache, "cpu-a", &d, &kAvx512x2, &c, 1.5e-3));
  CHECK(kiln_autotune_db_get(cache, "cpu-a", &d, &kAvx512x2, &got, &secs));
  CHECK(memcmp(&got, &c, sizeof(c)) == 0 && secs == 1.5e-3);
  // Another CPU model or thread count is another entry.
  CHECK(!kiln_autotune_db_get(cache, "cpu-b", &d, &kAvx512x2, &got, NULL));
  kiln_cpu_target_t t4 = kAvx512x2;
  t4.threads = 4;
  CHECK(!kiln_autotune_db_get(cache, "cpu-a", &d, &t4, &got, NULL));
  // An entry that does not fit the kernel (same hash, other sizes) is not
  // used: the tiles would not divide.
  kiln_kernel_desc_t other = matmul(256, 256, 256);
  other.range[0] = 260;
  CHECK(!kiln_autotune_db_get(cache, "cpu-a", &other, &kAvx512x2, &got, NULL));
  // A corrupted entry is discarded (and reported), not loaded.
  char cmd[512];
  snprintf(cmd, sizeof(cmd), "for f in %s/*.kobj; do printf 'XXXX' | dd of=$f "
           "bs=1 seek=80 conv=notrunc status=none; done", dir);
  CHECK(system(cmd) == 0);
  CHECK(!kiln_autotune_db_get(cache, "cpu-a", &d, &kAvx512x2, &got, NULL));
  kiln_cache_close(cache);
  snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
  CHECK(system(cmd) == 0);
}

int main(void) {
  test_heuristic_valid_everywhere();
  test_heuristic_matmul();
  test_f32_microkernel();
  test_conv_microkernel();
  test_bf16_microkernel();
  test_gpu_mma();
  test_validity_rejects();
  test_symbolic_loops();
  test_search();
  test_database();
  return kt_finish("autotune");
}
