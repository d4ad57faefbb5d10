"""A zoo suite's results JSON → summary tables (latency, ratios with a geomean row, distance to the floors,
accuracy, the concurrency row, failures) and plots (one per model family, one for concurrency).

A backend that failed on a model keeps its column: the cell says where it failed (✗ build, ✗ timeout, ...), the
failures section gives the error, and the family plots mark it, so a failure never reads as a missing model.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from . import report

FAMILIES = ("decoder LM", "encoder", "encoder-decoder", "CNN", "vision transformer", "audio")


def _get(d: dict | None, b):
    """A per-batch entry, whether the dict came from the run (int keys) or from its json (str keys)."""
    if not d:
        return None
    return d.get(b, d.get(str(b)))


def backend_names(result: dict) -> list[str]:
    names: list[str] = []
    for model in result["models"].values():
        names += [n for n in model["backends"] if n not in names]
    return names


def base_labels(result: dict) -> list[str]:
    extra = "torch.compile(reduce-overhead)" if result["device"] == "cuda" else "best of onnxruntime/openvino"
    return ["torch.compile", extra]


def plot_base(result: dict) -> str:
    """The family plots' base: torch.compile, or (a slice run without it) the suite's other base."""
    labels = base_labels(result)
    for key, b, model in cells(result):
        for row in model["backends"].values():
            if ((_get(row.get("latency"), b) or {}).get("ratios") or {}).get(labels[0]) is not None:
                return labels[0]
    return labels[1]


def failure(row: dict | None) -> str | None:
    """A short label for a row without figures: '✗ build', '✗ timeout', '—' when not run."""
    if row is None:
        return "not run"
    if row.get("skipped"):
        return "n/a"
    if row.get("latency"):
        return None
    err = row.get("error", "")
    stage = "timeout" if row.get("timed_out") else err.split(":")[0] or "error"
    return f"✗ {stage}"


def cells(result: dict):
    """(model key, batch, model) for every measured point, in the run's order."""
    for key, model in result["models"].items():
        for b in model["batches"]:
            yield key, b, model


def geomean(values: list[float]) -> float | None:
    vals = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


def _ratio_table(result: dict, names: list[str], value, title: str, note: str) -> list[str]:
    """One row per (model, batch), a column per backend, and the geomean row over the cells each backend has."""
    lines = [f"## {title}", "", note, "", "| model | batch | " + " | ".join(names) + " |",
             "|---|---|" + "---|" * len(names)]
    per_backend: dict = {n: [] for n in names}
    total = 0
    for key, b, model in cells(result):
        total += 1
        row_cells = []
        for n in names:
            row = model["backends"].get(n)
            v = value(row, b, model)
            if v is not None:
                per_backend[n].append(v)
            row_cells.append(f"{v:.2f}" if v is not None else (failure(row) or "—"))
        lines.append(f"| {key} | {b} | " + " | ".join(row_cells) + " |")
    means = []
    for n in names:
        g = geomean(per_backend[n])
        k = len(per_backend[n])
        means.append("—" if g is None else f"**{g:.2f}**" + (f" ({k}/{total})" if k < total else ""))
    lines += [f"| **geomean** | | " + " | ".join(means) + " |", ""]
    return lines


def _latency_table(result: dict, names: list[str]) -> list[str]:
    lines = ["## Latency, median ms", "", "Floors (ms): `arith` = FLOPs / GEMM peak, `memory` = bytes / copy bandwidth "
             "(both measured in this run; see the peaks above).", "",
             "| model | family | batch | GFLOP | MB moved | arith floor | memory floor | " + " | ".join(names) + " |",
             "|---|---|---|---|---|---|---|" + "---|" * len(names)]
    for key, b, model in cells(result):
        fl = _get(model.get("floors"), b) or {}
        head = [key, model.get("family", ""), str(b),
                f"{fl['flops'] / 1e9:.3g}" if fl else "—", f"{fl['bytes'] / 1e6:.4g}" if fl else "—",
                f"{fl['arith_ms']:.3g}" if fl else "—", f"{fl['memory_ms']:.3g}" if fl else "—"]
        row_cells = []
        for n in names:
            row = model["backends"].get(n)
            lat = _get((row or {}).get("latency"), b)
            row_cells.append(f"{lat['median_ms']:.3g}" if lat else (failure(row) or "—"))
        lines.append("| " + " | ".join(head + row_cells) + " |")
    return lines + [""]


