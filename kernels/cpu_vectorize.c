// The CPU schedule: every tileable linalg op is described to lib/autotune,
// gets its tiles (threads, cache blocks, register tile), and one
// transform-dialect script tiles, vectorizes and cleans up the module.
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mlir-c/AffineExpr.h>
#include <mlir-c/AffineMap.h>
#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <mlir-c/Dialect/Transform/Interpreter.h>

#include "kernels/kernels.h"

// The sizes of one level; sizes equal to the enclosing tile (or range) are
// 0: that level does not tile them. A symbolic loop always gets its register
// tile: the enclosing tile may be partial at run time, and the register
// loop is where that partial tile is peeled off.
static int level_sizes(const kiln_kernel_desc_t *d, const kiln_tile_config_t *c,
                       int level, int64_t *out) {
  int n = 0;
  for (int k = 0; k < c->loop_count; ++k) {
    const int64_t *lv[3] = {c->forall, c->cache, c->reg};
    int64_t within = d->range[k];
    if (level > 0 && c->forall[k] > 0) within = c->forall[k];
    if (level > 1 && c->cache[k] > 0) within = c->cache[k];
    int64_t s = lv[level][k];
    bool dynamic = (d->dynamic_mask >> k) & 1u;
    out[k] = (s > 0 && (s < within || (level == 2 && dynamic))) ? s : 0;
    n += out[k] != 0;
  }
  return n;
}

// True when some tile of loop `k` at `level` is partial: a static range
// that a tile of this or an enclosing level does not divide (the schedule
// peels it, as it does a symbolic loop's).
static bool partial_tile(const kiln_kernel_desc_t *d, const kiln_tile_config_t *c,
                         int level, int k) {
  if ((d->dynamic_mask >> k) & 1u) return false;
  const int64_t *lv[3] = {c->forall, c->cache, c->reg};
  int64_t within = d->range[k];
  for (int l = 0; l <= level; ++l) {
    int64_t s = lv[l][k];
    if (s <= 0 || s >= within) continue;
    if (within % s) return true;
    within = s;
  }
  return false;
}

// True when any loop of the op has a partial tile at any level.
static bool any_partial_tile(const kiln_kernel_desc_t *d, const kiln_tile_config_t *c) {
  for (int k = 0; k < c->loop_count; ++k)
    if (partial_tile(d, c, 2, k)) return true;
  return false;
}

static void put_sizes(kiln_sbuf_t *b, const int64_t *s, int n) {
  kiln_sbuf_puts(b, "[");
  for (int k = 0; k < n; ++k)
    kiln_sbuf_printf(b, "%s%lld", k ? ", " : "", (long long)s[k]);
  kiln_sbuf_puts(b, "]");
}

// `%<result>, %<result>_l0, ... = transform.structured.<op> %<target>
// tile_sizes <sz>` (tile_using_for or fuse: one loop per nonzero size).
static void emit_tile_for(kiln_sbuf_t *b, const char *result, const char *target,
                          const int64_t *sz, int n, const char *op) {
  int loops = 0;
  for (int k = 0; k < n; ++k) loops += sz[k] != 0;
  kiln_sbuf_printf(b, "    %%%s", result);
  for (int k = 0; k < loops; ++k) kiln_sbuf_printf(b, ", %%%s_l%d", result, k);
  kiln_sbuf_printf(b, " = transform.structured.%s %%%s tile_sizes ", op, target);
  put_sizes(b, sz, n);
  kiln_sbuf_puts(b, " : (!transform.any_op) -> (!transform.any_op");
  for (int k = 0; k < loops; ++k) kiln_sbuf_puts(b, ", !transform.any_op");
  kiln_sbuf_puts(b, ")\n");
}

// A fused producer's tile (handle %<what><id>) tiled by its own register
// tile: vector loops inside the consumer's thread tile.
static void emit_inner_tiles(kiln_sbuf_t *b, const char *what, int id,
                             const kiln_tile_config_t *c) {
  char res[32], tgt[32];
  snprintf(res, sizeof(res), "t%s%d", what, id);
  snprintf(tgt, sizeof(tgt), "%s%d", what, id);
  emit_tile_for(b, res, tgt, c->reg, c->loop_count, "tile_using_for");
}

// `%<fused>, %<containing_out> = fuse_into_containing_op %<producer> into
// %<containing>`.
static void emit_fuse_into(kiln_sbuf_t *b, const char *fused, const char *containing_out,
                           const char *producer, const char *containing) {
  kiln_sbuf_printf(b, "    %%%s, %%%s = transform.structured.fuse_into_containing_op "
                      "%%%s into %%%s : (!transform.any_op, !transform.any_op) -> "
                      "(!transform.any_op, !transform.any_op)\n",
                   fused, containing_out, producer, containing);
}

// Elementwise op `j` with matmul `i` (and `i`'s fused init) inside: `j` is
// tiled by the matmul's thread and register tiles over the output, the
// matmul and its init fused into the thread tile and then into the register
// tile (transform.structured.fuse), where the matmul's reduction loop is
// tiled by one. The accumulators start from the init in registers and go
// through `j`'s body before the one store.
static void emit_epilogue(kiln_sbuf_t *b, const kiln_kernel_desc_t *descs,
                          const kiln_tile_config_t *configs,
                          const kiln_kernel_fusion_t *fusion, int32_t j) {
  int32_t i = fusion[j].epilogue, fill = fusion[i].fill;
  const kiln_kernel_desc_t *di = &descs[i];
  int64_t f[KILN_TILE_MAX_LOOPS], r[KILN_TILE_MAX_LOOPS];
  int64_t jf[KILN_TILE_MAX_LOOPS], jr[KILN_TILE_MAX_LOOPS], red[KILN_TILE_MAX_LOOPS];
  level_sizes(di, &configs[i], 0, f);
  level_sizes(di, &configs[i], 2, r);
  int n = 0;
  for (int k = 0; k < di->loop_count; ++k) {
    bool is_red = (di->reduction_mask >> k) & 1u;
    red[k] = is_red ? r[k] : 0;
    if (is_red) continue;
    jf[n] = f[k];
    jr[n++] = r[k];
  }
  kiln_sbuf_printf(b,
                   "    %%op%d = transform.structured.match attributes "
                   "{kiln.tile_id = %d : i64} in %%root : (!transform.any_op) "
                   "-> !transform.any_op\n"
                   "    %%epi%d = transform.structured.match attributes "
                   "{kiln.tile_id = %d : i64} in %%root : (!transform.any_op) "
                   "-> !transform.any_op\n",
                   j, j, j, i);
  if (fill >= 0)
    kiln_sbuf_printf(b, "    %%efill%d = transform.get_producer_of_operand "
                        "%%epi%d[%d] : (!transform.any_op) -> !transform.any_op\n",
                     j, j, fusion[i].operand);
  kiln_sbuf_printf(b, "    %%par%d, %%forall%d = transform.structured."
                      "tile_using_forall %%op%d tile_sizes ", j, j, j);
  put_sizes(b, jf, n);
  kiln_sbuf_puts(b, " : (!transform.any_op) -> (!transform.any_op, "
                   "!transform.any_op)\n");
  char res[32], tgt[32], h1[32], h2[32];
  snprintf(res, sizeof(res), "fepi%d", j);
  snprintf(h1, sizeof(h1), "eforall%d", j);
  snprintf(tgt, sizeof(tgt), "epi%d", j);
  snprintf(h2, sizeof(h2), "forall%d", j);
  emit_fuse_into(b, res, h1, tgt, h2);
  if (fill >= 0) {
    snprintf(res, sizeof(res), "fefill%d", j);
    snprintf(h2, sizeof(h2), "eforall2_%d", j);
    snprintf(tgt, sizeof(tgt), "efill%d", j);
    emit_fuse_into(b, res, h2, tgt, h1);
  }
  snprintf(res, sizeof(res), "ereg%d", j);
  snprintf(tgt, sizeof(tgt), "par%d", j);
  emit_tile_for(b, res, tgt, jr, n, "fuse");
  kiln_sbuf_printf(b, "    %%emm%d = transform.get_producer_of_operand %%ereg%d[%d] : "
                      "(!transform.any_op) -> !transform.any_op\n",
                   j, j, fusion[j].epilogue_operand);
  snprintf(res, sizeof(res), "ered%d", j);
  snprintf(tgt, sizeof(tgt), "emm%d", j);
  emit_tile_for(b, res, tgt, red, di->loop_count, "tile_using_for");
}

