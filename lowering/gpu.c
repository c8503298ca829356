// The CUDA target: linalg (after fusion and bufferization) -> parallel loops
// -> gpu.launch -> outlined kernels -> NVVM -> PTX, and the host function
// read back as a launch program for kiln's own launcher (jit/cuda), so
// kernels run on the caller's stream with no generated host code.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <mlir-c/Dialect/GPU.h>

#include "kernels/gpu_splice.h"
#include "kernels/kernels.h"
#include "lowering/lowering.h"

// Threads per block for the 1-D tiling of every parallel loop nest's
// innermost dim (outer dims map to blocks).
#define KILN_GPU_BLOCK 256

// libdevice from the CUDA toolkit, linked when present so f64 math
// (__nv_exp, ...) resolves; f32 math is kiln's own arithmetic.
static const char *libdevice_path(void) {
  static const char *const paths[] = {
      "/usr/local/cuda/nvvm/libdevice/libdevice.10.bc",
      "/usr/lib/nvidia-cuda-toolkit/libdevice/libdevice.10.bc"};
  for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); ++i)
    if (access(paths[i], R_OK) == 0) return paths[i];
  return NULL;
}

void kiln_gpu_program_free(kiln_gpu_program_t *p) {
  if (!p) return;
  for (int i = 0; i < p->module_count; ++i) free(p->ptx[i]);
  free(p->ptx);
  free(p->temp_bytes);
  free(p->launches);
  for (int i = 0; p->const_data && i < p->const_count; ++i) free(p->const_data[i]);
  free(p->const_data);
  free(p->const_bytes);
  free(p->tmaps);
  memset(p, 0, sizeof(*p));
}

// Bytes of a static memref type, or -1.
static int64_t memref_bytes(MlirType t) {
  if (!mlirTypeIsAMemRef(t) || !mlirShapedTypeHasStaticShape(t)) return -1;
  MlirType el = mlirShapedTypeGetElementType(t);
  int64_t bits = -1;
  if (mlirTypeIsAFloat(el)) bits = (int64_t)mlirFloatTypeGetWidth(el);
  else if (mlirTypeIsAInteger(el)) bits = (int64_t)mlirIntegerTypeGetWidth(el);
  else if (mlirTypeIsAIndex(el)) bits = 64;
  if (bits < 0) return -1;
  int64_t n = 1;
  for (intptr_t i = 0; i < mlirShapedTypeGetRank(t); ++i)
    n *= mlirShapedTypeGetDimSize(t, i);
  return n * ((bits + 7) / 8);
}

// While the host function is read, a constant's buffer index is
// KILN_CONST_TAG + its number; the final index (after the temporaries) is
// known at the end.
#define KILN_CONST_TAG (1 << 20)

typedef struct {
  kiln_gpu_program_t *p;
  MlirValue *temps;  // the memref.alloc result of each temporary
  int temp_cap;
  MlirBlock entry;
  int nargs;
  char (*module_names)[128];  // the gpu.binary of each PTX module
  int module_count;
  MlirOperation module_op;  // where memref.global ops live
  MlirValue *consts;        // the memref.get_global result of each constant
  int const_cap;
} reader_t;

// Bytes of one element of a memref type, or -1.
static int64_t element_bytes(MlirType t) {
  MlirType el = mlirShapedTypeGetElementType(t);
  if (mlirTypeIsAFloat(el)) return ((int64_t)mlirFloatTypeGetWidth(el) + 7) / 8;
  if (mlirTypeIsAInteger(el)) return ((int64_t)mlirIntegerTypeGetWidth(el) + 7) / 8;
  return -1;
}

// A memref.subview whose result has a static offset and static strides:
// kernels take it as the bare pointer of the buffer it views (the lowering
// to LLVM applies the offset from the type). The offset and every outer
// stride must keep 16-byte alignment, which the GPU schedules' vector
// accesses assume (they choose the vector width from the view's own inner
// size: a view of 128 of 130 columns would start odd rows misaligned).
static bool static_subview(MlirOperation op) {
  if (!kiln_gpu_op_named(op, "memref.subview")) return false;
  MlirType t = mlirValueGetType(mlirOperationGetResult(op, 0));
  if (!mlirTypeIsAMemRef(t) || !mlirShapedTypeHasStaticShape(t)) return false;
  int64_t rank = mlirShapedTypeGetRank(t), offset = 0;
  int64_t strides[16];
  if (rank > 16 ||
      mlirLogicalResultIsFailure(mlirMemRefTypeGetStridesAndOffset(t, strides, &offset)))
    return false;
  int64_t eb = element_bytes(t);
  if (eb <= 0) return false;
  for (int64_t i = 0; i < rank; ++i)
    if (mlirShapedTypeIsDynamicStrideOrOffset(strides[i]) ||
        (i < rank - 1 && mlirShapedTypeGetDimSize(t, i) > 1 &&
         (strides[i] * eb) % 16 != 0))
      return false;
  return !mlirShapedTypeIsDynamicStrideOrOffset(offset) && offset >= 0 &&
         (offset * eb) % 16 == 0;
}

// The buffer a host value names: a function argument, a temporary, or a
// view of one (reshapes, static subviews); -1 otherwise.
static int buffer_of(reader_t *r, MlirValue v) {
  for (int depth = 0; depth < 8; ++depth) {
    if (mlirValueIsABlockArgument(v)) {
      if (!mlirBlockEqual(mlirBlockArgumentGetOwner(v), r->entry)) return -1;
      return (int)mlirBlockArgumentGetArgNumber(v);
    }
    for (int i = 0; i < r->p->temp_count; ++i)
      if (mlirValueEqual(r->temps[i], v)) return r->nargs + i;
    for (int i = 0; i < r->p->const_count; ++i)
      if (mlirValueEqual(r->consts[i], v)) return KILN_CONST_TAG + i;
    MlirOperation def = mlirOpResultGetOwner(v);
    if (!(kiln_gpu_op_named(def, "memref.expand_shape") ||
          kiln_gpu_op_named(def, "memref.collapse_shape") ||
          kiln_gpu_op_named(def, "memref.reshape") || kiln_gpu_op_named(def, "memref.cast") ||
          static_subview(def)))
      return -1;
    v = mlirOperationGetOperand(def, 0);
  }
  return -1;
}

static void sbuf_print(MlirStringRef str, void *user) {
  kiln_sbuf_append((kiln_sbuf_t *)user, str.data, str.length);
}

static kiln_status_t push_step(kiln_gpu_program_t *p, const kiln_gpu_launch_t *l) {
  kiln_gpu_launch_t *nl =
      realloc(p->launches, sizeof(*nl) * (size_t)(p->launch_count + 1));
  if (!nl) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "launches");
  p->launches = nl;
  p->launches[p->launch_count++] = *l;
  return NULL;
}

// The nvgpu.tma.create.descriptor a kernel argument passes (through the
// unrealized cast to !llvm.ptr that the tensor-core kernel puts between
// them), or null.
static MlirOperation tensor_map_op(MlirValue v) {
  MlirOperation none = {NULL};
  if (!mlirValueIsAOpResult(v)) return none;
  MlirOperation cast = mlirOpResultGetOwner(v);
  if (!kiln_gpu_op_named(cast, "builtin.unrealized_conversion_cast") ||
      mlirOperationGetNumOperands(cast) != 1)
    return none;
  MlirValue d = mlirOperationGetOperand(cast, 0);
  if (!mlirValueIsAOpResult(d)) return none;
  MlirOperation def = mlirOpResultGetOwner(d);
  return kiln_gpu_op_named(def, "nvgpu.tma.create.descriptor") ? def : none;
}

MlirValue kiln_gpu_tensor_map_source(MlirValue v) {
  MlirOperation tm = tensor_map_op(v);
  if (mlirOperationIsNull(tm)) return (MlirValue){NULL};
  MlirValue u = mlirOperationGetOperand(tm, 0);
  if (!mlirValueIsAOpResult(u) ||
      !kiln_gpu_op_named(mlirOpResultGetOwner(u), "memref.cast"))
    return (MlirValue){NULL};
  return mlirOperationGetOperand(mlirOpResultGetOwner(u), 0);
}

// `key = value` of a printed !nvgpu.tensormap.descriptor as a number of
// bytes (swizzle_128b -> 128, l2promo_256b -> 256, none -> 0), or -1.
static int tensor_map_bytes(const char *type, const char *key) {
  const char *at = strstr(type, key);
  if (!at) return -1;
  at += strlen(key);
  if (strncmp(at, "none", 4) == 0) return 0;
  const char *u = strchr(at, '_');
  const char *end = strpbrk(at, ",>");
  if (!u || (end && u > end)) return -1;
  return atoi(u + 1);
}

