"""``tcpkg``: inspect, verify, sign and run `.tcpkg` packages from the command line, without torch; and the door
to commands that layers above the loader install (``tcpkg serve``), found by entry point, never imported here.

Exit codes: 0 ok; 2 usage error (also: a command whose packages are not installed); otherwise the ``exit_code`` of
the TcError raised (3 format/integrity, 4 target, 5 guard, 6 kernel, 8 signature, 9 kernel cache); 70 a bug.
Errors go to stderr as ``error: <message>``; with ``--json`` stdout holds exactly one JSON document
(formats/cli_json.py, docs/cli-json.md), on failure too.
"""

from __future__ import annotations

import argparse
import pathlib
import textwrap
import sys
import traceback
from typing import Sequence

from tcexport.formats import cli_json
from tcexport.formats.errors import TcError

from .cli_base import (EXIT_CODES, ArgumentParser, MissingDependencyError, Reporter, UsageError, add_version,
                       stdout_closed, wants_json)

TOOL = "tcpkg"
COMMANDS_GROUP = "tcpkg.commands"   # entry points: NAME = "module:main", main(argv) -> int
BUILTIN = ("inspect", "verify", "sign", "run")
TRUSTED_KEY_HELP = "a trusted ed25519 public key (PEM); repeatable; default $TCEXPORT_TRUSTED_KEYS"


def installed_commands() -> dict:
    """``tcpkg NAME`` commands other packages register (group ``tcpkg.commands``), by name; built-ins win."""
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=COMMANDS_GROUP) if ep.name not in BUILTIN}


def build_parser(commands: dict | None = None) -> ArgumentParser:
    """Every option of every built-in command, declared once; ``commands`` (installed_commands) are listed in the
    help."""
    extra = "".join(f"\n  {name:<12} ({ep.value})" for name, ep in sorted((commands or {}).items()))
    parser = ArgumentParser(prog=TOOL, description="Inspect, verify, sign and run .tcpkg packages (no PyTorch "
                            "needed).", formatter_class=argparse.RawDescriptionHelpFormatter,
                            epilog=("installed commands (tcpkg NAME --help):" + extra + "\n\n" if extra else "")
                            + textwrap.fill(EXIT_CODES, 100))
    add_version(parser, TOOL)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def command(name: str, help: str) -> ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
        p.add_argument("package", type=pathlib.Path, help="the .tcpkg file")
        p.add_argument("--json", action="store_true", help="print the result as one JSON document on stdout")
        return p

    p = command("inspect", "Verify a package and describe it: signature, symbols, guards, kernels, weights, "
                "members.")
    p.add_argument("--summary", action="store_true", help="only the headline numbers: parameters, bytes, "
                   "kernels by kind, targets")
    p.add_argument("--trusted-key", action="append", type=pathlib.Path, default=[], help=TRUSTED_KEY_HELP)
    p = command("verify", "Exit 0 only if the package is intact and signed by a trusted key (exit 8 if not, 3 if "
                "damaged).")
    p.add_argument("--trusted-key", action="append", type=pathlib.Path, default=[], help=TRUSTED_KEY_HELP)
    p = command("sign", "Sign a package: adds an ed25519 signature over its digest; nothing else in the file "
                "changes.")
    p.add_argument("--key", type=pathlib.Path, required=True, help="ed25519 private key, PEM (openssl genpkey "
                   "-algorithm ed25519 -out KEY.pem)")
    p.add_argument("-o", "--output", type=pathlib.Path, help="write the signed package here (default: in place, "
                   "atomically)")
    p = command("run", "Run a package on .npy inputs and write each output to OUT/<output name>.npy.")
    p.add_argument("-i", "--input", dest="inputs", action="append", default=[], metavar="NAME=FILE.npy",
                   help="an input, once per input")
    p.add_argument("-o", "--out", dest="out_dir", type=pathlib.Path, default=pathlib.Path("."),
                   help="where to write <output>.npy (default: .)")
    p.add_argument("--threads", dest="num_threads", type=int, help="CPU threads (default: all allowed)")
    p.add_argument("--isa", help="force a CPU kernel bundle by isa name")
    p.add_argument("--method", help="the method to run, in a package with methods (default: its forward); a "
                   "package with state starts from its initial values and writes the state after the call to "
                   "OUT/state.<name>.npy")
    p.add_argument("--trusted-key", action="append", type=pathlib.Path, default=[], help=TRUSTED_KEY_HELP)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    reporter = Reporter(TOOL, wants_json(argv))
    reporter.command = argv[0] if argv and argv[0] in BUILTIN else None
    try:
        if argv and not argv[0].startswith("-") and argv[0] not in BUILTIN:
            installed = installed_commands().get(argv[0])
            if installed is not None:
                reporter.command = argv[0]
                return hand_off(installed, argv[1:])
        commands = installed_commands()
        parser = build_parser(commands)
        args = parser.parse_args(argv)
        if args.command is None:
            raise UsageError(f"{TOOL}: a command is required: one of {', '.join(BUILTIN + tuple(commands))}",
                             usage=parser.format_usage())
        reporter.command = args.command
        try:
            return RUN[args.command](args, reporter)
        except UsageError as e:   # found after parsing (--input NAME=FILE, verify without keys): the usage too
            e.usage = e.usage or parser.format_usage()
            raise
    except TcError as err:
        body = {"verified": False} if reporter.command in ("inspect", "verify") else None
        return reporter.failure(err, body=body)
    except BrokenPipeError:   # `tcpkg inspect X | head`: the reader left; not an error of ours
        return stdout_closed()
    except Exception as err:  # noqa: BLE001 - a bug: the report still reaches the caller, --json or not
        traceback.print_exc()
        return reporter.failure(err, cli_json.INTERNAL_ERROR, type_name="InternalError", message=(
            f"tcpkg failed with {type(err).__name__}: {err} (a tcexport bug; please report it with the traceback "
            "printed on stderr)"))


