// Composite ops built from the emitter's primitives: softmax, log_softmax and
// layer norm as reductions plus elementwise maps (which the fusion passes
// merge), embedding as a gather inside a linalg.generic.
#include <stdio.h>
#include <string.h>

#include "lowering/emit.h"

kiln_status_t kiln_lower_softmax(kiln_emitter_t *e, const kiln_node_t *n) {
  const kiln_tv_t *x0 = &e->values[n->operands[0].value];
  const kiln_type_t *rt = kiln_node_result_type(e->g, n, 0);
  kiln_dtype_t mt = kiln_math_dtype(rt->dtype);
  int32_t d;
  kiln_normalize_dim(kiln_node_attr_int(n, "dim", -1), x0->type.rank, &d);
  bool red[KILN_MAX_RANK] = {0};
  if (x0->type.rank) red[d] = true;
  // Three passes over x, no row-sized intermediate in memory: the max; the
  // sum of exp(x - max), its exp fused into the reduction; the output, which
  // recomputes exp(x - max) rather than reading it back. Operands convert to
  // the math dtype inside each body.
  const kiln_tv_t *x = x0;
  kiln_tv_t m, t1, e1, s, t2, r;
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_reduce(e, KILN_OP_AMAX, x, red, true, mt, &m));
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_binary(e, KILN_OP_SUB, kiln_arg_tensor(x),
                                              kiln_arg_tensor(&m), mt, &t1));
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_unary(e, KILN_OP_EXP, &t1, mt, &e1));
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_reduce(e, KILN_OP_SUM, &e1, red, true, mt, &s));
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_binary(e, KILN_OP_SUB, kiln_arg_tensor(x),
                                              kiln_arg_tensor(&m), mt, &t2));
  if (n->op == KILN_OP_SOFTMAX) {
    kiln_tv_t e2;
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_unary(e, KILN_OP_EXP, &t2, mt, &e2));
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_binary(
        e, KILN_OP_DIV, kiln_arg_tensor(&e2), kiln_arg_tensor(&s), mt, &r));
  } else {
    kiln_tv_t ls;
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_unary(e, KILN_OP_LOG, &s, mt, &ls));
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_binary(
        e, KILN_OP_SUB, kiln_arg_tensor(&t2), kiln_arg_tensor(&ls), mt, &r));
  }
  kiln_tv_t out;
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_convert(e, &r, rt->dtype, &out));
  kiln_emit_set_result(e, n, 0, &out);
  return NULL;
}

kiln_status_t kiln_lower_layer_norm(kiln_emitter_t *e, const kiln_node_t *n) {
  const kiln_tv_t *x0 = &e->values[n->operands[0].value];
  const kiln_type_t *rt = kiln_node_result_type(e->g, n, 0);
  kiln_dtype_t mt = kiln_math_dtype(rt->dtype);
  const kiln_attr_t *ns = kiln_node_attr(n, "normalized_shape");
  double eps = kiln_node_attr_float(n, "eps", 1e-5);
  bool red[KILN_MAX_RANK] = {0};
  for (int i = x0->type.rank - ns->count; i < x0->type.rank; ++i) red[i] = true;
  // Three passes over x: the sum; the sum of squared deviations (the
  // deviation fused into the reduction); the output, which recomputes the
  // deviation instead of reading a stored one.
  const kiln_tv_t *x = x0;
  kiln_tv_t sum, mean, d1, sq, ss, var, ve, rstd, d2, y;
  kiln_arg_t count = kiln_emit_count(e, &x0->type, red, mt, 0);
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
  kiln_tv_t outs[3];
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_convert(e, &y, rt->dtype, &outs[0]));
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_convert(
      e, &mean, kiln_node_result_type(e->g, n, 1)->dtype, &outs[1]));
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_convert(
      e, &rstd, kiln_node_result_type(e->g, n, 2)->dtype, &outs[2]));
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
  kiln_sbuf_printf(b, "    %s = linalg.generic {indexing_maps = [affine_map<(", out.ssa);
  for (int i = 0; i < r; ++i) kiln_sbuf_printf(b, "%sd%d", i ? ", " : "", i);
  kiln_sbuf_puts(b, ") -> (");
  for (int i = 0; i < r - 1; ++i) kiln_sbuf_printf(b, "%sd%d", i ? ", " : "", i);
  kiln_sbuf_puts(b, ")>, affine_map<(");
  for (int i = 0; i < r; ++i) kiln_sbuf_printf(b, "%sd%d", i ? ", " : "", i);
  kiln_sbuf_puts(b, ") -> (");
  for (int i = 0; i < r; ++i) kiln_sbuf_printf(b, "%sd%d", i ? ", " : "", i);
  kiln_sbuf_puts(b, ")>], iterator_types = [");
  for (int i = 0; i < r; ++i) kiln_sbuf_printf(b, "%s\"parallel\"", i ? ", " : "");
  int id = e->next_id++;
  const char *ie = kiln_mlir_elem(idx->type.dtype);
  kiln_sbuf_printf(b, "]} ins(%s : %s) outs(%s : %s) {\n"
                      "  ^bb0(%%i%d: %s, %%o%d: %s):\n",
                   idx->ssa, ity, empty, oty, id, ie, id,
                   kiln_mlir_storage_elem(rt->dtype));
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
