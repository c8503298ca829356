// Graph text → kiln_graph_t. The grammar is in docs/graph-format.md.
// Every error names line:column and what was expected.
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph.h"

typedef enum {
  TOK_EOF, TOK_IDENT, TOK_VALUE /* %x */, TOK_GLOBAL /* @x */, TOK_INT,
  TOK_FLOAT, TOK_STRING, TOK_PUNCT, TOK_ERROR,
} tok_kind_t;

typedef struct {
  tok_kind_t kind;
  const char *start;
  size_t length;
  int line, col;
  int64_t i;
  double f;
} token_t;

typedef struct {
  const char *text, *end, *p;
  const char *filename;
  int line, col;
  token_t tok;
  kiln_graph_t *g;
  kiln_status_t status;
  // Value names → indices: open addressing over `names_cap` slots (a power
  // of two, at most half full) holding value index + 1, 0 when empty.
  // Optimizer graphs have thousands of values; a linear scan per operand
  // made parsing quadratic.
  int32_t *names;
  size_t names_cap;
} parser_t;

static kiln_status_t perr(parser_t *ps, const token_t *t, const char *fmt,
                          ...) KILN_PRINTF(3, 4);
static kiln_status_t perr(parser_t *ps, const token_t *t, const char *fmt,
                          ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  char found[48];
  if (t->kind == TOK_EOF) {
    snprintf(found, sizeof(found), "end of input");
  } else {
    int n = t->length > 32 ? 32 : (int)t->length;
    snprintf(found, sizeof(found), "'%.*s'", n, t->start);
  }
  return kiln_make_status(KILN_STATUS_PARSE_ERROR, "%s:%d:%d: %s, found %s",
                          ps->filename, t->line, t->col, msg, found);
}

static void advance_char(parser_t *ps) {
  if (*ps->p == '\n') {
    ps->line++;
    ps->col = 1;
  } else {
    ps->col++;
  }
  ps->p++;
}

static bool is_ident_char(int c) {
  return isalnum(c) || c == '_' || c == '.';
}

