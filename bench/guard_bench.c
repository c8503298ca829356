// Guard-table lookup cost for calls with 1, 8 and 64 inputs, and the whole
// kiln_function_call overhead on a tiny graph (guard hit, argument packing,
// libffi). Prints ns per operation; run on a quiet machine.
//   build/bench/guard_bench
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kiln/kiln.h"
#include "lib/guard/guard.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static float buf[1 << 12];

static void make_inputs(DLTensor *t, int64_t (*shapes)[2], int n, int64_t batch) {
  for (int i = 0; i < n; ++i) {
    memset(&t[i], 0, sizeof(t[i]));
    shapes[i][0] = batch;
    shapes[i][1] = 16;
    t[i].data = buf;
    t[i].device.device_type = kDLCPU;
    t[i].ndim = 2;
    t[i].dtype = (DLDataType){kDLFloat, 32, 1};
    t[i].shape = shapes[i];
  }
}

int main(void) {
  printf("guard lookup (hit; the table holds 8 signatures of the same graph)\n");
  for (int n = 1; n <= 64; n *= 8) {
    kiln_guard_table_t *table;
    if (kiln_guard_table_create(0, &table)) return 1;
    DLTensor t[64];
    int64_t shapes[64][2];
    static kiln_guard_key_t key;
    for (int64_t b = 1; b <= 8; ++b) {
      make_inputs(t, shapes, n, b);
      kiln_guard_key_make(t, (size_t)n, &key);
      kiln_guard_insert(table, &key, (void *)(intptr_t)b);
    }
    make_inputs(t, shapes, n, 5);
    const int iters = 2000000 / n;
    void *sink = NULL;
    double t0 = now();
    for (int i = 0; i < iters; ++i) {
      kiln_guard_key_make(t, (size_t)n, &key);
      sink = kiln_guard_lookup(table, &key);
    }
    double ns = (now() - t0) / iters;
    printf("  %2d inputs: %7.1f ns (key + probe)%s\n", n, ns,
           sink == (void *)(intptr_t)5 ? "" : "  WRONG VALUE");
    kiln_guard_table_destroy(table);
  }

  // The whole call on a graph whose kernel is trivial.
  const char *text =
      "graph @tiny(%a: f32[4,16], %b: f32[4,16]) {\n"
      "  %c = aten.add(%a, %b)\n  return %c\n}\n";
  kiln_context_t *ctx;
  kiln_graph_t *g;
  kiln_function_t *fn;
  if (kiln_context_create(NULL, &ctx) ||
      kiln_graph_parse(ctx, text, strlen(text), "tiny", &g) ||
      kiln_function_compile(ctx, g, NULL, &fn))
    return 1;
  DLTensor in[2], out;
  int64_t shapes[3][2];
  make_inputs(in, shapes, 2, 4);
  static float a[64], b[64], c[64];
  in[0].data = a;
  in[1].data = b;
  make_inputs(&out, &shapes[2], 1, 4);
  out.data = c;
  kiln_function_call(fn, in, 2, &out, 1);
  const int iters = 200000;
  double t0 = now();
  for (int i = 0; i < iters; ++i) kiln_function_call(fn, in, 2, &out, 1);
  printf("kiln_function_call, 2 inputs of 4x16 f32 (guard hit + checks + "
         "libffi + kernel): %.1f ns\n", (now() - t0) / iters);
  kiln_function_release(fn);
  kiln_graph_destroy(g);
  kiln_context_destroy(ctx);
  return 0;
}
