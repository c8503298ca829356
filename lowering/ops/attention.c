// Attention as one CPU kernel: softmax(Q @ KT * scale) @ V over a batch of
// heads, the scores never written to memory.
//
// The graph keeps attention as the ops it was traced to (two bmms, a scale
// and a softmax, with views between them: an explicit q @ k.transpose(),
// nn.MultiheadAttention's trace, kiln's form of PyTorch's CPU flash
// attention op). Lowered op by op, the [BH, L, S] scores are written by the
// first bmm, read and written by the softmax, and read by the second: on
// the bench's attention block (4 x 8 heads of 128 x 32) those three passes
// and the K^T copy took 0.40-0.50 ms of its 1.4-1.6.
//
// Here the first bmm's lowering recognizes the chain (attention_chain) and
// defers it; the second bmm's emits the kernel. Threads take (head, block
// of up to 128 query rows). Per tile of 8 query rows:
//   1. scores: a register tile of 8 rows x 32 keys (16 accumulators) over
//      the head dim, KT's rows ([E, S], contiguous in S) loaded and Q's
//      elements broadcast, scaled (a mask added, causal lanes set to -inf)
//      and written to a task-local [8, S] block;
//   2. the rows' maxima, exp(s - max) written back in place, their sums;
//   3. output: a register tile of 8 rows x 32 columns of V over the keys,
//      V's rows loaded and the probabilities broadcast, times 1 / sum, and
//      stored. The probabilities stay unnormalized in between.
// Q, K^T and V are read from the tensor they are views of (the projection
// the heads were split from; K^T made per task from K's rows where K^T's
// keys are not contiguous), and the output is written in the layout the
// heads are merged back into (plan_output).
// KT and V of a head (S x (E + Ev) floats: 32 KB for 128 keys and 32 + 32
// dims) stay in L1/L2 while a task's tiles go by. Rows past a multiple of
// 8 run as one shorter tile, a dim that is 16 past a multiple of 32 as one
// 16-wide tile.
//
// CPU with the f32 microkernels (AVX-512), f32, E and Ev static (Ev a
// multiple of 16), S a multiple of 16 up to 8192 (the score block is 8 x S
// floats); other chains lower op by op. Dynamic shapes: BH may be a
// constant times symbols (a dynamic batch: "8*s0"; with one symbol the
// operands are still read in place), and L and S may be symbolic (a
// dynamic sequence length: blocks of query rows counted at run time, the
// keys past S masked, any S). An additive mask may have L and S among its
// sizes (a padding mask [B, 1, 1, S]): its strides are then SSA values and
// its last vector of keys is read masked; under a dynamic batch masks per
// batch and per head are taken where the batch is the view's outermost
// dim and its one symbolic leading dim. A boolean mask (where(m, -inf,
// s): masked_fill of a causal buffer; where(keep, s, -inf); HuggingFace's
// finfo.min in place of -inf) is made the additive one (0 / the fill) by
// one generic and read as such.
//
// Against PyTorch's softmax + bmm: a key masked with -inf (causal lanes, a
// -inf mask entry) weighs exp's smallest result, about 1.2e-38, not 0 (the
// exp polynomial clamps its argument at -87.3, as the op-by-op softmax
// does), and the causal form never reads the keys past a tile's last row,
// so an inf or NaN in V there does not turn the row NaN as 0 * inf does in
// PyTorch. A row whose every key is masked is 0, as PyTorch's SDPA gives
// it (torch 2.13; its math form gives NaN). A
// boolean mask is added as -inf, so a NaN or +inf score at a masked key
// (a NaN in K at a padded slot) makes the row NaN, where PyTorch's where
// would have set that score to -inf.
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "lowering/emit.h"

typedef struct attn_chain {
  int bmm1, bmm2;
  int nodes[16], count;  // bmm1 and the nodes after it up to bmm2 (excluded)
  int32_t q, kt, v;      // graph values: Q [BH, L, E], KT [BH, E, S], V [BH, S, Ev]
  int64_t BH, L, E, S, Ev;  // BH: a dim (KILN_SYM for a symbolic one)
  int32_t sb;            // BH's symbol (BH = bhc * sb), or -1: BH static
  int64_t bhc;
  double scale;
  // An additive mask (after the scale, before the softmax), or -1: a value
  // broadcast to `mview`, the scores' view it is added in. `mask_bool`: the
  // mask is instead a bool tensor whose true (1) or false (-1) entries set
  // a score to -inf (masked_fill(s, bias == 0, -inf), GPT-2's causal mask
  // from a buffer); 0 for an additive one.
  int32_t mask;
  int mask_bool;
  float mask_fill;  // a boolean mask's fill: -inf, or a finfo.min
  kiln_type_t mview;
  // Query row i sees keys j <= i only (SDPA's is_causal as translate.py
  // writes it: where(rows >= cols, s, -inf) over constant aranges).
  bool causal;
} attn_chain_t;

// f32 [BH, a, b] with b static (BH and a may be symbolic: a dynamic batch
// or sequence length).
static bool f32_heads3(const kiln_type_t *t) {
  return t->dtype == KILN_F32 && t->rank == 3 && !KILN_IS_SYM(t->dims[2]);
}

// Whether dims [0, n) of `t` multiply to the chain's BH (as products).
static bool lead_is_bh(const kiln_graph_t *g, const kiln_type_t *t, int n,
                       const attn_chain_t *ch) {
  kiln_monomial_t lead = {.coef = 1}, bh;
  for (int d = 0; d < n; ++d)
    if (!kiln_monomial_mul_dim(g, &lead, t->dims[d])) return false;
  kiln_dim_monomial(g, ch->BH, &bh);
  return kiln_monomial_equal(&lead, &bh);
}

// A view of the scores that keeps their [BH, L, S] layout: rows of S last,
// rows of L before them, the leading dims multiplying to BH.
static bool score_view(const kiln_graph_t *g, const kiln_type_t *t, const attn_chain_t *ch) {
  if (t->dtype != KILN_F32 || t->rank < 3) return false;
  if (t->dims[t->rank - 1] != ch->S || t->dims[t->rank - 2] != ch->L) return false;
  return lead_is_bh(g, t, t->rank - 2, ch);
}

// The size `dim` as c * sb^e (e 0 or 1), sb the chain's symbol; false for
// any other symbolic size.
typedef struct asize {
  int64_t c;
  int e;
} asize_t;

static bool asize_of(const kiln_graph_t *g, int32_t sb, int64_t dim, asize_t *out) {
  if (!KILN_IS_SYM(dim)) {
    *out = (asize_t){dim, 0};
    return true;
  }
  kiln_monomial_t m;
  kiln_dim_monomial(g, dim, &m);
  if (sb < 0 || m.count != 1 || m.factors[0] != sb) return false;
  *out = (asize_t){m.coef, 1};
  return true;
}

//===--- Q, K^T and V read where they lie ----------------------------------===//
//
// The bmm operands are views of the qkv projection's output (a head split:
// reshape, permute, slice, squeeze, clone, and for K a transpose), which
// lowered op by op are copies (the bench's attention block: 0.05-0.09 ms
// for the head split, 0.02 for K^T). The kernel reads them from the
// projection's output instead, through a layout traced back over the
// view ops: each dim a list of factors (size, stride) in row-major order,
// so that a reshape merging dims that are not adjacent in memory (the
// batch and the heads of a sequence-first projection) and the reshape
// splitting them again compose (CuTe's layouts; a plain stride per dim,
// as PyTorch's views have, cannot express the merged dim). Under a
// symbolic batch a factor's size may be c * sb (asize_t); strides stay
// static, so that factor is the base's outermost and stays the heads'.

enum { kMaxFactors = 8 };

typedef struct factor {
  asize_t size;
  int64_t stride;
} factor_t;

typedef struct layout {
  int rank;
  int nf[KILN_MAX_RANK];
  factor_t f[KILN_MAX_RANK][kMaxFactors];
  int64_t offset;
} layout_t;

static bool layout_dense(const kiln_graph_t *g, int32_t sb, const kiln_type_t *t,
                         layout_t *l) {
  memset(l, 0, sizeof(*l));
  l->rank = t->rank;
  int64_t st = 1;
  for (int d = t->rank - 1; d >= 0; --d) {
    asize_t a;
    if (st < 0 || !asize_of(g, sb, t->dims[d], &a)) return false;
    if (a.c != 1 || a.e) l->f[d][l->nf[d]++] = (factor_t){a, st};
    st = a.e ? -1 : st * a.c;  // past a symbolic size a stride would be symbolic
  }
  return true;
}

// Reshape to `t` (view, reshape, squeeze, unsqueeze): the factors in order,
// regrouped by the new sizes, a factor split where a new dim ends inside it.
static bool layout_reshape(const kiln_graph_t *g, int32_t sb, const layout_t *in,
                           const kiln_type_t *t, layout_t *out) {
  factor_t all[KILN_MAX_RANK * kMaxFactors];
  int n = 0;
  for (int d = 0; d < in->rank; ++d)
    for (int k = 0; k < in->nf[d]; ++k) all[n++] = in->f[d][k];
  layout_t r;
  memset(&r, 0, sizeof(r));
  r.rank = t->rank;
  r.offset = in->offset;
  int at = 0;
  for (int d = 0; d < t->rank; ++d) {
    asize_t need;
    if (!asize_of(g, sb, t->dims[d], &need) || need.c < 1) return false;
    while (need.c > 1 || need.e) {
      if (at >= n || r.nf[d] >= kMaxFactors) return false;
      factor_t *f = &all[at];
      if (need.e >= f->size.e && need.c % f->size.c == 0) {
        r.f[d][r.nf[d]++] = *f;
        need.c /= f->size.c;
        need.e -= f->size.e;
        ++at;
      } else if (f->size.e == need.e && f->size.c % need.c == 0) {
        // The factor's outer part: `need` steps of stride * (size / need)
        // (a static quotient: a symbolic one would make the stride so).
        r.f[d][r.nf[d]++] = (factor_t){need, f->stride * (f->size.c / need.c)};
        f->size = (asize_t){f->size.c / need.c, 0};
        need = (asize_t){1, 0};
      } else {
        return false;
      }
    }
  }
  if (at != n) return false;
  *out = r;
  return true;
}

// The layout of graph value `v` over the base it is a view of (the first
// producer that is no view op, or a graph input). Fails where a view op is
// one the walk does not take, or a slice cuts a merged dim.
static bool trace_layout(const kiln_emitter_t *e, int32_t sb, int32_t v, int32_t *base,
                         layout_t *l) {
  const kiln_graph_t *g = e->g;
  int chain[32], n = 0;
  int32_t cur = v;
  for (;;) {
    int p = g->values[cur].node;
    if (p < 0) break;
    const kiln_node_t *c = &g->nodes[p];
    kiln_op_id_t op = c->op;
    bool view = op == KILN_OP_VIEW || op == KILN_OP_RESHAPE || op == KILN_OP_SQUEEZE ||
                op == KILN_OP_UNSQUEEZE || op == KILN_OP_PERMUTE || op == KILN_OP_TRANSPOSE ||
                op == KILN_OP_SLICE || op == KILN_OP_CLONE || op == KILN_OP_EXPAND;
    if (!view || c->operand_count < 1 || c->operands[0].kind != KILN_OPERAND_VALUE) break;
    if (n == 32) return false;
    chain[n++] = p;
    cur = c->operands[0].value;
  }
  const kiln_value_t *bv = &g->values[cur];
  if (bv->type.dtype != KILN_F32 || bv->type.rank < 1 || !e->values[cur].ssa[0] ||
      (kiln_type_is_static(&bv->type) && kiln_type_numel(&bv->type) < 1))
    return false;
  // A strided graph input would be copied to be read flat.
  if (bv->node < 0 && e->input_strided && e->input_strided[bv->index]) return false;
  *base = cur;
  if (!layout_dense(g, sb, &bv->type, l)) return false;
  for (int i = n - 1; i >= 0; --i) {
    const kiln_node_t *c = &g->nodes[chain[i]];
    const kiln_type_t *in = &g->values[c->operands[0].value].type;
    const kiln_type_t *rt = kiln_node_result_type(g, c, 0);
    switch (c->op) {
      case KILN_OP_CLONE:
        break;
      case KILN_OP_EXPAND:
        if (!kiln_type_equal(in, rt)) return false;
        break;
      case KILN_OP_PERMUTE:
      case KILN_OP_TRANSPOSE: {
        int32_t perm[KILN_MAX_RANK];
        kiln_node_permutation(c, in->rank, perm);
        layout_t r = *l;
        for (int d = 0; d < in->rank; ++d) {
          r.nf[d] = l->nf[perm[d]];
          memcpy(r.f[d], l->f[perm[d]], sizeof(r.f[d]));
        }
        *l = r;
        break;
      }
      case KILN_OP_SLICE: {
        int32_t d;
        if (!kiln_normalize_dim(kiln_node_attr_int(c, "dim", 0), in->rank, &d)) return false;
        int64_t start = kiln_node_slice_start(c, in->dims[d]);
        int64_t step = kiln_node_attr_int(c, "step", 1);
        if (l->nf[d] > 1 || step < 1 || KILN_IS_SYM(rt->dims[d]) || KILN_IS_SYM(in->dims[d]))
          return false;
        if (l->nf[d] == 1) {
          if (l->f[d][0].size.e) return false;
          l->offset += start * l->f[d][0].stride;
          l->f[d][0].stride *= step;
          l->f[d][0].size = (asize_t){rt->dims[d], 0};
          if (rt->dims[d] == 1) l->nf[d] = 0;
        }
        break;
      }
      default:  // view, reshape, squeeze, unsqueeze
        if (!layout_reshape(g, sb, l, rt, l)) return false;
        break;
    }
  }
  return true;
}

