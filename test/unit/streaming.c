// Streaming (non-temporal) stores into large outputs (lowering/streaming.c):
// a 32 MiB output written at an aligned address, at addresses off by 4 and
// by 32 bytes (each store then checks its address and takes the ordinary
// store where a 64-byte non-temporal one would fault) and at 64 bytes off;
// every result equals the reference interpreter's, and the bytes around the
// output are untouched.
#include <stdint.h>
#include <string.h>

#include "test/unit/test_util.h"
#include "tools/tensor_util.h"

static const char *kGraph =
    "graph @stream(%x: f32[2048,4096]) {\n"
    "  %y = aten.mul(%x, 2.5)\n"
    "  %z = aten.exp(%y)\n"
    "  return %z\n}\n";

enum { kGuard = 256 };

int main(void) {
  kiln_context_t *ctx = NULL;
  CHECK_OK(kiln_context_create(NULL, &ctx));
  kiln_graph_t *g = NULL;
  kiln_function_t *fn = NULL;
  CHECK_OK(kiln_graph_parse(ctx, kGraph, strlen(kGraph), "stream", &g));
  CHECK_OK(kiln_function_compile(ctx, g, NULL, &fn));
  if (!fn) return kt_finish("streaming");
  kiln_tensor_type_t it, ot;
  kiln_graph_input_type(g, 0, &it);
  kiln_graph_output_type(g, 0, &ot);
  uint64_t seed = 11;
  kt_tensor_t in, want;
  kt_alloc(&in, &it, false);
  kt_fill_random(&in, &seed);
  kt_alloc(&want, &ot, false);
  DLTensor want_dl = want.dl;
  CHECK_OK(kiln_graph_interpret(g, &in.dl, 1, &want_dl, 1));
  size_t bytes = (size_t)2048 * 4096 * 4;
  unsigned char *raw = aligned_alloc(64, bytes + 2 * kGuard);
  const size_t offsets[] = {0, 4, 32, 64};
  for (size_t i = 0; raw && i < sizeof(offsets) / sizeof(offsets[0]); ++i) {
    memset(raw, 0xA5, bytes + 2 * kGuard);
    kt_tensor_t got = want;
    got.base = raw + kGuard + offsets[i];
    got.dl.data = got.base;
    DLTensor out = got.dl;
    CHECK_OK(kiln_function_call(fn, &in.dl, 1, &out, 1));
    kt_compare_t c;
    if (!kt_compare(&got, &want, kt_tolerance_for(ot.dtype), &c)) {
      fprintf(stderr, "output at offset %zu differs from the reference\n", offsets[i]);
      kt_failures++;
    }
    size_t before = kGuard + offsets[i], after = kGuard - offsets[i];
    for (size_t k = 0; k < before; ++k) CHECK(raw[k] == 0xA5);
    for (size_t k = 0; k < after; ++k) CHECK(raw[before + bytes + k] == 0xA5);
  }
  free(raw);
  kt_free(&in);
  kt_free(&want);
  kiln_function_release(fn);
  kiln_graph_destroy(g);
  kiln_context_destroy(ctx);
  return kt_finish("streaming");
}
