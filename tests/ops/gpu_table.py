"""Run the op table through the CUDA backend and print only what differs from test_opinfo_cuda.KNOWN.

    python tests/ops/gpu_table.py                      # on a GPU machine: build for its arch, run, compare
    TCEXPORT_OPS_CUDA_ARCH=sm_90 python tests/ops/gpu_table.py   # CPU-only: build every package, report failures
    python tests/ops/gpu_table.py --dtypes bfloat16 --ops clamp,nn.functional.avg_pool2d

Each line is ``FAIL`` (fails, not in KNOWN), ``FIXED`` (in KNOWN, passes) or ``KNOWN`` (with -v), then one
summary line; ``--known`` also prints a KNOWN dict of every failing sample, ready to paste into the test.
Exit status 1 if anything differs.

Packages can also be built here and run there (the GPU machine's torch may differ from the one the table is
meant for, and its op_db samples with it):

    TCEXPORT_OPS_CUDA_ARCH=sm_90 python tests/ops/gpu_table.py --save DIR    # CPU-only: packages + inputs + eager
    python tests/ops/gpu_table.py --prebuilt DIR                              # GPU: run them, compare, report

With --prebuilt a batch that fails to run marks all of its samples (no re-export to isolate one).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtypes", help="comma-separated (default: test_opinfo_cuda.DTYPES)")
    p.add_argument("--ops", help="comma-separated OpInfo names (default: every claimed op)")
    p.add_argument("--skip-ops", help="comma-separated OpInfo names to leave out (e.g. one that breaks the context)")
    p.add_argument("--group-size", type=int, help="samples per package (default: test_opinfo_cuda.GROUP_SIZE)")
    p.add_argument("--save", metavar="DIR", help="build only: keep the packages, inputs and eager results in DIR")
    p.add_argument("--prebuilt", metavar="DIR", help="run the packages a --save left in DIR")
    p.add_argument("--known", action="store_true", help="print a KNOWN dict of every failing sample")
    p.add_argument("-v", "--verbose", action="store_true", help="also list the KNOWN samples that still fail")
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore")

    import pytest
    import torch

    try:
        import test_opinfo_cuda as T
    except pytest.skip.Exception:
        print("no CUDA GPU here: set TCEXPORT_OPS_CUDA_ARCH=sm_XX to build the packages only", file=sys.stderr)
        return 2
    import harness

    dtypes = args.dtypes.split(",") if args.dtypes else T.DTYPES
    t0 = time.perf_counter()
    if args.prebuilt:
        batches = _load(Path(args.prebuilt))
        cases = [c for _, cs, _ in batches for c in cs]
        dtypes = sorted({c.dtype for c in cases})
    else:
        cases = harness.collect(op_names=args.ops.split(",") if args.ops else None, dtypes=dtypes)
    t1 = time.perf_counter()
    if args.skip_ops:
        cases = [c for c in cases if c.op not in args.skip_ops.split(",")]
    harness.BACKEND = "cuda"
    aborted = None
    try:
        if args.prebuilt:
            _run_prebuilt(batches, set(map(id, cases)))
        else:
            harness.run_all(cases, group_size=args.group_size or T.GROUP_SIZE, isolate=frozenset(T.KNOWN))
    except harness.CudaContextLost as e:  # the samples not reached stay "not run"
        aborted = e
    t2 = time.perf_counter()
    if args.save:
        _save(Path(args.save), harness.BUILT)

    unexpected, fixed = T.differences([c for c in cases if c.outcome != "not run"])
    for line in unexpected:
        print("FAIL ", _short(line))
    for line in fixed:
        print("FIXED", line)
    failing = [c for c in cases if c.outcome not in ("pass", "built") and not c.xfail]
    if args.verbose:
        for c in failing:
            if (c.op, c.dtype, c.index) in T.KNOWN:
                print("KNOWN", _short(f"{c.name} {c.description}: {c.outcome}"))
    if args.known and failing:
        print("KNOWN = {")
        for c in failing:
            print(f"    ({c.op!r}, {c.dtype!r}, {c.index}): {_short(c.outcome, 100)!r},")
        print("}")
    counts: dict = {}
    for c in cases:
        kind = "xfail" if c.xfail else c.outcome.split(":")[0]
        counts[kind] = counts.get(kind, 0) + 1
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU (build only)"
    print(f"SUMMARY {len(cases)} samples ({','.join(dtypes)}) on {gpu}, cuda:{harness.cuda_arch()}, torch "
          f"{torch.__version__}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
          + f"; {len(unexpected)} unexpected, {len(fixed)} fixed, {len(T.KNOWN)} listed; "
          f"collect {t1 - t0:.0f}s, build+run {t2 - t1:.0f}s")
    if aborted is not None:
        print(f"ABORTED {aborted}; rerun with --skip-ops, or --ops to isolate")
    return 1 if unexpected or fixed or aborted else 0


_FIELDS = ("op", "dtype", "index", "description", "expected", "reference", "outcome", "xfail")


def _save(folder: Path, built: list) -> None:
    """Each built batch's package, its inputs and its cases' eager results (torch.save: test data only)."""
    import shutil

    import torch

    folder.mkdir(parents=True, exist_ok=True)
    records = []
    for path, cases, inputs in built:
        shutil.copyfile(path, folder / Path(path).name)
        records.append({"package": Path(path).name, "inputs": inputs,
                        "cases": [{f: getattr(c, f) for f in _FIELDS} for c in cases]})
    torch.save({"torch": torch.__version__, "batches": records}, folder / "table.pt")
    print(f"saved {len(records)} packages and their samples in {folder}")


def _load(folder: Path) -> list:
    import torch

    import harness

    data = torch.load(folder / "table.pt", weights_only=False)
    print(f"prebuilt table from torch {data['torch']}: {len(data['batches'])} packages")
    return [(folder / b["package"], [harness.Case(fn=None, sample=None, **{**c, "outcome": "not run"})
                                     for c in b["cases"]], b["inputs"]) for b in data["batches"]]


def _run_prebuilt(batches: list, keep: set) -> None:
    import tcexport.loader as L

    import harness

    for path, cases, inputs in batches:
        if not any(id(c) in keep for c in cases):
            continue
        try:
            got = harness._run_cuda(L.load(path, device="cuda"), inputs)
        except Exception as e:  # noqa: BLE001
            if not harness._cuda_alive():
                raise harness.CudaContextLost(f"{path.name} left the CUDA context unusable: {e}") from e
            for c in cases:
                c.outcome = f"run: {type(e).__name__}: {harness._first_lines(str(e))} (whole batch {path.name})"
            continue
        pos = 0
        for c in cases:
            n = len(c.expected)
            c.outcome = harness.compare(c, got[pos:pos + n])
            pos += n


def _short(text: str, n: int = 400) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n - 3] + "..."


if __name__ == "__main__":
    sys.exit(main())
