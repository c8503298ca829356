"""The torch.compile backend: `torch.compile(model, backend="kiln")`.

Dynamo hands over an FX graph; AOTAutograd (with core ATen decompositions)
splits it into forward and backward graphs; each is partitioned into maximal
subgraphs kiln supports, which kiln compiles, while the rest runs in PyTorch.
Tensors cross as DLTensors over the tensors' own memory (no copies): inputs
as they are, outputs allocated by torch and filled by kiln.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import logging
import math
import os
import sys
import threading
import time

import torch
from torch._decomp import core_aten_decompositions, get_decompositions
from torch._dynamo.backends.common import aot_autograd
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

try:  # Dynamo's C++ tensor check (dtype, device, sizes, strides, dispatch keys)
    from torch._C._dynamo.guards import TensorGuards as _TensorGuards
except ImportError:  # pragma: no cover - older or stripped builds
    _TensorGuards = None

from . import _capi, hoist, layers
from .translate import DTYPES, Unsupported, is_size_input, support_reason, translate

log = logging.getLogger("kiln")

MODES = (None, "default", "max-autotune", "reduce-overhead")
OPTIONS = {
    "fallback": ("partition", "error"),  # unsupported nodes run in PyTorch, or raise
    "opt_level": (0, 1, 2, 3),           # LLVM optimization level
    "vectorize": (True, False),          # the kernels/ vectorization schedule
    "max_variants": tuple(range(1, 65)),  # variants per compiled graph
    # torch.compile takes a mode or options, not both: this is mode
    # "max-autotune" as an option (Inductor's name), for use with the budget
    "max_autotune": (True, False),
    # max-autotune's search budget per compiled variant, in seconds
    "autotune_budget": (1, 2, 5, 10, 20, 30, 60, 120, 300),
    # mode "reduce-overhead" as an option (Inductor's triton.cudagraphs):
    # CUDA partitions replay recorded CUDA graphs
    "cuda_graphs": (True, False),
    # inference graphs: work on parameters alone (a linear's weight
    # transpose) runs once and again only when a parameter changes
    # (hoist.py); off by default, as Inductor's freezing: writes through
    # `p.data` are not seen
    "hoist_params": (True, False),
    # repeated layers (a transformer's N encoder layers) are partitions of
    # their own, each structure compiled once (layers.py); off: a partition
    # is compiled whole
    "reuse_layers": (True, False),
}

# Dynamo's allocators (what Inductor's generated code calls): a dense tensor
# from sizes, strides and dtype, without torch.empty's argument parsing and
# dispatch (0.5 against 1.9 us a call on the CPU; the GPU step allocates ~70
# outputs). The CUDA one allocates on the current device: _alloc_outputs
# takes it only while that is the partition's.
try:
    from torch._C._dynamo.guards import _empty_strided_cpu, _empty_strided_cuda
except ImportError:  # pragma: no cover - older builds
    _empty_strided_cpu = _empty_strided_cuda = None


def _dense_strides(shape) -> tuple:
    strides, s = [], 1
    for d in reversed(shape):
        strides.append(s)
        s *= max(d, 1)
    return tuple(reversed(strides))


# The caller's current CUDA stream as a raw pointer: PyTorch's binding for
# it (what Inductor's generated code calls) skips the Stream object that
# torch.cuda.current_stream builds on every call.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _current_stream(index: int) -> int:
    if _raw_stream is not None:
        return _raw_stream(index)
    return torch.cuda.current_stream(index).cuda_stream


_DL_CODES = {
    torch.float32: (2, 32), torch.float16: (2, 16), torch.bfloat16: (4, 16),
    torch.float64: (2, 64), torch.int32: (0, 32), torch.int64: (0, 64),
    torch.bool: (6, 8),
}


def _log_enabled(topic: str) -> bool:
    return topic in os.environ.get("KILN_LOG", "").split(",")


def _note(topic: str, msg: str) -> None:
    if _log_enabled(topic):
        print(f"[kiln {topic}] {msg}", file=sys.stderr)
    log.debug("%s: %s", topic, msg)


class KilnFallbackError(RuntimeError):
    """Raised with options={"fallback": "error"} when a node falls back."""


def parse_options(mode, options) -> dict:
    if mode not in MODES:
        raise ValueError(f"kiln: unknown mode {mode!r}; valid modes: "
                         f"{', '.join(repr(m) for m in MODES)}")
    opts = {"fallback": "partition", "opt_level": 3, "vectorize": True,
            "max_variants": 8, "mode": mode or "default", "autotune_budget": 20,
            "hoist_params": False, "reuse_layers": True}
    for k, v in (options or {}).items():
        if k not in OPTIONS:
            raise ValueError(f"kiln: unknown option {k!r}; valid options: "
                             f"{', '.join(sorted(OPTIONS))}")
        if v not in OPTIONS[k]:
            raise ValueError(f"kiln: option {k!r} is {v!r}; expected one of "
                             f"{OPTIONS[k]}")
        opts[k] = v
    max_autotune, graphs = opts.pop("max_autotune", False), opts.pop("cuda_graphs", False)
    if max_autotune and graphs:
        raise ValueError("kiln: options max_autotune and cuda_graphs are two modes "
                         "('max-autotune', 'reduce-overhead'); pick one")
    if max_autotune:
        opts["mode"] = "max-autotune"
    if graphs:
        opts["mode"] = "reduce-overhead"
    # "max-autotune" measures tile sizes (lib/autotune); "reduce-overhead"
    # replays CUDA partitions as CUDA graphs and compiles like "default" on
    # the CPU (where a call is one native function call already).
    return opts


_SIZE_OPS = {torch.ops.aten.sym_size.int, torch.ops.aten.sym_numel.default,
             torch.ops.aten.sym_stride.int, torch.ops.aten.sym_storage_offset.default}


def _size_arithmetic(node) -> bool:
    """A node that computes a size (a SymInt) from sizes: a tensor's size,
    or Python arithmetic on sizes (`operator.mul`)."""
    val = node.meta.get("val")
    return (isinstance(val, torch.SymInt) and
            (node.target in _SIZE_OPS or getattr(node.target, "__module__", None) == "_operator"))


class _Support(OperatorSupportBase):
    def __init__(self, excluded: dict[str, str] | None = None):
        self.reasons: dict[str, str] = {}
        self.excluded = excluded or {}

    def is_node_supported(self, submodules, node) -> bool:
        if node.op != "call_function":
            return False  # placeholders, outputs, attributes: not ops to move
        if _size_arithmetic(node):
            # s0 * 128 for a view under a dynamic batch: Python's, and no
            # fallback; kiln reads the sizes' expressions.
            return False
        reason = self.excluded.get(node.name) or support_reason(node)
        if reason is not None:
            self.reasons[node.name] = f"{node.target}: {reason}"
        return reason is None


# Compiled functions by graph text without its name: N identical blocks share
# one kiln function (and one compile).
_FUNCTIONS: dict[str, _capi.Function] = {}
_FUNCTION_LOCKS: dict[str, threading.Lock] = {}
_FUNCTIONS_LOCK = threading.Lock()


def _strided_layout(shape, stride) -> bool:
    """Whether a tensor of `shape` and `stride` reaches kiln with strides
    (as lib/api's dl_is_contiguous decides: size-1 dims ignored). Empty
    tensors pass as contiguous and negative strides as contiguous copies
    (CompiledSubgraph.forward)."""
    if any(s < 0 for s in stride) or any(d == 0 for d in shape):
        return False
    expect = 1
    for d, s in zip(reversed(shape), reversed(stride)):
        if d != 1 and s != expect:
            return True
        expect *= d
    return False


def _function_for(text: str, name: str, opts: dict, dynamic: int,
                  target: str = "cpu", strided=None) -> _capi.Function:
    """The kiln function of `text` (shared by identical partitions: translate
    numbers their values alike); `strided`: per input, whether calls pass it
    strided (see Function)."""
    body = text[text.index("("):]
    autotune = (_capi.AUTOTUNE_MEASURE if opts["mode"] == "max-autotune"
                else _capi.AUTOTUNE_HEURISTIC)
    graphs = target == "cuda" and opts["mode"] == "reduce-overhead"
    key = (f"{opts['opt_level']}/{opts['vectorize']}/{opts['max_variants']}/"
           f"{dynamic}/{autotune}/{opts['autotune_budget']}/{target}/"
           f"{graphs}/{body}")
    # One compile per key, while other keys compile on other threads: the
    # key's own lock is held across its compile, the table's only briefly.
    with _FUNCTIONS_LOCK:
        key_lock = _FUNCTION_LOCKS.setdefault(key, threading.Lock())
    with key_lock:
        with _FUNCTIONS_LOCK:
            fn = _FUNCTIONS.get(key)
        if fn is not None:
            _note("stats", f"{name}: same graph as an earlier partition, reused")
            return fn
        fn = _capi.Function(_capi.Context.default(), text, name,
                            opt_level=opts["opt_level"],
                            vectorize=opts["vectorize"], dynamic=dynamic,
                            max_variants=opts["max_variants"],
                            autotune=autotune,
                            autotune_budget=float(opts["autotune_budget"]),
                            target=target, cuda_graphs=graphs,
                            input_strided=strided)
        with _FUNCTIONS_LOCK:
            _FUNCTIONS[key] = fn
        return fn


def compile_stats() -> dict:
    """kiln's compile statistics for this process: compiles (through MLIR and
    LLVM), cache hits/misses/rejected entries, seconds per stage."""
    return _capi.Context.default().stats()


def save_cache_artifacts() -> bytes:
    """The compile cache's entries as bytes (mirrors
    torch.compiler.save_cache_artifacts)."""
    return _capi.Context.default().export_cache()


def load_cache_artifacts(blob: bytes) -> int:
    """Stores artifacts from save_cache_artifacts into this machine's cache;
    returns how many entries were stored."""
    return _capi.Context.default().import_cache(blob)


class CompiledSubgraph(torch.nn.Module):
    """A partition compiled by kiln; called like the submodule it replaces."""

    def __init__(self, gm: torch.fx.GraphModule, name: str, opts: dict,
                 written_later=frozenset(), compile_now: bool = True):
        """`written_later`: indices of inputs that a copy_ left to PyTorch
        writes after this partition (not returned as views: see translate).
        With `compile_now` False, kiln compiles the graph when `compile()`
        is called (compile_graph does so for all partitions at once)."""
        super().__init__()
        # Graphs that arrive with SymInts (dynamic=True, mark_dynamic) are
        # symbolic from the start; static ones let kiln's policy decide.
        vals_in = [n.meta["val"] for n in gm.graph.nodes
                   if n.op == "placeholder" and not is_size_input(n)]
        symbolic = any(not isinstance(d, int) for v in vals_in for d in v.shape)
        out = [n for n in gm.graph.nodes if n.op == "output"][0]
        fx_outs = out.args[0] if isinstance(out.args[0], (tuple, list)) else [out.args[0]]
        vals_fx = [o.meta["val"] for o in fx_outs]
        self.device = (vals_in + vals_fx)[0].device if vals_in + vals_fx else torch.device("cpu")
        self.cuda = self.device.type == "cuda"
        self.cuda_index = ((self.device.index if self.device.index is not None
                            else torch.cuda.current_device()) if self.cuda else -1)
        # copy_ into an input: kiln writes the input in place.
        tr = translate(gm, name, written_later)
        self.written = set(tr.written)
        self.in_perms = tr.in_perms
        self.text = text = tr.text
        # The layouts the calls will pass (Dynamo guards on the traced
        # strides): the first variant is compiled for them. A backward
        # graph's saved activations arrive as transposed views; compiled
        # for contiguous inputs first, its first call compiled it again.
        strided = None
        if not symbolic and not self.cuda:
            strided = []
            for v, perm in zip(vals_in, self.in_perms):
                shape, stride = tuple(v.shape), tuple(v.stride())
                if perm is not None:
                    shape = tuple(shape[p] for p in perm)
                    stride = tuple(stride[p] for p in perm)
                strided.append(_strided_layout(shape, stride))
        self._fn_args = (text, name, opts,
                         _capi.DYNAMIC_ALWAYS if symbolic else _capi.DYNAMIC_AUTO,
                         "cuda" if self.cuda else "cpu", strided)
        self.fn = None
        if compile_now:
            self.compile()
        self.in_dtypes = [v.dtype for v in vals_in]
        self.graph_outputs, self.out_inputs = tr.graph_outputs, tr.out_inputs
        self.out_alias_views = tr.out_alias_views
        perms = tr.perms
        vals = [vals_fx[i] for i, k in enumerate(tr.graph_outputs) if k is not None]
        # The FX outputs are exactly kiln's outputs, in order (no written
        # input among them): return them as they come.
        self.plain_out = all(k == i for i, k in enumerate(tr.graph_outputs))
        self.out_dtypes = [v.dtype for v in vals]
        self.static_out = all(all(isinstance(d, int) for d in v.shape) for v in vals)
        # PyTorch code after a partition was traced with the output strides
        # of the original ops (a permute's output is a transposed view) and
        # some kernels rely on them (the SDPA backward does). kiln writes
        # contiguous outputs: a permuted dense layout is written permuted
        # (translate appends the permute) and viewed back with the inverse;
        # other strided outputs are copied into their strides.
        self.out_views = [None if p is None else [p.index(d) for d in range(len(p))]
                          for p in perms]
        self.out_shapes = ([tuple(v.shape) if p is None else tuple(v.shape[d] for d in p)
                            for v, p in zip(vals, perms)] if self.static_out else None)
        # (sizes, strides, dtype) per output for the fast path's allocator.
        self.out_specs = ([(sh, _dense_strides(sh), d)
                           for sh, d in zip(self.out_shapes, self.out_dtypes)]
                          if self.static_out else None)
        self.out_strides = [
            tuple(v.stride()) if self.static_out and p is None and not v.is_contiguous()
            else None
            for v, p in zip(vals, perms)]
        # Outputs of 16 MiB and more come from kiln's output pool (see
        # kiln_function_call_alloc): glibc maps buffers of 32 MiB and more
        # afresh on every allocation, so each call page-faulted its output
        # (x + 1 on 8M floats: 11.8 ms, pooled 1.4). Smaller ones come from
        # PyTorch's allocator, whose freed buffers glibc hands out again
        # (its mmap threshold rises to what was freed); the pool's DLPack
        # exchange cost 4 us a call there (x + 1 on 128K floats: 31.7 ->
        # 27.5 us torch.compile'd).
        self.pooled_out = (not self.cuda and self.static_out
                           and os.environ.get("KILN_OUTPUT_POOL_MB") != "0"
                           and max((v.numel() * v.element_size() for v in vals),
                                   default=0) >= 16 << 20)
        # The steady-state fast path (see _fast). A graph with symbolic
        # sizes takes it too: called again with the same input layouts, its
        # outputs have the shapes of the call that filled the structs
        # (b.out_specs), so neither kiln's shape inference nor the struct
        # fill runs again (an 8x8 dynamic linear: 78 -> 33 us a call).
        self.fast_ok = True
        self.tuple_out = isinstance(out.args[0], (tuple, list))
        self.n_in, self.n_out = len(self.in_dtypes), len(vals)
        self._tls = threading.local()
        # Calls that took the full path (first calls, changed layouts): a
        # steady state adds none.
        self.full_calls = 0

    def compile(self):
        """kiln's function for the graph (a static graph is compiled now).
        Python does nothing here but call kiln (which releases the GIL), so
        compile_graph runs the partitions' compiles on threads at once."""
        self.fn = _function_for(*self._fn_args)

    def _arg_structs(self):
        # Per-thread argument structs: calls may come from several threads.
        tls = self._tls
        if not hasattr(tls, "ins"):
            tls.ins = (_capi.DLTensor * max(self.n_in, 1))()
            tls.outs = (_capi.DLTensor * max(self.n_out, 1))()
            tls.shapes = [(ctypes.c_int64 * _capi.KILN_MAX_RANK)() for _ in range(self.n_in + self.n_out)]
            tls.strides = [(ctypes.c_int64 * _capi.KILN_MAX_RANK)() for _ in range(self.n_in)]
            tls.ready = False
        return tls

    def _physical(self, k, t):
        """Input k as kiln's graph declares it: in its memory order where
        translate gave it a permutation (a view of the same buffer)."""
        perm = self.in_perms[k]
        return t if perm is None else t.permute(perm)

    @staticmethod
    def _fill(dl, t, shape_buf, stride_buf):
        dl.data = t.data_ptr()
        cuda = t.device.type == "cuda"
        dl.device.device_type = 2 if cuda else 1  # kDLCUDA / kDLCPU
        dl.device.device_id = (t.device.index or 0) if cuda else 0
        dl.ndim = t.dim()
        code, bits = _DL_CODES[t.dtype]
        dl.dtype.code, dl.dtype.bits, dl.dtype.lanes = code, bits, 1
        for i, s in enumerate(t.shape):
            shape_buf[i] = s
        dl.shape = ctypes.cast(shape_buf, ctypes.POINTER(ctypes.c_int64))
        if stride_buf is not None and not t.is_contiguous():
            for i, s in enumerate(t.stride()):
                stride_buf[i] = s
            dl.strides = ctypes.cast(stride_buf, ctypes.POINTER(ctypes.c_int64))
        else:
            dl.strides = None
        dl.byte_offset = 0

    def _fast(self, b, args):  # noqa: C901 (the hot path, kept in one piece)
        """The steady-state call of a static graph: the argument structs were
        filled by an earlier call with tensors of the same shapes, strides,
        dtypes and devices (`b.layouts`), so only data pointers change.
        Partitions of optimizer steps take hundreds of tensors: the layouts
        are checked by one C++ call (Dynamo's TensorGuards) where there is
        one, and the pointers go into cached views of the structs."""
        ins, cuda = b.ins, self.cuda
        if b.guard is not None:
            if not b.guard.check(*args):
                return None
        else:
            layouts = b.layouts
            for k, t in enumerate(args):
                if (t.shape, t.stride(), t.dtype, t.get_device()) != layouts[k]:
                    return None
        src = args
        if b.dense:
            # CUDA inputs in layouts the kernels do not take (a transposed
            # view saved for the backward): contiguous copies, as the
            # first call made; the guard above was on the caller's layouts.
            src = list(args)
            for k in b.dense:
                src[k] = self._physical(k, args[k]).clone(memory_format=torch.contiguous_format)
        if cuda:
            ptrs = [t.data_ptr() for t in src]
            if any(p & 15 for p in ptrs):
                return None  # the slow path copies it to an aligned buffer
            for d, p in zip(b.in_fields, ptrs):
                d.data = p
        else:
            for d, t in zip(b.in_fields, src):
                d.data = t.data_ptr()
        if self.pooled_out:
            return self._call_pooled(ins, args)
        outs = self._alloc_outputs(self.out_specs if self.static_out else b.out_specs)
        douts = b.outs
        for k, t in enumerate(outs):
            douts[k].data = t.data_ptr()
        if cuda:
            stream = _current_stream(self.cuda_index)
            _capi.check(_capi.kiln_function_call_async(self.fn.handle, ins, self.n_in,
                                                       douts, self.n_out, stream))
        else:
            _capi.check(_capi.kiln_function_call(self.fn.handle, ins, self.n_in,
                                                 douts, self.n_out))
        return self._finish(outs, args)

    def forward(self, *args):
        b = self._arg_structs()
        if b.ready:
            r = self._fast(b, args)
            if r is not None:
                return r
        # A full fill; once a call with the inputs as they are succeeds,
        # later calls with the same layouts take the fast path.
        self.full_calls += 1
        b.ready = False
        fast_next = self.fast_ok
        b.layouts = []
        b.dense = []  # CUDA inputs passed as contiguous copies
        keep = []  # contiguous copies must outlive the call that reads them
        back = []  # (input, its copy) for written inputs passed as copies
        for k, t in enumerate(args):
            if t.dtype not in _DL_CODES or t.device.type != self.device.type:
                raise _capi.KilnError("INVALID_ARGUMENT",
                                      f"input {k}: {t.dtype} on {t.device}; expected "
                                      f"{self.device}")
            orig = t
            t = self._physical(k, t)
            if self.cuda and (not t.is_contiguous() or t.data_ptr() % 16):
                # The CUDA target takes contiguous device tensors, 16-byte
                # aligned for its vector accesses. A layout the kernels do
                # not take is copied on every call (the fast path too); a
                # misaligned pointer is a property of this call only.
                t = t.clone(memory_format=torch.contiguous_format)
                keep.append(t)
                if not self._physical(k, orig).is_contiguous():
                    b.dense.append(k)
            if any(s < 0 for s in t.stride()):
                _note("layout", f"input {k} {tuple(t.shape)} has negative strides "
                                f"{t.stride()}; passing a contiguous copy")
                t = t.contiguous()
                keep.append(t)
                fast_next = False
            if t is not orig and k in self.written:
                back.append((orig, t))
                fast_next = False
            # The fast path checks the caller's tensors: their layouts.
            b.layouts.append((orig.shape, orig.stride(), orig.dtype, orig.get_device()))
            self._fill(b.ins[k], t, b.shapes[k], b.strides[k])
        b.in_fields = [b.ins[k] for k in range(self.n_in)]
        b.guard = None
        if _TensorGuards is not None and fast_next:
            try:
                b.guard = _TensorGuards(
                    *args, dynamic_dims_sizes=[list(t.shape) for t in args],
                    dynamic_dims_strides=[list(t.stride()) for t in args])
            except (TypeError, RuntimeError, SystemError):
                b.guard = None  # the Python comparison of b.layouts
        if self.pooled_out:
            r = self._call_pooled(b.ins, args)
            for orig, t in back:
                orig.copy_(t)
            b.ready = fast_next
            del keep
            return r
        if self.static_out:
            outs = self._alloc_outputs(self.out_specs)
        else:
            types = (_capi.TensorType * self.n_out)()
            _capi.check(_capi.kiln_function_output_types(self.fn.handle, b.ins, self.n_in,
                                                         types, self.n_out))
            # (sizes, strides, dtype) per output, as self.out_specs.
            b.out_specs = [(sh, _dense_strides(sh), d)
                           for sh, d in ((tuple(tt.shape[:tt.rank]), d)
                                         for tt, d in zip(types, self.out_dtypes))]
            outs = self._alloc_outputs(b.out_specs)
        for k, o in enumerate(outs):
            self._fill(b.outs[k], o, b.shapes[self.n_in + k], None)
        if self.cuda:
            # Queued on PyTorch's current stream, like any CUDA op.
            stream = _current_stream(self.cuda_index)
            _capi.check(_capi.kiln_function_call_async(self.fn.handle, b.ins, self.n_in,
                                                       b.outs, self.n_out, stream))
        else:
            _capi.check(_capi.kiln_function_call(self.fn.handle, b.ins, self.n_in,
                                                 b.outs, self.n_out))
        for orig, t in back:
            orig.copy_(t)  # a written input kiln received as a copy
        b.ready = fast_next
        del keep
        return self._finish(outs, args)

    def _alloc_outputs(self, specs):
        """Dense outputs of `specs` ((sizes, strides, dtype) each) on the
        partition's device: the static ones, or a symbolic graph's for the
        input sizes of the call that filled the structs (Dynamo's C++
        allocator where there is one: a few microseconds a call less than
        torch.empty)."""
        if self.cuda:
            alloc = _empty_strided_cuda
            if alloc is not None and torch.cuda.current_device() == self.cuda_index:
                return [alloc(sh, st, d) for sh, st, d in specs]
        elif _empty_strided_cpu is not None:
            return [_empty_strided_cpu(sh, st, d) for sh, st, d in specs]
        dev = self.device
        return [torch.empty(sh, dtype=d, device=dev) for sh, _, d in specs]

    def _call_pooled(self, ins, args):
        """Large outputs: kiln allocates them from its pool of released
        output buffers (pages already mapped), torch owns them through
        DLPack."""
        managed = (ctypes.c_void_p * self.n_out)()
        _capi.check(_capi.kiln_function_call_alloc(self.fn.handle, ins, self.n_in,
                                                   managed, self.n_out))
        outs = [torch.utils.dlpack.from_dlpack(_capi.dlpack_capsule(m)) for m in managed]
        return self._finish(outs, args)

    def _input_out(self, i, args):
        """FX output `i`, an input (a written one) or a view of an input: the
        traced view's strides where the input has its traced layout, else
        the view ops replayed on it."""
        t = args[self.out_inputs[i]]
        view = self.out_alias_views[i]
        if view is None:
            return t
        shape, stride, offset, in_shape, in_stride, chain = view
        if t.shape == in_shape and t.stride() == in_stride:
            return t.as_strided(shape, stride, t.storage_offset() + offset)
        for op, rest in chain:
            t = op(t, *rest)
        return t

    def _finish(self, outs, args):
        for k, inverse in enumerate(self.out_views):
            if inverse is not None:
                outs[k] = outs[k].permute(inverse)
        for k, stride in enumerate(self.out_strides):
            if stride is not None:
                outs[k] = torch.empty_strided(outs[k].shape, stride, dtype=outs[k].dtype,
                                              device=outs[k].device).copy_(outs[k])
        if not self.plain_out:  # inputs returned: written ones, views of others
            outs = [outs[k] if k is not None else self._input_out(i, args)
                    for i, k in enumerate(self.graph_outputs)]
        return tuple(outs) if self.tuple_out else outs[0]


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _compile_all(subgraphs: list, opts: dict) -> list:
    """Compiles the partitions, on as many threads as the process may use
    cores (each kiln compile runs on an MLIR context of its own, and kiln
    releases the GIL); a model's distinct layers, its first and last pieces
    and its backward pieces compile at once. Under max-autotune one at a
    time: a search times its candidates on every core, and a compile beside
    it would skew what goes into the tuning database. Returns, per
    partition, None or the KilnError that kept it from compiling."""
    def one(cs):
        try:
            cs.compile()
            return None
        except _capi.KilnError as ex:
            return ex

    workers = 1 if opts["mode"] == "max-autotune" else min(len(subgraphs), _usable_cores())
    if workers <= 1:
        return [one(cs) for cs in subgraphs]
    with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="kiln-compile") as ex:
        return list(ex.map(one, subgraphs))


