// lib/api: the public C API. The only module that sees graphs, lowering, the
// JIT and the reference interpreter together.
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "jit/cuda.h"
#include "jit/jit.h"
#include "kernels/kernels.h"
#include "lib/autotune/autotune.h"
#include "lib/cache/cache.h"
#include "lib/guard/guard.h"
#include "lib/graph/graph.h"
#include "lib/ref/ref.h"
#include "lowering/lowering.h"

//===--- context ----------------------------------------------------------===//

// MLIR contexts a kiln context may hold: compiles run at once, each on a
// context of its own (an MLIR context is single-threaded), up to the cores.
enum { kMaxMlirContexts = 16 };

// The CPUs this process may run on: its affinity mask (what taskset, a
// container's cpuset or a job scheduler allows), else the online ones. The
// default thread count: with the online count, a process limited to 2 of a
// host's 64 cores forked 64 threads per parallel loop.
static int usable_cpus(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

struct kiln_context {
  pthread_mutex_t lock;  // guards dump_counter and the pool below
  pthread_cond_t mlir_freed;
  kiln_mlir_t *mlir_free[kMaxMlirContexts];  // idle contexts
  int mlir_free_count, mlir_made, mlir_max;
  kiln_cache_t *cache;   // NULL when off
  pthread_mutex_t stats_lock;
  kiln_stats_t stats;
  char *dump_dir;
  int dump_counter;
};

void kiln_context_options_init(kiln_context_options_t *options) {
  memset(options, 0, sizeof(*options));
}

static bool log_enabled(const char *topic) {
  const char *log = getenv("KILN_LOG");
  return log && strstr(log, topic);
}

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// A checksum of this libkiln binary: part of every cache key, so code
// compiled by one build of kiln is never loaded by another.
static uint64_t build_id;
static pthread_once_t build_id_once = PTHREAD_ONCE_INIT;
static void init_build_id(void) {
  Dl_info info;
  build_id = 0x6b696c6e;  // fallback: version only
  // A function of this file, not an exported one: a program that links
  // lib/base statically (kiln-run, the tests) interposes its own
  // kiln_version_string, and hashing that program instead of libkiln kept
  // cache entries of an older libkiln alive.
  if (!dladdr((void *)(uintptr_t)init_build_id, &info) || !info.dli_fname) return;
  FILE *f = fopen(info.dli_fname, "rb");
  if (!f) return;
  kiln_hasher_t h;
  kiln_hasher_init(&h);
  char buf[1 << 16];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), f)) > 0) kiln_hasher_update(&h, buf, n);
  fclose(f);
  build_id = kiln_hasher_final(&h).lo;
}

kiln_status_t kiln_context_create(const kiln_context_options_t *options,
                                  kiln_context_t **out_context) {
  if (!out_context)
    return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                            "kiln_context_create: out_context is NULL");
  *out_context = NULL;
  kiln_context_t *c = calloc(1, sizeof(*c));
  if (!c) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "context");
  pthread_mutex_init(&c->lock, NULL);
  pthread_cond_init(&c->mlir_freed, NULL);
  int cores = usable_cpus();
  c->mlir_max = cores > kMaxMlirContexts ? kMaxMlirContexts : cores;
  const char *dump = options && options->dump_dir ? options->dump_dir
                                                  : getenv("KILN_DUMP_DIR");
  if (dump && dump[0]) {
    c->dump_dir = strdup(dump);
    if (!c->dump_dir) {
      free(c);
      return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "context");
    }
  }
  // The first MLIR context now (its errors are the context's); more when
  // compiles overlap (acquire_mlir).
  kiln_status_t s = kiln_mlir_create(&c->mlir_free[0]);
  if (s) {
    free(c->dump_dir);
    free(c);
    return s;
  }
  c->mlir_free_count = c->mlir_made = 1;
  pthread_mutex_init(&c->stats_lock, NULL);
  const char *env_cache = getenv("KILN_CACHE");
  bool off = (options && options->disable_cache) ||
             (env_cache && (strcmp(env_cache, "0") == 0 ||
                            strcmp(env_cache, "off") == 0));
  if (!off) {
    kiln_status_t cs = kiln_cache_open(options ? options->cache_dir : NULL,
                                       options ? options->cache_max_bytes : 0,
                                       &c->cache);
    if (cs) {
      // A cache that cannot be used is not an error: kiln compiles.
      if (log_enabled("cache"))
        fprintf(stderr, "[kiln cache] off: %s\n", kiln_status_message(cs));
      kiln_status_free(cs);
    }
  }
  *out_context = c;
  return NULL;
}

void kiln_context_stats(kiln_context_t *context, kiln_stats_t *out) {
  memset(out, 0, sizeof(*out));
  if (!context) return;
  pthread_mutex_lock(&context->stats_lock);
  *out = context->stats;
  pthread_mutex_unlock(&context->stats_lock);
}

kiln_status_t kiln_context_cache_export(kiln_context_t *context,
                                        void **out_data, size_t *out_size) {
  if (!out_data || !out_size || !context)
    return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                            "kiln_context_cache_export: NULL argument");
  *out_data = NULL;
  *out_size = 0;
  if (!context->cache)
    return kiln_make_status(KILN_STATUS_UNAVAILABLE,
                            "the compile cache is off in this context");
  return kiln_cache_export(context->cache, out_data, out_size);
}

kiln_status_t kiln_context_cache_import(kiln_context_t *context,
                                        const void *data, size_t size,
                                        int *out_count) {
  if (!context || (!data && size) || !out_count)
    return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                            "kiln_context_cache_import: NULL argument");
  *out_count = 0;
  if (!context->cache)
    return kiln_make_status(KILN_STATUS_UNAVAILABLE,
                            "the compile cache is off in this context");
  return kiln_cache_import(context->cache, data, size, out_count);
}

void kiln_context_destroy(kiln_context_t *context) {
  if (!context) return;
  kiln_cache_close(context->cache);
  pthread_mutex_destroy(&context->stats_lock);
  for (int i = 0; i < context->mlir_free_count; ++i) kiln_mlir_destroy(context->mlir_free[i]);
  pthread_cond_destroy(&context->mlir_freed);
  pthread_mutex_destroy(&context->lock);
  free(context->dump_dir);
  free(context);
}

//===--- stages -----------------------------------------------------------===//

static const char *const kStageNames[KILN_STAGE_COUNT] = {
    "graph", "linalg", "fused", "vectorized", "bufferized", "loops", "llvm"};

const char *kiln_stage_name(kiln_stage_t stage) {
  return (unsigned)stage < KILN_STAGE_COUNT ? kStageNames[stage] : "?";
}

kiln_status_t kiln_stage_parse(const char *name, kiln_stage_t *out_stage) {
  for (int i = 0; name && i < KILN_STAGE_COUNT; ++i)
    if (strcmp(name, kStageNames[i]) == 0) {
      *out_stage = (kiln_stage_t)i;
      return NULL;
    }
  return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                          "unknown stage '%s'; expected one of graph, linalg, "
                          "fused, vectorized, bufferized, loops, llvm",
                          name ? name : "(null)");
}

//===--- graphs -----------------------------------------------------------===//

kiln_status_t kiln_graph_parse(kiln_context_t *context, const char *text,
                               size_t length, const char *name,
                               kiln_graph_t **out_graph) {
  if (!out_graph)
    return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                            "kiln_graph_parse: out_graph is NULL");
  *out_graph = NULL;
  if (!context)
    return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                            "kiln_graph_parse: context is NULL");
  return kiln_graph_parse_text(text, length, name, out_graph);
}

void kiln_graph_destroy(kiln_graph_t *graph) { kiln_graph_free(graph); }

kiln_status_t kiln_graph_print(const kiln_graph_t *graph, char **out_text) {
  if (!graph || !out_text)
    return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                            "kiln_graph_print: graph and out_text must not be "
                            "NULL");
  return kiln_graph_print_text(graph, out_text);
}

size_t kiln_graph_input_count(const kiln_graph_t *graph) {
  return graph ? (size_t)graph->input_count : 0;
}
size_t kiln_graph_output_count(const kiln_graph_t *graph) {
  return graph ? (size_t)graph->output_count : 0;
}

static void to_public_type(const kiln_type_t *t, kiln_tensor_type_t *out) {
  memset(out, 0, sizeof(*out));
  out->dtype = kiln_dtype_to_dl(t->dtype);
  out->rank = t->rank;
  for (int i = 0; i < t->rank; ++i)
    out->shape[i] = KILN_IS_SYM(t->dims[i]) ? KILN_DIM_SYMBOLIC : t->dims[i];
}

kiln_status_t kiln_graph_input_type(const kiln_graph_t *graph, size_t i,
                                    kiln_tensor_type_t *out_type) {
  if (!graph || !out_type || i >= (size_t)graph->input_count)
    return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                            "kiln_graph_input_type: index %zu out of range "
                            "(graph has %zu inputs)",
                            i, kiln_graph_input_count(graph));
  to_public_type(&graph->values[graph->inputs[i]].type, out_type);
  return NULL;
}

kiln_status_t kiln_graph_output_type(const kiln_graph_t *graph, size_t i,
                                     kiln_tensor_type_t *out_type) {
  if (!graph || !out_type || i >= (size_t)graph->output_count)
    return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                            "kiln_graph_output_type: index %zu out of range "
                            "(graph has %zu outputs)",
                            i, kiln_graph_output_count(graph));
  to_public_type(&graph->values[graph->outputs[i]].type, out_type);
  return NULL;
}

int kiln_graph_input_mutated(const kiln_graph_t *graph, size_t i) {
  return graph && i < (size_t)graph->input_count && graph->input_written[i];
}

const char *kiln_graph_input_dim_symbol(const kiln_graph_t *graph, size_t i,
                                        int32_t dim) {
  if (!graph || i >= (size_t)graph->input_count) return NULL;
  const kiln_type_t *t = &graph->values[graph->inputs[i]].type;
  if (dim < 0 || dim >= t->rank || !KILN_IS_SYM(t->dims[dim])) return NULL;
  return graph->symbols[KILN_SYM_ID(t->dims[dim])];
}

//===--- argument checking ------------------------------------------------===//

static const char *dl_dtype_str(DLDataType d, char *buf, size_t n) {
  kiln_dtype_t t;
  if (kiln_dtype_from_dl(d, &t)) return kiln_dtype_name(t);
  snprintf(buf, n, "dlpack(code=%u,bits=%u,lanes=%u)", d.code, d.bits, d.lanes);
  return buf;
}

static void dl_shape_str(const DLTensor *t, char *buf, size_t n) {
  size_t o = (size_t)snprintf(buf, n, "[");
  for (int i = 0; i < t->ndim && o < n; ++i)
    o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? "," : "",
                          (long long)t->shape[i]);
  if (o < n) snprintf(buf + o, n - o, "]");
}

static bool dl_is_contiguous(const DLTensor *t) {
  if (!t->strides) return true;
  int64_t expect = 1;
  for (int i = t->ndim - 1; i >= 0; --i) {
    if (t->shape[i] != 1 && t->strides[i] != expect) return false;
    expect *= t->shape[i];
  }
  return true;
}

static int64_t dl_numel(const DLTensor *t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; ++i) n *= t->shape[i];
  return n;
}

// Checks one tensor against `want` (symbolic dims bound into `binding`, -1
// when not yet bound). `what` is "input" or "output".
static kiln_status_t check_tensor(const kiln_graph_t *g, const char *what,
                                  size_t i, const DLTensor *t,
                                  const kiln_type_t *want, int64_t *binding,
                                  bool need_contiguous, int device_type) {
  char tb[160], db[64], sb[160];
  kiln_type_str(g, want, tb, sizeof(tb));
  if (!t->shape && t->ndim > 0)
    return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                            "%s %zu: shape is NULL; expected %s", what, i, tb);
  if ((int)t->device.device_type != device_type)
    return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                            "%s %zu: device type %d; expected %s",
                            what, i, (int)t->device.device_type,
                            device_type == kDLCUDA
                                ? "a CUDA tensor (kDLCUDA) for target cuda"
                                : "a CPU tensor (kDLCPU) for target cpu");
  kiln_dtype_t dt;
  if (!kiln_dtype_from_dl(t->dtype, &dt) || dt != want->dtype)
    return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                            "%s %zu: dtype %s; expected %s", what, i,
                            dl_dtype_str(t->dtype, db, sizeof(db)),
                            kiln_dtype_name(want->dtype));
  if (t->ndim != want->rank)
    return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                            "%s %zu: rank %d; expected %s (rank %d)", what, i,
                            t->ndim, tb, want->rank);
  for (int k = 0; k < t->ndim; ++k) {
    int64_t d = want->dims[k];
    int64_t have = t->shape[k];
    dl_shape_str(t, sb, sizeof(sb));
    if (have < 0)
      return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                              "%s %zu: negative size in shape %s", what, i, sb);
    if (KILN_IS_SYM(d)) {
      int64_t *b = &binding[KILN_SYM_ID(d)];
      if (*b >= 0 && *b != have)
        return kiln_make_status(
            KILN_STATUS_INVALID_ARGUMENT,
            "%s %zu: shape %s has %lld in dim %d, but symbol %s is %lld "
            "elsewhere in this call; expected %s",
            what, i, sb, (long long)have, k, g->symbols[KILN_SYM_ID(d)],
            (long long)*b, tb);
      *b = have;
    } else if (d != have) {
      return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                              "%s %zu: shape %s; expected %s", what, i, sb, tb);
    }
  }
  int64_t n = dl_numel(t);
  if (n > 0 && !t->data)
    return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                            "%s %zu: data is NULL for %s", what, i, tb);
  uintptr_t addr = (uintptr_t)t->data + (uintptr_t)t->byte_offset;
  size_t esize = kiln_dtype_size(dt);
  if (n > 0 && addr % esize)
    return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                            "%s %zu: data pointer %p + byte_offset %llu is not "
                            "aligned to its %zu-byte elements",
                            what, i, t->data,
                            (unsigned long long)t->byte_offset, esize);
  if (t->strides)
    for (int k = 0; k < t->ndim; ++k)
      if (t->strides[k] < 0)
        return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                                "%s %zu: negative stride %lld in dim %d; "
                                "expected non-negative strides",
                                what, i, (long long)t->strides[k], k);
  if (need_contiguous && !dl_is_contiguous(t))
    return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                            "%s %zu: strided %s; expected a contiguous "
                            "(row-major) tensor",
                            what, i, tb);
  return NULL;
}

// [first, last) byte range a tensor may touch.
static void dl_extent(const DLTensor *t, uintptr_t *lo, uintptr_t *hi) {
  kiln_dtype_t dt = KILN_F32;
  kiln_dtype_from_dl(t->dtype, &dt);
  uintptr_t base = (uintptr_t)t->data + (uintptr_t)t->byte_offset;
  int64_t last = 0;
  if (dl_numel(t) == 0) {
    *lo = *hi = base;
    return;
  }
  int64_t stride = 1;
  for (int i = t->ndim - 1; i >= 0; --i) {
    int64_t s = t->strides ? t->strides[i] : stride;
    last += (t->shape[i] - 1) * s;
    stride *= t->shape[i];
  }
  *lo = base;
  *hi = base + (uintptr_t)(last + 1) * kiln_dtype_size(dt);
}

