#include "tensor_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lib/graph/graph.h"
#include "lib/ref/ref.h"

static kiln_dtype_t dt_of(DLDataType d) {
  kiln_dtype_t t = KILN_F32;
  kiln_dtype_from_dl(d, &t);
  return t;
}

bool kt_alloc(kt_tensor_t *t, const kiln_tensor_type_t *type, bool strided) {
  memset(t, 0, sizeof(*t));
  t->dl.device.device_type = kDLCPU;
  t->dl.ndim = type->rank;
  t->dl.dtype = type->dtype;
  t->dl.shape = t->shape;
  int64_t n = 1;
  for (int i = 0; i < type->rank; ++i) {
    t->shape[i] = type->shape[i];
    n *= type->shape[i];
  }
  size_t esize = kiln_dtype_size(dt_of(type->dtype));
  // The strided view doubles the last-dim stride.
  int64_t span = strided && type->rank ? n * 2 : n;
  t->bytes = (size_t)(span ? span : 1) * esize;
  t->base = aligned_alloc(64, (t->bytes + 63) / 64 * 64);
  if (!t->base) return false;
  memset(t->base, 0, t->bytes);
  t->dl.data = t->base;
  if (strided && type->rank) {
    int64_t s = 2;
    for (int i = type->rank - 1; i >= 0; --i) {
      t->strides[i] = s;
      s *= type->shape[i];
    }
    t->dl.strides = t->strides;
  }
  return true;
}

void kt_free(kt_tensor_t *t) {
  free(t->base);
  memset(t, 0, sizeof(*t));
}

bool kt_alloc_outputs(const kiln_tensor_type_t *types, size_t n, kt_tensor_t *got,
                      kt_tensor_t *want, DLTensor *got_dl, DLTensor *want_dl) {
  for (size_t i = 0; i < n; ++i) {
    if (!kt_alloc(&got[i], &types[i], false) || !kt_alloc(&want[i], &types[i], false)) {
      kt_free(&got[i]);
      kt_free_n(got, i);
      kt_free_n(want, i);
      return false;
    }
    kt_poison(&got[i]);
    got_dl[i] = got[i].dl;
    want_dl[i] = want[i].dl;
  }
  return true;
}

void kt_free_n(kt_tensor_t *t, size_t n) {
  for (size_t i = 0; i < n; ++i) kt_free(&t[i]);
}

int64_t kt_numel(const kt_tensor_t *t) {
  int64_t n = 1;
  for (int i = 0; i < t->dl.ndim; ++i) n *= t->shape[i];
  return n;
}

static int64_t elem_offset(const kt_tensor_t *t, int64_t lin) {
  if (!t->dl.strides) return lin;
  int64_t off = 0;
  for (int i = t->dl.ndim - 1; i >= 0; --i) {
    int64_t d = t->shape[i];
    off += (lin % d) * t->strides[i];
    lin /= d;
  }
  return off;
}

uint64_t kt_rand(uint64_t *s) {
  uint64_t x = *s ? *s : 0x9E3779B97F4A7C15ull;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *s = x;
  return x * 0x2545F4914F6CDD1Dull;
}

void kt_fill_random(kt_tensor_t *t, uint64_t *state) {
  kiln_dtype_t dt = dt_of(t->dl.dtype);
  int64_t n = kt_numel(t);
  for (int64_t i = 0; i < n; ++i) {
    uint64_t r = kt_rand(state);
    double v;
    if (kiln_dtype_is_float(dt)) v = (double)(r >> 11) / 9007199254740992.0 * 2 - 1;
    else if (dt == KILN_BOOL) v = (double)(r >> 63);
    else v = (double)((int64_t)(r >> 33) % 11) - 5;
    kiln_ref_store(dt, t->base, elem_offset(t, i), v);
  }
}

void kt_poison(kt_tensor_t *t) { memset(t->base, 0xFF, t->bytes); }

double kt_get(const kt_tensor_t *t, int64_t i) {
  return kiln_ref_load(dt_of(t->dl.dtype), t->base, elem_offset(t, i));
}

kt_tolerance_t kt_tolerance_for(DLDataType dtype) {
  switch (dt_of(dtype)) {
    case KILN_F64: return (kt_tolerance_t){1e-12, 1e-10};
    case KILN_F32: return (kt_tolerance_t){1e-5, 1e-4};
    case KILN_F16: return (kt_tolerance_t){2e-3, 1e-2};
    case KILN_BF16: return (kt_tolerance_t){1e-2, 2e-2};
    default: return (kt_tolerance_t){0, 0};
  }
}

bool kt_compare(const kt_tensor_t *got, const kt_tensor_t *want,
                kt_tolerance_t tol, kt_compare_t *out) {
  memset(out, 0, sizeof(*out));
  out->first_bad = -1;
  int64_t n = kt_numel(want);
  double scale = 1;
  for (int64_t i = 0; i < n; ++i) {
    double b = fabs(kt_get(want, i));
    if (isfinite(b) && b > scale) scale = b;
  }
  for (int64_t i = 0; i < n; ++i) {
    double a = kt_get(got, i), b = kt_get(want, i);
    bool ok;
    double err = 0;
    if (isnan(b) || isnan(a)) ok = isnan(a) && isnan(b);
    else if (isinf(b) || isinf(a)) ok = a == b;
    else {
      err = fabs(a - b);
      ok = err <= tol.atol * scale + tol.rtol * fabs(b);
      if (err > out->max_abs_err) out->max_abs_err = err;
      double rel = err / (fabs(b) > 1e-30 ? fabs(b) : 1e-30);
      if (rel > out->max_rel_err && err > 0) out->max_rel_err = rel;
    }
    if (!ok) {
      if (out->first_bad < 0) out->first_bad = i;
      out->mismatches++;
    }
  }
  return out->mismatches == 0;
}

double kt_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
