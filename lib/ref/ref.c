// The reference interpreter. Written to be obviously correct, not fast: every
// tensor is a dense row-major array of doubles, every op a loop over output
// elements that recomputes input positions from multi-indices.
#include "ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

//===--- element conversions ----------------------------------------------===//

static float bits_to_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static uint32_t f32_to_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static double bf16_load(uint16_t h) { return bits_to_f32((uint32_t)h << 16); }
static uint16_t bf16_from(double v) {
  float f = (float)v;
  uint32_t u = f32_to_bits(f);
  if (isnan(f)) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fff + ((u >> 16) & 1);  // round to nearest even
  return (uint16_t)(u >> 16);
}

static double f16_load(uint16_t h) {
  int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double v;
  if (e == 0) v = ldexp(m, -24);
  else if (e == 31) v = m ? NAN : INFINITY;
  else v = ldexp(m + 1024, e - 25);
  return s ? -v : v;
}
static uint16_t f16_from(double v) {
  // Round to nearest even through the exact double value.
  uint16_t sign = signbit(v) ? 0x8000 : 0;
  double a = fabs(v);
  if (isnan(v)) return 0x7e00;
  if (a >= 65520.0) return sign | 0x7c00;  // rounds to infinity
  if (a < ldexp(1, -14)) {                 // subnormal: units of 2^-24
    double q = nearbyint(a * ldexp(1, 24));
    return sign | (uint16_t)q;
  }
  int e;
  frexp(a, &e);  // a = f * 2^e, f in [0.5,1)
  double q = nearbyint(ldexp(a, 11 - e));  // 11 significant bits
  if (q >= 2048) {
    q /= 2;
    e++;
  }
  int be = e - 1 + 15;
  if (be >= 31) return sign | 0x7c00;
  return sign | (uint16_t)(be << 10) | (uint16_t)((int)q - 1024);
}

double kiln_ref_round(kiln_dtype_t t, double v) {
  switch (t) {
    case KILN_F32: return (double)(float)v;
    case KILN_F16: return f16_load(f16_from(v));
    case KILN_BF16: return bf16_load(bf16_from(v));
    case KILN_F64: return v;
    case KILN_I32:
      if (isnan(v)) return 0;
      v = trunc(v);
      if (v >= 2147483647.0) return 2147483647.0;
      if (v <= -2147483648.0) return -2147483648.0;
      return v;
    case KILN_I64:
      if (isnan(v)) return 0;
      return trunc(v);
    case KILN_BOOL: return v != 0 ? 1.0 : 0.0;
    default: return v;
  }
}

double kiln_ref_load(kiln_dtype_t t, const void *base, int64_t i) {
  switch (t) {
    case KILN_F32: return ((const float *)base)[i];
    case KILN_F16: return f16_load(((const uint16_t *)base)[i]);
    case KILN_BF16: return bf16_load(((const uint16_t *)base)[i]);
    case KILN_F64: return ((const double *)base)[i];
    case KILN_I32: return ((const int32_t *)base)[i];
    case KILN_I64: return (double)((const int64_t *)base)[i];
    case KILN_BOOL: return ((const uint8_t *)base)[i] ? 1.0 : 0.0;
    default: return 0;
  }
}

void kiln_ref_store(kiln_dtype_t t, void *base, int64_t i, double v) {
  v = kiln_ref_round(t, v);
  switch (t) {
    case KILN_F32: ((float *)base)[i] = (float)v; break;
    case KILN_F16: ((uint16_t *)base)[i] = f16_from(v); break;
    case KILN_BF16: ((uint16_t *)base)[i] = bf16_from(v); break;
    case KILN_F64: ((double *)base)[i] = v; break;
    case KILN_I32: ((int32_t *)base)[i] = (int32_t)v; break;
    case KILN_I64: ((int64_t *)base)[i] = (int64_t)v; break;
    case KILN_BOOL: ((uint8_t *)base)[i] = v != 0; break;
    default: break;
  }
}

//===--- tensors ----------------------------------------------------------===//

typedef struct {
  kiln_type_t type;
  double *data;  // row-major, numel elements
} rt_t;

typedef struct {
  const kiln_graph_t *g;
  rt_t *vals;  // one per graph value
} ref_t;

static int64_t numel(const kiln_type_t *t) { return kiln_type_numel(t); }

