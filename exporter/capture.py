"""Capture: torch.export with Dims, then decomposition into the small core op set the lowering knows.

Composite ops (softmax, layer_norm, gelu, ...) are decomposed on purpose: fusion rebuilds them as single kernels
from their parts, so one generic mechanism covers every such op instead of one hand-written kernel each.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy
import torch
from torch._decomp import get_decompositions

from . import dynamic
from .errors import CaptureError, DynamicSpecError
from .ir import shape_symbol
from .model_file import ModelSpec

aten = torch.ops.aten

# Decomposed further than the core ATen set, so that fusion sees reductions and pointwise parts.
EXTRA_DECOMPOSITIONS = [
    aten._softmax, aten._log_softmax, aten.native_layer_norm, aten.gelu, aten.var_mean, aten.silu,
    aten.hardswish, aten.hardsigmoid, aten.mish, aten.softplus, aten.elu, aten.leaky_relu, aten.hardtanh,
    aten.native_group_norm, aten.rms_norm, aten._native_batch_norm_legit_no_training, aten.std, aten.var,
    aten.linalg_vector_norm, aten.logsumexp, aten.addcmul, aten.addcdiv, aten.lerp, aten.sigmoid_backward,
]


@dataclass
class Captured:
    program: torch.export.ExportedProgram
    input_names: list[str]
    symbols: dict[str, dynamic.SymbolSpec]  # user name -> range (as export refined it)
    rename: dict  # torch's sympy symbol -> our symbol
    model_file: str | None


def decomposition_table():
    table = torch.export.default_decompositions()
    table.update(get_decompositions(EXTRA_DECOMPOSITIONS))
    table[aten._scaled_dot_product_flash_attention_for_cpu.default] = _sdpa_flash_cpu
    return table


def _sdpa_flash_cpu(query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    """SDPA as its math parts (bmm, softmax), keeping the layout the fused CPU op reports: contiguous
    [N, H, L, E]. torch's own decomposition returns an [L, N, H, E]-ordered layout, after which a model's
    ``.transpose(1, 2).reshape(...)`` + ``.view(-1, d)`` (GPT-2) no longer traces."""
    if dropout_p != 0.0:
        raise CaptureError("scaled_dot_product_attention with dropout_p != 0 cannot be exported (call eval())")
    output, attn = aten._scaled_dot_product_attention_math.default(
        query, key, value, attn_mask=attn_mask, dropout_p=0.0, is_causal=is_causal, dropout_mask=None,
        scale=scale, enable_gqa=query.size(1) != key.size(1))
    return output.contiguous(), attn


def capture(spec: ModelSpec, cli_dynamic: list[str]) -> Captured:
    symbols, places = dynamic.resolve(spec.input_names, spec.example_inputs, spec.dynamic_shapes, cli_dynamic)
    shapes = dynamic.to_torch_dynamic_shapes(spec.input_names, spec.example_inputs, symbols, places)
    try:
        with torch.no_grad():
            ep = torch.export.export(spec.module, spec.example_inputs, dynamic_shapes=shapes, strict=False)
            ep = ep.run_decompositions(decomposition_table())
    except Exception as e:  # torch's own message explains the constraint or the unsupported construct
        kind = type(e).__name__
        raise CaptureError(f"torch.export could not capture {spec.path}: {kind}: {e}\n"
                           f"Fix the model (or the --dynamic spec) as the message above suggests.") from e
    rename = _rename_symbols(ep, spec.input_names, places)
    refined = _refine_ranges(ep, rename, symbols)
    return Captured(ep, spec.input_names, refined, rename, str(spec.path))


def _user_input_nodes(ep) -> dict[str, torch.fx.Node]:
    from torch.export.graph_signature import InputKind
    user = [s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    nodes = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    return {name: nodes[name] for name in user}


def _rename_symbols(ep, input_names, places) -> dict:
    """Map export's symbols (s0, s77, ...) to the user's names by where the user placed each symbol."""
    rename = {}
    user_nodes = list(_user_input_nodes(ep).values())
    for k, name in enumerate(input_names):
        if k >= len(user_nodes):
            break
        shape = user_nodes[k].meta["val"].shape
        for dim, sym in places.get(name, {}).items():
            size = shape[dim]
            if not isinstance(size, torch.SymInt):
                raise DynamicSpecError(
                    f"input {name!r} dim {dim} was marked dynamic as {sym!r}, but export specialised it to the "
                    f"constant {size}: the model's code requires that size. Remove the dynamic mark for "
                    f"{name}.{dim}, or change the model so the size is not fixed.")
            expr = size.node.expr
            if isinstance(expr, sympy.Symbol):
                old = rename.get(expr)
                if old is not None and old.name != sym:
                    raise DynamicSpecError(
                        f"export found that symbols {old.name!r} and {sym!r} must be equal "
                        f"(input {name!r} dim {dim}); use one symbol for both")
                rename[expr] = shape_symbol(sym)
    for n in ep.graph.nodes:
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor):
            for s in val.shape:
                if isinstance(s, torch.SymInt):
                    for free in s.node.expr.free_symbols:
                        if free not in rename:
                            raise CaptureError(
                                f"node {n.name} has a size depending on {free}, which is not one of the dynamic "
                                f"dims you declared (data-dependent sizes are not supported yet)")
    return rename


def _refine_ranges(ep, rename, symbols) -> dict[str, dynamic.SymbolSpec]:
    out = {}
    for tsym, ours in rename.items():
        vr = ep.range_constraints.get(tsym)
        spec = symbols[ours.name]
        lo, hi = spec.min, spec.max
        if vr is not None:
            lo = max(lo, int(vr.lower))
            upper = _finite_int(vr.upper)
            if upper is not None:
                hi = upper if hi is None else min(hi, upper)
        out[ours.name] = dynamic.SymbolSpec(ours.name, lo, hi)
    return out


def _finite_int(x) -> int | None:
    try:
        v = sympy.sympify(x)
        return int(v) if v.is_Integer else None
    except (TypeError, ValueError, AttributeError):
        return None


def to_sympy(x, rename) -> sympy.Expr:
    """A size from a torch value (int or SymInt) as a sympy expression over our symbols."""
    if isinstance(x, torch.SymInt):
        return sympy.sympify(x.node.expr).xreplace(rename)
    if isinstance(x, (int, sympy.Expr)):
        return sympy.sympify(x).xreplace(rename) if isinstance(x, sympy.Expr) else sympy.Integer(x)
    raise TypeError(f"not a size: {x!r}")
