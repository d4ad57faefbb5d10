"""The op table on a real GPU: the same op_db samples, exported for this GPU's arch (``cuda:sm_XY``, cubins built
here by Triton), loaded through the CUDA driver (``load(path, device="cuda")``), called with torch CUDA tensors and
compared with eager like the CPU table. float64 is in: the GPU backend generates float64 kernels (and float64
GEMM tiles) like any other dtype. The known gaps of this backend on a GPU are listed here as data, strictly.

Skips at module level where there is no CUDA GPU (CI). ``TCEXPORT_OPS_CUDA_ARCH=sm_90`` on a CPU-only machine
builds every package instead (nothing runs): the test then checks that every kernel compiles for that arch.
``python tests/ops/gpu_table.py`` runs the same table and prints only what differs from KNOWN.
"""

from __future__ import annotations

import functools
import os

import pytest

# (op, dtype, sample index) -> why it fails on the GPU; strict: a listed sample that passes fails the test.
# Indices are positions among op_db's usable samples of the torch that runs the table.
KNOWN: dict = {}

DTYPES = ["float32", "float64", "int64", "bool", "bfloat16", "float16"]
GROUP_SIZE = 400  # samples per package: ~1250 kernels in 5 packages, each built by parallel Triton workers

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
BUILD_ONLY = not torch.cuda.is_available()
if BUILD_ONLY and not os.environ.get("TCEXPORT_OPS_CUDA_ARCH"):
    pytest.skip("no CUDA GPU", allow_module_level=True)

import harness  # noqa: E402

pytestmark = pytest.mark.slow


@functools.lru_cache(maxsize=None)
def results() -> list:
    # a listed failure runs in a batch of its own, so it costs no bisection
    return harness.run_through("cuda", harness.collect(dtypes=DTYPES), GROUP_SIZE, isolate=frozenset(KNOWN))


def differences(cases: list) -> tuple[list, list]:
    """(samples that fail and are not listed, listed samples that pass), as text; expected_failures.py's
    samples are left out, as in the other tables. Build-only runs have no strict side: nothing ran."""
    ok = ("built",) if BUILD_ONLY else ("pass",)
    failed = {(c.op, c.dtype, c.index): c for c in cases if c.outcome not in ok and not c.xfail}
    unexpected = [f"{c.name} {c.description}: {c.outcome}" for key, c in failed.items()
                  if BUILD_ONLY or key not in KNOWN]
    ran = {(c.op, c.dtype, c.index) for c in cases}
    fixed = [] if BUILD_ONLY else [f"{op}[{dt}]#{i} (listed: {why})" for (op, dt, i), why in KNOWN.items()
                                   if (op, dt, i) not in failed and (op, dt, i) in ran]
    return unexpected, fixed


def test_cuda_kernels_match_eager():
    cases = results()
    assert len(cases) > 1000
    stale = [key for key in KNOWN if key not in {(c.op, c.dtype, c.index) for c in cases}]
    assert not stale, f"KNOWN lists samples this torch's op_db does not have: {stale}"
    unexpected, fixed = differences(cases)
    assert not unexpected, "samples failed through the CUDA backend:\n  " + "\n  ".join(unexpected)
    assert not fixed, "listed CUDA gaps now pass; remove them from KNOWN:\n  " + "\n  ".join(fixed)
