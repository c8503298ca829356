// Composite ops built from the emitter's primitives: softmax, log_softmax and
// layer norm as reductions plus elementwise maps (which the fusion passes
// merge), embedding as a gather inside a linalg.generic, max pooling as the
// maximum of strided window slices.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kernels/kernels.h"
#include "lowering/emit.h"

// softmax / log_softmax of `x` along the dims in `red`, in math dtype `mt`,
// as three passes: the max; the sum of exp(x - max), its exp fused into the
// reduction; the output, which recomputes exp(x - max) rather than reading
// it back. Operands convert to `mt` inside each body. On the CPU the max may
// drop a NaN (the row turns NaN through exp and the sum all the same) and
// exp(x - max) knows its argument is not positive: one max instruction per
// vector and no overflow clamp (softmax f32[768,4096] on one thread: 2.1 ->
// 1.8 ms with the degree-6 exp of lowering/math_approx.c).
// With `cached` (a block of rows, or a whole tensor, that stays in cache),
// exp(x - max) is computed once and kept: re-reading it from cache is
// cheaper than recomputing it.
static kiln_status_t softmax_core(kiln_emitter_t *e, kiln_op_id_t op,
                                  const kiln_tv_t *x, const bool *red,
                                  kiln_dtype_t mt, kiln_dtype_t out_dtype,
                                  bool cached, kiln_tv_t *out) {
  kiln_tv_t m, t1, e1, s, t2, r;
  // The CUDA row kernels (kernels/gpu_rows.c) match maximumf and exp.
  if (e->options.cpu_rows) {
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_reduce_max_nan_free(e, x, red, true, mt, &m));
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_binary(e, KILN_EMIT_OP_EXP_DIFF, kiln_arg_tensor(x),
                                                kiln_arg_tensor(&m), mt, &e1));
  } else {
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_reduce(e, KILN_OP_AMAX, x, red, true, mt, &m));
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_binary(e, KILN_OP_SUB, kiln_arg_tensor(x),
                                                kiln_arg_tensor(&m), mt, &t1));
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_unary(e, KILN_OP_EXP, &t1, mt, &e1));
  }
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_reduce(e, KILN_OP_SUM, &e1, red, true, mt, &s));
  if (cached && op == KILN_OP_SOFTMAX && e->options.cpu_rows) {
    // One division per row, a multiply per element (as PyTorch's kernel):
    // a vector division per 16 elements cost a large part of the pass.
    kiln_tv_t rs;
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_binary(e, KILN_OP_DIV, kiln_arg_float(1.0),
                                                kiln_arg_tensor(&s), mt, &rs));
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_ew(e, KILN_OP_MUL, NULL, 2,
                                            (kiln_arg_t[]){kiln_arg_tensor(&e1),
                                                           kiln_arg_tensor(&rs)},
                                            NULL, mt, out_dtype, out));
    return NULL;
  }
  if (cached && op == KILN_OP_SOFTMAX) {
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_ew(e, KILN_OP_DIV, NULL, 2,
                                            (kiln_arg_t[]){kiln_arg_tensor(&e1),
                                                           kiln_arg_tensor(&s)},
                                            NULL, mt, out_dtype, out));
    return NULL;
  }
  if (op == KILN_OP_SOFTMAX) {
    kiln_tv_t e2;
    if (e->options.cpu_rows) {
      KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_binary(e, KILN_EMIT_OP_EXP_DIFF, kiln_arg_tensor(x),
                                                  kiln_arg_tensor(&m), mt, &e2));
    } else {
      KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_binary(e, KILN_OP_SUB, kiln_arg_tensor(x),
                                                  kiln_arg_tensor(&m), mt, &t2));
      KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_unary(e, KILN_OP_EXP, &t2, mt, &e2));
    }
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_binary(
        e, KILN_OP_DIV, kiln_arg_tensor(&e2), kiln_arg_tensor(&s), mt, &r));
  } else {
    kiln_tv_t ls;
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_binary(e, KILN_OP_SUB, kiln_arg_tensor(x),
                                                kiln_arg_tensor(&m), mt, &t2));
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_unary(e, KILN_OP_LOG, &s, mt, &ls));
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_binary(
        e, KILN_OP_SUB, kiln_arg_tensor(&t2), kiln_arg_tensor(&ls), mt, &r));
  }
  return kiln_emit_convert(e, &r, out_dtype, out);
}

// Row blocks pay off once the tensor no longer fits in the caches: below
// that, flat passes over it are faster (4-D attention scores of 2 MB: 0.23
// vs 0.55 ms).
static bool rows_in_blocks(const kiln_type_t *t) {
  return kiln_type_is_static(t) && kiln_type_numel(t) * 4 > (8 << 20);
}

// Rows per block: a power of two up to `most` that divides the rows, with
// blocks of at most `bytes` of f32 columns. Each block's scratch (row
// statistics) is allocated once per block, and its rows stay in the core's
// cache between the passes over them.
static int64_t row_block(int64_t rows, int64_t cols, int64_t most, int64_t bytes) {
  for (int64_t b = most; b > 1; b /= 2)
    if (rows % b == 0 && b * cols * 4 <= bytes) return b;
  return 1;
}

// x (static, rank > 2) viewed as the [R, C] rows of its last dim: the form
// of the CUDA row kernels (kernels/gpu_rows.c).
static kiln_status_t emit_rows_view(kiln_emitter_t *e, const kiln_tv_t *x,
                                    kiln_tv_t *out) {
  int64_t C = x->type.dims[x->type.rank - 1];
  kiln_type_t t = x->type;
  t.rank = 2;
  t.dims[0] = kiln_type_numel(&x->type) / (C ? C : 1);
  t.dims[1] = C;
  return kiln_emit_reshape(e, x, &t, out);
}

// Softmax / log_softmax of short f32 rows on the CPU in one pass: each row
// (C floats, 16 to 1024) is read once into vectors (the last one masked
// where C is not a multiple of 16, its padding -inf, which exp makes 0),
// its max and sum of exp(x - max) reduced in registers, and written once.
// The linalg form (softmax_core) ran four passes, a parallel region each,
// over an attention block's [32, 128, 128] scores: 0.16 ms where one pass
// reads 2 MB and writes 2 MB. A positive scalar multiply feeding the
// softmax (attention's 1/sqrt(d) scale, the softmax its only user) is
// applied as the rows are read: softmax(s x) with the max of s x.
static bool short_rows_apply(const kiln_emitter_t *e, const kiln_tv_t *x,
                             const kiln_type_t *rt, int32_t d) {
  int rank = x->type.rank;
  if (!e->options.cpu_rows || e->options.cuda || rank < 1 || d != rank - 1 ||
      x->type.dtype != KILN_F32 || rt->dtype != KILN_F32 ||
      !kiln_type_is_static(&x->type))
    return false;
  int64_t C = x->type.dims[rank - 1], numel = kiln_type_numel(&x->type);
  return C >= 16 && C <= 1024 && numel / C >= 2 && numel * 4 <= (8 << 20);
}

// The positive scalar `s` of x = mul(y, s) where x (graph value `v`) is
// read by node `consumer` only (kiln_emit_sole_reader); y's value index,
// or -1.
static int scaled_source(const kiln_emitter_t *e, int32_t v, int consumer, double *s) {
  const kiln_graph_t *g = e->g;
  const kiln_value_t *xv = &g->values[v];
  if (xv->node < 0) return -1;
  const kiln_node_t *p = &g->nodes[xv->node];
  if (p->op != KILN_OP_MUL || p->operand_count != 2 ||
      p->operands[0].kind != KILN_OPERAND_VALUE || p->operands[1].kind != KILN_OPERAND_FLOAT ||
      !(p->operands[1].f > 0))
    return -1;
  int32_t y = p->operands[0].value;
  if (!kiln_type_equal(&g->values[y].type, &xv->type) ||
      kiln_emit_sole_reader(g, v, xv->node) != consumer)
    return -1;
  *s = p->operands[1].f;
  return y;
}

// max(a, b) of two vector<16xf32> as a compare and a select in vmaxps'
// operand order (one instruction; arith.maxnumf's NaN rule took three and
// its horizontal reduction a scalar chain of 15). A NaN may be dropped:
// the row still turns NaN through exp(x - max) and the sum, as PyTorch's
// softmax does.
void kiln_emit_vec_max(kiln_emitter_t *e, const char *a, const char *b, char out[24]) {
  char k[24];
  kiln_emit_fresh(e, k);
  kiln_emit_fresh(e, out);
  kiln_sbuf_printf(&e->out,
      "        %s = arith.cmpf ogt, %s, %s : vector<16xf32>\n"
      "        %s = arith.select %s, %s, %s : vector<16xi1>, vector<16xf32>\n",
      k, a, b, out, k, a, b);
}

// A balanced tree of max (`max`) or add over the `n` vector values named
// v[0..n-1] (vector<16xf32>); `out` gets the root.
static void vec_tree(kiln_emitter_t *e, bool max, char (*v)[24], int n, char out[24]) {
  char cur[64][24];
  for (int i = 0; i < n; ++i) memcpy(cur[i], v[i], 24);
  while (n > 1) {
    int m = 0;
    for (int i = 0; i + 1 < n; i += 2, ++m) {
      char r[24];
      if (max) {
        kiln_emit_vec_max(e, cur[i], cur[i + 1], r);
      } else {
        kiln_emit_fresh(e, r);
        kiln_sbuf_printf(&e->out, "        %s = arith.addf %s, %s : vector<16xf32>\n", r,
                         cur[i], cur[i + 1]);
      }
      memcpy(cur[m], r, 24);
    }
    if (n % 2) memcpy(cur[m++], cur[n - 1], 24);
    n = m;
  }
  memcpy(out, cur[0], 24);
}

// The max of a vector<16xf32>'s lanes as a scalar: halves folded onto each
// other by shuffles (16 -> 8 -> 4 -> 2 -> 1), kiln_emit_vec_max at each
// step.
void kiln_emit_vec_hmax(kiln_emitter_t *e, const char *v, char out[24]) {
  char cur[24];
  memcpy(cur, v, 24);
  for (int w = 8; w >= 1; w /= 2) {
    char sh[24], r[24];
    kiln_emit_fresh(e, sh);
    kiln_sbuf_printf(&e->out, "        %s = vector.shuffle %s, %s [", sh, cur, cur);
    for (int l = 0; l < 16; ++l)
      kiln_sbuf_printf(&e->out, "%s%d", l ? ", " : "", l < w ? l + w : l);
    kiln_sbuf_puts(&e->out, "] : vector<16xf32>, vector<16xf32>\n");
    kiln_emit_vec_max(e, cur, sh, r);
    memcpy(cur, r, 24);
  }
  kiln_emit_fresh(e, out);
  kiln_sbuf_printf(&e->out, "        %s = vector.extract %s[0] : f32 from vector<16xf32>\n", out,
                   cur);
}

