"""The zoo's table: every model in tests/zoo/zoo_models.py exported and compared with eager exactly as the zoo's
tests do (tests/zoo/zoo_harness.py), one subprocess per model (a crash or a hang costs one row), written to
``bench/results/<machine>-<date>-zoo.{json,md}``: model, family, library, pass/fail, error class, export time,
package size, largest error.

``--device cuda`` (on a GPU machine) exports each model for this GPU's arch instead and runs it with the CUDA
loader, compared as tests/zoo/test_zoo_gpu.py does, into ``<machine>-<date>-zoo-cuda.{json,md}``; ``--jobs N``
runs N models at a time (a GPU machine's cores build several models' cubins at once).

``--peers onnx,aoti`` adds whether ``torch.onnx.export(..., dynamo=True)`` (run in ONNX Runtime) and AOTInductor
(``torch._inductor.aoti_compile_and_package``) export each model with the same dynamic dims and match eager at the
same cases; AOTInductor compiles slowly, so this is opt-in, and rows merge into an existing table (``--merge``).
With ``--device cuda``, ``--peers aoti`` compiles AOTInductor for the GPU and runs it there.

    python -m bench.zoo_table                      # the whole zoo, tcexport only
    python -m bench.zoo_table --models llama,bert --peers onnx --merge bench/results/...-zoo.json
    python -m bench.zoo_table --device cuda --jobs 4   # on the GPU machine
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ZOO_DIR = ROOT / "tests" / "zoo"
MIN_SECONDS = 10  # no model exports and runs in less: one started later than this before --deadline is not run


def _zoo():
    sys.path[:0] = [str(ZOO_DIR), str(ROOT / "tests")]
    import zoo_models
    return zoo_models


def _short(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text[:300]


def _torch_dims(model, hint=None):
    """The zoo's dynamic dims as torch.export wants them: a named Dim per symbol, or ``hint`` (Dim.DYNAMIC) with
    the symbol's range at every place."""
    from torch.export import Dim

    if hint is not None:
        return {inp: {d: hint(min=model.dims[s][0], max=model.dims[s][1]) for d, s in where.items()}
                for inp, where in model.places.items()}
    dims = {s: Dim(s, min=lo, max=hi) for s, (lo, hi) in model.dims.items()}
    return {inp: {d: dims[s] for d, s in where.items()} for inp, where in model.places.items()}


def _capture(module, example, model):
    """torch.export with the zoo's Dims; where torch reports a constraint violation, the same ranges as
    ``Dim.DYNAMIC`` (torch then keeps the guards it cannot prove instead of failing), as a user would retry."""
    import torch

    try:
        return torch.export.export(module, example, dynamic_shapes=_torch_dims(model))
    except Exception:  # torch's constraint violations: retry with hints over the same ranges
        from torch.export import Dim

        return torch.export.export(module, example, dynamic_shapes=_torch_dims(model, Dim.DYNAMIC))


