// Data movement: permutes, views, broadcasts, slices, concatenation, and the
// ops that create tensors (full, constant).
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "lowering/emit.h"

void kiln_permute_source(kiln_emitter_t *e, const kiln_node_t *n, int rank,
                         int32_t *perm, const kiln_tv_t **src) {
  kiln_node_permutation(n, rank, perm);
  *src = &e->values[n->operands[0].value];
  // A permute of a permute is one permute of the original (autograd's
  // backward graphs transpose weights back and forth): compose them, so at
  // most one transpose is materialized, none when they cancel.
  const kiln_value_t *in = &e->g->values[n->operands[0].value];
  if (in->node < 0) return;
  const kiln_node_t *p = &e->g->nodes[in->node];
  if (p->op != KILN_OP_PERMUTE && p->op != KILN_OP_TRANSPOSE) return;
  int32_t inner[KILN_MAX_RANK], composed[KILN_MAX_RANK];
  kiln_node_permutation(p, rank, inner);
  for (int i = 0; i < rank; ++i) composed[i] = inner[perm[i]];
  memcpy(perm, composed, sizeof(int32_t) * (size_t)rank);
  *src = &e->values[p->operands[0].value];
}

static kiln_status_t lower_permute(kiln_emitter_t *e, const kiln_node_t *n,
                                   const kiln_tv_t *x, const kiln_type_t *rt) {
  int32_t perm[KILN_MAX_RANK];
  int rank = x->type.rank;
  kiln_permute_source(e, n, rank, perm, &x);
  bool identity = true;
  for (int i = 0; i < rank; ++i) identity &= perm[i] == i;
  if (identity) {
    kiln_emit_set_result(e, n, 0, x);
    return NULL;
  }
  char empty[24], xty[256], oty[256];
  kiln_tv_t out;
  kiln_mlir_tensor_type(&x->type, xty, sizeof(xty));
  kiln_mlir_tensor_type(rt, oty, sizeof(oty));
  kiln_emit_empty(e, rt, empty);
  kiln_emit_fresh(e, out.ssa);
  out.type = *rt;
  kiln_sbuf_printf(&e->out, "    %s = linalg.transpose ins(%s : %s) outs(%s : %s) permutation = [",
                   out.ssa, x->ssa, xty, empty, oty);
  for (int i = 0; i < rank; ++i) kiln_sbuf_printf(&e->out, "%s%d", i ? ", " : "", perm[i]);
  kiln_sbuf_puts(&e->out, "]\n");
  kiln_emit_set_result(e, n, 0, &out);
  return NULL;
}

static kiln_status_t lower_slice(kiln_emitter_t *e, const kiln_node_t *n,
                                 const kiln_tv_t *x, const kiln_type_t *rt) {
  int32_t d;
  kiln_normalize_dim(kiln_node_attr_int(n, "dim", 0), x->type.rank, &d);
  int64_t size = x->type.dims[d];
  int64_t start = kiln_node_slice_start(n, size);
  int64_t step = kiln_node_attr_int(n, "step", 1);
  char xty[256], oty[256];
  kiln_tv_t out;
  kiln_mlir_tensor_type(&x->type, xty, sizeof(xty));
  kiln_mlir_tensor_type(rt, oty, sizeof(oty));
  kiln_emit_fresh(e, out.ssa);
  out.type = *rt;
  kiln_sbuf_t *b = &e->out;
  kiln_sbuf_printf(b, "    %s = tensor.extract_slice %s[", out.ssa, x->ssa);
  for (int i = 0; i < rt->rank; ++i)
    kiln_sbuf_printf(b, "%s%lld", i ? ", " : "", (long long)(i == d ? start : 0));
  kiln_sbuf_puts(b, "] [");
  kiln_emit_size_list(e, rt);
  kiln_sbuf_puts(b, "] [");
  for (int i = 0; i < rt->rank; ++i)
    kiln_sbuf_printf(b, "%s%lld", i ? ", " : "", (long long)(i == d ? step : 1));
  kiln_sbuf_printf(b, "] : %s to %s\n", xty, oty);
  kiln_emit_set_result(e, n, 0, &out);
  return NULL;
}

