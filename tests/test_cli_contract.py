"""What CI relies on in both command lines: one versioned JSON document on stdout for every outcome (usage errors
included), --version, tcpkg's hand-off to installed commands, the message of a loader-only install, tcpkg inspect
--summary, and the pieces behind them (error fields, progress, sizes). The export-running ones are in
test_cli_export.py."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
import time
from importlib.metadata import EntryPoint

import numpy as np
import pytest

from tcexport.formats import cli_json
from tcexport.formats.errors import StaticDimError
from tcexport.loader import cli as tcpkg_cli
from tcexport.loader.cli_base import human_bytes, human_count

ENVELOPE = {"schema_version", "tool", "command", "ok", "exit_code"}


def run_cli(module: str, *args, env=None, pre: str = ""):
    code = f"import sys; {pre}from {module} import main; sys.exit(main())"
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, env=env)


def tcpkg(*args, **kw):
    return run_cli("tcexport.loader.cli", *args, **kw)


def tcexport(*args, **kw):
    return run_cli("tcexport.exporter.cli", *args, **kw)


def one_document(r: subprocess.CompletedProcess) -> dict:
    """stdout is exactly one JSON document whose exit_code is the process's."""
    doc = json.loads(r.stdout)
    assert ENVELOPE <= set(doc) and doc["schema_version"] == cli_json.SCHEMA_VERSION
    assert doc["exit_code"] == r.returncode and doc["ok"] == (r.returncode == 0)
    if not doc["ok"]:
        assert list(doc["error"]) == list(cli_json.ERROR_FIELDS)
    return doc


# -- usage errors and --version -----------------------------------------------------------------------------------

@pytest.mark.parametrize("cli, args, words", [
    (tcexport, ["m.py", "--dynamc", "batch", "--json"], "--dynamc"),
    (tcexport, ["--json"], "MODEL.py"),
    (tcexport, ["m.py", "--meta", "novalue", "--json"], "KEY=VALUE"),
    (tcpkg, ["inspect", "--json"], "package"),
    (tcpkg, ["inspect", "x.tcpkg", "--json", "--summry"], "--summry"),
    (tcpkg, ["run", "x.tcpkg", "--threads", "many", "--json"], "many"),
    (tcpkg, ["bogus-command", "--json"], "bogus-command"),
])
def test_usage_errors_are_json(cli, args, words):
    r = cli(*args)
    doc = one_document(r)
    assert r.returncode == 2 and doc["error"]["type"] == "UsageError" and words in doc["error"]["message"]
    assert doc["tool"] == ("tcexport" if cli is tcexport else "tcpkg")
    plain = cli(*[a for a in args if a != "--json"])
    assert plain.returncode == 2 and plain.stdout == "" and "usage:" in plain.stderr and words in plain.stderr


def test_version_and_switches():
    from importlib.metadata import version

    for cli, name in ((tcexport, "tcexport"), (tcpkg, "tcpkg")):
        r = cli("--version")
        assert r.returncode == 0 and r.stdout.strip() == f"{name} {version('tcexport')}"
    help_text = tcexport("--help").stdout
    assert "--verify " in help_text and "--json " in help_text and "<bool>" not in help_text
    assert "--meta KEY=VALUE" in help_text and "--model-version V" in help_text


# -- tcpkg hands commands to the layers above it -------------------------------------------------------------------

