"""The model zoo (zoo_models.py): every model exported with its dynamic dims and compared torch-free with eager at
the example, both ends of every range and a size inside. ``pytest -m zoo`` runs all of it; the CI subset (one fast
model per family) runs in every run, on the CPU and, for the GPU backend, as cubins for sm_90 plus a tiny shape in
Triton's interpreter; test_zoo_gpu.py runs every model on a real GPU."""

from __future__ import annotations

import functools

import pytest

from zoo_harness import GPU_TOLERANCE, TOLERANCE, compare, compare_cuda, export_model
from packages import WORK
from vision_libs import unavailable
from zoo_models import CI_CUDA, CI_SUBSET, ZOO

pytestmark = [pytest.mark.slow, pytest.mark.zoo]
CI = pytest.mark.zoo_ci


def _param(name: str):
    return pytest.param(name, marks=CI if name in CI_SUBSET else (), id=name)


def _skip_without_libraries(name: str, why: str | None) -> None:
    if unavailable(ZOO[name].library, why):
        pytest.skip(why)


@functools.lru_cache(maxsize=None)
def _exported(name: str, targets: str):
    return export_model(ZOO[name], WORK, targets, cache_dir=WORK / "cache")


def _targets(name: str) -> str:
    return "cpu,cuda:sm_90" if name == CI_CUDA else "cpu"


@pytest.mark.parametrize("name", [_param(n) for n in ZOO])
def test_matches_eager(name, vision_libs):
    _skip_without_libraries(name, vision_libs)
    assert compare(ZOO[name], _exported(name, _targets(name)).path) <= TOLERANCE


@CI
def test_ci_subset_covers_every_family():
    families = {ZOO[n].family for n in CI_SUBSET}
    assert families >= {"decoder LM", "encoder", "encoder-decoder", "vision transformer", "CNN", "audio"}
    assert len(ZOO) >= 40 and CI_CUDA in CI_SUBSET


# the GPU backend: sm_90 cubins (no GPU needed) for every zoo model under -m zoo, for one in every CI run; its
# Triton kernels run in Triton's interpreter at tiny shapes, compared as test_zoo_gpu.py compares on a real GPU
INTERPRETED = {"gemma": [{"batch": 1, "seq": 3}, {"batch": 2, "seq": 1}], "hf-resnet": [{"batch": 1, "size": 64}]}


def _cuda_package(name: str):
    return _exported(name, _targets(name) if name == CI_CUDA else "cuda:sm_90")


@pytest.mark.parametrize("name", [pytest.param(n, marks=CI if n == CI_CUDA else (), id=n) for n in ZOO])
def test_sm90_cubins_for_every_launch(name, vision_libs):
    pytest.importorskip("triton")
    from tcexport.loader.archive import open_archive

    _skip_without_libraries(name, vision_libs)
    m = open_archive(_cuda_package(name).path).manifest
    bundles = [k for k in m.kernels if k.target == "cuda:sm_90"]
    assert len(bundles) == 1 and m.cubins(bundles[0].isa)
    assert {c.kernel for c in m.cubins(bundles[0].isa)} == {launch.name for launch in m.cuda.launches}


@pytest.mark.parametrize("name", [pytest.param(n, marks=CI if n == CI_CUDA else (), id=n) for n in INTERPRETED])
def test_triton_kernels_match_eager_in_the_interpreter(name):
    pytest.importorskip("triton")
    worst, _ = compare_cuda(ZOO[name], _cuda_package(name).path, "interpret", INTERPRETED[name])
    assert worst <= GPU_TOLERANCE
