// Vectorizable f32 exp, log, tanh and erf written as arithmetic.
//
// LLVM lowers a vector llvm.exp to one libm call per lane, which made exp
// ten times slower than a load/store pass (softmax 4096x4096: 29 of 65 ms).
// MLIR's polynomial approximations are not reachable from the C API, so kiln
// emits its own, in the classic Cephes forms (range reduction + minimax
// polynomial). f64 keeps the math dialect (libm).
//
// Accuracy (checked against the double-precision reference interpreter by
// ops_numeric at f32 tolerance): exp within 2 ulp on [-87, 88.7], +inf above
// 88.72, 0 below ~-87 (no subnormal results); log within 2 ulp (subnormal
// inputs included); tanh within 3 ulp; erf within 6 ulp (3.3e-7 absolute
// near +-1).
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "emit.h"

// The types arithmetic is written in: f32 / i32 scalars (a linalg body), or
// vectors of e->lanes of them (the f32 microkernel's epilogue).
static const char *FT(const kiln_emitter_t *e) { return kiln_lane_type(e, KILN_F32); }
static const char *IT(const kiln_emitter_t *e) { return kiln_lane_type(e, KILN_I32); }
// "T" for a scalar select, "vector<Nxi1>, T" for a vector one.
static const char *ST(const kiln_emitter_t *e) { return kiln_select_type(e, KILN_F32); }

static void c(kiln_emitter_t *e, kiln_sbuf_t *b, double v, char out[24]) {
  kiln_emit_scalar_const(e, b, KILN_F32, v, out);
}

static void iconst(kiln_emitter_t *e, kiln_sbuf_t *b, int32_t v, char out[24]) {
  kiln_emit_fresh(e, out);
  if (e->lanes)
    kiln_sbuf_printf(b, "    %s = arith.constant dense<%d> : %s\n", out, v, IT(e));
  else
    kiln_sbuf_printf(b, "    %s = arith.constant %d : %s\n", out, v, IT(e));
}

static void op2(kiln_emitter_t *e, kiln_sbuf_t *b, const char *op,
                const char *x, const char *y, char out[24]) {
  kiln_emit_fresh(e, out);
  kiln_sbuf_printf(b, "    %s = %s %s, %s : %s\n", out, op, x, y, FT(e));
}

static void fma3(kiln_emitter_t *e, kiln_sbuf_t *b, const char *x,
                 const char *y, const char *z, char out[24]) {
  kiln_emit_fresh(e, out);
  kiln_sbuf_printf(b, "    %s = math.fma %s, %s, %s : %s\n", out, x, y, z, FT(e));
}

// Horner: scale * (coef[0] * x^(n-1) + ... + coef[n-1]), each step one
// fused multiply-add (`fused`, exp's chain) or a multiply then an add.
static void horner(kiln_emitter_t *e, kiln_sbuf_t *b, const char *x,
                   const double *coef, int n, double scale, bool fused,
                   char out[24]) {
  char acc[24], k[24], t[24];
  c(e, b, scale * coef[0], acc);
  for (int i = 1; i < n; ++i) {
    c(e, b, scale * coef[i], k);
    if (fused) {
      fma3(e, b, acc, x, k, t);
    } else {
      char m[24];
      op2(e, b, "arith.mulf", acc, x, m);
      op2(e, b, "arith.addf", m, k, t);
    }
    memcpy(acc, t, 24);
  }
  memcpy(out, acc, 24);
}

// min(x, c) and max(x, c) that pass a NaN x through: a compare and a select
// in the operand order of x86's minps/maxps, which LLVM matches to one
// instruction (arith.minimumf's NaN semantics cost three).
static void clamp_side(kiln_emitter_t *e, kiln_sbuf_t *b, const char *x,
                       const char *c, bool upper, char out[24]) {
  char k[24];
  kiln_emit_fresh(e, k);
  if (upper)
    kiln_sbuf_printf(b, "    %s = arith.cmpf olt, %s, %s : %s\n", k, c, x, FT(e));
  else
    kiln_sbuf_printf(b, "    %s = arith.cmpf olt, %s, %s : %s\n", k, x, c, FT(e));
  kiln_emit_fresh(e, out);
  kiln_sbuf_printf(b, "    %s = arith.select %s, %s, %s : %s\n", out, k, c, x, ST(e));
}

