"""`--autotune`: on a machine with a GPU, choose each GEMM's and attention kernel's tiles by measuring them inside
the whole model, and return the choice (the manifest's ``cuda.tuning``) that an ordinary export then builds with
(``export(..., tuning=...)``), so a rebuild without a GPU (``--tuning PKG``) makes the same archive.

A tool above the pipeline, not a stage in it: ``tune`` runs the pipeline's stages up to the Triton module,
measures, and returns a tuning; ``tcexport.exporter.export(autotune=True)`` and the CLI's ``--autotune`` call it
and then export with what it returned.

Why the whole model: a kernel timed alone keeps its operands in L2, and its winner can lose in the model (GPT-2's
768-column down-projection: 14.1 against 15.2 us alone, 20.5 against 16 in the model). Each *family* of launches
with the same code, grid and config (one per layer of a transformer) is tuned as one: its candidate tiles are
compiled once (one representative; every member runs that cubin with its own parameters), swapped into a loaded
package, and the model's CUDA graph is timed at every requested shape. Families are visited once each, in launch
order, keeping a candidate only when it beats the current choice by more than NOISE in paired timings (candidate
and current back to back, ROUNDS times: the GPU's clocks drift by more than that over a minute); ties keep the
heuristic. The chosen set must then beat the heuristics as a whole, or the heuristics are recorded instead.
"""

from __future__ import annotations

import dataclasses
import re
import tempfile
import time
from pathlib import Path

from tcexport.exporter.cuda import module as codegen_triton
from tcexport.exporter.cuda.exprs import HALF, next_pow2
from tcexport.exporter.cuda.launches import kernel_launches
from tcexport.exporter.cuda.module import standalone
from tcexport.exporter.cuda.tiles import GemmConfig, fit_gemm
from tcexport.exporter.ir.bounds import symbol_bounds, upper_bound
from tcexport.exporter.errors import BuildError, ExportError
from tcexport.exporter.options import CudaOptions

NOISE = 0.01  # a candidate must beat the current choice by this fraction of the model's time
CALLS = 20  # graph replays per timing
ROUNDS = 3  # paired timings (current, candidate) per candidate; the median ratio counts
AGREE = 2e-2  # relative distance of a candidate's outputs from the heuristic config's (16-bit rounding of sums)