// Memory a call writes must not be read or written through another tensor
// of the call: outputs and mutated inputs ("exclusive" tensors) must not
// overlap any other input or output, and a mutated input must not overlap
// itself (a zero stride over a dim of size > 1). Inputs that are only read
// may share memory. One sort and sweep over the tensors' extents, so an
// optimizer step with thousands of tensors checks in O(n log n).
typedef struct {
  uintptr_t lo, hi;
  int32_t index;    // inputs 0..nin-1, then outputs
  bool exclusive;
} extent_t;

static int extent_cmp(const void *a, const void *b) {
  const extent_t *x = a, *y = b;
  return x->lo < y->lo ? -1 : x->lo > y->lo;
}

static bool dl_self_overlaps(const DLTensor *t) {
  if (!t->strides) return false;
  for (int d = 0; d < t->ndim; ++d)
    if (t->strides[d] == 0 && t->shape[d] > 1) return true;
  return false;
}

// True when no exclusive tensor overlaps another tensor. `scratch` holds
// nin + nout entries.
static bool aliasing_ok(const kiln_graph_t *g, const DLTensor *inputs,
                        size_t nin, const DLTensor *outputs, size_t nout,
                        extent_t *scratch) {
  size_t n = 0;
  for (size_t i = 0; i < nin + nout; ++i) {
    const DLTensor *t = i < nin ? &inputs[i] : &outputs[i - nin];
    bool ex = i >= nin || g->input_written[i];
    if (ex && i < nin && dl_self_overlaps(t)) return false;
    extent_t *e = &scratch[n];
    dl_extent(t, &e->lo, &e->hi);
    if (e->lo == e->hi) continue;  // empty: touches nothing
    e->index = (int32_t)i;
    e->exclusive = ex;
    n++;
  }
  qsort(scratch, n, sizeof(*scratch), extent_cmp);
  uintptr_t hi_any = 0, hi_exclusive = 0;
  for (size_t i = 0; i < n; ++i) {
    const extent_t *e = &scratch[i];
    if (e->lo < hi_exclusive || (e->exclusive && e->lo < hi_any)) return false;
    if (e->hi > hi_any) hi_any = e->hi;
    if (e->exclusive && e->hi > hi_exclusive) hi_exclusive = e->hi;
  }
  return true;
}

// The message for a call aliasing_ok rejected: the first pair that
// overlaps (quadratic; error path only).
static kiln_status_t aliasing_error(const kiln_graph_t *g,
                                    const DLTensor *inputs, size_t nin,
                                    const DLTensor *outputs, size_t nout) {
  for (size_t i = 0; i < nin + nout; ++i) {
    const DLTensor *a = i < nin ? &inputs[i] : &outputs[i - nin];
    bool ex = i >= nin || g->input_written[i];
    const char *what = i < nin ? "input" : "output";
    size_t ai = i < nin ? i : i - nin;
    if (ex && i < nin && dl_self_overlaps(a))
      return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                              "graph @%s: input %zu is written by the graph "
                              "but has a zero stride (elements share memory); "
                              "expected distinct elements",
                              g->name, ai);
    if (!ex) continue;
    uintptr_t alo, ahi;
    dl_extent(a, &alo, &ahi);
    for (size_t k = 0; k < nin + nout; ++k) {
      if (k == i) continue;
      const DLTensor *b = k < nin ? &inputs[k] : &outputs[k - nin];
      uintptr_t blo, bhi;
      dl_extent(b, &blo, &bhi);
      if (alo < bhi && blo < ahi && alo < ahi && blo < bhi)
        return kiln_make_status(
            KILN_STATUS_INVALID_ARGUMENT,
            "graph @%s: %s %zu%s overlaps %s %zu; expected distinct buffers",
            g->name, what, ai, i < nin ? " (written by the graph)" : "",
            k < nin ? "input" : "output", k < nin ? k : k - nin);
    }
  }
  return kiln_make_status(KILN_STATUS_INTERNAL, "graph @%s: overlapping "
                          "tensors not found again", g->name);
}

// aliasing_ok with its scratch on the stack for small calls; NULL, the
// overlap found, or OUT_OF_MEMORY for the scratch of a large call.
static kiln_status_t check_aliasing(const kiln_graph_t *g,
                                    const DLTensor *inputs, size_t nin,
                                    const DLTensor *outputs, size_t nout) {
  extent_t stack[64];
  extent_t *scratch = stack;
  if (nin + nout > 64 && !(scratch = malloc(sizeof(*scratch) * (nin + nout))))
    return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY,
                            "graph @%s: overlap check of %zu tensors", g->name,
                            nin + nout);
  bool ok = aliasing_ok(g, inputs, nin, outputs, nout, scratch);
  if (scratch != stack) free(scratch);
  return ok ? NULL : aliasing_error(g, inputs, nin, outputs, nout);
}

//===--- functions and variants -------------------------------------------===//

// A variant's layout key: bit i says input i is strided, for i < 63; bit 63
// says some input from 63 on is, and then all of those are compiled as
// strided (a strided memref takes contiguous tensors too).
static inline int mask_bit(int input) { return input < 63 ? input : 63; }

// One compiled specialization: sizes (exact or symbolic) and input layouts.
// A CUDA graph recorded for one set of call addresses (options.cuda_graphs):
// `bufs` holds the inputs' and outputs' device pointers it was recorded
// with (its key), then its own temporaries.
#define KILN_GRAPH_SLOTS 4
typedef struct kiln_graph_slot {
  void **bufs;
  kiln_cuda_graph_t *graph;
  uint64_t last_use;
} kiln_graph_slot_t;

typedef struct kiln_variant {
  struct kiln_variant *next;
  int64_t *binding;  // symbol values; -1 = symbolic in this variant
  int symbolic;      // how many symbols stay symbolic
  uint64_t strided_mask;
  kiln_graph_t *graph;  // specialized graph (static)
  kiln_jit_t *jit;
  void *entry;
  kiln_ffi_sig_t *sig;
  // Target cuda: the launch program, its module and one function per launch.
  kiln_gpu_program_t gpu;
  kiln_cuda_module_t **cuda_modules;  // one per PTX module
  void **cuda_fns;
  void **cuda_consts;  // the program's constants on the device
  int cuda_device;
  // cuda_graphs: recorded CUDA graphs by call addresses (graph_lock).
  pthread_mutex_t graph_lock;
  kiln_graph_slot_t graph_slots[KILN_GRAPH_SLOTS];
  uint64_t graph_clock;
  bool graph_lock_ready;
} kiln_variant_t;

struct kiln_function {
  int refcount;  // atomic
  bool cuda;        // target "cuda": device tensors, kernels on a stream
  int cuda_device;  // the device of the first call's tensors
  kiln_context_t *context;
  kiln_graph_t *graph;  // owned copy of the graph as compiled
  kiln_compile_options_t options;
  char target[16];
  pthread_mutex_t lock;  // guards `variants`, `first_seen`, `dynamic`
  kiln_variant_t *variants;
  int variant_count;
  int64_t *first_seen;  // per symbol: the first value called with (-1: none)
  bool *dynamic;        // per symbol: seen with a second value
  kiln_guard_table_t *guards;  // call signature -> kiln_guard_entry_t
  struct kiln_guard_entry *entries;  // every entry, freed with the function
};

// What a guard hit needs: the variant and the call's resolved output types.
typedef struct kiln_guard_entry {
  struct kiln_guard_entry *next;
  kiln_variant_t *variant;
  kiln_type_t outputs[];  // graph output types with this call's sizes
} kiln_guard_entry_t;

void kiln_compile_options_init(kiln_compile_options_t *options) {
  memset(options, 0, sizeof(*options));
  options->target = "cpu";
  options->opt_level = 3;
  options->vectorize = 1;
  options->dynamic = KILN_DYNAMIC_AUTO;
  options->max_variants = 8;
  options->num_threads = 0;
}

// Resolves num_threads: 0 means KILN_NUM_THREADS or every online core; no
// OpenMP runtime means one.
static int resolve_threads(int requested) {
  int n = requested;
  if (n <= 0) {
    const char *env = getenv("KILN_NUM_THREADS");
    n = env && atoi(env) > 0 ? atoi(env) : usable_cpus();
  }
  if (n < 1) n = 1;
  if (n > 1 && !kiln_jit_openmp_available()) n = 1;
  return n;
}

static kiln_status_t check_target(const kiln_compile_options_t *o) {
  const char *t = o->target ? o->target : "cpu";
  if (strcmp(t, "cpu") == 0) return NULL;
  if (strcmp(t, "cuda") == 0) {
    kiln_status_t s = kiln_cuda_available();
    return s ? kiln_status_annotate(s, "target 'cuda'") : NULL;
  }
  return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                          "unknown target '%s'; expected 'cpu' or 'cuda'", t);
}

// A CUDA variant's modules, functions and constants, released (its
// context current).
static void cuda_program_unload(kiln_variant_t *v) {
  free(v->cuda_fns);
  v->cuda_fns = NULL;
  for (int i = 0; v->cuda_modules && i < v->gpu.module_count; ++i)
    kiln_cuda_module_unload(v->cuda_modules[i]);
  free(v->cuda_modules);
  v->cuda_modules = NULL;
  for (int i = 0; v->cuda_consts && i < v->gpu.const_count; ++i)
    kiln_cuda_free_static(v->cuda_consts[i]);
  free(v->cuda_consts);
  v->cuda_consts = NULL;
}

static void variant_free(kiln_variant_t *v) {
  if (!v) return;
  // Modules unload from their context, which must be current.
  kiln_status_t us = v->cuda_modules || v->graph_lock_ready
                         ? kiln_cuda_use_device(v->cuda_device)
                         : NULL;
  kiln_status_free(us);
  for (int i = 0; v->graph_lock_ready && i < KILN_GRAPH_SLOTS; ++i) {
    kiln_graph_slot_t *slot = &v->graph_slots[i];
    kiln_cuda_graph_destroy(slot->graph);  // after its last launch is done
    for (int t = 0; slot->bufs && t < v->gpu.temp_count; ++t)
      kiln_cuda_free_static(slot->bufs[v->gpu.arg_count + t]);
    free(slot->bufs);
  }
  if (v->graph_lock_ready) pthread_mutex_destroy(&v->graph_lock);
  cuda_program_unload(v);
  kiln_gpu_program_free(&v->gpu);
  kiln_ffi_sig_destroy(v->sig);
  kiln_jit_destroy(v->jit);
  kiln_graph_free(v->graph);
  free(v->binding);
  free(v);
}

static void add_stats(kiln_context_t *c, const kiln_stats_t *d) {
  pthread_mutex_lock(&c->stats_lock);
  c->stats.compiles += d->compiles;
  c->stats.cache_hits += d->cache_hits;
  c->stats.cache_misses += d->cache_misses;
  c->stats.cache_rejected += d->cache_rejected;
  c->stats.lower_seconds += d->lower_seconds;
  c->stats.mlir_seconds += d->mlir_seconds;
  c->stats.llvm_seconds += d->llvm_seconds;
  c->stats.cache_seconds += d->cache_seconds;
  c->stats.tune_measured += d->tune_measured;
  c->stats.tune_db_hits += d->tune_db_hits;
  c->stats.tune_seconds += d->tune_seconds;
  pthread_mutex_unlock(&c->stats_lock);
}

// The f32 matmul and convolution microkernels (lowering/ops/matmul.c) on
// hosts with AVX-512F; KILN_F32_DOT=0 keeps the tiled linalg.matmul and
// the schedule's convolution contraction (comparisons).
static bool f32_dot_enabled(void) {
  const char *id = kiln_jit_host_id(), *f = strstr(id, "+avx512f");
  while (f && f[8] != ',' && f[8] != '/' && f[8] != '\0') f = strstr(f + 8, "+avx512f");
  const char *env = getenv("KILN_F32_DOT");
  return f && !(env && strcmp(env, "0") == 0);
}

// The fused attention kernel (lowering/ops/attention.c) with the f32
// microkernels; KILN_ATTENTION=0 lowers its chains op by op (comparisons).
static bool fused_attention_enabled(void) {
  const char *env = getenv("KILN_ATTENTION");
  return f32_dot_enabled() && !(env && strcmp(env, "0") == 0);
}

// The cache key of a variant: everything that decides its code. The graph
// is the specialized one (symbolic sizes kept as symbols), printed in its
// canonical form (lib/graph/print.c): its name and its values' names are
// labels, not code, so equal subgraphs (N identical layers, whatever their
// values are called) share one entry.
static kiln_status_t variant_key(const kiln_function_t *f, const kiln_graph_t *g,
                                 uint64_t strided_mask, kiln_hash128_t *out_key) {
  char *text = NULL;
  KILN_RETURN_IF_ERROR_PLAIN(kiln_graph_print_canonical(g, &text));
  pthread_once(&build_id_once, init_build_id);
  kiln_hasher_t h;
  kiln_hasher_init(&h);
  kiln_hasher_update_str(&h, "kiln-variant-v1");
  kiln_hasher_update_str(&h, kiln_version_string());
  kiln_hasher_update(&h, &build_id, sizeof(build_id));
  kiln_hasher_update_str(&h, kiln_jit_host_id());
  kiln_hasher_update_str(&h, f->target);
  // KILN_HFUSE=0 (horizontal fusion off, lowering/hfuse.c),
  // KILN_STREAM_STORES=0 (lowering/streaming.c), KILN_PREFETCH=0
  // (lowering/prefetch.c), KILN_STRIDED_READS=0 (lowering/strided_reads.c),
  // KILN_F32_DOT=0 and KILN_ATTENTION=0 change the code.
  const char *hfuse = getenv("KILN_HFUSE");
  int32_t opts[10] = {f->options.opt_level, f->options.vectorize,
                      f->options.num_threads, (int32_t)f->options.autotune,
                      hfuse && strcmp(hfuse, "0") == 0,
                      !kiln_streaming_stores_enabled(), !kiln_prefetch_enabled(),
                      f32_dot_enabled(), !kiln_unroll_strided_reads_enabled(),
                      fused_attention_enabled()};
  kiln_hasher_update(&h, opts, sizeof(opts));
  kiln_hasher_update(&h, &strided_mask, sizeof(strided_mask));
  kiln_hasher_update_str(&h, text);
  free(text);
  *out_key = kiln_hasher_final(&h);
  return NULL;
}

// An MLIR context for one compile: an idle one, else a new one while there
// are fewer than the cores, else the next one freed. Compiles of different
// graphs from several threads (the Python layer compiles a model's
// partitions at once) then run in parallel; each context is kept for later
// compiles. `*dump_tag` gets the dump counter's next value (KILN_DUMP_DIR).
static kiln_status_t acquire_mlir(kiln_context_t *c, kiln_mlir_t **out, int *dump_tag) {
  pthread_mutex_lock(&c->lock);
  while (c->mlir_free_count == 0 && c->mlir_made >= c->mlir_max)
    pthread_cond_wait(&c->mlir_freed, &c->lock);
  if (dump_tag) *dump_tag = c->dump_counter++;
  if (c->mlir_free_count) {
    *out = c->mlir_free[--c->mlir_free_count];
    pthread_mutex_unlock(&c->lock);
    return NULL;
  }
  c->mlir_made++;
  pthread_mutex_unlock(&c->lock);
  kiln_status_t s = kiln_mlir_create(out);
  if (s) {
    pthread_mutex_lock(&c->lock);
    c->mlir_made--;
    pthread_cond_signal(&c->mlir_freed);
    pthread_mutex_unlock(&c->lock);
  }
  return s;
}

static void release_mlir(kiln_context_t *c, kiln_mlir_t *m) {
  pthread_mutex_lock(&c->lock);
  c->mlir_free[c->mlir_free_count++] = m;
  pthread_cond_signal(&c->mlir_freed);
  pthread_mutex_unlock(&c->lock);
}

