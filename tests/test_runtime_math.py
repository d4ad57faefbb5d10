"""The generated code's float32 math (exporter/runtime/prelude.h): accuracy against float64, edge values,
and that GCC really vectorises loops calling it (the reason it exists)."""

from __future__ import annotations

import ctypes
import math
import subprocess
from pathlib import Path

import numpy as np
import pytest

from packages import ROOT

PRELUDE = ROOT / "exporter" / "runtime" / "prelude.h"
FUNCS = ["exp", "log", "erf", "tanh", "sigmoid"]
WRAPPER = "\n".join(
    f'extern "C" void v_{f}(const float* __restrict__ x, float* __restrict__ y, long n) '
    f"{{ for (long i = 0; i < n; ++i) y[i] = tc_{f}(x[i]); }}" for f in FUNCS)


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("math")
    src = tmp / "math.cpp"
    src.write_text(f'#include "{PRELUDE}"\n{WRAPPER}\n')
    out = tmp / "math.so"
    r = subprocess.run(["g++", "-O3", "-march=x86-64-v3", "-fno-math-errno", "-fno-trapping-math", "-shared",
                        "-fPIC", str(src), "-o", str(out), "-fopt-info-vec-optimized"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    vectorised = {line.split(":")[1] for line in r.stderr.splitlines() if "loop vectorized" in line}
    return ctypes.CDLL(str(out)), vectorised, src


def _run(lib, f, x):
    y = np.empty_like(x)
    getattr(lib[0], f"v_{f}")(x.ctypes.data_as(ctypes.c_void_p), y.ctypes.data_as(ctypes.c_void_p), x.size)
    return y


REFERENCE = {
    "exp": np.exp, "log": np.log, "tanh": np.tanh, "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "erf": np.vectorize(math.erf, otypes=[np.float64]),
}
DOMAIN = {"exp": (-87, 88), "log": (1e-30, 1e30), "erf": (-6, 6), "tanh": (-12, 12), "sigmoid": (-60, 60)}


@pytest.mark.parametrize("f", FUNCS)
def test_accuracy(lib, f):
    lo, hi = DOMAIN[f]
    rng = np.random.default_rng(0)
    if f == "log":
        x = np.exp(rng.uniform(np.log(lo), np.log(hi), 200_000)).astype(np.float32)
    else:
        x = np.concatenate([np.linspace(lo, hi, 200_001), rng.standard_normal(50_000)]).astype(np.float32)
    got = _run(lib, f, x).astype(np.float64)
    want = REFERENCE[f](x.astype(np.float64))
    if f in ("erf", "tanh"):
        assert np.max(np.abs(got - want)) <= 4e-7, f  # about 4 ulp of the values near 1
        near0 = np.abs(x) < 0.5
        assert np.max(np.abs(got - want)[near0] / np.abs(want[near0] + 1e-30)) <= 5e-7, f
    else:
        ulp = np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
        assert np.max(np.abs(got - want) / ulp) <= (3.0 if f == "sigmoid" else 2.0), f


def test_edge_values(lib):
    inf, nan = np.float32(np.inf), np.float32(np.nan)
    x = np.array([0.0, -0.0, inf, -inf, nan, 100.0, -100.0, -87.5, 1e-40], np.float32)
    exp = _run(lib, "exp", x)
    assert exp[0] == 1 and exp[2] == inf and exp[3] == 0 and np.isnan(exp[4]) and exp[5] == inf and exp[6] == 0
    log = _run(lib, "log", np.array([0.0, -1.0, inf, nan, 1.0, 1e-40], np.float32))
    assert log[0] == -inf and np.isnan(log[1]) and log[2] == inf and np.isnan(log[3]) and log[4] == 0
    assert abs(log[5] - np.log(1e-40)) < 1e-4
    erf = _run(lib, "erf", x)
    assert erf[0] == 0 and erf[2] == 1 and erf[3] == -1 and np.isnan(erf[4])
    tanh = _run(lib, "tanh", x)
    assert tanh[2] == 1 and tanh[3] == -1 and np.isnan(tanh[4]) and tanh[5] == 1
    sig = _run(lib, "sigmoid", x)
    assert sig[2] == 1 and sig[3] == 0 and np.isnan(sig[4])


def test_loops_calling_it_vectorise(lib):
    _, vectorised, src = lib
    lines = src.read_text().splitlines()
    wrappers = {str(k + 1) for k, line in enumerate(lines) if "v_" in line}
    assert wrappers <= {v for v in vectorised}, (wrappers, vectorised)
