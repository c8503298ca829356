// Symbolic sizes: base symbols, derived products of them, and the monomial
// arithmetic the verifier's view rules and the call-time binding use.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph.h"

// Interns `name` with definition `def`; -1 when out of memory.
static int32_t intern(kiln_graph_t *g, const char *name, size_t n,
                      const kiln_symdef_t *def) {
  for (int32_t i = 0; i < g->symbol_count; ++i)
    if (strlen(g->symbols[i]) == n && memcmp(g->symbols[i], name, n) == 0)
      return i;
  size_t count = (size_t)g->symbol_count + 1;
  const char **syms = kiln_arena_alloc(&g->arena, sizeof(char *) * count);
  kiln_symdef_t *defs = kiln_arena_alloc(&g->arena, sizeof(kiln_symdef_t) * count);
  char *copy = kiln_arena_strndup(&g->arena, name, n);
  if (!syms || !defs || !copy) return -1;
  if (g->symbol_count) {
    memcpy(syms, g->symbols, sizeof(char *) * (size_t)g->symbol_count);
    memcpy(defs, g->symdefs, sizeof(kiln_symdef_t) * (size_t)g->symbol_count);
  }
  syms[g->symbol_count] = copy;
  defs[g->symbol_count] = *def;
  g->symbols = syms;
  g->symdefs = defs;
  return g->symbol_count++;
}

int32_t kiln_graph_intern_symbol(kiln_graph_t *g, const char *name, size_t n) {
  kiln_symdef_t base = {.coef = 1, .factor_count = 0};
  return intern(g, name, n, &base);
}

static bool mul_overflows(int64_t a, int64_t b, int64_t *out) {
  return __builtin_mul_overflow(a, b, out) || *out < 0;
}

static int cmp_id(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

kiln_status_t kiln_graph_product_dim(kiln_graph_t *g, int64_t coef,
                                     const int32_t *factors, int32_t count,
                                     int64_t *out_dim) {
  if (coef == 0 || count == 0) {
    *out_dim = coef;
    return NULL;
  }
  if (count == 1 && coef == 1) {
    *out_dim = KILN_SYM(factors[0]);
    return NULL;
  }
  if (count > KILN_MAX_SYM_FACTORS)
    return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                            "a size product of %d symbols; at most %d",
                            (int)count, KILN_MAX_SYM_FACTORS);
  kiln_symdef_t def = {.coef = coef, .factor_count = count};
  memcpy(def.factors, factors, sizeof(int32_t) * (size_t)count);
  qsort(def.factors, (size_t)count, sizeof(int32_t), cmp_id);
  // Canonical text: the constant (unless 1), then the factors by name.
  int32_t by_name[KILN_MAX_SYM_FACTORS];
  memcpy(by_name, def.factors, sizeof(by_name));
  for (int32_t i = 1; i < count; ++i)
    for (int32_t j = i; j > 0 && strcmp(g->symbols[by_name[j - 1]],
                                        g->symbols[by_name[j]]) > 0; --j) {
      int32_t t = by_name[j];
      by_name[j] = by_name[j - 1];
      by_name[j - 1] = t;
    }
  char name[256];
  size_t o = coef == 1 ? 0 : (size_t)snprintf(name, sizeof(name), "%lld", (long long)coef);
  for (int32_t i = 0; i < count && o < sizeof(name); ++i)
    o += (size_t)snprintf(name + o, sizeof(name) - o, "%s%s", o ? "*" : "",
                          g->symbols[by_name[i]]);
  if (o >= sizeof(name))
    return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                            "a size product's name is too long");
  int32_t id = intern(g, name, o, &def);
  if (id < 0) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "symbols");
  *out_dim = KILN_SYM(id);
  return NULL;
}

void kiln_dim_monomial(const kiln_graph_t *g, int64_t dim, kiln_monomial_t *out) {
  memset(out, 0, sizeof(*out));
  if (!KILN_IS_SYM(dim)) {
    out->coef = dim;
    return;
  }
  int32_t id = KILN_SYM_ID(dim);
  const kiln_symdef_t *d = &g->symdefs[id];
  out->coef = d->coef;
  if (d->factor_count == 0) {
    out->count = 1;
    out->factors[0] = id;
    return;
  }
  out->count = d->factor_count;
  memcpy(out->factors, d->factors, sizeof(int32_t) * (size_t)d->factor_count);
}

bool kiln_monomial_mul_dim(const kiln_graph_t *g, kiln_monomial_t *m,
                           int64_t dim) {
  kiln_monomial_t d;
  kiln_dim_monomial(g, dim, &d);
  if (mul_overflows(m->coef, d.coef, &m->coef)) return false;
  if (m->coef == 0) {
    m->count = 0;  // a zero-sized dim: no symbol matters
    return true;
  }
  if (m->count + d.count > KILN_MAX_MONOMIAL_FACTORS) return false;
  memcpy(m->factors + m->count, d.factors, sizeof(int32_t) * (size_t)d.count);
  m->count += d.count;
  qsort(m->factors, (size_t)m->count, sizeof(int32_t), cmp_id);
  return true;
}