// MLIR and LLVM on a miss: the variant's object code (caller frees).
static kiln_status_t compile_object(kiln_function_t *f, kiln_variant_t *v,
                                    const kiln_kernel_tiling_t *tiling,
                                    kiln_stats_t *st, void **obj,
                                    size_t *size) {
  kiln_graph_t *g = f->graph;
  kiln_context_t *c = f->context;
  bool *strided = calloc((size_t)g->input_count + 1, sizeof(bool));
  if (!strided) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "lowering");
  for (int i = 0; i < g->input_count; ++i)
    strided[i] = (v->strided_mask >> mask_bit(i)) & 1;
  char *linalg = NULL;
  double t0 = now_seconds();
  kiln_lower_options_t lopts = {strstr(kiln_jit_host_id(), "+avx512bf16") != NULL,
                                false, true, true, true, true, true};
  lopts.x86_amx = lopts.x86_bf16_dot && kiln_jit_amx_available();
  lopts.x86_f32_dot = f32_dot_enabled();
  lopts.fused_attention = fused_attention_enabled();
  lopts.tiling = tiling;
  kiln_status_t s = kiln_lower_to_linalg(v->graph, strided, &lopts, &linalg);
  free(strided);
  st->lower_seconds += now_seconds() - t0;
  kiln_mlir_t *mlir = NULL;
  int dump_id = 0;
  if (!s) s = acquire_mlir(c, &mlir, &dump_id);
  double t1 = now_seconds();  // (not counting a wait for an MLIR context)
  kiln_pipeline_options_t popts = {f->options.vectorize, f->options.num_threads,
                                   c->dump_dir, NULL, tiling};
  char tag[256];
  snprintf(tag, sizeof(tag), "%s-%d", g->name ? g->name : "graph", dump_id);
  popts.dump_tag = tag;
  MlirModule mod = {NULL};
  if (!s && c->dump_dir) {
    char *gt = NULL;
    if (!kiln_graph_print_text(v->graph, &gt)) {
      kiln_pipeline_dump(&popts, KILN_STAGE_GRAPH, gt);
      free(gt);
    }
    kiln_pipeline_dump(&popts, KILN_STAGE_LINALG, linalg);
  }
  if (!s) s = kiln_mlir_parse(mlir, linalg, &mod);
  if (!s)
    s = kiln_pipeline_run(mlir, mod, KILN_STAGE_LINALG, KILN_STAGE_LLVM,
                          &popts);
  double t2 = now_seconds();
  st->mlir_seconds += t2 - t1;
  if (!s) s = kiln_jit_compile_object(mod, f->options.opt_level, obj, size);
  if (!mlirModuleIsNull(mod)) mlirModuleDestroy(mod);
  if (mlir) release_mlir(c, mlir);
  free(linalg);
  st->llvm_seconds += now_seconds() - t2;
  return s;
}

// Links object code into the variant.
static kiln_status_t link_object(kiln_variant_t *v, const void *obj,
                                 size_t size) {
  KILN_RETURN_IF_ERROR_PLAIN(kiln_jit_load_object(obj, size, &v->jit));
  v->entry = kiln_jit_lookup(v->jit, KILN_ENTRY_NAME);
  if (!v->entry)
    return kiln_make_status(KILN_STATUS_COMPILE_ERROR,
                            "LLVM ORC: entry point '%s' not found or not "
                            "linkable", KILN_ENTRY_NAME);
  return NULL;
}

//===--- tile sizes and the measured search --------------------------------===//

// Kernels with less work than this keep the heuristic's tiles under
// max-autotune: their time is launch and loop overhead, not tiling.
#define KILN_TUNE_MIN_WORK (1 << 18)

// The host as lib/autotune sees it.
static void cpu_target(int threads, kiln_cpu_target_t *t) {
  const char *id = kiln_jit_host_id();
  bool avx512 = strstr(id, "+avx512f") != NULL;
  bool avx2 = strstr(id, "+avx2") != NULL;
  t->vector_bytes = avx512 ? 64 : avx2 ? 32 : 16;
  t->vector_registers = avx512 || strstr(id, "aarch64") ? 32 : 16;
  t->threads = threads > 0 ? threads : 1;
  long l1 = sysconf(_SC_LEVEL1_DCACHE_SIZE), l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
  t->l1_bytes = l1 > 0 ? l1 : 32 << 10;
  t->l2_bytes = l2 > 0 ? l2 : 1 << 20;
}

// What kernels/ asks while a variant is compiled under max-autotune.
typedef struct tune_state {
  kiln_cpu_target_t target;
  kiln_cache_t *db;  // the tuning database (NULL: off)
  const char *db_id;  // the machine in its keys: the CPU, or the GPU
  bool record;       // first compile: collect the kernels
  kiln_kernel_desc_t *descs;
  kiln_tile_config_t *configs;
  bool *known;       // tiles came from the database
  int count, capacity;
  bool oom;
  int db_hits;
  const kiln_tile_config_t *replay;  // a candidate set, in kernel order
  int next;
  int mismatches;
} tune_state_t;

static bool same_hash(kiln_hash128_t a, kiln_hash128_t b) {
  return a.hi == b.hi && a.lo == b.lo;
}

static void choose_tiles(void *user, const kiln_kernel_desc_t *d,
                         kiln_tile_config_t *out) {
  tune_state_t *ts = user;
  int i = ts->next++;
  if (ts->replay) {
    // The module is the same on every compile, so the kernels come in the
    // same order; anything else is a bug, reported by the measurement.
    if (i < ts->count && same_hash(ts->descs[i].hash, d->hash)) {
      *out = ts->replay[i];
      return;
    }
    ts->mismatches++;
    kiln_autotune_heuristic(d, &ts->target, out);
    return;
  }
  bool known = ts->db && kiln_autotune_db_get(ts->db, ts->db_id, d,
                                              &ts->target, out, NULL);
  if (known)
    ts->db_hits++;
  else
    kiln_autotune_heuristic(d, &ts->target, out);
  if (ts->record && log_enabled("autotune")) {
    char what[160];
    kiln_autotune_desc_format(d, what, sizeof(what));
    fprintf(stderr, "[kiln autotune] kernel %s (%016llx%016llx): %s\n", what,
            (unsigned long long)d->hash.hi, (unsigned long long)d->hash.lo,
            known ? "tiles from the tuning database" : "heuristic tiles");
  }
  if (!ts->record || ts->oom) return;
  if (ts->count == ts->capacity) {
    int cap = ts->capacity ? ts->capacity * 2 : 16;
    kiln_kernel_desc_t *nd = realloc(ts->descs, sizeof(*nd) * (size_t)cap);
    if (nd) ts->descs = nd;
    kiln_tile_config_t *nc = realloc(ts->configs, sizeof(*nc) * (size_t)cap);
    if (nc) ts->configs = nc;
    bool *nk = realloc(ts->known, sizeof(*nk) * (size_t)cap);
    if (nk) ts->known = nk;
    if (!nd || !nc || !nk) {
      ts->oom = true;
      return;
    }
    ts->capacity = cap;
  }
  ts->descs[ts->count] = *d;
  ts->configs[ts->count] = *out;
  ts->known[ts->count] = known;
  ts->count++;
}

// A compile whose kernels take `configs` (one per kernel, in the order the
// first compile recorded them: choose_tiles); replay_end closes it, and a
// compile whose kernels came otherwise (`what` names it) is an error.
static kiln_kernel_tiling_t replay_begin(tune_state_t *ts, const kiln_tile_config_t *configs) {
  ts->replay = configs;
  ts->next = 0;
  ts->mismatches = 0;
  return (kiln_kernel_tiling_t){ts->target, choose_tiles, ts};
}

static kiln_status_t replay_end(tune_state_t *ts, kiln_status_t s, const char *what) {
  ts->replay = NULL;
  if (!s && ts->mismatches)
    s = kiln_make_status(KILN_STATUS_INTERNAL, "autotune: the kernels of %s differ "
                         "from the first compile's", what);
  return s;
}

// Whether output `index` of a max-autotune candidate (`got`, `t` typed)
// matches the first measurement's (`want`): tiles change how blocks are
// shaped and ordered, at most the order of a reduction's additions, so
// floats agree to rounding (within `tol` of the output's largest magnitude,
// or of 1 where that is smaller; 1e-2 for bf16 and f16) and everything
// else exactly. A wrong tile (rows stored in the wrong place, a block read
// twice) misses by the size of the values themselves.
static kiln_status_t compare_output(int index, const kiln_type_t *t, const void *got,
                                    const void *want, double tol) {
  size_t n = (size_t)kiln_type_numel(t), es = kiln_dtype_size(t->dtype);
  if (!kiln_dtype_is_float(t->dtype)) {
    if (memcmp(got, want, n * es) == 0) return NULL;
    return kiln_make_status(KILN_STATUS_INTERNAL, "autotune: output %d of a candidate "
                            "differs from the first measurement's", index);
  }
  if (t->dtype == KILN_BF16 || t->dtype == KILN_F16) tol = 1e-2;
  double worst = 0, scale = 0;
  for (size_t j = 0; j < n; ++j) {
    double a = kiln_ref_load(t->dtype, got, (int64_t)j),
           b = kiln_ref_load(t->dtype, want, (int64_t)j);
    if (isnan(a) || isnan(b) || isinf(a) || isinf(b)) {
      if (!(a == b || (isnan(a) && isnan(b)))) worst = INFINITY;
      continue;
    }
    if (fabs(a - b) > worst) worst = fabs(a - b);
    if (fabs(b) > scale) scale = fabs(b);
  }
  if (worst <= tol * (scale > 1 ? scale : 1)) return NULL;
  return kiln_make_status(KILN_STATUS_INTERNAL, "autotune: output %d of a candidate differs "
                          "from the first measurement's (max abs difference %g)", index,
                          worst);
}

// One measurement: the variant compiled with a candidate set of tiles, run
// on random inputs of its real shapes.
#define KILN_TUNE_MAX_TENSORS 512
typedef struct tune_run {
  kiln_function_t *f;
  kiln_variant_t *v;
  tune_state_t *ts;
  kiln_ffi_sig_t *sig;
  kiln_memref_t refs[KILN_TUNE_MAX_TENSORS];
  int32_t nrefs;
  double compile_seconds;
  // The first measurement's outputs (the starting tiles'), which every
  // candidate's must match (check_outputs), unless the graph writes its
  // inputs (`verify` false: each run then starts from other values).
  void *want[KILN_TUNE_MAX_TENSORS];
  bool have_want, verify;
  bool progress;  // candidates skipped are reported on stderr
} tune_run_t;

// Every byte of the outputs 0xff (NaN floats, -1 integers).
static void poison_outputs(tune_run_t *r) {
  const kiln_graph_t *g = r->v->graph;
  for (int k = 0; k < g->output_count; ++k) {
    const kiln_type_t *t = &g->values[g->outputs[k]].type;
    memset(r->refs[g->input_count + k].aligned, 0xff,
           (size_t)kiln_type_numel(t) * kiln_dtype_size(t->dtype));
  }
}

// Whether the outputs now in r->refs match the first measurement's (the
// starting tiles', which this keeps): compare_output, with 1e-4 for f32
// and f64 (a K block of another size adds in another order).
static kiln_status_t check_outputs(tune_run_t *r) {
  const kiln_graph_t *g = r->v->graph;
  for (int k = 0; k < g->output_count; ++k) {
    const kiln_type_t *t = &g->values[g->outputs[k]].type;
    const kiln_memref_t *m = &r->refs[g->input_count + k];
    size_t bytes = (size_t)kiln_type_numel(t) * kiln_dtype_size(t->dtype);
    if (!r->have_want) {
      r->want[k] = malloc(bytes ? bytes : 1);
      if (!r->want[k])
        return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "autotune: a copy of output "
                                "%d (%zu bytes)", k, bytes);
      memcpy(r->want[k], m->aligned, bytes);
      continue;
    }
    KILN_RETURN_IF_ERROR_PLAIN(compare_output(k, t, m->aligned, r->want[k], 1e-4));
  }
  r->have_want = true;
  return NULL;
}

static kiln_status_t measure_tiles(void *user, const kiln_tile_config_t *configs,
                                   double *out_seconds) {
  tune_run_t *r = user;
  kiln_kernel_tiling_t tiling = replay_begin(r->ts, configs);
  kiln_stats_t scratch;
  memset(&scratch, 0, sizeof(scratch));
  void *obj = NULL;
  size_t size = 0;
  double t0 = now_seconds();
  kiln_status_t s = compile_object(r->f, r->v, &tiling, &scratch, &obj, &size);
  s = replay_end(r->ts, s, "a recompile");
  kiln_jit_t *jit = NULL;
  if (!s) s = kiln_jit_load_object(obj, size, &jit);
  free(obj);
  r->compile_seconds += now_seconds() - t0;
  void *entry = s ? NULL : kiln_jit_lookup(jit, KILN_ENTRY_NAME);
  if (!s && !entry)
    s = kiln_make_status(KILN_STATUS_COMPILE_ERROR, "autotune: no entry point");
  // One warm-up run, whose outputs must match the starting tiles'
  // (check_outputs: a candidate that computes something else is no
  // result), then the fastest of at least 3 runs and 20 ms (at most 100
  // runs or 1 s): the minimum is what a quiet machine would show. The
  // outputs are poisoned (all bytes 0xff: NaN floats) first, so a
  // candidate that leaves part of them unwritten cannot pass on the
  // previous one's values.
  if (!s && r->verify) poison_outputs(r);
  double best = 1e30, total = 0;
  for (int run = 0; !s && run <= 100; ++run) {
    double a = now_seconds();
    s = kiln_ffi_call(r->sig, entry, r->refs, r->nrefs);
    double t = now_seconds() - a;
    if (run == 0) {
      if (!s && r->verify) s = check_outputs(r);
      if (s && r->progress)
        fprintf(stderr, "[kiln autotune] candidate skipped: %s\n", kiln_status_message(s));
      continue;
    }
    total += t;
    if (t < best) best = t;
    if ((run >= 3 && total >= 0.02) || total >= 1.0) break;
  }
  kiln_jit_destroy(jit);
  if (!s) *out_seconds = best;
  return s;
}

// Random contents for a timing input: floats in [-1, 1), integers 0 (a
// valid index for every gather).
static void fill_random(void *data, const kiln_type_t *t, uint64_t *seed) {
  int64_t n = kiln_type_numel(t);
  for (int64_t i = 0; i < n; ++i) {
    *seed = *seed * 6364136223846793005ull + 1442695040888963407ull;
    float x = (float)((*seed >> 40) & 0xffffff) / (float)(1 << 23) - 1.0f;
    uint32_t bits;
    memcpy(&bits, &x, 4);
    switch (t->dtype) {
    case KILN_F32: ((float *)data)[i] = x; break;
    case KILN_F64: ((double *)data)[i] = x; break;
    case KILN_BF16: ((uint16_t *)data)[i] = (uint16_t)(bits >> 16); break;
    case KILN_F16:  // sign, exponent of 0.25..1, random mantissa
      ((uint16_t *)data)[i] = (uint16_t)(((bits >> 16) & 0x8000) |
                                         ((13u + (bits & 1)) << 10) |
                                         ((bits >> 3) & 0x3ff));
      break;
    default: memset((char *)data + (size_t)i * kiln_dtype_size(t->dtype), 0,
                    kiln_dtype_size(t->dtype));
    }
  }
}

