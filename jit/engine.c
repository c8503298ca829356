// Object code: MLIR LLVM dialect -> LLVM IR -> object (in memory), linked by
// LLVM ORC LLJIT; runtime symbols; libffi calls.
#include <dlfcn.h>
#include <ffi.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <llvm-c/Core.h>
#include <llvm-c/Error.h>
#include <llvm-c/LLJIT.h>
#include <llvm-c/Orc.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <llvm-c/Transforms/PassBuilder.h>
#include <mlir-c/Target/LLVMIR.h>

#include "jit.h"
#include "openmp_shim.h"
#include "regions.h"

// The OpenMP runtime in use (set once by kiln_jit_openmp_available).
enum { OMP_NONE, OMP_LIBOMP, OMP_GOMP };
static int omp_mode = OMP_NONE;

// An LLJIT holding one object (compiled now or loaded from the cache). MLIR's
// ExecutionEngine is not used: its object dump goes through files and LLVM's
// signal-handler registration, which must not happen inside the user's
// process (it also broke AddressSanitizer on threads).
struct kiln_jit {
  LLVMOrcLLJITRef lljit;
};

//===--- runtime symbols --------------------------------------------------===//
// Functions that MLIR's lowerings call by name and that upstream ships in its
// runner-utils library (not packaged, and not a dependency kiln wants).

// memref.copy between non-identity layouts lowers to a call of `memrefCopy`
// with unranked descriptors: {rank, descriptor*}, where the descriptor is
// {allocated, aligned, offset, sizes[rank], strides[rank]}.
typedef struct {
  int64_t rank;
  void *descriptor;
} kiln_unranked_memref_t;

static void kiln_rt_memref_copy(int64_t elem_size, kiln_unranked_memref_t *src,
                                kiln_unranked_memref_t *dst) {
  int64_t rank = src->rank;
  const int64_t *sd = (const int64_t *)src->descriptor;
  const int64_t *dd = (const int64_t *)dst->descriptor;
  const char *sbase = (const char *)(intptr_t)sd[1] + sd[2] * elem_size;
  char *dbase = (char *)(intptr_t)dd[1] + dd[2] * elem_size;
  const int64_t *sizes = sd + 3, *sstr = sd + 3 + rank, *dstr = dd + 3 + rank;
  int64_t total = 1;
  for (int64_t i = 0; i < rank; ++i) total *= sizes[i];
  // (Ranks above 16 cannot reach here: graphs have at most KILN_MAX_RANK.)
  if (total == 0 || rank > 16) return;
  // The innermost dims that are one contiguous run in both memrefs go by
  // one memcpy (a slice of q, k or v with symbolic sizes is all one run; the
  // layouts are only known here, at run time).
  int64_t run = 1;
  int inner = (int)rank;
  while (inner > 0) {
    int i = inner - 1;
    if (sizes[i] != 1 && (sstr[i] != run || dstr[i] != run)) break;
    run *= sizes[i];
    inner = i;
  }
  // The outer dims as an odometer, offsets updated incrementally.
  int64_t idx[16] = {0}, so = 0, doff = 0;
  for (int64_t n = total / run; n > 0; --n) {
    memcpy(dbase + doff * elem_size, sbase + so * elem_size, (size_t)(run * elem_size));
    for (int i = inner - 1; i >= 0; --i) {
      so += sstr[i];
      doff += dstr[i];
      if (++idx[i] < sizes[i]) break;
      so -= sstr[i] * sizes[i];
      doff -= dstr[i] * sizes[i];
      idx[i] = 0;
    }
  }
}

//===--- buffer pool --------------------------------------------------------===//
// Intermediate buffers of compiled code (memref.alloc, through MLIR's generic
// allocation functions) come from here. Freed blocks are kept per power-of-two
// size class and reused, so a call does not mmap and page-fault its
// temporaries afresh each time (a 1 MB transpose buffer cost more than the
// matmul reading it). Blocks are 64-byte aligned; the pool keeps at most
// KILN_POOL_MAX_CACHED bytes and frees the rest.
//
// A temporary that cannot be allocated does not crash the process: the
// blocks a call's own thread allocates are linked to the call
// (kiln_ffi_call's frame), and when an allocation fails outside OpenMP
// regions the call unwinds there (longjmp: compiled code holds no other
// resources and runs no cleanups), its live blocks are freed, and it
// returns OUT_OF_MEMORY. Inside a region, even one of a single thread, or
// on a worker thread, there is nowhere to unwind to without leaving the
// team behind: the allocation returns NULL, as malloc would.

