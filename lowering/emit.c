// Core of the linalg emitter: types, constants, conversions, and the three
// generic builders (elementwise, reduction, reshape) every op family uses.
#include "emit.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int kiln_emit_sole_reader(const kiln_graph_t *g, int32_t v, int from) {
  for (int i = 0; i < g->output_count; ++i)
    if (g->outputs[i] == v) return -1;
  for (int i = 0; i < g->mutation_count; ++i)
    if (g->mutations[i].value == v) return -1;
  int found = -1;
  for (int i = from + 1; i < g->node_count; ++i) {
    const kiln_node_t *c = &g->nodes[i];
    for (int k = 0; k < c->operand_count; ++k) {
      if (c->operands[k].kind != KILN_OPERAND_VALUE || c->operands[k].value != v) continue;
      if (found >= 0) return -1;
      found = i;
    }
  }
  return found;
}

void kiln_emit_fresh(kiln_emitter_t *e, char ssa[24]) {
  snprintf(ssa, 24, "%%t%d", e->next_id++);
}

const char *kiln_mlir_elem(kiln_dtype_t t) {
  switch (t) {
    case KILN_F32: return "f32";
    case KILN_F16: return "f16";
    case KILN_BF16: return "bf16";
    case KILN_F64: return "f64";
    case KILN_I32: return "i32";
    case KILN_I64: return "i64";
    case KILN_BOOL: return "i1";
    default: return "?";
  }
}

const char *kiln_lane_type(const kiln_emitter_t *e, kiln_dtype_t t) {
  if (!e->lanes) return kiln_mlir_elem(t);
  // Only the microkernel's 16 f32 lanes (and the i32 / i1 vectors of the
  // same shape that its math uses) are written.
  switch (t) {
    case KILN_F32: return "vector<16xf32>";
    case KILN_I32: return "vector<16xi32>";
    case KILN_BOOL: return "vector<16xi1>";
    default: return "?";
  }
}

const char *kiln_select_type(const kiln_emitter_t *e, kiln_dtype_t t) {
  if (!e->lanes) return kiln_mlir_elem(t);
  return t == KILN_I32 ? "vector<16xi1>, vector<16xi32>" : "vector<16xi1>, vector<16xf32>";
}

const char *kiln_mlir_storage_elem(kiln_dtype_t t) {
  return t == KILN_BOOL ? "i8" : kiln_mlir_elem(t);
}

void kiln_mlir_tensor_type(const kiln_type_t *t, char *buf, size_t n) {
  size_t o = (size_t)snprintf(buf, n, "tensor<");
  for (int i = 0; i < t->rank && o < n; ++i) {
    if (KILN_IS_SYM(t->dims[i]))
      o += (size_t)snprintf(buf + o, n - o, "?x");
    else
      o += (size_t)snprintf(buf + o, n - o, "%lldx", (long long)t->dims[i]);
  }
  if (o < n) snprintf(buf + o, n - o, "%s>", kiln_mlir_storage_elem(t->dtype));
}

kiln_dtype_t kiln_math_dtype(kiln_dtype_t t) {
  return (t == KILN_F16 || t == KILN_BF16) ? KILN_F32 : t;
}

kiln_status_t kiln_emit_error(kiln_emitter_t *e, kiln_status_code_t code,
                              const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  if (e->node)
    return kiln_make_status(code, "%s (line %d): %s", kiln_op_name(e->node->op),
                            e->node->line, msg);
  return kiln_make_status(code, "%s", msg);
}

void kiln_emit_set_result(kiln_emitter_t *e, const kiln_node_t *n, int i,
                          const kiln_tv_t *tv) {
  e->values[n->results[i]] = *tv;
}

kiln_arg_t kiln_arg_tensor(const kiln_tv_t *tv) {
  kiln_arg_t a;
  memset(&a, 0, sizeof(a));
  a.is_tensor = true;
  a.tv = *tv;
  return a;
}

kiln_arg_t kiln_arg_float(double f) {
  kiln_arg_t a;
  memset(&a, 0, sizeof(a));
  a.scalar_kind = KILN_OPERAND_FLOAT;
  a.f = f;
  return a;
}

kiln_arg_t kiln_arg_operand(kiln_emitter_t *e, int i) {
  const kiln_operand_t *o = &e->node->operands[i];
  if (o->kind == KILN_OPERAND_VALUE) return kiln_arg_tensor(&e->values[o->value]);
  kiln_arg_t a;
  memset(&a, 0, sizeof(a));
  a.scalar_kind = o->kind;
  a.f = o->kind == KILN_OPERAND_FLOAT ? o->f : (double)o->i;
  a.i = o->i;
  return a;
}

//===--- scalars ----------------------------------------------------------===//

// Float constants are written as bit patterns so every value (inf, nan,
// subnormals) round-trips exactly.
void kiln_emit_scalar_const(kiln_emitter_t *e, kiln_sbuf_t *b, kiln_dtype_t t,
                            double v, char ssa[24]) {
  kiln_emit_fresh(e, ssa);
  switch (t) {
    case KILN_F64: {
      uint64_t u;
      memcpy(&u, &v, 8);
      kiln_sbuf_printf(b, "    %s = arith.constant 0x%016llX : f64\n", ssa,
                       (unsigned long long)u);
      return;
    }
    case KILN_F32:
    case KILN_F16:
    case KILN_BF16: {
      float f = (float)v;
      uint32_t u;
      memcpy(&u, &f, 4);
      if (t == KILN_F32) {
        if (e->lanes)
          kiln_sbuf_printf(b, "    %s = arith.constant dense<0x%08X> : %s\n", ssa, u,
                           kiln_lane_type(e, t));
        else
          kiln_sbuf_printf(b, "    %s = arith.constant 0x%08X : f32\n", ssa, u);
        return;
      }
      char wide[24];
      snprintf(wide, sizeof(wide), "%sw", ssa);
      kiln_sbuf_printf(b, "    %s = arith.constant 0x%08X : f32\n", wide, u);
      kiln_sbuf_printf(b, "    %s = arith.truncf %s : f32 to %s\n", ssa, wide,
                       kiln_mlir_elem(t));
      return;
    }
    case KILN_BOOL:
      kiln_sbuf_printf(b, "    %s = arith.constant %s\n", ssa,
                       v != 0 ? "true" : "false");
      return;
    default: {
      double tv = isnan(v) ? 0 : trunc(v);
      kiln_sbuf_printf(b, "    %s = arith.constant %lld : %s\n", ssa,
                       (long long)tv, kiln_mlir_elem(t));
      return;
    }
  }
}

// Converts scalar SSA `x` from `from` to `to` inside a body; writes the name
// of the converted value to `out` (which may be `x` itself).
static void conv_scalar(kiln_emitter_t *e, kiln_sbuf_t *b, const char *x,
                        kiln_dtype_t from, kiln_dtype_t to, char out[24]) {
  if (from == to) {
    snprintf(out, 24, "%s", x);
    return;
  }
  const char *fe = kiln_mlir_elem(from), *te = kiln_mlir_elem(to);
  bool ff = kiln_dtype_is_float(from), tf = kiln_dtype_is_float(to);
  if (ff && tf) {
    // f16 <-> bf16 goes through f32; so does f64 -> f16/bf16, which LLVM
    // would otherwise lower to compiler-rt calls (__truncdfhf2) that are not
    // in any shared library. c10::Half converts doubles through float too.
    if ((from == KILN_F16 && to == KILN_BF16) ||
        (from == KILN_BF16 && to == KILN_F16) ||
        (from == KILN_F64 && (to == KILN_F16 || to == KILN_BF16))) {
      char mid[24];
      conv_scalar(e, b, x, from, KILN_F32, mid);
      conv_scalar(e, b, mid, KILN_F32, to, out);
      return;
    }
    kiln_emit_fresh(e, out);
    bool widen = kiln_dtype_size(to) > kiln_dtype_size(from);
    kiln_sbuf_printf(b, "    %s = arith.%s %s : %s to %s\n", out,
                     widen ? "extf" : "truncf", x, fe, te);
    return;
  }
  if (to == KILN_BOOL) {
    char zero[24];
    kiln_emit_scalar_const(e, b, from, 0, zero);
    kiln_emit_fresh(e, out);
    if (ff)
      kiln_sbuf_printf(b, "    %s = arith.cmpf une, %s, %s : %s\n", out, x,
                       zero, fe);
    else
      kiln_sbuf_printf(b, "    %s = arith.cmpi ne, %s, %s : %s\n", out, x,
                       zero, fe);
    return;
  }
  kiln_emit_fresh(e, out);
  if (from == KILN_BOOL) {
    kiln_sbuf_printf(b, "    %s = arith.%s %s : i1 to %s\n", out,
                     tf ? "uitofp" : "extui", x, te);
  } else if (!ff && tf) {
    kiln_sbuf_printf(b, "    %s = arith.sitofp %s : %s to %s\n", out, x, fe, te);
  } else if (ff && !tf) {
    kiln_sbuf_printf(b, "    %s = arith.fptosi %s : %s to %s\n", out, x, fe, te);
  } else {
    bool widen = kiln_dtype_size(to) > kiln_dtype_size(from);
    kiln_sbuf_printf(b, "    %s = arith.%s %s : %s to %s\n", out,
                     widen ? "extsi" : "trunci", x, fe, te);
  }
}

//===--- elementwise bodies -----------------------------------------------===//

// One instruction "%r = <opname> <operands> : <type>".
static void inst(kiln_emitter_t *e, kiln_sbuf_t *b, char r[24],
                 const char *opname, const char *a, const char *c,
                 const char *type) {
  kiln_emit_fresh(e, r);
  if (c)
    kiln_sbuf_printf(b, "    %s = %s %s, %s : %s\n", r, opname, a, c, type);
  else
    kiln_sbuf_printf(b, "    %s = %s %s : %s\n", r, opname, a, type);
}

