"""``tcexport MODEL.py [--dynamic SPEC]... [-o OUT.tcpkg] [--target cpu] [--json] [--dump DIR] [--verify] ...``
(``tcexport --help`` lists every option; ``build_parser`` declares each once).

Exit codes: 0 success; 2 usage error (also: the export extra is not installed); 10-18 export errors (see
exporter/errors.py: 11 model file, 12 dynamic spec, 13 capture, 14 unsupported op, 15 build, 16 ONNX export,
17 output: the package, the ONNX file, the --dump folder or a build folder could not be written; 18 methods: an
option or declaration that cannot keep them); 20 `--verify`
found a mismatch; 70 internal error (a tcexport bug: the traceback goes to stderr); other TcError codes as in
formats/errors.py (3: the package built fails its own loader's checks, so nothing was written). With --json stdout
holds exactly one JSON document (formats/cli_json.py, docs/cli-json.md), failures, usage errors and bugs included;
whatever the model prints while it is loaded, captured or verified goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Sequence, TextIO

from tcexport.formats import cli_json
from tcexport.formats.errors import TcError
from tcexport.loader.cli_base import (EXIT_CODES, ArgumentParser, MissingDependencyError, Reporter, UsageError,
                                      add_version, human_bytes, stdout_closed, wants_json)

TOOL = "tcexport"
VERIFY_FAILED = 20
INTERNAL_ERROR = cli_json.INTERNAL_ERROR
EXPORT_EXTRA = "pip install 'tcexport[export]'"


class VerifyMismatchError(TcError):
    """``--verify`` found outputs that differ from eager PyTorch (the package was written; the report says where)."""

    exit_code = VERIFY_FAILED


def build_parser() -> ArgumentParser:
    """Every tcexport option, declared once with its type, default and help."""
    p = ArgumentParser(prog=TOOL, description="Export MODEL.py into a .tcpkg archive.", epilog=EXIT_CODES)
    add_version(p, TOOL)
    p.add_argument("model_files", type=Path, nargs="*", metavar="MODEL.py", help="Python file defining model() "
                   "and example_inputs() (and optionally dynamic_shapes); several files (or --models) build one "
                   "package each into the folder -o names")
    p.add_argument("--models", type=Path, metavar="LIST", help="a model list for CI prebuilds: one model per line, "
                   "MODEL.py [--target T] [--dynamic D]... [--precision P] [-o OUT] (see examples/ci/models.txt)")
    p.add_argument("--jobs", type=int, default=1, metavar="N", help="with several models, how many build at once "
                   "(each in its own process; default 1)")
    p.add_argument("-d", "--dynamic", action="append", default=[], metavar="SPEC",
                   help="dynamic dims: batch, batch=1:512, seq=1:2048@ids.1,mask.1, derived 2*seq@pairs.1 "
                   "(repeatable); for a model with methods a SPEC applies to every method, METHOD:SPEC to one")
    p.add_argument("-o", "--output", type=Path, help="archive path (default MODEL.tcpkg)")
    p.add_argument("--target", default="cpu", help="targets: cpu, cuda:sm_XX, or a list such as "
                   "cpu,cuda:sm_80,sm_90 (CUDA cubins build without a GPU) (default: cpu)")
    p.add_argument("--json", action="store_true", help="print one machine-readable JSON document on stdout "
                   "(docs/cli-json.md)")
    p.add_argument("--dump", type=Path, metavar="DIR", help="write every stage's output into this folder")
    p.add_argument("--verify", action="store_true", help="after export, run the package torch-free and compare "
                   "with eager PyTorch")
    p.add_argument("--onnx", action="store_true", help="also write OUT.onnx (same dynamic dims), checked with "
                   "onnx.checker")
    p.add_argument("--onnx-embed", action="store_true", help="like --onnx, and store it inside the archive")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    p.add_argument("--backward", action="store_true", help="also package a training forward and a backward "
                   "(for every target): gradients of every parameter that requires grad")
    p.add_argument("--grad-inputs", action="append", default=[], metavar="NAMES", help="with --backward, inputs "
                   "whose gradients the backward also returns (repeatable or comma-separated)")
    p.add_argument("--autotune", action="store_true", help="measure GEMM and attention tiles inside the model on "
                   "this machine's GPU and keep the fastest (recorded in the manifest)")
    p.add_argument("--autotune-at", action="append", default=[], metavar="SIZES", help="with --autotune, "
                   "dynamic sizes to measure at, e.g. batch=8 (repeatable; default: the example inputs)")
    p.add_argument("--tuning", type=Path, metavar="PKG", help="build with the tuning recorded in this .tcpkg "
                   "(made with --autotune): no GPU needed, same archive")
    p.add_argument("--sign-key", type=Path, metavar="KEY.pem", help="sign the package with this ed25519 private "
                   "key (PEM; openssl genpkey -algorithm ed25519 -out KEY.pem)")
    p.add_argument("--report", action="store_true", help="write nothing; list everything that blocks the export "
                   "(data-dependent lines, unsupported ops, ...) in one pass; exit 0 when nothing does, else the "
                   "export's error code")
    p.add_argument("--precision", choices=["bf16", "fp16"], help="export a float32 model as it computes under "
                   "torch.autocast(\"cuda\", dtype): GEMMs, convolutions and attention in 16 bits (float32 "
                   "accumulation), norms, softmax and reductions in float32, GEMM weights stored in 16 bits")
    p.add_argument("--model-version", metavar="V", help="the model's version, written to the manifest "
                   "(shown by tcpkg inspect)")
    p.add_argument("--meta", action="append", default=[], metavar="KEY=VALUE", help="metadata written to the "
                   "manifest (repeatable; shown by tcpkg inspect)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    import warnings

    argv = list(sys.argv[1:] if argv is None else argv)
    reporter = Reporter(TOOL, wants_json(argv))
    reporter.command = "export"
    # torch's own deprecation chatter (pytree LeafSpec) says nothing to a user of this tool
    warnings.filterwarnings("ignore", category=FutureWarning, message=".*LeafSpec.*")
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        try:
            metadata = parse_meta(args.meta)
        except UsageError as e:   # found after parsing: still show the usage
            e.usage = parser.format_usage()
            raise
        require_export_extra()
        if args.models is not None or len(args.model_files) > 1:
            reporter.command = "prebuild"
            with stdout_to_stderr(reporter):
                return prebuild(args, reporter)
        if len(args.model_files) != 1:
            raise UsageError("name a MODEL.py to export (or several, or --models LIST)", parser.format_usage())
        args.model_file = args.model_files[0]
        with stdout_to_stderr(reporter):
            return export(args, metadata, reporter)
    except TcError as e:
        return reporter.failure(e)
    except BrokenPipeError:
        return stdout_closed()
    except Exception as e:  # noqa: BLE001 - a bug: the report still has to reach the caller, --json or not
        traceback.print_exc()
        return reporter.failure(e, INTERNAL_ERROR, type_name="InternalError", message=(
            f"tcexport failed with {type(e).__name__}: {e} (a tcexport bug; please report it with the traceback "
            "printed on stderr)"))


def prebuild(args, reporter: Reporter) -> int:
    """Several packages in one call (exporter/prebuild.py): the list's models, then the files named on the command
    line with this command line's --target/--dynamic/--precision; one summary; exit 0 only when every one built."""
    from tcexport.exporter.prebuild import BuildItem, prebuild as build_all, read_list

    items = read_list(args.models) if args.models is not None else []
    items += [BuildItem(str(f), args.target, tuple(args.dynamic), None, args.precision) for f in args.model_files]
    quiet = args.quiet or args.json

    def progress(r) -> None:
        if not quiet:
            state = f"ok ({human_bytes(r.bytes)})" if r.ok else f"FAILED: {r.error}: {r.message.splitlines()[0]}"
            print(f"  {r.package}  {r.seconds:6.1f} s  {state}", file=sys.stderr, flush=True)

    summary = build_all(items, args.output or Path("."), jobs=args.jobs, sign_key=args.sign_key, on_item=progress)
    failed = [p for p in summary["packages"] if not p["ok"]]
    return reporter.success(summary, exit_code=failed[0]["exit_code"] if failed else 0)


