"""The zoo on a real GPU: every zoo model exported for this GPU's arch, loaded by the torch-free loader on the device
and compared with eager (float32, on the CPU) at the CPU zoo's cases, through zoo_harness.compare_cuda, which CI
runs with the kernels in Triton's interpreter (test_zoo.py). Skips where there is no CUDA GPU. On the GPU machine:

    pytest -m zoo tests/zoo/test_zoo_gpu.py           # one process; add -n 4 (pytest-xdist) to export in parallel
    python -m bench.zoo_table --device cuda --jobs 4  # the same comparisons as a table (bench/results/...-zoo-cuda)

The kernel cache is TCEXPORT_CACHE (tests/packages.py defaults it to the session's work folder): point both
commands at one folder and the second builds no cubin again.
"""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU", allow_module_level=True)

from packages import WORK  # noqa: E402
from vision_libs import unavailable  # noqa: E402
from zoo_harness import GPU_TOLERANCE, compare_cuda, export_model  # noqa: E402
from zoo_models import ZOO  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.zoo, pytest.mark.gpu]
ARCH = "sm_%d%d" % torch.cuda.get_device_capability()


@pytest.mark.parametrize("name", list(ZOO))
def test_matches_eager_on_the_gpu(name, vision_libs):
    model = ZOO[name]
    if unavailable(model.library, vision_libs):
        pytest.skip(vision_libs)
    worst, _ = compare_cuda(model, export_model(model, WORK / "gpu", f"cuda:{ARCH}").path)
    assert worst <= GPU_TOLERANCE