// How the kernel reads one of Q, K^T, V ([BH, a, b]).
typedef enum {
  OPERAND_TENSOR,  // the materialized 3-D tensor (its SSA value)
  OPERAND_FLAT,    // the base's elements, at offset(bh) + i * s1 + j * s2
  OPERAND_LOCAL,   // K^T only: K's rows (s1 = 1) transposed per task into [E, S]
} operand_mode_t;

typedef struct operand {
  operand_mode_t mode;
  int32_t base;
  layout_t lay;   // dim 0's factors: the heads, outer first
  int64_t s1, s2;
} operand_t;

// The read of bmm operand `v` ([BH, a, b]): flat where its layout puts
// dims 1 and 2 on one factor each (`contig`: dim `contig` with stride 1,
// for vector reads; -1 for scalar reads); `local_ok` (K^T): made per task
// where dim 1 is the contiguous one instead.
static void plan_operand(const kiln_emitter_t *e, int32_t sb, int32_t v, int contig,
                         bool local_ok, operand_t *op) {
  memset(op, 0, sizeof(*op));
  op->mode = OPERAND_TENSOR;
  const kiln_type_t *t = &e->g->values[v].type;
  if (!trace_layout(e, sb, v, &op->base, &op->lay) || op->lay.rank != 3) return;
  // A symbolic factor only as the heads' outermost (its index needs no mod).
  for (int d = 0; d < 3; ++d)
    for (int k = 0; k < op->lay.nf[d]; ++k)
      if (op->lay.f[d][k].size.e && (d || k)) return;
  int64_t s[3] = {0, 0, 0};
  for (int d = 1; d < 3; ++d) {
    if (op->lay.nf[d] > 1) return;
    s[d] = op->lay.nf[d] ? op->lay.f[d][0].stride : 0;
    if (t->dims[d] > 1 && op->lay.nf[d] == 0) return;
  }
  op->s1 = s[1];
  op->s2 = s[2];
  if (contig < 0 || s[contig] == 1)
    op->mode = OPERAND_FLAT;
  else if (local_ok && contig == 2 && s[1] == 1 && t->dims[1] % 16 == 0)
    op->mode = OPERAND_LOCAL;
}

// Whether value `v` is 0, 1, .., n - 1 as an integer kiln.constant or a
// kiln.arange (n a dim: symbolic too), seen through views.
static bool arange_const(const kiln_graph_t *g, int32_t v, int64_t n) {
  int p = g->values[v].node;
  while (p >= 0 && (g->nodes[p].op == KILN_OP_VIEW || g->nodes[p].op == KILN_OP_RESHAPE ||
                    g->nodes[p].op == KILN_OP_UNSQUEEZE) &&
         g->nodes[p].operands[0].kind == KILN_OPERAND_VALUE)
    p = g->values[g->nodes[p].operands[0].value].node;
  if (p >= 0 && g->nodes[p].op == KILN_OP_ARANGE)  // 0, 1, .. of any size, exact
    return kiln_dtype_is_int(g->values[g->nodes[p].results[0]].type.dtype) &&
           kiln_node_attr_int(&g->nodes[p], "start", 0) == 0 &&
           kiln_node_attr_int(&g->nodes[p], "step", 1) == 1 &&
           g->values[g->nodes[p].results[0]].type.dims[0] == n;
  if (p < 0 || g->nodes[p].op != KILN_OP_CONSTANT) return false;
  const kiln_attr_t *a = kiln_node_attr(&g->nodes[p], "value");
  if (!a || a->kind != KILN_ATTR_LIST || !a->is_int || a->count != n) return false;
  for (int64_t i = 0; i < n; ++i)
    if (a->ints[i] != i) return false;
  return true;
}

// The causal pattern's condition: rows [L, 1] >= cols [S], both aranges.
static bool causal_cond(const kiln_graph_t *g, int32_t cond, int64_t L, int64_t S) {
  int p = g->values[cond].node;
  if (p < 0) return false;
  const kiln_node_t *c = &g->nodes[p];
  if (c->op != KILN_OP_GE || c->operand_count != 2 || c->operands[0].kind != KILN_OPERAND_VALUE ||
      c->operands[1].kind != KILN_OPERAND_VALUE)
    return false;
  const kiln_type_t *rt = &g->values[c->operands[0].value].type;
  const kiln_type_t *ct = &g->values[c->operands[1].value].type;
  if (rt->rank != 2 || rt->dims[0] != L || rt->dims[1] != 1 || ct->rank != 1 || ct->dims[0] != S)
    return false;
  return arange_const(g, c->operands[0].value, L) && arange_const(g, c->operands[1].value, S);
}

// Whether operand `o` is a masking fill, -inf or a finite value at or
// below -1e30 (HuggingFace's torch.finfo(f32).min), as the number or a
// one-element f32 tensor that aten.full or kiln.constant makes (the fill as
// Dynamo traces it: full([], -inf)); its value in `*fill`. (Added to a
// score s instead of replacing it, a finite fill F gives s + F, which is F
// itself for |s| below about 1e31: the same softmax.)
static bool mask_fill_operand(const kiln_graph_t *g, const kiln_operand_t *o, float *fill) {
  double f = 0;
  if (o->kind == KILN_OPERAND_FLOAT) {
    f = o->f;
  } else {
    if (o->kind != KILN_OPERAND_VALUE) return false;
    const kiln_value_t *v = &g->values[o->value];
    if (v->node < 0 || v->type.dtype != KILN_F32) return false;
    for (int d = 0; d < v->type.rank; ++d)
      if (v->type.dims[d] != 1) return false;
    const kiln_node_t *p = &g->nodes[v->node];
    const kiln_attr_t *a = kiln_node_attr(p, "value");
    if (!a || (p->op != KILN_OP_FULL && p->op != KILN_OP_CONSTANT)) return false;
    f = a->kind == KILN_ATTR_FLOAT ? a->f
        : a->kind == KILN_ATTR_LIST && a->count == 1 ? a->floats[0]
                                                     : 0;
  }
  if (!(f <= -1e30)) return false;  // (NaN too)
  *fill = f < -FLT_MAX ? -INFINITY : (float)f;
  return true;
}

// Whether `mt` broadcasts to the scores' view `ct` as a mask the kernel
// reads flat: each size 1 or the view's own. Under a symbolic batch a
// mask per batch or head (a padding mask [B, 1, 1, S], a bias [B, H, L,
// S]) needs the batch to be the view's outermost dim and its one symbolic
// leading dim: the head's offset in the mask is then (bh / inner) *
// stride for it, with no modulus, and the usual terms for the static dims.
static bool mask_broadcasts(const attn_chain_t *ch, const kiln_type_t *mt,
                            const kiln_type_t *ct) {
  if (mt->rank < 1 || mt->rank > ct->rank) return false;
  bool lead_static = true;  // the view's leading dims after the first
  for (int d = 1; d < ct->rank - 2; ++d) lead_static &= !KILN_IS_SYM(ct->dims[d]);
  for (int d = 0; d < mt->rank; ++d) {
    int pos = ct->rank - mt->rank + d;
    int64_t m = mt->dims[d], want = ct->dims[pos];
    if (m != 1 && m != want) return false;
    if (KILN_IS_SYM(ch->BH) && m != 1 && pos < ct->rank - 2 &&
        (!KILN_IS_SYM(ct->dims[0]) || !lead_static))
      return false;
  }
  return true;
}

// Whether value `v` is computed from a bmm after node `first`. A mask may
// be computed after the chain's first bmm (eager LLaMA code slices its
// causal mask there), but not from such a bmm: it may start a chain of its
// own, deferred and never materialized, whose add both chains would claim
// (a relative-position bias made by a bmm). Searches up to 256 producers;
// past that, answers yes.
static bool bmm_after(const kiln_graph_t *g, int32_t v, int first) {
  int32_t stack[64];
  int n = 0, seen = 0;
  stack[n++] = v;
  while (n) {
    int p = g->values[stack[--n]].node;
    if (p <= first) continue;  // a graph input, or emitted before the chain
    if (++seen > 256) return true;
    const kiln_node_t *c = &g->nodes[p];
    if (c->op == KILN_OP_BMM) return true;
    for (int k = 0; k < c->operand_count; ++k) {
      if (c->operands[k].kind != KILN_OPERAND_VALUE) continue;
      if (n == 64) return true;
      stack[n++] = c->operands[k].value;
    }
  }
  return false;
}

static bool chain_ending_at(const kiln_emitter_t *e, int self, attn_chain_t *ch);

