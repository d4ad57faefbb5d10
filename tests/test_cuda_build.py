"""GPU packages built and checked on a machine without a GPU: cubins for sm_80 and sm_90 (ELF headers, manifest
launches), byte-identical rebuilds, the missing-arch error, and every generated Triton kernel run in Triton's
CPU interpreter and compared with eager."""

from __future__ import annotations

import functools
import re
import zipfile
from pathlib import Path

import numpy as np
import pytest
import sympy
import torch

pytest.importorskip("triton")

from tcexport.exporter.cuda.build import cubin_arch  # noqa: E402
from tcexport.exporter.front.model_file import load_model_file  # noqa: E402
from tcexport.exporter.pipeline import export  # noqa: E402
from tcexport.exporter.check.interpret import run_interpreted  # noqa: E402
from tcexport.formats.errors import TargetError  # noqa: E402
from tcexport.loader.archive import open_archive  # noqa: E402
from tcexport.loader.cuda_model import pick_bundle  # noqa: E402
from packages import EXAMPLES, MODELS, WORK  # noqa: E402

pytestmark = pytest.mark.slow


@functools.lru_cache(maxsize=None)
def built_cuda(path: str, targets: str = "cuda:sm_90", *dynamic: str, cache: str = "cache") -> Path:
    spec = load_model_file(path)
    pkg = export(spec.module, spec.example_inputs, spec.dynamic_shapes, targets, dynamic=list(dynamic),
                 name=Path(path).stem, source_path=path, cache_dir=WORK / cache)
    out = WORK / f"{Path(path).stem}-{targets.replace(':', '_').replace(',', '_')}-{cache}.tcpkg"
    pkg.save(out)
    return out


def _eager(path, inputs):
    module = load_model_file(path).module.double()
    with torch.no_grad():
        out = module(*[torch.from_numpy(x).double() if x.dtype.kind == "f" else torch.from_numpy(x)
                       for x in inputs])
    return [o.numpy() for o in (out if isinstance(out, (tuple, list)) else (out,))]


def test_cubins_for_each_arch_with_cpu_alongside():
    path = built_cuda(str(EXAMPLES / "mlp.py"), "cpu,cuda:sm_80,sm_90")
    archive = open_archive(path)
    m = archive.manifest
    assert [k.target for k in m.kernels if k.target != "cpu"] == ["cuda:sm_80", "cuda:sm_90"]
    assert any(k.target == "cpu" for k in m.kernels)
    names = [launch.name for launch in m.cuda.launches]
    assert names and m.cuda.triton
    for bundle in m.kernels:
        if bundle.target == "cpu":
            continue
        arch = int(bundle.target.split("_")[1])
        assert [c.kernel for c in m.cubins(bundle.isa)] == names
        for c in m.cubins(bundle.isa):
            assert cubin_arch(archive.read(c.file)) == arch, c.file
            # a band's copy of a GEMM (split_k.py) names the def of the launch whose body it shares
            assert c.num_warps >= 1 and (c.function == c.kernel or c.kernel.startswith(c.function)), c.kernel
            assert c.function in names
            # griddepcontrol is sm_90+ PTX: only there may a kernel start while the previous one finishes
            assert c.dependent == (arch >= 90), (c.kernel, arch)
    for launch in m.cuda.launches:
        assert len(launch.grid) == 3 and launch.num_warps >= 1
    # the CPU bundle in the same package still serves CPU calls
    import tcexport.loader as L

    x = np.random.default_rng(0).standard_normal((5, 64), dtype=np.float32)
    np.testing.assert_allclose(L.load(path)(x), _eager(str(EXAMPLES / "mlp.py"), [x])[0], rtol=1e-4, atol=1e-5)


