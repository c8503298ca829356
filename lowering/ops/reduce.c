// Reductions: linalg.generic with reduction iterators over a filled init.
// Halves accumulate in f32, integers sum in i64 (as PyTorch), mean and var
// divide after the sum; var is two passes (mean, then squared deviations).
#include <string.h>

#include "lowering/emit.h"

kiln_status_t kiln_lower_reduce(kiln_emitter_t *e, const kiln_node_t *n) {
  const kiln_tv_t *x = &e->values[n->operands[0].value];
  const kiln_type_t *rt = kiln_node_result_type(e->g, n, 0);
  bool red[KILN_MAX_RANK];
  kiln_node_reduced_dims(n, &x->type, red);
  bool keep = kiln_node_attr_int(n, "keepdim", 0) != 0;
  // The accumulator: the math dtype of the result (f32 for halves), or of
  // the input for min/max, which are exact in any wider type.
  kiln_dtype_t acc = kiln_math_dtype(rt->dtype);
  kiln_tv_t r, tmp;
  switch (n->op) {
    case KILN_OP_SUM:
    case KILN_OP_PROD:
    case KILN_OP_AMAX:
    case KILN_OP_AMIN:
      KILN_RETURN_IF_ERROR_PLAIN(
          kiln_emit_reduce(e, n->op, x, red, keep, acc, &r));
      break;
    case KILN_OP_MEAN:
      KILN_RETURN_IF_ERROR_PLAIN(
          kiln_emit_reduce(e, KILN_OP_SUM, x, red, keep, acc, &tmp));
      KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_binary(
          e, KILN_OP_DIV, kiln_arg_tensor(&tmp),
          kiln_emit_count(e, &x->type, red, acc, 0), acc, &r));
      break;
    case KILN_OP_VAR: {
      kiln_tv_t xs, sum, mean, d, sq, ss;
      KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_convert(e, x, acc, &xs));
      KILN_RETURN_IF_ERROR_PLAIN(
          kiln_emit_reduce(e, KILN_OP_SUM, &xs, red, true, acc, &sum));
      KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_binary(
          e, KILN_OP_DIV, kiln_arg_tensor(&sum),
          kiln_emit_count(e, &x->type, red, acc, 0), acc, &mean));
      KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_binary(
          e, KILN_OP_SUB, kiln_arg_tensor(&xs), kiln_arg_tensor(&mean), acc, &d));
      KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_binary(
          e, KILN_OP_MUL, kiln_arg_tensor(&d), kiln_arg_tensor(&d), acc, &sq));
      KILN_RETURN_IF_ERROR_PLAIN(
          kiln_emit_reduce(e, KILN_OP_SUM, &sq, red, keep, acc, &ss));
      double corr = kiln_node_attr_float(n, "correction", 1);
      // As PyTorch, the divisor is max(0, N - correction): inf or nan at 0.
      KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_binary(
          e, KILN_OP_DIV, kiln_arg_tensor(&ss),
          kiln_emit_count(e, &x->type, red, acc, corr), acc, &r));
      break;
    }
    default:
      return kiln_emit_error(e, KILN_STATUS_INTERNAL, "not a reduction");
  }
  kiln_tv_t out;
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_convert(e, &r, rt->dtype, &out));
  kiln_emit_set_result(e, n, 0, &out);
  return NULL;
}