static void unravel(const kiln_type_t *t, int64_t lin, int64_t *idx) {
  for (int i = t->rank - 1; i >= 0; --i) {
    int64_t d = t->dims[i];
    idx[i] = d ? lin % d : 0;
    lin = d ? lin / d : 0;
  }
}

static int64_t ravel(const kiln_type_t *t, const int64_t *idx) {
  int64_t lin = 0;
  for (int i = 0; i < t->rank; ++i) lin = lin * t->dims[i] + idx[i];
  return lin;
}

// Offset into `in` for an output multi-index, with numpy broadcasting.
static int64_t bcast_offset(const kiln_type_t *in, const kiln_type_t *out,
                            const int64_t *oidx) {
  int64_t lin = 0;
  int off = out->rank - in->rank;
  for (int i = 0; i < in->rank; ++i) {
    int64_t k = in->dims[i] == 1 ? 0 : oidx[i + off];
    lin = lin * in->dims[i] + k;
  }
  return lin;
}

static kiln_status_t alloc_rt(rt_t *r, const kiln_type_t *t) {
  r->type = *t;
  int64_t n = numel(t);
  r->data = calloc((size_t)(n ? n : 1), sizeof(double));
  if (!r->data)
    return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY,
                            "reference interpreter: %lld elements",
                            (long long)n);
  return NULL;
}

//===--- scalar semantics -------------------------------------------------===//

static double gelu(double x, bool tanh_form) {
  if (tanh_form) {
    double k = sqrt(2.0 / M_PI);
    return 0.5 * x * (1.0 + tanh(k * (x + 0.044715 * x * x * x)));
  }
  return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
}

static double ipow(double a, double b) {
  // Integer pow as PyTorch: exact for the small exponents tests use; negative
  // exponents give 0 except for |a| == 1.
  int64_t x = (int64_t)a, e = (int64_t)b, r = 1;
  if (e < 0) return x == 1 ? 1 : x == -1 ? (e % 2 ? -1 : 1) : 0;
  while (e-- > 0) r *= x;
  return (double)r;
}

static double unary(const kiln_node_t *n, double x, kiln_dtype_t ct) {
  switch (n->op) {
    case KILN_OP_NEG: return -x;
    case KILN_OP_ABS: return fabs(x);
    case KILN_OP_RELU: return isnan(x) ? x : x > 0 ? x : 0;
    case KILN_OP_CLONE: return x;
    case KILN_OP_EXP: return exp(x);
    case KILN_OP_LOG: return log(x);
    case KILN_OP_SQRT: return sqrt(x);
    case KILN_OP_RSQRT: return 1.0 / sqrt(x);
    case KILN_OP_TANH: return tanh(x);
    case KILN_OP_SIGMOID: return 1.0 / (1.0 + exp(-x));
    case KILN_OP_GELU:
      return gelu(x, strcmp(kiln_node_attr_str(n, "approximate", "none"),
                            "tanh") == 0);
    case KILN_OP_ERF: return erf(x);
    case KILN_OP_SIN: return sin(x);
    case KILN_OP_COS: return cos(x);
    case KILN_OP_LOGICAL_NOT: return x == 0;
    case KILN_OP_CONVERT: return x;
    default: (void)ct; return NAN;
  }
}

static double binary(const kiln_node_t *n, double a, double b,
                     kiln_dtype_t ct) {
  bool fl = kiln_dtype_is_float(ct);
  switch (n->op) {
    case KILN_OP_ADD: return a + kiln_node_attr_float(n, "alpha", 1) * b;
    case KILN_OP_SUB: return a - kiln_node_attr_float(n, "alpha", 1) * b;
    case KILN_OP_MUL: return a * b;
    case KILN_OP_MAXIMUM: return isnan(a) || isnan(b) ? NAN : a > b ? a : b;
    case KILN_OP_MINIMUM: return isnan(a) || isnan(b) ? NAN : a < b ? a : b;
    case KILN_OP_DIV: {
      const char *mode = kiln_node_attr_str(n, "rounding_mode", NULL);
      if (!mode) return a / b;
      if (!fl && b == 0) return 0;  // integer division by zero: defined as 0
      double q = a / b;
      return strcmp(mode, "trunc") == 0 ? trunc(q) : floor(q);
    }
    case KILN_OP_POW: return fl ? pow(a, b) : ipow(a, b);
    case KILN_OP_EQ: return a == b;
    case KILN_OP_NE: return a != b;
    case KILN_OP_LT: return a < b;
    case KILN_OP_LE: return a <= b;
    case KILN_OP_GT: return a > b;
    case KILN_OP_GE: return a >= b;
    case KILN_OP_LOGICAL_AND: return (a != 0) && (b != 0);
    case KILN_OP_LOGICAL_OR: return (a != 0) || (b != 0);
    case KILN_OP_LOGICAL_XOR: return (a != 0) != (b != 0);
    default: return NAN;
  }
}