def test_each_arch_gets_kernels_that_fit_its_shared_memory():
    """The tiles' pipelines are as deep as an H100/H200 allows (a 16-bit 2048x2048 GEMM of many rows: the measured
    table's 128x128x64 tiles in 4 stages, 128 KB); sm_86 (99 KB a block) gets the same kernels with fewer stages,
    not cubins that would fail to launch."""
    from tcexport.exporter.cuda.build import shared_limit

    x = torch.randn(8, 2048).to(torch.bfloat16)
    pkg = export(torch.nn.Linear(2048, 2048).to(torch.bfloat16), (x,), {"input": {0: ("batch", 1, 2048)}},
                 "cuda:sm_86,sm_90", name="linear_bf16", cache_dir=WORK / "cache")
    shared = {int(b.target.split("_")[1]): {c.kernel: c.shared for c in pkg.manifest.cubins(b.isa)} for b in pkg.manifest.kernels}
    assert max(shared[90].values()) > shared_limit(86)
    assert max(shared[86].values()) <= shared_limit(86)
    assert shared[86].keys() == shared[90].keys()


def test_cuda_rebuild_is_byte_identical():
    a = built_cuda(str(EXAMPLES / "mlp.py"), "cuda:sm_80", cache="cache-a")
    b = built_cuda(str(EXAMPLES / "mlp.py"), "cuda:sm_80", cache="cache-b")
    assert a.read_bytes() == b.read_bytes()


def test_missing_arch_names_both_and_the_fix():
    m = open_archive(built_cuda(str(EXAMPLES / "mlp.py"), "cuda:sm_80", cache="cache-a")).manifest
    with pytest.raises(TargetError) as e:
        pick_bundle(m, 90, "mlp.tcpkg")
    msg = str(e.value)
    assert "package has cuda:sm_80; this GPU is sm_90" in msg and "--target cuda:sm_90" in msg


def test_triton_source_and_launches_in_package():
    path = built_cuda(str(EXAMPLES / "mlp.py"))
    with zipfile.ZipFile(path) as z:
        src = z.read("src/cuda/model_triton.py").decode()
    m = open_archive(path).manifest
    for launch in m.cuda.launches:   # a def, or an alias line naming the def of the same body (other tiles)
        assert f"def {launch.name}(" in src or re.search(rf"^{launch.name} = \w+  # the same kernel", src, re.M)
    assert any(f"{launch.name} = " in src for launch in m.cuda.launches)   # the few-rows band's tiles (BM 16)


def test_a_load_under_a_block_mask_has_a_block_pointer():
    """BLOOM's ALiBi slope, one per head, read in the epilogue of attention scores tiled per [batch, head]: every
    program reads one element, and Triton before 3.7 refuses a scalar pointer under the tile's mask (BLOOM did
    not build on the GPU machine's Triton 3.6). The tile's batch variables are scalars: the pointer is widened
    to a block; a load indexed by the tile's rows or columns is a block already."""
    from tcexport.exporter.cuda.exprs import TritonEmitter
    from tcexport.exporter.cuda.gemm import batch_vars
    from tcexport.exporter.cuda.scope import LaunchScope
    from tcexport.exporter.ir import loops as ir

    b, h, s = sympy.symbols("batch heads seq", integer=True, positive=True)
    shape = (b, sympy.Integer(4), s, s)
    bufs = {n: ir.Buffer(n, "float32", shp, "temp") for n, shp in (("slopes", (sympy.Integer(4),)), ("pos", (b, s)))}
    prog = ir.Program(bufs, [], [], [], [])
    em = TritonEmitter(LaunchScope(prog, 32, 1), {}, "", "smask", col=ir.ivar(3), scalars=batch_vars(shape))
    slope = ir.Load("float32", "slopes", (sympy.Mod(ir.ivar(1), 4),))
    em.tensor(ir.Op("float32", "mul", (slope, ir.Load("float32", "pos", (ir.ivar(0), ir.ivar(3))))))
    loads = dict(re.findall(r"tl\.load\((slopes|pos) \+ (.*), mask=smask", "\n".join(em.lines)))
    assert loads["slopes"].endswith("+ 0 * smask.to(tl.int32)") and "smask" not in loads["pos"], em.lines


