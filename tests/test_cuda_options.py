"""CUDA choices passed as values (exporter/options.py CudaOptions), and the GPU schedule as a stage of its own:
the defaults are what ships, the other values change only what they say, and nothing reads the process
environment."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from tcexport.exporter import pipeline  # noqa: E402
from tcexport.exporter.cuda import build as build_cuda  # noqa: E402
from tcexport.exporter.errors import ExportError  # noqa: E402
from tcexport.exporter.front.model_file import load_model_file  # noqa: E402
from tcexport.exporter.ir.kernels import verify_kernels  # noqa: E402
from tcexport.exporter.options import CudaOptions  # noqa: E402
from packages import EXAMPLES  # noqa: E402

MODELS = EXAMPLES.parent / "tests" / "models"


def _state(path, **options):
    job = pipeline.Job(load_model_file(path), targets=("cuda:sm_90",), build_cubins=False,
                       cuda_options=CudaOptions(**options))
    return pipeline.run_stages(job).inference


def test_the_gpu_schedule_is_a_stage_before_codegen(tmp_path):
    job = pipeline.Job(load_model_file(EXAMPLES / "decoder.py"), targets=("cuda:sm_90",), build_cubins=False)
    names = [stage.name for stage in pipeline.stages(job)]
    assert names.index("schedule_cuda") + 1 == names.index("codegen_triton")
    st = pipeline.run_stages(job, tmp_path).inference
    text = (tmp_path / "schedule_cuda.txt").read_text()
    assert "[attention]" in text and "memory:" in text
    verify_kernels(st.cuda.kernels)
    assert any(k.kind == "attention" for k in st.cuda.kernels) and not any(k.kind == "attention" for k in st.kernels)


@pytest.mark.parametrize("trigger, top, end", [("after_last_store", False, True), ("top", True, False),
                                               ("none", False, False)])
def test_dependent_trigger_places_the_launch_of_the_next_kernel(trigger, top, end):
    st = _state(EXAMPLES / "mlp.py", dependent_trigger=trigger)
    for launch in st.cuda.module.launches:
        if launch.alias_of:  # a variant launched through another launch's def (checked there)
            continue
        lines = launch.source.splitlines()
        head = lines[lines.index(next(line for line in lines if line.startswith("def "))) + 1:][:3]
        assert head[:2] == ["    if DEPENDENT:", "        gdc_wait()"]
        assert (head[2] == "        gdc_launch_dependents()") == top
        assert (lines[-1] == "        gdc_launch_dependents()") == end


def test_tma_off_keeps_every_gemm_one_program_per_tile():
    on, off = _state(MODELS / "lm_head.py"), _state(MODELS / "lm_head.py", tma=False)
    assert any(l.persistent for l in on.cuda.module.launches)
    assert not any(l.persistent for l in off.cuda.module.launches)
    assert "make_tensor_descriptor" in on.cuda.module.source and "make_tensor_descriptor" not in off.cuda.module.source


def test_fp_fusion_is_part_of_the_cubin_cache_key_and_no_environment_is_set(monkeypatch):
    monkeypatch.delenv("TRITON_DEFAULT_FP_FUSION", raising=False)
    st = _state(EXAMPLES / "mlp.py")
    launch = st.cuda.module.launches[0]
    keys = {build_cuda._cache_key(st.cuda.module.source, launch, 90, fp) for fp in (True, False)}
    assert len(keys) == 2
    import inspect
    assert "os.environ" not in inspect.getsource(build_cuda)


def test_a_bad_trigger_is_a_typed_error():
    with pytest.raises(ExportError, match="dependent_trigger should be one of"):
        CudaOptions(dependent_trigger="sometimes")
