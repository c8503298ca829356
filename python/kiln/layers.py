"""Repeated layers compiled once.

A model of N identical layers (a transformer's encoder layers, a ResNet
stage's blocks) reaches the backend as one FX graph, and kiln would compile
the whole of it: every layer's code through MLIR and LLVM on its own. This
module cuts a partition at the boundaries of repeated layers, so that each
layer is a partition of its own. Layers of equal structure then translate to
equal graph texts (translate numbers values per partition), which kiln
compiles once: `_function_for` (backend.py) shares one kiln function between
them within a process, and the compile cache's entry serves later processes.

Where the layers are comes from Dynamo's `nn_module_stack` metadata (kept by
AOTAutograd on forward graphs, and as `fwd_nn_module_stack` on the backward
nodes of each forward node): a node belongs to the outermost module on its
stack that is an item of a container (`encoder.layers.3`, `features.7`) whose
items number two or more in the graph. Runs of a partition's nodes (in graph
order) with one such layer are candidate pieces; a piece is cut out only if
another piece has the same structure (ops, attributes, the types and layouts
of everything it reads) and it is big enough for a call of its own to pay.
Everything else stays together, so a partition with no repeated layer is left
as it was.

The cost is at the cuts: the value passing between layers is written to
memory (in the models measured it was anyway, as the next layer's residual
input) and each layer is one more call (about 5 us). Graph order keeps the
pieces convex: every node on a path between two nodes of a contiguous run of
a convex partition lies in that run.
"""

from __future__ import annotations

import re

import torch
from torch.fx.passes.infra.partitioner import Partition

# A piece smaller than this many nodes stays with its neighbours: its call
# would cost more than its compile saves.
MIN_NODES = 6

_ITEM = re.compile(r"^(.*)\.(\d+)$")


def _layer_paths(gm: torch.fx.GraphModule) -> dict:
    """node -> the module path of its repeated layer, or None."""
    stacks = {}
    items: dict[str, set] = {}
    for n in gm.graph.nodes:
        # A backward graph's nodes carry the forward node's stack.
        stack = n.meta.get("nn_module_stack") or n.meta.get("fwd_nn_module_stack")
        paths = [v[0] for v in stack.values()] if stack else []
        stacks[n] = paths
        for p in paths:
            m = _ITEM.match(p)
            if m:
                items.setdefault(m.group(1), set()).add(m.group(2))
    layer = {}
    for n, paths in stacks.items():
        layer[n] = None
        for p in paths:
            m = _ITEM.match(p)
            if m and len(items[m.group(1)]) >= 2:
                layer[n] = p
                break
    return layer


def _val(v):
    """What code depends on in a value: dtype, sizes, strides."""
    if isinstance(v, torch.Tensor):
        return ("T", str(v.dtype), tuple(str(d) for d in v.shape),
                tuple(str(s) for s in v.stride()), str(v.device))
    if isinstance(v, (list, tuple)):
        return tuple(_val(x) for x in v)
    return ("V", str(v))


def _signature(run: list) -> tuple:
    """The structure of a run of nodes, independent of their names."""
    local = {n: i for i, n in enumerate(run)}

    def arg(a):
        if isinstance(a, torch.fx.Node):
            if a in local:
                return ("local", local[a])
            return ("in", _val(a.meta.get("val")))
        if isinstance(a, (list, tuple)):
            return tuple(arg(x) for x in a)
        if isinstance(a, dict):
            return tuple(sorted((k, arg(x)) for k, x in a.items()))
        return ("c", repr(a))

    # Which of the run's values are read after it (its outputs) is structure
    # too: two layers alike but for one more value used later are two codes.
    return tuple((str(n.target), arg(n.args), arg(n.kwargs), _val(n.meta.get("val")),
                  any(u not in local for u in n.users))
                 for n in run)


def split_repeated(gm: torch.fx.GraphModule, partitions: list) -> list:
    """The partitions with repeated layers cut out as partitions of their
    own (see the module's docstring)."""
    layer = _layer_paths(gm)
    if not any(layer.values()):
        return partitions
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    runs_of = []  # per partition: [(layer path, [nodes])]
    counts: dict[tuple, int] = {}
    sigs = {}
    for p in partitions:
        nodes = sorted(p.nodes, key=order.__getitem__)
        runs: list = []
        for n in nodes:
            path = layer[n]
            # Nodes of no layer (the model's own forward: a ViT's class token,
            # its head) are runs of their own, never part of a layer's.
            if runs and path == runs[-1][0]:
                runs[-1][1].append(n)
            else:
                runs.append((path, [n]))
        runs_of.append(runs)
        for path, run in runs:
            if path is not None and len(run) >= MIN_NODES:
                sig = sigs[id(run)] = _signature(run)
                counts[sig] = counts.get(sig, 0) + 1
    out = []
    next_id = max((p.id or 0 for p in partitions), default=0) + 1
    for p, runs in zip(partitions, runs_of):
        pieces: list = []
        rest: list = []
        for path, run in runs:
            sig = sigs.get(id(run))
            if sig is not None and counts[sig] >= 2:
                if rest:
                    pieces.append(rest)
                    rest = []
                pieces.append(run)
            else:
                rest.extend(run)
        if rest:
            pieces.append(rest)
        if len(pieces) == 1:
            out.append(p)
            continue
        for piece in pieces:
            out.append(Partition(id=next_id, nodes=piece))
            next_id += 1
    return out
