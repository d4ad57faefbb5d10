"""A CPU package against the same model built by an earlier revision of the exporter, timed interleaved.

    python -m bench.package_ab --base HEAD --models efficientnet-b0 mobilenetv3-small --batches 1 8 --threads 2
    python -m bench.package_ab --base 4903f93 --models gpt2 --out bench/results/NAME.md

For a change to the code generator, a suite run is too coarse: other backends share the machine's drift, and a
change of 5% hides in it. Here each zoo model (bench/zoo.py) is exported twice, by ``--base``'s exporter (its
sources taken with ``git archive`` into a temporary folder, each build in a process of its own) and by the working
tree's, and both packages are loaded by the working tree's loader in one process and called alternately, so that
the machine's drift falls on both alike. Prints, per model and batch, both medians, their ratio (below 1: the
working tree is faster) and how far the outputs differ (largest absolute difference over the largest output).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("exporter", "packager", "loader", "formats", "serving")

EXPORT = """
import sys
from bench.zoo import MODELS
from tcexport.exporter.pipeline import export
bm = MODELS[sys.argv[1]]()
export(bm.build(), bm.inputs(2), bm.dynamic_shapes, name=sys.argv[1]).save(sys.argv[2])
"""


def base_tree(rev: str, folder: Path) -> Path:
    """``rev``'s product sources under ``folder``, importable as ``tcexport``: the folder to put on PYTHONPATH."""
    src = folder / "src"
    src.mkdir()
    archive = subprocess.run(["git", "archive", rev, *LAYERS], cwd=ROOT, capture_output=True)
    if archive.returncode != 0:
        raise SystemExit(f"--base {rev}: git archive failed: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive.stdout, check=True)
    ns = folder / "ns" / "tcexport"
    ns.mkdir(parents=True)
    for layer in LAYERS:
        (ns / layer).symlink_to(src / layer)
    return ns.parent


def build(model: str, out: Path, pythonpath: str | None) -> None:
    """Export ``model`` to ``out`` in a fresh process: ``pythonpath`` first on its path (the base's tree), or the
    working tree's own install when None."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, str(ROOT), env.get("PYTHONPATH")) if p)
    r = subprocess.run([sys.executable, "-c", EXPORT, model, str(out)], cwd=ROOT, env=env, capture_output=True,
                       text=True)
    if r.returncode != 0:
        raise SystemExit(f"{model}: export failed ({'base' if pythonpath else 'working tree'}):\n{r.stderr[-3000:]}")


def compare(model: str, paths: tuple[Path, Path], batch: int, threads: int, reps: int, seconds: float) -> dict:
    from bench.zoo import MODELS
    import tcexport.loader as L

    xs = [np.ascontiguousarray(t.numpy()) for t in MODELS[model]().inputs(batch)]
    loaded = [L.load(p, num_threads=threads) for p in paths]
    outs = [np.asarray(m(*xs)[0]) for m in loaded]
    for m in loaded:
        for _ in range(2):
            m(*xs)
    times: list[list[float]] = [[], []]
    start = time.perf_counter()
    while len(times[0]) < reps or time.perf_counter() - start < seconds:
        for i, m in enumerate(loaded):
            t0 = time.perf_counter()
            m(*xs)
            times[i].append(time.perf_counter() - t0)
    base, work = (float(np.median(t)) * 1e3 for t in times)
    diff = float(np.abs(outs[0] - outs[1]).max() / max(float(np.abs(outs[0]).max()), 1e-30))
    return dict(model=model, batch=batch, base_ms=base, work_ms=work, ratio=work / base, diff=diff)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", required=True, help="the git revision whose exporter builds the baseline packages")
    p.add_argument("--models", nargs="+", required=True, help="names from bench/zoo.py's MODELS")
    p.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=12, help="calls of each package per batch, alternating, at least")
    p.add_argument("--seconds", type=float, default=5.0,
                   help="...and for at least this long (small models: a few ms a call is noisy)")
    p.add_argument("--out", type=Path, default=None, help="also write the table to this markdown file")
    args = p.parse_args(argv)
    from bench.zoo import MODELS

    unknown = [m for m in args.models if m not in MODELS]
    if unknown:
        raise SystemExit(f"unknown models {unknown}: expected names from bench/zoo.py ({', '.join(MODELS)})")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="tcexport-ab-") as tmp:
        tmp = Path(tmp)
        base_path = str(base_tree(args.base, tmp))
        for model in args.models:
            paths = (tmp / f"{model}-base.tcpkg", tmp / f"{model}-work.tcpkg")
            build(model, paths[0], base_path)
            build(model, paths[1], None)
            for batch in args.batches:
                rows.append(compare(model, paths, batch, args.threads, args.reps, args.seconds))
                r = rows[-1]
                print(f"{model} batch {batch}: base {r['base_ms']:.2f} ms, working tree {r['work_ms']:.2f} ms, "
                      f"ratio {r['ratio']:.3f}, outputs differ by {r['diff']:.1e}", flush=True)
    lines = [f"Working tree (on {head.stdout.strip()}) against `--base {args.base}`, {args.threads} threads, median "
             f"of at least {args.reps} alternating calls and {args.seconds:g} s; ratio below 1: the working tree "
             "is faster.", "",
             "| model | batch | base ms | working tree ms | ratio | output difference |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['batch']} | {r['base_ms']:.2f} | {r['work_ms']:.2f} | {r['ratio']:.3f} | "
              f"{r['diff']:.1e} |" for r in rows]
    print("\n".join(lines))
    if args.out is not None:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
