"""What ``tcpkg inspect`` says about a verified package: the full description (every symbol, guard, kernel,
weight and member), or with ``--summary`` the few numbers a person deploying it asks for first (parameters,
bytes by kind, kernels by kind, targets). Sizes are shown human-readable, with exact bytes where it matters."""

from __future__ import annotations

import json
import math
import re
from collections import Counter

from tcexport.formats import expr as ex
from tcexport.formats.dtypes import DTYPES
from tcexport.formats.manifest import Manifest
from tcexport.formats.state import first_names

from .cli_base import human_bytes, human_count

_KERNEL_KIND = re.compile(r"^k\d+_([a-z]+)")


def kernel_kind(name: str) -> str:
    """``k3_reduce_max_sum`` -> ``reduce``; the kernel names the exporter writes start with ``kN_KIND``."""
    m = _KERNEL_KIND.match(name)
    return m[1] if m else "other"


def nbytes(spec) -> int:
    n = DTYPES[spec.dtype]
    for d in spec.shape:
        n *= d
    return n


def summary(m: Manifest, file_bytes: int | None = None) -> dict:
    """The summary as data (``inspect --json`` carries it as ``summary``)."""
    params = Counter()
    for w in m.weights:
        params[w.dtype] += nbytes(w) // DTYPES[w.dtype]
    by_kind = Counter()
    cpu_files = {k.file for k in m.kernels if k.target == "cpu"}
    cubin_files = {c.file for g in m.graphs.values() if g.cuda is not None
                   for cubins in g.cuda.cubins.values() for c in cubins}
    for name, info in m.members.items():
        kind = ("weights" if name == m.weights_file else "cpu_libraries" if name in cpu_files else
                "cubins" if name in cubin_files else "sources" if name in m.sources else
                "onnx" if m.onnx is not None and name == m.onnx["file"] else "other")
        by_kind[kind] += info["size"]
    kernels = {}
    for gname, g in m.graphs.items():
        entry = {}
        if g.cpu is not None:
            entry["cpu"] = dict(sorted(Counter(kernel_kind(k) for k in g.cpu.kernels).items()))
        if g.cuda is not None:
            entry["cuda"] = dict(sorted(Counter(kernel_kind(l.name) for l in g.cuda.launches).items()))
        kernels[gname] = entry
    return {
        "model": m.model, "model_version": m.model_version, "metadata": dict(m.metadata),
        "format_version": list(m.format_version),
        "parameters": sum(params.values()), "parameters_by_dtype": dict(sorted(params.items())),
        "weight_tensors": len(m.weights), "file_bytes": file_bytes,
        "bytes": dict(sorted(by_kind.items())),
        "targets": [f"{k.target}:{k.isa}" if k.target == "cpu" else k.target for k in m.kernels],
        "kernels": kernels, "graphs": list(m.graphs),
        "symbols": {s.name: [s.min, s.max] for s in m.symbols},
        "state": [x.to_json() for x in m.state],
        "methods": m.method_names(),
    }


def summary_lines(s: dict, m: Manifest) -> list[str]:
    version = f", version {s['model_version']}" if s["model_version"] else ""
    size = f"{human_bytes(s['file_bytes'])} ({s['file_bytes']:,} bytes)" if s["file_bytes"] is not None else "?"
    dtypes = ", ".join(f"{human_count(n)} {d}" for d, n in s["parameters_by_dtype"].items())
    lines = [f"model:       {s['model']}{version}",
             f"package:     {size}, tcpkg {s['format_version'][0]}.{s['format_version'][1]}",
             f"parameters:  {human_count(s['parameters'])} ({s['parameters']:,}) in {s['weight_tensors']} tensors"
             + (f": {dtypes}" if dtypes else ""),
             "bytes:       " + ", ".join(f"{k.replace('_', ' ')} {human_bytes(v)}" for k, v in s["bytes"].items()),
             "targets:     " + ", ".join(s["targets"]),
             "inputs:      " + ", ".join(f"{x.name} {x.dtype}{x.shape_text()}" for x in m.inputs),
             "outputs:     " + ", ".join(f"{x.name} {x.dtype}{x.shape_text()}" for x in m.outputs),
             "symbols:     " + (", ".join(f"{n} {lo}..{'inf' if hi is None else hi}"
                                          for n, (lo, hi) in s["symbols"].items()) or "none (static shapes)")]
    if m.state:
        lines.append("state:       " + _state_text(m))
    if m.methods:
        lines.append("methods:     " + ", ".join(m.method_names()))
    for gname, entry in s["kernels"].items():
        parts = [f"{where} {sum(kinds.values())} ({', '.join(f'{n} {k}' for k, n in kinds.items())})"
                 for where, kinds in entry.items()]
        lines.append(f"kernels:     {gname}: " + "; ".join(parts))
    lines += _metadata_lines(s["metadata"])
    return lines


def _state_text(m: Manifest) -> str:
    """The state in one line: how many buffers and bytes, the first names."""
    from .dtypes import numpy_dtype

    total = sum(numpy_dtype(m.inputs[x.input].dtype).itemsize * math.prod(m.inputs[x.input].shape) for x in m.state)
    return f"{len(m.state)} buffer(s), {human_bytes(total)} per session ({first_names(x.name for x in m.state)})"


def _metadata_lines(metadata: dict) -> list[str]:
    return [f"metadata:    {k} = {v}" for k, v in sorted(metadata.items())]


