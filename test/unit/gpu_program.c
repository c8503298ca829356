// The CUDA target's launch program (lowering/gpu.c) without a GPU: a
// bf16 GEMM lowered for sm_90 passes its operands as TMA tensor maps (a
// table in the program, each launch argument naming one), the table
// describes A and B as the kernel loads them, and it survives the compile
// cache's serialization; entries that would make the launcher read outside
// the program (a map of a buffer it lacks, an argument naming a map it
// lacks, a map passed to a copy) are refused when the payload is read.
// f16 GEMMs take the same kernels: wgmma with f16 tensor maps on sm_90,
// and on sm_80 mma.sync left f16 while a bf16 GEMM's beside it is
// relabeled bf16.
#include <stdlib.h>
#include <string.h>

#include "lowering/lowering.h"
#include "test/unit/test_util.h"

static const char *kGraph =
    "graph @mm(%a: bf16[256,512], %b: bf16[512,384]) {\n"
    "  %c = aten.mm(%a, %b)\n"
    "  return %c\n}\n";

static const char *kHalves =
    "graph @mm2(%a: bf16[256,512], %b: bf16[512,384], %x: f16[128,256], "
    "%y: f16[256,256]) {\n"
    "  %c = aten.mm(%a, %b)\n  %z = aten.mm(%x, %y)\n"
    "  return %c, %z\n}\n";

// `text` lowered as lib/api lowers a graph for the CUDA target of a `chip`
// device, into `p`.
static void compile(kiln_mlir_t *m, const char *text, const char *chip,
                    kiln_gpu_program_t *p) {
  memset(p, 0, sizeof(*p));
  kiln_graph_t *g = NULL;
  CHECK_OK(kiln_graph_parse_text(text, strlen(text), "g", &g));
  kiln_lower_options_t lo = {.collapse_reductions = true,
                             .lhs_transpose_map = true,
                             .cuda = true,
                             .cuda_sm = atoi(chip + 3)};
  char *linalg = NULL;
  if (g) CHECK_OK(kiln_lower_to_linalg(g, NULL, &lo, &linalg));
  MlirModule module = {NULL};
  if (linalg) CHECK_OK(kiln_mlir_parse(m, linalg, &module));
  kiln_pipeline_options_t o;
  memset(&o, 0, sizeof(o));
  o.vectorize = 1;
  if (!mlirModuleIsNull(module)) {
    CHECK_OK(kiln_pipeline_run_gpu(m, module, chip, &o, p));
    mlirModuleDestroy(module);
  }
  free(linalg);
  kiln_graph_free(g);
}

// The number of the program's modules whose PTX has `needle`.
static int modules_with(const kiln_gpu_program_t *p, const char *needle) {
  int n = 0;
  for (int i = 0; i < p->module_count; ++i) n += strstr(p->ptx[i], needle) != NULL;
  return n;
}

// The launch of the tensor-core kernel (the program's only one).
static const kiln_gpu_launch_t *gemm_launch(const kiln_gpu_program_t *p) {
  for (int l = 0; l < p->launch_count; ++l)
    if (p->launches[l].kind == KILN_GPU_LAUNCH) return &p->launches[l];
  return NULL;
}

// Serializes `p`, lets `corrupt` change the copy `q` it reads back, and
// reports whether deserialization accepted it.
static bool round_trip(const kiln_gpu_program_t *p, void (*corrupt)(kiln_gpu_program_t *),
                       kiln_gpu_program_t *back) {
  kiln_gpu_program_t q = *p;
  kiln_gpu_launch_t *launches = malloc(sizeof(*launches) * (size_t)p->launch_count);
  kiln_gpu_tmap_t *tmaps = malloc(sizeof(*tmaps) * (size_t)(p->tmap_count + 1));
  memcpy(launches, p->launches, sizeof(*launches) * (size_t)p->launch_count);
  memcpy(tmaps, p->tmaps, sizeof(*tmaps) * (size_t)p->tmap_count);
  q.launches = launches;
  q.tmaps = tmaps;
  if (corrupt) corrupt(&q);
  void *data = NULL;
  size_t size = 0;
  CHECK_OK(kiln_gpu_program_serialize(&q, &data, &size));
  free(launches);
  free(tmaps);
  if (q.temp_bytes != p->temp_bytes) free(q.temp_bytes);
  kiln_status_t s = kiln_gpu_program_deserialize(data, size, back);
  free(data);
  bool ok = s == NULL;
  kiln_status_free(s);
  return ok;
}