kiln_status_t kiln_kernels_cpu_schedule(const kiln_kernel_desc_t *descs,
                                        const kiln_tile_config_t *configs,
                                        const kiln_kernel_fusion_t *fusion,
                                        int32_t count, char **out_text) {
  kiln_sbuf_t b;
  kiln_sbuf_init(&b);
  kiln_sbuf_puts(&b,
                 "module attributes {transform.with_named_sequence} {\n"
                 "  transform.named_sequence @__transform_main(%root: "
                 "!transform.any_op {transform.readonly}) {\n");
  bool peeled = false, folded = false, unit_reduction = false;
  for (int32_t i = 0; i < count; ++i) {
    const kiln_tile_config_t *t = &configs[i];
    int64_t sz[KILN_TILE_MAX_LOOPS];
    if (fusion && fusion[i].fused) continue;  // tiled inside its consumer
    if (fusion && fusion[i].epilogue >= 0) {
      emit_epilogue(&b, descs, configs, fusion, i);
      continue;
    }
    int32_t fill = fusion ? fusion[i].fill : -1;
    kiln_sbuf_printf(&b,
                     "    %%op%d = transform.structured.match attributes "
                     "{kiln.tile_id = %d : i64} in %%root : (!transform.any_op) "
                     "-> !transform.any_op\n",
                     i, i);
    if (fill >= 0)
      kiln_sbuf_printf(&b, "    %%fill%d = transform.get_producer_of_operand "
                           "%%op%d[%d] : (!transform.any_op) -> !transform.any_op\n",
                       i, i, fusion[i].operand);
    char target[32];
    snprintf(target, sizeof(target), "op%d", i);
    // A fused fill goes down to the register tile when each register tile
    // is accumulated once (no cache blocks of K around it): its zero write
    // then forwards to the accumulator's first read, which starts from
    // zero in registers. (level_sizes leaves the forall level to the code
    // below; plan_fill_fusion fuses only distributed contractions.)
    int64_t scratch[KILN_TILE_MAX_LOOPS];
    bool regfuse = fill >= 0 && !level_sizes(&descs[i], t, 1, scratch) &&
                   descs[i].dynamic_mask == 0 && !any_partial_tile(&descs[i], t);
    // Threads first: one forall over the distributed loops.
    if (level_sizes(&descs[i], t, 0, sz)) {
      kiln_sbuf_printf(&b, "    %%par%d, %%forall%d = transform.structured."
                           "tile_using_forall %%%s tile_sizes ", i, i, target);
      put_sizes(&b, sz, t->loop_count);
      kiln_sbuf_puts(&b, " : (!transform.any_op) -> (!transform.any_op, "
                         "!transform.any_op)\n");
      snprintf(target, sizeof(target), "par%d", i);
      char forall[32], fused[32], out[32], producer[32];
      snprintf(forall, sizeof(forall), "forall%d", i);
      if (fill >= 0) {
        // The fill of this thread's output tile, inside the thread's loop.
        snprintf(fused, sizeof(fused), "ffill%d", i);
        snprintf(out, sizeof(out), "fforall%d", i);
        snprintf(producer, sizeof(producer), "fill%d", i);
        emit_fuse_into(&b, fused, out, producer, forall);
      }
      // Elementwise producers fused into this op's thread tiles; each
      // fusion rebuilds the forall with one more result (the producer's
      // tile, still written out), so the handle moves on.
      for (int32_t p = count - 1; fusion && p >= 0; --p) {
        if (fusion[p].consumer != i) continue;
        kiln_sbuf_printf(&b,
                         "    %%prod%d = transform.structured.match attributes "
                         "{kiln.tile_id = %d : i64} in %%root : (!transform.any_op) "
                         "-> !transform.any_op\n",
                         p, p);
        snprintf(fused, sizeof(fused), "fprod%d", p);
        snprintf(out, sizeof(out), "pforall%d", p);
        snprintf(producer, sizeof(producer), "prod%d", p);
        emit_fuse_into(&b, fused, out, producer, forall);
        snprintf(forall, sizeof(forall), "pforall%d", p);
        emit_inner_tiles(&b, "fprod", p, &configs[p]);
      }
      if (fill >= 0 && !regfuse) {
        // With cache blocks of K (or symbolic loops to peel) the register
        // tiles run once per block: the fill stays at the thread tile,
        // tiled into vector writes of the fill's own register tile.
        emit_inner_tiles(&b, "ffill", i, &configs[fill]);
      }
    }
    // Then cache blocks, then the register tile, each a nest of scf.for.
    // Loops over symbolic sizes are remembered (level, loop) for peeling.
    int peel[2 * KILN_TILE_MAX_LOOPS][2], npeel = 0;
    for (int level = 1; level <= 2; ++level) {
      int loops = level_sizes(&descs[i], t, level, sz);
      if (!loops) continue;
      for (int k = 0, j = 0; k < t->loop_count; ++k) {
        if (!sz[k]) continue;
        // (A step-1 loop has no partial tile: a tile of one is static.)
        if ((((descs[i].dynamic_mask >> k) & 1u) || partial_tile(&descs[i], t, level, k)) &&
            sz[k] > 1) {
          peel[npeel][0] = level;
          peel[npeel++][1] = j;
        }
        ++j;
      }
      if (level == 2 && regfuse) {
        // The output loops with the fill fused into them, then the
        // reduction loops inside.
        int64_t par[KILN_TILE_MAX_LOOPS], red[KILN_TILE_MAX_LOOPS];
        int npar = 0, nred = 0;
        for (int k = 0; k < t->loop_count; ++k) {
          bool r = (descs[i].reduction_mask >> k) & 1u;
          par[k] = r ? 0 : sz[k];
          red[k] = r ? sz[k] : 0;
          npar += par[k] != 0;
          nred += red[k] != 0;
        }
        char res[32];
        if (npar) {
          snprintf(res, sizeof(res), "rfused%d", i);
          emit_tile_for(&b, res, target, par, t->loop_count, "fuse");
          snprintf(target, sizeof(target), "%s", res);
        }
        if (nred) {
          snprintf(res, sizeof(res), "tiled%d_2", i);
          emit_tile_for(&b, res, target, red, t->loop_count, "tile_using_for");
          snprintf(target, sizeof(target), "%s", res);
        }
        continue;
      }
      kiln_sbuf_printf(&b, "    %%tiled%d_%d", i, level);
      for (int k = 0; k < loops; ++k)
        kiln_sbuf_printf(&b, ", %%loop%d_%d_%d", i, level, k);
      kiln_sbuf_printf(&b, " = transform.structured.tile_using_for %%%s "
                           "tile_sizes ", target);
      put_sizes(&b, sz, t->loop_count);
      kiln_sbuf_puts(&b, " : (!transform.any_op) -> (!transform.any_op");
      for (int k = 0; k < loops; ++k) kiln_sbuf_puts(&b, ", !transform.any_op");
      kiln_sbuf_puts(&b, ")\n");
      snprintf(target, sizeof(target), "tiled%d_%d", i, level);
    }
    if (descs[i].sum_maps && strncmp(target, "tiled", 5) == 0) {
      // The register tile's unit-extent loops (kh, kw) folded away: plain
      // maps for the vectorizer. Within this op's own loops only (folding
      // every op's unit dims broke strided and symbolic kernels).
      char scope[32];
      int64_t scratch[KILN_TILE_MAX_LOOPS];
      if (level_sizes(&descs[i], t, 0, scratch))
        snprintf(scope, sizeof(scope), "forall%d", i);
      else
        snprintf(scope, sizeof(scope), "loop%d_%d_0", i,
                 level_sizes(&descs[i], t, 1, scratch) ? 1 : 2);
      // The scope is marked for the leading-unit-dim cleanup after
      // vectorization (below).
      kiln_sbuf_printf(&b,
                       "    transform.apply_patterns to %%%s {\n"
                       "      transform.apply_patterns.linalg.fold_unit_extent_dims_via_slices\n"
                       "    } : !transform.any_op\n"
                       "    transform.annotate %%%s \"kiln.unit_folded\" : "
                       "!transform.any_op\n",
                       scope, scope);
      folded = true;
    }
    if (descs[i].kind != KILN_KERNEL_CONTRACTION && descs[i].reduction_mask) {
      // A reduction's register tile reduces unit dims where its reduction
      // loops are outside the vector (a column sum over [R, C] reads
      // vector<1x16> per row). The vectorizer leaves a multi-reduction
      // over the unit dim, or, where the body multiplies (sum(dy * x_hat):
      // a weight gradient), a vector.contract with the parallel dim on
      // both operands; the inner-reduction and outer-product lowerings
      // unroll either into scalar adds, one per lane. Inside this op's
      // loops the unit-dim reductions are folded to vector adds
      // (canonicalization) and such contractions to a vector multiply-add
      // (parallelarith) first (below). Marked on the outermost scf.for of
      // the register level, or of the cache level: the loops the vector
      // code ends up in.
      int64_t scratch[KILN_TILE_MAX_LOOPS];
      int lv = level_sizes(&descs[i], t, 2, scratch) ? 2
               : level_sizes(&descs[i], t, 1, scratch) ? 1 : 0;
      if (lv) {
        kiln_sbuf_printf(&b,
                         "    transform.annotate %%loop%d_%d_0 \"kiln.unit_reduction\" : "
                         "!transform.any_op\n",
                         i, lv);
        unit_reduction = true;
      }
    }
    if (t->reduction_dim >= 0) {
      for (int k = 0; k < t->loop_count; ++k)
        sz[k] = k == t->reduction_dim ? t->reduction_tile : 0;
      kiln_sbuf_printf(&b, "    %%rfill%d, %%rsplit%d, %%rcomb%d, %%rloop%d = "
                           "transform.structured.tile_reduction_using_for "
                           "%%%s by tile_sizes = ", i, i, i, i, target);
      put_sizes(&b, sz, t->loop_count);
      kiln_sbuf_puts(&b, " : (!transform.any_op) -> (!transform.any_op, "
                         "!transform.any_op, !transform.any_op, "
                         "!transform.any_op)\n");
    }
    // Symbolic loops: the full tiles in a main loop with static tile shapes
    // (vectorized below), the partial last tile in a remainder loop that
    // stays scalar. Innermost first, so remainders of outer loops hold
    // peeled inner loops too.
    for (int p = npeel - 1; p >= 0; --p) {
      kiln_sbuf_printf(&b,
                       "    %%for%d_%d = transform.cast %%loop%d_%d_%d : "
                       "!transform.any_op to !transform.op<\"scf.for\">\n"
                       "    %%main%d_%d, %%rest%d_%d = transform.loop.peel "
                       "%%for%d_%d : (!transform.op<\"scf.for\">) -> "
                       "(!transform.any_op, !transform.any_op)\n",
                       i, p, i, peel[p][0], peel[p][1], i, p, i, p, i, p);
    }
    peeled |= npeel > 0;
  }
  kiln_sbuf_puts(&b,
                 "    %funcs = transform.structured.match ops{[\"func.func\"]} "
                 "in %root : (!transform.any_op) -> !transform.any_op\n");
  // Peeling rewrote the main loops' tile sizes to constants; canonicalize
  // so the tiles' tensor types are static before vectorizing.
  if (peeled)
    kiln_sbuf_puts(&b, "    transform.apply_patterns to %funcs {\n"
                       "      transform.apply_patterns.canonicalization\n"
                       "    } : !transform.any_op\n");
  bool gathers = false;
  for (int32_t i = 0; i < count; ++i) gathers |= descs[i].gather;
  // Gathers first, with tensor.extract vectorized (vector.gather, or a
  // contiguous load where the vectorizer proves one); the children pass
  // below would leave them scalar (and vectorizing every extract would
  // reach strided tables, whose vector.gather has no LLVM lowering).
  if (gathers)
    kiln_sbuf_puts(&b,
                   "    %gathers = transform.structured.match attributes {kiln.gather} in "
                   "%funcs : (!transform.any_op) -> !transform.any_op\n"
                   "    transform.structured.vectorize %gathers {vectorize_nd_extract} : "
                   "!transform.any_op\n");
  kiln_sbuf_puts(&b,
                 "    %vec = transform.structured.vectorize_children_and_apply_"
                 "patterns %funcs : (!transform.any_op) -> !transform.any_op\n");
  if (unit_reduction)
    kiln_sbuf_puts(&b,
                   "    %unitred = transform.structured.match attributes "
                   "{kiln.unit_reduction} in %vec : (!transform.any_op) -> "
                   "!transform.any_op\n"
                   "    transform.apply_patterns to %unitred {\n"
                   "      transform.apply_patterns.vector.lower_contraction "
                   "lowering_strategy = \"parallelarith\"\n"
                   "      transform.apply_patterns.canonicalization\n"
                   "    } : !transform.any_op\n");
  kiln_sbuf_puts(&b,
                 // Lower the n-D vector ops the vectorizer made to forms
                 // convert-vector-to-llvm handles: contractions as outer
                 // products (FMAs), multi-reductions along the inner dim.
                 "    transform.apply_patterns to %vec {\n"
                 "      transform.apply_patterns.vector.lower_contraction "
                 "lowering_strategy = \"outerproduct\"\n"
                 "      transform.apply_patterns.vector.lower_multi_reduction "
                 "lowering_strategy = \"innerreduction\"\n"
                 "      transform.apply_patterns.vector.lower_transpose "
                 "lowering_strategy = \"shuffle_1d\"\n"
                 "      transform.apply_patterns.vector.lower_shape_cast\n"
                 "      transform.apply_patterns.vector.lower_broadcast\n"
                 "      transform.apply_patterns.vector.lower_outerproduct\n"
                 "    } : !transform.any_op\n");
  // A folded register tile's accumulator is read as vector<8x32> but
  // written back as vector<1x1x8x32>: with the leading unit dims cast away
  // the pair has one shape and is hoisted below. Only where unit dims were
  // folded: elsewhere the cast turns 1x1 vectors of strided memrefs into
  // 1-D transfers the LLVM lowering rejects.
  if (folded)
    kiln_sbuf_puts(&b,
                   "    %folded = transform.structured.match attributes "
                   "{kiln.unit_folded} in %vec : (!transform.any_op) -> "
                   "!transform.any_op\n"
                   "    transform.apply_patterns to %folded {\n"
                   "      transform.apply_patterns.vector.cast_away_vector_leading_one_dim\n"
                   "    } : !transform.any_op\n");
  // Loop-carried accumulators (matmul tiles, reduction partials) move out
  // of memory into registers. One application hoists a read/write pair out
  // of its innermost loop only (the walk visits outer loops first), so it
  // runs once per reduction loop of the deepest register nest (three for a
  // direct convolution's c, kh, kw).
  int depth = 1;
  for (int32_t i = 0; i < count; ++i) {
    int n = 0;
    for (int k = 0; k < descs[i].loop_count; ++k)
      n += (descs[i].reduction_mask >> k) & 1u;
    if (n > depth) depth = n;
  }
  for (int r = 0; r < depth; ++r)
    kiln_sbuf_printf(&b,
                     "    %%hoist%d = transform.structured.match ops{[\"scf.for\"]} "
                     "in %%root : (!transform.any_op) -> !transform.any_op\n"
                     "    transform.loop.hoist_loop_invariant_subsets %%hoist%d : "
                     "!transform.any_op\n",
                     r, r);
  kiln_sbuf_puts(&b,
                 "    %fors = transform.structured.match ops{[\"scf.for\"]} in "
                 "%root : (!transform.any_op) -> !transform.any_op\n"
                 // Loop-invariant values (a row's broadcast reciprocal sum)
                 // are computed once per row, not per vector.
                 "    transform.apply_licm to %fors : !transform.any_op\n"
                 // Forward vector writes to the reads of the same tensor, so
                 // per-row scratch tensors (reduction partials) disappear
                 // instead of becoming an allocation per row. No CSE here:
                 // merged inits of different outputs miscompile later.
                 "    %funcs2 = transform.structured.match ops{[\"func.func\"]} "
                 "in %root : (!transform.any_op) -> !transform.any_op\n"
                 "    transform.apply_patterns to %funcs2 {\n"
                 "      transform.apply_patterns.canonicalization\n"
                 "    } : !transform.any_op\n"
                 "    transform.yield\n  }\n}\n");
  char *text = kiln_sbuf_take(&b);
  if (!text) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "schedule");
  *out_text = text;
  return NULL;
}

