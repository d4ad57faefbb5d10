"""Byte-identity check for refactors: export a fixed set of models with the CLI and record the SHA-256 of every
generated member (source, libraries, cubins, weights) and the manifest, so two trees can be compared.

    python tests/rebuild_snapshot.py record OUT.json      # with the tree under test importable as tcexport
    python tests/rebuild_snapshot.py compare A.json B.json

Each export runs in its own process with a fresh kernel cache, so binaries are really rebuilt. ``compare`` exits 1
when any member other than ``manifest.json`` differs; manifest differences are printed as a JSON diff to review.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EX, MODELS = ROOT / "examples", ROOT / "tests" / "models"
GPU = "cpu,cuda:sm_90"

# name -> (model file, CLI arguments)
CASES = {
    "mlp": (EX / "mlp.py", ["--target", GPU]),
    "mlp-batch": (EX / "mlp.py", ["--dynamic", "batch=1:512"]),
    "cnn": (EX / "cnn.py", ["--target", GPU]),
    "decoder": (EX / "decoder.py", ["--target", GPU]),
    "attention": (MODELS / "attention.py", ["--target", GPU]),
    "two_inputs": (MODELS / "two_inputs.py", []),
    "dyn_derived": (MODELS / "dyn_derived.py", ["--target", GPU]),
    "dyn_divisible": (MODELS / "dyn_divisible.py", []),
    "dyn_tied": (MODELS / "dyn_tied.py", []),
    "dyn_specialized": (MODELS / "dyn_specialized.py", []),
    "block3d": (MODELS / "block3d.py", []),
    "long_k": (MODELS / "long_k.py", ["--target", GPU]),
    "lm_head": (MODELS / "lm_head.py", ["--target", "cuda:sm_90"]),
    "mlp_bf16": (MODELS / "mlp_bf16.py", []),
    "hf_gpt2": (MODELS / "hf_gpt2.py", ["--target", GPU]),
    "hf_llama": (MODELS / "hf_llama.py", ["--target", "cuda:sm_90"]),
    "mlp-backward": (EX / "mlp.py", ["--backward", "--target", GPU]),
    "classifier-backward": (MODELS / "classifier_loss.py", ["--backward"]),
    "cnn-backward": (EX / "cnn.py", ["--backward", "--target", GPU]),
    "decoder-backward": (EX / "decoder.py", ["--backward"]),
    "dyn_derived-backward": (MODELS / "dyn_derived.py", ["--backward", "--grad-inputs", "x"]),
    "kv_cache": (MODELS / "kv_cache.py", ["--target", GPU]),
}


def _members(path: Path) -> dict:
    import zipfile

    with zipfile.ZipFile(path) as z:
        out = {n: hashlib.sha256(z.read(n)).hexdigest() for n in z.namelist()}
        out["manifest.json:parsed"] = json.loads(z.read("manifest.json"))
    return out


def _export(name: str, work: Path) -> dict:
    path, args = CASES[name]
    out = work / f"{name}.tcpkg"
    env = dict(os.environ, TCEXPORT_CACHE=str(work / f"cache-{name}"))
    cmd = [sys.executable, "-c", "import sys; from tcexport.exporter.cli import main; sys.exit(main())", str(path), "-o", str(out),
           "-q", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=work)
    if r.returncode != 0:
        return {"error": f"exit {r.returncode}: {r.stderr[-2000:]}"}
    return _members(out)


def record(out: Path, names: list[str]) -> None:
    with tempfile.TemporaryDirectory(prefix="tc-snapshot-") as tmp, ThreadPoolExecutor(2) as pool:
        results = dict(zip(names, pool.map(lambda n: _export(n, Path(tmp)), names)))
    out.write_text(json.dumps(results, indent=1, sort_keys=True))
    for n, r in results.items():
        print(n, r.get("error", f"{len(r) - 1} members"))


def _diff(a, b, where: str, lines: list) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a:
                lines.append(f"  + {where}.{k} = {json.dumps(b[k])[:200]}")
            elif k not in b:
                lines.append(f"  - {where}.{k} = {json.dumps(a[k])[:200]}")
            else:
                _diff(a[k], b[k], f"{where}.{k}", lines)
    elif a != b:
        lines.append(f"  ~ {where}: {json.dumps(a)[:200]} -> {json.dumps(b)[:200]}")


def compare(a_path: Path, b_path: Path) -> int:
    a, b = json.loads(a_path.read_text()), json.loads(b_path.read_text())
    bad = 0
    for name in sorted(set(a) & set(b)):  # a partial record compares the cases it has
        ma, mb = a.get(name, {}), b.get(name, {})
        if "error" in ma or "error" in mb:
            same = ma.get("error") == mb.get("error")
            print(f"{name}: " + ("the same error" if same else f"export failed: {ma.get('error') or mb.get('error')}"))
            bad += not same
            continue
        members = sorted((set(ma) | set(mb)) - {"manifest.json", "manifest.json:parsed"})
        differ = [m for m in members if ma.get(m) != mb.get(m)]
        lines: list[str] = []
        _diff(ma.get("manifest.json:parsed"), mb.get("manifest.json:parsed"), "manifest", lines)
        print(f"{name}: {len(members) - len(differ)}/{len(members)} members identical"
              + (f"; DIFFERENT: {differ}" if differ else "") + (f"; manifest: {len(lines)} changes" if lines else ""))
        for line in lines[:40]:
            print(line)
        bad += bool(differ)
    return 1 if bad else 0


if __name__ == "__main__":
    if sys.argv[1] == "record":
        record(Path(sys.argv[2]), sys.argv[3:] or list(CASES))
    else:
        sys.exit(compare(Path(sys.argv[2]), Path(sys.argv[3])))
