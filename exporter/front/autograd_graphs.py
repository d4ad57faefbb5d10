"""The training graphs: torch's partitioned joint graph (``Joint``, what autograd.py traces), rewired into a
training forward and a backward that lowering reads (``TrainingGraphs``).

torch's partitioner connects the two halves by "saved values": the forward returns them after the user outputs,
the backward takes them (by the same node names) before the tangents. Saving everything as a forward output would
copy weights and inputs into fresh buffers on every step, so each saved value becomes the cheapest source:

    a weight (primal parameter / buffer)       the backward reads the package's weight itself
    a user input of the forward                the loader passes the forward's input array again
    a view of a weight or input (a transpose)  the backward recomputes the view (index arithmetic, no copy)
    a user output                              the loader passes the forward's output array
    a SymInt (a batch size)                    the backward uses the symbol: both calls bind the same ones
    anything else                              a saved activation: an extra forward output

Gradients come out one per trainable parameter (and per input named for gradients), zeros where the
parameter does not reach the outputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.export.graph_signature import InputKind, InputSpec, OutputKind, OutputSpec, TensorArgument
from torch.fx.node import map_aggregate

from tcexport.exporter.front.capture import Captured
from tcexport.exporter.errors import CaptureError

aten = torch.ops.aten
prims = torch.ops.prims
WEIGHT_KINDS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)
CONSTANT_PREFIX = "_autograd."  # weight key of a tensor constant the joint trace created

# ops whose result is a view of their first argument (recomputing one costs index arithmetic only)
VIEW_OPS = {
    aten.permute.default, aten.t.default, aten.view.default, aten._unsafe_view.default, aten.reshape.default,
    aten.expand.default, aten.transpose.int, aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims,
    aten.squeeze.default, aten.slice.Tensor, aten.select.int, aten.alias.default, prims.broadcast_in_dim.default,
}


@dataclass
class Joint:
    """The partitioned joint graph, before rewiring: torch's forward and backward GraphModules and what each
    primal (the flat inputs of the exported program: weights, then user inputs) is."""

    program: torch.export.ExportedProgram   # the training-IR export both graphs came from
    forward: torch.fx.GraphModule           # primals -> user outputs, then saved values
    backward: torch.fx.GraphModule          # saved values, tangents -> one gradient (or None) per primal
    primal_specs: list                      # InputSpec per primal, in primal order
    num_outputs: int                        # user outputs at the front of the forward's outputs
    tangent_outputs: list[int]              # per tangent: the user output it is the gradient of
    trainable: list[str]                    # weight keys whose primals require grad
    grad_inputs: list[str]                  # user inputs whose primals require grad


@dataclass
class TrainingGraphs:
    """The training forward and the backward, as lowering reads them, and how they connect (see SPEC §6b)."""

    forward: Captured
    backward: Captured
    trainable: list[str]                          # weight keys that get gradients
    grad_inputs: list[str]                        # user inputs that get gradients
    backward_sources: list[tuple[str, int]]       # per backward input: ("input"|"forward"|"grad", index)
    gradients: list[tuple[str, str]]              # per backward output: ("weight"|"input", name)
    num_outputs: int                              # user outputs at the front of the forward's outputs
    notes: list[str] = field(default_factory=list)


@dataclass
class Signature:
    """The two lists of an ExportedProgram's graph signature that lowering reads."""

    input_specs: list
    output_specs: list


@dataclass
class GraphProgram:
    """A partitioned graph presented as lowering reads an ExportedProgram: the graph, each placeholder's kind
    (weight with its key, or user input) and every weight's value."""

    graph_module: torch.fx.GraphModule
    graph_signature: Signature
    state_dict: dict
    constants: dict = field(default_factory=dict)

    @property
    def graph(self) -> torch.fx.Graph:
        return self.graph_module.graph


