// Contractions: linalg.matmul / batch_matmul and the 2-D convolutions, with
// f16/bf16 operands accumulating in f32 (the named ops cast their inputs to
// the accumulator element type).
#include <stdio.h>
#include <string.h>

#include "lowering/emit.h"

kiln_status_t kiln_lower_matmul(kiln_emitter_t *e, const kiln_node_t *n) {
  int base = n->op == KILN_OP_ADDMM ? 1 : 0;
  const kiln_tv_t *a = &e->values[n->operands[base].value];
  const kiln_tv_t *b = &e->values[n->operands[base + 1].value];
  const kiln_type_t *rt = kiln_node_result_type(e->g, n, 0);
  kiln_dtype_t acc = kiln_math_dtype(rt->dtype);
  kiln_type_t at = *rt;
  at.dtype = acc;
  kiln_tv_t init, mm;
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_filled(e, &at, 0, &init));
  char aty[256], bty[256], oty[256];
  kiln_mlir_tensor_type(&a->type, aty, sizeof(aty));
  kiln_mlir_tensor_type(&b->type, bty, sizeof(bty));
  kiln_mlir_tensor_type(&at, oty, sizeof(oty));
  kiln_emit_fresh(e, mm.ssa);
  mm.type = at;
  kiln_sbuf_printf(&e->out, "    %s = linalg.%s ins(%s, %s : %s, %s) outs(%s : %s) -> %s\n",
                   mm.ssa, n->op == KILN_OP_BMM ? "batch_matmul" : "matmul",
                   a->ssa, b->ssa, aty, bty, init.ssa, oty, oty);
  kiln_tv_t r = mm;
  if (n->op == KILN_OP_ADDMM) {
    // beta * bias + alpha * (a @ b); beta = 0 ignores the bias entirely.
    double beta = kiln_node_attr_float(n, "beta", 1);
    double alpha = kiln_node_attr_float(n, "alpha", 1);
    kiln_tv_t scaled = mm;
    if (alpha != 1)
      KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_binary(
          e, KILN_OP_MUL, kiln_arg_tensor(&mm), kiln_arg_float(alpha), acc,
          &scaled));
    if (beta != 0) {
      kiln_tv_t bias = e->values[n->operands[0].value], sb;
      if (beta != 1) {
        KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_binary(
            e, KILN_OP_MUL, kiln_arg_tensor(&bias), kiln_arg_float(beta), acc,
            &sb));
        bias = sb;
      }
      KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_binary(
          e, KILN_OP_ADD, kiln_arg_tensor(&bias), kiln_arg_tensor(&scaled), acc,
          &r));
    } else {
      r = scaled;
    }
  }
  kiln_tv_t out;
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_convert(e, &r, rt->dtype, &out));
  kiln_emit_set_result(e, n, 0, &out);
  return NULL;
}

