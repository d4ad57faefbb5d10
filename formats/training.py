"""The optional ``training`` section of a manifest (added in format 1.2; SPEC §2 and §6b).

A training package's CPU kernel library has two more entry points of the same C ABI as ``tc_run``: a training
forward (the model's inputs → its outputs, then the activations the backward needs) and a backward (those
activations, the forward's inputs and outputs it reads again, and the outputs' gradients → gradients of the
trainable weights and of the inputs named for gradients). This section names the entries and says where each
backward input comes from and what each backward output is the gradient of, so a loader can connect the calls.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from . import expr as ex
from .abi import BACKWARD_ENTRY, TRAIN_FORWARD_ENTRY
from .errors import FormatError

SOURCE_KINDS = ("input", "forward", "grad")   # a forward input, a training-forward output, an output's gradient
GRADIENT_KINDS = ("weight", "input")


@dataclass(frozen=True)
class GraphCuda:
    """A training graph's CUDA kernels (added in 1.3; SPEC §6b)."""

    source: str             # member: the Triton source the cubins were built from
    index_bits: int         # default width of the launches' symbol parameters (32 or 64)
    workspace_bytes: Any    # expression: the arena the launches' temps live in
    launches: tuple         # manifest.Launch, in run order; params index this graph's inputs and outputs
    cubins: dict            # CUDA bundle isa ("sm_90") -> one manifest.Cubin per launch, in launch order


@dataclass(frozen=True)
class TrainingGraph:
    entry: str              # the C symbol (same signature as tc_run)
    inputs: tuple           # TensorSpec in ABI order; the training forward's are manifest.inputs (empty here)
    outputs: tuple          # TensorSpec in ABI order
    workspace_bytes: Any    # expression: the workspace this entry needs
    kernels: tuple = ()     # informational: kernel names in launch order
    cuda: GraphCuda | None = None  # its CUDA kernels (1.3; absent: no CUDA training entry points)


@dataclass(frozen=True)
class Training:
    trainable: tuple        # weight names the backward returns gradients of
    forward: TrainingGraph  # outputs: manifest.outputs (same specs), then the saved activations
    backward: TrainingGraph
    sources: tuple          # per backward input: (kind in SOURCE_KINDS, index into its list)
    gradients: tuple        # per backward output: (kind in GRADIENT_KINDS, weight or input name)

    def to_json(self) -> dict:
        def graph(g: TrainingGraph, inputs: list | None = None, outputs: list | None = None) -> dict:
            d = {"entry": g.entry, "outputs": outputs or [_spec_json(s) for s in g.outputs],
                 "workspace_bytes": g.workspace_bytes, "kernels": list(g.kernels)}
            if inputs is not None:
                d["inputs"] = inputs
            if g.cuda is not None:
                d["cuda"] = _cuda_json(g.cuda)
            return d

        inputs = [{**_spec_json(s), "from": list(src)} for s, src in zip(self.backward.inputs, self.sources)]
        outputs = [{**_spec_json(s), "of": list(of)} for s, of in zip(self.backward.outputs, self.gradients)]
        return {"trainable": list(self.trainable), "forward": graph(self.forward),
                "backward": graph(self.backward, inputs, outputs)}


def _spec_json(s) -> dict:
    return {"name": s.name, "dtype": s.dtype, "shape": list(s.shape)}


def _cuda_json(c: GraphCuda) -> dict:
    from .manifest import CudaPlan, _cuda_json as plan_json

    launches = plan_json(CudaPlan(triton="", index_bits=c.index_bits, launches=c.launches,
                                  workspace_bytes=c.workspace_bytes))["launches"]
    return {"source": c.source, "index_bits": c.index_bits, "workspace_bytes": c.workspace_bytes,
            "launches": launches, "cubins": {isa: [x.to_json() for x in cs] for isa, cs in sorted(c.cubins.items())}}


