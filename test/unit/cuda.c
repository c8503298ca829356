// The CUDA target end to end, on the GPU machine: graphs compiled for
// target "cuda" run on device tensors and match the reference interpreter
// on fresh random inputs; calls on a stream made through the mgpu* entry
// points; host tensors are refused with a clear error. Without a GPU the
// test reports why and exits 77 (ctest: skipped).
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>

#include "jit/cuda.h"
#include "test/unit/test_util.h"
#include "tools/tensor_util.h"

static const char *kGraphs[] = {
    // One fused elementwise kernel.
    "graph @ew(%x: f32[1000], %y: f32[1000]) {\n"
    "  %s = aten.add(%x, %y)\n  %r = aten.relu(%s)\n  %t = aten.tanh(%r)\n"
    "  return %t\n}\n",
    // 2-D broadcast, and a bf16 output.
    "graph @bias(%x: f32[64,300], %b: f32[300]) {\n"
    "  %s = aten.mul(%x, %b)\n  %e = aten.exp(%s)\n"
    "  %c = prims.convert_element_type(%e) {dtype = bf16}\n  return %c\n}\n",
    // Row reductions and softmax: two outputs.
    "graph @rows(%x: f32[32,513]) {\n"
    "  %m = aten.sum(%x) {dims = [1], keepdim = true}\n"
    "  %p = aten._softmax(%x) {dim = -1}\n  return %m, %p\n}\n",
    // Matmul with a bias epilogue (temporaries on the device).
    "graph @mm(%a: f32[48,96], %b: f32[96,80], %c: f32[80]) {\n"
    "  %d = aten.addmm(%c, %a, %b)\n  %g = aten.gelu(%d)\n  return %g\n}\n",
    // Power-of-two shapes: kernels/gpu_schedule.c's block/thread tiles
    // (32x32 blocks for the matmul and its fill, 256 in a row for the 1-D
    // bias add), a batched elementwise op on a 3-D grid.
    "graph @mm2(%a: f32[128,64], %b: f32[64,256], %c: f32[256]) {\n"
    "  %m = aten.mm(%a, %b)\n  %d = aten.add(%m, %c)\n  %r = aten.relu(%d)\n"
    "  return %r\n}\n",
    "graph @ew3(%x: f32[4,64,512], %y: f32[512]) {\n"
    "  %s = aten.mul(%x, %y)\n  %t = aten.tanh(%s)\n  return %t\n}\n",
    // Layer norm: mean, rstd and the normalized rows.
    "graph @ln(%x: f32[16,256], %w: f32[256], %b: f32[256]) {\n"
    "  %n, %mean, %rstd = aten.native_layer_norm(%x, %w, %b) "
    "{normalized_shape = [256], eps = 1e-5}\n  return %n, %mean, %rstd\n}\n",
    // bf16 on tensor cores (kernels/gpu_mma.c, whole 128x128x32 tiles), and
    // with a bias + GELU epilogue. On sm_90 these are wgmma kernels of
    // 128 x 128 blocks (N not a multiple of 256); gpu-check also runs them
    // with KILN_GPU_WGMMA=0 (mma.sync).
    "graph @mma(%a: bf16[256,512], %b: bf16[512,384]) {\n"
    "  %c = aten.mm(%a, %b)\n  return %c\n}\n",
    "graph @mma2(%a: bf16[128,256], %b: bf16[256,256], %c: bf16[256]) {\n"
    "  %d = aten.addmm(%c, %a, %b)\n  %g = aten.gelu(%d)\n  return %g\n}\n",
    // 8 x 5 blocks in groups of 8 block rows, 8 K steps through the
    // 3-stage pipeline.
    "graph @mma3(%a: bf16[1024,256], %b: bf16[256,640]) {\n"
    "  %c = aten.mm(%a, %b)\n  return %c\n}\n",
    // A contiguous dim of 1000 (= 8 x 125): blocks of 8 columns x 32 rows
    // (kernels/gpu_schedule.c), the bias broadcast along the rows.
    "graph @narrow(%x: f32[96,1000], %b: f32[1000]) {\n"
    "  %s = aten.add(%x, %b)\n  %r = aten.relu(%s)\n  return %r\n}\n",
    // 1001 = 7 x 11 x 13: blocks of 13 x 16; a 7 x 7 map: blocks of 7 x 7
    // threads with a channel bias broadcast.
    "graph @odd(%x: f32[64,1001], %y: f32[64,1001]) {\n"
    "  %s = aten.add(%x, %y)\n  return %s\n}\n",
    "graph @img7(%x: f32[4,64,7,7], %b: f32[64,1,1]) {\n"
    "  %s = aten.add(%x, %b)\n  %r = aten.relu(%s)\n  return %r\n}\n",
    // Ragged f32 GEMMs (kernels/gpu_sgemm.c over sizes rounded up to its
    // blocks, edge copies zero-filled, edge stores skipped): M = 200 and
    // N = 1000 (a classifier head's), then A given transposed with M = 1000.
    "graph @rag(%a: f32[200,256], %b: f32[256,1000]) {\n"
    "  %c = aten.mm(%a, %b)\n  return %c\n}\n",
    "graph @ragt(%a: f32[256,1000], %b: f32[256,512]) {\n"
    "  %t = aten.permute(%a) {dims = [1, 0]}\n  %c = aten.mm(%t, %b)\n  return %c\n}\n",
    // sm_90's wgmma with 128 x 256 blocks: 4 x 2 blocks in groups of 4
    // block rows, 16 K steps through the 4-stage pipeline; then one K step
    // (the pipeline's look-ahead clamped to it) with a residual add read
    // from the f32 accumulators (folded into the kernel's stores).
    "graph @wg(%a: bf16[512,1024], %b: bf16[1024,512]) {\n"
    "  %c = aten.mm(%a, %b)\n  return %c\n}\n",
    // Linear layers, x @ W^T: on sm_90 the wgmma kernel reads W [N, K] in
    // place (K-major B), 128- and 256-column blocks, the second with a
    // bias + GELU epilogue; with KILN_GPU_WGMMA=0 a transpose, then
    // mma.sync.
    "graph @wgbt(%x: bf16[256,512], %w: bf16[384,512]) {\n"
    "  %t = aten.permute(%w) {dims = [1, 0]}\n  %y = aten.mm(%x, %t)\n  return %y\n}\n",
    "graph @wgbt2(%x: bf16[384,1024], %w: bf16[512,1024], %c: bf16[512]) {\n"
    "  %t = aten.permute(%w) {dims = [1, 0]}\n  %d = aten.addmm(%c, %x, %t)\n"
    "  %g = aten.gelu(%d)\n  return %g\n}\n",
    "graph @wg2(%a: bf16[384,64], %b: bf16[64,768], %r: bf16[384,768]) {\n"
    "  %c = aten.mm(%a, %b)\n  %d = aten.add(%c, %r)\n  return %d\n}\n",
    // Several GEMMs in one graph: independent ones with their roundings
    // folded (one merged mma.sync kernel with KILN_GPU_WGMMA=0), a chain (the first's rounded result allocated before its
    // kernel), and a GEMM after softmaxes that horizontal fusion must not
    // move before the one writing its operand (its TMA maps stand for it).
    "graph @three(%a: bf16[256,256], %b: bf16[256,256], %c: bf16[256,256]) {\n"
    "  %x = aten.mm(%a, %b)\n  %y = aten.mm(%b, %c)\n  %z = aten.mm(%a, %c)\n"
    "  return %x, %y, %z\n}\n",
    "graph @chain(%a: bf16[256,256], %b: bf16[256,256]) {\n"
    "  %c = aten.mm(%a, %b)\n  %d = aten.mm(%c, %b)\n  return %d\n}\n",
    "graph @order(%x: bf16[128,128], %w: bf16[128,128]) {\n"
    "  %s1 = aten._softmax(%x) {dim = 1}\n  %s2 = aten._softmax(%s1) {dim = 0}\n"
    "  %s3 = aten._softmax(%s2) {dim = 1}\n  %s4 = aten._softmax(%s3) {dim = 0}\n"
    "  %y = aten.mm(%s4, %w)\n  return %y\n}\n",
    // f16 operands on the same kernels (f16 TMA maps and wgmma .f16; with
    // KILN_GPU_WGMMA=0 mma.sync left f16): a GEMM rounded to f16, a linear
    // layer with bias + GELU reading W in place, and a bf16 and an f16 GEMM
    // in one graph (only the bf16 kernel's mma.sync relabeled).
    "graph @h16(%a: f16[256,512], %b: f16[512,512]) {\n"
    "  %c = aten.mm(%a, %b)\n  return %c\n}\n",
    "graph @h16lin(%x: f16[256,512], %w: f16[384,512], %c: f16[384]) {\n"
    "  %t = aten.permute(%w) {dims = [1, 0]}\n  %d = aten.addmm(%c, %x, %t)\n"
    "  %g = aten.gelu(%d)\n  return %g\n}\n",
    "graph @halves(%a: bf16[256,512], %b: bf16[512,384], %x: f16[128,256], "
    "%y: f16[256,256]) {\n"
    "  %c = aten.mm(%a, %b)\n  %z = aten.mm(%x, %y)\n  return %c, %z\n}\n",
    // Two f16 GEMMs: with KILN_GPU_WGMMA=0 horizontal fusion merges their
    // mma.sync kernels into one (as @three's bf16 ones), which the program
    // takes.
    "graph @two16(%a: f16[256,256], %b: f16[256,256], %c: f16[256,256]) {\n"
    "  %x = aten.mm(%a, %b)\n  %y = aten.mm(%b, %c)\n  return %x, %y\n}\n",
    // An epilogue folded into the wgmma kernel's stores: bias, ReLU, an
    // f32 residual and the rounding of the sum to bf16 (a bf16 result, so
    // bf16's tolerance: the addmm is rounded to bf16 before the ReLU, and
    // a different summation order may round it one ulp apart).
    "graph @wg3(%a: bf16[256,128], %b: bf16[128,512], %c: bf16[512], "
    "%r: f32[256,512]) {\n"
    "  %d = aten.addmm(%c, %a, %b)\n  %e = aten.relu(%d)\n  %f = aten.add(%e, %r)\n"
    "  %g = prims.convert_element_type(%f) {dtype = bf16}\n  return %g\n}\n",
    // kernels/gpu_rows.c: a row per warp, shuffle butterflies; softmax in
    // kiln's row forall, log_softmax and a layer norm after a residual add
    // at function level.
    "graph @sm(%x: f32[4096,1024]) {\n"
    "  %y = aten._softmax(%x) {dim = 1}\n  return %y\n}\n",
    "graph @lsm(%x: f32[256,1024]) {\n"
    "  %y = aten._log_softmax(%x) {dim = 1}\n  return %y\n}\n",
    "graph @ln2(%x: f32[512,768], %r: f32[512,768], %w: f32[768], %b: f32[768]) {\n"
    "  %s = aten.add(%x, %r)\n"
    "  %n, %mean, %rstd = aten.native_layer_norm(%s, %w, %b) "
    "{normalized_shape = [768], eps = 1e-5}\n  return %n, %mean, %rstd\n}\n",
    // Rows longer than a warp's registers: a row per block of 512 lanes
    // (4096) or 1024 (8192), gpu.all_reduce across the block.
    "graph @sml(%x: f32[999,4096]) {\n"
    "  %y = aten._softmax(%x) {dim = -1}\n  return %y\n}\n",
    "graph @lnl(%x: f32[255,4096], %w: f32[4096], %b: f32[4096]) {\n"
    "  %n, %mean, %rstd = aten.native_layer_norm(%x, %w, %b) "
    "{normalized_shape = [4096], eps = 1e-5}\n  return %n, %mean, %rstd\n}\n",
    "graph @lsml(%x: f32[33,8192]) {\n"
    "  %y = aten._log_softmax(%x) {dim = -1}\n  return %y\n}\n",
    // Long rows that do not split into whole warps (2176 floats: 544
    // vectors): streamed by a warp in chunks, online max and sum, layer
    // norm's mean and M2 in one pass (odd row counts: blocks of one warp).
    "graph @sms(%x: f32[37,2176]) {\n"
    "  %y = aten._softmax(%x) {dim = -1}\n  return %y\n}\n",
    "graph @lns(%x: f32[19,2176], %w: f32[2176], %b: f32[2176]) {\n"
    "  %n, %mean, %rstd = aten.native_layer_norm(%x, %w, %b) "
    "{normalized_shape = [2176], eps = 1e-5}\n  return %n, %mean, %rstd\n}\n",
    // Views inside a temporary (q, k, v split off one projection): a copy
    // from a contiguous run at an offset, a kernel reading a static view.
    "graph @views(%x: f32[3,64,8,64]) {\n"
    "  %c = aten.mul(%x, 2.0)\n"
    "  %s = aten.slice(%c) {dim = 0, start = 1, end = 2, step = 1}\n"
    "  %q = aten.squeeze(%s) {dims = [0]}\n"
    "  %v = aten.view(%q) {shape = [64, 32, 16]}\n"
    "  %p = aten.permute(%v) {dims = [1, 0, 2]}\n"
    "  %o = aten.view(%p) {shape = [8, 4, 64, 16]}\n"
    "  %b = aten.slice(%c) {dim = 0, start = 2, end = 3, step = 1}\n"
    "  %t = aten.tanh(%b)\n"
    "  return %o, %t\n}\n",
    // Reductions into few outputs, split across threads (bias, layer-norm
    // weight and linear weight gradients).
    "graph @grads(%g: f32[16,256,64], %x: f32[16,256,64]) {\n"
    "  %p = aten.mul(%g, %x)\n"
    "  %s = aten.sum(%p) {dims = [0, 1]}\n"
    "  %v = aten.view(%g) {shape = [4096, 64]}\n"
    "  %d = aten.sum(%v) {dims = [0]}\n"
    "  %xv = aten.view(%x) {shape = [4096, 64]}\n"
    "  %vt = aten.permute(%v) {dims = [1, 0]}\n"
    "  %w = aten.mm(%vt, %xv)\n"
    "  %m = aten.amax(%v) {dims = [0]}\n"
    "  return %s, %d, %w, %m\n}\n",
    // A reduction with a broadcast input stays unsplit (split_reduction
    // would index the broadcast like the full input).
    "graph @gradsb(%x: f32[8,4096,64], %m: f32[1,4096,64]) {\n"
    "  %p = aten.mul(%x, %m)\n"
    "  %s = aten.sum(%p) {dims = [1]}\n"
    "  return %s\n}\n",
    // An embedding gradient as AOTAutograd traces it: indices clamped,
    // values masked by a broadcast [B, T, 1] mask, index_put into zeros.
    // The one-hot matrix of the indices times the values, by
    // kernels/gpu_sgemm.c (split K), then base added.
    "graph @embgrad(%idx: i64[16,256], %g: f32[16,256,64]) {\n"
    "  %a = aten.ge(%idx, 0)\n  %b = aten.lt(%idx, 256)\n"
    "  %m = aten.logical_and(%a, %b)\n  %mu = aten.unsqueeze(%m) {dim = -1}\n"
    "  %base = aten.full() {shape = [256, 64], value = 0, dtype = f32}\n"
    "  %c1 = aten.maximum(%idx, -256)\n  %c = aten.minimum(%c1, 255)\n"
    "  %nm = aten.logical_not(%mu)\n"
    "  %z = aten.full() {shape = [], value = 0.0, dtype = f32}\n"
    "  %v = aten.where(%nm, %z, %g)\n"
    "  %o = aten.index_put(%base, %c, %v) {accumulate = true}\n  return %o\n}\n",
    // i32 indices on the one-hot path (widened to i64 first).
    "graph @embgrad32(%b: f32[256,64], %i: i32[16,256], %v: f32[16,256,64]) {\n"
    "  %o = aten.index_put(%b, %i, %v) {accumulate = true}\n  return %o\n}\n",
    // index_put in shapes the GEMM kernel does not take (D = 48): the
    // reduction form, a thread per output; indices in [-5, 5] over 10 rows.
    "graph @iput48(%b: f32[10,48], %i: i64[17], %v: f32[17,48]) {\n"
    "  %o = aten.index_put(%b, %i, %v) {accumulate = true}\n  return %o\n}\n",
    // A graph constant read by a kernel and returned: uploaded once.
    "graph @consts(%w: f32[16,32], %x: f32[4,16,32]) {\n"
    "  %i = kiln.constant() {value = [15, 3, 0, 7, 9, 1, 14, 2, 8, 4, 11, 5, "
    "13, 6, 12, 10]} : i64[16]\n"
    "  %e = aten.embedding(%w, %i)\n"
    "  %s = aten.add(%x, %e)\n"
    "  return %i, %s\n}\n",
    // An optimizer-like step writing three of its inputs in place.
    "graph @adam(%p: f32[512,256], %g: f32[512,256], %m: f32[512,256], %v: f32[512,256]) {\n"
    "  %m1 = aten.mul(%m, 0.9)\n  %m2 = aten.add(%m1, %g) {alpha = 0.1}\n"
    "  %g2 = aten.mul(%g, %g)\n  %v1 = aten.abs(%v)\n  %v2 = aten.add(%v1, %g2) {alpha = 0.001}\n"
    "  %s = aten.sqrt(%v2)\n  %d = aten.add(%s, 1e-8)\n  %u = aten.div(%m2, %d)\n"
    "  %p2 = aten.sub(%p, %u) {alpha = 0.01}\n  %n = aten.sum(%p2) {dims = [1]}\n"
    "  return %n, %p2 -> %p, %m2 -> %m, %v2 -> %v\n}\n",
    // A transposed lhs (a weight gradient's dY^T @ X): the SGEMM kernel
    // reads A^T's tiles directly, K split 4 ways (6 blocks of 128 x 128).
    "graph @mmt(%a: f32[512,256], %b: f32[512,384]) {\n"
    "  %at = aten.permute(%a) {dims = [1, 0]}\n  %c = aten.mm(%at, %b)\n  return %c\n}\n",
    // Rank-3 softmax and layer norm (no bias) over the rows of their [R, C]
    // views: one row kernel each.
    "graph @rows3(%x: f32[4,128,256], %y: f32[16,256,64], %w: f32[64]) {\n"
    "  %s = aten._softmax(%x) {dim = -1, half_to_float = false}\n"
    "  %n, %m, %r = aten.native_layer_norm(%y, %w, none) "
    "{normalized_shape = [64], eps = 1e-5}\n  return %s, %n, %m, %r\n}\n",
    // The SGEMM kernel's 64 x 64 blocks (a transformer's narrow weights):
    // dY^T @ X split 32 ways, [2048, 256] x [256, 64] split 2 ways (both
    // partial sums in one fused launch), [2048, 64] x [64, 192] unsplit.
    "graph @sg64(%dy: f32[4096,256], %x: f32[4096,64], %w: f32[64,192], "
    "%h: f32[2048,256], %w2: f32[256,64], %x2: f32[2048,64]) {\n"
    "  %dyt = aten.permute(%dy) {dims = [1, 0]}\n  %dw = aten.mm(%dyt, %x)\n"
    "  %q = aten.mm(%x2, %w)\n  %o = aten.mm(%h, %w2)\n  return %dw, %q, %o\n}\n",
    // Horizontal fusion (lowering/hfuse.c) and rank-0 ops as one-thread
    // kernels: two step counts and a bias correction (rank 0), updates of
    // three sizes (a 2-D grid, 1-D blocks of two sizes); %h2 reads %b's
    // update (a later level), %h is written after the kernels that read its
    // old value.
    "graph @hfuse(%w: f32[64,512], %g: f32[64,512], %b: f32[512], %h: f32[512], "
    "%c: f32[300], %k: f32[300], %s: f32[], %t: f32[]) {\n"
    "  %s2 = aten.add(%s, 1)\n  %t2 = aten.add(%t, 1)\n"
    "  %e = aten.pow(0.9, %s2)\n  %bc = aten.sub(1, %e)\n"
    "  %u = aten.div(%g, %bc)\n  %w2 = aten.sub(%w, %u) {alpha = 0.01}\n"
    "  %b2 = aten.sub(%b, %h) {alpha = 0.01}\n  %h2 = aten.mul(%b2, %h)\n"
    "  %hn = aten.mul(%h, 0.5)\n"
    "  %c2 = aten.add(%c, %k)\n  %k2 = aten.mul(%k, %t2)\n"
    "  return %h2, %w2 -> %w, %b2 -> %b, %hn -> %h, %c2 -> %c, %k2 -> %k, "
    "%s2 -> %s, %t2 -> %t\n}\n",
};
#define KILN_GRAPH_COUNT (sizeof(kGraphs) / sizeof(kGraphs[0]))

