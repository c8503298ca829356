// kiln's CUDA runtime: the driver API through dlopen, kiln statuses, and the
// mgpu* entry points of MLIR's host code.
#include "jit/cuda.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef KILN_HAVE_CUDA_H
#include <cuda.h>

// The driver entry points kiln uses, resolved once from libcuda.so.1 (the
// exported names: the _v2 variants where cuda.h maps to them).
#define KILN_CUDA_FUNCTIONS(X)                                                \
  X(cuInit, CUresult, (unsigned int))                                         \
  X(cuGetErrorName, CUresult, (CUresult, const char **))                      \
  X(cuDeviceGetCount, CUresult, (int *))                                      \
  X(cuDeviceGet, CUresult, (CUdevice *, int))                                 \
  X(cuDeviceGetName, CUresult, (char *, int, CUdevice))                       \
  X(cuDeviceGetAttribute, CUresult, (int *, CUdevice_attribute, CUdevice))    \
  X(cuDevicePrimaryCtxRetain, CUresult, (CUcontext *, CUdevice))              \
  X(cuCtxGetCurrent, CUresult, (CUcontext *))                                 \
  X(cuCtxSetCurrent, CUresult, (CUcontext))                                   \
  X(cuModuleLoadData, CUresult, (CUmodule *, const void *))                   \
  X(cuModuleLoadDataEx, CUresult,                                             \
    (CUmodule *, const void *, unsigned int, CUjit_option *, void **))        \
  X(cuModuleUnload, CUresult, (CUmodule))                                     \
  X(cuModuleGetFunction, CUresult, (CUfunction *, CUmodule, const char *))    \
  X(cuFuncSetAttribute, CUresult, (CUfunction, CUfunction_attribute, int))    \
  X(cuLaunchKernel, CUresult,                                                 \
    (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,  \
     unsigned, CUstream, void **, void **))                                   \
  X(cuStreamCreate, CUresult, (CUstream *, unsigned int))                     \
  X(cuStreamSynchronize, CUresult, (CUstream))                                \
  X(cuStreamDestroy_v2, CUresult, (CUstream))                                 \
  X(cuStreamWaitEvent, CUresult, (CUstream, CUevent, unsigned int))           \
  X(cuEventCreate, CUresult, (CUevent *, unsigned int))                       \
  X(cuEventRecord, CUresult, (CUevent, CUstream))                             \
  X(cuEventSynchronize, CUresult, (CUevent))                                  \
  X(cuEventDestroy_v2, CUresult, (CUevent))                                   \
  X(cuMemAlloc_v2, CUresult, (CUdeviceptr *, size_t))                         \
  X(cuMemFree_v2, CUresult, (CUdeviceptr))                                    \
  X(cuMemAllocManaged, CUresult, (CUdeviceptr *, size_t, unsigned int))       \
  X(cuMemcpyAsync, CUresult, (CUdeviceptr, CUdeviceptr, size_t, CUstream))    \
  X(cuMemcpyHtoD_v2, CUresult, (CUdeviceptr, const void *, size_t))           \
  X(cuCtxSynchronize, CUresult, (void))                                       \
  X(cuMemsetD32Async, CUresult, (CUdeviceptr, unsigned int, size_t, CUstream)) \
  X(cuMemsetD16Async, CUresult,                                               \
    (CUdeviceptr, unsigned short, size_t, CUstream))                          \
  X(cuMemsetD8Async, CUresult, (CUdeviceptr, unsigned char, size_t, CUstream))

static struct {
#define X(name, ret, args) ret(*name) args;
  KILN_CUDA_FUNCTIONS(X)
#undef X
} cu;

// Optional entry points (stream-ordered allocation and memory pools, CUDA
// 11.2+).
static CUresult (*cuMemAllocAsync_)(CUdeviceptr *, size_t, CUstream);
static CUresult (*cuMemFreeAsync_)(CUdeviceptr, CUstream);
static CUresult (*cuMemPoolCreate_)(CUmemoryPool *, const CUmemPoolProps *);
static CUresult (*cuMemPoolSetAttribute_)(CUmemoryPool, CUmemPool_attribute, void *);
static CUresult (*cuMemAllocFromPoolAsync_)(CUdeviceptr *, size_t, CUmemoryPool,
                                            CUstream);