// Lexes the next token into ps->tok.
static void lex(parser_t *ps) {
  for (;;) {
    while (ps->p < ps->end && isspace((unsigned char)*ps->p)) advance_char(ps);
    if (ps->p < ps->end && (*ps->p == '#' ||
                            (*ps->p == '/' && ps->p + 1 < ps->end &&
                             ps->p[1] == '/'))) {
      while (ps->p < ps->end && *ps->p != '\n') advance_char(ps);
      continue;
    }
    break;
  }
  token_t *t = &ps->tok;
  memset(t, 0, sizeof(*t));
  t->start = ps->p;
  t->line = ps->line;
  t->col = ps->col;
  if (ps->p >= ps->end) {
    t->kind = TOK_EOF;
    return;
  }
  unsigned char c = (unsigned char)*ps->p;
  if (c == '%' || c == '@') {
    advance_char(ps);
    while (ps->p < ps->end && is_ident_char((unsigned char)*ps->p))
      advance_char(ps);
    t->kind = c == '%' ? TOK_VALUE : TOK_GLOBAL;
    t->length = (size_t)(ps->p - t->start);
    if (t->length == 1) t->kind = TOK_ERROR;
    return;
  }
  if (isalpha(c) || c == '_') {
    while (ps->p < ps->end && is_ident_char((unsigned char)*ps->p))
      advance_char(ps);
    t->kind = TOK_IDENT;
    t->length = (size_t)(ps->p - t->start);
    return;
  }
  if (isdigit(c) || c == '-' || c == '+') {
    const char *q = ps->p;
    if (*q == '-' || *q == '+') q++;
    // -inf / inf are identifiers handled by the number reader below.
    if (q < ps->end && (isdigit((unsigned char)*q) || *q == '.')) {
      bool is_float = false;
      const char *r = q;
      while (r < ps->end && isdigit((unsigned char)*r)) r++;
      if (r < ps->end && *r == '.') {
        is_float = true;
        r++;
        while (r < ps->end && isdigit((unsigned char)*r)) r++;
      }
      if (r < ps->end && (*r == 'e' || *r == 'E')) {
        const char *e = r + 1;
        if (e < ps->end && (*e == '-' || *e == '+')) e++;
        if (e < ps->end && isdigit((unsigned char)*e)) {
          is_float = true;
          r = e;
          while (r < ps->end && isdigit((unsigned char)*r)) r++;
        }
      }
      char buf[64];
      size_t n = (size_t)(r - ps->p);
      if (n >= sizeof(buf)) {
        t->kind = TOK_ERROR;
        t->length = n;
        return;
      }
      memcpy(buf, ps->p, n);
      buf[n] = 0;
      while (ps->p < r) advance_char(ps);
      t->length = n;
      errno = 0;
      if (is_float) {
        t->kind = TOK_FLOAT;
        t->f = strtod(buf, NULL);
      } else {
        t->kind = TOK_INT;
        t->i = strtoll(buf, NULL, 10);
        if (errno == ERANGE) t->kind = TOK_ERROR;
      }
      return;
    }
    if (q + 3 <= ps->end && memcmp(q, "inf", 3) == 0) {
      bool neg = *ps->p == '-';
      while (ps->p < q + 3) advance_char(ps);
      t->kind = TOK_FLOAT;
      t->f = neg ? -INFINITY : INFINITY;
      t->length = (size_t)(ps->p - t->start);
      return;
    }
  }
  if (c == '"') {
    advance_char(ps);
    while (ps->p < ps->end && *ps->p != '"' && *ps->p != '\n')
      advance_char(ps);
    if (ps->p >= ps->end || *ps->p != '"') {
      t->kind = TOK_ERROR;
      t->length = (size_t)(ps->p - t->start);
      return;
    }
    advance_char(ps);
    t->kind = TOK_STRING;
    t->length = (size_t)(ps->p - t->start);
    return;
  }
  if (c == '-' && ps->p + 1 < ps->end && ps->p[1] == '>') {
    advance_char(ps);
    advance_char(ps);
    t->kind = TOK_PUNCT;
    t->length = 2;
    return;
  }
  if (strchr("(){}[],:=*", c)) {
    advance_char(ps);
    t->kind = TOK_PUNCT;
    t->length = 1;
    return;
  }
  advance_char(ps);
  t->kind = TOK_ERROR;
  t->length = 1;
}

static bool is_punct(const token_t *t, char c) {
  return t->kind == TOK_PUNCT && t->length == 1 && t->start[0] == c;
}
static bool is_arrow(const token_t *t) {
  return t->kind == TOK_PUNCT && t->length == 2;
}
static bool is_ident(const token_t *t, const char *s) {
  return t->kind == TOK_IDENT && strlen(s) == t->length &&
         memcmp(t->start, s, t->length) == 0;
}

static kiln_status_t expect_punct(parser_t *ps, char c, const char *what) {
  if (!is_punct(&ps->tok, c))
    return perr(ps, &ps->tok, "expected '%c' %s", c, what);
  lex(ps);
  return NULL;
}

//===--- graph building ---------------------------------------------------===//

static uint64_t name_hash(const char *s, size_t n) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (size_t i = 0; i < n; ++i) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
  return h;
}

static int32_t find_value(const parser_t *ps, const char *s, size_t n) {
  if (!ps->names_cap) return -1;
  size_t mask = ps->names_cap - 1;
  for (size_t i = name_hash(s, n) & mask;; i = (i + 1) & mask) {
    int32_t slot = ps->names[i];
    if (!slot) return -1;
    const char *name = ps->g->values[slot - 1].name;
    if (strlen(name) == n && memcmp(name, s, n) == 0) return slot - 1;
  }
}

