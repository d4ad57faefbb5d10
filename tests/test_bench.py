"""The benchmark harness runs end to end (tiny slices of it: the MLP, two backends, one cold start; one zoo model
with floors, geomeans, the concurrency row and a family plot), its report labels failed backends, a backend past
its deadline is killed, and the probes in bench/probes/ are experiments that do nothing until their main() runs."""

from __future__ import annotations

import json
import os
import pkgutil
import subprocess
import sys
import time

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


@pytest.mark.slow
@pytest.mark.long  # test_bench_writes_json_table_and_plots runs the harness end to end in every run
def test_zoo_slice_writes_floors_geomeans_concurrency_and_family_plots(tmp_path):
    """A tiny slice of `--suite cpu-zoo` end to end: one small zoo model, ONNX Runtime and the package at batch 1,
    the floors from peaks measured in the run, geomean rows, the concurrency row (short), the family plot."""
    pytest.importorskip("matplotlib")
    pytest.importorskip("onnxruntime")
    r = subprocess.run([sys.executable, "-m", "bench.run", "--suite", "cpu-zoo", "--models", "mobilenetv3-small",
                        "--only", "onnxruntime", "tcpkg", "--batches", "1", "--concurrency-models",
                        "mobilenetv3-small", "--callers", "1", "2", "--concurrency-seconds", "0.3",
                        "--out", str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    path = tmp_path / r.stdout.strip().splitlines()[-1].split("/")[-1]
    result = json.loads(path.read_text())
    assert result["zoo"] and result["cold_runs"] == 0
    peaks = result["peaks"]
    assert peaks["gemm_flops_per_s"] > 1e8 and peaks["copy_bytes_per_s"] > 1e8
    model = result["models"]["mobilenetv3-small/float32"]
    assert model["family"] == "CNN"
    floor = model["floors"]["1"]
    assert 0.9e8 < floor["flops"] < 1.4e8  # 56 M multiply-adds at 224x224
    assert floor["bytes"] > 2.5e6 * 4  # at least the weights
    rows = model["backends"]
    assert set(rows) == {"onnxruntime", "tcpkg"}
    assert not [row.get("traceback") for row in rows.values() if "error" in row]
    for name, row in rows.items():
        lat = row["latency"]["1"]
        assert lat["ratio_to_compile"] is None  # torch.compile was not run
        assert lat["ratios"]["best of onnxruntime/openvino"] > 0 and lat["x_floor"] > 0.05  # peaks are noisy
        assert row["accuracy"]["ok"] and row["max_rel_diff_vs_fp64"] < 1e-4
        conc = row["concurrency"]
        assert conc["batch"] == 1 and set(conc) == {"batch", "1", "2"}
        assert conc["1"]["calls"] > 0 and conc["2"]["calls_per_s"] > 0
    assert rows["onnxruntime"]["latency"]["1"]["ratios"]["best of onnxruntime/openvino"] == 1.0
    md = (tmp_path / f"{path.stem}.md").read_text()
    assert "| **geomean** |" in md and "## Latency ÷ floor" in md and "## Concurrency" in md
    for suffix in ("-family-cnn.png", "-concurrency.png"):
        assert (tmp_path / f"{path.stem}{suffix}").stat().st_size > 0


def _zoo_result(gpt2_tcpkg_timed_out: bool) -> dict:
    """A zoo result as bench.run writes it (after its json round trip: batch keys are strings)."""
    def row(ms: dict) -> dict:
        return {"latency": {str(b): {"median_ms": v, "p10_ms": v, "p90_ms": v} for b, v in ms.items()}}

    models = {}
    for name, family, scale in (("resnet18", "CNN", 1.0), ("gpt2", "decoder LM", 2.0)):
        rows = {"torch.compile": row({1: 10 * scale, 8: 40 * scale}),
                "onnxruntime": row({1: 8 * scale, 8: 40 * scale}),
                "tcpkg": row({1: 5 * scale, 8: 80 * scale}),
                "openvino": {"latency": {}, "skipped": "n/a: openvino runs float32 models only (this run is x)"}}
        if name == "gpt2" and gpt2_tcpkg_timed_out:
            rows["tcpkg"] = {"latency": {}, "timed_out": True, "error": "timeout: still running after 0.1 min"}
        models[f"{name}/float32"] = {"batches": [1, 8], "family": family, "backends": rows,
                                     "floors": {b: {"flops": 1e9, "bytes": 1e7, "arith_ms": scale * int(b),
                                                    "memory_ms": 0.5} for b in ("1", "8")}}
    return {"suite": "cpu-zoo", "machine": "test", "date": "2026-12-04", "device": "cpu", "threads": 2,
            "cold_runs": 0, "zoo": True, "precision": None, "versions": {"torch": "x"}, "models": models,
            "peaks": {"gemm_flops_per_s": 1e11, "gemm": "g", "copy_bytes_per_s": 1e10, "copy": "c", "threads": 2}}


@pytest.mark.slow
def test_zoo_report_geomeans_and_labels_failed_backends(tmp_path):
    """The summary's ratios and geomean rows come from the latencies; a backend that timed out on a model keeps its
    column (✗ timeout), is left out of its geomean (k/N), is listed under Failures and marked in the plot; one not
    measured by design (OpenVINO under AMP) reads n/a."""
    pytest.importorskip("matplotlib")
    from bench import report, run, suite_report

    for timed_out in (False, True):
        result = _zoo_result(timed_out)
        for model in result["models"].values():
            run.add_ratios(model["backends"], "cpu", model["floors"])
        rows = result["models"]["resnet18/float32"]["backends"]
        assert rows["tcpkg"]["latency"]["1"]["ratios"] == {"torch.compile": 0.5, "best of onnxruntime/openvino": 0.625}
        assert rows["tcpkg"]["latency"]["1"]["x_floor"] == 5.0
        md = suite_report.markdown(result)
        compile_table = md.split("## Latency ÷ torch.compile")[1].split("##")[0]
        # torch.compile 1 everywhere; onnxruntime 0.8 at batch 1, 1 at batch 8; tcpkg 0.5 and 2
        if timed_out:
            assert "| gpt2/float32 | 8 | 1.00 | 1.00 | ✗ timeout | n/a |" in compile_table
            assert "| **geomean** | | **1.00** | **0.89** | **1.00** (2/4) | — |" in compile_table
            assert "- gpt2/float32 · tcpkg: timeout" in md
        else:
            assert "| gpt2/float32 | 8 | 1.00 | 1.00 | 2.00 | n/a |" in compile_table
            assert "| **geomean** | | **1.00** | **0.89** | **1.00** | — |" in compile_table
            assert "## Failures" not in md
        assert "Not measured by design: n/a: openvino runs float32 models only." in md
        report.write_all(result, tmp_path, f"r{int(timed_out)}")
        for suffix in (".md", "-family-cnn.png", "-family-decoder-lm.png"):
            assert (tmp_path / f"r{int(timed_out)}{suffix}").stat().st_size > 0


def test_isolated_backend_past_its_deadline_is_killed_with_what_it_started(tmp_path):
    """--max-minutes-per-backend: a (model, backend) process past its deadline is killed together with the
    processes it started (its process group), and its row says timeout; one that dies says so."""
    from bench.isolate import run_isolated

    pid_file = tmp_path / "pid"
    row = run_isolated(subprocess.run, (["sh", "-c", f"echo $$ > {pid_file}; exec sleep 120"],), 3.0)
    assert row["timed_out"] and row["error"].startswith("timeout:") and row["latency"] == {}
    pid = int(pid_file.read_text())
    for _ in range(50):  # the orphaned grandchild is reaped by init shortly after the kill
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the backend's child process {pid} outlived the timeout")
    died = run_isolated(os._exit, (3,), 60.0)
    assert died["error"] == "process: died with exit code 3 before answering"
    assert run_isolated(len, ("abc",), 60.0) == 3


def test_merge_joins_slices_of_one_suite_and_refuses_others():
    """Slices of a zoo run (by models, or by backends of a model) merge into one result with the ratios computed
    over the merged rows; a slice from another machine or precision is refused with the field at fault."""
    from bench.merge import MergeError, merge

    a, b = _zoo_result(False), _zoo_result(True)
    del a["models"]["gpt2/float32"]
    del b["models"]["resnet18/float32"]["backends"]["torch.compile"]  # resnet18's base comes from slice a only
    merged = merge([a, b], ["a.json", "b.json"])
    assert list(merged["models"]) == ["resnet18/float32", "gpt2/float32"]
    assert merged["models"]["gpt2/float32"]["backends"]["tcpkg"]["timed_out"]
    resnet = merged["models"]["resnet18/float32"]["backends"]
    assert list(resnet) == ["torch.compile", "onnxruntime", "tcpkg", "openvino"]
    assert resnet["tcpkg"]["latency"]["8"]["ratios"]["torch.compile"] == 2.0
    assert merged["merged_from"] == ["a.json", "b.json"] and set(merged["peaks_by_run"]) == {"a.json", "b.json"}
    b["precision"] = "bf16"
    with pytest.raises(MergeError, match="b.json: precision is 'bf16', but a.json has None"):
        merge([a, b], ["a.json", "b.json"])


def test_zoo_table_peers_only_run_keeps_tcexport_columns_and_counts_what_ran():
    """A --only-peers row whose worker died is the peers' failure (tcexport's merged columns stay), and a peer
    past the deadline is left out of its count; the footnote says which columns this run filled."""
    sys.path.insert(0, str(ROOT))
    from bench.zoo_table import _worker, markdown

    row = _worker("no-such-model", ["aoti"], True, 120)
    assert "pass" not in row and row["aoti"]["pass"] is False and row["aoti"]["error"].startswith("exit"), row
    merged = {"model": "gpt2", "family": "decoder LM", "library": "transformers", "pass": True, "export_s": 1.0,
              "from": "m, 2026-12-04"}
    rows = [{**merged, **row, "model": "gpt2"},
            {**merged, "model": "bert", "aoti": {"pass": None, "error": "NotRun"}},
            {**merged, "model": "t5", "aoti": {"pass": True}}]
    text = markdown({"machine": "m", "date": "d", "torch": "t", "rows": rows,
                     "command": "python -m bench.zoo_table --peers aoti --only-peers --merge x.json",
                     "only_peers": ["aoti"]})
    assert "tcexport: **3 / 3 pass**; aoti: 1 / 2" in text, text
    assert "this run tried aoti" in text and "| gpt2 † | decoder LM | transformers | pass |" in text, text