// One row of emit_softmax_rows' loop body: row `row` of x2 (typed `ty`,
// rows of C) read, written into the block tensor `cur` ([rows, C/16, 16];
// `next` gets the result) at block row `brow`; `sv` the scale vector or
// NULL; `c0` the index 0.
static void emit_softmax_row(kiln_emitter_t *e, const kiln_node_t *n, const char *x2,
                             const char *ty, int64_t C, const char *row, const char *brow,
                             const char *pad, const char *sv, const char *c0,
                             const char *cur, char next[24]) {
  kiln_sbuf_t *o = &e->out;
  int nv = (int)((C + 15) / 16);
  bool ragged = C % 16 != 0;
  char v[64][24];
  for (int j = 0; j < nv; ++j) {
    char c[24], r[24];
    kiln_emit_fresh(e, c);
    kiln_emit_fresh(e, r);
    bool last = ragged && j == nv - 1;
    if (last) {
      // The lanes past C read as -inf: they add 0 to the sum.
      char ninf[24];
      kiln_emit_fresh(e, ninf);
      kiln_sbuf_printf(o,
          "        %s = arith.constant 0xFF800000 : f32\n"
          "        %s = arith.constant %d : index\n"
          "        %s = vector.transfer_read %s[%s, %s], %s {in_bounds = [false]} : "
          "%s, vector<16xf32>\n",
          ninf, c, j * 16, r, x2, row, c, ninf, ty);
    } else {
      kiln_sbuf_printf(o,
          "        %s = arith.constant %d : index\n"
          "        %s = vector.transfer_read %s[%s, %s], %s {in_bounds = [true]} : "
          "%s, vector<16xf32>\n",
          c, j * 16, r, x2, row, c, pad, ty);
    }
    if (sv) {
      kiln_emit_fresh(e, v[j]);
      kiln_sbuf_printf(o, "        %s = arith.mulf %s, %s : vector<16xf32>\n", v[j], r, sv);
    } else {
      memcpy(v[j], r, 24);
    }
  }
  // The row max.
  char mv[24], m[24], mb[24];
  vec_tree(e, true, v, nv, mv);
  kiln_emit_vec_hmax(e, mv, m);
  kiln_emit_fresh(e, mb);
  kiln_sbuf_printf(o, "        %s = vector.broadcast %s : f32 to vector<16xf32>\n", mb, m);
  bool soft = n->op == KILN_OP_SOFTMAX;
  char ex[64][24], xm[64][24];
  int saved = e->lanes;
  e->lanes = 16;
  for (int j = 0; j < nv; ++j) {
    kiln_emit_fresh(e, xm[j]);
    kiln_sbuf_printf(o, "        %s = arith.subf %s, %s : vector<16xf32>\n", xm[j], v[j], mb);
    kiln_emit_math(e, o, "exp_nonpositive", xm[j], KILN_F32, ex[j]);
  }
  e->lanes = saved;
  char sum_v[24], sum[24], fin[24];
  vec_tree(e, false, ex, nv, sum_v);
  kiln_emit_fresh(e, sum);
  kiln_sbuf_printf(o, "        %s = vector.reduction <add>, %s : vector<16xf32> into f32\n", sum,
                   sum_v);
  if (soft) {
    // One division per row, a multiply per element.
    char one[24], rs[24];
    kiln_emit_fresh(e, one);
    kiln_emit_fresh(e, rs);
    kiln_sbuf_printf(o,
        "        %s = arith.constant 1.0 : f32\n"
        "        %s = arith.divf %s, %s : f32\n", one, rs, one, sum);
    memcpy(sum, rs, 24);
  } else {
    char ls[24];
    kiln_emit_math(e, o, "log", sum, KILN_F32, ls);  // log_softmax: x - max - log(sum)
    memcpy(sum, ls, 24);
  }
  kiln_emit_fresh(e, fin);
  kiln_sbuf_printf(o, "        %s = vector.broadcast %s : f32 to vector<16xf32>\n", fin, sum);
  // The row's vectors go into one vector<nv x 16> and out by one write
  // into the block viewed as [rows, nv, 16]: a chain of nv writes into
  // the tensor cost one-shot bufferization time superlinear in the chain
  // (rows of 1024, two per step: 6.5 s of analysis).
  // (Rows of C not a multiple of 16: one vector<nv*16> into the block's
  // row [rows, C], its tail lanes masked off.)
  char at[24];
  kiln_emit_fresh(e, at);
  if (ragged)
    kiln_sbuf_printf(o, "        %s = ub.poison : vector<%dxf32>\n", at, nv * 16);
  else
    kiln_sbuf_printf(o, "        %s = ub.poison : vector<%dx16xf32>\n", at, nv);
  for (int j = 0; j < nv; ++j) {
    char r[24], w[24];
    kiln_emit_fresh(e, r);
    kiln_emit_fresh(e, w);
    kiln_sbuf_printf(o, "        %s = %s %s, %s : vector<16xf32>\n", r,
                     soft ? "arith.mulf" : "arith.subf", soft ? ex[j] : xm[j], fin);
    if (ragged)
      kiln_sbuf_printf(o,
          "        %s = vector.insert_strided_slice %s, %s {offsets = [%d], strides = [1]} : "
          "vector<16xf32> into vector<%dxf32>\n",
          w, r, at, j * 16, nv * 16);
    else
      kiln_sbuf_printf(o,
          "        %s = vector.insert %s, %s [%d] : vector<16xf32> into vector<%dx16xf32>\n",
          w, r, at, j, nv);
    memcpy(at, w, 24);
  }
  kiln_emit_fresh(e, next);
  if (ragged)
    kiln_sbuf_printf(o,
        "        %s = vector.transfer_write %s, %s[%s, %s] {in_bounds = [false]} : "
        "vector<%dxf32>, tensor<?x%lldxf32>\n",
        next, at, cur, brow, c0, nv * 16, (long long)C);
  else
    kiln_sbuf_printf(o,
        "        %s = vector.transfer_write %s, %s[%s, %s, %s] {in_bounds = [true, true]} : "
        "vector<%dx16xf32>, tensor<?x%dx16xf32>\n",
        next, at, cur, brow, c0, c0, nv, nv);
}

static kiln_status_t emit_softmax_rows(kiln_emitter_t *e, const kiln_node_t *n,
                                       const kiln_tv_t *x0, const kiln_type_t *rt,
                                       kiln_tv_t *out) {
  kiln_sbuf_t *o = &e->out;
  double scale = 1;
  int src = scaled_source(e, n->operands[0].value, (int)(n - e->g->nodes), &scale);
  const kiln_tv_t *x = src >= 0 ? &e->values[src] : x0;
  int64_t C = x->type.dims[x->type.rank - 1], R = kiln_type_numel(&x->type) / C;
  // Two rows per iteration where the rows pair up (their chains of max,
  // exp, sum and reciprocal are independent: one row's latency left the
  // core idle), in blocks of whole pairs for the threads: at most 64
  // blocks.
  int nr = R % 2 == 0 ? 2 : 1;
  int64_t NB = R / nr < 64 ? R / nr : 64, RB = (R / nr + NB - 1) / NB * nr;
  NB = (R + RB - 1) / RB;
  kiln_type_t t2d = x->type;
  t2d.rank = 2;
  t2d.dims[0] = R;
  t2d.dims[1] = C;
  kiln_tv_t x2, init, res;
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_reshape(e, x, &t2d, &x2));
  kiln_emit_empty(e, &t2d, init.ssa);
  kiln_emit_fresh(e, res.ssa);
  res.type = t2d;
  int id = e->next_id++;
  char ty[96];
  kiln_mlir_tensor_type(&t2d, ty, sizeof(ty));
  // The block as [rows, C / 16, 16] (whole vectors; one write per row), or
  // [rows, C] where C is not a multiple of 16 (one masked write per row).
  bool ragged = C % 16 != 0;
  char bty[64];
  if (ragged)
    snprintf(bty, sizeof(bty), "tensor<?x%lldxf32>", (long long)C);
  else
    snprintf(bty, sizeof(bty), "tensor<?x%lldx16xf32>", (long long)(C / 16));
  kiln_sbuf_printf(o,
      "    %s = scf.forall (%%sb%d) in (%lld) shared_outs(%%so%d = %s) -> (%s) {\n"
      "      %%sc0_%d = arith.constant 0 : index\n"
      "      %%scn_%d = arith.constant %d : index\n"
      "      %%spad_%d = arith.constant 0.0 : f32\n"
      "      %%sr0_%d = affine.apply affine_map<(d0) -> (d0 * %lld)>(%%sb%d)\n"
      "      %%srn_%d = affine.min affine_map<(d0) -> (%lld, %lld - d0 * %lld)>(%%sb%d)\n"
      "      %%sblk_%d = tensor.extract_slice %%so%d[%%sr0_%d, 0] [%%srn_%d, %lld] [1, 1] : "
      "%s to tensor<?x%lldxf32>\n",
      res.ssa, id, (long long)NB, id, init.ssa, ty, id, id, nr, id, id, (long long)RB, id, id,
      (long long)RB, (long long)R, (long long)RB, id, id, id, id, id, (long long)C, ty,
      (long long)C);
  if (ragged)
    kiln_sbuf_printf(o, "      %%sbv_%d = tensor.cast %%sblk_%d : %s to %s\n", id, id, bty, bty);
  else
    kiln_sbuf_printf(o,
        "      %%sbv_%d = tensor.expand_shape %%sblk_%d [[0], [1, 2]] output_shape "
        "[%%srn_%d, %lld, 16] : tensor<?x%lldxf32> into %s\n",
        id, id, id, (long long)(C / 16), (long long)C, bty);
  kiln_sbuf_printf(o,
      "      %%sout_%d = scf.for %%si%d = %%sc0_%d to %%srn_%d step %%scn_%d "
      "iter_args(%%st%d = %%sbv_%d) -> (%s) {\n",
      id, id, id, id, id, id, id, bty);
  char sv[24] = "", pad[24], cur[24];
  if (scale != 1) {
    kiln_emit_fresh(e, sv);
    float f = (float)scale;
    uint32_t u;
    memcpy(&u, &f, 4);
    kiln_sbuf_printf(o, "        %s = arith.constant dense<0x%08X> : vector<16xf32>\n", sv, u);
  }
  snprintf(pad, sizeof(pad), "%%spad_%d", id);
  snprintf(cur, sizeof(cur), "%%st%d", id);
  for (int k = 0; k < nr; ++k) {
    char row[24], brow[24], next[24];
    kiln_emit_fresh(e, brow);
    kiln_emit_fresh(e, row);
    kiln_sbuf_printf(o,
        "        %s = affine.apply affine_map<(d0) -> (d0 + %d)>(%%si%d)\n"
        "        %s = arith.addi %%sr0_%d, %s : index\n",
        brow, k, id, row, id, brow);
    char c0[24];
    snprintf(c0, sizeof(c0), "%%sc0_%d", id);
    emit_softmax_row(e, n, x2.ssa, ty, C, row, brow, pad, sv[0] ? sv : NULL, c0, cur, next);
    memcpy(cur, next, 24);
  }
  kiln_sbuf_printf(o, "        scf.yield %s : %s\n      }\n", cur, bty);
  if (ragged)
    kiln_sbuf_printf(o, "      %%sflat_%d = tensor.cast %%sout_%d : %s to %s\n", id, id, bty,
                     bty);
  else
    kiln_sbuf_printf(o,
        "      %%sflat_%d = tensor.collapse_shape %%sout_%d [[0], [1, 2]] : "
        "%s into tensor<?x%lldxf32>\n",
        id, id, bty, (long long)C);
  kiln_sbuf_printf(o,
      "      scf.forall.in_parallel {\n"
      "        tensor.parallel_insert_slice %%sflat_%d into %%so%d[%%sr0_%d, 0] [%%srn_%d, %lld] "
      "[1, 1] : tensor<?x%lldxf32> into %s\n"
      "      }\n"
      "    }\n",
      id, id, id, id, (long long)C, (long long)C, ty);
  return kiln_emit_reshape(e, &res, rt, out);
}