typedef struct {
  const kiln_kernel_tiling_t *tiling;
  kiln_kernel_desc_t *descs;
  kiln_tile_config_t *configs;
  MlirOperation *ops;
  int32_t count, capacity;
  MlirContext ctx;
  kiln_status_t error;
} collect_t;

static bool starts_with(MlirStringRef s, const char *p) {
  size_t n = strlen(p);
  return s.length >= n && memcmp(s.data, p, n) == 0;
}
static bool equals(MlirStringRef s, const char *p) {
  return s.length == strlen(p) && memcmp(s.data, p, s.length) == 0;
}

// Size `j` of a ranked tensor type; a symbolic size is the stand-in, and
// sets bit `bit` of `*dynamic`.
static int64_t dim_size(MlirType t, intptr_t j, int bit, uint32_t *dynamic) {
  if (mlirShapedTypeIsDynamicDim(t, j)) {
    *dynamic |= 1u << bit;
    return KILN_DYNAMIC_RANGE_STANDIN;
  }
  return mlirShapedTypeGetDimSize(t, j);
}

// Shape of the op's first result (rank -1 if not a ranked tensor).
static int result_shape(MlirOperation op, int64_t *dims, uint32_t *dynamic) {
  if (mlirOperationGetNumResults(op) < 1) return -1;
  MlirType t = mlirValueGetType(mlirOperationGetResult(op, 0));
  if (!mlirTypeIsARankedTensor(t)) return -1;
  int r = (int)mlirShapedTypeGetRank(t);
  for (int i = 0; i < r && i < KILN_TILE_MAX_LOOPS; ++i)
    dims[i] = dim_size(t, i, i, dynamic);
  return r;
}