static bool names_insert(parser_t *ps, int32_t v) {
  if (2 * ((size_t)ps->g->value_count + 1) > ps->names_cap) {
    size_t cap = ps->names_cap ? 2 * ps->names_cap : 64;
    int32_t *slots = calloc(cap, sizeof(*slots));
    if (!slots) return false;
    for (size_t i = 0; i < ps->names_cap; ++i) {
      int32_t slot = ps->names[i];
      if (!slot) continue;
      const char *name = ps->g->values[slot - 1].name;
      size_t j = name_hash(name, strlen(name)) & (cap - 1);
      while (slots[j]) j = (j + 1) & (cap - 1);
      slots[j] = slot;
    }
    free(ps->names);
    ps->names = slots;
    ps->names_cap = cap;
  }
  const char *name = ps->g->values[v].name;
  size_t j = name_hash(name, strlen(name)) & (ps->names_cap - 1);
  while (ps->names[j]) j = (j + 1) & (ps->names_cap - 1);
  ps->names[j] = v + 1;
  return true;
}

static kiln_status_t add_value(parser_t *ps, const token_t *name_tok,
                               int32_t node, int32_t index, int32_t *out) {
  kiln_graph_t *g = ps->g;
  // name_tok includes the '%'.
  if (find_value(ps, name_tok->start + 1, name_tok->length - 1) >= 0)
    return perr(ps, name_tok, "value redefined; expected a fresh name");
  if (g->value_count == g->value_capacity) {
    int32_t cap = g->value_capacity ? g->value_capacity * 2 : 32;
    kiln_value_t *v = realloc(g->values, sizeof(*v) * (size_t)cap);
    if (!v) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "graph values");
    g->values = v;
    g->value_capacity = cap;
  }
  kiln_value_t *v = &g->values[g->value_count];
  memset(v, 0, sizeof(*v));
  v->name = kiln_arena_strndup(&g->arena, name_tok->start + 1,
                               name_tok->length - 1);
  if (!v->name) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "names");
  v->node = node;
  v->index = index;
  v->type.rank = -1;  // not yet known
  if (!names_insert(ps, g->value_count))
    return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "graph names");
  *out = g->value_count++;
  return NULL;
}

// dim := term ('*' term)*   term := int | ident
// A product with a symbol is a derived symbol ("128*s0"; see graph.h).
static kiln_status_t parse_dim(parser_t *ps, int64_t *out) {
  int64_t coef = 1;
  token_t names[KILN_MAX_SYM_FACTORS];
  int32_t count = 0;
  for (;;) {
    if (ps->tok.kind == TOK_INT && ps->tok.i >= 0) {
      if (__builtin_mul_overflow(coef, ps->tok.i, &coef))
        return perr(ps, &ps->tok, "size product overflows");
    } else if (ps->tok.kind == TOK_IDENT) {
      if (count == KILN_MAX_SYM_FACTORS)
        return perr(ps, &ps->tok, "expected at most %d symbols in a size",
                    KILN_MAX_SYM_FACTORS);
      names[count++] = ps->tok;
    } else {
      return perr(ps, &ps->tok,
                  "expected a size (non-negative integer, symbol or product)");
    }
    lex(ps);
    if (!is_punct(&ps->tok, '*')) break;
    lex(ps);
  }
  // A zero size names no symbol (none is interned for it).
  int32_t factors[KILN_MAX_SYM_FACTORS];
  for (int32_t k = 0; coef != 0 && k < count; ++k) {
    factors[k] = kiln_graph_intern_symbol(ps->g, names[k].start, names[k].length);
    if (factors[k] < 0) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "symbols");
  }
  return kiln_graph_product_dim(ps->g, coef, factors, coef != 0 ? count : 0, out);
}

// type := dtype '[' (dim (',' dim)*)? ']'
static kiln_status_t parse_type(parser_t *ps, kiln_type_t *out) {
  memset(out, 0, sizeof(*out));
  if (ps->tok.kind != TOK_IDENT ||
      !kiln_dtype_parse(ps->tok.start, ps->tok.length, &out->dtype))
    return perr(ps, &ps->tok,
                "expected a dtype (f32, f16, bf16, f64, i32, i64, bool)");
  lex(ps);
  KILN_RETURN_IF_ERROR_PLAIN(expect_punct(ps, '[', "to open the shape"));
  if (!is_punct(&ps->tok, ']')) {
    for (;;) {
      if (out->rank == KILN_MAX_RANK)
        return perr(ps, &ps->tok, "expected at most %d dims", KILN_MAX_RANK);
      KILN_RETURN_IF_ERROR_PLAIN(parse_dim(ps, &out->dims[out->rank++]));
      if (is_punct(&ps->tok, ',')) {
        lex(ps);
        continue;
      }
      break;
    }
  }
  return expect_punct(ps, ']', "to close the shape");
}

