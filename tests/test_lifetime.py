"""A loaded model never changes or crashes because its file changed, and survives fork() (each scenario runs in a
child process, so a SIGBUS or a hang is a failed test, not a dead test run)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from loader_helpers import build_package, default_members
from packages import mlp_package


def _run(code: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)


CHANGE_WHILE_LOADED = """
import os, numpy as np, tcexport.loader as L
path = {path!r}
m = L.load(path)
x = np.random.default_rng(0).standard_normal({shape}).astype(np.float32)
before = m(x)
weights = m.archive.file_span(m.manifest.weights_file)
with open(path, "r+b") as f:          # rewrite the weights in place, as `cp new.tcpkg model.tcpkg` would
    f.seek(weights[0] + weights[1] // 2)
    f.write(os.urandom(min(4096, weights[1] // 2)))
assert np.array_equal(m(x), before), "answers changed with the file"
os.truncate(path, 0)                  # then truncate it: pages of a mapped file would now raise SIGBUS
assert np.array_equal(m(x), before), "answers changed after truncation"
with open(path, "wb") as f:           # and write something else entirely
    f.write(b"not a package")
assert np.array_equal(m(x), before)
print("ok")
"""


def test_truncate_and_overwrite_while_loaded(tmp_path, kernel):
    path = build_package(tmp_path / "add.tcpkg", members=default_members(kernel))
    r = _run(CHANGE_WHILE_LOADED.format(path=str(path), shape=(3, 4)))
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stderr)


@pytest.mark.slow
def test_truncate_and_overwrite_while_loaded_exported_model(tmp_path):
    path = tmp_path / "mlp.tcpkg"
    path.write_bytes(mlp_package().read_bytes())
    r = _run(CHANGE_WHILE_LOADED.format(path=str(path), shape=(16, 64)))
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stderr)


@pytest.mark.slow
def test_fork_after_threaded_calls(tmp_path):
    """A child forked after threaded calls in its parent (a prefork server) runs its calls on threads of its own:
    the runtime's pool starts afresh in the child. (GNU libgomp, which libraries used before, hung such a child;
    the loader still runs those older libraries' calls on one thread there, with a warning.)"""
    code = f"""
import os, signal, warnings, numpy as np, tcexport.loader as L
m = L.load({str(mlp_package())!r}, num_threads=2)
x = np.random.default_rng(0).standard_normal((512, 64)).astype(np.float32)
want = m(x)
pid = os.fork()
if pid == 0:
    signal.alarm(30)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ok = np.allclose(m(x), want, rtol=1e-5, atol=1e-7) and np.allclose(m(x), want, rtol=1e-5, atol=1e-7)
        m2 = L.load({str(mlp_package())!r}, num_threads=2)   # a model loaded in the child too
        ok = ok and np.allclose(m2(x), want, rtol=1e-5, atol=1e-7)
    threads = len(os.listdir("/proc/self/task"))             # the child's own pool: this thread and a worker
    os._exit(0 if ok and threads >= 2 else 3)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status))
assert np.allclose(m(x), want)        # the parent keeps its threads
"""
    r = _run(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "0", r.stdout


@pytest.mark.slow
def test_fork_before_any_call_keeps_threads(tmp_path):
    code = f"""
import os, warnings, numpy as np, tcexport.loader as L
m = L.load({str(mlp_package())!r}, num_threads=2)
pid = os.fork()
if pid == 0:
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # no one-thread fallback: the parent never started OpenMP threads
        m(np.ones((512, 64), np.float32))
    os._exit(0)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status))
"""
    r = _run(code)
    assert r.returncode == 0 and r.stdout.strip() == "0", (r.stdout, r.stderr)