static void map_of_missing_buffer(kiln_gpu_program_t *q) {
  q->tmaps[0].buffer = q->arg_count + q->temp_count + q->const_count;
}
static void missing_map(kiln_gpu_program_t *q) {
  for (int l = 0; l < q->launch_count; ++l)
    if (q->launches[l].kind == KILN_GPU_LAUNCH)
      q->launches[l].args[0] = KILN_GPU_TMAP_ARG(q->tmap_count);
}
static void map_into_copy(kiln_gpu_program_t *q) {
  kiln_gpu_launch_t *l = &q->launches[0];
  memset(l, 0, sizeof(*l));
  l->kind = KILN_GPU_COPY;
  l->arg_count = 2;
  l->args[0] = KILN_GPU_TMAP_ARG(0);
  l->args[1] = 2;
}
static void bad_rank(kiln_gpu_program_t *q) { q->tmaps[1].rank = 6; }
static void huge_box(kiln_gpu_program_t *q) { q->tmaps[0].box[1] = 512; }
// A map of a temporary reaching past its end.
static void past_temporary(kiln_gpu_program_t *q) {
  int64_t *tb = malloc(sizeof(int64_t) * (size_t)(q->temp_count + 1));
  if (q->temp_count) memcpy(tb, q->temp_bytes, sizeof(int64_t) * (size_t)q->temp_count);
  tb[q->temp_count] = 1024;  // rows of 1024 bytes; the map needs 256 of them
  q->temp_bytes = tb;  // round_trip frees the copy
  q->tmaps[0].buffer = q->arg_count + q->temp_count;
  q->temp_count++;
}