// Scalar literal: int, float, true, false, inf, nan. Returns false when the
// token is none of these.
static bool scalar_literal(const token_t *t, kiln_attr_kind_t *kind,
                           int64_t *i, double *f) {
  if (t->kind == TOK_INT) {
    *kind = KILN_ATTR_INT;
    *i = t->i;
    *f = (double)t->i;
    return true;
  }
  if (t->kind == TOK_FLOAT) {
    *kind = KILN_ATTR_FLOAT;
    *f = t->f;
    return true;
  }
  if (is_ident(t, "true") || is_ident(t, "false")) {
    *kind = KILN_ATTR_BOOL;
    *i = is_ident(t, "true");
    *f = (double)*i;
    return true;
  }
  if (is_ident(t, "nan")) {
    *kind = KILN_ATTR_FLOAT;
    *f = NAN;
    return true;
  }
  if (is_ident(t, "inf")) {
    *kind = KILN_ATTR_FLOAT;
    *f = INFINITY;
    return true;
  }
  return false;
}

static kiln_status_t parse_attr_value(parser_t *ps, kiln_attr_t *a) {
  kiln_graph_t *g = ps->g;
  token_t *t = &ps->tok;
  kiln_attr_kind_t kind;
  int64_t iv = 0;
  double fv = 0;
  // A slice's `end` may be a size expression ("s0", "2*s0"): the sliced
  // length under a dynamic size (see kiln_attr_t.sym).
  if (strcmp(a->name, "end") == 0 &&
      ((t->kind == TOK_IDENT && !scalar_literal(t, &kind, &iv, &fv) && !is_ident(t, "none")) ||
       (t->kind == TOK_INT && t->i >= 0))) {
    int64_t dim;
    KILN_RETURN_IF_ERROR_PLAIN(parse_dim(ps, &dim));
    a->kind = KILN_ATTR_INT;
    a->i = dim;
    a->f = (double)dim;
    if (KILN_IS_SYM(dim)) {
      bool *flag = kiln_arena_alloc(&g->arena, sizeof(bool));
      if (!flag) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "attribute");
      *flag = true;
      a->sym = flag;
    }
    return NULL;
  }
  if (scalar_literal(t, &kind, &iv, &fv)) {
    a->kind = kind;
    a->i = iv;
    a->f = fv;
    lex(ps);
    return NULL;
  }
  if (t->kind == TOK_STRING) {
    a->kind = KILN_ATTR_STR;
    a->s = kiln_arena_strndup(&g->arena, t->start + 1, t->length - 2);
    lex(ps);
    return NULL;
  }
  if (t->kind == TOK_IDENT) {
    kiln_dtype_t dt;
    if (kiln_dtype_parse(t->start, t->length, &dt)) {
      a->kind = KILN_ATTR_DTYPE;
      a->i = dt;
    } else {
      a->kind = KILN_ATTR_STR;
      a->s = kiln_arena_strndup(&g->arena, t->start, t->length);
    }
    lex(ps);
    return NULL;
  }
  if (is_punct(t, '[')) {
    lex(ps);
    // Elements: numbers, or in a 'shape' list also size expressions ("s0",
    // "128*s0") whose dim is kept in `dims` (see kiln_attr_t.sym).
    bool sizes = strcmp(a->name, "shape") == 0;
    int32_t cap = 16, n = 0;
    double *fs = malloc(sizeof(double) * (size_t)cap);
    int64_t *dims = malloc(sizeof(int64_t) * (size_t)cap);
    bool all_int = true, any_sym = false;
    kiln_status_t s = NULL;
    if (!fs || !dims) s = kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "attribute");
    while (!s && !is_punct(&ps->tok, ']')) {
      if (n == cap) {
        cap *= 2;
        double *nf = realloc(fs, sizeof(double) * (size_t)cap);
        if (nf) fs = nf;
        int64_t *nd = nf ? realloc(dims, sizeof(int64_t) * (size_t)cap) : NULL;
        if (nd) dims = nd;
        if (!nf || !nd) {
          s = kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "attribute");
          break;
        }
      }
      bool literal = scalar_literal(&ps->tok, &kind, &iv, &fv);
      if (sizes && ((ps->tok.kind == TOK_INT && ps->tok.i >= 0) ||
                    (ps->tok.kind == TOK_IDENT && !literal))) {
        s = parse_dim(ps, &dims[n]);
        if (s) break;
        any_sym |= KILN_IS_SYM(dims[n]);
        fs[n] = KILN_IS_SYM(dims[n]) ? -1 : (double)dims[n];
        n++;
      } else if (literal) {
        if (kind == KILN_ATTR_FLOAT) all_int = false;
        dims[n] = 0;
        fs[n++] = fv;
        lex(ps);
      } else {
        s = perr(ps, &ps->tok, sizes ? "expected a number or a size in the list"
                                     : "expected a number in the list");
        break;
      }
      if (is_punct(&ps->tok, ',')) {
        lex(ps);
      } else if (!is_punct(&ps->tok, ']')) {
        s = perr(ps, &ps->tok, "expected ',' or ']' in the list");
      }
    }
    if (!s && any_sym && !all_int)
      s = perr(ps, &ps->tok, "a list of sizes with a float in it");
    double *af = NULL;
    int64_t *ai = NULL;
    bool *as = NULL;
    if (!s) {
      lex(ps);
      af = kiln_arena_alloc(&g->arena, sizeof(double) * (size_t)(n + 1));
      ai = kiln_arena_alloc(&g->arena, sizeof(int64_t) * (size_t)(n + 1));
      as = any_sym ? kiln_arena_alloc(&g->arena, sizeof(bool) * (size_t)(n + 1)) : NULL;
      if (!af || !ai || (any_sym && !as))
        s = kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "attribute");
    }
    if (!s) {
      for (int32_t k = 0; k < n; ++k) {
        af[k] = fs[k];
        ai[k] = KILN_IS_SYM(dims[k]) ? dims[k] : (int64_t)fs[k];
        if (as) as[k] = KILN_IS_SYM(dims[k]);
      }
      a->kind = KILN_ATTR_LIST;
      a->count = n;
      a->is_int = all_int;
      a->floats = af;
      a->ints = ai;
      a->sym = as;
    }
    free(fs);
    free(dims);
    return s;
  }
  return perr(ps, t, "expected an attribute value (number, bool, name, "
                     "string or [list])");
}

