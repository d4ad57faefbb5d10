"""The launch list: for each kernel of the GPU's kernel list, the launches the loader makes, planned as data
first and rendered from that plan.

A GEMM may have a small-M variant (cuda/tiles.py ``gemm_variants``), and a GEMM or attention kernel whose
addresses scale with a shape symbol an aligned variant (``unaligned``). Each launch is a ``LaunchPlan`` (kernel,
name, config, 0/1 factor of the shapes it runs for, index width, error code); its body is rendered from the part
of the plan the text depends on (``body_key``), so a variant whose key is the first launch's is an alias line of
that def in the source (a cubin of its own, other tiles or alignment) without comparing any text. A launch's
parameters follow the order in which its body first names its buffers (recorded by the renderers in its
``LaunchScope``), so kernels with one code (a transformer's layers) take their buffers in one order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy

from tcexport.exporter.cuda.attention import attention_body, attention_geometry, attention_tiles
from tcexport.exporter.cuda.exprs import POINTER
from tcexport.exporter.cuda.gemm import gemm_body, gemm_body_plan, gemm_geometry, gemm_variants_of
from tcexport.exporter.cuda.loops import loop_body
from tcexport.exporter.cuda.scope import LaunchScope
from tcexport.exporter.cuda.tiles import ALIGN, TUNABLE, Geometry, loop_geometry, loop_tiles, tuned_config
from tcexport.exporter.ir import loops as ir
from tcexport.exporter.ir.bounds import index_bits, symbol_bounds
from tcexport.exporter.ir.kernels import Kernel
from tcexport.exporter.options import CudaOptions

# a kernel launched as a programmatic dependent (sm_90+, cuda/build.py compiles DEPENDENT in) is scheduled while
# the one before it finishes, and waits at its top until that one's writes are visible, before touching memory;
# where it lets the next kernel launch is CudaOptions.dependent_trigger. After its last store (the default)
# measured best for GPT-2 small on an H200: batch 8 826 us a call, against 874 at the top and 865 with ordinary
# edges; batch 1 446 against 461 and 481 (python -m bench.probes.dependent_launch). Without the launch attribute
# both are no-ops; the interpreter never compiles them.
_WAIT = ["    if DEPENDENT:", "        gdc_wait()"]
_TRIGGER = ["    if DEPENDENT:", "        gdc_launch_dependents()"]
DEPENDENT_LINES = {  # trigger -> (lines at the top, lines at the end)
    "after_last_store": (_WAIT, _TRIGGER),
    "top": (_WAIT + _TRIGGER[1:], []),
    "none": (_WAIT, []),
}


@dataclass
class TritonLaunch:
    """How the loader launches one kernel: ``params`` are ("buffer", name), ("symbol", name) or ("error", None)
    in the kernel's argument order; ``grid`` is three sympy expressions of the shape symbols. (The manifest's
    form of it is formats.manifest.Launch.)"""

    name: str
    params: list
    signature: dict  # argument name -> Triton type ("*fp32", "i64", "constexpr")
    constexprs: dict
    grid: tuple
    num_warps: int
    num_stages: int
    source: str = ""
    index_bits: int = 32  # width of index arithmetic, and of the symbol parameters
    aligned: tuple = ()  # symbol parameters this launch runs with multiples of ALIGN only (compiled knowing it)
    persistent: bool = False  # one program per SM at most (grid min(SM_COUNT, tiles)); may use global scratch
    alias_of: str = ""  # the launch whose def this one's source names (same body, a cubin of its own)

    def describe(self) -> str:
        grid = ", ".join(map(str, self.grid))
        cfg = ", ".join(f"{k}={v}" for k, v in self.constexprs.items())
        aligned = f", {'/'.join(self.aligned)} % {ALIGN} == 0" if self.aligned else ""
        return f"{self.name}: grid ({grid}), {cfg}, warps={self.num_warps}, stages={self.num_stages}{aligned}"


@dataclass
class LaunchPlan:
    """One launch decided: what it renders and how it is launched."""

    kernel: Kernel
    name: str
    config: object            # the tiles.*Config it takes
    when: object              # 0/1 factor of the shapes it runs for (times the aligned split's, once known)
    bits: int
    error_code: int           # its position in the launch list + 1: what a failed range check stores
    aligned: tuple = ()       # symbols it is compiled knowing multiples of ALIGN
    body_key: tuple = field(default=())  # everything of the plan its body text depends on, but the error code

    def geometry(self) -> Geometry:
        k = self.kernel
        if k.kind == "gemm":
            return gemm_geometry(k, self.config, self.when)
        g = attention_geometry(k, self.config) if k.kind == "attention" else loop_geometry(k, self.config)
        return Geometry((g.grid[0] * self.when,) + tuple(g.grid[1:]), g.constexprs, g.num_warps, g.num_stages)


def _body(sc: LaunchScope, plan: LaunchPlan) -> list[str]:
    k = plan.kernel
    if k.kind == "gemm":
        return gemm_body(sc, k, plan.body_key[0])
    if k.kind == "attention":
        return attention_body(sc, k)
    return loop_body(sc, k, plan.config)


def _shapes(prog: ir.Program, k: Kernel, tuned: dict, options: CudaOptions) -> list:
    """[(suffix, config by launch name, 0/1 factor)] of kernel ``k`` before the aligned split; a recorded
    tuning overrides the heuristic config of the launch it names."""
    def config(kind: str, heuristic):
        return lambda name: tuned_config(name, kind, tuned[name], heuristic) if name in tuned else heuristic

    if k.kind == "gemm":
        return [(suffix, config("gemm", cfg), when)
                for suffix, when, cfg in gemm_variants_of(prog, k, options.tma)]
    # other kernels that run for some shapes only (split_k.py) carry the factor here
    when = k.when if k.when is not None else sympy.Integer(1)
    if k.kind == "attention":
        return [("", config("attention", attention_tiles(prog, k)), when)]
    cfg = loop_tiles(k, symbol_bounds(prog))
    return [("", lambda name: cfg, when)]


def _key(k: Kernel, cfg) -> tuple:
    return (gemm_body_plan(k, cfg),) if k.kind == "gemm" else ()


def kernel_launches(prog: ir.Program, k: Kernel, first_id: int, tuned: dict | None = None,
                    options: CudaOptions = CudaOptions()) -> list[TritonLaunch]:
    """The launches of kernel ``k``, numbered from ``first_id``. ``tuned``: launch name -> config recorded by
    --autotune, used instead of the heuristics."""
    tuned = tuned or {}
    touched = {b for s in k.stages for b in s.node.inputs() | {s.node.out.name}} | set(k.writes())
    bits = index_bits(prog, touched)
    bounds = symbol_bounds(prog)
    launches: list[TritonLaunch] = []
    rendered: list[tuple] = []  # (alias key, launch) of this kernel's launches so far
    for suffix, config, when in _shapes(prog, k, tuned, options):
        name = k.name + suffix
        cfg = config(name)
        plan = LaunchPlan(k, name, cfg, when, bits, first_id + len(launches) + 1, body_key=_key(k, cfg))
        base, sc = _render(prog, plan, options, rendered)
        unaligned = sorted(unaligned_symbols(sc.addresses, bounds), key=str) if k.kind in TUNABLE else []
        odd = sympy.Min(1, sum(sympy.Mod(s, ALIGN) for s in unaligned)) if unaligned else None
        if unaligned:  # known once the base's addresses are: the base runs where one of them is not aligned
            plan.when = when * odd
            base.grid = plan.geometry().grid
        launches.append(base)
        if unaligned:
            cfg = config(name + "_a16")
            aligned = LaunchPlan(k, name + "_a16", cfg, when * (1 - odd), bits, first_id + len(launches) + 1,
                                 tuple(f"s_{s.name}" for s in unaligned), body_key=_key(k, cfg))
            launches.append(_render(prog, aligned, options, rendered)[0])
    return launches


def _render(prog: ir.Program, plan: LaunchPlan, options: CudaOptions, rendered: list) -> tuple:
    """The launch of ``plan``, and the scope its body filled; an alias of this kernel's first launch when their
    keys agree (``rendered`` gains this one)."""
    sc = LaunchScope(prog, plan.bits, plan.error_code)
    body = _body(sc, plan)
    launch = _launch(prog, plan, sc, body, options)
    key = (plan.body_key, plan.bits, sc.checked and plan.error_code)
    if rendered and rendered[0][0] == key:
        first = rendered[0][1]
        why = f"compiled knowing {', '.join(launch.aligned)} multiples of {ALIGN}" if launch.aligned else \
            "launched with other tiles"
        launch.source = f"{launch.name} = {first.name}  # the same kernel, {why}\n"
        launch.alias_of = first.name
    rendered.append((key, launch))
    return launch, sc


def _launch(prog: ir.Program, plan: LaunchPlan, sc: LaunchScope, body: list[str],
            options: CudaOptions) -> TritonLaunch:
    """The def of a rendered body: its parameters (buffers in the order the body names them, the symbols, the
    error word if it range-checks), signature and source."""
    k, name = plan.kernel, plan.name
    geo = plan.geometry()
    sym_type = "i32" if plan.bits == 32 else "i64"
    buffers = list(sc.used)
    params = [("buffer", b) for b in buffers] + [("symbol", s.name) for s in prog.symbols]
    params += [("error", None)] if sc.checked else []
    names = buffers + [f"s_{s.name}" for s in prog.symbols] + (["tc_error"] if sc.checked else [])
    signature = {b: POINTER[prog.buffers[b].dtype] for b in buffers}
    signature.update({f"s_{s.name}": sym_type for s in prog.symbols})
    if sc.checked:
        signature["tc_error"] = "*i32"
    signature.update({c: "constexpr" for c in geo.constexprs})
    head = [f"# {line}" for line in str(k).splitlines()]
    args = ", ".join(names + [f"{c}: tl.constexpr" for c in geo.constexprs] + ["DEPENDENT: tl.constexpr = False"])
    top, end = DEPENDENT_LINES[options.dependent_trigger]
    src = "\n".join(["@triton.jit", f"def {name}({args}):"] + top + body + end) + "\n"
    return TritonLaunch(name, params, signature, geo.constexprs, geo.grid, geo.num_warps, geo.num_stages,
                        "\n".join(head) + "\n" + src, plan.bits, plan.aligned,
                        persistent=k.kind == "gemm" and plan.config.persistent)


def unaligned_symbols(addresses: list, bounds: dict) -> set:
    """The shape symbols that scale an address of a rendered launch (its scope's ``addresses``) by a factor that is not a
    multiple of ALIGN elements: a mask's row stride ``seq`` in ``i0*seq*seq + i2*seq + i3``. An ahead-of-time
    build cannot know them divisible, so Triton loads such rows element by element (GPT-2's attention mask:
    9.2 against 6.8 us a layer on an H200, bench/probes/attention.py --mask); the kernel gets a second
    cubin compiled knowing them multiples of ALIGN (Triton's ``tt.divisibility``, what its JIT specialises on),
    launched where they are."""
    needs = []  # per unaligned term, the symbols scaling it: any one of them a multiple of ALIGN aligns it
    for flat, col in addresses:
        terms = sympy.Add.make_args(sympy.expand(sympy.sympify(flat)))
        if col not in terms:  # not contiguous along the tile's columns: no vector loads either way
            continue
        for term in terms:
            coeff, rest = term.as_coeff_Mul()
            scaled = {f.base if f.is_Pow else f for f in sympy.Mul.make_args(rest)} & set(bounds)
            if scaled and (not coeff.is_Integer or int(coeff) % ALIGN):
                needs.append(sorted(scaled, key=str))
    out = {s[0] for s in needs if len(s) == 1}
    for s in sorted(needs, key=len):
        if not out & set(s):
            out.add(s[0])
    return out
