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
    specs, stored = [], {}
    in_index = {s.name: k for k, s in enumerate(inputs)}
    out_index = {s.name: k for k, s in enumerate(outputs)}
    for b in g.captured.state:
        zero = not bool(torch.any(b.initial != 0))
        if not zero:
            stored[b.name] = weight_array(b.initial)
        specs.append(StateSpec(b.name, in_index[b.name], out_index[b.name], "zeros" if zero else "file",
                               b.in_place))
    return tuple(specs), (safetensors.numpy.save(stored) if stored else None)