// A tensor map from nvgpu.tma.create.descriptor %src box[...]: the memref
// cast to unranked is of a static, row-major view of a buffer whose outer
// strides are multiples of 16 bytes (TMA's rule); the box sizes are
// constants. Becomes the program's next tensor map; *arg the launch's
// argument for it.
static kiln_status_t read_tensor_map(reader_t *r, MlirOperation op, int32_t *arg) {
  kiln_gpu_program_t *p = r->p;
  kiln_gpu_tmap_t t;
  memset(&t, 0, sizeof(t));
  MlirValue u = mlirOperationGetOperand(op, 0);
  MlirOperation cast = mlirValueIsAOpResult(u) ? mlirOpResultGetOwner(u)
                                               : (MlirOperation){NULL};
  if (mlirOperationIsNull(cast) || !kiln_gpu_op_named(cast, "memref.cast"))
    return kiln_make_status(KILN_STATUS_UNSUPPORTED,
                            "cuda: a tensor map of a value that is not a memref.cast");
  MlirValue src = mlirOperationGetOperand(cast, 0);
  MlirType mt = mlirValueGetType(src);
  int64_t rank = mlirTypeIsAMemRef(mt) ? mlirShapedTypeGetRank(mt) : 0;
  int64_t strides[KILN_GPU_TMAP_MAX_RANK], offset = 0, eb = 0;
  bool ok = rank >= 1 && rank <= KILN_GPU_TMAP_MAX_RANK &&
            mlirOperationGetNumOperands(op) == 1 + rank &&
            mlirShapedTypeHasStaticShape(mt) &&
            mlirLogicalResultIsSuccess(mlirMemRefTypeGetStridesAndOffset(mt, strides, &offset)) &&
            !mlirShapedTypeIsDynamicStrideOrOffset(offset) && offset >= 0 &&
            (eb = element_bytes(mt)) > 0;
  MlirType el = ok ? mlirShapedTypeGetElementType(mt) : (MlirType){NULL};
  if (ok) {
    t.dtype = mlirTypeIsABF16(el)   ? KILN_BF16
              : mlirTypeIsAF16(el) ? KILN_F16
              : mlirTypeIsAF32(el) ? KILN_F32
                                   : -1;
    ok = t.dtype >= 0;
  }
  for (int64_t i = 0; ok && i < rank; ++i) {
    int64_t d = rank - 1 - i;  // innermost first
    int64_t box = 0;
    ok = !mlirShapedTypeIsDynamicStrideOrOffset(strides[d]) &&
         kiln_mlir_constant_index(mlirOperationGetOperand(op, 1 + d), &box) && box >= 1 &&
         box <= 256 && (i > 0 || strides[d] == 1) && (i == 0 || (strides[d] * eb) % 16 == 0);
    t.dims[i] = mlirShapedTypeGetDimSize(mt, d);
    t.strides[i] = strides[d] * eb;
    t.box[i] = (int32_t)box;
  }
  kiln_sbuf_t ty;
  kiln_sbuf_init(&ty);
  mlirTypePrint(mlirValueGetType(mlirOperationGetResult(op, 0)), sbuf_print, &ty);
  const char *tys = ty.data ? ty.data : "";
  t.swizzle = tensor_map_bytes(tys, "swizzle = ");
  t.l2promo = tensor_map_bytes(tys, "l2promo = ");
  ok = ok && (t.swizzle == 0 || t.swizzle == 32 || t.swizzle == 64 || t.swizzle == 128) &&
       (t.l2promo == 0 || t.l2promo == 64 || t.l2promo == 128 || t.l2promo == 256) &&
       strstr(tys, "oob = zero") && strstr(tys, "interleave = none") &&
       (t.swizzle == 0 || t.box[0] * eb <= t.swizzle) && (offset * eb) % 16 == 0;
  t.rank = (int32_t)rank;
  t.offset_bytes = offset * eb;
  t.buffer = buffer_of(r, src);
  if (!ok || t.buffer < 0) {
    kiln_sbuf_t what;
    kiln_sbuf_init(&what);
    mlirTypePrint(mt, sbuf_print, &what);
    kiln_status_t s = kiln_make_status(
        KILN_STATUS_UNSUPPORTED,
        "cuda: a TMA tensor map of %s (%s): expected a static, row-major view of "
        "a buffer with 16-byte aligned rows, constant boxes of 1 to 256 within "
        "the swizzle span, zero fill and no interleave",
        what.data ? what.data : "?", tys);
    kiln_sbuf_free(&what);
    kiln_sbuf_free(&ty);
    return s;
  }
  kiln_sbuf_free(&ty);
  kiln_gpu_tmap_t *nt = realloc(p->tmaps, sizeof(*nt) * (size_t)(p->tmap_count + 1));
  if (!nt) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "tensor maps");
  p->tmaps = nt;
  p->tmaps[p->tmap_count] = t;
  *arg = KILN_GPU_TMAP_ARG(p->tmap_count);
  ++p->tmap_count;
  return NULL;
}

static kiln_status_t read_launch(reader_t *r, MlirOperation op) {
  kiln_gpu_program_t *p = r->p;
  intptr_t n = mlirOperationGetNumOperands(op);
  // Operands: grid x/y/z, block x/y/z, the dynamic shared memory size if
  // any (a constant), then the kernel's (no async tokens or clusters in
  // what kiln generates).
  MlirAttribute seg = mlirOperationGetAttributeByName(
      op, mlirStringRefCreateFromCString("operandSegmentSizes"));
  int32_t smem = 0;
  if (!mlirAttributeIsNull(seg) && mlirAttributeIsADenseI32Array(seg) &&
      mlirDenseArrayGetNumElements(seg) >= 11) {
    int32_t async = mlirDenseI32ArrayGetElement(seg, 0);
    int32_t cluster = mlirDenseI32ArrayGetElement(seg, 7);
    smem = mlirDenseI32ArrayGetElement(seg, 10);
    if (async || cluster)
      return kiln_make_status(KILN_STATUS_UNSUPPORTED,
                              "cuda: a kernel launch with async tokens or clusters");
  }
  if (n < 6 + smem)
    return kiln_make_status(KILN_STATUS_INTERNAL, "cuda: malformed launch");
  kiln_gpu_launch_t l;
  memset(&l, 0, sizeof(l));
  if (smem) {
    int64_t bytes = 0;
    MlirValue v = mlirOperationGetOperand(op, 6);
    MlirOperation def = mlirValueIsAOpResult(v) ? mlirOpResultGetOwner(v)
                                                : (MlirOperation){NULL};
    MlirAttribute a = mlirOperationIsNull(def) || !kiln_gpu_op_named(def, "arith.constant")
                          ? (MlirAttribute){NULL}
                          : mlirOperationGetAttributeByName(
                                def, mlirStringRefCreateFromCString("value"));
    if (!mlirAttributeIsNull(a) && mlirAttributeIsAInteger(a))
      bytes = mlirIntegerAttrGetValueInt(a);
    if (bytes <= 0 || bytes > KILN_GPU_MAX_SHARED_BYTES)
      return kiln_make_status(KILN_STATUS_UNSUPPORTED,
                              "cuda: a kernel launch with dynamic shared memory "
                              "that is not a constant of 1 to %d bytes",
                              KILN_GPU_MAX_SHARED_BYTES);
    l.shared_bytes = (uint32_t)bytes;
  }
  for (int k = 0; k < 6; ++k) {
    int64_t v = 0;
    if (!kiln_mlir_constant_index(mlirOperationGetOperand(op, k), &v) || v < 1 ||
        v > 0x7fffffff)
      return kiln_make_status(KILN_STATUS_UNSUPPORTED,
                              "cuda: a kernel launch size that is not a "
                              "constant (dynamic shapes)");
    (k < 3 ? l.grid : l.block)[k % 3] = (uint32_t)v;
  }
  l.arg_count = (int32_t)(n - 6 - smem);
  if (l.arg_count > KILN_GPU_MAX_ARGS)
    return kiln_make_status(KILN_STATUS_UNSUPPORTED,
                            "cuda: a kernel with %d arguments; at most %d",
                            l.arg_count, KILN_GPU_MAX_ARGS);
  for (int k = 0; k < l.arg_count; ++k) {
    MlirValue v = mlirOperationGetOperand(op, 6 + smem + k);
    MlirOperation tm = tensor_map_op(v);
    if (!mlirOperationIsNull(tm)) {
      KILN_RETURN_IF_ERROR_PLAIN(read_tensor_map(r, tm, &l.args[k]));
      continue;
    }
    int b = buffer_of(r, v);
    if (b < 0) {
      kiln_sbuf_t what;
      kiln_sbuf_init(&what);
      mlirTypePrint(mlirValueGetType(v), sbuf_print, &what);
      kiln_status_t s = kiln_make_status(
          KILN_STATUS_UNSUPPORTED,
          "cuda: kernel argument %d (%s) is not a buffer or a static, "
          "16-byte aligned view of one", k, what.data ? what.data : "?");
      kiln_sbuf_free(&what);
      return s;
    }
    l.args[k] = b;
  }
  MlirAttribute kernel = mlirOperationGetAttributeByName(
      op, mlirStringRefCreateFromCString("kernel"));
  if (mlirAttributeIsNull(kernel) || !mlirAttributeIsASymbolRef(kernel))
    return kiln_make_status(KILN_STATUS_INTERNAL, "cuda: launch without kernel");
  MlirStringRef leaf = mlirSymbolRefAttrGetLeafReference(kernel);
  snprintf(l.name, sizeof(l.name), "%.*s", (int)leaf.length, leaf.data);
  l.kind = KILN_GPU_LAUNCH;
  // The module: kernels of different launches share a name, each in its
  // own gpu.module (@kiln_main_kernel_3::@kiln_main_kernel).
  MlirStringRef root = mlirSymbolRefAttrGetRootReference(kernel);
  l.module = -1;
  for (int i = 0; i < r->module_count; ++i)
    if (strlen(r->module_names[i]) == root.length &&
        memcmp(r->module_names[i], root.data, root.length) == 0)
      l.module = i;
  if (l.module < 0)
    return kiln_make_status(KILN_STATUS_INTERNAL,
                            "cuda: no binary for kernel module @%.*s",
                            (int)root.length, root.data);
  return push_step(p, &l);
}