def hand_off(ep, argv: list[str]) -> int:
    """Run an installed command: its ``main(argv)``'s return value is the exit code. An import that fails for a
    missing package says which extra to install."""
    try:
        run = ep.load()
    except ImportError as e:
        dist = getattr(getattr(ep, "dist", None), "name", None) or "tcexport"
        pip = "pip install 'tcexport[serve]'" if dist == "tcexport" else f"pip install '{dist}'"
        raise MissingDependencyError(
            f"tcpkg {ep.name} needs packages that are not installed ({type(e).__name__}: {e}); install them: "
            f"{pip}") from None
    code = run(argv)
    return int(code) if code is not None else 0


def _keys(trusted_key: list):
    """The --trusted-key files, else $TCEXPORT_TRUSTED_KEYS, else None (no signature required)."""
    from .trust import trusted_key_sources

    return trusted_key_sources([str(p) for p in trusted_key] if trusted_key else None)


def cmd_inspect(args, reporter: Reporter) -> int:
    from .archive import open_archive
    from .cli_inspect import describe, signer_ids, summary, summary_lines

    archive = open_archive(args.package, trusted_keys=_keys(args.trusted_key))
    m = archive.manifest
    s = summary(m, args.package.stat().st_size)
    body = {"path": str(args.package), "verified": True, "digest": archive.digest,
            "signatures": signer_ids(archive), "signed_by": list(archive.signed_by), "summary": s}
    if not args.summary:
        body["manifest"] = m.to_json()
    text = summary_lines(s, m) if args.summary else describe(m, archive.names(), archive)
    return reporter.success(body, "\n".join(text))


def cmd_verify(args, reporter: Reporter) -> int:
    from .archive import open_archive

    keys = _keys(args.trusted_key)
    if keys is None:
        raise UsageError("tcpkg verify checks a signature against trusted keys: pass --trusted-key PUB.pem (or set "
                         "TCEXPORT_TRUSTED_KEYS); `tcpkg inspect` checks integrity alone")
    archive = open_archive(args.package, trusted_keys=keys)
    m = archive.manifest
    body = {"path": str(args.package), "verified": True, "digest": archive.digest,
            "signed_by": list(archive.signed_by), "format_version": list(m.format_version), "model": m.model}
    return reporter.success(body, f"{args.package}: verified, signed by trusted key "
                            f"{', '.join(archive.signed_by)} (package digest sha256 {archive.digest})")


def cmd_sign(args, reporter: Reporter) -> int:
    from .signing import sign_package

    out, keyid = sign_package(args.package, args.key, args.output)
    return reporter.success({"path": str(out), "signed": True, "keyid": keyid}, f"signed {out} with key {keyid}")


def cmd_run(args, reporter: Reporter) -> int:
    from .load import load

    arrays = dict(_read_input(spec) for spec in args.inputs)
    model = load(args.package, num_threads=args.num_threads, isa=args.isa, trusted_keys=_keys(args.trusted_key))
    name = args.method or "forward"
    method = model.methods[name]  # UnknownMethodError (exit 2) names the methods there are
    try:
        result = method(**arrays)
    except TcError as e:  # a guard or kernel error in the method asked for: say which it was
        if args.method and getattr(e, "method", None) is None:
            e.method = name
        raise
    results = result if isinstance(result, tuple) else (result,)
    report = [_save(args.out_dir, spec.name, spec.dtype, value) for spec, value in zip(method.outputs, results)]
    body: dict = {"method": name, "outputs": report}
    text = [f"{r['name']}: {r['dtype']}{r['shape']} -> {r['file']}" for r in report]
    if hasattr(model, "state"):
        body["state"] = [_save(args.out_dir, f"state.{k}", _dtype_of(v), v) for k, v in model.state().items()]
        text += [f"state {r['name']}: {r['dtype']}{r['shape']} -> {r['file']}" for r in body["state"]]
    return reporter.success(body, "\n".join(text))


def _dtype_of(a) -> str:
    from .dtypes import dtype_name

    return dtype_name(a.dtype)


def _save(folder: pathlib.Path, name: str, dtype: str, value) -> dict:
    """``value`` as FOLDER/<name>.npy (bfloat16 as its raw uint16 bits: numpy has no bfloat16)."""
    import numpy as np

    file = folder / f"{name}.npy"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        np.save(file, value.view(np.dtype(value.dtype.str)), allow_pickle=False)
    except OSError as e:
        raise TcError(f"cannot write {file}: {e}; pass another folder with -o") from None
    return {"name": name, "dtype": dtype, "shape": list(value.shape), "file": str(file)}


def _read_input(spec: str):
    import numpy as np

    name, sep, file = spec.partition("=")
    if not sep or not name or not file:
        raise UsageError(f"--input {spec!r}: expected NAME=FILE.npy")
    try:
        return name, np.load(file, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise UsageError(f"--input {spec!r}: {file} is not a readable .npy array ({e})") from None


RUN = {"inspect": cmd_inspect, "verify": cmd_verify, "sign": cmd_sign, "run": cmd_run}


if __name__ == "__main__":
    sys.exit(main())