#define KILN_POOL_CLASSES 48
#define KILN_POOL_MAX_CACHED ((size_t)512 << 20)

typedef struct call_frame call_frame_t;

typedef struct pool_block {
  struct pool_block *next;  // in the free list
  void *base;               // what malloc returned
  int cls;                  // size class, -1: not pooled
  call_frame_t *frame;      // the call it is live in, or NULL
  struct pool_block *live_prev, *live_next;  // in that call's live list
} pool_block_t;
_Static_assert(sizeof(pool_block_t) <= 64, "the header lives in 64 bytes");

// One kiln_ffi_call on its thread: where a failed allocation unwinds to.
// (Changed between setjmp and longjmp, hence volatile: read after the
// unwind.)
struct call_frame {
  jmp_buf unwind;
  volatile size_t failed_bytes;
  pool_block_t *volatile live;  // blocks allocated for it and not yet freed
};
static _Thread_local call_frame_t *current_call;

static int omp_mode_loaded(void);

// Whether the calling thread is outside every OpenMP region, active or not
// (omp_get_level 0), asked of the runtime compiled code forks with: the
// host's libgomp through the shim, else the __kmpc_* the JIT resolves from
// the process's global scope. Only asked when an allocation has failed: it
// may initialize a runtime that code without regions never touched.
static bool outside_regions(void) {
  int (*level)(void) = NULL;
  if (omp_mode_loaded() == 2) {
    level = kiln_gomp_level_fn();
  } else if (omp_mode_loaded() == 1) {
    *(void **)&level = dlsym(RTLD_DEFAULT, "omp_get_level");
    if (!level) return false;  // a runtime we cannot ask: do not unwind
  } else {
    return true;  // no runtime: no regions
  }
  return level && level() == 0;
}

static struct {
  pthread_mutex_t lock;
  pool_block_t *free_list[KILN_POOL_CLASSES];
  size_t cached;
} pool = {PTHREAD_MUTEX_INITIALIZER, {0}, 0};

static int size_class(size_t n) {
  int c = 8;  // 256 bytes minimum
  while (c < KILN_POOL_CLASSES - 1 && ((size_t)1 << c) < n) c++;
  return ((size_t)1 << c) >= n ? c : -1;
}

static void *pool_alloc_aligned(size_t align, size_t size) {
  if (align < 64) align = 64;
  int cls = align == 64 ? size_class(size) : -1;
  if (cls >= 0) {
    pthread_mutex_lock(&pool.lock);
    pool_block_t *b = pool.free_list[cls];
    if (b) {
      pool.free_list[cls] = b->next;
      pool.cached -= (size_t)1 << cls;
    }
    pthread_mutex_unlock(&pool.lock);
    if (b) return (char *)b + 64;
  }
  size_t bytes = cls >= 0 ? (size_t)1 << cls : size;
  // The header sits in the 64 bytes just below the returned pointer.
  char *base = bytes <= SIZE_MAX - align - 64 ? malloc(bytes + align + 64) : NULL;
  if (!base) return NULL;
  uintptr_t user = ((uintptr_t)base + 64 + align - 1) & ~(uintptr_t)(align - 1);
  pool_block_t *b = (pool_block_t *)(user - 64);
  b->base = base;
  b->cls = cls;
  b->next = NULL;
  b->frame = NULL;
  return (void *)user;
}

// Links `b` to the calling thread's call (inside a region too: a block
// still live at an unwind, which happens outside regions, is the call's).
static void track(pool_block_t *b) {
  call_frame_t *f = current_call;
  if (!f) return;
  pthread_mutex_lock(&pool.lock);
  b->frame = f;
  b->live_prev = NULL;
  b->live_next = f->live;
  if (f->live) f->live->live_prev = b;
  f->live = b;
  pthread_mutex_unlock(&pool.lock);
}