// Whether bmm node `first` starts a chain the kernel computes: its result
// read, each value by one node only, by views, at most one multiply or
// divide by a number, then at most one mask (additive, or a boolean
// `where` with -inf) and the causal `where`, one softmax over the last dim,
// more views, and then as the lhs of a second bmm.
static bool attention_chain(const kiln_emitter_t *e, int first, attn_chain_t *ch) {
  const kiln_graph_t *g = e->g;
  const kiln_node_t *n = &g->nodes[first];
  if (!e->options.fused_attention || e->options.cuda || n->op != KILN_OP_BMM ||
      n->operand_count != 2 || n->operands[0].kind != KILN_OPERAND_VALUE ||
      n->operands[1].kind != KILN_OPERAND_VALUE)
    return false;
  memset(ch, 0, sizeof(*ch));
  ch->bmm1 = first;
  ch->q = n->operands[0].value;
  ch->kt = n->operands[1].value;
  const kiln_type_t *qt = &g->values[ch->q].type, *kt = &g->values[ch->kt].type;
  if (!f32_heads3(qt) || kt->dtype != KILN_F32 || kt->rank != 3 || KILN_IS_SYM(kt->dims[1]))
    return false;
  ch->BH = qt->dims[0];
  ch->L = qt->dims[1];
  ch->E = qt->dims[2];
  ch->S = kt->dims[2];
  ch->sb = -1;
  ch->bhc = ch->BH;
  if (KILN_IS_SYM(ch->BH)) {
    // A dynamic batch: BH a constant times symbols. With one symbol the
    // layouts may carry it (flat reads); with more, Q, K^T and V are read
    // as the tensors they are.
    kiln_monomial_t m;
    kiln_dim_monomial(g, ch->BH, &m);
    ch->sb = m.count == 1 ? m.factors[0] : -1;
    ch->bhc = m.coef;
  }
  // A static S: whole vectors of 16 keys, a score block of at most 8 x 8192.
  // A symbolic S (or L) is masked at run time.
  bool sym_S = KILN_IS_SYM(ch->S), sym_L = KILN_IS_SYM(ch->L);
  if (kt->dims[0] != ch->BH || kt->dims[1] != ch->E || ch->bhc < 1 || ch->E < 1 ||
      ch->E > 4096 || (!sym_S && (ch->S % 16 || ch->S < 16 || ch->S > 8192)) ||
      (!sym_L && ch->L < 1))
    return false;
  // A bmm that ends another chain is that kernel's result, not a chain of
  // its own (its lhs, the other chain's probabilities, never exists).
  attn_chain_t other;
  if (chain_ending_at(e, first, &other)) return false;
  ch->scale = 1;
  ch->mask = -1;
  ch->mask_bool = 0;
  ch->nodes[ch->count++] = first;
  bool scaled = false, soft = false, masked = false;
  ch->causal = false;
  int32_t v = n->results[0];
  int at = first;
  while (ch->count < 16) {
    int u = kiln_emit_sole_reader(g, v, at);
    if (u < 0) return false;
    const kiln_node_t *c = &g->nodes[u];
    if (c->result_count != 1) return false;
    const kiln_type_t *ct = kiln_node_result_type(g, c, 0);
    if (c->op == KILN_OP_BMM) {
      if (!soft || c->operand_count != 2 || c->operands[0].kind != KILN_OPERAND_VALUE ||
          c->operands[0].value != v || c->operands[1].kind != KILN_OPERAND_VALUE ||
          g->values[v].type.rank != 3)
        return false;
      ch->v = c->operands[1].value;
      const kiln_type_t *vt = &g->values[ch->v].type;
      if (!f32_heads3(vt) || vt->dims[0] != ch->BH || vt->dims[1] != ch->S ||
          vt->dims[2] % 16 || vt->dims[2] < 16 || vt->dims[2] > 4096 || !f32_heads3(ct))
        return false;
      ch->Ev = vt->dims[2];
      ch->bmm2 = u;
      return true;
    }
    if (!score_view(g, ct, ch)) return false;
    switch (c->op) {
      case KILN_OP_VIEW:
      case KILN_OP_RESHAPE:
        break;
      case KILN_OP_EXPAND:
        if (!kiln_type_equal(ct, &g->values[v].type)) return false;
        break;
      case KILN_OP_MUL:
      case KILN_OP_DIV: {
        // x * s, s * x or x / s with s a number.
        if (scaled || soft || masked || ch->causal || c->operand_count != 2 ||
            (c->op == KILN_OP_DIV && kiln_node_attr_str(c, "rounding_mode", NULL)))
          return false;
        int k = c->operands[0].kind == KILN_OPERAND_VALUE && c->operands[0].value == v ? 1 : 0;
        if (c->op == KILN_OP_DIV && k != 1) return false;
        const kiln_operand_t *s = &c->operands[k];
        double f = s->kind == KILN_OPERAND_FLOAT ? s->f
                   : s->kind == KILN_OPERAND_INT ? (double)s->i
                                                 : 0;
        if ((s->kind != KILN_OPERAND_FLOAT && s->kind != KILN_OPERAND_INT) || f == 0 ||
            f != f || !kiln_type_equal(ct, &g->values[v].type))
          return false;
        ch->scale = c->op == KILN_OP_DIV ? 1 / f : f;
        scaled = true;
        break;
      }
      case KILN_OP_ADD: {
        // x + m, m an f32 tensor broadcast to the scores' view (an
        // attention mask: padding, a float mask of SDPA), after the scale.
        if (masked || soft || ch->causal || c->operand_count != 2 ||
            kiln_node_attr_float(c, "alpha", 1) != 1 || !kiln_type_equal(ct, &g->values[v].type))
          return false;
        int k = c->operands[0].kind == KILN_OPERAND_VALUE && c->operands[0].value == v ? 1 : 0;
        if (c->operands[k].kind != KILN_OPERAND_VALUE || c->operands[1 - k].kind != KILN_OPERAND_VALUE ||
            c->operands[1 - k].value != v)
          return false;
        const kiln_type_t *mt = &g->values[c->operands[k].value].type;
        // (Its sizes may be symbolic where they are the scores' L or S: a
        // padding mask [B, 1, 1, S] under a dynamic length.)
        if (bmm_after(g, c->operands[k].value, first) || mt->dtype != KILN_F32 ||
            !mask_broadcasts(ch, mt, ct))
          return false;
        ch->mask = c->operands[k].value;
        ch->mask_bool = 0;
        ch->mview = *ct;
        masked = true;
        break;
      }
      case KILN_OP_WHERE: {
        // where(m, fill, x) or where(m, x, fill) with m a bool tensor that
        // is not the causal pattern below and fill -inf or a finfo.min: a
        // boolean mask (masked_fill of a mask buffer), after the scale, in
        // place of an additive one.
        if (!masked && !soft && !ch->causal && c->operand_count == 3 &&
            c->operands[0].kind == KILN_OPERAND_VALUE && kiln_type_equal(ct, &g->values[v].type)) {
          int32_t m = c->operands[0].value;
          const kiln_type_t *mt = &g->values[m].type;
          float fill = 0;
          bool fill_true = c->operands[2].kind == KILN_OPERAND_VALUE &&
                           c->operands[2].value == v &&
                           mask_fill_operand(g, &c->operands[1], &fill);
          bool fill_false = !fill_true && c->operands[1].kind == KILN_OPERAND_VALUE &&
                            c->operands[1].value == v &&
                            mask_fill_operand(g, &c->operands[2], &fill);
          if ((fill_true || fill_false) && mt->dtype == KILN_BOOL &&
              !causal_cond(g, m, ch->L, ch->S) && !bmm_after(g, m, first) &&
              mask_broadcasts(ch, mt, ct)) {
            ch->mask = m;
            ch->mask_bool = fill_true ? 1 : -1;
            ch->mask_fill = fill;
            ch->mview = *ct;
            masked = true;
            break;
          }
        }
        // where(rows >= cols, x, -inf), after the scale and a mask.
        if (ch->causal || soft || c->operand_count != 3 ||
            c->operands[0].kind != KILN_OPERAND_VALUE || c->operands[1].kind != KILN_OPERAND_VALUE ||
            c->operands[1].value != v || c->operands[2].kind != KILN_OPERAND_FLOAT ||
            !(c->operands[2].f < 0 && isinf(c->operands[2].f)) ||
            !kiln_type_equal(ct, &g->values[v].type) ||
            !causal_cond(g, c->operands[0].value, ch->L, ch->S))
          return false;
        ch->causal = true;
        break;
      }
      case KILN_OP_SOFTMAX: {
        int32_t d;
        const kiln_type_t *xt = &g->values[v].type;
        if (soft || !kiln_normalize_dim(kiln_node_attr_int(c, "dim", -1), xt->rank, &d) ||
            d != xt->rank - 1 || !kiln_type_equal(ct, xt))
          return false;
        soft = true;
        break;
      }
      default:
        return false;
    }
    ch->nodes[ch->count++] = u;
    v = c->results[0];
    at = u;
  }
  return false;
}

// The chain whose second bmm is node `self`: back from its lhs, through
// the ops a chain has, each value the only reader's (an add's either
// operand), to a first bmm whose chain ends at `self`. (Walking back
// through any op, both operands of every residual add of a deep
// transformer were explored: exponential in its depth.)
static bool chain_back(const kiln_emitter_t *e, int32_t v, int reader, int self, int depth,
                       attn_chain_t *ch) {
  const kiln_graph_t *g = e->g;
  int p = g->values[v].node;
  if (p < 0 || depth > 16 || kiln_emit_sole_reader(g, v, p) != reader) return false;
  const kiln_node_t *c = &g->nodes[p];
  switch (c->op) {
    case KILN_OP_BMM:
      return attention_chain(e, p, ch) && ch->bmm2 == self;
    case KILN_OP_WHERE:  // the scores are its second operand, or (a boolean
                         // mask's masked_fill) its third
      for (int k = 1; k < c->operand_count && k < 3; ++k)
        if (c->operands[k].kind == KILN_OPERAND_VALUE &&
            chain_back(e, c->operands[k].value, p, self, depth + 1, ch))
          return true;
      return false;
    case KILN_OP_ADD:  // either operand (the other is the mask)
      for (int k = 0; k < c->operand_count && k < 2; ++k)
        if (c->operands[k].kind == KILN_OPERAND_VALUE &&
            chain_back(e, c->operands[k].value, p, self, depth + 1, ch))
          return true;
      return false;
    case KILN_OP_MUL:
    case KILN_OP_DIV:
    case KILN_OP_VIEW:
    case KILN_OP_RESHAPE:
    case KILN_OP_EXPAND:
    case KILN_OP_SOFTMAX:
      for (int k = 0; k < c->operand_count && k < 2; ++k)
        if (c->operands[k].kind == KILN_OPERAND_VALUE)
          return chain_back(e, c->operands[k].value, p, self, depth + 1, ch);
      return false;
    default:
      return false;
  }
}

static bool chain_ending_at(const kiln_emitter_t *e, int self, attn_chain_t *ch) {
  const kiln_node_t *n = &e->g->nodes[self];
  if (n->operand_count != 2 || n->operands[0].kind != KILN_OPERAND_VALUE) return false;
  return chain_back(e, n->operands[0].value, self, self, 0, ch);
}

// How the kernel reads Q, K^T and V, with the names emit_attention gave
// their flat bases and per-head offsets.
typedef struct reads {
  operand_t op[3];      // Q, K^T, V
  char flat[3][24];     // OPERAND_FLAT / LOCAL: the base as tensor<N x f32>
  char fty[3][48];
  char boff[3][24];     // ... and head %bh's offset in it
  char ktl[24];         // OPERAND_LOCAL: the task's K^T, tensor<E x S x f32>
  char ktlty[48];
  // The additive mask read flat (mask[0] empty: none): head %bh's offset,
  // the strides of a query row and of a key (0 where broadcast); a row
  // stride that is a symbolic size (S under a dynamic length) is the SSA
  // value `m_row_ssa` instead.
  char mask[24], mty[48], moff[24], m_row_ssa[24];
  int64_t m_row, m_key;
  // A symbolic S: K^T's vectors past it are read with in_bounds = false
  // (their lanes masked out of the scores).
  bool kmask;
} reads_t;

// A read of element (%bh, i, j) of operand `w` (0 Q, 1 K^T, 2 V) into
// `res`: a vector<16xf32> from there along dim 2 (`vec`), else the scalar.
// `mat` / `mty`: the materialized tensor and its type; `pad` the padding.
static void emit_load(kiln_sbuf_t *o, const reads_t *rd, int w, const char *res, bool vec,
                      const char *bh, const char *i, const char *j, const char *mat,
                      const char *mty, const char *pad) {
  const operand_t *op = &rd->op[w];
  if (op->mode == OPERAND_TENSOR) {
    if (vec)
      kiln_sbuf_printf(o, "            %s = vector.transfer_read %s[%s, %s, %s], %s {in_bounds = [%s]} : "
                          "%s, vector<16xf32>\n", res, mat, bh, i, j, pad,
                       rd->kmask && w == 1 ? "false" : "true", mty);
    else
      kiln_sbuf_printf(o, "            %s = tensor.extract %s[%s, %s, %s] : %s\n", res, mat, bh, i, j, mty);
    return;
  }
  if (op->mode == OPERAND_LOCAL) {
    kiln_sbuf_printf(o, "            %s = vector.transfer_read %s[%s, %s], %s {in_bounds = [true]} : "
                        "%s, vector<16xf32>\n", res, rd->ktl, i, j, pad, rd->ktlty);
    return;
  }
  kiln_sbuf_printf(o, "            %s_i = affine.apply affine_map<(d0, d1)[s0] -> (s0 + d0 * %lld + d1 * "
                      "%lld)>(%s, %s)[%s]\n", res, (long long)op->s1, (long long)op->s2, i, j,
                   rd->boff[w]);
  if (vec)
    kiln_sbuf_printf(o, "            %s = vector.transfer_read %s[%s_i], %s {in_bounds = [%s]} : %s, "
                        "vector<16xf32>\n", res, rd->flat[w], res, pad,
                     rd->kmask && w == 1 ? "false" : "true", rd->fty[w]);
  else
    kiln_sbuf_printf(o, "            %s = tensor.extract %s[%s_i] : %s\n", res, rd->flat[w], res,
                     rd->fty[w]);
}

// The loops of a tile carry vector<16xf32> values: `%<res>:n = scf.for
// %<iv> = lo to hi step st iter_args(%<stem>0_<sfx> = init, ..)` opened,
// and closed by yielding `vals`.
static void open_vec_loop(kiln_sbuf_t *o, const char *res, int n, const char *iv,
                          const char *lo, const char *hi, const char *st, const char *stem,
                          const char *sfx, const char *init) {
  kiln_sbuf_printf(o, "          %s:%d = scf.for %s = %s to %s step %s iter_args(", res, n, iv,
                   lo, hi, st);
  for (int k = 0; k < n; ++k) kiln_sbuf_printf(o, "%s%%%s%d_%s = %s", k ? ", " : "", stem, k, sfx, init);
  kiln_sbuf_puts(o, ") -> (");
  for (int k = 0; k < n; ++k) kiln_sbuf_printf(o, "%svector<16xf32>", k ? ", " : "");
  kiln_sbuf_puts(o, ") {\n");
}

static void close_vec_loop(kiln_sbuf_t *o, char (*vals)[64], int n) {
  kiln_sbuf_puts(o, "            scf.yield ");
  for (int k = 0; k < n; ++k) kiln_sbuf_printf(o, "%s%s", k ? ", " : "", vals[k]);
  kiln_sbuf_puts(o, " : ");
  for (int k = 0; k < n; ++k) kiln_sbuf_printf(o, "%svector<16xf32>", k ? ", " : "");
  kiln_sbuf_puts(o, "\n          }\n");
}

// A tile's rm x nv vectors `vals` (row-major) as one vector<rm x nv x 16>
// `%<name>` for a single n-D write.
static void emit_tile_vector(kiln_sbuf_t *o, const char *name, char (*vals)[64], int rm,
                             int nv) {
  kiln_sbuf_printf(o, "          %s_p = ub.poison : vector<%dx%dx16xf32>\n", name, rm, nv);
  for (int k = 0; k < rm * nv; ++k) {
    char prev[80];
    if (k)
      snprintf(prev, sizeof(prev), "%s_%d", name, k - 1);
    else
      snprintf(prev, sizeof(prev), "%s_p", name);
    char res[80];
    if (k + 1 == rm * nv)
      snprintf(res, sizeof(res), "%s", name);
    else
      snprintf(res, sizeof(res), "%s_%d", name, k);
    kiln_sbuf_printf(o, "          %s = vector.insert %s, %s [%d, %d] : vector<16xf32> into "
                        "vector<%dx%dx16xf32>\n",
                     res, vals[k], prev, k / nv, k % nv, rm, nv);
  }
}

