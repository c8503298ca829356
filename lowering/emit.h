// The linalg emitter shared by the per-family lowerings in lowering/ops/.
// It writes MLIR (func, linalg, tensor, arith, math) as text, which
// lowering/pipeline.c parses through the MLIR C API. Every helper works on
// static shapes: symbolic graphs are specialized before they are lowered.
#ifndef KILN_LOWERING_EMIT_H_
#define KILN_LOWERING_EMIT_H_

#include "lib/graph/graph.h"
#include "lowering/lowering.h"

// A tensor SSA value and its kiln type.
typedef struct kiln_tv {
  char ssa[24];
  kiln_type_t type;
} kiln_tv_t;

// An elementwise argument: a tensor or a scalar literal.
typedef struct kiln_arg {
  bool is_tensor;
  kiln_tv_t tv;
  kiln_operand_kind_t scalar_kind;  // INT, FLOAT or BOOL for scalars
  double f;
  int64_t i;
  // A scalar computed at run time (a count over symbolic dims): an SSA value
  // already in the compute dtype, used as is. Empty for literals.
  char ssa[24];
} kiln_arg_t;

typedef struct kiln_emitter {
  const kiln_graph_t *g;
  kiln_sbuf_t out;    // the function body
  int next_id;
  kiln_tv_t *values;  // SSA value of each graph value, once emitted
  const kiln_node_t *node;  // the node being lowered, for error messages
  char (*sym_ssa)[24];      // index SSA value of each symbolic size
  kiln_lower_options_t options;
  const bool *input_strided;  // per graph input (NULL: all contiguous)
  // 16 while an elementwise body is written on vector<16 x T> values
  // instead of scalars (kiln_emit_lanes_op, the one-pass softmax); else 0.
  int lanes;
  // Per node: lowered together with an earlier node (the views, bias add
  // and elementwise op the f32 microkernel takes over); the node loop
  // skips it.
  bool *node_done;
  // Per graph value: a convolution's output on the wide grid of the
  // stride-1 flat form (a strided one's too, by phases)
  // [N, C, OH, Wp] (the Wp - OW extra columns not dropped), which a next
  // stride-1 convolution can take as its zero-padded input without a copy
  // (lowering/ops/matmul.c, emit_prepadded); ssa empty where there is none.
  kiln_tv_t *wide;
} kiln_emitter_t;

// The type scalar arithmetic on `t` is written in: kiln_mlir_elem(t), or
// with e->lanes set "vector<16xt>" (f32, i32 and i1 only).
const char *kiln_lane_type(const kiln_emitter_t *e, kiln_dtype_t t);
// The type list an arith.select on `t` (f32 or i32) values prints: "f32",
// or with e->lanes set "vector<16xi1>, vector<16xf32>".
const char *kiln_select_type(const kiln_emitter_t *e, kiln_dtype_t t);
// Whether kiln_emit_lanes_op writes `op` (unary f32 ops whose bodies are
// plain arithmetic: relu, gelu, sigmoid, tanh, exp, erf, neg, abs).
bool kiln_lanes_op_supported(kiln_op_id_t op);
// Elementwise `op` (attributes from `attrs`, which may be NULL) on a
// vector<16xf32> value `x`, written into `b`; `out` gets the result.
void kiln_emit_lanes_op(kiln_emitter_t *e, kiln_sbuf_t *b, kiln_op_id_t op,
                        const kiln_node_t *attrs, const char *x, char out[24]);

// The node that reads graph value `v`, where it has exactly one reader (a
// node reading it twice counts twice) and is no graph output or stored
// mutation; else -1. Only nodes after `from` (v's producer) are searched.
// Lowerings that take a node's only reader over (the f32 microkernel's
// epilogue chain, a scale folded into a softmax) ask this.
int kiln_emit_sole_reader(const kiln_graph_t *g, int32_t v, int from);