def _peer_row(model, peer: str, folder: Path, device: str = "cpu") -> dict:
    """Whether ``peer`` exports ``model`` with the zoo's dynamic dims and matches eager float32 on the CPU at the
    zoo's cases. ``device`` "cuda": AOTInductor compiles for the GPU (the module and its example moved there) and
    runs there, as the tcexport column's CUDA package does; ONNX Runtime runs on the CPU only here."""
    import numpy as np
    import torch
    from zoo_harness import TOLERANCE, relative_error

    module, example = model.build(), model.inputs(model.example)
    t0 = time.perf_counter()
    try:
        with torch.no_grad():
            if peer == "aoti":
                on = lambda xs: [x.to(device) for x in xs]  # noqa: E731
                program = _capture(module.to(device), tuple(on(example)), model)
                path = torch._inductor.aoti_compile_and_package(program, package_path=str(folder / "m.pt2"))
                run = torch._inductor.aoti_load_package(path)
                call = lambda xs: run(*on(xs))  # noqa: E731
                module = module.to("cpu")  # eager, the reference, runs on the CPU
            else:
                import onnxruntime as ort

                program = _capture(module, example, model)
                onnx_program = torch.onnx.export(program, example, dynamo=True)
                onnx_program.save(str(folder / "m.onnx"))
                session = ort.InferenceSession(str(folder / "m.onnx"), providers=["CPUExecutionProvider"])
                names = [i.name for i in session.get_inputs()]
                call = lambda xs: session.run(None, dict(zip(names, [x.numpy() for x in xs])))  # noqa: E731
        seconds = time.perf_counter() - t0
        worst = 0.0
        for sizes in model.cases():
            xs = model.inputs(sizes)
            with torch.no_grad():
                want = module(*xs)
                got = call(xs)
            got = got[0] if isinstance(got, (tuple, list)) else got
            got = got.detach().cpu().numpy() if hasattr(got, "detach") else np.asarray(got)
            err = relative_error(got, want)
            if not err <= TOLERANCE:
                return {"pass": False, "error": "Mismatch", "message": f"at {sizes}: {err:.2e}",
                        "seconds": round(seconds, 1), "max_error": err}
            worst = max(worst, err)
        return {"pass": True, "seconds": round(seconds, 1), "max_error": worst}
    except Exception as e:
        return {"pass": False, "error": type(e).__name__, "message": _short(e),
                "seconds": round(time.perf_counter() - t0, 1)}


def _cuda_target() -> str:
    import torch

    return "cuda:sm_%d%d" % torch.cuda.get_device_capability()


def _compare(model, path: Path, device: str) -> tuple[float, list[str]]:
    """The largest error over the model's cases, and notes (a range narrowed as the README's known difference):
    on the GPU, as tests/zoo/test_zoo_gpu.py compares; on the CPU, as test_zoo.py does."""
    from zoo_harness import compare, compare_cuda

    return (compare(model, path), []) if device == "cpu" else compare_cuda(model, path)


def run_one(name: str, peers: list[str], skip_tcexport: bool, device: str = "cpu") -> dict:
    """One model's row (runs in the worker subprocess)."""
    zm = _zoo()
    from vision_libs import define_missing_ops, unavailable
    from zoo_harness import export_model

    keep, why = define_missing_ops()
    model = zm.ZOO[name]
    row = {"model": name, "family": model.family, "library": model.library}
    if unavailable(model.library, why):
        return {**row, "pass": None, "error": "Skipped", "message": why}
    with tempfile.TemporaryDirectory(prefix="zoo-") as tmp:
        folder = Path(tmp)
        if not skip_tcexport:
            try:
                exported = export_model(model, folder, "cpu" if device == "cpu" else _cuda_target())
                row.update(export_s=round(exported.seconds, 1), size=exported.size)
                row["max_error"], notes = _compare(model, exported.path, device)
                row.update(error=None, **({"note": "; ".join(notes)} if notes else {}))
                row["pass"] = True
            except Exception as e:
                row.update({"pass": False, "error": type(e).__name__, "message": _short(e),
                            "trace": traceback.format_exc(limit=-4)[-1500:]})
        for peer in peers:
            row[peer] = _peer_row(model, peer, folder, device)
    del keep
    return row


def _worker(name: str, peers: list[str], skip: bool, timeout: int, device: str = "cpu") -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [sys.executable, "-m", "bench.zoo_table", "--one", name, "--row", out.name, "--peers", ",".join(peers),
               "--device", device]
        if skip:
            cmd.append("--only-peers")
        try:
            proc = subprocess.run(cmd, cwd=ROOT, timeout=timeout, capture_output=True, text=True)
            failure = None
        except subprocess.TimeoutExpired:
            failure = {"pass": False, "error": "Timeout", "message": f"over {timeout} s"}
        text = Path(out.name).read_text() if failure is None else ""
        if failure is None and (proc.returncode or not text):
            failure = {"pass": False, "error": f"exit {proc.returncode}", "message": proc.stderr[-600:]}
        return json.loads(text) if failure is None else _failed(name, failure, peers, skip)