static void sbuf_cb(MlirStringRef str, void *user) {
  kiln_sbuf_append((kiln_sbuf_t *)user, str.data, str.length);
}

// Bytes of the widest element the op touches, at least 4: sub-word floats
// are computed in f32, so vector lanes are counted in f32.
static int32_t elem_bytes(MlirOperation op) {
  int32_t best = 4;
  intptr_t n = mlirOperationGetNumOperands(op);
  for (intptr_t k = 0; k < n; ++k) {
    MlirType ty = mlirValueGetType(mlirOperationGetOperand(op, k));
    if (!mlirTypeIsAShaped(ty)) continue;
    MlirType el = mlirShapedTypeGetElementType(ty);
    int32_t bits = 0;
    if (mlirTypeIsAFloat(el)) bits = (int32_t)mlirFloatTypeGetWidth(el);
    else if (mlirTypeIsAInteger(el)) bits = (int32_t)mlirIntegerTypeGetWidth(el);
    if (bits / 8 > best) best = bits / 8;
  }
  return best;
}

// Hashes `text` with every SSA name (%foo) replaced by its order of first
// appearance, so the hash does not depend on the numbering of the enclosing
// function (the printer numbers values function-wide even in local scope).
static kiln_hash128_t hash_renumbered(const char *text, size_t n) {
  kiln_hasher_t h;
  kiln_hasher_init(&h);
  enum { kNames = 256 };
  const char *names[kNames];
  size_t lens[kNames];
  int count = 0;
  size_t i = 0;
  while (i < n) {
    if (text[i] != '%') {
      size_t j = i;
      while (j < n && text[j] != '%') ++j;
      kiln_hasher_update(&h, text + i, j - i);
      i = j;
      continue;
    }
    size_t j = i + 1;
    while (j < n && (isalnum((unsigned char)text[j]) || text[j] == '_' ||
                     text[j] == '#' || text[j] == '.' || text[j] == '$'))
      ++j;
    int id = -1;
    for (int k = 0; k < count && id < 0; ++k)
      if (lens[k] == j - i && memcmp(names[k], text + i, j - i) == 0) id = k;
    if (id < 0 && count < kNames) {
      names[count] = text + i;
      lens[count] = j - i;
      id = count++;
    }
    if (id < 0) {  // past kNames distinct names: the name itself
      kiln_hasher_update(&h, text + i, j - i);
    } else {
      char tok[24];
      int w = snprintf(tok, sizeof(tok), "%%v%d", id);
      kiln_hasher_update(&h, tok, (size_t)w);
    }
    i = j;
  }
  return kiln_hasher_final(&h);
}

// The op's identity for the tuning database: its generic form (types and
// body included) with SSA names renumbered.
static kiln_hash128_t op_hash(MlirOperation op) {
  kiln_sbuf_t b;
  kiln_sbuf_init(&b);
  MlirOpPrintingFlags flags = mlirOpPrintingFlagsCreate();
  mlirOpPrintingFlagsPrintGenericOpForm(flags);
  mlirOpPrintingFlagsUseLocalScope(flags);
  mlirOperationPrintWithFlags(op, flags, sbuf_cb, &b);
  mlirOpPrintingFlagsDestroy(flags);
  kiln_hash128_t hash = hash_renumbered(b.data ? b.data : "", b.length);
  kiln_sbuf_free(&b);
  return hash;
}

// Whether the tensor a generic's body gathers from (tensor.extract; an
// embedding's table) is certainly a dense buffer once bufferized: a
// function argument with the identity layout (a computed tensor may be
// bufferized into a strided subview of another buffer).
// Only then is the generic vectorized (`vectorize_nd_extract`: a
// vector.gather, or a contiguous load where the vectorizer proves one); a
// gather from a strided memref (a strided graph input, a slice) has no
// LLVM lowering, so such a generic stays scalar.
//
// A tensor computed by a linalg op into a tensor.empty (or a fill of one)
// is dense too, as long as nothing inserts it into another tensor or an
// output: eliminate-empty-tensors would then compute it in place, in a
// subview of that destination (a cat's slab, a strided input written in
// place). Reshapes of a dense tensor are dense.
static bool defined_by(MlirValue v, const char *op_name, MlirOperation *def) {
  if (!mlirValueIsAOpResult(v)) return false;
  *def = mlirOpResultGetOwner(v);
  return equals(mlirIdentifierStr(mlirOperationGetName(*def)), op_name);
}

static bool gather_source_dense(MlirValue v) {
  if (!mlirValueIsAOpResult(v)) return false;
  MlirOperation def = mlirOpResultGetOwner(v);
  MlirStringRef name = mlirIdentifierStr(mlirOperationGetName(def));
  if (equals(name, "bufferization.to_tensor")) {
    MlirType t = mlirValueGetType(mlirOperationGetOperand(def, 0));
    return mlirTypeIsAMemRef(t) && mlirAffineMapIsIdentity(mlirMemRefTypeGetAffineMap(t));
  }
  if (equals(name, "tensor.reshape") || equals(name, "tensor.expand_shape") ||
      equals(name, "tensor.collapse_shape"))
    return gather_source_dense(mlirOperationGetOperand(def, 0));
  if (name.length < 7 || strncmp(name.data, "linalg.", 7) != 0) return false;
  for (MlirOpOperand u = mlirValueGetFirstUse(v); !mlirOpOperandIsNull(u);
       u = mlirOpOperandGetNextUse(u)) {
    MlirStringRef un = mlirIdentifierStr(mlirOperationGetName(mlirOpOperandGetOwner(u)));
    if (equals(un, "tensor.insert_slice") || equals(un, "tensor.parallel_insert_slice") ||
        equals(un, "bufferization.materialize_in_destination") || equals(un, "func.return"))
      return false;
  }
  // The result's init: operand (inputs + result number), by the op's
  // operand segments.
  MlirAttribute seg = mlirOperationGetAttributeByName(
      def, mlirStringRefCreateFromCString("operandSegmentSizes"));
  if (mlirAttributeIsNull(seg) || !mlirAttributeIsADenseI32Array(seg) ||
      mlirDenseArrayGetNumElements(seg) != 2)
    return false;
  intptr_t init_pos = mlirDenseI32ArrayGetElement(seg, 0) + mlirOpResultGetResultNumber(v);
  if (init_pos >= mlirOperationGetNumOperands(def)) return false;
  MlirValue init = mlirOperationGetOperand(def, init_pos);
  MlirOperation fill;
  if (defined_by(init, "linalg.fill", &fill))
    init = mlirOperationGetOperand(fill, mlirOperationGetNumOperands(fill) - 1);
  MlirOperation empty;
  return defined_by(init, "tensor.empty", &empty);
}