def parse_meta(items: list[str]) -> dict[str, str]:
    """``--meta key=value`` flags -> a dict, each entry checked as the manifest checks it."""
    from tcexport.formats.errors import FormatError
    from tcexport.formats.manifest import check_metadata_entry

    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--meta {item!r}: expected KEY=VALUE, e.g. --meta git_sha=0a1b2c3")
        try:
            check_metadata_entry(key, value, f"--meta {item!r}")
        except FormatError as e:
            raise UsageError(str(e)) from None
        if key in out and out[key] != value:
            raise UsageError(f"--meta {key!r} is given twice ({out[key]!r} and {value!r}); give each key once")
        out[key] = value
    return out


def require_export_extra() -> None:
    """torch (and the rest of the export extra) is importable, else a MissingDependencyError that says how to
    install it: a loader-only install has tcpkg but cannot export."""
    import importlib.util

    missing = [name for name in ("torch", "sympy") if importlib.util.find_spec(name) is None]
    if missing:
        raise MissingDependencyError(
            f"tcexport needs the export extra, and {', '.join(missing)} is not installed (this looks like a "
            f"loader-only install, which runs packages with tcpkg but cannot build them). Install it: "
            f"{EXPORT_EXTRA} (and torch itself as the README says, e.g. pip install torch==2.13.0 --index-url "
            "https://download.pytorch.org/whl/cpu)")