// Fresh SSA name "%t<N>".
void kiln_emit_fresh(kiln_emitter_t *e, char ssa[24]);
// "f32", "i1", ... — the MLIR element type of a dtype.
const char *kiln_mlir_elem(kiln_dtype_t t);
// The element type in memory: bools are stored as i8 (vectors of i1 would be
// bit-packed, and PyTorch's bool is a byte).
const char *kiln_mlir_storage_elem(kiln_dtype_t t);
// "tensor<4x?xf32>" (storage element types; symbolic sizes print as ?)
void kiln_mlir_tensor_type(const kiln_type_t *t, char *buf, size_t n);
// The type arithmetic is done in: f16 and bf16 compute in f32.
kiln_dtype_t kiln_math_dtype(kiln_dtype_t t);

kiln_arg_t kiln_arg_tensor(const kiln_tv_t *tv);
kiln_arg_t kiln_arg_float(double f);
// The argument for operand `i` of the node being lowered.
kiln_arg_t kiln_arg_operand(kiln_emitter_t *e, int i);

// Elementwise linalg.generic applying `op` (attributes read from `attrs`,
// which may be NULL for defaults) to `args`, broadcasting tensors to
// `out_dims` (NULL: the broadcast of the tensor args). Operands are converted
// to `ct`, the op runs in kiln_math_dtype(ct), the result is converted to
// `out_dtype`. `op` is an elementwise op id.
kiln_status_t kiln_emit_ew(kiln_emitter_t *e, kiln_op_id_t op,
                           const kiln_node_t *attrs, int n,
                           const kiln_arg_t *args, const kiln_type_t *out_dims,
                           kiln_dtype_t ct, kiln_dtype_t out_dtype,
                           kiln_tv_t *out);
// Shorthands for the composite lowerings (unary/binary in one dtype).
kiln_status_t kiln_emit_unary(kiln_emitter_t *e, kiln_op_id_t op,
                              const kiln_tv_t *x, kiln_dtype_t dt,
                              kiln_tv_t *out);
kiln_status_t kiln_emit_binary(kiln_emitter_t *e, kiln_op_id_t op,
                               kiln_arg_t a, kiln_arg_t b, kiln_dtype_t dt,
                               kiln_tv_t *out);
kiln_status_t kiln_emit_convert(kiln_emitter_t *e, const kiln_tv_t *x,
                                kiln_dtype_t to, kiln_tv_t *out);

// Reduction of `x` over the dims marked in `reduced`, accumulating in `acc`
// (x is converted to it). `op` is SUM, PROD, AMAX or AMIN. With keepdim the
// reduced dims stay as size 1.
kiln_status_t kiln_emit_reduce(kiln_emitter_t *e, kiln_op_id_t op,
                               const kiln_tv_t *x, const bool *reduced,
                               bool keepdim, kiln_dtype_t acc, kiln_tv_t *out);

// The float max of `x` over `reduced` for a consumer that is NaN wherever
// an operand was (softmax: x - max feeds exp and the row sum), so the max
// itself need not propagate NaN: combined with arith.maxnumf (accumulator
// first), which the CPU schedule relaxes to one max instruction per vector
// (relax_maxnumf, kernels/cpu_vectorize.c); arith.maximumf's NaN rule costs
// six on x86.
kiln_status_t kiln_emit_reduce_max_nan_free(kiln_emitter_t *e, const kiln_tv_t *x,
                                            const bool *reduced, bool keepdim,
                                            kiln_dtype_t acc, kiln_tv_t *out);

// Same elements, new static shape (collapse to 1-D and expand).
kiln_status_t kiln_emit_reshape(kiln_emitter_t *e, const kiln_tv_t *x,
                                const kiln_type_t *to, kiln_tv_t *out);

// The same elements as a static shape `to`, through tensor.reshape: a view
// that MLIR's reshape propagation, and so elementwise fusion, does not move
// (both shapes static).
void kiln_emit_view(kiln_emitter_t *e, const kiln_tv_t *x,
                    const kiln_type_t *to, kiln_tv_t *out);

