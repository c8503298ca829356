// kiln_function_call_alloc's output pool: a released large output's buffer
// serves the next call (no fresh pages), the reused buffer is fully
// overwritten (results equal the reference although it held other data),
// small outputs are not pooled, and buffers are never shared by two live
// outputs.
#include <string.h>

#include "test/unit/test_util.h"
#include "tools/tensor_util.h"

// 512 x 1024 f32: 2 MiB, above the pool's 256 KiB threshold; the second
// output (a row sum, 2 KiB) is below it.
static const char *kGraph =
    "graph @pool(%x: f32[512,1024]) {\n"
    "  %y = aten.tanh(%x)\n"
    "  %s = aten.sum(%y) {dims = [1], keepdim = false}\n"
    "  return %y, %s\n}\n";

static int check_call(kiln_function_t *fn, kiln_graph_t *g, uint64_t *seed,
                      void **data) {
  kiln_tensor_type_t it, ot[2];
  kiln_graph_input_type(g, 0, &it);
  kiln_graph_output_type(g, 0, &ot[0]);
  kiln_graph_output_type(g, 1, &ot[1]);
  kt_tensor_t in, want[2];
  kt_alloc(&in, &it, false);
  kt_fill_random(&in, seed);
  kt_alloc(&want[0], &ot[0], false);
  kt_alloc(&want[1], &ot[1], false);
  DLTensor want_dl[2] = {want[0].dl, want[1].dl};
  DLManagedTensor *out[2] = {NULL, NULL};
  int fails = kt_failures;
  CHECK_OK(kiln_function_call_alloc(fn, &in.dl, 1, out, 2));
  CHECK_OK(kiln_graph_interpret(g, &in.dl, 1, want_dl, 2));
  for (int k = 0; k < 2 && out[0] && out[1]; ++k) {
    kt_tensor_t got;
    memset(&got, 0, sizeof(got));
    got.dl = out[k]->dl_tensor;
    got.base = got.dl.data;
    kt_compare_t c;
    CHECK(kt_compare(&got, &want[k], kt_tolerance_for(ot[k].dtype), &c));
    data[k] = out[k]->dl_tensor.data;
  }
  // The caller keeps output 0 alive while the next call runs when asked.
  for (int k = 0; k < 2; ++k)
    if (out[k]) out[k]->deleter(out[k]);
  kt_free(&in);
  kt_free_n(want, 2);
  return kt_failures - fails;
}

int main(void) {
  kiln_context_t *ctx = NULL;
  CHECK_OK(kiln_context_create(NULL, &ctx));
  kiln_graph_t *g = NULL;
  kiln_function_t *fn = NULL;
  CHECK_OK(kiln_graph_parse(ctx, kGraph, strlen(kGraph), "pool", &g));
  CHECK_OK(kiln_function_compile(ctx, g, NULL, &fn));
  if (!fn) return kt_finish("output_pool");
  uint64_t seed = 7;
  void *first[2] = {NULL, NULL}, *second[2] = {NULL, NULL};
  check_call(fn, g, &seed, first);
  check_call(fn, g, &seed, second);  // new inputs, same buffer
  CHECK(first[0] && first[0] == second[0]);
  // Two live outputs never share a buffer.
  kiln_tensor_type_t it;
  kiln_graph_input_type(g, 0, &it);
  kt_tensor_t in;
  kt_alloc(&in, &it, false);
  kt_fill_random(&in, &seed);
  DLManagedTensor *a[2] = {NULL, NULL}, *b[2] = {NULL, NULL};
  CHECK_OK(kiln_function_call_alloc(fn, &in.dl, 1, a, 2));
  CHECK_OK(kiln_function_call_alloc(fn, &in.dl, 1, b, 2));
  if (a[0] && b[0]) {
    CHECK(a[0]->dl_tensor.data != b[0]->dl_tensor.data);
    CHECK(memcmp(a[0]->dl_tensor.data, b[0]->dl_tensor.data, 512 * 1024 * 4) == 0);
  }
  for (int k = 0; k < 2; ++k) {
    if (a[k]) a[k]->deleter(a[k]);
    if (b[k]) b[k]->deleter(b[k]);
  }
  kt_free(&in);
  kiln_function_release(fn);
  kiln_graph_destroy(g);
  kiln_context_destroy(ctx);
  return kt_finish("output_pool");
}