def compile_graph(gm: torch.fx.GraphModule, example_inputs, opts: dict,
                  kind: str = "graph") -> torch.fx.GraphModule:
    """Partitions `gm`, compiles the supported parts with kiln, returns the
    rewritten GraphModule (callable with the same arguments)."""
    t0 = time.perf_counter()
    # A partition writes an input in place (copy_ at the end of a
    # functionalized graph) only if every other reader of that input is in
    # the same partition: the partitioner may place another partition that
    # reads the old value after it. Other copy_ nodes run in PyTorch, moved
    # after every partition (below).
    excluded: dict[str, str] = {}
    while True:
        support = _Support(excluded)
        partitioner = CapabilityBasedPartitioner(gm, support,
                                                 allows_single_node_partition=True)
        partitions = partitioner.propose_partitions()
        if opts["reuse_layers"]:
            partitions = layers.split_repeated(gm, partitions)
        owner = {n: p.id for p in partitions for n in p.nodes}
        late = {n.name for p in partitions for n in p.nodes
                if n.target is torch.ops.aten.copy_.default
                and any(owner.get(u) != owner[n] for u in n.args[0].users if u is not n)}
        if not late:
            break
        excluded.update({name: "copy_ into an input that another partition reads"
                         for name in late})
    for name, why in support.reasons.items():
        _note("fallbacks", f"{kind}: {name} runs in PyTorch: {why}")
        if opts["fallback"] == "error":
            raise KilnFallbackError(f"kiln: {kind} node {name} would fall back to "
                                    f"PyTorch: {why}")
    # copy_ nodes have no users; a partition of nothing else would have no
    # outputs, which torch 2.11's fuse_partitions rejects ("last_output_node
    # is None"). They are graph outputs while fusing, then dropped again.
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    orig_out = out_node.args
    stores = [n for n in gm.graph.nodes
              if n.target is torch.ops.aten.copy_.default and not n.users]
    if stores:
        outs = orig_out[0] if isinstance(orig_out[0], (tuple, list)) else (orig_out[0],)
        out_node.args = (tuple(outs) + tuple(stores),)
    fused = partitioner.fuse_partitions(partitions)
    if stores:
        out_node = next(n for n in fused.graph.nodes if n.op == "output")
        kept = out_node.args[0][:len(out_node.args[0]) - len(stores)]
        out_node.args = (kept if isinstance(orig_out[0], (tuple, list)) else kept[0],)
    # A fused partition sits where its last node was: the copy_ nodes left to
    # PyTorch go last, after every partition that may read the old values.
    # (No dead-code elimination runs on `fused` after this: the partitions'
    # results that only served as fusing outputs stay unused.)
    out_node = next(n for n in fused.graph.nodes if n.op == "output")
    for n in list(fused.graph.nodes):
        if n.target is torch.ops.aten.copy_.default and not n.users:
            out_node.prepend(n)
    # Inputs that a copy_ left to PyTorch writes after the partitions: a
    # partition returns no view of them (it would show the new values).
    late_targets = {n.args[0] for n in fused.graph.nodes
                    if n.target is torch.ops.aten.copy_.default and not n.users}
    calls = {n.target: n for n in fused.graph.nodes if n.op == "call_module"}
    compiled = 0

    def fall_back(name, ex):
        _note("fallbacks", f"{kind}: partition {name} runs in PyTorch: {ex}")
        if opts["fallback"] == "error":
            raise KilnFallbackError(f"kiln: {kind} partition {name} failed to "
                                    f"compile: {ex}") from ex

    # Translated here, one after another (translate reads the FX graph and
    # its fake tensors); compiled by kiln below, on threads at once.
    ready = []
    for name, sub in list(fused.named_children()):
        if not name.startswith("fused_"):
            continue
        call = calls.get(name)
        # Size inputs (SymInts) are not kiln's: the call passes the tensors.
        sizes = [is_size_input(p) for p in sub.graph.nodes if p.op == "placeholder"]
        tensor_args = [a for a, size in zip(call.args if call else (), sizes) if not size]
        written_later = frozenset(i for i, a in enumerate(tensor_args) if a in late_targets)
        try:
            ready.append((name, call, sizes, tensor_args,
                          CompiledSubgraph(sub, f"{kind}_{name}", opts, written_later,
                                           compile_now=False)))
        except (Unsupported, _capi.KilnError) as ex:
            fall_back(name, ex)
    errors = _compile_all([r[-1] for r in ready], opts)
    for (name, call, sizes, tensor_args, cs), ex in zip(ready, errors):
        if ex is not None:
            fall_back(name, ex)
            continue
        setattr(fused, name, cs)
        compiled += 1
        if call is not None and any(sizes):
            call.args = tuple(tensor_args)
    # Call the compiled partitions as plain functions: nn.Module.__call__
    # (hooks, forward dispatch) costs microseconds per call.
    for node in fused.graph.nodes:
        if node.op == "call_module" and isinstance(getattr(fused, node.target, None),
                                                   CompiledSubgraph):
            node.op = "call_function"
            node.target = getattr(fused, node.target).forward
    fused.recompile()
    # A lazy GraphModule (torch's default) installs its generated forward on
    # the first call; until then `fused.forward` is a trampoline that calls
    # the module (nn.Module.__call__, then forward) on every call, for as
    # long as the caller holds that bound method: AOTAutograd holds it.
    if hasattr(fused, "real_recompile"):
        fused.real_recompile()
    _note("stats", f"{kind}: {compiled} kiln partition(s), "
                   f"{len(support.reasons)} node(s) in PyTorch, "
                   f"{(time.perf_counter() - t0) * 1e3:.1f} ms")
    return fused


