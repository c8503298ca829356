// Contractions: linalg.matmul / batch_matmul and the 2-D convolutions, with
// f16/bf16 operands accumulating in f32 (the named ops cast their inputs to
// the accumulator element type).
#include <stdio.h>
#include <string.h>

#include "kernels/kernels.h"
#include "lowering/emit.h"

// The bf16 microkernel (AVX512-BF16): C[m, n] = sum_k A[m, k] B[k, n] with
// bf16 operands and f32 accumulators, two k at a time per vdpbf16ps.
//
// B is packed once per call into pairs of rows per group of 16 columns,
// Bp[n/16, k/2, n%16, 0..1] (one linalg.transpose of B viewed as
// [K/2, 2, N/16, 16]), so 16 columns of a row pair are one 64-byte vector
// and a group's row pairs follow each other; A is read as [M, K/2, 2] (a
// free reshape) and a pair A[m, 2kk..2kk+1] is broadcast as one 32-bit lane
// pattern. A register tile of `rm` rows x 32 columns keeps 2*rm f32
// accumulators in registers across the whole K loop. Row blocks go to
// threads (scf.forall). With AMX the rows run as 32x32 tiles on the tile
// unit first (emit_amx_rows), the same packed B being its tile layout.
//
// M may be symbolic (a batch under torch.compile's dynamic shapes; K and N
// are a weight's): the row blocks are then sized at run time, a block's
// rows run as full register tiles and one masked tile for the rest.
// (Symbolic bf16 matmuls took the generic contraction, 2.3x slower than
// eager.)
//
// N need not be a multiple of 32: packed B is zero-padded to whole 32-column
// panels and the last panel's writes stop at N (masked). (With the generic
// contraction a bf16 [512, 512] x [512, 500] took 5.7 ms against eager's
// 0.65.)
//
// Upstream's x86vector contract-to-dot patterns need contracts unrolled to
// one row, which no transform op here produces; the loop nest is small
// enough to write directly.
static const kiln_tv_t *transposed_source(kiln_emitter_t *e, int value);

static bool bf16_dot_applies(const kiln_emitter_t *e, const kiln_tv_t *a,
                             const kiln_tv_t *b) {
  // A batched matmul: static, whole 32-column panels, one batch size (the
  // kernel's batched form packs B per batch in one transpose).
  if (e->options.x86_bf16_dot && a->type.rank == 3 && b->type.rank == 3 &&
      a->type.dtype == KILN_BF16 && b->type.dtype == KILN_BF16 &&
      kiln_type_is_static(&a->type) && kiln_type_is_static(&b->type))
    return a->type.dims[0] == b->type.dims[0] && a->type.dims[0] >= 1 &&
           a->type.dims[2] % 2 == 0 && a->type.dims[2] >= 2 && a->type.dims[1] % 2 == 0 &&
           a->type.dims[1] >= 2 && b->type.dims[2] % 32 == 0 && b->type.dims[2] >= 32;
  if (!e->options.x86_bf16_dot || a->type.dtype != KILN_BF16 ||
      b->type.dtype != KILN_BF16 || a->type.rank != 2 || b->type.rank != 2 ||
      !kiln_type_is_static(&b->type) || KILN_IS_SYM(a->type.dims[1]))
    return false;
  // (An odd static M runs like a symbolic one: emit_bf16_dot.)
  return a->type.dims[1] % 2 == 0 && b->type.dims[1] >= 1 && a->type.dims[1] >= 2 &&
         (KILN_IS_SYM(a->type.dims[0]) || a->type.dims[0] >= 1);
}

// The columns of each 16-column half of a 32-column panel that lie inside
// N: 16 for a whole panel (panel 0: the whole ones); for panel 1 (the
// last, partial one) the first half's count and the second's (0: none).
static void panel_cols(long long N, int panel, int cols[2]) {
  long long w = panel ? N - N / 32 * 32 : 32;
  cols[0] = (int)(w < 16 ? w : 16);
  cols[1] = (int)(w > 16 ? w - 16 : 0);
}

// The rows of A a register tile reads, %gr<tag>0 .. rm - 1: %row0 + %i<tag>
// + r. A masked tile (the block's last rows % rm rows, %tailn of them)
// reads row min(r, %tailn - 1) in place of the rows past the end (and
// emit_tile_store writes only its first %tailn rows).
static void emit_tile_rows(kiln_sbuf_t *o, int rm, const char *tag, bool masked) {
  for (int r = 0; r < rm; ++r) {
    if (masked)
      kiln_sbuf_printf(o, "          %%gr%s%d = affine.min affine_map<(d0, d1)[s0] -> "
                          "(d0 + d1 + %d, d0 + d1 + s0 - 1)>(%%row0, %%i%s)[%%tailn]\n",
                       tag, r, r, tag);
    else
      kiln_sbuf_printf(o, "          %%gr%s%d = affine.apply affine_map<(d0, d1) -> "
                          "(d0 + d1 + %d)>(%%row0, %%i%s)\n", tag, r, r, tag);
  }
}

// Writes a register tile's accumulators %acc<tag>#0 .. #2rm-1 (or, where
// `vals` is given, the values named there; row r's two 16-column halves at
// 2r, 2r + 1) into rows %i<tag> + r, columns jc[0] and
// jc[1] of the block tensor `cur` (typed `bty`), rounded to bf16 where
// `store_bf16`; `cols` as for the tile, and in a masked tile only rows
// below %tailn are written. `next` gets the tensor after the writes.
static void emit_tile_store(kiln_sbuf_t *o, int rm, const char *tag, const char *cur,
                            const char *bty, const char *el, bool store_bf16, bool masked,
                            const int cols[2], const char *const jc[2],
                            char (*vals)[24], char next[24]) {
  char prev[24];
  snprintf(prev, sizeof(prev), "%s", cur);
  for (int r = 0; r < rm; ++r) {
    kiln_sbuf_printf(o, "          %%li%s%d = affine.apply affine_map<(d0) -> "
                        "(d0 + %d)>(%%i%s)\n", tag, r, r, tag);
    if (masked && r > 0)
      kiln_sbuf_printf(o, "          %%cr%s%d = arith.constant %d : index\n", tag, r, r);
    for (int h = 0; h < 2; ++h) {
      if (cols[h] == 0) continue;
      const char *inb = cols[h] == 16 ? "true" : "false";
      char w[24], val[24];
      snprintf(w, sizeof(w), "%%w%s%d", tag, 2 * r + h);
      if (vals)
        snprintf(val, sizeof(val), "%s", vals[2 * r + h]);
      else
        snprintf(val, sizeof(val), "%%acc%s#%d", tag, 2 * r + h);
      if (store_bf16) {
        kiln_sbuf_printf(o, "          %%tr%s%d = arith.truncf %s : vector<16xf32> "
                            "to vector<16xbf16>\n", tag, 2 * r + h, val);
        snprintf(val, sizeof(val), "%%tr%s%d", tag, 2 * r + h);
      }
      if (masked && r > 0) {
        if (h == 0)
          kiln_sbuf_printf(o, "          %%in%s%d = arith.cmpi ult, %%cr%s%d, %%tailn : index\n",
                           tag, r, tag, r);
        kiln_sbuf_printf(o,
            "          %s = scf.if %%in%s%d -> (%s) {\n"
            "            %%ww%s%d = vector.transfer_write %s, %s[%%li%s%d, %s] "
            "{in_bounds = [%s]} : vector<16x%s>, %s\n"
            "            scf.yield %%ww%s%d : %s\n"
            "          } else {\n"
            "            scf.yield %s : %s\n"
            "          }\n",
            w, tag, r, bty, tag, 2 * r + h, val, prev, tag, r, jc[h], inb, el,
            bty, tag, 2 * r + h, bty, prev, bty);
      } else {
        kiln_sbuf_printf(o,
            "          %s = vector.transfer_write %s, %s[%%li%s%d, %s] "
            "{in_bounds = [%s]} : vector<16x%s>, %s\n",
            w, val, prev, tag, r, jc[h], inb, el, bty);
      }
      snprintf(prev, sizeof(prev), "%s", w);
    }
  }
  snprintf(next, 24, "%s", prev);
}

// One register tile: rows %i<tag> .. + rm - 1 of the block at %row0, columns
// %j .. %j + 31, the whole K loop, written into the block tensor `cur`
// (typed `bty`); `next` gets the tensor after the writes. Names are
// suffixed by `tag` (one tile form per loop). `ae` is A as [M, K/2, 2]
// (`aty`), `bp` packed B.
static void emit_bf16_tile(kiln_sbuf_t *o, int rm, const char *tag, const char *cur,
                           const char *bty, const char *el, bool store_bf16,
                           bool masked, const int cols[2], const char *ae,
                           const char *aty, const char *bp, long long K2, long long N,
                           char next[24]) {
  emit_tile_rows(o, rm, tag, masked);
  // `cols`: the columns of each 16-column half inside N (the last panel
  // of an N that is not a multiple of 32): 16 writes the half, 0 skips it,
  // others write it masked (in_bounds = false).
  kiln_sbuf_printf(o, "          %%acc%s:%d = scf.for %%kk%s = %%c0 to %%ck2 step %%c1 "
                      "iter_args(", tag, 2 * rm, tag);
  for (int t = 0; t < 2 * rm; ++t)
    kiln_sbuf_printf(o, "%s%%x%s%d = %%zero", t ? ", " : "", tag, t);
  kiln_sbuf_puts(o, ") -> (");
  for (int t = 0; t < 2 * rm; ++t)
    kiln_sbuf_printf(o, "%svector<16xf32>", t ? ", " : "");
  kiln_sbuf_puts(o, ") {\n");
  for (int h = 0; h < 2; ++h)
    kiln_sbuf_printf(o,
        "            %%b%s%d = vector.transfer_read %s[%%p%d, %%kk%s, %%c0], %%padb "
        "{in_bounds = [true]} : tensor<%lldx%lldx32xbf16>, vector<32xbf16>\n",
        tag, h, bp, h, tag, N / 16, K2);
  for (int r = 0; r < rm; ++r) {
    kiln_sbuf_printf(o,
        "            %%av%s%d = vector.transfer_read %s[%%gr%s%d, %%kk%s, %%c0], %%padb "
        "{in_bounds = [true]} : %s, vector<2xbf16>\n"
        "            %%ai%s%d = vector.bitcast %%av%s%d : vector<2xbf16> to vector<1xi32>\n"
        "            %%as%s%d = vector.extract %%ai%s%d[0] : i32 from vector<1xi32>\n"
        "            %%ab%s%d = vector.broadcast %%as%s%d : i32 to vector<16xi32>\n"
        "            %%a%s%d = vector.bitcast %%ab%s%d : vector<16xi32> to vector<32xbf16>\n",
        tag, r, ae, tag, r, tag, aty, tag, r, tag, r, tag, r, tag, r, tag, r, tag, r, tag,
        r, tag, r);
    for (int h = 0; h < 2; ++h)
      kiln_sbuf_printf(o,
          "            %%y%s%d = x86vector.avx512.dot %%x%s%d, %%a%s%d, %%b%s%d : "
          "vector<32xbf16> -> vector<16xf32>\n",
          tag, 2 * r + h, tag, 2 * r + h, tag, r, tag, h);
  }
  kiln_sbuf_puts(o, "            scf.yield ");
  for (int t = 0; t < 2 * rm; ++t) kiln_sbuf_printf(o, "%s%%y%s%d", t ? ", " : "", tag, t);
  kiln_sbuf_puts(o, " : ");
  for (int t = 0; t < 2 * rm; ++t)
    kiln_sbuf_printf(o, "%svector<16xf32>", t ? ", " : "");
  kiln_sbuf_puts(o, "\n          }\n");
  static const char *const jc[2] = {"%j", "%j16"};
  emit_tile_store(o, rm, tag, cur, bty, el, store_bf16, masked, cols, jc, NULL, next);
}

// Whether matrix `value` is certain to have unit inner stride once
// bufferized (what amx.tile_load needs of A's memref): a contiguous input,
// a computed tensor (a fresh buffer), or a reshape or unit-step slice of
// such, or a chain of permutes that composes to none (the source itself).
// A strided input or a slice with a step in the last dim may not.
static bool unit_inner_stride(kiln_emitter_t *e, int value) {
  const kiln_value_t *v = &e->g->values[value];
  if (v->node < 0) {
    for (int i = 0; i < e->g->input_count; ++i)
      if (e->g->inputs[i] == value) return !(e->input_strided && e->input_strided[i]);
    return false;
  }
  const kiln_node_t *p = &e->g->nodes[v->node];
  switch (p->op) {
    case KILN_OP_VIEW:
    case KILN_OP_RESHAPE:
    case KILN_OP_SQUEEZE:
    case KILN_OP_UNSQUEEZE:
      return p->operands[0].kind == KILN_OPERAND_VALUE &&
             unit_inner_stride(e, p->operands[0].value);
    case KILN_OP_PERMUTE:
    case KILN_OP_TRANSPOSE: {
      // A real permutation is a linalg.transpose into a fresh buffer; the
      // identity is the source value (lower_permute).
      int32_t perm[KILN_MAX_RANK];
      const kiln_tv_t *src = NULL;
      kiln_permute_source(e, p, v->type.rank, perm, &src);
      for (int i = 0; i < v->type.rank; ++i)
        if (perm[i] != i) return true;
      return unit_inner_stride(e, (int)(src - e->values));
    }
    case KILN_OP_SLICE: {
      const kiln_type_t *t = &e->g->values[p->operands[0].value].type;
      int32_t d;
      kiln_normalize_dim(kiln_node_attr_int(p, "dim", 0), t->rank, &d);
      return (d != t->rank - 1 || kiln_node_attr_int(p, "step", 1) == 1) &&
             unit_inner_stride(e, p->operands[0].value);
    }
    default:
      return true;
  }
}

// The AMX form of the bf16 microkernel's row loop: tiles of 32 rows x 32
// columns (the panel), rows %cl1t.. of the block from 0 to %fx, each four
// 16x16 f32 accumulator tiles over the whole K loop, 32 k per step: two A
// tiles (16 rows x 32 k, read in place from A's memref `am`) and two B
// tiles (16 row pairs x 16 columns of packed B, `bpm`, which is already in
// the tile unit's pair layout), four tdpbf16ps. The accumulators go
// through a 32x32 f32 scratch (`%scr`, one per thread block) into vectors
// and are written like the vector tiles' (rounded to bf16 where the output
// is; a last panel's columns past N are not written). Rows from %fx on are
// the vector microkernel's.
static void emit_amx_rows(kiln_sbuf_t *o, const char *bty, const char *el, bool store_bf16,
                          const int cols[2], const char *am, const char *amty,
                          const char *bpm, const char *bpmty, char next[24]) {
  const char *tt = "!amx.tile<16x16xf32>", *it = "!amx.tile<16x32xbf16>";
  kiln_sbuf_printf(o,
      "        %%rx = scf.for %%ix = %%c0 to %%fx step %%c32 iter_args(%%cxt = %%c1t) "
      "-> (%s) {\n"
      "          %%gx0 = arith.addi %%row0, %%ix : index\n"
      "          %%gx1 = arith.addi %%gx0, %%c16 : index\n"
      "          %%xz = amx.tile_zero : %s\n"
      "          %%xacc:4 = scf.for %%xk = %%c0 to %%ck2 step %%c16 iter_args(%%xa0 = %%xz, "
      "%%xa1 = %%xz, %%xa2 = %%xz, %%xa3 = %%xz) -> (%s, %s, %s, %s) {\n"
      "            %%xk2 = arith.addi %%xk, %%xk : index\n"
      "            %%xta0 = amx.tile_load %s[%%gx0, %%xk2] : %s into %s\n"
      "            %%xta1 = amx.tile_load %s[%%gx1, %%xk2] : %s into %s\n"
      "            %%xtb0 = amx.tile_load %s[%%p0, %%xk, %%c0] : %s into %s\n"
      "            %%xtb1 = amx.tile_load %s[%%p1, %%xk, %%c0] : %s into %s\n",
      bty, tt, tt, tt, tt, tt, am, amty, it, am, amty, it, bpm, bpmty, it, bpm, bpmty, it);
  static const char *const pairs[4][2] = {{"0", "0"}, {"0", "1"}, {"1", "0"}, {"1", "1"}};
  for (int t = 0; t < 4; ++t)
    kiln_sbuf_printf(o, "            %%xu%d = amx.tile_mulf %%xta%s, %%xtb%s, %%xa%d : %s, %s, %s\n",
                     t, pairs[t][0], pairs[t][1], t, it, it, tt);
  kiln_sbuf_printf(o,
      "            scf.yield %%xu0, %%xu1, %%xu2, %%xu3 : %s, %s, %s, %s\n"
      "          }\n",
      tt, tt, tt, tt);
  for (int t = 0; t < 4; ++t)
    kiln_sbuf_printf(o, "          amx.tile_store %%scr[%s, %s], %%xacc#%d : "
                        "memref<32x32xf32, strided<[32, 1], offset: ?>>, %s\n",
                     t < 2 ? "%c0" : "%c16", t % 2 ? "%c16" : "%c0", t, tt);
  // The rows, one at a time: two 16-column reads of the scratch, written
  // into the block (a loop: 32 unrolled rows cost compile time, not speed).
  kiln_sbuf_printf(o, "          %%xo = scf.for %%xr = %%c0 to %%c32 step %%c1 "
                      "iter_args(%%xb = %%cxt) -> (%s) {\n"
                      "            %%xl = arith.addi %%ix, %%xr : index\n", bty);
  char prev[24] = "%xb";
  for (int h = 0; h < 2; ++h) {
    if (cols[h] == 0) continue;
    kiln_sbuf_printf(o, "            %%xv%d = vector.load %%scr[%%xr, %s] : "
                        "memref<32x32xf32, strided<[32, 1], offset: ?>>, vector<16xf32>\n",
                     h, h ? "%c16" : "%c0");
    char val[24];
    snprintf(val, sizeof(val), "%%xv%d", h);
    if (store_bf16) {
      kiln_sbuf_printf(o, "            %%xt%d = arith.truncf %s : vector<16xf32> "
                          "to vector<16xbf16>\n", h, val);
      snprintf(val, sizeof(val), "%%xt%d", h);
    }
    kiln_sbuf_printf(o,
        "            %%xw%d = vector.transfer_write %s, %s[%%xl, %s] "
        "{in_bounds = [%s]} : vector<16x%s>, %s\n",
        h, val, prev, h ? "%j16" : "%j", cols[h] == 16 ? "true" : "false", el, bty);
    snprintf(prev, sizeof(prev), "%%xw%d", h);
  }
  kiln_sbuf_printf(o, "            scf.yield %s : %s\n          }\n"
                      "          scf.yield %%xo : %s\n        }\n", prev, bty, bty);
  snprintf(next, 24, "%%rx");
}

// Packed B (`bp`, [K/2, 2N]) from W [N, K] where B = W^T (a linear layer's
// weight): Bp[kk, n, 0..1] = W[n, 2kk..2kk+1] is a transpose of W's 32-bit
// pairs, done in 8x8 blocks: eight 16-element row reads, bitcast to i32,
// one vector.transpose (shuffles), eight 16-element writes. (The generic
// pack of W^T moved one pair per scalar load and store: 0.075 of a 512^3
// linear's 0.66 ms.) K/2 and N multiples of 8. The forall's outer dim is
// the blocks of 8 rows of W, so a thread's iterations read whole rows of W
// in turn; with the K blocks outer each 64-byte line of W was fetched
// twice, far apart (kiln-run, 256 x 4096 x 4096: the pack 6-7.7 -> 1.8-2.9
// ms, the matmul 12.5 -> 7.2).
static void emit_bf16_pack_transposed(kiln_emitter_t *e, const kiln_tv_t *bt,
                                      long long K2, long long N, long long N32,
                                      const char *init, const char *bp) {
  kiln_sbuf_t *o = &e->out;
  long long K = 2 * K2;
  kiln_sbuf_printf(o,
      "    %s = scf.forall (%%pn, %%pk) in (%lld, %lld) shared_outs(%%po = %s) -> "
      "(tensor<%lldx%lldx32xbf16>) {\n"
      "      %%pz = arith.constant dense<0> : vector<8x8xi32>\n"
      "      %%ppad = arith.constant 0.0 : bf16\n"
      "      %%pk0 = affine.apply affine_map<(d0) -> (d0 * 8)>(%%pk)\n"
      "      %%pkc = affine.apply affine_map<(d0) -> (d0 * 16)>(%%pk)\n"
      "      %%pn0 = affine.apply affine_map<(d0) -> (d0 * 8)>(%%pn)\n"
      "      %%png = affine.apply affine_map<(d0) -> (d0 floordiv 2)>(%%pn)\n"
      "      %%pnc = affine.apply affine_map<(d0) -> ((d0 mod 2) * 16)>(%%pn)\n",
      bp, N / 8, K2 / 8, init, N32 / 16, K2);
  const char *prev = "%pz";
  char cur[24];
  for (int r = 0; r < 8; ++r) {
    kiln_sbuf_printf(o,
        "      %%pr%d = affine.apply affine_map<(d0) -> (d0 + %d)>(%%pn0)\n"
        "      %%pv%d = vector.transfer_read %s[%%pr%d, %%pkc], %%ppad {in_bounds = [true]} : "
        "tensor<%lldx%lldxbf16>, vector<16xbf16>\n"
        "      %%pi%d = vector.bitcast %%pv%d : vector<16xbf16> to vector<8xi32>\n"
        "      %%pm%d = vector.insert %%pi%d, %s [%d] : vector<8xi32> into vector<8x8xi32>\n",
        r, r, r, bt->ssa, r, N, K, r, r, r, r, prev, r);
    snprintf(cur, sizeof(cur), "%%pm%d", r);
    prev = cur;
  }
  kiln_sbuf_printf(o,
      "      %%pt = vector.transpose %%pm7, [1, 0] : vector<8x8xi32> to vector<8x8xi32>\n"
      "      %%ps = tensor.extract_slice %%po[%%png, %%pk0, %%pnc] [1, 8, 16] [1, 1, 1] : "
      "tensor<%lldx%lldx32xbf16> to tensor<8x16xbf16>\n",
      N32 / 16, K2);
  char slice[24] = "%ps";
  for (int c = 0; c < 8; ++c) {
    kiln_sbuf_printf(o,
        "      %%pe%d = vector.extract %%pt[%d] : vector<8xi32> from vector<8x8xi32>\n"
        "      %%pb%d = vector.bitcast %%pe%d : vector<8xi32> to vector<16xbf16>\n"
        "      %%pc%d = arith.constant %d : index\n"
        "      %%pw%d = vector.transfer_write %%pb%d, %s[%%pc%d, %%pc0] {in_bounds = [true]} : "
        "vector<16xbf16>, tensor<8x16xbf16>\n",
        c, c, c, c, c, c, c, c, slice, c);
    snprintf(slice, sizeof(slice), "%%pw%d", c);
  }
  kiln_sbuf_printf(o,
      "      scf.forall.in_parallel {\n"
      "        tensor.parallel_insert_slice %s into %%po[%%png, %%pk0, %%pnc] [1, 8, 16] "
      "[1, 1, 1] : tensor<8x16xbf16> into tensor<%lldx%lldx32xbf16>\n"
      "      }\n"
      "    }\n",
      slice, N32 / 16, K2);
}

// The descriptor lib/autotune gets for a GEMM microkernel of `kind`: loops
// (m, n, k), k the reduction, M symbolic (planned with the stand-in
// range) where it is a symbol.
static void gemm_desc(kiln_kernel_kind_t kind, int64_t M, long long N, long long K,
                      int elem_bytes, kiln_kernel_desc_t *kd) {
  memset(kd, 0, sizeof(*kd));
  bool sym_m = KILN_IS_SYM(M);
  kd->kind = kind;
  kd->loop_count = 3;
  kd->range[0] = sym_m ? KILN_DYNAMIC_RANGE_STANDIN : M;
  kd->range[1] = N;
  kd->range[2] = K;
  kd->reduction_mask = 1u << 2;
  kd->dynamic_mask = sym_m ? 1u : 0u;
  kd->m_dim = 0;
  kd->n_dim = 1;
  kd->transpose_dim = -1;
  kd->elem_bytes = elem_bytes;
}

// A CPU microkernel's tiles: asked of the tiling the lowering was given
// (the heuristic, the tuning database or a measured candidate), else the
// heuristic's for an AVX-512 target (the microkernels are emitted only
// there). `id` names the kernel in the tuning database: its sizes and form.
static void microkernel_tiles(const kiln_emitter_t *e, const char *id, kiln_kernel_desc_t *kd,
                              kiln_tile_config_t *out) {
  kiln_cpu_target_t avx512 = {64, 32, 1, 48 << 10, 2 << 20};
  kiln_kernel_tiles(e->options.tiling, &avx512, id, kd, out);
}

// The microkernel's tiles (lib/autotune's KILN_KERNEL_BF16_DOT). Its
// identity for the tuning database: its sizes and form (AMX, B given
// transposed, bf16 stores).
static void bf16_dot_tiles(const kiln_emitter_t *e, int64_t M, long long NB, long long N,
                           long long K, bool amx, bool bt, bool store_bf16,
                           kiln_tile_config_t *out) {
  kiln_kernel_desc_t kd;
  gemm_desc(KILN_KERNEL_BF16_DOT, M, N, K, 2, &kd);
  kd.amx = amx;
  char id[160];
  snprintf(id, sizeof(id), "bf16_dot b=%lld m=%lld n=%lld k=%lld amx=%d bt=%d store=%d", NB,
           KILN_IS_SYM(M) ? -1LL : (long long)M, N, K, amx, bt, store_bf16);
  microkernel_tiles(e, id, &kd, out);
}

// `init`/`oty` is the output tensor: f32, or bf16 when the accumulators
// are rounded as they are stored (a plain mm: no f32 C written and re-read).
// `bt` (or NULL): B's untransposed source W when B = W^T, packed from W.