// Compiles variant `v` under max-autotune: kernels take their tiles from
// the tuning database where it has them; the rest are searched (measured on
// random inputs of the variant's shapes) within the budget, stored in the
// database, and the variant is compiled with the best tiles found.
static kiln_status_t tune_variant(kiln_function_t *f, kiln_variant_t *v,
                                  kiln_stats_t *st, void **obj, size_t *size) {
  kiln_context_t *c = f->context;
  const kiln_graph_t *g = v->graph;
  tune_state_t ts;
  memset(&ts, 0, sizeof(ts));
  cpu_target(f->options.num_threads, &ts.target);
  ts.db = c->cache;
  ts.db_id = kiln_jit_host_id();
  ts.record = true;
  kiln_kernel_tiling_t tiling = {ts.target, choose_tiles, &ts};
  kiln_status_t s = compile_object(f, v, &tiling, st, obj, size);
  ts.record = false;
  st->tune_db_hits += (uint64_t)ts.db_hits;
  if (!s && ts.oom) s = kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "autotune");
  // A variant with symbolic sizes has no real shapes to measure on; its
  // kernels (static ones included) keep the database's or heuristic tiles.
  // Measuring runs the whole variant on random tensors of its own; graphs
  // with more tensors than a run holds keep the heuristic tiles.
  int todo = 0;
  bool measurable = g->input_count + g->output_count <= KILN_TUNE_MAX_TENSORS;
  for (int i = 0; !s && measurable && !v->symbolic && i < ts.count; ++i)
    todo += !ts.known[i] && kiln_kernel_work(&ts.descs[i]) >= KILN_TUNE_MIN_WORK;
  tune_run_t run;
  memset(&run, 0, sizeof(run));
  run.f = f;
  run.v = v;
  run.ts = &ts;
  run.verify = g->mutation_count == 0;
  run.progress = log_enabled("autotune") || isatty(2);
  void *buffers[KILN_TUNE_MAX_TENSORS] = {NULL};
  int nbuf = 0;
  kiln_tile_config_t *best = NULL;
  bool *done = NULL;
  double t0 = now_seconds();
  if (!s && todo) {
    int32_t ranks[KILN_TUNE_MAX_TENSORS];
    uint64_t seed = 0x6b696c6e74756e65ull;
    for (int i = 0; i < g->input_count + g->output_count; ++i) {
      int id = i < g->input_count ? g->inputs[i] : g->outputs[i - g->input_count];
      const kiln_type_t *t = &g->values[id].type;
      ranks[i] = t->rank;
      size_t bytes = (size_t)kiln_type_numel(t) * kiln_dtype_size(t->dtype);
      buffers[nbuf] = aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
      if (!buffers[nbuf]) {
        s = kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "autotune inputs");
        break;
      }
      if (i < g->input_count) fill_random(buffers[nbuf], t, &seed);
      kiln_memref_t *m = &run.refs[run.nrefs++];
      memset(m, 0, sizeof(*m));
      m->allocated = m->aligned = buffers[nbuf++];
      m->rank = t->rank;
      int64_t stride = 1;
      for (int d = t->rank - 1; d >= 0; --d) {
        m->sizes[d] = t->dims[d];
        m->strides[d] = stride;
        stride *= t->dims[d];
      }
    }
    if (!s) s = kiln_ffi_sig_create(ranks, run.nrefs, &run.sig);
    best = s ? NULL : malloc(sizeof(*best) * (size_t)ts.count);
    done = s ? NULL : calloc((size_t)ts.count, sizeof(bool));
    if (!s && (!best || !done))
      s = kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "autotune");
  }
  if (!s && todo) {
    memcpy(best, ts.configs, sizeof(*best) * (size_t)ts.count);
    kiln_autotune_search_options_t so = {
        f->options.autotune_budget_seconds > 0 ? f->options.autotune_budget_seconds
                                               : 20.0,
        KILN_TUNE_MIN_WORK, g->name ? g->name : "graph",
        log_enabled("autotune") || isatty(2), ts.known, done};
    kiln_autotune_search_result_t res;
    s = kiln_autotune_search(ts.descs, ts.count, &ts.target, &so, measure_tiles,
                             &run, best, &res);
    st->tune_measured += (uint64_t)res.measured;
    for (int i = 0; !s && i < ts.count; ++i) {
      if (!done[i]) continue;
      kiln_status_t ds = kiln_autotune_db_put(c->cache, ts.db_id, &ts.descs[i], &ts.target,
                                              &best[i], res.best_seconds);
      if (ds && log_enabled("autotune"))
        fprintf(stderr, "[kiln autotune] not stored: %s\n", kiln_status_message(ds));
      kiln_status_free(ds);
    }
    if (!s && so.progress)
      fprintf(stderr, "[kiln autotune] @%s: %d kernels searched, %d "
              "configurations measured in %.1f s: %.3f ms -> %.3f ms\n",
              so.label, res.tuned, res.measured, now_seconds() - t0,
              res.baseline_seconds * 1e3, res.best_seconds * 1e3);
    // The final object, with the best tiles (unless those are the first's).
    if (!s && memcmp(best, ts.configs, sizeof(*best) * (size_t)ts.count)) {
      free(*obj);
      *obj = NULL;
      kiln_kernel_tiling_t final = replay_begin(&ts, best);
      s = compile_object(f, v, &final, st, obj, size);
      s = replay_end(&ts, s, "the final compile");
    }
    // Candidate compiles are measurements, not variants: their time shows
    // in tune_seconds only.
    st->tune_seconds += now_seconds() - t0;
  }
  if (s) {
    free(*obj);
    *obj = NULL;
  }
  kiln_ffi_sig_destroy(run.sig);
  for (int i = 0; i < nbuf; ++i) free(buffers[i]);
  for (int i = 0; i < KILN_TUNE_MAX_TENSORS; ++i) free(run.want[i]);
  free(best);
  free(done);
  free(ts.descs);
  free(ts.configs);
  free(ts.known);
  return s;
}

// The GPU pipeline on `linalg` (the graph lowered for CUDA) into `out`:
// with kernels/' GPU schedules first; a graph they cannot take is compiled
// again with the plain parallel-loop mapping. `tiling` answers for the
// tensor-core GEMMs (NULL: lib/autotune's heuristic); `dump` writes the
// stages to the context's dump directory.
static kiln_status_t cuda_program(kiln_function_t *f, const char *linalg, const char *chip,
                                  const kiln_kernel_tiling_t *tiling, bool dump,
                                  kiln_gpu_program_t *out) {
  kiln_context_t *c = f->context;
  kiln_status_t s = NULL;
  // The kernels a thrown-away attempt asked tiles for are not the
  // program's: forget them (a search would time a kernel that is not there).
  tune_state_t *ts = tiling && tiling->choose == choose_tiles ? tiling->user : NULL;
  int count0 = ts ? ts->count : 0, next0 = ts ? ts->next : 0;
  kiln_mlir_t *mlir = NULL;
  int dump_id = 0;
  KILN_RETURN_IF_ERROR_PLAIN(acquire_mlir(c, &mlir, &dump_id));
  char tag[256] = "";
  if (dump && c->dump_dir)
    snprintf(tag, sizeof(tag), "%s-cuda-%d",
             f->graph->name ? f->graph->name : "graph", dump_id);
  kiln_pipeline_options_t popts = {f->options.vectorize, 1, dump ? c->dump_dir : NULL, tag,
                                   tiling};
  if (popts.dump_dir) kiln_pipeline_dump(&popts, KILN_STAGE_LINALG, linalg);
  for (int attempt = 0; !s && attempt < 2; ++attempt) {
    MlirModule mod = {NULL};
    s = kiln_mlir_parse(mlir, linalg, &mod);
    if (!s) s = kiln_pipeline_run_gpu(mlir, mod, chip, &popts, out);
    if (!mlirModuleIsNull(mod)) mlirModuleDestroy(mod);
    if (!s || !popts.vectorize) break;
    if (log_enabled("cuda"))
      fprintf(stderr, "[kiln cuda] @%s: GPU schedules failed (%s); plain "
              "mapping\n", f->graph->name, kiln_status_message(s));
    kiln_status_free(s);
    s = NULL;
    kiln_gpu_program_free(out);
    popts.vectorize = 0;
    if (ts) {
      ts->count = count0;
      ts->next = next0;
    }
  }
  release_mlir(c, mlir);
  return s;
}

// Loads a CUDA variant's program into the current context: its PTX
// modules, one function per launch, its constants uploaded once (every
// call's launches read them).
static kiln_status_t cuda_program_load(kiln_variant_t *v) {
  kiln_status_t s = NULL;
  if (v->gpu.module_count) {
    v->cuda_modules = calloc((size_t)v->gpu.module_count, sizeof(*v->cuda_modules));
    v->cuda_fns = calloc((size_t)v->gpu.launch_count + 1, sizeof(void *));
    if (!v->cuda_modules || !v->cuda_fns)
      s = kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "kernels");
    for (int i = 0; !s && i < v->gpu.module_count; ++i)
      s = kiln_cuda_module_load_ptx(v->gpu.ptx[i], &v->cuda_modules[i]);
    for (int l = 0; !s && l < v->gpu.launch_count; ++l) {
      const kiln_gpu_launch_t *ln = &v->gpu.launches[l];
      if (ln->kind != KILN_GPU_LAUNCH) continue;
      s = kiln_cuda_module_function(v->cuda_modules[ln->module], ln->name,
                                    &v->cuda_fns[l]);
      if (!s) s = kiln_cuda_function_reserve_shared(v->cuda_fns[l], ln->shared_bytes);
    }
  }
  if (!s && v->gpu.const_count) {
    v->cuda_consts = calloc((size_t)v->gpu.const_count, sizeof(void *));
    if (!v->cuda_consts) s = kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "constants");
    for (int i = 0; !s && i < v->gpu.const_count; ++i) {
      s = kiln_cuda_alloc_static((size_t)v->gpu.const_bytes[i], &v->cuda_consts[i]);
      if (!s) s = kiln_cuda_upload(v->cuda_consts[i], v->gpu.const_data[i],
                                   (size_t)v->gpu.const_bytes[i]);
    }
  }
  return s;
}

static kiln_status_t queue_program(kiln_function_t *f, kiln_variant_t *v,
                                   void **bufs, void *stream);

// max-autotune on the CUDA target: one measurement, the variant's program
// built with a candidate set of tiles, loaded, and run on the device on
// random inputs of its real shapes.
typedef struct cuda_tune_run {
  kiln_function_t *f;
  const kiln_graph_t *g;    // the variant's graph
  tune_state_t *ts;
  const char *linalg, *chip;
  void **args;              // device buffers: the inputs, then the outputs
  void **want;              // host copies of the baseline's outputs
  double compile_seconds;
} cuda_tune_run_t;

// Whether the outputs now in r->args match the baseline's (the first
// measurement's, which this keeps): compare_output, with 1e-5 for f32 (a
// candidate changes how blocks are shaped and ordered, not the order in
// which each output sums).
static kiln_status_t cuda_check_outputs(cuda_tune_run_t *r) {
  const kiln_graph_t *g = r->g;
  kiln_status_t s = NULL;
  for (int i = 0; !s && i < g->output_count; ++i) {
    const kiln_type_t *t = &g->values[g->outputs[i]].type;
    size_t n = (size_t)kiln_type_numel(t), es = kiln_dtype_size(t->dtype);
    void *got = malloc(n * es + 1);
    if (!got) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "autotune outputs");
    s = kiln_cuda_memcpy(got, r->args[g->input_count + i], n * es, NULL);
    if (!s) s = kiln_cuda_stream_synchronize(NULL);
    if (!s && !r->want[i]) {
      r->want[i] = got;
      continue;
    }
    if (!s) s = compare_output(i, t, got, r->want[i], 1e-5);
    free(got);
  }
  return s;
}

static kiln_status_t measure_cuda(void *user, const kiln_tile_config_t *configs,
                                  double *out_seconds) {
  cuda_tune_run_t *r = user;
  kiln_function_t *f = r->f;
  kiln_kernel_tiling_t tiling = replay_begin(r->ts, configs);
  kiln_variant_t tv;
  memset(&tv, 0, sizeof(tv));
  tv.cuda_device = f->cuda_device;
  double t0 = now_seconds();
  kiln_status_t s = cuda_program(f, r->linalg, r->chip, &tiling, false, &tv.gpu);
  s = replay_end(r->ts, s, "a recompile");
  int nargs = r->g->input_count + r->g->output_count;
  if (!s && tv.gpu.arg_count != nargs)
    s = kiln_make_status(KILN_STATUS_INTERNAL, "autotune: a launch program for %d "
                         "buffers, the graph has %d", tv.gpu.arg_count, nargs);
  if (!s) s = cuda_program_load(&tv);
  r->compile_seconds += now_seconds() - t0;
  // The buffers: the run's arguments, one block of temporaries, constants.
  int nbuf = tv.gpu.arg_count + tv.gpu.temp_count + tv.gpu.const_count;
  void **ptrs = s ? NULL : calloc((size_t)nbuf + 1, sizeof(void *));
  if (!s && !ptrs) s = kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "autotune");
  void *arena = NULL;
  if (!s) {
    memcpy(ptrs, r->args, sizeof(void *) * (size_t)nargs);
    size_t bytes = 0;
    for (int t = 0; t < tv.gpu.temp_count; ++t)
      bytes += ((size_t)tv.gpu.temp_bytes[t] + 255) & ~(size_t)255;
    if (tv.gpu.temp_count) s = kiln_cuda_alloc_static(bytes, &arena);
    size_t at = 0;
    for (int t = 0; !s && t < tv.gpu.temp_count; ++t) {
      ptrs[nargs + t] = (char *)arena + at;
      at += ((size_t)tv.gpu.temp_bytes[t] + 255) & ~(size_t)255;
    }
    for (int i = 0; !s && i < tv.gpu.const_count; ++i)
      ptrs[nargs + tv.gpu.temp_count + i] = tv.cuda_consts[i];
  }
  // One warm-up call, then rounds of five calls back to back timed on the
  // host up to the stream's end: the fastest round's mean, after at least
  // 3 rounds and 20 ms (at most 50 rounds). The outputs are poisoned
  // (0xff bytes) first, as on the CPU (measure_tiles), so a candidate that
  // leaves part of them unwritten cannot pass on the previous one's values.
  for (int i = 0; !s && i < r->g->output_count; ++i) {
    const kiln_type_t *t = &r->g->values[r->g->outputs[i]].type;
    s = kiln_cuda_memset(r->args[r->g->input_count + i], 0xff,
                         (size_t)kiln_type_numel(t) * kiln_dtype_size(t->dtype), NULL);
  }
  if (!s) s = queue_program(f, &tv, ptrs, NULL);
  if (!s) s = kiln_cuda_stream_synchronize(NULL);
  double best = 1e30, total = 0;
  for (int round = 0; !s && round < 50; ++round) {
    double a = now_seconds();
    for (int i = 0; !s && i < 5; ++i) s = queue_program(f, &tv, ptrs, NULL);
    if (!s) s = kiln_cuda_stream_synchronize(NULL);
    double t = now_seconds() - a;
    total += t;
    if (t / 5 < best) best = t / 5;
    if (round >= 2 && total >= 0.02) break;
  }
  if (!s) s = cuda_check_outputs(r);
  kiln_cuda_free_static(arena);
  free(ptrs);
  cuda_program_unload(&tv);
  kiln_gpu_program_free(&tv.gpu);
  if (!s) *out_seconds = best;
  return s;
}

