"""The generated code's float32 math (exporter/cpu/runtime/prelude.h): accuracy against float64, edge values,
and that GCC really vectorises loops calling it (the reason it exists)."""

from __future__ import annotations

import ctypes
import math
import subprocess
from pathlib import Path

import numpy as np
import pytest

from packages import ROOT

PRELUDE = ROOT / "exporter" / "cpu" / "runtime" / "prelude.h"
POOL = ROOT / "exporter" / "cpu" / "runtime" / "pool.h"  # the thread pool prelude.h runs GEMMs on
FUNCS = ["exp", "log", "erf", "tanh", "sigmoid"]
WRAPPER = "\n".join(
    f'extern "C" void v_{f}(const float* __restrict__ x, float* __restrict__ y, long n) '
    f"{{ for (long i = 0; i < n; ++i) y[i] = tc_{f}(x[i]); }}" for f in FUNCS)


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("math")
    src = tmp / "math.cpp"
    src.write_text(f'#include "{POOL}"\n#include "{PRELUDE}"\n{WRAPPER}\n')
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


# ---------------------------------------------------------------------------------------------------------
# 16-bit floats: bit-exact conversions at every ISA level the exporter builds, and loops over them vectorise

HALF_FUNCS = {"f16_to_float": ("uint16_t", "float"), "float_to_f16": ("float", "uint16_t"),
              "bf16_to_float": ("uint16_t", "float"), "float_to_bf16": ("float", "uint16_t")}
HALF_WRAPPER = "\n".join(
    f'extern "C" void h_{f}(const {a}* __restrict__ x, {b}* __restrict__ y, long n) '
    f"{{ for (long i = 0; i < n; ++i) y[i] = tc_{f}(x[i]); }}" for f, (a, b) in HALF_FUNCS.items())