// Under pool.lock.
static void untrack_locked(pool_block_t *b) {
  call_frame_t *f = b->frame;
  if (!f) return;
  if (b->live_prev) b->live_prev->live_next = b->live_next;
  else f->live = b->live_next;
  if (b->live_next) b->live_next->live_prev = b->live_prev;
  b->frame = NULL;
}

// A temporary of `size` bytes could not be allocated: the calling thread's
// call unwinds, where it can.
static void *alloc_failed(size_t size) {
  call_frame_t *f = current_call;
  if (f && outside_regions()) {
    f->failed_bytes = size;
    longjmp(f->unwind, 1);
  }
  return NULL;
}

static void *kiln_rt_aligned_alloc(size_t align, size_t size) {
  void *p = pool_alloc_aligned(align, size);
  if (!p) return alloc_failed(size);
  track((pool_block_t *)((char *)p - 64));
  return p;
}

static void *kiln_rt_alloc(size_t size) { return kiln_rt_aligned_alloc(64, size); }

static void kiln_rt_free(void *ptr) {
  if (!ptr) return;
  pool_block_t *b = (pool_block_t *)((char *)ptr - 64);
  pthread_mutex_lock(&pool.lock);
  untrack_locked(b);
  if (b->cls >= 0 && pool.cached + ((size_t)1 << b->cls) <= KILN_POOL_MAX_CACHED) {
    b->next = pool.free_list[b->cls];
    pool.free_list[b->cls] = b;
    pool.cached += (size_t)1 << b->cls;
    pthread_mutex_unlock(&pool.lock);
    return;
  }
  pthread_mutex_unlock(&pool.lock);
  free(b->base);
}

static pthread_once_t native_once = PTHREAD_ONCE_INIT;
static void init_native(void) {
  LLVMInitializeNativeTarget();
  LLVMInitializeNativeAsmPrinter();
}

static kiln_status_t llvm_error(LLVMErrorRef err, const char *what) {
  char *msg = LLVMGetErrorMessage(err);
  kiln_status_t s = kiln_make_status(KILN_STATUS_COMPILE_ERROR, "%s: %s", what,
                                     msg ? msg : "(no message)");
  LLVMDisposeErrorMessage(msg);
  return s;
}

kiln_status_t kiln_jit_compile_object(MlirModule module, int opt_level,
                                      void **out_data, size_t *out_size) {
  *out_data = NULL;
  *out_size = 0;
  pthread_once(&native_once, init_native);
  if (opt_level < 0) opt_level = 0;
  if (opt_level > 3) opt_level = 3;
  char *triple = LLVMGetDefaultTargetTriple();
  char *cpu = LLVMGetHostCPUName();
  char *features = LLVMGetHostCPUFeatures();
  char *err_msg = NULL;
  LLVMTargetRef target = NULL;
  LLVMTargetMachineRef tm = NULL;
  LLVMContextRef llctx = LLVMContextCreate();
  LLVMModuleRef mod = NULL;
  kiln_status_t s = NULL;
  if (LLVMGetTargetFromTriple(triple, &target, &err_msg)) {
    s = kiln_make_status(KILN_STATUS_COMPILE_ERROR, "LLVM: no target for %s: %s",
                         triple, err_msg ? err_msg : "");
    goto done;
  }
  // PIC: the object may be linked at another address in another process.
  tm = LLVMCreateTargetMachine(target, triple, cpu, features,
                               opt_level >= 2 ? LLVMCodeGenLevelAggressive
                               : opt_level == 1 ? LLVMCodeGenLevelLess
                                                : LLVMCodeGenLevelNone,
                               LLVMRelocPIC, LLVMCodeModelJITDefault);
  mod = mlirTranslateModuleToLLVMIR(mlirModuleGetOperation(module), llctx);
  if (!mod) {
    s = kiln_make_status(KILN_STATUS_COMPILE_ERROR,
                         "translating the LLVM dialect to LLVM IR failed");
    goto done;
  }
  LLVMSetTarget(mod, triple);
  LLVMTargetDataRef layout = LLVMCreateTargetDataLayout(tm);
  LLVMSetModuleDataLayout(mod, layout);
  LLVMDisposeTargetData(layout);
  char passes[32];
  snprintf(passes, sizeof(passes), "default<O%d>", opt_level);
  LLVMPassBuilderOptionsRef popts = LLVMCreatePassBuilderOptions();
  LLVMErrorRef err = LLVMRunPasses(mod, passes, tm, popts);
  LLVMDisposePassBuilderOptions(popts);
  if (err) {
    s = llvm_error(err, "LLVM optimization pipeline");
    goto done;
  }
  LLVMMemoryBufferRef buf = NULL;
  if (LLVMTargetMachineEmitToMemoryBuffer(tm, mod, LLVMObjectFile, &err_msg,
                                          &buf)) {
    s = kiln_make_status(KILN_STATUS_COMPILE_ERROR, "LLVM codegen: %s",
                         err_msg ? err_msg : "(no message)");
    goto done;
  }
  size_t n = LLVMGetBufferSize(buf);
  void *copy = malloc(n ? n : 1);
  if (!copy) {
    s = kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "object code");
  } else {
    memcpy(copy, LLVMGetBufferStart(buf), n);
    *out_data = copy;
    *out_size = n;
  }
  LLVMDisposeMemoryBuffer(buf);