static CUresult (*cuCtxGetDevice_)(CUdevice *);
// TMA tensor maps (CUDA 12.0+).
static CUresult (*cuTensorMapEncodeTiled_)(CUtensorMap *, CUtensorMapDataType, cuuint32_t,
                                           void *, const cuuint64_t *, const cuuint64_t *,
                                           const cuuint32_t *, const cuuint32_t *,
                                           CUtensorMapInterleave, CUtensorMapSwizzle,
                                           CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// CUDA graphs (stream capture, in-place update: CUDA 12.0+); optional, so an
// older driver still runs kernels and only graph recording is UNAVAILABLE.
#define KILN_CUDA_GRAPH_FUNCTIONS(X)                                          \
  X(cuStreamBeginCapture_v2, CUresult, (CUstream, CUstreamCaptureMode))       \
  X(cuStreamEndCapture, CUresult, (CUstream, CUgraph *))                      \
  X(cuGraphInstantiateWithFlags, CUresult,                                    \
    (CUgraphExec *, CUgraph, unsigned long long))                             \
  X(cuGraphExecUpdate_v2, CUresult,                                           \
    (CUgraphExec, CUgraph, CUgraphExecUpdateResultInfo *))                    \
  X(cuGraphLaunch, CUresult, (CUgraphExec, CUstream))                         \
  X(cuGraphDestroy, CUresult, (CUgraph))                                      \
  X(cuGraphExecDestroy, CUresult, (CUgraphExec))

static struct {
#define X(name, ret, args) ret(*name) args;
  KILN_CUDA_GRAPH_FUNCTIONS(X)
#undef X
  bool present;
} cug;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static char load_error[512];  // empty when the driver and a device are there

static void load_driver(void) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    snprintf(load_error, sizeof(load_error),
             "no CUDA device: libcuda.so.1 cannot be loaded (%s)", dlerror());
    return;
  }
