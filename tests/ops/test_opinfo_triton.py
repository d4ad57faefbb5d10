"""The op table through the GPU backend: the same op_db samples, generated as Triton kernels (no cubins) and run in
Triton's CPU interpreter, compared with eager like the CPU table. float64 is left out (the interpreter's float64
dot differs from the GPU's); the known gaps of this backend are listed here as data, strictly."""

from __future__ import annotations

import functools

import pytest

pytest.importorskip("triton")

import harness  # noqa: E402

pytestmark = pytest.mark.slow

DTYPES = ["float32", "int64", "bool", "bfloat16", "float16"]

# (op, dtype, sample index) -> why it fails in the interpreter; strict: a listed sample that passes fails the test
KNOWN: dict = {}


@functools.lru_cache(maxsize=None)
def results() -> list:
    return harness.run_through("triton-interpreter", harness.collect(dtypes=DTYPES), group_size=400)


def test_triton_kernels_match_eager_in_the_interpreter():
    cases = results()
    assert len(cases) > 1000
    failed = {(c.op, c.dtype, c.index): c for c in cases if c.outcome != "pass" and not c.xfail}
    unexpected = [f"{c.name} {c.description}: {c.outcome}" for key, c in failed.items() if key not in KNOWN]
    fixed = [f"{op}[{dt}]#{i}" for (op, dt, i) in KNOWN if (op, dt, i) not in failed]
    assert not unexpected, "samples failed through the Triton backend:\n  " + "\n  ".join(unexpected)
    assert not fixed, "listed Triton gaps now pass; remove them from KNOWN:\n  " + "\n  ".join(fixed)
