"""The benchmark harness runs end to end (a tiny slice of it: the MLP, two backends, one cold start)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from packages import ROOT

pytestmark = pytest.mark.slow
pytest.importorskip("matplotlib")


def test_bench_writes_json_table_and_plots(tmp_path):
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
