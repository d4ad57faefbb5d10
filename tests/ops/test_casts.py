"""Casts between every pair of float32 / float64 / float16 / bfloat16 / int64 / int32 / bool, exported as one
package and run at every ISA level this CPU has, compared bit for bit with eager.

op_db's "to" samples only cast to float64, so the cast matrix is built here from values where rounding is
decided: ties to even at both 16-bit widths, float16's overflow threshold (65520) and subnormals, float32
subnormals, integers that round through float32 first (2^24 + 2^16 + 1 in bfloat16), signed zeros, inf, NaN.
Each 16-bit cast is also checked inside a fused expression (``x.to(half).to(float64)``): there the rounding
happens in registers (tc_round_*), not at a store. And a Python float meeting a 16-bit tensor is converted as
PyTorch's CPU kernels convert it: rounded to the tensor's dtype in comparisons, add, sub, pow and fmod, kept in
float32 in mul, div and clamp.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import tcexport.loader as L

from harness import WORK  # importing harness also points TCEXPORT_CACHE at this session's work dir

pytestmark = pytest.mark.slow

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.bool]
HALF = (torch.float16, torch.bfloat16)

FLOAT_VALUES = [
    0.0, -0.0, 1.0, -1.0, 0.1, 1 / 3, 0.5, 1.5, 2.5, -2.5, 255.5, 257.0, -1e-3, 65504.0, 65519.99, 65520.0,
    70000.0, -70000.0, 6e-8, 2.98e-8, 2.99e-8, 1e-8, 1e-40, 3.4e38, 1 + 2**-11, 1 + 3 * 2**-11, 1 + 2**-8,
    1 + 3 * 2**-8, 1 + 2**-11 + 2**-40, 1 + 2**-8 + 2**-30, 2**-14 * (1 - 2**-11), 2**-126 * 0.75,
    float("inf"), float("-inf"), float("nan"),
]
# float -> integer is defined (the same in C++ and in PyTorch) only for finite values inside the target's range
FLOAT_TO_INT_VALUES = [0.0, -0.0, 0.4, -0.6, 1.5, -1.5, 2.5, 100.7, -100.7, 255.0, 256.5, 12345.6, -30000.0, 65504.0]
INT_VALUES = [0, 1, -1, 2, 3, 255, 256, 257, 2049, 65504, 65519, 65520, 65536, 70000, -70000, 2**24 + 1,
              2**24 + 2**16 + 1, 2**31 - 1, -2**31]


def _name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _source(dtype, to_int: bool) -> torch.Tensor:
    """The source values in ``dtype`` (created by PyTorch's own rounding), plus random ones."""
    if dtype == torch.bool:
        return torch.tensor([True, False, True, True, False])
    if not dtype.is_floating_point:
        return torch.tensor(INT_VALUES, dtype=dtype)
    base = torch.tensor(FLOAT_TO_INT_VALUES if to_int else FLOAT_VALUES, dtype=torch.float64)
    noise = torch.randn(64, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    if not to_int:
        noise = noise * torch.logspace(-10, 6, 64, dtype=torch.float64)
    return torch.cat([base, noise * 100]).to(dtype)


PAIRS = [(s, d) for s, d in itertools.product(DTYPES, DTYPES) if s != d]
HOPS = [(s, d) for s, d in PAIRS if d in HALF]  # x.to(d).to(float64): the rounding stays inside one kernel
SCALAR_OPS = {  # a 16-bit tensor with a Python float that is not representable in 16 bits
    "== 0.1": lambda x: x == 0.1, "< 0.1": lambda x: x < 0.1, ">= 1/3": lambda x: x >= 1 / 3,
    "+ 1/3": lambda x: x + 1 / 3, "- 1/3": lambda x: x - 1 / 3, "1/3 - x": lambda x: 1 / 3 - x,
    "fmod 1/3": lambda x: torch.fmod(x, 1 / 3), "** 1/3": lambda x: x.abs() ** (1 / 3),
    "* 0.1": lambda x: x * 0.1, "/ 0.3": lambda x: x / 0.3, "clamp(min=0.1)": lambda x: x.clamp(min=0.1),
}
SCALARS = [(h, name) for h in HALF for name in SCALAR_OPS]


class Casts(torch.nn.Module):
    """forward(*sources) returns every cast of the matrix, then every fused double hop."""

    def __init__(self):
        super().__init__()
        self.slots = {}
        self.inputs = []
        for s, d in PAIRS:
            key = (s, s.is_floating_point and not (d.is_floating_point or d == torch.bool))
            if key not in self.slots:
                self.slots[key] = len(self.inputs)
                self.inputs.append(_source(*key))

    def slot(self, s, d) -> int:
        return self.slots[(s, s.is_floating_point and not (d.is_floating_point or d == torch.bool))]

    def forward(self, *xs):
        direct = [xs[self.slot(s, d)].to(d) for s, d in PAIRS]
        hops = [xs[self.slot(s, d)].to(d).to(torch.float64) for s, d in HOPS]
        scalars = [SCALAR_OPS[name](xs[self.slot(h, h)]) for h, name in SCALARS]
        return tuple(direct + hops + scalars)


@pytest.fixture(scope="module")
def casts():
    from tcexport.exporter.pipeline import export

    module = Casts()
    pkg = export(module, tuple(module.inputs), None, name="casts")
    path = WORK / "casts.tcpkg"
    pkg.save(path)
    with torch.no_grad():
        expected = module(*module.inputs)
    return path, module, expected


def _isas(path) -> list[str]:
    """The kernel bundles of the package that this CPU can run."""
    from tcexport.loader.native_cpu import cpu_flags

    flags = cpu_flags() or set()
    return [k.isa for k in L.load(path).manifest.kernels if k.target == "cpu" and set(k.requires) <= flags]


def _bits(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bit patterns as integers (NaNs all alike), so float results compare exactly."""
    if not t.is_floating_point():
        return t.long()
    width = {8: torch.int64, 4: torch.int32, 2: torch.int16}[t.element_size()]
    return torch.where(torch.isnan(t), torch.full_like(t, float("nan")), t).contiguous().view(width).long()


def test_every_cast_matches_eager_bit_for_bit(casts):
    path, module, expected = casts
    isas = _isas(path)
    assert "x86-64" in isas, isas  # the baseline runs everywhere: it must be tested here too
    labels = [f"{_name(s)}->{_name(d)}" for s, d in PAIRS] + [f"{_name(s)}->{_name(d)}->float64" for s, d in HOPS]
    labels += [f"{_name(h)} {name}" for h, name in SCALARS]
    for isa in isas:
        got = L.load(path, isa=isa)(*module.inputs)
        assert len(got) == len(expected)
        wrong = []
        for label, g, w in zip(labels, got, expected):
            if g.dtype != w.dtype or g.shape != w.shape:
                wrong.append(f"{label}: {g.dtype}{list(g.shape)}, eager {w.dtype}{list(w.shape)}")
            elif not torch.equal(_bits(g), _bits(w)):
                at = (_bits(g) != _bits(w)).nonzero()[:3].flatten().tolist()
                wrong.append(f"{label} at {at}: got {g[at].tolist()}, eager {w[at].tolist()}")
        assert not wrong, f"{isa}:\n  " + "\n  ".join(wrong)


def test_the_matrix_is_complete():
    """Every ordered pair of distinct dtypes is cast, and each 16-bit target is also cast inside a kernel."""
    assert len(PAIRS) == len(DTYPES) * (len(DTYPES) - 1) == 42
    assert {d for _, d in HOPS} == set(HALF) and len(HOPS) == 2 * (len(DTYPES) - 1)
