"""A linear's weight stored the way the GPU's GEMM reads it fastest, at export: [K, N] instead of torch's [N, K].

``nn.Linear`` keeps its weight [out, in] and multiplies by its transpose, so the exported graph reads every linear's
weight through ``permute(w, [1, 0])``: a B operand whose contiguous dim is K. With such a B the Triton GEMM template
took 1.14x the time it takes with N contiguous (geomean of the best tiles of each layout over 280 shapes of 512 to
4096 rows on an H100, bf16; up to 1.33x), where cuBLAS takes both alike (python -m bench.probes.gemm_table;
bench/results/nvidia-h100-2026-12-07-gemm-table.md); a ~1B Llama's prefill of 1024 tokens went from 7.04 to 5.91 ms
with this pass and the measured tiles. The weight is a constant, so the transpose can be paid once at export: the
pass stores ``w.t().contiguous()`` and the GEMM reads it as it is. Each output is the same dot product over the same
K, so nothing changes but the layout. (A decode step's GEMMs read it with wider tiles: cuda/tiles.FEW_KN_TILE.)

Only what is provably a linear's private weight moves: ``mm`` / ``addmm`` whose B is ``permute(w, [1, 0])`` of a
2-D constant, through at most a cast, each node read by the next alone, whose N makes rows of whole 16-byte units (a
row that is not cannot be read through a TMA descriptor nor in aligned vectors: a 16411-column head would lose its
persistent GEMM). A weight read elsewhere too (an LM head tied to its embedding) keeps its layout. It runs after
concat_linears (front/capture.py), so a joined weight moves once. A training package never runs it (capture's
``fold=False``): its weights are the model's parameters; nor does a package of several methods (each is captured
unfolded, front/methods.py). A package with a CPU target besides the GPU one gives its CPU kernels the [K, N] weight
too (they read either layout).
"""

from __future__ import annotations

import torch

from tcexport.exporter.front.constants import (add_constant, finish_rewrite, input_specs, is_constant,
                                               is_dtype_cast, lookup)

aten = torch.ops.aten
_ASSERT_META = aten._assert_tensor_metadata.default
ROW_ALIGN = 16  # bytes a stored [K, N] row must be a whole number of


def weights_kn(ep: torch.export.ExportedProgram) -> list[str]:
    """Store each linear's private weight [K, N] in ``ep``, in place; returns one note (or none) saying how many."""
    specs = input_specs(ep)
    moved, read = [], set()
    for node in list(ep.graph.nodes):
        chain = private_linear_weight(node, specs, ep)
        if chain is None or not _rows_aligned(chain, specs, ep):
            continue
        weight, cast, permute = chain
        value = lookup(ep, specs[weight.name]).detach()
        key = specs[weight.name].target
        stored = add_constant(ep, specs, key + ".T", value.t().contiguous(), like=weight)
        reads_instead(weight, stored)
        b = stored
        if cast is not None:
            cast.replace_input_with(weight, stored)
            old = cast.meta["val"]
            with old.fake_mode:
                cast.meta["val"] = torch.empty(tuple(reversed(old.shape)), dtype=old.dtype, device=old.device)
            b = cast
        permute.replace_all_uses_with(b)
        ep.graph.erase_node(permute)
        read.add(weight)
        moved.append(key)
    if not moved:
        return []
    finish_rewrite(ep, read, "weights stored [K, N]")
    return [f"{len(moved)} linear weights stored [K, N], the layout the GPU GEMM reads fastest ({moved[0]}, ...)"]


def private_linear_weight(node: torch.fx.Node, specs: dict, ep) -> tuple | None:
    """(weight placeholder, cast or None, permute) when ``node`` is an mm / addmm whose B is the permuted private
    2-D weight, else None (weights_panels.py moves the same weights for a CPU target)."""
    if node.op != "call_function" or node.target not in (aten.mm.default, aten.addmm.default):
        return None
    b = node.args[-1] if node.target is aten.mm.default else node.args[2] if len(node.args) == 3 else None
    if not _call(b, (aten.permute.default,)) or list(b.args[1]) != [1, 0] or list(b.users) != [node] \
            or b in node.args[:-1]:
        return None
    x, cast = b.args[0], None
    if is_dtype_cast(x):
        if list(x.users) != [b]:
            return None
        x, cast = x.args[0], x
    if not is_constant(x, specs, ep) or [u for u in x.users if not is_dtype_check(u)] != [cast or b]:
        return None
    return (x, cast, b) if lookup(ep, specs[x.name]).dim() == 2 else None


def _rows_aligned(chain: tuple, specs: dict, ep) -> bool:
    """Whether the stored [K, N] rows are whole ROW_ALIGN units (in the dtype the GEMM reads: the cast's)."""
    weight, cast, _ = chain
    value = lookup(ep, specs[weight.name])
    read = cast.meta["val"] if cast is not None else value
    return value.shape[0] * read.element_size() % ROW_ALIGN == 0


def reads_instead(weight: torch.fx.Node, stored: torch.fx.Node) -> None:
    """export's dtype checks of ``weight`` read ``stored``, which replaces it (see is_dtype_check)."""
    for check in [u for u in weight.users if is_dtype_check(u)]:
        check.replace_input_with(weight, stored)


def is_dtype_check(node: torch.fx.Node) -> bool:
    """export's check of a tensor's dtype and device before a cast (no sizes, no strides): it holds of the
    transposed copy too, so it reads that instead."""
    return node.target is _ASSERT_META and len(node.args) >= 3 and node.args[1] is None and node.args[2] is None


def _call(x, targets) -> bool:
    """Whether ``x`` is a node calling one of ``targets``."""
    return isinstance(x, torch.fx.Node) and x.op == "call_function" and x.target in targets