static const char *graph_named(const char *name) {
  for (size_t i = 0; i < KILN_GRAPH_COUNT; ++i)
    if (strstr(kGraphs[i], name)) return kGraphs[i];
  return kGraphs[0];
}

typedef struct {
  void *(*stream_create)(void);
  void (*stream_sync)(void *);
  void (*stream_destroy)(void *);
  void *(*mem_alloc)(uint64_t, void *, bool);
  void (*mem_free)(void *, void *);
  void (*memcpy_)(void *, void *, size_t, void *);
} mgpu_t;

static void *lookup(const char *name) {
  int n = 0;
  const kiln_cuda_symbol_t *syms = kiln_cuda_mgpu_symbols(&n);
  for (int i = 0; i < n; ++i)
    if (strcmp(syms[i].name, name) == 0) return syms[i].address;
  fprintf(stderr, "mgpu symbol %s missing\n", name);
  kt_failures++;
  return NULL;
}

static size_t bytes_of(const kiln_tensor_type_t *t) {
  size_t n = (size_t)(t->dtype.bits / 8);
  for (int i = 0; i < t->rank; ++i) n *= (size_t)t->shape[i];
  return n;
}

// Inputs and outputs per graph at most.
#define KT_MAX_IO 8

// Compiles `text` for the device (with `opts`, or the defaults), runs it
// on fresh random inputs and checks it against the reference interpreter.
static void run_graph_with(kiln_context_t *ctx, const char *text,
                           const kiln_compile_options_t *opts, mgpu_t *m, void *stream,
                           uint64_t *seed) {
  kiln_graph_t *g = NULL;
  kiln_function_t *fn = NULL;
  CHECK_OK(kiln_graph_parse(ctx, text, strlen(text), "cuda", &g));
  if (!g) return;
  kiln_compile_options_t o;
  kiln_compile_options_init(&o);
  if (opts) o = *opts;
  o.target = "cuda";
  kiln_status_t s = kiln_function_compile(ctx, g, &o, &fn);
  if (s) {
    fprintf(stderr, "compile: %s\n", kiln_status_message(s));
    kiln_status_free(s);
    kt_failures++;
    kiln_graph_destroy(g);
    return;
  }
  size_t nin = kiln_graph_input_count(g), nout = kiln_graph_output_count(g);
  if (nin > KT_MAX_IO || nout > KT_MAX_IO) {
    fprintf(stderr, "graph %.40s: more than %d inputs or outputs\n", text, KT_MAX_IO);
    kt_failures++;
    kiln_function_release(fn);
    kiln_graph_destroy(g);
    return;
  }
  kt_tensor_t in[KT_MAX_IO], got[KT_MAX_IO], want[KT_MAX_IO];
  DLTensor in_dl[KT_MAX_IO], got_dl[KT_MAX_IO], want_dl[KT_MAX_IO], din[KT_MAX_IO], dout[KT_MAX_IO];
  kiln_tensor_type_t it[KT_MAX_IO], ot[KT_MAX_IO];
  for (size_t i = 0; i < nin; ++i) {
    kiln_graph_input_type(g, i, &it[i]);
    kt_alloc(&in[i], &it[i], false);
    kt_fill_random(&in[i], seed);
    in_dl[i] = in[i].dl;
    din[i] = in[i].dl;
    din[i].device.device_type = kDLCUDA;
    din[i].data = m->mem_alloc(bytes_of(&it[i]), stream, false);
    m->memcpy_(din[i].data, in[i].dl.data, bytes_of(&it[i]), stream);
  }
  for (size_t i = 0; i < nout; ++i) kiln_graph_output_type(g, i, &ot[i]);
  CHECK(kt_alloc_outputs(ot, nout, got, want, got_dl, want_dl));
  for (size_t i = 0; i < nout; ++i) {
    dout[i] = got_dl[i];
    dout[i].device.device_type = kDLCUDA;
    dout[i].data = m->mem_alloc(bytes_of(&ot[i]), stream, false);
  }
  // Host tensors are refused, naming the device expected.
  CHECK_ERR(kiln_function_call(fn, in_dl, nin, dout, nout),
            KILN_STATUS_INVALID_ARGUMENT, "expected a CUDA tensor");
  printf("cuda: %.*s compiled, running\n", (int)(strchr(text, '(') - text), text);
  CHECK_OK(kiln_function_call_async(fn, din, nin, dout, nout, stream));
  for (size_t i = 0; i < nout; ++i)
    m->memcpy_(got_dl[i].data, dout[i].data, bytes_of(&ot[i]), stream);
  // Inputs the graph writes, as kiln left them on the device.
  kt_tensor_t got_in[KT_MAX_IO];
  memset(got_in, 0, sizeof(got_in));
  for (size_t i = 0; i < nin; ++i)
    if (kiln_graph_input_mutated(g, i) && kt_alloc(&got_in[i], &it[i], false))
      m->memcpy_(got_in[i].dl.data, din[i].data, bytes_of(&it[i]), stream);
  m->stream_sync(stream);
  CHECK_OK(kiln_graph_interpret(g, in_dl, nin, want_dl, nout));
  for (size_t i = 0; i < nin; ++i) {
    kt_compare_t c;
    if (got_in[i].base &&
        !kt_compare(&got_in[i], &in[i], kt_tolerance_for(it[i].dtype), &c)) {
      fprintf(stderr, "graph %.40s written input %zu differs from the reference\n",
              text, i);
      kt_failures++;
    }
  }
  kt_free_n(got_in, nin);
  for (size_t i = 0; i < nout; ++i) {
    kt_compare_t c;
    if (!kt_compare(&got[i], &want[i], kt_tolerance_for(ot[i].dtype), &c)) {
      fprintf(stderr, "graph %.40s output %zu differs from the reference\n",
              text, i);
      kt_failures++;
    }
  }
  printf("cuda: %.*s ok\n", (int)(strchr(text, '(') - text), text);
  for (size_t i = 0; i < nin; ++i) m->mem_free(din[i].data, stream);
  for (size_t i = 0; i < nout; ++i) m->mem_free(dout[i].data, stream);
  kt_free_n(in, nin);
  kt_free_n(got, nout);
  kt_free_n(want, nout);
  kiln_function_release(fn);
  kiln_graph_destroy(g);
}