def _decompositions():
    """Core ATen decompositions, less those that change results: with torch
    2.13 the decomposition of the CPU flash-attention op gives wrong input
    gradients under AOTAutograd (checked with identity compilers, no kiln
    involved), so SDPA stays one op (translate.py's _sdpa_cpu lowers it in
    inference; training graphs trace it in math form, _hook_attention)."""
    table = dict(core_aten_decompositions())
    table.pop(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default, None)
    # Group norm (core ATen keeps it whole) as a var_mean over its groups
    # and a scale and shift per channel; its backward follows by autograd.
    table.update(get_decompositions([torch.ops.aten.native_group_norm.default]))
    # Batch norm's training forward (core ATen keeps it whole; its backward
    # is already in the core table) as the batch statistics (var_mean over
    # N, H, W), the running-statistics updates and per-channel elementwise
    # ops: a CNN's batch norms train in kiln. CPU tensors only (not measured
    # against cuDNN's kernel on the CUDA target).
    bn = torch.ops.aten._native_batch_norm_legit_functional.default
    table[bn] = _on_cpu(get_decompositions([bn])[bn])
    table[torch.ops.aten.convolution_backward.default] = _conv_backward_input
    ln_bwd = torch.ops.aten.native_layer_norm_backward.default
    if ln_bwd in table:
        table[ln_bwd] = _layer_norm_backward_decomposition(table[ln_bwd])
    table[torch.ops.aten._transformer_encoder_layer_fwd.default] = _encoder_layer_fwd
    return table


