// The CPU pipeline: upstream MLIR passes run through the C API, stage by
// stage, with the IR dumped after each when asked.
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <mlir-c/Diagnostics.h>
#include <mlir-c/Pass.h>
#include <mlir-c/RegisterEverything.h>
#include <mlir-c/Support.h>

#include "kernels/kernels.h"
#include "lowering.h"

struct kiln_mlir {
  MlirContext ctx;
  MlirDiagnosticHandlerID handler;
  kiln_sbuf_t diags;  // diagnostics since the last take
};

static void append_cb(MlirStringRef s, void *user) {
  kiln_sbuf_append((kiln_sbuf_t *)user, s.data, s.length);
}

static MlirLogicalResult on_diag(MlirDiagnostic d, void *user) {
  kiln_mlir_t *m = user;
  if (m->diags.length > 16384) return mlirLogicalResultSuccess();
  MlirDiagnosticSeverity sev = mlirDiagnosticGetSeverity(d);
  kiln_sbuf_puts(&m->diags, sev == MlirDiagnosticError     ? "error: "
                            : sev == MlirDiagnosticWarning ? "warning: "
                                                           : "note: ");
  mlirLocationPrint(mlirDiagnosticGetLocation(d), append_cb, &m->diags);
  kiln_sbuf_puts(&m->diags, ": ");
  mlirDiagnosticPrint(d, append_cb, &m->diags);
  kiln_sbuf_puts(&m->diags, "\n");
  return mlirLogicalResultSuccess();
}

// Registering passes touches global registries: once per process.
static pthread_once_t passes_once = PTHREAD_ONCE_INIT;
static void register_passes(void) { mlirRegisterAllPasses(); }

kiln_status_t kiln_mlir_create(kiln_mlir_t **out) {
  *out = NULL;
  kiln_mlir_t *m = calloc(1, sizeof(*m));
  if (!m) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "MLIR context");
  pthread_once(&passes_once, register_passes);
  m->ctx = mlirContextCreateWithThreading(false);
  MlirDialectRegistry reg = mlirDialectRegistryCreate();
  mlirRegisterAllDialects(reg);
  mlirContextAppendDialectRegistry(m->ctx, reg);
  mlirDialectRegistryDestroy(reg);
  mlirContextLoadAllAvailableDialects(m->ctx);
  mlirRegisterAllLLVMTranslations(m->ctx);
  kiln_sbuf_init(&m->diags);
  m->handler = mlirContextAttachDiagnosticHandler(m->ctx, on_diag, m, NULL);
  *out = m;
  return NULL;
}

void kiln_mlir_destroy(kiln_mlir_t *m) {
  if (!m) return;
  mlirContextDetachDiagnosticHandler(m->ctx, m->handler);
  mlirContextDestroy(m->ctx);
  kiln_sbuf_free(&m->diags);
  free(m);
}

MlirContext kiln_mlir_context(kiln_mlir_t *m) { return m->ctx; }

// Moves the captured diagnostics into a status.
static kiln_status_t diag_error(kiln_mlir_t *m, const char *what) {
  kiln_status_t s = kiln_make_status(
      KILN_STATUS_COMPILE_ERROR, "%s failed%s%s", what,
      m->diags.length ? ":\n" : " (no diagnostics)",
      m->diags.length ? m->diags.data : "");
  kiln_sbuf_free(&m->diags);
  return s;
}

void kiln_mlir_clear_diagnostics(kiln_mlir_t *m) { kiln_sbuf_free(&m->diags); }

kiln_status_t kiln_mlir_with_diagnostics(kiln_mlir_t *m, kiln_status_t s) {
  if (s && m->diags.length)
    s = kiln_status_annotate(s, "%s", m->diags.data);
  kiln_sbuf_free(&m->diags);
  return s;
}

kiln_status_t kiln_mlir_parse(kiln_mlir_t *m, const char *text,
                              MlirModule *out_module) {
  kiln_sbuf_free(&m->diags);
  MlirModule mod =
      mlirModuleCreateParse(m->ctx, mlirStringRefCreateFromCString(text));
  if (mlirModuleIsNull(mod)) return diag_error(m, "parsing MLIR");
  kiln_sbuf_free(&m->diags);
  *out_module = mod;
  return NULL;
}

