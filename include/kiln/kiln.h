// kiln — a compiler backend for torch.compile, usable from C.
//
// Licensed under the Apache License v2.0 with LLVM Exceptions.
//
//===----------------------------------------------------------------------===//
// The whole public API of libkiln. It compiles as C11 and as C++.
//
// Ownership rules (they hold for every function below):
//  - `kiln_*_create` / `kiln_*_parse` / `kiln_*_compile` return an object the
//    caller owns and must release with the matching `_destroy` / `_release`.
//  - `_get` borrows: the result lives as long as the object it came from.
//  - Out-parameters are named `out_*`; they are cleared on entry and written
//    only on success.
//  - Strings returned through `char **out_*` are owned by the caller and freed
//    with `kiln_free`.
//
// Errors: every function that can fail returns `kiln_status_t`. NULL means
// success; anything else is a status the caller owns and frees with
// `kiln_status_free` (or `kiln_status_ignore`). Nothing in libkiln aborts or
// exits the process; bad input is reported through a status whose message
// names the op, the operand, the shapes and what was expected.
//
// Threads: a `kiln_context_t` may be used from several threads at once, as may
// a `kiln_function_t` (concurrent `kiln_function_call`s are supported).
// A `kiln_graph_t` is immutable after parsing and may be shared read-only.
//===----------------------------------------------------------------------===//

#ifndef KILN_KILN_H_
#define KILN_KILN_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <dlpack/dlpack.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(KILN_BUILDING_LIBRARY)
#define KILN_API __attribute__((visibility("default")))
#else
#define KILN_API
#endif

#define KILN_VERSION_MAJOR 0
#define KILN_VERSION_MINOR 1
#define KILN_VERSION_PATCH 0

// The largest tensor rank kiln accepts.
#define KILN_MAX_RANK 8
// Tensors of one graph: outputs, and inputs plus outputs (an optimizer step
// over a large model has thousands of inputs).
#define KILN_MAX_OUTPUTS 512
#define KILN_MAX_TENSORS 16384

// DLPack 0.6 (Debian's libdlpack-dev) predates kDLBool; PyTorch exports bool
// tensors with this type code (DLPack >= 0.8) and 8 bits.
#define KILN_DL_BOOL 6

// "major.minor.patch" of this build.
KILN_API const char *kiln_version_string(void);

//===--- status -----------------------------------------------------------===//

typedef enum kiln_status_code_e {
  KILN_STATUS_OK = 0,
  KILN_STATUS_INVALID_ARGUMENT = 1,  // bad input from the caller
  KILN_STATUS_PARSE_ERROR = 2,       // malformed graph text
  KILN_STATUS_VERIFY_ERROR = 3,      // graph is well formed but ill typed
  KILN_STATUS_UNSUPPORTED = 4,       // valid, but kiln cannot compile it
  KILN_STATUS_COMPILE_ERROR = 5,     // MLIR/LLVM failed on a valid graph
  KILN_STATUS_UNAVAILABLE = 6,       // target not present (no CUDA device)
  KILN_STATUS_OUT_OF_MEMORY = 7,
  KILN_STATUS_INTERNAL = 8,
} kiln_status_code_t;

// NULL is OK; a non-NULL status carries a code and a message.
typedef struct kiln_status_payload *kiln_status_t;

// The code of `status` (KILN_STATUS_OK for NULL).
KILN_API kiln_status_code_t kiln_status_code(kiln_status_t status);
// The message of `status`, borrowed ("" for NULL). Valid until freed.
KILN_API const char *kiln_status_message(kiln_status_t status);
// The name of a code, e.g. "INVALID_ARGUMENT". Static storage.
KILN_API const char *kiln_status_code_name(kiln_status_code_t code);
// Frees `status`; NULL is allowed.
KILN_API void kiln_status_free(kiln_status_t status);

// Frees memory libkiln handed to the caller (strings). NULL is allowed.
KILN_API void kiln_free(void *ptr);

//===--- context ----------------------------------------------------------===//

// Owns the MLIR context and everything compiled in it.
typedef struct kiln_context kiln_context_t;

typedef struct kiln_context_options_t {
  // Directory to write the IR after every pipeline stage into; NULL reads the
  // KILN_DUMP_DIR environment variable (unset: no dumps). While dumping,
  // variants are compiled even when the compile cache holds them.
  const char *dump_dir;
  // The persistent compile cache: its directory (NULL: $KILN_CACHE_DIR, else
  // ~/.cache/kiln), its size cap in bytes (0: 1 GiB), and a switch to turn it
  // off (also KILN_CACHE=0). When the directory cannot be used the cache is
  // off and KILN_LOG=cache says why.
  const char *cache_dir;
  uint64_t cache_max_bytes;
  int disable_cache;
} kiln_context_options_t;

