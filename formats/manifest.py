"""The manifest of a `.tcpkg` archive: its type, its JSON form, and its validation.

The manifest is ``manifest.json`` at the root of the archive. formats/SPEC.md is the normative text;
this module is its executable form, over records.py (its small records and field checks) and graphs.py (its
named graphs). Parsing validates everything the loader later relies on, so the loader never meets a malformed
field deep inside a call. Every version's manifest parses into the same shape: graphs by name.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from .expr import validate
from .dtypes import DTYPES  # noqa: F401  (re-exported: the manifest's dtype names)
from .errors import FormatError, VersionError
from .errors import clip as _clip
from .graphs import (BACKWARD, FORWARD, INFERENCE, Context, CudaPart, Graph, Training, graph_json, legacy_graphs,
                     legacy_trainable, parse_graphs, parse_trainable)
from .members import check_member_name
from .state import STATE_VERSION, StateSpec, parse_state  # noqa: F401 (StateSpec re-exported)
from .methods import FIRST_GRAPH, METHODS_VERSION, Method, method_names, parse_methods  # noqa: F401
from .records import (  # noqa: F401 (re-exported)
    MAX_SCRATCH,
    SCRATCH_ALIGN,
    SM_COUNT,
    Cubin,
    Guard,
    KernelBundle,
    Launch,
    Symbol,
    TensorSpec,
    bundle_json,
    check_tuning,
    need,
    parse_bundle,
    parse_guards,
    parse_spec,
    parse_symbols,
    spec_json,
)

FORMAT_NAME = "tcpkg"
FORMAT_VERSION = (1, 10)  # what this loader reads fully; 1.10 only with methods, 1.9 with state, else 1.8
GRAPHS_VERSION = (1, 8)  # packages of this version and later hold their graphs in ``graphs`` (SPEC §2a)
MANIFEST_NAME = "manifest.json"
CPU_ABI_VERSION = 1
CUDA_ABI_VERSION = 1
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class Manifest:
    format_version: tuple
    producer: dict
    model: str
    symbols: tuple
    inputs: tuple
    outputs: tuple
    output_structure: str  # "single" or "tuple"
    guards: tuple
    weights_file: str
    weights: tuple         # TensorSpec with static shapes, in ABI order
    kernels: tuple         # KernelBundle, in preference order
    graphs: dict           # graph name -> graphs.Graph: "inference", and "forward"/"backward" for training
    plan: dict             # informational (kernel names, peak bytes, ...) and the CPU plan's workspace_bytes
    sources: tuple
    members: dict = field(default_factory=dict)  # path -> {"sha256": hex, "size": int}
    onnx: dict | None = None  # optional: {"file": member, "opset": int}, the same model as ONNX
    trainable: tuple = ()  # weight names the backward graph returns gradients of
    model_version: str | None = None  # optional model.version: the user's version of the model (informational)
    metadata: dict = field(default_factory=dict)  # optional model.metadata: str -> str (informational)
    state: tuple = ()      # 1.9: state.StateSpec, the buffers forward writes (inputs and outputs paired)
    state_file: str | None = None  # 1.9: the member holding the initial values that are not zeros
    methods: tuple = ()    # 1.10: methods.Method, the first being the top level's (graph ``inference``)

    def symbol_names(self) -> list[str]:
        return [s.name for s in self.symbols]

    def method_names(self) -> list[str]:
        return [x.name for x in self.methods]

    def method(self, name: str) -> "Manifest":
        """Method ``name`` as a manifest of its own: its symbols, inputs, outputs, guards and state, and its graph
        as ``inference``; weights, kernels and members are the package's. What the loader runs a method from
        (guards, the CPU model, the CUDA model, the interpreter) sees one graph, as in a package without methods.
        KeyError when there is no such method."""
        x = next((x for x in self.methods if x.name == name), None)
        if x is None:
            raise KeyError(name)
        g = self.graphs[x.graph]
        return replace(self, symbols=x.symbols, inputs=g.inputs, outputs=g.outputs,
                       output_structure=x.output_structure, guards=x.guards, state=x.state,
                       graphs={INFERENCE: replace(g, name=INFERENCE)}, methods=())

    # --- the graphs, as callers read them -------------------------------------------------------------

    @property
    def inference(self) -> Graph:
        return self.graphs[INFERENCE]

    @property
    def cuda(self) -> CudaPart | None:
        """The inference graph's CUDA part (its launches, arena, cubins per arch), or None."""
        return self.graphs[INFERENCE].cuda

    @property
    def workspace_bytes(self) -> Any:
        """The CPU entry's workspace for inference (the CPU plan's, also for a package without CPU bundles)."""
        cpu = self.graphs[INFERENCE].cpu
        return cpu.workspace_bytes if cpu is not None else self.plan.get("workspace_bytes", 0)

    @property
    def training(self) -> Training | None:
        """The training graphs as one view, or None for an inference package."""
        if FORWARD not in self.graphs:
            return None
        return Training(self.trainable, self.graphs[FORWARD], self.graphs[BACKWARD])

    def cubins(self, isa: str, graph: str = INFERENCE) -> tuple:
        """``graph``'s cubins for the CUDA bundle ``isa`` (one per launch, in launch order)."""
        cuda = self.graphs[graph].cuda
        return cuda.cubins.get(isa, ()) if cuda is not None else ()

    # --- JSON -----------------------------------------------------------------------------------------

    def to_json(self) -> dict:
        """The manifest's JSON object: ``graphs`` (1.8), and for readers before 1.8 the view of the inference graph
        they read (``plan``, ``cuda``, each CUDA bundle's ``cubins``; SPEC §8), which parsing checks against it."""
        cuda = self.cuda
        later = {x.graph for x in self.methods[1:]}
        weights = {"file": self.weights_file, "tensors": [spec_json(s) for s in self.weights]}
        if self.trainable:
            weights["trainable"] = list(self.trainable)
        return {
            "format": FORMAT_NAME,
            "format_version": list(self.format_version),
            "producer": dict(self.producer),
            "model": model_json(self.model, self.model_version, self.metadata),
            "symbols": [asdict(s) for s in self.symbols],
            "inputs": [spec_json(s) for s in self.inputs],
            "outputs": [spec_json(s) for s in self.outputs],
            "output_structure": self.output_structure,
            "guards": [asdict(g) for g in self.guards],
            "weights": weights,
            "kernels": [bundle_json(k, self.cubins(k.isa) if k.is_cuda else ()) for k in self.kernels],
            "graphs": {name: graph_json(g, *((None, None) if name in later else (self.inputs, self.outputs)))
                       for name, g in self.graphs.items()},
            "plan": {**self.plan, "workspace_bytes": self.workspace_bytes},
            "sources": list(self.sources),
            "members": {k: dict(v) for k, v in sorted(self.members.items())},
            **({"onnx": dict(self.onnx)} if self.onnx is not None else {}),
            **({"cuda": _legacy_cuda_json(cuda)} if cuda is not None else {}),
            **({"state": [x.to_json() for x in self.state]} if self.state else {}),
            **({"state_file": self.state_file} if self.state_file is not None else {}),
            **({"methods": [x.to_json(k == 0) for k, x in enumerate(self.methods)]} if self.methods else {}),
        }

    def dumps(self) -> bytes:
        """Canonical bytes: sorted keys, fixed separators, so the same manifest always hashes the same."""
        return (json.dumps(self.to_json(), sort_keys=True, indent=1, ensure_ascii=True) + "\n").encode()