bool kiln_mlir_constant_index(MlirValue v, int64_t *out) {
  if (!mlirValueIsAOpResult(v)) return false;
  MlirOperation def = mlirOpResultGetOwner(v);
  MlirStringRef n = mlirIdentifierStr(mlirOperationGetName(def));
  if (!mlirStringRefEqual(n, mlirStringRefCreateFromCString("arith.constant")))
    return false;
  MlirAttribute a = mlirOperationGetAttributeByName(
      def, mlirStringRefCreateFromCString("value"));
  if (mlirAttributeIsNull(a) || !mlirAttributeIsAInteger(a)) return false;
  *out = mlirIntegerAttrGetValueInt(a);
  return true;
}

MlirValue kiln_mlir_index_constant(MlirContext ctx, MlirBlock block,
                                   MlirOperation before, int64_t v) {
  MlirLocation loc = mlirLocationUnknownGet(ctx);
  MlirType index = mlirIndexTypeGet(ctx);
  MlirOperationState st =
      mlirOperationStateGet(mlirStringRefCreateFromCString("arith.constant"), loc);
  MlirNamedAttribute value = mlirNamedAttributeGet(
      mlirIdentifierGet(ctx, mlirStringRefCreateFromCString("value")),
      mlirIntegerAttrGet(index, v));
  mlirOperationStateAddAttributes(&st, 1, &value);
  mlirOperationStateAddResults(&st, 1, &index);
  MlirOperation op = mlirOperationCreate(&st);
  mlirBlockInsertOwnedOperationBefore(block, before, op);
  return mlirOperationGetResult(op, 0);
}

MlirOperation kiln_mlir_find_symbol(MlirBlock body, MlirStringRef name) {
  for (MlirOperation op = mlirBlockGetFirstOperation(body); !mlirOperationIsNull(op);
       op = mlirOperationGetNextInBlock(op)) {
    MlirAttribute s = mlirOperationGetAttributeByName(
        op, mlirStringRefCreateFromCString("sym_name"));
    if (!mlirAttributeIsNull(s) && mlirAttributeIsAString(s) &&
        mlirStringRefEqual(mlirStringAttrGetValue(s), name))
      return op;
  }
  return (MlirOperation){NULL};
}

kiln_status_t kiln_mlir_print(MlirModule module, char **out_text) {
  kiln_sbuf_t b;
  kiln_sbuf_init(&b);
  mlirOperationPrint(mlirModuleGetOperation(module), append_cb, &b);
  kiln_sbuf_puts(&b, "\n");
  char *t = kiln_sbuf_take(&b);
  if (!t) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "printing MLIR");
  *out_text = t;
  return NULL;
}

void kiln_pipeline_dump(const kiln_pipeline_options_t *opts, kiln_stage_t stage,
                        const char *text) {
  if (!opts || !opts->dump_dir || !opts->dump_dir[0]) return;
  mkdir(opts->dump_dir, 0700);  // EEXIST is fine; failures show at fopen
  char path[4096];
  snprintf(path, sizeof(path), "%s/%s-%d-%s.%s", opts->dump_dir,
           opts->dump_tag ? opts->dump_tag : "kiln", (int)stage,
           kiln_stage_name(stage), stage == KILN_STAGE_GRAPH ? "kiln" : "mlir");
  FILE *f = fopen(path, "w");
  if (!f) return;  // dumping is best effort; it never fails a compile
  fputs(text, f);
  fclose(f);
}

// Pass pipelines per stage. The order of the LLVM stage follows the verified
// recipe in DESIGN.md: memref to LLVM before control flow, vector to LLVM
// explicitly, leftovers of math (erf, tanh) to libm after math to LLVM.
// Vector to LLVM runs once more before control flow, with the AMX ops: the
// bf16 kernel's accumulator tiles are loop-carried (lowering/ops/matmul.c),
// and the branches scf-to-cf makes of those loops carry !amx.tile operands,
// which convert-to-llvm (it knows the AMX types) converts where
// convert-cf-to-llvm fails.
//
// No CSE before bufferization: CSE merges identical linalg.fill inits of
// different outputs, and eliminate-empty-tensors then anchors both in one
// output buffer, which (MLIR 22.1.8) bufferizes to copies in the wrong order
// (test/lit/pipeline/Inputs/two-reductions.kiln, ops_numeric reduce).
static const char *const kStagePipelines[KILN_STAGE_COUNT] = {
    [KILN_STAGE_FUSED] =
        "builtin.module(canonicalize,linalg-fuse-elementwise-ops,"
        "canonicalize)",
    [KILN_STAGE_BUFFERIZED] =
        "builtin.module(eliminate-empty-tensors,one-shot-bufferize,canonicalize,cse,"
        "buffer-deallocation-pipeline)",
    // LOOPS: the thread distribution is prefixed at run time (see
    // stage_pipeline): forall loops become OpenMP work-sharing loops.
    [KILN_STAGE_LOOPS] =
        "func.func(convert-linalg-to-loops),canonicalize)",
    // (kiln_pipeline_run runs convert-vector-to-scf{full-unroll=true} and
    // the streaming stores, lowering/streaming.c, before this.)
    [KILN_STAGE_LLVM] =
        "builtin.module(convert-linalg-to-loops,"
        "lower-affine,expand-strided-metadata,lower-affine,"
        "finalize-memref-to-llvm{use-generic-functions=true},"
        "convert-vector-to-llvm{enable-x86vector enable-amx reassociate-fp-reductions=true},"
        "convert-scf-to-cf,convert-math-to-funcs,"
        "convert-math-to-llvm,convert-math-to-libm,convert-vector-to-llvm{enable-x86vector reassociate-fp-reductions=true},"
        "convert-arith-to-llvm,convert-index-to-llvm,convert-ub-to-llvm,"
        "convert-func-to-llvm,convert-arith-to-llvm,convert-to-llvm,"
        "convert-openmp-to-llvm,reconcile-unrealized-casts)",
};

