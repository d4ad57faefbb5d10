"""The user's source line for an FX node, from the stack trace torch.export keeps in its meta: what an error
or a guard message points at (``model.py:12 in forward: y = x.view(-1, 4)``). Used by relations (guard
messages) and by lowering (unsupported-op errors, each IR node's ``source``)."""

from __future__ import annotations

import re

import torch

_FRAME_RE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>\S+)\n\s*(?P<code>[^\n]*)')


def frame_of(node: torch.fx.Node, model_file: str | None) -> tuple[str, int, str, str] | None:
    """(file, line, function, code) of the node's user frame: the innermost frame in the model file, else the
    innermost frame."""
    trace = node.meta.get("stack_trace") or ""
    frames = list(_FRAME_RE.finditer(trace))
    if not frames:
        return None
    pick = frames[-1]
    if model_file:
        mine = [f for f in frames if f["file"].endswith(str(model_file).split("/")[-1])]
        pick = mine[-1] if mine else pick
    return pick["file"], int(pick["line"]), pick["fn"], pick["code"].strip()


def source_of(node: torch.fx.Node, model_file: str | None) -> str | None:
    """The user's source line for a node, as ``file:line in fn: code``."""
    frame = frame_of(node, model_file)
    return None if frame is None else f"{frame[0]}:{frame[1]} in {frame[2]}: {frame[3]}"