INTERPRET_CASES = [
    ("mlp", EXAMPLES / "mlp.py", [[(1, 64)], [(7, 64)]]),
    ("decoder", EXAMPLES / "decoder.py", [[(1, 3)], [(2, 5)]]),
    ("block3d", MODELS / "block3d.py", [[(2, 3, 32)]]),
    ("attention", MODELS / "attention.py", [[(2, 5, 16)]]),
    ("two_inputs", MODELS / "two_inputs.py", [[(3, 16), (3, 16)]]),
    ("position_index", MODELS / "position_index.py", [[(2, 16)]]),
]


def _inputs(path: Path, shapes, rng):
    spec = load_model_file(path)
    out = []
    for example, shape in zip(spec.example_inputs, shapes):
        if example.dtype.is_floating_point:
            out.append(rng.standard_normal(shape).astype(str(example.dtype).replace("torch.", "")))
        else:
            hi = int(example.max()) + 1
            out.append(rng.integers(0, hi, size=shape).astype(str(example.dtype).replace("torch.", "")))
    return out


@pytest.mark.parametrize("name, path, cases", INTERPRET_CASES, ids=[c[0] for c in INTERPRET_CASES])
def test_every_triton_kernel_matches_eager_in_the_interpreter(name, path, cases):
    rng = np.random.default_rng(1)
    inputs = [_inputs(path, shapes, rng) for shapes in cases]
    for shapes, xs, got in zip(cases, inputs, run_interpreted(built_cuda(str(path)), inputs)):
        want = _eager(str(path), xs)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape
            np.testing.assert_allclose(g.astype(np.float64), w, rtol=1e-4, atol=1e-4, err_msg=f"{name} {shapes}")


def test_interpreter_reports_out_of_range_index():
    from tcexport.formats.errors import RuntimeKernelError

    path = EXAMPLES / "decoder.py"
    ids = np.array([[1, 2, 10**6]], dtype=np.int64)
    with pytest.raises(RuntimeKernelError, match="out of range"):
        run_interpreted(built_cuda(str(path)), [[ids]])


def test_loading_on_cuda_without_a_gpu_is_a_clear_error():
    import tcexport.loader as L
    from tcexport.formats.errors import TcError

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(TcError, match="cuda"):
        L.load(built_cuda(str(EXAMPLES / "mlp.py")), device="cuda")


def test_verify_runs_a_cuda_only_package_in_the_interpreter_without_a_gpu():
    from tcexport.exporter.check.verify import verify

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: verify runs there instead")
    path = EXAMPLES / "mlp.py"
    report = verify(load_model_file(path), built_cuda(str(path)), quiet=True)
    assert report["ran_on"] == "triton-interpreter"
    assert report["ok"] and len(report["cases"]) == 3  # the example, then batch at both ends of its range


@pytest.mark.parametrize("name, path, shape", [("mlp", EXAMPLES / "mlp.py", (3, 64)),
                                               # 20 s in the interpreter: -m long (CI's 30 minutes on 2 cores)
                                               pytest.param("hf_gpt2", MODELS / "hf_gpt2.py", (2, 5),
                                                            marks=pytest.mark.long)])