// The pipeline text of `stage` for these options.
static void stage_pipeline(kiln_stage_t stage, const kiln_pipeline_options_t *o,
                           char *buf, size_t n) {
  if (stage != KILN_STAGE_LOOPS) {
    snprintf(buf, n, "%s", kStagePipelines[stage]);
    return;
  }
  int threads = o ? o->threads : 1;
  // (kiln_pipeline_run has run scf-forall-to-parallel and the horizontal
  // fusion of the parallel loops.)
  if (threads > 1)
    snprintf(buf, n, "builtin.module(convert-scf-to-openmp{num-threads=%d},%s",
             threads, kStagePipelines[stage]);
  else
    snprintf(buf, n, "builtin.module(scf-forall-to-for,%s", kStagePipelines[stage]);
}

static kiln_status_t run_pipeline(kiln_mlir_t *m, MlirModule module,
                                  const char *pipeline, const char *what) {
  kiln_sbuf_free(&m->diags);
  MlirPassManager pm = mlirPassManagerCreate(m->ctx);
  kiln_sbuf_t err;
  kiln_sbuf_init(&err);
  MlirLogicalResult r = mlirParsePassPipeline(
      mlirPassManagerGetAsOpPassManager(pm),
      mlirStringRefCreateFromCString(pipeline), append_cb, &err);
  if (mlirLogicalResultIsFailure(r)) {
    mlirPassManagerDestroy(pm);
    kiln_status_t s = kiln_make_status(KILN_STATUS_INTERNAL,
                                       "pass pipeline for %s: %s", what,
                                       err.data ? err.data : "");
    kiln_sbuf_free(&err);
    return s;
  }
  kiln_sbuf_free(&err);
  r = mlirPassManagerRunOnOp(pm, mlirModuleGetOperation(module));
  mlirPassManagerDestroy(pm);
  if (mlirLogicalResultIsFailure(r)) return diag_error(m, what);
  kiln_sbuf_free(&m->diags);
  return NULL;
}

kiln_status_t kiln_pipeline_run_text(kiln_mlir_t *m, MlirModule module,
                                     const char *pipeline, const char *what) {
  return run_pipeline(m, module, pipeline, what);
}

// After the LLVM stage every op must be in the LLVM (or OpenMP) dialect; a
// leftover op
// would only surface later as an opaque JIT failure.
typedef struct {
  char name[128];
} leftover_t;

static MlirWalkResult find_leftover(MlirOperation op, void *user) {
  MlirStringRef n = mlirIdentifierStr(mlirOperationGetName(op));
  // omp.* ops stay: the LLVM IR translation lowers them (OpenMPIRBuilder).
  bool ok = (n.length > 5 && memcmp(n.data, "llvm.", 5) == 0) ||
            (n.length > 4 && memcmp(n.data, "omp.", 4) == 0) ||
            (n.length == 14 && memcmp(n.data, "builtin.module", 14) == 0);
  if (ok) return MlirWalkResultAdvance;
  leftover_t *l = user;
  snprintf(l->name, sizeof(l->name), "%.*s", (int)n.length, n.data);
  return MlirWalkResultInterrupt;
}

