"""Fold eval-mode batch norm into the convolution that feeds it, on the captured (decomposed) program.

A batch norm right after a convolution is an affine map per output channel, so it can be baked into the
convolution's weight and bias once, at export: ``w' = w * s`` and ``b' = (b - mean) * s + beta`` with
``s = gamma / sqrt(var + eps)``. The package then holds one convolution (no per-call scale/shift kernel, no
running statistics among the weights), which is what a trained CNN's inference graph should cost.

The pass only folds what is provably the same computation: the convolution's only user is the batch norm, the
batch norm's only used output is its result, and every tensor involved (conv weight/bias, gamma, beta, running
mean/var) is a constant of the program (a parameter, buffer or lifted constant), never a user input. The folded
tensors are added as lifted constants (``InputKind.CONSTANT_TENSOR`` in ``ep.constants``), and the program's
placeholders, signature and state dict drop whatever the fold left unused, so the ExportedProgram stays valid
(``ep.validate()``, ``ep.module()``) and lowering reads the new weights exactly like any other.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch

from tcexport.exporter.front.constants import (add_constant, finish_rewrite, input_specs, is_constant, lookup,
                                               rename_output)

aten = torch.ops.aten


@dataclass
class _Pair:
    """One convolution and the eval batch norm that is its only user, with the node that reads the result."""

    conv: torch.fx.Node
    bn: torch.fx.Node
    result: torch.fx.Node  # getitem(bn, 0)


def fold_batchnorm(ep: torch.export.ExportedProgram) -> list[str]:
    """Fold every foldable conv → eval batch norm pair of ``ep`` in place; returns a note per folded pair
    (``"batch norm (bn1.weight, ...) folded into the convolution of conv1.weight"``), so callers and tests can see
    what happened."""
    specs = input_specs(ep)
    notes, read = [], set()
    for pair in [p for n in list(ep.graph.nodes) if (p := _match(n, specs, ep)) is not None]:
        read |= {n for n in (*pair.conv.args[1:3], *pair.bn.args[1:5]) if n is not None}
        notes.append(_fold(ep, pair, specs))
    if notes:
        finish_rewrite(ep, read, "a folded batch norm")
    return notes


# --- matching -----------------------------------------------------------------------------------------------


def _match(node: torch.fx.Node, specs: dict, ep) -> _Pair | None:
    """The pair starting at ``node`` if it is a convolution whose fold changes nothing but the cost."""
    if node.op != "call_function" or node.target != aten.convolution.default or len(node.args) != 9:
        return None
    x, w, bias, _stride, _padding, _dilation, transposed, _out_pad, _groups = node.args
    if transposed or len(node.users) != 1:
        return None
    bn = next(iter(node.users))
    if bn.op != "call_function" or bn.target != aten._native_batch_norm_legit_no_training.default \
            or len(bn.args) != 7:
        return None
    if bn.args[0] is not node or node in bn.args[1:5]:
        return None
    result = _only_result(bn)
    if result is None or not _channels_line_up(node, w, bn):
        return None
    tensors = [w, bias, *bn.args[1:5]]
    if not all(t is None or is_constant(t, specs, ep) for t in tensors):
        return None
    return _Pair(node, bn, result)


def _only_result(bn: torch.fx.Node) -> torch.fx.Node | None:
    """``getitem(bn, 0)`` when that is the batch norm's only user (the saved mean / rstd outputs unused)."""
    users = list(bn.users)
    if len(users) != 1:
        return None
    (g,) = users
    if g.op == "call_function" and g.target is operator.getitem and g.args[1] == 0:
        return g
    return None


def _channels_line_up(conv: torch.fx.Node, w: torch.fx.Node, bn: torch.fx.Node) -> bool:
    """The batch norm normalises dim 1 of its input; that must be the conv's output channel (a batched conv:
    an unbatched one's dim 1 is a spatial dim) and have as many entries as the statistics."""
    out, weight, mean = conv.meta.get("val"), w.meta.get("val"), bn.args[3].meta.get("val")
    if not all(isinstance(t, torch.Tensor) for t in (out, weight, mean)):
        return False
    return out.dim() == weight.dim() and mean.dim() == 1 and out.shape[1] == weight.shape[0] == mean.shape[0]


# --- folding ------------------------------------------------------------------------------------------------


def folded_tensors(w: torch.Tensor, b: torch.Tensor | None, gamma: torch.Tensor | None, beta: torch.Tensor | None,
                   mean: torch.Tensor, var: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``w * s`` per output channel and ``(b - mean) * s + beta``, ``s = gamma / sqrt(var + eps)``: computed in
    float64 (so the fold adds no rounding of its own beyond one final cast) and cast to the weight's dtype."""
    f64 = torch.float64
    scale = torch.rsqrt(var.detach().to(f64) + eps)
    if gamma is not None:
        scale = scale * gamma.detach().to(f64)
    shift = -mean.detach().to(f64) * scale
    if b is not None:
        shift = shift + b.detach().to(f64) * scale
    if beta is not None:
        shift = shift + beta.detach().to(f64)
    weight = w.detach().to(f64) * scale.reshape((-1,) + (1,) * (w.dim() - 1))
    return weight.to(w.dtype).contiguous(), shift.to(w.dtype).contiguous()


def _fold(ep, pair: _Pair, specs: dict) -> str:
    conv, bn = pair.conv, pair.bn
    w_node, b_node = conv.args[1], conv.args[2]

    def value(n):
        return None if n is None else lookup(ep, specs[n.name])

    gamma, beta, mean, var = (value(n) for n in bn.args[1:5])
    eps = float(bn.args[6])
    weight, bias = folded_tensors(value(w_node), value(b_node), gamma, beta, mean, var, eps)
    w_key = specs[w_node.name].target
    new_w = add_constant(ep, specs, _folded_name(w_key, "weight"), weight, like=w_node)
    new_b = add_constant(ep, specs, _folded_name(w_key, "bias"), bias, like=w_node)
    with ep.graph.inserting_before(conv):
        fused = ep.graph.call_function(aten.convolution.default, (conv.args[0], new_w, new_b, *conv.args[3:]),
                                       dict(conv.kwargs))
    fused.meta.update(conv.meta)
    stats = ", ".join(specs[n.name].target for n in bn.args[1:5] if n is not None)
    pair.result.replace_all_uses_with(fused)
    rename_output(ep, pair.result.name, fused.name)
    for n in (pair.result, bn, conv):
        ep.graph.erase_node(n)
    return f"batch norm ({stats}) folded into the convolution of {w_key}"


def _folded_name(w_key: str, what: str) -> str:
    """``conv1.weight`` → ``conv1.weight.bn_folded`` / ``conv1.bias.bn_folded``: the model's own names, marked,
    since the values are not the model's parameters any more."""
    stem = w_key[: -len("weight")] if w_key.endswith("weight") else w_key + "."
    return f"{stem}{what}.bn_folded"