static double operand_at(ref_t *r, const kiln_operand_t *o,
                         const kiln_type_t *out, const int64_t *oidx) {
  if (o->kind == KILN_OPERAND_FLOAT) return o->f;
  if (o->kind != KILN_OPERAND_VALUE) return (double)o->i;
  const rt_t *t = &r->vals[o->value];
  return t->data[bcast_offset(&t->type, out, oidx)];
}

static void run_elementwise(ref_t *r, const kiln_node_t *n, rt_t *out) {
  kiln_dtype_t ct = kiln_node_compute_dtype(r->g, n);
  kiln_op_class_t cls = kiln_op_class(n->op);
  int64_t idx[KILN_MAX_RANK];
  int64_t total = numel(&out->type);
  for (int64_t i = 0; i < total; ++i) {
    unravel(&out->type, i, idx);
    double v;
    if (cls == KILN_CLASS_WHERE) {
      double c = operand_at(r, &n->operands[0], &out->type, idx);
      double a = kiln_ref_round(ct, operand_at(r, &n->operands[1], &out->type, idx));
      double b = kiln_ref_round(ct, operand_at(r, &n->operands[2], &out->type, idx));
      v = c != 0 ? a : b;
    } else if (n->operand_count == 2) {
      double a = kiln_ref_round(ct, operand_at(r, &n->operands[0], &out->type, idx));
      double b = kiln_ref_round(ct, operand_at(r, &n->operands[1], &out->type, idx));
      v = binary(n, a, b, ct);
    } else {
      double a = kiln_ref_round(ct, operand_at(r, &n->operands[0], &out->type, idx));
      v = unary(n, a, ct);
    }
    out->data[i] = kiln_ref_round(out->type.dtype, v);
  }
}

//===--- reductions -------------------------------------------------------===//

// Maps an input multi-index to the linear index of the (keepdim or not)
// reduced output.
static int64_t reduced_offset(const kiln_type_t *x, const bool *red,
                              const kiln_type_t *out, const int64_t *idx) {
  int64_t keep[KILN_MAX_RANK];
  int k = 0;
  bool keepdim = out->rank == x->rank && x->rank > 0;
  for (int i = 0; i < x->rank; ++i) {
    if (!red[i]) keep[k++] = idx[i];
    else if (keepdim) keep[k++] = 0;
  }
  return ravel(out, keep);
}

static kiln_status_t run_reduce(ref_t *r, const kiln_node_t *n, rt_t *out) {
  const rt_t *x = &r->vals[n->operands[0].value];
  bool red[KILN_MAX_RANK];
  kiln_node_reduced_dims(n, &x->type, red);
  int64_t on = numel(&out->type), xn = numel(&x->type);
  double *acc = calloc((size_t)(on ? on : 1), sizeof(double));
  double *cnt = calloc((size_t)(on ? on : 1), sizeof(double));
  if (!acc || !cnt) {
    free(acc);
    free(cnt);
    return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "reference reduce");
  }
  double init = 0;
  if (n->op == KILN_OP_PROD) init = 1;
  if (n->op == KILN_OP_AMAX) init = -INFINITY;
  if (n->op == KILN_OP_AMIN) init = INFINITY;
  for (int64_t i = 0; i < on; ++i) acc[i] = init;
  int64_t idx[KILN_MAX_RANK];
  // Pass 1: sums (and the mean for var).
  for (int64_t i = 0; i < xn; ++i) {
    unravel(&x->type, i, idx);
    int64_t o = reduced_offset(&x->type, red, &out->type, idx);
    double v = x->data[i];
    cnt[o] += 1;
    switch (n->op) {
      case KILN_OP_PROD: acc[o] *= v; break;
      // NaN propagates: once the accumulator is NaN it stays NaN.
      case KILN_OP_AMAX:
        acc[o] = (isnan(v) || isnan(acc[o])) ? NAN : v > acc[o] ? v : acc[o];
        break;
      case KILN_OP_AMIN:
        acc[o] = (isnan(v) || isnan(acc[o])) ? NAN : v < acc[o] ? v : acc[o];
        break;
      default: acc[o] += v; break;
    }
  }
  if (n->op == KILN_OP_MEAN || n->op == KILN_OP_VAR)
    for (int64_t o = 0; o < on; ++o) acc[o] /= cnt[o];
  if (n->op == KILN_OP_VAR) {
    double *m2 = calloc((size_t)(on ? on : 1), sizeof(double));
    if (!m2) {
      free(acc);
      free(cnt);
      return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "reference var");
    }
    for (int64_t i = 0; i < xn; ++i) {
      unravel(&x->type, i, idx);
      int64_t o = reduced_offset(&x->type, red, &out->type, idx);
      double d = x->data[i] - acc[o];
      m2[o] += d * d;
    }
    double corr = kiln_node_attr_float(n, "correction", 1);
    for (int64_t o = 0; o < on; ++o) {
      double denom = cnt[o] - corr;
      acc[o] = m2[o] / (denom > 0 ? denom : 0.0);
    }
    free(m2);
  }
  for (int64_t o = 0; o < on; ++o)
    out->data[o] = kiln_ref_round(out->type.dtype, acc[o]);
  free(acc);
  free(cnt);
  return NULL;
}

