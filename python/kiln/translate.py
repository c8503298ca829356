"""FX graph (core ATen) → kiln graph text.

One translator per ATen overload. A translator gets the node and an emitter
and returns the kiln value name(s) of its result; it raises Unsupported with
the reason when kiln cannot take the node, which the partitioner turns into a
fallback to PyTorch. Some backward ops are written here as a few kiln ops
(threshold_backward is a compare and a select), the way decompositions are.
"""

from __future__ import annotations

import functools
import math
import operator
import os
import re

import torch

aten = torch.ops.aten
prims = torch.ops.prims

DTYPES = {
    torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16",
    torch.float64: "f64", torch.int32: "i32", torch.int64: "i64",
    torch.bool: "bool",
}
MAX_RANK = 8
INT64_MAX = 2 ** 63 - 1


class Unsupported(Exception):
    """kiln cannot take this node; the message says why."""


_SYMBOL = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _dim(d) -> str:
    """kiln size text: an integer, a symbol ("s0"), or a constant times
    symbols ("128*s0": a flattened batch). A size Dynamo passes as an FX node
    (a SymInt placeholder) is its traced expression."""
    if isinstance(d, torch.fx.Node):
        d = d.meta.get("val")
    if isinstance(d, bool):
        raise Unsupported(f"size {d!r}")
    if isinstance(d, int):
        return str(d)
    if isinstance(d, torch.SymInt):
        expr = d.node.expr
        if expr.is_Integer:
            return str(int(expr))
        coef, factors = 1, []
        for f in (expr.args if expr.is_Mul else (expr,)):
            if f.is_Integer and int(f) > 0:
                coef *= int(f)
            elif f.is_Symbol and _SYMBOL.match(str(f)):
                factors.append(str(f))
            elif f.is_Pow and f.base.is_Symbol and f.exp.is_Integer and int(f.exp) > 0 \
                    and _SYMBOL.match(str(f.base)):
                factors += [str(f.base)] * int(f.exp)
            else:
                raise Unsupported(f"size expression {d} (kiln takes products of a "
                                  f"constant and symbols)")
        if len(factors) > 4:
            raise Unsupported(f"size expression {d} (more than 4 symbols)")
        return "*".join(([str(coef)] if coef != 1 else []) + sorted(factors))
    raise Unsupported(f"size {d!r}")


def _shape_list(xs) -> str:
    """A 'shape' attribute: integers (-1 too) and size expressions."""
    if isinstance(xs, (int, torch.SymInt, torch.fx.Node)):
        xs = [xs]
    return "[" + ", ".join(str(x) if isinstance(x, int) and not isinstance(x, bool)
                           else _dim(x) for x in xs) + "]"


def tensor_type(val) -> str:
    """kiln type text of a (fake) tensor, or Unsupported."""
    if not isinstance(val, torch.Tensor):
        raise Unsupported(f"value of type {type(val).__name__} is not a tensor")
    if val.dtype not in DTYPES:
        raise Unsupported(f"dtype {val.dtype}")
    if val.device.type == "cuda" and (val.device.index or 0) != 0:
        raise Unsupported(f"device {val.device} (kiln's CUDA target uses cuda:0)")
    if val.device.type not in ("cpu", "cuda"):
        raise Unsupported(f"device {val.device} (kiln targets cpu and cuda:0)")
    if val.dim() > MAX_RANK:
        raise Unsupported(f"rank {val.dim()} > {MAX_RANK}")
    if val.is_sparse or val.is_quantized:
        raise Unsupported("sparse or quantized tensor")
    return f"{DTYPES[val.dtype]}[{','.join(_dim(d) for d in val.shape)}]"


def _static_int(x, what: str) -> int:
    if isinstance(x, bool) or not isinstance(x, int):
        raise Unsupported(f"{what} is {x!r}; expected a static integer")
    return x


def _int_list(xs, what: str) -> str:
    if isinstance(xs, int):
        xs = [xs]
    return "[" + ", ".join(str(_static_int(x, what)) for x in xs) + "]"


def _scalar(x) -> str:
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        if math.isnan(x):
            return "nan"
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        r = repr(x)
        return r if ("." in r or "e" in r) else r + ".0"
    raise Unsupported(f"scalar {x!r} ({type(x).__name__})")


class Emitter:
    """Collects kiln statements; maps FX nodes to kiln value names."""

    def __init__(self):
        self.lines: list[str] = []
        self.names: dict[torch.fx.Node, object] = {}
        self.counter = 0

    def fresh(self, base: str) -> str:
        self.counter += 1
        return f"%{base}_{self.counter}"

    def operand(self, x) -> str:
        if isinstance(x, torch.fx.Node):
            if x not in self.names:
                raise Unsupported(f"operand {x.name} is not available to kiln")
            name = self.names[x]
            if isinstance(name, list):
                raise Unsupported(f"operand {x.name} is a tuple")
            return name
        if x is None:
            return "none"
        return _scalar(x)

    def op(self, op: str, operands, attrs: dict | None = None,
           nresults: int = 1):
        results = [self.fresh("v") for _ in range(nresults)]
        text = f"  {', '.join(results)} = {op}({', '.join(operands)})"
        if attrs:
            text += " {" + ", ".join(f"{k} = {v}" for k, v in attrs.items()) + "}"
        self.lines.append(text)
        return results[0] if nresults == 1 else results


def _arg(node, i, name, default=None):
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(name, default)


# --- translators ---------------------------------------------------------

def _unary(kop):
    def tr(e, n):
        return e.op(kop, [e.operand(n.args[0])])
    return tr


def _binary(kop):
    def tr(e, n):
        attrs = {}
        alpha = n.kwargs.get("alpha", n.args[2] if len(n.args) > 2 else 1)
        if alpha != 1:
            attrs["alpha"] = _scalar(alpha)
        return e.op(kop, [e.operand(n.args[0]), e.operand(n.args[1])], attrs)
    return tr


def _div_mode(e, n):
    mode = n.kwargs.get("rounding_mode", _arg(n, 2, "rounding_mode"))
    attrs = {"rounding_mode": f'"{mode}"'} if mode else {}
    return e.op("aten.div", [e.operand(n.args[0]), e.operand(n.args[1])], attrs)


def _gelu(e, n):
    approx = n.kwargs.get("approximate", "none")
    return e.op("aten.gelu", [e.operand(n.args[0])], {"approximate": f'"{approx}"'})


def _where(e, n):
    return e.op("aten.where", [e.operand(a) for a in n.args[:3]])


def _convert(e, n):
    dtype = n.args[1] if n.target is prims.convert_element_type.default else n.kwargs.get("dtype")
    return _convert_to(e, n, dtype)


def _convert_to(e, n, dtype):
    if dtype is not None and dtype not in DTYPES:
        raise Unsupported(f"dtype {dtype}")
    x = e.operand(n.args[0])
    if dtype is None:
        return e.op("aten.clone", [x])
    return e.op("prims.convert_element_type", [x], {"dtype": DTYPES[dtype]})


def _to_copy(e, n):
    for k, v in n.kwargs.items():
        if k == "dtype":
            continue
        if k == "device" and v is not None and \
                torch.device(v).type != n.args[0].meta["val"].device.type:
            raise Unsupported(f"_to_copy to device {v} (a copy between devices)")
        if k in ("layout",) and v not in (None, torch.strided):
            raise Unsupported(f"_to_copy with layout {v}")
    return _convert_to(e, n, n.kwargs.get("dtype"))


def _reduce(kop, dims_index=1, has_keepdim=True):
    def tr(e, n):
        attrs = {}
        dims = _arg(n, dims_index, "dim") if dims_index is not None else None
        if dims is not None and dims != []:
            attrs["dims"] = _int_list(dims, "dim")
        if has_keepdim and _arg(n, dims_index + 1, "keepdim", False):
            attrs["keepdim"] = "true"
        dtype = n.kwargs.get("dtype")
        if dtype is not None:
            if dtype not in DTYPES:
                raise Unsupported(f"dtype {dtype}")
            attrs["dtype"] = DTYPES[dtype]
        return e.op(kop, [e.operand(n.args[0])], attrs)
    return tr


def _var(e, n):
    attrs = {}
    dims = _arg(n, 1, "dim")
    if dims:
        attrs["dims"] = _int_list(dims, "dim")
    corr = n.kwargs.get("correction")
    attrs["correction"] = _scalar(1 if corr is None else corr)
    if n.kwargs.get("keepdim", False):
        attrs["keepdim"] = "true"
    return e.op("aten.var", [e.operand(n.args[0])], attrs)


def _var_mean(e, n):
    """(var, mean) over the same dims: two kiln reductions, each annotated
    with its own type."""
    var = _var(e, n)
    e.lines[-1] += " : " + tensor_type(n.meta["val"][0])
    attrs = {}
    dims = _arg(n, 1, "dim")
    if dims:
        attrs["dims"] = _int_list(dims, "dim")
    if n.kwargs.get("keepdim", False):
        attrs["keepdim"] = "true"
    mean = e.op("aten.mean", [e.operand(n.args[0])], attrs)
    e.lines[-1] += " : " + tensor_type(n.meta["val"][1])
    return [var, mean]


_var_mean.own_types = True