static kiln_status_t add_node(kiln_graph_t *g, kiln_node_t **out) {
  if (g->node_count == g->node_capacity) {
    int32_t cap = g->node_capacity ? g->node_capacity * 2 : 32;
    kiln_node_t *n = realloc(g->nodes, sizeof(*n) * (size_t)cap);
    if (!n) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "graph nodes");
    g->nodes = n;
    g->node_capacity = cap;
  }
  *out = &g->nodes[g->node_count++];
  memset(*out, 0, sizeof(**out));
  return NULL;
}

// stmt := results '=' opname '(' operands ')' attrs? (':' types)?
static kiln_status_t parse_node(parser_t *ps) {
  kiln_graph_t *g = ps->g;
  token_t names[KILN_MAX_RESULTS];
  int nres = 0;
  for (;;) {
    if (ps->tok.kind != TOK_VALUE)
      return perr(ps, &ps->tok, "expected a result name like %%x");
    if (nres == KILN_MAX_RESULTS)
      return perr(ps, &ps->tok, "expected at most %d results",
                  KILN_MAX_RESULTS);
    names[nres++] = ps->tok;
    lex(ps);
    if (is_punct(&ps->tok, ',')) {
      lex(ps);
      continue;
    }
    break;
  }
  KILN_RETURN_IF_ERROR_PLAIN(expect_punct(ps, '=', "after the result names"));
  token_t op_tok = ps->tok;
  kiln_op_id_t op;
  if (op_tok.kind != TOK_IDENT)
    return perr(ps, &op_tok, "expected an op name like aten.add");
  if (!kiln_op_lookup(op_tok.start, op_tok.length, &op))
    return perr(ps, &op_tok, "unknown op; expected one of the ops listed in "
                             "docs/graph-format.md");
  lex(ps);
  // Operands are parsed before the results are defined, so %x = op(%x) is
  // rejected as a use of an undefined value.
  kiln_operand_t ops[64];
  int32_t nops = 0;
  KILN_RETURN_IF_ERROR_PLAIN(expect_punct(ps, '(', "to open the operands"));
  while (!is_punct(&ps->tok, ')')) {
    if (nops == 64) return perr(ps, &ps->tok, "expected at most 64 operands");
    kiln_operand_t *o = &ops[nops++];
    memset(o, 0, sizeof(*o));
    kiln_attr_kind_t kind;
    int64_t iv;
    double fv;
    if (ps->tok.kind == TOK_VALUE) {
      int32_t v = find_value(ps, ps->tok.start + 1, ps->tok.length - 1);
      if (v < 0)
        return perr(ps, &ps->tok, "use of undefined value; expected a value "
                                  "defined earlier");
      o->kind = KILN_OPERAND_VALUE;
      o->value = v;
    } else if (is_ident(&ps->tok, "none")) {
      o->kind = KILN_OPERAND_NONE;
    } else if (scalar_literal(&ps->tok, &kind, &iv, &fv)) {
      o->kind = kind == KILN_ATTR_INT     ? KILN_OPERAND_INT
                : kind == KILN_ATTR_FLOAT ? KILN_OPERAND_FLOAT
                                          : KILN_OPERAND_BOOL;
      o->i = iv;
      o->f = fv;
    } else {
      return perr(ps, &ps->tok,
                  "expected an operand (%%value, number, bool or none)");
    }
    lex(ps);
    if (is_punct(&ps->tok, ',')) {
      lex(ps);
    } else if (!is_punct(&ps->tok, ')')) {
      return perr(ps, &ps->tok, "expected ',' or ')' after an operand");
    }
  }
  lex(ps);
  kiln_attr_t attrs[32];
  int32_t nattrs = 0;
  if (is_punct(&ps->tok, '{')) {
    lex(ps);
    while (!is_punct(&ps->tok, '}')) {
      if (nattrs == 32) return perr(ps, &ps->tok, "expected at most 32 attrs");
      if (ps->tok.kind != TOK_IDENT)
        return perr(ps, &ps->tok, "expected an attribute name");
      kiln_attr_t *a = &attrs[nattrs++];
      memset(a, 0, sizeof(*a));
      for (int32_t k = 0; k < nattrs - 1; ++k)
        if (strlen(attrs[k].name) == ps->tok.length &&
            memcmp(attrs[k].name, ps->tok.start, ps->tok.length) == 0)
          return perr(ps, &ps->tok, "attribute given twice; expected each "
                                    "name once");
      a->name = kiln_arena_strndup(&g->arena, ps->tok.start, ps->tok.length);
      lex(ps);
      KILN_RETURN_IF_ERROR_PLAIN(
          expect_punct(ps, '=', "after the attribute name"));
      KILN_RETURN_IF_ERROR_PLAIN(parse_attr_value(ps, a));
      if (is_punct(&ps->tok, ',')) {
        lex(ps);
      } else if (!is_punct(&ps->tok, '}')) {
        return perr(ps, &ps->tok, "expected ',' or '}' after an attribute");
      }
    }
    lex(ps);
  }
  kiln_type_t types[KILN_MAX_RESULTS];
  int ntypes = 0;
  if (is_punct(&ps->tok, ':')) {
    lex(ps);
    for (;;) {
      if (ntypes == nres)
        return perr(ps, &ps->tok, "expected %d result type%s", nres,
                    nres == 1 ? "" : "s");
      KILN_RETURN_IF_ERROR_PLAIN(parse_type(ps, &types[ntypes++]));
      if (is_punct(&ps->tok, ',')) {
        lex(ps);
        continue;
      }
      break;
    }
    if (ntypes != nres)
      return perr(ps, &ps->tok, "expected %d result types, got %d", nres,
                  ntypes);
  }
  kiln_node_t *node = NULL;
  KILN_RETURN_IF_ERROR_PLAIN(add_node(g, &node));
  int32_t node_index = g->node_count - 1;
  node->op = op;
  node->line = op_tok.line;
  node->col = op_tok.col;
  node->operand_count = nops;
  node->operands = kiln_arena_alloc(&g->arena, sizeof(kiln_operand_t) *
                                                   (size_t)(nops + 1));
  node->attrs =
      kiln_arena_alloc(&g->arena, sizeof(kiln_attr_t) * (size_t)(nattrs + 1));
  if (!node->operands || !node->attrs)
    return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "graph nodes");
  memcpy(node->operands, ops, sizeof(kiln_operand_t) * (size_t)nops);
  node->attr_count = nattrs;
  memcpy(node->attrs, attrs, sizeof(kiln_attr_t) * (size_t)nattrs);
  node->result_count = nres;
  for (int k = 0; k < nres; ++k) {
    int32_t v;
    KILN_RETURN_IF_ERROR_PLAIN(add_value(ps, &names[k], node_index, k, &v));
    node = &g->nodes[node_index];
    node->results[k] = v;
    if (ntypes) g->values[v].type = types[k];
  }
  return NULL;
}

