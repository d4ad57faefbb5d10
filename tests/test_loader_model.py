"""End to end with a real (tiny, hand-written) C kernel library: load, guard, run, threads, cache, CLI."""

import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from loader_helpers import (KERNEL_FILE, WEIGHTS, build_package, compile_c, compile_kernel, default_members,
                            descriptor_c, make_manifest, spec)
from tcexport.formats.errors import (ArityError, DtypeError, FormatError, RuntimeKernelError, StaticDimError,
                                     SymbolRangeError, TargetError, VersionError)
from tcexport.formats.manifest import FORMAT_VERSION, KernelBundle, Symbol
from tcexport.loader import load, native_cpu

GEMM_C = r"""
#include <stdint.h>
typedef struct { int32_t abi_version; int32_t num_threads; void* blas[8]; char* error; int64_t error_size; } tc_context;
typedef void (*sgemm_t)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*, int);
int32_t tc_abi_version(void) { return 1; }
int32_t tc_run(const tc_context* ctx, const int64_t* s, void* const* in, void* const* w, void* const* out, void* ws) {
  ((sgemm_t)ctx->blas[0])(101, 111, 111, (int)s[0], 4, 4, 1.0f, (const float*)in[0], 4, (const float*)w[0], 4,
                          0.0f, (float*)out[0], 4);
  return 0;
}
"""


def _load(path, tmp_path, **kw):
    return load(path, cache_dir=tmp_path / "cache", **kw)


def test_runs_numpy(package, tmp_path):
    model = _load(package, tmp_path)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(model(x), x + WEIGHTS["w"])
    np.testing.assert_array_equal(model(x=x), x + WEIGHTS["w"])
    assert [repr(s) for s in model.inputs] == ["TensorSpec(x: float32[batch, 4])"]
    assert model.symbols == [Symbol("batch", 1, 64)]


def test_runs_torch(package, tmp_path):
    torch = pytest.importorskip("torch")
    model = _load(package, tmp_path)
    x = torch.randn(5, 4)
    y = model(x)
    assert isinstance(y, torch.Tensor) and torch.equal(y, x + torch.from_numpy(WEIGHTS["w"]))


def test_guard_runs_before_kernel(package, tmp_path):
    model = _load(package, tmp_path)
    with pytest.raises(SymbolRangeError, match="1..64"):
        model(np.zeros((65, 4), np.float32))


def test_kernel_error_becomes_runtime_kernel_error(package, tmp_path):
    model = _load(package, tmp_path)
    with pytest.raises(RuntimeKernelError, match="code 7: unlucky batch 13"):
        model(np.zeros((13, 4), np.float32))


@pytest.mark.parametrize("args, kwargs, match", [
    ((), {}, "missing input"), ((1, 2), {}, "takes 1"), ((), {"z": 1}, "no input named 'z'"),
    ((np.zeros((1, 4), np.float32),), {"x": 1}, "both positionally and by name"),
])
def test_arity_errors(package, tmp_path, args, kwargs, match):
    with pytest.raises(ArityError, match=match):
        _load(package, tmp_path)(*args, **kwargs)