//===--- contractions -----------------------------------------------------===//

static void run_matmul(ref_t *r, const kiln_node_t *n, rt_t *out) {
  int base = n->op == KILN_OP_ADDMM ? 1 : 0;
  const rt_t *a = &r->vals[n->operands[base].value];
  const rt_t *b = &r->vals[n->operands[base + 1].value];
  bool batched = n->op == KILN_OP_BMM;
  int64_t B = batched ? a->type.dims[0] : 1;
  int64_t M = a->type.dims[batched ? 1 : 0], K = a->type.dims[batched ? 2 : 1];
  int64_t N = b->type.dims[batched ? 2 : 1];
  double beta = kiln_node_attr_float(n, "beta", 1);
  double alpha = kiln_node_attr_float(n, "alpha", 1);
  for (int64_t bi = 0; bi < B; ++bi)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k)
          s += a->data[(bi * M + i) * K + k] * b->data[(bi * K + k) * N + j];
        if (base) {
          const rt_t *c = &r->vals[n->operands[0].value];
          int64_t oidx[2] = {i, j};
          double cv = c->data[bcast_offset(&c->type, &out->type, oidx)];
          s = (beta == 0 ? 0 : beta * cv) + alpha * s;
        }
        out->data[(bi * M + i) * N + j] = kiln_ref_round(out->type.dtype, s);
      }
}

static void run_conv(ref_t *r, const kiln_node_t *n, rt_t *out) {
  const rt_t *x = &r->vals[n->operands[0].value];
  const rt_t *w = &r->vals[n->operands[1].value];
  const rt_t *bias = n->operand_count > 2 &&
                             n->operands[2].kind == KILN_OPERAND_VALUE
                         ? &r->vals[n->operands[2].value]
                         : NULL;
  int64_t st[2], pd[2], dl[2];
  kiln_node_attr_pair(n, "stride", 1, st);
  kiln_node_attr_pair(n, "padding", 0, pd);
  kiln_node_attr_pair(n, "dilation", 1, dl);
  int64_t G = kiln_node_attr_int(n, "groups", 1);
  int64_t N = x->type.dims[0], C = x->type.dims[1], H = x->type.dims[2],
          W = x->type.dims[3];
  int64_t F = w->type.dims[0], CG = w->type.dims[1], KH = w->type.dims[2],
          KW = w->type.dims[3];
  int64_t OH = out->type.dims[2], OW = out->type.dims[3];
  int64_t FG = F / G;
  for (int64_t b = 0; b < N; ++b)
    for (int64_t f = 0; f < F; ++f) {
      int64_t g = f / FG;
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          double s = bias ? bias->data[f] : 0;
          for (int64_t c = 0; c < CG; ++c)
            for (int64_t kh = 0; kh < KH; ++kh)
              for (int64_t kw = 0; kw < KW; ++kw) {
                int64_t ih = oh * st[0] - pd[0] + kh * dl[0];
                int64_t iw = ow * st[1] - pd[1] + kw * dl[1];
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                s += x->data[((b * C + g * CG + c) * H + ih) * W + iw] *
                     w->data[((f * CG + c) * KH + kh) * KW + kw];
              }
          out->data[((b * F + f) * OH + oh) * OW + ow] =
              kiln_ref_round(out->type.dtype, s);
        }
    }
}