// Byte offset of a contiguous memref type inside the buffer it views (0 for
// an identity layout); -1 when its elements are not one contiguous run.
static int64_t contiguous_offset(MlirType t) {
  if (mlirAttributeIsAAffineMap(mlirMemRefTypeGetLayout(t))) return 0;
  int64_t rank = mlirShapedTypeGetRank(t), offset = 0, strides[16];
  if (rank > 16 || !mlirShapedTypeHasStaticShape(t) ||
      mlirLogicalResultIsFailure(mlirMemRefTypeGetStridesAndOffset(t, strides, &offset)) ||
      mlirShapedTypeIsDynamicStrideOrOffset(offset) || offset < 0)
    return -1;
  int64_t expect = 1;
  for (int64_t i = rank - 1; i >= 0; --i) {
    int64_t size = mlirShapedTypeGetDimSize(t, i);
    if (size != 1 && strides[i] != expect) return -1;
    expect *= size;
  }
  int64_t eb = element_bytes(t);
  return eb > 0 ? offset * eb : -1;
}

// memref.copy between contiguous runs of buffers (bufferization's copy of
// a result into an output, which may be a view inside a temporary): a
// stream-ordered device-to-device copy.
static kiln_status_t read_copy(reader_t *r, MlirOperation op) {
  kiln_gpu_launch_t l;
  memset(&l, 0, sizeof(l));
  l.kind = KILN_GPU_COPY;
  MlirValue src = mlirOperationGetOperand(op, 0);
  MlirValue dst = mlirOperationGetOperand(op, 1);
  int64_t sb = memref_bytes(mlirValueGetType(src));
  int64_t db = memref_bytes(mlirValueGetType(dst));
  l.offsets[0] = contiguous_offset(mlirValueGetType(src));
  l.offsets[1] = contiguous_offset(mlirValueGetType(dst));
  l.args[0] = buffer_of(r, src);
  l.args[1] = buffer_of(r, dst);
  l.arg_count = 2;
  l.bytes = sb;
  snprintf(l.name, sizeof(l.name), "memref.copy");
  if (sb < 0 || sb != db || l.args[0] < 0 || l.args[1] < 0 ||
      l.offsets[0] < 0 || l.offsets[1] < 0) {
    kiln_sbuf_t what;
    kiln_sbuf_init(&what);
    mlirTypePrint(mlirValueGetType(src), sbuf_print, &what);
    kiln_sbuf_puts(&what, " to ");
    mlirTypePrint(mlirValueGetType(dst), sbuf_print, &what);
    kiln_status_t s = kiln_make_status(
        KILN_STATUS_UNSUPPORTED,
        "cuda: a host memref.copy between views (%s), not contiguous runs "
        "of buffers", what.data ? what.data : "?");
    kiln_sbuf_free(&what);
    return s;
  }
  return push_step(r->p, &l);
}

// memref.get_global of a constant (a graph constant bufferized): its data
// becomes one of the program's constants, uploaded to the device once.
static kiln_status_t read_global(reader_t *r, MlirOperation op) {
  // The shape operand of memref.reshape (a graph-level view) is read on
  // the host side of MLIR only: nothing to upload.
  bool device_use = false;
  for (MlirOpOperand u = mlirValueGetFirstUse(mlirOperationGetResult(op, 0));
       !mlirOpOperandIsNull(u); u = mlirOpOperandGetNextUse(u))
    device_use |= !(kiln_gpu_op_named(mlirOpOperandGetOwner(u), "memref.reshape") &&
                    mlirOpOperandGetOperandNumber(u) == 1);
  if (!device_use) return NULL;
  MlirAttribute name = mlirOperationGetAttributeByName(
      op, mlirStringRefCreateFromCString("name"));
  if (mlirAttributeIsNull(name) || !mlirAttributeIsAFlatSymbolRef(name))
    return kiln_make_status(KILN_STATUS_INTERNAL, "cuda: get_global without a name");
  MlirStringRef want = mlirFlatSymbolRefAttrGetValue(name);
  MlirAttribute init = {NULL};
  MlirBlock top = mlirRegionGetFirstBlock(mlirOperationGetRegion(r->module_op, 0));
  for (MlirOperation g = mlirBlockGetFirstOperation(top); !mlirOperationIsNull(g);
       g = mlirOperationGetNextInBlock(g)) {
    if (!kiln_gpu_op_named(g, "memref.global")) continue;
    MlirAttribute sym = mlirOperationGetAttributeByName(
        g, mlirStringRefCreateFromCString("sym_name"));
    MlirStringRef have = mlirStringAttrGetValue(sym);
    if (have.length == want.length && memcmp(have.data, want.data, want.length) == 0)
      init = mlirOperationGetAttributeByName(
          g, mlirStringRefCreateFromCString("initial_value"));
  }
  MlirType t = mlirValueGetType(mlirOperationGetResult(op, 0));
  int64_t bytes = memref_bytes(t), eb = element_bytes(t);
  if (mlirAttributeIsNull(init) || !mlirAttributeIsADenseElements(init) ||
      bytes < 0 || eb <= 0 ||
      (mlirTypeIsAInteger(mlirShapedTypeGetElementType(t)) &&
       mlirIntegerTypeGetWidth(mlirShapedTypeGetElementType(t)) % 8))
    return kiln_make_status(KILN_STATUS_UNSUPPORTED,
                            "cuda: a host constant kiln cannot upload (not a "
                            "dense constant of whole-byte elements)");
  kiln_gpu_program_t *p = r->p;
  if (p->const_count == r->const_cap) {
    int cap = r->const_cap ? r->const_cap * 2 : 4;
    MlirValue *nv = realloc(r->consts, sizeof(*nv) * (size_t)cap);
    int64_t *nb = realloc(p->const_bytes, sizeof(*nb) * (size_t)cap);
    void **nd = realloc(p->const_data, sizeof(*nd) * (size_t)cap);
    if (nv) r->consts = nv;
    if (nb) p->const_bytes = nb;
    if (nd) p->const_data = nd;
    if (!nv || !nb || !nd) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "constants");
    r->const_cap = cap;
  }
  char *data = malloc((size_t)bytes + 1);
  if (!data) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "constants");
  const char *raw = mlirDenseElementsAttrGetRawData(init);
  if (mlirDenseElementsAttrIsSplat(init)) {
    for (int64_t at = 0; at < bytes; at += eb) memcpy(data + at, raw, (size_t)eb);
  } else if (mlirElementsAttrGetNumElements(init) * eb == bytes) {
    memcpy(data, raw, (size_t)bytes);
  } else {
    free(data);
    return kiln_make_status(KILN_STATUS_UNSUPPORTED,
                            "cuda: a host constant whose data is not %lld bytes",
                            (long long)bytes);
  }
  r->consts[p->const_count] = mlirOperationGetResult(op, 0);
  p->const_bytes[p->const_count] = bytes;
  p->const_data[p->const_count++] = data;
  return NULL;
}

// Constants were numbered KILN_CONST_TAG + i while temporaries were still
// being found; they follow the temporaries.
static void place_constants(kiln_gpu_program_t *p) {
  for (int l = 0; l < p->launch_count; ++l)
    for (int a = 0; a < p->launches[l].arg_count; ++a)
      if (p->launches[l].args[a] >= KILN_CONST_TAG)
        p->launches[l].args[a] += p->arg_count + p->temp_count - KILN_CONST_TAG;
  for (int i = 0; i < p->tmap_count; ++i)
    if (p->tmaps[i].buffer >= KILN_CONST_TAG)
      p->tmaps[i].buffer += p->arg_count + p->temp_count - KILN_CONST_TAG;
}