class _Rewirer:
    """One rewiring of a Joint; see the module docstring for what each saved value becomes."""

    def __init__(self, joint: Joint, input_names: list[str]):
        self.joint = joint
        self.input_names = input_names  # the forward's user inputs, in order
        self.fw, self.bw = joint.forward, joint.backward
        self.primals = [n for n in self.fw.graph.nodes if n.op == "placeholder"]
        if len(self.primals) != len(joint.primal_specs):
            raise CaptureError(f"the partitioned forward takes {len(self.primals)} inputs; the exported program "
                               f"has {len(joint.primal_specs)} (a tcexport bug; please report it)")
        self.primal_index = {n: k for k, n in enumerate(self.primals)}
        user = [s for s in joint.primal_specs if s.kind == InputKind.USER_INPUT]
        self.user_index = {s.arg.name: k for k, s in enumerate(user)}
        outputs = list(self.fw.graph.output_node().args[0])
        self.user_outputs, self.saved = outputs[:joint.num_outputs], outputs[joint.num_outputs:]
        self.kept: list[torch.fx.Node] = []          # saved activations: forward outputs after the user outputs
        self.sources: dict[str, tuple[str, int]] = {}  # backward user-input placeholder -> where its value comes from
        self.bw_primals: dict[int, torch.fx.Node] = {}
        self.constants: dict = {}

    # --- the backward's inputs -----------------------------------------------------------------------

    def rewire_saved(self) -> None:
        by_name = {n.name: n for n in self.saved if isinstance(n, torch.fx.Node)}
        tangents = [p for p in self._placeholders(self.bw) if p.name.startswith("tangents")]
        for p in [p for p in self._placeholders(self.bw) if p not in tangents]:
            if p.name not in by_name:
                raise CaptureError(f"backward input {p.name} is not among the forward's saved values (a tcexport "
                                   f"bug; please report it)")
            self._rewire_one(p, by_name[p.name])
        if len(tangents) != len(self.joint.tangent_outputs):
            raise CaptureError(f"the backward takes {len(tangents)} output gradients for "
                               f"{len(self.joint.tangent_outputs)} differentiable outputs (a tcexport bug)")
        for p, k in zip(tangents, self.joint.tangent_outputs):
            self.sources[p.name] = ("grad", k)

    def _rewire_one(self, p: torch.fx.Node, f: torch.fx.Node) -> None:
        val = f.meta.get("val")
        if not isinstance(val, torch.Tensor):  # a SymInt: both calls bind the same symbols
            self._replace_uses(p, val)
            self.bw.graph.erase_node(p)
            return
        if f in self.primal_index:
            self._as_primal(p, self.primal_index[f])
            return
        chain = _view_chain(f, self.primal_index)
        if chain is not None:
            primal, views = chain
            p.replace_all_uses_with(self._recompute(views, self._bw_primal(self.primal_index[primal])))
            self.bw.graph.erase_node(p)
            return
        if any(f is o for o in self.user_outputs):
            self.sources[p.name] = ("forward", next(k for k, o in enumerate(self.user_outputs) if f is o))
            return
        if f not in self.kept:
            self.kept.append(f)
        self.sources[p.name] = ("forward", self.joint.num_outputs + self.kept.index(f))

    def _as_primal(self, p: torch.fx.Node, k: int) -> None:
        if k in self.bw_primals:
            p.replace_all_uses_with(self.bw_primals[k])
            self.bw.graph.erase_node(p)
            return
        self.bw_primals[k] = p
        spec = self.joint.primal_specs[k]
        if spec.kind == InputKind.USER_INPUT:
            self.sources[p.name] = ("input", self.user_index[spec.arg.name])

    def _bw_primal(self, k: int) -> torch.fx.Node:
        """The backward's placeholder for primal k (a weight or a forward input), made when first needed."""
        if k not in self.bw_primals:
            first = next(n for n in self.bw.graph.nodes if n.op != "placeholder")
            with self.bw.graph.inserting_before(first):
                node = self.bw.graph.placeholder(f"primal_{k}")
            node.meta.update(self.primals[k].meta)
            self._as_primal(node, k)
        return self.bw_primals[k]

    def _recompute(self, views: list, base: torch.fx.Node) -> torch.fx.Node:
        """Copies of the view ops ``views`` (first applies to the primal) on ``base``, before the backward's
        first computation; SymInt arguments become their values."""
        first = next(n for n in self.bw.graph.nodes if n.op != "placeholder")
        cur = base
        for v in views:
            args = (cur,) + tuple(map_aggregate(v.args[1:], _symint_value))
            with self.bw.graph.inserting_before(first):
                cur = self.bw.graph.call_function(v.target, args, map_aggregate(dict(v.kwargs), _symint_value))
            cur.meta.update({k: v.meta[k] for k in ("val", "stack_trace") if k in v.meta})
        return cur

    def _replace_uses(self, p: torch.fx.Node, value) -> None:
        for user in list(p.users):
            user.args = map_aggregate(user.args, lambda a: value if a is p else a)
            user.kwargs = map_aggregate(user.kwargs, lambda a: value if a is p else a)

    # --- the backward's outputs ----------------------------------------------------------------------

    def rewire_gradients(self) -> list[tuple[str, str]]:
        out = self.bw.graph.output_node()
        grads = list(out.args[0])
        if len(grads) != len(self.primals):
            raise CaptureError(f"the backward returns {len(grads)} gradients for {len(self.primals)} primals "
                               f"(a tcexport bug; please report it)")
        keep, what = [], []
        for k, (g, spec) in enumerate(zip(grads, self.joint.primal_specs)):
            name = self._gradient_of(spec)
            if name is None:
                continue
            keep.append(g if g is not None else self._zeros(self.primals[k], out))
            what.append(name)
        out.args = (tuple(keep),)
        return what

    def _gradient_of(self, spec) -> tuple[str, str] | None:
        if spec.kind == InputKind.PARAMETER and spec.target in self.joint.trainable:
            return ("weight", spec.target)
        if spec.kind == InputKind.USER_INPUT:
            name = self.input_names[self.user_index[spec.arg.name]]
            return ("input", name) if name in self.joint.grad_inputs else None
        return None

    def _zeros(self, primal: torch.fx.Node, out: torch.fx.Node) -> torch.fx.Node:
        """Zeros shaped like ``primal``: the gradient of a parameter that does not reach any output."""
        val = primal.meta["val"]
        shape = [_symint_value(s) for s in val.shape]
        with self.bw.graph.inserting_before(out):
            node = self.bw.graph.call_function(aten.zeros.default, (shape,), {"dtype": val.dtype})
        node.meta["val"] = val.detach() if hasattr(val, "detach") else val
        return node

    # --- constants and the result --------------------------------------------------------------------

    def lift_constants(self, gm: torch.fx.GraphModule) -> None:
        """Tensor constants the joint trace created (get_attr nodes) become weights, as lowering reads them."""
        for node in [n for n in gm.graph.nodes if n.op == "get_attr"]:
            key = CONSTANT_PREFIX + str(node.target)
            self.constants[key] = getattr(gm, str(node.target)).detach()
            first = next(n for n in gm.graph.nodes if n.op != "placeholder")
            with gm.graph.inserting_before(first):
                ph = gm.graph.placeholder(node.name + "_const")
            ph.meta.update(node.meta)
            ph.meta["constant_key"] = key
            node.replace_all_uses_with(ph)
            gm.graph.erase_node(node)

    def finish_forward(self) -> None:
        out = self.fw.graph.output_node()
        out.args = (tuple(self.user_outputs) + tuple(self.kept),)
        _clean(self.fw)

    @staticmethod
    def _placeholders(gm) -> list:
        return [n for n in gm.graph.nodes if n.op == "placeholder"]


