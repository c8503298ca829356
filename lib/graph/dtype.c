// dtypes, types, the op table and small graph utilities.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph.h"

static const char *const kDtypeNames[KILN_DTYPE_COUNT] = {
    "f32", "f16", "bf16", "f64", "i32", "i64", "bool"};

const char *kiln_dtype_name(kiln_dtype_t t) {
  return (unsigned)t < KILN_DTYPE_COUNT ? kDtypeNames[t] : "?";
}

bool kiln_dtype_parse(const char *s, size_t n, kiln_dtype_t *out) {
  for (int i = 0; i < KILN_DTYPE_COUNT; ++i) {
    if (strlen(kDtypeNames[i]) == n && memcmp(kDtypeNames[i], s, n) == 0) {
      *out = (kiln_dtype_t)i;
      return true;
    }
  }
  return false;
}

size_t kiln_dtype_size(kiln_dtype_t t) {
  switch (t) {
    case KILN_F32: case KILN_I32: return 4;
    case KILN_F16: case KILN_BF16: return 2;
    case KILN_F64: case KILN_I64: return 8;
    case KILN_BOOL: return 1;
    default: return 0;
  }
}

bool kiln_dtype_is_float(kiln_dtype_t t) {
  return t == KILN_F32 || t == KILN_F16 || t == KILN_BF16 || t == KILN_F64;
}

bool kiln_dtype_is_int(kiln_dtype_t t) {
  return t == KILN_I32 || t == KILN_I64;
}

kiln_dtype_t kiln_dtype_promote(kiln_dtype_t a, kiln_dtype_t b) {
  if (a == b) return a;
  if (a == KILN_BOOL) return b;
  if (b == KILN_BOOL) return a;
  bool fa = kiln_dtype_is_float(a), fb = kiln_dtype_is_float(b);
  if (fa && !fb) return a;
  if (fb && !fa) return b;
  if (!fa) return (a == KILN_I64 || b == KILN_I64) ? KILN_I64 : KILN_I32;
  // Two distinct floats: f64 wins; f16 with bf16 gives f32 (as PyTorch).
  if (a == KILN_F64 || b == KILN_F64) return KILN_F64;
  if (a == KILN_F32 || b == KILN_F32) return KILN_F32;
  return KILN_F32;
}

bool kiln_dtype_from_dl(DLDataType dl, kiln_dtype_t *out) {
  if (dl.lanes != 1) return false;
  switch (dl.code) {
    case kDLFloat:
      if (dl.bits == 32) { *out = KILN_F32; return true; }
      if (dl.bits == 16) { *out = KILN_F16; return true; }
      if (dl.bits == 64) { *out = KILN_F64; return true; }
      return false;
    case kDLBfloat:
      if (dl.bits == 16) { *out = KILN_BF16; return true; }
      return false;
    case kDLInt:
      if (dl.bits == 32) { *out = KILN_I32; return true; }
      if (dl.bits == 64) { *out = KILN_I64; return true; }
      return false;
    case KILN_DL_BOOL:
      if (dl.bits == 8) { *out = KILN_BOOL; return true; }
      return false;
    default:
      return false;
  }
}

DLDataType kiln_dtype_to_dl(kiln_dtype_t t) {
  DLDataType d = {kDLFloat, 32, 1};
  switch (t) {
    case KILN_F32: break;
    case KILN_F16: d.bits = 16; break;
    case KILN_BF16: d.code = kDLBfloat; d.bits = 16; break;
    case KILN_F64: d.bits = 64; break;
    case KILN_I32: d.code = kDLInt; d.bits = 32; break;
    case KILN_I64: d.code = kDLInt; d.bits = 64; break;
    case KILN_BOOL: d.code = KILN_DL_BOOL; d.bits = 8; break;
    default: break;
  }
  return d;
}