static void emit_bf16_dot(kiln_emitter_t *e, int a_value, const kiln_tv_t *b,
                          const kiln_tv_t *bt, const char *init, const char *oty,
                          bool store_bf16, char out[24]) {
  const kiln_tv_t *a = &e->values[a_value];
  const char *el = store_bf16 ? "bf16" : "f32";
  // A batched matmul (A [NB, M, K], B [NB, K, N]; static, N whole panels,
  // B not given transposed: bf16_dot_applies) runs one forall over
  // (batch, row block), each task on its batch's slices.
  const int ra = a->type.rank;
  const long long NB = ra == 3 ? (long long)a->type.dims[0] : 0;
  int64_t m = a->type.dims[ra - 2], k = a->type.dims[ra - 1], nn = b->type.dims[ra - 1];
  bool sym_m = KILN_IS_SYM(m);
  bool amx = e->options.x86_amx && k % 32 == 0 && unit_inner_stride(e, a_value);
  // An odd static M (197 tokens: a ViT's) has no register tile dividing it:
  // its blocks and last masked tile are computed at run time as for a
  // symbolic M (the 2-row tiles that divided nothing else, and the
  // generic contraction before that, were 9x slower than eager). So does
  // a static M whose halves are no whole tiles of the heuristic's
  // (heuristic_bf16_dot: 32-row AMX tiles, else 8, 4 or 2 rows dividing
  // M): it made one block, run on one thread (196 rows).
  int unit0 = amx ? 32 : m % 8 == 0 ? 8 : m % 4 == 0 ? 4 : 2;
  const bool ragged = !sym_m && !NB &&
                      (m % 2 || (m >= 2 * unit0 && (m / 2) % unit0 != 0));
  int64_t k2 = k / 2;
  // Row blocks for threads, whole register tiles each (the tiles'
  // forall[0]; the heuristic's: four where M allows, heuristic_bf16_dot).
  // Inside a block the 32-column panel of Bp (K x 64 bytes) is the outer
  // loop, so it stays in L1/L2 while the block's rows go by. AMX (32-row
  // tiles, 32 k a step) reads A in place: K a multiple of 32 and A's rows
  // contiguous. The heuristic's blocks keep whole 32-row tiles: split
  // into 16-row blocks, 64 rows ran on the vector kernel (0.40 ms for
  // 64 x 768 x 768 against 0.1 on the tile unit).
  kiln_tile_config_t tc;
  bf16_dot_tiles(e, ragged ? KILN_SYM(0) : m, NB, nn, k, amx, bt != NULL, store_bf16, &tc);
  int rm = (int)tc.reg[0];
  int64_t mb = sym_m ? 0 : tc.forall[0] ? tc.forall[0] : m;
  char ae[24], be[24], bpt[24], bp[24], res[24];
  kiln_emit_fresh(e, bpt);
  kiln_emit_fresh(e, ae);
  kiln_emit_fresh(e, be);
  kiln_emit_fresh(e, bp);
  kiln_emit_fresh(e, res);
  kiln_sbuf_t *o = &e->out;
  long long K = k, N = nn, K2 = k2, MB = mb, N32 = (nn + 31) / 32 * 32;
  // M as text (a number, or the symbol's index value) and in types.
  char msz[24], mty[24];
  kiln_emit_size_operand(e, &a->type, ra - 2, msz);
  snprintf(mty, sizeof(mty), "%s", sym_m ? "?" : msz);
  // Types of one batch's A and packed B (what the tiles read), and, where
  // batched, of the whole tensors (a `NBx` prefix).
  char aty[96], ae_ty[96], bty[96], bpe_ty[96], nbx[32] = "";
  if (NB) snprintf(nbx, sizeof(nbx), "%lldx", NB);
  snprintf(aty, sizeof(aty), "tensor<%s%sx%lldxbf16>", nbx, mty, K);
  snprintf(ae_ty, sizeof(ae_ty), "tensor<%sx%lldx2xbf16>", mty, K2);
  char ae_all_ty[96];
  snprintf(ae_all_ty, sizeof(ae_all_ty), "tensor<%s%sx%lldx2xbf16>", nbx, mty, K2);
  // M as an index value for the run-time block sizes (`mrt`).
  char mrt[24];
  snprintf(mrt, sizeof(mrt), "%s", msz);
  if (NB)
    kiln_sbuf_printf(o,
        "    %s = tensor.expand_shape %s [[0], [1], [2, 3]] output_shape [%lld, %s, %lld, 2] "
        ": %s into %s\n",
        ae, a->ssa, NB, msz, K2, aty, ae_all_ty);
  else
    kiln_sbuf_printf(o,
        "    %s = tensor.expand_shape %s [[0], [1, 2]] output_shape [%s, %lld, 2] "
        ": %s into %s\n",
        ae, a->ssa, msz, K2, aty, ae_all_ty);
  // Packed B is [N32/16, K/2, 32]: per group of 16 columns, row pair kk
  // holds B[2kk, n], B[2kk+1, n] for its 16 columns, so a group's rows are
  // contiguous (an AMX tile, 16 row pairs, is one 1 KiB block; a vector
  // microkernel step reads two 64-byte rows). In a [K/2, 2N] layout the
  // rows of one group were 4N bytes apart, which for N = 1024 put all 16
  // rows of a tile in one L1 set. Columns past N (to whole 32-column
  // panels) are zeros.
  long long G = N32 / 16;
  snprintf(bpe_ty, sizeof(bpe_ty), "tensor<%lldx%lldx32xbf16>", G, K2);
  if (NB) {
    // Per batch as below: B [NB, K, N] as [NB, K/2, 2, G, 16], transposed
    // to [NB, G, K/2, 16, 2].
    char tinit[24];
    kiln_emit_fresh(e, tinit);
    kiln_sbuf_printf(o,
        "    %s = tensor.expand_shape %s [[0], [1, 2], [3, 4]] output_shape [%lld, %lld, 2, "
        "%lld, 16] : tensor<%lldx%lldx%lldxbf16> into tensor<%lldx%lldx2x%lldx16xbf16>\n"
        "    %s = tensor.empty() : tensor<%lldx%lldx%lldx16x2xbf16>\n"
        "    %s = linalg.transpose ins(%s : tensor<%lldx%lldx2x%lldx16xbf16>) outs(%s : "
        "tensor<%lldx%lldx%lldx16x2xbf16>) permutation = [0, 3, 1, 4, 2]\n"
        "    %s = tensor.collapse_shape %s [[0], [1], [2], [3, 4]] : "
        "tensor<%lldx%lldx%lldx16x2xbf16> into tensor<%lldx%lldx%lldx32xbf16>\n",
        be, b->ssa, NB, K2, G, NB, K, N, NB, K2, G, tinit, NB, G, K2, bpt, be, NB, K2, G,
        tinit, NB, G, K2, bp, bpt, NB, G, K2, NB, G, K2);
  } else if (bt && K2 % 8 == 0 && N % 8 == 0) {
    char bpinit[24];
    if (N32 != N) {
      kiln_type_t zt = {.dtype = KILN_BF16, .rank = 3, .dims = {G, K2, 32}};
      kiln_tv_t z;
      kiln_emit_filled(e, &zt, 0, &z);
      snprintf(bpinit, sizeof(bpinit), "%s", z.ssa);
    } else {
      kiln_emit_fresh(e, bpinit);
      kiln_sbuf_printf(o, "    %s = tensor.empty() : tensor<%lldx%lldx32xbf16>\n", bpinit, G,
                       K2);
    }
    emit_bf16_pack_transposed(e, bt, K2, N, N32, bpinit, bp);
  } else {
    // B (zero-padded to N32 columns) as [K/2, 2, G, 16], transposed to
    // [G, K/2, 16, 2].
    char src[24];
    snprintf(src, sizeof(src), "%s", b->ssa);
    if (N32 != N) {
      kiln_type_t zt = {.dtype = KILN_BF16, .rank = 2, .dims = {K, N32}};
      kiln_tv_t z, padded;
      kiln_emit_filled(e, &zt, 0, &z);
      // By slabs: a whole insert_slice became one vector<K x N> (a
      // [256,768]x[768,1000] mm compiled for 78 s).
      const int64_t at[2] = {0, 0};
      kiln_emit_insert_slabs(e, b, &z, at, false, &padded);
      snprintf(src, sizeof(src), "%s", padded.ssa);
    }
    char tinit[24];
    kiln_emit_fresh(e, tinit);
    kiln_sbuf_printf(o,
        "    %s = tensor.expand_shape %s [[0, 1], [2, 3]] output_shape [%lld, 2, %lld, 16] "
        ": tensor<%lldx%lldxbf16> into tensor<%lldx2x%lldx16xbf16>\n"
        "    %s = tensor.empty() : tensor<%lldx%lldx16x2xbf16>\n"
        "    %s = linalg.transpose ins(%s : tensor<%lldx2x%lldx16xbf16>) outs(%s : "
        "tensor<%lldx%lldx16x2xbf16>) permutation = [2, 0, 3, 1]\n"
        "    %s = tensor.collapse_shape %s [[0], [1], [2, 3]] : tensor<%lldx%lldx16x2xbf16> "
        "into tensor<%lldx%lldx32xbf16>\n",
        be, src, K2, G, K, N32, K2, G, tinit, G, K2, bpt, be, K2, G, tinit, G, K2, bp, bpt,
        G, K2, G, K2);
  }
  // A and packed B as memrefs for AMX's tile loads: one batch's (amty,
  // bpmty: what emit_amx_rows reads), subviews of the whole (batched).
  char am[24] = "", bpm[24] = "", amty[160], bpmty[160];
  if (amx) {
    kiln_emit_fresh(e, am);
    kiln_emit_fresh(e, bpm);
    snprintf(amty, sizeof(amty), "memref<%sx%lldxbf16, strided<[?, 1], offset: ?>>", mty, K);
    snprintf(bpmty, sizeof(bpmty), "memref<%lldx%lldx32xbf16, strided<[?, ?, 1], offset: ?>>",
             G, K2);
    if (NB)
      kiln_sbuf_printf(o,
          "    %s = bufferization.to_buffer %s read_only : %s to memref<%lldx%sx%lldxbf16, "
          "strided<[?, ?, 1], offset: ?>>\n"
          "    %s = bufferization.to_buffer %s read_only : tensor<%lldx%lldx%lldx32xbf16> to "
          "memref<%lldx%lldx%lldx32xbf16, strided<[?, ?, ?, 1], offset: ?>>\n",
          am, a->ssa, aty, NB, mty, K, bpm, bp, NB, G, K2, NB, G, K2);
    else
      kiln_sbuf_printf(o,
          "    %s = bufferization.to_buffer %s read_only : %s to %s\n"
          "    %s = bufferization.to_buffer %s read_only : tensor<%lldx%lldx32xbf16> to %s\n",
          am, a->ssa, aty, amty, bpm, bp, G, K2, bpmty);
  }
  if (ragged) {
    // From here on as a symbolic M (the types above keep the static one).
    kiln_emit_fresh(e, mrt);
    kiln_sbuf_printf(o, "    %s = arith.constant %lld : index\n", mrt, (long long)m);
    sym_m = true;
  }
  // Blocks: MB rows each, or with a symbolic M a quarter of the rows
  // rounded up to whole register tiles (at least one), computed here.
  char nblk[32], mbv[32], mbs[24];
  snprintf(mbs, sizeof(mbs), "%lld", MB);
  if (ragged) {
    // Static blocks of a quarter of the rows, whole AMX tiles where the
    // tile unit runs (in quarters rounded to 8-row tiles, 197 rows made
    // blocks of 56, 24 of them on the vector kernel: 5.2 against 0.6 ms
    // for 196 rows); the last block shorter.
    long long unit = amx ? 32 : rm, q = (m + 3) / 4;
    long long mbr = (q + unit - 1) / unit * unit;
    int id = e->next_id++;
    snprintf(mbv, sizeof(mbv), "%%bmb%d", id);
    snprintf(nblk, sizeof(nblk), "%lld", (m + mbr - 1) / mbr);
    kiln_sbuf_printf(o, "    %s = arith.constant %lld : index\n", mbv, mbr);
  } else if (sym_m) {
    int id = e->next_id++;
    snprintf(nblk, sizeof(nblk), "%%bnb%d", id);
    snprintf(mbv, sizeof(mbv), "%%bmb%d", id);
    kiln_sbuf_printf(o,
        "    %%bc4_%d = arith.constant 4 : index\n"
        "    %%bcrm_%d = arith.constant %d : index\n"
        "    %%bq_%d = arith.ceildivui %s, %%bc4_%d : index\n"
        "    %%bqt_%d = arith.ceildivui %%bq_%d, %%bcrm_%d : index\n"
        "    %%bqr_%d = arith.muli %%bqt_%d, %%bcrm_%d : index\n"
        "    %s = arith.maxui %%bqr_%d, %%bcrm_%d : index\n"
        "    %s = arith.ceildivui %s, %s : index\n",
        id, id, rm, id, mrt, id, id, id, id, id, id, id, mbv, id, id, nblk, mrt, mbv);
  } else {
    snprintf(nblk, sizeof(nblk), "%lld", MB > 0 ? (long long)(m / MB) : 1LL);
  }
  if (sym_m)
    snprintf(bty, sizeof(bty), "tensor<?x%lldx%s>", N, el);
  else
    snprintf(bty, sizeof(bty), "tensor<%lldx%lldx%s>", MB, N, el);
  // The AMX accumulators' scratch, 32x32 f32 per block, on the stack
  // outside the parallel loop (an alloca inside it is wrapped in an
  // alloca_scope, whose lowering the loops inside it do not survive).
  char scr[24] = "";
  if (amx && NB) {
    // One scratch per task (batch, block), on the heap: a batch's blocks
    // run on any thread.
    kiln_emit_fresh(e, scr);
    kiln_sbuf_printf(o, "    %s = memref.alloc() {alignment = 64 : i64} : "
                        "memref<%lldx32x32xf32>\n", scr, NB * (m / MB));
  } else if (amx) {
    kiln_emit_fresh(e, scr);
    // On the stack for the few blocks the heuristic makes (a symbolic M's
    // quarters); on the heap where tiles from a search make many (blocks
    // of 16 rows of 65536: 8 MiB of stack).
    bool heap = !sym_m && m / MB > 16;
    if (sym_m && !ragged)
      kiln_sbuf_printf(o, "    %s = memref.alloca(%s) {alignment = 64 : i64} : "
                          "memref<?x32x32xf32>\n", scr, nblk);
    else
      kiln_sbuf_printf(o, "    %s = memref.%s() {alignment = 64 : i64} : "
                          "memref<%sx32x32xf32>\n", scr, heap ? "alloc" : "alloca", nblk);
  }
  // Constants live inside the forall body so it stays isolated-friendly.
  char nbt[40] = "";
  if (NB) snprintf(nbt, sizeof(nbt), "%lld, ", NB);
  kiln_sbuf_printf(o,
      "    %s = scf.forall (%s%%blk) in (%s%s) shared_outs(%%cout = %s) -> (%s) {\n"
      "      %%c0 = arith.constant 0 : index\n"
      "      %%c1 = arith.constant 1 : index\n"
      "      %%c16 = arith.constant 16 : index\n"
      "      %%c32 = arith.constant 32 : index\n"
      "      %%crm = arith.constant %d : index\n"
      "      %%ck2 = arith.constant %lld : index\n"
      "      %%padb = arith.constant 0.0 : bf16\n"
      "      %%padf = arith.constant 0.0 : f32\n"
      "      %%zero = arith.constant dense<0.0> : vector<16xf32>\n",
      res, NB ? "%bi, " : "", nbt, nblk, init, oty, rm, K2);
  // The tiles read `aeb` (A as [M, K/2, 2]) and `bpb` (packed B), AMX's
  // tile loads `amb` and `bpmb`: the whole tensors, or this task's batch.
  char aeb[24], bpb[24], amb[24], bpmb[24], cbatch[24] = "", cone[8] = "";
  snprintf(aeb, sizeof(aeb), "%s", ae);
  snprintf(bpb, sizeof(bpb), "%s", bp);
  snprintf(amb, sizeof(amb), "%s", am);
  snprintf(bpmb, sizeof(bpmb), "%s", bpm);
  if (NB) {
    snprintf(aeb, sizeof(aeb), "%%aeb");
    snprintf(bpb, sizeof(bpb), "%%bpb");
    snprintf(cbatch, sizeof(cbatch), "%%bi, ");
    snprintf(cone, sizeof(cone), "1, ");
    kiln_sbuf_printf(o,
        "      %%aeb = tensor.extract_slice %s[%%bi, 0, 0, 0] [1, %s, %lld, 2] [1, 1, 1, 1] : "
        "%s to %s\n"
        "      %%bpb = tensor.extract_slice %s[%%bi, 0, 0, 0] [1, %lld, %lld, 32] [1, 1, 1, 1] : "
        "tensor<%lldx%lldx%lldx32xbf16> to %s\n",
        ae, msz, K2, ae_all_ty, ae_ty, bp, G, K2, NB, G, K2, bpe_ty);
    if (amx) {
      snprintf(amb, sizeof(amb), "%%amb");
      snprintf(bpmb, sizeof(bpmb), "%%bpmb");
      kiln_sbuf_printf(o,
          "      %%amb = memref.subview %s[%%bi, 0, 0] [1, %s, %lld] [1, 1, 1] : "
          "memref<%lldx%sx%lldxbf16, strided<[?, ?, 1], offset: ?>> to %s\n"
          "      %%bpmb = memref.subview %s[%%bi, 0, 0, 0] [1, %lld, %lld, 32] [1, 1, 1, 1] : "
          "memref<%lldx%lldx%lldx32xbf16, strided<[?, ?, ?, 1], offset: ?>> to %s\n",
          am, msz, K, NB, mty, K, amty, bpm, G, K2, NB, G, K2, bpmty);
    }
  }
  if (sym_m)
    kiln_sbuf_printf(o,
        "      %%row0 = arith.muli %%blk, %s : index\n"
        "      %%left = arith.subi %s, %%row0 : index\n"
        "      %%rows = arith.minui %s, %%left : index\n"
        "      %%tailn = arith.remui %%rows, %%crm : index\n"
        "      %%full = arith.subi %%rows, %%tailn : index\n"
        "      %%cblk = tensor.extract_slice %%cout[%%row0, 0] [%%rows, %lld] [1, 1] : "
        "%s to %s\n",
        mbv, mrt, mbv, N, oty, bty);
  else
    kiln_sbuf_printf(o,
        "      %%cmb = arith.constant %lld : index\n"
        "      %%full = arith.constant %lld : index\n"
        "      %%row0 = arith.muli %%blk, %%cmb : index\n"
        "      %%cblk = tensor.extract_slice %%cout[%s%%row0, 0] [%s%lld, %lld] [%s1, 1] : "
        "%s to %s\n",
        MB, MB, cbatch, cone, MB, N, cone, oty, bty);
  if (amx && sym_m)
    kiln_sbuf_puts(o, "      %fxr = arith.remui %full, %c32 : index\n"
                      "      %fx = arith.subi %full, %fxr : index\n");
  else if (amx)
    kiln_sbuf_printf(o, "      %%fx = arith.constant %lld : index\n", MB / 32 * 32);
  if (amx && NB)
    kiln_sbuf_printf(o,
        "      %%sbi = affine.apply affine_map<(d0, d1) -> (d0 * %s + d1)>(%%bi, %%blk)\n"
        "      %%scr = memref.subview %s[%%sbi, 0, 0] [1, 32, 32] [1, 1, 1] : "
        "memref<%lldx32x32xf32> to memref<32x32xf32, strided<[32, 1], offset: ?>>\n",
        nblk, scr, NB * (m / MB));
  else if (amx)
    kiln_sbuf_printf(o,
        "      %%scr = memref.subview %s[%%blk, 0, 0] [1, 32, 32] [1, 1, 1] : "
        "memref<%sx32x32xf32> to memref<32x32xf32, strided<[32, 1], offset: ?>>\n",
        scr, sym_m && !ragged ? "?" : nblk);
  // Panels of 32 columns: the full ones, then (N not a multiple of 32) the
  // last, whose writes stop at N; packed B is zero-padded to whole panels.
  long long NF = N / 32 * 32;
  const char *blk_in = "%cblk";
  for (int panel = 0; panel < 2; ++panel) {
    long long lo = panel ? NF : 0, hi = panel ? N32 : NF;
    if (lo == hi) continue;
    int cols[2];
    panel_cols(N, panel, cols);
    kiln_sbuf_printf(o,
        "      %%cl%d = arith.constant %lld : index\n"
        "      %%ch%d = arith.constant %lld : index\n"
        "      %%rp%d = scf.for %%j = %%cl%d to %%ch%d step %%c32 iter_args(%%c1t = %s) "
        "-> (%s) {\n"
        "          %%j16 = arith.addi %%j, %%c16 : index\n"
        "          %%p0 = arith.divui %%j, %%c16 : index\n"
        "          %%p1 = arith.addi %%p0, %%c1 : index\n",
        panel, lo, panel, hi, panel, panel, panel, blk_in, bty);
    char next[24];
    if (amx) emit_amx_rows(o, bty, el, store_bf16, cols, amb, amty, bpmb, bpmty, next);
    kiln_sbuf_printf(o,
        "        %%r2 = scf.for %%i = %s to %%full step %%crm iter_args(%%c2t = %s) "
        "-> (%s) {\n",
        amx ? "%fx" : "%c0", amx ? "%rx" : "%c1t", bty);
    emit_bf16_tile(o, rm, "", "%c2t", bty, el, store_bf16, false, cols, aeb, ae_ty, bpb, K2,
                   N32, next);
    kiln_sbuf_printf(o, "          scf.yield %s : %s\n        }\n", next, bty);
    const char *done = "%r2";
    if (sym_m) {
      // The block's last rows % rm rows: one masked register tile at %full
      // (a one-row tile per row ran two accumulator chains, latency-bound).
      kiln_sbuf_printf(o,
          "        %%hastail = arith.cmpi ugt, %%tailn, %%c0 : index\n"
          "        %%r3 = scf.if %%hastail -> (%s) {\n"
          "          %%it = arith.addi %%full, %%c0 : index\n",
          bty);
      emit_bf16_tile(o, rm, "t", "%r2", bty, el, store_bf16, true, cols, aeb, ae_ty, bpb, K2,
                     N32, next);
      kiln_sbuf_printf(o, "          scf.yield %s : %s\n        } else {\n"
                          "          scf.yield %%r2 : %s\n        }\n", next, bty, bty);
      done = "%r3";
    }
    kiln_sbuf_printf(o, "        scf.yield %s : %s\n      }\n", done, bty);
    blk_in = panel ? "%rp1" : "%rp0";
  }
  kiln_sbuf_printf(o,
      "      scf.forall.in_parallel {\n"
      "        tensor.parallel_insert_slice %s into %%cout[%s%%row0, 0] [%s%s, %lld] "
      "[%s1, 1] : %s into %s\n"
      "      }\n"
      "    }\n",
      blk_in, cbatch, cone, sym_m ? "%rows" : mbs, N, cone, bty, oty);
  snprintf(out, 24, "%s", res);
}

// The f32 microkernel (AVX-512): C[m, n] = sum_k A[m, k] B[k, n] with f32
// FMAs, B's whole 32-column panels packed once per call into Bp[n/32, k,
// 32], so a register tile's two 16-lane loads of a k are one 128-byte run
// and consecutive k follow each other. Read in place (the tiled
// linalg.matmul), rows of B 4 KiB apart (N = 1024) put every k of a
// register tile's loads in one L1 set, and no tiling changed that: on a
// Xeon (AVX-512, 2 cores) 1024^3 took 7.2-7.5 ms, 60% of the FMA peak
// against MKL's 80%; here 6.2-6.7 ms (kiln-run, same machine), [256, 2048]
// x [2048, 1000] 4.8 -> 3.3 ms, the bench's MLP block 1.33 -> 1.07 ms.
//
// Threads take blocks of rows x groups of panels (scf.forall; see
// emit_f32_dot). In a block, K runs in blocks of `kc`, and per K block and
// panel each register tile of `rm` rows x 32 columns keeps its 2 x rm
// accumulators in registers over the K block: per k two loads of Bp, rm
// broadcasts of A and 2 x rm FMAs. The sizes are tiles lib/autotune gives
// (KILN_KERNEL_F32_DOT: its heuristic, 8-row tiles, K blocks of about 256
// so that one panel of Bp, kc x 128 bytes, stays in L1 while the block's
// rows go by, blocks of up to 256 rows; under max-autotune a measured
// search, f32_dot_tiles). The first K block starts from zeros or an
// addmm's [N] bias (alpha = beta = 1; other addmms add theirs after),
// later ones from C. The block's last rows % rm rows run as one masked
// tile. N not a multiple of 32: the last panel reads its columns masked,
// from B in place (from a [K, N % 32] transpose of W's last rows when B =
// W^T). A transposed lhs (a weight gradient) is packed into [M/rm, K, rm]
// (a tile's A one contiguous run) or read in place. A plain A is read in
// place, or, where the tiles ask for it (cache[0]; the heuristic does
// where A's rows are a multiple of 4 KiB apart, whose eight rows of a
// tile then share one L1 set), each task packs its [rows, kc] slice of A
// per K block into [rows/rm, kc, rm] before its panels read it (a_local:
// single-threaded 1024^3 16.5 -> 15.4 ms in kiln-run, on two threads
// within the noise; a pass packing all of A ahead of the kernel was not
// faster). (Tried and not kept as defaults: K unrolled by 2 or 4 in the
// tile, 12- and 14-row tiles, kc of 128 or 512: all within the noise of
// the above; 16-row tiles spill.)
typedef struct f32_dot {
  int rm;                    // register tile rows
  long long K, N, N32, kc;   // sizes; kc: the K block
  const char *a, *aty;       // A [M, K], or its source X [K, M] (a_t: A = X^T),
  bool a_t, a_packed;        // or A packed [M/rm, K, rm] (a_packed)
  char ap[24];
  const char *bp, *bpty;     // packed B [N/32, K, 32] (whole panels)
  const char *bty;           // the block tensor's type
  const char *bias;          // addmm's [N] bias (NULL: zeros)
  // The last panel (N not a multiple of 32) reads B's last columns in
  // place, masked: `tail` ([K, N] B, or [K, N % 32] of W^T) from column
  // `tail_col0` (%j, or %c0).
  const char *tail, *tailty, *tail_col0;
  // An elementwise op applied to the last K block's accumulators as they
  // are stored (kiln_emit_lanes_op), or NULL.
  const kiln_node_t *epi;
  kiln_emitter_t *e;
  // Inline packing (plain B, at most two row blocks; W, one row block):
  // each task packs its group's panels of the current K block from B (`b`,
  // typed `b_ty`), or from W's rows where B = W^T (`pack_from_w`: `b`
  // names W), into a [PG, kc, 32] tensor (`bp` / `bpty` then name it) just
  // before the tiles read it, instead of one pass over all of B ahead of
  // the kernel.
  bool inline_pack, pack_from_w;
  const char *b, *b_ty;
  long long PG;
  // A packed inside the kernel (plain A; M a multiple of the row block,
  // the block of rm, K of kc): per K block each task transposes its rows'
  // [mb, kc] slice of A into [mb/rm, kc, rm] (`a`, `aty` then name it)
  // before its tiles read it, so a tile's A is one contiguous run.
  bool a_local;
  long long mb;
} f32_dot_t;

// One register tile of the K block [kb, ke) (index values): rows %i<tag>
// .. + rm - 1 of the block at %row0, columns %j .. %j + 31 (%jl in the
// block), starting from C (`from_c`) or from zeros / the bias.
static void emit_f32_tile(kiln_sbuf_t *o, const f32_dot_t *d, const char *tag,
                          const char *cur, bool masked, bool from_c, bool last,
                          const int cols[2], const char *kb, const char *ke, char next[24]) {
  int rm = d->rm;
  emit_tile_rows(o, rm, tag, masked);
  bool partial = cols[0] < 16 || cols[1] < 16;
  for (int r = 0; from_c && r < rm; ++r) {
    // Rows past a masked tile's end read its last row (not written back).
    if (masked)
      kiln_sbuf_printf(o, "          %%lc%s%d = affine.min affine_map<(d0)[s0] -> "
                          "(d0 + %d, d0 + s0 - 1)>(%%i%s)[%%tailn]\n", tag, r, r, tag);
    else
      kiln_sbuf_printf(o, "          %%lc%s%d = affine.apply affine_map<(d0) -> "
                          "(d0 + %d)>(%%i%s)\n", tag, r, r, tag);
    for (int h = 0; h < 2; ++h)
      if (cols[h])
        kiln_sbuf_printf(o, "          %%ci%s%d = vector.transfer_read %s[%%lc%s%d, %s], "
                            "%%padf {in_bounds = [%s]} : %s, vector<16xf32>\n",
                         tag, 2 * r + h, cur, tag, r, h ? "%jl16" : "%jl",
                         cols[h] == 16 ? "true" : "false", d->bty);
  }
  if (d->a_local)
    kiln_sbuf_printf(o, "          %%at%s = affine.apply affine_map<(d0) -> "
                        "(d0 floordiv %d)>(%%i%s)\n", tag, rm, tag);
  else if (d->a_packed)
    kiln_sbuf_printf(o, "          %%at%s = affine.apply affine_map<(d0, d1) -> "
                        "((d0 + d1) floordiv %d)>(%%row0, %%i%s)\n", tag, rm, tag);
  kiln_sbuf_printf(o, "          %%acc%s:%d = scf.for %%kk%s = %s to %s step %%c1 "
                      "iter_args(", tag, 2 * rm, tag, kb, ke);
  for (int t = 0; t < 2 * rm; ++t) {
    int h = t % 2;
    if (from_c && cols[h])
      kiln_sbuf_printf(o, "%s%%x%s%d = %%ci%s%d", t ? ", " : "", tag, t, tag, t);
    else
      kiln_sbuf_printf(o, "%s%%x%s%d = %s", t ? ", " : "", tag, t,
                       d->bias && !from_c ? (h ? "%bv1" : "%bv0") : "%zero");
  }
  kiln_sbuf_puts(o, ") -> (");
  for (int t = 0; t < 2 * rm; ++t) kiln_sbuf_printf(o, "%svector<16xf32>", t ? ", " : "");
  kiln_sbuf_puts(o, ") {\n");
  for (int h = 0; h < 2; ++h) {
    if (!partial && d->inline_pack) {
      if (h == 0)
        kiln_sbuf_printf(o, "            %%kl%s = arith.subi %%kk%s, %s : index\n", tag, tag, kb);
      kiln_sbuf_printf(o,
          "            %%b%s%d = vector.transfer_read %s[%%pl, %%kl%s, %s], %%padf "
          "{in_bounds = [true]} : %s, vector<16xf32>\n",
          tag, h, d->bp, tag, h ? "%c16" : "%c0", d->bpty);
    } else if (!partial) {
      kiln_sbuf_printf(o,
          "            %%b%s%d = vector.transfer_read %s[%%p0, %%kk%s, %s], %%padf "
          "{in_bounds = [true]} : %s, vector<16xf32>\n",
          tag, h, d->bp, tag, h ? "%c16" : "%c0", d->bpty);
    } else if (cols[h]) {
      // Masked: lanes past N read zeros.
      const char *col = h == 0 ? d->tail_col0 : strcmp(d->tail_col0, "%j") ? "%c16" : "%j16";
      kiln_sbuf_printf(o,
          "            %%b%s%d = vector.transfer_read %s[%%kk%s, %s], %%padf "
          "{in_bounds = [false]} : %s, vector<16xf32>\n",
          tag, h, d->tail, tag, col, d->tailty);
    } else {
      kiln_sbuf_printf(o, "            %%b%s%d = arith.constant dense<0.0> : vector<16xf32>\n",
                       tag, h);
    }
  }
  if (d->a_local)
    kiln_sbuf_printf(o, "            %%kal%s = arith.subi %%kk%s, %s : index\n", tag, tag, kb);
  for (int r = 0; r < rm; ++r) {
    // A^T read in place: X[k, m .. m + 7], one run of a row of X per k.
    if (d->a_local)
      kiln_sbuf_printf(o, "            %%as%s%d = tensor.extract %s[%%at%s, %%kal%s, %%far%d] : "
                          "%s\n", tag, r, d->a, tag, tag, r, d->aty);
    else if (d->a_packed)
      kiln_sbuf_printf(o, "            %%as%s%d = tensor.extract %s[%%at%s, %%kk%s, %%far%d] : "
                          "%s\n", tag, r, d->a, tag, tag, r, d->aty);
    else if (d->a_t)
      kiln_sbuf_printf(o, "            %%as%s%d = tensor.extract %s[%%kk%s, %%gr%s%d] : %s\n",
                       tag, r, d->a, tag, tag, r, d->aty);
    else
      kiln_sbuf_printf(o, "            %%as%s%d = tensor.extract %s[%%gr%s%d, %%kk%s] : %s\n",
                       tag, r, d->a, tag, r, tag, d->aty);
    kiln_sbuf_printf(o, "            %%a%s%d = vector.broadcast %%as%s%d : f32 to vector<16xf32>\n",
                     tag, r, tag, r);
    for (int h = 0; h < 2; ++h)
      kiln_sbuf_printf(o, "            %%y%s%d = vector.fma %%a%s%d, %%b%s%d, %%x%s%d : "
                          "vector<16xf32>\n", tag, 2 * r + h, tag, r, tag, h, tag, 2 * r + h);
  }
  kiln_sbuf_puts(o, "            scf.yield ");
  for (int t = 0; t < 2 * rm; ++t) kiln_sbuf_printf(o, "%s%%y%s%d", t ? ", " : "", tag, t);
  kiln_sbuf_puts(o, " : ");
  for (int t = 0; t < 2 * rm; ++t) kiln_sbuf_printf(o, "%svector<16xf32>", t ? ", " : "");
  kiln_sbuf_puts(o, "\n          }\n");
  static const char *const jc[2] = {"%jl", "%jl16"};
  // The epilogue, on each accumulator in registers.
  char ev[32][24];
  bool epi = last && d->epi;
  for (int t = 0; epi && t < 2 * rm; ++t) {
    char acc[24];
    snprintf(acc, sizeof(acc), "%%acc%s#%d", tag, t);
    kiln_emit_lanes_op(d->e, o, d->epi->op, d->epi, acc, ev[t]);
  }
  emit_tile_store(o, rm, tag, cur, d->bty, "f32", false, masked, cols, jc, epi ? ev : NULL,
                  next);
}

