"""The last check before a package is written: the loader itself opens the finished bytes, reads its weights
against the manifest, compiles its guards, and calls the model at its example inputs on this machine's CPU
(packager/archive.py runs it before the atomic rename), so tcexport never writes a package its own loader refuses.
The call only where it can: a package without CPU kernels for this machine gets the other checks alone."""

from __future__ import annotations

from typing import Callable

from tcexport.formats.errors import TargetError


def example_call(example_inputs, methods: dict | None = None) -> Callable:
    """``check(archive)``: the package the loader opened (``loader.archive.Archive`` of the temp file), loaded on
    the CPU and called with ``example_inputs`` (torch tensors, passed as the loader's arrays); with ``methods``
    (name -> its example inputs) each method at its own, in one session; the loader's typed error propagates."""
    def check(archive) -> None:
        from tcexport.loader.arrays import to_numpy
        from tcexport.loader.guards import GuardPlan
        from tcexport.loader.load import load_cpu
        from tcexport.loader.weights import load_weights

        if not any(k.target == "cpu" for k in archive.manifest.kernels):
            for name in archive.manifest.method_names():
                GuardPlan(archive.manifest.method(name))
            GuardPlan(archive.manifest)
            load_weights(archive)      # every weight's dtype and shape as the manifest says (a 0-d weight too)
            return
        try:
            model = load_cpu(archive, num_threads=1)
        except TargetError:             # no CPU bundle for this machine's ISA: nothing to call here
            return
        if methods:
            for name, inputs in methods.items():
                method = model.methods[name]
                method(*[to_numpy(t.detach().cpu(), s.name) for t, s in zip(inputs, method.inputs)])
            return
        arrays = [to_numpy(t.detach().cpu(), s.name) for t, s in zip(example_inputs, archive.manifest.inputs)]
        model(*arrays)

    return check
