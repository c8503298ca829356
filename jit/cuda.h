// jit/cuda: kiln's CUDA runtime on the driver API.
//
// libcuda.so.1 is loaded with dlopen on first use, through one table of
// entry points, so libkiln loads and runs on machines without a GPU and
// answers KILN_STATUS_UNAVAILABLE ("no CUDA device: ...") when the GPU
// target is asked for. Every driver error becomes a kiln status naming the
// call and the CUDA error (cuGetErrorName). Work goes to the stream the
// caller passes (PyTorch's current stream); nothing synchronizes the device.
//
// Knows CUDA, nothing of kiln graphs or MLIR. The mgpu* entry points that MLIR
// 22.1's host code calls (gpu-to-llvm) are implemented on the same table and
// listed by kiln_cuda_mgpu_symbols() for the JIT to resolve.
#ifndef KILN_JIT_CUDA_H_
#define KILN_JIT_CUDA_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lib/base/base.h"

// NULL when a CUDA device is usable; otherwise why not (UNAVAILABLE). The
// driver is loaded and initialized once per process.
kiln_status_t kiln_cuda_available(void);
// Compute capability of `device` (9.0 for H100/H200).
kiln_status_t kiln_cuda_device_arch(int device, int *major, int *minor);
// The device's name ("NVIDIA H100 80GB HBM3"), NUL-terminated in `buf`.
kiln_status_t kiln_cuda_device_name(int device, char *buf, size_t len);
// Makes the primary context of `device` current on this thread (the one
// PyTorch uses).
kiln_status_t kiln_cuda_use_device(int device);

typedef struct kiln_cuda_module kiln_cuda_module_t;
// Loads PTX (NUL-terminated) into the current context; the driver JITs it
// for the device.
kiln_status_t kiln_cuda_module_load_ptx(const char *ptx,
                                        kiln_cuda_module_t **out_module);
void kiln_cuda_module_unload(kiln_cuda_module_t *module);
kiln_status_t kiln_cuda_module_function(kiln_cuda_module_t *module,
                                        const char *name, void **out_fn);

// Lets `fn` launch with `bytes` of dynamic shared memory (above 48 KB a
// kernel must opt in: cuFuncSetAttribute); nothing to do at or below.
kiln_status_t kiln_cuda_function_reserve_shared(void *fn, uint32_t bytes);

// Launches `fn` on `stream` (NULL: the legacy default stream) with
// `params` (one pointer per kernel parameter).
kiln_status_t kiln_cuda_launch(void *fn, const uint32_t grid[3],
                               const uint32_t block[3], uint32_t shared_bytes,
                               void *stream, void **params);

// A TMA tensor map (cuTensorMapEncodeTiled) of `rank` dims at `base`:
// sizes, strides in bytes (strides[0], the element size, is implied) and
// the box a load moves, all innermost first; `swizzle` the shared-memory
// swizzle span in bytes (0, 32, 64, 128), `l2promo` the L2 promotion in
// bytes (0, 64, 128, 256); no interleave, out-of-bounds elements zero.
// Written to `map`: 128 bytes, 64-byte aligned, passed to a kernel by
// value. Host-only work (no stream, safe while capturing a CUDA graph).
typedef enum kiln_cuda_elem_e {
  KILN_CUDA_ELEM_F16 = 0,
  KILN_CUDA_ELEM_BF16 = 1,
  KILN_CUDA_ELEM_F32 = 2,
} kiln_cuda_elem_t;
#define KILN_CUDA_TENSOR_MAP_BYTES 128
kiln_status_t kiln_cuda_tensor_map(void *map, kiln_cuda_elem_t elem, int rank, void *base,
                                   const int64_t *dims, const int64_t *strides,
                                   const int32_t *box, int swizzle, int l2promo);

// Device memory, stream-ordered (cuMemAllocAsync / cuMemFreeAsync) where
// the driver has it, else cuMemAlloc / cuMemFree.
kiln_status_t kiln_cuda_alloc(size_t bytes, void *stream, void **out_ptr);
void kiln_cuda_free(void *ptr, void *stream);
// Stream-ordered copy in either direction (unified addressing).
kiln_status_t kiln_cuda_memcpy(void *dst, const void *src, size_t bytes,
                               void *stream);
kiln_status_t kiln_cuda_stream_synchronize(void *stream);
// Stream-ordered: every byte of dst[0, bytes) set to `byte`.
kiln_status_t kiln_cuda_memset(void *dst, unsigned char byte, size_t bytes, void *stream);
// Device memory that outlives streams (a CUDA graph's temporaries):
// cuMemAlloc / cuMemFree.
kiln_status_t kiln_cuda_alloc_static(size_t bytes, void **out_ptr);
void kiln_cuda_free_static(void *ptr);
// Host-to-device copy, complete on the device when it returns (constants,
// once per loaded program).
kiln_status_t kiln_cuda_upload(void *dst, const void *src, size_t bytes);

// CUDA graphs. Recording: kiln_cuda_capture_begin gives a private stream
// whose launches and copies (queued by this thread) are recorded, not run;
// kiln_cuda_capture_end stops it and, when `keep`, makes the recording into
// `*graph` -- a new executable graph when *graph is NULL, else *graph
// updated in place (`*updated`; cuGraphExecUpdate, cheap: same launches,
// other pointers) or rebuilt (after waiting for the old executable's
// latest launch, so memory the two share is never used by both at once).
// When instantiation fails, *graph is destroyed and NULL; after other
// failures the caller destroys it. A graph launch runs the whole recording on
// `stream` as one unit; launches of one graph are ordered with each other.
typedef struct kiln_cuda_graph kiln_cuda_graph_t;
// Each graph has an event recorded after its latest launch:
// kiln_cuda_graph_wait blocks the host until that launch has finished (for
// reusing memory a previous executable of the graph may still touch).
kiln_status_t kiln_cuda_capture_begin(void **out_stream);
kiln_status_t kiln_cuda_capture_end(void *stream, bool keep,
                                    kiln_cuda_graph_t **graph, bool *updated);
kiln_status_t kiln_cuda_graph_launch(kiln_cuda_graph_t *graph, void *stream);
kiln_status_t kiln_cuda_graph_wait(kiln_cuda_graph_t *graph);
// Waits for the graph's latest launch, then frees it.
void kiln_cuda_graph_destroy(kiln_cuda_graph_t *graph);

// The mgpu* runtime functions MLIR's generated host code calls, by name,
// for the JIT's symbol table. *out_count entries, static storage.
typedef struct kiln_cuda_symbol {
  const char *name;
  void *address;
} kiln_cuda_symbol_t;
const kiln_cuda_symbol_t *kiln_cuda_mgpu_symbols(int *out_count);

#endif  // KILN_JIT_CUDA_H_