// A stack: a static cat of 2-16 pieces of size 1 along `d` (torch.stack
// traces as unsqueeze + cat; an interleaved rotary embedding stacks its two
// halves along a new last dim) as one elementwise generic over the output
// that reads piece i, its unit dim collapsed away, where index d is i. The
// collapse folds into the unsqueeze before it, so elementwise fusion can
// pull the pieces' producers into this loop. As inserts, each piece was
// copied an element at a time (slabs of [.., 1]): a rotary embedding of
// [4, 8, 128, 32] took 0.27 ms against eager's 0.10.
static bool lower_stack(kiln_emitter_t *e, const kiln_node_t *n, int32_t d,
                        const kiln_type_t *rt) {
  int k = n->operand_count, r = rt->rank;
  // (CPU only: the CUDA target's elementwise kernels were not tried with
  // a linalg.index in the body.)
  if (e->options.cuda || k < 2 || k > 16 || r < 2 || !kiln_type_is_static(rt) ||
      rt->dims[d] != k)
    return false;
  for (int i = 0; i < k; ++i)
    if (n->operands[i].kind != KILN_OPERAND_VALUE ||
        e->values[n->operands[i].value].type.dims[d] != 1)
      return false;
  kiln_type_t pt = *rt;  // a piece without dim d
  for (int i = d; i + 1 < r; ++i) pt.dims[i] = rt->dims[i + 1];
  pt.rank = r - 1;
  char pty[256], oty[256], names[16][24];
  kiln_mlir_tensor_type(&pt, pty, sizeof(pty));
  kiln_mlir_tensor_type(rt, oty, sizeof(oty));
  kiln_sbuf_t *b = &e->out;
  for (int i = 0; i < k; ++i) {
    kiln_tv_t y;
    kiln_status_t cs = kiln_emit_convert(e, &e->values[n->operands[i].value], rt->dtype, &y);
    if (cs) {  // (lower_cat converts again and reports it; what was emitted is dead)
      kiln_status_free(cs);
      return false;
    }
    char yty[256];
    kiln_mlir_tensor_type(&y.type, yty, sizeof(yty));
    kiln_emit_fresh(e, names[i]);
    // Dim d joins its neighbour (the one before it when it is the last).
    int g = d == r - 1 ? d - 1 : d;
    kiln_sbuf_printf(b, "    %s = tensor.collapse_shape %s [", names[i], y.ssa);
    for (int j = 0, o = 0; j < r; ++j) {
      if (j == g + 1) continue;
      kiln_sbuf_printf(b, "%s[%d", o++ ? ", " : "", j);
      if (j == g) kiln_sbuf_printf(b, ", %d", j + 1);
      kiln_sbuf_puts(b, "]");
    }
    kiln_sbuf_printf(b, "] : %s into %s\n", yty, pty);
  }
  char empty[24];
  kiln_emit_empty(e, rt, empty);
  kiln_tv_t out;
  kiln_emit_fresh(e, out.ssa);
  out.type = *rt;
  char in_map[256], id_map[256];
  size_t a = (size_t)snprintf(in_map, sizeof(in_map), "affine_map<(");
  size_t c = (size_t)snprintf(id_map, sizeof(id_map), "affine_map<(");
  for (int j = 0; j < r; ++j) {
    a += (size_t)snprintf(in_map + a, sizeof(in_map) - a, "%sd%d", j ? ", " : "", j);
    c += (size_t)snprintf(id_map + c, sizeof(id_map) - c, "%sd%d", j ? ", " : "", j);
  }
  a += (size_t)snprintf(in_map + a, sizeof(in_map) - a, ") -> (");
  c += (size_t)snprintf(id_map + c, sizeof(id_map) - c, ") -> (");
  for (int j = 0, o = 0; j < r; ++j) {
    if (j != d) a += (size_t)snprintf(in_map + a, sizeof(in_map) - a, "%sd%d", o++ ? ", " : "", j);
    c += (size_t)snprintf(id_map + c, sizeof(id_map) - c, "%sd%d", j ? ", " : "", j);
  }
  snprintf(in_map + a, sizeof(in_map) - a, ")>");
  snprintf(id_map + c, sizeof(id_map) - c, ")>");
  const char *el = kiln_mlir_storage_elem(rt->dtype);
  kiln_sbuf_printf(b, "    %s = linalg.generic {indexing_maps = [", out.ssa);
  for (int i = 0; i < k; ++i) kiln_sbuf_printf(b, "%s, ", in_map);
  kiln_sbuf_printf(b, "%s], iterator_types = [", id_map);
  for (int j = 0; j < r; ++j) kiln_sbuf_printf(b, "%s\"parallel\"", j ? ", " : "");
  kiln_sbuf_puts(b, "]} ins(");
  for (int i = 0; i < k; ++i) kiln_sbuf_printf(b, "%s%s", i ? ", " : "", names[i]);
  kiln_sbuf_puts(b, " : ");
  for (int i = 0; i < k; ++i) kiln_sbuf_printf(b, "%s%s", i ? ", " : "", pty);
  kiln_sbuf_printf(b, ") outs(%s : %s) {\n    ^bb0(", empty, oty);
  for (int i = 0; i < k; ++i) kiln_sbuf_printf(b, "%%sk%d_%s: %s, ", i, out.ssa + 1, el);
  kiln_sbuf_printf(b, "%%sko_%s: %s):\n", out.ssa + 1, el);
  kiln_sbuf_printf(b, "      %%ski_%s = linalg.index %d : index\n", out.ssa + 1, d);
  // Piece 0, then piece i where the index is i.
  const char *id = out.ssa + 1;
  char prev[128];
  snprintf(prev, sizeof(prev), "%%sk0_%s", id);
  for (int i = 1; i < k; ++i) {
    kiln_sbuf_printf(b,
                     "      %%skc%d_%s = arith.constant %d : index\n"
                     "      %%ske%d_%s = arith.cmpi eq, %%ski_%s, %%skc%d_%s : index\n"
                     "      %%skv%d_%s = arith.select %%ske%d_%s, %%sk%d_%s, %s : %s\n",
                     i, id, i, i, id, id, i, id, i, id, i, id, i, id, prev, el);
    snprintf(prev, sizeof(prev), "%%skv%d_%s", i, id);
  }
  kiln_sbuf_printf(b, "      linalg.yield %s : %s\n    } -> %s\n", prev, el, oty);
  kiln_emit_set_result(e, n, 0, &out);
  return true;
}

