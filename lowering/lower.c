// The op table (op id → lowering function) and the entry-point wrapper.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emit.h"
#include "lowering.h"

static kiln_lower_fn lowering_for(const kiln_node_t *n) {
  switch (kiln_op_class(n->op)) {
    case KILN_CLASS_REDUCE: return kiln_lower_reduce;
    case KILN_CLASS_MATMUL: return kiln_lower_matmul;
    case KILN_CLASS_CONV: return kiln_lower_conv;
    case KILN_CLASS_SHAPE: return kiln_lower_shape;
    case KILN_CLASS_CREATE: return kiln_lower_create;
    case KILN_CLASS_NN:
      switch (n->op) {
        case KILN_OP_SOFTMAX:
        case KILN_OP_LOG_SOFTMAX: return kiln_lower_softmax;
        case KILN_OP_LAYER_NORM: return kiln_lower_layer_norm;
        case KILN_OP_LAYER_NORM_BACKWARD: return kiln_lower_layer_norm_backward;
        case KILN_OP_EMBEDDING: return kiln_lower_embedding;
        case KILN_OP_INDEX_PUT: return kiln_lower_index_put;
        case KILN_OP_INDEX: return kiln_lower_index;
        case KILN_OP_MAX_POOL2D: return kiln_lower_max_pool2d;
        default: return NULL;
      }
    default: return kiln_lower_elementwise;
  }
}

static void memref_type(kiln_sbuf_t *b, const kiln_type_t *t, bool strided) {
  kiln_sbuf_puts(b, "memref<");
  for (int i = 0; i < t->rank; ++i) {
    if (KILN_IS_SYM(t->dims[i])) kiln_sbuf_puts(b, "?x");
    else kiln_sbuf_printf(b, "%lldx", (long long)t->dims[i]);
  }
  kiln_sbuf_puts(b, kiln_mlir_storage_elem(t->dtype));
  if (strided) {
    kiln_sbuf_puts(b, ", strided<[");
    for (int i = 0; i < t->rank; ++i) kiln_sbuf_printf(b, "%s?", i ? ", " : "");
    kiln_sbuf_puts(b, "], offset: ?>");
  }
  kiln_sbuf_puts(b, ">");
}

// Derived sizes (graph.h) from their factors' values, and a factor no input
// states from a derived size that one does ([128*s0, 256] gives s0 as rows /
// 128), until nothing changes.
static kiln_status_t bind_derived_sizes(kiln_emitter_t *e) {
  const kiln_graph_t *g = e->g;
  kiln_sbuf_t *b = &e->out;
  // -1 where no SSA value is known yet (kiln_graph_next_derived's form).
  int64_t *have = malloc(sizeof(int64_t) * ((size_t)g->symbol_count + 1));
  if (!have) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "lowering");
  for (int32_t s = 0; s < g->symbol_count; ++s) have[s] = e->sym_ssa[s][0] ? 0 : -1;
  int32_t s, f;
  while ((s = kiln_graph_next_derived(g, have, &f)) >= 0) {
    const kiln_symdef_t *d = &g->symdefs[s];
    // The product of the constant and the known factors.
    char acc[24], nxt[24];
    kiln_emit_fresh(e, acc);
    kiln_sbuf_printf(b, "    %s = arith.constant %lld : index\n", acc, (long long)d->coef);
    for (int32_t k = 0; k < d->factor_count; ++k) {
      if (d->factors[k] == f) continue;
      kiln_emit_fresh(e, nxt);
      kiln_sbuf_printf(b, "    %s = arith.muli %s, %s : index\n", nxt, acc,
                       e->sym_ssa[d->factors[k]]);
      memcpy(acc, nxt, sizeof(acc));
    }
    if (f < 0) {
      snprintf(e->sym_ssa[s], 24, "%s", acc);
    } else {
      // The call's binding checked that the division is exact.
      kiln_emit_fresh(e, nxt);
      kiln_sbuf_printf(b, "    %s = arith.divui %s, %s : index\n", nxt, e->sym_ssa[s], acc);
      snprintf(e->sym_ssa[f], 24, "%s", nxt);
    }
    have[f < 0 ? s : f] = 0;
  }
  free(have);
  return NULL;
}