def _addmm(e, n):
    attrs = {}
    for k in ("beta", "alpha"):
        v = n.kwargs.get(k, 1)
        if v != 1:
            attrs[k] = _scalar(v)
    return e.op("aten.addmm", [e.operand(a) for a in n.args[:3]], attrs)


def _conv_transposed(e, x, w, b, stride, padding, dilation, output_padding, groups):
    """A transposed convolution whose kernel equals its stride, with no
    padding, no output padding and one group (a UNet's or a decoder's
    upsampling, ConvTranspose2d(c, f, 2, stride=2)): each input pixel
    writes its own KH x KW block of the output and no two blocks overlap,
    so it is one matmul of the pixels' channels [N*H*W, C] by the weight
    viewed as [C, F*KH*KW], its blocks then moved into place (a permute),
    and the bias added. Other transposed convolutions (overlapping taps:
    kernel 4, stride 2, padding 1) stay PyTorch's."""
    xv, wv = x.meta["val"], w.meta["val"]
    if xv.dim() != 4 or wv.dim() != 4:
        raise Unsupported(f"{wv.dim() - 2}-D transposed convolution (kiln takes 2-D)")
    C, F, KH, KW = (_static_int(d, "a weight size") for d in wv.shape)
    stride = [_static_int(v, "stride") for v in stride]
    if (list(padding) != [0, 0] or list(dilation) != [1, 1] or any(output_padding) or
            groups != 1 or stride != [KH, KW]):
        raise Unsupported(f"transposed convolution with kernel {KH}x{KW}, stride {stride}, "
                          f"padding {list(padding)}, output padding {list(output_padding)}, "
                          f"dilation {list(dilation)}, groups {groups} (kiln takes the "
                          "kernel equal to the stride, no padding, one group)")
    N, _, H, W = xv.shape
    rows = e.op("aten.reshape", [e.op("aten.permute", [e.operand(x)], {"dims": "[0, 2, 3, 1]"})],
                {"shape": _shape_list([N * H * W, C])})
    wm = e.op("aten.view", [e.operand(w)], {"shape": _shape_list([C, F * KH * KW])})
    y = e.op("aten.mm", [rows, wm])
    y = e.op("aten.view", [y], {"shape": _shape_list([N, H, W, F, KH, KW])})
    y = e.op("aten.permute", [y], {"dims": "[0, 3, 1, 4, 2, 5]"})
    y = e.op("aten.reshape", [y], {"shape": _shape_list([N, F, H * KH, W * KW])})
    if b is not None:
        y = e.op("aten.add", [y, e.op("aten.view", [e.operand(b)], {"shape": f"[{F}, 1, 1]"})])
    return y


def _patches(e, x, w, b, stride, padding, dilation, groups):
    """A convolution whose kernel equals its stride (KH x KW > 1, or 1x1 on
    at most 16 pixels), with no padding, no dilation and one group (a ViT's
    patch embedding, Conv2d(3, d, 16, stride=16)) as one matmul, or None
    for any other. Each output pixel reads its own KH x KW patch and no two
    patches overlap, so the input's patches, moved next to each other (a
    permute of a view), are the rows [N*OH*OW, C*KH*KW] of a linear layer
    with the weight viewed as [F, C*KH*KW]; its result [N, OH, OW, F] is
    permuted to [N, F, OH, OW]. Rows and columns past the last whole patch
    are sliced off, as the convolution drops them. As a convolution, kiln
    split the stride into KH x KW phases: 256 for a 16 x 16 patch, which
    compiled for 47 s."""
    xv, wv = x.meta["val"], w.meta["val"]
    # (CPU only: no GPU test has covered the form on kiln's CUDA target.)
    if xv.dim() != 4 or wv.dim() != 4 or xv.device.type != "cpu":
        return None
    # (The batch may be symbolic: Dynamo's dynamic batch.)
    ints = list(xv.shape[1:]) + list(wv.shape) + list(stride) + list(padding) + list(dilation)
    if not all(
            isinstance(v, int) and not isinstance(v, bool) for v in ints + [groups]):
        return None
    N, C, H, W = xv.shape
    F, _, KH, KW = wv.shape
    if (list(stride) != [KH, KW] or list(padding) != [0, 0] or
            list(dilation) != [1, 1] or groups != 1 or H < KH or W < KW):
        return None
    # A 1x1 convolution is one too, but kiln's convolution kernel reads its
    # NCHW input in place; a matmul only pays where the map is a few pixels
    # (a network's last stages, squeeze-and-excitation's 1x1 maps: 320 ->
    # 1280 channels on [2, 320, 3, 3] took 3.2 ms as a convolution, eager
    # 0.27).
    if KH * KW == 1 and H * W > 16:
        return None
    OH, OW = H // KH, W // KW
    src = e.operand(x)
    for dim, keep, size in ((2, OH * KH, H), (3, OW * KW, W)):
        if keep != size:
            src = e.op("aten.slice", [src], {"dim": str(dim), "start": "0", "end": str(keep),
                                              "step": "1"})
    v = e.op("aten.view", [src], {"shape": _shape_list([N, C, OH, KH, OW, KW])})
    v = e.op("aten.permute", [v], {"dims": "[0, 2, 4, 1, 3, 5]"})
    rows = e.op("aten.reshape", [v], {"shape": _shape_list([N * OH * OW, C * KH * KW])})
    wt = e.op("aten.permute", [e.op("aten.view", [e.operand(w)],
                                    {"shape": _shape_list([F, C * KH * KW])})], {"dims": "[1, 0]"})
    y = (e.op("aten.addmm", [e.operand(b), rows, wt]) if b is not None
         else e.op("aten.mm", [rows, wt]))
    y = e.op("aten.view", [y], {"shape": _shape_list([N, OH, OW, F])})
    return e.op("aten.permute", [y], {"dims": "[0, 3, 1, 2]"})


def _conv(e, n):
    x, w, b, stride, padding, dilation, transposed, output_padding, groups = n.args[:9]
    if transposed:
        return _conv_transposed(e, x, w, b, stride, padding, dilation, output_padding, groups)
    if len(w.meta["val"].shape) != 4:
        raise Unsupported(f"{len(w.meta['val'].shape) - 2}-D convolution (kiln has 2-D)")
    patches = _patches(e, x, w, b, stride, padding, dilation, groups)
    if patches is not None:
        return patches  # (a matmul: bf16 too)
    xv = x.meta["val"]
    if xv.dtype == torch.bfloat16 and xv.device.type == "cpu":
        # kiln's convolution microkernel is f32; a bf16 layer took the
        # generic contraction, 1.2-6.7x slower than PyTorch's (oneDNN, AMX
        # where the CPU has it) on every layer measured: 3x3 64 -> 64 on
        # 8 x 56 x 56 13.1 against 4.7 ms, 7x7 stride 2 16.1 against 5.0.
        raise Unsupported("bf16 convolution: kiln's convolution kernel is f32; PyTorch's "
                          "is faster than kiln's generic contraction")
    return e.op("aten.convolution", [e.operand(x), e.operand(w), e.operand(b)],
                {"stride": _int_list(stride, "stride"),
                 "padding": _int_list(padding, "padding"),
                 "dilation": _int_list(dilation, "dilation"),
                 "groups": str(_static_int(groups, "groups"))})


def _permute(e, n):
    return e.op("aten.permute", [e.operand(n.args[0])], {"dims": _int_list(n.args[1], "dims")})


def _t(e, n):
    rank = n.args[0].meta["val"].dim()
    if rank < 2:
        return e.op("aten.clone", [e.operand(n.args[0])])
    return e.op("aten.permute", [e.operand(n.args[0])], {"dims": "[1, 0]"})


def _transpose(e, n):
    return e.op("aten.transpose", [e.operand(n.args[0])],
                {"dim0": str(_static_int(n.args[1], "dim0")),
                 "dim1": str(_static_int(n.args[2], "dim1"))})


def _view(e, n):
    return e.op("aten.view", [e.operand(n.args[0])], {"shape": _shape_list(n.args[1])})


def _as_strided(e, n):
    """as_strided that is a view: the source contiguous from offset 0 and the
    result its elements in order (the contiguous strides of the same number
    of elements), as group norm's decomposition reshapes its per-group
    scales; any other layout stays in PyTorch."""
    src, size, stride = n.args[0], list(n.args[1]), list(n.args[2])
    offset = n.args[3] if len(n.args) > 3 else n.kwargs.get("storage_offset")
    val = src.meta.get("val") if isinstance(src, torch.fx.Node) else None
    if not isinstance(val, torch.Tensor) or not val.is_contiguous() or \
            val.storage_offset() != 0 or offset not in (None, 0):
        raise Unsupported("as_strided of a strided or offset tensor")
    dense, acc = [], 1
    for d in reversed(size):
        dense.append(acc)
        acc *= d
    if any(st != dn for st, dn, d in zip(stride, reversed(dense), size) if d != 1):
        raise Unsupported(f"as_strided to strides {stride} (not a view of {size})")
    if acc != val.numel():
        raise Unsupported("as_strided to fewer elements than its source")
    return e.op("aten.view", [e.operand(src)], {"shape": _int_list(size, "shape")})


def _expand(e, n):
    return e.op("aten.expand", [e.operand(n.args[0])], {"shape": _shape_list(n.args[1])})