static kiln_status_t lower_cat(kiln_emitter_t *e, const kiln_node_t *n,
                               const kiln_type_t *rt) {
  int32_t d;
  const kiln_type_t *x0 = &e->values[n->operands[0].value].type;
  kiln_normalize_dim(kiln_node_attr_int(n, "dim", 0), x0->rank, &d);
  if (lower_stack(e, n, d, rt)) return NULL;
  char oty[256], cur[24];
  kiln_mlir_tensor_type(rt, oty, sizeof(oty));
  kiln_emit_empty(e, rt, cur);
  // CPU, static: each piece inserted by slabs (kiln_emit_insert_slabs); a
  // whole-tensor insert_slice became one vector of the piece.
  bool slabs = !e->options.cuda && kiln_type_is_static(rt);
  int64_t off = 0;
  for (int k = 0; k < n->operand_count; ++k) {
    kiln_tv_t y;
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_convert(
        e, &e->values[n->operands[k].value], rt->dtype, &y));
    if (slabs) {
      int64_t offsets[KILN_MAX_RANK] = {0};
      offsets[d] = off;
      kiln_tv_t into = {.type = *rt}, next;
      snprintf(into.ssa, sizeof(into.ssa), "%s", cur);
      kiln_emit_insert_slabs(e, &y, &into, offsets, false, &next);
      snprintf(cur, sizeof(cur), "%s", next.ssa);
      off += y.type.dims[d];
      continue;
    }
    char yty[256], nxt[24];
    kiln_mlir_tensor_type(&y.type, yty, sizeof(yty));
    kiln_emit_fresh(e, nxt);
    kiln_sbuf_t *b = &e->out;
    kiln_sbuf_printf(b, "    %s = tensor.insert_slice %s into %s[", nxt, y.ssa, cur);
    for (int i = 0; i < rt->rank; ++i)
      kiln_sbuf_printf(b, "%s%lld", i ? ", " : "", (long long)(i == d ? off : 0));
    kiln_sbuf_puts(b, "] [");
    kiln_emit_size_list(e, &y.type);
    kiln_sbuf_puts(b, "] [");
    for (int i = 0; i < rt->rank; ++i) kiln_sbuf_printf(b, "%s1", i ? ", " : "");
    kiln_sbuf_printf(b, "] : %s into %s\n", yty, oty);
    snprintf(cur, sizeof(cur), "%s", nxt);
    off += y.type.dims[d];
  }
  kiln_tv_t out;
  snprintf(out.ssa, sizeof(out.ssa), "%s", cur);
  out.type = *rt;
  kiln_emit_set_result(e, n, 0, &out);
  return NULL;
}

