"""The package's state (formats/state.py) from what capture found (front/state.py): which input and output of
the graphs each state is, and its initial value, stored only when it is not all zeros (a static KV cache of a
1B model is hundreds of MB of zeros)."""

from __future__ import annotations

import safetensors.numpy
import torch

from tcexport.formats.state import StateSpec

from .weights import weight_array


def state_specs(g, inputs: tuple, outputs: tuple) -> tuple[tuple, bytes | None]:
    """(StateSpecs, the state file's bytes or None) for the inference graph ``g`` whose manifest inputs and
    outputs are ``inputs``/``outputs`` (lowering names a state's input and output after its buffer)."""
    return state_pairs(g, inputs, outputs), state_file_bytes([g])


def state_pairs(g, inputs: tuple, outputs: tuple) -> tuple:
    """The StateSpecs of graph ``g`` (the inference graph, or a method's) over its own inputs and outputs."""
    in_index = {s.name: k for k, s in enumerate(inputs)}
    out_index = {s.name: k for k, s in enumerate(outputs)}
    return tuple(StateSpec(b.name, in_index[b.name], out_index[b.name], "zeros" if _zero(b) else "file", b.in_place)
                 for b in g.captured.state)


def state_file_bytes(graphs) -> bytes | None:
    """The initial values that are not all zeros, of every state of ``graphs`` (methods share a state by name:
    stored once), as the state file; None when there are none."""
    stored = {}
    for g in graphs:
        for b in g.captured.state:
            if b.name not in stored and not _zero(b):
                stored[b.name] = weight_array(b.initial)
    return safetensors.numpy.save(stored) if stored else None


def _zero(b) -> bool:
    return not bool(torch.any(b.initial != 0))
