"""What the manifest may not decide about native calls (SPEC §6): fixed entry points, the system libraries a
loader will load, and the interface descriptor a kernel library carries about itself.

The manifest describes a package; it must never steer a native call. So entry points are the ABI's names, not
the manifest's; the only libraries loaded besides the package's own are sonames on a fixed list; and every size a
kernel relies on (symbols and their ranges, guards, inputs, outputs, weights, the workspace, the BLAS routines,
and the training graphs') is compiled into the library as ``tc_abi_descriptor``: canonical JSON the loader
compares byte for byte with the same descriptor derived from the manifest. A manifest that disagrees with its own
kernels is then a FormatError naming the field, never a heap overflow.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .errors import FormatError, clip

CPU_ENTRY = "tc_run"
TRAIN_FORWARD_ENTRY, BACKWARD_ENTRY = "tc_run_train_forward", "tc_run_backward"
METHOD_ENTRY_PREFIX = "tc_run_method_"  # + a method's name: the entry of each method after the first (1.10)
DESCRIPTOR_SYMBOL = "tc_abi_descriptor"
MAX_DESCRIPTOR_BYTES = 16 * 1024 * 1024
# the sonames a bundle may name in ``libraries``, per target kind: a manifest can never make the loader load
# anything else
SYSTEM_LIBRARIES = {
    "cpu": ("libgomp.so.1", "libstdc++.so.6", "libm.so.6", "libc.so.6", "libgcc_s.so.1"),
    "cuda": ("libcuda.so.1",),
}
DESCRIPTOR_VERSION = (1, 7)  # packages of this format version and later carry the descriptor
DESCRIPTOR_PREFIX = b'{"abi":1,'  # how every descriptor starts (canonical JSON: "abi" sorts first)
ISA_PLACEHOLDER = "@isa@"    # stands for the isa in a descriptor made before the ISA level is known (one source
                             # serves every level; each build substitutes its own, see exporter/cpu/build.py)
ISA_MACRO = "TC_ISA"         # the C macro (a string literal) a library is compiled with: its bundle's isa
# the CPU flags (as /proc/cpuinfo spells them) each x86-64 level needs: the loader's own table, so that a manifest
# whose ``requires`` was edited cannot make it load AVX-512 code on a CPU without it (SIGILL). Most capable first.
CPU_ISA_REQUIRES = {
    "x86-64-v4": ("avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "movbe", "avx512f", "avx512bw", "avx512cd",
                  "avx512dq", "avx512vl"),
    "x86-64-v3": ("avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "movbe"),
    "x86-64": (),
}


@dataclass(frozen=True)
class Interface:
    """The part of a manifest a CPU kernel library is built for (its ``tc_run`` and training entries)."""

    symbols: tuple          # manifest.Symbol
    inputs: tuple           # manifest.TensorSpec
    outputs: tuple
    output_structure: str
    guards: tuple           # expressions (the messages are for people, not kernels)
    weights: tuple
    workspace_bytes: Any
    blas: tuple
    training: Any = None    # formats.graphs.Training (the forward and backward graphs), or None
    methods: tuple = ()     # MethodInterface per method after the first (the first is the fields above)

    @classmethod
    def of_manifest(cls, m, blas: tuple) -> "Interface":
        methods = tuple(MethodInterface(x.name, method_entry(x.name), x.symbols, m.graphs[x.graph].inputs,
                                        m.graphs[x.graph].outputs, x.output_structure,
                                        tuple(g.expr for g in x.guards), m.graphs[x.graph].workspace_bytes)
                        for x in m.methods[1:])
        return cls(m.symbols, m.inputs, m.outputs, m.output_structure, tuple(g.expr for g in m.guards), m.weights,
                   m.workspace_bytes, tuple(blas), m.training, methods)


@dataclass(frozen=True)
class MethodInterface:
    """What the library's entry point of one method (after the first) is built for: its own symbols, inputs,
    outputs, guards and workspace, over the package's one weights array."""

    name: str
    entry: str
    symbols: tuple
    inputs: tuple
    outputs: tuple
    output_structure: str
    guards: tuple
    workspace_bytes: Any