static kiln_status_t read_host(reader_t *r, MlirOperation func) {
  MlirRegion body = mlirOperationGetRegion(func, 0);
  r->entry = mlirRegionGetFirstBlock(body);
  r->nargs = (int)mlirBlockGetNumArguments(r->entry);
  r->p->arg_count = r->nargs;
  if (!mlirBlockIsNull(mlirBlockGetNextInRegion(r->entry)))
    return kiln_make_status(KILN_STATUS_UNSUPPORTED,
                            "cuda: control flow left in the host function");
  for (MlirOperation op = mlirBlockGetFirstOperation(r->entry);
       !mlirOperationIsNull(op); op = mlirOperationGetNextInBlock(op)) {
    if (kiln_gpu_op_named(op, "arith.constant") || kiln_gpu_op_named(op, "memref.dealloc") ||
        kiln_gpu_op_named(op, "func.return") || kiln_gpu_op_named(op, "memref.expand_shape") ||
        kiln_gpu_op_named(op, "memref.collapse_shape") || kiln_gpu_op_named(op, "memref.cast") ||
        kiln_gpu_op_named(op, "memref.reshape") || static_subview(op) ||
        // TMA tensor maps: read where a launch passes them (read_launch).
        kiln_gpu_op_named(op, "nvgpu.tma.create.descriptor") ||
        (kiln_gpu_op_named(op, "builtin.unrealized_conversion_cast") &&
         mlirOperationGetNumResults(op) == 1 &&
         !mlirOperationIsNull(tensor_map_op(mlirOperationGetResult(op, 0)))))
      continue;
    // Graph constants, and the constant shape operands of memref.reshape
    // (graph-level views; a reshape's operand is not a kernel argument).
    if (kiln_gpu_op_named(op, "memref.get_global")) {
      KILN_RETURN_IF_ERROR_PLAIN(read_global(r, op));
      continue;
    }
    if (kiln_gpu_op_named(op, "gpu.launch_func")) {
      KILN_RETURN_IF_ERROR_PLAIN(read_launch(r, op));
      continue;
    }
    if (kiln_gpu_op_named(op, "memref.copy")) {
      KILN_RETURN_IF_ERROR_PLAIN(read_copy(r, op));
      continue;
    }
    if (kiln_gpu_op_named(op, "memref.alloc") || kiln_gpu_op_named(op, "memref.alloca")) {
      int64_t bytes = memref_bytes(mlirValueGetType(mlirOperationGetResult(op, 0)));
      if (bytes < 0)
        return kiln_make_status(KILN_STATUS_UNSUPPORTED,
                                "cuda: a temporary of dynamic size");
      if (r->p->temp_count == r->temp_cap) {
        int cap = r->temp_cap ? r->temp_cap * 2 : 8;
        MlirValue *nt = realloc(r->temps, sizeof(*nt) * (size_t)cap);
        int64_t *nb = realloc(r->p->temp_bytes, sizeof(*nb) * (size_t)cap);
        if (nt) r->temps = nt;
        if (nb) r->p->temp_bytes = nb;
        if (!nt || !nb) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "temps");
        r->temp_cap = cap;
      }
      r->temps[r->p->temp_count] = mlirOperationGetResult(op, 0);
      r->p->temp_bytes[r->p->temp_count++] = bytes;
      continue;
    }
    MlirStringRef nm = mlirIdentifierStr(mlirOperationGetName(op));
    return kiln_make_status(KILN_STATUS_UNSUPPORTED,
                            "cuda: host op '%.*s' left in @%s after the GPU "
                            "pipeline; kiln's launcher runs kernel launches "
                            "and temporaries only",
                            (int)nm.length, nm.data, KILN_ENTRY_NAME);
  }
  return NULL;
}

// Gives each workgroup (shared memory) attribution of an outlined kernel
// 16-byte alignment (llvm.align, which convert-gpu-to-nvvm puts on the
// .shared variable; it was .align 4): the hand-written kernels fill them
// with 16-byte cp.async copies and read them as 16-byte vectors.
static MlirWalkResult align_workgroup(MlirOperation op, void *user) {
  if (!kiln_gpu_op_named(op, "gpu.func")) return MlirWalkResultAdvance;
  MlirAttribute n = mlirOperationGetAttributeByName(
      op, mlirStringRefCreateFromCString("workgroup_attributions"));
  if (mlirAttributeIsNull(n) || !mlirAttributeIsAInteger(n) ||
      mlirIntegerAttrGetValueInt(n) <= 0 ||
      !mlirAttributeIsNull(mlirOperationGetAttributeByName(
          op, mlirStringRefCreateFromCString("workgroup_attrib_attrs"))))
    return MlirWalkResultSkip;
  MlirContext ctx = *(MlirContext *)user;
  MlirNamedAttribute align = mlirNamedAttributeGet(
      mlirIdentifierGet(ctx, mlirStringRefCreateFromCString("llvm.align")),
      mlirIntegerAttrGet(mlirIntegerTypeGet(ctx, 64), 16));
  MlirAttribute dict = mlirDictionaryAttrGet(ctx, 1, &align);
  int64_t count = mlirIntegerAttrGetValueInt(n);
  MlirAttribute each[16];
  if (count > 16) return MlirWalkResultSkip;
  for (int64_t i = 0; i < count; ++i) each[i] = dict;
  mlirOperationSetAttributeByName(op,
                                  mlirStringRefCreateFromCString("workgroup_attrib_attrs"),
                                  mlirArrayAttrGet(ctx, count, each));
  return MlirWalkResultSkip;
}

// TMA tensor maps reach an outlined kernel as !llvm.ptr arguments (the
// form convert-nvgpu-to-nvvm gives a descriptor; kiln's kernels pass no
// other pointer). Each becomes a 128-byte by-value parameter
// (`llvm.byval`, 64-byte aligned, `nvvm.grid_constant`): NVPTX takes its
// address in the param space (cvta.param) for cp.async.bulk.tensor, and
// the launcher passes the encoded map itself, so no device memory holds
// it and a CUDA graph records it with the launch. The attributes go on the
// llvm.func after convert-gpu-to-nvvm, which drops `llvm.byval` from a
// gpu.func and refuses `nvvm.grid_constant` outside a kernel.
typedef struct {
  struct tmap_param {
    char module[128];
    int arg;
  } *at;
  int count, cap;
  bool oom;
} tmap_params_t;

static MlirWalkResult find_tmap_params(MlirOperation op, void *user) {
  if (!kiln_gpu_op_named(op, "gpu.func")) return MlirWalkResultAdvance;
  tmap_params_t *t = user;
  MlirOperation mod = mlirOperationGetParentOperation(op);
  MlirAttribute nm = mlirOperationGetAttributeByName(
      mod, mlirStringRefCreateFromCString("sym_name"));
  MlirBlock entry = mlirRegionGetFirstBlock(mlirOperationGetRegion(op, 0));
  if (mlirAttributeIsNull(nm) || mlirBlockIsNull(entry)) return MlirWalkResultSkip;
  MlirStringRef name = mlirStringAttrGetValue(nm);
  MlirType ptr = mlirTypeParseGet(mlirOperationGetContext(op),
                                  mlirStringRefCreateFromCString("!llvm.ptr"));
  for (intptr_t i = 0; i < mlirBlockGetNumArguments(entry); ++i) {
    if (!mlirTypeEqual(mlirValueGetType(mlirBlockGetArgument(entry, i)), ptr)) continue;
    if (t->count == t->cap) {
      int cap = t->cap ? 2 * t->cap : 16;
      struct tmap_param *n = realloc(t->at, sizeof(*n) * (size_t)cap);
      if (!n) {
        t->oom = true;
        break;
      }
      t->at = n;
      t->cap = cap;
    }
    snprintf(t->at[t->count].module, sizeof(t->at[0].module), "%.*s", (int)name.length,
             name.data);
    t->at[t->count++].arg = (int)i;
  }
  return MlirWalkResultSkip;
}