// Emits `op` on scalars already in math dtype `mt` (compute dtype `ct`).
// Writes the result name to `r`; *r_dtype says its dtype (mt, or bool).
static kiln_status_t body_op(kiln_emitter_t *e, kiln_sbuf_t *b,
                             kiln_op_id_t op, const kiln_node_t *attrs,
                             char v[3][24], kiln_dtype_t mt, char r[24],
                             kiln_dtype_t *r_dtype) {
  const char *ty = kiln_lane_type(e, mt);
  bool fl = kiln_dtype_is_float(mt), bo = mt == KILN_BOOL;
  *r_dtype = mt;
  char t1[24], t2[24], t3[24], c0[24], c1[24];
  if (op == KILN_EMIT_OP_EXP_DIFF) {
    inst(e, b, t1, "arith.subf", v[0], v[1], ty);
    kiln_emit_math(e, b, "exp_nonpositive", t1, mt, r);
    return NULL;
  }
  switch (op) {
    case KILN_OP_NEG:
      if (fl) inst(e, b, r, "arith.negf", v[0], NULL, ty);
      else {
        kiln_emit_scalar_const(e, b, mt, 0, c0);
        inst(e, b, r, "arith.subi", c0, v[0], ty);
      }
      return NULL;
    case KILN_OP_ABS:
      if (fl) {
        inst(e, b, r, "math.absf", v[0], NULL, ty);
        return NULL;
      }
      // math.absi has no LLVM lowering in 22.1: select(x < 0, -x, x).
      kiln_emit_scalar_const(e, b, mt, 0, c0);
      inst(e, b, t1, "arith.subi", c0, v[0], ty);
      kiln_emit_fresh(e, t2);
      kiln_sbuf_printf(b, "    %s = arith.cmpi slt, %s, %s : %s\n", t2, v[0],
                       c0, ty);
      kiln_emit_fresh(e, r);
      kiln_sbuf_printf(b, "    %s = arith.select %s, %s, %s : %s\n", r, t2, t1,
                       v[0], ty);
      return NULL;
    case KILN_OP_RELU:
      kiln_emit_scalar_const(e, b, mt, 0, c0);
      inst(e, b, r, fl ? "arith.maximumf" : "arith.maxsi", v[0], c0, ty);
      return NULL;
    case KILN_OP_CLONE:
    case KILN_OP_CONVERT:
      memcpy(r, v[0], 24);
      return NULL;
    case KILN_OP_EXP: kiln_emit_math(e, b, "exp", v[0], mt, r); return NULL;
    case KILN_OP_LOG: kiln_emit_math(e, b, "log", v[0], mt, r); return NULL;
    case KILN_OP_SQRT: inst(e, b, r, "math.sqrt", v[0], NULL, ty); return NULL;
    case KILN_OP_RSQRT: inst(e, b, r, "math.rsqrt", v[0], NULL, ty); return NULL;
    case KILN_OP_TANH: kiln_emit_math(e, b, "tanh", v[0], mt, r); return NULL;
    case KILN_OP_ERF: kiln_emit_math(e, b, "erf", v[0], mt, r); return NULL;
    case KILN_OP_SIN: inst(e, b, r, "math.sin", v[0], NULL, ty); return NULL;
    case KILN_OP_COS: inst(e, b, r, "math.cos", v[0], NULL, ty); return NULL;
    case KILN_OP_SIGMOID:
      kiln_emit_scalar_const(e, b, mt, 1, c1);
      inst(e, b, t1, "arith.negf", v[0], NULL, ty);
      kiln_emit_math(e, b, "exp", t1, mt, t2);
      inst(e, b, t3, "arith.addf", c1, t2, ty);
      inst(e, b, r, "arith.divf", c1, t3, ty);
      return NULL;
    case KILN_OP_GELU: {
      bool tanh_form = attrs && strcmp(kiln_node_attr_str(attrs, "approximate",
                                                          "none"), "tanh") == 0;
      char half[24], one[24], inner[24], t4[24];
      kiln_emit_scalar_const(e, b, mt, 0.5, half);
      kiln_emit_scalar_const(e, b, mt, 1, one);
      if (tanh_form) {
        char k0[24], k1[24];
        kiln_emit_scalar_const(e, b, mt, sqrt(2.0 / M_PI), k0);
        kiln_emit_scalar_const(e, b, mt, 0.044715, k1);
        inst(e, b, t1, "arith.mulf", v[0], v[0], ty);
        inst(e, b, t2, "arith.mulf", t1, v[0], ty);
        inst(e, b, t3, "arith.mulf", t2, k1, ty);
        inst(e, b, t4, "arith.addf", v[0], t3, ty);
        inst(e, b, t1, "arith.mulf", t4, k0, ty);
        kiln_emit_math(e, b, "tanh", t1, mt, inner);
      } else {
        char k[24];
        kiln_emit_scalar_const(e, b, mt, M_SQRT1_2, k);
        inst(e, b, t1, "arith.mulf", v[0], k, ty);
        kiln_emit_math(e, b, "erf", t1, mt, inner);
      }
      inst(e, b, t2, "arith.addf", inner, one, ty);
      inst(e, b, t3, "arith.mulf", v[0], half, ty);
      inst(e, b, r, "arith.mulf", t3, t2, ty);
      return NULL;
    }
    case KILN_OP_LOGICAL_NOT:
      kiln_emit_scalar_const(e, b, mt, 0, c0);
      kiln_emit_fresh(e, r);
      kiln_sbuf_printf(b, "    %s = arith.%s %s, %s : %s\n", r,
                       fl ? "cmpf oeq," : "cmpi eq,", v[0], c0, ty);
      *r_dtype = KILN_BOOL;
      return NULL;
    case KILN_OP_ADD:
    case KILN_OP_SUB: {
      const char *rhs = v[1];
      double alpha = attrs ? kiln_node_attr_float(attrs, "alpha", 1) : 1;
      if (alpha != 1 && !bo) {
        kiln_emit_scalar_const(e, b, mt, alpha, c1);
        inst(e, b, t1, fl ? "arith.mulf" : "arith.muli", v[1], c1, ty);
        rhs = t1;
      }
      if (bo) inst(e, b, r, "arith.ori", v[0], rhs, ty);
      else if (op == KILN_OP_ADD)
        inst(e, b, r, fl ? "arith.addf" : "arith.addi", v[0], rhs, ty);
      else inst(e, b, r, fl ? "arith.subf" : "arith.subi", v[0], rhs, ty);
      return NULL;
    }
    case KILN_OP_MUL:
      inst(e, b, r, bo ? "arith.andi" : fl ? "arith.mulf" : "arith.muli", v[0],
           v[1], ty);
      return NULL;
    case KILN_OP_MAXIMUM:
      inst(e, b, r, bo ? "arith.ori" : fl ? "arith.maximumf" : "arith.maxsi",
           v[0], v[1], ty);
      return NULL;
    case KILN_OP_MINIMUM:
      inst(e, b, r, bo ? "arith.andi" : fl ? "arith.minimumf" : "arith.minsi",
           v[0], v[1], ty);
      return NULL;
    case KILN_OP_DIV: {
      const char *mode = attrs ? kiln_node_attr_str(attrs, "rounding_mode",
                                                   NULL) : NULL;
      bool floor_mode = mode && strcmp(mode, "floor") == 0;
      if (fl) {
        inst(e, b, mode ? t1 : r, "arith.divf", v[0], v[1], ty);
        if (mode) inst(e, b, r, floor_mode ? "math.floor" : "math.trunc", t1,
                       NULL, ty);
        return NULL;
      }
      if (bo)
        return kiln_emit_error(e, KILN_STATUS_UNSUPPORTED,
                               "integer division of bool tensors; expected "
                               "integer or float operands");
      // Integer division must never trap inside the user's process: a zero
      // divisor gives 0 and INT_MIN / -1 wraps, like the reference.
      char zero[24], one[24], m1[24], isz[24], ism1[24], safe[24], q[24],
          neg[24], q2[24];
      kiln_emit_scalar_const(e, b, mt, 0, zero);
      kiln_emit_scalar_const(e, b, mt, 1, one);
      kiln_emit_scalar_const(e, b, mt, -1, m1);
      kiln_emit_fresh(e, isz);
      kiln_sbuf_printf(b, "    %s = arith.cmpi eq, %s, %s : %s\n", isz, v[1],
                       zero, ty);
      kiln_emit_fresh(e, ism1);
      kiln_sbuf_printf(b, "    %s = arith.cmpi eq, %s, %s : %s\n", ism1, v[1],
                       m1, ty);
      char bad[24];
      inst(e, b, bad, "arith.ori", isz, ism1, "i1");
      kiln_emit_fresh(e, safe);
      kiln_sbuf_printf(b, "    %s = arith.select %s, %s, %s : %s\n", safe, bad,
                       one, v[1], ty);
      inst(e, b, q, floor_mode ? "arith.floordivsi" : "arith.divsi", v[0],
           safe, ty);
      inst(e, b, neg, "arith.subi", zero, v[0], ty);
      kiln_emit_fresh(e, q2);
      kiln_sbuf_printf(b, "    %s = arith.select %s, %s, %s : %s\n", q2, ism1,
                       neg, q, ty);
      kiln_emit_fresh(e, r);
      kiln_sbuf_printf(b, "    %s = arith.select %s, %s, %s : %s\n", r, isz,
                       zero, q2, ty);
      return NULL;
    }
    case KILN_OP_POW: {
      if (fl) {
        inst(e, b, r, "math.powf", v[0], v[1], ty);
        return NULL;
      }
      // Integer pow: math.ipowi for exponents >= 0; a negative exponent gives
      // 0, or +-1 for a base of +-1, without dividing.
      char zero[24], one[24], m1[24], isneg[24], safe[24], p[24], odd[24],
          b1[24], bm1[24], sgn[24], negres[24], t5[24];
      kiln_emit_scalar_const(e, b, mt, 0, zero);
      kiln_emit_scalar_const(e, b, mt, 1, one);
      kiln_emit_scalar_const(e, b, mt, -1, m1);
      kiln_emit_fresh(e, isneg);
      kiln_sbuf_printf(b, "    %s = arith.cmpi slt, %s, %s : %s\n", isneg,
                       v[1], zero, ty);
      kiln_emit_fresh(e, safe);
      kiln_sbuf_printf(b, "    %s = arith.select %s, %s, %s : %s\n", safe,
                       isneg, zero, v[1], ty);
      inst(e, b, p, "math.ipowi", v[0], safe, ty);
      inst(e, b, t5, "arith.andi", v[1], one, ty);
      kiln_emit_fresh(e, odd);
      kiln_sbuf_printf(b, "    %s = arith.cmpi ne, %s, %s : %s\n", odd, t5,
                       zero, ty);
      kiln_emit_fresh(e, b1);
      kiln_sbuf_printf(b, "    %s = arith.cmpi eq, %s, %s : %s\n", b1, v[0],
                       one, ty);
      kiln_emit_fresh(e, bm1);
      kiln_sbuf_printf(b, "    %s = arith.cmpi eq, %s, %s : %s\n", bm1, v[0],
                       m1, ty);
      kiln_emit_fresh(e, sgn);
      kiln_sbuf_printf(b, "    %s = arith.select %s, %s, %s : %s\n", sgn, odd,
                       m1, one, ty);
      kiln_emit_fresh(e, t1);
      kiln_sbuf_printf(b, "    %s = arith.select %s, %s, %s : %s\n", t1, bm1,
                       sgn, zero, ty);
      kiln_emit_fresh(e, negres);
      kiln_sbuf_printf(b, "    %s = arith.select %s, %s, %s : %s\n", negres,
                       b1, one, t1, ty);
      kiln_emit_fresh(e, r);
      kiln_sbuf_printf(b, "    %s = arith.select %s, %s, %s : %s\n", r, isneg,
                       negres, p, ty);
      return NULL;
    }
    case KILN_OP_EQ: case KILN_OP_NE: case KILN_OP_LT:
    case KILN_OP_LE: case KILN_OP_GT: case KILN_OP_GE: {
      static const char *fpred[] = {"oeq", "une", "olt", "ole", "ogt", "oge"};
      static const char *ipred[] = {"eq", "ne", "slt", "sle", "sgt", "sge"};
      static const char *upred[] = {"eq", "ne", "ult", "ule", "ugt", "uge"};
      int k = (int)(op - KILN_OP_EQ);
      kiln_emit_fresh(e, r);
      if (fl)
        kiln_sbuf_printf(b, "    %s = arith.cmpf %s, %s, %s : %s\n", r,
                         fpred[k], v[0], v[1], ty);
      else
        kiln_sbuf_printf(b, "    %s = arith.cmpi %s, %s, %s : %s\n", r,
                         bo ? upred[k] : ipred[k], v[0], v[1], ty);
      *r_dtype = KILN_BOOL;
      return NULL;
    }
    case KILN_OP_LOGICAL_AND:
    case KILN_OP_LOGICAL_OR:
    case KILN_OP_LOGICAL_XOR: {
      char a1[24], a2[24];
      conv_scalar(e, b, v[0], mt, KILN_BOOL, a1);
      conv_scalar(e, b, v[1], mt, KILN_BOOL, a2);
      inst(e, b, r,
           op == KILN_OP_LOGICAL_AND  ? "arith.andi"
           : op == KILN_OP_LOGICAL_OR ? "arith.ori"
                                      : "arith.xori",
           a1, a2, "i1");
      *r_dtype = KILN_BOOL;
      return NULL;
    }
    case KILN_OP_WHERE:
      kiln_emit_fresh(e, r);
      kiln_sbuf_printf(b, "    %s = arith.select %s, %s, %s : %s\n", r, v[0],
                       v[1], v[2], ty);
      return NULL;
    default:
      return kiln_emit_error(e, KILN_STATUS_INTERNAL,
                             "no elementwise body for %s", kiln_op_name(op));
  }
}

