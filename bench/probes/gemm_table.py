"""Probe: the tiles of a 16-bit GEMM over many rows (the template's large-M band: prefill, encoders, vision
transformers), swept over a grid of shapes, to ship a shape -> config table with the exporter
(exporter/cuda/gemm_table.py) instead of heuristics tuned on one model's GEMMs. Each (M, N, K, weight layout) of
the grid is timed with every config of CONFIGS and with cuBLAS, as a CUDA graph of launches on their own weights
(the template's loop: bench/probes/gemm_kernels.mm_tile, one program per tile in grouped order). The results
json holds every time; `--fit` turns it into the table: per (N, K, layout), the config with the lowest geomean
over M of its time over that shape's best.

    python -m bench.probes.gemm_table [--deadline 420] [--out F.json]     # on a GPU machine
    python -m bench.probes.gemm_table --fit F.json                       # the table, as exporter/cuda/gemm_table.py
    TRITON_INTERPRET=1 python -m bench.probes.gemm_table --check          # correctness on the CPU, small shapes

Results: bench/results/nvidia-h100-2026-12-07-gemm-table.md."""
import itertools
import json
import math
import os
import re
import time
from pathlib import Path

from bench.probes.common import add_check_option, graph_us, parser

MS = (128, 256, 512, 1024, 4096)
SMALL_M = 256  # schedule/small_m.SMALL_M: the row bands fitted apart
NS = (512, 768, 1024, 2048, 3072, 4096, 8192, 16384)
KS = (512, 768, 1024, 2048, 3072, 4096, 8192)
CONFIGS = (  # BM, BN, BK, warps, stages
    (64, 128, 64, 4, 3), (64, 128, 64, 4, 4), (64, 128, 64, 4, 5), (64, 64, 128, 4, 3),
    (128, 64, 64, 4, 4), (128, 128, 64, 4, 3), (128, 128, 64, 4, 4), (128, 128, 64, 8, 3),
    (128, 128, 64, 8, 4), (128, 128, 128, 8, 3), (128, 256, 64, 8, 3), (128, 256, 64, 8, 4),
    (256, 128, 64, 8, 3), (256, 128, 64, 8, 4), (64, 256, 64, 4, 3), (64, 256, 64, 8, 4),
)
GROUP_M = 8
REPS = 5  # graph replays a cell: thousands of cells, each a median of few