static void run_graph(kiln_context_t *ctx, const char *text, mgpu_t *m,
                      void *stream, uint64_t *seed) {
  run_graph_with(ctx, text, NULL, m, stream, seed);
}

// max-autotune on the device: the tensor-core GEMM's block shape, pipeline
// depth and L2 grouping are searched (each candidate timed on the GPU, its
// outputs checked against the heuristic's), the tuned function matches the
// reference, and another graph holding the same GEMM takes its shape from
// the tuning database without measuring.
static void tuned_on_device(kiln_context_t *ctx, mgpu_t *m, void *stream, uint64_t *seed) {
  static const char *kTuned =
      "graph @tuned_mma(%a: bf16[1024,1024], %b: bf16[1024,2048]) {\n"
      "  %c = aten.mm(%a, %b)\n  return %c\n}\n";
  static const char *kAgain =
      "graph @tuned_mma_again(%a: bf16[1024,1024], %b: bf16[1024,2048], %x: f32[64]) {\n"
      "  %c = aten.mm(%a, %b)\n  %r = aten.relu(%x)\n  return %c, %r\n}\n";
  kiln_compile_options_t o;
  kiln_compile_options_init(&o);
  o.autotune = KILN_AUTOTUNE_MEASURE;
  o.autotune_budget_seconds = 20;
  kiln_stats_t a, b, c;
  kiln_context_stats(ctx, &a);
  run_graph_with(ctx, kTuned, &o, m, stream, seed);
  kiln_context_stats(ctx, &b);
  run_graph_with(ctx, kAgain, &o, m, stream, seed);
  kiln_context_stats(ctx, &c);
  printf("cuda autotune: %llu configurations measured in %.1f s; the second graph "
         "%llu database hits, %llu measured\n",
         (unsigned long long)(b.tune_measured - a.tune_measured),
         b.tune_seconds - a.tune_seconds,
         (unsigned long long)(c.tune_db_hits - b.tune_db_hits),
         (unsigned long long)(c.tune_measured - b.tune_measured));
  CHECK(b.tune_measured - a.tune_measured > 1);
  CHECK(c.tune_db_hits - b.tune_db_hits >= 1 && c.tune_measured == b.tune_measured);
}

