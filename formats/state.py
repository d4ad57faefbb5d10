"""The manifest's ``state`` (added in 1.9, SPEC §2b): buffers a model's forward writes, kept by the loader between
calls (a static KV cache, a step counter).

A state is an ordinary input of every graph and an ordinary output (its new value), so guards, the ABI
descriptor and both targets' kernels need nothing new; the manifest only says which input and output pair up,
where the value starts, and whether one array may be both (``in_place``). The loader hides those inputs and
outputs from callers and owns the arrays (loader/state.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import FormatError
from .errors import clip as _clip
from .records import IDENT, need

STATE_VERSION = (1, 9)   # packages with state say this version; those without keep 1.8's bytes
INITIAL_KINDS = ("zeros", "file")


@dataclass(frozen=True)
class StateSpec:
    name: str
    input: int        # index into the manifest's inputs: the value before the call
    output: int       # index into its outputs: the value after
    initial: str      # "zeros", or "file": the tensor of this name in the manifest's state_file
    in_place: bool    # the kernels may read and write one array (every element's new value needs only its own)

    def to_json(self) -> dict:
        return {"name": self.name, "input": self.input, "output": self.output, "initial": self.initial,
                "in_place": self.in_place}


def first_names(names, most: int = 3) -> str:
    """The first ``most`` names, then "..." when there are more: how a message lists a package's state."""
    names = list(names)
    return ", ".join(names[:most]) + (", ..." if len(names) > most else "")


def parse_state(items: Any, state_file: Any, inputs: tuple, outputs: tuple, members: dict) -> tuple:
    """``state`` checked against the inputs and outputs it pairs: each input and output at most once, with one
    dtype and one static shape, and its initial value's member listed."""
    if not isinstance(items, list):
        raise FormatError(f"manifest: state should be a list, found {_clip(items)}")
    out, names, ins, outs = [], set(), set(), set()
    for k, d in enumerate(items):
        where = f"state[{k}]"
        if not isinstance(d, dict):
            raise FormatError(f"manifest: {where} should be an object, found {_clip(d)}")
        name = need(d, "name", str, where)
        if not IDENT.match(name.replace(".", "_")) or name in names:
            raise FormatError(f"manifest: {where}.name {_clip(name)} should be a unique buffer name")
        i, o = (need(d, key, int, where) for key in ("input", "output"))
        if isinstance(i, bool) or not 0 <= i < len(inputs) or i in ins:
            raise FormatError(f"manifest: {where}.input {_clip(i)} should be a distinct index into inputs "
                              f"(0..{len(inputs) - 1})")
        if isinstance(o, bool) or not 0 <= o < len(outputs) or o in outs:
            raise FormatError(f"manifest: {where}.output {_clip(o)} should be a distinct index into outputs "
                              f"(0..{len(outputs) - 1})")
        a, b = inputs[i], outputs[o]
        if a.dtype != b.dtype or tuple(a.shape) != tuple(b.shape) \
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in a.shape):
            raise FormatError(f"manifest: {where} ({name}) pairs input {a.name} {a.dtype}{list(a.shape)} with "
                              f"output {b.name} {b.dtype}{list(b.shape)}; a state has one dtype and one static "
                              f"shape; rebuild the package")
        initial = need(d, "initial", str, where)
        if initial not in INITIAL_KINDS:
            raise FormatError(f"manifest: {where}.initial should be one of {list(INITIAL_KINDS)}, found "
                              f"{_clip(initial)}")
        if initial == "file" and (not isinstance(state_file, str) or state_file not in members):
            raise FormatError(f"manifest: {where} starts from state_file, but state_file {_clip(state_file)} is "
                              "not a listed member; rebuild the package")
        in_place = d.get("in_place", False)
        if not isinstance(in_place, bool):
            raise FormatError(f"manifest: {where}.in_place should be true or false, found {_clip(in_place)}")
        names.add(name), ins.add(i), outs.add(o)
        out.append(StateSpec(name, i, o, initial, in_place))
    return tuple(out)