// Ends a tile's loop over columns: its values as one [rm, nv, 16] vector,
// written into the loop's tensor (typed `ty`: [rows, vectors, 16]) at
// row `row` and vector col / 16, and the result yielded. The names are
// %<p>_<sfx> for the prefixes `p` = {vector, vector index, column (the
// loop's), result, tensor (its iter_arg)}; `c16` and `c0` are constants.
static void emit_tile_write_yield(kiln_sbuf_t *o, char (*vals)[64], int rm, int nv,
                                  const char *sfx, const char *const p[5], const char *c16,
                                  const char *row, const char *c0, const char *ty) {
  char w[64], idx[64], col[64], res[64], dest[64];
  snprintf(w, sizeof(w), "%%%s_%s", p[0], sfx);
  snprintf(idx, sizeof(idx), "%%%s_%s", p[1], sfx);
  snprintf(col, sizeof(col), "%%%s_%s", p[2], sfx);
  snprintf(res, sizeof(res), "%%%s_%s", p[3], sfx);
  snprintf(dest, sizeof(dest), "%%%s_%s", p[4], sfx);
  emit_tile_vector(o, w, vals, rm, nv);
  kiln_sbuf_printf(o,
      "          %s = arith.divui %s, %s : index\n"
      "          %s = vector.transfer_write %s, %s[%s, %s, %s] {in_bounds = [true, true, true]} "
      ": vector<%dx%dx16xf32>, %s\n"
      "          scf.yield %s : %s\n"
      "        }\n",
      idx, col, c16, res, w, dest, row, idx, c0, rm, nv, ty, res, ty);
}