bool kiln_lanes_op_supported(kiln_op_id_t op) {
  switch (op) {
    case KILN_OP_RELU:
    case KILN_OP_GELU:
    case KILN_OP_SIGMOID:
    case KILN_OP_TANH:
    case KILN_OP_EXP:
    case KILN_OP_ERF:
    case KILN_OP_NEG:
    case KILN_OP_ABS:
      return true;
    default:
      return false;
  }
}

void kiln_emit_lanes_op(kiln_emitter_t *e, kiln_sbuf_t *b, kiln_op_id_t op,
                        const kiln_node_t *attrs, const char *x, char out[24]) {
  char v[3][24];
  snprintf(v[0], 24, "%s", x);
  kiln_dtype_t rdt;
  int saved = e->lanes;
  e->lanes = 16;
  // The ops above all succeed on f32 (body_op fails only for ops it does
  // not know).
  (void)body_op(e, b, op, attrs, v, KILN_F32, out, &rdt);
  e->lanes = saved;
}

// A bool block argument (i8 storage) to i1, in place of its name.
static void load_bool(kiln_emitter_t *e, kiln_sbuf_t *b, char name[24]) {
  char zero[24], r[24];
  kiln_emit_fresh(e, zero);
  kiln_sbuf_printf(b, "    %s = arith.constant 0 : i8\n", zero);
  kiln_emit_fresh(e, r);
  kiln_sbuf_printf(b, "    %s = arith.cmpi ne, %s, %s : i8\n", r, name, zero);
  snprintf(name, 24, "%s", r);
}

// An i1 result to its i8 storage, in place of its name.
static void store_bool(kiln_emitter_t *e, kiln_sbuf_t *b, char name[24]) {
  char r[24];
  kiln_emit_fresh(e, r);
  kiln_sbuf_printf(b, "    %s = arith.extui %s : i1 to i8\n", r, name);
  snprintf(name, 24, "%s", r);
}

// "affine_map<(d0, d1) -> (d1)>" for a tensor of type `t` broadcast into an
// iteration space of rank `r` with sizes `out`.
static void bcast_map(kiln_sbuf_t *b, const kiln_type_t *t,
                      const kiln_type_t *out) {
  kiln_sbuf_puts(b, "affine_map<(");
  for (int i = 0; i < out->rank; ++i) kiln_sbuf_printf(b, "%sd%d", i ? ", " : "", i);
  kiln_sbuf_puts(b, ") -> (");
  int off = out->rank - t->rank;
  for (int i = 0; i < t->rank; ++i) {
    if (i) kiln_sbuf_puts(b, ", ");
    if (t->dims[i] == 1 && out->dims[i + off] != 1) kiln_sbuf_puts(b, "0");
    else kiln_sbuf_printf(b, "d%d", i + off);
  }
  kiln_sbuf_puts(b, ")>");
}

static void iterators(kiln_sbuf_t *b, int rank, const bool *reduced) {
  kiln_sbuf_puts(b, "iterator_types = [");
  for (int i = 0; i < rank; ++i)
    kiln_sbuf_printf(b, "%s\"%s\"", i ? ", " : "",
                     reduced && reduced[i] ? "reduction" : "parallel");
  kiln_sbuf_puts(b, "]");
}

void kiln_emit_empty(kiln_emitter_t *e, const kiln_type_t *t, char ssa[24]) {
  char ty[256];
  kiln_mlir_tensor_type(t, ty, sizeof(ty));
  kiln_emit_fresh(e, ssa);
  kiln_sbuf_printf(&e->out, "    %s = tensor.empty(", ssa);
  int k = 0;
  for (int i = 0; i < t->rank; ++i)
    if (KILN_IS_SYM(t->dims[i]))
      kiln_sbuf_printf(&e->out, "%s%s", k++ ? ", " : "",
                       e->sym_ssa[KILN_SYM_ID(t->dims[i])]);
  kiln_sbuf_printf(&e->out, ") : %s\n", ty);
}

void kiln_emit_size_operand(kiln_emitter_t *e, const kiln_type_t *t, int d,
                            char out[24]) {
  if (KILN_IS_SYM(t->dims[d]))
    snprintf(out, 24, "%s", e->sym_ssa[KILN_SYM_ID(t->dims[d])]);
  else
    snprintf(out, 24, "%lld", (long long)t->dims[d]);
}

void kiln_emit_size_list(kiln_emitter_t *e, const kiln_type_t *t) {
  for (int i = 0; i < t->rank; ++i) {
    char sz[24];
    kiln_emit_size_operand(e, t, i, sz);
    kiln_sbuf_printf(&e->out, "%s%s", i ? ", " : "", sz);
  }
}

kiln_arg_t kiln_emit_count(kiln_emitter_t *e, const kiln_type_t *t,
                           const bool *dims, kiln_dtype_t dt, double minus) {
  double stat = 1;
  bool dynamic = false;
  for (int i = 0; i < t->rank; ++i) {
    if (!dims[i]) continue;
    if (KILN_IS_SYM(t->dims[i])) dynamic = true;
    else stat *= (double)t->dims[i];
  }
  if (!dynamic) {
    double c = stat - minus;
    return kiln_arg_float(c > 0 ? c : 0);
  }
  // count = max(0, static * sym... - minus), computed in index then cast.
  kiln_sbuf_t *b = &e->out;
  char acc[24], nxt[24];
  kiln_emit_fresh(e, acc);
  kiln_sbuf_printf(b, "    %s = arith.constant %lld : index\n", acc,
                   (long long)stat);
  for (int i = 0; i < t->rank; ++i) {
    if (!dims[i] || !KILN_IS_SYM(t->dims[i])) continue;
    kiln_emit_fresh(e, nxt);
    kiln_sbuf_printf(b, "    %s = arith.muli %s, %s : index\n", nxt, acc,
                     e->sym_ssa[KILN_SYM_ID(t->dims[i])]);
    memcpy(acc, nxt, 24);
  }
  char i64[24], fl[24], m[24], z[24], r[24];
  kiln_emit_fresh(e, i64);
  kiln_sbuf_printf(b, "    %s = arith.index_cast %s : index to i64\n", i64, acc);
  kiln_emit_fresh(e, fl);
  kiln_sbuf_printf(b, "    %s = arith.sitofp %s : i64 to %s\n", fl, i64,
                   kiln_mlir_elem(dt));
  kiln_emit_scalar_const(e, b, dt, minus, m);
  kiln_emit_scalar_const(e, b, dt, 0, z);
  kiln_emit_fresh(e, nxt);
  kiln_sbuf_printf(b, "    %s = arith.subf %s, %s : %s\n", nxt, fl, m,
                   kiln_mlir_elem(dt));
  kiln_emit_fresh(e, r);
  kiln_sbuf_printf(b, "    %s = arith.maximumf %s, %s : %s\n", r, nxt, z,
                   kiln_mlir_elem(dt));
  kiln_arg_t a = kiln_arg_float(0);
  memcpy(a.ssa, r, 24);
  return a;
}