// Describes one op; false when it is left alone (convolutions and other
// named ops, empty tensors). Symbolic sizes are described by the stand-in
// range and `dynamic_mask`.
bool kiln_kernels_describe(MlirOperation op, kiln_kernel_desc_t *d) {
  MlirStringRef name = mlirIdentifierStr(mlirOperationGetName(op));
  int64_t dims[KILN_TILE_MAX_LOOPS];
  uint32_t result_dynamic = 0;
  int r = result_shape(op, dims, &result_dynamic);
  if (r < 0 || r > KILN_TILE_MAX_LOOPS) return false;
  for (int i = 0; i < r; ++i)
    if (dims[i] <= 0) return false;
  memset(d, 0, sizeof(*d));
  d->m_dim = d->n_dim = -1;
  d->elem_bytes = elem_bytes(op);
  if (equals(name, "linalg.matmul") || equals(name, "linalg.batch_matmul")) {
    int b = equals(name, "linalg.batch_matmul") ? 1 : 0;
    MlirType lhs = mlirValueGetType(mlirOperationGetOperand(op, 0));
    if (!mlirTypeIsARankedTensor(lhs)) return false;
    d->kind = KILN_KERNEL_CONTRACTION;
    d->loop_count = 3 + b;
    d->dynamic_mask = result_dynamic;
    for (int i = 0; i < r; ++i) d->range[i] = dims[i];
    // K is the lhs dim its indexing map puts d2 (d3 batched) in: 1 + b by
    // default, 0 for a transposed lhs (indexing_maps on the named op).
    int kpos = 1 + b;
    MlirAttribute maps = mlirOperationGetAttributeByName(
        op, mlirStringRefCreateFromCString("indexing_maps"));
    if (!mlirAttributeIsNull(maps) && mlirAttributeIsAArray(maps) &&
        mlirArrayAttrGetNumElements(maps) >= 1) {
      MlirAffineMap m0 = mlirAffineMapAttrGetValue(mlirArrayAttrGetElement(maps, 0));
      for (intptr_t j = 0; j < mlirAffineMapGetNumResults(m0); ++j) {
        MlirAffineExpr ex = mlirAffineMapGetResult(m0, j);
        if (mlirAffineExprIsADim(ex) && mlirAffineDimExprGetPosition(ex) == 2 + b)
          kpos = (int)j;
      }
    }
    d->range[2 + b] = dim_size(lhs, kpos, 2 + b, &d->dynamic_mask);
    if (d->range[2 + b] <= 0) return false;  // empty K: the fill is all
    d->reduction_mask = 1u << (2 + b);
    d->m_dim = b;
    d->n_dim = b + 1;
    return true;
  }
  if (equals(name, "linalg.transpose") || equals(name, "linalg.fill") ||
      equals(name, "linalg.copy")) {
    if (r == 0) return false;
    d->kind = KILN_KERNEL_ELEMENTWISE;
    d->loop_count = r;
    d->dynamic_mask = result_dynamic;
    for (int i = 0; i < r; ++i) d->range[i] = dims[i];
    MlirAttribute perm = mlirOperationGetAttributeByName(
        op, mlirStringRefCreateFromCString("permutation"));
    // A transpose moves the input's innermost dim away from the output's
    // innermost (output loop q reads input dim perm[q]): a register block
    // over loop q and the innermost loop reads and writes whole vectors
    // (a vector.transpose between), where a vector along the output's
    // innermost dim alone gathers from the input at a stride.
    if (r >= 2 && !mlirAttributeIsNull(perm) &&
        mlirAttributeIsADenseI64Array(perm) &&
        mlirDenseArrayGetNumElements(perm) == r &&
        mlirDenseI64ArrayGetElement(perm, r - 1) != r - 1) {
      for (int q = 0; q < r - 1; ++q)
        if (mlirDenseI64ArrayGetElement(perm, q) == r - 1) d->transpose_dim = q;
      d->kind = KILN_KERNEL_TRANSPOSE;
    }
    return true;
  }
  if (!equals(name, "linalg.generic")) return false;
  MlirAttribute it = mlirOperationGetAttributeByName(
      op, mlirStringRefCreateFromCString("iterator_types"));
  if (mlirAttributeIsNull(it) || !mlirAttributeIsAArray(it)) return false;
  int loops = (int)mlirArrayAttrGetNumElements(it);
  if (loops == 0 || loops > KILN_TILE_MAX_LOOPS) return false;
  // Gathers (tensor.extract in the body) are described (`gather`); those
  // from a tensor that may be strided (`gather_scalar`) are tiled but not
  // vectorized.
  MlirRegion region = mlirOperationGetRegion(op, 0);
  MlirBlock block = mlirRegionGetFirstBlock(region);
  bool has_mul = false, has_add = false;
  for (MlirOperation o = mlirBlockGetFirstOperation(block);
       !mlirOperationIsNull(o); o = mlirOperationGetNextInBlock(o)) {
    MlirStringRef on = mlirIdentifierStr(mlirOperationGetName(o));
    if (equals(on, "tensor.extract")) {
      d->gather_scalar |= !gather_source_dense(mlirOperationGetOperand(o, 0));
      d->gather = true;
    }
    has_mul |= equals(on, "arith.mulf") || equals(on, "arith.muli");
    has_add |= equals(on, "arith.addf") || equals(on, "arith.addi");
  }
  // Loop ranges: every map result that is a plain dim d_j names the size of
  // loop j through the operand's shape; a loop is symbolic when no operand
  // gives it a static size.
  for (int i = 0; i < loops; ++i) d->range[i] = -1;
  uint32_t sized = 0, dynamic = 0;
  MlirAttribute maps = mlirOperationGetAttributeByName(
      op, mlirStringRefCreateFromCString("indexing_maps"));
  if (mlirAttributeIsNull(maps) || !mlirAttributeIsAArray(maps)) return false;
  intptr_t nops = mlirOperationGetNumOperands(op);
  if (mlirArrayAttrGetNumElements(maps) != nops) return false;
  // Which loops each operand indexes (bit i: loop i), for telling a
  // contraction from a reduction.
  uint32_t uses[16] = {0};
  intptr_t ninputs = nops - mlirOperationGetNumResults(op);
  for (intptr_t k = 0; k < nops; ++k) {
    MlirType ty = mlirValueGetType(mlirOperationGetOperand(op, k));
    if (!mlirTypeIsARankedTensor(ty)) return false;
    MlirAffineMap m = mlirAffineMapAttrGetValue(mlirArrayAttrGetElement(maps, k));
    intptr_t nres = mlirAffineMapGetNumResults(m);
    for (intptr_t j = 0; j < nres; ++j) {
      MlirAffineExpr e = mlirAffineMapGetResult(m, j);
      if (mlirAffineExprIsAAdd(e)) d->sum_maps = true;
      if (!mlirAffineExprIsADim(e)) continue;
      intptr_t pos = mlirAffineDimExprGetPosition(e);
      if (pos < loops) {
        if (!mlirShapedTypeIsDynamicDim(ty, j)) {
          d->range[pos] = mlirShapedTypeGetDimSize(ty, j);
          sized |= 1u << pos;
        } else if (!((sized >> pos) & 1u)) {
          d->range[pos] = dim_size(ty, j, (int)pos, &dynamic);
        }
        if (k < 16) uses[k] |= 1u << pos;
      }
    }
  }
  d->dynamic_mask = dynamic & ~sized;
  // Unknown or empty loops (a zero-size tensor) are left to the loop
  // lowering: there is nothing to tile.
  for (int i = 0; i < loops; ++i)
    if (d->range[i] <= 0) return false;
  d->loop_count = loops;
  int reductions = 0, last_red = -1;
  int par[KILN_TILE_MAX_LOOPS], npar = 0;
  for (int i = 0; i < loops; ++i) {
    kiln_sbuf_t pb;
    kiln_sbuf_init(&pb);
    mlirAttributePrint(mlirArrayAttrGetElement(it, i), sbuf_cb, &pb);
    bool red = pb.data && strstr(pb.data, "reduction");
    kiln_sbuf_free(&pb);
    if (red) {
      reductions++;
      last_red = i;
      d->reduction_mask |= 1u << i;
    } else {
      par[npar++] = i;
    }
  }
  // A contraction multiplies operands broadcast along different output
  // dims: one input misses the last parallel loop (A, no n) and another the
  // one before (B, no m). A reduction whose body merely contains a multiply
  // (exp's polynomial) reads one full-rank input and is not one. Fusion may
  // have reshaped a batch matmul into this form, with K split in two.
  bool no_n = false, no_m = false;
  if (npar >= 2)
    for (intptr_t k = 0; k < ninputs && k < 16; ++k) {
      no_n |= !(uses[k] & (1u << par[npar - 1]));
      no_m |= !(uses[k] & (1u << par[npar - 2]));
    }
  if (reductions >= 1 && npar >= 2 && has_mul && has_add && no_n && no_m) {
    d->kind = KILN_KERNEL_CONTRACTION;
    d->m_dim = par[npar - 2];
    d->n_dim = par[npar - 1];
  } else if (reductions == 1 && last_red == loops - 1 && loops >= 2) {
    d->kind = KILN_KERNEL_ROW_REDUCTION;
  } else {
    d->kind = KILN_KERNEL_ELEMENTWISE;
  }
  return true;
}