def _squeeze(e, n):
    attrs = {}
    if len(n.args) > 1:
        attrs["dims"] = _int_list(n.args[1], "dim")
    return e.op("aten.squeeze", [e.operand(n.args[0])], attrs)


def _unsqueeze(e, n):
    return e.op("aten.unsqueeze", [e.operand(n.args[0])], {"dim": str(_static_int(n.args[1], "dim"))})


def _slice(e, n):
    dim = _arg(n, 1, "dim", 0)
    start = _arg(n, 2, "start", None)
    end = _arg(n, 3, "end", None)
    step = _arg(n, 4, "step", 1)
    attrs = {"dim": str(_static_int(dim, "dim"))}
    attrs["start"] = str(_static_int(0 if start is None else start, "start"))
    if isinstance(end, (torch.SymInt, torch.fx.Node)):
        # A symbolic end (`buf[:, :T]` under a dynamic length): its size
        # expression; kiln checks at each call that it is within the dim.
        attrs["end"] = _dim(end)
    else:
        attrs["end"] = str(INT64_MAX if end is None else min(_static_int(end, "end"), INT64_MAX))
    attrs["step"] = str(_static_int(step, "step"))
    return e.op("aten.slice", [e.operand(n.args[0])], attrs)


def _split(e, n):
    """split / split_with_sizes as one slice per piece (a list of kiln
    values, read through getitem): nn.MultiheadAttention splits its input
    projection into the query's and the key/value's parts this way."""
    x = n.args[0]
    rank = x.meta["val"].dim()
    dim = _static_int(_arg(n, 2, "dim", 0), "dim")
    dim = dim + rank if dim < 0 else dim
    names, start = [], 0
    for v in n.meta["val"]:
        size = _static_int(v.shape[dim], "a split size")
        names.append(e.op("aten.slice", [e.operand(x)], {
            "dim": str(dim), "start": str(start), "end": str(start + size), "step": "1"}))
        e.lines[-1] += " : " + tensor_type(v)
        start += size
    return names


_split.own_types = True


def _cat(e, n):
    tensors = list(n.args[0])
    dim = _arg(n, 1, "dim", 0)
    # cat skips legacy empty 1-D tensors; kiln does not.
    for t in tensors:
        v = t.meta["val"]
        if v.dim() == 1 and v.shape[0] == 0:
            raise Unsupported("cat with an empty 1-D tensor")
    return e.op("aten.cat", [e.operand(t) for t in tensors], {"dim": str(_static_int(dim, "dim"))})


def _full(e, n):
    size, value = n.args[0], n.args[1]
    return e.op("aten.full", [], {"shape": _shape_list(size), "value": _scalar(value),
                                  "dtype": DTYPES[n.meta["val"].dtype]})


def _scalar_tensor(e, n):
    return e.op("aten.full", [], {"shape": "[]", "value": _scalar(n.args[0]),
                                  "dtype": DTYPES[n.meta["val"].dtype]})


def _softmax(kop):
    def tr(e, n):
        return e.op(kop, [e.operand(n.args[0])],
                    {"dim": str(_static_int(n.args[1], "dim")),
                     "half_to_float": "true" if n.args[2] else "false"})
    return tr


def _layer_norm(e, n):
    x, shape, w, b, eps = n.args[:5]
    names = e.op("aten.native_layer_norm", [e.operand(x), e.operand(w), e.operand(b)],
                 {"normalized_shape": _int_list(shape, "normalized_shape"),
                  "eps": _scalar(float(eps))}, nresults=3)
    return names


def _layer_norm_backward(e, n):
    """native_layer_norm_backward, as the decomposition table leaves it (f32
    on the CPU, affine, every output wanted): kiln's op takes (grad_out, x,
    mean, rstd, weight); the bias only decides that its gradient is wanted."""
    dy, x, shape, mean, rstd, w = n.args[:6]
    if w is None or not all(n.args[7]):
        raise Unsupported("native_layer_norm_backward without a weight or with a "
                          "partial output mask")
    return e.op("aten.native_layer_norm_backward",
                [e.operand(dy), e.operand(x), e.operand(mean), e.operand(rstd), e.operand(w)],
                {"normalized_shape": _int_list(shape, "normalized_shape")}, nresults=3)


def _embedding(e, n):
    return e.op("aten.embedding", [e.operand(n.args[0]), e.operand(n.args[1])])


def _index(e, n):
    """x[..., i0, i1, ...] (aten.index / _unsafe_index with index tensors on
    consecutive dims; a nearest upsampling's form): kiln's aten.index with
    the first indexed dim. Boolean masks (a result size that depends on the
    data) and index tensors on dims apart from each other (the result puts
    their broadcast shape first) stay in PyTorch. Out-of-range indices are
    clamped where PyTorch raises (kiln never reads outside x)."""
    x, indices = n.args[0], n.args[1]
    pos = [i for i, t in enumerate(indices) if t is not None]
    if not pos:
        raise Unsupported("index without index tensors")
    if pos != list(range(pos[0], pos[-1] + 1)):
        raise Unsupported(f"index tensors on dims {pos}, not adjacent (the result "
                          "puts their shape first)")
    for i in pos:
        t = indices[i]
        tv = t.meta.get("val") if isinstance(t, torch.fx.Node) else None
        if tv is None or tv.dtype not in (torch.int32, torch.int64):
            raise Unsupported(f"index on dim {i}: {getattr(tv, 'dtype', t)!r}; kiln takes "
                              "i32/i64 index tensors (a boolean mask's result size "
                              "depends on the data)")
    return e.op("aten.index", [e.operand(x)] + [e.operand(indices[i]) for i in pos],
                {"dim": str(pos[0])})


# index_put's lowering reads every value once per table row: V x P values.
_INDEX_PUT_MAX_READS = 1 << 24


def _index_put(e, n):
    """index_put(base, [indices], values, accumulate=True) on CUDA, the
    form an embedding's gradient takes: base[V, D] f32 with values[p] added
    to row indices[p] (no scatter: see kiln_lower_index_put, which reads
    every value once per row). On the CPU, and for large tables, PyTorch's
    index_put is faster."""
    base, indices, values = n.args[:3]
    accumulate = n.args[3] if len(n.args) > 3 else n.kwargs.get("accumulate", False)
    bv = base.meta["val"] if isinstance(base, torch.fx.Node) else None
    if (not accumulate or not isinstance(indices, (list, tuple)) or len(indices) != 1
            or not isinstance(indices[0], torch.fx.Node) or bv is None):
        raise Unsupported("index_put: only accumulate=True with one index tensor")
    iv = indices[0].meta["val"]
    vv = values.meta["val"] if isinstance(values, torch.fx.Node) else None
    if bv.device.type != "cuda" or bv.dim() != 2 or bv.dtype != torch.float32:
        raise Unsupported("index_put: kiln takes an f32[V, D] table on CUDA")
    static = all(isinstance(d, int) for t in (bv, iv, vv) if t is not None for d in t.shape)
    if (not static or iv.dtype not in (torch.int32, torch.int64) or vv is None
            or vv.dtype != torch.float32 or list(vv.shape) != list(iv.shape) + [bv.shape[1]]):
        raise Unsupported("index_put: kiln takes static i32/i64 indices and f32 values "
                          "of the indices' shape then D")
    if bv.shape[0] * iv.numel() > _INDEX_PUT_MAX_READS:
        raise Unsupported(f"index_put: {bv.shape[0]} rows x {iv.numel()} indices "
                          f"exceed {_INDEX_PUT_MAX_READS} reads")
    return e.op("aten.index_put", [e.operand(base), e.operand(indices[0]),
                                   e.operand(values)], {"accumulate": "true"})


def _copy(e, n):
    """aten.copy(dst, src): src converted to dst's dtype and broadcast to its
    shape (the functional form of copy_)."""
    return _copy_value(e, n.args[0].meta["val"], n.args[1])


def _copy_value(e, dst, src):
    x = e.operand(src)
    sval = src.meta["val"] if isinstance(src, torch.fx.Node) else None
    if sval is None or sval.dtype != dst.dtype:
        x = e.op("prims.convert_element_type", [x], {"dtype": DTYPES[dst.dtype]})
    if sval is None or tuple(sval.shape) != tuple(dst.shape):
        x = e.op("aten.expand", [x], {"shape": _int_list(list(dst.shape), "size")})
    elif x == e.operand(src):  # nothing emitted: a statement to annotate
        x = e.op("aten.clone", [x])
    return x


def _copy_(e, n):
    """copy_ into a graph input (what functionalization leaves at the end of
    an optimizer step): the converted value; translate() turns it into a
    store into that input, `return %v -> %x`."""
    if n.args[0].op != "placeholder":
        raise Unsupported("copy_ into a value that is not a graph input")
    return _copy(e, n)


