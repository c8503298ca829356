// The verifier: infers every result's dtype and shape, and checks the ones the
// text annotates. Errors name the op, the operand and the shapes.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph.h"

typedef struct {
  kiln_graph_t *g;
  const char *filename;
  const kiln_node_t *node;
} vctx_t;

static kiln_status_t verr(const vctx_t *c, const char *fmt, ...)
    KILN_PRINTF(2, 3);
static kiln_status_t verr(const vctx_t *c, const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  return kiln_make_status(KILN_STATUS_VERIFY_ERROR, "%s:%d:%d: %s: %s",
                          c->filename, c->node->line, c->node->col,
                          kiln_op_name(c->node->op), msg);
}

// "operand 1 (%w: f32[8,16])"
static const char *opnd_str(const vctx_t *c, int i, char *buf, size_t n) {
  const kiln_operand_t *o = &c->node->operands[i];
  if (o->kind != KILN_OPERAND_VALUE) {
    snprintf(buf, n, "operand %d (scalar)", i);
    return buf;
  }
  char t[160];
  const kiln_value_t *v = &c->g->values[o->value];
  snprintf(buf, n, "operand %d (%%%s: %s)", i, v->name,
           kiln_type_str(c->g, &v->type, t, sizeof(t)));
  return buf;
}

static kiln_status_t need_operands(const vctx_t *c, int lo, int hi) {
  int n = c->node->operand_count;
  if (n < lo || n > hi) {
    if (lo == hi) return verr(c, "expected %d operands, got %d", lo, n);
    return verr(c, "expected %d to %d operands, got %d", lo, hi, n);
  }
  return NULL;
}

static kiln_status_t need_tensor(const vctx_t *c, int i,
                                 const kiln_type_t **out) {
  const kiln_operand_t *o = &c->node->operands[i];
  if (o->kind != KILN_OPERAND_VALUE)
    return verr(c, "operand %d: expected a tensor, got a %s", i,
                o->kind == KILN_OPERAND_NONE ? "none" : "scalar");
  *out = &c->g->values[o->value].type;
  return NULL;
}

// Optional tensor: NULL when `none`.
static kiln_status_t opt_tensor(const vctx_t *c, int i,
                                const kiln_type_t **out) {
  *out = NULL;
  if (i >= c->node->operand_count) return NULL;
  if (c->node->operands[i].kind == KILN_OPERAND_NONE) return NULL;
  return need_tensor(c, i, out);
}

static kiln_status_t need_int_list(const vctx_t *c, const char *name,
                                   bool required, const kiln_attr_t **out) {
  const kiln_attr_t *a = kiln_node_attr(c->node, name);
  *out = NULL;
  if (!a) {
    if (required)
      return verr(c, "expected attribute '%s' (a list of integers)", name);
    return NULL;
  }
  if (a->kind == KILN_ATTR_INT) {
    // A single integer is accepted where a list is expected: dims = 1.
    kiln_attr_t *m = (kiln_attr_t *)a;
    int64_t *iv = kiln_arena_alloc(&c->g->arena, sizeof(int64_t));
    double *fv = kiln_arena_alloc(&c->g->arena, sizeof(double));
    if (!iv || !fv) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "attr");
    *iv = a->i;
    *fv = (double)a->i;
    m->kind = KILN_ATTR_LIST;
    m->count = 1;
    m->is_int = true;
    m->ints = iv;
    m->floats = fv;
  }
  if (a->kind != KILN_ATTR_LIST || !a->is_int)
    return verr(c, "attribute '%s': expected a list of integers", name);
  if (a->sym)
    for (int i = 0; i < a->count; ++i)
      if (a->sym[i])
        return verr(c, "attribute '%s': entry %d is the size %s; expected an "
                       "integer", name, i, c->g->symbols[KILN_SYM_ID(a->ints[i])]);
  *out = a;
  return NULL;
}

// A 'shape' attribute: integers and size expressions (symbolic entries).
static kiln_status_t need_shape_list(const vctx_t *c, const kiln_attr_t **out) {
  const kiln_attr_t *a = kiln_node_attr(c->node, "shape");
  *out = NULL;
  if (a && a->kind == KILN_ATTR_INT)  // shape = 12: a list of one
    return need_int_list(c, "shape", true, out);
  if (!a || a->kind != KILN_ATTR_LIST || !a->is_int)
    return verr(c, "expected attribute 'shape' (a list of sizes)");
  *out = a;
  return NULL;
}

static bool shape_entry_is_sym(const kiln_attr_t *a, int i) {
  return a->sym && a->sym[i];
}

// Category of a dtype for promotion: 0 bool, 1 integer, 2 float.
static int category(kiln_dtype_t t) {
  return t == KILN_BOOL ? 0 : kiln_dtype_is_float(t) ? 2 : 1;
}

// PyTorch's result_type over tensors and scalars: dimensioned tensors first,
// then zero-dim tensors, then Python scalars, each tier winning only when it
// is of a higher category.
kiln_dtype_t kiln_result_type(const kiln_graph_t *g, const kiln_operand_t *ops,
                              int n) {
  int have[3] = {0, 0, 0};
  kiln_dtype_t tier[3] = {KILN_BOOL, KILN_BOOL, KILN_BOOL};
  for (int i = 0; i < n; ++i) {
    const kiln_operand_t *o = &ops[i];
    int t;
    kiln_dtype_t d;
    if (o->kind == KILN_OPERAND_VALUE) {
      const kiln_type_t *ty = &g->values[o->value].type;
      t = ty->rank > 0 ? 0 : 1;
      d = ty->dtype;
    } else if (o->kind == KILN_OPERAND_NONE) {
      continue;
    } else {
      t = 2;
      d = o->kind == KILN_OPERAND_FLOAT ? KILN_F32
          : o->kind == KILN_OPERAND_INT ? KILN_I64
                                        : KILN_BOOL;
    }
    tier[t] = have[t] ? kiln_dtype_promote(tier[t], d) : d;
    have[t] = 1;
  }
  kiln_dtype_t r = KILN_BOOL;
  bool any = false;
  for (int t = 0; t < 3; ++t) {
    if (!have[t]) continue;
    if (!any) {
      r = tier[t];
      any = true;
    } else if (category(tier[t]) > category(r)) {
      // A higher-category scalar/zero-dim picks the default dtype of its
      // category only when it is a Python scalar; a zero-dim tensor keeps
      // its own dtype.
      r = t == 2 ? (category(tier[t]) == 2 ? KILN_F32 : KILN_I64) : tier[t];
    }
  }
  return r;
}

kiln_dtype_t kiln_node_compute_dtype(const kiln_graph_t *g,
                                     const kiln_node_t *n) {
  kiln_op_class_t cls = kiln_op_class(n->op);
  const kiln_operand_t *ops = n->operands;
  int count = n->operand_count;
  if (cls == KILN_CLASS_CONVERT) return g->values[ops[0].value].type.dtype;
  if (cls == KILN_CLASS_WHERE) {
    ops++;
    count--;
  }
  kiln_dtype_t t = kiln_result_type(g, ops, count);
  if ((cls == KILN_CLASS_UNARY_FLOAT ||
       (n->op == KILN_OP_DIV && !kiln_node_attr(n, "rounding_mode"))) &&
      !kiln_dtype_is_float(t))
    t = KILN_F32;
  return t;
}

// Broadcasts `b` into `out` (numpy rules, right-aligned).
static kiln_status_t broadcast(const vctx_t *c, kiln_type_t *out,
                               const kiln_type_t *b, int bi) {
  int r = out->rank > b->rank ? out->rank : b->rank;
  kiln_type_t res = *out;
  res.rank = r;
  for (int i = 0; i < r; ++i) {
    int ia = i - (r - out->rank), ib = i - (r - b->rank);
    int64_t da = ia >= 0 ? out->dims[ia] : 1;
    int64_t db = ib >= 0 ? b->dims[ib] : 1;
    int64_t d;
    if (da == db) d = da;
    else if (da == 1) d = db;
    else if (db == 1) d = da;
    else {
      char t1[160], t2[160], o[200];
      return verr(c, "%s does not broadcast with %s: dim %d is %s vs %s",
                  opnd_str(c, bi, o, sizeof(o)),
                  kiln_type_str(c->g, out, t1, sizeof(t1)), i,
                  KILN_IS_SYM(db) ? "symbolic" : (snprintf(t2, 40, "%lld",
                                                           (long long)db), t2),
                  KILN_IS_SYM(da) ? "symbolic" : (snprintf(t1, 40, "%lld",
                                                           (long long)da), t1));
    }
    res.dims[i] = d;
  }
  *out = res;
  return NULL;
}