def _legacy_cuda_json(c: CudaPart) -> dict:
    """The inference graph's launch list as readers before 1.8 find it, top-level ``cuda``."""
    return {"triton": c.triton, "index_bits": c.index_bits, "workspace_bytes": c.workspace_bytes,
            "launches": [l.to_json() for l in c.launches], **({"tuning": c.tuning} if c.tuning is not None else {})}


# ---------------------------------------------------------------------------------------------------------
# parsing and validation


def parse_manifest(raw: bytes | str | dict) -> Manifest:
    """Parse and validate a manifest; raise FormatError / VersionError naming the bad field.

    Hostile input meets only FormatError: every field is type-checked before use. A defect the checks below miss
    still ends as a FormatError (the net at the end), never as a TypeError or KeyError from deep inside."""
    if isinstance(raw, (bytes, str)):
        try:
            d = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError) as e:
            raise FormatError(f"manifest.json is not valid JSON: {str(e)[:200]}") from None
    else:
        d = raw
    try:
        return _parse(d)
    except (TypeError, KeyError, AttributeError, ValueError, IndexError, RecursionError) as e:
        raise FormatError(f"manifest.json is malformed: an unexpected field type ({type(e).__name__}: "
                          f"{str(e)[:200]}); rebuild the package") from None


def _parse_version(d: Any) -> tuple:
    if not isinstance(d, dict) or d.get("format") != FORMAT_NAME:
        raise FormatError(f"manifest.json: field 'format' should be {FORMAT_NAME!r}; this is not a tcpkg archive")
    version = need(d, "format_version", list, "manifest")
    if len(version) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 16
                                    for v in version):
        raise FormatError(f"manifest: format_version should be [major, minor], found {_clip(version)}")
    if version[0] != FORMAT_VERSION[0]:
        raise VersionError(
            f"archive has format version {version[0]}.{version[1]}; this loader reads major version "
            f"{FORMAT_VERSION[0]} (up to {FORMAT_VERSION[0]}.{FORMAT_VERSION[1]} fully). "
            + ("Upgrade tcexport to load it." if version[0] > FORMAT_VERSION[0]
               else "Rebuild the package with this tcexport."))
    return tuple(version)