kiln_status_t kiln_lower_softmax(kiln_emitter_t *e, const kiln_node_t *n) {
  const kiln_tv_t *x0 = &e->values[n->operands[0].value];
  const kiln_type_t *rt = kiln_node_result_type(e->g, n, 0);
  kiln_dtype_t mt = kiln_math_dtype(rt->dtype);
  int32_t d;
  kiln_normalize_dim(kiln_node_attr_int(n, "dim", -1), x0->type.rank, &d);
  int rank = x0->type.rank;
  kiln_tv_t out;
  if (short_rows_apply(e, x0, rt, d)) {
    KILN_RETURN_IF_ERROR_PLAIN(emit_softmax_rows(e, n, x0, rt, &out));
  } else if (rank >= 2 && d == rank - 1 && rows_in_blocks(&x0->type)) {
    // One row at a time: a forall over the rows whose body runs the three
    // passes on one row, which stays in cache between them, so the input is
    // read from memory once and the output written once.
    int64_t C = x0->type.dims[rank - 1];
    int64_t R = kiln_type_numel(&x0->type) / (C ? C : 1);
    int64_t B = row_block(R, C, 16, 512 << 10);
    kiln_type_t t2d = x0->type;
    t2d.rank = 2;
    t2d.dims[0] = R;
    t2d.dims[1] = C;
    kiln_tv_t x2, init;
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_reshape(e, x0, &t2d, &x2));
    kiln_type_t o2d = t2d;
    o2d.dtype = rt->dtype;
    kiln_emit_empty(e, &o2d, init.ssa);
    init.type = o2d;
    kiln_type_t row = t2d, orow = o2d;
    row.dims[0] = orow.dims[0] = B;
    char xty[256], oty[256], rty[256], orty[256], iv[24], acc[24];
    kiln_mlir_tensor_type(&t2d, xty, sizeof(xty));
    kiln_mlir_tensor_type(&o2d, oty, sizeof(oty));
    kiln_mlir_tensor_type(&row, rty, sizeof(rty));
    kiln_mlir_tensor_type(&orow, orty, sizeof(orty));
    kiln_tv_t res;
    kiln_emit_fresh(e, res.ssa);
    res.type = o2d;
    snprintf(iv, sizeof(iv), "%%row%d", e->next_id);
    snprintf(acc, sizeof(acc), "%%rowout%d", e->next_id++);
    kiln_sbuf_printf(&e->out, "    %s = scf.forall (%s) = (0) to (%lld) step (%lld) shared_outs(%s = %s) -> (%s) {\n",
                     res.ssa, iv, (long long)R, (long long)B, acc, init.ssa, oty);
    kiln_tv_t xr, r;
    kiln_emit_fresh(e, xr.ssa);
    xr.type = row;
    kiln_sbuf_printf(&e->out, "    %s = tensor.extract_slice %s[%s, 0] [%lld, %lld] [1, 1] : %s to %s\n",
                     xr.ssa, x2.ssa, iv, (long long)B, (long long)C, xty, rty);
    bool red[KILN_MAX_RANK] = {false, true};
    KILN_RETURN_IF_ERROR_PLAIN(softmax_core(e, n->op, &xr, red, mt, rt->dtype, true, &r));
    kiln_sbuf_printf(&e->out, "    scf.forall.in_parallel {\n"
                              "      tensor.parallel_insert_slice %s into %s[%s, 0] [%lld, %lld] [1, 1] : %s into %s\n"
                              "    }\n  }\n",
                     r.ssa, acc, iv, (long long)B, (long long)C, orty, oty);
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_reshape(e, &res, rt, &out));
  } else if (e->options.cuda && rank > 2 && d == rank - 1 &&
             kiln_type_is_static(&x0->type)) {
    // CUDA: over the rows of x viewed as [R, C] (emit_rows_view), one row
    // kernel.
    kiln_tv_t x2, r;
    KILN_RETURN_IF_ERROR_PLAIN(emit_rows_view(e, x0, &x2));
    bool red[KILN_MAX_RANK] = {false, true};
    KILN_RETURN_IF_ERROR_PLAIN(softmax_core(e, n->op, &x2, red, mt, rt->dtype, false, &r));
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_reshape(e, &r, rt, &out));
  } else {
    bool red[KILN_MAX_RANK] = {0};
    if (rank) red[d] = true;
    // On the CPU a tensor that fits in the caches (the 2 MB scores of an
    // attention block) keeps exp(x - max) rather than recomputing it in the
    // output pass: reading it back from cache is cheaper than the
    // polynomial (attention's q @ k^T, softmax, @ v: 0.55 -> 0.49 ms).
    bool cached = e->options.cpu_rows && kiln_type_is_static(&x0->type) &&
                  kiln_type_numel(&x0->type) * (int64_t)kiln_dtype_size(x0->type.dtype) <=
                      (8 << 20);
    KILN_RETURN_IF_ERROR_PLAIN(softmax_core(e, n->op, x0, red, mt, rt->dtype, cached, &out));
  }
  kiln_emit_set_result(e, n, 0, &out);
  return NULL;
}

// Layer norm of `x` over its `red` dims: y (in `mt`, weight and bias of
// node `n` applied), the mean and rstd (keepdim). Three passes over x: the
// sum; the sum of squared deviations (the deviation fused into the
// reduction); the output, which recomputes the deviation instead of reading
// a stored one.
static kiln_status_t layer_norm_core(kiln_emitter_t *e, const kiln_node_t *n,
                                     const kiln_tv_t *x, const bool *red,
                                     kiln_dtype_t mt, double eps, kiln_tv_t *y_out,
                                     kiln_tv_t *mean_out, kiln_tv_t *rstd_out) {
  kiln_tv_t sum, mean, d1, sq, ss, var, ve, rstd, d2, y;
  kiln_arg_t count = kiln_emit_count(e, &x->type, red, mt, 0);
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_reduce(e, KILN_OP_SUM, x, red, true, mt, &sum));
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_binary(e, KILN_OP_DIV, kiln_arg_tensor(&sum),
                                              count, mt, &mean));
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_binary(e, KILN_OP_SUB, kiln_arg_tensor(x),
                                              kiln_arg_tensor(&mean), mt, &d1));
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_binary(e, KILN_OP_MUL, kiln_arg_tensor(&d1),
                                              kiln_arg_tensor(&d1), mt, &sq));
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_reduce(e, KILN_OP_SUM, &sq, red, true, mt, &ss));
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_binary(e, KILN_OP_DIV, kiln_arg_tensor(&ss),
                                              count, mt, &var));
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_binary(e, KILN_OP_ADD, kiln_arg_tensor(&var),
                                              kiln_arg_float(eps), mt, &ve));
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_unary(e, KILN_OP_RSQRT, &ve, mt, &rstd));
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_binary(e, KILN_OP_SUB, kiln_arg_tensor(x),
                                              kiln_arg_tensor(&mean), mt, &d2));
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_binary(e, KILN_OP_MUL, kiln_arg_tensor(&d2),
                                              kiln_arg_tensor(&rstd), mt, &y));
  for (int k = 1; k < 3 && k < n->operand_count; ++k) {
    if (n->operands[k].kind != KILN_OPERAND_VALUE) continue;
    kiln_tv_t p = e->values[n->operands[k].value], next;
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_binary(
        e, k == 1 ? KILN_OP_MUL : KILN_OP_ADD, kiln_arg_tensor(&y),
        kiln_arg_tensor(&p), mt, &next));
    y = next;
  }
  *y_out = y;
  *mean_out = mean;
  *rstd_out = rstd;
  return NULL;
}

// Layer norm over short f32 rows (16 to 1024 floats, a multiple of 16) in
// one pass, as emit_softmax_rows: a forall over blocks of rows; each row
// read once into vectors, its mean and variance from the vectors in
// registers (add trees, a horizontal sum each), (x - mean) * rstd (* w +
// b) written by one vector<C/16 x 16>, mean and rstd as scalars. The
// three flat passes read x three times: [64,128,256] (8 MB) took 0.63 ms
// against eager's 0.39; in row blocks (above 8 MB) the passes' per-block
// work cost more at rows this short.
static bool short_ln_rows_apply(const kiln_emitter_t *e, const kiln_node_t *n,
                                const kiln_tv_t *x, const kiln_type_t *const rt[3]) {
  const kiln_attr_t *ns = kiln_node_attr(n, "normalized_shape");
  int rank = x->type.rank;
  if (!e->options.cpu_rows || e->options.cuda || ns->count != 1 || rank < 2 ||
      x->type.dtype != KILN_F32 || !kiln_type_is_static(&x->type))
    return false;
  for (int k = 0; k < 3; ++k)
    if (rt[k]->dtype != KILN_F32) return false;
  for (int k = 1; k < 3 && k < n->operand_count; ++k)
    if (n->operands[k].kind == KILN_OPERAND_VALUE &&
        e->values[n->operands[k].value].type.dtype != KILN_F32)
      return false;
  int64_t C = x->type.dims[rank - 1];
  return C >= 16 && C <= 1024 && C % 16 == 0 && kiln_type_numel(&x->type) / C >= 2;
}

