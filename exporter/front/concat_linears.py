"""Linears that read the same input become one GEMM over their weights laid side by side, at export.

An attention block's query, key and value projections each read the same activations with their own weight:
three GEMMs, three launches, three passes over the input, and for the narrow ones (grouped-query attention's
key and value heads: 512 columns against 2048) too few output tiles to fill a GPU or the cores of a CPU. Laid
side by side at export (``W = cat(W_q, W_k, W_v)``), they are one GEMM whose result is split back into the
three, which is what GPT-2's fused ``c_attn`` already is: every column of the product is the same dot product
over the same K, so each output only changes in which kernel computes it.

The pass only joins what is provably the same computation: ``mm`` / ``addmm`` nodes whose first operand is the
same tensor (or views of one tensor to one shape), whose weights are constants of the program of one dtype and
K, each reached through at most a cast and a transpose that nothing else reads. It joins only what pays: outputs
that meet in an elementwise op stay apart, as that op is the later GEMM's epilogue (a gated MLP's gate and up).
A member without a bias, among members with one, adds zeros. The joined weights are added as lifted constants
(front/constants.py) and the originals dropped, as fold_batchnorm does, so the package holds each weight once. A
training package shares its weights between its graphs and never runs this (capture's ``fold=False``).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch

from tcexport.exporter.front.constants import (CASTS, add_constant, finish_rewrite, input_specs, is_constant,
                                               is_dtype_cast, lookup, rename_output)

aten = torch.ops.aten

_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)
_LAYOUT = (aten.permute.default, aten.expand.default, aten.slice.Tensor, aten.unsqueeze.default,
           aten.squeeze.dim, aten.clone.default, aten.transpose.int)


@dataclass
class _Linear:
    """One ``mm(a, chain(w))`` / ``addmm(chain(b), a, chain(w))`` whose weight may join others."""

    node: torch.fx.Node
    a: torch.fx.Node
    weight: torch.fx.Node       # the constant placeholder
    weight_chain: tuple         # (cast node or None, transposed)
    bias: torch.fx.Node | None  # the constant placeholder
    bias_cast: torch.fx.Node | None
    n: int                      # output columns


def concat_linears(ep: torch.export.ExportedProgram) -> list[str]:
    """Join every group of linears over one input in ``ep``, in place; returns a note per group
    (``"3 linears over one input are one GEMM: q_proj.weight, k_proj.weight, v_proj.weight"``)."""
    specs = input_specs(ep)
    groups: dict[tuple, list[_Linear]] = {}
    for node in list(ep.graph.nodes):
        lin = _match(node, specs, ep)
        if lin is not None:
            groups.setdefault(_group_key(lin, ep), []).append(lin)
    notes, read = [], set()
    for group in groups.values():
        members = _apart_from_each_other(group)
        if len(members) < 2 or len({_bias_dtype(ep, specs, m) for m in members} - {None}) > 1:
            continue
        read |= {x for m in members for x in (m.weight, m.bias) if x is not None}
        notes.append(_join(ep, members, specs))
    if notes:
        finish_rewrite(ep, read, "joined linears")
    return notes


# --- matching -----------------------------------------------------------------------------------------------


def _only_user(node: torch.fx.Node, user: torch.fx.Node) -> bool:
    return list(node.users) == [user]


def _through_cast(node, user) -> tuple:
    """(the constant behind an optional cast, the cast or None), or (None, None) when the chain is anything
    else or shared."""
    if not isinstance(node, torch.fx.Node) or not _only_user(node, user):
        return None, None
    if node.op == "call_function" and node.target in CASTS:
        if not is_dtype_cast(node):
            return None, None
        inner = node.args[0]
        if not isinstance(inner, torch.fx.Node) or not _only_user(inner, node):
            return None, None
        return inner, node
    return node, None


def _match(node: torch.fx.Node, specs: dict, ep) -> _Linear | None:
    if node.op != "call_function" or node.target not in (aten.mm.default, aten.addmm.default):
        return None
    if node.target is aten.addmm.default:
        if len(node.args) != 3 or node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
            return None
        bias_in, a, b = node.args
    else:
        if len(node.args) != 2:
            return None
        (a, b), bias_in = node.args, None
    if not isinstance(a, torch.fx.Node) or not isinstance(b, torch.fx.Node) or not _only_user(b, node):
        return None
    transposed = b.op == "call_function" and b.target is aten.permute.default and list(b.args[1]) == [1, 0]
    weight, cast = _through_cast(b.args[0] if transposed else b, b if transposed else node)
    if weight is None or not is_constant(weight, specs, ep):
        return None
    bias = bias_cast = None
    if bias_in is not None:
        bias, bias_cast = _through_cast(bias_in, node)
        if bias is None or not is_constant(bias, specs, ep) or lookup(ep, specs[bias.name]).dim() != 1:
            return None
    out, w = node.meta.get("val"), lookup(ep, specs[weight.name])
    if not isinstance(out, torch.Tensor) or out.dim() != 2 or w.dim() != 2 or not isinstance(out.shape[1], int):
        return None
    if bias is not None and bias_cast is not None and (cast is None or bias_cast.meta["val"].dtype
                                                       != cast.meta["val"].dtype):
        return None
    return _Linear(node, a, weight, (cast, transposed), bias, bias_cast, int(out.shape[1]))


def _group_key(lin: _Linear, ep) -> tuple:
    """Linears join when they read one tensor (views of one node to equal sizes count as one), their weights
    are laid out alike (transposed or not, cast to one dtype or not) and hold one dtype and K."""
    a = lin.a
    source = (a.args[0], _sizes(a.args[1])) if a.op == "call_function" and a.target in _VIEWS else (a,)
    cast, transposed = lin.weight_chain
    w = lin.weight.meta["val"]
    k = w.shape[1] if transposed else w.shape[0]
    return source, transposed, None if cast is None else cast.meta["val"].dtype, w.dtype, k


MEET_HOPS = 8  # how far through elementwise ops and views two outputs are followed to see whether they meet


def _apart_from_each_other(group: list[_Linear]) -> list[_Linear]:
    """The members (in graph order) whose outputs do not meet in an elementwise op, each against those taken
    before it: a gated MLP's ``silu(gate(x)) * up(x)`` runs as the up GEMM's epilogue (reading the gate's
    result), which a joined GEMM, whose result is split, cannot have; joined, it is a pass of its own (an H100
    decode step of a ~1B Llama: the joined gate and up took as long as the two GEMMs, plus the pass). Outputs
    that meet only in a GEMM (attention's query and key, in the scores) stay joinable."""
    taken, reach = [], []
    for m in group:
        mine = _elementwise_reach(m.node)
        if not any(mine & other for other in reach):
            taken.append(m)
            reach.append(mine)
    return taken


def _elementwise_reach(node: torch.fx.Node) -> set:
    """The elementwise ops (casts among them: autocast's) ``node``'s value reaches within MEET_HOPS steps through
    views and elementwise ops."""
    seen, frontier, out = {node}, [node], set()
    for _ in range(MEET_HOPS):
        nxt = []
        for x in frontier:
            for u in x.users:
                if u in seen or u.op != "call_function":
                    continue
                seen.add(u)
                if u.target is operator.getitem or u.target in _VIEWS or u.target in _LAYOUT:
                    nxt.append(u)
                elif u.target in CASTS or isinstance(u.target, torch._ops.OpOverload) \
                        and torch.Tag.pointwise in u.target.tags:
                    out.add(u)
                    nxt.append(u)
        frontier = nxt
    return out


def _sizes(sizes) -> tuple:
    return tuple(x if isinstance(x, torch.fx.Node) else int(x) for x in sizes)


def _bias_dtype(ep, specs: dict, lin: _Linear):
    return None if lin.bias is None else lookup(ep, specs[lin.bias.name]).dtype


# --- joining ------------------------------------------------------------------------------------------------


def _join(ep, members: list[_Linear], specs: dict) -> str:
    first = members[0]
    cast, transposed = first.weight_chain
    keys = [specs[m.weight.name].target for m in members]
    weights = [lookup(ep, specs[m.weight.name]).detach() for m in members]
    weight = torch.cat(weights, dim=0 if transposed else 1).contiguous()
    w_node = add_constant(ep, specs, braced(keys), weight, like=first.weight)
    bias_node = None
    if any(m.bias is not None for m in members):
        dtype = next(_bias_dtype(ep, specs, m) for m in members if m.bias is not None)  # one for all (the caller)
        biases = [lookup(ep, specs[m.bias.name]).detach() if m.bias is not None
                  else torch.zeros(m.n, dtype=dtype) for m in members]
        # a member without a bias adds zeros, under the name its bias would have
        names = [specs[m.bias.name].target if m.bias is not None
                 else (key[: -len("weight")] + "bias" if key.endswith("weight") else key + ".bias")
                 for m, key in zip(members, keys)]
        bias_node = add_constant(ep, specs, braced(names), torch.cat(biases).contiguous(), like=first.weight)
    graph, fake = ep.graph, first.node.meta["val"].fake_mode

    def call(target, args, kwargs=None):
        node = graph.call_function(target, args, kwargs or {})
        with fake:
            node.meta["val"] = target(*[x.meta["val"] if isinstance(x, torch.fx.Node) else x for x in args],
                                      **(kwargs or {}))
        for key in ("stack_trace", "nn_module_stack", "source_fn_stack", "from_node"):
            if key in first.node.meta:
                node.meta[key] = first.node.meta[key]
        return node

    with graph.inserting_before(first.node):
        b, bias = w_node, bias_node
        if cast is not None:
            b = call(cast.target, (b, *cast.args[1:]), dict(cast.kwargs))
            if bias is not None:
                bias = call(cast.target, (bias, *cast.args[1:]), dict(cast.kwargs))
        if transposed:
            b = call(aten.permute.default, (b, [1, 0]))
        joined = (call(aten.addmm.default, (bias, first.a, b)) if bias is not None
                  else call(aten.mm.default, (first.a, b)))
        parts = call(aten.split_with_sizes.default, (joined, [m.n for m in members], 1))
        pieces = []
        for i in range(len(members)):
            piece = graph.call_function(operator.getitem, (parts, i))
            piece.meta.update({k: v for k, v in members[i].node.meta.items() if k != "val"})
            piece.meta["val"] = parts.meta["val"][i]
            pieces.append(piece)
    for m, piece in zip(members, pieces):
        m.node.replace_all_uses_with(piece)
        rename_output(ep, m.node.name, piece.name)
        chain = m.node.args
        graph.erase_node(m.node)
        for x in chain:  # the weight's and bias's transpose and casts, unread now (the placeholders go later)
            while isinstance(x, torch.fx.Node) and x.op == "call_function" and not x.users:
                nxt = x.args[0]
                graph.erase_node(x)
                x = nxt
    return f"{len(members)} linears over one input are one GEMM: {', '.join(keys)}"


def braced(keys: list[str]) -> str:
    """``a.q_proj.weight``, ``a.k_proj.weight`` → ``a.{q_proj,k_proj}.weight``: the model's own names, shared
    dotted head and tail once."""
    parts = [k.split(".") for k in keys]
    head = 0
    while all(len(p) > head + 1 for p in parts) and len({p[head] for p in parts}) == 1:
        head += 1
    tail = 0
    while all(len(p) > head + tail + 1 for p in parts) and len({p[-1 - tail] for p in parts}) == 1:
        tail += 1
    middles = [".".join(p[head:len(p) - tail]) for p in parts]
    return ".".join([*parts[0][:head], "{" + ",".join(middles) + "}", *parts[0][len(parts[0]) - tail:]])