// One tile of `rm` query rows: its first row %<lr> in the task's block
// (%lr_<id> an index value), the block's output tensor `ob`
// ([rows, Ev/16, 16]) and score block `sb` ([8, S/16, 16]) carried in;
// `nob` / `nsb` get them out.
static void emit_tile(kiln_emitter_t *e, const attn_chain_t *ch, const reads_t *rd, int id, int rm,
                      const char *lr, const char *ob, const char *sb, char nob[24],
                      char nsb[24]) {
  kiln_sbuf_t *o = &e->out;
  const char *q = e->values[ch->q].ssa, *kt = e->values[ch->kt].ssa,
             *v = e->values[ch->v].ssa;
  long long E = ch->E, S = ch->S, Ev = ch->Ev;
  long long NVE = Ev / 16;
  bool sym_S = KILN_IS_SYM(ch->S);
  // Sizes in types: "?" where symbolic.
  char BH[24], Ls[24], Ss[24], NVSs[24];
  snprintf(BH, sizeof(BH), KILN_IS_SYM(ch->BH) ? "?" : "%lld", (long long)ch->BH);
  snprintf(Ls, sizeof(Ls), KILN_IS_SYM(ch->L) ? "?" : "%lld", (long long)ch->L);
  snprintf(Ss, sizeof(Ss), sym_S ? "?" : "%lld", S);
  snprintf(NVSs, sizeof(NVSs), sym_S ? "?" : "%lld", S / 16);
  int t = e->next_id++;  // this tile's names: %..._<id>_<t>
  char bh[24], pad[24];
  snprintf(bh, sizeof(bh), "%%bh_%d", id);
  snprintf(pad, sizeof(pad), "%%padf_%d", id);
  char qty[96], ktty[96], vty[96], sty[64], oty[64];
  snprintf(qty, sizeof(qty), "tensor<%sx%sx%lldxf32>", BH, Ls, E);
  snprintf(ktty, sizeof(ktty), "tensor<%sx%lldx%sxf32>", BH, E, Ss);
  snprintf(vty, sizeof(vty), "tensor<%sx%sx%lldxf32>", BH, Ss, Ev);
  snprintf(sty, sizeof(sty), "tensor<8x%sx16xf32>", NVSs);
  snprintf(oty, sizeof(oty), "tensor<?x%lldx16xf32>", NVE);
  // The tile's rows in Q: %gr<r>.
  for (int r = 0; r < rm; ++r)
    kiln_sbuf_printf(o,
        "        %%gr%d_%d_%d = affine.apply affine_map<(d0, d1) -> (d0 + d1 + %d)>"
        "(%%r0_%d, %s)\n",
        r, id, t, r, id, lr);
  // The keys the tile reads: all S, or (causal) up to its last row,
  // rounded up to whole vectors: %kend (a multiple of 16), %kmain (of 32)
  // and %knv (vectors); the keys past it are never computed nor read.
  char kend[32], kmain[32], knv[32];
  long long S32 = S / 32 * 32;
  if (ch->causal) {
    snprintf(kend, sizeof(kend), "%%kend_%d_%d", id, t);
    snprintf(kmain, sizeof(kmain), "%%kmain_%d_%d", id, t);
    snprintf(knv, sizeof(knv), "%%knv_%d_%d", id, t);
    if (sym_S)  // the bound: S rounded up to 16
      kiln_sbuf_printf(o,
          "        %s = affine.min affine_map<(d0, d1)[s0] -> ((d0 + d1 + %d) floordiv 16 * 16, s0)>"
          "(%%r0_%d, %s)[%%skend_%d]\n", kend, rm + 15, id, lr, id);
    else
      kiln_sbuf_printf(o,
          "        %s = affine.min affine_map<(d0, d1) -> ((d0 + d1 + %d) floordiv 16 * 16, %lld)>"
          "(%%r0_%d, %s)\n", kend, rm + 15, S, id, lr);
    kiln_sbuf_printf(o,
        "        %s = affine.apply affine_map<(d0) -> (d0 floordiv 32 * 32)>(%s)\n"
        "        %s = affine.apply affine_map<(d0) -> (d0 floordiv 16)>(%s)\n",
        kmain, kend, knv, kend);
  } else if (sym_S) {  // S rounded up to 16, to 32 below that, vectors
    snprintf(kend, sizeof(kend), "%%skend_%d", id);
    snprintf(kmain, sizeof(kmain), "%%skmain_%d", id);
    snprintf(knv, sizeof(knv), "%%sknv_%d", id);
  } else {
    snprintf(kend, sizeof(kend), "%%c%lld_%d", S, id);
    snprintf(kmain, sizeof(kmain), "%%c%lld_%d", S32, id);
    snprintf(knv, sizeof(knv), "%%c%lld_%d", S / 16, id);
  }
  // 1. Scores, 32 (or a last 16) keys at a time.
  char cur[24];
  snprintf(cur, sizeof(cur), "%s", sb);
  for (int part = 0; part < 2; ++part) {
    int nv = part ? 1 : 2;
    if (!ch->causal && !sym_S && (part ? S32 == S : S32 == 0)) continue;
    char lo[32], hi[32];
    if (part)
      snprintf(lo, sizeof(lo), "%s", kmain);
    else
      snprintf(lo, sizeof(lo), "%%c0_%d", id);
    snprintf(hi, sizeof(hi), "%s", part ? kend : kmain);
    kiln_sbuf_printf(o,
        "        %%sj_%d_%d_%d = scf.for %%j_%d_%d_%d = %s to %s step %%c%d_%d "
        "iter_args(%%sc_%d_%d_%d = %s) -> (%s) {\n"
        "          %%jh_%d_%d_%d = arith.addi %%j_%d_%d_%d, %%c16_%d : index\n",
        id, t, part, id, t, part, lo, hi, nv * 16, id, id, t, part, cur, sty, id, t,
        part, id, t, part, id);
    char sfx[36], res[48], iv[48], c0[24], cE[24], c1[24], zero[24];
    snprintf(sfx, sizeof(sfx), "%d_%d_%d", id, t, part);
    snprintf(res, sizeof(res), "%%sa_%s", sfx);
    snprintf(iv, sizeof(iv), "%%e_%s", sfx);
    snprintf(c0, sizeof(c0), "%%c0_%d", id);
    snprintf(cE, sizeof(cE), "%%c%lld_%d", E, id);
    snprintf(c1, sizeof(c1), "%%c1_%d", id);
    snprintf(zero, sizeof(zero), "%%zero_%d", id);
    open_vec_loop(o, res, nv * rm, iv, c0, cE, c1, "sx", sfx, zero);
    for (int h = 0; h < nv; ++h) {
      char res[32], ev[24], jv[24];
      snprintf(res, sizeof(res), "%%kb%d_%d_%d_%d", h, id, t, part);
      snprintf(ev, sizeof(ev), "%%e_%d_%d_%d", id, t, part);
      snprintf(jv, sizeof(jv), "%s_%d_%d_%d", h ? "%jh" : "%j", id, t, part);
      emit_load(o, rd, 1, res, true, bh, ev, jv, kt, ktty, pad);
    }
    for (int r = 0; r < rm; ++r) {
      char res[32], gv[24], ev[24];
      snprintf(res, sizeof(res), "%%qs%d_%d_%d_%d", r, id, t, part);
      snprintf(gv, sizeof(gv), "%%gr%d_%d_%d", r, id, t);
      snprintf(ev, sizeof(ev), "%%e_%d_%d_%d", id, t, part);
      emit_load(o, rd, 0, res, false, bh, gv, ev, q, qty, pad);
      kiln_sbuf_printf(o,
          "            %%qb%d_%d_%d_%d = vector.broadcast %%qs%d_%d_%d_%d : f32 to vector<16xf32>\n",
          r, id, t, part, r, id, t, part);
      for (int h = 0; h < nv; ++h)
        kiln_sbuf_printf(o,
            "            %%sy%d_%d_%d_%d = vector.fma %%qb%d_%d_%d_%d, %%kb%d_%d_%d_%d, "
            "%%sx%d_%d_%d_%d : vector<16xf32>\n",
            r * nv + h, id, t, part, r, id, t, part, h, id, t, part, r * nv + h, id, t, part);
    }
    char vals[16][64];
    for (int k = 0; k < nv * rm; ++k) snprintf(vals[k], sizeof(vals[k]), "%%sy%d_%s", k, sfx);
    close_vec_loop(o, vals, nv * rm);
    // Scaled (masked), into the score block as one [rm, nv, 16] write.
    for (int k = 0; k < nv * rm; ++k) {
      char sv[64];
      snprintf(sv, sizeof(sv), "%%ss%d_%s", k, sfx);
      kiln_sbuf_printf(o, "          %s = arith.mulf %%sa_%d_%d_%d#%d, %%scale_%d : vector<16xf32>\n",
                       sv, id, t, part, k, id);
      if (rd->mask[0]) {
        // + mask[head, row, keys]: a vector of keys, or the row's one
        // value broadcast.
        int r = k / nv, h = k % nv;
        if (rd->m_row_ssa[0])
          kiln_sbuf_printf(o,
              "          %%mi%d_%d_%d_%d = affine.apply affine_map<(d0, d1)[s0, s1] -> (s0 + d0 * s1 + "
              "(d1 + %d) * %lld)>(%%gr%d_%d_%d, %%j_%d_%d_%d)[%s, %s]\n",
              k, id, t, part, h * 16, (long long)rd->m_key, r, id, t, id, t, part, rd->moff,
              rd->m_row_ssa);
        else
          kiln_sbuf_printf(o,
              "          %%mi%d_%d_%d_%d = affine.apply affine_map<(d0, d1)[s0] -> (s0 + d0 * %lld + "
              "(d1 + %d) * %lld)>(%%gr%d_%d_%d, %%j_%d_%d_%d)[%s]\n",
              k, id, t, part, (long long)rd->m_row, h * 16, (long long)rd->m_key, r, id, t, id, t,
              part, rd->moff);
        // (Under a symbolic S the last vector of keys may pass the mask's
        // end: read masked; its lanes past S become -inf below.)
        if (rd->m_key)
          kiln_sbuf_printf(o,
              "          %%mv%d_%d_%d_%d = vector.transfer_read %s[%%mi%d_%d_%d_%d], %%padf_%d "
              "{in_bounds = [%s]} : %s, vector<16xf32>\n",
              k, id, t, part, rd->mask, k, id, t, part, id, sym_S ? "false" : "true", rd->mty);
        else
          kiln_sbuf_printf(o,
              "          %%ms%d_%d_%d_%d = tensor.extract %s[%%mi%d_%d_%d_%d] : %s\n"
              "          %%mv%d_%d_%d_%d = vector.broadcast %%ms%d_%d_%d_%d : f32 to vector<16xf32>\n",
              k, id, t, part, rd->mask, k, id, t, part, rd->mty, k, id, t, part, k, id, t, part);
        kiln_sbuf_printf(o, "          %%sm%d_%d_%d_%d = arith.addf %s, %%mv%d_%d_%d_%d : vector<16xf32>\n",
                         k, id, t, part, sv, k, id, t, part);
        snprintf(sv, sizeof(sv), "%%sm%d_%d_%d_%d", k, id, t, part);
      }
      if (sym_S) {
        // Keys past S are -inf: lanes j + 16 h + (0 .. 15) >= S.
        int h = k % nv;
        char n[48];
        snprintf(n, sizeof(n), "%d_%s", k, sfx);
        kiln_sbuf_printf(o,
            "          %%qk%s = affine.apply affine_map<(d0) -> (d0 + %d)>(%%j_%d_%d_%d)\n"
            "          %%qki%s = arith.index_cast %%qk%s : index to i32\n"
            "          %%qkv%s = vector.broadcast %%qki%s : i32 to vector<16xi32>\n"
            "          %%qkl%s = arith.addi %%qkv%s, %%iota_%d : vector<16xi32>\n"
            "          %%qok%s = arith.cmpi slt, %%qkl%s, %%svec_%d : vector<16xi32>\n"
            "          %%qs%s = arith.select %%qok%s, %s, %%ninf_%d : vector<16xi1>, "
            "vector<16xf32>\n",
            n, h * 16, id, t, part, n, n, n, n, n, n, id, n, n, id, n, n, sv, id);
        snprintf(sv, sizeof(sv), "%%qs%s", n);
      }
      if (ch->causal) {
        // Keys past the row are -inf: lanes j + 16 h + (0 .. 15) > row.
        int r = k / nv, h = k % nv;
        char n[48];
        snprintf(n, sizeof(n), "%d_%s", k, sfx);
        kiln_sbuf_printf(o,
            "          %%ck%s = affine.apply affine_map<(d0) -> (d0 + %d)>(%%j_%d_%d_%d)\n"
            "          %%cki%s = arith.index_cast %%ck%s : index to i32\n"
            "          %%ckv%s = vector.broadcast %%cki%s : i32 to vector<16xi32>\n"
            "          %%ckl%s = arith.addi %%ckv%s, %%iota_%d : vector<16xi32>\n",
            n, h * 16, id, t, part, n, n, n, n, n, n, id);
        kiln_sbuf_printf(o,
            "          %%cri%s = arith.index_cast %%gr%d_%d_%d : index to i32\n"
            "          %%crv%s = vector.broadcast %%cri%s : i32 to vector<16xi32>\n"
            "          %%cok%s = arith.cmpi sle, %%ckl%s, %%crv%s : vector<16xi32>\n"
            "          %%cs%s = arith.select %%cok%s, %s, %%ninf_%d : vector<16xi1>, "
            "vector<16xf32>\n",
            n, r, id, t, n, n, n, n, n, n, n, sv, id);
        snprintf(sv, sizeof(sv), "%%cs%s", n);
      }
      snprintf(vals[k], sizeof(vals[k]), "%s", sv);
    }
    static const char *const names[5] = {"sw", "jv", "j", "sn", "sc"};
    char c16[24], c0r[24];
    snprintf(c16, sizeof(c16), "%%c16_%d", id);
    snprintf(c0r, sizeof(c0r), "%%c0_%d", id);
    emit_tile_write_yield(o, vals, rm, nv, sfx, names, c16, c0r, c0r, sty);
    snprintf(cur, sizeof(cur), "%%sj_%d_%d_%d", id, t, part);
  }
  // 2. The rows' maxima, exp(s - max) in place and 1 / the sums, all rows
  // in each loop: a row alone is a chain of dependent steps (its
  // horizontal max and sum, the division) that left the core idle.
  char tsfx[24], mres[32], miv[32], c0[24], c1[24], ninf[24];
  snprintf(tsfx, sizeof(tsfx), "%d_%d", id, t);
  snprintf(mres, sizeof(mres), "%%mx_%s", tsfx);
  snprintf(miv, sizeof(miv), "%%mj_%s", tsfx);
  snprintf(c0, sizeof(c0), "%%c0_%d", id);
  snprintf(c1, sizeof(c1), "%%c1_%d", id);
  snprintf(ninf, sizeof(ninf), "%%ninf_%d", id);
  open_vec_loop(o, mres, rm, miv, c0, knv, c1, "mc", tsfx, ninf);
  char m[8][64];
  for (int r = 0; r < rm; ++r) {
    char a[24], b[24];
    kiln_sbuf_printf(o,
        "          %%mr%d_%d_%d = vector.transfer_read %s[%%c%d_%d, %%mj_%d_%d, %%c0_%d], "
        "%%padf_%d {in_bounds = [true]} : %s, vector<16xf32>\n",
        r, id, t, cur, r, id, id, t, id, id, sty);
    snprintf(a, sizeof(a), "%%mc%d_%d_%d", r, id, t);
    snprintf(b, sizeof(b), "%%mr%d_%d_%d", r, id, t);
    kiln_emit_vec_max(e, a, b, m[r]);
  }
  close_vec_loop(o, m, rm);
  // A row whose every key is masked (its max -inf) is 0, as PyTorch's SDPA
  // kernels give it (its math form, softmax then bmm, gives NaN): its max
  // is taken as 0 so exp(s - max) stays finite, and 1 / sum as 0.
  for (int r = 0; r < rm; ++r) {
    char a[24], mm[24];
    snprintf(a, sizeof(a), "%%mx_%d_%d#%d", id, t, r);
    kiln_emit_vec_hmax(e, a, mm);
    kiln_sbuf_printf(o,
        "        %%mnf%d_%d_%d = arith.constant 0xFF800000 : f32\n"
        "        %%mz%d_%d_%d = arith.constant 0.0 : f32\n"
        "        %%mall%d_%d_%d = arith.cmpf oeq, %s, %%mnf%d_%d_%d : f32\n"
        "        %%mfin%d_%d_%d = arith.select %%mall%d_%d_%d, %%mz%d_%d_%d, %s : f32\n"
        "        %%mb%d_%d_%d = vector.broadcast %%mfin%d_%d_%d : f32 to vector<16xf32>\n",
        r, id, t, r, id, t, r, id, t, mm, r, id, t, r, id, t, r, id, t, r, id, t, mm, r, id, t,
        r, id, t);
  }
  kiln_sbuf_printf(o,
      "        %%ex_%d_%d:%d = scf.for %%xj_%d_%d = %%c0_%d to %s step %%c1_%d "
      "iter_args(%%xt_%d_%d = %s",
      id, t, rm + 1, id, t, id, knv, id, id, t, cur);
  for (int r = 0; r < rm; ++r) kiln_sbuf_printf(o, ", %%xs%d_%d_%d = %%zero_%d", r, id, t, id);
  kiln_sbuf_printf(o, ") -> (%s", sty);
  for (int r = 0; r < rm; ++r) kiln_sbuf_puts(o, ", vector<16xf32>");
  kiln_sbuf_puts(o, ") {\n");
  char xt[24], sum[8][24];
  snprintf(xt, sizeof(xt), "%%xt_%d_%d", id, t);
  for (int r = 0; r < rm; ++r) {
    char xd[24], ex[24], xw[24];
    kiln_sbuf_printf(o,
        "          %%xr%d_%d_%d = vector.transfer_read %s[%%c%d_%d, %%xj_%d_%d, %%c0_%d], "
        "%%padf_%d {in_bounds = [true]} : %s, vector<16xf32>\n"
        "          %%xd%d_%d_%d = arith.subf %%xr%d_%d_%d, %%mb%d_%d_%d : vector<16xf32>\n",
        r, id, t, xt, r, id, id, t, id, id, sty, r, id, t, r, id, t, r, id, t);
    snprintf(xd, sizeof(xd), "%%xd%d_%d_%d", r, id, t);
    int saved = e->lanes;
    e->lanes = 16;
    kiln_emit_math(e, o, "exp_nonpositive", xd, KILN_F32, ex);
    e->lanes = saved;
    kiln_emit_fresh(e, xw);
    kiln_emit_fresh(e, sum[r]);
    kiln_sbuf_printf(o,
        "          %s = vector.transfer_write %s, %s[%%c%d_%d, %%xj_%d_%d, %%c0_%d] "
        "{in_bounds = [true]} : vector<16xf32>, %s\n"
        "          %s = arith.addf %%xs%d_%d_%d, %s : vector<16xf32>\n",
        xw, ex, xt, r, id, id, t, id, sty, sum[r], r, id, t, ex);
    snprintf(xt, sizeof(xt), "%s", xw);
  }
  kiln_sbuf_printf(o, "          scf.yield %s", xt);
  for (int r = 0; r < rm; ++r) kiln_sbuf_printf(o, ", %s", sum[r]);
  kiln_sbuf_printf(o, " : %s", sty);
  for (int r = 0; r < rm; ++r) kiln_sbuf_puts(o, ", vector<16xf32>");
  kiln_sbuf_puts(o, "\n        }\n");
  char rcp[8][24];
  for (int r = 0; r < rm; ++r) {
    kiln_sbuf_printf(o,
        "        %%su%d_%d_%d = vector.reduction <add>, %%ex_%d_%d#%d : vector<16xf32> "
        "into f32\n"
        "        %%rd%d_%d_%d = arith.divf %%one_%d, %%su%d_%d_%d : f32\n"
        "        %%rc%d_%d_%d = arith.select %%mall%d_%d_%d, %%mz%d_%d_%d, %%rd%d_%d_%d : f32\n"
        "        %%rb%d_%d_%d = vector.broadcast %%rc%d_%d_%d : f32 to vector<16xf32>\n",
        r, id, t, id, t, r + 1, r, id, t, id, r, id, t, r, id, t, r, id, t, r, id, t, r, id, t,
        r, id, t, r, id, t);
    snprintf(rcp[r], sizeof(rcp[r]), "%%rb%d_%d_%d", r, id, t);
  }
  snprintf(cur, sizeof(cur), "%%ex_%d_%d#0", id, t);
  // 3. The output, 32 (or a last 16) columns of V at a time, over the keys
  // 16 at a time (unrolled: the probabilities are read as scalars).
  char ocur[24];
  snprintf(ocur, sizeof(ocur), "%s", ob);
  long long E32 = Ev / 32 * 32;
  for (int part = 0; part < 2; ++part) {
    int nv = part ? 1 : 2;
    long long lo = part ? E32 : 0, hi = part ? Ev : E32;
    if (lo == hi) continue;
    kiln_sbuf_printf(o,
        "        %%oc_%d_%d_%d = scf.for %%c_%d_%d_%d = %%c%lld_%d to %%c%lld_%d step %%c%d_%d "
        "iter_args(%%ot_%d_%d_%d = %s) -> (%s) {\n"
        "          %%ch_%d_%d_%d = arith.addi %%c_%d_%d_%d, %%c16_%d : index\n",
        id, t, part, id, t, part, lo, id, hi, id, nv * 16, id, id, t, part, ocur, oty, id, t,
        part, id, t, part, id);
    char sfx[36], res[48], iv[48], zero[24];
    snprintf(sfx, sizeof(sfx), "%d_%d_%d", id, t, part);
    snprintf(res, sizeof(res), "%%oa_%s", sfx);
    snprintf(iv, sizeof(iv), "%%kv_%s", sfx);
    snprintf(zero, sizeof(zero), "%%zero_%d", id);
    // (A symbolic S: its whole vectors here, the keys past them below.)
    // (Causal too: the vectors below both the tile's bound and S's whole
    // vectors, then the keys up to the lesser of its bound and S.)
    char knvf[32], rlo[32], rhi[32];
    if (sym_S && ch->causal) {
      snprintf(knvf, sizeof(knvf), "%%oknv_%d_%d_%d", id, t, part);
      snprintf(rlo, sizeof(rlo), "%%orlo_%d_%d_%d", id, t, part);
      snprintf(rhi, sizeof(rhi), "%%orhi_%d_%d_%d", id, t, part);
      kiln_sbuf_printf(o,
          "          %s = affine.min affine_map<()[s0, s1] -> (s0, s1)>()[%s, %%sknvf_%d]\n"
          "          %s = affine.apply affine_map<()[s0] -> (s0 * 16)>()[%s]\n"
          "          %s = affine.min affine_map<()[s0, s1] -> (s0, s1)>()[%s, %s]\n",
          knvf, knv, id, rlo, knvf, rhi, kend, e->sym_ssa[KILN_SYM_ID(ch->S)]);
    } else if (sym_S) {
      snprintf(knvf, sizeof(knvf), "%%sknvf_%d", id);
      snprintf(rlo, sizeof(rlo), "%%sfull_%d", id);
      snprintf(rhi, sizeof(rhi), "%s", e->sym_ssa[KILN_SYM_ID(ch->S)]);
    } else {
      snprintf(knvf, sizeof(knvf), "%s", knv);
    }
    open_vec_loop(o, res, nv * rm, iv, c0, knvf, c1, "ox", sfx, zero);
    char acc[16][64];
    for (int k = 0; k < nv * rm; ++k)
      snprintf(acc[k], sizeof(acc[k]), "%%ox%d_%d_%d_%d", k, id, t, part);
    for (int l = 0; l < 16; ++l) {
      kiln_sbuf_printf(o,
          "            %%kk%d_%d_%d_%d = affine.apply affine_map<(d0) -> (d0 * 16 + %d)>"
          "(%%kv_%d_%d_%d)\n",
          l, id, t, part, l, id, t, part);
      for (int h = 0; h < nv; ++h) {
        char res[40], kv[24], cv[24];
        snprintf(res, sizeof(res), "%%vb%d_%d_%d_%d_%d", h, l, id, t, part);
        snprintf(kv, sizeof(kv), "%%kk%d_%d_%d_%d", l, id, t, part);
        snprintf(cv, sizeof(cv), "%s_%d_%d_%d", h ? "%ch" : "%c", id, t, part);
        emit_load(o, rd, 2, res, true, bh, kv, cv, v, vty, pad);
      }
      for (int r = 0; r < rm; ++r) {
        kiln_sbuf_printf(o,
            "            %%ps%d_%d_%d_%d_%d = tensor.extract %s[%%c%d_%d, %%kv_%d_%d_%d, "
            "%%c%d_%d] : %s\n"
            "            %%pb%d_%d_%d_%d_%d = vector.broadcast %%ps%d_%d_%d_%d_%d : f32 to "
            "vector<16xf32>\n",
            r, l, id, t, part, cur, r, id, id, t, part, l, id, sty, r, l, id, t, part, r, l,
            id, t, part);
        for (int h = 0; h < nv; ++h) {
          char y[40];
          snprintf(y, sizeof(y), "%%oy%d_%d_%d_%d_%d", r * nv + h, l, id, t, part);
          kiln_sbuf_printf(o,
              "            %s = vector.fma %%pb%d_%d_%d_%d_%d, %%vb%d_%d_%d_%d_%d, %s : "
              "vector<16xf32>\n",
              y, r, l, id, t, part, h, l, id, t, part, acc[r * nv + h]);
          snprintf(acc[r * nv + h], sizeof(acc[r * nv + h]), "%s", y);
        }
      }
    }
    close_vec_loop(o, acc, nv * rm);
    if (sym_S) {
      // The keys past S's whole vectors, one at a time (V's rows past S
      // are never read).
      char rres[48], riv[48];
      snprintf(rres, sizeof(rres), "%%or_%s", sfx);
      snprintf(riv, sizeof(riv), "%%rk_%s", sfx);
      kiln_sbuf_printf(o, "          %s:%d = scf.for %s = %s to %s step %s iter_args(",
                       rres, nv * rm, riv, rlo, rhi, c1);
      for (int k = 0; k < nv * rm; ++k)
        kiln_sbuf_printf(o, "%s%%rz%d_%s = %s#%d", k ? ", " : "", k, sfx, res, k);
      kiln_sbuf_puts(o, ") -> (");
      for (int k = 0; k < nv * rm; ++k) kiln_sbuf_printf(o, "%svector<16xf32>", k ? ", " : "");
      kiln_sbuf_printf(o, ") {\n"
                          "            %%rkv_%s = arith.divui %s, %%c16_%d : index\n"
                          "            %%rkl_%s = arith.remui %s, %%c16_%d : index\n",
                       sfx, riv, id, sfx, riv, id);
      for (int h = 0; h < nv; ++h) {
        char vr[48], cv[24];
        snprintf(vr, sizeof(vr), "%%vr%d_%s", h, sfx);
        snprintf(cv, sizeof(cv), "%s_%d_%d_%d", h ? "%ch" : "%c", id, t, part);
        emit_load(o, rd, 2, vr, true, bh, riv, cv, v, vty, pad);
      }
      char ry[16][64];
      for (int r = 0; r < rm; ++r) {
        kiln_sbuf_printf(o,
            "            %%rp%d_%s = tensor.extract %s[%%c%d_%d, %%rkv_%s, %%rkl_%s] : %s\n"
            "            %%rpb%d_%s = vector.broadcast %%rp%d_%s : f32 to vector<16xf32>\n",
            r, sfx, cur, r, id, sfx, sfx, sty, r, sfx, r, sfx);
        for (int h = 0; h < nv; ++h) {
          int k = r * nv + h;
          snprintf(ry[k], sizeof(ry[k]), "%%ry%d_%s", k, sfx);
          kiln_sbuf_printf(o, "            %s = vector.fma %%rpb%d_%s, %%vr%d_%s, %%rz%d_%s : "
                              "vector<16xf32>\n", ry[k], r, sfx, h, sfx, k, sfx);
        }
      }
      close_vec_loop(o, ry, nv * rm);
      snprintf(res, sizeof(res), "%s", rres);
    }
    // Times 1 / sum, into the output block as one [rm, nv, 16] write.
    char vals[16][64];
    for (int k = 0; k < nv * rm; ++k) {
      snprintf(vals[k], sizeof(vals[k]), "%%on%d_%s", k, sfx);
      kiln_sbuf_printf(o, "          %s = arith.mulf %s#%d, %s : vector<16xf32>\n", vals[k], res,
                       k, rcp[k / nv]);
    }
    static const char *const names[5] = {"ow", "cv", "c", "onx", "ot"};
    char c16[24];
    snprintf(c16, sizeof(c16), "%%c16_%d", id);
    emit_tile_write_yield(o, vals, rm, nv, sfx, names, c16, lr, c0, oty);
    snprintf(ocur, sizeof(ocur), "%%oc_%d_%d_%d", id, t, part);
  }
  snprintf(nob, 24, "%s", ocur);
  // The score block out, as its type had it (the last row loop's result).
  snprintf(nsb, 24, "%s", cur);
}