static MlirWalkResult mark_tmap_params(MlirOperation op, void *user) {
  if (!kiln_gpu_op_named(op, "llvm.func")) return MlirWalkResultAdvance;
  const tmap_params_t *t = user;
  MlirOperation mod = mlirOperationGetParentOperation(op);
  MlirAttribute nm = mlirOperationGetAttributeByName(
      mod, mlirStringRefCreateFromCString("sym_name"));
  MlirBlock entry = mlirRegionGetFirstBlock(mlirOperationGetRegion(op, 0));
  if (mlirAttributeIsNull(nm) || mlirBlockIsNull(entry) ||
      mlirAttributeIsNull(mlirOperationGetAttributeByName(
          op, mlirStringRefCreateFromCString("nvvm.kernel"))))
    return MlirWalkResultSkip;
  MlirStringRef name = mlirStringAttrGetValue(nm);
  MlirContext ctx = mlirOperationGetContext(op);
  intptr_t n = mlirBlockGetNumArguments(entry);
  MlirAttribute old = mlirOperationGetAttributeByName(
      op, mlirStringRefCreateFromCString("arg_attrs"));
  MlirAttribute each[KILN_GPU_MAX_ARGS];
  if (n > KILN_GPU_MAX_ARGS) return MlirWalkResultSkip;  // refused by read_launch
  bool any = false;
  for (intptr_t i = 0; i < n; ++i) {
    each[i] = !mlirAttributeIsNull(old) && mlirAttributeIsAArray(old) &&
                      mlirArrayAttrGetNumElements(old) == n
                  ? mlirArrayAttrGetElement(old, i)
                  : mlirDictionaryAttrGet(ctx, 0, NULL);
    for (int k = 0; k < t->count; ++k)
      if (t->at[k].arg == i && strlen(t->at[k].module) == name.length &&
          memcmp(t->at[k].module, name.data, name.length) == 0) {
        // The argument's other attributes stay.
        MlirNamedAttribute attrs[16];
        intptr_t n_old = mlirAttributeIsADictionary(each[i])
                             ? mlirDictionaryAttrGetNumElements(each[i])
                             : 0;
        int na = 0;
        for (intptr_t a = 0; a < n_old && na < 13; ++a) {
          MlirNamedAttribute e = mlirDictionaryAttrGetElement(each[i], a);
          MlirStringRef an = mlirIdentifierStr(e.name);
          if (!(an.length == 10 && memcmp(an.data, "llvm.byval", 10) == 0) &&
              !(an.length == 10 && memcmp(an.data, "llvm.align", 10) == 0) &&
              !(an.length == 18 && memcmp(an.data, "nvvm.grid_constant", 18) == 0))
            attrs[na++] = e;
        }
        attrs[na++] = mlirNamedAttributeGet(
            mlirIdentifierGet(ctx, mlirStringRefCreateFromCString("llvm.byval")),
            mlirTypeAttrGet(mlirTypeParseGet(
                ctx, mlirStringRefCreateFromCString("!llvm.array<128 x i8>"))));
        attrs[na++] = mlirNamedAttributeGet(
            mlirIdentifierGet(ctx, mlirStringRefCreateFromCString("llvm.align")),
            mlirIntegerAttrGet(mlirIntegerTypeGet(ctx, 64), 64));
        attrs[na++] = mlirNamedAttributeGet(
            mlirIdentifierGet(ctx, mlirStringRefCreateFromCString("nvvm.grid_constant")),
            mlirUnitAttrGet(ctx));
        each[i] = mlirDictionaryAttrGet(ctx, na, attrs);
        any = true;
      }
  }
  if (any)
    mlirOperationSetAttributeByName(op, mlirStringRefCreateFromCString("arg_attrs"),
                                    mlirArrayAttrGet(ctx, n, each));
  return MlirWalkResultSkip;
}

// Marks the float adds, subtractions, multiplies and add-reductions inside
// GPU modules `contract`.
static MlirWalkResult allow_contraction(MlirOperation op, void *user) {
  if (!(kiln_gpu_op_named(op, "llvm.fmul") || kiln_gpu_op_named(op, "llvm.fadd") ||
        kiln_gpu_op_named(op, "llvm.fsub") ||
        kiln_gpu_op_named(op, "llvm.intr.vector.reduce.fadd")))
    return MlirWalkResultAdvance;
  const MlirAttribute *contract = user;
  for (MlirOperation p = mlirOperationGetParentOperation(op);
       !mlirOperationIsNull(p); p = mlirOperationGetParentOperation(p))
    if (kiln_gpu_op_named(p, "gpu.module")) {
      mlirOperationSetAttributeByName(
          op, mlirStringRefCreateFromCString("fastmathFlags"), *contract);
      break;
    }
  return MlirWalkResultAdvance;
}

// The outlined kernel modules whose nvgpu.ldmatrix ops read bf16 or f16
// fragments: kernels/gpu_mma.c's bf16 kernel loads bf16 and gives
// mma.sync their bits as f16 vectors, its f16 kernel loads f16. Only the
// former's mma.sync are relabeled bf16 in the PTX; a module with both, or
// with an mma.sync and no entry here, is refused.
typedef struct {
  struct mma_module {
    char name[128];
    bool bf16, f16;
  } *at;
  int count;
  bool oom;
} mma_modules_t;

static MlirWalkResult find_mma_modules(MlirOperation op, void *user) {
  mma_modules_t *t = user;
  if (!kiln_gpu_op_named(op, "nvgpu.ldmatrix") || mlirOperationGetNumResults(op) != 1)
    return MlirWalkResultAdvance;
  MlirType rt = mlirValueGetType(mlirOperationGetResult(op, 0));
  MlirType el = mlirShapedTypeGetElementType(rt);
  MlirOperation mod = mlirOperationGetParentOperation(op);
  while (!mlirOperationIsNull(mod) && !kiln_gpu_op_named(mod, "gpu.module"))
    mod = mlirOperationGetParentOperation(mod);
  if (mlirOperationIsNull(mod)) return MlirWalkResultAdvance;
  MlirStringRef nm = mlirStringAttrGetValue(mlirOperationGetAttributeByName(
      mod, mlirStringRefCreateFromCString("sym_name")));
  int i = 0;
  while (i < t->count && !(strlen(t->at[i].name) == nm.length &&
                           memcmp(t->at[i].name, nm.data, nm.length) == 0))
    ++i;
  if (i == t->count) {
    struct mma_module *grown = realloc(t->at, sizeof(*grown) * (size_t)(t->count + 1));
    if (!grown) {
      t->oom = true;
      return MlirWalkResultInterrupt;
    }
    t->at = grown;
    memset(&t->at[i], 0, sizeof(t->at[i]));
    snprintf(t->at[i].name, sizeof(t->at[i].name), "%.*s", (int)nm.length, nm.data);
    ++t->count;
  }
  t->at[i].bf16 |= mlirTypeIsABF16(el);
  t->at[i].f16 |= mlirTypeIsAF16(el);
  return MlirWalkResultAdvance;
}

// The entry function and every gpu.binary (one per outlined kernel: an
// optimizer step over a model's parameters has hundreds).
typedef struct {
  MlirOperation func;
  MlirOperation *binaries;
  int binary_count, binary_capacity;
  bool oom;
} finder_t;

static MlirWalkResult find_parts(MlirOperation op, void *user) {
  finder_t *f = user;
  if (kiln_gpu_op_named(op, "gpu.binary")) {
    if (f->binary_count == f->binary_capacity) {
      int cap = f->binary_capacity ? 2 * f->binary_capacity : 64;
      MlirOperation *nb = realloc(f->binaries, sizeof(*nb) * (size_t)cap);
      if (!nb) {
        f->oom = true;
        return MlirWalkResultInterrupt;
      }
      f->binaries = nb;
      f->binary_capacity = cap;
    }
    f->binaries[f->binary_count++] = op;
  }
  if (kiln_gpu_op_named(op, "func.func")) {
    MlirAttribute n = mlirOperationGetAttributeByName(
        op, mlirStringRefCreateFromCString("sym_name"));
    MlirStringRef s = mlirStringAttrGetValue(n);
    if (s.length == strlen(KILN_ENTRY_NAME) &&
        memcmp(s.data, KILN_ENTRY_NAME, s.length) == 0)
      f->func = op;
  }
  return MlirWalkResultAdvance;
}

// A linalg op on rank-0 buffers only has no loop to map to threads; left
// alone it would become scalar host code. Each such op of the entry
// function moves into an scf.parallel of one iteration, which the
// parallel-loop mapping turns into a kernel of one block.
static kiln_status_t wrap_scalar_ops(MlirContext ctx, MlirModule module) {
  MlirOperation main = kiln_mlir_find_symbol(
      mlirModuleGetBody(module), mlirStringRefCreateFromCString(KILN_ENTRY_NAME));
  if (mlirOperationIsNull(main)) return NULL;
  MlirBlock body = mlirRegionGetFirstBlock(mlirOperationGetRegion(main, 0));
  MlirLocation loc = mlirLocationUnknownGet(ctx);
  MlirType index = mlirIndexTypeGet(ctx);
  for (MlirOperation op = mlirBlockGetFirstOperation(body); !mlirOperationIsNull(op);) {
    MlirOperation next = mlirOperationGetNextInBlock(op);
    MlirStringRef n = mlirIdentifierStr(mlirOperationGetName(op));
    bool scalar = n.length > 7 && memcmp(n.data, "linalg.", 7) == 0 &&
                  mlirOperationGetNumOperands(op) > 0;
    for (intptr_t i = 0; scalar && i < mlirOperationGetNumOperands(op); ++i) {
      MlirType t = mlirValueGetType(mlirOperationGetOperand(op, i));
      scalar = !mlirTypeIsAShaped(t) || (mlirShapedTypeHasRank(t) && mlirShapedTypeGetRank(t) == 0);
    }
    if (!scalar) {
      op = next;
      continue;
    }
    MlirValue bounds[3];
    for (int k = 0; k < 3; ++k)
      bounds[k] = kiln_mlir_index_constant(ctx, body, op, k != 0);
    MlirRegion region = mlirRegionCreate();
    MlirBlock inner = mlirBlockCreate(1, &index, &loc);
    mlirRegionAppendOwnedBlock(region, inner);
    MlirOperationState r = mlirOperationStateGet(
        mlirStringRefCreateFromCString("scf.reduce"), loc);
    MlirOperation reduce = mlirOperationCreate(&r);
    mlirBlockAppendOwnedOperation(inner, reduce);
    MlirOperationState p = mlirOperationStateGet(
        mlirStringRefCreateFromCString("scf.parallel"), loc);
    mlirOperationStateAddOperands(&p, 3, bounds);
    int32_t segs[4] = {1, 1, 1, 0};
    MlirNamedAttribute seg = mlirNamedAttributeGet(
        mlirIdentifierGet(ctx, mlirStringRefCreateFromCString("operandSegmentSizes")),
        mlirDenseI32ArrayGet(ctx, 4, segs));
    mlirOperationStateAddAttributes(&p, 1, &seg);
    mlirOperationStateAddOwnedRegions(&p, 1, &region);
    MlirOperation par = mlirOperationCreate(&p);
    if (mlirOperationIsNull(par))
      return kiln_make_status(KILN_STATUS_INTERNAL, "cuda: scf.parallel for a rank-0 op");
    mlirBlockInsertOwnedOperationBefore(body, op, par);
    mlirOperationMoveBefore(op, reduce);
    op = next;
  }
  return NULL;
}