// e^x = 2^n e^r, n = round(x / ln2), r = x - n ln2 (Cody-Waite, ln2 in two
// parts), e^r by a degree-6 polynomial (1 + r + c2 r^2 + ... + c6 r^6,
// relative error 3.1e-9 on |r| <= ln2/2 before rounding, fitted by least
// squares on the relative error, reweighted to minimax; Cephes' degree 7 is
// accurate past what f32 keeps) evaluated as one Horner chain of fused
// multiply-adds.
// 15 operations per element, 14 for an argument known not to be positive
// (the multiply/add form this replaced took 31, and exp bounds the CPU
// softmax).
//  - n comes from the magic-number trick: fma(x, 1/ln2, 1.5 * 2^23) rounds
//    x/ln2 to an integer in the low mantissa bits, so n (as a float) is one
//    subtraction and 2^(n-1) is an integer add and shift of those bits;
//  - the polynomial's coefficients are doubled (exact) and the scale is
//    2^(n-1), so results up to the true overflow stay finite, and a clamp at
//    89 gives n <= 128 and +inf above ln(FLT_MAX) by rounding;
//  - the clamp at -87.34 gives n >= -126, whose 2^(n-1) has a zero exponent
//    field: results below about -87 (e^-inf included) are 0, no subnormals;
//  - `nonpositive`: the caller knows x <= 0 or NaN (softmax's x - row max),
//    and the upper clamp goes.
static void emit_exp(kiln_emitter_t *e, kiln_sbuf_t *b, const char *x,
                     bool nonpositive, char out[24]) {
  static const double P[] = {1.3814613093E-3, 8.3687099614E-3, 4.1668387374E-2,
                             1.6666520689E-1, 4.9999993452E-1, 1.0, 1.0};
  char hi[24], lo[24], t[24], xc[24], log2e[24], magic[24], fn[24], c1[24],
      c2[24], r1[24], r[24], p[24], bits[24], bias[24], sh[24], eb[24],
      pow2[24], xh[24];
  if (nonpositive) {
    memcpy(xh, x, 24);
  } else {
    c(e, b, 89.0, hi);
    clamp_side(e, b, x, hi, true, xh);
  }
  c(e, b, -87.33654475055310, lo);
  clamp_side(e, b, xh, lo, false, xc);
  c(e, b, 1.44269504088896341, log2e);
  c(e, b, 12582912.0, magic);  // 1.5 * 2^23
  fma3(e, b, xc, log2e, magic, t);
  op2(e, b, "arith.subf", t, magic, fn);
  c(e, b, -0.693359375, c1);
  c(e, b, 2.12194440e-4, c2);
  fma3(e, b, fn, c1, xc, r1);
  fma3(e, b, fn, c2, r1, r);
  horner(e, b, r, P, (int)(sizeof(P) / sizeof(P[0])), 2.0, true, p);
  // bits(t) = bits(1.5 * 2^23) + n; 2^(n-1) = (n + 126) << 23.
  kiln_emit_fresh(e, bits);
  kiln_sbuf_printf(b, "    %s = arith.bitcast %s : %s to %s\n", bits, t, FT(e), IT(e));
  iconst(e, b, 126 - 0x4B400000, bias);
  kiln_emit_fresh(e, t);
  kiln_sbuf_printf(b, "    %s = arith.addi %s, %s : %s\n", t, bits, bias, IT(e));
  iconst(e, b, 23, sh);
  kiln_emit_fresh(e, eb);
  kiln_sbuf_printf(b, "    %s = arith.shli %s, %s : %s\n", eb, t, sh, IT(e));
  kiln_emit_fresh(e, pow2);
  kiln_sbuf_printf(b, "    %s = arith.bitcast %s : %s to %s\n", pow2, eb, IT(e), FT(e));
  op2(e, b, "arith.mulf", p, pow2, out);
}