def _symint_value(a):
    """A SymInt-valued node (``sym_size``) as its value; anything else unchanged."""
    if isinstance(a, torch.fx.Node) and not isinstance(a.meta.get("val"), torch.Tensor) and "val" in a.meta:
        return a.meta["val"]
    return a


def _view_chain(node: torch.fx.Node, primals: dict) -> tuple[torch.fx.Node, list] | None:
    """(primal, the view ops from it to ``node``) when ``node`` is views of a primal and nothing else."""
    chain = []
    cur = node
    while cur.op == "call_function" and cur.target in VIEW_OPS:
        others = [a for a in cur.all_input_nodes if a is not cur.args[0]]
        if not isinstance(cur.args[0], torch.fx.Node) or any(isinstance(o.meta.get("val"), torch.Tensor)
                                                             for o in others):
            return None
        chain.append(cur)
        cur = cur.args[0]
    if not chain or cur not in primals:
        return None
    return cur, list(reversed(chain))


def _clean(gm: torch.fx.GraphModule) -> None:
    gm.graph.eliminate_dead_code()
    gm.graph.lint()
    gm.recompile()


def _input_spec(node: torch.fx.Node, kind, target=None) -> InputSpec:
    return InputSpec(kind=kind, arg=TensorArgument(name=node.name), target=target,
                     persistent=True if kind == InputKind.BUFFER else None)