def _parse(d: Any) -> Manifest:
    version = _parse_version(d)
    symbols = parse_symbols(need(d, "symbols", list, "manifest"), "symbols")
    names = {s.name for s in symbols}
    inputs = tuple(parse_spec(x, f"inputs[{i}]", names) for i, x in enumerate(need(d, "inputs", list, "manifest")))
    outputs = tuple(parse_spec(x, f"outputs[{i}]", names) for i, x in enumerate(need(d, "outputs", list, "manifest")))
    for group, specs in (("inputs", inputs), ("outputs", outputs)):
        if len({s.name for s in specs}) != len(specs):
            raise FormatError(f"manifest: {group} has duplicate names")
    structure = need(d, "output_structure", str, "manifest")

    guards = parse_guards(need(d, "guards", list, "manifest"), names, "guards")

    w = need(d, "weights", dict, "manifest")
    weights_file = need(w, "file", str, "weights")
    weights = tuple(parse_spec(x, f"weights.tensors[{i}]", names, static=True)
                    for i, x in enumerate(need(w, "tensors", list, "weights")))
    if len({s.name for s in weights}) != len(weights):
        raise FormatError("manifest: weights.tensors has duplicate names")

    bundles = [parse_bundle(k, f"kernels[{i}]") for i, k in enumerate(need(d, "kernels", list, "manifest"))]
    plan = dict(need(d, "plan", dict, "manifest"))
    plan["workspace_bytes"] = plan.get("workspace_bytes", 0)
    validate(plan["workspace_bytes"], names, "manifest: plan.workspace_bytes")

    members = _parse_members(need(d, "members", dict, "manifest"))
    model = need(d, "model", dict, "manifest")
    model_name = model.get("name", "")
    if not isinstance(model_name, str):
        raise FormatError(f"manifest: model.name should be a string, found {_clip(model_name)}")
    model_version, metadata = parse_model_info(model)
    onnx = d.get("onnx")
    if onnx is not None and (not isinstance(onnx, dict) or not isinstance(onnx.get("file"), str)
                             or not isinstance(onnx.get("opset"), int)):
        raise FormatError(f"manifest: onnx should be {{'file': member, 'opset': int}}, found {_clip(onnx)}")
    sources = need(d, "sources", list, "manifest")
    if not all(isinstance(x, str) for x in sources):
        raise FormatError(f"manifest: sources should be a list of member names, found {_clip(sources)}")
    kernels = tuple(b for b, _ in bundles)
    for ref in [weights_file] + [k.file for k in kernels] + sources + ([onnx["file"]] if onnx is not None else []):
        if ref not in members:
            raise FormatError(f"manifest: refers to member {ref[:200]!r}, which is not listed in members")

    state_file = d.get("state_file") if version >= STATE_VERSION else None
    state = parse_state(d.get("state", []), state_file, inputs, outputs, members) \
        if version >= STATE_VERSION else ()
    own = len(outputs) - len(state)  # output_structure counts the model's own outputs, not the state's
    if structure not in ("single", "tuple") or (structure == "single" and own != 1):
        raise FormatError(f"manifest: output_structure {structure[:40]!r} does not fit {own} output(s)")
    graphs_json = version >= GRAPHS_VERSION
    trainable = parse_trainable(w.get("trainable", []), weights, "weights.trainable") if graphs_json else \
        parse_trainable(list(legacy_trainable(d)), weights, "training.trainable")
    ctx = Context(names, inputs, outputs, weights, trainable,
                  tuple(k.isa for k in kernels if k.is_cuda), any(k.target == "cpu" for k in kernels), members)
    legacy = parse_graphs(legacy_graphs(d if not graphs_json else {k: v for k, v in d.items() if k != "training"},
                                        bundles), ctx)
    names_of_methods = method_names(d["methods"]) if version >= METHODS_VERSION and "methods" in d else ()
    if graphs_json:
        graphs = parse_graphs(d.get("graphs"), ctx, skip=names_of_methods[1:])
        _check_view(legacy[INFERENCE], graphs[INFERENCE])
    else:
        graphs = legacy
    if BACKWARD not in graphs and trainable:
        raise FormatError("manifest: weights.trainable names weights, but the package has no backward graph")
    methods = _methods(d, names_of_methods, Method(names_of_methods[0], FIRST_GRAPH, symbols, structure, guards, state),
                       graphs, ctx, state_file) if names_of_methods else ()
    state_file = state_file if any(x.state for x in methods) or state else None
    return Manifest(
        format_version=version, producer=dict(need(d, "producer", dict, "manifest")),
        model=model_name, symbols=symbols, inputs=inputs, outputs=outputs,
        output_structure=structure, guards=tuple(guards), weights_file=weights_file,
        weights=weights, kernels=kernels, graphs=graphs, plan=plan, sources=tuple(sources), members=members,
        onnx=dict(onnx) if onnx is not None else None, trainable=trainable, model_version=model_version,
        metadata=metadata, state=state, state_file=state_file, methods=methods)


