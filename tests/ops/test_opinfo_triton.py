"""The op table through the GPU backend: the same op_db samples, generated as Triton kernels (no cubins) and run in
Triton's CPU interpreter, compared with eager like the CPU table. float64 is left out (the interpreter's float64
dot differs from the GPU's); the known gaps of this backend are listed here as data, strictly."""

from __future__ import annotations

import functools

import pytest

pytest.importorskip("triton")

import harness  # noqa: E402

pytestmark = pytest.mark.slow

# every run: float32 and bfloat16 (the GPU's dtypes); int64, bool and float16 with -m long (CI's 30 minutes)
EVERY_RUN = ("float32", "bfloat16")
LONG = ("int64", "bool", "float16")

# (op, dtype, sample index) -> why it fails in the interpreter; strict: a listed sample that passes fails the test
KNOWN: dict = {}


@functools.lru_cache(maxsize=None)
def results(dtypes: tuple) -> list:
    return harness.run_through("triton-interpreter", harness.collect(dtypes=dtypes), group_size=400)


@pytest.mark.parametrize("dtypes", [pytest.param(EVERY_RUN, id="every-run"),
                                    pytest.param(LONG, id="long", marks=pytest.mark.long)])
def test_triton_kernels_match_eager_in_the_interpreter(dtypes):
    cases = results(dtypes)
    assert len(cases) > 300
    failed = {(c.op, c.dtype, c.index): c for c in cases if c.outcome != "pass" and not c.xfail}
    unexpected = [f"{c.name} {c.description}: {c.outcome}" for key, c in failed.items() if key not in KNOWN]
    fixed = [f"{op}[{dt}]#{i}" for (op, dt, i) in KNOWN if dt in dtypes and (op, dt, i) not in failed]
    assert not unexpected, "samples failed through the Triton backend:\n  " + "\n  ".join(unexpected)
    assert not fixed, "listed Triton gaps now pass; remove them from KNOWN:\n  " + "\n  ".join(fixed)
