"""`tcexport MODEL.py [--dynamic SPEC]... [-o OUT.tcpkg] [--target cpu] [--json] [--dump DIR] [--verify]
[--autotune [--autotune-at SIZES]... | --tuning PKG] [--report]`.

Exit codes: 0 success; 2 usage error; 10-17 export errors (see exporter/errors.py: 11 model file, 12 dynamic
spec, 13 capture, 14 unsupported op, 15 build, 16 ONNX export, 17 output: the package, the ONNX file, the --dump
folder or a build folder could not be written, e.g. a read-only folder or a full disk); 20 `--verify` found a
mismatch; 70 internal error (a tcexport bug: the traceback goes to stderr); other TcError codes as in
formats/errors.py. With --json every failure, a bug included, still prints one JSON object on stdout:
{"ok": false, "error": NAME, "message": TEXT, "exit_code": CODE}.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path
from typing import List, Optional

import typer

from tcexport.formats.errors import TcError

from tcexport.exporter.errors import output_error

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
VERIFY_FAILED = 20
INTERNAL_ERROR = 70   # sysexits' EX_SOFTWARE


def _progress(quiet: bool):
    def on_stage(name: str, seconds: float) -> None:
        if not quiet:
            print(f"  {name:<8} {seconds:7.2f} s", file=sys.stderr, flush=True)
    return on_stage


@app.command()
def export(
    model_file: Path = typer.Argument(..., help="Python file defining model() and example_inputs()"),
    dynamic: List[str] = typer.Option([], "--dynamic", "-d", help="dynamic dims: batch, batch=1:512, "
                                      "seq=1:2048@ids.1,mask.1, derived 2*seq@pairs.1 (repeatable)"),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="archive path (default MODEL.tcpkg)"),
    target: str = typer.Option("cpu", "--target", help="targets: cpu, cuda:sm_XX, or a list such as "
                               "cpu,cuda:sm_80,sm_90 (CUDA cubins build without a GPU)"),
    as_json: bool = typer.Option(False, "--json", help="print a machine-readable summary on stdout"),
    dump: Optional[Path] = typer.Option(None, "--dump", help="write every stage's output into this folder"),
    verify: bool = typer.Option(False, "--verify", help="after export, run the package torch-free and "
                                "compare with eager PyTorch"),
    onnx: bool = typer.Option(False, "--onnx", help="also write OUT.onnx (same dynamic dims), checked with "
                              "onnx.checker"),
    onnx_embed: bool = typer.Option(False, "--onnx-embed", help="like --onnx, and store it inside the archive"),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="no progress output"),
    backward: bool = typer.Option(False, "--backward", help="also package a training forward and a backward "
                                  "(for every target): gradients of every parameter that requires grad"),
    grad_inputs: List[str] = typer.Option([], "--grad-inputs", help="with --backward, inputs whose gradients the "
                                          "backward also returns (repeatable or comma-separated)"),
    autotune: bool = typer.Option(False, "--autotune", help="measure GEMM and attention tiles inside the model "
                                  "on this machine's GPU and keep the fastest (recorded in the manifest)"),
    autotune_at: List[str] = typer.Option([], "--autotune-at", help="with --autotune, dynamic sizes to measure "
                                          "at, e.g. batch=8 (repeatable; default: the example inputs)"),
    tuning: Optional[Path] = typer.Option(None, "--tuning", help="build with the tuning recorded in this "
                                          ".tcpkg (made with --autotune): no GPU needed, same archive"),
    sign_key: Optional[Path] = typer.Option(None, "--sign-key", help="sign the package with this ed25519 private "
                                            "key (PEM; openssl genpkey -algorithm ed25519 -out KEY.pem)"),
    report: bool = typer.Option(False, "--report", help="write nothing; list everything that blocks the export "
                                "(data-dependent lines, unsupported ops, ...) in one pass; exit 0 when nothing "
                                "does, else the export's error code"),
) -> None:
    """Export MODEL.py into a .tcpkg archive."""
    from tcexport.exporter import export as export_model, pipeline
    from tcexport.exporter.check import verify as verify_mod
    from tcexport.exporter.front.model_file import load_model_file

    out = output or model_file.with_suffix(".tcpkg")
    quiet = quiet or as_json
    t0 = time.perf_counter()
    try:
        if not quiet:
            print(f"checking {model_file}" if report else f"exporting {model_file} -> {out}", file=sys.stderr)
        spec = load_model_file(model_file)
        if report:
            _report(spec, model_file, dynamic, target, backward, grad_inputs, as_json)
        if sign_key is not None:  # a key that cannot sign fails now, not after minutes of export
            from tcexport.formats.attestation import load_private_key
            load_private_key(sign_key, "--sign-key")
        pkg = export_model(spec.module, spec.example_inputs, spec.dynamic_shapes, pipeline.parse_targets(target),
                           dynamic=dynamic, name=model_file.stem, dump=dump, on_stage=_progress(quiet),
                           source_path=str(model_file),
                           onnx="embed" if onnx_embed else "file" if onnx else None, backward=backward,
                           grad_inputs=[n.strip() for g in grad_inputs for n in g.split(",") if n.strip()],
                           autotune=autotune, autotune_at=autotune_at, tuning=tuning)
        try:
            pkg.save(out, sign_key=sign_key)
        except OSError as e:
            raise output_error("the package", out, e, "pass another path with -o") from e
        seconds = time.perf_counter() - t0
        summary = {"ok": True, "package": str(out), "bytes": out.stat().st_size, "export_seconds": round(seconds, 3),
                   "digest": pkg.digest, "signed": sign_key is not None,
                   "stages": {k: round(v, 3) for k, v in pkg.timings.items()},
                   "inputs": [_spec_json(s) for s in pkg.manifest.inputs],
                   "outputs": [_spec_json(s) for s in pkg.manifest.outputs],
                   "symbols": {s.name: [s.min, s.max] for s in pkg.manifest.symbols},
                   "kernels": pkg.manifest.plan["kernels"],
                   "targets": [f"{k.target}:{k.isa}" for k in pkg.manifest.kernels],
                   "guards": [{"rule": _expr_text(g.expr), "message": g.message} for g in pkg.manifest.guards],
                   "warnings": list(pkg.warnings)}
        if pkg.manifest.training is not None:
            t = pkg.manifest.training
            summary["training"] = {"trainable": list(t.trainable), "saved": len(t.forward.outputs) - len(
                pkg.manifest.outputs), "gradients": [name for _, name in t.gradients]}
        for w in pkg.warnings if not quiet else ():
            print(f"warning: {w}", file=sys.stderr)
        if pkg.onnx is not None:
            from tcexport.exporter.check.onnx import write_onnx

            summary["onnx"] = str(write_onnx(pkg.onnx, out.with_suffix(".onnx")))
        if not quiet:
            print(f"wrote {out} ({summary['bytes']:,} bytes, {len(summary['kernels'])} kernels) "
                  f"in {seconds:.2f} s", file=sys.stderr)
        if verify:
            report = verify_mod.verify(spec, out, quiet=quiet)
            summary["verify"] = report
            if not report["ok"]:
                _finish(summary, as_json)
                raise typer.Exit(VERIFY_FAILED)
        _finish(summary, as_json)
    except TcError as e:
        _fail(type(e).__name__, str(e), e.exit_code, as_json)
    except typer.Exit:
        raise
    except Exception as e:  # noqa: BLE001 - a bug: the report still has to reach the caller, --json or not
        traceback.print_exc()
        _fail("InternalError", f"tcexport failed with {type(e).__name__}: {e} (a tcexport bug; please report it "
              "with the traceback printed on stderr)", INTERNAL_ERROR, as_json)


def _report(spec, model_file: Path, dynamic, target: str, backward: bool, grad_inputs, as_json: bool) -> None:
    """--report: exporter/blockers.py's list, as text on stderr or a list in the JSON summary."""
    from tcexport.exporter.pipeline import parse_targets
    from tcexport.exporter.blockers import report

    blockers = report(spec.module, spec.example_inputs, spec.dynamic_shapes, parse_targets(target), dynamic=dynamic,
                      source_path=str(model_file), backward=backward,
                      grad_inputs=[n.strip() for g in grad_inputs for n in g.split(",") if n.strip()])
    code = blockers[0].exit_code if blockers else 0
    if as_json:
        print(json.dumps({"ok": not blockers, "report": True, "exit_code": code,
                          "blockers": [b.to_json() for b in blockers]}, indent=1))
    else:
        for k, b in enumerate(blockers, 1):
            print(f"blocker {k}/{len(blockers)} ({b.error}, exit {b.exit_code}): {b.message}\n", file=sys.stderr)
        print(f"{model_file}: {len(blockers) or 'nothing'} blocking the export", file=sys.stderr)
    raise typer.Exit(code)


def _fail(error: str, message: str, exit_code: int, as_json: bool) -> None:
    if as_json:
        print(json.dumps({"ok": False, "error": error, "message": message, "exit_code": exit_code}, indent=1))
    else:
        print(f"error: {message}", file=sys.stderr)
    raise typer.Exit(exit_code)


def _expr_text(e) -> str:
    from tcexport.formats.expr import to_text

    return to_text(e)


def _spec_json(s) -> dict:
    return {"name": s.name, "dtype": s.dtype, "shape": list(s.shape)}


def _finish(summary: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(summary, indent=1))


def main() -> None:
    import warnings

    # torch's own deprecation chatter (pytree LeafSpec) says nothing to a user of this tool
    warnings.filterwarnings("ignore", category=FutureWarning, message=".*LeafSpec.*")
    app()


if __name__ == "__main__":
    main()