static kiln_status_t emit_layer_norm_rows(kiln_emitter_t *e, const kiln_node_t *n,
                                          const kiln_tv_t *x, double eps,
                                          const kiln_type_t *const rt[3], kiln_tv_t outs[3]) {
  kiln_sbuf_t *o = &e->out;
  int64_t C = x->type.dims[x->type.rank - 1], R = kiln_type_numel(&x->type) / C;
  int nv = (int)(C / 16);
  int64_t NB = R < 64 ? R : 64, RB = (R + NB - 1) / NB;
  NB = (R + RB - 1) / RB;
  kiln_type_t t2 = x->type, t1 = x->type;
  t2.rank = 2;
  t2.dims[0] = R;
  t2.dims[1] = C;
  t1.rank = 1;
  t1.dims[0] = R;
  kiln_tv_t x2, res[3];
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_reshape(e, x, &t2, &x2));
  char init[3][24], ty[96], ty1[96];
  kiln_emit_empty(e, &t2, init[0]);
  kiln_emit_empty(e, &t1, init[1]);
  kiln_emit_empty(e, &t1, init[2]);
  kiln_mlir_tensor_type(&t2, ty, sizeof(ty));
  kiln_mlir_tensor_type(&t1, ty1, sizeof(ty1));
  const char *wb[2] = {NULL, NULL};
  for (int k = 1; k < 3 && k < n->operand_count; ++k)
    if (n->operands[k].kind == KILN_OPERAND_VALUE) wb[k - 1] = e->values[n->operands[k].value].ssa;
  // 1/C and eps (printed by their bits: eps = 0 in decimal reads as an
  // integer literal).
  char inv[24], epsc[24];
  kiln_emit_scalar_const(e, o, KILN_F32, 1.0 / (double)C, inv);
  kiln_emit_scalar_const(e, o, KILN_F32, eps, epsc);
  int id = e->next_id++;
  char all[24];
  kiln_emit_fresh(e, all);
  kiln_sbuf_printf(o,
      "    %s:3 = scf.forall (%%lb%d) in (%lld) shared_outs(%%ly%d = %s, %%lm%d = %s, "
      "%%lr%d = %s) -> (%s, %s, %s) {\n"
      "      %%lc0_%d = arith.constant 0 : index\n"
      "      %%lc1_%d = arith.constant 1 : index\n"
      "      %%lpad_%d = arith.constant 0.0 : f32\n"

      "      %%lr0_%d = affine.apply affine_map<(d0) -> (d0 * %lld)>(%%lb%d)\n"
      "      %%lrn_%d = affine.min affine_map<(d0) -> (%lld, %lld - d0 * %lld)>(%%lb%d)\n"
      "      %%lyb_%d = tensor.extract_slice %%ly%d[%%lr0_%d, 0] [%%lrn_%d, %lld] [1, 1] : "
      "%s to tensor<?x%lldxf32>\n"
      "      %%lyv_%d = tensor.expand_shape %%lyb_%d [[0], [1, 2]] output_shape "
      "[%%lrn_%d, %d, 16] : tensor<?x%lldxf32> into tensor<?x%dx16xf32>\n"
      "      %%lmb_%d = tensor.extract_slice %%lm%d[%%lr0_%d] [%%lrn_%d] [1] : %s to tensor<?xf32>\n"
      "      %%lrb_%d = tensor.extract_slice %%lr%d[%%lr0_%d] [%%lrn_%d] [1] : %s to tensor<?xf32>\n"
      "      %%lo_%d:3 = scf.for %%li%d = %%lc0_%d to %%lrn_%d step %%lc1_%d "
      "iter_args(%%lty%d = %%lyv_%d, %%ltm%d = %%lmb_%d, %%ltr%d = %%lrb_%d) -> "
      "(tensor<?x%dx16xf32>, tensor<?xf32>, tensor<?xf32>) {\n"
      "        %%lrow%d = arith.addi %%lr0_%d, %%li%d : index\n",
      all, id, (long long)NB, id, init[0], id, init[1], id, init[2], ty, ty1, ty1, id, id, id,
      id, (long long)RB, id, id, (long long)RB, (long long)R,
      (long long)RB, id, id, id, id, id, (long long)C, ty, (long long)C, id, id, id, nv,
      (long long)C, nv, id, id, id, id, ty1, id, id, id, id, ty1, id, id, id, id, id, id, id,
      id, id, id, id, nv, id, id, id);
  // The row in vectors; the mean.
  char v[64][24], sumv[24], sum[24], mean[24], mb[24];
  for (int j = 0; j < nv; ++j) {
    char c[24];
    kiln_emit_fresh(e, c);
    kiln_emit_fresh(e, v[j]);
    kiln_sbuf_printf(o,
        "        %s = arith.constant %d : index\n"
        "        %s = vector.transfer_read %s[%%lrow%d, %s], %%lpad_%d {in_bounds = [true]} : "
        "%s, vector<16xf32>\n",
        c, j * 16, v[j], x2.ssa, id, c, id, ty);
  }
  vec_tree(e, false, v, nv, sumv);
  kiln_emit_fresh(e, sum);
  kiln_emit_fresh(e, mean);
  kiln_emit_fresh(e, mb);
  kiln_sbuf_printf(o,
      "        %s = vector.reduction <add>, %s : vector<16xf32> into f32\n"
      "        %s = arith.mulf %s, %s : f32\n"
      "        %s = vector.broadcast %s : f32 to vector<16xf32>\n",
      sum, sumv, mean, sum, inv, mb, mean);
  // The variance of the deviations (kept for the output); rstd.
  char d[64][24], sq[64][24], sqv[24], ss[24], var[24], ve[24], rstd[24], rb[24];
  for (int j = 0; j < nv; ++j) {
    kiln_emit_fresh(e, d[j]);
    kiln_emit_fresh(e, sq[j]);
    kiln_sbuf_printf(o,
        "        %s = arith.subf %s, %s : vector<16xf32>\n"
        "        %s = arith.mulf %s, %s : vector<16xf32>\n",
        d[j], v[j], mb, sq[j], d[j], d[j]);
  }
  vec_tree(e, false, sq, nv, sqv);
  kiln_emit_fresh(e, ss);
  kiln_emit_fresh(e, var);
  kiln_emit_fresh(e, ve);
  kiln_emit_fresh(e, rstd);
  kiln_emit_fresh(e, rb);
  kiln_sbuf_printf(o,
      "        %s = vector.reduction <add>, %s : vector<16xf32> into f32\n"
      "        %s = arith.mulf %s, %s : f32\n"
      "        %s = arith.addf %s, %s : f32\n"
      "        %s = math.rsqrt %s : f32\n"
      "        %s = vector.broadcast %s : f32 to vector<16xf32>\n",
      ss, sqv, var, ss, inv, ve, var, epsc, rstd, ve, rb, rstd);
  // y = d * rstd (* w + b), one vector<nv x 16> write.
  char at[24];
  kiln_emit_fresh(e, at);
  kiln_sbuf_printf(o, "        %s = ub.poison : vector<%dx16xf32>\n", at, nv);
  for (int j = 0; j < nv; ++j) {
    char y[24], c[24], nx[24];
    kiln_emit_fresh(e, y);
    kiln_sbuf_printf(o, "        %s = arith.mulf %s, %s : vector<16xf32>\n", y, d[j], rb);
    if (wb[0] || wb[1]) {
      kiln_emit_fresh(e, c);
      kiln_sbuf_printf(o, "        %s = arith.constant %d : index\n", c, j * 16);
    }
    for (int k = 0; k < 2; ++k) {
      if (!wb[k]) continue;
      char p[24], r[24];
      kiln_emit_fresh(e, p);
      kiln_emit_fresh(e, r);
      kiln_sbuf_printf(o,
          "        %s = vector.transfer_read %s[%s], %%lpad_%d {in_bounds = [true]} : "
          "tensor<%lldxf32>, vector<16xf32>\n"
          "        %s = %s %s, %s : vector<16xf32>\n",
          p, wb[k], c, id, (long long)C, r, k ? "arith.addf" : "arith.mulf", y, p);
      memcpy(y, r, 24);
    }
    kiln_emit_fresh(e, nx);
    kiln_sbuf_printf(o, "        %s = vector.insert %s, %s [%d] : vector<16xf32> into "
                        "vector<%dx16xf32>\n", nx, y, at, j, nv);
    memcpy(at, nx, 24);
  }
  kiln_sbuf_printf(o,
      "        %%lwy%d = vector.transfer_write %s, %%lty%d[%%li%d, %%lc0_%d, %%lc0_%d] "
      "{in_bounds = [true, true]} : vector<%dx16xf32>, tensor<?x%dx16xf32>\n"
      "        %%lwm%d = tensor.insert %s into %%ltm%d[%%li%d] : tensor<?xf32>\n"
      "        %%lwr%d = tensor.insert %s into %%ltr%d[%%li%d] : tensor<?xf32>\n"
      "        scf.yield %%lwy%d, %%lwm%d, %%lwr%d : tensor<?x%dx16xf32>, tensor<?xf32>, "
      "tensor<?xf32>\n"
      "      }\n"
      "      %%lyf_%d = tensor.collapse_shape %%lo_%d#0 [[0], [1, 2]] : tensor<?x%dx16xf32> "
      "into tensor<?x%lldxf32>\n"
      "      scf.forall.in_parallel {\n"
      "        tensor.parallel_insert_slice %%lyf_%d into %%ly%d[%%lr0_%d, 0] [%%lrn_%d, %lld] "
      "[1, 1] : tensor<?x%lldxf32> into %s\n"
      "        tensor.parallel_insert_slice %%lo_%d#1 into %%lm%d[%%lr0_%d] [%%lrn_%d] [1] : "
      "tensor<?xf32> into %s\n"
      "        tensor.parallel_insert_slice %%lo_%d#2 into %%lr%d[%%lr0_%d] [%%lrn_%d] [1] : "
      "tensor<?xf32> into %s\n"
      "      }\n"
      "    }\n",
      id, at, id, id, id, id, nv, nv, id, mean, id, id, id, rstd, id, id, id, id, id, nv,
      id, id, nv, (long long)C, id, id, id, id, (long long)C, (long long)C, ty, id, id, id,
      id, ty1, id, id, id, id, ty1);
  for (int k = 0; k < 3; ++k) {
    snprintf(res[k].ssa, sizeof(res[k].ssa), "%.20s#%d", all, k);
    res[k].type = k ? t1 : t2;
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_reshape(e, &res[k], rt[k], &outs[k]));
  }
  return NULL;
}