bool kiln_type_equal(const kiln_type_t *a, const kiln_type_t *b) {
  if (a->dtype != b->dtype || a->rank != b->rank) return false;
  for (int i = 0; i < a->rank; ++i)
    if (a->dims[i] != b->dims[i]) return false;
  return true;
}

bool kiln_type_is_static(const kiln_type_t *t) {
  for (int i = 0; i < t->rank; ++i)
    if (KILN_IS_SYM(t->dims[i])) return false;
  return true;
}

int64_t kiln_type_numel(const kiln_type_t *t) {
  int64_t n = 1;
  for (int i = 0; i < t->rank; ++i) n *= t->dims[i];
  return n;
}

const char *kiln_type_str(const kiln_graph_t *g, const kiln_type_t *t,
                          char *buf, size_t n) {
  size_t o = (size_t)snprintf(buf, n, "%s[", kiln_dtype_name(t->dtype));
  for (int i = 0; i < t->rank && o < n; ++i) {
    if (KILN_IS_SYM(t->dims[i])) {
      int32_t id = KILN_SYM_ID(t->dims[i]);
      const char *s = (g && id < g->symbol_count) ? g->symbols[id] : "?";
      o += (size_t)snprintf(buf + o, n - o, "%s%s", i ? "," : "", s);
    } else {
      o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? "," : "",
                            (long long)t->dims[i]);
    }
  }
  if (o < n) snprintf(buf + o, n - o, "]");
  return buf;
}

//===--- op table ---------------------------------------------------------===//

static const struct {
  const char *name;
  kiln_op_class_t cls;
} kOps[KILN_OP_COUNT] = {
#define KILN_OP(id, name, cls) {name, KILN_CLASS_##cls},
#include "lib/graph/ops.def"
#undef KILN_OP
};

const char *kiln_op_name(kiln_op_id_t op) {
  return (unsigned)op < KILN_OP_COUNT ? kOps[op].name : "?";
}

kiln_op_class_t kiln_op_class(kiln_op_id_t op) { return kOps[op].cls; }

bool kiln_op_lookup(const char *name, size_t n, kiln_op_id_t *out) {
  for (int i = 0; i < KILN_OP_COUNT; ++i) {
    if (strlen(kOps[i].name) == n && memcmp(kOps[i].name, name, n) == 0) {
      *out = (kiln_op_id_t)i;
      return true;
    }
  }
  return false;
}

bool kiln_op_is_elementwise(kiln_op_id_t op) {
  switch (kiln_op_class(op)) {
    case KILN_CLASS_UNARY: case KILN_CLASS_UNARY_FLOAT:
    case KILN_CLASS_UNARY_BOOL: case KILN_CLASS_CONVERT:
    case KILN_CLASS_BINARY: case KILN_CLASS_BINARY_FLOAT:
    case KILN_CLASS_COMPARE: case KILN_CLASS_LOGICAL: case KILN_CLASS_WHERE:
      return true;
    default:
      return false;
  }
}

//===--- attributes -------------------------------------------------------===//

const kiln_attr_t *kiln_node_attr(const kiln_node_t *n, const char *name) {
  for (int i = 0; i < n->attr_count; ++i)
    if (strcmp(n->attrs[i].name, name) == 0) return &n->attrs[i];
  return NULL;
}

int64_t kiln_node_attr_int(const kiln_node_t *n, const char *name,
                           int64_t dflt) {
  const kiln_attr_t *a = kiln_node_attr(n, name);
  if (!a) return dflt;
  if (a->kind == KILN_ATTR_INT || a->kind == KILN_ATTR_BOOL ||
      a->kind == KILN_ATTR_DTYPE)
    return a->i;
  if (a->kind == KILN_ATTR_FLOAT) return (int64_t)a->f;
  return dflt;
}

double kiln_node_attr_float(const kiln_node_t *n, const char *name,
                            double dflt) {
  const kiln_attr_t *a = kiln_node_attr(n, name);
  if (!a) return dflt;
  if (a->kind == KILN_ATTR_FLOAT) return a->f;
  if (a->kind == KILN_ATTR_INT || a->kind == KILN_ATTR_BOOL)
    return (double)a->i;
  return dflt;
}