// Searches the tensor-core GEMMs of CUDA variant `v` (its program already
// built into v->gpu with the tiles `ts` recorded: the database's or the
// heuristic's): each kernel not in the database with enough work, within
// the budget, measured on the device; the choices go into the database
// and v->gpu is built again with them.
static kiln_status_t tune_cuda(kiln_function_t *f, kiln_variant_t *v, const char *linalg,
                               const char *chip, tune_state_t *ts, kiln_stats_t *st) {
  kiln_context_t *c = f->context;
  const kiln_graph_t *g = v->graph;
  int nargs = g->input_count + g->output_count;
  int todo = 0;
  for (int i = 0; i < ts->count; ++i)
    todo += !ts->known[i] && kiln_kernel_work(&ts->descs[i]) >= KILN_TUNE_MIN_WORK;
  if (!todo || v->symbolic) return NULL;
  cuda_tune_run_t run = {f, g, ts, linalg, chip, NULL, NULL, 0};
  run.args = calloc((size_t)nargs + 1, sizeof(void *));
  run.want = calloc((size_t)g->output_count + 1, sizeof(void *));
  kiln_tile_config_t *best = malloc(sizeof(*best) * (size_t)ts->count);
  bool *done = calloc((size_t)ts->count, sizeof(bool));
  kiln_status_t s = run.args && run.want && best && done
                        ? NULL
                        : kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "autotune");
  double t0 = now_seconds();
  uint64_t seed = 0x6b696c6e74756e65ull;
  for (int i = 0; !s && i < nargs; ++i) {
    int id = i < g->input_count ? g->inputs[i] : g->outputs[i - g->input_count];
    const kiln_type_t *t = &g->values[id].type;
    size_t bytes = (size_t)kiln_type_numel(t) * kiln_dtype_size(t->dtype);
    s = kiln_cuda_alloc_static((bytes + 255) / 256 * 256, &run.args[i]);
    if (!s && i < g->input_count) {
      void *host = malloc(bytes + 1);
      if (!host) {
        s = kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "autotune inputs");
        break;
      }
      fill_random(host, t, &seed);
      s = kiln_cuda_upload(run.args[i], host, bytes);
      free(host);
    }
  }
  if (!s) {
    memcpy(best, ts->configs, sizeof(*best) * (size_t)ts->count);
    kiln_autotune_search_options_t so = {
        f->options.autotune_budget_seconds > 0 ? f->options.autotune_budget_seconds : 20.0,
        KILN_TUNE_MIN_WORK, g->name ? g->name : "graph",
        log_enabled("autotune") || isatty(2), ts->known, done};
    kiln_autotune_search_result_t res;
    s = kiln_autotune_search(ts->descs, ts->count, &ts->target, &so, measure_cuda, &run,
                             best, &res);
    st->tune_measured += (uint64_t)res.measured;
    for (int i = 0; !s && i < ts->count; ++i) {
      if (!done[i]) continue;
      kiln_status_t ds = kiln_autotune_db_put(c->cache, ts->db_id, &ts->descs[i],
                                              &ts->target, &best[i], res.best_seconds);
      if (ds && log_enabled("autotune"))
        fprintf(stderr, "[kiln autotune] not stored: %s\n", kiln_status_message(ds));
      kiln_status_free(ds);
    }
    if (!s && so.progress)
      fprintf(stderr, "[kiln autotune] @%s (%s): %d kernels searched, %d configurations "
              "measured in %.1f s: %.3f ms -> %.3f ms\n", so.label, ts->db_id, res.tuned,
              res.measured, now_seconds() - t0, res.baseline_seconds * 1e3,
              res.best_seconds * 1e3);
    if (!s && memcmp(best, ts->configs, sizeof(*best) * (size_t)ts->count)) {
      // The final program replaces the first only once it is built.
      kiln_gpu_program_t tuned;
      memset(&tuned, 0, sizeof(tuned));
      kiln_kernel_tiling_t tiling = replay_begin(ts, best);
      s = cuda_program(f, linalg, chip, &tiling, true, &tuned);
      s = replay_end(ts, s, "the final compile");
      if (s) {
        kiln_gpu_program_free(&tuned);
      } else {
        kiln_gpu_program_free(&v->gpu);
        v->gpu = tuned;
      }
    }
  }
  st->tune_seconds += now_seconds() - t0;
  for (int i = 0; run.args && i < nargs; ++i) kiln_cuda_free_static(run.args[i]);
  for (int i = 0; run.want && i < g->output_count; ++i) free(run.want[i]);
  free(run.args);
  free(run.want);
  free(best);
  free(done);
  return s;
}

// A variant for target cuda: the graph lowered through the GPU pipeline for
// the device's architecture, or its launch program and PTX from the compile
// cache (keyed like a CPU variant, plus the architecture); then the PTX
// loaded, one function per launch.
static kiln_status_t compile_cuda(kiln_function_t *f, kiln_variant_t *v,
                                  kiln_stats_t *st) {
  kiln_context_t *c = f->context;
  int major = 0, minor = 0;
  KILN_RETURN_IF_ERROR_PLAIN(kiln_cuda_use_device(f->cuda_device));
  KILN_RETURN_IF_ERROR_PLAIN(kiln_cuda_device_arch(f->cuda_device, &major, &minor));
  pthread_mutex_init(&v->graph_lock, NULL);
  v->graph_lock_ready = true;
  char chip[16];
  snprintf(chip, sizeof(chip), "sm_%d%d", major, minor);
  // Under max-autotune the device itself (its tuned shapes are its own):
  // the tuning database's key and the compiled program's.
  bool tune = f->options.autotune == KILN_AUTOTUNE_MEASURE;
  char gpu_id[160] = "";
  if (tune) {
    char name[96];
    kiln_status_t ns = kiln_cuda_device_name(f->cuda_device, name, sizeof(name));
    bool named = ns == NULL;
    kiln_status_free(ns);
    snprintf(gpu_id, sizeof(gpu_id), "cuda %s %s", named ? name : "?", chip);
  }
  kiln_hash128_t key = {0, 0};
  bool loaded = false;
  kiln_status_t s = NULL;
  if (c->cache) {
    kiln_hash128_t base;
    KILN_RETURN_IF_ERROR_PLAIN(variant_key(f, v->graph, 0, &base));
    kiln_hasher_t h;
    kiln_hasher_init(&h);
    kiln_hasher_update(&h, &base, sizeof(base));
    kiln_hasher_update_str(&h, chip);
    kiln_hasher_update_str(&h, gpu_id);
    // Kernel choices that KILN_GPU_WGMMA=0, KILN_GPU_TMA=0 and
    // KILN_GPU_BLOCK_ROWS=0 turn off (kernels/gpu_mma.c, kernels/gpu_rows.c).
    static const char *const kKnobs[] = {"KILN_GPU_WGMMA", "KILN_GPU_TMA",
                                         "KILN_GPU_BLOCK_ROWS"};
    for (size_t i = 0; i < sizeof(kKnobs) / sizeof(kKnobs[0]); ++i) {
      const char *v = getenv(kKnobs[i]);
      kiln_hasher_update_str(&h, v && strcmp(v, "0") == 0 ? "0" : "1");
    }
    key = kiln_hasher_final(&h);
  }
  if (c->cache && !c->dump_dir) {
    double t0 = now_seconds();
    void *data = NULL;
    size_t size = 0;
    char note[512];
    if (kiln_cache_get(c->cache, key, &data, &size, note, sizeof(note))) {
      kiln_status_t ds = kiln_gpu_program_deserialize(data, size, &v->gpu);
      loaded = ds == NULL;
      if (ds) {
        fprintf(stderr, "[kiln cache] discarded a bad entry, rebuilding: %s\n",
                kiln_status_message(ds));
        st->cache_rejected++;
      }
      kiln_status_free(ds);
      free(data);
    } else if (note[0]) {
      fprintf(stderr, "[kiln cache] discarded a bad entry, rebuilding: %s\n", note);
      st->cache_rejected++;
    }
    if (loaded)
      st->cache_hits++;
    else
      st->cache_misses++;
    st->cache_seconds += now_seconds() - t0;
  }
  double t2 = now_seconds();
  if (!loaded) {
    // CUDA: reductions collapsed for the GPU split, transposed lhs read
    // through the map where the f32 GEMM kernel takes it.
    kiln_lower_options_t lopts = {.collapse_reductions = true,
                                  .lhs_transpose_map = true,
                                  .cuda = true,
                                  .cuda_sm = major * 10 + minor};
    char *linalg = NULL;
    double t0 = now_seconds();
    s = kiln_lower_to_linalg(v->graph, NULL, &lopts, &linalg);
    double t1 = now_seconds();
    st->lower_seconds += t1 - t0;
    // Under max-autotune the tensor-core GEMMs take their shapes from the
    // tuning database, else they are searched on the device.
    tune_state_t ts;
    memset(&ts, 0, sizeof(ts));
    if (!s && tune) {
      ts.target = (kiln_cpu_target_t){0, 0, 1, 0, 0};
      ts.db = c->cache;
      ts.db_id = gpu_id;
      ts.record = true;
    }
    kiln_kernel_tiling_t tiling = {ts.target, choose_tiles, &ts};
    if (!s) s = cuda_program(f, linalg, chip, tune ? &tiling : NULL, true, &v->gpu);
    ts.record = false;
    st->tune_db_hits += (uint64_t)ts.db_hits;
    if (!s && ts.oom) s = kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "autotune");
    double t3 = now_seconds();
    if (!s && tune) {
      // A search that cannot run (device memory, a failed baseline) leaves
      // the variant as built, with the shapes it had.
      kiln_status_t ts_s = tune_cuda(f, v, linalg, chip, &ts, st);
      if (ts_s)
        fprintf(stderr, "[kiln autotune] @%s: no search on the device (%s); the "
                "tensor-core GEMMs keep their shapes\n", f->graph->name,
                kiln_status_message(ts_s));
      kiln_status_free(ts_s);
    }
    t1 += now_seconds() - t3;  // the search is tune_seconds
    free(ts.descs);
    free(ts.configs);
    free(ts.known);
    free(linalg);
    t2 = now_seconds();
    st->mlir_seconds += t2 - t1;
    if (!s) st->compiles++;
    if (!s && c->cache) {
      void *data = NULL;
      size_t size = 0;
      kiln_status_t cs = kiln_gpu_program_serialize(&v->gpu, &data, &size);
      if (!cs) cs = kiln_cache_put(c->cache, key, data, size);
      if (cs && log_enabled("cache"))
        fprintf(stderr, "[kiln cache] not stored: %s\n", kiln_status_message(cs));
      kiln_status_free(cs);
      free(data);
    }
  }
  v->cuda_device = f->cuda_device;
  if (!s && v->gpu.arg_count != f->graph->input_count + f->graph->output_count)
    s = kiln_make_status(KILN_STATUS_INTERNAL, "cuda: a launch program for %d "
                         "buffers; graph @%s has %d", v->gpu.arg_count,
                         f->graph->name,
                         f->graph->input_count + f->graph->output_count);
  if (!s) s = cuda_program_load(v);
  st->llvm_seconds += now_seconds() - t2;  // the driver's PTX JIT
  return s;
}

// One variant: from the cache when possible, else compiled and cached.
static kiln_status_t compile_variant(kiln_function_t *f, const int64_t *binding,
                                     uint64_t strided_mask,
                                     kiln_variant_t **out) {
  kiln_graph_t *g = f->graph;
  kiln_context_t *c = f->context;
  kiln_variant_t *v = calloc(1, sizeof(*v));
  if (!v) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "variant");
  v->strided_mask = strided_mask;
  v->binding = calloc((size_t)g->symbol_count + 1, sizeof(int64_t));
  if (!v->binding) {
    free(v);
    return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "variant");
  }
  if (g->symbol_count)
    memcpy(v->binding, binding, sizeof(int64_t) * (size_t)g->symbol_count);
  for (int i = 0; i < g->symbol_count; ++i)
    v->symbolic += v->binding[i] < 0 && g->symdefs[i].factor_count == 0;
  kiln_stats_t st;
  memset(&st, 0, sizeof(st));
  kiln_status_t s = kiln_graph_specialize(g, v->binding, &v->graph);
  kiln_hash128_t key = {0, 0};
  bool loaded = false;
  if (!s && f->cuda) {
    // The GPU variant: PTX and a launch program, not host code.
    s = compile_cuda(f, v, &st);
    loaded = true;  // nothing for the CPU path below
  }
  if (!s && c->cache && !f->cuda) s = variant_key(f, v->graph, strided_mask, &key);
  // With KILN_DUMP_DIR the point is to see the IR: compile, do not load.
  if (!s && c->cache && !c->dump_dir && !f->cuda) {
    double t0 = now_seconds();
    void *obj = NULL;
    size_t size = 0;
    char note[512];
    if (kiln_cache_get(c->cache, key, &obj, &size, note, sizeof(note))) {
      kiln_status_t ls = link_object(v, obj, size);
      if (ls) {
        snprintf(note, sizeof(note), "entry %016llx%016llx does not link: %s",
                 (unsigned long long)key.hi, (unsigned long long)key.lo,
                 kiln_status_message(ls));
        kiln_status_free(ls);
        kiln_jit_destroy(v->jit);
        v->jit = NULL;
        v->entry = NULL;
      } else {
        loaded = true;
        st.cache_hits++;
      }
      free(obj);
    }
    if (!loaded) {
      st.cache_misses++;
      if (note[0]) {
        st.cache_rejected++;
        // Never silent: a discarded entry is always reported.
        fprintf(stderr, "[kiln cache] discarded a bad entry, rebuilding: %s\n",
                note);
      }
    }
    st.cache_seconds += now_seconds() - t0;
  }
  if (!s && !loaded) {
    void *obj = NULL;
    size_t size = 0;
    if (f->options.autotune == KILN_AUTOTUNE_MEASURE) {
      s = tune_variant(f, v, &st, &obj, &size);
    } else {
      kiln_kernel_tiling_t tiling = {{0}, NULL, NULL};
      cpu_target(f->options.num_threads, &tiling.target);
      s = compile_object(f, v, &tiling, &st, &obj, &size);
    }
    if (!s) st.compiles++;
    double t0 = now_seconds();
    if (!s) s = link_object(v, obj, size);
    st.llvm_seconds += now_seconds() - t0;
    if (!s && c->cache) {
      t0 = now_seconds();
      kiln_status_t cs = kiln_cache_put(c->cache, key, obj, size);
      if (cs) {
        if (log_enabled("cache"))
          fprintf(stderr, "[kiln cache] not stored: %s\n", kiln_status_message(cs));
        kiln_status_free(cs);
      }
      st.cache_seconds += now_seconds() - t0;
    }
    free(obj);
  }
  if (!s) {
    int32_t *ranks = malloc(sizeof(int32_t) *
                            ((size_t)g->input_count + (size_t)g->output_count + 1));
    if (ranks) {
      int32_t n = 0;
      for (int i = 0; i < g->input_count; ++i)
        ranks[n++] = g->values[g->inputs[i]].type.rank;
      for (int i = 0; i < g->output_count; ++i)
        ranks[n++] = g->values[g->outputs[i]].type.rank;
      s = kiln_ffi_sig_create(ranks, n, &v->sig);
      free(ranks);
    } else {
      s = kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "variant signature");
    }
  }
  add_stats(c, &st);
  if (log_enabled("stats"))
    fprintf(stderr, "[kiln stats] graph @%s variant: %s, lower %.1f ms, mlir "
                    "%.1f ms, llvm %.1f ms, cache %.1f ms, autotune %llu "
                    "measured in %.1f ms (%llu kernels from the database)\n",
            g->name, s ? "failed" : loaded ? "cache hit" : "compiled",
            st.lower_seconds * 1e3, st.mlir_seconds * 1e3,
            st.llvm_seconds * 1e3, st.cache_seconds * 1e3,
            (unsigned long long)st.tune_measured, st.tune_seconds * 1e3,
            (unsigned long long)st.tune_db_hits);
  if (s) {
    variant_free(v);
    return kiln_status_annotate(s, "compiling graph @%s for %s",
                                g->name ? g->name : "main", f->target);
  }
  *out = v;
  return NULL;
}