// True when `op` already sits inside a parallel loop (the lowering's own
// row loops): it must not open a nested one.
bool kiln_kernels_inside_forall(MlirOperation op) {
  for (MlirOperation p = mlirOperationGetParentOperation(op);
       !mlirOperationIsNull(p); p = mlirOperationGetParentOperation(p))
    if (equals(mlirIdentifierStr(mlirOperationGetName(p)), "scf.forall"))
      return true;
  return false;
}

static MlirWalkResult collect_op(MlirOperation op, void *user) {
  collect_t *c = user;
  MlirStringRef name = mlirIdentifierStr(mlirOperationGetName(op));
  if (!starts_with(name, "linalg.")) return MlirWalkResultAdvance;
  kiln_kernel_desc_t d;
  if (!kiln_kernels_describe(op, &d)) return MlirWalkResultAdvance;
  d.nested = kiln_kernels_inside_forall(op);
  d.hash = op_hash(op);
  kiln_tile_config_t t;
  const kiln_kernel_tiling_t *tl = c->tiling;
  if (tl->choose)
    tl->choose(tl->user, &d, &t);
  else
    kiln_autotune_heuristic(&d, &tl->target, &t);
  char why[256];
  if (!kiln_autotune_config_valid(&d, &tl->target, &t, why, sizeof(why))) {
    char what[160];
    kiln_autotune_desc_format(&d, what, sizeof(what));
    c->error = kiln_make_status(KILN_STATUS_INTERNAL,
                                "kernels: tile config for %s: %s", what, why);
    return MlirWalkResultInterrupt;
  }
  if (c->count == c->capacity) {
    int32_t cap = c->capacity ? c->capacity * 2 : 16;
    kiln_kernel_desc_t *nd = realloc(c->descs, sizeof(*nd) * (size_t)cap);
    if (nd) c->descs = nd;
    kiln_tile_config_t *nc = realloc(c->configs, sizeof(*nc) * (size_t)cap);
    if (nc) c->configs = nc;
    MlirOperation *no = realloc(c->ops, sizeof(*no) * (size_t)cap);
    if (no) c->ops = no;
    if (!nd || !nc || !no) {
      c->error = kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "tile sizes");
      return MlirWalkResultInterrupt;
    }
    c->capacity = cap;
  }
  c->descs[c->count] = d;
  c->configs[c->count] = t;
  c->ops[c->count] = op;
  mlirOperationSetDiscardableAttributeByName(
      op, mlirStringRefCreateFromCString("kiln.tile_id"),
      mlirIntegerAttrGet(mlirIntegerTypeGet(c->ctx, 64), c->count));
  // (A symbolic loop's peeled remainder would have a dynamic shape, which
  // transform.structured.vectorize refuses, failing the whole schedule.)
  if (d.gather && !d.gather_scalar && !d.dynamic_mask)
    mlirOperationSetDiscardableAttributeByName(
        op, mlirStringRefCreateFromCString("kiln.gather"), mlirUnitAttrGet(c->ctx));
  c->count++;
  return MlirWalkResultAdvance;
}

// Which contractions take their init's producer into their thread tiles: a
// contraction distributed over threads whose init is made by a tagged
// elementwise op used by nothing else (a zero fill, an addmm's broadcast
// bias); a producer with other users stays a kernel of its own.
static void plan_fill_fusion(const collect_t *c, kiln_kernel_fusion_t *fusion) {
  for (int32_t i = 0; i < c->count; ++i)
    fusion[i].fill = fusion[i].consumer = fusion[i].epilogue = -1;
  for (int32_t i = 0; i < c->count; ++i) {
    // (A symbolic output dim would leave the fused init's vector tiles
    // unpeeled, partial and scalar: such an init stays a kernel of its own.)
    if (c->descs[i].kind != KILN_KERNEL_CONTRACTION ||
        (c->descs[i].dynamic_mask & ~c->descs[i].reduction_mask) ||
        any_partial_tile(&c->descs[i], &c->configs[i]))
      continue;
    int64_t scratch[KILN_TILE_MAX_LOOPS];
    if (!level_sizes(&c->descs[i], &c->configs[i], 0, scratch)) continue;
    MlirOperation op = c->ops[i];
    if (mlirOperationGetNumResults(op) != 1) continue;
    intptr_t init = mlirOperationGetNumOperands(op) - 1;
    MlirValue v = mlirOperationGetOperand(op, init);
    if (!mlirValueIsAOpResult(v)) continue;
    MlirOperation producer = mlirOpResultGetOwner(v);
    MlirOpOperand use = mlirValueGetFirstUse(v);
    if (mlirOpOperandIsNull(use) || !mlirOpOperandIsNull(mlirOpOperandGetNextUse(use)))
      continue;
    for (int32_t j = 0; j < c->count; ++j) {
      if (!mlirOperationEqual(c->ops[j], producer)) continue;
      if (c->descs[j].kind != KILN_KERNEL_ELEMENTWISE) break;
      fusion[i].fill = j;
      fusion[i].operand = (int32_t)init;
      fusion[j].fused = true;
      break;
    }
  }
}

// The ancestor of `op` in `block` (`op` itself, or the op whose region
// holds it); null when `op` is not inside `block`.
static MlirOperation ancestor_in(MlirBlock block, MlirOperation op) {
  while (!mlirOperationIsNull(op) &&
         !mlirBlockEqual(mlirOperationGetBlock(op), block))
    op = mlirOperationGetParentOperation(op);
  return op;
}

// True when `op` comes after `first` in `first`'s block (or is nested in
// an op that does).
static bool comes_after(MlirOperation first, MlirOperation op) {
  MlirOperation a = ancestor_in(mlirOperationGetBlock(first), op);
  if (mlirOperationIsNull(a)) return false;
  for (MlirOperation o = mlirOperationGetNextInBlock(first); !mlirOperationIsNull(o);
       o = mlirOperationGetNextInBlock(o))
    if (mlirOperationEqual(o, a)) return true;
  return false;
}