@contextlib.contextmanager
def stdout_to_stderr(reporter: Reporter):
    """While the export runs, file descriptor 1 (Python's prints, C++ and subprocess output alike) points at
    stderr; the reporter keeps the real stdout, so ``--json`` output is the only thing there."""
    try:
        fd = sys.stdout.fileno()
        sys.stdout.flush()
    except (AttributeError, OSError, ValueError):   # not a real file (an embedding host): Python-level only
        with contextlib.redirect_stdout(sys.stderr):
            yield
        return
    saved = os.dup(fd)
    reporter.out = os.fdopen(os.dup(saved), "w", closefd=True)
    os.dup2(sys.stderr.fileno(), fd)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, fd)
        os.close(saved)
        reporter.out.flush()


def export(args, metadata: dict, reporter: Reporter) -> int:
    """The export the parsed command line asks for; returns the exit code."""
    from tcexport.exporter import export as export_model, pipeline
    from tcexport.exporter.front.model_file import load_model_file
    from tcexport.exporter.progress import for_stream

    out = args.output or args.model_file.with_suffix(".tcpkg")
    quiet = args.quiet or args.json
    err: TextIO = sys.stderr
    t0 = time.perf_counter()
    if not quiet:
        print(f"checking {args.model_file}" if args.report else f"exporting {args.model_file} -> {out}", file=err)
    spec = load_model_file(args.model_file)
    if args.report:
        return _report(spec, args, reporter)
    if args.sign_key is not None:  # a key that cannot sign fails now, not after minutes of export
        from tcexport.formats.attestation import load_private_key
        load_private_key(args.sign_key, "--sign-key")
    progress = for_stream(err, quiet)
    try:
        inputs = dict(methods=spec.methods) if spec.methods else \
            dict(example_inputs=spec.example_inputs, dynamic_shapes=spec.dynamic_shapes)
        pkg = export_model(spec.module, targets=pipeline.parse_targets(args.target), **inputs, dynamic=args.dynamic, name=args.model_file.stem,
                           dump=args.dump, progress=progress, source_path=str(args.model_file),
                           onnx="embed" if args.onnx_embed else "file" if args.onnx else None,
                           backward=args.backward,
                           grad_inputs=[n.strip() for g in args.grad_inputs for n in g.split(",") if n.strip()],
                           autotune=args.autotune, autotune_at=args.autotune_at, tuning=args.tuning,
                           model_version=args.model_version, metadata=metadata, precision=args.precision)
        progress.stage("write", f"checking with the loader and writing {out}")
        _save(pkg, out, args.sign_key)
    finally:
        progress.close()
    summary = _summary(pkg, out, time.perf_counter() - t0, args.sign_key is not None)
    for w in pkg.warnings if not quiet else ():
        print(f"warning: {w}", file=err)
    if pkg.onnx is not None:
        from tcexport.exporter.check.onnx import write_onnx

        summary["onnx"] = str(write_onnx(pkg.onnx, out.with_suffix(".onnx")))
    if not quiet:
        print(f"wrote {out} ({human_bytes(summary['bytes'])}, {len(summary['kernels'])} kernels) in "
              f"{summary['export_seconds']:.2f} s", file=err)
    if args.verify:
        from tcexport.exporter.check import verify as verify_mod

        if pkg.reference is not None:  # --precision: the package computes the autocast module, not the model
            spec = dataclasses.replace(spec, module=pkg.reference)
        if spec.methods:
            from tcexport.exporter.check.verify_methods import verify_methods

            report = verify_methods(spec, out, quiet=quiet)
        else:
            report = verify_mod.verify(spec, out, quiet=quiet)
        summary["verify"] = report
        if not report["ok"]:
            return _verify_failed(reporter, summary)
    return reporter.success(summary)