const char *kiln_node_attr_str(const kiln_node_t *n, const char *name,
                               const char *dflt) {
  const kiln_attr_t *a = kiln_node_attr(n, name);
  return (a && a->kind == KILN_ATTR_STR) ? a->s : dflt;
}

void kiln_node_reduced_dims(const kiln_node_t *n, const kiln_type_t *x,
                            bool reduced[KILN_MAX_RANK]) {
  const kiln_attr_t *a = kiln_node_attr(n, "dims");
  memset(reduced, 0, sizeof(bool) * KILN_MAX_RANK);
  if (!a || a->count == 0) {
    for (int i = 0; i < x->rank; ++i) reduced[i] = true;
    return;
  }
  for (int k = 0; k < a->count; ++k) {
    int32_t d;
    if (kiln_normalize_dim(a->ints[k], x->rank, &d) && x->rank) reduced[d] = true;
  }
}

void kiln_node_attr_pair(const kiln_node_t *n, const char *name, int64_t dflt,
                         int64_t out[2]) {
  const kiln_attr_t *a = kiln_node_attr(n, name);
  out[0] = out[1] = dflt;
  if (a && a->kind == KILN_ATTR_LIST && a->count >= 1) {
    out[0] = a->ints[0];
    out[1] = a->count > 1 ? a->ints[1] : a->ints[0];
  } else if (a && a->kind == KILN_ATTR_INT) {
    out[0] = out[1] = a->i;
  }
}

void kiln_node_pool_window(const kiln_node_t *n, int64_t k[2], int64_t st[2], int64_t pd[2],
                           int64_t dl[2]) {
  kiln_node_attr_pair(n, "kernel_size", 0, k);
  kiln_node_attr_pair(n, "stride", 0, st);
  kiln_node_attr_pair(n, "padding", 0, pd);
  kiln_node_attr_pair(n, "dilation", 1, dl);
  if (st[0] == 0 && st[1] == 0) st[0] = k[0], st[1] = k[1];
}

void kiln_node_permutation(const kiln_node_t *n, int32_t rank,
                           int32_t perm[KILN_MAX_RANK]) {
  for (int i = 0; i < rank; ++i) perm[i] = i;
  if (n->op == KILN_OP_PERMUTE) {
    const kiln_attr_t *a = kiln_node_attr(n, "dims");
    for (int i = 0; a && i < rank && i < a->count; ++i)
      kiln_normalize_dim(a->ints[i], rank, &perm[i]);
  } else if (rank) {
    int32_t d0 = 0, d1 = 0;
    kiln_normalize_dim(kiln_node_attr_int(n, "dim0", 0), rank, &d0);
    kiln_normalize_dim(kiln_node_attr_int(n, "dim1", 1), rank, &d1);
    perm[d0] = d1;
    perm[d1] = d0;
  }
}

int64_t kiln_node_slice_start(const kiln_node_t *n, int64_t size) {
  int64_t start = kiln_node_attr_int(n, "start", 0);
  // (A symbolic dim: the verifier took only starts >= 0 there.)
  if (KILN_IS_SYM(size)) return start;
  if (start < 0) start += size;
  return start < 0 ? 0 : start > size ? size : start;
}

bool kiln_normalize_dim(int64_t dim, int32_t rank, int32_t *out) {
  int64_t r = rank == 0 ? 1 : rank;  // as PyTorch: dim 0/-1 of a scalar
  if (dim < -r || dim >= r) return false;
  *out = (int32_t)(dim < 0 ? dim + r : dim);
  return true;
}

void kiln_graph_free(kiln_graph_t *g) {
  if (!g) return;
  free(g->values);
  free(g->nodes);
  free(g->bounds);
  kiln_arena_free(&g->arena);
  free(g);
}