def _encoder_layer_fwd(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight,
                       proj_bias, use_gelu, norm_first, eps, norm_weight_1, norm_bias_1,
                       norm_weight_2, norm_bias_2, ffn_weight_1, ffn_bias_1, ffn_weight_2,
                       ffn_bias_2, mask=None, mask_type=None):
    """nn.TransformerEncoderLayer's inference fast path (eval mode without
    gradients: one PyTorch op for the whole layer, which kiln has no
    lowering for, so the layer ran in PyTorch) as the layer's own math: the
    packed input projection, attention, the output projection, the
    feed-forward block (ReLU, or exact GELU where `use_gelu`) and the two
    layer norms with their residuals, before (`norm_first`) or after them.
    Batch-first [B, L, E] f32 CPU tensors. The layer hands its masks over
    as float masks added to the scores (F._canonical_mask turned boolean
    ones into 0 / -inf), through MultiheadAttention.merge_masks: a key
    padding mask [B, L] (`mask_type` 1) or an attention mask expanded to
    [B, H, L, L] (2), which the op applies as masks (a nonzero entry
    hides its key); other masks and devices
    keep the op, and so do bf16 and f16 layers: their attention stays PyTorch's
    flash kernel (translate's _sdpa_cpu), which split the layer in two
    partitions, and PyTorch's fused layer was faster (2 x 512 tokens of 512
    bf16: 8.3 ms against kiln's 9.1; f32: 4.7 against 2.9 for 4 x 128 x
    256)."""
    if (src.dim() != 3 or src.device.type != "cpu" or src.dtype != torch.float32 or
            embed_dim % num_heads):
        return NotImplemented
    F = torch.nn.functional
    B, L, E = src.shape
    hd = E // num_heads
    if mask is not None:
        if not mask.is_floating_point() or mask_type not in (1, 2):
            return NotImplemented
        mask = mask.reshape(B, 1, 1, L) if mask_type == 1 else mask
        if mask.dim() != 4:
            return NotImplemented
        # The fused op masks where the float mask is nonzero (it converts
        # it to bool), rather than adding it: the same for the layer's
        # 0 / -inf masks, not for other values.
        mask = torch.zeros_like(mask).masked_fill(mask != 0, float("-inf"))

    def attention(x):
        qkv = F.linear(x, qkv_weight, qkv_bias).view(B, L, 3, num_heads, hd)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return F.linear(o.transpose(1, 2).reshape(B, L, E), proj_weight, proj_bias)

    def ffn(x):
        h = F.linear(x, ffn_weight_1, ffn_bias_1)
        return F.linear(F.gelu(h) if use_gelu else F.relu(h), ffn_weight_2, ffn_bias_2)

    def norm(x, w, b):
        return F.layer_norm(x, (E,), w, b, eps)

    if norm_first:
        x = src + attention(norm(src, norm_weight_1, norm_bias_1))
        return x + ffn(norm(x, norm_weight_2, norm_bias_2))
    x = norm(src + attention(src), norm_weight_1, norm_bias_1)
    return norm(x + ffn(x), norm_weight_2, norm_bias_2)