def _methods(d: dict, names: tuple, first: Method, graphs: dict, ctx: Context, state_file) -> tuple:
    """The methods of a 1.10 manifest (SPEC §2c), each later one's graph parsed into ``graphs``."""
    if FORWARD in graphs:
        raise FormatError("manifest: a package with methods has no training graphs; rebuild the package")
    return parse_methods(d["methods"], first, d.get("graphs"), graphs, replace(ctx, methods=frozenset(names[1:])),
                         state_file)


MAX_METADATA_ENTRIES = 256
MAX_METADATA_KEY = 128
MAX_METADATA_VALUE = 4096
_METADATA_KEY = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:/-]*$")


def model_json(name: str, version: str | None, metadata: dict) -> dict:
    """``model``: its name, and ``version`` / ``metadata`` only when set (so packages without them keep their
    bytes)."""
    out: dict = {"name": name}
    if version is not None:
        out["version"] = version
    if metadata:
        out["metadata"] = dict(sorted(metadata.items()))
    return out


def parse_model_info(model: dict) -> tuple[str | None, dict]:
    """``model.version`` (a non-empty string, default absent) and ``model.metadata`` (string keys and values,
    default ``{}``), checked (SPEC §2). Informational: nothing a loader runs depends on them."""
    version = model.get("version")
    if version is not None and (not isinstance(version, str) or not version
                                or len(version) > MAX_METADATA_VALUE):
        raise FormatError(f"manifest: model.version should be a non-empty string of at most {MAX_METADATA_VALUE} "
                          f"characters, found {_clip(version)}")
    metadata = model.get("metadata", {})
    if not isinstance(metadata, dict) or len(metadata) > MAX_METADATA_ENTRIES:
        raise FormatError(f"manifest: model.metadata should be an object of at most {MAX_METADATA_ENTRIES} "
                          f"string entries, found {_clip(metadata)}")
    for key, value in metadata.items():
        check_metadata_entry(key, value, "manifest: model.metadata")
    return version, dict(metadata)


