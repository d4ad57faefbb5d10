"""The benchmark harness runs end to end (a tiny slice of it: the MLP, two backends, one cold start), and the
probes in bench/probes/ are experiments that do nothing until their main() runs."""

from __future__ import annotations

import json
import os
import pkgutil
import subprocess
import sys

import pytest

from packages import ROOT

SHARED = {"common", "gemm_kernels"}  # bench/probes/ modules that are not probes: what the probes share
PROBES = sorted(m.name for m in pkgutil.iter_modules([str(ROOT / "bench" / "probes")]) if m.name not in SHARED)

# Run in a fresh process: import the product (every exporter module) first; note its modules' globals, the
# environment, Triton's allocator and the files in the temporary and the current folder; then import every module of
# bench/probes/ and ask each probe for --help; report what changed.
IMPORT_PROBES = r"""
import contextlib, importlib, io, json, os, pkgutil, re, sys, tempfile, types
import triton.runtime._allocation as allocation
import tcexport.exporter, tcexport.loader
for info in pkgutil.walk_packages(tcexport.exporter.__path__, "tcexport.exporter."):  # every room, wherever it is
    if not info.name.endswith(".__main__"):
        importlib.import_module(info.name)

def globals_of(prefix):
    return {n: dict(vars(m)) for n, m in list(sys.modules.items()) if n.startswith(prefix) and m is not None}

def files():
    return sorted(os.listdir(tempfile.gettempdir())) + sorted(os.listdir("."))

product, env, allocator, before = globals_of("tcexport"), dict(os.environ), allocation._allocator.get(), files()
out, report = io.StringIO(), {"probes": {}}
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
    for name in sys.argv[1:]:
        importlib.import_module("bench.probes." + name)
report["import_output"] = out.getvalue()
report["patched"] = sorted(f"{n}.{k}" for n, before in product.items() for k, v in vars(sys.modules[n]).items()
                           if (k in before and before[k] is not v)
                           or (k not in before and not isinstance(v, types.ModuleType)))
report["environment"] = sorted(set(os.environ.items()) ^ set(env.items()))
report["allocator_set"] = allocation._allocator.get() is not allocator
report["new_files"] = sorted(set(files()) - set(before))
for name in sys.argv[1:]:
    mod = sys.modules["bench.probes." + name]
    row = report["probes"][name] = {"main": callable(getattr(mod, "main", None))}
    row["results"] = re.findall(r"bench/results/[\w.-]+\.md", mod.__doc__ or "")
    if row["main"]:
        help_out = io.StringIO()
        with contextlib.redirect_stdout(help_out), contextlib.redirect_stderr(help_out):
            try:
                mod.main(["--help"])
            except SystemExit as e:
                row["help_exit"] = e.code
        row["help"] = help_out.getvalue()
print(json.dumps(report))
"""


def test_probes_import_without_side_effects_and_have_a_main(tmp_path):
    """Importing a probe runs nothing (no output, no files, no change to the product's globals, the environment or
    Triton's allocator); each has a main() whose --help works without a GPU, a `__main__` guard, and names its
    results file, which exists."""
    env = {**os.environ, "TMPDIR": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""}
    r = subprocess.run([sys.executable, "-c", IMPORT_PROBES, *sorted(SHARED), *PROBES], capture_output=True,
                       text=True, cwd=tmp_path, env={**env, "PYTHONPATH": os.pathsep.join(
                           [str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])}, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(r.stdout.strip().splitlines()[-1])
    assert report["import_output"] == ""
    assert report["patched"] == [] and report["environment"] == [] and not report["allocator_set"]
    assert report["new_files"] == []
    assert len(PROBES) >= 10
    for name in PROBES:
        row = report["probes"][name]
        assert row["main"] and row["help_exit"] == 0 and "usage:" in row["help"], (name, row)
        assert row["results"] and all((ROOT / f).is_file() for f in row["results"]), (name, row["results"])
        source = (ROOT / "bench" / "probes" / f"{name}.py").read_text()
        assert 'if __name__ == "__main__":\n    main()' in source, name


@pytest.mark.slow
def test_bench_writes_json_table_and_plots(tmp_path):
    pytest.importorskip("matplotlib")
    r = subprocess.run([sys.executable, "-m", "bench.run", "--suite", "cpu-quick", "--models", "mlp",
                        "--only", "eager", "tcpkg", "--cold-runs", "1", "--out", str(tmp_path)],
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    path = tmp_path / r.stdout.strip().splitlines()[-1].split("/")[-1]
    result = json.loads(path.read_text())
    rows = result["models"]["mlp/float32"]["backends"]
    assert set(rows) == {"eager", "tcpkg"}
    assert not [row.get("traceback") for row in rows.values() if "error" in row]
    tc = rows["tcpkg"]
    assert tc["size_bytes"] > 0 and tc["build_s"] > 0 and tc["max_abs_diff_vs_fp64"] < 1e-5
    assert set(map(int, tc["latency"])) == {1, 8, 64} and tc["cold_start"]["median_s"] > 0
    stem = path.stem
    for suffix in (".md", "-latency.png", "-cold-start.png"):
        assert (tmp_path / f"{stem}{suffix}").stat().st_size > 0
    assert "| tcpkg |" in (tmp_path / f"{stem}.md").read_text()