bool kiln_monomial_equal(const kiln_monomial_t *a, const kiln_monomial_t *b) {
  if (a->coef != b->coef) return false;
  if (a->coef == 0) return true;
  return a->count == b->count &&
         memcmp(a->factors, b->factors, sizeof(int32_t) * (size_t)a->count) == 0;
}

const char *kiln_monomial_str(const kiln_graph_t *g, const kiln_monomial_t *m,
                              char *buf, size_t n) {
  size_t o = (size_t)snprintf(buf, n, "%lld", (long long)m->coef);
  if (m->coef == 1 && m->count) o = (size_t)snprintf(buf, n, "%s", "");
  for (int32_t i = 0; i < m->count && m->coef != 0 && o < n; ++i)
    o += (size_t)snprintf(buf + o, n - o, "%s%s", o ? "*" : "", g->symbols[m->factors[i]]);
  return buf;
}

bool kiln_monomial_div(const kiln_monomial_t *num, const kiln_monomial_t *den,
                       kiln_monomial_t *out) {
  if (den->coef == 0 || num->coef % den->coef) return false;
  memset(out, 0, sizeof(*out));
  out->coef = num->coef / den->coef;
  // Both factor lists are sorted: a merge walk removes den's from num's.
  int32_t j = 0;
  for (int32_t i = 0; i < num->count; ++i) {
    if (j < den->count && den->factors[j] == num->factors[i]) {
      j++;
      continue;
    }
    out->factors[out->count++] = num->factors[i];
  }
  return j == den->count;
}

bool kiln_type_monomial(const kiln_graph_t *g, const kiln_type_t *t,
                        kiln_monomial_t *out) {
  memset(out, 0, sizeof(*out));
  out->coef = 1;
  for (int i = 0; i < t->rank; ++i)
    if (!kiln_monomial_mul_dim(g, out, t->dims[i])) return false;
  return true;
}

int32_t kiln_graph_next_derived(const kiln_graph_t *g, const int64_t *binding,
                                int32_t *factor) {
  for (int32_t s = 0; s < g->symbol_count; ++s) {
    const kiln_symdef_t *d = &g->symdefs[s];
    if (d->factor_count == 0) continue;
    int32_t unknown = -1, unknowns = 0;
    for (int32_t k = 0; k < d->factor_count; ++k)
      if (binding[d->factors[k]] < 0) {
        unknowns += unknown != d->factors[k] ? 1 : 2;  // a repeat: unsolvable
        unknown = d->factors[k];
      }
    if (unknowns == 0 && binding[s] < 0) {
      *factor = -1;
      return s;
    }
    if (unknowns == 1 && binding[s] >= 0) {
      *factor = unknown;
      return s;
    }
  }
  return -1;
}

// The product of d's constant and its factors but `skip` (-1: all); false
// on overflow.
static bool product_of(const kiln_symdef_t *d, const int64_t *binding, int32_t skip,
                       int64_t *out) {
  int64_t p = d->coef;
  for (int32_t k = 0; k < d->factor_count; ++k)
    if (d->factors[k] != skip && mul_overflows(p, binding[d->factors[k]], &p)) return false;
  *out = p;
  return true;
}

