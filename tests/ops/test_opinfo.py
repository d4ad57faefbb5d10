"""The op table: every claimed op (claimed_ops.py) on op_db's own sample inputs, exported through the whole
pipeline (capture, lower, fuse, codegen, build, package), loaded and run torch-free, and compared with eager
(float32 also against a float64 reference; integers and bools exactly). Known gaps are data
(expected_failures.py) and strict: a listed sample that passes fails its test.

All packages are built once per session, in large batches (see harness.py), the first time a test asks.
"""

from __future__ import annotations

import functools

import pytest

try:
    import expecttest  # noqa: F401  (torch's op_db imports it)
except ImportError as e:  # fail loudly: a skipped op table would hide every regression it exists to catch
    raise ImportError("the op table needs expecttest for torch's op_db: pip install -e '.[dev]'") from e

import harness  # noqa: E402
from claimed_ops import CLAIMED  # noqa: E402
from expected_failures import EXPECTED_FAILURES  # noqa: E402

pytestmark = pytest.mark.slow

PARAMS = [(op, dt) for op, dts in CLAIMED.items() for dt in dts]


@functools.lru_cache(maxsize=None)
def results() -> dict:
    cases = harness.collect()
    harness.run_all(cases)
    out: dict = {}
    for c in cases:
        out.setdefault((c.op, c.dtype), []).append(c)
    return out


@pytest.mark.parametrize("op,dtype", PARAMS, ids=[f"{op}-{dt}" for op, dt in PARAMS])
def test_op_matches_eager(op, dtype):
    cases = results().get((op, dtype), [])
    if not cases:
        pytest.skip(f"op_db has no usable {dtype} sample for {op}")
    unexpected = [f"{c.name} {c.description}: {c.outcome}" for c in cases if c.outcome != "pass" and not c.xfail]
    fixed = [f"{c.name} {c.description} (listed: {c.xfail.reason})" for c in cases
             if c.outcome == "pass" and c.xfail]
    assert not unexpected, "samples failed:\n  " + "\n  ".join(unexpected)
    assert not fixed, ("samples listed in expected_failures.py now pass; remove their entries:\n  "
                       + "\n  ".join(fixed))
    known = [c for c in cases if c.xfail]
    if known and len(known) == len(cases):
        pytest.xfail("; ".join(dict.fromkeys(c.xfail.reason for c in known)))


def test_expected_failures_are_live():
    """Every entry names a claimed op and matches at least one sample the table runs."""
    cases = [c for cs in results().values() for c in cs]
    stale = [x for x in EXPECTED_FAILURES
             if x.op not in CLAIMED or not any(c.xfail == x for c in cases)]
    assert not stale, "entries in expected_failures.py that match no sample (remove them):\n  " + \
        "\n  ".join(map(str, stale))
