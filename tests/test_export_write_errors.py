"""Writing what an export produces: a read-only folder or a full disk is a typed error (valid --json, no temp
file left, an existing package untouched), a bug still answers --json, an unwritable build cache only costs a
warning, and what a killed export left behind (SIGKILL runs no cleanup) is removed by the next one."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from packages import EXAMPLES, mlp_package
from tcexport.exporter.cpu import build
from tcexport.exporter.errors import OutputError, output_error
from tcexport.formats.files import write_atomically

OLD = b"an older package, which a failed export must leave as it is\n"
PR_CAPBSET_DROP = 24
# what lets root write where the mode bits say no: DAC override, DAC read/search, owner checks
ROOT_BYPASS_CAPS = (1, 2, 3)


def tcexport(*args, preexec_fn=None, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tcexport.exporter.cli", *map(str, args)], capture_output=True,
                          text=True, preexec_fn=preexec_fn, env={**os.environ, **(env or {})})


def unprivileged() -> None:
    """preexec_fn: make mode bits bind, as they do for any user. As root, drop the capabilities that bypass them
    (the child stays uid 0, so it can still run this root-owned interpreter); without CAP_SETPCAP, become nobody."""
    if os.geteuid() != 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if all(libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0 for cap in ROOT_BYPASS_CAPS):
        return
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)


def file_size_limit(limit: int):
    """preexec_fn: writes past ``limit`` bytes fail with EFBIG (SIGXFSZ ignored), as a full disk fails them."""
    def preexec() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return preexec


def error_json(r: subprocess.CompletedProcess, code: int) -> dict:
    assert r.returncode == code, r.stdout + r.stderr
    out = json.loads(r.stdout)
    assert out["ok"] is False and out["exit_code"] == code and out["schema_version"] == 1
    assert set(out) == {"schema_version", "tool", "command", "ok", "error", "exit_code"}
    return out


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", ""])
    p.wait()
    return p.pid


@pytest.fixture
def live_pid():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield p.pid
    p.kill()
    p.wait()


@pytest.fixture(scope="module")
def warm_package() -> Path:
    """The example's package, exported in this process; it also fills the build cache the CLI runs below share."""
    return mlp_package()


@pytest.mark.slow
def test_read_only_output_folder(tmp_path, warm_package):
    folder = tmp_path / "ro"
    folder.mkdir()
    (folder / "mlp.tcpkg").write_bytes(OLD)
    folder.chmod(0o555)
    try:
        out = error_json(tcexport(EXAMPLES / "mlp.py", "-o", folder / "mlp.tcpkg", "--json",
                                  preexec_fn=unprivileged), OutputError.exit_code)
        assert out["error"]["type"] == "OutputError"
        message = out["error"]["message"]
        assert f"the package {folder / 'mlp.tcpkg'}" in message and "permission denied" in message
        assert "-o" in message.split("Fix:")[1]
        dump = error_json(tcexport(EXAMPLES / "mlp.py", "-o", tmp_path / "mlp.tcpkg", "--json", "--dump",
                                   folder / "dump", preexec_fn=unprivileged), OutputError.exit_code)
        assert "the --dump folder" in dump["error"]["message"]
        assert "pass another folder to --dump" in dump["error"]["message"]
    finally:
        folder.chmod(0o755)
    assert os.listdir(folder) == ["mlp.tcpkg"] and (folder / "mlp.tcpkg").read_bytes() == OLD
    assert not (tmp_path / "mlp.tcpkg").exists()


