"""The expression form: validation of hostile input, evaluation over Python ints, text rendering."""

import pytest
from hypothesis import given, strategies as st

from tcexport.formats import expr as ex
from tcexport.formats.errors import FormatError


@pytest.mark.parametrize("e, env, want", [
    (3, {}, 3), ("s", {"s": 5}, 5), (["+", "s", 1, 2], {"s": 5}, 8), (["*", 2, "s", "s"], {"s": 3}, 18),
    (["-", 1, "s"], {"s": 3}, -2), (["//", -7, 2], {}, -4), (["%", -7, 2], {}, 1),
    (["max", 1, "s", 3], {"s": 2}, 3), (["min", "s", 3], {"s": 2}, 2), (["==", ["%", "s", 8], 0], {"s": 16}, 1),
    (["!=", 1, 1], {}, 0), (["<", 1, 2], {}, 1), (["<=", 3, 2], {}, 0), (["and", 1, ["<", "s", 2]], {"s": 5}, 0),
    (["or", 0, 1], {}, 1), (["not", 0], {}, 1), (["*", 2 ** 30, 2 ** 30], {}, 2 ** 60),
])
def test_evaluate(e, env, want):
    ex.validate(e, set(env))
    assert ex.evaluate(e, env) == want


@pytest.mark.parametrize("bad", [
    True, False, 1.5, None, {"op": "+"}, [], ["pow", 2, 3], ["+"], ["-", 1], ["-", 1, 2, 3], ["not", 1, 2],
    [1, 2], "1abc", "a-b", "", ["+", 1, [True]], ["+", 1, "__import__('os')"],
])
def test_validate_rejects(bad):
    with pytest.raises(FormatError):
        ex.validate(bad, None)


def test_validate_rejects_undeclared_symbol():
    with pytest.raises(FormatError, match="not declared"):
        ex.validate(["+", "seq", 1], {"batch"})


def test_deep_nesting_is_a_format_error_not_a_recursion_error():
    e = 1
    for _ in range(10_000):
        e = ["+", e, 1]
    with pytest.raises(FormatError, match="deeper"):
        ex.validate(e, None)


@pytest.mark.parametrize("op", ["//", "%"])
@pytest.mark.parametrize("divisor", [0, -2])
def test_division_by_non_positive_is_a_format_error(op, divisor):
    with pytest.raises(FormatError, match="division"):
        ex.evaluate([op, 7, "d"], {"d": divisor})


def test_unbound_symbol():
    with pytest.raises(FormatError, match="no value"):
        ex.evaluate("s", {})


@pytest.mark.parametrize("e, text", [
    (["*", 2, "seq"], "2*seq"), (["==", ["%", "seq", 8], 0], "(seq % 8) == 0"), (["max", "a", 1], "max(a, 1)"),
    (["not", ["<", "a", 2]], "not (a < 2)"), (["+", ["*", 2, "a"], 1], "(2*a) + 1"),
])
def test_to_text(e, text):
    assert ex.to_text(e) == text


def test_free_symbols():
    assert ex.free_symbols(["+", "a", ["*", 2, "b"], 3]) == {"a", "b"}


_leaf = st.one_of(st.integers(-50, 50), st.sampled_from(["a", "b"]))
_exprs = st.recursive(_leaf, lambda sub: st.one_of(
    st.tuples(st.sampled_from(["+", "*", "max", "min", "and", "or"]), st.lists(sub, min_size=1, max_size=3))
      .map(lambda t: [t[0], *t[1]]),
    st.tuples(st.sampled_from(["-", "==", "!=", "<", "<="]), sub, sub).map(list),
    st.tuples(st.sampled_from(["//", "%"]), sub, st.integers(1, 9)).map(list)), max_leaves=12)


@given(_exprs, st.integers(-20, 20), st.integers(-20, 20))
def test_valid_expressions_evaluate_to_ints(e, a, b):
    ex.validate(e, {"a", "b"})
    v = ex.evaluate(e, {"a": a, "b": b})
    assert isinstance(v, int) and not isinstance(v, bool)
    assert isinstance(ex.to_text(e), str)


def test_compiled_expressions_agree_with_evaluate():
    from tcexport.formats.expr import compile_expr, evaluate

    env = {"batch": 7, "seq": 13}
    for e in [5, "batch", ["*", 2048, "batch"], ["+", "batch", 1], ["*", 2, "batch", "seq"],
              ["//", ["+", "seq", 63], 64], ["max", "batch", ["-", "seq", 20]], ["%", "seq", 4]]:
        assert compile_expr(e)(env) == evaluate(e, env), e