def _report(spec, args, reporter: Reporter) -> int:
    """--report: exporter/blockers.py's list, as text on stderr or a list in the JSON document."""
    from tcexport.exporter import report
    from tcexport.exporter.pipeline import parse_targets

    targets = parse_targets(args.target)
    options = dict(source_path=str(args.model_file), backward=args.backward,
                   grad_inputs=[n.strip() for g in args.grad_inputs for n in g.split(",") if n.strip()])
    if spec.methods:  # each method is captured on its own, so each is checked on its own
        from tcexport.exporter.front.methods import running, split_dynamic

        dynamic = split_dynamic(list(args.dynamic), tuple(m.name for m in spec.methods))
        blockers = [dataclasses.replace(b, method=m.name) for m in spec.methods
                    for b in report(running(spec.module, m.function), m.example_inputs, m.dynamic_shapes,
                                    targets, dynamic=dynamic[m.name], **options)]
    else:
        blockers = report(spec.module, spec.example_inputs, spec.dynamic_shapes, targets, dynamic=args.dynamic,
                          **options)
    code = blockers[0].exit_code if blockers else 0
    if not reporter.as_json:
        for k, b in enumerate(blockers, 1):
            where = f"method {b.method}, " if b.method else ""
            print(f"blocker {k}/{len(blockers)} ({where}{b.error}, exit {b.exit_code}): {b.message}\n",
                  file=sys.stderr)
        print(f"{args.model_file}: {len(blockers) or 'nothing'} blocking the export", file=sys.stderr)
    return reporter.success({"report": True, "blockers": [b.to_json() for b in blockers]}, exit_code=code)


def _save(pkg, out: Path, sign_key) -> None:
    from tcexport.exporter.errors import output_error

    try:
        pkg.save(out, sign_key=sign_key)
    except OSError as e:
        raise output_error("the package", out, e, "pass another path with -o") from e


def _verify_failed(reporter: Reporter, summary: dict) -> int:
    failed = [c for c in summary["verify"].get("cases", []) if not c.get("ok", True)]
    first = failed[0] if failed else {}
    err = VerifyMismatchError(f"--verify: the package differs from eager PyTorch in {len(failed)} case(s)"
                              + (f", first {first.get('case')!r}" if first else "") + "; the package was written "
                              f"to {summary['package']} (the JSON's verify report says where)")
    return reporter.failure(err, body=summary)


def _summary(pkg, out: Path, seconds: float, signed: bool) -> dict:
    from tcexport.formats.expr import to_text

    m = pkg.manifest
    summary = {"package": str(out), "bytes": out.stat().st_size, "export_seconds": round(seconds, 3),
               "digest": pkg.digest, "signed": signed,
               "model": {"name": m.model, "version": m.model_version, "metadata": dict(m.metadata)},
               "stages": {k: round(v, 3) for k, v in pkg.timings.items()},
               "inputs": [_spec_json(s) for s in m.inputs],
               "outputs": [_spec_json(s) for s in m.outputs],
               "symbols": {s.name: [s.min, s.max] for s in m.symbols},
               "kernels": m.plan["kernels"],
               "targets": [f"{k.target}:{k.isa}" for k in m.kernels],
               "guards": [{"rule": to_text(g.expr), "message": g.message} for g in m.guards],
               "warnings": list(pkg.warnings)}
    if m.methods:
        summary["methods"] = {x.name: {"inputs": [_spec_json(s) for s in v.inputs],
                                       "outputs": [_spec_json(s) for s in v.outputs],
                                       "symbols": {s.name: [s.min, s.max] for s in v.symbols},
                                       "kernels": _kernel_names(m.graphs[x.graph])}
                              for x, v in ((x, m.method(x.name)) for x in m.methods)}
    if m.training is not None:
        t = m.training
        summary["training"] = {"trainable": list(t.trainable), "saved": len(t.forward.outputs) - len(m.outputs),
                               "gradients": [name for _, name in t.gradients]}
    return summary


def _kernel_names(g) -> list[str]:
    """A graph's kernels by name: its CPU kernels, or where it has none its GPU kernels."""
    return list(g.kernels) or list(g.cuda.kernels if g.cuda is not None else ())


def _spec_json(s) -> dict:
    return {"name": s.name, "dtype": s.dtype, "shape": list(s.shape)}


if __name__ == "__main__":
    sys.exit(main())