static void ibin(kiln_emitter_t *e, kiln_sbuf_t *b, const char *op,
                 const char *x, const char *y, char out[24]) {
  kiln_emit_fresh(e, out);
  kiln_sbuf_printf(b, "    %s = %s %s, %s : %s\n", out, op, x, y, IT(e));
}

static void fselect(kiln_emitter_t *e, kiln_sbuf_t *b, const char *pred,
                    const char *x, const char *y, const char *t, const char *f,
                    char out[24]) {
  char k[24];
  kiln_emit_fresh(e, k);
  kiln_sbuf_printf(b, "    %s = arith.cmpf %s, %s, %s : %s\n", k, pred, x, y, FT(e));
  kiln_emit_fresh(e, out);
  kiln_sbuf_printf(b, "    %s = arith.select %s, %s, %s : %s\n", out, k, t, f, ST(e));
}

// log x = k ln2 + log(1 + f), x = (1 + f) 2^k with 1 + f in [sqrt(1/2),
// sqrt(2)): subtracting the bits of sqrt(1/2) from x's bits puts k in the
// exponent field (an arithmetic shift reads it, negative below sqrt(1/2))
// and adding them back to the low 23 bits gives 1 + f. log(1 + f) is
// Cephes' f - f^2/2 + f^3 P(f) (P of degree 8, fused multiply-adds), ln2
// in two parts. Subnormal inputs are scaled by 2^23 first (k - 23). The
// IEEE cases by selects at the end: log(+inf) = +inf, log(+-0) = -inf, and
// NaN for negative and NaN inputs (the unordered compare). About 35
// operations per element, vectorized (math.log became a libm call per lane).
static void emit_log(kiln_emitter_t *e, kiln_sbuf_t *b, const char *x,
                     char out[24]) {
  static const double P[] = {7.0376836292E-2,  -1.1514610310E-1, 1.1676998740E-1,
                             -1.2420140846E-1, 1.4249322787E-1,  -1.6668057665E-1,
                             2.0000714765E-1,  -2.4999993993E-1, 3.3333331174E-1};
  char tiny[24], scale[24], xs0[24], xs[24], sub[24], zero_i[24], kadj[24],
      bits[24], sq[24], ix[24], sh[24], k0[24], k[24], mask[24], lo[24],
      mb[24], m[24], one[24], f[24], kf[24], z[24], p[24], fz[24], y[24],
      c2[24], y1[24], mh[24], y2[24], r0[24], ln2[24], r[24], inf[24],
      ninf[24], zero[24], nan[24], r1[24], r2[24];
  c(e, b, 1.17549435e-38, tiny);  // FLT_MIN
  c(e, b, 8388608.0, scale);      // 2^23
  op2(e, b, "arith.mulf", x, scale, xs0);
  fselect(e, b, "olt", x, tiny, xs0, x, xs);
  iconst(e, b, -23, sub);
  iconst(e, b, 0, zero_i);
  {
    char q[24];
    kiln_emit_fresh(e, q);
    kiln_sbuf_printf(b, "    %s = arith.cmpf olt, %s, %s : %s\n", q, x, tiny, FT(e));
    kiln_emit_fresh(e, kadj);
    kiln_sbuf_printf(b, "    %s = arith.select %s, %s, %s : %s\n", kadj, q, sub,
                     zero_i, kiln_select_type(e, KILN_I32));
  }
  kiln_emit_fresh(e, bits);
  kiln_sbuf_printf(b, "    %s = arith.bitcast %s : %s to %s\n", bits, xs, FT(e), IT(e));
  iconst(e, b, 0x3f3504f3, sq);  // sqrt(1/2)
  ibin(e, b, "arith.subi", bits, sq, ix);
  iconst(e, b, 23, sh);
  ibin(e, b, "arith.shrsi", ix, sh, k0);
  ibin(e, b, "arith.addi", k0, kadj, k);
  iconst(e, b, 0x007fffff, mask);
  ibin(e, b, "arith.andi", ix, mask, lo);
  ibin(e, b, "arith.addi", lo, sq, mb);
  kiln_emit_fresh(e, m);
  kiln_sbuf_printf(b, "    %s = arith.bitcast %s : %s to %s\n", m, mb, IT(e), FT(e));
  c(e, b, 1.0, one);
  op2(e, b, "arith.subf", m, one, f);
  kiln_emit_fresh(e, kf);
  kiln_sbuf_printf(b, "    %s = arith.sitofp %s : %s to %s\n", kf, k, IT(e), FT(e));
  op2(e, b, "arith.mulf", f, f, z);
  horner(e, b, f, P, (int)(sizeof(P) / sizeof(P[0])), 1.0, true, p);
  op2(e, b, "arith.mulf", f, z, fz);
  op2(e, b, "arith.mulf", p, fz, y);
  c(e, b, -2.12194440e-4, c2);
  fma3(e, b, kf, c2, y, y1);
  c(e, b, -0.5, mh);
  fma3(e, b, z, mh, y1, y2);
  op2(e, b, "arith.addf", f, y2, r0);
  c(e, b, 0.693359375, ln2);
  fma3(e, b, kf, ln2, r0, r);
  c(e, b, INFINITY, inf);
  c(e, b, -INFINITY, ninf);
  c(e, b, 0.0, zero);
  c(e, b, NAN, nan);
  fselect(e, b, "oeq", x, inf, inf, r, r1);
  fselect(e, b, "oeq", x, zero, ninf, r1, r2);
  fselect(e, b, "ult", x, zero, nan, r2, out);
}