// One K block, [kb, ke), over every panel of the row block `in`: the full
// panels, then (N not a multiple of 32) the last, whose columns past N are
// neither read nor written. Results are named %<res>_<panel>; `out` gets
// the last. The last K block (`last`) applies the epilogue as it stores.
static void emit_f32_kblock(kiln_sbuf_t *o, const f32_dot_t *dd, const char *in,
                            bool from_c, bool last, const char *kb, const char *ke,
                            const char *res, char out[24]) {
  long long NF = dd->N / 32 * 32;
  char cur[24];
  snprintf(cur, sizeof(cur), "%s", in);
  f32_dot_t dk = *dd;
  const f32_dot_t *d = &dk;
  char lp[32], lpty[96];
  if (dd->inline_pack && NF) {
    // Either pack below writes the same [PG, kc, 32] tensor, which the
    // tiles then read instead of a whole packed B.
    snprintf(lp, sizeof(lp), "%%lp_%s", res);
    snprintf(lpty, sizeof(lpty), "tensor<%lldx%lldx32xf32>", dd->PG, dd->kc);
    dk.bp = lp;
    dk.bpty = lpty;
  }
  if (dd->inline_pack && dd->pack_from_w && NF) {
    // B = W^T: this K block of the group's panels is W's rows %wr0 ..
    // %fhi (PG * 32 rows ending at the group's last whole panel), columns
    // kb .. kb + kc, viewed as [PG, 32, kc] and transposed into [PG, kc,
    // 32] (the vectorizer's 8 x 8 shuffles). %wr0 is %col0 but in a last
    // group of fewer panels, which packs some of the group before it too;
    // the tiles read panel %pl = (%j - %wr0) / 32.
    kiln_sbuf_printf(o,
        "      %%lpx_%s = tensor.extract_slice %s[%%wr0, %s] [%lld, %lld] [1, 1] : %s to "
        "tensor<%lldx%lldxf32>\n"
        "      %%lpv_%s = tensor.expand_shape %%lpx_%s [[0, 1], [2]] output_shape "
        "[%lld, 32, %lld] : tensor<%lldx%lldxf32> into tensor<%lldx32x%lldxf32>\n"
        "      %%lpe_%s = tensor.empty() : %s\n"
        "      %s = linalg.transpose ins(%%lpv_%s : tensor<%lldx32x%lldxf32>) "
        "outs(%%lpe_%s : %s) permutation = [0, 2, 1]\n",
        res, dd->b, kb, dd->PG * 32, dd->kc, dd->b_ty, dd->PG * 32, dd->kc,
        res, res, dd->PG, dd->kc, dd->PG * 32, dd->kc, dd->PG, dd->kc,
        res, lpty, lp, res, dd->PG, dd->kc, res, lpty);
  } else if (dd->inline_pack && NF) {
    // This K block of the group's whole panels: rows kb .. ke of B's
    // columns %col0 .. %fhi, two 64-byte runs per row and panel.
    kiln_sbuf_printf(o,
        "      %%lpe_%s = tensor.empty() : %s\n"
        "      %%lpn_%s = arith.subi %%fhi, %%col0 : index\n"
        "      %%lpp_%s = arith.divui %%lpn_%s, %%c32 : index\n"
        "      %s = scf.for %%pp = %%c0 to %%lpp_%s step %%c1 iter_args(%%lb = %%lpe_%s) -> (%s) {\n"
        "        %%pj = affine.apply affine_map<(d0)[s0] -> (s0 + d0 * 32)>(%%pp)[%%col0]\n"
        "        %%pj16 = arith.addi %%pj, %%c16 : index\n",
        res, lpty, res, res, res, lp, res, res, lpty);
    kiln_sbuf_printf(o,
        "        %%lk = scf.for %%kq = %s to %s step %%c1 iter_args(%%lb2 = %%lb) -> (%s) {\n"
        "          %%kq0 = arith.subi %%kq, %s : index\n"
        "          %%pv0 = vector.transfer_read %s[%%kq, %%pj], %%padf {in_bounds = [true]} : "
        "%s, vector<16xf32>\n"
        "          %%pv1 = vector.transfer_read %s[%%kq, %%pj16], %%padf {in_bounds = [true]} : "
        "%s, vector<16xf32>\n"
        "          %%pw0 = vector.transfer_write %%pv0, %%lb2[%%pp, %%kq0, %%c0] "
        "{in_bounds = [true]} : vector<16xf32>, %s\n"
        "          %%pw1 = vector.transfer_write %%pv1, %%pw0[%%pp, %%kq0, %%c16] "
        "{in_bounds = [true]} : vector<16xf32>, %s\n"
        "          scf.yield %%pw1 : %s\n"
        "        }\n"
        "        scf.yield %%lk : %s\n"
        "      }\n",
        kb, ke, lpty, kb, dd->b, dd->b_ty, dd->b, dd->b_ty, lpty, lpty, lpty, lpty);
  }
  char la[32], laty[96];
  if (dd->a_local) {
    long long mt = dd->mb / dd->rm;
    snprintf(la, sizeof(la), "%%la_%s", res);
    snprintf(laty, sizeof(laty), "tensor<%lldx%lldx%dxf32>", mt, dd->kc, dd->rm);
    kiln_sbuf_printf(o,
        "      %%lax_%s = tensor.extract_slice %s[%%row0, %s] [%lld, %lld] [1, 1] : %s to "
        "tensor<%lldx%lldxf32>\n"
        "      %%lae_%s = tensor.expand_shape %%lax_%s [[0, 1], [2]] output_shape "
        "[%lld, %d, %lld] : tensor<%lldx%lldxf32> into tensor<%lldx%dx%lldxf32>\n"
        "      %%lai_%s = tensor.empty() : %s\n"
        "      %s = linalg.transpose ins(%%lae_%s : tensor<%lldx%dx%lldxf32>) "
        "outs(%%lai_%s : %s) permutation = [0, 2, 1]\n",
        res, dd->a, kb, dd->mb, dd->kc, dd->aty, dd->mb, dd->kc,
        res, res, mt, dd->rm, dd->kc, dd->mb, dd->kc, mt, dd->rm, dd->kc,
        res, laty, la, res, mt, dd->rm, dd->kc, res, laty);
    dk.a = la;
    dk.aty = laty;
  }
  for (int panel = 0; panel < 2; ++panel) {
    long long lo = panel ? NF : 0, hi = panel ? d->N32 : NF;
    if (lo == hi) continue;
    int cols[2];
    panel_cols(d->N, panel, cols);
    kiln_sbuf_printf(o,
        "      %%%s_%d = scf.for %%j = %s to %s step %%c32 iter_args(%%c1t = %s) "
        "-> (%s) {\n"
        "          %%j16 = arith.addi %%j, %%c16 : index\n"
        "          %%jl = arith.subi %%j, %%col0 : index\n"
        "          %%jl16 = arith.addi %%jl, %%c16 : index\n"
        "          %%p0 = arith.divui %%j, %%c32 : index\n"
        "          %%jw = arith.subi %%j, %s : index\n"
        "          %%pl = arith.divui %%jw, %%c32 : index\n",
        res, panel, panel ? "%cnf" : "%col0", panel ? "%phi" : "%fhi", cur, d->bty,
        d->pack_from_w ? "%wr0" : "%col0");
    if (d->bias && !from_c)
      for (int h = 0; h < 2; ++h) {
        if (!cols[h]) {
          kiln_sbuf_printf(o, "          %%bv%d = arith.constant dense<0.0> : "
                              "vector<16xf32>\n", h);
          continue;
        }
        kiln_sbuf_printf(o, "          %%bv%d = vector.transfer_read %s[%s], %%padf "
                            "{in_bounds = [%s]} : tensor<%lldxf32>, vector<16xf32>\n",
                         h, d->bias, h ? "%j16" : "%j", cols[h] == 16 ? "true" : "false",
                         d->N);
      }
    char next[24];
    kiln_sbuf_printf(o,
        "        %%r2 = scf.for %%i = %%c0 to %%full step %%crm iter_args(%%c2t = %%c1t) "
        "-> (%s) {\n", d->bty);
    emit_f32_tile(o, d, "", "%c2t", false, from_c, last, cols, kb, ke, next);
    kiln_sbuf_printf(o, "          scf.yield %s : %s\n        }\n"
                        "        %%hastail = arith.cmpi ugt, %%tailn, %%c0 : index\n"
                        "        %%r3 = scf.if %%hastail -> (%s) {\n"
                        "          %%it = arith.addi %%full, %%c0 : index\n",
                     next, d->bty, d->bty);
    emit_f32_tile(o, d, "t", "%r2", true, from_c, last, cols, kb, ke, next);
    kiln_sbuf_printf(o, "          scf.yield %s : %s\n        } else {\n"
                        "          scf.yield %%r2 : %s\n        }\n"
                        "        scf.yield %%r3 : %s\n      }\n",
                     next, d->bty, d->bty, d->bty);
    snprintf(cur, sizeof(cur), "%%%s_%d", res, panel);
  }
  snprintf(out, 24, "%s", cur);
}

// Packs the whole panels of B ([K, N]), or of W ([N, K]) where B = W^T,
// into Bp [NF/32, K, 32] (`bp`; NF = N rounded down to 32, at least 32):
// one linalg.transpose of B's first NF columns viewed as [K, NF/32, 32]
// (of W's first NF rows as [NF/32, 32, K]).
static void emit_f32_pack(kiln_emitter_t *e, const kiln_tv_t *src, bool from_w,
                          long long K, long long NF, int pw, char bp[24]) {
  kiln_sbuf_t *o = &e->out;
  long long PF = NF / pw;
  char sty[96], sl[24], x[24], init[24];
  kiln_mlir_tensor_type(&src->type, sty, sizeof(sty));
  kiln_emit_fresh(e, sl);
  kiln_emit_fresh(e, x);
  kiln_emit_fresh(e, init);
  kiln_emit_fresh(e, bp);
  // The two forms differ in the slice's shape, which dim splits into
  // panels, and the permutation that brings (panel, k, lane) out.
  long long rows = from_w ? NF : K, cols = from_w ? K : NF;
  char shape[64], xty[96], pty[96];
  if (from_w) {
    snprintf(shape, sizeof(shape), "%lld, %d, %lld", PF, pw, K);
    snprintf(xty, sizeof(xty), "tensor<%lldx%dx%lldxf32>", PF, pw, K);
  } else {
    snprintf(shape, sizeof(shape), "%lld, %lld, %d", K, PF, pw);
    snprintf(xty, sizeof(xty), "tensor<%lldx%lldx%dxf32>", K, PF, pw);
  }
  snprintf(pty, sizeof(pty), "tensor<%lldx%lldx%dxf32>", PF, K, pw);
  kiln_sbuf_printf(o,
      "    %s = tensor.extract_slice %s[0, 0] [%lld, %lld] [1, 1] : %s to "
      "tensor<%lldx%lldxf32>\n"
      "    %s = tensor.expand_shape %s %s output_shape [%s] : tensor<%lldx%lldxf32> into %s\n"
      "    %s = tensor.empty() : %s\n"
      "    %s = linalg.transpose ins(%s : %s) outs(%s : %s) permutation = %s\n",
      sl, src->ssa, rows, cols, sty, rows, cols, x, sl,
      from_w ? "[[0, 1], [2]]" : "[[0], [1, 2]]", shape, rows, cols, xty, init, pty, bp,
      x, xty, init, pty, from_w ? "[0, 2, 1]" : "[1, 0, 2]");
}

// The microkernel's tiles for C[M, N] = A[M, K] @ B (lib/autotune's
// KILN_KERNEL_F32_DOT, microkernel_tiles). The kernel's identity for the
// tuning database is its sizes and form (A transposed, B from a weight,
// bias, epilogue op).
static void f32_dot_tiles(const kiln_emitter_t *e, const kiln_tv_t *a, long long N,
                          long long K, bool a_t, bool from_w, bool bias,
                          const kiln_node_t *epi, kiln_tile_config_t *out) {
  kiln_kernel_desc_t kd;
  bool sym_m = KILN_IS_SYM(a->type.dims[0]);
  gemm_desc(KILN_KERNEL_F32_DOT, a->type.dims[0], N, K, 4, &kd);
  kd.fixed_rows = a_t;
  char id[192];
  snprintf(id, sizeof(id), "f32_dot m=%lld n=%lld k=%lld a_t=%d w=%d bias=%d epi=%s/%s",
           sym_m ? -1LL : (long long)a->type.dims[0], N, K, a_t, from_w, bias,
           epi ? kiln_op_name(epi->op) : "-",
           epi ? kiln_node_attr_str(epi, "approximate", "-") : "-");
  microkernel_tiles(e, id, &kd, out);
}

// C (`init`, typed `oty`, every element written) = epi(A @ B (+ bias)), A the
// value `a_value` ([M, K], M static or symbolic) or, where `xt` is given,
// A = xt^T read in place (xt [K, M]: grad_W = dY^T @ X); B [K, N] static,
// or given as its source W (`w`, B = W^T); `bias` an [N] tensor or NULL;
// `epi` a unary elementwise node (kiln_lanes_op_supported) or NULL.
static void emit_f32_dot(kiln_emitter_t *e, int a_value, const kiln_tv_t *xt,
                         const kiln_tv_t *b, const kiln_tv_t *w, const kiln_tv_t *bias,
                         const kiln_node_t *epi, const char *init, const char *oty,
                         char out[24]) {
  const kiln_tv_t *a = &e->values[a_value];
  kiln_sbuf_t *o = &e->out;
  long long K = a->type.dims[1], N = b->type.dims[1], N32 = (N + 31) / 32 * 32;
  bool sym_m = KILN_IS_SYM(a->type.dims[0]);
  kiln_tile_config_t tc;
  f32_dot_tiles(e, a, N, K, xt != NULL, w != NULL, bias != NULL, epi, &tc);
  f32_dot_t d = {.rm = (int)tc.reg[0], .K = K, .N = N, .N32 = N32,
                 .a = xt ? xt->ssa : a->ssa, .a_t = xt != NULL, .bias = NULL, .epi = epi,
                 .e = e};
  // K blocks (a 32 KiB panel of Bp for the heuristic's 256), equal but
  // for the last.
  d.kc = tc.cache[2] ? tc.cache[2] : K;
  char bp[24] = "", aty[96], bpty[96], bty[96], msz[24], res[24], tail[24], tailty[96];
  long long NF = N / 32 * 32, W = N - NF;
  // A plain B is packed inside the kernel where at most two row blocks
  // read it (M <= 512): each task packs the K block of its panels that it
  // is about to read, which stays in its cache; the pass over all of B
  // ahead of the kernel wrote the packed panels out and read them back
  // (kiln-run: 512^3 0.88-0.92 -> 0.84-0.87 ms, [256,2048]x[2048,1000]
  // 3.54-3.62 -> 3.32-3.50; 1024^3, four row blocks packing B four times,
  // the same either way). A linear's W^T is packed inside the kernel too
  // where one row block reads it (each task transposes its panels' rows
  // of W per K block, emit_f32_kblock): the bench's MLP block (256 rows,
  // 256 -> 1024 -> 256) 0.93-0.99 -> 0.87-0.93 ms in kiln-run, alternated
  // over six runs; its first parallel region, layer norm and the two
  // packs, went from 0.10 to 0.015 ms and the GEMMs took 0.02-0.04 ms
  // each of it back. With two row blocks both would transpose every
  // panel (the transformer layer's 512-row linears: no gain), so those
  // keep the pass.
  d.inline_pack = NF && !KILN_IS_SYM(a->type.dims[0]) && a->type.dims[0] <= 512;
  if (w && d.inline_pack) {
    // (The pack's slice, one static shape, needs PG whole panels in every
    // group and K blocks of one size: a shorter last one would read past
    // W's rows.)
    long long pg = tc.forall[1] ? tc.forall[1] / 32 : NF / 32;
    if (pg < 1 || pg * 32 > NF || K % d.kc) d.inline_pack = false;
    if (tc.forall[0] && tc.forall[0] < a->type.dims[0]) d.inline_pack = false;
  }
  d.pack_from_w = d.inline_pack && w;
  if (NF && !d.inline_pack) emit_f32_pack(e, w ? w : b, w != NULL, K, NF, 32, bp);
  d.bp = bp;
  if (W && w) {
    // The last panel's columns as [K, W]: W's last rows, transposed.
    char sl[24], ti[24];
    kiln_emit_fresh(e, sl);
    kiln_emit_fresh(e, ti);
    kiln_emit_fresh(e, tail);
    char wty[96];
    kiln_mlir_tensor_type(&w->type, wty, sizeof(wty));
    kiln_sbuf_printf(o,
        "    %s = tensor.extract_slice %s[%lld, 0] [%lld, %lld] [1, 1] : %s to "
        "tensor<%lldx%lldxf32>\n"
        "    %s = tensor.empty() : tensor<%lldx%lldxf32>\n"
        "    %s = linalg.transpose ins(%s : tensor<%lldx%lldxf32>) outs(%s : "
        "tensor<%lldx%lldxf32>) permutation = [1, 0]\n",
        sl, w->ssa, NF, W, K, wty, W, K, ti, K, W, tail, sl, W, K, ti, K, W);
    snprintf(tailty, sizeof(tailty), "tensor<%lldx%lldxf32>", K, W);
    d.tail_col0 = "%c0";
  } else if (W) {
    snprintf(tail, sizeof(tail), "%s", b->ssa);
    kiln_mlir_tensor_type(&b->type, tailty, sizeof(tailty));
    d.tail_col0 = "%j";
  }
  d.tail = tail;
  d.tailty = tailty;
  kiln_emit_size_operand(e, &a->type, 0, msz);
  if (xt && !sym_m && a->type.dims[0] % d.rm == 0) {
    // A^T packed into [M/rm, K, rm]: a tile's A is one contiguous run.
    emit_f32_pack(e, xt, false, K, a->type.dims[0], d.rm, d.ap);
    d.a = d.ap;
    d.a_packed = true;
    snprintf(aty, sizeof(aty), "tensor<%lldx%lldx%dxf32>", (long long)a->type.dims[0] / d.rm, K, d.rm);
  } else if (xt)
    kiln_mlir_tensor_type(&xt->type, aty, sizeof(aty));
  else
    snprintf(aty, sizeof(aty), "tensor<%sx%lldxf32>", sym_m ? "?" : msz, K);
  snprintf(bpty, sizeof(bpty), "tensor<%lldx%lldx32xf32>", NF / 32, K);
  snprintf(bty, sizeof(bty), "tensor<?x?xf32>");
  d.aty = aty;
  d.bpty = bpty;
  d.bty = bty;
  if (bias) d.bias = bias->ssa;
  // Threads get blocks of rows x groups of panels (the tiles' forall[0]
  // and forall[1]; heuristic_f32_dot in lib/autotune says why the sizes):
  // whole register tiles, the last block shorter; a symbolic M is cut in
  // quarters. Groups take whole panels, none is empty, and the last also
  // has the partial panel.
  long long PF = NF / 32, nbm = 4, NG = 1;
  long long PG = PF ? (tc.forall[1] ? tc.forall[1] / 32 : PF) : 0;
  char b_ty[96];
  kiln_mlir_tensor_type(&b->type, b_ty, sizeof(b_ty));
  d.b = b->ssa;
  d.b_ty = b_ty;
  if (w) {
    kiln_mlir_tensor_type(&w->type, b_ty, sizeof(b_ty));
    d.b = w->ssa;
  }
  d.PG = PG;
  if (PG) NG = (PF + PG - 1) / PG;
  if (NG < 1) NG = 1;
  int id = e->next_id++;
  char mv[32];
  if (sym_m) {
    snprintf(mv, sizeof(mv), "%s", msz);
    kiln_sbuf_printf(o,
        "    %%fc4_%d = arith.constant %lld : index\n"
        "    %%fcrm_%d = arith.constant %d : index\n"
        "    %%fq_%d = arith.ceildivui %s, %%fc4_%d : index\n"
        "    %%fqt_%d = arith.ceildivui %%fq_%d, %%fcrm_%d : index\n"
        "    %%fqr_%d = arith.muli %%fqt_%d, %%fcrm_%d : index\n"
        "    %%fmb_%d = arith.maxui %%fqr_%d, %%fcrm_%d : index\n"
        "    %%fnb_%d = arith.ceildivui %s, %%fmb_%d : index\n",
        id, nbm, id, d.rm, id, mv, id, id, id, id, id, id, id, id, id, id, id, mv, id);
  } else {
    // Static rows: the block size and count as constants.
    long long M = a->type.dims[0];
    long long mb = tc.forall[0] ? tc.forall[0] : (M + d.rm - 1) / d.rm * d.rm;
    if (mb < d.rm) mb = d.rm;
    snprintf(mv, sizeof(mv), "%%fm_%d", id);
    // (lib/autotune only asks for it where these hold.)
    d.a_local = tc.cache[0] == mb && !xt && M % mb == 0 && mb % d.rm == 0 && K % d.kc == 0;
    d.mb = mb;
    kiln_sbuf_printf(o,
        "    %%fm_%d = arith.constant %s : index\n"
        "    %%fmb_%d = arith.constant %lld : index\n"
        "    %%fnb_%d = arith.constant %lld : index\n",
        id, msz, id, mb, id, (M + mb - 1) / mb);
  }
  kiln_emit_fresh(e, res);
  long long kc0 = d.kc < K ? d.kc : K;
  kiln_sbuf_printf(o,
      "    %s = scf.forall (%%blk, %%grp) in (%%fnb_%d, %lld) shared_outs(%%cout = %s) -> "
      "(%s) {\n"
      "      %%c0 = arith.constant 0 : index\n"
      "      %%c1 = arith.constant 1 : index\n"
      "      %%c16 = arith.constant 16 : index\n"
      "      %%c32 = arith.constant 32 : index\n"
      "      %%crm = arith.constant %d : index\n"
      "      %%padf = arith.constant 0.0 : f32\n"
      "      %%zero = arith.constant dense<0.0> : vector<16xf32>\n"
      "      %%row0 = arith.muli %%blk, %%fmb_%d : index\n"
      "      %%left = arith.subi %s, %%row0 : index\n"
      "      %%rows = arith.minui %%fmb_%d, %%left : index\n"
      "      %%tailn = arith.remui %%rows, %%crm : index\n"
      "      %%full = arith.subi %%rows, %%tailn : index\n"
      // Columns: this group's panels from %col0 to %fhi; the last group's
      // partial panel from %cnf to %phi (an empty range elsewhere); its
      // columns end at %gend.
      "      %%cnf = arith.constant %lld : index\n"
      "      %%cn = arith.constant %lld : index\n"
      "      %%cn32 = arith.constant %lld : index\n"
      "      %%cgl = arith.constant %lld : index\n"
      "      %%col0 = affine.apply affine_map<(d0) -> (d0 * %lld)>(%%grp)\n"
      "      %%last = arith.cmpi eq, %%grp, %%cgl : index\n"
      "      %%fhi0 = affine.apply affine_map<(d0) -> (d0 * %lld + %lld)>(%%grp)\n"
      "      %%fhi = arith.minui %%fhi0, %%cnf : index\n"
      "      %%phi = arith.select %%last, %%cn32, %%cnf : index\n"
      "      %%gend = arith.select %%last, %%cn, %%fhi : index\n"
      "      %%cw = arith.subi %%gend, %%col0 : index\n"
      "      %%cblk = tensor.extract_slice %%cout[%%row0, %%col0] [%%rows, %%cw] [1, 1] : "
      "%s to %s\n"
      "      %%kb0 = arith.constant 0 : index\n"
      "      %%ke0 = arith.constant %lld : index\n",
      res, id, NG, init, oty, d.rm, id, mv, id, NF, N, N32, NG - 1, PG * 32,
      PG * 32, PG * 32, oty, bty, kc0);
  if (d.pack_from_w)
    kiln_sbuf_printf(o, "      %%wr0 = affine.apply affine_map<(d0) -> (d0 - %lld)>(%%fhi)\n",
                     PG * 32);
  for (int r = 0; (d.a_packed || d.a_local) && r < d.rm; ++r)
    kiln_sbuf_printf(o, "      %%far%d = arith.constant %d : index\n", r, r);
  char blk[24];
  emit_f32_kblock(o, &d, "%cblk", false, K <= kc0, "%kb0", "%ke0", "fk0", blk);
  // The other K blocks; with an epilogue the last one is peeled off the
  // loop, to store through it.
  long long kend = d.epi ? (K + d.kc - 1) / d.kc * d.kc - d.kc : K;
  if (K > kc0 && kend > kc0) {
    kiln_sbuf_printf(o,
        "      %%ckc = arith.constant %lld : index\n"
        "      %%ck = arith.constant %lld : index\n"
        "      %%fkl = scf.for %%kb = %%ckc to %%ck step %%ckc iter_args(%%kt = %s) -> (%s) {\n"
        "      %%ke = affine.min affine_map<(d0) -> (d0 + %lld, %lld)>(%%kb)\n",
        d.kc, kend, blk, bty, d.kc, K);
    char nb[24];
    emit_f32_kblock(o, &d, "%kt", true, false, "%kb", "%ke", "fk1", nb);
    kiln_sbuf_printf(o, "      scf.yield %s : %s\n      }\n", nb, bty);
    snprintf(blk, sizeof(blk), "%%fkl");
  }
  if (K > kc0 && d.epi) {
    kiln_sbuf_printf(o,
        "      %%kbl = arith.constant %lld : index\n"
        "      %%kel = arith.constant %lld : index\n", kend, K);
    char nb[24];
    emit_f32_kblock(o, &d, blk, true, true, "%kbl", "%kel", "fk2", nb);
    snprintf(blk, sizeof(blk), "%s", nb);
  }
  kiln_sbuf_printf(o,
      "      scf.forall.in_parallel {\n"
      "        tensor.parallel_insert_slice %s into %%cout[%%row0, %%col0] [%%rows, %%cw] "
      "[1, 1] : %s into %s\n"
      "      }\n"
      "    }\n",
      blk, bty, oty);
  snprintf(out, 24, "%s", res);
}

//===--- Small-M matmuls against a weight: dot products along K ---===//
//
// C = A @ W^T (+ bias, then a unary op) with A [M, K] and W [N, K] (a
// linear layer's weight) read in place, for few rows of A (decoding one
// token, a small batch): every other form materializes W^T or packs it, a
// pass over the whole weight per call that few rows of A cannot pay back
// (kiln-run, 1 x 4096 x 4096 f32 + GELU: the transpose took 12-15 ms of
// 15; eager 1.4). Here each output is a dot product of two contiguous
// rows: a thread takes blocks of 16 rows of W, and per K block (16 rows x
// kc, 16 KB, read again from cache for each group of rows of A) a tile of
// four rows of A by four rows of W (one row of A by all 16 where fewer
// than four are left) keeps 16 vector accumulators (f32 FMAs, or vdpbf16ps
// on bf16 pairs), reduced by a transpose-add tree into its 16 outputs,
// which go into C (added to the previous K blocks' sums; from the bias in
// the first; the unary op applied in the last). W's last block, N % 16
// rows, re-reads row N - 1 and stores masked. (4 x 4 tiles against 1 x
// 16: 24 x 4096 x 4096 f32 5.3 -> 3.6 ms, eager 5.2.)

typedef struct rowdot {
  bool bf16;               // bf16 A and W (vdpbf16ps), else f32
  int vl;                  // K elements per step: 16 f32, 32 bf16
  long long K, N;
  const char *a, *aty;     // A [M, K]
  const char *w, *wty;     // W [N, K]
  const char *bias;        // [N] f32 (first K block) or NULL
  const kiln_node_t *epi;  // unary op of the last K block or NULL
  const char *m;           // A's rows (index SSA value)
  bool m4;                 // rows four at a time (%rM4_<id>: M rounded down to 4)
  int id;
} rowdot_t;

// The sums of the lanes of 16 vectors %<pre>0 .. 15 as one vector (lane i:
// the sum of vector i): four levels of pairwise shuffles and adds, each
// halving the lanes a partial sum spans while doubling the sums a vector
// holds (15 adds, 30 two-source shuffles).
static void emit_hsum16(kiln_emitter_t *e, kiln_sbuf_t *o, char (*v)[24], char out[24]) {
  char cur[16][24];
  memcpy(cur, v, sizeof(cur));
  int n = 16;
  for (int width = 16; width > 1; width /= 2, n /= 2) {
    int groups = 16 / width, half = width / 2;
    for (int p = 0; p < n / 2; ++p) {
      char lo[24], hi[24], r[24];
      kiln_emit_fresh(e, lo);
      kiln_emit_fresh(e, hi);
      kiln_emit_fresh(e, r);
      for (int h = 0; h < 2; ++h) {
        kiln_sbuf_printf(o, "            %s = vector.shuffle %s, %s [", h ? hi : lo,
                         cur[2 * p], cur[2 * p + 1]);
        int lane = 0;
        for (int src = 0; src < 2; ++src)
          for (int g = 0; g < groups; ++g)
            for (int i = 0; i < half; ++i)
              kiln_sbuf_printf(o, "%s%d", lane++ ? ", " : "",
                               src * 16 + g * width + h * half + i);
        kiln_sbuf_puts(o, "] : vector<16xf32>, vector<16xf32>\n");
      }
      kiln_sbuf_printf(o, "            %s = arith.addf %s, %s : vector<16xf32>\n", r, lo, hi);
      memcpy(cur[p], r, 24);
    }
  }
  memcpy(out, cur[0], 24);
}

