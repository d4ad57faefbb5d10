"""The compiler: capture → lower → fuse → plan → codegen → build. ``export()`` is the Python entry point: the
pipeline's export (pipeline.py), with ``autotune=True`` first running the tuning tool (tune/autotune.py) and then
building with the tuning it returned, as ``--tuning`` does. ``report()`` (blockers.py, ``tcexport --report``)
lists everything that blocks an export in one pass, writing nothing. torch is imported when ``export`` or
``report`` is called, not when this package is, so ``tcexport --help`` and the missing-torch message work in a
loader-only install."""

from __future__ import annotations

import time
from pathlib import Path

from tcexport.exporter.errors import ExportError, output_error

__all__ = ["export", "report"]


def export(model, example_inputs=None, dynamic_shapes: dict | None = None, targets=("cpu",), *, autotune: bool = False,
           autotune_at=(), tuning=None, **kw):
    """``pipeline.export`` (see there for every other argument). ``autotune=True`` measures GEMM and attention
    tiles on this machine's GPU at the example inputs, or at each of ``autotune_at`` ("batch=8" strings), and
    builds with the winners (recorded in the manifest's ``cuda.tuning``); ``tuning`` (a .tcpkg path, or its
    manifest's ``cuda.tuning``) builds with a recorded tuning instead, no GPU needed."""
    from tcexport.exporter import pipeline

    if tuning is not None and autotune:
        raise ExportError("--tuning builds with a recorded tuning and --autotune makes a new one; pass one of them")
    if autotune_at and not autotune:
        raise ExportError(f"--autotune-at {list(autotune_at)} names sizes to tune at; add --autotune")
    if autotune and kw.get("methods") is not None:
        from tcexport.exporter.errors import MethodError

        raise MethodError("--autotune measures the model's forward; with methods, tune the forward alone and pass "
                          "--tuning PKG (the first method builds with it)", expected="no --autotune",
                          got="--autotune")
    if autotune:
        from tcexport.exporter.tune.autotune import require_gpu, tune

        require_gpu(pipeline.parse_targets(targets))  # before anything is built
        t0 = time.perf_counter()
        if kw.get("progress") is not None:
            kw["progress"].stage("autotune", "measuring tiles on this GPU")
        tuning, report = tune(model, example_inputs, dynamic_shapes, targets, at=autotune_at,
                              **{k: v for k, v in kw.items() if k in _TUNE_ARGS})
        if kw.get("dump"):
            _write_report(Path(kw["dump"]), report)
        if kw.get("on_stage") is not None:
            kw["on_stage"]("autotune", time.perf_counter() - t0)
        if kw.get("progress") is not None:
            kw["progress"].stage_done("autotune", time.perf_counter() - t0)
    return pipeline.export(model, example_inputs, dynamic_shapes, targets, tuning=tuning, **kw)


def report(model, example_inputs, dynamic_shapes: dict | None = None, targets=("cpu",), **kw) -> list:
    """Everything that blocks exporting ``model``, in one pass, as ``blockers.Blocker``s (empty: nothing does);
    writes nothing. ``kw``: ``dynamic``, ``source_path``, ``backward``, ``grad_inputs`` as for ``export``."""
    from tcexport.exporter.blockers import report as find_blockers

    return find_blockers(model, example_inputs, dynamic_shapes, targets, **kw)


_TUNE_ARGS = ("dynamic", "cache_dir", "source_path", "backward", "grad_inputs", "cuda_options", "precision")


def _write_report(dump: Path, report: str) -> None:
    try:
        dump.mkdir(parents=True, exist_ok=True)
        (dump / "autotune.txt").write_text(report)
    except OSError as e:
        raise output_error("the --dump folder", dump, e, "pass another folder to --dump") from e