// The tail shared by odd functions computed in two ranges: `large` was
// computed for |x| and takes the sign of x; below `limit` (and for NaN, via
// the unordered compare) the `small` branch wins.
static void odd_select(kiln_emitter_t *e, kiln_sbuf_t *b, const char *x,
                       const char *ax, const char *small, const char *large,
                       double limit, char out[24]) {
  char zero[24], neg[24], nl[24], signed_l[24], lim[24], is_small[24];
  c(e, b, 0.0, zero);
  kiln_emit_fresh(e, neg);
  kiln_sbuf_printf(b, "    %s = arith.cmpf olt, %s, %s : %s\n", neg, x, zero, FT(e));
  kiln_emit_fresh(e, nl);
  kiln_sbuf_printf(b, "    %s = arith.negf %s : %s\n", nl, large, FT(e));
  kiln_emit_fresh(e, signed_l);
  kiln_sbuf_printf(b, "    %s = arith.select %s, %s, %s : %s\n", signed_l, neg,
                   nl, large, ST(e));
  c(e, b, limit, lim);
  kiln_emit_fresh(e, is_small);
  kiln_sbuf_printf(b, "    %s = arith.cmpf ult, %s, %s : %s\n", is_small, ax,
                   lim, FT(e));
  kiln_emit_fresh(e, out);
  kiln_sbuf_printf(b, "    %s = arith.select %s, %s, %s : %s\n", out, is_small,
                   small, signed_l, ST(e));
}