static kiln_status_t to_ptx(kiln_mlir_t *m, MlirModule module,
                            const kiln_pipeline_options_t *o, const char *target,
                            const char *link, const char *mma_nvvm,
                            tmap_params_t *tmap_params);
static kiln_status_t read_ptx(MlirModule module, int mma, const mma_modules_t *mods,
                              kiln_gpu_program_t *out);

kiln_status_t kiln_pipeline_run_gpu(kiln_mlir_t *m, MlirModule module,
                                    const char *chip,
                                    const kiln_pipeline_options_t *opts,
                                    kiln_gpu_program_t *out) {
  memset(out, 0, sizeof(*out));
  kiln_pipeline_options_t o = {0};
  if (opts) o = *opts;
  // opts->vectorize selects kernels/' GPU schedules (blocks and threads
  // through the transform dialect); ops they leave, and everything when
  // off, take the parallel-loop mapping below.
  bool schedules = o.vectorize != 0;
  const kiln_kernel_tiling_t *tiling = o.tiling;  // the tensor-core GEMM's
  o.vectorize = 0;  // the CPU schedules are not for the GPU
  o.threads = 1;
  o.tiling = NULL;
  KILN_RETURN_IF_ERROR_PLAIN(kiln_pipeline_run(m, module, KILN_STAGE_LINALG,
                                               KILN_STAGE_FUSED, &o));
  // Tensor cores (kernels/gpu_mma.c: cp.async, ldmatrix, mma.sync) from
  // sm_80 on; the f32 GEMM kernel (kernels/gpu_sgemm.c) needs cp.async too.
  int sm = atoi(chip + (strncmp(chip, "sm_", 3) == 0 ? 3 : 0));
  int mma = 0;    // matmuls on tensor cores (mma.sync)
  int wgmma = 0;  // matmuls on tensor cores (sm_90's wgmma)
  int sgemm = 0;  // f32 matmuls by kernels/gpu_sgemm.c
  if (schedules) {
    kiln_mlir_clear_diagnostics(m);
    KILN_RETURN_IF_ERROR_PLAIN(kiln_mlir_with_diagnostics(
        m, kiln_kernels_rows_gpu(kiln_mlir_context(m), module)));
    KILN_RETURN_IF_ERROR_PLAIN(kiln_mlir_with_diagnostics(
        m, kiln_kernels_tile_gpu(kiln_mlir_context(m), module, sm, &mma, &sgemm)));
  }
  KILN_RETURN_IF_ERROR_PLAIN(kiln_pipeline_run(m, module, KILN_STAGE_FUSED,
                                               KILN_STAGE_BUFFERIZED, &o));
  // A tagged matmul the kernel does not take (not on whole row-major
  // buffers) stays a linalg.matmul: the parallel-loop mapping computes it.
  if (mma)
    KILN_RETURN_IF_ERROR_PLAIN(
        kiln_kernels_mma_gpu(kiln_mlir_context(m), module, sm, tiling, &mma, &wgmma));
  if (sgemm)
    KILN_RETURN_IF_ERROR_PLAIN(
        kiln_kernels_sgemm_gpu(kiln_mlir_context(m), module, &sgemm));
  if (schedules) {
    KILN_RETURN_IF_ERROR_PLAIN(kiln_kernels_rows_gpu_finish(kiln_mlir_context(m), module));
    KILN_RETURN_IF_ERROR_PLAIN(kiln_kernels_map_gpu(kiln_mlir_context(m), module));
  }
  const char *ld = libdevice_path();
  char link[512] = "";
  if (ld) snprintf(link, sizeof(link), " l=%s", ld);
  // The mma and f32 GEMM kernels' nvgpu ops (cp.async, ldmatrix,
  // mma.sync) to NVVM.
  // wgmma.mma_async (a PTX-builder op) becomes inline assembly in
  // convert-nvvm-to-llvm.
  const char *mma_nvvm = wgmma   ? "convert-nvgpu-to-nvvm,convert-nvvm-to-llvm,"
                         : mma || sgemm ? "convert-nvgpu-to-nvvm,"
                                        : "";
  // wgmma exists on sm_90a, the architecture-specific target of sm_90.
  char target[24];
  snprintf(target, sizeof(target), "%s%s", chip,
           wgmma && strcmp(chip, "sm_90") == 0 ? "a" : "");
  // Rank-0 ops (an optimizer's step counts and bias corrections) run as
  // one-thread kernels: the host program only launches.
  KILN_RETURN_IF_ERROR_PLAIN(wrap_scalar_ops(kiln_mlir_context(m), module));
  char pipeline[2048];
  snprintf(pipeline, sizeof(pipeline),
           "builtin.module(gpu-launch-sink-index-computations,gpu-kernel-outlining,"
           "func.func(scf-forall-to-parallel,"
           "convert-linalg-to-parallel-loops,"
           "scf-parallel-loop-tiling{parallel-loop-tile-sizes=%d no-min-max-bounds=true},"
           "gpu-map-parallel-loops,convert-parallel-loops-to-gpu,canonicalize),"
           "gpu-launch-sink-index-computations,gpu-kernel-outlining)",
           KILN_GPU_BLOCK);
  KILN_RETURN_IF_ERROR_PLAIN(kiln_pipeline_run_text(m, module, pipeline,
                                                    "the CUDA pipeline (kernels)"));
  MlirContext mctx = kiln_mlir_context(m);
  mlirOperationWalk(mlirModuleGetOperation(module), align_workgroup, &mctx,
                    MlirWalkPreOrder);
  const char *hfuse = getenv("KILN_HFUSE");
  if (!hfuse || strcmp(hfuse, "0") != 0) {
    int fused = 0;
    kiln_mlir_clear_diagnostics(m);
    KILN_RETURN_IF_ERROR_PLAIN(kiln_mlir_with_diagnostics(
        m, kiln_gpu_fuse_launches(kiln_mlir_context(m), module, &fused)));
  }
  mma_modules_t mma_mods;
  memset(&mma_mods, 0, sizeof(mma_mods));
  mlirOperationWalk(mlirModuleGetOperation(module), find_mma_modules, &mma_mods,
                    MlirWalkPreOrder);
  if (mma_mods.oom) {
    free(mma_mods.at);
    return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "cuda: tensor-core kernels");
  }
  tmap_params_t tmap_params;
  memset(&tmap_params, 0, sizeof(tmap_params));
  mlirOperationWalk(mlirModuleGetOperation(module), find_tmap_params, &tmap_params,
                    MlirWalkPreOrder);
  if (tmap_params.oom) {
    free(tmap_params.at);
    free(mma_mods.at);
    return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "cuda: TMA tensor maps");
  }
  kiln_status_t s = to_ptx(m, module, &o, target, link, mma_nvvm, &tmap_params);
  free(tmap_params.at);
  if (!s) s = read_ptx(module, mma, &mma_mods, out);
  free(mma_mods.at);
  return s;
}

// The kernel modules to NVVM (with the tensor maps' parameters marked) and
// PTX (gpu.binary ops).
static kiln_status_t to_ptx(kiln_mlir_t *m, MlirModule module,
                            const kiln_pipeline_options_t *o, const char *target,
                            const char *link, const char *mma_nvvm,
                            tmap_params_t *tmap_params) {
  char pipeline[2048];
  snprintf(pipeline, sizeof(pipeline),
           "builtin.module("
           "nvvm-attach-target{chip=%s features=+ptx80 O=3%s},"
           "gpu.module(convert-linalg-to-loops,convert-vector-to-scf{full-unroll=true},"
           "expand-strided-metadata,lower-affine,convert-vector-to-llvm{use-vector-alignment=true},"
           "convert-scf-to-cf,%s"
           "convert-gpu-to-nvvm{use-bare-ptr-memref-call-conv=1},canonicalize,"
           "reconcile-unrealized-casts))",
           target, link, mma_nvvm);
  KILN_RETURN_IF_ERROR_PLAIN(
      kiln_pipeline_run_text(m, module, pipeline, "the CUDA pipeline"));
  if (tmap_params->count)
    mlirOperationWalk(mlirModuleGetOperation(module), mark_tmap_params, tmap_params,
                      MlirWalkPreOrder);
  // Kernel multiply-adds may contract to fma (as cuBLAS and Inductor's
  // Triton kernels do): without the flag NVPTX emits mul.rn + add.rn,
  // which ptxas must not fuse.
  MlirAttribute contract = mlirAttributeParseGet(
      kiln_mlir_context(m),
      mlirStringRefCreateFromCString("#llvm.fastmath<contract>"));
  if (mlirAttributeIsNull(contract))
    return kiln_make_status(KILN_STATUS_INTERNAL, "cuda: #llvm.fastmath");
  mlirOperationWalk(mlirModuleGetOperation(module), allow_contraction,
                    &contract, MlirWalkPreOrder);
  KILN_RETURN_IF_ERROR_PLAIN(kiln_pipeline_run_text(
      m, module, "builtin.module(gpu-module-to-binary{format=isa})",
      "the CUDA pipeline (PTX)"));
  if (o->dump_dir) {
    char *text = NULL;
    if (!kiln_mlir_print(module, &text)) {
      kiln_pipeline_dump(o, KILN_STAGE_LLVM, text);
      free(text);
    }
  }
  return NULL;
}