kiln_status_t kiln_lower_layer_norm(kiln_emitter_t *e, const kiln_node_t *n) {
  const kiln_tv_t *x0 = &e->values[n->operands[0].value];
  const kiln_type_t *rt[3];
  for (int k = 0; k < 3; ++k) rt[k] = kiln_node_result_type(e->g, n, k);
  kiln_dtype_t mt = kiln_math_dtype(rt[0]->dtype);
  const kiln_attr_t *ns = kiln_node_attr(n, "normalized_shape");
  double eps = kiln_node_attr_float(n, "eps", 1e-5);
  int rank = x0->type.rank;
  kiln_tv_t outs[3];
  if (short_ln_rows_apply(e, n, x0, rt)) {
    KILN_RETURN_IF_ERROR_PLAIN(emit_layer_norm_rows(e, n, x0, eps, rt, outs));
  } else if (e->options.cpu_rows && ns->count == 1 && rank >= 2 &&
             rows_in_blocks(&x0->type)) {
    // As softmax: a forall over blocks of rows, the three passes on each
    // block while it stays in cache, so x is read from memory once (three
    // flat passes read it three times).
    int64_t C = x0->type.dims[rank - 1];
    int64_t R = kiln_type_numel(&x0->type) / (C ? C : 1);
    int64_t B = row_block(R, C, 16, 512 << 10);
    kiln_type_t full[3], part[3];  // [R, C] / [R, 1] and their [B, ...] blocks
    for (int k = 0; k < 3; ++k) {
      memset(&full[k], 0, sizeof(full[k]));
      full[k].dtype = rt[k]->dtype;
      full[k].rank = 2;
      full[k].dims[0] = R;
      full[k].dims[1] = k == 0 ? C : 1;
      part[k] = full[k];
      part[k].dims[0] = B;
    }
    kiln_type_t x2t = full[0];
    x2t.dtype = x0->type.dtype;
    kiln_tv_t x2;
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_reshape(e, x0, &x2t, &x2));
    char fty[3][256], pty[3][256], xty[256], xpty[256], init[3][24], res[24], iv[24],
        acc[3][24];
    kiln_type_t xpart = x2t;
    xpart.dims[0] = B;
    kiln_mlir_tensor_type(&x2t, xty, sizeof(xty));
    kiln_mlir_tensor_type(&xpart, xpty, sizeof(xpty));
    for (int k = 0; k < 3; ++k) {
      kiln_mlir_tensor_type(&full[k], fty[k], sizeof(fty[k]));
      kiln_mlir_tensor_type(&part[k], pty[k], sizeof(pty[k]));
      kiln_emit_empty(e, &full[k], init[k]);
    }
    kiln_emit_fresh(e, res);
    int id = e->next_id++;
    snprintf(iv, sizeof(iv), "%%lnrow%d", id);
    for (int k = 0; k < 3; ++k) snprintf(acc[k], sizeof(acc[k]), "%%lnout%d_%d", id, k);
    kiln_sbuf_t *b = &e->out;
    kiln_sbuf_printf(b, "    %s:3 = scf.forall (%s) = (0) to (%lld) step (%lld) "
                        "shared_outs(%s = %s, %s = %s, %s = %s) -> (%s, %s, %s) {\n",
                     res, iv, (long long)R, (long long)B, acc[0], init[0], acc[1],
                     init[1], acc[2], init[2], fty[0], fty[1], fty[2]);
    kiln_tv_t xr, yb[3], cb[3];
    kiln_emit_fresh(e, xr.ssa);
    xr.type = xpart;
    kiln_sbuf_printf(b, "    %s = tensor.extract_slice %s[%s, 0] [%lld, %lld] [1, 1] : "
                        "%s to %s\n", xr.ssa, x2.ssa, iv, (long long)B, (long long)C,
                     xty, xpty);
    bool red[KILN_MAX_RANK] = {false, true};
    KILN_RETURN_IF_ERROR_PLAIN(
        layer_norm_core(e, n, &xr, red, mt, eps, &yb[0], &yb[1], &yb[2]));
    for (int k = 0; k < 3; ++k)
      KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_convert(e, &yb[k], rt[k]->dtype, &cb[k]));
    kiln_sbuf_puts(b, "    scf.forall.in_parallel {\n");
    for (int k = 0; k < 3; ++k)
      kiln_sbuf_printf(b, "      tensor.parallel_insert_slice %s into %s[%s, 0] [%lld, %lld] "
                          "[1, 1] : %s into %s\n", cb[k].ssa, acc[k], iv, (long long)B,
                       (long long)part[k].dims[1], pty[k], fty[k]);
    kiln_sbuf_puts(b, "    }\n  }\n");
    for (int k = 0; k < 3; ++k) {
      kiln_tv_t r;
      snprintf(r.ssa, sizeof(r.ssa), "%.20s#%d", res, k);
      r.type = full[k];
      KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_reshape(e, &r, rt[k], &outs[k]));
    }
  } else if (e->options.cuda && ns->count == 1 && rank > 2 &&
             kiln_type_is_static(&x0->type)) {
    // CUDA: over the rows of x viewed as [R, C], the form of the row
    // kernels (kernels/gpu_rows.c: one kernel for the three passes, a row
    // per lanes of a warp); as [B, T, C] it was five kernels.
    kiln_tv_t x2, yb[3];
    KILN_RETURN_IF_ERROR_PLAIN(emit_rows_view(e, x0, &x2));
    bool red[KILN_MAX_RANK] = {false, true};
    KILN_RETURN_IF_ERROR_PLAIN(layer_norm_core(e, n, &x2, red, mt, eps, &yb[0], &yb[1], &yb[2]));
    for (int k = 0; k < 3; ++k) {
      kiln_tv_t c;
      KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_convert(e, &yb[k], rt[k]->dtype, &c));
      KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_reshape(e, &c, rt[k], &outs[k]));
    }
  } else {
    bool red[KILN_MAX_RANK] = {0};
    for (int i = rank - ns->count; i < rank; ++i) red[i] = true;
    kiln_tv_t y, mean, rstd;
    KILN_RETURN_IF_ERROR_PLAIN(layer_norm_core(e, n, x0, red, mt, eps, &y, &mean, &rstd));
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_convert(e, &y, rt[0]->dtype, &outs[0]));
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_convert(e, &mean, rt[1]->dtype, &outs[1]));
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_convert(e, &rstd, rt[2]->dtype, &outs[2]));
  }
  for (int k = 0; k < 3; ++k) kiln_emit_set_result(e, n, k, &outs[k]);
  return NULL;
}

// The layer norm backward over rows reduced along `row`, in math dtype mt:
// x_hat = (x - mean) rstd, g = dy w, and
//   dx = rstd / N (N g - sum(g) - x_hat sum(g x_hat)),
// with dw = sum(dy x_hat) and db = sum(dy) reduced along `col` (the rows).
static kiln_status_t ln_backward_core(kiln_emitter_t *e, const kiln_tv_t *dy,
                                      const kiln_tv_t *x, const kiln_tv_t *mean,
                                      const kiln_tv_t *rstd, const kiln_tv_t *w,
                                      const bool *row, const bool *col,
                                      bool col_keepdim, kiln_dtype_t mt,
                                      kiln_tv_t *dx, kiln_tv_t *dw, kiln_tv_t *db) {
  kiln_tv_t d, xh, g, a, gx, bs, t1, t2, t3, t4, sc, dyx;
  kiln_arg_t count = kiln_emit_count(e, &x->type, row, mt, 0);
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_binary(e, KILN_OP_SUB, kiln_arg_tensor(x),
                                              kiln_arg_tensor(mean), mt, &d));
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_binary(e, KILN_OP_MUL, kiln_arg_tensor(&d),
                                              kiln_arg_tensor(rstd), mt, &xh));
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_binary(e, KILN_OP_MUL, kiln_arg_tensor(dy),
                                              kiln_arg_tensor(w), mt, &g));
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_reduce(e, KILN_OP_SUM, &g, row, true, mt, &a));
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_binary(e, KILN_OP_MUL, kiln_arg_tensor(&g),
                                              kiln_arg_tensor(&xh), mt, &gx));
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_reduce(e, KILN_OP_SUM, &gx, row, true, mt, &bs));
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_binary(e, KILN_OP_MUL, kiln_arg_tensor(&g), count,
                                              mt, &t1));
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_binary(e, KILN_OP_SUB, kiln_arg_tensor(&t1),
                                              kiln_arg_tensor(&a), mt, &t2));
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_binary(e, KILN_OP_MUL, kiln_arg_tensor(&xh),
                                              kiln_arg_tensor(&bs), mt, &t3));
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_binary(e, KILN_OP_SUB, kiln_arg_tensor(&t2),
                                              kiln_arg_tensor(&t3), mt, &t4));
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_binary(e, KILN_OP_DIV, kiln_arg_tensor(rstd), count,
                                              mt, &sc));
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_binary(e, KILN_OP_MUL, kiln_arg_tensor(&sc),
                                              kiln_arg_tensor(&t4), mt, dx));
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_binary(e, KILN_OP_MUL, kiln_arg_tensor(dy),
                                              kiln_arg_tensor(&xh), mt, &dyx));
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_reduce(e, KILN_OP_SUM, &dyx, col, col_keepdim, mt, dw));
  return kiln_emit_reduce(e, KILN_OP_SUM, dy, col, col_keepdim, mt, db);
}