static void run_max_pool2d(ref_t *r, const kiln_node_t *n, rt_t *out) {
  const rt_t *x = &r->vals[n->operands[0].value];
  int64_t k[2], st[2], pd[2], dl[2];
  kiln_node_pool_window(n, k, st, pd, dl);
  int64_t NC = x->type.dims[0] * x->type.dims[1], H = x->type.dims[2], W = x->type.dims[3];
  int64_t OH = out->type.dims[2], OW = out->type.dims[3];
  for (int64_t p = 0; p < NC; ++p)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        double m = -INFINITY;
        for (int64_t kh = 0; kh < k[0]; ++kh)
          for (int64_t kw = 0; kw < k[1]; ++kw) {
            int64_t ih = oh * st[0] - pd[0] + kh * dl[0];
            int64_t iw = ow * st[1] - pd[1] + kw * dl[1];
            if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
            double v = x->data[(p * H + ih) * W + iw];
            if (v > m || isnan(v)) m = v;  // NaN wins, as in PyTorch
            if (isnan(m)) break;
          }
        out->data[(p * OH + oh) * OW + ow] = kiln_ref_round(out->type.dtype, m);
      }
}

//===--- shapes -----------------------------------------------------------===//

static void run_shape(ref_t *r, const kiln_node_t *n, rt_t *out) {
  const rt_t *x = &r->vals[n->operands[0].value];
  int64_t total = numel(&out->type);
  int64_t idx[KILN_MAX_RANK] = {0}, src[KILN_MAX_RANK] = {0};
  switch (n->op) {
    case KILN_OP_VIEW:
    case KILN_OP_RESHAPE:
    case KILN_OP_SQUEEZE:
    case KILN_OP_UNSQUEEZE:
      for (int64_t i = 0; i < total; ++i) out->data[i] = x->data[i];
      return;
    case KILN_OP_EXPAND:
      for (int64_t i = 0; i < total; ++i) {
        unravel(&out->type, i, idx);
        out->data[i] = x->data[bcast_offset(&x->type, &out->type, idx)];
      }
      return;
    case KILN_OP_PERMUTE:
    case KILN_OP_TRANSPOSE: {
      int32_t perm[KILN_MAX_RANK];
      int rank = x->type.rank;
      kiln_node_permutation(n, rank, perm);
      for (int64_t i = 0; i < total; ++i) {
        unravel(&out->type, i, idx);
        for (int k = 0; k < rank; ++k) src[perm[k]] = idx[k];
        out->data[i] = x->data[ravel(&x->type, src)];
      }
      return;
    }
    case KILN_OP_SLICE: {
      int32_t d;
      kiln_normalize_dim(kiln_node_attr_int(n, "dim", 0), x->type.rank, &d);
      int64_t size = x->type.dims[d];
      int64_t start = kiln_node_slice_start(n, size);
      int64_t step = kiln_node_attr_int(n, "step", 1);
      for (int64_t i = 0; i < total; ++i) {
        unravel(&out->type, i, idx);
        memcpy(src, idx, sizeof(idx));
        src[d] = start + idx[d] * step;
        out->data[i] = x->data[ravel(&x->type, src)];
      }
      return;
    }
    case KILN_OP_CAT: {
      int32_t d;
      kiln_normalize_dim(kiln_node_attr_int(n, "dim", 0), x->type.rank, &d);
      for (int64_t i = 0; i < total; ++i) {
        unravel(&out->type, i, idx);
        int64_t pos = idx[d];
        for (int k = 0; k < n->operand_count; ++k) {
          const rt_t *y = &r->vals[n->operands[k].value];
          if (pos < y->type.dims[d]) {
            memcpy(src, idx, sizeof(idx));
            src[d] = pos;
            out->data[i] =
                kiln_ref_round(out->type.dtype, y->data[ravel(&y->type, src)]);
            break;
          }
          pos -= y->type.dims[d];
        }
      }
      return;
    }
    default:
      return;
  }
}

static void run_create(const kiln_node_t *n, rt_t *out) {
  int64_t total = numel(&out->type);
  if (n->op == KILN_OP_ARANGE) {
    int64_t start = kiln_node_attr_int(n, "start", 0), step = kiln_node_attr_int(n, "step", 1);
    for (int64_t i = 0; i < total; ++i)
      out->data[i] = kiln_ref_round(out->type.dtype, (double)(start + i * step));
    return;
  }
  const kiln_attr_t *v = kiln_node_attr(n, "value");
  for (int64_t i = 0; i < total; ++i) {
    double x;
    if (v->kind == KILN_ATTR_LIST) x = v->floats[v->count == 1 ? 0 : i];
    else x = v->kind == KILN_ATTR_FLOAT ? v->f : (double)v->i;
    out->data[i] = kiln_ref_round(out->type.dtype, x);
  }
}

