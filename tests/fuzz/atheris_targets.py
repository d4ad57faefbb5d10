"""Coverage-guided fuzz targets (atheris, libFuzzer's engine) for what the loader parses before it trusts anything:
the archive reader, the manifest parser, the expression evaluator and the safetensors index.

The first byte of an input picks the target, the rest is its input. Every target may raise a TcError (that is
the loader refusing the input, correctly); any other exception, a hang or a crash is a finding, which atheris
reports and saves. Nothing here loads native code, so coverage guidance stays on the parsers.

    python tests/fuzz/atheris_targets.py --make-corpus CORPUS          # seeds from a real package
    python tests/fuzz/atheris_targets.py -max_total_time=600 -max_len=400000 CORPUS
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TARGETS = ("archive", "manifest", "expression", "safetensors")


def _setup():
    import atheris

    with atheris.instrument_imports(include=["tcexport.formats", "tcexport.loader"]):
        from tcexport.formats import expr as ex
        from tcexport.formats.errors import TcError
        from tcexport.formats.manifest import parse_manifest
        from tcexport.loader.archive import open_archive
        from tcexport.loader.weights import parse_safetensors
    fd = os.memfd_create("tcfuzz-archive") if hasattr(os, "memfd_create") else None
    path = f"/proc/self/fd/{fd}" if fd is not None else str(Path(os.environ.get("TMPDIR", "/tmp")) / "tcfuzz.tcpkg")
    env = {"a": 3, "b": 5, "batch": 7}

    def archive(data: bytes) -> None:
        if fd is not None:
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
        else:
            Path(path).write_bytes(data)
        open_archive(path)

    def manifest(data: bytes) -> None:
        parse_manifest(data)

    def expression(data: bytes) -> None:
        try:
            e = json.loads(data)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return  # not JSON: the manifest parser's JSON step, fuzzed above
        ex.validate(e, set(env))
        for fn in (lambda: ex.evaluate(e, env), lambda: ex.compile_expr(e)(env)):
            try:
                fn()
            except TcError:
                pass
        ex.to_text(e)
        ex.free_symbols(e)

    def safetensors(data: bytes) -> None:
        parse_safetensors(memoryview(data), "fuzz")

    targets = (archive, manifest, expression, safetensors)

    def test_one_input(data: bytes) -> None:
        if not data:
            return
        try:
            targets[data[0] % len(targets)](data[1:])
        except TcError:
            pass
    return atheris, test_one_input


def make_corpus(folder: Path) -> None:
    """Seeds: a real package whole, its manifest, its weights, and a few expressions, each behind its selector."""
    sys.path.insert(0, str(HERE.parent))
    import tempfile

    from loader_helpers import build_package, compile_kernel, default_members, read_entries

    folder.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="tcfuzz-corpus-"))
    package = build_package(work / "add.tcpkg", members=default_members(compile_kernel(work)))
    entries = dict(read_entries(package))
    seeds = {"archive": package.read_bytes(), "manifest": entries["manifest.json"],
             "safetensors": entries["weights.safetensors"]}
    exprs = [["*", 16, "batch"], ["==", ["%", "a", 4], 0], ["max", "a", ["+", "b", 1]], ["//", "a", ["-", "b", 2]],
             ["and", ["<=", 1, "a"], ["not", ["==", "b", 0]]], 42, "batch"]
    for k, e in enumerate(exprs):
        seeds[f"expression{k}"] = json.dumps(e).encode()
    for name, data in seeds.items():
        selector = TARGETS.index(name.rstrip("0123456789"))
        (folder / f"seed-{name}").write_bytes(bytes([selector]) + data)


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--make-corpus":
        make_corpus(Path(sys.argv[2]))
        return
    atheris, test_one_input = _setup()
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