def sweep(ms, ns, ks, configs, deadline: float, check: bool, save=None) -> list:
    """[{m, n, k, wt, cublas, times: {config: us}}], the cells finished before ``deadline`` (time.time()), each
    handed to ``save`` (all rows so far) as it is done, so that a run cut off keeps what it measured."""
    import torch
    import triton

    from bench.probes.gemm_kernels import mm_tile

    dev, dt = ("cpu", torch.float16) if check else ("cuda", torch.bfloat16)
    rows = []
    for n, k, wt, m in itertools.product(ns, ks, (True, False), ms):
        if time.time() > deadline:
            print(f"deadline: stopped before M={m} N={n} K={k}", flush=True)
            break
        launches = 2 if check else max(2, min(8, int(2 ** 31 // (m * n * k))))
        a = torch.randn(m, k, device=dev, dtype=dt)
        ws = [torch.randn(*((n, k) if wt else (k, n)), device=dev, dtype=dt) * 0.05 for _ in range(launches)]
        bias = torch.zeros(n, device=dev, dtype=dt)
        cs = [torch.empty(m, n, device=dev, dtype=dt) for _ in range(launches)]
        ref = a.float() @ (ws[0].float().t() if wt else ws[0].float())
        row = {"m": m, "n": n, "k": k, "wt": wt, "times": {}}
        for bm, bn, bk, warps, stages in configs:
            grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
            fns = [lambda w=w, c=c: mm_tile[grid](a, w, c, bias, m, n, k, bm, bn, bk, GROUP_M, False, wt,
                                                   num_warps=warps, num_stages=stages) for w, c in zip(ws, cs)]
            try:
                fns[0]()
            except triton.runtime.errors.OutOfResources:
                continue
            err = ((cs[0].float() - ref).norm() / ref.norm()).item()
            assert err < 2e-2, (m, n, k, wt, (bm, bn, bk, warps, stages), err)
            row["times"][f"{bm}x{bn}x{bk} w{warps} s{stages}"] = 0.0 if check else round(graph_us(fns, REPS), 2)
        if not check:
            lin = [lambda w=w, c=c: torch.nn.functional.linear(a, w, out=c) if wt else torch.mm(a, w, out=c)
                   for w, c in zip(ws, cs)]
            row["cublas"] = round(graph_us(lin, REPS), 2)
            best = min(row["times"].items(), key=lambda kv: kv[1])
            print(f"M={m} N={n} K={k} {'[N,K]' if wt else '[K,N]'}: cuBLAS {row['cublas']} us, best {best[1]} us "
                  f"{best[0]} ({2 * m * n * k / best[1] / 1e6:.0f} TFLOP/s)", flush=True)
        rows.append(row)
        if save is not None:
            save(rows)
    return rows


def fit(rows: list) -> dict:
    """{(band, n, k, wt): (config, geomean of its time over each M's best)}: the config best over the band's rows
    as a whole (band "small": up to SMALL_M rows, "large": more)."""
    by_shape = {}
    for r in rows:
        band = "small" if r["m"] <= SMALL_M else "large"
        by_shape.setdefault((band, r["n"], r["k"], r["wt"]), []).append(r["times"])
    table = {}
    for shape, cells in by_shape.items():
        common = set.intersection(*(set(c) for c in cells))
        score = {cfg: math.exp(sum(math.log(c[cfg] / min(c.values())) for c in cells) / len(cells)) for cfg in common}
        best = min(score, key=score.get)
        table[shape] = (best, round(score[best], 3))
    return table


def main(argv=None):
    p = parser(__doc__)
    add_check_option(p)
    p.add_argument("--deadline", type=float, default=420, help="seconds; the sweep stops and writes what it has")
    p.add_argument("--out", type=Path, default=None, help="results json (default: $OUT or bench/results)")
    p.add_argument("--fit", type=Path, default=None, help="print the table fitted to a results json and stop")
    args = p.parse_args(argv)
    if args.fit is not None:  # TABLE's entries, as exporter/cuda/gemm_table.py holds them
        for (band, n, k, wt), (cfg, score) in sorted(fit(json.loads(args.fit.read_text())["rows"]).items()):
            bm, bn, bk, warps, stages = (int(x) for x in re.findall(r"\d+", cfg))
            print(f"    ({band!r}, {n}, {k}, {wt}): ({bm}, {bn}, {bk}, {warps}, {stages}),  # {score}")
        return
    from bench.probes.common import run_mode

    mode = run_mode(args)
    t0 = time.time()
    if mode.check:
        rows = sweep((32,), (64,), (128,), ((16, 32, 64, 4, 2), (32, 64, 64, 4, 2)), t0 + args.deadline, True)
        print(f"{len(rows)} shapes, {sum(len(r['times']) for r in rows)} configs ok")
        return
    import torch

    out = args.out or Path(os.environ.get("OUT") or "bench/results") / "gemm-table.json"
    head = {"device": torch.cuda.get_device_name(), "triton": __import__("triton").__version__,
            "torch": torch.__version__, "group_m": GROUP_M}
    rows = sweep(MS, NS, KS, CONFIGS, t0 + args.deadline, False,
                 lambda rows: out.write_text(json.dumps(head | {"rows": rows}, indent=1)))
    print(f"{len(rows)} shapes in {time.time() - t0:.0f} s -> {out}", flush=True)


if __name__ == "__main__":
    main()