// A graph whose kernels use 16-byte vector accesses refuses a misaligned
// buffer with a clear error instead of faulting on the device.
static void misaligned_is_refused(kiln_context_t *ctx, mgpu_t *m, void *stream) {
  const char *text =
      "graph @vec(%x: f32[8,512]) {\n  %t = aten.tanh(%x)\n  return %t\n}\n";
  kiln_graph_t *g = NULL;
  kiln_function_t *fn = NULL;
  kiln_compile_options_t o;
  kiln_compile_options_init(&o);
  o.target = "cuda";
  CHECK_OK(kiln_graph_parse(ctx, text, strlen(text), "vec", &g));
  if (g) CHECK_OK(kiln_function_compile(ctx, g, &o, &fn));
  if (!fn) {
    kiln_graph_destroy(g);
    return;
  }
  char *buf = m->mem_alloc(2 * 8 * 512 * 4 + 64, stream, false);
  int64_t shape[2] = {8, 512};
  DLTensor in = {buf, {kDLCUDA, 0}, 2, {kDLFloat, 32, 1}, shape, NULL, 4};
  DLTensor out = {buf + 8 * 512 * 4 + 32, {kDLCUDA, 0}, 2, {kDLFloat, 32, 1},
                  shape, NULL, 0};
  CHECK_ERR(kiln_function_call_async(fn, &in, 1, &out, 1, stream),
            KILN_STATUS_INVALID_ARGUMENT, "16-byte aligned");
  in.byte_offset = 0;
  CHECK_OK(kiln_function_call_async(fn, &in, 1, &out, 1, stream));
  m->stream_sync(stream);
  m->mem_free(buf, stream);
  kiln_function_release(fn);
  kiln_graph_destroy(g);
  printf("cuda: misaligned buffer refused\n");
}