// Shape of the broadcast of every tensor operand.
static kiln_status_t broadcast_all(const vctx_t *c, kiln_type_t *out) {
  memset(out, 0, sizeof(*out));
  bool any = false;
  for (int i = 0; i < c->node->operand_count; ++i) {
    const kiln_operand_t *o = &c->node->operands[i];
    if (o->kind != KILN_OPERAND_VALUE) continue;
    const kiln_type_t *t = &c->g->values[o->value].type;
    if (!any) {
      *out = *t;
      any = true;
      continue;
    }
    KILN_RETURN_IF_ERROR_PLAIN(broadcast(c, out, t, i));
  }
  if (!any) return verr(c, "expected at least one tensor operand");
  return NULL;
}

static kiln_status_t infer_elementwise(const vctx_t *c, kiln_type_t *res) {
  const kiln_node_t *n = c->node;
  kiln_op_class_t cls = kiln_op_class(n->op);
  int arity = cls == KILN_CLASS_WHERE ? 3
              : (cls == KILN_CLASS_BINARY || cls == KILN_CLASS_BINARY_FLOAT ||
                 cls == KILN_CLASS_COMPARE || cls == KILN_CLASS_LOGICAL)
                  ? 2
                  : 1;
  KILN_RETURN_IF_ERROR_PLAIN(need_operands(c, arity, arity));
  for (int i = 0; i < arity; ++i)
    if (n->operands[i].kind == KILN_OPERAND_NONE)
      return verr(c, "operand %d: expected a tensor or scalar, got none", i);
  KILN_RETURN_IF_ERROR_PLAIN(broadcast_all(c, res));
  char o[200];
  switch (cls) {
    case KILN_CLASS_UNARY:
      if (res->dtype == KILN_BOOL && n->op != KILN_OP_CLONE)
        return verr(c, "%s: expected a numeric dtype, got bool",
                    opnd_str(c, 0, o, sizeof(o)));
      break;
    case KILN_CLASS_UNARY_FLOAT:
      if (!kiln_dtype_is_float(res->dtype)) res->dtype = KILN_F32;
      if (n->op == KILN_OP_GELU) {
        const char *ap = kiln_node_attr_str(n, "approximate", "none");
        if (strcmp(ap, "none") != 0 && strcmp(ap, "tanh") != 0)
          return verr(c, "attribute 'approximate' is '%s'; expected 'none' "
                         "or 'tanh'", ap);
      }
      break;
    case KILN_CLASS_UNARY_BOOL:
      res->dtype = KILN_BOOL;
      break;
    case KILN_CLASS_CONVERT: {
      const kiln_attr_t *a = kiln_node_attr(n, "dtype");
      if (!a || a->kind != KILN_ATTR_DTYPE)
        return verr(c, "expected attribute 'dtype' (f32, f16, bf16, f64, "
                       "i32, i64, bool)");
      res->dtype = (kiln_dtype_t)a->i;
      break;
    }
    case KILN_CLASS_BINARY:
    case KILN_CLASS_BINARY_FLOAT:
      res->dtype = kiln_result_type(c->g, n->operands, 2);
      if (n->op == KILN_OP_SUB && res->dtype == KILN_BOOL)
        return verr(c, "subtraction of bool tensors; expected numeric "
                       "operands (use logical_xor)");
      if (n->op == KILN_OP_DIV) {
        const char *mode = kiln_node_attr_str(n, "rounding_mode", NULL);
        if (mode && strcmp(mode, "trunc") != 0 && strcmp(mode, "floor") != 0)
          return verr(c, "attribute 'rounding_mode' is '%s'; expected "
                         "'trunc' or 'floor'", mode);
        if (!mode && !kiln_dtype_is_float(res->dtype)) res->dtype = KILN_F32;
      }
      if (n->op == KILN_OP_POW && res->dtype == KILN_BOOL)
        return verr(c, "pow of bool tensors; expected numeric operands");
      break;
    case KILN_CLASS_COMPARE:
    case KILN_CLASS_LOGICAL:
      res->dtype = KILN_BOOL;
      break;
    case KILN_CLASS_WHERE: {
      const kiln_type_t *cond = NULL;
      KILN_RETURN_IF_ERROR_PLAIN(need_tensor(c, 0, &cond));
      if (cond->dtype != KILN_BOOL)
        return verr(c, "%s: expected a bool condition",
                    opnd_str(c, 0, o, sizeof(o)));
      res->dtype = kiln_result_type(c->g, n->operands + 1, 2);
      break;
    }
    default:
      break;
  }
  return NULL;
}

static kiln_status_t infer_reduce(const vctx_t *c, kiln_type_t *res) {
  const kiln_node_t *n = c->node;
  const kiln_type_t *x = NULL;
  KILN_RETURN_IF_ERROR_PLAIN(need_operands(c, 1, 1));
  KILN_RETURN_IF_ERROR_PLAIN(need_tensor(c, 0, &x));
  const kiln_attr_t *dims;
  KILN_RETURN_IF_ERROR_PLAIN(need_int_list(c, "dims", false, &dims));
  bool keep = kiln_node_attr_int(n, "keepdim", 0) != 0;
  bool reduced[KILN_MAX_RANK] = {0};
  if (!dims || dims->count == 0) {
    for (int i = 0; i < x->rank; ++i) reduced[i] = true;
  } else {
    for (int k = 0; k < dims->count; ++k) {
      int32_t d;
      char t[160];
      if (!kiln_normalize_dim(dims->ints[k], x->rank, &d))
        return verr(c, "dim %lld is out of range for %s",
                    (long long)dims->ints[k],
                    kiln_type_str(c->g, x, t, sizeof(t)));
      if (x->rank && reduced[d])
        return verr(c, "dim %lld appears twice in 'dims'",
                    (long long)dims->ints[k]);
      if (x->rank) reduced[d] = true;
    }
  }
  memset(res, 0, sizeof(*res));
  for (int i = 0; i < x->rank; ++i) {
    if (!reduced[i]) res->dims[res->rank++] = x->dims[i];
    else if (keep) res->dims[res->rank++] = 1;
  }
  kiln_dtype_t dt = x->dtype;
  const kiln_attr_t *dta = kiln_node_attr(n, "dtype");
  if (dta && dta->kind != KILN_ATTR_DTYPE)
    return verr(c, "attribute 'dtype': expected a dtype name");
  switch (n->op) {
    case KILN_OP_SUM:
    case KILN_OP_PROD:
      if (!kiln_dtype_is_float(dt)) dt = KILN_I64;
      break;
    case KILN_OP_MEAN:
    case KILN_OP_VAR:
      if (!dta && !kiln_dtype_is_float(dt)) {
        char o[200];
        return verr(c, "%s: expected a floating-point input (or a 'dtype' "
                       "attribute)", opnd_str(c, 0, o, sizeof(o)));
      }
      break;
    default:
      break;
  }
  if (dta) dt = (kiln_dtype_t)dta->i;
  res->dtype = dt;
  return NULL;
}

static bool dims_equal(int64_t a, int64_t b) { return a == b; }