// One tile's K block [kb, ke): `mr` rows of A (index values `rows`) by
// `nr` rows of W from the block's row `c`, mr * nr = 16 vector
// accumulators; `sum` gets their sums as one vector, lane r * nr + j for
// row r of A and row c + j of W. In the last block a partial last step
// of K is read masked.
static void emit_rowdot_sums(kiln_emitter_t *e, const rowdot_t *d, int mr, int nr, int c,
                             char (*rows)[24], bool last, const char *kb, const char *ke,
                             char sum[24]) {
  kiln_sbuf_t *o = &e->out;
  int id = d->id;
  const char *vty = d->bf16 ? "vector<32xbf16>" : "vector<16xf32>";
  const char *pad = d->bf16 ? "%rpb" : "%rpf";
  char res[24];
  kiln_emit_fresh(e, res);
  kiln_sbuf_printf(o, "        %s:16 = scf.for %%rk%d = %s to %s step %%rvl_%d iter_args(",
                   res, id, kb, ke, id);
  for (int t = 0; t < 16; ++t)
    kiln_sbuf_printf(o, "%s%%rx%d_%d = %%rz_%d", t ? ", " : "", id, t, id);
  kiln_sbuf_puts(o, ") -> (");
  for (int t = 0; t < 16; ++t) kiln_sbuf_printf(o, "%svector<16xf32>", t ? ", " : "");
  kiln_sbuf_puts(o, ") {\n");
  // One step (the loop's, or the masked tail's): reads of A and W at
  // index `k`, products into `acc`, results named into `out`.
  char acc[16][24];
  for (int t = 0; t < 16; ++t) snprintf(acc[t], 24, "%%rx%d_%d", id, t);
  for (int step = 0; step < 2; ++step) {
    bool tail = step == 1;
    if (tail && !(last && d->K % d->vl)) break;
    char k[24], av[4][24], wv[16][24], out[16][24];
    const char *ind = tail ? "        " : "          ";
    const char *inb = tail ? "" : " {in_bounds = [true]}";
    if (tail) {
      for (int t = 0; t < 16; ++t) snprintf(acc[t], 24, "%.20s#%d", res, t);
      kiln_emit_fresh(e, k);
      kiln_sbuf_printf(o, "%s%s = arith.constant %lld : index\n", ind, k,
                       d->K / d->vl * d->vl);
    } else {
      snprintf(k, 24, "%%rk%d", id);
    }
    for (int r = 0; r < mr; ++r) {
      kiln_emit_fresh(e, av[r]);
      kiln_sbuf_printf(o, "%s%s = vector.transfer_read %s[%s, %s], %s_%d%s : %s, %s\n", ind,
                       av[r], d->a, rows[r], k, pad, id, inb, d->aty, vty);
    }
    for (int j = 0; j < nr; ++j) {
      kiln_emit_fresh(e, wv[j]);
      kiln_sbuf_printf(o, "%s%s = vector.transfer_read %s[%%rr%d_%d, %s], %s_%d%s : %s, %s\n",
                       ind, wv[j], d->w, id, c + j, k, pad, id, inb, d->wty, vty);
    }
    for (int r = 0; r < mr; ++r)
      for (int j = 0; j < nr; ++j) {
        int t = r * nr + j;
        kiln_emit_fresh(e, out[t]);
        if (d->bf16)
          kiln_sbuf_printf(o, "%s%s = x86vector.avx512.dot %s, %s, %s : vector<32xbf16> -> "
                              "vector<16xf32>\n", ind, out[t], acc[t], av[r], wv[j]);
        else
          kiln_sbuf_printf(o, "%s%s = vector.fma %s, %s, %s : vector<16xf32>\n", ind, out[t],
                           av[r], wv[j], acc[t]);
      }
    if (!tail) {
      kiln_sbuf_puts(o, "          scf.yield ");
      for (int t = 0; t < 16; ++t) kiln_sbuf_printf(o, "%s%s", t ? ", " : "", out[t]);
      kiln_sbuf_puts(o, " : ");
      for (int t = 0; t < 16; ++t) kiln_sbuf_printf(o, "%svector<16xf32>", t ? ", " : "");
      kiln_sbuf_puts(o, "\n        }\n");
      for (int t = 0; t < 16; ++t) snprintf(acc[t], 24, "%.20s#%d", res, t);
    } else {
      memcpy(acc, out, sizeof(acc));
    }
  }
  emit_hsum16(e, o, acc, sum);
}

// One K block [kb, ke) for every row of A into the block tensor `cur`
// ([M, cw] of C); `next` gets the result. Rows of A go four at a time
// against four rows of W at a time (eight loads per 16 FMAs; four rows of
// A and four of W share an L1 set at most, where their strides are a
// multiple of 4 KiB), the rows past the last four one at a time against
// all 16 rows of W. The sums go into C: from the bias (or as they are)
// in the first K block, added to C's in the others, through the unary op
// in the last.
static void emit_rowdot_kblock(kiln_emitter_t *e, const rowdot_t *d, const char *cur,
                               bool first, bool last, const char *kb, const char *ke,
                               char next[24]) {
  kiln_sbuf_t *o = &e->out;
  int id = d->id;
  char in[24];  // (`next` may be `cur`)
  snprintf(in, sizeof(in), "%s", cur);
  cur = in;
  const char *inb = d->N % 16 ? "false" : "true";
  char c4[24];
  snprintf(c4, sizeof(c4), "%s", cur);
  if (d->m4) {
    char loop[24], m4[24], rows[4][24];
    kiln_emit_fresh(e, loop);
    kiln_emit_fresh(e, m4);
    kiln_sbuf_printf(o,
        "      %s = scf.for %s = %%rc0_%d to %%rM4_%d step %%rc4_%d iter_args(%%rcq%d = %s) "
        "-> (tensor<?x?xf32>) {\n",
        loop, m4, id, id, id, id, cur);
    for (int r = 0; r < 4; ++r) {
      kiln_emit_fresh(e, rows[r]);
      kiln_sbuf_printf(o, "        %s = affine.apply affine_map<(d0) -> (d0 + %d)>(%s)\n",
                       rows[r], r, m4);
    }
    char cc[24];
    snprintf(cc, sizeof(cc), "%%rcq%d", id);
    for (int c = 0; c < 16; c += 4) {
      char sum[24], v[24], cidx[24];
      emit_rowdot_sums(e, d, 4, 4, c, rows, last, kb, ke, sum);
      kiln_emit_fresh(e, cidx);
      kiln_sbuf_printf(o, "        %s = arith.constant %d : index\n", cidx, c);
      memcpy(v, sum, 24);
      if (first && d->bias) {
        char b4[24], bb[24], bf[24], col[24];
        kiln_emit_fresh(e, col);
        kiln_emit_fresh(e, b4);
        kiln_emit_fresh(e, bb);
        kiln_emit_fresh(e, bf);
        kiln_emit_fresh(e, v);
        kiln_sbuf_printf(o,
            "        %s = arith.addi %%rn0_%d, %s : index\n"
            "        %s = vector.transfer_read %s[%s], %%rpf_%d {in_bounds = [%s]} : "
            "tensor<%lldxf32>, vector<4xf32>\n"
            "        %s = vector.broadcast %s : vector<4xf32> to vector<4x4xf32>\n"
            "        %s = vector.shape_cast %s : vector<4x4xf32> to vector<16xf32>\n"
            "        %s = arith.addf %s, %s : vector<16xf32>\n",
            col, id, cidx, b4, d->bias, col, id, inb, d->N, bb, b4, bf, bb, v, sum, bf);
      } else if (!first) {
        char old[24], of[24];
        kiln_emit_fresh(e, old);
        kiln_emit_fresh(e, of);
        kiln_emit_fresh(e, v);
        kiln_sbuf_printf(o,
            "        %s = vector.transfer_read %s[%s, %s], %%rpf_%d {in_bounds = [true, %s]} : "
            "tensor<?x?xf32>, vector<4x4xf32>\n"
            "        %s = vector.shape_cast %s : vector<4x4xf32> to vector<16xf32>\n"
            "        %s = arith.addf %s, %s : vector<16xf32>\n",
            old, cc, rows[0], cidx, id, inb, of, old, v, of, sum);
      }
      if (last && d->epi) {
        char ev[24];
        kiln_emit_lanes_op(e, o, d->epi->op, d->epi, v, ev);
        memcpy(v, ev, 24);
      }
      char v2[24], w[24];
      kiln_emit_fresh(e, v2);
      kiln_emit_fresh(e, w);
      kiln_sbuf_printf(o,
          "        %s = vector.shape_cast %s : vector<16xf32> to vector<4x4xf32>\n"
          "        %s = vector.transfer_write %s, %s[%s, %s] {in_bounds = [true, %s]} : "
          "vector<4x4xf32>, tensor<?x?xf32>\n",
          v2, v, w, v2, cc, rows[0], cidx, inb);
      memcpy(cc, w, 24);
    }
    kiln_sbuf_printf(o, "        scf.yield %s : tensor<?x?xf32>\n      }\n", cc);
    memcpy(c4, loop, 24);
  }
  // The rows one at a time (from the last four's end).
  kiln_emit_fresh(e, next);
  kiln_sbuf_printf(o,
      "      %s = scf.for %%rm%d = %%%s_%d to %s step %%rc1_%d iter_args(%%rcc%d = %s) "
      "-> (tensor<?x?xf32>) {\n",
      next, id, d->m4 ? "rM4" : "rc0", id, d->m, id, id, c4);
  char rows1[4][24], sum[24], v[24];
  snprintf(rows1[0], 24, "%%rm%d", id);
  emit_rowdot_sums(e, d, 1, 16, 0, rows1, last, kb, ke, sum);
  kiln_emit_fresh(e, v);
  if (first && d->bias)
    kiln_sbuf_printf(o, "        %s = arith.addf %s, %%rbv_%d : vector<16xf32>\n", v, sum, id);
  else if (first)
    memcpy(v, sum, 24);
  else
    kiln_sbuf_printf(o,
        "        %%rold%s = vector.transfer_read %%rcc%d[%%rm%d, %%rc0_%d], %%rpf_%d "
        "{in_bounds = [%s]} : tensor<?x?xf32>, vector<16xf32>\n"
        "        %s = arith.addf %%rold%s, %s : vector<16xf32>\n",
        v + 1, id, id, id, id, inb, v, v + 1, sum);
  if (last && d->epi) {
    char ev[24];
    kiln_emit_lanes_op(e, o, d->epi->op, d->epi, v, ev);
    memcpy(v, ev, 24);
  }
  kiln_sbuf_printf(o,
      "        %%rst%d = vector.transfer_write %s, %%rcc%d[%%rm%d, %%rc0_%d] {in_bounds = [%s]} : "
      "vector<16xf32>, tensor<?x?xf32>\n"
      "        scf.yield %%rst%d : tensor<?x?xf32>\n"
      "      }\n",
      id, v, id, id, id, inb, id);
}

// C (`init`, f32 [M, N] typed `oty`, every element written) = epi(A @ W^T
// (+ bias)); A the value `a_value` ([M, K], f32 or bf16 as W), W [N, K]
// static; `bias` an f32 [N] tensor
// or NULL; `epi` a unary elementwise node (kiln_lanes_op_supported) or NULL.
static void emit_rowdot(kiln_emitter_t *e, int a_value, const kiln_tv_t *w,
                        const kiln_tv_t *bias, const kiln_node_t *epi, const char *init,
                        const char *oty, char out[24]) {
  const kiln_tv_t *a = &e->values[a_value];
  kiln_sbuf_t *o = &e->out;
  char aty[96], wty[96], msz[24], mv[32];
  kiln_mlir_tensor_type(&a->type, aty, sizeof(aty));
  kiln_mlir_tensor_type(&w->type, wty, sizeof(wty));
  rowdot_t d = {.bf16 = w->type.dtype == KILN_BF16, .K = w->type.dims[1],
                .N = w->type.dims[0], .a = a->ssa, .aty = aty, .w = w->ssa, .wty = wty,
                .bias = bias ? bias->ssa : NULL, .epi = epi, .id = e->next_id++};
  d.vl = d.bf16 ? 32 : 16;
  int id = d.id;
  kiln_emit_size_operand(e, &a->type, 0, msz);
  if (KILN_IS_SYM(a->type.dims[0])) {
    snprintf(mv, sizeof(mv), "%s", msz);
  } else {
    snprintf(mv, sizeof(mv), "%%rM_%d", id);
    kiln_sbuf_printf(o, "    %s = arith.constant %s : index\n", mv, msz);
  }
  d.m = mv;
  d.m4 = KILN_IS_SYM(a->type.dims[0]) || a->type.dims[0] >= 4;
  // K blocks of at most 16 KB of W's 16 rows (256 f32, 512 bf16), equal
  // but for the last, in whole steps. (kiln-run, 8 and 24 x 4096 x 4096:
  // blocks of 128 to 1024 within 15% of each other; copying each block
  // of W into a [16, kc] buffer, as rows 16 KiB apart share L1 sets,
  // measured 10-60% slower.)
  long long kmax = d.bf16 ? 512 : 256, nkb = (d.K + kmax - 1) / kmax;
  long long kc = ((d.K + nkb - 1) / nkb + d.vl - 1) / d.vl * d.vl;
  nkb = (d.K + kc - 1) / kc;
  long long NB = (d.N + 15) / 16;
  kiln_emit_fresh(e, out);
  kiln_sbuf_printf(o,
      "    %s = scf.forall (%%rn%d) in (%lld) shared_outs(%%rco%d = %s) -> (%s) {\n"
      "      %%rc0_%d = arith.constant 0 : index\n"
      "      %%rc1_%d = arith.constant 1 : index\n"
      "      %%rc4_%d = arith.constant 4 : index\n"
      "      %%rM4_%d = affine.apply affine_map<()[s0] -> ((s0 floordiv 4) * 4)>()[%s]\n"
      "      %%rvl_%d = arith.constant %d : index\n"
      "      %%rpf_%d = arith.constant 0.0 : f32\n"
      "      %%rpb_%d = arith.constant 0.0 : bf16\n"
      "      %%rz_%d = arith.constant dense<0.0> : vector<16xf32>\n"
      "      %%rn0_%d = affine.apply affine_map<(d0) -> (d0 * 16)>(%%rn%d)\n"
      "      %%rcw_%d = affine.min affine_map<(d0) -> (16, %lld - d0 * 16)>(%%rn%d)\n"
      "      %%rblk_%d = tensor.extract_slice %%rco%d[0, %%rn0_%d] [%s, %%rcw_%d] [1, 1] : "
      "%s to tensor<?x?xf32>\n",
      out, id, NB, id, init, oty, id, id, id, id, mv, id, d.vl, id, id, id, id, id, id, d.N, id,
      id, id, id, mv, id, oty);
  // W's rows of this block; past N (the last block), row N - 1 again.
  // (Where no block passes N the rows are n0 + i, constant offsets from
  // one base address.)
  for (int i = 0; i < 16; ++i) {
    if (d.N % 16)
      kiln_sbuf_printf(o,
          "      %%rr%d_%d = affine.min affine_map<(d0) -> (d0 * 16 + %d, %lld)>(%%rn%d)\n", id,
          i, i, d.N - 1, id);
    else
      kiln_sbuf_printf(o, "      %%rr%d_%d = affine.apply affine_map<(d0) -> (d0 * 16 + %d)>"
                          "(%%rn%d)\n", id, i, i, id);
  }
  if (d.bias)
    kiln_sbuf_printf(o,
        "      %%rbv_%d = vector.transfer_read %s[%%rn0_%d], %%rpf_%d {in_bounds = [%s]} : "
        "tensor<%lldxf32>, vector<16xf32>\n",
        id, d.bias, id, id, d.N % 16 ? "false" : "true", d.N);
  // The first K block from zeros or the bias, the last with the
  // epilogue, the ones between in a loop.
  char blk[24], bnd[2][24];
  // The last block's loop stops at the last whole step (the partial one
  // after it is masked).
  long long kfloor = d.K / d.vl * d.vl;
  kiln_sbuf_printf(o,
      "      %%rkb0_%d = arith.constant 0 : index\n"
      "      %%rke0_%d = arith.constant %lld : index\n",
      id, id, nkb == 1 ? kfloor : kc);
  snprintf(bnd[0], 24, "%%rkb0_%d", id);
  snprintf(bnd[1], 24, "%%rke0_%d", id);
  snprintf(blk, sizeof(blk), "%%rblk_%d", id);
  emit_rowdot_kblock(e, &d, blk, true, nkb == 1, bnd[0], bnd[1], blk);
  if (nkb > 2) {
    char nb[24];
    kiln_sbuf_printf(o,
        "      %%rkc_%d = arith.constant %lld : index\n"
        "      %%rkm_%d = arith.constant %lld : index\n"
        "      %%rkl%d = scf.for %%rkb%d = %%rkc_%d to %%rkm_%d step %%rkc_%d "
        "iter_args(%%rkt%d = %s) -> (tensor<?x?xf32>) {\n"
        "      %%rke%d = arith.addi %%rkb%d, %%rkc_%d : index\n",
        id, kc, id, (nkb - 1) * kc, id, id, id, id, id, id, blk, id, id, id);
    char cur[24];
    snprintf(cur, 24, "%%rkt%d", id);
    snprintf(bnd[0], 24, "%%rkb%d", id);
    snprintf(bnd[1], 24, "%%rke%d", id);
    emit_rowdot_kblock(e, &d, cur, false, false, bnd[0], bnd[1], nb);
    kiln_sbuf_printf(o, "      scf.yield %s : tensor<?x?xf32>\n      }\n", nb);
    snprintf(blk, sizeof(blk), "%%rkl%d", id);
  }
  if (nkb > 1) {
    kiln_sbuf_printf(o,
        "      %%rkbl_%d = arith.constant %lld : index\n"
        "      %%rkel_%d = arith.constant %lld : index\n",
        id, (nkb - 1) * kc, id, kfloor);
    snprintf(bnd[0], 24, "%%rkbl_%d", id);
    snprintf(bnd[1], 24, "%%rkel_%d", id);
    emit_rowdot_kblock(e, &d, blk, false, true, bnd[0], bnd[1], blk);
  }
  kiln_sbuf_printf(o,
      "      scf.forall.in_parallel {\n"
      "        tensor.parallel_insert_slice %s into %%rco%d[0, %%rn0_%d] [%s, %%rcw_%d] "
      "[1, 1] : tensor<?x?xf32> into %s\n"
      "      }\n"
      "    }\n",
      blk, id, id, mv, id, oty);
}

// Where the f32 microkernel takes a matmul (AVX-512): f32 [M, K] x [K, N]
// with K and N static, M·K·N at least 2^20 and M at least 32 rows, so the
// per-call pack of B (K·N floats written and read again) is shared by at
// least four register tiles. A symbolic M counts as 256 (a batch under
// dynamic shapes; a call with a few rows still packs all of B).
static bool f32_dot_applies(const kiln_emitter_t *e, const kiln_tv_t *a,
                            const kiln_tv_t *b) {
  if (!e->options.x86_f32_dot || e->options.cuda || a->type.dtype != KILN_F32 ||
      b->type.dtype != KILN_F32 || a->type.rank != 2 || b->type.rank != 2 ||
      !kiln_type_is_static(&b->type) || KILN_IS_SYM(a->type.dims[1]))
    return false;
  int64_t m = KILN_IS_SYM(a->type.dims[0]) ? 256 : a->type.dims[0];
  int64_t k = b->type.dims[0], nn = b->type.dims[1];
  return m >= 32 && k >= 16 && nn >= 16 && m * k * nn >= (int64_t)1 << 20;
}

// Whether the f32 microkernel takes a transposed lhs A = X^T (a weight
// gradient, dY^T @ X) that f32_dot_applies accepts: from M·K·N of 2^24 on.
// The microkernel then packs both operands per call (A^T in place where M
// is not a multiple of 8); below that the tiled
// matmul, reading A^T through its indexing map, is faster (kiln-run on the
// Xeon: the GPT step's 64x512x64 0.015 against 0.045 ms, 256x512x64 0.055
// against 0.086; the MLP step's 256x128x1024 and 1024x128x256 0.24-0.27
// against 0.19).
static bool f32_dot_transposed_applies(const kiln_tv_t *a, const kiln_tv_t *b,
                                       const kiln_tv_t *x) {
  return x->type.dtype == KILN_F32 && !KILN_IS_SYM(a->type.dims[0]) &&
         a->type.dims[0] * a->type.dims[1] * b->type.dims[1] >= (int64_t)1 << 24;
}

// The untransposed source when matrix `value` is the transpose of another
// tensor (a permute [1, 0], possibly composed), else NULL. A matmul then
// reads the source through its indexing map instead of a materialized copy
// (grad_W = dY^T @ X in every linear backward): A^T's columns are rows of
// A, contiguous, which is what the outer-product contraction loads.
static const kiln_tv_t *transposed_source(kiln_emitter_t *e, int value) {
  const kiln_value_t *v = &e->g->values[value];
  if (v->node < 0 || v->type.rank != 2) return NULL;
  const kiln_node_t *p = &e->g->nodes[v->node];
  if (p->op != KILN_OP_PERMUTE && p->op != KILN_OP_TRANSPOSE) return NULL;
  int32_t perm[KILN_MAX_RANK];
  const kiln_tv_t *src = NULL;
  kiln_permute_source(e, p, 2, perm, &src);
  return perm[0] == 1 && perm[1] == 0 && src->type.rank == 2 ? src : NULL;
}

// bf16 rows against a bf16 weight on AMX (emit_rowdot's job where the CPU
// has the tile unit): C^T = W A^T, so W [N, K], read in place, is the
// tile unit's A operand (16 rows x 32 k a tile) and A^T the B operand,
// packed once into bf16 pairs. A thread takes chunks of blocks of 32 rows
// of W; per block and chunk of 32 rows of A (16 where M is at most 16)
// four f32 accumulator tiles run the whole K loop (two W tiles, two A^T
// tiles and four tdpbf16ps per 32 k), go through a [32, 32] f32 scratch,
// and come out transposed (vector.transpose of 16 x 16) as rows of C.
// Against the vector form (vdpbf16ps, half an f32 FMA's rate here) and
// the microkernel (AMX too, but packing W^T on every call), `kiln-run` x
// @ W^T: 8 x 4096 x 4096 1.5 -> 0.75 ms, 64 x 4096 x 4096 8.1 -> 1.4 (eager
// 1.8), 128 x 4096 x 4096 10.6 -> 2.9 (eager 2.8), 64 x 768 x 768 0.17 ->
// 0.09; from 256 rows the microkernel (or eager) is ahead on small
// weights (256 x 768 x 768: 0.33 against 0.37).
//
// Whether W suits it (AMX, contiguous rows of W for the tile loads, N and
// K multiples of 32); then rows 2..128 take it (one row: the vector form,
// as fast on a large weight and without the pack and scratch, 0.009
// against 0.022 ms on 768 x 768).
static bool amx_rowdot_weight(kiln_emitter_t *e, const kiln_tv_t *w) {
  return e->options.x86_amx && w->type.dtype == KILN_BF16 &&
         w->type.dims[1] % 32 == 0 && w->type.dims[0] % 32 == 0 &&
         unit_inner_stride(e, (int)(w - e->values));
}

enum { KILN_AMX_ROWDOT_MAX = 128 };

// A symbolic M is the few-rows branch of an scf.if (emit_few_rows_if).
static bool amx_rowdot_applies(kiln_emitter_t *e, const kiln_tv_t *a, const kiln_tv_t *w) {
  if (a->type.dtype != KILN_BF16 || !amx_rowdot_weight(e, w)) return false;
  int64_t M = a->type.dims[0];
  return KILN_IS_SYM(M) || (M >= 2 && M <= KILN_AMX_ROWDOT_MAX);
}