// options.cuda_graphs: calls with the buffers of an earlier call replay its
// graph (and see the buffers' new contents); other buffers record a graph;
// past KILN_GRAPH_SLOTS (4) address sets the least recently used graph is
// updated in place. Every call gets fresh inputs and is checked.
#define GRAPH_SETS 5
typedef struct {
  DLTensor in[KT_MAX_IO], out[KT_MAX_IO];
} buffers_t;

static void graph_call(kiln_function_t *fn, kiln_graph_t *g, buffers_t *b,
                       mgpu_t *m, void *stream, uint64_t *seed) {
  size_t nin = kiln_graph_input_count(g), nout = kiln_graph_output_count(g);
  kt_tensor_t in[KT_MAX_IO], got[KT_MAX_IO], want[KT_MAX_IO];
  DLTensor in_dl[KT_MAX_IO], got_dl[KT_MAX_IO], want_dl[KT_MAX_IO];
  kiln_tensor_type_t it[KT_MAX_IO], ot[KT_MAX_IO];
  for (size_t i = 0; i < nin; ++i) {
    kiln_graph_input_type(g, i, &it[i]);
    kt_alloc(&in[i], &it[i], false);
    kt_fill_random(&in[i], seed);
    in_dl[i] = in[i].dl;
    m->memcpy_(b->in[i].data, in[i].dl.data, bytes_of(&it[i]), stream);
  }
  for (size_t i = 0; i < nout; ++i) kiln_graph_output_type(g, i, &ot[i]);
  CHECK(kt_alloc_outputs(ot, nout, got, want, got_dl, want_dl));
  CHECK_OK(kiln_function_call_async(fn, b->in, nin, b->out, nout, stream));
  for (size_t i = 0; i < nout; ++i)
    m->memcpy_(got_dl[i].data, b->out[i].data, bytes_of(&ot[i]), stream);
  m->stream_sync(stream);
  CHECK_OK(kiln_graph_interpret(g, in_dl, nin, want_dl, nout));
  for (size_t i = 0; i < nout; ++i) {
    kt_compare_t c;
    if (!kt_compare(&got[i], &want[i], kt_tolerance_for(ot[i].dtype), &c)) {
      fprintf(stderr, "cuda graphs: output %zu differs from the reference\n", i);
      kt_failures++;
    }
  }
  kt_free_n(in, nin);
  kt_free_n(got, nout);
  kt_free_n(want, nout);
}