def test_bfloat16_kernels_match_eager_in_the_interpreter(name, path, shape):
    """bf16 GEMMs read their operands natively (tl.dot), accumulate in float32 and round once."""
    from tcexport.loader.dtypes import numpy_dtype

    spec = load_model_file(path)
    module = spec.module.to(torch.bfloat16)
    example = tuple(e.to(torch.bfloat16) if e.is_floating_point() else e for e in spec.example_inputs)
    out = WORK / f"{name}-bf16-cuda.tcpkg"
    export(module, example, spec.dynamic_shapes, "cuda:sm_90", name=name, cache_dir=WORK / "cache").save(out)
    g = torch.Generator().manual_seed(2)
    if example[0].is_floating_point():
        x = torch.randn(shape, generator=g).to(torch.bfloat16)
        arg = x.view(torch.int16).numpy().view(numpy_dtype("bfloat16"))
    else:
        x = torch.randint(0, 256, shape, generator=g)
        arg = x.numpy()
    (got,), = run_interpreted(out, [[arg]])
    got = torch.from_numpy(got.view(np.int16)).view(torch.bfloat16).double()
    with torch.no_grad():
        want = module.double()(x.double() if x.is_floating_point() else x)
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    if name == "hf_gpt2":  # its GELU's tanh: from one exp in bfloat16 (checked above, as it runs), libdevice otherwise
        with zipfile.ZipFile(out) as z:
            src = z.read("src/cuda/model_triton.py").decode()
        assert "_tanh_exp(" in src.split("def _argmin")[1] and "libdevice.tanh(" not in src
        with zipfile.ZipFile(built_cuda(str(path))) as z:
            assert "libdevice.tanh(" in z.read("src/cuda/model_triton.py").decode()


class _Gelu(torch.nn.Module):
    """GPT-2's GELU as Hugging Face writes it (NewGELUActivation): each op in the input's dtype."""

    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * torch.pow(x, 3.0))))


def test_bfloat16_tanh_gelu_keeps_its_small_negative_outputs():
    """bfloat16's tanh is computed from one exp: near tanh = -1, where GELU's 1 + tanh cancels, its absolute error
    (about 1e-7) keeps GELU's small negative outputs within bfloat16's tolerance (an approximation with 2**-11
    relative error, tanh.approx.f32, was 1-10% off there)."""
    from tcexport.loader.dtypes import numpy_dtype

    x = torch.linspace(-6, 6, 97).to(torch.bfloat16).reshape(1, 97).repeat(2, 1) * torch.tensor([[1.0], [0.5]])
    x = x.to(torch.bfloat16)
    out = WORK / "gelu-bf16-cuda.tcpkg"
    export(_Gelu(), (x,), {"x": {0: ("batch", 1, 8)}}, "cuda:sm_90", name="gelu", cache_dir=WORK / "cache").save(out)
    with zipfile.ZipFile(out) as z:
        assert "_tanh_exp(" in z.read("src/cuda/model_triton.py").decode().split("def _argmin")[1]
    (got,), = run_interpreted(out, [[x.view(torch.int16).numpy().view(numpy_dtype("bfloat16"))]])
    got = torch.from_numpy(got.view(np.int16)).view(torch.bfloat16).double()
    torch.testing.assert_close(got, _Gelu()(x.double()), rtol=1.6e-2, atol=1e-5)


class _RowOps(torch.nn.Module):
    """Reductions over a symbolic row longer than one chunk: softmax, layer norm, argmax, cumulative max."""

    def forward(self, x):
        return torch.softmax(x * 0.5, dim=-1), torch.nn.functional.layer_norm(x, x.shape[-1:]), x.argmax(-1), \
            x.amax(-1) - x.mean(-1)


def test_long_symbolic_rows_loop_over_chunks_in_the_interpreter():
    x = torch.randn(3, 300)
    pkg = export(_RowOps(), (x,), {"x": {0: ("rows", 1, 64), 1: ("cols", 2, 4096)}}, "cuda:sm_90",
                 name="rowops", cache_dir=WORK / "cache")
    path = WORK / "rowops-cuda.tcpkg"
    pkg.save(path)
    assert any(l.block.get("RBLOCK") == 128 and l.block.get("XBLOCK") == 8 for l in pkg.manifest.cuda.launches)
    rng = np.random.default_rng(4)
    cases = [[rng.standard_normal((5, 300)).astype(np.float32)], [rng.standard_normal((2, 129)).astype(np.float32)]]
    for (xs,), got in zip(cases, run_interpreted(path, cases)):
        with torch.no_grad():
            want = _RowOps()(torch.from_numpy(xs).double())
        for g, w in zip(got, want):
            np.testing.assert_allclose(g.astype(np.float64), w.numpy(), rtol=1e-4, atol=1e-5)
