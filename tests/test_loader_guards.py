"""Guards, on hand-built manifests: every typed error, its attributes, the check order, derived dims."""

import numpy as np
import pytest

from loader_helpers import make_manifest, spec
from tcexport.formats.errors import (ArityError, DtypeError, FormatError, RankError, RelationError,
                                     StaticDimError, SymbolConflictError, SymbolRangeError)
from tcexport.formats.manifest import Guard, Symbol
from tcexport.loader.dtypes import BFLOAT16
from tcexport.loader.guards import GuardPlan, SignatureCache, bind_and_check


def _manifest(inputs, symbols=(("batch", 1, 64), ("seq", 1, None)), guards=()):
    return make_manifest(symbols=tuple(Symbol(*s) for s in symbols), inputs=tuple(spec(*i) for i in inputs),
                         guards=tuple(Guard(*g) for g in guards))


M = _manifest([("ids", "int64", ["batch", "seq"]), ("mask", "float32", ["batch", "seq", 4]),
               ("pairs", "float32", [["*", 2, "seq"]])],
              guards=[(["==", ["%", "seq", 2], 0], "seq must be even")])


def _args(batch=2, seq=4, mask_shape=None, pairs=None):
    return [np.zeros((batch, seq), np.int64), np.zeros(mask_shape or (batch, seq, 4), np.float32),
            np.zeros(pairs if pairs is not None else 2 * seq, np.float32)]


def test_binds_symbols():
    assert bind_and_check(M, _args(3, 6)) == {"batch": 3, "seq": 6}


def test_arity():
    with pytest.raises(ArityError) as e:
        GuardPlan(M).check(_args()[:2])
    assert (e.value.expected, e.value.got) == (3, 2) and "ids, mask, pairs" in str(e.value)


def test_rank():
    a = _args()
    a[1] = np.zeros((2, 4), np.float32)
    with pytest.raises(RankError) as e:
        GuardPlan(M).check(a)
    assert (e.value.input, e.value.expected, e.value.got) == ("mask", 3, 2)
    assert "[batch, seq, 4]" in str(e.value)


def test_dtype_is_never_cast():
    a = _args()
    a[0] = a[0].astype(np.int32)
    with pytest.raises(DtypeError) as e:
        GuardPlan(M).check(a)
    assert (e.value.input, e.value.expected, e.value.got) == ("ids", "int64", "int32")
    assert "astype" in str(e.value)


def test_non_native_byte_order_rejected():
    a = _args()
    a[1] = a[1].astype(">f4")
    with pytest.raises(DtypeError, match="byte order"):
        GuardPlan(M).check(a)


def test_bfloat16_needs_the_tag():
    m = _manifest([("x", "bfloat16", [2])], symbols=())
    GuardPlan(m).check([np.zeros(2, np.uint16).view(BFLOAT16)])
    with pytest.raises(DtypeError):
        GuardPlan(m).check([np.zeros(2, np.uint16)])


def test_static_dim():
    with pytest.raises(StaticDimError) as e:
        GuardPlan(M).check(_args(mask_shape=(2, 4, 5)))
    v = e.value
    assert (v.input, v.dim, v.expected, v.got, v.symbol) == ("mask", 2, 4, 5, None)
    assert "dynamic" in str(v)


def test_symbol_conflict_names_both_places():
    with pytest.raises(SymbolConflictError) as e:
        GuardPlan(M).check(_args(mask_shape=(2, 5, 4)))
    v = e.value
    assert (v.input, v.dim, v.symbol, v.expected, v.got) == ("mask", 1, "seq", 4, 5)
    assert "input 'ids' dim 1" in str(v) and "input 'mask' dim 1" in str(v)


@pytest.mark.parametrize("batch, ok", [(1, True), (64, True), (0, False), (65, False)])
def test_symbol_range(batch, ok):
    plan = GuardPlan(M)
    if ok:
        plan.check(_args(batch=batch))
        return
    with pytest.raises(SymbolRangeError) as e:
        plan.check(_args(batch=batch))
    v = e.value
    assert (v.input, v.dim, v.symbol, v.expected, v.got) == ("ids", 0, "batch", (1, 64), batch)
    assert "1..64" in str(v) and str(batch) in str(v)


def test_unbounded_max():
    GuardPlan(M).check(_args(seq=10_000))


def test_derived_dim_mismatch_shows_expression():
    with pytest.raises(SymbolConflictError) as e:
        GuardPlan(M).check(_args(seq=4, pairs=7))
    v = e.value
    assert (v.input, v.dim, v.expected, v.got, v.rule) == ("pairs", 0, 8, 7, "2*seq")
    assert "2*seq = 8" in str(v)


def test_relation_guard():
    with pytest.raises(RelationError) as e:
        GuardPlan(M).check(_args(seq=3))
    v = e.value
    assert "seq must be even" in str(v) and v.rule == "(seq % 2) == 0" and v.got == {"seq": 3}