def _program(gm, specs: list, state_dict, constants) -> GraphProgram:
    outputs = [OutputSpec(kind=OutputKind.USER_OUTPUT, arg=TensorArgument(name=getattr(n, "name", str(n))),
                          target=None) for n in gm.graph.output_node().args[0]]
    return GraphProgram(gm, Signature(specs, outputs), state_dict, constants)


def rewire(joint: Joint, captured: Captured) -> TrainingGraphs:
    """The training forward and backward of ``joint`` as lowering inputs, sharing ``captured``'s symbols."""
    rw = _Rewirer(joint, list(captured.input_names))
    rw.rewire_saved()
    gradients = rw.rewire_gradients()
    rw.finish_forward()
    for gm in (rw.fw, rw.bw):
        rw.lift_constants(gm)
    _clean(rw.bw)
    ep = joint.program
    constants = {**ep.constants, **rw.constants}

    def weight_spec(node, spec_or_key):
        if isinstance(spec_or_key, str):
            return _input_spec(node, InputKind.CONSTANT_TENSOR, spec_or_key)
        return _input_spec(node, spec_or_key.kind, spec_or_key.target)

    fw_specs = []
    for node in rw._placeholders(rw.fw):
        key = node.meta.get("constant_key")
        fw_specs.append(weight_spec(node, key) if key else
                        _input_spec(node, joint.primal_specs[rw.primal_index[node]].kind,
                                    joint.primal_specs[rw.primal_index[node]].target))
    bw_specs, bw_names, sources = [], [], []
    primal_of = {n: k for k, n in rw.bw_primals.items()}
    for node in rw._placeholders(rw.bw):
        key = node.meta.get("constant_key")
        if key:
            bw_specs.append(weight_spec(node, key))
        elif node.name in rw.sources:
            bw_specs.append(_input_spec(node, InputKind.USER_INPUT))
            sources.append(rw.sources[node.name])
            bw_names.append(_backward_input_name(rw.sources[node.name], captured, joint))
        else:
            bw_specs.append(weight_spec(node, joint.primal_specs[primal_of[node]]))
    forward = _captured(captured, _program(rw.fw, fw_specs, ep.state_dict, constants), list(captured.input_names))
    backward = _captured(captured, _program(rw.bw, bw_specs, ep.state_dict, constants), bw_names)
    return TrainingGraphs(forward, backward, list(joint.trainable), list(joint.grad_inputs), sources, gradients,
                          joint.num_outputs)


def _backward_input_name(source: tuple[str, int], captured: Captured, joint: Joint) -> str:
    """The name a backward input has in the manifest: ``input.x``, ``saved.3`` / ``output.0``, ``grad.0``."""
    kind, k = source
    if kind == "input":
        return f"input.{captured.input_names[k]}"
    if kind == "grad":
        return f"grad.{k}"
    return f"output.{k}" if k < joint.num_outputs else f"saved.{k - joint.num_outputs}"


def _captured(base: Captured, program: GraphProgram, input_names: list[str]) -> Captured:
    return Captured(program, input_names, base.symbols, base.rename, base.model_file, [], [], None, [])
