"""Editing an exported program's constants (parameters, buffers, lifted constants) for the rewrites that bake
new weights at export (fold_batchnorm.py, concat_linears.py, weights_kn.py), keeping the ExportedProgram valid
(``ep.validate()``, ``ep.module()``): a new constant is a placeholder, a ``CONSTANT_TENSOR`` input spec and a
value in ``ep.constants``, so lowering reads it like any other weight; one a rewrite left unread is removed from
all three."""

from __future__ import annotations

import re

import torch
from torch.export.graph_signature import InputKind, InputSpec, TensorArgument

from tcexport.exporter.errors import CaptureError

CONSTANT_KINDS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)
CASTS = (torch.ops.aten._to_copy.default, torch.ops.prims.convert_element_type.default)


def is_dtype_cast(node) -> bool:
    """Whether ``node`` only changes its input's dtype (a ``_to_copy`` with no other argument, or a
    ``convert_element_type``): the casts the weight rewrites look through to the constant behind them."""
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in CASTS and \
        not (node.target is torch.ops.aten._to_copy.default and set(node.kwargs) - {"dtype"})


def input_specs(ep) -> dict:
    """Placeholder name -> its input spec."""
    return {s.arg.name: s for s in ep.graph_signature.input_specs}


def is_constant(node, specs: dict, ep) -> bool:
    """Whether ``node`` is a placeholder holding a parameter, buffer or lifted constant (never a user input)."""
    if not isinstance(node, torch.fx.Node) or node.op != "placeholder":
        return False
    spec = specs.get(node.name)
    return spec is not None and spec.kind in CONSTANT_KINDS and lookup(ep, spec) is not None


def lookup(ep, spec: InputSpec) -> torch.Tensor | None:
    """A constant input's value, where lowering finds it too: the state dict, else the lifted constants."""
    if spec.target in ep.state_dict:
        return ep.state_dict[spec.target]
    return ep.constants.get(spec.target)


def add_constant(ep, specs: dict, key: str, tensor: torch.Tensor, like: torch.fx.Node) -> torch.fx.Node:
    """A new lifted constant: a placeholder (after the other constants, before the user inputs, the order the
    signature requires), its ``CONSTANT_TENSOR`` input spec, and its value in ``ep.constants``. ``key`` is made
    unique (``key_1``, ...) where a rewrite baked the same name twice."""
    key = _unique_key(ep, key)
    fake_mode = like.meta["val"].fake_mode
    placeholders = [n for n in ep.graph.nodes if n.op == "placeholder"]
    specs_list = ep.graph_signature.input_specs
    at = next((k for k, s in enumerate(specs_list) if s.kind == InputKind.USER_INPUT), len(specs_list))
    anchor = placeholders[at] if at < len(placeholders) else None
    ctx = ep.graph.inserting_before(anchor) if anchor is not None else ep.graph.inserting_after(placeholders[-1])
    with ctx:
        node = ep.graph.placeholder("c_" + re.sub(r"[^A-Za-z0-9_]", "_", key))
    node.meta["val"] = fake_mode.from_tensor(tensor, static_shapes=True)
    spec = InputSpec(InputKind.CONSTANT_TENSOR, TensorArgument(name=node.name), target=key)
    specs_list.insert(at, spec)
    specs[node.name] = spec
    ep.constants[key] = tensor
    return node


def _unique_key(ep, key: str) -> str:
    taken = set(ep.state_dict) | set(ep.constants)
    out, k = key, 0
    while out in taken:
        k += 1
        out = f"{key}_{k}"
    return out


def rename_output(ep, old: str, new: str) -> None:
    """Output specs name graph nodes: one that named a replaced node now names its replacement."""
    for spec in ep.graph_signature.output_specs:
        if isinstance(spec.arg, TensorArgument) and spec.arg.name == old:
            spec.arg = TensorArgument(name=new)


def finish_rewrite(ep, read: set, why: str) -> None:
    """After a rewrite replaced nodes: the constants it read and left unread dropped (drop_unused_constants), the
    graph checked and the module's code regenerated."""
    drop_unused_constants(ep, read, why)
    ep.graph.lint()
    ep.graph_module.recompile()


def drop_unused_constants(ep, candidates: set, why: str) -> None:
    """Remove the placeholders among ``candidates`` (what a rewrite read) that nothing reads any more, their
    input specs, and the values no remaining spec names. Other unused constants are left as export made them.
    ``why`` names the rewrite in the error for a candidate that is not a constant (a bug in the rewrite)."""
    specs = ep.graph_signature.input_specs
    by_name = {s.arg.name: s for s in specs}
    dropped = set()
    for node in [n for n in ep.graph.nodes if n in candidates and not n.users]:
        spec = by_name.get(node.name)
        if spec is None or spec.kind not in CONSTANT_KINDS:
            raise CaptureError(f"placeholder {node.name} read by {why} is not a constant of the exported program "
                               f"(its input spec: {spec})")
        ep.graph.erase_node(node)
        specs.remove(spec)
        dropped.add(spec.target)
    named = {s.target for s in specs if s.kind in CONSTANT_KINDS}
    for store in (ep.state_dict, ep.constants):
        for key in dropped - named:
            store.pop(key, None)