def check_metadata_entry(key, value, where: str) -> None:
    """A metadata key (``[A-Za-z0-9_][A-Za-z0-9_.:/-]*``, at most 128 characters) and its string value (at most
    4096 characters); ``where`` names the caller for the message (the manifest, or ``--meta``)."""
    if not isinstance(key, str) or not _METADATA_KEY.match(key) or len(key) > MAX_METADATA_KEY:
        raise FormatError(f"{where}: key {_clip(key)} should match [A-Za-z0-9_][A-Za-z0-9_.:/-]* and be at most "
                          f"{MAX_METADATA_KEY} characters")
    if not isinstance(value, str) or len(value) > MAX_METADATA_VALUE:
        raise FormatError(f"{where}: the value of {key!r} should be a string of at most {MAX_METADATA_VALUE} "
                          f"characters, found {_clip(value)}")


def _check_view(view: Graph, graph: Graph) -> None:
    """A 1.8 manifest's view for older readers (``plan.workspace_bytes``, ``cuda``, bundles' ``cubins``) must say
    what ``graphs.inference`` says: one manifest never runs one thing in one loader and another in another."""
    same_cpu = view.cpu is None or graph.cpu is None or view.cpu.workspace_bytes == graph.cpu.workspace_bytes
    a, b = view.cuda, graph.cuda
    same_cuda = (a is None) == (b is None) and (a is None or (
        a.launches, a.workspace_bytes, a.index_bits, a.triton, a.tuning, a.cubins) ==
        (b.launches, b.workspace_bytes, b.index_bits, b.triton, b.tuning, b.cubins))
    if not same_cpu or not same_cuda:
        field_ = "plan.workspace_bytes" if not same_cpu else "cuda (or kernels[].cubins)"
        raise FormatError(f"manifest: {field_}, kept for loaders before 1.8, disagrees with graphs.inference; the "
                          "manifest was edited. Rebuild the package.")


def _parse_members(members: dict) -> dict:
    """``members`` (SPEC §7): safe names, never the manifest itself, 64 hex digits, a non-negative size."""
    out = {}
    for path, info in members.items():
        if path == MANIFEST_NAME:
            raise FormatError(f"manifest: members lists {path!r}, which is never listed (SPEC §7)")
        try:
            check_member_name(path)
        except FormatError as e:
            raise FormatError(f"manifest: members: {e}") from None
        if not isinstance(info, dict) or not isinstance(info.get("sha256"), str) \
                or not _HEX64.match(info["sha256"].lower()) or not isinstance(info.get("size"), int) \
                or isinstance(info["size"], bool) or not 0 <= info["size"] < 1 << 48:
            raise FormatError(f"manifest: members[{path[:200]!r}] should be {{'sha256': 64 hex digits, 'size': "
                              f"int >= 0}}, found {_clip(info)}")
        out[path] = info
    return out

