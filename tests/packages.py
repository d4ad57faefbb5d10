"""Builds real packages once per test session (exporting costs seconds), shared by the end-to-end tests."""

from __future__ import annotations

import functools
import importlib.util
import os
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
MODELS = Path(__file__).resolve().parent / "models"
WORK = Path(tempfile.mkdtemp(prefix="tcexport-tests-"))
os.environ.setdefault("TCEXPORT_CACHE", str(WORK / "cache"))


def load_module(path: Path):
    spec = importlib.util.spec_from_file_location(f"_test_model_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@functools.lru_cache(maxsize=None)
def built(path: str, *dynamic: str) -> Path:
    """Export a model file (as the CLI would) into a package under the session's work dir."""
    from tcexport.exporter.front.model_file import load_model_file
    from tcexport.exporter.pipeline import export

    spec = load_model_file(path)
    pkg = export(spec.module, spec.example_inputs, spec.dynamic_shapes, dynamic=list(dynamic),
                 name=Path(path).stem, source_path=path)
    out = WORK / f"{Path(path).stem}-{abs(hash(dynamic))}.tcpkg"
    pkg.save(out)
    return out


def exported_with_source(module, inputs, dynamic_shapes, folder: Path):
    """``module`` exported into ``folder`` with ``--dump`` (kernel-layout tests read the generated C++): (the
    loaded package, its model.cpp)."""
    from tcexport.exporter import export
    from tcexport.loader import load

    export(module, inputs, dynamic_shapes=dynamic_shapes, cache_dir=folder / "cache",
           dump=folder / "dump").save(folder / "model.tcpkg")
    return load(folder / "model.tcpkg"), (folder / "dump" / "model.cpp").read_text()


def mlp_package() -> Path:
    return built(str(EXAMPLES / "mlp.py"))