static void emit_tanh(kiln_emitter_t *e, kiln_sbuf_t *b, const char *x,
                      char out[24]) {
  static const double P[] = {-5.70498872745E-3, 2.06390887954E-2,
                             -5.37397155531E-2, 1.33314422036E-1,
                             -3.33332819422E-1};
  char z[24], p[24], t[24], small_r[24], ax[24], two[24], one[24], e2[24],
      d[24], q[24], big_r[24];
  // |x| < 0.625: x + x z P(z), z = x^2
  op2(e, b, "arith.mulf", x, x, z);
  horner(e, b, z, P, 5, 1.0, false, p);
  op2(e, b, "arith.mulf", p, z, t);
  char t2[24];
  op2(e, b, "arith.mulf", t, x, t2);
  op2(e, b, "arith.addf", t2, x, small_r);
  // otherwise 1 - 2 / (e^{2|x|} + 1), with the sign of x
  kiln_emit_fresh(e, ax);
  kiln_sbuf_printf(b, "    %s = math.absf %s : %s\n", ax, x, FT(e));
  c(e, b, 2.0, two);
  c(e, b, 1.0, one);
  op2(e, b, "arith.mulf", ax, two, t);
  emit_exp(e, b, t, false, e2);
  op2(e, b, "arith.addf", e2, one, d);
  op2(e, b, "arith.divf", two, d, q);
  op2(e, b, "arith.subf", one, q, big_r);
  odd_select(e, b, x, ax, small_r, big_r, 0.625, out);
}

// erf x = x P(x^2) / Q(x^2), P and Q of degree 5 (Q(0) = 1), fitted to
// erf(x)/x on [0, 3.925] by least squares on the relative error, reweighted
// towards minimax (1.9e-8 before rounding; within 6 ulp, 3.3e-7 absolute,
// in f32). One range, so no branch is computed and thrown away: 17
// operations where the series + Abramowitz-Stegun 7.1.26 + exp pair this
// replaced took 45 (erf bounds GELU's epilogue).
//  - x is clamped to +-4.5 and the result to +-1. Past |x| = 4.02 the
//    rational is above 1 and the clamp gives exactly +-1, as f32 erf is,
//    so GELU of a large negative input is 0, not |x| times a rounding error.
//  - the clamps pass NaN through; +-inf give +-1.
static void emit_erf(kiln_emitter_t *e, kiln_sbuf_t *b, const char *x,
                     char out[24]) {
  static const double P[] = {2.0458181723991023e-06, 2.8482271142947767e-04,
                             3.7723816654555552e-03, 5.2768711202666140e-02,
                             1.9059221584400016e-01, 1.1283791458428962};
  static const double Q[] = {3.8044507588834060e-05, 1.1637852235038566e-03,
                             1.4982870407373838e-02, 1.1418173888391984e-01,
                             5.0224068594613020e-01, 1.0};
  char lim[24], nlim[24], lo[24], xc[24], z[24], p[24], q[24], num[24],
      r[24], one[24], none[24], rhi[24];
  c(e, b, 4.5, lim);
  c(e, b, -4.5, nlim);
  clamp_side(e, b, x, lim, true, lo);
  clamp_side(e, b, lo, nlim, false, xc);
  op2(e, b, "arith.mulf", xc, xc, z);
  horner(e, b, z, P, 6, 1.0, true, p);
  horner(e, b, z, Q, 6, 1.0, true, q);
  op2(e, b, "arith.mulf", xc, p, num);
  op2(e, b, "arith.divf", num, q, r);
  c(e, b, 1.0, one);
  c(e, b, -1.0, none);
  clamp_side(e, b, r, one, true, rhi);
  clamp_side(e, b, rhi, none, false, out);
}

void kiln_emit_math(kiln_emitter_t *e, kiln_sbuf_t *b, const char *fn,
                    const char *x, kiln_dtype_t mt, char out[24]) {
  if (mt == KILN_F32) {
    if (strcmp(fn, "exp") == 0) return emit_exp(e, b, x, false, out);
    if (strcmp(fn, "exp_nonpositive") == 0) return emit_exp(e, b, x, true, out);
    if (strcmp(fn, "log") == 0) return emit_log(e, b, x, out);
    if (strcmp(fn, "tanh") == 0) return emit_tanh(e, b, x, out);
    if (strcmp(fn, "erf") == 0) return emit_erf(e, b, x, out);
  }
  if (strcmp(fn, "exp_nonpositive") == 0) fn = "exp";
  kiln_emit_fresh(e, out);
  kiln_sbuf_printf(b, "    %s = math.%s %s : %s\n", out, fn, x, kiln_lane_type(e, mt));
}