kiln_status_t kiln_emit_ew(kiln_emitter_t *e, kiln_op_id_t op,
                           const kiln_node_t *attrs, int n,
                           const kiln_arg_t *args, const kiln_type_t *out_dims,
                           kiln_dtype_t ct, kiln_dtype_t out_dtype,
                           kiln_tv_t *out) {
  kiln_type_t ot;
  memset(&ot, 0, sizeof(ot));
  if (out_dims) {
    ot = *out_dims;
  } else {
    bool any = false;
    for (int i = 0; i < n; ++i) {
      if (!args[i].is_tensor) continue;
      const kiln_type_t *t = &args[i].tv.type;
      if (!any) {
        ot = *t;
        any = true;
        continue;
      }
      int r = ot.rank > t->rank ? ot.rank : t->rank;
      kiln_type_t res = ot;
      res.rank = r;
      for (int k = 0; k < r; ++k) {
        int ia = k - (r - ot.rank), ib = k - (r - t->rank);
        int64_t da = ia >= 0 ? ot.dims[ia] : 1, db = ib >= 0 ? t->dims[ib] : 1;
        res.dims[k] = da == 1 ? db : da;
      }
      ot = res;
    }
  }
  ot.dtype = out_dtype;
  char empty[24];
  kiln_emit_empty(e, &ot, empty);
  kiln_sbuf_t *b = &e->out;
  kiln_emit_fresh(e, out->ssa);
  out->type = ot;
  char oty[256];
  kiln_mlir_tensor_type(&ot, oty, sizeof(oty));
  kiln_sbuf_printf(b, "    %s = linalg.generic {indexing_maps = [", out->ssa);
  int ntensor = 0;
  for (int i = 0; i < n; ++i) {
    if (!args[i].is_tensor) continue;
    bcast_map(b, &args[i].tv.type, &ot);
    kiln_sbuf_puts(b, ", ");
    ntensor++;
  }
  bcast_map(b, &ot, &ot);
  kiln_sbuf_puts(b, "], ");
  iterators(b, ot.rank, NULL);
  kiln_sbuf_puts(b, "}");
  if (ntensor) {
    kiln_sbuf_puts(b, " ins(");
    int k = 0;
    for (int i = 0; i < n; ++i)
      if (args[i].is_tensor)
        kiln_sbuf_printf(b, "%s%s", k++ ? ", " : "", args[i].tv.ssa);
    kiln_sbuf_puts(b, " : ");
    k = 0;
    for (int i = 0; i < n; ++i) {
      if (!args[i].is_tensor) continue;
      char ty[256];
      kiln_mlir_tensor_type(&args[i].tv.type, ty, sizeof(ty));
      kiln_sbuf_printf(b, "%s%s", k++ ? ", " : "", ty);
    }
    kiln_sbuf_puts(b, ")");
  }
  kiln_sbuf_printf(b, " outs(%s : %s) {\n  ^bb0(", empty, oty);
  char v[3][24];
  kiln_dtype_t vdt[3];
  int bi = 0;
  for (int i = 0; i < n; ++i) {
    if (!args[i].is_tensor) continue;
    snprintf(v[i], 24, "%%in%d_%d", e->next_id, bi++);
    vdt[i] = args[i].tv.type.dtype;
    kiln_sbuf_printf(b, "%s: %s, ", v[i], kiln_mlir_storage_elem(vdt[i]));
  }
  char outarg[24];
  snprintf(outarg, 24, "%%out%d", e->next_id++);
  kiln_sbuf_printf(b, "%s: %s):\n", outarg, kiln_mlir_storage_elem(out_dtype));
  // Bools are bytes in memory and i1 in arithmetic.
  for (int i = 0; i < n; ++i)
    if (args[i].is_tensor && vdt[i] == KILN_BOOL) load_bool(e, b, v[i]);
  // Scalars become constants in the compute dtype.
  for (int i = 0; i < n; ++i) {
    if (args[i].is_tensor) continue;
    if (args[i].ssa[0]) memcpy(v[i], args[i].ssa, 24);  // captured from above
    else kiln_emit_scalar_const(e, b, ct, args[i].f, v[i]);
    vdt[i] = ct;
  }
  // Round every operand to the compute dtype, then widen halves for math.
  kiln_dtype_t mt = kiln_math_dtype(ct);
  char m[3][24];
  int first = 0;
  if (op == KILN_OP_WHERE) {
    snprintf(m[0], 24, "%s", v[0]);
    first = 1;
  }
  for (int i = first; i < n; ++i) {
    char r[24];
    conv_scalar(e, b, v[i], vdt[i], ct, r);
    conv_scalar(e, b, r, ct, mt, m[i]);
  }
  char res[24], fin[24];
  kiln_dtype_t rdt;
  KILN_RETURN_IF_ERROR_PLAIN(body_op(e, b, op, attrs, m, mt, res, &rdt));
  conv_scalar(e, b, res, rdt, out_dtype, fin);
  if (out_dtype == KILN_BOOL) store_bool(e, b, fin);
  kiln_sbuf_printf(b, "    linalg.yield %s : %s\n  } -> %s\n", fin,
                   kiln_mlir_storage_elem(out_dtype), oty);
  return NULL;
}

kiln_status_t kiln_emit_unary(kiln_emitter_t *e, kiln_op_id_t op,
                              const kiln_tv_t *x, kiln_dtype_t dt,
                              kiln_tv_t *out) {
  kiln_arg_t a = kiln_arg_tensor(x);
  return kiln_emit_ew(e, op, NULL, 1, &a, NULL, dt, dt, out);
}

kiln_status_t kiln_emit_binary(kiln_emitter_t *e, kiln_op_id_t op,
                               kiln_arg_t a, kiln_arg_t b, kiln_dtype_t dt,
                               kiln_tv_t *out) {
  kiln_arg_t args[2] = {a, b};
  return kiln_emit_ew(e, op, NULL, 2, args, NULL, dt, dt, out);
}

kiln_status_t kiln_emit_convert(kiln_emitter_t *e, const kiln_tv_t *x,
                                kiln_dtype_t to, kiln_tv_t *out) {
  if (x->type.dtype == to) {
    *out = *x;
    return NULL;
  }
  kiln_arg_t a = kiln_arg_tensor(x);
  return kiln_emit_ew(e, KILN_OP_CONVERT, NULL, 1, &a, NULL, x->type.dtype, to,
                      out);
}

//===--- fills, reductions, reshapes --------------------------------------===//

kiln_status_t kiln_emit_filled(kiln_emitter_t *e, const kiln_type_t *t,
                               double value, kiln_tv_t *out) {
  char empty[24], c[24], ty[256];
  kiln_emit_empty(e, t, empty);
  if (t->dtype == KILN_BOOL) {
    kiln_emit_fresh(e, c);
    kiln_sbuf_printf(&e->out, "    %s = arith.constant %d : i8\n", c, value != 0);
  } else {
    kiln_emit_scalar_const(e, &e->out, t->dtype, value, c);
  }
  kiln_mlir_tensor_type(t, ty, sizeof(ty));
  kiln_emit_fresh(e, out->ssa);
  out->type = *t;
  kiln_sbuf_printf(&e->out, "    %s = linalg.fill ins(%s : %s) outs(%s : %s) -> %s\n",
                   out->ssa, c, kiln_mlir_storage_elem(t->dtype), empty, ty, ty);
  return NULL;
}

// A reshape's reassociation, "[[0, 1], [2]]", from the group of each dim
// of the higher-rank side (groups ascending, each a contiguous run).
static void put_reassociation(kiln_sbuf_t *b, const int *group, int rank) {
  kiln_sbuf_puts(b, "[");
  for (int i = 0; i < rank; ++i) {
    bool opens = i == 0 || group[i] != group[i - 1];
    bool closes = i == rank - 1 || group[i + 1] != group[i];
    kiln_sbuf_printf(b, "%s%s%d%s", opens && i ? ", " : "", opens ? "[" : ", ", i,
                     closes ? "]" : "");
  }
  kiln_sbuf_puts(b, "]");
}

// Runs of adjacent reduced dims of a static `x` collapsed into one dim each
// (tensor.collapse_shape); false when there is no run of two or more.
static bool collapse_reduced_runs(kiln_emitter_t *e, const kiln_tv_t *x,
                                  const bool *reduced, kiln_tv_t *out,
                                  bool *out_reduced) {
  const kiln_type_t *xt = &x->type;
  if (!kiln_type_is_static(xt)) return false;
  int group[KILN_MAX_RANK], ngroups = 0;
  bool merged = false;
  kiln_type_t ct;
  memset(&ct, 0, sizeof(ct));
  ct.dtype = xt->dtype;
  for (int i = 0; i < xt->rank; ++i) {
    bool joins = i > 0 && reduced[i] && reduced[i - 1];
    if (joins) {
      ct.dims[ngroups - 1] *= xt->dims[i];
      merged = true;
    } else {
      out_reduced[ngroups] = reduced[i];
      ct.dims[ngroups++] = xt->dims[i];
    }
    group[i] = ngroups - 1;
  }
  if (!merged) return false;
  ct.rank = ngroups;
  char sty[256], cty[256];
  kiln_mlir_tensor_type(xt, sty, sizeof(sty));
  kiln_mlir_tensor_type(&ct, cty, sizeof(cty));
  kiln_emit_fresh(e, out->ssa);
  out->type = ct;
  kiln_sbuf_t *b = &e->out;
  kiln_sbuf_printf(b, "    %s = tensor.collapse_shape %s ", out->ssa, x->ssa);
  put_reassociation(b, group, xt->rank);
  kiln_sbuf_printf(b, " : %s into %s\n", sty, cty);
  return true;
}

// Rows for a reduction of all `n` elements split in two (see
// kiln_lower_options_t.split_full_reductions): P rows of n / P, P a power
// of two dividing n, rows of at least 1024 elements; 0 where n is below
// 64K elements (one thread's work) or has no such P.
static int64_t full_reduction_rows(int64_t n) {
  if (n < (1 << 16)) return 0;
  for (int64_t p = 256; p >= 8; p /= 2)
    if (n % p == 0 && n / p >= 1024) return p;
  return 0;
}

static kiln_status_t emit_reduce(kiln_emitter_t *e, kiln_op_id_t op,
                                 const kiln_tv_t *x, const bool *reduced,
                                 bool keepdim, kiln_dtype_t acc, bool nan_free,
                                 kiln_tv_t *out);

kiln_status_t kiln_emit_reduce(kiln_emitter_t *e, kiln_op_id_t op,
                               const kiln_tv_t *x, const bool *reduced,
                               bool keepdim, kiln_dtype_t acc, kiln_tv_t *out) {
  return emit_reduce(e, op, x, reduced, keepdim, acc, false, out);
}

kiln_status_t kiln_emit_reduce_max_nan_free(kiln_emitter_t *e, const kiln_tv_t *x,
                                            const bool *reduced, bool keepdim,
                                            kiln_dtype_t acc, kiln_tv_t *out) {
  return emit_reduce(e, KILN_OP_AMAX, x, reduced, keepdim, acc, true, out);
}

