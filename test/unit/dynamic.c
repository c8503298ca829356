// Symbolic sizes end to end: one compiled variant serves every value of a
// symbolic dim (sizes 1, primes, large), checked against the reference
// interpreter; the variant policy compiles at most two variants for 50 batch
// sizes in the default mode, one in "always", and respects the limit; a
// static graph's first variant takes the input layouts given at compile
// time.
#include <time.h>

#include "test_util.h"
#include "tools/tensor_util.h"

static const char *kGraph =
    "graph @dyn(%x: f32[s0,24], %w: f32[24,16], %b: f32[16], %i: i64[s1], %t: f32[10,16]) {\n"
    "  %h = aten.addmm(%b, %x, %w)\n"
    "  %g = aten.gelu(%h)\n"
    "  %s = aten._softmax(%g) {dim = 1}\n"
    "  %m = aten.mean(%h) {dims = [0], keepdim = true}\n"
    "  %v = aten.var(%h) {dims = [0]}\n"
    "  %y, %mu, %r = aten.native_layer_norm(%h, %b, none) {normalized_shape = [16], eps = 1e-5}\n"
    "  %u = aten.unsqueeze(%y) {dim = 1}\n"
    "  %q = aten.squeeze(%u) {dims = [1]}\n"
    "  %p = aten.permute(%q) {dims = [1, 0]}\n"
    "  %c = aten.cat(%h, %s) {dim = 1}\n"
    "  %l = aten.slice(%c) {dim = 1, start = 3, step = 5}\n"
    "  %e = aten.embedding(%t, %i)\n"
    "  %gt = aten.gt(%e, 0.1)\n"
    "  %z = aten.where(%gt, %e, 0.5)\n"
    "  %k = aten.sum(%x) {dims = [1]}\n"
    // Contraction over the symbolic dim (a weight gradient's K is the batch).
    "  %xt = aten.permute(%x) {dims = [1, 0]}\n"
    "  %gw = aten.mm(%xt, %h)\n"
    // A softmax down the symbolic dim.
    "  %sc = aten._softmax(%h) {dim = 0}\n"
    // A bf16 matmul with a symbolic M: the AVX512-BF16 microkernel where
    // the CPU has it (row blocks sized at run time, a tail of one-row
    // tiles), the generic contraction elsewhere.
    "  %xb = prims.convert_element_type(%x) {dtype = bf16}\n"
    "  %w2 = aten.cat(%w, %w) {dim = 1}\n"
    "  %wb = prims.convert_element_type(%w2) {dtype = bf16}\n"
    "  %mb = aten.mm(%xb, %wb)\n"
    // An f32 matmul with a symbolic M on the AVX-512 microkernel (row
    // blocks sized at run time, a masked tile for the last rows, six
    // packed panels and one of 16 columns read in place).
    "  %wn = aten.mul(%w, -2.0)\n"
    "  %w7 = aten.cat(%w2, %w2, %w2, %w2, %w2, %w2, %wn) {dim = 1}\n"
    "  %mf = aten.mm(%x, %w7)\n"
    // A run of columns of every row: a strided copy by contiguous runs.
    "  %cr = aten.slice(%x) {dim = 1, start = 4, end = 20, step = 1}\n"
    "  return %s, %m, %v, %r, %p, %l, %z, %k, %gw, %sc, %cr, %mb, %mf\n}\n";

#define MAXT 16

static int run_once(kiln_context_t *ctx, kiln_graph_t *g, kiln_function_t *fn,
                    int64_t s0, int64_t s1, bool strided, uint64_t *seed) {
  (void)ctx;
  size_t nin = kiln_graph_input_count(g), nout = kiln_graph_output_count(g);
  kt_tensor_t in[MAXT], got[MAXT], want[MAXT];
  DLTensor in_dl[MAXT], got_dl[MAXT], want_dl[MAXT];
  for (size_t i = 0; i < nin; ++i) {
    kiln_tensor_type_t t;
    kiln_graph_input_type(g, i, &t);
    for (int k = 0; k < t.rank; ++k)
      if (t.shape[k] == KILN_DIM_SYMBOLIC)
        t.shape[k] = strcmp(kiln_graph_input_dim_symbol(g, i, k), "s0") == 0 ? s0 : s1;
    kt_alloc(&in[i], &t, strided && i == 0);
    kt_fill_random(&in[i], seed);
    in_dl[i] = in[i].dl;
  }
  kiln_tensor_type_t ot[MAXT];
  int fails = 0;
  kiln_status_t s = kiln_function_output_types(fn, in_dl, nin, ot, nout);
  bool have_out = !s && kt_alloc_outputs(ot, nout, got, want, got_dl, want_dl);
  if (!s && !have_out) {
    fprintf(stderr, "s0=%lld s1=%lld: out of memory for the outputs\n",
            (long long)s0, (long long)s1);
    kt_free_n(in, nin);
    return 1;
  }
  if (!s) s = kiln_function_call(fn, in_dl, nin, got_dl, nout);
  if (!s) s = kiln_graph_interpret(g, in_dl, nin, want_dl, nout);
  if (s) {
    fprintf(stderr, "s0=%lld s1=%lld: %s\n", (long long)s0, (long long)s1,
            kiln_status_message(s));
    kiln_status_free(s);
    fails++;
  } else {
    for (size_t i = 0; i < nout; ++i) {
      kt_compare_t c;
      if (!kt_compare(&got[i], &want[i], kt_tolerance_for(got[i].dl.dtype), &c)) {
        fprintf(stderr, "s0=%lld s1=%lld%s output %zu: %lld mismatches, first "
                "at %lld: %.9g vs %.9g\n", (long long)s0, (long long)s1,
                strided ? " strided" : "", i, (long long)c.mismatches,
                (long long)c.first_bad, kt_get(&got[i], c.first_bad),
                kt_get(&want[i], c.first_bad));
        fails++;
      }
    }
  }
  kt_free_n(in, nin);
  if (have_out) {
    kt_free_n(got, nout);
    kt_free_n(want, nout);
  }
  return fails;
}