def _on_cpu(decompose):
    """`decompose` for CPU tensors; the op stays whole on other devices."""
    def fn(*args, **kwargs):
        if any(isinstance(a, torch.Tensor) and a.device.type != "cpu" for a in args):
            return NotImplemented
        return decompose(*args, **kwargs)
    return fn


def _flip(w, dim):
    """w reversed along `dim`, as a cat of its one-wide slices (ops kiln
    has; aten.flip is not one)."""
    n = w.shape[dim]
    if n == 1:
        return w
    return torch.cat([w.narrow(dim, i, 1) for i in range(n - 1, -1, -1)], dim)


def _conv_backward_input(grad_output, input, weight, bias_sizes, stride, padding, dilation,
                         transposed, output_padding, groups, output_mask):
    """A stride-1 2-D convolution's input gradient as a convolution: of the
    output gradient with the weights transposed ([C, F, KH, KW]) and
    reversed, padded by dilation * (K - 1) - padding, which kiln compiles
    (lowering/ops/matmul.c's microkernel on AVX-512; oneDNN's NCHW input
    gradient of a 3x3 64-channel layer on 8x56x56 took 11.6 ms). The weight
    and bias gradients stay PyTorch's convolution_backward (kiln has no
    kernel for them); other convolutions, and CUDA ones (kiln's CUDA target
    has no convolution kernel to match cuDNN's), keep the op whole."""
    if (not output_mask[0] or transposed or groups != 1 or input.dim() != 4 or
            input.device.type != "cpu" or
            list(stride) != [1, 1] or not input.is_floating_point() or
            any(dilation[i] * (weight.shape[2 + i] - 1) < padding[i] for i in range(2))):
        return NotImplemented
    w_t = _flip(_flip(weight, 2), 3).transpose(0, 1)
    pad = [dilation[i] * (weight.shape[2 + i] - 1) - padding[i] for i in range(2)]
    grad_input = torch.ops.aten.convolution.default(grad_output, w_t, None, [1, 1], pad,
                                                    list(dilation), False, [0, 0], 1)
    grad_weight = grad_bias = None
    if output_mask[1] or output_mask[2]:
        _, grad_weight, grad_bias = torch.ops.aten.convolution_backward.default(
            grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
            output_padding, groups, [False, output_mask[1], output_mask[2]])
    return grad_input, grad_weight, grad_bias