// Where the kernel writes its output. By default O [BH, L, Ev] as the
// second bmm's result. Where O is only viewed as [heads.., L, Ev] and
// permuted (the last dim staying last), and maybe cloned, which is how
// the heads are merged back ([B, L, H, Ev] for a batch-first projection,
// [L, B, H, Ev] for nn.MultiheadAttention's sequence-first one), the kernel
// writes that permuted tensor T instead, and the merge's copy is gone.
typedef struct out_plan {
  int last;                      // the node whose result T is
  int nodes[8], count;           // the nodes after the bmm it takes over
  int rank;                      // T's rank
  int64_t dims[KILN_MAX_RANK];   // T's dims
  int nh;                        // head dims (their sizes multiply to BH)
  int64_t hsize[KILN_MAX_RANK];  // ... outer first
  int hpos[KILN_MAX_RANK];       // ... and their dims in T
  int lpos;                      // the query rows' dim in T (Ev's is the last)
} out_plan_t;

static void plan_output(const kiln_emitter_t *e, const attn_chain_t *ch, out_plan_t *op) {
  const kiln_graph_t *g = e->g;
  memset(op, 0, sizeof(*op));
  op->last = ch->bmm2;
  op->rank = 3;
  op->dims[0] = ch->BH;
  op->dims[1] = ch->L;
  op->dims[2] = ch->Ev;
  op->nh = 1;
  op->hsize[0] = ch->BH;
  op->hpos[0] = 0;
  op->lpos = 1;
  out_plan_t p = *op;
  const kiln_type_t *cur = kiln_node_result_type(g, &g->nodes[ch->bmm2], 0);
  int32_t v = g->nodes[ch->bmm2].results[0];
  int at = ch->bmm2;
  bool permuted = false;
  while (p.count < 8) {
    int u = kiln_emit_sole_reader(g, v, at);
    if (u < 0) break;
    const kiln_node_t *c = &g->nodes[u];
    if (c->result_count != 1) break;
    const kiln_type_t *rt = kiln_node_result_type(g, c, 0);
    if (!permuted && (c->op == KILN_OP_VIEW || c->op == KILN_OP_RESHAPE)) {
      int r = rt->rank;
      if (r < 3 || rt->dims[r - 1] != ch->Ev || rt->dims[r - 2] != ch->L ||
          !lead_is_bh(g, rt, r - 2, ch))
        break;
    } else if (!permuted && (c->op == KILN_OP_PERMUTE || c->op == KILN_OP_TRANSPOSE)) {
      int r = cur->rank;
      int32_t perm[KILN_MAX_RANK];
      kiln_node_permutation(c, r, perm);
      if (perm[r - 1] != r - 1) break;
      // A symbolic head dim only outermost (its index needs no mod).
      bool inner_sym = false;
      for (int d = 1; d < r - 2; ++d) inner_sym |= KILN_IS_SYM(cur->dims[d]);
      if (inner_sym) break;
      p.rank = r;
      p.nh = r - 2;
      for (int k = 0; k < r; ++k) {
        p.dims[k] = rt->dims[k];
        if (perm[k] < r - 2) {
          p.hsize[perm[k]] = cur->dims[perm[k]];
          p.hpos[perm[k]] = k;
        } else if (perm[k] == r - 2) {
          p.lpos = k;
        }
      }
      permuted = true;
      p.last = u;
    } else if (permuted && c->op == KILN_OP_CLONE) {
      p.last = u;
      p.nodes[p.count++] = u;
      break;
    } else {
      break;
    }
    p.nodes[p.count++] = u;
    v = c->results[0];
    cur = rt;
    at = u;
  }
  if (!permuted) return;
  // Views after the permute (not a clone) stay nodes of their own.
  while (p.count > 0 && p.nodes[p.count - 1] != p.last) --p.count;
  *op = p;
}

// T's type, and the slice of head %bh's rows %r0 .. %r0 + %rows, all Ev
// columns: "[offsets] [sizes] [strides] : T" (a [rows, Ev] slice, rank-
// reduced), the head offsets named %aho<i>_<id>.
static void print_type(kiln_sbuf_t *o, const out_plan_t *op) {
  kiln_sbuf_puts(o, "tensor<");
  for (int k = 0; k < op->rank; ++k)
    if (KILN_IS_SYM(op->dims[k])) kiln_sbuf_puts(o, "?x");
    else kiln_sbuf_printf(o, "%lldx", (long long)op->dims[k]);
  kiln_sbuf_puts(o, "f32>");
}

static void print_block_slice(kiln_sbuf_t *o, const out_plan_t *op, int id) {
  char off[KILN_MAX_RANK][24], size[KILN_MAX_RANK][24];
  for (int k = 0; k < op->rank; ++k) {
    snprintf(off[k], sizeof(off[k]), "0");
    snprintf(size[k], sizeof(size[k]), "1");
  }
  for (int i = 0; i < op->nh; ++i) snprintf(off[op->hpos[i]], 24, "%%aho%d_%d", i, id);
  snprintf(off[op->lpos], 24, "%%r0_%d", id);
  snprintf(size[op->lpos], 24, "%%rows_%d", id);
  snprintf(size[op->rank - 1], 24, "%lld", (long long)op->dims[op->rank - 1]);
  kiln_sbuf_puts(o, "[");
  for (int k = 0; k < op->rank; ++k) kiln_sbuf_printf(o, "%s%s", k ? ", " : "", off[k]);
  kiln_sbuf_puts(o, "] [");
  for (int k = 0; k < op->rank; ++k) kiln_sbuf_printf(o, "%s%s", k ? ", " : "", size[k]);
  kiln_sbuf_puts(o, "] [");
  for (int k = 0; k < op->rank; ++k) kiln_sbuf_printf(o, "%s1", k ? ", " : "");
  kiln_sbuf_puts(o, "]");
}

