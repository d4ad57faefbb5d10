"""Derived dims, divisibility and specialised dims: the syntax, the manifest guards, and the loader's errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tcexport.loader as L
from tcexport.exporter.front import dynamic
from tcexport.exporter.errors import DynamicSpecError, SpecializedDimError
from tcexport.formats import errors as E
from packages import MODELS, built, load_module

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


# -- syntax -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expect", [
    ("seq", ("seq", 1, 0)), ("2*seq", ("seq", 2, 0)), ("seq*2", ("seq", 2, 0)), ("seq-1", ("seq", 1, -1)),
    ("seq + 1", ("seq", 1, 1)), ("4*seq+2", ("seq", 4, 2)),
])
def test_dim_expressions(text, expect):
    e = dynamic.parse_dim_expr(text)
    assert (e.root, e.scale, e.offset) == expect
    assert dynamic.parse_dim_expr(str(e)) == e


@pytest.mark.parametrize("text", ["seq/2", "seq-", "2*", "seq*seq", "0*seq", "-seq"])
def test_bad_dim_expressions(text):
    with pytest.raises(DynamicSpecError, match="derived dim"):
        dynamic.parse_dim_expr(text)


@pytest.mark.parametrize("text, places", [
    ("2*seq@b.1", {"b": {1: "2*seq"}}),
    ("seq-1@b.1,c.0", {"b": {1: "seq - 1"}, "c": {0: "seq - 1"}}),
])
def test_cli_derived_dims(text, places):
    sym, got = dynamic.parse_cli_spec(text, ["a", "b", "c"], [2, 2, 2])
    assert sym is None and got == places


@pytest.mark.parametrize("text, fragment", [("2*seq", "needs its places"), ("2*seq=1:4@b.1", "expected SYMBOL")])
def test_bad_cli_derived_dims(text, fragment):
    with pytest.raises(DynamicSpecError, match=fragment):
        dynamic.parse_cli_spec(text, ["a", "b"], [2, 2])


def test_cli_and_model_file_give_the_same_torch_dims():
    ex = (torch.zeros(2, 6), torch.zeros(2, 12))
    from_cli = dynamic.resolve(["a", "b"], ex, None, ["seq=2:64@a.1", "2*seq@b.1"])
    from_file = dynamic.resolve(["a", "b"], ex, {"a": {1: ("seq", 2, 64)}, "b": {1: "2*seq"}}, [])
    assert from_cli == from_file
    shapes = dynamic.to_torch_dynamic_shapes(["a", "b"], ex, *from_cli)
    assert shapes["b"][1].__name__ == "2*seq" and shapes["b"][1].root is shapes["a"][1]


def test_example_must_fit_the_derived_dim():
    spec = {"a": {1: "seq"}, "b": {1: "2*seq"}}
    with pytest.raises(DynamicSpecError, match=r"2\*seq = 12 with seq = 6 \(from a.1\)"):
        dynamic.resolve(["a", "b"], (torch.zeros(2, 6), torch.zeros(2, 10)), spec, [])
    with pytest.raises(DynamicSpecError, match="cannot be 2\\*seq for any integer seq"):
        dynamic.resolve(["a", "b"], (torch.zeros(2, 6), torch.zeros(2, 11)), spec, [])


def test_symbol_only_in_a_derived_dim_is_declared():
    symbols, places = dynamic.resolve(["a"], (torch.zeros(7),), {"a": {0: "2*half+1"}}, [])
    assert symbols["half"] == dynamic.SymbolSpec("half", 1, None) and places == {"a": {0: "2*half + 1"}}


# -- exported packages ----------------------------------------------------------------------------------------

def _eager(name):
    return load_module(MODELS / f"{name}.py").model().eval()


@pytest.fixture(scope="module")
def derived():
    return L.load(built(str(MODELS / "dyn_derived.py"))), _eager("dyn_derived")


@pytest.fixture(scope="module")
def divisible():
    return L.load(built(str(MODELS / "dyn_divisible.py"))), _eager("dyn_divisible")


def _derived_inputs(batch, seq, pairs=None, prev=None, seed=0):
    rng = np.random.default_rng(seed)
    pairs = 2 * seq if pairs is None else pairs
    prev = seq - 1 if prev is None else prev
    return [rng.standard_normal(s, dtype=np.float32) for s in ((batch, seq, 8), (batch, pairs, 8), (batch, prev, 8))]


def _check_eager(pkg, module, xs):
    got = pkg(*xs)
    with torch.no_grad():
        want = module(*[torch.from_numpy(x) for x in xs])
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        np.testing.assert_allclose(g, w.numpy(), atol=3e-5, rtol=1e-4)


@pytest.mark.slow
def test_derived_manifest(derived):
    m = derived[0].manifest
    assert [(s.name, s.min, s.max) for s in m.symbols] == [("batch", 1, 16), ("seq", 2, 64)]
    assert [list(i.shape) for i in m.inputs] == [["batch", "seq", 8], ["batch", ["*", 2, "seq"], 8],
                                                ["batch", ["-", "seq", 1], 8]]
    assert m.guards == ()  # the relations live in the input dims, checked in step 7 of SPEC §4


@pytest.mark.slow
@pytest.mark.parametrize("batch, seq", [(1, 2), (3, 5), (16, 64)])
def test_derived_matches_eager(derived, batch, seq):
    _check_eager(*derived, _derived_inputs(batch, seq))


@pytest.mark.slow
@pytest.mark.parametrize("pairs, prev, input, rule", [(11, None, "pairs", "2*seq"), (None, 6, "prev", "seq - 1")])
def test_derived_mismatch_names_the_rule(derived, pairs, prev, input, rule):
    with pytest.raises(E.SymbolConflictError) as info:
        derived[0](*_derived_inputs(2, 6, pairs, prev))
    v = info.value
    assert (v.input, v.dim, v.rule, v.got) == (input, 1, rule, pairs or prev)
    assert "seq=6 from input 'x' dim 1" in str(v)


@pytest.mark.slow
@SETTINGS
@given(batch=st.integers(0, 18), seq=st.integers(0, 70), dp=st.integers(-2, 2), dq=st.integers(-2, 2),
       seed=st.integers(0, 2**16))
def test_derived_random_shapes(derived, batch, seq, dp, dq, seed):
    pkg, module = derived
    pairs, prev = max(2 * seq + dp, 0), max(seq - 1 + dq, 0)
    xs = _derived_inputs(batch, seq, pairs, prev, seed)
    if 1 <= batch <= 16 and 2 <= seq <= 64 and pairs == 2 * seq and prev == seq - 1:
        _check_eager(pkg, module, xs)
        return
    with pytest.raises(E.GuardError) as info:
        pkg(*xs)
    assert isinstance(info.value, (E.SymbolRangeError, E.SymbolConflictError))


@pytest.mark.slow
def test_divisibility_guard(divisible):
    pkg, _ = divisible
    m = pkg.manifest
    line = next(k for k, t in enumerate((MODELS / "dyn_divisible.py").read_text().splitlines(), 1) if "x.view" in t)
    assert [list(i.shape) for i in m.inputs] == [["batch", "seq", 16]]
    assert [g.expr for g in m.guards] == [["==", ["%", "seq", 4], 0]]
    assert m.guards[0].message.startswith(f"seq must be divisible by 4 (from dyn_divisible.py:{line} in forward:")
    assert (m.symbols[1].name, m.symbols[1].min, m.symbols[1].max) == ("seq", 8, 64)
    assert list(m.outputs[0].shape) == ["batch", ["//", "seq", 4], 16]


@pytest.mark.slow
def test_divisibility_is_a_warning_in_the_export():
    from tcexport.exporter.front.model_file import load_model_file
    from tcexport.exporter.pipeline import export

    spec = load_model_file(MODELS / "dyn_divisible.py")
    pkg = export(spec.module, spec.example_inputs, spec.dynamic_shapes, source_path=str(spec.path))
    assert any("seq = 4*_seq" in w and "seq % 4 == 0" in w for w in pkg.warnings)


@pytest.mark.slow
@pytest.mark.parametrize("seq", [8, 12, 64])
def test_divisible_matches_eager(divisible, seq):
    pkg, module = divisible
    _check_eager(pkg, module, [np.random.default_rng(seq).standard_normal((3, seq, 16), dtype=np.float32)])


@pytest.mark.slow
def test_indivisible_size_raises_relation_error(divisible):
    with pytest.raises(E.RelationError) as info:
        divisible[0](np.zeros((2, 10, 16), np.float32))
    v = info.value
    assert (v.rule, v.input, v.dim, v.symbol, v.got) == ("(seq % 4) == 0", "x", 1, "seq", {"seq": 10})
    assert "seq must be divisible by 4" in str(v) and "seq = 8 or 12" in str(v)


@pytest.mark.slow
@SETTINGS
@given(seq=st.integers(0, 70), seed=st.integers(0, 2**16))
def test_divisible_random_shapes(divisible, seq, seed):
    pkg, module = divisible
    x = np.random.default_rng(seed).standard_normal((2, seq, 16), dtype=np.float32)
    if 8 <= seq <= 64 and seq % 4 == 0:
        _check_eager(pkg, module, [x])
        return
    with pytest.raises(E.RelationError if 8 <= seq <= 64 else E.SymbolRangeError):
        pkg(x)


def test_specialised_dim_is_a_typed_error():
    with pytest.raises(SpecializedDimError) as info:
        built(str(MODELS / "dyn_specialized.py"))
    v = info.value
    assert (v.input, v.dim, v.symbol, v.value) == ("x", 0, "batch", 4)
    assert "specialized it to be a constant (4)" in v.reason and "remove the dynamic mark for x.0" in str(v)


@pytest.mark.slow
def test_relation_between_declared_symbols_is_accepted_and_checked():
    pkg = L.load(built(str(MODELS / "dyn_tied.py")))
    m = pkg.manifest
    assert [(s.name, s.min, s.max) for s in m.symbols] == [("other", 1, 32)]  # seq <= 64 and other <= 32
    assert [list(i.shape) for i in m.inputs] == [[2, ["+", "other", 1]], [2, "other"]]
    _check_eager(pkg, _eager("dyn_tied"), [np.ones((2, 9), np.float32), np.full((2, 8), 3.0, np.float32)])
    with pytest.raises(E.SymbolConflictError) as info:
        pkg(np.ones((2, 9), np.float32), np.ones((2, 7), np.float32))
    assert (info.value.input, info.value.rule) == ("x", "other + 1")
