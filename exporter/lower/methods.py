"""The weights a package's methods share (front/methods.py): one weights array for every method's entry point.

Each method is lowered on its own, so each has its own weight buffers. A weight two methods read under one name
(the module's parameter: the same tensor, or an equal constant) is stored once; two different tensors under one
name (a constant each capture made with its own value) stay apart, the later method's named ``name@method``. The
first method's program (the package's ``inference``) lists every weight, so the packager writes them all; every
other program lists the same slots in the same order, naming its own buffer where it reads one, so its entry
point indexes the one array.
"""

from __future__ import annotations

import torch

UNUSED = "~unused"  # a slot's name in a program that does not read it (never a buffer, never referenced)


def share_method_weights(graphs: list) -> None:
    """``graphs``: the pipeline's Graphs after planning, the first method's first."""
    main, low = graphs[0].program, graphs[0].lowering
    by_public = {low.public_names[w]: w for w in main.weights}
    slots: list[dict] = [{} for _ in graphs]   # per graph: its buffer name -> the slot's name in main
    for k, g in enumerate(graphs[1:], 1):
        for w in g.program.weights:
            public, value = g.lowering.public_names[w], g.lowering.weight_values[w]
            there = by_public.get(public)
            if there is not None and _same(low.weight_values[there], value):
                slots[k][w] = there
                continue
            if there is not None:
                public = f"{public}@{g.method}"
            name = _free_name(main.buffers, w, g.method)
            main.weights.append(name)
            main.buffers[name] = g.program.buffers[w]
            low.weight_values[name] = value
            low.public_names[name] = public
            by_public[public] = name
            slots[k][w] = name
    for k, g in enumerate(graphs[1:], 1):
        mine = {there: w for w, there in slots[k].items()}
        g.program.weights = [mine.get(name, f"{UNUSED}{j}") for j, name in enumerate(main.weights)]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same weight: one tensor (the module's parameter, seen through each capture), or equal values."""
    if a is b:
        return True
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    try:
        if a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() and a.stride() == b.stride() \
                and a.storage_offset() == b.storage_offset():
            return True
    except (RuntimeError, NotImplementedError):
        pass
    return bool(torch.equal(a, b))


def _free_name(buffers: dict, name: str, method: str) -> str:
    if name not in buffers:
        return name
    k, base = 0, f"{name}_at_{method}"
    while (candidate := base if k == 0 else f"{base}{k}") in buffers:
        k += 1
    return candidate