static kiln_status_t infer_matmul(const vctx_t *c, kiln_type_t *res) {
  const kiln_node_t *n = c->node;
  const kiln_type_t *a = NULL, *b = NULL, *bias = NULL;
  int base = 0;
  char o1[200], o2[200];
  if (n->op == KILN_OP_ADDMM) {
    KILN_RETURN_IF_ERROR_PLAIN(need_operands(c, 3, 3));
    KILN_RETURN_IF_ERROR_PLAIN(need_tensor(c, 0, &bias));
    base = 1;
  } else {
    KILN_RETURN_IF_ERROR_PLAIN(need_operands(c, 2, 2));
  }
  KILN_RETURN_IF_ERROR_PLAIN(need_tensor(c, base, &a));
  KILN_RETURN_IF_ERROR_PLAIN(need_tensor(c, base + 1, &b));
  int rank = n->op == KILN_OP_BMM ? 3 : 2;
  if (a->rank != rank || b->rank != rank)
    return verr(c, "%s and %s: expected rank-%d operands",
                opnd_str(c, base, o1, sizeof(o1)),
                opnd_str(c, base + 1, o2, sizeof(o2)), rank);
  if (a->dtype != b->dtype || (bias && bias->dtype != a->dtype))
    return verr(c, "%s and %s: expected one dtype for all operands",
                opnd_str(c, base, o1, sizeof(o1)),
                opnd_str(c, base + 1, o2, sizeof(o2)));
  if (a->dtype == KILN_BOOL)
    return verr(c, "expected numeric operands, got bool");
  if (!dims_equal(a->dims[rank - 1], b->dims[rank - 2]))
    return verr(c, "%s and %s: inner dims differ",
                opnd_str(c, base, o1, sizeof(o1)),
                opnd_str(c, base + 1, o2, sizeof(o2)));
  if (rank == 3 && !dims_equal(a->dims[0], b->dims[0]))
    return verr(c, "%s and %s: batch dims differ",
                opnd_str(c, base, o1, sizeof(o1)),
                opnd_str(c, base + 1, o2, sizeof(o2)));
  *res = *a;
  res->dims[rank - 1] = b->dims[rank - 1];
  if (bias) {
    kiln_type_t bt = *res;
    KILN_RETURN_IF_ERROR_PLAIN(broadcast(c, &bt, bias, 0));
    if (!kiln_type_equal(&bt, res))
      return verr(c, "%s: expected a bias broadcastable to the product",
                  opnd_str(c, 0, o1, sizeof(o1)));
  }
  return NULL;
}

static kiln_status_t pair_attr(const vctx_t *c, const char *name, int64_t dflt,
                               int64_t out[2]) {
  const kiln_attr_t *a;
  KILN_RETURN_IF_ERROR_PLAIN(need_int_list(c, name, false, &a));
  out[0] = out[1] = dflt;
  if (!a) return NULL;
  if (a->count == 1) {
    out[0] = out[1] = a->ints[0];
  } else if (a->count == 2) {
    out[0] = a->ints[0];
    out[1] = a->ints[1];
  } else {
    return verr(c, "attribute '%s': expected 1 or 2 integers, got %d", name,
                a->count);
  }
  return NULL;
}

static kiln_status_t infer_conv(const vctx_t *c, kiln_type_t *res) {
  const kiln_node_t *n = c->node;
  const kiln_type_t *x = NULL, *w = NULL, *bias = NULL;
  char o1[200], o2[200];
  KILN_RETURN_IF_ERROR_PLAIN(need_operands(c, 2, 3));
  KILN_RETURN_IF_ERROR_PLAIN(need_tensor(c, 0, &x));
  KILN_RETURN_IF_ERROR_PLAIN(need_tensor(c, 1, &w));
  KILN_RETURN_IF_ERROR_PLAIN(opt_tensor(c, 2, &bias));
  if (kiln_node_attr_int(n, "transposed", 0))
    return kiln_make_status(KILN_STATUS_UNSUPPORTED,
                            "%s:%d:%d: aten.convolution: transposed "
                            "convolution is not supported; expected "
                            "transposed = false",
                            c->filename, n->line, n->col);
  if (x->rank != 4 || w->rank != 4)
    return verr(c, "%s and %s: expected a 2-D convolution (NCHW input, "
                   "FCHW weight)",
                opnd_str(c, 0, o1, sizeof(o1)), opnd_str(c, 1, o2, sizeof(o2)));
  if (!kiln_dtype_is_float(x->dtype) || x->dtype != w->dtype ||
      (bias && bias->dtype != x->dtype))
    return verr(c, "%s and %s: expected one floating-point dtype",
                opnd_str(c, 0, o1, sizeof(o1)), opnd_str(c, 1, o2, sizeof(o2)));
  int64_t stride[2], pad[2], dil[2];
  KILN_RETURN_IF_ERROR_PLAIN(pair_attr(c, "stride", 1, stride));
  KILN_RETURN_IF_ERROR_PLAIN(pair_attr(c, "padding", 0, pad));
  KILN_RETURN_IF_ERROR_PLAIN(pair_attr(c, "dilation", 1, dil));
  int64_t groups = kiln_node_attr_int(n, "groups", 1);
  if (!kiln_type_is_static(x) || !kiln_type_is_static(w))
    return kiln_make_status(KILN_STATUS_UNSUPPORTED,
                            "%s:%d:%d: aten.convolution: symbolic sizes are "
                            "not supported; expected static shapes",
                            c->filename, n->line, n->col);
  for (int i = 0; i < 2; ++i)
    if (stride[i] < 1 || dil[i] < 1 || pad[i] < 0)
      return verr(c, "expected stride >= 1, dilation >= 1, padding >= 0");
  if (groups < 1 || x->dims[1] % groups || w->dims[0] % groups ||
      w->dims[1] * groups != x->dims[1])
    return verr(c, "%s and %s with groups = %lld: expected input channels = "
                   "weight dim 1 * groups and weight dim 0 divisible by groups",
                opnd_str(c, 0, o1, sizeof(o1)), opnd_str(c, 1, o2, sizeof(o2)),
                (long long)groups);
  if (bias && (bias->rank != 1 || bias->dims[0] != w->dims[0]))
    return verr(c, "%s: expected a bias of shape [%lld]",
                opnd_str(c, 2, o1, sizeof(o1)), (long long)w->dims[0]);
  memset(res, 0, sizeof(*res));
  res->dtype = x->dtype;
  res->rank = 4;
  res->dims[0] = x->dims[0];
  res->dims[1] = w->dims[0];
  for (int i = 0; i < 2; ++i) {
    int64_t span = dil[i] * (w->dims[2 + i] - 1) + 1;
    int64_t in = x->dims[2 + i] + 2 * pad[i];
    if (in < span)
      return verr(c, "%s and %s: the padded input (%lld) is smaller than the "
                     "dilated kernel (%lld) in spatial dim %d",
                  opnd_str(c, 0, o1, sizeof(o1)),
                  opnd_str(c, 1, o2, sizeof(o2)), (long long)in,
                  (long long)span, i);
    res->dims[2 + i] = (in - span) / stride[i] + 1;
  }
  return NULL;
}