def parse_training(d: Any, symbols: set, inputs: tuple, outputs: tuple, weights: tuple, kernels: tuple = (),
                   members: dict | None = None) -> Training:
    """Parse and check ``training`` against the rest of the manifest (``kernels``: its bundles, ``members``: its
    member table); FormatError names the bad field."""
    if not isinstance(d, dict):
        raise FormatError("manifest: training should be an object")
    from .manifest import _need

    trainable = tuple(_need(d, "trainable", list, "training"))
    if not all(isinstance(t, str) for t in trainable):
        raise FormatError("manifest: training.trainable should be a list of weight names")
    weight_specs = {w.name: w for w in weights}
    for i, name in enumerate(trainable):
        if name not in weight_specs:
            raise FormatError(f"manifest: training.trainable[{i}] names {name!r}, which is not in weights.tensors; "
                              f"rebuild the package")
    if len(set(trainable)) != len(trainable):
        raise FormatError("manifest: training.trainable has duplicate names")
    forward = _parse_graph(_need(d, "forward", dict, "training"), "training.forward", symbols, has_inputs=False)
    backward = _parse_graph(_need(d, "backward", dict, "training"), "training.backward", symbols, has_inputs=True)
    if len(forward.outputs) < len(outputs) or any(not _same(a, b) for a, b in zip(forward.outputs, outputs)):
        raise FormatError("manifest: training.forward.outputs should start with the model's outputs (same dtypes "
                          "and shapes), then the saved activations")
    lists = {"input": inputs, "forward": forward.outputs, "grad": outputs}
    sources = tuple(_parse_source(x, k, lists, backward.inputs[k])
                    for k, x in enumerate(_need(d["backward"], "inputs", list, "training.backward")))
    named = {"weight": weight_specs, "input": {s.name: s for s in inputs}}
    gradients = tuple(_parse_gradient(x, k, named, trainable, backward.outputs[k])
                      for k, x in enumerate(_need(d["backward"], "outputs", list, "training.backward")))
    if len({s.name for s in backward.outputs}) != len(backward.outputs):
        raise FormatError("manifest: training.backward.outputs has duplicate names")
    forward, backward = _with_cuda(d, forward, backward, symbols, len(inputs), len(weights), kernels, members)
    return Training(trainable, forward, backward, sources, gradients)


def _parse_graph(d: dict, where: str, symbols: set, has_inputs: bool) -> TrainingGraph:
    from .manifest import _need, _parse_spec

    entry = _need(d, "entry", str, where)
    fixed = BACKWARD_ENTRY if has_inputs else TRAIN_FORWARD_ENTRY
    if entry != fixed:  # the ABI names the entry points; a manifest never chooses the symbol that gets called
        raise FormatError(f"manifest: {where}.entry should be {fixed!r} (fixed by the ABI), found {entry!r:.80}; "
                          f"rebuild the package")
    inputs = tuple(_parse_spec(x, f"{where}.inputs[{i}]", symbols)
                   for i, x in enumerate(_need(d, "inputs", list, where))) if has_inputs else ()
    outputs = tuple(_parse_spec(x, f"{where}.outputs[{i}]", symbols)
                    for i, x in enumerate(_need(d, "outputs", list, where)))
    workspace = d.get("workspace_bytes", 0)
    ex.validate(workspace, symbols, f"manifest: {where}.workspace_bytes")
    kernels = d.get("kernels", [])
    return TrainingGraph(entry, inputs, outputs, workspace, tuple(kernels) if isinstance(kernels, list) else ())


def _same(a, b) -> bool:
    return a.dtype == b.dtype and list(a.shape) == list(b.shape)


def _parse_source(x: dict, k: int, lists: dict, spec) -> tuple[str, int]:
    where = f"manifest: training.backward.inputs[{k}] ({spec.name})"
    src = x.get("from") if isinstance(x, dict) else None
    if not (isinstance(src, list) and len(src) == 2 and src[0] in SOURCE_KINDS and isinstance(src[1], int)
            and not isinstance(src[1], bool)):
        raise FormatError(f"{where}: 'from' should be [kind, index] with kind one of {SOURCE_KINDS}, found {src!r:.80}")
    kind, index = src
    if not 0 <= index < len(lists[kind]):
        raise FormatError(f"{where}: 'from' {src} is out of range; there are {len(lists[kind])} {kind} tensors")
    if not _same(spec, lists[kind][index]):
        raise FormatError(f"{where}: its dtype and shape should equal those of {kind} {index} "
                          f"({lists[kind][index].name}); rebuild the package")
    return kind, index