// The program from the module's PTX and host function: the PTX of each
// gpu.binary, bf16 tensor-core kernels' mma.sync relabeled (`mods`; the
// mma.sync kernels of either type, `mma` of them, in 1 to `mma` modules),
// the launches, copies and buffers; on failure `out` is freed.
static kiln_status_t read_ptx(MlirModule module, int mma, const mma_modules_t *mods,
                              kiln_gpu_program_t *out) {
  finder_t f;
  memset(&f, 0, sizeof(f));
  mlirOperationWalk(mlirModuleGetOperation(module), find_parts, &f,
                    MlirWalkPreOrder);
  if (f.oom) {
    free(f.binaries);
    return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "cuda: kernel modules");
  }
  if (mlirOperationIsNull(f.func)) {
    free(f.binaries);
    return kiln_make_status(KILN_STATUS_INTERNAL, "cuda: no @%s", KILN_ENTRY_NAME);
  }
  // Every gpu.binary's PTX, by module name.
  kiln_status_t s = NULL;
  char(*names)[128] = calloc((size_t)f.binary_count + 1, sizeof(*names));
  out->ptx = calloc((size_t)f.binary_count + 1, sizeof(char *));
  if (!names || !out->ptx) s = kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "PTX");
  for (int i = 0; !s && i < f.binary_count; ++i) {
    MlirOperation b = f.binaries[i];
    MlirStringRef nm = mlirStringAttrGetValue(mlirOperationGetAttributeByName(
        b, mlirStringRefCreateFromCString("sym_name")));
    snprintf(names[i], sizeof(names[i]), "%.*s", (int)nm.length, nm.data);
    MlirAttribute objs = mlirOperationGetAttributeByName(
        b, mlirStringRefCreateFromCString("objects"));
    if (mlirAttributeIsNull(objs) || !mlirAttributeIsAArray(objs) ||
        mlirArrayAttrGetNumElements(objs) < 1 ||
        !mlirAttributeIsAGPUObjectAttr(mlirArrayAttrGetElement(objs, 0))) {
      s = kiln_make_status(KILN_STATUS_INTERNAL, "cuda: no PTX in @%s", names[i]);
      break;
    }
    MlirStringRef ptx = mlirGPUObjectAttrGetObject(mlirArrayAttrGetElement(objs, 0));
    out->ptx[i] = malloc(ptx.length + 1);
    if (!out->ptx[i]) {
      s = kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "PTX");
      break;
    }
    memcpy(out->ptx[i], ptx.data, ptx.length);
    out->ptx[i][ptx.length] = 0;
    out->module_count = i + 1;
  }
  // Tensor cores: kernels/gpu_mma.c multiplies bf16 bits as f16 vectors
  // (MLIR 22's nvgpu has no bf16 mma.sync; fragment layouts and registers
  // are the same), so the f16 mma.sync of a module whose fragments are
  // bf16 (`mods`) become bf16 ones here (each name grows by 2 bytes); an
  // f16 kernel's stay. A module with an mma.sync must be one of `mods`
  // (kiln's kernels: no other code makes one) with fragments of one type,
  // and (bf16) no f16 arithmetic or f16 -> f32 conversion; there are 1 to
  // `mma` such modules (hfuse may have merged several kernels into one).
  // Otherwise the module is refused (the caller recompiles with the plain
  // mapping).
  static const char kF16Mma[] = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32";
  static const char kBf16Mma[] = "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32";
  int mma_modules = 0;
  for (int i = 0; !s && i < out->module_count; ++i) {
    const struct mma_module *mod = NULL;
    for (int j = 0; j < mods->count; ++j)
      if (strcmp(mods->at[j].name, names[i]) == 0) mod = &mods->at[j];
    if (!strstr(out->ptx[i], kF16Mma)) continue;
    if (!mod || mod->bf16 == mod->f16) {
      s = kiln_make_status(KILN_STATUS_INTERNAL,
                           "cuda: kernel module @%s has mma.sync with %s fragments",
                           names[i], !mod ? "no ldmatrix" : mod->bf16 ? "bf16 and f16"
                                                                      : "neither bf16 nor f16");
      break;
    }
    if (mod->f16) {
      ++mma_modules;
      continue;
    }
    bool any = false;
    for (char *q = out->ptx[i]; (q = strstr(q, kF16Mma)) != NULL;) {
      // "...f32.f16.f16.f32" -> "...f32.bf16.bf16.f32" is 2 bytes longer.
      size_t tail = strlen(q + sizeof(kF16Mma) - 1);
      char *grown = realloc(out->ptx[i], strlen(out->ptx[i]) + 3);
      if (!grown) {
        s = kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "PTX");
        break;
      }
      q = grown + (q - out->ptx[i]);
      out->ptx[i] = grown;
      memmove(q + sizeof(kBf16Mma) - 1, q + sizeof(kF16Mma) - 1, tail + 1);
      memcpy(q, kBf16Mma, sizeof(kBf16Mma) - 1);
      q += sizeof(kBf16Mma) - 1;
      any = true;
    }
    mma_modules += any;
    static const char *const kF16Math[] = {"cvt.f32.f16", "fma.rn.f16",
                                           "mul.rn.f16", "add.rn.f16"};
    for (size_t k = 0; any && !s && k < sizeof(kF16Math) / sizeof(kF16Math[0]); ++k)
      if (strstr(out->ptx[i], kF16Math[k]))
        s = kiln_make_status(KILN_STATUS_INTERNAL, "cuda: a tensor-core kernel "
                             "with f16 arithmetic (%s)", kF16Math[k]);
  }
  if (!s && (mma_modules > mma || (mma > 0 && mma_modules == 0)))
    s = kiln_make_status(KILN_STATUS_INTERNAL,
                         "cuda: %d tensor-core matmuls, %d kernels with "
                         "mma.sync", mma, mma_modules);
  reader_t r = {out, NULL, 0, {NULL}, 0, names, f.binary_count,
                mlirModuleGetOperation(module), NULL, 0};
  if (!s) s = read_host(&r, f.func);
  if (!s) place_constants(out);
  free(r.temps);
  free(r.consts);
  free(names);
  free(f.binaries);
  // Vector accesses (ld/st.global.v2/v4 from the GPU schedules' 4-wide
  // threads) assume 16-byte aligned buffers; calls check it.
  for (int i = 0; !s && i < out->module_count; ++i)
    if (strstr(out->ptx[i], "ld.global.v") || strstr(out->ptx[i], "st.global.v"))
      out->align = 16;
  // Every kernel takes one bare pointer per memref argument; a memref with
  // a non-identity layout would have become a full descriptor, and a launch
  // passing fewer parameters than the kernel reads would crash the driver.
  for (int l = 0; !s && l < out->launch_count; ++l) {
    const kiln_gpu_launch_t *ln = &out->launches[l];
    if (ln->kind != KILN_GPU_LAUNCH) continue;
    char entry[160];
    snprintf(entry, sizeof(entry), ".entry %s(", ln->name);
    const char *e = strstr(out->ptx[ln->module], entry);
    const char *end = e ? strchr(e, ')') : NULL;
    int params = 0;
    for (const char *q = e; q && q < end && (q = strstr(q, ".param")) && q < end; q += 6)
      ++params;
    if (!e || !end || params != ln->arg_count)
      s = kiln_make_status(KILN_STATUS_UNSUPPORTED,
                           "cuda: kernel %s takes %d parameters, its launch "
                           "passes %d (a memref argument with a non-identity "
                           "layout)", ln->name, params, ln->arg_count);
  }
  if (s) kiln_gpu_program_free(out);
  return s;
}

//===--- serialization (the compile cache's payload) -----------------------===//

typedef struct {
  char *p;
  size_t n, cap;
  bool oom;
} wbuf_t;

