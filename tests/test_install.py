"""The base install as a user gets it: ``pip install tcexport`` (no extras) into a fresh virtual environment is the
loader alone — numpy, safetensors, the BLAS — with both command lines working on argparse, and ``tcexport`` there
saying which extra to install. Marked ``install`` (excluded by default: it downloads from the package index and
takes a minute or two); run with ``pytest -m install``. It prints the measured size and import time."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOOLING = {"pip", "setuptools", "_distutils_hack", "pkg_resources", "wheel"}   # the venv's own, not ours
CLI_STACK = {"typer", "click", "rich", "pydantic", "pydantic_core", "pygments", "shellingham", "markdown_it"}
BASE_LIMIT_MB = 110   # measured 2026-12: 97.6 MiB (numpy 68.1, scipy-openblas32 25.8, tcexport 2.4, safetensors 1.3)


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


@pytest.mark.install
def test_base_install_is_small_and_loader_only(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".venv", ".git", "build", "*.egg-info", "__pycache__",
                                                              "bench", "tests"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", str(src)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    ours: dict[str, int] = {}
    for p in site.iterdir():   # numpy/, numpy.libs/, numpy-2.x.dist-info/ all count as numpy
        name = p.name.split("-")[0].split(".")[0].lower()
        if p.name != "__pycache__" and name not in TOOLING and name != "distutils":   # setuptools' .pth
            ours[name] = ours.get(name, 0) + (_size(p) if p.is_dir() else p.stat().st_size)
    assert not (set(ours) & CLI_STACK), sorted(ours)
    total_mb = sum(ours.values()) / 2 ** 20
    code = ("import sys, time; t = time.perf_counter(); import tcexport.loader; dt = time.perf_counter() - t; "
            "print(dt, 'torch' in sys.modules)")
    seconds, torch_loaded = subprocess.run([str(py), "-c", code], capture_output=True, text=True,
                                           check=True).stdout.split()
    print(f"base install: {total_mb:.1f} MB in {site} ("
          + ", ".join(f"{n} {b / 2 ** 20:.1f} MB" for n, b in sorted(ours.items(), key=lambda kv: -kv[1])) + "); "
          f"import tcexport.loader {float(seconds) * 1000:.0f} ms")
    assert total_mb < BASE_LIMIT_MB and torch_loaded == "False"
    bin_ = venv / "bin"
    assert subprocess.run([str(bin_ / "tcpkg"), "--version"], capture_output=True, text=True).returncode == 0
    r = subprocess.run([str(bin_ / "tcexport"), "model.py", "--json"], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": ""})
    doc = json.loads(r.stdout)
    assert r.returncode == 2 and doc["error"]["type"] == "MissingDependencyError"
    assert "pip install 'tcexport[export]'" in doc["error"]["message"]
