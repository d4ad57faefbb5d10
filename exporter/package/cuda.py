"""A graph's CUDA part of the manifest: its launch list (each buffer parameter resolved to an input, weight,
output or workspace offset) and its cubins as archive members, one bundle per arch."""

from __future__ import annotations

from tcexport.formats.manifest import CUDA_ABI_VERSION, Cubin, CudaPlan, KernelBundle, Launch

from tcexport.exporter.cuda.build import triton_version

from . import members as names
from .exprs import to_expr


def cuda_section(g, tuning: dict | None, members: dict) -> tuple[CudaPlan, list[KernelBundle]]:
    """The inference graph's launch list (shared by every arch) and one bundle of cubins per arch."""
    bundles = [KernelBundle(target=f"cuda:sm_{arch}", isa=f"sm_{arch}", requires=(), file=names.TRITON_SOURCE,
                            abi=CUDA_ABI_VERSION, entry="", libraries=("libcuda.so.1",), blas=(), cubins=files)
               for arch, files in cubin_members(g, members, "").items()]
    return cuda_launches(g, tuning), bundles


def cuda_launches(g, tuning: dict | None = None) -> CudaPlan:
    """A graph's launch list in manifest form: each buffer parameter as the input, weight or output it is, or as
    a temp at its offset in the GPU's own memory plan; ``tuning`` is recorded with it."""
    prog, cuda = g.program, g.cuda
    where = {name: ("input", k) for k, name in enumerate(prog.inputs)}
    where |= {name: ("weight", k) for k, name in enumerate(prog.weights)}
    where |= {name: ("output", k) for k, name in enumerate(prog.outputs)}
    launches = []
    for launch in cuda.module.launches:
        params = []
        for kind, value in launch.params:
            param = {"kind": kind, "value": value if kind != "error" else 0}
            if kind == "buffer":
                kind, index = where.get(value) or ("temp", to_expr(cuda.memory.offsets[value]))
                param = {"kind": kind, "value": index}
                if kind == "temp":
                    param["dtype"] = prog.buffers[value].dtype
            params.append(param)
        launches.append(Launch(launch.name, tuple(params), tuple(to_expr(g) for g in launch.grid),
                               dict(launch.constexprs), launch.num_warps, launch.num_stages, launch.index_bits))
    return CudaPlan(triton_version(), cuda.module.index_bits, tuple(launches),
                    to_expr(cuda.memory.workspace_bytes), tuning)


def cubin_members(g, members: dict, folder: str) -> dict[int, tuple]:
    """Each arch's cubins, in launch order, added to ``members`` as ``kernels/cuda-sm_XX/<folder><kernel>.cubin``."""
    out = {}
    for arch, cubins in g.cuda.cubins.items():
        files = []
        for c in cubins:
            path = names.cubin(arch, folder, c.kernel)
            members[path] = c.data
            files.append(Cubin(c.kernel, path, c.function, c.shared, c.num_warps, c.dependent, c.global_scratch))
        out[arch] = tuple(files)
    return out