// Resolves a target shape with at most one -1 against `x`'s elements.
// Symbolic sizes compare as monomials: [s0, 128, 256] views as
// [128*s0, 256], and a -1 next to 256 is 128*s0.
static kiln_status_t view_shape(const vctx_t *c, const kiln_type_t *x,
                                const kiln_attr_t *shape, kiln_type_t *res) {
  char t[160], t2[160], t3[160];
  if (shape->count > KILN_MAX_RANK)
    return verr(c, "expected at most %d dims in 'shape'", KILN_MAX_RANK);
  kiln_monomial_t numel, known = {.coef = 1};
  if (!kiln_type_monomial(c->g, x, &numel))
    return verr(c, "the size of %s overflows", kiln_type_str(c->g, x, t, sizeof(t)));
  int infer = -1;
  memset(res, 0, sizeof(*res));
  res->dtype = x->dtype;
  res->rank = shape->count;
  for (int i = 0; i < shape->count; ++i) {
    int64_t d = shape->ints[i];
    if (shape_entry_is_sym(shape, i)) {
      if (!kiln_monomial_mul_dim(c->g, &known, d))
        return verr(c, "'shape' overflows");
    } else if (d == -1) {
      if (infer >= 0) return verr(c, "'shape' has more than one -1");
      infer = i;
      d = 0;
    } else if (d < 0) {
      return verr(c, "'shape' has a negative size %lld", (long long)d);
    } else if (!kiln_monomial_mul_dim(c->g, &known, d)) {
      return verr(c, "'shape' overflows");
    }
    res->dims[i] = d;
  }
  if (infer >= 0) {
    kiln_monomial_t rest;
    if (!kiln_monomial_div(&numel, &known, &rest))
      return verr(c, "cannot view %s as a shape with -1: %s elements do not "
                     "divide into %s",
                  kiln_type_str(c->g, x, t, sizeof(t)),
                  kiln_monomial_str(c->g, &numel, t2, sizeof(t2)),
                  kiln_monomial_str(c->g, &known, t3, sizeof(t3)));
    if (rest.count > KILN_MAX_SYM_FACTORS)
      return kiln_make_status(KILN_STATUS_UNSUPPORTED,
                              "%s:%d:%d: %s: the -1 of 'shape' is a product of "
                              "%d symbols (%s); at most %d",
                              c->filename, c->node->line, c->node->col,
                              kiln_op_name(c->node->op), (int)rest.count,
                              kiln_monomial_str(c->g, &rest, t3, sizeof(t3)),
                              KILN_MAX_SYM_FACTORS);
    KILN_RETURN_IF_ERROR_PLAIN(kiln_graph_product_dim(
        c->g, rest.coef, rest.factors, rest.count, &res->dims[infer]));
  } else if (!kiln_monomial_equal(&known, &numel)) {
    return verr(c, "cannot view %s as %s: the element counts differ",
                kiln_type_str(c->g, x, t, sizeof(t)),
                kiln_type_str(c->g, res, t2, sizeof(t2)));
  }
  return NULL;
}

// Records that every call needs `small` <= `large` (graph.h).
static kiln_status_t add_bound(const vctx_t *c, int64_t small, int64_t large) {
  kiln_graph_t *g = c->g;
  if (small == large) return NULL;
  if (g->bound_count == g->bound_capacity) {
    int32_t cap = g->bound_capacity ? 2 * g->bound_capacity : 8;
    kiln_size_bound_t *b = realloc(g->bounds, sizeof(*b) * (size_t)cap);
    if (!b) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "size bounds");
    g->bounds = b;
    g->bound_capacity = cap;
  }
  g->bounds[g->bound_count++] =
      (kiln_size_bound_t){small, large, (int32_t)(c->node - g->nodes)};
  return NULL;
}

// A slice whose dim or end is a symbolic size (a sequence length under
// torch.compile's dynamic shapes). kiln's sizes are products, so the
// length must be one: the whole dim (start 0, end past it or the dim's own
// size), a symbolic end from 0 (`mask[:, :T]` of a static buffer), or a
// static run [start, end) of a symbolic dim. The last two hold only while
// the end is within the dim, which becomes a size bound checked at each
// call. A start past 0 with an end at the dim's end (`x[:, 1:]`, s0 - 1),
// negative positions (from the end) and steps are sums of sizes:
// UNSUPPORTED, so the caller can leave the slice to PyTorch.
static kiln_status_t infer_symbolic_slice(const vctx_t *c, const kiln_type_t *x, int32_t d,
                                          int64_t size, int64_t end, bool sym_end,
                                          int64_t step, kiln_type_t *res) {
  const kiln_node_t *n = c->node;
  int64_t start = kiln_node_attr_int(n, "start", 0);
  char sz[64];
  kiln_monomial_t m;
  kiln_dim_monomial(c->g, size, &m);
  kiln_monomial_str(c->g, &m, sz, sizeof(sz));
  const char *why = NULL;
  if (step != 1) why = "a step other than 1";
  else if (start < 0) why = "a start counted from the end";
  else if (!sym_end && end < 0) why = "an end counted from the end";
  if (why)
    return kiln_make_status(KILN_STATUS_UNSUPPORTED,
                            "%s:%d:%d: aten.slice: %s along dim %d of size %s; "
                            "expected step 1 and positions from the start",
                            c->filename, n->line, n->col, why, (int)d, sz);
  if ((sym_end && end == size) || (!sym_end && end == INT64_MAX)) {
    // To the dim's end: the whole dim, or (start > 0) size - start.
    if (start != 0)
      return kiln_make_status(KILN_STATUS_UNSUPPORTED,
                              "%s:%d:%d: aten.slice: from %lld to the end of dim %d of "
                              "size %s (a size %s - %lld); expected a product of sizes",
                              c->filename, n->line, n->col, (long long)start, (int)d,
                              sz, sz, (long long)start);
    *res = *x;
    return NULL;
  }
  if (sym_end && start != 0)
    return kiln_make_status(KILN_STATUS_UNSUPPORTED,
                            "%s:%d:%d: aten.slice: from %lld to the symbolic end %s "
                            "(a difference of sizes); expected start 0",
                            c->filename, n->line, n->col, (long long)start,
                            c->g->symbols[KILN_SYM_ID(end)]);
  if (!sym_end && end < start) end = start;
  KILN_RETURN_IF_ERROR_PLAIN(add_bound(c, end, size));
  *res = *x;
  res->dims[d] = sym_end ? end : end - start;
  return NULL;
}

