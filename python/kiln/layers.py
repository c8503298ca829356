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
nodes of each forward node): a layer is an item of a container
(`encoder.layers.3`, `features.7`) with modules of its own, whose class
another item shares (`_layer_paths`). Runs of a partition's nodes (in
graph order) within one such layer are candidate pieces; a piece is cut out
only if another piece has the same structure (ops, attributes, the types and
layouts of everything it reads), it is big enough for a call of its own to
pay, and its inputs' sizes determine its symbolic sizes. The outermost
layers are tried first; one that repeats nowhere (stages of other widths) is
looked into for layers of its own (their blocks). Everything else stays
together, so a partition with no repeated layer is left as it was.

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


def _stack(n) -> list:
    """(path, class) of the modules a node ran in, outermost first. A
    backward graph's nodes carry their forward node's stack."""
    stack = n.meta.get("nn_module_stack") or n.meta.get("fwd_nn_module_stack")
    return [(v[0], str(v[1])) for v in stack.values()] if stack else []


def _layer_paths(gm: torch.fx.GraphModule) -> dict:
    """node -> the module paths of its layers, outermost first. A layer is
    an item of a container (`layers.3`, `features.7`) that has modules of
    its own (a block, not a Conv2d or a BatchNorm of a Sequential: cutting
    those apart would undo the fusions between them) and whose class
    another item of the same container has too."""
    stacks = {n: _stack(n) for n in gm.graph.nodes}
    classes: dict[str, dict] = {}  # container -> {class: item count}
    seen = set()
    composite = set()
    for paths in stacks.values():
        for k, (path, cls) in enumerate(paths):
            if k:
                composite.add(paths[k - 1][0])
            m = _ITEM.match(path)
            if m and path not in seen:
                seen.add(path)
                per = classes.setdefault(m.group(1), {})
                per[cls] = per.get(cls, 0) + 1
    layer = {}
    for n, paths in stacks.items():
        layer[n] = [path for path, cls in paths
                    if (m := _ITEM.match(path)) and path in composite
                    and classes[m.group(1)].get(cls, 0) >= 2]
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
    outside: dict = {}  # the values it reads from outside, numbered

    def arg(a):
        if isinstance(a, torch.fx.Node):
            if a in local:
                return ("local", local[a])
            # Which outside value, too: add(x, x) and add(x, y) differ.
            return ("in", outside.setdefault(a, len(outside)), _val(a.meta.get("val")))
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


def _symbols(v) -> set:
    """The size symbols in a value's sizes."""
    out = set()
    if isinstance(v, torch.Tensor):
        for d in v.shape:
            if isinstance(d, torch.SymInt):
                out |= {str(x) for x in d.node.expr.free_symbols}
    elif isinstance(v, (list, tuple)):
        for x in v:
            out |= _symbols(x)
    return out


def _bound_symbols(v) -> set:
    """The symbols kiln can read off a tensor input's sizes: a dim that is a
    symbol, or a constant times one (kiln_graph_resolve_binding solves it)."""
    out = set()
    if isinstance(v, torch.Tensor):
        for d in v.shape:
            if isinstance(d, torch.SymInt):
                free = d.node.expr.free_symbols
                if len(free) == 1:
                    out.add(str(next(iter(free))))
    return out


def _binds_its_sizes(run: list) -> bool:
    """Whether a piece's tensor inputs determine every size symbol its
    values use. A layer that reads only [s0*s1, E] and views it as [s0,
    s1, E] does not: kiln would refuse it (`not determined by the inputs'
    sizes`), where the whole partition had [s0, s1, E] among its inputs."""
    inside = set(run)
    need, have = set(), set()
    for n in run:
        need |= _symbols(n.meta.get("val"))
        for a in n.all_input_nodes:
            if a not in inside:
                have |= _bound_symbols(a.meta.get("val"))
    return need <= have


def _views_only(nodes: list) -> bool:
    """A piece of views computes nothing kiln would return: PyTorch's views
    are free, so such a piece is left out of kiln."""
    from .translate import _VIEW_OPS
    return all(n.target in _VIEW_OPS for n in nodes)