static void graphs_replay(kiln_context_t *ctx, const char *text, mgpu_t *m,
                          void *stream, uint64_t *seed) {
  kiln_graph_t *g = NULL;
  kiln_function_t *fn = NULL;
  kiln_compile_options_t o;
  kiln_compile_options_init(&o);
  o.target = "cuda";
  o.cuda_graphs = 1;
  CHECK_OK(kiln_graph_parse(ctx, text, strlen(text), "graphs", &g));
  if (g) CHECK_OK(kiln_function_compile(ctx, g, &o, &fn));
  if (!fn) {
    kiln_graph_destroy(g);
    return;
  }
  size_t nin = kiln_graph_input_count(g), nout = kiln_graph_output_count(g);
  buffers_t sets[GRAPH_SETS];
  for (int k = 0; k < GRAPH_SETS; ++k)
    for (size_t i = 0; i < nin + nout; ++i) {
      kiln_tensor_type_t t;
      if (i < nin) kiln_graph_input_type(g, i, &t);
      else kiln_graph_output_type(g, i - nin, &t);
      DLTensor *d = i < nin ? &sets[k].in[i] : &sets[k].out[i - nin];
      int64_t *shape = malloc(sizeof(int64_t) * (size_t)(t.rank ? t.rank : 1));
      memcpy(shape, t.shape, sizeof(int64_t) * (size_t)t.rank);
      DLTensor v = {m->mem_alloc(bytes_of(&t), stream, false), {kDLCUDA, 0},
                    t.rank, t.dtype, shape, NULL, 0};
      *d = v;
    }
  kiln_stats_t before, after;
  kiln_context_stats(ctx, &before);
  // Sets 0..4 record (the fifth over set 0's graph), 4 replays, 0 records
  // over set 1 (least recently used), 0 and 2 replay; set 0's call 2 sees
  // new inputs in the same buffers.
  static const int order[] = {0, 1, 2, 3, 4, 4, 0, 0, 2};
  for (size_t k = 0; k < sizeof(order) / sizeof(order[0]); ++k)
    graph_call(fn, g, &sets[order[k]], m, stream, seed);
  kiln_context_stats(ctx, &after);
  uint64_t records = after.graph_records - before.graph_records;
  uint64_t replays = after.graph_replays - before.graph_replays;
  printf("cuda graphs: %.*s %llu calls, %llu recorded, %llu replayed\n",
         (int)(strchr(text, '(') - text), text,
         (unsigned long long)(sizeof(order) / sizeof(order[0])),
         (unsigned long long)records, (unsigned long long)replays);
  CHECK(records == 6 && replays == 3);
  for (int k = 0; k < GRAPH_SETS; ++k)
    for (size_t i = 0; i < nin + nout; ++i) {
      DLTensor *d = i < nin ? &sets[k].in[i] : &sets[k].out[i - nin];
      m->mem_free(d->data, stream);
      free(d->shape);
    }
  kiln_function_release(fn);
  kiln_graph_destroy(g);
}