def _parse_gradient(x: dict, k: int, named: dict, trainable: tuple, spec) -> tuple[str, str]:
    where = f"manifest: training.backward.outputs[{k}] ({spec.name})"
    of = x.get("of") if isinstance(x, dict) else None
    if not (isinstance(of, list) and len(of) == 2 and of[0] in GRADIENT_KINDS and isinstance(of[1], str)):
        raise FormatError(f"{where}: 'of' should be [kind, name] with kind one of {GRADIENT_KINDS}, found {of!r:.80}")
    kind, name = of
    if name not in named[kind] or (kind == "weight" and name not in trainable):
        raise FormatError(f"{where}: 'of' names {kind} {name!r}, which is not a "
                          f"{'trainable weight' if kind == 'weight' else 'model input'}; rebuild the package")
    if not _same(spec, named[kind][name]):
        raise FormatError(f"{where}: a gradient should have the dtype and shape of {kind} {name!r}")
    return kind, name


# ---------------------------------------------------------------------------------------------------------
# CUDA kernels of the training graphs (1.3)


def _with_cuda(d: dict, forward: TrainingGraph, backward: TrainingGraph, symbols: set, n_inputs: int,
               n_weights: int, kernels: tuple, members: dict | None) -> tuple[TrainingGraph, TrainingGraph]:
    """Both graphs with their ``cuda`` parsed (both or neither have one), checked against every CUDA bundle."""
    has = ["cuda" in d["forward"], "cuda" in d["backward"]]
    if has[0] != has[1]:
        raise FormatError("manifest: training.forward and training.backward should both have 'cuda' or neither "
                          "(a CUDA training package needs both entry points); rebuild the package")
    if not has[0]:
        return forward, backward
    isas = [k.isa for k in kernels if k.target.startswith("cuda:")]
    graphs = []
    for name, g, n_in in (("forward", forward, n_inputs), ("backward", backward, len(backward.inputs))):
        cuda = _parse_graph_cuda(d[name]["cuda"], f"training.{name}.cuda", symbols, n_in, n_weights,
                                 len(g.outputs), isas, members)
        graphs.append(replace(g, cuda=cuda))
    return graphs[0], graphs[1]


def _parse_graph_cuda(c: Any, where: str, symbols: set, n_inputs: int, n_weights: int, n_outputs: int,
                      isas: list, members: dict | None) -> GraphCuda:
    from .manifest import _need, _parse_cubin, _parse_cuda

    if not isinstance(c, dict):
        raise FormatError(f"manifest: {where} should be an object")
    source = _need(c, "source", str, where)
    bits = c.get("index_bits", 32)
    if bits not in (32, 64):
        raise FormatError(f"manifest: {where}.index_bits should be 32 or 64, found {bits!r:.80}")
    workspace = c.get("workspace_bytes", 0)
    ex.validate(workspace, symbols, f"manifest: {where}.workspace_bytes")
    try:  # the launch list has the form of the manifest's cuda.launches: one parser checks both
        plan = _parse_cuda({"triton": "", "index_bits": bits, "launches": _need(c, "launches", list, where)},
                           symbols, n_inputs, n_weights, n_outputs, workspace)
    except FormatError as e:
        raise FormatError(str(e).replace("manifest: cuda.", f"manifest: {where}.")) from None
    names = [l.name for l in plan.launches]
    table = _need(c, "cubins", dict, where) if "cubins" in c else {}
    cubins = {}
    for isa, cs in table.items():
        if not isinstance(cs, list):
            raise FormatError(f"manifest: {where}.cubins[{isa!r}] should be a list of cubins")
        cubins[isa] = tuple(_parse_cubin(x, f"{where}.cubins[{isa!r}][{j}]") for j, x in enumerate(cs))
        if [x.kernel for x in cubins[isa]] != names:
            raise FormatError(f"manifest: {where}.cubins[{isa!r}] should have one cubin per launch of "
                              f"{where}.launches, in the same order; rebuild the package")
    for isa in isas:
        if isa not in cubins:
            raise FormatError(f"manifest: {where}.cubins has no entry for the package's CUDA bundle {isa} "
                              f"(it has {sorted(cubins) or 'none'}); rebuild the package")
    for ref in [source] + [x.file for cs in cubins.values() for x in cs]:
        if members is not None and ref not in members:
            raise FormatError(f"manifest: {where} refers to member {ref!r}, which is not listed in members")
    return GraphCuda(source, bits, workspace, plan.launches, cubins)