@pytest.fixture(scope="module", params=["x86-64", "x86-64-v3", "x86-64-v4"])
def half_lib(request, tmp_path_factory):
    """The conversions built as the exporter builds generated code (its flags) for one ISA level; None for
    the library when this CPU cannot run that level (vectorisation is still checked)."""
    from tcexport.exporter.cpu import build
    from tcexport.loader.native_cpu import cpu_flags

    isa = next(i for i in build.ISA_LEVELS if i.name == request.param)
    tmp = tmp_path_factory.mktemp(f"half-{isa.name}")
    src = tmp / "half.cpp"
    src.write_text(f'#include "{POOL}"\n#include "{PRELUDE}"\n{HALF_WRAPPER}\n')
    out = tmp / "half.so"
    flags = [*build.BASE_FLAGS, f"-march={isa.name}", *build.ISA_FLAGS.get(isa.name, ()), "-fopt-info-vec-optimized"]
    r = subprocess.run(["g++", *flags, str(src), "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    vectorised = {line.split(":")[1] for line in r.stderr.splitlines() if "loop vectorized" in line}
    runs = set(isa.requires) <= (cpu_flags() or set())
    return (ctypes.CDLL(str(out)) if runs else None), vectorised, src, isa.name


def _convert(lib, f, x, out_dtype):
    y = np.empty(x.shape, out_dtype)
    getattr(lib, f"h_{f}")(x.ctypes.data_as(ctypes.c_void_p), y.ctypes.data_as(ctypes.c_void_p), x.size)
    return y


def _torch_bits(x: np.ndarray, dtype) -> np.ndarray:
    """PyTorch's (c10's) float32 -> 16-bit float conversion, as bit patterns."""
    import torch

    return torch.from_numpy(x).to(dtype).view(torch.int16).numpy().view(np.uint16)


def _float_probes(halves: np.ndarray) -> np.ndarray:
    """float32 values where rounding to a 16-bit float is decided: the 16-bit values themselves, the midpoints
    between neighbours (ties) and one float32 ulp either side of them, and random bit patterns."""
    finite = np.sort(halves[np.isfinite(halves)].astype(np.float64))
    mid = ((finite[:-1] + finite[1:]) / 2).astype(np.float32)
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 2**32, 1_000_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    specials = np.array([np.inf, -np.inf, np.nan, -np.nan, 0.0, -0.0, 3.4e38, 1e-45, 65504.0, 65520.0,
                         65519.996], np.float32)
    return np.concatenate([halves.astype(np.float32), mid, np.nextafter(mid, np.float32(np.inf)),
                           np.nextafter(mid, np.float32(-np.inf)), noise, specials]).astype(np.float32)


@pytest.mark.parametrize("kind", ["float16", "bfloat16"])
def test_half_conversions_are_bit_exact(half_lib, kind):
    import torch

    lib, _, _, isa = half_lib
    if lib is None:
        pytest.skip(f"this CPU cannot run {isa}")
    dtype = getattr(torch, kind)
    short = "f16" if kind == "float16" else "bf16"
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    want = torch.from_numpy(bits.view(np.int16)).view(dtype).float().numpy()
    got = _convert(lib, f"{short}_to_float", bits, np.float32)
    nan = np.isnan(want)
    assert np.array_equal(got.view(np.uint32)[~nan], want.view(np.uint32)[~nan]), f"{kind} -> float32 on {isa}"
    assert np.isnan(got[nan]).all()

    x = _float_probes(want)
    got = _convert(lib, f"float_to_{short}", x, np.uint16)
    ref = _torch_bits(x, dtype)
    nan = np.isnan(x)
    bad = np.flatnonzero((got != ref) & ~nan)
    assert bad.size == 0, f"float32 -> {kind} on {isa}: {x[bad[:5]]} gave {got[bad[:5]]}, torch {ref[bad[:5]]}"
    back = torch.from_numpy(got[nan].view(np.int16)).view(dtype).float().numpy()
    assert np.isnan(back).all(), f"NaN must stay NaN ({kind}, {isa})"
    assert np.array_equal(got[nan] >> 15, (x[nan].view(np.uint32) >> 31).astype(np.uint16)), "NaN keeps its sign"


def test_half_conversion_loops_vectorise(half_lib):
    """Why the conversions are integer arithmetic and not _Float16: GCC 12 keeps _Float16 loops scalar."""
    _, vectorised, src, isa = half_lib
    lines = src.read_text().splitlines()
    wrappers = {str(k + 1) for k, line in enumerate(lines) if "h_" in line and "extern" in line}
    assert len(wrappers) == len(HALF_FUNCS) and wrappers <= vectorised, (isa, wrappers, vectorised)


# ---------------------------------------------------------------------------------------------------------
# tc_gemm: its own float32 kernel on AVX-512, BLAS elsewhere; splits across threads

GEMM_WRAPPER = r"""
static void naive_sgemm(int, int ta, int tb, int m, int n, int k, float, const float* a, int lda, const float* b,
                        int ldb, float, float* c, int ldc) {
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int q = 0; q < k; ++q)
        s += double(ta == kTrans ? a[q * lda + i] : a[i * lda + q]) * double(tb == kTrans ? b[j * ldb + q] : b[q * ldb + j]);
      c[i * ldc + j] = float(s);
    }
}
// C = op(A) op(B) per batch
extern "C" void run_gemm(int nt, long batch, long m, long n, long k, int ta, const float* a, long lda, long a_batch,
                         int tb, const float* b, long ldb, long b_batch, float* c) {
  tc_gemm<float>(naive_sgemm, nt, batch, m, n, k, ta != 0, a, lda, a_batch, tb != 0, b, ldb, b_batch, c);
}
"""

GEMM_SHAPES = [  # (batch, m, n, k): tiles, panel edges, k past one packed block (256), m = 1, k = 0; the own
    # kernel's blocks: m past 256 rows and n past 1024 columns, a short last k block, few rows (16, B not packed)
    (1, 1, 1, 1), (1, 1, 256, 64), (1, 1, 37, 300), (1, 5, 3, 7), (1, 8, 32, 16), (1, 9, 33, 17), (1, 37, 70, 129),
    (1, 96, 172, 64), (1, 130, 200, 64), (1, 64, 64, 1030), (1, 300, 64, 40), (1, 2, 500, 3), (3, 17, 45, 19),
    (4, 32, 32, 32), (1, 7, 9, 0), (1, 270, 1060, 300), (1, 16, 70, 300), (1, 20, 1030, 520),
]


@pytest.fixture(scope="module", params=["x86-64-v3", "x86-64-v4"])
def gemm_lib(request, tmp_path_factory):
    """tc_gemm built as generated code is, with a naive double-accumulating "BLAS" (the path below AVX-512)."""
    from tcexport.exporter.cpu import build
    from tcexport.loader.native_cpu import cpu_flags

    isa = next(i for i in build.ISA_LEVELS if i.name == request.param)
    if not set(isa.requires) <= (cpu_flags() or set()):
        pytest.skip(f"this CPU cannot run {isa.name}")
    tmp = tmp_path_factory.mktemp(f"gemm-{isa.name}")
    src = tmp / "gemm.cpp"
    src.write_text(f'#include "{POOL}"\n#include "{PRELUDE}"\nnamespace {{\n{GEMM_WRAPPER}\n}}\n'
                   'extern "C" void gemm_entry(int nt, long batch, long m, long n, long k, int ta, const float* a, '
                   'long lda, long a_batch, int tb, const float* b, long ldb, long b_batch, float* c) '
                   '{ run_gemm(nt, batch, m, n, k, ta, a, lda, a_batch, tb, b, ldb, b_batch, c); }\n')
    out = tmp / "gemm.so"
    flags = [*build.BASE_FLAGS, f"-march={isa.name}", *build.ISA_FLAGS.get(isa.name, ())]
    r = subprocess.run(["g++", *flags, str(src), "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr   # generated code builds with -Wall
    lib = ctypes.CDLL(str(out))
    i, l, ptr = ctypes.c_int, ctypes.c_long, ctypes.c_void_p
    lib.gemm_entry.argtypes = [i, l, l, l, l, i, ptr, l, l, i, ptr, l, l, ptr]
    return lib, isa.name


@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False), (True, True)])
@pytest.mark.parametrize("threads", [1, 2])
def test_gemm_matches_float64(gemm_lib, ta, tb, threads):
    lib, isa = gemm_lib
    rng = np.random.default_rng(0)
    p = ctypes.c_void_p
    for batch, m, n, k in GEMM_SHAPES:
        pad = 3  # leading dimensions wider than the operand: every row step goes through lda / ldb
        a_rows, a_cols = (k, m) if ta else (m, k)
        b_rows, b_cols = (n, k) if tb else (k, n)
        a = rng.standard_normal((batch, a_rows, a_cols + pad), dtype=np.float32)
        b = rng.standard_normal((batch, b_rows, b_cols + pad), dtype=np.float32)
        c = np.full((batch, m, n), np.nan, np.float32)   # an element no piece writes stays NaN
        lib.gemm_entry(threads, batch, m, n, k, int(ta), a.ctypes.data_as(p), a_cols + pad, a[0].size,
                       int(tb), b.ctypes.data_as(p), b_cols + pad, b[0].size, c.ctypes.data_as(p))
        av = a[:, :, :a_cols].astype(np.float64)
        bv = b[:, :, :b_cols].astype(np.float64)
        want = (av.transpose(0, 2, 1) if ta else av) @ (bv.transpose(0, 2, 1) if tb else bv)
        where = f"{isa} threads={threads} ta={ta} tb={tb} batch={batch} m={m} n={n} k={k}"
        np.testing.assert_allclose(c, want, rtol=1e-5, atol=1e-5 * max(k, 1) ** 0.5 * 4, err_msg=where)