# (BM, BN, BK, warps, stages): Hopper-friendly tiles of 16-bit GEMMs (those cuda/gemm_table.py chose most often
# among them), and float32's (full-precision dots)
GEMM_HALF = [(64, 64, 128, 4, 3), (64, 128, 64, 4, 3), (64, 128, 64, 4, 4), (128, 64, 64, 4, 3),
             (128, 128, 64, 4, 3), (128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (64, 256, 64, 4, 3),
             (128, 128, 32, 4, 4), (64, 64, 64, 4, 4), (128, 128, 64, 8, 4), (128, 256, 64, 8, 4),
             (256, 128, 64, 8, 4)]
GEMM_FEW = [(16, 16, 128, 2, 5), (16, 32, 128, 2, 5), (16, 64, 128, 4, 5), (16, 16, 256, 2, 3)]  # tiles.FEW_TILE's kin
GEMM_FLOAT = [(64, 64, 32, 4, 3), (32, 64, 32, 4, 3), (64, 128, 32, 4, 3), (128, 64, 32, 4, 3),
              (128, 128, 32, 8, 3), (64, 64, 64, 4, 2)]
# (BM, BN, warps, stages) of flash attention
ATTENTION_HALF = [(64, 64, 4, 2), (64, 64, 4, 3), (128, 64, 8, 2), (128, 64, 4, 2), (64, 32, 4, 2),
                  (128, 32, 4, 2), (128, 128, 8, 2), (64, 128, 4, 2)]
ATTENTION_FLOAT = [(64, 32, 4, 2), (32, 32, 4, 2), (64, 64, 4, 2), (128, 32, 8, 2)]


@dataclasses.dataclass
class Family:
    """Launches with one code, grid and config: ``indexes`` into the module's launches."""

    kind: str
    indexes: list
    config: dict  # the current choice: block sizes, num_warps, num_stages


def config_of(launch) -> dict:
    return {**launch.constexprs, "num_warps": launch.num_warps, "num_stages": launch.num_stages}


def _canonical(module, launch) -> str:
    """The launch's code with its name and parameter names replaced by positions (layers differ only there)."""
    src = "\n".join(line for line in standalone(module.launches, launch).splitlines() if not line.startswith("#"))
    src = src.replace(f"def {launch.name}(", "def K(")
    params = [n for n, t in launch.signature.items() if t != "constexpr"]
    return re.sub(r"\b\w+\b", lambda w: f"_P{params.index(w[0])}_" if w[0] in params else w[0], src)


def families(module) -> list[Family]:
    out: dict = {}
    for i, launch in enumerate(module.launches):
        kind = module.tunable.get(launch.name)
        if kind is None or any(p[0] == "error" for p in launch.params):  # its error code names the launch itself
            continue
        key = (kind, _canonical(module, launch), str(launch.grid), str(sorted(config_of(launch).items())),
               tuple(launch.signature.values()), launch.index_bits)
        out.setdefault(key, Family(kind, [], config_of(launch))).indexes.append(i)
    return list(out.values())


def candidates(family: Family, dtype: str, bounds: tuple) -> list[dict]:
    """The family's candidate configs (its current one first), each cut to the dims it runs over: ``bounds`` is
    (M, N, K) of a GEMM, (M,) of attention (query rows); ``dtype`` the operands' (the dot's for mixed ones)."""
    c = family.config
    half = dtype in HALF
    out = [c]
    if family.kind == "gemm":
        few = c["BM"] <= 16 or bounds[0] is not None and bounds[0] <= 16  # a decode step's launch
        for bm, bn, bk, warps, stages in (GEMM_FEW if few else []) + (GEMM_HALF if half else GEMM_FLOAT):
            cfg = fit_gemm(GemmConfig(bm, bn, bk, c["GROUP_M"], warps, stages), *bounds)
            out.append({"BM": cfg.bm, "BN": cfg.bn, "BK": cfg.bk, "GROUP_M": cfg.group_m,
                        "num_warps": cfg.num_warps, "num_stages": cfg.num_stages})
    else:
        (m,) = bounds
        for bm, bn, warps, stages in ATTENTION_HALF if half else ATTENTION_FLOAT:
            bm = bm if m is None else min(bm, max(16, next_pow2(m)))
            out.append({**c, "BM": bm, "BN": bn, "num_warps": warps, "num_stages": stages})
    unique = []
    for cfg in out:
        if cfg not in unique:
            unique.append(cfg)
    return unique


def _shape(prog, kernels, module, index) -> tuple[str, tuple]:
    """(dtype, bounds) of a tunable launch, for ``candidates``."""
    k = kernels[module.owners[index]]
    g = k.stages[0].node.gemm
    bounds = symbol_bounds(prog)
    a, b = prog.buffers[g.a.buffer].dtype, prog.buffers[g.b.buffer].dtype
    dims = (g.m, g.n, g.k) if k.kind == "gemm" else (g.m,)
    out = [upper_bound(e, bounds) for e in dims]
    if k.rows is not None and k.rows[1] is not None:  # split_k.py's band: at most its rows
        out[0] = k.rows[1] if out[0] is None else min(out[0], k.rows[1])
    return (a if a == b else g.acc_dtype), tuple(out)


class Bench:
    """A package of the current module loaded on this GPU, timed as a whole at each requested shape."""

    def __init__(self, r, arch: int, at: list, folder: Path):
        import torch

        from tcexport.loader.archive import open_archive
        from tcexport.loader.cuda_model import CudaModel
        from tcexport.loader.native_cuda import Device
        from tcexport.exporter.package.build import package
        from tcexport.exporter.cuda import build as build_cuda

        self.torch = torch
        from tcexport.exporter.pipeline import INFERENCE, Results

        g, job = r.inference, r.job
        cubins = build_cuda.build_cubins(g.cuda.module, [arch], job.cache_dir or _default_cache(), job.cuda_options)
        # the inference graph alone, for this arch, with the current module's cubins: a package to time
        lean_job = dataclasses.replace(job, targets=(f"cuda:sm_{arch}",), backward=False, onnx=False, tuning=None)
        lean = Results(lean_job, {INFERENCE: dataclasses.replace(g, cuda=dataclasses.replace(g.cuda, cubins=cubins))})
        path = package(lean, "autotune").save(folder / "autotune.tcpkg")
        self.device = Device(torch.cuda.current_device())
        self.model = CudaModel(open_archive(path), self.device, check_indices=False)  # no host sync per call
        self.params = {l.name: l.params for l in g.cuda.module.launches}
        self.modules: list = []  # the candidates' CUDA modules, unloaded by close()
        self.inputs = [_inputs(self.model, job.spec, sizes) for sizes in at]
        self.at = [{s.name: env[s.name] for s in self.model.manifest.symbols} for env in
                   (self.model._bind(xs, {}, None)[2] for xs in self.inputs)]
        self.reference = [self._outputs(xs) for xs in self.inputs]

    def _outputs(self, xs):
        out = self.model(*xs)
        return [o.float() for o in (out if isinstance(out, tuple) else (out,))]

    def kernels(self, indexes: list, regen: dict, cubin) -> list:
        """Loader kernels running ``cubin`` (a family's representative) with each member's own parameters and
        the grid its regenerated launch has."""
        from tcexport.loader.cuda_model import CudaKernel as _Kernel
        from tcexport.exporter.package.exprs import to_expr

        old = [self.model._kernels[i] for i in indexes]
        for k in old:
            if regen[k.name].params != self.params[k.name]:  # one code, so one parameter list: never seen, but fatal
                raise BuildError(f"kernel {k.name}: other tiles changed its parameters; not tuned")
        module, fn = self.device.load_function(cubin.data, cubin.function, cubin.shared)
        self.modules.append(module)
        self.model.reserve_scratch(cubin.global_scratch)
        return [_Kernel(k.name, fn, cubin.num_warps * 32, cubin.shared, k.params,
                        tuple(to_expr(g) for g in regen[k.name].grid), k.symbol_kind, cubin.dependent,
                        cubin.global_scratch)
                for k in old]

    def close(self) -> None:
        """Give the GPU memory back: the loaded package and every candidate's module."""
        self.model.close()
        for module in self.modules:
            self.device.unload(module)
        self.modules.clear()

    def swap(self, indexes: list, kernels: list) -> list:
        """Put ``kernels`` (loader _Kernels) at ``indexes``; returns what was there. Captured graphs are dropped."""
        old = [self.model._kernels[i] for i in indexes]
        for i, k in zip(indexes, kernels):
            self.model._kernels[i] = k
        for g in self.model._graph_cache.values():
            self.model._drop(g)
        self.model._graph_cache.clear()
        return old

    def agrees(self) -> bool:
        """Other tiles sum in another order: the outputs should still match the heuristic config's closely."""
        for xs, ref in zip(self.inputs, self.reference):
            for got, want in zip(self._outputs(xs), ref):
                nan = want.isnan()
                if not bool(got.isnan().equal(nan)):
                    return False
                got, want = got[~nan], want[~nan]
                if bool((got - want).norm() > AGREE * (want.norm() + 1e-30)):
                    return False
        return True

    def time(self) -> float:
        """Seconds per pass over every requested shape: CALLS back-to-back graph replays between two CUDA events
        per shape, after a warm-up."""
        torch = self.torch
        total = 0.0
        for xs in self.inputs:
            for _ in range(3):
                self.model(*xs)
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(CALLS):
                self.model(*xs)
            b.record()
            b.synchronize()
            total += a.elapsed_time(b) * 1e-3 / CALLS
        return total

    def ratio(self, indexes: list, other: list) -> float:
        """Model time with ``other`` kernels at ``indexes`` over the time with the ones there now: the median of
        ROUNDS back-to-back pairs, so the GPU's drift over seconds (clocks, neighbours) cancels out."""
        ratios = []
        for _ in range(ROUNDS):
            now = self.time()
            mine = self.swap(indexes, other)
            ratios.append(self.time() / now)
            self.swap(indexes, mine)
        return sorted(ratios)[len(ratios) // 2]


def _default_cache():
    from tcexport.exporter.build_cache import default_cache_dir

    return default_cache_dir()


def _inputs(model, spec, sizes: dict) -> list:
    """Random inputs shaped like the example inputs with ``sizes`` (symbol -> value) applied; token-like integer
    inputs stay below the example's largest value."""
    import torch

    from tcexport.formats import expr as ex

    examples = [x.cuda() for x in spec.example_inputs]
    env = dict(model._bind(examples, {}, None)[2])
    unknown = set(sizes) - {s.name for s in model.manifest.symbols}
    if unknown:
        raise ExportError(f"--autotune-at names {sorted(unknown)}, which are not dynamic dims of this model "
                          f"(it has {[s.name for s in model.manifest.symbols]})")
    if not sizes:
        return examples
    env.update(sizes)
    g = torch.Generator(device="cuda").manual_seed(0)
    out = []
    for example, ts in zip(examples, model.manifest.inputs):
        shape = tuple(ex.evaluate(d, env) for d in ts.shape)
        if example.dtype.is_floating_point:
            out.append(torch.randn(shape, generator=g, device="cuda").to(example.dtype))
        elif example.dtype == torch.bool:
            out.append(torch.rand(shape, generator=g, device="cuda") < 0.5)
        else:
            high = max(int(example.max()) + 1, 1) if example.numel() else 1
            out.append(torch.randint(0, high, shape, generator=g, device="cuda").to(example.dtype))
    return out


def parse_at(texts) -> list[dict]:
    """``["batch=1", "batch=8,seq=128"]`` -> [{"batch": 1}, {"batch": 8, "seq": 128}]; none -> the examples."""
    out = []
    for text in texts:
        sizes = {}
        for part in (p.strip() for p in text.split(",") if p.strip()):
            name, _, value = part.partition("=")
            if not value.strip().isdigit() or not name.strip():
                raise ExportError(f"--autotune-at {text!r}: {part!r} should be SYMBOL=SIZE, e.g. batch=8")
            sizes[name.strip()] = int(value)
        out.append(sizes)
    return out or [{}]


def require_gpu(targets) -> int:
    """This machine's GPU arch, checked before anything is built: --autotune measures there."""
    import torch

    from tcexport.exporter.pipeline import cuda_archs

    if not cuda_archs(targets):
        raise ExportError("--autotune tunes CUDA kernels; add a cuda target, e.g. --target cuda:sm_90")
    if not torch.cuda.is_available():
        raise ExportError("--autotune measures kernels on a GPU, and torch sees no CUDA device here. Build without "
                          "it (configs from documented heuristics), or reuse a tuning made on a GPU machine: "
                          "--tuning PACKAGE.tcpkg")
    major, minor = torch.cuda.get_device_capability()
    arch = major * 10 + minor
    if arch not in cuda_archs(targets):
        raise ExportError(f"--autotune measures on this GPU (sm_{arch}), which the targets {list(targets)} "
                          f"do not include; add it: --target cuda:sm_{arch}")
    return arch


def tune(model, example_inputs, dynamic_shapes: dict | None = None, targets=("cuda:sm_90",), *, at=(),
         dynamic=(), cache_dir=None, source_path: str | None = None, backward: bool = False, grad_inputs=(),
         cuda_options: CudaOptions | None = None, precision: str | None = None) -> tuple[dict, str]:
    """A tuning for ``model`` measured on this machine's GPU at the example inputs, or at each of ``at``
    ("batch=8" strings): (the manifest's ``cuda.tuning``, a report). The graph is captured as the export will
    capture it (``backward`` changes the inference graph: a training package folds no weights), so the launch
    names the tuning records are the export's."""
    from tcexport.exporter.pipeline import make_job, parse_targets, run_stages

    arch = require_gpu(parse_targets(targets))
    sizes = parse_at(at)
    job = make_job(model, example_inputs, dynamic_shapes, (f"cuda:sm_{arch}",), dynamic=dynamic, cache_dir=cache_dir,
                   source_path=source_path, backward=backward, grad_inputs=grad_inputs, build_cubins=False,
                   cuda_options=cuda_options, precision=precision)
    return autotune(run_stages(job), sizes)


def autotune(r, at: list[dict]) -> tuple[dict, str]:
    """Tune the inference graph's Triton module of the pipeline's results ``r`` on this machine's GPU; returns the
    manifest's ``cuda.tuning`` and a report for --dump."""
    arch = require_gpu(r.job.targets)
    t0 = time.perf_counter()
    g = r.inference
    module, prog, kernels = g.cuda.module, g.program, g.cuda.kernels
    with tempfile.TemporaryDirectory(prefix="tcexport-autotune-") as tmp:
        bench = Bench(r, arch, at, Path(tmp))
        try:
            heuristic = list(bench.model._kernels)
            base = bench.time()
            report = [f"autotune on {bench.device.name} (sm_{arch}) at {bench.at}: {base * 1e3:.3f} ms with the "
                      "heuristics; each candidate's model time relative to the current choice's (median of "
                      f"{ROUNDS} pairs)"]
            tuned: dict = {}
            plain: dict = {}  # the same launches' heuristic configs
            for fam in families(module):
                first = module.launches[fam.indexes[0]]
                cands = candidates(fam, *_shape(prog, kernels, module, fam.indexes[0]))[1:]
                names = [module.launches[i].name for i in fam.indexes]
                plain |= {n: fam.config for n in names}
                if not cands:
                    tuned |= {n: fam.config for n in names}
                    continue
                line = f"{first.name} ({fam.kind}, {len(names)} launches, {_short(fam.config)})"
                if not any(_runs(bench.model._kernels[fam.indexes[0]], env) for env in bench.at):
                    report.append(line + ": not run at the requested shapes; heuristic kept")
                    continue
                compiled = _compile(prog, kernels, module, fam, cands, arch, r.job)
                results = []
                for cfg, (regen, cubin) in zip(cands, compiled):
                    if cubin is None:
                        results.append((cfg, None, "did not compile"))
                        continue
                    try:
                        mine = bench.kernels(fam.indexes, regen, cubin)
                    except Exception as e:  # noqa: BLE001 - too much shared memory for this GPU, say
                        results.append((cfg, None, f"did not load: {e}"))
                        continue
                    current = bench.swap(fam.indexes, mine)
                    ok = bench.agrees()
                    bench.swap(fam.indexes, current)
                    results.append((cfg, bench.ratio(fam.indexes, mine) if ok else None,
                                    "" if ok else "outputs disagree: rejected"))
                best = min((r for r in results if r[1] is not None), key=lambda r: r[1], default=None)
                chosen = fam.config
                if best is not None and best[1] < 1 - NOISE:
                    chosen = best[0]
                    bench.swap(fam.indexes, bench.kernels(fam.indexes, *compiled[cands.index(chosen)]))
                tuned |= {n: chosen for n in names}
                report.append(line + ": " + "; ".join(f"{_short(c)} {r:.3f}" if r is not None else f"{_short(c)} {why}"
                                                      for c, r, why in results)
                              + f" -> {'kept' if chosen == fam.config else _short(chosen)}")
            # the choices were made one family at a time: the set must also win as a whole, or the heuristics stay
            everything = list(range(len(heuristic)))
            share = 1 / bench.ratio(everything, heuristic)
            verdict = "kept" if share < 1 - NOISE else "not a win as a whole: the heuristics kept instead"
            if share >= 1 - NOISE:
                tuned = plain
            report.append(f"tuned: {share:.3f}x the heuristics' model time (median of {ROUNDS} pairs), "
                          f"{bench.time() * 1e3:.3f} ms, {verdict}, in {time.perf_counter() - t0:.0f} s")
        finally:
            bench.close()
        tuning = {"device": bench.device.name, "at": bench.at, "configs": dict(sorted(tuned.items()))}
    return tuning, "\n".join(report)


def _short(cfg: dict) -> str:
    tiles = "x".join(str(cfg[k]) for k in ("BM", "BN", "BK") if k in cfg)
    return f"{tiles}/w{cfg['num_warps']}s{cfg['num_stages']}"


def _runs(kernel, env: dict) -> bool:
    from tcexport.formats import expr as ex

    return min(ex.evaluate(g, env) for g in kernel.grid) > 0


def regenerate(prog, kernels, module, fam: Family, cfg: dict, options: CudaOptions = CudaOptions()) -> tuple[dict, list]:
    """The family's launches generated with ``cfg`` (by name), and every launch of their kernels (the aliases
    among them point into that list)."""
    owners = sorted({module.owners[i] for i in fam.indexes})
    names = [module.launches[i].name for i in fam.indexes]
    tuned = {name: cfg for name in names}
    launches = [l for o in owners for l in kernel_launches(prog, kernels[o], module.owners.index(o), tuned, options)]
    return {l.name: l for l in launches if l.name in names}, launches


def _compile(prog, kernels, module, fam: Family, cands: list, arch: int, job) -> list:
    """Per candidate: (the family's launches regenerated with it, by name; the representative's cubin or None)."""
    from tcexport.exporter.cuda import build as build_cuda

    first = module.launches[fam.indexes[0]].name
    regens, reps = [], []
    for n, cfg in enumerate(cands):
        regen, launches = regenerate(prog, kernels, module, fam, cfg, job.cuda_options)
        regens.append(regen)
        rep = regen[first]
        alias = f"{rep.name}_t{n}"
        source = standalone(launches, rep).replace(f"def {rep.name}(", f"def {alias}(")
        reps.append(dataclasses.replace(rep, name=alias, source=source, alias_of=""))
    source = "\n\n".join([codegen_triton.PRELUDE] + [r.source for r in reps])
    cache = job.cache_dir or _default_cache()
    try:
        built = build_cuda.build_cubins(codegen_triton.TritonModule(source, reps), [arch], cache, job.cuda_options)[arch]
    except BuildError:  # one candidate Triton cannot compile (too much shared memory): the others one by one
        built = []
        for r in reps:
            try:
                built += build_cuda.build_cubins(codegen_triton.TritonModule(
                    "\n\n".join([codegen_triton.PRELUDE, r.source]), [r]), [arch], cache, job.cuda_options)[arch]
            except BuildError:
                built.append(None)
    return list(zip(regens, built))