static void emit_amx_rowdot(kiln_emitter_t *e, int a_value, const kiln_tv_t *w,
                            const char *init, const char *oty, char out[24]) {
  const kiln_tv_t *a = &e->values[a_value];
  kiln_sbuf_t *o = &e->out;
  // Rows of A go in chunks of CH = 16 MT (MT A^T tiles: 32 rows, or 16 for
  // at most 16), each chunk its own pass over the block's K loop (the two
  // W tiles come again from cache). Rows past M (a partial last chunk, a
  // symbolic M) are packed from row M - 1, and C's writes are masked past
  // M.
  bool sym = KILN_IS_SYM(a->type.dims[0]);
  long long M = sym ? -1 : a->type.dims[0], K = w->type.dims[1], N = w->type.dims[0],
            K2 = K / 2;
  int MT = !sym && M <= 16 ? 1 : 2, CH = 16 * MT;
  long long MCH = sym ? -1 : (M + CH - 1) / CH;
  bool whole = !sym && M % CH == 0;
  int id = e->next_id++;
  char mv[24], msz[24], cty[48], apt[64], apty[96], wmty[96], sty[96], aty[96], wty[96];
  // M as an index value (the symbol's, or a constant) and as a slice size
  // (the symbol's value, or the number).
  kiln_emit_size_operand(e, &a->type, 0, msz);
  snprintf(mv, sizeof(mv), "%s", msz);
  if (!sym) {
    kiln_sbuf_printf(o, "    %%xM%d = arith.constant %lld : index\n", id, M);
    snprintf(mv, sizeof(mv), "%%xM%d", id);
  }
  kiln_mlir_tensor_type(&a->type, aty, sizeof(aty));
  kiln_mlir_tensor_type(&w->type, wty, sizeof(wty));
  if (sym) {
    snprintf(cty, sizeof(cty), "tensor<?x?xf32>");
    snprintf(apt, sizeof(apt), "tensor<%lldx?xbf16>", K2);
    snprintf(apty, sizeof(apty), "memref<%lldx?xbf16, strided<[?, 1], offset: ?>>", K2);
  } else {
    snprintf(cty, sizeof(cty), "tensor<%lldx?xf32>", M);
    snprintf(apt, sizeof(apt), "tensor<%lldx%lldxbf16>", K2, 2 * CH * MCH);
    snprintf(apty, sizeof(apty), "memref<%lldx%lldxbf16, strided<[?, 1], offset: ?>>", K2,
             2 * CH * MCH);
  }
  snprintf(wmty, sizeof(wmty), "memref<%lldx%lldxbf16, strided<[?, 1], offset: ?>>", N, K);
  snprintf(sty, sizeof(sty), "memref<32x%dxf32, strided<[%d, 1], offset: ?>>", CH, CH);
  const char *tt = "!amx.tile<16x16xf32>", *it = "!amx.tile<16x32xbf16>";
  // The chunk count and the packed A^T's width: %xmch, %xgp (groups of 16
  // rows) and %xapw (bf16 columns).
  if (sym)
    kiln_sbuf_printf(o,
        "    %%xmch%d = affine.apply affine_map<()[s0] -> ((s0 + 31) floordiv 32)>()[%s]\n"
        "    %%xgp%d = affine.apply affine_map<()[s0] -> (((s0 + 31) floordiv 32) * 2)>()[%s]\n"
        "    %%xapw%d = affine.apply affine_map<()[s0] -> (((s0 + 31) floordiv 32) * 64)>()[%s]\n"
        "    %%xpe%d = tensor.empty(%%xapw%d) : %s\n",
        id, mv, id, mv, id, mv, id, id, apt);
  else
    kiln_sbuf_printf(o,
        "    %%xmch%d = arith.constant %lld : index\n"
        "    %%xgp%d = arith.constant %lld : index\n"
        "    %%xpe%d = tensor.empty() : %s\n",
        id, MCH, id, MCH * MT, id, apt);
  // A^T in pairs, [K/2, 2 MP] bf16 (row kk: the pairs A[m, 2kk..2kk+1] of
  // rows m = 0 .. MP - 1): per 32 k and 16 rows of A, the rows' 32-bit
  // pairs as a 16 x 16 i32 block, transposed by shuffles (a
  // linalg.transpose of [M, K/2, 2] was vectorized whole for some M).
  kiln_sbuf_printf(o,
      "    %%xpc0_%d = arith.constant 0 : index\n"
      "    %%xpc1_%d = arith.constant 1 : index\n"
      "    %%xpck_%d = arith.constant %lld : index\n"
      "    %%xpc16_%d = arith.constant 16 : index\n"
      "    %%xpz%d = arith.constant dense<0> : vector<16x16xi32>\n"
      "    %%xpp%d = arith.constant 0.0 : bf16\n"
      "    %%xap%d = scf.for %%xpk%d = %%xpc0_%d to %%xpck_%d step %%xpc16_%d "
      "iter_args(%%xpo%d = %%xpe%d) -> (%s) {\n"
      "      %%xpkk%d = arith.addi %%xpk%d, %%xpk%d : index\n"
      "      %%xpg%d = scf.for %%xg%d = %%xpc0_%d to %%xgp%d step %%xpc1_%d "
      "iter_args(%%xpq%d = %%xpo%d) -> (%s) {\n"
      "        %%xgc%d = affine.apply affine_map<(d0) -> (d0 * 32)>(%%xg%d)\n",
      id, id, id, K2, id, id, id, id, id, id, id, id, id, id, apt, id, id, id, id, id, id, id,
      id, id, id, apt, id, id);
  char blk[24], prev[24];
  snprintf(blk, sizeof(blk), "%%xpz%d", id);
  snprintf(prev, sizeof(prev), "%%xpq%d", id);
  for (int r = 0; r < 16; ++r) {
    char ri[24], v[24], vi[24], nb[24];
    kiln_emit_fresh(e, ri);
    kiln_emit_fresh(e, v);
    kiln_emit_fresh(e, vi);
    kiln_emit_fresh(e, nb);
    kiln_sbuf_printf(o,
        "        %s = affine.min affine_map<(d0)[s0] -> (d0 * 16 + %d, s0 - 1)>(%%xg%d)[%s]\n"
        "        %s = vector.transfer_read %s[%s, %%xpkk%d], %%xpp%d {in_bounds = [true]} : %s, "
        "vector<32xbf16>\n"
        "        %s = vector.bitcast %s : vector<32xbf16> to vector<16xi32>\n"
        "        %s = vector.insert %s, %s [%d] : vector<16xi32> into vector<16x16xi32>\n",
        ri, r, id, mv, v, a->ssa, ri, id, id, aty, vi, v, nb, vi, blk, r);
    snprintf(blk, sizeof(blk), "%s", nb);
  }
  char tp[24];
  kiln_emit_fresh(e, tp);
  kiln_sbuf_printf(o,
      "        %s = vector.transpose %s, [1, 0] : vector<16x16xi32> to vector<16x16xi32>\n", tp,
      blk);
  for (int c = 0; c < 16; ++c) {
    char x[24], xb[24], ri[24], w2[24];
    kiln_emit_fresh(e, x);
    kiln_emit_fresh(e, xb);
    kiln_emit_fresh(e, ri);
    kiln_emit_fresh(e, w2);
    kiln_sbuf_printf(o,
        "        %s = vector.extract %s[%d] : vector<16xi32> from vector<16x16xi32>\n"
        "        %s = vector.bitcast %s : vector<16xi32> to vector<32xbf16>\n"
        "        %s = affine.apply affine_map<(d0) -> (d0 + %d)>(%%xpk%d)\n"
        "        %s = vector.transfer_write %s, %s[%s, %%xgc%d] {in_bounds = [true]} : "
        "vector<32xbf16>, %s\n",
        x, tp, c, xb, x, ri, c, id, w2, xb, prev, ri, id, apt);
    snprintf(prev, sizeof(prev), "%s", w2);
  }
  kiln_sbuf_printf(o, "        scf.yield %s : %s\n      }\n      scf.yield %%xpg%d : %s\n    }\n",
                   prev, apt, id, apt);
  // Chunks of blocks for the threads (at most 16), each with its scratch,
  // allocated outside the parallel loop (from kiln's buffer pool: on the
  // stack, a graph of many such matmuls would hold them all in one frame).
  long long NB = N / 32, NC = NB < 16 ? NB : 16, CB = (NB + NC - 1) / NC;
  NC = (NB + CB - 1) / CB;
  kiln_sbuf_printf(o,
      "    %%xapm%d = bufferization.to_buffer %%xap%d read_only : %s to %s\n"
      "    %%xwm%d = bufferization.to_buffer %s read_only : %s to %s\n"
      "    %%xscr%d = memref.alloc() {alignment = 64 : i64} : memref<%lldx32x%dxf32>\n",
      id, id, apt, apty, id, w->ssa, wty, wmty, id, NC, CH);
  kiln_emit_fresh(e, out);
  kiln_sbuf_printf(o,
      "    %s = scf.forall (%%xc%d) in (%lld) shared_outs(%%xco%d = %s) -> (%s) {\n"
      "      %%xc0_%d = arith.constant 0 : index\n"
      "      %%xc1_%d = arith.constant 1 : index\n"
      "      %%xc16_%d = arith.constant 16 : index\n"
      "      %%xck_%d = arith.constant %lld : index\n"
      "      %%xpd_%d = arith.constant 0.0 : f32\n"
      "      %%xs%d = memref.subview %%xscr%d[%%xc%d, 0, 0] [1, 32, %d] [1, 1, 1] : "
      "memref<%lldx32x%dxf32> to %s\n",
      out, id, NC, id, init, oty, id, id, id, id, K2, id, id, id, id, CH, NC, CH, sty);
  kiln_sbuf_printf(o,
      "      %%xb0_%d = affine.apply affine_map<(d0) -> (d0 * %lld)>(%%xc%d)\n"
      "      %%xb1_%d = affine.min affine_map<(d0) -> (d0 * %lld + %lld, %lld)>(%%xc%d)\n"
      "      %%xn0_%d = affine.apply affine_map<(d0) -> (d0 * 32)>(%%xb0_%d)\n"
      "      %%xnw_%d = affine.apply affine_map<(d0, d1) -> ((d1 - d0) * 32)>(%%xb0_%d, "
      "%%xb1_%d)\n"
      "      %%xcb%d = tensor.extract_slice %%xco%d[0, %%xn0_%d] [%s, %%xnw_%d] [1, 1] : %s to "
      "%s\n",
      id, CB, id, id, CB, CB, NB, id, id, id, id, id, id, id, id, id, msz, id, oty, cty);
  kiln_sbuf_printf(o,
      "      %%xr%d = scf.for %%xnb%d = %%xb0_%d to %%xb1_%d step %%xc1_%d "
      "iter_args(%%xcc%d = %%xcb%d) -> (%s) {\n"
      "        %%xn%d = affine.apply affine_map<(d0) -> (d0 * 32)>(%%xnb%d)\n"
      "        %%xn16_%d = arith.addi %%xn%d, %%xc16_%d : index\n"
      "        %%xl%d = arith.subi %%xn%d, %%xn0_%d : index\n"
      "        %%xl16_%d = arith.addi %%xl%d, %%xc16_%d : index\n"
      "        %%xz%d = amx.tile_zero : %s\n"
      "        %%xrr%d = scf.for %%xch%d = %%xc0_%d to %%xmch%d step %%xc1_%d "
      "iter_args(%%xcq%d = %%xcc%d) -> (%s) {\n"
      "          %%xm0_%d = affine.apply affine_map<(d0) -> (d0 * %d)>(%%xch%d)\n"
      "          %%xm16_%d = arith.addi %%xm0_%d, %%xc16_%d : index\n"
      "          %%xcol0_%d = affine.apply affine_map<(d0) -> (d0 * %d)>(%%xch%d)\n"
      "          %%xcol32_%d = affine.apply affine_map<(d0) -> (d0 * %d + 32)>(%%xch%d)\n",
      id, id, id, id, id, id, id, cty, id, id, id, id, id, id, id, id, id, id, id, id, tt, id,
      id, id, id, id, id, id, cty, id, CH, id, id, id, id, id, 2 * CH, id, id, 2 * CH, id);
  int nacc = 2 * MT;
  kiln_sbuf_printf(o, "          %%xacc%d:%d = scf.for %%xk%d = %%xc0_%d to %%xck_%d step "
                      "%%xc16_%d iter_args(", id, nacc, id, id, id, id);
  for (int t = 0; t < nacc; ++t)
    kiln_sbuf_printf(o, "%s%%xa%d_%d = %%xz%d", t ? ", " : "", id, t, id);
  kiln_sbuf_puts(o, ") -> (");
  for (int t = 0; t < nacc; ++t) kiln_sbuf_printf(o, "%s%s", t ? ", " : "", tt);
  kiln_sbuf_printf(o, ") {\n"
                      "            %%xk2_%d = arith.addi %%xk%d, %%xk%d : index\n", id, id, id);
  char row[2][24], acol[2][24], c0[24], c16[24];
  snprintf(row[0], 24, "%%xn%d", id);
  snprintf(row[1], 24, "%%xn16_%d", id);
  snprintf(acol[0], 24, "%%xcol0_%d", id);
  snprintf(acol[1], 24, "%%xcol32_%d", id);
  snprintf(c0, 24, "%%xc0_%d", id);
  snprintf(c16, 24, "%%xc16_%d", id);
  for (int h = 0; h < 2; ++h)
    kiln_sbuf_printf(o, "            %%xtw%d_%d = amx.tile_load %%xwm%d[%s, %%xk2_%d] : %s into %s\n",
                     id, h, id, row[h], id, wmty, it);
  for (int mt = 0; mt < MT; ++mt)
    kiln_sbuf_printf(o, "            %%xtb%d_%d = amx.tile_load %%xapm%d[%%xk%d, %s] : %s into %s\n",
                     id, mt, id, id, acol[mt], apty, it);
  for (int h = 0; h < 2; ++h)
    for (int mt = 0; mt < MT; ++mt)
      kiln_sbuf_printf(o, "            %%xu%d_%d = amx.tile_mulf %%xtw%d_%d, %%xtb%d_%d, "
                          "%%xa%d_%d : %s, %s, %s\n",
                       id, h * MT + mt, id, h, id, mt, id, h * MT + mt, it, it, tt);
  kiln_sbuf_puts(o, "            scf.yield ");
  for (int t = 0; t < nacc; ++t) kiln_sbuf_printf(o, "%s%%xu%d_%d", t ? ", " : "", id, t);
  kiln_sbuf_puts(o, " : ");
  for (int t = 0; t < nacc; ++t) kiln_sbuf_printf(o, "%s%s", t ? ", " : "", tt);
  kiln_sbuf_puts(o, "\n          }\n");
  // The accumulators into the scratch (row: a row of W; column: a row of
  // A), then each 16 x 16 square transposed into 16 rows of C by one write
  // (masked past M).
  for (int h = 0; h < 2; ++h)
    for (int mt = 0; mt < MT; ++mt)
      kiln_sbuf_printf(o, "          amx.tile_store %%xs%d[%s, %s], %%xacc%d#%d : %s, %s\n", id,
                       h ? c16 : c0, mt ? c16 : c0, id, h * MT + mt, sty, tt);
  char cur[24];
  snprintf(cur, sizeof(cur), "%%xcq%d", id);
  for (int h = 0; h < 2; ++h)
    for (int mt = 0; mt < MT; ++mt) {
      char v[24], t[24], wv[24];
      kiln_emit_fresh(e, v);
      kiln_emit_fresh(e, t);
      kiln_emit_fresh(e, wv);
      kiln_sbuf_printf(o,
          "          %s = vector.transfer_read %%xs%d[%s, %s], %%xpd_%d {in_bounds = [true, true]} "
          ": %s, vector<16x16xf32>\n"
          "          %s = vector.transpose %s, [1, 0] : vector<16x16xf32> to vector<16x16xf32>\n"
          "          %s = vector.transfer_write %s, %s[%%xm%s_%d, %%xl%s%d] {in_bounds = [%s, true]} : "
          "vector<16x16xf32>, %s\n",
          v, id, h ? c16 : c0, mt ? c16 : c0, id, sty, t, v, wv, t, cur, mt ? "16" : "0", id,
          h ? "16_" : "", id, whole ? "true" : "false", cty);
      snprintf(cur, sizeof(cur), "%s", wv);
    }
  kiln_sbuf_printf(o,
      "          scf.yield %s : %s\n"
      "        }\n"
      "        scf.yield %%xrr%d : %s\n"
      "      }\n"
      "      scf.forall.in_parallel {\n"
      "        tensor.parallel_insert_slice %%xr%d into %%xco%d[0, %%xn0_%d] [%s, %%xnw_%d] "
      "[1, 1] : %s into %s\n"
      "      }\n"
      "    }\n",
      cur, cty, id, cty, id, id, id, msz, id, cty, oty);
}

// Up to how many rows (exclusive) the row dot products take a matmul
// against W: f32 under 96, where the microkernel's pack of W^T per call
// starts to pay off (kiln-run, 64 x 4096 x 4096: 9.5-11.4 against 13.6
// ms; 128 x 4096 x 4096 and 128 x 768 x 768 even or behind); bf16 on AMX
// (amx_rowdot_weight) up to KILN_AMX_ROWDOT_MAX; other bf16 under 32, from
// where AMX's 32-row tiles or the vector microkernel run.
static int rowdot_rows(kiln_emitter_t *e, const kiln_tv_t *w) {
  if (w->type.dtype != KILN_BF16) return 96;
  return amx_rowdot_weight(e, w) ? KILN_AMX_ROWDOT_MAX + 1 : 32;
}

// The weight W when emit_rowdot takes a matmul A @ B: on the CPU, B = W^T
// of a static [N, K] tensor of A's dtype (f32 on AVX-512 unless
// KILN_F32_DOT=0; bf16 where AVX512-BF16 is there), A [M, K] with K static, few rows of A (rowdot_rows; for bf16
// also counts up to 63 that are no multiple of 32) and at least 2^16
// multiply-adds; else NULL. A symbolic M sets `*sym`: the caller chooses at run time.
static const kiln_tv_t *rowdot_weight(kiln_emitter_t *e, const kiln_tv_t *a, int b_value,
                                      bool *sym) {
  *sym = false;
  if (e->options.cuda || a->type.rank != 2 || KILN_IS_SYM(a->type.dims[1])) return NULL;
  if (a->type.dtype != KILN_F32 && a->type.dtype != KILN_BF16) return NULL;
  const kiln_tv_t *w = transposed_source(e, b_value);
  if (!w || w->type.dtype != a->type.dtype || !kiln_type_is_static(&w->type)) return NULL;
  bool bf16 = a->type.dtype == KILN_BF16;
  // (16 vector<16> accumulators want AVX-512's 32 registers: f32 goes with
  // the f32 microkernel's option, bf16 with AVX512-BF16's.)
  if (!(bf16 ? e->options.x86_bf16_dot : e->options.x86_f32_dot)) return NULL;
  int64_t K = w->type.dims[1], N = w->type.dims[0];
  if (KILN_IS_SYM(a->type.dims[0])) {
    *sym = K * N >= (int64_t)1 << 11;
    return *sym ? w : NULL;
  }
  int64_t m = a->type.dims[0];
  // (Off AMX, the bf16 microkernel's AMX tiles of 32 rows leave the rest of
  // a row count that is no multiple of 32 to its vector tiles; an odd one
  // has no bf16 microkernel at all.)
  bool few = m < rowdot_rows(e, w) || (bf16 && m < 64 && m % 32);
  if (m < 1 || !few || m * K * N < (int64_t)1 << 16) return NULL;
  return w;
}

// `res` = scf.if (A's symbolic row count < rowdot_rows) -> (oty) { ...: the
// then branch follows, emit_yield ends each branch.
static void emit_few_rows_if(kiln_emitter_t *e, const kiln_tv_t *a, const kiln_tv_t *w,
                             const char *oty, char res[24]) {
  int rows = rowdot_rows(e, w);
  char msz[24], small[24];
  kiln_emit_size_operand(e, &a->type, 0, msz);
  kiln_emit_fresh(e, small);
  kiln_emit_fresh(e, res);
  kiln_sbuf_printf(&e->out,
      "    %sc = arith.constant %d : index\n"
      "    %s = arith.cmpi ult, %s, %sc : index\n"
      "    %s = scf.if %s -> (%s) {\n",
      small, rows, small, msz, small, res, small, oty);
}

static void emit_yield(kiln_emitter_t *e, const char *v, const char *oty, bool last) {
  kiln_sbuf_printf(&e->out, "    scf.yield %s : %s\n    }%s\n", v, oty, last ? "" : " else {");
}

// B's untransposed source for the bf16 microkernel's pack: a contiguous
// bf16 [N, K] tensor (static) whose transpose is B, else NULL.
static const kiln_tv_t *bf16_dot_bt(kiln_emitter_t *e, int value) {
  const kiln_tv_t *src = transposed_source(e, value);
  return src && src->type.dtype == KILN_BF16 && kiln_type_is_static(&src->type) ? src : NULL;
}

// B = W^T of an f32 CPU matmul (a linear layer's weight) that the f32
// microkernel does not take (no AVX-512, KILN_F32_DOT=0, or too small),
// materialized in
// rows of N + 16 floats where N * 4 is a multiple of 4 KiB: the transpose
// is written anyway, and the matmul reads the [K, N] slice. Rows 4 KiB (a
// multiple) apart put a register tile's loads of consecutive k in one L1
// set: the bench's linear + GELU ([512,512] x W^T, N = 1024) took 3.9 ms
// against 2.3 padded; [512,512] x W^T with N = 2048 6.3 against 3.8. At 2
// KiB (N = 512) padding measured no better (0.86 against 0.78 ms). Only
// with M >= 128 rows. (A padded copy
// of a plain B, one more pass, took [512,512]x[512,1024] from 3.2 to 2.1
// ms but 1024^3 from 7.1 to 7.7: not done.) `ssa` gets the slice.
static bool emit_padded_bt(kiln_emitter_t *e, const kiln_tv_t *a, const kiln_tv_t *b,
                           int b_value, char ssa[24]) {
  if (e->options.cuda || a->type.rank != 2 || b->type.rank != 2 ||
      b->type.dtype != KILN_F32 || !kiln_type_is_static(&a->type) ||
      !kiln_type_is_static(&b->type))
    return false;
  int64_t m = a->type.dims[0], k = b->type.dims[0], nn = b->type.dims[1];
  if (m < 128 || k < 64 || (nn * 4) % 4096 != 0) return false;
  const kiln_tv_t *w = transposed_source(e, b_value);
  if (!w || w->type.dtype != KILN_F32 || !kiln_type_is_static(&w->type)) return false;
  long long K = k, N = nn, NP = nn + 16;
  char pad[24], slot[24], filled[24], whole[24];
  kiln_emit_fresh(e, pad);
  kiln_emit_fresh(e, slot);
  kiln_emit_fresh(e, filled);
  kiln_emit_fresh(e, whole);
  kiln_emit_fresh(e, ssa);
  // (extract_slice of the insert_slice folds to the transpose, whose
  // destination is the padded buffer's slice.)
  kiln_sbuf_printf(&e->out,
      "    %s = tensor.empty() : tensor<%lldx%lldxf32>\n"
      "    %s = tensor.extract_slice %s[0, 0] [%lld, %lld] [1, 1] : tensor<%lldx%lldxf32> "
      "to tensor<%lldx%lldxf32>\n"
      "    %s = linalg.transpose ins(%s : tensor<%lldx%lldxf32>) outs(%s : "
      "tensor<%lldx%lldxf32>) permutation = [1, 0]\n"
      "    %s = tensor.insert_slice %s into %s[0, 0] [%lld, %lld] [1, 1] : "
      "tensor<%lldx%lldxf32> into tensor<%lldx%lldxf32>\n"
      "    %s = tensor.extract_slice %s[0, 0] [%lld, %lld] [1, 1] : tensor<%lldx%lldxf32> "
      "to tensor<%lldx%lldxf32>\n",
      pad, K, NP, slot, pad, K, N, K, NP, K, N, filled, w->ssa, N, K, slot, K, N, whole,
      filled, pad, K, N, K, N, K, NP, ssa, whole, K, N, K, NP, K, N);
  return true;
}

// What the f32 microkernel takes over from the nodes reading its product:
// a chain of single readers through views that keep the last dim (N),
// then, for a plain mm, an add of an [N] bias (the kernel starts from it,
// as from an addmm's), then a unary elementwise op (applied as the last K
// block is stored). A linear layer on a 3-D input reaches its bias add
// and activation through views (x @ W^T viewed as [T, B, N], + b, relu).
typedef struct mm_chain {
  int nodes[8], count;           // the nodes taken over, in order
  const kiln_tv_t *bias;         // the add's bias (graph value) or NULL
  const kiln_node_t *unary;      // or NULL
} mm_chain_t;

static void plan_mm_chain(const kiln_emitter_t *e, const kiln_node_t *n, bool can_bias,
                          mm_chain_t *ch) {
  const kiln_graph_t *g = e->g;
  memset(ch, 0, sizeof(*ch));
  int self = (int)(n - g->nodes);
  int32_t v = n->results[0];
  int64_t N = g->values[v].type.dims[1];
  int kept = 0;  // chain length up to its last bias add or unary op
  while (ch->count < 8) {
    int u = kiln_emit_sole_reader(g, v, self);
    if (u < 0) break;
    const kiln_node_t *c = &g->nodes[u];
    const kiln_type_t *ct = &g->values[c->results[0]].type;
    const kiln_type_t *vt = &g->values[v].type;
    if (ct->dtype != KILN_F32 || c->result_count != 1) break;
    if (c->op == KILN_OP_VIEW || c->op == KILN_OP_RESHAPE) {
      if (ct->rank < 1 || ct->dims[ct->rank - 1] != N) break;
    } else if (c->op == KILN_OP_ADD && can_bias && !ch->bias && !ch->unary) {
      // v + bias, bias an f32 [N] (or [1, ..., 1, N]) computed before the
      // matmul (its value must exist when the kernel is emitted).
      if (c->operand_count != 2 || kiln_node_attr_float(c, "alpha", 1) != 1 ||
          !kiln_type_equal(ct, vt))
        break;
      int k = c->operands[0].kind == KILN_OPERAND_VALUE && c->operands[0].value == v ? 1 : 0;
      if (c->operands[k].kind != KILN_OPERAND_VALUE) break;
      const kiln_value_t *bv = &g->values[c->operands[k].value];
      bool ok = bv->type.dtype == KILN_F32 && bv->type.rank >= 1 &&
                bv->type.dims[bv->type.rank - 1] == N && (bv->node < 0 || bv->node < self);
      for (int d = 0; ok && d + 1 < bv->type.rank; ++d) ok = bv->type.dims[d] == 1;
      if (!ok) break;
      ch->bias = &e->values[c->operands[k].value];
      kept = ch->count + 1;
    } else if (kiln_lanes_op_supported(c->op) && c->operand_count == 1 && kiln_type_equal(ct, vt)) {
      ch->unary = c;
      ch->nodes[ch->count++] = u;
      kept = ch->count;
      break;
    } else {
      break;
    }
    ch->nodes[ch->count++] = u;
    v = c->results[0];
  }
  ch->count = kept;  // views after the last op taken stay nodes of their own
}

kiln_status_t kiln_lower_matmul(kiln_emitter_t *e, const kiln_node_t *n) {
  // q @ k^T -> softmax -> @ v: deferred at the first bmm, one kernel at
  // the second (lowering/ops/attention.c).
  bool attention = false;
  KILN_RETURN_IF_ERROR_PLAIN(kiln_lower_attention(e, n, &attention));
  if (attention) return NULL;
  int base = n->op == KILN_OP_ADDMM ? 1 : 0;
  const kiln_tv_t *a = &e->values[n->operands[base].value];
  const kiln_tv_t *b = &e->values[n->operands[base + 1].value];
  const kiln_type_t *rt = kiln_node_result_type(e->g, n, 0);
  kiln_dtype_t acc = kiln_math_dtype(rt->dtype);
  kiln_type_t at = *rt;
  at.dtype = acc;
  kiln_tv_t init, mm;
  char aty[256], bty[256], oty[256];
  kiln_mlir_tensor_type(&a->type, aty, sizeof(aty));
  kiln_mlir_tensor_type(&b->type, bty, sizeof(bty));
  kiln_mlir_tensor_type(&at, oty, sizeof(oty));
  mm.type = at;
  // Few rows against a linear's weight: dot products reading W in place.
  bool rd_sym = false;
  const kiln_tv_t *rd_w =
      n->op != KILN_OP_BMM ? rowdot_weight(e, a, n->operands[base + 1].value, &rd_sym) : NULL;
  // (A symbolic bf16 M with the microkernel for the large branch: see
  // rd_bf16 below.)
  if (rd_sym && rd_w->type.dtype == KILN_BF16 && !bf16_dot_applies(e, a, b)) rd_w = NULL;
  if ((!rd_w || rd_sym) && (n->op == KILN_OP_MM || n->op == KILN_OP_BMM) &&
      rt->dtype == KILN_BF16 && bf16_dot_applies(e, a, b)) {
    // A plain bf16 mm: the kernel rounds as it stores; nothing else to do.
    // (A symbolic M: under rowdot_rows the row dot products' f32 sums,
    // rounded by a pass of their own.)
    kiln_tv_t out;
    char rty[256], r1[24] = "";
    kiln_mlir_tensor_type(rt, rty, sizeof(rty));
    kiln_emit_empty(e, rt, init.ssa);
    if (rd_w) {
      kiln_tv_t sums, r;
      kiln_emit_empty(e, &at, sums.ssa);
      emit_few_rows_if(e, a, rd_w, rty, out.ssa);
      if (amx_rowdot_applies(e, a, rd_w))
        emit_amx_rowdot(e, n->operands[base].value, rd_w, sums.ssa, oty, r.ssa);
      else
        emit_rowdot(e, n->operands[base].value, rd_w, NULL, NULL, sums.ssa, oty, r.ssa);
      r.type = at;
      KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_convert(e, &r, KILN_BF16, &sums));
      emit_yield(e, sums.ssa, rty, false);
    }
    // (A batched B is packed from itself: its transposed source, K of an
    // attention's q @ k^T, is materialized by the transpose first.)
    const kiln_tv_t *bt =
        n->op == KILN_OP_BMM ? NULL : bf16_dot_bt(e, n->operands[base + 1].value);
    emit_bf16_dot(e, n->operands[base].value, b, bt, init.ssa, rty, true,
                  rd_w ? r1 : out.ssa);
    if (rd_w) emit_yield(e, r1, rty, true);
    out.type = *rt;
    kiln_emit_set_result(e, n, 0, &out);
    return NULL;
  }
  // addmm: beta * bias + alpha * (a @ b); beta = 0 ignores the bias
  // entirely. With alpha = 1 the product accumulates into beta * bias.
  double beta = n->op == KILN_OP_ADDMM ? kiln_node_attr_float(n, "beta", 1) : 0;
  double alpha = n->op == KILN_OP_ADDMM ? kiln_node_attr_float(n, "alpha", 1) : 1;
  bool bf16_dot = !rd_w && n->op != KILN_OP_BMM && acc == KILN_F32 && bf16_dot_applies(e, a, b);
  // A transposed lhs (grad_W = dY^T @ X) is read in place by both the f32
  // microkernel and the tiled matmul (through its indexing map), never
  // materialized.
  const kiln_tv_t *lhs_src = n->op != KILN_OP_BMM && e->options.lhs_transpose_map
                                 ? transposed_source(e, n->operands[base].value)
                                 : NULL;
  // A symbolic M: the row dot products below rowdot_rows, the microkernel
  // from there (an scf.if on M); Dynamo makes a batch symbolic once it has
  // seen two sizes, and the microkernel's pack of W^T for a few rows cost
  // 6x eager's time (8 x 2048 x 8192: 26.8 against 4.5 ms).
  if (rd_sym && rd_w && rd_w->type.dtype == KILN_F32 && (lhs_src || !f32_dot_applies(e, a, b)))
    rd_w = NULL;
  bool rd_f32 = rd_w && a->type.dtype == KILN_F32, rd_bf16 = rd_w && !rd_f32;
  bool f32_dot = rd_f32 || (!rd_w && !bf16_dot && n->op != KILN_OP_BMM && acc == KILN_F32 &&
                            f32_dot_applies(e, a, b) &&
                            (!lhs_src || f32_dot_transposed_applies(a, b, lhs_src)));
  // The f32 microkernel starts from an [N] bias (addmm, alpha = beta = 1).
  const kiln_tv_t *f32_bias = NULL;
  if (f32_dot && n->op == KILN_OP_ADDMM && n->operands[0].kind == KILN_OPERAND_VALUE &&
      beta == 1 && alpha == 1) {
    const kiln_tv_t *bias = &e->values[n->operands[0].value];
    if (bias->type.rank == 1 && bias->type.dtype == KILN_F32 &&
        bias->type.dims[0] == b->type.dims[1])
      f32_bias = bias;
  }
  bool bias_init = e->options.matmul_bias_init && n->op == KILN_OP_ADDMM &&
                   n->operands[0].kind == KILN_OPERAND_VALUE && beta != 0 &&
                   alpha == 1 && !bf16_dot && !f32_dot && !rd_bf16;
  if (f32_dot) {
    kiln_emit_empty(e, &at, init.ssa);
    const kiln_tv_t *w = transposed_source(e, n->operands[base + 1].value);
    if (w && (w->type.dtype != KILN_F32 || !kiln_type_is_static(&w->type))) w = NULL;
    // The nodes after it that the kernel does itself (plan_mm_chain): a
    // bias add and an elementwise op, through views. Only where nothing is
    // added after the kernel (mm, or addmm with the bias in).
    mm_chain_t ch = {0};
    if (n->op == KILN_OP_MM || f32_bias) plan_mm_chain(e, n, n->op == KILN_OP_MM, &ch);
    kiln_tv_t bias1d;
    if (ch.bias && ch.bias->type.rank != 1) {
      kiln_type_t t = ch.bias->type;
      t.rank = 1;
      t.dims[0] = b->type.dims[1];
      KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_reshape(e, ch.bias, &t, &bias1d));
      f32_bias = &bias1d;
    } else if (ch.bias) {
      f32_bias = ch.bias;
    }
    if (rd_f32 && rd_sym) {
      char r1[24], r2[24];
      emit_few_rows_if(e, a, rd_w, oty, mm.ssa);
      emit_rowdot(e, n->operands[base].value, rd_w, f32_bias, ch.unary, init.ssa, oty, r1);
      emit_yield(e, r1, oty, false);
      emit_f32_dot(e, n->operands[base].value, NULL, b, w, f32_bias, ch.unary, init.ssa, oty,
                   r2);
      emit_yield(e, r2, oty, true);
    } else if (rd_f32) {
      emit_rowdot(e, n->operands[base].value, rd_w, f32_bias, ch.unary, init.ssa, oty, mm.ssa);
    } else
      emit_f32_dot(e, n->operands[base].value, lhs_src, b, w, f32_bias, ch.unary, init.ssa,
                   oty, mm.ssa);
    bias_init = f32_bias != NULL;  // the bias is in
    if (ch.count) {
      // The last node taken gets the kernel's output (viewed to its
      // shape); the ones before it had one reader each, inside the chain,
      // and are never read.
      const kiln_node_t *last = &e->g->nodes[ch.nodes[ch.count - 1]];
      const kiln_type_t *lt = kiln_node_result_type(e->g, last, 0);
      kiln_tv_t r = mm;
      if (!kiln_type_equal(lt, &mm.type))
        KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_reshape(e, &mm, lt, &r));
      kiln_emit_set_result(e, last, 0, &r);
      for (int i = 0; i < ch.count; ++i) e->node_done[ch.nodes[i]] = true;
      return NULL;
    }
  } else if (rd_bf16 && rd_sym) {
    // f32 sums either way (the microkernel without its bf16 store); the
    // bias and the rounding follow.
    kiln_emit_empty(e, &at, init.ssa);
    char r1[24], r2[24];
    emit_few_rows_if(e, a, rd_w, oty, mm.ssa);
    if (amx_rowdot_applies(e, a, rd_w))
      emit_amx_rowdot(e, n->operands[base].value, rd_w, init.ssa, oty, r1);
    else
      emit_rowdot(e, n->operands[base].value, rd_w, NULL, NULL, init.ssa, oty, r1);
    emit_yield(e, r1, oty, false);
    emit_bf16_dot(e, n->operands[base].value, b, bf16_dot_bt(e, n->operands[base + 1].value),
                  init.ssa, oty, false, r2);
    emit_yield(e, r2, oty, true);
  } else if (rd_bf16) {
    // f32 sums of bf16 dot products (on AMX where the CPU has it); the bias
    // and the rounding follow.
    kiln_emit_empty(e, &at, init.ssa);
    if (amx_rowdot_applies(e, a, rd_w))
      emit_amx_rowdot(e, n->operands[base].value, rd_w, init.ssa, oty, mm.ssa);
    else
      emit_rowdot(e, n->operands[base].value, rd_w, NULL, NULL, init.ssa, oty, mm.ssa);
  } else if (bf16_dot) {
    // Every element is written by the kernel: no fill.
    kiln_emit_empty(e, &at, init.ssa);
    emit_bf16_dot(e, n->operands[base].value, b, bf16_dot_bt(e, n->operands[base + 1].value),
                  init.ssa, oty, false, mm.ssa);
  } else {
    if (bias_init) {
      // init = beta * bias, broadcast to [M, N] in the accumulator type.
      kiln_arg_t args[2] = {kiln_arg_operand(e, 0), kiln_arg_float(beta)};
      KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_ew(e, beta == 1 ? KILN_OP_CLONE : KILN_OP_MUL,
                                              NULL, beta == 1 ? 1 : 2, args, &at,
                                              acc, acc, &init));
    } else {
      KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_filled(e, &at, 0, &init));
    }
    kiln_emit_fresh(e, mm.ssa);
    const kiln_tv_t *at_src = lhs_src;
    if (at_src && e->options.cuda &&
        !(acc == KILN_F32 && at_src->type.dtype == KILN_F32 &&
          b->type.dtype == KILN_F32 && kiln_type_is_static(&at_src->type) &&
          kiln_type_is_static(&b->type) &&
          kiln_kernels_sgemm_applies(at_src->type.dims[1], b->type.dims[1],
                                     at_src->type.dims[0])))
      at_src = NULL;
    // A bf16 or f16 x @ W^T for the CUDA warpgroup-MMA kernel: W read in
    // place.
    const kiln_tv_t *w_src = NULL;
    if (!at_src && e->options.cuda && n->op != KILN_OP_BMM && acc == KILN_F32 &&
        (a->type.dtype == KILN_BF16 || a->type.dtype == KILN_F16) &&
        kiln_type_is_static(&a->type)) {
      w_src = transposed_source(e, n->operands[base + 1].value);
      if (w_src && !(w_src->type.dtype == a->type.dtype && kiln_type_is_static(&w_src->type) &&
                     a->type.dims[0] % 128 == 0 && w_src->type.dims[0] % 128 == 0 &&
                     kiln_kernels_wgmma_applies(e->options.cuda_sm, a->type.dims[1])))
        w_src = NULL;
    }
    if (w_src || at_src) {
      // One operand given transposed, read through its indexing map:
      // A as [K, M] (at_src) or B as [N, K] (w_src).
      const kiln_tv_t *x = w_src ? a : at_src, *y = w_src ? w_src : b;
      char xty[256], yty[256];
      kiln_mlir_tensor_type(&x->type, xty, sizeof(xty));
      kiln_mlir_tensor_type(&y->type, yty, sizeof(yty));
      kiln_sbuf_printf(&e->out,
                       "    %s = linalg.matmul indexing_maps = [affine_map<(d0, d1, "
                       "d2) -> (%s)>, affine_map<(d0, d1, d2) -> (%s)>, "
                       "affine_map<(d0, d1, d2) -> (d0, d1)>] ins(%s, %s : %s, %s) "
                       "outs(%s : %s) -> %s\n",
                       mm.ssa, w_src ? "d0, d2" : "d2, d0", w_src ? "d1, d2" : "d2, d1",
                       x->ssa, y->ssa, xty, yty, init.ssa, oty, oty);
    } else {
      char bssa[24];
      if (n->op == KILN_OP_BMM ||
          !emit_padded_bt(e, a, b, n->operands[base + 1].value, bssa))
        snprintf(bssa, sizeof(bssa), "%s", b->ssa);
      kiln_sbuf_printf(&e->out, "    %s = linalg.%s ins(%s, %s : %s, %s) outs(%s : %s) -> %s\n",
                       mm.ssa, n->op == KILN_OP_BMM ? "batch_matmul" : "matmul",
                       a->ssa, bssa, aty, bty, init.ssa, oty, oty);
    }
  }
  kiln_tv_t r = mm;
  if (n->op == KILN_OP_ADDMM && !bias_init) {
    // beta * bias + alpha * (a @ b); beta = 0 ignores the bias entirely.
    kiln_tv_t scaled = mm;
    if (alpha != 1)
      KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_binary(
          e, KILN_OP_MUL, kiln_arg_tensor(&mm), kiln_arg_float(alpha), acc,
          &scaled));
    if (beta != 0) {
      kiln_tv_t bias = e->values[n->operands[0].value], sb;
      if (beta != 1) {
        KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_binary(
            e, KILN_OP_MUL, kiln_arg_tensor(&bias), kiln_arg_float(beta), acc,
            &sb));
        bias = sb;
      }
      KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_binary(
          e, KILN_OP_ADD, kiln_arg_tensor(&bias), kiln_arg_tensor(&scaled), acc,
          &r));
    } else {
      r = scaled;
    }
  }
  kiln_tv_t out;
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_convert(e, &r, rt->dtype, &out));
  kiln_emit_set_result(e, n, 0, &out);
  return NULL;
}