def _place_copies(pieces: list) -> None:
    """Moves each copy_ (a buffer update: a BatchNorm's running statistics)
    into the piece that reads its target, so that the piece may write it in
    place (backend.compile_graph sends a copy_ to PyTorch when another
    partition reads the old value). Where the target's readers are in more
    than one piece, or the piece is before the copied value's, it stays."""
    where = {n: k for k, piece in enumerate(pieces) for n in piece}
    for k, piece in enumerate(pieces):
        for n in [n for n in piece
                  if n.target is torch.ops.aten.copy_.default and not n.users]:
            readers = {where[u] for u in n.args[0].users if u is not n and u in where}
            src = where.get(n.args[1], -1) if len(n.args) > 1 else -1
            if len(readers) == 1:
                r = next(iter(readers))
                if r != k and src <= r:
                    piece.remove(n)
                    pieces[r].append(n)
                    where[n] = r


def _runs(nodes: list, key) -> list:
    """`nodes` (in graph order) as runs of one layer: [(path, [nodes])].
    Nodes of no layer (the model's own forward: a ViT's class token, its
    head) are runs of their own, never part of a layer's; but a few of them
    between layer runs (a backward graph's gradient sums at residual
    connections, which carry no module stack) belong to the layer around
    them, else to the layer after them: each layer then takes its own,
    alike, where as pieces of their own they were a call each."""
    runs: list = []
    for n in nodes:
        path = key(n)
        if runs and path == runs[-1][0]:
            runs[-1][1].append(n)
        else:
            runs.append((path, [n]))
    glued: list = []
    for path, run in runs:
        if glued and glued[-1][0] is None and len(glued[-1][1]) < MIN_NODES and \
                path is not None and len(glued) >= 2 and glued[-2][0] is not None:
            gap = glued.pop()[1]
            if glued[-1][0] == path:
                glued[-1][1].extend(gap + run)
                continue
            run = gap + run
        if glued and glued[-1][0] == path:
            glued[-1][1].extend(run)
        else:
            glued.append((path, run))
    return glued


def split_repeated(gm: torch.fx.GraphModule, partitions: list) -> list:
    """The partitions with repeated layers cut out as partitions of their
    own (see the module's docstring). Level by level: the outermost layers
    first; a layer that repeats nowhere (a ResNet or Swin stage, whose
    stages differ) is looked into for repeated layers of its own (the
    stage's blocks)."""
    layer = _layer_paths(gm)
    if not any(layer.values()):
        return partitions
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    # Per partition, its segments in graph order: ("todo", nodes) to split
    # at the current level, ("layer", nodes) cut out, ("rest", nodes) kept
    # with its neighbours.
    segments = [[("todo", sorted(p.nodes, key=order.__getitem__))] for p in partitions]
    depth = max(len(v) for v in layer.values())
    for level in range(depth):
        def key(n, level=level):
            return layer[n][level] if len(layer[n]) > level else None

        split = []  # per partition, per segment: its runs (None if done)
        counts: dict[tuple, int] = {}
        sigs = {}
        for segs in segments:
            split.append([_runs(nodes, key) if kind == "todo" else None
                          for kind, nodes in segs])
            for runs in split[-1]:
                for path, run in runs or ():
                    if path is not None and len(run) >= MIN_NODES and _binds_its_sizes(run):
                        sig = sigs[id(run)] = _signature(run)
                        counts[sig] = counts.get(sig, 0) + 1
        for k, segs in enumerate(segments):
            new = []
            for (kind, nodes), runs in zip(segs, split[k]):
                if runs is None:
                    new.append((kind, nodes))
                    continue
                for path, run in runs:
                    sig = sigs.get(id(run))
                    if sig is not None and counts[sig] >= 2:
                        new.append(("layer", run))
                    elif path is not None and any(len(layer[n]) > level + 1 for n in run):
                        new.append(("todo", run))  # a layer of layers: look inside
                    else:
                        new.append(("rest", run))
            segments[k] = new
    out = []
    next_id = max((p.id or 0 for p in partitions), default=0) + 1
    for p, segs in zip(partitions, segments):
        pieces: list = []
        rest: list = []
        for kind, nodes in segs:
            if kind == "layer":
                if rest:
                    pieces.append(rest)
                    rest = []
                pieces.append(list(nodes))
            else:
                rest.extend(nodes)
        if rest:
            pieces.append(rest)
        # Every piece must bind its size symbols, the leftover ones too (a
        # head reading [s0*s1, E] as [s0, s1, E]): else the partition stays
        # whole.
        if len(pieces) == 1 or not all(_binds_its_sizes(piece) for piece in pieces):
            out.append(p)
            continue
        _place_copies(pieces)
        for piece in pieces:
            if piece and not _views_only(piece):
                out.append(Partition(id=next_id, nodes=piece))
                next_id += 1
    return out
