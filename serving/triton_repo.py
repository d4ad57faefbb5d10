"""``tcpkg triton-repo PKG OUT_DIR``: a Triton Inference Server model repository that serves a package.

Writes ``OUT_DIR/<name>/config.pbtxt`` (Python backend; inputs and outputs with ``TYPE_*`` datatypes and dims,
``-1`` for a dynamic dim; with a batch axis ``max_batch_size`` from the batch symbol's range, dims without the
batch dim and ``dynamic_batching``; without one ``max_batch_size: 0`` and full dims), and under
``OUT_DIR/<name>/<version>/`` the package (``model.tcpkg``) and a two-line ``model.py`` that imports
``TritonPythonModel`` from ``tcexport.serving.triton_backend``. The copy is verified by loading it before anything
appears in the repository: a damaged or unrunnable package is refused. Everything is written into a hidden
temporary directory and renamed into place, so a server polling the repository never sees half a model.
Adding a version to a model already in the repository writes the version directory the same way and replaces
``config.pbtxt`` (Triton has one configuration for all versions of a model; the newest package's signature wins).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from tcexport.formats.errors import TcError
from tcexport.loader.archive import open_archive
from tcexport.loader.batching import batch_axis
from tcexport.loader.load import load
from tcexport.loader.trust import trusted_key_sources

from .datatypes import triton_datatype

UNBOUNDED_MAX_BATCH = 64      # max_batch_size for a batch symbol without an upper bound, unless --max-batch says
INT32_MAX = 2**31 - 1         # Triton reads max_batch_size as int32
MODEL_PY = '''"""Triton Python-backend model for a tcexport package: serves model.tcpkg next to this file with
tcexport.loader (written by `tcpkg triton-repo`; needs `pip install tcexport` in the server's Python)."""

from tcexport.serving.triton_backend import TritonPythonModel  # noqa: F401
'''
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


class TritonRepoError(TcError):
    """The repository cannot be written as asked: a bad name, version or option, or a version already there."""

    exit_code = 2


def model_config(manifest, name: str, *, max_batch: int | None = None, max_delay_ms: float | None = None,
                 device: str = "cpu", instances: int = 1, source: str = "", digest: str | None = None) -> str:
    """The ``config.pbtxt`` text for a package's manifest (its signature, symbols and batch axis).
    ``max_delay_ms``: how long Triton's dynamic batcher may hold a request to gather a batch (its default if None).
    """
    axis = batch_axis(manifest)
    if axis is None and max_batch is not None:
        raise TritonRepoError(f"--max-batch {max_batch}: package {manifest.model!r} has no batch axis (no symbol "
                              f"that is dim 0 of every input and output and nowhere else), so Triton cannot batch "
                              f"it; leave --max-batch out")
    lines = [f"# written by `tcpkg triton-repo` from {source or 'a package'} (model {manifest.model!r}"
             + (f", digest sha256:{digest}" if digest else "") + ")"]
    lines += [f"# symbol {s.name}: {s.min}..{'' if s.max is None else s.max}" for s in manifest.symbols]
    lines += [f"name: {_quote(name)}", 'backend: "python"']
    if axis is None:
        lines.append("max_batch_size: 0")
    else:
        limit = axis.limit(max_batch)
        lines.append(f"max_batch_size: {min(limit if limit is not None else UNBOUNDED_MAX_BATCH, INT32_MAX)}")
    skip = 0 if axis is None else 1
    lines += _tensors("input", manifest.inputs, skip) + _tensors("output", manifest.outputs, skip)
    if axis is not None:
        delay = "" if max_delay_ms is None else f"max_queue_delay_microseconds: {round(max_delay_ms * 1000)} "
        lines.append(f"dynamic_batching {{ {delay}}}")
    lines += _instance_group(device, instances)
    return "\n".join(lines) + "\n"


def _tensors(field: str, specs, skip: int) -> list[str]:
    """An ``input``/``output`` list; a tensor with no dims left gets ``dims: [ 1 ]`` and ``reshape { shape: [ ] }``
    (Triton's form for a scalar, or a tensor that is only the batch dim)."""
    out = [f"{field} ["]
    for k, spec in enumerate(specs):
        dims = [d if isinstance(d, int) else -1 for d in spec.shape[skip:]]
        body = [f"    name: {_quote(spec.name)}", f"    data_type: {triton_datatype(spec.dtype)}"]
        if dims:
            body.append(f"    dims: [ {', '.join(str(d) for d in dims)} ]")
        else:
            body += ["    dims: [ 1 ]", "    reshape: { shape: [ ] }"]
        out += ["  {", *body, "  }" + ("," if k + 1 < len(specs) else "")]
    return out + ["]"]


def _instance_group(device: str, instances: int) -> list[str]:
    if device == "cpu":
        return [f"instance_group [ {{ count: {instances} kind: KIND_CPU }} ]"]
    _, _, index = device.partition(":")
    gpus = f" gpus: [ {int(index)} ]" if index else ""
    return [f"instance_group [ {{ count: {instances} kind: KIND_GPU{gpus} }} ]"]


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_repository(package, out_dir, *, name: str | None = None, version: int = 1, max_batch: int | None = None,
                     max_delay_ms: float | None = None, device: str = "cpu", instances: int = 1,
                     trusted_keys=None) -> Path:
    """Write (or add a version to) ``out_dir/<name>``; return that model directory. See the module docstring."""
    package, out_dir = Path(package), Path(out_dir)
    name = package.stem if name is None else name
    _check_options(name, version, max_batch, device, instances)
    if max_delay_ms is not None and not 0 <= max_delay_ms <= 3_600_000:
        raise TritonRepoError(f"--max-delay-ms {max_delay_ms!r}: expected a number of milliseconds >= 0")
    if not package.is_file():
        raise TritonRepoError(f"package {str(package)!r} is not a file; pass the path of a .tcpkg")
    out_dir.mkdir(parents=True, exist_ok=True)
    model_dir = out_dir / name
    if (model_dir / str(version)).exists():
        raise TritonRepoError(f"{model_dir / str(version)} already exists; pass another --version (Triton serves "
                              f"the highest by default) or remove that directory first")
    adding = model_dir.is_dir()
    # the hidden temporary directory is private (0700); what is renamed out of it is made inside it, so it gets
    # the usual permissions (the umask's) and a server running as another user can read it
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=model_dir if adding else out_dir))
    try:
        staged = tmp / name
        stage = staged / str(version)
        stage.mkdir(parents=True)
        shutil.copyfile(package, stage / "model.tcpkg")
        manifest, digest = _verify(stage / "model.tcpkg", device, trusted_keys)
        (stage / "model.py").write_text(MODEL_PY)
        config = model_config(manifest, name, max_batch=max_batch, max_delay_ms=max_delay_ms, device=device,
                              instances=instances, source=package.name, digest=digest)
        (staged / "config.pbtxt").write_text(config)
        if adding:
            os.rename(stage, model_dir / str(version))
            os.replace(staged / "config.pbtxt", model_dir / "config.pbtxt")
        else:
            os.rename(staged, model_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return model_dir


def _check_options(name: str, version: int, max_batch, device: str, instances: int) -> None:
    if not _NAME.fullmatch(name):
        raise TritonRepoError(f"model name {name!r}: expected letters, digits, '_', '.' or '-' (not starting with "
                              f"'.' or '-'), as a directory of the repository; pass --name")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise TritonRepoError(f"--version {version!r}: expected an integer >= 1 (Triton ignores version "
                              f"directories that are not positive numbers)")
    if max_batch is not None and (isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1):
        raise TritonRepoError(f"--max-batch {max_batch!r}: expected an integer >= 1")
    if isinstance(instances, bool) or not isinstance(instances, int) or instances < 1:
        raise TritonRepoError(f"--instances {instances!r}: expected an integer >= 1")
    if not re.fullmatch(r"cpu|cuda(:\d+)?", device):
        raise TritonRepoError(f"--device {device!r}: expected 'cpu', 'cuda' or 'cuda:N'")


def _verify(path: Path, device: str, trusted_keys):
    """(manifest, digest) of the copied package once it has proved it can be served on ``device``: on the CPU it
    is loaded; for a GPU (often absent where a repository is written) it is verified and must carry CUDA kernels."""
    if device == "cpu":
        model = load(path, num_threads=1, trusted_keys=trusted_keys)
        return model.manifest, model.archive.digest
    archive = open_archive(path, trusted_keys=trusted_key_sources(trusted_keys))
    if not any(k.is_cuda for k in archive.manifest.kernels):
        have = ", ".join(f"{k.target} {k.isa}" for k in archive.manifest.kernels) or "no kernels"
        raise TritonRepoError(f"--device {device}: package {archive.manifest.model!r} has no CUDA kernels ({have}); "
                              f"rebuild it with `tcexport MODEL.py --target cuda:sm_XX`, or use --device cpu")
    return archive.manifest, archive.digest


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tcpkg triton-repo", description="Write a Triton Inference Server model repository (Python backend) that "
                                "serves a .tcpkg package with tcexport.loader.")
    p.add_argument("package", type=Path, help="the .tcpkg file")
    p.add_argument("out_dir", type=Path, help="the model repository (created if missing)")
    p.add_argument("--name", help="the model's name in the repository (default: the package's file stem)")
    p.add_argument("--version", type=int, default=1, help="the version directory to write (default 1)")
    p.add_argument("--max-batch", type=int, help="cap max_batch_size below the batch symbol's upper bound")
    p.add_argument("--max-delay-ms", type=float,
                   help="how long Triton's dynamic batcher may hold a request to gather a batch (default: Triton's)")
    p.add_argument("--device", default="cpu", help="cpu (KIND_CPU), cuda or cuda:N (KIND_GPU); default cpu")
    p.add_argument("--instances", type=int, default=1, help="model instances (Triton runs each in a process)")
    p.add_argument("--trusted-key", action="append", default=None,
                   help="require the package to be signed by this ed25519 public key (PEM); repeatable")
    return p


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit code (2: usage, otherwise the TcError's ``exit_code``)."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:  # argparse has printed the usage error
        return int(e.code or 0)
    try:
        model_dir = write_repository(args.package, args.out_dir, name=args.name, version=args.version,
                                     max_batch=args.max_batch, max_delay_ms=args.max_delay_ms,
                                     device=args.device, instances=args.instances,
                                     trusted_keys=args.trusted_key)
    except TcError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    except OSError as err:
        print(f"error: cannot write the repository: {err}", file=sys.stderr)
        return 1
    print(f"wrote {model_dir}: config.pbtxt, {args.version}/model.tcpkg, {args.version}/model.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