// `cuda FILE`: the graphs of FILE (each starting at a line "graph @"), not
// the built-in ones -- for checking a list of graphs on the GPU machine.
static int run_file(kiln_context_t *ctx, const char *path, mgpu_t *m,
                    void *stream, uint64_t *seed) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "cuda: cannot open %s\n", path);
    return 1;
  }
  static char text[1 << 20];
  size_t n = fread(text, 1, sizeof(text) - 1, f);
  fclose(f);
  text[n] = 0;
  int count = 0;
  for (char *g = strstr(text, "graph @"); g;) {
    char *next = strstr(g + 1, "\ngraph @");
    if (next) *next = 0;
    run_graph(ctx, g, m, stream, seed);
    ++count;
    g = next ? next + 1 : NULL;
  }
  printf("cuda: %d graphs from %s\n", count, path);
  return 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IONBF, 0);  // a crash on the GPU machine keeps its log
  kiln_status_t s = kiln_cuda_available();
  if (s) {
    printf("cuda: skipped: %s\n", kiln_status_message(s));
    kiln_status_free(s);
    return 77;
  }
  // A private compile cache: the first context compiles, the second loads.
  char dir[] = "/tmp/kiln-cuda-test-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  kiln_context_options_t co;
  kiln_context_options_init(&co);
  co.cache_dir = dir;
  kiln_context_t *ctx = NULL;
  CHECK_OK(kiln_context_create(&co, &ctx));
  CHECK_OK(kiln_cuda_use_device(0));
  mgpu_t m = {lookup("mgpuStreamCreate"), lookup("mgpuStreamSynchronize"),
              lookup("mgpuStreamDestroy"), lookup("mgpuMemAlloc"),
              lookup("mgpuMemFree"), lookup("mgpuMemcpy")};
  if (kt_failures) return kt_finish("cuda");
  void *stream = m.stream_create();
  CHECK(stream != NULL);
  printf("cuda: stream %p\n", stream);
  uint64_t seed = (uint64_t)time(NULL);
  printf("cuda: seed %llu\n", (unsigned long long)seed);
  char cmd[128];
  snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
  if (argc > 1) {
    kt_failures += run_file(ctx, argv[1], &m, stream, &seed);
    m.stream_destroy(stream);
    kiln_context_destroy(ctx);
    CHECK(system(cmd) == 0);
    return kt_finish("cuda");
  }
  for (size_t i = 0; i < sizeof(kGraphs) / sizeof(kGraphs[0]); ++i)
    run_graph(ctx, kGraphs[i], &m, stream, &seed);
  misaligned_is_refused(ctx, &m, stream);
  graphs_replay(ctx, kGraphs[3], &m, stream, &seed);  // temporaries
  graphs_replay(ctx, kGraphs[2], &m, stream, &seed);  // a device copy step
  graphs_replay(ctx, graph_named("@consts("), &m, stream, &seed);  // constants
  graphs_replay(ctx, graph_named("@adam("), &m, stream, &seed);    // in place
  graphs_replay(ctx, graph_named("@hfuse("), &m, stream, &seed);   // merged kernels
  // sm_90: TMA tensor maps, by value, recorded with each address set.
  graphs_replay(ctx, graph_named("@wgbt2("), &m, stream, &seed);
  tuned_on_device(ctx, &m, stream, &seed);
  kiln_stats_t first;
  kiln_context_stats(ctx, &first);
  kiln_context_destroy(ctx);
  // A fresh context on the same cache directory: the launch programs and
  // their PTX come from the compile cache; nothing goes through MLIR.
  CHECK_OK(kiln_context_create(&co, &ctx));
  for (size_t i = 0; i < sizeof(kGraphs) / sizeof(kGraphs[0]); ++i)
    run_graph(ctx, kGraphs[i], &m, stream, &seed);
  kiln_stats_t second;
  kiln_context_stats(ctx, &second);
  printf("cuda: first context %llu compiles, second %llu compiles and %llu "
         "cache hits\n", (unsigned long long)first.compiles,
         (unsigned long long)second.compiles,
         (unsigned long long)second.cache_hits);
  CHECK(first.compiles >= 8);
  CHECK(second.compiles == 0 && second.cache_hits >= 7);
  m.stream_destroy(stream);
  kiln_context_destroy(ctx);
  CHECK(system(cmd) == 0);
  return kt_finish("cuda");
}