static kiln_status_t parse_graph(parser_t *ps) {
  kiln_graph_t *g = ps->g;
  lex(ps);
  if (!is_ident(&ps->tok, "graph"))
    return perr(ps, &ps->tok, "expected 'graph'");
  lex(ps);
  if (ps->tok.kind != TOK_GLOBAL)
    return perr(ps, &ps->tok, "expected the graph name like @main");
  g->name = kiln_arena_strndup(&g->arena, ps->tok.start + 1,
                               ps->tok.length - 1);
  lex(ps);
  KILN_RETURN_IF_ERROR_PLAIN(expect_punct(ps, '(', "to open the inputs"));
  // Inputs and returns are collected in growable lists (an optimizer step
  // over every parameter of a model has thousands), then moved to the arena.
  int32_t *list = NULL;
  size_t count = 0, cap = 0;
  kiln_mutation_t *muts = NULL;
  size_t nmut = 0;
  kiln_status_t s = NULL;
#define KILN_PUSH(x)                                                        \
  do {                                                                      \
    if (count == cap) {                                                     \
      size_t ncap = cap ? 2 * cap : 16;                                     \
      int32_t *nl = realloc(list, sizeof(*nl) * ncap);                      \
      if (!nl) {                                                            \
        s = kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "graph");           \
        goto done;                                                          \
      }                                                                     \
      list = nl;                                                            \
      cap = ncap;                                                           \
    }                                                                       \
    list[count++] = (x);                                                    \
  } while (0)
  while (!is_punct(&ps->tok, ')')) {
    if (ps->tok.kind != TOK_VALUE) {
      s = perr(ps, &ps->tok, "expected an input name like %%x");
      goto done;
    }
    token_t name = ps->tok;
    lex(ps);
    int32_t v;
    if ((s = expect_punct(ps, ':', "after the input name")) ||
        (s = add_value(ps, &name, -1, (int32_t)count, &v)) ||
        (s = parse_type(ps, &g->values[v].type)))
      goto done;
    KILN_PUSH(v);
    if (is_punct(&ps->tok, ',')) {
      lex(ps);
    } else if (!is_punct(&ps->tok, ')')) {
      s = perr(ps, &ps->tok, "expected ',' or ')' after an input");
      goto done;
    }
  }
  lex(ps);
  if ((s = expect_punct(ps, '{', "to open the graph body"))) goto done;
  g->input_count = (int32_t)count;
  g->inputs = kiln_arena_alloc(&g->arena, sizeof(int32_t) * (count + 1));
  if (!g->inputs) {
    s = kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "graph");
    goto done;
  }
  if (count) memcpy(g->inputs, list, sizeof(int32_t) * count);
  for (;;) {
    if (is_ident(&ps->tok, "return")) break;
    if (ps->tok.kind == TOK_EOF || is_punct(&ps->tok, '}')) {
      s = perr(ps, &ps->tok, "expected 'return' before the end of the graph");
      goto done;
    }
    if ((s = parse_node(ps))) goto done;
  }
  lex(ps);
  // `return %a, %b -> %x`: %a is an output; %b is stored into input %x.
  count = 0;
  for (;;) {
    if (ps->tok.kind != TOK_VALUE) {
      s = perr(ps, &ps->tok, "expected a returned value like %%y");
      break;
    }
    int32_t v = find_value(ps, ps->tok.start + 1, ps->tok.length - 1);
    if (v < 0) {
      s = perr(ps, &ps->tok, "return of an undefined value");
      break;
    }
    lex(ps);
    if (is_arrow(&ps->tok)) {
      lex(ps);
      token_t at = ps->tok;
      int32_t x = ps->tok.kind == TOK_VALUE
                      ? find_value(ps, ps->tok.start + 1, ps->tok.length - 1)
                      : -1;
      if (x < 0 || g->values[x].node >= 0) {
        s = perr(ps, &ps->tok, "expected a graph input after '->'");
        break;
      }
      for (size_t k = 0; k < nmut; ++k)
        if (muts[k].input == g->values[x].index) {
          s = perr(ps, &ps->tok, "input written twice; expected one '-> %%%s'",
                   g->values[x].name);
          break;
        }
      if (s) break;
      kiln_mutation_t *nm = realloc(muts, sizeof(*nm) * (nmut + 1));
      if (!nm) {
        s = kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "graph");
        break;
      }
      muts = nm;
      muts[nmut++] = (kiln_mutation_t){v, g->values[x].index, at.line, at.col};
      lex(ps);
    } else {
      KILN_PUSH(v);
    }
    if (is_punct(&ps->tok, ',')) {
      lex(ps);
      continue;
    }
    break;
  }