kiln_status_t kiln_function_compile(kiln_context_t *context,
                                    const kiln_graph_t *graph,
                                    const kiln_compile_options_t *options,
                                    kiln_function_t **out_function) {
  if (!out_function)
    return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                            "kiln_function_compile: out_function is NULL");
  *out_function = NULL;
  if (!context || !graph)
    return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                            "kiln_function_compile: context and graph must not "
                            "be NULL");
  kiln_compile_options_t opts;
  kiln_compile_options_init(&opts);
  if (options) opts = *options;
  KILN_RETURN_IF_ERROR_PLAIN(check_target(&opts));
  if (opts.autotune != KILN_AUTOTUNE_HEURISTIC &&
      opts.autotune != KILN_AUTOTUNE_MEASURE)
    return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                            "autotune = %d; expected KILN_AUTOTUNE_HEURISTIC "
                            "(0) or KILN_AUTOTUNE_MEASURE (1)",
                            (int)opts.autotune);
  if (graph->input_count + graph->output_count > KILN_MAX_TENSORS ||
      graph->output_count > KILN_MAX_OUTPUTS)
    return kiln_make_status(KILN_STATUS_UNSUPPORTED,
                            "graph @%s has %d inputs and %d outputs; expected "
                            "at most %d outputs and %d tensors in all",
                            graph->name, graph->input_count,
                            graph->output_count, KILN_MAX_OUTPUTS,
                            KILN_MAX_TENSORS);
  kiln_function_t *f = calloc(1, sizeof(*f));
  if (!f) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "function");
  f->refcount = 1;
  f->context = context;
  f->options = opts;
  snprintf(f->target, sizeof(f->target), "%s", opts.target ? opts.target : "cpu");
  f->options.target = f->target;
  f->options.input_strided = NULL;  // (the caller's, read below only)
  pthread_mutex_init(&f->lock, NULL);
  if (opts.max_variants < 1) opts.max_variants = 1;
  f->options.max_variants = opts.max_variants;
  f->options.num_threads = resolve_threads(opts.num_threads);
  f->cuda = strcmp(f->target, "cuda") == 0;
  if (f->cuda) {
    // Kernel launches need static sizes: a variant per set of sizes, with
    // no limit that would switch to (unsupported) symbolic variants.
    // (max-autotune searches the tensor-core GEMMs on the device:
    // compile_cuda.)
    f->options.dynamic = KILN_DYNAMIC_NEVER;
    f->options.max_variants = 1 << 20;
  }
  kiln_status_t gs = kiln_guard_table_create(0, &f->guards);
  if (gs) {
    pthread_mutex_destroy(&f->lock);
    free(f);
    return gs;
  }
  f->first_seen = malloc(sizeof(int64_t) * ((size_t)graph->symbol_count + 1));
  f->dynamic = calloc((size_t)graph->symbol_count + 1, sizeof(bool));
  for (int i = 0; f->first_seen && i < graph->symbol_count; ++i)
    f->first_seen[i] = -1;
  // Own a copy of the graph: the caller may destroy theirs.
  int64_t *unbound = (f->first_seen && f->dynamic)
                         ? calloc((size_t)graph->symbol_count + 1, sizeof(int64_t))
                         : NULL;
  char *text = NULL;
  kiln_status_t s = unbound ? kiln_graph_print_text(graph, &text)
                            : kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "f");
  if (!s) s = kiln_graph_parse_text(text, strlen(text), graph->name, &f->graph);
  free(text);
  if (!s && f->graph->symbol_count > 256)
    s = kiln_make_status(KILN_STATUS_UNSUPPORTED,
                         "graph @%s: %d sizes (symbols and products of them); "
                         "at most 256", graph->name, f->graph->symbol_count);
  // Every size must follow from the inputs' (a graph whose view names a
  // batch no input has is refused here, where a caller can fall back).
  if (!s) s = kiln_graph_check_symbols(f->graph);
  // A static graph is compiled now, so errors surface at compile time,
  // for the layouts the caller expects (the CUDA target takes contiguous
  // tensors only).
  if (!s && graph->symbol_count == 0) {
    uint64_t mask = 0;
    for (int i = 0; opts.input_strided && !f->cuda && i < graph->input_count; ++i)
      if (opts.input_strided[i]) mask |= (uint64_t)1 << mask_bit(i);
    kiln_variant_t *v = NULL;
    s = compile_variant(f, unbound, mask, &v);
    if (!s) {
      f->variants = v;
      f->variant_count = 1;
    }
  }
  free(unbound);
  if (s) {
    kiln_function_release(f);
    return s;
  }
  *out_function = f;
  return NULL;
}

void kiln_function_retain(kiln_function_t *function) {
  if (function) __atomic_add_fetch(&function->refcount, 1, __ATOMIC_RELAXED);
}

void kiln_function_release(kiln_function_t *function) {
  if (!function) return;
  if (__atomic_sub_fetch(&function->refcount, 1, __ATOMIC_ACQ_REL) != 0) return;
  kiln_variant_t *v = function->variants;
  while (v) {
    kiln_variant_t *next = v->next;
    variant_free(v);
    v = next;
  }
  kiln_guard_table_destroy(function->guards);
  for (kiln_guard_entry_t *e = function->entries; e;) {
    kiln_guard_entry_t *next = e->next;
    free(e);
    e = next;
  }
  kiln_graph_free(function->graph);
  free(function->first_seen);
  free(function->dynamic);
  pthread_mutex_destroy(&function->lock);
  free(function);
}

// Checks inputs, binds symbols, and computes the stride mask.
static kiln_status_t bind_inputs(kiln_function_t *f, const DLTensor *inputs,
                                 size_t input_count, int64_t *binding,
                                 uint64_t *strided_mask) {
  const kiln_graph_t *g = f->graph;
  if (input_count != (size_t)g->input_count)
    return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                            "graph @%s: %zu inputs given; expected %d",
                            g->name, input_count, g->input_count);
  if (input_count && !inputs)
    return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                            "graph @%s: inputs is NULL", g->name);
  for (int i = 0; i < g->symbol_count; ++i) binding[i] = -1;
  *strided_mask = 0;
  for (size_t i = 0; i < input_count; ++i) {
    KILN_RETURN_IF_ERROR(check_tensor(g, "input", i, &inputs[i],
                                      &g->values[g->inputs[i]].type, binding,
                                      f->cuda, f->cuda ? kDLCUDA : kDLCPU),
                         "graph @%s", g->name);
    if (!dl_is_contiguous(&inputs[i]))
      *strided_mask |= (uint64_t)1 << mask_bit((int)i);
  }
  if (g->symbol_count)
    KILN_RETURN_IF_ERROR(kiln_graph_resolve_binding(g, binding), "graph @%s",
                         g->name);
  return NULL;
}

// The most specialized variant serving `binding` (fewest symbolic sizes).
static kiln_variant_t *match_variant(kiln_function_t *f, const int64_t *binding,
                                     uint64_t mask) {
  int nsym = f->graph->symbol_count;
  kiln_variant_t *best = NULL;
  for (kiln_variant_t *v = __atomic_load_n(&f->variants, __ATOMIC_ACQUIRE); v;
       v = v->next) {
    if (v->strided_mask != mask) continue;
    bool ok = true;
    for (int i = 0; ok && i < nsym; ++i)
      ok = v->binding[i] < 0 || v->binding[i] == binding[i];
    if (ok && (!best || v->symbolic < best->symbolic)) best = v;
  }
  return best;
}

// On a miss, the policy picks which symbols the new variant keeps symbolic.
static void choose_binding(kiln_function_t *f, const int64_t *binding,
                           int64_t *out, char *why, size_t why_len) {
  const kiln_graph_t *g = f->graph;
  bool all_symbolic = f->options.dynamic == KILN_DYNAMIC_ALWAYS ||
                      f->variant_count >= f->options.max_variants;
  size_t o = 0;
  why[0] = 0;
  for (int i = 0; i < g->symbol_count; ++i) {
    if (g->symdefs[i].factor_count) continue;  // derived: below
    if (f->first_seen[i] < 0) f->first_seen[i] = binding[i];
    if (f->first_seen[i] != binding[i] && !f->dynamic[i] &&
        f->options.dynamic == KILN_DYNAMIC_AUTO) {
      f->dynamic[i] = true;
      o += (size_t)snprintf(why + o, o < why_len ? why_len - o : 0,
                            "%s%s was %lld, now %lld", o ? "; " : "",
                            g->symbols[i], (long long)f->first_seen[i],
                            (long long)binding[i]);
    }
    out[i] = (all_symbolic || f->dynamic[i]) ? -1 : binding[i];
  }
  kiln_graph_derive_binding(g, out);
  if (!why[0])
    snprintf(why, why_len, "%s",
             f->variant_count == 0 ? "first call"
             : f->variant_count >= f->options.max_variants
                 ? "variant limit reached"
                 : "sizes or layout not covered");
}

static kiln_status_t find_variant(kiln_function_t *f, const int64_t *binding,
                                  uint64_t mask, kiln_variant_t **out) {
  kiln_variant_t *v = match_variant(f, binding, mask);
  if (v) {
    *out = v;
    return NULL;
  }
  // Compile under the function lock; the variant list only grows (new ones
  // are published with a release store), so readers never need the lock.
  pthread_mutex_lock(&f->lock);
  v = match_variant(f, binding, mask);
  if (v) {
    pthread_mutex_unlock(&f->lock);
    *out = v;
    return NULL;
  }
  const kiln_graph_t *g = f->graph;
  int64_t chosen[256];
  char why[512];
  choose_binding(f, binding, chosen, why, sizeof(why));
  kiln_status_t s = compile_variant(f, chosen, mask, &v);
  if (!s) {
    v->next = f->variants;
    __atomic_store_n(&f->variants, v, __ATOMIC_RELEASE);
    f->variant_count++;
    *out = v;
    // Read at each compile (not per call), so a process can turn it on late.
    const char *log = getenv("KILN_LOG");
    if (log && strstr(log, "recompiles")) {
      char sizes[512];
      size_t o = 0;
      sizes[0] = 0;
      for (int i = 0; i < g->symbol_count; ++i) {
        if (chosen[i] < 0)
          o += (size_t)snprintf(sizes + o, o < sizeof(sizes) ? sizeof(sizes) - o : 0,
                                "%s%s=?", i ? " " : "", g->symbols[i]);
        else
          o += (size_t)snprintf(sizes + o, o < sizeof(sizes) ? sizeof(sizes) - o : 0,
                                "%s%s=%lld", i ? " " : "", g->symbols[i],
                                (long long)chosen[i]);
      }
      fprintf(stderr, "[kiln recompiles] graph @%s: variant %d (%s; strided "
                      "inputs 0x%llx): %s\n",
              g->name, f->variant_count, sizes[0] ? sizes : "static",
              (unsigned long long)mask, why);
    }
  }
  pthread_mutex_unlock(&f->lock);
  return s;
}

int kiln_function_variant_count(kiln_function_t *function) {
  if (!function) return 0;
  pthread_mutex_lock(&function->lock);
  int n = function->variant_count;
  pthread_mutex_unlock(&function->lock);
  return n;
}

static void fill_memref(kiln_memref_t *m, const DLTensor *t) {
  memset(m, 0, sizeof(*m));
  m->allocated = m->aligned = (char *)t->data + t->byte_offset;
  m->offset = 0;
  m->rank = t->ndim;
  int64_t stride = 1;
  for (int i = t->ndim - 1; i >= 0; --i) {
    m->sizes[i] = t->shape[i];
    m->strides[i] = t->strides ? t->strides[i] : stride;
    stride *= t->shape[i];
  }
}

// The most TMA tensor maps one launch passes (the tensor-core GEMM's: 2).
#define KILN_LAUNCH_TMAPS 8

// Queues a CUDA variant's launch program on `stream`; `bufs` holds the
// device pointers of its buffers: inputs, outputs, then temporaries.
static kiln_status_t queue_program(kiln_function_t *f, kiln_variant_t *v,
                                   void **bufs, void *stream) {
  const kiln_gpu_program_t *p = &v->gpu;
  for (int l = 0; l < p->launch_count; ++l) {
    const kiln_gpu_launch_t *ln = &p->launches[l];
    kiln_status_t s;
    if (ln->kind == KILN_GPU_COPY) {
      s = kiln_cuda_memcpy((char *)bufs[ln->args[1]] + ln->offsets[1],
                           (char *)bufs[ln->args[0]] + ln->offsets[0],
                           (size_t)ln->bytes, stream);
    } else {
      void *params[KILN_GPU_MAX_ARGS];
      // TMA tensor maps go by value, encoded from this call's buffers.
      _Alignas(64) unsigned char maps[KILN_LAUNCH_TMAPS][KILN_CUDA_TENSOR_MAP_BYTES];
      int nmaps = 0;
      s = NULL;
      for (int a = 0; !s && a < ln->arg_count; ++a) {
        if (ln->args[a] >= 0) {
          params[a] = &bufs[ln->args[a]];
          continue;
        }
        if (nmaps == KILN_LAUNCH_TMAPS) {
          s = kiln_make_status(KILN_STATUS_UNSUPPORTED,
                               "a kernel taking more than %d TMA tensor maps",
                               KILN_LAUNCH_TMAPS);
          break;
        }
        const kiln_gpu_tmap_t *t = &p->tmaps[KILN_GPU_ARG_TMAP(ln->args[a])];
        kiln_cuda_elem_t el = t->dtype == KILN_F16    ? KILN_CUDA_ELEM_F16
                              : t->dtype == KILN_BF16 ? KILN_CUDA_ELEM_BF16
                                                      : KILN_CUDA_ELEM_F32;
        s = kiln_cuda_tensor_map(maps[nmaps], el, t->rank,
                                 (char *)bufs[t->buffer] + t->offset_bytes, t->dims,
                                 t->strides, t->box, t->swizzle, t->l2promo);
        params[a] = maps[nmaps++];
      }
      if (!s)
        s = kiln_cuda_launch(v->cuda_fns[l], ln->grid, ln->block, ln->shared_bytes, stream,
                             params);
    }
    if (s) return kiln_status_annotate(s, "graph @%s, %s", f->graph->name, ln->name);
  }
  return NULL;
}

