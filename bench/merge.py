"""Merge zoo-suite results run in slices (a few models per command) into one table, geomean and set of plots.

    python -m bench.merge bench/results/h200-gpu-zoo.json slice1.json slice2.json ...

Every backend of a model is still measured side by side in one run; only models come from different runs, which
must share the suite, machine, device, thread count and precision (checked). A model present in several slices is
taken from the last one given. The peaks of each slice are kept (``peaks_by_run``); each model's floors were
computed with its own run's peaks.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from . import report

SAME = ("suite", "machine", "device", "threads", "precision", "zoo")


class MergeError(ValueError):
    """Results that cannot share one table."""


def merge(results: list[dict], names: list[str]) -> dict:
    if not results:
        raise MergeError("no results to merge: give at least one .json that bench.run wrote")
    first = results[0]
    merged = {**first, "models": {}, "merged_from": names, "peaks_by_run": {}}
    for result, name in zip(results, names):
        for key in SAME:
            if result.get(key) != first.get(key):
                raise MergeError(f"{name}: {key} is {result.get(key)!r}, but {names[0]} has {first.get(key)!r}; "
                                 "merge only slices of one suite run on one machine with the same options")
        merged["models"].update(result["models"])
        merged["peaks_by_run"][name] = result.get("peaks")
        merged["date"] = max(merged["date"], result["date"])
    return merged


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="the merged .json to write (the .md and plots go beside it)")
    parser.add_argument("results", type=Path, nargs="+", help=".json files that bench.run wrote")
    args = parser.parse_args(argv)
    merged = merge([json.loads(p.read_text()) for p in args.results], [p.name for p in args.results])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(merged, indent=1, default=str))
    report.write_all(merged, args.out.parent, args.out.stem)
    print(args.out)


if __name__ == "__main__":
    main()