static bool same_space(const kiln_kernel_desc_t *a, const kiln_kernel_desc_t *b) {
  if (a->loop_count != b->loop_count || a->dynamic_mask || b->dynamic_mask ||
      a->reduction_mask || b->reduction_mask)
    return false;
  for (int k = 0; k < a->loop_count; ++k)
    if (a->range[k] != b->range[k]) return false;
  return true;
}

// True when operand `k` of `op` is read through the identity map.
static bool identity_operand(MlirOperation op, intptr_t k) {
  MlirAttribute maps = mlirOperationGetAttributeByName(
      op, mlirStringRefCreateFromCString("indexing_maps"));
  if (mlirAttributeIsNull(maps) || !mlirAttributeIsAArray(maps) ||
      k >= mlirArrayAttrGetNumElements(maps))
    return false;
  return mlirAffineMapIsIdentity(
      mlirAffineMapAttrGetValue(mlirArrayAttrGetElement(maps, k)));
}

// Which elementwise ops are computed inside the thread tiles of the
// elementwise op that reads them (multi-output fusion): a distributed
// linalg.generic consumer; a producer over the same static iteration space,
// read through the identity map, both outside any parallel loop, whose
// other users all come after the consumer (the fused forall then yields the
// producer's result for them), and which the consumer reads only through
// the identity map (the forall yields the tile of the first slice it
// fuses: a permuted read would leave part of the result unwritten). One
// level: consumers are visited last first, so an op already fused into a
// later consumer (`fused`) takes no producers itself.
static void plan_producer_fusion(const collect_t *c, kiln_kernel_fusion_t *fusion) {
  for (int32_t j = c->count - 1; j >= 0; --j) {
    const kiln_kernel_desc_t *dj = &c->descs[j];
    MlirOperation cj = c->ops[j];
    int64_t scratch[KILN_TILE_MAX_LOOPS];
    if (fusion[j].fused || fusion[j].epilogue >= 0 ||
        dj->kind != KILN_KERNEL_ELEMENTWISE || dj->nested ||
        dj->sum_maps || !level_sizes(dj, &c->configs[j], 0, scratch) ||
        !equals(mlirIdentifierStr(mlirOperationGetName(cj)), "linalg.generic"))
      continue;
    intptr_t ninputs = mlirOperationGetNumOperands(cj) - mlirOperationGetNumResults(cj);
    for (intptr_t k = 0; k < ninputs; ++k) {
      MlirValue v = mlirOperationGetOperand(cj, k);
      if (!mlirValueIsAOpResult(v) || !identity_operand(cj, k)) continue;
      MlirOperation pi = mlirOpResultGetOwner(v);
      int32_t i = -1;
      for (int32_t q = 0; q < j && i < 0; ++q)
        if (mlirOperationEqual(c->ops[q], pi)) i = q;
      if (i < 0 || fusion[i].fused || fusion[i].epilogue >= 0 ||
          c->descs[i].kind != KILN_KERNEL_ELEMENTWISE || c->descs[i].nested ||
          c->descs[i].sum_maps || mlirOperationGetNumResults(pi) != 1 ||
          !same_space(&c->descs[i], dj) ||
          !equals(mlirIdentifierStr(mlirOperationGetName(pi)), "linalg.generic"))
        continue;
      bool ok = true;
      for (MlirOpOperand u = mlirValueGetFirstUse(v); ok && !mlirOpOperandIsNull(u);
           u = mlirOpOperandGetNextUse(u)) {
        MlirOperation owner = mlirOpOperandGetOwner(u);
        intptr_t at = (intptr_t)mlirOpOperandGetOperandNumber(u);
        ok = mlirOperationEqual(owner, cj)
                 ? at < ninputs && identity_operand(cj, at)
                 : comes_after(cj, owner);
      }
      if (!ok) continue;
      fusion[i].fused = true;
      fusion[i].consumer = j;
    }
  }
}

// Which matmuls run inside the register tiles of their elementwise
// consumer (epilogue fusion): a distributed linalg.matmul or batch_matmul
// whose init is fused (plan_fill_fusion) and whose register tiles cover K
// once (no cache blocks; static sizes), read by one linalg.generic over its
// output's iteration space through the identity map, its only user.
static void plan_epilogue_fusion(const collect_t *c, kiln_kernel_fusion_t *fusion) {
  for (int32_t i = 0; i < c->count; ++i) {
    const kiln_kernel_desc_t *di = &c->descs[i];
    MlirOperation op = c->ops[i];
    MlirStringRef name = mlirIdentifierStr(mlirOperationGetName(op));
    int64_t scratch[KILN_TILE_MAX_LOOPS];
    if (fusion[i].fill < 0 || di->dynamic_mask ||
        level_sizes(di, &c->configs[i], 1, scratch) ||
        !(equals(name, "linalg.matmul") || equals(name, "linalg.batch_matmul")))
      continue;
    MlirValue v = mlirOperationGetResult(op, 0);
    MlirOpOperand use = mlirValueGetFirstUse(v);
    if (mlirOpOperandIsNull(use) || !mlirOpOperandIsNull(mlirOpOperandGetNextUse(use)))
      continue;
    MlirOperation cj = mlirOpOperandGetOwner(use);
    intptr_t k = (intptr_t)mlirOpOperandGetOperandNumber(use);
    int32_t j = -1;
    for (int32_t q = i + 1; q < c->count && j < 0; ++q)
      if (mlirOperationEqual(c->ops[q], cj)) j = q;
    if (j < 0) continue;
    const kiln_kernel_desc_t *dj = &c->descs[j];
    intptr_t ninputs = mlirOperationGetNumOperands(cj) - mlirOperationGetNumResults(cj);
    if (fusion[j].fused || fusion[j].epilogue >= 0 || dj->kind != KILN_KERNEL_ELEMENTWISE ||
        dj->nested || dj->sum_maps || dj->dynamic_mask || k >= ninputs ||
        mlirOperationGetNumResults(cj) != 1 ||
        !equals(mlirIdentifierStr(mlirOperationGetName(cj)), "linalg.generic") ||
        !identity_operand(cj, k) || !identity_operand(cj, ninputs))
      continue;
    // The consumer's loops are the matmul's parallel loops, in order.
    int n = 0;
    bool same = true;
    for (int q = 0; q < di->loop_count; ++q)
      if (!((di->reduction_mask >> q) & 1u))
        same &= n < dj->loop_count && dj->range[n++] == di->range[q];
    if (!same || n != dj->loop_count) continue;
    fusion[i].fused = true;
    fusion[j].epilogue = i;
    fusion[j].epilogue_operand = (int32_t)k;
  }
}

// arith.maxnumf(acc, x) -> select(acc > x, acc, x), one x86 max instruction
// (maxnumf's rule, the non-NaN operand wins, costs a compare and a blend
// more). The lowering emits maxnumf only where a NaN element need not
// propagate through the max (kiln_emit_reduce_max_nan_free: softmax's row
// max, whose NaN rows turn NaN through exp and the sum). The order matters:
// the vectorized reduction starts its accumulators at maxnumf's identity,
// NaN, and select(acc > x, acc, x) replaces a NaN accumulator by x, where
// select(x > acc, x, acc) would keep it. So the accumulator, a loop-carried
// block argument or a constant (the identity), goes first; an op with
// neither operand of that kind stays maxnumf (correct, only slower).
typedef struct {
  MlirOperation *ops;
  int count, cap;
  bool oom;
} op_list_t;

static MlirWalkResult collect_maxnumf(MlirOperation op, void *user) {
  op_list_t *l = user;
  MlirStringRef n = mlirIdentifierStr(mlirOperationGetName(op));
  if (n.length != 13 || memcmp(n.data, "arith.maxnumf", 13) != 0) return MlirWalkResultAdvance;
  if (l->count == l->cap) {
    int cap = l->cap ? 2 * l->cap : 16;
    MlirOperation *ops = realloc(l->ops, (size_t)cap * sizeof(*ops));
    if (!ops) {
      l->oom = true;
      return MlirWalkResultInterrupt;
    }
    l->ops = ops;
    l->cap = cap;
  }
  l->ops[l->count++] = op;
  return MlirWalkResultAdvance;
}

