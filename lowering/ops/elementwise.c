// Elementwise ops: one linalg.generic each, broadcasting by indexing maps.
#include "lowering/emit.h"

kiln_status_t kiln_lower_elementwise(kiln_emitter_t *e, const kiln_node_t *n) {
  kiln_arg_t args[3];
  for (int i = 0; i < n->operand_count && i < 3; ++i)
    args[i] = kiln_arg_operand(e, i);
  kiln_dtype_t ct = kiln_node_compute_dtype(e->g, n);
  const kiln_type_t *rt = kiln_node_result_type(e->g, n, 0);
  kiln_tv_t out;
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_ew(e, n->op, n, n->operand_count, args,
                                          rt, ct, rt->dtype, &out));
  kiln_emit_set_result(e, n, 0, &out);
  return NULL;
}
