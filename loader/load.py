"""``load()``: the one dispatcher from a package and a device to a loaded model.

Which class runs a package is decided here, from its graphs and the device: CPU or CUDA, inference only or with
the training graphs (``forward``/``backward``, a package built with ``--backward``). The model classes never
choose each other, so model.py, training.py, cuda_model.py and cuda_training.py import downwards only.
"""

from __future__ import annotations

from tcexport.formats.errors import TargetError, TcError
from tcexport.formats.manifest import Manifest

from .archive import open_archive
from .guards import GuardPlan
from .methods import method_models, wrap
from .native_cpu import for_method
from .native_cpu import load as load_native
from .model import Model, default_num_threads
from .state import StatefulModel
from .training import TrainableModel
from .trust import trusted_key_sources
from .weights import load_weights


def load(path, device="cpu", *, num_threads: int | None = None, isa: str | None = None, cache_dir=None,
         graphs: bool = True, check_indices: bool = True, dependent_launch: bool = True, trusted_keys=None,
         max_workspace_bytes: int | None = None):
    """Open, verify and load a `.tcpkg` for ``device`` ("cpu", "cuda" or "cuda:N"); return a callable model.

    Every byte that matters is verified before native code is loaded (the package digest, every member's hash)
    and the model runs from a private copy of the verified bytes. ``trusted_keys`` (paths to PEM public keys, key
    bytes, or key objects; default: $TCEXPORT_TRUSTED_KEYS) requires a valid signature by one of them.
    ``max_workspace_bytes`` refuses a call whose plan needs more scratch memory than that (WorkspaceLimitError).
    CPU: ``isa`` forces a kernel bundle by name; ``cache_dir`` loads the kernel library through a private disk
    cache there instead of a sealed in-memory file (the default; the cache is the fallback where those cannot be
    executed: $TCEXPORT_CACHE or ~/.cache/tcexport).
    CUDA (see cuda_model.py): ``graphs`` replays a CUDA graph per input-shape signature; ``check_indices``
    synchronises after calls of models that index by data, to raise on an out-of-range index;
    ``dependent_launch`` lets each kernel of a graph start while the one before it finishes (sm_90 and later).
    A package with training graphs loads as a model with ``forward(..., grad=True)``, ``backward`` and weights.
    A package with state (buffers its forward writes, e.g. a KV cache) loads as a ``StatefulModel``: calls take
    the model's inputs alone and update the state it keeps; ``state()``, ``reset_state()``, ``new_session()``.
    A package with methods (SPEC §2c) loads as a ``MethodsModel`` (``StatefulMethods`` with state): ``m.methods[name]``
    runs one, all sharing the weights (and the state); every model has ``methods`` (``forward`` alone without).
    """
    if max_workspace_bytes is not None and (isinstance(max_workspace_bytes, bool)
                                            or not isinstance(max_workspace_bytes, int) or max_workspace_bytes < 0):
        raise TcError(f"max_workspace_bytes should be None or an integer >= 0, got {max_workspace_bytes!r}")
    keys = trusted_key_sources(trusted_keys)
    if str(device).startswith("cuda"):
        archive = open_archive(path, trusted_keys=keys)
        _require_cuda_kernels(archive.manifest, str(device))
        return _load_cuda(archive, str(device), graphs=graphs, check_indices=check_indices,
                          dependent_launch=dependent_launch, max_workspace_bytes=max_workspace_bytes)
    if str(device) != "cpu":
        raise TargetError(f"device {str(device)!r} is not known; use 'cpu', 'cuda' or 'cuda:N'")
    threads = default_num_threads() if num_threads is None else num_threads
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise TcError(f"num_threads should be an integer >= 1, got {num_threads!r}")
    return load_cpu(open_archive(path, trusted_keys=keys), threads, isa=isa, cache_dir=cache_dir,
                    max_workspace_bytes=max_workspace_bytes)


def load_cpu(archive, num_threads: int, *, isa: str | None = None, cache_dir=None,
             max_workspace_bytes: int | None = None):
    """The CPU model of an archive already opened and verified (``open_archive``): ``load``'s CPU half, also
    what the exporter runs at the example inputs before it writes a package."""
    plan = GuardPlan(archive.manifest)
    weights = load_weights(archive)
    native = load_native(archive, isa=isa, cache_dir=cache_dir, num_threads=num_threads)
    if archive.manifest.methods:
        def make(name, view):
            run = native if view.inference.cpu.entry == native.bundle.entry else for_method(native, name)
            return Model(archive, GuardPlan(view), weights, run, num_threads, max_workspace_bytes, manifest=view)
        return wrap(archive, method_models(archive, make))
    cls = TrainableModel if archive.manifest.training is not None else Model
    model = cls(archive, plan, weights, native, num_threads, max_workspace_bytes)
    return StatefulModel(model) if archive.manifest.state else model


def _require_cuda_kernels(manifest: Manifest, device: str) -> None:
    """A package without CUDA kernels cannot run on any GPU: say so, naming what it has, before touching the
    driver (where a missing driver or cuda-bindings would hide the real problem)."""
    if any(k.is_cuda for k in manifest.kernels):
        return
    have = ", ".join(f"{k.target} {k.isa}" for k in manifest.kernels) or "no kernels"
    raise TargetError(f"device {device!r}: package {manifest.model!r} has no CUDA kernels ({have}). Rebuild it with "
                      f"`tcexport MODEL.py --target cuda:sm_XX`, or load it with device='cpu'.")


def _load_cuda(archive, device: str, **options):
    """``device`` is "cuda" or "cuda:N". The CUDA modules (and through them the driver) are imported only here."""
    from .cuda_model import CudaModel, pick_bundle
    from .cuda_training import TrainableCudaModel
    from .native_cuda import Device

    _, _, index = str(device).partition(":")
    if index and not index.isdigit():
        raise TargetError(f"device {device!r} should be 'cuda' or 'cuda:N'")
    gpu = Device(int(index or 0))
    if archive.manifest.cuda is None:
        pick_bundle(archive.manifest, gpu.arch, archive.path)
    t = archive.manifest.training
    cls = TrainableCudaModel if t is not None and t.forward.cuda is not None else CudaModel
    if archive.manifest.methods:
        owner: list = []

        def make(name, view):
            model = CudaModel(archive, gpu, manifest=view, shared_weights=owner[0] if owner else None, **options)
            owner.append(model)
            return model
        model = wrap(archive, method_models(archive, make))
        archive.release()
        return model
    model = cls(archive, gpu, **options)
    if archive.manifest.state:
        model = StatefulModel(model)  # reads the initial state from the archive before it is released
    archive.release()  # the weights are on the device and the cubins loaded: no host copy stays in memory
    return model