#undef KILN_PUSH
  if (!s) s = expect_punct(ps, '}', "to close the graph");
  if (!s && ps->tok.kind != TOK_EOF)
    s = perr(ps, &ps->tok, "expected end of input after the graph");
  if (!s) {
    g->output_count = (int32_t)count;
    g->outputs = kiln_arena_alloc(&g->arena, sizeof(int32_t) * (count + 1));
    g->mutation_count = (int32_t)nmut;
    g->mutations = kiln_arena_alloc(&g->arena, sizeof(*muts) * (nmut + 1));
    g->input_written = kiln_arena_alloc(&g->arena, (size_t)g->input_count + 1);
    if (!g->outputs || !g->mutations || !g->input_written) {
      s = kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "graph");
    } else {
      if (count) memcpy(g->outputs, list, sizeof(int32_t) * count);
      if (nmut) memcpy(g->mutations, muts, sizeof(*muts) * nmut);
      memset(g->input_written, 0, (size_t)g->input_count + 1);
      for (size_t k = 0; k < nmut; ++k) g->input_written[muts[k].input] = true;
    }
  }
done:
  free(muts);
  free(list);
  return s;
}

kiln_status_t kiln_graph_parse_text(const char *text, size_t length,
                                    const char *filename,
                                    kiln_graph_t **out_graph) {
  *out_graph = NULL;
  if (!text)
    return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                            "graph text is NULL; expected a string");
  parser_t ps;
  memset(&ps, 0, sizeof(ps));
  ps.text = ps.p = text;
  ps.end = text + length;
  ps.filename = filename ? filename : "<graph>";
  ps.line = ps.col = 1;
  ps.g = calloc(1, sizeof(kiln_graph_t));
  if (!ps.g) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "graph");
  kiln_arena_init(&ps.g->arena);
  if (memchr(text, 0, length)) {
    kiln_graph_free(ps.g);
    return kiln_make_status(KILN_STATUS_PARSE_ERROR,
                            "%s: graph text contains a NUL byte",
                            ps.filename);
  }
  kiln_status_t s = parse_graph(&ps);
  free(ps.names);
  if (!s) s = kiln_graph_verify(ps.g, ps.filename);
  if (s) {
    kiln_graph_free(ps.g);
    return s;
  }
  *out_graph = ps.g;
  return NULL;
}