kiln_status_t kiln_lower_to_linalg(const kiln_graph_t *g,
                                   const bool *input_strided,
                                   const kiln_lower_options_t *options,
                                   char **out_text) {
  *out_text = NULL;
  kiln_emitter_t e;
  memset(&e, 0, sizeof(e));
  e.g = g;
  if (options) e.options = *options;
  e.input_strided = input_strided;
  kiln_sbuf_init(&e.out);
  e.values = calloc((size_t)g->value_count + 1, sizeof(kiln_tv_t));
  e.sym_ssa = calloc((size_t)g->symbol_count + 1, sizeof(*e.sym_ssa));
  e.node_done = calloc((size_t)g->node_count + 1, sizeof(bool));
  e.wide = calloc((size_t)g->value_count + 1, sizeof(kiln_tv_t));
  if (!e.values || !e.sym_ssa || !e.node_done || !e.wide) {
    free(e.values);
    free(e.sym_ssa);
    free(e.node_done);
    free(e.wide);
    return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "lowering");
  }
  // Every symbolic size is read once, from the first input that has it:
  // one compiled function then serves every value of that size.
  for (int i = 0; i < g->input_count; ++i) {
    const kiln_type_t *t = &g->values[g->inputs[i]].type;
    for (int d = 0; d < t->rank; ++d) {
      if (!KILN_IS_SYM(t->dims[d])) continue;
      int32_t id = KILN_SYM_ID(t->dims[d]);
      if (e.sym_ssa[id][0]) continue;
      snprintf(e.sym_ssa[id], 24, "%%sym%d", id);
      kiln_sbuf_printf(&e.out, "    %%symdim%d = arith.constant %d : index\n"
                               "    %s = memref.dim %%arg%d, %%symdim%d : ",
                       id, d, e.sym_ssa[id], i, id);
      memref_type(&e.out, t, input_strided && input_strided[i]);
      kiln_sbuf_puts(&e.out, "\n");
    }
  }
  kiln_status_t bs = bind_derived_sizes(&e);
  if (bs) {
    kiln_sbuf_free(&e.out);
    free(e.values);
    free(e.sym_ssa);
    free(e.node_done);
    free(e.wide);
    return bs;
  }
  for (int32_t v = 0; v < g->value_count; ++v) {
    const kiln_type_t *t = &g->values[v].type;
    int id = -1;
    for (int d = 0; d < t->rank && id < 0; ++d)
      if (KILN_IS_SYM(t->dims[d]) && !e.sym_ssa[KILN_SYM_ID(t->dims[d])][0])
        id = KILN_SYM_ID(t->dims[d]);
    if (id >= 0) {
      kiln_sbuf_free(&e.out);
      free(e.values);
      free(e.sym_ssa);
      return kiln_make_status(KILN_STATUS_UNSUPPORTED,
                              "lowering: symbolic size '%s' of graph @%s "
                              "follows from no input's size; expected each "
                              "symbol in an input's type (or a product there "
                              "with it as its one other symbol)",
                              g->symbols[id], g->name);
    }
  }
  kiln_sbuf_t head;
  kiln_sbuf_init(&head);
  kiln_sbuf_printf(&head, "func.func @%s(", KILN_ENTRY_NAME);
  for (int i = 0; i < g->input_count; ++i) {
    const kiln_value_t *v = &g->values[g->inputs[i]];
    bool strided = input_strided && input_strided[i];
    kiln_sbuf_printf(&head, "%s%%arg%d: ", i ? ", " : "", i);
    memref_type(&head, &v->type, strided);
    kiln_tv_t *tv = &e.values[g->inputs[i]];
    snprintf(tv->ssa, sizeof(tv->ssa), "%%input%d", i);
    tv->type = v->type;
    char tty[256];
    kiln_mlir_tensor_type(&v->type, tty, sizeof(tty));
    // An input the graph writes is `writable`: one-shot bufferization may
    // then compute its new value in place, or copies where a read of the
    // old value comes after the write.
    kiln_sbuf_printf(&e.out, "    %s = bufferization.to_tensor %%arg%d restrict%s : ",
                     tv->ssa, i,
                     g->input_written[i] ? " writable" : "");
    memref_type(&e.out, &v->type, strided);
    kiln_sbuf_printf(&e.out, " to %s\n", tty);
  }
  for (int i = 0; i < g->output_count; ++i) {
    kiln_sbuf_printf(&head, "%s%%res%d: ", (i || g->input_count) ? ", " : "", i);
    memref_type(&head, &g->values[g->outputs[i]].type, false);
  }
  kiln_sbuf_puts(&head, ") {\n");
  kiln_status_t s = NULL;
  for (int i = 0; i < g->node_count && !s; ++i) {
    const kiln_node_t *n = &g->nodes[i];
    if (e.node_done[i]) continue;  // lowered with an earlier node
    e.node = n;
    kiln_lower_fn fn = lowering_for(n);
    if (!fn) {
      s = kiln_emit_error(&e, KILN_STATUS_UNSUPPORTED, "no lowering");
      break;
    }
    s = fn(&e, n);
  }
  e.node = NULL;
  for (int i = 0; i < g->output_count && !s; ++i) {
    const kiln_tv_t *tv = &e.values[g->outputs[i]];
    char tty[256], src[24];
    kiln_mlir_tensor_type(&tv->type, tty, sizeof(tty));
    snprintf(src, sizeof(src), "%s", tv->ssa);
    int32_t producer = g->values[g->outputs[i]].node;
    if (!e.options.cuda && producer >= 0 && g->nodes[producer].op == KILN_OP_SLICE &&
        kiln_type_is_static(&tv->type)) {
      // A slice returned as an output: a linalg.copy (tiled and threaded by
      // the CPU schedule) writes it; bufferization would copy the strided
      // view with one memref.copy on one thread (an [64,1024,32] half of
      // a [64,1024,64] tensor: 0.7 ms).
      char empty[24];
      kiln_emit_empty(&e, &tv->type, empty);
      kiln_emit_fresh(&e, src);
      kiln_sbuf_printf(&e.out, "    %s = linalg.copy ins(%s : %s) outs(%s : %s) -> %s\n", src,
                       tv->ssa, tty, empty, tty, tty);
    }
    kiln_sbuf_printf(&e.out, "    bufferization.materialize_in_destination %s in restrict writable %%res%d : (%s, ",
                     src, i, tty);
    memref_type(&e.out, &tv->type, false);
    kiln_sbuf_puts(&e.out, ") -> ()\n");
  }
  // A mutation is stored into its input's tensor (so the analysis sees the
  // input's reads and the write as one buffer), then into the argument: the
  // second store is a no-op when the first was done in place.
  // A value that may share its buffer with an input (an input itself, or a
  // view of one: `return %b -> %a, %a -> %b`) is stored from a copy, and
  // every such copy is taken before the first store: stored directly, the
  // must-be-in-place store could not be ordered after the other input's
  // reads.
  for (int i = 0; i < g->mutation_count && !s; ++i) {
    const kiln_mutation_t *m = &g->mutations[i];
    int32_t producer = g->values[m->value].node;
    if (producer >= 0 && kiln_op_class(g->nodes[producer].op) != KILN_CLASS_SHAPE)
      continue;
    const kiln_tv_t *tv = &e.values[m->value];
    char tty[256];
    kiln_mlir_tensor_type(&tv->type, tty, sizeof(tty));
    kiln_sbuf_printf(&e.out, "    %%mutsrc%d = bufferization.alloc_tensor() copy(%s) : %s\n",
                     i, tv->ssa, tty);
  }
  for (int i = 0; i < g->mutation_count && !s; ++i) {
    const kiln_mutation_t *m = &g->mutations[i];
    const kiln_tv_t *tv = &e.values[m->value];
    const kiln_tv_t *in = &e.values[g->inputs[m->input]];
    int32_t producer = g->values[m->value].node;
    char tty[256], src[32];
    kiln_mlir_tensor_type(&tv->type, tty, sizeof(tty));
    if (producer >= 0 && kiln_op_class(g->nodes[producer].op) != KILN_CLASS_SHAPE)
      snprintf(src, sizeof(src), "%s", tv->ssa);
    else
      snprintf(src, sizeof(src), "%%mutsrc%d", i);
    kiln_sbuf_printf(&e.out,
                     "    %%mut%d = bufferization.materialize_in_destination %s in %s : "
                     "(%s, %s) -> %s\n",
                     i, src, in->ssa, tty, tty, tty);
    kiln_sbuf_printf(&e.out,
                     "    bufferization.materialize_in_destination %%mut%d in writable "
                     "%%arg%d : (%s, ",
                     i, m->input, tty);
    memref_type(&e.out, &tv->type, input_strided && input_strided[m->input]);
    kiln_sbuf_puts(&e.out, ") -> ()\n");
  }
  kiln_sbuf_puts(&e.out, "    return\n}\n");
  free(e.values);
  free(e.sym_ssa);
  free(e.node_done);
  free(e.wide);
  if (s) {
    kiln_sbuf_free(&head);
    kiln_sbuf_free(&e.out);
    return s;
  }
  kiln_sbuf_append(&head, e.out.data ? e.out.data : "", e.out.length);
  kiln_sbuf_free(&e.out);
  char *text = kiln_sbuf_take(&head);
  if (!text) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "lowering");
  *out_text = text;
  return NULL;
}