def _accuracy_table(result: dict, names: list[str]) -> list[str]:
    lines = ["## Accuracy vs float64", "", "Largest |output − fp64 eager| over the largest |fp64 output|, over the "
             "batches; ✗ past the tolerance for the run's precision (recorded per row in the json).", "",
             "| model | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for key, model in result["models"].items():
        row_cells = []
        for n in names:
            row = model["backends"].get(n) or {}
            rel = row.get("max_rel_diff_vs_fp64")
            ok = (row.get("accuracy") or {}).get("ok", True)
            row_cells.append("—" if rel is None else f"{rel:.1e}" + ("" if ok else " ✗"))
        lines.append(f"| {key} | " + " | ".join(row_cells) + " |")
    return lines + [""]


def concurrency_rows(result: dict) -> list[tuple[str, str, dict]]:
    out = []
    for key, model in result["models"].items():
        for name, row in model["backends"].items():
            if row.get("concurrency"):
                out.append((key, name, row["concurrency"]))
    return out


def _concurrency_table(result: dict) -> list[str]:
    rows = concurrency_rows(result)
    if not rows:
        return []
    callers = sorted({int(c) for _, _, conc in rows for c in conc if str(c).isdigit()})
    lines = ["## Concurrency", "", "Calls per second over all calling threads, each thread calling the same loaded "
             "model in a loop (every backend keeps the run's intra-op thread count); in brackets: that figure over "
             "onnxruntime's at the same caller count.", "",
             "| model | backend | batch | " + " | ".join(f"{c} caller{'s' if c > 1 else ''}" for c in callers) + " |",
             "|---|---|---|" + "---|" * len(callers)]
    by_key = {(k, n): c for k, n, c in rows}
    for key, name, conc in rows:
        if "error" in conc:
            lines.append(f"| {key} | {name} | | ✗ {conc['error']} |" + " |" * (len(callers) - 1))
            continue
        ort = by_key.get((key, "onnxruntime"), {})
        row_cells = []
        for c in callers:
            v, o = _get(conc, c), _get(ort, c)
            txt = f"{v['calls_per_s']:.3g}" if v else "—"
            if v and o and name != "onnxruntime":
                txt += f" ({v['calls_per_s'] / o['calls_per_s']:.2f}×)"
            row_cells.append(txt)
        lines.append(f"| {key} | {name} | {conc.get('batch', '')} | " + " | ".join(row_cells) + " |")
    return lines + [""]


def _failures(result: dict) -> list[str]:
    lines, skipped = [], set()
    for key, model in result["models"].items():
        for name, row in model["backends"].items():
            if row.get("error"):
                lines.append(f"- {key} · {name}: {row['error']}")
            if row.get("skipped"):
                skipped.add(row["skipped"].split(" (this run")[0])
    out = (["## Failures", ""] + lines + [""]) if lines else []
    return out + ([f"Not measured by design: {'; '.join(sorted(skipped))}.", ""] if skipped else [])


def markdown(result: dict) -> str:
    names = backend_names(result)
    peaks = result.get("peaks") or {}
    lines = report.header(result)
    if result.get("precision"):
        lines += [f"**AMP {result['precision']}**: eager, torch.compile and AOTInductor run the float32 model under "
                  f"`torch.autocast({result['device']!r})`; tcpkg is exported with `precision={result['precision']!r}`"
                  " (torch.autocast(\"cuda\")'s op policy). ONNX Runtime and OpenVINO run float32 models only."
                  + (" On the CPU, torch.autocast(\"cpu\")'s policy differs from CUDA's (e.g. layer norm and softmax"
                     " stay in 16 bits there), so the torch rows and the package compute differently: the CPU AMP run"
                     " tests the harness, the GPU run is the measurement." if result["device"] == "cpu" else ""), ""]
    if result.get("merged_from"):
        lines += [f"Merged (bench/merge.py) from {len(result['merged_from'])} runs of this suite: "
                  + ", ".join(result["merged_from"]) + "; each model's backends come from one run, its floors from "
                  "that run's peaks (the peaks below are the first run's).", ""]
    if peaks:
        lines += [f"Peaks measured in this run: GEMM {peaks['gemm_flops_per_s'] / 1e9:.4g} GFLOP/s ({peaks['gemm']}), "
                  f"bandwidth {peaks['copy_bytes_per_s'] / 1e9:.4g} GB/s ({peaks['copy']}), {peaks['threads']} "
                  "threads.", ""]
    lines += _latency_table(result, names)
    for label in base_labels(result):
        lines += _ratio_table(result, names, lambda row, b, m, label=label: (_get((row or {}).get("latency"), b) or {})
                              .get("ratios", {}).get(label), f"Latency ÷ {label}",
                              f"Below 1 is faster than {label} on the same model, batch and threads; the geomean row "
                              "is over the cells a backend has (k/N when it lacks some).")
    lines += _ratio_table(result, names, lambda row, b, m: (_get((row or {}).get("latency"), b) or {}).get("x_floor"),
                          "Latency ÷ floor", "Latency over the larger of the arithmetic and memory floors: 1 would be "
                          "the machine's measured peak; how far each backend is from what the hardware allows.")
    lines += _accuracy_table(result, names) + _concurrency_table(result) + _failures(result)
    lines += ["## Details per model", ""] + report.model_sections(result, level="###")
    return "\n".join(lines)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _family_plot(result: dict, family: str, keys: list[str], names: list[str], path: Path) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    base = plot_base(result)
    groups = [(k, b) for k in keys for b in result["models"][k]["batches"]]
    shown = [n for n in names if n != base]
    width = 0.8 / max(1, len(shown))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(groups) * max(1, len(shown)) * 0.35 + 2), 4.5))
    top = 1.0
    for j, n in enumerate(shown):
        for i, (k, b) in enumerate(groups):
            row = result["models"][k]["backends"].get(n)
            lat = _get((row or {}).get("latency"), b) or {}
            v = lat.get("ratios", {}).get(base)
            x = i + (j - (len(shown) - 1) / 2) * width
            if v is not None:
                ax.bar(x, v, width=width, color=f"C{names.index(n)}")
                top = max(top, v)
            else:  # failed, not run, or no baseline at this point: labelled, never left out
                label = failure(row) or ("no base" if lat else "—")
                ax.text(x, 0.02, label, rotation=90, ha="center", va="bottom", fontsize=6, color=f"C{names.index(n)}")
    ax.axhline(1.0, color="black", linestyle="--", linewidth=0.8)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([f"{k.split('/')[0]}\nbatch {b}" for k, b in groups], fontsize=7)
    ax.set_ylim(0, top * 1.1)
    ax.set_ylabel(f"latency ÷ {base} (below 1 is faster)")
    ax.set_title(f"{result['suite']} · {family} · {result['machine']}")
    # one legend entry per backend, whether it has a bar here or failed everywhere
    ax.legend(handles=[Patch(color=f"C{names.index(n)}", label=n) for n in shown], fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _concurrency_plot(result: dict, path: Path) -> bool:
    import matplotlib.pyplot as plt

    rows = [r for r in concurrency_rows(result) if "error" not in r[2]]
    if not rows:
        return False
    keys = list(dict.fromkeys(k for k, _, _ in rows))
    fig, axes = plt.subplots(1, len(keys), figsize=(4.5 * len(keys), 3.8), squeeze=False)
    for ax, key in zip(axes[0], keys):
        for k, name, conc in rows:
            if k != key:
                continue
            pts = sorted((int(c), v["calls_per_s"]) for c, v in conc.items() if str(c).isdigit())
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
            ax.set_xticks([p[0] for p in pts])
        ax.set_xlabel(f"calling threads (each with {result['threads']} intra-op threads)")
        ax.set_ylabel("calls / s (all threads)")
        ax.set_title(f"{key}, batch {next(c for k, _, c in rows if k == key).get('batch', '')}", fontsize=9)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plots(result: dict, out_dir: Path, stem: str) -> list[Path]:
    """`<stem>-family-<family>.png` for each family in the run, and `<stem>-concurrency.png` when it has the row."""
    import matplotlib

    matplotlib.use("Agg")
    names = backend_names(result)
    paths = []
    by_family: dict = {}
    for key, model in result["models"].items():
        by_family.setdefault(model.get("family") or "other", []).append(key)
    for family in sorted(by_family, key=lambda f: FAMILIES.index(f) if f in FAMILIES else len(FAMILIES)):
        paths.append(out_dir / f"{stem}-family-{_slug(family)}.png")
        _family_plot(result, family, by_family[family], names, paths[-1])
    if _concurrency_plot(result, out_dir / f"{stem}-concurrency.png"):
        paths.append(out_dir / f"{stem}-concurrency.png")
    return paths