static void emit_attention(kiln_emitter_t *e, const attn_chain_t *ch, const out_plan_t *op,
                           kiln_tv_t *out) {
  kiln_sbuf_t *o = &e->out;
  int id = e->next_id++;
  long long L = ch->L, S = ch->S, Ev = ch->Ev;
  long long NVE = Ev / 16;
  bool sym_L = KILN_IS_SYM(ch->L), sym_S = KILN_IS_SYM(ch->S);
  const char *Lssa = sym_L ? e->sym_ssa[KILN_SYM_ID(ch->L)] : "";
  const char *Sssa = sym_S ? e->sym_ssa[KILN_SYM_ID(ch->S)] : "";
  // The heads: a number, or (a dynamic batch) the size's SSA value.
  char BH[24];
  if (KILN_IS_SYM(ch->BH)) snprintf(BH, sizeof(BH), "%s", e->sym_ssa[KILN_SYM_ID(ch->BH)]);
  else snprintf(BH, sizeof(BH), "%lld", (long long)ch->BH);
  // Tasks: blocks of up to 128 query rows (whole tiles), so that a K^T
  // made per task (OPERAND_LOCAL) serves 16 tiles (the bench's 128-row
  // heads: 0.30 -> 0.27 ms against blocks of 64). (The lowering does not
  // know the thread count: few heads of few rows are few tasks.)
  // A symbolic L: blocks of 128, their count at run time.
  long long L8 = (L + 7) / 8 * 8, RB = sym_L || L8 >= 128 ? 128 : L8,
            NB = sym_L ? 0 : (L + RB - 1) / RB;
  char nb[24];
  if (sym_L) {
    snprintf(nb, sizeof(nb), "%%anb_%d", id);
    kiln_sbuf_printf(o, "    %s = affine.apply affine_map<()[s0] -> ((s0 + 127) floordiv 128)>()[%s]\n",
                     nb, Lssa);
  } else {
    snprintf(nb, sizeof(nb), "%lld", NB);
  }
  char rty[160], sty[64], oty[64], slice[512];
  {
    kiln_sbuf_t sbuf;
    kiln_sbuf_init(&sbuf);
    print_block_slice(&sbuf, op, id);
    snprintf(slice, sizeof(slice), "%s", sbuf.data ? sbuf.data : "");
    kiln_sbuf_free(&sbuf);
  }
  {
    kiln_sbuf_t tb;
    kiln_sbuf_init(&tb);
    print_type(&tb, op);
    snprintf(rty, sizeof(rty), "%s", tb.data ? tb.data : "");
    kiln_sbuf_free(&tb);
  }
  if (sym_S) snprintf(sty, sizeof(sty), "tensor<8x?x16xf32>");
  else snprintf(sty, sizeof(sty), "tensor<8x%lldx16xf32>", S / 16);
  snprintf(oty, sizeof(oty), "tensor<?x%lldx16xf32>", NVE);
  float sc = (float)ch->scale;
  uint32_t su;
  memcpy(&su, &sc, 4);
  // Q read as scalars, K^T and V as vectors along their last dim.
  reads_t rd;
  memset(&rd, 0, sizeof(rd));
  rd.kmask = sym_S;
  const int32_t vals[3] = {ch->q, ch->kt, ch->v};
  for (int w = 0; w < 3; ++w) {
    plan_operand(e, ch->sb, vals[w], w == 0 ? -1 : 2, w == 1, &rd.op[w]);
    if (rd.op[w].mode == OPERAND_TENSOR) continue;
    const kiln_tv_t *b = &e->values[rd.op[w].base];
    if (kiln_type_is_static(&b->type))
      snprintf(rd.fty[w], sizeof(rd.fty[w]), "tensor<%lldxf32>",
               (long long)kiln_type_numel(&b->type));
    else
      snprintf(rd.fty[w], sizeof(rd.fty[w]), "tensor<?xf32>");
    if (b->type.rank == 1) {
      snprintf(rd.flat[w], sizeof(rd.flat[w]), "%s", b->ssa);
      continue;
    }
    char bty[256];
    kiln_mlir_tensor_type(&b->type, bty, sizeof(bty));
    snprintf(rd.flat[w], sizeof(rd.flat[w]), "%%afl%d_%d", w, id);
    kiln_sbuf_printf(o, "    %s = tensor.collapse_shape %s [[", rd.flat[w], b->ssa);
    for (int d = 0; d < b->type.rank; ++d) kiln_sbuf_printf(o, "%s%d", d ? ", " : "", d);
    kiln_sbuf_printf(o, "]] : %s into %s\n", bty, rd.fty[w]);
  }
  // The mask: its strides against the scores' view [.., L, S] (0 where
  // broadcast), read flat.
  // With symbolic sizes (L, S) in the mask, a stride is a product with
  // them: `msym[d]` then names its SSA value (computed here, before the
  // forall), and mstride[d] is only nonzero-or-not.
  int64_t mstride[KILN_MAX_RANK] = {0};
  char msym[KILN_MAX_RANK][24];
  memset(msym, 0, sizeof(msym));
  const kiln_type_t *mv = &ch->mview;
  kiln_tv_t mf;
  if (ch->mask >= 0 && ch->mask_bool) {
    // A boolean mask: made the additive one first (0 where kept, -inf where
    // masked), a [mask's shape] f32 tensor the schedule vectorizes; the
    // kernel then reads it as any other.
    const kiln_tv_t *mb = &e->values[ch->mask];
    char bty[256], fty[256], empty[24];
    mf.type = mb->type;
    mf.type.dtype = KILN_F32;
    kiln_mlir_tensor_type(&mb->type, bty, sizeof(bty));
    kiln_mlir_tensor_type(&mf.type, fty, sizeof(fty));
    kiln_emit_empty(e, &mf.type, empty);
    snprintf(mf.ssa, sizeof(mf.ssa), "%%amf_%d", id);
    char map[128];
    size_t mo = (size_t)snprintf(map, sizeof(map), "affine_map<(");
    for (int d = 0; d < mf.type.rank; ++d)
      mo += (size_t)snprintf(map + mo, sizeof(map) - mo, "%sd%d", d ? ", " : "", d);
    mo += (size_t)snprintf(map + mo, sizeof(map) - mo, ") -> (");
    for (int d = 0; d < mf.type.rank; ++d)
      mo += (size_t)snprintf(map + mo, sizeof(map) - mo, "%sd%d", d ? ", " : "", d);
    snprintf(map + mo, sizeof(map) - mo, ")>");
    kiln_sbuf_printf(o, "    %s = linalg.generic {indexing_maps = [%s, %s], iterator_types = [",
                     mf.ssa, map, map);
    for (int d = 0; d < mf.type.rank; ++d) kiln_sbuf_printf(o, "%s\"parallel\"", d ? ", " : "");
    char zero[24], ninf[24];
    snprintf(zero, sizeof(zero), "%%amz_%d", id);
    snprintf(ninf, sizeof(ninf), "%%ami_%d", id);
    uint32_t fill_bits;
    memcpy(&fill_bits, &ch->mask_fill, 4);
    kiln_sbuf_printf(o,
        "]} ins(%s : %s) outs(%s : %s) {\n"
        "    ^bb0(%%amb_%d: i8, %%amx_%d: f32):\n"  // (kiln's bools are bytes)
        "      %%amt_%d = arith.constant 0 : i8\n"
        "      %%amc_%d = arith.cmpi ne, %%amb_%d, %%amt_%d : i8\n"
        "      %s = arith.constant 0.0 : f32\n"
        "      %s = arith.constant 0x%08X : f32\n"
        "      %%ams_%d = arith.select %%amc_%d, %s, %s : f32\n"
        "      linalg.yield %%ams_%d : f32\n"
        "    } -> %s\n",
        mb->ssa, bty, empty, fty, id, id, id, id, id, id, zero, ninf, fill_bits, id, id,
        ch->mask_bool > 0 ? ninf : zero, ch->mask_bool > 0 ? zero : ninf, id, fty);
  }
  if (ch->mask >= 0) {
    const kiln_tv_t *m = ch->mask_bool ? &mf : &e->values[ch->mask];
    int R = mv->rank, off = R - m->type.rank;
    // The running stride is st x sp (sp: the SSA product of the symbolic
    // sizes passed so far, empty for none).
    int64_t st = 1;
    char sp[24] = "";
    for (int d = m->type.rank - 1; d >= 0; --d) {
      int64_t md = m->type.dims[d];
      mstride[off + d] = md == 1 ? 0 : st;
      if (md != 1 && sp[0]) {
        snprintf(msym[off + d], sizeof(msym[0]), "%%amst%d_%d", d, id);
        kiln_sbuf_printf(o, "    %s = affine.apply affine_map<()[s0] -> (s0 * %lld)>()[%s]\n",
                         msym[off + d], (long long)st, sp);
      }
      if (!KILN_IS_SYM(md)) {
        st *= md;
      } else if (sp[0]) {
        char nx[24];
        snprintf(nx, sizeof(nx), "%%amsp%d_%d", d, id);
        kiln_sbuf_printf(o, "    %s = arith.muli %s, %s : index\n", nx, sp,
                         e->sym_ssa[KILN_SYM_ID(md)]);
        snprintf(sp, sizeof(sp), "%s", nx);
      } else {
        snprintf(sp, sizeof(sp), "%s", e->sym_ssa[KILN_SYM_ID(md)]);
      }
    }
    rd.m_row = mstride[R - 2];
    rd.m_key = mstride[R - 1];
    if (msym[R - 2][0]) snprintf(rd.m_row_ssa, sizeof(rd.m_row_ssa), "%s", msym[R - 2]);
    if (kiln_type_is_static(&m->type))
      snprintf(rd.mty, sizeof(rd.mty), "tensor<%lldxf32>", (long long)st);
    else
      snprintf(rd.mty, sizeof(rd.mty), "tensor<?xf32>");
    if (m->type.rank == 1) {
      snprintf(rd.mask, sizeof(rd.mask), "%s", m->ssa);
    } else {
      char mty[256];
      kiln_mlir_tensor_type(&m->type, mty, sizeof(mty));
      snprintf(rd.mask, sizeof(rd.mask), "%%amk_%d", id);
      kiln_sbuf_printf(o, "    %s = tensor.collapse_shape %s [[", rd.mask, m->ssa);
      for (int d = 0; d < m->type.rank; ++d) kiln_sbuf_printf(o, "%s%d", d ? ", " : "", d);
      kiln_sbuf_printf(o, "]] : %s into %s\n", mty, rd.mty);
    }
  }
  kiln_type_t tt = {.dtype = KILN_F32, .rank = op->rank};
  memcpy(tt.dims, op->dims, sizeof(int64_t) * (size_t)op->rank);
  char init[24];
  kiln_emit_empty(e, &tt, init);
  kiln_sbuf_printf(o,
      "    %%ar_%d = scf.forall (%%bh_%d, %%blk_%d) in (%s, %s) shared_outs(%%aout_%d = "
      "%s) -> (%s) {\n"
      "      %%c0_%d = arith.constant 0 : index\n"
      "      %%c1_%d = arith.constant 1 : index\n"
      "      %%c8_%d = arith.constant 8 : index\n"
      "      %%c16_%d = arith.constant 16 : index\n"
      "      %%padf_%d = arith.constant 0.0 : f32\n"
      "      %%one_%d = arith.constant 1.0 : f32\n"
      "      %%zero_%d = arith.constant dense<0.0> : vector<16xf32>\n"
      "      %%ninf_%d = arith.constant dense<0xFF800000> : vector<16xf32>\n"
      "      %%scale_%d = arith.constant dense<0x%08X> : vector<16xf32>\n"
      "      %%iota_%d = arith.constant dense<[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, "
      "15]> : vector<16xi32>\n",
      id, id, id, BH, nb, id, init, rty, id, id, id, id, id, id, id, id, id, su, id);
  // Index constants the tiles name: 2..7 (score block rows), 32, the
  // bounds of the loops over S, E and Ev and their multiples of 32.
  // (A symbolic S has no constants: the -1s stand in and are skipped.)
  long long consts[] = {2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15, 32,
                        sym_S ? -1 : S, sym_S ? -1 : S / 32 * 32, ch->E,
                        sym_S ? -1 : S / 16, Ev, Ev / 32 * 32};
  long long done[32] = {0, 1, 8, 16, -1};
  int nd = 5;
  for (size_t i = 0; i < sizeof(consts) / sizeof(consts[0]); ++i) {
    bool dup = false;
    for (int k = 0; k < nd && !dup; ++k) dup = done[k] == consts[i];
    if (dup) continue;
    done[nd++] = consts[i];
    kiln_sbuf_printf(o, "      %%c%lld_%d = arith.constant %lld : index\n", consts[i], id,
                     consts[i]);
  }
  if (sym_S) {
    // S rounded up to whole vectors (%skend, and to 32 below it: %skmain),
    // its vectors (%sknv), whole vectors (%sknvf, the keys below %sfull),
    // and S in every lane (%svec) for the key mask.
    kiln_sbuf_printf(o,
        "      %%skend_%d = affine.apply affine_map<()[s0] -> ((s0 + 15) floordiv 16 * 16)>()[%s]\n"
        "      %%skmain_%d = affine.apply affine_map<()[s0] -> ((s0 + 15) floordiv 32 * 32)>()[%s]\n"
        "      %%sknv_%d = affine.apply affine_map<()[s0] -> ((s0 + 15) floordiv 16)>()[%s]\n"
        "      %%sknvf_%d = affine.apply affine_map<()[s0] -> (s0 floordiv 16)>()[%s]\n"
        "      %%sfull_%d = affine.apply affine_map<()[s0] -> (s0 floordiv 16 * 16)>()[%s]\n"
        "      %%sS_%d = arith.index_cast %s : index to i32\n"
        "      %%svec_%d = vector.broadcast %%sS_%d : i32 to vector<16xi32>\n",
        id, Sssa, id, Sssa, id, Sssa, id, Sssa, id, Sssa, id, Sssa, id, id);
  }
  // Per head: the offset of its elements in each flat base (the heads'
  // factors, outer first: (bh floordiv inner) mod size, times stride).
  for (int w = 0; w < 3; ++w) {
    const operand_t *op = &rd.op[w];
    if (op->mode == OPERAND_TENSOR) continue;
    snprintf(rd.boff[w], sizeof(rd.boff[w]), "%%abo%d_%d", w, id);
    kiln_sbuf_printf(o, "      %s = affine.apply affine_map<(d0) -> (%lld", rd.boff[w],
                     (long long)op->lay.offset);
    int64_t inner = 1;
    for (int k = op->lay.nf[0] - 1; k >= 0; --k) {
      const factor_t *f = &op->lay.f[0][k];
      if (f->size.e)  // the outermost, symbolic (plan_operand): no mod
        kiln_sbuf_printf(o, " + (d0 floordiv %lld) * %lld", (long long)inner,
                         (long long)f->stride);
      else
        kiln_sbuf_printf(o, " + ((d0 floordiv %lld) mod %lld) * %lld", (long long)inner,
                         (long long)f->size.c, (long long)f->stride);
      inner *= f->size.c;
    }
    kiln_sbuf_printf(o, ")>(%%bh_%d)\n", id);
  }
  if (rd.mask[0]) {
    // Head %bh's mask offset: %bh over the view's leading dims.
    // (A symbolic stride is the map's next symbol; under a symbolic batch
    // the chain took masks per row and key only, so these dims are static.)
    snprintf(rd.moff, sizeof(rd.moff), "%%amo_%d", id);
    kiln_sbuf_printf(o, "      %s = affine.apply affine_map<(d0)[", rd.moff);
    int nsyms = 0;
    for (int d = mv->rank - 3; d >= 0; --d)
      if (mstride[d] && msym[d][0]) {
        kiln_sbuf_printf(o, "%ss%d", nsyms ? ", " : "", nsyms);
        nsyms++;
      }
    kiln_sbuf_puts(o, "] -> (0");
    int64_t inner = 1;
    nsyms = 0;
    for (int d = mv->rank - 3; d >= 0; --d) {
      if (mstride[d] && KILN_IS_SYM(mv->dims[d]) && msym[d][0])  // the outermost (see above)
        kiln_sbuf_printf(o, " + (d0 floordiv %lld) * s%d", (long long)inner, nsyms++);
      else if (mstride[d] && KILN_IS_SYM(mv->dims[d]))
        kiln_sbuf_printf(o, " + (d0 floordiv %lld) * %lld", (long long)inner,
                         (long long)mstride[d]);
      else if (mstride[d] && msym[d][0])
        kiln_sbuf_printf(o, " + ((d0 floordiv %lld) mod %lld) * s%d", (long long)inner,
                         (long long)mv->dims[d], nsyms++);
      else if (mstride[d])
        kiln_sbuf_printf(o, " + ((d0 floordiv %lld) mod %lld) * %lld", (long long)inner,
                         (long long)mv->dims[d], (long long)mstride[d]);
      inner *= mv->dims[d];
    }
    kiln_sbuf_printf(o, ")>(%%bh_%d)[", id);
    nsyms = 0;
    for (int d = mv->rank - 3; d >= 0; --d)
      if (mstride[d] && msym[d][0]) kiln_sbuf_printf(o, "%s%s", nsyms++ ? ", " : "", msym[d]);
    kiln_sbuf_puts(o, "]\n");
  }
  if (rd.op[1].mode == OPERAND_LOCAL) {
    // The head's K^T, from K's rows: 16 x 16 blocks read as 16 key rows,
    // transposed in registers.
    long long E = ch->E, s2 = rd.op[1].s2;
    snprintf(rd.ktl, sizeof(rd.ktl), "%%ktl_%d", id);
    // (A symbolic S: S rounded up to 16 columns, the rows past S read
    // masked at the base's end.)
    char kcols[24], kend[24];
    if (sym_S) {
      snprintf(rd.ktlty, sizeof(rd.ktlty), "tensor<%lldx?xf32>", E);
      snprintf(kcols, sizeof(kcols), "%%skend_%d", id);
      snprintf(kend, sizeof(kend), "%%skend_%d", id);
    } else {
      snprintf(rd.ktlty, sizeof(rd.ktlty), "tensor<%lldx%lldxf32>", E, S);
      kcols[0] = 0;
      snprintf(kend, sizeof(kend), "%%c%lld_%d", S, id);
    }
    kiln_sbuf_printf(o,
        "      %%ktl0_%d = tensor.empty(%s) : %s\n"
        "      %s = scf.for %%kj_%d = %%c0_%d to %s step %%c16_%d iter_args(%%ka_%d = "
        "%%ktl0_%d) -> (%s) {\n"
        "        %%kl_%d = scf.for %%ke_%d = %%c0_%d to %%c%lld_%d step %%c16_%d "
        "iter_args(%%kc_%d = %%ka_%d) -> (%s) {\n"
        "          %%km_%d = ub.poison : vector<16x16xf32>\n",
        id, kcols, rd.ktlty, rd.ktl, id, id, kend, id, id, id, rd.ktlty, id, id, id, E, id, id,
        id, id, rd.ktlty, id);
    char m[24];
    snprintf(m, sizeof(m), "%%km_%d", id);
    for (int r = 0; r < 16; ++r) {
      kiln_sbuf_printf(o,
          "          %%kr%d_%d_i = affine.apply affine_map<(d0, d1)[s0] -> (s0 + d0 + (d1 + %d) "
          "* %lld)>(%%ke_%d, %%kj_%d)[%s]\n"
          "          %%kr%d_%d = vector.transfer_read %s[%%kr%d_%d_i], %%padf_%d "
          "{in_bounds = [%s]} : %s, vector<16xf32>\n"
          "          %%ki%d_%d = vector.insert %%kr%d_%d, %s [%d] : vector<16xf32> into "
          "vector<16x16xf32>\n",
          r, id, r, s2, id, id, rd.boff[1], r, id, rd.flat[1], r, id, id,
          sym_S ? "false" : "true", rd.fty[1], r, id, r, id, m, r);
      snprintf(m, sizeof(m), "%%ki%d_%d", r, id);
    }
    kiln_sbuf_printf(o,
        "          %%kt_%d = vector.transpose %s, [1, 0] : vector<16x16xf32> to "
        "vector<16x16xf32>\n"
        "          %%kw_%d = vector.transfer_write %%kt_%d, %%kc_%d[%%ke_%d, %%kj_%d] "
        "{in_bounds = [true, true]} : vector<16x16xf32>, %s\n"
        "          scf.yield %%kw_%d : %s\n"
        "        }\n"
        "        scf.yield %%kl_%d : %s\n"
        "      }\n",
        id, m, id, id, id, id, id, rd.ktlty, id, rd.ktlty, id, rd.ktlty);
  }
  // The output's head offsets: %bh over the head dims, outer first.
  {
    int64_t inner = 1;
    for (int i = op->nh - 1; i >= 0; --i) {
      if (KILN_IS_SYM(op->hsize[i])) {  // the outermost (plan_output): no mod
        kiln_sbuf_printf(o, "      %%aho%d_%d = affine.apply affine_map<(d0) -> (d0 floordiv "
                            "%lld)>(%%bh_%d)\n", i, id, (long long)inner, id);
        continue;
      }
      kiln_sbuf_printf(o, "      %%aho%d_%d = affine.apply affine_map<(d0) -> ((d0 floordiv %lld) "
                          "mod %lld)>(%%bh_%d)\n",
                       i, id, (long long)inner, (long long)op->hsize[i], id);
      inner *= op->hsize[i];
    }
  }
  // The block's rows: at most RB, fewer in the last block.
  char rows_line[256], sknv[24];
  if (sym_L)
    snprintf(rows_line, sizeof(rows_line),
             "      %%rows_%d = affine.min affine_map<(d0)[s0] -> (128, s0 - d0 * 128)>"
             "(%%blk_%d)[%s]\n", id, id, Lssa);
  else
    snprintf(rows_line, sizeof(rows_line),
             "      %%rows_%d = affine.min affine_map<(d0) -> (%lld, %lld - d0 * %lld)>"
             "(%%blk_%d)\n", id, RB, L, RB, id);
  snprintf(sknv, sizeof(sknv), "%%sknv_%d", id);
  kiln_sbuf_printf(o,
      "      %%r0_%d = affine.apply affine_map<(d0) -> (d0 * %lld)>(%%blk_%d)\n"
      "%s"
      "      %%tailn_%d = arith.remui %%rows_%d, %%c8_%d : index\n"
      "      %%full_%d = arith.subi %%rows_%d, %%tailn_%d : index\n"
      "      %%ob_%d = tensor.extract_slice %%aout_%d%s : %s to tensor<?x%lldxf32>\n"
      "      %%ob3_%d = tensor.expand_shape %%ob_%d [[0], [1, 2]] output_shape [%%rows_%d, "
      "%lld, 16] : tensor<?x%lldxf32> into %s\n"
      "      %%sb0_%d = tensor.empty(%s) : %s\n"
      "      %%tl_%d:2 = scf.for %%lr_%d = %%c0_%d to %%full_%d step %%c8_%d "
      "iter_args(%%tob_%d = %%ob3_%d, %%tsb_%d = %%sb0_%d) -> (%s, %s) {\n",
      id, RB, id, rows_line, id, id, id, id, id, id, id, id, slice, rty, Ev,
      id, id, id, NVE, Ev, oty, id, sym_S ? sknv : "", sty, id, id, id, id, id, id, id, id, id,
      oty, sty);
  char lr[24], ob[24], sb[24], nob[24], nsb[24];
  snprintf(lr, sizeof(lr), "%%lr_%d", id);
  snprintf(ob, sizeof(ob), "%%tob_%d", id);
  snprintf(sb, sizeof(sb), "%%tsb_%d", id);
  emit_tile(e, ch, &rd, id, 8, lr, ob, sb, nob, nsb);
  kiln_sbuf_printf(o, "        scf.yield %s, %s : %s, %s\n      }\n", nob, nsb, oty, sty);
  char fin[24];
  snprintf(fin, sizeof(fin), "%%tl_%d#0", id);
  if (sym_L) {
    // The last block's last rows % 8 rows, one row at a time.
    kiln_sbuf_printf(o,
        "      %%tt_%d:2 = scf.for %%tr_%d = %%full_%d to %%rows_%d step %%c1_%d "
        "iter_args(%%ttob_%d = %%tl_%d#0, %%ttsb_%d = %%tl_%d#1) -> (%s, %s) {\n",
        id, id, id, id, id, id, id, id, id, oty, sty);
    snprintf(lr, sizeof(lr), "%%tr_%d", id);
    snprintf(ob, sizeof(ob), "%%ttob_%d", id);
    snprintf(sb, sizeof(sb), "%%ttsb_%d", id);
    emit_tile(e, ch, &rd, id, 1, lr, ob, sb, nob, nsb);
    kiln_sbuf_printf(o, "        scf.yield %s, %s : %s, %s\n      }\n", nob, nsb, oty, sty);
    snprintf(fin, sizeof(fin), "%%tt_%d#0", id);
  } else if (L % 8) {
    // The last block's last L % 8 rows.
    kiln_sbuf_printf(o,
        "      %%hast_%d = arith.cmpi ugt, %%tailn_%d, %%c0_%d : index\n"
        "      %%tt_%d = scf.if %%hast_%d -> (%s) {\n",
        id, id, id, id, id, oty);
    snprintf(lr, sizeof(lr), "%%full_%d", id);
    snprintf(ob, sizeof(ob), "%%tl_%d#0", id);
    snprintf(sb, sizeof(sb), "%%tl_%d#1", id);
    emit_tile(e, ch, &rd, id, (int)(L % 8), lr, ob, sb, nob, nsb);
    kiln_sbuf_printf(o, "        scf.yield %s : %s\n      } else {\n"
                        "        scf.yield %%tl_%d#0 : %s\n      }\n",
                     nob, oty, id, oty);
    snprintf(fin, sizeof(fin), "%%tt_%d", id);
  }
  kiln_sbuf_printf(o,
      "      %%of_%d = tensor.collapse_shape %s [[0], [1, 2]] : %s into tensor<?x%lldxf32>\n"
      "      scf.forall.in_parallel {\n"
      "        tensor.parallel_insert_slice %%of_%d into %%aout_%d%s : tensor<?x%lldxf32> into %s\n"
      "      }\n"
      "    }\n",
      id, fin, oty, Ev, id, id, slice, Ev, rty);
  snprintf(out->ssa, sizeof(out->ssa), "%%ar_%d", id);
  out->type = *kiln_node_result_type(e->g, &e->g->nodes[op->last], 0);
}