#define X(name, ret, args)                                                    \
  cu.name = (ret(*) args)dlsym(h, #name);                                     \
  if (!cu.name) {                                                             \
    snprintf(load_error, sizeof(load_error),                                  \
             "no CUDA device: libcuda.so.1 lacks %s (driver too old)", #name); \
    return;                                                                   \
  }
  KILN_CUDA_FUNCTIONS(X)
#undef X
  cuMemAllocAsync_ = (CUresult(*)(CUdeviceptr *, size_t, CUstream))dlsym(h, "cuMemAllocAsync");
  cuMemFreeAsync_ = (CUresult(*)(CUdeviceptr, CUstream))dlsym(h, "cuMemFreeAsync");
  *(void **)&cuMemPoolCreate_ = dlsym(h, "cuMemPoolCreate");
  *(void **)&cuMemPoolSetAttribute_ = dlsym(h, "cuMemPoolSetAttribute");
  *(void **)&cuMemAllocFromPoolAsync_ = dlsym(h, "cuMemAllocFromPoolAsync");
  *(void **)&cuCtxGetDevice_ = dlsym(h, "cuCtxGetDevice");
  *(void **)&cuTensorMapEncodeTiled_ = dlsym(h, "cuTensorMapEncodeTiled");
  cug.present = true;
#define X(name, ret, args)                                                    \
  cug.name = (ret(*) args)dlsym(h, #name);                                    \
  cug.present = cug.present && cug.name;
  KILN_CUDA_GRAPH_FUNCTIONS(X)
#undef X
  CUresult r = cu.cuInit(0);
  int count = 0;
  if (r == CUDA_SUCCESS) r = cu.cuDeviceGetCount(&count);
  if (r != CUDA_SUCCESS || count == 0) {
    const char *name = "CUDA_ERROR_NO_DEVICE";
    if (r != CUDA_SUCCESS) cu.cuGetErrorName(r, &name);
    snprintf(load_error, sizeof(load_error), "no CUDA device: cuInit / "
             "cuDeviceGetCount: %s (%d devices)", name ? name : "?", count);
  }
}

kiln_status_t kiln_cuda_available(void) {
  pthread_once(&load_once, load_driver);
  if (load_error[0])
    return kiln_make_status(KILN_STATUS_UNAVAILABLE, "%s", load_error);
  return NULL;
}

// A status for a failed driver call.
static kiln_status_t cuda_error(CUresult r, const char *call) {
  const char *name = NULL;
  if (cu.cuGetErrorName) cu.cuGetErrorName(r, &name);
  return kiln_make_status(KILN_STATUS_INTERNAL, "CUDA %s failed: %s (%d)", call,
                          name ? name : "unknown error", (int)r);
}

#define CU_CHECK(expr, call)                                                  \
  do {                                                                        \
    CUresult r_ = (expr);                                                     \
    if (r_ != CUDA_SUCCESS) return cuda_error(r_, call);                      \
  } while (0)

#define CU_READY() KILN_RETURN_IF_ERROR_PLAIN(kiln_cuda_available())

kiln_status_t kiln_cuda_device_arch(int device, int *major, int *minor) {
  CU_READY();
  CUdevice d;
  CU_CHECK(cu.cuDeviceGet(&d, device), "cuDeviceGet");
  CU_CHECK(cu.cuDeviceGetAttribute(
               major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d),
           "cuDeviceGetAttribute");
  CU_CHECK(cu.cuDeviceGetAttribute(
               minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d),
           "cuDeviceGetAttribute");
  return NULL;
}

kiln_status_t kiln_cuda_device_name(int device, char *buf, size_t len) {
  if (len) buf[0] = 0;
  CU_READY();
  CUdevice d;
  CU_CHECK(cu.cuDeviceGet(&d, device), "cuDeviceGet");
  CU_CHECK(cu.cuDeviceGetName(buf, (int)len, d), "cuDeviceGetName");
  return NULL;
}

// Primary contexts, retained once per device for the life of the process
// (PyTorch retains the same ones).
#define KILN_CUDA_MAX_DEVICES 64
static CUcontext primary[KILN_CUDA_MAX_DEVICES];
static pthread_mutex_t primary_lock = PTHREAD_MUTEX_INITIALIZER;

kiln_status_t kiln_cuda_use_device(int device) {
  CU_READY();
  if (device < 0 || device >= KILN_CUDA_MAX_DEVICES)
    return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                            "CUDA device %d; expected 0..%d", device,
                            KILN_CUDA_MAX_DEVICES - 1);
  pthread_mutex_lock(&primary_lock);
  CUcontext ctx = primary[device];
  CUresult r = CUDA_SUCCESS;
  if (!ctx) {
    CUdevice d;
    r = cu.cuDeviceGet(&d, device);
    if (r == CUDA_SUCCESS) r = cu.cuDevicePrimaryCtxRetain(&ctx, d);
    if (r == CUDA_SUCCESS) primary[device] = ctx;
  }
  pthread_mutex_unlock(&primary_lock);
  if (r != CUDA_SUCCESS) return cuda_error(r, "cuDevicePrimaryCtxRetain");
  CUcontext cur = NULL;
  CU_CHECK(cu.cuCtxGetCurrent(&cur), "cuCtxGetCurrent");
  if (cur != ctx) CU_CHECK(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
  return NULL;
}

struct kiln_cuda_module {
  CUmodule module;
};

kiln_status_t kiln_cuda_module_load_ptx(const char *ptx,
                                        kiln_cuda_module_t **out_module) {
  *out_module = NULL;
  CU_READY();
  char log[4096] = {0};
  CUjit_option opts[3] = {CU_JIT_ERROR_LOG_BUFFER,
                          CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                          CU_JIT_OPTIMIZATION_LEVEL};
  void *vals[3] = {log, (void *)(uintptr_t)sizeof(log), (void *)(uintptr_t)4};
  CUmodule m = NULL;
  CUresult r = cu.cuModuleLoadDataEx(&m, ptx, 3, opts, vals);
  if (r != CUDA_SUCCESS) {
    kiln_status_t s = cuda_error(r, "cuModuleLoadDataEx (PTX)");
    return log[0] ? kiln_status_annotate(s, "ptxas: %.1000s", log) : s;
  }
  kiln_cuda_module_t *km = malloc(sizeof(*km));
  if (!km) {
    cu.cuModuleUnload(m);
    return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "CUDA module");
  }
  km->module = m;
  *out_module = km;
  return NULL;
}

void kiln_cuda_module_unload(kiln_cuda_module_t *module) {
  if (!module) return;
  if (cu.cuModuleUnload) cu.cuModuleUnload(module->module);
  free(module);
}

kiln_status_t kiln_cuda_module_function(kiln_cuda_module_t *module,
                                        const char *name, void **out_fn) {
  CUfunction f = NULL;
  CUresult r = cu.cuModuleGetFunction(&f, module->module, name);
  if (r != CUDA_SUCCESS)
    return kiln_status_annotate(cuda_error(r, "cuModuleGetFunction"),
                                "kernel '%s'", name);
  *out_fn = f;
  return NULL;
}

kiln_status_t kiln_cuda_function_reserve_shared(void *fn, uint32_t bytes) {
  if (bytes <= 48 * 1024) return NULL;  // what every kernel may have
  CU_CHECK(cu.cuFuncSetAttribute((CUfunction)fn,
                                 CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                 (int)bytes),
           "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
  return NULL;
}

kiln_status_t kiln_cuda_launch(void *fn, const uint32_t grid[3],
                               const uint32_t block[3], uint32_t shared_bytes,
                               void *stream, void **params) {
  CU_CHECK(cu.cuLaunchKernel((CUfunction)fn, grid[0], grid[1], grid[2],
                             block[0], block[1], block[2], shared_bytes,
                             (CUstream)stream, params, NULL),
           "cuLaunchKernel");
  return NULL;
}

kiln_status_t kiln_cuda_tensor_map(void *map, kiln_cuda_elem_t elem, int rank, void *base,
                                   const int64_t *dims, const int64_t *strides,
                                   const int32_t *box, int swizzle, int l2promo) {
  if (!cuTensorMapEncodeTiled_)
    return kiln_make_status(KILN_STATUS_UNAVAILABLE,
                            "cuTensorMapEncodeTiled: the CUDA driver has no TMA "
                            "tensor maps (CUDA 12.0+)");
  if (rank < 1 || rank > 5 || ((uintptr_t)map & 63) || elem < KILN_CUDA_ELEM_F16 ||
      elem > KILN_CUDA_ELEM_F32)
    return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                            "cuTensorMapEncodeTiled: rank %d (1 to 5), map %p (64-byte "
                            "aligned), element kind %d", rank, map, (int)elem);
  static const CUtensorMapDataType types[] = {CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                                              CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                                              CU_TENSOR_MAP_DATA_TYPE_FLOAT32};
  cuuint64_t d[5], st[4];
  cuuint32_t b[5], one[5];
  for (int i = 0; i < rank; ++i) {
    d[i] = (cuuint64_t)dims[i];
    b[i] = (cuuint32_t)box[i];
    one[i] = 1;
    if (i > 0) st[i - 1] = (cuuint64_t)strides[i];
  }
  CUtensorMapSwizzle sw = swizzle == 128  ? CU_TENSOR_MAP_SWIZZLE_128B
                          : swizzle == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                          : swizzle == 32 ? CU_TENSOR_MAP_SWIZZLE_32B
                                          : CU_TENSOR_MAP_SWIZZLE_NONE;
  CUtensorMapL2promotion l2 = l2promo == 256  ? CU_TENSOR_MAP_L2_PROMOTION_L2_256B
                              : l2promo == 128 ? CU_TENSOR_MAP_L2_PROMOTION_L2_128B
                              : l2promo == 64  ? CU_TENSOR_MAP_L2_PROMOTION_L2_64B
                                               : CU_TENSOR_MAP_L2_PROMOTION_NONE;
  CU_CHECK(cuTensorMapEncodeTiled_((CUtensorMap *)map, types[elem], (cuuint32_t)rank, base,
                                   d, st, b, one, CU_TENSOR_MAP_INTERLEAVE_NONE, sw, l2,
                                   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
           "cuTensorMapEncodeTiled");
  return NULL;
}

// kiln's own stream-ordered pool per device for temporaries. The default
// pool returns freed memory to the OS at every synchronization (release
// threshold 0), so a 64 MB temporary was mapped again on every call
// (0.35 ms of a 4096^3 bf16 matmul); this one keeps up to 2 GiB of freed
// memory for reuse. Not the device's default pool: the user's
// cudaMallocAsync keeps its own settings. NULL where the driver has none.
static CUmemoryPool pools[KILN_CUDA_MAX_DEVICES];
static bool pool_failed[KILN_CUDA_MAX_DEVICES];

static CUmemoryPool current_pool(void) {
  CUdevice dev = 0;
  if (!cuMemPoolCreate_ || !cuMemPoolSetAttribute_ || !cuMemAllocFromPoolAsync_ ||
      !cuCtxGetDevice_ || cuCtxGetDevice_(&dev) != CUDA_SUCCESS || dev < 0 ||
      dev >= KILN_CUDA_MAX_DEVICES)
    return NULL;
  pthread_mutex_lock(&primary_lock);
  CUmemoryPool pool = pools[dev];
  if (!pool && !pool_failed[dev]) {
    CUmemPoolProps props;
    memset(&props, 0, sizeof(props));
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = dev;
    cuuint64_t keep = (cuuint64_t)2 << 30;
    if (cuMemPoolCreate_(&pool, &props) == CUDA_SUCCESS &&
        cuMemPoolSetAttribute_(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep) ==
            CUDA_SUCCESS)
      pools[dev] = pool;
    else
      pool = NULL, pool_failed[dev] = true;
  }
  pthread_mutex_unlock(&primary_lock);
  return pool;
}

kiln_status_t kiln_cuda_alloc(size_t bytes, void *stream, void **out_ptr) {
  CU_READY();
  CUdeviceptr p = 0;
  CUmemoryPool pool = current_pool();
  if (pool)
    CU_CHECK(cuMemAllocFromPoolAsync_(&p, bytes ? bytes : 1, pool, (CUstream)stream),
             "cuMemAllocFromPoolAsync");
  else if (cuMemAllocAsync_)
    CU_CHECK(cuMemAllocAsync_(&p, bytes ? bytes : 1, (CUstream)stream),
             "cuMemAllocAsync");
  else
    CU_CHECK(cu.cuMemAlloc_v2(&p, bytes ? bytes : 1), "cuMemAlloc");
  *out_ptr = (void *)(uintptr_t)p;
  return NULL;
}

void kiln_cuda_free(void *ptr, void *stream) {
  if (!ptr) return;
  if (cuMemFreeAsync_)
    cuMemFreeAsync_((CUdeviceptr)(uintptr_t)ptr, (CUstream)stream);
  else if (cu.cuMemFree_v2)
    cu.cuMemFree_v2((CUdeviceptr)(uintptr_t)ptr);
}

kiln_status_t kiln_cuda_memcpy(void *dst, const void *src, size_t bytes,
                               void *stream) {
  CU_CHECK(cu.cuMemcpyAsync((CUdeviceptr)(uintptr_t)dst,
                            (CUdeviceptr)(uintptr_t)src, bytes, (CUstream)stream),
           "cuMemcpyAsync");
  return NULL;
}

kiln_status_t kiln_cuda_stream_synchronize(void *stream) {
  CU_CHECK(cu.cuStreamSynchronize((CUstream)stream), "cuStreamSynchronize");
  return NULL;
}

kiln_status_t kiln_cuda_memset(void *dst, unsigned char byte, size_t bytes, void *stream) {
  CU_CHECK(cu.cuMemsetD8Async((CUdeviceptr)(uintptr_t)dst, byte, bytes, (CUstream)stream),
           "cuMemsetD8Async");
  return NULL;
}

kiln_status_t kiln_cuda_alloc_static(size_t bytes, void **out_ptr) {
  CU_READY();
  CUdeviceptr p = 0;
  CU_CHECK(cu.cuMemAlloc_v2(&p, bytes ? bytes : 1), "cuMemAlloc");
  *out_ptr = (void *)(uintptr_t)p;
  return NULL;
}

void kiln_cuda_free_static(void *ptr) {
  if (ptr && cu.cuMemFree_v2) cu.cuMemFree_v2((CUdeviceptr)(uintptr_t)ptr);
}

kiln_status_t kiln_cuda_upload(void *dst, const void *src, size_t bytes) {
  CU_READY();
  CU_CHECK(cu.cuMemcpyHtoD_v2((CUdeviceptr)(uintptr_t)dst, src, bytes),
           "cuMemcpyHtoD");
  // From pageable memory the copy may still be in flight when it returns,
  // and kernels on non-blocking streams (or in CUDA graphs) are not ordered
  // after it: wait once here (programs load once).
  CU_CHECK(cu.cuCtxSynchronize(), "cuCtxSynchronize");
  return NULL;
}

//===--- CUDA graphs --------------------------------------------------------===//

struct kiln_cuda_graph {
  CUgraphExec exec;
  CUevent done;      // recorded after the latest launch
  bool launched;
};

kiln_status_t kiln_cuda_capture_begin(void **out_stream) {
  *out_stream = NULL;
  CU_READY();
  if (!cug.present)
    return kiln_make_status(KILN_STATUS_UNAVAILABLE,
                            "CUDA graphs: this driver lacks stream capture "
                            "or cuGraphExecUpdate (CUDA 12.0+ needed)");
  CUstream st = NULL;
  CU_CHECK(cu.cuStreamCreate(&st, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  // Thread-local: other threads' CUDA calls (PyTorch's) are not affected.
  CUresult r = cug.cuStreamBeginCapture_v2(st, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
  if (r != CUDA_SUCCESS) {
    cu.cuStreamDestroy_v2(st);
    return cuda_error(r, "cuStreamBeginCapture");
  }
  *out_stream = st;
  return NULL;
}

kiln_status_t kiln_cuda_capture_end(void *stream, bool keep,
                                    kiln_cuda_graph_t **graph, bool *updated) {
  if (updated) *updated = false;
  CUgraph g = NULL;
  CUresult r = cug.cuStreamEndCapture((CUstream)stream, &g);
  cu.cuStreamDestroy_v2((CUstream)stream);
  if (r != CUDA_SUCCESS) return cuda_error(r, "cuStreamEndCapture");
  if (!keep) {
    cug.cuGraphDestroy(g);
    return NULL;
  }
  kiln_status_t s = NULL;
  kiln_cuda_graph_t *kg = *graph;
  if (kg) {
    // Same launches with other pointers: patch the executable in place;
    // a different topology (it cannot happen for one launch program, but
    // the driver decides) instantiates afresh once the old one is done.
    CUgraphExecUpdateResultInfo info;
    memset(&info, 0, sizeof(info));
    if (cug.cuGraphExecUpdate_v2(kg->exec, g, &info) == CUDA_SUCCESS) {
      if (updated) *updated = true;
      cug.cuGraphDestroy(g);
      return NULL;
    }
    s = kiln_cuda_graph_wait(kg);
    cug.cuGraphExecDestroy(kg->exec);
    kg->exec = NULL;
    kg->launched = false;
  } else {
    kg = calloc(1, sizeof(*kg));
    CUresult er = kg ? cu.cuEventCreate(&kg->done, CU_EVENT_DISABLE_TIMING)
                     : CUDA_ERROR_OUT_OF_MEMORY;
    if (er != CUDA_SUCCESS) {
      free(kg);
      cug.cuGraphDestroy(g);
      *graph = NULL;
      return kg ? cuda_error(er, "cuEventCreate")
                : kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "CUDA graph");
    }
  }
  r = s ? CUDA_SUCCESS : cug.cuGraphInstantiateWithFlags(&kg->exec, g, 0);
  cug.cuGraphDestroy(g);
  if (!s && r != CUDA_SUCCESS) s = cuda_error(r, "cuGraphInstantiateWithFlags");
  if (s) {
    kiln_cuda_graph_destroy(kg);
    kg = NULL;
  }
  *graph = kg;
  return s;
}

kiln_status_t kiln_cuda_graph_launch(kiln_cuda_graph_t *graph, void *stream) {
  CU_CHECK(cug.cuGraphLaunch(graph->exec, (CUstream)stream), "cuGraphLaunch");
  CU_CHECK(cu.cuEventRecord(graph->done, (CUstream)stream), "cuEventRecord");
  graph->launched = true;
  return NULL;
}

kiln_status_t kiln_cuda_graph_wait(kiln_cuda_graph_t *graph) {
  if (!graph || !graph->launched) return NULL;
  CU_CHECK(cu.cuEventSynchronize(graph->done), "cuEventSynchronize");
  return NULL;
}

void kiln_cuda_graph_destroy(kiln_cuda_graph_t *graph) {
  if (!graph) return;
  kiln_status_free(kiln_cuda_graph_wait(graph));
  if (graph->exec && cug.cuGraphExecDestroy) cug.cuGraphExecDestroy(graph->exec);
  if (graph->done) cu.cuEventDestroy_v2(graph->done);
  free(graph);
}

//===--- mgpu* entry points of MLIR 22.1 host code --------------------------===//
//
// Signatures as in the LLVM IR that gpu-to-llvm emits (DESIGN.md). They
// cannot return errors: a failure is printed once per call site kind to
// stderr and leaves a NULL result; kiln never aborts the process.

static void mgpu_report(CUresult r, const char *call) {
  if (r == CUDA_SUCCESS) return;
  const char *name = NULL;
  if (cu.cuGetErrorName) cu.cuGetErrorName(r, &name);
  fprintf(stderr, "[kiln cuda] %s failed: %s\n", call, name ? name : "?");
}

static bool mgpu_ready(const char *call) {
  kiln_status_t s = kiln_cuda_available();
  if (!s) return true;
  fprintf(stderr, "[kiln cuda] %s: %s\n", call, kiln_status_message(s));
  kiln_status_free(s);
  return false;
}

static void *mgpuModuleLoad(void *data, size_t size) {
  (void)size;
  CUmodule m = NULL;
  if (mgpu_ready("mgpuModuleLoad"))
    mgpu_report(cu.cuModuleLoadData(&m, data), "cuModuleLoadData");
  return m;
}

static void *mgpuModuleLoadJIT(void *data, int opt_level) {
  CUmodule m = NULL;
  if (!mgpu_ready("mgpuModuleLoadJIT")) return NULL;
  CUjit_option o = CU_JIT_OPTIMIZATION_LEVEL;
  void *v = (void *)(intptr_t)opt_level;
  mgpu_report(cu.cuModuleLoadDataEx(&m, data, 1, &o, &v), "cuModuleLoadDataEx");
  return m;
}

static void mgpuModuleUnload(void *module) {
  if (module) mgpu_report(cu.cuModuleUnload((CUmodule)module), "cuModuleUnload");
}

static void *mgpuModuleGetFunction(void *module, const char *name) {
  CUfunction f = NULL;
  if (module)
    mgpu_report(cu.cuModuleGetFunction(&f, (CUmodule)module, name),
                "cuModuleGetFunction");
  return f;
}

static void mgpuLaunchKernel(void *fn, intptr_t gx, intptr_t gy, intptr_t gz,
                             intptr_t bx, intptr_t by, intptr_t bz,
                             int32_t smem, void *stream, void **params,
                             void **extra, size_t param_count) {
  (void)param_count;
  mgpu_report(cu.cuLaunchKernel((CUfunction)fn, (unsigned)gx, (unsigned)gy,
                                (unsigned)gz, (unsigned)bx, (unsigned)by,
                                (unsigned)bz, (unsigned)smem, (CUstream)stream,
                                params, extra),
              "cuLaunchKernel");
}

static void *mgpuStreamCreate(void) {
  CUstream s = NULL;
  if (mgpu_ready("mgpuStreamCreate"))
    mgpu_report(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  return s;
}

static void mgpuStreamSynchronize(void *stream) {
  mgpu_report(cu.cuStreamSynchronize((CUstream)stream), "cuStreamSynchronize");
}

static void mgpuStreamDestroy(void *stream) {
  mgpu_report(cu.cuStreamDestroy_v2((CUstream)stream), "cuStreamDestroy");
}

static void mgpuStreamWaitEvent(void *stream, void *event) {
  mgpu_report(cu.cuStreamWaitEvent((CUstream)stream, (CUevent)event, 0),
              "cuStreamWaitEvent");
}

static void *mgpuEventCreate(void) {
  CUevent e = NULL;
  if (mgpu_ready("mgpuEventCreate"))
    mgpu_report(cu.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
  return e;
}

static void mgpuEventDestroy(void *event) {
  mgpu_report(cu.cuEventDestroy_v2((CUevent)event), "cuEventDestroy");
}

static void mgpuEventSynchronize(void *event) {
  mgpu_report(cu.cuEventSynchronize((CUevent)event), "cuEventSynchronize");
}

static void mgpuEventRecord(void *event, void *stream) {
  mgpu_report(cu.cuEventRecord((CUevent)event, (CUstream)stream),
              "cuEventRecord");
}

static void *mgpuMemAlloc(uint64_t bytes, void *stream, bool host_shared) {
  (void)stream;
  CUdeviceptr p = 0;
  if (!mgpu_ready("mgpuMemAlloc")) return NULL;
  if (host_shared)
    mgpu_report(cu.cuMemAllocManaged(&p, bytes ? bytes : 1,
                                     CU_MEM_ATTACH_GLOBAL),
                "cuMemAllocManaged");
  else
    mgpu_report(cu.cuMemAlloc_v2(&p, bytes ? bytes : 1), "cuMemAlloc");
  return (void *)(uintptr_t)p;
}

static void mgpuMemFree(void *ptr, void *stream) {
  (void)stream;
  if (ptr) mgpu_report(cu.cuMemFree_v2((CUdeviceptr)(uintptr_t)ptr), "cuMemFree");
}

static void mgpuMemcpy(void *dst, void *src, size_t bytes, void *stream) {
  mgpu_report(cu.cuMemcpyAsync((CUdeviceptr)(uintptr_t)dst,
                               (CUdeviceptr)(uintptr_t)src, bytes,
                               (CUstream)stream),
              "cuMemcpyAsync");
}

static void mgpuMemset32(void *dst, unsigned int value, size_t count,
                         void *stream) {
  mgpu_report(cu.cuMemsetD32Async((CUdeviceptr)(uintptr_t)dst, value, count,
                                  (CUstream)stream),
              "cuMemsetD32Async");
}

static void mgpuMemset16(void *dst, unsigned short value, size_t count,
                         void *stream) {
  mgpu_report(cu.cuMemsetD16Async((CUdeviceptr)(uintptr_t)dst, value, count,
                                  (CUstream)stream),
              "cuMemsetD16Async");
}

static void mgpuSetDefaultDevice(int32_t device) {
  kiln_status_t s = kiln_cuda_use_device(device);
  if (s) {
    fprintf(stderr, "[kiln cuda] mgpuSetDefaultDevice(%d): %s\n", device,
            kiln_status_message(s));
    kiln_status_free(s);
  }
}

#define KILN_MGPU(name) {#name, (void *)name}
static const kiln_cuda_symbol_t mgpu_symbols[] = {
    KILN_MGPU(mgpuModuleLoad),        KILN_MGPU(mgpuModuleLoadJIT),
    KILN_MGPU(mgpuModuleUnload),      KILN_MGPU(mgpuModuleGetFunction),
    KILN_MGPU(mgpuLaunchKernel),      KILN_MGPU(mgpuStreamCreate),
    KILN_MGPU(mgpuStreamSynchronize), KILN_MGPU(mgpuStreamDestroy),
    KILN_MGPU(mgpuStreamWaitEvent),   KILN_MGPU(mgpuEventCreate),
    KILN_MGPU(mgpuEventDestroy),      KILN_MGPU(mgpuEventSynchronize),
    KILN_MGPU(mgpuEventRecord),       KILN_MGPU(mgpuMemAlloc),
    KILN_MGPU(mgpuMemFree),           KILN_MGPU(mgpuMemcpy),
    KILN_MGPU(mgpuMemset32),          KILN_MGPU(mgpuMemset16),
    KILN_MGPU(mgpuSetDefaultDevice),
};

const kiln_cuda_symbol_t *kiln_cuda_mgpu_symbols(int *out_count) {
  *out_count = (int)(sizeof(mgpu_symbols) / sizeof(mgpu_symbols[0]));
  return mgpu_symbols;
}

#else  // !KILN_HAVE_CUDA_H: built without the CUDA headers.

kiln_status_t kiln_cuda_available(void) {
  return kiln_make_status(KILN_STATUS_UNAVAILABLE,
                          "no CUDA device: this libkiln was built without "
                          "cuda.h (install the CUDA toolkit headers and "
                          "rebuild)");
}
#define KILN_NO_CUDA return kiln_cuda_available()
kiln_status_t kiln_cuda_device_arch(int d, int *a, int *b) { KILN_NO_CUDA; }
kiln_status_t kiln_cuda_device_name(int d, char *buf, size_t len) {
  if (len) buf[0] = 0;
  KILN_NO_CUDA;
}
kiln_status_t kiln_cuda_use_device(int d) { KILN_NO_CUDA; }
kiln_status_t kiln_cuda_module_load_ptx(const char *p, kiln_cuda_module_t **m) {
  *m = NULL;
  KILN_NO_CUDA;
}
void kiln_cuda_module_unload(kiln_cuda_module_t *m) {}
kiln_status_t kiln_cuda_module_function(kiln_cuda_module_t *m, const char *n,
                                        void **f) { KILN_NO_CUDA; }
kiln_status_t kiln_cuda_function_reserve_shared(void *f, uint32_t b) { KILN_NO_CUDA; }
kiln_status_t kiln_cuda_launch(void *f, const uint32_t g[3], const uint32_t b[3],
                               uint32_t s, void *st, void **p) { KILN_NO_CUDA; }
kiln_status_t kiln_cuda_alloc(size_t n, void *s, void **p) { KILN_NO_CUDA; }
kiln_status_t kiln_cuda_tensor_map(void *m, kiln_cuda_elem_t e, int r, void *b,
                                   const int64_t *d, const int64_t *s, const int32_t *x,
                                   int sw, int l2) {
  KILN_NO_CUDA;
}
void kiln_cuda_free(void *p, void *s) {}
kiln_status_t kiln_cuda_memcpy(void *d, const void *s, size_t n, void *st) {
  KILN_NO_CUDA;
}
kiln_status_t kiln_cuda_stream_synchronize(void *s) { KILN_NO_CUDA; }
kiln_status_t kiln_cuda_memset(void *d, unsigned char b, size_t n, void *s) {
  KILN_NO_CUDA;
}
kiln_status_t kiln_cuda_alloc_static(size_t n, void **p) { KILN_NO_CUDA; }
void kiln_cuda_free_static(void *p) {}
kiln_status_t kiln_cuda_upload(void *d, const void *s, size_t n) { KILN_NO_CUDA; }
kiln_status_t kiln_cuda_capture_begin(void **s) {
  *s = NULL;
  KILN_NO_CUDA;
}
kiln_status_t kiln_cuda_capture_end(void *s, bool k, kiln_cuda_graph_t **g,
                                    bool *u) { KILN_NO_CUDA; }
kiln_status_t kiln_cuda_graph_launch(kiln_cuda_graph_t *g, void *s) { KILN_NO_CUDA; }
kiln_status_t kiln_cuda_graph_wait(kiln_cuda_graph_t *g) { KILN_NO_CUDA; }
void kiln_cuda_graph_destroy(kiln_cuda_graph_t *g) {}
const kiln_cuda_symbol_t *kiln_cuda_mgpu_symbols(int *n) {
  *n = 0;
  return NULL;
}
#endif