@pytest.mark.slow
def test_full_disk_leaves_old_package_and_no_temp(tmp_path, warm_package):
    target = tmp_path / "mlp.tcpkg"
    target.write_bytes(OLD)
    r = tcexport(EXAMPLES / "mlp.py", "-o", target, "--json",
                 preexec_fn=file_size_limit(warm_package.stat().st_size // 2))
    out = error_json(r, OutputError.exit_code)
    message = out["error"]["message"]
    assert f"the package {target}" in message and "EFBIG" in message and "ulimit" in message
    assert os.listdir(tmp_path) == ["mlp.tcpkg"] and target.read_bytes() == OLD


@pytest.mark.parametrize("code, words", [(errno.ENOSPC, "no space left"), (errno.EROFS, "read-only"),
                                         (errno.ENOTDIR, "not a folder")])
def test_output_error_names_path_cause_and_fix(code, words):
    e = output_error("the package", "/data/out/m.tcpkg", OSError(code, os.strerror(code)), "pass another path with -o")
    assert isinstance(e, OutputError) and e.exit_code == 17 and e.errno == code
    assert str(e).startswith("cannot write the package /data/out/m.tcpkg: ") and words in str(e)
    assert errno.errorcode[code] in str(e) and "Fix: " in str(e) and "-o" in str(e)


def test_a_bug_still_prints_json(tmp_path):
    model = tmp_path / "buggy.py"
    model.write_text((EXAMPLES / "mlp.py").read_text() + "\n\nimport tcexport.exporter.pipeline as _p\n"
                     "def _broken(*a, **k):\n    raise KeyError('a bug in a stage')\n_p.run_stages = _broken\n")
    r = tcexport(model, "--json", "-o", tmp_path / "m.tcpkg")
    out = error_json(r, 70)
    assert out["error"]["type"] == "InternalError"
    assert "KeyError" in out["error"]["message"] and "bug" in out["error"]["message"]
    assert "Traceback" in r.stderr and "a bug in a stage" in r.stderr


def test_killed_writers_temp_files_are_removed(tmp_path, live_pid):
    dead = dead_pid()
    stale = tmp_path / f".m.tcpkg.{dead}.abc123_x.tmp"
    kept = [tmp_path / f".m.tcpkg.{live_pid}.abc123_x.tmp",     # another export, still writing
            tmp_path / f".other.tcpkg.{dead}.abc123_x.tmp",     # another target's
            tmp_path / f".m.tcpkg.{dead}.locked00.tmp"]         # its pid means nothing here, but it holds the lock
    for p in [stale, *kept]:
        p.write_bytes(b"half a package")
    with open(kept[-1], "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        write_atomically(tmp_path / "m.tcpkg", b"new")
    assert not stale.exists() and all(p.exists() for p in kept)
    assert (tmp_path / "m.tcpkg").read_bytes() == b"new"
    new_temps = {p.name for p in tmp_path.iterdir()} - {p.name for p in kept} - {"m.tcpkg"}
    assert not new_temps


def test_killed_builds_folders_are_removed(tmp_path, monkeypatch, live_pid):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = dead_pid()
    stale = [tmp_path / f"tcexport-build-{dead}-abc123_x", tmp_path / f"tcexport-triton-{dead}-abc123_x"]
    kept = [tmp_path / f"tcexport-build-{live_pid}-abc123_x", tmp_path / "unrelated-build-1-x"]
    for folder in stale + kept:
        folder.mkdir()
        (folder / "model.cpp").write_text("// half a build")
    data = build.build_one('extern "C" int tc_answer() { return 42; }', build.ISA_LEVELS[-1], None)
    assert data.startswith(b"\x7fELF") and not stale[0].exists() and stale[1].exists()
    with build.build_folder("tcexport-triton-") as mine:     # the Triton build's folder, same rule
        assert mine.name.startswith(f"tcexport-triton-{os.getpid()}-") and not stale[1].exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in kept)


@pytest.mark.slow
def test_unwritable_build_cache_still_exports(tmp_path):
    cache = tmp_path / "cache"
    (cache / "build").mkdir(parents=True)
    cache.chmod(0o555)
    (cache / "build").chmod(0o555)
    try:
        r = tcexport(EXAMPLES / "mlp.py", "-o", tmp_path / "mlp.tcpkg", "--json", preexec_fn=unprivileged,
                     env={"TCEXPORT_CACHE": str(cache)})
    finally:
        (cache / "build").chmod(0o755)
        cache.chmod(0o755)
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["ok"] and (tmp_path / "mlp.tcpkg").stat().st_size > 0
    assert r.stderr.count("warning: the build cache") == 1 and "building without caching" in r.stderr
    assert not list((cache / "build").iterdir())