// The pieces of a cat along the channels that makes graph value v
// (static, 4-D, v's dtype), or 0 when v is no such cat.
static int cat_pieces(const kiln_emitter_t *e, int32_t v, kiln_tv_t *pieces, int most) {
  if (v < 0) return 0;
  const kiln_graph_t *g = e->g;
  int32_t p = g->values[v].node;
  if (p < 0) return 0;
  const kiln_node_t *cn = &g->nodes[p];
  const kiln_type_t *vt = &g->values[v].type;
  int32_t d;
  if (cn->op != KILN_OP_CAT || vt->rank != 4 || cn->operand_count > most ||
      !kiln_normalize_dim(kiln_node_attr_int(cn, "dim", 0), 4, &d) || d != 1)
    return 0;
  for (int k = 0; k < cn->operand_count; ++k) {
    if (cn->operands[k].kind != KILN_OPERAND_VALUE) return 0;
    const kiln_tv_t *y = &e->values[cn->operands[k].value];
    if (y->type.rank != 4 || y->type.dtype != vt->dtype || !kiln_type_is_static(&y->type) ||
        y->type.dims[1] == 0)
      return 0;
    pieces[k] = *y;
  }
  return cn->operand_count;
}

enum { kPadPieces = 16 };

// Zero padding of the spatial dims of x[N, C, H, W], graph value v (-1
// when x is no graph value).
//
// On the CPU (static, more than one element) by kiln_emit_pad_planes: x
// inserted by slabs (a strided copy per slab, spread over the threads),
// then the border zero filled. When v is a cat along the channels, its pieces are
// inserted straight into the padded buffer: the cat's own buffer is then
// dead unless something else reads it (a UNet's skip connection: the cat
// and the copy of it into the padded buffer were 0.48 of its 17 ms). A
// tensor.pad reached bufferization whole and became a scalar fill loop and
// one strided memref.copy on one thread: 2.9 of the bench's resnet block's
// 21 ms. The CUDA target and symbolic sizes keep tensor.pad.
static kiln_status_t emit_pad(kiln_emitter_t *e, int32_t v, kiln_tv_t *x, int64_t lo_h,
                              int64_t lo_w, int64_t hi_h, int64_t hi_w) {
  if (!lo_h && !lo_w && !hi_h && !hi_w) return NULL;
  kiln_sbuf_t *b = &e->out;
  kiln_type_t pt = x->type;
  pt.dims[2] += lo_h + hi_h;
  pt.dims[3] += lo_w + hi_w;
  // (One element keeps tensor.pad: its insert would be one plain
  // insert_slice, whose f16 form crashed LLVM's soft promotion.)
  if (!e->options.cuda && kiln_type_is_static(&x->type) && kiln_type_numel(&x->type) > 1) {
    kiln_tv_t pieces[kPadPieces], p;
    int count = cat_pieces(e, v, pieces, kPadPieces);
    if (!count || strcmp(e->values[v].ssa, x->ssa) != 0) {
      pieces[0] = *x;
      count = 1;
    }
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_pad_planes(e, pieces, count, &pt, lo_h, lo_w, 0, &p));
    *x = p;
    return NULL;
  }
  char zero[24], xty[256], pty[256], padded[24];
  kiln_mlir_tensor_type(&x->type, xty, sizeof(xty));
  kiln_mlir_tensor_type(&pt, pty, sizeof(pty));
  int id = e->next_id++;
  kiln_emit_fresh(e, padded);
  kiln_sbuf_printf(b, "    %s = tensor.pad %s low[0, 0, %lld, %lld] high[0, 0, %lld, %lld] {\n"
                      "  ^bb0(%%p0_%d: index, %%p1_%d: index, %%p2_%d: index, %%p3_%d: index):\n",
                   padded, x->ssa, (long long)lo_h, (long long)lo_w,
                   (long long)hi_h, (long long)hi_w, id, id, id, id);
  kiln_emit_scalar_const(e, b, x->type.dtype, 0, zero);
  kiln_sbuf_printf(b, "    tensor.yield %s : %s\n  } : %s to %s\n", zero,
                   kiln_mlir_elem(x->type.dtype), xty, pty);
  snprintf(x->ssa, sizeof(x->ssa), "%s", padded);
  x->type = pt;
  return NULL;
}

// `res` = `acc` + a contraction of weights `w` and input `x` into
// out[n, g, f, p]: `loops` names the loop dims (n, g, f, p first, then the
// `reductions` reduction loops), `wmap` and `xmap` the operands' indices
// (the contraction schedule's form: f x p register tiles, p along the
// vector). Block arguments %wa<id>, %xb<id> (dtype `el`) and %acc<id>
// (`ael`); operands widen to the accumulator (f16/bf16 in f32), as
// linalg.conv's own body does.
typedef struct {
  const char *loops, *wmap, *xmap;
  int reductions;
} mac_form_t;

static void emit_mac_generic(kiln_sbuf_t *b, const char *res, const mac_form_t *form,
                             const char *w, const char *x, const char *wty,
                             const char *xty, const char *acc, int id,
                             const char *el, const char *ael,
                             const char *result_type) {
  kiln_sbuf_printf(b,
                   "    %s = linalg.generic {indexing_maps = ["
                   "affine_map<(%s) -> (%s)>, affine_map<(%s) -> (%s)>, "
                   "affine_map<(%s) -> (n, g, f, p)>], iterator_types = "
                   "[\"parallel\", \"parallel\", \"parallel\", \"parallel\"",
                   res, form->loops, form->wmap, form->loops, form->xmap, form->loops);
  for (int r = 0; r < form->reductions; ++r) kiln_sbuf_puts(b, ", \"reduction\"");
  kiln_sbuf_printf(b, "]} ins(%s, %s : %s, %s) outs(%s : %s) {\n"
                      "    ^bb0(%%wa%d: %s, %%xb%d: %s, %%acc%d: %s):\n",
                   w, x, wty, xty, acc, result_type, id, el, id, el, id, ael);
  const char *wa = "wa", *xb = "xb";
  if (strcmp(el, ael) != 0) {
    kiln_sbuf_printf(b, "      %%wx%d = arith.extf %%wa%d : %s to %s\n"
                        "      %%xx%d = arith.extf %%xb%d : %s to %s\n",
                     id, id, el, ael, id, id, el, ael);
    wa = "wx";
    xb = "xx";
  }
  // contract: LLVM fuses the pair into one FMA (the register tile of a
  // convolution is vectorized as an outer product, not a vector.contract).
  kiln_sbuf_printf(b, "      %%pr%d = arith.mulf %%%s%d, %%%s%d fastmath<contract> : %s\n"
                      "      %%sm%d = arith.addf %%acc%d, %%pr%d fastmath<contract> : %s\n"
                      "      linalg.yield %%sm%d : %s\n"
                      "    } -> %s\n",
                   id, wa, id, xb, id, ael, id, id, id, ael, id, ael, result_type);
}

// The stride-1 form's extra zero padding below and right of the padded
// input x[N, C, H, W] (see emit_conv_taps): one row at the bottom when
// KW > 1 keeps the last tap in bounds; extra columns on the right (up to
// 31) make the wide grid OH x Wp split into register tiles as wide as pays:
// each choice costs its grid's size over the tile width's measured
// efficiency (32 lanes 1, 16 0.8, 8 0.5, less 0.25; a register tile one
// column wide also loses its accumulator column when the schedule folds
// the tile's unit dims). An odd OH (35 x 35) gets no tile wider than 8
// from up to 7 extra columns: Wp 40 with 8-lane tiles ran a 3x3 layer,
// 48 -> 64 channels, in 1.87 ms, Wp 48 with 16-lane ones in 1.48 ms.
static void flat_extra(int64_t OH, int64_t W, int64_t KW, int64_t *rows, int64_t *cols) {
  int64_t extra = 0;
  double best = 0;
  for (int64_t x = 0; x < 32; ++x) {
    int64_t p = OH * (W + x), w = 1;
    while (w < 32 && p % (w * 2) == 0) w *= 2;
    double eff = w >= 32 ? 1.0 : w >= 16 ? 0.8 : w >= 8 ? 0.5 : 0.25;
    double cost = (double)p / eff;
    if (x == 0 || cost < best) best = cost, extra = x;
  }
  *rows = KW > 1 ? 1 : 0;
  *cols = extra;
}

// The f32 convolution microkernel (AVX-512), for the stride-1 flat form
// of emit_conv_taps: out[n, f, p] (+)= sum_{c, kh, kw} W[f, c, kh, kw] *
// X[n, c, kh*dh*Wp + kw*dw + p], with X the padded input flattened to rows
// of Wp, for p < P: OH * Wp, or that rounded up to 16 into a scratch for
// small grids (emit_conv_taps).
//
// Threads take (image, chunk of PC pixels, group of filters) tasks
// (scf.forall; filter groups only where images x chunks are few; PC is at
// least one 48-pixel tile, else the schedule's contraction takes the
// convolution). In a task the channels run in blocks of CB (about 288
// multiply-adds of taps per block: a register tile's input rows, some 20
// KB for 32 channels of a 3x3 kernel, and its filters' weights, 9 KB, stay
// in L1 over the block's taps; the block's rows of the whole chunk stay in
// L2 while the tiles go by), and per block each register
// tile of 8 filters x 48 pixels (the chunk's last pixels in tiles of 16)
// keeps its 24 accumulators in registers over the block's (c, kh, kw):
// per step three vector loads of the input (unaligned, in place), eight
// broadcasts of weights and 24 FMAs. The first block starts from zeros
// (`zero_start`) or from the accumulator given (a strided convolution's
// phases add up), later ones from the tile's partial sums.
//
// The schedule's generic contraction ran 8 x 32 tiles (16 accumulators;
// its 2-D vectors made a 48-wide tile <48 x float> rows, which LLVM
// widens to 64 lanes and spills) over all 64 channels of a 3x3 layer at
// once, whose input rows (36 KB per tile) and weights (18 KB) outgrow L1:
// a C model of both loop nests on the Xeon (8x64x56x56, 64 filters) ran
// 5.8-6.0 ms against 5.0 with 48-wide tiles and blocks of 32 channels.
typedef struct {
  const char *x, *xty;  // X [N, 1, C, L] (flattened padded input)
  const char *w, *wty;  // W [1, F, C, KH, KW]
  const char *acc;      // accumulator [N, 1, F, P]: tensor.empty or partial sums
  const char *aty;
  bool zero_start;
  long long N, C, F, KH, KW, P, dh, dw;  // dh = dilation_h * Wp
  // Set by emit_conv_dot from its tiles (conv_dot_tiles): a task's chunk
  // tensor type, the register tile (`rows` filters x `nv` vectors of
  // pixels), the pixels of a chunk, the channels of a block, the filters
  // of a task.
  const char *cty;
  int rows, nv;
  long long pc, cb, fp;
} conv_dot_t;

// The heuristic's register tile (lib/autotune's KILN_KERNEL_CONV_DOT),
// which also decides which grids the kernel takes (a chunk of at least one
// tile) before the tiles are asked for: filters a multiple of 8.
enum { kConvDotRows = 8, kConvDotVecs = 3, kConvDotMaxAcc = 32 };

// Whether the microkernel takes a flat-form convolution of `G` groups,
// `F` filters per group, input, weight and accumulator dtypes.
static bool conv_dot_applies(const kiln_emitter_t *e, kiln_dtype_t xd, kiln_dtype_t wd,
                             kiln_dtype_t ad, int64_t G, int64_t F) {
  return e->options.x86_f32_dot && !e->options.cuda && xd == KILN_F32 && wd == KILN_F32 &&
         ad == KILN_F32 && G == 1 && F % kConvDotRows == 0;
}

// One register tile, `nv` vectors wide, of rows %f .. %f + d->rows - 1
// (filters %f0 + %f ..) and columns %pt .. of the chunk tensor `cur` (typed
// d->cty: [filters per task, PC/16, 16]); the tensor it yields is named in
// `next`.
static void emit_conv_dot_tile(kiln_sbuf_t *o, const conv_dot_t *d, const char *tag, int nv,
                               const char *cur, char next[24]) {
  const int R = d->rows, K = R * nv;
  char vt[kConvDotMaxAcc * 18 + 1];
  vt[0] = 0;
  for (int t = 0; t < K; ++t) strcat(vt, t ? ", vector<16xf32>" : "vector<16xf32>");
  for (int r = 0; r < R; ++r)
    kiln_sbuf_printf(o, "            %%fi%s%d = affine.apply affine_map<(d0, d1) -> (d0 + d1 + %d)>"
                        "(%%f0, %%f)\n", tag, r, r);
  // Partial sums: zeros in the first channel block, else the tile's, read
  // as one [8, nv, 16] transfer (one read and one write per tile keep the
  // schedule's subset hoisting, which compares every pair of a loop's
  // reads and writes, cheap: with a transfer per vector it took 0.1 s).
  kiln_sbuf_printf(o, "            %%pv%s = arith.divui %%pt, %%c16 : index\n", tag);
  if (d->zero_start)
    kiln_sbuf_printf(o, "            %%ini%s:%d = scf.if %%first -> (%s) {\n"
                        "              scf.yield ",
                     tag, K, vt);
  else
    kiln_sbuf_printf(o, "            %%ini%s:%d = scf.execute_region -> (%s) {\n", tag, K, vt);
  for (int t = 0; d->zero_start && t < K; ++t) kiln_sbuf_printf(o, "%s%%zero", t ? ", " : "");
  if (d->zero_start) kiln_sbuf_printf(o, " : %s\n            } else {\n", vt);
  kiln_sbuf_printf(o, "              %%ldt%s = vector.transfer_read %s[%%f, %%pv%s, %%c0], %%padf "
                      "{in_bounds = [true, true, true]} : %s, vector<%dx%dx16xf32>\n",
                   tag, cur, tag, d->cty, R, nv);
  for (int t = 0; t < K; ++t)
    kiln_sbuf_printf(o, "              %%ld%s%d = vector.extract %%ldt%s[%d, %d] : "
                        "vector<16xf32> from vector<%dx%dx16xf32>\n",
                     tag, t, tag, t / nv, t % nv, R, nv);
  kiln_sbuf_puts(o, "              scf.yield ");
  for (int t = 0; t < K; ++t) kiln_sbuf_printf(o, "%s%%ld%s%d", t ? ", " : "", tag, t);
  kiln_sbuf_printf(o, " : %s\n            }\n", vt);
  kiln_sbuf_printf(o, "            %%xo%s = arith.addi %%p0, %%pt : index\n", tag);
  // (c, kh, kw): the block's channels, every tap.
  static const char *const lv[3] = {"c", "h", "w"};
  for (int l = 0; l < 3; ++l) {
    kiln_sbuf_printf(o, "            %%s%s%s:%d = scf.for %%k%s%s = %s to %s step %%c1 iter_args(",
                     tag, lv[l], K, tag, lv[l], l == 0 ? "%cb" : "%c0",
                     l == 0 ? "%ce" : l == 1 ? "%ckh" : "%ckw");
    for (int t = 0; t < K; ++t) {
      if (l == 0)
        kiln_sbuf_printf(o, "%s%%a%sc%d = %%ini%s#%d", t ? ", " : "", tag, t, tag, t);
      else
        kiln_sbuf_printf(o, "%s%%a%s%s%d = %%a%s%s%d", t ? ", " : "", tag, lv[l], t, tag,
                         lv[l - 1], t);
    }
    kiln_sbuf_printf(o, ") -> (%s) {\n", vt);
  }
  kiln_sbuf_printf(o, "              %%off%s = affine.apply affine_map<(d0, d1, d2) -> "
                      "(d0 + d1 * %lld + d2 * %lld)>(%%xo%s, %%k%sh, %%k%sw)\n",
                   tag, d->dh, d->dw, tag, tag, tag);
  for (int j = 0; j < nv; ++j) {
    kiln_sbuf_printf(o, "              %%xi%s%d = affine.apply affine_map<(d0) -> (d0 + %d)>"
                        "(%%off%s)\n", tag, j, 16 * j, tag);
    kiln_sbuf_printf(o, "              %%b%s%d = vector.transfer_read %s[%%cn, %%c0, %%k%sc, "
                        "%%xi%s%d], %%padf {in_bounds = [true]} : %s, vector<16xf32>\n",
                     tag, j, d->x, tag, tag, j, d->xty);
  }
  for (int r = 0; r < R; ++r) {
    kiln_sbuf_printf(o, "              %%ws%s%d = tensor.extract %s[%%c0, %%fi%s%d, %%k%sc, "
                        "%%k%sh, %%k%sw] : %s\n"
                        "              %%wb%s%d = vector.broadcast %%ws%s%d : f32 to "
                        "vector<16xf32>\n",
                     tag, r, d->w, tag, r, tag, tag, tag, d->wty, tag, r, tag, r);
    for (int j = 0; j < nv; ++j)
      kiln_sbuf_printf(o, "              %%y%s%d = vector.fma %%wb%s%d, %%b%s%d, %%a%sw%d : "
                          "vector<16xf32>\n",
                       tag, r * nv + j, tag, r, tag, j, tag, r * nv + j);
  }
  kiln_sbuf_puts(o, "              scf.yield ");
  for (int t = 0; t < K; ++t) kiln_sbuf_printf(o, "%s%%y%s%d", t ? ", " : "", tag, t);
  kiln_sbuf_printf(o, " : %s\n", vt);
  for (int l = 2; l >= 0; --l) {
    kiln_sbuf_puts(o, "            }\n");
    if (l == 0) break;
    kiln_sbuf_puts(o, "            scf.yield ");
    for (int t = 0; t < K; ++t)
      kiln_sbuf_printf(o, "%s%%s%s%s#%d", t ? ", " : "", tag, lv[l], t);
    kiln_sbuf_printf(o, " : %s\n", vt);
  }
  kiln_sbuf_printf(o, "            %%sv%s0 = arith.constant dense<0.0> : vector<%dx%dx16xf32>\n",
                   tag, R, nv);
  for (int t = 0; t < K; ++t)
    kiln_sbuf_printf(o, "            %%sv%s%d = vector.insert %%s%sc#%d, %%sv%s%d [%d, %d] : "
                        "vector<16xf32> into vector<%dx%dx16xf32>\n",
                     tag, t + 1, tag, t, tag, t, t / nv, t % nv, R, nv);
  kiln_sbuf_printf(o, "            %%st%s = vector.transfer_write %%sv%s%d, %s[%%f, %%pv%s, %%c0] "
                      "{in_bounds = [true, true, true]} : vector<%dx%dx16xf32>, %s\n",
                   tag, tag, K, cur, tag, R, nv, d->cty);
  snprintf(next, 24, "%%st%s", tag);
}

// The largest multiple of 16 up to 512 that divides P: the heuristic's
// pixels per task (lib/autotune's heuristic_conv_dot), which decides, before
// the tiles are asked for, whether a grid has room for the kernel.
static long long conv_dot_chunk(long long P) {
  for (long long c = 512; c >= 16; c -= 16)
    if (P % c == 0) return c;
  return 0;
}

// The convolution microkernel's own choice of the flat form's padding
// (kiln_lower_conv, instead of flat_extra's) for small grids: no extra
// columns, P = OH * Wp rounded up to 16 computed (emit_conv_taps), and the
// rows the extra pixels' taps need. Taken where it computes at least an
// eighth fewer pixels than flat_extra's grid (a 7 x 7 layer, Wp 9: 64
// pixels a channel against 7 x 16 = 112), or where flat_extra's grid has
// no chunk the microkernel takes. False where it does not apply (the
// caller's rows and cols then stay flat_extra's).
static bool conv_dot_grid(int64_t OH, int64_t Wpad, int64_t KW, int64_t dw, int64_t flat_cols,
                          int64_t *rows, int64_t *cols) {
  int64_t pmin = OH * Wpad, up = (pmin + 15) / 16 * 16, pflat = OH * (Wpad + flat_cols);
  // Also where flat_extra's grid has no 48-pixel chunk (the microkernel
  // would not take it: 7 x 8 = 56 pixels).
  if (pmin > 512 || up < 16 * kConvDotVecs ||
      (up * 8 > pflat * 7 && conv_dot_chunk(pflat) >= 16 * kConvDotVecs))
    return false;
  // The last computed pixel's last tap: up - 1 + (KH-1)*dh*Wp + (KW-1)*dw
  // must stay below (OH + (KH-1)*dh + rows) * Wp.
  int64_t r = (up - 1 + (KW - 1) * dw) / Wpad - OH + 1;
  *rows = r > 0 ? r : 0;
  *cols = 0;
  return true;
}

// The microkernel's tiles (lib/autotune's KILN_KERNEL_CONV_DOT,
// microkernel_tiles). Its identity for the tuning database: its sizes and
// the taps' strides.
static void conv_dot_tiles(const kiln_emitter_t *e, const conv_dot_t *d,
                           kiln_tile_config_t *out) {
  kiln_kernel_desc_t kd;
  memset(&kd, 0, sizeof(kd));
  kd.kind = KILN_KERNEL_CONV_DOT;
  kd.loop_count = 5;
  int64_t range[5] = {d->N, d->F, d->P, d->C, d->KH * d->KW};
  memcpy(kd.range, range, sizeof(range));
  kd.reduction_mask = (1u << 3) | (1u << 4);
  kd.m_dim = 1;
  kd.n_dim = 2;
  kd.transpose_dim = -1;
  kd.elem_bytes = 4;
  char id[192];
  snprintf(id, sizeof(id), "conv_dot n=%lld f=%lld p=%lld c=%lld kh=%lld kw=%lld dh=%lld "
           "dw=%lld zero=%d", d->N, d->F, d->P, d->C, d->KH, d->KW, d->dh, d->dw,
           d->zero_start);
  microkernel_tiles(e, id, &kd, out);
}

