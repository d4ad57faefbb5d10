"""The op table: every claimed op (claimed_ops.py) on op_db's own sample inputs, exported through the whole
pipeline (capture, lower, fuse, codegen, build, package), loaded and run torch-free, and compared with eager
(float32 also against a float64 reference; integers and bools exactly). Known gaps are data
(expected_failures.py) and strict: a listed sample that passes fails its test.

All packages are built once per session, in large batches (see harness.py), the first time a test asks: every
run builds float32, int64 and bool; the other dtypes run with ``-m long``.
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

# every run takes these dtypes (one batch of builds); the others run with -m long (CI's 30 minutes on 2 cores)
EVERY_RUN = ("float32", "int64", "bool")
LONG = tuple(sorted({dt for dts in CLAIMED.values() for dt in dts} - set(EVERY_RUN)))
PARAMS = [pytest.param(op, dt, id=f"{op}-{dt}", marks=() if dt in EVERY_RUN else (pytest.mark.long,))
          for op, dts in CLAIMED.items() for dt in dts]


@functools.lru_cache(maxsize=None)
def results(dtypes: tuple) -> dict:
    cases = harness.collect(dtypes=dtypes)
    harness.run_all(cases)
    out: dict = {}
    for c in cases:
        out.setdefault((c.op, c.dtype), []).append(c)
    return out


@pytest.mark.parametrize("op,dtype", PARAMS)
def test_op_matches_eager(op, dtype):
    cases = results(EVERY_RUN if dtype in EVERY_RUN else LONG).get((op, dtype), [])
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


@pytest.mark.parametrize("group", [pytest.param("every-run", id="every-run"),
                                   pytest.param("all", id="all", marks=pytest.mark.long)])
def test_expected_failures_are_live(group):
    """Every entry names a claimed op and matches at least one sample the table runs (in every run: the entries
    of the every-run dtypes; with -m long: all of them, against every dtype's samples)."""
    groups = (EVERY_RUN,) if group == "every-run" else (EVERY_RUN, LONG)
    cases = [c for dtypes in groups for cs in results(dtypes).values() for c in cs]
    entries = [x for x in EXPECTED_FAILURES if group == "all" or x.dtype in EVERY_RUN]
    stale = [x for x in entries if x.op not in CLAIMED or not any(c.xfail == x for c in cases)]
    assert not stale, "entries in expected_failures.py that match no sample (remove them):\n  " + \
        "\n  ".join(map(str, stale))