static kiln_status_t emit_reduce(kiln_emitter_t *e, kiln_op_id_t op,
                                 const kiln_tv_t *x, const bool *reduced,
                                 bool keepdim, kiln_dtype_t acc, bool nan_free,
                                 kiln_tv_t *out) {
  const kiln_type_t *xt0 = &x->type;
  bool all = xt0->rank > 0;
  for (int i = 0; i < xt0->rank; ++i) all &= reduced[i];
  int64_t rows = all && e->options.split_full_reductions && kiln_type_is_static(xt0)
                     ? full_reduction_rows(kiln_type_numel(xt0))
                     : 0;
  if (rows) {
    kiln_type_t t2 = *xt0;
    t2.rank = 2;
    t2.dims[0] = rows;
    t2.dims[1] = kiln_type_numel(xt0) / rows;
    kiln_tv_t x2, part, r;
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_reshape(e, x, &t2, &x2));
    bool by_row[KILN_MAX_RANK] = {false, true}, whole[KILN_MAX_RANK] = {true};
    KILN_RETURN_IF_ERROR_PLAIN(emit_reduce(e, op, &x2, by_row, false, acc, nan_free, &part));
    KILN_RETURN_IF_ERROR_PLAIN(emit_reduce(e, op, &part, whole, false, acc, nan_free, &r));
    if (!keepdim) {
      *out = r;
      return NULL;
    }
    kiln_type_t kt = *xt0;
    kt.dtype = acc;
    for (int i = 0; i < kt.rank; ++i) kt.dims[i] = 1;
    return kiln_emit_reshape(e, &r, &kt, out);
  }
  kiln_tv_t collapsed;
  bool creduced[KILN_MAX_RANK];
  if (e->options.collapse_reductions &&
      collapse_reduced_runs(e, x, reduced, &collapsed, creduced)) {
    kiln_tv_t r;
    KILN_RETURN_IF_ERROR_PLAIN(
        emit_reduce(e, op, &collapsed, creduced, false, acc, nan_free, &r));
    if (!keepdim) {
      *out = r;
      return NULL;
    }
    kiln_type_t kt = x->type;
    kt.dtype = acc;
    for (int i = 0; i < kt.rank; ++i)
      if (reduced[i]) kt.dims[i] = 1;
    return kiln_emit_reshape(e, &r, &kt, out);
  }
  const kiln_type_t *xt = &x->type;
  kiln_type_t rt;  // without the reduced dims
  memset(&rt, 0, sizeof(rt));
  rt.dtype = acc;
  for (int i = 0; i < xt->rank; ++i)
    if (!reduced[i]) rt.dims[rt.rank++] = xt->dims[i];
  bool fl = kiln_dtype_is_float(acc), bo = acc == KILN_BOOL;
  double init = 0;
  const char *combine = NULL;
  switch (op) {
    case KILN_OP_SUM:
      combine = bo ? "arith.ori" : fl ? "arith.addf" : "arith.addi";
      break;
    case KILN_OP_PROD:
      init = 1;
      combine = bo ? "arith.andi" : fl ? "arith.mulf" : "arith.muli";
      break;
    case KILN_OP_AMAX:
      init = fl ? -INFINITY : bo ? 0 : acc == KILN_I32 ? -2147483648.0
                                                       : -9223372036854775808.0;
      combine = bo          ? "arith.ori"
                : !fl         ? "arith.maxsi"
                : nan_free    ? "arith.maxnumf"
                              : "arith.maximumf";
      break;
    case KILN_OP_AMIN:
      init = fl ? INFINITY : bo ? 1 : acc == KILN_I32 ? 2147483647.0
                                                      : 9223372036854775807.0;
      combine = bo ? "arith.andi" : fl ? "arith.minimumf" : "arith.minsi";
      break;
    default:
      return kiln_emit_error(e, KILN_STATUS_INTERNAL, "bad reduction kind");
  }
  kiln_tv_t init_tv;
  if (!fl && !bo && (init > 9.2e18 || init < -9.2e18)) {
    // i64 extremes do not survive a trip through double: write them exactly.
    char empty[24], c[24], ty[256];
    kiln_emit_empty(e, &rt, empty);
    kiln_emit_fresh(e, c);
    kiln_sbuf_printf(&e->out, "    %s = arith.constant %s : i64\n", c,
                     init > 0 ? "9223372036854775807" : "-9223372036854775808");
    kiln_mlir_tensor_type(&rt, ty, sizeof(ty));
    kiln_emit_fresh(e, init_tv.ssa);
    init_tv.type = rt;
    kiln_sbuf_printf(&e->out,
                     "    %s = linalg.fill ins(%s : i64) outs(%s : %s) -> %s\n",
                     init_tv.ssa, c, empty, ty, ty);
  } else {
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_filled(e, &rt, init, &init_tv));
  }
  kiln_sbuf_t *b = &e->out;
  char xty[256], rty[256];
  kiln_mlir_tensor_type(xt, xty, sizeof(xty));
  kiln_mlir_tensor_type(&rt, rty, sizeof(rty));
  kiln_tv_t red;
  kiln_emit_fresh(e, red.ssa);
  red.type = rt;
  kiln_sbuf_printf(b, "    %s = linalg.generic {indexing_maps = [", red.ssa);
  bcast_map(b, xt, xt);
  kiln_sbuf_puts(b, ", affine_map<(");
  for (int i = 0; i < xt->rank; ++i) kiln_sbuf_printf(b, "%sd%d", i ? ", " : "", i);
  kiln_sbuf_puts(b, ") -> (");
  for (int i = 0, k = 0; i < xt->rank; ++i)
    if (!reduced[i]) kiln_sbuf_printf(b, "%sd%d", k++ ? ", " : "", i);
  kiln_sbuf_puts(b, ")>], ");
  iterators(b, xt->rank, reduced);
  char a[24], o[24], xc[24], r[24];
  snprintf(a, 24, "%%rin%d", e->next_id);
  snprintf(o, 24, "%%acc%d", e->next_id++);
  kiln_sbuf_printf(b, "} ins(%s : %s) outs(%s : %s) {\n  ^bb0(%s: %s, %s: %s):\n",
                   x->ssa, xty, init_tv.ssa, rty, a,
                   kiln_mlir_storage_elem(xt->dtype), o,
                   kiln_mlir_storage_elem(acc));
  if (xt->dtype == KILN_BOOL) load_bool(e, b, a);
  conv_scalar(e, b, a, xt->dtype, acc, xc);
  // A bool accumulator combines in its i8 storage (0 or 1: ori, andi), the
  // element widened to it: MLIR's reduction matcher, which the schedule's
  // reduction tiling needs, takes one combining op, not a load and a store
  // of the i1 around it (the math-form attention's _safe_softmax row test).
  if (acc == KILN_BOOL) store_bool(e, b, xc);
  inst(e, b, r, combine, o, xc, kiln_mlir_storage_elem(acc));
  kiln_sbuf_printf(b, "    linalg.yield %s : %s\n  } -> %s\n", r,
                   kiln_mlir_storage_elem(acc), rty);
  if (!keepdim) {
    *out = red;
    return NULL;
  }
  kiln_type_t kt = *xt;
  kt.dtype = acc;
  for (int i = 0; i < xt->rank; ++i)
    if (reduced[i]) kt.dims[i] = 1;
  return kiln_emit_reshape(e, &red, &kt, out);
}

// Maps the dims of `small` onto `big` when `big` is `small` with unit dims
// inserted: group[j] is the dim of `small` that dim j of `big` joins (a
// unit dim joins the next matched dim, trailing ones the last). False when
// the shapes differ otherwise, or `small` has rank 0.
static bool unit_groups(const kiln_type_t *small, const kiln_type_t *big,
                        int *group) {
  if (small->rank == 0 || small->rank >= big->rank) return false;
  int i = 0;
  for (int j = 0; j < big->rank; ++j) {
    if (i < small->rank && big->dims[j] == small->dims[i]) {
      group[j] = i++;
    } else if (big->dims[j] == 1) {
      group[j] = i < small->rank ? i : small->rank - 1;
    } else {
      return false;
    }
  }
  return i == small->rank;
}

// An unsqueeze or squeeze (the shapes differ by unit dims only) as one
// tensor.expand_shape or collapse_shape. The general path below goes
// through rank 1, and MLIR 22.1's expand-strided-metadata crashes on an
// expand_shape whose one group holds two symbolic dims.
static bool emit_unit_reshape(kiln_emitter_t *e, const kiln_tv_t *x,
                              const kiln_type_t *target, kiln_tv_t *out) {
  int group[KILN_MAX_RANK];
  bool expand = unit_groups(&x->type, target, group);
  if (!expand && !unit_groups(target, &x->type, group)) return false;
  const kiln_type_t *big = expand ? target : &x->type;
  char sty[256], tty[256];
  kiln_mlir_tensor_type(&x->type, sty, sizeof(sty));
  kiln_mlir_tensor_type(target, tty, sizeof(tty));
  kiln_emit_fresh(e, out->ssa);
  out->type = *target;
  kiln_sbuf_t *b = &e->out;
  kiln_sbuf_printf(b, "    %s = tensor.%s %s ", out->ssa,
                   expand ? "expand_shape" : "collapse_shape", x->ssa);
  put_reassociation(b, group, big->rank);
  if (expand) {
    kiln_sbuf_puts(b, " output_shape [");
    kiln_emit_size_list(e, target);
    kiln_sbuf_puts(b, "]");
  }
  kiln_sbuf_printf(b, " : %s into %s\n", sty, tty);
  return true;
}