// The kernel; the result (typed d->aty) is named in `out`. Its tiles
// (conv_dot_tiles; the heuristic's in lib/autotune says why): tasks of
// (image, chunk of PC pixels, group of FP filters), channels in blocks of
// CB, register tiles of `rows` filters x 16 * `nv` pixels, the chunk's
// last PC % (16 * nv) pixels in tiles of 16.
static void emit_conv_dot(kiln_emitter_t *e, const conv_dot_t *dd, char out[24]) {
  kiln_sbuf_t *o = &e->out;
  kiln_tile_config_t tc;
  conv_dot_tiles(e, dd, &tc);
  conv_dot_t dk = *dd;
  dk.rows = (int)tc.reg[1];
  dk.nv = (int)(tc.reg[2] / 16);
  dk.pc = tc.forall[2] ? tc.forall[2] : dd->P;
  dk.cb = tc.cache[3] ? tc.cache[3] : dd->C;
  dk.fp = tc.forall[1] ? tc.forall[1] : dd->F;
  long long PC = dk.pc, CB = dk.cb, FP = dk.fp, FG = dd->F / FP, px = 16LL * dk.nv;
  long long full = PC / px * px;
  char cty[64];
  snprintf(cty, sizeof(cty), "tensor<%lldx%lldx16xf32>", FP, PC / 16);
  dk.cty = cty;
  const conv_dot_t *d = &dk;
  kiln_emit_fresh(e, out);
  kiln_sbuf_printf(o,
      "    %s = scf.forall (%%cn, %%cq, %%cg) in (%lld, %lld, %lld) shared_outs(%%co = %s) -> "
      "(%s) {\n"
      "      %%c0 = arith.constant 0 : index\n"
      "      %%c1 = arith.constant 1 : index\n"
      "      %%crt = arith.constant %d : index\n"
      "      %%c16 = arith.constant 16 : index\n"
      "      %%cpt = arith.constant %lld : index\n"
      "      %%cC = arith.constant %lld : index\n"
      "      %%cCB = arith.constant %lld : index\n"
      "      %%cF = arith.constant %lld : index\n"
      "      %%cfull = arith.constant %lld : index\n"
      "      %%cPC = arith.constant %lld : index\n"
      "      %%ckh = arith.constant %lld : index\n"
      "      %%ckw = arith.constant %lld : index\n"
      "      %%padf = arith.constant 0.0 : f32\n"
      "      %%zero = arith.constant dense<0.0> : vector<16xf32>\n",
      out, d->N, d->P / PC, FG, d->acc, d->aty, d->rows, px, d->C, CB, FP, full, PC, d->KH,
      d->KW);
  // The task's block of the accumulator, viewed as [FP, PC/16, 16].
  kiln_sbuf_printf(o,
      "      %%p0 = affine.apply affine_map<(d0) -> (d0 * %lld)>(%%cq)\n"
      "      %%f0 = affine.apply affine_map<(d0) -> (d0 * %lld)>(%%cg)\n"
      "      %%blk2 = tensor.extract_slice %%co[%%cn, 0, %%f0, %%p0] [1, 1, %lld, %lld] "
      "[1, 1, 1, 1] : %s to tensor<%lldx%lldxf32>\n"
      "      %%blk = tensor.expand_shape %%blk2 [[0], [1, 2]] output_shape [%lld, %lld, 16] : "
      "tensor<%lldx%lldxf32> into %s\n",
      PC, FP, FP, PC, d->aty, FP, PC, FP, PC / 16, FP, PC, cty);
  kiln_sbuf_printf(o,
      "      %%rb = scf.for %%cb = %%c0 to %%cC step %%cCB iter_args(%%cdt0 = %%blk) -> (%s) {\n"
      "        %%ce = affine.min affine_map<(d0) -> (d0 + %lld, %lld)>(%%cb)\n"
      "        %%first = arith.cmpi eq, %%cb, %%c0 : index\n"
      "        %%rf = scf.for %%f = %%c0 to %%cF step %%crt iter_args(%%cdt1 = %%cdt0) -> (%s) {\n",
      cty, CB, d->C, cty);
  char next[24] = "%cdt1";
  if (full) {
    kiln_sbuf_printf(o, "          %%rp = scf.for %%pt = %%c0 to %%cfull step %%cpt "
                        "iter_args(%%cdt2 = %%cdt1) -> (%s) {\n", cty);
    emit_conv_dot_tile(o, d, "", d->nv, "%cdt2", next);
    kiln_sbuf_printf(o, "            scf.yield %s : %s\n          }\n", next, cty);
    snprintf(next, sizeof(next), "%%rp");
  }
  if (full < PC) {
    kiln_sbuf_printf(o, "          %%rr = scf.for %%pt = %%cfull to %%cPC step %%c16 "
                        "iter_args(%%cdt3 = %s) -> (%s) {\n", next, cty);
    emit_conv_dot_tile(o, d, "r", 1, "%cdt3", next);
    kiln_sbuf_printf(o, "            scf.yield %s : %s\n          }\n", next, cty);
    snprintf(next, sizeof(next), "%%rr");
  }
  kiln_sbuf_printf(o,
      "          scf.yield %s : %s\n"
      "        }\n"
      "        scf.yield %%rf : %s\n"
      "      }\n"
      "      %%rb2 = tensor.collapse_shape %%rb [[0], [1, 2]] : %s into tensor<%lldx%lldxf32>\n"
      "      scf.forall.in_parallel {\n"
      "        tensor.parallel_insert_slice %%rb2 into %%co[%%cn, 0, %%f0, %%p0] [1, 1, %lld, %lld] "
      "[1, 1, 1, 1] : tensor<%lldx%lldxf32> into %s\n"
      "      }\n"
      "    }\n",
      next, cty, cty, cty, FP, PC, FP, PC, FP, PC, d->aty);
}

// A convolution as contractions the contraction schedule register-tiles
// like a matmul (f x p, p along the vector):
//   out[n, g, f, p] = sum_{c, kh, kw} W[g, f, c, kh, kw] * X[n, g, c, tap(p)]
// With stride 1, over the padded input flattened to rows of Wp, the output
// is computed on a grid OW -> Wp columns wide, so tap (kh, kw) of channel c
// is the contiguous run of the input starting at kh*d*Wp + kw*d (extra
// zero rows at the bottom keep the last tap in bounds; extra zero columns
// make OH * Wp split into register tiles wide enough to pay, flat_extra,
// or none where the microkernel computes a small grid rounded up to 16
// pixels, conv_dot_grid);
// the Wp - OW extra columns are dropped at the end. Other strides (where
// emit_conv_phases does not take them): one contraction per tap over its
// strided window.
// linalg.conv_2d left to the loop lowering ran scalar, ~50x slower than
// PyTorch on a 3x3 layer; an im2col gather with an affine input map
// (oh*s + kh) was left unvectorized.
static kiln_status_t emit_conv_taps(kiln_emitter_t *e, kiln_tv_t x,
                                    const kiln_tv_t *w, const kiln_type_t *ot,
                                    const int64_t st[2], const int64_t dl[2],
                                    int64_t G, const kiln_tv_t *init,
                                    kiln_tv_t *out, kiln_tv_t *wide_out,
                                    kiln_tv_t *acc_out) {
  kiln_sbuf_t *b = &e->out;
  wide_out->ssa[0] = 0;
  int64_t N = x.type.dims[0], C = x.type.dims[1] / G;
  int64_t F = w->type.dims[0] / G, KH = w->type.dims[2], KW = w->type.dims[3];
  int64_t OH = ot->dims[2], OW = ot->dims[3];
  bool flat = st[0] == 1 && st[1] == 1;
  int64_t Hp = x.type.dims[2], Wp = x.type.dims[3];
  int64_t P = flat ? OH * Wp : OH * OW;
  const char *el = kiln_mlir_elem(x.type.dtype);
  const char *ael = kiln_mlir_elem(ot->dtype);
  // x as [N, G, C, Hp * Wp] (stride 1) or [N, G, C, Hp, Wp]; w as
  // [G, F, C, KH, KW].
  kiln_type_t xg = x.type, wg = w->type, bt = x.type, tt = x.type, at = *ot;
  if (flat) {
    xg.rank = 4;
    int64_t d[4] = {N, G, C, Hp * Wp};
    memcpy(xg.dims, d, sizeof(d));
  } else {
    xg.rank = 5;
    int64_t d[5] = {N, G, C, Hp, Wp};
    memcpy(xg.dims, d, sizeof(d));
  }
  wg.rank = 5;
  int64_t wd[5] = {G, F, C, KH, KW};
  memcpy(wg.dims, wd, sizeof(wd));
  bt.rank = 4;  // one tap's operand [N, G, C, P]
  int64_t bd[4] = {N, G, C, P};
  memcpy(bt.dims, bd, sizeof(bd));
  tt.rank = 3;  // one tap's weights [G, F, C]
  int64_t td[3] = {G, F, C};
  memcpy(tt.dims, td, sizeof(td));
  at.rank = 4;  // the accumulator [N, G, F, P]
  int64_t ad[4] = {N, G, F, P};
  memcpy(at.dims, ad, sizeof(ad));
  kiln_tv_t xv, wv, acc, scratch = {.ssa = ""};
  kiln_emit_view(e, &x, &xg, &xv);
  kiln_emit_view(e, w, &wg, &wv);
  // The microkernel computes P_dot >= P pixels: P itself where P has a
  // chunk of at least one 48-pixel tile, else (small grids, P up to 512)
  // P rounded up to 16 into a scratch [N, 1, F, P_dot], whose first P
  // columns are then copied out, where the extra pixels' taps stay inside
  // the padded input (conv_dot_grid gives the rows). A strided layer's
  // phases pass that scratch from one phase to the next (`init` then has
  // P_dot columns; *acc_out is the scratch).
  int64_t P_dot = 0;
  if (flat && conv_dot_applies(e, x.type.dtype, w->type.dtype, ot->dtype, G, F)) {
    int64_t up = (P + 15) / 16 * 16;
    if (conv_dot_chunk(P) >= 16 * kConvDotVecs && (!init || init->type.dims[3] == P))
      P_dot = P;
    else if ((!init || init->type.dims[3] == up) && P <= 512 && up >= 16 * kConvDotVecs &&
             up - 1 + (KH - 1) * dl[0] * Wp + (KW - 1) * dl[1] < Hp * Wp)
      P_dot = up;
  }
  if (init && init->type.dims[3] != P && P_dot == 0)
    return kiln_make_status(KILN_STATUS_INTERNAL,
                            "convolution: a phase's accumulator has %lld columns, the "
                            "grid %lld", (long long)init->type.dims[3], (long long)P);
  bool dot = P_dot > 0;
  if (init)
    acc = *init;
  else if (dot)
    acc.type = at;  // a tensor.empty, made below (the kernel starts from zeros)
  else
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_filled(e, &at, 0, &acc));
  char xty[256], wty[256], bty[256], tty[256], aty[256];
  kiln_mlir_tensor_type(&xg, xty, sizeof(xty));
  kiln_mlir_tensor_type(&wg, wty, sizeof(wty));
  kiln_mlir_tensor_type(&bt, bty, sizeof(bty));
  kiln_mlir_tensor_type(&tt, tty, sizeof(tty));
  kiln_mlir_tensor_type(&at, aty, sizeof(aty));
  if (flat) {
    // Direct: the contraction reads tap (kh, kw) of channel c as the run of
    // the flattened input at kh*d*Wp + kw*d + p; its reduction loops
    // (c, kh, kw) keep the accumulators in registers across all taps. The
    // schedule's register tile is one (c, kh, kw) step, whose unit loops it
    // folds away: plain maps, vector loads of the input in place. (An
    // im2col copy before one K = C*KH*KW contraction wrote and read KH*KW
    // copies of the input: 3x3, 64 channels, 8x56x56 took 15.2 ms against
    // 10.4 direct.)
    char fmap[96];
    snprintf(fmap, sizeof(fmap), "n, g, c, kh * %lld + kw * %lld + p",
             (long long)(dl[0] * Wp), (long long)dl[1]);
    mac_form_t form = {"n, g, f, p, c, kh, kw", "g, f, c, kh, kw", fmap, 3};
    char next[24];
    if (dot) {
      kiln_type_t dt = at;
      dt.dims[3] = P_dot;
      char dty[256];
      kiln_mlir_tensor_type(&dt, dty, sizeof(dty));
      if (!init) kiln_emit_empty(e, &dt, acc.ssa);
      conv_dot_t d = {.x = xv.ssa, .xty = xty, .w = wv.ssa, .wty = wty, .acc = acc.ssa,
                      .aty = dty, .zero_start = init == NULL, .N = N, .C = C, .F = F,
                      .KH = KH, .KW = KW, .P = P_dot, .dh = dl[0] * Wp, .dw = dl[1]};
      emit_conv_dot(e, &d, next);
      scratch = (kiln_tv_t){.type = dt};
      snprintf(scratch.ssa, sizeof(scratch.ssa), "%s", next);
      if (P_dot > P) {
        // The grid's P columns, copied out of the scratch by threads.
        char sl[24], empty[24], cp[24];
        kiln_emit_fresh(e, sl);
        kiln_emit_empty(e, &at, empty);
        kiln_emit_fresh(e, cp);
        kiln_sbuf_printf(b,
            "    %s = tensor.extract_slice %s[0, 0, 0, 0] [%lld, 1, %lld, %lld] [1, 1, 1, 1] : "
            "%s to %s\n"
            "    %s = linalg.copy ins(%s : %s) outs(%s : %s) -> %s\n",
            sl, next, (long long)N, (long long)F, (long long)P, dty, aty, cp, sl, aty, empty,
            aty, aty);
        snprintf(next, sizeof(next), "%s", cp);
      }
    } else {
      kiln_emit_fresh(e, next);
      emit_mac_generic(b, next, &form, wv.ssa, xv.ssa, wty, xty, acc.ssa,
                       e->next_id++, el, ael, aty);
    }
    snprintf(acc.ssa, sizeof(acc.ssa), "%s", next);
    acc.type = at;
  }
  for (int64_t kh = 0; !flat && kh < KH; ++kh)
    for (int64_t kw = 0; kw < KW; ++kw) {
      char xt[24], wt[24], next[24];
      kiln_emit_fresh(e, xt);
      {
        kiln_type_t win = xg;
        win.dims[3] = OH;
        win.dims[4] = OW;
        char wnty[256], wn[24];
        kiln_mlir_tensor_type(&win, wnty, sizeof(wnty));
        kiln_emit_fresh(e, wn);
        kiln_sbuf_printf(b, "    %s = tensor.extract_slice %s[0, 0, 0, %lld, %lld] [%lld, "
                            "%lld, %lld, %lld, %lld] [1, 1, 1, %lld, %lld] : %s to %s\n",
                         wn, xv.ssa, (long long)(kh * dl[0]), (long long)(kw * dl[1]),
                         (long long)N, (long long)G, (long long)C, (long long)OH,
                         (long long)OW, (long long)st[0], (long long)st[1], xty, wnty);
        kiln_sbuf_printf(b, "    %s = tensor.collapse_shape %s [[0], [1], [2], [3, 4]] : "
                            "%s into %s\n", xt, wn, wnty, bty);
      }
      kiln_emit_fresh(e, wt);
      kiln_sbuf_printf(b, "    %s = tensor.extract_slice %s[0, 0, 0, %lld, %lld] [%lld, %lld, "
                          "%lld, 1, 1] [1, 1, 1, 1, 1] : %s to %s\n",
                       wt, wv.ssa, (long long)kh, (long long)kw, (long long)G,
                       (long long)F, (long long)C, wty, tty);
      kiln_emit_fresh(e, next);
      int id = e->next_id++;
      static const mac_form_t tap = {"n, g, f, p, c", "g, f, c", "n, g, c, p", 1};
      emit_mac_generic(b, next, &tap, wt, xt, tty, bty, acc.ssa, id, el, ael, aty);
      snprintf(acc.ssa, sizeof(acc.ssa), "%s", next);
    }
  *acc_out = scratch.ssa[0] ? scratch : acc;
  // [N, G, F, P] -> [N, G*F, OH, OW]; with stride 1 the Wp - OW extra
  // columns of each output row are dropped.
  kiln_type_t wide = *ot;
  if (flat) wide.dims[3] = Wp;
  kiln_tv_t r;
  kiln_emit_view(e, &acc, &wide, &r);
  if (!flat || Wp == OW) {
    *out = r;
    return NULL;
  }
  *wide_out = r;
  char wty2[256], oty[256];
  kiln_mlir_tensor_type(&wide, wty2, sizeof(wty2));
  kiln_mlir_tensor_type(ot, oty, sizeof(oty));
  kiln_emit_fresh(e, out->ssa);
  out->type = *ot;
  kiln_sbuf_printf(b, "    %s = tensor.extract_slice %s[0, 0, 0, 0] [%lld, %lld, %lld, %lld] "
                      "[1, 1, 1, 1] : %s to %s\n",
                   out->ssa, r.ssa, (long long)N, (long long)(G * F), (long long)OH,
                   (long long)OW, wty2, oty);
  return NULL;
}

// A depthwise convolution (one input channel and one filter per group:
// MobileNet's 3x3 layers) as one elementwise generic over the output
// [N, C, OH, OW]: its operands are the KH x KW tap windows of the padded
// input (strided slices, one per tap, read in place) and each tap's
// weights [C] (broadcast over the pixels); its body sums the KH x KW
// products. One pass over the output, vectorized along OW, threads over
// the images and channels; the elementwise ops after it (bias, batch
// norm, ReLU6) fuse into it. As a grouped contraction it had no filters to
// fill a register tile, and tap by tap each tap was a pass of its own over
// the accumulator (a 3x3 stride-2 layer on [2, 96, 112, 112]: nine passes,
// 3.0 ms; eager 1.0). `x` is padded already.
static void emit_conv_depthwise(kiln_emitter_t *e, const kiln_tv_t *x, const kiln_tv_t *w,
                                const kiln_type_t *ot, const int64_t st[2], kiln_tv_t *out) {
  kiln_sbuf_t *b = &e->out;
  const int64_t N = ot->dims[0], C = ot->dims[1], OH = ot->dims[2], OW = ot->dims[3];
  const int64_t KH = w->type.dims[2], KW = w->type.dims[3], T = KH * KW;
  kiln_type_t w2t = {.dtype = w->type.dtype, .rank = 2, .dims = {C, T}};
  kiln_tv_t w2;
  kiln_emit_view(e, w, &w2t, &w2);
  char xty[256], wty[64], oty[256], wcty[64];
  kiln_mlir_tensor_type(&x->type, xty, sizeof(xty));
  kiln_mlir_tensor_type(&w2t, wty, sizeof(wty));
  kiln_mlir_tensor_type(ot, oty, sizeof(oty));
  kiln_type_t wct = {.dtype = w->type.dtype, .rank = 1, .dims = {C}};
  kiln_mlir_tensor_type(&wct, wcty, sizeof(wcty));
  kiln_type_t wint = x->type;
  wint.dims[2] = OH;
  wint.dims[3] = OW;
  char winty[256];
  kiln_mlir_tensor_type(&wint, winty, sizeof(winty));
  int id = e->next_id++;
  for (int64_t t = 0; t < T; ++t)
    kiln_sbuf_printf(b,
        "    %%dwx%d_%lld = tensor.extract_slice %s[0, 0, %lld, %lld] [%lld, %lld, %lld, %lld] "
        "[1, 1, %lld, %lld] : %s to %s\n"
        "    %%dww%d_%lld = tensor.extract_slice %s[0, %lld] [%lld, 1] [1, 1] : %s to %s\n",
        id, (long long)t, x->ssa, (long long)(t / KW), (long long)(t % KW), (long long)N,
        (long long)C, (long long)OH, (long long)OW, (long long)st[0], (long long)st[1], xty,
        winty, id, (long long)t, w2.ssa, (long long)t, (long long)C, wty, wcty);
  char empty[24];
  kiln_emit_empty(e, ot, empty);
  kiln_emit_fresh(e, out->ssa);
  out->type = *ot;
  kiln_sbuf_printf(b, "    %s = linalg.generic {indexing_maps = [", out->ssa);
  for (int64_t t = 0; t < T; ++t)
    kiln_sbuf_puts(b, "affine_map<(n, c, h, w) -> (n, c, h, w)>, ");
  for (int64_t t = 0; t < T; ++t) kiln_sbuf_puts(b, "affine_map<(n, c, h, w) -> (c)>, ");
  kiln_sbuf_puts(b, "affine_map<(n, c, h, w) -> (n, c, h, w)>], iterator_types = "
                    "[\"parallel\", \"parallel\", \"parallel\", \"parallel\"]} ins(");
  for (int64_t t = 0; t < T; ++t) kiln_sbuf_printf(b, "%%dwx%d_%lld, ", id, (long long)t);
  for (int64_t t = 0; t < T; ++t)
    kiln_sbuf_printf(b, "%%dww%d_%lld%s", id, (long long)t, t + 1 < T ? ", " : "");
  kiln_sbuf_puts(b, " : ");
  for (int64_t t = 0; t < T; ++t) kiln_sbuf_printf(b, "%s, ", winty);
  for (int64_t t = 0; t < T; ++t) kiln_sbuf_printf(b, "%s%s", wcty, t + 1 < T ? ", " : "");
  kiln_sbuf_printf(b, ") outs(%s : %s) {\n    ^bb0(", empty, oty);
  const char *el = kiln_mlir_elem(x->type.dtype);
  for (int64_t t = 0; t < T; ++t) kiln_sbuf_printf(b, "%%dxa%d_%lld: %s, ", id, (long long)t, el);
  for (int64_t t = 0; t < T; ++t) kiln_sbuf_printf(b, "%%dwa%d_%lld: %s, ", id, (long long)t, el);
  kiln_sbuf_printf(b, "%%dout%d: %s):\n", id, el);
  // Products summed in tap order (the reference's order), each add a
  // multiply-add LLVM may fuse.
  kiln_sbuf_printf(b, "      %%dsum%d_0 = arith.mulf %%dxa%d_0, %%dwa%d_0 : %s\n", id, id, id, el);
  for (int64_t t = 1; t < T; ++t)
    kiln_sbuf_printf(b,
        "      %%dpr%d_%lld = arith.mulf %%dxa%d_%lld, %%dwa%d_%lld fastmath<contract> : %s\n"
        "      %%dsum%d_%lld = arith.addf %%dsum%d_%lld, %%dpr%d_%lld fastmath<contract> : %s\n",
        id, (long long)t, id, (long long)t, id, (long long)t, el, id, (long long)t, id,
        (long long)(t - 1), id, (long long)t, el);
  kiln_sbuf_printf(b, "      linalg.yield %%dsum%d_%lld : %s\n    } -> %s\n", id,
                   (long long)(T - 1), el, oty);
}

// A strided convolution (dilation 1) as stride-1 convolutions over the
// phases of its padded input: with stride (sh, sw), tap (kh, kw) reads
//   xpad[sh*oh + kh, sw*ow + kw] = phase(kh % sh, kw % sw)[oh + kh/sh, ow + kw/sw]
// where phase(ph, pw)[i, j] = xpad[sh*i + ph, sw*j + pw]. One transpose
// splits the padded input [N, C, sh*Hs, sw*Ws] into [N, sh*sw, C, Hs, Ws];
// phase (ph, pw) then convolves with the taps w[:, :, ph::sh, pw::sw] (a
// ceil((KH - ph)/sh) x ceil((KW - pw)/sw) kernel; none when the kernel is
// smaller than the stride) in the stride-1 flat form (emit_conv_taps),
// each phase accumulating into the one before. Every multiply-add is one
// of the convolution's own (no zero taps); the accumulator goes through
// memory once per phase, not once per tap, and every contraction is the
// stride-1 one (8 x 32 register tiles, vector loads of the input in
// place). The tap-by-tap form read each tap's window at the stride (4 x 4
// register tiles of gathered loads): a 3x3 stride-2 layer of the bench's
// resnet shapes ran at 20 GFLOP/s. Hs and Ws give every phase's taps room
// (the flat form's extra rows and columns, as kiln_lower_conv's); false in
// *done where the padded input would need fewer rows or columns than x has.
static kiln_status_t emit_conv_phases(kiln_emitter_t *e, kiln_tv_t x, const kiln_tv_t *w,
                                      const kiln_type_t *ot, const int64_t st[2],
                                      const int64_t pd[2], int64_t G, kiln_tv_t *out,
                                      kiln_tv_t *wide_out, bool *done) {
  *done = false;
  const int64_t sh = st[0], sw = st[1], KH = w->type.dims[2], KW = w->type.dims[3];
  const int64_t N = x.type.dims[0], C = x.type.dims[1], H = x.type.dims[2],
                W = x.type.dims[3], OH = ot->dims[2], OW = ot->dims[3];
  const int64_t KH1 = (KH + sh - 1) / sh, KW1 = (KW + sw - 1) / sw;
  int64_t xr = 0, xc = 0;
  flat_extra(OH, OW + KW1 - 1, KW1, &xr, &xc);
  int64_t dr, dc;
  if (conv_dot_applies(e, x.type.dtype, w->type.dtype, kiln_math_dtype(ot->dtype), G,
                       w->type.dims[0] / G) &&
      conv_dot_grid(OH, OW + KW1 - 1, KW1, 1, xc, &dr, &dc) &&
      sh * (OH + KH1 - 1 + dr) >= H + pd[0] && sw * (OW + KW1 - 1 + dc) >= W + pd[1])
    xr = dr, xc = dc;  // (only where the phases still cover the input)
  const int64_t Ws = OW + KW1 - 1 + xc, Hs = OH + KH1 - 1 + xr;
  const int64_t hi_h = sh * Hs - H - pd[0], hi_w = sw * Ws - W - pd[1];
  if (hi_h < 0 || hi_w < 0) return NULL;
  KILN_RETURN_IF_ERROR_PLAIN(emit_pad(e, -1, &x, pd[0], pd[1], hi_h, hi_w));
  // [N, C, Hs, sh, Ws, sw] -> [N, sh, sw, C, Hs, Ws]
  kiln_type_t v6 = {.dtype = x.type.dtype, .rank = 6, .dims = {N, C, Hs, sh, Ws, sw}};
  kiln_type_t t6 = {.dtype = x.type.dtype, .rank = 6, .dims = {N, sh, sw, C, Hs, Ws}};
  kiln_type_t p5 = {.dtype = x.type.dtype, .rank = 5, .dims = {N, sh * sw, C, Hs, Ws}};
  kiln_tv_t xv, xt, xs;
  kiln_emit_view(e, &x, &v6, &xv);
  char empty[24], vty[256], tty[256], pty[256];
  kiln_emit_empty(e, &t6, empty);
  kiln_mlir_tensor_type(&v6, vty, sizeof(vty));
  kiln_mlir_tensor_type(&t6, tty, sizeof(tty));
  kiln_mlir_tensor_type(&p5, pty, sizeof(pty));
  kiln_emit_fresh(e, xt.ssa);
  xt.type = t6;
  kiln_sbuf_printf(&e->out, "    %s = linalg.transpose ins(%s : %s) outs(%s : %s) "
                            "permutation = [0, 3, 5, 1, 2, 4]\n",
                   xt.ssa, xv.ssa, vty, empty, tty);
  kiln_emit_view(e, &xt, &p5, &xs);
  static const int64_t one[2] = {1, 1};
  kiln_tv_t acc = {.ssa = ""};
  for (int64_t ph = 0; ph < sh; ++ph)
    for (int64_t pw = 0; pw < sw; ++pw) {
      const int64_t kh = (KH - ph + sh - 1) / sh, kw = (KW - pw + sw - 1) / sw;
      if (kh <= 0 || kw <= 0) continue;
      kiln_tv_t xq = {.type = x.type}, wq = {.type = w->type};
      xq.type.dims[2] = Hs;
      xq.type.dims[3] = Ws;
      wq.type.dims[2] = kh;
      wq.type.dims[3] = kw;
      char xqty[256], wty[256], wqty[256];
      kiln_mlir_tensor_type(&xq.type, xqty, sizeof(xqty));
      kiln_mlir_tensor_type(&w->type, wty, sizeof(wty));
      kiln_mlir_tensor_type(&wq.type, wqty, sizeof(wqty));
      kiln_emit_fresh(e, xq.ssa);
      kiln_emit_fresh(e, wq.ssa);
      kiln_sbuf_printf(&e->out,
          "    %s = tensor.extract_slice %s[0, %lld, 0, 0, 0] [%lld, 1, %lld, %lld, %lld] "
          "[1, 1, 1, 1, 1] : %s to %s\n"
          "    %s = tensor.extract_slice %s[0, 0, %lld, %lld] [%lld, %lld, %lld, %lld] "
          "[1, 1, %lld, %lld] : %s to %s\n",
          xq.ssa, xs.ssa, (long long)(ph * sw + pw), (long long)N, (long long)C,
          (long long)Hs, (long long)Ws, pty, xqty, wq.ssa, w->ssa, (long long)ph,
          (long long)pw, (long long)w->type.dims[0], (long long)w->type.dims[1],
          (long long)kh, (long long)kw, (long long)sh, (long long)sw, wty, wqty);
      // The phase's taps as a dense tensor, copied by threads (the
      // schedule tiles linalg.copy). Viewed in place, the strided slice
      // was made dense by bufferization with one memref.copy on one
      // thread, element by element (2 x 256 x 14 x 14 -> 512 channels,
      // stride 2: 3.6 of 6.6 ms).
      {
        char dense[24], empty2[24];
        kiln_emit_empty(e, &wq.type, empty2);
        kiln_emit_fresh(e, dense);
        kiln_sbuf_printf(&e->out, "    %s = linalg.copy ins(%s : %s) outs(%s : %s) -> %s\n",
                         dense, wq.ssa, wqty, empty2, wqty, wqty);
        snprintf(wq.ssa, sizeof(wq.ssa), "%s", dense);
      }
      kiln_tv_t next;
      KILN_RETURN_IF_ERROR_PLAIN(emit_conv_taps(e, xq, &wq, ot, one, one, G,
                                                acc.ssa[0] ? &acc : NULL, out, wide_out,
                                                &next));
      acc = next;
    }
  *done = true;
  return NULL;
}

// A stride-1 or depthwise convolution's zero-padded input, flattened to
// rows of Wp, is made in one pass where the input is elementwise ops
// (batch norm, relu: per-channel or scalar operands besides one full-size
// one) over another stride-1 convolution's output whose wide grid has the
// same Wp: that grid, with its Wp - W extra columns set to zero, is the
// padded input shifted by lo_h * Wp + lo_w elements (an extra column of
// row h lands in row h's right padding or row h + 1's left padding). So
// the ops run on
// the wide grid, a select zeroes the extra columns, and the result is
// written straight into the padded buffer, whose head and tail are zero
// filled; no narrow result, no fill of the whole buffer, no copy into it
// (the resnet block's conv -> batch norm -> relu -> conv). An scf.forall
// over (n, channel blocks) holds the ops (tiled to the block; the
// schedule vectorizes them in place) and inserts the block into the
// buffer. The narrow ops, emitted before, are dead unless something else
// reads them. `*done` says whether `x` became that padded input
// (emit_prepadded, below).
//
// A grid whose width is not the consumer's Wp (a 1x1 layer's, with no
// padding, feeding a 3x3 one) is used in its W useful columns, by any
// padded consumer, depthwise ones included (MobileNetV2's expand -> batch
// norm -> relu6 -> depthwise): the ops run on [1, cb, H, W] blocks and
// write the padded buffer's interior, whose border is then filled
// (kiln_emit_pad_border); the batch norm's pass and the copy into the
// padded buffer were two passes (emit_prepadded_narrow).

// Right-aligned to rank 4: 1 or absent in dims 0, 2 and 3, 1 or C in dim 1.
static bool per_channel(const kiln_type_t *t, int64_t C) {
  if (t->rank > 4 || !kiln_type_is_static(t)) return false;
  for (int k = 0; k < t->rank; ++k) {
    int d = 4 - t->rank + k;
    if (d == 1 ? t->dims[k] != 1 && t->dims[k] != C : t->dims[k] != 1) return false;
  }
  return true;
}

