"""Build for CUDA: the generated Triton module → one cubin per kernel per requested ``sm_XX``, on any machine.

``triton.compile(ASTSource(...), target=GPUTarget("cuda", arch, 32))`` needs no GPU. Pointer parameters are
declared 16-byte aligned (the loader guarantees it: arena and weight offsets are 256-byte aligned and it
copies a misaligned input), which lets Triton vectorise loads; so are the symbols of a launch's ``aligned`` (a
variant that only runs where they are multiples of 16, cuda/launches.py unaligned_symbols). Line info is off
so no build path reaches the binary, and results are cached by content (source, kernel, arch, Triton version),
like the C++ build.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
import subprocess
from typing import Callable
from dataclasses import dataclass
from pathlib import Path

from tcexport.formats.cubin import cubin_arch
from tcexport.formats.errors import FormatError
from tcexport.formats.manifest import MAX_SCRATCH, SCRATCH_ALIGN

from tcexport.exporter.build_cache import BuildCache, build_folder, print_warning, warn_once
from tcexport.exporter.cuda.launches import TritonLaunch
from tcexport.exporter.cuda.module import TritonModule
from tcexport.exporter.errors import BuildError
from tcexport.exporter.options import CudaOptions

MODULE_NAME = "tcexport_kernels"


@dataclass(frozen=True)
class BuiltCubin:
    """One kernel compiled for one arch (the manifest's form of it is formats.manifest.Cubin)."""

    kernel: str
    arch: int
    data: bytes
    function: str         # the entry's symbol name in the cubin
    shared: int           # dynamic shared memory bytes the launch must request
    num_warps: int
    global_scratch: int   # bytes of global scratch per program (TMA descriptors of a persistent GEMM; else 0)
    global_scratch_align: int
    dependent: bool = False  # compiled with DEPENDENT: it may be launched as a programmatic dependent (sm_90+)


def parse_arch(target: str) -> list[int]:
    """``cuda:sm_80,sm_90`` (or ``cuda:sm_90``) → [80, 90]."""
    _, _, rest = target.partition(":")
    archs = []
    for part in rest.split(","):
        part = part.strip()
        if not part.startswith("sm_") or not part[3:].isdigit():
            raise BuildError(f"target {target!r}: {part!r} is not an arch like sm_90")
        archs.append(int(part[3:]))
    return archs


def triton_version() -> str:
    import triton

    return triton.__version__


def _load_module(source: str, folder: Path, write: bool = True):
    """Import the generated source from a real file: Triton reads a kernel's source through ``inspect``."""
    path = folder / f"{MODULE_NAME}.py"
    if write:
        path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"{MODULE_NAME}_{hashlib.sha256(source.encode()).hexdigest()[:12]}",
                                                  path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# the most shared memory a block may opt into, per arch (CUDA programming guide, compute capabilities table);
# an arch not listed (a newer one) gets 99 KB, what consumer GPUs since sm_86 allow
SHARED_LIMIT = {70: 96 * 1024, 72: 96 * 1024, 75: 64 * 1024, 80: 163 * 1024, 86: 99 * 1024, 87: 163 * 1024,
                89: 99 * 1024, 90: 227 * 1024}


# griddepcontrol (programmatic dependent launch) is PTX for sm_90 and later: older archs' kernels leave it out
DEPENDENT_ARCH = 90


def shared_limit(arch: int) -> int:
    return SHARED_LIMIT.get(arch, 99 * 1024)


def _compile_one(module, launch: TritonLaunch, arch: int, fp_fusion: bool = True) -> BuiltCubin:
    """One kernel for one arch. The tiles' pipeline depth is chosen for an H100/H200 (228 KB of shared memory a
    block); an arch with less (sm_86 and sm_89 have 99 KB) gets the same kernel with fewer stages, down to one,
    instead of a cubin that would fail to launch."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(module, launch.name)
    names = list(launch.signature)
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n, t in launch.signature.items()
             if t.startswith("*") or n in launch.aligned}
    dependent = arch >= DEPENDENT_ARCH
    src = ASTSource(fn=fn, signature={**launch.signature, "DEPENDENT": "constexpr"},
                    constexprs={**launch.constexprs, "DEPENDENT": dependent}, attrs=attrs)
    stages = launch.num_stages
    while True:
        try:
            k = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                               options={"num_warps": launch.num_warps, "num_stages": stages,
                                        "enable_fp_fusion": fp_fusion})
        except Exception as e:  # noqa: BLE001 - Triton raises many types; all mean the same thing here
            raise BuildError(f"Triton failed to compile kernel {launch.name} for sm_{arch} (a tcexport bug; please "
                             f"report it with the generated source from --dump):\n{type(e).__name__}: "
                             f"{str(e)[-3000:]}") from e
        if k.metadata.shared <= shared_limit(arch) or stages == 1:
            break
        stages -= 1
    md = k.metadata
    if md.shared > shared_limit(arch):
        raise BuildError(f"kernel {launch.name} needs {md.shared} bytes of shared memory on sm_{arch}, which allows "
                         f"{shared_limit(arch)}, even with a one-stage pipeline. Build for another arch, or report "
                         "it with the generated source from --dump.")
    _check_abi(launch, k.asm["ptx"], md, dependent)
    return BuiltCubin(launch.name, arch, k.asm["cubin"], md.name, md.shared, md.num_warps,
                 md.global_scratch_size, md.global_scratch_align, dependent)


def _check_abi(launch: TritonLaunch, ptx: str, md, dependent: bool) -> None:
    """The loader passes the non-constexpr parameters in order, then the global and the profile scratch
    pointers; a Triton whose kernels take anything else cannot be packaged by this tcexport. Global scratch
    (Triton's TMA descriptors, one region per program) is allocated for at most SM_COUNT programs, so only a
    persistent launch may need it; the profile scratch pointer is always null. A kernel marked dependent must
    wait for the grid before it, or the loader's programmatic edges would race."""
    if dependent and "griddepcontrol.wait" not in ptx:
        raise BuildError(f"kernel {launch.name}: compiled with DEPENDENT but its PTX has no griddepcontrol.wait "
                         f"(Triton {triton_version()}); use the Triton version pinned in pyproject.toml")
    entry = ptx[ptx.index(".entry"):]
    entry = entry[:entry.index(")")]
    n_params = entry.count(".param")
    expected = sum(1 for t in launch.signature.values() if t != "constexpr") + 2
    scratch_ok = not md.global_scratch_size or (launch.persistent and md.global_scratch_size <= MAX_SCRATCH
                                                 and SCRATCH_ALIGN % md.global_scratch_align == 0)
    if n_params != expected or not scratch_ok or md.profile_scratch_size:
        raise BuildError(f"kernel {launch.name}: Triton {triton_version()} produced an entry with {n_params} "
                         f"parameters (expected {expected}), {md.global_scratch_size} bytes of global scratch "
                         f"aligned to {md.global_scratch_align} (expected 0, or at most {MAX_SCRATCH} aligned to a "
                         f"divisor of {SCRATCH_ALIGN} in a persistent kernel) and {md.profile_scratch_size} of "
                         "profile scratch (expected 0); this Triton version's launch ABI is not supported. Use the "
                         "Triton version pinned in pyproject.toml.")


def _cache_key(source: str, launch: TritonLaunch, arch: int, fp_fusion: bool) -> str:
    text = json.dumps([source, launch.name, arch, triton_version(), launch.num_warps, launch.num_stages,
                       sorted(launch.constexprs.items()), shared_limit(arch), list(launch.aligned),
                       launch.persistent, fp_fusion])
    return hashlib.sha256(text.encode()).hexdigest()


def build_cubins(module: TritonModule, archs: list[int], cache_dir: Path, options: CudaOptions = CudaOptions(),
                 on_built: Callable[[int, int], None] | None = None) -> dict[int, list[BuiltCubin]]:
    """Every kernel for every arch, in launch order; cached by content and by the options that change the binary
    (build_cache.py: a cached cubin is reused only if it hashes as stored, is for this arch and holds this
    kernel). ``options.fp_fusion`` is Triton's ``enable_fp_fusion``, passed to the compile, never set in the
    process environment. ``on_built(done, total)`` counts cubins as they are ready, cached ones first."""
    warn = warn_once(print_warning)
    report = on_built or (lambda done, total: None)
    cache = BuildCache.open(cache_dir / "cuda", warn)   # None: build uncached (a warning said why)
    try:
        out, todo = _cached_cubins(module, archs, cache, options.fp_fusion)
        total = len(module.launches) * len(archs)
        report(total - len(todo), total)
        if todo:
            with build_folder("tcexport-triton-") as tmp:
                path = Path(tmp) / f"{MODULE_NAME}.py"
                path.write_text(module.source)
                jobs = [(str(path), launch, arch, options.fp_fusion) for arch, _, launch, _ in todo]
                workers = max(1, min(os.cpu_count() or 1, 8, len(jobs)))
                results = _compile_here(jobs, lambda n: report(total - len(todo) + n, total)) if workers == 1 \
                    else _compile_in_processes(jobs, workers, tmp, lambda n: report(total - len(todo) + n, total))
            for (arch, i, _, key), c in zip(todo, results):
                out[arch][i] = c
                if cache is not None:
                    cache.put(key, ".cubin", c.data, {
                        "function": c.function, "shared": c.shared, "num_warps": c.num_warps,
                        "global_scratch": c.global_scratch, "global_scratch_align": c.global_scratch_align,
                        "dependent": c.dependent})
        return out
    finally:
        if cache is not None:
            cache.close()


def _cached_cubins(module: TritonModule, archs: list[int], cache: BuildCache | None,
                   fp_fusion: bool) -> tuple[dict, list]:
    """The cubins the cache holds (None where it does not) and the (arch, index, launch, key) left to compile."""
    out: dict[int, list] = {}
    todo = []
    for arch in archs:
        for launch in module.launches:
            key = _cache_key(module.source, launch, arch, fp_fusion)
            hit = cache.get(key, ".cubin", lambda data, arch=arch: _is_cubin_for(data, arch)) \
                if cache is not None else None
            cubin = _from_record(launch, arch, *hit) if hit is not None else None
            out.setdefault(arch, []).append(cubin)
            if cubin is None:
                todo.append((arch, len(out[arch]) - 1, launch, key))
    return out, todo


def _is_cubin_for(data: bytes, arch: int) -> bool:
    try:
        return cubin_arch(data) == arch
    except FormatError:
        return False


def _from_record(launch: TritonLaunch, arch: int, data: bytes, m: dict) -> BuiltCubin | None:
    """The cached cubin, if its record is complete and its function is in the binary."""
    try:
        c = BuiltCubin(launch.name, arch, data, str(m["function"]), int(m["shared"]), int(m["num_warps"]),
                  int(m["global_scratch"]), int(m["global_scratch_align"]), bool(m.get("dependent", False)))
    except (KeyError, TypeError, ValueError):
        return None
    return c if c.function.encode() in data else None


def _compile_here(jobs: list, on_done: Callable[[int], None]) -> list[BuiltCubin]:
    out = []
    for job in jobs:
        out.append(_compile_job(job))
        on_done(len(out))
    return out


def _compile_in_processes(jobs: list, workers: int, tmp: str, on_done: Callable[[int], None]) -> list[BuiltCubin]:
    """Jobs split over ``workers`` child processes (``python -m tcexport.exporter.cuda.build``): Triton's
    front end parses Python ASTs, which CPython 3.11 cannot do in threads, and a multiprocessing pool would
    re-run the caller's main script in each worker. Each worker prints a line per finished cubin, read here as
    it comes (``on_done(count so far)``)."""
    chunks = [jobs[k::workers] for k in range(workers)]
    procs = []
    for k, chunk in enumerate(chunks):
        spec = Path(tmp) / f"jobs{k}.json"
        spec.write_text(json.dumps([{"path": p, "arch": a, "name": l.name, "signature": l.signature,
                                     "constexprs": l.constexprs, "num_warps": l.num_warps,
                                     "num_stages": l.num_stages, "aligned": list(l.aligned),
                                     "persistent": l.persistent, "fp_fusion": fp}
                                    for p, l, a, fp in chunk]))
        procs.append(subprocess.Popen([sys.executable, "-m", "tcexport.exporter.cuda.build", str(spec)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    errors = _watch(procs, on_done)
    by_job = {}
    for k, (proc, chunk) in enumerate(zip(procs, chunks)):
        err = errors[k]
        if proc.wait() != 0:
            raise BuildError(f"a Triton compile worker failed (exit {proc.returncode}):\n{err[-4000:]}")
        results = json.loads((Path(tmp) / f"jobs{k}.json.out").read_text())
        for job, r in zip(chunk, results):
            by_job[id(job)] = BuiltCubin(r["kernel"], r["arch"], bytes.fromhex(r["data"]), r["function"], r["shared"],
                                    r["num_warps"], r["global_scratch"], r["global_scratch_align"], r["dependent"])
    return [by_job[id(job)] for job in jobs]


_BUILT = b"tcexport-cubin-built\n"   # a worker's line per finished cubin


def _watch(procs: list, on_done: Callable[[int], None]) -> list[str]:
    """Read every worker's stdout (counting its ``_BUILT`` lines) and stderr until all close, straight from the
    pipes (no buffered reader hides a line from select); returns each worker's stderr."""
    import selectors

    sel = selectors.DefaultSelector()
    outs = [bytearray() for _ in procs]
    errs = [bytearray() for _ in procs]
    for k, proc in enumerate(procs):
        sel.register(proc.stdout.fileno(), selectors.EVENT_READ, outs[k])
        sel.register(proc.stderr.fileno(), selectors.EVENT_READ, errs[k])
    done, open_pipes = 0, 2 * len(procs)
    while open_pipes:
        for key, _ in sel.select():
            chunk = os.read(key.fd, 65536)
            if not chunk:
                sel.unregister(key.fd)
                open_pipes -= 1
            key.data.extend(chunk)
        count = sum(o.count(_BUILT) for o in outs)
        if count != done:
            done = count
            on_done(done)
    sel.close()
    return [e.decode(errors="replace") for e in errs]


def _worker_main(spec_path: str) -> int:
    jobs = json.loads(Path(spec_path).read_text())
    out = []
    for j in jobs:
        launch = TritonLaunch(j["name"], [], j["signature"], j["constexprs"], (), j["num_warps"], j["num_stages"],
                        aligned=tuple(j["aligned"]), persistent=j["persistent"])
        try:
            c = _compile_job((j["path"], launch, j["arch"], j["fp_fusion"]))
        except BuildError as e:
            print(str(e), file=sys.stderr)
            return 1
        out.append({"kernel": c.kernel, "arch": c.arch, "data": c.data.hex(), "function": c.function,
                    "shared": c.shared, "num_warps": c.num_warps, "global_scratch": c.global_scratch,
                    "global_scratch_align": c.global_scratch_align, "dependent": c.dependent})
        sys.stdout.buffer.write(_BUILT)   # the parent counts these lines (_watch)
        sys.stdout.flush()
    Path(spec_path + ".out").write_text(json.dumps(out))
    return 0


_MODULES: dict = {}


def _compile_job(job) -> BuiltCubin:
    """One kernel for one arch, in this process (a pool worker imports the generated module once)."""
    import triton

    path, launch, arch, fp_fusion = job
    module = _MODULES.get(path)
    if module is None:
        module = _MODULES[path] = _load_module(Path(path).read_text(), Path(path).parent, write=False)
    previous = triton.knobs.compilation.disable_line_info
    triton.knobs.compilation.disable_line_info = True
    try:
        return _compile_one(module, launch, arch, fp_fusion)
    finally:
        triton.knobs.compilation.disable_line_info = previous


if __name__ == "__main__":
    sys.exit(_worker_main(sys.argv[1]))