static MlirOperation create_op(MlirContext ctx, const char *name, MlirLocation loc,
                               intptr_t nops, MlirValue *operands, MlirType result,
                               MlirNamedAttribute *attr) {
  MlirOperationState st = mlirOperationStateGet(mlirStringRefCreateFromCString(name), loc);
  mlirOperationStateAddOperands(&st, nops, operands);
  mlirOperationStateAddResults(&st, 1, &result);
  if (attr) mlirOperationStateAddAttributes(&st, 1, attr);
  return mlirOperationCreate(&st);
}

// A reduction's running value: a block argument (a loop's iter_arg) or a
// constant (the identity it starts from).
static bool accumulator_like(MlirValue v) {
  if (mlirValueIsABlockArgument(v)) return true;
  if (!mlirValueIsAOpResult(v)) return false;
  MlirStringRef n = mlirIdentifierStr(mlirOperationGetName(mlirOpResultGetOwner(v)));
  return n.length == 14 && memcmp(n.data, "arith.constant", 14) == 0;
}

static kiln_status_t relax_maxnumf(MlirContext ctx, MlirModule module) {
  op_list_t l = {0};
  mlirOperationWalk(mlirModuleGetOperation(module), collect_maxnumf, &l, MlirWalkPostOrder);
  if (l.oom) {
    free(l.ops);
    return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "relaxing maxnumf");
  }
  MlirType i1 = mlirIntegerTypeGet(ctx, 1);
  // arith::CmpFPredicate::OGT.
  MlirNamedAttribute pred = mlirNamedAttributeGet(
      mlirIdentifierGet(ctx, mlirStringRefCreateFromCString("predicate")),
      mlirIntegerAttrGet(mlirIntegerTypeGet(ctx, 64), 2));
  for (int i = 0; i < l.count; ++i) {
    MlirOperation op = l.ops[i];
    MlirValue a = mlirOperationGetOperand(op, 0), b = mlirOperationGetOperand(op, 1);
    if (!accumulator_like(a)) {
      if (!accumulator_like(b)) continue;
      MlirValue tmp = a;
      a = b;
      b = tmp;
    }
    MlirType t = mlirValueGetType(a);
    MlirType ct = i1;
    if (mlirTypeIsAVector(t)) {
      intptr_t rank = mlirShapedTypeGetRank(t);
      int64_t shape[8];
      if (rank > 8) continue;  // left as maxnumf: correct, only slower
      for (intptr_t k = 0; k < rank; ++k) shape[k] = mlirShapedTypeGetDimSize(t, k);
      ct = mlirVectorTypeGet(rank, shape, i1);
    } else if (!mlirTypeIsAFloat(t)) {
      continue;
    }
    MlirLocation loc = mlirOperationGetLocation(op);
    MlirBlock block = mlirOperationGetBlock(op);
    MlirOperation cmp = create_op(ctx, "arith.cmpf", loc, 2, (MlirValue[]){a, b}, ct, &pred);
    mlirBlockInsertOwnedOperationBefore(block, op, cmp);
    MlirOperation sel = create_op(ctx, "arith.select", loc, 3,
                                  (MlirValue[]){mlirOperationGetResult(cmp, 0), a, b}, t, NULL);
    mlirBlockInsertOwnedOperationBefore(block, op, sel);
    mlirValueReplaceAllUsesOfWith(mlirOperationGetResult(op, 0), mlirOperationGetResult(sel, 0));
    mlirOperationDestroy(op);
  }
  free(l.ops);
  return NULL;
}

// No value of a CPU kernel is a vector this large: one is a whole tensor
// the vectorizer took as a single vector (an op the schedule did not tile,
// as a top-level tensor.insert_slice was), whose full unroll takes
// minutes to compile (a cat into f32[8,64,3540]: 396 s) and runs serially.
// Failing here names it instead. (KILN_MAX_VECTOR_ELEMS lowers the bound
// for the lit test of this check.)
typedef struct {
  int64_t limit;
  kiln_status_t error;
} vector_check_t;

static MlirWalkResult check_vector_size(MlirOperation op, void *user) {
  vector_check_t *c = user;
  for (intptr_t i = 0; i < mlirOperationGetNumResults(op); ++i) {
    MlirType t = mlirValueGetType(mlirOperationGetResult(op, i));
    if (!mlirTypeIsAVector(t)) continue;
    int64_t n = 1;
    for (intptr_t d = 0; d < mlirShapedTypeGetRank(t); ++d) n *= mlirShapedTypeGetDimSize(t, d);
    if (n <= c->limit) continue;
    kiln_sbuf_t b;
    kiln_sbuf_init(&b);
    mlirTypePrint(t, sbuf_cb, &b);
    MlirStringRef name = mlirIdentifierStr(mlirOperationGetName(op));
    c->error = kiln_make_status(KILN_STATUS_COMPILE_ERROR,
                                "kernels: the CPU schedule left %.*s with a %s "
                                "(%lld elements, at most %lld expected): an op "
                                "vectorized whole instead of tiled",
                                (int)name.length, name.data, b.data ? b.data : "vector",
                                (long long)n, (long long)c->limit);
    kiln_sbuf_free(&b);
    return MlirWalkResultInterrupt;
  }
  return MlirWalkResultAdvance;
}

kiln_status_t kiln_kernels_vectorize_cpu(MlirContext ctx, MlirModule module,
                                         const kiln_kernel_tiling_t *tiling) {
  // Without a target: AVX2-class registers, one thread.
  kiln_kernel_tiling_t fallback = {{32, 16, 1, 32 << 10, 1 << 20}, NULL, NULL};
  collect_t c;
  memset(&c, 0, sizeof(c));
  c.ctx = ctx;
  c.tiling = tiling ? tiling : &fallback;
  MlirOperation root = mlirModuleGetOperation(module);
  mlirOperationWalk(root, collect_op, &c, MlirWalkPreOrder);
  char *text = NULL;
  kiln_status_t s = c.error;
  kiln_kernel_fusion_t *fusion = NULL;
  if (!s && c.count > 0) {
    fusion = calloc((size_t)c.count, sizeof(*fusion));
    if (!fusion) s = kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "fusion");
  }
  if (fusion) {
    plan_fill_fusion(&c, fusion);
    plan_epilogue_fusion(&c, fusion);
    plan_producer_fusion(&c, fusion);
  }
  if (!s) s = kiln_kernels_cpu_schedule(c.descs, c.configs, fusion, c.count, &text);
  free(fusion);
  free(c.ops);
  free(c.descs);
  free(c.configs);
  if (s) return s;
  s = kiln_kernels_apply_script(ctx, module, text, "CPU schedule");
  free(text);
  if (!s) s = relax_maxnumf(ctx, module);
  if (!s) {
    const char *env = getenv("KILN_MAX_VECTOR_ELEMS");
    vector_check_t vc = {env && atoll(env) > 0 ? atoll(env) : 1 << 16, NULL};
    mlirOperationWalk(root, check_vector_size, &vc, MlirWalkPreOrder);
    s = vc.error;
  }
  return s;
}

kiln_status_t kiln_kernels_apply_script(MlirContext ctx, MlirModule module,
                                        const char *text, const char *what) {
  MlirModule script =
      mlirModuleCreateParse(ctx, mlirStringRefCreateFromCString(text));
  if (mlirModuleIsNull(script))
    return kiln_make_status(KILN_STATUS_INTERNAL,
                            "kernels: the %s does not parse", what);
  MlirOperation script_op = mlirModuleGetOperation(script);
  MlirOperation entry = mlirBlockGetFirstOperation(
      mlirRegionGetFirstBlock(mlirOperationGetRegion(script_op, 0)));
  MlirTransformOptions topts = mlirTransformOptionsCreate();
  MlirLogicalResult r = mlirTransformApplyNamedSequence(
      mlirModuleGetOperation(module), entry, script_op, topts);
  mlirTransformOptionsDestroy(topts);
  mlirModuleDestroy(script);
  if (mlirLogicalResultIsFailure(r))
    return kiln_make_status(KILN_STATUS_COMPILE_ERROR,
                            "kernels: applying the %s failed", what);
  return NULL;
}