// `dst` with the static `src` written at static `offsets` (one per dim):
// an scf.forall over slabs of src (leading dims, then chunks of one dim;
// at most 16K elements each), each inserted by tensor.parallel_insert_slice
// and so bufferized to one copy per slab, spread over the threads. A
// top-level tensor.insert_slice of a large tensor is what the CPU
// vectorizer turns into one vector of the whole tensor, fully unrolled (a
// cat into f32[8,64,3540] compiled for minutes); a src of one slab keeps it
// unless `loop_one_slab`, which loops over its first dim that is not 1
// (a zero padding's insert: the vectorized f16 insert into the fill
// crashed LLVM's soft promotion).
void kiln_emit_insert_slabs(kiln_emitter_t *e, const kiln_tv_t *src,
                            const kiln_tv_t *dst, const int64_t *offsets,
                            bool loop_one_slab, kiln_tv_t *out);

// Planes padded with `value` (CPU, static): pieces [N, C_i, H, W] of one
// dtype, stacked along dim 1 in order, become `pt` = [N, sum C_i, Hp, Wp]
// with the pieces at rows lo_h.. and columns lo_w... The pieces are
// inserted by slabs, then only the border is filled, in place
// (kiln_emit_pad_border). A fill of the whole buffer before the copy into
// it wrote the interior twice; the border filled after the copy finds its
// lines in cache. Pieces let a cat feeding a convolution write into the
// padded buffer, with no cat buffer of its own.
kiln_status_t kiln_emit_pad_planes(kiln_emitter_t *e, const kiln_tv_t *pieces, int count,
                                   const kiln_type_t *pt, int64_t lo_h, int64_t lo_w,
                                   double value, kiln_tv_t *out);

// The border of dst's planes [N, C, Hp, Wp] around an H x W interior at
// (lo_h, lo_w) set to `value`, in place (CPU, static): one loop over blocks
// of planes (rows above and below, columns left and right of the interior's
// rows), or for rows of thousands of floats one loop of slabs per region.
// kiln_emit_pad_planes, and emit_prepadded (lowering/ops/matmul.c) for
// interiors computed in place, write the interior before it.
kiln_status_t kiln_emit_pad_border(kiln_emitter_t *e, const kiln_tv_t *dst, int64_t lo_h,
                                   int64_t lo_w, int64_t H, int64_t W, double value,
                                   kiln_tv_t *out);

// tensor.empty of type `t`, with the SSA sizes of its symbolic dims.
void kiln_emit_empty(kiln_emitter_t *e, const kiln_type_t *t, char ssa[24]);
// The index SSA value (or "N" literal is not allowed in operand lists, so a
// constant is emitted) of dim `d` of type `t`, for offsets/sizes lists:
// writes either the integer or the symbol's SSA name into `out`.
void kiln_emit_size_operand(kiln_emitter_t *e, const kiln_type_t *t, int d,
                            char out[24]);
// Appends every dim of `t` as size operands, "4, %s0, 16", to the output.
void kiln_emit_size_list(kiln_emitter_t *e, const kiln_type_t *t);
// The number of elements of the dims marked in `dims` as a scalar argument of
// dtype `dt` (a literal when static, an SSA value when symbolic).
kiln_arg_t kiln_emit_count(kiln_emitter_t *e, const kiln_type_t *t,
                           const bool *dims, kiln_dtype_t dt, double minus);

// tensor.empty + linalg.fill with a scalar.
kiln_status_t kiln_emit_filled(kiln_emitter_t *e, const kiln_type_t *t,
                               double value, kiln_tv_t *out);

// A scalar constant in `t` ("%c" name written to ssa); emitted into `b`.
void kiln_emit_scalar_const(kiln_emitter_t *e, kiln_sbuf_t *b, kiln_dtype_t t,
                            double v, char ssa[24]);

// An error about the node being lowered.
kiln_status_t kiln_emit_error(kiln_emitter_t *e, kiln_status_code_t code,
                              const char *fmt, ...) KILN_PRINTF(3, 4);