kiln_status_t kiln_graph_resolve_binding(const kiln_graph_t *g,
                                         int64_t *binding) {
  int32_t s, f;
  while ((s = kiln_graph_next_derived(g, binding, &f)) >= 0) {
    int64_t p;
    bool ok = product_of(&g->symdefs[s], binding, f, &p);
    if (f < 0) {
      if (!ok)
        return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                                "size %s overflows for this call's sizes",
                                g->symbols[s]);
      binding[s] = p;
    } else if (!ok || p == 0) {
      return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                              "size %s is %lld in this call's inputs, from which "
                              "%s cannot be told (its other factors' product is %s)",
                              g->symbols[s], (long long)binding[s], g->symbols[f],
                              ok ? "0" : "overflowing");
    } else if (binding[s] % p) {
      return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                              "size %s is %lld in this call's inputs, "
                              "which is no multiple of %lld: no %s fits",
                              g->symbols[s], (long long)binding[s],
                              (long long)p, g->symbols[f]);
    } else {
      binding[f] = binding[s] / p;
    }
  }
  // Products the inputs state that their factors contradict.
  for (s = 0; s < g->symbol_count; ++s) {
    const kiln_symdef_t *d = &g->symdefs[s];
    bool bound = d->factor_count > 0 && binding[s] >= 0;
    for (int32_t k = 0; bound && k < d->factor_count; ++k) bound = binding[d->factors[k]] >= 0;
    int64_t p;
    if (!bound || (product_of(d, binding, -1, &p) && p == binding[s])) continue;
    char fs[256];
    size_t o = 0;
    fs[0] = 0;
    for (int32_t k = 0; k < d->factor_count && o < sizeof(fs); ++k)
      o += (size_t)snprintf(fs + o, sizeof(fs) - o, "%s%s=%lld", k ? ", " : "",
                            g->symbols[d->factors[k]], (long long)binding[d->factors[k]]);
    char want[32];
    if (product_of(d, binding, -1, &p)) snprintf(want, sizeof(want), "%lld", (long long)p);
    else snprintf(want, sizeof(want), "overflow");
    return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                            "size %s is %lld in this call's inputs, but %s makes it %s",
                            g->symbols[s], (long long)binding[s], fs, want);
  }
  // (kiln_graph_check_symbols made sure that every size the graph uses is
  // bound by now; a symbol left at -1 is one no type names.)
  for (int32_t i = 0; i < g->bound_count; ++i) {
    const kiln_size_bound_t *b = &g->bounds[i];
    int64_t small = KILN_IS_SYM(b->small) ? binding[KILN_SYM_ID(b->small)] : b->small;
    int64_t large = KILN_IS_SYM(b->large) ? binding[KILN_SYM_ID(b->large)] : b->large;
    if (small < 0 || large < 0 || small <= large) continue;
    const kiln_node_t *n = &g->nodes[b->node];
    char ss[96], ls[96];
    if (KILN_IS_SYM(b->small))
      snprintf(ss, sizeof(ss), "%s = %lld", g->symbols[KILN_SYM_ID(b->small)], (long long)small);
    else
      snprintf(ss, sizeof(ss), "%lld", (long long)small);
    if (KILN_IS_SYM(b->large))
      snprintf(ls, sizeof(ls), "%s = %lld", g->symbols[KILN_SYM_ID(b->large)], (long long)large);
    else
      snprintf(ls, sizeof(ls), "%lld", (long long)large);
    return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                            "%d:%d: %s: end %s is past the size of the sliced dim, %s, "
                            "in this call's inputs; expected an end within the dim",
                            n->line, n->col, kiln_op_name(n->op), ss, ls);
  }
  return NULL;
}

kiln_status_t kiln_graph_check_symbols(const kiln_graph_t *g) {
  if (g->symbol_count == 0) return NULL;
  // -1: not known from the inputs (kiln_graph_next_derived's convention).
  int64_t *known = malloc(sizeof(int64_t) * (size_t)g->symbol_count);
  bool *used = calloc((size_t)g->symbol_count, sizeof(bool));
  if (!known || !used) {
    free(known);
    free(used);
    return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "checking symbols");
  }
  for (int32_t s = 0; s < g->symbol_count; ++s) known[s] = -1;
  for (int32_t i = 0; i < g->input_count; ++i) {
    const kiln_type_t *t = &g->values[g->inputs[i]].type;
    for (int d = 0; d < t->rank; ++d)
      if (KILN_IS_SYM(t->dims[d])) known[KILN_SYM_ID(t->dims[d])] = 0;
  }
  int32_t s, f;
  while ((s = kiln_graph_next_derived(g, known, &f)) >= 0) known[f < 0 ? s : f] = 0;
  for (int32_t v = 0; v < g->value_count; ++v) {
    const kiln_type_t *t = &g->values[v].type;
    for (int d = 0; d < t->rank; ++d)
      if (KILN_IS_SYM(t->dims[d])) used[KILN_SYM_ID(t->dims[d])] = true;
  }
  for (int32_t i = 0; i < g->node_count; ++i)
    for (int32_t k = 0; k < g->nodes[i].attr_count; ++k) {
      const kiln_attr_t *a = &g->nodes[i].attrs[k];
      for (int32_t e = 0; a->kind == KILN_ATTR_LIST && a->sym && e < a->count; ++e)
        if (a->sym[e]) used[KILN_SYM_ID(a->ints[e])] = true;
      if (a->kind == KILN_ATTR_INT && a->sym && a->sym[0]) used[KILN_SYM_ID(a->i)] = true;
    }
  kiln_status_t st = NULL;
  for (int32_t s = 0; s < g->symbol_count && !st; ++s)
    if (used[s] && known[s] < 0)
      st = kiln_make_status(KILN_STATUS_UNSUPPORTED,
                            "graph @%s: size %s is not determined by the inputs' "
                            "sizes; expected each symbol in an input's type (or "
                            "a product there with it as its one other symbol)",
                            g->name ? g->name : "main", g->symbols[s]);
  free(known);
  free(used);
  return st;
}

void kiln_graph_derive_binding(const kiln_graph_t *g, int64_t *binding) {
  // Factors have lower ids than the products they are in.
  for (int32_t s = 0; s < g->symbol_count; ++s) {
    const kiln_symdef_t *d = &g->symdefs[s];
    if (d->factor_count == 0) continue;
    int64_t v = d->coef;
    for (int32_t k = 0; k < d->factor_count && v >= 0; ++k) {
      int64_t f = binding[d->factors[k]];
      if (f < 0 || mul_overflows(v, f, &v)) v = -1;
    }
    binding[s] = v;
  }
}