// Splits a reshape into groups of consecutive dims with equal products
// ([s0, 128, 3, 256] into [128*s0, 768]: {s0, 128} -> {128*s0} and
// {3, 256} -> {768}), compared as monomials so that symbolic sizes match:
// src_group[i] / dst_group[j] is the group of each dim. Unit dims past the
// last match join the last group. False when no such split exists.
static bool product_groups(const kiln_graph_t *g, const kiln_type_t *src,
                           const kiln_type_t *dst, int *src_group,
                           int *dst_group, int *ngroups) {
  int i = 0, j = 0, n = 0;
  while (i < src->rank && j < dst->rank) {
    kiln_monomial_t ms, mt, q;
    kiln_dim_monomial(g, src->dims[i], &ms);
    kiln_dim_monomial(g, dst->dims[j], &mt);
    src_group[i++] = n;
    dst_group[j++] = n;
    while (!kiln_monomial_equal(&ms, &mt)) {
      // Grow the side whose product the other's divides.
      if (kiln_monomial_div(&ms, &mt, &q) && j < dst->rank) {
        if (!kiln_monomial_mul_dim(g, &mt, dst->dims[j])) return false;
        dst_group[j++] = n;
      } else if (kiln_monomial_div(&mt, &ms, &q) && i < src->rank) {
        if (!kiln_monomial_mul_dim(g, &ms, src->dims[i])) return false;
        src_group[i++] = n;
      } else {
        return false;
      }
    }
    n++;
  }
  if (n == 0) return false;
  for (; i < src->rank; ++i) {
    if (src->dims[i] != 1) return false;
    src_group[i] = n - 1;
  }
  for (; j < dst->rank; ++j) {
    if (dst->dims[j] != 1) return false;
    dst_group[j] = n - 1;
  }
  *ngroups = n;
  return true;
}

// A reshape with several symbolic sizes as a collapse to one dim per group
// of product_groups, then an expand: each group holds one symbolic size at
// most, which MLIR's expand-strided-metadata handles. False when the
// shapes have no such groups.
static bool emit_grouped_reshape(kiln_emitter_t *e, const kiln_tv_t *x,
                                 const kiln_type_t *target, kiln_tv_t *out) {
  int sg[KILN_MAX_RANK], tg[KILN_MAX_RANK], n = 0;
  if (!product_groups(e->g, &x->type, target, sg, tg, &n)) return false;
  for (int k = 0; k < n; ++k) {
    int src_syms = 0, dst_syms = 0;
    for (int j = 0; j < target->rank; ++j) dst_syms += tg[j] == k && KILN_IS_SYM(target->dims[j]);
    for (int i = 0; i < x->type.rank; ++i) src_syms += sg[i] == k && KILN_IS_SYM(x->type.dims[i]);
    if (src_syms > 1 || dst_syms > 1) return false;
  }
  // The middle shape: one dim per group, the group's target product.
  kiln_type_t mid;
  memset(&mid, 0, sizeof(mid));
  mid.dtype = x->type.dtype;
  mid.rank = n;
  for (int k = 0; k < n; ++k) {
    int64_t stat = 1;
    bool sym = false;
    for (int j = 0; j < target->rank; ++j)
      if (tg[j] == k) {
        if (KILN_IS_SYM(target->dims[j])) sym = true;
        else stat *= target->dims[j];
      }
    mid.dims[k] = sym ? KILN_SYM(0) : stat;  // only '?' is printed for it
  }
  kiln_sbuf_t *b = &e->out;
  char sty[256], mty[256], tty[256], cur[24];
  kiln_mlir_tensor_type(&x->type, sty, sizeof(sty));
  kiln_mlir_tensor_type(&mid, mty, sizeof(mty));
  kiln_mlir_tensor_type(target, tty, sizeof(tty));
  snprintf(cur, sizeof(cur), "%s", x->ssa);
  if (x->type.rank != n) {
    kiln_emit_fresh(e, cur);
    kiln_sbuf_printf(b, "    %s = tensor.collapse_shape %s ", cur, x->ssa);
    put_reassociation(b, sg, x->type.rank);
    kiln_sbuf_printf(b, " : %s into %s\n", sty, mty);
  } else if (strcmp(sty, mty) != 0) {
    // Same rank, static and symbolic sizes traded: a cast.
    kiln_emit_fresh(e, cur);
    kiln_sbuf_printf(b, "    %s = tensor.cast %s : %s to %s\n", cur, x->ssa, sty, mty);
  }
  out->type = *target;
  if (target->rank == n) {
    if (strcmp(mty, tty) == 0) {
      snprintf(out->ssa, sizeof(out->ssa), "%s", cur);
    } else {
      kiln_emit_fresh(e, out->ssa);
      kiln_sbuf_printf(b, "    %s = tensor.cast %s : %s to %s\n", out->ssa, cur, mty, tty);
    }
    return true;
  }
  kiln_emit_fresh(e, out->ssa);
  kiln_sbuf_printf(b, "    %s = tensor.expand_shape %s ", out->ssa, cur);
  put_reassociation(b, tg, target->rank);
  kiln_sbuf_puts(b, " output_shape [");
  kiln_emit_size_list(e, target);
  kiln_sbuf_printf(b, "] : %s into %s\n", mty, tty);
  return true;
}

void kiln_emit_view(kiln_emitter_t *e, const kiln_tv_t *x,
                    const kiln_type_t *to, kiln_tv_t *out) {
  char shape[24], xty[256], oty[256];
  kiln_emit_fresh(e, shape);
  kiln_sbuf_printf(&e->out, "    %s = arith.constant dense<[", shape);
  for (int i = 0; i < to->rank; ++i)
    kiln_sbuf_printf(&e->out, "%s%lld", i ? ", " : "", (long long)to->dims[i]);
  kiln_sbuf_printf(&e->out, "]> : tensor<%dxi64>\n", to->rank);
  kiln_type_t target = *to;
  target.dtype = x->type.dtype;
  kiln_mlir_tensor_type(&x->type, xty, sizeof(xty));
  kiln_mlir_tensor_type(&target, oty, sizeof(oty));
  kiln_emit_fresh(e, out->ssa);
  out->type = target;
  kiln_sbuf_printf(&e->out, "    %s = tensor.reshape %s(%s) : (%s, tensor<%dxi64>) -> %s\n",
                   out->ssa, x->ssa, shape, xty, to->rank, oty);
}

// Slabs of at most this many elements: a slab is one bufferized copy
// (memref.copy of subviews), and one lone insert_slice of that size is
// what the vectorizer may turn into a single vector. That vector is
// unrolled into one transfer per row of its last dim, so a slab also has
// at most kInsertSlabRows rows: a piece [64, 32, 4, 1] of a cat along its
// last dim (8192 elements, each its own row) took LLVM 18 s to compile as
// one vector<64x32x4x1xf32>.
enum { kInsertSlabElems = 16384, kInsertSlabRows = 256 };

void kiln_emit_insert_slabs(kiln_emitter_t *e, const kiln_tv_t *src,
                            const kiln_tv_t *dst, const int64_t *offsets,
                            bool loop_one_slab, kiln_tv_t *out) {
  const kiln_type_t *st = &src->type;
  int r = st->rank;
  // Loops over dims [0, j), dim j in chunks of `cb`, whole dims after j:
  // j is the first dim whose trailing product fits a slab.
  // (rows: prod(dims[j..r-1)), the rows of the last dim.)
  int64_t inner = 1, rows = 1;
  int j = r;
  while (j > 0 && inner * st->dims[j - 1] <= kInsertSlabElems &&
         (j == r || rows * st->dims[j - 1] <= kInsertSlabRows)) {
    if (j < r) rows *= st->dims[j - 1];
    inner *= st->dims[--j];
  }
  // Here inner = prod(dims[j..]) fits; split dim j - 1 into chunks. (A
  // piece with no elements is one empty insert: a last dim of 0 makes inner
  // 0 and would stop the walk at the row cap.)
  int64_t cb = 1, iters = 1;
  bool empty = inner == 0 || rows == 0;
  if (!empty && j > 0) {
    --j;
    int64_t most = kInsertSlabElems / inner;
    for (int64_t c = st->dims[j] < most ? st->dims[j] : most; c >= 1; --c)
      if (st->dims[j] % c == 0 && c * inner <= kInsertSlabElems &&
          (j == r - 1 || c * rows <= kInsertSlabRows)) {
        cb = c;
        break;
      }
    for (int k = 0; k < j; ++k) iters *= st->dims[k];
    iters *= st->dims[j] / cb;
  } else if (!empty && loop_one_slab) {
    // All of src fits one slab: a loop over its first dim that is not 1.
    while (j < r && st->dims[j] == 1) ++j;
    if (j < r) iters = st->dims[j];
  }
  char sty[256], dty[256];
  kiln_mlir_tensor_type(st, sty, sizeof(sty));
  kiln_mlir_tensor_type(&dst->type, dty, sizeof(dty));
  kiln_sbuf_t *b = &e->out;
  kiln_emit_fresh(e, out->ssa);
  out->type = dst->type;
  if (iters < 2) {
    // One slab: a plain insert_slice (small enough to vectorize whole).
    kiln_sbuf_printf(b, "    %s = tensor.insert_slice %s into %s[", out->ssa, src->ssa,
                     dst->ssa);
    for (int k = 0; k < r; ++k)
      kiln_sbuf_printf(b, "%s%lld", k ? ", " : "", (long long)offsets[k]);
    kiln_sbuf_puts(b, "] [");
    kiln_emit_size_list(e, st);
    kiln_sbuf_puts(b, "] [");
    for (int k = 0; k < r; ++k) kiln_sbuf_printf(b, "%s1", k ? ", " : "");
    kiln_sbuf_printf(b, "] : %s into %s\n", sty, dty);
    return;
  }
  kiln_type_t slab = *st;
  for (int k = 0; k < j; ++k) slab.dims[k] = 1;
  slab.dims[j] = cb;
  char slty[256];
  kiln_mlir_tensor_type(&slab, slty, sizeof(slty));
  int id = e->next_id++;
  // Loop k < j runs over dim k, loop j over the chunks of dim j (unit
  // loops fold away). Source offsets: the ivs (chunk iv * cb); destination
  // offsets: those plus `offsets`.
  kiln_sbuf_printf(b, "    %s = scf.forall (", out->ssa);
  for (int k = 0; k <= j; ++k) kiln_sbuf_printf(b, "%s%%sl%d_%d", k ? ", " : "", id, k);
  kiln_sbuf_puts(b, ") in (");
  for (int k = 0; k <= j; ++k)
    kiln_sbuf_printf(b, "%s%lld", k ? ", " : "",
                     (long long)(k < j ? st->dims[k] : st->dims[j] / cb));
  kiln_sbuf_printf(b, ") shared_outs(%%so%d = %s) -> (%s) {\n", id, dst->ssa, dty);
  for (int k = 0; k <= j; ++k) {
    long long mul = k == j ? cb : 1;
    kiln_sbuf_printf(b,
                     "      %%ss%d_%d = affine.apply affine_map<(d0) -> (d0 * %lld)>(%%sl%d_%d)\n"
                     "      %%sd%d_%d = affine.apply affine_map<(d0) -> (d0 * %lld + %lld)>"
                     "(%%sl%d_%d)\n",
                     id, k, mul, id, k, id, k, mul, (long long)offsets[k], id, k);
  }
  kiln_sbuf_printf(b, "      %%sx%d = tensor.extract_slice %s[", id, src->ssa);
  for (int k = 0; k < r; ++k) {
    if (k <= j)
      kiln_sbuf_printf(b, "%s%%ss%d_%d", k ? ", " : "", id, k);
    else
      kiln_sbuf_printf(b, "%s0", k ? ", " : "");
  }
  kiln_sbuf_puts(b, "] [");
  kiln_emit_size_list(e, &slab);
  kiln_sbuf_puts(b, "] [");
  for (int k = 0; k < r; ++k) kiln_sbuf_printf(b, "%s1", k ? ", " : "");
  kiln_sbuf_printf(b, "] : %s to %s\n      scf.forall.in_parallel {\n"
                      "        tensor.parallel_insert_slice %%sx%d into %%so%d[",
                   sty, slty, id, id);
  for (int k = 0; k < r; ++k) {
    if (k <= j)
      kiln_sbuf_printf(b, "%s%%sd%d_%d", k ? ", " : "", id, k);
    else
      kiln_sbuf_printf(b, "%s%lld", k ? ", " : "", (long long)offsets[k]);
  }
  kiln_sbuf_puts(b, "] [");
  kiln_emit_size_list(e, &slab);
  kiln_sbuf_puts(b, "] [");
  for (int k = 0; k < r; ++k) kiln_sbuf_printf(b, "%s1", k ? ", " : "");
  kiln_sbuf_printf(b, "] : %s into %s\n      }\n    }\n", slty, dty);
}

