"""ctypes bindings to libkiln's public C API (include/kiln/kiln.h).

Only the public API is used. The library is found, in order, at
$KILN_LIBRARY, next to this module (pip install), or in the repository's
build directory (a source checkout).
"""

from __future__ import annotations

import ctypes
import glob
import os
import threading

_HERE = os.path.dirname(os.path.abspath(__file__))


class KilnError(RuntimeError):
    """A failed kiln status: `code` is the status code name."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


KILN_MAX_RANK = 8
KILN_DIM_SYMBOLIC = -(2 ** 63)


class TensorType(ctypes.Structure):
    _fields_ = [("dtype", DLDataType), ("rank", ctypes.c_int32),
                ("shape", ctypes.c_int64 * KILN_MAX_RANK)]


class Stats(ctypes.Structure):
    _fields_ = [("compiles", ctypes.c_uint64), ("cache_hits", ctypes.c_uint64),
                ("cache_misses", ctypes.c_uint64), ("cache_rejected", ctypes.c_uint64),
                ("lower_seconds", ctypes.c_double), ("mlir_seconds", ctypes.c_double),
                ("llvm_seconds", ctypes.c_double), ("cache_seconds", ctypes.c_double),
                ("tune_measured", ctypes.c_uint64), ("tune_db_hits", ctypes.c_uint64),
                ("tune_seconds", ctypes.c_double),
                ("graph_records", ctypes.c_uint64), ("graph_replays", ctypes.c_uint64)]


class CompileOptions(ctypes.Structure):
    # Mirrors kiln_compile_options_t field for field: kiln_compile_options_init
    # writes the whole C struct.
    _fields_ = [("target", ctypes.c_char_p), ("opt_level", ctypes.c_int),
                ("vectorize", ctypes.c_int), ("dynamic", ctypes.c_int),
                ("max_variants", ctypes.c_int), ("num_threads", ctypes.c_int),
                ("autotune", ctypes.c_int), ("autotune_budget_seconds", ctypes.c_double),
                ("cuda_graphs", ctypes.c_int),
                ("input_strided", ctypes.POINTER(ctypes.c_bool))]


DYNAMIC_AUTO, DYNAMIC_ALWAYS, DYNAMIC_NEVER = 0, 1, 2
AUTOTUNE_HEURISTIC, AUTOTUNE_MEASURE = 0, 1


def _find_library() -> str:
    env = os.environ.get("KILN_LIBRARY")
    if env:
        return env
    for pattern in ("libkiln.so", "libkiln.so.*"):
        hits = sorted(glob.glob(os.path.join(_HERE, pattern)))
        if hits:
            return hits[0]
    repo_build = os.path.join(_HERE, "..", "..", "build", "libkiln.so")
    if os.path.exists(repo_build):
        return repo_build
    raise ImportError("libkiln not found: install the kiln package with pip, "
                      "or set KILN_LIBRARY to the path of libkiln.so")


_lib = ctypes.CDLL(_find_library())
_status = ctypes.c_void_p
_P = ctypes.c_void_p


def _fn(name, restype, *argtypes):
    f = getattr(_lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


kiln_status_code = _fn("kiln_status_code", ctypes.c_int, _status)
kiln_status_message = _fn("kiln_status_message", ctypes.c_char_p, _status)
kiln_status_code_name = _fn("kiln_status_code_name", ctypes.c_char_p, ctypes.c_int)
kiln_status_free = _fn("kiln_status_free", None, _status)
kiln_free = _fn("kiln_free", None, _P)
kiln_context_create = _fn("kiln_context_create", _status, _P, ctypes.POINTER(_P))
kiln_context_destroy = _fn("kiln_context_destroy", None, _P)
kiln_context_stats = _fn("kiln_context_stats", None, _P, ctypes.POINTER(Stats))
kiln_context_cache_export = _fn("kiln_context_cache_export", _status, _P,
                                ctypes.POINTER(ctypes.c_void_p),
                                ctypes.POINTER(ctypes.c_size_t))
kiln_context_cache_import = _fn("kiln_context_cache_import", _status, _P,
                                ctypes.c_char_p, ctypes.c_size_t,
                                ctypes.POINTER(ctypes.c_int))
kiln_graph_parse = _fn("kiln_graph_parse", _status, _P, ctypes.c_char_p,
                       ctypes.c_size_t, ctypes.c_char_p, ctypes.POINTER(_P))
kiln_graph_destroy = _fn("kiln_graph_destroy", None, _P)
kiln_compile_options_init = _fn("kiln_compile_options_init", None,
                                ctypes.POINTER(CompileOptions))
kiln_function_compile = _fn("kiln_function_compile", _status, _P, _P,
                            ctypes.POINTER(CompileOptions), ctypes.POINTER(_P))
kiln_function_release = _fn("kiln_function_release", None, _P)
kiln_function_call = _fn("kiln_function_call", _status, _P,
                         ctypes.POINTER(DLTensor), ctypes.c_size_t,
                         ctypes.POINTER(DLTensor), ctypes.c_size_t)
kiln_function_call_async = _fn("kiln_function_call_async", _status, _P,
                               ctypes.POINTER(DLTensor), ctypes.c_size_t,
                               ctypes.POINTER(DLTensor), ctypes.c_size_t, _P)
kiln_function_call_alloc = _fn("kiln_function_call_alloc", _status, _P,
                               ctypes.POINTER(DLTensor), ctypes.c_size_t,
                               ctypes.POINTER(_P), ctypes.c_size_t)
kiln_function_variant_count = _fn("kiln_function_variant_count", ctypes.c_int, _P)
kiln_function_output_types = _fn("kiln_function_output_types", _status, _P,
                                 ctypes.POINTER(DLTensor), ctypes.c_size_t,
                                 ctypes.POINTER(TensorType), ctypes.c_size_t)


_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)


def dlpack_capsule(managed) -> object:
    """A "dltensor" capsule around a DLManagedTensor* that kiln allocated;
    torch.from_dlpack takes ownership and calls its deleter when the tensor
    dies (returning the buffer to kiln's output pool)."""
    return _PyCapsule_New(managed, b"dltensor", None)


def check(status) -> None:
    """Raises KilnError for a failed status (and frees it)."""
    if not status:
        return
    code = kiln_status_code_name(kiln_status_code(status)).decode()
    msg = kiln_status_message(status).decode(errors="replace")
    kiln_status_free(status)
    raise KilnError(code, msg)


class Context:
    """Owns a kiln_context_t; process-wide by default (see `default`)."""

    _default = None
    _lock = threading.Lock()

    def __init__(self):
        self.handle = _P()
        check(kiln_context_create(None, ctypes.byref(self.handle)))

    def __del__(self):
        if getattr(self, "handle", None):
            kiln_context_destroy(self.handle)
            self.handle = None

    def stats(self) -> dict:
        st = Stats()
        kiln_context_stats(self.handle, ctypes.byref(st))
        return {name: getattr(st, name) for name, _ in Stats._fields_}

    def export_cache(self) -> bytes:
        data, size = ctypes.c_void_p(), ctypes.c_size_t()
        check(kiln_context_cache_export(self.handle, ctypes.byref(data),
                                        ctypes.byref(size)))
        try:
            return ctypes.string_at(data, size.value)
        finally:
            kiln_free(data)

    def import_cache(self, blob: bytes) -> int:
        count = ctypes.c_int()
        check(kiln_context_cache_import(self.handle, blob, len(blob),
                                        ctypes.byref(count)))
        return count.value

    @classmethod
    def default(cls) -> "Context":
        with cls._lock:
            if cls._default is None:
                cls._default = Context()
            return cls._default


class Function:
    """A compiled kiln graph (kiln_function_t)."""

    def __init__(self, ctx: Context, text: str, name: str = "graph",
                 opt_level: int = 3, vectorize: bool = True,
                 dynamic: int = DYNAMIC_AUTO, max_variants: int = 8,
                 autotune: int = AUTOTUNE_HEURISTIC, autotune_budget: float = 0.0,
                 target: str = "cpu", cuda_graphs: bool = False,
                 input_strided=None):
        """`input_strided`: per graph input, whether the first calls pass it
        with strides other than contiguous (a static graph's first variant
        is compiled for those layouts)."""
        self.ctx = ctx  # keeps the context alive
        graph = _P()
        data = text.encode()
        check(kiln_graph_parse(ctx.handle, data, len(data), name.encode(),
                               ctypes.byref(graph)))
        opts = CompileOptions()
        kiln_compile_options_init(ctypes.byref(opts))
        opts.opt_level = opt_level
        opts.vectorize = 1 if vectorize else 0
        opts.dynamic = dynamic
        opts.max_variants = max_variants
        opts.autotune = autotune
        opts.autotune_budget_seconds = autotune_budget
        opts.cuda_graphs = 1 if cuda_graphs else 0
        if input_strided is not None and any(input_strided):
            strided = (ctypes.c_bool * len(input_strided))(*input_strided)
            opts.input_strided = strided  # alive until the compile returns
        target_bytes = target.encode()  # alive until the compile returns
        opts.target = target_bytes
        self.handle = _P()
        try:
            check(kiln_function_compile(ctx.handle, graph, ctypes.byref(opts),
                                        ctypes.byref(self.handle)))
        finally:
            kiln_graph_destroy(graph)

    def __del__(self):
        if getattr(self, "handle", None):
            kiln_function_release(self.handle)
            self.handle = None
