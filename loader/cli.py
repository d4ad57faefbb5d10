"""``tcpkg``: inspect and run `.tcpkg` packages from the command line, without torch.

Exit codes: 0 ok; 2 usage error; otherwise the ``exit_code`` of the TcError raised (3 format/integrity,
4 target, 5 guard, 6 kernel, 8 signature, 9 kernel cache). Errors go to stderr as ``error: <message>``;
``--json`` output goes to stdout, on failure too.
"""

from __future__ import annotations

import json
import pathlib
import sys
from typing import List, Optional

import numpy as np
import typer

from tcexport.formats import expr as ex
from tcexport.formats.errors import TcError
from tcexport.formats.manifest import Manifest

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Inspect and run .tcpkg packages (no PyTorch needed).")


def _fail(err: TcError, as_json: bool = False) -> None:
    if as_json:
        typer.echo(json.dumps({"verified": False, "error": str(err), "error_type": type(err).__name__,
                               "exit_code": err.exit_code}))
    typer.echo(f"error: {err}", err=True)
    raise typer.Exit(err.exit_code)


def _keys(trusted_key: List[pathlib.Path]):
    """The --trusted-key files, else $TCEXPORT_TRUSTED_KEYS, else None (no signature required)."""
    from .trust import trusted_key_sources

    return trusted_key_sources([str(p) for p in trusted_key] if trusted_key else None)


TRUSTED_KEY_HELP = "a trusted ed25519 public key (PEM); repeatable; default $TCEXPORT_TRUSTED_KEYS"


@app.command()
def inspect(package: pathlib.Path = typer.Argument(..., help="the .tcpkg file"),
            as_json: bool = typer.Option(False, "--json", help="print the manifest as JSON with a verified flag"),
            trusted_key: List[pathlib.Path] = typer.Option([], "--trusted-key", help=TRUSTED_KEY_HELP)):
    """Verify a package and describe it: signature, symbols, guards, kernels, weights, members."""
    from .archive import open_archive
    try:
        archive = open_archive(package, trusted_keys=_keys(trusted_key))
    except TcError as err:
        _fail(err, as_json)
    m = archive.manifest
    if as_json:
        typer.echo(json.dumps({"path": str(package), "verified": True, "digest": archive.digest,
                               "signatures": _signers(archive), "signed_by": list(archive.signed_by),
                               "manifest": m.to_json()}, sort_keys=True))
        return
    typer.echo("\n".join(_describe(m, archive.names(), archive)))


def _signers(archive) -> list[str]:
    return [s.keyid for s in archive.attestation.signatures] if archive.attestation is not None else []


@app.command()
def verify(package: pathlib.Path = typer.Argument(..., help="the .tcpkg file"),
           trusted_key: List[pathlib.Path] = typer.Option([], "--trusted-key", help=TRUSTED_KEY_HELP),
           as_json: bool = typer.Option(False, "--json", help="print the result as JSON")):
    """Exit 0 only if the package is intact and signed by a trusted key (exit 8 if not, 3 if damaged)."""
    from .archive import open_archive
    try:
        keys = _keys(trusted_key)
        if keys is None:
            typer.echo("error: tcpkg verify checks a signature against trusted keys: pass --trusted-key PUB.pem "
                       "(or set TCEXPORT_TRUSTED_KEYS); `tcpkg inspect` checks integrity alone", err=True)
            raise typer.Exit(2)
        archive = open_archive(package, trusted_keys=keys)
    except TcError as err:
        _fail(err, as_json)
    report = {"path": str(package), "verified": True, "digest": archive.digest, "signed_by": list(archive.signed_by),
              "format_version": list(archive.manifest.format_version), "model": archive.manifest.model}
    if as_json:
        typer.echo(json.dumps(report, sort_keys=True))
    else:
        typer.echo(f"{package}: verified, signed by trusted key {', '.join(archive.signed_by)} "
                   f"(package digest sha256 {archive.digest})")


@app.command()
def sign(package: pathlib.Path = typer.Argument(..., help="the .tcpkg file"),
         key: pathlib.Path = typer.Option(..., "--key", help="ed25519 private key, PEM (openssl genpkey -algorithm "
                                                           "ed25519 -out KEY.pem)"),
         output: Optional[pathlib.Path] = typer.Option(None, "-o", "--output", help="write the signed package here "
                                                       "(default: in place, atomically)"),
         as_json: bool = typer.Option(False, "--json", help="print the result as JSON")):
    """Sign a package: adds an ed25519 signature over its digest; nothing else in the file changes."""
    from .signing import sign_package
    try:
        out, keyid = sign_package(package, key, output)
    except TcError as err:
        _fail(err, as_json)
    if as_json:
        typer.echo(json.dumps({"path": str(out), "signed": True, "keyid": keyid}, sort_keys=True))
    else:
        typer.echo(f"signed {out} with key {keyid}")


