"""The manifest's named graphs (format 1.8; SPEC §2a): one plan type, parsed by one function, for every graph.

A package runs one or more graphs over one set of weights and symbols: ``inference`` (what ``model(x)`` runs),
and for a package built with ``--backward`` a training ``forward`` (the model's outputs, then the activations the
backward needs) and a ``backward`` (gradients of the trainable weights and of the inputs named for gradients).
Since 1.10 a package may add one graph per method after its first (a ``decode`` next to a ``prefill``, which is
``inference``; formats/methods.py), each over its own symbols, with the CPU entry point the ABI names after it. Each graph has its inputs and
outputs and, per target, its part: ``cpu`` (the entry point of the CPU library that runs it, its workspace, its
kernels) and ``cuda`` (its launch list, arena, Triton source, index width, cubins per arch and its own kernels).

Packages before 1.8 held the inference graph in top-level fields (``plan``, ``cuda``, ``kernels[].cubins``) and the
training graphs in ``training``; ``legacy_graphs`` rewrites those into the 1.8 form, so that every package, of
any version, parses through ``parse_graphs`` into the same in-memory shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .expr import validate
from .abi import BACKWARD_ENTRY, CPU_ENTRY, TRAIN_FORWARD_ENTRY, method_entry
from .errors import FormatError
from .errors import clip as _clip
from .records import IDENT, check_tuning, need, parse_cubin, parse_launches, parse_spec, spec_json

INFERENCE, FORWARD, BACKWARD = "inference", "forward", "backward"
# the CPU entry point of each graph name, fixed by the ABI: a manifest never chooses the symbol that gets called
CPU_ENTRIES = {INFERENCE: CPU_ENTRY, FORWARD: TRAIN_FORWARD_ENTRY, BACKWARD: BACKWARD_ENTRY}
SOURCE_KINDS = ("input", "forward", "grad")   # a forward input, a training-forward output, an output's gradient
GRADIENT_KINDS = ("weight", "input")


@dataclass(frozen=True)
class CpuPart:
    """What the CPU library runs for a graph."""

    entry: str              # the C symbol (the ABI's name for the graph, CPU_ENTRIES)
    workspace_bytes: Any    # expression: the workspace this entry needs
    kernels: tuple = ()     # informational: its kernel names in launch order


@dataclass(frozen=True)
class CudaPart:
    """What the GPU runs for a graph: its launches in order, over its own inputs and outputs."""

    source: str             # member: the Triton source the cubins were built from ("" when unknown, before 1.8)
    triton: str             # the Triton version that generated the cubins ("" when unknown)
    index_bits: int         # default width of the launches' symbol parameters (32 or 64)
    workspace_bytes: Any    # expression: the arena the launches' temps live in
    launches: tuple         # records.Launch, in run order
    cubins: dict            # CUDA bundle isa ("sm_90") -> one records.Cubin per launch, in launch order
    kernels: tuple = ()     # informational: the GPU's own kernel names (1.8; before: not recorded)
    tuning: dict | None = None  # what --autotune measured and chose (informational: the launches hold the result)


@dataclass(frozen=True)
class Graph:
    name: str
    inputs: tuple           # TensorSpec in ABI order
    outputs: tuple          # TensorSpec in ABI order
    cpu: CpuPart | None = None
    cuda: CudaPart | None = None
    sources: tuple = ()     # per input: (kind in SOURCE_KINDS, index); empty: the caller passes the model's inputs
    gradients: tuple = ()   # per output: (kind in GRADIENT_KINDS, weight or input name); empty: not a backward

    # the CPU part's fields, read the way training graphs were before 1.8
    @property
    def entry(self) -> str | None:
        return self.cpu.entry if self.cpu is not None else None

    @property
    def workspace_bytes(self) -> Any:
        return self.cpu.workspace_bytes if self.cpu is not None else 0

    @property
    def kernels(self) -> tuple:
        return self.cpu.kernels if self.cpu is not None else ()


@dataclass(frozen=True)
class Training:
    """The training graphs of a package, as one view (formats before 1.8 had them as the ``training`` section)."""

    trainable: tuple        # weight names the backward returns gradients of
    forward: Graph          # outputs: the model's outputs (same specs), then the saved activations
    backward: Graph

    @property
    def sources(self) -> tuple:
        return self.backward.sources

    @property
    def gradients(self) -> tuple:
        return self.backward.gradients


@dataclass(frozen=True)
class Context:
    """What a graph is checked against: the rest of the manifest."""

    symbols: set
    inputs: tuple           # the model's inputs (what the guards bind)
    outputs: tuple          # the model's outputs
    weights: tuple
    trainable: tuple
    cuda_isas: tuple        # the isa of every CUDA bundle: each cuda part needs cubins for each
    cpu: bool               # the package has CPU bundles: each graph needs a cpu part
    members: dict = field(default_factory=dict)
    methods: frozenset = frozenset()  # names of the graphs that are methods (1.10): entry tc_run_method_<name>


# ---------------------------------------------------------------------------------------------------------
# JSON


def graph_json(g: Graph, inputs: tuple | None, outputs: tuple | None) -> dict:
    """A graph's 1.8 JSON object; its ``inputs``/``outputs`` only where they are not the model's (always where
    ``inputs``/``outputs`` are None: a method's graph, over symbols of its own)."""
    d: dict = {}
    if g.sources or inputs is None or tuple(g.inputs) != tuple(inputs):
        d["inputs"] = [{**spec_json(s), **({"from": list(src)} if g.sources else {})}
                       for s, src in zip(g.inputs, g.sources or [None] * len(g.inputs))]
    if g.gradients or outputs is None or tuple(g.outputs) != tuple(outputs):
        d["outputs"] = [{**spec_json(s), **({"of": list(of)} if g.gradients else {})}
                        for s, of in zip(g.outputs, g.gradients or [None] * len(g.outputs))]
    if g.cpu is not None:
        d["cpu"] = {"entry": g.cpu.entry, "workspace_bytes": g.cpu.workspace_bytes, "kernels": list(g.cpu.kernels)}
    if g.cuda is not None:
        d["cuda"] = cuda_json(g.cuda)
    return d


def cuda_json(c: CudaPart) -> dict:
    return {"source": c.source, "triton": c.triton, "index_bits": c.index_bits,
            "workspace_bytes": c.workspace_bytes, "launches": [l.to_json() for l in c.launches],
            "cubins": {isa: [x.to_json() for x in cs] for isa, cs in sorted(c.cubins.items())},
            "kernels": list(c.kernels), **({"tuning": c.tuning} if c.tuning is not None else {})}


# ---------------------------------------------------------------------------------------------------------
# parsing


def parse_graphs(table: Any, ctx: Context, skip: tuple = ()) -> dict[str, Graph]:
    """Every graph of ``graphs`` (name -> object) but those in ``skip`` (methods' graphs, parsed against their own
    symbols by ``parse_graph``), checked against the manifest (``ctx``) and each other."""
    if not isinstance(table, dict):
        raise FormatError(f"manifest: graphs should be an object (graph name -> graph), found {_clip(table)}")
    if INFERENCE not in table:
        raise FormatError("manifest: graphs has no 'inference' graph; rebuild the package")
    if (FORWARD in table) != (BACKWARD in table):
        raise FormatError("manifest: graphs should have both 'forward' and 'backward' or neither (a training "
                          "package needs both); rebuild the package")
    graphs = {name: parse_graph(name, d, ctx) for name, d in table.items() if name not in skip}
    if FORWARD in graphs:
        fw = graphs[FORWARD]
        if len(fw.outputs) < len(ctx.outputs) or any(not _same(a, b) for a, b in zip(fw.outputs, ctx.outputs)):
            raise FormatError("manifest: graphs.forward.outputs should start with the model's outputs (same dtypes "
                              "and shapes), then the saved activations")
        if (fw.cuda is None) != (graphs[BACKWARD].cuda is None):
            raise FormatError("manifest: graphs.forward and graphs.backward should both have 'cuda' or neither "
                              "(a CUDA training package needs both); rebuild the package")
    for g in graphs.values():
        _check_sources(g, graphs, ctx)
    return graphs


def parse_graph(name: Any, d: Any, ctx: Context) -> Graph:
    """One graph; FormatError names the bad field. The one parser of every graph of every package version."""
    if not isinstance(name, str) or not IDENT.match(name):
        raise FormatError(f"manifest: graphs has a graph named {_clip(name)}; a graph name is an identifier")
    where = f"graphs.{name}"
    if not isinstance(d, dict):
        raise FormatError(f"manifest: {where} should be an object")
    inputs = _specs(d, "inputs", where, ctx) if "inputs" in d else tuple(ctx.inputs)
    outputs = _specs(d, "outputs", where, ctx) if "outputs" in d else tuple(ctx.outputs)
    for group, specs in (("inputs", inputs), ("outputs", outputs)):
        if len({s.name for s in specs}) != len(specs):
            raise FormatError(f"manifest: {where}.{group} has duplicate names")
    backward = name == BACKWARD  # every input has a source, every output is a gradient
    sources = _sources(d, where) if backward or "inputs" in d and _has(d["inputs"], "from") else ()
    gradients = tuple(_parse_gradient(x, k, ctx, outputs[k], where) for k, x in enumerate(need(d, "outputs", list, where))) \
        if backward or "outputs" in d and _has(d["outputs"], "of") else ()
    cpu = _parse_cpu(d["cpu"], name, where, ctx) if "cpu" in d else None
    if ctx.cpu and cpu is None and (name in CPU_ENTRIES or name in ctx.methods):
        raise FormatError(f"manifest: {where} has no 'cpu' part, but the package has CPU kernel bundles; rebuild "
                          "the package")
    counts = {"input": len(inputs), "weight": len(ctx.weights), "output": len(outputs)}
    cuda = _parse_cuda(d["cuda"], f"{where}.cuda", ctx, counts) if "cuda" in d else None
    if ctx.cuda_isas and cuda is None and (name == INFERENCE or name in ctx.methods):
        raise FormatError(f"manifest: {where} has no 'cuda' part, but the package has CUDA bundles "
                          f"{list(ctx.cuda_isas)}; rebuild the package")
    return Graph(name, inputs, outputs, cpu, cuda, sources, gradients)


def _specs(d: dict, key: str, where: str, ctx: Context) -> tuple:
    return tuple(parse_spec(x, f"{where}.{key}[{i}]", ctx.symbols) for i, x in enumerate(need(d, key, list, where)))


def _has(items: list, key: str) -> bool:
    return any(isinstance(x, dict) and key in x for x in items)


def _sources(d: dict, where: str) -> tuple:
    """Each input's ``from`` ([kind, index]), checked for form here and against its source in _check_sources."""
    out = []
    for k, x in enumerate(need(d, "inputs", list, where)):
        src = x.get("from") if isinstance(x, dict) else None
        if not (isinstance(src, list) and len(src) == 2 and src[0] in SOURCE_KINDS and isinstance(src[1], int)
                and not isinstance(src[1], bool)):
            raise FormatError(f"manifest: {where}.inputs[{k}]: 'from' should be [kind, index] with kind one of "
                              f"{SOURCE_KINDS}, found {src!r:.80}")
        out.append((src[0], src[1]))
    return tuple(out)


def _check_sources(g: Graph, graphs: dict, ctx: Context) -> None:
    lists = {"input": ctx.inputs, "forward": graphs[FORWARD].outputs if FORWARD in graphs else (),
             "grad": ctx.outputs}
    for k, ((kind, index), spec) in enumerate(zip(g.sources, g.inputs)):
        where = f"manifest: graphs.{g.name}.inputs[{k}] ({spec.name})"
        if not 0 <= index < len(lists[kind]):
            raise FormatError(f"{where}: 'from' {[kind, index]} is out of range; there are {len(lists[kind])} "
                              f"{kind} tensors")
        if not _same(spec, lists[kind][index]):
            raise FormatError(f"{where}: its dtype and shape should equal those of {kind} {index} "
                              f"({lists[kind][index].name}); rebuild the package")


def _same(a, b) -> bool:
    return a.dtype == b.dtype and list(a.shape) == list(b.shape)


def _parse_gradient(x: Any, k: int, ctx: Context, spec, where: str) -> tuple[str, str]:
    where = f"manifest: {where}.outputs[{k}] ({spec.name})"
    of = x.get("of") if isinstance(x, dict) else None
    if not (isinstance(of, list) and len(of) == 2 and of[0] in GRADIENT_KINDS and isinstance(of[1], str)):
        raise FormatError(f"{where}: 'of' should be [kind, name] with kind one of {GRADIENT_KINDS}, found {of!r:.80}")
    kind, name = of
    named = {"weight": {w.name: w for w in ctx.weights}, "input": {s.name: s for s in ctx.inputs}}[kind]
    if name not in named or (kind == "weight" and name not in ctx.trainable):
        raise FormatError(f"{where}: 'of' names {kind} {name!r}, which is not a "
                          f"{'trainable weight' if kind == 'weight' else 'model input'}; rebuild the package")
    if not _same(spec, named[name]):
        raise FormatError(f"{where}: a gradient should have the dtype and shape of {kind} {name!r}")
    return kind, name


def _parse_cpu(c: Any, name: str, where: str, ctx: Context) -> CpuPart:
    where = f"{where}.cpu"
    if not isinstance(c, dict):
        raise FormatError(f"manifest: {where} should be an object")
    entry = need(c, "entry", str, where)
    fixed = CPU_ENTRIES.get(name) or (method_entry(name) if name in ctx.methods else None)
    if entry != fixed:
        raise FormatError(f"manifest: {where}.entry should be {fixed!r} (fixed by the ABI), found {entry!r:.80}; "
                          f"rebuild the package" if fixed is not None else
                          f"manifest: {where}: the CPU ABI has no entry point for a graph named {name!r}; "
                          f"upgrade tcexport to load this package")
    workspace = c.get("workspace_bytes", 0)
    validate(workspace, ctx.symbols, f"manifest: {where}.workspace_bytes")
    kernels = c.get("kernels", [])
    return CpuPart(entry, workspace, tuple(kernels) if isinstance(kernels, list) else ())


def _parse_cuda(c: Any, where: str, ctx: Context, counts: dict) -> CudaPart:
    if not isinstance(c, dict):
        raise FormatError(f"manifest: {where} should be an object")
    source = c.get("source", "")
    triton = c.get("triton", "")
    if not isinstance(source, str) or not isinstance(triton, str):
        raise FormatError(f"manifest: {where}.source and .triton should be strings")
    bits = c.get("index_bits", 32)
    if isinstance(bits, bool) or bits not in (32, 64):
        raise FormatError(f"manifest: {where}.index_bits should be 32 or 64, found {bits!r:.80}")
    workspace = c.get("workspace_bytes", 0)
    validate(workspace, ctx.symbols, f"manifest: {where}.workspace_bytes")
    launches = parse_launches(need(c, "launches", list, where), f"{where}.launches", ctx.symbols, counts, bits)
    names = [l.name for l in launches]
    cubins = {}
    for isa, cs in (need(c, "cubins", dict, where) if "cubins" in c else {}).items():
        if not isinstance(cs, list):
            raise FormatError(f"manifest: {where}.cubins[{isa!r}] should be a list of cubins")
        cubins[isa] = tuple(parse_cubin(x, f"{where}.cubins[{isa!r}][{j}]") for j, x in enumerate(cs))
        if [x.kernel for x in cubins[isa]] != names:
            raise FormatError(f"manifest: {where}.cubins[{isa!r}] should have one cubin per launch of "
                              f"{where}.launches, in the same order; rebuild the package")
    for isa in ctx.cuda_isas:
        if isa not in cubins:
            raise FormatError(f"manifest: {where}.cubins has no entry for the package's CUDA bundle {isa} "
                              f"(it has {sorted(cubins) or 'none'}); rebuild the package")
    for ref in ([source] if source else []) + [x.file for cs in cubins.values() for x in cs]:
        if ref not in ctx.members:
            raise FormatError(f"manifest: {where} refers to member {ref[:200]!r}, which is not listed in members")
    kernels = c.get("kernels", [])
    if not isinstance(kernels, list) or not all(isinstance(k, str) for k in kernels):
        raise FormatError(f"manifest: {where}.kernels should be a list of kernel names, found {_clip(kernels)}")
    tuning = check_tuning(c["tuning"], set(names), f"{where}.tuning") if "tuning" in c else None
    return CudaPart(source, triton, bits, workspace, launches, cubins, tuple(kernels), tuning)


# ---------------------------------------------------------------------------------------------------------
# packages before 1.8


def legacy_graphs(d: dict, bundles: list) -> dict:
    """The ``graphs`` object (1.8 form) that a manifest of 1.0-1.7 describes with its ``plan``, ``cuda``,
    ``kernels[].cubins`` and ``training`` sections; ``bundles``: (KernelBundle, its own cubins) per ``kernels``
    entry. Only rearranges: ``parse_graphs`` checks the result as it checks a 1.8 manifest's. Also the view that a
    1.8 manifest keeps of its inference graph for older readers (SPEC §8), which manifest.py checks against it."""
    plan = d.get("plan") if isinstance(d.get("plan"), dict) else {}
    cpu = any(b.target == "cpu" for b, _ in bundles)
    inference: dict = {}
    if cpu:
        inference["cpu"] = {"entry": CPU_ENTRY, "workspace_bytes": plan.get("workspace_bytes", 0),
                            "kernels": plan.get("kernels", [])}
    cuda_bundles = [(b, cubins) for b, cubins in bundles if b.is_cuda]
    c = d.get("cuda")
    if isinstance(c, dict):
        inference["cuda"] = {
            "source": cuda_bundles[0][0].file if cuda_bundles else "", "triton": c.get("triton"),
            "index_bits": c.get("index_bits"), "workspace_bytes": c.get("workspace_bytes", plan.get("workspace_bytes", 0)),
            "launches": c.get("launches"), "cubins": {b.isa: [x.to_json() for x in cubins] for b, cubins in cuda_bundles},
            **({"tuning": c["tuning"]} if "tuning" in c else {})}
    elif cuda_bundles:
        raise FormatError(f"manifest: kernels has CUDA bundle {cuda_bundles[0][0].target[:40]} but no 'cuda' "
                          "launch list; rebuild the package")
    graphs = {INFERENCE: inference}
    t = d.get("training")
    if t is not None:
        if not isinstance(t, dict):
            raise FormatError("manifest: training should be an object")
        for name in (FORWARD, BACKWARD):
            g = need(t, name, dict, "training")
            graphs[name] = {key: g[key] for key in ("inputs", "outputs", "cuda") if key in g and
                            (key != "inputs" or name == BACKWARD)}
            if name == BACKWARD:
                need(g, "inputs", list, f"training.{name}")
            need(g, "outputs", list, f"training.{name}")
            if cpu:
                graphs[name]["cpu"] = {"entry": g.get("entry"), "workspace_bytes": g.get("workspace_bytes", 0),
                                       "kernels": g.get("kernels", [])}
            if "cuda" in g and isinstance(g["cuda"], dict):
                graphs[name]["cuda"] = {**g["cuda"], "triton": g["cuda"].get("triton", "")}
    return graphs


def legacy_trainable(d: dict) -> tuple:
    t = d.get("training")
    if not isinstance(t, dict):
        return ()
    return _trainable(need(t, "trainable", list, "training"), "training.trainable")


def parse_trainable(values: Any, weights: tuple, where: str) -> tuple:
    """The trainable weights' names: each a weight of the package, once."""
    names = _trainable(values, where)
    known = {w.name for w in weights}
    for i, name in enumerate(names):
        if name not in known:
            raise FormatError(f"manifest: {where}[{i}] names {name!r}, which is not in weights.tensors; "
                              f"rebuild the package")
    return names


def _trainable(values: Any, where: str) -> tuple:
    if not isinstance(values, list) or not all(isinstance(t, str) for t in values):
        raise FormatError(f"manifest: {where} should be a list of weight names")
    if len(set(values)) != len(values):
        raise FormatError(f"manifest: {where} has duplicate names")
    return tuple(values)
