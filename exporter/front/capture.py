"""Capture: torch.export with Dims, then decomposition into the small core op set the lowering knows.

Composite ops (softmax, layer_norm, gelu, ...) are decomposed on purpose: fusion rebuilds them as single kernels
from their parts, so one generic mechanism covers every such op instead of one hand-written kernel each.
Then graph rewrites that are exact at export time run on the decomposed program (``fold_batchnorm``: an eval
batch norm after a convolution becomes part of the convolution's weight and bias).

A dynamic dim's way through the front end (``tcexport model.py --dynamic batch``): cli.py passes the spec
strings to the pipeline's capture stage, which calls ``capture`` here; dynamic.py parses them into our symbols
and where each is placed, then into torch.export Dims; torch.export runs (accepting its suggested fixes through
relations.accept_fixes); relations.py maps torch's symbols back to ours (``rename``), refines each symbol's range
and collects the guards. ``Captured`` carries them on: lowering reads every size over our symbols
(``to_sympy``, lower/context.py), and the package stage writes ``symbols`` and ``guards`` into the manifest,
which loader/guards.py checks before every call.
"""

from __future__ import annotations

import math

from dataclasses import dataclass, field

import sympy
import torch
from torch._decomp import get_decompositions

from tcexport.exporter.front import dynamic
from tcexport.exporter.front import range_check, relations
from tcexport.exporter.errors import CaptureError, SpecializedDimError
from tcexport.exporter.front.fold_batchnorm import fold_batchnorm
from tcexport.exporter.front.model_file import ModelSpec

aten = torch.ops.aten

# Decomposed further than the core ATen set, so that fusion sees reductions and pointwise parts.
EXTRA_DECOMPOSITIONS = [
    aten._softmax, aten._log_softmax, aten.native_layer_norm, aten.gelu, aten.var_mean, aten.silu,
    aten.hardswish, aten.hardsigmoid, aten.mish, aten.softplus, aten.elu, aten.leaky_relu, aten.hardtanh,
    aten.native_group_norm, aten.rms_norm, aten.std, aten.var, aten._native_batch_norm_legit_functional,
    aten._native_batch_norm_legit.no_stats,
    aten.linalg_vector_norm, aten.logsumexp, aten.addcmul, aten.addcdiv, aten.lerp, aten.sigmoid_backward,
    # resizing as gathers at computed indices and a weighted sum (segmentation heads, BEiT's position bias)
    aten.upsample_bilinear2d, aten.upsample_nearest2d,
]


@dataclass
class Captured:
    """What the front end hands to lowering (lower/core.py): the decomposed program, our symbols and their
    ranges, torch's symbols renamed to ours, and the relations the package guards."""

    program: torch.export.ExportedProgram
    input_names: list[str]
    symbols: dict[str, dynamic.SymbolSpec]  # user name -> range (as export refined it)
    rename: dict  # torch's sympy symbol -> an expression over our symbols (see relations.subst)
    model_file: str | None
    guards: list = field(default_factory=list)  # relations.Relation: what the loader checks beyond ranges and dims
    notes: list = field(default_factory=list)   # what export demanded and we accepted (summary warnings)
    dynamic_shapes: dict | None = None          # the torch.export dynamic_shapes that succeeded, fixes included
    folded: list = field(default_factory=list)  # graph rewrites done before lowering (batch norms folded, ...)


def decomposition_table():
    table = torch.export.default_decompositions()
    table.update(get_decompositions(EXTRA_DECOMPOSITIONS))
    table[aten._scaled_dot_product_flash_attention_for_cpu.default] = _sdpa_flash_cpu
    return table