kiln_status_t kiln_lower_conv(kiln_emitter_t *e, const kiln_node_t *n) {
  kiln_tv_t x = e->values[n->operands[0].value];
  kiln_tv_t w = e->values[n->operands[1].value];
  const kiln_type_t *rt = kiln_node_result_type(e->g, n, 0);
  kiln_dtype_t acc = kiln_math_dtype(rt->dtype);
  int64_t st[2], pd[2], dl[2];
  kiln_node_attr_pair(n, "stride", 1, st);
  kiln_node_attr_pair(n, "padding", 0, pd);
  kiln_node_attr_pair(n, "dilation", 1, dl);
  int64_t G = kiln_node_attr_int(n, "groups", 1);
  kiln_sbuf_t *b = &e->out;
  if (pd[0] || pd[1]) {
    kiln_type_t pt = x.type;
    pt.dims[2] += 2 * pd[0];
    pt.dims[3] += 2 * pd[1];
    char zero[24], xty[256], pty[256], padded[24];
    kiln_mlir_tensor_type(&x.type, xty, sizeof(xty));
    kiln_mlir_tensor_type(&pt, pty, sizeof(pty));
    kiln_emit_fresh(e, padded);
    kiln_sbuf_printf(b, "    %s = tensor.pad %s low[0, 0, %lld, %lld] high[0, 0, %lld, %lld] {\n"
                        "  ^bb0(%%p0_%d: index, %%p1_%d: index, %%p2_%d: index, %%p3_%d: index):\n",
                     padded, x.ssa, (long long)pd[0], (long long)pd[1],
                     (long long)pd[0], (long long)pd[1], e->next_id,
                     e->next_id, e->next_id, e->next_id);
    e->next_id++;
    kiln_emit_scalar_const(e, b, x.type.dtype, 0, zero);
    kiln_sbuf_printf(b, "    tensor.yield %s : %s\n  } : %s to %s\n", zero,
                     kiln_mlir_elem(x.type.dtype), xty, pty);
    snprintf(x.ssa, sizeof(x.ssa), "%s", padded);
    x.type = pt;
  }
  kiln_type_t ot = *rt;
  ot.dtype = acc;
  char attrs[256];
  snprintf(attrs, sizeof(attrs),
           "{dilations = dense<[%lld, %lld]> : tensor<2xi64>, "
           "strides = dense<[%lld, %lld]> : tensor<2xi64>}",
           (long long)dl[0], (long long)dl[1], (long long)st[0],
           (long long)st[1]);
  kiln_tv_t conv;
  if (G == 1) {
    kiln_tv_t init;
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_filled(e, &ot, 0, &init));
    char xty[256], wty[256], oty[256];
    kiln_mlir_tensor_type(&x.type, xty, sizeof(xty));
    kiln_mlir_tensor_type(&w.type, wty, sizeof(wty));
    kiln_mlir_tensor_type(&ot, oty, sizeof(oty));
    kiln_emit_fresh(e, conv.ssa);
    conv.type = ot;
    kiln_sbuf_printf(b, "    %s = linalg.conv_2d_nchw_fchw %s ins(%s, %s : %s, %s) outs(%s : %s) -> %s\n",
                     conv.ssa, attrs, x.ssa, w.ssa, xty, wty, init.ssa, oty, oty);
  } else {
    // Grouped: view input as N,G,C/G,H,W and weight as G,F/G,C/G,KH,KW.
    kiln_type_t xg = x.type, wg = w.type, og = ot;
    xg.rank = 5;
    xg.dims[0] = x.type.dims[0];
    xg.dims[1] = G;
    xg.dims[2] = x.type.dims[1] / G;
    xg.dims[3] = x.type.dims[2];
    xg.dims[4] = x.type.dims[3];
    wg.rank = 5;
    wg.dims[0] = G;
    wg.dims[1] = w.type.dims[0] / G;
    wg.dims[2] = w.type.dims[1];
    wg.dims[3] = w.type.dims[2];
    wg.dims[4] = w.type.dims[3];
    og.rank = 5;
    og.dims[0] = ot.dims[0];
    og.dims[1] = G;
    og.dims[2] = ot.dims[1] / G;
    og.dims[3] = ot.dims[2];
    og.dims[4] = ot.dims[3];
    kiln_tv_t xv, wv, init, cg;
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_reshape(e, &x, &xg, &xv));
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_reshape(e, &w, &wg, &wv));
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_filled(e, &og, 0, &init));
    char xty[256], wty[256], oty[256];
    kiln_mlir_tensor_type(&xv.type, xty, sizeof(xty));
    kiln_mlir_tensor_type(&wv.type, wty, sizeof(wty));
    kiln_mlir_tensor_type(&og, oty, sizeof(oty));
    kiln_emit_fresh(e, cg.ssa);
    cg.type = og;
    kiln_sbuf_printf(b, "    %s = linalg.conv_2d_ngchw_gfchw %s ins(%s, %s : %s, %s) outs(%s : %s) -> %s\n",
                     cg.ssa, attrs, xv.ssa, wv.ssa, xty, wty, init.ssa, oty, oty);
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_reshape(e, &cg, &ot, &conv));
  }
  kiln_tv_t r = conv;
  if (n->operand_count > 2 && n->operands[2].kind == KILN_OPERAND_VALUE) {
    kiln_tv_t bias = e->values[n->operands[2].value], bv;
    kiln_type_t bt = bias.type;
    bt.rank = 3;  // [F, 1, 1] broadcasts over N and the spatial dims
    bt.dims[0] = bias.type.dims[0];
    bt.dims[1] = bt.dims[2] = 1;
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_reshape(e, &bias, &bt, &bv));
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_binary(
        e, KILN_OP_ADD, kiln_arg_tensor(&conv), kiln_arg_tensor(&bv), acc, &r));
  }
  kiln_tv_t out;
  KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_convert(e, &r, rt->dtype, &out));
  kiln_emit_set_result(e, n, 0, &out);
  return NULL;
}