def _layer_norm_backward_decomposition(decompose):
    """The layer norm backward stays one op where kiln has a kernel for it
    (kiln_lower_layer_norm_backward: the row sums, dx and the weight and
    bias gradients in one pass over blocks of rows): f32 on the CPU, with a
    weight and a bias and every gradient wanted. Elsewhere (CUDA, no affine
    parameters, a partial output mask) PyTorch's decomposition."""
    def decomposition(grad_out, x, normalized_shape, mean, rstd, weight, bias, output_mask):
        if (x.device.type == "cpu" and x.dtype == torch.float32 and
                grad_out.dtype == torch.float32 and weight is not None and
                bias is not None and weight.dtype == torch.float32 and
                all(output_mask)):
            return NotImplemented
        return decompose(grad_out, x, normalized_shape, mean, rstd, weight, bias,
                         output_mask)
    return decomposition


def _math_attention(example_inputs) -> bool:
    """Whether AOTAutograd traces this graph's scaled dot-product attention
    in its math form (_attention_math) instead of as PyTorch's fused op: on
    the CPU, for f32/f64 graphs that will have a backward.

    There SDPA dispatches to PyTorch's flash kernels, forward and backward,
    which kiln does not compile (their decomposition gives wrong input
    gradients under AOTAutograd with torch 2.13, see _decompositions): each
    call ran in PyTorch and split the forward and the backward into kiln
    partitions before and after it. In the math form the attention and its
    gradient (autograd's, through the matmuls and the softmax) are kiln ops
    in one partition each way. Inference keeps the fused op, which
    translate.py's _sdpa_cpu lowers without the math form's copies of the
    heads; CUDA keeps PyTorch's flash kernels."""
    tensors = [t for t in example_inputs if isinstance(t, torch.Tensor)]
    return (torch.is_grad_enabled() and any(t.requires_grad for t in tensors) and
            all(t.device.type == "cpu" for t in tensors) and
            all(t.dtype in (torch.float32, torch.float64)
                for t in tensors if t.is_floating_point()))


