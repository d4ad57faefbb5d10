"""Peak activation memory of eager PyTorch on the CPU: the most bytes held at once by tensors the forward
allocates (weights and inputs excluded), tracked through a dispatch mode — approximate: a storage counts until
the tensor that created it dies. Compared in the benchmark table with
a package's planned peak (workspace + outputs, from its manifest)."""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class _PeakTracker(TorchDispatchMode):
    def __init__(self, existing):
        super().__init__()
        self.live = 0
        self.peak = 0
        self._seen: set = {t.untyped_storage().data_ptr() for t in existing}  # weights, inputs: not activations

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            key = storage.data_ptr()
            if key in self._seen:  # a view of a tensor already counted
                continue
            self._seen.add(key)
            self.live += storage.nbytes()
            self.peak = max(self.peak, self.live)
            # freed when the tensor that brought the storage dies (a view outliving it is not followed)
            weakref.finalize(t, self._free, key, storage.nbytes())
        return out

    def _free(self, key, nbytes) -> None:
        self._seen.discard(key)
        self.live -= nbytes


def eager_activation_peak(module: torch.nn.Module, inputs: tuple) -> int:
    existing = [*module.parameters(), *module.buffers(), *[x for x in inputs if isinstance(x, torch.Tensor)]]
    tracker = _PeakTracker(existing)
    with torch.no_grad(), tracker:
        out = module(*inputs)
    del out
    return tracker.peak