// dst[N, C, rows at r0, cols at c0] = v (scalar SSA value), in place, by
// an scf.forall over slabs [1, cb, rb, kb] (kInsertSlabElems elements and
// kInsertSlabRows rows at most where the sizes have such divisors), each
// filled by a linalg.fill of its slice of the shared output. A fill of a
// tensor of its own inserted by slabs went through memrefCopy one element
// at a time for a one-column border (0.3 ms of a UNet's pads).
static void fill_slabs(kiln_emitter_t *e, const kiln_tv_t *dst, int64_t r0, int64_t c0,
                       int64_t rows, int64_t cols, const char *v, kiln_tv_t *out) {
  const int64_t N = dst->type.dims[0], C = dst->type.dims[1];
  int64_t kb = cols, rb = 1, cb = 1;
  if (cols > kInsertSlabElems)
    for (int64_t k = kInsertSlabElems; k >= 1; --k)
      if (cols % k == 0) {
        kb = k;
        break;
      }
  for (int64_t r = rows < kInsertSlabRows ? rows : kInsertSlabRows; r >= 1; --r)
    if (rows % r == 0 && r * kb <= kInsertSlabElems) {
      rb = r;
      break;
    }
  // At least two slabs wherever the sizes allow: a loop of one iteration
  // folds away, and the insert of its fill left at the top level is then
  // vectorized whole (a vector of the whole border).
  const int64_t most_c = N * (rows / rb) * (cols / kb) > 1 ? C : C / 2 > 0 ? C / 2 : 1;
  if (rb == rows && kb == cols)
    for (int64_t c = most_c; c >= 1; --c)
      if (C % c == 0 && c * rb <= kInsertSlabRows && c * rb * kb <= kInsertSlabElems) {
        cb = c;
        break;
      }
  if (N * (C / cb) * (rows / rb) * (cols / kb) < 2) {
    int64_t *d = rows > 1 ? &rb : &kb, size = rows > 1 ? rows : cols;
    for (int64_t x = size / 2; x >= 1; --x)
      if (size % x == 0) {
        *d = x;
        break;
      }
  }
  kiln_type_t slab = {.dtype = dst->type.dtype, .rank = 4, .dims = {1, cb, rb, kb}};
  char sty[128], dty[256];
  kiln_mlir_tensor_type(&slab, sty, sizeof(sty));
  kiln_mlir_tensor_type(&dst->type, dty, sizeof(dty));
  int id = e->next_id++;
  kiln_sbuf_t *b = &e->out;
  kiln_emit_fresh(e, out->ssa);
  out->type = dst->type;
  kiln_sbuf_printf(b,
                   "    %s = scf.forall (%%fn%d, %%fc%d, %%fr%d, %%fk%d) in (%lld, %lld, %lld, "
                   "%lld) shared_outs(%%fo%d = %s) -> (%s) {\n",
                   out->ssa, id, id, id, id, (long long)N, (long long)(C / cb),
                   (long long)(rows / rb), (long long)(cols / kb), id, dst->ssa, dty);
  kiln_sbuf_printf(b,
                   "      %%fC%d = affine.apply affine_map<(d0) -> (d0 * %lld)>(%%fc%d)\n"
                   "      %%fR%d = affine.apply affine_map<(d0) -> (d0 * %lld + %lld)>(%%fr%d)\n"
                   "      %%fK%d = affine.apply affine_map<(d0) -> (d0 * %lld + %lld)>(%%fk%d)\n",
                   id, (long long)cb, id, id, (long long)rb, (long long)r0, id, id,
                   (long long)kb, (long long)c0, id);
  char at[160];
  snprintf(at, sizeof(at), "[%%fn%d, %%fC%d, %%fR%d, %%fK%d] [1, %lld, %lld, %lld] [1, 1, 1, 1]",
           id, id, id, id, (long long)cb, (long long)rb, (long long)kb);
  kiln_sbuf_printf(b, "      %%fs%d = tensor.extract_slice %%fo%d%s : %s to %s\n", id, id, at,
                   dty, sty);
  kiln_sbuf_printf(b, "      %%ff%d = linalg.fill ins(%s : %s) outs(%%fs%d : %s) -> %s\n", id,
                   v, kiln_mlir_storage_elem(dst->type.dtype), id, sty, sty);
  kiln_sbuf_printf(b,
                   "      scf.forall.in_parallel {\n"
                   "        tensor.parallel_insert_slice %%ff%d into %%fo%d%s : %s into %s\n"
                   "      }\n    }\n",
                   id, id, at, sty, dty);
}

// The whole border of dst's planes (rows [0, lo_h) and [lo_h + H, Hp),
// columns [0, lo_w) and [lo_w + W, Wp) of the rows between) = v, in place,
// by one scf.forall over the planes: each takes its plane of the shared
// output, writes the value into its up to four regions and inserts the
// plane. The rows above and below are one vector write each, unrolled
// (rows writes of Wp lanes); the columns are an scf.for over the H rows,
// one write each. Tried first:
//   - one loop per region: a parallel region each, four forks and joins a
//     pad (0.35 ms of MobileNetV2's);
//   - slices of the shared output per region in one loop: bufferized to
//     copies of each region out and back;
//   - each region one unrolled write: a 112-row column was 224 scalar
//     stores per block, which tripled a max pool's compile time, and a
//     16000-wide row took 5 s to compile (found by review);
//   - blocks of several planes (up to 32 stores unrolled): their address
//     arithmetic took MobileNetV2's LLVM time from 2.5-2.7 to 4.7-5.0 s;
//     a plane a block, 2.8-3.0 s, and the same run time.
// With one plane (N = C = 1) the loop of one iteration folds away and the
// writes go straight into the whole tensor on one thread. False, and
// nothing emitted, when one plane's rows above and below take more than
// 256 stores (rows of thousands of floats) or a column is wider than
// kBorderColumn.
enum { kBorderColumn = 64 };

static bool fill_border(kiln_emitter_t *e, const kiln_tv_t *dst, const int64_t border[4][4],
                        const char *v, kiln_tv_t *out) {
  const int64_t N = dst->type.dims[0], C = dst->type.dims[1];
  const int64_t Hp = dst->type.dims[2], Wp = dst->type.dims[3];
  // 16-lane stores of one plane's rows above and below; the widest column.
  const int64_t row_stores = (border[0][2] + border[1][2]) * ((Wp + 15) / 16);
  const int64_t col = border[2][3] > border[3][3] ? border[2][3] : border[3][3];
  if (row_stores > 256 || col > kBorderColumn) return false;
  const int64_t cb = 1;
  kiln_type_t block = {.dtype = dst->type.dtype, .rank = 4, .dims = {1, cb, Hp, Wp}};
  char dty[256], bty[256];
  kiln_mlir_tensor_type(&dst->type, dty, sizeof(dty));
  kiln_mlir_tensor_type(&block, bty, sizeof(bty));
  const char *el = kiln_mlir_storage_elem(dst->type.dtype);
  int id = e->next_id++;
  kiln_sbuf_t *b = &e->out;
  kiln_emit_fresh(e, out->ssa);
  out->type = dst->type;
  char at[96];
  snprintf(at, sizeof(at), "[%%bn%d, %%bC%d, 0, 0] [1, %lld, %lld, %lld] [1, 1, 1, 1]", id, id,
           (long long)cb, (long long)Hp, (long long)Wp);
  kiln_sbuf_printf(b,
                   "    %s = scf.forall (%%bn%d, %%bc%d) in (%lld, %lld) shared_outs(%%bo%d = %s) "
                   "-> (%s) {\n"
                   "      %%bC%d = affine.apply affine_map<(d0) -> (d0 * %lld)>(%%bc%d)\n"
                   "      %%bb%d_0 = tensor.extract_slice %%bo%d%s : %s to %s\n"
                   "      %%bz%d = arith.constant 0 : index\n"
                   "      %%b1%d = arith.constant 1 : index\n",
                   out->ssa, id, id, (long long)N, (long long)(C / cb), id, dst->ssa, dty, id,
                   (long long)cb, id, id, id, at, dty, bty, id, id);
  int last = 0;
  for (int k = 0; k < 4; ++k) {
    if (!border[k][2] || !border[k][3]) continue;
    const bool column = k >= 2;
    char vty[128];
    snprintf(vty, sizeof(vty), "vector<1x%lldx%lldx%lldx%s>", (long long)cb,
             (long long)(column ? 1 : border[k][2]), (long long)border[k][3], el);
    kiln_sbuf_printf(b,
                     "      %%br%d_%d = arith.constant %lld : index\n"
                     "      %%bk%d_%d = arith.constant %lld : index\n"
                     "      %%bv%d_%d = vector.broadcast %s : %s to %s\n",
                     id, k, (long long)border[k][0], id, k, (long long)border[k][1], id, k, v, el,
                     vty);
    if (!column) {
      kiln_sbuf_printf(b,
                       "      %%bb%d_%d = vector.transfer_write %%bv%d_%d, %%bb%d_%d[%%bz%d, "
                       "%%bz%d, %%br%d_%d, %%bk%d_%d] {in_bounds = [true, true, true, true]} "
                       ": %s, %s\n",
                       id, k + 1, id, k, id, last, id, id, id, k, id, k, vty, bty);
    } else {
      kiln_sbuf_printf(b,
                       "      %%be%d_%d = arith.constant %lld : index\n"
                       "      %%bb%d_%d = scf.for %%bi%d_%d = %%br%d_%d to %%be%d_%d step %%b1%d "
                       "iter_args(%%bt%d_%d = %%bb%d_%d) -> (%s) {\n"
                       "        %%bw%d_%d = vector.transfer_write %%bv%d_%d, %%bt%d_%d[%%bz%d, "
                       "%%bz%d, %%bi%d_%d, %%bk%d_%d] {in_bounds = [true, true, true, true]} "
                       ": %s, %s\n"
                       "        scf.yield %%bw%d_%d : %s\n"
                       "      }\n",
                       id, k, (long long)(border[k][0] + border[k][2]), id, k + 1, id, k, id, k,
                       id, k, id, id, k, id, last, bty, id, k, id, k, id, k, id, id, id, k, id,
                       k, vty, bty, id, k, bty);
    }
    last = k + 1;
  }
  kiln_sbuf_printf(b,
                   "      scf.forall.in_parallel {\n"
                   "        tensor.parallel_insert_slice %%bb%d_%d into %%bo%d%s : %s into %s\n"
                   "      }\n    }\n",
                   id, last, id, at, bty, dty);
  return true;
}

