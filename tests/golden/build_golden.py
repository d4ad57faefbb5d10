#!/usr/bin/env python3
"""Rebuild the golden packages: one small `.tcpkg` per format version, each built by the code of that version.

    python tests/golden/build_golden.py               # every entry of GOLDEN below
    python tests/golden/build_golden.py v1_3 v1_4     # only these (the other entries of expected.json stay)
    python tests/golden/build_golden.py --out /tmp/g  # somewhere else (writes its own expected.json there)

A developer script, not run by CI (it needs torch and a C++ compiler, and takes a few seconds an entry).
tests/test_golden.py loads and runs every package it wrote with the *current* loader, which pins SPEC §8: a loader
of minor version m loads every archive of minor version m' < m of its major.

For each entry the script exports the commit's four package folders (`git archive`, no worktree), links them as
the `tcexport.*` packages that commit's pyproject maps them to (`package-dir`) in a temporary folder, and runs
itself as a worker (`--worker`) in a subprocess with only that folder on PYTHONPATH. The worker checks that every
`tcexport.*` module it imported resolves into that commit's tree (the venv has an editable install of the working
tree, which a bad path would silently fall back to) and that the tree writes the version the table says, exports
tests/golden/tiny_model.py, runs the package with that same old loader against eager PyTorch, and hands back the
input and the eager output that expected.json stores. Build caches are per entry, under the temporary folder.

The old code is run exactly as it was committed; nothing is patched.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import re
import platform
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
EXPECTED_NAME = "expected.json"
CURRENT = "current"  # build from the working tree itself (uncommitted changes included)

# package file stem -> (the format version that code writes, the commit that builds it).
# Each commit is the LAST one writing its version (the parent of the commit that introduced the next version);
# the commit introducing a version is in the comment. Adding a version is one line; CURRENT builds from the
# working tree (replace it by the commit's hash once that version is superseded).
GOLDEN = {
    "v1_0": ("1.0", "4596c506ed77051c284af7b1340174e6dcf7d330"),  # introduced by baad929 (the first commit)
    "v1_1": ("1.1", "e8eb035334831460f3b573024f0456ea1f0c434d"),  # introduced by 14279c0
    "v1_2": ("1.2", "154a924b0f82bfd28e118752bdc4704f6fb502ab"),  # introduced by 73979aa
    "v1_3": ("1.3", "6be6e6363eafd2f735f9a835920be0bf20d85dfd"),  # introduced by 706c8ed
    "v1_4": ("1.4", "054205feca885488ffabe50f8e33daa19987aa3d"),  # introduced by a5a5ffd
    "v1_5": ("1.5", "b4c81a29997a9e48b08bb7245cb589d6e359f3ab"),  # introduced by 7c4bfc2
    "v1_6": ("1.6", "76f274abacc72e7f67d262098eeaf11595c4c56d"),  # introduced by bb49c70; HEAD when built
    "v1_7": ("1.7", "a52a1ae498f69b5d10ff6cb324444669fc8594e4"),  # introduced by b5b593e; built from its working tree
    "v1_8": ("1.8", "e388f67ec4d0894a19b63c44f20ef6c058c0e304"),  # introduced by f031b76; built from its working tree (the last commit writing 1.8 is ea452c5)
    "v1_9": ("1.9", "6ead442078817ed78db78ebf0a1c0271a7ceae74", "tiny_state_model.py"),  # introduced by abc5fab: a model with state
    "v1_10": ("1.10", CURRENT, "tiny_methods_model.py"),  # methods (forward, one) sharing weights and state
}
MODEL = "tiny_model.py"  # an entry's model file unless its third field names another (state, methods)

CHECK_BATCH = 5  # the batch of the input expected.json stores
RTOL = ATOL = 1e-5  # what tests/test_golden.py allows against the eager output


# --------------------------------------------------------------------------------------------- the parent side

def git(*args: str, capture: bool = True) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], check=True, text=True,
                          stdout=subprocess.PIPE if capture else None).stdout


def package_dirs(pyproject_text: str) -> dict[str, str]:
    """`[tool.setuptools] package-dir` of a pyproject: dotted package name -> folder in the repository."""
    mapping = tomllib.loads(pyproject_text).get("tool", {}).get("setuptools", {}).get("package-dir", {})
    mapping = {name: folder for name, folder in mapping.items() if name.startswith("tcexport")}
    if not mapping:
        raise SystemExit("pyproject.toml maps no tcexport package (tool.setuptools.package-dir)")
    return mapping


def prepare_source(source: str, tmp: Path, stem: str) -> tuple[Path, dict[str, str], dict]:
    """The tree to import from, its package-dir mapping, and what expected.json records about where it came from."""
    if source == CURRENT:
        mapping = package_dirs((REPO / "pyproject.toml").read_text())
        head = git("rev-parse", "HEAD").strip()
        dirty = git("status", "--porcelain", "--", "pyproject.toml", *sorted(set(mapping.values()))).strip()
        return REPO, mapping, {"commit": head, "working_tree": True, "uncommitted_changes": bool(dirty)}
    commit = git("rev-parse", "--verify", f"{source}^{{commit}}").strip()
    mapping = package_dirs(git("show", f"{commit}:pyproject.toml"))
    src = tmp / f"src-{stem}"
    src.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", commit, "--",
                              "pyproject.toml", *sorted(set(mapping.values()))],
                             check=True, stdout=subprocess.PIPE).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    return src, mapping, {"commit": commit}


def link_packages(src: Path, mapping: dict[str, str], ns: Path) -> None:
    """ns/tcexport/exporter -> src/exporter, ...: the layout `pip install` would give, as symlinks."""
    for name, folder in mapping.items():
        target = src / folder
        if not (target / "__init__.py").is_file():
            raise SystemExit(f"{name}: {target} is not a package")
        link = ns.joinpath(*name.split("."))
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(target, target_is_directory=True)


def build_one(stem: str, version: str, source: str, out_dir: Path, tmp: Path, model: str = MODEL) -> dict:
    src, mapping, origin = prepare_source(source, tmp, stem)
    ns = tmp / f"ns-{stem}"
    link_packages(src, mapping, ns)
    out = out_dir / f"{stem}.tcpkg"
    job = {"stem": stem, "src": str(src), "repo": str(REPO), "current": source == CURRENT,
           "version": [int(p) for p in version.split(".")], "packages": sorted(mapping),
           "out": str(out), "batch": CHECK_BATCH, "rtol": RTOL, "atol": ATOL, "model": model}
    job_path, result_path = tmp / f"job-{stem}.json", tmp / f"result-{stem}.json"
    job["result"] = str(result_path)
    job_path.write_text(json.dumps(job))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSAFEPATH")}
    env.update(PYTHONPATH=str(ns), PYTHONDONTWRITEBYTECODE="1", PYTHONNOUSERSITE="1",
               TCEXPORT_CACHE=str(tmp / f"cache-{stem}"))  # a fresh build cache: every library built by this code
    print(f"== {stem}: format {version} from {origin['commit'][:12]}"
          f"{' (working tree)' if source == CURRENT else ''}", flush=True)
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", str(job_path)],
                          cwd=tmp, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"{stem}: the worker failed (exit code {proc.returncode}); see its output above")
    result = json.loads(result_path.read_text())
    data = out.read_bytes()
    entry = {**origin, **({"model": model} if model != MODEL else {}), "format_version": result["format_version"], "size_bytes": len(data),
             "sha256": hashlib.sha256(data).hexdigest(), "built_with": result["built_with"],
             "old_loader_max_abs_diff": result["old_loader_max_abs_diff"],
             "input_shape": [len(result["input"]), len(result["input"][0])], "input": result["input"],
             "output_shape": [len(result["output"]), len(result["output"][0])], "output": result["output"]}
    print(f"   {out.name}: {len(data)} bytes, format {result['format_version']}, bundles {result['bundles']}, "
          f"old loader vs eager max |diff| {result['old_loader_max_abs_diff']:.3g}", flush=True)
    return entry


_NUMBERS = re.compile(r"\[\s*(-?[0-9][0-9.eE+-]*(?:,\s*-?[0-9][0-9.eE+-]*)*)\s*\]")


def dumps(doc: dict) -> str:
    """JSON, indented, with each innermost list of numbers (a row, a shape, a version) on one line."""
    text = json.dumps(doc, indent=1)
    return _NUMBERS.sub(lambda m: "[" + ", ".join(s.strip() for s in m.group(1).split(",")) + "]", text) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stems", nargs="*", help=f"entries to build (default: all of {', '.join(GOLDEN)})")
    parser.add_argument("--out", type=Path, default=HERE, help="folder for the packages and expected.json")
    parser.add_argument("--keep-tmp", action="store_true", help="keep the temporary folder (its path is printed)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(Path(args.worker))
    unknown = [s for s in args.stems if s not in GOLDEN]
    if unknown:
        parser.error(f"unknown entries {unknown}; GOLDEN has {list(GOLDEN)}")
    stems = args.stems or list(GOLDEN)
    out_dir = args.out.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    expected_path = out_dir / EXPECTED_NAME
    old = json.loads(expected_path.read_text())["packages"] if expected_path.is_file() else {}

    tmp_ctx = tempfile.TemporaryDirectory(prefix="tcexport-golden-")
    tmp = Path(tmp_ctx.name).resolve()
    built = {}
    try:
        for stem in stems:
            version, source, *model = GOLDEN[stem]
            built[f"{stem}.tcpkg"] = build_one(stem, version, source, out_dir, tmp, *model)
    finally:
        if args.keep_tmp:
            tmp_ctx._finalizer.detach()  # noqa: SLF001 -- keep it for inspection
            print(f"temporary folder kept: {tmp}")
        else:
            tmp_ctx.cleanup()

    packages = {}
    for stem in GOLDEN:  # table order; entries not rebuilt now keep what expected.json had
        name = f"{stem}.tcpkg"
        if name in built or name in old:
            packages[name] = built.get(name, old.get(name))
    dropped = sorted(set(old) - set(packages))
    if dropped:
        print(f"expected.json: dropping entries no longer in GOLDEN: {dropped}")
    doc = {"about": "golden packages: tests/golden/README.md; rebuild: python tests/golden/build_golden.py",
           "model": "tiny_model.py", "rtol": RTOL, "atol": ATOL, "packages": packages}
    expected_path.write_text(dumps(doc))
    print(f"wrote {expected_path} ({len(packages)} packages)")
    return 0


# --------------------------------------------------------------------------------------------- the worker side

def check_modules(src: Path, repo: Path, current: bool) -> int:
    """Every imported tcexport.* module comes from ``src`` (and, unless building the working tree, not the repo)."""
    count = 0
    for name, module in sorted(sys.modules.items()):
        if not name.startswith("tcexport."):
            continue
        file = getattr(module, "__file__", None)
        paths = [file] if file else list(getattr(module, "__path__", []))
        for p in paths:
            real = Path(p).resolve()
            if not real.is_relative_to(src) or (not current and real.is_relative_to(repo)):
                raise SystemExit(f"worker: {name} was imported from {real}, not from {src}")
        count += 1
    return count


def worker(job_path: Path) -> int:
    job = json.loads(job_path.read_text())
    src, repo, current = Path(job["src"]).resolve(), Path(job["repo"]).resolve(), job["current"]
    for name in job["packages"]:
        importlib.import_module(name)
    check_modules(src, repo, current)
    import tcexport.exporter as exporter
    import tcexport.formats.manifest as fm
    import tcexport.loader as loader

    print(f"   worker: tcexport.exporter from {Path(exporter.__file__).resolve().parent}", flush=True)
    if list(fm.FORMAT_VERSION) != job["version"]:
        raise SystemExit(f"worker: {src} writes format {list(fm.FORMAT_VERSION)}, the table says {job['version']}")

    import numpy as np
    import torch

    spec = importlib.util.spec_from_file_location("tiny_model", HERE / job.get("model", MODEL))
    tiny = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tiny)
    module = tiny.model()
    if hasattr(tiny, "methods"):  # 1.10: the file's methods; a plain call runs its forward
        pkg = exporter.export(module, methods=tiny.methods)
    else:
        pkg = exporter.export(module, tiny.example_inputs(), tiny.dynamic_shapes)
    pkg.save(job["out"])

    x = np.asarray(tiny.check_input(job["batch"]), dtype=np.float32)
    with torch.no_grad():
        eager = module(torch.from_numpy(x)).numpy()
    model = loader.load(job["out"])  # the old loader, on the package it just wrote
    got = np.asarray(model(x))
    np.testing.assert_allclose(got, eager, rtol=job["rtol"], atol=job["atol"])
    manifest = model.manifest
    n_modules = check_modules(src, repo, current)  # again: nothing the export imported lazily came from elsewhere
    result = {
        "format_version": list(manifest.format_version),
        "bundles": [f"{b.target}/{b.isa}" for b in manifest.kernels],
        "old_loader_max_abs_diff": float(np.max(np.abs(got - eager))),
        "built_with": {"torch": torch.__version__, "numpy": np.__version__, "python": platform.python_version(),
                       "producer": dict(manifest.producer), "tcexport_modules_checked": n_modules},
        "input": x.tolist(),
        "output": eager.tolist(),
    }
    if result["format_version"] != job["version"]:
        raise SystemExit(f"worker: the package says format {result['format_version']}, expected {job['version']}")
    Path(job["result"]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