// Records `v`'s launch program with the call's buffers `args` (inputs then
// outputs) into `slot`: its temporaries are allocated once, its graph is
// created or updated in place.
static kiln_status_t record_graph(kiln_function_t *f, kiln_variant_t *v,
                                  kiln_graph_slot_t *slot, void *const *args) {
  const kiln_gpu_program_t *p = &v->gpu;
  if (!slot->bufs) {
    slot->bufs = calloc((size_t)(p->arg_count + p->temp_count + p->const_count) + 1,
                        sizeof(void *));
    if (!slot->bufs) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "CUDA graph");
    for (int t = 0; t < p->temp_count; ++t) {
      kiln_status_t s = kiln_cuda_alloc_static((size_t)p->temp_bytes[t],
                                               &slot->bufs[p->arg_count + t]);
      if (s) {
        for (int u = 0; u < t; ++u) kiln_cuda_free_static(slot->bufs[p->arg_count + u]);
        free(slot->bufs);
        slot->bufs = NULL;
        return s;
      }
    }
  }
  memcpy(slot->bufs, args, sizeof(void *) * (size_t)p->arg_count);
  for (int i = 0; i < p->const_count; ++i)
    slot->bufs[p->arg_count + p->temp_count + i] = v->cuda_consts[i];
  void *capture = NULL;
  kiln_status_t s = kiln_cuda_capture_begin(&capture);
  bool updated = false;
  if (!s) {
    s = queue_program(f, v, slot->bufs, capture);
    kiln_status_t e = kiln_cuda_capture_end(capture, !s, &slot->graph, &updated);
    if (!s) s = e;
    else kiln_status_free(e);
  }
  if (s) {
    // The slot's key changed: its graph (if any) must not be replayed.
    kiln_cuda_graph_destroy(slot->graph);
    slot->graph = NULL;
  }
  if (!s && log_enabled("cuda"))
    fprintf(stderr, "[kiln cuda] @%s: CUDA graph of %d steps %s\n",
            f->graph->name, p->launch_count, updated ? "updated" : "recorded");
  return s;
}

// options.cuda_graphs: replays the graph recorded for these addresses, or
// records one (into a free slot, else over the least recently used).
static kiln_status_t run_cuda_graph(kiln_function_t *f, kiln_variant_t *v,
                                    void *const *args, void *stream) {
  size_t key_bytes = sizeof(void *) * (size_t)v->gpu.arg_count;
  pthread_mutex_lock(&v->graph_lock);
  kiln_graph_slot_t *hit = NULL, *victim = NULL;
  for (int i = 0; i < KILN_GRAPH_SLOTS && !hit; ++i) {
    kiln_graph_slot_t *slot = &v->graph_slots[i];
    if (slot->graph && memcmp(slot->bufs, args, key_bytes) == 0) hit = slot;
    else if (!victim || (victim->graph && (!slot->graph ||
                                          slot->last_use < victim->last_use)))
      victim = slot;
  }
  kiln_status_t s = NULL;
  bool recorded = false;
  if (!hit) {
    s = record_graph(f, v, victim, args);
    hit = victim;
    recorded = true;
  }
  if (!s) {
    hit->last_use = ++v->graph_clock;
    s = kiln_cuda_graph_launch(hit->graph, stream);
  }
  pthread_mutex_unlock(&v->graph_lock);
  if (!s) {
    kiln_context_t *c = f->context;
    pthread_mutex_lock(&c->stats_lock);
    (recorded ? &c->stats.graph_records : &c->stats.graph_replays)[0]++;
    pthread_mutex_unlock(&c->stats_lock);
  }
  return s ? kiln_status_annotate(s, "graph @%s (cuda_graphs)", f->graph->name) : s;
}

// A CUDA variant's launches, on `stream`: inputs and outputs are passed as
// bare device pointers, temporaries are allocated for the call.
static kiln_status_t run_cuda_variant(kiln_function_t *f, kiln_variant_t *v,
                                      const DLTensor *inputs, DLTensor *outputs,
                                      void *stream) {
  const kiln_graph_t *g = f->graph;
  const kiln_gpu_program_t *p = &v->gpu;
  int nbuf = p->arg_count + p->temp_count + p->const_count;
  void *stack_ptrs[128];
  void **ptrs = nbuf <= 128 ? stack_ptrs : calloc((size_t)nbuf, sizeof(void *));
  if (!ptrs) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "launch");
  for (int i = 0; i < g->input_count + g->output_count; ++i) {
    const DLTensor *t = i < g->input_count ? &inputs[i] : &outputs[i - g->input_count];
    if (t->device.device_id != f->cuda_device) {
      if (ptrs != stack_ptrs) free(ptrs);
      return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                              "graph @%s: %s %d is on cuda:%d; expected "
                              "cuda:%d", g->name,
                              i < g->input_count ? "input" : "output",
                              i < g->input_count ? i : i - g->input_count,
                              t->device.device_id, f->cuda_device);
    }
  }
  int n = 0;
  for (int i = 0; i < g->input_count; ++i)
    ptrs[n++] = (char *)inputs[i].data + inputs[i].byte_offset;
  for (int i = 0; i < g->output_count; ++i)
    ptrs[n++] = (char *)outputs[i].data + outputs[i].byte_offset;
  for (int i = 0; i < n && p->align > 1; ++i)
    if ((uintptr_t)ptrs[i] % (uintptr_t)p->align) {
      if (ptrs != stack_ptrs) free(ptrs);
      return kiln_make_status(
          KILN_STATUS_INVALID_ARGUMENT,
          "graph @%s: %s %d at %p is not %d-byte aligned; the CUDA kernels "
          "of this graph use vector accesses (pass an aligned copy)", g->name,
          i < g->input_count ? "input" : "output",
          i < g->input_count ? i : i - g->input_count, ptrs[i], p->align);
    }
  kiln_status_t s = NULL;
  if (n != p->arg_count)
    s = kiln_make_status(KILN_STATUS_INTERNAL, "graph @%s: a launch program "
                         "for %d buffers, the graph has %d", g->name,
                         p->arg_count, n);
  if (!s) s = kiln_cuda_use_device(f->cuda_device);
  bool direct = !s;
  if (!s && f->options.cuda_graphs) {
    s = run_cuda_graph(f, v, ptrs, stream);
    // A driver without CUDA graphs runs the launches directly.
    direct = s && kiln_status_code(s) == KILN_STATUS_UNAVAILABLE;
    if (direct) {
      kiln_status_free(s);
      s = NULL;
    }
  }
  if (direct) {
    for (int i = 0; i < p->const_count; ++i)
      ptrs[n + p->temp_count + i] = v->cuda_consts[i];
    // All temporaries live for the whole call: one allocation holds them
    // (256-byte aligned slices), not one pool call each way per temporary
    // (a backward graph has dozens).
    size_t arena = 0;
    for (int t = 0; t < p->temp_count; ++t)
      arena += ((size_t)p->temp_bytes[t] + 255) & ~(size_t)255;
    void *base = NULL;
    if (p->temp_count) s = kiln_cuda_alloc(arena, stream, &base);
    size_t at = 0;
    for (int t = 0; !s && t < p->temp_count; ++t) {
      ptrs[n + t] = (char *)base + at;
      at += ((size_t)p->temp_bytes[t] + 255) & ~(size_t)255;
    }
    if (!s) s = queue_program(f, v, ptrs, stream);
    // Freed after the launches that use it were queued: stream-ordered
    // (cuMemFreeAsync) where the driver has it, else cuMemFree, which waits
    // for the device.
    if (base) kiln_cuda_free(base, stream);
  }
  if (ptrs != stack_ptrs) free(ptrs);
  return s;
}

static kiln_status_t run_variant(kiln_function_t *f, kiln_variant_t *v,
                                 const DLTensor *inputs, DLTensor *outputs,
                                 void *stream) {
  if (f->cuda) return run_cuda_variant(f, v, inputs, outputs, stream);
  const kiln_graph_t *g = f->graph;
  // Descriptors of small calls live on the stack; a graph with many tensors
  // (an optimizer step) pays one allocation per call, as libffi's argument
  // array does for it.
  kiln_memref_t stack_refs[64];
  kiln_memref_t *refs = stack_refs;
  size_t count = (size_t)g->input_count + (size_t)g->output_count;
  if (count > 64 && !(refs = malloc(sizeof(*refs) * count)))
    return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "call of graph @%s",
                            g->name);
  int32_t n = 0;
  for (int i = 0; i < g->input_count; ++i) fill_memref(&refs[n++], &inputs[i]);
  for (int i = 0; i < g->output_count; ++i) fill_memref(&refs[n++], &outputs[i]);
  kiln_status_t s = kiln_ffi_call(v->sig, v->entry, refs, n);
  if (refs != stack_refs) free(refs);
  return s;
}

kiln_status_t kiln_function_output_types(kiln_function_t *function,
                                         const DLTensor *inputs,
                                         size_t input_count,
                                         kiln_tensor_type_t *out_types,
                                         size_t output_count) {
  if (!function || !out_types)
    return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                            "kiln_function_output_types: function and "
                            "out_types must not be NULL");
  const kiln_graph_t *g = function->graph;
  if (output_count != (size_t)g->output_count)
    return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                            "graph @%s: room for %zu outputs; expected %d",
                            g->name, output_count, g->output_count);
  int64_t binding[256];
  uint64_t mask;
  if (g->symbol_count > 256)
    return kiln_make_status(KILN_STATUS_UNSUPPORTED, "more than 256 symbols");
  KILN_RETURN_IF_ERROR_PLAIN(
      bind_inputs(function, inputs, input_count, binding, &mask));
  kiln_graph_t *spec = NULL;
  if (g->symbol_count) {
    KILN_RETURN_IF_ERROR_PLAIN(kiln_graph_specialize(g, binding, &spec));
  }
  const kiln_graph_t *sg = spec ? spec : g;
  for (size_t i = 0; i < output_count; ++i)
    to_public_type(&sg->values[sg->outputs[i]].type, &out_types[i]);
  kiln_graph_free(spec);
  return NULL;
}

// Remembers `v` for the signature `key` of a checked call with `binding`.
static kiln_guard_entry_t *remember(kiln_function_t *f,
                                   const kiln_guard_key_t *key,
                                   kiln_variant_t *v, const int64_t *binding) {
  const kiln_graph_t *g = f->graph;
  kiln_guard_entry_t *e = calloc(1, sizeof(*e) + sizeof(kiln_type_t) *
                                                     (size_t)g->output_count);
  if (!e) return NULL;
  e->variant = v;
  for (int i = 0; i < g->output_count; ++i) {
    e->outputs[i] = g->values[g->outputs[i]].type;
    for (int k = 0; k < e->outputs[i].rank; ++k)
      if (KILN_IS_SYM(e->outputs[i].dims[k]))
        e->outputs[i].dims[k] = binding[KILN_SYM_ID(e->outputs[i].dims[k])];
  }
  pthread_mutex_lock(&f->lock);
  e->next = f->entries;
  f->entries = e;
  pthread_mutex_unlock(&f->lock);
  return kiln_guard_insert(f->guards, key, e);
}

// The checks a guard hit still needs: the key fixed dtypes, ranks, sizes,
// layout class and device, but not pointers, element alignment or the sign
// of strides, nor anything about the outputs.
static bool hit_inputs_ok(const DLTensor *inputs, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const DLTensor *t = &inputs[i];
    size_t esize = (t->dtype.bits + 7u) / 8u;
    uintptr_t addr = (uintptr_t)t->data + (uintptr_t)t->byte_offset;
    if (!t->data || (esize && addr % esize)) return false;
    if (t->strides)
      for (int d = 0; d < t->ndim; ++d)
        if (t->strides[d] < 0) return false;
  }
  return true;
}

static bool hit_outputs_ok(const kiln_guard_entry_t *e, DLTensor *outputs,
                           size_t n, int device_type) {
  for (size_t i = 0; i < n; ++i) {
    const DLTensor *t = &outputs[i];
    const kiln_type_t *want = &e->outputs[i];
    kiln_dtype_t dt;
    if (!t->data || (int)t->device.device_type != device_type ||
        t->ndim != want->rank ||
        !kiln_dtype_from_dl(t->dtype, &dt) || dt != want->dtype ||
        ((uintptr_t)t->data + t->byte_offset) % kiln_dtype_size(dt))
      return false;
    for (int d = 0; d < t->ndim; ++d)
      if (t->shape[d] != want->dims[d]) return false;
    if (!dl_is_contiguous(t)) return false;
  }
  return true;
}

// The aliasing rules of aliasing_ok on a guard hit. Without mutations and
// with few tensors a direct pairwise test of outputs against inputs is
// cheaper than sorting.
static bool hit_aliasing_ok(const kiln_graph_t *g, const DLTensor *inputs,
                            size_t nin, const DLTensor *outputs, size_t nout) {
  if (g->mutation_count || (nin + nout) * nout > 64) {
    extent_t stack[64];
    extent_t *scratch = stack;
    if (nin + nout > 64 && !(scratch = malloc(sizeof(*scratch) * (nin + nout))))
      return false;  // the slow path reports it
    bool ok = aliasing_ok(g, inputs, nin, outputs, nout, scratch);
    if (scratch != stack) free(scratch);
    return ok;
  }
  for (size_t i = 0; i < nout; ++i) {
    uintptr_t olo, ohi;
    dl_extent(&outputs[i], &olo, &ohi);
    for (size_t k = 0; k < nin + i; ++k) {  // inputs, then earlier outputs
      uintptr_t lo, hi;
      dl_extent(k < nin ? &inputs[k] : &outputs[k - nin], &lo, &hi);
      if (olo < hi && lo < ohi && olo < ohi && lo < hi) return false;
    }
  }
  return true;
}

static kiln_status_t call_impl(kiln_function_t *function,
                               const DLTensor *inputs, size_t input_count,
                               DLTensor *outputs, size_t output_count,
                               void *stream) {
  const kiln_graph_t *g = function->graph;
  // Fast path: one hash probe, no lock, and no allocation up to 64 tensors
  // (a longer guard key lives in a per-thread buffer; the overlap check of
  // a larger call allocates its scratch).
  kiln_guard_key_t key;
  bool keyed = input_count == (size_t)g->input_count &&
               output_count == (size_t)g->output_count &&
               (inputs || !input_count) && (outputs || !output_count) &&
               kiln_guard_key_make(inputs, input_count, &key);
  if (keyed) {
    const kiln_guard_entry_t *e = kiln_guard_lookup(function->guards, &key);
    if (e && hit_inputs_ok(inputs, input_count) &&
        hit_outputs_ok(e, outputs, output_count,
                       function->cuda ? kDLCUDA : kDLCPU) &&
        hit_aliasing_ok(g, inputs, input_count, outputs, output_count))
      return run_variant(function, e->variant, inputs, outputs, stream);
  }
  // Slow path: every check with its message, the variant policy, and a
  // guard entry for next time.
  if (g->symbol_count > 256)
    return kiln_make_status(KILN_STATUS_UNSUPPORTED, "more than 256 symbols");
  int64_t binding[256];
  uint64_t mask;
  KILN_RETURN_IF_ERROR_PLAIN(
      bind_inputs(function, inputs, input_count, binding, &mask));
  if (output_count != (size_t)g->output_count)
    return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                            "graph @%s: %zu outputs given; expected %d",
                            g->name, output_count, g->output_count);
  if (output_count && !outputs)
    return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                            "graph @%s: outputs is NULL", g->name);
  kiln_variant_t *v;
  KILN_RETURN_IF_ERROR_PLAIN(find_variant(function, binding, mask, &v));
  for (size_t i = 0; i < output_count; ++i) {
    // Output sizes follow from the call's binding (every symbol is bound by
    // the inputs; the lowering rejects graphs where one is not).
    int64_t scratch[256];
    memcpy(scratch, binding, sizeof(int64_t) * (size_t)g->symbol_count);
    KILN_RETURN_IF_ERROR(
        check_tensor(g, "output", i, &outputs[i],
                     &g->values[g->outputs[i]].type, scratch, true,
                     function->cuda ? kDLCUDA : kDLCPU),
        "graph @%s", g->name);
  }
  KILN_RETURN_IF_ERROR_PLAIN(
      check_aliasing(g, inputs, input_count, outputs, output_count));
  if (keyed) remember(function, &key, v, binding);
  return run_variant(function, v, inputs, outputs, stream);
}