done:
  if (err_msg) LLVMDisposeMessage(err_msg);
  if (mod) LLVMDisposeModule(mod);
  if (tm) LLVMDisposeTargetMachine(tm);
  LLVMContextDispose(llctx);
  LLVMDisposeMessage(triple);
  LLVMDisposeMessage(cpu);
  LLVMDisposeMessage(features);
  return s;
}

void kiln_jit_destroy(kiln_jit_t *jit) {
  if (!jit) return;
  if (jit->lljit) LLVMOrcDisposeLLJIT(jit->lljit);
  free(jit);
}

void *kiln_jit_lookup(kiln_jit_t *jit, const char *name) {
  LLVMOrcExecutorAddress addr = 0;
  LLVMErrorRef err = LLVMOrcLLJITLookup(jit->lljit, &addr, name);
  if (err) {
    LLVMConsumeError(err);
    return NULL;
  }
  return (void *)(uintptr_t)addr;
}

kiln_status_t kiln_jit_load_object(const void *data, size_t size,
                                   kiln_jit_t **out_jit) {
  *out_jit = NULL;
  pthread_once(&native_once, init_native);
  kiln_jit_t *j = calloc(1, sizeof(*j));
  if (!j) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "JIT");
  LLVMErrorRef err = LLVMOrcCreateLLJIT(&j->lljit, NULL);
  if (err) {
    free(j);
    return llvm_error(err, "LLVM ORC: creating an LLJIT");
  }
  LLVMOrcJITDylibRef jd = LLVMOrcLLJITGetMainJITDylib(j->lljit);
  // Process symbols (malloc, free, libm) and kiln's runtime symbols.
  LLVMOrcDefinitionGeneratorRef gen = NULL;
  err = LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess(
      &gen, LLVMOrcLLJITGetGlobalPrefix(j->lljit), NULL, NULL);
  if (err) {
    kiln_jit_destroy(j);
    return llvm_error(err, "LLVM ORC: process symbol generator");
  }
  LLVMOrcJITDylibAddGenerator(jd, gen);
  typedef struct {
    const char *name;
    void *fn;
  } runtime_symbol_t;
  static const runtime_symbol_t runtime[] = {
      {"memrefCopy", (void *)kiln_rt_memref_copy},
      {"_mlir_memref_to_llvm_alloc", (void *)kiln_rt_alloc},
      {"_mlir_memref_to_llvm_aligned_alloc", (void *)kiln_rt_aligned_alloc},
      {"_mlir_memref_to_llvm_free", (void *)kiln_rt_free},
  };
  // With the host's libgomp, the __kmpc_* entry points come from the shim.
  static const runtime_symbol_t gomp_shim[] = {
      {"__kmpc_global_thread_num", (void *)kiln_kmpc_global_thread_num},
      {"__kmpc_push_num_threads", (void *)kiln_kmpc_push_num_threads},
      {"__kmpc_fork_call", (void *)kiln_kmpc_fork_call},
      {"__kmpc_for_static_init_8u", (void *)kiln_kmpc_for_static_init_8u},
      {"__kmpc_for_static_fini", (void *)kiln_kmpc_for_static_fini},
      {"__kmpc_barrier", (void *)kiln_kmpc_barrier},
  };
  enum {
    N_RUNTIME = sizeof(runtime) / sizeof(runtime[0]),
    N_SHIM = sizeof(gomp_shim) / sizeof(gomp_shim[0])
  };
  // omp_mode was settled when the function was compiled (resolve_threads);
  // objects without parallel loops reference no __kmpc symbol at all.
  // KILN_LOG=regions times each fork (jit/regions.c): __kmpc_fork_call
  // binds to the timer, which calls the runtime's.
  void *fork = omp_mode == OMP_GOMP     ? (void *)kiln_kmpc_fork_call
               : omp_mode == OMP_LIBOMP ? dlsym(RTLD_DEFAULT, "__kmpc_fork_call")
                                        : NULL;
  const char *log = getenv("KILN_LOG");
  bool timed = fork && log && strstr(log, "regions");
  if (timed) kiln_regions_install((kiln_fork_call_fn)fork);
  int n = 0;
  LLVMOrcCSymbolMapPair syms[N_RUNTIME + N_SHIM + 1];
  if (timed) {
    syms[n].Name = LLVMOrcLLJITMangleAndIntern(j->lljit, "__kmpc_fork_call");
    syms[n].Sym.Address = (LLVMOrcExecutorAddress)(uintptr_t)kiln_regions_fork_call;
    syms[n].Sym.Flags.GenericFlags =
        LLVMJITSymbolGenericFlagsExported | LLVMJITSymbolGenericFlagsCallable;
    syms[n].Sym.Flags.TargetFlags = 0;
    n++;
  }
  for (int i = 0; i < N_RUNTIME + N_SHIM; ++i) {
    bool shim = i >= N_RUNTIME;
    if (shim && omp_mode != OMP_GOMP) break;
    const char *name = shim ? gomp_shim[i - N_RUNTIME].name : runtime[i].name;
    void *fn = shim ? gomp_shim[i - N_RUNTIME].fn : runtime[i].fn;
    if (timed && fn == (void *)kiln_kmpc_fork_call) continue;
    syms[n].Name = LLVMOrcLLJITMangleAndIntern(j->lljit, name);
    syms[n].Sym.Address = (LLVMOrcExecutorAddress)(uintptr_t)fn;
    syms[n].Sym.Flags.GenericFlags =
        LLVMJITSymbolGenericFlagsExported | LLVMJITSymbolGenericFlagsCallable;
    syms[n].Sym.Flags.TargetFlags = 0;
    n++;
  }
  err = LLVMOrcJITDylibDefine(jd, LLVMOrcAbsoluteSymbols(syms, (size_t)n));
  if (err) {
    kiln_jit_destroy(j);
    return llvm_error(err, "LLVM ORC: defining runtime symbols");
  }
  LLVMMemoryBufferRef buf = LLVMCreateMemoryBufferWithMemoryRangeCopy(
      (const char *)data, size, "kiln-cached-object");
  err = LLVMOrcLLJITAddObjectFile(j->lljit, jd, buf);
  if (err) {
    kiln_jit_destroy(j);
    return llvm_error(err, "LLVM ORC: adding a cached object");
  }
  *out_jit = j;
  return NULL;
}