int main(void) {
  kiln_mlir_t *m = NULL;
  CHECK_OK(kiln_mlir_create(&m));
  kiln_graph_t *g = NULL;
  CHECK_OK(kiln_graph_parse_text(kGraph, strlen(kGraph), "mm", &g));
  // As lib/api lowers a graph for the CUDA target of an sm_90 device.
  kiln_lower_options_t lo = {.collapse_reductions = true,
                             .lhs_transpose_map = true,
                             .cuda = true,
                             .cuda_sm = 90};
  char *linalg = NULL;
  if (g) CHECK_OK(kiln_lower_to_linalg(g, NULL, &lo, &linalg));
  MlirModule module = {NULL};
  if (m && linalg) CHECK_OK(kiln_mlir_parse(m, linalg, &module));
  kiln_pipeline_options_t o;
  memset(&o, 0, sizeof(o));
  o.vectorize = 1;
  kiln_gpu_program_t p;
  memset(&p, 0, sizeof(p));
  if (!mlirModuleIsNull(module)) CHECK_OK(kiln_pipeline_run_gpu(m, module, "sm_90", &o, &p));
  const kiln_gpu_launch_t *ln = gemm_launch(&p);
  CHECK(ln && p.tmap_count == 2 && p.arg_count == 3);
  if (!ln || p.tmap_count != 2) return kt_finish("gpu_program");
  // A [256, 512] in boxes of 64 k x 128 rows; B [512, 384] in boxes of
  // 64 n x 64 k; sizes innermost first, strides in bytes.
  CHECK(ln->arg_count == 3 && ln->args[0] == KILN_GPU_TMAP_ARG(0) &&
        ln->args[1] == KILN_GPU_TMAP_ARG(1) && ln->args[2] == 2);
  const kiln_gpu_tmap_t *a = &p.tmaps[0], *b = &p.tmaps[1];
  CHECK(a->buffer == 0 && a->rank == 2 && a->dtype == KILN_BF16 && a->offset_bytes == 0 &&
        a->dims[0] == 512 && a->dims[1] == 256 && a->strides[0] == 2 &&
        a->strides[1] == 1024 && a->box[0] == 64 && a->box[1] == 128 &&
        a->swizzle == 128 && a->l2promo == 256);
  CHECK(b->buffer == 1 && b->rank == 2 && b->dims[0] == 384 && b->dims[1] == 512 &&
        b->strides[1] == 768 && b->box[0] == 64 && b->box[1] == 64 && b->swizzle == 128);
  // The kernel's parameters: two 128-byte maps by value, then C.
  CHECK(strstr(p.ptx[ln->module], ".param .align 64 .b8") &&
        strstr(p.ptx[ln->module], "cp.async.bulk.tensor.2d"));

  kiln_gpu_program_t back;
  CHECK(round_trip(&p, NULL, &back));
  CHECK(back.tmap_count == 2 && memcmp(back.tmaps, p.tmaps, sizeof(*p.tmaps) * 2) == 0 &&
        memcmp(gemm_launch(&back)->args, ln->args, sizeof(ln->args)) == 0);
  kiln_gpu_program_free(&back);
  CHECK(!round_trip(&p, map_of_missing_buffer, &back));
  CHECK(!round_trip(&p, missing_map, &back));
  CHECK(!round_trip(&p, map_into_copy, &back));
  CHECK(!round_trip(&p, bad_rank, &back));
  CHECK(!round_trip(&p, huge_box, &back));
  CHECK(!round_trip(&p, past_temporary, &back));

  // KILN_GPU_TMA=0: the same kernel on cp.async, A and B passed as buffers.
  setenv("KILN_GPU_TMA", "0", 1);
  kiln_gpu_program_t c;
  memset(&c, 0, sizeof(c));
  MlirModule again = {NULL};
  if (m && linalg) CHECK_OK(kiln_mlir_parse(m, linalg, &again));
  if (!mlirModuleIsNull(again)) CHECK_OK(kiln_pipeline_run_gpu(m, again, "sm_90", &o, &c));
  ln = gemm_launch(&c);
  CHECK(c.tmap_count == 0 && ln && ln->args[0] == 0 && ln->args[1] == 1);
  unsetenv("KILN_GPU_TMA");
  kiln_gpu_program_free(&c);

  // sm_90: the f16 GEMM is a wgmma kernel on f16 tensor maps.
  compile(m, kHalves, "sm_90", &c);
  CHECK(c.tmap_count == 4 && c.tmaps[0].dtype == KILN_BF16 && c.tmaps[2].dtype == KILN_F16 &&
        c.tmaps[2].dims[0] == 256 && c.tmaps[2].dims[1] == 128);
  CHECK(modules_with(&c, "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16") == 1 &&
        modules_with(&c, "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16") == 1);
  kiln_gpu_program_free(&c);
  // sm_80: mma.sync for both; only the bf16 kernel's is relabeled.
  compile(m, kHalves, "sm_80", &c);
  CHECK(c.tmap_count == 0);
  CHECK(modules_with(&c, "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32") == 1 &&
        modules_with(&c, "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32") == 1 &&
        modules_with(&c, "cvt.rn.f16x2.f32") == 1 && modules_with(&c, "cvt.rn.bf16x2.f32") == 1);
  for (int i = 0; i < c.module_count; ++i)
    if (strstr(c.ptx[i], "f32.f16.f16.f32")) CHECK(strstr(c.ptx[i], "cvt.rn.f16x2.f32"));
  kiln_gpu_program_free(&c);
  kiln_gpu_program_free(&p);
  if (!mlirModuleIsNull(module)) mlirModuleDestroy(module);
  if (!mlirModuleIsNull(again)) mlirModuleDestroy(again);
  free(linalg);
  kiln_graph_free(g);
  kiln_mlir_destroy(m);
  return kt_finish("gpu_program");
}