static kiln_status_t infer_shape(const vctx_t *c, kiln_type_t *res) {
  const kiln_node_t *n = c->node;
  const kiln_type_t *x = NULL;
  const kiln_attr_t *a;
  char t[160];
  if (n->op == KILN_OP_CAT) {
    const kiln_attr_t *da = kiln_node_attr(n, "dim");
    int64_t dim = da ? da->i : 0;
    if (n->operand_count < 1) return verr(c, "expected at least 1 operand");
    KILN_RETURN_IF_ERROR_PLAIN(need_tensor(c, 0, &x));
    int32_t d;
    if (!kiln_normalize_dim(dim, x->rank, &d) || x->rank == 0)
      return verr(c, "dim %lld is out of range for %s", (long long)dim,
                  kiln_type_str(c->g, x, t, sizeof(t)));
    *res = *x;
    for (int i = 1; i < n->operand_count; ++i) {
      const kiln_type_t *y = NULL;
      KILN_RETURN_IF_ERROR_PLAIN(need_tensor(c, i, &y));
      char o[200];
      if (y->rank != x->rank)
        return verr(c, "%s: expected rank %d like operand 0",
                    opnd_str(c, i, o, sizeof(o)), x->rank);
      for (int k = 0; k < x->rank; ++k)
        if (k != d && y->dims[k] != x->dims[k])
          return verr(c, "%s: dim %d differs from operand 0 (%s)",
                      opnd_str(c, i, o, sizeof(o)), k,
                      kiln_type_str(c->g, x, t, sizeof(t)));
      if (KILN_IS_SYM(y->dims[d]) || KILN_IS_SYM(res->dims[d]))
        return kiln_make_status(KILN_STATUS_UNSUPPORTED,
                                "%s:%d:%d: aten.cat: symbolic size along the "
                                "cat dim; expected static sizes",
                                c->filename, n->line, n->col);
      res->dims[d] += y->dims[d];
      res->dtype = kiln_dtype_promote(res->dtype, y->dtype);
    }
    return NULL;
  }
  KILN_RETURN_IF_ERROR_PLAIN(need_operands(c, 1, 1));
  KILN_RETURN_IF_ERROR_PLAIN(need_tensor(c, 0, &x));
  *res = *x;
  switch (n->op) {
    case KILN_OP_PERMUTE: {
      KILN_RETURN_IF_ERROR_PLAIN(need_int_list(c, "dims", true, &a));
      bool seen[KILN_MAX_RANK] = {0};
      if (a->count != x->rank)
        return verr(c, "'dims' has %d entries for %s; expected %d", a->count,
                    kiln_type_str(c->g, x, t, sizeof(t)), x->rank);
      for (int i = 0; i < a->count; ++i) {
        int32_t d;
        if (!kiln_normalize_dim(a->ints[i], x->rank, &d) || seen[d])
          return verr(c, "'dims' is not a permutation of 0..%d", x->rank - 1);
        seen[d] = true;
        res->dims[i] = x->dims[d];
      }
      return NULL;
    }
    case KILN_OP_TRANSPOSE: {
      int32_t d0, d1;
      if (!kiln_normalize_dim(kiln_node_attr_int(n, "dim0", 0), x->rank, &d0) ||
          !kiln_normalize_dim(kiln_node_attr_int(n, "dim1", 1), x->rank, &d1))
        return verr(c, "'dim0'/'dim1' out of range for %s",
                    kiln_type_str(c->g, x, t, sizeof(t)));
      if (x->rank) {
        res->dims[d0] = x->dims[d1];
        res->dims[d1] = x->dims[d0];
      }
      return NULL;
    }
    case KILN_OP_VIEW:
    case KILN_OP_RESHAPE:
      KILN_RETURN_IF_ERROR_PLAIN(need_shape_list(c, &a));
      return view_shape(c, x, a, res);
    case KILN_OP_EXPAND: {
      KILN_RETURN_IF_ERROR_PLAIN(need_shape_list(c, &a));
      if (a->count < x->rank || a->count > KILN_MAX_RANK)
        return verr(c, "'shape' has %d dims; expected %d to %d for %s",
                    a->count, x->rank, KILN_MAX_RANK,
                    kiln_type_str(c->g, x, t, sizeof(t)));
      res->rank = a->count;
      int off = a->count - x->rank;
      for (int i = 0; i < a->count; ++i) {
        int64_t want = a->ints[i];
        int64_t have = i >= off ? x->dims[i - off] : 1;
        if (shape_entry_is_sym(a, i)) {
          if (have != want && have != 1)
            return verr(c, "cannot expand %s to 'shape': dim %d is not 1 or "
                           "%s", kiln_type_str(c->g, x, t, sizeof(t)), i,
                        c->g->symbols[KILN_SYM_ID(want)]);
          res->dims[i] = want;
        } else if (want == -1) {
          if (i < off) return verr(c, "-1 in a new leading dim of 'shape'");
          res->dims[i] = have;
        } else if (have == want || have == 1) {
          if (want < 0) return verr(c, "negative size in 'shape'");
          res->dims[i] = want;
        } else {
          return verr(c, "cannot expand %s to 'shape': dim %d is %lld, "
                         "expected 1 or %lld",
                      kiln_type_str(c->g, x, t, sizeof(t)), i,
                      (long long)have, (long long)want);
        }
      }
      return NULL;
    }
    case KILN_OP_SQUEEZE: {
      KILN_RETURN_IF_ERROR_PLAIN(need_int_list(c, "dims", false, &a));
      bool drop[KILN_MAX_RANK] = {0};
      if (!a) {
        for (int i = 0; i < x->rank; ++i) drop[i] = x->dims[i] == 1;
      } else {
        for (int k = 0; k < a->count; ++k) {
          int32_t d;
          if (!kiln_normalize_dim(a->ints[k], x->rank, &d))
            return verr(c, "dim %lld out of range for %s",
                        (long long)a->ints[k],
                        kiln_type_str(c->g, x, t, sizeof(t)));
          if (x->rank) drop[d] = x->dims[d] == 1;
        }
      }
      res->rank = 0;
      for (int i = 0; i < x->rank; ++i)
        if (!drop[i]) res->dims[res->rank++] = x->dims[i];
      return NULL;
    }
    case KILN_OP_UNSQUEEZE: {
      int64_t dim = kiln_node_attr_int(n, "dim", 0);
      int32_t d;
      if (x->rank == KILN_MAX_RANK ||
          !kiln_normalize_dim(dim, x->rank + 1, &d))
        return verr(c, "dim %lld out of range for %s", (long long)dim,
                    kiln_type_str(c->g, x, t, sizeof(t)));
      res->rank = x->rank + 1;
      for (int i = 0, j = 0; i < res->rank; ++i)
        res->dims[i] = i == d ? 1 : x->dims[j++];
      return NULL;
    }
    case KILN_OP_SLICE: {
      int32_t d;
      int64_t dim = kiln_node_attr_int(n, "dim", 0);
      if (x->rank == 0 || !kiln_normalize_dim(dim, x->rank, &d))
        return verr(c, "dim %lld out of range for %s", (long long)dim,
                    kiln_type_str(c->g, x, t, sizeof(t)));
      int64_t size = x->dims[d];
      int64_t end = kiln_node_attr_int(n, "end", INT64_MAX);
      int64_t step = kiln_node_attr_int(n, "step", 1);
      if (step < 1) return verr(c, "'step' is %lld; expected >= 1",
                                (long long)step);
      const kiln_attr_t *ea = kiln_node_attr(n, "end");
      bool sym_end = ea && ea->sym && ea->sym[0];
      if (KILN_IS_SYM(size) || sym_end)
        return infer_symbolic_slice(c, x, d, size, end, sym_end, step, res);
      int64_t start = kiln_node_slice_start(n, size);
      if (end < 0) end += size;
      end = end < start ? start : end > size ? size : end;
      res->dims[d] = (end - start + step - 1) / step;
      return NULL;
    }
    default:
      return verr(c, "internal: no shape rule");
  }
}

static kiln_status_t infer_create(const vctx_t *c, kiln_type_t *res,
                                  bool annotated) {
  const kiln_node_t *n = c->node;
  KILN_RETURN_IF_ERROR_PLAIN(need_operands(c, 0, 0));
  const kiln_attr_t *v = kiln_node_attr(n, "value");
  if (n->op == KILN_OP_ARANGE) {
    // start, start + step, .. : 'shape' one size (symbolic too: positions
    // under a dynamic sequence length), integer start and step.
    const kiln_attr_t *shape = NULL;
    KILN_RETURN_IF_ERROR_PLAIN(need_shape_list(c, &shape));
    if (shape->count != 1 || (shape->ints[0] < 0 && !shape_entry_is_sym(shape, 0)))
      return verr(c, "'shape' must be one size");
    const kiln_attr_t *st = kiln_node_attr(n, "start"), *sp = kiln_node_attr(n, "step");
    if ((st && st->kind != KILN_ATTR_INT) || (sp && sp->kind != KILN_ATTR_INT))
      return verr(c, "'start' and 'step' must be integers");
    const kiln_attr_t *dt = kiln_node_attr(n, "dtype");
    if (dt && dt->kind != KILN_ATTR_DTYPE)
      return verr(c, "attribute 'dtype': expected a dtype name");
    memset(res, 0, sizeof(*res));
    res->rank = 1;
    res->dims[0] = shape->ints[0];
    res->dtype = dt ? (kiln_dtype_t)dt->i : KILN_I64;
    if (res->dtype == KILN_BOOL) return verr(c, "a bool arange; expected a number dtype");
    return NULL;
  }
  if (n->op == KILN_OP_CONSTANT) {
    if (!annotated)
      return verr(c, "expected a result type annotation (': f32[2,3]')");
    if (!kiln_type_is_static(res))
      return verr(c, "expected a static result type");
    if (!v || (v->kind != KILN_ATTR_LIST && v->kind != KILN_ATTR_INT &&
               v->kind != KILN_ATTR_FLOAT && v->kind != KILN_ATTR_BOOL))
      return verr(c, "expected attribute 'value' (a number or a list)");
    int64_t numel = kiln_type_numel(res);
    if (v->kind == KILN_ATTR_LIST && v->count != numel && v->count != 1)
      return verr(c, "'value' has %d elements; expected %lld (or 1)",
                  v->count, (long long)numel);
    return NULL;
  }
  // aten.full (its sizes may be symbolic: a gradient's ones under a
  // dynamic batch)
  const kiln_attr_t *shape = NULL;
  if (kiln_node_attr(n, "shape"))
    KILN_RETURN_IF_ERROR_PLAIN(need_shape_list(c, &shape));
  if (!v || (v->kind != KILN_ATTR_INT && v->kind != KILN_ATTR_FLOAT &&
             v->kind != KILN_ATTR_BOOL))
    return verr(c, "expected attribute 'value' (a number)");
  memset(res, 0, sizeof(*res));
  if (shape) {
    if (shape->count > KILN_MAX_RANK)
      return verr(c, "expected at most %d dims", KILN_MAX_RANK);
    res->rank = shape->count;
    for (int i = 0; i < shape->count; ++i) {
      if (shape->ints[i] < 0 && !shape_entry_is_sym(shape, i))
        return verr(c, "negative size in 'shape'");
      res->dims[i] = shape->ints[i];
    }
  }
  const kiln_attr_t *dt = kiln_node_attr(n, "dtype");
  if (dt && dt->kind != KILN_ATTR_DTYPE)
    return verr(c, "attribute 'dtype': expected a dtype name");
  res->dtype = dt ? (kiln_dtype_t)dt->i
               : v->kind == KILN_ATTR_FLOAT ? KILN_F32
               : v->kind == KILN_ATTR_INT   ? KILN_I64
                                            : KILN_BOOL;
  return NULL;
}