def _max_pool2d(e, n):
    """max_pool2d_with_indices (and max_pool2d) as kiln's aten.max_pool2d:
    the values only, so the indices must be unused (training keeps them for
    the backward: that node then runs in PyTorch). ceil_mode is taken where
    it gives the floor-mode size. CPU only (not tried on the CUDA target:
    the node stays in PyTorch there)."""
    x = n.args[0]
    def pair(v, default):
        if isinstance(v, int):
            return [v, v]
        if not v:
            return default
        return [v[0], v[0]] if len(v) == 1 else list(v)

    k = pair(_arg(n, 1, "kernel_size"), None)
    stride = pair(_arg(n, 2, "stride", []), list(k))
    padding = pair(_arg(n, 3, "padding", 0), [0, 0])
    dilation = pair(_arg(n, 4, "dilation", 1), [1, 1])
    if n.target is aten.max_pool2d_with_indices.default and any(
            u.target is not operator.getitem or u.args[1] != 0 for u in n.users):
        raise Unsupported("max_pool2d indices used (kiln computes the values only)")
    xv = x.meta["val"]
    if xv.device.type == "cuda":
        raise Unsupported("max_pool2d on CUDA (kiln lowers it for the CPU only)")
    if xv.dim() != 4:
        raise Unsupported(f"max_pool2d of a rank-{xv.dim()} tensor (kiln takes NCHW)")
    want = [(_static_int(xv.shape[2 + i], "spatial size") + 2 * padding[i]
             - dilation[i] * (k[i] - 1) - 1) // stride[i] + 1 for i in range(2)]
    val = n.meta["val"]
    got = list((val[0] if isinstance(val, (tuple, list)) else val).shape[2:])
    if got != want:
        raise Unsupported(f"max_pool2d with ceil_mode: output {got}, floor mode gives {want}")
    y = e.op("aten.max_pool2d", [e.operand(x)],
             {"kernel_size": _int_list(k, "kernel_size"), "stride": _int_list(stride, "stride"),
              "padding": _int_list(padding, "padding"),
              "dilation": _int_list(dilation, "dilation")})
    return [y, None] if n.target is aten.max_pool2d_with_indices.default else y


def _batch_norm_inference(e, n):
    """Inference batch norm: (x - mean) * rsqrt(var + eps) * weight + bias per
    channel (dim 1). Its two other results (saved statistics, empty in
    inference) must be unused."""
    x, w, b, mean, var = n.args[:5]
    eps = n.args[6] if len(n.args) > 6 else n.kwargs.get("eps", 1e-5)
    users = {u.args[1] for u in n.users if u.target is operator.getitem}
    if users - {0} or any(u.target is not operator.getitem for u in n.users):
        raise Unsupported("batch norm statistics used (kiln computes the output only)")
    rank = x.meta["val"].dim()
    if rank < 2:
        raise Unsupported(f"batch norm of a rank-{rank} tensor")
    chan = x.meta["val"].shape[1]
    shape = "[" + ", ".join([str(chan)] + ["1"] * (rank - 2)) + "]"

    def per_channel(v):
        return e.op("aten.view", [e.operand(v)], {"shape": shape})

    inv = e.op("aten.rsqrt", [e.op("aten.add", [per_channel(var), _scalar(float(eps))])])
    if w is not None:
        inv = e.op("aten.mul", [inv, per_channel(w)])
    y = e.op("aten.mul", [e.op("aten.sub", [e.operand(x), per_channel(mean)]), inv])
    if b is not None:
        y = e.op("aten.add", [y, per_channel(b)])
    return [y, None, None]


def _threshold_backward(e, n):
    grad, x, thr = n.args[:3]
    mask = e.op("aten.le", [e.operand(x), _scalar(thr)])
    return e.op("aten.where", [mask, "0", e.operand(grad)])


def _softmax_backward(e, n):
    grad, out, dim = n.args[:3]
    g, o = e.operand(grad), e.operand(out)
    d = str(_static_int(dim, "dim"))
    go = e.op("aten.mul", [g, o])
    s = e.op("aten.sum", [go], {"dims": f"[{d}]", "keepdim": "true"})
    t = e.op("aten.sub", [g, s])
    return e.op("aten.mul", [o, t])


def _log_softmax_backward(e, n):
    grad, out, dim = n.args[:3]
    g, o = e.operand(grad), e.operand(out)
    d = str(_static_int(dim, "dim"))
    s = e.op("aten.sum", [g], {"dims": f"[{d}]", "keepdim": "true"})
    p = e.op("aten.exp", [o])
    q = e.op("aten.mul", [p, s])
    return e.op("aten.sub", [g, q])


def _sigmoid_backward(e, n):
    g, o = e.operand(n.args[0]), e.operand(n.args[1])
    one_minus = e.op("aten.sub", ["1", o])
    t = e.op("aten.mul", [o, one_minus])
    return e.op("aten.mul", [g, t])


def _tanh_backward(e, n):
    g, o = e.operand(n.args[0]), e.operand(n.args[1])
    sq = e.op("aten.mul", [o, o])
    one_minus = e.op("aten.sub", ["1", sq])
    return e.op("aten.mul", [g, one_minus])


def _clamp_to(e, n, lo, hi):
    """min(max(x, lo), hi), as torch.clamp defines it (hi wins where lo >
    hi; NaN stays NaN); bounds are scalars or tensors (broadcast)."""
    x = e.operand(n.args[0])
    if lo is None and hi is None:
        return e.op("aten.clone", [x])
    if lo is not None:
        x = e.op("aten.maximum", [x, e.operand(lo)])
    if hi is not None:
        x = e.op("aten.minimum", [x, e.operand(hi)])
    return x


def _clamp(e, n):
    return _clamp_to(e, n, _arg(n, 1, "min"), _arg(n, 2, "max"))


def _hardtanh(e, n):
    # relu6 is hardtanh(x, 0, 6).
    return _clamp_to(e, n, _arg(n, 1, "min_val", -1.0), _arg(n, 2, "max_val", 1.0))


def _leaky_relu(e, n):
    x = e.operand(n.args[0])
    slope = _arg(n, 1, "negative_slope", 0.01)
    return e.op("aten.where", [e.op("aten.gt", [x, "0"]), x,
                               e.op("aten.mul", [x, _scalar(float(slope))])])


def _expm1(e, x):
    """exp(x) - 1 without losing small x: with u = exp(x) rounded,
    (u - 1) * x / log(u) (Kahan's trick); x itself where u rounds to 1, -1
    where it underflows to 0."""
    u = e.op("aten.exp", [x])
    ratio = e.op("aten.mul", [e.op("aten.sub", [u, "1.0"]),
                              e.op("aten.div", [x, e.op("aten.log", [u])])])
    r = e.op("aten.where", [e.op("aten.eq", [u, "1.0"]), x, ratio])
    return e.op("aten.where", [e.op("aten.eq", [u, "0.0"]), "-1.0", r])


def _elu(e, n):
    """x * scale where x > 0, else expm1(x * input_scale) * alpha * scale
    (NaN stays NaN)."""
    x = e.operand(n.args[0])
    alpha = float(_arg(n, 1, "alpha", 1.0))
    scale = float(_arg(n, 2, "scale", 1.0))
    input_scale = float(_arg(n, 3, "input_scale", 1.0))
    xi = x if input_scale == 1.0 else e.op("aten.mul", [x, _scalar(input_scale)])
    neg = _expm1(e, xi)
    if alpha * scale != 1.0:
        neg = e.op("aten.mul", [neg, _scalar(alpha * scale)])
    pos = x if scale == 1.0 else e.op("aten.mul", [x, _scalar(scale)])
    return e.op("aten.where", [e.op("aten.gt", [x, "0"]), pos, neg])


def _log1p(e, n):
    """log(1 + x) without losing small x: with u = 1 + x rounded,
    log(u) * x / (u - 1) (exact where u - 1 is, Goldberg's trick); x itself
    where u rounds to 1, +inf at +inf."""
    x = e.operand(n.args[0])
    u = e.op("aten.add", [x, "1.0"])
    ratio = e.op("aten.mul", [e.op("aten.log", [u]),
                              e.op("aten.div", [x, e.op("aten.sub", [u, "1.0"])])])
    r = e.op("aten.where", [e.op("aten.eq", [u, "1.0"]), x, ratio])
    return e.op("aten.where", [e.op("aten.eq", [x, "inf"]), x, r])


def _bool_only(kop):
    """bitwise ops equal the logical ones on bools (kiln has no integer
    bitwise ops yet)."""
    def tr(e, n):
        for a in n.args[:2]:
            if isinstance(a, torch.fx.Node) and a.meta["val"].dtype != torch.bool:
                raise Unsupported(f"{n.target} on {a.meta['val'].dtype} (kiln: bool only)")
        return e.op(kop, [e.operand(a) for a in n.args[:2] if a is not None])
    return tr


def _full_like(e, n):
    val = n.meta["val"]
    return e.op("aten.full", [], {"shape": _shape_list(list(val.shape)),
                                  "value": _scalar(n.args[1]),
                                  "dtype": DTYPES[val.dtype]})


def _any_dim(e, n):
    x = e.operand(n.args[0])
    attrs = {"dims": _int_list(_arg(n, 1, "dim"), "dim")}
    if _arg(n, 2, "keepdim", False):
        attrs["keepdim"] = "true"
    b = e.op("prims.convert_element_type", [x], {"dtype": "bool"})
    return e.op("aten.amax", [b], attrs)


def _select(e, n):
    x, dim, index = n.args[:3]
    dim = _static_int(dim, "dim")
    index = _static_int(index, "index")
    size = x.meta["val"].shape[dim]
    if not isinstance(size, int):
        raise Unsupported("select along a symbolic dim")
    if index < 0:
        index += size
    s = e.op("aten.slice", [e.operand(x)], {"dim": str(dim), "start": str(index),
                                           "end": str(index + 1), "step": "1"})
    return e.op("aten.squeeze", [s], {"dims": f"[{dim}]"})


class _ArangeDefault:
    """aten.arange.default(end) seen as arange.start_step(0, end, 1)."""

    def __init__(self, n):
        self.meta = n.meta
        self.args = (0, n.args[0], 1)
        self.kwargs = {}


def _arange(e, n):
    """arange with static bounds is a compile-time constant; with a
    symbolic end (positions under a dynamic sequence length) and integer
    start and step, a kiln.arange of that many elements."""
    val = n.meta["val"]
    start = _arg(n, 0, "start", 0)
    end = _arg(n, 1, "end")
    step = _arg(n, 2, "step", 1)
    if isinstance(end, (torch.SymInt, torch.fx.Node)):
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (start, step)):
            raise Unsupported("arange with symbolic bounds")
        return e.op("kiln.arange", [], {"shape": _shape_list([val.shape[0]]),
                                        "start": str(start), "step": str(step),
                                        "dtype": DTYPES[val.dtype]})
    for v in (start, end, step):
        if isinstance(v, (torch.SymInt, torch.fx.Node)):
            raise Unsupported("arange with symbolic bounds")
    count = val.shape[0]
    if not isinstance(count, int) or count > 65536:
        raise Unsupported(f"arange of {count} elements (kiln folds up to 65536)")
    values = [start + i * step for i in range(count)]
    if count == 0:
        return e.op("aten.full", [], {"shape": "[0]", "value": "0",
                                      "dtype": DTYPES[val.dtype]})
    return e.op("kiln.constant", [], {"value": "[" + ", ".join(_scalar(v) for v in values) + "]"})