kiln_status_t kiln_emit_pad_border(kiln_emitter_t *e, const kiln_tv_t *dst, int64_t lo_h,
                                   int64_t lo_w, int64_t H, int64_t W, double value,
                                   kiln_tv_t *out) {
  const int64_t Hp = dst->type.dims[2], Wp = dst->type.dims[3];
  const int64_t hi_h = Hp - lo_h - H, hi_w = Wp - lo_w - W;
  if (hi_h < 0 || hi_w < 0 || lo_h < 0 || lo_w < 0)
    return kiln_emit_error(e, KILN_STATUS_INTERNAL,
                           "padding planes of %lld x %lld into %lld x %lld at (%lld, %lld)",
                           (long long)H, (long long)W, (long long)Hp, (long long)Wp,
                           (long long)lo_h, (long long)lo_w);
  // The border: whole rows above and below the planes, then the columns
  // left and right of their rows.
  const int64_t border[4][4] = {{0, 0, lo_h, Wp},
                                {lo_h + H, 0, hi_h, Wp},
                                {lo_h, 0, H, lo_w},
                                {lo_h, lo_w + W, H, hi_w}};
  char v[24];
  if (dst->type.dtype == KILN_BOOL) {  // (bool is stored as i8, as kiln_emit_filled does)
    kiln_emit_fresh(e, v);
    kiln_sbuf_printf(&e->out, "    %s = arith.constant %d : i8\n", v, value != 0);
  } else {
    kiln_emit_scalar_const(e, &e->out, dst->type.dtype, value, v);
  }
  if (fill_border(e, dst, border, v, out)) return NULL;
  kiln_tv_t cur = *dst;
  for (int k = 0; k < 4; ++k) {
    if (!border[k][2] || !border[k][3]) continue;
    kiln_tv_t next;
    fill_slabs(e, &cur, border[k][0], border[k][1], border[k][2], border[k][3], v, &next);
    cur = next;
  }
  *out = cur;
  return NULL;
}

kiln_status_t kiln_emit_pad_planes(kiln_emitter_t *e, const kiln_tv_t *pieces, int count,
                                   const kiln_type_t *pt, int64_t lo_h, int64_t lo_w,
                                   double value, kiln_tv_t *out) {
  kiln_tv_t cur = {.type = *pt};
  kiln_emit_empty(e, pt, cur.ssa);
  int64_t c = 0;
  for (int i = 0; i < count; ++i) {
    kiln_tv_t next;
    const int64_t at[4] = {0, c, lo_h, lo_w};
    kiln_emit_insert_slabs(e, &pieces[i], &cur, at, true, &next);
    cur = next;
    c += pieces[i].type.dims[1];
  }
  return kiln_emit_pad_border(e, &cur, lo_h, lo_w, pieces[0].type.dims[2],
                              pieces[0].type.dims[3], value, out);
}

kiln_status_t kiln_emit_reshape(kiln_emitter_t *e, const kiln_tv_t *x,
                                const kiln_type_t *to, kiln_tv_t *out) {
  kiln_type_t target = *to;
  target.dtype = x->type.dtype;
  if (kiln_type_equal(&x->type, &target)) {
    *out = *x;
    return NULL;
  }
  if (emit_unit_reshape(e, x, &target, out)) return NULL;
  // The general path expands from rank 1 in one group: with two symbolic
  // sizes in it, MLIR 22.1 crashes lowering it (expand-strided-metadata).
  int symbolic = 0, src_symbolic = 0;
  for (int i = 0; i < target.rank; ++i) symbolic += KILN_IS_SYM(target.dims[i]);
  for (int i = 0; i < x->type.rank; ++i) src_symbolic += KILN_IS_SYM(x->type.dims[i]);
  if ((symbolic > 1 || src_symbolic > 1) && emit_grouped_reshape(e, x, &target, out))
    return NULL;
  if (symbolic > 1 || src_symbolic > 1) {
    // Two symbolic sizes in one group ([s0*s1, 256] into [s0, s1, 256]): a
    // tensor.reshape to a shape built from the sizes. A collapse_shape or
    // expand_shape of such a group is where MLIR 22.1's
    // expand-strided-metadata crashes (a null stride building the
    // reinterpret_cast), and linalg's reshape propagation would carry one
    // onto the operands of the ops around it; it leaves tensor.reshape be.
    kiln_sbuf_t *b = &e->out;
    char sizes[KILN_MAX_RANK][24], shape[24], xty[256], oty[256];
    for (int i = 0; i < target.rank; ++i) {
      if (KILN_IS_SYM(target.dims[i])) {
        snprintf(sizes[i], 24, "%s", e->sym_ssa[KILN_SYM_ID(target.dims[i])]);
      } else {
        kiln_emit_fresh(e, sizes[i]);
        kiln_sbuf_printf(b, "    %s = arith.constant %lld : index\n", sizes[i],
                         (long long)target.dims[i]);
      }
    }
    kiln_emit_fresh(e, shape);
    kiln_sbuf_printf(b, "    %s = tensor.from_elements ", shape);
    for (int i = 0; i < target.rank; ++i)
      kiln_sbuf_printf(b, "%s%s", i ? ", " : "", sizes[i]);
    kiln_sbuf_printf(b, " : tensor<%dxindex>\n", target.rank);
    kiln_mlir_tensor_type(&x->type, xty, sizeof(xty));
    kiln_mlir_tensor_type(&target, oty, sizeof(oty));
    kiln_emit_fresh(e, out->ssa);
    kiln_sbuf_printf(b, "    %s = tensor.reshape %s(%s) : (%s, tensor<%dxindex>) -> %s\n",
                     out->ssa, x->ssa, shape, xty, target.rank, oty);
    out->type = target;
    return NULL;
  }
  kiln_sbuf_t *b = &e->out;
  // The flat size: static when every dim is, else "?".
  kiln_type_t flat;
  memset(&flat, 0, sizeof(flat));
  flat.dtype = x->type.dtype;
  flat.rank = 1;
  flat.dims[0] = kiln_type_is_static(&x->type) ? kiln_type_numel(&x->type)
                                               : KILN_SYM(0);
  char sty[256], fty[256], tty[256];
  kiln_mlir_tensor_type(&x->type, sty, sizeof(sty));
  kiln_mlir_tensor_type(&flat, fty, sizeof(fty));
  kiln_mlir_tensor_type(&target, tty, sizeof(tty));
  // Step 1: to rank 1.
  char cur[24];
  snprintf(cur, 24, "%s", x->ssa);
  if (x->type.rank != 1) {
    char nxt[24];
    kiln_emit_fresh(e, nxt);
    if (x->type.rank == 0)
      kiln_sbuf_printf(b, "    %s = tensor.expand_shape %s [] output_shape [1] "
                          ": %s into %s\n", nxt, cur, sty, fty);
    else {
      kiln_sbuf_printf(b, "    %s = tensor.collapse_shape %s [[", nxt, cur);
      for (int i = 0; i < x->type.rank; ++i) kiln_sbuf_printf(b, "%s%d", i ? ", " : "", i);
      kiln_sbuf_printf(b, "]] : %s into %s\n", sty, fty);
    }
    snprintf(cur, 24, "%s", nxt);
  } else if (KILN_IS_SYM(x->type.dims[0]) != KILN_IS_SYM(flat.dims[0])) {
    snprintf(fty, sizeof(fty), "%s", sty);
  }
  // Step 2: to the target rank.
  if (target.rank != 1) {
    kiln_emit_fresh(e, out->ssa);
    if (target.rank == 0) {
      kiln_sbuf_printf(b, "    %s = tensor.collapse_shape %s [] : %s into %s\n",
                       out->ssa, cur, fty, tty);
    } else {
      kiln_sbuf_printf(b, "    %s = tensor.expand_shape %s [[", out->ssa, cur);
      for (int i = 0; i < target.rank; ++i) kiln_sbuf_printf(b, "%s%d", i ? ", " : "", i);
      kiln_sbuf_puts(b, "]] output_shape [");
      kiln_emit_size_list(e, &target);
      kiln_sbuf_printf(b, "] : %s into %s\n", fty, tty);
    }
  } else if (x->type.rank != 1 && !kiln_type_is_static(&x->type) &&
             kiln_type_is_static(&target)) {
    // A dynamic flat tensor into a static rank-1 target.
    kiln_emit_fresh(e, out->ssa);
    kiln_sbuf_printf(b, "    %s = tensor.cast %s : %s to %s\n", out->ssa, cur,
                     fty, tty);
  } else {
    snprintf(out->ssa, 24, "%s", cur);
  }
  out->type = target;
  return NULL;
}
