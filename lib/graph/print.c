// kiln_graph_t → graph text. Parsing the output gives an equal graph: every
// result carries its type, floats are printed with enough digits to round-trip.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph.h"

static void print_float(kiln_sbuf_t *b, double f) {
  if (isnan(f)) {
    kiln_sbuf_puts(b, "nan");
  } else if (isinf(f)) {
    kiln_sbuf_puts(b, f < 0 ? "-inf" : "inf");
  } else {
    char buf[64];
    snprintf(buf, sizeof(buf), "%.17g", f);
    // Keep it a float token: "2" would re-parse as an integer.
    if (!strpbrk(buf, ".e")) strcat(buf, ".0");
    kiln_sbuf_puts(b, buf);
  }
}

// Written out whole (kiln_type_str's buffer would cut long products short).
static void print_type(kiln_sbuf_t *b, const kiln_graph_t *g,
                       const kiln_type_t *t) {
  kiln_sbuf_printf(b, "%s[", kiln_dtype_name(t->dtype));
  for (int i = 0; i < t->rank; ++i) {
    if (i) kiln_sbuf_puts(b, ",");
    if (KILN_IS_SYM(t->dims[i]))
      kiln_sbuf_puts(b, g->symbols[KILN_SYM_ID(t->dims[i])]);
    else
      kiln_sbuf_printf(b, "%lld", (long long)t->dims[i]);
  }
  kiln_sbuf_puts(b, "]");
}

static void print_attr(kiln_sbuf_t *b, const kiln_graph_t *g,
                       const kiln_attr_t *a) {
  kiln_sbuf_printf(b, "%s = ", a->name);
  switch (a->kind) {
    case KILN_ATTR_INT:
      if (a->sym && a->sym[0]) kiln_sbuf_puts(b, g->symbols[KILN_SYM_ID(a->i)]);
      else kiln_sbuf_printf(b, "%lld", (long long)a->i);
      break;
    case KILN_ATTR_FLOAT: print_float(b, a->f); break;
    case KILN_ATTR_BOOL: kiln_sbuf_puts(b, a->i ? "true" : "false"); break;
    case KILN_ATTR_DTYPE:
      kiln_sbuf_puts(b, kiln_dtype_name((kiln_dtype_t)a->i));
      break;
    case KILN_ATTR_STR: kiln_sbuf_printf(b, "\"%s\"", a->s); break;
    case KILN_ATTR_LIST:
      kiln_sbuf_puts(b, "[");
      for (int i = 0; i < a->count; ++i) {
        if (i) kiln_sbuf_puts(b, ", ");
        if (a->sym && a->sym[i])
          kiln_sbuf_puts(b, g->symbols[KILN_SYM_ID(a->ints[i])]);
        else if (a->is_int) kiln_sbuf_printf(b, "%lld", (long long)a->ints[i]);
        else print_float(b, a->floats[i]);
      }
      kiln_sbuf_puts(b, "]");
      break;
  }
}

// A value's name as printed: its own, or in the canonical form its number in
// order of definition (inputs first, then results node by node).
typedef struct {
  const kiln_graph_t *g;
  int32_t *number;  // per value, -1 until defined; NULL: print the names
  int32_t next;
} namer_t;

static void print_def(kiln_sbuf_t *b, namer_t *nm, int32_t v) {
  if (!nm->number) {
    kiln_sbuf_printf(b, "%%%s", nm->g->values[v].name);
    return;
  }
  nm->number[v] = nm->next++;
  kiln_sbuf_printf(b, "%%v%d", nm->number[v]);
}

static void print_use(kiln_sbuf_t *b, const namer_t *nm, int32_t v) {
  if (nm->number) kiln_sbuf_printf(b, "%%v%d", nm->number[v]);
  else kiln_sbuf_printf(b, "%%%s", nm->g->values[v].name);
}