def method_entry(name: str) -> str:
    """The CPU entry point of method ``name`` (an identifier), fixed by the ABI: the loader derives it from the name,
    and the library's descriptor lists it, so a manifest cannot point a call at any other symbol."""
    return METHOD_ENTRY_PREFIX + name


def descriptor(i: Interface, isa: str) -> bytes:
    """Canonical JSON of the interface and the bundle's ``isa`` (sorted keys, no spaces, ASCII): equal interfaces,
    equal bytes. A library compiled for one isa level says so, so a manifest that files it under another (with
    weaker ``requires``) is refused before the library is loaded."""
    body = {"abi": 1, "isa": isa, "symbols": [[s.name, s.min, s.max] for s in i.symbols], "inputs": _specs(i.inputs),
            "outputs": _specs(i.outputs), "output_structure": i.output_structure, "guards": list(i.guards),
            "weights": _specs(i.weights), "workspace_bytes": i.workspace_bytes, "blas": list(i.blas)}
    if i.training is not None:
        t = i.training
        body["training"] = {
            "trainable": list(t.trainable),
            "forward": {"entry": t.forward.entry, "outputs": _specs(t.forward.outputs),
                        "workspace_bytes": t.forward.workspace_bytes},
            "backward": {"entry": t.backward.entry,
                         "inputs": [s + [list(src)] for s, src in zip(_specs(t.backward.inputs), t.sources)],
                         "outputs": [s + [list(of)] for s, of in zip(_specs(t.backward.outputs), t.gradients)],
                         "workspace_bytes": t.backward.workspace_bytes}}
    if i.methods:  # only packages with methods (1.10) say so: others keep their libraries' bytes
        body["methods"] = [{"name": x.name, "entry": x.entry, "symbols": [[s.name, s.min, s.max] for s in x.symbols],
                            "inputs": _specs(x.inputs), "outputs": _specs(x.outputs),
                            "output_structure": x.output_structure, "guards": list(x.guards),
                            "workspace_bytes": x.workspace_bytes} for x in i.methods]
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def _specs(specs) -> list:
    return [[s.name, s.dtype, list(s.shape)] for s in specs]


def check_descriptor(found: bytes, expected: bytes, library: str) -> None:
    """FormatError naming the first field where the library's descriptor and the manifest's disagree."""
    if found == expected:
        return
    want = json.loads(expected)
    try:
        got = json.loads(found)
    except (ValueError, UnicodeDecodeError, RecursionError):
        got = None
    if not isinstance(got, dict):
        raise FormatError(f"kernel library {library!r} carries a malformed interface descriptor; rebuild the "
                          f"package")
    field = next((k for k in sorted(set(want) | set(got)) if want.get(k) != got.get(k)), "encoding")
    raise FormatError(f"the manifest disagrees with kernel library {library!r} about {field!r}: the library was "
                      f"built for {clip(got.get(field), 300)}, the manifest says {clip(want.get(field), 300)}. The manifest "
                      f"was edited or belongs to other kernels; rebuild the package.")


def check_bundle(target: str, entry: str, libraries: tuple, where: str) -> None:
    """A bundle's entry and libraries are the ABI's, not the manifest's to choose (SPEC §6)."""
    kind = "cpu" if target == "cpu" else "cuda" if target.startswith("cuda:") else None
    if kind is None:
        return  # a target this loader does not run is never loaded
    want = CPU_ENTRY if kind == "cpu" else ""
    if entry != want:
        raise FormatError(f"manifest: {where}.entry is {entry[:80]!r}; a {kind} bundle's entry point is fixed by "
                          f"the ABI as {want!r}. The manifest was edited; rebuild the package.")
    allowed = SYSTEM_LIBRARIES[kind]
    for soname in libraries:
        if soname not in allowed:
            raise FormatError(f"manifest: {where}.libraries names {str(soname)[:120]!r}; a {kind} bundle may only "
                              f"need the system libraries {list(allowed)}. The manifest was edited; rebuild the "
                              f"package.")


