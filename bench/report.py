"""Results JSON → a markdown table and PNG plots (latency vs batch per model; cold start per backend)."""

from __future__ import annotations

from pathlib import Path


def _fmt_ms(lat: dict | None) -> str:
    if not lat:
        return "—"
    ratio = lat.get("ratio_to_compile")
    spread = f"{lat['p10_ms']:.3g}–{lat['p90_ms']:.3g}"
    return f"{lat['median_ms']:.3g} ms ({spread})" + (f" **{ratio:.2f}×**" if ratio is not None else "")


def markdown(result: dict) -> str:
    return "\n".join(header(result) + model_sections(result))


def header(result: dict) -> list[str]:
    return [f"# Benchmark `{result['suite']}` on {result['machine']} ({result['date']})", "",
             f"device {result['device']}, {result['threads']} threads, "
             + (f"cold start = median of {result['cold_runs']} fresh processes" if result["cold_runs"]
                else "cold start not measured (--cold-runs 0)")
             + "; ratios (**bold**) are to torch.compile (default mode) measured in the same run; latency = median "
             "(p10–p90) of warm calls.", "",
             "versions: " + ", ".join(f"{k} {v}" for k, v in result["versions"].items() if v), ""]


def model_sections(result: dict, level: str = "##") -> list[str]:
    """Per model: every backend's build, size, cold start, latency per batch, accuracy and activation peak."""
    lines = []
    for key, model in result["models"].items():
        batches = model["batches"]
        lines += [f"{level} {key}", ""]
        head = ["backend", "build s", "size MB", "cold start s", "peak RSS MB"]
        if result["device"] == "cuda":
            head.append("peak GPU MB")
        head += [f"batch {b}" for b in batches] + ["max abs diff vs fp64", f"activation peak KB (batch {max(batches)})"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for name, row in model["backends"].items():
            if row.get("skipped"):
                lines.append(f"| {name} | {row['skipped']} |" + " |" * (len(head) - 2))
                continue
            if "error" in row and not row.get("latency"):
                lines.append(f"| {name} | error: {row['error']} |" + " |" * (len(head) - 2))
                continue
            cs = row.get("cold_start") or {}
            cells = [name, f"{row.get('build_s', 0):.1f}",
                     f"{row['size_bytes'] / 1e6:.2f}" if row.get("size_bytes") else "—",
                     (f"{cs['median_s']:.2f}" + (f" **{cs['ratio_to_compile']:.2f}×**"
                                                 if cs.get("ratio_to_compile") else "")) if cs else "—",
                     f"{cs['peak_rss_mb']:.0f}" if cs else "—"]
            if result["device"] == "cuda":
                cells.append(f"{cs['peak_device_mb']:.0f}" if cs.get("peak_device_mb") else "—")
            cells += [_fmt_ms(row.get("latency", {}).get(b) or row.get("latency", {}).get(str(b))) for b in batches]
            diff = row.get("max_abs_diff_vs_fp64")
            cells.append(f"{diff:.2e}" if diff is not None else "—")
            peak = row.get("activation_peak_bytes")
            cells.append(f"{peak / 1024:.0f}" if peak else "—")
            if row.get("error"):
                cells[-2] += f" (error: {row['error']})"
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        notes = [f"- {name}: {row['note']}" for name, row in model["backends"].items() if row.get("note")]
        lines += notes + ([""] if notes else [])
    return lines


def plots(result: dict, out_dir: Path, stem: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    models = result["models"]
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 4), squeeze=False)
    for ax, (key, model) in zip(axes[0], models.items()):
        for name, row in model["backends"].items():
            lat = row.get("latency") or {}
            pts = sorted((int(b), v["median_ms"]) for b, v in lat.items())
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch size")
        ax.set_ylabel("latency per call, ms (median)")
        ax.set_title(key)
        ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(out_dir / f"{stem}-latency.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(max(6, 2.2 * len(models)), 4))
    names = sorted({n for m in models.values() for n in m["backends"]})
    width = 0.8 / max(1, len(names))
    for k, name in enumerate(names):
        xs, ys = [], []
        for i, model in enumerate(models.values()):
            cs = model["backends"].get(name, {}).get("cold_start")
            if cs:
                xs.append(i + k * width)
                ys.append(cs["median_s"])
        ax.bar(xs, ys, width=width, label=name)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(models))])
    ax.set_xticklabels(list(models), fontsize=8)
    ax.set_ylabel("cold start, s (first import → first result)")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(out_dir / f"{stem}-cold-start.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def write_all(result: dict, out_dir: Path, stem: str) -> None:
    """The table and plots beside the json: the zoo suites' summary tables and plots per family (suite_report.py),
    the small suites' latency and cold-start plots."""
    if result.get("zoo"):
        from . import suite_report

        (out_dir / f"{stem}.md").write_text(suite_report.markdown(result))
        suite_report.plots(result, out_dir, stem)
        return
    (out_dir / f"{stem}.md").write_text(markdown(result))
    plots(result, out_dir, stem)


def main(argv=None) -> None:
    """Redraw a result's table and plots beside it: ``python -m bench.report bench/results/NAME.json``."""
    import argparse
    import json

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("result", type=Path, help="a .json that bench.run wrote")
    p = parser.parse_args(argv).result
    write_all(json.loads(p.read_text()), p.parent, p.stem)


if __name__ == "__main__":
    main()