static kiln_status_t infer_nn(const vctx_t *c, kiln_type_t *res) {
  const kiln_node_t *n = c->node;
  const kiln_type_t *x = NULL;
  char t[160], o[200];
  switch (n->op) {
    case KILN_OP_SOFTMAX:
    case KILN_OP_LOG_SOFTMAX: {
      KILN_RETURN_IF_ERROR_PLAIN(need_operands(c, 1, 1));
      KILN_RETURN_IF_ERROR_PLAIN(need_tensor(c, 0, &x));
      int32_t d;
      if (!kiln_normalize_dim(kiln_node_attr_int(n, "dim", -1), x->rank, &d))
        return verr(c, "'dim' out of range for %s",
                    kiln_type_str(c->g, x, t, sizeof(t)));
      if (!kiln_dtype_is_float(x->dtype))
        return verr(c, "%s: expected a floating-point input",
                    opnd_str(c, 0, o, sizeof(o)));
      *res = *x;
      if (kiln_node_attr_int(n, "half_to_float", 0)) res->dtype = KILN_F32;
      return NULL;
    }
    case KILN_OP_LAYER_NORM: {
      KILN_RETURN_IF_ERROR_PLAIN(need_operands(c, 1, 3));
      KILN_RETURN_IF_ERROR_PLAIN(need_tensor(c, 0, &x));
      if (n->result_count != 3)
        return verr(c, "expected 3 results (output, mean, rstd), got %d",
                    n->result_count);
      const kiln_attr_t *ns;
      KILN_RETURN_IF_ERROR_PLAIN(need_int_list(c, "normalized_shape", true,
                                               &ns));
      if (!kiln_dtype_is_float(x->dtype))
        return verr(c, "%s: expected a floating-point input",
                    opnd_str(c, 0, o, sizeof(o)));
      if (ns->count < 1 || ns->count > x->rank)
        return verr(c, "'normalized_shape' has %d dims; expected 1 to %d for "
                       "%s",
                    ns->count, x->rank, kiln_type_str(c->g, x, t, sizeof(t)));
      int lead = x->rank - ns->count;
      for (int i = 0; i < ns->count; ++i)
        if (x->dims[lead + i] != ns->ints[i])
          return verr(c, "'normalized_shape' does not match the trailing dims "
                         "of %s",
                      kiln_type_str(c->g, x, t, sizeof(t)));
      for (int k = 1; k < 3; ++k) {
        const kiln_type_t *p = NULL;
        KILN_RETURN_IF_ERROR_PLAIN(opt_tensor(c, k, &p));
        if (!p) continue;
        bool ok = p->rank == ns->count && p->dtype == x->dtype;
        for (int i = 0; ok && i < ns->count; ++i)
          ok = p->dims[i] == ns->ints[i];
        if (!ok)
          return verr(c, "%s: expected %s[normalized_shape]",
                      opnd_str(c, k, o, sizeof(o)),
                      kiln_dtype_name(x->dtype));
      }
      res[0] = *x;
      res[1] = *x;
      for (int i = lead; i < x->rank; ++i) res[1].dims[i] = 1;
      res[2] = res[1];
      return NULL;
    }
    case KILN_OP_LAYER_NORM_BACKWARD: {
      // (grad_out, x, mean, rstd, weight) -> (grad_x, grad_weight,
      // grad_bias): mean and rstd as the forward returned them (x's dims,
      // the normalized ones 1), the weight over normalized_shape.
      KILN_RETURN_IF_ERROR_PLAIN(need_operands(c, 5, 5));
      const kiln_type_t *in[5];
      for (int k = 0; k < 5; ++k) KILN_RETURN_IF_ERROR_PLAIN(need_tensor(c, k, &in[k]));
      x = in[1];
      const kiln_attr_t *ns;
      KILN_RETURN_IF_ERROR_PLAIN(need_int_list(c, "normalized_shape", true, &ns));
      if (!kiln_dtype_is_float(x->dtype))
        return verr(c, "%s: expected a floating-point input",
                    opnd_str(c, 1, o, sizeof(o)));
      if (ns->count < 1 || ns->count > x->rank)
        return verr(c, "'normalized_shape' has %d dims; expected 1 to %d for %s",
                    ns->count, x->rank, kiln_type_str(c->g, x, t, sizeof(t)));
      int lead = x->rank - ns->count;
      kiln_type_t stat = *x, wt = {0};
      wt.rank = ns->count;
      wt.dtype = x->dtype;
      for (int i = 0; i < ns->count; ++i) {
        if (x->dims[lead + i] != ns->ints[i])
          return verr(c, "'normalized_shape' does not match the trailing dims of %s",
                      kiln_type_str(c->g, x, t, sizeof(t)));
        stat.dims[lead + i] = 1;
        wt.dims[i] = ns->ints[i];
      }
      const kiln_type_t *want[5] = {x, x, &stat, &stat, &wt};
      const char *what[5] = {"x's type", "", "x's dims with the normalized ones 1",
                             "x's dims with the normalized ones 1",
                             "[normalized_shape] in x's dtype"};
      for (int k = 0; k < 5; ++k) {
        if (k == 1) continue;
        bool ok = in[k]->rank == want[k]->rank &&
                  (k == 2 || k == 3 ? kiln_dtype_is_float(in[k]->dtype)
                                    : in[k]->dtype == want[k]->dtype);
        for (int i = 0; ok && i < in[k]->rank; ++i) ok = in[k]->dims[i] == want[k]->dims[i];
        if (!ok)
          return verr(c, "%s: expected %s (%s)", opnd_str(c, k, o, sizeof(o)), what[k],
                      kiln_type_str(c->g, want[k], t, sizeof(t)));
      }
      res[0] = *x;
      res[1] = wt;
      res[2] = wt;
      return NULL;
    }
    case KILN_OP_EMBEDDING: {
      const kiln_type_t *w = NULL, *idx = NULL;
      KILN_RETURN_IF_ERROR_PLAIN(need_operands(c, 2, 2));
      KILN_RETURN_IF_ERROR_PLAIN(need_tensor(c, 0, &w));
      KILN_RETURN_IF_ERROR_PLAIN(need_tensor(c, 1, &idx));
      if (w->rank != 2)
        return verr(c, "%s: expected a rank-2 weight",
                    opnd_str(c, 0, o, sizeof(o)));
      if (!kiln_dtype_is_int(idx->dtype))
        return verr(c, "%s: expected i32 or i64 indices",
                    opnd_str(c, 1, o, sizeof(o)));
      if (idx->rank + 1 > KILN_MAX_RANK)
        return verr(c, "result rank exceeds %d", KILN_MAX_RANK);
      *res = *idx;
      res->dtype = w->dtype;
      res->dims[res->rank++] = w->dims[1];
      return NULL;
    }
    case KILN_OP_MAX_POOL2D: {
      // Max over kernel_size windows of an NCHW float input, at `stride`
      // (default: the kernel), implicitly padded by `padding` (-inf) on
      // each side, taps `dilation` apart; floor division (ceil_mode off).
      KILN_RETURN_IF_ERROR_PLAIN(need_operands(c, 1, 1));
      KILN_RETURN_IF_ERROR_PLAIN(need_tensor(c, 0, &x));
      if (x->rank != 4 || !kiln_dtype_is_float(x->dtype))
        return verr(c, "%s is %s; expected a float NCHW tensor (rank 4)",
                    opnd_str(c, 0, o, sizeof(o)), kiln_type_str(c->g, x, t, sizeof(t)));
      if (!kiln_type_is_static(x))
        return kiln_make_status(KILN_STATUS_UNSUPPORTED,
                                "%s:%d:%d: aten.max_pool2d: symbolic sizes are not "
                                "supported; expected static shapes",
                                c->filename, n->line, n->col);
      int64_t k[2], st[2], pd[2], dl[2];
      KILN_RETURN_IF_ERROR_PLAIN(pair_attr(c, "kernel_size", 0, k));
      KILN_RETURN_IF_ERROR_PLAIN(pair_attr(c, "stride", 0, st));
      KILN_RETURN_IF_ERROR_PLAIN(pair_attr(c, "padding", 0, pd));
      KILN_RETURN_IF_ERROR_PLAIN(pair_attr(c, "dilation", 1, dl));
      if (st[0] == 0 && st[1] == 0) st[0] = k[0], st[1] = k[1];
      *res = *x;
      for (int i = 0; i < 2; ++i) {
        if (k[i] < 1 || st[i] < 1 || dl[i] < 1 || pd[i] < 0 || 2 * pd[i] > k[i])
          return verr(c, "kernel_size %lldx%lld, stride %lldx%lld, padding %lldx%lld, "
                      "dilation %lldx%lld: expected positive kernel, stride and "
                      "dilation, and padding at most half the kernel",
                      (long long)k[0], (long long)k[1], (long long)st[0], (long long)st[1],
                      (long long)pd[0], (long long)pd[1], (long long)dl[0], (long long)dl[1]);
        int64_t span = x->dims[2 + i] + 2 * pd[i] - dl[i] * (k[i] - 1) - 1;
        if (span < 0)
          return verr(c, "a %lld-wide window (dilation %lld) does not fit %s padded by %lld",
                      (long long)k[i], (long long)dl[i], kiln_type_str(c->g, x, t, sizeof(t)),
                      (long long)pd[i]);
        res->dims[2 + i] = span / st[i] + 1;
      }
      return NULL;
    }
    case KILN_OP_INDEX: {
      // x[..., i0, i1, ..., ...]: index tensors for the consecutive dims
      // `dim` .. `dim` + k - 1 of x, broadcast together to B; the result is
      // x's dims before `dim`, then B, then x's dims after the indexed ones.
      KILN_RETURN_IF_ERROR_PLAIN(need_operands(c, 2, KILN_MAX_RANK + 1));
      KILN_RETURN_IF_ERROR_PLAIN(need_tensor(c, 0, &x));
      int k = n->operand_count - 1;
      int64_t dim = kiln_node_attr_int(n, "dim", 0);
      if (dim < 0 || dim + k > x->rank)
        return verr(c, "'dim' = %lld with %d index tensors does not fit %s",
                    (long long)dim, k, kiln_type_str(c->g, x, t, sizeof(t)));
      kiln_type_t b;
      memset(&b, 0, sizeof(b));
      for (int i = 1; i <= k; ++i) {
        const kiln_type_t *it = NULL;
        KILN_RETURN_IF_ERROR_PLAIN(need_tensor(c, i, &it));
        if (!kiln_dtype_is_int(it->dtype))
          return verr(c, "%s: expected i32 or i64 indices", opnd_str(c, i, o, sizeof(o)));
        if (i == 1)
          b = *it;
        else
          KILN_RETURN_IF_ERROR_PLAIN(broadcast(c, &b, it, i));
      }
      int rank = x->rank - k + b.rank;
      if (rank > KILN_MAX_RANK) return verr(c, "result rank exceeds %d", KILN_MAX_RANK);
      kiln_type_t r = *x;
      r.rank = rank;
      for (int i = 0; i < b.rank; ++i) r.dims[dim + i] = b.dims[i];
      for (int i = (int)dim + k; i < x->rank; ++i) r.dims[i - k + b.rank] = x->dims[i];
      *res = r;
      return NULL;
    }
    case KILN_OP_INDEX_PUT: {
      // base[V, D], indices of shape S, values of shape S ++ [D]:
      // base with values[p] added to row indices[p] (the embedding gradient).
      const kiln_type_t *base = NULL, *idx = NULL, *val = NULL;
      KILN_RETURN_IF_ERROR_PLAIN(need_operands(c, 3, 3));
      KILN_RETURN_IF_ERROR_PLAIN(need_tensor(c, 0, &base));
      KILN_RETURN_IF_ERROR_PLAIN(need_tensor(c, 1, &idx));
      KILN_RETURN_IF_ERROR_PLAIN(need_tensor(c, 2, &val));
      if (kiln_node_attr_int(n, "accumulate", 0) == 0)
        return verr(c, "expected accumulate = true (assignment, where duplicate "
                       "indices race, is not supported)");
      if (base->rank != 2 || base->dtype != KILN_F32 || val->dtype != KILN_F32)
        return verr(c, "%s: expected an f32[V, D] base and f32 values",
                    opnd_str(c, 0, o, sizeof(o)));
      if (!kiln_dtype_is_int(idx->dtype))
        return verr(c, "%s: expected i32 or i64 indices", opnd_str(c, 1, o, sizeof(o)));
      bool same = val->rank == idx->rank + 1 && val->dims[idx->rank] == base->dims[1];
      for (int i = 0; same && i < idx->rank; ++i) same = val->dims[i] == idx->dims[i];
      if (!same)
        return verr(c, "%s: expected the indices' shape then D = %lld",
                    opnd_str(c, 2, o, sizeof(o)), (long long)base->dims[1]);
      *res = *base;
      return NULL;
    }
    default:
      return verr(c, "internal: no rule");
  }
}

