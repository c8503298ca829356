"""Work on parameters alone, hoisted out of the per-call path.

An inference graph computes some values from parameters and buffers only: a
linear's weight transpose (kiln's GEMM reads B as [K, N] rows, a weight is
[N, K]), a weight built from several parameters (weight norm's g * v / |v|).
They are the same on every call while the parameters are. `split` moves them into a
graph of their own (the prep graph); `Prepared` runs it in PyTorch on the
first call and again only when a parameter it reads has changed, and calls
the main graph with the results, dense, as extra inputs.

A parameter counts as unchanged while the argument in its place is the same
tensor object, with the same data pointer and version counter: in-place
updates (an optimizer step, load_state_dict, `p.add_` under no_grad) bump
the counter; a new Parameter or `p.data = t` changes the object or the
pointer. Writes that bypass the counter (through `p.data.copy_`, a NumPy or
DLPack view of the memory) are not seen, as autograd does not see them (a
teacher network updated with `p.data.mul_(m)` would keep its old weights):
so the hoisting is opt-in, `options={"hoist_params": True}`, as Inductor's
freezing is. Inference tensors (made under torch.inference_mode) have no
counter: their prep graph runs on every call.

What is hoisted: ops whose every input is a parameter, a buffer or another
hoisted op; never mutating or random ops, never an op whose result has more
elements than its inputs (an expand of a bias to the batch would be
materialized). Memory: one copy of every prepared value that is not a view
of its parameter (a transposed weight), kept for the compiled function's
lifetime.
"""

from __future__ import annotations

import operator
import weakref

import torch

# Prep graphs run (first calls and changed parameters), for tests and logs.
PREP_RUNS = 0


def static_input_indices() -> list[int]:
    """Positions of the graph inputs that are parameters or buffers, as
    AOTAutograd recorded them for the graph being compiled (Dynamo marks
    them static); [] outside a torch.compile."""
    ctx = torch._guards.TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None) if ctx is not None else None
    return list(getattr(meta, "static_input_indices", None) or ())


def _static_shape(val) -> bool:
    return isinstance(val, torch.Tensor) and all(isinstance(d, int) for d in val.shape)


def _numel(val) -> int:
    if isinstance(val, torch.Tensor):
        return val.numel()
    if isinstance(val, (tuple, list)):
        return sum(_numel(v) for v in val)
    return 0


def _mutable(node) -> bool:
    t = node.target
    return isinstance(t, torch._ops.OpOverload) and t._schema.is_mutable


def _hoistable(node, hoisted: set) -> bool:
    """Whether `node` computes from parameters and hoisted values alone."""
    if node.op != "call_function":
        return False
    inputs = node.all_input_nodes
    if not inputs or any(i not in hoisted for i in inputs):
        return False
    val = node.meta.get("val")
    if node.target is operator.getitem:
        return _static_shape(val)
    t = node.target
    if not isinstance(t, torch._ops.OpOverload) or t._schema.is_mutable:
        return False
    if torch.Tag.nondeterministic_seeded in t.tags:
        return False
    vals = val if isinstance(val, (tuple, list)) else (val,)
    if not vals or not all(_static_shape(v) for v in vals):
        return False
    return _numel(val) <= sum(_numel(i.meta.get("val")) for i in inputs)


class Split:
    """`main`: the graph with the hoisted values as inputs after its own;
    `prep`: a graph from the parameters at `positions` to those values."""

    def __init__(self, main, prep, positions):
        self.main, self.prep, self.positions = main, prep, positions


def split(gm: torch.fx.GraphModule, static: list[int]) -> Split | None:
    """Moves what `gm` computes from its inputs at `static` alone into a
    prep graph; None where nothing would move. `gm` is rewritten in place
    into the main graph."""
    graph = gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    params = {placeholders[i] for i in static if i < len(placeholders)}
    # A parameter written by the graph (a buffer update) changes under the
    # prep graph's feet: what reads it stays in the main graph.
    params = {p for p in params if _static_shape(p.meta.get("val"))
              and not any(_mutable(u) for u in p.users)}
    hoisted = set(params)
    order = []
    for n in graph.nodes:
        if _hoistable(n, hoisted):
            hoisted.add(n)
            order.append(n)
    frontier = [n for n in order
                if any(u not in hoisted and u.op != "output" for u in n.users)]
    if not frontier:
        return None
    if any(isinstance(n.meta.get("val"), (tuple, list)) for n in frontier):
        return None  # a multi-result op used whole: nothing to pass as one tensor
    # The prep graph: the parameters it reads, the hoisted ops, the frontier.
    prep_graph = torch.fx.Graph()
    env = {}
    used = [p for p in placeholders if p in params and any(u in hoisted for u in p.users)]
    for p in used:
        env[p] = prep_graph.placeholder(p.name)
        env[p].meta = dict(p.meta)
    for n in order:
        env[n] = prep_graph.node_copy(n, lambda a: env[a])
    prep_graph.output(tuple(env[n] for n in frontier))
    prep_graph.eliminate_dead_code()  # what only the main graph's results need
    prep = torch.fx.GraphModule(gm, prep_graph)
    # The main graph: a dense input per frontier value, after the others.
    last = placeholders[-1]
    for k, n in enumerate(frontier):
        with graph.inserting_after(last):
            ph = graph.placeholder(f"hoisted_{k}")
        val = n.meta["val"]
        with val.fake_mode:
            ph.meta["val"] = torch.empty(val.shape, dtype=val.dtype, device=val.device)
        # A value the graph also returns stays computed there: handing out
        # the cached tensor would share it between calls (an in-place
        # edit of one result would change the next call's).
        n.replace_all_uses_with(ph, delete_user_cb=lambda u: u.op != "output")
        last = ph
    for n in reversed(order):
        if not n.users:
            graph.erase_node(n)
    graph.lint()
    gm.recompile()
    return Split(gm, prep, [placeholders.index(p) for p in used])


class Prepared:
    """Calls `main` with the inputs and the prep graph's values: computed on
    the first call, recomputed when a parameter they come from changed."""

    def __init__(self, sp: Split, main, note=None):
        self.prep, self.positions, self.main = sp.prep, sp.positions, main
        self.note = note
        self._state = None  # ((position, weakref, version, data pointer)...), values

    def _values(self, args):
        state = self._state
        if state is not None:
            checks, values = state
            for k, ref, version, ptr in checks:
                t = args[k]
                if ref() is not t or t._version != version or t.data_ptr() != ptr:
                    break
            else:
                return values
        global PREP_RUNS
        PREP_RUNS += 1
        ins = [args[k] for k in self.positions]
        # The versions as the prep graph reads them: an update from another
        # thread while it runs makes the next call prepare again.
        try:
            checks = tuple((k, weakref.ref(t), t._version, t.data_ptr())
                           for k, t in zip(self.positions, ins))
        except RuntimeError:  # an inference tensor: no version counter
            checks = None
        with torch.no_grad():
            values = tuple(v.contiguous() for v in self.prep(*ins))
        self._state = (checks, values) if checks is not None else None
        if self.note is not None:
            copied = sum(v.numel() * v.element_size() for v in values
                         if not any(v.untyped_storage().data_ptr() ==
                                    t.untyped_storage().data_ptr() for t in ins))
            self.note(f"{len(values)} value(s) prepared from {len(ins)} parameter(s), "
                      f"{copied / 2**20:.2f} MiB held"
                      + ("" if self._state else "; inference tensors, recomputed "
                         "on every call"))
        return values

    def __call__(self, *args):
        return self.main(*args, *self._values(args))