kiln_status_t kiln_pipeline_run(kiln_mlir_t *m, MlirModule module,
                                kiln_stage_t from, kiln_stage_t to,
                                const kiln_pipeline_options_t *opts) {
  for (int st = (int)from + 1; st <= (int)to; ++st) {
    kiln_stage_t stage = (kiln_stage_t)st;
    char what[64];
    snprintf(what, sizeof(what), "stage '%s'", kiln_stage_name(stage));
    if (stage == KILN_STAGE_VECTORIZED) {
      if (opts && opts->vectorize) {
        kiln_sbuf_free(&m->diags);
        kiln_status_t s = kiln_kernels_vectorize_cpu(m->ctx, module, opts->tiling);
        if (s) {
          kiln_status_t d = diag_error(m, what);
          s = kiln_status_annotate(s, "%s", kiln_status_message(d));
          kiln_status_free(d);
          return s;
        }
      }
    } else {
      if (stage == KILN_STAGE_LOOPS && opts && opts->vectorize && kiln_prefetch_enabled()) {
        int prefetches = 0;
        kiln_sbuf_free(&m->diags);
        kiln_status_t s = kiln_cpu_prefetch_row_blocks(m->ctx, module, &prefetches);
        if (s) return kiln_mlir_with_diagnostics(m, s);
      }
      if (stage == KILN_STAGE_LOOPS && opts && opts->threads > 1) {
        // Thread-distributed loops become scf.parallel; independent ones
        // then run as one parallel region (lowering/hfuse.c).
        KILN_RETURN_IF_ERROR_PLAIN(run_pipeline(
            m, module, "builtin.module(scf-forall-to-parallel)", what));
        const char *hfuse = getenv("KILN_HFUSE");
        if (!hfuse || strcmp(hfuse, "0") != 0) {
          int fused = 0;
          kiln_sbuf_free(&m->diags);
          kiln_status_t s = kiln_cpu_fuse_loops(m->ctx, module, opts->threads, &fused);
          if (s) {
            kiln_status_t d = diag_error(m, what);
            s = kiln_status_annotate(s, "%s", kiln_status_message(d));
            kiln_status_free(d);
            return s;
          }
        }
      }
      if (stage == KILN_STAGE_LLVM) {
        // Strided 1-D reads (a contraction tile's lhs column) as scalar
        // loads (lowering/strided_reads.c), n-D transfers to 1-D ones, then
        // stores into outputs larger than the caches made non-temporal
        // (KILN_STREAM_STORES=0: never).
        if (opts && opts->vectorize && kiln_unroll_strided_reads_enabled()) {
          int unrolled = 0;
          kiln_sbuf_free(&m->diags);
          kiln_status_t s = kiln_cpu_unroll_strided_reads(m->ctx, module, &unrolled);
          if (s) return kiln_mlir_with_diagnostics(m, s);
        }
        KILN_RETURN_IF_ERROR_PLAIN(run_pipeline(
            m, module, "builtin.module(convert-vector-to-scf{full-unroll=true})", what));
        if (kiln_streaming_stores_enabled()) {
          int streamed = 0;
          kiln_sbuf_free(&m->diags);
          kiln_status_t s = kiln_cpu_streaming_stores(m->ctx, module, &streamed);
          if (s) return kiln_mlir_with_diagnostics(m, s);
        }
      }
      char text[2048];
      stage_pipeline(stage, opts, text, sizeof(text));
      KILN_RETURN_IF_ERROR_PLAIN(
          run_pipeline(m, module, text, what));
      if (stage == KILN_STAGE_FUSED && kiln_inplace_needed(module))
        KILN_RETURN_IF_ERROR_PLAIN(kiln_inplace_prepare(m, module));
      if (stage == KILN_STAGE_FUSED)
        KILN_RETURN_IF_ERROR_PLAIN(kiln_mlir_with_diagnostics(
            m, kiln_store_through_reshapes(m->ctx, module)));
    }
    if (stage == KILN_STAGE_LLVM) {
      leftover_t l = {{0}};
      mlirOperationWalk(mlirModuleGetOperation(module), find_leftover, &l,
                        MlirWalkPreOrder);
      if (l.name[0])
        return kiln_make_status(KILN_STATUS_COMPILE_ERROR,
                                "stage 'llvm': op '%s' was not lowered to the "
                                "LLVM dialect",
                                l.name);
    }
    if (opts && opts->dump_dir) {
      char *text = NULL;
      if (!kiln_mlir_print(module, &text)) {
        kiln_pipeline_dump(opts, stage, text);
        free(text);
      }
    }
  }
  return NULL;
}