// The attributes each op takes (docs/graph-format.md), space-separated.
static const char *known_attrs(kiln_op_id_t op) {
  switch (op) {
    case KILN_OP_GELU: return "approximate";
    case KILN_OP_CONVERT: return "dtype";
    case KILN_OP_ADD: case KILN_OP_SUB: return "alpha";
    case KILN_OP_DIV: return "rounding_mode";
    case KILN_OP_SUM: case KILN_OP_PROD: case KILN_OP_AMAX: case KILN_OP_AMIN:
    case KILN_OP_MEAN:
      return "dims keepdim dtype";
    case KILN_OP_VAR: return "dims keepdim dtype correction";
    case KILN_OP_ADDMM: return "beta alpha";
    // (transposed: accepted so that its own error explains it.)
    case KILN_OP_CONVOLUTION: return "stride padding dilation groups transposed";
    case KILN_OP_PERMUTE: case KILN_OP_SQUEEZE: return "dims";
    case KILN_OP_TRANSPOSE: return "dim0 dim1";
    case KILN_OP_VIEW: case KILN_OP_RESHAPE: case KILN_OP_EXPAND: return "shape";
    case KILN_OP_UNSQUEEZE: case KILN_OP_CAT: return "dim";
    case KILN_OP_SLICE: return "dim start end step";
    case KILN_OP_FULL: return "shape value dtype";
    case KILN_OP_CONSTANT: return "value";
    case KILN_OP_ARANGE: return "shape start step dtype";
    case KILN_OP_SOFTMAX: case KILN_OP_LOG_SOFTMAX: return "dim half_to_float";
    case KILN_OP_LAYER_NORM: return "normalized_shape eps";
    case KILN_OP_LAYER_NORM_BACKWARD: return "normalized_shape";
    case KILN_OP_INDEX_PUT: return "accumulate";
    case KILN_OP_INDEX: return "dim";
    case KILN_OP_MAX_POOL2D: return "kernel_size stride padding dilation";
    default: return "";
  }
}