def describe(m: Manifest, names: list[str], archive=None) -> list[str]:
    """The full description, every part of the manifest a person can read."""
    integrity = "every member's SHA-256 matches" + (f"; package digest sha256 {archive.digest}"
                                                    if archive is not None and archive.digest else
                                                    "; no package digest (format before 1.7)")
    signers = signer_ids(archive) if archive is not None else []
    lines = [f"format:    tcpkg {m.format_version[0]}.{m.format_version[1]}  (verified: {integrity})",
             f"model:     {m.model}" + (f"  version {m.model_version}" if m.model_version else ""),
             *[line.replace("metadata:    ", "metadata:  ") for line in _metadata_lines(m.metadata)],
             "producer:  " + ", ".join(f"{k} {v}" for k, v in sorted(m.producer.items())),
             "signed:    " + (", ".join(k + (" (trusted, verified)" if k in archive.signed_by else "")
                                        for k in signers) if signers else "no"),
             "", "interface:"]
    lines += [f"  input  {s.name}: {s.dtype}{s.shape_text()}" for s in m.inputs]
    lines += [f"  output {s.name}: {s.dtype}{s.shape_text()}" for s in m.outputs]
    lines += [f"  returns: {m.output_structure}"]
    if m.state:
        lines += ["", "state (kept by the loader between calls, one copy per session; SPEC §2b):"]
        lines += [f"  {x.name}: input {m.inputs[x.input].name} -> output {m.outputs[x.output].name}, "
                  f"{m.inputs[x.input].dtype}{m.inputs[x.input].shape_text()}, starts {x.initial}"
                  + (", updated in place" if x.in_place else "") for x in m.state]
    lines += ["", "symbols:"]
    lines += [f"  {s.name}: {s.min}..{'inf' if s.max is None else s.max}" for s in m.symbols] or \
        ["  (none: all shapes static)"]
    lines += ["", "guards:"] + ([f"  {ex.to_text(g.expr)}    # {g.message}" for g in m.guards] or ["  (none)"])
    for x in m.methods:
        lines += method_lines(m, x.name)
    lines += ["", "kernels:"]
    for k in m.kernels:
        size = m.members.get(k.file, {}).get("size")
        lines.append(f"  {k.target} {k.isa}: {k.file}" + (f" ({human_bytes(size)})" if size is not None else "")
                     + f"  requires [{' '.join(k.requires)}]  abi {k.abi}"
                     f"  libraries [{' '.join(k.libraries)}]  blas [{' '.join(k.blas)}]")
    for name, g in m.graphs.items():
        lines += _graph_lines(name, g)
    lines += ["", "plan (informational):"]
    lines += [f"  {k}: {ex.to_text(v) if k.endswith('_bytes') or k.endswith('_without_reuse') else short(v)}"
              for k, v in sorted(m.plan.items())]
    total = sum(nbytes(w) for w in m.weights)
    lines += ["", f"weights: {len(m.weights)} tensors, {human_bytes(total)} ({total} bytes) in {m.weights_file}"]
    lines += [f"  {w.name}: {w.dtype}{w.shape_text()}" for w in m.weights]
    lines += ["", "members:"] + [f"  {n}  {human_bytes(m.members[n]['size'])} ({m.members[n]['size']} bytes)  "
                                 f"sha256 {m.members[n]['sha256']}" for n in sorted(m.members)]
    return lines


def method_lines(m: Manifest, name: str) -> list[str]:
    """One method (SPEC §2c): its graph, inputs, outputs, symbols, guards and the state it reads and writes."""
    v = m.method(name)
    graph = next(x.graph for x in m.methods if x.name == name)
    lines = ["", f"method {name} (graph {graph}; m.methods[{name!r}]):"]
    state_in = {x.input for x in v.state}
    state_out = {x.output for x in v.state}
    lines += [f"  input  {s.name}: {s.dtype}{s.shape_text()}" for k, s in enumerate(v.inputs) if k not in state_in]
    lines += [f"  output {s.name}: {s.dtype}{s.shape_text()}" for k, s in enumerate(v.outputs) if k not in state_out]
    lines += [f"  returns: {v.output_structure}"]
    if v.state:
        lines.append(f"  state: {', '.join(x.name for x in v.state)}")
    lines.append("  symbols: " + (", ".join(f"{s.name} {s.min}..{'inf' if s.max is None else s.max}" for s in v.symbols)
                                  or "none (static shapes)"))
    lines += [f"  guard {ex.to_text(g.expr)}    # {g.message}" for g in v.guards]
    return lines


def _graph_lines(name: str, g) -> list[str]:
    lines = ["", f"graph {name}: {len(g.inputs)} input(s), {len(g.outputs)} output(s)"]
    if g.cpu is not None:
        lines.append(f"  cpu  {g.cpu.entry}: workspace_bytes {ex.to_text(g.cpu.workspace_bytes)}, "
                     f"kernels {short(list(g.cpu.kernels))}")
    if g.cuda is not None:
        c = g.cuda
        lines.append(f"  cuda (Triton {c.triton or '?'}): arena {ex.to_text(c.workspace_bytes)}, "
                     f"kernels {short(list(c.kernels))}")
        for isa, cubins in sorted(c.cubins.items()):
            lines.append(f"    {isa}: {len(cubins)} cubins, shared memory up to "
                         f"{max((x.shared for x in cubins), default=0)} bytes")
        lines += [f"    {l.name}: grid ({', '.join(ex.to_text(x) for x in l.grid)})  "
                  f"{' '.join(f'{n}={v}' for n, v in l.block.items())}  warps {l.num_warps}  "
                  f"stages {l.num_stages}  int{l.index_bits}" for l in c.launches]
    return lines


def signer_ids(archive) -> list[str]:
    return [s.keyid for s in archive.attestation.signatures] if archive.attestation is not None else []


def short(v) -> str:
    text = json.dumps(v) if not isinstance(v, str) else v
    return text if len(text) <= 200 else text[:197] + "..."