kiln_status_t kiln_lower_shape(kiln_emitter_t *e, const kiln_node_t *n) {
  const kiln_type_t *rt = kiln_node_result_type(e->g, n, 0);
  if (n->op == KILN_OP_CAT) return lower_cat(e, n, rt);
  const kiln_tv_t *x = &e->values[n->operands[0].value];
  kiln_tv_t out;
  switch (n->op) {
    case KILN_OP_PERMUTE:
    case KILN_OP_TRANSPOSE:
      return lower_permute(e, n, x, rt);
    case KILN_OP_VIEW:
    case KILN_OP_RESHAPE:
      if (kiln_type_is_static(&x->type) && kiln_type_is_static(rt) &&
          !kiln_type_equal(&x->type, rt)) {
        // A graph-level view is a tensor.reshape, which MLIR's reshape
        // propagation leaves alone: propagated through a matmul it turned the
        // named op into a generic, which elementwise fusion then filled with
        // producers recomputed per output tile (a layer norm feeding a linear
        // layer ran 40x slower).
        kiln_emit_view(e, x, rt, &out);
        break;
      }
      KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_reshape(e, x, rt, &out));
      break;
    case KILN_OP_SQUEEZE:
    case KILN_OP_UNSQUEEZE:
      KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_reshape(e, x, rt, &out));
      break;
    case KILN_OP_EXPAND: {
      kiln_arg_t a = kiln_arg_tensor(x);
      KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_ew(e, KILN_OP_CLONE, NULL, 1, &a, rt,
                                              rt->dtype, rt->dtype, &out));
      break;
    }
    case KILN_OP_SLICE:
      return lower_slice(e, n, x, rt);
    default:
      return kiln_emit_error(e, KILN_STATUS_INTERNAL, "not a shape op");
  }
  kiln_emit_set_result(e, n, 0, &out);
  return NULL;
}

// A dense element in MLIR syntax for dtype `t`.
static void dense_elem(kiln_sbuf_t *b, kiln_dtype_t t, double v) {
  if (t == KILN_BOOL) {
    kiln_sbuf_puts(b, v != 0 ? "1" : "0");  // stored as i8
  } else if (!kiln_dtype_is_float(t)) {
    kiln_sbuf_printf(b, "%lld", (long long)(isnan(v) ? 0 : trunc(v)));
  } else if (isnan(v) || isinf(v)) {
    // Non-finite values as bit patterns of the element type.
    static const char *const bits[4][3] = {
        // nan, +inf, -inf
        {"0x7FC00000", "0x7F800000", "0xFF800000"},                          // f32
        {"0x7E00", "0x7C00", "0xFC00"},                                      // f16
        {"0x7FC0", "0x7F80", "0xFF80"},                                      // bf16
        {"0x7FF8000000000000", "0x7FF0000000000000", "0xFFF0000000000000"}};  // f64
    int row = t == KILN_F16 ? 1 : t == KILN_BF16 ? 2 : t == KILN_F64 ? 3 : 0;
    kiln_sbuf_puts(b, bits[row][isnan(v) ? 0 : v > 0 ? 1 : 2]);
  } else {
    char buf[64];
    snprintf(buf, sizeof(buf), "%.17e", v);
    kiln_sbuf_puts(b, buf);
  }
}

