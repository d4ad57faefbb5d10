"""How a CUDA launch's parameters and grid are bound for one call (SPEC §6a): the one binder that the CUDA loader
(device pointers) and the exporter's Triton-interpreter check (torch tensors) both use, so the two cannot read a
launch list differently.

The binder is generic over what a buffer is: it picks the input, weight or output by index, the error word, or a
temp at its evaluated byte offset in the arena (``temp(offset, dtype)`` makes that argument), and each symbol's
value from the call's bound symbols.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from tcexport.formats.errors import FormatError
from tcexport.formats.expr import evaluate
from tcexport.formats.manifest import SM_COUNT

MAX_GRID = ((1 << 31) - 1, 65535, 65535)  # the most blocks a launch may have in x, y and z


@dataclass(frozen=True)
class LaunchBuffers:
    """What one call's launches may point at."""

    inputs: Sequence
    weights: Sequence
    outputs: Sequence
    error: Any                           # the error word
    temp: Callable[[int, str], Any]      # (byte offset in the arena, dtype) -> the argument


def bind_params(params: Sequence[dict], env: dict, buffers: LaunchBuffers) -> list[tuple[str, Any]]:
    """Each parameter as (``"symbol"``, its value) or (``"buffer"``, what ``buffers`` gives for it), in order."""
    out = []
    for p in params:
        kind, value = p["kind"], p["value"]
        if kind == "symbol":
            out.append(("symbol", env[value]))
        elif kind == "temp":
            out.append(("buffer", buffers.temp(evaluate(value, env), p["dtype"])))
        elif kind == "error":
            out.append(("buffer", buffers.error))
        else:
            out.append(("buffer", {"input": buffers.inputs, "weight": buffers.weights,
                                   "output": buffers.outputs}[kind][value]))
    return out


def launch_grid(name: str, grid: Sequence, env: dict, sm_count: int) -> tuple[int, int, int]:
    """The launch's grid for these symbols and this GPU's multiprocessor count; a grid CUDA cannot launch (negative,
    or past its limits) is a FormatError: the package is damaged. A grid with a 0 is not launched."""
    full = {**env, SM_COUNT: sm_count}
    dims = tuple(evaluate(g, full) for g in grid)
    if min(dims) < 0 or any(d > limit for d, limit in zip(dims, MAX_GRID)):
        raise FormatError(f"kernel {name}: its grid evaluates to {dims} for {full}, outside what CUDA launches "
                          f"({list(MAX_GRID)} at most, and never negative). The package is damaged: rebuild it")
    return dims
