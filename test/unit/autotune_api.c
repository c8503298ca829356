// max-autotune through the public API: a measured search compiles and times
// candidates, the tuned function matches the reference interpreter, a second
// process-like context reuses the compiled variant, and a different graph
// holding the same matmul takes that kernel's tiles from the tuning database
// instead of searching it again.
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test/unit/test_util.h"
#include "tools/tensor_util.h"

static const char *kMatmul =
    "graph @tuned_mm(%a: f32[256,512], %b: f32[512,384], %c: f32[384]) {\n"
    "  %m = aten.mm(%a, %b)\n"
    "  %y = aten.add(%m, %c)\n"
    "  return %y\n}\n";
// The same matmul feeding a different epilogue.
static const char *kMatmulRelu =
    "graph @tuned_mm_relu(%a: f32[256,512], %b: f32[512,384], %c: f32[384]) {\n"
    "  %m = aten.mm(%a, %b)\n"
    "  %y = aten.add(%m, %c)\n"
    "  %r = aten.relu(%y)\n"
    "  return %r\n}\n";

static kiln_context_t *open_ctx(const char *d) {
  kiln_context_options_t o;
  kiln_context_options_init(&o);
  o.cache_dir = d;
  kiln_context_t *ctx = NULL;
  CHECK_OK(kiln_context_create(&o, &ctx));
  return ctx;
}

// Compiles `text` under max-autotune and checks one call against the
// reference interpreter; returns the context's stats after it.
static kiln_stats_t tune_and_check(kiln_context_t *ctx, const char *text) {
  kiln_stats_t st;
  memset(&st, 0, sizeof(st));
  kiln_graph_t *g = NULL;
  kiln_function_t *fn = NULL;
  kiln_compile_options_t opts;
  kiln_compile_options_init(&opts);
  opts.autotune = KILN_AUTOTUNE_MEASURE;
  opts.autotune_budget_seconds = 10;
  CHECK_OK(kiln_graph_parse(ctx, text, strlen(text), "tune", &g));
  if (!g) return st;
  CHECK_OK(kiln_function_compile(ctx, g, &opts, &fn));
  if (!fn) {
    kiln_graph_destroy(g);
    return st;
  }
  uint64_t seed = (uint64_t)getpid() * 2654435761u + 1;
  kt_tensor_t in[3];
  DLTensor in_dl[3];
  for (size_t i = 0; i < 3; ++i) {
    kiln_tensor_type_t t;
    CHECK_OK(kiln_graph_input_type(g, i, &t));
    CHECK(kt_alloc(&in[i], &t, false));
    kt_fill_random(&in[i], &seed);
    in_dl[i] = in[i].dl;
  }
  kiln_tensor_type_t ot;
  CHECK_OK(kiln_graph_output_type(g, 0, &ot));
  kt_tensor_t got, want;
  DLTensor got_dl, want_dl;
  CHECK(kt_alloc_outputs(&ot, 1, &got, &want, &got_dl, &want_dl));
  CHECK_OK(kiln_function_call(fn, in_dl, 3, &got_dl, 1));
  CHECK_OK(kiln_graph_interpret(g, in_dl, 3, &want_dl, 1));
  kt_compare_t c;
  CHECK(kt_compare(&got, &want, kt_tolerance_for(ot.dtype), &c));
  kt_free_n(in, 3);
  kt_free(&got);
  kt_free(&want);
  kiln_function_release(fn);
  kiln_graph_destroy(g);
  kiln_context_stats(ctx, &st);
  return st;
}

int main(void) {
  // The matmuls take the tiled linalg.matmul, whose tiles are searched (on
  // AVX-512 CPUs they would be the f32 microkernel, whose are fixed).
  setenv("KILN_F32_DOT", "0", 1);
  char dir[] = "/tmp/kiln-autotune-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  // First compile: the matmul and the bias add are searched.
  kiln_context_t *ctx = open_ctx(dir);
  kiln_stats_t a = tune_and_check(ctx, kMatmul);
  printf("first: %llu configurations measured in %.2f s, %llu database hits\n",
         (unsigned long long)a.tune_measured, a.tune_seconds,
         (unsigned long long)a.tune_db_hits);
  CHECK(a.compiles == 1 && a.tune_measured > 1 && a.tune_db_hits == 0);
  kiln_context_destroy(ctx);
  // A fresh context on the same directory: the tuned variant is in the
  // compile cache; nothing is compiled or measured.
  ctx = open_ctx(dir);
  kiln_stats_t b = tune_and_check(ctx, kMatmul);
  CHECK(b.cache_hits == 1 && b.compiles == 0 && b.tune_measured == 0);
  // Another graph with the same matmul: its tiles come from the database.
  kiln_stats_t c = tune_and_check(ctx, kMatmulRelu);
  printf("second graph: %llu database hits, %llu measured\n",
         (unsigned long long)(c.tune_db_hits - b.tune_db_hits),
         (unsigned long long)(c.tune_measured - b.tune_measured));
  CHECK(c.tune_db_hits - b.tune_db_hits >= 1);
  kiln_context_destroy(ctx);
  // A heuristic compile of the same graph is a different cache entry: it
  // neither loads the tuned object nor measures anything.
  ctx = open_ctx(dir);
  kiln_graph_t *g = NULL;
  kiln_function_t *fn = NULL;
  CHECK_OK(kiln_graph_parse(ctx, kMatmul, strlen(kMatmul), "h", &g));
  CHECK_OK(kiln_function_compile(ctx, g, NULL, &fn));
  kiln_stats_t h;
  kiln_context_stats(ctx, &h);
  CHECK(h.compiles == 1 && h.tune_measured == 0 && h.tune_db_hits == 0);
  kiln_function_release(fn);
  kiln_graph_destroy(g);
  // Invalid autotune mode: a clear error.
  kiln_compile_options_t bad;
  kiln_compile_options_init(&bad);
  bad.autotune = (kiln_autotune_t)7;
  CHECK_OK(kiln_graph_parse(ctx, kMatmul, strlen(kMatmul), "h", &g));
  CHECK_ERR(kiln_function_compile(ctx, g, &bad, &fn), KILN_STATUS_INVALID_ARGUMENT,
            "KILN_AUTOTUNE_MEASURE");
  kiln_graph_destroy(g);
  kiln_context_destroy(ctx);
  char cmd[300];
  snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
  CHECK(system(cmd) == 0);
  return kt_finish("autotune_api");
}