static kiln_status_t print_graph(const kiln_graph_t *g, bool canonical, char **out_text) {
  *out_text = NULL;
  namer_t nm = {g, NULL, 0};
  if (canonical) {
    nm.number = malloc(sizeof(int32_t) * ((size_t)g->value_count + 1));
    if (!nm.number) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "printing");
    for (int32_t v = 0; v < g->value_count; ++v) nm.number[v] = -1;
  }
  kiln_sbuf_t b;
  kiln_sbuf_init(&b);
  kiln_sbuf_printf(&b, "graph @%s(", canonical || !g->name ? "main" : g->name);
  for (int i = 0; i < g->input_count; ++i) {
    const kiln_value_t *v = &g->values[g->inputs[i]];
    if (i) kiln_sbuf_puts(&b, ", ");
    print_def(&b, &nm, g->inputs[i]);
    kiln_sbuf_puts(&b, ": ");
    print_type(&b, g, &v->type);
  }
  kiln_sbuf_puts(&b, ") {\n");
  for (int i = 0; i < g->node_count; ++i) {
    const kiln_node_t *n = &g->nodes[i];
    kiln_sbuf_puts(&b, "  ");
    for (int k = 0; k < n->result_count; ++k) {
      if (k) kiln_sbuf_puts(&b, ", ");
      print_def(&b, &nm, n->results[k]);
    }
    kiln_sbuf_printf(&b, " = %s(", kiln_op_name(n->op));
    for (int k = 0; k < n->operand_count; ++k) {
      const kiln_operand_t *o = &n->operands[k];
      if (k) kiln_sbuf_puts(&b, ", ");
      switch (o->kind) {
        case KILN_OPERAND_VALUE: print_use(&b, &nm, o->value); break;
        case KILN_OPERAND_INT: kiln_sbuf_printf(&b, "%lld", (long long)o->i); break;
        case KILN_OPERAND_FLOAT: print_float(&b, o->f); break;
        case KILN_OPERAND_BOOL: kiln_sbuf_puts(&b, o->i ? "true" : "false"); break;
        case KILN_OPERAND_NONE: kiln_sbuf_puts(&b, "none"); break;
      }
    }
    kiln_sbuf_puts(&b, ")");
    if (n->attr_count) {
      kiln_sbuf_puts(&b, " {");
      for (int k = 0; k < n->attr_count; ++k) {
        if (k) kiln_sbuf_puts(&b, ", ");
        print_attr(&b, g, &n->attrs[k]);
      }
      kiln_sbuf_puts(&b, "}");
    }
    kiln_sbuf_puts(&b, " : ");
    for (int k = 0; k < n->result_count; ++k) {
      if (k) kiln_sbuf_puts(&b, ", ");
      print_type(&b, g, &g->values[n->results[k]].type);
    }
    kiln_sbuf_puts(&b, "\n");
  }
  kiln_sbuf_puts(&b, "  return ");
  for (int i = 0; i < g->output_count; ++i) {
    if (i) kiln_sbuf_puts(&b, ", ");
    print_use(&b, &nm, g->outputs[i]);
  }
  for (int i = 0; i < g->mutation_count; ++i) {
    if (i || g->output_count) kiln_sbuf_puts(&b, ", ");
    print_use(&b, &nm, g->mutations[i].value);
    kiln_sbuf_puts(&b, " -> ");
    print_use(&b, &nm, g->inputs[g->mutations[i].input]);
  }
  kiln_sbuf_puts(&b, "\n}\n");
  free(nm.number);
  char *text = kiln_sbuf_take(&b);
  if (!text) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "printing");
  *out_text = text;
  return NULL;
}

kiln_status_t kiln_graph_print_text(const kiln_graph_t *g, char **out_text) {
  return print_graph(g, false, out_text);
}

kiln_status_t kiln_graph_print_canonical(const kiln_graph_t *g, char **out_text) {
  return print_graph(g, true, out_text);
}