#ifndef KILN_OMP_LIBRARY
#define KILN_OMP_LIBRARY "libomp.so.5"
#endif

// Which OpenMP runtime JIT-linked kernels call: LLVM's libomp directly, or
// the host's GNU libgomp through openmp_shim.c (KILN_OPENMP=libomp|gomp
// forces one; by default a libgomp already in the process wins).
static bool omp_ok;
static pthread_once_t omp_once = PTHREAD_ONCE_INIT;
static void load_libomp(void);
static void load_omp(void) {
  const char *pref = getenv("KILN_OPENMP");
  bool force_libomp = pref && strcmp(pref, "libomp") == 0;
  bool force_gomp = pref && strcmp(pref, "gomp") == 0;
  if (!force_libomp && kiln_gomp_bind(force_gomp)) {
    omp_mode = OMP_GOMP;
    omp_ok = true;
    return;
  }
  load_libomp();
}

static void load_libomp(void) {
  // How long idle worker threads spin before they sleep (read by libomp at
  // its initialization; a value the user set wins). Beside another OpenMP
  // runtime (PyTorch's libgomp, when KILN_OPENMP=libomp forces ours) they
  // must not spin: libomp's default 200 ms starved it (a 1 ms MLP forward
  // took 8 ms). Alone, 1 ms: sleeping at once made every parallel region
  // wake its threads (a 2 MB elementwise op 0.17 ms instead of 0.03 ms, a
  // small softmax 0.74 instead of 0.33 on the 2-core VM), while a short
  // spin keeps back-to-back kernels and calls fast and idles soon after.
  void *gomp = dlopen("libgomp.so.1", RTLD_NOW | RTLD_NOLOAD);
  setenv("KMP_BLOCKTIME", gomp ? "0" : "1", 0);
  if (gomp) dlclose(gomp);
  // RTLD_GLOBAL: JIT-linked code finds __kmpc_* through the process symbol
  // search, even when libkiln itself was loaded RTLD_LOCAL (Python ctypes).
  void *h = dlopen(KILN_OMP_LIBRARY, RTLD_NOW | RTLD_GLOBAL);
  if (!h) h = dlopen("libomp.so.5", RTLD_NOW | RTLD_GLOBAL);
  omp_ok = h != NULL;
  if (omp_ok) omp_mode = OMP_LIBOMP;
}