kiln_status_t kiln_lower_layer_norm_backward(kiln_emitter_t *e, const kiln_node_t *n) {
  const kiln_tv_t *in[5];
  for (int k = 0; k < 5; ++k) in[k] = &e->values[n->operands[k].value];
  const kiln_tv_t *x0 = in[1];
  const kiln_type_t *rt[3];
  for (int k = 0; k < 3; ++k) rt[k] = kiln_node_result_type(e->g, n, k);
  kiln_dtype_t mt = kiln_math_dtype(rt[0]->dtype);
  const kiln_attr_t *ns = kiln_node_attr(n, "normalized_shape");
  int rank = x0->type.rank;
  kiln_tv_t dx, dw, db, outs[3];
  if (e->options.cpu_rows && ns->count == 1 && rank >= 2 &&
      kiln_type_is_static(&x0->type) && kiln_type_numel(&x0->type) * 4 >= (1 << 20)) {
    // A forall over blocks of B rows: each block's row sums, dx and its
    // partial dw / db (a row of [P, C] each) while the block of x and dy
    // stays in cache; then dw and db sum the P partials. The flat form
    // reads x and dy from memory about four times (x_hat and g written out
    // for the row sums, the column sums and dx).
    int64_t C = x0->type.dims[rank - 1];
    int64_t R = kiln_type_numel(&x0->type) / (C ? C : 1);
    // Up to 64 rows and 32 KB of x per block: fewer, larger blocks than
    // the forward's, since each block also writes a row of partial weight
    // and bias gradients.
    int64_t B = row_block(R, C, 64, 32 << 10), P = R / B;
    kiln_type_t rows = x0->type, stat = x0->type, blk, part, pblk;
    rows.rank = stat.rank = 2;
    rows.dims[0] = stat.dims[0] = R;
    rows.dims[1] = C;
    stat.dims[1] = 1;
    kiln_tv_t v[4];  // dy, x as [R, C]; mean, rstd as [R, 1]
    for (int k = 0; k < 4; ++k) {
      kiln_type_t t = k < 2 ? rows : stat;
      t.dtype = in[k]->type.dtype;
      KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_reshape(e, in[k], &t, &v[k]));
    }
    kiln_type_t dxt = rows;
    dxt.dtype = rt[0]->dtype;
    memset(&part, 0, sizeof(part));
    part.dtype = mt;
    part.rank = 2;
    part.dims[0] = P;
    part.dims[1] = C;
    pblk = part;
    pblk.dims[0] = 1;
    blk = dxt;
    blk.dims[0] = B;
    char init[3][24], ty[3][256], bty[3][256], res[24], iv[24], r0[24], acc[3][24];
    kiln_emit_empty(e, &dxt, init[0]);
    kiln_emit_empty(e, &part, init[1]);
    kiln_emit_empty(e, &part, init[2]);
    kiln_mlir_tensor_type(&dxt, ty[0], sizeof(ty[0]));
    kiln_mlir_tensor_type(&part, ty[1], sizeof(ty[1]));
    kiln_mlir_tensor_type(&part, ty[2], sizeof(ty[2]));
    kiln_mlir_tensor_type(&blk, bty[0], sizeof(bty[0]));
    kiln_mlir_tensor_type(&pblk, bty[1], sizeof(bty[1]));
    kiln_mlir_tensor_type(&pblk, bty[2], sizeof(bty[2]));
    kiln_emit_fresh(e, res);
    int id = e->next_id++;
    snprintf(iv, sizeof(iv), "%%lnbblk%d", id);
    snprintf(r0, sizeof(r0), "%%lnbrow%d", id);
    for (int k = 0; k < 3; ++k) snprintf(acc[k], sizeof(acc[k]), "%%lnbout%d_%d", id, k);
    kiln_sbuf_t *b = &e->out;
    kiln_sbuf_printf(b, "    %s:3 = scf.forall (%s) in (%lld) shared_outs(%s = %s, %s = %s, "
                        "%s = %s) -> (%s, %s, %s) {\n",
                     res, iv, (long long)P, acc[0], init[0], acc[1], init[1], acc[2],
                     init[2], ty[0], ty[1], ty[2]);
    kiln_sbuf_printf(b, "    %s = affine.apply affine_map<(d0) -> (d0 * %lld)>(%s)\n", r0,
                     (long long)B, iv);
    kiln_tv_t s[4];
    for (int k = 0; k < 4; ++k) {
      kiln_type_t ft = k < 2 ? rows : stat, st;
      ft.dtype = in[k]->type.dtype;
      st = ft;
      st.dims[0] = B;
      char fty[256];
      kiln_mlir_tensor_type(&ft, fty, sizeof(fty));
      kiln_emit_fresh(e, s[k].ssa);
      s[k].type = st;
      char sty[256];
      kiln_mlir_tensor_type(&st, sty, sizeof(sty));
      kiln_sbuf_printf(b, "    %s = tensor.extract_slice %s[%s, 0] [%lld, %lld] [1, 1] : "
                          "%s to %s\n", s[k].ssa, v[k].ssa, r0, (long long)B,
                       (long long)st.dims[1], fty, sty);
    }
    bool row[KILN_MAX_RANK] = {false, true}, col[KILN_MAX_RANK] = {true, false};
    kiln_tv_t dxb, dwb, dbb, dxc;
    KILN_RETURN_IF_ERROR_PLAIN(ln_backward_core(e, &s[0], &s[1], &s[2], &s[3], in[4], row,
                                                col, true, mt, &dxb, &dwb, &dbb));
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_convert(e, &dxb, rt[0]->dtype, &dxc));
    kiln_sbuf_printf(b, "    scf.forall.in_parallel {\n"
                        "      tensor.parallel_insert_slice %s into %s[%s, 0] [%lld, %lld] "
                        "[1, 1] : %s into %s\n",
                     dxc.ssa, acc[0], r0, (long long)B, (long long)C, bty[0], ty[0]);
    const kiln_tv_t *pb[2] = {&dwb, &dbb};
    for (int k = 1; k < 3; ++k)
      kiln_sbuf_printf(b, "      tensor.parallel_insert_slice %s into %s[%s, 0] [1, %lld] "
                          "[1, 1] : %s into %s\n",
                       pb[k - 1]->ssa, acc[k], iv, (long long)C, bty[k], ty[k]);
    kiln_sbuf_puts(b, "    }\n  }\n");
    kiln_tv_t r[3];
    for (int k = 0; k < 3; ++k) {
      snprintf(r[k].ssa, sizeof(r[k].ssa), "%.20s#%d", res, k);
      r[k].type = k == 0 ? dxt : part;
    }
    bool parts[KILN_MAX_RANK] = {true, false};
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_reshape(e, &r[0], rt[0], &outs[0]));
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_reduce(e, KILN_OP_SUM, &r[1], parts, false, mt, &dw));
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_reduce(e, KILN_OP_SUM, &r[2], parts, false, mt, &db));
  } else {
    bool row[KILN_MAX_RANK] = {0}, col[KILN_MAX_RANK] = {0};
    for (int i = 0; i < rank; ++i) {
      row[i] = i >= rank - ns->count;
      col[i] = !row[i];
    }
    KILN_RETURN_IF_ERROR_PLAIN(ln_backward_core(e, in[0], in[1], in[2], in[3], in[4], row,
                                                col, false, mt, &dx, &dw, &db));
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_convert(e, &dx, rt[0]->dtype, &outs[0]));
  }
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_convert(e, &dw, rt[1]->dtype, &outs[1]));
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_convert(e, &db, rt[2]->dtype, &outs[2]));
  for (int k = 0; k < 3; ++k) kiln_emit_set_result(e, n, k, &outs[k]);
  return NULL;
}

kiln_status_t kiln_lower_embedding(kiln_emitter_t *e, const kiln_node_t *n) {
  const kiln_tv_t *w = &e->values[n->operands[0].value];
  const kiln_tv_t *idx = &e->values[n->operands[1].value];
  const kiln_type_t *rt = kiln_node_result_type(e->g, n, 0);
  kiln_sbuf_t *b = &e->out;
  char empty[24], oty[256], ity[256], wty[256];
  kiln_mlir_tensor_type(rt, oty, sizeof(oty));
  kiln_mlir_tensor_type(&idx->type, ity, sizeof(ity));
  kiln_mlir_tensor_type(&w->type, wty, sizeof(wty));
  if (KILN_IS_SYM(w->type.dims[0]))
    return kiln_emit_error(e, KILN_STATUS_UNSUPPORTED,
                           "symbolic number of rows in the embedding table; "
                           "expected a static size");
  kiln_emit_empty(e, rt, empty);
  kiln_tv_t out;
  kiln_emit_fresh(e, out.ssa);
  out.type = *rt;
  int r = rt->rank;
  // One generic over the result with no inputs: the row's index is read in
  // the body at the leading loops' positions, so the vectorizer sees it
  // invariant along the vectorized last dim and the table row as a
  // contiguous load. (As an input read through a broadcasting map it
  // became a vector of indices, and every row a vector.gather: LLVM
  // scalarizes a 16-bit gather, bf16 [8, 512] tokens of 512 took 0.56 ms
  // against f32's 0.21.)
  kiln_sbuf_printf(b, "    %s = linalg.generic {indexing_maps = [affine_map<(", out.ssa);
  for (int i = 0; i < r; ++i) kiln_sbuf_printf(b, "%sd%d", i ? ", " : "", i);
  kiln_sbuf_puts(b, ") -> (");
  for (int i = 0; i < r; ++i) kiln_sbuf_printf(b, "%sd%d", i ? ", " : "", i);
  kiln_sbuf_puts(b, ")>], iterator_types = [");
  for (int i = 0; i < r; ++i) kiln_sbuf_printf(b, "%s\"parallel\"", i ? ", " : "");
  int id = e->next_id++;
  const char *ie = kiln_mlir_elem(idx->type.dtype);
  kiln_sbuf_printf(b, "]} outs(%s : %s) {\n"
                      "  ^bb0(%%o%d: %s):\n",
                   empty, oty, id, kiln_mlir_storage_elem(rt->dtype));
  for (int i = 0; i < r - 1; ++i)
    kiln_sbuf_printf(b, "    %%p%d_%d = linalg.index %d : index\n", id, i, i);
  kiln_sbuf_printf(b, "    %%i%d = tensor.extract %s[", id, idx->ssa);
  for (int i = 0; i < r - 1; ++i) kiln_sbuf_printf(b, "%s%%p%d_%d", i ? ", " : "", id, i);
  kiln_sbuf_printf(b, "] : %s\n", ity);
  // Indices are clamped into the table: compiled code never reads outside
  // its inputs (the reference interpreter clamps the same way).
  kiln_sbuf_printf(b,
                   "    %%ix%d = arith.index_cast %%i%d : %s to index\n"
                   "    %%z%d = arith.constant 0 : index\n"
                   "    %%hi%d = arith.constant %lld : index\n"
                   "    %%lo%d = arith.maxsi %%ix%d, %%z%d : index\n"
                   "    %%row%d = arith.minsi %%lo%d, %%hi%d : index\n"
                   "    %%col%d = linalg.index %d : index\n"
                   "    %%v%d = tensor.extract %s[%%row%d, %%col%d] : %s\n"
                   "    linalg.yield %%v%d : %s\n  } -> %s\n",
                   id, id, ie, id, id, (long long)(w->type.dims[0] - 1), id,
                   id, id, id, id, id, id, r - 1, id, w->ssa, id, id, wty, id,
                   kiln_mlir_elem(rt->dtype), oty);
  kiln_emit_set_result(e, n, 0, &out);
  return NULL;
}