// An attribute the op does not take is an error, not ignored: `dim` where
// a reduction takes `dims` would otherwise reduce over every dim.
static kiln_status_t check_attr_names(const vctx_t *c) {
  const char *known = known_attrs(c->node->op);
  for (int32_t k = 0; k < c->node->attr_count; ++k) {
    const char *name = c->node->attrs[k].name;
    size_t len = strlen(name);
    bool found = false;
    for (const char *p = known; *p && !found;) {
      size_t w = strcspn(p, " ");
      found = w == len && strncmp(p, name, len) == 0;
      p += w;
      p += strspn(p, " ");
    }
    if (!found)
      return *known ? verr(c, "unknown attribute '%s'; expected one of: %s", name, known)
                    : verr(c, "unknown attribute '%s'; the op takes no attributes", name);
  }
  return NULL;
}

kiln_status_t kiln_graph_verify(kiln_graph_t *g, const char *filename) {
  vctx_t c = {g, filename ? filename : "<graph>", NULL};
  g->bound_count = 0;
  for (int32_t i = 0; i < g->node_count; ++i) {
    kiln_node_t *n = &g->nodes[i];
    c.node = n;
    KILN_RETURN_IF_ERROR_PLAIN(check_attr_names(&c));
    kiln_type_t res[KILN_MAX_RESULTS];
    memset(res, 0, sizeof(res));
    int nres = 1;
    bool annotated = g->values[n->results[0]].type.rank >= 0;
    if (annotated) res[0] = g->values[n->results[0]].type;
    kiln_status_t s = NULL;
    switch (kiln_op_class(n->op)) {
      case KILN_CLASS_REDUCE: s = infer_reduce(&c, res); break;
      case KILN_CLASS_MATMUL: s = infer_matmul(&c, res); break;
      case KILN_CLASS_CONV: s = infer_conv(&c, res); break;
      case KILN_CLASS_SHAPE: s = infer_shape(&c, res); break;
      case KILN_CLASS_CREATE: s = infer_create(&c, res, annotated); break;
      case KILN_CLASS_NN:
        nres = n->op == KILN_OP_LAYER_NORM || n->op == KILN_OP_LAYER_NORM_BACKWARD ? 3 : 1;
        s = infer_nn(&c, res);
        break;
      default: s = infer_elementwise(&c, res); break;
    }
    if (s) return s;
    if (n->result_count != nres)
      return verr(&c, "expected %d result%s, got %d", nres,
                  nres == 1 ? "" : "s", n->result_count);
    for (int k = 0; k < nres; ++k) {
      kiln_value_t *v = &g->values[n->results[k]];
      if (v->type.rank >= 0 && !kiln_type_equal(&v->type, &res[k])) {
        char t1[160], t2[160];
        return verr(&c, "result %%%s is annotated %s but the op produces %s",
                    v->name, kiln_type_str(g, &v->type, t1, sizeof(t1)),
                    kiln_type_str(g, &res[k], t2, sizeof(t2)));
      }
      v->type = res[k];
    }
  }
  for (int32_t i = 0; i < g->mutation_count; ++i) {
    const kiln_mutation_t *m = &g->mutations[i];
    const kiln_value_t *x = &g->values[g->inputs[m->input]];
    const kiln_value_t *v = &g->values[m->value];
    if (!kiln_type_equal(&x->type, &v->type)) {
      char t1[160], t2[160];
      return kiln_make_status(
          KILN_STATUS_VERIFY_ERROR,
          "%s:%d:%d: return: %%%s -> %%%s stores a %s into input %%%s of type "
          "%s; expected the input's type",
          c.filename, m->line, m->col, v->name, x->name,
          kiln_type_str(g, &v->type, t1, sizeof(t1)), x->name,
          kiln_type_str(g, &x->type, t2, sizeof(t2)));
    }
  }
  return NULL;
}

const kiln_mutation_t *kiln_graph_input_mutation(const kiln_graph_t *g,
                                                 int32_t input) {
  for (int32_t i = 0; i < g->mutation_count; ++i)
    if (g->mutations[i].input == input) return &g->mutations[i];
  return NULL;
}

kiln_status_t kiln_graph_specialize(const kiln_graph_t *g,
                                    const int64_t *binding,
                                    kiln_graph_t **out_graph) {
  *out_graph = NULL;
  char *text = NULL;
  KILN_RETURN_IF_ERROR_PLAIN(kiln_graph_print_text(g, &text));
  kiln_graph_t *copy = NULL;
  kiln_status_t s = kiln_graph_parse_text(text, strlen(text), g->name, &copy);
  free(text);
  if (s) return s;
  // The copy interns its symbols in text order, which need not be `g`'s
  // (the verifier interns products it infers): match them by name. Each
  // symbol maps to its new dim: a bound base symbol to its size, a product
  // to its bound factors' value times the unbound ones (a product of its
  // own, interned in the copy, when some stay symbolic).
  int32_t nsym = copy->symbol_count;
  int64_t *b = malloc(sizeof(int64_t) * ((size_t)nsym + 1));
  int64_t *map = malloc(sizeof(int64_t) * ((size_t)nsym + 1));
  s = b && map ? NULL : kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "specializing");
  for (int32_t i = 0; !s && i < nsym; ++i) {
    b[i] = -1;
    for (int32_t j = 0; j < g->symbol_count; ++j)
      if (strcmp(copy->symbols[i], g->symbols[j]) == 0) b[i] = binding[j];
  }
  for (int32_t i = 0; !s && i < nsym; ++i) {
    kiln_symdef_t d = copy->symdefs[i];  // product_dim may move the table
    if (d.factor_count == 0) {
      map[i] = b[i] >= 0 ? b[i] : KILN_SYM(i);
      continue;
    }
    int64_t coef = d.coef;
    int32_t open[KILN_MAX_SYM_FACTORS], n = 0;
    for (int32_t k = 0; k < d.factor_count; ++k) {
      int64_t v = b[d.factors[k]];
      if (v < 0) open[n++] = d.factors[k];
      else if (__builtin_mul_overflow(coef, v, &coef))
        s = kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                             "size %s overflows for this call's sizes", copy->symbols[i]);
    }
    if (!s) s = kiln_graph_product_dim(copy, coef, open, n, &map[i]);
  }
  // Substitute (in input types and 'shape' lists), forget inferred types
  // and re-verify so that every shape rule sees the new sizes.
  for (int32_t v = 0; !s && v < copy->value_count; ++v) {
    kiln_type_t *t = &copy->values[v].type;
    if (copy->values[v].node >= 0) {
      t->rank = -1;
      continue;
    }
    for (int i = 0; i < t->rank; ++i)
      if (KILN_IS_SYM(t->dims[i])) t->dims[i] = map[KILN_SYM_ID(t->dims[i])];
  }
  for (int32_t i = 0; !s && i < copy->node_count; ++i) {
    for (int32_t k = 0; k < copy->nodes[i].attr_count; ++k) {
      kiln_attr_t *a = &copy->nodes[i].attrs[k];
      if (a->kind == KILN_ATTR_INT && a->sym && a->sym[0]) {
        // A size-valued scalar (a slice's end).
        a->i = map[KILN_SYM_ID(a->i)];
        a->f = (double)a->i;
        *(bool *)a->sym = KILN_IS_SYM(a->i);
        continue;
      }
      if (a->kind != KILN_ATTR_LIST || !a->sym) continue;
      // The copy's own arena memory.
      int64_t *ints = (int64_t *)a->ints;
      bool *sym = (bool *)a->sym;
      double *fl = (double *)a->floats;
      for (int32_t e = 0; e < a->count; ++e) {
        if (!sym[e]) continue;
        ints[e] = map[KILN_SYM_ID(ints[e])];
        sym[e] = KILN_IS_SYM(ints[e]);
        fl[e] = sym[e] ? -1 : (double)ints[e];
      }
    }
  }
  free(b);
  free(map);
  if (s) {
    kiln_graph_free(copy);
    return s;
  }
  // Constants must keep their annotated type.
  for (int32_t i = 0; i < copy->node_count; ++i) {
    kiln_node_t *n = &copy->nodes[i];
    if (n->op == KILN_OP_CONSTANT)
      copy->values[n->results[0]].type =
          g->values[g->nodes[i].results[0]].type;
  }
  s = kiln_graph_verify(copy, g->name);
  if (s) {
    kiln_graph_free(copy);
    return s;
  }
  *out_graph = copy;
  return NULL;
}