KILN_API void kiln_context_options_init(kiln_context_options_t *options);

// Creates a context. `options` may be NULL for the defaults.
KILN_API kiln_status_t kiln_context_create(
    const kiln_context_options_t *options, kiln_context_t **out_context);
// Destroys `context`. Every graph and function made in it must be released
// first; destroying a context with live functions is a programmer error.
KILN_API void kiln_context_destroy(kiln_context_t *context);

// Compile statistics of a context (KILN_LOG=stats prints them per compile).
typedef struct kiln_stats_t {
  uint64_t compiles;        // variants compiled through MLIR and LLVM
  uint64_t cache_hits;      // variants loaded from the compile cache
  uint64_t cache_misses;    // lookups that found nothing usable
  uint64_t cache_rejected;  // corrupt/foreign entries discarded and rebuilt
  double lower_seconds;     // graph -> linalg text
  double mlir_seconds;      // parsing and the MLIR pass pipeline
  double llvm_seconds;      // LLVM codegen and JIT linking
  double cache_seconds;     // reading, loading and writing cache entries
  uint64_t tune_measured;   // autotuning: configurations compiled and timed
  uint64_t tune_db_hits;    // kernels whose tiles came from the tuning database
  double tune_seconds;      // time spent searching
  uint64_t graph_records;   // cuda_graphs: calls that recorded a CUDA graph
  uint64_t graph_replays;   // cuda_graphs: calls that replayed a recorded one
} kiln_stats_t;

KILN_API void kiln_context_stats(kiln_context_t *context, kiln_stats_t *out);

// All valid compile-cache entries as one buffer (caller frees with
// kiln_free), and back into this context's cache directory (invalid records
// are skipped; *out_count says how many were stored). They mirror
// torch.compiler.save_cache_artifacts / load_cache_artifacts.
KILN_API kiln_status_t kiln_context_cache_export(kiln_context_t *context,
                                                 void **out_data,
                                                 size_t *out_size);
KILN_API kiln_status_t kiln_context_cache_import(kiln_context_t *context,
                                                 const void *data, size_t size,
                                                 int *out_count);

//===--- graphs -----------------------------------------------------------===//

// A verified graph: inputs, ops, outputs, with every value typed. The text
// format is specified in docs/graph-format.md.
typedef struct kiln_graph kiln_graph_t;

// The type of one tensor: dtype, rank and sizes. A size of
// KILN_DIM_SYMBOLIC marks a symbolic dimension (its name is in the graph).
#define KILN_DIM_SYMBOLIC INT64_MIN
typedef struct kiln_tensor_type_t {
  DLDataType dtype;
  int32_t rank;
  int64_t shape[KILN_MAX_RANK];
} kiln_tensor_type_t;

// Parses and verifies graph text. `name` is used in error messages
// ("name:line:col: ..."); it may be NULL. Parse errors carry line:column and
// what was expected; verifier errors name the op, the operand and the shapes.
KILN_API kiln_status_t kiln_graph_parse(kiln_context_t *context,
                                        const char *text, size_t length,
                                        const char *name,
                                        kiln_graph_t **out_graph);
KILN_API void kiln_graph_destroy(kiln_graph_t *graph);

// Prints `graph` in the text format; parsing the result gives an equal graph.
KILN_API kiln_status_t kiln_graph_print(const kiln_graph_t *graph,
                                        char **out_text);

KILN_API size_t kiln_graph_input_count(const kiln_graph_t *graph);
KILN_API size_t kiln_graph_output_count(const kiln_graph_t *graph);
// Declared type of input `i` / output `i` (symbolic dims as
// KILN_DIM_SYMBOLIC). Fails on an out-of-range index.
KILN_API kiln_status_t kiln_graph_input_type(const kiln_graph_t *graph,
                                             size_t i,
                                             kiln_tensor_type_t *out_type);
KILN_API kiln_status_t kiln_graph_output_type(const kiln_graph_t *graph,
                                              size_t i,
                                              kiln_tensor_type_t *out_type);

