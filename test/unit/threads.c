// One compiled function called from several threads at once gives the same
// results as the reference interpreter in every thread; so does a function
// whose first calls (which compile a variant) race; so do different graphs
// compiled from several threads at once (each compile on an MLIR context of
// its own, lib/api's acquire_mlir).
#include <pthread.h>

#include "test_util.h"
#include "tools/tensor_util.h"

#define THREADS 4
#define ITERS 50

static const char *kText =
    "graph @g(%x: f32[s0,64], %w: f32[64,32], %b: f32[32]) {\n"
    "  %h = aten.addmm(%b, %x, %w)\n  %y = aten._softmax(%h) {dim = 1}\n"
    "  return %y\n}\n";

static kiln_context_t *ctx;
static kiln_graph_t *graph;
static kiln_function_t *fn;

typedef struct {
  int id;
  int failures;
} worker_t;

static void *worker(void *arg) {
  worker_t *w = arg;
  uint64_t seed = 1234 + (uint64_t)w->id;
  kiln_tensor_type_t tx = {{kDLFloat, 32, 1}, 2, {5 + w->id % 2, 64}};
  kiln_tensor_type_t tw = {{kDLFloat, 32, 1}, 2, {64, 32}};
  kiln_tensor_type_t tb = {{kDLFloat, 32, 1}, 1, {32}};
  kiln_tensor_type_t ty = {{kDLFloat, 32, 1}, 2, {tx.shape[0], 32}};
  kt_tensor_t x, wt, b, got, want;
  kt_alloc(&x, &tx, false);
  kt_alloc(&wt, &tw, false);
  kt_alloc(&b, &tb, false);
  kt_alloc(&got, &ty, false);
  kt_alloc(&want, &ty, false);
  for (int it = 0; it < ITERS; ++it) {
    kt_fill_random(&x, &seed);
    kt_fill_random(&wt, &seed);
    kt_fill_random(&b, &seed);
    kt_poison(&got);
    DLTensor in[3] = {x.dl, wt.dl, b.dl};
    kiln_status_t s = kiln_function_call(fn, in, 3, &got.dl, 1);
    if (!s) s = kiln_graph_interpret(graph, in, 3, &want.dl, 1);
    if (s) {
      fprintf(stderr, "thread %d: %s\n", w->id, kiln_status_message(s));
      kiln_status_free(s);
      w->failures++;
      break;
    }
    kt_compare_t c;
    if (!kt_compare(&got, &want, kt_tolerance_for(got.dl.dtype), &c)) {
      fprintf(stderr, "thread %d iteration %d: %lld mismatches\n", w->id, it,
              (long long)c.mismatches);
      w->failures++;
    }
  }
  kt_free(&x);
  kt_free(&wt);
  kt_free(&b);
  kt_free(&got);
  kt_free(&want);
  return NULL;
}

// Graphs that differ (a softmax over rows of 8 << id): compiled at once.
static void *compile_worker(void *arg) {
  worker_t *w = arg;
  int n = 8 << w->id;
  char text[256];
  snprintf(text, sizeof(text),
           "graph @c%d(%%x: f32[16,%d], %%w: f32[%d,%d]) {\n"
           "  %%h = aten.mm(%%x, %%w)\n  %%y = aten._softmax(%%h) {dim = 1}\n"
           "  return %%y\n}\n", w->id, n, n, n);
  kiln_graph_t *g = NULL;
  kiln_function_t *f = NULL;
  kiln_status_t s = kiln_graph_parse(ctx, text, strlen(text), "threads", &g);
  if (!s) s = kiln_function_compile(ctx, g, NULL, &f);
  kiln_tensor_type_t tx = {{kDLFloat, 32, 1}, 2, {16, n}};
  kiln_tensor_type_t tw = {{kDLFloat, 32, 1}, 2, {n, n}};
  kt_tensor_t x, wt, got, want;
  kt_alloc(&x, &tx, false);
  kt_alloc(&wt, &tw, false);
  kt_alloc(&got, &tx, false);
  kt_alloc(&want, &tx, false);
  uint64_t seed = 99 + (uint64_t)w->id;
  kt_fill_random(&x, &seed);
  kt_fill_random(&wt, &seed);
  kt_poison(&got);
  DLTensor in[2] = {x.dl, wt.dl};
  if (!s) s = kiln_function_call(f, in, 2, &got.dl, 1);
  if (!s) s = kiln_graph_interpret(g, in, 2, &want.dl, 1);
  kt_compare_t c;
  if (s) {
    fprintf(stderr, "compiler %d: %s\n", w->id, kiln_status_message(s));
    kiln_status_free(s);
    w->failures++;
  } else if (!kt_compare(&got, &want, kt_tolerance_for(got.dl.dtype), &c)) {
    fprintf(stderr, "compiler %d: %lld mismatches\n", w->id, (long long)c.mismatches);
    w->failures++;
  }
  kt_free(&x);
  kt_free(&wt);
  kt_free(&got);
  kt_free(&want);
  kiln_function_release(f);
  kiln_graph_destroy(g);
  return NULL;
}

// Runs `fn` on THREADS threads at once; returns their failures.
static int run_threads(void *(*fn)(void *)) {
  pthread_t t[THREADS];
  worker_t w[THREADS];
  for (int i = 0; i < THREADS; ++i) {
    w[i].id = i;
    w[i].failures = 0;
    pthread_create(&t[i], NULL, fn, &w[i]);
  }
  int failures = 0;
  for (int i = 0; i < THREADS; ++i) {
    pthread_join(t[i], NULL);
    failures += w[i].failures;
  }
  return failures;
}

int main(void) {
  CHECK_OK(kiln_context_create(NULL, &ctx));
  CHECK_OK(kiln_graph_parse(ctx, kText, strlen(kText), "threads", &graph));
  if (!graph) return 1;
  CHECK_OK(kiln_function_compile(ctx, graph, NULL, &fn));
  if (!fn) return 1;
  kt_failures += run_threads(worker);
  kiln_function_release(fn);
  kiln_graph_destroy(graph);
  kiln_context_destroy(ctx);

  // Compiles at once, in a context without the compile cache (so each one
  // runs MLIR and LLVM).
  kiln_context_options_t o;
  kiln_context_options_init(&o);
  o.disable_cache = 1;
  CHECK_OK(kiln_context_create(&o, &ctx));
  if (!ctx) return kt_finish("threads");
  kt_failures += run_threads(compile_worker);
  kiln_stats_t st;
  kiln_context_stats(ctx, &st);
  CHECK(st.compiles == THREADS);
  kiln_context_destroy(ctx);
  return kt_finish("threads");
}
