"""The model zoo (zoo_models.py): every model exported with its dynamic dims and compared torch-free with eager at
the example, both ends of every range and a size inside. ``pytest -m zoo`` runs all of it; the CI subset (one fast
model per family) runs in every run, on the CPU and, for the GPU backend, as cubins for sm_90 plus a tiny shape in
Triton's interpreter."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from harness import TOLERANCE, compare, export_model, relative_error
from packages import WORK
from zoo_models import CI_SUBSET, ZOO

pytestmark = [pytest.mark.slow, pytest.mark.zoo]
CI = pytest.mark.zoo_ci


def _param(name: str):
    return pytest.param(name, marks=CI if name in CI_SUBSET else (), id=name)


def _skip_without_libraries(name: str, why: str | None) -> None:
    if ZOO[name].library != "transformers" and why:
        pytest.skip(why)


@functools.lru_cache(maxsize=None)
def _exported(name: str, targets: str):
    return export_model(ZOO[name], WORK, targets, cache_dir=WORK / "cache")


@pytest.mark.parametrize("name", [_param(n) for n in ZOO])
def test_matches_eager(name, vision_libs):
    _skip_without_libraries(name, vision_libs)
    targets = "cpu,cuda:sm_90" if name in CI_SUBSET else "cpu"
    assert compare(ZOO[name], _exported(name, targets).path) <= TOLERANCE


@CI
def test_ci_subset_covers_every_family():
    families = {ZOO[n].family for n in CI_SUBSET}
    assert families >= {"decoder LM", "encoder", "encoder-decoder", "vision transformer", "CNN", "audio"}
    assert len(ZOO) >= 40


# the GPU backend: cubins for sm_90 built with the CI subset's CPU packages, and every Triton kernel of the two
# cheapest run in Triton's interpreter at a tiny shape
INTERPRETED = {"llama": {"batch": 1, "seq": 3}, "hf-resnet": {"batch": 1, "size": 32}}


@CI
@pytest.mark.parametrize("name", CI_SUBSET)
def test_ci_subset_has_sm90_cubins(name):
    from tcexport.loader.archive import open_archive

    m = open_archive(_exported(name, "cpu,cuda:sm_90").path).manifest
    bundles = [k for k in m.kernels if k.target == "cuda:sm_90"]
    assert len(bundles) == 1 and m.cubins(bundles[0].isa)
    assert {c.kernel for c in m.cubins(bundles[0].isa)} == {launch.name for launch in m.cuda.launches}


@CI
@pytest.mark.parametrize("name", list(INTERPRETED))
def test_triton_kernels_match_eager_in_the_interpreter(name):
    pytest.importorskip("triton")
    from tcexport.exporter.check.interpret import run_interpreted

    model, sizes = ZOO[name], INTERPRETED[name]
    inputs = model.inputs(sizes)
    (got, *_), = run_interpreted(_exported(name, "cpu,cuda:sm_90").path, [[x.numpy() for x in inputs]])
    with torch.no_grad():
        want = model.build()(*inputs)
    assert relative_error(np.asarray(got), want) <= TOLERANCE