# Above this many bytes of scores, attention that kiln's fused kernel does
# not take stays PyTorch's flash kernel: kiln's op-by-op form writes the
# [B*H, L, S] scores and the probabilities (twice this), which at long
# sequence lengths is more memory than the machine has (32 heads of 16K
# x 16K: 32 GiB each).
_SDPA_SCORES_BYTES = 1 << 30


@functools.lru_cache(maxsize=1)
def _avx512f_host() -> bool:
    """Whether this CPU has AVX-512F (Linux: /proc/cpuinfo), as libkiln's
    microkernels need."""
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and " avx512f" in line for line in f)
    except OSError:
        return False


def _fused_attention_takes(qv, kv, vv, S, Ev, E) -> bool:
    """Whether lowering/ops/attention.c's kernel takes this attention (its
    conditions, checked again here): f32 on an AVX-512 CPU with the f32
    microkernels and the fused kernel on, Ev a multiple of 16 up to 4096, E
    up to 4096, and S up to 8192 once rounded up to 16 (_sdpa_cpu pads the
    keys) or symbolic (masked at run time). It keeps its scores in cache."""
    return (all(t.dtype == torch.float32 for t in (qv, kv, vv)) and _avx512f_host() and
            os.environ.get("KILN_F32_DOT") != "0" and os.environ.get("KILN_ATTENTION") != "0"
            and (isinstance(S, torch.SymInt) or 16 <= _keys16(S) <= 8192)
            and Ev % 16 == 0 and 16 <= Ev <= 4096 and E <= 4096)


def _keys16(S: int) -> int:
    """A static key count rounded up to whole vectors of 16: the fused
    kernel's keys. _sdpa_cpu pads K and V with zero keys up to it and
    masks them out (-inf)."""
    return (S + 15) // 16 * 16


def _mask_fuses(mv, scores) -> bool:
    """Whether the fused kernel takes additive mask `mv` over the [B, H, L,
    S] scores under symbolic sizes (lowering/ops/attention.c, chain
    detection): f32, each size 1 or the scores' own (the same symbol). (A
    symbolic batch is the scores' outermost dim and the heads are static,
    so masks per batch and per head are both taken.)"""
    if mv.dtype != torch.float32 or not 1 <= mv.dim() <= 4:
        return False
    for i, d in enumerate(mv.shape):
        want = scores[4 - mv.dim() + i]
        if isinstance(d, int) and d == 1:
            continue
        if str(d) != str(want):
            return False
    return True