def _failed(name: str, failure: dict, peers: list[str], only_peers: bool) -> dict:
    """A model's row when its worker did not report one: with --only-peers the worker ran the peers alone, so the
    failure is theirs and tcexport's merged columns stay."""
    return {"model": name, **({p: failure for p in peers} if only_peers else failure)}


def _mark(r: dict | None) -> str:
    if r is None:
        return ""
    if r.get("error") == "NotRun":
        return "not run"
    return "pass" if r.get("pass") else ("skip" if r.get("pass") is None else f"FAIL ({r.get('error')})")


def markdown(table: dict) -> str:
    rows = table["rows"]
    peers = [p for p in ("onnx", "aoti") if any(p in r for r in rows)]
    counted = [r for r in rows if r.get("pass") is not None]
    unrun = sum(_mark(r) == "not run" for r in rows)
    lines = [f"# Model zoo, {table['machine']}, {table['date']}", "",
             f"torch {table['torch']}, transformers {table.get('transformers')}, timm {table.get('timm')}, "
             f"torchvision {table.get('torchvision')}"
             + (f", triton {table.get('triton')}" if table.get("device") else "") + f"; `{table['command']}`", "",
             *([f"device: {table['device']}; each model exported for it, run by the CUDA loader and compared with "
                f"eager float32 on the CPU (tests/zoo/test_zoo_gpu.py)", ""] if table.get("device") else []),
             *[f"then `{table[k]}`" for k in ("rerun_command", "aoti_command") if table.get(k)], "",
             f"tcexport: **{sum(1 for r in counted if r['pass'])} / {len(counted)} pass**"
             + (f" ({unrun} not run: past the deadline)" if unrun else "")
             + "".join(f"; {p}: {sum(1 for r in rows if r.get(p, {}).get('pass'))} / "
                       f"{sum(1 for r in rows if r.get(p, {}).get('pass') is not None)}" for p in peers), "",
             "| model | family | library | tcexport | export s | package | max error |"
             + "".join(f" {p} |" for p in peers),
             "|---|---|---|---|---|---|---|" + "---|" * len(peers)]
    for r in rows:
        size = f"{r['size'] / 1e6:.2f} MB" if r.get("size") else ""
        err = f"{r['max_error']:.1e}" if r.get("max_error") is not None else ""
        lines.append(f"| {r['model']}{' †' if r.get('from') else ''} | {r.get('family', '')} | {r.get('library', '')} | {_mark(r)} | "
                     f"{r.get('export_s', '')} | {size} | {err} |" + "".join(f" {_mark(r.get(p))} |" for p in peers))
    earlier = sorted({r["from"] for r in rows if r.get("from")})
    if earlier and table.get("only_peers"):
        lines += ["", f"† tcexport's columns (and the peer columns this run did not try) are from the merged table "
                      f"({'; '.join(earlier)}); this run tried {', '.join(table['only_peers'])}."]
    elif earlier:
        lines += ["", f"† not rerun here: the row is from the merged table ({'; '.join(earlier)})."]
    notes = [r for r in rows if r.get("note")]
    if notes:
        lines += ["", "## Notes", "", *[f"- **{r['model']}**: {r['note']}" for r in notes]]
    failures = [r for r in rows if r.get("pass") is False or any(r.get(p, {}).get("pass") is False for p in peers)]
    if failures:
        lines += ["", "## Failures", ""]
        for r in failures:
            if r.get("pass") is False:
                lines.append(f"- **{r['model']}** (tcexport): {r.get('error')}: {r.get('message', '')}")
            for p in peers:
                if r.get(p, {}).get("pass") is False:
                    lines.append(f"- **{r['model']}** ({p}): {r[p].get('error')}: {r[p].get('message', '')}")
    return "\n".join(lines) + "\n"