def test_concurrent_calls(package, tmp_path):
    model = _load(package, tmp_path)
    errors = []

    def worker(batch):
        x = np.full((batch, 4), batch, np.float32)
        for _ in range(200):
            if not np.array_equal(model(x), x + WEIGHTS["w"]):
                errors.append(batch)

    threads = [threading.Thread(target=worker, args=(b,)) for b in range(1, 9)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_concurrent_calls_while_signatures_are_evicted(package, tmp_path):
    """Threads with different batches, through a signature cache too small to hold them all: every call's
    symbols, output shape and workspace still belong to its own inputs."""
    from tcexport.loader.guards import SignatureCache
    model = _load(package, tmp_path)
    model._signatures = SignatureCache(model._plan, model._signature, size=2)
    errors = []

    def worker(batch):
        x = np.full((batch, 4), batch, np.float32)
        for _ in range(100):
            y = model(x)
            if y.shape != (batch, 4) or not np.array_equal(y, x + WEIGHTS["w"]):
                errors.append(batch)

    threads = [threading.Thread(target=worker, args=(b,)) for b in (1, 2, 3, 5, 8, 21, 34, 55)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(model._signatures) <= 2


def test_repeated_signature_still_runs_every_guard(package, tmp_path):
    model = _load(package, tmp_path)
    x = np.ones((3, 4), np.float32)
    model(x)
    with pytest.raises(DtypeError):
        model(x.astype(np.float64))              # same shape as the cached call
    with pytest.raises(DtypeError, match="byte order"):
        model(x.astype(">f4"))
    with pytest.raises(StaticDimError):
        model(np.ones((3, 5), np.float32))
    with pytest.raises(SymbolRangeError):
        model(np.ones((65, 4), np.float32))
    np.testing.assert_array_equal(model(x), x + WEIGHTS["w"])


class _Sub(np.ndarray):
    pass


@pytest.mark.parametrize("make", [
    lambda x: np.repeat(x, 2, axis=1)[:, ::2],                          # strided view: copied
    lambda x: np.asfortranarray(x),                                     # Fortran order: copied
    lambda x: np.frombuffer(x.tobytes(), np.float32).reshape(x.shape),  # read-only
    lambda x: x.view(_Sub),                                             # an ndarray subclass
    lambda x: x.tolist(),                                               # no array at all: a dtype error
])
def test_inputs_off_the_fast_path_give_the_same_answer(package, tmp_path, make):
    model = _load(package, tmp_path)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    model(x)  # the signature is cached from the fast path
    arg = make(x)
    if isinstance(arg, list):
        with pytest.raises(DtypeError):
            model(arg)
        return
    np.testing.assert_array_equal(model(arg), x + WEIGHTS["w"])


def test_outputs_are_fresh_each_call(package, tmp_path):
    model = _load(package, tmp_path)
    x = np.ones((2, 4), np.float32)
    y1, y2 = model(x), model(x)
    assert not np.shares_memory(y1, y2)
    y1[:] = 0
    np.testing.assert_array_equal(model(x), x + WEIGHTS["w"])


def test_kernel_error_message_is_not_stale(package, tmp_path):
    model = _load(package, tmp_path)
    for _ in range(2):
        with pytest.raises(RuntimeKernelError, match="unlucky batch 13"):
            model(np.zeros((13, 4), np.float32))
        assert model._buffers().error.value == b""  # cleared once read
        np.testing.assert_array_equal(model(np.zeros((2, 4), np.float32)), np.tile(WEIGHTS["w"], (2, 1)))


def test_data_address_matches_numpy():
    from tcexport.loader.model import data_address
    base = np.arange(40, dtype=np.int64).reshape(5, 8)
    for a in (base, base[2:], base[1, 3:], np.frombuffer(b"abcd", np.uint8), np.array(1.5), np.empty((0, 3))):
        assert data_address(a) == a.ctypes.data


def test_cache_is_content_addressed_and_tamper_rewritten(package, tmp_path):
    model = _load(package, tmp_path)
    sha = model.manifest.members[KERNEL_FILE]["sha256"]
    data = model.archive.read(KERNEL_FILE)
    fd = native_cpu.cached_library_fd(data, sha, tmp_path / "cache")
    cached = tmp_path / "cache" / "kernels" / f"{sha}.so"
    assert os.path.samestat(os.fstat(fd), os.stat(cached)) and (cached.stat().st_mode & 0o777) == 0o500
    assert ((tmp_path / "cache" / "kernels").stat().st_mode & 0o777) == 0o700
    tampered = cached.with_name("tampered.tmp")
    tampered.write_bytes(b"tampered")
    os.replace(tampered, cached)
    fd2 = native_cpu.cached_library_fd(data, sha, tmp_path / "cache")
    assert cached.read_bytes() == data and os.pread(fd2, len(data) + 1, 0) == data
    os.close(fd), os.close(fd2)


def test_cache_dir_from_environment_when_memfds_cannot_run(package, tmp_path, monkeypatch):
    """The disk cache is the fallback where a sealed memfd cannot be executed; it honours TCEXPORT_CACHE."""
    monkeypatch.setenv("TCEXPORT_CACHE", str(tmp_path / "envcache"))
    code = f"""
import os, numpy as np
del os.memfd_create
import tcexport.loader as L
m = L.load({str(package)!r})
print(m(np.ones((1, 4), np.float32)).sum())
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    sha = load(package).manifest.members[KERNEL_FILE]["sha256"]
    assert (tmp_path / "envcache" / "kernels" / f"{sha}.so").is_file()


def test_num_threads_default_reads_omp_at_load(package, tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert _load(package, tmp_path).num_threads == 1
    assert _load(package, tmp_path, num_threads=3).num_threads == 3


def test_gpu_device_is_a_target_error(package, tmp_path):
    with pytest.raises(TargetError, match="cuda:sm_XX"):
        _load(package, tmp_path, device="cuda")


def _bundle(isa, requires=(), **kw):
    fields = dict(target="cpu", isa=isa, requires=tuple(requires), file=KERNEL_FILE, abi=1, entry="tc_run",
                  libraries=(), blas=())
    fields.update(kw)
    return KernelBundle(**fields)


def test_bundle_choice_by_cpu_flags():
    from tcexport.formats.abi import CPU_ISA_REQUIRES
    v4, v3 = set(CPU_ISA_REQUIRES["x86-64-v4"]), set(CPU_ISA_REQUIRES["x86-64-v3"])
    m = make_manifest(kernels=(_bundle("x86-64-v4", ["avx512f"]), _bundle("x86-64-v3", ["avx2", "fma"]),
                               _bundle("x86-64")))
    choose = native_cpu.choose_bundle
    assert choose(m, flags=v4, arch="x86-64").isa == "x86-64-v4"
    assert choose(m, flags=v3, arch="x86-64").isa == "x86-64-v3"
    assert choose(m, flags=set(), arch="x86-64").isa == "x86-64"
    assert choose(m, isa="x86-64", flags={"avx512f"}, arch="x86-64").isa == "x86-64"
    with pytest.raises(TargetError, match=r"needs CPU flags \[.*'avx512f'"):
        choose(m, isa="x86-64-v4", flags=v3, arch="x86-64")
    with pytest.raises(TargetError, match="no cpu kernel bundle with isa 'sve'.*x86-64-v4"):
        choose(m, isa="sve", flags=set(), arch="x86-64")


def test_edited_requires_cannot_pick_a_level_this_cpu_lacks():
    """A manifest whose v4 bundle claims to require nothing still needs AVX-512: the loader's own table."""
    from tcexport.formats.abi import CPU_ISA_REQUIRES
    m = make_manifest(kernels=(_bundle("x86-64-v4", []), _bundle("x86-64")))
    assert native_cpu.choose_bundle(m, flags=set(CPU_ISA_REQUIRES["x86-64-v3"]), arch="x86-64").isa == "x86-64"


def test_no_usable_bundle_lists_what_the_package_has():
    m = make_manifest(kernels=(_bundle("x86-64-v4", ["avx512f"]),))
    with pytest.raises(TargetError) as e:
        native_cpu.choose_bundle(m, flags={"avx2"}, arch="x86-64")
    assert "x86-64-v4 (requires avx512f)" in str(e.value) and "'avx512bw'" in str(e.value)
    with pytest.raises(TargetError, match="aarch64 machine"):
        native_cpu.choose_bundle(make_manifest(), flags=set(), arch="aarch64")


def test_missing_system_library_names_the_package(tmp_path, kernel, monkeypatch):
    m = make_manifest(kernels=(_bundle("x86-64", libraries=("libc.so.6", "libgomp.so.1")),))
    p = build_package(tmp_path / "p.tcpkg", m, default_members(kernel))
    real = native_cpu.ctypes.CDLL

    def missing_gomp(name, *a, **kw):  # an allow-listed soname this machine lacks
        if name == "libgomp.so.1":
            raise OSError("libgomp.so.1: cannot open shared object file")
        return real(name, *a, **kw)

    monkeypatch.setattr(native_cpu.ctypes, "CDLL", missing_gomp)
    with pytest.raises(TargetError, match=r"libgomp.so.1.*apt-get install libgomp1.*dnf install libgomp"):
        _load(p, tmp_path)


def test_library_outside_the_allow_list_is_refused(tmp_path, kernel):
    m = make_manifest(kernels=(_bundle("x86-64", libraries=("libtcexport-nope.so.9",)),))
    with pytest.raises(FormatError, match="may only need the system libraries"):
        build_package(tmp_path / "p.tcpkg", m, default_members(kernel))


def test_abi_mismatch(tmp_path):
    lib2 = compile_kernel(tmp_path, abi=2)  # the same interface descriptor; tc_abi_version says 2
    p = build_package(tmp_path / "p.tcpkg", members=default_members(lib2))
    with pytest.raises(FormatError, match="reports C ABI 2; the manifest says 1"):
        _load(p, tmp_path)
    m = make_manifest(kernels=(_bundle("x86-64", abi=2),))
    p = build_package(tmp_path / "q.tcpkg", m, default_members(lib2))
    with pytest.raises(VersionError, match="ABI 2"):
        _load(p, tmp_path)


def test_blas_pointers_reach_the_kernel(tmp_path):
    pytest.importorskip("scipy_openblas32")
    w = np.arange(16, dtype=np.float32).reshape(4, 4)
    from safetensors.numpy import save
    m = make_manifest(weights=(spec("w", "float32", [4, 4]),), workspace_bytes=0,
                      kernels=(_bundle("x86-64", blas=("sgemm",)),))
    members = {"weights.safetensors": save({"w": w}), "src/add.c": b"",
               KERNEL_FILE: compile_c(tmp_path, GEMM_C + descriptor_c(m, ("sgemm",)), "gemm")}
    model = _load(build_package(tmp_path / "g.tcpkg", m, members), tmp_path)
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    np.testing.assert_allclose(model(x), x @ w, rtol=1e-5)


# -- the CLI ---------------------------------------------------------------------------------------------------


def _tcpkg(*args, env=None):
    return subprocess.run([sys.executable, "-c",
                           "import sys; from tcexport.loader.cli import main; sys.exit(main())", *args],
                          capture_output=True, text=True, env=env)


def test_cli_inspect(package):
    r = _tcpkg("inspect", str(package))
    assert r.returncode == 0, r.stderr
    for text in ("tcpkg {}.{}".format(*FORMAT_VERSION), "input  x: float32[batch, 4]", "batch: 1..64", "x86-64", "w: float32[4]",
                 "16*batch", "sha256"):
        assert text in r.stdout
    j = json.loads(_tcpkg("inspect", str(package), "--json").stdout)
    assert j["verified"] is True and j["manifest"]["model"]["name"] == "add"


def test_cli_inspect_altered_package(package, tmp_path):
    raw = bytearray(package.read_bytes())
    idx = raw.find(b"tc_abi_version")
    raw[idx] ^= 0xFF
    altered = tmp_path / "altered.tcpkg"  # a copy: the fixture's archive is mapped by models loaded earlier
    altered.write_bytes(bytes(raw))
    r = _tcpkg("inspect", str(altered), "--json")
    assert r.returncode == 3 and r.stderr.startswith("error: ") and "SHA-256" in r.stderr
    assert json.loads(r.stdout)["verified"] is False


def test_cli_run(package, tmp_path):
    x = np.ones((2, 4), np.float32)
    np.save(tmp_path / "x.npy", x)
    env = {**os.environ, "TCEXPORT_CACHE": str(tmp_path / "cache")}
    r = _tcpkg("run", str(package), "--input", f"x={tmp_path / 'x.npy'}", "-o", str(tmp_path / "out"), "--json",
               env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["outputs"][0]["shape"] == [2, 4]
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "y.npy"), x + WEIGHTS["w"])
    bad = np.ones((2, 5), np.float32)
    np.save(tmp_path / "bad.npy", bad)
    r = _tcpkg("run", str(package), "--input", f"x={tmp_path / 'bad.npy'}", env=env)
    assert r.returncode == 5 and "error: input 'x' dim 1" in r.stderr
    assert _tcpkg("run", str(package), "--input", "nonsense", env=env).returncode == 2
    assert _tcpkg("bogus-command").returncode == 2


def test_loader_never_imports_torch(package, tmp_path):
    """In a process where `import torch` fails, loading and running still works."""
    code = f"""
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "triton", "sympy") or name.startswith(("tcexport.exporter", "tcexport.packager")):
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Block())
import numpy as np
import tcexport.loader as L
import tcexport.loader.cli
m = L.load({str(package)!r}, cache_dir={str(tmp_path / 'c')!r})
print(m(np.ones((2, 4), np.float32)).sum())
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert float(r.stdout) == 2 * 4 + 2 * 10


def test_packager_never_imports_torch(package, tmp_path):
    """In a process where torch, triton, sympy and the exporter cannot be imported, the packager still writes an
    archive: the fixture's manifest and members, read back and saved again, give the same bytes."""
    copy = tmp_path / "copy.tcpkg"
    code = f"""
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "triton", "sympy") or name.startswith("tcexport.exporter"):
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Block())
from tcexport.loader.archive import open_archive
from tcexport.packager import Package
a = open_archive({str(package)!r})
Package(a.manifest, {{n: a.read(n) for n in a.names()}}, {{}}).save({str(copy)!r})
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert copy.read_bytes() == package.read_bytes()