// 1: libomp, 2: the host's libgomp through the shim, 0: none (yet).
static int omp_mode_loaded(void) {
  return omp_mode == OMP_LIBOMP ? 1 : omp_mode == OMP_GOMP ? 2 : 0;
}

bool kiln_jit_openmp_available(void) {
  pthread_once(&omp_once, load_omp);
  return omp_ok;
}

static char host_id[4096];
static bool host_amx;
static pthread_once_t host_id_once = PTHREAD_ONCE_INIT;

// AMX (Intel Sapphire Rapids and later): Linux (5.16+) gives a process the
// tile registers' state only once it asks, with arch_prctl
// ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA (PyTorch's oneDNN asks the
// same); the permission is the whole process's, for every thread.
// KILN_AMX=0 leaves AMX unused (the AVX512-BF16 microkernel then, for
// comparisons).
static bool request_amx(const char *features) {
  if (!features || !strstr(features, "+amx-bf16") || !strstr(features, "+amx-tile"))
    return false;
  const char *env = getenv("KILN_AMX");
  if (env && strcmp(env, "0") == 0) return false;
#if defined(__x86_64__) && defined(SYS_arch_prctl)
  return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */,
                 18 /* XFEATURE_XTILEDATA */) == 0;
#else
  return false;
#endif
}

static void init_host_id(void) {
  char *triple = LLVMGetDefaultTargetTriple();
  char *cpu = LLVMGetHostCPUName();
  char *features = LLVMGetHostCPUFeatures();
  unsigned major = 0, minor = 0, patch = 0;
  LLVMGetVersion(&major, &minor, &patch);
  host_amx = request_amx(features);
  // "/amx": code with tile instructions is reused only where it may run.
  snprintf(host_id, sizeof(host_id), "llvm-%u.%u.%u/%s/%s/%s%s", major, minor,
           patch, triple ? triple : "?", cpu ? cpu : "?",
           features ? features : "", host_amx ? "/amx" : "");
  LLVMDisposeMessage(triple);
  LLVMDisposeMessage(cpu);
  LLVMDisposeMessage(features);
}

const char *kiln_jit_host_id(void) {
  pthread_once(&host_id_once, init_host_id);
  return host_id;
}

bool kiln_jit_amx_available(void) {
  pthread_once(&host_id_once, init_host_id);
  return host_amx;
}

struct kiln_ffi_sig {
  ffi_cif cif;
  int32_t count;
  int32_t nargs;
  int32_t *ranks;     // count entries, in the same allocation
  ffi_type **types;   // nargs entries, in the same allocation
};

