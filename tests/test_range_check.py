"""A guard torch cannot prove over the declared range but that holds at every size in it does not narrow the
range (front/range_check.py): three strided convolutions and attention over their frames, as in a Wav2Vec2
feature encoder, once exported only for lengths that are multiples of 20."""

from __future__ import annotations

import numpy as np
import sympy
import pytest
import torch
from torch import nn

import tcexport.loader as L
from tcexport.exporter import export
from tcexport.exporter.front import range_check
from tcexport.formats import errors as E
from packages import WORK

pytestmark = pytest.mark.slow


class _Frames(nn.Module):
    """frames = samples // 20 - 1; attention over them makes torch demand (1 % frames) != 0, true for
    samples >= 60, which its interval reasoning cannot show through the floor divisions."""

    def __init__(self):
        super().__init__()
        self.convs = nn.Sequential(nn.Conv1d(1, 8, 10, 5), nn.GELU(), nn.Conv1d(8, 8, 3, 2), nn.GELU(),
                                   nn.Conv1d(8, 8, 3, 2))

    def forward(self, x):
        h = self.convs(x.unsqueeze(1)).transpose(1, 2)[:, None]
        return torch.nn.functional.scaled_dot_product_attention(h, h, h)


def _export(lo: int):
    torch.manual_seed(0)
    module = _Frames().eval()
    pkg = export(module, (torch.randn(2, 1600),), {"x": {0: ("batch", 1, 4), 1: ("samples", lo, 4000)}},
                 name="frames", cache_dir=WORK / "cache")
    path = WORK / f"frames-{lo}.tcpkg"
    pkg.save(path)
    return module, pkg, L.load(path)