// Element functions only composite lowerings ask for, numbered past the
// graph's ops: the graph never holds them, the emitter's bodies know them.
//  - EXP_DIFF(x, y) = e^(x - y) where x <= y or either is NaN (softmax's
//    exponentials against the row max): exp without its overflow clamp.
#define KILN_EMIT_OP_EXP_DIFF ((kiln_op_id_t)KILN_OP_COUNT)

// `math.<fn>` of scalar `x` in math dtype `mt`; exp, tanh and erf in f32 are
// emitted as vectorizable arithmetic (lowering/math_approx.c), as is
// "exp_nonpositive", exp of an argument known to be <= 0 or NaN.
void kiln_emit_math(kiln_emitter_t *e, kiln_sbuf_t *b, const char *fn,
                    const char *x, kiln_dtype_t mt, char out[24]);

// max(a, b) of two vector<16xf32> values (one vmaxps; a NaN may be dropped,
// as softmax's rows allow) and the max of a vector<16xf32>'s lanes as an
// f32 scalar (shuffles folding halves), written into e->out
// (lowering/ops/nn.c).
void kiln_emit_vec_max(kiln_emitter_t *e, const char *a, const char *b, char out[24]);
void kiln_emit_vec_hmax(kiln_emitter_t *e, const char *v, char out[24]);

// The fused attention kernel (lowering/ops/attention.c). For a bmm node,
// `*done` is set where it starts a q @ k^T (* scale) -> softmax -> @ v
// chain that the kernel computes whole (the chain's nodes up to the
// second bmm are then marked done and emitted with it) or is such a
// chain's second bmm (the kernel emitted as its result); else the bmm is
// lowered as one.
kiln_status_t kiln_lower_attention(kiln_emitter_t *e, const kiln_node_t *n, bool *done);

// Lowering functions, one per family, in lowering/ops/*.c. Each reads the
// node's operands from e->values and writes its results there.
// What a permute/transpose node `n` does to the tensor it reads, composed
// through one more permute (autograd transposes weights back and forth):
// the permutation and the emitted source tensor.
void kiln_permute_source(kiln_emitter_t *e, const kiln_node_t *n, int rank,
                         int32_t *perm, const kiln_tv_t **src);

typedef kiln_status_t (*kiln_lower_fn)(kiln_emitter_t *e, const kiln_node_t *n);
kiln_status_t kiln_lower_elementwise(kiln_emitter_t *e, const kiln_node_t *n);
kiln_status_t kiln_lower_reduce(kiln_emitter_t *e, const kiln_node_t *n);
kiln_status_t kiln_lower_matmul(kiln_emitter_t *e, const kiln_node_t *n);
kiln_status_t kiln_lower_conv(kiln_emitter_t *e, const kiln_node_t *n);
kiln_status_t kiln_lower_shape(kiln_emitter_t *e, const kiln_node_t *n);
kiln_status_t kiln_lower_create(kiln_emitter_t *e, const kiln_node_t *n);
kiln_status_t kiln_lower_softmax(kiln_emitter_t *e, const kiln_node_t *n);
kiln_status_t kiln_lower_layer_norm(kiln_emitter_t *e, const kiln_node_t *n);
kiln_status_t kiln_lower_layer_norm_backward(kiln_emitter_t *e, const kiln_node_t *n);
kiln_status_t kiln_lower_embedding(kiln_emitter_t *e, const kiln_node_t *n);
kiln_status_t kiln_lower_index_put(kiln_emitter_t *e, const kiln_node_t *n);
kiln_status_t kiln_lower_index(kiln_emitter_t *e, const kiln_node_t *n);
kiln_status_t kiln_lower_max_pool2d(kiln_emitter_t *e, const kiln_node_t *n);

// Sets result `i` of the node to `tv`.
void kiln_emit_set_result(kiln_emitter_t *e, const kiln_node_t *n, int i,
                          const kiln_tv_t *tv);

#endif  // KILN_LOWERING_EMIT_H_