static void put(wbuf_t *w, const void *d, size_t n) {
  if (w->oom || n == 0) return;  // an empty table may be NULL
  if (w->n + n > w->cap) {
    size_t cap = (w->cap ? w->cap * 2 : 4096) + n;
    char *np = realloc(w->p, cap);
    if (!np) {
      w->oom = true;
      return;
    }
    w->p = np;
    w->cap = cap;
  }
  memcpy(w->p + w->n, d, n);
  w->n += n;
}

#define KILN_GPU_MAGIC "kiln-gpu-program-v6"

kiln_status_t kiln_gpu_program_serialize(const kiln_gpu_program_t *p,
                                         void **out_data, size_t *out_size) {
  wbuf_t w = {NULL, 0, 0, false};
  put(&w, KILN_GPU_MAGIC, sizeof(KILN_GPU_MAGIC));
  put(&w, &p->module_count, sizeof(p->module_count));
  for (int i = 0; i < p->module_count; ++i) {
    uint64_t len = strlen(p->ptx[i]);
    put(&w, &len, sizeof(len));
    put(&w, p->ptx[i], len);
  }
  put(&w, &p->align, sizeof(p->align));
  put(&w, &p->arg_count, sizeof(p->arg_count));
  put(&w, &p->temp_count, sizeof(p->temp_count));
  put(&w, p->temp_bytes, sizeof(int64_t) * (size_t)p->temp_count);
  put(&w, &p->launch_count, sizeof(p->launch_count));
  put(&w, p->launches, sizeof(kiln_gpu_launch_t) * (size_t)p->launch_count);
  put(&w, &p->const_count, sizeof(p->const_count));
  for (int i = 0; i < p->const_count; ++i) {
    put(&w, &p->const_bytes[i], sizeof(int64_t));
    put(&w, p->const_data[i], (size_t)p->const_bytes[i]);
  }
  put(&w, &p->tmap_count, sizeof(p->tmap_count));
  put(&w, p->tmaps, sizeof(kiln_gpu_tmap_t) * (size_t)p->tmap_count);
  if (w.oom) {
    free(w.p);
    return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "GPU program");
  }
  *out_data = w.p;
  *out_size = w.n;
  return NULL;
}

typedef struct {
  const char *p;
  size_t n, at;
} rbuf_t;

static bool get(rbuf_t *r, void *d, size_t n) {
  if (r->at + n > r->n || r->at + n < r->at) return false;
  memcpy(d, r->p + r->at, n);
  r->at += n;
  return true;
}

kiln_status_t kiln_gpu_program_deserialize(const void *data, size_t size,
                                           kiln_gpu_program_t *out) {
  memset(out, 0, sizeof(*out));
  rbuf_t r = {data, size, 0};
  char magic[sizeof(KILN_GPU_MAGIC)];
  bool ok = get(&r, magic, sizeof(magic)) &&
            memcmp(magic, KILN_GPU_MAGIC, sizeof(magic)) == 0 &&
            get(&r, &out->module_count, sizeof(out->module_count)) &&
            out->module_count >= 0 && out->module_count < 65536;
  if (ok) {
    out->ptx = calloc((size_t)out->module_count + 1, sizeof(char *));
    ok = out->ptx != NULL;
  }
  for (int i = 0; ok && i < out->module_count; ++i) {
    uint64_t len = 0;
    ok = get(&r, &len, sizeof(len)) && len <= size;
    if (ok) ok = (out->ptx[i] = malloc(len + 1)) != NULL;
    if (ok) ok = get(&r, out->ptx[i], len);
    if (ok) out->ptx[i][len] = 0;
  }
  ok = ok && get(&r, &out->align, sizeof(out->align)) &&
       (out->align == 0 || out->align == 16) &&
       get(&r, &out->arg_count, sizeof(out->arg_count)) &&
       get(&r, &out->temp_count, sizeof(out->temp_count)) &&
       out->temp_count >= 0 && (size_t)out->temp_count <= size;
  if (ok) ok = (out->temp_bytes = calloc((size_t)out->temp_count + 1, sizeof(int64_t))) != NULL;
  ok = ok && get(&r, out->temp_bytes, sizeof(int64_t) * (size_t)out->temp_count) &&
       get(&r, &out->launch_count, sizeof(out->launch_count)) &&
       out->launch_count >= 0 && (size_t)out->launch_count <= size;
  if (ok)
    ok = (out->launches = calloc((size_t)out->launch_count + 1, sizeof(kiln_gpu_launch_t))) != NULL;
  ok = ok && get(&r, out->launches, sizeof(kiln_gpu_launch_t) * (size_t)out->launch_count) &&
       get(&r, &out->const_count, sizeof(out->const_count)) &&
       out->const_count >= 0 && (size_t)out->const_count <= size;
  if (ok) {
    out->const_bytes = calloc((size_t)out->const_count + 1, sizeof(int64_t));
    out->const_data = calloc((size_t)out->const_count + 1, sizeof(void *));
    ok = out->const_bytes && out->const_data;
  }
  for (int i = 0; ok && i < out->const_count; ++i) {
    int64_t n = 0;
    ok = get(&r, &n, sizeof(n)) && n >= 0 && (size_t)n <= size &&
         (out->const_data[i] = malloc((size_t)n + 1)) != NULL &&
         get(&r, out->const_data[i], (size_t)n);
    if (ok) out->const_bytes[i] = n;
  }
  ok = ok && get(&r, &out->tmap_count, sizeof(out->tmap_count)) && out->tmap_count >= 0 &&
       (size_t)out->tmap_count <= size;
  if (ok) ok = (out->tmaps = calloc((size_t)out->tmap_count + 1, sizeof(kiln_gpu_tmap_t))) != NULL;
  ok = ok && get(&r, out->tmaps, sizeof(kiln_gpu_tmap_t) * (size_t)out->tmap_count);
  ok = ok && r.at == size;
  int32_t buffers = out->arg_count + out->temp_count + out->const_count;
  // A map stays within a temporary or constant it describes (inputs and
  // outputs are sized by the graph, their maps by their types).
  for (int i = 0; ok && i < out->tmap_count; ++i) {
    const kiln_gpu_tmap_t *t = &out->tmaps[i];
    ok = t->buffer >= 0 && t->buffer < buffers && t->rank >= 1 &&
         t->rank <= KILN_GPU_TMAP_MAX_RANK && t->offset_bytes >= 0 &&
         (t->dtype == KILN_F32 || t->dtype == KILN_F16 || t->dtype == KILN_BF16);
    int64_t last = t->offset_bytes;  // the last byte's offset
    for (int d = 0; ok && d < t->rank; ++d) {
      ok = t->dims[d] >= 1 && t->dims[d] <= ((int64_t)1 << 32) && t->strides[d] >= 1 &&
           t->strides[d] <= ((int64_t)1 << 40) && t->box[d] >= 1 && t->box[d] <= 256;
      if (ok) last += (t->dims[d] - 1) * t->strides[d];
    }
    if (ok && t->buffer >= out->arg_count) {
      int b = t->buffer - out->arg_count;
      int64_t cap = b < out->temp_count ? out->temp_bytes[b]
                                        : out->const_bytes[b - out->temp_count];
      ok = last + t->strides[0] <= cap;
    }
  }
  ok = ok && out->arg_count >= 0 && (size_t)out->arg_count <= size;
  for (int t = 0; ok && t < out->temp_count; ++t) ok = out->temp_bytes[t] >= 0;
  for (int l = 0; ok && l < out->launch_count; ++l) {
    kiln_gpu_launch_t *ln = &out->launches[l];
    ok = ln->arg_count >= 0 && ln->arg_count <= KILN_GPU_MAX_ARGS &&
         ln->shared_bytes <= KILN_GPU_MAX_SHARED_BYTES &&
         memchr(ln->name, 0, sizeof(ln->name)) != NULL &&
         (ln->kind == KILN_GPU_LAUNCH
              ? ln->module >= 0 && ln->module < out->module_count
              : ln->kind == KILN_GPU_COPY && ln->arg_count == 2 && ln->bytes >= 0 &&
                    ln->offsets[0] >= 0 && ln->offsets[1] >= 0);
    for (int a = 0; ok && a < ln->arg_count; ++a)
      ok = ln->args[a] < buffers &&
           (ln->args[a] >= 0 ||
            (ln->kind == KILN_GPU_LAUNCH && ln->args[a] >= -out->tmap_count));
    // A copy stays within a temporary it touches (inputs and outputs are
    // sized by the graph and checked by the caller against arg_count).
    for (int a = 0; ok && ln->kind == KILN_GPU_COPY && a < 2; ++a)
      if (ln->args[a] >= out->arg_count) {
        int b = ln->args[a] - out->arg_count;
        int64_t cap = b < out->temp_count ? out->temp_bytes[b]
                                          : out->const_bytes[b - out->temp_count];
        ok = ln->offsets[a] <= cap && ln->bytes <= cap - ln->offsets[a] &&
             (a == 0 || b < out->temp_count);  // constants are read-only
      }
  }
  if (!ok) {
    kiln_gpu_program_free(out);
    return kiln_make_status(KILN_STATUS_INTERNAL, "a GPU program entry that "
                            "does not parse");
  }
  return NULL;
}