def _attention_math(query, key, value, is_causal, scale):
    """softmax(query key^T * scale, causal mask) value: PyTorch's reference
    formula without an attention mask or dropout, where no row is all
    masked (a causal row always sees its own position)."""
    s = torch.matmul(query, key.transpose(-2, -1))
    s = s * (1.0 / math.sqrt(query.size(-1)) if scale is None else scale)
    if is_causal:  # top-left aligned: query i sees keys j <= i
        L, S = query.size(-2), key.size(-2)
        keep = torch.ones(L, S, dtype=torch.bool, device=query.device).tril()
        s = s.masked_fill(keep.logical_not(), float("-inf"))
    return torch.matmul(torch.softmax(s, dim=-1), value)


# Set while kiln's AOTAutograd call traces a graph that _math_attention
# admits (per thread: compiles may run on several).
_tracing = threading.local()
_sdpa_hooked = False


def _hook_attention() -> bool:
    """Routes aten.scaled_dot_product_attention, while traced under the
    Python dispatcher (make_fx, as AOTAutograd traces), to _attention_math
    where _tracing.math_attention is set and the call has no attention mask,
    no dropout, no grouped heads, f32/f64 CPU operands and rank >= 3.
    Without a mask no row is all masked, so a plain softmax gives what
    PyTorch's kernels give (they return 0 for an all-masked row, where the
    plain formula gives NaN: with a mask the fused op stays). Every other
    call runs the op's own CompositeImplicitAutograd kernel, as without the
    hook. One Python kernel for the process, put in place on first use; not
    where another is registered for that key already (then the fused op
    stays). The bench's GPT step: 5.61-6.12 -> 4.94-5.53 ms (alternating
    processes, one machine)."""
    global _sdpa_hooked
    if _sdpa_hooked:
        return True
    op = torch.ops.aten.scaled_dot_product_attention.default
    dk = torch._C.DispatchKey.CompositeImplicitAutograd
    if dk in op.py_kernels:
        return False

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
             scale=None, enable_gqa=False):
        if (getattr(_tracing, "math_attention", False) and attn_mask is None and
                dropout_p == 0.0 and not enable_gqa and isinstance(is_causal, bool) and
                all(t.device.type == "cpu" and t.dtype in (torch.float32, torch.float64)
                    and t.dtype == query.dtype and t.dim() >= 3
                    for t in (query, key, value))):
            return _attention_math(query, key, value, is_causal, scale)
        return op._op_dk(dk, query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                         is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)

    op.py_impl(dk)(sdpa)
    _sdpa_hooked = True
    return True


