"""Merge zoo-suite results run in slices into one table, geomean and set of plots.

    python -m bench.merge bench/results/h200-gpu-zoo.json slice1.json slice2.json ...

For a machine that limits how long one command may run: slice by models (``--models``) and, where one model's
backends do not fit in one command, by backends (``--only``). The slices must share the suite, machine, device,
thread count and precision (checked). A model in several slices gets the union of their backend rows (a backend
in several: the last slice given wins), and its ratios are computed again over the merged rows, so a backend and
its base may come from two commands minutes apart on the same machine: slice by models where you can. Each
slice's peaks are kept (``peaks_by_run``); a model's floors are its last slice's.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from . import report
from .run import add_ratios

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
        for key, model in result["models"].items():
            have = merged["models"].get(key)
            if have is None:
                merged["models"][key] = {**model, "backends": dict(model["backends"])}
                continue
            if [str(b) for b in have["batches"]] != [str(b) for b in model["batches"]]:
                raise MergeError(f"{name}: {key} ran at batches {model['batches']}, an earlier slice at "
                                 f"{have['batches']}; run every slice with the same --batches")
            have["backends"].update(model["backends"])
            have["floors"] = model.get("floors", have.get("floors"))
        merged["peaks_by_run"][name] = result.get("peaks")
        merged["date"] = max(merged["date"], result["date"])
    for model in merged["models"].values():
        add_ratios(model["backends"], merged["device"], model.get("floors"))
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