// x indexed by k tensors on its dims `dim` .. `dim` + k - 1 (aten.index:
// x[:, :, ih, iw], a nearest upsampling's form), broadcast together to B:
// one generic over the result, the index tensors read through broadcasting
// maps into B's loops, x read by tensor.extract (a gather; the CPU schedule
// vectorizes it from a dense x). A negative index counts from the end and
// one still outside the dim is clamped into it: compiled code never reads
// outside x (PyTorch raises; the reference interpreter clamps the same way).
kiln_status_t kiln_lower_index(kiln_emitter_t *e, const kiln_node_t *n) {
  const kiln_tv_t *x = &e->values[n->operands[0].value];
  const kiln_type_t *rt = kiln_node_result_type(e->g, n, 0);
  kiln_sbuf_t *b = &e->out;
  int k = n->operand_count - 1;
  int dim = (int)kiln_node_attr_int(n, "dim", 0);
  int r = rt->rank, brank = r - x->type.rank + k;
  char empty[24], oty[256], xty[256], sizes[KILN_MAX_RANK][24];
  kiln_mlir_tensor_type(rt, oty, sizeof(oty));
  kiln_mlir_tensor_type(&x->type, xty, sizeof(xty));
  // The indexed dims' sizes as index values (for the wrap and the clamp).
  for (int j = 0; j < k; ++j) {
    kiln_emit_fresh(e, sizes[j]);
    int64_t d = x->type.dims[dim + j];
    if (KILN_IS_SYM(d)) {
      char c[24];
      kiln_emit_fresh(e, c);
      kiln_sbuf_printf(b, "    %s = arith.constant %d : index\n"
                          "    %s = tensor.dim %s, %s : %s\n",
                       c, dim + j, sizes[j], x->ssa, c, xty);
    } else {
      kiln_sbuf_printf(b, "    %s = arith.constant %lld : index\n", sizes[j], (long long)d);
    }
  }
  // A 1-D x is read as [1, N]: the vectorizer turns a one-index
  // tensor.extract into a vector.gather even where the CPU schedule leaves
  // the op scalar (an x that may be strided), and a strided vector.gather
  // has no LLVM lowering.
  char src[24], srcty[256];
  snprintf(src, sizeof(src), "%s", x->ssa);
  snprintf(srcty, sizeof(srcty), "%s", xty);
  bool lift = x->type.rank == 1;
  if (lift) {
    kiln_type_t lt = x->type;
    lt.rank = 2;
    lt.dims[0] = 1;
    lt.dims[1] = x->type.dims[0];
    kiln_mlir_tensor_type(&lt, srcty, sizeof(srcty));
    kiln_emit_fresh(e, src);
    char n0[24];
    kiln_emit_size_operand(e, &x->type, 0, n0);
    kiln_sbuf_printf(b, "    %s = tensor.expand_shape %s [[0, 1]] output_shape [1, %s] : %s into %s\n",
                     src, x->ssa, n0, xty, srcty);
  }
  kiln_emit_empty(e, rt, empty);
  kiln_tv_t out;
  kiln_emit_fresh(e, out.ssa);
  out.type = *rt;
  kiln_sbuf_printf(b, "    %s = linalg.generic {indexing_maps = [", out.ssa);
  for (int j = 0; j <= k; ++j) {
    kiln_sbuf_puts(b, j ? ", affine_map<(" : "affine_map<(");
    for (int i = 0; i < r; ++i) kiln_sbuf_printf(b, "%sd%d", i ? ", " : "", i);
    kiln_sbuf_puts(b, ") -> (");
    if (j == k) {
      for (int i = 0; i < r; ++i) kiln_sbuf_printf(b, "%sd%d", i ? ", " : "", i);
    } else {
      // Index tensor j, right-aligned in B (result loops dim .. dim +
      // brank - 1); a dim of size 1 broadcasts.
      const kiln_type_t *it = &e->values[n->operands[1 + j].value].type;
      for (int i = 0; i < it->rank; ++i) {
        int loop = dim + brank - it->rank + i;
        if (it->dims[i] == 1 && rt->dims[loop] != 1)
          kiln_sbuf_printf(b, "%s0", i ? ", " : "");
        else
          kiln_sbuf_printf(b, "%sd%d", i ? ", " : "", loop);
      }
    }
    kiln_sbuf_puts(b, ")>");
  }
  kiln_sbuf_puts(b, "], iterator_types = [");
  for (int i = 0; i < r; ++i) kiln_sbuf_printf(b, "%s\"parallel\"", i ? ", " : "");
  kiln_sbuf_puts(b, "]} ins(");
  for (int j = 0; j < k; ++j)
    kiln_sbuf_printf(b, "%s%s", j ? ", " : "", e->values[n->operands[1 + j].value].ssa);
  kiln_sbuf_puts(b, " : ");
  for (int j = 0; j < k; ++j) {
    char ity[256];
    kiln_mlir_tensor_type(&e->values[n->operands[1 + j].value].type, ity, sizeof(ity));
    kiln_sbuf_printf(b, "%s%s", j ? ", " : "", ity);
  }
  int id = e->next_id++;
  kiln_sbuf_printf(b, ") outs(%s : %s) {\n  ^bb0(", empty, oty);
  for (int j = 0; j < k; ++j)
    kiln_sbuf_printf(b, "%%i%d_%d: %s, ", id, j,
                     kiln_mlir_elem(e->values[n->operands[1 + j].value].type.dtype));
  kiln_sbuf_printf(b, "%%o%d: %s):\n", id, kiln_mlir_storage_elem(rt->dtype));
  kiln_sbuf_printf(b, "    %%z%d = arith.constant 0 : index\n"
                      "    %%one%d = arith.constant 1 : index\n", id, id);
  for (int j = 0; j < k; ++j) {
    const char *ie = kiln_mlir_elem(e->values[n->operands[1 + j].value].type.dtype);
    kiln_sbuf_printf(b,
        "    %%ix%d_%d = arith.index_cast %%i%d_%d : %s to index\n"
        "    %%neg%d_%d = arith.cmpi slt, %%ix%d_%d, %%z%d : index\n"
        "    %%up%d_%d = arith.addi %%ix%d_%d, %s : index\n"
        "    %%w%d_%d = arith.select %%neg%d_%d, %%up%d_%d, %%ix%d_%d : index\n"
        "    %%hi%d_%d = arith.subi %s, %%one%d : index\n"
        "    %%lo%d_%d = arith.maxsi %%w%d_%d, %%z%d : index\n"
        "    %%x%d_%d = arith.minsi %%lo%d_%d, %%hi%d_%d : index\n",
        id, j, id, j, ie, id, j, id, j, id, id, j, id, j, sizes[j], id, j, id, j, id, j,
        id, j, id, j, sizes[j], id, id, j, id, j, id, id, j, id, j, id, j);
  }
  for (int i = 0; i < r; ++i)
    if (i < dim || i >= dim + brank)
      kiln_sbuf_printf(b, "    %%l%d_%d = linalg.index %d : index\n", id, i, i);
  kiln_sbuf_printf(b, "    %%v%d = tensor.extract %s[%s", id, src, lift ? "%z" : "");
  if (lift) kiln_sbuf_printf(b, "%d, ", id);
  for (int i = 0; i < x->type.rank; ++i) {
    if (i) kiln_sbuf_puts(b, ", ");
    if (i < dim)
      kiln_sbuf_printf(b, "%%l%d_%d", id, i);
    else if (i < dim + k)
      kiln_sbuf_printf(b, "%%x%d_%d", id, i - dim);
    else
      kiln_sbuf_printf(b, "%%l%d_%d", id, i - k + brank);
  }
  kiln_sbuf_printf(b, "] : %s\n    linalg.yield %%v%d : %s\n  } -> %s\n", srcty, id,
                   kiln_mlir_storage_elem(rt->dtype), oty);
  kiln_emit_set_result(e, n, 0, &out);
  return NULL;
}