// Nonzero when the graph writes input `i` (`return %v -> %x` in the text): a
// call stores the new value into that input's tensor after reading every
// input as it was. Optimizer steps update parameters and their state this
// way. 0 for an out-of-range index.
KILN_API int kiln_graph_input_mutated(const kiln_graph_t *graph, size_t i);

// The name of the symbolic size in dim `dim` of input `i` ("s0", or a
// product such as "128*s0": a constant times symbols), borrowed from the
// graph; NULL when that size is static or the indices are out of range.
KILN_API const char *kiln_graph_input_dim_symbol(const kiln_graph_t *graph,
                                                 size_t i, int32_t dim);

// Runs `graph` with the reference interpreter: plain loops, accumulating in
// double. Slow and obviously correct; it is the oracle for tests. Inputs may
// be strided; outputs must be contiguous CPU tensors of the output types.
// Mutated inputs are written, as by kiln_function_call.
KILN_API kiln_status_t kiln_graph_interpret(const kiln_graph_t *graph,
                                            const DLTensor *inputs,
                                            size_t input_count,
                                            DLTensor *outputs,
                                            size_t output_count);

//===--- compilation ------------------------------------------------------===//

// Pipeline stages, in order. `kiln_emit` stops after one and prints it.
typedef enum kiln_stage_e {
  KILN_STAGE_GRAPH = 0,       // the verified kiln graph
  KILN_STAGE_LINALG = 1,      // linalg on tensors, as lowered from the graph
  KILN_STAGE_FUSED = 2,       // after elementwise fusion and cleanup
  KILN_STAGE_VECTORIZED = 3,  // after tiling and vectorization (tensors)
  KILN_STAGE_BUFFERIZED = 4,  // after one-shot bufferization
  KILN_STAGE_LOOPS = 5,       // after lowering linalg to scf loops
  KILN_STAGE_LLVM = 6,        // the LLVM dialect
  KILN_STAGE_COUNT = 7,
} kiln_stage_t;

// Name of a stage ("graph", "linalg", ...), static storage.
KILN_API const char *kiln_stage_name(kiln_stage_t stage);
// Parses a stage name; fails listing the valid names.
KILN_API kiln_status_t kiln_stage_parse(const char *name,
                                        kiln_stage_t *out_stage);

// How a graph with symbolic sizes is compiled.
typedef enum kiln_dynamic_e {
  // Specialize the first sizes seen; when a symbol is seen with a second
  // value, compile a variant where it stays symbolic (serving every later
  // value). Past `max_variants`, only fully symbolic variants are made.
  KILN_DYNAMIC_AUTO = 0,
  // One symbolic variant from the first call (torch's dynamic=True).
  KILN_DYNAMIC_ALWAYS = 1,
  // A specialized variant per distinct set of sizes, up to `max_variants`.
  KILN_DYNAMIC_NEVER = 2,
} kiln_dynamic_t;

// How tile sizes are chosen.
typedef enum kiln_autotune_e {
  // A heuristic per kernel (distribution tiles from the workload and the
  // thread count, register tiles from the vector register file); nothing is
  // measured. torch.compile's mode=None / "default".
  KILN_AUTOTUNE_HEURISTIC = 0,
  // A measured search on the variant's real shapes: candidates for every
  // sizeable kernel are compiled and timed, within the time budget; results
  // go to the tuning database (in the compile cache directory) and are
  // reused by later compiles and processes. mode="max-autotune".
  KILN_AUTOTUNE_MEASURE = 1,
} kiln_autotune_t;