def _sdpa_cpu(e, n):
    """PyTorch's CPU flash attention (the op its SDPA dispatches to, kept
    whole by kiln's decomposition table) as kiln ops: softmax(q k^T * scale
    [+ mask]) @ v over [B*H]-batched matmuls, so attention joins the
    partition around it instead of splitting it in two (the bench's
    transformer layer, inference: 6.87 -> 6.19 ms, one process, alternating).

    Only where the row logsumexp is unused (inference): a training forward
    saves it for PyTorch's flash backward, and there kiln's form (the
    softmax written out so its max and sum give the logsumexp) made the
    bench's GPT step slower (6.49 against 6.28 ms). Training attention
    without a mask reaches kiln in its math form instead (matmuls and a
    softmax, backend._hook_attention), so what stays here is a masked or
    dropout training call. On CUDA PyTorch's flash kernels stay."""
    q, k, v = n.args[:3]
    dropout = _arg(n, 3, "dropout_p", 0.0)
    causal = _arg(n, 4, "is_causal", False)
    mask = n.kwargs.get("attn_mask")
    scale = n.kwargs.get("scale")
    out_val = n.meta["val"][0]
    if out_val.device.type != "cpu":
        raise Unsupported("attention on CUDA runs in PyTorch's flash kernels")
    if any(u.target is operator.getitem and u.args[1] == 1 for u in n.users):
        raise Unsupported("its logsumexp is used (a training forward): PyTorch's "
                          "flash forward pairs with its flash backward")
    if dropout:
        raise Unsupported(f"dropout_p = {dropout} (kiln takes 0)")
    qv, kv, vv = (a.meta["val"] for a in (q, k, v))
    if not (qv.dim() == kv.dim() == vv.dim() == 4):
        raise Unsupported(f"q, k, v of ranks {qv.dim()}, {kv.dim()}, {vv.dim()}; "
                          "expected [B, H, L, E] each")
    # The batch and the lengths may be symbolic (Dynamo's dynamic shapes:
    # "s0"); heads and head sizes are static.
    def size(d, what):
        if isinstance(d, torch.SymInt):
            _dim(d)
            return d
        return _static_int(d, what)
    B, L = size(qv.shape[0], "an attention size"), size(qv.shape[2], "an attention size")
    H, E = (_static_int(d, "an attention size") for d in (qv.shape[1], qv.shape[3]))
    S, Ev = size(kv.shape[2], "key length"), _static_int(vv.shape[3], "value size")
    symbolic = not all(isinstance(d, int) for d in (B, L, S))
    if vv.shape[2] is not kv.shape[2] and str(vv.shape[2]) != str(kv.shape[2]):
        # (Inputs of their own: Dynamo gives each length its own symbol.)
        raise Unsupported(f"key length {kv.shape[2]} and value length {vv.shape[2]} "
                          "are different sizes to kiln")
    # Grouped-query attention (SDPA's enable_gqa: fewer key and value heads,
    # each serving H / Hkv query heads in turn, as repeat_interleave over
    # heads gives them) as keys and values expanded over the heads.
    Hkv = _static_int(kv.shape[1], "key heads")
    if Hkv != H and (H % Hkv or vv.shape[1] != Hkv):
        raise Unsupported(f"{H} query heads over {Hkv} key and {vv.shape[1]} value heads")
    fused = _fused_attention_takes(qv, kv, vv, S, Ev, E)
    if (fused and isinstance(S, int) and S % 16 and mask is not None and
            mask.meta["val"].dtype != torch.float32):
        fused = False  # (the key padding below pads f32 masks only)
    if qv.dtype in (torch.bfloat16, torch.float16) and not fused:
        # Op by op (batched matmuls off kiln's bf16 microkernels, the scores
        # written out) it ran 1.7-5.5x slower than PyTorch's flash kernel
        # (AMX for bf16) at every size measured, 2 x 16 heads of 256 x 64
        # bf16: 3.35 against 0.91 ms.
        raise Unsupported(f"{DTYPES[qv.dtype]} attention: kiln's fused kernel takes "
                          "f32; PyTorch's flash kernel is faster than kiln's op-by-op form")
    if symbolic and (not fused or (mask is not None and
                                   not _mask_fuses(mask.meta["val"], [B, H, L, S]))):
        raise Unsupported("symbolic sizes: kiln's fused attention kernel does not "
                          "take this call, and its scores' size has no bound")
    score_bytes = (H * qv.element_size() if symbolic else B * H * L * S * qv.element_size())
    if score_bytes > _SDPA_SCORES_BYTES and not fused:
        raise Unsupported(f"its [{B * H}, {L}, {S}] scores ({score_bytes >> 20} MiB) would be "
                          "written out: kiln's fused attention kernel does not take this "
                          "call, PyTorch's flash kernel never writes them")
    if scale is None:
        scale = 1.0 / math.sqrt(E)
    bh = B * H

    def view(x, shape):
        return e.op("aten.view", [x], {"shape": _shape_list(shape)})

    def heads(x, D):  # [B, Hkv, S, D] as [B * H, S, D]
        if Hkv == H:
            return view(x, [bh, S, D])
        g = e.op("aten.expand", [view(x, [B, Hkv, 1, S, D])],
                 {"shape": _shape_list([B, Hkv, H // Hkv, S, D])})
        return e.op("aten.reshape", [g], {"shape": _shape_list([bh, S, D])})

    kh, vh = heads(e.operand(k), E), heads(e.operand(v), Ev)
    # A static S that is not whole vectors of 16 keys (a ViT's 197 tokens):
    # for the fused kernel, K and V padded with zero keys up to S16 and the
    # padded keys' scores made -inf by an additive mask [S16] (the user's
    # mask padded with -inf where it has S keys), so they weigh 0. Op by op
    # the scores' rows of 197 ran one lane at a time.
    S16 = _keys16(S) if isinstance(S, int) else S
    key_mask = None
    if fused and S16 != S:
        pad = S16 - S

        def full(shape, value):
            return e.op("aten.full", [], {"shape": _shape_list(shape), "value": _scalar(value),
                                          "dtype": "f32"})
        kh = e.op("aten.cat", [kh, full([bh, pad, E], 0.0)], {"dim": "1"})
        vh = e.op("aten.cat", [vh, full([bh, pad, Ev], 0.0)], {"dim": "1"})
        key_mask = e.op("aten.cat", [full([S], 0.0), full([pad], float("-inf"))], {"dim": "0"})
        if mask is not None and mask.meta["val"].shape[-1] == S:
            mv = mask.meta["val"]
            key_mask = e.op("aten.cat", [e.operand(mask),
                                         full(list(mv.shape[:-1]) + [pad], float("-inf"))],
                            {"dim": str(mv.dim() - 1)})
        elif mask is not None:  # one column, broadcast over the keys
            key_mask = e.op("aten.add", [e.operand(mask), key_mask])
        S = S16
    kt = e.op("aten.transpose", [kh], {"dim0": "1", "dim1": "2"})
    s = e.op("aten.bmm", [view(e.operand(q), [bh, L, E]), kt])
    s = e.op("aten.mul", [s, _scalar(float(scale))])
    if mask is not None or causal or key_mask is not None:
        s4 = view(s, [B, H, L, S])
        if key_mask is not None:
            s4 = e.op("aten.add", [s4, key_mask])
        elif mask is not None:
            s4 = e.op("aten.add", [s4, e.operand(mask)])
        if causal and not (isinstance(L, int) and isinstance(S, int)):
            # A symbolic length: the positions as kiln.arange.
            rows = e.op("kiln.arange", [], {"shape": _shape_list([L])})
            cols = e.op("kiln.arange", [], {"shape": _shape_list([S])})
            keep = e.op("aten.ge", [view(rows, [L, 1]), cols])
            s4 = e.op("aten.where", [keep, s4, "-inf"])
        elif causal:  # top-left aligned: query i sees keys j <= i
            if max(L, S) > 65536:
                raise Unsupported(f"a causal mask over {L}x{S} positions (kiln folds "
                                  "position constants up to 65536)")
            rows = e.op("kiln.constant", [], {"value": "[" + ", ".join(map(str, range(L))) + "]"})
            e.lines[-1] += f" : i64[{L}]"
            cols = e.op("kiln.constant", [], {"value": "[" + ", ".join(map(str, range(S))) + "]"})
            e.lines[-1] += f" : i64[{S}]"
            keep = e.op("aten.ge", [view(rows, [L, 1]), cols])
            s4 = e.op("aten.where", [keep, s4, "-inf"])
        s = view(s4, [bh, L, S])
    p = e.op("aten._softmax", [s], {"dim": "-1", "half_to_float": "false"})
    if mask is not None and not fused:
        # A row whose every key is masked: PyTorch's SDPA gives 0 there,
        # softmax NaN (the fused kernel does as SDPA does).
        dead = e.op("aten.eq", [e.op("aten.amax", [s], {"dims": "[-1]", "keepdim": "true"}),
                                "-inf"])
        p = e.op("aten.where", [dead, "0.0", p])
    o = view(e.op("aten.bmm", [p, vh]), [B, H, L, Ev])
    e.lines[-1] += " : " + tensor_type(out_val)
    return [o, None]


_sdpa_cpu.own_types = True


# --- foreach ops: one kiln op chain per list element ------------------------
#
# torch.optim's foreach implementations (default on CUDA, foreach=True on
# the CPU) apply each step to lists of tensors. kiln has no list values: an
# op over N tensors becomes N chains of ops, one per element, and getitem
# picks one. Fusion and the lowering treat them as the independent
# elementwise ops they are.

def _elements(n, i):
    """Argument i of each list element: list arguments indexed, others kept."""
    return [a[i] if isinstance(a, (list, tuple)) else a for a in n.args]


def _foreach(body):
    def tr(e, n):
        vals = n.meta["val"]
        names = []
        for i, v in enumerate(vals):
            names.append(body(e, n, _elements(n, i), i))
            e.lines[-1] += " : " + tensor_type(v)
        return names
    tr.own_types = True
    return tr


def _fe_binary(kop):
    def body(e, n, args, i):
        alpha = n.kwargs.get("alpha", 1)
        attrs = {"alpha": _scalar(alpha)} if alpha != 1 else None
        return e.op(kop, [e.operand(args[0]), e.operand(args[1])], attrs)
    return _foreach(body)


def _fe_unary(kop):
    return _foreach(lambda e, n, args, i: e.op(kop, [e.operand(args[0])]))


def _fe_addc(kop):
    """addcmul / addcdiv: self + value * (t1 op t2). The .Tensor overload's
    values are one 1-D tensor, an element per list entry (compiled Adam's
    stacked step sizes)."""
    def body(e, n, args, i):
        value = args[3] if len(args) > 3 else n.kwargs.get("value", 1)
        q = e.op(kop, [e.operand(args[1]), e.operand(args[2])])
        if isinstance(value, torch.fx.Node):
            value = e.op("aten.squeeze", [e.op("aten.slice", [e.operand(value)], {
                "dim": "0", "start": str(i), "end": str(i + 1), "step": "1"})],
                {"dims": "[0]"})
            q = e.op("aten.mul", [q, value])
        elif value != 1:
            q = e.op("aten.mul", [q, e.operand(value)])
        return e.op("aten.add", [e.operand(args[0]), q])
    return _foreach(body)


def _fe_lerp(e, n, args, i):
    """self + weight * (end - self)."""
    d = e.op("aten.sub", [e.operand(args[1]), e.operand(args[0])])
    w = e.op("aten.mul", [d, e.operand(args[2])])
    return e.op("aten.add", [e.operand(args[0]), w])


def _fe_copy(e, n, args, i):
    return _copy_value(e, args[0].meta["val"], args[1])


TRANSLATORS = {
    aten.arange.start_step: _arange,
    aten.arange.default: lambda e, n: _arange(e, _ArangeDefault(n)),
    aten.clamp.default: _clamp,
    aten.clamp.Tensor: _clamp,
    aten.clamp_min.default: lambda e, n: _clamp_to(e, n, n.args[1], None),
    aten.clamp_max.default: lambda e, n: _clamp_to(e, n, None, n.args[1]),
    aten.hardtanh.default: _hardtanh,
    aten.leaky_relu.default: _leaky_relu,
    aten.elu.default: _elu,
    aten.log1p.default: _log1p,
    aten.bitwise_and.Tensor: _bool_only("aten.logical_and"),
    aten.bitwise_or.Tensor: _bool_only("aten.logical_or"),
    aten.bitwise_xor.Tensor: _bool_only("aten.logical_xor"),
    aten.bitwise_not.default: _bool_only("aten.logical_not"),
    aten.full_like.default: _full_like,
    aten.any.dim: _any_dim,
    aten.select.int: _select,
    aten.copy.default: _copy,
    aten._native_batch_norm_legit_no_training.default: _batch_norm_inference,
    aten.max_pool2d_with_indices.default: _max_pool2d,
    aten.max_pool2d.default: _max_pool2d,
    aten.copy_.default: _copy_,
    aten.reciprocal.default: lambda e, n: e.op("aten.div", ["1.0", e.operand(n.args[0])]),
    prims.fma.default: lambda e, n: e.op("aten.add", [
        e.op("aten.mul", [e.operand(n.args[0]), e.operand(n.args[1])]),
        e.operand(n.args[2])]),
    aten.pow.Scalar: _binary("aten.pow"),
    aten.neg.default: _unary("aten.neg"),
    aten.abs.default: _unary("aten.abs"),
    aten.relu.default: _unary("aten.relu"),
    aten.clone.default: _unary("aten.clone"),
    aten.alias.default: _unary("aten.clone"),
    aten.exp.default: _unary("aten.exp"),
    aten.log.default: _unary("aten.log"),
    aten.sqrt.default: _unary("aten.sqrt"),
    aten.rsqrt.default: _unary("aten.rsqrt"),
    aten.tanh.default: _unary("aten.tanh"),
    aten.sigmoid.default: _unary("aten.sigmoid"),
    aten.erf.default: _unary("aten.erf"),
    aten.sin.default: _unary("aten.sin"),
    aten.cos.default: _unary("aten.cos"),
    aten.logical_not.default: _unary("aten.logical_not"),
    aten.gelu.default: _gelu,
    aten.add.Tensor: _binary("aten.add"),
    aten.add.Scalar: _binary("aten.add"),
    aten.sub.Tensor: _binary("aten.sub"),
    aten.sub.Scalar: _binary("aten.sub"),
    aten.rsub.Scalar: lambda e, n: e.op("aten.sub", [e.operand(n.args[1]), e.operand(n.args[0])]),
    aten.mul.Tensor: _binary("aten.mul"),
    aten.mul.Scalar: _binary("aten.mul"),
    aten.div.Tensor: _binary("aten.div"),
    aten.div.Scalar: _binary("aten.div"),
    aten.div.Tensor_mode: _div_mode,
    aten.pow.Tensor_Scalar: _binary("aten.pow"),
    aten.pow.Tensor_Tensor: _binary("aten.pow"),
    aten.maximum.default: _binary("aten.maximum"),
    aten.minimum.default: _binary("aten.minimum"),
    aten.where.self: _where,
    prims.convert_element_type.default: _convert,
    aten._to_copy.default: _to_copy,
    aten.sum.dim_IntList: _reduce("aten.sum"),
    aten.sum.default: _reduce("aten.sum", dims_index=None, has_keepdim=False),
    aten.mean.dim: _reduce("aten.mean"),
    aten.mean.default: _reduce("aten.mean", dims_index=None, has_keepdim=False),
    aten.amax.default: _reduce("aten.amax"),
    aten.amin.default: _reduce("aten.amin"),
    aten.prod.dim_int: _reduce("aten.prod"),
    aten.prod.default: _reduce("aten.prod", dims_index=None, has_keepdim=False),
    aten.var.correction: _var,
    aten.var_mean.correction: _var_mean,
    aten.as_strided.default: _as_strided,
    aten.mm.default: lambda e, n: e.op("aten.mm", [e.operand(a) for a in n.args[:2]]),
    aten.bmm.default: lambda e, n: e.op("aten.bmm", [e.operand(a) for a in n.args[:2]]),
    aten.addmm.default: _addmm,
    aten.convolution.default: _conv,
    aten.permute.default: _permute,
    aten.t.default: _t,
    aten.transpose.int: _transpose,
    aten.view.default: _view,
    aten._unsafe_view.default: _view,
    aten.reshape.default: _view,
    aten.expand.default: _expand,
    aten.squeeze.dims: _squeeze,
    aten.squeeze.dim: _squeeze,
    aten.squeeze.default: _squeeze,
    aten.unsqueeze.default: _unsqueeze,
    aten.slice.Tensor: _slice,
    aten.split.Tensor: _split,
    aten.split_with_sizes.default: _split,
    aten.cat.default: _cat,
    aten.full.default: _full,
    aten.scalar_tensor.default: _scalar_tensor,
    aten._softmax.default: _softmax("aten._softmax"),
    aten._log_softmax.default: _softmax("aten._log_softmax"),
    aten.native_layer_norm.default: _layer_norm,
    aten.native_layer_norm_backward.default: _layer_norm_backward,
    aten._scaled_dot_product_flash_attention_for_cpu.default: _sdpa_cpu,
    aten.embedding.default: _embedding,
    aten.index_put.default: _index_put,
    aten.index.Tensor: _index,
    aten._unsafe_index.Tensor: _index,
    aten.threshold_backward.default: _threshold_backward,
    aten._softmax_backward_data.default: _softmax_backward,
    aten._log_softmax_backward_data.default: _log_softmax_backward,
    aten.sigmoid_backward.default: _sigmoid_backward,
    aten.tanh_backward.default: _tanh_backward,
}
for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    for _ovl in ("Tensor", "Scalar"):
        TRANSLATORS[getattr(getattr(aten, _name), _ovl)] = _binary(f"aten.{_name}")
for _name in ("logical_and", "logical_or", "logical_xor"):
    TRANSLATORS[getattr(aten, _name).default] = _binary(f"aten.{_name}")
for _name, _kop in (("add", "aten.add"), ("sub", "aten.sub"), ("mul", "aten.mul"),
                    ("div", "aten.div"), ("maximum", "aten.maximum"),
                    ("minimum", "aten.minimum"), ("pow", "aten.pow"),
                    ("clamp_min", "aten.maximum"), ("clamp_max", "aten.minimum")):
    for _ovl in ("Scalar", "List", "Tensor", "ScalarList", "ScalarAndTensor", "default"):
        _op = getattr(getattr(aten, f"_foreach_{_name}"), _ovl, None)
        if _op is not None:
            TRANSLATORS[_op] = _fe_binary(_kop)
for _name in ("neg", "abs", "sqrt", "rsqrt", "exp", "log", "sigmoid", "tanh"):
    TRANSLATORS[getattr(aten, f"_foreach_{_name}").default] = _fe_unary(f"aten.{_name}")
TRANSLATORS[aten._foreach_reciprocal.default] = _foreach(
    lambda e, n, args, i: e.op("aten.div", ["1.0", e.operand(args[0])]))
for _name, _kop in (("addcmul", "aten.mul"), ("addcdiv", "aten.div")):
    for _ovl in ("Scalar", "ScalarList", "Tensor"):
        _op = getattr(getattr(aten, f"_foreach_{_name}"), _ovl, None)
        if _op is not None:
            TRANSLATORS[_op] = _fe_addc(_kop)
for _ovl in ("Scalar", "List", "ScalarList"):
    _op = getattr(aten._foreach_lerp, _ovl, None)
    if _op is not None:
        TRANSLATORS[_op] = _foreach(_fe_lerp)
TRANSLATORS[aten._foreach_copy.default] = _foreach(_fe_copy)


def _result_types(node) -> list[str]:
    val = node.meta.get("val")
    if isinstance(val, (tuple, list)):
        return [tensor_type(v) for v in val]
    return [tensor_type(val)]


def _one_element(v) -> bool:
    """A static tensor of one element (rank 0, or every dim 1)."""
    return all(isinstance(d, int) and d == 1 for d in v.shape)


# Ops translated to several kiln values (a list), read through getitem.
_MULTI_RESULT = (aten.native_layer_norm.default, aten.native_layer_norm_backward.default,
                 aten._native_batch_norm_legit_no_training.default,
                 aten.var_mean.correction, aten.max_pool2d_with_indices.default)


def support_reason(node) -> str | None:
    """None when kiln takes `node`, else why not."""
    if node.op != "call_function":
        return f"{node.op} node"
    if node.target is operator.getitem:
        src = node.args[0]
        if isinstance(src, torch.fx.Node) and (
                src.target in _MULTI_RESULT or
                getattr(TRANSLATORS.get(src.target), "own_types", False)):
            return support_reason(src)
        return "getitem of a node kiln does not produce"
    tr = TRANSLATORS.get(node.target)
    if tr is None:
        return f"no kiln lowering for {node.target}"
    val = node.meta.get("val")
    vals = val if isinstance(val, (tuple, list)) else [val]
    if vals and all(isinstance(v, torch.Tensor) and v.device.type == "cuda" and
                    _one_element(v) for v in vals) and any(
            isinstance(a.meta.get("val"), torch.Tensor) and not _one_element(a.meta["val"])
            for a in node.all_input_nodes):
        # A reduction to one element (a loss; keepdim leaves [1, 1]) on
        # CUDA: kiln's CUDA programs are kernel launches, and a whole-tensor
        # reduction into one value lowers to a loop on the host. Rank-0 ops
        # of rank-0 operands (an optimizer's step counts and bias
        # corrections) are one-thread kernels (lowering/gpu.c).
        return "a reduction to one element on CUDA"
    try:
        _result_types(node)
        for a in node.all_input_nodes:
            if isinstance(a.meta.get("val"), torch.Tensor):
                tensor_type(a.meta["val"])
            elif isinstance(a.meta.get("val"), torch.SymInt):
                _dim(a)  # a size (a view's): kiln reads its expression
            elif a.target not in _MULTI_RESULT:
                return f"operand {a.name} is not a tensor"
        # Dry run: translate with placeholder names for the operands (sizes
        # have none: only a view's 'shape' may name them, by expression).
        e = Emitter()
        for a in node.all_input_nodes:
            if not isinstance(a.meta.get("val"), torch.SymInt):
                e.names[a] = f"%{a.name}"
        tr(e, node)
    except Unsupported as ex:
        return str(ex)
    except (KeyError, TypeError, IndexError, AttributeError, ValueError) as ex:
        return f"cannot translate: {type(ex).__name__}: {ex}"
    return None


def is_size_input(n) -> bool:
    """A placeholder that holds a size (a SymInt Dynamo passes beside the
    tensors): the graph kiln compiles does not take it, since kiln binds
    every symbol from its tensor inputs' sizes."""
    return n.op == "placeholder" and isinstance(n.meta.get("val"), (torch.SymInt, int)) \
        and not isinstance(n.meta.get("val"), bool)


class Translation:
    """kiln text for a partition and how its call maps to the FX outputs.

    `out_nodes`: the FX output nodes, in order. `graph_outputs[k]`: which
    kiln output feeds FX output k, or None when FX output k is an input or
    a view of one: `out_inputs[k]` names that input (a written input, a
    copy_ node, or a chain of views), `out_alias_views[k]` the view (shape,
    stride, storage offset relative to the input's) or None for the input
    as it is. `perms`: per kiln output, the permutation it was written in,
    or None. `written`: the inputs kiln writes in place. `in_perms`: per
    input, the permutation of its dims that kiln's graph declares it in
    (its memory order), or None.
    """

    def __init__(self, text, out_nodes, graph_outputs, out_inputs, perms, written,
                 in_perms, out_alias_views):
        self.text, self.out_nodes = text, out_nodes
        self.graph_outputs, self.out_inputs = graph_outputs, out_inputs
        self.perms, self.written = perms, written
        self.in_perms = in_perms
        self.out_alias_views = out_alias_views


def translate(gm: torch.fx.GraphModule, name: str = "graph",
              written_later=frozenset()) -> Translation:
    """kiln text for a GraphModule of supported nodes. copy_ into a
    partition input becomes `return %v -> %input`: kiln writes the input in
    place. `written_later`: indices of inputs written after the partition
    (by PyTorch): no output is returned as a view of them."""
    e = Emitter()
    inputs = []
    in_perms = []
    out_nodes = []
    index_of = {}
    copies = []  # (kiln value, input index)
    written = {n.args[0] for n in gm.graph.nodes
               if n.op == "call_function" and n.target is aten.copy_.default}
    for n in gm.graph.nodes:
        if n.op == "placeholder" and is_size_input(n):
            continue  # a SymInt: kiln binds its symbol from the tensors' sizes
        if n.op == "placeholder":
            kname = f"%in{len(inputs)}"
            index_of[n] = len(inputs)
            val = n.meta["val"]
            ty = tensor_type(val)
            # CUDA kernels read contiguous inputs: an input PyTorch passes as
            # a permuted dense view (a transposed activation saved for the
            # backward) is declared in its memory order and permuted back in
            # the graph, so the caller passes its buffer as it is instead of
            # a contiguous copy made on every call. (The CPU target reads
            # strided inputs directly.)
            perm = (output_permutation(val)
                    if val.device.type == "cuda" and n not in written else None)
            in_perms.append(perm)
            if perm is None:
                e.names[n] = kname
                inputs.append(f"{kname}: {ty}")
            else:
                phys = f"{DTYPES[val.dtype]}[{','.join(str(val.shape[d]) for d in perm)}]"
                inputs.append(f"{kname}: {phys}")
                inverse = [perm.index(d) for d in range(len(perm))]
                e.names[n] = e.op("aten.permute", [kname], {"dims": str(inverse)})
                e.lines[-1] += " : " + ty
        elif n.op == "call_function":
            if n.target is operator.getitem:
                e.names[n] = e.names[n.args[0]][n.args[1]]
                continue
            reason = None if n.target in TRANSLATORS else f"no lowering for {n.target}"
            if reason:
                raise Unsupported(reason)
            tr = TRANSLATORS[n.target]
            res = tr(e, n)
            # Annotate the last statement with PyTorch's types: kiln's verifier
            # then checks that both agree (translators of several results
            # computed by several ops, foreach ops and SDPA, annotate each).
            if not getattr(tr, "own_types", False):
                types = _result_types(n)
                if isinstance(res, list) and None in res:
                    types = types[:1]  # results kiln does not compute
                e.lines[-1] += " : " + ", ".join(types)
            e.names[n] = res
            if n.target is aten.copy_.default:
                if any(k == index_of[n.args[0]] for _, k in copies):
                    raise Unsupported(f"input {n.args[0].name} copied into twice")
                copies.append((res, index_of[n.args[0]]))
        elif n.op == "output":
            outs = n.args[0]
            out_nodes = list(outs) if isinstance(outs, (tuple, list)) else [outs]
        else:
            raise Unsupported(f"{n.op} node {n.name}")
    # One device per compiled graph (cpu, or cuda:0).
    devices = {n.meta["val"].device.type for n in gm.graph.nodes
               if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.Tensor)}
    devices |= {o.meta["val"].device.type for o in out_nodes
                if isinstance(o, torch.fx.Node) and isinstance(o.meta.get("val"), torch.Tensor)}
    if len(devices) > 1:
        raise Unsupported(f"tensors on {sorted(devices)} in one partition")
    rets, graph_outputs, out_inputs, ret_nodes = [], [], [], []
    out_views = {}  # graph output -> the view of an input (see _input_alias)
    for o in out_nodes:
        if isinstance(o, torch.fx.Node) and o.target is aten.copy_.default:
            # copy_ returns its destination: the written input itself.
            graph_outputs.append(None)
            out_inputs.append(index_of[o.args[0]])
            continue
        alias = _input_alias(o, written)
        if alias is not None and index_of[alias[0]] in written_later:
            alias = None
        if alias is not None:
            # A chain of views of an input (a transposed weight saved for the
            # backward): the caller makes the same view of the input, not a
            # copy kiln writes (and, strided, PyTorch copies again).
            graph_outputs.append(None)
            out_inputs.append(index_of[alias[0]])
            out_views[len(graph_outputs) - 1] = alias[1]
            continue
        graph_outputs.append(len(rets))
        out_inputs.append(None)
        rets.append(e.operand(o))
        ret_nodes.append(o)
    # Outputs PyTorch traced as permuted views (a transposed weight saved for
    # the backward, heads split off a batch-first projection) are written by
    # kiln in their memory order, and the caller views them back: no copy.
    # Not on the CUDA target: there the permute often cancels into a view
    # of a slice, and its launcher takes whole buffers only.
    perms = [output_permutation(o.meta.get("val"))
             if isinstance(o, torch.fx.Node) and "cuda" not in devices else None
             for o in ret_nodes]
    for k, perm in enumerate(perms):
        if perm is not None:
            rets[k] = e.op("aten.permute", [rets[k]], {"dims": str(perm)})
    rets += [f"{v} -> %in{k}" for v, k in copies]
    if not rets:
        raise Unsupported("partition computes nothing kiln returns")
    safe = re.sub(r"[^A-Za-z0-9_]", "_", name)
    text = (f"graph @{safe}({', '.join(inputs)}) {{\n" + "\n".join(e.lines) +
            f"\n  return {', '.join(rets)}\n}}\n")
    return Translation(text, out_nodes, graph_outputs, out_inputs, perms,
                       [k for _, k in copies], in_perms,
                       [out_views.get(i) for i in range(len(graph_outputs))])


# Ops whose result is always a view of their first argument.
_VIEW_OPS = {aten.permute.default, aten.t.default, aten.transpose.int, aten.view.default,
             aten._unsafe_view.default, aten.squeeze.dims, aten.squeeze.dim,
             aten.squeeze.default, aten.unsqueeze.default, aten.alias.default}


def _input_alias(o, written):
    """(placeholder, view) when `o` is a chain of views of a placeholder that
    no copy_ writes, static, of its dtype: `view` is None when `o` has the
    placeholder's own layout, else (shape, stride, storage offset relative
    to the placeholder's, the placeholder's traced shape and stride, and the
    chain of view ops as (op, other args)): the caller takes the traced
    strides where its input has the traced layout, else replays the ops.
    Else None."""
    if not isinstance(o, torch.fx.Node):
        return None
    n, chain = o, []
    while n.op == "call_function" and n.target in _VIEW_OPS and isinstance(n.args[0], torch.fx.Node):
        if n.kwargs or any(isinstance(a, torch.fx.Node) for a in n.args[1:]):
            return None
        chain.append((n.target, tuple(n.args[1:])))
        n = n.args[0]
    if n is o or n.op != "placeholder" or n in written:
        return None
    vo, vi = o.meta.get("val"), n.meta.get("val")
    if not isinstance(vo, torch.Tensor) or not isinstance(vi, torch.Tensor):
        return None
    layout = lambda v: (list(v.shape), list(v.stride()), v.storage_offset())  # noqa: E731
    lo, li = layout(vo), layout(vi)
    static = all(isinstance(x, int) for part in lo + li
                 for x in (part if isinstance(part, list) else [part]))
    if not static or vo.dtype != vi.dtype:
        return None
    if lo == li:
        return n, None
    return n, (torch.Size(lo[0]), tuple(lo[1]), lo[2] - li[2], torch.Size(li[0]),
               tuple(li[1]), tuple(reversed(chain)))


def output_permutation(val) -> list[int] | None:
    """For a static, non-contiguous tensor whose strides are those of a dense
    tensor with permuted dims (`empty(shape[perm]).permute(inverse)` gives
    exactly `val.stride()`), the permutation `perm`; None otherwise."""
    if not isinstance(val, torch.Tensor) or val.is_contiguous():
        return None
    shape, stride = list(val.shape), list(val.stride())
    if not all(isinstance(d, int) for d in shape + stride):
        return None
    # Outermost dim first: decreasing strides, size-1 dims where PyTorch put them.
    perm = sorted(range(len(shape)), key=lambda d: (-stride[d], d))
    expect, step = [0] * len(shape), 1
    for d in reversed(perm):
        expect[d] = step
        step *= shape[d]
    return perm if expect == stride else None