def _describe(m: Manifest, names: list[str], archive=None) -> list[str]:
    integrity = "every member's SHA-256 matches" + (f"; package digest sha256 {archive.digest}"
                                                    if archive is not None and archive.digest else
                                                    "; no package digest (format before 1.7)")
    signers = _signers(archive) if archive is not None else []
    lines = [f"format:    tcpkg {m.format_version[0]}.{m.format_version[1]}  (verified: {integrity})",
             f"model:     {m.model}",
             "producer:  " + ", ".join(f"{k} {v}" for k, v in sorted(m.producer.items())),
             "signed:    " + (", ".join(k + (" (trusted, verified)" if k in archive.signed_by else "")
                                        for k in signers) if signers else "no"),
             "", "interface:"]
    lines += [f"  input  {s.name}: {s.dtype}{s.shape_text()}" for s in m.inputs]
    lines += [f"  output {s.name}: {s.dtype}{s.shape_text()}" for s in m.outputs]
    lines += [f"  returns: {m.output_structure}", "", "symbols:"]
    lines += [f"  {s.name}: {s.min}..{'inf' if s.max is None else s.max}" for s in m.symbols] or ["  (none: all shapes static)"]
    lines += ["", "guards:"] + ([f"  {ex.to_text(g.expr)}    # {g.message}" for g in m.guards] or ["  (none)"])
    lines += ["", "kernels:"]
    for k in m.kernels:
        lines.append(f"  {k.target} {k.isa}: {k.file}  requires [{' '.join(k.requires)}]  abi {k.abi}"
                     f"  libraries [{' '.join(k.libraries)}]  blas [{' '.join(k.blas)}]")
    for name, g in m.graphs.items():
        lines += ["", f"graph {name}: {len(g.inputs)} input(s), {len(g.outputs)} output(s)"]
        if g.cpu is not None:
            lines.append(f"  cpu  {g.cpu.entry}: workspace_bytes {ex.to_text(g.cpu.workspace_bytes)}, "
                         f"kernels {_short(list(g.cpu.kernels))}")
        if g.cuda is not None:
            c = g.cuda
            lines.append(f"  cuda (Triton {c.triton or '?'}): arena {ex.to_text(c.workspace_bytes)}, "
                         f"kernels {_short(list(c.kernels))}")
            for isa, cubins in sorted(c.cubins.items()):
                lines.append(f"    {isa}: {len(cubins)} cubins, shared memory up to "
                             f"{max((x.shared for x in cubins), default=0)} bytes")
            lines += [f"    {l.name}: grid ({', '.join(ex.to_text(x) for x in l.grid)})  "
                      f"{' '.join(f'{n}={v}' for n, v in l.block.items())}  warps {l.num_warps}  "
                      f"stages {l.num_stages}  int{l.index_bits}" for l in c.launches]
    lines += ["", "plan (informational):"]
    lines += [f"  {k}: {ex.to_text(v) if k.endswith('_bytes') or k.endswith('_without_reuse') else _short(v)}"
              for k, v in sorted(m.plan.items())]
    total = sum(_nbytes(w) for w in m.weights)
    lines += ["", f"weights: {len(m.weights)} tensors, {total} bytes in {m.weights_file}"]
    lines += [f"  {w.name}: {w.dtype}{w.shape_text()}" for w in m.weights]
    lines += ["", "members:"] + [f"  {n}  {m.members[n]['size']} bytes  sha256 {m.members[n]['sha256']}"
                                 for n in sorted(m.members)]
    return lines


def _nbytes(spec) -> int:
    from tcexport.formats.dtypes import DTYPES
    n = DTYPES[spec.dtype]
    for d in spec.shape:
        n *= d
    return n


def _short(v) -> str:
    text = json.dumps(v) if not isinstance(v, str) else v
    return text if len(text) <= 200 else text[:197] + "..."


@app.command()
def run(package: pathlib.Path = typer.Argument(..., help="the .tcpkg file"),
        inputs: List[str] = typer.Option([], "--input", "-i", help="NAME=FILE.npy, once per input"),
        out_dir: pathlib.Path = typer.Option(pathlib.Path("."), "-o", "--out", help="where to write <output>.npy"),
        num_threads: Optional[int] = typer.Option(None, "--threads", help="CPU threads (default: all allowed)"),
        isa: Optional[str] = typer.Option(None, "--isa", help="force a CPU kernel bundle by isa name"),
        trusted_key: List[pathlib.Path] = typer.Option([], "--trusted-key", help=TRUSTED_KEY_HELP),
        as_json: bool = typer.Option(False, "--json", help="print output names, shapes, dtypes and files as JSON")):
    """Run a package on .npy inputs and write each output to OUT/<output name>.npy."""
    from .load import load
    arrays = dict(_read_input(spec) for spec in inputs)
    try:
        model = load(package, num_threads=num_threads, isa=isa, trusted_keys=_keys(trusted_key))
        result = model(**arrays)
    except TcError as err:
        _fail(err, as_json)
    results = result if isinstance(result, tuple) else (result,)
    out_dir.mkdir(parents=True, exist_ok=True)
    report = []
    for spec, value in zip(model.outputs, results):
        file = out_dir / f"{spec.name}.npy"
        np.save(file, value.view(np.dtype(value.dtype.str)), allow_pickle=False)  # bfloat16: raw uint16 bits
        report.append({"name": spec.name, "dtype": spec.dtype, "shape": list(value.shape), "file": str(file)})
    if as_json:
        typer.echo(json.dumps({"outputs": report}, sort_keys=True))
    else:
        for r in report:
            typer.echo(f"{r['name']}: {r['dtype']}{r['shape']} -> {r['file']}")


def _read_input(spec: str) -> tuple[str, np.ndarray]:
    name, sep, file = spec.partition("=")
    if not sep or not name or not file:
        raise typer.BadParameter(f"{spec!r}: expected NAME=FILE.npy", param_hint="--input")
    try:
        return name, np.load(file, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise typer.BadParameter(f"{file}: cannot read a .npy array ({e})", param_hint="--input") from None


def main() -> None:
    app()


if __name__ == "__main__":
    sys.exit(main())