def test_a_guard_true_over_the_range_keeps_the_range():
    module, pkg, model = _export(400)
    assert [(s.name, s.min, s.max) for s in pkg.manifest.symbols] == [("batch", 1, 4), ("samples", 400, 4000)]
    for shape in [(1, 400), (3, 5467 - 2000), (4, 4000), (2, 1601)]:  # none a multiple of 20 but 400 and 4000
        x = np.random.default_rng(shape[1]).standard_normal(shape, dtype=np.float32)
        with torch.no_grad():
            want = module(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(model(x), want, rtol=1e-4, atol=1e-5)


def test_a_guard_false_inside_the_range_still_guards():
    """From 20 samples the same guard fails (1 % 0) below 60: the package must not accept those sizes."""
    module, pkg, model = _export(20)
    with pytest.raises(E.GuardError):
        model(np.zeros((1, 40), np.float32))
    x = np.random.default_rng(0).standard_normal((2, 1600), dtype=np.float32)
    with torch.no_grad():
        np.testing.assert_allclose(model(x), module(torch.from_numpy(x)).numpy(), rtol=1e-4, atol=1e-5)


class _SquarePixels(nn.Module):
    """Height and width share one symbol; a linear over the stride-32 map's pixels makes torch demand
    ``size // 32 != (size // 32)**2``, true from 64 up, which it reports without a fix to offer."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 4, 4)
        self.down = nn.Sequential(*[nn.Conv2d(8, 8, 2, 2) for _ in range(3)])
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(self.down(self.stem(x)).permute(0, 2, 3, 1))


def test_a_symbol_in_two_places_keeps_its_range():
    torch.manual_seed(0)
    module = _SquarePixels().eval()
    path = WORK / "square-pixels.tcpkg"
    pkg = export(module, (torch.randn(2, 3, 96, 96),),
                 {"x": {0: ("batch", 1, 4), 2: ("size", 64, 128), 3: ("size", 64, 128)}}, name="square",
                 cache_dir=WORK / "cache")
    pkg.save(path)
    assert [(s.name, s.min, s.max) for s in pkg.manifest.symbols] == [("batch", 1, 4), ("size", 64, 128)]
    model = L.load(path)
    for shape in [(1, 3, 64, 64), (3, 3, 97, 97), (4, 3, 128, 128)]:
        x = np.random.default_rng(shape[2]).standard_normal(shape, dtype=np.float32)
        with torch.no_grad():
            want = module(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(model(x), want, rtol=1e-4, atol=1e-5)
    with pytest.raises(E.SymbolConflictError):  # one symbol, one size: the loader still holds height == width
        model(np.zeros((1, 3, 64, 96), np.float32))


class _RoundedHalf(nn.Module):
    """Half the sequence, its length rounded down as torch 2.11's pooling meta did (``div_rtn``): a branch on
    ``n % 2 != 0`` whose sides compute the same length. torch guards the branch taken at the example's size,
    so every ResNet stem (a stride-2 max pool) exported with a dynamic image side failed on torch 2.11."""

    def forward(self, x):
        n = x.shape[1]
        half, rest = n // 2, n % 2
        if rest != 0 and bool(rest < 0):
            half -= 1
        return x[:, :half] * 2


class _ParityBranch(nn.Module):
    """A branch on the parity of the length whose sides differ: the guard matters."""

    def forward(self, x):
        return x * 2 if x.shape[1] % 2 == 0 else x + 1


def test_a_guard_that_picks_between_equal_programs_is_dropped():
    module = _RoundedHalf()
    pkg = export(module, (torch.randn(2, 10),), {"x": {1: ("seq", 4, 64)}}, name="rounded",
                 cache_dir=WORK / "cache")
    path = WORK / "rounded.tcpkg"
    pkg.save(path)
    assert [(s.name, s.min, s.max) for s in pkg.manifest.symbols] == [("seq", 4, 64)]
    assert any("same program" in n for n in pkg.warnings), pkg.warnings
    model = L.load(path)
    for n in (4, 9, 10, 63, 64):  # odd sizes: the side of the split the example did not take
        x = np.random.default_rng(n).standard_normal((2, n), dtype=np.float32)
        np.testing.assert_allclose(model(x), module(torch.from_numpy(x)).numpy())


def test_a_guard_that_picks_between_different_programs_stays():
    from tcexport.exporter.errors import CaptureError

    module = _ParityBranch()
    try:
        pkg = export(module, (torch.randn(2, 10),), {"x": {1: ("seq", 4, 64)}}, name="parity",
                     cache_dir=WORK / "cache")
    except CaptureError as e:
        assert "seq" in str(e)
        return
    path = WORK / "parity.tcpkg"
    pkg.save(path)
    with pytest.raises(E.GuardError):  # the package built for even lengths refuses odd ones
        L.load(path)(np.zeros((2, 9), np.float32))


def test_a_range_split_three_ways_needs_three_captures_to_cover():
    """Three ceil-mode pools in a row (SqueezeNet on torch 2.11) split a side by three parities: the first
    capture's guards and one more leave sizes neither meets; the point returned is one of those, and the third
    capture covers the rest."""
    size = sympy.Symbol("size", integer=True)
    f = lambda k: sympy.Eq(sympy.Mod(sympy.floor((size - 1) / 2 ** k), 2), 0)  # noqa: E731
    ranges = {"size": (64, 128)}
    even, odd = [f(0)], [sympy.Not(f(0))]
    assert range_check.uncovered([even, odd], ranges) is None
    a, b = [f(0), f(1)], [sympy.Not(f(0))]
    point = range_check.uncovered([a, b], ranges)
    assert point is not None and (point["size"] - 1) % 2 == 0 and ((point["size"] - 1) // 2) % 2 == 1
    assert range_check.uncovered([a, b, [f(0), sympy.Not(f(1))]], ranges) is None


class _SquaresModThree(nn.Module):
    """``seq * seq % 3 != 2`` holds for every integer (squares are 0 or 1 mod 3), but torch cannot prove it; its
    ``Dim.DYNAMIC`` capture then starts seq at 2 (0/1 specialisation), as torch 2.11 did for grouped-query
    attention's ``min(16*seq, 32*seq) == 16*seq``, and a package from it refused one token."""

    def forward(self, x):
        s = x.shape[1]
        if (s * s) % 3 != 2:
            return x * 2
        return x * 3


def test_a_range_from_one_keeps_size_one_when_torch_cannot_prove_a_true_guard():
    pkg = export(_SquaresModThree(), (torch.randn(2, 12),), {"x": {0: ("batch", 1, 4), 1: ("seq", 1, 64)}},
                 name="squares", cache_dir=WORK / "cache")
    assert [(s.name, s.min, s.max) for s in pkg.manifest.symbols] == [("batch", 1, 4), ("seq", 1, 64)]
    path = WORK / "squares.tcpkg"
    pkg.save(path)
    model = L.load(path)
    for shape in [(1, 1), (3, 2), (4, 64), (2, 5)]:
        x = np.random.default_rng(shape[1]).standard_normal(shape, dtype=np.float32)
        np.testing.assert_array_equal(model(x), 2 * x)