@pytest.fixture
def plugin_path(tmp_path):
    """A real distribution on sys.path registering two tcpkg commands: one that works, one whose import fails."""
    dist = tmp_path / "tcpkg_hello-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tcpkg-hello\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[tcpkg.commands]\nhello = tcpkg_hello:main\n"
                                           "needs-extra = tcpkg_needs_extra:main\ninspect = tcpkg_hello:main\n")
    (tmp_path / "tcpkg_hello.py").write_text(textwrap.dedent("""\
        import sys
        def main(argv):
            print("hello", argv)
            return 7 if "--fail" in argv else 0
    """))
    (tmp_path / "tcpkg_needs_extra.py").write_text("import a_package_that_is_not_installed\ndef main(argv):\n"
                                                    "    return 0\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}


def test_tcpkg_hands_off_to_installed_commands(plugin_path):
    r = tcpkg("hello", "a", "--fail", env=plugin_path)
    assert r.returncode == 7 and r.stdout.strip() == "hello ['a', '--fail']"
    assert tcpkg("hello", env=plugin_path).returncode == 0
    listing = tcpkg("--help", env=plugin_path)
    assert listing.returncode == 0 and "hello" in listing.stdout and "tcpkg_hello:main" in listing.stdout
    # a built-in command is never shadowed by an entry point of the same name
    assert "hello" not in tcpkg("inspect", "missing.tcpkg", env=plugin_path).stdout
    r = tcpkg("needs-extra", "--json", env=plugin_path)
    doc = one_document(r)
    assert r.returncode == 2 and doc["command"] == "needs-extra"
    assert doc["error"]["type"] == "MissingDependencyError"
    assert "a_package_that_is_not_installed" in doc["error"]["message"]
    assert "pip install 'tcpkg-hello'" in doc["error"]["message"]
    plain = tcpkg("needs-extra", env=plugin_path)
    assert plain.returncode == 2 and plain.stdout == "" and "pip install 'tcpkg-hello'" in plain.stderr


def test_tcexport_commands_point_at_the_serve_extra():
    """An entry point of tcexport itself whose module cannot be imported names tcexport's serve extra."""
    ep = EntryPoint("serve", "tcexport.serving.a_module_not_there:main", tcpkg_cli.COMMANDS_GROUP)
    with pytest.raises(tcpkg_cli.MissingDependencyError, match=r"pip install 'tcexport\[serve\]'") as e:
        tcpkg_cli.hand_off(ep, ["--port", "1"])
    assert e.value.exit_code == 2


# -- a loader-only install ----------------------------------------------------------------------------------------

BLOCK_TORCH = "sys.modules.update(torch=None, sympy=None, triton=None); "


def test_tcexport_without_torch_says_what_to_install(tmp_path):
    r = tcexport(tmp_path / "m.py", "--json", pre=BLOCK_TORCH)
    doc = one_document(r)
    assert r.returncode == 2 and doc["error"]["type"] == "MissingDependencyError"
    assert "pip install 'tcexport[export]'" in doc["error"]["message"]
    plain = tcexport(tmp_path / "m.py", pre=BLOCK_TORCH)
    assert plain.returncode == 2 and "pip install 'tcexport[export]'" in plain.stderr
    assert "Traceback" not in plain.stderr
    assert tcexport("--version", pre=BLOCK_TORCH).returncode == 0


def test_loader_import_is_small_and_fast():
    """``import tcexport.loader`` (and the tcpkg CLI module) pull in no torch, CLI framework or rich text stack;
    the time is printed for the record (CI logs it), and bounded loosely so a regression to torch (seconds) fails."""
    code = ("import sys, time; t = time.perf_counter(); import tcexport.loader, tcexport.loader.cli; "
            "dt = time.perf_counter() - t; heavy = sorted({m.split('.')[0] for m in sys.modules} & "
            "{'torch', 'typer', 'click', 'rich', 'pydantic', 'pygments', 'sympy', 'triton'}); print(dt, heavy)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    seconds, heavy = r.stdout.split(" ", 1)
    assert heavy.strip() == "[]", heavy
    print(f"import tcexport.loader: {float(seconds) * 1000:.0f} ms")
    assert float(seconds) < 3.0


# -- tcpkg inspect / run ------------------------------------------------------------------------------------------

def test_inspect_summary_and_json(package):
    r = tcpkg("inspect", package, "--summary")
    assert r.returncode == 0, r.stderr
    assert "parameters:  4 (4) in 1 tensors: 4 float32" in r.stdout
    assert "targets:     cpu:x86-64" in r.stdout and "kernels:     inference: cpu 1 (1 other)" in r.stdout
    assert "bytes:       cpu libraries" in r.stdout and " B" in r.stdout
    r = tcpkg("inspect", package, "--json", "--summary")
    doc = one_document(r)
    s = doc["summary"]
    assert s["parameters"] == 4 and s["targets"] == ["cpu:x86-64"] and "manifest" not in doc
    assert s["file_bytes"] == package.stat().st_size and sum(s["bytes"].values()) < s["file_bytes"]
    full = tcpkg("inspect", package)
    assert "batch: 1..64" in full.stdout and "bytes)  sha256" in full.stdout


def test_run_failure_is_json_with_fields(package, tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((2, 5), np.float32))
    r = tcpkg("run", package, "--input", f"x={tmp_path / 'x.npy'}", "--json", "-o", tmp_path / "out")
    doc = one_document(r)
    assert r.returncode == StaticDimError.exit_code and doc["command"] == "run"
    e = doc["error"]
    assert e["type"] == "StaticDimError" and e["input"] == "x" and e["dim"] == 1
    assert e["expected"] == 4 and e["got"] == 5
    bad = tcpkg("run", package, "--input", "x", "--json")
    assert bad.returncode == 2 and one_document(bad)["error"]["type"] == "UsageError"
    missing = tcpkg("inspect", tmp_path / "nope.tcpkg", "--json")
    doc = one_document(missing)
    assert missing.returncode == 3 and doc["verified"] is False and doc["error"]["type"] == "FormatError"


# -- the pieces ---------------------------------------------------------------------------------------------------

def test_error_fields_come_from_attributes():
    from tcexport.exporter.errors import DynamicSpecError, OutputError, UnsupportedOpError

    e = cli_json.error_fields(UnsupportedOpError("cannot export aten.foo", op="aten.foo",
                                                 source="/m/model.py:12 in forward: y = foo(x)"))
    assert (e["type"], e["op"], e["file"], e["line"]) == ("UnsupportedOpError", "aten.foo", "/m/model.py", 12)
    e = cli_json.error_fields(StaticDimError("x dim 1", input="x", dim=1, expected=4, got=(5,)))
    assert (e["input"], e["dim"], e["expected"], e["got"], e["symbol"]) == ("x", 1, 4, [5], None)
    e = cli_json.error_fields(OutputError("no", path="/ro/m.tcpkg", errno=13))
    assert e["path"] == "/ro/m.tcpkg" and e["message"] == "no"
    e = cli_json.error_fields(DynamicSpecError("typo", symbol="bacth", expected=["batch"], got="bacth"))
    assert (e["symbol"], e["expected"], e["got"]) == ("bacth", ["batch"], "bacth")
    json.dumps(cli_json.failure("tcpkg", "run", e, 5))


def test_human_sizes():
    assert [human_bytes(n) for n in (0, 1023, 1024, 1536, 10 ** 6, 5 * 2 ** 30, 2 ** 60)] == [
        "0 B", "1023 B", "1 KiB", "1.5 KiB", "977 KiB", "5 GiB", "1024 PiB"]
    assert [human_count(n) for n in (999, 25376, 124_439_808, 7 * 10 ** 9)] == ["999", "25.4k", "124.4M", "7.0B"]


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_live_on_a_terminal_only():
    from tcexport.exporter.progress import Progress, StageLog, TerminalProgress, for_stream

    assert type(for_stream(Tty(), quiet=True)) is Progress
    assert type(for_stream(io.StringIO(), quiet=False)) is StageLog
    tty = Tty()
    p = for_stream(tty, quiet=False)
    assert isinstance(p, TerminalProgress)
    p.stage("build_cuda", "building 112 cubins")
    p.step(37, 112, "cubins")
    time.sleep(0.25)   # the ticker redraws the clock while nothing else happens
    p.stage_done("build_cuda", 1.5)
    p.close()
    text = tty.getvalue()
    assert "build_cuda: building 112 cubins" in text and "build_cuda: cubins 37/112" in text
    assert text.count("build_cuda: cubins 37/112") >= 2 and "\r" in text
    assert "  build_cuda        1.50 s\n" in text and text.endswith("\r")
    quiet = io.StringIO()
    log = for_stream(quiet, quiet=False)
    log.stage("capture")
    log.step(1, 2, "x")
    log.stage_done("capture", 0.5)
    assert quiet.getvalue() == "  capture           0.50 s\n"


def test_cubin_workers_report_as_they_finish():
    """The parent counts each worker's lines from the real pipes as they come (cuda/build.py's _watch)."""
    from tcexport.exporter.cuda.build import _BUILT, _watch

    marker = _BUILT.decode().strip()
    workers = [subprocess.Popen([sys.executable, "-c", f"import sys, time\nfor k in range({n}):\n"
                                 f"    print({marker!r}, flush=True); print('noise', file=sys.stderr); "
                                 "time.sleep(0.05)"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE) for n in (3, 4)]
    seen = []
    errors = _watch(workers, seen.append)
    assert seen == sorted(seen) and seen[-1] == 7 and len(seen) >= 2
    assert [e.count("noise") for e in errors] == [3, 4]
    assert all(w.wait() == 0 for w in workers)


def test_manifest_model_version_and_metadata():
    """Optional, checked like every field, written only when set (older packages keep their bytes)."""
    import dataclasses

    from loader_helpers import make_manifest
    from tcexport.formats.errors import FormatError
    from tcexport.formats.manifest import parse_manifest

    plain = make_manifest()
    plain = dataclasses.replace(plain, members={n: {"sha256": "0" * 64, "size": 1} for n in
                                                [plain.weights_file, plain.kernels[0].file, *plain.sources]})
    assert b'"version"' not in plain.dumps() and b'"metadata"' not in plain.dumps()
    assert parse_manifest(plain.dumps()).model_version is None and parse_manifest(plain.dumps()).metadata == {}
    m = dataclasses.replace(plain, model_version="1.4.0", metadata={"git_sha": "0a1b", "owner": "vision"})
    back = parse_manifest(m.dumps())
    assert (back.model_version, back.metadata) == ("1.4.0", {"git_sha": "0a1b", "owner": "vision"})
    for model in ({"name": "add", "version": ""}, {"name": "add", "version": 3},
                  {"name": "add", "metadata": {"bad key": "x"}}, {"name": "add", "metadata": {"k": 1}},
                  {"name": "add", "metadata": ["k"]}, {"name": "add", "metadata": {"k": "v" * 5000}},
                  {"name": "add", "metadata": {f"k{i}": "v" for i in range(300)}}):
        d = json.loads(plain.dumps())
        d["model"] = model
        with pytest.raises(FormatError, match=r"model\.(version|metadata)"):
            parse_manifest(json.dumps(d).encode())