def kiln_backend(gm: torch.fx.GraphModule, example_inputs, mode=None,
                 options=None, **kwargs):
    """The `torch_dynamo_backends` entry point named "kiln"."""
    if kwargs:
        raise ValueError(f"kiln: unexpected arguments {sorted(kwargs)}; valid: "
                         "mode, options")
    opts = parse_options(mode, options)

    def fw(g, ex):
        return _boxed(compile_graph(g, ex, opts, "forward").forward)

    def bw(g, ex):
        return _boxed(compile_graph(g, ex, opts, "backward").forward)

    def inference(g, ex):
        # A graph without a backward: parameters change between calls
        # rarely, so what it computes from them alone is prepared once.
        sp = hoist.split(g, hoist.static_input_indices()) if opts["hoist_params"] else None
        if sp is None:
            return fw(g, ex)
        main = compile_graph(sp.main, ex, opts, "forward")
        return _boxed(hoist.Prepared(sp, main.forward,
                                     lambda m: _note("hoist", f"forward: {m}")))

    # Inference graphs keep their input mutations (an optimizer step's
    # parameter and state updates) as copy_ nodes, which kiln performs in
    # place, instead of AOTAutograd copying outputs back after the call.
    compile_joint = aot_autograd(fw_compiler=fw, bw_compiler=bw, inference_compiler=inference,
                                 decompositions=_decompositions(),
                                 keep_inference_input_mutations=True)
    if not (_math_attention(example_inputs) and _hook_attention()):
        return compile_joint(gm, example_inputs)
    _tracing.math_attention = True
    try:
        return compile_joint(gm, example_inputs)
    finally:
        _tracing.math_attention = False


def _boxed(fn):
    """`fn` in AOTAutograd's boxed calling convention (a list of inputs)."""
    from torch._functorch.aot_autograd import make_boxed_func
    return make_boxed_func(fn)