def _sdpa_flash_cpu(query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    """SDPA as its math parts, keeping the layout the fused CPU op reports: contiguous [N, H, L, E] (torch's
    own decomposition returns an [L, N, H, E]-ordered layout, after which GPT-2's ``.transpose(1, 2)
    .reshape(...)`` + ``.view(-1, d)`` no longer traces). In float32/float64 the scale multiplies the scores,
    not q and k as torch's math kernel does: q, k and v stay plain views of their projection, which GEMMs read
    in place, and the scale fuses into the scores GEMM's epilogue. 16-bit inputs are computed in float32 like
    torch's math kernel; their widening folds into the GEMMs (fuse.fold_copies_into_operands), which read the
    16-bit values directly and accumulate in float32 (the same arithmetic)."""
    if dropout_p != 0.0:
        raise CaptureError("scaled_dot_product_attention with dropout_p != 0 cannot be exported (call eval())")
    if query.size(1) != key.size(1):  # grouped-query attention: each k/v head serves several query heads
        group = query.size(1) // key.size(1)
        key, value = key.repeat_interleave(group, dim=1), value.repeat_interleave(group, dim=1)
    scale = 1.0 / math.sqrt(query.size(-1)) if scale is None else scale
    dtype = query.dtype
    if dtype in (torch.float16, torch.bfloat16):  # computed in float32, as torch's math kernel does
        query, key, value = query.float(), key.float(), value.float()
        attn_mask = attn_mask.float() if attn_mask is not None and attn_mask.dtype == dtype else attn_mask
    scores = torch.matmul(query, key.transpose(-2, -1)) * scale
    if is_causal:
        keep = torch.ones(query.size(-2), key.size(-2), dtype=torch.bool, device=query.device).tril()
        scores = scores.masked_fill(keep.logical_not(), float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(attn_mask.logical_not(), float("-inf"))
        else:
            scores = scores + attn_mask
    attn = torch.softmax(scores, dim=-1)
    return torch.matmul(attn, value).to(dtype).contiguous(), attn


def capture(spec: ModelSpec, cli_dynamic: list[str], fold: bool = True) -> Captured:
    """The model as a decomposed program over our dynamic symbols: dynamic.resolve, torch.export (with fixes),
    then relations (bind_symbols, symbol_ranges, collect_guards). ``fold=False`` keeps eval batch norms unfolded
    (a training package shares these weights with its training graphs, where each is a parameter of its own)."""
    symbols, places = dynamic.resolve(spec.input_names, spec.example_inputs, spec.dynamic_shapes, cli_dynamic)
    accepted = relations.Accepted()
    declared = dict(symbols)
    ep, torch_shapes = _export_accepting_fixes(spec, symbols, places, accepted)
    folded = fold_batchnorm(ep) if fold else []
    rename, ours = relations.bind_symbols(ep, spec.input_names, places, symbols, accepted)
    _check_sizes_known(ep, rename)
    refined, range_guards = relations.symbol_ranges(ep, rename, symbols, ours)
    accepted.notes += relations.range_notes(declared, refined)
    guards = relations.collect_guards(ep, rename, accepted, str(spec.path)) + range_guards
    return Captured(ep, spec.input_names, refined, rename, str(spec.path), guards, accepted.notes, torch_shapes,
                    folded)


MAX_FIX_ROUNDS = 4


def _export_accepting_fixes(spec: ModelSpec, symbols, places, accepted):
    """torch.export; when it reports a constraint violation with suggested fixes (a narrower range, a
    divisibility ``seq = 4*_seq``, a relation ``b = a + 1``), accept them, note them, and export again.
    Returns the decomposed program and the dynamic_shapes that worked (the ONNX export reuses them)."""
    for round_ in range(MAX_FIX_ROUNDS):
        shapes = dynamic.to_torch_dynamic_shapes(spec.input_names, spec.example_inputs, symbols, places,
                                                 accepted.rewrites)
        try:
            with torch.no_grad():
                ep = torch.export.export(spec.module, spec.example_inputs, dynamic_shapes=shapes, strict=False)
                return ep.run_decompositions(decomposition_table()), shapes
        except Exception as e:  # torch's own message explains the constraint or the unsupported construct
            error = e
            if range_check.violated_symbols(str(e)) and round_ + 1 < MAX_FIX_ROUNDS:
                found = _export_checking_range(spec, symbols, places, accepted, str(e))
                if found is not None:
                    return found
            if "Suggested fixes:" in str(e) and round_ + 1 < MAX_FIX_ROUNDS:
                try:
                    relations.accept_fixes(str(e), symbols, places, accepted)
                    continue
                except SpecializedDimError:
                    raise
                except CaptureError:
                    pass
            break
    raise CaptureError(f"torch.export could not capture {spec.path}: {type(error).__name__}: {error}\n"
                       f"Fix the model (or the --dynamic spec) as the message above suggests.") from error


def _export_checking_range(spec: ModelSpec, symbols, places, accepted, message: str):
    """Export again with the symbols torch could not prove a guard for as ``Dim.DYNAMIC`` over their declared
    ranges; keep that capture when every guard holds at every size in the ranges (range_check.py), else None
    (and torch's suggested fix is taken)."""
    trusted = dynamic.plain_symbols(range_check.violated_symbols(message), places, accepted.rewrites)
    if not trusted or any(symbols[n].max is None for n in trusted):
        return None
    shapes = dynamic.to_torch_dynamic_shapes(spec.input_names, spec.example_inputs, symbols, places,
                                             accepted.rewrites, trusted=trusted)
    try:
        with torch.no_grad():
            ep = torch.export.export(spec.module, spec.example_inputs, dynamic_shapes=shapes, strict=False)
    except Exception:  # this capture fails differently: torch's fix stands
        return None
    failing = range_check.failing_guard(ep, range_check.same_sizes(ep, spec.input_names, places, trusted))
    if failing is not None:
        return None
    accepted.notes.append(f"{', '.join(trusted)}: torch could not prove its guards for the declared range; each "
                          f"was checked at every size in the range and holds, so the range stands")
    return ep.run_decompositions(decomposition_table()), shapes


def _check_sizes_known(ep, rename) -> None:
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


def to_sympy(x, rename) -> sympy.Expr:
    """A size from a torch value (int or SymInt) as a sympy expression over our symbols."""
    if isinstance(x, torch.SymInt):
        return relations.subst(x.node.expr, rename)
    if isinstance(x, (int, sympy.Expr)):
        return relations.subst(x, rename) if isinstance(x, sympy.Expr) else sympy.Integer(x)
    raise TypeError(f"not a size: {x!r}")