// kiln.arange: start + i * step per element, computed (its size may be
// symbolic), in i64 and converted.
static kiln_status_t lower_arange(kiln_emitter_t *e, const kiln_node_t *n,
                                  const kiln_type_t *rt) {
  kiln_tv_t out;
  char empty[24], ty[256];
  kiln_emit_empty(e, rt, empty);
  kiln_mlir_tensor_type(rt, ty, sizeof(ty));
  const char *elem = kiln_mlir_storage_elem(rt->dtype);
  char conv[160];
  if (kiln_dtype_is_float(rt->dtype))
    snprintf(conv, sizeof(conv), "%%v = arith.sitofp %%a : i64 to %s", elem);
  else if (rt->dtype == KILN_I32)
    snprintf(conv, sizeof(conv), "%%v = arith.trunci %%a : i64 to i32");
  else
    snprintf(conv, sizeof(conv), "%%v = arith.addi %%a, %%z : i64");
  kiln_emit_fresh(e, out.ssa);
  out.type = *rt;
  kiln_sbuf_printf(&e->out,
      "    %s = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>], "
      "iterator_types = [\"parallel\"]} outs(%s : %s) {\n"
      "    ^bb0(%%o: %s):\n"
      "      %%i = linalg.index 0 : index\n"
      "      %%ii = arith.index_cast %%i : index to i64\n"
      "      %%st = arith.constant %lld : i64\n"
      "      %%sp = arith.constant %lld : i64\n"
      "      %%z = arith.constant 0 : i64\n"
      "      %%m = arith.muli %%ii, %%sp : i64\n"
      "      %%a = arith.addi %%m, %%st : i64\n"
      "      %s\n"
      "      linalg.yield %%v : %s\n"
      "    } -> %s\n",
      out.ssa, empty, ty, elem, (long long)kiln_node_attr_int(n, "start", 0),
      (long long)kiln_node_attr_int(n, "step", 1), conv, elem, ty);
  kiln_emit_set_result(e, n, 0, &out);
  return NULL;
}

kiln_status_t kiln_lower_create(kiln_emitter_t *e, const kiln_node_t *n) {
  const kiln_type_t *rt = kiln_node_result_type(e->g, n, 0);
  if (n->op == KILN_OP_ARANGE) return lower_arange(e, n, rt);
  const kiln_attr_t *v = kiln_node_attr(n, "value");
  kiln_tv_t out;
  bool splat = v->kind != KILN_ATTR_LIST || v->count == 1;
  if (splat) {
    double x = v->kind == KILN_ATTR_LIST ? v->floats[0]
               : v->kind == KILN_ATTR_FLOAT ? v->f
                                            : (double)v->i;
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_filled(e, rt, x, &out));
    kiln_emit_set_result(e, n, 0, &out);
    return NULL;
  }
  kiln_type_t ct = *rt;
  char ty[256];
  kiln_mlir_tensor_type(&ct, ty, sizeof(ty));
  kiln_tv_t c;
  kiln_emit_fresh(e, c.ssa);
  c.type = ct;
  kiln_sbuf_t *b = &e->out;
  kiln_sbuf_printf(b, "    %s = arith.constant dense<[", c.ssa);
  for (int i = 0; i < v->count; ++i) {
    if (i) kiln_sbuf_puts(b, ", ");
    dense_elem(b, ct.dtype, v->floats[i]);
  }
  kiln_sbuf_printf(b, "]> : tensor<%lldx%s>\n", (long long)v->count,
                   kiln_mlir_storage_elem(ct.dtype));
  // The literal is 1-D; shape it.
  kiln_tv_t flat = c, shaped;
  flat.type.rank = 1;
  flat.type.dims[0] = v->count;
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_reshape(e, &flat, &ct, &shaped));
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_convert(e, &shaped, rt->dtype, &out));
  kiln_emit_set_result(e, n, 0, &out);
  return NULL;
}