kiln_status_t kiln_lower_attention(kiln_emitter_t *e, const kiln_node_t *n, bool *done) {
  *done = false;
  if (n->op != KILN_OP_BMM || !e->options.fused_attention || e->options.cuda) return NULL;
  int self = (int)(n - e->g->nodes);
  attn_chain_t ch;
  if (!chain_ending_at(e, self, &ch)) {
    if (!attention_chain(e, self, &ch)) return NULL;
    for (int i = 0; i < ch.count; ++i) e->node_done[ch.nodes[i]] = true;
    *done = true;
    return NULL;
  }
  out_plan_t op;
  plan_output(e, &ch, &op);
  kiln_tv_t out;
  emit_attention(e, &ch, &op, &out);
  kiln_emit_set_result(e, &e->g->nodes[op.last], 0, &out);
  *done = true;
  if (!op.count) return NULL;
  // The values the plan took over (the second bmm's result, the views
  // before the permute and the permute's, where a clone follows) get their
  // SSA values from T too, as a transpose back and reshapes: a later
  // lowering that looks through a permute or a transpose to its source
  // (kiln_permute_source, a matmul's transposed operand) finds it; unread,
  // they are dead code.
  const kiln_graph_t *g = e->g;
  for (int i = 0; i < op.count; ++i) e->node_done[op.nodes[i]] = true;
  int pn = -1;
  for (int i = 0; i < op.count; ++i)
    if (g->nodes[op.nodes[i]].op == KILN_OP_PERMUTE || g->nodes[op.nodes[i]].op == KILN_OP_TRANSPOSE)
      pn = op.nodes[i];
  const kiln_node_t *pm = &g->nodes[pn];
  if (pm->results[0] != g->nodes[op.last].results[0])
    e->values[pm->results[0]] = out;  // a clone of T is T
  int32_t src = pm->operands[0].value;
  const kiln_type_t *st = &g->values[src].type;
  int32_t perm[KILN_MAX_RANK], inv[KILN_MAX_RANK];
  kiln_node_permutation(pm, st->rank, perm);
  // T's dim k is the source's dim perm[k]: the source's dim d is T's
  // dim inv[d].
  for (int k = 0; k < st->rank; ++k) inv[perm[k]] = k;
  kiln_tv_t back;
  char empty[24], sty[256], tty[256];
  kiln_emit_empty(e, st, empty);
  kiln_emit_fresh(e, back.ssa);
  back.type = *st;
  kiln_mlir_tensor_type(st, sty, sizeof(sty));
  kiln_mlir_tensor_type(&out.type, tty, sizeof(tty));
  kiln_sbuf_printf(&e->out, "    %s = linalg.transpose ins(%s : %s) outs(%s : %s) permutation = [",
                   back.ssa, out.ssa, tty, empty, sty);
  for (int d = 0; d < st->rank; ++d) kiln_sbuf_printf(&e->out, "%s%d", d ? ", " : "", inv[d]);
  kiln_sbuf_puts(&e->out, "]\n");
  e->values[src] = back;
  // The second bmm's result and the views between it and the permute.
  int32_t vals[9];
  int nv = 0;
  vals[nv++] = n->results[0];
  for (int i = 0; i < op.count && op.nodes[i] != pn; ++i)
    if (g->nodes[op.nodes[i]].results[0] != src) vals[nv++] = g->nodes[op.nodes[i]].results[0];
  for (int i = 0; i < nv; ++i) {
    kiln_tv_t r;
    KILN_RETURN_IF_ERROR_PLAIN(kiln_emit_reshape(e, &back, &g->values[vals[i]].type, &r));
    e->values[vals[i]] = r;
  }
  return NULL;
}
