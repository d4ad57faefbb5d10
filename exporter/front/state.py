"""State: buffers a model's forward writes in place (a static KV cache, a step counter), found in the exported
program and kept as the package's state.

torch.export lifts a tensor the forward reaches through a plain Python object (transformers' ``StaticCache``
layers, which ``TorchExportableModuleWithStaticCache`` also registers as buffers) as a *constant*, not as the
buffer it is; mutating a constant then fails functionalization ("expected compiled_fn to be GraphModule").
``lift_buffer_aliases`` names such constants as the buffers they alias, so functionalization turns each write
into a BUFFER_MUTATION output. ``state_of`` reads those outputs: the buffers that are state, in output order,
with the value each starts from. Lowering makes each one an extra input and an extra output of the graph; the
loader keeps the value between calls.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.export.graph_signature import InputKind, InputSpec, OutputKind


@dataclass(frozen=True)
class StateBuffer:
    """One buffer the forward writes: its name (the module's buffer name), its value before the first call,
    and whether the only reads of the old value are the in-place writes themselves (``in_place``): then the
    loader may hand the kernels one array as both the old and the new value."""

    name: str
    initial: torch.Tensor
    in_place: bool


def _storage_key(t: torch.Tensor):
    try:
        return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
    except (RuntimeError, NotImplementedError):  # a tensor without storage (meta, a subclass): never an alias
        return None


def lift_buffer_aliases(ep: torch.export.ExportedProgram, module: torch.nn.Module) -> list[str]:
    """Rewrite, in ``ep``'s signature, each lifted constant that is one of ``module``'s buffers (the same
    storage, offset, shape, strides and dtype) into that buffer. Returns the buffer names rewritten."""
    buffers = {}
    for name, b in module.named_buffers(remove_duplicate=False):
        key = _storage_key(b)
        if key is not None:
            buffers.setdefault(key, name)
    if not buffers:
        return []
    specs, lifted = [], []
    for s in ep.graph_signature.input_specs:
        if s.kind == InputKind.CONSTANT_TENSOR and isinstance(ep.constants.get(s.target), torch.Tensor):
            name = buffers.get(_storage_key(ep.constants[s.target]))
            if name is not None:
                if name not in ep.constants and name not in ep.state_dict:
                    ep.constants[name] = ep.constants[s.target]  # a non-persistent buffer's value lives here
                s = InputSpec(InputKind.BUFFER, s.arg, name, persistent=False)
                lifted.append(name)
        specs.append(s)
    if lifted:
        ep.graph_signature.input_specs[:] = specs
    return lifted


def state_of(ep: torch.export.ExportedProgram, before: dict | None = None) -> list[StateBuffer]:
    """The buffers ``ep`` (decomposed, so functional) writes, in the order of its BUFFER_MUTATION outputs; each
    starts from its value in ``before`` (buffer name -> the value before export) where given."""
    sig = ep.graph_signature
    mutated = [s.target for s in sig.output_specs if s.kind == OutputKind.BUFFER_MUTATION]
    if not mutated:
        return []
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    readers: dict[str, list] = {}
    bases: dict[str, set] = {}
    for s in sig.input_specs:
        if s.kind == InputKind.BUFFER and s.target in mutated:
            readers.setdefault(s.target, []).extend(placeholders[s.arg.name].users)
            bases.setdefault(s.target, set()).add(placeholders[s.arg.name])
    output = next(n for n in ep.graph.nodes if n.op == "output")
    written = {s.target: a for s, a in zip(sig.output_specs, output.args[0]) if s.kind == OutputKind.BUFFER_MUTATION}
    out = []
    for name in mutated:
        value = ep.state_dict.get(name) if name in ep.state_dict else ep.constants.get(name)
        value = before.get(name, value) if before else value
        in_place = _writes_in_place(readers.get(name, []), bases.get(name, set()), written[name])
        out.append(StateBuffer(name, value.detach().clone(), in_place))
    return out


def _writes_in_place(readers: list, bases: set, result) -> bool:
    """The old value is read only by one ``index_put`` whose result is the new value: the update rule
    (lower/index.py) stores, at every position, a value that does not depend on what other positions held, so
    the same array may be both."""
    return (len(readers) == 1 and readers[0] is result and readers[0].target is torch.ops.aten.index_put.default
            and readers[0].args[0] in bases and not bases & _nodes_in(readers[0].args[1:])
            and not readers[0].kwargs.get("accumulate", False)
            and (len(readers[0].args) < 4 or not readers[0].args[3]))


def _nodes_in(args) -> set:
    found: set = set()
    torch.fx.node.map_arg(args, lambda n: found.add(n))
    return found


def written_buffers(ep: torch.export.ExportedProgram) -> list[str]:
    """The buffers ``ep`` writes, functional or not: BUFFER_MUTATION outputs, or (before decomposition, where the
    writes are still in-place ops) an in-place op whose first argument is a buffer."""
    sig = ep.graph_signature
    names = [s.target for s in sig.output_specs if s.kind == OutputKind.BUFFER_MUTATION]
    buffers = {s.arg.name: s.target for s in sig.input_specs if s.kind == InputKind.BUFFER}
    for n in ep.graph.nodes:
        op = getattr(n.target, "_schema", None)
        first = n.args[0] if n.op == "call_function" and n.args else None
        if op is not None and op.name.endswith("_") and isinstance(first, torch.fx.Node) and first.name in buffers:
            names.append(buffers[first.name])
    return list(dict.fromkeys(names))