def test_check_order_rank_before_dtype_before_static():
    a = _args(mask_shape=(2, 4, 5))
    a[0] = a[0].astype(np.int32)
    with pytest.raises(DtypeError):
        GuardPlan(M).check(a)
    a[1] = np.zeros((2,), np.float64)
    with pytest.raises(RankError):
        GuardPlan(M).check(a)


def test_symbol_only_in_derived_dim_is_solved():
    m = _manifest([("x", "float32", [["+", ["*", 2, "seq"], 1]])], symbols=(("seq", 1, 100),))
    assert GuardPlan(m).check([np.zeros(9, np.float32)]) == {"seq": 4}
    with pytest.raises(SymbolConflictError, match=r"2\*seq\) \+ 1"):
        GuardPlan(m).check([np.zeros(8, np.float32)])


def test_unbindable_symbol_is_a_format_error():
    m = _manifest([("x", "float32", [3])], symbols=(("seq", 1, 100),))
    with pytest.raises(FormatError, match="seq"):
        GuardPlan(m)


def test_guard_with_division_by_zero_does_not_hold():
    m = _manifest([("x", "float32", ["seq"])], symbols=(("seq", 0, 10),),
                  guards=[(["==", ["//", 8, "seq"], 1], "8 // seq == 1")])
    with pytest.raises(RelationError):
        GuardPlan(m).check([np.zeros(0, np.float32)])


def test_scalar_input():
    m = _manifest([("t", "float32", [])], symbols=())
    assert GuardPlan(m).check([np.array(1.0, np.float32)]) == {}


# -- the per-signature cache: a hit is exactly as strict as a full check -----------------------------------------


def _cache(manifest, size=64):
    made = []

    def make(env):
        made.append(dict(env))
        return ("entry", tuple(sorted(env.items())))
    return SignatureCache(GuardPlan(manifest), make, size), made


def test_cache_makes_one_entry_per_signature():
    cache, made = _cache(M)
    first = cache.lookup(_args(2, 4))
    assert cache.lookup(_args(2, 4)) is first and made == [{"batch": 2, "seq": 4}]
    assert cache.lookup(_args(3, 4)) == ("entry", (("batch", 3), ("seq", 4))) and len(made) == 2


def test_cache_hit_still_checks_dtype_and_arity():
    cache, _ = _cache(M)
    cache.lookup(_args())
    bad = _args()
    bad[0] = bad[0].astype(np.int32)  # same shapes as the cached signature
    with pytest.raises(DtypeError) as e:
        cache.lookup(bad)
    assert e.value.input == "ids"
    swapped = _args()
    swapped[1] = swapped[1].astype(">f4")
    with pytest.raises(DtypeError, match="byte order"):
        cache.lookup(swapped)
    with pytest.raises(ArityError):
        cache.lookup(_args()[:2])


def test_cache_never_stores_a_failing_signature():
    cache, made = _cache(M)
    for _ in range(2):
        with pytest.raises(RelationError):
            cache.lookup(_args(seq=3))
        with pytest.raises(SymbolRangeError):
            cache.lookup(_args(batch=65))
    assert len(cache) == 0 and made == []


def test_cache_is_bounded_and_keeps_working_after_eviction():
    cache, made = _cache(M, size=2)
    for batch in (1, 2, 3, 1):
        assert cache.lookup(_args(batch)) == ("entry", (("batch", batch), ("seq", 4)))
    assert len(cache) == 2 and [m["batch"] for m in made] == [1, 2, 3, 1]  # 1 was evicted, then made again


def test_exact_dtypes_are_the_loaders_own_objects():
    plan = GuardPlan(_manifest([("x", "float32", [2]), ("b", "bfloat16", [2])], symbols=()))
    assert plan.exact_dtypes == (np.dtype(np.float32), BFLOAT16)
    a = [np.zeros(2, np.float32), np.zeros(2, np.uint16).view(BFLOAT16)]
    assert plan.shape_key(a) == ((2,), (2,))
    assert plan.shape_key([a[0], np.zeros(2, np.uint16)]) is None  # untagged bits: only the full check decides


def test_equal_but_not_identical_dtype_takes_the_full_check():
    """A dtype object equal to float32 but not numpy's canonical one misses the fast key, passes the full
    rule, and then reuses the cached signature."""
    m = _manifest([("x", "float32", ["batch"])], symbols=(("batch", 1, 8),))
    cache, made = _cache(m)
    odd = np.dtype(np.float32, metadata={"note": 1})
    x = np.zeros(3, odd)
    assert GuardPlan(m).shape_key([x]) is None
    cache.lookup([np.zeros(3, np.float32)])
    assert cache.lookup([x]) == ("entry", (("batch", 3),)) and len(made) == 1