def _device_name() -> str:
    import torch

    return f"{_cuda_target()} ({torch.cuda.get_device_name()})"


def _versions(device: str) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for dist in ("torch", "transformers", "timm", "torchvision") + (("triton",) if device == "cuda" else ()):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = None
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="", help="comma-separated zoo names (default: all)")
    p.add_argument("--peers", default="", help="onnx,aoti: also try these exporters")
    p.add_argument("--only-peers", action="store_true", help="skip tcexport (with --merge: add peer columns)")
    p.add_argument("--merge", help="an earlier table's .json: its rows are kept where this run has none")
    p.add_argument("--timeout", type=int, default=900, help="seconds per model")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cuda: export for this GPU's arch and run on it (-> <machine>-<date>-zoo-cuda)")
    p.add_argument("--jobs", type=int, default=1, help="models at a time, each in its own process")
    p.add_argument("--deadline", type=int, help="seconds for the whole run: a model still running then is cut "
                   "short (Timeout), one not started is 'not run'; the table is written either way")
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("--row", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    peers = [x for x in args.peers.split(",") if x]
    if "onnx" in peers and args.device == "cuda":
        p.error("--peers onnx runs ONNX Runtime on the CPU: leave it out of a --device cuda table (aoti runs there)")
    if args.one:
        Path(args.row).write_text(json.dumps(run_one(args.one, peers, args.only_peers, args.device)))
        return 0
    os.environ.setdefault("TCEXPORT_CACHE", str(Path(tempfile.gettempdir()) / "tcexport-zoo-cache"))
    names = [n for n in args.models.split(",") if n] or list(_zoo().ZOO)
    old = json.loads(Path(args.merge).read_text()) if args.merge else None
    # rows this run does not redo keep where they were measured: the table's machine and date are this run's
    by_name = {r["model"]: {**r, "from": r.get("from") or f"{old['machine']}, {old['date']}"}
               for r in (old["rows"] if old else [])}
    end = time.monotonic() + args.deadline if args.deadline else float("inf")

    def work(name: str) -> dict:
        left = min(args.timeout, end - time.monotonic())
        if left < MIN_SECONDS:
            return _failed(name, {"pass": None, "error": "NotRun", "message": f"past --deadline {args.deadline} s"},
                           peers, args.only_peers)
        return _worker(name, peers, args.only_peers, int(left), args.device)

    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        running = {pool.submit(work, name): name for name in names}
        for done in concurrent.futures.as_completed(running):
            name, model = running[done], _zoo().ZOO[running[done]]
            row = {"family": model.family, "library": model.library, **done.result()}  # a Timeout's row too
            by_name[name] = {**by_name.get(name, {}), **row} if args.only_peers else {**row, **{
                k: v for k, v in by_name.get(name, {}).items() if k in ("onnx", "aoti") and k not in row}}
            print(f"{name}: {_mark(row) or ''} {row.get('export_s', '')} "
                  + " ".join(f"{q}={_mark(row.get(q))}" for q in peers), flush=True)
    from bench.run import machine_name

    order = list(_zoo().ZOO)
    table = {"machine": machine_name(args.device), "date": datetime.date.today().isoformat(),
             "command": "python -m bench.zoo_table " + " ".join(argv if argv is not None else sys.argv[1:]),
             **_versions(args.device), **({"device": _device_name()} if args.device == "cuda" else {}),
             **({"only_peers": peers} if args.only_peers else {}),
             "rows": sorted(by_name.values(), key=lambda r: order.index(r["model"]))}
    base = ROOT / "bench" / "results" / f"{table['machine']}-{table['date']}-zoo{'-cuda' * (args.device == 'cuda')}"
    base.with_suffix(".json").write_text(json.dumps(table, indent=1) + "\n")
    base.with_suffix(".md").write_text(markdown(table))
    print(base.with_suffix(".md"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