static kiln_function_t *compile(kiln_context_t *ctx, kiln_graph_t *g,
                                kiln_dynamic_t mode, int max_variants) {
  kiln_compile_options_t o;
  kiln_compile_options_init(&o);
  o.dynamic = mode;
  if (max_variants) o.max_variants = max_variants;
  kiln_function_t *fn = NULL;
  CHECK_OK(kiln_function_compile(ctx, g, &o, &fn));
  return fn;
}

int main(void) {
  uint64_t seed = (uint64_t)time(NULL);
  printf("dynamic: seed %llu\n", (unsigned long long)seed);
  kiln_context_t *ctx = NULL;
  kiln_graph_t *g = NULL;
  CHECK_OK(kiln_context_create(NULL, &ctx));
  CHECK_OK(kiln_graph_parse(ctx, kGraph, strlen(kGraph), "dyn", &g));
  if (!g) return kt_finish("dynamic");

  // 50 batch sizes: 1, primes, and large values, in the default policy.
  static const int64_t kSizes[] = {
      7, 1, 2, 3, 5, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61,
      67, 71, 73, 79, 83, 89, 97, 101, 127, 128, 255, 256, 257, 509, 511, 512,
      1021, 1024, 1031, 2039, 2048, 4093, 4096, 4099, 8191, 4, 6, 8, 9, 10, 12};
  kiln_function_t *fn = compile(ctx, g, KILN_DYNAMIC_AUTO, 0);
  if (fn) {
    for (size_t k = 0; k < sizeof(kSizes) / sizeof(kSizes[0]); ++k)
      kt_failures += run_once(ctx, g, fn, kSizes[k], 1 + (int64_t)(k % 9), false, &seed);
    int n = kiln_function_variant_count(fn);
    printf("auto: 50 batch sizes, %d variants\n", n);
    CHECK(n <= 2);
    kiln_function_release(fn);
  }
  // Symbolic from the start: one variant, strided inputs are another.
  fn = compile(ctx, g, KILN_DYNAMIC_ALWAYS, 0);
  if (fn) {
    kt_failures += run_once(ctx, g, fn, 1, 1, false, &seed);
    kt_failures += run_once(ctx, g, fn, 97, 5, false, &seed);
    CHECK(kiln_function_variant_count(fn) == 1);
    kt_failures += run_once(ctx, g, fn, 33, 2, true, &seed);
    CHECK(kiln_function_variant_count(fn) == 2);
    kiln_function_release(fn);
  }
  // Specialize every size up to the limit, then one symbolic variant.
  fn = compile(ctx, g, KILN_DYNAMIC_NEVER, 3);
  if (fn) {
    for (int64_t s = 1; s <= 6; ++s) kt_failures += run_once(ctx, g, fn, s, 2, false, &seed);
    int n = kiln_function_variant_count(fn);
    printf("never, limit 3: 6 sizes, %d variants\n", n);
    CHECK(n == 4);
    kiln_function_release(fn);
  }
  kiln_graph_destroy(g);
  // Layouts given at compile time (kiln_compile_options_t.input_strided):
  // a static graph's first variant takes input 0 strided, so a call with it
  // strided compiles nothing more; a contiguous call is another variant.
  static const char *kStatic =
      "graph @st(%x: f32[8,24], %w: f32[16,24]) {\n"
      "  %t = aten.permute(%w) {dims = [1, 0]}\n"
      "  %y = aten.mm(%x, %t)\n"
      "  %r = aten.relu(%y)\n"
      "  return %r\n}\n";
  CHECK_OK(kiln_graph_parse(ctx, kStatic, strlen(kStatic), "st", &g));
  if (g) {
    kiln_compile_options_t o;
    kiln_compile_options_init(&o);
    bool strided[2] = {true, false};
    o.input_strided = strided;
    fn = NULL;
    CHECK_OK(kiln_function_compile(ctx, g, &o, &fn));
    if (fn) {
      CHECK(kiln_function_variant_count(fn) == 1);
      kt_failures += run_once(ctx, g, fn, 0, 0, true, &seed);
      CHECK(kiln_function_variant_count(fn) == 1);
      kt_failures += run_once(ctx, g, fn, 0, 0, false, &seed);
      CHECK(kiln_function_variant_count(fn) == 2);
      kiln_function_release(fn);
    }
    kiln_graph_destroy(g);
  }
  kiln_context_destroy(ctx);
  return kt_finish("dynamic");
}