kiln_status_t kiln_ffi_sig_create(const int32_t *ranks, int32_t count,
                                  kiln_ffi_sig_t **out_sig) {
  *out_sig = NULL;
  int32_t nargs = 0;
  for (int32_t i = 0; i < count; ++i) {
    if (ranks[i] < 0 || ranks[i] > 8)
      return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                              "ffi signature: rank %d out of range", ranks[i]);
    nargs += 3 + 2 * ranks[i];
  }
  kiln_ffi_sig_t *s =
      calloc(1, sizeof(*s) + sizeof(ffi_type *) * ((size_t)nargs + 1) +
                    sizeof(int32_t) * ((size_t)count + 1));
  if (!s) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "ffi signature");
  s->count = count;
  s->nargs = nargs;
  s->types = (ffi_type **)(void *)(s + 1);
  s->ranks = (int32_t *)(void *)(s->types + nargs + 1);
  memcpy(s->ranks, ranks, sizeof(int32_t) * (size_t)count);
  ffi_type **types = s->types;
  int32_t k = 0;
  for (int32_t i = 0; i < count; ++i) {
    types[k++] = &ffi_type_pointer;
    types[k++] = &ffi_type_pointer;
    for (int32_t j = 0; j < 1 + 2 * ranks[i]; ++j) types[k++] = &ffi_type_sint64;
  }
  if (ffi_prep_cif(&s->cif, FFI_DEFAULT_ABI, (unsigned)nargs, &ffi_type_void,
                   types) != FFI_OK) {
    free(s);
    return kiln_make_status(KILN_STATUS_INTERNAL,
                            "libffi: ffi_prep_cif failed for %d arguments",
                            nargs);
  }
  *out_sig = s;
  return NULL;
}

void kiln_ffi_sig_destroy(kiln_ffi_sig_t *sig) { free(sig); }

// Enough argument slots for 256 rank-8 memrefs without touching the heap on
// the call path.
#define KILN_FFI_STACK_ARGS 1024

kiln_status_t kiln_ffi_call(const kiln_ffi_sig_t *sig, void *fn,
                            const kiln_memref_t *memrefs, int32_t count) {
  if (count != sig->count)
    return kiln_make_status(KILN_STATUS_INTERNAL,
                            "ffi call: %d memrefs for a signature of %d", count,
                            sig->count);
  void *stack_values[KILN_FFI_STACK_ARGS];
  void **values = stack_values;
  if (sig->nargs > KILN_FFI_STACK_ARGS) {
    values = malloc(sizeof(void *) * (size_t)sig->nargs);
    if (!values) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "ffi call");
  }
  int32_t k = 0;
  for (int32_t i = 0; i < count; ++i) {
    const kiln_memref_t *m = &memrefs[i];
    if (m->rank != sig->ranks[i]) {
      if (values != stack_values) free(values);
      return kiln_make_status(KILN_STATUS_INTERNAL,
                              "ffi call: memref %d has rank %d, signature %d",
                              i, m->rank, sig->ranks[i]);
    }
    values[k++] = (void *)&m->allocated;
    values[k++] = (void *)&m->aligned;
    values[k++] = (void *)&m->offset;
    for (int32_t j = 0; j < m->rank; ++j) values[k++] = (void *)&m->sizes[j];
    for (int32_t j = 0; j < m->rank; ++j) values[k++] = (void *)&m->strides[j];
  }
  // The call's frame: a temporary that cannot be allocated lands here.
  call_frame_t frame;
  frame.failed_bytes = 0;
  frame.live = NULL;
  call_frame_t *outer = current_call;
  current_call = &frame;
  void **volatile heap_values = values != stack_values ? values : NULL;
  if (setjmp(frame.unwind) == 0) {
    ffi_call((ffi_cif *)&sig->cif, FFI_FN(fn), NULL, values);
    current_call = outer;
    free(heap_values);
    // Blocks the code left allocated no longer point at this frame.
    pthread_mutex_lock(&pool.lock);
    for (pool_block_t *b = frame.live; b; b = b->live_next) b->frame = NULL;
    pthread_mutex_unlock(&pool.lock);
    return NULL;
  }
  // Unwound: the call's live temporaries go back; its outputs are
  // incomplete.
  current_call = outer;
  free(heap_values);
  for (;;) {
    pthread_mutex_lock(&pool.lock);
    pool_block_t *b = frame.live;
    pthread_mutex_unlock(&pool.lock);
    if (!b) break;
    kiln_rt_free((char *)b + 64);
  }
  return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY,
                          "compiled code: a temporary of %zu bytes could not be "
                          "allocated; the outputs (and inputs it updates in place) "
                          "are incomplete",
                          frame.failed_bytes);
}
