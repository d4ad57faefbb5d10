"""Manifest types of a `.tcpkg` archive, their JSON form, and their validation.

The manifest is ``manifest.json`` at the root of the archive. formats/SPEC.md is the normative text;
this module is its executable form. Parsing validates everything the loader later relies on, so the
loader never meets a malformed field deep inside a call.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from . import expr as ex
from .abi import check_bundle
from .dtypes import DTYPES
from .errors import FormatError, VersionError, clip as _clip
from .members import check_member_name

FORMAT_NAME = "tcpkg"
FORMAT_VERSION = (1, 7)
# a launch grid may name this besides the model's symbols (1.6, SPEC §6a): the GPU's multiprocessor count, bound
# by the loader. A persistent kernel's grid is min(SM_COUNT, its tiles): one program per SM walks its tiles.
SM_COUNT = "__sm_count"
SCRATCH_ALIGN = 256  # the loader's scratch buffer starts at a multiple of this (cuMemAlloc's alignment)
MAX_SCRATCH = 1 << 20  # per program: far above what a kernel needs (Triton's descriptors take 128 bytes each)
MANIFEST_NAME = "manifest.json"
CPU_ABI_VERSION = 1
CUDA_ABI_VERSION = 1
PARAM_KINDS = ("input", "weight", "output", "temp", "symbol", "error")
MAX_WARPS = 32           # 1024 threads, the most a CUDA block may have
MAX_SHARED = 1 << 20     # bytes of dynamic shared memory a launch may ask for (far above any GPU's limit)
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,255}$")



@dataclass(frozen=True)
class Symbol:
    name: str
    min: int
    max: int | None  # None: no upper bound


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    shape: tuple  # each dim: int or expression (see expr.py)

    def shape_text(self) -> str:
        return "[" + ", ".join(ex.to_text(d) for d in self.shape) + "]"

    def __repr__(self) -> str:
        return f"TensorSpec({self.name}: {self.dtype}{self.shape_text()})"


@dataclass(frozen=True)
class Guard:
    expr: Any  # boolean expression over symbols
    message: str


@dataclass(frozen=True)
class Cubin:
    kernel: str           # the launch (cuda.launches[].name) this binary runs
    file: str             # archive member holding the cubin
    function: str         # the entry symbol inside it
    shared: int           # dynamic shared memory bytes to request at launch
    num_warps: int
    dependent: bool = False  # it may be launched as a programmatic dependent (1.5; SPEC §6a)
    global_scratch: int = 0  # bytes of global memory each program needs (1.6; SPEC §6a)

    def to_json(self) -> dict:
        """Its JSON object; ``dependent`` and ``global_scratch`` only where set, so earlier packages' manifests
        keep their bytes."""
        out = asdict(self)
        for key in ("dependent", "global_scratch"):
            if not out[key]:
                del out[key]
        return out


@dataclass(frozen=True)
class KernelBundle:
    target: str           # "cpu" or "cuda:sm_XX"
    isa: str              # e.g. "x86-64-v3"; the loader picks the first whose `requires` this CPU has
    requires: tuple       # CPU feature flags as /proc/cpuinfo spells them
    file: str             # archive member holding the shared library
    abi: int
    entry: str
    libraries: tuple      # shared libraries the code needs at load time, e.g. "libgomp.so.1"
    blas: tuple           # BLAS routines the loader must pass in, e.g. "sgemm"
    cubins: tuple = ()    # CUDA bundles: one Cubin per launch, in launch order


@dataclass(frozen=True)
class Launch:
    """One CUDA kernel launch: its parameters in argument order, each {"kind": ..., "value": ...} (an input,
    weight or output index; a temp's byte offset in the arena, an expression; a symbol name; the error word),
    and its grid as three expressions."""

    name: str
    params: tuple
    grid: tuple
    block: dict           # the constexpr block sizes it was compiled with (informational)
    num_warps: int
    num_stages: int
    index_bits: int = 32  # the width of its symbol parameters (32 or 64)


@dataclass(frozen=True)
class CudaPlan:
    triton: str           # the Triton version that generated the cubins
    index_bits: int
    launches: tuple
    workspace_bytes: Any = None  # expression: the launches' arena (1.3; before: the top-level workspace_bytes)
    tuning: dict | None = None   # what --autotune measured and chose (1.4; informational: launches hold the result)


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
    kernels: tuple
    workspace_bytes: Any   # expression
    plan: dict             # informational: kernel names in launch order, planned peak, ...
    sources: tuple
    members: dict = field(default_factory=dict)  # path -> {"sha256": hex, "size": int}
    onnx: dict | None = None  # optional: {"file": member, "opset": int}, the same model as ONNX
    cuda: CudaPlan | None = None  # present when the package has CUDA bundles
    training: Any = None      # formats.training.Training: the training forward and backward (added in 1.2)

    def symbol_names(self) -> list[str]:
        return [s.name for s in self.symbols]

    def to_json(self) -> dict:
        d = asdict(self)
        return {
            "format": FORMAT_NAME,
            "format_version": list(self.format_version),
            "producer": d["producer"],
            "model": {"name": self.model},
            "symbols": [asdict(s) for s in self.symbols],
            "inputs": [_spec_json(s) for s in self.inputs],
            "outputs": [_spec_json(s) for s in self.outputs],
            "output_structure": self.output_structure,
            "guards": [asdict(g) for g in self.guards],
            "weights": {"file": self.weights_file, "tensors": [_spec_json(s) for s in self.weights]},
            "kernels": [_bundle_json(k) for k in self.kernels],
            "plan": {**self.plan, "workspace_bytes": self.workspace_bytes},
            "sources": list(self.sources),
            "members": {k: dict(v) for k, v in sorted(self.members.items())},
            **({"onnx": dict(self.onnx)} if self.onnx is not None else {}),
            **({"cuda": _cuda_json(self.cuda)} if self.cuda is not None else {}),
            **({"training": self.training.to_json()} if self.training is not None else {}),
        }

    def dumps(self) -> bytes:
        """Canonical bytes: sorted keys, fixed separators, so the same manifest always hashes the same."""
        return (json.dumps(self.to_json(), sort_keys=True, indent=1, ensure_ascii=True) + "\n").encode()


def _spec_json(s: TensorSpec) -> dict:
    return {"name": s.name, "dtype": s.dtype, "shape": list(s.shape)}


def _bundle_json(k: KernelBundle) -> dict:
    d = asdict(k)
    out = {key: list(v) if isinstance(v, tuple) else v for key, v in d.items()}
    out["cubins"] = [c.to_json() for c in k.cubins]
    if not k.cubins:
        del out["cubins"]
    return out


def _cuda_json(c: CudaPlan) -> dict:
    return {"triton": c.triton, "index_bits": c.index_bits, "workspace_bytes": c.workspace_bytes,
            "launches": [{"name": l.name, "params": [dict(p) for p in l.params], "grid": list(l.grid),
                          "block": dict(l.block), "num_warps": l.num_warps, "num_stages": l.num_stages,
                          "index_bits": l.index_bits}
                         for l in c.launches],
            **({"tuning": c.tuning} if c.tuning is not None else {})}


# ---------------------------------------------------------------------------------------------------------
# parsing and validation


def _need(d: dict, key: str, typ, where: str):
    if key not in d:
        raise FormatError(f"manifest: {where} has no field {key!r}")
    v = d[key]
    if typ is int and isinstance(v, bool) or not isinstance(v, typ):
        raise FormatError(f"manifest: {where}.{key} should be {getattr(typ, '__name__', typ)}, "
                          f"found {type(v).__name__} {v!r:.80}")
    return v


def _parse_spec(d: Any, where: str, symbols: set[str], static: bool = False) -> TensorSpec:
    if not isinstance(d, dict):
        raise FormatError(f"manifest: {where} should be an object, found {d!r:.80}")
    name = _need(d, "name", str, where)
    dtype = _need(d, "dtype", str, where)
    if dtype not in DTYPES:
        raise FormatError(f"manifest: {where} ({name}) has dtype {dtype!r}; known: {sorted(DTYPES)}")
    shape = _need(d, "shape", list, where)
    for i, dim in enumerate(shape):
        if static and (not isinstance(dim, int) or isinstance(dim, bool) or dim < 0):
            raise FormatError(f"manifest: {where} ({name}) dim {i} should be a non-negative integer, found {dim!r}")
        ex.validate(dim, symbols, f"manifest: {where} ({name}) dim {i}")
    return TensorSpec(name, dtype, tuple(shape))


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


def _parse(d: Any) -> Manifest:
    if not isinstance(d, dict) or d.get("format") != FORMAT_NAME:
        raise FormatError(f"manifest.json: field 'format' should be {FORMAT_NAME!r}; this is not a tcpkg archive")
    version = _need(d, "format_version", list, "manifest")
    if len(version) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 16
                                    for v in version):
        raise FormatError(f"manifest: format_version should be [major, minor], found {_clip(version)}")
    if version[0] != FORMAT_VERSION[0]:
        raise VersionError(
            f"archive has format version {version[0]}.{version[1]}; this loader reads major version "
            f"{FORMAT_VERSION[0]} (up to {FORMAT_VERSION[0]}.{FORMAT_VERSION[1]} fully). "
            + ("Upgrade tcexport to load it." if version[0] > FORMAT_VERSION[0]
               else "Rebuild the package with this tcexport."))
    symbols = _parse_symbols(_need(d, "symbols", list, "manifest"))
    names = {s.name for s in symbols}
    inputs = tuple(_parse_spec(x, f"inputs[{i}]", names) for i, x in enumerate(_need(d, "inputs", list, "manifest")))
    outputs = tuple(_parse_spec(x, f"outputs[{i}]", names) for i, x in enumerate(_need(d, "outputs", list, "manifest")))
    for group, specs in (("inputs", inputs), ("outputs", outputs)):
        if len({s.name for s in specs}) != len(specs):
            raise FormatError(f"manifest: {group} has duplicate names")
    structure = _need(d, "output_structure", str, "manifest")
    if structure not in ("single", "tuple") or (structure == "single" and len(outputs) != 1):
        raise FormatError(f"manifest: output_structure {structure[:40]!r} does not fit {len(outputs)} output(s)")

    guards = []
    for i, g in enumerate(_need(d, "guards", list, "manifest")):
        if not isinstance(g, dict):
            raise FormatError(f"manifest: guards[{i}] should be an object")
        ex.validate(g.get("expr"), names, f"manifest: guards[{i}].expr")
        guards.append(Guard(g["expr"], _need(g, "message", str, f"guards[{i}]")))

    w = _need(d, "weights", dict, "manifest")
    weights_file = _need(w, "file", str, "weights")
    weights = tuple(_parse_spec(x, f"weights.tensors[{i}]", names, static=True)
                    for i, x in enumerate(_need(w, "tensors", list, "weights")))
    if len({s.name for s in weights}) != len(weights):
        raise FormatError("manifest: weights.tensors has duplicate names")

    kernels = tuple(_parse_bundle(k, f"kernels[{i}]") for i, k in enumerate(_need(d, "kernels", list, "manifest")))
    plan = dict(_need(d, "plan", dict, "manifest"))
    workspace = plan.pop("workspace_bytes", 0)
    ex.validate(workspace, names, "manifest: plan.workspace_bytes")
    cuda = _parse_cuda(d["cuda"], names, len(inputs), len(weights), len(outputs), workspace) if "cuda" in d else None
    for i, k in enumerate(kernels):
        if k.target.startswith("cuda:"):
            if cuda is None or [c.kernel for c in k.cubins] != [l.name for l in cuda.launches]:
                raise FormatError(f"manifest: kernels[{i}] ({k.target[:40]}) should have one cubin per "
                                  "cuda.launches entry, in the same order")

    members = _parse_members(_need(d, "members", dict, "manifest"))
    model = _need(d, "model", dict, "manifest")
    model_name = model.get("name", "")
    if not isinstance(model_name, str):
        raise FormatError(f"manifest: model.name should be a string, found {_clip(model_name)}")
    onnx = d.get("onnx")
    if onnx is not None and (not isinstance(onnx, dict) or not isinstance(onnx.get("file"), str)
                             or not isinstance(onnx.get("opset"), int)):
        raise FormatError(f"manifest: onnx should be {{'file': member, 'opset': int}}, found {_clip(onnx)}")
    sources = _need(d, "sources", list, "manifest")
    if not all(isinstance(x, str) for x in sources):
        raise FormatError(f"manifest: sources should be a list of member names, found {_clip(sources)}")
    referenced = [weights_file] + [k.file for k in kernels] + sources
    referenced += [c.file for k in kernels for c in k.cubins]
    referenced += [onnx["file"]] if onnx is not None else []
    for ref in referenced:
        if ref not in members:
            raise FormatError(f"manifest: refers to member {ref[:200]!r}, which is not listed in members")

    training = None
    if "training" in d:
        from .training import parse_training
        training = parse_training(d["training"], names, inputs, outputs, weights, kernels, members)
    return Manifest(
        format_version=tuple(version), producer=dict(_need(d, "producer", dict, "manifest")),
        model=model_name, symbols=symbols, inputs=inputs, outputs=outputs,
        output_structure=structure, guards=tuple(guards), weights_file=weights_file,
        weights=weights, kernels=kernels, workspace_bytes=workspace, plan=plan,
        sources=tuple(sources), members=members,
        onnx=dict(onnx) if onnx is not None else None, cuda=cuda, training=training)


def _parse_symbols(sym_list: list) -> tuple:
    symbols = []
    for i, s in enumerate(sym_list):
        where = f"symbols[{i}]"
        if not isinstance(s, dict):
            raise FormatError(f"manifest: {where} should be an object")
        name = _need(s, "name", str, where)
        ex.validate(name, None, f"manifest: {where}.name")
        if name == SM_COUNT:
            raise FormatError(f"manifest: {where}: {SM_COUNT!r} is reserved for the GPU's multiprocessor count in "
                              "launch grids; rename the dynamic dim")
        lo = _need(s, "min", int, where)
        hi = s.get("max")
        if hi is not None and (not isinstance(hi, int) or isinstance(hi, bool) or hi < lo):
            raise FormatError(f"manifest: {where} ({name}) max should be null or an integer >= min {lo}, found "
                              f"{_clip(hi)}")
        for bound in (lo, hi):
            if bound is not None:
                ex.validate(bound, None, f"manifest: {where} ({name}) range")
        symbols.append(Symbol(name, lo, hi))
    if len({s.name for s in symbols}) != len(symbols):
        raise FormatError("manifest: symbols has duplicate names")
    return tuple(symbols)


def _strings(k: dict, key: str, where: str) -> tuple:
    values = _need(k, key, list, where)
    if not all(isinstance(v, str) and len(v) <= 256 for v in values):
        raise FormatError(f"manifest: {where}.{key} should be a list of short strings, found {_clip(values)}")
    return tuple(values)


def _parse_bundle(k: Any, where: str) -> KernelBundle:
    if not isinstance(k, dict):
        raise FormatError(f"manifest: {where} should be an object")
    cubins = k.get("cubins", [])
    if not isinstance(cubins, list):
        raise FormatError(f"manifest: {where}.cubins should be a list, found {_clip(cubins)}")
    bundle = KernelBundle(
        target=_need(k, "target", str, where), isa=_need(k, "isa", str, where),
        requires=_strings(k, "requires", where), file=_need(k, "file", str, where),
        abi=_need(k, "abi", int, where), entry=_need(k, "entry", str, where),
        libraries=_strings(k, "libraries", where), blas=_strings(k, "blas", where),
        cubins=tuple(_parse_cubin(c, f"{where}.cubins[{j}]") for j, c in enumerate(cubins)))
    check_bundle(bundle.target, bundle.entry, bundle.libraries, where)
    return bundle


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


def _parse_cubin(c: Any, where: str) -> Cubin:
    if not isinstance(c, dict):
        raise FormatError(f"manifest: {where} should be an object")
    function, shared, warps = _need(c, "function", str, where), _need(c, "shared", int, where), \
        _need(c, "num_warps", int, where)
    if not _IDENT.match(function):
        raise FormatError(f"manifest: {where}.function should be a kernel's symbol name, found {_clip(function)}")
    if not 0 <= shared <= MAX_SHARED or not 1 <= warps <= MAX_WARPS:
        raise FormatError(f"manifest: {where}: shared {shared} should be 0..{MAX_SHARED} bytes and num_warps "
                          f"{warps} 1..{MAX_WARPS}")
    return Cubin(kernel=_need(c, "kernel", str, where), file=_need(c, "file", str, where), function=function,
                 shared=shared, num_warps=warps,
                 dependent=_need(c, "dependent", bool, where) if "dependent" in c else False,
                 global_scratch=_scratch(c, where))


def _scratch(c: dict, where: str) -> int:
    value = c.get("global_scratch", 0)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SCRATCH:
        raise FormatError(f"manifest: {where}.global_scratch should be a byte count from 0 to {MAX_SCRATCH}, "
                          f"found {value!r:.40}")
    return value


def _parse_cuda(c: Any, symbols: set, n_inputs: int, n_weights: int, n_outputs: int, workspace) -> CudaPlan:
    if not isinstance(c, dict):
        raise FormatError("manifest: cuda should be an object")
    launches = []
    counts = {"input": n_inputs, "weight": n_weights, "output": n_outputs}
    for i, l in enumerate(_need(c, "launches", list, "cuda")):
        where = f"cuda.launches[{i}]"
        if not isinstance(l, dict):
            raise FormatError(f"manifest: {where} should be an object")
        params = []
        for j, p in enumerate(_need(l, "params", list, where)):
            pw = f"{where}.params[{j}]"
            if not isinstance(p, dict) or p.get("kind") not in PARAM_KINDS:
                raise FormatError(f"manifest: {pw} should be {{'kind': one of {PARAM_KINDS}, 'value': ...}}, "
                                  f"found {p!r:.80}")
            kind, value = p["kind"], p.get("value")
            if kind in counts and (not isinstance(value, int) or isinstance(value, bool)
                                   or not 0 <= value < counts[kind]):
                raise FormatError(f"manifest: {pw} refers to {kind} {value!r}; the package has {counts[kind]}")
            if kind == "symbol" and (not isinstance(value, str) or value not in symbols):
                raise FormatError(f"manifest: {pw} names symbol {_clip(value)}, which is not declared")
            param = {"kind": kind, "value": value}
            if kind == "temp":
                ex.validate(value, symbols, f"manifest: {pw}.value")
                if not isinstance(p.get("dtype"), str) or p["dtype"] not in DTYPES:
                    raise FormatError(f"manifest: {pw} (a temp) needs a dtype, one of {sorted(DTYPES)}")
                param["dtype"] = p["dtype"]
            params.append(param)
        grid = _need(l, "grid", list, where)
        if len(grid) != 3:
            raise FormatError(f"manifest: {where}.grid should have 3 expressions, found {len(grid)}")
        for g in grid:
            ex.validate(g, symbols | {SM_COUNT}, f"manifest: {where}.grid")
        bits = l.get("index_bits", c.get("index_bits"))
        if isinstance(bits, bool) or bits not in (32, 64):
            raise FormatError(f"manifest: {where}.index_bits should be 32 or 64, found {_clip(bits)}")
        launches.append(Launch(name=_need(l, "name", str, where), params=tuple(params), grid=tuple(grid),
                               block=dict(_need(l, "block", dict, where)),
                               num_warps=_need(l, "num_warps", int, where),
                               num_stages=_need(l, "num_stages", int, where), index_bits=bits))
    if len({l.name for l in launches}) != len(launches):
        raise FormatError("manifest: cuda.launches has duplicate names")
    arena = c.get("workspace_bytes", workspace)  # its own plan since 1.3 (attention fused on the GPU only)
    ex.validate(arena, symbols, "manifest: cuda.workspace_bytes")
    tuning = check_tuning(c["tuning"], {l.name for l in launches}) if "tuning" in c else None
    return CudaPlan(triton=_need(c, "triton", str, "cuda"), index_bits=_need(c, "index_bits", int, "cuda"),
                    launches=tuple(launches), workspace_bytes=arena, tuning=tuning)


def check_tuning(t: Any, names: set | None = None) -> dict:
    """``cuda.tuning`` (SPEC §6a): ``device``, ``at`` (the symbol values measured at) and ``configs`` (launch
    name -> its chosen block sizes, num_warps, num_stages), which a rebuild takes back (``--tuning``); with
    ``names``, every configured launch must be one of them."""
    if not isinstance(t, dict):
        raise FormatError("manifest: cuda.tuning should be an object")
    _need(t, "device", str, "cuda.tuning")
    for i, at in enumerate(_need(t, "at", list, "cuda.tuning")):
        if not isinstance(at, dict) or not all(isinstance(v, int) and not isinstance(v, bool) for v in at.values()):
            raise FormatError(f"manifest: cuda.tuning.at[{i}] should map symbol names to integers, found {at!r:.80}")
    for name, cfg in _need(t, "configs", dict, "cuda.tuning").items():
        if names is not None and name not in names:
            raise FormatError(f"manifest: cuda.tuning.configs names launch {name!r}, which cuda.launches lacks")
        if not isinstance(cfg, dict) or not all(isinstance(v, int) and not isinstance(v, bool)
                                                for v in cfg.values()):
            raise FormatError(f"manifest: cuda.tuning.configs[{name!r}] should map settings to integers, "
                              f"found {cfg!r:.80}")
    return t