//===--- composite ops ----------------------------------------------------===//

// Iterates rows along `dim`: calls body for each (outer, inner) with the
// stride between row elements.
static void run_softmax(ref_t *r, const kiln_node_t *n, rt_t *out) {
  const rt_t *x = &r->vals[n->operands[0].value];
  int32_t d;
  kiln_normalize_dim(kiln_node_attr_int(n, "dim", -1), x->type.rank, &d);
  int64_t len = x->type.rank ? x->type.dims[d] : 1, inner = 1, outer = 1;
  for (int i = 0; i < x->type.rank; ++i) {
    if (i < d) outer *= x->type.dims[i];
    if (i > d) inner *= x->type.dims[i];
  }
  bool log_form = n->op == KILN_OP_LOG_SOFTMAX;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t in = 0; in < inner; ++in) {
      int64_t base = o * len * inner + in;
      double m = -INFINITY, s = 0;
      for (int64_t k = 0; k < len; ++k) {
        double v = x->data[base + k * inner];
        m = v > m ? v : m;
      }
      for (int64_t k = 0; k < len; ++k) s += exp(x->data[base + k * inner] - m);
      for (int64_t k = 0; k < len; ++k) {
        double v = x->data[base + k * inner] - m;
        double y = log_form ? v - log(s) : exp(v) / s;
        out->data[base + k * inner] = kiln_ref_round(out->type.dtype, y);
      }
    }
}

static void run_layer_norm(ref_t *r, const kiln_node_t *n, rt_t *outs) {
  const rt_t *x = &r->vals[n->operands[0].value];
  const rt_t *w = n->operand_count > 1 &&
                          n->operands[1].kind == KILN_OPERAND_VALUE
                      ? &r->vals[n->operands[1].value]
                      : NULL;
  const rt_t *b = n->operand_count > 2 &&
                          n->operands[2].kind == KILN_OPERAND_VALUE
                      ? &r->vals[n->operands[2].value]
                      : NULL;
  const kiln_attr_t *ns = kiln_node_attr(n, "normalized_shape");
  double eps = kiln_node_attr_float(n, "eps", 1e-5);
  int64_t row = 1;
  for (int i = 0; i < ns->count; ++i) row *= ns->ints[i];
  int64_t rows = row ? numel(&x->type) / row : 0;
  for (int64_t i = 0; i < rows; ++i) {
    const double *xr = x->data + i * row;
    double mean = 0, var = 0;
    for (int64_t k = 0; k < row; ++k) mean += xr[k];
    mean /= (double)row;
    for (int64_t k = 0; k < row; ++k) var += (xr[k] - mean) * (xr[k] - mean);
    var /= (double)row;
    double rstd = 1.0 / sqrt(var + eps);
    for (int64_t k = 0; k < row; ++k) {
      double y = (xr[k] - mean) * rstd;
      if (w) y *= w->data[k];
      if (b) y += b->data[k];
      outs[0].data[i * row + k] = kiln_ref_round(outs[0].type.dtype, y);
    }
    outs[1].data[i] = kiln_ref_round(outs[1].type.dtype, mean);
    outs[2].data[i] = kiln_ref_round(outs[2].type.dtype, rstd);
  }
}