typedef struct kiln_compile_options_t {
  // "cpu" (the default when NULL) or "cuda" (an NVIDIA GPU, device 0; answers
  // KILN_STATUS_UNAVAILABLE "no CUDA device: ..." where there is none).
  const char *target;
  // LLVM optimization level, 0..3 (default 3).
  int opt_level;
  // Vectorize with the kernel schedules in kernels/ (default 1).
  int vectorize;
  // Policy for symbolic sizes (default KILN_DYNAMIC_AUTO).
  kiln_dynamic_t dynamic;
  // Variants one function may hold (default 8); past it only fully symbolic
  // variants are compiled, so a call never fails for lack of room.
  int max_variants;
  // Threads a kernel may use (OpenMP): 0 = every CPU the process may run on
  // (its affinity mask; the default), 1 = single-threaded. KILN_NUM_THREADS
  // overrides the default.
  int num_threads;
  // Tile-size choice (default KILN_AUTOTUNE_HEURISTIC) and, for
  // KILN_AUTOTUNE_MEASURE, the search budget per variant in seconds (0: 20).
  // KILN_LOG=autotune, or stderr being a terminal, shows the search's
  // progress.
  kiln_autotune_t autotune;
  double autotune_budget_seconds;
  // Target cuda: record each call's launches as a CUDA graph and replay it
  // (one cuGraphLaunch per call; torch.compile's mode="reduce-overhead").
  // Graphs are keyed by the call's buffer addresses: a call with the
  // addresses of an earlier one replays its graph, other addresses record
  // again (a few per variant are kept, the least recently used is updated in
  // place). Temporaries become per-graph device buffers. Default 0.
  int cuda_graphs;
  // CPU: the inputs the first calls will pass with strides other than
  // contiguous, one entry per graph input (NULL: all contiguous). The
  // variant kiln_function_compile compiles for a static graph takes these
  // layouts, so a first call with them compiles nothing more
  // (torch.compile's backward graphs read saved activations through
  // transposed views). Read during kiln_function_compile only.
  const bool *input_strided;
} kiln_compile_options_t;

KILN_API void kiln_compile_options_init(kiln_compile_options_t *options);

// A compiled graph: callable with DLPack tensors. Reference counted.
typedef struct kiln_function kiln_function_t;

// Compiles `graph` for `options->target`. Graphs with only static sizes are
// compiled now; a graph with symbolic sizes is compiled on first call, with
// later variants as `options->dynamic` says. KILN_LOG=recompiles prints every
// new variant with the guard that failed. The function keeps what it needs of
// `graph`; the graph may be destroyed afterwards.
KILN_API kiln_status_t kiln_function_compile(
    kiln_context_t *context, const kiln_graph_t *graph,
    const kiln_compile_options_t *options, kiln_function_t **out_function);
KILN_API void kiln_function_retain(kiln_function_t *function);
KILN_API void kiln_function_release(kiln_function_t *function);

// Output types for the given input types (symbolic dims bound from them).
// `out_types` has room for kiln_graph_output_count entries.
KILN_API kiln_status_t kiln_function_output_types(
    kiln_function_t *function, const DLTensor *inputs, size_t input_count,
    kiln_tensor_type_t *out_types, size_t output_count);

// Calls `function` with caller-provided outputs. Inputs may have any strides
// (NULL strides means contiguous); outputs must have the output types. Inputs
// and outputs must not overlap. An input the graph writes
// (kiln_graph_input_mutated) receives its new value in place; it must not
// overlap any other input or output, nor itself (no zero strides). Checks
// every dtype, rank, size, device and pointer first and names the first
// mismatch; on failure nothing is written.
// Thread-safe.
KILN_API kiln_status_t kiln_function_call(kiln_function_t *function,
                                          const DLTensor *inputs,
                                          size_t input_count,
                                          DLTensor *outputs,
                                          size_t output_count);

// Number of compiled variants (for tests and statistics).
KILN_API int kiln_function_variant_count(kiln_function_t *function);

// Calls `function` on a CUDA stream (a CUstream; NULL: the legacy default
// stream): inputs and outputs are device tensors (kDLCUDA) of the device the
// function was compiled for (device 0), contiguous; the kernels are queued
// on `stream` and the call returns without waiting for them. For target cpu
// `stream` must be NULL and this is kiln_function_call.
KILN_API kiln_status_t kiln_function_call_async(
    kiln_function_t *function, const DLTensor *inputs, size_t input_count,
    DLTensor *outputs, size_t output_count, void *stream);

// Calls `function` and allocates its outputs. On success `out_outputs[i]`
// holds a tensor the caller owns; release it with its `deleter`
// (`out_outputs[i]->deleter(out_outputs[i])`). Thread-safe.
KILN_API kiln_status_t kiln_function_call_alloc(
    kiln_function_t *function, const DLTensor *inputs, size_t input_count,
    DLManagedTensor **out_outputs, size_t output_count);

//===--- inspection ---------------------------------------------------------===//

// Lowers `text` (graph text, or MLIR at the linalg stage or later) through the
// pipeline for `options->target` and prints the IR after `stop`. This is what
// kiln-opt runs, and what KILN_DUMP_DIR writes at every stage.
KILN_API kiln_status_t kiln_emit(kiln_context_t *context, const char *text,
                                 size_t length, const char *name,
                                 const kiln_compile_options_t *options,
                                 kiln_stage_t stop, char **out_text);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // KILN_KILN_H_