// index_put(base[V, D], indices, values, accumulate): out[v, d] = base[v,
// d] + the sum over positions p with wrap(indices[p]) == v of values[p, d]
// (wrap: a negative index counts from the end; one still outside [0, V)
// matches no row). One reduction over p: no scatter, no atomics, the same
// result at every run. It reads every value for every row (V x P x D),
// which is what the translation's size cap on V x P bounds (an embedding
// gradient with a small table).
kiln_status_t kiln_lower_index_put(kiln_emitter_t *e, const kiln_node_t *n) {
  const kiln_tv_t *base = &e->values[n->operands[0].value];
  const kiln_tv_t *idx = &e->values[n->operands[1].value];
  const kiln_tv_t *val = &e->values[n->operands[2].value];
  const kiln_type_t *rt = kiln_node_result_type(e->g, n, 0);
  if (!kiln_type_is_static(&idx->type) || !kiln_type_is_static(&base->type))
    return kiln_emit_error(e, KILN_STATUS_UNSUPPORTED,
                           "symbolic sizes in index_put; expected static ones");
  int64_t V = base->type.dims[0], D = base->type.dims[1];
  int64_t P = kiln_type_numel(&idx->type);
  kiln_type_t it = idx->type, vt = val->type;
  it.rank = 1;
  it.dims[0] = P;
  vt.rank = 2;
  vt.dims[0] = P;
  vt.dims[1] = D;
  kiln_tv_t i1, v2;
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_reshape(e, idx, &it, &i1));
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_reshape(e, val, &vt, &v2));
  char ity[256], vty[256], oty[256];
  kiln_mlir_tensor_type(&i1.type, ity, sizeof(ity));
  kiln_mlir_tensor_type(&v2.type, vty, sizeof(vty));
  kiln_mlir_tensor_type(rt, oty, sizeof(oty));
  kiln_tv_t out;
  kiln_emit_fresh(e, out.ssa);
  out.type = *rt;
  int id = e->next_id++;
  const char *ie = kiln_mlir_elem(idx->type.dtype);
  if (e->options.cuda && kiln_kernels_sgemm_whole(V, D, P)) {
    // CUDA, where the f32 GEMM kernel takes [V, P] x [P, D] in whole tiles
    // (a ragged vocabulary keeps the reduction form): the one-hot
    // matrix of the wrapped indices times the values (split over P by the
    // kernel), plus base. The reduction form's partials were written by
    // scattered stores (0.9-1.2 ms for 256 x 64 outputs over 4096
    // positions on the H100). 1.0 * x and 0.0 * x are exact, so finite
    // values give the same sums; a non-finite value reaches every row of
    // its column (0 * inf is NaN), where PyTorch's reaches its own row.
    // Both operands reach the matmul through tensor.reshape, which
    // elementwise fusion does not cross: it stays a named matmul.
    // i64 indices: with 4-byte elements the elementwise schedule would
    // vectorize the generic, whose `l mod P` map the vectorizer rejects.
    kiln_tv_t i64v = i1;
    if (idx->type.dtype != KILN_I64)
      KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_convert(e, &i1, KILN_I64, &i64v));
    kiln_mlir_tensor_type(&i64v.type, ity, sizeof(ity));
    ie = kiln_mlir_elem(KILN_I64);
    kiln_type_t flat = *rt, ht = *rt;
    flat.rank = 1;
    flat.dims[0] = V * P;
    ht.dims[0] = V;
    ht.dims[1] = P;
    char fty[256], empty[24];
    kiln_mlir_tensor_type(&flat, fty, sizeof(fty));
    kiln_emit_empty(e, &flat, empty);
    kiln_tv_t hot1, hot, vals, zero, prod;
    kiln_emit_fresh(e, hot1.ssa);
    hot1.type = flat;
    // Value names of the body: %<name>_h<id>.
    char t[16];
    snprintf(t, sizeof(t), "_h%d", id);
    kiln_sbuf_printf(&e->out,
                     "    %s = linalg.generic {indexing_maps = [affine_map<(l) -> (l mod %lld)>, "
                     "affine_map<(l) -> (l)>], iterator_types = [\"parallel\"]} "
                     "ins(%s : %s) outs(%s : %s) {\n",
                     hot1.ssa, (long long)P, i64v.ssa, ity, empty, fty);
    kiln_sbuf_printf(&e->out, "  ^bb0(%%ip%s: %s, %%o%s: f32):\n", t, ie, t);
    kiln_sbuf_printf(&e->out, "    %%ix%s = arith.index_cast %%ip%s : %s to index\n", t, t, ie);
    kiln_sbuf_printf(&e->out, "    %%z%s = arith.constant 0 : index\n", t);
    kiln_sbuf_printf(&e->out, "    %%nv%s = arith.constant %lld : index\n", t, (long long)V);
    kiln_sbuf_printf(&e->out, "    %%np%s = arith.constant %lld : index\n", t, (long long)P);
    kiln_sbuf_printf(&e->out, "    %%neg%s = arith.cmpi slt, %%ix%s, %%z%s : index\n", t, t, t);
    kiln_sbuf_printf(&e->out, "    %%wr%s = arith.addi %%ix%s, %%nv%s : index\n", t, t, t);
    kiln_sbuf_printf(&e->out, "    %%k%s = arith.select %%neg%s, %%wr%s, %%ix%s : index\n", t, t,
                     t, t);
    kiln_sbuf_printf(&e->out, "    %%l%s = linalg.index 0 : index\n", t);
    kiln_sbuf_printf(&e->out, "    %%row%s = arith.divui %%l%s, %%np%s : index\n", t, t, t);
    kiln_sbuf_printf(&e->out, "    %%hit%s = arith.cmpi eq, %%k%s, %%row%s : index\n", t, t, t);
    kiln_sbuf_printf(&e->out, "    %%one%s = arith.constant 1.0 : f32\n", t);
    kiln_sbuf_printf(&e->out, "    %%zf%s = arith.constant 0.0 : f32\n", t);
    kiln_sbuf_printf(&e->out, "    %%y%s = arith.select %%hit%s, %%one%s, %%zf%s : f32\n", t, t, t,
                     t);
    kiln_sbuf_printf(&e->out, "    linalg.yield %%y%s : f32\n  } -> %s\n", t, fty);
    kiln_emit_view(e, &hot1, &ht, &hot);
    kiln_emit_view(e, val, &vt, &vals);
    char hty[256];
    kiln_mlir_tensor_type(&ht, hty, sizeof(hty));
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_filled(e, rt, 0, &zero));
    kiln_emit_fresh(e, prod.ssa);
    prod.type = *rt;
    kiln_sbuf_printf(&e->out, "    %s = linalg.matmul ins(%s, %s : %s, %s) outs(%s : %s) -> %s\n",
                     prod.ssa, hot.ssa, vals.ssa, hty, vty, zero.ssa, oty, oty);
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_binary(e, KILN_OP_ADD, kiln_arg_tensor(base),
                                                kiln_arg_tensor(&prod), KILN_F32, &out));
    kiln_emit_set_result(e, n, 0, &out);
    return NULL;
  }
  // The CPU vectorizes over d with p outermost; on CUDA (shapes the GEMM
  // kernel does not take) p is innermost, a thread per output: an
  // outermost reduction over a d that is not a multiple of 32 would leave
  // its loop on the host.
  const char *maps = e->options.cuda
      ? "affine_map<(v, d, p) -> (p)>, affine_map<(v, d, p) -> (p, d)>, "
        "affine_map<(v, d, p) -> (v, d)>], iterator_types = [\"parallel\", "
        "\"parallel\", \"reduction\"]"
      : "affine_map<(p, v, d) -> (p)>, affine_map<(p, v, d) -> (p, d)>, "
        "affine_map<(p, v, d) -> (v, d)>], iterator_types = [\"reduction\", "
        "\"parallel\", \"parallel\"]";
  kiln_sbuf_printf(&e->out,
                   "    %s = linalg.generic {indexing_maps = [%s} "
                   "ins(%s, %s : %s, %s) outs(%s : %s) {\n"
                   "  ^bb0(%%ip%d: %s, %%x%d: f32, %%acc%d: f32):\n"
                   "    %%ix%d = arith.index_cast %%ip%d : %s to index\n"
                   "    %%z%d = arith.constant 0 : index\n"
                   "    %%nv%d = arith.constant %lld : index\n"
                   "    %%neg%d = arith.cmpi slt, %%ix%d, %%z%d : index\n"
                   "    %%wr%d = arith.addi %%ix%d, %%nv%d : index\n"
                   "    %%k%d = arith.select %%neg%d, %%wr%d, %%ix%d : index\n"
                   "    %%row%d = linalg.index %d : index\n"
                   "    %%hit%d = arith.cmpi eq, %%k%d, %%row%d : index\n"
                   "    %%zf%d = arith.constant 0.0 : f32\n"
                   "    %%add%d = arith.select %%hit%d, %%x%d, %%zf%d : f32\n"
                   "    %%s%d = arith.addf %%acc%d, %%add%d : f32\n"
                   "    linalg.yield %%s%d : f32\n  } -> %s\n",
                   out.ssa, maps, i1.ssa, v2.ssa, ity, vty, base->ssa, oty,
                   id, ie, id, id,
                   id, id, ie,
                   id,
                   id, (long long)V,
                   id, id, id,
                   id, id, id,
                   id, id, id, id,
                   id, e->options.cuda ? 0 : 1,
                   id, id, id,
                   id,
                   id, id, id, id,
                   id, id, id,
                   id, oty);
  kiln_emit_set_result(e, n, 0, &out);
  return NULL;
}

// max_pool2d (values; PyTorch's indices are not computed): the input,
// padded with -inf where `padding` asks for it (kiln_emit_pad_planes: the
// input's slabs inserted by threads, then the border filled), and for each
// of the KH x KW taps its strided window [N, C, OH, OW] (tensor.extract_slice at (kh*dh, kw*dw),
// strides (sh, sw)); the taps are combined by maximum (NaN propagates, as
// in PyTorch), ops that elementwise fusion makes one loop reading the
// taps in place. CPU only.
kiln_status_t kiln_lower_max_pool2d(kiln_emitter_t *e, const kiln_node_t *n) {
  if (e->options.cuda)
    return kiln_make_status(KILN_STATUS_UNSUPPORTED,
                            "aten.max_pool2d: no lowering for the CUDA target (CPU only)");
  kiln_tv_t x = e->values[n->operands[0].value];
  const kiln_type_t *rt = kiln_node_result_type(e->g, n, 0);
  int64_t k[2], st[2], pd[2], dl[2];
  kiln_node_pool_window(n, k, st, pd, dl);
  kiln_sbuf_t *b = &e->out;
  if (pd[0] || pd[1]) {
    // Windows reach at most (O - 1) * s + (k - 1) * d of the padded input;
    // floor division may leave its last rows and columns unread.
    kiln_type_t pt = x.type;
    pt.dims[2] += 2 * pd[0];
    pt.dims[3] += 2 * pd[1];
    kiln_tv_t z, p;
    if (kiln_type_is_static(&x.type)) {
      KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_pad_planes(e, &x, 1, &pt, pd[0], pd[1], -INFINITY, &p));
    } else {
      KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_filled(e, &pt, -INFINITY, &z));
      int64_t offsets[4] = {0, 0, pd[0], pd[1]};
      kiln_emit_insert_slabs(e, &x, &z, offsets, true, &p);
    }
    x = p;
  }
  char xty[256], wty[256];
  kiln_type_t wt = *rt;
  wt.dtype = x.type.dtype;
  kiln_mlir_tensor_type(&x.type, xty, sizeof(xty));
  kiln_mlir_tensor_type(&wt, wty, sizeof(wty));
  kiln_tv_t acc = {.ssa = ""};
  for (int64_t kh = 0; kh < k[0]; ++kh)
    for (int64_t kw = 0; kw < k[1]; ++kw) {
      kiln_tv_t tap = {.type = wt};
      kiln_emit_fresh(e, tap.ssa);
      kiln_sbuf_printf(b, "    %s = tensor.extract_slice %s[0, 0, %lld, %lld] [%lld, %lld, "
                          "%lld, %lld] [1, 1, %lld, %lld] : %s to %s\n",
                       tap.ssa, x.ssa, (long long)(kh * dl[0]), (long long)(kw * dl[1]),
                       (long long)wt.dims[0], (long long)wt.dims[1], (long long)wt.dims[2],
                       (long long)wt.dims[3], (long long)st[0], (long long)st[1], xty, wty);
      if (!acc.ssa[0]) {
        acc = tap;
        continue;
      }
      kiln_tv_t m;
      KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_binary(e, KILN_OP_MAXIMUM, kiln_arg_tensor(&acc),
                                                  kiln_arg_tensor(&tap), x.type.dtype, &m));
      acc = m;
    }
  if (k[0] * k[1] == 1) {
    // One tap: the strided window itself, copied into a dense result.
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_unary(e, KILN_OP_CLONE, &acc, x.type.dtype, &acc));
  }
  kiln_emit_set_result(e, n, 0, &acc);
  return NULL;
}