enum { kPrepadChain = 16 };

// The chain's per-channel operands (all but chain[i]'s spatial[i]) as
// [1, C or 1, 1, ...] of `rank` (the block's rank), into pc.
static kiln_status_t emit_chain_operands(kiln_emitter_t *e, const int *chain,
                                         const int *spatial, int count, int rank,
                                         kiln_tv_t pc[][3]) {
  for (int i = 0; i < count; ++i) {
    const kiln_node_t *pn = &e->g->nodes[chain[i]];
    for (int k = 0; k < pn->operand_count && k < 3; ++k) {
      const kiln_operand_t *o = &pn->operands[k];
      if (k == spatial[i] || o->kind != KILN_OPERAND_VALUE) continue;
      const kiln_tv_t *src = &e->values[o->value];
      kiln_type_t t = {.dtype = src->type.dtype, .rank = rank};
      for (int d = 0; d < rank; ++d) t.dims[d] = 1;
      if (src->type.rank >= 3) t.dims[1] = src->type.dims[src->type.rank - 3];
      KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_reshape(e, src, &t, &pc[i][k]));
    }
  }
  return NULL;
}

// The ops chain[count - 1] .. chain[0] on *curv, a block of `slab` type
// ([1, cb, ...]) inside the scf.forall whose channel offset is %qf<id>:
// per-channel operands (pc, from emit_chain_operands) are sliced to the
// block's cb channels. *curv becomes the last op's result.
static kiln_status_t emit_chain_on_block(kiln_emitter_t *e, const int *chain,
                                         const int *spatial, int count, kiln_tv_t pc[][3],
                                         int64_t C, int id, const kiln_type_t *slab,
                                         kiln_tv_t *curv) {
  const int64_t cb = slab->dims[1];
  const int rank = slab->rank;
  const kiln_node_t *saved = e->node;
  for (int i = count - 1; i >= 0; --i) {
    const kiln_node_t *pn = &e->g->nodes[chain[i]];
    kiln_arg_t args[3];
    e->node = pn;
    for (int k = 0; k < pn->operand_count && k < 3; ++k) {
      const kiln_operand_t *o = &pn->operands[k];
      if (k == spatial[i]) {
        args[k] = kiln_arg_tensor(curv);
      } else if (o->kind == KILN_OPERAND_VALUE && pc[i][k].type.dims[1] == C && cb != C) {
        kiln_tv_t sl = {.type = pc[i][k].type};
        sl.type.dims[1] = cb;
        char aty[128], sty[128];
        kiln_mlir_tensor_type(&pc[i][k].type, aty, sizeof(aty));
        kiln_mlir_tensor_type(&sl.type, sty, sizeof(sty));
        kiln_emit_fresh(e, sl.ssa);
        kiln_sbuf_printf(&e->out, "      %s = tensor.extract_slice %s[0, %%qf%d", sl.ssa,
                         pc[i][k].ssa, id);
        for (int d = 2; d < rank; ++d) kiln_sbuf_puts(&e->out, ", 0");
        kiln_sbuf_printf(&e->out, "] [1, %lld", (long long)cb);
        for (int d = 2; d < rank; ++d) kiln_sbuf_puts(&e->out, ", 1");
        kiln_sbuf_puts(&e->out, "] [1");
        for (int d = 1; d < rank; ++d) kiln_sbuf_puts(&e->out, ", 1");
        kiln_sbuf_printf(&e->out, "] : %s to %s\n", aty, sty);
        args[k] = kiln_arg_tensor(&sl);
      } else if (o->kind == KILN_OPERAND_VALUE) {
        args[k] = kiln_arg_tensor(&pc[i][k]);
      } else {
        args[k] = kiln_arg_operand(e, k);
      }
    }
    kiln_tv_t next;
    kiln_status_t st = kiln_emit_ew(e, pn->op, pn, pn->operand_count, args, slab, KILN_F32,
                                    KILN_F32, &next);
    if (st) {
      e->node = saved;
      return st;
    }
    *curv = next;
  }
  e->node = saved;
  return NULL;
}

// The ops chain[count - 1] .. chain[0] (elementwise, spatial[i] the full-size
// operand of chain[i], the others per channel) on the first W columns of
// wide[N, C, H, W or more], written block by block into the interior of a
// padded buffer [N, C, Hp, Wp] at (lo_h, lo_w), whose border is then zero
// filled (see emit_prepadded, above).
static kiln_status_t emit_prepadded_narrow(kiln_emitter_t *e, int32_t v, const int *chain,
                                           const int *spatial, int count,
                                           const kiln_tv_t *wide, int64_t lo_h, int64_t lo_w,
                                           int64_t Hp, int64_t Wp, kiln_tv_t *x, bool *done) {
  const kiln_graph_t *g = e->g;
  const kiln_type_t *nt = &g->values[v].type;
  const int64_t N = nt->dims[0], C = nt->dims[1], H = nt->dims[2], W = nt->dims[3];
  // (No padding: the ops' own pass is as good.)
  if (Hp < lo_h + H || Wp < lo_w + W || (Hp == H && Wp == W)) return NULL;
  // Channel blocks of at most 16K elements; at least two iterations.
  int64_t cb = 1;
  for (int64_t c = N > 1 ? C : C / 2; c >= 1; --c)
    if (C % c == 0 && c * H * W <= 16384) {
      cb = c;
      break;
    }
  if (N * (C / cb) < 2) return NULL;
  kiln_sbuf_t *b = &e->out;
  kiln_tv_t pc[kPrepadChain][3];
  KILN_RETURN_IF_ERROR_PLAIN(emit_chain_operands(e, chain, spatial, count, 4, pc));
  kiln_type_t pt = {.dtype = KILN_F32, .rank = 4, .dims = {N, C, Hp, Wp}};
  kiln_type_t slab = {.dtype = KILN_F32, .rank = 4, .dims = {1, cb, H, W}};
  char pad_ty[128], slab_ty[128], wty[128], init[24], res[24];
  kiln_mlir_tensor_type(&pt, pad_ty, sizeof(pad_ty));
  kiln_mlir_tensor_type(&slab, slab_ty, sizeof(slab_ty));
  kiln_mlir_tensor_type(&wide->type, wty, sizeof(wty));
  kiln_emit_empty(e, &pt, init);
  int id = e->next_id++;
  kiln_emit_fresh(e, res);
  kiln_sbuf_printf(b,
      "    %s = scf.forall (%%qn%d, %%qc%d) in (%lld, %lld) shared_outs(%%qo%d = %s) -> (%s) {\n"
      "      %%qf%d = affine.apply affine_map<(d0) -> (d0 * %lld)>(%%qc%d)\n",
      res, id, id, (long long)N, (long long)(C / cb), id, init, pad_ty, id, (long long)cb, id);
  kiln_tv_t curv = {.type = slab};
  kiln_emit_fresh(e, curv.ssa);
  kiln_sbuf_printf(b, "      %s = tensor.extract_slice %s[%%qn%d, %%qf%d, 0, 0] [1, %lld, %lld, "
                      "%lld] [1, 1, 1, 1] : %s to %s\n",
                   curv.ssa, wide->ssa, id, id, (long long)cb, (long long)H, (long long)W, wty,
                   slab_ty);
  KILN_RETURN_IF_ERROR_PLAIN(
      emit_chain_on_block(e, chain, spatial, count, pc, C, id, &slab, &curv));
  // The block's values into its interior slice of the buffer (a copy that
  // elementwise fusion merges with the ops).
  kiln_sbuf_printf(b,
      "      %%qd%d = tensor.extract_slice %%qo%d[%%qn%d, %%qf%d, %lld, %lld] [1, %lld, %lld, "
      "%lld] [1, 1, 1, 1] : %s to %s\n"
      "      %%qm%d = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, "
      "d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = "
      "[\"parallel\", \"parallel\", \"parallel\", \"parallel\"]} ins(%s : %s) outs(%%qd%d : %s) {\n"
      "      ^bb0(%%qx%d: f32, %%qy%d: f32):\n"
      "        linalg.yield %%qx%d : f32\n"
      "      } -> %s\n"
      "      scf.forall.in_parallel {\n"
      "        tensor.parallel_insert_slice %%qm%d into %%qo%d[%%qn%d, %%qf%d, %lld, %lld] [1, "
      "%lld, %lld, %lld] [1, 1, 1, 1] : %s into %s\n"
      "      }\n    }\n",
      id, id, id, id, (long long)lo_h, (long long)lo_w, (long long)cb, (long long)H,
      (long long)W, pad_ty, slab_ty, id, curv.ssa, slab_ty, id, slab_ty, id, id, id, slab_ty,
      id, id, id, id, (long long)lo_h, (long long)lo_w, (long long)cb, (long long)H,
      (long long)W, slab_ty, pad_ty);
  kiln_tv_t r = {.type = pt};
  snprintf(r.ssa, sizeof(r.ssa), "%s", res);
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_pad_border(e, &r, lo_h, lo_w, H, W, 0, x));
  *done = true;
  return NULL;
}

static kiln_status_t emit_prepadded(kiln_emitter_t *e, int32_t v, int64_t lo_h,
                                    int64_t lo_w, int64_t Hp, int64_t Wp,
                                    kiln_tv_t *x, bool *done) {
  *done = false;
  const kiln_graph_t *g = e->g;
  const kiln_type_t *nt = &g->values[v].type;
  if (nt->rank != 4 || nt->dtype != KILN_F32 || !kiln_type_is_static(nt)) return NULL;
  const int64_t N = nt->dims[0], C = nt->dims[1], H = nt->dims[2], W = nt->dims[3];
  // The chain back from v to a value with a wide grid: chain[i] is a node,
  // spatial[i] its full-size operand. A chain that stops at a convolution
  // with no wide grid (a 1x1 layer whose grid needed no extra columns)
  // takes its result [N, C, H, W] as a grid of W columns. (Other sources
  // gain nothing: their ops fuse with the source's producer, a max pool's
  // taps say, in one pass before the copy into the padded buffer.)
  int chain[kPrepadChain], spatial[kPrepadChain], count = 0;
  int32_t cur = v;
  while (!e->wide[cur].ssa[0]) {
    int32_t p = g->values[cur].node;
    if (count == kPrepadChain) return NULL;
    const kiln_node_t *pn = p >= 0 ? &g->nodes[p] : NULL;
    kiln_op_class_t cls = pn ? kiln_op_class(pn->op) : KILN_CLASS_SHAPE;
    int sp = -1;
    if ((cls == KILN_CLASS_UNARY || cls == KILN_CLASS_UNARY_FLOAT ||
         cls == KILN_CLASS_BINARY || cls == KILN_CLASS_BINARY_FLOAT) &&
        pn->result_count == 1 && kiln_type_equal(&g->values[cur].type, nt) &&
        kiln_node_compute_dtype(g, pn) == KILN_F32) {
      for (int k = 0; k < pn->operand_count; ++k) {
        const kiln_operand_t *o = &pn->operands[k];
        if (o->kind != KILN_OPERAND_VALUE) continue;
        const kiln_type_t *t = &g->values[o->value].type;
        if (sp < 0 && kiln_type_equal(t, nt)) {
          sp = k;
        } else if (!per_channel(t, C)) {
          sp = -1;
          break;
        }
      }
    }
    if (sp < 0) {
      const kiln_tv_t *src = &e->values[cur];
      if (!count || !pn || pn->op != KILN_OP_CONVOLUTION || src->type.dtype != KILN_F32 ||
          !kiln_type_equal(&src->type, nt))
        return NULL;
      return emit_prepadded_narrow(e, v, chain, spatial, count, src, lo_h, lo_w, Hp, Wp, x,
                                   done);
    }
    chain[count] = p;
    spatial[count++] = sp;
    cur = pn->operands[sp].value;
  }
  const kiln_tv_t *wide = &e->wide[cur];
  const int64_t HW = H * Wp, off = lo_h * Wp + lo_w, tail = Hp * Wp - off - HW;
  if (wide->type.dims[0] != N || wide->type.dims[1] != C || wide->type.dims[2] != H)
    return NULL;
  if (wide->type.dims[3] != Wp || tail < 0)
    return wide->type.dims[3] < W ? NULL
                                  : emit_prepadded_narrow(e, v, chain, spatial, count, wide,
                                                          lo_h, lo_w, Hp, Wp, x, done);
  // Channel blocks of at most 16K padded elements; at least two
  // iterations (one would fold into top-level ops).
  int64_t cb = 1;
  for (int64_t c = N > 1 ? C : C / 2; c >= 1; --c)
    if (C % c == 0 && c * Hp * Wp <= 16384) {
      cb = c;
      break;
    }
  if (N * (C / cb) < 2) return NULL;
  kiln_sbuf_t *b = &e->out;
  // Per-channel operands at the flat slab's rank.
  kiln_tv_t pc[kPrepadChain][3];
  KILN_RETURN_IF_ERROR_PLAIN(emit_chain_operands(e, chain, spatial, count, 3, pc));
  // The column mask over the flat rows: mask[h * Wp + w] = (w < W).
  char mask2[24], mask[24], empty[24], flat_ty[128], pad_ty[128];
  kiln_emit_fresh(e, empty);
  kiln_emit_fresh(e, mask2);
  kiln_emit_fresh(e, mask);
  int id = e->next_id++;
  kiln_sbuf_printf(b,
      "    %s = tensor.empty() : tensor<%lldx%lldxi8>\n"
      "    %s = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>], "
      "iterator_types = [\"parallel\", \"parallel\"]} outs(%s : tensor<%lldx%lldxi8>) {\n"
      "    ^bb0(%%mo%d: i8):\n"
      "      %%mj%d = linalg.index 1 : index\n"
      "      %%mw%d = arith.constant %lld : index\n"
      "      %%mc%d = arith.cmpi ult, %%mj%d, %%mw%d : index\n"
      "      %%mb%d = arith.extui %%mc%d : i1 to i8\n"
      "      linalg.yield %%mb%d : i8\n"
      "    } -> tensor<%lldx%lldxi8>\n"
      "    %s = tensor.collapse_shape %s [[0, 1]] : tensor<%lldx%lldxi8> into tensor<%lldxi8>\n",
      empty, (long long)H, (long long)Wp, mask2, empty, (long long)H, (long long)Wp, id, id,
      id, (long long)W, id, id, id, id, id, id, (long long)H, (long long)Wp, mask, mask2,
      (long long)H, (long long)Wp, (long long)HW);
  kiln_type_t ft = {.dtype = KILN_F32, .rank = 3, .dims = {N, C, HW}};
  kiln_type_t pt = {.dtype = KILN_F32, .rank = 3, .dims = {N, C, Hp * Wp}};
  kiln_mlir_tensor_type(&pt, pad_ty, sizeof(pad_ty));
  kiln_tv_t wf;
  kiln_emit_view(e, wide, &ft, &wf);
  kiln_mlir_tensor_type(&ft, flat_ty, sizeof(flat_ty));
  // Only each plane's head (the top padding rows and the first row's left
  // padding) and tail are zero filled ahead of the loop, by slabs; the
  // blocks then write everything between. A fill of the whole buffer
  // wrote it twice (the resnet block's 7 MB: 0.2-0.3 ms). Head and tail
  // fills of their own slices inside the loop made one-shot bufferization
  // copy every block out and back (slices of the shared output at
  // run-time offsets it cannot tell apart).
  kiln_tv_t init;
  {
    char empty[24];
    kiln_emit_empty(e, &pt, empty);
    kiln_tv_t cur = {.type = pt}, ends[2];
    snprintf(cur.ssa, sizeof(cur.ssa), "%s", empty);
    const int64_t len[2] = {off, tail}, at[2] = {0, off + HW};
    for (int k = 0; k < 2; ++k) {
      if (!len[k]) continue;
      kiln_type_t zt = {.dtype = KILN_F32, .rank = 3, .dims = {N, C, len[k]}};
      kiln_tv_t z;
      KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_filled(e, &zt, 0, &z));
      const int64_t offsets[3] = {0, 0, at[k]};
      kiln_emit_insert_slabs(e, &z, &cur, offsets, true, &ends[k]);
      cur = ends[k];
    }
    init = cur;
  }
  char res[24];
  kiln_emit_fresh(e, res);
  kiln_sbuf_printf(b,
      "    %s = scf.forall (%%qn%d, %%qc%d) in (%lld, %lld) shared_outs(%%qo%d = %s) -> (%s) {\n"
      "      %%qf%d = affine.apply affine_map<(d0) -> (d0 * %lld)>(%%qc%d)\n",
      res, id, id, (long long)N, (long long)(C / cb), id, init.ssa, pad_ty, id,
      (long long)cb, id);
  kiln_type_t slab = {.dtype = KILN_F32, .rank = 3, .dims = {1, cb, HW}};
  char slab_ty[128];
  kiln_mlir_tensor_type(&slab, slab_ty, sizeof(slab_ty));
  kiln_tv_t curv = {.type = slab};
  kiln_emit_fresh(e, curv.ssa);
  kiln_sbuf_printf(b, "      %s = tensor.extract_slice %s[%%qn%d, %%qf%d, 0] [1, %lld, %lld] "
                      "[1, 1, 1] : %s to %s\n",
                   curv.ssa, wf.ssa, id, id, (long long)cb, (long long)HW, flat_ty, slab_ty);
  KILN_RETURN_IF_ERROR_PLAIN(
      emit_chain_on_block(e, chain, spatial, count, pc, C, id, &slab, &curv));
  // The block's slice of the buffer gets the ops' values, zero in the
  // extra columns.
  char zero[24];
  kiln_emit_scalar_const(e, b, KILN_F32, 0, zero);
  kiln_sbuf_printf(b,
      "      %%qd%d = tensor.extract_slice %%qo%d[%%qn%d, %%qf%d, %lld] [1, %lld, %lld] "
      "[1, 1, 1] : %s to %s\n"
      "      %%qm%d = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d1, d2)>, "
      "affine_map<(d0, d1, d2) -> (d2)>, affine_map<(d0, d1, d2) -> (d0, d1, d2)>], "
      "iterator_types = [\"parallel\", \"parallel\", \"parallel\"]} ins(%s, %s : %s, "
      "tensor<%lldxi8>) outs(%%qd%d : %s) {\n"
      "      ^bb0(%%qx%d: f32, %%qk%d: i8, %%qy%d: f32):\n"
      "        %%qz%d = arith.constant 0 : i8\n"
      "        %%qb%d = arith.cmpi ne, %%qk%d, %%qz%d : i8\n"
      "        %%qs%d = arith.select %%qb%d, %%qx%d, %s : f32\n"
      "        linalg.yield %%qs%d : f32\n"
      "      } -> %s\n",
      id, id, id, id, (long long)off, (long long)cb, (long long)HW, pad_ty, slab_ty, id,
      curv.ssa, mask, slab_ty, (long long)HW, id, slab_ty, id, id, id, id, id, id, id, id,
      id, id, zero, id, slab_ty);
  kiln_sbuf_puts(b, "      scf.forall.in_parallel {\n");
  kiln_sbuf_printf(b, "        tensor.parallel_insert_slice %%qm%d into %%qo%d[%%qn%d, "
                      "%%qf%d, %lld] [1, %lld, %lld] [1, 1, 1] : %s into %s\n"
                      "      }\n    }\n",
                   id, id, id, id, (long long)off, (long long)cb, (long long)HW, slab_ty,
                   pad_ty);
  kiln_tv_t r = {.type = pt};
  snprintf(r.ssa, sizeof(r.ssa), "%s", res);
  kiln_type_t xt = {.dtype = KILN_F32, .rank = 4, .dims = {N, C, Hp, Wp}};
  kiln_emit_view(e, &r, &xt, x);
  *done = true;
  return NULL;
}

// Whether a convolution's result, a slice of its wide grid (the extra
// columns of each row dropped), gets a buffer of its own: a graph output
// (or a value stored into an input) and the input of a view, reshape or
// cat are copied out of the strided slice by bufferization, on one thread
// (a depthwise [8,144,56,56] layer's output: 0.6 of its 2.8 ms). Other
// readers (elementwise ops, which fusion puts on the slice; reductions,
// convolutions) read it in place.
static bool slice_needs_copy(const kiln_graph_t *g, int32_t v) {
  for (int i = 0; i < g->output_count; ++i)
    if (g->outputs[i] == v) return true;
  for (int i = 0; i < g->mutation_count; ++i)
    if (g->mutations[i].value == v) return true;
  for (int i = 0; i < g->node_count; ++i) {
    const kiln_node_t *c = &g->nodes[i];
    if (kiln_op_class(c->op) != KILN_CLASS_SHAPE) continue;
    for (int k = 0; k < c->operand_count; ++k)
      if (c->operands[k].kind == KILN_OPERAND_VALUE && c->operands[k].value == v) return true;
  }
  return false;
}

kiln_status_t kiln_lower_conv(kiln_emitter_t *e, const kiln_node_t *n) {
  kiln_tv_t x = e->values[n->operands[0].value];
  kiln_tv_t w = e->values[n->operands[1].value];
  const kiln_type_t *rt = kiln_node_result_type(e->g, n, 0);
  kiln_dtype_t acc = kiln_math_dtype(rt->dtype);
  int64_t st[2], pd[2], dl[2];
  kiln_node_attr_pair(n, "stride", 1, st);
  kiln_node_attr_pair(n, "padding", 0, pd);
  kiln_node_attr_pair(n, "dilation", 1, dl);
  int64_t G = kiln_node_attr_int(n, "groups", 1);
  kiln_sbuf_t *b = &e->out;
  // The stride-1 taps form's extra rows and columns come with the
  // padding: one fill and one copy.
  int64_t xr = 0, xc = 0;
  // Depthwise (f32, CPU, static): one generic over all taps.
  bool depthwise = e->options.conv_taps && !e->options.cuda && G > 1 &&
                   x.type.dims[1] == G && w.type.dims[0] == G && dl[0] == 1 && dl[1] == 1 &&
                   x.type.dtype == KILN_F32 && w.type.dtype == KILN_F32 && acc == KILN_F32 &&
                   w.type.dims[2] * w.type.dims[3] <= 49 && kiln_type_is_static(&x.type) &&
                   kiln_type_is_static(&w.type);
  bool flat = e->options.conv_taps && st[0] == 1 && st[1] == 1 && !depthwise;
  if (flat) {
    int64_t wpad = x.type.dims[3] + 2 * pd[1];
    flat_extra(rt->dims[2], wpad, w.type.dims[3], &xr, &xc);
    if (conv_dot_applies(e, x.type.dtype, w.type.dtype, acc, G, w.type.dims[0] / G))
      conv_dot_grid(rt->dims[2], wpad, w.type.dims[3], dl[1], xc, &xr, &xc);
  }
  kiln_type_t ot = *rt;
  ot.dtype = acc;
  kiln_tv_t conv, wide = {.ssa = ""};
  // Strided (dilation 1, static, CPU): phases of stride-1 convolutions.
  bool phased = false;
  // Filters per group fill the register tile's rows (8): a depthwise
  // layer's single filter per group ran slower in the stride-1 form than
  // tap by tap (MobileNet's 3x3 stride 2: 2.8 -> 5.8 ms).
  if (e->options.conv_taps && !flat && !depthwise && !e->options.cuda && dl[0] == 1 &&
      dl[1] == 1 && w.type.dims[0] / G >= 8 && kiln_type_is_static(&x.type) &&
      kiln_type_is_static(&w.type))
    KILN_RETURN_IF_ERROR_PLAIN(emit_conv_phases(e, x, &w, &ot, st, pd, G, &conv, &wide,
                                                &phased));
  if (depthwise) {
    bool made = false;
    if (pd[0] || pd[1])
      KILN_RETURN_IF_ERROR_PLAIN(emit_prepadded(e, n->operands[0].value, pd[0], pd[1],
                                                x.type.dims[2] + 2 * pd[0],
                                                x.type.dims[3] + 2 * pd[1], &x, &made));
    if (!made)
      KILN_RETURN_IF_ERROR_PLAIN(
          emit_pad(e, n->operands[0].value, &x, pd[0], pd[1], pd[0], pd[1]));
    emit_conv_depthwise(e, &x, &w, &ot, st, &conv);
  }
  bool prepadded = phased || depthwise;
  if (flat && !e->options.cuda)
    KILN_RETURN_IF_ERROR_PLAIN(emit_prepadded(
        e, n->operands[0].value, pd[0], pd[1], x.type.dims[2] + 2 * pd[0] + xr,
        x.type.dims[3] + 2 * pd[1] + xc, &x, &prepadded));
  if (!prepadded)
    KILN_RETURN_IF_ERROR_PLAIN(
        emit_pad(e, n->operands[0].value, &x, pd[0], pd[1], pd[0] + xr, pd[1] + xc));
  char attrs[256];
  snprintf(attrs, sizeof(attrs),
           "{dilations = dense<[%lld, %lld]> : tensor<2xi64>, "
           "strides = dense<[%lld, %lld]> : tensor<2xi64>}",
           (long long)dl[0], (long long)dl[1], (long long)st[0],
           (long long)st[1]);
  if (phased || depthwise) {
    // (emitted above)
  } else if (e->options.conv_taps) {
    kiln_tv_t acc_unused;
    KILN_RETURN_IF_ERROR_PLAIN(
        emit_conv_taps(e, x, &w, &ot, st, dl, G, NULL, &conv, &wide, &acc_unused));
  } else if (G == 1) {
    kiln_tv_t init;
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_filled(e, &ot, 0, &init));
    char xty[256], wty[256], oty[256];
    kiln_mlir_tensor_type(&x.type, xty, sizeof(xty));
    kiln_mlir_tensor_type(&w.type, wty, sizeof(wty));
    kiln_mlir_tensor_type(&ot, oty, sizeof(oty));
    kiln_emit_fresh(e, conv.ssa);
    conv.type = ot;
    kiln_sbuf_printf(b, "    %s = linalg.conv_2d_nchw_fchw %s ins(%s, %s : %s, %s) outs(%s : %s) -> %s\n",
                     conv.ssa, attrs, x.ssa, w.ssa, xty, wty, init.ssa, oty, oty);
  } else {
    // Grouped: view input as N,G,C/G,H,W and weight as G,F/G,C/G,KH,KW.
    kiln_type_t xg = x.type, wg = w.type, og = ot;
    xg.rank = 5;
    xg.dims[0] = x.type.dims[0];
    xg.dims[1] = G;
    xg.dims[2] = x.type.dims[1] / G;
    xg.dims[3] = x.type.dims[2];
    xg.dims[4] = x.type.dims[3];
    wg.rank = 5;
    wg.dims[0] = G;
    wg.dims[1] = w.type.dims[0] / G;
    wg.dims[2] = w.type.dims[1];
    wg.dims[3] = w.type.dims[2];
    wg.dims[4] = w.type.dims[3];
    og.rank = 5;
    og.dims[0] = ot.dims[0];
    og.dims[1] = G;
    og.dims[2] = ot.dims[1] / G;
    og.dims[3] = ot.dims[2];
    og.dims[4] = ot.dims[3];
    kiln_tv_t xv, wv, init, cg;
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_reshape(e, &x, &xg, &xv));
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_reshape(e, &w, &wg, &wv));
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_filled(e, &og, 0, &init));
    char xty[256], wty[256], oty[256];
    kiln_mlir_tensor_type(&xv.type, xty, sizeof(xty));
    kiln_mlir_tensor_type(&wv.type, wty, sizeof(wty));
    kiln_mlir_tensor_type(&og, oty, sizeof(oty));
    kiln_emit_fresh(e, cg.ssa);
    cg.type = og;
    kiln_sbuf_printf(b, "    %s = linalg.conv_2d_ngchw_gfchw %s ins(%s, %s : %s, %s) outs(%s : %s) -> %s\n",
                     cg.ssa, attrs, xv.ssa, wv.ssa, xty, wty, init.ssa, oty, oty);
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_reshape(e, &cg, &ot, &conv));
  }
  kiln_tv_t r = conv;
  if (n->operand_count > 2 && n->operands[2].kind == KILN_OPERAND_VALUE) {
    kiln_tv_t bias = e->values[n->operands[2].value], bv;
    kiln_type_t bt = bias.type;
    bt.rank = 3;  // [F, 1, 1] broadcasts over N and the spatial dims
    bt.dims[0] = bias.type.dims[0];
    bt.dims[1] = bt.dims[2] = 1;
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_reshape(e, &bias, &bt, &bv));
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_binary(
        e, KILN_OP_ADD, kiln_arg_tensor(&conv), kiln_arg_tensor(&bv), acc, &r));
    if (wide.ssa[0])  // the bias on the wide grid too (dead if unused)
      KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_binary(
          e, KILN_OP_ADD, kiln_arg_tensor(&wide), kiln_arg_tensor(&bv), acc, &wide));
  }
  kiln_tv_t out;
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_convert(e, &r, rt->dtype, &out));
  if (wide.ssa[0] && !e->options.cuda && strcmp(out.ssa, conv.ssa) == 0 &&
      slice_needs_copy(e->g, n->results[0])) {
    // The result is still the slice of the wide grid, and something makes
    // a buffer of it: on the CPU a parallel copy (the schedule tiles and threads
    // linalg.copy), where bufferization would copy it on one thread.
    char empty[24], oty[256];
    kiln_mlir_tensor_type(&ot, oty, sizeof(oty));
    kiln_emit_empty(e, &ot, empty);
    kiln_tv_t copy = out;
    kiln_emit_fresh(e, copy.ssa);
    kiln_sbuf_printf(b, "    %s = linalg.copy ins(%s : %s) outs(%s : %s) -> %s\n", copy.ssa,
                     out.ssa, oty, empty, oty, oty);
    out = copy;
  }
  kiln_emit_set_result(e, n, 0, &out);
  if (wide.ssa[0] && rt->dtype == KILN_F32 && !e->options.cuda) e->wide[n->results[0]] = wide;
  return NULL;
}
