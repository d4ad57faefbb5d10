"""Many packages in one call, for CI: a list of model files, one package per model and target set, one summary.

CI jobs prebuild the archives a fleet of servers loads, GPU ones included, on runners without a GPU. What such a
job needs beyond one export: a list it can keep in the repository, builds that run side by side (``jobs``), one
failure that does not stop the others (each item records its own typed error and exit code), one summary to
upload, and a kernel cache that the CI system carries between runs. The cache is content-addressed and every entry
is re-verified on reuse (build_cache.py), so sharing it between runners is safe; and a package's bytes do not
depend on the cache, so two runners, cold or warm, produce identical archives (a test checks it).

Each build runs in a fresh process (``spawn``): torch.export and the model files keep no state between models, and
a model that crashes its interpreter fails only its own item.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import shlex
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tcexport.exporter.errors import ExportError

INTERNAL_ERROR = 70


@dataclass(frozen=True)
class BuildItem:
    """One package to build: a model file, its target set, the --dynamic specs, and where the package goes."""

    model: str
    targets: str = "cpu"
    dynamic: tuple = ()
    output: str | None = None  # default: OUT_DIR/<model stem>[-<targets>].tcpkg
    precision: str | None = None

    def output_path(self, out_dir: Path, several_targets: bool) -> Path:
        if self.output:
            return Path(self.output) if Path(self.output).is_absolute() else out_dir / self.output
        stem = Path(self.model).stem
        if several_targets:
            stem += "-" + self.targets.replace("cuda:", "").replace(",", "_").replace(":", "_")
        return out_dir / f"{stem}.tcpkg"


def read_list(path: str | Path) -> list[BuildItem]:
    """A model list: one model per line, ``MODEL.py [--target T] [--dynamic D]... [--precision P] [-o OUT]``;
    ``#`` starts a comment; model paths are relative to the list file. Lines are parsed like a shell's words."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ExportError(f"model list {path}: cannot be read ({e.strerror or e}); pass a readable file") from e
    items = []
    for number, line in enumerate(text.splitlines(), 1):
        words = shlex.split(line, comments=True)
        if words:
            items.append(_item(words, path, number))
    if not items:
        raise ExportError(f"model list {path}: names no model; write one model file per line")
    return items


_OPTIONS = {"--target": "targets", "--dynamic": "dynamic", "-d": "dynamic", "--precision": "precision",
            "-o": "output", "--output": "output"}


def _item(words: list[str], path: Path, number: int) -> BuildItem:
    where = f"model list {path}, line {number}"
    model, fields, rest = words[0], {"dynamic": []}, words[1:]
    while rest:
        flag = rest.pop(0)
        key = _OPTIONS.get(flag)
        if key is None or not rest:
            raise ExportError(f"{where}: {flag!r} is not an option a list line takes (or has no value); "
                              f"expected MODEL.py followed by {', '.join(sorted(set(_OPTIONS)))} with values")
        value = rest.pop(0)
        if key == "dynamic":
            fields["dynamic"].append(value)
        else:
            fields[key] = value
    model_path = Path(model) if Path(model).is_absolute() else path.parent / model
    return BuildItem(str(model_path), fields.get("targets", "cpu"), tuple(fields["dynamic"]), fields.get("output"),
                     fields.get("precision"))


@dataclass
class ItemResult:
    model: str
    targets: str
    package: str
    ok: bool
    seconds: float
    bytes: int | None = None
    digest: str | None = None
    signed: bool = False
    error: str | None = None
    message: str | None = None
    exit_code: int = 0
    warnings: list = field(default_factory=list)


def prebuild(items: list[BuildItem], out_dir: str | Path, *, jobs: int = 1, cache_dir: str | Path | None = None,
             sign_key: str | Path | None = None, on_item=None) -> dict:
    """Build every item into ``out_dir`` (``jobs`` at a time, each in its own process); returns the summary:
    ``{"ok", "packages": [ItemResult as dict], "built", "failed", "seconds"}``. ``on_item(result)`` is called as
    each one finishes (progress). One item's failure never stops the others."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ExportError(f"--jobs should be an integer >= 1, got {jobs!r}")
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ExportError(f"output folder {out_dir} cannot be created ({e.strerror or e}); pass another") from e
    several = len({i.targets for i in items}) > 1
    outputs = [i.output_path(out_dir, several) for i in items]
    if len(set(outputs)) != len(outputs):
        dup = next(o for o in outputs if outputs.count(o) > 1)
        raise ExportError(f"two list entries would both write {dup}; give one of them its own -o")
    t0 = time.perf_counter()
    args = [(asdict(i), str(o), str(cache_dir) if cache_dir else None, str(sign_key) if sign_key else None)
            for i, o in zip(items, outputs)]
    results: list[ItemResult | None] = [None] * len(items)
    with cf.ProcessPoolExecutor(max_workers=min(jobs, len(items)),
                                mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(_build_one, *a): k for k, a in enumerate(args)}
        for fut in cf.as_completed(futures):
            k = futures[fut]
            try:
                results[k] = ItemResult(**fut.result())
            except Exception as e:  # noqa: BLE001 - the worker process died (a crash in the model's own code)
                results[k] = ItemResult(items[k].model, items[k].targets, str(outputs[k]), False, 0.0,
                                        error="WorkerCrashed", message=f"the build process died: {e}",
                                        exit_code=INTERNAL_ERROR)
            if on_item is not None:
                on_item(results[k])
    done = [asdict(r) for r in results]
    failed = [r for r in results if not r.ok]
    return {"ok": not failed, "packages": done, "built": len(results) - len(failed), "failed": len(failed),
            "seconds": round(time.perf_counter() - t0, 3)}


def _build_one(item: dict, output: str, cache_dir: str | None, sign_key: str | None) -> dict:
    """One export in a worker process; every failure becomes the item's error (typed name, message, exit code)."""
    import warnings

    from tcexport.formats.errors import TcError

    warnings.filterwarnings("ignore", category=FutureWarning)
    t0 = time.perf_counter()
    row = {"model": item["model"], "targets": item["targets"], "package": output, "ok": False}
    try:
        from tcexport.exporter import export
        from tcexport.exporter.front.model_file import load_model_file
        from tcexport.exporter.pipeline import parse_targets

        spec = load_model_file(item["model"])
        pkg = export(spec.module, spec.example_inputs, spec.dynamic_shapes, parse_targets(item["targets"]),
                     dynamic=list(item["dynamic"]), name=Path(item["model"]).stem, source_path=item["model"],
                     cache_dir=cache_dir, precision=item["precision"])
        pkg.save(output, sign_key=sign_key)
        row.update(ok=True, bytes=Path(output).stat().st_size, digest=pkg.digest, signed=sign_key is not None,
                   warnings=list(pkg.warnings))
    except TcError as e:
        row.update(error=type(e).__name__, message=str(e), exit_code=e.exit_code)
    except Exception as e:  # noqa: BLE001 - a tcexport bug: reported with its traceback, the other items go on
        row.update(error="InternalError", message=f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=8)}",
                   exit_code=INTERNAL_ERROR)
    row["seconds"] = round(time.perf_counter() - t0, 3)
    return row