// Per row of N normalized elements, x_hat = (x - mean) rstd and g = dy w:
// dx = rstd / N (N g - sum(g) - x_hat sum(g x_hat)); over the rows,
// dw = sum(dy x_hat) and db = sum(dy).
static kiln_status_t run_layer_norm_backward(ref_t *r, const kiln_node_t *n,
                                             rt_t *outs) {
  const rt_t *dy = &r->vals[n->operands[0].value];
  const rt_t *x = &r->vals[n->operands[1].value];
  const rt_t *mean = &r->vals[n->operands[2].value];
  const rt_t *rstd = &r->vals[n->operands[3].value];
  const rt_t *w = &r->vals[n->operands[4].value];
  int64_t row = numel(&w->type);
  int64_t rows = row ? numel(&x->type) / row : 0;
  double *dw = calloc((size_t)(row ? row : 1), sizeof(double));
  double *db = calloc((size_t)(row ? row : 1), sizeof(double));
  if (!dw || !db) {
    free(dw);
    free(db);
    return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "reference layer norm backward");
  }
  for (int64_t i = 0; i < rows; ++i) {
    const double *xr = x->data + i * row, *gr = dy->data + i * row;
    double m = mean->data[i], s = rstd->data[i], a = 0, b = 0;
    for (int64_t k = 0; k < row; ++k) {
      double g = gr[k] * w->data[k], xh = (xr[k] - m) * s;
      a += g;
      b += g * xh;
      dw[k] += gr[k] * xh;
      db[k] += gr[k];
    }
    for (int64_t k = 0; k < row; ++k) {
      double g = gr[k] * w->data[k], xh = (xr[k] - m) * s;
      double d = s / (double)row * ((double)row * g - a - xh * b);
      outs[0].data[i * row + k] = kiln_ref_round(outs[0].type.dtype, d);
    }
  }
  for (int64_t k = 0; k < row; ++k) {
    outs[1].data[k] = kiln_ref_round(outs[1].type.dtype, dw[k]);
    outs[2].data[k] = kiln_ref_round(outs[2].type.dtype, db[k]);
  }
  free(dw);
  free(db);
  return NULL;
}

static void run_embedding(ref_t *r, const kiln_node_t *n, rt_t *out) {
  const rt_t *w = &r->vals[n->operands[0].value];
  const rt_t *idx = &r->vals[n->operands[1].value];
  int64_t V = w->type.dims[0], D = w->type.dims[1];
  int64_t count = numel(&idx->type);
  for (int64_t i = 0; i < count; ++i) {
    // Out-of-range indices are clamped, as the compiled code does (it must
    // never read outside the table).
    int64_t k = (int64_t)idx->data[i];
    k = k < 0 ? 0 : k >= V ? V - 1 : k;
    for (int64_t j = 0; j < D; ++j) out->data[i * D + j] = w->data[k * D + j];
  }
}

// x indexed by tensors on the dims `dim` .. `dim` + k - 1 (broadcast
// together to B): a negative index counts from the end, and one still
// outside the dim is clamped into it, as the compiled code does (PyTorch
// raises; compiled code must never read outside x).
static void run_index(ref_t *r, const kiln_node_t *n, rt_t *out) {
  const rt_t *x = &r->vals[n->operands[0].value];
  int k = n->operand_count - 1;
  int dim = (int)kiln_node_attr_int(n, "dim", 0);
  int brank = out->type.rank - x->type.rank + k;
  // B as a type of its own, for the index tensors' broadcast offsets.
  kiln_type_t bt = out->type;
  bt.rank = brank;
  for (int i = 0; i < brank; ++i) bt.dims[i] = out->type.dims[dim + i];
  int64_t count = numel(&out->type);
  int64_t oi[KILN_MAX_RANK], xi[KILN_MAX_RANK];
  for (int64_t lin = 0; lin < count; ++lin) {
    unravel(&out->type, lin, oi);
    for (int i = 0; i < dim; ++i) xi[i] = oi[i];
    for (int j = 0; j < k; ++j) {
      const rt_t *it = &r->vals[n->operands[1 + j].value];
      int64_t size = x->type.dims[dim + j];
      int64_t v = (int64_t)it->data[bcast_offset(&it->type, &bt, oi + dim)];
      if (v < 0) v += size;
      xi[dim + j] = v < 0 ? 0 : v >= size ? size - 1 : v;
    }
    for (int i = dim + k; i < x->type.rank; ++i) xi[i] = oi[i - k + brank];
    out->data[lin] = x->data[ravel(&x->type, xi)];
  }
}

// base with values[p, :] added to row indices[p] in order of p; a negative
// index counts from the end, one outside [-V, V) adds nothing (PyTorch
// raises; compiled code cannot, and never writes outside the output).
static void run_index_put(ref_t *r, const kiln_node_t *n, rt_t *out) {
  const rt_t *base = &r->vals[n->operands[0].value];
  const rt_t *idx = &r->vals[n->operands[1].value];
  const rt_t *val = &r->vals[n->operands[2].value];
  int64_t V = base->type.dims[0], D = base->type.dims[1];
  for (int64_t i = 0; i < V * D; ++i) out->data[i] = base->data[i];
  int64_t count = numel(&idx->type);
  for (int64_t p = 0; p < count; ++p) {
    int64_t k = (int64_t)idx->data[p];
    if (k < 0) k += V;
    if (k < 0 || k >= V) continue;
    for (int64_t j = 0; j < D; ++j)
      out->data[k * D + j] = kiln_ref_round(KILN_F32, out->data[k * D + j] + val->data[p * D + j]);
  }
}