kiln_status_t kiln_function_call(kiln_function_t *function,
                                 const DLTensor *inputs, size_t input_count,
                                 DLTensor *outputs, size_t output_count) {
  if (!function)
    return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                            "kiln_function_call: function is NULL");
  return call_impl(function, inputs, input_count, outputs, output_count, NULL);
}

kiln_status_t kiln_function_call_async(kiln_function_t *function,
                                       const DLTensor *inputs,
                                       size_t input_count, DLTensor *outputs,
                                       size_t output_count, void *stream) {
  if (!function)
    return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                            "kiln_function_call_async: function is NULL");
  if (stream && !function->cuda)
    return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                            "kiln_function_call_async: a stream for graph @%s "
                            "compiled for target cpu; expected NULL",
                            function->graph->name);
  return call_impl(function, inputs, input_count, outputs, output_count,
                   stream);
}

//===--- kiln-allocated outputs -------------------------------------------===//

typedef struct {
  DLManagedTensor managed;
  int64_t shape[KILN_MAX_RANK];
  void *data;
  size_t capacity;  // bytes of `data`
} kiln_owned_tensor_t;

// Large outputs come from a pool of buffers released by earlier outputs, so
// a graph called in a loop writes into pages that are already mapped: a
// fresh 64 MB buffer from malloc is a new mmap, and its 16K first-touch page
// faults cost about as much as a memory-bound kernel itself. Buffers under
// the threshold come from malloc (its free lists already reuse them). The
// pool keeps at most KILN_OUTPUT_POOL_MB megabytes (default 1024; 0 turns it
// off), evicting the least recently released.
#define KILN_POOL_MIN_BYTES (256u << 10)
#define KILN_POOL_SLOTS 64

static struct {
  pthread_mutex_t lock;
  void *ptr[KILN_POOL_SLOTS];
  size_t cap[KILN_POOL_SLOTS];
  uint64_t tick[KILN_POOL_SLOTS];
  uint64_t clock;
  size_t bytes, limit;
  bool limit_read;
} out_pool = {PTHREAD_MUTEX_INITIALIZER, {0}, {0}, {0}, 0, 0, 0, false};

static void *pool_take(size_t bytes, size_t *capacity) {
  size_t cap = (bytes + 63) / 64 * 64 + 64;
  *capacity = cap;
  if (cap < KILN_POOL_MIN_BYTES) return aligned_alloc(64, cap);
  pthread_mutex_lock(&out_pool.lock);
  if (!out_pool.limit_read) {
    const char *env = getenv("KILN_OUTPUT_POOL_MB");
    long mb = env ? atol(env) : 1024;
    out_pool.limit = (size_t)(mb > 0 ? mb : 0) << 20;
    out_pool.limit_read = true;
  }
  int best = -1;
  for (int i = 0; i < KILN_POOL_SLOTS; ++i)
    if (out_pool.ptr[i] && out_pool.cap[i] >= cap &&
        out_pool.cap[i] <= cap + cap / 4 &&
        (best < 0 || out_pool.cap[i] < out_pool.cap[best]))
      best = i;
  void *p = NULL;
  if (best >= 0) {
    p = out_pool.ptr[best];
    *capacity = out_pool.cap[best];
    out_pool.bytes -= out_pool.cap[best];
    out_pool.ptr[best] = NULL;
  }
  pthread_mutex_unlock(&out_pool.lock);
  return p ? p : aligned_alloc(64, cap);
}

static void pool_give(void *p, size_t cap) {
  if (!p) return;
  if (cap < KILN_POOL_MIN_BYTES) {
    free(p);
    return;
  }
  void *evicted[KILN_POOL_SLOTS + 1];
  int n = 0;
  pthread_mutex_lock(&out_pool.lock);
  if (cap > out_pool.limit) {
    evicted[n++] = p;
    p = NULL;
  }
  // Make room: under the limit, and a free slot.
  while (p) {
    int empty = -1, oldest = -1;
    for (int i = 0; i < KILN_POOL_SLOTS; ++i) {
      if (!out_pool.ptr[i]) {
        if (empty < 0) empty = i;
      } else if (oldest < 0 || out_pool.tick[i] < out_pool.tick[oldest]) {
        oldest = i;
      }
    }
    if (empty >= 0 && out_pool.bytes + cap <= out_pool.limit) {
      out_pool.ptr[empty] = p;
      out_pool.cap[empty] = cap;
      out_pool.tick[empty] = ++out_pool.clock;
      out_pool.bytes += cap;
      break;
    }
    evicted[n++] = out_pool.ptr[oldest];
    out_pool.bytes -= out_pool.cap[oldest];
    out_pool.ptr[oldest] = NULL;
  }
  pthread_mutex_unlock(&out_pool.lock);
  for (int i = 0; i < n; ++i) free(evicted[i]);
}

static void owned_deleter(DLManagedTensor *self) {
  kiln_owned_tensor_t *t = (kiln_owned_tensor_t *)self;
  pool_give(t->data, t->capacity);
  free(t);
}

kiln_status_t kiln_function_call_alloc(kiln_function_t *function,
                                       const DLTensor *inputs,
                                       size_t input_count,
                                       DLManagedTensor **out_outputs,
                                       size_t output_count) {
  if (!function || (output_count && !out_outputs))
    return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                            "kiln_function_call_alloc: function and "
                            "out_outputs must not be NULL");
  for (size_t i = 0; i < output_count; ++i) out_outputs[i] = NULL;
  const kiln_graph_t *g = function->graph;
  if (function->cuda)
    return kiln_make_status(KILN_STATUS_UNSUPPORTED,
                            "graph @%s: kiln_function_call_alloc allocates "
                            "host memory; for target cuda pass device outputs "
                            "to kiln_function_call_async", g->name);
  if (output_count != (size_t)g->output_count)
    return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                            "graph @%s: room for %zu outputs; expected %d",
                            g->name, output_count, g->output_count);
  if (g->symbol_count > 256)
    return kiln_make_status(KILN_STATUS_UNSUPPORTED, "more than 256 symbols");
  int64_t binding[256];
  uint64_t mask;
  KILN_RETURN_IF_ERROR_PLAIN(
      bind_inputs(function, inputs, input_count, binding, &mask));
  if (g->mutation_count)
    KILN_RETURN_IF_ERROR_PLAIN(check_aliasing(g, inputs, input_count, NULL, 0));
  kiln_variant_t *v;
  KILN_RETURN_IF_ERROR_PLAIN(find_variant(function, binding, mask, &v));
  kiln_owned_tensor_t *owned[KILN_MAX_OUTPUTS] = {0};
  DLTensor outs[KILN_MAX_OUTPUTS];
  kiln_status_t s = NULL;
  for (size_t i = 0; i < output_count && !s; ++i) {
    kiln_type_t resolved = g->values[g->outputs[i]].type;
    for (int k = 0; k < resolved.rank; ++k)
      if (KILN_IS_SYM(resolved.dims[k]))
        resolved.dims[k] = binding[KILN_SYM_ID(resolved.dims[k])];
    const kiln_type_t *t = &resolved;
    kiln_owned_tensor_t *o = calloc(1, sizeof(*o));
    size_t bytes = (size_t)kiln_type_numel(t) * kiln_dtype_size(t->dtype);
    // 64-byte alignment: a cache line, and enough for any vector load.
    size_t capacity = 0;
    void *data = o ? pool_take(bytes, &capacity) : NULL;
    if (!o || !data) {
      free(o);
      free(data);
      s = kiln_make_status(KILN_STATUS_OUT_OF_MEMORY,
                           "output %zu: %zu bytes", i, bytes);
      break;
    }
    o->data = data;
    o->capacity = capacity;
    for (int k = 0; k < t->rank; ++k) o->shape[k] = t->dims[k];
    DLTensor *dl = &o->managed.dl_tensor;
    dl->data = data;
    dl->device.device_type = kDLCPU;
    dl->ndim = t->rank;
    dl->dtype = kiln_dtype_to_dl(t->dtype);
    dl->shape = o->shape;
    dl->strides = NULL;
    o->managed.deleter = owned_deleter;
    o->managed.manager_ctx = o;
    owned[i] = o;
    outs[i] = *dl;
  }
  if (!s) s = run_variant(function, v, inputs, outs, NULL);
  if (s) {
    for (size_t i = 0; i < output_count; ++i)
      if (owned[i]) owned_deleter(&owned[i]->managed);
    return s;
  }
  for (size_t i = 0; i < output_count; ++i) out_outputs[i] = &owned[i]->managed;
  return NULL;
}

//===--- reference interpreter and inspection -----------------------------===//

kiln_status_t kiln_graph_interpret(const kiln_graph_t *graph,
                                   const DLTensor *inputs, size_t input_count,
                                   DLTensor *outputs, size_t output_count) {
  if (!graph)
    return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                            "kiln_graph_interpret: graph is NULL");
  if (input_count != (size_t)graph->input_count ||
      output_count != (size_t)graph->output_count ||
      (input_count && !inputs) || (output_count && !outputs))
    return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                            "graph @%s: %zu inputs and %zu outputs given; "
                            "expected %d and %d",
                            graph->name, input_count, output_count,
                            graph->input_count, graph->output_count);
  int64_t binding[256];
  if (graph->symbol_count > 256)
    return kiln_make_status(KILN_STATUS_UNSUPPORTED, "more than 256 symbols");
  KILN_RETURN_IF_ERROR(kiln_graph_check_symbols(graph), "reference interpreter");
  for (int i = 0; i < graph->symbol_count; ++i) binding[i] = -1;
  for (size_t i = 0; i < input_count; ++i)
    KILN_RETURN_IF_ERROR(check_tensor(graph, "input", i, &inputs[i],
                                      &graph->values[graph->inputs[i]].type,
                                      binding, false, kDLCPU),
                         "reference interpreter, graph @%s", graph->name);
  if (graph->symbol_count)
    KILN_RETURN_IF_ERROR(kiln_graph_resolve_binding(graph, binding),
                         "reference interpreter, graph @%s", graph->name);
  kiln_graph_t *spec = NULL;
  if (graph->symbol_count)
    KILN_RETURN_IF_ERROR_PLAIN(kiln_graph_specialize(graph, binding, &spec));
  const kiln_graph_t *g = spec ? spec : graph;
  kiln_status_t s = NULL;
  for (size_t i = 0; i < output_count && !s; ++i) {
    int64_t scratch[1] = {0};
    s = check_tensor(g, "output", i, &outputs[i],
                     &g->values[g->outputs[i]].type, scratch, true, kDLCPU);
  }
  if (!s) s = check_aliasing(g, inputs, input_count, outputs, output_count);
  if (!s) s = kiln_ref_run(g, inputs, outputs);
  kiln_graph_free(spec);
  return s;
}

static bool looks_like_graph(const char *text, size_t length) {
  size_t i = 0;
  for (;;) {
    while (i < length && (text[i] == ' ' || text[i] == '\n' ||
                          text[i] == '\t' || text[i] == '\r'))
      i++;
    if (i < length && (text[i] == '#' ||
                       (text[i] == '/' && i + 1 < length && text[i + 1] == '/'))) {
      while (i < length && text[i] != '\n') i++;
      continue;
    }
    break;
  }
  return length - i >= 5 && memcmp(text + i, "graph", 5) == 0;
}

kiln_status_t kiln_emit(kiln_context_t *context, const char *text,
                        size_t length, const char *name,
                        const kiln_compile_options_t *options,
                        kiln_stage_t stop, char **out_text) {
  if (!out_text)
    return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                            "kiln_emit: out_text is NULL");
  *out_text = NULL;
  if (!context || !text)
    return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                            "kiln_emit: context and text must not be NULL");
  if ((unsigned)stop >= KILN_STAGE_COUNT)
    return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                            "kiln_emit: stage %d out of range", (int)stop);
  kiln_compile_options_t opts;
  kiln_compile_options_init(&opts);
  if (options) opts = *options;
  // Printing GPU code needs no GPU: the architecture is the device's when
  // there is one, else sm_90.
  bool cuda = opts.target && strcmp(opts.target, "cuda") == 0;
  if (!cuda) KILN_RETURN_IF_ERROR_PLAIN(check_target(&opts));
  char chip[16] = "sm_90";
  int major = 0, minor = 0;
  kiln_status_t as = cuda ? kiln_cuda_device_arch(0, &major, &minor) : NULL;
  if (cuda && !as) snprintf(chip, sizeof(chip), "sm_%d%d", major, minor);
  kiln_status_free(as);
  char *mlir_text = NULL;
  kiln_lower_options_t lopts = {!cuda && strstr(kiln_jit_host_id(), "+avx512bf16"),
                                cuda, !cuda, !cuda, true, !cuda, !cuda, cuda};
  lopts.x86_amx = lopts.x86_bf16_dot && kiln_jit_amx_available();
  lopts.cuda_sm = cuda ? atoi(chip + 3) : 0;
  lopts.x86_f32_dot = !cuda && f32_dot_enabled();
  lopts.fused_attention = !cuda && fused_attention_enabled();
  if (looks_like_graph(text, length)) {
    kiln_graph_t *g = NULL;
    KILN_RETURN_IF_ERROR_PLAIN(kiln_graph_parse_text(text, length, name, &g));
    kiln_status_t s = stop == KILN_STAGE_GRAPH
                          ? kiln_graph_print_text(g, out_text)
                          : kiln_lower_to_linalg(g, NULL, &lopts, &mlir_text);
    kiln_graph_free(g);
    if (s || stop == KILN_STAGE_GRAPH) return s;
  } else {
    if (stop == KILN_STAGE_GRAPH)
      return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                              "kiln_emit: MLIR input cannot be printed as a "
                              "graph; expected a stage after 'graph'");
    mlir_text = malloc(length + 1);
    if (!mlir_text) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "emit");
    memcpy(mlir_text, text, length);
    mlir_text[length] = 0;
  }
  kiln_mlir_t *mlir = NULL;
  kiln_status_t s = acquire_mlir(context, &mlir, NULL);
  if (s) {
    free(mlir_text);
    return s;
  }
  MlirModule mod = {NULL};
  s = kiln_mlir_parse(mlir, mlir_text, &mod);
  kiln_kernel_tiling_t tiling = {{0}, NULL, NULL};
  cpu_target(resolve_threads(opts.num_threads), &tiling.target);
  kiln_pipeline_options_t popts = {opts.vectorize, tiling.target.threads,
                                   NULL, NULL, &tiling};
  if (cuda) popts.threads = 1;
  if (!s && cuda && stop > KILN_STAGE_BUFFERIZED) {
    kiln_gpu_program_t program;
    s = kiln_pipeline_run_gpu(mlir, mod, chip, &popts, &program);
    kiln_gpu_program_free(&program);
  } else if (!s) {
    s = kiln_pipeline_run(mlir, mod, KILN_STAGE_LINALG, stop, &popts);
  }
  if (!s) s = kiln_mlir_print(mod, out_text);
  if (!mlirModuleIsNull(mod)) mlirModuleDestroy(mod);
  release_mlir(context, mlir);
  free(mlir_text);
  return s;
}