//===--- driver -----------------------------------------------------------===//

kiln_status_t kiln_ref_run(const kiln_graph_t *g, const DLTensor *inputs,
                           DLTensor *outputs) {
  ref_t r = {g, calloc((size_t)g->value_count, sizeof(rt_t))};
  if (!r.vals) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "reference");
  kiln_status_t s = NULL;
  for (int i = 0; i < g->input_count && !s; ++i) {
    rt_t *t = &r.vals[g->inputs[i]];
    s = alloc_rt(t, &g->values[g->inputs[i]].type);
    if (s) break;
    const DLTensor *in = &inputs[i];
    int64_t idx[KILN_MAX_RANK] = {0};
    int64_t total = numel(&t->type);
    const char *base = (const char *)in->data + in->byte_offset;
    for (int64_t e = 0; e < total; ++e) {
      unravel(&t->type, e, idx);
      int64_t off = 0;
      if (in->strides) {
        for (int k = 0; k < in->ndim; ++k) off += idx[k] * in->strides[k];
      } else {
        off = e;
      }
      t->data[e] = kiln_ref_load(t->type.dtype, base, off);
    }
  }
  for (int i = 0; i < g->node_count && !s; ++i) {
    const kiln_node_t *n = &g->nodes[i];
    rt_t outs[KILN_MAX_RESULTS];
    for (int k = 0; k < n->result_count && !s; ++k)
      s = alloc_rt(&r.vals[n->results[k]], &g->values[n->results[k]].type);
    if (s) break;
    for (int k = 0; k < n->result_count; ++k) outs[k] = r.vals[n->results[k]];
    rt_t *out = &r.vals[n->results[0]];
    switch (kiln_op_class(n->op)) {
      case KILN_CLASS_REDUCE: s = run_reduce(&r, n, out); break;
      case KILN_CLASS_MATMUL: run_matmul(&r, n, out); break;
      case KILN_CLASS_CONV: run_conv(&r, n, out); break;
      case KILN_CLASS_SHAPE: run_shape(&r, n, out); break;
      case KILN_CLASS_CREATE: run_create(n, out); break;
      case KILN_CLASS_NN:
        if (n->op == KILN_OP_LAYER_NORM) run_layer_norm(&r, n, outs);
        else if (n->op == KILN_OP_LAYER_NORM_BACKWARD) s = run_layer_norm_backward(&r, n, outs);
        else if (n->op == KILN_OP_EMBEDDING) run_embedding(&r, n, out);
        else if (n->op == KILN_OP_INDEX_PUT) run_index_put(&r, n, out);
        else if (n->op == KILN_OP_INDEX) run_index(&r, n, out);
        else if (n->op == KILN_OP_MAX_POOL2D) run_max_pool2d(&r, n, out);
        else run_softmax(&r, n, out);
        break;
      default: run_elementwise(&r, n, out); break;
    }
  }
  for (int i = 0; i < g->output_count && !s; ++i) {
    const rt_t *t = &r.vals[g->outputs[i]];
    int64_t total = numel(&t->type);
    char *base = (char *)outputs[i].data + outputs[i].byte_offset;
    for (int64_t e = 0; e < total; ++e)
      kiln_ref_store(t->type.dtype, base, e, t->data[e]);
  }
  // Stores into inputs last: every node above read the inputs as they were.
  for (int i = 0; i < g->mutation_count && !s; ++i) {
    const rt_t *t = &r.vals[g->mutations[i].value];
    const DLTensor *in = &inputs[g->mutations[i].input];
    char *base = (char *)in->data + in->byte_offset;
    int64_t idx[KILN_MAX_RANK] = {0};
    int64_t total = numel(&t->type);
    for (int64_t e = 0; e < total; ++e) {
      int64_t off = e;
      if (in->strides) {
        unravel(&t->type, e, idx);
        off = 0;
        for (int k = 0; k < in->ndim; ++k) off += idx[k] * in->strides[k];
      }
      kiln_ref_store(t->type.dtype, base, off, t->data[e]);
    }
  }
  for (int32_t v = 0; v < g->value_count; ++v) free(r.vals[v].data);
  free(r.vals);
  return s;
}
